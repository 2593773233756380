"""Ops that place values by index: OneHot, SpaceToDepth, DepthToSpace, TopK,
ScatterElements (and opset 9's Scatter), ScatterND, ReverseSequence, TensorScatter.

polyc's statements write at affine positions, so the ops that would write at positions
read from data are written the other way round, each output element finding what lands
on it:

* OneHot: ``Y(.., d, ..) = I(..) == d (or d - depth) ? on : off``;
* SpaceToDepth (DCR and CRD): each output channel reads its input pixel (an affine read);
* TopK: each element's sort key (:func:`.onnx_ops_select.sort_key`: larger, or
  smaller, first; ties broken by the lower index, as ONNX wants; NaN the highest
  value, as onnx's reference), then the K first keys one after another, each the
  largest below the one before (O(K n) per row; 1000 classes' top 5: 5000 comparisons,
  not a million), and ``Y(.., r, ..)`` reads the element key ``r`` names. Elements of
  64 bits (no room for the index beside them) are ranked instead (``rank(a) =
  #{b : x(b) before x(a)}``, O(n^2)) and ``Y(.., r, ..)`` sums the one whose rank is ``r``;
* ScatterElements: the last update aimed at each element along the axis (or the
  reduction of all of them) replaces (or combines with) the data;
* ReverseSequence and TensorScatter (a KV cache's update): each output element reads
  the input at the position its sequence length or write index gives (a data-dependent
  read, clamped into the tensor; the guard picks it or the old value).
"""
from __future__ import annotations

import numpy as np

from polyc import dtypes as D
from polyc.program import IndexCheck

from .onnx_control import NOT_FLATTENED
from .onnx_graph import LowerContext, Lowered, Node, register
from .onnx_ops_math import cast_to, idx_names, lit, norm_axis, present, ref, stmt, \
    str_attr, temp_stmt, unsupported
from .onnx_ops_select import KEYED, key_index, next_key, same_value, sort_key, sorts_before
from .onnx_ops_shape import keys_weights


@register("OneHot")
def one_hot(node: Node, ctx: LowerContext) -> Lowered:
    ind, depth, values = node.inputs[:3]
    y = node.outputs[0]
    dc = ctx.const(depth)
    if dc is None:
        raise unsupported(node, "depth must be a constant (it is the output's extent)")
    n = int(dc.reshape(-1)[0])
    rank = ctx.rank(y)
    axis = norm_axis(node, node.attr("axis", -1), rank)
    idx = idx_names(rank)
    d = idx[axis]
    src = idx[:axis] + idx[axis + 1:]
    i = f"int64({ref(ctx, ind, src)})"
    on, off = ref(ctx, values, ["1"]), ref(ctx, values, ["0"])
    return Lowered([stmt(ctx, y, idx, "=", f"({i} == {d} || {i} + {n} == {d}) ? "
                                           f"{on} : {off}")])


def _blocks(node: Node, ctx: LowerContext) -> tuple[int, str]:
    """SpaceToDepth's and DepthToSpace's block size and mode, checked."""
    b = int(node.attr("blocksize", 0))
    if b < 1 or ctx.rank(node.inputs[0]) != 4:
        raise unsupported(node, f"blocksize {b} on a rank-{ctx.rank(node.inputs[0])} input")
    mode = str_attr(node, "mode", "DCR")
    if mode not in ("DCR", "CRD"):
        raise unsupported(node, f"mode {mode!r}")
    return b, mode


@register("SpaceToDepth")
def space_to_depth(node: Node, ctx: LowerContext) -> Lowered:
    """Output channel ``q`` holds channel ``c`` at block position ``(i, j)``: DCR
    (depth-major) ``q = (i * b + j) * C + c``, CRD (channel-major) ``q = c * b*b + i * b
    + j``."""
    x, y = node.inputs[0], node.outputs[0]
    b, mode = _blocks(node, ctx)
    c = ctx.shape(x)[1]
    if mode == "CRD":
        ch, i, j = f"q / {b * b}", f"(q % {b * b}) / {b}", f"q % {b}"
    else:
        ch, i, j = f"q % {c}", f"(q / {c}) / {b}", f"(q / {c}) % {b}"
    src = ["n", ch, f"{b}*h + {i}", f"{b}*w + {j}"]
    return Lowered([stmt(ctx, y, ["n", "q", "h", "w"], "=", ref(ctx, x, src))])


@register("DepthToSpace")
def depth_to_space(node: Node, ctx: LowerContext) -> Lowered:
    """SpaceToDepth's inverse: output pixel ``(hh, ww)`` of channel ``c`` reads the
    input channel of its block position ``(hh % b, ww % b)``."""
    x, y = node.inputs[0], node.outputs[0]
    b, mode = _blocks(node, ctx)
    cp = ctx.shape(y)[1]  # the output's channels: C / (b*b)
    i, j = f"hh % {b}", f"ww % {b}"
    ch = f"c * {b * b} + ({i}) * {b} + {j}" if mode == "CRD" else \
        f"(({i}) * {b} + {j}) * {cp} + c"
    return Lowered([stmt(ctx, y, ["n", "c", "hh", "ww"], "=",
                         ref(ctx, x, ["n", ch, f"hh / {b}", f"ww / {b}"]))])


