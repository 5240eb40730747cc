"""Tensors in and out: dtype names, the bytes of a source, zero-copy views.

Sources (what ``push``/``save`` accept): a ``torch.Tensor``, a ``numpy.ndarray`` or
any object with the buffer protocol. Shape and dtype come from it; a ``dtype=`` (a
torch dtype name or ``torch.dtype``) and ``shape=`` given by the caller describe raw
bytes instead (e.g. bfloat16 held in a numpy ``uint16``/``uint8`` array). The library
copies the bytes into its staging memory during the call, so the source may change or
go away as soon as the call returns.

CUDA tensors stay on their device: the library reads them itself (borrowed until the
transfer ends; see :func:`source` and ``_device``), and copies them to host memory
only where it cannot reach the CUDA driver.

Views (what ``take``/``load`` return) are built by :class:`PoolMap`: the binding maps
the pool's memfd a second time, so a view never points into a mapping the library may
unmap, and every view holds a lease that is given back only when the last tensor
sharing its memory is freed. What ``release`` guarantees is in :meth:`PoolMap.view`.
A pool in CUDA memory is the binding's own allocation (``_device.DevicePool``), with
the same guarantees.
"""

from __future__ import annotations

import ctypes
import mmap
import threading
import weakref
from dataclasses import dataclass
from typing import Any, Callable

from . import _lib
from ._lib import Error, ECT_EINVAL, ECT_ENOTSUP

try:  # optional
    import torch
except ImportError:  # pragma: no cover - depends on the machine
    torch = None
try:  # optional
    import numpy as np
except ImportError:  # pragma: no cover
    np = None

# torch names the library knows and the numpy dtype holding the same values;
# None where numpy has none (bfloat16, float8, ...): numpy gets the raw bytes.
_NUMPY_NAMES = {
    "float16": "float16",
    "half": "float16",
    "float32": "float32",
    "float": "float32",
    "float64": "float64",
    "double": "float64",
    "int8": "int8",
    "uint8": "uint8",
    "int16": "int16",
    "short": "int16",
    "uint16": "uint16",
    "int32": "int32",
    "int": "int32",
    "uint32": "uint32",
    "int64": "int64",
    "long": "int64",
    "uint64": "uint64",
    "bool": "bool",
    "complex64": "complex64",
    "cfloat": "complex64",
    "complex128": "complex128",
    "cdouble": "complex128",
}
# numpy dtype name -> torch dtype name
_FROM_NUMPY = {
    "float16": "float16",
    "float32": "float32",
    "float64": "float64",
    "int8": "int8",
    "uint8": "uint8",
    "int16": "int16",
    "uint16": "uint16",
    "int32": "int32",
    "uint32": "uint32",
    "int64": "int64",
    "uint64": "uint64",
    "bool": "bool",
    "complex64": "complex64",
    "complex128": "complex128",
}
# struct-module format characters of a plain buffer -> torch dtype name
_FROM_FORMAT = {
    "B": "uint8",
    "b": "int8",
    "c": "uint8",
    "?": "bool",
    "e": "float16",
    "f": "float32",
    "d": "float64",
    "h": "int16",
    "H": "uint16",
    "i": "int32",
    "I": "uint32",
    "l": "int64",
    "L": "uint64",
    "q": "int64",
    "Q": "uint64",
}


def dtype_name(dtype: Any) -> str:
    """The canonical torch dtype name ("bfloat16") for a torch.dtype, a numpy dtype or a
    name ("torch.bfloat16", "bfloat16"); raises Error(ECT_EINVAL) if the library does
    not know it."""
    if torch is not None and isinstance(dtype, torch.dtype):
        name = str(dtype).split(".")[-1]
    elif np is not None and isinstance(dtype, (np.dtype, type)) and not isinstance(dtype, str):
        try:
            nd = np.dtype(dtype)
        except TypeError:
            raise Error(ECT_EINVAL, f"dtype {dtype!r} is not a tensor dtype") from None
        if nd.name not in _FROM_NUMPY:
            raise Error(ECT_EINVAL, f"numpy dtype {nd.name} has no torch counterpart")
        name = _FROM_NUMPY[nd.name]
    elif isinstance(dtype, str):
        name = dtype[6:] if dtype.startswith("torch.") else dtype
    else:
        raise Error(ECT_EINVAL, f"dtype {dtype!r} is not a dtype")
    if _lib.lib.ect_dtype_size(name.encode()) == 0:
        raise Error(ECT_EINVAL, f"dtype {name!r} is not one ectransfer moves")
    return name


def element_size(name: str) -> int:
    return int(_lib.lib.ect_dtype_size(name.encode()))


