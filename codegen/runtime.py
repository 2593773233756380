"""Call compiled kernels with numpy arrays.

:class:`CompiledFunction` loads the shared library (once per path, through ctypes) and
checks every argument before a pointer reaches C: the number of inputs, each input's
dtype (never silently cast) and rank, the sizes its shape implies, and that every extent
is at least 1. Inputs are made C-contiguous and aligned (a copy only when needed);
outputs are allocated with ``np.zeros``, so a ``+=`` statement with no initialisation
accumulates into zeros.
"""
from __future__ import annotations

import ctypes
import os
import threading
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from polyc import dtypes as D
from polyc import expr as E
from polyc import limits
from polyc.errors import CallError
from polyc.ir import Array, Kernel

from .c_family import CSource
from .device_array import DeviceView, device_view, is_device_array
from .initial_values import reads_initial_values

#: numpy dtype of each polyc dtype (numpy's bool is one byte holding 0 or 1, like C's bool)
NUMPY_DTYPES = {name: D.numpy_dtype(name) for name in D.ORDER}

_LIBRARIES: dict[str, ctypes.CDLL] = {}
_LOCK = threading.Lock()


def _bind_threads() -> None:
    """Bind OpenMP threads to cores unless the user chose otherwise.

    Unbound two-thread runs on a shared machine swing by several times; libgomp reads
    ``OMP_PROC_BIND`` once, when it is loaded, so this must run before the first polyc
    library (which pulls libgomp in) is loaded. It has no effect if libgomp is already
    in the process, and none on a user who set ``OMP_PROC_BIND`` themselves.
    """
    if "OMP_PROC_BIND" not in os.environ and "OMP_PLACES" not in os.environ:
        os.environ["OMP_PROC_BIND"] = "close"


def load_library(path: str) -> ctypes.CDLL:
    """The loaded shared library at ``path`` (loaded once per process)."""
    with _LOCK:
        if path not in _LIBRARIES:
            if not _LIBRARIES:
                _bind_threads()
            _LIBRARIES[path] = ctypes.CDLL(path)
        return _LIBRARIES[path]


def check_inputs(kernel: Kernel, inputs: Sequence[Any], device: bool = False) -> list[Any]:
    """The inputs as numpy arrays after checking their count, dtype and rank.

    A rank-0 input may be a Python scalar; it is converted to the declared dtype when
    that loses nothing (an ``int`` for a float array, never a ``float`` for an int array).
    With ``device`` (the CUDA target), an input in device memory becomes a
    :class:`.device_array.DeviceView` instead (checked the same way).
    """
    if isinstance(inputs, np.ndarray) or not isinstance(inputs, Sequence):
        raise CallError(f"{kernel.name}: inputs must be a sequence of arrays, got "
                        f"{type(inputs).__name__}")
    if len(inputs) != len(kernel.inputs):
        raise CallError(f"{kernel.name} takes {len(kernel.inputs)} inputs "
                        f"({', '.join(kernel.inputs)}), got {len(inputs)}")
    return [_check_input(kernel.array(name), i, x, device)
            for i, (name, x) in enumerate(zip(kernel.inputs, inputs))]


def _check_input(arr: Array, position: int, x: Any, device: bool = False) -> Any:
    where = f"input {arr.name!r} (argument {position})"
    want = NUMPY_DTYPES[arr.dtype]
    if device and (isinstance(x, DeviceView) or is_device_array(x)):
        view = x if isinstance(x, DeviceView) else device_view(x, where)
        if view.dtype != want or view.ndim != arr.rank:
            if view.release:
                view.release()
            raise CallError(f"{where}: expected a device array of {arr.dtype} with rank "
                            f"{arr.rank}, got {view.dtype}{list(view.shape)}")
        return view
    if arr.rank == 0 and isinstance(x, (bool, int, float)) and _scalar_fits(x, arr.dtype):
        return np.asarray(x, dtype=want)
    if isinstance(x, np.generic):
        x = np.asarray(x)
    if not isinstance(x, np.ndarray):
        raise CallError(f"{where}: expected a numpy array of {arr.dtype}, "
                        f"got {type(x).__name__}")
    if x.dtype != want:
        raise CallError(f"{where}: expected dtype {arr.dtype}, got {x.dtype} "
                        f"(convert it with .astype(np.{arr.dtype}))")
    if x.ndim != arr.rank:
        raise CallError(f"{where}: expected rank {arr.rank}, got shape {x.shape}")
    return x


