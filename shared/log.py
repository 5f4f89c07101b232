"""structlog set-up: JSON off a terminal, readable on one; request ids come from contextvars.

Every line is written whole, with one ``write`` and a flush, the moment it is
logged (structlog's own ``BytesLogger`` for JSON, ``WriteLogger`` for the
console format): a line written just before a crash, a SIGKILL or a watchdog
kill is in the log (M5). There is no buffer in this process to lose.

The standard library's loggers (aiohttp's, asyncio's) go to the same stream in
the same format, one line each with the request id when there is one, at
WARNING and above.
"""

import logging
import sys
from typing import TextIO

import msgspec
import structlog

_ENCODER = msgspec.json.Encoder(enc_hook=str)
_stdlib_handler: logging.Handler | None = None  # the one configure_logging put on the root logger


def _dumps(event: object, **_: object) -> bytes:
    """JSON for one log line; msgspec is several times faster than the json module."""
    return _ENCODER.encode(event)


def _dumps_text(event: object, **_: object) -> str:
    return _ENCODER.encode(event).decode()


def configure_logging(
    *, json: bool | None = None, level: int = logging.INFO, stream: TextIO = sys.stdout
) -> None:
    """Configure structlog once per process. ``json=None`` picks by whether the stream is a TTY."""
    if json is None:
        json = not stream.isatty()
    global _stdlib_handler
    renderer: structlog.typing.Processor
    factory: structlog.typing.WrappedLogger
    binary = getattr(stream, "buffer", None)
    if json and binary is not None:
        # Bytes straight from msgspec to the stream's buffer: no str round trip.
        stream.flush()  # anything already written through the text layer goes first
        renderer = structlog.processors.JSONRenderer(serializer=_dumps)
        factory = structlog.BytesLoggerFactory(file=binary)
    else:
        renderer = (
            structlog.processors.JSONRenderer(serializer=_dumps_text)
            if json
            else structlog.dev.ConsoleRenderer(colors=False)
        )
        factory = structlog.WriteLoggerFactory(file=stream)
    shared: list[structlog.typing.Processor] = [
        structlog.contextvars.merge_contextvars,
        structlog.processors.add_log_level,
        structlog.processors.TimeStamper(fmt="iso", utc=True),
    ]
    handler = logging.StreamHandler(stream)  # one write of the whole line, then a flush
    handler.setFormatter(
        structlog.stdlib.ProcessorFormatter(
            foreign_pre_chain=[*shared, structlog.stdlib.add_logger_name],
            processors=[
                structlog.stdlib.ProcessorFormatter.remove_processors_meta,
                structlog.processors.format_exc_info,
                structlog.processors.JSONRenderer(serializer=_dumps_text)
                if json
                else structlog.dev.ConsoleRenderer(colors=False),
            ],
        )
    )
    root = logging.getLogger()
    if _stdlib_handler is not None:
        root.removeHandler(_stdlib_handler)
    root.addHandler(handler)
    root.setLevel(max(level, logging.WARNING))
    _stdlib_handler = handler
    structlog.configure(
        processors=[*shared, structlog.processors.format_exc_info, renderer],
        wrapper_class=structlog.make_filtering_bound_logger(level),
        logger_factory=factory,
        cache_logger_on_first_use=True,
    )
