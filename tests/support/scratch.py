"""Where the tests put their scratch: /dev/shm when present, because the root disk here is slow
at create-after-delete (git worktrees, state roots and wheels are made and removed by the
thousand); None means pytest's own temporary folder."""

from __future__ import annotations

from pathlib import Path

TEST_ROOT: Path | None = Path("/dev/shm") if Path("/dev/shm").is_dir() else None
