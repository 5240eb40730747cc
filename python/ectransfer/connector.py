"""An engine-neutral encoder-cache connector core for the push protocol.

An inference engine that runs its encoder in one instance (the producer) and its
language model in others (consumers) drives two objects per instance: a
:class:`SchedulerCore` in its scheduler process and a :class:`WorkerCore` in each worker
process (one per TP rank). ``ectransfer.vllm`` is the thin class vLLM loads; another
engine can drive these cores the same way. Nothing here imports an engine.

Per engine step (vLLM's order):

scheduler   ensure_cache_available / update_state_after_alloc per request
            -> build_connector_meta(step)                      -> StepMetadata
worker      start_save_caches(meta)   producer: reserve every push of the step
            start_load_caches(meta, encoder_cache)  consumer: zero-copy tensors in
            (the encoder runs) save_caches(encoder_cache, mm_hash)  producer: stage
            get_finished(finished_request_ids)    producer: cancel unstaged pushes
            build_connector_worker_meta()        -> WorkerReport (flushes the step)
scheduler   update_connector_output(report aggregated over the ranks)

Requests are read duck-typed, with vLLM's attribute names: ``request_id``,
``mm_features[i].identifier`` (the mm_hash) and ``.mm_position`` (``offset``,
``length``), ``ec_transfer_params`` (the proxy's: ``{"consumer_zmq": "tcp://ip:port",
"ec_items": [{"transfer_id", "mm_hash"?}]}``), and ``get_num_encoder_embeds(i)``.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable

from . import _lib
from .push import PushConsumer, PushProducer, PushScheduler
from ._lib import Error

log = logging.getLogger("ectransfer.connector")

# Library configuration keys the connector forwards from ec_connector_extra_config
# (beyond those it derives itself), by role.
_FORWARD = {
    "consumer": ("transport", "xport_listen", "ttl_ms", "pending_grace_ms", "reap_interval_ms",
                 "max_events", "max_tombstones", "advertise", "data_port", "max_conns",
                 "max_conns_per_peer"),
    "scheduler": ("ttl_ms", "max_tombstones", "cancel_attempts", "min_drain_interval_ms"),
    "producer": ("transport", "refresh_after_ms", "input_wait_ms", "ttl_ms", "max_tombstones",
                 "connect_timeout_ms", "io_timeout_ms", "listen_host", "down_backoff_ms",
                 "down_backoff_max_ms"),
}
_KNOWN_EXTRA = {"control_timeout_s", "push_wait_timeout_s"} | {k for v in _FORWARD.values() for k in v}


@dataclass
class ConnectorConfig:
    """Settings read from upstream's ec_transfer_config (ec_ip, ec_port, ec_buffer_size,
    ec_buffer_device, ec_role) and ec_connector_extra_config (control_timeout_s,
    push_wait_timeout_s, and library keys such as transport), with upstream's defaults."""

    is_producer: bool
    is_consumer: bool
    ec_ip: str = "127.0.0.1"
    ec_port: int = 14579
    ec_buffer_size: int = 1_000_000_000
    buffer_device: str = "cuda"
    control_timeout_s: float = 30.0
    push_wait_timeout_s: float = 60.0
    extra: dict = field(default_factory=dict)

    @classmethod
    def from_values(cls, role: str | None, ec_ip=None, ec_port=None, ec_buffer_size=None,
                    ec_buffer_device=None, extra: dict | None = None) -> "ConnectorConfig":
        if role not in ("ec_producer", "ec_consumer", "ec_both"):
            raise ValueError(f"ec_role must be ec_producer, ec_consumer or ec_both, not {role!r}")
        extra = dict(extra or {})
        for k in sorted(set(extra) - _KNOWN_EXTRA):
            log.warning("ec_connector_extra_config key %r is not one ectransfer reads", k)
        size = 1_000_000_000 if ec_buffer_size is None else ec_buffer_size
        if (isinstance(size, bool) or not isinstance(size, (int, float))
                or not float(size).is_integer() or size <= 0):
            raise ValueError(f"ec_buffer_size must be a positive integer, not {size!r}")

        def seconds(name, default):
            v = extra.get(name, default)
            try:
                s = float(v) if not isinstance(v, bool) else float("nan")
            except (TypeError, ValueError):
                s = float("nan")
            if not s > 0 or s == float("inf"):
                raise ValueError(f"{name} must be a number of seconds > 0, not {v!r}")
            return s

        return cls(
            is_producer=role in ("ec_producer", "ec_both"),
            is_consumer=role in ("ec_consumer", "ec_both"),
            ec_ip=str(ec_ip or "127.0.0.1"),
            ec_port=int(14579 if ec_port is None else ec_port),
            ec_buffer_size=int(size),
            buffer_device=str(ec_buffer_device or "cuda").strip().lower() or "cuda",
            control_timeout_s=seconds("control_timeout_s", 30),
            push_wait_timeout_s=seconds("push_wait_timeout_s", 60),
            extra={k: v for k, v in extra.items() if k in _KNOWN_EXTRA},
        )

    def library(self, role: str, **values) -> dict:
        """The library configuration (JSON object) of one role."""
        cfg = {k: self.extra[k] for k in _FORWARD[role] if k in self.extra}
        cfg.update(values)
        return cfg

    def control_port(self, dp_index: int, tp_size: int) -> int:
        """TP rank 0's control port of DP replica dp_index."""
        return self.ec_port + dp_index * tp_size


