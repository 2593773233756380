"""Lowerings of ONNX math ops to TC statements (see ``onnx_graph`` for the contract).

* elementwise ops with numpy broadcasting (dimensions aligned on the right; a size-1
  or missing dimension is read at index 0), unary activations, Cast;
* MatMul (numpy semantics: 1-D operands, broadcast batch dimensions) and Gemm;
* reductions (ReduceMean/Sum/Max/Min/Prod/L1/L2/SumSquare/LogSum/LogSumExp), ArgMax/ArgMin;
* Softmax / LogSoftmax / Hardmax-free normalizations: BatchNormalization (inference),
  LayerNormalization, InstanceNormalization, LRN.

Every statement carries ``where`` ranges for its left-hand side indices, so shapes of
temporaries are exact whatever the reads are. Constant inputs of one element are
inlined as literals; others are read as tensors (weights of the Program).
"""
from __future__ import annotations

import math
from collections.abc import Callable, Sequence

import numpy as np

from polyc import dtypes as D

from .onnx_graph import LowerContext, Lowered, Node, UnsupportedOpError, literal, register
from .onnx_layout import MATMUL_BLOCKED

FLOATS = D.FLOATS
INTS = D.INTS
_CAST = {d.name: d.tc for d in D.BY_NAME.values()}


# -- helpers ---------------------------------------------------------------------------

def unsupported(node: Node, what: str) -> UnsupportedOpError:
    return UnsupportedOpError(f"node {node.name!r} ({node.op_type}): {what}")


def str_attr(node: Node, key: str, default: str) -> str:
    """A string attribute (onnx gives bytes) as ``str``."""
    v = node.attr(key, default)
    return v.decode() if isinstance(v, bytes) else str(v)


def idx_names(rank: int, prefix: str = "i") -> list[str]:
    return [f"{prefix}{d}" for d in range(rank)]


def ref(ctx: LowerContext, tensor: str, idx: Sequence[str]) -> str:
    """``t_x(i0, i1)``, or ``t_x`` for a rank-0 tensor."""
    name = ctx.name(tensor)
    return f"{name}({', '.join(idx)})" if len(idx) else name


def ranges(shape: Sequence[int], idx: Sequence[str]) -> list[str]:
    return [f"{i} in 0:{n}" for i, n in zip(idx, shape)]


def where(clauses: Sequence[str]) -> str:
    return f" where {', '.join(clauses)}" if clauses else ""


def stmt(ctx: LowerContext, out: str, idx: Sequence[str], op: str, value: str,
         lets: Sequence[str] = (), extra: Sequence[str] = ()) -> str:
    """``out(idx) op value where <lets>, <ranges of idx>, <extra>``."""
    return f"{ref(ctx, out, idx)} {op} {value}" + where(
        list(lets) + ranges(ctx.shape(out), idx) + list(extra))


def temp_stmt(ctx: LowerContext, name: str, idx: Sequence[str], shape: Sequence[int],
              op: str, value: str, lets: Sequence[str] = ()) -> str:
    lhs = f"{name}({', '.join(idx)})" if len(idx) else name
    return f"{lhs} {op} {value}" + where(list(lets) + ranges(shape, idx))


def bcast_idx(ctx: LowerContext, tensor: str, out_idx: Sequence[str],
              offset: int | None = None) -> list[str]:
    """Indices reading ``tensor`` broadcast against an output indexed by ``out_idx``
    (numpy: align right; size-1 dimensions read at 0). ``offset``: legacy ONNX
    broadcasting aligns the tensor at that output axis instead."""
    shape = ctx.shape(tensor)
    off = len(out_idx) - len(shape) if offset is None else offset
    return ["0" if n == 1 else out_idx[off + d] for d, n in enumerate(shape)]


def small_const(ctx: LowerContext, tensor: str):
    """The value of a one-element constant (inlined as a literal), else None."""
    c = ctx.const(tensor)
    if c is not None and c.size == 1:
        return c.reshape(-1)[0].item()
    return None


def lit(value, dtype: str) -> str:
    text = literal(value, dtype)
    return f"({text})" if text.startswith("-") else text


def operand(ctx: LowerContext, tensor: str, out_idx: Sequence[str],
            offset: int | None = None) -> str:
    v = small_const(ctx, tensor)
    if v is not None:
        return lit(v, ctx.dtype(tensor))
    return ref(ctx, tensor, bcast_idx(ctx, tensor, out_idx, offset))


def present(node: Node, i: int) -> bool:
    return len(node.inputs) > i and bool(node.inputs[i])


def cast_to(dtype: str, expr: str) -> str:
    return f"{_CAST[dtype]}({expr})"


def norm_axis(node: Node, axis: int, rank: int) -> int:
    a = axis + rank if axis < 0 else axis
    if not 0 <= a < max(rank, 1):
        raise unsupported(node, f"axis {axis} is out of range for rank {rank}")
    return a


def require_float(node: Node, ctx: LowerContext, tensor: str) -> str:
    dt = ctx.dtype(tensor)
    if dt not in FLOATS:
        raise unsupported(node, f"input {tensor!r} has dtype {dt}; this op is lowered for "
                                f"floating-point types only")
    return dt


# -- elementwise ------------------------------------------------------------------------

def _legacy_offset(node: Node, ctx: LowerContext, k: int) -> int | None:
    """Opset < 7 broadcasting (``broadcast=1``, ``axis``): the second operand aligned at
    ``axis``."""
    if k != 1 or ctx.graph.opset >= 7 or not node.attr("broadcast", 0):
        return None
    axis = node.attr("axis")
    if axis is None:
        return None
    rank = ctx.rank(node.outputs[0])
    return axis + rank if axis < 0 else axis


def elementwise(node: Node, ctx: LowerContext, fn: Callable[..., str],
                inputs: Sequence[str] | None = None, lets: Callable[..., tuple] | None = None
                ) -> Lowered:
    """``Y(i..) = fn(operands...)``: each input read broadcast against the output."""
    out = node.outputs[0]
    idx = idx_names(ctx.rank(out))
    ins = [x for x in (node.inputs if inputs is None else inputs)]
    args = [operand(ctx, x, idx, _legacy_offset(node, ctx, k)) if x else "" for k, x in
            enumerate(ins)]
    value = fn(*args)
    if all(small_const(ctx, x) is not None for x in ins if x):
        value = cast_to(ctx.dtype(out), value)
    return Lowered([stmt(ctx, out, idx, "=", value)])


def _binary(op: str):
    def fn(node: Node, ctx: LowerContext) -> Lowered:
        return elementwise(node, ctx, lambda a, b: f"{a} {op} {b}")
    return fn


register("Add")(_binary("+"))
register("Sub")(_binary("-"))
register("Mul")(_binary("*"))
register("Equal")(_binary("=="))
register("Less")(_binary("<"))
register("LessOrEqual")(_binary("<="))
register("Greater")(_binary(">"))
register("GreaterOrEqual")(_binary(">="))
register("And")(_binary("&&"))


def _bitwise(fn: str):
    def lower(node: Node, ctx: LowerContext) -> Lowered:
        dt = ctx.dtype(node.inputs[0])
        if dt not in INTS:
            raise unsupported(node, f"dtype {dt} of {node.inputs[0]!r} (integers only)")
        if node.op_type == "BitShift":
            d = str_attr(node, "direction", "")
            if d not in ("LEFT", "RIGHT"):
                raise unsupported(node, f"direction {d!r} (LEFT or RIGHT)")
            name = "shl" if d == "LEFT" else "shr"
            return elementwise(node, ctx, lambda a, b: f"{name}({a}, {b})")
        if fn == "bitnot":
            return elementwise(node, ctx, lambda a: f"bitnot({a})")
        return elementwise(node, ctx, lambda a, b: f"{fn}({a}, {b})")
    return lower


