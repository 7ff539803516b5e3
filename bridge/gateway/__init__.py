"""The per-task gateway: model routes with the credential added on the host, the allowlist
egress proxy, and the accounting of every request (see server.py and policy.py)."""
