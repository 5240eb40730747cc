"""CUDA memory from Python: sources the library reads on the device, pools in device
memory, and zero-copy views of them.

The library loads the CUDA driver at run time (``libcuda.so.1``, or the file named by
``ECT_CUDA_LIBRARY``); torch loads the same driver, so a pointer torch allocated is one
the library can copy from and to. Nothing here needs torch: a device array is anything
exposing ``__cuda_array_interface__`` (torch, cupy, numba, :class:`DeviceArray`).

Sources. A CUDA tensor pushed or saved is *borrowed*: its device pointer goes to the
library (``ect_push_item.data`` with a release callback), which reads it after the call
returns: over shm into a CUDA pool with one device-to-device copy through CUDA IPC (no
host copy), over tcp with one device-to-host copy into pinned staging. The binding
keeps the tensor alive until the library's release callback fires; the caller must not
change it in place before the transfer's result (poll) is in.

Pools. A consumer whose ``ec_buffer_device`` is "cuda" / "cuda:N" gets its pool from
the binding (:class:`DevicePool`: ``ect_mem_alloc``, handed over as ``pool_memory``), so
the memory outlives the consumer for as long as a view of it lives, as a host pool's
mapping does. Views are torch CUDA tensors (``torch.as_tensor`` of an object exposing
``__cuda_array_interface__``; torch keeps that object alive as long as the tensor's
storage) or, without a CUDA torch, :class:`DeviceArray` objects. Lease rules are those of
``_tensors.PoolMap.view``; a lease of a torch view is given back once the current CUDA
stream has passed the point where the view died (a CUDA event, waited for by a helper
thread), so a kernel still queued to read it never sees the next item's bytes. Views
used on another stream must be synchronized by the caller before they are dropped.
"""

from __future__ import annotations

import ctypes
import itertools
import threading
import weakref
from typing import Any, Callable

from . import _lib, _tensors
from ._lib import Error, check, ECT_EINVAL, ECT_ENOTSUP, ECT_ERANGE
from ._tensors import np, torch

MEM_HOST, MEM_PINNED, MEM_CUDA = 0, 1, 2
DEFAULT_POOL_BYTES = 1_000_000_000  # the consumers' pool_size default (ect_*_opts_init)

# numpy's typestr of the dtypes numpy has (the interface describes the elements);
# the others (bfloat16, float8_*) are exported as unsigned integers of their size.
_TYPESTR = {
    "float16": "<f2", "float32": "<f4", "float64": "<f8", "int8": "|i1", "uint8": "|u1",
    "int16": "<i2", "uint16": "<u2", "int32": "<i4", "uint32": "<u4", "int64": "<i8",
    "uint64": "<u8", "bool": "|b1", "complex64": "<c8", "complex128": "<c16",
}
_RAW_TYPESTR = {1: "|u1", 2: "<u2", 4: "<u4", 8: "<u8"}
_FROM_TYPESTR = {v[1:]: k for k, v in _TYPESTR.items()}


# ------------------------------------------------------------------ the driver

_info_lock = threading.Lock()
_info: dict | None = None


def cuda_info() -> dict:
    """What the library's CUDA driver offers this process (loads it on first use):
    available, driver_version, devices, library, device0, why (empty when available)."""
    global _info
    with _info_lock:
        if _info is None:
            buf = _lib.buffer_for("ect_cuda_info")
            _lib.lib.ect_cuda_get_info(buf)
            ci = _lib.struct_at(buf, "ect_cuda_info")
            _info = {
                "available": bool(ci.available),
                "driver_version": int(ci.driver_version),
                "devices": int(ci.devices),
                "library": _lib.text(ci.library),
                "device0": _lib.text(ci.device0),
                "why": _lib.text(ci.why),
            }
        return dict(_info)


