"""The cluster tests' session cluster (tests/support/cluster.py)."""

from support.cluster import local_cluster  # noqa: F401

LAST = "test_down_leaves_nothing_behind_and_the_main_engine_as_it_was"


def pytest_collection_modifyitems(items):
    """The test that takes the session's cluster down runs after every other test using it."""
    last = [item for item in items if item.name == LAST]
    items[:] = [item for item in items if item.name != LAST] + last
