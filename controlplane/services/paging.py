"""B1: keyset pages, never OFFSET. A list reads the rows after its cursor in its stable order,
``limit + 1`` of them: the extra row says whether another page follows, and the key of the
page's last row read is the next page's cursor.

A list that decides each item on its pool (R1) pages over the rows it read, shown or not, so
the cursor moves past the items it leaves out and paging never stalls on them.
"""

from typing import TypeVar

T = TypeVar("T")


def page(found: list[T], limit: int | None) -> tuple[list[T], T | None]:
    """The page's rows (``found`` was read with ``limit + 1``) and, when more follow, its last
    row, whose key is the next cursor; with ``limit`` None every row and nothing after."""
    if limit is None or len(found) <= limit:
        return found, None
    return found[:limit], found[limit - 1]
