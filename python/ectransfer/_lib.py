"""Loading libectransfer and describing its C interface to ctypes.

Where the library is looked for, in order:

1. ``ECT_LIBRARY``: a path to ``libectransfer.so`` (a build tree, a test).
2. A build tree next to this source tree: ``<repo>/build/libectransfer.so``
   when the package is imported from ``<repo>/python``.
3. The install location written by ``make install`` (``_install.py``).
4. The dynamic loader's search path (``libectransfer.so.0``).

At load the binding checks the library's ABI version and the size of every
struct it mirrors, so a library built from another version is refused with a
sentence instead of being misread. Output structs (views, results, stats) may
grow at their end in a later library: the binding reads the fields it knows
and steps through arrays by the library's own struct size. The one input
struct (``ect_push_item``) must match exactly.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import os
import threading
from pathlib import Path

ABI_VERSION = 4
NDIM_MAX = 8  # ECT_POOL_MAX_NDIM
DTYPE_LEN = 32  # ECT_DTYPE_LEN
MM_HASH_LEN = 256  # ECT_MM_HASH_LEN
TRANSFER_ID_LEN = 256  # ECT_TRANSFER_ID_LEN
SESSION_ID_LEN = 257  # ECT_SESSION_ID_LEN
SCHED_ERROR_LEN = 160  # ECT_SCHED_ERROR_LEN
RESULT_ERROR_LEN = 192  # ECT_RESULT_ERROR_LEN
TRANSPORT_LEN = 16  # ECT_TRANSPORT_LEN
CUDA_LIBRARY_LEN = 256  # ECT_CUDA_LIBRARY_LEN
CUDA_NAME_LEN = 128  # ECT_CUDA_NAME_LEN
CUDA_WHY_LEN = 320  # ECT_CUDA_WHY_LEN

# Error codes (ect_err). 0 is success.
ECT_OK = 0
ECT_EINVAL = -1
ECT_ENOMEM = -2
ECT_EFULL = -3
ECT_ENOTFOUND = -4
ECT_EPROTO = -5
ECT_ETIMEDOUT = -6
ECT_EIO = -7
ECT_ECONNREFUSED = -8
ECT_ECLOSED = -9
ECT_EBUSY = -10
ECT_EEXIST = -11
ECT_ERANGE = -12
ECT_EACCES = -13
ECT_ENOTSUP = -14
ECT_ECANCELED = -15
ECT_ESTATE = -16
ECT_EOVERFLOW = -17
CODES = {
    ECT_OK: "ECT_OK",
    ECT_EINVAL: "ECT_EINVAL",
    ECT_ENOMEM: "ECT_ENOMEM",
    ECT_EFULL: "ECT_EFULL",
    ECT_ENOTFOUND: "ECT_ENOTFOUND",
    ECT_EPROTO: "ECT_EPROTO",
    ECT_ETIMEDOUT: "ECT_ETIMEDOUT",
    ECT_EIO: "ECT_EIO",
    ECT_ECONNREFUSED: "ECT_ECONNREFUSED",
    ECT_ECLOSED: "ECT_ECLOSED",
    ECT_EBUSY: "ECT_EBUSY",
    ECT_EEXIST: "ECT_EEXIST",
    ECT_ERANGE: "ECT_ERANGE",
    ECT_EACCES: "ECT_EACCES",
    ECT_ENOTSUP: "ECT_ENOTSUP",
    ECT_ECANCELED: "ECT_ECANCELED",
    ECT_ESTATE: "ECT_ESTATE",
    ECT_EOVERFLOW: "ECT_EOVERFLOW",
}

_SENTENCES = {
    0: "success",
    -1: "invalid argument",
    -2: "out of memory",
    -3: "pool is full",
    -4: "not found",
    -5: "protocol error",
    -6: "timed out",
    -7: "I/O error",
    -8: "peer unreachable",
    -9: "closed",
    -10: "resource busy",
    -11: "already exists",
    -12: "out of range",
    -13: "permission denied",
    -14: "not supported",
    -15: "cancelled",
    -16: "illegal in the current state",
    -17: "size overflow",
}


class Error(Exception):
    """An error from ectransfer.

    Attributes:
        code: the library's negative ``ECT_E*`` code (``ectransfer.ECT_EINVAL``, ...).
        name: its name, e.g. ``"ECT_EINVAL"``.
        sentence: the code's fixed sentence (``ect_strerror``), e.g. ``"invalid argument"``.
        detail: what went wrong, in a sentence (``ect_last_error``); may be empty.
    """

    def __init__(self, code: int, detail: str = ""):
        self.code = int(code)
        self.name = CODES.get(self.code, "ECT_E?")
        self.sentence = _SENTENCES.get(self.code, "unknown error")
        self.detail = detail
        text = f"{self.name} ({self.sentence})"
        super().__init__(f"{text}: {detail}" if detail else text)


class LibraryNotFound(ImportError):
    """libectransfer could not be found or is not the version this binding speaks."""


# ------------------------------------------------------------------ structs

U64 = ctypes.c_uint64
Shape = U64 * NDIM_MAX


class PushView(ctypes.Structure):
    _fields_ = [
        ("data", ctypes.c_void_p),
        ("nbytes", U64),
        ("ndim", ctypes.c_uint32),
        ("shape", Shape),
        ("dtype", ctypes.c_char * DTYPE_LEN),
        ("mm_hash", ctypes.c_char * MM_HASH_LEN),
        ("transfer_id", ctypes.c_char * TRANSFER_ID_LEN),
        ("mem_kind", ctypes.c_int),
        ("device", ctypes.c_int),
    ]


class PushItem(ctypes.Structure):
    _fields_ = [
        ("transfer_id", ctypes.c_char_p),
        ("consumer", ctypes.c_char_p),
        ("mm_hash", ctypes.c_char_p),
        ("shape", ctypes.POINTER(U64)),
        ("ndim", ctypes.c_size_t),
        ("dtype", ctypes.c_char_p),
        ("nbytes", U64),
        ("data", ctypes.c_void_p),
        ("release", ctypes.c_void_p),
        ("release_user", ctypes.c_void_p),
    ]


class PushResult(ctypes.Structure):
    _fields_ = [
        ("transfer_id", ctypes.c_char * TRANSFER_ID_LEN),
        ("status", ctypes.c_int),
        ("error", ctypes.c_char * RESULT_ERROR_LEN),
        ("latency_ns", U64),
        ("shards", ctypes.c_uint32),
        ("transport", ctypes.c_char * TRANSPORT_LEN),
        ("retries", ctypes.c_uint32),
    ]


class PushSchedItem(ctypes.Structure):
    _fields_ = [
        ("transfer_id", ctypes.c_char * TRANSFER_ID_LEN),
        ("state", ctypes.c_int),
        ("retryable", ctypes.c_int),
        ("reported", ctypes.c_uint32),
        ("mm_hash", ctypes.c_char * MM_HASH_LEN),
        ("nbytes", U64),
        ("ndim", ctypes.c_uint32),
        ("shape", Shape),
        ("dtype", ctypes.c_char * DTYPE_LEN),
        ("error", ctypes.c_char * SCHED_ERROR_LEN),
    ]


class PushConsumerStat(ctypes.Structure):
    _fields_ = [
        (n, U64)
        for n in (
            "pool_used",
            "pool_capacity",
            "live",
            "tombstones",
            "buffers",
            "resident",
            "events_queued",
            "events_sent",
            "events_dropped",
            "bad_requests",
            "evictions",
            "peak_live",
            "peak_held",
            "finished",
            "abandoned",
            "expired",
            "refused_full",
            "refused_other",
            "writes_refused",
            "spares",
        )
    ]


class PushSchedulerStat(ctypes.Structure):
    _fields_ = [("shards", ctypes.c_uint32)] + [
        (n, U64)
        for n in (
            "events",
            "bad_frames",
            "late_events",
            "cancels_sent",
            "cancels_failed",
            "live",
            "tombstones",
            "rechecks",
            "recovered",
            "listed",
        )
    ]


class PushProducerStat(ctypes.Structure):
    _fields_ = [
        (n, U64)
        for n in (
            "steps",
            "control_requests",
            "reserve_batches",
            "complete_batches",
            "write_batches",
            "peers_requests",
            "cancels",
            "done",
            "failed",
            "cancelled",
            "refreshes",
            "staged_bytes_in_use",
            "full_refusals",
            "retries",
            "give_backs",
            "staging_waits",
            "puts",
            "put_refusals",
        )
    ]


class PullMeta(ctypes.Structure):
    _fields_ = [
        ("nbytes", U64),
        ("ndim", ctypes.c_uint32),
        ("shape", Shape),
        ("dtype", ctypes.c_char * DTYPE_LEN),
        ("producer_session_id", ctypes.c_char * SESSION_ID_LEN),
    ]


class PullView(ctypes.Structure):
    _fields_ = [
        ("data", ctypes.c_void_p),
        ("nbytes", U64),
        ("ndim", ctypes.c_uint32),
        ("shape", Shape),
        ("dtype", ctypes.c_char * DTYPE_LEN),
        ("cached", ctypes.c_int),
        ("mem_kind", ctypes.c_int),
        ("device", ctypes.c_int),
    ]


class PullProducerStat(ctypes.Structure):
    _fields_ = [
        (n, U64)
        for n in (
            "saved",
            "save_failed",
            "notifications",
            "pulls_ok",
            "pulls_failed",
            "malformed",
            "requests",
            "evicted",
            "lanes",
        )
    ]


class PullSchedulerStat(ctypes.Structure):
    _fields_ = [
        (n, U64)
        for n in ("notifications", "ready_pages", "malformed", "session_changes", "available")
    ] + [("synced", ctypes.c_int)]


class PullConsumerStat(ctypes.Structure):
    _fields_ = [
        (n, U64)
        for n in ("local", "remote", "failed", "timeouts", "stale", "malformed", "quarantined")
    ]


class CudaInfo(ctypes.Structure):
    _fields_ = [
        ("available", ctypes.c_int),
        ("driver_version", ctypes.c_int),
        ("devices", ctypes.c_int),
        ("library", ctypes.c_char * CUDA_LIBRARY_LEN),
        ("device0", ctypes.c_char * CUDA_NAME_LEN),
        ("why", ctypes.c_char * CUDA_WHY_LEN),
    ]


class LogRecord(ctypes.Structure):
    _fields_ = [
        ("level", ctypes.c_int),
        ("module", ctypes.c_char_p),
        ("message", ctypes.c_char_p),
        ("realtime_ns", U64),
        ("thread_id", U64),
    ]


LOG_FN = ctypes.CFUNCTYPE(None, ctypes.c_void_p, ctypes.POINTER(LogRecord))
FOREACH_FN = ctypes.CFUNCTYPE(None, ctypes.c_void_p, ctypes.c_char_p, ctypes.POINTER(PullMeta))
# ect_push_release_fn(user, data, nbytes) and ect_pull_release_fn(user, data)
PUSH_RELEASE_FN = ctypes.CFUNCTYPE(None, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_uint64)
PULL_RELEASE_FN = ctypes.CFUNCTYPE(None, ctypes.c_void_p, ctypes.c_void_p)

# name in the header -> (mirror, must the sizes be equal)
_MIRRORS = {
    "ect_push_view": (PushView, False),
    "ect_push_item": (PushItem, True),
    "ect_push_result": (PushResult, False),
    "ect_push_sched_item": (PushSchedItem, False),
    "ect_push_consumer_stat": (PushConsumerStat, False),
    "ect_push_scheduler_stat": (PushSchedulerStat, False),
    "ect_push_producer_stat": (PushProducerStat, False),
    "ect_pull_meta": (PullMeta, False),
    "ect_pull_view": (PullView, False),
    "ect_pull_producer_stat": (PullProducerStat, False),
    "ect_pull_scheduler_stat": (PullSchedulerStat, False),
    "ect_pull_consumer_stat": (PullConsumerStat, False),
    "ect_log_record": (LogRecord, False),
    "ect_cuda_info": (CudaInfo, False),
}

P = ctypes.c_void_p
S = ctypes.c_char_p
I = ctypes.c_int
SZ = ctypes.c_size_t
PP = ctypes.POINTER(ctypes.c_void_p)

# function -> (restype, argtypes). Structs are passed as c_void_p so that a
# buffer of the library's own (maybe larger) size can stand in for them.
_PROTOS = {
    "ect_strerror": (S, [I]),
    "ect_last_error": (S, []),
    "ect_version": (S, []),
    "ect_abi_version": (I, []),
    "ect_sizeof": (SZ, [S]),
    "ect_log_set_handler": (None, [LOG_FN, P]),
    "ect_log_set_level": (None, [I]),
    "ect_log_get_level": (I, []),
    "ect_dtype_size": (SZ, [S]),
    "ect_pool_base": (P, [P]),
    "ect_pool_capacity": (U64, [P]),
    "ect_pool_fd": (I, [P]),
    "ect_cuda_get_info": (I, [P]),
    "ect_mem_kind_of": (None, [P, ctypes.POINTER(I), ctypes.POINTER(I)]),
    "ect_mem_parse_device": (I, [S, ctypes.POINTER(I), ctypes.POINTER(I)]),
    "ect_mem_alloc": (I, [I, I, U64, PP]),
    "ect_mem_free": (None, [I, P]),
    "ect_mem_copy": (I, [P, P, U64]),
    "ect_push_consumer_open_config": (I, [S, PP]),
    "ect_push_consumer_close": (None, [P]),
    "ect_push_consumer_port": (I, [P]),
    "ect_push_consumer_event_port": (I, [P]),
    "ect_push_consumer_session": (S, [P]),
    "ect_push_consumer_take": (I, [P, S, P]),
    "ect_push_consumer_release": (I, [P, P]),
    "ect_push_consumer_finish": (I, [P, S]),
    "ect_push_consumer_evict": (SZ, [P, SZ]),
    "ect_push_consumer_drop_spares": (SZ, [P]),
    "ect_push_consumer_stats": (None, [P, P]),
    "ect_push_consumer_pool": (P, [P]),
    "ect_push_state_name": (S, [I]),
    "ect_push_scheduler_open_config": (I, [S, PP]),
    "ect_push_scheduler_close": (None, [P]),
    "ect_push_scheduler_expect": (I, [P, S, S]),
    "ect_push_scheduler_poll": (I, [P]),
    "ect_push_scheduler_wait": (I, [P, I]),
    "ect_push_scheduler_state": (I, [P, S, P]),
    "ect_push_scheduler_next": (I, [P, P]),
    "ect_push_scheduler_loaded": (I, [P, S]),
    "ect_push_scheduler_fail": (I, [P, S, S]),
    "ect_push_scheduler_cancel": (I, [P, S]),
    "ect_push_scheduler_stats": (None, [P, P]),
    "ect_push_producer_open_config": (I, [S, PP]),
    "ect_push_producer_reserve": (I, [P, P]),
    "ect_push_producer_stage": (I, [P, S, P, U64, P, P]),
    "ect_push_producer_flush": (I, [P]),
    "ect_push_producer_flush_poll": (I, [P, P, SZ, I, P]),
    "ect_push_producer_cancel": (I, [P, S]),
    "ect_push_producer_poll": (SZ, [P, P, SZ, I]),
    "ect_push_producer_pending": (SZ, [P]),
    "ect_push_producer_stats": (None, [P, P]),
    "ect_push_producer_close": (None, [P]),
    "ect_pull_producer_open_config": (I, [S, PP]),
    "ect_pull_producer_save": (I, [P, S, P, U64, ctypes.POINTER(U64), SZ, S, P, P]),
    "ect_pull_producer_flush": (I, [P, I]),
    "ect_pull_producer_port": (I, [P]),
    "ect_pull_producer_session_id": (S, [P]),
    "ect_pull_producer_stats": (None, [P, P]),
    "ect_pull_producer_close": (None, [P]),
    "ect_pull_scheduler_open_config": (I, [S, PP]),
    "ect_pull_scheduler_has": (I, [P, S, P]),
    "ect_pull_scheduler_poll": (I, [P]),
    "ect_pull_scheduler_foreach": (SZ, [P, FOREACH_FN, P]),
    "ect_pull_scheduler_forget": (None, [P, S]),
    "ect_pull_scheduler_stats": (None, [P, P]),
    "ect_pull_scheduler_close": (None, [P]),
    "ect_pull_consumer_open_config": (I, [S, PP]),
    "ect_pull_consumer_load": (I, [P, S, P, P]),
    "ect_pull_consumer_release": (I, [P, S]),
    "ect_pull_consumer_pool": (P, [P]),
    "ect_pull_consumer_stats": (None, [P, P]),
    "ect_pull_consumer_close": (None, [P]),
}


def _candidates() -> list[str]:
    out = []
    env = os.environ.get("ECT_LIBRARY")
    if env:
        return [env]  # an explicit choice is the only one tried
    repo = Path(__file__).resolve().parent.parent.parent
    build = repo / "build" / "libectransfer.so"
    if (repo / "include" / "ectransfer.h").exists() and build.exists():
        out.append(str(build))  # imported from a source tree that was built
    try:
        from . import _install  # written by `make install`

        out.append(_install.LIBRARY)
    except ImportError:
        pass
    found = ctypes.util.find_library("ectransfer")
    out.append(found or "libectransfer.so.0")
    return out


def _load() -> tuple[ctypes.CDLL, str]:
    tried = []
    for path in _candidates():
        try:
            dll = ctypes.CDLL(path)
        except OSError as e:
            tried.append(f"{path} ({e})")
            continue
        return dll, path
    raise LibraryNotFound(
        "libectransfer not found; set ECT_LIBRARY=/path/to/libectransfer.so, build the tree "
        "(make) or install it (make install). Tried: " + "; ".join(tried)
    )


def _check(dll: ctypes.CDLL, path: str) -> dict[str, int]:
    if not hasattr(dll, "ect_abi_version"):
        raise LibraryNotFound(f"{path} has no ect_abi_version: a library older than this binding")
    dll.ect_abi_version.restype = ctypes.c_int
    abi = dll.ect_abi_version()
    if abi != ABI_VERSION:
        raise LibraryNotFound(f"{path} speaks ABI {abi}, this binding ABI {ABI_VERSION}")
    dll.ect_sizeof.restype = ctypes.c_size_t
    dll.ect_sizeof.argtypes = [ctypes.c_char_p]
    sizes = {}
    for name, (mirror, exact) in _MIRRORS.items():
        size = dll.ect_sizeof(name.encode())
        ours = ctypes.sizeof(mirror)
        if size == 0 or size < ours or (exact and size != ours):
            raise LibraryNotFound(
                f"{path}: struct {name} is {size} bytes, this binding expects {ours}: rebuild "
                "the package and the library from the same version"
            )
        sizes[name] = size
    for fn, (res, args) in _PROTOS.items():
        f = getattr(dll, fn)
        f.restype = res
        f.argtypes = args
    return sizes


lib, LIBRARY_PATH = _load()
SIZES = _check(lib, LIBRARY_PATH)


def buffer_for(name: str, count: int = 1) -> ctypes.Array:
    """A zeroed buffer for `count` structs of the library's own size."""
    return (ctypes.c_char * (SIZES[name] * count))()


