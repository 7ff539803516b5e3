"""Confining a command the way a sandboxing caller would: Landlock (Linux 5.13+), through its
system calls, with no write anywhere but /dev/null. `confined(argv)` is an argv that runs
ARGV so confined, or None when the kernel has no Landlock."""

from __future__ import annotations

import ctypes
import sys

_CREATE_RULESET, _ADD_RULE, _RESTRICT_SELF = 444, 445, 446  # the same on every architecture
_VERSION = 1  # landlock_create_ruleset's flag: ask for the ABI version
_PR_SET_NO_NEW_PRIVS = 38
_WRITE_FILE = 1 << 1
# every right that writes: write a file, remove, make anything (ABI 1); truncate is ABI 3
_WRITES = _WRITE_FILE | sum(1 << bit for bit in range(4, 13))
_RULE_PATH_BENEATH = 1

# Run inside the new interpreter: restrict itself, then exec the command.
_DRIVER = f"""
import ctypes, os, sys
libc = ctypes.CDLL(None, use_errno=True)
libc.syscall.restype = ctypes.c_long
handled = ctypes.c_uint64({_WRITES})
ruleset = libc.syscall({_CREATE_RULESET}, ctypes.byref(handled), 8, 0)
assert ruleset >= 0, os.strerror(ctypes.get_errno())

class PathBeneath(ctypes.Structure):
    _pack_ = 1
    _fields_ = [("allowed_access", ctypes.c_uint64), ("parent_fd", ctypes.c_int32)]

null = os.open("/dev/null", os.O_PATH)
rule = PathBeneath({_WRITE_FILE}, null)
assert libc.syscall({_ADD_RULE}, ruleset, {_RULE_PATH_BENEATH}, ctypes.byref(rule), 0) == 0
assert libc.prctl({_PR_SET_NO_NEW_PRIVS}, 1, 0, 0, 0) == 0
assert libc.syscall({_RESTRICT_SELF}, ruleset, 0) == 0
os.execvp(sys.argv[1], sys.argv[1:])
"""


def landlock_available() -> bool:
    libc = ctypes.CDLL(None, use_errno=True)
    libc.syscall.restype = ctypes.c_long
    return libc.syscall(_CREATE_RULESET, None, 0, _VERSION) >= 1


def confined(argv: list[str]) -> list[str] | None:
    """ARGV run with no right to write any file but /dev/null, or None without Landlock."""
    if not landlock_available():
        return None
    return [sys.executable, "-c", _DRIVER, *argv]


__all__ = ["confined", "landlock_available"]
