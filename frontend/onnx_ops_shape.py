"""Lowerings of ONNX shape and data-movement ops (see :mod:`.onnx_graph` for the contract).

Every statement ranges each of its indices explicitly (``where i0 in 0:7, ...``) over
the output's shape, as the graph's shape inference gives it, so that a lowering never
depends on TC range inference and a temporary output gets the right shape from its
first statement. Reads that may leave their tensor sit under a guard (``c ? X(...) :
v``) or use an index clamped into the tensor.

* views (no code): Reshape, Flatten, Squeeze, Unsqueeze, Identity, Dropout (inference;
  a used ``mask`` output or ``training_mode`` = true is unsupported);
* Transpose, Concat (guarded reads over the output range), Split, Slice (constant
  starts/ends/axes/steps, negative and clamped values, negative steps), Gather (see
  :func:`gather`: runtime indices wrap and are clamped into the tensor, and a check
  before the kernel fails the run on an index out of range), Pad (constant,
  reflect, edge, wrap), Resize / Upsample (nearest: every ``nearest_mode``; linear:
  n-linear over the resized axes; coordinate modes half_pixel, half_pixel_symmetric,
  pytorch_half_pixel, asymmetric, align_corners, tf_half_pixel_for_nn; constant scales
  or sizes), Expand, Tile, Shape, Size, ConstantOfShape, Constant (Cast is in
  :mod:`.onnx_ops_math`).

Non-affine indices (Gather with runtime indices, Pad reflect/edge, Resize) are
accepted by the TC frontend with ``from_tc(..., allow_indirect=True)``.
"""
from __future__ import annotations

import math
from collections.abc import Sequence
from fractions import Fraction

import numpy as np

from polyc import dtypes as D
from polyc.program import IndexCheck

from .onnx_graph import LowerContext, Lowered, Node, UnsupportedOpError, View, \
    literal, register
from .onnx_ops_math import str_attr

#: TC type name of each polyc dtype (casts and declarations)
TC_TYPE = {d.name: d.tc for d in D.BY_NAME.values()}


# -- helpers shared with onnx_ops_nn ------------------------------------------------------

def unsupported(node: Node, what: str) -> UnsupportedOpError:
    """An error naming the node, its op type and what is not supported."""
    return UnsupportedOpError(f"node {node.name!r} ({node.op_type}): {what}")


def check_dtype(node: Node, ctx: LowerContext, tensor: str,
                allowed: Sequence[str] = tuple(TC_TYPE)) -> str:
    dt = ctx.dtype(tensor)
    if dt not in allowed:
        raise unsupported(node, f"dtype {dt} of {tensor!r} is not supported "
                                f"(supported: {', '.join(allowed)})")
    return dt


def check_nonempty(node: Node, ctx: LowerContext, *tensors: str) -> None:
    for t in tensors:
        if t and any(d == 0 for d in ctx.shape(t)):
            raise unsupported(node, f"tensor {t!r} has an empty shape {ctx.shape(t)}; "
                                    f"polyc needs every extent >= 1")


def lhs(name: str, idx: Sequence[str]) -> str:
    """``Y(i0, i1)`` (``Y`` for a rank-0 tensor)."""
    return f"{name}({', '.join(idx)})" if idx else name


def read(name: str, idx: Sequence[str]) -> str:
    return lhs(name, idx)


def where(ranges: Sequence[tuple[str, int | str, int | str]]) -> str:
    """`` where i0 in 0:3, k in 0:5`` (empty for no ranges)."""
    if not ranges:
        return ""
    return " where " + ", ".join(f"{i} in {lo}:{hi}" for i, lo, hi in ranges)


def out_ranges(idx: Sequence[str], shape: Sequence[int]) -> list[tuple[str, int, int]]:
    return [(i, 0, d) for i, d in zip(idx, shape)]


def names(prefix: str, n: int) -> list[str]:
    return [f"{prefix}{d}" for d in range(n)]


def typed_literal(value: float | int | bool, dtype: str) -> str:
    """A literal of exactly ``dtype`` (TC's untyped literals are float32 or int32)."""
    text = literal(value, dtype)
    if dtype in ("float32", "int32"):
        return text if not text.startswith("-") else f"({text})"
    return f"{TC_TYPE[dtype]}({text})"


def signed_sum(terms, product=lambda c, v: f"{c}*{v}") -> str:
    """``2*h - kh`` from ``[(2, "h"), (-1, "kh")]``: zero terms dropped, a coefficient
    of +-1 written without a product, the others as ``product(|c|, term)``; "" for
    no term."""
    out = ""
    for c, v in terms:
        if c == 0:
            continue
        t = v if abs(c) == 1 else product(abs(c), v)
        if not out:
            out = t if c > 0 else f"-{t}"
        else:
            out += f" + {t}" if c > 0 else f" - {t}"
    return out


def affine(terms: Sequence[tuple[int, str]], const: int = 0) -> str:
    """``2*h + kh - 1`` from ``[(2, "h"), (1, "kh")]`` and ``-1`` (zero terms dropped)."""
    out = signed_sum(terms)
    if not out:
        return str(const)
    if const > 0:
        out += f" + {const}"
    elif const < 0:
        out += f" - {-const}"
    return out


def axis_attr(node: Node, rank: int, key: str = "axis", default: int = 0) -> int:
    a = int(node.attr(key, default))
    if not -rank <= a < max(rank, 1):
        raise unsupported(node, f"{key}={a} is out of range for rank {rank}")
    return a + rank if a < 0 else a


