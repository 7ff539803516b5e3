"""The warm process: `worker-bridge` commands forked from a process that has loaded the bridge
once, instead of each paying the interpreter's imports (about 0.3 s of CPU: pydantic, the
bridge's models, docker-py).

`client.py` is the console script, standard library only: it hands its argument list,
environment, working folder, umask and standard streams to the warm process over a Unix socket
and relays signals and the exit status; with no warm process it runs the command itself and
starts one for the next command. `server.py` is the warm process: it imports, listens, and
forks one child per command, which becomes that command (docs/architecture.md, "The warm
process")."""
