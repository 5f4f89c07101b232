"""Reading rows as dicts, lighter than ``Database.query`` on the hot paths of every request."""

from collections.abc import Sequence
from typing import Any

import sqlite_utils


def rows(db: sqlite_utils.Database, sql: str, params: Sequence[Any] = ()) -> list[dict[str, Any]]:
    cursor = db.conn.execute(sql, params)
    names = [column[0] for column in cursor.description]
    return [dict(zip(names, row, strict=True)) for row in cursor]


def one(db: sqlite_utils.Database, sql: str, params: Sequence[Any] = ()) -> dict[str, Any] | None:
    cursor = db.conn.execute(sql, params)
    row = cursor.fetchone()
    if row is None:
        return None
    return dict(zip([column[0] for column in cursor.description], row, strict=True))
