"""What a phase of a task is and what every phase uses, below both the pipeline and the project
environments: the context a runner works in (context.py), the handle each phase gets and the
hooks injected into it (handle.py), the one container lifecycle (containers.py), the gateway
beside a container (network.py) and the disk watch while one runs (watch.py)."""
