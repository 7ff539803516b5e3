"""Other local users, the way an attacker on the same host is one: a throwaway account made with
`useradd` (in no group but its own, so not in the docker group) and removed afterwards, and
code run as any uid in a forked child (`os.setresuid`, no supplementary groups), its answer
sent back through a pipe."""

from __future__ import annotations

import json
import os
import pwd
import secrets
import subprocess
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any


@contextmanager
def local_user() -> Iterator[pwd.struct_passwd]:
    """A new account with no home and no login shell, in no group but its own; removed (with
    its group) on the way out."""
    name = f"wbt{secrets.token_hex(4)}"
    subprocess.run(
        ["useradd", "--no-create-home", "--user-group", "--shell", "/usr/sbin/nologin", name],
        check=True,
        capture_output=True,
    )
    try:
        yield pwd.getpwnam(name)
    finally:
        subprocess.run(["userdel", name], check=False, capture_output=True)


def run_as(uid: int, gid: int, work: Callable[[], Any]) -> Any:
    """``work()`` in a forked child running as ``uid``:``gid`` with no other group (real,
    effective and saved ids alike); what it returned (JSON-able), or the repr of what it
    raised as {"raised": ...}. ``work`` must not block for good (open FIFOs non-blocking)."""
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: never returns into the test runner
        os.close(read)
        try:
            os.setgroups([])
            os.setresgid(gid, gid, gid)
            os.setresuid(uid, uid, uid)
            answer: Any = {"value": work()}
        except BaseException as exc:  # noqa: BLE001 - reported to the parent
            answer = {"raised": f"{type(exc).__name__}: {exc}"}
        try:
            os.write(write, json.dumps(answer, default=repr).encode())
        finally:
            os._exit(0)
    os.close(write)
    chunks = []
    with os.fdopen(read, "rb") as pipe:
        chunks.append(pipe.read())
    os.waitpid(pid, 0)
    answer = json.loads(b"".join(chunks) or b'{"raised": "no answer"}')
    return answer.get("value", answer)


def tries(action: Callable[[], Any]) -> Callable[[], Any]:
    """``action`` as an attempt: its value, or the name of the error it raised (`EACCES`...)."""

    def attempt() -> Any:
        try:
            return action()
        except OSError as exc:
            import errno

            return errno.errorcode.get(exc.errno or 0, str(exc))

    return attempt
