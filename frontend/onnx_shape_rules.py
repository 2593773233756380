"""The shape rules of ONNX ops, for :mod:`.onnx_validate`.

A rule (registered with :func:`_rule` for one or more op types) gets a :class:`NodeView`
view of one node (its inputs' shapes and constant values, its attributes) and returns
the shape each output must have (None where it does not compute one), raising
:class:`OnnxValidationError` where the inputs do not fit the op: broadcasting, MatMul /
Gemm / Einsum extents, views, Concat / Split / Slice / Gather axes and indices, Pad /
Tile / Expand results, reductions, and Conv / ConvTranspose / pool windows.
"""
from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from polyc.errors import SemanticError

from .onnx_graph import Node


class OnnxValidationError(SemanticError):
    """The ONNX model is inconsistent: shapes declared or implied by its ops disagree,
    an axis or a constant index is out of range... The message names the node (name
    and op type), the tensors and their shapes."""


Shape = tuple[int, ...]


def fmt(shape: Sequence[int] | None) -> str:
    return "[?]" if shape is None else "[" + ", ".join(str(int(d)) for d in shape) + "]"


def element_count(shape: Sequence[int]) -> int:
    return int(np.prod([int(d) for d in shape], dtype=np.int64))


# -- per-node checks ------------------------------------------------------------------

class NodeView:
    """What a shape rule may ask about one node."""

    def __init__(self, node: Node, shape_of: Callable[[str], Shape | None],
                 const_of: Callable[[str], np.ndarray | None], opset: int):
        self.node, self.opset = node, opset
        self._shape_of, self._const_of = shape_of, const_of

    def has(self, i: int) -> bool:
        return i < len(self.node.inputs) and bool(self.node.inputs[i])

    def name(self, i: int) -> str:
        return self.node.inputs[i]

    def shape(self, i: int) -> Shape | None:
        return self._shape_of(self.node.inputs[i]) if self.has(i) else None

    def const(self, i: int) -> np.ndarray | None:
        if not self.has(i):
            return None
        v = self._const_of(self.node.inputs[i])
        return None if v is None else np.asarray(v)

    def ints(self, i: int) -> list[int] | None:
        v = self.const(i)
        return None if v is None else [int(a) for a in v.reshape(-1)]

    def attr(self, key: str, default: Any = None) -> Any:
        v = self.node.attr(key, default)
        return v.decode() if isinstance(v, bytes) else v

    def desc(self, i: int) -> str:
        return f"{self.node.inputs[i]!r} {fmt(self.shape(i))}"

    def error(self, what: str) -> OnnxValidationError:
        return OnnxValidationError(f"node {self.node.name!r} ({self.node.op_type}): {what}")

    def axis(self, a: int, rank: int, what: str, key: str = "axis",
             allow_end: bool = False) -> int:
        top = rank if allow_end else rank - 1
        if not -rank <= a <= top:
            raise self.error(f"{key}={a} is out of range for {what} of rank {rank} "
                             f"(valid: {-rank} to {top})")
        return a + rank if a < 0 else a


Rule = Callable[[NodeView], "list[Shape | None] | None"]
RULES: dict[str, Rule] = {}


def _rule(*ops: str) -> Callable[[Rule], Rule]:
    def deco(fn: Rule) -> Rule:
        for op in ops:
            RULES[op] = fn
        return fn
    return deco


def broadcast(v: NodeView, indices: Sequence[int]) -> Shape:
    """The multidirectional (numpy) broadcast of the inputs ``indices``."""
    shapes = [v.shape(i) for i in indices]
    rank = max((len(s) for s in shapes), default=0)
    out = []
    for d in range(rank):
        dims = {s[d - rank + len(s)] for s in shapes if d - rank + len(s) >= 0}
        big = dims - {1}
        if len(big) > 1:
            shown = " and ".join(v.desc(i) for i in indices)
            raise v.error(f"cannot broadcast {shown}: extents "
                          f"{' vs '.join(str(b) for b in sorted(big))} on axis "
                          f"{d - rank} (from the end)")
        out.append(big.pop() if big else 1)
    return tuple(out)


def _unidirectional(v: NodeView, i: int, target: Sequence[int], what: str) -> None:
    s = v.shape(i)
    if s is None:
        return
    if len(s) > len(target) or any(a != 1 and a != b for a, b in
                                   zip(reversed(s), reversed(list(target)))):
        raise v.error(f"{v.desc(i)} does not broadcast to {what} {fmt(target)}")


_BINARY = ["Add", "Sub", "Mul", "Div", "Pow", "Mod", "Equal", "Less", "LessOrEqual",
           "Greater", "GreaterOrEqual", "And", "Or", "Xor", "BitShift", "BitwiseAnd",
           "BitwiseOr", "BitwiseXor"]


@_rule(*_BINARY)
def _binary(v: NodeView) -> list[Shape | None] | None:
    if v.opset < 7:  # legacy broadcast attribute
        return None
    return [broadcast(v, [0, 1])]


@_rule("Max", "Min", "Sum", "Mean")
def _variadic(v: NodeView) -> list[Shape | None] | None:
    if v.opset < 8:
        return None
    return [broadcast(v, [i for i in range(len(v.node.inputs)) if v.has(i)])]


@_rule("Where")
def _where(v: NodeView) -> list[Shape | None] | None:
    return [broadcast(v, [0, 1, 2])]


