"""structlog set-up: JSON off a terminal, readable on one; request ids come from contextvars.

Off a terminal (journald, a file) lines go through a 64 KiB buffer that a
background thread flushes every quarter second and at exit: one write per
batch instead of one per request line, which at thousands of requests a
second was the largest single cost of a request. On a terminal every line is
written at once. A process killed outright loses at most the last quarter second.
"""

import atexit
import io
import logging
import sys
import threading
import time
from typing import TextIO

import msgspec
import structlog

_ENCODER = msgspec.json.Encoder(enc_hook=str)
FLUSH_EVERY_S = 0.25


def _dumps(event: object, **_: object) -> str:
    """JSON for one log line; msgspec is several times faster than the json module."""
    return _ENCODER.encode(event).decode()


class BufferedLines:
    """A structlog logger writing whole lines to a buffered stream, flushed in the background."""

    def __init__(self, stream: TextIO) -> None:
        self._stream = stream
        self._lock = threading.Lock()

    def msg(self, message: str) -> None:
        with self._lock:
            self._stream.write(message + "\n")

    def flush(self) -> None:
        with self._lock:
            self._stream.flush()

    log = debug = info = warn = warning = error = critical = exception = fatal = msg


def _buffered(stream: TextIO) -> BufferedLines:
    raw = open(stream.fileno(), "wb", buffering=64 * 1024, closefd=False)  # noqa: SIM115 (lives as long as the process)
    lines = BufferedLines(io.TextIOWrapper(raw, encoding="utf-8", write_through=False))

    def flush_forever() -> None:
        while True:
            time.sleep(FLUSH_EVERY_S)
            lines.flush()

    threading.Thread(target=flush_forever, name="log-flush", daemon=True).start()
    atexit.register(lines.flush)
    return lines


def configure_logging(
    *, json: bool | None = None, level: int = logging.INFO, stream: TextIO = sys.stdout
) -> None:
    """Configure structlog once per process. ``json=None`` picks by whether the stream is a TTY."""
    on_terminal = stream.isatty()
    if json is None:
        json = not on_terminal
    renderer: structlog.typing.Processor = (
        structlog.processors.JSONRenderer(serializer=_dumps)
        if json
        else structlog.dev.ConsoleRenderer(colors=False)
    )
    if on_terminal:
        factory: structlog.typing.WrappedLogger = structlog.PrintLoggerFactory(file=stream)
    else:
        lines = _buffered(stream)
        factory = lambda *_: lines  # noqa: E731 (one logger for every name)
    structlog.configure(
        processors=[
            structlog.contextvars.merge_contextvars,
            structlog.processors.add_log_level,
            structlog.processors.TimeStamper(fmt="iso", utc=True),
            structlog.processors.format_exc_info,
            renderer,
        ],
        wrapper_class=structlog.make_filtering_bound_logger(level),
        logger_factory=factory,
        cache_logger_on_first_use=True,
    )