def _scalar_fits(x: bool | float, dtype: str) -> bool:
    if isinstance(x, bool):
        return dtype == "bool"
    if isinstance(x, int):
        if dtype in D.INTS:
            lo, hi = D.get(dtype).limits
            return lo <= x <= hi
        return dtype != "bool"
    return dtype in E.FLOAT_DTYPES


def bind_sizes(kernel: Kernel, inputs: Sequence[Any],
               sizes: Mapping[str, int] | None = None) -> dict[str, int]:
    """The value of every size, from the input shapes (plus ``sizes`` given explicitly).

    An input dimension whose extent is a plain size binds it; every other extent (a
    constant, ``H - KH + 1``) is checked once all sizes are known.
    """
    bound: dict[str, int] = {}
    origin: dict[str, str] = {}
    for name, x in zip(kernel.inputs, inputs):
        arr, shape = kernel.array(name), np.shape(x)
        if len(shape) != arr.rank:
            raise CallError(f"input {name!r}: expected rank {arr.rank}, got shape {shape}")
        for d, (extent, n) in enumerate(zip(arr.shape, shape)):
            if isinstance(extent, E.Size):
                _bind(bound, origin, extent.name, int(n), f"dimension {d} of {name!r}")
    for s, v in (sizes or {}).items():
        if s not in kernel.sizes:
            raise CallError(f"{kernel.name} has no size {s!r} (sizes: {', '.join(kernel.sizes)})")
        _bind(bound, origin, s, int(v), "the sizes argument")
    missing = [s for s in kernel.sizes if s not in bound]
    if missing:
        raise CallError(f"{kernel.name}: cannot infer size(s) {', '.join(missing)} from the "
                        "input shapes (no input dimension has exactly that extent); pass "
                        f"them as sizes={{{', '.join(repr(s) + ': ...' for s in missing)}}}")
    for name, x in zip(kernel.inputs, inputs):
        for d, (extent, n) in enumerate(zip(kernel.array(name).shape, np.shape(x))):
            if not isinstance(extent, E.Size) and E.evaluate(extent, bound) != n:
                raise CallError(f"input {name!r}: dimension {d} must be {E.show(extent)} = "
                                f"{E.evaluate(extent, bound)} with {_show(bound)}, got {n}")
    return {s: bound[s] for s in kernel.sizes}


def _bind(bound: dict[str, int], origin: dict[str, str], size: str, value: int,
          where: str) -> None:
    if size in bound and bound[size] != value:
        raise CallError(f"size {size} is {bound[size]} from {origin[size]} but {value} "
                        f"from {where}")
    bound.setdefault(size, value)
    origin.setdefault(size, where)


def _show(sizes: Mapping[str, int]) -> str:
    return ", ".join(f"{k}={v}" for k, v in sizes.items())


def output_shapes(kernel: Kernel, sizes: Mapping[str, int]) -> list[tuple[int, ...]]:
    """The shape of each output for the given sizes."""
    env = dict(sizes)
    return [tuple(E.evaluate(d, env) for d in kernel.array(name).shape)
            for name in kernel.outputs]


def check_extents(kernel: Kernel, sizes: Mapping[str, int]) -> None:
    """Fixed sizes have their value; every input extent is at least 1 and no extent is
    negative (an output or temporary is empty when an index range is)."""
    fixed = dict(kernel.fixed_sizes)
    wrong = {s: v for s, v in sizes.items() if s in fixed and fixed[s] != v}
    if wrong:
        raise CallError(f"{kernel.name} was compiled for {_show(fixed)}, called with "
                        f"{_show(sizes)}")
    for arr in kernel.arrays:
        least = 1 if arr.role == "input" else 0
        for d, extent in enumerate(arr.shape):
            value = E.evaluate(extent, dict(sizes))
            if value < least:
                raise CallError(f"array {arr.name!r}: dimension {d} ({E.show(extent)}) is "
                                f"{value} with {_show(sizes)}; "
                                f"it must be at least {least}")


