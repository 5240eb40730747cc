"""The pull protocol (generation 1) from Python: producer, scheduler, consumer.

The producer saves items and serves pulls; the consumer side's scheduler learns what is
available without blocking; its worker pulls an item into its own pool and reads it as a
zero-copy tensor. Configurations as in :mod:`ectransfer.push`; here ``ec_ip`` /
``ec_port`` name the producer (its ROUTER; PUB is ``ec_port + 1``) on both sides.
"""

from __future__ import annotations

import ctypes
from dataclasses import dataclass
from typing import Any

from . import _device, _lib, _tensors
from ._lib import Error, check, enc, text, ECT_ENOTFOUND


@dataclass(frozen=True)
class Meta:
    """What a scheduler knows of an available item (and what load needs)."""

    mm_hash: str
    nbytes: int
    shape: tuple[int, ...]
    dtype: str
    producer_session_id: str


def _meta(mm_hash: str, m) -> Meta:
    return Meta(mm_hash, int(m.nbytes), tuple(m.shape[: m.ndim]), text(m.dtype),
                text(m.producer_session_id))


class PullProducer(_lib.Handle):
    """Saves encoder outputs and serves them to any consumer that pulls them."""

    _close_fn = staticmethod(lambda h: _lib.lib.ect_pull_producer_close(h))
    _what = "PullProducer"

    def __init__(self, config: dict | str | None = None):
        super().__init__()
        self._open(_lib.lib.ect_pull_producer_open_config, config)
        self.port = _lib.lib.ect_pull_producer_port(self._h)
        self.session_id = text(_lib.lib.ect_pull_producer_session_id(self._h))

    def save(self, mm_hash: str, tensor: Any, *, dtype: Any = None, shape: Any = None) -> None:
        """Queues tensor under mm_hash and returns; the save thread stores and announces
        it. Host bytes are copied before this returns; a CUDA tensor (or CUDA array) is
        borrowed until the save thread copied it into the pool (device to host, once),
        so it must not change in place until flush() returned. Raises Error:
        ECT_EINVAL, ECT_EBUSY (too many bytes waiting to be stored), ECT_ENOMEM,
        ECT_ECLOSED."""
        src = _tensors.source(tensor, dtype, shape)
        dims = (_lib.U64 * max(1, len(src.shape)))(*src.shape)
        key = _device.borrow(src.keep) if src.device is not None else 0
        try:
            check(
                _lib.lib.ect_pull_producer_save(
                    self._handle(),
                    enc(mm_hash, "mm_hash"),
                    src.address,
                    src.nbytes,
                    dims,
                    len(src.shape),
                    src.dtype.encode(),
                    _device.PULL_RELEASE_PTR if key else None,
                    key or None,
                )
            )
        except BaseException:
            _device.unborrow(key)
            raise

    def flush(self, timeout: float = 60.0) -> None:
        """Waits until every item saved before the call is published or dropped.
        Raises Error(ECT_ETIMEDOUT) after timeout seconds."""
        check(_lib.lib.ect_pull_producer_flush(self._handle(), int(timeout * 1000)))

    def stats(self) -> dict[str, int]:
        buf = _lib.buffer_for("ect_pull_producer_stat")
        _lib.lib.ect_pull_producer_stats(self._handle(), buf)
        st = _lib.struct_at(buf, "ect_pull_producer_stat")
        return {n: int(getattr(st, n)) for n, _ in _lib.PullProducerStat._fields_}


class PullScheduler(_lib.Handle):
    """Learns which items a producer holds, without blocking (one thread at a time)."""

    _close_fn = staticmethod(lambda h: _lib.lib.ect_pull_scheduler_close(h))
    _what = "PullScheduler"

    def __init__(self, config: dict | str | None = None):
        super().__init__()
        self._open(_lib.lib.ect_pull_scheduler_open_config, config)
        self._meta = _lib.buffer_for("ect_pull_meta")

    def has(self, mm_hash: str) -> Meta | None:
        """The item's metadata if the producer announced it, else None (drains pending
        notifications first)."""
        rc = check(_lib.lib.ect_pull_scheduler_has(self._handle(), enc(mm_hash, "mm_hash"), self._meta))
        return _meta(mm_hash, _lib.struct_at(self._meta, "ect_pull_meta")) if rc == 1 else None

    def poll(self) -> None:
        """Drains pending notifications without asking anything."""
        check(_lib.lib.ect_pull_scheduler_poll(self._handle()))

    def available(self) -> dict[str, Meta]:
        """Every item known now (after a poll), by mm_hash."""
        h = self._handle()
        check(_lib.lib.ect_pull_scheduler_poll(h))
        found: dict[str, Meta] = {}

        def visit(user, mm_hash, meta):
            name = text(mm_hash)
            found[name] = _meta(name, meta.contents)

        cb = _lib.FOREACH_FN(visit)
        _lib.lib.ect_pull_scheduler_foreach(h, cb, None)
        return found

    def forget(self, mm_hash: str) -> None:
        """Forgets mm_hash (e.g. after a load found it evicted)."""
        _lib.lib.ect_pull_scheduler_forget(self._handle(), enc(mm_hash, "mm_hash"))

    def stats(self) -> dict[str, int]:
        buf = _lib.buffer_for("ect_pull_scheduler_stat")
        _lib.lib.ect_pull_scheduler_stats(self._handle(), buf)
        st = _lib.struct_at(buf, "ect_pull_scheduler_stat")
        return {n: int(getattr(st, n)) for n, _ in _lib.PullSchedulerStat._fields_}


