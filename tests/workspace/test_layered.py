"""Layered checkouts: a worktree that is an overlay over the base's cached tree collects exactly
what a fully checked-out one does (the change set read from the upper dir equals a walk of
everything), nothing written through it reaches the cached base, another task or the user's
repository, and a killed process's mounts are reclaimed without breaking the next task."""

from __future__ import annotations

import hashlib
import os
import shutil
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
from support.fake_mount import fake_mount
from support.repos import commit_all, git, write_files

from bridge.workspace import overlay
from bridge.workspace.bases import base_folder, unused_bases
from bridge.workspace.git import Git
from bridge.workspace.snapshot import SnapshotLimits, snapshot_worktree
from bridge.workspace.worktree import TaskWorkspace, create_workspace, remove_workspace

LIMITS = SnapshotLimits(file_bytes=2**20, change_bytes=4 * 2**20)

pytestmark = pytest.mark.skipif(
    os.geteuid() != 0, reason="overlay mounts are made by a root host process"
)


def _workspace(home, repo, task_id, layered):
    ws = TaskWorkspace.plan(home, repo, task_id)
    base = Git(repo).resolve_commit("HEAD")
    made = create_workspace(home, ws, base, None, layered=layered)
    assert made.kind == ("layered" if layered else "full"), made
    return ws, base


def _tree(repo, commit):
    return git(repo, "rev-parse", f"{commit}^{{tree}}").strip()


def _digest(root: Path) -> str:
    """Every entry under ``root`` (but a top-level `.git` folder, which git itself changes):
    path, type, mode, owner, content or link target."""
    h = hashlib.sha256()
    for folder, dirs, files in os.walk(root):
        if Path(folder) == root and ".git" in dirs:  # the user's repository: its files only
            dirs.remove(".git")
        dirs.sort()
        for name in sorted(dirs + files):
            path = Path(folder) / name
            st = os.lstat(path)
            h.update(f"{path.relative_to(root)}\0{st.st_mode}\0{st.st_uid}\0".encode())
            if path.is_symlink():
                h.update(os.readlink(path).encode())
            elif path.is_file():
                h.update(path.read_bytes())
    return h.hexdigest()


@pytest.fixture
def tricky_repo(workdir):
    """A repository with nested folders, an executable, a link and an ignore rule."""
    repo = workdir / "tricky"
    repo.mkdir()
    git(repo, "init", "-q", "-b", "main")
    files = {
        "a.txt": "a\n",
        "keep.txt": "keep\n",
        "run.sh": "#!/bin/sh\n",
        "dir/one.txt": "1\n",
        "dir/sub/two.txt": "2\n",
        "gone/x.txt": "x\n",
        "becomes_file/y.txt": "y\n",
        "becomes_dir": "z\n",
        "moved/m.txt": "m\n",
        "opaque/o1.txt": "o1\n",
        "opaque/o2.txt": "o2\n",
        "flat/f1.txt": "f1\n",
        "flat/f2.txt": "f2\n",
        ".gitignore": "*.log\nsecret/\n",
    }
    write_files(repo, files)
    os.chmod(repo / "run.sh", 0o755)
    os.symlink("a.txt", repo / "link")
    commit_all(repo, "base")
    return repo


def _tricky_edit(root: Path) -> None:
    """Deletions, renames (a folder's too, by `mv`), mode
    changes, links, a folder replaced by a file and a file by a folder, a folder deleted and
    made again (opaque), ignored files and a changed ignore rule."""
    (root / "a.txt").write_text("A\n")
    (root / "flat" / "f1.txt").write_text("F1\n")  # a folder with an untouched sibling
    (root / "keep.txt").write_text("keep\n")  # rewritten with the same bytes
    os.chmod(root / "run.sh", 0o644)
    (root / "link").unlink()
    os.symlink("keep.txt", root / "link")
    os.symlink("/etc/passwd", root / "outside")
    shutil.rmtree(root / "gone")
    shutil.rmtree(root / "becomes_file")
    (root / "becomes_file").write_text("now a file\n")
    (root / "becomes_dir").unlink()
    (root / "becomes_dir").mkdir()
    (root / "becomes_dir" / "inside.txt").write_text("in\n")
    subprocess.run(["mv", str(root / "moved"), str(root / "renamed")], check=True)
    shutil.rmtree(root / "opaque")
    (root / "opaque").mkdir()
    (root / "opaque" / "o3.txt").write_text("o3\n")
    (root / "dir" / "sub" / "two.txt").rename(root / "dir" / "two.txt")
    (root / "build.log").write_text("ignored\n")
    (root / "secret").mkdir()
    (root / "secret" / "s.txt").write_text("ignored\n")
    (root / "empty").mkdir()
    (root / "new" / "deep").mkdir(parents=True)
    (root / "new" / "deep" / "n.txt").write_text("n\n")


