"""Compute a schedule tree with isl's ILP scheduler, under a fusion strategy.

Fusion modes (``Options.fusion``):

* ``min``: every statement gets its own loop nest, in program order.
* ``smart``: statements are cut into runs of consecutive statements (program order)
  with the same loop depth; isl fuses within a run. This keeps the initialisation of a
  reduction (2-D) out of the reduction's 3-D band, so that band stays permutable and
  tileable in all three dimensions, much as Pluto's smartfuse cuts between
  statements of different dimensionality.
* ``max``: one run for the whole kernel; isl schedules whole components at once
  (``schedule_whole_component``) and fuses as much as the dependences allow.

Cutting in program order is always legal: the original program is sequential, so
every dependence goes from an earlier statement to a later one (or within one). For C
input, whose statements share loops (``Kernel.order``), that holds only between separate
loop nests: statements of one nest stay in one run -- unless no dependence runs backwards
across a cut between two of them (:func:`_distributed`, loop distribution) -- and past
the budget they keep the source's order.

isl's scheduler runs within an operation budget (:data:`ISL_OPERATIONS`): some
programs (several statements of different depths, generic sizes, ``max`` fusion) make
its ILPs blow up to minutes. Past the budget the run is cut into single statements (a
:class:`~polyc.errors.PolycWarning` says so), and a single statement past the budget
keeps its source order -- both legal for the reason above, so compile time stays bounded.
Whole-component scheduling (``max``) spends its time in ILPs isl does not count: it
runs in a forked child killed after :data:`WHOLE_COMPONENT_SECONDS`, and falls back to
isl's default clustering.

The result, for two runs::

    domain
      sequence
        filter { S0 }      filter { S1, S2 }
          band (isl)         band (isl) ...
"""
from __future__ import annotations

import contextlib
import os
import select
import signal
import threading
import time
import warnings
from collections.abc import Callable, Iterator

import islpy as isl

from .. import expr as E
from ..deps import Dependences
from ..errors import PolycWarning, ScheduleError, SemanticError
from ..ir import Kernel, Statement, params_prefix
from ..options import Options


@contextlib.contextmanager
def isl_options(ctx: isl.Context, **values: int) -> Iterator[None]:
    """Set isl context options (``schedule_whole_component=1``...) for a block."""
    old = {k: getattr(ctx, f"get_{k}")() for k in values}
    try:
        for k, v in values.items():
            getattr(ctx, f"set_{k}")(v)
        yield
    finally:
        for k, v in old.items():
            getattr(ctx, f"set_{k}")(v)


def fusion_groups(kernel: Kernel, mode: str,
                  validity: isl.UnionMap | None = None) -> list[list[Statement]]:
    """Runs of consecutive statements scheduled together (see the module doc)."""
    stmts = list(kernel.statements)
    if mode == "max":
        return [stmts]
    if kernel.order:  # C input: statements sharing a loop nest may depend on each other
        # both ways across its iterations; only separate nests are cut apart
        groups: list[list[Statement]] = []
        for s in stmts:
            top = kernel.position(s.name)[0]
            if groups and kernel.position(groups[-1][-1].name)[0] == top:
                groups[-1].append(s)
            else:
                groups.append([s])
        if validity is None or not DISTRIBUTE_NESTS or kernel.exits or kernel.folds:
            return groups  # (early exits and folded storage need their shared loops)
        return [part for g in groups for part in _distributed(g, kernel, validity, mode)]
    if mode == "min":
        return [[s] for s in stmts]
    groups: list[list[Statement]] = []
    for s in stmts:
        if groups and loop_depth(groups[-1][-1], kernel) == loop_depth(s, kernel) \
                and not _reads_flattened(s, groups[-1]):
            groups[-1].append(s)
        else:
            groups.append([s])
    return groups


#: cut a C loop nest's statements apart where no dependence runs backwards
#: (:func:`_distributed`)
DISTRIBUTE_NESTS = True


