"""structlog set-up: JSON off a terminal, readable on one; request ids come from contextvars.

Every line is written whole, with one ``write``, the moment it is logged
(structlog's ``BytesLogger`` for JSON over ``LogLines``, ``WriteLogger`` for the
console format): a line written just before a crash, a SIGKILL or a watchdog
kill is in the log (M5). The one exception is the request line, below, and it
is never lost either: its request is answered only once it is written.

The standard library's loggers (aiohttp's, asyncio's) go to the same stream in
the same format, one line each with the request id when there is one, at
WARNING and above.

``log_request`` writes the one line per HTTP request. In JSON it skips
structlog's processor chain and writes the same fields (the request id, the
request's fields, event, level, timestamp): through structlog that line was
~11% of a ``pools/get``'s CPU. On the event loop the lines of the requests that
end in one pass of the loop go out together, in one ``write`` at the start of
the next pass, and each of those requests waits for it (``lines_written``)
before its answer is sent. So the answers of one pass go out together too: a
digest heartbeat took 78 µs of the daemon's CPU instead of 112 µs with a write
per request (wrk beside the daemon on 2 cores). Any other line written meanwhile goes after the waiting ones, in the same
``write``. Only ``configure_logging`` configures structlog here; a
``structlog.configure`` from elsewhere would not be seen by this path.
"""

import asyncio
import atexit
import logging
import os
import sys
import threading
import time
from collections.abc import Callable
from typing import Any, BinaryIO, TextIO, cast

import msgspec
import structlog

_ENCODER = msgspec.json.Encoder(enc_hook=str)
_stdlib_handler: logging.Handler | None = None  # the one configure_logging put on the root logger
# Where JSON lines go (None: the console format, or structlog's defaults).
_lines: "LogLines | None" = None
_requests_logged = True  # False below INFO
_processors: list[Any] = []  # structlog's chain as configured here
_renderer: Any = None  # its last processor
_second = -1  # the whole second _stamp_prefix is of
_stamp_prefix = ""


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
    lines: LogLines | None = None
    if json and binary is not None:
        # Bytes straight from msgspec to the stream's buffer: no str round trip.
        stream.flush()  # anything already written through the text layer goes first
        renderer = structlog.processors.JSONRenderer(serializer=_dumps)
        lines = LogLines(_line_writer(binary))
        # LogLines has the write and flush BytesLogger calls.
        factory = structlog.BytesLoggerFactory(file=cast(BinaryIO, lines))
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
    # One write of the whole line; in JSON after the request lines waiting to be written.
    handler = logging.StreamHandler(stream if lines is None else _TextLines(lines))
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
    global _lines, _requests_logged, _processors, _renderer
    if _lines is not None:
        _lines.flush()
    _requests_logged = level <= logging.INFO
    _lines = lines
    _processors = [*shared, structlog.processors.format_exc_info, renderer]
    _renderer = renderer
    structlog.configure(
        processors=_processors,
        wrapper_class=structlog.make_filtering_bound_logger(level),
        logger_factory=factory,
        cache_logger_on_first_use=True,
    )


def reset_logging() -> None:
    """Undo ``configure_logging``: structlog's defaults, the root logger's handler gone, the
    request line through structlog again (a process, or a test run, that configured logging
    for one command and goes on without it)."""
    global _stdlib_handler, _lines, _requests_logged, _processors, _renderer
    if _stdlib_handler is not None:
        logging.getLogger().removeHandler(_stdlib_handler)
    if _lines is not None:
        _lines.flush()
    _stdlib_handler, _lines, _requests_logged = None, None, True
    _processors, _renderer = [], None
    structlog.reset_defaults()


def _line_writer(binary: Any) -> Callable[[bytes], None]:
    """One ``write`` per line: straight to the file descriptor when the stream has one (no
    buffer in between to flush), else the stream's write and flush."""
    try:
        fd = binary.fileno()
    except (AttributeError, OSError, ValueError):
        fd = None
    if fd is None:

        def write_and_flush(line: bytes) -> None:
            binary.write(line)
            binary.flush()

        return write_and_flush
    binary.flush()  # what is already buffered goes first

    def write(line: bytes) -> None:
        while line:
            line = line[os.write(fd, line) :]  # a pipe may take part of a long line

    return write


class LogLines:
    """JSON lines to one stream: written at once, or (``add_soon``, on an event loop) at the
    start of the loop's next pass, with every line added in this one, in one ``write``."""

    def __init__(self, write: Callable[[bytes], None]) -> None:
        self._write = write
        self._waiting: list[bytes] = []
        self._lock = threading.Lock()  # a line from another thread goes whole, in order

    def add_soon(self, line: bytes, loop: asyncio.AbstractEventLoop) -> None:
        """``line`` in the write at the start of ``loop``'s next pass: anything the loop runs
        after this call returns runs after that write."""
        with self._lock:
            self._waiting.append(line)
            if len(self._waiting) == 1:
                loop.call_soon(self.flush)

    def write(self, line: bytes) -> None:
        """``line`` now, after the lines waiting (structlog's ``BytesLogger`` calls it)."""
        with self._lock:
            waiting, self._waiting = self._waiting, []
            self._write(b"".join(waiting) + line if waiting else line)

    def flush(self) -> None:
        """The lines waiting, now."""
        self.write(b"")


class _TextLines:
    """``LogLines`` as the text stream the standard library's handler writes to."""

    def __init__(self, lines: LogLines) -> None:
        self._lines = lines

    def write(self, text: str) -> None:
        self._lines.write(text.encode())

    def flush(self) -> None:
        pass  # every write is already written


@atexit.register
def _flush_at_exit() -> None:
    """Lines still waiting for the loop's next pass are written at any exit (M5)."""
    if _lines is not None:
        _lines.flush()


def _timestamp() -> str:
    """Now as structlog's ``TimeStamper(fmt="iso", utc=True)`` writes it, the date and time of
    day formatted once a second."""
    global _second, _stamp_prefix
    now = time.time()
    second = int(now)
    if second != _second:
        _stamp_prefix = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(second))
        _second = second
    return f"{_stamp_prefix}.{int((now - second) * 1_000_000):06d}Z"


_http_log = structlog.get_logger("controlplane.http")


def _structlog_runs_ours() -> bool:
    """Whether structlog still runs the chain configured here: ``capture_logs`` (tests) swaps
    the contents of that very list, ``configure_logging`` makes a new one."""
    return bool(_processors) and _processors[-1] is _renderer


def log_request(
    request_id: str, method: str, path: str, status: int, ms: float, caller: dict[str, str]
) -> bool:
    """The request's log line (M5); ``caller`` names who called (tenant and credential, or
    node). True when it is to be written at the start of the event loop's next pass: the
    request then awaits ``lines_written`` before it is answered."""
    if not _requests_logged:
        return False
    lines = _lines
    if lines is None or not _structlog_runs_ours():
        _http_log.info("request", method=method, path=path, status=status, ms=ms, **caller)
        return False
    line = {
        "request_id": request_id,
        "method": method,
        "path": path,
        "status": status,
        "ms": ms,
        **caller,
        "event": "request",
        "level": "info",
        "timestamp": _timestamp(),
    }
    encoded = _ENCODER.encode(line) + b"\n"
    loop = asyncio.get_running_loop()  # a request is handled on the loop
    lines.add_soon(encoded, loop)
    return True


async def lines_written() -> None:
    """Returns once the lines logged before the call are written: the write was scheduled
    (``add_soon``) before this coroutine's own wake-up, and the loop runs in order."""
    await asyncio.sleep(0)