@pytest.fixture(params=["paths", "whole tree"])
def listing(request, monkeypatch):
    """Both ways the start's entries are listed: at the changed paths, or all of them (a large
    change)."""
    if request.param == "whole tree":
        monkeypatch.setattr("bridge.workspace.baseline.PATHSPEC_MAX", 0)
    return request.param


def test_collect_from_the_upper_dir_equals_collect_by_a_full_walk(home, tricky_repo, listing):
    layered, base = _workspace(home, tricky_repo, "layered", layered=True)
    full, _ = _workspace(home, tricky_repo, "full", layered=False)
    assert overlay.mounted(layered.worktree) and layered.upper is not None
    for ws in (layered, full):
        _tricky_edit(ws.worktree)
    snaps = [snapshot_worktree(ws, base, base, "m", LIMITS) for ws in (layered, full)]
    assert _tree(tricky_repo, snaps[0].commit) == _tree(tricky_repo, snaps[1].commit)
    names = git(tricky_repo, "ls-tree", "-r", "--name-only", snaps[0].commit).split()
    assert "renamed/m.txt" in names and "moved/m.txt" not in names
    assert "opaque/o3.txt" in names and "opaque/o1.txt" not in names
    assert "becomes_dir/inside.txt" in names and "becomes_file/y.txt" not in names
    assert "build.log" not in names and "secret/s.txt" not in names
    assert "flat/f2.txt" in names and "dir/one.txt" in names


def _rename_edit(root: Path) -> None:
    """Base folders renamed by rename(2) itself, as `git mv` and `os.rename` do (no copy when
    the kernel says EXDEV): in place, into another folder, into a folder the task made, twice,
    onto a deleted folder's place, and then written in."""
    os.rename(root / "moved", root / "renamed")
    os.rename(root / "dir" / "sub", root / "flat" / "sub2")
    (root / "made").mkdir()
    os.rename(root / "opaque", root / "made" / "opaque")
    os.rename(root / "renamed", root / "again")
    shutil.rmtree(root / "gone")
    os.rename(root / "becomes_file", root / "gone")
    (root / "again" / "m.txt").write_text("M\n")
    (root / "flat" / "sub2" / "added.txt").write_text("added\n")
    (root / "made" / "opaque" / "o1.txt").unlink()


def test_base_folders_renamed_in_place_are_collected_as_by_a_full_walk(home, tricky_repo, listing):
    layered, base = _workspace(home, tricky_repo, "layered", layered=True)
    full, _ = _workspace(home, tricky_repo, "full", layered=False)
    for ws in (layered, full):
        _rename_edit(ws.worktree)  # EXDEV in an overlay that cannot redirect a folder
    snaps = [snapshot_worktree(ws, base, base, "m", LIMITS) for ws in (layered, full)]
    assert _tree(tricky_repo, snaps[0].commit) == _tree(tricky_repo, snaps[1].commit)
    names = git(tricky_repo, "ls-tree", "-r", "--name-only", snaps[0].commit).split()
    assert "again/m.txt" in names and "moved/m.txt" not in names
    assert git(tricky_repo, "show", f"{snaps[0].commit}:again/m.txt") == "M\n"
    assert {"flat/sub2/two.txt", "flat/sub2/added.txt"} <= set(names)
    assert "dir/sub/two.txt" not in names and "dir/one.txt" in names
    assert "made/opaque/o2.txt" in names and "made/opaque/o1.txt" not in names
    assert "gone/y.txt" in names and "gone/x.txt" not in names
    # The base's own checkout is untouched: another task still sees every folder where it was.
    other, _ = _workspace(home, tricky_repo, "other", layered=True)
    assert (other.worktree / "moved" / "m.txt").read_text() == "m\n"
    assert (other.worktree / "dir" / "sub" / "two.txt").read_text() == "2\n"


