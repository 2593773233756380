"""Coalescing: the trailing dimensions of an elementwise kernel merged into one loop.

An elementwise pass over an NCHW feature map (a residual sum, a requantization, a
float16 rounding) is a nest ``n, c, h, w`` whose innermost loop is the map's width: 56,
28, 14 or 7 elements on ResNet's maps. A vector loop that short spends a large share of
its time in its remainder (gcc runs it one element at a time) and in the loop overhead
around it, and with mixed element types (uint8 in, float32 in, uint8 out) gcc's vectors
do not even fill once. The arrays are dense and row-major, so the same elements are one
run of ``C*H*W``: this pass merges the last two loops (and the last two dimensions of
every array they walk) into one, as long as it may, so the pass is one long loop.

Two trailing iterators ``a, b`` (extents ``A, B``) of every statement merge into one
``p = a * B + b`` when:

* every statement is a plain assignment (no reduction) over the same box of iterators
  (each from 0 to its extent), writing an array at its iterators (or at 0 along an
  extent-1 dimension) -- an elementwise kernel;
* every access that uses ``a`` or ``b`` indexes the last two dimensions of its array
  with exactly ``a, b``, over extents ``A, B``; every other access of such an array does
  too (its layout changes for all of them); the other accesses (a per-channel scale, a
  scalar) use neither;
* neither iterator appears in a value outside an index (a guard such as ``w < 3``).

The kernel's meaning is unchanged: each merged array holds the same elements at the same
offsets (row-major), and each statement runs over the same elements in the same order.
The arrays are declared with merged shapes, so the pass is for kernels whose arrays are
not seen by a caller with their own shapes: the steps of a compiled ONNX model (whose
buffers are passed as pointers), applied by the ONNX lowering.
"""
from __future__ import annotations

from dataclasses import replace

import islpy as isl

from . import expr as E
from .ir import Access, Kernel, Statement, params_prefix


def coalesce_elementwise(kernel: Kernel) -> Kernel:
    """``kernel`` with its trailing loops merged while the rules allow (module doc)."""
    if kernel.order or kernel.folds or kernel.sizes:
        return kernel
    while True:
        merged = _merged(kernel)
        if merged is None:
            return kernel
        kernel = merged


def _box(s: Statement) -> list[int] | None:
    """The extents of ``s``'s iterators when its domain is a box from 0."""
    d = s.domain
    if d.dim(isl.dim_type.param) or d.is_empty():
        return None
    out = []
    for i in range(d.dim(isl.dim_type.set)):
        lo, hi = d.dim_min_val(i), d.dim_max_val(i)
        if not (lo.is_int() and hi.is_int()) or lo.to_python() != 0:
            return None
        out.append(hi.to_python() + 1)
    box = isl.Set(f"{{ {s.name}[{', '.join(s.iterators)}] : " + " and ".join(
        f"0 <= {it} < {e}" for it, e in zip(s.iterators, out)) + " }")
    return out if box.is_equal(d) else None


def _uses(e: E.Expr, names: set[str]) -> bool:
    """Whether ``e`` mentions one of ``names`` outside the indices of its reads."""
    if isinstance(e, E.Index):
        return e.name in names
    if isinstance(e, E.Read):
        return False
    return any(_uses(c, names) for c in E.children(e))


def _shape(kernel: Kernel, array: str) -> list[int] | None:
    try:
        return [E.evaluate(x, {}) for x in kernel.array(array).shape]
    except (KeyError, ValueError):
        return None


def _merged(kernel: Kernel) -> Kernel | None:
    """The kernel with the last two iterators of every statement merged, or None."""
    boxes = []
    for s in kernel.statements:
        box = _box(s)
        if s.is_reduction or s.op != "=" or box is None or len(box) < 2:
            return None
        if boxes and box != boxes[0]:
            return None
        if len(s.write.indices) != len(box) or any(
                not (ix == E.Index(it) or (ix == E.Const(0) and e == 1))
                for ix, it, e in zip(s.write.indices, s.iterators, box)):
            return None
        boxes.append(box)
    if not boxes:
        return None
    extents = boxes[0]
    r = len(extents)
    wide: set[str] = set()    # arrays walked along their last two dimensions
    narrow: set[str] = set()  # arrays read without the two iterators
    for s in kernel.statements:
        a, b = s.iterators[r - 2], s.iterators[r - 1]
        if _uses(s.value, {a, b}):
            return None
        for acc in (s.write, *(Access(x.array, x.indices) for x in E.reads(s.value))):
            mentions = [bool(E.free_names(ix)[0] & {a, b}) for ix in acc.indices]
            if not any(mentions):
                narrow.add(acc.array)
                continue
            shape = _shape(kernel, acc.array)
            if shape is None or len(acc.indices) < 2 or any(mentions[:-2]) \
                    or tuple(acc.indices[-2:]) != (E.Index(a), E.Index(b)) \
                    or shape[-2:] != extents[-2:]:
                return None
            wide.add(acc.array)
    if wide & narrow:
        return None
    joined = extents[-2] * extents[-1]
    arrays = tuple(replace(x, shape=x.shape[:-2] + (E.Const(joined),)) if x.name in wide
                   else x for x in kernel.arrays)
    return replace(kernel, arrays=arrays,
                   statements=tuple(_merge(s, r, extents, wide) for s in kernel.statements))


def _merge(s: Statement, r: int, extents: list[int], wide: set[str]) -> Statement:
    a = s.iterators[r - 2]
    its = s.iterators[:r - 2] + (a,)  # ``a`` now runs over the merged extent

    def access(indices: tuple[E.Expr, ...], array: str) -> tuple[E.Expr, ...]:
        return indices[:-2] + (E.Index(a),) if array in wide else indices

    def read(x: E.Expr) -> E.Expr | None:
        return E.Read(x.array, access(x.indices, x.array)) if isinstance(x, E.Read) else None
    ext = extents[:r - 2] + [extents[-2] * extents[-1]]
    domain = isl.Set(f"{params_prefix(())}{{ {s.name}[{', '.join(its)}] : " + " and ".join(
        f"0 <= {it} < {e}" for it, e in zip(its, ext)) + " }")
    write = Access(s.write.array, access(s.write.indices, s.write.array))
    return replace(s, domain=domain, iterators=its, write=write,
                   value=E.map_expr(s.value, read))
