"""The bundle every worker image carries at /opt/worker-bridge runs in an image worker-bridge did
not build: extracted from the worker's image (get_archive, as the pipeline does), mounted
read-only at the same path in a container of the plain Debian base image (no socat, no python,
none of socat's libraries), `PATH=/opt/worker-bridge/bin:<image PATH>`, no network, a read-only
root, an unprivileged user. The relay carries bytes both ways to the gateway's sockets; each
worker CLI whose image is present prints its version."""

from __future__ import annotations

import io
import shutil
import socketserver
import tarfile
import threading
from pathlib import Path

import pytest
from support.engine import BASE_IMAGE

BUNDLE = "/opt/worker-bridge"
LABELS = {"io.worker-bridge.test": "bundles"}
DEFAULT_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
# (image, command, what its output starts with: None for the image's pinned CLI version)
CLIS = [
    ("claude-code", ["claude", "--version"], None),
    ("codex", ["codex", "--version"], None),
    ("opencode", ["opencode", "--version"], None),
    ("opencode", ["rg", "--version"], "ripgrep "),
]


class _Chunks(io.RawIOBase):
    """The chunks get_archive yields, as a file for tarfile's stream mode."""

    def __init__(self, chunks):
        self._chunks = iter(chunks)
        self._left = b""

    def readable(self):
        return True

    def readinto(self, buf):
        while not self._left:
            try:
                self._left = next(self._chunks)
            except StopIteration:
                return 0
        n = min(len(buf), len(self._left))
        buf[:n], self._left = self._left[:n], self._left[n:]
        return n


@pytest.fixture(scope="module")
def client():
    import docker

    engine = docker.from_env(timeout=300)
    yield engine
    engine.close()


@pytest.fixture(scope="module")
def bundles(client, tmp_path_factory):
    """extract(image) -> the host folder holding that image's /opt/worker-bridge (once each)."""
    root = tmp_path_factory.mktemp("bundles")
    done: dict[str, Path] = {}

    def extract(image: str) -> Path:
        if image not in done:
            dest = root / str(len(done))
            dest.mkdir()
            container = client.containers.create(image, ["true"], labels=LABELS)
            try:
                chunks, _ = container.get_archive(BUNDLE)
                stream = io.BufferedReader(_Chunks(chunks), buffer_size=1 << 20)
                with tarfile.open(fileobj=stream, mode="r|") as tar:
                    tar.extractall(dest, filter="tar")
            finally:
                client.api.remove_container(container.id, force=True)
            done[image] = dest / "worker-bridge"
        return done[image]

    yield extract
    shutil.rmtree(root, ignore_errors=True)


def run_plain(
    client,
    bundle: Path,
    command: list[str],
    binds: dict[str, str] | None = None,
    env: dict[str, str] | None = None,
):
    """Run command in the plain base image with the bundle mounted; (exit code, stdout, stderr)."""
    image_env = client.images.get(BASE_IMAGE).attrs["Config"].get("Env") or []
    image_path = next((e[5:] for e in image_env if e.startswith("PATH=")), DEFAULT_PATH)
    volumes = {str(bundle): {"bind": BUNDLE, "mode": "ro"}}
    volumes.update({src: {"bind": dst, "mode": "ro"} for src, dst in (binds or {}).items()})
    container = client.containers.create(
        BASE_IMAGE,
        command,
        labels=LABELS,
        network_mode="none",
        read_only=True,
        tmpfs={"/tmp": ""},
        user="10001:10001",
        environment={"PATH": f"{BUNDLE}/bin:{image_path}", "HOME": "/tmp/h", **(env or {})},
        volumes=volumes,
    )
    try:
        container.start()
        code = container.wait(timeout=120)["StatusCode"]
        out = container.logs(stdout=True, stderr=False).decode(errors="replace")
        err = container.logs(stdout=False, stderr=True).decode(errors="replace")
        return code, out, err
    finally:
        client.api.remove_container(container.id, force=True)


class _Echo(socketserver.StreamRequestHandler):
    def handle(self):
        line = self.rfile.readline().decode().strip()
        self.wfile.write(f"{self.server.name} got: {line}\n".encode())


@pytest.fixture
def gateway_sockets(workdir: Path):
    """A folder with routes.sock and proxy.sock, each answering a line with what it got."""
    folder = workdir / "gateway"
    folder.mkdir()
    servers = []
    for name in ("routes", "proxy"):
        path = folder / f"{name}.sock"
        server = socketserver.ThreadingUnixStreamServer(str(path), _Echo)
        server.daemon_threads = True
        server.name = name
        path.chmod(0o777)  # the container's user is 10001
        threading.Thread(target=server.serve_forever, daemon=True).start()
        servers.append(server)
    yield folder
    for server in servers:
        server.shutdown()
        server.server_close()


