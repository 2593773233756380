"""Ops that select entries by their values: NonZero, Compress, Unique, NonMaxSuppression.

Their outputs are computed at their bound with a count (see :mod:`.onnx_dynamic`), and
written the way polyc writes everything, each output entry finding what lands on it:

* an entry's place among the selected ones is a count -- how many selected entries come
  before it (``pos(k) = #{j < k : selected(j)}``);
* output entry ``r`` sums the one selected entry whose place is ``r`` (zero past the
  count).

Both are O(n^2) in the number of candidates: fine for the index lists, masks and box
sets these ops see in models (thousands), not for millions of elements.

NonMaxSuppression ranks each class's boxes by score (ties: the lower index first, as
onnx's reference and onnxruntime), then keeps them greedily in one loop over the ranks:
box ``r`` is kept when its score passes the threshold, fewer than
``max_output_boxes_per_class`` were kept before it, and no kept box before it overlaps
it by more than ``iou_threshold`` -- a recurrence, so its statements share that loop
(``Lowered.loops``), as the RNNs' steps do. The state from one rank to the next is the
list of the boxes kept so far (``max_output_boxes_per_class`` slots, stored for two
ranks: ``Lowered.folds``) and its length, so each box is tested against the kept ones
only; the tests are all evaluated (no ``&&``), and the step's loops run as vectors over
the classes. The ranks are one square of comparisons, O(n^2) but vectorized: each row a
loop of constant length (two triangles, the boxes before and after each one, did the
same comparisons in loops of varying length, whose remainders gcc ran one by one: the
benchmarks' detector tail took 1.6 ms with them, 1.4 ms without).
"""
from __future__ import annotations

import numpy as np

from .onnx_dynamic import count_of
from .onnx_graph import LowerContext, Lowered, Node, register
from .onnx_ops_math import FLOATS, idx_names, lit, norm_axis, present, ref, stmt, temp_stmt, \
    unsupported


def _strides(shape: tuple[int, ...]) -> list[int]:
    out, s = [], 1
    for n in reversed(shape):
        out.append(s)
        s *= n
    return out[::-1]


def _linear(idx: list[str], shape: tuple[int, ...]) -> str:
    """The row-major position of ``idx`` in ``shape``."""
    terms = [i if s == 1 else f"{s}*{i}" for i, s, n in zip(idx, _strides(shape), shape)
             if n != 1]
    return " + ".join(terms) or "0"


def _unravel(k: str, shape: tuple[int, ...]) -> list[str]:
    """The multi-index of row-major position ``k`` in ``shape``."""
    out = []
    for d, (s, n) in enumerate(zip(_strides(shape), shape)):
        if n == 1:
            out.append("0")
            continue
        e = k if s == 1 else f"({k}) / {s}"
        out.append(e if d == 0 else f"({e}) % {n}")
    return out


def _pick(k: str, values: list[str]) -> str:
    """``values[k]`` for a small iterator ``k``."""
    out = values[-1]
    for i in range(len(values) - 2, -1, -1):
        out = f"({k} == {i} ? {values[i]} : {out})"
    return out


def _all(conds: list[str]) -> str:
    """1 where every condition holds, else 0 -- each one evaluated (C's ``&&`` skips the
    rest after a false one: control flow, which keeps gcc from vectorizing the loop)."""
    return " * ".join(f"({c} ? 1 : 0)" for c in conds)


def _truth(ctx: LowerContext, tensor: str, idx: list[str]) -> str:
    r = ref(ctx, tensor, idx)
    dt = ctx.dtype(tensor)
    return f"({r} != 0)" if dt == "bool" else f"({r} != {lit(0, dt)})"


def _same(a: str, b: str, dt: str) -> str:
    """``a`` and ``b`` are the same value (NaNs all the same, as numpy's unique)."""
    return f"({a} == {b} || ({a} != {a} && {b} != {b}))" if dt in FLOATS else f"({a} == {b})"


