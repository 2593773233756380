"""Quantization: QuantizeLinear, DequantizeLinear, DynamicQuantizeLinear, MatMulInteger
and QLinearMatMul.

ONNX's arithmetic, exactly:

* quantize: ``saturate(rint(x / scale) + zero_point)`` (ties to even), the scale and
  zero point per tensor, per channel (``axis``) or per block (``block_size``);
* dequantize: ``(float(x) - float(zero_point)) * scale`` in float32;
* the integer products (MatMulInteger, QLinearMatMul) in int32, zero points
  subtracted per tensor, per row of A or per column of B; QLinearMatMul requantises with
  ``a_scale * b_scale / y_scale`` (in the scales' type, as ONNX's reference does) in
  double precision.

The int32 contraction is an ordinary polyc reduction: it is tiled, register-blocked and
vectorised like a float one. A QLinearConv with constant weights becomes, on a CPU with
integer dot-product instructions, polyc's own ops ``PolycIm2Col`` (the input's patches)
and ``PolycConvDot`` (an int32 matmul contiguous along the reduction in both operands,
which the scheduler tiles in its dot-product form and gcc compiles to ``vpdpbusd``),
then ``PolycRequantize``.
"""
from __future__ import annotations

import numpy as np

from polyc import dtypes as D

from .onnx_graph import LowerContext, Lowered, Node, register
from .onnx_ops_math import (cast_to, idx_names, lit, matmul_indices, norm_axis, present, ref,
                            saturated, small_const, stmt, temp_stmt, unsupported)

_QUANT_INTS = ("int2", "uint2", "int4", "uint4", "int8", "uint8", "int16", "uint16", "int32")


def _param(node: Node, ctx: LowerContext, t: str, x_shape: tuple[int, ...],
           idx: list[str], axis: int, block: int) -> str:
    """The scale or zero point ``t`` at the element ``idx`` of the quantized tensor."""
    v = small_const(ctx, t)
    shape = ctx.shape(t)
    if v is not None and len(shape) <= 1:
        return lit(v, ctx.dtype(t))
    if len(shape) == 0 or (len(shape) == 1 and shape[0] == 1):
        return ref(ctx, t, ["0"] * len(shape))
    if block:
        if len(shape) != len(x_shape):
            raise unsupported(node, f"blocked {t!r} of rank {len(shape)} (expected "
                                    f"{len(x_shape)})")
        return ref(ctx, t, [f"{i} / {block}" if d == axis else i for d, i in enumerate(idx)])
    if len(shape) != 1 or shape[0] != x_shape[axis]:
        raise unsupported(node, f"{t!r} of shape {list(shape)}: expected a scalar or "
                                f"{x_shape[axis]} values along axis {axis}")
    return ref(ctx, t, [idx[axis]])


def _axis_block(node: Node, ctx: LowerContext, x: str) -> tuple[int, int]:
    rank = ctx.rank(x)
    per_tensor = ctx.shape(node.inputs[1]) in ((), (1,))
    axis = 0 if per_tensor or not rank else norm_axis(node, node.attr("axis", 1), rank)
    return axis, int(node.attr("block_size", 0) or 0)


def _saturated(value: str, dt: str, within: str = "float64") -> str:
    """``value`` (of type ``within``) clamped to ``dt``'s range and converted."""
    lo, hi = D.get(dt).limits
    return cast_to(dt, f"max({lit(float(lo), within)}, min({lit(float(hi), within)}, "
                       f"{value}))")


