"""The push protocol (generation 2) from Python: producer, consumer shard, scheduler.

Each class opens its role from a configuration dict (or JSON text) with upstream's
``ec_transfer_config`` key names (``ec_ip``, ``ec_port``, ``ec_buffer_size``,
``tp_size``, ``dp_index``, ``control_timeout_s``, ``push_wait_timeout_s``, ...); a key
left out keeps the library's default, an unknown key or a wrong type raises
:class:`ectransfer.Error` naming it. One dict may configure every role of an instance.

Thread safety follows the library: a producer and a consumer shard may be used from
any thread; a scheduler from one thread at a time.
"""

from __future__ import annotations

import ctypes
import time
from dataclasses import dataclass
from typing import Any

from . import _device, _lib, _tensors
from ._lib import Error, check, enc, text, ECT_EINVAL, ECT_ENOTFOUND, ECT_ESTATE

# ect_push_state values
WAITING_EVENT, AVAILABLE, LOADING, READY, RESIDENT, UNAVAILABLE, EXPIRED, CANCELLED, FAILED = range(
    1, 10
)
STATE_NAMES = {
    1: "WAITING_EVENT",
    2: "AVAILABLE",
    3: "LOADING",
    4: "READY",
    5: "RESIDENT",
    6: "UNAVAILABLE",
    7: "EXPIRED",
    8: "CANCELLED",
    9: "FAILED",
}
_ARRIVED = (AVAILABLE, LOADING, READY, RESIDENT)


def consumer_address(addr: str) -> str:
    """"HOST:PORT" from a consumer address, accepting upstream's "tcp://HOST:PORT"."""
    if not isinstance(addr, str):
        raise Error(ECT_EINVAL, f"consumer must be a str, not {type(addr).__name__}")
    return addr[6:] if addr.startswith("tcp://") else addr


@dataclass(frozen=True)
class Result:
    """How one pushed transfer ended.

    ok: done on every shard of the consumer. cancelled: by :meth:`PushProducer.cancel`
    or by the consumer. error: why not (empty when ok). code: the library's status
    (0, ``ECT_ECANCELED`` or an error code). transport: the data plane the bytes went
    over, "" when nothing moved (every shard already held the item: dedup).
    """

    transfer_id: str
    ok: bool
    error: str
    code: int = 0
    cancelled: bool = False
    latency_s: float = 0.0
    shards: int = 0
    transport: str = ""


