"""Packing: the large operand of a contraction copied into column blocks before it runs.

A register tile of ``C(m,n) +=! A(m,k) * B(k,n)`` (:mod:`polyc.schedule.register_tile`)
reads, at each step of ``k``, ``NR`` consecutive columns of one row of ``B``: its whole
``k`` sweep is ``K`` short runs one row of ``B`` apart. When ``B``'s rows are long
(8 KB at ``N = 2048`` float32), each run is on another page: the TLB misses and the
prefetcher, which follows streams within a page, cannot hide L2 latency. BLAS libraries
pack ``B`` for this reason. This pass does the same once per call, for the whole
operand, as :mod:`frontend.onnx_layout` does at compile time for constant weights::

    Bb(nb, k, ni) = B(k, NR * nb + ni)                    (a copy before the contraction)
    C(m, NR * nb + ni) +=! A(m, k) * Bb(nb, k, ni)        (n split into nb, ni)

so that a register tile's ``K x NR`` weights are one contiguous stream. An operand read
along the reduction, ``B(n, k)`` (syrk's ``A(j, k)``), is packed the same way, transposed
(``Bb(nb, k, ni) = B(NR * nb + ni, k)``): its sums then get the column tile, each in its
own order, where they ran scalar before (a float sum is not reassociated into the
dot-product form). On a Zen 5 EPYC, one thread: that float matmul at 1024 went from 6 to
206 GFLOP/s; PolyBench's syrk from 125 to 51 ms and syr2k from 167 to 44 ms (their
triangles keep the column loop without its register tile: a tile on the diagonal
would write outside the domain). The split of
``n`` is a bijection of the iteration domain (and of its initialisation, split the same
way so that the register tile still starts from it), so the meaning is unchanged; the
copy reads ``B`` after its last writer and nothing writes it after.

Measured on a Sapphire Rapids class Xeon, float32, one thread: matmul 2048 went from
about 100 to 143 GFLOP/s, 4096 from 71 to 144 (numpy/OpenBLAS: 180-190).

The copy costs two passes over ``B`` for ``2 * rows`` flops per element of ``B``; it pays
when many rows reuse each element (:data:`MIN_ROWS`; :data:`MIN_ROWS_SHORT_ROWS` where
``B``'s rows are shorter than a page, whose unpacked runs the prefetcher follows) and
``B`` does not sit in the L2 anyway (:data:`MIN_BYTES_L2_FRACTION`). How many rows
depends on the CPU: where its prefetchers do not follow a tile's strided runs (a
probe times them, :func:`machine.strided_panel_cost`), far fewer
(:data:`STRIDED_PANEL_SLOW`). Only kernels with fixed sizes, for the C target, with
tiles and register tiles on, without a user schedule and with ``Options.pack``.
"""
from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import replace

import islpy as isl

from . import dtypes as D
from . import expr as E
from .errors import ScheduleError
from .ir import Access, Array, Kernel, Statement, params_prefix
from .options import Options
from .rewrite import fresh_array, fresh_statement, replace_statement
from .schedule import machine, optimize, register_tile

