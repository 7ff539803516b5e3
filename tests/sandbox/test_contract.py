"""The `Sandbox` contract (bridge/sandbox/protocol.py): one set of checks every implementation
must pass, run against `FakeSandbox` (the fast tier) and `DockerSandbox` (marked docker, on the
test base image: plain Debian, no init of ours). What is checked is what the pipeline relies on:
a container started from a `ContainerSpec` is found by its labels, `running` then `exited`; its
output streams per stream asked for, from a moment (`since`) or as the last lines kept (`tail`);
`wait` gives the exit code, and past its timeout kills the container; kill, remove and
`remove_by_labels` end and take away exactly what they name, and a wait on a container removed
meanwhile has no exit code; an image is present or not; a start that fails raises and leaves
nothing behind; an id nobody knows is no container, never an error.

Where the two differ, the test says so with the reason: the fake starts every container at
once, so only the engine shows a container made but not started (`created`). Every container a
test starts carries the test's own labels and is removed by them on the way out."""

from __future__ import annotations

import secrets
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from support.engine import BASE_IMAGE

from bridge.errors import BridgeError, ImageMissing
from bridge.sandbox import LABEL, ContainerSpec, DockerSandbox, Mount
from bridge.sandbox.fake import FakeSandbox
from bridge.sandbox.protocol import Sandbox

IMPLEMENTATIONS = [
    pytest.param("fake", id="fake"),
    pytest.param("docker", id="docker", marks=pytest.mark.docker),
]
KILLED = 137  # 128 + SIGKILL, whoever sent it


@dataclass
class Subject:
    """One implementation under test, with what its checks need."""

    kind: str
    sandbox: Sandbox
    image: str  # present in this sandbox
    missing: str  # an image reference this sandbox does not have
    labels: dict[str, str]  # on every container the test starts
    folder: Path  # mounted at /workspace, the containers' working folder

    def spec(self, script: str, *, image: str | None = None, **labels: str) -> ContainerSpec:
        return self.spec_of(["sh", "-c", script], image=image, **labels)

    def spec_of(
        self, command: list[str], *, image: str | None = None, **labels: str
    ) -> ContainerSpec:
        return ContainerSpec(
            image=image or self.image,
            command=command,
            user="10001:10001",
            labels={**self.labels, **{f"{LABEL}.{k}": v for k, v in labels.items()}},
            mounts=[Mount(self.folder, "/workspace")],
            memory_mb=256,
            tmpfs=("/tmp",),
        )

    def start(self, script: str, **labels: str) -> str:
        return self.sandbox.start(self.spec(script, **labels))

    def state(self, container_id: str) -> str | None:
        found = [c for c in self.sandbox.containers(self.labels) if c.id == container_id]
        return found[0].state if found else None


@pytest.fixture(params=IMPLEMENTATIONS)
def subject(request, workdir: Path) -> Iterator[Subject]:
    run = secrets.token_hex(6)
    labels = {f"{LABEL}.task": f"contract-{run}", f"{LABEL}.role": "contract"}
    missing = f"worker-bridge-test/absent:{run}"
    if request.param == "fake":
        sandbox, image = FakeSandbox(missing_images=[missing]), "worker-bridge-test/fake:1"
    else:
        sandbox, image = DockerSandbox(), BASE_IMAGE
        assert sandbox.image_present(image), f"{image} is missing: `make base-image` makes it"
    folder = workdir / "mounted"
    folder.mkdir()
    (folder / "file.txt").write_text("from the host\n")
    yield Subject(request.param, sandbox, image, missing, labels, folder)
    sandbox.remove_by_labels(labels)


def _read(chunks: Iterator[bytes]) -> bytes:
    return b"".join(chunks)


def _until(chunks: Iterator[bytes], wanted: bytes, deadline_s: float = 60) -> bytes:
    """Read a live stream until ``wanted`` has arrived (the stream is left open); bounded by
    the container's own life when nothing more comes."""
    seen = b""
    deadline = time.monotonic() + deadline_s
    for chunk in chunks:
        seen += chunk
        if wanted in seen or time.monotonic() > deadline:
            break
    assert wanted in seen, seen
    return seen


