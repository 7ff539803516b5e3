"""The host's SQLite store: tasks, events, leases and artifacts.
sqlite3 and sqlite-utils (its migrations runner) are imported only in this package."""

from bridge.store.db import Store, store_writable

__all__ = ["Store", "store_writable"]
