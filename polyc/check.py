"""Checks of the IR and of schedules, each small and named.

* :func:`check_accesses_in_bounds`: every write and every unguarded read stays inside
  its array (a read under ``?:`` may point outside where its guard is false). Non-affine
  (indirect) index dimensions are not checked: keeping them in bounds is the job of whoever
  wrote them (the ONNX Gather lowering clamps its indices).
* :func:`check_schedule`: a schedule covers each statement instance, respects every
  validity dependence (legality), each ``parallel``/``simd`` mark sits on a loop
  that carries no coincidence dependence (but those of the sums a ``private:`` mark
  above a parallel loop gives each thread a copy for, :func:`_privatized`), and each
  ``register`` mark (an accumulator
  promoted to a local array, :mod:`polyc.schedule.register_tile`) is safe.

They raise :class:`ScheduleError` / :class:`CompileError` for problems a user can
cause (a hand-written schedule, an out-of-bounds index), with an explanation.
"""
from __future__ import annotations

import islpy as isl

from . import expr as E
from .deps import Dependences
from .errors import CompileError, ScheduleError
from .ir import Access, Kernel, access_relation, params_prefix
from .marks import REGISTER
from .schedule import register_tile
from .schedule.fuse import private_arrays, private_problem
from .schedule.vector import REDUCE, reduce_mark_problem


def check_accesses_in_bounds(kernel: Kernel) -> None:
    """Every access (read or write) of every statement is inside its array's extents."""
    for s in kernel.statements:
        unconditional = [Access(r.array, r.indices) for r in E.unconditional_reads(s.value)]
        for acc in (s.write, *unconditional):
            arr = kernel.array(acc.array)
            if not arr.shape:
                continue
            names = [f"d{i}" for i in range(arr.rank)]
            conds = " and ".join(f"0 <= {n} < {E.to_isl(d)}"
                                 for n, d, i in zip(names, arr.shape, acc.indices)
                                 if E.is_affine(i)) or "true"
            box = isl.Set(f"{params_prefix(kernel.sizes)}{{ {acc.array}[{', '.join(names)}] : {conds} }}")
            touched = acc.relation(s.domain).intersect_params(kernel.context).range()
            if not touched.is_subset(box):
                outside = touched.subtract(box)
                raise CompileError(
                    f"statement {s.name} ({s.origin or 'generated'}) accesses {acc.array} out of "
                    f"bounds: {E.show(E.Read(acc.array, acc.indices))} reaches {outside}")


def check_schedule(kernel: Kernel, deps: Dependences, schedule: isl.Schedule) -> None:
    """Raise :class:`ScheduleError` unless ``schedule`` is legal for ``kernel``."""
    _check_covers_domain(kernel, schedule)
    smap = _with_epilogues(kernel, schedule, schedule.get_map().intersect_params(kernel.context))
    _check_order(deps.validity.intersect_params(kernel.context), smap)
    _check_marks(deps, schedule, kernel)


def _with_epilogues(kernel: Kernel, schedule: isl.Schedule, smap: isl.UnionMap) -> isl.UnionMap:
    """``smap`` with the statements register marks run at their copy-outs
    (:func:`register_tile.epilogue_of`): each instance right after the last update of
    the element it reads (a time dimension more: 0 for the scheduled instances, 1 for
    these). That is the copy-out's time because nothing but the reduction runs below a
    register mark (:func:`register_tile.check_mark`) and each element's updates all run
    in one visit of it (the mark's init)."""
    marks = [(register_tile.parse_mark(m)[0], register_tile.mark_epilogue(m))
             for m in register_tile.register_marks(schedule)]
    marks = [(s, e) for s, e in marks if e]
    if not marks or smap.is_empty():
        return smap
    depth = smap.range().as_set().dim(isl.dim_type.set)
    ts = ", ".join(f"t{i}" for i in range(depth))

    def after(k: int) -> isl.UnionMap:
        return isl.UnionMap.from_map(isl.Map(f"{{ [{ts}] -> [{ts}{', ' if ts else ''}{k}] }}"))
    out = smap.apply_range(after(0))
    for stmt, epilogue in marks:
        s, e = kernel.statement(stmt), kernel.statement(epilogue)
        updates = isl.UnionMap.from_map(s.write.relation(s.domain)).reverse()  # A -> S
        last = updates.apply_range(smap).lexmax()
        for r in E.reads(e.value):
            if r.array == s.write.array:
                read = isl.UnionMap.from_map(access_relation(
                    e.domain, r.array, tuple(r.indices), kernel.array(r.array).shape))
                out = out.union(read.intersect_params(kernel.context).apply_range(last)
                                .apply_range(after(1)))
                break
    return out


def _check_covers_domain(kernel: Kernel, schedule: isl.Schedule) -> None:
    want = kernel.domain()
    for name in register_tile.dropped_inits(schedule):
        # an initialisation a register tile starts from (its mark is checked below)
        want = want.subtract(isl.UnionSet.from_set(kernel.statement(name).domain))
    have = schedule.get_domain().intersect_params(kernel.context)
    if not have.is_equal(want):
        raise ScheduleError(f"the schedule does not cover the iteration domain exactly: "
                            f"missing {want.subtract(have)}, extra {have.subtract(want)}")