def _before(a: str, b: str, dt: str) -> str:
    """``a`` sorts strictly before ``b`` (NaN last, as numpy)."""
    return f"({a} < {b} || ({a} == {a} && {b} != {b}))" if dt in FLOATS else f"({a} < {b})"


def _count_stmt(ctx: LowerContext, node: Node, value: str, ranges: list[str]) -> list[str]:
    count = count_of(node)
    if count is None:
        return []
    return [f"{ctx.name(count)} +=! {value} ? 1 : 0 where {', '.join(ranges)}"]


@register("NonZero")
def non_zero(node: Node, ctx: LowerContext) -> Lowered:
    x, y = node.inputs[0], node.outputs[0]
    shape = ctx.shape(x)
    if not shape:
        raise unsupported(node, "a rank-0 input")
    i, j = idx_names(len(shape), "i"), idx_names(len(shape), "j")
    rng_i = [f"{a} in 0:{m}" for a, m in zip(i, shape)]
    rng_j = [f"{a} in 0:{m}" for a, m in zip(j, shape)]
    pos = ctx.temp("pos")
    stmts = [temp_stmt(ctx, pos, i, shape, "+=!",
                       f"({_linear(j, shape)} < {_linear(i, shape)} && {_truth(ctx, x, j)})"
                       f" ? 1 : 0", lets=rng_j)]
    coord = _pick("d", [f"int64({a})" for a in i])
    stmts.append(stmt(ctx, y, ["d", "r"], "+=!",
                      f"({_truth(ctx, x, i)} && {pos}({', '.join(i)}) == r) ? {coord} : 0",
                      extra=rng_i))
    stmts += _count_stmt(ctx, node, _truth(ctx, x, i), rng_i)
    return Lowered(stmts)


@register("Compress")
def compress(node: Node, ctx: LowerContext) -> Lowered:
    x, cond = node.inputs[:2]
    y = node.outputs[0]
    xs = ctx.shape(x)
    length = ctx.shape(cond)[0]
    axis = node.attr("axis")
    pos = ctx.temp("pos")
    stmts = [temp_stmt(ctx, pos, ["k"], (length,), "+=!",
                       f"(j < k && {_truth(ctx, cond, ['j'])}) ? 1 : 0",
                       lets=[f"j in 0:{length}"])]
    take = f"({_truth(ctx, cond, ['k'])} && {pos}(k) == r)"
    if axis is None:  # the input flattened
        src, out = _unravel("k", xs), ["r"]
    else:
        a = norm_axis(node, int(axis), len(xs))
        out = idx_names(len(xs))
        out[a] = "r"
        src = list(out)
        src[a] = "k"
    dt = ctx.dtype(y)
    stmts.append(stmt(ctx, y, out, "+=!", f"{take} ? {ref(ctx, x, src)} : {lit(0, dt)}",
                      extra=[f"k in 0:{length}"]))
    stmts += _count_stmt(ctx, node, _truth(ctx, cond, ["k"]), [f"k in 0:{length}"])
    return Lowered(stmts)


