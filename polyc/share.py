"""Temporaries that never meet share their storage.

A chain of loop nests over temporaries -- a Jacobi sweep unrolled over time steps in
TC (``B0 = f(A_in)``, ``A0 = f(B0)``, ``B1 = f(A0)``...), a chain of layers in one
ONNX kernel -- allocates one array per step, and every nest streams a fresh array
through the caches. Once ``B0`` is read for the last time, ``B1`` can live where it was:
then the nests cycle over two arrays that stay in cache, as the in-place C does.

After scheduling, this pass renames a temporary to an earlier one of the same element
type and shape when their lifetimes are disjoint both in program order (so the renamed
kernel means what the original means) and in the schedule: below one sequence node of
the tree, every use of the first comes in an earlier child than every use of the
second (so the schedule runs it so). Only temporaries that are written before they are
read take part (one read where nothing wrote would find the other's values instead of
zeros), and only those of at least :data:`MIN_SHARED_BYTES` (small ones cost no
cache, and codegen may keep them in registers). A run of temporaries may end in an
output that comes after them and writes every element of itself: they then live in
the output's storage (the unrolled Jacobi sweeps run in the two output arrays, as the
in-place C does).

Where the tree does not keep two lifetimes apart -- the sweeps fused into one loop over
the rows (:mod:`polyc.schedule.fuse`), each a row behind the one before -- a renaming is
kept when the renamed kernel's dependences, computed anew, hold under the schedule (at
most :data:`MAX_CHECKED_TRIALS` tries). Renaming can make a copy repeat an earlier one:
each sweep copies the borders of its array from the same input, so once the arrays
share storage the later copies write what is there already, and their anti dependences
on the sweeps between would forbid the fused order. Such instances go
(:func:`_without_repeats`, with the schedule restricted to what is left). The final
renamed kernel's dependences are computed again and the schedule checked against them;
if it fails, nothing is shared.
"""
from __future__ import annotations

from dataclasses import dataclass, replace

import islpy as isl

from . import check
from . import expr as E
from .deps import Dependences, arrays_read_uninitialized, compute_dependences
from .dtypes import itemsize
from .errors import ScheduleError
from .ir import Access, Kernel, array_box
from .schedule import register_tile

#: temporaries smaller than this keep their own storage
MIN_SHARED_BYTES = 1 << 16
#: the most renamings checked against the dependences (each computes them anew), for
#: lifetimes that overlap in the schedule tree
MAX_CHECKED_TRIALS = 12


@dataclass
class _Slot:
    """Storage shared by temporaries: their names (the first names the storage), the
    last statement (in program order) that uses one, where their instances run
    (:func:`_paths`), and the output they end in (its storage, then: nothing follows)."""
    members: list[str]
    dtype: str
    shape: tuple[int, ...]
    last_statement: int
    paths: list
    output: str | None = None

    def fits(self, dtype: str, shape: tuple[int, ...], first: int) -> bool:
        """Could an array first used by statement ``first`` follow the members here (in
        program order, of the same element type and shape)?"""
        return self.output is None and self.dtype == dtype and self.shape == shape \
            and self.last_statement < first

    def target(self) -> str:
        return self.output or self.members[0]