RELAY_CLIENT = r"""
set -eu
if command -v socat >/dev/null; then echo "socat is on PATH: $(command -v socat)"; exit 3; fi
grep -c ':1E78 00000000:0000 0A\|:1E79 00000000:0000 0A' /proc/net/tcp
for port in 7800 7801; do
  exec 3<>/dev/tcp/127.0.0.1/$port
  printf 'hello %s\n' "$port" >&3
  IFS= read -r reply <&3
  echo "$reply"
  exec 3>&-
done
"""


def test_the_mock_images_relay_carries_bytes_in_a_plain_image(
    docker_images, client, bundles, gateway_sockets
):
    bundle = bundles(docker_images.image_for("mock"))
    assert (bundle / "bin" / "mock-worker").is_file()
    binds = {str(gateway_sockets): "/run/worker-bridge"}
    # (the client is bash's /dev/tcp: the plain image has no socat, no python, no curl)
    code, out, err = run_plain(client, bundle, ["wb-relay", "bash", "-c", RELAY_CLIENT], binds)
    assert code == 0, (out, err)
    assert out.split("\n")[:3] == ["2", "routes got: hello 7800", "proxy got: hello 7801"], (
        out,
        err,
    )


RELAY_BURST = r"""
set -u
relays() {  # the pids of the proxy port's socat processes: its listener and its connections
  for p in /proc/[0-9]*; do  # (780[1]: this script's own text is not one of them)
    if tr '\0' ' ' < "$p/cmdline" 2>/dev/null | grep -q 'TCP-LISTEN:780[1]'; then
      echo "${p#/proc/}"
    fi
  done
}
ask() {  # one line through the proxy port, for up to 5 s while it is not listening
  for i in {1..50}; do
    if exec 3<>/dev/tcp/127.0.0.1/7801; then
      printf '%s\n' "$1" >&3
      IFS= read -r -t 10 reply <&3
      echo "$reply"
      exec 3>&-
      return
    fi 2>/dev/null
    sleep 0.1
  done
  echo "refused: $1"
}
hold() {  # $1 connections held open (builtins only: no fork), their descriptors in $held
  held=""
  i=0
  while [ $i -lt "$1" ]; do
    if exec {fd}<>/dev/tcp/127.0.0.1/7801; then held="$held $fd"; fi 2>/dev/null
    i=$((i + 1))
  done
}
release() { for fd in $held; do exec {fd}>&-; done; }
# A burst of 40 connections held open: no more than 20 are forked, the rest wait their turn.
hold 40
for i in {1..50}; do [ "$(relays | wc -l)" -ge 21 ] && break; sleep 0.1; done
sleep 0.3
echo "socat processes: $(relays | wc -l)"
release
ask "after the burst"
# The worker kills the relay's listener: it is started again.
for i in {1..50}; do [ "$(relays | wc -l)" -eq 1 ] && break; sleep 0.1; done
victims=$(relays)
kill $victims && echo "killed $(echo $victims | wc -w)"
ask "after a kill"
"""


def test_the_relay_bounds_its_connections_and_outlives_a_kill(
    docker_images, client, bundles, gateway_sockets
):
    bundle = bundles(docker_images.image_for("mock"))
    binds = {str(gateway_sockets): "/run/worker-bridge"}
    code, out, err = run_plain(
        client,
        bundle,
        ["wb-relay", "bash", "-c", RELAY_BURST],
        binds,
        env={"WB_RELAY_MAX_CHILDREN": "20"},
    )
    assert code == 0, (out, err)
    assert out.splitlines() == [
        "socat processes: 21",
        "proxy got: after the burst",
        "killed 1",
        "proxy got: after a kill",
    ], (out, err)


def test_socat_loads_only_the_bundles_libraries(docker_images, client, bundles):
    bundle = bundles(docker_images.image_for("mock"))
    lib = f"{BUNDLE}/lib"
    listing = [f"{lib}/ld.so", "--library-path", lib, "--list", f"{lib}/socat"]
    code, out, err = run_plain(client, bundle, listing)
    assert code == 0, (out, err)
    loaded = [line.split("=>")[1].split()[0] for line in out.splitlines() if "=>" in line]
    assert loaded and all(path.startswith(f"{lib}/") for path in loaded), out


@pytest.mark.parametrize(("image", "command", "starts"), CLIS, ids=[c[1][0] for c in CLIS])
def test_each_cli_prints_its_version_from_the_bundle_in_a_plain_image(
    docker_images, client, bundles, image, command, starts
):
    from bridge.sandbox import DockerSandbox

    ref = docker_images.image_for(image)
    if not DockerSandbox().image_present(ref):
        pytest.skip(f"{ref} is not built (worker-bridge images build {image})")
    version = client.images.get(ref).labels["io.worker-bridge.cli-version"]
    bundle = bundles(ref)
    code, out, err = run_plain(client, bundle, command)
    assert code == 0, (out, err)
    first = out.splitlines()[0] if out else ""
    if starts is None:
        assert version in first, (version, out, err)
    else:
        assert first.startswith(starts), (out, err)