def _distributed(group: list[Statement], kernel: Kernel, validity: isl.UnionMap,
                 mode: str) -> list[list[Statement]]:
    """The statements of one C loop nest cut into runs, as loop distribution would: a
    cut goes between two consecutive statements of different loop depths (any two
    under ``fusion="min"``) when no dependence goes from a statement after it to one
    before it, so running all of the first run before the second keeps every
    dependence. PolyBench's ``C[i][j] *= beta`` then ``C[i][j] += alpha * A[i][k] *
    B[k][j]`` in one ``i`` loop: the scaling fused into the product's band as a guarded
    statement left the product with no register tile (0.76x gcc); cut apart, the
    product alone is a matmul."""
    runs: list[list[Statement]] = [[group[0]]]
    for s in group[1:]:
        prev = runs[-1][-1]
        if mode == "min" or loop_depth(prev, kernel) != loop_depth(s, kernel):
            before = _group_domain(kernel, [x for r in runs for x in r])
            rest = group[group.index(s):]
            back = validity.intersect_domain(_group_domain(kernel, rest)).intersect_range(before)
            if back.is_empty():
                runs.append([s])
                continue
        runs[-1].append(s)
    return runs


def _group_domain(kernel: Kernel, stmts: list[Statement]) -> isl.UnionSet:
    """The union of the statements' domains under the kernel's context."""
    out = isl.UnionSet.empty(kernel.context.get_space())
    for s in stmts:
        out = out.union(isl.UnionSet.from_set(s.domain))
    return out.intersect_params(kernel.context)


def _reads_flattened(s: Statement, group: list[Statement]) -> bool:
    """Whether ``s`` reads an array that ``group`` writes at an index combining several
    iterators (the flat pixels ``p = 14*h + w`` of an int8 convolution's sums, read by
    its requantization over ``h, w``): no loop of the two lines up with the other's, and
    isl's scheduler spent up to 2 s a kernel looking for a fusion (ResNet-50 int8's
    compile time doubled)."""
    written = {t.write.array for t in group}
    return any(r.array in written and any(len(E.free_names(ix)[0]) > 1 for ix in r.indices)
               for r in E.reads(s.value))


def loop_depth(s: Statement, kernel: Kernel) -> int:
    """The loops ``s`` really has: its iterators, less those that every piece of a
    domain made of lower-dimensional pieces fixes to one value (the border of an array,
    ``i = 0 or i = N-1 or j = 0 or j = N-1``, is four pieces of one loop each: one
    loop, not two). A dimension the whole domain fixes (a batch of 1) still counts."""
    domain = s.domain.intersect_params(kernel.context)
    pieces = domain.get_basic_set_list()
    if pieces.n_basic_set() < 2:
        return len(s.iterators)
    depth = max(len(s.iterators) - _fixed(pieces.get_at(k), len(s.iterators))
                for k in range(pieces.n_basic_set()))
    return depth + _fixed(domain.affine_hull(), len(s.iterators))


def _fixed(bset: isl.BasicSet, n: int) -> int:
    """How many independent equalities over its ``n`` dimensions ``bset``'s affine hull has."""
    return sum(1 for c in bset.affine_hull().get_constraints()
               if c.is_equality() and c.involves_dims(isl.dim_type.set, 0, n))


def _filter_names(umap: isl.UnionMap, names: set[str]) -> isl.UnionMap:
    """Keep the parts of ``umap`` whose source and sink are both statements in ``names``."""
    keep: list[isl.Map] = []
    umap.foreach_map(lambda m: keep.append(m) if (
        m.get_tuple_name(isl.dim_type.in_) in names
        and m.get_tuple_name(isl.dim_type.out) in names) else None)
    out = isl.UnionMap.empty(umap.get_space())
    for m in keep:
        out = out.union(isl.UnionMap.from_map(m))
    return out


#: isl operations one call of its scheduler may take (normal kernels, ResNet-50's
#: convolutions and the PolyBench nests included, take a few thousand at most)
ISL_OPERATIONS = 200_000


#: seconds isl may spend scheduling a whole component (``fusion="max"``): its ILPs
#: there are not counted in operations and can run for minutes (fuzz seeds 410, 5003)
WHOLE_COMPONENT_SECONDS = 5.0
#: seconds the Pluto scheduler, and isl's on statements that share a C loop nest, may
#: take before polyc falls back (to isl's scheduler, to the source's loop nest)
SCHEDULER_SECONDS = 10.0