def share_storage(kernel: Kernel, schedule: isl.Schedule
                  ) -> tuple[Kernel, Dependences | None, isl.Schedule]:
    """``kernel`` with its temporaries sharing storage where ``schedule`` allows (see the
    module doc), the new kernel's dependences (None when nothing is shared) and its
    schedule (``schedule`` less the copies that sharing made repeats)."""
    if kernel.order or kernel.folds:  # statements sharing loops (C input), folds pending
        return kernel, None, schedule
    sized = {a.name: shape for a in kernel.temporaries
             if (shape := _shape(kernel, a.name)) is not None
             and _count(shape) * itemsize(a.dtype) >= MIN_SHARED_BYTES}
    if len(sized) < 2 and not (sized and kernel.outputs):
        return kernel, None, schedule
    outputs = {name: shape for name in kernel.outputs if name not in kernel.inputs
               and (shape := _shape(kernel, name)) is not None}
    paths = _paths(schedule)
    # a statement a register mark runs (its init, its epilogue) runs where the mark's
    # reduction does; the arrays of a mark with an epilogue keep their names (the
    # epilogue is checked on them)
    fixed: set[str] = set()
    for mark in register_tile.register_marks(schedule):
        stmt = register_tile.parse_mark(mark)[0]
        for extra in (register_tile.mark_init(mark), register_tile.mark_epilogue(mark)):
            if extra:
                paths[extra] = paths.get(stmt, [])
        if register_tile.mark_epilogue(mark):
            fixed |= {kernel.statement(stmt).write.array,
                      kernel.statement(register_tile.mark_epilogue(mark)).write.array}
    span: dict[str, list[int]] = {}  # array -> [first statement, last statement]
    where: dict[str, list[Path]] = {}
    for i, s in enumerate(kernel.statements):
        for a in {s.write.array, *(r.array for r in s.reads)}:
            if (a in sized or a in outputs) and a not in fixed:
                span.setdefault(a, [i, i])[1] = i
                where.setdefault(a, []).extend(paths.get(s.name, []))
    uninitialized = arrays_read_uninitialized(kernel)
    slots: list[_Slot] = []
    trials = MAX_CHECKED_TRIALS
    for name in sorted((a for a in span if a not in uninitialized), key=lambda a: span[a][0]):
        first, last = span[name]
        dtype, shape = kernel.array(name).dtype, sized.get(name) or outputs[name]
        if name in outputs and not _writes_all(kernel, name):
            continue  # (it cannot end a slot, and outputs start none)
        fitting = [t for t in slots if t.fits(dtype, shape, first)]
        slot = next((t for t in fitting if _before(t.paths, where[name])), None)
        if slot is None:  # lifetimes that overlap in the tree (a fused loop): check them
            for t in fitting[:trials]:
                trials -= 1
                if _legal(kernel, schedule, _renames(slots, t, name, name in outputs)):
                    slot = t
                    break
        if name in outputs:  # it ends the slot's storage
            if slot is not None:
                slot.output = name
        elif slot is None:
            slots.append(_Slot([name], dtype, shape, last, list(where[name])))
        else:
            slot.members.append(name)
            slot.last_statement = last
            slot.paths.extend(where[name])
    renamed = _renames(slots)
    if not renamed:
        return kernel, None, schedule
    shared = _shared(kernel, renamed)
    deps = compute_dependences(shared)
    schedule_left = _restricted(schedule, shared)
    try:
        check.check_schedule(shared, deps, schedule_left)
    except ScheduleError:
        return kernel, None, schedule
    return shared, deps, schedule_left


def _renames(slots: list[_Slot], slot: _Slot | None = None, name: str = "",
             output: bool = False) -> dict[str, str]:
    """Each slot's members renamed to its storage; with ``slot``, ``name`` joins it too
    (``output``: as the output that ends it, whose storage all of them then take)."""
    out: dict[str, str] = {}
    for t in slots:
        members, target = list(t.members), t.target()
        if t is slot:
            if output:
                target = name
            else:
                members.append(name)
        out.update({m: target for m in members if m != target})
    return out


def _legal(kernel: Kernel, schedule: isl.Schedule, renamed: dict[str, str]) -> bool:
    """Does ``schedule`` keep the dependences of ``kernel`` with ``renamed`` sharing
    storage? (Exact, for lifetimes the tree alone does not keep apart.)"""
    shared = _shared(kernel, renamed)
    try:
        check.check_schedule(shared, compute_dependences(shared), _restricted(schedule, shared))
    except ScheduleError:
        return False
    return True


def _shared(kernel: Kernel, renamed: dict[str, str]) -> Kernel:
    return _without_repeats(_renamed(kernel, renamed)) if renamed else kernel


def _restricted(schedule: isl.Schedule, kernel: Kernel) -> isl.Schedule:
    """``schedule`` over the statement instances ``kernel`` still has."""
    domain = kernel.domain()
    have = schedule.get_domain().intersect_params(kernel.context)
    return schedule if have.is_subset(domain) else schedule.intersect_domain(domain)


def _without_repeats(kernel: Kernel) -> Kernel:
    """``kernel`` without the instances of copies that write again, from an array
    nothing writes, what an earlier copy wrote to the same element with nothing writing
    it between: once temporaries share storage, each unrolled Jacobi sweep's copy of the
    borders repeats the first sweep's (and its anti dependences on the sweeps between
    would forbid fusing them). A copy left with no instance goes."""
    written = {s.write.array for s in kernel.statements}
    kept: list = []
    changed = False
    for s in kernel.statements:
        mine = _copy_map(s, kernel, written)
        if mine is not None:
            repeated = mine.domain().subtract(mine.domain())
            for j, p in enumerate(kept):
                theirs = _copy_map(p, kernel, written) \
                    if p.write.array == s.write.array and p.value == s.value else None
                if theirs is None:
                    continue
                same = mine.intersect(theirs).domain()
                for t in kept[j + 1:]:
                    if same.is_empty():
                        break
                    same = same.subtract(_written(t, kernel, same))
                repeated = repeated.union(same)
            if not repeated.is_empty():
                dom = s.domain.intersect_params(kernel.context)
                again = s.write.relation(dom, kernel.array(s.write.array).shape) \
                    .intersect_range(repeated).domain()
                left = dom.subtract(again)
                changed = True
                if left.is_empty():
                    continue
                s = replace(s, domain=left)
        kept.append(s)
    return replace(kernel, statements=tuple(kept)) if changed else kernel


