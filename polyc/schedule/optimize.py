"""From isl's schedule to the one we generate code for: order, tile, mark.

One top-down walk over the schedule tree. At each band:

1. **order** (permutable bands): coincident members first, then the others, and the
   most contiguous member (see :mod:`.vector` and :func:`_innermost_member`) last, so
   the innermost point loop is the vector loop — isl's own order often puts a
   reduction innermost — unless a reduction loop is the contiguous one;
2. **tile** (permutable bands of two or more members) with ``Options.tile`` sizes or
   the default rule;
3. **parallel**: the outermost coincident member on the path becomes ``omp parallel
   for`` (a ``"parallel"`` mark above a band that starts with it);
4. **simd**: in a band with no band below it, a coincident last member with a positive
   stride-1 score is split off and marked ``"simd"`` (a one-loop band may carry both
   marks: ``omp parallel for simd``);
5. **registers**: such a leaf band that is also a contraction is tiled once more for
   registers (:mod:`.register_tile`: unroll-and-jam, accumulators in a local array; an
   integer sum contiguous along its reduction in every operand takes the dot-product
   form, the reduction innermost and vectorized by the C compiler); where all the
   updates of an element run in one register tile, the accumulator starts
   from the reduction's initial constant and the initialisation leaves the schedule
   (:func:`drop_dead_inits`).

6. **stencil tiles**: the points of a tiled *skewed* band (a time-tiled or diamond
   stencil: a member such as ``2t + i``) run in the statements' program order inside
   each tile (:func:`_program_order_points`): each innermost loop is one statement's
   unit-stride sweep instead of a skewed loop interleaving fused statements behind
   guards (jacobi-1d 0.22x -> 0.53x of gcc at 1 thread, jacobi-2d 1.0x -> 1.5x); a
   time-skewed tile's innermost member is long, so that sweep is too
   (:func:`_stencil_rows`: jacobi-1d 0.53x -> 1.23x).

   A band of stencil sweeps fused along rows and columns (:mod:`.fuse`: ``fused:R:C``)
   runs its tiles as a wavefront on several threads (:func:`_fused_tiles`); every
   wavefront gets a ``wavefront`` mark, so that code generation opens one parallel
   region around the loop over its fronts.

7. **vector reductions**: a leaf band over one max or min reduction whose reduction
   member walks its reads' contiguous index, where every coincident member would
   gather (a softmax's row maxima), runs that member innermost under a ``"reduce"``
   mark, an OpenMP SIMD reduction (:func:`_vector_reduction`); float sums keep their
   order and never get one.

A specialised kernel whose band does little work (fewer than :data:`TINY_WORK`
statement instances, each weighted by the elements it reads) gets no ``parallel``
mark: OpenMP's start-up would cost more. (A parallel region costs a few microseconds
here. At 32k the transformer layer of the benchmarks ran 1.8x slower on 2 threads
than on 1 once its bands had multi-trip parallel loops; at 1M the copies and
epilogues of ResNet-50's convolutions (200k-800k elements each) stayed sequential:
58 -> 55 ms at 2 threads with 256k. At 128k the padded copies of the Winograd layers
run parallel too, and a sequential nest no longer reads what both threads wrote
(ResNet-18 on 2 threads 11.8 -> 11.1 ms, and 19.5 -> 17.9 ms while the host has the
two vCPUs far apart, a cross-core round trip of 350 ns instead of 60).)

Marks only carry decisions to code generation; :func:`polyc.check.check_schedule`
verifies every one of them against the dependences.
"""
from __future__ import annotations

import dataclasses

import islpy as isl

from .. import dtypes as D
from .. import expr as E
from ..ir import Access, Kernel, fixed_bytes
from ..options import Options
from . import cache_blocks, fuse, machine, register_tile, tiling
from .vector import REDUCE, best_member, member_iterators, reduction_member, stride_score

PARALLEL = "parallel"
SIMD = "simd"
#: above a wavefront's loop over its fronts: one parallel region around it, the
#: parallel loop of each front shared by its threads (``codegen``)
WAVEFRONT = "wavefront"
#: beside a ``parallel`` mark: the loop's iterations go to the threads in turn
#: (``schedule(static, 1)``), for tiles of unequal work (:func:`_cyclic_pays`)
CYCLIC = "cyclic"

#: default tile sizes: outer members, reduction (non-coincident) members, vector member
DEFAULT_TILE_OUTER = 32
DEFAULT_TILE_REDUCTION = 64
DEFAULT_TILE_VECTOR = 512
#: reduction tile of a register-tiled band: the accumulators are copied in and out
#: once per reduction tile (256: measured best for float32 matmul on AVX-512); the
#: machine's own (:func:`reduction_chunk`) replaces it where :data:`CHUNK_FROM_L1`
DEFAULT_TILE_REDUCTION_REGISTER = 256
#: size the register tile's reduction chunk from the L1 (:func:`reduction_chunk`)
CHUNK_FROM_L1 = True
#: the share of the L1 a register tile's rows of a reduction chunk take, and the longest
#: chunk (:func:`reduction_chunk`)
CHUNK_L1_FRACTION = 1
CHUNK_MAX = 1024
#: a register tile's whole reduction in one tile where its operands' strips fit the
#: caches (:func:`_whole_reduction`; a switch for measurements)
WHOLE_REDUCTION = True
#: the reduction tile of a dot-product register tile (``register_tile.plan_dot``): each
#: reduction tile ends in a horizontal sum of every accumulator vector
DOT_TILE_REDUCTION = 4096
#: statement instances under a band below which a specialised kernel stays sequential
TINY_WORK = 1 << 17


def optimize(schedule: isl.Schedule, kernel: Kernel, options: Options,
             drop_inits: bool = True) -> isl.Schedule:
    """Order, tile and mark every band of ``schedule`` (see the module doc);
    ``drop_inits=False`` keeps the initialisations register tiles could start from."""
    root = schedule.get_root()
    node = _visit(root.child(0), kernel, options, parallel_done=not options.parallel, tile=True)
    return drop_dead_inits(node.get_schedule(), kernel) if drop_inits else node.get_schedule()


def drop_dead_inits(schedule: isl.Schedule, kernel: Kernel) -> isl.Schedule:
    """``schedule`` without the reduction initialisations that register tiles start
    their accumulators from (:func:`register_tile.first_visit_init`): the array is then
    neither zeroed nor read back before the reduction, two passes over it fewer."""
    dead = register_tile.dropped_inits(schedule)
    if not dead:
        return schedule
    keep = isl.UnionSet.empty(schedule.get_domain().get_space())
    for s in kernel.statements:
        if s.name not in dead:
            keep = keep.union(isl.UnionSet.from_set(s.domain))
    return schedule.intersect_domain(keep)


def _visit(node: isl.ScheduleNode, kernel: Kernel, options: Options,
           parallel_done: bool, tile: bool, fused: int | None = None) -> isl.ScheduleNode:
    """Edit the subtree at ``node``; returns the node at the same position. ``fused``:
    the rows of the fused loop above (:mod:`.fuse`), for the bands of its nests."""
    if node.get_type() == isl.schedule_node_type.mark \
            and fuse.private_arrays(node.mark_get_id().get_name(), kernel) is not None:
        return _private_fused(node, kernel, options, parallel_done, tile)
    if node.get_type() == isl.schedule_node_type.mark:
        rows = fuse.fused_rows(node.mark_get_id().get_name())
        if rows is not None and fuse.fused_columns(node.mark_get_id().get_name()):
            return _fused_tiles(node, kernel, options, parallel_done)
        if rows is not None:  # a fused loop: no parallel loops below it, and its rows
            node = node.delete()  # are the tiles of its nests' fused member
            seq = _visit(node.child(0), kernel, options, True, tile, rows)
            return seq.parent()
    if node.get_type() != isl.schedule_node_type.band:
        for i in range(node.n_children()):
            node = _visit(node.child(i), kernel, options, parallel_done, tile,
                          fused).parent()
        return node
    return _visit_band(node, kernel, options, parallel_done, tile, fused)


