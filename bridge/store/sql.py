"""Small pieces of SQL the store's tables share: placeholders, a row insert, and a read-only
connection for the readers that must write nothing (doctor, `workers list`)."""

from __future__ import annotations

import sqlite3
from collections.abc import Collection, Mapping
from pathlib import Path
from typing import Any

# The connection a transaction of the store hands out (sqlite3's), named here for the modules
# outside the store that pass one along inside a transaction (bridge/workers/circuit.py): only
# the store imports sqlite3.
Connection = sqlite3.Connection


def marks(items: Collection[Any]) -> str:
    """`?, ?, ?`: one placeholder per item."""
    return ", ".join("?" for _ in items)


def insert(conn: sqlite3.Connection, table: str, row: Mapping[str, object]) -> None:
    """INSERT one row (column -> value, already encoded) into ``table``."""
    sql = f"INSERT INTO {table} ({', '.join(row)}) VALUES ({marks(row)})"
    conn.execute(sql, tuple(row.values()))


def read_only(path: Path) -> sqlite3.Connection:
    """A connection that cannot write to the store at ``path`` (a URI: its own `?` or `#` are
    escaped by as_uri)."""
    conn = sqlite3.connect(path.resolve().as_uri() + "?mode=ro", uri=True, timeout=5)
    conn.row_factory = sqlite3.Row
    return conn
