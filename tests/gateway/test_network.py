"""The gateway through the real engine: a mock worker in its sandbox (no interface but `lo`, no
credential) reaches a test upstream on the host's loopback only through its routes and the
allowlist proxy, with the real key added on the host and nowhere in the container."""

from __future__ import annotations

import hashlib
import json
import os
import signal
import textwrap
from pathlib import Path

import pytest
from support.repos import git
from support.tasks import (
    mock_task,
    run_spec,
    start_spec,
    task_events,
    wait_for_event,
    wait_until_done,
)
from support.waiting import poll

pytestmark = pytest.mark.usefixtures("docker_images")

KEY = "sk-test-" + os.urandom(12).hex()
MARKER = KEY[8:20]  # a slice to search for inside the sandbox (the whole key is never given)


@pytest.fixture
def env(home, upstream):
    """config.yaml with a `test` route to the upstream; the key in the CLI's environment."""
    (home / "config.yaml").write_text(
        "allow_mock_routes: true\n"
        "gateway:\n"
        "  routes:\n"
        "    test:\n"
        f"      upstream: {upstream.url}\n"
        "      auth: x-api-key\n"
        "      key_env: WB_TEST_ROUTE_KEY\n"
        "  trusted_ranges: ['127.0.0.0/8']\n"
        f"  connect_ports: [{upstream.port}]\n"
        f"  http_ports: [{upstream.port}]\n"
    )
    return {"WB_TEST_ROUTE_KEY": KEY}


def py(code: str) -> str:
    """A mock script that runs ``code`` with the sandbox's python3."""
    return "python3 - <<'PYEOF'\n" + textwrap.dedent(code) + "\nPYEOF"


CALL_ROUTE = f"""
import json, os, socket, urllib.request
out = {{}}
req = urllib.request.Request(os.environ["WB_ROUTE_TEST"] + "/v1/messages",
    data=b'{{"model": "mock-model"}}', method="POST",
    headers={{"x-api-key": "placeholder", "content-type": "application/json"}})
out["answer"] = json.loads(urllib.request.urlopen(req, timeout=20).read())
out["env"] = dict(os.environ)
environs = []
for pid in os.listdir("/proc"):
    if pid.isdigit():
        try:
            environs.append(open(f"/proc/{{pid}}/environ", "rb").read().decode(errors="replace"))
        except OSError:
            pass
out["proc_environ"] = environs
mark = ("{MARKER[:6]}" + "{MARKER[6:]}").encode()  # whole only at run time, not in the script
found = []
for top in ("/etc", "/home", "/tmp", "/run", "/bridge", "/var/lib/worker-bridge", "/workspace"):
    for dirpath, _, names in os.walk(top):
        for name in names:
            path = os.path.join(dirpath, name)
            try:
                if mark in open(path, "rb").read(1 << 20):
                    found.append(path)
            except OSError:
                pass
out["files_with_key"] = found
out["interfaces"] = [l.split(":")[0].strip() for l in open("/proc/net/dev").read().splitlines()[2:]]
direct = {{}}
for host, port in (("1.1.1.1", 443), ("172.17.0.1", 80), ("127.0.0.1", 22)):
    s = socket.socket()
    s.settimeout(3)
    try:
        s.connect((host, port))
        direct[host] = "connected"
    except OSError as exc:
        direct[host] = exc.__class__.__name__
    s.close()
out["direct"] = direct
json.dump(out, open("probe.json", "w"), indent=1)
"""


def test_a_route_reaches_the_upstream_with_the_real_key_which_is_nowhere_inside(
    cli, repo, workdir, env, upstream
):
    spec = mock_task(repo, {"routes": ["test"], "script": py(CALL_ROUTE)})
    result = run_spec(cli, workdir, spec, env)
    assert result["status"] == "succeeded", result["error"]
    probe = json.loads(git(repo, "show", f"{result['branch']}:probe.json"))
    assert probe["answer"]["path"] == "/v1/messages"
    assert probe["answer"]["x_api_key_sha256"] == hashlib.sha256(KEY.encode()).hexdigest()
    assert upstream.requests[-1].headers["x-api-key"] == KEY
    assert KEY not in json.dumps(probe["env"]) and KEY not in json.dumps(probe["proc_environ"])
    assert probe["files_with_key"] == []
    assert probe["interfaces"] == ["lo"]
    assert all(v != "connected" for v in probe["direct"].values()), probe["direct"]
    text = cli("tasks", "show", result["task_id"], "--json", env=env).stdout
    text += json.dumps(task_events(cli, result["task_id"], env))
    text += Path(result["artifacts"]["diff"]).read_text(errors="replace")
    assert KEY not in text  # nor in the store, the events or the artifacts
    requests = [
        e["data"]
        for e in task_events(cli, result["task_id"], env)
        if e["kind"] == "network.request"
    ]
    assert (
        requests and requests[0]["route"] == "test" and requests[0]["model"] == "served-mock-model"
    )
    assert result["usage"]["requests"] >= 1
    assert result["usage"]["tokens"] == {"served-mock-model": {"input": 11, "output": 7}}