@_rule("PRelu")
def _prelu(v: NodeView) -> list[Shape | None] | None:
    x = v.shape(0)
    if v.opset >= 7:
        _unidirectional(v, 1, x, f"the input {v.name(0)!r}")  # type: ignore[arg-type]
    return [x]


_SAME_SHAPE = [
    "Relu", "LeakyRelu", "Sigmoid", "HardSigmoid", "HardSwish", "Tanh", "Erf", "Gelu",
    "Exp", "Log", "Sqrt", "Reciprocal", "Neg", "Abs", "Floor", "Ceil", "Softplus",
    "Softsign", "Elu", "Selu", "Celu", "ThresholdedRelu", "Sign", "Sin", "Cos", "Tan",
    "Asin", "Acos", "Atan", "Sinh", "Cosh", "Asinh", "Acosh", "Atanh", "Round", "Cast",
    "CastLike", "IsNaN", "IsInf", "Mish", "Swish", "Shrink", "Not", "BitwiseNot", "Clip",
    "Identity", "LRN", "Trilu", "EyeLike", "GroupNormalization", "ReverseSequence",
    "DepthToSpace_"]


@_rule(*_SAME_SHAPE)
def _same(v: NodeView) -> list[Shape | None] | None:
    return [v.shape(0)]


@_rule("Dropout")
def _dropout(v: NodeView) -> list[Shape | None] | None:
    return [v.shape(0), v.shape(0)]


@_rule("Softmax", "LogSoftmax", "Hardmax")
def _softmax(v: NodeView) -> list[Shape | None] | None:
    x = v.shape(0)
    if x:
        v.axis(int(v.attr("axis", -1 if v.opset >= 13 else 1)), len(x),
               f"the input {v.name(0)!r} {fmt(x)}")
    return [x]


@_rule("LpNormalization")
def _lpnorm(v: NodeView) -> list[Shape | None] | None:
    x = v.shape(0)
    if x:
        v.axis(int(v.attr("axis", -1)), len(x), f"the input {v.name(0)!r} {fmt(x)}")
    return [x]


@_rule("CumSum", "CumProd")
def _cumsum(v: NodeView) -> list[Shape | None] | None:
    x = v.shape(0)
    a = v.ints(1)
    if x and a is not None and len(a) == 1:
        v.axis(a[0], len(x), f"the input {v.name(0)!r} {fmt(x)}")
    return [x]


@_rule("LayerNormalization", "RMSNormalization")
def _layernorm(v: NodeView) -> list[Shape | None] | None:
    x = v.shape(0)
    if x:
        v.axis(int(v.attr("axis", -1)), len(x), f"the input {v.name(0)!r} {fmt(x)}")
    return [x] + [None] * (len(v.node.outputs) - 1)


def _channel_params(v: NodeView, inputs: Sequence[int], what: str) -> None:
    x = v.shape(0)
    c = x[1] if len(x) > 1 else 1  # type: ignore[arg-type]
    for i in inputs:
        s = v.shape(i)
        if s is not None and tuple(s) != (c,):
            raise v.error(f"{what} {v.desc(i)} should have the shape [{c}] (the channels of "
                          f"{v.desc(0)})")


@_rule("BatchNormalization")
def _batchnorm(v: NodeView) -> list[Shape | None] | None:
    if v.opset < 9:  # the spatial attribute: other parameter shapes
        return None
    _channel_params(v, [1, 2, 3, 4], "the parameter")
    return [v.shape(0)] + [None] * (len(v.node.outputs) - 1)


@_rule("InstanceNormalization")
def _instancenorm(v: NodeView) -> list[Shape | None] | None:
    _channel_params(v, [1, 2], "the parameter")
    return [v.shape(0)]


# -- contractions -------------------------------------------------------------------------

@_rule("MatMul")
def _matmul(v: NodeView) -> list[Shape | None] | None:
    a, b = v.shape(0), v.shape(1)
    if not a or not b:
        raise v.error(f"MatMul needs inputs of rank >= 1, got {v.desc(0)} and {v.desc(1)}")
    ka, kb = a[-1], (b[-2] if len(b) >= 2 else b[0])
    if ka != kb:
        rows = "rows" if len(b) >= 2 else "elements"
        raise v.error(f"inner dimensions differ: {v.desc(0)} has {ka} columns, "
                      f"{v.desc(1)} has {kb} {rows}")
    ba, bb = a[:-2], b[:-2]
    rank = max(len(ba), len(bb))
    batch = []
    for d in range(rank):
        da = ba[d - rank + len(ba)] if d - rank + len(ba) >= 0 else 1
        db = bb[d - rank + len(bb)] if d - rank + len(bb) >= 0 else 1
        if da != db and 1 not in (da, db):
            raise v.error(f"batch dimensions of {v.desc(0)} and {v.desc(1)} do not "
                          f"broadcast ({da} vs {db})")
        batch.append(db if da == 1 else da)
    out = tuple(batch) + ((a[-2],) if len(a) >= 2 else ()) + ((b[-1],) if len(b) >= 2 else ())
    return [out]