def _schedule_group(kernel: Kernel, deps: Dependences, group: list[Statement],
                    whole_component: bool) -> isl.Schedule:
    if whole_component and len(group) > 1:
        sched = _within_or_warn(
            kernel, lambda: _isl_schedule(kernel, deps, group, True), WHOLE_COMPONENT_SECONDS,
            "isl's scheduler did not fuse the whole component within {s} s; it is scheduled "
            "as isl clusters it by default (as fusion='smart' within one run)")
        if sched is not None:
            return sched
        whole_component = False
    if kernel.folds and kernel.order and len(group) > 1:
        # a recurrence whose state is stored for its last steps only once scheduled
        # (Kernel.folds): its steps keep the source's order, the shared loop outermost
        # (isl would run each state element's whole history in turn: legal with the
        # full storage, not with the folded one)
        return _program_order(kernel, deps, group)
    if kernel.order and len(group) > 1:
        # statements sharing a C loop nest: isl's ILPs there can take minutes whatever
        # its operation budget says (heat-3d: three calls of 27 s); bound the time
        sched = _within_or_warn(
            kernel, lambda: _budgeted(kernel, deps, group, whole_component), SCHEDULER_SECONDS,
            f"isl's scheduler did not finish within {{s}} s on statements "
            f"{', '.join(s.name for s in group)}; they keep the source's loop nest")
        return sched if sched is not None else _program_order(kernel, deps, group)
    return _budgeted(kernel, deps, group, whole_component)


def _over_budget(e: isl.Error) -> bool:
    return "maximal number of operations" in str(e)


class _Unreadable(Exception):
    """isl could not read back a text it printed."""


def _private_schedule(kernel: Kernel, deps: Dependences, group: list[Statement],
                      whole_component: bool) -> isl.Schedule | None:
    """isl's schedule of ``group`` computed in a context of its own with the budget
    (None past it). isl counts operations per context: set on the kernel's, the budget
    also counted every other thread's calls there (a model's steps compiled in parallel
    threads: another thread's dependence analysis failed on it). The problem and the
    schedule pass between the contexts as text."""
    private = isl.Context()
    private.set_max_operations(ISL_OPERATIONS)
    try:
        sched = _isl_schedule(kernel, deps, group, whole_component, private)
    except isl.Error as e:
        if not _over_budget(e):
            raise
        return None
    try:
        return isl.Schedule.read_from_str(kernel.context.get_ctx(), sched.to_str())
    except isl.Error as e:
        raise _Unreadable(str(e)) from e


_BUDGET_LOCK = threading.Lock()


def _shared_schedule(kernel: Kernel, deps: Dependences, group: list[Statement],
                     whole_component: bool) -> isl.Schedule | None:
    """:func:`_private_schedule` on the kernel's own context, for a problem whose text
    isl cannot read back: one budgeted call at a time, and the budget removed after."""
    ctx = kernel.context.get_ctx()
    with _BUDGET_LOCK:
        ctx.set_max_operations(ISL_OPERATIONS)
        ctx.reset_operations()
        try:
            return _isl_schedule(kernel, deps, group, whole_component)
        except isl.Error as e:
            if not _over_budget(e):
                raise
            return None
        finally:
            ctx.set_max_operations(0)
            ctx.reset_operations()


def _budgeted(kernel: Kernel, deps: Dependences, group: list[Statement],
              whole_component: bool) -> isl.Schedule:
    """isl's schedule of ``group`` within :data:`ISL_OPERATIONS`, or the fallbacks of
    the module doc past it."""
    try:
        sched = _private_schedule(kernel, deps, group, whole_component)
    except _Unreadable:
        sched = _shared_schedule(kernel, deps, group, whole_component)
    if sched is not None:
        return sched
    if len(group) == 1:
        return _source_order(kernel, group[0])
    if kernel.order:  # statements share loops: the source's own order is the legal one
        warnings.warn(PolycWarning(
            f"{kernel.name}: isl's scheduler exceeded its budget of {ISL_OPERATIONS} "
            f"operations on statements {', '.join(s.name for s in group)}; they keep the "
            "source's loop nest"), stacklevel=2)
        return _program_order(kernel, deps, group)
    warnings.warn(PolycWarning(
        f"{kernel.name}: isl's scheduler exceeded its budget of {ISL_OPERATIONS} operations "
        f"on statements {', '.join(s.name for s in group)}; they are scheduled one at a "
        f"time in program order (as fusion='min')"), stacklevel=2)
    parts = [_schedule_group(kernel, deps, [s], False) for s in group]
    sched = parts[0]
    for p in parts[1:]:
        sched = sched.sequence(p)
    return sched