def _private_fused(mark: isl.ScheduleNode, kernel: Kernel, options: Options,
                   parallel_done: bool, tile: bool) -> isl.ScheduleNode:
    """A fused loop under a ``private:`` mark (:func:`.fuse._private`): where several
    threads run and no loop above is parallel, a parallel loop whose threads each add
    into their own copies of the mark's arrays (the mark stays for code generation and
    the checks); else the fused loop as any. Two threads, double, PolyBench LARGE: mvt
    1.25 -> 0.56 ms, atax 1.26 -> 0.60, bicg 1.23 -> 0.78, their matrix read once and
    by both threads."""
    fused = mark.child(0)
    band = fused.child(0)
    if parallel_done or not options.parallel or machine.threads(options.threads) < 2 \
            or band.get_type() != isl.schedule_node_type.band or _is_tiny(band, kernel):
        return _visit(mark.delete(), kernel, options, parallel_done, tile)
    rows = fuse.fused_rows(fused.mark_get_id().get_name())
    band = fused.delete()  # the fused loop's band
    band = band.insert_mark(isl.Id(PARALLEL)).child(0)
    seq = _visit(band.child(0), kernel, options, True, tile, rows)
    return seq.parent().parent().parent()


def _fused_tiles(mark: isl.ScheduleNode, kernel: Kernel, options: Options,
                 parallel_done: bool) -> isl.ScheduleNode:
    """A band of fused rows and columns (:func:`.fuse.fused_columns`): its tiles run as
    a wavefront, the tiles of one front in parallel, and inside a tile each nest sweeps
    its rows of the tile in turn, untiled (its innermost loop a vector loop). A band
    doing too little for a parallel region (:func:`_is_tiny`) runs its tiles in order."""
    node = mark.delete()
    climb = 0
    if not parallel_done and machine.threads(options.threads) > 1 \
            and not _is_tiny(node, kernel):
        node = _wavefront(node)
        climb = 3
    node = _visit(node.child(0), kernel, options, True, False).parent()
    for _ in range(climb):
        node = node.parent()
    return node


def _wavefront(tiles: isl.ScheduleNode, sizes: list[int] | None = None) -> isl.ScheduleNode:
    """The tile band ``tiles`` as a wavefront (:func:`.tiling.wavefront`), its inner band
    parallel: returns that band, below three new nodes (a ``wavefront`` mark, the band
    of the fronts and a ``parallel`` mark)."""
    inner = tiling.wavefront(tiles, sizes)
    front = inner.parent().insert_mark(isl.Id(WAVEFRONT)).child(0)
    return front.child(0).insert_mark(isl.Id(PARALLEL)).child(0)


