"""ectransfer: move multimodal encoder outputs (embedding tensors) between inference
instances, from Python.

A thin binding (standard library + ctypes; torch and numpy optional) over
libectransfer's C interface. Push (generation 2) and take in ten lines::

    import torch, ectransfer
    cfg = {"ec_ip": "127.0.0.1", "ec_port": 14579, "ec_buffer_size": 1 << 28}
    with ectransfer.PushConsumer(cfg) as shard, ectransfer.PushScheduler(cfg) as sched, \\
         ectransfer.PushProducer({"ec_buffer_size": 1 << 26}) as prod:
        sched.expect("req-1")
        prod.push("req-1", shard.address, "img-hash", torch.randn(576, 4096, dtype=torch.bfloat16))
        prod.flush(); print(prod.poll())                  # [Result(transfer_id='req-1', ok=True, ...)]
        while "req-1" not in sched.poll(timeout=1): pass  # sleeps until it arrived on every shard
        emb = shard.take("req-1")                          # zero-copy torch.Tensor (576, 4096)
        shard.release("req-1"); sched.loaded("req-1"); sched.cancel("req-1")

Every failure raises :class:`Error` with the library's code and sentence. The library's
logs go to the ``logging`` logger ``ectransfer``. ``ectransfer.vllm`` holds a vLLM
encoder-cache connector (``ec_connector_module_path``).
"""

from ._lib import (  # noqa: F401
    CODES,
    ECT_EACCES,
    ECT_EBUSY,
    ECT_ECANCELED,
    ECT_ECLOSED,
    ECT_ECONNREFUSED,
    ECT_EEXIST,
    ECT_EFULL,
    ECT_EINVAL,
    ECT_EIO,
    ECT_ENOMEM,
    ECT_ENOTFOUND,
    ECT_ENOTSUP,
    ECT_EOVERFLOW,
    ECT_EPROTO,
    ECT_ERANGE,
    ECT_ESTATE,
    ECT_ETIMEDOUT,
    LIBRARY_PATH,
    Error,
    LibraryNotFound,
)
from . import _lib
from ._log import get_level as get_log_level, route_to_logging, set_level as set_log_level  # noqa: F401
from ._device import DeviceArray, cuda_info  # noqa: F401
from ._tensors import dtype_name  # noqa: F401
from .pull import Meta, PullConsumer, PullProducer, PullScheduler  # noqa: F401
from .push import PushConsumer, PushProducer, PushScheduler, Result, SchedItem  # noqa: F401

__version__ = _lib.text(_lib.lib.ect_version())
ABI_VERSION = _lib.ABI_VERSION


def version() -> str:
    """The loaded library's version (e.g. "0.1.0")."""
    return __version__


route_to_logging(True)

__all__ = [
    "ABI_VERSION",
    "CODES",
    "LIBRARY_PATH",
    "ECT_EACCES",
    "ECT_EBUSY",
    "ECT_ECANCELED",
    "ECT_ECLOSED",
    "ECT_ECONNREFUSED",
    "ECT_EEXIST",
    "ECT_EFULL",
    "ECT_EINVAL",
    "ECT_EIO",
    "ECT_ENOMEM",
    "ECT_ENOTFOUND",
    "ECT_ENOTSUP",
    "ECT_EOVERFLOW",
    "ECT_EPROTO",
    "ECT_ERANGE",
    "ECT_ESTATE",
    "ECT_ETIMEDOUT",
    "Error",
    "LibraryNotFound",
    "PushProducer",
    "PushConsumer",
    "PushScheduler",
    "PullProducer",
    "PullConsumer",
    "PullScheduler",
    "Result",
    "SchedItem",
    "Meta",
    "version",
    "dtype_name",
    "DeviceArray",
    "cuda_info",
    "set_log_level",
    "get_log_level",
    "route_to_logging",
]
