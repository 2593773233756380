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
in-place C does). The renamed kernel's dependences are
computed again and the schedule checked against them; if it fails, nothing is shared.
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

    def takes(self, dtype: str, shape: tuple[int, ...], first: int, paths: list) -> bool:
        return self.output is None and self.dtype == dtype and self.shape == shape \
            and self.last_statement < first and _before(self.paths, paths)


def share_storage(kernel: Kernel, schedule: isl.Schedule) -> tuple[Kernel, Dependences | None]:
    """``kernel`` with its temporaries sharing storage where ``schedule`` allows (see the
    module doc), and the new kernel's dependences (None when nothing is shared)."""
    if kernel.order or kernel.folds:  # statements sharing loops (C input), folds pending
        return kernel, None
    sized = {a.name: shape for a in kernel.temporaries
             if (shape := _shape(kernel, a.name)) is not None
             and _count(shape) * itemsize(a.dtype) >= MIN_SHARED_BYTES}
    if len(sized) < 2 and not (sized and kernel.outputs):
        return kernel, None
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
    for name in sorted((a for a in span if a not in uninitialized), key=lambda a: span[a][0]):
        first, last = span[name]
        dtype, shape = kernel.array(name).dtype, sized.get(name) or outputs[name]
        slot = next((t for t in slots if t.takes(dtype, shape, first, where[name])), None)
        if name in outputs:  # it ends the slot's storage, when it writes all of it
            if slot is not None and _writes_all(kernel, name):
                slot.output = name
        elif slot is None:
            slots.append(_Slot([name], dtype, shape, last, list(where[name])))
        else:
            slot.members.append(name)
            slot.last_statement = last
            slot.paths.extend(where[name])
    renamed = {m: t.output or t.members[0] for t in slots for m in t.members
               if m != (t.output or t.members[0])}
    if not renamed:
        return kernel, None
    shared = _renamed(kernel, renamed)
    deps = compute_dependences(shared)
    try:
        check.check_schedule(shared, deps, schedule)
    except ScheduleError:
        return kernel, None
    return shared, deps


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
