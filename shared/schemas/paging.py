"""B1 paging: a list answers at most a page of items and the cursor of the next."""

from typing import Annotated

from msgspec import Meta

from shared.validation import whole

# B1: a list answers at most this many items a page (100 unless told) and the cursor of the next.
PageLimit = Annotated[int, Meta(ge=1, le=1000, description="At most this many items (B1).")]
DEFAULT_PAGE = 100
# B1: the `next` of the page before, as the list gave it: opaque (a position the server sealed,
# base64url), refused by any other list.
Cursor = Annotated[
    str,
    Meta(
        max_length=256,
        pattern=whole(r"^[A-Za-z0-9_-]{1,256}$"),
        description="The `next` of the page before (B1), as given.",
    ),
]
