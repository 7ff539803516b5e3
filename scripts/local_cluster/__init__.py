"""A cluster of simulated nodes on one machine, for trying worker-bridge's cluster mode and for
its tests (`scripts/local-cluster up N | down | status`): network namespaces on a private subnet
that exists only inside them, each node with its own containerd and dockerd, Debian's
`docker-registry` in the hub, a Ray head for the control host and a Ray node per node, with
token authentication. Everything started is recorded by pid in a state file and stopped by pid.

Standard library only, so the script runs before (or without) the package's install; Ray is
run from the repository's virtualenv."""
