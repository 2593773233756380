"""Fuse consecutive loop nests that read the same large arrays into one outer loop.

isl's scheduler (under the ``smart`` fusion mode) leaves loop nests apart when fusing
them would cost a parallel loop: the two products of ``y = A^T (A x)`` (PolyBench's
atax), or ``s = A^T r`` and ``q = A p`` (bicg), each a sweep over ``A``. When ``A`` does
not fit in the cache, each sweep streams it from memory again. Fusing the nests' outer
loops, each nest shifted by a constant, has the later nests read the rows of ``A`` the
earlier one has just brought in::

    sequence                               mark "fused:T"
      filter S1: band (i, j)      ==>        band (floor((m_k + shift_k) / T))
      filter S3: band (j, i)                   sequence
                                                 filter S1: band (i, j)
                                                 filter S3: band (i, j)

Each nest keeps its whole band below the fused loop, the fused member first (a
permutable band may start with any member), so that :mod:`.optimize` chooses its tiles,
vector loop and register tiles as before; it tiles the fused member by ``T``, one tile
per fused iteration (the ``fused`` mark says so, and that no loop below is parallel).
``T`` is a multiple of the rows of every nest's register tile along the fused member
(atax's ``tmp = A x`` keeps its independent row sums), as many as let a quarter of the
L2 hold those rows of the arrays read twice (:func:`_rows`).

**Which member, which shift.** A run starts at a nest that reads more of an array than
the L2 holds (an initialisation does not lead), along one member of its band; the run
whose fused member walks no large array's contiguous index wins (bicg: ``A``'s rows,
not its columns), then the one saving the most bytes. Each next nest joins along the
member that keeps it closest to the run, at most :data:`MAX_SPREAD` iterations away:

* a nest that a dependence from the run reaches is shifted so that every dependence
  goes forward or stays in one fused iteration (where the sequence orders it);
* a nest no dependence reaches is aligned with the run on the elements both read (mvt:
  ``x2 = A^T y2`` walks ``A``'s rows along its ``j``); one that reads nothing of the
  run's moves before the run (atax's ``y = 0``);
* a nest that a dependence reaches but no member bounds ends the run.

**When.** The fusion saves the second reads of arrays no nest of the run writes, and,
when every nest of the run streams what it reads (a stencil, an elementwise step, a
matrix-vector sweep: :data:`STREAMED_READS`), the reads of arrays one nest passes to a
later one: the unrolled time steps of a Jacobi stencil, each sweep a row behind the one
before, read the rows the last sweep has just written. Once fused, :mod:`polyc.share`
still runs the sweeps in two arrays (it checks the overlapping lifetimes exactly), so a
1300x1300 jacobi-2d of 4 steps reads its arrays from memory once instead of 8 times
(x0.92 -> x1.85 against gcc's in-place loops, one thread, AMD EPYC Zen 4). A nest
counts its instances piece by piece (:func:`_instances`): the copy of a stencil's
borders, four strips, once counted as the whole square around them, did not "stream",
and so kept the first sweep out of the run (4 steps of jacobi-2d 1.61x -> 1.72x gcc,
9-point 1.27x -> 1.50x, heat-3d 1.36x -> 1.52x, double, one thread). A run with a
convolution or a matrix product counts no passed arrays: their tiles serve the reuse.
The fused loop carries the dependences between the nests, so it is not parallel: it is
made when one thread reading the arrays once moves fewer bytes than the threads reading
them in separate nests -- unless what it carries is sums into small arrays (atax's
``y(j) += A(i,j) * tmp(i)`` along the fused rows ``i``): each thread then adds into a
copy of its own (:func:`_private`, a ``private:`` mark; :mod:`.optimize` makes the loop
parallel, code generation writes an OpenMP array reduction, :mod:`polyc.check` verifies
it), and the fused loop, reading the matrix once, also runs on every thread (mvt,
double, 2000, 2 threads: 0.45x of the time of its separate sweeps).

**Columns too.** Where every nest of a run streams and none has a register tile (the
unrolled sweeps of a stencil), each nest also gets a second member shifted so that every
dependence between the nests goes forward along it as well (:func:`_columns`: Jacobi's
sweeps, each a row and a column behind the last). The fused band of rows and columns
is then permutable, marked ``fused:R:C``, and :mod:`.optimize` runs its tiles as a
wavefront when several threads run, each nest sweeping its rows of a tile in turn
(:func:`_column_tile` sizes them: a few column tiles a thread, the rows of one nest's
arrays in half the L1; on one thread whole rows of the first nest, the others' shifted
ends a second tile, and only the rows fuse where two rows do not fit that half).
Parallel where the row loop was not: jacobi-2d at 1300, float, 2 threads, 0.55x of the
time (Zen 5 EPYC). Where a nest reads a whole row of an earlier one (atax), no shift
keeps the dependences within a few columns and only the rows fuse.
:func:`polyc.check.check_schedule` verifies the result, as for every schedule.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import islpy as isl

from .. import dtypes as D
from .. import expr as E
from .. import marks
from ..deps import Dependences
from ..ir import Kernel, fixed_bytes
from ..options import Options
from . import cache_blocks, machine, register_tile, tiling
from .vector import member_iterators

#: fuse at all (a switch for measurements)
FUSE_STREAMS = True
#: a nest that reuses what it reads may join a run along one of its sums (a switch for
#: measurements: :func:`_along_reuse`)
FUSE_ALONG_SUMS = False
#: a run may be fused along a member that some nest writes down the columns of a
#: matrix with (a switch for measurements: :func:`_writes_down_columns`; syrk's scaling
#: of ``A`` fused with its packing along ``k`` took 10% of its time more on one thread)
FUSE_DOWN_COLUMNS = False
#: the most outer iterations a dependence between two fused nests may span (past it,
#: what one nest leaves in the cache is gone before the next reads it)
MAX_SPREAD = 8
#: the mark above a fused band: ``fused:T``, T the rows of a fused iteration, which the
#: nests' bands below take as their tile size along the fused member
FUSED = "fused"
#: the share of the L2 the rows of one fused iteration may take
FUSED_L2_FRACTION = 4
#: a nest streams what it reads when it runs at most this many instances per element
#: it reads (a stencil, an elementwise step, a matrix-vector sweep: about 1; MobileNetV2's
#: stride-2 depthwise convolution, 2.25, measured 2% slower fused with its producer)
STREAMED_READS = 1.5


@dataclass(frozen=True)
class _Nest:
    """One child of the top sequence: its statements and its band (None: no band)."""
    names: frozenset[str]
    filter: isl.UnionSet
    band: isl.ScheduleNode | None


def fuse_streams(schedule: isl.Schedule, kernel: Kernel, deps: Dependences,
                 options: Options) -> isl.Schedule:
    """``schedule`` with runs of consecutive top-level nests fused (see the module doc)."""
    if not FUSE_STREAMS or options.target != "c" or options.fusion == "min":
        return schedule  # (fusion="min" asks for one loop nest per statement)
    top = schedule.get_root().child(0)
    if top.get_type() != isl.schedule_node_type.sequence or not any(
            (fixed_bytes(kernel, a.name) or 0) > machine.l2_bytes() for a in kernel.arrays):
        return schedule  # (no array the cache cannot hold: nothing to save)
    nests = []
    for i in range(top.n_children()):
        f = top.child(i)
        sets: list[isl.Set] = []
        f.filter_get_filter().foreach_set(sets.append)
        names = frozenset(s.get_tuple_name() for s in sets)
        child = f.child(0)
        band = child if child.get_type() == isl.schedule_node_type.band else None
        nests.append(_Nest(names, f.filter_get_filter(), band))
    validity = deps.validity
    order: list[list[_Nest] | _Nest] = []
    #: index in ``order`` -> (member, shift) of each nest, rows of a fused iteration,
    #: where the columns are fused too, their (member, shift) and columns, and the
    #: arrays whose sums the fused loop carries, privatized when it runs in parallel
    #: (None: it cannot)
    fused: dict[int, tuple[list[tuple[int, int]], int, _Columns | None,
                           tuple[str, ...] | None]] = {}
    i = 0
    while i < len(nests):
        run, choice, hoisted, j, rows, private = _best_run(nests, i, validity, kernel, options,
                                                           deps.coincidence)
        if rows is not None:
            order.extend(hoisted)
            columns = _columns(run, choice, rows, validity, kernel, options)
            if columns is not None:
                rows, private = columns.rows, None
            fused[len(order)] = (choice, rows, columns, private)
            order.append(run)
            i = j
        else:
            order.append(nests[i])
            i += 1
    if not fused:
        return schedule
    return _rebuild(schedule, kernel, order, fused)


def _best_run(nests: list[_Nest], start: int, validity: isl.UnionMap, kernel: Kernel,
              options: Options, coincidence: isl.UnionMap):
    """Of the runs from ``start`` (one per member of its band that could lead), the one
    worth fusing that saves the most bytes, preferring a fused member that walks no
    read's contiguous index (its nests then stream whole rows): the run, its (member,
    shift) per nest, the nests moved before it, the index after it and its rows (None:
    no run worth fusing)."""
    first = nests[start]
    best, score = ([first], [], [], start + 1, None, None), None
    if first.band is None or not _streams(first, kernel):
        return best  # (an initialisation does not lead: the nest after it may)
    n = first.band.band_n_member() if first.band.band_get_permutable() else 1
    threads = machine.threads(options.threads) if options.parallel else 1
    for lead in range(n):
        if _along_reuse(first, lead, kernel):
            continue
        run, choice, hoisted, j = _longest_run(nests, start, lead, validity, kernel)
        if len(run) < 2 or (not FUSE_DOWN_COLUMNS and _writes_down_columns(run, choice, kernel)):
            continue
        total, saved = saved_bytes(run, kernel)
        # (only where a parallel loop could use them; a fused loop that carries nothing
        # stays as before: its tiles' work may be unequal, syr2k's panels of a triangle
        # 1.3x slower than its row tiles in turn)
        private = _private(run, choice, coincidence, kernel) or None \
            if saved and threads > 1 else None
        if not _worth_it(total, saved, options, private is not None):
            continue
        rows = _rows(run, choice, kernel, options, total)
        if rows is None:
            continue
        mine = (not _walks_rows(run, choice, kernel), saved, -lead)
        if score is None or mine > score:
            best, score = (run, choice, hoisted, j, rows, private), mine
    return best


def _streams(nest: _Nest, kernel: Kernel) -> bool:
    """Whether ``nest`` reads more of some array than the L2 holds."""
    cache = machine.l2_bytes()
    return any(_footprint(nest, kernel, a) * D.itemsize(kernel.array(a).dtype) > cache
               for a in _arrays(nest, kernel))


def _walks_rows(run: list[_Nest], choice: list[tuple[int, int]], kernel: Kernel) -> bool:
    """Whether the fused member is, in some nest, the iterator of the last (contiguous)
    index of a read of an array larger than the L2."""
    cache = machine.l2_bytes()
    for nest, (member, _) in zip(run, choice):
        for name, it in member_iterators(nest.band, member).items():
            if it is None:
                continue
            for a in kernel.statement(name).reads:
                if a.indices and it in E.free_names(a.indices[-1])[0] \
                        and (fixed_bytes(kernel, a.array) or 0) > cache:
                    return True
    return False


def _writes_down_columns(run: list[_Nest], choice: list[tuple[int, int]],
                         kernel: Kernel) -> bool:
    """Whether the fused member is, in some nest, the unit-stride iterator of the last
    index of a write of two or more dimensions: fused, the nest's other members run
    inside it, down the written array's columns."""
    for nest, (member, _) in zip(run, choice):
        for name, it in member_iterators(nest.band, member).items():
            write = kernel.statement(name).write
            if it is not None and len(write.indices) >= 2 and E.unit_last(write.indices, it):
                return True
    return False


