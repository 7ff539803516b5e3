"""The cluster tests' cluster (tests/support/cluster.py): one per session (per xdist worker),
brought up again for a test when one before it took it down."""

from support.cluster import local_cluster, session_cluster  # noqa: F401