def test_a_worker_that_names_no_route_has_no_gateway_at_all(cli, repo, workdir, env):
    script = py(
        """
        import os, socket
        s = socket.socket()
        try:
            s.connect(("127.0.0.1", 7800)); state = "connected"
        except OSError as exc:
            state = exc.__class__.__name__
        open("probe.txt", "w").write(f"{os.path.exists('/run/worker-bridge')} {state}")
        """
    )
    result = run_spec(cli, workdir, mock_task(repo, {"script": script}), env)
    assert result["status"] == "succeeded", result["error"]
    assert git(repo, "show", f"{result['branch']}:probe.txt") == "False ConnectionRefusedError"


LISTENER = """
import json, os, socket, time
s = socket.socket()
s.bind(("127.0.0.1", 4711))
s.listen()
own = socket.create_connection(("127.0.0.1", 4711), timeout=5)  # its own loopback works
open("ns-a.txt", "w").write(os.readlink("/proc/self/ns/net"))
open("listening", "w").write("yes")
s.settimeout(0.2)
accepted, deadline = 0, time.monotonic() + 60
while not os.path.exists("stop") and time.monotonic() < deadline:
    try:
        s.accept()
        accepted += 1
    except socket.timeout:
        pass
open("a.json", "w").write(json.dumps({"accepted": accepted}))
"""

CALLER = """
import json, os, socket
try:
    socket.create_connection(("127.0.0.1", 4711), timeout=3)
    state = "connected"
except OSError as exc:
    state = exc.__class__.__name__
open("b.json", "w").write(json.dumps({"state": state, "ns": os.readlink("/proc/self/ns/net")}))
"""


def test_each_container_has_a_loopback_of_its_own_that_no_other_task_reaches(cli, repo, workdir):
    """Containers are made with the engine's networking disabled (no libnetwork sandbox, see
    bridge/sandbox/docker.py): each still gets a network namespace of its own, with `lo` up,
    and a worker listening on its loopback is out of reach of another task's container running
    at the same time, and of the host's."""
    first = start_spec(cli, workdir, mock_task(repo, {"script": py(LISTENER)}))
    worktree = Path(wait_for_event(cli, first, "workspace.ready")["data"]["worktree"])
    poll(lambda: (worktree / "listening").exists(), "the first worker to listen")
    second = run_spec(cli, workdir, mock_task(repo, {"script": py(CALLER)}))
    (worktree / "stop").write_text("")
    done = wait_until_done(cli, first)
    assert done["status"] == second["status"] == "succeeded", (done["error"], second["error"])
    caller = json.loads(git(repo, "show", f"{second['branch']}:b.json"))
    listener = json.loads(git(repo, "show", f"{done['branch']}:a.json"))
    namespace = git(repo, "show", f"{done['branch']}:ns-a.txt")
    assert caller["state"] == "ConnectionRefusedError"  # its own loopback, where no one listens
    assert listener["accepted"] == 1  # its own connection, and nothing of the other task's
    host = os.readlink("/proc/self/ns/net")
    assert namespace.startswith("net:[") and len({namespace, caller["ns"], host}) == 3


ABSTRACT = """
import json, socket, sys
name = sys.argv[1]
try:
    socket.socket(socket.AF_UNIX).connect("\\0" + name)
    state = "connected"
except OSError as exc:
    state = exc.__class__.__name__
listed = name in open("/proc/net/unix").read()
print(json.dumps({"state": state, "listed": listed}))
"""