def _longest_run(nests: list[_Nest], start: int, lead: int, validity: isl.UnionMap,
                 kernel: Kernel) -> tuple[list[_Nest], list[tuple[int, int]], list[_Nest], int]:
    """The longest run of nests from ``start`` that fuse along member ``lead`` of the
    first, the (member, shift) of each, the nests moved before it, and the index after
    it."""
    first = nests[start]
    run, choice, hoisted = [first], [(lead, 0)], []
    outer = _member(first.band, lead)
    j = start + 1
    while j < len(nests):
        nest = nests[j]
        pairs, reached = _pairs_into(run, nest, validity, kernel)
        placed = None if pairs.is_empty() else _place(nest, outer, pairs, reached)
        if placed is not None and _along_reuse(nest, placed[0], kernel):
            break  # (the nests before it may still fuse)
        if placed is not None:
            member, shift, upa = placed
            run.append(nest)
            choice.append((member, shift))
            outer = outer.union_add(upa)
        elif not reached:
            hoisted.append(nest)
        else:
            break
        j += 1
    while hoisted and nests[j - 1] is hoisted[-1]:
        hoisted.pop()  # trailing nests need not move: they stay after the run
        j -= 1
    return run, choice, hoisted, j


def _pairs_into(run: list[_Nest], nest: _Nest, validity: isl.UnionMap, kernel: Kernel
                ) -> tuple[isl.UnionMap, bool]:
    """The instance pairs that place ``nest`` after ``run``, and whether they are
    dependences: the dependences from the run into it, or where none reaches it, the
    pairs that read one element of what the run reads (it is placed beside them)."""
    into = validity.intersect_domain(_union(r.filter for r in run)).intersect_range(nest.filter)
    if not into.is_empty():
        return into, True
    return _shared_reads(run, nest, kernel), False


