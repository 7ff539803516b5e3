"""Collecting a large change: N new small files in a worktree, snapshotted, diffed and listed by
worker-bridge's collect (stat baseline, safe reads, one fast-import), against the floor of doing
the same by hand in a plain clone (`git add -A`, `write-tree`, `commit-tree`, `diff --raw`,
`diff --binary`). Run at growing N to show how the cost grows (it should stay linear). The
whole task of such a change (worker, collect, verification, accept, on tmpfs and on the root
disk) is `bench/large_task.py`."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

from bench.common import git, timed
from bridge.workspace.baseline import record_files
from bridge.workspace.diff import list_changes, write_diff
from bridge.workspace.fs import remove_tree
from bridge.workspace.git import Git
from bridge.workspace.snapshot import SnapshotLimits, snapshot_worktree
from bridge.workspace.worktree import TaskWorkspace, create_workspace, remove_workspace

LIMITS = SnapshotLimits(file_bytes=2**30, change_bytes=2**34)


def _write_files(root: Path, count: int) -> None:
    for d in range(max(count // 1000, 1)):
        folder = root / "many" / f"{d:03d}"
        folder.mkdir(parents=True, exist_ok=True)
        for f in range(min(count, 1000)):
            (folder / f"{f}.txt").write_text(f"file {d}/{f}\n")


def _bridge(repo: Path, home: Path, count: int, n: int) -> tuple[float, int]:
    ws = TaskWorkspace.plan(home, repo, f"bench{n}")
    base = Git(repo).resolve_commit("HEAD")
    create_workspace(home, ws, base, None)
    try:
        before = record_files(ws.worktree)
        _write_files(ws.worktree, count)
        out = home / f"diff-{n}"
        changes: list = []

        def collect() -> None:
            snap = snapshot_worktree(ws, base, base, "bench", LIMITS, before)
            changes.extend(list_changes(repo, base, snap.commit))
            write_diff(repo, base, snap.commit, out)

        return timed(collect), len(changes)
    finally:
        remove_workspace(home, ws, delete_branch=True)


def _floor(repo: Path, scratch: Path, count: int, n: int) -> float:
    clone = scratch / f"floor-{n}"
    subprocess.run(["git", "clone", "-q", "--local", str(repo), str(clone)], check=True)
    try:
        _write_files(clone, count)
        base = git(clone, "rev-parse", "HEAD").strip()

        def by_hand() -> None:
            git(clone, "add", "-A")
            tree = git(clone, "write-tree").strip()
            commit = git(clone, "commit-tree", tree, "-p", base, "-m", "floor").strip()
            git(clone, "diff", "--raw", "-z", "-M", base, commit)
            (scratch / f"floor-{n}.diff").write_text(git(clone, "diff", "--binary", base, commit))

        return timed(by_hand)
    finally:
        remove_tree(clone)


def bench_large_change(repo: Path, root: Path, sizes: list[int]) -> dict:
    home = root / "home-large"
    home.mkdir(parents=True, exist_ok=True)
    rows = []
    for n, count in enumerate(sizes):
        floor = _floor(repo, root, count, n)
        bridge, changed = _bridge(repo, home, count, n)
        if changed != count:
            raise RuntimeError(f"collected {changed} changes of {count}")
        rows.append(
            {
                "files": count,
                "bridge_s": round(bridge, 3),
                "floor_s": round(floor, 3),
                "ratio": round(bridge / floor, 3),
                "bridge_us_per_file": round(bridge / count * 1e6, 1),
            }
        )
        print(
            f"  collect {count:>7} new files: bridge {bridge:.2f} s, by hand {floor:.2f} s "
            f"({bridge / floor:.2f}x), {bridge / count * 1e6:.0f} us/file"
        )
    os.sync()
    return {"sizes": rows, "ratio_largest": rows[-1]["ratio"]}
