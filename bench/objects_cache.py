"""What the sandbox's own object store costs: packing the objects reachable from a base commit
(once per base, cached), and the pack of what a later commit added on top of a cached base (the
chain), against the floor of `git worktree add` of the same commit (what every task pays
anyway). On a repository given with `--large-repo PATH` (a real one is best: the published
figures are from git/git, 82,000 commits), else on a generated history."""

from __future__ import annotations

import subprocess
from pathlib import Path

from bench.common import git, timed
from bridge.workspace.fs import remove_tree, tree_size
from bridge.workspace.objects import base_stores, cache_root


def make_history(path: Path, commits: int, files: int) -> Path:
    """A repository with ``commits`` commits over ``files`` files, made with fast-import."""
    path.mkdir(parents=True)
    git(path, "init", "-q", "-b", "main")
    lines = []
    for c in range(commits):
        lines.append(f"commit refs/heads/main\ncommitter b <b@b> {1_700_000_000 + c} +0000\n")
        lines.append(f"data 3\nc{c % 10}\n")  # each commit follows the branch's last one
        for f in [*range(files)] if c == 0 else [c % files, (c * 7) % files]:
            body = f"file {f} at commit {c}\n" * 20
            lines.append(f"M 100644 inline src/{f // 100}/f{f}.txt\ndata {len(body)}\n{body}\n")
    stream = "".join(lines).encode()
    subprocess.run(["git", "-C", str(path), "fast-import", "--quiet"], input=stream, check=True)
    git(path, "checkout", "-q", "main")
    return path


def bench_objects_cache(repo: Path, root: Path) -> dict:
    home = root / "home-objects"
    head = git(repo, "rev-parse", "HEAD").strip()
    parent = git(repo, "rev-parse", "HEAD~1").strip()
    commits = int(git(repo, "rev-list", "--count", head).strip())
    worktree = root / "objects-floor-wt"
    floor = timed(lambda: git(repo, "worktree", "add", "-q", "--detach", str(worktree), head))
    git(repo, "worktree", "remove", "--force", str(worktree))
    full = timed(lambda: base_stores(home, repo, parent))
    chained = timed(lambda: base_stores(home, repo, head))
    cached = timed(lambda: base_stores(home, repo, head))
    full_mb = tree_size([cache_root(home, repo) / parent]) / 2**20
    step_kb = tree_size([cache_root(home, repo) / head]) / 1024
    remove_tree(home)
    print(
        f"  objects of a base ({commits} commits): full pack {full:.2f} s ({full_mb:.0f} MiB), "
        f"next commit's pack {chained * 1000:.0f} ms ({step_kb:.0f} KiB), cached "
        f"{cached * 1000:.1f} ms; git worktree add {floor:.2f} s"
    )
    return {
        "commits": commits,
        "full_pack_s": round(full, 3),
        "full_pack_mib": round(full_mb, 1),
        "next_commit_pack_s": round(chained, 4),
        "next_commit_pack_kib": round(step_kb, 1),
        "cached_s": round(cached, 5),
        "worktree_add_s": round(floor, 3),
        "full_vs_worktree_add_ratio": round(full / floor, 2),
        "next_commit_vs_worktree_add_ratio": round(chained / floor, 3),
    }