for _op, _fn in (("BitwiseAnd", "bitand"), ("BitwiseOr", "bitor"), ("BitwiseXor", "bitxor"),
                 ("BitwiseNot", "bitnot"), ("BitShift", "")):
    register(_op)(_bitwise(_fn))
register("Or")(_binary("||"))
register("Xor")(_binary("!="))


@register("Div")
def div(node: Node, ctx: LowerContext) -> Lowered:
    # integer division truncates towards zero, as C's `/` (and ONNX's reference) does
    return elementwise(node, ctx, lambda a, b: f"{a} / {b}")


@register("Mod")
def mod(node: Node, ctx: LowerContext) -> Lowered:
    dt = ctx.dtype(node.outputs[0])
    if node.attr("fmod", 0):  # C's fmod / %: the sign of the dividend
        if dt in FLOATS:
            return elementwise(node, ctx, lambda a, b: f"fmod({a}, {b})")
        return elementwise(node, ctx, lambda a, b: f"{a} - ({a} / {b}) * {b}")
    return elementwise(node, ctx, lambda a, b: f"{a} % {b}")  # the sign of the divisor


@register("Pow")
def pow_(node: Node, ctx: LowerContext) -> Lowered:
    out_dt = ctx.dtype(node.outputs[0])
    e = small_const(ctx, node.inputs[1])
    if out_dt in FLOATS:
        if e is not None and float(e) == 2.0:
            return elementwise(node, ctx, lambda a, b: f"{a} * {a}")
        if e is not None and float(e) == 1.0:
            return elementwise(node, ctx, lambda a, b: f"{a}")
        if e is not None and float(e) == 0.5:
            return elementwise(node, ctx, lambda a, b: f"sqrt({a})")
        exp_dt = ctx.dtype(node.inputs[1])
        return elementwise(node, ctx, lambda a, b: f"pow({a}, {cast_to(out_dt, b)})"
                           if exp_dt != out_dt else f"pow({a}, {b})")
    return elementwise(node, ctx, lambda a, b: cast_to(
        out_dt, f"pow(double({a}), double({b}))"))


def _variadic(node: Node, ctx: LowerContext, combine: Callable[[list[str]], str]) -> Lowered:
    return elementwise(node, ctx, lambda *args: combine(list(args)))


def _fold2(fn: str, args: list[str]) -> str:
    acc = args[0]
    for a in args[1:]:
        acc = f"{fn}({acc}, {a})"
    return acc


@register("Max")
def max_(node: Node, ctx: LowerContext) -> Lowered:
    return _variadic(node, ctx, lambda a: _fold2("max", a))


@register("Min")
def min_(node: Node, ctx: LowerContext) -> Lowered:
    return _variadic(node, ctx, lambda a: _fold2("min", a))


@register("Sum")
def sum_(node: Node, ctx: LowerContext) -> Lowered:
    return _variadic(node, ctx, lambda a: " + ".join(a))


@register("Mean")
def mean_(node: Node, ctx: LowerContext) -> Lowered:
    dt = ctx.dtype(node.outputs[0])
    n = len([x for x in node.inputs if x])
    return _variadic(node, ctx, lambda a: f"({' + '.join(a)}) / {lit(n, dt)}")


@register("Where")
def where_(node: Node, ctx: LowerContext) -> Lowered:
    return elementwise(node, ctx, lambda c, a, b: f"{c} ? {a} : {b}")


@register("Not")
def not_(node: Node, ctx: LowerContext) -> Lowered:
    return elementwise(node, ctx, lambda a: f"!{a}")


def _unary(template: Callable[[str, Node, str], str], float_only: bool = True):
    def fn(node: Node, ctx: LowerContext) -> Lowered:
        dt = ctx.dtype(node.inputs[0])
        if float_only:
            require_float(node, ctx, node.inputs[0])
        return elementwise(node, ctx, lambda a: template(a, node, dt), inputs=node.inputs[:1])
    return fn


def _f(value: float, dt: str) -> str:
    return lit(value, dt)


UNARY: dict[str, tuple[Callable[[str, Node, str], str], bool]] = {
    "Relu": (lambda a, n, dt: f"relu({a})", False),
    "Neg": (lambda a, n, dt: f"-{a}", False),
    "Abs": (lambda a, n, dt: f"abs({a})", False),
    "Sign": (lambda a, n, dt: f"{a} > {_f(0, dt)} ? {_f(1, dt)} : ({a} < {_f(0, dt)} ? "
                              f"{_f(-1, dt)} : {_f(0, dt)})", False),
    "Sigmoid": (lambda a, n, dt: f"sigmoid({a})", True),
    "Tanh": (lambda a, n, dt: f"tanh({a})", True),
    "Erf": (lambda a, n, dt: f"erf({a})", True),
    "Exp": (lambda a, n, dt: f"exp({a})", True),
    "Log": (lambda a, n, dt: f"log({a})", True),
    "Sqrt": (lambda a, n, dt: f"sqrt({a})", True),
    "Reciprocal": (lambda a, n, dt: f"{_f(1, dt)} / {a}", True),
    "Floor": (lambda a, n, dt: f"floor({a})", True),
    "Ceil": (lambda a, n, dt: f"ceil({a})", True),
    "Round": (lambda a, n, dt: f"round({a})", True),
    "Sin": (lambda a, n, dt: f"sin({a})", True),
    "Cos": (lambda a, n, dt: f"cos({a})", True),
    "Tan": (lambda a, n, dt: f"tan({a})", True),
    "Asin": (lambda a, n, dt: f"asin({a})", True),
    "Acos": (lambda a, n, dt: f"acos({a})", True),
    "Atan": (lambda a, n, dt: f"atan({a})", True),
    "Sinh": (lambda a, n, dt: f"sinh({a})", True),
    "Cosh": (lambda a, n, dt: f"cosh({a})", True),
    "Asinh": (lambda a, n, dt: f"asinh({a})", True),
    "Acosh": (lambda a, n, dt: f"acosh({a})", True),
    "Atanh": (lambda a, n, dt: f"atanh({a})", True),
    "Softsign": (lambda a, n, dt: f"{a} / ({_f(1, dt)} + abs({a}))", True),
    "Softplus": (lambda a, n, dt: f"{a} > {_f(0, dt)} ? {a} + log1p(exp(-{a})) : "
                                  f"log1p(exp({a}))", True),
    "Mish": (lambda a, n, dt: f"{a} * tanh({a} > {_f(0, dt)} ? {a} + log1p(exp(-{a})) : "
                              f"log1p(exp({a})))", True),
    "LeakyRelu": (lambda a, n, dt: f"{a} < {_f(0, dt)} ? {a} * "
                                   f"{_f(n.attr('alpha', 0.01), dt)} : {a}", True),
    "ThresholdedRelu": (lambda a, n, dt: f"{a} > {_f(n.attr('alpha', 1.0), dt)} ? {a} : "
                                         f"{_f(0, dt)}", True),
    "Elu": (lambda a, n, dt: f"{a} < {_f(0, dt)} ? {_f(n.attr('alpha', 1.0), dt)} * "
                             f"expm1({a}) : {a}", True),
    "Selu": (lambda a, n, dt: f"{_f(n.attr('gamma', 1.05070102214813232421875), dt)} * "
                              f"({a} > {_f(0, dt)} ? {a} : "
                              f"{_f(n.attr('alpha', 1.67326319217681884765625), dt)} * "
                              f"expm1({a}))", True),
    "Celu": (lambda a, n, dt: f"max({_f(0, dt)}, {a}) + min({_f(0, dt)}, "
                              f"{_f(n.attr('alpha', 1.0), dt)} * expm1({a} / "
                              f"{_f(n.attr('alpha', 1.0), dt)}))", True),
    "HardSigmoid": (lambda a, n, dt: f"max({_f(0, dt)}, min({_f(1, dt)}, "
                                     f"{_f(n.attr('alpha', 0.2), dt)} * {a} + "
                                     f"{_f(n.attr('beta', 0.5), dt)}))", True),
    "HardSwish": (lambda a, n, dt: f"{a} * max({_f(0, dt)}, min({_f(1, dt)}, "
                                   f"{a} * {_f(1.0 / 6.0, dt)} + {_f(0.5, dt)}))", True),
    "IsNaN": (lambda a, n, dt: f"{a} != {a}", True),
}
for _op, (_tmpl, _float_only) in UNARY.items():
    register(_op)(_unary(_tmpl, _float_only))