def _within_or_warn(kernel: Kernel, fn: Callable[[], isl.Schedule], seconds: float,
                    why: str) -> isl.Schedule | None:
    """:func:`_within`, with a PolycWarning ``why`` (``{s}``: the seconds) past them."""
    sched = _within(kernel, fn, seconds)
    if sched is None:
        warnings.warn(PolycWarning(f"{kernel.name}: {why.format(s=f'{seconds:g}')}"),
                      stacklevel=3)
    return sched


def _within(kernel: Kernel, fn: Callable[[], isl.Schedule],
            seconds: float) -> isl.Schedule | None:
    """``fn()`` computed in a forked child (:func:`time_limited`), or None past
    ``seconds``; computed here where there is no ``fork``."""
    if not hasattr(os, "fork"):
        return fn()
    text = time_limited(lambda: fn().to_str(), seconds)
    return None if text is None else isl.Schedule.read_from_str(kernel.context.get_ctx(), text)


def time_limited(fn: Callable[[], str], seconds: float) -> str | None:
    """``fn()`` computed in a forked child, or None if it takes longer than ``seconds``
    (isl cannot be interrupted from Python; the child can be killed)."""
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: compute, send, leave without Python's clean-up
        status = 1
        try:
            os.close(r)
            data = fn().encode()
            while data:
                data = data[os.write(w, data):]
            status = 0
        finally:
            os._exit(status)
    os.close(w)
    chunks, deadline = [], time.monotonic() + seconds
    try:
        while True:
            left = deadline - time.monotonic()
            if left <= 0 or not select.select([r], [], [], left)[0]:
                os.kill(pid, signal.SIGKILL)
                return None
            chunk = os.read(r, 1 << 16)
            if not chunk:
                break
            chunks.append(chunk)
    finally:
        os.close(r)
        _, status = os.waitpid(pid, 0)
    if status != 0:  # the child failed: compute here to get the error itself
        return fn()
    return b"".join(chunks).decode()


def _source_order(kernel: Kernel, s: Statement) -> isl.Schedule:
    """One statement in the order of its iterators (the source's loop nest)."""
    dom = isl.UnionSet.from_set(s.domain).intersect_params(kernel.context)
    if not s.iterators:
        return isl.Schedule.from_domain(dom)
    band = isl.MultiUnionPwAff.from_union_map(isl.UnionMap.from_map(
        isl.Map.identity(s.domain.get_space().map_from_set())))
    return isl.Schedule.from_domain(dom).insert_partial_schedule(band)


def _program_order(kernel: Kernel, deps: Dependences, group: list[Statement]) -> isl.Schedule:
    """``group`` in the program's own order (its position vectors): always legal.

    As a tree (:func:`_position_tree`): a sequence where the statements' positions are
    constants that differ, a band where they are loops -- shared loops outermost, then
    each statement's own loops in a band whose coincident and permutable flags are
    read off the dependences, so that :mod:`.optimize` vectorizes and tiles a
    recurrence's step as any other loop nest (a flat band of the whole position vector
    would leave every loop of the step scalar). Positions that mix constants and loops
    at one depth keep that flat band."""
    dom = _group_domain(kernel, group)
    order = deps.original_schedule.intersect_domain(dom)
    flat = isl.Schedule.from_domain(dom).insert_partial_schedule(
        isl.MultiUnionPwAff.from_union_map(order))
    positions = {s.name: [str(x) for x in kernel.position(s.name)] for s in group}
    depth = max(len(b) for b in positions.values())
    positions = {k: b + ["0"] * (depth - len(b)) for k, b in positions.items()}
    tree = _position_tree(kernel, group, positions, 0, depth)
    if tree is None:
        return flat
    return _flag_bands(tree, deps)


def _constant(text: str) -> int | None:
    try:
        return int(text)
    except ValueError:
        return None