def test_a_changed_ignore_rule_and_a_later_turn_are_collected_as_by_a_full_walk(
    home, tricky_repo, listing
):
    layered, base = _workspace(home, tricky_repo, "layered", layered=True)
    full, _ = _workspace(home, tricky_repo, "full", layered=False)
    firsts = []
    for ws in (layered, full):
        (ws.worktree / "added.txt").write_text("turn one\n")
        (ws.worktree / "build.log").write_text("ignored, then not\n")
        firsts.append(snapshot_worktree(ws, base, base, "1", LIMITS).commit)
    assert _tree(tricky_repo, firsts[0]) == _tree(tricky_repo, firsts[1])
    seconds = []
    for ws, start in zip((layered, full), firsts, strict=True):
        (ws.worktree / "added.txt").unlink()  # added by turn one: nothing left in the upper dir
        (ws.worktree / ".gitignore").write_text("secret/\n")  # build.log is no longer ignored
        seconds.append(snapshot_worktree(ws, base, start, "2", LIMITS).commit)
    assert _tree(tricky_repo, seconds[0]) == _tree(tricky_repo, seconds[1])
    names = git(tricky_repo, "ls-tree", "-r", "--name-only", seconds[0]).split()
    assert "added.txt" not in names and "build.log" in names


def test_writes_through_a_layered_worktree_never_reach_the_base_or_the_user(home, tricky_repo):
    one, base = _workspace(home, tricky_repo, "one", layered=True)
    two, _ = _workspace(home, tricky_repo, "two", layered=True)
    folder = base_folder(home, tricky_repo, base, None)
    before = _digest(folder / "tree"), _digest(two.worktree), _digest(tricky_repo)
    root = one.worktree
    with open(root / "a.txt", "a") as f:  # in place, through an open file
        f.write("appended\n")
    os.link(root / "keep.txt", root / "hard")  # a hard link to a base file, then written
    with open(root / "hard", "w") as f:
        f.write("through the link\n")
    os.chmod(root / "dir" / "one.txt", 0o777)
    os.chown(root / "dir" / "one.txt", 1234, 1234)
    os.replace(root / "dir" / "sub" / "two.txt", root / "keep.txt")  # rename over
    shutil.rmtree(root / "opaque")
    (root / "link").unlink()
    os.symlink(str(folder / "tree" / "a.txt"), root / "link")  # a link to the base itself
    (root / "dir" / "sub").mkdir(exist_ok=True)
    for mark, value in ((overlay.OPAQUE_XATTR, b"y"), (overlay.REDIRECT_XATTR, b"/gone")):
        try:  # the overlay's own marks are refused or kept escaped, never obeyed (even as root)
            os.setxattr(root / "dir", mark, value)
        except OSError:
            pass
    assert (root / "dir" / "one.txt").exists() and not (root / "dir" / "x.txt").exists()
    assert not overlay._opaque(one.upper / "dir") and not overlay._redirected(one.upper / "dir")
    assert _digest(folder / "tree") == before[0]
    assert (_digest(two.worktree), _digest(tricky_repo)) == before[1:]
    assert (two.worktree / "opaque" / "o1.txt").read_text() == "o1\n"


def test_removing_a_layered_workspace_unmounts_it_and_leaves_the_base_for_the_others(
    home, tricky_repo
):
    one, base = _workspace(home, tricky_repo, "one", layered=True)
    two, _ = _workspace(home, tricky_repo, "two", layered=True)
    (one.worktree / "new.txt").write_text("x\n")
    assert remove_workspace(home, one, delete_branch=True) == []
    assert not overlay.mounted(one.worktree)
    assert not one.worktree.exists() and not one.layers.exists()
    assert (two.worktree / "a.txt").read_text() == "a\n"
    assert unused_bases(home) == []  # two is over it (and it was just used)


