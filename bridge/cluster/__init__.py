"""Running a task's containers on the nodes of a cluster (issue 44). For now, what every later
part stands on: putting the control host's images onto a node's engine by id (images.py), and
the git data that crosses the network, base in and snapshot out (bundles.py), and the relay
that carries a node's container to its gateway on the control host (relay.py)."""
