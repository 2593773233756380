"""Lowerings of ONNX neural-network ops (see :mod:`.onnx_graph` for the contract).

Convolutions and pools are TC reductions over explicit ``where`` ranges (the output
extents come from the graph's shape inference). Padding of a Conv: the input is first
copied into a zero-padded temporary (``P(n,c,p..) = (p - b >= 0 && ..) ? X(n,c,p - b,..)
: 0.0``, a small copy next to the convolution's work), and the convolution reads it
unguarded over a rectangular domain. Its column loop then has constant bounds, so the
register tiling (polyc/schedule/register_tile.py) keeps the accumulators in registers;
a guarded read in the hot loop (TC's padded convolution) or a domain restricted by the
unguarded read (column bounds depending on ``kw``) are both several times slower on
ResNet-50's padded 3x3 layers. A strided Conv (NCHW) copies its padded input split into
``stride x stride`` phase planes instead, so its output row reads unit-stride
(:func:`_phase_copy`); a 1x1 unit-stride Conv is a matmul over the flattened pixels
(:func:`_conv_1x1_flat`); a Conv that :mod:`.onnx_layout` makes channel-last is polyc's
own ``PolycConvNHWC`` (:func:`conv_nhwc`), or, 3x3 and unit-stride, Winograd's
``PolycWinogradInput`` / ``PolycWinogradOutput`` around a MatMul (:func:`winograd_input`,
:func:`winograd_output`). Pools: the padded elements are the identity of the
reduction (-inf for a max), so the read is left unguarded and the TC frontend restricts
the iteration domain to the points that read inside the input (an unconditional read
adds its bounds to the domain; the ``!`` initialisation still covers every output
element). Guards remain where they are needed: the divisibility test of a strided
ConvTranspose (its bounds come from an ``exists`` clause) and the window count of
AveragePool.

* Conv: N-D (1-D, 2-D, 3-D...), group (incl. depthwise), strides, pads, dilations,
  auto_pad (NOTSET, SAME_UPPER, SAME_LOWER, VALID), optional bias;
* ConvTranspose: N-D, group, strides, pads, dilations, output_padding, output_shape,
  auto_pad, optional bias (a gather form: input ``(o + p - k*d) / s`` where divisible);
* MaxPool (kernel_shape, strides, pads, dilations, ceil_mode, auto_pad; padded elements
  are -inf; the Indices output is unsupported), AveragePool (count_include_pad 0/1,
  ceil_mode, pads, dilations, auto_pad), GlobalAveragePool, GlobalMaxPool.
"""
from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from polyc import dtypes as D

from .onnx_graph import LowerContext, Lowered, Node, literal, register
from . import winograd
from .onnx_layout import CONV_NHWC, WINOGRAD_INPUT, WINOGRAD_OUTPUT
from .onnx_ops_math import str_attr
from .onnx_ops_shape import affine, check_dtype, check_nonempty, lhs, names, read, \
    unsupported, where

FLOATS = D.FLOATS
AUTO_PADS = ("NOTSET", "SAME_UPPER", "SAME_LOWER", "VALID")




def _ints(node: Node, key: str, n: int, default: int) -> list[int]:
    v = node.attr(key)
    if v is None:
        return [default] * n
    v = [int(a) for a in v]
    if len(v) != n:
        raise unsupported(node, f"{key}={v} should have {n} values")
    return v


