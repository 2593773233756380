"""Reductions into float16 and bfloat16 arrays accumulate in float32.

A float16 array is stored as such and computed in float32 (:mod:`polyc.dtypes`). A sum
that adds into its float16 element at every step would round at every step, and lose
about ``log2(n)`` bits over ``n`` terms: numpy, onnxruntime and cuBLAS accumulate such
sums in float32 and round once. This pass makes polyc do the same:

* a temporary that a reduction writes becomes a float32 temporary; the statements that
  read it read its value rounded to float16, as they did;
* an output or input a reduction writes gets a float32 copy that the reduction and its
  initialisation accumulate into (:func:`polyc.rewrite.cache_write`), and one rounding
  copy into the array after it.

A reduction whose first read of its element is not its own initialisation (``+=``
onto an input's values) keeps its float16 element: nothing else would be exact.
"""
from __future__ import annotations

from dataclasses import replace

from . import dtypes as D
from . import expr as E
from .errors import ScheduleError
from .ir import Kernel
from .rewrite import cache_write


def widen_accumulators(kernel: Kernel) -> Kernel:
    """``kernel`` with its float16/bfloat16 reductions accumulating in float32."""
    done: set[str] = set()
    while True:
        target = next((s for s in kernel.statements if s.is_reduction and s.name not in done
                       and D.get(kernel.array(s.write.array).dtype).storage_only), None)
        if target is None:
            return kernel
        done.add(target.name)
        arr = kernel.array(target.write.array)
        wide = D.get(arr.dtype).compute
        if arr.role == "temp":
            kernel = _retyped(kernel, arr.name, wide, rounded=arr.dtype)
            continue
        try:
            kernel, _, local = cache_write(kernel, target.name)
        except ScheduleError:
            continue
        kernel = _retyped(kernel, local, wide)


def _retyped(kernel: Kernel, array: str, dtype: str, rounded: str | None = None) -> Kernel:
    """``array`` of ``dtype``; with ``rounded``, the statements that do not write it read
    its values rounded to that dtype (what they read when it was stored as such)."""
    arrays = tuple(replace(a, dtype=dtype) if a.name == array else a for a in kernel.arrays)
    stmts = kernel.statements
    if rounded is not None:
        def cast(x: E.Expr) -> E.Expr | None:
            return E.Cast(rounded, x) if isinstance(x, E.Read) and x.array == array else None
        stmts = tuple(s if s.write.array == array else replace(s, value=E.map_expr(s.value, cast))
                      for s in stmts)
    return replace(kernel, arrays=arrays, statements=stmts)
