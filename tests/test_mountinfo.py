"""The one reader of the mount table (bridge/mountinfo.py): fields as the kernel writes them,
escapes undone only in the kernel's own form."""

from __future__ import annotations

from bridge.mountinfo import mounts, parse, unescape

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