def kind_of(address: int) -> tuple[int, int]:
    """(memory kind, device) of an address as the library's driver sees it (MEM_HOST
    for everything when the driver is unavailable)."""
    if not cuda_info()["available"]:
        return MEM_HOST, 0
    k, d = ctypes.c_int(), ctypes.c_int()
    _lib.lib.ect_mem_kind_of(address, ctypes.byref(k), ctypes.byref(d))
    return k.value, d.value


def reaches(t) -> bool:
    """True if the library can read the CUDA tensor t where it is (its driver sees the
    pointer as device memory); False: the caller copies it to host memory."""
    return kind_of(t.data_ptr())[0] == MEM_CUDA


def copy(dst: int, src: int, nbytes: int) -> None:
    """ect_mem_copy: nbytes between any two kinds, done when this returns."""
    check(_lib.lib.ect_mem_copy(dst, src, nbytes))


def _torch_cuda() -> bool:
    return torch is not None and torch.cuda.is_available()


# ------------------------------------------------------------------ borrowing

_borrowed: dict[int, Any] = {}
_borrow_lock = threading.Lock()
_keys = itertools.count(1)


def borrow(keep: Any) -> int:
    """Keeps `keep` alive until the library's release callback names the key returned."""
    key = next(_keys)
    with _borrow_lock:
        _borrowed[key] = keep
    return key


def unborrow(key: int) -> None:
    with _borrow_lock:
        _borrowed.pop(key, None)


def borrowed() -> int:
    """How many sources the library holds now (tests)."""
    with _borrow_lock:
        return len(_borrowed)


def _push_released(user, data, nbytes):  # ect_push_release_fn, on a library thread
    unborrow(user or 0)


def _pull_released(user, data):  # ect_pull_release_fn
    unborrow(user or 0)


# Module-level: the callbacks outlive every handle that could call them.
PUSH_RELEASE = _lib.PUSH_RELEASE_FN(_push_released)
PULL_RELEASE = _lib.PULL_RELEASE_FN(_pull_released)
PUSH_RELEASE_PTR = ctypes.cast(PUSH_RELEASE, ctypes.c_void_p).value
PULL_RELEASE_PTR = ctypes.cast(PULL_RELEASE, ctypes.c_void_p).value


# ------------------------------------------------------------------ sources

def interface_source(obj: Any, dtype: Any, shape: Any) -> _tensors.Source:
    """The device bytes of an object exposing __cuda_array_interface__ (C-contiguous,
    unmasked, in memory the library's driver sees as CUDA)."""
    try:
        cai = obj.__cuda_array_interface__
        shp = tuple(int(d) for d in cai["shape"])
        typestr = str(cai["typestr"])
        ptr = int(cai["data"][0] or 0)
    except (AttributeError, KeyError, TypeError, ValueError, IndexError) as e:
        raise Error(ECT_EINVAL, f"a malformed __cuda_array_interface__: {e}") from None
    if cai.get("mask") is not None:
        raise Error(ECT_EINVAL, "a masked CUDA array cannot be pushed")
    itemsize = int(typestr[2:]) if typestr[2:].isdigit() else 0
    base_name = _FROM_TYPESTR.get(typestr[1:]) if typestr[:1] in "<|=" else None
    if base_name is None and dtype is None:
        raise Error(ECT_EINVAL, f"CUDA array typestr {typestr!r} has no torch dtype; pass dtype=")
    if base_name is None:
        base_name = "uint8"
        count = 1
        for d in shp:
            count *= d
        nbytes = count * itemsize
    else:
        nbytes = _tensors.element_size(base_name)
        for d in shp:
            nbytes *= d
    strides = cai.get("strides")
    if strides is not None:
        want, step = [], itemsize or _tensors.element_size(base_name)
        for d in reversed(shp):
            want.insert(0, step)
            step *= d
        if tuple(int(x) for x in strides) != tuple(want) and nbytes:
            raise Error(ECT_EINVAL, "the CUDA array is not C-contiguous: make it so first")
    stream = cai.get("stream")
    if stream is not None:  # writes queued on it must be done before the library reads
        if not _torch_cuda():
            raise Error(ECT_ENOTSUP, "the CUDA array names a stream to wait for and torch "
                        "(CUDA) is not here to wait for it: synchronize it and export "
                        "without a stream")
        if stream == 1:
            torch.cuda.default_stream().synchronize()
        elif stream == 2:
            torch.cuda.current_stream().synchronize()
        else:
            torch.cuda.ExternalStream(stream).synchronize()
    if nbytes and kind_of(ptr)[0] != MEM_CUDA:
        why = cuda_info()["why"]
        raise Error(ECT_ENOTSUP, "the CUDA array is not device memory this library's CUDA "
                    "driver sees" + (f" ({why})" if why else ""))
    s, name = _tensors.shape_and_dtype(nbytes, shape, dtype, shp, base_name)
    return _tensors.Source(ptr, nbytes, s, name, obj, kind_of(ptr)[1] if nbytes else None)


