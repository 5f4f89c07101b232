"""The error tree. Every error a caller can see has a permanent code.

    ApiError
    ├── InvalidInput        400 INVALID_INPUT     (details.field names the JSON path)
    │   ├── PayloadTooLarge 413 INVALID_INPUT
    │   └── BodyTimedOut    408 INVALID_INPUT     (the body did not arrive whole in time)
    ├── Unauthenticated     401 UNAUTHENTICATED
    ├── PermissionDenied    403 PERMISSION_DENIED
    ├── NotFound            404 NOT_FOUND
    ├── Conflict            409 CONFLICT
    ├── InvalidState        409 INVALID_STATE
    └── Unavailable         503 UNAVAILABLE       (the database is away; Retry-After says when)

Anything else that escapes a handler is a bug: 500 INTERNAL with no internals.
"""

from typing import Any, ClassVar


class ApiError(Exception):
    code: ClassVar[str] = "INTERNAL"
    status: ClassVar[int] = 500

    def __init__(self, message: str, *, field: str | None = None, **details: Any) -> None:
        super().__init__(message)
        self.message = message
        self.details: dict[str, Any] = dict(details)
        if field is not None:
            self.details["field"] = field


class InvalidInput(ApiError):
    code = "INVALID_INPUT"
    status = 400


class PayloadTooLarge(InvalidInput):
    status = 413


class BodyTimedOut(InvalidInput):
    """F4: the body did not arrive whole within --body-timeout of its headers; the connection
    closes after the answer (no code of the error table is closer than INVALID_INPUT)."""

    status = 408


class Unauthenticated(ApiError):
    code = "UNAUTHENTICATED"
    status = 401


class PermissionDenied(ApiError):
    code = "PERMISSION_DENIED"
    status = 403


class NotFound(ApiError):
    code = "NOT_FOUND"
    status = 404


class Conflict(ApiError):
    code = "CONFLICT"
    status = 409


class InvalidState(ApiError):
    code = "INVALID_STATE"
    status = 409


class Unavailable(ApiError):
    """F1: the database cannot be reached now; ``retry_after`` seconds is when to try again."""

    code = "UNAVAILABLE"
    status = 503

    def __init__(self, message: str, *, retry_after: int = 2, **details: Any) -> None:
        super().__init__(message, **details)
        self.retry_after = retry_after


def error_body(code: str, message: str, details: dict[str, Any], request_id: str) -> dict[str, Any]:
    """The one error body shape: ``{"error": {code, message, details, requestId}}``."""
    return {
        "error": {"code": code, "message": message, "details": details, "requestId": request_id}
    }


def _error_classes(base: type[ApiError]) -> dict[tuple[int, str], type[ApiError]]:
    found = {(base.status, base.code): base}
    for sub in base.__subclasses__():
        found.update(_error_classes(sub))
    return found


def relayed_error(status: int, code: str, message: str, details: dict[str, Any]) -> ApiError:
    """The error another process decided (a read worker), as the class that has its code and
    status."""
    error = _error_classes(ApiError).get((status, code), ApiError)(message)
    error.details = dict(details)
    return error