#: rows of the result that must reuse each packed element (the copy's cost amortised)
MIN_ROWS = 128
#: ``B`` smaller than this share of the L2 is left alone (its rows stay cached)
MIN_BYTES_L2_FRACTION = 2
#: rows that must reuse a ``B`` whose rows are shorter than :data:`PAGE_BYTES`: its
#: unpacked runs then share pages and the prefetcher follows them, so the copy pays later
#: (on a Zen 5 EPYC, one thread, unpacked against packed: 128x3072x768 233 against 211
#: GFLOP/s, 192x3072x768 225/217, 256x3072x768 226/226, 1024x1024x768 230/248)
MIN_ROWS_SHORT_ROWS = 256
#: the page size the hardware prefetcher stops at (x86: 4 KB)
PAGE_BYTES = 4096
#: a :func:`machine.strided_panel_cost` above this: the CPU's prefetchers do not follow
#: a register tile's strided runs, and the copy pays from
#: :data:`SLOW_STRIDES_MIN_ROWS` rows (:data:`SLOW_STRIDES_MIN_ROWS_SHORT` where ``B``'s
#: rows are shorter than a page) instead. Measured on an Emerald Rapids Xeon (the first
#: probe: 1.40-1.48; a Zen 5 EPYC's unpacked tiles ran within 15% of its peak, so its
#: thresholds above stay), one thread, unpacked against packed GFLOP/s, A/B in one
#: process: 16x1024x2048 34/42, 24x1024x2048 33/56, 64x1024x2048 34/78; short rows
#: 16x784x512 64/46, 32x784x512 77/77, 48x784x512 47/67, 64x784x512 55/83, 128x3072x768
#: 62/80. On a Zen 2 EPYC (AVX2, 6 x 16 tile; the probe 1.50), one thread / two:
#: 64x512x512 52/78 and 101/125, 48x784x512 53/71 and 95/113, 128x3072x768 69/70 and
#: 71/146, 16x1024x2048 36/40 and 48/80, 64x1024x2048 40/64 and 39/150
#: On a Xeon with AVX-512, a 48 KB L1 and a 2 MB L2 (6 x 64 tile) the probe at 512
#: steps read 1.08-1.20 and these did not pay; at the scheduler's own 1024 steps it
#: reads 1.8-1.9, and one thread / two, unpacked against packed, speed ratio to
#: OpenBLAS in one run: 128x3072x768 0.77/1.07 and 0.60/1.12, 64x784x512 0.82/0.92 and
#: 0.90/0.96, 32x784x512 0.78/0.92 and 1.12/1.14
STRIDED_PANEL_SLOW = 1.25
SLOW_STRIDES_MIN_ROWS = 16
SLOW_STRIDES_MIN_ROWS_SHORT = 48
#: compute a contraction's row factor apart (:func:`hoist_row_factors`)
HOIST_ROW_FACTORS = True
#: rows that must reuse an operand packed transposed (its alternative is a scalar sum,
#: whatever its size: ``C(m,n) +=! A(m,k) * B(n,k)`` at 512 ran at 7 GFLOP/s, 193 packed)
MIN_ROWS_TRANSPOSED = 8


def pack_operands(kernel: Kernel, options: Options) -> Kernel:
    """``kernel`` with the operands of its large contractions packed (module doc)."""
    if not (options.pack and options.target == "c" and options.tile is not False
            and options.register_tile is not False) \
            or len(kernel.fixed_sizes) != len(kernel.sizes):
        return kernel
    done: set[str] = set()
    while True:
        found = None
        for s in kernel.statements:
            if s.name in done:
                continue
            done.add(s.name)
            shape = register_tile.machine_shape(kernel.array(s.write.array).dtype, options)
            found = shape and _candidate(kernel, s, shape[1], machine.l2_bytes())
            if found:
                break
        if not found:
            return kernel
        try:
            kernel = _packed(kernel, s, *found)
        except ScheduleError:  # a statement sharing loops (C input): left as it is
            continue


def hoist_row_factors(kernel: Kernel, options: Options) -> Kernel:
    """``kernel`` with the row factor of its large float contractions computed once.

    In ``C(i,j) += 1.5 * A(i,k) * B(k,j)`` (PolyBench's gemm, a Gemm's ``alpha``) the
    factor ``1.5 * A(i,k)`` does not involve the column ``j``, yet a register tile
    computes it at each step for each row, once per column block: a scalar multiply and
    a broadcast from a register beside every row's vector FMAs (gemm ran at 163 GFLOP/s
    against 243 for the plain product of the same shape, Zen 5 EPYC, one thread). It is
    computed once into a temporary before the contraction instead::

        C_rowf(i, k) = 1.5 * A(i, k)
        C(i,j) += C_rowf(i, k) * B(k,j)

    The values are the same (the factor was rounded before it met ``B`` and still is;
    bit for bit without floating-point contraction, which the C compiler may apply to
    another pair of operations in either form). Only for float contractions of one type whose columns span more than
    one register tile (else each factor is computed once anyway), whose factor does not
    read the array written, on the C target with register tiles and fixed sizes, and not
    under ``fusion="max"`` (which fuses the copy back into the contraction's loops; with
    a reduction of 2 or 4 steps isl's scheduler then ran into its 5 s limit)."""
    if not (HOIST_ROW_FACTORS and options.target == "c" and options.tile is not False
            and options.vectorize and options.register_tile is not False
            and options.fusion != "max") \
            or len(kernel.fixed_sizes) != len(kernel.sizes):
        return kernel
    for name in [t.name for t in kernel.statements]:
        s = kernel.statement(name)  # as the hoists before this one left it
        shape = register_tile.machine_shape(kernel.array(s.write.array).dtype, options)
        found = shape and _row_factor(kernel, s, shape[1])
        if not found:
            continue
        try:
            kernel = _hoisted(kernel, s, *found)
        except ScheduleError:  # a statement sharing loops (C input): left as it is
            continue
    return kernel


