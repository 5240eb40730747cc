"""Replaying vLLM's per-step calls on ectransfer.vllm across processes (test harness).

STAND-INS (not vLLM): ECTransferConfig, ParallelConfig, ModelConfig and VllmConfig
below carry only the fields the connector reads, with vLLM's names and defaults; Request,
MultiModalFeatureSpec, PlaceholderRange, SchedulerOutput and ECConnectorOutput only the
attributes and methods it uses, with vLLM's names and signatures.

Each engine process (a scheduler, or one worker per TP rank) runs :func:`serve`: it
builds the connector the way vLLM's ECConnectorFactory does (the class named
``ec_connector`` in ``ec_connector_module_path``) and executes what the driver sends.
Metadata travels between processes pickled, as vLLM's executor sends it. A worker's
``step`` runs vLLM's worker order: free -> bind metadata -> start_save_caches ->
start_load_caches -> the encoder -> save_caches -> get_finished ->
build_connector_worker_meta -> clear_connector_metadata.
"""

from __future__ import annotations

import hashlib
import multiprocessing as mp
import sys
import traceback
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
STAND_IN = HERE / "stand_in"
HIDDEN = 1024  # the stand-in model's encoder output width


# ------------------------------------------------------------- stand-ins


@dataclass
class ECTransferConfig:  # STAND-IN for vllm.config.ECTransferConfig
    ec_connector: str | None = None
    ec_connector_module_path: str | None = None
    ec_role: str | None = None
    ec_ip: str = "127.0.0.1"
    ec_port: int = 14579
    ec_buffer_size: float = 1e9
    ec_buffer_device: str | None = "cuda"
    ec_connector_extra_config: dict = field(default_factory=dict)

    @property
    def is_ec_producer(self) -> bool:
        return self.ec_connector is not None and self.ec_role in ("ec_producer", "ec_both")

    @property
    def is_ec_consumer(self) -> bool:
        return self.ec_connector is not None and self.ec_role in ("ec_consumer", "ec_both")


@dataclass
class ParallelConfig:  # STAND-IN
    tensor_parallel_size: int = 1
    data_parallel_size: int = 1
    data_parallel_index: int = 0


@dataclass
class ModelConfig:  # STAND-IN
    dtype: str = "bfloat16"
    hidden_size: int = HIDDEN
    hf_config: Any = None

    def get_inputs_embeds_size(self) -> int:
        return self.hidden_size


@dataclass
class VllmConfig:  # STAND-IN
    ec_transfer_config: ECTransferConfig
    parallel_config: ParallelConfig = field(default_factory=ParallelConfig)
    model_config: ModelConfig = field(default_factory=ModelConfig)


@dataclass
class PlaceholderRange:  # STAND-IN for vllm.multimodal.inputs.PlaceholderRange
    offset: int
    length: int


@dataclass
class MultiModalFeatureSpec:  # STAND-IN
    identifier: str  # the mm_hash
    mm_position: PlaceholderRange


@dataclass
class Request:  # STAND-IN for vllm.v1.request.Request
    request_id: str
    mm_features: list
    ec_transfer_params: dict | None = None

    def get_num_encoder_embeds(self, input_id: int) -> int:
        return self.mm_features[input_id].mm_position.length


@dataclass
class SchedulerOutput:  # STAND-IN for vllm.v1.core.sched.output.SchedulerOutput
    free_encoder_mm_hashes: list = field(default_factory=list)


@dataclass
class ECConnectorOutput:  # STAND-IN for vllm.v1.outputs.ECConnectorOutput
    ec_connector_worker_meta: Any = None


def tokens_of(mm_hash: str) -> int:
    return 64 + int(hashlib.sha256(mm_hash.encode()).hexdigest()[:4], 16) % 128


def make_request(request_id: str, hashes: list, *, consumer: str | None = None,
                 transfer_ids: list | None = None) -> Request:
    """A request with one image per hash; the proxy's ec_transfer_params for the
    encoder (consumer_zmq + transfer ids) or the consumer (mm_hash + transfer ids)."""
    feats, off = [], 10
    for h in hashes:
        n = tokens_of(h)
        feats.append(MultiModalFeatureSpec(h, PlaceholderRange(off, n)))
        off += n + 5
    tids = transfer_ids or [f"{request_id}-x{i}" for i in range(len(hashes))]
    items = [{"transfer_id": t} if consumer else {"mm_hash": h, "transfer_id": t}
             for h, t in zip(hashes, tids)]
    params = {"ec_items": items}
    if consumer:
        params["consumer_zmq"] = consumer
    return Request(request_id, feats, params)