@register("QuantizeLinear")
def quantize(node: Node, ctx: LowerContext) -> Lowered:
    x, scale, out = node.inputs[0], node.inputs[1], node.outputs[0]
    dt = ctx.dtype(out)
    if dt not in _QUANT_INTS and not D.get(dt).minifloat:
        raise unsupported(node, f"output dtype {dt} (supported: {', '.join(_QUANT_INTS)} "
                                f"and the float8/float4 types)")
    if node.attr("precision", 0):
        raise unsupported(node, "precision (opset 25)")
    axis, block = _axis_block(node, ctx, x)
    shape = ctx.shape(x)
    idx = idx_names(len(shape))
    s = _param(node, ctx, scale, shape, idx, axis, block)
    if D.get(dt).minifloat:  # as ONNX: x / scale, converted saturating (float4: + zero)
        v = f"{ref(ctx, x, idx)} / {s}"
        if dt == "float4e2m1" and present(node, 2):
            v = f"{v} + float({_param(node, ctx, node.inputs[2], shape, idx, axis, block)})"
        if node.attr("saturate", 1):
            v = saturated(v, dt)
        return Lowered([stmt(ctx, out, idx, "=", cast_to(dt, v))])
    q = f"round({ref(ctx, x, idx)} / {s})"
    # float32 input, 8- or 16-bit result: the zero point added and the clamp done in
    # float32 are exact where the result is in range (|q| < 2**24), and beyond it the
    # clamp gives the same bound; double arithmetic kept gcc from vectorizing the loop
    wide = "float32" if ctx.dtype(x) == "float32" and D.get(dt).itemsize <= 2 else "float64"
    cast = "float" if wide == "float32" else "double"
    if present(node, 2):
        q = f"{cast}({q}) + {cast}({_param(node, ctx, node.inputs[2], shape, idx, axis, block)})"
    else:
        q = f"{cast}({q})"
    return Lowered([stmt(ctx, out, idx, "=", _saturated(q, dt, wide))])


@register("DequantizeLinear")
def dequantize(node: Node, ctx: LowerContext) -> Lowered:
    x, scale, out = node.inputs[0], node.inputs[1], node.outputs[0]
    xdt = ctx.dtype(x)
    if xdt not in D.INTS and not D.get(xdt).minifloat:
        raise unsupported(node, f"input dtype {xdt} (integers, float8 and float4 only)")
    axis, block = _axis_block(node, ctx, x)
    shape = ctx.shape(x)
    idx = idx_names(len(shape))
    s = _param(node, ctx, scale, shape, idx, axis, block)
    v = f"float({ref(ctx, x, idx)})"
    if present(node, 2):
        v = f"({v} - float({_param(node, ctx, node.inputs[2], shape, idx, axis, block)}))"
    return Lowered([stmt(ctx, out, idx, "=", cast_to(ctx.dtype(out), f"{v} * float({s})"))])


@register("DynamicQuantizeLinear")
def dynamic_quantize(node: Node, ctx: LowerContext) -> Lowered:
    x = node.inputs[0]
    y, y_scale, y_zp = (list(node.outputs) + ["", "", ""])[:3]
    shape = ctx.shape(x)
    rank = len(shape)
    red = [f"r{d}" for d in range(rank)]
    mx, mn = ctx.temp("max"), ctx.temp("min")
    stmts = [temp_stmt(ctx, mx, [], [], "max=!", f"float({ref(ctx, x, red)})"),
             temp_stmt(ctx, mn, [], [], "min=!", f"float({ref(ctx, x, red)})")]
    hi, lo = f"max(0.0, {mx})", f"min(0.0, {mn})"
    scale = f"({hi} == {lo} ? 1.0 : {hi} - {lo}) / 255.0"
    sc, zp = ctx.temp("scale"), ctx.temp("zero_point")
    stmts += [temp_stmt(ctx, sc, [], [], "=", scale),
              temp_stmt(ctx, zp, [], [], "=",
                        f"round(max(0.0, min(255.0, 0.0 - {lo} / {sc})))")]
    idx = idx_names(rank)
    if y:
        stmts.append(stmt(ctx, y, idx, "=", _saturated(
            f"double(round({ref(ctx, x, idx)} / {sc})) + double({zp})", "uint8")))
    if y_scale:
        stmts.append(stmt(ctx, y_scale, [], "=", cast_to(ctx.dtype(y_scale), sc)))
    if y_zp:
        stmts.append(stmt(ctx, y_zp, [], "=", cast_to("uint8", zp)))
    return Lowered(stmts)


