"""Routing the library's log lines into Python's ``logging``.

On import the package hands libectransfer a log handler (``ect_log_set_handler``)
that emits every line on the logger ``ectransfer.<module>`` (``ectransfer.producer``,
``ectransfer.consumer``, ...) with the library's time and thread id in the record
(``record.ect_time_ns``, ``record.ect_thread_id``). Which lines the library produces
is its own level: ``ECT_LOG=error|warn|info|debug`` or :func:`set_level`.

The handler runs on whichever thread logs, library threads included; ctypes takes the
GIL for it. At interpreter exit the handler is removed first, so no library thread calls
into a finalizing interpreter.
"""

from __future__ import annotations

import atexit
import logging

from . import _lib

_LEVELS = {
    0: logging.ERROR,
    1: logging.WARNING,
    2: logging.INFO,
    3: logging.DEBUG,
}
_NAMES = {"error": 0, "warn": 1, "warning": 1, "info": 2, "debug": 3}

log = logging.getLogger("ectransfer")


def _emit(user, rec_p) -> None:
    try:
        rec = rec_p.contents
        module = (rec.module or b"?").decode("utf-8", "replace")
        message = (rec.message or b"").decode("utf-8", "replace")
        logging.getLogger(f"ectransfer.{module}").log(
            _LEVELS.get(rec.level, logging.ERROR),
            "%s",
            message,
            extra={"ect_time_ns": rec.realtime_ns, "ect_thread_id": rec.thread_id},
        )
    except Exception:  # a logging failure must never unwind into C
        pass


_callback = _lib.LOG_FN(_emit)  # kept alive for as long as the library may call it
_routed = False


def route_to_logging(enabled: bool = True) -> None:
    """Send the library's log lines to ``logging`` (the default), or back to stderr."""
    global _routed
    if enabled and not _routed:
        _lib.lib.ect_log_set_handler(_callback, None)
    elif not enabled and _routed:
        _lib.lib.ect_log_set_handler(_lib.LOG_FN(), None)
    _routed = enabled


def set_level(level: str | int | None) -> None:
    """The library's log level: "error", "warn", "info", "debug", a ``logging`` level
    number, or None to go back to ``ECT_LOG``."""
    if level is None:
        code = -1
    elif isinstance(level, str):
        if level.lower() not in _NAMES:
            raise _lib.Error(_lib.ECT_EINVAL, f"log level {level!r}: error, warn, info or debug")
        code = _NAMES[level.lower()]
    elif level >= logging.ERROR:
        code = 0
    elif level >= logging.WARNING:
        code = 1
    elif level >= logging.INFO:
        code = 2
    else:
        code = 3
    _lib.lib.ect_log_set_level(code)


def get_level() -> str:
    """The library's log level now: "error", "warn", "info" or "debug"."""
    return ("error", "warn", "info", "debug")[_lib.lib.ect_log_get_level()]


@atexit.register
def _unroute() -> None:
    if _routed:
        _lib.lib.ect_log_set_handler(_lib.LOG_FN(), None)
