"""The state root is the bridge's user's alone (issue 43, item 1; bridge/host/state_root.py):
made 0700 with the folders under it, an open one repaired with one warning, whichever entry
point touches it first (the CLI, the library, a detached runner's context), and doctor says
when it is open or when the sandbox uid is a host account's. No engine: the fake sandbox."""

from __future__ import annotations

import json
import os
import pwd
import stat
from pathlib import Path

import pytest
from support.users import run_as

from bridge.host.state_root import LAYOUT

OPEN = "open to other local users"


def _mode(path: Path) -> int:
    return stat.S_IMODE(os.lstat(path).st_mode)


def _private(home: Path) -> list[str]:
    """What under ``home`` another local user could enter: the state root and its folders."""
    found = [str(home)] if _mode(home) & 0o077 else []
    found += [name for name in LAYOUT if (home / name).is_dir() and _mode(home / name) & 0o077]
    return found


def test_a_new_state_root_is_made_with_its_folders_for_the_bridge_user_alone(workdir, cli):
    home = workdir / "home"
    home.rmdir()  # the bridge makes it, as on a first run
    listed = cli("tasks", "list", "--json")
    assert listed.code == 0, listed.stderr
    assert _mode(home) == 0o700 and home.stat().st_uid == os.geteuid()
    assert all(_mode(home / name) == 0o700 for name in LAYOUT)
    assert _mode(home / "bridge.db") == 0o600 and OPEN not in listed.stderr


def test_a_state_root_others_can_enter_is_made_private_with_one_warning(home, cli):
    home.chmod(0o755)  # as an older version, a volume or `mkdir` left it
    (home / "worktrees").mkdir(mode=0o755)
    (home / "worktrees").chmod(0o755)
    (home / "tasks").mkdir()
    (home / "tasks").chmod(0o751)
    first = cli("tasks", "list")
    assert first.code == 0, first.stderr
    assert OPEN in first.stderr
    assert "0755" in first.stderr and "worktrees/ was 0755" in first.stderr
    assert "tasks/ was 0751" in first.stderr
    assert _private(home) == []
    again = cli("tasks", "list")
    assert again.code == 0 and OPEN not in again.stderr  # said once: it is private now


def test_the_library_and_a_runner_s_context_make_it_private_before_they_use_it(home):
    from bridge import WorkerBridge
    from bridge.config.settings import load_config
    from bridge.phase.context import Context
    from bridge.sandbox.fake import FakeSandbox
    from bridge.store import Store

    home.chmod(0o755)
    bridge = WorkerBridge(home=home, sandbox=FakeSandbox())
    try:
        bridge.list_tasks()
    finally:
        bridge.close()
    assert _private(home) == []
    # A detached runner builds its context from the configuration recorded with its task.
    other = home.parent / "runner-home"
    other.mkdir(mode=0o755)
    other.chmod(0o755)
    store = Store(other / "bridge.db")
    try:
        Context(load_config(home=other), store, FakeSandbox())
    finally:
        store.close()
    assert _private(other) == []


def test_a_state_root_this_user_cannot_close_is_refused_in_one_sentence(workdir):
    """A bridge run by one user on another user's open folder: refused, naming the fix."""
    owner, runner = pwd.getpwnam("nobody"), pwd.getpwnam("daemon")
    home = workdir / "theirs"
    home.mkdir()
    home.chmod(0o777)
    os.chown(home, owner.pw_uid, owner.pw_gid)

    def use() -> str:
        from bridge import WorkerBridge
        from bridge.errors import BridgeError

        try:
            WorkerBridge(home=home).list_tasks()
        except BridgeError as exc:
            return exc.message
        return "used"

    said = run_as(runner.pw_uid, runner.pw_gid, use)
    assert f"belongs to uid {owner.pw_uid}" in said and "open to other local users" in said, said
    assert said.count(". ") == 0 and said.endswith(".")
    assert _mode(home) == 0o777


def test_a_state_root_another_user_owns_is_refused_even_when_closed(workdir):
    """The review's way: a folder another user made beforehand (mode 0700: root can enter it
    all the same) stays theirs to open again and to fill with links a root bridge follows."""
    from bridge import WorkerBridge
    from bridge.errors import ConfigError

    owner = pwd.getpwnam("nobody")
    home = workdir / "planted"
    home.mkdir(mode=0o700)
    os.chown(home, owner.pw_uid, owner.pw_gid)
    if os.geteuid() == owner.pw_uid:
        pytest.skip("run as the folder's owner")
    with pytest.raises(ConfigError, match=f"belongs to uid {owner.pw_uid}, not to this user"):
        WorkerBridge(home=home).list_tasks()
    assert not (home / "bridge.db").exists() and list(home.iterdir()) == []


@pytest.mark.skipif(os.geteuid() != 0, reason="a root bridge's sandbox uid")
def test_doctor_says_when_the_state_root_is_open_and_when_the_sandbox_uid_is_an_account(home, cli):
    home.chmod(0o755)
    account = pwd.getpwnam("nobody")
    env = {"WORKER_BRIDGE_SANDBOX_UID": str(account.pw_uid)}
    found = cli("doctor", "--json", env=env)
    checks = {c["check"]: c for c in json.loads(found.stdout)["checks"]}
    assert checks["state_root"]["severity"] == "warning"
    assert f"{home} is 0755" in checks["state_root"]["detail"]
    assert _mode(home) == 0o755  # doctor writes nothing
    assert checks["sandbox_uid"]["severity"] == "warning"
    assert "nobody" in checks["sandbox_uid"]["detail"]
    home.chmod(0o700)
    unused = next(u for u in range(20001, 30000) if not _account(u))
    found = cli("doctor", "--json", env={"WORKER_BRIDGE_SANDBOX_UID": str(unused)})
    checks = {c["check"]: c for c in json.loads(found.stdout)["checks"]}
    assert checks["state_root"]["ok"] and checks["sandbox_uid"]["ok"]


def _account(uid: int) -> bool:
    try:
        pwd.getpwuid(uid)
    except KeyError:
        return False
    return True


def test_the_mcp_server_makes_it_private_before_it_writes_its_log_there(workdir):
    """The MCP server writes its log under the state root before any tool runs: a state root
    it makes is private from the start, with no warning about an open one."""
    import subprocess
    import sys

    home = workdir / "new-home"
    env = {**os.environ, "WORKER_BRIDGE_HOME": str(home)}
    served = subprocess.run(
        [sys.executable, "-m", "bridge.mcp.server"],
        stdin=subprocess.DEVNULL,  # the stdio session ends at once
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
    )
    assert (home / "logs" / "mcp-server.log").exists(), served.stderr
    assert _private(home) == [] and OPEN not in served.stderr


def test_a_sandbox_uid_inside_someones_subordinate_range_is_named(tmp_path):
    # The review's way past the passwd check: a user of rootless containers becomes any uid of
    # the range /etc/subuid gives them, 10001 among them.
    from bridge.service.doctor import subordinate_holder

    subuid, subgid = tmp_path / "subuid", tmp_path / "subgid"
    subuid.write_text("alice:100000:65536\nbob:5000:10000\n")
    subgid.write_text("carol:20000:1\n")
    files = (str(subuid), str(subgid))
    assert "'bob'" in (subordinate_holder(10001, files) or "")
    assert "'carol'" in (subordinate_holder(20000, files) or "")
    assert subordinate_holder(15000, files) is None and subordinate_holder(99999, files) is None
    assert subordinate_holder(10001, (str(tmp_path / "missing"),)) is None