def _zero_point(node: Node, ctx: LowerContext, i: int, row: str | None, what: str) -> str:
    """Input ``i`` (a zero point: per tensor, or one per row of A / column of B / output
    channel, read at ``row``) as an int32 expression; "0" when absent."""
    if not present(node, i):
        return "0"
    t = node.inputs[i]
    v = small_const(ctx, t)
    shape = ctx.shape(t)
    if v is not None:
        return lit(int(v), "int32")
    if len(shape) == 0 or (len(shape) == 1 and shape[0] == 1):
        return f"int32({ref(ctx, t, ['0'] * len(shape))})"
    if len(shape) == 1 and row is not None:
        return f"int32({ref(ctx, t, [row])})"
    raise unsupported(node, f"{what} zero point {t!r} of shape {list(shape)}")


def _int_product(node: Node, ctx: LowerContext, a: str, b: str, out: str,
                 azp: int, bzp: int) -> tuple[list[str], str]:
    out_idx, a_idx, b_idx = matmul_indices(node, ctx, a, b, out)
    for t in (a, b):
        if ctx.dtype(t) not in ("int8", "uint8", "int16", "uint16"):
            raise unsupported(node, f"dtype {ctx.dtype(t)} of {t!r} (8- or 16-bit integers)")
    m = a_idx[-2] if ctx.rank(a) > 1 else None
    n = b_idx[-1] if ctx.rank(b) > 1 else None
    za = _zero_point(node, ctx, azp, m, "A's")
    zb = _zero_point(node, ctx, bzp, n, "B's")
    av = f"int32({ref(ctx, a, a_idx)})" + (f" - {za}" if za != "0" else "")
    bv = f"int32({ref(ctx, b, b_idx)})" + (f" - {zb}" if zb != "0" else "")
    return out_idx, f"({av}) * ({bv})"


@register("MatMulInteger")
def matmul_integer(node: Node, ctx: LowerContext) -> Lowered:
    a, b, out = node.inputs[0], node.inputs[1], node.outputs[0]
    out_idx, value = _int_product(node, ctx, a, b, out, 2, 3)
    return Lowered([stmt(ctx, out, out_idx, "+=!", value)])


@register("QLinearMatMul")
def qlinear_matmul(node: Node, ctx: LowerContext) -> Lowered:
    a, a_s, _, b, b_s, _, y_s = node.inputs[:7]
    out = node.outputs[0]
    out_idx, value = _int_product(node, ctx, a, b, out, 2, 5)
    acc = ctx.temp("acc")
    stmts = [temp_stmt(ctx, acc, out_idx, ctx.shape(out), "+=!", value)]
    scales = []
    for t in (a_s, b_s, y_s):
        if len(ctx.shape(t)) > 1 or (ctx.shape(t) and ctx.shape(t)[0] != 1):
            raise unsupported(node, f"scale {t!r} of shape {list(ctx.shape(t))} (per tensor "
                                    f"only)")
        scales.append(ref(ctx, t, ["0"] * len(ctx.shape(t))))
    mult = f"({scales[0]} * {scales[1]}) / {scales[2]}"
    yzp = f" + double({ref(ctx, node.inputs[7], ['0'] * ctx.rank(node.inputs[7]))})" \
        if present(node, 7) else ""
    acc_ref = f"{acc}({', '.join(out_idx)})" if out_idx else acc
    q = f"round(double({acc_ref}) * double({mult}){yzp})"
    return Lowered(stmts + [stmt(ctx, out, out_idx, "=", _saturated(q, ctx.dtype(out)))])