def _position_tree(kernel: Kernel, group: list[Statement], positions: dict[str, list[str]],
                   d: int, depth: int) -> isl.Schedule | None:
    """The schedule of ``group`` by its positions from depth ``d`` (None where a depth
    mixes constants and loops)."""
    dom = _group_domain(kernel, group)
    if d == depth:
        return isl.Schedule.from_domain(dom)
    consts = [_constant(positions[s.name][d]) for s in group]
    if all(c is not None for c in consts):
        parts = []
        for value in sorted(set(consts)):
            sub = [s for s, c in zip(group, consts) if c == value]
            part = _position_tree(kernel, sub, positions, d + 1, depth)
            if part is None:
                return None
            parts.append(part)
        tree = parts[0]
        for part in parts[1:]:
            tree = tree.sequence(part)
        return tree
    if any(c is not None for c in consts):
        return None
    end = d
    while end < depth and all(_constant(positions[s.name][end]) is None for s in group):
        end += 1
    inner = _position_tree(kernel, group, positions, end, depth)
    if inner is None:
        return None
    band = isl.UnionMap.empty(kernel.context.get_space())
    for s in group:
        its = ", ".join(s.iterators)
        m = isl.Map(f"{params_prefix(kernel.sizes)}{{ {s.name}[{its}] -> "
                    f"[{', '.join(positions[s.name][d:end])}] }}")
        band = band.union(isl.UnionMap.from_map(m.intersect_domain(s.domain)))
    return inner.insert_partial_schedule(isl.MultiUnionPwAff.from_union_map(band))


def _flag_bands(schedule: isl.Schedule, deps: Dependences) -> isl.Schedule:
    """``schedule`` with each band's members marked coincident where no dependence
    between instances of the same outer iteration runs along them, and the band
    permutable where none runs backwards along any member."""
    def visit(node: isl.ScheduleNode) -> isl.ScheduleNode:
        if node.get_type() == isl.schedule_node_type.band:
            node = _flag_band(node, deps)
        for i in range(node.n_children()):
            node = visit(node.child(i)).parent()
        return node
    return visit(schedule.get_root()).get_schedule()


def _flag_band(node: isl.ScheduleNode, deps: Dependences) -> isl.ScheduleNode:
    prefix = node.get_prefix_schedule_union_map()
    same = prefix.apply_range(prefix.reverse())
    dom = node.get_domain()
    validity = deps.validity.intersect_domain(dom).intersect_range(dom).intersect(same)
    coincidence = deps.coincidence.intersect_domain(dom).intersect_range(dom).intersect(same)
    mupa = node.band_get_partial_schedule()
    nonneg, zero = isl.UnionSet("{ [d] : d >= 0 }"), isl.UnionSet("{ [0] }")
    permutable, flags = True, []
    for m in range(node.band_n_member()):
        f = isl.UnionMap.from_union_pw_aff(mupa.get_union_pw_aff(m))
        along = [d.apply_domain(f).apply_range(f).deltas() for d in (validity, coincidence)]
        permutable = permutable and along[0].is_subset(nonneg)
        flags.append(along[1].is_subset(zero))
    node = node.band_set_permutable(int(permutable))
    for m, c in enumerate(flags):
        node = node.band_member_set_coincident(m, int(c))
    return node


#: merge Pluto's bands one above the other where the merged band is permutable
#: (:func:`merge_bands`; a switch for measurements)
MERGE_PLUTO_BANDS = True


def merge_bands(schedule: isl.Schedule, deps: Dependences) -> isl.Schedule:
    """``schedule`` with each band that has a band as its only child merged with it
    where the merged band is permutable: no dependence left by the loops above runs
    backwards along any member of either (:func:`_flag_band` decides, and sets the
    merged band's flags).

    Pluto ends a band for every statement at once when no further hyperplane keeps all
    live dependences non-negative; below the sequence it cuts next, a statement's own
    bands then come out one above the other. Covariance's product ``cov(i,j) +=
    d(k,i) * d(k,j)`` got ``[i]`` above ``[j, k]``: tiled apart, and with no row member in
    the band that :mod:`.register_tile` works on, no register tile (one thread, float,
    1200x1400: 81 -> 22 ms merged, as isl's scheduler, which makes maximal bands)."""
    def visit(node: isl.ScheduleNode) -> isl.ScheduleNode:
        if node.get_type() == isl.schedule_node_type.band:
            while node.n_children() == 1 \
                    and node.child(0).get_type() == isl.schedule_node_type.band:
                merged = _merged(node, deps)
                if merged is None:
                    break
                node = merged
        for i in range(node.n_children()):
            node = visit(node.child(i)).parent()
        return node
    return visit(schedule.get_root()).get_schedule()