def _visit_band(node: isl.ScheduleNode, kernel: Kernel, options: Options,
                parallel_done: bool, tile: bool, fused: int | None = None
                ) -> isl.ScheduleNode:
    marks_above = 0  # marks inserted above ``node``: climb back over them at the end
    if REDUCE_ALONG_ROWS and options.vectorize and _is_leaf_band(node) \
            and node.band_get_permutable():
        r = reduction_member(node, kernel)
        if r is not None:
            return _vector_reduction(node, r, kernel, parallel_done)
    skewed = _is_skewed(node)
    inner, simd = _innermost_member(node, kernel) if _is_leaf_band(node) else (None, False)
    vec = inner if simd and options.vectorize else None
    group = _byte_group(node, kernel, vec) if node.band_get_permutable() else None
    did_tile = False
    reg = None
    jam = 1  # steps of the sum unrolled and jammed into the vector loop (:func:`_jam`)
    if node.band_get_permutable() and node.band_n_member() > 1:
        order = _member_order(node, inner, kernel)
        if group is not None:  # the lanes, then their bytes (unrolled) innermost
            order = [i for i in order if i not in (group, inner)] + [group, inner]
        node = tiling.permute_band(node, order)
        fused_at = order.index(0) if fused is not None else None
        vec = None if vec is None else node.band_n_member() - (2 if group is not None else 1)
        reg = register_tile.plan(node, kernel, options, vec)
        if reg is None and inner is not None and not simd:
            reg = register_tile.plan_dot(node, kernel, options, node.band_n_member() - 1)
        sizes = _tile_sizes(node, options, vec)
        if sizes is not None and reg is None and options.tile is True \
                and cache_blocks.streams(node, kernel):
            sizes = None  # rows reuse all there is to reuse: no tiles
        if sizes is not None and reg is None and options.tile is True and SUMS_IN_ROWS \
                and vec == node.band_n_member() - 1 \
                and cache_blocks.sums_down_columns(node, kernel):
            # whole rows (one tile per member; the threads' cut comes below)
            sizes = [cache_blocks.whole_tile(node, kernel, i) or t
                     for i, t in enumerate(sizes)]
            jam = JAM_SUMS if node.band_n_member() == 2 else 1
        if sizes is not None and reg is not None and options.tile is True:
            flags = tiling.coincident_flags(node)
            chunk = reduction_chunk(reg.mr, D.itemsize(kernel.array(reg.array).dtype))
            sizes = [t if flags[i] else chunk for i, t in enumerate(reg.round_sizes(sizes))]
            if reg.quad:  # whole reductions: the tile's sums are complete at its
                # copy-out, where the requantization runs (no int32 pass over memory)
                sizes = [t if flags[i] else
                         cache_blocks.member_extent(node, kernel, i) or t
                         for i, t in enumerate(sizes)]
                if QUAD_PANELS:
                    sizes = _fit_panel(sizes, node, kernel, reg)
                    sizes = cache_blocks.fit_rows(sizes, node, kernel, reg, options)
            elif reg.dot is None:
                sizes = _whole_reduction(sizes, node, kernel, reg)
                sizes = _fit_panel(sizes, node, kernel, reg)
                sizes = _fit_depth(sizes, node, kernel, reg)
                sizes = cache_blocks.fit_rows(sizes, node, kernel, reg, options)
                if fused_at is None and group is None:
                    node, sizes, reg = _panels_inside_rows(node, sizes, kernel, reg)
            else:  # one horizontal sum per accumulator per reduction tile: few tiles,
                # of balanced sizes (4608 as 2 x 2304, not 4096 + 512)
                k = cache_blocks.member_extent(node, kernel, reg.dot)
                sizes[reg.dot] = DOT_TILE_REDUCTION if not k else \
                    -(-k // -(-k // DOT_TILE_REDUCTION))
        if skewed and sizes is not None and reg is None and options.tile is True:
            sizes = _stencil_rows(sizes, node, kernel, machine.threads(options.threads))
        if fused_at is not None and sizes is not None:
            sizes[fused_at] = fused  # one tile per fused iteration
        if tile and sizes is not None:
            extents = [cache_blocks.member_extent(node, kernel, i)
                       for i in range(node.band_n_member())]
            if not parallel_done and options.tile is True and not _is_tiny(node, kernel):
                # (a band too small for a parallel loop keeps whole tiles: the class
                # loops of NonMaxSuppression's greedy steps, cut in two, no longer ran
                # as one vector loop of 16 and one of 4)
                threads = machine.threads(options.threads)
                flags = tiling.coincident_flags(node)
                sizes = _split_for_threads(sizes, extents, flags, reg, threads)
                par = _parallel_member(node, kernel, sizes, extents, flags, reg, threads)
                if BALANCE_TILES:
                    sizes = _balanced(sizes, extents, par, reg, threads)
                    sizes, par = _evened(sizes, extents, flags, reg, threads, par)
            else:
                par = None
            node = tiling.tile_band(node, sizes)
            did_tile = True
            if (not parallel_done and options.parallel and not any(tiling.coincident_flags(node))
                    and machine.threads(options.threads) > 1
                    and _reductions_apart(node, kernel)):
                # no parallel loop (a skewed stencil's time tiles): a wavefront of tiles
                node = _wavefront(node, sizes)
                marks_above += 3
                parallel_done = True
            if not parallel_done:
                node = _parallel_first(node, sizes, extents, par)
    if not parallel_done and tiling.coincident_flags(node)[0]:
        if not _is_tiny(node, kernel):
            if did_tile and CYCLIC_TRIANGLES and _cyclic_pays(node, kernel, options):
                node = node.insert_mark(isl.Id(CYCLIC)).child(0)
                marks_above += 1
            node = node.insert_mark(isl.Id(PARALLEL)).child(0)
            marks_above += 1
        parallel_done = True
    inner = node.child(0) if did_tile else node  # the band holding the point loops
    tiled = register_tile.apply(inner, reg, kernel) if reg is not None and did_tile else None
    if tiled is None and reg is not None and did_tile and vec is not None and group is None:
        split = register_tile.apply_full_tiles(inner, reg, kernel)
        if split is not None:
            tiled, rest_tiled = split
            if not rest_tiled:  # the other points: the band as it was, its vector loop
                tiled = _mark_simd(tiled.child(1).child(0)).parent().parent()
    if tiled is not None:
        inner = tiled
    elif did_tile and skewed and POINTS_IN_PROGRAM_ORDER:
        inner = _program_order_points(inner, kernel)
    elif vec is not None and group is not None:
        inner = _mark_simd_groups(inner)
    elif vec is not None and jam > 1 and did_tile:
        inner = _jam(inner, jam, sizes[0])
    elif vec is not None:
        inner = _mark_simd(inner)
    else:
        for i in range(inner.n_children()):
            inner = _visit(inner.child(i), kernel, options, parallel_done, tile).parent()
    node = inner.parent() if did_tile else inner
    for _ in range(marks_above):
        node = node.parent()
    return node


#: the most points along the innermost member of a skewed band's tile
#: (:func:`_stencil_rows`)
STENCIL_ROW = 2048
#: the fewest tiles a thread along that member (:func:`_stencil_rows`)
STENCIL_TILES = 4


def _stencil_rows(sizes: list[int], node: isl.ScheduleNode, kernel: Kernel,
                  threads: int) -> list[int]:
    """A skewed band's tile sizes with its innermost member longer: up to
    :data:`STENCIL_ROW` points, a multiple of 64, as long as the points of a tile along
    its members after the first (the time loop), times the bytes each point of the
    statements writes and reads, fit a quarter of the L2. The points of a tile run in
    program order (:func:`_program_order_points`), each statement's innermost loop one
    vector sweep of that length: jacobi-1d (float, 400000 points, 300 steps) in 64 x 64
    tiles ran 64-point sweeps at 0.53x gcc's untiled loops. The member keeps at least
    :data:`STENCIL_TILES` tiles a thread, for the wavefront's parallel loop (seidel-2d
    over 1000 columns in 512-point tiles ran 2 threads at the speed of one)."""
    names = member_iterators(node, 0)
    if not names or any(it is None for it in names.values()):
        return sizes  # (the first member not the time loop: diamond tiles, whose
        # concurrent start wants them as they are; jacobi-1d 2 threads 0.63x -> 0.44x)
    per_point = 0
    for name in names:
        st = kernel.statement(name)
        if any(r.array == st.write.array for r in E.reads(st.value)):
            return sizes  # in place (Gauss-Seidel): its sweeps do not vectorize, and
            # longer rows only lengthen the wavefront (seidel-2d: 2.03x -> 1.52x gcc)
        arrays = {a.array for a in (st.write, *st.reads)}
        per_point += sum(D.itemsize(kernel.array(a).dtype) for a in arrays)
    inner = len(sizes) - 1
    other = 1
    for t in sizes[1:inner]:
        other *= t
    budget = machine.l2_bytes() // 4 // max(1, per_point * other)
    row = max(sizes[inner], min(STENCIL_ROW, budget // 64 * 64))
    extent = _member_span(node, kernel, inner)
    if extent is None:
        return sizes
    row = min(row, extent // (STENCIL_TILES * threads) // 64 * 64)
    return sizes[:inner] + [max(sizes[inner], row)]


def _member_span(node: isl.ScheduleNode, kernel: Kernel, member: int) -> int | None:
    """How many values the band member takes over the band's domain (max - min + 1,
    under the kernel's fixed sizes; a skewed ``2t + i`` too); None where unknown."""
    upa = node.band_get_partial_schedule().get_union_pw_aff(member)
    values = isl.UnionMap.from_union_pw_aff(upa).intersect_domain(node.get_domain()) \
        .range().intersect_params(kernel.context)
    sets: list[isl.Set] = []
    values.foreach_set(sets.append)
    return tiling.box_volume(sets[0]) if len(sets) == 1 else None


#: inside the tiles of a skewed band (time-tiled stencils), run the points in program
#: order: see :func:`_program_order_points`
POINTS_IN_PROGRAM_ORDER = True


def _is_skewed(node: isl.ScheduleNode) -> bool:
    """A band of two or more members one of which combines iterators of a statement
    (``2t + i``: a time-skewed or diamond stencil band)."""
    if node.band_n_member() < 2:
        return False
    found = [False]

    def piece(_set: isl.Set, aff: isl.Aff) -> None:
        n = aff.dim(isl.dim_type.in_)
        used = [i for i in range(n) if not aff.get_coefficient_val(isl.dim_type.in_, i)
                .is_zero()]
        found[0] = found[0] or len(used) > 1

    mupa = node.band_get_partial_schedule()
    for m in range(node.band_n_member()):
        mupa.get_union_pw_aff(m).foreach_pw_aff(lambda pa: pa.foreach_piece(piece))
    return found[0]


def _program_order_points(points: isl.ScheduleNode, kernel: Kernel) -> isl.ScheduleNode:
    """The point band of a tiled skewed band replaced by the statements' program order
    (``for t: { for i: S0; for i: S1 }`` within each tile) -- legal because the tiles
    stay atomic and in their legal order, and within one tile program order runs every
    dependence forwards. The skewed point loops interleave fused statements with guards
    in the innermost loop and carry dependences there; in program order each innermost
    loop is one statement's unit-stride sweep that the C compiler vectorizes."""
    from ..deps import program_order
    dom = points.get_domain()
    order = program_order(kernel).intersect_domain(dom)
    if order.is_empty():  # no instance for these sizes (pluto fuzz seed 13525)
        return points
    node = points.delete().insert_partial_schedule(isl.MultiUnionPwAff.from_union_map(order))
    return node


def reduction_chunk(mr: int, itemsize: int) -> int:
    """The reduction tile of a register tile's reduction members: the largest power of
    two (from 128 to :data:`CHUNK_MAX`) whose ``MR`` rows of the row operand (``MR x
    kc`` of matmul's ``A``) fit in the L1 data cache (:data:`CHUNK_L1_FRACTION`). Fewer
    chunks copy the accumulators in and out fewer times and restart the tile's streams
    less often. A 32 KB or 48 KB L1 gets 1024 float32 steps of 6 rows. On a Zen 2 EPYC
    (32 KB L1, 6x16 tiles), A/B in one process, one thread, 1024 against 256 (a quarter
    of the L1, the rule before): matmul 4096 84.5 -> 91.3 GFLOP/s, 3072 85.2 -> 91.3,
    128x3072x768 73.1 -> 76.3, 256x4096x1024 79.3 -> 84.3; two threads 4096 168 -> 177,
    3072 168 -> 179; BERT 0.98x the time, ResNet-18/50 and MobileNetV2 1.00x. On a Zen 5
    EPYC 512 against 256 had measured matmul 4096 235 -> 242 GFLOP/s, 512x4096x512
    232 -> 238, 128x3072x768 205 -> 211 (1024 not measured there);
    :data:`DEFAULT_TILE_REDUCTION_REGISTER` where :data:`CHUNK_FROM_L1` is off."""
    if not CHUNK_FROM_L1:
        return DEFAULT_TILE_REDUCTION_REGISTER
    fit = machine.l1d_bytes() // CHUNK_L1_FRACTION // max(1, mr * itemsize)
    return max(128, min(CHUNK_MAX, 1 << max(0, fit.bit_length() - 1)))


def _whole_reduction(sizes: list[int], node: isl.ScheduleNode, kernel: Kernel,
                     reg: register_tile.Plan) -> list[int]:
    """``sizes`` with every reduction member whole when a register tile's column panel
    (``K x NR`` of a matmul's ``B``) fits in half the L2 and either its rows of the
    reduction (``MR x K`` of ``A``) fit in the L1 data cache or the panel fits in a
    quarter of the L2: each register tile then sums its whole reduction in registers,
    stored once, instead of copying its accumulators in and out once per reduction
    chunk (:func:`reduction_chunk`) and restarting its streams. On a Zen 4 EPYC
    (32 KB L1), one thread, float32: 128x768x3072 81 -> 88 GFLOP/s, 1024^3 101 -> 108.
    Rows of ``A`` past the L1 stream through it once per panel either way; on a Zen 2
    EPYC (32 KB L1, 512 KB L2, 6x16 tiles), A/B in one process, one thread: 2048^3
    87.8 -> 90.6 GFLOP/s, 1024x2048x1024 87.6 -> 94.5, 512x2048x512 83.3 -> 90.9,
    ResNet-50 0.986x the time; two threads 2048^3 165 -> 173. A panel of half the L2
    (4096^3 there) does not: 84.9 -> 69.4."""
    flags = tiling.coincident_flags(node)
    depth = 1
    for i, coincident in enumerate(flags):
        if not coincident:
            extent = cache_blocks.member_extent(node, kernel, i)
            if extent is None:
                return sizes
            depth *= extent
    item = D.itemsize(kernel.array(reg.array).dtype)
    panel = depth * reg.nr * item
    if not WHOLE_REDUCTION or panel > machine.panel_bytes() or \
            (reg.mr * depth * item > machine.l1d_bytes() and panel > machine.l2_bytes() // 4):
        return sizes
    return [t if flags[i] else max(t, cache_blocks.member_extent(node, kernel, i) or t)
            for i, t in enumerate(sizes)]


def _fit_panel(sizes: list[int], node: isl.ScheduleNode, kernel: Kernel,
               reg: register_tile.Plan) -> list[int]:
    """Narrow the cache tile of the operand panel the vector member walks (one reduction
    tile deep: ``B[k-tile][n-tile]`` of a matmul, ``W[mb][kh][kw][c-tile][mi]`` of a
    channel-last conv) until it fits half the L2 cache; the register tiles of one cache
    tile then reuse it from L2 instead of streaming it from memory once per row tile (a
    3x3 conv over 512 channels has a 4.7 MB panel at the default 512 columns: 7x slower).
    The vector member shrinks first (to whole register tiles), then the other parallel
    members that index the panel (a blocked conv's weight block ``mb``). Matmul's
    ``256 x 512`` float panel is exactly half of a 1 MB L2 and stays as it is."""
    depth = cache_blocks.reduction_depth(sizes, node, kernel)
    itemsize = D.itemsize(kernel.array(reg.array).dtype)
    cols = machine.panel_bytes() // max(1, depth * itemsize)
    sizes = list(sizes)
    sizes[reg.v] = max(reg.nr, min(sizes[reg.v], cols // reg.nr * reg.nr))
    rest = cols // sizes[reg.v]
    for i in _panel_members(node, kernel, reg):
        sizes[i] = max(1, min(sizes[i], rest))
        rest //= sizes[i]
    return sizes


#: split a float register tile's reduction where its panel, at its narrowest, still
#: exceeds half the L2 (:func:`_fit_depth`; a switch for measurements)
FIT_DEPTH = True


def _fit_depth(sizes: list[int], node: isl.ScheduleNode, kernel: Kernel,
               reg: register_tile.Plan) -> list[int]:
    """``sizes`` with the largest reduction member cut into balanced tiles where the
    operand panel of one cache tile exceeds half the L2 even at the columns
    :func:`_fit_panel` left: the reduction chunk (:func:`reduction_chunk`) bounds each
    reduction member, not their product, so a 3x3 convolution over 512 channels keeps
    a panel of ``9 * 512`` steps: 1.2 MB at 64 columns, which its rows then stream from
    the L3 (ResNet-50's last 3x3 convolutions ran at 57% of the FMA peak where those
    over 128 and 256 channels ran at 85-89%, Xeon with a 2 MB L2). Each register tile
    then sums the channels in two or more tiles, its accumulators copied in and out
    once per tile."""
    if not FIT_DEPTH or reg.v is None:
        return sizes
    item = D.itemsize(kernel.array(reg.array).dtype)
    width = 1
    for i in [reg.v] + _panel_members(node, kernel, reg):  # (a tile past its extent:
        width *= min(sizes[i], cache_blocks.member_extent(node, kernel, i) or sizes[i])
    depth = cache_blocks.reduction_depth(sizes, node, kernel)  # the extent counts)
    budget = machine.panel_bytes()
    if depth * item * width <= budget:
        return sizes
    flags = tiling.coincident_flags(node)
    extents = {i: min(sizes[i], cache_blocks.member_extent(node, kernel, i) or sizes[i])
               for i in range(len(sizes)) if not flags[i]}
    if not extents:
        return sizes
    r = max(extents, key=lambda i: extents[i])
    fit = budget // (item * width * (depth // extents[r]))
    if fit < 1 or fit >= extents[r]:
        return sizes
    chunks = -(-extents[r] // fit)
    sizes = list(sizes)
    sizes[r] = -(-extents[r] // chunks)
    return sizes


#: size an integer-dot tile's weight panel to the L2 and its rows to the rest, as float
#: tiles are (:func:`_fit_panel`, :func:`cache_blocks.fit_rows`)
QUAD_PANELS = True


#: run a small panel's other members inside the register tile's row loop (see
#: :func:`_panels_inside_rows`)
PANELS_INSIDE_ROWS = True
#: the largest panel run inside the rows (None: an eighth of the L2, see
#: :func:`_panels_inside_rows`)
INSIDE_ROWS_PANEL_BYTES: int | None = None


def _panels_inside_rows(node: isl.ScheduleNode, sizes: list[int], kernel: Kernel,
                        reg: register_tile.Plan
                        ) -> tuple[isl.ScheduleNode, list[int], register_tile.Plan]:
    """The band, its sizes and plan with the panel's other members (:func:`_panel_members`:
    the weight blocks ``mb`` of a channel-last conv) moved just inside the register
    tile's rows, when each is whole in a cache tile and the whole panel they span fits
    in an eighth of the L2 (:data:`INSIDE_ROWS_PANEL_BYTES` overrides it): each row strip
    then meets every column block while it is in L1, and each pixel's output channels are
    written together instead of in one pass per block. MobileNetV2's 112x112 16 -> 96 1x1 conv (three 32-channel blocks of a
    6 KB panel) took 0.68 ms with the blocks outside the rows, 0.60 ms inside. Panels
    up to an eighth of the L2 pay too, although they stream from the L2 instead of
    staying in L1: ResNet-50's 56x56 1x1 convs (64 KB and 128 KB panels, K of 64 and
    256) on an Emerald Rapids Xeon with a 2 MB L2, each kernel A/B in one process, one
    thread: 0.995 -> 0.778, 1.022 -> 0.898, 1.287 -> 1.150 and 1.538 -> 1.468 ms (two
    threads: 1.01-1.08x on the smallest, 0.89-0.95x on the others); the blocks outside
    wrote each pixel's output channels in one strided pass per block, re-reading the
    rows of the residual and the input each time. Larger panels keep the blocks outside:
    their block is the one that stays in cache while the rows stream past it."""
    members = _panel_members(node, kernel, reg)
    if not PANELS_INSIDE_ROWS or not members or reg.v is None or reg.u is None:
        return node, sizes, reg
    extents = {i: cache_blocks.member_extent(node, kernel, i) for i in members + [reg.v]}
    if any(e is None or sizes[i] < e for i, e in extents.items() if i != reg.v):
        return node, sizes, reg
    item = D.itemsize(kernel.array(reg.array).dtype)
    panel = cache_blocks.reduction_depth(sizes, node, kernel) * item * \
        min(sizes[reg.v], extents[reg.v] or sizes[reg.v])
    for i in members:
        panel *= extents[i]
    limit = INSIDE_ROWS_PANEL_BYTES or machine.l2_bytes() // 8
    if panel > limit:
        return node, sizes, reg
    rest = [i for i in range(node.band_n_member()) if i not in members]
    at = rest.index(reg.u) + 1
    order = rest[:at] + members + rest[at:]
    if order == list(range(node.band_n_member())):
        return node, sizes, reg
    new = {old: pos for pos, old in enumerate(order)}
    node = tiling.permute_band(node, order)
    return node, [sizes[i] for i in order], dataclasses.replace(
        reg, u=new[reg.u], v=new[reg.v], dot=None if reg.dot is None else new[reg.dot])


def _panel_members(node: isl.ScheduleNode, kernel: Kernel,
                   reg: register_tile.Plan) -> list[int]:
    """Parallel members other than the register tile's rows and columns whose iterator
    indexes an operand that the vector member walks (the panel's other dimensions)."""
    s = kernel.statement(reg.stmt)
    its = [member_iterators(node, i).get(reg.stmt) for i in range(node.band_n_member())]
    panels = [r for r in E.reads(s.value) if r.array != reg.array and
              any(its[reg.v] in E.free_names(ix)[0] for ix in r.indices)]
    used = {n for r in panels for ix in r.indices for n in E.free_names(ix)[0]}
    flags = tiling.coincident_flags(node)
    return [i for i, it in enumerate(its)
            if flags[i] and i not in (reg.u, reg.v) and it is not None and it in used]


def _split_for_threads(sizes: list[int], extents: list[int | None], flags: list[bool],
                       reg: register_tile.Plan | None, threads: int) -> list[int]:
    """When no coincident member has ``threads`` tiles, cut the longest one into
    ``threads`` tiles (whole register tiles each): a channel-last conv over a 28x28
    output with one 28-row tile and one 512-channel panel would otherwise run its
    ``parallel`` loop with a single trip (ResNet-50 at 2 threads: 1.1x faster than 1)."""
    trips = _trips(sizes, extents)
    if threads < 2 or any(f and (t or 0) >= threads for f, t in zip(flags, trips)):
        return sizes
    known = [i for i in range(len(sizes)) if flags[i] and (extents[i] or 0) >= 2]
    for best in sorted(known, key=lambda i: -(extents[i] or 0)):
        if _cuttable(extents[best], reg, best, threads):
            sizes = list(sizes)
            sizes[best] = _thread_cut(extents[best] or 0, reg, best, threads)
            return sizes
    return sizes


def _cuttable(extent: int | None, reg: register_tile.Plan | None, member: int,
              threads: int) -> bool:
    """Whether ``member`` can be cut into tiles for ``threads`` (a 32-channel vector
    member, one register tile wide, cannot)."""
    return extent is not None and _thread_cut(extent, reg, member, threads) < extent


def _unit(reg: register_tile.Plan | None, member: int) -> tuple[int, bool]:
    """The tile unit of ``member`` (a register tile's rows or columns, else 1) and
    whether it is the register tile's vector member (cut only in whole units)."""
    if reg is None:
        return 1, False
    return (reg.mr if member == reg.u else reg.nr if member == reg.v else 1), member == reg.v


def _thread_cut(extent: int, reg: register_tile.Plan | None, member: int,
                threads: int) -> int:
    """A tile of ``member`` that gives each of ``threads`` one (:func:`_share`)."""
    unit, vector = _unit(reg, member)
    return _share(-(-extent // threads), unit, vector)


def _trips(sizes: list[int], extents: list[int | None]) -> list[int | None]:
    """Tiles of each member (None: unknown extent)."""
    return [None if e is None else -(-e // t) for e, t in zip(extents, sizes)]


def _default_member(sizes: list[int], extents: list[int | None],
                    flags: list[bool]) -> int | None:
    """The member the ``parallel`` loop runs unless told otherwise: the first when it has
    more than one tile, else the coincident one with the most tiles."""
    trips = _trips(sizes, extents)
    if flags[0] and (trips[0] is None or trips[0] > 1):
        return 0
    return max((i for i in range(len(flags)) if flags[i] and (trips[i] or 0) > 1),
               key=lambda i: trips[i] or 0, default=None)


def _parallel_member(node: isl.ScheduleNode, kernel: Kernel, sizes: list[int],
                     extents: list[int | None], flags: list[bool],
                     reg: register_tile.Plan | None, threads: int) -> int | None:
    """The member whose tiles the threads share. For a register-tiled contraction, of
    the coincident members with a tile per thread whose tiles the threads share evenly
    (within :data:`BALANCE_SLACK` of the most even, once cut by :func:`_balanced`:
    MobileNetV2's 144 channels in 64-channel register tiles split 128 + 16, its 14 rows
    7 + 7), the one that leaves the fewest bytes
    read by every thread (:func:`_replicated_bytes`: what the threads all read is what
    that member does not index, or splits finely along an array's contiguous index,
    :data:`FINE_SPLIT_BYTES`): MLP's 64-row batch times a 784 x 512 weight matrix
    split by rows had each thread stream all 1.6 MB of weights, split by column blocks
    each reads half of them and all of the 200 KB input; the default member where it
    leaves at most :data:`SHARED_SLACK` times the fewest (a near tie). A member in one
    tile counts where it can be cut for the threads (:data:`CUT_TO_SHARE_LEAST`; the
    caller's :func:`_balanced` cuts it). Otherwise :func:`_default_member`."""
    default = _default_member(sizes, extents, flags)
    trips = _trips(sizes, extents)
    cands = [i for i in range(len(flags)) if flags[i] and (
        (trips[i] or 0) >= threads
        or (CUT_TO_SHARE_LEAST and _cuttable(extents[i], reg, i, threads)))]
    if not SPLIT_LEAST_SHARED or threads < 2 or reg is None or default not in cands \
            or len(cands) < 2:
        return default
    cut = {i: _balanced(sizes, extents, i, reg, threads) for i in cands}
    costs = {i: _replicated_bytes(node, kernel, i, None if extents[i] is None else
                                  _busiest_share(extents[i], cut[i][i], threads))
             for i in cands}
    if any(c is None for c in costs.values()):
        return default
    if BALANCE_TILES:  # of the members the threads share evenly (once cut by _balanced)
        uneven = {i: _uneven(cut[i], extents, i, threads) for i in cands}
        least = min(uneven.values())
        cands = [i for i in cands if uneven[i] <= least * BALANCE_SLACK]
    least = min(costs[i] for i in cands)  # (a near tie is a tie: the default's order)
    near = [i for i in cands if costs[i] <= least * SHARED_SLACK]
    return default if default in near else min(near, key=lambda i: costs[i])


def _replicated_bytes(node: isl.ScheduleNode, kernel: Kernel, member: int,
                      share: int | None = None) -> int | None:
    """The cost, in bytes, of the arrays under ``node`` that every thread touches when
    the threads split ``member`` (a thread's run of ``share`` iterations of it): those
    read by accesses that do not use ``member``'s iterator, and those (read or written)
    whose last, contiguous index alone uses it, where a thread's run of that index is
    under :data:`FINE_SPLIT_BYTES` (:func:`_fine_split`). A byte of an array other than
    the kernel's constants counts :data:`WRITTEN_SHARE_COST` bytes. None when a
    statement's member is no single iterator or a shape is not a number."""
    arrays: set[str] = set()
    for name, it in member_iterators(node, member).items():
        if it is None:
            return None
        s = kernel.statement(name)
        for r in E.reads(s.value):
            if not any(it in E.free_names(ix)[0] for ix in r.indices) \
                    or _fine_split(kernel, r, it, share):
                arrays.add(r.array)
        if _fine_split(kernel, s.write, it, share):
            arrays.add(s.write.array)
    sizes = [fixed_bytes(kernel, a) for a in arrays]
    if None in sizes:
        return None
    return sum(n * (1 if a in kernel.constants else WRITTEN_SHARE_COST)
               for a, n in zip(arrays, sizes))


#: what a byte of an array that another kernel may have just written costs each thread
#: that reads it, against a byte of a constant (a model's weights, read from a shared
#: cache as they are): those bytes sit in the writers' caches. On a 2-vCPU Zen 2 EPYC,
#: two threads each updating 2 MB ran 3.3x longer when they swapped halves between
#: parallel loops. MobileNetV2's 1x1 convs at 14x14 and 7x7 split their channels (each
#: thread reading all of the input, 50 KB, rather than all of the weights, 98 KB), and
#: the depthwise conv after each read half of its input from the other core
WRITTEN_SHARE_COST = 3


#: a thread's run of an array's contiguous (last) index shorter than this many bytes
#: interleaves the threads' data within pages and the L2's pairs of lines: the array
#: counts as read by every thread (:func:`_replicated_bytes`). MobileNetV2's depthwise
#: convs split their 32-960 channels (nothing else was shared but the 3x3 weights), and
#: each thread read half of every pixel the other had written, split by rows, in the
#: 1x1 convs around them: at 2 threads, Conv_4 ran 308 us against 190 at 1 (64-byte
#: runs). A page (4096, the first bound) counted runs of a kilobyte or two as shared
#: too: float 16x784x512 on 2 threads split its 16 rows, each thread streaming all of
#: ``B``, where its columns give each half of ``B`` in 1 KB runs (Xeon, AVX-512, A/B in
#: one process: 74 -> 177 GFLOP/s; PolyBench's gesummv at 2 threads 0.57 -> 0.30 ms;
#: MobileNetV2, BERT and the MLP 0.995-0.997x the time, ResNet-50 the same C)
FINE_SPLIT_BYTES = 1024


def _fine_split(kernel: Kernel, access: E.Read | Access, it: str,
                share: int | None) -> bool:
    """Whether ``access`` uses ``it`` in its last index alone, and a thread's run of
    ``share`` iterations of it spans fewer than :data:`FINE_SPLIT_BYTES` there (a packed
    column block ``64 * nb + ni`` spans 64 columns an iteration, ``j // 2`` half of
    one); an index the run does not move is no split."""
    if share is None or not access.indices:
        return False
    *outer, last = access.indices
    if it not in E.free_names(last)[0] or any(it in E.free_names(ix)[0] for ix in outer):
        return False
    idx, _ = E.free_names(last)
    env = {**dict(kernel.fixed_sizes), **dict.fromkeys(idx, 0)}
    try:
        base = E.evaluate(last, env)
        env[it] = share
        span = abs(E.evaluate(last, env) - base)
    except (KeyError, ValueError, ZeroDivisionError):
        return False
    return 0 < span * D.itemsize(kernel.array(access.array).dtype) < FINE_SPLIT_BYTES


#: let the threads split the member that leaves them the fewest shared reads
SPLIT_LEAST_SHARED = True
#: ... counting a member in one tile that can be cut for the threads: ResNet-50's 28x28
#: and 14x14 1x1 convs had one tile of rows, so the threads split the output channels
#: and each read all of the input the other had just written; split by rows, each reads
#: the rows it wrote (and all of the weights). Zen 5, 2 threads, one process, A/B pairs
#: sorted by the cross-core round trip around each: ResNet-50 0.988x of the time with the
#: two vCPUs close, 0.977x far apart; MobileNetV2 0.995x / 0.970x; BERT the same C
CUT_TO_SHARE_LEAST = True
#: ... or the default member where it leaves at most this many times those: matmul 3000
#: split its 47 column blocks (every thread streaming all 36 MB of A once per block)
#: rather than its rows because its packed B, padded to whole blocks, was 0.3% larger;
#: by rows, 2 threads 462 -> 479 GFLOP/s (ResNet-50, BERT, MobileNetV2: the same C)
SHARED_SLACK = 1.05

#: cut the parallel member's tiles into a multiple of the threads, all of one size
BALANCE_TILES = True
#: when whole register tiles would give one thread more than this many times its even
#: share of a member cut for the threads, the cut is even and a tile ends in a partial
#: register tile (a GEMV's 16 column blocks in register tiles of 6 rows: 12 + 4 blocks,
#: and the weights streamed at the slower thread's pace)
UNEVEN_SPLIT = 1.25


def _share(even: int, unit: int, vector: bool) -> int:
    """A thread's tile of a member whose even share is ``even``: whole register tiles
    (``unit``), unless those are :data:`UNEVEN_SPLIT` times the share; a vector member's
    always (a partial tile there is a cut vector)."""
    size = -(-even // unit) * unit
    return even if size > even * UNEVEN_SPLIT and not vector else size


def _balanced(sizes: list[int], extents: list[int | None], member: int | None,
              reg: register_tile.Plan | None, threads: int) -> list[int]:
    """The tiles of ``member`` (the one the ``parallel`` loop will run) cut so that the
    busiest thread's share is least (:func:`_busiest_share`, OpenMP's static schedule:
    each thread a run of whole tiles), in whole register tiles where the member is a
    register tile's (unless that is :data:`UNEVEN_SPLIT` uneven). Of the cuts within
    :data:`BALANCE_SLACK` of the least share, the one with the fewest tiles wins, then
    the one with the least share.

    MobileNetV2's 56 rows in tiles of 32 gave one thread 32 rows and the other 24; its
    nine 64-channel blocks in tiles of two gave one thread three tiles (six blocks) and
    the other three blocks, where tiles of one block give five and four."""
    i = member
    if threads < 2 or i is None or extents[i] is None:
        return sizes
    extent = extents[i]
    unit, vector = _unit(reg, i)
    trips = -(-extent // sizes[i])
    tiles = -(-trips // threads) * threads
    cands = {min(sizes[i], _share(-(-extent // tiles), unit, vector))}
    cands.update(range(unit, sizes[i] + 1, unit))
    busiest = {c: _busiest_share(extent, c, threads) for c in cands}
    least = min(busiest.values())
    size = min((c for c in cands if busiest[c] <= least * BALANCE_SLACK),
               key=lambda c: (-(-extent // c), busiest[c], -c))
    if size >= sizes[i]:
        return sizes
    sizes = list(sizes)
    sizes[i] = size
    return sizes


def _evened(sizes: list[int], extents: list[int | None], flags: list[bool],
            reg: register_tile.Plan | None, threads: int,
            member: int | None) -> tuple[list[int], int | None]:
    """When the threads share ``member``'s tiles unevenly (the busiest more than
    :data:`UNEVEN_PARALLEL` times an even share), the tiles and parallel member of
    another coincident member cut for the threads (:func:`_split_for_threads`' cut, then
    :func:`_balanced`) if that is more even: MobileNetV2's 144 channels in 64-channel
    register tiles give one thread 128 and the other 16, its 28 rows 14 and 14."""
    if threads < 2 or member is None or extents[member] is None:
        return sizes, member
    best = (_uneven(sizes, extents, member, threads), sizes, member)
    if best[0] <= UNEVEN_PARALLEL:
        return sizes, member
    for j in range(len(sizes)):
        if j == member or not flags[j] or (extents[j] or 0) < threads:
            continue
        cut = list(sizes)
        if -(-extents[j] // sizes[j]) < threads:
            cut[j] = _thread_cut(extents[j], reg, j, threads)
        cut = _balanced(cut, extents, j, reg, threads)
        if -(-extents[j] // cut[j]) < threads:
            continue
        uneven = _uneven(cut, extents, j, threads)
        if uneven * BALANCE_SLACK < best[0]:
            best = (uneven, cut, j)
    return best[1], best[2]


def _uneven(sizes: list[int], extents: list[int | None], member: int, threads: int) -> float:
    """The busiest thread's share of ``member`` over an even share (1: even)."""
    extent = extents[member] or 1
    return _busiest_share(extent, sizes[member], threads) * threads / extent


#: the threads' shares of the parallel member may be this uneven before another member
#: is cut for them instead (:func:`_evened`)
UNEVEN_PARALLEL = 1.15

#: a cut of the parallel member whose busiest thread does at most this many times the
#: least such share counts as balanced (larger tiles read their operands fewer times)
BALANCE_SLACK = 1.05


def _busiest_share(extent: int, size: int, threads: int) -> int:
    """Iterations of the busiest thread when ``extent`` iterations in tiles of ``size``
    are shared by OpenMP's static schedule: each thread a run of ``ceil(tiles /
    threads)`` tiles, the last tile partial."""
    tiles = -(-extent // size)
    chunk = -(-tiles // threads)
    return min(chunk * size, extent)


def _parallel_first(tiles: isl.ScheduleNode, sizes: list[int],
                    extents: list[int | None], member: int | None = None) -> isl.ScheduleNode:
    """Put ``member`` (None: :func:`_default_member`) first in the tile band: the
    ``parallel`` mark goes on the band's first loop, and a one-trip loop (a batch of 1,
    the 7 rows of a channel-last conv's 7x7 output) would leave the kernel sequential.
    Tile loops of a permutable band may run in any order."""
    flags = tiling.coincident_flags(tiles)
    best = _default_member(sizes, extents, flags) if member is None else member
    if not best:
        return tiles
    return tiling.permute_band(tiles, [best] + [i for i in range(len(flags)) if i != best])


#: hand the tiles of a triangle to the threads in turn (:func:`_cyclic_pays`; a switch
#: for measurements)
CYCLIC_TRIANGLES = True
#: the most tiles along the parallel member that :func:`_cyclic_pays` weighs one by one
CYCLIC_MAX_TILES = 256


def _cyclic_pays(tiles: isl.ScheduleNode, kernel: Kernel, options: Options) -> bool:
    """Whether the tiles along the tile band's first member (the parallel loop) carry
    such unequal work -- a triangle's rows, syrk's ``j <= i`` -- that handing them to the
    threads in turn leaves the busiest thread at most 0.9x the work OpenMP's static
    schedule (one contiguous run of tiles a thread) gives it. Each tile's work is the
    bounding box of its statements' instances (a triangle's slice: its widest row)."""
    threads = machine.threads(options.threads)
    if threads < 2 or len(kernel.fixed_sizes) != len(kernel.sizes):
        return False
    upa = tiles.band_get_partial_schedule().get_union_pw_aff(0)
    on = isl.UnionMap.from_union_pw_aff(upa).intersect_domain(tiles.get_domain()) \
        .intersect_params(kernel.context)
    values: list[isl.Set] = []
    on.range().foreach_set(values.append)
    if len(values) != 1:
        return False
    if not (values[0].is_bounded() and values[0].dim_min_val(0).is_int()):
        return False
    points = _points(values[0])
    if not 2 * threads <= len(points) <= CYCLIC_MAX_TILES:
        return False
    work = []
    for v in points:
        at = isl.UnionSet.from_set(values[0].fix_dim_si(0, v))
        slice_ = on.intersect_range(at).domain()
        sets: list[isl.Set] = []
        slice_.foreach_set(sets.append)
        vols = [tiling.box_volume(x) for x in sets]
        if any(x is None for x in vols):
            return False
        work.append(sum(vols))
    n = len(work)
    chunk = -(-n // threads)
    static = max(sum(work[t * chunk:(t + 1) * chunk]) for t in range(threads))
    cyclic = max(sum(work[t::threads]) for t in range(threads))
    return cyclic <= 0.9 * static


def _points(values: isl.Set) -> list[int]:
    """The values of a bounded one-dimensional set, in order (a tile loop's: multiples
    of its size)."""
    out: list[int] = []
    values.foreach_point(lambda p: out.append(p.get_coordinate_val(isl.dim_type.set, 0)
                                              .to_python()))
    return sorted(out)


def _reductions_apart(band: isl.ScheduleNode, kernel: Kernel) -> bool:
    """No two points of ``band`` update the same element through a reduction.

    A wavefront runs the tiles of one anti-diagonal at once. That is legal when every
    dependence has non-negative distances along the band's members (a permutable band),
    except for the updates of a reduction: their order is free (the scheduler is told
    so), yet two of them must not run at once. A sum into a scalar over the band's
    points (NonMaxSuppression's count of kept boxes) would race."""
    sched = band.band_get_partial_schedule_union_map()
    for st in kernel.statements:
        if st.op == "=":
            continue
        mine = sched.intersect_domain(isl.UnionSet.from_set(st.domain))
        if mine.is_empty():
            continue
        writes = isl.UnionMap.from_map(st.write.relation(st.domain))
        if not mine.reverse().apply_range(writes).is_injective():
            return False
    return True


def _is_tiny(node: isl.ScheduleNode, kernel: Kernel) -> bool:
    """A specialised kernel does less than :data:`TINY_WORK` under ``node`` each time it
    runs: statement instances, each counted once per array element it reads (a copy
    counts its instances, a 3x3 max pool nine times its outputs: ResNet-50's 200k-output
    pool ran sequentially at 3x onnxruntime's 2-thread time), divided by the trips of
    the sequential loops around ``node`` (a recurrence's steps: one parallel region per
    step for a few thousand instances cost more than the step)."""
    if len(kernel.fixed_sizes) != len(kernel.sizes):
        return False
    total = 0
    sets = node.get_domain().intersect_params(kernel.context).get_set_list()
    for k in range(sets.n_set()):
        s = sets.get_at(k)
        if s.is_empty():
            continue
        volume = tiling.box_volume(s)
        if volume is None:
            return False
        total += max(1, len(kernel.statement(s.get_tuple_name()).reads)) * volume
    prefix = node.get_prefix_schedule_union_map().intersect_params(kernel.context).range()
    if not prefix.is_empty():
        outer = prefix.get_set_list()
        trips = tiling.box_volume(outer.get_at(0)) if outer.n_set() == 1 else None
        total //= max(1, trips or 1)
    return total < TINY_WORK


def _mark_simd(node: isl.ScheduleNode, mark: str = SIMD) -> isl.ScheduleNode:
    """Split off the last member and mark it; returns the node at the original position."""
    n = node.band_n_member()
    last = tiling.split_last(node)
    marked = last.insert_mark(isl.Id(mark))
    return marked.parent() if n > 1 else marked


#: a band summing whole rows into sums that stay in the L1 runs untiled, but for the
#: threads' cut (:func:`cache_blocks.sums_down_columns`; a switch for measurements)
SUMS_IN_ROWS = True

#: the steps of a sum down columns run in each vector iteration, where whole rows run
#: (:data:`SUMS_IN_ROWS`; :func:`_jam`; 1: none)
JAM_SUMS = 4


def _jam(node: isl.ScheduleNode, u: int, tile: int) -> isl.ScheduleNode:
    """The point band ``[r, v]`` of a band summing down columns (a sum ``r``, the vector
    member ``v``: :func:`cache_blocks.sums_down_columns`) as ``[r // u]``, then the
    vector loop ``[v]``, then ``[r]`` unrolled inside it: each vector of sums takes
    ``u`` rows' terms, in their order, between its load and its store (unroll and jam).
    ``x(i) +=! A(j,i) * y(j)``, float 2000x2000, one thread: 0.22 -> 0.18 ms (OpenBLAS
    ``y @ A`` 0.17 ms). The steps count from the start of the tile of ``r`` (``tile``
    values; a fused tile of 15 rows: 3 steps of 4 and one of 3, not a part-step at each
    end), and the steps whose vector iterations have all ``u`` rows are isolated
    (:func:`_whole_steps`): their code tests nothing. Returns the node at ``node``'s
    position."""
    ctx = node.get_ctx()
    mupa = node.band_get_partial_schedule()
    r, v = mupa.get_union_pw_aff(0), mupa.get_union_pw_aff(1)
    steps = r.mod_val(isl.Val.int_from_si(ctx, tile)) \
        .scale_down_val(isl.Val.int_from_si(ctx, u)).floor()
    node = node.delete()
    node = node.insert_partial_schedule(tiling.multi_union_pw_aff([r]))
    node = node.band_member_set_ast_loop_type(0, isl.ast_loop_type.unroll)
    node = node.insert_partial_schedule(tiling.multi_union_pw_aff([v]))
    node = node.band_member_set_coincident(0, 1)
    node = node.insert_mark(isl.Id(SIMD))
    node = node.insert_partial_schedule(tiling.multi_union_pw_aff([steps]))
    # the steps of ``u`` whole rows apart: a last one of fewer rows gets code of its
    # own, not a test in each vector iteration
    return node.band_set_ast_build_options(
        tiling.isolate_option(_whole_steps(node, u), node.get_schedule_depth()))


def _whole_steps(steps: isl.ScheduleNode, u: int) -> isl.Set:
    """The values of the schedule above ``steps`` (the band of :func:`_jam`'s steps) and
    of ``steps`` under which every vector iteration has all ``u`` rows (a step some of
    whose columns lack a row, on a triangle, is not whole)."""
    d = steps.get_schedule_depth()
    leaf = steps.child(0).child(0).child(0).child(0)  # mark, [v], [r], leaf
    flat = leaf.get_prefix_schedule_union_map().intersect_domain(leaf.get_domain())
    pts = flat.range().get_set_list().get_at(0)  # [above(d), step, v, r]
    have = isl.Map.from_range(pts).move_dims(isl.dim_type.in_, 0, isl.dim_type.out, 0, d + 2)
    # a step's rows are u consecutive values: whole where its first and last both exist
    last = isl.Map(f"{{ [r] -> [r - {u - 1}] }}").align_params(have.get_space())
    complete = have.intersect(have.apply_range(last)).domain()  # (per vector iteration)
    lacking = have.domain().subtract(complete).project_out(isl.dim_type.set, d + 1, 1)
    steps_all = have.domain().project_out(isl.dim_type.set, d + 1, 1)
    whole = steps_all.subtract(lacking)
    # the whole steps of a partial last tile come out as a union ("every step, or the
    # first two in the last tile"), and isl then tests inside the vector loop; where the
    # convex hull of the union holds no other step, isolate the hull instead
    hull = isl.Set.from_basic_set(whole.convex_hull())
    if hull.intersect(steps_all).is_equal(whole):
        whole = hull
    return whole.reset_tuple_id()


#: a max or min reduction along rows runs its reduction as the vector loop when its
#: rows are contiguous and across them would gather (:func:`_vector_reduction`)
REDUCE_ALONG_ROWS = True


def _vector_reduction(node: isl.ScheduleNode, r: int, kernel: Kernel,
                      parallel_done: bool) -> isl.ScheduleNode:
    """The band with its reduction member ``r`` (:func:`vector.reduction_member`)
    innermost under a ``reduce`` mark, an OpenMP SIMD reduction over a scalar
    accumulator, the other members outside it (the first parallel unless the work is
    tiny). The BERT layer's softmax, its row maxima over 12 x 128 rows of 128: 0.27 ->
    0.16 ms in the model, each vector loading 16 terms of a row instead of gathering
    one term from each of 16 rows."""
    order = [i for i in range(node.band_n_member()) if i != r] + [r]
    node = _mark_simd(tiling.permute_band(node, order), REDUCE)
    if not parallel_done and node.get_type() == isl.schedule_node_type.band \
            and tiling.coincident_flags(node)[0] and not _is_tiny(node, kernel):
        node = node.insert_mark(isl.Id(PARALLEL))
    return node


def _byte_group(node: isl.ScheduleNode, kernel: Kernel, vec: int | None) -> int | None:
    """For a band over one statement whose vector member ``vec`` walks the last index
    of its write, a group of bytes making up 32 bits (``cols(.., p, c4)``, ``c4`` in
    ``0:4``: the channel quads of an int8 convolution's patches), the member walking
    the index before it (``p``), with coefficient 1: the loop to vectorize instead, the
    group unrolled inside it (four interleaved byte stores a lane, which gcc vectorizes;
    a 4-lane loop inside the ``p`` loop ran 5x slower). None otherwise."""
    if vec is None:
        return None
    its = [member_iterators(node, i) for i in range(node.band_n_member())]
    flags = tiling.coincident_flags(node)
    found = None
    for stmt, it in its[vec].items():  # every statement below (an inside and its pad)
        s = kernel.statement(stmt)
        write, shape = s.write.indices, kernel.array(s.write.array).shape
        if len(write) < 2 or not isinstance(shape[-1], E.Const) or \
                shape[-1].value * D.get(kernel.array(s.write.array).dtype).itemsize != 4 or \
                write[-1] != E.Index(str(it)) or not isinstance(write[-2], E.Index):
            return None
        lanes = [i for i, m in enumerate(its)
                 if i != vec and flags[i] and m.get(stmt) == write[-2].name]
        if not lanes or found not in (None, lanes[0]):
            return None
        found = lanes[0]
    return found


def _mark_simd_groups(node: isl.ScheduleNode) -> isl.ScheduleNode:
    """The band ``[.., p, g]`` as ``[..]``, ``simd`` ``[p]``, ``[g]`` unrolled (see
    :func:`_byte_group`); returns the node at the original position."""
    n = node.band_n_member()
    group = tiling.split_last(node)
    group = group.band_member_set_ast_loop_type(0, isl.ast_loop_type.unroll)
    lanes = group.parent()
    if n > 2:
        lanes = tiling.split_last(lanes)
    marked = lanes.insert_mark(isl.Id(SIMD))
    return marked.parent() if n > 2 else marked


def _is_leaf_band(node: isl.ScheduleNode) -> bool:
    """No band below ``node`` in the schedule tree."""
    def has_band(n: isl.ScheduleNode) -> bool:
        for i in range(n.n_children()):
            c = n.child(i)
            if c.get_type() == isl.schedule_node_type.band or has_band(c):
                return True
        return False
    return not has_band(node)


def _innermost_member(node: isl.ScheduleNode, kernel: Kernel) -> tuple[int | None, bool]:
    """The member to run innermost, and whether it is a SIMD loop.

    The coincident member with the best positive stride-1 score (the last on ties) is a
    vector loop. A non-coincident (reduction) member wins instead when its accesses are
    strictly more contiguous -- ``Y(n,o) +=! X(n,i) * W(o,i)`` (a Gemm with transB) must
    run ``i`` innermost, or every ``W`` access strides a whole row; it stays scalar --
    or as contiguous in a band of sums (:func:`_sums`).
    """
    flags = tiling.coincident_flags(node)
    n = node.band_n_member()
    candidates = range(n) if node.band_get_permutable() else [n - 1]
    best = {flag: best_member(kernel, node, [i for i in candidates if flags[i] == flag])
            for flag in (True, False)}
    if best[False][0] is not None and (best[False][1] > best[True][1] or
                                       best[False][1] == best[True][1] and _sums(node, kernel)):
        return best[False][0], False
    return best[True][0], best[True][0] is not None


def _sums(node: isl.ScheduleNode, kernel: Kernel) -> bool:
    """Every statement under ``node`` is a sum (``+=``): on a tie of stride scores its
    reduction runs innermost, walking its operands' contiguous index, and takes the
    rows-only dot-product register tile (``register_tile.plan_dot``: that many
    independent chains side by side). A row sum ``s(n) +=! X(n,d)`` vectorized over
    ``n`` instead loads each lane from another row and loads and stores ``s`` at each
    step: 2.5x slower at 128 x 768 (the BERT layer's LayerNormalization means and
    variances). Each sum adds its terms in the same order either way."""
    names = member_iterators(node, 0)
    return bool(names) and all(kernel.statement(n).op == "+" for n in names)


def _member_order(node: isl.ScheduleNode, inner: int | None, kernel: Kernel) -> list[int]:
    """Coincident members first (outer parallelism), then the others, ``inner`` last --
    and, in a band without reductions whose vector loop gathers from a read (a transpose
    ``Y(m,h,w) = T(h,w,m)``), the member walking that read's contiguous index just
    outside ``inner``: consecutive vectors then gather from the same cache lines (with
    ``m`` outermost each ``m`` touched every line of ``T``: 0.9 ms for 400k elements)."""
    flags = tiling.coincident_flags(node)
    members = [i for i in range(node.band_n_member()) if i != inner]
    order = [i for i in members if flags[i]] + [i for i in members if not flags[i]]
    partner = _gather_partner(node, inner, kernel) if all(flags) else None
    if partner is not None:
        order = [i for i in order if i != partner] + [partner]
    return order + ([inner] if inner is not None else [])


def _gather_partner(node: isl.ScheduleNode, inner: int | None, kernel: Kernel) -> int | None:
    """The member iterating the last index of a read that the ``inner`` loop walks
    through another index (so each vector lane is a different cache line)."""
    if inner is None:
        return None
    its = [member_iterators(node, i) for i in range(node.band_n_member())]
    for stmt, it in its[inner].items():
        if it is None:
            return None
        for r in kernel.statement(stmt).reads:
            if not r.indices or not isinstance(r.indices[-1], E.Index):
                continue
            if not any(it in E.free_names(x)[0] for x in r.indices[:-1]):
                continue
            last = r.indices[-1].name
            for j, m in enumerate(its):
                if j != inner and m.get(stmt) == last:
                    return j
    return None


def _tile_sizes(node: isl.ScheduleNode, options: Options, vec: int | None) -> list[int] | None:
    n = node.band_n_member()
    if options.tile is False:
        return None
    if isinstance(options.tile, tuple):
        sizes = list(options.tile)
        return (sizes + [sizes[-1]] * n)[:n]
    flags = tiling.coincident_flags(node)
    sizes = []
    for i in range(n):
        if i == vec:
            sizes.append(DEFAULT_TILE_VECTOR)
        elif flags[i]:
            sizes.append(DEFAULT_TILE_OUTER)
        else:
            sizes.append(DEFAULT_TILE_REDUCTION)
    return sizes
