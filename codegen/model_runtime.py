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

from polyc.errors import CallError, InternalError, PolycError
from polyc.options import Options

from .model import ModelSource, Tensor
from .runtime import NUMPY_DTYPES, load_library
from .toolchain import build_model_library
from .weights import WeightsError, check_weights_file, digest, write_atomically


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
        self._handle: int | None = None
        if getattr(lib, f"{m}_num_inputs")() != len(source.inputs):
            raise InternalError(f"{library_path} does not match the generated source")
        check_weights_file(weights_path, source.weights)
        handle = self._init(os.fsencode(weights_path))
        if not handle:
            raise WeightsError(f"{m}_init refused the weights file {weights_path!r} "
                               "(corrupt: a checksum differs, or out of memory)")
        self._handle = handle

    def run(self, arrays: Sequence[np.ndarray]) -> list[np.ndarray]:
        if self._handle is None:
            raise CallError(f"model {self.source.name} was closed")
        outs = [np.empty(t.shape, NUMPY_DTYPES[t.dtype]) for t in self.source.outputs]
        status = self._run(self._handle, *[a.ctypes.data for a in list(arrays) + outs])
        if status == 2:
            raise MemoryError(f"{self.source.name}_run: out of memory "
                              f"(workspace {self.source.plan.arena_bytes} bytes)")
        if status != 0:
            raise PolycError(f"{self.source.name}_run failed with status {status}")
        return outs

    def close(self) -> None:
        handle, self._handle = getattr(self, "_handle", None), None
        if handle:
            self._free(handle)

    def __del__(self) -> None:
        self.close()


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