@register("TopK")
def top_k(node: Node, ctx: LowerContext) -> Lowered:
    x = node.inputs[0]
    values, indices = (list(node.outputs) + ["", ""])[:2]
    xs = ctx.shape(x)
    rank = len(xs)
    axis = norm_axis(node, node.attr("axis", -1), rank)
    if not present(node, 1) or ctx.const(node.inputs[1]) is None:  # K is the output's extent
        raise unsupported(node, "K must be a constant (or a value given at compile time)")
    k = int(np.asarray(ctx.const(node.inputs[1])).reshape(-1)[0])
    largest = bool(node.attr("largest", 1))
    dt = ctx.dtype(x)
    n = xs[axis]
    row = idx_names(rank)

    def along(i: str) -> list[str]:
        return row[:axis] + [i] + row[axis + 1:]

    def at(i: str) -> str:
        return ref(ctx, x, along(i))
    out = along("r")
    if dt in KEYED:
        # each entry's sort key (NaN the highest value, as onnx's reference sorts), then
        # the k first one after another: the largest key below the previous one's,
        # O(n) a step (a full ranking of the row was O(n^2))
        key, sel = ctx.temp("key"), ctx.temp("selected")
        ka = f"{key}({', '.join(along('a'))})"
        prev = f"{sel}({', '.join(along('r - 1'))})"
        kshape = tuple(k if d == axis else m for d, m in enumerate(xs))
        stmts = [temp_stmt(ctx, sel, out, kshape, "=", "int64(0)"),  # declares it (scaffold)
                 temp_stmt(ctx, key, along("a"), xs, "=",
                           sort_key(at("a"), dt, "a", n, descending=largest, nan_high=True)),
                 temp_stmt(ctx, sel, out, kshape, "max=!", next_key(ka, prev, "r"),
                           lets=[f"a in 0:{n}"])]
        picked = key_index(f"{sel}({', '.join(out)})", n)
        if values:
            stmts.append(stmt(ctx, values, out, "=", at(f"max(0, min({picked}, {n - 1}))")))
        if indices:
            stmts.append(stmt(ctx, indices, out, "=", f"{ctx.dtype(indices)}({picked})"))
        return Lowered(stmts, scaffold=(0,))
    # 64-bit values: the rank of each entry among its row (ties: the lower index first;
    # NaN the highest value), then the entry at each rank
    a_, b_ = at("a"), at("b")
    first = sorts_before(a_, b_, dt) if largest else sorts_before(b_, a_, dt)
    same = same_value(b_, a_, dt)
    ranks = ctx.temp("rank")
    stmts = [temp_stmt(ctx, ranks, along("a"), list(xs), "+=!",
                       f"({first} || ({same} && b < a)) ? 1 : 0", lets=[f"b in 0:{n}"])]
    rk = f"{ranks}({', '.join(along('a'))})"
    if values:
        stmts.append(stmt(ctx, values, out, "+=!", f"{rk} == r ? {a_} : {lit(0, dt)}",
                          extra=[f"a in 0:{n}"]))
    if indices:
        stmts.append(stmt(ctx, indices, out, "+=!",
                          f"{rk} == r ? {ctx.dtype(indices)}(a) : "
                          f"{lit(0, ctx.dtype(indices))}", extra=[f"a in 0:{n}"]))
    return Lowered(stmts)


@register("ScatterElements", "Scatter")
def scatter_elements(node: Node, ctx: LowerContext) -> Lowered:
    data, ind, upd = node.inputs[:3]
    y = node.outputs[0]
    xs, qs = ctx.shape(data), ctx.shape(ind)
    rank = len(xs)
    axis = norm_axis(node, node.attr("axis", 0), rank)
    red = _reduction(node)
    if ctx.dtype(ind) not in D.INTS:
        raise unsupported(node, f"indices of dtype {ctx.dtype(ind)}")
    idx = idx_names(rank)
    src = idx[:axis] + ["p"] + idx[axis + 1:]
    i = f"int64({ref(ctx, ind, src)})"
    hit = f"({i} == {idx[axis]} || {i} + {xs[axis]} == {idx[axis]})"
    inside = [f"{idx[d]} < {qs[d]}" for d in range(rank) if d != axis and qs[d] < xs[d]]
    cond = " && ".join(inside + [hit])
    old = ref(ctx, data, idx)
    stmts = []
    if red == "none":  # the last update aimed here (ONNX leaves duplicates undefined)
        last = ctx.temp("last")
        stmts.append(temp_stmt(ctx, last, idx, xs, "max=!", f"{cond} ? p : -1",
                               lets=[f"p in 0:{qs[axis]}"]))
        lr = f"{last}({', '.join(idx)})"
        # the update is read where one aims at this element (a guarded, in-range read)
        pick = ref(ctx, upd, idx[:axis] + [f"max(0, {lr})"] + idx[axis + 1:])
        stmts.append(stmt(ctx, y, idx, "=", f"{lr} >= 0 ? {pick} : {old}"))
        return Lowered(stmts)
    return Lowered(_scatter_reduced(ctx, red, y, idx, xs, old, cond, ref(ctx, upd, src),
                                    [f"p in 0:{qs[axis]}"]))


