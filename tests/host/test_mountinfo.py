"""The one reader of the mount table (bridge/host/mountinfo.py): fields as the kernel writes them,
escapes undone only in the kernel's own form."""

from __future__ import annotations

from bridge.host.mountinfo import mounts, parse, unescape

TABLE = (
    "22 1 0:21 / / rw,relatime shared:1 - ext4 /dev/vda rw\n"
    "58 30 7:0 / /st\\040ate/view\\134tree ro,relatime - erofs /dev/loop0 ro,user_xattr\n"
    "61 58 0:48 / /mnt/merged rw master:3 unbindable - overlay overlay "
    "rw,lowerdir=/a\\072b:/c,upperdir=/u\n"
    "a line the kernel never writes\n"
)


def test_each_mount_is_read_with_its_device_point_propagation_type_source_and_options():
    root, view, merged = parse(TABLE)
    assert (root.dev, root.point, root.fstype) == ("0:21", "/", "ext4")
    assert root.propagation == ("shared:1",)
    assert view.point == "/st ate/view\\tree" and view.propagation == ()
    assert (view.fstype, view.source, view.dev) == ("erofs", "/dev/loop0", "7:0")
    assert merged.propagation == ("master:3", "unbindable")
    assert merged.options == "rw,lowerdir=/a\\072b:/c,upperdir=/u"  # escaped, as given


def test_only_a_backslash_and_three_octal_digits_is_an_escape():
    assert unescape("a\\040b\\011c\\012d\\134e") == "a b\tc\nd\\e"
    assert unescape("\\9999") == "\\9999"  # not octal
    assert unescape("\\04") == "\\04"  # too short
    assert unescape("end\\") == "end\\"


def test_this_process_mount_table_has_its_root():
    assert any(m.point == "/" for m in mounts())


def test_a_mount_point_is_told_without_the_table_as_the_table_tells_it(tmp_path, monkeypatch):
    """`is_mount_point` asks the kernel about one path (statx's mount-root attribute) where
    the table costs a read of every mount: it must agree with the table for every mount point
    this namespace lists (those reachable at their path), for a folder that is none, for a
    bind of a folder on the same filesystem (same device as its parent) and once it is gone;
    the table is out of its reach here, so the kernel's answer is the one tested."""
    import os
    import subprocess

    import pytest

    from bridge.host import mountinfo

    listed = mountinfo.mount_points()

    def no_table(*_args, **_kwargs):  # noqa: ANN002, ANN003, ANN202
        raise AssertionError("is_mount_point read the mount table")

    monkeypatch.setattr(mountinfo, "mount_points", no_table)
    for point in listed:
        if os.path.isdir(point) and not os.path.islink(point):
            assert mountinfo.is_mount_point(point), point
    assert not mountinfo.is_mount_point(str(tmp_path))
    assert not mountinfo.is_mount_point(str(tmp_path / "missing"))
    if os.geteuid() != 0:
        pytest.skip("binding a folder needs root")
    target = tmp_path / "bound"
    target.mkdir()
    subprocess.run(["mount", "--bind", str(target), str(target)], check=True)
    try:
        assert os.stat(target).st_dev == os.stat(tmp_path).st_dev  # st_dev cannot tell
        assert mountinfo.is_mount_point(str(target))
    finally:
        subprocess.run(["umount", str(target)], check=True)
    assert not mountinfo.is_mount_point(str(target))
