"""A vLLM encoder-cache connector (push protocol) over :mod:`ectransfer.connector`.

Load it through vLLM's ``ECConnectorFactory`` (``ec_connector_module_path``)::

    --ec-transfer-config '{"ec_connector": "ECTransferConnector",
                           "ec_connector_module_path": "ectransfer.vllm",
                           "ec_role": "ec_consumer", "ec_ip": "10.0.0.2", "ec_port": 14579,
                           "ec_buffer_size": 1e9,
                           "ec_connector_extra_config": {"push_wait_timeout_s": 60}}'

It reads upstream's keys with upstream's defaults: ``ec_role``, ``ec_ip`` ("127.0.0.1"),
``ec_port`` (14579), ``ec_buffer_size`` (1e9), ``ec_buffer_device`` ("cuda": each
worker's receive pool lives on its GPU and loaded tensors go zero-copy into the encoder
cache; "cpu": the pool is host memory, tensors zero-copy there), and in
``ec_connector_extra_config`` ``control_timeout_s`` (30) and ``push_wait_timeout_s`` (60),
plus library keys (``transport``: "tcp", "shm" or "ucx"; ``ttl_ms``, ...).

vLLM is imported only when the class is first looked up (``getattr(module,
"ECTransferConnector")``, what the factory does), so importing this module needs no
vLLM. All the work is in the engine-neutral cores; this class only adapts vLLM's
objects to them.
"""

from __future__ import annotations

import functools
import logging
from typing import Any

from .connector import (
    ConnectorConfig,
    LoadSpec,
    PushSpec,
    SchedulerCore,
    StepMetadata,
    WorkerCore,
    WorkerReport,
)

log = logging.getLogger("ectransfer.vllm")

__all__ = ["ECTransferConnector", "ECTransferConnectorMetadata", "ECTransferWorkerMetadata",
           "LoadSpec", "PushSpec"]

_LAZY = ("ECTransferConnector", "ECTransferConnectorMetadata", "ECTransferWorkerMetadata")


def __getattr__(name: str):
    if name in _LAZY:
        return _classes()[name]
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def config_from_vllm(vllm_config: Any) -> ConnectorConfig:
    ec = vllm_config.ec_transfer_config
    if ec is None:
        raise ValueError("ECTransferConnector needs ec_transfer_config")
    return ConnectorConfig.from_values(
        getattr(ec, "ec_role", None),
        ec_ip=getattr(ec, "ec_ip", None),
        ec_port=getattr(ec, "ec_port", None),
        ec_buffer_size=getattr(ec, "ec_buffer_size", None),
        ec_buffer_device=getattr(ec, "ec_buffer_device", None),
        extra=getattr(ec, "ec_connector_extra_config", None) or {},
    )


def _parallel(vllm_config: Any) -> tuple[int, int]:
    """(tensor_parallel_size, data-parallel index) of this instance."""
    pc = getattr(vllm_config, "parallel_config", None)
    tp = int(getattr(pc, "tensor_parallel_size", 1) or 1)
    dp = getattr(pc, "data_parallel_index", None)
    if dp is None:
        dp = getattr(pc, "data_parallel_rank", 0)
    return tp, int(dp or 0)


def _tp_rank() -> tuple[int, int] | None:
    try:
        from vllm.distributed.parallel_state import get_tp_group

        g = get_tp_group()
        return int(g.rank_in_group), int(g.world_size)
    except (ImportError, AssertionError, AttributeError):
        return None  # outside a distributed run this worker is the whole instance


def _encoder_width(model_config: Any) -> int:
    # The encoder cache holds one row per token; its width is the language model's
    # input embedding size, except for vision towers that concatenate their output
    # with deepstack features (out_hidden_size x (1 + number of deepstack layers)).
    vision = getattr(getattr(model_config, "hf_config", None), "vision_config", None)
    out = getattr(vision, "out_hidden_size", None)
    deep = getattr(vision, "deepstack_visual_indexes", None)
    if out is not None and deep:
        return int(out) * (1 + len(deep))
    return int(model_config.get_inputs_embeds_size())


def _push_shape(vllm_config: Any):
    """(shape, dtype) of an item before the encoder ran, when the model says so."""
    mc = getattr(vllm_config, "model_config", None)
    try:
        width = _encoder_width(mc)
        dtype = mc.dtype
        name = dtype if isinstance(dtype, str) else str(dtype).split(".")[-1]
    except Exception:
        return None

    def shape(request: Any, index: int):
        get = getattr(request, "get_num_encoder_embeds", None) or getattr(
            request, "get_num_encoder_tokens", None)
        if get is None:
            return None
        return (int(get(index)), width), name

    return shape


