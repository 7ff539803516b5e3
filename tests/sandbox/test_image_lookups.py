"""A task's run looks each image up once (`resolved_once`): its preflight, its permission check,
its environment and its worker's bundle ask the engine about the same refs within milliseconds
(`known_image`). What the run must still see: an image this process commits, removes or builds
meanwhile, an image that was missing, and whatever asks the engine itself (`inspect_image`: a
cache entry's image, which another process may make again; the pool's); and no other thread
shares what one run found."""

from __future__ import annotations

import os
import threading

from bridge.sandbox import DockerSandbox
from bridge.sandbox.docker import resolved_once


def test_a_run_looks_an_image_up_once_and_again_after_this_process_changes_one(docker_images):
    sandbox = DockerSandbox()
    asked: list[str] = []
    real = sandbox.client.api.inspect_image

    def counting(ref, *args, **kwargs):  # noqa: ANN001, ANN002, ANN003
        asked.append(ref)
        return real(ref, *args, **kwargs)

    sandbox.client.api.inspect_image = counting
    image = docker_images.verify_image_ref
    tag = f"worker-bridge-test/resolved:{os.getpid()}"
    missing = f"worker-bridge-test/never-built:{os.getpid()}"
    container = sandbox.client.api.create_container(
        image, ["true"], labels={"io.worker-bridge.test": "resolved-once"}
    )["Id"]
    try:
        first = sandbox.known_image(image)
        assert sandbox.known_image(image) == first and asked.count(image) == 2  # outside a run
        asked.clear()
        with resolved_once():
            assert sandbox.image_present(image) and sandbox.known_image(image) == first
            assert asked.count(image) == 1  # the presence check's answer is the run's
            assert sandbox.inspect_image(image) == first and asked.count(image) == 2  # asks
            assert sandbox.known_image(missing) is None and sandbox.known_image(missing) is None
            assert asked.count(missing) == 2  # a missing image is asked for again

            seen_in_thread: list[int] = []

            def other() -> None:
                sandbox.known_image(image)
                seen_in_thread.append(asked.count(image))

            thread = threading.Thread(target=other)
            thread.start()
            thread.join()
            assert seen_in_thread == [3]  # another thread asks the engine itself

            assert sandbox.known_image(tag) is None
            made = sandbox.commit(container, tag, {"io.worker-bridge.test": "resolved-once"})
            assert sandbox.known_image(tag).id == made  # committed by this process: asked
            before = asked.count(image)
            sandbox.known_image(image)
            assert asked.count(image) == before + 1  # a commit clears what the run found
            sandbox.remove_image(tag)
            assert sandbox.known_image(tag) is None  # removed by this process: asked again
        sandbox.known_image(image)
        assert asked.count(image) == before + 2  # the run is over: asked every time again
    finally:
        sandbox.client.api.remove_container(container, force=True)
        sandbox.remove_image(tag)