@register("Unique")
def unique(node: Node, ctx: LowerContext) -> Lowered:
    x = node.inputs[0]
    y, first_idx, inverse, counts = (list(node.outputs) + [""] * 4)[:4]
    xs = ctx.shape(x)
    dt = ctx.dtype(x)
    axis = node.attr("axis")
    ordered = bool(node.attr("sorted", 1))
    stmts: list[str] = []
    if axis is None:
        n = int(np.prod(xs))
        other: list[str] = []
        oshape: tuple[int, ...] = ()

        def at(k: str, o: list[str]) -> str:
            return ref(ctx, x, _unravel(k, xs))
        same = lambda j, k: _same(at(j, []), at(k, []), dt)  # noqa: E731
        less = lambda j, k: _before(at(j, []), at(k, []), dt)  # noqa: E731
    else:
        a = norm_axis(node, int(axis), len(xs))
        n = xs[a]
        oshape = tuple(m for d, m in enumerate(xs) if d != a)
        other = idx_names(len(oshape), "o")

        def at(k: str, o: list[str]) -> str:
            return ref(ctx, x, o[:a] + [k] + o[a:])
        # slices compared entry by entry (row-major): where they first differ
        width = int(np.prod(oshape))
        diff, lt = ctx.temp("diff"), ctx.temp("lt")
        pos = _linear(other, oshape)
        xj, xk = at("j", other), at("k", other)
        for name, op, value in (
                (diff, "min=!", f"{_same(xj, xk, dt)} ? {width} : {pos}"),
                (lt, "max=!", f"({pos} == {diff}(j, k) && {_before(xj, xk, dt)}) ? 1 : 0")):
            stmts.append(temp_stmt(ctx, name, ["j", "k"], (n, n), op, value,
                                   lets=[f"{o} in 0:{m}" for o, m in zip(other, oshape)]))
        same = lambda j, k: f"({diff}({j}, {k}) == {width})"  # noqa: E731
        less = lambda j, k: f"({lt}({j}, {k}) != 0)"  # noqa: E731
    # the first occurrence of each entry's value, and the rank of that value among the
    # distinct ones (sorted: by value; else: by first occurrence)
    fi = ctx.temp("first")
    stmts.append(temp_stmt(ctx, fi, ["k"], (n,), "min=!", f"{same('j', 'k')} ? j : {n}",
                           lets=[f"j in 0:{n}"]))
    rank = ctx.temp("rank")
    before = less("j", "k") if ordered else f"j < {fi}(k)"
    stmts.append(temp_stmt(ctx, rank, ["k"], (n,), "+=!",
                           f"({fi}(j) == j && {before}) ? 1 : 0", lets=[f"j in 0:{n}"]))
    head = f"({fi}(k) == k && {rank}(k) == u)"
    if y:
        out = ["u"] if axis is None else other[:a] + ["u"] + other[a:]
        stmts.append(stmt(ctx, y, out, "+=!", f"{head} ? {at('k', other)} : {lit(0, dt)}",
                          extra=[f"k in 0:{n}"]))
    if first_idx:
        stmts.append(stmt(ctx, first_idx, ["u"], "+=!", f"{head} ? int64(k) : 0",
                          extra=[f"k in 0:{n}"]))
    if inverse:
        stmts.append(stmt(ctx, inverse, ["k"], "=", f"int64({rank}(k))"))
    if counts:
        stmts.append(stmt(ctx, counts, ["u"], "+=!", f"{rank}(k) == u ? 1 : 0",
                          extra=[f"k in 0:{n}"]))
    stmts += _count_stmt(ctx, node, f"({fi}(k) == k)", [f"k in 0:{n}"])
    return Lowered(stmts)