def encoder_output(mm_hash: str):
    """What the stand-in encoder computes for an image: a function of its hash."""
    import torch

    g = torch.Generator().manual_seed(int(hashlib.sha256(mm_hash.encode()).hexdigest()[:12], 16))
    return torch.randn(tokens_of(mm_hash), HIDDEN, generator=g).to(torch.bfloat16)


# ------------------------------------------------------------ processes


def _connector(role: str, ec: ECTransferConfig, parallel: ParallelConfig, tp_rank: int):
    from vllm.distributed.ec_transfer.ec_connector.base import ECConnectorRole
    from vllm.distributed.ec_transfer.ec_connector.factory import ECConnectorFactory
    from vllm.distributed.parallel_state import init_tp_group

    if role == "worker":
        init_tp_group(tp_rank, parallel.tensor_parallel_size)
    cls = ECConnectorFactory.get_connector_class(ec)
    r = ECConnectorRole.SCHEDULER if role == "scheduler" else ECConnectorRole.WORKER
    return cls(VllmConfig(ec, parallel), r)


def _worker_step(conn, cache: dict, meta, encode: list, finished: set, freed: list):
    import torch

    for h in freed:  # the model runner frees the scheduler's freed hashes first
        cache.pop(h, None)
    conn.bind_connector_metadata(meta)
    conn.start_save_caches(encoder_cache=cache)
    conn.start_load_caches(cache)
    for h in encode:  # the encoder
        cache[h] = encoder_output(h)
        conn.save_caches(cache, h)
    conn.get_finished(finished)
    wmeta = conn.build_connector_worker_meta()
    conn.clear_connector_metadata()
    checks = {}
    for spec in getattr(meta, "loads", []):
        t = cache.get(spec.mm_hash)
        want = encoder_output(spec.mm_hash)
        checks[spec.mm_hash] = (t is not None and t.dtype == want.dtype and t.shape == want.shape
                                and torch.equal(t.view(torch.int16), want.view(torch.int16)))
    return wmeta, checks


def serve(pipe, role: str, ec: ECTransferConfig, parallel: ParallelConfig, tp_rank: int):
    sys.path[:0] = [str(STAND_IN), str(HERE.parent.parent / "python")]
    try:
        conn = _connector(role, ec, parallel, tp_rank)
        pipe.send(("ok", None))
    except BaseException:
        pipe.send(("error", traceback.format_exc()))
        return
    cache: dict = {}
    while True:
        cmd, args = pipe.recv()
        try:
            if cmd == "close":
                conn.shutdown()
                pipe.send(("ok", None))
                return
            if cmd == "step":
                out = _worker_step(conn, cache, *args)
            elif cmd == "call":
                name, a, kw = args
                out = getattr(conn, name)(*a, **kw)
            elif cmd == "inspect":  # test introspection: a dotted attribute, called with args
                obj = conn
                for part in args[0].split("."):
                    obj = getattr(obj, part)
                out = obj(*args[1]) if callable(obj) else obj
            else:
                raise ValueError(cmd)
            pipe.send(("ok", out))
        except BaseException:
            pipe.send(("error", traceback.format_exc()))


class Proc:
    """One engine process, driven through a pipe."""

    def __init__(self, role: str, ec: ECTransferConfig, parallel: ParallelConfig,
                 tp_rank: int = 0, timeout: float = 180.0):
        ctx = mp.get_context("spawn")
        self.pipe, child = ctx.Pipe()
        self.timeout = timeout
        self.p = ctx.Process(target=serve, args=(child, role, ec, parallel, tp_rank), daemon=True)
        self.p.start()
        child.close()
        self.name = f"{role}:{ec.ec_role}:{tp_rank}"

    def ready(self) -> None:
        self._reply()

    def _reply(self):
        if not self.pipe.poll(self.timeout):
            raise TimeoutError(f"{self.name}: no answer in {self.timeout}s")
        status, out = self.pipe.recv()
        if status != "ok":
            raise RuntimeError(f"{self.name} failed:\n{out}")
        return out

    def call(self, name: str, *a, **kw):
        self.pipe.send(("call", (name, a, kw)))
        return self._reply()

    def inspect(self, path: str, *a):
        self.pipe.send(("inspect", (path, a)))
        return self._reply()

    def step(self, meta, encode=(), finished=(), freed=()):
        self.pipe.send(("step", (meta, list(encode), set(finished), list(freed))))
        return self._reply()

    def close(self) -> None:
        if self.p.is_alive():
            try:
                self.pipe.send(("close", None))
                self._reply()
            except (OSError, EOFError, TimeoutError, RuntimeError):
                pass
        self.p.join(self.timeout)
        if self.p.is_alive():
            self.p.kill()
            self.p.join()