@register("IsInf")
def isinf(node: Node, ctx: LowerContext) -> Lowered:
    dt = require_float(node, ctx, node.inputs[0])
    big = _f(float(np.finfo(D.numpy_dtype(dt)).max), dt)
    pos, neg = node.attr("detect_positive", 1), node.attr("detect_negative", 1)
    conds = ([f"{{a}} > {big}"] if pos else []) + ([f"{{a}} < -{big}"] if neg else [])
    if not conds:
        return elementwise(node, ctx, lambda a: f"{a} != {a} && {a} == {a}",
                           inputs=node.inputs[:1])
    return elementwise(node, ctx, lambda a: " || ".join(c.format(a=a) for c in conds),
                       inputs=node.inputs[:1])


@register("Gelu")
def gelu(node: Node, ctx: LowerContext) -> Lowered:
    dt = require_float(node, ctx, node.inputs[0])
    approx = node.attr("approximate", "none")
    if approx == "tanh":
        k = _f(math.sqrt(2.0 / math.pi), dt)
        return elementwise(node, ctx, lambda a: f"{_f(0.5, dt)} * {a} * ({_f(1, dt)} + tanh("
                           f"{k} * ({a} + {_f(0.044715, dt)} * {a} * {a} * {a})))")
    if approx != "none":
        raise unsupported(node, f"attribute approximate={approx!r} (supported: 'none', "
                                f"'tanh')")
    return elementwise(node, ctx, lambda a: f"{_f(0.5, dt)} * {a} * ({_f(1, dt)} + erf("
                       f"{a} * {_f(1.0 / math.sqrt(2.0), dt)}))")


@register("PRelu")
def prelu(node: Node, ctx: LowerContext) -> Lowered:
    dt = ctx.dtype(node.inputs[0])
    return elementwise(node, ctx, lambda a, s: f"{a} < {_f(0, dt)} ? {a} * {s} : {a}")


@register("Clip")
def clip(node: Node, ctx: LowerContext) -> Lowered:
    out = node.outputs[0]
    dt = ctx.dtype(out)
    idx = idx_names(ctx.rank(out))
    x = operand(ctx, node.inputs[0], idx)
    lo = hi = None
    if ctx.graph.opset < 11:
        if node.attr("min") is not None:
            lo = lit(node.attr("min"), dt)
        if node.attr("max") is not None:
            hi = lit(node.attr("max"), dt)
    else:
        for k in (1, 2):
            if present(node, k):
                t = node.inputs[k]
                if ctx.rank(t) != 0 and ctx.shape(t) != (1,):
                    raise unsupported(node, f"input {t!r} (min/max) must be a scalar, got "
                                            f"shape {ctx.shape(t)}")
                v = operand(ctx, t, idx)
                lo, hi = (v, hi) if k == 1 else (lo, v)
    # NaN passes through; min > max gives max (as numpy.clip)
    value, lets = x, []
    if lo is not None:
        c = ctx.temp("c")
        lets.append(f"{c} = {x} < {lo} ? {lo} : {x}")
        value = c
    if hi is not None:
        value = f"{value} > {hi} ? {hi} : {value}"
    return Lowered([stmt(ctx, out, idx, "=", value, lets)])


@register("Cast", "CastLike")
def cast(node: Node, ctx: LowerContext) -> Lowered:
    out = node.outputs[0]
    dt = ctx.dtype(out)
    if node.op_type == "Cast" and node.attr("round_mode", None) not in (None, b"up", "up"):
        raise unsupported(node, "round_mode (float8e8m0)")
    if D.get(dt).minifloat and node.attr("saturate", 1):
        return elementwise(node, ctx, lambda a: cast_to(dt, saturated(a, dt)),
                           inputs=node.inputs[:1])
    return elementwise(node, ctx, lambda a: cast_to(dt, a), inputs=node.inputs[:1])


@register("PolycRoundHalf")
def round_half(node: Node, ctx: LowerContext) -> Lowered:
    """polyc's own op (:func:`..onnx_passes.half_values_in_float`): a float32 tensor
    rounded to the nearest value of the type ``half`` (float16, bfloat16), kept in
    float32: ``Cast(Cast(x, half), float)`` in one node."""
    half = node.attr("half")
    if half not in ("float16", "bfloat16"):
        raise unsupported(node, f"half={half!r} (float16 or bfloat16)")
    return elementwise(node, ctx, lambda a: cast_to("float32", cast_to(half, a)),
                       inputs=node.inputs[:1])


def saturated(x: str, dt: str) -> str:
    """``x`` clamped to the finite range of the float8 type ``dt`` (NaN stays NaN), as
    ONNX's saturating conversions are: the cast itself overflows to infinity or NaN."""
    top = D.finite_max(dt)
    m = lit(top, "float32")
    return f"({x} > {m} ? {m} : ({x} < -{m} ? -{m} : {x}))"


@register("BatchNormalization")
def batchnorm(node: Node, ctx: LowerContext) -> Lowered:
    if node.attr("training_mode", 0):
        raise unsupported(node, "training_mode=1 (only inference is supported)")
    if node.attr("spatial", 1) != 1:
        raise unsupported(node, "spatial=0 (per-activation statistics)")
    for o in node.outputs[1:]:
        if o:
            raise unsupported(node, f"output {o!r} (running statistics, training only)")
    x, out = node.inputs[0], node.outputs[0]
    dt = require_float(node, ctx, x)
    rank = ctx.rank(out)
    idx = idx_names(rank)
    c = [idx[1]] if rank > 1 else ["0"]
    scale, bias, mean, var = node.inputs[1:5]
    eps = _f(node.attr("epsilon", 1e-5), dt)

    def p(t: str) -> str:
        v = small_const(ctx, t)
        return lit(v, ctx.dtype(t)) if v is not None else ref(ctx, t, c)
    value = (f"({ref(ctx, x, idx)} - {p(mean)}) / sqrt({p(var)} + {eps}) * {p(scale)} + "
             f"{p(bias)}")
    return Lowered([stmt(ctx, out, idx, "=", value)])


# -- MatMul, Gemm -----------------------------------------------------------------------

@register("MatMul")
def matmul(node: Node, ctx: LowerContext) -> Lowered:
    a, b, out = node.inputs[0], node.inputs[1], node.outputs[0]
    out_idx, a_idx, b_idx = matmul_indices(node, ctx, a, b, out)
    value = f"{ref(ctx, a, a_idx)} * {ref(ctx, b, b_idx)}"
    return Lowered([stmt(ctx, out, out_idx, "+=!", value)])


