"""The clean checkout verification's first command runs on, prepared off the critical path
(`VerifyCheckout`): the base checked out (or mounted, layered) while the worker runs, then
brought to the snapshot by writing only the paths the task changed."""

from __future__ import annotations

import os
import threading
from pathlib import Path
from subprocess import SubprocessError

from bridge.environments.task import add_cached_files, view_tree
from bridge.errors import BridgeError
from bridge.phase.handle import PhaseHandle
from bridge.workspace import overlay
from bridge.workspace.bases import base_tree, private_folder
from bridge.workspace.diff import Change, export_snapshot, update_checkout
from bridge.workspace.fs import remove_tree
from bridge.workspace.overlay import mount_point, overlay_usable
from bridge.workspace.trash import discard
from bridge.workspace.worktree import TaskWorkspace, chown_paths, chown_tree


class VerifyCheckout:
    """The clean checkout verification runs on, prepared off the critical path.

    While the worker runs, a thread checks out the *base* commit into a fresh folder; once the
    snapshot exists, only the paths the task changed are brought to the snapshot. Without a
    prepared base (a resumed runner), `finish` makes a fresh checkout of the whole snapshot.
    """

    def __init__(self, handle: PhaseHandle, ws: TaskWorkspace, base: str, turn: int) -> None:
        self.handle, self.ws, self.base = handle, ws, base
        self.outputs: Path | None = None  # an environment's cached files, added at finish
        self.sealed: Path | None = None  # ... reaching it as this sealed view (`view_tree`)
        # The cached files the worker got (outputs, sealed view), which verification nearly
        # always gets too: the prepared layered checkout is mounted over their view already
        # (`over`: that view and its folder's identity), and `finish` mounts it again only
        # when verification's view is another.
        self.expected: tuple[Path, Path | None] | None = None
        self.over: tuple[Path, tuple[int, int]] | None = None
        self.home = handle.ctx.home
        self.scratch = handle.ctx.task_dir(ws.task_id) / f"verify-{turn}"
        self.path = self.scratch / "checkout"
        # Layered: an overlay over the base's cached tree, mounted outside the task folder,
        # its upper dir in the scratch folder (what the disk watchdog measures).
        self.mount = mount_point(self.home, ws.task_id, f"verify-{turn}")
        wanted = handle.ctx.config.layered_checkouts
        self.layered = wanted and overlay_usable(self.home)
        # Why the checkout is a full one where a layered one was asked for.
        self.fallback = overlay.NO_OVERLAY if wanted and not self.layered else None
        self._thread: threading.Thread | None = None
        self._error: BaseException | None = None

    def _chown(self, written: list[str] | None = None) -> None:
        """Hand the checkout (or only the paths just ``written`` into it) to the sandbox user."""
        _, owner = self.handle.ctx.sandbox_identity()
        if owner is None:
            return
        if written is None:
            chown_tree(self.path, *owner)
        else:
            chown_paths(self.path, written, *owner)

    def _prepare(self) -> None:
        try:
            self._unmount()  # what a killed runner left
            discard(self.home, self.scratch)
            self.scratch.mkdir(parents=True)
            if self.layered and self._mount():
                return
            self.path = self.scratch / "checkout"
            export_snapshot(self.home, self.ws.repository, self.base, self.path, self.scratch)
            self._chown()
        except BaseException as exc:  # finish() falls back to a fresh checkout
            self._error = exc

    def _mount(self) -> bool:
        """The base as an overlay (already the sandbox user's), over the view of the cached
        files the worker got when it can be; False (and why) where it cannot be at all: the
        base tree could not be had, the mount was refused."""
        _, owner = self.handle.ctx.sandbox_identity()
        try:
            folder = base_tree(self.home, self.ws.repository, self.base, owner)
            layers = overlay.Layers((folder / "tree",), self.scratch / "layers", self.mount)
            private_folder(layers.root)  # reached by the sandbox through the mount alone
            if not self._mount_over_view(layers, owner):
                overlay.mount(layers, owner)  # the merged root (the upper dir) is the sandbox's
        except (OSError, BridgeError, SubprocessError) as exc:
            self._unmount()
            self.fallback = f"the layered checkout could not be made: {exc}"
            return False
        self.path = self.mount
        return True

    def _mount_over_view(self, layers: overlay.Layers, owner: tuple[int, int] | None) -> bool:
        """``layers`` mounted over the view of the worker's cached files too (`expected`);
        False where there are none or that mount fails (`finish` then layers verification's)."""
        if self.expected is None:
            return False
        try:
            view, identity = self._view(*self.expected, owner)
            overlay.mount(overlay.Layers((*layers.lowers, view), layers.root, layers.target), owner)
        except (OSError, BridgeError, SubprocessError):
            return False
        self.over = (view, identity)
        return True

    def _view(
        self, outputs: Path, sealed: Path | None, owner: tuple[int, int] | None
    ) -> tuple[Path, tuple[int, int]]:
        """The view of ``outputs`` (its sealed one: ``sealed``), and its folder's identity."""
        view = view_tree(self.home, outputs, owner, sealed)
        found = os.stat(view)
        return view, (found.st_dev, found.st_ino)

    def _over_wanted_view(self) -> bool:
        """Whether the prepared checkout is mounted over what verification wants: no view for
        no cached files, else the very folder their view is now (not one made again at that
        path since, which a check that failed does)."""
        if self.outputs is None or self.over is None:
            return self.outputs is None and self.over is None
        _, owner = self.handle.ctx.sandbox_identity()
        try:
            return self._view(self.outputs, self.sealed, owner) == self.over
        except OSError:
            return False

    def _unmount(self) -> None:
        overlay.unmount(self.mount)
        if not overlay.mounted(self.mount):
            remove_tree(self.mount)

    def start(self, expected: tuple[Path, Path | None] | None = None) -> VerifyCheckout:
        """Prepare it in a thread, over the view of ``expected``, the worker's cached files."""
        self.expected = expected
        self._thread = threading.Thread(target=self._prepare, name="verify-checkout", daemon=True)
        self._thread.start()
        return self

    def finish(self, snapshot: str, changes: list[Change]) -> None:
        """Make the folder hold exactly ``snapshot`` (``changes``: base -> snapshot)."""
        if self._thread is not None:
            self._thread.join()
        fresh = self._thread is None or self._error is not None
        if fresh and self.layered:  # the first reason wins
            self.fallback = self.fallback or f"no checkout prepared ({self._error or 'resumed'})"
        layered = not fresh and self.path == self.mount
        # Layered: the environment's cached files under the base, in one step (already there
        # when they are the worker's).
        if layered and not self._over_wanted_view() and not self._layer_outputs():
            fresh, layered = True, False
        if fresh:
            self._unmount()
            discard(self.home, self.scratch)
            self.scratch.mkdir(parents=True)
            self.path = self.scratch / "checkout"
            export_snapshot(self.home, self.ws.repository, snapshot, self.path, self.scratch)
            self._chown()
        else:  # the prepared base is already the sandbox user's: only new files need it
            written = update_checkout(
                self.home, self.ws.repository, self.path, changes, self.scratch
            )
            self._chown(written)
        data = {"checkout": "layered" if layered else "full"}
        if self.fallback and not layered:
            data["fallback"] = self.fallback
        self.handle.emit("verification.checkout", data)
        if self.outputs is not None and not layered:  # after the chown: the cache's files
            add_cached_files(self.handle, self.outputs, self.sealed, self.path)

    def _layer_outputs(self) -> bool:
        """Mount the (still untouched) layered checkout again over the base's tree and the
        environment's view of verification's cached files (or none: ``outputs`` None); False
        (and why) where it cannot be."""
        _, owner = self.handle.ctx.sandbox_identity()
        try:
            folder = base_tree(self.home, self.ws.repository, self.base, owner)
            lowers: tuple[Path, ...] = (folder / "tree",)
            if self.outputs is not None:
                lowers += (view_tree(self.home, self.outputs, owner, self.sealed),)
            overlay.unmount(self.mount)
            upper_root = self.scratch / "layers"
            remove_tree(upper_root)  # nothing was written into it yet
            private_folder(upper_root)
            overlay.mount(overlay.Layers(lowers, upper_root, self.mount), owner)
        except (OSError, BridgeError, SubprocessError) as exc:
            self.fallback = f"the environment's files could not be layered: {exc}"
            return False
        return True

    def discard(self) -> None:
        """Remove the checkout, whatever the commands left in it (links, FIFOs, deep trees):
        moved into the trash at once, removed there in the background (`workspace.trash`)."""
        if self._thread is not None:
            self._thread.join()
        self._unmount()
        discard(self.home, self.scratch)
