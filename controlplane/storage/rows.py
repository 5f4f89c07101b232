"""Reading rows: typed (``Row``), or as dicts, lighter than ``Database.query`` on hot paths."""

from collections.abc import Mapping, Sequence
from typing import Any, Self

from msgspec import Struct

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


class Row(Struct, frozen=True, kw_only=True):
    """A typed row whose fields are its statement's columns: by name (``from_row``, for
    ``SELECT *``) or in field order (``of``, for a statement that names them)."""

    @classmethod
    def from_row(cls, row: Mapping[str, Any]) -> Self:
        return cls(**{name: row[name] for name in cls.__struct_fields__})

    @classmethod
    def of(cls, row: Sequence[Any]) -> Self:
        return cls(**dict(zip(cls.__struct_fields__, row, strict=True)))
