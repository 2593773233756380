"""Device arrays (issue 10): CUDA operators take arrays that already live in device
memory -- polyc's DeviceArray, any object with ``__cuda_array_interface__`` (CuPy,
PyTorch, Numba), DLPack capsules -- and run on them without copies.

Without a GPU these run on the CPU emulation, whose device memory is one registry per
process (a pointer one library's cudaMalloc returned is a device pointer for every
library, as on a GPU), and whose launches refuse host pointers.
"""
from __future__ import annotations

import ctypes
import shutil

import numpy as np
import pytest

import polyc
from polyc.codegen import device_array
from polyc.codegen.device_array import DeviceArray

MATMUL = "def mm(float(M,K) A, float(K,N) B) -> (C) { C(m,n) +=! A(m,k) * B(k,n) }"
RELU = "def relu(float(M,N) X) -> (Y) { Y(m,n) = fmax(X(m,n), 0.0) }"


def emu(tc: str) -> polyc.Operator:
    return polyc.define(tc, target="cuda", emulate=True)


@pytest.fixture
def rng():
    return np.random.default_rng(7)


def test_device_in_device_out_and_chained_operators(rng):
    A = rng.standard_normal((37, 29), dtype=np.float32)
    B = rng.standard_normal((29, 41), dtype=np.float32)
    dA, dB = polyc.to_device(A, emulate=True), polyc.to_device(B, emulate=True)
    dC = emu(MATMUL)(dA, dB)
    assert isinstance(dC, DeviceArray) and dC.shape == (37, 41) and dC.dtype == np.float32
    np.testing.assert_allclose(dC.numpy(), A @ B, rtol=1e-5, atol=1e-5)
    # a second operator (another library) takes the first one's output where it is
    dY = emu(RELU)(dC)
    np.testing.assert_allclose(np.asarray(dY), np.maximum(A @ B, 0), rtol=1e-5, atol=1e-5)


def test_host_inputs_mixed_with_device_inputs_are_uploaded(rng):
    A = rng.standard_normal((5, 7), dtype=np.float32)
    B = rng.standard_normal((7, 3), dtype=np.float32)
    out = emu(MATMUL)(polyc.to_device(A, emulate=True), B)
    assert isinstance(out, DeviceArray)
    np.testing.assert_allclose(out.numpy(), A @ B, rtol=1e-5, atol=1e-5)


def test_given_device_outputs_are_updated_in_place(rng):
    A = rng.standard_normal((6, 4), dtype=np.float32)
    B = rng.standard_normal((4, 9), dtype=np.float32)
    C0 = rng.standard_normal((6, 9), dtype=np.float32)
    op = emu(MATMUL)
    fn = op.compiled_for({"M": 6, "K": 4, "N": 9}).function
    dC = polyc.to_device(C0, emulate=True)
    (same,) = fn([polyc.to_device(A, emulate=True), B], outputs=[dC])
    assert same is dC  # no new array: C = A @ B written where C is
    np.testing.assert_allclose(dC.numpy(), A @ B, rtol=1e-5, atol=1e-5)


class ForeignArray:
    """What CuPy or PyTorch show polyc: only ``__cuda_array_interface__`` (here over
    device memory polyc allocated, standing in for the other library's allocator)."""

    def __init__(self, owner: DeviceArray, **changes):
        self.owner = owner
        self.interface = dict(owner.__cuda_array_interface__, **changes)

    @property
    def __cuda_array_interface__(self):
        return self.interface


def test_cuda_array_interface_of_other_libraries(rng):
    A = rng.standard_normal((8, 8), dtype=np.float32)
    dA = polyc.to_device(A, emulate=True)
    Y = emu(RELU)(ForeignArray(dA, strides=(32, 4)))  # C-contiguous strides are fine
    np.testing.assert_array_equal(Y.numpy(), np.maximum(A, 0))
    # what polyc returns, another library reads the same way
    cai = Y.__cuda_array_interface__
    assert cai["shape"] == (8, 8) and cai["typestr"] == "<f4" and cai["version"] == 3


@pytest.mark.parametrize("changes, words", [
    ({"strides": (4, 32)}, "C-contiguous"),
    ({"mask": object()}, "masked"),
    ({"typestr": "<f8"}, "expected a device array of float32"),
])
def test_unusable_device_arrays_are_refused(rng, changes, words):
    dA = polyc.to_device(rng.standard_normal((8, 8), dtype=np.float32), emulate=True)
    with pytest.raises(polyc.CallError, match=words):
        emu(RELU)(ForeignArray(dA, **changes))