def matmul_indices(node: Node, ctx: LowerContext, a: str, b: str, out: str
                   ) -> tuple[list[str], list[str], list[str]]:
    """numpy matmul's indices of ``out``, ``a`` and ``b`` (batch dimensions broadcast,
    1-D operands promoted); the reduction index is ``r_k``."""
    ra, rb, ro = ctx.rank(a), ctx.rank(b), ctx.rank(out)
    if ra == 0 or rb == 0:
        raise unsupported(node, "MatMul of a rank-0 operand")
    out_idx = idx_names(ro)
    nb = ro - (1 if ra > 1 else 0) - (1 if rb > 1 else 0)
    batch = out_idx[:nb]
    m = out_idx[nb] if ra > 1 else None
    n = out_idx[-1] if rb > 1 else None
    k = "r_k"

    def batch_idx(t: str, core: list[str]) -> list[str]:
        shape = ctx.shape(t)
        nbt = len(shape) - len(core)
        off = nb - nbt
        return ["0" if shape[d] == 1 else batch[off + d] for d in range(nbt)] + core
    return out_idx, batch_idx(a, [m, k] if m else [k]), batch_idx(b, [k, n] if n else [k])


@register(MATMUL_BLOCKED)
def matmul_blocked(node: Node, ctx: LowerContext) -> Lowered:
    """polyc's own op (:mod:`.onnx_layout`): a MatMul, or a Gemm without transposes,
    whose ``B`` is stored in column blocks ``(NBK, K, NB)``::

        Yt(.., m, nb, ni) +=! A(.., m, k) * Bb(nb, k, ni)           (alpha * for a Gemm)
        Y(.., m, n)        = Yt(.., m, n / NB, n % NB)              (+ beta * C(m, n))

    the register tile's columns one block (its ``K x NB`` weights one contiguous
    stream); ``Yt`` holds ``Y``'s elements in the same order (and the zero-padded
    columns of the last block, when ``NB`` does not divide ``N``). ``B`` may also be a
    batch of such matrices, ``(.., NBK, K, NB)`` with ``A``'s batch dimensions (a
    Winograd convolution's products, one matrix per position of the tile)."""
    a, bb, y = node.inputs[0], node.inputs[1], node.outputs[0]
    ys = ctx.shape(y)
    bs = ctx.shape(bb)
    nbk, k, nb = bs[-3:]
    dt = ctx.dtype(y)
    out = idx_names(len(ys))
    batch, m, n = out[:-2], out[-2], out[-1]
    batched = len(bs) > 3
    if len(ys) < 2 or ctx.rank(a) != len(ys) or ctx.shape(a)[-1] != k or nbk * nb < ys[-1] \
            or (batched and tuple(bs[:-3]) != tuple(ys[:-2])):
        raise unsupported(node, f"blocked weights {list(bs)} do not fit input "
                                f"{list(ctx.shape(a))} and output {list(ys)}")
    b_idx = (batch if batched else []) + ["nb", "r_k", "ni"]
    prod = f"{ref(ctx, a, batch + [m, 'r_k'])} * {ref(ctx, bb, b_idx)}"
    alpha, beta = float(node.attr("alpha", 1.0)), float(node.attr("beta", 1.0))
    if alpha != 1.0:
        prod = f"{lit(alpha, dt)} * {prod}"
    yt = ctx.temp("yt")
    stmts = [temp_stmt(ctx, yt, batch + [m, "nb", "ni"], tuple(ys[:-1]) + (nbk, nb), "+=!",
                       prod, lets=[f"r_k in 0:{k}"])]
    value = f"{yt}({', '.join(batch + [m, f'{n} / {nb}', f'{n} % {nb}'])})"
    if present(node, 2) and beta != 0.0:
        c = operand(ctx, node.inputs[2], out)
        value = f"{value} + {c if beta == 1.0 else f'{lit(beta, dt)} * {c}'}"
    stmts.append(stmt(ctx, y, out, "=", value))
    return Lowered(stmts)


@register("Gemm")
def gemm(node: Node, ctx: LowerContext) -> Lowered:
    a, b = node.inputs[0], node.inputs[1]
    out = node.outputs[0]
    dt = ctx.dtype(out)
    alpha, beta = node.attr("alpha", 1.0), node.attr("beta", 1.0)
    ta, tb = node.attr("transA", 0), node.attr("transB", 0)
    if ctx.graph.opset < 7 and node.attr("broadcast", 0) == 0 and present(node, 2) \
            and ctx.shape(node.inputs[2]) != ctx.shape(out):
        pass  # old Gemm required broadcast=1 for a broadcast C; accept it anyway
    idx = ["i0", "i1"]
    a_idx = ["r_k", "i0"] if ta else ["i0", "r_k"]
    b_idx = ["i1", "r_k"] if tb else ["r_k", "i1"]
    prod = f"{ref(ctx, a, a_idx)} * {ref(ctx, b, b_idx)}"
    if alpha != 1.0:
        prod = f"{lit(alpha, dt)} * {prod}"
    stmts = []
    if present(node, 2) and beta != 0.0:
        c = operand(ctx, node.inputs[2], idx)
        init = c if beta == 1.0 else f"{lit(beta, dt)} * {c}"
        if small_const(ctx, node.inputs[2]) is not None:
            init = cast_to(dt, init)
        stmts.append(stmt(ctx, out, idx, "=", init))
        stmts.append(stmt(ctx, out, idx, "+=", prod))
    else:
        stmts.append(stmt(ctx, out, idx, "+=!", prod))
    return Lowered(stmts)


# -- reductions -------------------------------------------------------------------------

def reduce_axes(node: Node, ctx: LowerContext) -> list[int] | None:
    """The reduced axes (normalized, sorted); None: reduce nothing (noop_with_empty_axes)."""
    x = node.inputs[0]
    rank = ctx.rank(x)
    axes_from_input = ctx.graph.opset >= (13 if node.op_type == "ReduceSum" else 18)
    axes = None
    if axes_from_input and present(node, 1):
        c = ctx.const(node.inputs[1])
        if c is None:
            raise unsupported(node, "the axes input must be a constant")
        axes = [int(v) for v in np.asarray(c).reshape(-1)]
    elif not axes_from_input and node.attr("axes") is not None:
        axes = [int(v) for v in node.attr("axes")]
    if not axes:
        if node.attr("noop_with_empty_axes", 0) and axes_from_input:
            return None
        return list(range(rank))
    return sorted({norm_axis(node, a, rank) for a in axes})


@register("ReduceSum", "ReduceMean", "ReduceMax", "ReduceMin", "ReduceProd", "ReduceL1",
          "ReduceL2", "ReduceSumSquare", "ReduceLogSum", "ReduceLogSumExp")
