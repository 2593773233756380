"""Call a CUDA operator's host wrapper (nvcc-built or emulated) with numpy arrays.

The wrapper has the C target's signature (sizes, inputs, outputs: host pointers), so
:class:`CudaFunction` is a :class:`CompiledFunction` whose status check also knows the
CUDA codes: 3 (a CUDA call failed) and 4 (no usable device) raise
:class:`polyc.errors.CallError` with the wrapper's message (``<name>_last_error()``).
There is never a fallback to the CPU: without a device, a non-emulated operator fails.
"""
from __future__ import annotations

import ctypes
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from polyc.errors import CallError
from polyc.ir import Kernel
from polyc.options import Options

from .c_family import CSource
from .model_runtime import ModelLibrary
from .device_array import DeviceArray, DeviceMemory, DeviceView, device_view, is_device_array
from .runtime import (NUMPY_DTYPES, CompiledFunction, bind_sizes, check_array_sizes,
                      check_extents, check_inputs, load_library, output_shapes)
from .weights import WeightsError

ORDERS = {"forward": 0, "reverse": 1, "env": -1}


class CudaFunction(CompiledFunction):
    """A CUDA operator: ``f(inputs, sizes=None, outputs=None) -> outputs``."""

    def __init__(self, kernel: Kernel, path: str, function_name: str,
                 source: CSource | None = None, emulated: bool = False) -> None:
        super().__init__(kernel, path, function_name, source)
        self.emulated = emulated
        lib = load_library(path)
        last_error = getattr(lib, f"{function_name}_last_error")
        last_error.restype = ctypes.c_char_p
        last_error.argtypes = []

        def checked(fn: Any) -> Any:
            """``fn`` raising :class:`CallError` with the library's message on a CUDA
            status (3 or 4)."""
            def call(*args: Any) -> int:
                status = fn(*args)
                if status >= 3:
                    message = (last_error() or b"").decode(errors="replace")
                    raise CallError(f"{kernel.name}: {message}")
                return int(status)
            return call

        self._fn = checked(self._fn)
        device = getattr(lib, f"{function_name}_device")
        device.restype = ctypes.c_int
        device.argtypes = self._fn_argtypes
        self._device_fn = checked(device)
        self.memory = DeviceMemory(lib, function_name)

    def __call__(self, inputs: Sequence[Any], sizes: Mapping[str, int] | None = None,
                 outputs: Sequence[Any] | None = None,
                 signature: tuple | None = None) -> tuple[Any, ...]:
        """Host arrays: as the C target (copied to the device and back). When an input or
        a given output is a device array, the call runs on device memory with no copies
        (host inputs among them are uploaded) and returns :class:`DeviceArray` outputs
        (or the given ones, updated in place)."""
        given = list(outputs or [])
        if not any(isinstance(x, DeviceView) or is_device_array(x) for x in [*inputs, *given]):
            return super().__call__(inputs, sizes, outputs, signature)
        views: list[DeviceView] = []
        try:
            return self._on_device(inputs, sizes, outputs, views)
        finally:
            for v in views:
                if v.release:
                    v.release()

    def _on_device(self, inputs: Sequence[Any], sizes: Mapping[str, int] | None,
                   outputs: Sequence[Any] | None, views: list[DeviceView]) -> tuple[Any, ...]:
        kernel = self.kernel
        checked = check_inputs(kernel, inputs, device=True)
        views += [x for x in checked if isinstance(x, DeviceView) and x not in views]
        values = bind_sizes(kernel, checked, sizes)
        check_extents(kernel, values)
        check_array_sizes(kernel, values, [])  # element counts; device memory is the GPU's
        ins: list[DeviceView] = []
        for x in checked:
            if isinstance(x, DeviceView):
                ins.append(x)
            else:  # a host array among device arrays: uploaded for this call
                up = DeviceArray.from_host(np.ascontiguousarray(x), self.memory)
                ins.append(DeviceView(up.pointer, up.shape, up.dtype, keep=up))
        shapes = output_shapes(kernel, values)
        dtypes = [NUMPY_DTYPES[kernel.array(o).dtype] for o in kernel.outputs]
        if outputs is None:
            results: list[Any] = [DeviceArray(s, t, self.memory) for s, t in zip(shapes, dtypes)]
            outs = [DeviceView(r.pointer, r.shape, r.dtype, keep=r) for r in results]
        else:
            if len(outputs) != len(kernel.outputs):
                raise CallError(f"{kernel.name} has {len(kernel.outputs)} outputs, "
                                f"got {len(outputs)}")
            results, outs = list(outputs), []
            for name, y, shape, dtype in zip(kernel.outputs, outputs, shapes, dtypes):
                where = f"output {name!r}"
                if not (isinstance(y, DeviceView) or is_device_array(y)):
                    raise CallError(f"{where}: expected a device array (the call runs on "
                                    f"device memory), got {type(y).__name__}")
                v = y if isinstance(y, DeviceView) else device_view(y, where)
                views.append(v)
                if v.dtype != dtype or v.shape != shape:
                    raise CallError(f"{where}: expected a {dtype}{list(shape)} device array, "
                                    f"got {v.dtype}{list(v.shape)}")
                if v.readonly:
                    raise CallError(f"{where}: the device array is read-only")
                outs.append(v)
        for i, o in enumerate(outs):
            for other in ins + outs[:i]:
                if o.nbytes and other.nbytes and o.pointer < other.pointer + other.nbytes \
                        and other.pointer < o.pointer + o.nbytes:
                    raise CallError(f"output {kernel.outputs[i]!r} overlaps another argument; "
                                    "outputs must not alias")
        args = [values[s] for s in kernel.sizes] + [v.pointer for v in ins + outs]
        status = self._device_fn(*args)
        if status == 1:
            raise CallError(f"{kernel.name}: sizes {values} do not satisfy the kernel's "
                            f"constraints {kernel.context}")
        if status != 0:
            raise CallError(f"{kernel.name} returned the unknown status {status}")
        return tuple(results)

    def set_thread_order(self, order: str) -> None:
        """Emulation only: run the threads of each barrier interval ``"forward"`` or
        ``"reverse"`` (``"env"``: as ``POLYC_EMU_ORDER`` says)."""
        if not self.emulated:
            raise CallError("the thread order is a setting of the CPU emulation "
                            "(emulate=True)")
        fn = load_library(self.path).polyc_emu_set_order
        fn.argtypes = [ctypes.c_int]
        fn.restype = None
        fn(ORDERS[order])


