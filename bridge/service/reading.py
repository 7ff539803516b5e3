"""Reading what a task made, for a front end that does not share this machine's file system (the
MCP server's resources): a file of a task's snapshot, by its path in the repository."""

from __future__ import annotations

from pathlib import Path

from bridge.errors import InvalidSpec
from bridge.records import TaskRecord
from bridge.workspace.git import Git


def snapshot_file(record: TaskRecord, path: str, most: int) -> bytes:
    """The file at ``path`` in the task's branch (its snapshot), at most ``most`` bytes;
    InvalidSpec with the way on when there is none, or it is larger."""
    if not record.branch:
        raise InvalidSpec(f"Task {record.task_id} has no snapshot yet; its status says why.")
    git = Git(Path(record.repository))
    found = git.object_info(f"refs/heads/{record.branch}:{path}")
    if found is None or found[1] != "blob":
        raise InvalidSpec(
            f"Task {record.task_id}'s snapshot has no file '{path[:200]}'; changed_files names "
            "the files it changed."
        )
    sha, _, size = found
    if size > most:
        raise InvalidSpec(
            f"'{path[:200]}' is {size} bytes, over the {most} bytes read at once; accept the "
            "task to have it in the working tree."
        )
    return git.run("cat-file", "blob", sha).stdout
