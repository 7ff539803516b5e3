"""Sealed environment views (bridge/environments/sealed.py), as a hostile host process or a
careless one would meet them: the image is the files that passed the check, nothing writes
through its mount, any change to the image is seen at the next use by its identity alone, a
change to the entry's own files never reaches it, and prune undoes its mount before removing
it. Needs root, `mkfs.erofs` and the kernel's erofs (CI installs erofs-utils and requires it)."""

from __future__ import annotations

import errno
import json
import os
import subprocess
from pathlib import Path

import pytest

from bridge.environments import sealed
from bridge.environments.cache import (
    ENTRY_FILE,
    files_source,
    load_entry,
    seal_view,
    sealed_files,
    sealed_view,
    shared_view,
    view_folder,
)
from bridge.environments.digest import tree_digest
from bridge.host.mountinfo import mounts
from bridge.workspace import overlay
from bridge.workspace.bases import IDLE_S, remove_unused

if not sealed.sealing_available():
    if os.environ.get("WORKER_BRIDGE_REQUIRE_EROFS") == "1":
        raise RuntimeError("sealed views need root, mkfs.erofs (erofs-utils) and erofs")
    pytest.skip("needs root, mkfs.erofs and the kernel's erofs", allow_module_level=True)

OWNER = (1000, 1000)


@pytest.fixture
def home(tmp_path):
    path = tmp_path / "home"
    yield path
    overlay.unmount_under(tmp_path)


def _entry(home: Path, content: str = "cached\n"):
    folder = home / "environments" / "k"
    outputs = folder / "outputs"
    (outputs / "node_modules" / "pad").mkdir(parents=True)
    index = outputs / "node_modules" / "pad" / "index.js"
    index.write_text(content)
    index.chmod(0o444)
    (outputs / "node_modules" / ".bin").mkdir()
    (outputs / "node_modules" / ".bin" / "pad").symlink_to("../pad/index.js")
    record = {
        "key": "k",
        "image": "img",
        "image_id": "sha256:a",
        "digest": tree_digest(outputs)[0],
        "created_at": "2026-12-06T00:00:00Z",
        "nonce": os.urandom(8).hex(),
    }
    (folder / ENTRY_FILE).write_text(json.dumps(record))
    entry = load_entry(folder)
    assert entry is not None
    return entry


def _sealed(home: Path, entry=None):
    entry = entry or _entry(home)
    shared_view(home, entry.outputs, OWNER)  # made by the first task's worktree
    assert seal_view(home, entry, OWNER) is None  # after its check passed
    folder = sealed_view(home, entry, OWNER)  # what a later task is given
    assert folder == view_folder(home, entry.outputs, OWNER)
    return entry, sealed_files(home, folder)


def _tree(home: Path, entry) -> Path | None:
    folder = sealed_view(home, entry, OWNER)
    return None if folder is None else sealed_files(home, folder)


def test_a_sealed_view_is_its_image_mounted_read_only_and_nothing_writes_through_it(home):
    entry, tree = _sealed(home)
    folder = view_folder(home, entry.outputs, OWNER)
    assert [m.fstype for m in mounts() if m.point == overlay.real(tree)] == ["erofs"]
    index = tree / "node_modules" / "pad" / "index.js"
    assert index.read_text() == "cached\n"
    st = index.lstat()
    assert (st.st_uid, st.st_mode & 0o777) == (0, 0o444)  # the cache's, read-only
    assert (tree / "node_modules").lstat().st_uid == OWNER[0]  # folders the sandbox user's
    assert os.readlink(tree / "node_modules" / ".bin" / "pad") == "../pad/index.js"
    image = (folder / sealed.IMAGE).lstat()
    assert (image.st_uid, image.st_mode & 0o777) == (0, 0o400)
    # Not even root writes through it: the filesystem has no write path.
    for attempt in (
        lambda: index.open("w"),
        lambda: index.chmod(0o666),
        lambda: (tree / "node_modules" / "planted.js").write_text("x"),
        lambda: index.unlink(),
    ):
        with pytest.raises(OSError) as caught:
            attempt()
        assert caught.value.errno == errno.EROFS
    assert shared_view(home, entry.outputs, OWNER) == tree  # what layered checkouts get