_KILLED = textwrap.dedent(
    """
    import os, signal, sys
    from pathlib import Path
    sys.path.insert(0, {root!r})
    from bridge.workspace import overlay
    from bridge.workspace.bases import base_tree
    from bridge.workspace.worktree import TaskWorkspace, create_workspace
    home, repo, base = Path({home!r}), Path({repo!r}), {base!r}
    ws = TaskWorkspace.plan(home, repo, "killed")
    assert create_workspace(home, ws, base, None, layered=True).kind == "layered"
    folder = base_tree(home, repo, base, None)
    point = overlay.mount_point(home, "killed", "verify-0")
    overlay.mount(overlay.Layers((folder / "tree",), home / "tasks" / "killed" / "v", point))
    (ws.worktree / "half.txt").write_text("written before the kill\\n")
    os.kill(os.getpid(), signal.SIGKILL)
    """
)


def test_mounts_a_killed_process_left_are_reclaimed_and_the_next_task_works(
    home, tricky_repo, bridge
):
    base = Git(tricky_repo).resolve_commit("HEAD")
    script = _KILLED.format(
        root=str(Path(__file__).resolve().parents[2]),
        home=str(home),
        repo=str(tricky_repo),
        base=base,
    )
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, timeout=120)
    assert proc.returncode == -signal.SIGKILL, proc.stderr.decode()
    verify_point = overlay.mount_point(home, "killed", "verify-0")
    worktree = home / "worktrees" / "killed"
    assert overlay.mounted(verify_point) and overlay.mounted(worktree)
    assert bridge.store.statuses(["killed"]) == {}  # the store exists; "killed" is no task
    bridge.recover()  # what any bridge process runs
    assert not overlay.mounted(verify_point) and not verify_point.exists()
    from bridge.pipeline.prune import apply_prune, plan_prune

    apply_prune(bridge.context(), plan_prune(bridge.context()))  # its orphan folders
    assert [p for p in overlay.mount_points() if p.startswith(f"{home}/")] == []
    assert not worktree.exists() and not (home / "layers" / "killed").exists()
    assert (tricky_repo / "a.txt").read_text() == "a\n"
    nxt, _ = _workspace(home, tricky_repo, "next", layered=True)
    assert sorted(p.name for p in nxt.worktree.iterdir())[:3] == [".git", ".gitignore", "a.txt"]
    assert not (nxt.worktree / "half.txt").exists()


HOSTILE = """
set +e
echo pwn >> calc.py
ln README.md hard; echo through-a-hard-link > hard
chmod 777 .gitignore
mv tests/test_calc.py calc.py
rm -rf tests
ln -s / rootlink; echo x > rootlink/tmp/planted
setfattr -n trusted.overlay.opaque -v y . 2>/dev/null
mkdir -p deep/er; echo new > deep/er/file.txt
true
"""


def test_a_hostile_worker_and_verifier_in_layered_checkouts_change_only_their_own_task(
    docker_images, bridge, repo
):
    from support.tasks import mock_task

    first = bridge.run_task(
        bridge.create_task(mock_task(repo, {"write": {"a.txt": "a\n"}})).task_id
    )
    assert first.status == "succeeded"
    other = home_of(bridge) / "worktrees" / first.task_id
    assert overlay.mounted(other)
    base = Git(repo).resolve_commit("HEAD")
    folder = next((home_of(bridge) / "bases").glob(f"*/{base}-*"))
    before = _digest(folder / "tree"), _digest(other), _digest(repo)
    spec = mock_task(
        repo,
        {"script": HOSTILE},
        verify=[
            "echo pwn >> calc.py; rm -rf deep; rm -f README.md; test -f deep/er/file.txt || true"
        ],
    )
    created = bridge.create_task(spec)
    result = bridge.run_task(created.task_id).document()
    assert result["status"] == "succeeded", result["error"]
    kinds = [e.data.get("checkout") for e in bridge.task_logs(created.task_id).events]
    assert "layered" in kinds  # the worktree (workspace.ready) and verification's checkout
    assert (_digest(folder / "tree"), _digest(other), _digest(repo)) == before
    for root in ("bases", "layers"):  # the sandbox reached them through its mounts alone
        assert (home_of(bridge) / root).stat().st_mode & 0o777 == 0o700
    changed = {c["path"]: c["change"] for c in result["changed_files"]}
    assert changed["deep/er/file.txt"] == "added" and changed["tests/test_calc.py"] == "deleted"
    assert changed["calc.py"] == "modified" and "rootlink" in changed
    snapshot = bridge.store.load_task(created.task_id).snapshot_commit
    assert git(repo, "show", f"{snapshot}:hard") == "through-a-hard-link\n"
    # Both names are one inode of this task's own (copied up), as in a full checkout.
    assert git(repo, "show", f"{snapshot}:README.md") == "through-a-hard-link\n"