def test_device_outputs_checked(rng):
    A = rng.standard_normal((4, 4), dtype=np.float32)
    op = emu(RELU)
    fn = op.compiled_for({"M": 4, "N": 4}).function
    dA = polyc.to_device(A, emulate=True)
    with pytest.raises(polyc.CallError, match="expected a float32"):
        fn([dA], outputs=[polyc.to_device(np.zeros((4, 5), np.float32), emulate=True)])
    with pytest.raises(polyc.CallError, match="read-only"):
        fn([dA], outputs=[ForeignArray(polyc.to_device(A, emulate=True), data=(0, True))])
    with pytest.raises(polyc.CallError, match="must not alias"):
        fn([dA], outputs=[dA])
    with pytest.raises(polyc.CallError, match="expected a device array"):
        fn([dA], outputs=[np.zeros((4, 4), np.float32)])


@pytest.mark.emulation_only
def test_host_pointer_posing_as_device_array_is_caught_at_the_launch(rng):
    A = rng.standard_normal((4, 4), dtype=np.float32)
    op = emu(RELU)
    host = {"shape": A.shape, "typestr": "<f4", "data": (A.ctypes.data, False),
            "version": 3, "strides": None}
    fake = type("Fake", (), {"__cuda_array_interface__": host})()
    with pytest.raises(polyc.CallError, match="cudaErrorIllegalAddress"):
        op(fake)
    lib = polyc.codegen.load_library(op.compiled_for({"M": 4, "N": 4}).function.path)
    lib.polyc_emu_reset()  # the emulated device's sticky error, as a new context would


# -- DLPack ------------------------------------------------------------------------------

# the DLPack structures as polyc reads them (one definition, in polyc.codegen.device_array)
_DLDevice, _DLDataType = device_array._DLDevice, device_array._DLDataType
_Managed, _Deleter = device_array._DLManagedTensor, device_array._DELETER
_new_capsule = ctypes.pythonapi.PyCapsule_New
_new_capsule.restype = ctypes.py_object
_new_capsule.argtypes = [ctypes.c_void_p, ctypes.c_char_p, ctypes.c_void_p]


class DLPackProducer:
    """A producer written to the DLPack spec (legacy capsule), over a DeviceArray."""

    def __init__(self, owner: DeviceArray, device_type: int = 2, strides=None):
        self.owner, self.deleted = owner, 0
        self.shape = (ctypes.c_int64 * owner.ndim)(*owner.shape)
        self.strides = None if strides is None else (ctypes.c_int64 * owner.ndim)(*strides)
        self.deleter = _Deleter(self._delete)
        self.managed = _Managed()
        t = self.managed.dl_tensor
        t.data, t.ndim, t.byte_offset = owner.pointer, owner.ndim, 0
        t.device = _DLDevice(device_type, 0)
        t.dtype = _DLDataType(2, 32, 1)  # float32
        t.shape = self.shape
        if self.strides is not None:
            t.strides = self.strides
        self.managed.deleter = self.deleter

    def _delete(self, _managed) -> None:
        self.deleted += 1

    def __dlpack_device__(self):
        return (self.managed.dl_tensor.device.device_type, 0)

    def __dlpack__(self, stream=None):
        return _new_capsule(ctypes.addressof(self.managed), b"dltensor", None)


def test_dlpack_capsules_are_consumed(rng):
    A = rng.standard_normal((5, 6), dtype=np.float32)
    producer = DLPackProducer(polyc.to_device(A, emulate=True))
    Y = emu(RELU)(producer)
    np.testing.assert_array_equal(Y.numpy(), np.maximum(A, 0))
    assert producer.deleted == 1  # the consumer released the tensor once it was done
    strided = DLPackProducer(producer.owner, strides=(1, 5))
    with pytest.raises(polyc.CallError, match="C-contiguous"):
        emu(RELU)(strided)
    assert strided.deleted == 1


def test_dlpack_host_tensors_are_host_arrays(rng):
    """numpy's own ``__dlpack_device__`` says CPU: such inputs take the host path."""
    A = rng.standard_normal((3, 3), dtype=np.float32)
    out = emu(RELU)(A)
    assert isinstance(out, np.ndarray)
    np.testing.assert_array_equal(out, np.maximum(A, 0))


@pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc is not installed")
def test_without_a_gpu_device_memory_says_so():
    """nvcc-built device memory on a machine without a usable GPU: a clear error, no
    fallback (with a GPU, the copy round-trips)."""
    x = np.arange(4, dtype=np.float32)
    try:
        d = polyc.to_device(x)
    except polyc.CallError as e:
        assert "no usable CUDA device" in str(e)
        return
    np.testing.assert_array_equal(d.numpy(), x)
