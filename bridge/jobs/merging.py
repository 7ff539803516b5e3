"""Integration on the host: the chosen tasks' snapshots merged one after another from their
common base with `git merge-tree` (no worktree, no index), stopping at the first conflict, and
each cumulative result read back as the files it changes against the base.

Everything git writes here (trees, the commits each step is merged from) goes to a private
object directory under the state root; the user's own objects are only read (as alternates),
so the user's repository is unchanged."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from bridge.workspace.git import Git, common_git_dir

SYMLINK = "120000"
# The file modes git records for a regular file: the integration task carries each one.
FILE_MODES = {"100644": "0644", "100755": "0755"}


@dataclass
class Step:
    """One task merged onto those before it: the files of the cumulative change, or why not."""

    task_id: str
    write: dict[str, str] = field(default_factory=dict)
    modes: dict[str, str] = field(default_factory=dict)  # path -> "0644" | "0755", as written
    delete: list[str] = field(default_factory=list)
    conflict: list[str] = field(default_factory=list)
    problem: str | None = None
    tree: str | None = None  # the merged tree the integration task must reproduce exactly


NAMED_CONFLICTS = 20  # paths a conflict's sentence names; the step's report keeps 100


def _conflict(task_id: str, paths: list[str]) -> Step:
    """The step that does not merge: its conflicting paths, bounded (a task may change many
    thousands of files, and the report is kept in the job's result)."""
    named = ", ".join(paths[:NAMED_CONFLICTS]) or "its files"
    more = len(paths) - NAMED_CONFLICTS
    if more > 0:
        named += f" and {more} more"
    return Step(
        task_id,
        conflict=paths[:100],
        problem=f"Task {task_id} conflicts with the changes before it on {named}.",
    )


class Merger:
    def __init__(self, repo: Path, base: str, scratch: Path, most_bytes: int = 4096 << 10):
        objects = scratch / "objects"
        objects.mkdir(parents=True, exist_ok=True)
        self.git = Git(repo)
        self.base = base
        self.most_bytes = most_bytes  # config jobs.integration_kb
        self.env = {
            "GIT_OBJECT_DIRECTORY": str(objects),
            "GIT_ALTERNATE_OBJECT_DIRECTORIES": str(common_git_dir(repo) / "objects"),
        }

    def _out(self, *args: str) -> str:
        return self.git.run(*args, env=self.env).stdout.decode().strip()

    def steps(self, snapshots: list[tuple[str, str]]) -> list[Step]:
        """(task id, snapshot commit) in order -> a Step each, up to the first that does not
        merge (which is the last one returned)."""
        found: list[Step] = []
        current: str | None = None
        for n, (task_id, commit) in enumerate(snapshots):
            if current is None:
                tree = self._out("rev-parse", f"{commit}^{{tree}}")
            else:
                proc = self.git.run(
                    "merge-tree",
                    "--write-tree",
                    "--name-only",
                    current,
                    commit,
                    env=self.env,
                    check=False,
                )
                lines = proc.stdout.decode(errors="replace").splitlines()
                if proc.returncode != 0:
                    paths = []
                    for line in lines[1:]:
                        if not line:
                            break
                        paths.append(line)
                    found.append(_conflict(task_id, paths))
                    return found
                tree = lines[0]
            current = self._out("commit-tree", tree, "-p", self.base, "-m", f"integration {n + 1}")
            found.append(self._files(task_id, tree))
            found[-1].tree = tree
            if found[-1].problem:
                return found
        return found

    def differences(self, tree: str, commit: str) -> list[str]:
        """The paths where ``commit``'s tree differs from ``tree`` in content or mode (none when
        the two trees are the same object)."""
        if self._out("rev-parse", f"{commit}^{{tree}}") == tree:
            return []
        args = ("diff-tree", "-r", "-z", "--name-only", tree, f"{commit}^{{tree}}")
        raw = self.git.run(*args, env=self.env)
        return [p for p in raw.stdout.decode(errors="replace").split("\0") if p]

    def _too_big(self, task_id: str) -> str:
        return (
            f"The change up to task {task_id} holds more than {self.most_bytes >> 10} KB of "
            "file contents and paths, more than one integration step carries (config "
            "jobs.integration_kb); integrate fewer or smaller tasks."
        )

    def _files(self, task_id: str, tree: str) -> Step:
        """The cumulative change as files to write (with their modes) and delete: regular text
        files only, since the mock worker writes the change in the integration task; anything
        else stops the integration, saying so, rather than producing a different change."""
        step, carried = Step(task_id), 0
        raw = self.git.run("diff-tree", "-r", "-z", "--no-renames", self.base, tree, env=self.env)
        fields = raw.stdout.decode(errors="surrogateescape").split("\0")
        for meta, path in zip(fields[0::2], fields[1::2], strict=False):
            if not meta:
                continue
            new_mode, status = meta.split()[1], meta.split()[4]
            carried += len(path) + 64  # each path and its spec entry count, contents below
            if carried > self.most_bytes:
                step.problem = self._too_big(task_id)
                return step
            if status == "D":
                step.delete.append(path)
                continue
            if new_mode == SYMLINK:
                step.problem = f"{path} is a symlink; integrate cannot carry it yet."
                return step
            if new_mode not in FILE_MODES:
                step.problem = (
                    f"{path} is not a regular file (git mode {new_mode}, a submodule?); "
                    "integrate cannot carry it."
                )
                return step
            blob = self.git.run("cat-file", "blob", f"{tree}:{path}", env=self.env).stdout
            carried += len(blob)
            if carried > self.most_bytes:
                step.problem = self._too_big(task_id)
                return step
            try:
                step.write[path] = blob.decode("utf-8")
                step.modes[path] = FILE_MODES[new_mode]
            except UnicodeDecodeError:
                step.problem = f"{path} is not UTF-8 text; integrate cannot carry it yet."
                return step
        return step