def const_input(node: Node, ctx: LowerContext, i: int, what: str) -> np.ndarray | None:
    """The constant value of optional input ``i`` (None if omitted); error if not constant."""
    if i >= len(node.inputs) or not node.inputs[i]:
        return None
    v = ctx.const(node.inputs[i])
    if v is None:
        raise unsupported(node, f"input {i} ({what}) must be a constant (an initializer or "
                                f"a folded value); polyc needs static shapes and parameters")
    return np.asarray(v)


def ints_param(node: Node, ctx: LowerContext, i: int, attr: str, what: str
               ) -> list[int] | None:
    """An int list given as input ``i`` (newer opsets) or as attribute ``attr`` (older)."""
    v = const_input(node, ctx, i, what)
    if v is not None:
        return [int(x) for x in v.reshape(-1)]
    a = node.attr(attr)
    return None if a is None else [int(x) for x in a]


def output_used(ctx: LowerContext, tensor: str) -> bool:
    if not tensor:
        return False
    if tensor in ctx.graph.outputs:
        return True
    return any(tensor in n.inputs for n in ctx.graph.nodes)


def const_table(index: str, values: Sequence[int | float | bool], dtype: str) -> str:
    """An expression of ``index`` worth ``values[index]`` (a chain of ``?:``)."""
    vals = list(values)
    if len(set(vals)) == 1:
        return typed_literal(vals[0], dtype)
    expr = typed_literal(vals[-1], dtype)
    for k in range(len(vals) - 2, -1, -1):
        expr = f"({index} == {k} ? {typed_literal(vals[k], dtype)} : {expr})"
    return expr


# -- views ------------------------------------------------------------------------------

@register("Reshape", "Flatten", "Squeeze", "Unsqueeze", "Identity")
def view(node: Node, ctx: LowerContext) -> View:
    """The output is the input, re-viewed (row-major): graph tensor names, no code."""
    if ctx.dtype(node.inputs[0]) != ctx.dtype(node.outputs[0]):
        raise unsupported(node, "input and output dtypes differ")
    return View(node.outputs[0], node.inputs[0])


@register("Dropout")
def dropout(node: Node, ctx: LowerContext) -> View:
    """Inference Dropout is the identity (its ``mask`` output, when used: all true).
    Training is unsupported."""
    mask = len(node.outputs) > 1 and output_used(ctx, node.outputs[1])
    if len(node.inputs) > 2 and node.inputs[2]:
        mode = ctx.const(node.inputs[2])
        if mode is None or bool(np.asarray(mode).reshape(-1)[0]):
            raise unsupported(node, "training_mode must be a constant false (inference only)")
    if node.attr("is_test", 1) == 0 and ctx.graph.opset < 7:
        raise unsupported(node, "is_test=0 (training) is not supported")
    if not mask:
        return View(node.outputs[0], node.inputs[0])
    # the mask of inference: every element kept
    x, y, m = node.inputs[0], node.outputs[0], node.outputs[1]
    check_nonempty(node, ctx, x)
    idx = names("i", ctx.rank(x))
    rng = where(out_ranges(idx, ctx.shape(x)))
    keep = literal(1, ctx.dtype(m))
    return Lowered([f"{lhs(ctx.name(y), idx)} = {read(ctx.name(x), idx)}{rng}",
                    f"{lhs(ctx.name(m), idx)} = {keep}{rng}"])


# -- data movement ----------------------------------------------------------------------

@register("Transpose")
def transpose(node: Node, ctx: LowerContext) -> Lowered:
    x, y = node.inputs[0], node.outputs[0]
    check_nonempty(node, ctx, x)
    r = ctx.rank(x)
    perm = [int(p) for p in node.attr("perm", list(range(r - 1, -1, -1)))]
    if sorted(p % r if r else p for p in perm) != list(range(r)):
        raise unsupported(node, f"perm={perm} is not a permutation of 0..{r - 1}")
    perm = [p % r for p in perm]
    idx = names("i", r)
    src = [""] * r
    for d, p in enumerate(perm):
        src[p] = idx[d]
    return Lowered([f"{lhs(ctx.name(y), idx)} = {read(ctx.name(x), src)}"
                    f"{where(out_ranges(idx, ctx.shape(y)))}"])


@register("Concat")
def concat(node: Node, ctx: LowerContext) -> Lowered:
    """One statement over the output; input k is read under ``i < offset(k+1)`` guards."""
    y = node.outputs[0]
    ins = [t for t in node.inputs if t and all(ctx.shape(t))]  # drop empty inputs
    if not ins:
        raise unsupported(node, "every input is empty")
    check_nonempty(node, ctx, y)
    r = ctx.rank(y)
    a = axis_attr(node, r)
    idx = names("i", r)
    offsets = [0]
    for t in ins:
        offsets.append(offsets[-1] + ctx.shape(t)[a])

    def part(k: int) -> str:
        src = list(idx)
        src[a] = affine([(1, idx[a])], -offsets[k])
        return read(ctx.name(ins[k]), src)

    expr = part(len(ins) - 1)
    for k in range(len(ins) - 2, -1, -1):
        expr = f"{idx[a]} < {offsets[k + 1]} ? {part(k)} : {expr}" if k == len(ins) - 2 \
            else f"{idx[a]} < {offsets[k + 1]} ? {part(k)} : ({expr})"
    return Lowered([f"{lhs(ctx.name(y), idx)} = {expr}{where(out_ranges(idx, ctx.shape(y)))}"])