def _row_factor(kernel: Kernel, s: Statement, nr: int
                ) -> tuple[E.Expr, bool, tuple[str, ...]] | None:
    """``(F, left, its)``: the factor of ``s``'s product ``F * G`` (``left``) or ``G * F``
    free of the write's last iterator, that is more than a read, over iterators ``its``;
    None where there is none worth computing apart (:func:`hoist_row_factors`)."""
    v = s.value
    if s.op != "+" or not s.reduction_iterators or not s.write.indices \
            or not isinstance(v, E.Binary) or v.op != "*":
        return None
    last = s.write.indices[-1]
    if not isinstance(last, E.Index) or last.name not in s.iterators:
        return None
    dtype = kernel.array(s.write.array).dtype
    if D.get(dtype).kind != "f" or any(kernel.array(r.array).dtype != dtype
                                       for r in E.reads(v)):
        return None
    cols = register_tile.extent(s, kernel, last.name)
    if cols is None or cols <= nr:
        return None
    for f, g, left in ((v.a, v.b, True), (v.b, v.a, False)):
        used = E.free_names(f)[0]
        if isinstance(f, (E.Read, E.Const)) or last.name in used \
                or last.name not in E.free_names(g)[0] or not E.reads(f) \
                or any(r.array == s.write.array for r in E.reads(f)):
            continue
        if not used <= set(s.iterators) or not used & set(s.reduction_iterators):
            continue
        return f, left, tuple(it for it in s.iterators if it in used)
    return None


def _hoisted(kernel: Kernel, s: Statement, f: E.Expr, left: bool,
             its: tuple[str, ...]) -> Kernel:
    """``kernel`` with ``f`` (over ``its``) computed into a temporary before ``s`` (and
    its initialisation) and read there instead."""
    name = fresh_array(kernel, f"{s.write.array}_rowf")
    dom = s.domain
    for i in reversed(range(len(s.iterators))):
        if s.iterators[i] not in its:
            dom = dom.project_out(isl.dim_type.set, i, 1)
    fixed = dom.intersect_params(kernel.context)
    fixed = fixed.project_out(isl.dim_type.param, 0, fixed.dim(isl.dim_type.param))
    if fixed.is_empty():
        raise ScheduleError(f"{s.name}: no instance")
    shape = []
    for j, it in enumerate(its):
        lo, hi = fixed.dim_min_val(j), fixed.dim_max_val(j)
        if not (lo.is_int() and hi.is_int()) or lo.to_python() < 0:
            raise ScheduleError(f"{s.name}: {it} has no fixed extent from 0")
        shape.append(E.Const(hi.to_python() + 1))
    stmt = fresh_statement(kernel, s.name)
    dom = dom.set_tuple_name(stmt)
    for j, it in enumerate(its):
        dom = dom.set_dim_name(isl.dim_type.set, j, it)
    arr = Array(name, kernel.array(s.write.array).dtype, tuple(shape), "temp")
    copy = Statement(stmt, dom, its, Access(name, tuple(E.Index(i) for i in its)), "=", f,
                     f"the factor of {s.name} free of its columns, computed once")
    read = E.Read(name, tuple(E.Index(i) for i in its))
    other = s.value.b if left else s.value.a
    value = E.Binary("*", read, other) if left else E.Binary("*", other, read)
    return _before(kernel, s, [copy], replace(s, value=value), kernel.arrays + (arr,))


