"""The MCP front end: the server (server.py) with the contract's tools (tools.py, job_tools.py)
over the same WorkerBridge facade as the CLI, on stdio or over streamable HTTP (http.py, behind
the listener of bridge/listener). The `mcp` SDK is imported only in this package."""