def torch_dtype(name: str):
    """torch.dtype for a library dtype name, or None if this torch has none."""
    if torch is None:
        return None
    d = getattr(torch, name[6:] if name.startswith("torch.") else name, None)
    return d if isinstance(d, torch.dtype) else None


@dataclass
class Source:
    """Bytes to hand the library: address and length valid while `keep` lives. device:
    None for host memory, else the CUDA device ordinal of device memory."""

    address: int
    nbytes: int
    shape: tuple[int, ...]
    dtype: str
    keep: Any
    device: int | None = None


class _PyBuffer(ctypes.Structure):
    _fields_ = [
        ("buf", ctypes.c_void_p),
        ("obj", ctypes.py_object),
        ("len", ctypes.c_ssize_t),
        ("itemsize", ctypes.c_ssize_t),
        ("readonly", ctypes.c_int),
        ("ndim", ctypes.c_int),
        ("format", ctypes.c_char_p),
        ("shape", ctypes.POINTER(ctypes.c_ssize_t)),
        ("strides", ctypes.POINTER(ctypes.c_ssize_t)),
        ("suboffsets", ctypes.POINTER(ctypes.c_ssize_t)),
        ("internal", ctypes.c_void_p),
    ]


_get_buffer = ctypes.pythonapi.PyObject_GetBuffer
_get_buffer.argtypes = [ctypes.py_object, ctypes.POINTER(_PyBuffer), ctypes.c_int]
_get_buffer.restype = ctypes.c_int
_release_buffer = ctypes.pythonapi.PyBuffer_Release
_release_buffer.argtypes = [ctypes.POINTER(_PyBuffer)]
_release_buffer.restype = None
_PyBUF_SIMPLE = 0


class _Exported:
    """A C-contiguous buffer export held open (read-only allowed) until released."""

    def __init__(self, obj):
        self.view = _PyBuffer()
        _get_buffer(obj, ctypes.byref(self.view), _PyBUF_SIMPLE)
        self.open = True

    def release(self):
        if self.open:
            _release_buffer(ctypes.byref(self.view))
            self.open = False

    def __del__(self):
        self.release()