def _before(kernel: Kernel, s: Statement, copies: list[Statement], new_s: Statement,
            arrays: tuple[Array, ...], rewrite_init: Callable[[Statement], Statement]
            = lambda init: init) -> Kernel:
    """``kernel`` with ``s`` replaced by ``new_s`` and ``copies`` run before it, before
    its initialisation when it has one (which the register tile starts from: it stays
    just before ``s``), that initialisation replaced by ``rewrite_init`` of it."""
    init = _init_of(kernel, s)
    if init is None:
        return replace_statement(kernel, s.name, copies, [new_s], arrays)
    kernel = replace_statement(kernel, init.name, copies, [rewrite_init(init)], arrays)
    return replace_statement(kernel, s.name, [], [new_s], arrays)


def _candidate(kernel: Kernel, s: Statement, nr: int, l2: int
               ) -> tuple[str, tuple[tuple[str, int], ...], int] | None:
    """``(n, ((B, p), ..), NR)`` when ``s`` is a ``+`` contraction whose write ends in
    iterator ``n`` and which reads operands ``B`` at ``B(.., n, ..)`` -- ``n`` itself as
    index ``p``, reduction iterators in another index -- worth packing; else None.

    ``p`` is ``B``'s last index for a matmul's ``B(k, n)`` (packed when large, one such
    operand); an earlier one (syrk's ``A(j, k)``, ``C(m,n) +=! A(m,k) * B(n,k)``) packs
    ``B`` transposed, so that the column tile's vector walks it contiguously and each
    sum keeps its order (the dot-product form would reassociate a float sum: without
    the pack such a sum runs scalar). Every operand read along the reduction that way
    is packed (syr2k reads two), or none. Reads of ``B`` that do not involve ``n``
    (syrk's ``A(i, k)``) read ``B`` itself."""
    if s.op != "+" or not s.write.indices or not s.reduction_iterators:
        return None
    last = s.write.indices[-1]
    if not isinstance(last, E.Index) or last.name not in s.iterators:
        return None
    n = last.name
    if any(n in E.free_names(ix)[0] for ix in s.write.indices[:-1]):
        return None
    cols = register_tile.extent(s, kernel, n)
    if cols is None or cols <= nr:
        return None
    columns, transposed = [], []
    for b in sorted({r.array for r in E.reads(s.value)}):
        reads = [r for r in E.reads(s.value) if r.array == b
                 and any(n in E.free_names(i)[0] for i in r.indices)]
        if b == s.write.array or not reads:
            continue
        at = {_position(r, n) for r in reads}
        p = at.pop() if len(at) == 1 else None
        ok = p is not None and _worth(kernel, s, b, reads, n, p, nr, l2)
        if p is not None and p == kernel.array(b).rank - 1:
            if ok:
                columns.append((b, p))
        elif not ok:
            transposed = None  # a read along the reduction left strided: no column tile
        elif transposed is not None:
            transposed.append((b, p))
    packs = (transposed or []) + columns[:1]
    return (n, tuple(packs), nr) if packs else None


