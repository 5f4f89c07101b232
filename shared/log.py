"""structlog set-up: JSON off a terminal, readable on one; request ids come from contextvars.

Every line is written whole, with one ``write`` and a flush, the moment it is
logged (structlog's own ``BytesLogger`` for JSON, ``WriteLogger`` for the
console format): a line written just before a crash, a SIGKILL or a watchdog
kill is in the log (M5). There is no buffer in this process to lose.

The standard library's loggers (aiohttp's, asyncio's) go to the same stream in
the same format, one line each with the request id when there is one, at
WARNING and above.

``log_request`` writes the one line per HTTP request. In JSON it skips
structlog's processor chain and writes the same fields (the request id, the
request's fields, event, level, timestamp) with one ``write`` on the file
descriptor: through structlog that line was ~11% of a ``pools/get``'s CPU. Only
``configure_logging`` configures structlog here; a ``structlog.configure`` from
elsewhere would not be seen by this path.
"""

import logging
import os
import sys
import time
from collections.abc import Callable
from typing import Any, TextIO

import msgspec
import structlog

_ENCODER = msgspec.json.Encoder(enc_hook=str)
_stdlib_handler: logging.Handler | None = None  # the one configure_logging put on the root logger
# Where log_request writes a JSON line (None: through structlog, or not at all when disabled).
_request_line: Callable[[bytes], None] | None = None
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
    global _request_line, _requests_logged, _processors, _renderer
    _requests_logged = level <= logging.INFO
    _request_line = _line_writer(binary) if json and binary is not None else None
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
    global _stdlib_handler, _request_line, _requests_logged, _processors, _renderer
    if _stdlib_handler is not None:
        logging.getLogger().removeHandler(_stdlib_handler)
    _stdlib_handler, _request_line, _requests_logged = None, None, True
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
) -> None:
    """The request's log line (M5), written whole the moment it is logged; ``caller`` names
    who called (tenant and credential, or node)."""
    if not _requests_logged:
        return
    if _request_line is None or not _structlog_runs_ours():
        _http_log.info("request", method=method, path=path, status=status, ms=ms, **caller)
        return
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
    _request_line(_ENCODER.encode(line) + b"\n")