@register("Split")
def split(node: Node, ctx: LowerContext) -> Lowered:
    """Output k reads its slab of the input; the sizes are the outputs' inferred shapes."""
    x = node.inputs[0]
    r = ctx.rank(x)
    a = axis_attr(node, r)
    sizes = [ctx.shape(o)[a] for o in node.outputs]
    given = ints_param(node, ctx, 1, "split", "split")
    if given is not None and given != sizes:
        raise unsupported(node, f"split sizes {given} disagree with the output shapes {sizes}")
    if sum(sizes) > ctx.shape(x)[a]:
        raise unsupported(node, f"split sizes {sizes} exceed the axis extent {ctx.shape(x)[a]}")
    idx = names("i", r)
    stmts, off = [], 0
    for o, n in zip(node.outputs, sizes):
        if o and n > 0:
            src = list(idx)
            src[a] = affine([(1, idx[a])], off)
            stmts.append(f"{lhs(ctx.name(o), idx)} = {read(ctx.name(x), src)}"
                         f"{where(out_ranges(idx, ctx.shape(o)))}")
        off += n
    return Lowered(stmts)


def slice_params(node: Node, ctx: LowerContext) -> list[tuple[int, int]]:
    """(start, step) of each input axis, after ONNX's normalisation and clamping."""
    x = node.inputs[0]
    shape = ctx.shape(x)
    r = len(shape)
    if ctx.graph.opset >= 10 or len(node.inputs) > 1:
        starts = ints_param(node, ctx, 1, "starts", "starts")
        ends = ints_param(node, ctx, 2, "ends", "ends")
        axes = ints_param(node, ctx, 3, "axes", "axes")
        steps = ints_param(node, ctx, 4, "steps", "steps")
    else:
        starts, ends, axes, steps = (node.attr(k) for k in ("starts", "ends", "axes", "steps"))
    if starts is None or ends is None:
        raise unsupported(node, "starts and ends are required")
    axes = list(range(len(starts))) if axes is None else [int(v) for v in axes]
    steps = [1] * len(starts) if steps is None else [int(v) for v in steps]
    params = [(0, 1)] * r
    for s, e, ax, st in zip(starts, ends, axes, steps):
        ax = ax + r if ax < 0 else ax
        if not 0 <= ax < r:
            raise unsupported(node, f"axis {ax} out of range for rank {r}")
        if st == 0:
            raise unsupported(node, "a step of 0")
        # Python's slice semantics are ONNX's: negatives count from the end, then clamp
        start, _stop, step = slice(int(s), int(e), st).indices(shape[ax])
        params[ax] = (start, step)
    return params


@register("Slice")
def slice_op(node: Node, ctx: LowerContext) -> Lowered:
    x, y = node.inputs[0], node.outputs[0]
    params = slice_params(node, ctx)
    check_nonempty(node, ctx, x, y)
    idx = names("i", ctx.rank(x))
    src = [affine([(step, i)], start) for i, (start, step) in zip(idx, params)]
    return Lowered([f"{lhs(ctx.name(y), idx)} = {read(ctx.name(x), src)}"
                    f"{where(out_ranges(idx, ctx.shape(y)))}"])


def _gather_operands(node: Node, ctx: LowerContext) -> tuple[str, str, str, int, int]:
    """(data, indices, output, the axis, its extent) of a Gather / GatherElements."""
    x, ind, y = node.inputs[0], node.inputs[1], node.outputs[0]
    check_nonempty(node, ctx, x, ind, y)
    check_dtype(node, ctx, ind, ("int32", "int64"))
    a = axis_attr(node, ctx.rank(x))
    return x, ind, y, a, ctx.shape(x)[a]


@register("Gather")
def gather(node: Node, ctx: LowerContext) -> Lowered:
    """``Y[a.., q.., b..] = X[a.., I[q..], b..]``.

    Constant indices forming an arithmetic progression (a scalar, a range, a strided
    range) become an affine index (constant indices out of range are refused at import,
    :mod:`.onnx_validate`). Other indices are read at run time (an indirect read): a
    negative index wraps (``i + D``), and every index is then clamped into ``[0, D)``,
    so that no out-of-bounds access can happen whatever the data. An index outside
    ``[-D, D)`` is an error in ONNX: a check before the kernel scans the indices once
    (:class:`polyc.program.IndexCheck`) and fails the run with a message naming the node.
    """
    x, ind, y, a, D = _gather_operands(node, ctx)
    qr = ctx.rank(ind)
    yi = names("i", ctx.rank(y))
    pre, q, post = yi[:a], yi[a:a + qr], yi[a + qr:]
    value = ctx.const(ind)
    index: str
    if value is not None:
        v = np.asarray(value).reshape(-1).astype(np.int64)
        if ((v < -D) | (v >= D)).any():
            raise unsupported(node, f"constant indices out of range [-{D}, {D}): {v.tolist()}")
        v = np.where(v < 0, v + D, v)
        strides = np.diff(v)
        qshape = ctx.shape(ind)
        if len(v) == 1:
            index = str(int(v[0]))
        elif (strides == strides[0]).all() and sum(d > 1 for d in qshape) == 1:
            j = q[[k for k, d in enumerate(qshape) if d > 1][0]]
            index = affine([(int(strides[0]), j)], int(v[0]))
        else:
            value = None
    checks: tuple[IndexCheck, ...] = ()
    if value is None:
        index = _runtime_index(ctx.name(ind), q, D)
        checks = _index_check(node, ctx, ind, D, f"axis {a} of {x!r} {_dims(ctx.shape(x))}")
    return Lowered([f"{lhs(ctx.name(y), yi)} = {read(ctx.name(x), pre + [index] + post)}"
                    f"{where(out_ranges(yi, ctx.shape(y)))}"], checks)


