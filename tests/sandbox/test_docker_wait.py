"""A container the kernel's OOM killer ended is reported as such even when the engine handles its
exit before its OOM event (cgroup v1: an inspect right after the exit can say OOMKilled false)."""

from __future__ import annotations

from types import SimpleNamespace

from bridge.sandbox.docker import DockerSandbox


def _engine(states):
    asked = []

    def inspect(container_id):
        asked.append(container_id)
        return states[min(len(asked) - 1, len(states) - 1)]

    return SimpleNamespace(_inspect_state=inspect), asked


def test_an_oom_event_that_follows_the_exit_is_waited_for():
    engine, asked = _engine([{"OOMKilled": False}, {"OOMKilled": True}])
    state = DockerSandbox._oom_state(engine, "c1", engine._inspect_state("c1"))
    assert state["OOMKilled"] is True and len(asked) == 2


def test_a_kill_that_was_not_the_oom_killers_stays_one_after_a_bounded_wait():
    engine, asked = _engine([{"OOMKilled": False}])
    state = DockerSandbox._oom_state(engine, "c1", {"OOMKilled": False})
    assert state["OOMKilled"] is False and 1 <= len(asked) <= 20