def _check_order(validity: isl.UnionMap, smap: isl.UnionMap) -> None:
    """Every dependence source is scheduled strictly before its sink."""
    timed = validity.apply_domain(smap).apply_range(smap)
    bad: list[isl.Map] = []

    def check(m: isl.Map) -> None:
        lt = isl.Map.lex_lt(m.get_space().range())
        if not m.is_subset(lt):
            bad.append(m.subtract(lt))

    timed.foreach_map(check)
    if bad:
        # name the violated dependence in terms of statement instances
        viol = validity.intersect(isl.UnionMap.from_map(bad[0]).apply_domain(smap.reverse())
                                  .apply_range(smap.reverse()))
        raise ScheduleError(f"the schedule breaks a dependence: {viol if not viol.is_empty() else bad[0]}"
                            " runs the sink before (or with) its source")


def _check_marks(deps: Dependences, schedule: isl.Schedule, kernel: Kernel) -> None:
    coincidence = deps.coincidence.intersect_params(kernel.context)
    problems: list[str] = []
    for node in iter_nodes(schedule.get_root()):
        if node.get_type() != isl.schedule_node_type.mark:
            continue
        name = node.mark_get_id().get_name()
        band = node.child(0)
        if name in ("parallel", "simd") and band.get_type() == isl.schedule_node_type.band:
            deps = coincidence
            above = node.parent() if node.has_parent() else None
            private = None if above is None or above.get_type() != isl.schedule_node_type.mark \
                else private_arrays(above.mark_get_id().get_name(), kernel)
            if name == "parallel" and private:
                why, deps = _privatized(band, kernel, private, coincidence)
                if why is not None:
                    problems.append(f"the arrays {', '.join(private)} of the loop marked "
                                    f"{name!r} cannot have a copy per thread: {why}")
            if not _member_is_parallel(band, deps):
                problems.append(f"the loop marked {name!r} carries a dependence")
        elif name == REDUCE and band.get_type() == isl.schedule_node_type.band:
            why = reduce_mark_problem(band, kernel)
            if why is not None:
                problems.append(f"the loop marked {name!r} is no vector reduction: {why}")
        elif name.startswith(REGISTER + ":"):  # (a malformed one too: check_mark says so)
            why = register_tile.check_mark(node, kernel)
            if why is not None:
                problems.append(f"the mark {name!r} is unsafe: {why}")
    if problems:
        raise ScheduleError("; ".join(problems))


def _privatized(band: isl.ScheduleNode, kernel: Kernel, private: tuple[str, ...],
                coincidence: isl.UnionMap) -> tuple[str | None, isl.UnionMap]:
    """Why the loop of ``band`` may not give each thread a copy of the ``private``
    arrays (:func:`.schedule.fuse.private_problem`), or None, and the dependences it
    must still respect: those of the statements that add into a private array go, as
    the copies keep them."""
    names: set[str] = set()
    band.get_domain().foreach_set(lambda x: names.add(x.get_tuple_name()))
    why = private_problem(kernel, names, private)
    if why is not None:
        return why, coincidence
    adders = {n for n in names if kernel.statement(n).write.array in private}
    kept = isl.UnionMap.empty(coincidence.get_space())
    maps: list[isl.Map] = []
    coincidence.foreach_map(maps.append)
    for m in maps:
        if not (m.get_tuple_name(isl.dim_type.in_) in adders
                and m.get_tuple_name(isl.dim_type.out) == m.get_tuple_name(isl.dim_type.in_)):
            kept = kept.union(isl.UnionMap.from_map(m))
    return None, kept


def iter_nodes(node: isl.ScheduleNode):  # type: ignore[no-untyped-def]
    """Every node of the subtree at ``node``, top-down (no isl callbacks: exceptions stay safe)."""
    yield node
    for i in range(node.n_children()):
        yield from iter_nodes(node.child(i))


def _member_is_parallel(band: isl.ScheduleNode, coincidence: isl.UnionMap) -> bool:
    """The band's first member has distance 0 on every dependence inside one outer iteration."""
    prefix = band.get_prefix_schedule_union_map()
    dom = band.get_domain()
    deps = coincidence.intersect_domain(dom).intersect_range(dom)
    same_outer = prefix.apply_range(prefix.reverse())
    deps = deps.intersect(same_outer)
    if deps.is_empty():
        return True
    first = isl.UnionMap.from_union_pw_aff(band.band_get_partial_schedule().get_union_pw_aff(0))
    distances = deps.apply_domain(first).apply_range(first).deltas()
    zero = isl.UnionSet.from_set(isl.Set("{ [0] }")).intersect_params(
        isl.Set.universe(distances.get_space()))
    return distances.is_subset(zero)