def _integer_conv(node: Node, ctx: LowerContext, x: str, w: str, xzp: int, wzp: int,
                  bias: str, target: str) -> list[str]:
    """The int32 convolution of ``(x - x_zero) * (w - w_zero)`` into ``target`` (the input
    padded with its zero point, so a padded tap adds 0)."""
    from .onnx_ops_nn import conv_statements
    for t in (x, w):
        if ctx.dtype(t) not in ("int8", "uint8"):
            raise unsupported(node, f"dtype {ctx.dtype(t)} of {t!r} (int8 or uint8)")
    zx = _zero_point(node, ctx, xzp, None, "the input's")
    zw = _zero_point(node, ctx, wzp, "m", "the weight's")
    pad = None
    if zx != "0":
        pad = cast_to(ctx.dtype(x), zx)

    def product(xr: str, wr: str) -> str:
        a = f"int32({xr})" + (f" - {zx}" if zx != "0" else "")
        b = f"int32({wr})" + (f" - {zw}" if zw != "0" else "")
        return f"({a}) * ({b})"
    return conv_statements(node, ctx, x, w, bias, target, ctx.shape(node.outputs[0]),
                           product, pad)


@register("ConvInteger")
def conv_integer(node: Node, ctx: LowerContext) -> Lowered:
    x, w, y = node.inputs[0], node.inputs[1], node.outputs[0]
    return Lowered(_integer_conv(node, ctx, x, w, 2, 3, "", ctx.name(y)))


@register("QLinearConv")
def qlinear_conv(node: Node, ctx: LowerContext) -> Lowered:
    """ONNX's QLinearConv (and polyc's fusion of a QDQ convolution into one): the int32
    convolution with the int32 bias, then ``saturate(rint(acc * x_scale * w_scale /
    y_scale) + y_zero)``, the weight scale per tensor or per output channel; with
    ``polyc_relu``, the ReLU between the convolution and its quantization folded into
    the saturation's lower bound (``max(q, y_zero)``, exact: quantizing is monotonic)."""
    x, xs_, _, w, ws_, _, ys_ = node.inputs[:7]
    y = node.outputs[0]
    bias = node.inputs[8] if present(node, 8) else ""
    acc = ctx.temp("acc")
    stmts = _integer_conv(node, ctx, x, w, 2, 5, bias, acc)
    zy = node.inputs[7] if present(node, 7) else ""
    return Lowered(stmts + [_requantize(node, ctx, acc, xs_, ws_, ys_, zy, y)])


@register("PolycRequantize")
def requantize(node: Node, ctx: LowerContext) -> Lowered:
    """polyc's own op (made by the QDQ fusion and :func:`..onnx_passes.
    convs_as_dot_products`): ``y = saturate(rint((acc + bias) * x_scale * w_scale /
    y_scale) + y_zero)`` of a convolution's exact sums ``acc``, the optional sixth input
    an int32 bias per output channel."""
    acc, xs_, ws_, ys_, zy = node.inputs[:5]
    bias = node.inputs[5] if present(node, 5) else ""
    # the sums over flat pixels (a dot-product convolution's), or shaped as the output
    flat = tuple(ctx.shape(acc)) != tuple(ctx.shape(node.outputs[0]))
    return Lowered([_requantize(node, ctx, ctx.name(acc), xs_, ws_, ys_,
                                zy, node.outputs[0], bias, flat)])