def _union(sets) -> isl.UnionSet:
    sets = list(sets)
    out = sets[0]
    for s in sets[1:]:
        out = out.union(s)
    return out


def _reads(nest: _Nest, kernel: Kernel, arrays: set[str]) -> isl.UnionMap:
    """``nest``'s affine reads of ``arrays``, statement instance -> element."""
    out = None
    for name in nest.names:
        s = kernel.statement(name)
        for a in s.reads:
            if a.array in arrays and a.is_affine:
                rel = isl.UnionMap.from_map(a.relation(s.domain))
                out = rel if out is None else out.union(rel)
    return out if out is not None else isl.UnionMap.empty(nest.filter.get_space())


def _shared_reads(run: list[_Nest], nest: _Nest, kernel: Kernel) -> isl.UnionMap:
    """Pairs of instances, one of the run and one of ``nest``, that read one element of
    an array no nest of them writes."""
    written = {kernel.statement(n).write.array for x in (*run, nest) for n in x.names}
    shared = _arrays(nest, kernel) & set().union(*(_arrays(r, kernel) for r in run))
    shared -= written
    if not shared:
        return isl.UnionMap.empty(nest.filter.get_space())
    mine = _reads(nest, kernel, shared)
    theirs = None
    for r in run:
        rel = _reads(r, kernel, shared)
        theirs = rel if theirs is None else theirs.union(rel)
    return theirs.apply_range(mine.reverse())