def test_any_change_to_the_sealed_image_is_seen_at_the_next_use(home):
    entry, _ = _sealed(home)
    image = view_folder(home, entry.outputs, OWNER) / sealed.IMAGE
    before = image.lstat()
    data = bytearray(image.read_bytes())
    with image.open("r+b") as f:  # the same bytes again, its times put back: only ctime tells
        f.write(data)
    os.utime(image, ns=(before.st_atime_ns, before.st_mtime_ns))
    with pytest.raises(sealed.SealBroken, match="changed since it was made"):
        sealed_view(home, entry, OWNER)
    with pytest.raises(sealed.SealBroken):
        shared_view(home, entry.outputs, OWNER)
    image.unlink()
    with pytest.raises(sealed.SealBroken, match="gone"):
        sealed_view(home, entry, OWNER)


def test_the_entry_files_changed_after_sealing_never_reach_the_sealed_tree(home):
    entry, tree = _sealed(home)
    poisoned = entry.outputs / "node_modules" / "pad" / "index.js"
    poisoned.chmod(0o644)
    poisoned.write_text("POISON\n")  # the view's hard link shares this inode: hidden below
    (entry.outputs / "node_modules" / "added.js").write_text("POISON\n")
    again = _tree(home, entry)
    assert again == tree
    assert (tree / "node_modules" / "pad" / "index.js").read_text() == "cached\n"
    assert not (tree / "node_modules" / "added.js").exists()


def test_a_sealed_view_unmounted_or_covered_is_mounted_again_from_its_image(home):
    entry, tree = _sealed(home)
    overlay.unmount(tree)  # a reboot
    assert not overlay.mounted(tree)
    assert _tree(home, entry) == tree
    index = tree / "node_modules" / "pad" / "index.js"
    assert index.read_text() == "cached\n"
    # Something else mounted over it: replaced by the image again before any use.
    subprocess.run(["mount", "-t", "tmpfs", "tmpfs", str(tree)], check=True)
    assert not index.exists()
    assert _tree(home, entry) == tree
    assert index.read_text() == "cached\n"
    # An older mount moved over it (mountinfo lists it before the image's): taken off too.
    older = home.parent / "older"
    older.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "tmpfs", str(older)], check=True)
    (older / "node_modules").mkdir()
    (older / "node_modules" / "evil.js").write_text("EVIL\n")
    overlay.unmount(tree)
    subprocess.run(["mount", "-t", "tmpfs", "tmpfs", str(tree)], check=True)  # (a stack)
    assert _tree(home, entry) == tree
    subprocess.run(["mount", "--move", str(older), str(tree)], check=True)
    assert (tree / "node_modules" / "evil.js").exists()
    assert _tree(home, entry) == tree
    assert index.read_text() == "cached\n" and not (tree / "node_modules" / "evil.js").exists()


def test_prune_undoes_a_sealed_view_mount_before_removing_it(home):
    entry, tree = _sealed(home)
    folder = view_folder(home, entry.outputs, OWNER)
    old = os.path.getmtime(folder / "ready") - IDLE_S - 10
    os.utime(folder / "ready", (old, old))
    subprocess.run(["mount", "-t", "tmpfs", "tmpfs", str(tree)], check=True)  # stacked on it
    assert remove_unused(home, folder) == []
    assert not folder.exists() and not overlay.mounted(tree)
    assert not [m for m in mounts() if m.point.startswith(overlay.real(home))]
    assert entry.outputs.is_dir()  # the entry's own files stay