# ------------------------------------------------------------------ views

class DeviceArray:
    """A zero-copy view of CUDA device memory: an item of a consumer pool that lives
    on a GPU (what ``take`` / ``load`` return there without a CUDA torch, or with
    ``out="device"``), or memory of its own (:meth:`from_host`).

    It exposes ``__cuda_array_interface__``, so torch.as_tensor, cupy.asarray and
    numba.cuda.as_cuda_array use it without copying, and it can be pushed. The host
    reads it only through copies: :meth:`tobytes`, :meth:`numpy`. ``dtype`` is the
    library's name; dtypes numpy has no name for (bfloat16, float8_*) are exported as
    unsigned integers of the element's size. After ``release`` of its item, every use
    raises ValueError.
    """

    __slots__ = ("_ptr", "nbytes", "shape", "dtype", "device", "_keep", "__weakref__")

    def __init__(self, ptr: int, nbytes: int, shape, dtype: str, device: int, keep: Any = None):
        self._ptr = ptr
        self.nbytes = int(nbytes)
        self.shape = tuple(int(d) for d in shape)
        self.dtype = dtype
        self.device = int(device)
        self._keep = keep  # what the memory belongs to (a DevicePool, an allocation)

    @classmethod
    def from_host(cls, data: Any, device: int = 0, *, dtype: Any = None,
                  shape: Any = None) -> "DeviceArray":
        """A new allocation on `device` (ect_mem_alloc) holding a copy of data (a host
        tensor, numpy array or buffer); freed when the array is garbage-collected."""
        src = _tensors.source(data, dtype, shape)
        if src.device is not None:
            raise Error(ECT_EINVAL, "from_host: data is device memory already")
        mem = _Allocation(device, max(1, src.nbytes))
        if src.nbytes:
            copy(mem.ptr, src.address, src.nbytes)
        return cls(mem.ptr, src.nbytes, src.shape, src.dtype, device, mem)

    @property
    def ptr(self) -> int:
        if self._ptr is None:
            raise ValueError("this DeviceArray was released")
        return self._ptr

    @property
    def __cuda_array_interface__(self) -> dict:
        ptr = self.ptr
        esize = _tensors.element_size(self.dtype)
        typestr = _TYPESTR.get(self.dtype) or _RAW_TYPESTR.get(esize)
        shape = self.shape if typestr else self.shape + (esize,)
        return {
            "shape": shape,
            "typestr": typestr or "|u1",
            "data": (ptr if self.nbytes else 0, False),
            "version": 2,
            "strides": None,
        }

    def tobytes(self) -> bytes:
        """The bytes, copied device to host."""
        buf = ctypes.create_string_buffer(self.nbytes)
        if self.nbytes:
            copy(ctypes.addressof(buf), self.ptr, self.nbytes)
        return buf.raw

    def numpy(self):
        """A host copy as a numpy array of the item's shape (numpy has no bfloat16 /
        float8: those come as uint8 with each element's bytes along a new last axis)."""
        if np is None:
            raise Error(ECT_ENOTSUP, "numpy is not installed")
        raw = np.frombuffer(self.tobytes(), dtype=np.uint8)
        npname = _tensors._NUMPY_NAMES.get(self.dtype)
        if npname is None:
            return raw.reshape(self.shape + (_tensors.element_size(self.dtype),))
        return raw.view(np.dtype(npname)).reshape(self.shape)

    def _release(self) -> None:
        self._ptr = None

    def __repr__(self) -> str:
        state = "released" if self._ptr is None else f"0x{self._ptr:x}"
        return f"DeviceArray(shape={self.shape}, dtype={self.dtype}, cuda:{self.device}, {state})"


