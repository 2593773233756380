"""The Python side of a model library: write its files, load it, call it.

:func:`write_model_files` builds the shared library (through the toolchain cache) and
writes the header, the C source and the weights file; :class:`ModelLibrary` loads the
library with ctypes, calls ``<m>_init(weights)`` once, ``<m>_run`` per call (ctypes
releases the GIL, so runs from several Python threads proceed in parallel) and
``<m>_free`` at :meth:`ModelLibrary.close` or garbage collection.
"""
from __future__ import annotations

import ctypes
import os
import shutil
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from polyc.errors import CallError, InternalError, PolycError, RunError
from polyc.host import write_atomically
from polyc.options import Options

from .model import ModelSource, Tensor
from .runtime import NUMPY_DTYPES, load_library
from .toolchain import build_model_library
from .weights import WeightsError, check_weights_file, digest




@dataclass(frozen=True)
class ModelFiles:
    library: str
    header: str
    source: str
    weights: str


def write_model_files(source: ModelSource, weights_blob: bytes, options: Options,
                      output_dir: str | None = None) -> tuple[ModelFiles, str]:
    """Build and write everything; returns the files (in ``output_dir`` when given,
    else in the cache) and the content-addressed cached library to load."""
    cached = build_model_library(source.text, source.name, options, units=source.units)
    base = cached[:-len(".so")]
    _write_if_changed(base + ".h", source.header.encode())
    weights = os.path.join(options.cache_dir, f"{source.name}-{digest(weights_blob)}.weights")
    if not os.path.exists(weights):
        write_atomically(weights, weights_blob)
    files = ModelFiles(cached, base + ".h", base + ".c", weights)
    if output_dir is not None:
        os.makedirs(output_dir, exist_ok=True)
        out = os.path.join(output_dir, source.name)
        files = ModelFiles(out + ".so", out + ".h", out + ".c", out + ".weights")
        shutil.copyfile(cached, files.library)
        _write_if_changed(files.header, source.header.encode())
        _write_if_changed(files.source, source.text.encode())
        write_atomically(files.weights, weights_blob)
    return files, cached


def _write_if_changed(path: str, data: bytes) -> None:
    try:
        with open(path, "rb") as f:
            if f.read() == data:
                return
    except OSError:
        pass
    write_atomically(path, data)  # atomic write of any bytes


class ModelLibrary:
    """One loaded model: ``run(arrays) -> list of arrays`` (inputs already checked)."""

    def __init__(self, library_path: str, source: ModelSource, weights_path: str) -> None:
        self.source, self.path = source, library_path
        lib = load_library(library_path)
        m = source.name
        self._init = getattr(lib, f"{m}_init")
        self._init.restype, self._init.argtypes = ctypes.c_void_p, [ctypes.c_char_p]
        self._free = getattr(lib, f"{m}_free")
        self._free.restype, self._free.argtypes = None, [ctypes.c_void_p]
        self._run = getattr(lib, f"{m}_run")
        self._run.restype = ctypes.c_int
        self._run.argtypes = [ctypes.c_void_p] * (1 + len(source.inputs) + len(source.outputs))
        self._last_error = getattr(lib, f"{m}_last_error", None)
        if self._last_error is not None:
            self._last_error.restype, self._last_error.argtypes = ctypes.c_char_p, []
        self._handle: int | None = None
        if getattr(lib, f"{m}_num_inputs")() != len(source.inputs):
            raise InternalError(f"{library_path} does not match the generated source")
        check_weights_file(weights_path, source.weights)
        handle = self._init(os.fsencode(weights_path))
        if not handle:
            raise WeightsError(f"{m}_init refused the weights file {weights_path!r} "
                               "(corrupt: a checksum differs, or out of memory)")
        self._handle = handle
        # Precomputed for the per-call fast path (a run of a small model is a few
        # microseconds of C; the Python around it must not dominate): per input its
        # name, exact numpy dtype and shape; per output its shape and dtype.
        self._inputs = tuple(source.inputs)
        self._input_specs = tuple((t.name, NUMPY_DTYPES[t.dtype], tuple(t.shape))
                                  for t in source.inputs)
        self._input_names = frozenset(t.name for t in source.inputs)
        self._output_specs = tuple((tuple(t.shape), NUMPY_DTYPES[t.dtype])
                                   for t in source.outputs)
        # (ml_dtypes' types have no buffer-protocol format: those take numpy's path)
        self._outputs_nonempty = all(np.prod(shape, dtype=np.int64) > 0 and _buffered(dtype)
                                     for shape, dtype in self._output_specs)

    def run(self, arrays: Sequence[np.ndarray]) -> list[np.ndarray]:
        """Run on ``arrays`` (checked: exact dtype and shape, C-contiguous, aligned);
        the outputs are fresh arrays, so concurrent runs from several threads share
        nothing but the read-only weights."""
        handle = self._handle
        if handle is None:
            raise CallError(f"model {self.source.name} was closed")
        outs = [np.empty(shape, dtype) for shape, dtype in self._output_specs]
        if self._outputs_nonempty:  # fresh, writable, C-contiguous: no fallback needed
            status = self._run(handle, *map(_address, arrays),
                               *[_addressof(_from_buffer(o)) for o in outs])
        else:
            status = self._run(handle, *map(_address, arrays), *map(_address, outs))
        if status:
            self._failed(status)
        return outs

    def run_feed(self, feed: Mapping[str, Any]) -> list[np.ndarray]:
        """Run on a feed (input name -> array); the checks of :func:`check_feed`, with a
        fast path for a dict holding exactly the inputs as C-contiguous aligned arrays of
        the exact dtype and shape (no copy, no per-call list of names)."""
        if type(feed) is dict and len(feed) == len(self._input_specs):
            arrays = []
            for name, dtype, shape in self._input_specs:
                x = feed.get(name)
                if type(x) is not np.ndarray or x.dtype is not dtype or x.shape != shape:
                    break
                flags = x.flags
                if not (flags.c_contiguous and flags.aligned):
                    break
                arrays.append(x)
            else:
                return self.run(arrays)
        return self.run(check_feed(self._inputs, feed))

    def _failed(self, status: int) -> None:
        # the message is per thread, and ctypes calls from this thread: it is this run's
        message = self._last_error().decode("utf-8", "replace") if self._last_error else ""
        if status == 4:
            raise RunError(message or f"{self.source.name}_run: an input value is out of "
                                      f"range (status 4)", status)
        if status == 2:
            raise MemoryError(message or f"{self.source.name}_run: out of memory "
                              f"(workspace {self.source.plan.arena_bytes} bytes)")
        raise PolycError(f"{self.source.name}_run failed with status {status}"
                         + (f": {message}" if message else ""))

    def close(self) -> None:
        handle, self._handle = getattr(self, "_handle", None), None
        if handle:
            self._free(handle)

    def __del__(self) -> None:
        self.close()


