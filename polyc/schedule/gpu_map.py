"""Map a schedule tree to CUDA kernels: blocks, threads and the loops left in a thread.

PPCG's mapping, decided on isl's (untiled, unmarked) schedule:

* **kernels**: where the tree's top level is a sequence (or set), each child is a kernel
  (recursively: a child that is itself a sequence is split again); a child that is one
  band -- statements fused by the scheduler -- is one kernel. Kernels are launched in the
  sequence's order, which is a dependence order because the schedule is legal.
* **blocks and threads**: in the outermost band of a kernel, up to three coincident
  members are mapped. The member along which the most accesses are stride-1 (the
  contiguous, last index of an array; the write counts double) goes to ``x`` so that a
  warp reads consecutive addresses; the next outermost coincident members go to ``y``
  and ``z``. A mapped member ``f`` is tiled by ``T`` and strip-mined by the block
  size ``B``: the thread ``(b, t)`` runs the points ``f = lo + T*b + t + B*q`` for
  ``0 <= q < T/B`` (``T = B`` unless ``Options.gpu_tile`` says otherwise)::

        band [m, n, k]  (m, n coincident)        kernel<<<(N/32, M/8), (32, 8)>>>
          ...                               ->     n = 32*blockIdx.x + threadIdx.x
                                                   m =  8*blockIdx.y + threadIdx.y
                                                   for k: ...   (sequential, in the thread)

  Every other member, and everything below the band, runs sequentially inside the thread
  in schedule order; a reduction member therefore stays a loop in each thread.
* **legality** is decided by isl, not by the flags alone: the coincidence dependences
  between the kernel's statements, mapped through the chosen members, must all have
  distance 0 (every dependence stays inside one thread). Otherwise a member is dropped,
  and with none left the kernel runs on one block of one thread (``GpuKernel.note``
  says why).

The mapping reaches code generation as a schedule with extra parameters ``polyc_b<j>``
and ``polyc_t<j>`` (block and thread index of axis ``j``): the kernel's schedule is
restricted to the instances of one thread, and isl's AST generator then prints the
mapped loops as single assignments plus the guards of partial tiles.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import islpy as isl

from .. import dtypes as D
from .. import expr as E
from ..deps import Dependences
from ..errors import CompileError
from ..ir import Access, Kernel, Statement, params_prefix
from ..options import Options
from . import tiling
from .vector import stride_score

AXES = ("x", "y", "z")
#: the most threads a block may have (every CUDA architecture)
MAX_THREADS = 1024
#: default threads along x: one warp, so that a warp covers consecutive elements
DEFAULT_BLOCK_X = 32
#: default threads per block of a kernel with one mapped member
DEFAULT_BLOCK_1D = 256
#: default threads along y and z (2-D: 32 x 8, 3-D: 32 x 4 x 2)
DEFAULT_BLOCK_Y = {2: 8, 3: 4}
DEFAULT_BLOCK_Z = 2
#: tile of the members that stay loops in a thread when arrays are promoted to shared
#: memory (reduction members: the copy-in happens once per such tile); smaller ones are
#: tried when an array's tile would not fit (a conv's input over 32 channels)
REDUCTION_TILE = 32
REDUCTION_TILES = (REDUCTION_TILE, 16, 8, 4)
#: static shared memory a block may use (every architecture since sm_20)
SHARED_BYTES = 48 * 1024
#: the mark between the tile band and the point band of a kernel with shared arrays
SHARED_MARK = "polyc_shared"
#: the mark above the reduction's tile loops of a register-tiled kernel (the thread's
#: accumulators are loaded there and stored back after them)
PRIVATE_MARK = "polyc_private"
#: default points per thread of a register tile, along x, y, z (strided by the block)
REGISTER_POINTS = (2, 4, 1)


@dataclass(frozen=True, eq=False)
class MappedDim:
    """One band member mapped to a block/thread axis."""
    axis: str
    #: position of the member in the kernel's outermost band
    member: int
    #: the member's schedule function (statement instance -> value)
    function: isl.UnionPwAff
    #: first value of the member over the kernel's instances
    lo: int
    tile: int
    block: int
    #: number of blocks along this axis, a function of the sizes (0 when empty)
    grid: isl.PwAff
    #: the extent when it is known at compile time
    extent: int | None

    @property
    def block_param(self) -> str:
        return f"polyc_b{AXES.index(self.axis)}"

    @property
    def thread_param(self) -> str:
        return f"polyc_t{AXES.index(self.axis)}"


@dataclass(frozen=True)
class SharedArray:
    """A tile of a global array that a block copies to ``__shared__`` memory: ``box`` is
    the extent of the box hull of the elements one block reads in one iteration of the
    loops above the point band (per array dimension)."""
    array: str
    box: tuple[int, ...]
    nbytes: int
    #: accesses of the array in the kernel's statements (for the report)
    reads: int


@dataclass(frozen=True)
class PrivateArray:
    """The elements of ``array`` one thread updates, kept in registers across the
    reduction (PPCG's private memory): ``axes[d]`` is the mapped axis (index into the
    kernel's dims) that array dimension ``d`` follows, or None when the dimension is fixed
    within one iteration of the loops above the :data:`PRIVATE_MARK`; ``points`` the
    number of points per thread along each array dimension that follows an axis."""
    array: str
    axes: tuple[int | None, ...]
    points: tuple[int, ...]

    @property
    def registers(self) -> int:
        n = 1
        for p in self.points:
            n *= p
        return n


@dataclass(frozen=True, eq=False)
class GpuKernel:
    """One CUDA kernel: its statements and the schedule of one thread."""
    index: int
    statements: tuple[str, ...]
    #: the whole schedule restricted to this kernel's statements, and to the instances of
    #: thread ``(polyc_t*)`` of block ``(polyc_b*)``
    schedule: isl.Schedule
    #: the AST build context: the sizes' context plus the ranges of the mapped parameters
    context: isl.Set
    #: mapped members in axis order (x, y, z); empty: one block of one thread
    dims: tuple[MappedDim, ...]
    #: the kernel's statement instances (sizes' context applied)
    domain: isl.UnionSet
    #: the schedule of the kernel's subtree before mapping (instance -> time), for the report
    time: isl.UnionMap
    #: why the kernel (or a member of its band) is not parallel, when it is not
    note: str = ""
    #: the position of the mapped members in the flat time vector of :attr:`time`
    time_dims: tuple[int, ...] = field(default=())
    #: arrays copied to shared memory at the :data:`SHARED_MARK` of :attr:`schedule`
    shared: tuple[SharedArray, ...] = field(default=())
    #: with shared arrays, :attr:`schedule` holds a whole block's instances: the schedule
    #: depths of the point loops that the printer distributes over the threads
    thread_depths: tuple[tuple[int, MappedDim], ...] = field(default=())
    #: the accumulators kept in registers at the :data:`PRIVATE_MARK`, if any
    private: PrivateArray | None = None

    @property
    def block(self) -> tuple[int, int, int]:
        sizes = [d.block for d in self.dims] + [1] * (3 - len(self.dims))
        return (sizes[0], sizes[1], sizes[2])

    @property
    def threads(self) -> int:
        x, y, z = self.block
        return x * y * z


def map_to_gpu(kernel: Kernel, deps: Dependences, schedule: isl.Schedule,
               options: Options) -> list[GpuKernel]:
    """The kernels of ``schedule`` (a legal schedule over ``kernel.domain()``) in launch
    order, each with its block/thread mapping (see the module doc)."""
    out: list[GpuKernel] = []
    for node in _kernel_roots(schedule.get_root().child(0)):
        dom = node.get_domain().intersect_params(kernel.context)
        if dom.is_empty():
            continue
        if node.get_type() == isl.schedule_node_type.band and _misplaced_binding(node.child(0)):
            raise CompileError(f"a loop bound to a GPU axis lies inside another loop of its "
                               f"kernel ({', '.join(_statement_names(dom))}): the bound loops "
                               "must be the kernel's outermost loops")
        out.append(_map_kernel(kernel, deps, schedule, node, dom, len(out), options))
    return out


def _kernel_roots(node: isl.ScheduleNode) -> list[isl.ScheduleNode]:
    """The subtrees that become kernels: children of top-level sequences/sets."""
    t = node.get_type()
    if t in (isl.schedule_node_type.sequence, isl.schedule_node_type.set):
        roots = []
        for i in range(node.n_children()):
            roots += _kernel_roots(node.child(i).child(0))  # filter -> its child
        return roots
    if t in (isl.schedule_node_type.filter, isl.schedule_node_type.mark,
             isl.schedule_node_type.context) and node.n_children() == 1:
        return _kernel_roots(node.child(0))
    return [node]


def _statement_names(dom: isl.UnionSet) -> tuple[str, ...]:
    names: list[str] = []
    dom.foreach_set(lambda s: names.append(s.get_tuple_name()))
    return tuple(sorted(names))


def _map_kernel(kernel: Kernel, deps: Dependences, schedule: isl.Schedule,
                node: isl.ScheduleNode, dom: isl.UnionSet, index: int,
                options: Options) -> GpuKernel:
    own = schedule.intersect_domain(dom)
    time = own.get_map().intersect_domain(dom)
    names = _statement_names(dom)
    if node.get_type() != isl.schedule_node_type.band:
        return _sequential(index, names, own, kernel, dom, time,
                           "no loop: runs on one thread of one block")
    flags = tiling.coincident_flags(node)
    coincidence = deps.coincidence.intersect_params(kernel.context) \
        .intersect_domain(dom).intersect_range(dom)
    bound = _bound(node)
    if bound is not None:  # the workbench's bind steps choose the members
        return _map_bound(kernel, deps, own, node, dom, index, names, bound, coincidence,
                          options)
    if not any(flags):
        return _sequential(index, names, own, kernel, dom, time,
                           "no parallel (coincident) loop in the outermost band: runs on "
                           "one thread of one block")
    candidates = [i for i, f in enumerate(flags)
                  if f and _members_are_parallel(node, [i], coincidence)
                  and _starts_at_constant(kernel, node, dom, i)]
    dropped = [i for i, f in enumerate(flags) if f and i not in candidates]
    note = (f"band member(s) {dropped} flagged coincident but carrying a dependence between "
            "the kernel's statements (isl), or starting at a value that depends on the "
            "sizes: not mapped" if dropped else "")
    chosen = _choose_members(node, kernel, candidates) if candidates else []
    while chosen and not _members_are_parallel(node, chosen, coincidence):
        chosen = chosen[:-1]  # (each member alone is parallel: never reached in practice)
    if not chosen:
        return _sequential(index, names, own, kernel, dom, time,
                           "the coincident members carry dependences (checked with isl): "
                           "runs on one thread of one block")
    promotable = (options.gpu_shared and node.band_get_permutable()
                  and len(chosen) < node.band_n_member())
    private = _private_axes(kernel, node, dom, chosen) \
        if promotable and options.gpu_register_tile else None
    dims = _dims(kernel, node, dom, chosen, options, registers=private is not None)
    context = _context(kernel, dims)
    # the kernel's own time (its band's members first) for the report
    time = node.get_subtree_schedule_union_map().intersect_domain(dom)
    time_dims = tuple(d.member for d in dims)
    if promotable:
        if private is not None and all(d.tile == d.block for d in dims):
            private = None  # one point per thread: nothing to keep across points
        promoted = _promote(kernel, deps, node, dom, dims, context, private)
        if promoted is not None:
            sched, shared, depths = promoted
            record = None if private is None else PrivateArray(
                private[0], private[1],
                tuple(dims[a].tile // dims[a].block for a in private[1] if a is not None))
            return GpuKernel(index, names, sched, context, dims, dom, time, note, time_dims,
                             shared, tuple(zip(depths, dims)), record)
    mapped = own.intersect_domain(_thread_instances(dims))
    return GpuKernel(index, names, mapped, context, dims, dom, time, note, time_dims)


#: the mark above a band whose members the schedule workbench bound to GPU axes
#: (``gpu:x@1,y@0:8``: axis @ member [: threads]; see ``ScheduleSpace.bind``)
BIND_MARK = "gpu:"


def _bound(node: isl.ScheduleNode) -> list[tuple[str, int, int | None]] | None:
    """(axis, member, threads) of the bind mark right above the band ``node``, x first."""
    if not node.has_parent() or node.parent().get_type() != isl.schedule_node_type.mark:
        return None
    name = node.parent().mark_get_id().get_name()
    if not name.startswith(BIND_MARK):
        return None
    out = []
    for part in name[len(BIND_MARK):].split(","):
        axis, _, rest = part.partition("@")
        member, _, threads = rest.partition(":")
        out.append((axis, int(member), int(threads) if threads else None))
    return sorted(out, key=lambda b: AXES.index(b[0]))


def _map_bound(kernel: Kernel, deps: Dependences, own: isl.Schedule, node: isl.ScheduleNode,
               dom: isl.UnionSet, index: int, names: tuple[str, ...],
               bound: list[tuple[str, int, int | None]], coincidence: isl.UnionMap,
               options: Options) -> GpuKernel:
    """The kernel with the members the user bound on the axes they named (each checked
    with isl: no dependence between the kernel's instances crosses threads)."""
    axes = [b[0] for b in bound]
    if axes != list(AXES[:len(axes)]):
        raise CompileError(f"kernel {index} ({', '.join(names)}): bound GPU axes "
                           f"{', '.join(axes)}: bind x first, then y, then z")
    chosen = [b[1] for b in bound]
    for axis, m, _ in bound:
        if not _starts_at_constant(kernel, node, dom, m):
            raise CompileError(f"kernel {index} ({', '.join(names)}): the loop bound to "
                               f"{axis} starts at a value that depends on the sizes: bind a "
                               "loop that starts at a constant")
    if not _members_are_parallel(node, chosen, coincidence):
        raise CompileError(f"kernel {index} ({', '.join(names)}): its bound loops carry a "
                           "dependence between the kernel's statements")
    threads = [b[2] for b in bound]
    given = tuple(threads) if all(t is not None for t in threads) else options.gpu_block
    dims = _dims(kernel, node, dom, chosen, options.replace(gpu_block=given))
    context = _context(kernel, dims)
    time = node.get_subtree_schedule_union_map().intersect_domain(dom)
    mapped = own.intersect_domain(_thread_instances(dims))
    return GpuKernel(index, names, mapped, context, dims, dom, time,
                     "mapped as bound by the schedule (ScheduleSpace.bind)",
                     tuple(d.member for d in dims))


def _misplaced_binding(node: isl.ScheduleNode) -> bool:
    """Whether a bind mark lies below the top of this kernel's subtree."""
    found = [False]

    def visit(n: isl.ScheduleNode) -> bool:
        if n.get_type() == isl.schedule_node_type.mark and \
                n.mark_get_id().get_name().startswith(BIND_MARK):
            found[0] = True
        return not found[0]
    node.foreach_descendant_top_down(visit)
    return found[0]


def _private_axes(kernel: Kernel, node: isl.ScheduleNode, dom: isl.UnionSet,
                  chosen: list[int]) -> tuple[str, tuple[int | None, ...]] | None:
    """The array a register tile keeps, and for each of its dimensions the mapped axis it
    follows (None: a coincident member tiled by 1, fixed above the reduction) -- or None.

    The kernel must be one statement with a reduction (a member that is not coincident)
    whose write, and every read of the array it writes, index the array by band members
    alone: each array dimension equal (isl decides) to a mapped member or to a coincident
    one, never to a reduction member. Then the thread's elements are the same in every
    iteration of the reduction, and no other thread touches them."""
    names = _statement_names(dom)
    flags = tiling.coincident_flags(node)
    if len(names) != 1 or all(flags):
        return None
    s = kernel.statement(names[0])
    w = s.write
    if any(r.array == w.array and r.indices != w.indices for r in E.reads(s.value)) \
            or not w.indices or not all(E.is_affine(i) for i in w.indices):
        return None
    domain = isl.Set.from_union_set(dom)
    access = Access(w.array, w.indices).relation(s.domain).intersect_domain(domain)
    mupa = node.band_get_partial_schedule()
    members = []
    for m in range(node.band_n_member()):
        umap = isl.UnionMap.from_union_pw_aff(mupa.get_union_pw_aff(m)).intersect_domain(dom)
        members.append(isl.Map.from_union_map(umap))
    rank = access.dim(isl.dim_type.out)
    axes: list[int | None] = []
    for d in range(rank):
        comp = access.project_out(isl.dim_type.out, d + 1, rank - d - 1) \
            .project_out(isl.dim_type.out, 0, d).reset_tuple_id(isl.dim_type.out)
        found = next((m for m, f in enumerate(members) if comp.is_equal(f)), None)
        if found is None and comp.range().is_singleton():
            axes.append(None)  # one value over the whole kernel (a batch of 1)
            continue
        if found is None or not flags[found]:
            return None
        axes.append(chosen.index(found) if found in chosen else None)
    if all(a is None for a in axes):
        return None
    return w.array, tuple(axes)


def _promote(kernel: Kernel, deps: Dependences, node: isl.ScheduleNode,
             dom: isl.UnionSet, dims: tuple[MappedDim, ...], context: isl.Set,
             private: tuple[str, tuple[int | None, ...]] | None = None
             ) -> tuple[isl.Schedule, tuple[SharedArray, ...], tuple[int, ...]] | None:
    """The kernel's schedule with the band tiled and a :data:`SHARED_MARK` between its tile
    and point bands, the arrays to copy there and the schedule depth of the point band --
    None when no array qualifies.

    PPCG's rule: a global array is promoted when the kernel only reads it (affine,
    unguarded reads), some element is read more than once by one block (reuse: the
    block's reads are not injective), and the box hull of what a block reads per tile
    fits, with the arrays promoted before it (most reads first), in
    :data:`SHARED_BYTES`.

    The schedule holds the instances of a whole block (no thread filter): isl would hoist
    a thread's guards above the copy and its barriers (then not every thread reaches them).
    The printer instead runs each mapped point loop ``for (c = lo; c <= hi; c++)`` as
    ``for (c = tile start + t; c <= hi; c += B) if (c >= lo)`` -- guards stay below the
    barriers, every thread runs the loops above them::

        band [m, n, k]     ->   band [tile(n), tile(m), tile(k)]   (blocks; k: a loop)
                                  mark polyc_shared                (copy-in, barrier)
                                    band [n, m, k]                 (points: n, m threads)
    """
    band = node  # edited in place: the result is restricted to this kernel's instances
    flags = tiling.coincident_flags(band)
    mapped = [d.member for d in dims]
    rest = [i for i in range(len(flags)) if i not in mapped]
    order = mapped + [i for i in rest if flags[i]] + [i for i in rest if not flags[i]]
    band = tiling.permute_band(band, order)
    blocks = _block_instances(dims)
    best: tuple[isl.ScheduleNode, tuple[SharedArray, ...]] | None = None
    for reduction in REDUCTION_TILES:  # the deepest reduction tile that shares the most
        sizes = [d.tile for d in dims] + [1 if flags[i] else reduction
                                          for i in order[len(mapped):]]
        tiles = tiling.tile_band(band, sizes)
        prefix = isl.UnionMap.from_multi_union_pw_aff(tiles.band_get_partial_schedule()) \
            .intersect_domain(dom.intersect(blocks))
        too_big: list[str] = []
        shared = _shared_arrays(kernel, dom.intersect(blocks), prefix, context, too_big)
        if best is None or len(shared) > len(best[1]):
            best = (tiles, shared)
        if all(flags) or not too_big:
            break  # everything that qualifies fits (or no reduction tile to shrink)
    assert best is not None
    tiles, shared = best
    if not shared:
        return None
    parallel = sum(1 for i in order if flags[i])
    if private is not None and parallel < len(order):
        # tile loops of the parallel members | private | the reduction's tile loops |
        # shared | points: the reduction's first, then the thread's (unrolled) points
        outer = tiles.band_split(parallel)
        tiles = outer.child(0).insert_mark(isl.Id(PRIVATE_MARK)).child(0)
        point = tiling.permute_band(tiles.child(0), list(range(parallel, len(order)))
                                    + list(range(parallel)))
        first = len(order) - parallel
    else:
        point, first = tiles.child(0), 0
    depth = point.get_schedule_depth()
    point = point.insert_mark(isl.Id(SHARED_MARK)).child(0)
    sched = point.get_schedule().intersect_domain(dom.intersect(blocks))
    if not _in_order(kernel, deps, dom, sched):
        return None  # (fuzz seed 191: fused statements of several depths) not promoted
    return sched, shared, tuple(depth + first + i for i in range(len(dims)))


def _in_order(kernel: Kernel, deps: Dependences, dom: isl.UnionSet,
              sched: isl.Schedule) -> bool:
    """Whether the tiled kernel schedule runs every dependence between its statements in
    order (isl decides; tiling a permutable band is legal, but the band of a kernel
    fused from statements of several depths may not be permutable for all of them)."""
    smap = sched.get_map()
    validity = deps.validity.intersect_params(kernel.context).intersect_domain(dom) \
        .intersect_range(dom)
    timed = validity.apply_domain(smap).apply_range(smap)
    bad: list[isl.Map] = []
    timed.foreach_map(lambda m: None if m.is_subset(isl.Map.lex_lt(m.get_space().range()))
                      else bad.append(m))
    return not bad


def _shared_arrays(kernel: Kernel, dom: isl.UnionSet, prefix: isl.UnionMap,
                   context: isl.Set, left_out: list[str] | None = None
                   ) -> tuple[SharedArray, ...]:
    """The arrays to copy to shared memory (see :func:`_promote`); ``left_out`` gets the
    ones that qualified but did not fit."""
    left_out = [] if left_out is None else left_out
    stmts = [kernel.statement(n) for n in _statement_names(dom)]
    written = {s.write.array for s in stmts}
    reads: dict[str, list[tuple[Statement, E.Read]]] = {}
    ok: dict[str, bool] = {}
    for s in stmts:
        unguarded = E.unconditional_reads(s.value)
        for r in E.reads(s.value):
            if r.array in written or not r.indices:
                continue
            reads.setdefault(r.array, []).append((s, r))
            good = r in unguarded and all(E.is_affine(i) for i in r.indices)
            ok[r.array] = ok.get(r.array, True) and good
    chosen: list[SharedArray] = []
    budget = SHARED_BYTES
    for array, accesses in sorted(reads.items(), key=lambda kv: -len(kv[1])):
        if not ok[array]:
            continue
        rel = read_relation(kernel, [s for s, _ in accesses], array).intersect_domain(dom)
        if rel.is_empty() or rel.is_injective():
            continue  # no element is read twice by a block: nothing to share
        footprint = prefix.reverse().apply_range(rel)
        if footprint.n_map() != 1:
            continue
        box = _box(footprint.get_map_list().get_at(0), context)
        if box is None:
            continue
        nbytes = D.itemsize(kernel.array(array).dtype)
        for b in box:
            nbytes *= b
        if nbytes <= budget:
            budget -= nbytes
            chosen.append(SharedArray(array, box, nbytes, len(accesses)))
        else:
            left_out.append(array)
    return tuple(chosen)


def read_relation(kernel: Kernel, stmts: list[Statement], array: str) -> isl.UnionMap:
    """``{ S[i] -> array[...] }``: the reads of ``array`` by ``stmts``."""
    rel = isl.UnionMap.empty(kernel.context.get_space())
    for s in stmts:
        for r in E.reads(s.value):
            if r.array == array:
                rel = rel.union(isl.UnionMap.from_map(Access(r.array, r.indices)
                                                      .relation(s.domain)))
    return rel.intersect_params(kernel.context)


def _box(footprint: isl.Map, context: isl.Set) -> tuple[int, ...] | None:
    """The largest extent per array dimension of ``footprint`` (outer iteration ->
    elements) over every outer iteration; None if unbounded."""
    rank = footprint.dim(isl.dim_type.out)
    box = []
    for d in range(rank):
        proj = footprint.project_out(isl.dim_type.out, d + 1, rank - d - 1) \
            .project_out(isl.dim_type.out, 0, d)
        lo = proj.lexmin_pw_multi_aff().get_pw_aff(0)
        hi = proj.lexmax_pw_multi_aff().get_pw_aff(0)
        span = hi.sub(lo).intersect_params(context.params())
        try:
            top = span.max_val()
        except isl.Error:  # a quasi-affine extent (strides): not promoted
            return None
        if not top.is_int():
            return None
        box.append(top.to_python() + 1)
    return tuple(box)


def _block_instances(dims: tuple[MappedDim, ...]) -> isl.UnionSet:
    """The instances of block ``(polyc_b*)``: ``T*b <= f - lo < T*b + T`` per axis."""
    result: isl.UnionSet | None = None
    for d in dims:
        b = d.block_param
        rng = isl.Set(f"[{b}] -> {{ [v] : {d.tile}*{b} <= v - {d.lo} < {d.tile}*{b} + {d.tile} }}")
        part = isl.UnionMap.from_union_pw_aff(d.function).intersect_range(
            isl.UnionSet.from_set(rng)).domain()
        result = part if result is None else result.intersect(part)
    assert result is not None
    return result


def _sequential(index: int, names: tuple[str, ...], own: isl.Schedule, kernel: Kernel,
                dom: isl.UnionSet, time: isl.UnionMap, note: str) -> GpuKernel:
    return GpuKernel(index, names, own, kernel.context, (), dom, time, note)


def _choose_members(node: isl.ScheduleNode, kernel: Kernel, candidates: list[int]) -> list[int]:
    """Up to three of the parallel members in axis order x, y, z: the most stride-1 one
    on x, then the innermost remaining ones (outer members stay loops in the thread)."""
    scores = {i: stride_score(kernel, node, i) for i in candidates}
    x = max(reversed(candidates), key=lambda i: scores[i])  # ties: the innermost
    rest = [i for i in reversed(candidates) if i != x]
    return [x] + rest[:2]


def _starts_at_constant(kernel: Kernel, node: isl.ScheduleNode, dom: isl.UnionSet,
                        member: int) -> bool:
    """Whether the member's first value is a constant (blocks count from it; a start
    that depends on the sizes, fuzz seed 317, leaves the member a loop in the thread)."""
    upa = node.band_get_partial_schedule().get_union_pw_aff(member)
    image = isl.UnionMap.from_union_pw_aff(upa).intersect_domain(dom).range()
    s = isl.Set.from_union_set(image).intersect_params(kernel.context)
    return s.dim_min(0).is_cst() and s.dim_min_val(0).is_int()


def _member_map(node: isl.ScheduleNode, members: list[int]) -> isl.UnionMap:
    mupa = node.band_get_partial_schedule()
    umap = isl.UnionMap.from_union_pw_aff(mupa.get_union_pw_aff(members[0]))
    for m in members[1:]:
        umap = umap.flat_range_product(isl.UnionMap.from_union_pw_aff(mupa.get_union_pw_aff(m)))
    return umap


def _members_are_parallel(node: isl.ScheduleNode, members: list[int],
                          coincidence: isl.UnionMap) -> bool:
    """Every dependence between instances of the kernel has distance 0 along all of
    ``members`` (so it stays inside one CUDA thread)."""
    if coincidence.is_empty():
        return True
    f = _member_map(node, members)
    distances = coincidence.apply_domain(f).apply_range(f).deltas()
    ok = [True]

    def check(s: isl.Set) -> None:
        zero = isl.Set.universe(s.get_space())
        for i in range(s.dim(isl.dim_type.set)):
            zero = zero.fix_val(isl.dim_type.set, i, isl.Val.int_from_si(s.get_ctx(), 0))
        if not s.is_subset(zero):
            ok[0] = False

    distances.foreach_set(check)
    return ok[0]


def _dims(kernel: Kernel, node: isl.ScheduleNode, dom: isl.UnionSet, chosen: list[int],
          options: Options, registers: bool = False) -> tuple[MappedDim, ...]:
    mupa = node.band_get_partial_schedule()
    ranges = []
    for m in chosen:
        upa = mupa.get_union_pw_aff(m)
        image = isl.UnionMap.from_union_pw_aff(upa).intersect_domain(dom).range()
        s = isl.Set.from_union_set(image).intersect_params(kernel.context)
        lo, hi = s.dim_min(0), s.dim_max(0)
        lo_v, hi_v = s.dim_min_val(0), s.dim_max_val(0)
        if not lo.is_cst() or not lo_v.is_int():
            raise CompileError(f"band member {m} of a GPU kernel starts at {lo}: only "
                               "constant lower bounds are mapped")
        extent = hi_v.to_python() - lo_v.to_python() + 1 if hi_v.is_int() else None
        ranges.append((upa, lo_v.to_python(), hi, extent))
    blocks = block_sizes([r[3] for r in ranges], options.gpu_block)
    tiles = _tile_sizes(blocks, options.gpu_tile)
    if registers and options.gpu_tile is None:
        tiles = register_tiles(blocks, [r[3] for r in ranges], options.gpu_register_tile)
    ctx = node.get_ctx()
    dims = []
    for axis, m, (upa, lo, hi, extent), b, t in zip(AXES, chosen, ranges, blocks, tiles):
        grid = hi.add_constant_val(isl.Val.int_from_si(ctx, -lo)) \
            .scale_down_val(isl.Val.int_from_si(ctx, t)).floor() \
            .add_constant_val(isl.Val.int_from_si(ctx, 1))
        zero = isl.PwAff.read_from_str(ctx, f"{params_prefix(kernel.sizes)}{{ [(0)] }}")
        grid = grid.union_max(zero).gist_params(kernel.context) if kernel.sizes else grid
        dims.append(MappedDim(axis, m, upa, lo, t, b, grid, extent))
    return tuple(dims)


def block_sizes(extents: list[int | None], given: tuple[int, ...] | None) -> list[int]:
    """Threads per block along each mapped axis (x first): ``Options.gpu_block`` when
    given, else 256 threads on one axis, 32 x 8 on two, 32 x 4 x 2 on three, fewer on
    y/z when the extent is smaller (the block stays a whole number of warps)."""
    n = len(extents)
    if given is not None:
        sizes = (list(given) + [1, 1, 1])[:n]
        total = 1
        for s in sizes:
            total *= s
        if total > MAX_THREADS:
            raise CompileError(f"gpu_block {given} has {total} threads; at most {MAX_THREADS}")
        return sizes
    if n == 1:
        e = extents[0]
        return [DEFAULT_BLOCK_1D if e is None else min(DEFAULT_BLOCK_1D, -(-e // 32) * 32)]
    sizes = [DEFAULT_BLOCK_X, DEFAULT_BLOCK_Y[n]] + ([DEFAULT_BLOCK_Z] if n == 3 else [])
    for i in range(1, n):
        e = extents[i]
        while e is not None and sizes[i] > 1 and sizes[i] // 2 >= e:
            sizes[i] //= 2
    return sizes


def register_tiles(blocks: list[int], extents: list[int | None],
                   points: bool | tuple[int, ...]) -> list[int]:
    """Tiles of a register-tiled kernel: ``points`` per thread along each axis
    (``True``: :data:`REGISTER_POINTS`), fewer where the extent is smaller."""
    want = list(REGISTER_POINTS if points is True else points) + [1, 1, 1]
    tiles = []
    for b, e, p in zip(blocks, extents, want):
        if e is not None:
            p = max(1, min(p, -(-e // b)))
        tiles.append(b * p)
    return tiles


def _tile_sizes(blocks: list[int], given: tuple[int, ...] | None) -> list[int]:
    if given is None:
        return list(blocks)
    tiles = (list(given) + list(blocks[len(given):]))[:len(blocks)]
    for t, b in zip(tiles, blocks):
        if t % b:
            raise CompileError(f"gpu_tile {given} must be a multiple of the block {blocks} "
                               "along each axis")
    return tiles


def _thread_instances(dims: tuple[MappedDim, ...]) -> isl.UnionSet:
    """The instances run by thread ``(polyc_t*)`` of block ``(polyc_b*)``."""
    result: isl.UnionSet | None = None
    for d in dims:
        b, t = d.block_param, d.thread_param
        strided = (f"exists q: v = {d.lo} + {d.tile}*{b} + {t} + {d.block}*q and q >= 0 "
                   f"and {t} + {d.block}*q < {d.tile}" if d.tile != d.block
                   else f"v = {d.lo} + {d.tile}*{b} + {t}")
        rng = isl.Set(f"[{b}, {t}] -> {{ [v] : {strided} }}")
        part = isl.UnionMap.from_union_pw_aff(d.function).intersect_range(
            isl.UnionSet.from_set(rng)).domain()
        result = part if result is None else result.intersect(part)
    assert result is not None
    return result


def _context(kernel: Kernel, dims: tuple[MappedDim, ...]) -> isl.Set:
    """The sizes' context and ``0 <= t < B``, ``0 <= b`` (and ``b < grid`` when known)."""
    conds = []
    for d in dims:
        conds.append(f"0 <= {d.thread_param} < {d.block}")
        conds.append(f"{d.block_param} >= 0")
        if d.extent is not None:
            conds.append(f"{d.tile}*{d.block_param} < {d.extent}")
    params = [d.block_param for d in dims] + [d.thread_param for d in dims]
    extra = isl.Set(f"[{', '.join(params)}] -> {{ : {' and '.join(conds)} }}")
    return kernel.context.align_params(extra.get_space()).intersect(
        extra.align_params(kernel.context.get_space()))