def check_array_sizes(kernel: Kernel, sizes: Mapping[str, int],
                      allocated: Sequence[str] | None = None) -> None:
    """Every array of ``kernel`` within :data:`polyc.limits.MAX_ARRAY_ELEMENTS`, and the
    arrays the call allocates (``allocated``; default: the outputs and temporaries) each
    and together within :func:`polyc.limits.max_array_bytes`; checked before any
    allocation, so an array too big for the machine is a :class:`CallError` naming it
    rather than numpy's ``MemoryError`` (or an overcommitted allocation killed later)."""
    env = dict(sizes)
    if allocated is None:
        allocated = [a.name for a in kernel.arrays if a.role != "input"]
    limit_bytes = limits.max_array_bytes()
    total, parts = 0, []
    for arr in kernel.arrays:
        shape = tuple(E.evaluate(d, env) for d in arr.shape)
        elements = 1
        for n in shape:
            elements *= n
        if elements > limits.MAX_ARRAY_ELEMENTS:
            raise CallError(f"{kernel.name}: array {arr.name!r} of shape {shape} has "
                            f"{elements} elements; the limit is {limits.MAX_ARRAY_ELEMENTS} "
                            f"= 2**48 (polyc.limits.MAX_ARRAY_ELEMENTS) with {_show(sizes)}")
        if arr.name not in allocated:
            continue
        nbytes = elements * NUMPY_DTYPES[arr.dtype].itemsize
        if nbytes > limit_bytes:
            raise CallError(f"{kernel.name}: array {arr.name!r} of shape {shape} needs "
                            f"{_bytes(nbytes)} ({elements} elements of {arr.dtype}), more "
                            f"than the limit of {_bytes(limit_bytes)} (polyc.limits."
                            f"max_array_bytes(): {limits.max_array_bytes_origin()}) with "
                            f"{_show(sizes)}")
        total += nbytes
        parts.append((arr.name, nbytes))
    if total > limit_bytes:
        listed = ", ".join(f"{name} {_bytes(n)}" for name, n in parts)
        raise CallError(f"{kernel.name}: the arrays a call allocates need {_bytes(total)} "
                        f"together ({listed}), more than the limit of "
                        f"{_bytes(limit_bytes)} (polyc.limits.max_array_bytes(): "
                        f"{limits.max_array_bytes_origin()}) with {_show(sizes)}")


def _bytes(n: int) -> str:
    if n < 2 ** 20:
        return f"{n} bytes"
    for unit, scale in (("TiB", 2 ** 40), ("GiB", 2 ** 30), ("MiB", 2 ** 20), ("KiB", 2 ** 10)):
        if n >= scale:
            return f"{n / scale:.1f} {unit}"
    return f"{n} bytes"


#: call signatures whose checks a compiled function remembers (then it forgets them all)
MAX_CALL_PLANS = 64


def call_signature(inputs: Any, sizes: Mapping[str, int] | None = None) -> tuple | None:
    """What a call's checks depend on: each input's shape and dtype, and the sizes given;
    None unless every input is a numpy array (scalars, device arrays: checked each time)."""
    if not isinstance(inputs, (list, tuple)):
        return None
    key = []
    for x in inputs:
        if type(x) is not np.ndarray:
            return None
        key.append((x.shape, x.dtype))
    return tuple(key), None if sizes is None else tuple(sorted(sizes.items()))