@_rule("Einsum")
def _einsum(v: NodeView) -> list[Shape | None] | None:
    eq = str(v.attr("equation", "")).replace(" ", "")
    if "..." in eq or not eq:
        return None
    lhs_, _, rhs = eq.partition("->")
    terms = lhs_.split(",")
    ins = [i for i in range(len(v.node.inputs)) if v.has(i)]
    if len(terms) != len(ins):
        raise v.error(f"the equation {eq!r} has {len(terms)} operands, the node "
                      f"{len(ins)} inputs")
    extent: dict[str, int] = {}
    for term, i in zip(terms, ins):
        s = v.shape(i)
        if len(term) != len(s):  # type: ignore[arg-type]
            raise v.error(f"the term {term!r} of {eq!r} has {len(term)} indices, but "
                          f"{v.desc(i)} has rank {len(s)}")  # type: ignore[arg-type]
        for c, d in zip(term, s):  # type: ignore[arg-type]
            if extent.setdefault(c, d) != d:
                raise v.error(f"the index {c!r} of {eq!r} has the extent {extent[c]} in one "
                              f"operand and {d} in {v.desc(i)}")
    if "->" not in eq:
        rhs = "".join(sorted(c for c in extent if lhs_.count(c) == 1))
    if any(c not in extent for c in rhs):
        raise v.error(f"the output {rhs!r} of {eq!r} uses an index no operand has")
    return [tuple(extent[c] for c in rhs)]


@_rule("Gemm")
def _gemm(v: NodeView) -> list[Shape | None] | None:
    a, b = v.shape(0), v.shape(1)
    if len(a) != 2 or len(b) != 2:  # type: ignore[arg-type]
        raise v.error(f"Gemm needs 2-D inputs, got {v.desc(0)} and {v.desc(1)}")
    ta, tb = int(v.attr("transA", 0)), int(v.attr("transB", 0))
    m, k = (a[1], a[0]) if ta else (a[0], a[1])  # type: ignore[index]
    k2, n = (b[1], b[0]) if tb else (b[0], b[1])  # type: ignore[index]
    if k != k2:
        ka = f"{v.desc(0)}{' (transA=1)' if ta else ''}"
        kb = f"{v.desc(1)}{' (transB=1)' if tb else ''}"
        raise v.error(f"inner dimensions differ: {ka} gives K={k}, {kb} gives K={k2}")
    if v.has(2) and v.opset >= 7:
        _unidirectional(v, 2, (m, n), "the output")
    return [(m, n)]


# -- views ------------------------------------------------------------------------------

@_rule("Reshape")
def _reshape(v: NodeView) -> list[Shape | None] | None:
    x = v.shape(0)
    target = v.ints(1) if v.opset >= 5 else v.attr("shape")
    if target is None:
        return None
    target = [int(d) for d in target]
    allowzero = int(v.attr("allowzero", 0)) if v.opset >= 14 else 0
    total = element_count(x)  # type: ignore[arg-type]
    out: list[int | None] = []
    infer = None
    for i, d in enumerate(target):
        if d == -1:
            if infer is not None:
                raise v.error(f"the shape {target} has more than one -1")
            infer = i
            out.append(None)
        elif d < -1:
            raise v.error(f"the shape {target} has the invalid dimension {d}")
        elif d == 0 and not allowzero:
            if i >= len(x):  # type: ignore[arg-type]
                raise v.error(f"the shape {target} copies dimension {i} (a 0) of "
                              f"{v.desc(0)}, which has rank {len(x)}")  # type: ignore[arg-type]
            out.append(x[i])  # type: ignore[index]
        else:
            out.append(d)
    if allowzero and infer is not None and 0 in target:
        raise v.error(f"the shape {target} has both 0 and -1 with allowzero=1")
    known = element_count([d for d in out if d is not None])
    shown = fmt(target)
    if infer is not None:
        if known == 0:
            return None if total == 0 else _bad_reshape(v, x, shown, known)
        if total % known:
            raise v.error(f"cannot reshape {v.name(0)!r} of shape {fmt(x)} ({total} "
                          f"elements) to {shown}: {total} is not a multiple of {known}")
        out[infer] = total // known
    elif known != total:
        resolved = fmt(out)  # type: ignore[arg-type]
        raise v.error(f"cannot reshape {v.name(0)!r} of shape {fmt(x)} ({total} elements) "
                      f"to {shown}{'' if resolved == shown else ' = ' + resolved} "
                      f"({known} elements)")
    return [tuple(out)]  # type: ignore[arg-type]


def _bad_reshape(v: NodeView, x: Any, shown: str, known: int) -> list[Shape | None]:
    raise v.error(f"cannot reshape {v.name(0)!r} of shape {fmt(x)} ({element_count(x)} elements) "
                  f"to {shown}: the other dimensions hold 0 elements")


@_rule("Flatten")
def _flatten(v: NodeView) -> list[Shape | None] | None:
    x = v.shape(0)
    a = v.axis(int(v.attr("axis", 1)), len(x), f"the input {v.name(0)!r} {fmt(x)}",  # type: ignore[arg-type]
               allow_end=True)
    return [(element_count(x[:a]), element_count(x[a:]))]  # type: ignore[index]