@dataclass
class PushSpec:
    """A push the producer's worker starts this step (the consumer named by the proxy)."""

    transfer_id: str
    mm_hash: str
    consumer: str  # "HOST:PORT"
    request_id: str
    shape: tuple[int, ...] | None = None  # None: known only when the encoder ran
    dtype: str | None = None


@dataclass
class LoadSpec:
    """An item that arrived on every shard, to be taken into the encoder cache."""

    transfer_id: str
    mm_hash: str
    shape: tuple[int, ...]
    dtype: str
    nbytes: int


@dataclass
class StepMetadata:
    """Scheduler -> workers, once per step."""

    pushes: list = field(default_factory=list)  # list[PushSpec]
    loads: list = field(default_factory=list)  # list[LoadSpec]
    freed: list = field(default_factory=list)  # mm_hashes the engine freed


@dataclass
class WorkerReport:
    """Workers -> scheduler, once per step; aggregated over the TP ranks."""

    loaded: set = field(default_factory=set)  # transfer ids taken on this rank
    failed_loads: set = field(default_factory=set)  # transfer ids
    failed_saves: set = field(default_factory=set)  # request ids whose push failed
    pending_saves: bool = False
    pending_loads: bool = False

    def aggregate(self, other: "WorkerReport") -> "WorkerReport":
        # Every TP rank reads the item from its own shard: it is loaded only where
        # all ranks have it.
        return type(self)(
            loaded=self.loaded & other.loaded,
            failed_loads=self.failed_loads | other.failed_loads,
            failed_saves=self.failed_saves | other.failed_saves,
            pending_saves=self.pending_saves or other.pending_saves,
            pending_loads=self.pending_loads or other.pending_loads,
        )


def request_transfer_id(request: Any, index: int) -> str | None:
    """The transfer id the proxy gave feature `index` of `request`: the ec_items entry
    at that position (if its mm_hash, when given, matches), else the one naming its
    mm_hash; None if there is none."""
    params = getattr(request, "ec_transfer_params", None) or {}
    items = params.get("ec_items") or []
    mm_hash = request.mm_features[index].identifier
    if index < len(items):
        it = items[index] or {}
        if it.get("mm_hash") in (None, mm_hash) and it.get("transfer_id"):
            return str(it["transfer_id"])
    for it in items:
        if it and it.get("mm_hash") == mm_hash and it.get("transfer_id"):
            return str(it["transfer_id"])
    return None


def _needs(feature: Any, num_computed_tokens: int) -> bool:
    pos = feature.mm_position
    return pos.offset + pos.length > num_computed_tokens


@dataclass
class _Wait:
    transfer_id: str
    mm_hash: str
    requests: set
    state: str = "waiting"  # waiting, arrived, dispatched, ready, failed
    spec: LoadSpec | None = None