def test_the_hosts_abstract_sockets_are_out_of_reach_of_the_worker_and_the_checks(
    cli, repo, workdir
):
    """An abstract Unix socket belongs to a network namespace, not to a file: a container
    sharing the host's (or the engine's) could reach the host's listeners by name, as the
    containerd-shim escape did. With the engine's networking disabled, neither the worker nor
    a verification command can connect to one the host listens on, nor see it listed."""
    import socket
    import threading

    name = f"wb-host-{os.urandom(6).hex()}"
    listener = socket.socket(socket.AF_UNIX)
    listener.bind("\0" + name)
    listener.listen()
    listener.settimeout(0.5)
    accepted: list[object] = []
    done = threading.Event()

    def accept() -> None:
        while not done.is_set():
            try:
                accepted.append(listener.accept())
            except OSError:
                pass

    thread = threading.Thread(target=accept, daemon=True)
    thread.start()
    probe = f"python3 - {name} %s<<'PYEOF'\n{ABSTRACT}\nPYEOF"
    try:
        spec = mock_task(repo, {"script": probe % "> worker.json "}, verify=[probe % ""])
        result = run_spec(cli, workdir, spec)
    finally:
        done.set()
        thread.join(5)
        listener.close()
    assert result["status"] == "succeeded", result["error"]
    worker = json.loads(git(repo, "show", f"{result['branch']}:worker.json"))
    checks = json.loads(result["verification"]["commands"][0]["stdout_tail"])
    for seen in (worker, checks):
        assert seen == {"state": "ConnectionRefusedError", "listed": False}, seen
    assert accepted == []


def test_the_allowlist_tunnels_listed_names_and_refuses_the_rest(cli, repo, workdir, env, upstream):
    port = upstream.port
    script = py(
        f"""
        import socket
        def tunnel(host, port, request=b""):
            s = socket.create_connection(("127.0.0.1", 7801), timeout=20)
            line = f"CONNECT {{host}}:{{port}} HTTP/1.1\\r\\nHost: {{host}}\\r\\n\\r\\n"
            s.sendall(line.encode())
            head = b""
            while b"\\r\\n\\r\\n" not in head:
                head += s.recv(65536)
            if b" 200 " not in head.split(b"\\r\\n")[0]:
                top, _, body = head.partition(b"\\r\\n\\r\\n")
                length = int(top.lower().split(b"content-length: ")[1].split(b"\\r")[0])
                while len(body) < length:
                    body += s.recv(65536)
                return (top + b"\\r\\n\\r\\n" + body).decode(errors="replace")
            s.sendall(request)
            data = b""
            while chunk := s.recv(65536):
                data += chunk
            return data.decode(errors="replace")
        get = b"GET /tunneled HTTP/1.1\\r\\nHost: localhost\\r\\nConnection: close\\r\\n\\r\\n"
        results = [tunnel("localhost", {port}, get), tunnel("example.com", {port})]
        open("probe.txt", "w").write("\\n=====\\n".join(results))
        """
    )
    spec = mock_task(
        repo, {"script": script}, network={"mode": "allowlist", "domains": ["localhost"]}
    )
    result = run_spec(cli, workdir, spec, env)
    assert result["status"] == "succeeded", result["error"]
    tunneled, unlisted = git(repo, "show", f"{result['branch']}:probe.txt").split("\n=====\n")
    assert '"path": "/tunneled"' in tunneled
    assert "403" in unlisted and "not in this task's network.domains" in unlisted
    log = task_events(cli, result["task_id"], env)
    refused = [e["data"] for e in log if e["kind"] == "network.refused"]
    assert [r["host"] for r in refused] == ["example.com"]