def _runtime_index(ind: str, idx: Sequence[str], extent: int) -> str:
    """The index read from ``ind`` at ``idx``: negative values wrapped (``i + D``), then
    clamped into ``[0, D)`` so that no data can make the access go out of bounds (the
    run-time check reports an index outside ``[-D, D)``)."""
    raw = read(ind, idx)
    return f"min(max(({raw} < 0 ? {raw} + {extent} : {raw}), 0), {extent - 1})"


def _index_check(node: Node, ctx: LowerContext, ind: str, extent: int, what: str
                 ) -> tuple[IndexCheck, ...]:
    if ctx.const(ind) is not None:  # constant indices: checked at import
        return ()
    return (IndexCheck(-1, ind, -extent, extent - 1,
                       f"node {node.name!r} ({node.op_type}): index ",
                       f" of the indices {ind!r} {_dims(ctx.shape(ind))} is out of range for "
                       f"{what} (valid: {-extent} to {extent - 1})"),)


@register("GatherElements")
def gather_elements(node: Node, ctx: LowerContext) -> Lowered:
    """``Y[i..] = X[i.. with I[i..] at axis a]`` (indices read at run time: wrapped when
    negative, clamped, and checked before the kernel as for Gather)."""
    x, ind, y, a, D = _gather_operands(node, ctx)
    yi = names("i", ctx.rank(x))
    index = _runtime_index(ctx.name(ind), yi, D)
    src = yi[:a] + [index] + yi[a + 1:]
    return Lowered([f"{lhs(ctx.name(y), yi)} = {read(ctx.name(x), src)}"
                    f"{where(out_ranges(yi, ctx.shape(y)))}"],
                   _index_check(node, ctx, ind, D, f"axis {a} of {x!r} "
                                f"{_dims(ctx.shape(x))}"))


@register("GatherND")
def gather_nd(node: Node, ctx: LowerContext) -> Lowered:
    """``Y[b.., q.., r..] = X[b.., I[b.., q.., 0], .., I[b.., q.., m-1], r..]`` with
    ``batch_dims`` leading batch axes; indices wrapped and clamped per addressed axis and
    checked before the kernel (run-time indices: the addressed axes must have one
    extent, which the one range of the check states)."""
    x, ind, y = node.inputs[0], node.inputs[1], node.outputs[0]
    check_nonempty(node, ctx, x, ind, y)
    check_dtype(node, ctx, ind, ("int32", "int64"))
    b = int(node.attr("batch_dims", 0))
    xs, qs = ctx.shape(x), ctx.shape(ind)
    m = qs[-1]
    extents = [xs[b + k] for k in range(m)]
    if ctx.const(ind) is None and len(set(extents)) > 1:
        raise unsupported(node, f"run-time indices over axes of different extents {extents} "
                          "(one range check per index tensor)")
    yi = names("i", ctx.rank(y))
    batch, q, rest = yi[:b], yi[b:len(qs) - 1], yi[len(qs) - 1:]
    src = list(batch) + [_runtime_index(ctx.name(ind), [*batch, *q, str(k)], extents[k])
                         for k in range(m)] + list(rest)
    checks = _index_check(node, ctx, ind, extents[0], f"the axes {b} to {b + m - 1} of "
                          f"{x!r} {_dims(xs)}") if extents else ()
    return Lowered([f"{lhs(ctx.name(y), yi)} = {read(ctx.name(x), src)}"
                    f"{where(out_ranges(yi, ctx.shape(y)))}"], checks)


def _dims(shape: Sequence[int]) -> str:
    return "[" + ", ".join(str(d) for d in shape) + "]"


@register("Pad")
def pad(node: Node, ctx: LowerContext) -> Lowered:
    """Modes constant (guarded reads), edge (clamped index), reflect and wrap."""
    x, y = node.inputs[0], node.outputs[0]
    check_nonempty(node, ctx, x, y)
    dt = ctx.dtype(x)
    shape = ctx.shape(x)
    r = len(shape)
    mode = node.attr("mode", "constant")
    if isinstance(mode, bytes):
        mode = mode.decode()
    if mode not in ("constant", "reflect", "edge", "wrap"):
        raise unsupported(node, f"mode={mode!r} (supported: constant, reflect, edge, wrap)")
    if ctx.graph.opset >= 11 or len(node.inputs) > 1:
        pads = ints_param(node, ctx, 1, "pads", "pads")
        axes = ints_param(node, ctx, 3, "axes", "axes")
    else:
        pads = [int(p) for p in node.attr("pads", node.attr("paddings", []))]
        axes = None
    if pads is None:
        raise unsupported(node, "pads are required")
    axes = list(range(r)) if axes is None else [a + r if a < 0 else a for a in axes]
    if len(pads) != 2 * len(axes):
        raise unsupported(node, f"{len(pads)} pads for {len(axes)} axes")
    begin = [0] * r
    for k, a in enumerate(axes):
        begin[a] = pads[k]
    # the fill value: an input (constant or not) or the `value` attribute
    fill = typed_literal(node.attr("value", 0.0) if dt.startswith("float")
                         else int(node.attr("value", 0)), dt)
    if len(node.inputs) > 2 and node.inputs[2]:
        cv = ctx.const(node.inputs[2])
        if cv is not None:
            cv = np.asarray(cv).reshape(-1)
            fill = typed_literal(cv[0].item() if cv.size else 0, dt)
        else:
            c = node.inputs[2]
            fill = read(ctx.name(c), ["0"] * ctx.rank(c))
    idx = names("i", r)
    out_shape = ctx.shape(y)
    src, guards = [], []
    for d in range(r):
        D, p, i = shape[d], begin[d], idx[d]
        s = affine([(1, i)], -p)
        lo_out, hi_out = p > 0, out_shape[d] - 1 - p > D - 1
        if not (lo_out or hi_out):
            src.append(s)
            continue
        if mode == "constant":
            src.append(s)
            if lo_out:
                guards.append(f"{s} >= 0")
            if hi_out:
                guards.append(f"{s} < {D}")
        elif mode == "edge":
            e = s
            if lo_out:
                e = f"max({e}, 0)"
            if hi_out:
                e = f"min({e}, {D - 1})"
            src.append(e)
        elif mode == "wrap":
            src.append(f"({affine([(1, i)], -p + D * (p // D + 1))}) % {D}")
        else:  # reflect: one reflection at each end
            if p > D - 1 or out_shape[d] - p - D > D - 1:
                raise unsupported(node, f"reflect padding wider than the axis extent minus "
                                        f"one ({D - 1}) on axis {d}")
            e = s
            if hi_out:
                e = f"({s} >= {D} ? {affine([(-1, i)], 2 * (D - 1) + p)} : {e})"
            if lo_out:
                e = f"({s} < 0 ? {affine([(-1, i)], p)} : {e})"
            src.append(e)
    body = read(ctx.name(x), src)
    if guards:
        body = f"({' && '.join(guards)}) ? {body} : {fill}"
    return Lowered([f"{lhs(ctx.name(y), idx)} = {body}{where(out_ranges(idx, out_shape))}"])