@_rule("Squeeze")
def _squeeze(v: NodeView) -> list[Shape | None] | None:
    x = v.shape(0)
    if v.opset >= 13:
        if v.has(1) and v.const(1) is None:
            return None
        axes = v.ints(1)
    else:
        axes = v.attr("axes")
    if axes is None or len(axes) == 0:
        return [tuple(d for d in x if d != 1)]  # type: ignore[union-attr]
    what = f"the input {v.name(0)!r} {fmt(x)}"
    norm = {v.axis(int(a), len(x), what, key="axes") for a in axes}  # type: ignore[arg-type]
    for a in sorted(norm):
        if x[a] != 1:  # type: ignore[index]
            raise v.error(f"cannot squeeze axis {a} of {v.desc(0)}: its length is {x[a]}, "  # type: ignore[index]
                          f"not 1")
    return [tuple(d for i, d in enumerate(x) if i not in norm)]  # type: ignore[arg-type]


@_rule("Unsqueeze")
def _unsqueeze(v: NodeView) -> list[Shape | None] | None:
    x = v.shape(0)
    axes = v.ints(1) if v.opset >= 13 else v.attr("axes")
    if axes is None:
        return None
    rank = len(x) + len(axes)  # type: ignore[arg-type]
    norm = [v.axis(int(a), rank, f"the output (rank {rank})", key="axes") for a in axes]
    if len(set(norm)) != len(norm):
        raise v.error(f"axes={list(axes)} repeat an axis")
    out, it = [], iter(x)  # type: ignore[call-overload]
    for d in range(rank):
        out.append(1 if d in norm else next(it))
    return [tuple(out)]


# -- data movement ----------------------------------------------------------------------

@_rule("Transpose")
def _transpose(v: NodeView) -> list[Shape | None] | None:
    x = v.shape(0)
    r = len(x)  # type: ignore[arg-type]
    perm = [int(p) for p in v.attr("perm", list(range(r - 1, -1, -1)))]
    if len(perm) != r or any(not -r <= p < r for p in perm) or \
            sorted(p % r for p in perm) != list(range(r)):
        raise v.error(f"perm={perm} is not a permutation of the {r} axes of {v.desc(0)}")
    return [tuple(x[p] for p in perm)]  # type: ignore[index]


@_rule("Concat")
def _concat(v: NodeView) -> list[Shape | None] | None:
    ins = [i for i in range(len(v.node.inputs)) if v.has(i)]
    if not ins:
        return None
    first = v.shape(ins[0])
    r = len(first)  # type: ignore[arg-type]
    if r == 0:
        raise v.error(f"cannot concatenate rank-0 tensors ({v.desc(ins[0])})")
    a = v.axis(int(v.attr("axis", 1 if v.opset < 4 else 0)), r,
               f"the input {v.desc(ins[0])}")
    total = 0
    for i in ins:
        s = v.shape(i)
        if len(s) != r:  # type: ignore[arg-type]
            raise v.error(f"inputs of different ranks: {v.desc(ins[0])} and {v.desc(i)}")
        for d in range(r):
            if d != a and s[d] != first[d]:  # type: ignore[index]
                raise v.error(f"{v.desc(ins[0])} and {v.desc(i)} differ on axis {d}, which "
                              f"is not the concatenation axis {a}")
        total += s[a]  # type: ignore[index]
    out = list(first)  # type: ignore[arg-type]
    out[a] = total
    return [tuple(out)]