def test_a_listed_name_on_a_loopback_address_is_refused_unless_trusted(
    cli, repo, workdir, env, home, upstream
):
    config = (home / "config.yaml").read_text().replace("  trusted_ranges: ['127.0.0.0/8']\n", "")
    (home / "config.yaml").write_text(config)
    connect = f"CONNECT localhost:{upstream.port} HTTP/1.1\\r\\nHost: localhost\\r\\n\\r\\n"
    script = py(
        f"""
        import socket
        s = socket.create_connection(("127.0.0.1", 7801), timeout=20)
        s.sendall(b"{connect}")
        data = b""
        while b"loopback" not in data and len(data) < 65536:
            chunk = s.recv(65536)
            if not chunk:
                break
            data += chunk
        open("probe.txt", "wb").write(data)
        """
    )
    spec = mock_task(
        repo, {"script": script}, network={"mode": "allowlist", "domains": ["localhost"]}
    )
    result = run_spec(cli, workdir, spec, env)
    answer = git(repo, "show", f"{result['branch']}:probe.txt")
    assert "403" in answer and "loopback" in answer
    refused = [
        e["data"]
        for e in task_events(cli, result["task_id"], env)
        if e["kind"] == "network.refused"
    ]
    assert "loopback" in refused[0]["reason"]


def test_a_streamed_answer_arrives_chunk_by_chunk_inside_the_sandbox(
    cli, repo, workdir, env, home, upstream
):
    script = py(
        """
        import os, urllib.request, time
        r = urllib.request.urlopen(os.environ["WB_ROUTE_TEST"] + "/v1/held", timeout=60)
        first = r.readline()
        open("first.txt", "w").write(first.decode())
        rest = r.read()
        open("rest.txt", "w").write(rest.decode())
        """
    )
    task_id = start_spec(cli, workdir, mock_task(repo, {"routes": ["test"], "script": script}), env)
    worktree = home / "worktrees" / task_id
    poll(lambda: (worktree / "first.txt").exists(), "the first chunk inside the sandbox", 60)
    assert not (worktree / "rest.txt").exists()  # the upstream has not sent the rest yet
    upstream.release.set()
    result = wait_until_done(cli, task_id, env)
    assert result["status"] == "succeeded", result["error"]
    assert "data: last" in git(repo, "show", f"{result['branch']}:rest.txt")


def test_a_runner_killed_mid_stream_comes_back_and_the_next_request_works(
    cli, repo, workdir, env, home, upstream
):
    script = py(
        """
        import os, time, urllib.request
        base = os.environ["WB_ROUTE_TEST"]
        try:
            r = urllib.request.urlopen(base + "/v1/held", timeout=120)
            r.readline()
            open("streaming.txt", "w").write("yes")
            r.read()
        except Exception as exc:
            open("broken.txt", "w").write(repr(exc))
        for _ in range(240):
            try:
                answer = urllib.request.urlopen(base + "/v1/after", timeout=5).read()
                open("after.txt", "wb").write(answer)
                break
            except Exception:
                time.sleep(0.5)
        """
    )
    task_id = start_spec(cli, workdir, mock_task(repo, {"routes": ["test"], "script": script}), env)
    worktree = home / "worktrees" / task_id
    poll(lambda: (worktree / "streaming.txt").exists(), "the stream to be under way", 60)
    import sqlite3

    conn = sqlite3.connect(str(home / "bridge.db"))
    pid = conn.execute("SELECT runner_pid FROM tasks WHERE task_id = ?", (task_id,)).fetchone()[0]
    conn.close()
    os.killpg(pid, signal.SIGKILL)
    poll(lambda: (worktree / "broken.txt").exists(), "the stream to break with its runner", 30)
    assert cli("tasks", "recover", env=env).code == 0  # the gateway comes back with a runner
    result = wait_until_done(cli, task_id, env, deadline_s=120)
    assert result["status"] == "succeeded", result["error"]
    assert '"path": "/v1/after"' in git(repo, "show", f"{result['branch']}:after.txt")
    assert not list((home / "gateways" / task_id).glob("*.sock"))


@pytest.mark.parametrize("end", ["cancel", "timeout"])
def test_cancel_and_timeout_leave_no_gateway_socket(cli, repo, workdir, env, home, end):
    script = "sleep 60"
    spec = mock_task(repo, {"routes": ["test"], "script": script})
    if end == "timeout":
        result = run_spec(cli, workdir, spec, env, "--timeout", "3")
        assert result["status"] == "timed_out"
        task_id = result["task_id"]
    else:
        task_id = start_spec(cli, workdir, spec, env)
        poll(lambda: list((home / "gateways" / task_id).glob("*.sock")), "the gateway", 60)
        assert cli("tasks", "cancel", task_id, env=env).code == 0
    poll(
        lambda: not list((home / "gateways" / task_id).glob("*.sock")),
        "the gateway's sockets to go",
        60,
    )