class PushProducer(_lib.Handle):
    """The encoder side: pushes tensors into consumer instances' reservations.

    A step: :meth:`push` (or :meth:`reserve` then :meth:`stage`) queues items, :meth:`flush`
    sends them (one reserve_batch, write and complete_batch per shard for the whole
    step), :meth:`poll` reports how each ended. Nothing here waits on the network
    except poll, for as long as asked.
    """

    _close_fn = staticmethod(lambda h: _lib.lib.ect_push_producer_close(h))
    _what = "PushProducer"

    def __init__(self, config: dict | str | None = None):
        super().__init__()
        self._open(_lib.lib.ect_push_producer_open_config, config)
        self._results = _lib.buffer_for("ect_push_result", 256)

    def push(
        self,
        transfer_id: str,
        consumer: str,
        mm_hash: str,
        tensor: Any,
        *,
        dtype: Any = None,
        shape: Any = None,
    ) -> None:
        """Queues tensor for transfer_id, to the consumer instance whose TP rank 0 serves
        control requests at consumer ("HOST:PORT" or "tcp://HOST:PORT").

        tensor: a torch.Tensor, a numpy array or any buffer: its bytes are copied into
        the producer's staging memory before this returns. A CUDA tensor (or any CUDA
        array exposing __cuda_array_interface__) is not copied here: the library
        borrows it (after this call synchronized the current stream) and reads it on
        the device, with no host copy over shm into a CUDA pool and one device-to-host
        copy over tcp; it must not be changed in place until poll() reported the
        transfer (the binding keeps it alive until then). Where the library cannot
        reach the CUDA driver a CUDA tensor is copied to host memory first.
        dtype= / shape= describe raw bytes (see _tensors).
        Raises Error: ECT_EINVAL (bad argument, naming it), ECT_EEXIST (transfer_id
        already pushed), ECT_EFULL (staging memory full), ECT_ECLOSED.
        """
        src = _tensors.source(tensor, dtype, shape)
        self._reserve(transfer_id, consumer, mm_hash, src.shape, src.dtype, src.nbytes,
                      src.address, src)

    def reserve(
        self, transfer_id: str, consumer: str, mm_hash: str, shape: Any, dtype: Any
    ) -> None:
        """Queues an item whose tensor is not computed yet: its reservations go out with
        the next flush, its bytes once :meth:`stage` gave them (same errors as push)."""
        name = _tensors.dtype_name(dtype)
        shp = tuple(int(d) for d in shape)
        nbytes = _tensors.element_size(name)
        for d in shp:
            if d < 0:
                raise Error(ECT_EINVAL, f"shape {shp} has a negative dimension")
            nbytes *= d
        self._reserve(transfer_id, consumer, mm_hash, shp, name, nbytes, None)

    def _reserve(self, transfer_id, consumer, mm_hash, shape, dtype, nbytes, address, src=None):
        if len(shape) > _lib.NDIM_MAX:
            raise Error(ECT_EINVAL, f"shape {shape} has more than {_lib.NDIM_MAX} dimensions")
        dims = (_lib.U64 * max(1, len(shape)))(*shape)
        key = _device.borrow(src.keep) if src is not None and src.device is not None else 0
        item = _lib.PushItem(
            transfer_id=enc(transfer_id, "transfer_id"),
            consumer=enc(consumer_address(consumer), "consumer"),
            mm_hash=enc(mm_hash, "mm_hash"),
            shape=dims,
            ndim=len(shape),
            dtype=dtype.encode(),
            nbytes=nbytes,
            data=address,
            release=_device.PUSH_RELEASE_PTR if key else None,
            release_user=key or None,
        )
        try:
            check(_lib.lib.ect_push_producer_reserve(self._handle(), ctypes.byref(item)))
        except BaseException:
            _device.unborrow(key)  # the library never calls release after a failure
            raise

    def stage(self, transfer_id: str, tensor: Any, *, dtype: Any = None, shape: Any = None) -> None:
        """Gives the bytes of an item queued with :meth:`reserve` (copied before this
        returns; a CUDA source is borrowed as in :meth:`push`); they are written with
        the next flush. Raises Error: ECT_ENOTFOUND (unknown transfer_id), ECT_ESTATE
        (already staged or finished), ECT_EINVAL (size differs from the reservation's),
        ECT_EFULL."""
        src = _tensors.source(tensor, dtype, shape)
        tid = enc(transfer_id, "transfer_id")
        key = _device.borrow(src.keep) if src.device is not None else 0
        try:
            check(
                _lib.lib.ect_push_producer_stage(
                    self._handle(), tid, src.address, src.nbytes,
                    _device.PUSH_RELEASE_PTR if key else None, key or None,
                )
            )
        except BaseException:
            _device.unborrow(key)
            raise

    def flush(self) -> int:
        """Ends the step: hands every queued item and stage to the dispatcher. Returns
        how many items were handed over."""
        return check(_lib.lib.ect_push_producer_flush(self._handle()))

    def flush_poll(self, timeout: float) -> tuple[int, list[Result]]:
        """flush, then poll(timeout), in one call: for a caller that waits for its step
        right away. A lone step (nothing else in flight) then runs on this thread inside
        the call, with no thread wake-up in its path; its release runs here too.
        Returns (items handed over, results)."""
        h = self._handle()
        polled = ctypes.c_size_t(0)
        n = check(
            _lib.lib.ect_push_producer_flush_poll(
                h, self._results, 256, max(0, int(timeout * 1000)), ctypes.byref(polled)
            )
        )
        return n, self._results_out(polled.value)

    def cancel(self, transfer_id: str) -> bool:
        """Cancels a transfer (reported by poll as cancelled unless it finished first).
        Returns False when it is unknown or already finished."""
        rc = _lib.lib.ect_push_producer_cancel(self._handle(), enc(transfer_id, "transfer_id"))
        if rc == ECT_ENOTFOUND:
            return False
        check(rc)
        return True

    def pending(self) -> int:
        """Items queued or in flight that did not finish yet."""
        return int(_lib.lib.ect_push_producer_pending(self._handle()))

    def poll(self, timeout: float | None = None) -> list[Result]:
        """Finished transfers, each reported once.

        timeout: seconds to wait for at least one; 0 does not wait; None waits as long
        as some item is still pending (and returns [] at once when none is).
        """
        h = self._handle()
        if timeout is not None:
            return self._poll_once(h, max(0, int(timeout * 1000)))
        while True:
            out = self._poll_once(h, 100)
            if out or _lib.lib.ect_push_producer_pending(h) == 0:
                return out + (self._poll_once(h, 0) if not out else [])

    def _poll_once(self, h, timeout_ms: int) -> list[Result]:
        return self._results_out(_lib.lib.ect_push_producer_poll(h, self._results, 256, timeout_ms))

    def _results_out(self, n: int) -> list[Result]:
        out = []
        for i in range(n):
            r = _lib.struct_at(self._results, "ect_push_result", i)
            out.append(
                Result(
                    transfer_id=text(r.transfer_id),
                    ok=r.status == 0,
                    error="" if r.status == 0 else text(r.error) or _lib.Error(r.status).sentence,
                    code=r.status,
                    cancelled=r.status == _lib.ECT_ECANCELED,
                    latency_s=r.latency_ns / 1e9,
                    shards=r.shards,
                    transport=text(r.transport),
                )
            )
        return out

    def stats(self) -> dict[str, int]:
        """The producer's counters since open (steps, done, failed, ...)."""
        buf = _lib.buffer_for("ect_push_producer_stat")
        _lib.lib.ect_push_producer_stats(self._handle(), buf)
        st = _lib.struct_at(buf, "ect_push_producer_stat")
        return {n: int(getattr(st, n)) for n, _ in _lib.PushProducerStat._fields_}


