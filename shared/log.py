"""structlog set-up: JSON off a terminal, readable on one; request ids come from contextvars."""

import logging
import sys
from typing import TextIO

import msgspec
import structlog

_ENCODER = msgspec.json.Encoder(enc_hook=str)


def _dumps(event: object, **_: object) -> str:
    """JSON for one log line; msgspec is several times faster than the json module."""
    return _ENCODER.encode(event).decode()


def configure_logging(
    *, json: bool | None = None, level: int = logging.INFO, stream: TextIO = sys.stdout
) -> None:
    """Configure structlog once per process. ``json=None`` picks by whether stdout is a TTY."""
    if json is None:
        json = not stream.isatty()
    renderer: structlog.typing.Processor = (
        structlog.processors.JSONRenderer(serializer=_dumps)
        if json
        else structlog.dev.ConsoleRenderer(colors=False)
    )
    structlog.configure(
        processors=[
            structlog.contextvars.merge_contextvars,
            structlog.processors.add_log_level,
            structlog.processors.TimeStamper(fmt="iso", utc=True),
            structlog.processors.format_exc_info,
            renderer,
        ],
        wrapper_class=structlog.make_filtering_bound_logger(level),
        logger_factory=structlog.PrintLoggerFactory(file=stream),
        cache_logger_on_first_use=True,
    )