_from_buffer = ctypes.c_char.from_buffer
_addressof = ctypes.addressof


def _buffered(dtype: np.dtype) -> bool:
    try:
        memoryview(np.empty(1, dtype))
    except (TypeError, ValueError, BufferError):
        return False
    return True


def _address(a: np.ndarray) -> int:
    """The data address of a C-contiguous array: through the buffer protocol (about
    4x cheaper than ``a.ctypes.data``), else (read-only or empty) through numpy."""
    try:
        return _addressof(_from_buffer(a))
    except (TypeError, ValueError, BufferError):
        return a.ctypes.data


def check_feed(inputs: Sequence[Tensor], feed: Mapping[str, Any]) -> list[np.ndarray]:
    """The arrays of ``feed`` (input name -> array) in input order, checked: every input
    given, no unknown name, exact dtype and shape; made C-contiguous and aligned."""
    if not isinstance(feed, Mapping):
        raise CallError(f"inputs must be a dict of input name -> array, got "
                        f"{type(feed).__name__}")
    names = [t.name for t in inputs]
    unknown = [k for k in feed if k not in names]
    if unknown:
        raise CallError(f"unknown input(s) {unknown}; the model's inputs are {names}")
    missing = [n for n in names if n not in feed]
    if missing:
        raise CallError(f"missing input(s) {missing}; the model's inputs are {names}")
    return [check_array(t, feed[t.name], f"input {t.name!r}") for t in inputs]


def check_array(t: Tensor, x: Any, where: str) -> np.ndarray:
    want = NUMPY_DTYPES[t.dtype]
    if isinstance(x, (bool, int, float, np.generic)) and not t.shape:
        x = np.asarray(x)
        if x.dtype != want and np.can_cast(x.dtype, want, "same_kind"):
            x = x.astype(want)
    if not isinstance(x, np.ndarray):
        raise CallError(f"{where}: expected a numpy array of {t.dtype}{list(t.shape)}, got "
                        f"{type(x).__name__}")
    if x.dtype != want:
        raise CallError(f"{where}: expected dtype {t.dtype}, got {x.dtype} "
                        f"(convert it with .astype(np.{t.dtype}))")
    if tuple(x.shape) != t.shape:
        raise CallError(f"{where}: expected shape {list(t.shape)}, got {list(x.shape)}")
    return np.require(x, requirements=("C_CONTIGUOUS", "ALIGNED"))