def _worth(kernel: Kernel, s: Statement, b: str, reads: list[E.Read], n: str, p: int,
           nr: int, l2: int) -> bool:
    """Whether ``B`` (read as ``reads``, ``n`` at index ``p``) is a plain operand of
    ``s`` whose copy pays: enough rows reuse it and, packed along its last index, it
    does not sit in the L2 anyway."""
    arr = kernel.array(b)
    reds = set(s.reduction_iterators)
    sizes = dict(kernel.fixed_sizes)
    if arr.rank < 2 or any(
            not all(E.is_affine(i) for i in r.indices)
            or not any(E.free_names(i)[0] & reds for j, i in enumerate(r.indices) if j != p)
            for r in reads):
        return False
    order = [t.name for t in kernel.statements]
    first = order.index((_init_of(kernel, s) or s).name)
    if any(order.index(t.name) >= first for t in kernel.statements if t.write.array == b):
        return False  # written after (or just before) the contraction: not a plain operand
    if E.evaluate(arr.shape[p], sizes) <= nr:
        return False
    rows = 1
    used = set().union(*(E.free_names(i)[0] for r in reads for i in r.indices))
    for it in s.iterators:
        if it != n and it not in reds and it not in used:
            rows *= register_tile.extent(s, kernel, it) or 1
    if p != arr.rank - 1:  # unpacked, a float sum would run scalar: any reuse pays
        # (an integer sum takes the dot-product form, VNNI's for bytes: left alone)
        return D.get(kernel.array(s.write.array).dtype).kind == "f" \
            and rows >= MIN_ROWS_TRANSPOSED
    nbytes = D.itemsize(arr.dtype) * math.prod(E.evaluate(x, sizes) for x in arr.shape)
    short = D.itemsize(arr.dtype) * E.evaluate(arr.shape[p], sizes) < PAGE_BYTES
    if nbytes * MIN_BYTES_L2_FRACTION < l2:
        return False  # (before the probe: a small operand needs no measurement)
    if strided_cost() > STRIDED_PANEL_SLOW:
        return rows >= (SLOW_STRIDES_MIN_ROWS_SHORT if short else SLOW_STRIDES_MIN_ROWS)
    return rows >= (MIN_ROWS_SHORT_ROWS if short else MIN_ROWS)


def strided_cost() -> float:
    """:func:`machine.strided_panel_cost` for this machine's float32 register tile."""
    mr, nr = register_tile.machine_shape("float32", Options(register_tile=True))
    return machine.strided_panel_cost(mr, nr, register_tile.vector_bits() // 8,
                                      optimize.reduction_chunk(mr, 4))


def _position(r: E.Read, n: str) -> int | None:
    """The index of read ``r`` that is ``n`` itself, when no other index involves ``n``."""
    at = [j for j, i in enumerate(r.indices) if n in E.free_names(i)[0]]
    return at[0] if len(at) == 1 and r.indices[at[0]] == E.Index(n) else None


def _init_of(kernel: Kernel, s: Statement) -> Statement | None:
    """The initialisation just before reduction ``s`` (a ``!`` form's), if any."""
    i = kernel.statements.index(s)
    init = kernel.statements[i - 1] if i > 0 else None
    if init is not None and init.kind == "init" and init.write.array == s.write.array \
            and init.write.indices and isinstance(init.write.indices[-1], E.Index):
        return init
    return None


def _packed(kernel: Kernel, s: Statement, n: str, packs: tuple[tuple[str, int], ...],
            nr: int) -> Kernel:
    """``kernel`` with each operand ``B`` of ``packs`` copied into ``B_packed(nb, .., ni)``
    before ``s`` (``B``'s index ``p`` split into ``nb, ni``, its other indices in order
    between them) and ``s`` (with its initialisation just before it) iterating over
    ``nb, ni`` instead of ``n``."""
    copies, arrays, renamed = [], kernel.arrays, {}
    for b, p in packs:
        copy, packed = _copy(replace(kernel, arrays=arrays), s, b, p, nr,
                             [c.name for c in copies])
        copies.append(copy)
        arrays += (packed,)
        renamed[b] = (packed.name, p)
    taken = _names(kernel, s)
    nb, ni = _fresh(f"{n}_blk", taken), _fresh(f"{n}_in", taken)

    def read(x: E.Expr) -> E.Expr | None:
        if isinstance(x, E.Read) and x.array in renamed \
                and _position(x, n) == renamed[x.array][1]:
            packed, p = renamed[x.array]
            return E.Read(packed, (E.Index(nb),) + x.indices[:p] + x.indices[p + 1:]
                          + (E.Index(ni),))
        return None
    new_s = _split(replace(s, value=E.map_expr(s.value, read)), n, nb, ni, nr)

    def split_init(init: Statement) -> Statement:
        m = init.write.indices[-1].name
        taken = _names(kernel, init)
        return _split(init, m, _fresh(f"{m}_blk", taken), _fresh(f"{m}_in", taken), nr)
    return _before(kernel, s, copies, new_s, arrays, split_init)