def _reduction(node: Node) -> str:
    red = str_attr(node, "reduction", "none")
    if red not in ("none", "add", "mul", "max", "min"):
        raise unsupported(node, f"reduction {red!r}")
    return red


def _scatter_reduced(ctx: LowerContext, red: str, y: str, idx: list[str], shape, old: str,
                     cond: str, update: str, lets: list[str]) -> list[str]:
    """``Y = old RED (the reduction of every update aimed here)``: the updates where
    ``cond`` holds, reduced over the ``lets`` ranges into a temporary (the reduction's
    identity elsewhere), then combined with the data."""
    dt = ctx.dtype(y)
    ident = {"add": 0, "mul": 1, "max": float("-inf"), "min": float("inf")}[red]
    if D.get(dt).is_int and red in ("max", "min"):
        ident = D.get(dt).limits[0 if red == "max" else 1]
    op = {"add": "+=!", "mul": "*=!", "max": "max=!", "min": "min=!"}[red]
    acc = ctx.temp("acc")
    a = f"{acc}({', '.join(idx)})"
    combine = {"add": f"{old} + {a}", "mul": f"{old} * {a}", "max": f"max({old}, {a})",
               "min": f"min({old}, {a})"}[red]
    return [temp_stmt(ctx, acc, idx, shape, op, f"({cond}) ? {update} : {lit(ident, dt)}",
                      lets=lets),
            stmt(ctx, y, idx, "=", combine)]


@register("ScatterND")
def scatter_nd(node: Node, ctx: LowerContext) -> Lowered:
    """``Y = data`` with ``Y[I[j]] = U[j]`` (or combined by ``reduction``) for each index
    tuple ``j``: each output element takes the last ``j`` whose tuple addresses it (its
    linear number over ``I``'s leading axes), or reduces all of them."""
    data, ind, upd = node.inputs[:3]
    y = node.outputs[0]
    xs, qs = ctx.shape(data), ctx.shape(ind)
    m = qs[-1]
    lead = list(qs[:-1])
    red = _reduction(node)
    idx = idx_names(len(xs))
    js = [f"j{k}" for k in range(len(lead))]
    lets = [f"{j} in 0:{n}" for j, n in zip(js, lead)]
    hit = " && ".join(
        f"(int64({ref(ctx, ind, js + [str(k)])}) == {idx[k]} || "
        f"int64({ref(ctx, ind, js + [str(k)])}) + {xs[k]} == {idx[k]})" for k in range(m))
    old = ref(ctx, data, idx)
    if red == "none":
        strides = [1] * len(lead)
        for k in range(len(lead) - 2, -1, -1):
            strides[k] = strides[k + 1] * lead[k + 1]
        lin = " + ".join(f"{s}*{j}" for s, j in zip(strides, js)) or "0"
        last = ctx.temp("last")
        lr = f"{last}({', '.join(idx)})"
        stmts = [temp_stmt(ctx, last, idx, xs, "max=!", f"({hit}) ? {lin} : -1", lets=lets)]
        # the addressed update, its leading position recovered from its number
        pos = [f"(max(0, {lr}) / {s}) % {n}" for s, n in zip(strides, lead)]
        pick = ref(ctx, upd, pos + idx[m:])
        return Lowered(stmts + [stmt(ctx, y, idx, "=", f"{lr} >= 0 ? {pick} : {old}")])
    return Lowered(_scatter_reduced(ctx, red, y, idx, xs, old, hit,
                                    ref(ctx, upd, js + idx[m:]), lets))