# -- starting, finding, waiting ---------------------------------------------------------------


def test_a_started_container_is_found_by_its_labels_running_then_exited(subject: Subject):
    container = subject.start("sleep 30", turn="1")
    found = subject.sandbox.containers({**subject.labels, f"{LABEL}.turn": "1"})
    assert [c.id for c in found] == [container]
    assert found[0].state == "running"
    assert found[0].labels.items() >= subject.spec("", turn="1").labels.items()
    assert subject.sandbox.containers({**subject.labels, f"{LABEL}.turn": "2"}) == []

    subject.sandbox.kill(container)
    subject.sandbox.wait(container, timeout=60)
    assert subject.state(container) == "exited"


def test_wait_gives_the_commands_exit_code_and_how_long_it_ran(subject: Subject):
    container = subject.start("test -f file.txt || exit 9; sleep 1; exit 3")  # in /workspace
    info = subject.sandbox.wait(container, timeout=60)
    assert (info.exit_code, info.oom_killed, info.timed_out) == (3, False, False)
    assert info.duration_s is not None and 0.5 <= info.duration_s < 60
    again = subject.sandbox.wait(container, timeout=60)  # an exited container answers at once
    assert again.exit_code == 3 and not again.timed_out


def test_a_wait_past_its_timeout_kills_the_container_and_says_so(subject: Subject):
    container = subject.start("sleep 60")
    started = time.monotonic()
    info = subject.sandbox.wait(container, timeout=1)
    assert time.monotonic() - started < 30
    assert info.timed_out and info.exit_code == KILLED and not info.oom_killed
    assert subject.state(container) == "exited"


# -- output -----------------------------------------------------------------------------------


def test_output_streams_the_streams_asked_for_until_the_container_exits(subject: Subject):
    container = subject.start("echo out-1; echo err-1 >&2; sleep 1; echo out-2; echo err-2 >&2")
    both = _read(subject.sandbox.output(container))  # follows until the exit
    subject.sandbox.wait(container, timeout=60)
    assert sorted(both.splitlines()) == [b"err-1", b"err-2", b"out-1", b"out-2"]
    assert _read(subject.sandbox.output(container, stderr=False)) == b"out-1\nout-2\n"
    assert _read(subject.sandbox.output(container, stdout=False)) == b"err-1\nerr-2\n"


def test_output_since_a_moment_leaves_out_what_came_before_it(subject: Subject):
    container = subject.start("echo early; sleep 2; echo late")
    _until(subject.sandbox.output(container), b"early")
    moment = time.time()
    subject.sandbox.wait(container, timeout=60)
    assert _read(subject.sandbox.output(container)) == b"early\nlate\n"
    assert _read(subject.sandbox.output(container, since=moment)) == b"late\n"


def test_output_with_tail_is_the_last_lines_kept_at_once_without_following(subject: Subject):
    container = subject.start("for i in 1 2 3 4 5; do echo line-$i; done; sleep 60")
    _until(subject.sandbox.output(container), b"line-5")
    started = time.monotonic()
    last = _read(subject.sandbox.output(container, tail=3))
    assert time.monotonic() - started < 30, "tail read at once, not until the exit"
    assert last == b"line-3\nline-4\nline-5\n"
    assert subject.state(container) == "running"


# -- kill, remove -----------------------------------------------------------------------------


def test_kill_ends_a_running_container_and_leaves_an_ended_one_alone(subject: Subject):
    container = subject.start("sleep 60")
    subject.sandbox.kill(container)
    info = subject.sandbox.wait(container, timeout=60)
    assert info.exit_code == KILLED and not info.timed_out
    subject.sandbox.kill(container)  # already ended: not an error
    assert subject.state(container) == "exited"


def test_remove_takes_a_container_away_running_or_exited_and_twice_is_no_error(subject: Subject):
    running = subject.start("echo hello; sleep 60")
    exited = subject.start("exit 0")
    subject.sandbox.wait(exited, timeout=60)
    for container in (running, exited):
        subject.sandbox.remove(container)
        subject.sandbox.remove(container)
        assert subject.state(container) is None
        assert _read(subject.sandbox.output(container)) == b""
        assert subject.sandbox.wait(container, timeout=10).exit_code is None


