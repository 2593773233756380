"""Ops that select entries by their values: NonZero, Compress, Unique, NonMaxSuppression.

Their outputs are computed at their bound with a count (see :mod:`.onnx_dynamic`), and
written the way polyc writes everything, each output entry finding what lands on it:

* an entry's place among the selected ones is a count -- how many selected entries come
  before it (``pos(k) = #{j < k : selected(j)}``);
* output entry ``r`` sums the one selected entry whose place is ``r`` (zero past the
  count).

Both are O(n^2) in the number of candidates: fine for the index lists and masks these
ops see in models (thousands), not for millions of elements.

NonMaxSuppression keeps each class's boxes greedily in one loop over the ranks (a
recurrence, so its statements share that loop: ``Lowered.loops``, as the RNNs' steps
do). Each box gets a distinct int64 sort key (its score's bits mapped to an int32 that
orders as the floats do, then its index: ties go to the lower index, as in onnx's
reference and onnxruntime, and NaN ranks last). Rank r's box is the one with the largest
key below rank r - 1's: an O(n) max per rank over all classes at once (vectors over the
classes), and no sort. Box r is kept when its score passes the threshold, fewer than
``max_output_boxes_per_class`` were kept before it, and no kept box overlaps it by more
than ``iou_threshold``. The state from one rank to the next is the current key, the list
of the boxes kept so far (``max_output_boxes_per_class`` slots: corners, area and index,
stored for two ranks: ``Lowered.folds``) and its length, so each box is tested against
the kept ones only; the tests are all evaluated (no ``&&``), and the step's loops run as
vectors over the classes. The loop stops (``Lowered.exits``) once no class can keep
another box: every list is full or the rank's box fails the score threshold (the later
ones score no higher). A detector's tail keeps its 50 boxes a class within its first 60
of 500 ranks: 0.26 ms where ranking every box first (O(n^2) comparisons) and running all
500 ranks took 2.1 ms.
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


def same_value(a: str, b: str, dt: str) -> str:
    """``a`` and ``b`` are the same value (NaNs all the same, as numpy's unique)."""
    return f"({a} == {b} || ({a} != {a} && {b} != {b}))" if dt in FLOATS else f"({a} == {b})"


def sorts_before(a: str, b: str, dt: str) -> str:
    """``a`` sorts strictly before ``b`` (NaN last, as numpy)."""
    return f"({a} < {b} || ({a} == {a} && {b} != {b}))" if dt in FLOATS else f"({a} < {b})"


def _count_stmt(ctx: LowerContext, node: Node, value: str, ranges: list[str]) -> list[str]:
    count = count_of(node)
    if count is None:
        return []
    return [f"{ctx.name(count)} +=! {value} ? 1 : 0 where {', '.join(ranges)}"]


#: below every key of :func:`sort_key` (INT64_MIN, written without an out-of-range literal)
LOWEST_KEY = "(int64(-2147483647) * 4294967296 - 4294967296)"
#: the dtypes :func:`sort_key` maps (the others take 64 bits themselves, or 33)
KEYED = ("float32", "float16", "bfloat16", "int8", "int16", "int32", "uint8", "uint16",
         "bool")


def sort_key(value: str, dtype: str, i: str, n: int, *, descending: bool = True,
             nan_high: bool = False) -> str:
    """An int64 key per entry ``i`` (of ``n``) holding ``value``, all distinct, larger for
    the entry that comes first: the higher value (``descending``; else the lower), and
    among equal values (-0.0 and 0.0 are equal) the lower index. A NaN is the highest
    value (``nan_high``) or the lowest; NaNs among themselves go by index.

    The value maps to an int32 that orders as the values do (a float's bits, a
    negative's magnitude bits flipped, or the integer itself), times 2^32, plus
    ``n - i`` (1 to ``n``): every comparison of entries one int64 comparison, and every
    key above :data:`LOWEST_KEY`. ``dtype`` must be one of :data:`KEYED`."""
    if dtype in ("float32", "float16", "bfloat16"):
        v = value if dtype == "float32" else f"float32({value})"
        bits = f"bits_int32({v})"
        nan = 2 ** 31 - 1 if nan_high else -2 ** 31 + 1  # above +inf's, below -inf's
        k32 = (f"({v} != {v} ? {nan} : ({bits} >= 0 ? {bits} : "
               f"({bits} < {-2 ** 31 + 1} ? 0 : bitxor({bits}, {2 ** 31 - 1}))))")
    elif dtype in KEYED:
        k32 = f"int32({value})"
    else:
        raise ValueError(f"no 32-bit sort key for {dtype}")
    if not descending:
        k32 = f"bitnot({k32})"  # -k - 1: the order reversed, within int32
    return f"int64({k32}) * 4294967296 + int64({n} - {i})"


def next_key(key: str, previous: str, step: str) -> str:
    """The value whose ``max`` over the entries is the key at ``step``: the largest key
    of all at step 0, then the largest below the key at the step before (``previous``):
    the entries one after another in key order, O(n) a step."""
    return f"{step} == 0 ? {key} : ({key} < {previous} ? {key} : {LOWEST_KEY})"


def key_index(key: str, n: int) -> str:
    """The entry index a :func:`sort_key` of ``n`` entries holds."""
    return f"int32({n} - bitand({key}, 4294967295))"


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
        same = lambda j, k: same_value(at(j, []), at(k, []), dt)  # noqa: E731
        less = lambda j, k: sorts_before(at(j, []), at(k, []), dt)  # noqa: E731
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
                (diff, "min=!", f"{same_value(xj, xk, dt)} ? {width} : {pos}"),
                (lt, "max=!", f"({pos} == {diff}(j, k) && {sorts_before(xj, xk, dt)}) ? 1 : 0")):
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
    if dt not in FLOATS or ctx.dtype(scores) not in ("float32", "float16", "bfloat16"):
        raise unsupported(node, f"boxes of dtype {dt} and scores of dtype "
                                f"{ctx.dtype(scores)} (ONNX's NonMaxSuppression takes "
                                f"float32; polyc also float16 and bfloat16)")
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
    # each box's sort key: distinct, larger for a box that ranks first (higher score;
    # ties: the lower index; NaN last)
    key = ctx.temp("key")
    stmts = [temp_stmt(ctx, key, ["i", "b", "c"], (s, nb, nc), "=",
                       sort_key(sc("i"), ctx.dtype(scores), "i", s))]
    # the greedy selection, one rank after another (a recurrence: its statements share
    # the loop over ranks r). Its state: the box at the current rank (the largest key
    # below the previous rank's), and the list of the boxes kept so far (corners, area
    # and index, in the order kept; ``per_class`` slots) with its length, so that each
    # box is tested against the kept ones only, O(per_class) a rank
    cur, bidx, corner, area = (ctx.temp(n) for n in ("current", "box", "corner", "area"))
    keep, sup, seen = ctx.temp("keep"), ctx.temp("suppressed"), ctx.temp("kept_before")
    kept, kept_idx, more = ctx.temp("kept"), ctx.temp("kept_index"), ctx.temp("more")
    loop = ["r", "b", "c"]
    shape3 = (s, nb, nc)
    kidx = ["r", "q", "t", "b", "c"]  # classes innermost: the vector loops run over them
    kshape = (s, 5, per_class, nb, nc)
    tidx, tshape = ["r", "t", "b", "c"], (s, per_class, nb, nc)
    scaffold = []
    for name, idx, shape, zero in ((cur, loop, shape3, "int64(0)"), (keep, loop, shape3, "0"),
                                   (seen, loop, shape3, "0"), (kept, kidx, kshape, lit(0.0, dt)),
                                   (kept_idx, tidx, tshape, "0")):
        scaffold.append(len(stmts))
        stmts.append(temp_stmt(ctx, name, idx, shape, "=", zero))
    first = len(stmts)
    k = f"{key}(i, b, c)"
    stmts.append(temp_stmt(ctx, cur, loop, shape3, "max=!",
                           next_key(k, f"{cur}(r - 1, b, c)", "r"), lets=[f"i in 0:{s}"]))
    stmts.append(temp_stmt(ctx, bidx, loop, shape3, "=", key_index(f"{cur}(r, b, c)", s)))
    at = f"max(0, min({bidx}(r, b, c), {s - 1}))"
    box = lambda q: ref(ctx, boxes, ["b", at, str(q)])  # noqa: E731
    if node.attr("center_point_box", 0):
        half = lambda q: f"{box(q)} / {lit(2.0, dt)}"  # noqa: E731
        values = [f"{box(1)} - {half(3)}", f"{box(0)} - {half(2)}",
                  f"{box(1)} + {half(3)}", f"{box(0)} + {half(2)}"]
    else:
        values = [f"min({box(0)}, {box(2)})", f"min({box(1)}, {box(3)})",
                  f"max({box(0)}, {box(2)})", f"max({box(1)}, {box(3)})"]
    # the corners (y1, x1, y2, x2) and the area of the box at rank r
    stmts.append(temp_stmt(ctx, corner, ["r", "q", "b", "c"], (s, 4, nb, nc), "=",
                           _pick("q", values)))
    cr = lambda q: f"{corner}(r, {q}, b, c)"  # noqa: E731
    stmts.append(temp_stmt(ctx, area, loop, shape3, "=",
                           f"({cr(3)} - {cr(1)}) * ({cr(2)} - {cr(0)})"))
    stmts.append(temp_stmt(ctx, seen, loop, shape3, "=",
                           f"r == 0 ? 0 : {seen}(r - 1, b, c) + {keep}(r - 1, b, c)"))
    # tested against the list as the previous rank left it (at rank 0: empty)
    kc = lambda q: f"{kept}(r - 1, {q}, t, b, c)"  # noqa: E731
    iw = f"(min({cr(3)}, {kc(3)}) - max({cr(1)}, {kc(1)}))"
    ih = f"(min({cr(2)}, {kc(2)}) - max({cr(0)}, {kc(0)}))"
    inter = f"({iw} * {ih})"
    union = f"({area}(r, b, c) + {kc(4)} - {inter})"
    # every test evaluated (``_all``, no && whose right side runs only when its left
    # holds): the step's loops over the kept slots and the classes then vectorize
    overlap = [f"{iw} > 0", f"{ih} > 0", f"{inter} > 0", f"{area}(r, b, c) > 0",
               f"{kc(4)} > 0", f"{union} > 0", f"{inter} / {union} > {iou_thr}"]
    # (it reads the list at rank r - 1: its update runs from rank 1 on, its
    # initialisation at every rank; with a single box, the update has no instance)
    stmts.append(temp_stmt(ctx, sup, loop, shape3, "+=!",
                           _all([f"t < {seen}(r, b, c)", *overlap]),
                           lets=[f"t in 0:{per_class}"]))
    passes = [f"{sc(at)} > {score_thr}"] if score_thr else []
    stmts.append(temp_stmt(ctx, keep, loop, shape3, "=",
                           _all([f"{sup}(r, b, c) == 0", f"{seen}(r, b, c) < {per_class}",
                                 *passes])))
    # slot t of the list after rank r: box r if it is kept as the t-th, else as before
    added = _all([f"{keep}(r, b, c) != 0", f"{seen}(r, b, c) == t"])
    fresh = f"(q < 4 ? {corner}(r, min(q, 3), b, c) : {area}(r, b, c))"
    stmts.append(temp_stmt(ctx, kept, kidx, kshape, "=",
                           f"{added} != 0 ? {fresh} : (r == 0 ? {lit(0.0, dt)} : "
                           f"{kept}({', '.join(['r - 1'] + kidx[1:])}))"))
    stmts.append(temp_stmt(ctx, kept_idx, tidx, tshape, "=",
                           f"{added} != 0 ? {bidx}(r, b, c) : (r == 0 ? 0 : "
                           f"{kept_idx}({', '.join(['r - 1'] + tidx[1:])}))"))
    # 0 once no class can keep another box: every list is full, or the box at rank r
    # fails the score threshold (so do all after it: they score no higher). The later
    # ranks would change nothing, and the loop stops (``Kernel.exits``) -- only after
    # a rank of the last one's parity, whose slots the state is read from once the loop
    # is over (``folds``)
    busy = _all([f"{seen}(r, b, c) + {keep}(r, b, c) < {per_class}", *passes])
    stmts.append(temp_stmt(ctx, more, ["r"], (s,), "max=!",
                           f"(r % 2 != {(s - 1) % 2} || {busy} != 0) ? 1 : 0",
                           lets=[f"b in 0:{nb}", f"c in 0:{nc}"]))
    loops = (("r", first, len(stmts) - 1),)
    folds = ((cur, 2), (bidx, 1), (corner, 1), (area, 1), (seen, 2), (sup, 1), (keep, 2),
             (kept, 2), (kept_idx, 2), (more, 1))
    # compaction: each class's kept boxes in the order kept, the classes one after another
    total, start = ctx.temp("total"), ctx.temp("start")
    stmts.append(temp_stmt(ctx, total, bc, (nb, nc), "=",
                           f"{seen}({s - 1}, b, c) + {keep}({s - 1}, b, c)"))
    stmts.append(temp_stmt(ctx, start, bc, (nb, nc), "+=!",
                           f"({nc} * b2 + c2 < {nc} * b + c) ? {total}(b2, c2) : 0",
                           lets=[f"b2 in 0:{nb}", f"c2 in 0:{nc}"]))
    slot = f"max(0, min({per_class - 1}, p - {start}(b, c)))"
    inside = f"({start}(b, c) <= p && p < {start}(b, c) + {total}(b, c))"
    chosen = f"int64({kept_idx}({s - 1}, {slot}, b, c))"
    stmts.append(stmt(ctx, y, ["p", "e"], "+=!",
                      f"{inside} ? {_pick('e', ['int64(b)', 'int64(c)', chosen])} : 0",
                      extra=rng_bc))
    count = count_of(node)
    if count is not None:
        stmts.append(f"{ctx.name(count)} +=! int64({total}(b, c)) where {', '.join(rng_bc)}")
    return Lowered(stmts, loops=loops, scaffold=tuple(scaffold), folds=folds, exits=(more,))
