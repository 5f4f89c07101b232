"""Reading rows as dicts, lighter than ``Database.query`` on the hot paths of every request."""

from collections.abc import Sequence
from typing import Any

from controlplane.storage.sql import Database


def rows(db: Database, sql: str, params: Sequence[Any] = ()) -> list[dict[str, Any]]:
    cursor = db.execute(sql, params)
    names = [column[0] for column in cursor.description]
    return [dict(zip(names, row, strict=True)) for row in cursor]


def one(db: Database, sql: str, params: Sequence[Any] = ()) -> dict[str, Any] | None:
    cursor = db.execute(sql, params)
    row = cursor.fetchone()
    if row is None:
        return None
    return dict(zip([column[0] for column in cursor.description], row, strict=True))
