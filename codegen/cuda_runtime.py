"""Call a CUDA operator's host wrapper (nvcc-built or emulated) with numpy arrays.

The wrapper has the C target's signature (sizes, inputs, outputs: host pointers), so
:class:`CudaFunction` is a :class:`CompiledFunction` whose status check also knows the
CUDA codes: 3 (a CUDA call failed) and 4 (no usable device) raise
:class:`polyc.errors.CallError` with the wrapper's message (``<name>_last_error()``).
There is never a fallback to the CPU: without a device, a non-emulated operator fails.
"""
from __future__ import annotations

import ctypes
from typing import Any

from polyc.errors import CallError
from polyc.ir import Kernel

from .c_family import CSource
from .model_runtime import ModelLibrary
from .runtime import CompiledFunction, load_library
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
        raw = self._fn

        def checked(*args: Any) -> int:
            status = raw(*args)
            if status >= 3:
                message = (last_error() or b"").decode(errors="replace")
                raise CallError(f"{kernel.name}: {message}")
            return int(status)

        self._fn = checked

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
