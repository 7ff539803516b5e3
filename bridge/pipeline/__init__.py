"""The pipeline that coordinates store, workspace, sandbox and worker for one task:
claim → leases → worktree → (environment) → worker container → collect diff → verify container
→ finish. Its phases share the plumbing in bridge/phase and reach the project environments only
through bridge/environments/task.py."""