class PushConsumer(_lib.Handle):
    """One receiving shard (TP rank) of a consumer instance.

    Producers reserve, write and complete into its pool; :meth:`take` returns an item
    that arrived as a zero-copy tensor of the reserved shape and dtype, valid until
    :meth:`release` (see ``_tensors.PoolMap.view`` for exactly what release and close
    guarantee). ``address`` is the "HOST:PORT" where producers push (rank 0's).

    With ``ec_buffer_device`` "cuda" (torch's current device) or "cuda:N" the pool is
    GPU memory the binding allocates, and :meth:`take` returns zero-copy CUDA tensors
    (a :class:`DeviceArray` without a CUDA torch); see ``_device``.
    """

    _close_fn = staticmethod(lambda h: _lib.lib.ect_push_consumer_close(h))
    _what = "PushConsumer"

    def __init__(self, config: dict | str | None = None, tp_rank: int = 0):
        super().__init__()
        cfg = _with_rank(config, tp_rank)
        pool = _device.pool_for(cfg)  # a CUDA pool: the binding's memory (pool_memory)
        self._open(_lib.lib.ect_push_consumer_open_config, cfg)
        try:
            self._map = pool or _tensors.PoolMap(_lib.lib.ect_push_consumer_pool(self._h),
                                                 "PushConsumer")
        except Exception:
            self.close()
            raise
        self.device = f"cuda:{pool.device}" if pool is not None else "cpu"
        host = cfg.get("ec_ip", "127.0.0.1") if isinstance(cfg, dict) else "127.0.0.1"
        port = _lib.lib.ect_push_consumer_port(self._h)
        rank = cfg.get("tp_rank", 0) if isinstance(cfg, dict) else 0
        self._host = host
        self.port = port
        self.address = f"[{host}]:{port - rank}" if ":" in host else f"{host}:{port - rank}"
        self.event_port = _lib.lib.ect_push_consumer_event_port(self._h)
        self.session = text(_lib.lib.ect_push_consumer_session(self._h))

    def take(self, transfer_id: str, *, out: str | None = None, raw: bool = False):
        """The READY item transfer_id as a zero-copy tensor (a torch.Tensor; a read-only
        numpy array when torch is absent, or with out="numpy"; out="memoryview" for the
        flat bytes). numpy has no bfloat16 / float8: such items come as uint8 with the
        element's bytes along a new last axis. raw=True gives the flat bytes as uint8.
        Each take holds its own lease on the bytes; a take that raises holds none and
        leaves the transfer as it was (it can be taken again).
        Raises Error: ECT_ENOTFOUND (unknown transfer_id, or released already),
        ECT_ESTATE (not arrived, cancelled or expired), ECT_ECLOSED."""
        h = self._handle()
        buf = _lib.buffer_for("ect_push_view")
        tid = enc(transfer_id, "transfer_id")
        check(_lib.lib.ect_push_consumer_take(h, tid, buf))
        v = _lib.struct_at(buf, "ect_push_view")
        # What the view gives back is its lease only: the transfer ends with release()
        # (ect_push_consumer_finish), never because a view was refused or collected.
        v.transfer_id = b""
        shape = tuple(v.shape[: v.ndim])
        lib, handle_owner = _lib.lib, self

        def give_back(buf=buf):
            h2 = handle_owner._h
            if h2 is not None:
                lib.ect_push_consumer_release(h2, buf)

        # the view owns the lease from here: it gives it back exactly once
        return self._map.view(transfer_id, v.data, v.nbytes, shape, text(v.dtype), out, raw,
                              give_back)

    def release(self, transfer_id: str) -> None:
        """The engine is done with transfer_id: ends it on this shard now (its reservation
        is finished, so the pool never waits for the scheduler's cancel; a later take
        raises ECT_ENOTFOUND) and ends what take(transfer_id) handed out: the tensors are
        emptied in place and each lease returns once no tensor shares its bytes (views
        still alive elsewhere keep them). The bytes stay resident, so a later push of the
        same mm_hash is answered without moving them. Raises Error(ECT_ENOTFOUND) if
        nothing of transfer_id is taken (see :meth:`finish` for items never taken)."""
        h = self._handle()
        tid = enc(transfer_id, "transfer_id")
        if transfer_id not in self._map.handed:
            raise Error(ECT_ENOTFOUND, f"transfer_id {transfer_id!r} is not taken")
        self._map.forget(transfer_id)
        self._finish(h, tid)

    def finish(self, transfer_id: str) -> bool:
        """Ends the delivered transfer transfer_id on this shard without taking it (the
        engine holds its content already) and without touching views of it. Returns
        False when there was nothing to end: unknown, not arrived, or ended already
        (released, cancelled, expired)."""
        return self._finish(self._handle(), enc(transfer_id, "transfer_id"))

    @staticmethod
    def _finish(h, tid: bytes) -> bool:
        rc = _lib.lib.ect_push_consumer_finish(h, tid)
        if rc in (ECT_ENOTFOUND, ECT_ESTATE):
            return False  # the scheduler's cancel or the TTL ended it first
        check(rc)
        return True

    def taken(self) -> list[str]:
        """Transfer ids taken, not released, with a view still alive."""
        m = self._map
        return m.live() if m is not None else []

    def evict(self, max_items: int = 1 << 30) -> int:
        """Frees up to max_items unleased resident items; returns how many."""
        h = self._handle()
        return int(_lib.lib.ect_push_consumer_evict(h, max_items))

    def stats(self) -> dict[str, int]:
        h = self._handle()
        buf = _lib.buffer_for("ect_push_consumer_stat")
        _lib.lib.ect_push_consumer_stats(h, buf)
        st = _lib.struct_at(buf, "ect_push_consumer_stat")
        return {n: int(getattr(st, n)) for n, _ in _lib.PushConsumerStat._fields_}

    def _before_close(self, h) -> None:
        m = getattr(self, "_map", None)
        if m is not None:
            m.close()

    def _after_close(self) -> None:
        self._map = None  # the pool's memory now lives only as long as views of it