def test_a_worker_renaming_base_folders_in_place_gets_exactly_that_change(
    docker_images, bridge, workdir
):
    from support.tasks import mock_task

    repo = workdir / "moves"
    repo.mkdir()
    git(repo, "init", "-q", "-b", "main")
    write_files(repo, {"src/app.py": "app\n", "src/sub/deep.py": "deep\n", "pkg/mod.py": "mod\n"})
    write_files(repo, {"docs/guide.md": "guide\n", "README.md": "r\n"})
    commit_all(repo, "base")
    # `mv` copies on EXDEV; `git mv` and os.rename do not: each renames a base folder in place.
    script = (
        "set -e; mv src lib; git mv pkg pkg2; "
        "python3 -c \"import os; os.rename('docs', 'manual')\"; echo more >> lib/app.py"
    )
    verify = ["test -f lib/sub/deep.py && test ! -e src && mv lib/sub lib/sub2 && ls lib/sub2"]
    spec = mock_task(repo, {"script": script}, verify=verify)
    result = bridge.run_task(bridge.create_task(spec).task_id).document()
    assert result["status"] == "succeeded", result["error"]
    checkouts = [e.data.get("checkout") for e in bridge.task_logs(result["task_id"]).events]
    assert checkouts.count("layered") == 2  # the worktree and verification's checkout
    changed = {(c["path"], c.get("from")): c["change"] for c in result["changed_files"]}
    assert changed == {
        ("lib/app.py", None): "added",  # changed as well: a rename git does not pair
        ("src/app.py", None): "deleted",
        ("lib/sub/deep.py", "src/sub/deep.py"): "renamed",
        ("pkg2/mod.py", "pkg/mod.py"): "renamed",
        ("manual/guide.md", "docs/guide.md"): "renamed",
    }
    snapshot = bridge.store.load_task(result["task_id"]).snapshot_commit
    assert git(repo, "show", f"{snapshot}:lib/app.py") == "app\nmore\n"
    assert git(repo, "show", f"{snapshot}:lib/sub/deep.py") == "deep\n"


def home_of(bridge) -> Path:
    return bridge.config.home


def test_a_task_says_which_checkout_it_got_and_the_switch_turns_layers_off(
    docker_images, home, repo
):
    from support.tasks import mock_task

    from bridge import WorkerBridge

    for setting, expected in (("true", "layered"), ("false", "full")):
        (home / "config.yaml").write_text(f"layered_checkouts: {setting}\n")
        bridge = WorkerBridge(home=home)
        try:
            spec = mock_task(repo, {"write": {"a.txt": "a\n"}}, verify=["test -f a.txt"])
            result = bridge.run_task(bridge.create_task(spec).task_id)
            assert result.status == "succeeded"
            ready = [
                e for e in bridge.task_logs(result.task_id).events if e.kind == "workspace.ready"
            ]
            assert ready[0].data["checkout"] == expected
            worktree = home / "worktrees" / result.task_id
            assert overlay.mounted(worktree) is (expected == "layered")
            assert (worktree / "a.txt").read_text() == "a\n"
        finally:
            bridge.close()


def _idle(folder: Path) -> None:
    """Make a base folder look unused for longer than prune waits."""
    from bridge.workspace.bases import IDLE_S

    old = time.time() - IDLE_S - 60
    os.utime(folder / "ready", (old, old))