def _member(band: isl.ScheduleNode, m: int) -> isl.UnionPwAff:
    return band.band_get_partial_schedule().get_union_pw_aff(m)


def _place(nest: _Nest, outer: isl.UnionPwAff, pairs: isl.UnionMap, ordered: bool,
           skip: int | None = None) -> tuple[int, int, isl.UnionPwAff] | None:
    """The member of ``nest``'s band that keeps the instance pairs ``pairs`` (run ->
    ``nest``) closest in the fused loop, at most :data:`MAX_SPREAD` iterations apart,
    with its shift and its shifted schedule; None when there is none. ``ordered``: the
    pairs are dependences, so the shift puts every sink at or after its source; else
    it puts them as close as it can. ``skip``: a member not to take (the one a fused
    row loop took already)."""
    band = nest.band
    if band is None:
        return None
    members = range(band.band_n_member()) if band.band_get_permutable() else range(1)
    best = None
    for m in members:
        if m == skip:
            continue
        f = _member(band, m)
        gaps = isl.Set.from_union_set(
            pairs.apply_domain(isl.UnionMap.from_union_pw_aff(outer))
            .apply_range(isl.UnionMap.from_union_pw_aff(f)).deltas())
        low, high = gaps.dim_min_val(0), gaps.dim_max_val(0)
        if not (low.is_int() and high.is_int()):
            continue
        shift = max(0, -low.to_python()) if ordered else -low.to_python()
        spread = high.to_python() - low.to_python()
        if spread <= MAX_SPREAD and (best is None or spread < best[2]):
            best = (m, shift, spread, f)
    if best is None:
        return None
    m, shift, _, f = best
    return m, shift, _shifted(f, shift)


def _shifted(f: isl.UnionPwAff, shift: int) -> isl.UnionPwAff:
    return f.add(isl.UnionPwAff.val_on_domain(f.domain(), isl.Val.int_from_si(f.get_ctx(), shift)))


def _arrays(nest: _Nest, kernel: Kernel) -> set[str]:
    out: set[str] = set()
    for name in nest.names:
        s = kernel.statement(name)
        out |= {a.array for a in (s.write, *s.reads)}
    return out


def _footprint(nest: _Nest, kernel: Kernel, array: str) -> int:
    """The elements of ``array`` that ``nest`` reads (0 where unknown)."""
    touched = None
    for name in nest.names:
        s = kernel.statement(name)
        dom = s.domain.intersect_params(kernel.context)
        for a in s.reads:
            if a.array == array and a.is_affine:
                img = a.relation(dom).range()
                touched = img if touched is None else touched.union(img)
    if touched is None:
        return 0
    count = touched.project_out(isl.dim_type.param, 0,
                                touched.dim(isl.dim_type.param)).count_val()
    return count.to_python() if count.is_int() else 0