def reduce(node: Node, ctx: LowerContext) -> Lowered:
    x, out = node.inputs[0], node.outputs[0]
    op = node.op_type
    dt = ctx.dtype(out)
    axes = reduce_axes(node, ctx)
    rank = ctx.rank(x)
    xi = idx_names(rank)
    if axes is None:  # no reduction: the elementwise part only (as onnx's reference)
        xv = ref(ctx, x, xi)
        value = {"ReduceL1": f"abs({xv})", "ReduceSumSquare": f"{xv} * {xv}",
                 "ReduceL2": f"sqrt({xv} * {xv})", "ReduceLogSum": f"log({xv})"}.get(op, xv)
        return Lowered([stmt(ctx, out, xi, "=", value)])
    keep = node.attr("keepdims", 1)
    red = {a: f"r{a}" for a in axes}
    x_idx = [red.get(d, xi[d]) for d in range(rank)]
    out_idx = [f"k{d}" if d in red else xi[d] for d in range(rank)] if keep else \
        [xi[d] for d in range(rank) if d not in red]
    xv = ref(ctx, x, x_idx)
    count = int(np.prod([ctx.shape(x)[a] for a in axes]))
    o = ref(ctx, out, out_idx)
    if op in ("ReduceSum", "ReduceMax", "ReduceMin", "ReduceProd", "ReduceL1",
              "ReduceSumSquare"):
        rop = {"ReduceSum": "+=!", "ReduceMax": "max=!", "ReduceMin": "min=!",
               "ReduceProd": "*=!", "ReduceL1": "+=!", "ReduceSumSquare": "+=!"}[op]
        value = {"ReduceL1": f"abs({xv})", "ReduceSumSquare": f"{xv} * {xv}"}.get(op, xv)
        return Lowered([stmt(ctx, out, out_idx, rop, value)])
    if op == "ReduceLogSumExp":
        if dt not in FLOATS:
            raise unsupported(node, f"dtype {dt} (float only)")
        mx = ctx.temp("max")
        kept = [xi[d] for d in range(rank) if d not in red]
        mshape = [ctx.shape(x)[d] for d in range(rank) if d not in red]
        mref = f"{mx}({', '.join(kept)})" if kept else mx
        s = ctx.temp("sum")
        okept = [o for o in out_idx if not o.startswith("k")] if keep else out_idx
        m_o = f"{mx}({', '.join(okept)})" if kept else mx
        s_o = f"{s}({', '.join(okept)})" if kept else s
        return Lowered([
            temp_stmt(ctx, mx, kept, mshape, "max=!", xv),
            temp_stmt(ctx, s, kept, mshape, "+=!", f"exp({xv} - {mref})"),
            stmt(ctx, out, out_idx, "=", f"log({s_o}) + {m_o}")])
    # ReduceMean, ReduceL2, ReduceLogSum: a sum, then a function of it
    value = f"{xv} * {xv}" if op == "ReduceL2" else xv
    post = {"ReduceMean": f"{o} / {lit(count, dt)}", "ReduceL2": f"sqrt({o})",
            "ReduceLogSum": f"log({o})"}[op]
    if op == "ReduceL2" and dt in INTS:
        post = cast_to(dt, f"sqrt(double({o}))")
    return Lowered([stmt(ctx, out, out_idx, "+=!", value),
                    stmt(ctx, out, out_idx, "=", post)])


@register("ArgMax", "ArgMin")
def argmax(node: Node, ctx: LowerContext) -> Lowered:
    x, out = node.inputs[0], node.outputs[0]
    rank = ctx.rank(x)
    axis = norm_axis(node, node.attr("axis", 0), rank)
    keep = node.attr("keepdims", 1)
    last = node.attr("select_last_index", 0)
    xi = idx_names(rank)
    kept = [xi[d] for d in range(rank) if d != axis]
    x_idx = [("r" if d == axis else xi[d]) for d in range(rank)]
    out_idx = [("k" if d == axis else xi[d]) for d in range(rank)] if keep else kept
    m = ctx.temp("best")
    mref = f"{m}({', '.join(kept)})" if kept else m
    mshape = [ctx.shape(x)[d] for d in range(rank) if d != axis]
    xv = ref(ctx, x, x_idx)
    n = ctx.shape(x)[axis]
    pick = "max=!" if node.op_type == "ArgMax" else "min=!"
    if last:
        value = f"{xv} == {mref} ? r : -1"
        iop = "max=!"
    else:
        value = f"{xv} == {mref} ? r : {n}"
        iop = "min=!"
    return Lowered([temp_stmt(ctx, m, kept, mshape, pick, xv),
                    stmt(ctx, out, out_idx, iop, value)])


# -- softmax and normalizations ----------------------------------------------------------

def _split(shape: Sequence[int], axes: Sequence[int], prefix: str = "i"
           ) -> tuple[list[str], list[str], list[str], list[int]]:
    """(full indices, indices with reduced axes as r*, kept indices, kept shape)."""
    full = idx_names(len(shape), prefix)
    red = [f"r{d}" if d in axes else full[d] for d in range(len(shape))]
    kept = [full[d] for d in range(len(shape)) if d not in axes]
    kshape = [shape[d] for d in range(len(shape)) if d not in axes]
    return full, red, kept, kshape


def _tref(name: str, idx: Sequence[str]) -> str:
    return f"{name}({', '.join(idx)})" if len(idx) else name


#: a Softmax computes each exponential once, into a temporary that its sum and its
#: division read (a vector loop over the contiguous axis), rather than once in the sum
#: and again in the division: the sum must add its terms in order, which keeps its loop
#: scalar, and gcc 12 calls libmvec's vector ``expf`` only in vector loops
SOFTMAX_EXP_ONCE = True


@register("Softmax", "LogSoftmax")
def softmax(node: Node, ctx: LowerContext) -> Lowered:
    x, out = node.inputs[0], node.outputs[0]
    dt = require_float(node, ctx, x)
    shape = ctx.shape(x)
    rank = len(shape)
    if rank == 0:
        raise unsupported(node, "rank-0 input")
    if ctx.graph.opset >= 13:
        axes = [norm_axis(node, node.attr("axis", -1), rank)]
    else:  # coerced to 2-D at axis: normalize over every trailing dimension
        a = norm_axis(node, node.attr("axis", 1), rank)
        axes = list(range(a, rank))
    full, red, kept, kshape = _split(shape, axes)
    mx, s = ctx.temp("max"), ctx.temp("sum")
    xr, xf = ref(ctx, x, red), ref(ctx, x, full)
    stmts = [temp_stmt(ctx, mx, kept, kshape, "max=!", xr)]
    if node.op_type == "Softmax" and SOFTMAX_EXP_ONCE:
        e = ctx.temp("exp")
        stmts += [temp_stmt(ctx, e, full, shape, "=", f"exp({xf} - {_tref(mx, kept)})"),
                  temp_stmt(ctx, s, kept, kshape, "+=!", _tref(e, red)),
                  stmt(ctx, out, full, "=", f"{_tref(e, full)} / {_tref(s, kept)}")]
        return Lowered(stmts)
    stmts.append(temp_stmt(ctx, s, kept, kshape, "+=!", f"exp({xr} - {_tref(mx, kept)})"))
    if node.op_type == "Softmax":
        value = f"exp({xf} - {_tref(mx, kept)}) / {_tref(s, kept)}"
    else:
        value = f"{xf} - {_tref(mx, kept)} - log({_tref(s, kept)})"
    stmts.append(stmt(ctx, out, full, "=", value))
    del dt
    return Lowered(stmts)


@register("Hardmax")
def hardmax(node: Node, ctx: LowerContext) -> Lowered:
    x, out = node.inputs[0], node.outputs[0]
    shape = ctx.shape(x)
    rank = len(shape)
    dt = ctx.dtype(out)
    if ctx.graph.opset < 13:
        raise unsupported(node, "Hardmax before opset 13 (coerced to 2-D)")
    axis = norm_axis(node, node.attr("axis", -1), rank)
    full, red, kept, kshape = _split(shape, [axis])
    mx, first = ctx.temp("max"), ctx.temp("first")
    xr = ref(ctx, x, red)
    return Lowered([
        temp_stmt(ctx, mx, kept, kshape, "max=!", xr),
        temp_stmt(ctx, first, kept, kshape, "min=!",
                  f"{xr} == {_tref(mx, kept)} ? r{axis} : {shape[axis]}"),
        stmt(ctx, out, full, "=", f"{full[axis]} == {_tref(first, kept)} ? {lit(1, dt)} : "
                                  f"{lit(0, dt)}")])