@functools.lru_cache(maxsize=None)
def _classes() -> dict[str, type]:
    try:
        from vllm.distributed.ec_transfer.ec_connector.base import (
            ECConnectorBase,
            ECConnectorMetadata,
            ECConnectorRole,
            ECConnectorWorkerMetadata,
        )
    except ImportError as e:
        raise ImportError(f"ectransfer.vllm.ECTransferConnector needs vLLM: {e}") from e

    class ECTransferConnectorMetadata(StepMetadata, ECConnectorMetadata):
        """Scheduler -> workers, one step (pushes, loads, freed mm_hashes)."""

    class ECTransferWorkerMetadata(WorkerReport, ECConnectorWorkerMetadata):
        """Workers -> scheduler, one step; aggregate() intersects `loaded` over ranks."""

        def aggregate(self, other):
            return WorkerReport.aggregate(self, other)

    for cls in (ECTransferConnectorMetadata, ECTransferWorkerMetadata):
        cls.__module__ = __name__  # pickled by reference to this module
        cls.__qualname__ = cls.__name__

    class ECTransferConnector(ECConnectorBase):
        """vLLM's ECConnectorBase for the push protocol, on libectransfer."""

        def __init__(self, vllm_config: Any, role: Any):
            super().__init__(vllm_config, role)
            config = config_from_vllm(vllm_config)
            tp_size, dp_index = _parallel(vllm_config)
            self._scheduler: SchedulerCore | None = None
            self._worker: WorkerCore | None = None
            if role == ECConnectorRole.SCHEDULER:
                self._scheduler = SchedulerCore(
                    config, tp_size=tp_size, dp_index=dp_index,
                    push_shape=_push_shape(vllm_config) if config.is_producer else None,
                    metadata_cls=ECTransferConnectorMetadata,
                )
            else:
                rank = _tp_rank() or (0, tp_size)
                self._worker = WorkerCore(config, tp_rank=rank[0], tp_size=rank[1],
                                          dp_index=dp_index, report_cls=ECTransferWorkerMetadata)

        # ---------------------------------------------------------- worker side

        def start_save_caches(self, encoder_cache: dict | None = None, **kwargs: Any) -> None:
            meta = self._connector_metadata
            if self._worker is not None and meta is not None:
                self._worker.start_save_caches(meta, encoder_cache)
                meta.pushes = []  # each push is reserved once per step

        def start_load_caches(self, encoder_cache: dict, **kwargs: Any) -> None:
            meta = self._connector_metadata
            if self._worker is not None and meta is not None:
                if meta.pushes:
                    # A vLLM that does not call start_save_caches: reserve here, still
                    # before the encoder runs.
                    self.start_save_caches(encoder_cache)
                self._worker.start_load_caches(meta, encoder_cache)

        def save_caches(self, encoder_cache: dict, mm_hash: str, **kwargs: Any) -> None:
            if self._worker is not None:
                self._worker.save_caches(encoder_cache, mm_hash)

        def get_finished(self, finished_req_ids: set) -> tuple[set | None, set | None]:
            if self._worker is None:
                return None, None
            return self._worker.get_finished(finished_req_ids)

        def build_connector_worker_meta(self):
            return self._worker.build_connector_worker_meta() if self._worker else None

        # ------------------------------------------------------- scheduler side

        def has_cache_item(self, identifier: str) -> bool:
            return self._scheduler.has_cache_item(identifier) if self._scheduler else False

        def ensure_cache_available(self, request: Any, num_computed_tokens: int,
                                   *args: Any, **kwargs: Any) -> bool:
            if self._scheduler is None:
                return True
            return self._scheduler.ensure_cache_available(request, num_computed_tokens)

        def update_state_after_alloc(self, request: Any, index: int) -> None:
            if self._scheduler is not None:
                self._scheduler.update_state_after_alloc(request, index)

        def build_connector_meta(self, scheduler_output: Any):
            return self._scheduler.build_connector_meta(scheduler_output)

        def update_connector_output(self, connector_output: Any) -> None:
            if self._scheduler is not None:
                meta = getattr(connector_output, "ec_connector_worker_meta", None)
                self._scheduler.update_connector_output(meta)

        def request_finished(self, request: Any) -> tuple[bool, dict | None]:
            if self._scheduler is None:
                return False, None
            return self._scheduler.request_finished(request)

        def has_pending_push_work(self) -> bool:
            return self._scheduler.has_pending_push_work() if self._scheduler else False

        def take_unavailable_requests(self) -> set:
            return self._scheduler.take_unavailable_requests() if self._scheduler else set()

        @classmethod
        def receive_addresses(cls, vllm_config: Any) -> list[str]:
            """Where an encoder pushes this instance's items: per DP replica, TP rank 0's
            control address tcp://ec_ip:(ec_port + dp x tp_size). A producer has none."""
            config = config_from_vllm(vllm_config)
            if not config.is_consumer:
                return []
            tp_size, _ = _parallel(vllm_config)
            pc = getattr(vllm_config, "parallel_config", None)
            dp_size = int(getattr(pc, "data_parallel_size", 1) or 1)
            host = f"[{config.ec_ip}]" if ":" in config.ec_ip else config.ec_ip
            return [f"tcp://{host}:{config.control_port(dp, tp_size)}" for dp in range(dp_size)]

        def shutdown(self) -> None:
            if self._scheduler is not None:
                self._scheduler.shutdown()
            if self._worker is not None:
                self._worker.shutdown()

    ECTransferConnector.__module__ = __name__
    ECTransferConnector.__qualname__ = "ECTransferConnector"
    return {
        "ECTransferConnector": ECTransferConnector,
        "ECTransferConnectorMetadata": ECTransferConnectorMetadata,
        "ECTransferWorkerMetadata": ECTransferWorkerMetadata,
    }