def saved_bytes(run: list[_Nest], kernel: Kernel) -> tuple[int, int]:
    """The bytes the run's nests read from memory when apart, and those of them the
    fused loop reads from cache instead: arrays no nest of the run writes, read again by
    a later nest where the array is larger than the L2; and arrays a nest passes to a
    later one that streams them (:func:`_passed_bytes`)."""
    written = set()
    for nest in run:
        written |= {kernel.statement(n).write.array for n in nest.names}
    cache = machine.l2_bytes()
    total = saved = 0
    for a in set().union(*(_arrays(n, kernel) for n in run)) - written:
        size = fixed_bytes(kernel, a)
        if size is None:
            return 0, 0
        item = D.itemsize(kernel.array(a).dtype)
        feet = [_footprint(n, kernel, a) * item for n in run]
        total += sum(feet)
        big = [f for f in feet if f > cache]
        if size > cache and len(big) > 1:
            saved += sum(big) - max(big)
    passed = _passed_bytes(run, kernel, cache)
    return total + passed, saved + passed


def _passed_bytes(run: list[_Nest], kernel: Kernel, cache: int) -> int:
    """The bytes of arrays larger than ``cache`` that a nest of the run writes and a
    later nest reads, when every nest of the run streams what it reads (at most
    :data:`STREAMED_READS` instances per element: stencils, elementwise steps and
    matrix-vector sweeps, not a convolution or a matrix product, whose tiles serve their
    reuse and whose parallel loops the fused loop would take). Apart, the reader finds
    the array in memory; fused, the rows just written (and with :mod:`polyc.share`, the
    storage cycles through a few rows of cache, as the Jacobi sweeps' in-place C does)."""
    if not all(_reads_once(nest, kernel) for nest in run):
        return 0
    out = 0
    for k, nest in enumerate(run):
        for a in {kernel.statement(n).write.array for n in nest.names}:
            size = fixed_bytes(kernel, a)
            if size is None or size <= cache:
                continue
            item = D.itemsize(kernel.array(a).dtype)
            out += sum(_footprint(later, kernel, a) for later in run[k + 1:]) * item
    return out


def _reads_once(nest: _Nest, kernel: Kernel) -> bool:
    """Whether ``nest`` runs at most :data:`STREAMED_READS` instances per element it
    reads (a stencil, an elementwise step, a matrix-vector sweep; not a convolution or a
    matrix product, which reuse what they read)."""
    return _instances(nest, kernel) <= STREAMED_READS * sum(
        _footprint(nest, kernel, a) for a in _arrays(nest, kernel))


def _along_reuse(nest: _Nest, member: int, kernel: Kernel) -> bool:
    """Whether fusing ``nest`` along ``member`` of its band would run the sum of a nest
    that reuses what it reads (a matrix product) outermost: its tiles, register tiles
    above all, then hold one step of the sum each (syrk at 1200, fused along ``k`` with
    the scaling and the packing of ``A``, its producers: 4x slower on one thread)."""
    return (not FUSE_ALONG_SUMS and nest.band is not None
            and not tiling.coincident_flags(nest.band)[member]
            and not _reads_once(nest, kernel))


def _instances(nest: _Nest, kernel: Kernel) -> int:
    """The statement instances of ``nest`` under the kernel's fixed sizes (the bounding
    box of each basic set of each domain: the copy of a stencil's borders, four strips,
    is not the square around them; a large number where unknown)."""
    n = 0
    for name in nest.names:
        dom = kernel.statement(name).domain.intersect_params(kernel.context).coalesce()
        pieces = dom.get_basic_set_list()
        for k in range(pieces.n_basic_set()):
            count = tiling.box_volume(isl.Set.from_basic_set(pieces.get_at(k)))
            if count is None:
                return 1 << 62
            n += count
    return n


def _worth_it(total: int, saved: int, options: Options, parallel: bool = False) -> bool:
    """Whether a run that reads ``total`` bytes of arrays it does not write, ``saved``
    of them again where they do not fit in the cache, reads them more than once by more
    bytes than the threads the fused loop gives up would make up for (none when it runs
    in ``parallel``: :func:`_private`)."""
    if saved == 0:
        return False
    threads = machine.threads(options.threads) if options.parallel and not parallel else 1
    return total > threads * (total - saved)