def shape_and_dtype(nbytes, shape, dtype, default_shape, default_dtype):
    name = dtype_name(dtype) if dtype is not None else default_dtype
    if shape is None:
        if dtype is not None and default_dtype != name:
            esize = element_size(name)
            if nbytes % esize:
                raise Error(ECT_EINVAL, f"{nbytes} bytes are not a whole number of {name}")
            shape = (nbytes // esize,)
        else:
            shape = default_shape
    shape = tuple(int(d) for d in shape)
    if len(shape) > _lib.NDIM_MAX:
        raise Error(ECT_EINVAL, f"shape {shape} has more than {_lib.NDIM_MAX} dimensions")
    if any(d < 0 for d in shape):
        raise Error(ECT_EINVAL, f"shape {shape} has a negative dimension")
    want = element_size(name)
    for d in shape:
        want *= d
    if want != nbytes:
        raise Error(
            ECT_EINVAL, f"shape {shape} x {name} is {want} bytes, the source holds {nbytes}"
        )
    return shape, name


def source(obj: Any, dtype: Any = None, shape: Any = None) -> Source:
    """The bytes of obj, C-contiguous (copied when they are not): host memory, or CUDA
    device memory the library can read itself (Source.device set).

    A CUDA torch.Tensor stays on its device when the library reaches the same CUDA
    driver (the current stream is synchronized first, so the bytes are final); where it
    cannot (no driver the library can load), it is copied to host memory here. Another
    object exposing ``__cuda_array_interface__`` (cupy, numba, :class:`DeviceArray`)
    must be C-contiguous device memory the library reaches; it is never copied here.
    """
    from . import _device

    if torch is not None and isinstance(obj, torch.Tensor):
        t = obj.detach()
        if t.is_conj():
            t = t.resolve_conj()
        if t.is_neg():
            t = t.resolve_neg()
        device = None
        if t.device.type == "cuda" and t.numel() and _device.reaches(t):
            t = t.contiguous()  # on the device
            torch.cuda.current_stream(t.device).synchronize()  # every write to it done
            device = t.device.index
        elif t.device.type != "cpu":
            t = t.to("cpu")  # the host-copy fallback
        t = t.contiguous()
        base_name = dtype_name(t.dtype)
        nbytes = t.numel() * t.element_size()
        shp, name = shape_and_dtype(nbytes, shape, dtype, tuple(t.shape), base_name)
        return Source(t.data_ptr(), nbytes, shp, name, t, device)
    if np is not None and isinstance(obj, np.ndarray):
        a = np.ascontiguousarray(obj)
        if dtype is None and a.dtype.name not in _FROM_NUMPY:
            raise Error(
                ECT_EINVAL,
                f"numpy dtype {a.dtype.name} has no torch counterpart; pass dtype= and shape= "
                "to push its bytes",
            )
        base_name = _FROM_NUMPY.get(a.dtype.name, "uint8")
        shp, name = shape_and_dtype(a.nbytes, shape, dtype, tuple(a.shape), base_name)
        return Source(a.ctypes.data, a.nbytes, shp, name, a)
    if hasattr(obj, "__cuda_array_interface__"):
        return _device.interface_source(obj, dtype, shape)
    try:
        mv = memoryview(obj)
    except TypeError:
        raise Error(
            ECT_EINVAL,
            f"cannot push a {type(obj).__name__}: a torch.Tensor, numpy.ndarray, buffer or "
            "CUDA array (__cuda_array_interface__) is needed",
        ) from None
    if not mv.c_contiguous:
        mv = memoryview(mv.tobytes())
    fmt = mv.format.lstrip("@=<")
    if dtype is None and fmt not in _FROM_FORMAT:
        raise Error(ECT_EINVAL, f"buffer format {mv.format!r} has no torch dtype; pass dtype=")
    base_name = _FROM_FORMAT.get(fmt, "uint8")
    shp, name = shape_and_dtype(mv.nbytes, shape, dtype, tuple(mv.shape), base_name)
    exp = _Exported(mv)
    return Source(exp.view.buf or 0, mv.nbytes, shp, name, (exp, mv))


# ------------------------------------------------------------------- views


def _unviewed(v):
    """v as a tensor of its own over the same storage (v._base None): a view would keep
    its base alive, and with it the bytes, after release emptied it in place."""
    if v._base is None:
        return v
    try:
        storage = v.untyped_storage()
    except AttributeError:  # torch < 2.0
        storage = v.storage()
    t = torch.empty(0, dtype=v.dtype, device=v.device)
    return t.set_(storage, v.storage_offset(), v.shape, v.stride())


def _empty_in_place(t) -> None:
    """Makes the torch tensor t hold nothing (shape (0,)): code that still
    has it reads nothing and fails at any shape or index it expects."""
    try:
        if t.is_inference() and not torch.is_inference_mode_enabled():
            with torch.inference_mode():
                t.set_()
        else:
            t.set_()
    except RuntimeError:  # pragma: no cover - a torch that refuses; the lease still holds
        pass


class ViewTable:
    """What was handed out of one consumer's pool, by key, and the leases behind it.

    Subclasses build the views (:class:`PoolMap` over host memory,
    ``_device.DevicePool`` over CUDA memory); this keeps, for both, the rules of
    :meth:`PoolMap.view`: each view owns one lease, given back exactly once, when the
    last object sharing its memory is freed; release(key) empties what was handed out;
    after close nothing is given back and nothing is freed under a live view.
    """

    def __init__(self):
        self.lock = threading.RLock()
        self.closed = False
        # key -> list of (weakref to what was handed out, kind)
        self.handed: dict[str, list] = {}

    def _own_lease(self, holder, key: str, give_back: Callable[[], None]) -> None:
        """From here on the lease belongs to holder: its finalizer gives it back once,
        when the last tensor, array or memoryview over it is freed."""
        state = self

        def finalize():
            with state.lock:
                if not state.closed:
                    state._return_lease(give_back)
                state._prune(key)

        fin = weakref.finalize(holder, finalize)
        fin.atexit = False

    def _return_lease(self, give_back: Callable[[], None]) -> None:
        give_back()

    def _handed_out(self, key: str, v, kind: str) -> None:
        with self.lock:
            self.handed.setdefault(key, []).append(
                (weakref.ref(v) if kind != "memoryview" else v, kind))

    def _prune(self, key: str) -> None:
        """Drops what was handed out under key and is gone (caller holds the lock). The
        key stays (with nothing under it) until release(key), which then succeeds."""
        if key in self.handed:
            self.handed[key] = [(r, k) for r, k in self.handed[key]
                                if k == "memoryview" or r() is not None]

    def live(self) -> list[str]:
        """Keys with a view still alive."""
        with self.lock:
            return [k for k, v in self.handed.items() if v]

    def forget(self, key: str) -> None:
        """release(key): empties what was handed out (see PoolMap.view()); the leases go
        back as their last holders are freed."""
        with self.lock:
            handed = self.handed.pop(key, [])
        for ref, kind in handed:
            if kind == "torch":
                t = ref()
                if t is not None:
                    _empty_in_place(t)
            elif kind == "memoryview":
                try:
                    ref.release()
                except BufferError:  # slices of it still export the bytes
                    pass
            elif kind == "device":
                a = ref()
                if a is not None:
                    a._release()

    def close(self) -> None:
        """The library handle is closing: forget every view (the memory itself lives on
        in the views still alive) and never give a lease back again."""
        with self.lock:
            keys = list(self.handed)
        for k in keys:
            self.forget(k)
        with self.lock:
            self.closed = True


class PoolMap(ViewTable):
    """The binding's own mapping of a consumer pool in host memory, and the views into it.

    Each view is a fresh ctypes array over the mapping (it keeps the mapping alive)
    wrapped by torch.frombuffer / numpy.frombuffer (which keep the array alive). A
    weakref finalizer on the array gives the library's lease back when the last
    tensor or array sharing the view's memory is freed, so the bytes cannot be
    reused under a live view.
    """

    def __init__(self, pool_ptr: int, what: str):
        super().__init__()
        fd = _lib.lib.ect_pool_fd(pool_ptr)
        if fd < 0:
            raise Error(ECT_ENOTSUP, f"{what}: its pool has no file descriptor to map")
        self.base = _lib.lib.ect_pool_base(pool_ptr)
        self.capacity = int(_lib.lib.ect_pool_capacity(pool_ptr))
        self.map = mmap.mmap(fd, self.capacity, mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE)

    def view(
        self,
        key: str,
        address: int,
        nbytes: int,
        shape: tuple[int, ...],
        dtype: str,
        out: str | None,
        raw: bool,
        give_back: Callable[[], None],
    ):
        """A zero-copy view of [address, address + nbytes) of the pool. The caller
        holds one lease on those bytes and hands it to this call: give_back() is
        called exactly once, also when the view is refused (an error is raised).

        Guarantees, whatever the caller does afterwards:
        - the bytes under a view never change and are never reused while any
          tensor, array or memoryview sharing them is alive: the lease
          (give_back) is returned only when the last one is freed;
        - after release(key), the torch tensor that view() returned is emptied in
          place (shape (0,)): indexing it or viewing it with its old shape raises;
          a memoryview is released (any use raises ValueError); a numpy array
          (read-only) keeps its bytes until it is garbage-collected;
        - nothing here is unmapped while a view lives, also after the consumer
          closed: no access can fault.
        """
        kind = out or ("torch" if torch is not None else "numpy" if np is not None else "memoryview")
        name = dtype[6:] if dtype.startswith("torch.") else dtype
        td = npname = None
        offset = address - self.base
        try:  # refusals first, while nothing holds the lease but this call
            if kind not in ("torch", "numpy", "memoryview"):
                raise Error(ECT_EINVAL, f"out={kind!r}: torch, numpy or memoryview")
            if kind == "torch" and torch is None:
                raise Error(ECT_ENOTSUP, "torch is not installed")
            if kind == "numpy" and np is None:
                raise Error(ECT_ENOTSUP, "numpy is not installed")
            if kind == "torch" and not raw:
                td = torch_dtype(name)
                if td is None:
                    raise Error(
                        ECT_ENOTSUP,
                        f"this torch ({torch.__version__}) has no dtype {name}; "
                        "take(..., raw=True) gives the bytes as uint8",
                    )
            if kind == "numpy" and not raw:
                npname = _NUMPY_NAMES.get(name)
            if offset < 0 or offset + nbytes > self.capacity:
                raise Error(_lib.ECT_ERANGE, f"view of {key!r} lies outside the pool")
        except BaseException:
            give_back()
            raise
        arr = (ctypes.c_ubyte * nbytes).from_buffer(self.map, offset)
        self._own_lease(arr, key, give_back)  # (given back at once if building fails)
        if kind == "torch":
            if nbytes == 0:
                v = torch.empty(shape if not raw else (0,), dtype=td or torch.uint8)
            elif raw:
                v = torch.frombuffer(arr, dtype=torch.uint8)
            else:
                v = _unviewed(torch.frombuffer(arr, dtype=td).view(shape))
        elif kind == "numpy":
            if nbytes == 0:
                v = np.empty(0, dtype=np.uint8)
            elif npname is None:
                # numpy has no such dtype (bfloat16, float8_*): the raw bytes, each
                # element's bytes along a new last axis (little-endian), or flat when raw.
                v = np.frombuffer(arr, dtype=np.uint8)
                if not raw:
                    v = v.reshape(tuple(shape) + (element_size(name),))
            else:
                v = np.frombuffer(arr, dtype=np.dtype(npname)).reshape(shape)
            v.flags.writeable = False
        else:
            v = memoryview(arr).cast("B")  # the flat bytes; shape and dtype are the caller's
        del arr
        self._handed_out(key, v, kind)
        return v