@register("Expand")
def expand(node: Node, ctx: LowerContext) -> Lowered:
    x, y = node.inputs[0], node.outputs[0]
    check_nonempty(node, ctx, x, y)
    ys, xs = ctx.shape(y), ctx.shape(x)
    idx = names("i", len(ys))
    off = len(ys) - len(xs)
    src = ["0" if xs[d] == 1 and ys[d + off] != 1 else idx[d + off] for d in range(len(xs))]
    return Lowered([f"{lhs(ctx.name(y), idx)} = {read(ctx.name(x), src)}"
                    f"{where(out_ranges(idx, ys))}"])


@register("Tile")
def tile(node: Node, ctx: LowerContext) -> Lowered:
    x, y = node.inputs[0], node.outputs[0]
    check_nonempty(node, ctx, x, y)
    ys, xs = ctx.shape(y), ctx.shape(x)
    idx = names("i", len(ys))
    src = [i if dy == dx else f"{i} % {dx}" for i, dy, dx in zip(idx, ys, xs)]
    return Lowered([f"{lhs(ctx.name(y), idx)} = {read(ctx.name(x), src)}"
                    f"{where(out_ranges(idx, ys))}"])


# -- shapes and constants --------------------------------------------------------------

def _fill(node: Node, ctx: LowerContext, y: str, values: np.ndarray) -> Lowered:
    """``y`` holds the constant ``values`` (a literal, or a ``?:`` table for few values)."""
    check_nonempty(node, ctx, y)
    dt = check_dtype(node, ctx, y)
    shape = ctx.shape(y)
    idx = names("i", len(shape))
    flat = values.reshape(-1)
    if flat.size != int(np.prod(shape, dtype=np.int64)):
        raise unsupported(node, f"value of {flat.size} elements for shape {shape}")
    if len(set(flat.tolist())) > 1 and flat.size > 256:
        raise unsupported(node, f"a constant of {flat.size} distinct values is not lowered "
                                f"to code; it must be a weight (constant folding)")
    lin = affine([(int(np.prod(shape[d + 1:], dtype=np.int64)), i) for d, i in enumerate(idx)])
    expr = const_table(f"({lin})" if len(idx) > 1 else lin, flat.tolist(), dt)
    return Lowered([f"{lhs(ctx.name(y), idx)} = {expr}{where(out_ranges(idx, shape))}"])


@register("Shape")
def shape_op(node: Node, ctx: LowerContext) -> Lowered:
    s = list(ctx.shape(node.inputs[0]))
    start, end = node.attr("start", 0), node.attr("end", None)
    return _fill(node, ctx, node.outputs[0], np.array(s[slice(start, end)], dtype=np.int64))


@register("Size")
def size_op(node: Node, ctx: LowerContext) -> Lowered:
    n = int(np.prod(ctx.shape(node.inputs[0]), dtype=np.int64))
    return _fill(node, ctx, node.outputs[0], np.array(n, dtype=np.int64))


@register("ConstantOfShape")
def constant_of_shape(node: Node, ctx: LowerContext) -> Lowered:
    v = node.attr("value")
    v = np.zeros(1, np.float32) if v is None else np.asarray(v).reshape(-1)
    y = node.outputs[0]
    return _fill(node, ctx, y, np.full(ctx.shape(y), v[0].item()))


@register("Range")
def range_(node: Node, ctx: LowerContext) -> Lowered:
    """``y(i) = start + i * delta`` for constant start, limit and delta (given as graph
    inputs they are parameters: the model is specialised on them, see polyc.backend)."""
    start, limit, delta = (const_input(node, ctx, k, what)
                           for k, what in enumerate(("start", "limit", "delta")))
    y = node.outputs[0]
    check_nonempty(node, ctx, y)
    num = (lambda v: repr(float(v))) if ctx.dtype(y) in ("float32", "float64") else \
        (lambda v: str(int(v)))
    return Lowered([f"{lhs(ctx.name(y), ['i'])} = {num(start)} + i * {num(delta)}"
                    f"{where(out_ranges(['i'], ctx.shape(y)))}"])