@register("RotaryEmbedding")
def rotary_embedding(node: Node, ctx: LowerContext) -> Lowered:
    """Rotary position embedding (opset 23): the first ``rotary_embedding_dim`` features
    of each head turned by the cached angles of the token's position, pairs taken as
    the two halves or (``interleaved``) as neighbours; the rest passes through."""
    x, cos, sin = node.inputs[:3]
    pos = node.inputs[3] if present(node, 3) else ""
    y = node.outputs[0]
    xs = ctx.shape(x)
    if len(xs) == 4:
        dim = xs[3]
    elif len(xs) == 3:
        heads = int(node.attr("num_heads", 0))
        if heads <= 0 or xs[2] % heads:
            raise unsupported(node, "a 3-D input needs num_heads dividing its hidden size")
        dim = xs[2] // heads
    else:
        raise unsupported(node, f"input of rank {len(xs)}")
    rot = int(node.attr("rotary_embedding_dim", 0)) or dim
    half = rot // 2
    inter = bool(node.attr("interleaved", 0))
    idx = idx_names(len(xs))
    b, s = idx[0], idx[2] if len(xs) == 4 else idx[1]
    d = idx[3] if len(xs) == 4 else f"{idx[2]} % {dim}"

    def xat(e: str) -> str:
        if len(xs) == 4:
            return ref(ctx, x, idx[:3] + [e])
        return ref(ctx, x, [idx[0], idx[1], f"({idx[2]} / {dim})*{dim} + {e}"])

    def cache(t: str, i: str) -> str:
        if pos:
            return ref(ctx, t, [f"int64({ref(ctx, pos, [b, s])})", i])
        return ref(ctx, t, [b, s, i])
    if inter:   # pairs (2i, 2i+1)
        i = f"({d}) / 2"
        even = f"{xat(f'({d}) - ({d}) % 2')}"
        odd = f"{xat(f'({d}) - ({d}) % 2 + 1')}"
        turned = (f"({d}) % 2 == 0 ? {even} * {cache(cos, i)} - {odd} * {cache(sin, i)} : "
                  f"{odd} * {cache(cos, i)} + {even} * {cache(sin, i)}")
    else:       # halves (i, i + rot/2)
        lo, hi = f"({d}) % {half}", f"({d}) % {half} + {half}"
        c, sn = cache(cos, lo), cache(sin, lo)
        turned = (f"({d}) < {half} ? {xat(lo)} * {c} - {xat(hi)} * {sn} : "
                  f"{xat(hi)} * {c} + {xat(lo)} * {sn}")
    value = f"({d}) < {rot} ? ({turned}) : {ref(ctx, x, idx)}" if rot < dim else turned
    return Lowered([stmt(ctx, y, idx, "=", value)])


@register("CenterCropPad")
def center_crop_pad(node: Node, ctx: LowerContext) -> Lowered:
    """Each listed axis cropped to the target size around its centre, or padded with
    zeros around it (the extra element of an odd difference going to the end)."""
    x, y = node.inputs[0], node.outputs[0]
    xs, ys = ctx.shape(x), ctx.shape(y)
    idx = idx_names(len(xs))
    src, conds = [], []
    for k, (n, m) in enumerate(zip(xs, ys)):
        if m < n:      # crop: start at (n - m) / 2
            src.append(f"{idx[k]} + {(n - m) // 2}")
        elif m > n:    # pad: the data starts at (m - n) / 2
            off = (m - n) // 2
            src.append(f"{idx[k]} - {off}")
            conds += [f"{idx[k]} >= {off}", f"{idx[k]} < {off + n}"]
        else:
            src.append(idx[k])
    value = ref(ctx, x, src)
    if conds:
        value = f"({' && '.join(conds)}) ? {value} : {lit(0, ctx.dtype(y))}"
    return Lowered([stmt(ctx, y, idx, "=", value)])