class Window:
    """The sliding-window geometry of a conv or pool over ``k`` spatial dimensions."""

    def __init__(self, node: Node, in_sp: Sequence[int], out_sp: Sequence[int],
                 kernel: Sequence[int]):
        k = len(in_sp)
        self.node = node
        self.in_sp, self.out_sp, self.kernel = list(in_sp), list(out_sp), list(kernel)
        self.strides = _ints(node, "strides", k, 1)
        self.dilations = _ints(node, "dilations", k, 1)
        if min(self.strides + self.dilations, default=1) < 1:
            raise unsupported(node, "strides and dilations must be >= 1")
        auto = str_attr(node, "auto_pad", "NOTSET")
        if auto not in AUTO_PADS:
            raise unsupported(node, f"auto_pad={auto!r} (supported: {', '.join(AUTO_PADS)})")
        if auto in ("SAME_UPPER", "SAME_LOWER"):
            self.begin, self.end = [], []
            for d in range(k):
                out = -(-in_sp[d] // self.strides[d])
                total = max(0, (out - 1) * self.strides[d]
                            + (kernel[d] - 1) * self.dilations[d] + 1 - in_sp[d])
                b = total // 2 if auto == "SAME_UPPER" else total - total // 2
                self.begin.append(b)
                self.end.append(total - b)
        elif auto == "VALID":
            self.begin, self.end = [0] * k, [0] * k
        else:
            pads = _ints(node, "pads", 2 * k, 0)
            self.begin, self.end = pads[:k], pads[k:]

    def index(self, d: int, o: str, r: str) -> str:
        """The input index of output ``o`` and kernel offset ``r`` along dimension ``d``."""
        return affine([(self.strides[d], o), (self.dilations[d], r)], -self.begin[d])

    def max_index(self, d: int) -> int:
        return (self.out_sp[d] - 1) * self.strides[d] + (self.kernel[d] - 1) \
            * self.dilations[d] - self.begin[d]

    def guards(self, d: int, o: str, r: str, lo: int = 0, hi: int | None = None) -> list[str]:
        """The conditions keeping dimension ``d`` in ``[lo, hi)`` (default the input)."""
        hi = self.in_sp[d] if hi is None else hi
        e = self.index(d, o, r)
        out = []
        if -self.begin[d] < lo:
            out.append(f"{e} >= {lo}")
        if self.max_index(d) > hi - 1:
            out.append(f"{e} < {hi}")
        return out


def guarded(guards: list[str], value: str, other: str) -> str:
    return f"({' && '.join(guards)}) ? {value} : {other}" if guards else value


# -- Conv -----------------------------------------------------------------------------

@register("Conv")
def conv(node: Node, ctx: LowerContext) -> Lowered:
    """``Y(n,m,o..) +=! X(n, g*Cg + c, o*s + k*d - p, ..) * W(m, c, k..)``, then the bias."""
    x, w, y = node.inputs[0], node.inputs[1], node.outputs[0]
    b = node.inputs[2] if len(node.inputs) > 2 else ""
    check_nonempty(node, ctx, x, w, y)
    check_dtype(node, ctx, x, FLOATS)
    return Lowered(conv_statements(node, ctx, x, w, b, ctx.name(y), ctx.shape(y)))


def conv_statements(node: Node, ctx: LowerContext, x: str, w: str, b: str, target: str,
                    ys: Sequence[int], product=None, pad: str | None = None) -> list[str]:
    """The statements of a convolution of ``x`` by ``w`` (plus the bias ``b``, a tensor
    or "") into ``target`` (a TC name of shape ``ys``): ``product(x_read, w_read)`` is the
    summed term (default ``x * w``), ``pad`` the value of the input's padding (default 0;
    a quantized input pads with its zero point)."""
    product = product or (lambda a, b_: f"{a} * {b_}")
    xs, ws = ctx.shape(x), ctx.shape(w)
    k = len(xs) - 2
    if k < 1 or len(ws) != k + 2:
        raise unsupported(node, f"input rank {len(xs)} / weight rank {len(ws)}")
    group = int(node.attr("group", 1))
    M, Cg = ws[0], ws[1]
    if group < 1 or M % group or xs[1] != Cg * group:
        raise unsupported(node, f"group={group} does not fit {xs[1]} input and {M} "
                                f"output channels (weight {ws})")
    kernel = list(node.attr("kernel_shape", ws[2:]))
    if list(kernel) != list(ws[2:]):
        raise unsupported(node, f"kernel_shape={kernel} differs from the weight's {ws[2:]}")
    win = Window(node, xs[2:], ys[2:], ws[2:])
    if group == 1 and flat_pointwise(win):
        return _conv_1x1_flat(ctx, x, w, b, target, ys, product)
    o, r = names("o", k), names("k", k)
    cin = "c" if group == 1 else affine([(Cg, f"(m / {M // group})"), (1, "c")])
    stmts = []
    src = ctx.name(x)
    if group == 1 and win.strides[-1] > 1 and win.kernel[-1] > 1:
        # strided: a padded copy split by phase, so the vector loop reads contiguously
        src = ctx.temp("xphase")
        stmts.append(_phase_copy(ctx, x, src, win, pad))
        xread = read(src, ["n", "c"] + [_phase(win, d, r[d])[0] for d in range(k)]
                     + [affine([(1, o[d])]) + " + " + _phase(win, d, r[d])[1] for d in range(k)])
    elif any(win.guards(d, o[d], r[d]) for d in range(k)):
        # padding: copy the input into a zero-padded temporary, then a rectangular,
        # unguarded convolution over it (see the module doc)
        src = ctx.temp("xpad")
        stmts.append(_padded_copy(ctx, x, src, win, ["n", "ci"], [], pad))
        xread = read(src, ["n", cin] + [affine([(win.strides[d], o[d]),
                                                (win.dilations[d], r[d])], 0)
                                        for d in range(k)])
    else:
        xread = read(src, ["n", cin] + [win.index(d, o[d], r[d]) for d in range(k)])
    prod = product(xread, read(ctx.name(w), ['m', 'c'] + r))
    out_idx = ["n", "m"] + o
    ranges = [("n", 0, ys[0]), ("m", 0, M), ("c", 0, Cg)] + \
        [(o[d], 0, ys[d + 2]) for d in range(k)] + [(r[d], 0, ws[d + 2]) for d in range(k)]
    stmts.append(f"{lhs(target, out_idx)} +=! {prod}{where(ranges)}")
    if b:
        stmts.append(_bias(ctx, target, ys, b, out_idx))
    return stmts


def flat_pointwise(win: Window) -> bool:
    """A 1x1 (all-ones kernel), unit-stride, unpadded window: output pixel = input pixel."""
    return all(k == 1 for k in win.kernel) and all(t == 1 for t in win.strides) and \
        not any(win.begin + win.end)


def _conv_1x1_flat(ctx: LowerContext, x: str, w: str, b: str, target: str,
                   ys: Sequence[int], product) -> list[str]:
    """A 1x1, stride-1, unpadded, group-1 Conv is a matmul over the flattened pixels:
    ``Yf(n, m, p) +=! X(n, c, p) * W(m, c, 0..)`` with ``X`` viewed as ``(N, C, H*W)``,
    then ``Y(n, m, h, w) = Yf(n, m, h*W + w) (+ B(m))``. The vector loop runs over all
    ``H*W`` contiguous pixels (784 at 28x28) instead of one row of ``W`` (28: short
    loops, partial register tiles): 55 -> ~100 GFLOP/s on ResNet-50's 1x1 layers. The
    copy-out is the pass the bias and the fused elementwise ops make anyway."""
    xs, ws = ctx.shape(x), ctx.shape(w)
    k = len(xs) - 2
    pixels = int(np.prod(xs[2:]))
    xf, yf = ctx.view(x, (xs[0], xs[1], pixels)), ctx.temp("yf")
    ranges = [("n", 0, ys[0]), ("m", 0, ws[0]), ("p", 0, pixels), ("c", 0, ws[1])]
    conv = f"{lhs(yf, ['n', 'm', 'p'])} +=! " \
        f"{product(read(xf, ['n', 'c', 'p']), read(ctx.name(w), ['m', 'c'] + ['0'] * k))}" \
        f"{where(ranges)}"
    o = names("o", k)
    strides = [int(np.prod(ys[2 + d + 1:])) for d in range(k)]
    pixel = affine([(strides[d], o[d]) for d in range(k)])
    value = read(yf, ["n", "m", pixel])
    if b:
        value = f"{value} + {read(ctx.name(b), ['m'])}"
    out_idx = ["n", "m"] + o
    copy_out = f"{lhs(target, out_idx)} = {value}" \
        f"{where([(i, 0, d) for i, d in zip(out_idx, ys)])}"
    return [conv, copy_out]


def _phase(win: Window, d: int, r: str) -> tuple[str, str]:
    """(phase, offset) of kernel offset ``r`` along dimension ``d``: input index
    ``s*o + k*dil = s*(o + k*dil / s) + k*dil % s``."""
    s, kd = win.strides[d], affine([(win.dilations[d], r)])
    return f"(({kd}) % {s})", f"(({kd}) / {s})"


def _phase_copy(ctx: LowerContext, x: str, dst: str, win: Window, pad: str | None = None
                ) -> str:
    """``dst(n, ci, ph.., q..) = X(n, ci, s*q + ph - pad, ..)`` (0 outside the input): the
    padded input split into ``s x s`` phase planes, so that a stride-``s`` convolution
    reads ``dst(n, c, k % s, .., o + k / s, ..)`` -- unit stride along the output row
    (the stem of ResNet-50, 7x7 stride 2 over 3 channels, otherwise gathers its input)."""
    xs = ctx.shape(x)
    k = len(xs) - 2
    ph, q = names("ph", k), names("q", k)
    guards, idx, ranges = [], [], [("n", 0, xs[0]), ("ci", 0, xs[1])]
    for d in range(k):
        s = win.strides[d]
        ext = win.max_index(d) + win.begin[d] + 1  # padded extent
        e = affine([(s, q[d]), (1, ph[d])], -win.begin[d])
        idx.append(e)
        guards += [f"{e} >= 0", f"{e} < {xs[d + 2]}"]
        ranges += [(ph[d], 0, s), (q[d], 0, -(-ext // s))]
    xval = read(ctx.name(x), ["n", "ci"] + idx)
    zero = pad or literal(0.0, ctx.dtype(x))
    return f"{lhs(dst, ['n', 'ci'] + ph + q)} = {guarded(guards, xval, zero)}{where(ranges)}"


def _padded_copy(ctx: LowerContext, x: str, dst: str, win: Window, before: list[str],
                 after: list[str], pad: str | None = None, channel_last: bool = False,
                 extent: Sequence[int] | None = None) -> str:
    """``dst(before.., p.., after..) = X(n, ci, p - pad..)`` (0 in the padding): the
    input's spatial dimensions copied between the leading ``before`` and trailing
    ``after`` indices (``n, ci`` first for NCHW, ``n`` / ``ci`` around for NHWC); with
    ``channel_last`` the input is ``X(n, p.., ci)``. ``extent``: the padded extents
    (default: up to the window's last input index)."""
    xs = ctx.shape(x)
    k = len(xs) - 2
    spatial = xs[1:1 + k] if channel_last else xs[2:]
    p = names("p", k)
    ext = list(extent) if extent is not None else \
        [win.max_index(d) + win.begin[d] + 1 for d in range(k)]
    guards = []
    for d in range(k):
        e = affine([(1, p[d])], -win.begin[d])
        if win.begin[d] > 0:
            guards.append(f"{e} >= 0")
        if ext[d] - 1 - win.begin[d] > spatial[d] - 1:
            guards.append(f"{e} < {spatial[d]}")
    at = [affine([(1, p[d])], -win.begin[d]) for d in range(k)]
    xval = read(ctx.name(x), ["n"] + at + ["ci"] if channel_last else ["n", "ci"] + at)
    zero = pad or literal(0.0, ctx.dtype(x))
    channels = xs[-1] if channel_last else xs[1]
    ranges = [("n", 0, xs[0]), ("ci", 0, channels)] + [(p[d], 0, ext[d]) for d in range(k)]
    return f"{lhs(dst, before + p + after)} = {guarded(guards, xval, zero)}{where(ranges)}"


@register(CONV_NHWC)
def conv_nhwc(node: Node, ctx: LowerContext) -> Lowered:
    """polyc's own op (:mod:`.onnx_layout`): a 2-D Conv from NHWC input to NHWC output.

    Dense (group 1), weights blocked ``(M / MB, KH, KW, C, MB)``::

        Yt(n, oh, ow, mb, mi) +=! X(n, oh*s + kh*d - p, ow*s + kw*d - p, c) * Wb(mb, kh, kw, c, mi)
        Y(n, oh, ow, m)        = Yt(n, oh, ow, m / MB, m % MB) (+ B(m))

    the vector loop over the ``MB`` output channels of a block (its weights one
    contiguous stream), the register tile's rows over ``ow``, the input read one
    broadcast scalar at a time whatever the stride; ``Yt`` and ``Y`` hold the same
    elements in the same order, so the copy-out is a contiguous pass (the one the bias
    and the fused activation make anyway). Depthwise (one group per channel), weights
    ``(KH, KW, C)``: ``Y(n, oh, ow, c) +=! X(n, .., .., c) * W(kh, kw, c)``, the vector
    loop over the channels, the padding as guards on the input's reads. A dense
    convolution's padded input is copied into a zero-padded NHWC temporary first (a
    contiguous copy), so its domain is rectangular and unguarded."""
    x, w, y = node.inputs[0], node.inputs[1], node.outputs[0]
    b = node.inputs[2] if len(node.inputs) > 2 else ""
    check_nonempty(node, ctx, x, w, y)
    check_dtype(node, ctx, x, FLOATS)
    xs, ws, ys = ctx.shape(x), ctx.shape(w), ctx.shape(y)
    depthwise = len(ws) == 3
    nchw_in = node.attr("polyc_input_layout", "nhwc") == "nchw"
    if len(xs) != 4 or len(ys) != 4 or len(ws) not in (3, 5) or (nchw_in and depthwise):
        raise unsupported(node, f"channel-last input {list(xs)}, weights {list(ws)}")
    if nchw_in:  # a stem over few channels: its NCHW input read in place (module doc)
        xs = (xs[0], xs[2], xs[3], xs[1])
    KH, KW = (ws[0], ws[1]) if depthwise else (ws[1], ws[2])
    C, M = xs[3], ys[3]
    if (depthwise and (ws[2] != C or M != C)) or \
            (not depthwise and (ws[3] != C or ws[0] * ws[4] != M)):
        raise unsupported(node, f"channel-last weights {list(ws)} do not fit input {list(xs)}")
    win = Window(node, xs[1:3], ys[1:3], [KH, KW])
    o, r = names("o", 2), names("k", 2)
    src = ctx.name(x)
    spatial = [("n", 0, ys[0])] + [(o[d], 0, ys[d + 1]) for d in range(2)]
    taps = [(r[0], 0, KH), (r[1], 0, KW)]
    out_idx = ["n"] + o + ["m"]
    if depthwise:
        # the padding as guards on the reads (the same for every channel of the vector
        # loop: a masked load), not a padded copy: a depthwise convolution does 9
        # multiply-adds an element, and the copy of its (expanded) input cost more
        guards = [g for d in range(2) for g in win.guards(d, o[d], r[d])]
        value = guarded(guards, read(src, ["n"] + [win.index(d, o[d], r[d]) for d in range(2)]
                                     + ["m"]), literal(0.0, ctx.dtype(x)))
        conv = f"{lhs(ctx.name(y), out_idx)} +=! ({value}) * " \
            f"{read(ctx.name(w), r + ['m'])}{where(spatial + [('m', 0, M)] + taps)}"
        return Lowered([conv] + ([_bias(ctx, ctx.name(y), ys, b, out_idx)] if b else []))
    if any(win.begin + win.end) or any(win.max_index(d) > xs[d + 1] - 1 for d in range(2)):
        src = ctx.temp("xpad")
        copy_in = [_padded_copy(ctx, x, src, win, ["n", "ci"] if nchw_in else ["n"],
                                [] if nchw_in else ["ci"], channel_last=not nchw_in)]
        at = [affine([(win.strides[d], o[d]), (win.dilations[d], r[d])]) for d in range(2)]
    else:
        copy_in = []
        at = [win.index(d, o[d], r[d]) for d in range(2)]
    NB, MB = ws[0], ws[4]
    yt = ctx.temp("yt")
    x_idx = ["n", "c"] + at if nchw_in else ["n"] + at + ["c"]
    conv = f"{lhs(yt, ['n'] + o + ['mb', 'mi'])} +=! {read(src, x_idx)} * " \
        f"{read(ctx.name(w), ['mb'] + r + ['c', 'mi'])}" \
        f"{where(spatial + [('mb', 0, NB), ('mi', 0, MB)] + taps + [('c', 0, C)])}"
    value = read(yt, ["n"] + o + [f"m / {MB}", f"m % {MB}"])
    if b:
        value = f"{value} + {read(ctx.name(b), ['m'])}"
    copy_out = f"{lhs(ctx.name(y), out_idx)} = {value}" \
        f"{where([(i, 0, d) for i, d in zip(out_idx, ys)])}"
    return Lowered(copy_in + [conv, copy_out])


def _winograd_tiles(node: Node, out: Sequence[int]) -> tuple[int, int, int]:
    """``(m, TH, TW)``: the output tile ``m`` of a Winograd op (attribute
    ``polyc_tile``) and the tiles along the output's height and width ``out``."""
    m = int(node.attr("polyc_tile", winograd.TILE))
    if m not in winograd.TILES:
        raise unsupported(node, f"polyc_tile={m} (Winograd tiles: {winograd.TILES})")
    return m, -(-int(out[0]) // m), -(-int(out[1]) // m)


#: the Winograd input transform reads a zero-padded copy of its input, else X itself with
#: guards (the tiles' rows and columns past X read 0). Guarded: no pass over a padded
#: copy (860 KB for a 56x56x64 layer); one thread, same process, a 56x56x64 layer 1.46 ->
#: 1.19 ms, 28x28x128 0.94 -> 0.82, 14x14x256 even, ResNet-18 21.6 -> 21.3 ms
WINOGRAD_PADDED_COPY = False


@register(WINOGRAD_INPUT)
def winograd_input(node: Node, ctx: LowerContext) -> Lowered:
    """polyc's own op (:mod:`.onnx_layout`): the input transform of a 3x3, stride-1
    Conv by Winograd's ``F(m x m, 3x3)`` (:mod:`.winograd`; ``m`` the attribute
    ``polyc_tile``, the Conv's output extents ``polyc_output``). From NHWC input ``X``
    to ``V(a, b, n, ty, tx, c) = (B^T d B)[a, b]``, ``(a, b)`` a position in the
    ``alpha x alpha`` input tile ``d`` of output tile ``(ty, tx)`` (``ceil(OH/m) x
    ceil(OW/m)`` of them), in two passes of 1-D transforms::

        W(b, i, n, ty, tx, c)  = sum_j B^T[b, j] * P(n, m*ty + i, m*tx + j, c)   fixed b
        V(a, b, n, ty, tx, c)  = sum_i B^T[a, i] * W(b, i, n, ty, tx, c)         fixed a

    ``P`` X zero-padded to cover every tile (the Conv's pads first): X's element read
    under guards, 0 past its edges (:data:`WINOGRAD_PADDED_COPY`: a padded copy instead);
    each statement a sum of a few terms with constant coefficients (zeros left out,
    +-1 without a product), ``2 * alpha`` statements. The MatMul of ``V`` (positions
    and tiles flattened) by the transformed weights then does the channels' sums for
    every position at once, :func:`winograd_output` the rest."""
    x, v = node.inputs[0], node.outputs[0]
    check_nonempty(node, ctx, x, v)
    check_dtype(node, ctx, x, ("float32",))
    xs, vs = ctx.shape(x), ctx.shape(v)
    out = [int(d) for d in node.attr("polyc_output", [])]
    if len(xs) != 4 or len(out) != 2:
        raise unsupported(node, f"input {list(xs)}, output extents {out}")
    m, TH, TW = _winograd_tiles(node, out)
    alpha, N, C = m + 2, xs[0], xs[3]
    if tuple(vs) != (alpha, alpha, N, TH, TW, C):
        raise unsupported(node, f"transformed input {list(vs)} is not "
                                f"{[alpha, alpha, N, TH, TW, C]}")
    win = Window(node, xs[1:3], out, [3, 3])
    if win.strides != [1, 1] or win.dilations != [1, 1]:
        raise unsupported(node, f"Winograd needs unit strides and dilations, not "
                                f"{win.strides} / {win.dilations}")
    BT, _, _ = winograd.matrices(m)
    w = ctx.temp("wino_w")
    tiles = [("n", 0, N), ("ty", 0, TH), ("tx", 0, TW), ("c", 0, C)]
    w_idx = ["b", "i", "n", "ty", "tx", "c"]
    # declares W's whole shape (dropped from the kernel): its statements each write one b
    stmts = [f"{lhs(w, w_idx)} = {literal(0.0, 'float32')}"
             f"{where([('b', 0, alpha), ('i', 0, alpha)] + tiles)}"]
    if WINOGRAD_PADDED_COPY:
        src = ctx.temp("xpad")
        stmts.insert(0, _padded_copy(ctx, x, src, win, ["n"], ["ci"], channel_last=True,
                                     extent=[TH * m + 2, TW * m + 2]))
    zero = literal(0.0, "float32")

    def tile_read(j: int) -> str:
        """Input row ``i``, column ``j`` of tile ``(ty, tx)``: from the padded copy, or
        from X itself, zero where the tile reaches past it."""
        if WINOGRAD_PADDED_COPY:
            return read(src, ["n", affine([(m, "ty"), (1, "i")]), affine([(m, "tx")], j), "c"])
        at = [affine([(m, "ty"), (1, "i")], -win.begin[0]),
              affine([(m, "tx")], j - win.begin[1])]
        guards = [g for d, e in enumerate(at)
                  for g in (f"{e} >= 0", f"{e} < {xs[1 + d]}")]
        return f"({guarded(guards, read(ctx.name(x), ['n'] + at + ['c']), zero)})"

    for b in range(alpha):
        row = [tile_read(j) for j in range(alpha)]
        stmts.append(f"{lhs(w, w_idx)} = {winograd.linear(BT[b], row)}"
                     f"{where([('b', b, b + 1), ('i', 0, alpha)] + tiles)}")
    for a in range(alpha):
        col = [read(w, ["b", str(i), "n", "ty", "tx", "c"]) for i in range(alpha)]
        stmts.append(f"{lhs(ctx.name(v), ['a', 'b', 'n', 'ty', 'tx', 'c'])} = "
                     f"{winograd.linear(BT[a], col)}"
                     f"{where([('a', a, a + 1), ('b', 0, alpha)] + tiles)}")
    return Lowered(stmts, scaffold=(1,) if WINOGRAD_PADDED_COPY else (0,))


@register(WINOGRAD_OUTPUT)
def winograd_output(node: Node, ctx: LowerContext) -> Lowered:
    """polyc's own op (:mod:`.onnx_layout`): the output transform of a Winograd
    convolution (see :func:`winograd_input`), from the products ``Mt(a, b, n, ty, tx,
    m)`` (the MatMul of the transformed input by the transformed weights) to NHWC
    output ``Y``, plus the bias, in two passes of 1-D transforms::

        Z(i, b, n, ty, tx, m)  = sum_a A^T[i, a] * Mt(a, b, n, ty, tx, m)        fixed i
        O(n, ty, i, tx, j, m)  = sum_b A^T[j, b] * Z(i, b, n, ty, tx, m)         fixed j
        Y(n, oh, ow, m)        = O(n, oh / m, oh % m, ow / m, ow % m, m) (+ B(m))

    the copy-out is the pass the bias and the fused activation make anyway (``O`` has
    ``Y``'s layout where ``m`` divides the output's extents)."""
    mt, y = node.inputs[0], node.outputs[0]
    b = node.inputs[1] if len(node.inputs) > 1 else ""
    check_nonempty(node, ctx, mt, y)
    check_dtype(node, ctx, mt, ("float32",))
    ms, ys = ctx.shape(mt), ctx.shape(y)
    if len(ys) != 4:
        raise unsupported(node, f"output {list(ys)}")
    m, TH, TW = _winograd_tiles(node, ys[1:3])
    alpha, N, M = m + 2, ys[0], ys[3]
    if tuple(ms) != (alpha, alpha, N, TH, TW, M):
        raise unsupported(node, f"products {list(ms)} are not {[alpha, alpha, N, TH, TW, M]}")
    _, _, AT = winograd.matrices(m)
    z, o = ctx.temp("wino_z"), ctx.temp("wino_o")
    tiles = [("n", 0, N), ("ty", 0, TH), ("tx", 0, TW), ("m", 0, M)]
    z_idx, o_idx = ["i", "b", "n", "ty", "tx", "m"], ["n", "ty", "i", "tx", "j", "m"]
    zero = literal(0.0, "float32")
    # Z and O are written one row of a tile at a time: a first statement each (dropped
    # from the kernel) declares the whole shape
    stmts = [f"{lhs(z, z_idx)} = {zero}{where([('i', 0, m), ('b', 0, alpha)] + tiles)}",
             f"{lhs(o, o_idx)} = {zero}{where([('i', 0, m), ('j', 0, m)] + tiles)}"]
    for i in range(m):
        col = [read(ctx.name(mt), [str(a), "b", "n", "ty", "tx", "m"]) for a in range(alpha)]
        stmts.append(f"{lhs(z, z_idx)} = {winograd.linear(AT[i], col)}"
                     f"{where([('i', i, i + 1), ('b', 0, alpha)] + tiles)}")
    for j in range(m):
        row = [read(z, ["i", str(bb), "n", "ty", "tx", "m"]) for bb in range(alpha)]
        stmts.append(f"{lhs(o, o_idx)} = {winograd.linear(AT[j], row)}"
                     f"{where([('i', 0, m), ('j', j, j + 1)] + tiles)}")
    oh, ow = "o0", "o1"
    value = read(o, ["n", f"{oh} / {m}", f"{oh} % {m}", f"{ow} / {m}", f"{ow} % {m}", "m"])
    if b:
        value = f"{value} + {read(ctx.name(b), ['m'])}"
    out_idx = ["n", oh, ow, "m"]
    stmts.append(f"{lhs(ctx.name(y), out_idx)} = {value}"
                 f"{where([(i, 0, d) for i, d in zip(out_idx, ys)])}")
    return Lowered(stmts, scaffold=(0, 1))


def _bias(ctx: LowerContext, y: str, ys: Sequence[int], b: str, out_idx: list[str]) -> str:
    """``y(out) = y(out) + b(m)``: ``y`` a TC name of shape ``ys`` (``m`` among ``out_idx``)."""
    target = lhs(y, out_idx)
    return (f"{target} = {target} + {read(ctx.name(b), ['m'])}"
            f"{where([(i, 0, d) for i, d in zip(out_idx, ys)])}")


@register("ConvTranspose")
def conv_transpose(node: Node, ctx: LowerContext) -> Lowered:
    """``Y(n,m,o..) +=! X(n, cin, (o + p - k*d) / s, ..) * W(cin, m % Mg, k..)`` where
    ``o + p - k*d`` is a multiple of ``s`` inside the input (``cin = (m / Mg)*Cg + c``)."""
    x, w, y = node.inputs[0], node.inputs[1], node.outputs[0]
    b = node.inputs[2] if len(node.inputs) > 2 else ""
    check_nonempty(node, ctx, x, w, y)
    dt = check_dtype(node, ctx, x, FLOATS)
    xs, ws, ys = ctx.shape(x), ctx.shape(w), ctx.shape(y)
    k = len(xs) - 2
    if k < 1 or len(ws) != k + 2:
        raise unsupported(node, f"input rank {len(xs)} / weight rank {len(ws)}")
    group = int(node.attr("group", 1))
    C, Mg = ws[0], ws[1]
    M = Mg * group
    if group < 1 or C != xs[1] or C % group or ys[1] != M:
        raise unsupported(node, f"group={group} does not fit {xs[1]} input and {ys[1]} "
                                f"output channels (weight {ws})")
    Cg = C // group
    kern = ws[2:]
    strides = _ints(node, "strides", k, 1)
    dil = _ints(node, "dilations", k, 1)
    out_pad = _ints(node, "output_padding", k, 0)
    auto = str_attr(node, "auto_pad", "NOTSET")
    if auto not in AUTO_PADS:
        raise unsupported(node, f"auto_pad={auto!r} (supported: {', '.join(AUTO_PADS)})")
    out_shape = node.attr("output_shape")
    if out_shape is not None:
        out_shape = [int(v) for v in out_shape][-k:]
    elif auto in ("SAME_UPPER", "SAME_LOWER"):
        out_shape = [xs[d + 2] * strides[d] for d in range(k)]
    if out_shape is not None:
        begin = []
        for d in range(k):
            total = strides[d] * (xs[d + 2] - 1) + out_pad[d] + (kern[d] - 1) * dil[d] + 1 \
                - out_shape[d]
            begin.append(total // 2 if auto == "SAME_UPPER" else total - total // 2)
    elif auto == "VALID":
        begin = [0] * k
    else:
        begin = _ints(node, "pads", 2 * k, 0)[:k]
    o, r = names("o", k), names("k", k)
    guards, src = [], []
    for d in range(k):
        e = affine([(1, o[d]), (-dil[d], r[d])], begin[d])
        s = strides[d]
        if s > 1:
            guards.append(f"({e}) % {s} == 0")
        src.append(f"({e}) / {s}" if s > 1 else e)
    cin = "c" if group == 1 else affine([(Cg, f"(m / {Mg})"), (1, "c")])
    mw = "m" if group == 1 else f"m % {Mg}"
    xread = read(ctx.name(x), ['n', cin] + src)
    prod = f"{xread} * {read(ctx.name(w), [cin, mw] + r)}"
    out_idx = ["n", "m"] + o
    ranges = [("n", 0, ys[0]), ("m", 0, M), ("c", 0, Cg)] + \
        [(o[d], 0, ys[d + 2]) for d in range(k)] + [(r[d], 0, kern[d]) for d in range(k)]
    # the read under the divisibility guard is bounded by an `exists` clause: the
    # domain keeps only the points reading inside X
    clauses = where(ranges) + (f", exists {xread}" if guards else "")
    stmts = [f"{lhs(ctx.name(y), out_idx)} +=! {guarded(guards, prod, literal(0.0, dt))}"
             f"{clauses}"]
    if b:
        stmts.append(_bias(ctx, ctx.name(y), ctx.shape(y), b, out_idx))
    return Lowered(stmts)


# -- pools -----------------------------------------------------------------------------
#
# A pool is split into its interior, the outputs whose windows lie inside the input,
# and the border around it. The interior is one statement with the window unrolled,
# ``Y(n,c,o..) = max(max(X(..), X(..)), ..)`` (a balanced tree, no reduction loop),
# over a rectangular domain: its output-width loop vectorizes, reading the taps
# directly. The border (a few rows and columns) keeps the reduction whose unguarded
# read restricts its domain to the taps inside the input.

#: most window taps unrolled into one expression (larger windows stay reductions)
POOL_UNROLL = 64


def _pool_setup(node: Node, ctx: LowerContext, types=FLOATS):
    """The pieces of a pool's statements. With the node's ``polyc_layout`` ``"nhwc"``
    (:func:`..onnx_layout.sink_transposes`) the input and output are channel-last: the
    indices put ``c`` last, the ranges keep their order ``n, c, o.., k..``."""
    x, y = node.inputs[0], node.outputs[0]
    check_nonempty(node, ctx, x, y)
    dt = check_dtype(node, ctx, x, types)
    nhwc = node.attr("polyc_layout", "") == "nhwc"
    xs, ys = ctx.shape(x), ctx.shape(y)
    if nhwc:  # as NCHW shapes
        xs, ys = (xs[0], xs[-1]) + tuple(xs[1:-1]), (ys[0], ys[-1]) + tuple(ys[1:-1])
    k = len(xs) - 2
    if k < 1:
        raise unsupported(node, f"input rank {len(xs)} (at least 3: N, C, spatial...)")
    kernel = node.attr("kernel_shape")
    if kernel is None or len(kernel) != k:
        raise unsupported(node, f"kernel_shape={kernel} for {k} spatial dimensions")
    if int(node.attr("storage_order", 0)) != 0 and len(node.outputs) > 1:
        raise unsupported(node, "storage_order=1 is not supported")
    win = Window(node, xs[2:], ys[2:], [int(v) for v in kernel])
    o, r = names("o", k), names("k", k)
    out_idx = _pool_index(node, o)
    ranges = [("n", 0, ys[0]), ("c", 0, ys[1])] + [(o[d], 0, ys[d + 2]) for d in range(k)] + \
        [(r[d], 0, win.kernel[d]) for d in range(k)]
    xread = read(ctx.name(x), _pool_index(node, [win.index(d, o[d], r[d]) for d in range(k)]))
    return x, y, dt, win, o, r, out_idx, ranges, xread


def _pool_index(node: Node, spatial: list[str]) -> list[str]:
    """A pool's element at ``spatial``: ``n, c, spatial..`` (``n, spatial.., c``
    channel-last)."""
    if node.attr("polyc_layout", "") == "nhwc":
        return ["n"] + spatial + ["c"]
    return ["n", "c"] + spatial


def _interior(win: Window) -> list[tuple[int, int]] | None:
    """Per spatial dimension, the outputs ``[lo, hi)`` whose window taps all lie inside
    the input; None when that box is empty or the window too large to unroll."""
    if int(np.prod(win.kernel)) > POOL_UNROLL:
        return None
    box = []
    for d in range(len(win.kernel)):
        s, b = win.strides[d], win.begin[d]
        last = (win.kernel[d] - 1) * win.dilations[d]
        lo = max(0, -(-b // s))  # o*s - b >= 0
        hi = min(win.out_sp[d], (win.in_sp[d] - 1 + b - last) // s + 1)  # o*s+last-b < in
        if lo >= hi:
            return None
        box.append((lo, hi))
    return box


def _taps(ctx: LowerContext, x: str, win: Window, o: list[str]) -> list[str]:
    """The reads of every window tap at output ``o`` (the kernel offsets as constants)."""
    k = len(o)
    out = []
    for offs in np.ndindex(*win.kernel):
        idx = [affine([(win.strides[d], o[d])], offs[d] * win.dilations[d] - win.begin[d])
               for d in range(k)]
        out.append(read(ctx.name(x), _pool_index(win.node, idx)))
    return out


def _summed_wide(taps: list[str], dt: str) -> tuple[list[str], str]:
    """Unrolled taps to sum, and the type they are summed in: float16 and bfloat16 taps
    as float32 (rounded once, at the store), as the reduction form of the same pool is
    (:mod:`polyc.widen`) and as numpy and onnxruntime sum them; a sum in float16 rounds
    at every addition (ResNet-50's 7x7 average pool: 48 roundings, 9x slower)."""
    d = D.get(dt)
    if not d.storage_only:
        return taps, dt
    return [f"{d.compute}({t})" for t in taps], d.compute


def _tree(terms: list[str], combine) -> str:
    """``terms`` combined pairwise into a balanced tree (independent operations)."""
    while len(terms) > 1:
        terms = [combine(terms[i], terms[i + 1]) if i + 1 < len(terms) else terms[i]
                 for i in range(0, len(terms), 2)]
    return terms[0]


def _border(win: Window, box: list[tuple[int, int]], o: list[str]) \
        -> list[list[tuple[str, int, int]]]:
    """The output ranges of the border around the interior ``box`` as disjoint boxes.
    When the interior stops short of the output's extent in some dimension, the first
    box ends at the extent in every dimension: the first statement writing a tensor
    gives it its shape (see :func:`_shape_first`)."""
    k = len(o)
    full = [(0, win.out_sp[d]) for d in range(k)]
    first = [d for d in range(k) if box[d][1] < full[d][1]]
    order = first[:1] + [d for d in range(k) if d not in first[:1]]
    slabs = []
    for pos, d in enumerate(order):
        rng = {e: (box[e] if e in order[:pos] else full[e]) for e in range(k)}
        for lo, hi in ((box[d][1], full[d][1]), (0, box[d][0])):  # the high side first
            if lo < hi:
                rng[d] = (lo, hi)
                slabs.append([(o[e], *rng[e]) for e in range(k)])
    return slabs


@register("MaxPool")
def max_pool(node: Node, ctx: LowerContext) -> Lowered:
    if len(node.outputs) > 1 and node.outputs[1]:
        raise unsupported(node, "the Indices output is not supported (supported: MaxPool "
                                "with its first output only)")
    # integers too (opset 12): the padded elements are never read
    x, y, dt, win, o, r, out_idx, ranges, xread = _pool_setup(
        node, ctx, FLOATS + ("int8", "uint8"))
    target = lhs(ctx.name(y), out_idx)
    # padded elements are -inf, max's identity: the unguarded read restricts the domain
    box = _interior(win)
    if box is None:
        return Lowered([f"{target} max=! {xread}{where(ranges)}"])
    k, nc = len(o), ranges[:2]
    value = _tree(_taps(ctx, x, win, o), lambda a, b: f"max({a}, {b})")
    inner = f"{target} = {value}{where(nc + [(o[d], *box[d]) for d in range(k)])}"
    border = [f"{target} max=! {xread}{where(nc + slab + ranges[2 + k:])}"
              for slab in _border(win, box, o)]
    return Lowered(_shape_first(win, box, border, inner))


def _shape_first(win: Window, box: list[tuple[int, int]], border: list[str],
                 inner: str) -> list[str]:
    """The border and interior statements, the first giving the output its shape: the
    first border slab, or the interior when it ends at the output's extent."""
    if any(box[d][1] < win.out_sp[d] for d in range(len(box))):
        return border + [inner]
    return [inner] + border


@register("LpPool")
def lp_pool(node: Node, ctx: LowerContext) -> Lowered:
    """``(sum of |x|^p over the window's taps inside the input)^(1/p)`` (padding counts
    0: the unguarded read restricts the sum to the taps inside)."""
    x, y, dt, win, o, r, out_idx, ranges, xread = _pool_setup(node, ctx)
    p = node.attr("p", 2)
    p = float(p)
    if p <= 0:
        raise unsupported(node, f"p={p} (must be positive)")
    term = (f"fabs({xread})" if p == 1 else f"{xread} * {xread}" if p == 2
            else f"pow(fabs({xread}), {literal(p, dt)})")
    target = lhs(ctx.name(y), out_idx)
    root = (target if p == 1 else f"sqrt({target})" if p == 2
            else f"pow({target}, {literal(1.0 / p, dt)})")
    outs = ranges[:2 + len(o)]
    stmts = [f"{target} +=! {term}{where(ranges)}"]
    if p != 1:
        stmts.append(f"{target} = {root}{where(outs)}")
    return Lowered(stmts)


@register("AveragePool")
def average_pool(node: Node, ctx: LowerContext) -> Lowered:
    """A sum, divided by the window size: the elements inside the input
    (count_include_pad=0) or inside the padded input (=1), per output position."""
    x, y, dt, win, o, r, out_idx, ranges, xread = _pool_setup(node, ctx)
    k = len(o)
    include = int(node.attr("count_include_pad", 0))
    target = lhs(ctx.name(y), out_idx)
    box = _interior(win)
    nc = ranges[:2]
    if box is None:
        out_sets = [[(o[d], 0, win.out_sp[d]) for d in range(k)]]
    else:
        out_sets = _border(win, box, o)
    stmts = [f"{target} +=! {xread}{where(nc + rs + ranges[2 + k:])}" for rs in out_sets]
    if box is not None:
        # inside the input every window counts all its taps
        taps, wide = _summed_wide(_taps(ctx, x, win, o), dt)
        total = literal(float(np.prod(win.kernel)), wide)
        value = _tree(taps, lambda a, b: f"({a} + {b})")
        inner = f"{target} = ({value}) / {total}" \
            f"{where(nc + [(o[d], *box[d]) for d in range(k)])}"
        stmts = _shape_first(win, box, stmts, inner)
    # the count of each spatial dimension, per output index (separable)
    counts = []
    for d in range(k):
        lo, hi = (-win.begin[d], win.in_sp[d] + win.end[d]) if include else (0, win.in_sp[d])
        pos = (np.arange(win.out_sp[d])[:, None] * win.strides[d]
               + np.arange(win.kernel[d])[None, :] * win.dilations[d] - win.begin[d])
        counts.append(((pos >= lo) & (pos < hi)).sum(axis=1))
    if all((c == c[0]).all() for c in counts):
        total = int(np.prod([c[0] for c in counts]))
        stmts += [f"{target} = {target} / {literal(float(total), dt)}{where(nc + rs)}"
                  for rs in out_sets]
        return Lowered(stmts)
    # a count statement over the kernel offsets of the varying dimensions; the others
    # contribute their constant count
    cnt = ctx.temp("pool_count")
    cguards, cranges, factor = [], [(o[d], 0, win.out_sp[d]) for d in range(k)], 1
    for d in range(k):
        if (counts[d] == counts[d][0]).all():
            factor *= int(counts[d][0])
            continue
        lo, hi = (-win.begin[d], win.in_sp[d] + win.end[d]) if include else (0, win.in_sp[d])
        cguards += win.guards(d, o[d], r[d], lo, hi)
        cranges.append((r[d], 0, win.kernel[d]))
    one, zero = literal(float(factor), dt), literal(0.0, dt)
    stmts.insert(0, f"{cnt}({', '.join(o)}) +=! {guarded(cguards, one, zero)}"
                    f"{where(cranges)}")
    stmts += [f"{target} = {target} / {cnt}({', '.join(o)}){where(nc + rs)}"
              for rs in out_sets]
    return Lowered(stmts)


def _global_pool(node: Node, ctx: LowerContext, op: str) -> Lowered:
    """A sum (then divided by the plane's size) or a max over each plane. With the
    node's ``polyc_layout`` ``"nhwc"`` (:func:`..onnx_layout.sink_transposes`), input and
    output are channel-last: the channels, innermost, are the vector loop, and the
    channel-last conv before it needs no transposition back to NCHW."""
    x, y = node.inputs[0], node.outputs[0]
    check_nonempty(node, ctx, x, y)
    dt = check_dtype(node, ctx, x, FLOATS)
    xs = ctx.shape(x)
    if node.attr("polyc_layout", "") == "nhwc":  # as NCHW shapes
        xs = (xs[0], xs[-1]) + tuple(xs[1:-1])
    k = len(xs) - 2
    if k < 1:
        raise unsupported(node, f"input rank {len(xs)} (at least 3: N, C, spatial...)")
    z, r = names("z", k), names("k", k)
    out_idx = _pool_index(node, z)
    target = lhs(ctx.name(y), out_idx)
    ranges = [("n", 0, xs[0]), ("c", 0, xs[1])] + [(i, 0, 1) for i in z] + \
        [(r[d], 0, xs[d + 2]) for d in range(k)]
    if int(np.prod(xs[2:])) <= POOL_UNROLL:
        # a small plane (ResNet's 7x7): the taps unrolled into a balanced tree, no
        # loop-carried chain through the accumulator
        taps = [read(ctx.name(x), _pool_index(node, [str(i) for i in pos]))
                for pos in np.ndindex(*xs[2:])]
        wide = dt
        if op == "+":
            taps, wide = _summed_wide(taps, dt)
        combine = (lambda a, b: f"({a} + {b})") if op == "+" else \
            (lambda a, b: f"{op}({a}, {b})")
        value = _tree(taps, combine)
        if op == "+":
            value = f"({value}) / {literal(float(np.prod(xs[2:])), wide)}"
        return Lowered([f"{target} = {value}{where(ranges[:2 + k])}"])
    stmts = [f"{target} {op}=! {read(ctx.name(x), _pool_index(node, r))}{where(ranges)}"]
    if op == "+":
        total = int(np.prod(xs[2:]))
        stmts.append(f"{target} = {target} / {literal(float(total), dt)}"
                     f"{where(ranges[:2 + k])}")
    return Lowered(stmts)


@register("GlobalAveragePool")
def global_average_pool(node: Node, ctx: LowerContext) -> Lowered:
    return _global_pool(node, ctx, "+")


@register("GlobalMaxPool")
def global_max_pool(node: Node, ctx: LowerContext) -> Lowered:
    return _global_pool(node, ctx, "max")
