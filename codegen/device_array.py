"""Arrays in GPU memory: polyc's own :class:`DeviceArray`, and other libraries' arrays
(CuPy, PyTorch, Numba, JAX...) through ``__cuda_array_interface__`` or DLPack.

A CUDA operator called with device arrays runs on them where they are, with no copies
(``<fn>_device`` in the generated library, :mod:`.cuda`); its outputs are
:class:`DeviceArray` objects, which other libraries take in turn (they export
``__cuda_array_interface__``, version 3) and which :meth:`DeviceArray.numpy` copies to
the host. Host (numpy) arrays mixed in are uploaded for the call.

:func:`device_view` reads another library's array without taking it over: the pointer,
shape and dtype, after checking that it is C-contiguous, unmasked and on a CUDA device.
DLPack capsules are consumed as the protocol says (renamed ``used_dltensor``, their
deleter called once the call is done). Under the CPU emulation (``emulate=True``) a
"device" pointer is one the emulated ``cudaMalloc`` returned; a host pointer passed as a
device array is caught at the launch (``cudaErrorIllegalAddress``).
"""
from __future__ import annotations

import ctypes
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from polyc.errors import CallError

#: cudaMemcpyKind values
HOST_TO_DEVICE, DEVICE_TO_HOST, DEVICE_TO_DEVICE = 1, 2, 3
#: DLPack device types that are CUDA device memory (kDLCUDA, kDLCUDAManaged)
DLPACK_CUDA = (2, 13)
#: DLPack type codes (kDLInt, kDLUInt, kDLFloat, kDLBool)
_DLPACK_KINDS = {0: "i", 1: "u", 2: "f", 6: "b"}


class DeviceMemory:
    """The device-memory calls of one generated CUDA library (``<fn>_device_malloc``,
    ``_free``, ``_memcpy``, ``_memset``), each checked: a failure raises
    :class:`CallError` with the library's message."""

    def __init__(self, lib: ctypes.CDLL, function: str) -> None:
        self.function = function
        self._error = getattr(lib, f"{function}_last_error")
        self._error.restype, self._error.argtypes = ctypes.c_char_p, []
        self._malloc = self._bind(lib, "malloc", [ctypes.POINTER(ctypes.c_void_p), ctypes.c_size_t])
        self._free = self._bind(lib, "free", [ctypes.c_void_p])
        self._memcpy = self._bind(lib, "memcpy", [ctypes.c_void_p, ctypes.c_void_p,
                                                   ctypes.c_size_t, ctypes.c_int])
        self._memset = self._bind(lib, "memset", [ctypes.c_void_p, ctypes.c_int, ctypes.c_size_t])

    def _bind(self, lib: ctypes.CDLL, what: str, argtypes: list[Any]) -> Any:
        fn = getattr(lib, f"{self.function}_device_{what}")
        fn.restype, fn.argtypes = ctypes.c_int, argtypes
        return fn

    def _check(self, status: int, what: str) -> None:
        if status != 0:
            message = (self._error() or b"").decode(errors="replace")
            raise CallError(f"{self.function}: {what}: {message}")

    def malloc(self, nbytes: int) -> int:
        p = ctypes.c_void_p()
        self._check(self._malloc(ctypes.byref(p), nbytes), f"allocating {nbytes} bytes")
        return int(p.value or 0)

    def free(self, pointer: int) -> None:
        self._check(self._free(pointer), "freeing a device array")

    def copy(self, to: int, source: int, nbytes: int, kind: int) -> None:
        if nbytes:
            self._check(self._memcpy(to, source, nbytes, kind), "copying")

    def zero(self, pointer: int, nbytes: int) -> None:
        if nbytes:
            self._check(self._memset(pointer, 0, nbytes), "zeroing a device array")


class _Extent:
    """``nbytes``, ``ndim`` and ``size`` from ``shape`` and ``dtype``."""
    shape: tuple[int, ...]
    dtype: np.dtype

    @property
    def size(self) -> int:
        return int(np.prod(self.shape, dtype=np.int64))

    @property
    def nbytes(self) -> int:
        return self.size * self.dtype.itemsize

    @property
    def ndim(self) -> int:
        return len(self.shape)