def struct_at(buf: ctypes.Array, name: str, index: int = 0):
    """The mirror of struct `name` at position `index` of buf (library stride)."""
    mirror = _MIRRORS[name][0]
    return mirror.from_buffer(buf, SIZES[name] * index)


def last_error() -> str:
    return (lib.ect_last_error() or b"").decode("utf-8", "replace")


def check(rc: int) -> int:
    """Raise Error for a negative return code; pass anything else through."""
    if rc < 0:
        raise Error(rc, last_error())
    return rc


def text(b: bytes) -> str:
    return b.decode("utf-8", "replace")


def enc(s: str, what: str) -> bytes:
    if not isinstance(s, str):
        raise Error(ECT_EINVAL, f"{what} must be a str, not {type(s).__name__}")
    b = s.encode("utf-8")
    if b"\0" in b:
        raise Error(ECT_EINVAL, f"{what} contains a NUL character")
    return b


def config_dict(config, what: str) -> dict:
    """A configuration (dict, JSON object text or None) as a new dict."""
    if isinstance(config, str):
        import json

        def pairs(kv):
            seen = {}
            for k, v in kv:
                if k in seen:
                    raise ValueError(f"duplicate key {k!r}")
                seen[k] = v
            return seen

        try:
            config = json.loads(config, object_pairs_hook=pairs)
        except ValueError as e:
            raise Error(ECT_EINVAL, f"{what} config: not valid JSON: {e}") from None
    if config is not None and not isinstance(config, dict):
        raise Error(ECT_EINVAL, f"{what} config: must be a dict or JSON object text")
    return dict(config or {})