#: the fused loop may run in parallel with the sums it carries privatized (a switch
#: for measurements: :func:`_private`)
PRIVATE_SUMS = True
#: the largest array whose sums a fused loop privatizes (OpenMP gives each thread a
#: copy, on its stack)
PRIVATE_MAX_BYTES = 64 << 10
#: the element types whose C type adds as the statement does (not float16, whose
#: storage is its bits in a uint16_t)
PRIVATE_DTYPES = ("float32", "float64", "int32", "int64")


def _private(run: list[_Nest], choice: list[tuple[int, int]], coincidence: isl.UnionMap,
             kernel: Kernel) -> tuple[str, ...] | None:
    """The arrays whose sums the fused loop of ``run`` carries, when privatizing them
    (each thread adds into a copy, the copies added at the end: OpenMP's array
    reduction) leaves it no other dependence, so that it may run in parallel: every
    dependence between two fused iterations joins two instances of one statement that
    adds (``+=``) into an array of at most :data:`PRIVATE_MAX_BYTES`, reading it only at
    the element it writes, an array no other statement of the run touches. None where
    some other dependence crosses fused iterations. (mvt, atax, bicg: their
    ``A``-transposed product's vector, summed along the fused rows of ``A``; with the
    copies the fused loop, which reads ``A`` once, is also a parallel one.)"""
    if not PRIVATE_SUMS:
        return None
    dom = _union(n.filter for n in run)
    outer = None
    for nest, (member, shift) in zip(run, choice):
        f = _shifted(_member(nest.band, member), shift)
        outer = f if outer is None else outer.union_add(f)
    on = isl.UnionMap.from_union_pw_aff(outer)
    carried = coincidence.intersect_domain(dom).intersect_range(dom).subtract(
        on.apply_range(on.reverse())).intersect_params(kernel.context)
    maps: list[isl.Map] = []
    carried.foreach_map(maps.append)
    names = {m.get_tuple_name(isl.dim_type.in_) for m in maps if not m.is_empty()}
    if any(m.get_tuple_name(isl.dim_type.in_) != m.get_tuple_name(isl.dim_type.out)
           for m in maps if not m.is_empty()):
        return None
    arrays = tuple(sorted({kernel.statement(n).write.array for n in names}))
    inside = {n for nest in run for n in nest.names}
    return arrays if private_problem(kernel, inside, arrays) is None else None


def private_problem(kernel: Kernel, names: set[str], private: tuple[str, ...]) -> str | None:
    """Why a parallel loop over the statements ``names`` may not give each thread a
    copy of the ``private`` arrays, or None: each is written by one statement, which adds
    (``+=``) into it, reading it only at the element it adds to; none is touched by
    another statement; each has a fixed size of at most :data:`PRIVATE_MAX_BYTES` and a
    type of :data:`PRIVATE_DTYPES`. (:func:`_private` and :mod:`polyc.check` alike.)"""
    writers = [kernel.statement(n).write.array for n in names]
    if any(writers.count(a) > 1 for a in private):
        return f"more than one statement writes {[a for a in private if writers.count(a) > 1]}"
    for name in sorted(names):
        st = kernel.statement(name)
        if st.write.array in private:
            if st.op != "+" or not st.write.is_affine:
                return f"{name} does not add into {st.write.array}"
            if any(r.array == st.write.array and tuple(r.indices) != tuple(st.write.indices)
                   for r in E.reads(st.value)):
                return f"{name} reads {st.write.array} elsewhere than it adds"
        elif any(r.array in private for r in st.reads):
            return f"{name} touches {sorted({r.array for r in st.reads} & set(private))}"
    for a in private:
        size, dtype = fixed_bytes(kernel, a), kernel.array(a).dtype
        if size is None or size > PRIVATE_MAX_BYTES:
            return f"{a} has no fixed size of at most {PRIVATE_MAX_BYTES} bytes"
        if dtype not in PRIVATE_DTYPES:
            return f"{a} is {dtype}, whose C type does not add as its sums do"
    return None


def private_mark(arrays: tuple[str, ...], kernel: Kernel) -> str:
    """The ``private:`` mark (:mod:`polyc.marks`) above a fused loop whose threads may
    each add into their own copy of ``arrays``."""
    names = [a.name for a in kernel.arrays]
    return marks.private_mark([names.index(a) for a in arrays])


def private_arrays(mark: str, kernel: Kernel) -> tuple[str, ...] | None:
    """The arrays of a ``private:`` mark's name; None for another mark."""
    positions = marks.private_positions(mark)
    return None if positions is None else tuple(kernel.arrays[k].name for k in positions)