@dataclass(frozen=True)
class DeviceView(_Extent):
    """What a call needs of a device array: its pointer, shape and dtype (``keep`` holds
    whatever must stay alive meanwhile; ``release`` runs once the call is done)."""
    pointer: int
    shape: tuple[int, ...]
    dtype: np.dtype
    keep: Any = None
    release: Any = field(default=None, compare=False)
    readonly: bool = False


class DeviceArray(_Extent):
    """A C-contiguous array in device memory, owned by polyc (freed when collected).

    ``__cuda_array_interface__`` (version 3) lets CuPy, PyTorch, Numba take it without a
    copy; :meth:`numpy` copies it to the host."""

    def __init__(self, shape: tuple[int, ...], dtype: Any, memory: DeviceMemory,
                 zero: bool = True) -> None:
        self.shape = tuple(int(n) for n in shape)
        self.dtype = np.dtype(dtype)
        self._memory = memory
        self.pointer = 0
        self.pointer = memory.malloc(self.nbytes)
        if zero:
            memory.zero(self.pointer, self.nbytes)

    @classmethod
    def from_host(cls, array: np.ndarray, memory: DeviceMemory) -> DeviceArray:
        """A device copy of ``array``."""
        host = np.ascontiguousarray(array)
        out = cls(host.shape, host.dtype, memory, zero=False)
        memory.copy(out.pointer, host.ctypes.data, out.nbytes, HOST_TO_DEVICE)
        return out

    def numpy(self) -> np.ndarray:
        """A host copy."""
        host = np.empty(self.shape, self.dtype)
        self._memory.copy(host.ctypes.data, self.pointer, self.nbytes, DEVICE_TO_HOST)
        return host

    def __array__(self, dtype: Any = None, copy: Any = None) -> np.ndarray:
        host = self.numpy()
        return host if dtype is None else host.astype(dtype)

    @property
    def __cuda_array_interface__(self) -> dict[str, Any]:
        return {"shape": self.shape, "typestr": self.dtype.str, "strides": None,
                "data": (self.pointer, False), "version": 3, "stream": None}

    def __dlpack_device__(self) -> tuple[int, int]:
        return (2, 0)

    def __repr__(self) -> str:
        return f"DeviceArray(shape={self.shape}, dtype={self.dtype}, pointer={self.pointer:#x})"

    def __del__(self) -> None:
        if getattr(self, "pointer", 0):
            try:
                self._memory.free(self.pointer)
            except Exception:  # noqa: BLE001 -- never raise from a finaliser
                pass
            self.pointer = 0


def is_device_array(x: Any) -> bool:
    """Whether ``x`` is in CUDA device memory by its own account (it exports
    ``__cuda_array_interface__``, or DLPack says a CUDA device)."""
    if isinstance(x, np.ndarray):
        return False
    if hasattr(x, "__cuda_array_interface__"):
        return True
    dev = getattr(x, "__dlpack_device__", None)
    if dev is None:
        return False
    try:
        return int(dev()[0]) in DLPACK_CUDA
    except Exception:  # noqa: BLE001 -- a broken producer is treated as host data
        return False


def device_view(x: Any, where: str) -> DeviceView:
    """The pointer, shape and dtype of a device array (see :func:`is_device_array`);
    :class:`CallError` naming ``where`` if it is not C-contiguous or is masked."""
    if isinstance(x, DeviceArray):
        return DeviceView(x.pointer, x.shape, x.dtype, keep=x)
    if hasattr(x, "__cuda_array_interface__"):
        return _from_interface(x, where)
    return _from_dlpack(x, where)


def _from_interface(x: Any, where: str) -> DeviceView:
    cai = x.__cuda_array_interface__
    try:
        shape = tuple(int(n) for n in cai["shape"])
        dtype = np.dtype(cai["typestr"])
        pointer = int(cai["data"][0] or 0)
    except (KeyError, TypeError, ValueError, IndexError) as err:
        raise CallError(f"{where}: malformed __cuda_array_interface__ ({err})") from None
    if cai.get("mask") is not None:
        raise CallError(f"{where}: masked device arrays are not supported")
    strides = cai.get("strides")
    if strides is not None and tuple(strides) != _c_strides(shape, dtype.itemsize):
        raise CallError(f"{where}: the device array must be C-contiguous (strides "
                        f"{tuple(strides)}, shape {shape}); make a contiguous copy first")
    readonly = bool(cai["data"][1]) if len(cai["data"]) > 1 else False
    return DeviceView(pointer, shape, dtype, keep=x, readonly=readonly)