def _merged(node: isl.ScheduleNode, deps: Dependences) -> isl.ScheduleNode | None:
    """The band at ``node`` merged with its child band, or None where the merged band is
    not permutable (or either band is not), or where a member parallel below the outer
    band is not in the merged one: ``A(i,j) = A(i-1,j-1)`` has ``j`` parallel once ``i``
    is fixed, but no member of ``[i, j]`` carries nothing, and the merged band would lose
    its vector loop."""
    child = node.child(0)
    if not node.band_get_permutable() or not child.band_get_permutable():
        return None
    mupa = node.band_get_partial_schedule().flat_range_product(
        child.band_get_partial_schedule())
    flags = [node.band_member_get_coincident(m) for m in range(node.band_n_member())] + \
        [child.band_member_get_coincident(m) for m in range(child.band_n_member())]
    merged = _flag_band(child.delete().parent().delete().insert_partial_schedule(mupa), deps)
    if not merged.band_get_permutable() or any(
            f and not merged.band_member_get_coincident(m) for m, f in enumerate(flags)):
        return None
    return merged


def _isl_schedule(kernel: Kernel, deps: Dependences, group: list[Statement],
                  whole_component: bool, ctx: isl.Context | None = None) -> isl.Schedule:
    """isl's schedule of ``group``, computed in ``ctx`` (the kernel's when None)."""
    names = {s.name for s in group}
    dom = _group_domain(kernel, group)
    parts = (dom, kernel.context, _filter_names(deps.validity, names),
             _filter_names(deps.coincidence, names), _filter_names(deps.proximity, names))
    if ctx is not None:
        try:
            dom, context, validity, coincidence, proximity = (
                type(x).read_from_str(ctx, x.to_str()) for x in parts)
        except isl.Error as e:
            raise _Unreadable(str(e)) from e
    else:
        dom, context, validity, coincidence, proximity = parts
    sc = (isl.ScheduleConstraints.on_domain(dom)
          .set_context(context)
          .set_validity(validity)
          .set_coincidence(coincidence)
          .set_proximity(proximity))
    ctx = dom.get_ctx()
    with isl_options(ctx, schedule_whole_component=int(whole_component),
                     schedule_maximize_coincidence=1, schedule_outer_coincidence=0):
        return sc.compute_schedule()


def compute_schedule(kernel: Kernel, deps: Dependences, options: Options) -> isl.Schedule:
    """A legal schedule tree for ``kernel`` under ``options.fusion`` (untiled, unmarked)."""
    if not kernel.statements:  # the TC parser refuses such a def; a hand-made IR may not
        raise SemanticError(f"kernel {kernel.name!r} has no statements: there is nothing "
                            "to schedule")
    if options.scheduler == "pluto":
        from .pluto import pluto_schedule

        try:
            sched = _within_or_warn(
                kernel, lambda: pluto_schedule(kernel, deps, options.fusion, options.diamond),
                SCHEDULER_SECONDS, "the Pluto scheduler did not finish within {s} s (its "
                "Farkas duals of large dependence polyhedra); using isl's scheduler")
        except ScheduleError as err:
            warnings.warn(PolycWarning(f"{kernel.name}: {err}; using isl's scheduler"),
                          stacklevel=3)
        else:
            if sched is not None:
                return merge_bands(sched, deps) if MERGE_PLUTO_BANDS else sched
    groups = fusion_groups(kernel, options.fusion, deps.validity)
    parts = [_schedule_group(kernel, deps, g, options.fusion == "max") for g in groups]
    if len(parts) == 1:
        return parts[0]
    sched = parts[0]
    for p in parts[1:]:
        sched = sched.sequence(p)
    return sched