def _with_rank(config, tp_rank):
    cfg = _lib.config_dict(config, "push consumer")
    if tp_rank is not None:
        cfg["tp_rank"] = int(tp_rank)
    return cfg


@dataclass(frozen=True)
class SchedItem:
    """What the scheduler knows of one transfer."""

    transfer_id: str
    state: str
    retryable: bool
    reported: int
    mm_hash: str
    nbytes: int
    shape: tuple[int, ...]
    dtype: str
    error: str

    @property
    def arrived(self) -> bool:
        """True once every shard reported it (AVAILABLE, LOADING, READY, RESIDENT)."""
        return self.state in ("AVAILABLE", "LOADING", "READY", "RESIDENT")


def _sched_item(raw) -> SchedItem:
    return SchedItem(
        transfer_id=text(raw.transfer_id),
        state=STATE_NAMES.get(raw.state, "?"),
        retryable=bool(raw.retryable),
        reported=int(raw.reported),
        mm_hash=text(raw.mm_hash),
        nbytes=int(raw.nbytes),
        shape=tuple(raw.shape[: raw.ndim]),
        dtype=text(raw.dtype),
        error=text(raw.error),
    )


class PushScheduler(_lib.Handle):
    """The consumer instance's scheduler: learns which transfers arrived on every shard.

    :meth:`expect` starts a transfer's push wait (``push_wait_timeout_s``); :meth:`poll`
    returns the ids that arrived on every shard since the last poll (moved to LOADING);
    :meth:`loaded` marks one taken; :meth:`cancel` ends one on every shard. Never blocks
    on the network. Use from one thread at a time.
    """

    _close_fn = staticmethod(lambda h: _lib.lib.ect_push_scheduler_close(h))
    _what = "PushScheduler"

    def __init__(self, config: dict | str | None = None):
        super().__init__()
        self._open(_lib.lib.ect_push_scheduler_open_config, config)
        self._item = _lib.buffer_for("ect_push_sched_item")

    def expect(self, transfer_id: str, mm_hash: str | None = None) -> None:
        """Waits for transfer_id (its push wait starts now). Raises Error(ECT_EEXIST) when
        it is already expected or finished."""
        check(
            _lib.lib.ect_push_scheduler_expect(
                self._handle(),
                enc(transfer_id, "transfer_id"),
                enc(mm_hash, "mm_hash") if mm_hash is not None else None,
            )
        )

    def poll(self, timeout: float = 0) -> list[str]:
        """Drains readiness events and returns the transfer ids that arrived on every shard
        since the last poll; they move to LOADING.

        timeout: seconds to sleep for an event when none has arrived yet (0, the default,
        does not block; the GIL is released while it waits)."""
        if timeout < 0:
            raise ValueError("timeout must be >= 0")
        h = self._handle()
        if timeout:
            ms = min(int(timeout * 1000), 2**31 - 1)
            check(_lib.lib.ect_push_scheduler_wait(h, ms))
        else:
            check(_lib.lib.ect_push_scheduler_poll(h))
        out = []
        while _lib.lib.ect_push_scheduler_next(h, self._item) == 0:
            it = _sched_item(_lib.struct_at(self._item, "ect_push_sched_item"))
            out.append(it.transfer_id)
        return out

    def is_ready(self, transfer_id: str) -> bool:
        """True if transfer_id arrived on every shard (drains events first)."""
        h = self._handle()
        check(_lib.lib.ect_push_scheduler_poll(h))
        st = self.state(transfer_id)
        return st is not None and st.arrived

    def state(self, transfer_id: str) -> SchedItem | None:
        """What the scheduler knows of transfer_id, or None if nothing."""
        rc = _lib.lib.ect_push_scheduler_state(
            self._handle(), enc(transfer_id, "transfer_id"), self._item
        )
        if rc == ECT_ENOTFOUND:
            return None
        check(rc)
        return _sched_item(_lib.struct_at(self._item, "ect_push_sched_item"))

    def loaded(self, transfer_id: str) -> None:
        """The engine took the item (LOADING -> RESIDENT)."""
        check(_lib.lib.ect_push_scheduler_loaded(self._handle(), enc(transfer_id, "transfer_id")))

    def fail(self, transfer_id: str, reason: str) -> None:
        """A load went wrong: FAILED, and cancelled on every shard."""
        check(
            _lib.lib.ect_push_scheduler_fail(
                self._handle(), enc(transfer_id, "transfer_id"), enc(reason, "reason")
            )
        )

    def cancel(self, transfer_id: str) -> bool:
        """Ends transfer_id on every shard (also before it arrived, once expected: a later
        push of it is answered cancelled). Idempotent on finished transfers. Returns False
        when the scheduler does not know transfer_id (then nothing is sent)."""
        rc = _lib.lib.ect_push_scheduler_cancel(self._handle(), enc(transfer_id, "transfer_id"))
        if rc == ECT_ENOTFOUND:
            return False
        check(rc)
        return True

    def stats(self) -> dict[str, int]:
        buf = _lib.buffer_for("ect_push_scheduler_stat")
        _lib.lib.ect_push_scheduler_stats(self._handle(), buf)
        st = _lib.struct_at(buf, "ect_push_scheduler_stat")
        return {n: int(getattr(st, n)) for n, _ in _lib.PushSchedulerStat._fields_}

    def wait_discovered(self, timeout: float = 60.0) -> bool:
        """Waits until the scheduler discovered every shard (events can reach it)."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.stats()["shards"]:
                return True
            time.sleep(0.01)
        return False