@register("GridSample")
def grid_sample(node: Node, ctx: LowerContext) -> Lowered:
    """``Y(n, c, o..) = X(n, c)`` sampled at ``grid(n, o..)`` (normalized to [-1, 1],
    its last axis the spatial axes in reverse order), as ONNX (and PyTorch) define it:
    the coordinate denormalized (``align_corners``), rounded to even for ``nearest``,
    brought into the input by ``padding_mode`` (border: clamped; reflection: reflected
    at the borders), then the 1, 2 or 4 taps per axis of nearest, linear or cubic
    (a = -0.75) interpolation, a tap outside the input reading 0 (zeros), the edge
    (border) or its reflection. Sample positions are data: the reads are indirect,
    their indices kept inside the input."""
    x, grid = node.inputs[:2]
    y = node.outputs[0]
    xs, gs = ctx.shape(x), ctx.shape(grid)
    k = len(xs) - 2
    mode = str_attr(node, "mode", "linear")
    mode = {"bilinear": "linear", "bicubic": "cubic"}.get(mode, mode)
    pad = str_attr(node, "padding_mode", "zeros")
    if mode not in ("nearest", "linear", "cubic") or pad not in ("zeros", "border",
                                                                  "reflection"):
        raise unsupported(node, f"mode {mode!r} with padding_mode {pad!r}")
    if mode == "cubic" and k != 2:
        raise unsupported(node, "cubic sampling of a volume")
    align = bool(node.attr("align_corners", 0))
    dt = ctx.dtype(y)
    o = [f"o{d}" for d in range(k)]
    # each axis's sampling coordinate in a temporary of its own: a let would be
    # substituted into every tap and weight (16 of each for cubic), and reflection reads
    # the coordinate eight times
    stmts, lets = [], []
    space = [("n", 0, xs[0])] + [(o[d], 0, gs[1 + d]) for d in range(k)]
    for d in range(k):  # spatial axis d (H, W...) takes grid component k-1-d
        n = xs[2 + d]
        g = f"double({ref(ctx, grid, ['n'] + o + [str(k - 1 - d)])})"
        v = f"(({g} + 1.0) / 2.0 * {float(n - 1)!r})" if align else \
            f"((({g} + 1.0) * {float(n)!r} - 1.0) / 2.0)"
        if mode == "nearest":
            v = f"round({v})"
        lo, hi = (0.0, n - 1.0) if align else (-0.5, n - 0.5)
        own = [f"u = {v}"]
        if pad == "border":
            v = f"max(0.0, min({n - 1.0!r}, u))"
        elif pad == "reflection":
            v = _reflect("u", lo, hi, "", own)
        else:
            v = "u"
        coord = ctx.temp(f"coord{d}")
        stmts.append(f"{coord}({', '.join(['n'] + o)}) = {v} where "
                     f"{', '.join(own + [f'{i} in {a}:{b}' for i, a, b in space])}")
        lets.append(f"p{d} = {coord}({', '.join(['n'] + o)})")
        lets.append(f"f{d} = floor(p{d})")
        lets.append(f"t{d} = p{d} - f{d}")

    def tap(d: int, off: int) -> tuple[str, str]:
        """(index, condition) of the tap ``off`` from the floor on axis ``d``."""
        n = xs[2 + d]
        i = f"int64(f{d}) + {off}" if mode != "nearest" else f"int64(p{d})"
        if pad == "zeros":
            return f"min(max({i}, 0), {n - 1})", f"({i} >= 0 && {i} < {n})"
        if pad == "border":
            return f"min(max({i}, 0), {n - 1})", ""
        lo, hi = (0.0, n - 1.0) if align else (-0.5, n - 0.5)
        name = f"r{d}_{off + 1}"
        lets.append(f"{name} = int64({_reflect(f'double({i})', lo, hi, f'{d}_{off + 1}', lets)})")
        return f"min(max({name}, 0), {n - 1})", ""

    def weights(d: int) -> list[tuple[int, str]]:
        t = f"t{d}"
        if mode == "nearest":
            return [(0, "1.0")]
        if mode == "linear":
            return [(0, f"(1.0 - {t})"), (1, t)]
        return list(zip((-1, 0, 1, 2), keys_weights(t)))
    per_axis = [[(tap(d, off), w) for off, w in weights(d)] for d in range(k)]
    terms = []

    def combos(d: int, picked: list):
        if d == k:
            idx = ["n", "c"] + [p[0][0] for p in picked]
            conds = [p[0][1] for p in picked if p[0][1]]
            value = f"double({ref(ctx, x, idx)})"
            if conds:
                value = f"({' && '.join(conds)} ? {value} : 0.0)"
            terms.append(" * ".join([p[1] for p in picked if p[1] != "1.0"] + [value]))
            return
        for choice in per_axis[d]:
            combos(d + 1, picked + [choice])
    combos(0, [])
    clauses = lets + [f"n in 0:{xs[0]}", f"c in 0:{xs[1]}"] + \
        [f"{o[d]} in 0:{gs[1 + d]}" for d in range(k)]
    return Lowered(stmts + [f"{ref(ctx, y, ['n', 'c'] + o)} = "
                            f"{cast_to(dt, ' + '.join(terms))} where {', '.join(clauses)}"])


def _reflect(v: str, lo: float, hi: float, tag, lets: list[str]) -> str:
    """``v`` reflected at ``lo`` and ``hi`` until it lies between them (as ONNX's
    GridSample: by the number of whole spans past the near border, even or odd)."""
    span = hi - lo
    below, above = f"q{tag}", f"w{tag}"
    lets.append(f"{below} = {lo!r} - {v}")           # distance below lo
    lets.append(f"{above} = {v} - {hi!r}")           # distance above hi
    nb = f"floor({below} / {span!r})"
    na = f"floor({above} / {span!r})"
    rb = f"({below} - {nb} * {span!r})"
    ra = f"({above} - {na} * {span!r})"
    from_below = f"(int64({nb}) % 2 == 0 ? {lo!r} + {rb} : {hi!r} - {rb})"
    from_above = f"(int64({na}) % 2 == 0 ? {hi!r} - {ra} : {lo!r} + {ra})"
    return f"({v} < {lo!r} ? {from_below} : ({v} > {hi!r} ? {from_above} : {v}))"


@register("AffineGrid")
def affine_grid(node: Node, ctx: LowerContext) -> Lowered:
    """The sampling grid of an affine transform: ``grid(n, o.., c) = sum_k theta(n, c, k)
    * base_k(o) + theta(n, c, K)``, the base coordinates normalized to [-1, 1] (pixel
    centres, or with ``align_corners`` the corner pixels) in the order x, y(, z)."""
    theta, y = node.inputs[0], node.outputs[0]
    ys = ctx.shape(y)
    k = len(ys) - 2        # spatial axes
    align = bool(node.attr("align_corners", 0))
    o = [f"o{d}" for d in range(k)]

    def base(d: int) -> str:  # coordinate along spatial axis d (o[d]), normalized
        n = ys[1 + d]
        if n == 1:
            return "0.0"
        if align:
            return f"(2.0 * double({o[d]}) / {float(n - 1)!r} - 1.0)"
        return f"((2.0 * double({o[d]}) + 1.0) / {float(n)!r} - 1.0)"
    # theta's columns: x (the last spatial axis), y, (z), then the translation
    terms = [f"double({ref(ctx, theta, ['n', 'c', str(j)])}) * {base(k - 1 - j)}"
             for j in range(k)]
    terms.append(f"double({ref(ctx, theta, ['n', 'c', str(k)])})")
    return Lowered([stmt(ctx, y, ["n"] + o + ["c"], "=",
                         cast_to(ctx.dtype(y), " + ".join(terms)))])