def _norm_stats(ctx: LowerContext, x: str, axes: list[int], dt: str
                ) -> tuple[list[str], str, str, list[str], list[str]]:
    """Statements computing mean and 1/sqrt(var + eps) placeholders over ``axes``:
    returns (statements, mean name, var name, kept indices, full indices)."""
    shape = ctx.shape(x)
    full, red, kept, kshape = _split(shape, axes)
    count = int(np.prod([shape[a] for a in axes]))
    s, mu, v = ctx.temp("sum"), ctx.temp("mean"), ctx.temp("var")
    xr = ref(ctx, x, red)
    stmts = [temp_stmt(ctx, s, kept, kshape, "+=!", xr),
             temp_stmt(ctx, mu, kept, kshape, "=", f"{_tref(s, kept)} / {lit(count, dt)}")]
    d = ctx.temp("d")
    stmts.append(temp_stmt(ctx, v, kept, kshape, "+=!", f"{d} * {d}",
                           lets=[f"{d} = {xr} - {_tref(mu, kept)}"]))
    return stmts, mu, v, kept, full


@register("LayerNormalization")
def layernorm(node: Node, ctx: LowerContext) -> Lowered:
    x = node.inputs[0]
    dt = require_float(node, ctx, x)
    shape = ctx.shape(x)
    rank = len(shape)
    axis = norm_axis(node, node.attr("axis", -1), rank)
    axes = list(range(axis, rank))
    eps = lit(node.attr("epsilon", 1e-5), dt)
    count = int(np.prod([shape[a] for a in axes]))
    stmts, mu, var, kept, full = _norm_stats(ctx, x, axes, dt)
    inv = ctx.temp("inv")
    kshape = [shape[d] for d in range(rank) if d not in axes]
    stmts.append(temp_stmt(ctx, inv, kept, kshape, "=",
                           f"{lit(1, dt)} / sqrt({_tref(var, kept)} / {lit(count, dt)} + {eps})"))
    outs = list(node.outputs) + ["", "", ""]
    y = outs[0]
    value = f"({ref(ctx, x, full)} - {_tref(mu, kept)}) * {_tref(inv, kept)}"
    if present(node, 1):
        value = f"{value} * {operand(ctx, node.inputs[1], full)}"
    if present(node, 2):
        value = f"{value} + {operand(ctx, node.inputs[2], full)}"
    if y:
        stmts.append(stmt(ctx, y, full, "=", value))
    stat_idx = [f"k{d}" if d in axes else full[d] for d in range(rank)]
    if outs[1]:
        stmts.append(stmt(ctx, outs[1], stat_idx, "=", _tref(mu, kept)))
    if outs[2]:
        stmts.append(stmt(ctx, outs[2], stat_idx, "=", _tref(inv, kept)))
    for o in outs[1:3]:
        if o and ctx.dtype(o) != dt:
            raise unsupported(node, f"stash_type giving output {o!r} dtype {ctx.dtype(o)}")
    return Lowered(stmts)


def _channel_input(node: Node, ctx: LowerContext) -> tuple[str, str, str, tuple[int, ...], int]:
    """(input, output, float dtype, shape, rank) of an op over an N, C, spatial... tensor."""
    x, out = node.inputs[0], node.outputs[0]
    dt = require_float(node, ctx, x)
    shape = ctx.shape(x)
    rank = len(shape)
    if rank < 3:
        raise unsupported(node, f"input rank {rank} (expected N, C, spatial...)")
    return x, out, dt, shape, rank


@register("InstanceNormalization")
def instancenorm(node: Node, ctx: LowerContext) -> Lowered:
    x, out, dt, shape, rank = _channel_input(node, ctx)
    axes = list(range(2, rank))
    count = int(np.prod([shape[a] for a in axes]))
    eps = lit(node.attr("epsilon", 1e-5), dt)
    stmts, mu, var, kept, full = _norm_stats(ctx, x, axes, dt)
    c = [full[1]]

    def p(t: str) -> str:
        v = small_const(ctx, t)
        return lit(v, ctx.dtype(t)) if v is not None else ref(ctx, t, c)
    value = (f"({ref(ctx, x, full)} - {_tref(mu, kept)}) / sqrt({_tref(var, kept)} / "
             f"{lit(count, dt)} + {eps}) * {p(node.inputs[1])} + {p(node.inputs[2])}")
    stmts.append(stmt(ctx, out, full, "=", value))
    return Lowered(stmts)


@register("GroupNormalization")
def groupnorm(node: Node, ctx: LowerContext) -> Lowered:
    x, out, dt, shape, rank = _channel_input(node, ctx)
    groups = int(node.attr("num_groups", 0))
    c = shape[1]
    if groups < 1 or c % groups:
        raise unsupported(node, f"num_groups {groups} for {c} channels")
    cg = c // groups
    spatial = list(shape[2:])
    count = cg * int(np.prod(spatial))
    eps = lit(node.attr("epsilon", 1e-5), dt)
    full = idx_names(rank)
    sp = full[2:]
    lets = [f"ch in 0:{cg}"] + [f"{i} in 0:{n}" for i, n in zip(sp, spatial)]
    xg = ref(ctx, x, ["n", f"{cg} * q + ch", *sp])
    mu, var = ctx.temp("mean"), ctx.temp("var")
    mean = f"({mu}(n, q) / {lit(count, dt)})"
    stmts = [temp_stmt(ctx, mu, ["n", "q"], (shape[0], groups), "+=!", xg, lets=lets),
             temp_stmt(ctx, var, ["n", "q"], (shape[0], groups), "+=!",
                       f"({xg} - {mean}) * ({xg} - {mean})", lets=lets)]
    g = f"{full[1]} / {cg}"

    def param(t: str) -> str:  # opset 21: per channel; opset 18: per group
        return ref(ctx, t, [full[1]] if ctx.shape(t)[0] == c else [g])
    value = (f"({ref(ctx, x, full)} - {mu}({full[0]}, {g}) / {lit(count, dt)}) / "
             f"sqrt({var}({full[0]}, {g}) / {lit(count, dt)} + {eps}) * "
             f"{param(node.inputs[1])} + {param(node.inputs[2])}")
    stmts.append(stmt(ctx, out, full, "=", value))
    return Lowered(stmts)


@register("LRN")
def lrn(node: Node, ctx: LowerContext) -> Lowered:
    x, out, dt, shape, rank = _channel_input(node, ctx)
    size = node.attr("size")
    if size is None or size < 1:
        raise unsupported(node, "missing or invalid attribute size")
    alpha, beta, bias = node.attr("alpha", 1e-4), node.attr("beta", 0.75), node.attr("bias", 1.0)
    lo = (size - 1) // 2
    full = idx_names(rank)
    c = full[1]
    ch = f"{c} + j - {lo}" if lo else f"{c} + j"
    shifted = [ch if d == 1 else full[d] for d in range(rank)]
    sq = ctx.temp("sq")
    xs = ref(ctx, x, shifted)
    guard = f"{ch} >= 0 && {ch} < {shape[1]}"
    stmts = [temp_stmt(ctx, sq, full, shape, "+=!", f"{guard} ? {xs} * {xs} : {lit(0, dt)}")
             .replace(" where ", f" where j in 0:{size}, ", 1)]
    value = (f"{ref(ctx, x, full)} / pow({lit(bias, dt)} + {lit(alpha / size, dt)} * "
             f"{_tref(sq, full)}, {lit(beta, dt)})")
    stmts.append(stmt(ctx, out, full, "=", value))
    return Lowered(stmts)