class SchedulerCore:
    """The scheduler-process half. Consumer: expects transfers, drains readiness (never
    blocking), dispatches loads and cancels on request end. Producer: turns requests
    into push specs for its worker."""

    def __init__(
        self,
        config: ConnectorConfig,
        *,
        tp_size: int = 1,
        dp_index: int = 0,
        push_shape: Callable[[Any, int], tuple[tuple[int, ...], str] | None] | None = None,
        metadata_cls: type = StepMetadata,
    ):
        self.config = config
        self._push_shape = push_shape
        self._metadata_cls = metadata_cls
        self._sched: PushScheduler | None = None
        if config.is_consumer:
            self._sched = PushScheduler(
                config.library(
                    "scheduler",
                    ec_ip=config.ec_ip,
                    ec_port=config.ec_port,
                    dp_index=dp_index,
                    tp_size=tp_size,
                    push_wait_timeout_s=config.push_wait_timeout_s,
                    control_timeout_s=config.control_timeout_s,
                )
            )
        self._local: set[str] = set()  # mm_hashes in the engine's encoder cache
        self._waits: dict[str, _Wait] = {}
        self._by_hash: dict[str, set] = {}  # mm_hash -> transfer ids in _waits
        self._sweep_at = 0.0
        self._to_dispatch: list[LoadSpec] = []
        self._unavailable: set[str] = set()
        self._pushes: dict[str, PushSpec] = {}
        self._prepared: set[str] = set()
        self._pending_saves = False
        self._failed_saves: set[str] = set()
        self._unresolved = 0

    # -- consumer side

    def _drain(self) -> None:
        if self._sched is None:
            return
        for tid in self._sched.poll():
            w = self._waits.get(tid)
            if w is None:  # cancelled meanwhile: nothing needs it
                self._sched.cancel(tid)
                continue
            st = self._sched.state(tid)
            w.state = "arrived"
            w.spec = LoadSpec(tid, w.mm_hash, st.shape, st.dtype, st.nbytes)
        # Transfers that ended without arriving (push wait over, abandoned by the
        # producer): looked up at most every 50 ms, so a step with many waiting
        # requests costs one sweep, not one per request.
        now = time.monotonic()
        if now < self._sweep_at:
            return
        self._sweep_at = now + 0.05
        for w in list(self._waits.values()):
            if w.state != "waiting":
                continue
            st = self._sched.state(w.transfer_id)
            if st is not None and st.state in ("UNAVAILABLE", "EXPIRED", "FAILED", "CANCELLED"):
                w.state = "failed"
                self._unavailable |= w.requests
                log.warning("transfer %s (mm_hash %s) %s: %s", w.transfer_id, w.mm_hash,
                            st.state.lower(), st.error)

    def _transfer_id(self, request: Any, index: int, where: str) -> str:
        tid = request_transfer_id(request, index)
        if tid is None:
            self._unresolved += 1
            if self._unresolved <= 5 or self._unresolved % 1000 == 0:
                log.warning("request %s item %d: no transfer_id in ec_transfer_params (%s); "
                            "using %s:%d", request.request_id, index, where,
                            request.request_id, index)
            tid = f"{request.request_id}:{index}"
        return tid

    def has_cache_item(self, identifier: str) -> bool:
        """Consumer: the item arrived (or is loaded); never blocks."""
        if self._sched is None:
            return False
        self._drain()
        return any(self._waits[t].state in ("arrived", "dispatched", "ready")
                   for t in self._by_hash.get(identifier, ()))

    def ensure_cache_available(self, request: Any, num_computed_tokens: int) -> bool:
        """False while an item the request needs is still in transit (defer it)."""
        if self.config.is_producer:
            for i, f in enumerate(request.mm_features):
                if _needs(f, num_computed_tokens):
                    self._prepare_push(request, i)
        if self._sched is None:
            return True
        self._drain()
        ready = True
        for i, f in enumerate(request.mm_features):
            if not _needs(f, num_computed_tokens) or f.identifier in self._local:
                continue
            tid = self._transfer_id(request, i, "ensure_cache_available")
            w = self._waits.get(tid)
            if w is None:
                try:
                    self._sched.expect(tid, f.identifier)
                except Error as e:
                    if e.code != _lib.ECT_EEXIST:
                        raise
                w = self._waits[tid] = _Wait(tid, f.identifier, set())
                self._by_hash.setdefault(f.identifier, set()).add(tid)
                self._drain()  # it may have arrived already (the shards keep early items)
            w.requests.add(request.request_id)
            if w.state == "arrived":
                self._to_dispatch.append(w.spec)
                w.state = "dispatched"
            if w.state != "ready":
                ready = False
        return ready

    def take_unavailable_requests(self) -> set[str]:
        """Requests to fail with a retryable error: an item never arrived in
        push_wait_timeout_s, a load failed, or (producer) a push failed."""
        out = self._unavailable | self._failed_saves
        self._unavailable, self._failed_saves = set(), set()
        return out

    # -- producer side

    def _prepare_push(self, request: Any, index: int) -> None:
        params = getattr(request, "ec_transfer_params", None) or {}
        consumer = params.get("consumer_zmq")
        if not consumer:
            return
        tid = self._transfer_id(request, index, "push")
        if tid in self._prepared:
            return
        shape = dtype = None
        if self._push_shape is not None:
            got = self._push_shape(request, index)
            if got is not None:
                shape, dtype = tuple(int(d) for d in got[0]), str(got[1])
        addr = str(consumer)
        self._pushes[tid] = PushSpec(tid, request.mm_features[index].identifier,
                                     addr[6:] if addr.startswith("tcp://") else addr,
                                     request.request_id, shape, dtype)
        self._prepared.add(tid)

    # -- both

    def update_state_after_alloc(self, request: Any, index: int) -> None:
        self._local.add(request.mm_features[index].identifier)
        if self.config.is_producer:
            self._prepare_push(request, index)

    def build_connector_meta(self, scheduler_output: Any):
        freed = list(getattr(scheduler_output, "free_encoder_mm_hashes", None) or [])
        for h in freed:
            self._local.discard(h)
        meta = self._metadata_cls(pushes=list(self._pushes.values()), loads=self._to_dispatch,
                                  freed=freed)
        self._pushes = {}
        self._to_dispatch = []
        return meta

    def update_connector_output(self, report: Any) -> None:
        if not isinstance(report, WorkerReport):
            return
        for tid in report.loaded:
            w = self._waits.get(tid)
            if w is not None and w.state == "dispatched":
                w.state = "ready"
                self._sched.loaded(tid)
        for tid in report.failed_loads:
            w = self._waits.get(tid)
            if w is not None and w.state in ("dispatched", "arrived"):
                w.state = "failed"
                self._unavailable |= w.requests
                self._sched.fail(tid, "a worker could not take it")
        self._pending_saves = report.pending_saves
        self._failed_saves |= report.failed_saves

    def has_pending_push_work(self) -> bool:
        """Keep the engine stepping: pushes not finished, or loads not reported."""
        return (self._pending_saves or bool(self._pushes)
                or any(w.state == "dispatched" for w in self._waits.values()))

    def request_finished(self, request: Any) -> tuple[bool, dict | None]:
        """Consumer: the request's transfers end on every shard (before arrival too: a
        later push of them is refused). Producer: returns the request's items."""
        if self._sched is not None:
            for i, f in enumerate(request.mm_features):
                tid = self._transfer_id(request, i, "request_finished")
                w = self._waits.get(tid)
                if w is not None:
                    w.requests.discard(request.request_id)
                    if w.requests:
                        continue  # another request still needs it
                    del self._waits[tid]
                    tids = self._by_hash.get(w.mm_hash, set())
                    tids.discard(tid)
                    if not tids:
                        self._by_hash.pop(w.mm_hash, None)
                else:
                    try:  # never expected: expect it so the cancel reaches every shard
                        self._sched.expect(tid, f.identifier)
                    except Error as e:
                        if e.code != _lib.ECT_EEXIST:
                            raise
                self._sched.cancel(tid)
        if not self.config.is_producer:
            return False, None
        items = []
        for i, f in enumerate(request.mm_features):
            tid = request_transfer_id(request, i) or f"{request.request_id}:{i}"
            self._prepared.discard(tid)
            items.append({"mm_hash": f.identifier, "transfer_id": tid})
        return False, ({"ec_items": items} if items else None)

    def shutdown(self) -> None:
        if self._sched is not None:
            self._sched.close()