class Handle:
    """What every role object shares: an owned C handle, closing exactly once
    (from any thread), a context manager, and a clear error after close."""

    _close_fn = None  # the ect_*_close function
    _what = "handle"

    def __init__(self):
        self._h = None
        self._lock = threading.RLock()

    def _open(self, open_fn, config: dict | str | None) -> None:
        import json

        if config is None:
            config = {}
        try:
            text_cfg = config if isinstance(config, str) else json.dumps(config)
        except (TypeError, ValueError) as e:
            raise Error(ECT_EINVAL, f"{self._what} config: not JSON-encodable: {e}") from None
        out = ctypes.c_void_p()
        check(open_fn(text_cfg.encode("utf-8"), ctypes.byref(out)))
        self._h = out.value
        _open_handles.add(self)

    def _handle(self) -> int:
        h = self._h
        if h is None:
            raise Error(ECT_ECLOSED, f"{self._what} is closed")
        return h

    @property
    def closed(self) -> bool:
        return self._h is None

    def close(self) -> None:
        """Closes the handle (idempotent; later calls raise ectransfer.Error ECT_ECLOSED)."""
        with self._lock:
            h, self._h = self._h, None
            if h is None:
                return
            self._before_close(h)
            type(self)._close_fn(h)
            _open_handles.discard(self)
            self._after_close()

    def _before_close(self, h) -> None:
        pass

    def _after_close(self) -> None:
        pass

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def __del__(self):
        try:
            self.close()
        except Exception:
            pass


import weakref  # noqa: E402
import atexit  # noqa: E402

_open_handles: "weakref.WeakSet[Handle]" = weakref.WeakSet()


@atexit.register
def _close_all() -> None:
    # C threads must not outlive the interpreter's teardown of ctypes.
    for h in list(_open_handles):
        try:
            h.close()
        except Exception:
            pass
