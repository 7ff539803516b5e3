"""The pipeline that coordinates store, workspace, sandbox and worker for one task:
claim → leases → worktree → worker container → collect diff → verify container → finish."""