class PullConsumer(_lib.Handle):
    """Pulls items into its own pool and hands them out as zero-copy tensors.

    :meth:`load` blocks (up to the configured ``timeout_ms``) while the producer writes;
    use one consumer from one thread at a time. Views follow the rules of
    ``_tensors.PoolMap.view`` (release empties the tensor; the bytes stay leased until
    the last tensor sharing them is freed; nothing faults after close). With
    ``ec_buffer_device`` "cuda" / "cuda:N" the pool is GPU memory and :meth:`load`
    returns zero-copy CUDA tensors, as :class:`ectransfer.PushConsumer` does.
    """

    _close_fn = staticmethod(lambda h: _lib.lib.ect_pull_consumer_close(h))
    _what = "PullConsumer"

    def __init__(self, config: dict | str | None = None):
        super().__init__()
        cfg = _lib.config_dict(config, "pull consumer")
        pool = _device.pool_for(cfg)  # a CUDA pool: the binding's memory (pool_memory)
        self._open(_lib.lib.ect_pull_consumer_open_config, cfg)
        try:
            self._map = pool or _tensors.PoolMap(_lib.lib.ect_pull_consumer_pool(self._h),
                                                 "PullConsumer")
        except Exception:
            self.close()
            raise
        self.device = f"cuda:{pool.device}" if pool is not None else "cpu"

    def load(self, mm_hash: str, meta: Meta, *, out: str | None = None, raw: bool = False):
        """mm_hash as a zero-copy tensor: from this consumer's pool when it holds it
        already, else pulled from the producer (meta from PullScheduler.has). Valid until
        :meth:`release`. Raises Error: ECT_EFULL, ECT_ETIMEDOUT, ECT_ENOTFOUND (the
        producer no longer holds it), ..."""
        if not isinstance(meta, Meta):
            raise Error(_lib.ECT_EINVAL, "meta must be the Meta PullScheduler.has returned")
        h = self._handle()
        m = _lib.PullMeta(nbytes=meta.nbytes, ndim=len(meta.shape), dtype=meta.dtype.encode(),
                          producer_session_id=meta.producer_session_id.encode())
        for i, d in enumerate(meta.shape[: _lib.NDIM_MAX]):
            m.shape[i] = d
        mbuf = _lib.buffer_for("ect_pull_meta")
        ctypes.memmove(mbuf, ctypes.addressof(m), ctypes.sizeof(m))
        vbuf = _lib.buffer_for("ect_pull_view")
        key = enc(mm_hash, "mm_hash")
        check(_lib.lib.ect_pull_consumer_load(h, key, mbuf, vbuf))
        v = _lib.struct_at(vbuf, "ect_pull_view")
        lib, owner = _lib.lib, self

        def give_back():
            h2 = owner._h
            if h2 is not None:
                lib.ect_pull_consumer_release(h2, key)

        # the view owns the lease from here: it gives it back exactly once
        return self._map.view(mm_hash, v.data, v.nbytes, tuple(v.shape[: v.ndim]),
                              text(v.dtype), out, raw, give_back)

    def release(self, mm_hash: str) -> None:
        """Ends what load(mm_hash) handed out (see the class docstring); the item stays
        in this consumer's pool for later loads. Error(ECT_ENOTFOUND) if not loaded."""
        self._handle()
        if mm_hash not in self._map.handed:
            raise Error(ECT_ENOTFOUND, f"mm_hash {mm_hash!r} is not loaded")
        self._map.forget(mm_hash)

    def stats(self) -> dict[str, int]:
        buf = _lib.buffer_for("ect_pull_consumer_stat")
        _lib.lib.ect_pull_consumer_stats(self._handle(), buf)
        st = _lib.struct_at(buf, "ect_pull_consumer_stat")
        return {n: int(getattr(st, n)) for n, _ in _lib.PullConsumerStat._fields_}

    def _before_close(self, h) -> None:
        m = getattr(self, "_map", None)
        if m is not None:
            m.close()

    def _after_close(self) -> None:
        self._map = None  # the pool's memory now lives only as long as views of it
