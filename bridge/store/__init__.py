"""The host's SQLite store: tasks, events, leases and artifacts (sqlite-utils is imported only here)."""

from bridge.store.db import Store

__all__ = ["Store"]