def test_a_task_given_a_sealed_view_never_reads_a_view_made_again_from_unchecked_files(home):
    """The view a sealed task was given, pruned (or its entry made again) while the task runs:
    its next read is refused, never answered by a view made anew from the entry's files, which
    were not checked for it."""
    entry, tree = _sealed(home)
    folder = sealed_view(home, entry, OWNER)
    old = os.path.getmtime(folder / "ready") - IDLE_S - 10
    os.utime(folder / "ready", (old, old))
    assert remove_unused(home, folder) == []
    poisoned = entry.outputs / "node_modules" / "pad" / "index.js"
    poisoned.chmod(0o644)
    poisoned.write_text("POISON\n")
    with pytest.raises(sealed.SealBroken, match="gone"):
        files_source(home, entry.outputs, folder)
    assert not folder.exists()


def test_a_view_that_cannot_be_sealed_is_marked_and_stays_as_it_was(home, monkeypatch):
    entry = _entry(home)
    view = shared_view(home, entry.outputs, OWNER)
    monkeypatch.setattr(sealed, "_MOUNT_OPTIONS", "ro,no-such-option")  # a refused mount
    why = seal_view(home, entry, OWNER)
    assert why and "mount failed" in why
    folder = view_folder(home, entry.outputs, OWNER)
    assert sorted(p.name for p in folder.iterdir()) == ["ready", "tree", sealed.UNSEALABLE]
    assert not overlay.mounted(view)
    assert sealed_view(home, entry, OWNER) is None  # checked whole, as before
    assert shared_view(home, entry.outputs, OWNER) == view
    assert (view / "node_modules" / "pad" / "index.js").read_text() == "cached\n"
    monkeypatch.undo()
    assert seal_view(home, entry, OWNER) is None  # never tried again for this view
    assert sealed_view(home, entry, OWNER) is None


def test_the_image_is_written_without_holding_the_bases_lock(home, monkeypatch):
    """mkfs.erofs takes 0.6 s at 50,000 files: no other task's pick of a base waits for it."""
    from bridge.workspace.locks import bases_lock

    entry = _entry(home)
    shared_view(home, entry.outputs, OWNER)
    build, taken = sealed._build, []

    def while_building(tree, image):
        with bases_lock(home, timeout=2):  # another process's pick, meanwhile
            taken.append(True)
        build(tree, image)

    monkeypatch.setattr(sealed, "_build", while_building)
    assert seal_view(home, entry, OWNER) is None
    assert taken == [True] and sealed_view(home, entry, OWNER) is not None


def test_what_a_setup_leaves_is_sealed_exactly_and_no_link_is_followed(home):
    """A setup runs the dependencies' own scripts: names that are not UTF-8 or hold a newline,
    a link to the host's /etc, an empty folder, a large file. The image holds each as it was
    (the link a link, never what it names) and is checked like any other."""
    entry = _entry(home)
    modules = os.fsencode(entry.outputs / "node_modules")
    odd = os.path.join(modules, b"caf\xe9\nname.js")
    with open(odd, "wb") as f:
        f.write(b"odd\n")
    os.chmod(odd, 0o444)
    os.symlink(b"/etc/passwd", os.path.join(modules, b"passwd"))
    os.mkdir(os.path.join(modules, b"empty"))
    big = entry.outputs / "node_modules" / "big.bin"
    big.write_bytes(os.urandom(1 << 20) * 8)
    big.chmod(0o444)
    _, tree = _sealed(home, entry)
    seen = os.fsencode(tree / "node_modules")
    with open(os.path.join(seen, b"caf\xe9\nname.js"), "rb") as f:
        assert f.read() == b"odd\n"
    assert os.readlink(os.path.join(seen, b"passwd")) == b"/etc/passwd"
    assert os.path.islink(os.path.join(seen, b"passwd"))
    assert os.listdir(os.path.join(seen, b"empty")) == []
    assert (tree / "node_modules" / "big.bin").read_bytes() == big.read_bytes()