class _Allocation:
    """CUDA memory the binding allocated; freed when the last holder lets go (not at
    interpreter exit: a library thread may still use it then; the process ends)."""

    def __init__(self, device: int, nbytes: int):
        out = ctypes.c_void_p()
        check(_lib.lib.ect_mem_alloc(MEM_CUDA, device, nbytes, ctypes.byref(out)))
        self.ptr = out.value
        fin = weakref.finalize(self, _lib.lib.ect_mem_free, MEM_CUDA, out.value)
        fin.atexit = False


class DevicePool(_tensors.ViewTable):
    """A consumer pool in CUDA memory that the binding owns, and the views into it.

    The consumer gets the memory as ``pool_memory``; every view holds this object, so
    the memory is freed only once the consumer closed and the last view died.
    """

    def __init__(self, device: int, capacity: int, external: int | None = None):
        super().__init__()
        self.device = int(device)
        self.capacity = int(capacity)
        self._mem = None if external else _Allocation(self.device, self.capacity)
        self.base = external or self._mem.ptr
        self._returner = None  # started on the first lease that must wait for the GPU

    def view(self, key: str, address: int, nbytes: int, shape: tuple[int, ...], dtype: str,
             out: str | None, raw: bool, give_back: Callable[[], None]):
        """As PoolMap.view, for a device pool: out=None gives a torch CUDA tensor when
        torch has CUDA, else a DeviceArray; out="torch" / "device" ask for one."""
        kind = out or ("torch" if _torch_cuda() else "device")
        name = dtype[6:] if dtype.startswith("torch.") else dtype
        td = None
        offset = address - self.base
        try:  # refusals first, while nothing holds the lease but this call
            if kind in ("numpy", "memoryview"):
                raise Error(ECT_ENOTSUP, f"out={kind!r}: the pool is CUDA memory; out='torch' "
                            "(a CUDA tensor) or out='device' (a DeviceArray; .numpy() copies "
                            "it to the host)")
            if kind not in ("torch", "device"):
                raise Error(ECT_EINVAL, f"out={kind!r}: torch or device (a CUDA pool)")
            if kind == "torch" and not _torch_cuda():
                raise Error(ECT_ENOTSUP, "a CUDA tensor needs torch with CUDA; out='device' "
                            "gives a DeviceArray")
            if kind == "torch" and np is None:
                raise Error(ECT_ENOTSUP, "torch reads __cuda_array_interface__ through numpy, "
                            "which is not installed; out='device' gives a DeviceArray")
            if kind == "torch" and not raw:
                td = _tensors.torch_dtype(name)
                if td is None:
                    raise Error(ECT_ENOTSUP, f"this torch ({torch.__version__}) has no dtype "
                                f"{name}; take(..., raw=True) gives the bytes as uint8")
            if offset < 0 or offset + nbytes > self.capacity:
                raise Error(ECT_ERANGE, f"view of {key!r} lies outside the pool")
        except BaseException:
            give_back()
            raise
        if kind == "device":
            v = DeviceArray(address, nbytes, (nbytes,) if raw else shape,
                            "uint8" if raw else name, self.device, self)
            self._own_lease(v, key, give_back)
        else:
            holder = DeviceArray(address, nbytes, (nbytes,), "uint8", self.device, self)
            self._own_lease(holder, key, give_back)  # torch's storage keeps holder alive
            dev = torch.device("cuda", self.device)
            if nbytes == 0:
                v = torch.empty((0,) if raw else shape, dtype=td or torch.uint8, device=dev)
            else:
                with torch.cuda.device(dev):
                    b = torch.as_tensor(holder, device=dev)
                v = b if raw else _tensors._unviewed(b.view(td).view(shape))
            del holder
        self._handed_out(key, v, kind)
        return v

    def _return_lease(self, give_back: Callable[[], None]) -> None:
        # Kernels queued on the current stream may still read the view that just died:
        # its lease returns once the stream passed this point (a CUDA event), never
        # before, and without making this thread wait (a helper thread does).
        if torch is None or not torch.cuda.is_initialized() \
                or torch.cuda.is_current_stream_capturing():
            give_back()  # no torch work can be queued on it (or none runs now)
            return
        try:
            ev = torch.cuda.Event()
            ev.record(torch.cuda.current_stream(self.device))
            done = ev.query()
        except Exception:  # pragma: no cover - a torch that cannot record here
            torch.cuda.synchronize(self.device)
            give_back()
            return
        if done:
            give_back()
            return
        if self._returner is None:
            self._returner = _Returner(self)
        self._returner.put(ev, give_back)

    def close(self) -> None:
        super().close()
        r, self._returner = self._returner, None
        if r is not None:
            r.stop()