# -- more elementwise and normalization ops ----------------------------------------------

@register("Swish")
def swish(node: Node, ctx: LowerContext) -> Lowered:
    dt = require_float(node, ctx, node.inputs[0])
    alpha = node.attr("alpha", 1.0)
    k = "" if alpha == 1.0 else f"{_f(alpha, dt)} * "
    return elementwise(node, ctx, lambda a: f"{a} * sigmoid({k}{a})", inputs=node.inputs[:1])


@register("Shrink")
def shrink(node: Node, ctx: LowerContext) -> Lowered:
    dt = ctx.dtype(node.inputs[0])
    lam, bias = node.attr("lambd", 0.5), node.attr("bias", 0.0)
    if dt in INTS:  # the comparison happens in float, the result is the input's type
        lam_l, bias_l = _f(lam, "float64"), lit(bias, dt)
        return elementwise(node, ctx, lambda a: (
            f"double({a}) < -{lam_l} ? {a} + {bias_l} : (double({a}) > {lam_l} ? "
            f"{a} - {bias_l} : {lit(0, dt)})"), inputs=node.inputs[:1])
    return elementwise(node, ctx, lambda a: (
        f"{a} < -{_f(lam, dt)} ? {a} + {_f(bias, dt)} : ({a} > {_f(lam, dt)} ? "
        f"{a} - {_f(bias, dt)} : {_f(0, dt)})"), inputs=node.inputs[:1])


@register("RMSNormalization")
def rmsnorm(node: Node, ctx: LowerContext) -> Lowered:
    x, out = node.inputs[0], node.outputs[0]
    dt = require_float(node, ctx, x)
    shape = ctx.shape(x)
    rank = len(shape)
    axis = norm_axis(node, node.attr("axis", -1), rank)
    axes = list(range(axis, rank))
    count = int(np.prod([shape[a] for a in axes]))
    full, red, kept, kshape = _split(shape, axes)
    s = ctx.temp("sumsq")
    xr = ref(ctx, x, red)
    eps = lit(node.attr("epsilon", 1e-5), dt)
    value = (f"{ref(ctx, x, full)} / sqrt({_tref(s, kept)} / {lit(count, dt)} + {eps}) * "
             f"{operand(ctx, node.inputs[1], full)}")
    return Lowered([temp_stmt(ctx, s, kept, kshape, "+=!", f"{xr} * {xr}"),
                    stmt(ctx, out, full, "=", value)])


@register("LpNormalization")
def lpnorm(node: Node, ctx: LowerContext) -> Lowered:
    x, out = node.inputs[0], node.outputs[0]
    dt = require_float(node, ctx, x)
    shape = ctx.shape(x)
    axis = norm_axis(node, node.attr("axis", -1), len(shape))
    p = node.attr("p", 2)
    if p not in (1, 2):
        raise unsupported(node, f"p={p} (supported: 1, 2)")
    full, red, kept, kshape = _split(shape, [axis])
    s, n = ctx.temp("norm"), ctx.temp("n")
    xr = ref(ctx, x, red)
    term = f"abs({xr})" if p == 1 else f"{xr} * {xr}"
    norm = _tref(s, kept) if p == 1 else f"sqrt({_tref(s, kept)})"
    value = f"{n} == {_f(0, dt)} ? {_f(0, dt)} : {ref(ctx, x, full)} / {n}"
    return Lowered([temp_stmt(ctx, s, kept, kshape, "+=!", term),
                    stmt(ctx, out, full, "=", value, lets=[f"{n} = {norm}"])])


@register("Trilu")
def trilu(node: Node, ctx: LowerContext) -> Lowered:
    x, out = node.inputs[0], node.outputs[0]
    rank = ctx.rank(x)
    if rank < 2:
        raise unsupported(node, f"input rank {rank} (expected at least 2)")
    k: int | str = 0
    if present(node, 1):
        c = ctx.const(node.inputs[1])
        if c is not None:
            k = int(np.asarray(c).reshape(-1)[0])
        else:  # read at run time (a value, not an index)
            k = ref(ctx, node.inputs[1], ["0"] * ctx.rank(node.inputs[1]))
    idx = idx_names(rank)
    i, j = idx[-2], idx[-1]
    keep = f"{j} - {i} >= {k}" if node.attr("upper", 1) else f"{j} - {i} <= {k}"
    value = f"{keep} ? {ref(ctx, x, idx)} : {lit(0, ctx.dtype(out))}"
    return Lowered([stmt(ctx, out, idx, "=", value)])


@register("EyeLike")
def eyelike(node: Node, ctx: LowerContext) -> Lowered:
    out = node.outputs[0]
    if ctx.rank(out) != 2:
        raise unsupported(node, "output rank must be 2")
    dt = ctx.dtype(out)
    k = int(node.attr("k", 0))
    value = f"i1 - i0 == {k} ? {lit(1, dt)} : {lit(0, dt)}"
    return Lowered([stmt(ctx, out, ["i0", "i1"], "=", cast_to(dt, value))])


@register("CumSum", "CumProd")
def cumulative(node: Node, ctx: LowerContext) -> Lowered:
    x, out = node.inputs[0], node.outputs[0]
    dt = ctx.dtype(out)
    rank = ctx.rank(x)
    c = ctx.const(node.inputs[1]) if present(node, 1) else None
    if c is None and rank != 1:
        raise unsupported(node, "the axis input must be a constant")
    axis = 0 if c is None else norm_axis(node, int(np.asarray(c).reshape(-1)[0]), rank)
    excl, rev = node.attr("exclusive", 0), node.attr("reverse", 0)
    idx = idx_names(rank)
    i = idx[axis]
    src = [("r" if d == axis else idx[d]) for d in range(rank)]
    cmp = {(0, 0): f"r <= {i}", (1, 0): f"r < {i}", (0, 1): f"r >= {i}",
           (1, 1): f"r > {i}"}[(excl, rev)]
    if node.op_type == "CumSum":
        value = f"{cmp} ? {ref(ctx, x, src)} : {lit(0, dt)}"
        op = "+=!"
    else:
        value = f"{cmp} ? {ref(ctx, x, src)} : {lit(1, dt)}"
        op = "*=!"
    return Lowered([stmt(ctx, out, idx, op, value, extra=[f"r in 0:{ctx.shape(x)[axis]}"])])