def _c_strides(shape: tuple[int, ...], itemsize: int) -> tuple[int, ...]:
    out, step = [], itemsize
    for n in reversed(shape):
        out.append(step)
        step *= max(n, 1)
    return tuple(reversed(out))


class _DLDevice(ctypes.Structure):
    _fields_ = [("device_type", ctypes.c_int32), ("device_id", ctypes.c_int32)]


class _DLDataType(ctypes.Structure):
    _fields_ = [("code", ctypes.c_uint8), ("bits", ctypes.c_uint8), ("lanes", ctypes.c_uint16)]


class _DLTensor(ctypes.Structure):
    _fields_ = [("data", ctypes.c_void_p), ("device", _DLDevice), ("ndim", ctypes.c_int32),
                ("dtype", _DLDataType), ("shape", ctypes.POINTER(ctypes.c_int64)),
                ("strides", ctypes.POINTER(ctypes.c_int64)), ("byte_offset", ctypes.c_uint64)]


class _DLManagedTensor(ctypes.Structure):
    pass


_DELETER = ctypes.CFUNCTYPE(None, ctypes.POINTER(_DLManagedTensor))
_DLManagedTensor._fields_ = [("dl_tensor", _DLTensor), ("manager_ctx", ctypes.c_void_p),
                             ("deleter", _DELETER)]

_capsule_pointer = ctypes.pythonapi.PyCapsule_GetPointer
_capsule_pointer.restype, _capsule_pointer.argtypes = ctypes.c_void_p, [ctypes.py_object,
                                                                        ctypes.c_char_p]
_capsule_rename = ctypes.pythonapi.PyCapsule_SetName
_capsule_rename.restype, _capsule_rename.argtypes = ctypes.c_int, [ctypes.py_object,
                                                                   ctypes.c_char_p]
_capsule_valid = ctypes.pythonapi.PyCapsule_IsValid
_capsule_valid.restype, _capsule_valid.argtypes = ctypes.c_int, [ctypes.py_object,
                                                                 ctypes.c_char_p]


def _from_dlpack(x: Any, where: str) -> DeviceView:
    """A (legacy, unversioned) DLPack capsule of ``x``: consumed, its deleter called by
    the view's ``release`` once the call is done."""
    try:
        capsule = x.__dlpack__(stream=None)
    except TypeError:
        capsule = x.__dlpack__()
    if not _capsule_valid(capsule, b"dltensor"):
        raise CallError(f"{where}: __dlpack__ did not return a 'dltensor' capsule")
    address = _capsule_pointer(capsule, b"dltensor")
    managed = ctypes.cast(address, ctypes.POINTER(_DLManagedTensor))
    _capsule_rename(capsule, b"used_dltensor")  # ours now: the capsule will not delete it

    def release() -> None:
        if managed.contents.deleter:
            managed.contents.deleter(managed)

    t = managed.contents.dl_tensor
    try:
        if t.device.device_type not in DLPACK_CUDA:
            raise CallError(f"{where}: DLPack device type {t.device.device_type} is not CUDA")
        kind = _DLPACK_KINDS.get(t.dtype.code)
        if kind is None or t.dtype.lanes != 1:
            raise CallError(f"{where}: DLPack dtype (code {t.dtype.code}, {t.dtype.bits} bits, "
                            f"{t.dtype.lanes} lanes) is not supported")
        dtype = np.dtype(np.bool_) if kind == "b" else np.dtype(f"{kind}{t.dtype.bits // 8}")
        shape = tuple(int(t.shape[i]) for i in range(t.ndim))
        if t.strides:
            strides = tuple(int(t.strides[i]) * dtype.itemsize for i in range(t.ndim))
            if strides != _c_strides(shape, dtype.itemsize) and 0 not in shape:
                raise CallError(f"{where}: the DLPack tensor must be C-contiguous (strides "
                                f"{strides} bytes, shape {shape})")
        pointer = int(t.data or 0) + int(t.byte_offset)
    except BaseException:
        release()
        raise
    return DeviceView(pointer, shape, dtype, keep=(x, capsule), release=release)