_MEMORY: dict[tuple[Any, ...], DeviceMemory] = {}


def device_memory(options: Options) -> DeviceMemory:
    """The device-memory calls of a small library of their own (nvcc-built, or the CPU
    emulation's when ``options.emulate``), built once per toolchain."""
    key = (options.emulate, options.nvcc, options.gpu_arch, options.cc, options.sanitize,
           options.cache_dir)
    if key not in _MEMORY:
        from .cuda import memory_library_source
        from .nvcc import build_cuda
        path = build_cuda(memory_library_source(), "polyc_device_memory", options)
        _MEMORY[key] = DeviceMemory(load_library(path), "polyc")
    return _MEMORY[key]


def to_device(array: Any, emulate: bool = False, options: Options | None = None) -> DeviceArray:
    """A :class:`DeviceArray` copy of ``array`` (on the GPU; on the CPU emulation's device
    with ``emulate=True``)."""
    options = (options or Options(target="cuda")).replace(target="cuda", emulate=emulate)
    return DeviceArray.from_host(np.asarray(array), device_memory(options))


class CudaModelLibrary(ModelLibrary):
    """A CUDA model library (:mod:`.cuda_model`): the C target's calls, and its status
    codes: 3 (a CUDA call failed) and 5 (no usable device) raise :class:`CallError`."""

    def __init__(self, library_path: str, source: Any, weights_path: str) -> None:
        try:
            super().__init__(library_path, source, weights_path)
        except WeightsError:
            message = self._last_error().decode(errors="replace") if self._last_error else ""
            if message:  # init failed on the device, not on the weights file
                raise CallError(f"{source.name}_init: {message}") from None
            raise

    def _failed(self, status: int) -> None:
        if status in (3, 5):
            message = (self._last_error() or b"").decode(errors="replace")
            raise CallError(f"{self.source.name}_run: {message}")
        super()._failed(status)