@register("Constant")
def constant(node: Node, ctx: LowerContext) -> Lowered:
    y = node.outputs[0]
    value = ctx.const(y)
    if value is None:
        for key in ("value", "value_float", "value_int", "value_floats", "value_ints"):
            if node.attr(key) is not None:
                value = node.attr(key)
                break
    if value is None:
        raise unsupported(node, "only value, value_float(s) and value_int(s) are supported")
    return _fill(node, ctx, y, np.asarray(value))


# -- Resize / Upsample --------------------------------------------------------------------

_COORD_MODES = ("half_pixel", "half_pixel_symmetric", "pytorch_half_pixel", "asymmetric",
                "align_corners", "tf_half_pixel_for_nn")
_NEAREST_MODES = ("round_prefer_floor", "round_prefer_ceil", "floor", "ceil")




def _source_coords(mode: str, n_in: int, n_out: int, scale: float) -> np.ndarray:
    """ONNX's source coordinate of each output index (float64, as the reference computes)."""
    y = np.arange(n_out, dtype=np.float64)
    width = scale * n_in
    if mode == "align_corners":
        return np.zeros(n_out) if width == 1 else y * (n_in - 1) / (width - 1)
    if mode == "asymmetric":
        return y / scale
    if mode == "pytorch_half_pixel":
        return np.full(n_out, -0.5) if width == 1 else (y + 0.5) / scale - 0.5
    if mode == "half_pixel":
        return (y + 0.5) / scale - 0.5
    if mode == "half_pixel_symmetric":
        offset = n_in / 2 * (1 - n_out / width)
        return offset + (y + 0.5) / scale - 0.5
    if mode == "tf_half_pixel_for_nn":
        return (y + 0.5) / scale
    raise AssertionError(mode)


def _nearest_table(x: np.ndarray, mode: str, n_in: int) -> np.ndarray:
    fl = np.floor(x)
    frac = x - fl
    if mode == "floor":
        t = fl
    elif mode == "ceil":
        t = np.ceil(x)
    elif mode == "round_prefer_floor":
        t = np.where(frac <= 0.5, fl, fl + 1)
    else:
        t = np.where(frac < 0.5, fl, fl + 1)
    return np.clip(t, 0, n_in - 1).astype(np.int64)