def _fused_field(mark: str, k: int) -> int | None:
    """Field ``k`` (0: rows, 1: columns) of a ``fused:R[:C]`` mark's name, or None."""
    head, *fields = mark.split(":")
    if head != FUSED or not 1 <= len(fields) <= 2 or k >= len(fields):
        return None
    return int(fields[k]) if fields[k].isdigit() else None


def fused_rows(mark: str) -> int | None:
    """The rows of a fused loop from its mark's name; None for another mark."""
    return _fused_field(mark, 0)


def fused_columns(mark: str) -> int | None:
    """The columns of a fused tile from its mark's name (``fused:R:C``: a band of rows
    and columns); None for a fused loop of rows alone or another mark."""
    return _fused_field(mark, 1)


def _rows(run: list[_Nest], choice: list[tuple[int, int]], kernel: Kernel,
          options: Options, total: int) -> int | None:
    """The values of the fused member one fused iteration runs: a multiple of the rows
    of every nest's register tile along it (a sum over another member keeps its
    independent rows), as many as let a quarter of the L2 hold those rows of the arrays
    read twice (``total``: the bytes the run reads of them); 1 when no nest has such a
    tile. None when the shifts would cut the register tiles (not multiples of the rows)."""
    tile = 1
    for nest, (member, _) in zip(run, choice):
        band = _fused_first(nest.band, member)
        flags = [bool(band.band_member_get_coincident(m)) for m in range(band.band_n_member())]
        for r in range(1, band.band_n_member()):
            plan = None if flags[r] else register_tile.plan_dot(band, kernel, options, r)
            if plan is not None and plan.u == 0:
                tile = math.lcm(tile, plan.mr)
    if tile == 1:
        return 1
    if any(shift % tile for _, shift in choice):
        return None
    first = run[0]
    member = choice[0][0]
    extent = cache_blocks.member_extent(_fused_first(first.band, member), kernel, 0)
    per_row = total // max(1, extent or 1) // len(run)
    return tile * max(1, machine.l2_bytes() // FUSED_L2_FRACTION // max(1, per_row * tile))


def _fused_first(band: isl.ScheduleNode, member: int) -> isl.ScheduleNode:
    if not member:
        return band
    n = band.band_n_member()
    return tiling.permute_band(band, [member] + [m for m in range(n) if m != member])


@dataclass(frozen=True)
class _Columns:
    """A run's second fused member: per nest its (member, shift), and the rows and
    columns of a fused tile."""
    choice: list[tuple[int, int]]
    rows: int
    columns: int


def _columns(run: list[_Nest], choice: list[tuple[int, int]], rows: int,
             validity: isl.UnionMap, kernel: Kernel, options: Options) -> _Columns | None:
    """The run's columns fused too, where its nests are stencil-like sweeps: each nest
    a second member, shifted so that every dependence between the nests goes forward
    or stays along it as well (Jacobi's sweeps, each a row and a column behind the
    one before), so that the fused band of rows and columns is permutable and its
    tiles run as a wavefront; None where the run is not such (a register tile's rows,
    a nest that reads a whole row of another: atax's sums; any reduction)."""
    if not FUSE_COLUMNS or rows != 1 or not _passed_bytes(run, kernel, machine.l2_bytes()):
        return None
    if any(n.band is None or not n.band.band_get_permutable() or n.band.band_n_member() < 2
           or any(kernel.statement(name).op != "=" for name in n.names) for n in run):
        return None  # (a sum: the tiles of one front could update one element at once)
    first = run[0]
    lead = choice[0][0]
    # (the outer members first: the last one is most often the contiguous one, best
    # kept whole for the vector loop)
    candidates = [m for m in range(first.band.band_n_member()) if m != lead]
    for m in candidates:
        picked = [(m, 0)]
        outer = _member(first.band, m)
        for k in range(1, len(run)):
            nest = run[k]
            pairs, reached = _pairs_into(run[:k], nest, validity, kernel)
            placed = None if pairs.is_empty() else \
                _place(nest, outer, pairs, reached, skip=choice[k][0])
            if placed is None:
                break
            member, shift, upa = placed
            picked.append((member, shift))
            outer = outer.union_add(upa)
        else:
            return _column_tile(run, choice, picked, kernel, options)
    return None


#: fuse a stencil run's columns as well as its rows, into tiles a wavefront runs in
#: parallel (:func:`_columns`; a switch for measurements)
FUSE_COLUMNS = True
#: column tiles a thread, at least (the wavefront's parallel loop)
COLUMN_TILES = 4
#: the share of the L1 the rows of one nest in a fused tile take (:func:`_column_tile`)
COLUMN_L1_FRACTION = 2


def _column_tile(run: list[_Nest], choice: list[tuple[int, int]],
                 columns: list[tuple[int, int]], kernel: Kernel, options: Options
                 ) -> _Columns | None:
    """The rows and columns of a tile of a run fused along both: on several threads
    the columns cut the first nest's column member into :data:`COLUMN_TILES` tiles a
    thread (a multiple of 16), for the wavefront; on one thread a tile takes the first
    nest's whole rows (the later nests' shifted ends fall in a second, narrow tile).
    The rows: as many as let one nest's rows of its arrays in a tile (the points of the
    members below them included) fit :data:`COLUMN_L1_FRACTION` of the L1.
    None on one thread where a tile would hold a single row.

    One thread cuts no columns: shorter sweeps with skewed ends kept more of a tile in
    the L1 but ran slower than whole rows fused from the L2 (Zen 2 EPYC, float32, A/B
    in one run of ``bench_polybench``: jacobi-2d 3.56 -> 3.22 ms, its 9-point form
    5.25 -> 4.52 ms, heat-3d 5.37 -> 5.41 ms)."""
    first = run[0]
    n = first.band.band_n_member()
    extents = [cache_blocks.member_extent(first.band, kernel, m) for m in range(n)]
    if any(e is None for e in extents):
        return None
    threads = machine.threads(options.threads) if options.parallel else 1
    cols = extents[columns[0][0]]
    if threads > 1:
        cols = -(-cols // (COLUMN_TILES * threads) // 16) * 16
    inner = 1
    for m in range(n):
        if m not in (choice[0][0], columns[0][0]):
            inner *= extents[m]
    per_point = max(sum(D.itemsize(kernel.array(a).dtype) for a in _arrays(nest, kernel))
                    for nest in run)
    rows = machine.l1d_bytes() // COLUMN_L1_FRACTION // (cols * inner * per_point)
    if rows < 2 and threads == 1:
        return None  # (a tile of one row reuses no more than the fused rows do: only a
        # wavefront pays for it; heat-3d at 120, one thread: 1.05x the time)
    return _Columns(columns, max(1, rows), cols)


def _rebuild(schedule: isl.Schedule, kernel: Kernel, order: list,
             fused: dict[int, tuple[list[tuple[int, int]], int, _Columns | None,
                                    tuple[str, ...] | None]]) -> isl.Schedule:
    ctx = schedule.get_ctx()
    filters = isl.UnionSetList.alloc(ctx, len(order))
    for part in order:
        if isinstance(part, list):
            u = part[0].filter
            for nest in part[1:]:
                u = u.union(nest.filter)
            filters = filters.add(u)
        else:
            filters = filters.add(part.filter)
    top = schedule.get_root().child(0).insert_sequence(filters)
    for pos in sorted(fused, reverse=True):
        run, (choice, rows, columns, private) = order[pos], fused[pos]
        node = top.child(pos).child(0)  # the run's sequence of nests
        outer = across = None
        for k, (nest, (member, shift)) in enumerate(zip(run, choice)):
            band = node.child(k).child(0)
            f = _shifted(_member(band, member), shift)
            if rows > 1:
                f = f.scale_down_val(isl.Val.int_from_si(ctx, rows)).floor()
            outer = f if outer is None else outer.union_add(f)
            if columns is not None:
                m, c = columns.choice[k]
                g = _shifted(_member(band, m), c).scale_down_val(
                    isl.Val.int_from_si(ctx, columns.columns)).floor()
                across = g if across is None else across.union_add(g)
            node = _fused_first(band, member).parent().parent()
        if columns is None:
            mupa = isl.MultiUnionPwAff.from_union_pw_aff(outer)
            node = node.insert_partial_schedule(mupa)  # (not coincident: parallel only
            node = node.insert_mark(isl.Id(f"{FUSED}:{rows}"))  # with its sums private)
            if private is not None:
                node = node.insert_mark(isl.Id(private_mark(private, kernel)))
        else:  # (permutable: optimize runs its tiles as a wavefront)
            node = node.insert_partial_schedule(tiling.multi_union_pw_aff([outer, across]))
            node = node.band_set_permutable(1)
            node = node.insert_mark(isl.Id(f"{FUSED}:{rows}:{columns.columns}"))
        top = node.parent().parent()
    return top.get_schedule()
