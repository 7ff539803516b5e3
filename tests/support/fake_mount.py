"""Overlay mounts refused by the kernel, chosen by a text in their options or mount point, every
other one made as usual: how tests make one layered checkout fall back without touching the
others. The bridge makes overlay mounts with mount(2) in its own process (`overlay._mount_overlay`),
so the refusal is that call's, in the test's process: tasks run through the library there."""

from __future__ import annotations

import errno
import os

import pytest

from bridge.workspace import overlay


def fake_mount(monkeypatch: pytest.MonkeyPatch, when: str) -> None:
    """Overlay mounts whose options or target contain ``when`` fail as the kernel's refusal
    does (EPERM), with "refused by the test" in the message."""
    real = overlay._mount_overlay
    wanted = os.fsencode(when)

    def refusing(options: bytes, target: bytes) -> None:
        if wanted in options or wanted in target:
            raise OSError(errno.EPERM, "overlay mount failed: refused by the test")
        real(options, target)

    monkeypatch.setattr(overlay, "_mount_overlay", refusing)
