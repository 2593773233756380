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

so that a register tile's ``K x NR`` weights are one contiguous stream. The split of
``n`` is a bijection of the iteration domain (and of its initialisation, split the same
way so that the register tile still starts from it), so the meaning is unchanged; the
copy reads ``B`` after its last writer and nothing writes it after.

Measured on a Sapphire Rapids class Xeon, float32, one thread: matmul 2048 went from
about 100 to 143 GFLOP/s, 4096 from 71 to 144 (numpy/OpenBLAS: 180-190).

The copy costs two passes over ``B`` for ``2 * rows`` flops per element of ``B``; it pays
when many rows reuse each element (:data:`MIN_ROWS`) and ``B`` does not sit in the L2
anyway (:data:`MIN_BYTES_L2_FRACTION`). Only kernels with fixed sizes, for the C target,
with tiles and register tiles on, without a user schedule and with ``Options.pack``.
"""
from __future__ import annotations

import math
from dataclasses import replace

import islpy as isl

from . import dtypes as D
from . import expr as E
from .errors import ScheduleError
from .ir import Access, Array, Kernel, Statement, params_prefix
from .options import Options
from .rewrite import fresh_array, fresh_statement, replace_statement
from .schedule import machine, register_tile

#: rows of the result that must reuse each packed element (the copy's cost amortised)
MIN_ROWS = 128
#: ``B`` smaller than this share of the L2 is left alone (its rows stay cached)
MIN_BYTES_L2_FRACTION = 2


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


def _candidate(kernel: Kernel, s: Statement, nr: int, l2: int
               ) -> tuple[str, str, int] | None:
    """``(n, B, NR)`` when ``s`` is a ``+`` contraction whose write ends in iterator
    ``n`` and which reads an operand ``B`` only at ``B(.., n)`` with reduction iterators
    in its other indices, worth packing; else None."""
    if s.op != "+" or not s.write.indices or not s.reduction_iterators:
        return None
    last = s.write.indices[-1]
    if not isinstance(last, E.Index) or last.name not in s.iterators:
        return None
    n = last.name
    if any(n in E.free_names(ix)[0] for ix in s.write.indices[:-1]):
        return None
    reds = set(s.reduction_iterators)
    order = [t.name for t in kernel.statements]
    first = order.index((_init_of(kernel, s) or s).name)
    sizes = dict(kernel.fixed_sizes)
    cols = register_tile.extent(s, kernel, n)
    if cols is None or cols <= nr:
        return None
    for b in sorted({r.array for r in E.reads(s.value)}):
        arr = kernel.array(b)
        reads = [r for r in E.reads(s.value) if r.array == b]
        if b == s.write.array or arr.rank < 2 or any(
                not r.indices[-1] == E.Index(n) or not all(E.is_affine(i) for i in r.indices)
                or any(n in E.free_names(i)[0] for i in r.indices[:-1])
                or not any(E.free_names(i)[0] & reds for i in r.indices[:-1])
                for r in reads):
            continue
        if any(order.index(t.name) >= first for t in kernel.statements if t.write.array == b):
            continue  # written after (or just before) the contraction: not a plain operand
        if E.evaluate(arr.shape[-1], sizes) <= nr:
            continue
        rows = 1
        used = set().union(*(E.free_names(i)[0] for r in reads for i in r.indices))
        for it in s.iterators:
            if it != n and it not in reds and it not in used:
                rows *= register_tile.extent(s, kernel, it) or 1
        nbytes = D.itemsize(arr.dtype) * math.prod(E.evaluate(x, sizes) for x in arr.shape)
        if rows >= MIN_ROWS and nbytes * MIN_BYTES_L2_FRACTION >= l2:
            return n, b, nr
    return None


def _init_of(kernel: Kernel, s: Statement) -> Statement | None:
    """The initialisation just before reduction ``s`` (a ``!`` form's), if any."""
    i = kernel.statements.index(s)
    init = kernel.statements[i - 1] if i > 0 else None
    if init is not None and init.kind == "init" and init.write.array == s.write.array \
            and init.write.indices and isinstance(init.write.indices[-1], E.Index):
        return init
    return None


def _packed(kernel: Kernel, s: Statement, n: str, b: str, nr: int) -> Kernel:
    """``kernel`` with ``B`` copied into ``B_packed(nb, .., ni)`` before ``s`` and ``s``
    (with its initialisation just before it) iterating over ``nb, ni`` instead of ``n``."""
    arr = kernel.array(b)
    width = E.evaluate(arr.shape[-1], dict(kernel.fixed_sizes))
    packed = fresh_array(kernel, f"{b}_packed")
    shape = (E.Const(-(-width // nr)),) + arr.shape[:-1] + (E.Const(nr),)
    # the copy: packed(nb, d.., ni) = B(d.., nr * nb + ni) over B's elements
    copy_name = fresh_statement(kernel, s.name)
    its = ("nb",) + tuple(f"d{i}" for i in range(arr.rank - 1)) + ("ni",)
    bounds = [f"0 <= ni < {nr}", f"0 <= {nr} * nb + ni < {E.to_isl(arr.shape[-1])}"] + [
        f"0 <= d{i} < {E.to_isl(x)}" for i, x in enumerate(arr.shape[:-1])]
    domain = isl.Set(f"{params_prefix(kernel.sizes)}{{ {copy_name}[{', '.join(its)}] : "
                     f"{' and '.join(bounds)} }}").intersect_params(kernel.context)
    copy = Statement(copy_name, domain, its,
                     Access(packed, tuple(E.Index(i) for i in its)), "=",
                     E.Read(b, tuple(E.Index(i) for i in its[1:-1]) + (_column(nr, "nb", "ni"),)),
                     f"{b} packed in blocks of {nr} columns for {s.name}")
    arrays = kernel.arrays + (Array(packed, arr.dtype, shape, "temp"),)
    taken = _names(kernel, s)
    nb, ni = _fresh(f"{n}_blk", taken), _fresh(f"{n}_in", taken)

    def read(x: E.Expr) -> E.Expr | None:
        if isinstance(x, E.Read) and x.array == b:
            return E.Read(packed, (E.Index(nb),) + x.indices[:-1] + (E.Index(ni),))
        return None
    new_s = _split(replace(s, value=E.map_expr(s.value, read)), n, nb, ni, nr)
    init = _init_of(kernel, s)
    if init is None:
        return replace_statement(kernel, s.name, [copy], [new_s], arrays)
    m = init.write.indices[-1].name
    taken = _names(kernel, init)
    new_init = _split(init, m, _fresh(f"{m}_blk", taken), _fresh(f"{m}_in", taken), nr)
    kernel = replace_statement(kernel, init.name, [copy], [new_init], arrays)
    return replace_statement(kernel, s.name, [], [new_s], arrays)


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