def _copy_map(s, kernel: Kernel, written: set[str]) -> isl.Map | None:
    """``{ X[e] -> Y[f] }`` when ``s`` is ``X(..) = Y(..)`` with affine indices and
    ``Y`` written by no statement; else None."""
    v = s.value
    if s.op != "=" or not isinstance(v, E.Read) or v.array in written \
            or not s.write.is_affine or not all(E.is_affine(i) for i in v.indices):
        return None
    dom = s.domain.intersect_params(kernel.context)
    out = s.write.relation(dom, kernel.array(s.write.array).shape)
    src = Access(v.array, tuple(v.indices)).relation(dom, kernel.array(v.array).shape)
    return out.reverse().apply_range(src)


def _written(t, kernel: Kernel, elements: isl.Set) -> isl.Set:
    """The ``elements`` statement ``t`` may write."""
    if t.write.array != elements.get_tuple_name():
        return elements.subtract(elements)
    if not t.write.is_affine:
        return elements
    dom = t.domain.intersect_params(kernel.context)
    return t.write.relation(dom, kernel.array(t.write.array).shape).range().intersect(elements)


def _shape(kernel: Kernel, array: str) -> tuple[int, ...] | None:
    """The extents of ``array`` when the kernel's fixed sizes give them."""
    env = dict(kernel.fixed_sizes)
    dims = kernel.array(array).shape
    if not all(set().union(*E.free_names(d)) <= env.keys() for d in dims):
        return None
    return tuple(E.evaluate(d, env) for d in dims)


def _count(shape: tuple[int, ...]) -> int:
    n = 1
    for d in shape:
        n *= d
    return n


def _writes_all(kernel: Kernel, array: str) -> bool:
    """Do the plain assignments to ``array`` write every element of it? (Then whatever
    another array left in its storage is overwritten before the kernel returns.)"""
    arr = kernel.array(array)
    box = array_box(kernel, array)
    written = box.subtract(box)
    for s in kernel.statements:
        if s.write.array == array and s.op == "=" and s.write.is_affine:
            written = written.union(s.write.relation(s.domain, arr.shape).range())
    return box.is_subset(written)


Path = tuple[tuple[tuple[int, ...], int], ...]


def _paths(schedule: isl.Schedule) -> dict[str, list[Path]]:
    """Per statement, where its instances run: for each leaf of the tree that runs some,
    the sequence nodes above it (each named by its position in the tree) and the child
    taken at each. A band ends the path: below it, the children run interleaved."""
    found: dict[str, list[Path]] = {}

    def walk(node: isl.ScheduleNode, at: tuple[int, ...], path: Path) -> None:
        kind = node.get_type()
        if kind == isl.schedule_node_type.band or node.n_children() == 0:
            domain = node.get_domain().get_set_list()
            for k in range(domain.n_set()):
                found.setdefault(domain.get_at(k).get_tuple_name(), []).append(path)
            return
        for i in range(node.n_children()):
            step = ((at, i),) if kind == isl.schedule_node_type.sequence else ()
            walk(node.child(i), at + (i,), path + step)
    walk(schedule.get_root(), (), ())
    return found


def _before(first: list[Path], then: list[Path]) -> bool:
    """Does everything on the paths ``first`` run before everything on ``then``? Yes when
    all of them pass one sequence node, the same way above it, and every ``first`` path
    takes an earlier child there than every ``then`` path."""
    if not first or not then:
        return False
    paths = first + then
    depth = 0
    while all(len(p) > depth for p in paths) and len({p[depth][0] for p in paths}) == 1:
        if len({p[depth][1] for p in paths}) > 1:
            return max(p[depth][1] for p in first) < min(p[depth][1] for p in then)
        depth += 1
    return False


def _renamed(kernel: Kernel, names: dict[str, str]) -> Kernel:
    """``kernel`` with every access to an array in ``names`` made to its image."""
    def read(e: E.Expr) -> E.Expr | None:
        return E.Read(names[e.array], e.indices) if isinstance(e, E.Read) \
            and e.array in names else None

    def access(a: Access) -> Access:
        return Access(names.get(a.array, a.array), tuple(E.map_expr(i, read) for i in a.indices))
    statements = tuple(replace(s, write=access(s.write), value=E.map_expr(s.value, read))
                       for s in kernel.statements)
    arrays = tuple(a for a in kernel.arrays if a.name not in names)
    return replace(kernel, statements=statements, arrays=arrays)