@register("DFT")
def dft(node: Node, ctx: LowerContext) -> Lowered:
    """The discrete Fourier transform along one axis, as a contraction with the twiddle
    factors ``exp(-+2 pi i k m / N)`` computed in double from ``(k m) mod N``: real or
    complex input (last axis 1 or 2), ``onesided`` output (forward) or input (inverse:
    the missing half from Hermitian symmetry), ``inverse`` divided by ``N``."""
    x, y = node.inputs[0], node.outputs[0]
    xs, ys = ctx.shape(x), ctx.shape(y)
    rank = len(xs)
    if ctx.graph.opset >= 20:
        ac = ctx.const(node.inputs[2]) if present(node, 2) else None
        if present(node, 2) and ac is None:
            raise unsupported(node, "axis must be a constant or a value given at compile time")
        axis = int(ac.reshape(-1)[0]) if ac is not None else -2
    else:
        axis = int(node.attr("axis", 1))
    axis = axis + rank if axis < 0 else axis
    if not 0 <= axis < rank - 1:
        raise unsupported(node, f"axis {axis} (the last axis holds real and imaginary parts)")
    inverse = bool(node.attr("inverse", 0))
    onesided = bool(node.attr("onesided", 0))
    m_in = xs[axis]
    if present(node, 1):
        lc = ctx.const(node.inputs[1])
        if lc is None:
            raise unsupported(node, "dft_length must be a constant or given at compile time")
        n = int(lc.reshape(-1)[0])
    else:
        n = 2 * (m_in - 1) if (inverse and onesided) else m_in
    complex_in = xs[-1] == 2
    idx = idx_names(rank)
    k, m = idx[axis], "m"

    def part(p: int, j: str) -> str:  # real (0) or imaginary (1) input at position j
        if p == 1 and not complex_in:
            return "0.0"
        return f"double({ref(ctx, x, idx[:axis] + [j] + idx[axis + 1:-1] + [str(p)])})"
    count = m_in
    if inverse and onesided:  # bins past the stored half: conj(X[N - j])
        re = f"({m} < {m_in} ? {part(0, m)} : {part(0, f'{n} - {m}')})"
        im = f"({m} < {m_in} ? {part(1, m)} : -{part(1, f'{n} - {m}')})"
        count = n
    else:
        re, im = part(0, m), part(1, m)
        count = min(m_in, n)
    sign = 1.0 if inverse else -1.0
    theta = f"({2 * 3.141592653589793 / n!r} * double(({k} * {m}) % {n}))"
    cos_, sin_ = f"cos({theta})", f"{sign!r} * sin({theta})"
    # (re + i im)(cos + i s) = re cos - im s + i (re s + im cos)
    value = (f"c == 0 ? {re} * {cos_} - {im} * {sin_} : {re} * {sin_} + {im} * {cos_}")
    acc = ctx.temp("dft")
    stmts = [temp_stmt(ctx, acc, idx[:-1] + ["c"], list(ys[:-1]) + [2], "+=!", value,
                       lets=[f"{m} in 0:{count}"])]
    out = f"{acc}({', '.join(idx[:-1] + [idx[-1]])})"
    if inverse:
        out = f"{out} / {float(n)!r}"
    return Lowered(stmts + [stmt(ctx, y, idx, "=", cast_to(ctx.dtype(y), out))])


@register("Col2Im")
def col2im(node: Node, ctx: LowerContext) -> Lowered:
    """Column blocks summed back into an image (the inverse of im2col): each output pixel
    adds, over the kernel offsets ``b``, the column entry of the block position ``l``
    with ``l * stride + b * dilation - pad == pixel`` (when one exists)."""
    x, y = node.inputs[0], node.outputs[0]
    ys = ctx.shape(y)
    bc = ctx.const(node.inputs[2])
    if bc is None:
        raise unsupported(node, "block_shape must be a constant or given at compile time")
    block = [int(v) for v in bc.reshape(-1)]
    k = len(block)
    image = list(ys[2:])
    strides = list(node.attr("strides", [1] * k))
    dil = list(node.attr("dilations", [1] * k))
    pads = list(node.attr("pads", [0] * (2 * k)))
    counts = [(image[d] + pads[d] + pads[d + k] - dil[d] * (block[d] - 1) - 1) // strides[d] + 1
              for d in range(k)]
    p = [f"p{d}" for d in range(k)]
    b = [f"b{d}" for d in range(k)]
    conds, ls = [], []
    for d in range(k):
        e = f"({p[d]} + {pads[d]} - {dil[d]}*{b[d]})"
        conds += [f"{e} >= 0", f"{e} % {strides[d]} == 0", f"{e} / {strides[d]} < {counts[d]}"]
        ls.append(f"{e} / {strides[d]}")
    row = "c"
    for d in range(k):
        row = f"({row})*{block[d]} + {b[d]}"
    col = "0"
    for d in range(k):
        col = f"({col})*{counts[d]} + {ls[d]}"
    value = f"({' && '.join(conds)}) ? {ref(ctx, x, ['n', row, col])} : {lit(0, ctx.dtype(y))}"
    return Lowered([stmt(ctx, y, ["n", "c"] + p, "+=!", value,
                         extra=[f"{b[d]} in 0:{block[d]}" for d in range(k)])])