@register("Einsum")
def einsum(node: Node, ctx: LowerContext) -> Lowered:
    eq = node.attr("equation", "").replace(" ", "")
    ins = [x for x in node.inputs if x]
    out = node.outputs[0]
    lhs, arrow, rhs = eq.partition("->")
    terms = lhs.split(",")
    if len(terms) != len(ins):
        raise unsupported(node, f"equation {eq!r} has {len(terms)} operands, the node "
                                f"{len(ins)}")
    # the dimensions of an ellipsis are named E0, E1, ... (aligned on the right)
    n_ell = max([ctx.rank(x) - (len(t) - 3) for t, x in zip(terms, ins) if "..." in t],
                default=0)
    ell = [f"E{d}" for d in range(n_ell)]
    letters: dict[str, str] = {}

    def name(ch: str) -> str:
        if not ch.isalpha():
            raise unsupported(node, f"equation {eq!r}: unexpected character {ch!r}")
        return letters.setdefault(ch, f"{'u' if ch.isupper() else 'l'}_{ch.lower()}")

    def names_of(t: str, rank: int) -> list[str]:
        if "..." not in t:
            return [name(ch) for ch in t]
        head, _, tail = t.partition("...")
        k = rank - len(head) - len(tail)
        return [name(ch) for ch in head] + ell[n_ell - k:] + [name(ch) for ch in tail]

    reads, used = [], set()
    for t, x in zip(terms, ins):
        shape = ctx.shape(x)
        names = names_of(t, len(shape))
        if len(names) != len(shape):
            raise unsupported(node, f"equation {eq!r}: term {t!r} does not match the rank "
                                    f"{len(shape)} of {x!r}")
        # a broadcast (size-1) dimension of an ellipsis is read at 0
        names = ["0" if n == 1 and nm.startswith("E") else nm for nm, n in zip(names, shape)]
        used |= {nm for nm in names if nm != "0"}
        reads.append(ref(ctx, x, names))
    if arrow:
        out_names = names_of(rhs, n_ell + len(rhs.replace("...", "")))
    else:
        counts: dict[str, int] = {}
        for t in terms:
            for ch in t.replace("...", ""):
                counts[ch] = counts.get(ch, 0) + 1
        out_names = ell + [name(ch) for ch in sorted(counts) if counts[ch] == 1]
    if len(out_names) != ctx.rank(out):
        raise unsupported(node, f"equation {eq!r}: output rank {len(out_names)} but the "
                                f"graph says {ctx.rank(out)}")
    op = "+=!" if used - set(out_names) else "="
    return Lowered([stmt(ctx, out, out_names, op, " * ".join(reads))])


# -- losses --------------------------------------------------------------------------------

def _nll(node: Node, ctx: LowerContext, logp: Callable[[str], str], target: str,
         weight: str | None, out: str, dt: str, classes: int) -> Lowered:
    """The statements of ONNX's NegativeLogLikelihoodLoss over ``logp(c)`` (the log
    probability of class expression ``c`` at the target's position), for
    NegativeLogLikelihoodLoss and SoftmaxCrossEntropyLoss: per element ``-logp(t) *
    w(t)`` (0 where ``t == ignore_index``), then reduced by ``reduction`` (none, sum, or
    mean: divided by the sum of the weights of the elements not ignored). Target values
    are read at run time, clamped, and checked before the kernel (in ``[0, C)`` or
    ``ignore_index``)."""
    from polyc.program import IndexCheck
    check_dtype_int = ctx.dtype(target)
    if check_dtype_int not in D.INTS:
        raise unsupported(node, f"target dtype {check_dtype_int} (expected int32 or int64)")
    reduction = str_attr(node, "reduction", "mean")
    if reduction not in ("none", "sum", "mean"):
        raise unsupported(node, f"reduction={reduction!r} (expected none, sum or mean)")
    ignore = node.attr("ignore_index")
    tshape = ctx.shape(target)
    ti = idx_names(len(tshape), "i")
    t = ref(ctx, target, ti)
    c = f"min(max({t}, 0), {classes - 1})"
    w = ref(ctx, weight, [c]) if weight else lit(1, dt)
    skip = f"{t} == {int(ignore)}" if ignore is not None else None
    per = f"-({logp(c)}) * {w}"
    if skip:
        per = f"({skip} ? {lit(0, dt)} : {per})"
    checks = () if ctx.const(target) is not None else (IndexCheck(
        -1, target, 0, classes - 1, f"node {node.name!r} ({node.op_type}): target ",
        f" of {target!r} is not a class in [0, {classes}) "
        + (f"nor the ignore_index {int(ignore)}" if ignore is not None else ""),
        allowed=None if ignore is None else int(ignore)),)
    if reduction == "none":
        return Lowered([stmt(ctx, out, ti, "=", per)], checks)
    loss = ctx.temp("loss")
    stmts = [temp_stmt(ctx, loss, ti, tshape, "=", per)]
    red = [f"r{d}" for d in range(len(tshape))]
    total = _tref(loss, red)
    ranges_r = [f"{r} in 0:{n}" for r, n in zip(red, tshape)]
    if reduction == "sum":
        stmts.append(f"{ref(ctx, out, [])} +=! {total}" + where(ranges_r))
        return Lowered(stmts, checks)
    wsum, s = ctx.temp("wsum"), ctx.temp("sum")
    if not weight and not skip:  # the mean over every element
        count = int(np.prod(tshape, dtype=np.int64))
        stmts += [f"{s} +=! {total}" + where(ranges_r),
                  f"{ref(ctx, out, [])} = {s} / {lit(count, dt)}"]
        return Lowered(stmts, checks)
    tr = ref(ctx, target, red)
    cr = f"min(max({tr}, 0), {classes - 1})"
    wr = ref(ctx, weight, [cr]) if weight else lit(1, dt)
    if skip:
        wr = f"({tr} == {int(ignore)} ? {lit(0, dt)} : {wr})"
    stmts += [f"{s} +=! {total}" + where(ranges_r), f"{wsum} +=! {wr}" + where(ranges_r),
              f"{ref(ctx, out, [])} = {s} / {wsum}"]
    return Lowered(stmts, checks)


def _loss_operands(node: Node, ctx: LowerContext
                   ) -> tuple[str, str, str | None, str, str, list[int]]:
    """(scores, target, weight or None, output, dtype, the scores' shape N x C x ...)."""
    x, target, out = node.inputs[0], node.inputs[1], node.outputs[0]
    dt = require_float(node, ctx, x)
    shape = list(ctx.shape(x))
    if len(shape) < 2:
        raise unsupported(node, f"input of rank {len(shape)} (expected N x C x ...)")
    return x, target, node.inputs[2] if present(node, 2) else None, out, dt, shape


@register("NegativeLogLikelihoodLoss")
def nll_loss(node: Node, ctx: LowerContext) -> Lowered:
    """``loss = -input[n, target[n, d..], d..] * weight[target]`` (see :func:`_nll`)."""
    x, target, weight, out, dt, shape = _loss_operands(node, ctx)
    ti = idx_names(len(shape) - 1, "i")
    return _nll(node, ctx, lambda c: ref(ctx, x, [ti[0], c, *ti[1:]]), target, weight, out,
                dt, shape[1])


@register("SoftmaxCrossEntropyLoss")
def softmax_cross_entropy(node: Node, ctx: LowerContext) -> Lowered:
    """``log_prob = log_softmax(scores, axis 1)`` (the optional second output), then
    NegativeLogLikelihoodLoss of it (see :func:`_nll`)."""
    x, target, weight, out, dt, shape = _loss_operands(node, ctx)
    full, red, kept, kshape = _split(shape, [1])
    mx, s = ctx.temp("max"), ctx.temp("sum")
    xr, xf = ref(ctx, x, red), ref(ctx, x, full)
    stmts = [temp_stmt(ctx, mx, kept, kshape, "max=!", xr),
             temp_stmt(ctx, s, kept, kshape, "+=!", f"exp({xr} - {_tref(mx, kept)})")]
    value = f"{xf} - {_tref(mx, kept)} - log({_tref(s, kept)})"
    if len(node.outputs) > 1 and node.outputs[1]:
        lp_name = ctx.name(node.outputs[1])
        stmts.append(stmt(ctx, node.outputs[1], full, "=", value))
    else:
        lp_name = ctx.temp("logp")
        stmts.append(temp_stmt(ctx, lp_name, full, shape, "=", value))
    ti = idx_names(len(shape) - 1, "i")
    lowered = _nll(node, ctx, lambda c: _tref(lp_name, [ti[0], c, *ti[1:]]), target, weight,
                   out, dt, shape[1])
    return Lowered(stmts + list(lowered.statements), lowered.checks)