@register("PolycIm2Col")
def im2col(node: Node, ctx: LowerContext) -> Lowered:
    """polyc's own op (:func:`..onnx_passes.convs_as_dot_products`): the patches of a
    convolution's input, ``cols(n, o.., k.., c) = x(n, c, o*s + k*d - pad..)``, the
    input zero point (second input) in the padding."""
    from .onnx_ops_nn import Window, guarded
    from .onnx_ops_shape import lhs, names, read, where
    x, cols = node.inputs[0], node.outputs[0]
    xs, cs = ctx.shape(x), ctx.shape(cols)
    k = len(xs) - 2
    kernel = [int(v) for v in node.attr("kernel_shape")]
    quad = bool(node.attr("polyc_quad", 0))
    nhwc = node.attr("polyc_layout", "") == "nhwc"
    out = cs[1:1 + k] if nhwc or not quad else cs[2 + k:2 + 2 * k]
    win = Window(node, xs[1:1 + k] if nhwc else xs[2:], out, kernel)
    o, r = names("o", k), names("k", k)
    guards = [g for d in range(k) for g in win.guards(d, o[d], r[d])]
    pad = cast_to(ctx.dtype(x), _zero_point(node, ctx, 1, None, "the input's"))
    spatial = [(o[d], 0, out[d]) for d in range(k)] + [(r[d], 0, kernel[d]) for d in range(k)]
    if nhwc:  # cols(n, o.., k.., c) = x(n, ..., c): channel-last, zero-padded to quads
        channels = xs[-1]
        if cs[-1] != channels:
            guards.append(f"c < {channels}")
        value = read(ctx.name(x), ["n"] + [win.index(d, o[d], r[d]) for d in range(k)] + ["c"])
        ranges = [("n", 0, xs[0])] + spatial + [("c", 0, cs[-1])]
        return Lowered([f"{lhs(ctx.name(cols), ['n'] + o + r + ['c'])} = "
                        f"{guarded(guards, value, pad)}{where(ranges)}"])
    if quad:  # cols(n, k.., cq, o.., c % 4) = x(n, c, ...): channels in groups of four
        channel = "4*cq + c4"
        if xs[1] % 4:
            guards.append(f"{channel} < {xs[1]}")
        value = read(ctx.name(x), ["n", channel] + [win.index(d, o[d], r[d]) for d in range(k)])
        ranges = [("n", 0, xs[0])] + spatial + [("cq", 0, cs[1 + k]), ("c4", 0, 4)]
        return Lowered([f"{lhs(ctx.name(cols), ['n'] + r + ['cq'] + o + ['c4'])} = "
                        f"{guarded(guards, value, pad)}{where(ranges)}"])
    value = read(ctx.name(x), ["n", "c"] + [win.index(d, o[d], r[d]) for d in range(k)])
    ranges = [("n", 0, xs[0])] + spatial + [("c", 0, xs[1])]
    return Lowered([f"{lhs(ctx.name(cols), ['n'] + o + r + ['c'])} = "
                    f"{guarded(guards, value, pad)}{where(ranges)}"])


@register("PolycConvDot")
def conv_dot(node: Node, ctx: LowerContext) -> Lowered:
    """polyc's own op: ``acc(n, m, o..) = sum_k int32(cols(n, o.., k)) * int32(wt(m, k))``
    over a convolution's patches (``PolycIm2Col``, read flat) and its weights laid out
    ``(M, K)``: a matmul contiguous along ``k`` in both operands."""
    cols, wt, acc = node.inputs[0], node.inputs[1], node.outputs[0]
    cs, ws, ys = ctx.shape(cols), ctx.shape(wt), ctx.shape(acc)
    if node.attr("polyc_layout", "") == "nhwc":
        # acc(n, p, m) = sum_q sum_r cols(n, p, q, r) * wt(q, m, r): the output channels
        # on the lanes (the weights' vectors), a pixel's four channels broadcast
        q = ws[0]  # the weights (Q, M', 4), M' >= M
        quads = ctx.view(cols, (cs[0], ys[1], q, 4))
        value = " + ".join(f"int32({quads}(n, p, q, {j})) * int32({ref(ctx, wt, ['q', 'm', str(j)])})"
                           for j in range(4))
        return Lowered([stmt(ctx, acc, ["n", "p", "m"], "+=!", value,
                             extra=[f"q in 0:{q}"])])
    if node.attr("polyc_quad", 0):
        # acc(n, m, p) = sum_q sum_r cols(n, q, p, r) * wt(q, m, r): the four products
        # of a channel group written out, the form of one vpdpbusd lane
        q = ws[0]  # the weights (Q, M, 4)
        quads = ctx.view(cols, (cs[0], q, ys[2], 4))
        value = " + ".join(f"int32({quads}(n, q, p, {j})) * int32({ref(ctx, wt, ['q', 'm', str(j)])})"
                           for j in range(4))
        return Lowered([stmt(ctx, acc, ["n", "m", "p"], "+=!", value,
                             extra=[f"q in 0:{q}"])])
    k = len(ys) - 2
    flat = ctx.view(cols, tuple(cs[:1 + k]) + (ws[1],))
    o = [f"o{d}" for d in range(k)]
    value = f"int32({flat}({', '.join(['n'] + o + ['kk'])})) * int32({ref(ctx, wt, ['m', 'kk'])})"
    return Lowered([stmt(ctx, acc, ["n", "m"] + o, "+=!", value,
                         extra=[f"kk in 0:{ws[1]}"])])


