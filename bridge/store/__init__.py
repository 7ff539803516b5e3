"""The host's SQLite store: tasks, events, leases and artifacts.
sqlite3 and sqlite-utils (its migrations runner) are imported only in this package.

`Store` is imported on first use: importing the package loads none of its modules."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from bridge.store.db import Store, store_writable

__all__ = ["Store", "store_writable"]


def __getattr__(name: str) -> Any:
    if name in __all__:
        from bridge.store import db

        return getattr(db, name)
    raise AttributeError(f"module 'bridge.store' has no attribute {name!r}")
