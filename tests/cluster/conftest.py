"""The cluster tests' session cluster (tests/support/cluster.py)."""

from support.cluster import local_cluster  # noqa: F401