def _requantize(node: Node, ctx: LowerContext, acc: str, xs_: str, ws_: str, ys_: str,
                zy: str, y: str, bias: str = "", flat: bool = False) -> str:
    """The requantization of the sums ``acc`` (a TC name shaped as ``y``, or with
    ``flat`` as ``(N, M, P)`` over its flat pixels; plus ``bias`` per output channel
    when given) into ``y``. With the node's ``polyc_layout`` ``"nhwc"``, ``y`` is
    channel-last and the flat sums ``(N, P, M)``. In double, as ONNX's reference
    (exact for int32 sums); with ``polyc_float`` (a QDQ convolution: its graph's
    arithmetic is float32, and so is onnxruntime's integer path) in float."""
    shape = ctx.shape(y)
    nhwc = node.attr("polyc_layout", "") == "nhwc"
    spatial = [f"o{d}" for d in range(len(shape) - 2)]
    idx = ["n"] + spatial + ["m"] if nhwc else ["n", "m"] + spatial
    channels = shape[-1] if nhwc else shape[1]
    within = "float32" if node.attr("polyc_float", 0) else "float64"
    real = "float" if within == "float32" else "double"

    def scalar(t: str, per_channel: bool = False) -> str:
        s = ctx.shape(t)
        if len(s) == 1 and s[0] == channels and s[0] != 1 and per_channel:
            return ref(ctx, t, ['m'])
        if len(s) > 1 or (len(s) == 1 and s[0] != 1):
            raise unsupported(node, f"scale {t!r} of shape {list(s)}")
        return ref(ctx, t, ['0'] * len(s))
    dt = ctx.dtype(y)
    if node.attr("polyc_multiplier", 0):  # computed at compile time (onnx_passes)
        value = small_const(ctx, xs_)
        mult = f"{real}({lit(value, 'float32') if value is not None else scalar(xs_, True)})"
    else:  # the multiplier in the scales' type, operation by operation, as ONNX's reference
        mult = f"{real}(({scalar(xs_)} * {scalar(ws_, True)}) / {scalar(ys_)})"
    yzp = f" + {real}({ref(ctx, zy, ['0'] * ctx.rank(zy))})" if zy else ""
    acc_idx = idx
    if flat:  # the sums (n, m, p) or (n, p, m): the pixels flat
        dims = shape[1:-1] if nhwc else shape[2:]
        pixel = " + ".join(f"{int(np.prod(dims[d + 1:]))}*o{d}" for d in range(len(dims)))
        acc_idx = ["n", pixel, "m"] if nhwc else ["n", "m", pixel]
    total = f"{real}({acc}({', '.join(acc_idx)}))"
    if bias:  # added in the float type: no int32 overflow on the way (exact in double)
        total = f"({total} + {real}({ref(ctx, bias, ['m'])}))"
    q = f"round({total} * {mult}{yzp})"
    if node.attr("polyc_relu", 0) and zy:
        q = f"max({q}, {real}({ref(ctx, zy, ['0'] * ctx.rank(zy))}))"
    return stmt(ctx, y, idx, "=", _saturated(q, dt, within))
