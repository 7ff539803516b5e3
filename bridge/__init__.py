"""worker-bridge: delegate coding tasks to CLI agents in disposable containers, verified on the host."""

__version__ = "0.1.0"