def test_prune_keeps_a_base_a_task_started_on_between_its_plan_and_its_apply(
    home, tricky_repo, bridge
):
    from bridge.pipeline.prune import apply_prune, plan_prune

    one, base = _workspace(home, tricky_repo, "one", layered=True)
    assert remove_workspace(home, one, delete_branch=True) == []
    folder = base_folder(home, tricky_repo, base, None)
    _idle(folder)
    planned = [a for a in plan_prune(bridge.context()) if a.target == str(folder)]
    assert [a.kind for a in planned] == ["object_cache"]  # unused, so far
    two, _ = _workspace(home, tricky_repo, "two", layered=True)  # a task starts on it
    (done,) = apply_prune(bridge.context(), planned)
    assert done.failed and "in use again" in done.failed[0]
    assert (folder / "tree" / "a.txt").read_text() == "a\n"
    assert (two.worktree / "dir" / "sub" / "two.txt").read_text() == "2\n"


_HOLD_BASES_LOCK = textwrap.dedent(
    """
    import sys
    from pathlib import Path
    sys.path.insert(0, {root!r})
    from bridge.workspace.locks import bases_lock
    with bases_lock(Path({home!r})):  # as base_tree() does while it picks or makes a base
        print("held", flush=True)
        sys.stdin.read()
    """
)


def test_prune_leaves_a_base_while_another_process_holds_the_lock_base_tree_takes(
    home, tricky_repo, bridge, monkeypatch
):
    from bridge.pipeline.prune import apply_prune, plan_prune

    one, base = _workspace(home, tricky_repo, "one", layered=True)
    assert remove_workspace(home, one, delete_branch=True) == []
    folder = base_folder(home, tricky_repo, base, None)
    _idle(folder)
    planned = [a for a in plan_prune(bridge.context()) if a.target == str(folder)]
    assert planned
    root = str(Path(__file__).resolve().parents[2])
    script = _HOLD_BASES_LOCK.format(root=root, home=str(home))
    holder = subprocess.Popen(
        [sys.executable, "-c", script], stdin=subprocess.PIPE, stdout=subprocess.PIPE
    )
    try:
        assert holder.stdout.readline() == b"held\n"
        monkeypatch.setattr("bridge.workspace.bases.LOCK_WAIT_S", 0.3)
        (done,) = apply_prune(bridge.context(), planned)
        assert done.failed and "lock on the base trees" in done.failed[0]
        assert (folder / "tree" / "a.txt").is_file()
    finally:
        holder.communicate(b"", timeout=60)
    (done,) = apply_prune(bridge.context(), planned)  # the lock is free: removed, in one step
    assert done.failed is None and not folder.exists()
    assert list(folder.parent.iterdir()) == []  # nothing left aside either


def _mounts_at(point: Path) -> int:
    lines = Path("/proc/self/mountinfo").read_text().splitlines()
    return sum(1 for line in lines if line.split(" ")[4] == str(point))


def test_a_state_root_reached_through_a_link_mounts_once_and_unmounts_before_removing(
    workdir, tricky_repo
):
    from bridge import WorkerBridge
    from bridge.workspace.worktree import ensure_mounted

    real = workdir / "real-home"
    real.mkdir()
    link = workdir / "linked-home"
    link.symlink_to(real)
    ws, base = _workspace(link, tricky_repo, "one", layered=True)
    assert overlay.mounted(ws.worktree)
    ensure_mounted(link, ws, base, None)  # a later phase: it is mounted, nothing piles up
    assert _mounts_at(real / "worktrees" / "one") == 1
    (ws.worktree / "new.txt").write_text("x\n")
    assert remove_workspace(link, ws, delete_branch=True) == []
    assert [p for p in overlay.mount_points() if p.startswith(f"{real}/")] == []
    # A verification checkout's mount (no lowers file) keeps its base from prune, and the
    # one a killed runner of an unknown task left is undone by recovery.
    folder = base_folder(link, tricky_repo, base, None)
    _idle(folder)
    point = overlay.mount_point(link, "ghost", "verify-0")
    overlay.mount(overlay.Layers((folder / "tree",), link / "tasks" / "ghost" / "v", point))
    assert overlay.mounted(point) and unused_bases(link) == []
    bridge = WorkerBridge(home=link)
    try:
        assert bridge.store.statuses(["ghost"]) == {}  # the store exists; "ghost" is no task
        bridge.recover()
    finally:
        bridge.close()
    assert not overlay.mounted(point) and not point.exists()
    assert unused_bases(link) == [folder]
    assert (tricky_repo / "a.txt").read_text() == "a\n"