@register("BitCast")
def bit_cast(node: Node, ctx: LowerContext) -> Lowered:
    """The input's bits read as another type of the same width (opset 26)."""
    x, y = node.inputs[0], node.outputs[0]
    src, dst = ctx.dtype(x), ctx.dtype(y)
    if D.get(src).bits != D.get(dst).bits:
        raise unsupported(node, f"{src} and {dst} differ in width")
    idx = idx_names(ctx.rank(x))
    return Lowered([stmt(ctx, y, idx, "=", f"bits_{dst}({ref(ctx, x, idx)})")])


@register("Scan", "If", "Loop")
def control_flow(node: Node, ctx: LowerContext) -> Lowered:
    """Scan, Loop and If are flattened into the graph at import (``onnx_control``); one
    that reaches the lowering could not be (a sequence or optional value, a scan length
    or trip count that is not static, a loop that runs no step, opset 8's batched
    Scan)."""
    raise unsupported(node, NOT_FLATTENED)


@register("ReverseSequence")
def reverse_sequence(node: Node, ctx: LowerContext) -> Lowered:
    x, lens = node.inputs[:2]
    y = node.outputs[0]
    shape = ctx.shape(x)
    rank = len(shape)
    t_axis = norm_axis(node, node.attr("time_axis", 0), rank)
    b_axis = norm_axis(node, node.attr("batch_axis", 1), rank)
    if {t_axis, b_axis} != {0, 1}:
        raise unsupported(node, f"time_axis {t_axis} and batch_axis {b_axis} (0 and 1)")
    idx = idx_names(rank)
    t, n = idx[t_axis], shape[t_axis]
    length = f"int64({ref(ctx, lens, [idx[b_axis]])})"
    back = idx[:t_axis] + [f"max(0, min({n - 1}, {length} - 1 - {t}))"] + idx[t_axis + 1:]
    return Lowered([stmt(ctx, y, idx, "=",
                         f"{t} < {length} ? {ref(ctx, x, back)} : {ref(ctx, x, idx)}")])


@register("TensorScatter")
def tensor_scatter(node: Node, ctx: LowerContext) -> Lowered:
    past, upd = node.inputs[:2]
    y = node.outputs[0]
    shape = ctx.shape(past)
    rank = len(shape)
    axis = norm_axis(node, node.attr("axis", -2), rank)
    if axis == 0:
        raise unsupported(node, "axis 0 (the batch axis)")
    m, s = shape[axis], ctx.shape(upd)[axis]
    circular = str_attr(node, "mode", "linear") == "circular"
    idx = idx_names(rank)
    p = idx[axis]
    start = f"int64({ref(ctx, node.inputs[2], [idx[0]])})" if present(node, 2) else "0"
    d = f"({p} - {start})"
    if circular:  # the distance from the write index, modulo the cache length
        d = f"((({p} - {start}) % {m} + {m}) % {m})"
    at = idx[:axis] + [f"max(0, min({s - 1}, {d}))"] + idx[axis + 1:]
    return Lowered([stmt(ctx, y, idx, "=",
                         f"({d} >= 0 && {d} < {s}) ? {ref(ctx, upd, at)} : "
                         f"{ref(ctx, past, idx)}")])