class WorkerCore:
    """The worker-process half, one per TP rank. Consumer: one shard of the instance
    (its control port is ec_port + dp_index x tp_size + tp_rank) whose arrived items
    go into the encoder cache as zero-copy tensors: with ec_buffer_device "cuda" the
    shard's pool lives on the worker's GPU (producers write there: CUDA IPC over shm, a
    pinned bounce ring over tcp), "cpu" keeps it in host memory. Each item's transfer
    ends on the shard as soon as the engine frees it (or at once when the cache holds
    its content already), so the pool never waits for the scheduler's cancels.
    Producer: pushes the encoder's outputs (CUDA ones straight from the device)."""

    def __init__(
        self,
        config: ConnectorConfig,
        *,
        tp_rank: int = 0,
        tp_size: int = 1,
        dp_index: int = 0,
        report_cls: type = WorkerReport,
    ):
        self.config = config
        self.tp_rank = tp_rank
        self._report_cls = report_cls
        self._shard: PushConsumer | None = None
        self._producer: PushProducer | None = None
        self._copy_to = None  # the engine's device when the pool cannot live there
        if config.is_consumer:
            device = self._engine_device(config.buffer_device)
            lib_cfg = config.library(
                "consumer",
                ec_ip=config.ec_ip,
                ec_port=config.ec_port,
                tp_size=tp_size,
                dp_index=dp_index,
                ec_buffer_size=config.ec_buffer_size,
            )
            if device is not None and device.type == "cuda":
                import torch

                index = device.index if device.index is not None else torch.cuda.current_device()
                try:
                    self._shard = PushConsumer(dict(lib_cfg, ec_buffer_device=f"cuda:{index}"),
                                               tp_rank=tp_rank)
                except Error as e:
                    if e.code != _lib.ECT_ENOTSUP:
                        raise
                    log.warning("ec_buffer_device %s: the pool stays in host memory and each "
                                "item is copied to the GPU (%s)", config.buffer_device, e)
                    self._copy_to = torch.device("cuda", index)
            elif device is not None:
                self._copy_to = device
            if self._shard is None:
                self._shard = PushConsumer(lib_cfg, tp_rank=tp_rank)
        if config.is_producer:
            try:
                self._producer = PushProducer(
                    config.library("producer", ec_buffer_size=config.ec_buffer_size,
                                   control_timeout_s=config.control_timeout_s)
                )
            except BaseException:
                self.shutdown()
                raise
        self._taken: dict[str, str] = {}  # transfer_id -> mm_hash, zero-copy in the cache
        self._loaded: set[str] = set()
        self._failed_loads: set[str] = set()
        self._awaiting: dict[str, list[PushSpec]] = {}  # mm_hash -> pushes waiting for it
        self._reserved: set[str] = set()  # transfer ids reserved without bytes yet
        self._in_flight: dict[str, PushSpec] = {}
        self._sources: dict[str, Any] = {}  # outputs saved before their spec arrived
        self._failed_saves: set[str] = set()
        self.counters = dict(pushed=0, done=0, cached=0, failed=0, cancelled=0, loaded=0,
                             failed_loads=0, released=0)

    @staticmethod
    def _engine_device(name: str):
        if name in ("cpu", "host"):
            return None
        try:
            import torch
        except ImportError:
            raise RuntimeError(f"ec_buffer_device={name!r} needs torch") from None
        dev = torch.device(name)
        if dev.type == "cuda" and not torch.cuda.is_available():
            raise RuntimeError(f"ec_buffer_device={name!r} but CUDA is not available "
                               "(use \"cpu\")")
        return dev

    @property
    def address(self) -> str | None:
        """Consumer: where producers push this instance's items (rank 0's address)."""
        return self._shard.address if self._shard is not None else None

    # -- consumer

    def _retire(self, encoder_cache: dict, freed: Iterable[str]) -> None:
        freed = set(freed)
        for tid, h in list(self._taken.items()):
            if h in freed or h not in encoder_cache:
                del self._taken[tid]
                self._shard.release(tid)
                self.counters["released"] += 1

    def start_load_caches(self, metadata: StepMetadata, encoder_cache: dict) -> None:
        if self._shard is None:
            return
        self._retire(encoder_cache, metadata.freed)
        for spec in metadata.loads:
            if spec.mm_hash in encoder_cache:  # already here (the same content twice)
                self._shard.finish(spec.transfer_id)  # its room is free for others now
                self._loaded.add(spec.transfer_id)
                continue
            try:
                t = self._shard.take(spec.transfer_id)
            except Error as e:
                log.warning("take of transfer %s (mm_hash %s) failed: %s", spec.transfer_id,
                            spec.mm_hash, e)
                self._failed_loads.add(spec.transfer_id)
                self.counters["failed_loads"] += 1
                continue
            if self._copy_to is not None:
                encoder_cache[spec.mm_hash] = t.to(self._copy_to)  # host pool -> the device
                self._shard.release(spec.transfer_id)
            else:  # zero-copy: the pool is where the engine computes
                encoder_cache[spec.mm_hash] = t
                self._taken[spec.transfer_id] = spec.mm_hash
            self._loaded.add(spec.transfer_id)
            self.counters["loaded"] += 1

    # -- producer

    def _fail_save(self, spec: PushSpec, err: Exception) -> None:
        log.warning("push of mm_hash %s (transfer %s) failed: %s", spec.mm_hash,
                    spec.transfer_id, err)
        self._failed_saves.add(spec.request_id)
        self.counters["failed"] += 1

    def start_save_caches(self, metadata: StepMetadata, encoder_cache: dict | None = None) -> None:
        if self._producer is None:
            return
        for spec in metadata.pushes:
            if spec.shape is not None:
                try:
                    self._producer.reserve(spec.transfer_id, spec.consumer, spec.mm_hash,
                                           spec.shape, spec.dtype)
                except Error as e:
                    self._fail_save(spec, e)
                    continue
                self._reserved.add(spec.transfer_id)
                self._in_flight[spec.transfer_id] = spec
                self.counters["pushed"] += 1
            self._awaiting.setdefault(spec.mm_hash, []).append(spec)
        self._producer.flush()  # reservations go out while the encoder runs
        for h in list(self._awaiting):
            src = (encoder_cache or {}).get(h, self._sources.get(h))
            if src is not None:
                self._bind(h, src)

    def save_caches(self, encoder_cache: dict, mm_hash: str) -> None:
        if self._producer is None:
            return
        t = encoder_cache[mm_hash]
        if mm_hash in self._awaiting:
            self._bind(mm_hash, t)
        else:
            self._sources[mm_hash] = t  # its push spec comes later this step

    def _bind(self, mm_hash: str, tensor: Any) -> None:
        for spec in self._awaiting.pop(mm_hash, []):
            try:
                if spec.transfer_id in self._reserved:
                    self._reserved.discard(spec.transfer_id)
                    self._producer.stage(spec.transfer_id, tensor)
                else:
                    self._producer.push(spec.transfer_id, spec.consumer, spec.mm_hash, tensor)
                    self._in_flight[spec.transfer_id] = spec
                    self.counters["pushed"] += 1
            except Error as e:
                if e.code == _lib.ECT_ESTATE and spec.transfer_id in self._in_flight:
                    continue  # it ended before its bytes came (cancelled): poll reports it
                self._producer.cancel(spec.transfer_id)
                self._fail_save(spec, e)

    def get_finished(self, finished_req_ids: set) -> tuple[set | None, set | None]:
        """Producer: pushes of finished requests that never got their bytes are
        cancelled (their reservations freed on the consumer)."""
        if self._producer is not None and finished_req_ids:
            for h, specs in list(self._awaiting.items()):
                keep = []
                for spec in specs:
                    if spec.request_id in finished_req_ids:
                        if spec.transfer_id in self._reserved:
                            self._reserved.discard(spec.transfer_id)
                            self._producer.cancel(spec.transfer_id)
                    else:
                        keep.append(spec)
                if keep:
                    self._awaiting[h] = keep
                else:
                    del self._awaiting[h]
        return None, None

    def build_connector_worker_meta(self):
        report = self._report_cls()
        if self._producer is not None:
            self._producer.flush()
            # pending() before poll(): an item that finishes in between is then
            # either polled now or still counted as pending (read after the
            # poll, it would be neither, and the engine would stop stepping
            # with its result unpolled)
            pending = self._producer.pending() > 0
            for r in self._producer.poll(0):
                spec = self._in_flight.pop(r.transfer_id, None)
                if r.ok:
                    self.counters["done"] += 1
                    if not r.transport:
                        self.counters["cached"] += 1
                elif r.cancelled:
                    self.counters["cancelled"] += 1
                elif spec is not None:
                    self._fail_save(spec, RuntimeError(r.error))
            report.failed_saves, self._failed_saves = self._failed_saves, set()
            report.pending_saves = pending
            self._sources.clear()
        if self._shard is not None:
            report.loaded, self._loaded = self._loaded, set()
            report.failed_loads, self._failed_loads = self._failed_loads, set()
        return report

    def shutdown(self) -> None:
        if self._producer is not None:
            self._producer.close()
        if self._shard is not None:
            self._shard.close()