def test_a_host_process_as_the_sandbox_uid_reaches_neither_its_worktree_nor_the_shared_layers(
    home, tricky_repo
):
    """By path, a host process running as the sandbox uid (an account that has it) reaches
    nothing under the state root: not the base tree it owns, not a task's change set, and not
    the worktree either, which only the task's containers reach, through their mounts. The
    state root is made private by the bridge's entry, even where it was left open."""
    from bridge import WorkerBridge
    from bridge.sandbox.fake import FakeSandbox

    home.chmod(0o755)  # a state root others could enter, as an older version made it
    bridge = WorkerBridge(home=home, sandbox=FakeSandbox())
    bridge.list_tasks()  # the facade's first use of the state root
    bridge.close()
    uid = 10001  # the default sandbox_uid: what a root bridge hands the base tree to
    ws = TaskWorkspace.plan(home, tricky_repo, "one")
    base = Git(tricky_repo).resolve_commit("HEAD")
    assert create_workspace(home, ws, base, (uid, uid), layered=True).kind == "layered"
    folder = base_folder(home, tricky_repo, base, (uid, uid))
    assert (folder / "tree" / "a.txt").stat().st_uid == uid  # it may copy up any base file
    assert (ws.worktree / "a.txt").stat().st_uid == uid
    for root in (home, home / "bases", home / "layers", home / "worktrees"):
        st = root.stat()
        assert (st.st_mode & 0o7777, st.st_uid) == (0o700, os.geteuid()), root

    def as_sandbox(command: str) -> int:
        run = subprocess.run(["sh", "-c", command], user=uid, group=uid, extra_groups=[])
        return run.returncode

    before = _digest(folder / "tree")
    assert as_sandbox(f"echo pwn >> {folder}/tree/a.txt") != 0  # the shared base, in place
    assert as_sandbox(f"rm -f {folder}/tree/keep.txt") != 0
    assert as_sandbox(f"ln -s /etc {folder}/tree/dir/planted") != 0
    assert as_sandbox(f"echo pwn > {ws.layers}/upper/planted.txt") != 0  # a task's change set
    assert as_sandbox(f"echo pwn >> {ws.worktree}/a.txt") != 0  # its worktree, by path
    assert as_sandbox(f"rm -f {ws.worktree}/keep.txt") != 0
    assert as_sandbox(f"ls {home}") != 0
    assert _digest(folder / "tree") == before
    assert (ws.worktree / "a.txt").read_text() == "a\n" and (ws.worktree / "keep.txt").exists()
    assert not (ws.worktree / "planted.txt").exists()


@pytest.mark.parametrize("failure", ["base lock held", "mount refused"])
def test_a_worktree_whose_base_or_mount_fails_is_a_full_checkout_saying_why(
    workdir, home, tricky_repo, monkeypatch, failure
):
    holder = None
    if failure == "base lock held":  # another process making a base takes too long
        script = _HOLD_BASES_LOCK.format(
            root=str(Path(__file__).resolve().parents[2]), home=str(home)
        )
        holder = subprocess.Popen(
            [sys.executable, "-c", script], stdin=subprocess.PIPE, stdout=subprocess.PIPE
        )
        assert holder.stdout.readline() == b"held\n"
        monkeypatch.setattr("bridge.workspace.bases.LOCK_WAIT_S", 0.3)
    else:  # the kernel refuses the worktree's mount
        fake_mount(monkeypatch, "/worktrees/")
    try:
        ws = TaskWorkspace.plan(home, tricky_repo, "one")
        base = Git(tricky_repo).resolve_commit("HEAD")
        made = create_workspace(home, ws, base, None, layered=True)
    finally:
        if holder is not None:
            holder.communicate(b"", timeout=60)
    assert made.kind == "full" and made.fallback
    assert ("lock on the base trees" if holder else "refused by the test") in made.fallback
    assert not overlay.mounted(ws.worktree) and ws.upper is None  # nothing left mounted
    assert (ws.worktree / "dir" / "sub" / "two.txt").read_text() == "2\n"
    assert os.readlink(ws.worktree / "link") == "a.txt"
    _tricky_edit(ws.worktree)  # and it is a worktree like any other
    snap = snapshot_worktree(ws, base, base, "m", LIMITS)
    assert "renamed/m.txt" in git(tricky_repo, "ls-tree", "-r", "--name-only", snap.commit)