@register("RoiAlign")
def roi_align(node: Node, ctx: LowerContext) -> Lowered:
    """Each output bin averages (or takes the largest of) a grid of bilinear samples of
    its region of interest, as onnx's reference and onnxruntime: per axis, each sample's
    two taps and weights are temporaries over (roi, bin, sample), the taps read at run
    time (clamped into the map); a sample outside ``[-1, extent]`` counts as 0."""
    x, rois, bidx = node.inputs[:3]
    y = node.outputs[0]
    n, _, height, width = ctx.shape(x)
    nr = ctx.shape(rois)[0]
    dt = ctx.dtype(x)
    oh, ow = int(node.attr("output_height", 1)), int(node.attr("output_width", 1))
    ratio = int(node.attr("sampling_ratio", 0))
    scale = float(node.attr("spatial_scale", 1.0))
    mode = str_attr(node, "mode", "avg")
    transform = str_attr(node, "coordinate_transformation_mode",
                         "half_pixel" if ctx.graph.opset >= 16 else "output_half_pixel")
    if mode not in ("avg", "max") or transform not in ("half_pixel", "output_half_pixel"):
        raise unsupported(node, f"mode {mode!r} with coordinate_transformation_mode "
                                f"{transform!r}")
    if ratio <= 0:
        raise unsupported(node, "sampling_ratio 0 (a grid whose size depends on each "
                                "region's size): give a positive sampling_ratio")
    half = transform == "half_pixel"
    f = "float32"

    def roi(k: int) -> str:
        v = f"{cast_to(f, ref(ctx, rois, ['r', str(k)]))} * {lit(scale, f)}"
        return f"({v} - {lit(0.5, f)})" if half else f"({v})"
    stmts: list[str] = []
    taps: dict[str, tuple[str, str, str, str]] = {}
    for axis, k0, bins, extent in (("y", 1, oh, height), ("x", 0, ow, width)):
        size = f"({roi(k0 + 2)} - {roi(k0)})"
        if not half:
            size = f"max({size}, {lit(1.0, f)})"
        step = f"({size} / {lit(float(bins), f)})"  # a bin's extent
        pos = (f"({roi(k0)} + {cast_to(f, 'p')} * {step} + ({cast_to(f, 's')} + "
               f"{lit(0.5, f)}) * {step} / {lit(float(ratio), f)})")
        lo, hi, frac, ok = (ctx.temp(f"{axis}_{w}") for w in ("lo", "hi", "frac", "ok"))
        shape = (nr, bins, ratio)
        at = ["r", "p", "s"]
        clamped = f"max({pos}, {lit(0.0, f)})"
        low = f"int64({clamped})"
        stmts += [temp_stmt(ctx, ok, at, shape, "=",
                            f"({pos} < {lit(-1.0, f)} || {pos} > {lit(float(extent), f)}) ? "
                            f"{lit(0.0, f)} : {lit(1.0, f)}"),
                  temp_stmt(ctx, lo, at, shape, "=", f"min({low}, {extent - 1})"),
                  temp_stmt(ctx, hi, at, shape, "=", f"min({low} + 1, {extent - 1})"),
                  temp_stmt(ctx, frac, at, shape, "=",
                            f"{low} >= {extent - 1} ? {lit(0.0, f)} : {clamped} - "
                            f"{cast_to(f, low)}")]
        taps[axis] = (lo, hi, frac, ok)
    (ylo, yhi, ly, vy), (xlo, xhi, lx, vx) = taps["y"], taps["x"]
    b = f"max(0, min({n - 1}, int64({ref(ctx, bidx, ['r'])})))"
    yt = lambda t: f"{t}(r, ph, iy)"  # noqa: E731
    xt = lambda t: f"{t}(r, pw, ix)"  # noqa: E731

    def v(yy: str, xx: str) -> str:
        return cast_to(f, ref(ctx, x, [b, "c", yt(yy), xt(xx)]))
    one = lit(1.0, f)
    w = {("lo", "lo"): f"({one} - {yt(ly)}) * ({one} - {xt(lx)})",
         ("lo", "hi"): f"({one} - {yt(ly)}) * {xt(lx)}",
         ("hi", "lo"): f"{yt(ly)} * ({one} - {xt(lx)})",
         ("hi", "hi"): f"{yt(ly)} * {xt(lx)}"}
    names = {"lo": (ylo, xlo), "hi": (yhi, xhi)}
    terms = [f"{yt(vy)} * {xt(vx)} * {w[(a, c)]} * {v(names[a][0], names[c][1])}"
             for a in ("lo", "hi") for c in ("lo", "hi")]
    grid = [f"iy in 0:{ratio}", f"ix in 0:{ratio}"]
    acc = ctx.temp("acc")
    if mode == "avg":
        stmts.append(temp_stmt(ctx, acc, ["r", "c", "ph", "pw"], ctx.shape(y), "+=!",
                               " + ".join(terms), lets=grid))
        value = f"{acc}(r, c, ph, pw) / {lit(float(ratio * ratio), f)}"
    else:
        stmts.append(temp_stmt(ctx, acc, ["r", "c", "ph", "pw"], ctx.shape(y), "max=!",
                               f"max(max({terms[0]}, {terms[1]}), max({terms[2]}, "
                               f"{terms[3]}))", lets=grid))
        value = f"{acc}(r, c, ph, pw)"
    stmts.append(stmt(ctx, y, ["r", "c", "ph", "pw"], "=",
                      value if dt == f else cast_to(dt, value)))
    fixed = ctx.const(bidx)
    if fixed is not None and (np.asarray(fixed) < 0).any() | (np.asarray(fixed) >= n).any():
        raise unsupported(node, f"a batch index of {bidx!r} is out of range (valid: 0 to "
                                f"{n - 1})")
    check = IndexCheck(-1, bidx, 0, n - 1,
                       f"node {node.name!r} (RoiAlign): batch index ",
                       f" of {bidx!r} is out of range (valid: 0 to {n - 1})")
    return Lowered(stmts, checks=() if ctx.const(bidx) is not None else (check,))