@_rule("Split")
def _split(v: NodeView) -> list[Shape | None] | None:
    x = v.shape(0)
    r = len(x)  # type: ignore[arg-type]
    a = v.axis(int(v.attr("axis", 0)), r, f"the input {v.desc(0)}")
    n = len(v.node.outputs)
    length = x[a]  # type: ignore[index]
    if v.has(1):  # an input since opset 13 (and in Split-1)
        if v.const(1) is None:
            return None
        sizes = v.ints(1)
    else:
        sizes = v.attr("split")
    num = v.attr("num_outputs") if v.opset >= 18 else None
    if num is not None and int(num) != n:
        raise v.error(f"num_outputs={num} but the node has {n} outputs")
    if sizes:
        sizes = [int(s) for s in sizes]
        if len(sizes) != n:
            raise v.error(f"{len(sizes)} split sizes {sizes} for {n} outputs")
        if any(s < 0 for s in sizes):
            raise v.error(f"negative split sizes {sizes}")
        if sum(sizes) != length:
            raise v.error(f"split sizes {sizes} sum to {sum(sizes)}, but axis {a} of "
                          f"{v.desc(0)} has length {length}")
    elif num is not None or (v.opset >= 18 and length % n):
        chunk = -(-length // n)
        last = length - chunk * (n - 1)
        if last < 0:
            raise v.error(f"cannot split axis {a} of {v.desc(0)} (length {length}) into "
                          f"{n} parts")
        sizes = [chunk] * (n - 1) + [last]
    else:
        if length % n:
            raise v.error(f"cannot split axis {a} of {v.desc(0)} (length {length}) into {n} "
                          f"equal parts")
        sizes = [length // n] * n
    outs: list[Shape | None] = []
    for s in sizes:
        o = list(x)  # type: ignore[arg-type]
        o[a] = s
        outs.append(tuple(o))
    return outs


def _slice_len(start: int, end: int, step: int, dim: int) -> tuple[int, int]:
    """The output length of one sliced axis: (per the ONNX spec, per numpy). They differ
    only in a corner of negative steps; onnx's reference and inference follow numpy."""
    py = len(range(*slice(start, end, step).indices(dim)))
    s = start + dim if start < 0 else start
    e = end + dim if end < 0 else end
    if step > 0:
        s, e = min(max(s, 0), dim), min(max(e, 0), dim)
    else:
        s, e = min(max(s, 0), dim - 1), min(max(e, -1), dim - 1)
    spec = max(0, -(-(e - s) // step))
    return spec, py


@_rule("Slice")
def _slice(v: NodeView) -> list[Shape | None] | None:
    x = v.shape(0)
    r = len(x)  # type: ignore[arg-type]
    if v.opset >= 10:
        if any(v.has(i) and v.const(i) is None for i in range(1, 5)):
            return None
        starts, ends, axes, steps = v.ints(1), v.ints(2), v.ints(3), v.ints(4)
    else:
        starts, ends, axes, steps = v.attr("starts"), v.attr("ends"), v.attr("axes"), None
    if starts is None or ends is None:
        return None
    n = len(starts)
    axes = list(range(n)) if axes is None else [int(a) for a in axes]
    steps = [1] * n if steps is None else [int(s) for s in steps]
    if len(ends) != n or len(axes) != n or len(steps) != n:
        raise v.error(f"starts, ends, axes and steps have different lengths "
                      f"({n}, {len(ends)}, {len(axes)}, {len(steps)})")
    what = f"the input {v.desc(0)}"
    norm = [v.axis(a, r, what, key="axes") for a in axes]
    if len(set(norm)) != len(norm):
        raise v.error(f"axes={axes} repeat an axis")
    out: list[int] = list(x)  # type: ignore[arg-type]
    alt = list(x)  # type: ignore[arg-type]
    for s, e, a, st in zip(starts, ends, norm, steps):
        if st == 0:
            raise v.error(f"a step of 0 on axis {a}")
        out[a], alt[a] = _slice_len(int(s), int(e), st, x[a])  # type: ignore[index]
    have = v._shape_of(v.node.outputs[0]) if v.node.outputs[0] else None
    if have is not None and tuple(have) == tuple(alt):
        return [tuple(alt)]
    return [tuple(out)]


def _check_indices(v: NodeView, i: int, dim: int, what: str) -> None:
    """Constant indices of input ``i`` within ``[-dim, dim)``."""
    c = v.const(i)
    if c is None or c.size == 0 or c.dtype.kind not in "iu":
        return
    bad = np.argwhere((c < -dim) | (c >= dim))
    if len(bad):
        at = [int(k) for k in bad[0]]
        raise v.error(f"index {int(c[tuple(at)])} at {at} of {v.desc(i)} is out of range "
                      f"for {what} (length {dim}; valid: {-dim} to {dim - 1})")


@_rule("Gather")
def _gather(v: NodeView) -> list[Shape | None] | None:
    x, ind = v.shape(0), v.shape(1)
    r = len(x)  # type: ignore[arg-type]
    if r == 0:
        raise v.error(f"cannot gather from the rank-0 {v.desc(0)}")
    a = v.axis(int(v.attr("axis", 0)), r, f"the data {v.desc(0)}")
    _check_indices(v, 1, x[a], f"axis {a} of {v.desc(0)}")  # type: ignore[index]
    return [tuple(x[:a]) + tuple(ind) + tuple(x[a + 1:])]  # type: ignore[index, arg-type]


@_rule("GatherElements")
def _gather_elements(v: NodeView) -> list[Shape | None] | None:
    x, ind = v.shape(0), v.shape(1)
    r = len(x)  # type: ignore[arg-type]
    if r == 0:
        raise v.error(f"cannot gather from the rank-0 {v.desc(0)}")
    a = v.axis(int(v.attr("axis", 0)), r, f"the data {v.desc(0)}")
    if len(ind) != r:  # type: ignore[arg-type]
        raise v.error(f"the indices {v.desc(1)} must have the rank of the data {v.desc(0)}")
    _check_indices(v, 1, x[a], f"axis {a} of {v.desc(0)}")  # type: ignore[index]
    return [tuple(ind)]  # type: ignore[arg-type]


@_rule("GatherND")
def _gather_nd(v: NodeView) -> list[Shape | None] | None:
    x, ind = v.shape(0), v.shape(1)
    b = int(v.attr("batch_dims", 0))
    r, q = len(x), len(ind)  # type: ignore[arg-type]
    if r < 1 or q < 1 or b < 0 or b >= min(r, q):
        raise v.error(f"batch_dims={b} does not fit the data {v.desc(0)} and the indices "
                      f"{v.desc(1)}")
    last = ind[-1]  # type: ignore[index]
    if not 1 <= last <= r - b:
        raise v.error(f"the indices {v.desc(1)} address {last} axes, but the data "
                      f"{v.desc(0)} has {r - b} after batch_dims={b}")
    if tuple(ind[:b]) != tuple(x[:b]):  # type: ignore[index]
        raise v.error(f"the batch dimensions of {v.desc(0)} and {v.desc(1)} differ")
    c = v.const(1)
    if c is not None and c.size:
        for k in range(last):
            dim = x[b + k]  # type: ignore[index]
            col = c[..., k]
            if ((col < -dim) | (col >= dim)).any():
                bad = int(col[(col < -dim) | (col >= dim)][0])
                raise v.error(f"index {bad} of {v.desc(1)} is out of range for axis {b + k} "
                              f"of {v.desc(0)} (length {dim}; valid: {-dim} to {dim - 1})")
    return [tuple(ind[:-1]) + tuple(x[b + last:])]  # type: ignore[index, arg-type]


@_rule("Expand")
def _expand(v: NodeView) -> list[Shape | None] | None:
    shape = v.ints(1)
    if shape is None:
        return None
    if any(d < 0 for d in shape):
        raise v.error(f"the shape {shape} has a negative dimension")
    x = v.shape(0)
    rank = max(len(x), len(shape))  # type: ignore[arg-type]
    out = []
    for d in range(rank):
        a = x[d - rank + len(x)] if d - rank + len(x) >= 0 else 1  # type: ignore[index, arg-type]
        b = shape[d - rank + len(shape)] if d - rank + len(shape) >= 0 else 1
        if a != b and 1 not in (a, b):
            raise v.error(f"cannot expand {v.desc(0)} to the shape {shape} ({a} vs {b} on "
                          f"axis {d})")
        out.append(b if a == 1 else a)
    return [tuple(out)]


@_rule("Tile")
def _tile(v: NodeView) -> list[Shape | None] | None:
    reps = v.ints(1)
    if reps is None or v.opset < 6:  # Tile-1: tiles and axis inputs
        return None
    x = v.shape(0)
    if len(reps) != len(x) or any(r < 0 for r in reps):  # type: ignore[arg-type]
        raise v.error(f"repeats {reps} must be {len(x)} non-negative values (one per axis "  # type: ignore[arg-type]
                      f"of {v.desc(0)})")
    return [tuple(d * r for d, r in zip(x, reps))]  # type: ignore[arg-type]


@_rule("Pad")
def _pad(v: NodeView) -> list[Shape | None] | None:
    x = v.shape(0)
    r = len(x)  # type: ignore[arg-type]
    if v.opset >= 11:
        if (v.has(1) and v.const(1) is None) or (v.has(3) and v.const(3) is None):
            return None
        pads, axes = v.ints(1), v.ints(3)
    else:
        pads, axes = v.attr("pads", v.attr("paddings")), None
    if pads is None:
        return None
    pads = [int(p) for p in pads]
    what = f"the input {v.desc(0)}"
    axes = list(range(r)) if axes is None else [v.axis(a, r, what, key="axes") for a in axes]
    if len(pads) != 2 * len(axes):
        raise v.error(f"pads={pads} should have {2 * len(axes)} values (begin and end of "
                      f"{len(axes)} axes of {v.desc(0)})")
    out = list(x)  # type: ignore[arg-type]
    for k, a in enumerate(axes):
        out[a] = x[a] + pads[k] + pads[k + len(axes)]  # type: ignore[index]
        if out[a] < 0:
            raise v.error(f"pads={pads} remove more than the {x[a]} elements of axis {a} of "  # type: ignore[index]
                          f"{v.desc(0)}")
    return [tuple(out)]


@_rule("Range")
def _range(v: NodeView) -> list[Shape | None] | None:
    start, limit, delta = v.const(0), v.const(1), v.const(2)
    if start is None or limit is None or delta is None:
        return None
    if float(delta) == 0:
        raise v.error("delta is 0")
    n = int(max(np.ceil((float(limit) - float(start)) / float(delta)), 0))
    return [(n,)]


@_rule("ConstantOfShape")
def _constant_of_shape(v: NodeView) -> list[Shape | None] | None:
    shape = v.ints(0)
    if shape is None:
        return None
    if any(d < 0 for d in shape):
        raise v.error(f"the shape {shape} has a negative dimension")
    return [tuple(shape)]


# -- reductions -------------------------------------------------------------------------

_REDUCE = ["ReduceSum", "ReduceMean", "ReduceMax", "ReduceMin", "ReduceProd", "ReduceL1",
           "ReduceL2", "ReduceSumSquare", "ReduceLogSum", "ReduceLogSumExp"]


@_rule(*_REDUCE)
def _reduce(v: NodeView) -> list[Shape | None] | None:
    x = v.shape(0)
    r = len(x)  # type: ignore[arg-type]
    from_input = v.opset >= (13 if v.node.op_type == "ReduceSum" else 18)
    if from_input:
        if v.has(1) and v.const(1) is None:
            return None
        axes = v.ints(1)
    else:
        axes = v.attr("axes")
    keep = int(v.attr("keepdims", 1))
    what = f"the input {v.desc(0)}"
    if not axes:
        if from_input and int(v.attr("noop_with_empty_axes", 0)):
            return [x]
        norm = set(range(r))
    else:
        norm = {v.axis(int(a), r, what, key="axes") for a in axes}
    if keep:
        return [tuple(1 if d in norm else x[d] for d in range(r))]  # type: ignore[index]
    return [tuple(x[d] for d in range(r) if d not in norm)]  # type: ignore[index]


@_rule("ArgMax", "ArgMin")
def _argmax(v: NodeView) -> list[Shape | None] | None:
    x = v.shape(0)
    r = len(x)  # type: ignore[arg-type]
    if r == 0:
        return None
    a = v.axis(int(v.attr("axis", 0)), r, f"the input {v.desc(0)}")
    if int(v.attr("keepdims", 1)):
        return [tuple(1 if d == a else x[d] for d in range(r))]  # type: ignore[index]
    return [tuple(x[d] for d in range(r) if d != a)]  # type: ignore[index]


# -- convolutions and pools ---------------------------------------------------------------

def _ints_attr(v: NodeView, key: str, k: int, default: int) -> list[int]:
    a = v.attr(key)
    if a is None:
        return [default] * k
    a = [int(x) for x in a]
    if len(a) != k:
        raise v.error(f"{key}={a} should have {k} values (one per spatial axis)")
    return a


def _window(v: NodeView, spatial: Sequence[int], kernel: Sequence[int], ceil: bool,
            what: str) -> list[int] | None:
    """The output extents of a sliding window over ``spatial`` (None where the rule
    is not certain); raises where the (dilated) kernel does not fit the padded input."""
    k = len(spatial)
    strides = _ints_attr(v, "strides", k, 1)
    dil = _ints_attr(v, "dilations", k, 1)
    if min(strides + dil, default=1) < 1:
        raise v.error(f"strides {strides} and dilations {dil} must be >= 1")
    auto = v.attr("auto_pad", "NOTSET") or "NOTSET"
    if any(d < 1 for d in kernel):
        raise v.error(f"the kernel {fmt(kernel)} has an extent < 1")
    span = [(kd - 1) * dd + 1 for kd, dd in zip(kernel, dil)]
    if auto in ("SAME_UPPER", "SAME_LOWER"):
        return [-(-d // s) for d, s in zip(spatial, strides)]
    if auto == "VALID":
        pads = [0] * (2 * k)
    elif auto == "NOTSET":
        pads = _ints_attr(v, "pads", 2 * k, 0)
        if any(p < 0 for p in pads):
            raise v.error(f"pads={pads} must be >= 0")
    else:
        return None
    out = []
    for d in range(k):
        padded = spatial[d] + pads[d] + pads[d + k]
        if padded < span[d]:
            dl = f" dilated by {dil[d]} to {span[d]}" if dil[d] != 1 else ""
            pad = f" padded by {pads[d]}+{pads[d + k]} to {padded}" if pads[d] or pads[d + k] \
                else ""
            raise v.error(f"the kernel {fmt(kernel)} is larger than the input: spatial "
                          f"axis {d} of {what} has length {spatial[d]}{pad}, the kernel "
                          f"{kernel[d]}{dl}")
        if ceil:
            if auto == "VALID":
                return None
            o = -(-(padded - span[d]) // strides[d]) + 1
            if (o - 1) * strides[d] >= spatial[d] + pads[d]:
                o -= 1  # the last window would start in the right padding
        else:
            o = (padded - span[d]) // strides[d] + 1
        out.append(o)
    return out


@_rule("Conv")
def _conv(v: NodeView) -> list[Shape | None] | None:
    x, w = v.shape(0), v.shape(1)
    if len(x) < 3 or len(w) != len(x):  # type: ignore[arg-type]
        raise v.error(f"the input {v.desc(0)} and the weight {v.desc(1)} must have the same "
                      f"rank >= 3 (N, C, spatial...)")
    group = int(v.attr("group", 1))
    m, cg = w[0], w[1]  # type: ignore[index]
    if group < 1 or m % group or x[1] != cg * group:  # type: ignore[index]
        raise v.error(f"the input {v.desc(0)} has {x[1]} channels, but the weight "  # type: ignore[index]
                      f"{v.desc(1)} with group={group} expects {cg * group}"
                      + (f" (and {m} output channels must be a multiple of {group})"
                         if group >= 1 and m % group else ""))
    kernel = list(w[2:])  # type: ignore[index]
    ks = v.attr("kernel_shape")
    if ks is not None and [int(a) for a in ks] != kernel:
        raise v.error(f"kernel_shape={list(ks)} differs from the weight {v.desc(1)}")
    if v.has(2) and tuple(v.shape(2)) != (m,):  # type: ignore[arg-type]
        raise v.error(f"the bias {v.desc(2)} should have the shape [{m}]")
    sp = _window(v, x[2:], kernel, False, f"the input {v.desc(0)}")  # type: ignore[index]
    return [None if sp is None else (x[0], m, *sp)]  # type: ignore[index]


@_rule("ConvTranspose")
def _conv_transpose(v: NodeView) -> list[Shape | None] | None:
    x, w = v.shape(0), v.shape(1)
    if len(x) < 3 or len(w) != len(x):  # type: ignore[arg-type]
        raise v.error(f"the input {v.desc(0)} and the weight {v.desc(1)} must have the same "
                      f"rank >= 3 (N, C, spatial...)")
    group = int(v.attr("group", 1))
    if group < 1 or x[1] != w[0] or w[0] % group:  # type: ignore[index]
        raise v.error(f"the input {v.desc(0)} has {x[1]} channels, but the weight "  # type: ignore[index]
                      f"{v.desc(1)} has {w[0]} input channels (group={group})")  # type: ignore[index]
    m = w[1] * group  # type: ignore[index]
    if v.has(2) and tuple(v.shape(2)) != (m,):  # type: ignore[arg-type]
        raise v.error(f"the bias {v.desc(2)} should have the shape [{m}]")
    k = len(x) - 2  # type: ignore[arg-type]
    kernel = list(w[2:])  # type: ignore[index]
    ks = v.attr("kernel_shape")
    if ks is not None and [int(a) for a in ks] != kernel:
        raise v.error(f"kernel_shape={list(ks)} differs from the weight {v.desc(1)}")
    strides = _ints_attr(v, "strides", k, 1)
    dil = _ints_attr(v, "dilations", k, 1)
    outpad = _ints_attr(v, "output_padding", k, 0)
    if min(strides + dil, default=1) < 1:
        raise v.error(f"strides {strides} and dilations {dil} must be >= 1")
    auto = v.attr("auto_pad", "NOTSET") or "NOTSET"
    if v.attr("output_shape") is not None or auto != "NOTSET":
        return [None]
    pads = _ints_attr(v, "pads", 2 * k, 0)
    sp = []
    for d in range(k):
        o = strides[d] * (x[d + 2] - 1) + outpad[d] + (kernel[d] - 1) * dil[d] + 1 \
            - pads[d] - pads[d + k]  # type: ignore[index]
        if o < 1:
            raise v.error(f"pads={pads} remove the whole output along spatial axis {d} "
                          f"(it would have length {o})")
        sp.append(o)
    return [(x[0], m, *sp)]  # type: ignore[index]


@_rule("MaxPool", "AveragePool", "LpPool")
def _pool(v: NodeView) -> list[Shape | None] | None:
    x = v.shape(0)
    if len(x) < 3:  # type: ignore[arg-type]
        raise v.error(f"the input {v.desc(0)} must have rank >= 3 (N, C, spatial...)")
    k = len(x) - 2  # type: ignore[arg-type]
    kernel = v.attr("kernel_shape")
    if kernel is None:
        raise v.error("kernel_shape is required")
    kernel = [int(a) for a in kernel]
    if len(kernel) != k:
        raise v.error(f"kernel_shape={kernel} should have {k} values (the spatial axes of "
                      f"{v.desc(0)})")
    if v.node.op_type == "AveragePool" and v.opset < 19 and v.attr("dilations") is not None:
        return None
    sp = _window(v, x[2:], kernel, bool(int(v.attr("ceil_mode", 0))),  # type: ignore[index]
                 f"the input {v.desc(0)}")
    out = None if sp is None else (x[0], x[1], *sp)  # type: ignore[index]
    return [out, out]


@_rule("GlobalAveragePool", "GlobalMaxPool", "GlobalLpPool")
def _global_pool(v: NodeView) -> list[Shape | None] | None:
    x = v.shape(0)
    if len(x) < 2:  # type: ignore[arg-type]
        raise v.error(f"the input {v.desc(0)} must have rank >= 2 (N, C, spatial...)")
    return [tuple(x[:2]) + (1,) * (len(x) - 2)]  # type: ignore[index, arg-type]


# -- outputs whose extent depends on the data: their bounds (see onnx_dynamic) ------------

def _with_count(v: NodeView, n: int, shapes: list[Shape | None]) -> list[Shape | None]:
    """``shapes`` and, when the importer gave the node its count output, ``()``."""
    return shapes + [()] if len(v.node.outputs) == n + 1 else shapes


@_rule("NonZero")
def _nonzero(v: NodeView) -> list[Shape | None] | None:
    x = v.shape(0)
    return _with_count(v, 1, [(len(x), element_count(x))])  # type: ignore[arg-type]


@_rule("Compress")
def _compress(v: NodeView) -> list[Shape | None] | None:
    x, cond = v.shape(0), v.shape(1)
    if len(cond) != 1:  # type: ignore[arg-type]
        raise v.error(f"the condition {v.desc(1)} must be 1-D")
    axis = v.attr("axis")
    full = element_count(x) if axis is None else x[v.axis(int(axis), len(x),  # type: ignore
                                                          f"the input {v.desc(0)}")]
    if cond[0] > full:  # type: ignore[index]
        raise v.error(f"the condition {v.desc(1)} is longer than the {full} entries it "
                      f"selects from")
    c = v.const(1)
    n = cond[0] if c is None else int(np.count_nonzero(c))  # type: ignore[index]
    if axis is None:
        return _with_count(v, 1, [(n,)])
    a = v.axis(int(axis), len(x), f"the input {v.desc(0)}")  # type: ignore[arg-type]
    return _with_count(v, 1, [tuple(x[:a]) + (n,) + tuple(x[a + 1:])])  # type: ignore[index]


@_rule("Unique")
def _unique(v: NodeView) -> list[Shape | None] | None:
    x = v.shape(0)
    axis = v.attr("axis")
    if axis is None:
        n = element_count(x)  # type: ignore[arg-type]
        return _with_count(v, 4, [(n,), (n,), (n,), (n,)])
    a = v.axis(int(axis), len(x), f"the input {v.desc(0)}")  # type: ignore[arg-type]
    n = x[a]  # type: ignore[index]
    return _with_count(v, 4, [tuple(x), (n,), (n,), (n,)])  # type: ignore[arg-type]


@_rule("NonMaxSuppression")
def _nms(v: NodeView) -> list[Shape | None] | None:
    boxes, scores = v.shape(0), v.shape(1)
    if len(boxes) != 3 or boxes[2] != 4:  # type: ignore[arg-type, index]
        raise v.error(f"the boxes {v.desc(0)} must be [batches, boxes, 4]")
    if len(scores) != 3 or scores[0] != boxes[0] or scores[2] != boxes[1]:  # type: ignore
        raise v.error(f"the scores {v.desc(1)} must be [batches, classes, boxes] for the "
                      f"boxes {v.desc(0)}")
    k = v.ints(2)
    per_class = boxes[1] if k is None else max(0, min(k[0], boxes[1]))  # type: ignore[index]
    return _with_count(v, 1, [(boxes[0] * scores[1] * per_class, 3)])  # type: ignore[index]