def _quasi_affine(table: np.ndarray, i: str, scale: float, n_in: int) -> str | None:
    """An expression ``(a*i + b) / c`` (floor division) equal to ``table`` everywhere, or None.

    The candidates come from rational approximations of the scale: the slope of a
    nearest-neighbour table is ``1/scale``.
    """
    n = len(table)
    j = np.arange(n, dtype=np.int64)
    if n == 1 or (table == table[0]).all():
        return str(int(table[0]))
    cands: list[Fraction] = []
    for lim in (16, 256, 4096):
        cands.append(Fraction(1 / scale).limit_denominator(lim))
    cands.append(Fraction(n_in, n))
    for slope in dict.fromkeys(cands):
        a, c = slope.numerator, slope.denominator
        if a <= 0:
            continue
        # table[j] = floor((a*j + b) / c): b in the interval each point allows
        lo = max(int(table[k]) * c - a * int(k) for k in range(n))
        hi = min((int(table[k]) + 1) * c - 1 - a * int(k) for k in range(n))
        if lo <= hi:
            b = lo
            if ((a * j + b) // c == table).all():
                num = affine([(a, i)], b)
                return f"({num}) / {c}" if c > 1 else num
    return None


def _steps(table: np.ndarray, i: str) -> str | None:
    """``t0 + (i >= 3 ? 1 : 0) + ...`` for a non-decreasing table of few steps."""
    diffs = np.diff(table)
    if (diffs < 0).any() or (diffs != 0).sum() > 64:
        return None
    parts = [str(int(table[0]))]
    for k in np.nonzero(diffs)[0]:
        parts.append(f"({i} >= {k + 1} ? {int(diffs[k])} : 0)")
    return "(" + " + ".join(parts) + ")"


def _scale_input(node: Node, ctx: LowerContext, i: int, what: str
                 ) -> tuple[np.ndarray | None, str | None]:
    """(constant value, or None; TC name of the runtime tensor, or None) of input ``i``."""
    if i >= len(node.inputs) or not node.inputs[i]:
        return None, None
    t = node.inputs[i]
    if 0 in ctx.shape(t):
        return None, None
    v = ctx.const(t)
    if v is not None:
        v = np.asarray(v).reshape(-1)
        return (v if v.size else None), None
    if ctx.rank(t) != 1:
        raise unsupported(node, f"the {what} input must be 1-D")
    return None, ctx.name(t)


def keys_weights(t: str, a: float = -0.75) -> list[str]:
    """The weights of the taps ``floor(x) - 1 .. floor(x) + 2`` of Keys' cubic
    convolution kernel (coefficient ``a``) at ``t = x - floor(x)`` (a double)."""
    def far(v: str) -> str:
        return f"((({a!r} * {v} - {5 * a!r}) * {v} + {8 * a!r}) * {v} - {4 * a!r})"

    def near(v: str) -> str:
        return f"((({a + 2!r}) * {v} - ({a + 3!r})) * {v} * {v} + 1.0)"
    return [far(f"({t} + 1.0)"), near(t), near(f"(1.0 - {t})"), far(f"(2.0 - {t})")]


def _resize_cubic(node: Node, ctx: LowerContext, resized: list[int], coordinate, clamp,
                  lets: list[str], idx: list[str], dt: str) -> Lowered:
    """Cubic resize: on each resized axis the four neighbours ``floor(x) - 1 .. + 2``
    (clamped to the input's edge) weighted by Keys' cubic kernel of ``t = x - floor(x)``."""
    x, y = node.inputs[0], node.outputs[0]
    xs, ys = ctx.shape(x), ctx.shape(y)
    if len(resized) > 2:
        raise unsupported(node, f"cubic resize of {len(resized)} axes (at most 2)")
    a = float(node.attr("cubic_coeff_a", -0.75))
    exclude = bool(node.attr("exclude_outside", 0))
    taps: dict[int, list[tuple[str, str]]] = {}
    for d in resized:
        xv, fv = coordinate(d)
        t = f"t{d}"
        lets.append(f"{t} = {xv} - {fv}")
        ws = keys_weights(t, a)
        pos = [f"int64({fv}) + {k - 1}" for k in range(4)]
        if exclude:  # weights of neighbours outside the input are 0, the rest rescaled
            ins = [f"({p} >= 0 && {p} < {xs[d]} ? 1.0 : 0.0)" for p in pos]
            for k in range(4):
                lets.append(f"c{d}_{k} = ({ws[k]}) * {ins[k]}")
            lets.append(f"n{d} = c{d}_0 + c{d}_1 + c{d}_2 + c{d}_3")
            weights = [f"c{d}_{k} / n{d}" for k in range(4)]
        else:
            for k in range(4):
                lets.append(f"c{d}_{k} = {ws[k]}")
            weights = [f"c{d}_{k}" for k in range(4)]
        taps[d] = [(clamp(p, xs[d]), w) for p, w in zip(pos, weights)]
    terms = []
    for corner in range(4 ** len(resized)):
        src, ws_ = list(idx), []
        for k, d in enumerate(resized):
            p, w = taps[d][(corner >> (2 * k)) & 3]
            src[d] = p
            ws_.append(f"({w})")
        terms.append(" * ".join(ws_ + [f"double({read(ctx.name(x), src)})"]))
    clauses = ", ".join(lets + [f"{i} in 0:{n}" for i, n in zip(idx, ys)])
    return Lowered([f"{lhs(ctx.name(y), idx)} = {TC_TYPE[dt]}({' + '.join(terms)}) "
                    f"where {clauses}"])


def _resize_params(node: Node, ctx: LowerContext
                   ) -> tuple[list[float | None], list[str], str, str, str]:
    """(scale per axis -- None when read at run time --, the TC double expression of each
    scale, mode, coordinate mode, nearest mode), after the checks."""
    xs, ys = ctx.shape(node.inputs[0]), ctx.shape(node.outputs[0])
    r = len(xs)
    mode = str_attr(node, "mode", "nearest")
    if mode not in ("nearest", "linear", "bilinear", "cubic", "bicubic"):
        raise unsupported(node, f"mode={mode!r} (supported: nearest, linear, cubic)")
    mode = "cubic" if mode == "bicubic" else mode
    mode = "linear" if mode == "bilinear" else mode
    axes = list(range(r))
    scales_in = sizes_in = runtime = None
    if node.op_type == "Upsample":
        coord, nearest = "asymmetric", "floor"
        if ctx.graph.opset < 9:
            scales_in = node.attr("scales")
            if scales_in is None:  # Upsample-1: height_scale / width_scale
                scales_in = [1.0] * (r - 2) + [float(node.attr("height_scale", 1.0)),
                                               float(node.attr("width_scale", 1.0))]
            scales_in = np.asarray(scales_in, dtype=np.float64)
        else:
            scales_in, runtime = _scale_input(node, ctx, 1, "scales")
    else:
        coord = str_attr(node, "coordinate_transformation_mode",
                          "half_pixel" if ctx.graph.opset >= 11 else "asymmetric")
        nearest = str_attr(node, "nearest_mode", "round_prefer_floor")
        if ctx.graph.opset < 11:
            nearest = "floor"  # Resize-10: asymmetric, floor
        if coord not in _COORD_MODES:
            raise unsupported(node, f"coordinate_transformation_mode={coord!r} (supported: "
                                    f"{', '.join(_COORD_MODES)})")
        if nearest not in _NEAREST_MODES:
            raise unsupported(node, f"nearest_mode={nearest!r} (supported: "
                                    f"{', '.join(_NEAREST_MODES)})")
        if node.attr("antialias", 0):
            raise unsupported(node, "antialias=1 is not supported")
        policy = str_attr(node, "keep_aspect_ratio_policy", "stretch")
        if policy != "stretch":
            raise unsupported(node, f"keep_aspect_ratio_policy={policy!r} (supported: stretch)")
        if ctx.graph.opset < 11:
            scales_in, runtime = _scale_input(node, ctx, 1, "scales")
        else:
            scales_in, runtime = _scale_input(node, ctx, 2, "scales")
            sizes_in, runtime_sizes = _scale_input(node, ctx, 3, "sizes")
            if sizes_in is None and runtime_sizes is not None:
                sizes_in = "inferred"  # the output shape is static: sizes are its extents
        if node.attr("axes") is not None:
            axes = [int(a) % r for a in node.attr("axes")]
    scales: list[float | None] = [1.0] * r
    exprs: list[str] = ["1.0"] * r
    if sizes_in is not None:
        for a in axes:  # ONNX computes the scale as sizes / input extent
            scales[a] = ys[a] / xs[a]
    elif scales_in is not None:
        if len(scales_in) != len(axes):
            raise unsupported(node, f"{len(scales_in)} scales for {len(axes)} axes")
        for a, v in zip(axes, scales_in):
            scales[a] = float(v)
    elif runtime is not None:
        if ctx.shape(node.inputs[1 if node.op_type == "Upsample" or ctx.graph.opset < 11
                                  else 2])[0] != len(axes):
            raise unsupported(node, f"the scales input should have {len(axes)} values")
        for k, a in enumerate(axes):
            scales[a], exprs[a] = None, f"double({runtime}({k}))"
    else:
        raise unsupported(node, "one of scales or sizes must be given")
    for d in range(r):
        if scales[d] is not None:
            if scales[d] <= 0:
                raise unsupported(node, f"scale {scales[d]} on axis {d}")
            exprs[d] = repr(float(scales[d]))
    return scales, exprs, mode, coord, nearest


def _coord_expr(coord: str, i: str, n_in: int, n_out: int, scale: float | None,
                S: str) -> str:
    """The source coordinate (double) of output index ``i`` (``S``: the scale)."""
    fi = f"double({i})"
    width = f"({S} * {float(n_in)!r})"

    def when_width_one(one: str, other: str) -> str:
        if scale is None:
            return f"({width} == 1.0 ? {one} : {other})"
        return one if scale * n_in == 1 else other

    if coord == "align_corners":
        return when_width_one("0.0", f"{fi} * {float(n_in - 1)!r} / ({width} - 1.0)")
    if coord == "asymmetric":
        return f"{fi} / {S}"
    if coord == "pytorch_half_pixel":
        return when_width_one("(-0.5)", f"(({fi} + 0.5) / {S} - 0.5)")
    if coord == "half_pixel_symmetric":
        off = f"{n_in / 2!r} * (1.0 - {float(n_out)!r} / {width})"
        return f"({off} + ({fi} + 0.5) / {S} - 0.5)"
    if coord == "tf_half_pixel_for_nn":
        return f"({fi} + 0.5) / {S}"
    return f"(({fi} + 0.5) / {S} - 0.5)"


_ROUND = {"floor": "{f}", "ceil": "ceil({x})",
          "round_prefer_floor": "({x} - {f} <= 0.5 ? {f} : {f} + 1.0)",
          "round_prefer_ceil": "({x} - {f} < 0.5 ? {f} : {f} + 1.0)"}


@register("Resize", "Upsample")
def resize(node: Node, ctx: LowerContext) -> Lowered:
    """Resize and Upsample, modes nearest, linear and cubic.

    Nearest with a constant scale (or sizes): the source index of each axis is a
    quasi-affine function of the output index, found exactly for the scale (or a sum
    of steps). Otherwise (a scale read at run time; linear mode) the source coordinate
    is computed in double from the output index (``double(i)``) and the indices read
    are clamped into the input; linear weights its two neighbours on each axis, cubic
    its four (Keys' kernel with ``cubic_coeff_a``; ``exclude_outside`` drops the weights
    of neighbours outside the input and renormalises the others).
    """
    x, y = node.inputs[0], node.outputs[0]
    check_nonempty(node, ctx, x, y)
    dt = check_dtype(node, ctx, x, ("float32", "float64"))
    xs, ys = ctx.shape(x), ctx.shape(y)
    scales, S, mode, coord, nearest = _resize_params(node, ctx)
    r = len(xs)
    idx = names("i", r)
    resized = [d for d in range(r)
               if not (scales[d] is not None and math.isclose(scales[d], 1.0)
                       and xs[d] == ys[d]) and not (xs[d] == 1 and ys[d] == 1)]
    lets: list[str] = []
    src = list(idx)

    def coordinate(d: int) -> tuple[str, str]:
        xv, fv = f"x{d}", f"f{d}"
        lets.extend([f"{xv} = {_coord_expr(coord, idx[d], xs[d], ys[d], scales[d], S[d])}",
                     f"{fv} = floor({xv})"])
        return xv, fv

    def clamp(e: str, n: int) -> str:
        return f"min(max({e}, 0), {n - 1})"

    if mode == "nearest":
        for d in resized:
            e = None
            if scales[d] is not None:
                xv = _source_coords(coord, xs[d], ys[d], scales[d])
                table = _nearest_table(xv, nearest, xs[d])
                e = _quasi_affine(table, idx[d], scales[d], xs[d]) or _steps(table, idx[d])
            if e is None:
                xv, fv = coordinate(d)
                e = clamp(f"int64({_ROUND[nearest].format(x=xv, f=fv)})", xs[d])
            src[d] = e
        clauses = ", ".join(lets + [f"{i} in 0:{n}" for i, n in zip(idx, ys)])
        return Lowered([f"{lhs(ctx.name(y), idx)} = {read(ctx.name(x), src)} where {clauses}"])
    if mode == "cubic":
        return _resize_cubic(node, ctx, resized, coordinate, clamp, lets, idx, dt)
    if len(resized) > 4:
        raise unsupported(node, f"linear resize of {len(resized)} axes (at most 4)")
    lo, hi, w = {}, {}, {}
    for d in resized:
        xv, fv = coordinate(d)
        lo[d] = clamp(f"int64({fv})", xs[d])
        hi[d] = clamp(f"int64({fv}) + 1", xs[d])
        w[d] = f"({xv} - {fv})"
    terms = []
    for corner in range(2 ** len(resized)):
        src, ws = list(idx), []
        for k, d in enumerate(resized):
            up = (corner >> k) & 1
            src[d] = hi[d] if up else lo[d]
            ws.append(w[d] if up else f"(1.0 - {w[d]})")
        terms.append(" * ".join(ws + [f"double({read(ctx.name(x), src)})"]))
    value = " + ".join(terms)
    clauses = ", ".join(lets + [f"{i} in 0:{n}" for i, n in zip(idx, ys)])
    return Lowered([f"{lhs(ctx.name(y), idx)} = {TC_TYPE[dt]}({value}) where {clauses}"])