@register("NonMaxSuppression")
def non_max_suppression(node: Node, ctx: LowerContext) -> Lowered:
    boxes, scores = node.inputs[:2]
    y = node.outputs[0]
    nb, s, _ = ctx.shape(boxes)
    nc = ctx.shape(scores)[1]
    dt = ctx.dtype(boxes)
    if dt not in FLOATS:
        raise unsupported(node, f"boxes of dtype {dt}")
    k_max = ctx.const(node.inputs[2]) if present(node, 2) else np.zeros(1, np.int64)
    if k_max is None:
        raise unsupported(node, "max_output_boxes_per_class must be a constant (or a value "
                                "given at compile time): it bounds the output's size")
    per_class = max(0, min(int(np.asarray(k_max).reshape(-1)[0]), s))
    if per_class == 0:
        raise unsupported(node, "max_output_boxes_per_class is 0 (or not given): the output "
                                "is empty, and polyc does not compile empty tensors")

    def scalar(i: int) -> str | None:
        if not present(node, i):
            return None
        return ref(ctx, node.inputs[i], ["0"] * ctx.rank(node.inputs[i]))
    iou_thr = scalar(3) or lit(0.0, dt)
    score_thr = scalar(4)
    bc = ["b", "c"]
    rng_bc = [f"b in 0:{nb}", f"c in 0:{nc}"]
    sc = lambda i: ref(ctx, scores, ["b", "c", i])  # noqa: E731
    # the rank of each box by score (higher first, ties: lower index first), and the
    # box at each rank
    rk, order = ctx.temp("rank"), ctx.temp("order")
    # (a NaN score ranks last, so that the ranks stay a permutation of the boxes). Box j
    # ranks before box i when its score is higher, or the same and j < i; when i's is
    # NaN, when j's is not or j < i. The index test compares int32 (vectors of 64-bit
    # compares hold half as many lanes)
    sj, si = sc("j"), sc("i")
    lower = "int32(j) < int32(i)"
    stmts = [temp_stmt(ctx, rk, ["b", "c", "i"], (nb, nc, s), "+=!",
                       f"({sj} > {si} || ({sj} == {si} && {lower}) || "
                       f"({si} != {si} && ({sj} == {sj} || {lower}))) ? 1 : 0",
                       lets=[f"j in 0:{s}"]),
             temp_stmt(ctx, order, ["b", "c", "r"], (nb, nc, s), "+=!",
                       f"{rk}(b, c, i) == r ? int32(i) : 0", lets=[f"i in 0:{s}"])]
    # the corners (y1, x1, y2, x2) and the area of the box at each rank, as five planes
    # (component first, classes innermost: the greedy loop's vectors run over classes)
    corner = ctx.temp("corner")
    box = lambda q: ref(ctx, boxes, ["b", f"min({order}(b, c, r), {s - 1})", str(q)])  # noqa: E731
    if node.attr("center_point_box", 0):
        half = lambda q: f"{box(q)} / {lit(2.0, dt)}"  # noqa: E731
        values = [f"{box(1)} - {half(3)}", f"{box(0)} - {half(2)}",
                  f"{box(1)} + {half(3)}", f"{box(0)} + {half(2)}"]
    else:
        values = [f"min({box(0)}, {box(2)})", f"min({box(1)}, {box(3)})",
                  f"max({box(0)}, {box(2)})", f"max({box(1)}, {box(3)})"]
    stmts.append(temp_stmt(ctx, corner, ["q", "r", "b", "c"], (4, s, nb, nc), "=",
                           _pick("q", values)))
    area = ctx.temp("area")
    cr = lambda q: f"{corner}({q}, r, b, c)"  # noqa: E731
    stmts.append(temp_stmt(ctx, area, ["r", "b", "c"], (s, nb, nc), "=",
                           f"({cr(3)} - {cr(1)}) * ({cr(2)} - {cr(0)})"))
    # the greedy selection, one rank after another. The state carried from rank to rank
    # is the list of the boxes kept so far (their corners and areas, in the order kept,
    # ``per_class`` slots) and how many there are: box r is tested against the kept
    # ones only, O(per_class) a rank rather than O(r)
    keep, sup, seen = ctx.temp("keep"), ctx.temp("suppressed"), ctx.temp("kept_before")
    kept = ctx.temp("kept")
    loop = ["r", "b", "c"]
    shape3 = (s, nb, nc)
    scaffold = [len(stmts)]
    stmts.append(temp_stmt(ctx, keep, loop, shape3, "=", "0"))
    scaffold.append(len(stmts))
    stmts.append(temp_stmt(ctx, seen, loop, shape3, "=", "0"))
    scaffold.append(len(stmts))
    kidx = ["r", "q", "t", "b", "c"]  # classes innermost: the vector loops run over them
    kshape = tuple({"r": s, "q": 5, "t": per_class, "b": nb, "c": nc}[i] for i in kidx)
    stmts.append(temp_stmt(ctx, kept, kidx, kshape, "=", lit(0.0, dt)))
    first = len(stmts)
    stmts.append(temp_stmt(ctx, seen, loop, shape3, "=",
                           f"(r == 0 ? 0 : {seen}(r - 1, b, c) + {keep}(r - 1, b, c))"))
    # slot t of the list at rank r: box r - 1 if it was kept as the t-th, else as before
    fresh = f"(q < 4 ? {corner}(min(q, 3), r - 1, b, c) : {area}(r - 1, b, c))"
    stmts.append(temp_stmt(
        ctx, kept, kidx, kshape, "=",
        f"(r == 0 ? {lit(0.0, dt)} : ("
        f"{_all([f'{keep}(r - 1, b, c) != 0', f'{seen}(r - 1, b, c) == t'])} != 0 ? "
        f"{fresh} : {kept}({', '.join(['r - 1'] + kidx[1:])})))"))
    kc = lambda q: f"{kept}({', '.join(['r', str(q)] + kidx[2:])})"  # noqa: E731
    iw = f"(min({cr(3)}, {kc(3)}) - max({cr(1)}, {kc(1)}))"
    ih = f"(min({cr(2)}, {kc(2)}) - max({cr(0)}, {kc(0)}))"
    inter = f"({iw} * {ih})"
    union = f"({area}(r, b, c) + {kc(4)} - {inter})"
    # every test evaluated (``_all``, no && whose right side runs only when its left
    # holds): the step's loops over the kept slots and the classes then vectorize
    overlap = [f"{iw} > 0", f"{ih} > 0", f"{inter} > 0", f"{area}(r, b, c) > 0",
               f"{kc(4)} > 0", f"{union} > 0", f"{inter} / {union} > {iou_thr}"]
    stmts.append(temp_stmt(ctx, sup, loop, shape3, "+=!",
                           _all([f"t < {seen}(r, b, c)", *overlap]), lets=[f"t in 0:{per_class}"]))
    passes = [f"{sc(f'min({order}(b, c, r), {s - 1})')} > {score_thr}"] if score_thr else []
    stmts.append(temp_stmt(ctx, keep, loop, shape3, "=",
                           _all([f"{sup}(r, b, c) == 0", f"{seen}(r, b, c) < {per_class}",
                                 *passes])))
    loops = (("r", first, len(stmts) - 1),)
    folds = ((kept, 2), (sup, 1))
    # compaction: each class's kept boxes in rank order, the classes one after another
    total, start, chosen = ctx.temp("total"), ctx.temp("start"), ctx.temp("chosen")
    stmts.append(temp_stmt(ctx, total, bc, (nb, nc), "+=!", f"{keep}(r, b, c)",
                           lets=[f"r in 0:{s}"]))
    stmts.append(temp_stmt(ctx, start, bc, (nb, nc), "+=!",
                           f"({nc} * b2 + c2 < {nc} * b + c) ? {total}(b2, c2) : 0",
                           lets=[f"b2 in 0:{nb}", f"c2 in 0:{nc}"]))
    stmts.append(temp_stmt(ctx, chosen, ["b", "c", "t"], (nb, nc, per_class), "+=!",
                           f"({keep}(r, b, c) != 0 && {seen}(r, b, c) == t) ? "
                           f"int64({order}(b, c, r)) : 0", lets=[f"r in 0:{s}"]))
    at = f"max(0, min({per_class - 1}, p - {start}(b, c)))"
    inside = f"({start}(b, c) <= p && p < {start}(b, c) + {total}(b, c))"
    stmts.append(stmt(ctx, y, ["p", "e"], "+=!",
                      f"{inside} ? {_pick('e', ['int64(b)', 'int64(c)', f'{chosen}(b, c, {at})'])}"
                      f" : 0", extra=rng_bc))
    stmts += _count_stmt(ctx, node, f"{keep}(r, b, c) != 0",
                         [f"r in 0:{s}", *rng_bc])
    return Lowered(stmts, loops=loops, scaffold=tuple(scaffold), folds=folds)