class _Returner:
    """A daemon thread giving back the leases of dead device views once their CUDA
    events completed (torch releases the GIL while it waits)."""

    def __init__(self, pool: DevicePool):
        import queue

        self.q: "queue.SimpleQueue" = queue.SimpleQueue()
        self.pool = weakref.ref(pool)
        threading.Thread(target=self._run, name="ectransfer-leases", daemon=True).start()

    def put(self, ev, give_back) -> None:
        self.q.put((ev, give_back))

    def stop(self) -> None:
        self.q.put((None, None))

    def _run(self) -> None:
        while True:
            ev, give_back = self.q.get()
            if ev is None:
                return
            try:
                ev.synchronize()
            except Exception:  # pragma: no cover - a broken context: nothing runs any more
                pass
            pool = self.pool()
            if pool is None:
                return
            with pool.lock:
                if not pool.closed:
                    give_back()
            del pool


def pool_for(cfg: dict) -> DevicePool | None:
    """For a consumer configuration (a dict, changed in place) whose ec_buffer_device is
    CUDA: the DevicePool to use, its address set as pool_memory (unless the caller gave
    one) and the device made explicit ("cuda" is torch's current device when torch has
    CUDA, else device 0). None for host pools, and for values the library will refuse
    with its own message."""
    spec = cfg.get("ec_buffer_device")
    if not isinstance(spec, str):
        return None
    kind, dev = ctypes.c_int(), ctypes.c_int()
    if _lib.lib.ect_mem_parse_device(spec.encode(), ctypes.byref(kind), ctypes.byref(dev)):
        return None
    if kind.value != MEM_CUDA:
        return None
    index = dev.value
    if ":" not in spec and _torch_cuda():
        index = torch.cuda.current_device()
    size = cfg.get("ec_buffer_size", DEFAULT_POOL_BYTES)
    if isinstance(size, bool) or not isinstance(size, (int, float)) or not size > 0 \
            or float(size) != int(size):
        return None
    ext = cfg.get("pool_memory")
    if ext is not None and (isinstance(ext, bool) or not isinstance(ext, int) or ext <= 0):
        return None
    pool = DevicePool(index, int(size), ext)
    cfg["pool_memory"] = pool.base
    cfg["ec_buffer_device"] = f"cuda:{index}"
    cfg["ec_buffer_size"] = int(size)
    return pool