def test_a_wait_on_a_container_removed_meanwhile_ends_with_no_exit_code(subject: Subject):
    """A cancel from another process removes the container a runner is waiting on."""
    container = subject.start("sleep 60")
    got = []
    waiter = threading.Thread(target=lambda: got.append(subject.sandbox.wait(container, 120)))
    waiter.start()
    time.sleep(0.5)
    subject.sandbox.remove(container)
    waiter.join(60)
    assert not waiter.is_alive()
    assert got[0].exit_code is None


def test_remove_by_labels_removes_exactly_the_containers_carrying_all_of_them(subject: Subject):
    first = subject.start("sleep 60", turn="1")
    second = subject.start("exit 0", turn="1")
    other = subject.start("sleep 60", turn="2")
    subject.sandbox.wait(second, timeout=60)
    assert subject.sandbox.remove_by_labels({**subject.labels, f"{LABEL}.turn": "1"}) == 2
    assert [c.id for c in subject.sandbox.containers(subject.labels)] == [other]
    assert subject.state(first) is None and subject.state(second) is None
    assert subject.sandbox.remove_by_labels({**subject.labels, f"{LABEL}.turn": "1"}) == 0


# -- images, failed starts, unknown ids -------------------------------------------------------


def test_an_image_is_present_with_what_is_known_of_it_or_absent_as_none(subject: Subject):
    assert subject.sandbox.ping()
    assert subject.sandbox.image_present(subject.image)
    info = subject.sandbox.inspect_image(subject.image)
    assert info is not None and info.id.startswith("sha256:")
    assert subject.sandbox.known_image(subject.image) == info
    assert subject.sandbox.image_labels(subject.image) == info.labels
    assert not subject.sandbox.image_present(subject.missing)
    assert subject.sandbox.inspect_image(subject.missing) is None
    assert subject.sandbox.known_image(subject.missing) is None
    assert subject.sandbox.image_labels(subject.missing) is None


def test_a_start_from_a_missing_image_raises_image_missing_and_leaves_nothing(subject: Subject):
    with pytest.raises(ImageMissing, match=subject.missing):
        subject.sandbox.start(subject.spec("exit 0", image=subject.missing))
    assert subject.sandbox.containers(subject.labels) == []


def test_a_start_whose_command_cannot_run_raises_and_leaves_nothing(subject: Subject):
    """The engine makes the container, then fails to start its command: what it made is
    removed before the error reaches the caller, who never learnt an id to remove. (In an
    image whose PID 1 is our init, tini, the start succeeds and the container exits 127.)"""
    spec = subject.spec_of(["/nonexistent/wb-contract-command"])
    with pytest.raises(BridgeError):
        subject.sandbox.start(spec)
    assert subject.sandbox.containers(subject.labels) == []


def test_an_id_nobody_knows_is_no_container_and_no_error(subject: Subject):
    unknown = secrets.token_hex(32)
    assert _read(subject.sandbox.output(unknown)) == b""
    assert _read(subject.sandbox.output(unknown, tail=10)) == b""
    assert subject.sandbox.wait(unknown, timeout=10).exit_code is None
    subject.sandbox.kill(unknown)
    subject.sandbox.remove(unknown)
    assert subject.sandbox.containers({f"{LABEL}.task": f"contract-{unknown}"}) == []
    assert subject.sandbox.remove_by_labels({f"{LABEL}.task": f"contract-{unknown}"}) == 0


# -- where the implementations differ -------------------------------------------------------


def test_a_container_made_but_not_started_is_created_in_our_words(subject: Subject):
    """`created` is what the pipeline's adoption removes rather than adopts (a half-made start,
    the pool's claimed slot). Only an engine can hold one: the protocol has no verb that makes
    a container without starting it, and the fake starts every container at once."""
    if subject.kind == "fake":
        pytest.skip("the fake starts every container at once: it never holds a `created` one")
    client = subject.sandbox.client  # the engine directly: no verb of the protocol does this
    made = client.api.create_container(subject.image, ["true"], labels=subject.labels)
    assert subject.state(made["Id"]) == "created"