def _copy(kernel: Kernel, s: Statement, b: str, p: int, nr: int, names: list[str]
          ) -> tuple[Statement, Array]:
    """The statement copying ``B`` into its packed array, and that array:
    ``packed(nb, d.., ni) = B(d.. with nr * nb + ni at index p)`` over ``B``'s elements."""
    arr = kernel.array(b)
    width = E.evaluate(arr.shape[p], dict(kernel.fixed_sizes))
    packed = fresh_array(kernel, f"{b}_packed")
    rest = arr.shape[:p] + arr.shape[p + 1:]
    shape = (E.Const(-(-width // nr)),) + rest + (E.Const(nr),)
    name = fresh_statement(kernel, s.name, set(names))  # nor a copy made before this one
    its = ("nb",) + tuple(f"d{i}" for i in range(arr.rank - 1)) + ("ni",)
    bounds = [f"0 <= ni < {nr}", f"0 <= {nr} * nb + ni < {E.to_isl(arr.shape[p])}"] + [
        f"0 <= d{i} < {E.to_isl(x)}" for i, x in enumerate(rest)]
    domain = isl.Set(f"{params_prefix(kernel.sizes)}{{ {name}[{', '.join(its)}] : "
                     f"{' and '.join(bounds)} }}").intersect_params(kernel.context)
    source = [E.Index(i) for i in its[1:-1]]
    source.insert(p, _column(nr, "nb", "ni"))
    what = "columns" if p == arr.rank - 1 else f"index {p} (transposed)"
    copy = Statement(name, domain, its, Access(packed, tuple(E.Index(i) for i in its)), "=",
                     E.Read(b, tuple(source)),
                     f"{b} packed in blocks of {nr} along {what} for {s.name}")
    return copy, Array(packed, arr.dtype, shape, "temp")


def _column(nr: int, nb: str, ni: str) -> E.Expr:
    return E.Binary("+", E.Binary("*", E.Const(nr), E.Index(nb)), E.Index(ni))


def _split(s: Statement, n: str, nb: str, ni: str, nr: int) -> Statement:
    """``s`` with iterator ``n`` replaced by ``nb, ni`` everywhere (``n = nr * nb + ni``,
    ``0 <= ni < nr``): the same instances, renamed."""
    k = s.iterators.index(n)
    its = s.iterators[:k] + (nb, ni) + s.iterators[k + 1:]
    col = _column(nr, nb, ni)

    def sub(x: E.Expr) -> E.Expr | None:
        return col if isinstance(x, E.Index) and x.name == n else None
    p = params_prefix([s.domain.get_space().get_dim_name(isl.dim_type.param, j)
                       for j in range(s.domain.dim(isl.dim_type.param))])
    split = isl.Map(f"{p}{{ {s.name}[{', '.join(s.iterators)}] -> {s.name}[{', '.join(its)}]"
                    f" : {n} = {nr} * {nb} + {ni} and 0 <= {ni} < {nr} }}")
    domain = s.domain.apply(split)
    for j, it in enumerate(its):
        domain = domain.set_dim_name(isl.dim_type.set, j, it)
    write = Access(s.write.array, tuple(E.map_expr(i, sub) for i in s.write.indices))
    return replace(s, domain=domain, iterators=its, write=write, value=E.map_expr(s.value, sub))


def _names(kernel: Kernel, s: Statement) -> set[str]:
    """Names a new iterator of ``s`` must not take."""
    return set(s.iterators) | set(kernel.sizes) | {a.name for a in kernel.arrays}


def _fresh(base: str, taken: set[str]) -> str:
    out, k = base, 2
    while out in taken:
        out, k = f"{base}{k}", k + 1
    return out
