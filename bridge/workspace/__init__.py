"""The host side of git: one runner for every git call, per-repository locks, task worktrees,
snapshots and diffs, and applying an accepted snapshot to the user's working tree."""
