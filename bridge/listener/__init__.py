"""The HTTP listener the MCP server and the web view share: its flags (flags.py), how it is
reached (options.py: address and bearer token), the token gate (gate.py), what it sheds
(limits.py: deadlines, connection caps, body bounds) and serving with uvicorn (run.py)."""