class CompiledFunction:
    """A compiled kernel: ``f(inputs, sizes=None, outputs=None) -> tuple of outputs``."""

    def __init__(self, kernel: Kernel, path: str, function_name: str,
                 source: CSource | None = None) -> None:
        self.kernel, self.path, self.source = kernel, path, source
        self.function_name = function_name
        fn = getattr(load_library(path), function_name)
        fn.restype = ctypes.c_int
        #: sizes as int64, then every input and output as a pointer
        self._fn_argtypes = ([ctypes.c_int64] * len(kernel.sizes)
                             + [ctypes.c_void_p] * (len(kernel.inputs) + len(kernel.outputs)))
        fn.argtypes = self._fn_argtypes
        self._fn = fn
        #: call signature -> (sizes, their values in order, output shapes and dtypes)
        self._plans: dict[tuple, tuple] = {}
        #: per output, how a call allocates it: zeroed where the kernel may read an
        #: element before writing it or leave one unwritten (outputs start at zero),
        #: else uninitialised (the kernel writes every element first: a 256-square
        #: matmul no longer pays a memset of its output at each call)
        self._fresh = [np.zeros if reads_initial_values(kernel, o) else np.empty
                       for o in kernel.outputs]

    def __call__(self, inputs: Sequence[Any], sizes: Mapping[str, int] | None = None,
                 outputs: Sequence[np.ndarray] | None = None,
                 signature: tuple | None = None) -> tuple[np.ndarray, ...]:
        """Run the kernel. ``outputs``, when given, are updated in place (not zeroed).
        ``signature``: the caller's :func:`call_signature` of these inputs, when it took
        one (a key that fixes ``sizes`` as well as this call's own would).

        The checks of a call depend on its inputs' shapes and dtypes (and ``sizes``)
        alone: a call like one that passed them before (:func:`call_signature`) skips
        them and takes the sizes and output shapes found then (a 8x8 matmul: 34 -> 9 us
        a call)."""
        kernel = self.kernel
        key = None if outputs is not None else \
            signature if signature is not None else call_signature(inputs, sizes)
        plan = self._plans.get(key) if key is not None else None
        if plan is None:
            arrays = check_inputs(kernel, inputs)
            values = bind_sizes(kernel, arrays, sizes)
            check_extents(kernel, values)
            check_array_sizes(kernel, values, None if outputs is None else [
                a.name for a in kernel.arrays if a.role == "temp"])
            arrays = [np.require(x, requirements=("C_CONTIGUOUS", "ALIGNED")) for x in arrays]
            outs = self._outputs(values, outputs, arrays)
            if key is not None:
                if len(self._plans) >= MAX_CALL_PLANS:
                    self._plans.clear()
                self._plans[key] = (values, [values[s] for s in kernel.sizes],
                                    [(o.shape, o.dtype) for o in outs])
        else:
            values, _, shapes = plan
            arrays = [x if x.flags.c_contiguous and x.flags.aligned
                      else np.require(x, requirements=("C_CONTIGUOUS", "ALIGNED"))
                      for x in inputs]
            outs = [fresh(shape, dtype=dtype)
                    for fresh, (shape, dtype) in zip(self._fresh, shapes)]
        args = [values[s] for s in kernel.sizes] + [a.ctypes.data for a in arrays + outs]
        status = self._fn(*args)
        if status == 1:
            raise CallError(f"{kernel.name}: sizes {_show(values)} do not satisfy the "
                            f"kernel's constraints {kernel.context}")
        if status == 2:
            raise MemoryError(f"{kernel.name}: cannot allocate its temporary arrays")
        if status != 0:
            raise CallError(f"{kernel.name} returned the unknown status {status}")
        return tuple(outs)

    def _outputs(self, sizes: Mapping[str, int], given: Sequence[np.ndarray] | None,
                 inputs: list[np.ndarray]) -> list[np.ndarray]:
        kernel = self.kernel
        shapes = output_shapes(kernel, sizes)
        dtypes = [NUMPY_DTYPES[kernel.array(o).dtype] for o in kernel.outputs]
        if given is None:
            return [fresh(s, dtype=t) for fresh, s, t in zip(self._fresh, shapes, dtypes)]
        if len(given) != len(kernel.outputs):
            raise CallError(f"{kernel.name} has {len(kernel.outputs)} outputs, got {len(given)}")
        for i, (name, y, shape, dtype) in enumerate(zip(kernel.outputs, given, shapes, dtypes)):
            where = f"output {name!r}"
            if not isinstance(y, np.ndarray) or y.dtype != dtype or y.shape != shape:
                got = f"{y.dtype}{list(y.shape)}" if isinstance(y, np.ndarray) else type(y).__name__
                raise CallError(f"{where}: expected a {dtype}{list(shape)} array, got {got}")
            if not (y.flags.c_contiguous and y.flags.aligned and y.flags.writeable):
                raise CallError(f"{where}: must be C-contiguous, aligned and writeable")
            others = inputs + [g for j, g in enumerate(given) if j != i]
            if any(np.may_share_memory(y, x) for x in others):
                raise CallError(f"{where} may overlap another argument; outputs must not alias")
        return list(given)