def test_a_verification_whose_layered_checkout_is_refused_runs_on_a_full_one_and_says_so(
    docker_images, workdir, bridge, repo, monkeypatch
):
    from support.tasks import mock_task

    fake_mount(monkeypatch, "/mounts/")  # verification checkouts, not worktrees
    spec = mock_task(repo, {"write": {"a.txt": "a\n"}}, verify=["test -f a.txt"])
    result = bridge.run_task(bridge.create_task(spec).task_id)
    assert result.status == "succeeded"
    events = bridge.task_logs(result.task_id).events
    (ready,) = [e.data for e in events if e.kind == "workspace.ready"]
    assert ready["checkout"] == "layered" and "fallback" not in ready
    (checkout,) = [e.data for e in events if e.kind == "verification.checkout"]
    assert checkout["checkout"] == "full" and "refused by the test" in checkout["fallback"]
    assert [p for p in overlay.mount_points() if "/mounts/" in p and str(workdir) in p] == []


def test_a_task_in_a_state_root_reached_through_a_link_is_layered_and_pruned_unmounted(
    docker_images, workdir, repo
):
    from support.tasks import mock_task

    from bridge import WorkerBridge
    from bridge.pipeline.prune import prune

    real = workdir / "real-home"
    real.mkdir()
    link = workdir / "linked-home"
    link.symlink_to(real)
    bridge = WorkerBridge(home=link)
    try:
        spec = mock_task(repo, {"write": {"a.txt": "a\n"}}, verify=["test -f a.txt"])
        result = bridge.run_task(bridge.create_task(spec).task_id)
        assert result.status == "succeeded"
        events = bridge.task_logs(result.task_id).events
        kinds = {e.kind: e.data.get("checkout") for e in events if "checkout" in e.data}
        assert kinds == {"workspace.ready": "layered", "verification.checkout": "layered"}
        assert _mounts_at(real / "worktrees" / result.task_id) == 1
        bridge.reject_task(result.task_id)
        done = prune(bridge.context(), apply=True)
        assert [a for a in done["actions"] if a["failed"]] == []
    finally:
        bridge.close()
    assert [p for p in overlay.mount_points() if p.startswith(f"{real}/")] == []
    assert not (real / "worktrees" / result.task_id).exists()
    assert not (real / "layers" / result.task_id).exists()


def test_prune_of_a_layered_task_whose_repository_is_gone_unmounts_and_frees_its_base(
    docker_images, workdir, home
):
    """The repository of a finished layered task was deleted: prune must not remove through
    the merged view (its mount and upper dir would stay, naming the base as used for good)."""
    from support.tasks import mock_task

    from bridge import WorkerBridge
    from bridge.pipeline.prune import prune

    repo = workdir / "doomed"
    repo.mkdir()
    git(repo, "init", "-q", "-b", "main")
    (repo / "a.txt").write_text("a\n")
    commit_all(repo, "base")
    bridge = WorkerBridge(home=home)
    try:
        spec = mock_task(repo, {"write": {"b.txt": "b\n"}})
        result = bridge.run_task(bridge.create_task(spec).task_id)
        assert result.status == "succeeded"
        worktree = home / "worktrees" / result.task_id
        assert overlay.mounted(worktree)
        bridge.reject_task(result.task_id)
        shutil.rmtree(repo)
        done = prune(bridge.context(), apply=True)
        assert [a for a in done["actions"] if a["failed"]] == []
    finally:
        bridge.close()
    assert not overlay.mounted(worktree)
    assert not worktree.exists()
    assert not (home / "layers" / result.task_id).exists()
