"""Schedules as first-class objects: :class:`ScheduleSpace`, edited by primitives.

A schedule space is the schedule of one kernel written the way papers and Pluto write it:
per statement, a list of **dimensions**, each either a **loop** (an affine expression of
the statement's iterators and the sizes, possibly with ``floor`` for tiles) with a name,
or a **position** in a sequence (a constant that orders statements sharing the loops
above it). The default is the source order::

    S0: [0, m, n, 0]          for m: for n: S0          (positions: 0 and 1)
    S1: [1, m, n, k]          for m: for n: for k: S1

Statements are named S0, S1, ... in source order and loops by their source index names;
tiling ``i`` makes ``i_tile`` (outer) and keeps ``i`` (inner). Every primitive is a pure
function from space to space and checks the result against the kernel's exact
dependences (isl) before returning it: an illegal step raises :class:`ScheduleError`
that names the dependence (kind, source and sink statement, the array, a concrete pair
of instances that would run in the wrong order) and, where a search over small skews,
shifts and fusions finds one, the step that would make it legal. Each step is recorded:
:meth:`ScheduleSpace.trace` replays on another operator (other sizes),
:meth:`ScheduleSpace.save` writes it and :func:`load_schedule` reads it back.

The space becomes an isl schedule tree (:meth:`ScheduleSpace.tree`): positions become
sequence nodes, loops one-member bands, ``parallel``/``vectorize`` steps marks that the C
printer turns into OpenMP pragmas -- compiled through the usual pipeline, whose
legality check runs again on the tree.
"""
from __future__ import annotations

import functools
import inspect
import itertools
import json
import math
import re
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import islpy as isl

from .. import expr as E
from ..deps import Dependences, compute_dependences
from ..errors import ScheduleError
from ..ir import Kernel, params_prefix

#: format version of a saved schedule (:meth:`ScheduleSpace.save`)
FORMAT = 1
#: marks a loop can carry, and the name of the schedule-tree mark of each
MARKS = {"parallel": "parallel", "vectorize": "simd"}
#: the mark of a loop bound to a GPU axis (``gpu:x``, ``gpu:y:8`` with its threads); in
#: the tree, consecutive bound loops form one band under the mark ``gpu:x@0,y@1:8``
#: (axis @ band member [: threads]) that the CUDA mapping reads
GPU_BIND = "gpu:"


@dataclass(frozen=True)
class Dim:
    """One schedule dimension of a statement: a loop (``expr`` affine in the iterators,
    isl syntax) named ``name``, or a sequence position (``expr`` an integer)."""
    name: str
    expr: str
    loop: bool = True


@dataclass(frozen=True)
class Step:
    """One primitive application, as recorded by the trace: ``name(*args)``."""
    name: str
    args: tuple[Any, ...]

    def __str__(self) -> str:
        return f"{self.name}({', '.join(repr(a) for a in self.args)})"


@dataclass(frozen=True)
class ScheduleTrace:
    """The steps of a schedule, replayable on any operator with the same statements and
    loop names (:meth:`ScheduleSpace.replay`)."""
    steps: tuple[Step, ...]
    kernel: str = ""

    def __str__(self) -> str:
        return "\n".join(str(s) for s in self.steps) or "(the default schedule)"

    def to_json(self) -> str:
        return json.dumps({"format": FORMAT, "kernel": self.kernel,
                           "steps": [[s.name, *_plain(s.args)] for s in self.steps]}, indent=1)

    @classmethod
    def from_json(cls, text: str) -> ScheduleTrace:
        try:
            data = json.loads(text)
            if data.get("format") != FORMAT:
                raise ScheduleError(f"unknown schedule format {data.get('format')!r} "
                                    f"(this polyc reads format {FORMAT})")
            steps = tuple(Step(s[0], tuple(_tuples(a) for a in s[1:])) for s in data["steps"])
        except (ValueError, KeyError, TypeError, IndexError) as err:
            raise ScheduleError(f"not a saved polyc schedule: {err}") from None
        for s in steps:
            if s.name not in PRIMITIVES:
                raise ScheduleError(f"unknown primitive {s.name!r} in a saved schedule "
                                    f"(known: {', '.join(sorted(PRIMITIVES))})")
        return cls(steps, data.get("kernel", ""))


def _plain(args: Iterable[Any]) -> list[Any]:
    return [list(a) if isinstance(a, tuple) else a for a in args]


def _tuples(a: Any) -> Any:
    return tuple(_tuples(x) for x in a) if isinstance(a, list) else a


def load_schedule(path: str) -> ScheduleTrace:
    """A schedule saved by :meth:`ScheduleSpace.save` (apply it with
    ``op.with_schedule(trace)`` or ``op.schedule_space().replay(trace)``)."""
    with open(path) as f:
        return ScheduleTrace.from_json(f.read())


@dataclass(frozen=True, eq=False)
class ScheduleSpace:
    """The schedule of ``kernel`` as per-statement dimensions (see the module doc)."""
    kernel: Kernel
    deps: Dependences
    dims: tuple[tuple[str, tuple[Dim, ...]], ...]
    #: (statement, loop name, mark) for parallel / vectorize
    marks: frozenset[tuple[str, str, str]] = frozenset()
    steps: tuple[Step, ...] = field(default=())
    #: search for a fix when a step is refused (off while searching)
    hints: bool = True
    #: steps with knobs (:class:`Knob`), recorded unapplied until values are chosen
    pending: tuple[Step, ...] = field(default=())

    # -- construction ----------------------------------------------------------------

    @classmethod
    def default(cls, kernel: Kernel, deps: Dependences | None = None) -> ScheduleSpace:
        """Source order: each statement in its own loop nest, in sequence (or, for C
        input, the loops as the C shares them)."""
        deps = deps or compute_dependences(kernel)
        rows = []
        for s in kernel.statements:
            rows.append((s.name, tuple(Dim(x, x) if isinstance(x, str) else
                                       Dim("", str(x), False) for x in kernel.position(s.name))))
        return cls(kernel, deps, _pad(tuple(rows)))

    # -- reading ---------------------------------------------------------------------

    @property
    def statements(self) -> tuple[str, ...]:
        return tuple(name for name, _ in self.dims)

    def loops(self, stmt: str) -> tuple[str, ...]:
        """The loop names of ``stmt``, outermost first."""
        return tuple(d.name for d in self._row(stmt) if d.loop and d.name)

    def trace(self) -> ScheduleTrace:
        self._concrete("trace")
        return ScheduleTrace(self.steps, self.kernel.name)

    # -- knobs -----------------------------------------------------------------------

    def knobs(self) -> tuple[Knob, ...]:
        """The knobs of the pending steps, in order of appearance."""
        out: list[Knob] = []
        for step in self.pending:
            for k in _knobs_in(step.args):
                if all(k is not x for x in out):
                    out.append(k)
        return tuple(out)

    def with_values(self, values: Sequence[Any] | Mapping[Any, Any]) -> ScheduleSpace:
        """The concrete space: the pending steps applied with each knob's value (a
        sequence in :meth:`knobs` order, or a mapping from knob or knob name)."""
        knobs = self.knobs()
        if isinstance(values, Mapping):
            chosen = [values[k] if k in values else values[k.name] for k in knobs]
        else:
            chosen = list(values)
        if len(chosen) != len(knobs):
            raise ScheduleError(f"{len(knobs)} knob values needed, got {len(chosen)}")
        for k, v in zip(knobs, chosen):
            if v not in k.values:
                raise ScheduleError(f"{v!r} is not a value of {k}")
        table = {id(k): v for k, v in zip(knobs, chosen)}
        space = replace(self, pending=())
        for step in self.pending:
            space = getattr(space, step.name)(*_substitute(step.args, table))
        return space

    def candidates(self) -> Iterator[tuple[Any, ...]]:
        """Every combination of knob values (in :meth:`knobs` order)."""
        return itertools.product(*(k.values for k in self.knobs()))

    def _concrete(self, what: str) -> None:
        if self.pending:
            shown = ", ".join(map(str, self.knobs()))
            raise ScheduleError(f"{what}: the schedule has knobs ({shown}) "
                                "-- search them with polyc.search, or fix them with "
                                ".with_values(...)")

    def save(self, path: str) -> None:
        """Write the trace (JSON) to ``path``: :func:`load_schedule` reads it."""
        with open(path, "w") as f:
            f.write(self.trace().to_json() + "\n")

    def replay(self, trace: ScheduleTrace | Sequence[Step]) -> ScheduleSpace:
        """This space with ``trace``'s steps applied in order (each checked)."""
        steps = trace.steps if isinstance(trace, ScheduleTrace) else tuple(trace)
        space = self
        for s in steps:
            space = getattr(space, s.name)(*s.args)
        return space

    def _row(self, stmt: str) -> tuple[Dim, ...]:
        for name, row in self.dims:
            if name == stmt:
                return row
        raise ScheduleError(f"{self.kernel.name} has no statement {stmt!r} (statements: "
                            f"{', '.join(self.statements)})")

    def _position(self, stmt: str, loop: str) -> int:
        row = self._row(stmt)
        for d, dim in enumerate(row):
            if dim.loop and dim.name == loop:
                return d
        raise ScheduleError(f"statement {stmt} has no loop {loop!r} (its loops: "
                            f"{', '.join(self.loops(stmt)) or 'none'})")

    def schedule_map(self) -> isl.UnionMap:
        """``{ S[i] -> [t0, t1, ...] }`` over every statement's domain."""
        umap = isl.UnionMap.empty(self.kernel.context.get_space())
        for name, row in self.dims:
            umap = umap.union(isl.UnionMap.from_map(self._stmt_map(name, row)))
        return umap.intersect_params(self.kernel.context)

    def _stmt_map(self, name: str, row: tuple[Dim, ...]) -> isl.Map:
        s = self.kernel.statement(name)
        text = (f"{params_prefix(self.kernel.sizes)}{{ {name}[{', '.join(s.iterators)}] -> "
                f"[{', '.join(d.expr for d in row)}] }}")
        try:
            m = isl.Map(text)
        except isl.Error as err:
            raise ScheduleError(f"statement {name}: the schedule {text} is not affine: "
                                f"{err}") from None
        return m.intersect_domain(s.domain)

    # -- the tree --------------------------------------------------------------------

    def tree(self) -> isl.Schedule:
        """The isl schedule tree: positions as sequences, loops as one-member bands,
        marks above the marked loops."""
        self._concrete("tree")
        dom = self.kernel.domain()
        maps = {name: self._stmt_map(name, row) for name, row in self.dims}
        root = isl.Schedule.from_domain(dom).get_root().child(0)
        node = self._build(root, list(self.statements), 0, maps)
        return node.get_schedule()

    def _build(self, node: isl.ScheduleNode, stmts: list[str], d: int,
               maps: dict[str, isl.Map]) -> isl.ScheduleNode:
        """Builds the subtree of ``stmts`` from dimension ``d`` at ``node``; returns the
        node at the same position (the top of the subtree)."""
        depth = len(self.dims[0][1])
        if d == depth:
            return node
        rows = {s: self._row(s)[d] for s in stmts}
        kinds = {dim.loop for dim in rows.values()}
        if kinds == {False}:
            values = sorted({int(dim.expr) for dim in rows.values()})
            if len(values) == 1:
                return self._build(node, stmts, d + 1, maps)
            groups = [[s for s in stmts if int(rows[s].expr) == v] for v in values]
            filters = isl.UnionSetList.alloc(node.get_ctx(), len(groups))
            for g in groups:
                filters = filters.add(self._domain_of(g))
            node = node.insert_sequence(filters)
            for i, g in enumerate(groups):
                child = self._build(node.child(i).child(0), g, d + 1, maps)
                node = child.parent().parent()
            return node
        if len(kinds) != 1:
            loops = [s for s in stmts if rows[s].loop]
            seqs = [s for s in stmts if not rows[s].loop]
            raise ScheduleError(f"statements {', '.join(loops)} have a loop at dimension {d} "
                                f"where {', '.join(seqs)} have a sequence position; they "
                                "share the loops above it: fuse or distribute them first")
        bound = self._bound_dims(stmts, d, depth)
        if bound:  # consecutive loops bound to GPU axes: one band, mapped as bound
            return self._build_bound(node, stmts, d, bound, maps)
        umap = self._dims_map(stmts, d, 1, maps)
        if umap.is_empty():  # statements with no instance for these sizes (a peeled piece)
            return node
        mupa = isl.MultiUnionPwAff.from_union_map(umap)
        node = node.insert_partial_schedule(mupa)
        marks = sorted({m for s in stmts for (st, loop, m) in self.marks
                        if st == s and loop == rows[s].name})
        for m in marks:
            node = node.insert_mark(isl.Id(MARKS.get(m, m))).child(0)
        child = self._build(node.child(0), stmts, d + 1, maps)
        node = child.parent()
        for _ in marks:
            node = node.parent()
        return node

    def _dims_map(self, stmts: list[str], d: int, k: int,
                  maps: dict[str, isl.Map]) -> isl.UnionMap:
        """``{ S[x] -> [t_d .. t_(d+k-1)] }`` over ``stmts``."""
        umap = isl.UnionMap.empty(self.kernel.context.get_space())
        for s in stmts:
            m = maps[s]
            n = m.dim(isl.dim_type.out)
            part = m.project_out(isl.dim_type.out, d + k, n - d - k).project_out(
                isl.dim_type.out, 0, d)
            umap = umap.union(isl.UnionMap.from_map(part))
        return umap

    def _binding(self, stmt: str, loop: str) -> str | None:
        for st, lp, m in self.marks:
            if st == stmt and lp == loop and m.startswith(GPU_BIND):
                return m[len(GPU_BIND):]
        return None

    def _bound_dims(self, stmts: list[str], d: int, depth: int) -> list[str]:
        """The GPU bindings (``x``, ``y:8``...) of the consecutive bound loops from
        dimension ``d`` down, when every statement of ``stmts`` binds them alike."""
        out: list[str] = []
        while d + len(out) < depth:
            here = {self._binding(s, self._row(s)[d + len(out)].name)
                    if self._row(s)[d + len(out)].loop else None for s in stmts}
            if len(here) != 1 or None in here:
                if len(here) > 1 and any(h is not None for h in here):
                    raise ScheduleError(f"statements {', '.join(stmts)} share a loop bound to "
                                        "different GPU axes (or bound by some of them only)")
                break
            out.append(here.pop())
        return out

    def _build_bound(self, node: isl.ScheduleNode, stmts: list[str], d: int,
                     bound: list[str], maps: dict[str, isl.Map]) -> isl.ScheduleNode:
        axes = [b.split(":")[0] for b in bound]
        if len(set(axes)) != len(axes):
            raise ScheduleError(f"two loops of {', '.join(stmts)} bound to one GPU axis "
                                f"({', '.join(axes)})")
        umap = self._dims_map(stmts, d, len(bound), maps)
        if umap.is_empty():
            return node
        node = node.insert_partial_schedule(isl.MultiUnionPwAff.from_union_map(umap))
        node = node.band_set_permutable(1)
        for i in range(len(bound)):
            node = node.band_member_set_coincident(i, 1)
        spec = ",".join(f"{b.split(':')[0]}@{i}" + (f":{b.split(':')[1]}" if ":" in b else "")
                        for i, b in enumerate(bound))
        node = node.insert_mark(isl.Id(f"{GPU_BIND}{spec}")).child(0)
        child = self._build(node.child(0), stmts, d + len(bound), maps)
        return child.parent().parent()

    def _domain_of(self, stmts: list[str]) -> isl.UnionSet:
        out = isl.UnionSet.empty(self.kernel.context.get_space())
        for s in stmts:
            out = out.union(isl.UnionSet.from_set(self.kernel.statement(s).domain))
        return out

    def isl_text(self) -> str:
        """The schedule tree as isl text (what ``Options(schedule=...)`` takes)."""
        return str(self.tree())

    # -- legality --------------------------------------------------------------------

    def check(self) -> ScheduleSpace:
        """Raise :class:`ScheduleError` unless every dependence runs in order and every
        marked loop carries none; returns ``self``."""
        self._concrete("check")
        tree = self.tree()  # a shape with no schedule tree (a loop beside a position) is refused
        if any(m.startswith(REGISTER_MARK) for _, _, m in self.marks):
            _check_register_marks(tree, self.kernel)
        smap = self.schedule_map()
        violation = self._order_violation(smap)
        if violation is not None:
            raise ScheduleError(violation)
        for stmt, loop, mark in sorted(self.marks):
            if mark not in MARKS and not mark.startswith(GPU_BIND):  # unroll: always legal
                continue
            why = self._carried(smap, stmt, loop)
            if why is not None:
                what = f"{mark}({stmt}, {loop!r})" if mark in MARKS else \
                    f"binding {stmt}'s loop {loop!r} to GPU axis {mark[len(GPU_BIND):]}"
                raise ScheduleError(f"{what} is illegal: the loop carries {why}")
        return self

    def _order_violation(self, smap: isl.UnionMap) -> str | None:
        for kind, rel in (("flow", self.deps.flow), ("anti", self.deps.anti),
                          ("output", self.deps.output)):
            rel = rel.intersect_params(self.kernel.context)
            timed = rel.apply_domain(smap).apply_range(smap).get_map_list()
            maps = [timed.get_at(i) for i in range(timed.n_map())]
            bad = [m for m in maps if not m.is_subset(isl.Map.lex_lt(m.get_space().range()))]
            if not bad:
                continue
            late = bad[0].subtract(isl.Map.lex_lt(bad[0].get_space().range()))
            pairs = rel.intersect(isl.UnionMap.from_map(late).apply_domain(smap.reverse())
                                  .apply_range(smap.reverse()))
            return self._describe(kind, pairs, "would run after (or with) its sink")
        return None

    def _carried(self, smap: isl.UnionMap, stmt: str, loop: str) -> str | None:
        """None if the loop ``loop`` of ``stmt`` carries no dependence between the
        statements sharing it, else a description of one."""
        d = self._position(stmt, loop)
        group = self._sharing(stmt, d)
        dom = self._domain_of(group)
        coincidence = self.deps.coincidence.intersect_params(self.kernel.context) \
            .intersect_domain(dom).intersect_range(dom)
        timed = coincidence.apply_domain(smap).apply_range(smap)
        n = len(self.dims[0][1])
        same = isl.Map(f"{{ [{', '.join(f't{i}' for i in range(n))}] -> "
                       f"[{', '.join(f'u{i}' for i in range(n))}] : "
                       + " and ".join([f"t{i} = u{i}" for i in range(d)] + [f"t{d} != u{d}"])
                       + " }")
        carried = timed.intersect(isl.UnionMap.from_map(same))
        if carried.is_empty():
            return None
        pairs = coincidence.intersect(carried.apply_domain(smap.reverse())
                                      .apply_range(smap.reverse()))
        for kind, rel in (("flow", self.deps.flow), ("anti", self.deps.anti),
                          ("output", self.deps.output), ("reduction", self.deps.reduction)):
            hit = pairs.intersect(rel)
            if not hit.is_empty():
                return self._describe(kind, hit, "is carried by it")
        return self._describe("coincidence", pairs, "is carried by it")

    def _sharing(self, stmt: str, d: int) -> list[str]:
        """The statements whose dimensions before ``d`` are the same loops and positions
        as ``stmt``'s (they share its loop at ``d``)."""
        mine = self._row(stmt)
        out = []
        for name, row in self.dims:
            if all((a.loop == b.loop and (a.loop or a.expr == b.expr))
                   for a, b in zip(mine[:d], row[:d])) and row[d].loop:
                out.append(name)
        return out

    def _describe(self, kind: str, pairs: isl.UnionMap, what: str) -> str:
        """``flow dependence S0 -> S1 through T: S0[3] writes what S1[2] reads ...``"""
        m = pairs.get_map_list().get_at(0) if pairs.n_map() else None
        if m is None:
            return f"a {kind} dependence {what}"
        src = m.get_tuple_name(isl.dim_type.in_)
        dst = m.get_tuple_name(isl.dim_type.out)
        arrays = self._arrays(kind, src, dst)
        point = m.wrap().sample_point()
        ctx = point.get_space()
        nparam = ctx.dim(isl.dim_type.param)
        params = {ctx.get_dim_name(isl.dim_type.param, i):
                  point.get_coordinate_val(isl.dim_type.param, i).to_python()
                  for i in range(nparam)}
        n_in = m.dim(isl.dim_type.in_)
        coords = [point.get_coordinate_val(isl.dim_type.set, i).to_python()
                  for i in range(n_in + m.dim(isl.dim_type.out))]
        a = f"{src}[{', '.join(map(str, coords[:n_in]))}]"
        b = f"{dst}[{', '.join(map(str, coords[n_in:]))}]"
        verbs = {"flow": ("writes", "reads"), "anti": ("reads", "overwrites"),
                 "output": ("writes", "overwrites"), "reduction": ("updates", "updates")}
        v1, v2 = verbs.get(kind, ("accesses", "accesses"))
        where = f" of {', '.join(arrays)}" if arrays else ""
        sizes = f" (with {', '.join(f'{k}={v}' for k, v in params.items())})" if params else ""
        return (f"the {kind} dependence {src} -> {dst}{where} {what}: {a} {v1} what {b} "
                f"{v2}{sizes}")

    def _arrays(self, kind: str, src: str, dst: str) -> list[str]:
        a, b = self.kernel.statement(src), self.kernel.statement(dst)
        reads_a = {r.array for r in E.reads(a.value)}
        reads_b = {r.array for r in E.reads(b.value)}
        if kind == "flow":
            return sorted({a.write.array} & reads_b)
        if kind == "anti":
            return sorted(reads_a & {b.write.array})
        return sorted({a.write.array} & {b.write.array})

    # -- editing ---------------------------------------------------------------------

    def _checked(self, space: ScheduleSpace, step: Step) -> ScheduleSpace:
        try:
            return space.check()
        except ScheduleError as err:
            hint = space._suggest(self, step) if self.hints else ""
            raise ScheduleError(f"{step} is illegal: {err}" + (f"; {hint}" if hint else "")) \
                from None

    def _suggest(self, before: ScheduleSpace, step: Step) -> str:
        """A step that, done first, makes ``step`` legal (a small skew or shift), or ''."""
        if step.name not in ("tile", "interchange", "reorder", "fuse", "parallel"):
            return ""
        stmt = step.args[0] if step.name != "fuse" else step.args[-1]
        if stmt not in before.statements:
            return ""
        before = replace(before, hints=False)
        loops = before.loops(stmt)
        tries: list[Step] = []
        if step.name == "fuse":
            for loop in loops:
                tries += [Step("shift", (stmt, loop, k)) for k in (1, 2)]
        else:
            for i, outer in enumerate(loops):
                for inner in loops[i + 1:]:
                    tries += [Step("skew", (stmt, outer, inner, f)) for f in (1, 2)]
        for t in tries:
            try:
                fixed = getattr(before, t.name)(*t.args)
                getattr(fixed, step.name)(*step.args)
            except ScheduleError:
                continue
            return f"legal after {t} first"
        if step.name == "fuse":  # a smaller fusion: fewer shared loops
            for k in range(int(step.args[0]) - 1, 0, -1):
                smaller = Step("fuse", (k, *step.args[1:]))
                try:
                    before.fuse(*smaller.args)
                except ScheduleError:
                    continue
                return f"{smaller} (fewer shared loops) is legal"
        return ""

    def _nest(self, stmt: str, loops: Sequence[str], step: Step,
              edit: Any) -> ScheduleSpace:
        """Apply ``edit(row, positions) -> row`` to ``stmt`` and to every statement sharing
        the loops ``loops`` of ``stmt`` with it (a loop-nest transformation: the
        statements fused in the nest move together); positions are those of ``loops``."""
        pos = [self._position(stmt, lp) for lp in loops]
        group = self._sharing(stmt, max(pos))
        rows = {g: tuple(edit(list(self._row(g)), pos)) for g in group}
        dims = tuple((name, rows.get(name, row)) for name, row in self.dims)
        return self._checked(replace(self, dims=_pad(dims), steps=self.steps + (step,)), step)

    # -- primitives ------------------------------------------------------------------

    def tile(self, stmt: str, loops: str | Sequence[str], sizes: int | Sequence[int]
             ) -> ScheduleSpace:
        """Tile the consecutive loops ``loops`` of ``stmt``'s nest by ``sizes``: loop ``i``
        gives ``i_tile`` (``floor(i / size)``, outer) and keeps ``i`` (inner); the tile
        loops come first, in the order of ``loops``."""
        loops = (loops,) if isinstance(loops, str) else tuple(loops)
        sizes = (sizes,) * len(loops) if isinstance(sizes, int) else tuple(sizes)
        step = Step("tile", (stmt, loops, sizes))
        if len(loops) != len(sizes) or not loops:
            raise ScheduleError(f"{step}: give one size per loop")
        if any(not isinstance(t, int) or t < 1 for t in sizes):
            raise ScheduleError(f"{step}: tile sizes must be positive integers")
        pos = [self._position(stmt, lp) for lp in loops]
        if pos != list(range(pos[0], pos[0] + len(pos))):
            raise ScheduleError(f"{step}: the loops must be consecutive, outermost first "
                                f"(the loops of {stmt}: {', '.join(self.loops(stmt))}); "
                                "reorder them first")

        def edit(row: list[Dim], at: list[int]) -> list[Dim]:
            taken = {d.name for d in row if d.loop}
            tiles = [Dim(_fresh(f"{row[p].name}_tile", taken), f"floor(({row[p].expr})/{t})")
                     for p, t in zip(at, sizes)]
            return row[:at[0]] + tiles + row[at[0]:]
        return self._nest(stmt, loops, step, edit)

    def split(self, stmt: str, loop: str, factor: int) -> ScheduleSpace:
        """``loop`` as ``loop_tile`` (outer, ``floor(loop / factor)``) and ``loop`` (inner,
        ``factor`` iterations): a tile of one loop."""
        return self.tile(stmt, (loop,), (factor,))

    def reorder(self, stmt: str, *loops: str) -> ScheduleSpace:
        """Put ``loops`` (loops of ``stmt``'s nest) in this order, in the positions they
        occupy; the other dimensions stay."""
        step = Step("reorder", (stmt, *loops))
        if len(set(loops)) != len(loops) or not loops:
            raise ScheduleError(f"{step}: name each loop once")

        def edit(row: list[Dim], at: list[int]) -> list[Dim]:
            moved = [row[p] for p in at]
            for p, dim in zip(sorted(at), moved):
                row[p] = dim
            return row
        return self._nest(stmt, loops, step, edit)

    def interchange(self, stmt: str, a: str, b: str) -> ScheduleSpace:
        """Swap loops ``a`` and ``b`` of ``stmt``'s nest."""
        step = Step("interchange", (stmt, a, b))

        def edit(row: list[Dim], at: list[int]) -> list[Dim]:
            row[at[0]], row[at[1]] = row[at[1]], row[at[0]]
            return row
        return self._nest(stmt, (a, b), step, edit)

    def skew(self, stmt: str, outer: str, inner: str, factor: int = 1) -> ScheduleSpace:
        """``inner := inner + factor * outer`` (``outer`` outside ``inner``): the wavefront
        that makes a stencil's loops tileable."""
        step = Step("skew", (stmt, outer, inner, factor))
        if self._position(stmt, outer) >= self._position(stmt, inner):
            raise ScheduleError(f"{step}: {outer!r} must be outside {inner!r}")

        def edit(row: list[Dim], at: list[int]) -> list[Dim]:
            o, i = at
            row[i] = replace(row[i], expr=f"({row[i].expr}) + {int(factor)}*({row[o].expr})")
            return row
        return self._nest(stmt, (outer, inner), step, edit)

    def reverse(self, stmt: str, loop: str) -> ScheduleSpace:
        """Run ``loop`` of ``stmt``'s nest backwards."""
        step = Step("reverse", (stmt, loop))

        def edit(row: list[Dim], at: list[int]) -> list[Dim]:
            row[at[0]] = replace(row[at[0]], expr=f"-({row[at[0]].expr})")
            return row
        return self._nest(stmt, (loop,), step, edit)

    def shift(self, stmt: str, loop: str, amount: int) -> ScheduleSpace:
        """``loop := loop + amount`` for ``stmt`` alone (to align it with the statements
        it is fused with)."""
        step = Step("shift", (stmt, loop, amount))
        row = list(self._row(stmt))
        d = self._position(stmt, loop)
        row[d] = replace(row[d], expr=f"({row[d].expr}) + {int(amount)}")
        dims = tuple((name, tuple(row) if name == stmt else r) for name, r in self.dims)
        return self._checked(replace(self, dims=_pad(dims), steps=self.steps + (step,)), step)

    def fuse(self, loops: int, *stmts: str) -> ScheduleSpace:
        """Let ``stmts`` (in this order) share their ``loops`` outermost loops: one nest
        instead of several (their positions move below the shared loops)."""
        step = Step("fuse", (loops, *stmts))
        if len(stmts) < 2:
            raise ScheduleError(f"{step}: name at least two statements")
        rows = {s: self._row(s) for s in stmts}
        for s, row in rows.items():
            if sum(1 for d in row if d.loop and d.name) < loops:
                raise ScheduleError(f"{step}: {s} has fewer than {loops} loops")
        # positions above the fused loops must agree: take the first statement's
        first = rows[stmts[0]]
        new: dict[str, tuple[Dim, ...]] = {}
        for k, s in enumerate(stmts):
            row = [d for d in rows[s] if d.loop or d.expr]
            lead, rest = _split_loops(row, loops)
            prefix = [d for d in first if not d.loop][:1] if not lead[0].loop else []
            shared = [d for d in lead if d.loop]
            new[s] = tuple(prefix + shared + [Dim("", str(k), False)] + rest)
        dims = tuple((name, new.get(name, row)) for name, row in self.dims)
        return self._checked(replace(self, dims=_pad(dims), steps=self.steps + (step,)), step)

    def distribute(self, stmt: str) -> ScheduleSpace:
        """Give ``stmt`` a loop nest of its own: the nest it shares is split in three, the
        statements before it, ``stmt``, the statements after it (their order kept)."""
        step = Step("distribute", (stmt,))
        row = self._row(stmt)
        if row[0].loop:
            raise ScheduleError(f"{step}: {stmt} has no sequence position at the top")
        top = int(row[0].expr)
        nest = [n for n, r in self.dims if not r[0].loop and int(r[0].expr) == top]
        if len(nest) < 2:
            raise ScheduleError(f"{step}: {stmt} already has a loop nest of its own")

        def order(name: str) -> tuple[int, ...]:  # the positions inside the nest
            return tuple(int(d.expr) for d in self._row(name)[1:] if not d.loop)
        mine = order(stmt)
        dims = []
        for name, r in self.dims:
            if name == stmt:
                r = (Dim("", str(top + 1), False),) + tuple(d for d in r[1:] if d.loop)
            elif name in nest and order(name) > mine:
                r = (Dim("", str(top + 2), False),) + r[1:]
            elif not r[0].loop and int(r[0].expr) > top:
                r = (Dim("", str(int(r[0].expr) + 2), False),) + r[1:]
            dims.append((name, r))
        return self._checked(replace(self, dims=_pad(tuple(dims)),
                                     steps=self.steps + (step,)), step)

    def parallel(self, stmt: str, loop: str) -> ScheduleSpace:
        """Run ``loop`` (and the same loop of the statements sharing it) with OpenMP
        threads; refused if it carries a dependence."""
        return self._mark(stmt, loop, "parallel")

    def bind(self, stmt: str, loop: str, axis: str, threads: int | None = None
             ) -> ScheduleSpace:
        """CUDA target: map ``loop`` (and the same loop of the statements sharing it) to
        the GPU axis ``axis`` (``"x"``, ``"y"`` or ``"z"``), ``threads`` threads per block
        along it (else ``Options.gpu_block`` or the default); each block runs a tile of
        the loop, each thread its points. The bound loops of a kernel must be its
        outermost, consecutive loops; refused if the loop carries a dependence. Without
        any bound loop a workbench schedule runs on one GPU thread. (On the C target the
        binding is ignored.)"""
        step = Step("bind", (stmt, loop, axis) + ((threads,) if threads is not None else ()))
        if axis not in ("x", "y", "z"):
            raise ScheduleError(f"{step}: the axis is 'x', 'y' or 'z'")
        if threads is not None and (not isinstance(threads, int) or not 1 <= threads <= 1024):
            raise ScheduleError(f"{step}: threads per block along an axis: 1 to 1024")
        if self._binding(stmt, loop) is not None:
            raise ScheduleError(f"{step}: {loop!r} of {stmt} is already bound")
        mark = f"{GPU_BIND}{axis}" + (f":{threads}" if threads is not None else "")
        return self._mark(stmt, loop, mark, step)

    def registers(self, stmt: str, loop: str) -> ScheduleSpace:
        """Keep the elements of its array that ``stmt`` updates in one iteration of the
        loops outside ``loop`` in a local array (registers) from ``loop`` down: loaded
        before the loop, stored after it -- polyc's register tiles (unroll and vectorize
        the loops of the tile to keep it in vector registers). Refused unless ``stmt``
        alone runs below ``loop``, reads its array only where it writes it, and those
        elements form a fixed box of at most 4096 elements."""
        from .register_tile import vector_bits
        step = Step("registers", (stmt, loop))
        d = self._position(stmt, loop)
        s = self.kernel.statement(stmt)
        smap = self._stmt_map(stmt, self._row(stmt))
        n = smap.dim(isl.dim_type.out)
        prefix = smap.project_out(isl.dim_type.out, d, n - d)
        written = prefix.reverse().apply_range(s.write.relation(s.domain)) \
            .intersect_params(self.kernel.context)
        if written.is_empty():  # no instance for these sizes (a trace replayed): nothing
            return self._checked(replace(self, steps=self.steps + (step,)), step)
        shape = []
        for i in range(written.dim(isl.dim_type.out)):
            one = written.project_out(isl.dim_type.out, i + 1,
                                      written.dim(isl.dim_type.out) - i - 1) \
                .project_out(isl.dim_type.out, 0, i)
            lo = one.lexmin_pw_multi_aff().get_pw_aff(0)
            hi = one.lexmax_pw_multi_aff().get_pw_aff(0)
            extent = hi.sub(lo).max_val() if not one.is_empty() else None
            if extent is None or not extent.is_int():
                raise ScheduleError(f"{step}: the elements of {s.write.array} that {stmt} "
                                    f"updates below {loop!r} form no box of fixed size")
            shape.append(extent.to_python() + 1)
        if math.prod(shape) > 4096:
            raise ScheduleError(f"{step}: the accumulator box {shape} is larger than 4096 "
                                "elements: tile the loops outside first")
        mark = f"{REGISTER_MARK}{stmt}:{','.join(map(str, shape))}:{vector_bits()}"
        space = replace(self, marks=self.marks | {(stmt, self._row(stmt)[d].name, mark)},
                        steps=self.steps + (step,))
        return self._checked(space, step)

    def vectorize(self, stmt: str, loop: str) -> ScheduleSpace:
        """Mark ``loop`` (innermost) ``omp simd``; refused if it carries a dependence."""
        loops = self.loops(stmt)
        unrolled = {lp for (st, lp, m) in self.marks if st == stmt and m.startswith("unroll:")}
        inside = loops[loops.index(loop) + 1:] if loop in loops else ()
        if loop in loops and any(lp not in unrolled for lp in inside):
            raise ScheduleError(f"vectorize({stmt!r}, {loop!r}): only the innermost loop of "
                                f"{stmt} ({loops[-1]!r}; loops inside it must be unrolled) "
                                "can be vectorized; reorder first")
        return self._mark(stmt, loop, "vectorize")

    def unroll(self, stmt: str, loop: str, factor: int) -> ScheduleSpace:
        """Unroll ``loop`` by ``factor`` (a pragma the C compiler honours; the order of
        the instances does not change, so it is always legal)."""
        if not isinstance(factor, int) or not 2 <= factor <= 64:
            raise ScheduleError(f"unroll({stmt!r}, {loop!r}, {factor!r}): the factor must be "
                                "an integer from 2 to 64")
        return self._mark(stmt, loop, f"unroll:{factor}", Step("unroll", (stmt, loop, factor)))

    def unroll_and_jam(self, stmt: str, loop: str, factor: int) -> ScheduleSpace:
        """Split ``loop`` by ``factor`` and move its inner part innermost, unrolled: the
        iterations of ``loop`` are jammed into the innermost loop's body (register
        reuse across them). Checked like any reorder."""
        step = Step("unroll_and_jam", (stmt, loop, factor))
        loops = self.loops(stmt)
        if loop not in loops or loops[-1] == loop:
            raise ScheduleError(f"{step}: {loop!r} must be a loop of {stmt} outside its "
                                f"innermost loop (its loops: {', '.join(loops)})")
        s = replace(self, hints=False).split(stmt, loop, factor)
        inner = [lp for lp in s.loops(stmt) if lp not in (f"{loop}_tile",)]
        rest = inner[inner.index(loop) + 1:]
        try:
            s = s.reorder(stmt, *rest, loop).unroll(stmt, loop, factor)
        except ScheduleError as err:
            raise ScheduleError(f"{step} is illegal: {err}") from None
        return replace(s, steps=self.steps + (step,), hints=self.hints)

    # -- the automatic schedule as a space ---------------------------------------------

    def auto(self, options: Mapping[str, Any] | None = None) -> ScheduleSpace:
        """The schedule polyc's automatic passes choose, as primitive steps to read, edit
        and replay: ``scheduler(...)`` (the scheduler's fusion, loop order and skews, read
        back as loops), then the tiling, interchanges and marks of polyc's band
        optimisation as ``reorder``, ``tile``, ``parallel`` and ``vectorize`` steps (its
        cache-block sizes are the ``tile`` sizes). ``options`` are :class:`polyc.Options`
        fields that shape the schedule (``scheduler``, ``fusion``, ``tile``, ``threads``...).
        Register tiles (a code-generation promotion) are left out. Where a band's result is
        not such a sequence (a wavefront of tiles), the whole result is read back as one
        ``auto(...)`` step instead, which replays the passes. Steps name the loops of the
        sizes at hand, which the scheduler's choice depends on when code is specialised
        (the default): such a trace replays on other sizes with ``specialize=False``."""
        from ..options import Options
        from .optimize import optimize
        from .scheduler import compute_schedule
        opts = dict(options or {})
        step = Step("auto", (opts,))
        if self.steps or self.pending:
            raise ScheduleError(f"{step}: it replaces the whole schedule: apply it first "
                                "(op.schedule_space(auto=True))")
        allowed = {"scheduler", "fusion", "tile", "diamond", "parallel", "vectorize",
                   "threads"}
        if set(opts) - allowed:
            raise ScheduleError(f"{step}: options {sorted(set(opts) - allowed)} do not shape "
                                f"the schedule (those that do: {', '.join(sorted(allowed))})")
        chosen = Options(**opts).replace(target="c", schedule=None)
        plain = compute_schedule(self.kernel, self.deps, chosen)
        tree = optimize(plain, self.kernel, chosen, drop_inits=False)
        target = ScheduleSpace.from_schedule(self.kernel, tree, self.deps)
        try:
            start = self.scheduler({k: v for k, v in opts.items() if k in SCHEDULER_OPTIONS})
            derived = start._derive(target)
        except ScheduleError:
            derived = None
        if derived is not None:
            return derived
        return self._checked(replace(target, steps=(step,), hints=self.hints), step)

    def scheduler(self, options: Mapping[str, Any] | None = None) -> ScheduleSpace:
        """The loop nests polyc's scheduler chooses (``options``: ``scheduler``,
        ``fusion``, ``diamond``): fusion, loop order and skews, before any tiling, read
        back as loops (``c<d>`` names a combination of iterators). The first step of a
        trace."""
        from ..options import Options
        from .scheduler import compute_schedule
        opts = dict(options or {})
        step = Step("scheduler", (opts,))
        if self.steps or self.pending:
            raise ScheduleError(f"{step}: it replaces the whole schedule: apply it first")
        if set(opts) - SCHEDULER_OPTIONS:
            raise ScheduleError(f"{step}: options {sorted(set(opts) - SCHEDULER_OPTIONS)} are "
                                f"not the scheduler's ({', '.join(sorted(SCHEDULER_OPTIONS))})")
        chosen = Options(**opts).replace(target="c", schedule=None)
        space = ScheduleSpace.from_schedule(self.kernel, compute_schedule(
            self.kernel, self.deps, chosen), self.deps)
        return self._checked(replace(space, steps=(step,), hints=self.hints), step)

    def _derive(self, target: ScheduleSpace) -> ScheduleSpace | None:
        """``self`` (untiled loop nests) turned into ``target`` (the same nests tiled,
        interchanged and marked) by primitive steps, or None when ``target`` is not such
        an image (a wavefront's skewed tile loops)."""
        space = replace(self, hints=False)
        # the statement with the most loops first: its nest-wide steps may do the others'
        for stmt in sorted(self.statements, key=lambda n: -sum(
                1 for d in self._row(n) if d.loop and not d.expr.strip().isdigit())):
            want = target._row(stmt)
            have = space._row(stmt)
            if _aligned(self.kernel, stmt, have, want):
                continue
            if [d.expr for d in have if not d.loop] != [d.expr for d in want if not d.loop]:
                return None
            loops = [d for d in have if d.loop and d.name]
            goal = [d for d in want if d.loop and d.name]
            exprs = {d.name: d.expr for d in loops}
            points, tiles = [], []
            for d in goal:
                match = _same_loop(self.kernel, stmt, d.expr, exprs)
                if match is None:
                    return None
                name, size = match
                (tiles if size else points).append((name, size))
            if sorted(n for n, _ in points) != sorted(exprs) or \
                    len(set(tiles)) != len(tiles):
                return None
            order = [n for n, _ in points]
            if order != [d.name for d in loops]:
                space = space.reorder(stmt, *order)
            sizes: dict[str, list[int]] = {}
            for n, t in tiles:
                sizes.setdefault(n, []).append(t)
            for n in sizes:  # outer tiles first: one tile step, then a split per level
                sizes[n].sort(reverse=True)
            made: dict[tuple[str, int], str] = {}
            tiled = [n for n in order if n in sizes]
            if tiled:
                space = space.tile(stmt, tuple(tiled), tuple(sizes[n][0] for n in tiled))
                row = space._row(stmt)
                first = space._position(stmt, tiled[0]) - len(tiled)
                for i, n in enumerate(tiled):
                    made[(n, sizes[n][0])] = row[first + i].name
                for n in tiled:
                    for t in sizes[n][1:]:
                        space = space.split(stmt, n, t)
                        made[(n, t)] = space._row(stmt)[space._position(stmt, n) - 1].name
            wanted = [made[(n, t)] if t else n for n, t in
                      (_same_loop(self.kernel, stmt, d.expr, exprs) for d in goal)]
            if wanted != list(space.loops(stmt)):
                space = space.reorder(stmt, *wanted)
        # the marks, by position: the derived rows align with the target's
        for stmt, loop, mark in sorted(target.marks):
            pos = target._position(stmt, loop)
            name = space._row(stmt)[pos].name
            if (stmt, name, mark) in space.marks:
                continue
            if mark in MARKS:
                space = getattr(space, mark)(stmt, name)
            elif mark.startswith("unroll:"):
                space = space.unroll(stmt, name, int(mark.split(":")[1]))
            elif mark.startswith(REGISTER_MARK):
                space = space.registers(stmt, name)
            else:
                space = space._mark(stmt, name, mark)
        if not all(_aligned(self.kernel, n, space._row(n), target._row(n))
                   for n in self.statements):
            return None
        return replace(space, hints=self.hints)

    @classmethod
    def from_schedule(cls, kernel: Kernel, schedule: isl.Schedule,
                      deps: Dependences | None = None) -> ScheduleSpace:
        """The space of an isl schedule tree of ``kernel`` (bands, sequences, filters and
        the parallel / simd / unroll marks; other marks are dropped). Refused when a loop
        of a statement is piecewise or a statement is split between branches."""
        rows: dict[str, list[Dim]] = {}
        marks: set[tuple[str, str, str]] = set()
        names = [s.name for s in kernel.statements]

        def stmts_of(uset: isl.UnionSet) -> list[str]:
            return [n for n in names if not uset.intersect(
                isl.UnionSet.from_set(kernel.statement(n).domain)).is_empty()]

        def visit(node: isl.ScheduleNode, active: list[str], prefix: dict[str, list[Dim]],
                  pending: list[str]) -> None:
            kind = node.get_type()
            if kind == isl.schedule_node_type.leaf:
                for s in active:
                    if s in rows:
                        raise ScheduleError(f"{s} runs in two branches of the schedule: it "
                                            "cannot be read as one row of dimensions")
                    rows[s] = prefix[s]
                return
            if kind in (isl.schedule_node_type.domain, isl.schedule_node_type.context):
                visit(node.child(0), active, prefix, pending)
            elif kind == isl.schedule_node_type.filter:
                mine = [s for s in active if s in stmts_of(node.filter_get_filter())]
                visit(node.child(0), mine, prefix, pending)
            elif kind in (isl.schedule_node_type.sequence, isl.schedule_node_type.set):
                for i in range(node.n_children()):
                    child = node.child(i)
                    mine = [s for s in active if s in stmts_of(child.filter_get_filter())]
                    visit(child.child(0), mine,
                          {s: prefix[s] + [Dim("", str(i), False)] for s in mine}, pending)
            elif kind == isl.schedule_node_type.mark:
                visit(node.child(0), active, prefix, pending + [node.mark_get_id().get_name()])
            elif kind == isl.schedule_node_type.band:
                n = node.band_n_member()
                umap = node.band_get_partial_schedule_union_map()
                grown = {}
                for s in active:
                    part = umap.intersect_domain(isl.UnionSet.from_set(
                        kernel.statement(s).domain))
                    texts = _affine_texts(part, s, n) if n else []
                    if texts is None:
                        raise ScheduleError(f"a loop of {s} in the schedule is piecewise "
                                            f"({part}): not one affine expression")
                    row = list(prefix[s])
                    taken = {d.name for d in row if d.loop}
                    for k, text in enumerate(map(_tidy, texts)):
                        outer = [d.expr for d in row if d.loop]
                        row.append(Dim(_fresh(_loop_name(text, kernel.statement(s).iterators,
                                                         len(row)), taken), text))
                        if k == 0:
                            for m in pending:
                                kind_ = _IMPORTED_MARKS.get(m.partition("@")[0])
                                if kind_ is None and m.startswith("unroll:"):
                                    kind_ = m
                                if kind_ is None and m.startswith(REGISTER_MARK):
                                    kind_ = ":".join(m.split(":")[:4])  # loads its start
                                if kind_ is not None:
                                    marks.add((s, row[-1].name, kind_))
                        if node.band_member_get_ast_loop_type(k) == isl.ast_loop_type.unroll:
                            n_ = _extent_within(kernel, s, outer, text)
                            if n_ is not None and 2 <= n_ <= 64:
                                marks.add((s, row[-1].name, f"unroll:{n_}"))
                    grown[s] = row
                visit(node.child(0), active, grown, [])
            else:
                raise ScheduleError(f"a {kind} node of the schedule tree has no form in a "
                                    "schedule space")

        visit(schedule.get_root(), names, {s: [] for s in names}, [])
        missing = [s for s in names if s not in rows]
        dims = tuple((s, tuple(rows[s])) for s in names if s in rows)
        if missing:
            raise ScheduleError(f"the schedule runs no instance of {', '.join(missing)}")
        if any(not r or r[0].loop for _, r in dims):
            dims = tuple((s, (Dim("", "0", False),) + r) for s, r in dims)
        return cls(kernel, deps or compute_dependences(kernel), _pad(dims), frozenset(marks))

    # -- primitives that rewrite the kernel (polyc.rewrite) ------------------------------

    def _rewritten(self, kernel: Kernel, rows: Mapping[str, Sequence[Dim]], step: Step,
                   marks: Iterable[tuple[str, str, str]] = ()) -> ScheduleSpace:
        """The space of the rewritten ``kernel``: each statement keeps its row unless
        ``rows`` gives one; its dependences are computed again, and the result checked."""
        names = {s.name for s in kernel.statements}
        table = dict(self.dims)
        dims = tuple((s.name, tuple(rows[s.name]) if s.name in rows else table[s.name])
                     for s in kernel.statements)
        kept = frozenset(m for m in self.marks if m[0] in names) | frozenset(marks)
        space = replace(self, kernel=kernel, deps=compute_dependences(kernel),
                        dims=_pad(dims), marks=kept, steps=self.steps + (step,))
        return self._checked(space, step)

    def _around(self, stmt: str, kernel: Kernel, before: Sequence[str] = (),
                after: Sequence[str] = ()) -> dict[str, tuple[Dim, ...]]:
        """Rows placing the new statements ``before`` and ``after`` the top-level nest of
        ``stmt`` (each a nest of its own over its iterators); the others keep their
        order (top positions renumbered: ``p`` becomes ``3p + 1``)."""
        rows: dict[str, tuple[Dim, ...]] = {}
        for name, row in self.dims:
            if row[0].loop:
                raise ScheduleError(f"{name} has no sequence position at the top of its "
                                    "schedule")
            rows[name] = (Dim("", str(3 * int(row[0].expr) + 1), False),) + row[1:]
        mine = int(self._row(stmt)[0].expr)
        for names, at in ((before, 3 * mine), (after, 3 * mine + 2)):
            for name in names:
                its = kernel.statement(name).iterators
                rows[name] = (Dim("", str(at), False),) + tuple(Dim(i, i) for i in its)
        return rows

    def split_index_set(self, stmt: str, loop: str, at: int | str) -> ScheduleSpace:
        """Index-set splitting: the instances of ``stmt`` whose loop ``loop`` is at least
        ``at`` (an integer, or an affine expression of the sizes such as ``"floor(N/2)"``)
        become a new statement ``<stmt>_1`` sharing ``stmt``'s loops, after it; schedule
        the two pieces separately from then on (``distribute``, ``tile``...)."""
        from ..rewrite import split_statement
        step = Step("split_index_set", (stmt, loop, at))
        expr = self._row(stmt)[self._position(stmt, loop)].expr
        try:
            kernel, piece = split_statement(self.kernel, stmt, f"({expr}) >= ({at})",
                                            f"{loop} >= {at}")
        except ScheduleError as err:
            raise ScheduleError(f"{step}: {err}") from None
        return self._pieces(kernel, stmt, piece, step)

    def peel(self, stmt: str, loop: str, front: int = 1, back: int = 0) -> ScheduleSpace:
        """Peel the first ``front`` (or the last ``back``) iterations of loop ``loop`` of
        ``stmt`` -- for each iteration of the loops outside it -- into a new statement
        ``<stmt>_1`` (one of ``front`` and ``back`` is non-zero; peel twice for both)."""
        from ..rewrite import split_statement
        step = Step("peel", (stmt, loop, front, back))
        if (front > 0) == (back > 0) or min(front, back) < 0:
            raise ScheduleError(f"{step}: peel a positive number of iterations at the front "
                                "or at the back (peel twice for both)")
        row = self._row(stmt)
        d = self._position(stmt, loop)
        outer = _loop_map(self.kernel, stmt, ", ".join(x.expr for x in row[:d] if x.loop))
        value = _loop_map(self.kernel, stmt, row[d].expr)
        values = outer.reverse().apply_range(value)  # outer loops -> the loop's values
        bound = values.lexmin() if front else values.lexmax()
        n = front or back
        near = isl.Map(f"{{ [a] -> [b] : b < a + {n} }}" if front
                       else f"{{ [a] -> [b] : b > a - {n} }}")
        pairs = outer.apply_range(bound).range_product(value)
        peeled = pairs.intersect_range(near.wrap()).domain()
        try:
            which = f"the first {front}" if front else f"the last {back}"
            kernel, piece = split_statement(self.kernel, stmt, peeled,
                                            f"{which} of {loop}")
        except ScheduleError as err:
            raise ScheduleError(f"{step}: {err}") from None
        return self._pieces(kernel, stmt, piece, step)

    def _pieces(self, kernel: Kernel, stmt: str, piece: str, step: Step) -> ScheduleSpace:
        row = self._row(stmt)
        rows = {stmt: row + (Dim("", "0", False),), piece: row + (Dim("", "1", False),)}
        marks = {(piece, loop, m) for (s, loop, m) in self.marks if s == stmt}
        return self._rewritten(kernel, rows, step, marks)

    def compute_inline(self, stmt: str) -> ScheduleSpace:
        """Substitute ``stmt`` (a pointwise statement writing a temporary) into every
        statement that reads its array, and drop it (its values are recomputed where
        they are used: nothing is stored)."""
        from ..rewrite import inline_statement
        step = Step("compute_inline", (stmt,))
        self._row(stmt)
        return self._rewritten(inline_statement(self.kernel, stmt), {}, step)

    def layout(self, array: str, order: Sequence[int]) -> ScheduleSpace:
        """Store the temporary ``array`` with its dimensions permuted: dimension
        ``order[0]`` outermost (``layout("T", (1, 0))`` transposes it)."""
        from ..rewrite import relayout
        step = Step("layout", (array, tuple(order)))
        self._array(array, step)
        return self._rewritten(relayout(self.kernel, array, tuple(order)), {}, step)

    def cache_read(self, stmt: str, array: str, order: Sequence[int] | None = None
                   ) -> ScheduleSpace:
        """Copy the elements of ``array`` that ``stmt`` reads into a new temporary
        ``<array>_local`` (statement ``<stmt>_1``, a nest of its own just before ``stmt``'s)
        and let ``stmt`` read the copy; ``order`` stores the copy with its dimensions
        permuted (packing). Move the copy with ``compute_at``."""
        from ..rewrite import cache_read
        step = Step("cache_read", (stmt, array) + ((tuple(order),) if order is not None
                                                   else ()))
        self._row(stmt)
        self._array(array, step)
        kernel, copy, _ = cache_read(self.kernel, stmt, array,
                                     tuple(order) if order is not None else None)
        return self._rewritten(kernel, self._around(stmt, kernel, before=[copy]), step)

    def cache_write(self, stmt: str) -> ScheduleSpace:
        """Let ``stmt`` (and its initialisation just before it) write a new temporary
        ``<array>_local`` instead of its array, copied out by a new statement
        ``<stmt>_1`` in a nest of its own just after ``stmt``'s."""
        from ..rewrite import cache_write
        step = Step("cache_write", (stmt,))
        self._row(stmt)
        kernel, copy, _ = cache_write(self.kernel, stmt)
        return self._rewritten(kernel, self._around(stmt, kernel, after=[copy]), step)

    def rfactor(self, stmt: str, loop: str, factor: int) -> ScheduleSpace:
        """Factor the reduction ``stmt`` over its reduction loop ``loop`` into ``factor``
        partial results ``<array>_rf[..., loop mod factor]`` (initialised by ``<stmt>_1``
        before it, combined by ``<stmt>_2`` after it): iterations of ``loop`` closer than
        ``factor`` then update different elements, so its inner loop after
        ``split(stmt, loop, factor)`` vectorizes or runs in parallel."""
        from ..rewrite import rfactor
        step = Step("rfactor", (stmt, loop, factor))
        self._row(stmt)
        try:
            kernel, (init, final), _ = rfactor(self.kernel, stmt, loop, factor)
        except ScheduleError as err:
            raise ScheduleError(str(err)) from None
        return self._rewritten(kernel, self._around(stmt, kernel, [init], [final]), step)

    def _array(self, array: str, step: Step) -> None:
        if array not in {a.name for a in self.kernel.arrays}:
            raise ScheduleError(f"{step}: {self.kernel.name} has no array {array!r} (arrays: "
                                f"{', '.join(a.name for a in self.kernel.arrays)})")

    # -- placing one statement's instances in another's loops -----------------------------

    def compute_at(self, stmt: str, target: str, loop: str) -> ScheduleSpace:
        """Run each instance of ``stmt`` (a producer) inside ``target``'s loop ``loop``, at
        the first iteration of ``target``'s loops down to ``loop`` that reads what it
        writes, before ``target``'s body there. Nothing is recomputed; every instance of
        ``stmt`` must be read by ``target``."""
        return self._place(Step("compute_at", (stmt, target, loop)), first=True)

    def reverse_compute_at(self, stmt: str, target: str, loop: str) -> ScheduleSpace:
        """Run each instance of ``stmt`` (a consumer) inside ``target``'s loop ``loop``, at
        the last iteration of ``target``'s loops down to ``loop`` that writes what it
        reads, after ``target``'s body there."""
        return self._place(Step("reverse_compute_at", (stmt, target, loop)), first=False)

    def _place(self, step: Step, first: bool) -> ScheduleSpace:
        stmt, target, loop = step.args
        if stmt == target:
            raise ScheduleError(f"{step}: name two different statements")
        row, trow = self._row(stmt), self._row(target)
        d = self._position(target, loop)
        s, t = self.kernel.statement(stmt), self.kernel.statement(target)
        producer, consumer = (s, t) if first else (t, s)
        arrays = {producer.write.array} & {r.array for r in consumer.reads}
        if not arrays:
            raise ScheduleError(f"{step}: {consumer.name} reads nothing {producer.name} "
                                "writes")
        ctx = self.kernel.context
        (array,) = arrays
        reads = isl.UnionMap.empty(ctx.get_space())
        for r in consumer.reads:
            if r.array == array:
                reads = reads.union(isl.UnionMap.from_map(r.relation(consumer.domain)))
        writes = isl.UnionMap.from_map(producer.write.relation(producer.domain))
        # stmt's instance -> the target's instances it is tied to
        tied = (writes.apply_range(reads.reverse()) if first
                else reads.apply_range(writes.reverse())).intersect_params(ctx)
        loops = [x for x in trow[:d + 1] if x.loop]
        times = isl.UnionMap.from_map(
            _loop_map(self.kernel, target, ", ".join(x.expr for x in loops)))
        at = tied.apply_range(times)
        mine = isl.UnionSet.from_set(s.domain).intersect_params(ctx)
        if not mine.is_subset(at.domain()):
            left = mine.subtract(at.domain()).sample_point()
            why = "writes nothing it reads" if first else "reads nothing it writes"
            raise ScheduleError(f"{step}: {left} is tied to no instance of {target} (it "
                                f"{why})")
        chosen = at.lexmin() if first else at.lexmax()
        exprs = _affine_texts(chosen, stmt, len(loops)) if not mine.is_empty() else \
            ["0"] * len(loops)  # no instance for these sizes: any place will do
        if exprs is None:
            raise ScheduleError(f"{step}: the iteration of {target}'s loops where each "
                                f"instance of {stmt} belongs is not one affine function of "
                                f"its iterators ({chosen}); place it at an outer loop")
        own = [x for x in row if x.loop and x.name]
        taken = {x.name for x in trow[:d + 1] if x.loop}
        texts = iter(exprs)
        new_row = [Dim(x.name, next(texts)) if x.loop else x for x in trow[:d + 1]]
        new_row.append(Dim("", "0" if first else "1", False))
        new_row += [Dim(_fresh(x.name, taken), x.expr) for x in own]
        rows = {stmt: tuple(new_row)}
        for g in self._sharing(target, d):
            if g != stmt:
                grow = self._row(g)
                rows[g] = grow[:d + 1] + (Dim("", "1" if first else "0", False),) + grow[d + 1:]
        marks = {m for m in self.marks if m[0] != stmt}
        space = replace(self, marks=frozenset(marks))
        dims = tuple((name, rows.get(name, r)) for name, r in self.dims)
        return self._checked(replace(space, dims=_pad(dims), steps=self.steps + (step,)), step)

    def decompose_reduction(self, stmt: str, loop: str) -> ScheduleSpace:
        """Place the initialisation of the reduction ``stmt`` (the statement just before
        it that sets its array to the identity: TC's ``!`` forms) just above ``stmt``'s
        loop ``loop``: inside the loops outside ``loop``, before them (in a nest of its
        own just before ``stmt``'s when ``loop`` is outermost)."""
        step = Step("decompose_reduction", (stmt, loop))
        k = self._position(stmt, loop)
        s = self.kernel.statement(stmt)
        i = self.kernel.statements.index(s)
        init = self.kernel.statements[i - 1] if i else None
        if not s.is_reduction or init is None or init.kind != "init" \
                or init.write.array != s.write.array:
            raise ScheduleError(f"{step}: {stmt} is not a reduction initialised by the "
                                "statement just before it")
        outer = [x for x in self._row(stmt)[:k] if x.loop and x.name]
        if outer:
            placed = replace(self, hints=False).compute_at(init.name, stmt, outer[-1].name)
        else:
            rows = self._around(stmt, self.kernel, before=[init.name])
            dims = tuple((name, rows[name]) for name, _ in self.dims)
            placed = self._checked(replace(self, dims=_pad(dims)), step)
        return replace(placed, steps=self.steps + (step,), hints=self.hints)

    def _mark(self, stmt: str, loop: str, mark: str, step: Step | None = None
              ) -> ScheduleSpace:
        step = step or Step(mark, (stmt, loop))
        d = self._position(stmt, loop)
        mine = {m for (st, lp, m) in self.marks if st == stmt and lp == loop}
        pragma = {m for m in mine | {mark} if m in MARKS}
        if pragma and any(m.startswith("unroll:") for m in mine | {mark}):
            raise ScheduleError(f"{step}: {loop!r} of {stmt} would be both unrolled and "
                                f"{'/'.join(sorted(pragma))}: C compilers take one pragma per "
                                "loop (split it first: unroll one part)")
        group = self._sharing(stmt, d)
        names = {s: self._row(s)[d].name for s in group}
        marks = self.marks | {(s, n, mark) for s, n in names.items()}
        return self._checked(replace(self, marks=marks, steps=self.steps + (step,)), step)

    # -- text ------------------------------------------------------------------------

    def __str__(self) -> str:
        lines = [f"schedule of {self.kernel.name}"
                 + (f" ({len(self.steps)} steps)" if self.steps else " (source order)")]
        lines += self._sketch(list(self.statements), 0, "  ")
        lines.append("dimensions:")
        for name, row in self.dims:
            shown = [d.expr if not d.loop or not d.name else
                     (d.name if d.expr == d.name else f"{d.name}={d.expr}")
                     for d in row]
            lines.append(f"  {name}: [{', '.join(shown)}]")
        if self.steps:
            lines.append("steps:")
            lines += [f"  {s}" for s in self.steps]
        if self.pending:
            lines.append("steps with knobs (not applied yet):")
            lines += [f"  {s}" for s in self.pending]
        return "\n".join(lines)

    def _sketch(self, stmts: list[str], d: int, indent: str) -> list[str]:
        depth = len(self.dims[0][1])
        if d == depth:
            return [indent + self._stmt_text(s) for s in stmts]
        rows = {s: self._row(s)[d] for s in stmts}
        if all(not r.loop for r in rows.values()):
            out = []
            for v in sorted({int(r.expr) for r in rows.values()}):
                out += self._sketch([s for s in stmts if int(rows[s].expr) == v], d + 1, indent)
            return out
        if all(r.loop and not r.name for r in rows.values()):  # padding
            return self._sketch(stmts, d + 1, indent)
        names = sorted({r.name or "-" for r in rows.values()})
        first = rows[stmts[0]]
        what = names[0] if len(names) == 1 else "/".join(names)
        expr = f" = {first.expr}" if len(names) == 1 and first.expr != first.name else ""
        marks = sorted({m for (s, loop, m) in self.marks if s in rows and loop == rows[s].name})
        note = f"  # {', '.join(marks)}" if marks else ""
        return [f"{indent}for {what}{expr}:{note}"] + self._sketch(stmts, d + 1, indent + "  ")

    def _stmt_text(self, name: str) -> str:
        s = self.kernel.statement(name)
        w = E.show(E.Read(s.write.array, s.write.indices))
        op = "=" if s.op == "=" else f"{s.op}="
        piece = s.origin.rpartition("piece: ")[2] if "piece: " in s.origin else ""
        return f"{name}: {w} {op} {E.show(s.value)}" + (f"   ({piece})" if piece else "")

    def __repr__(self) -> str:
        return f"<ScheduleSpace of {self.kernel.name}: {len(self.steps)} steps>"

    # -- pictures (matplotlib) -------------------------------------------------------

    def plot(self, path: str | None = None, sizes: Mapping[str, int] | None = None,
             stmt: str | None = None, loops: tuple[str, str] | None = None) -> Any:
        """The iteration space of ``stmt`` over two loops, its dependences and tiles
        (:func:`polyc.plot.iteration_space`); ``sizes`` default to 8 (fixed sizes: theirs)."""
        from ..plot import iteration_space
        self._concrete("plot")
        return iteration_space(self, self._plot_sizes(sizes), stmt, loops, path)

    def plot_dependences(self, path: str | None = None) -> Any:
        """The dependence graph of the statements (:func:`polyc.plot.dependence_graph`)."""
        from ..plot import dependence_graph
        return dependence_graph(self, path)

    def _plot_sizes(self, sizes: Mapping[str, int] | None) -> dict[str, int]:
        out = {s: 8 for s in self.kernel.sizes}
        out.update(dict(self.kernel.fixed_sizes))
        out.update(dict(sizes or {}))
        return out

    def _repr_png_(self) -> bytes | None:
        """Inline in notebooks: the first statement's iteration space at small sizes."""
        try:
            from ..plot import png_bytes
            return png_bytes(self.plot())
        except Exception:  # noqa: BLE001 -- no picture (no matplotlib...): text only
            return None


#: the primitives a trace may name
PRIMITIVES = ("tile", "split", "reorder", "interchange", "skew", "shift", "reverse", "fuse",
              "distribute", "parallel", "vectorize", "unroll", "unroll_and_jam",
              "split_index_set", "peel", "compute_inline", "layout", "cache_read",
              "cache_write", "rfactor", "compute_at", "reverse_compute_at",
              "decompose_reduction", "auto", "scheduler", "bind", "registers")


def _affine_texts(chosen: isl.UnionMap, stmt: str, n: int) -> list[str] | None:
    """The ``n`` outputs of the single-valued ``{ stmt[x] -> [t...] }`` as affine isl
    expressions of ``x`` (None when one is piecewise)."""
    if chosen.n_map() != 1:
        return None
    m = isl.Map.from_union_map(chosen)
    if m.get_tuple_name(isl.dim_type.in_) != stmt:
        return None
    pma = isl.PwMultiAff.from_map(m)
    if pma.n_piece() != 1:
        return None
    out = []
    for i in range(n):
        pieces = pma.get_pw_aff(i).get_pieces()
        if len(pieces) != 1:
            return None
        text = str(pieces[0][1])  # [N] -> { S0[i, j] -> [(i + j)] }
        start, end = text.find("-> [(", text.find("{")), text.rfind(")]")
        if start < 0 or end < 0:
            return None
        out.append(text[start + 5:end])
    return out


#: the prefix of the mark of a register tile (see ScheduleSpace.registers and
#: polyc.schedule.register_tile)
REGISTER_MARK = "register:"


def _check_register_marks(tree: isl.Schedule, kernel: Kernel) -> None:
    """Raise ScheduleError when a register mark of ``tree`` is unsafe (its check)."""
    from .register_tile import check_mark
    why: list[str] = []

    def visit(node: isl.ScheduleNode) -> bool:
        if node.get_type() == isl.schedule_node_type.mark and \
                node.mark_get_id().get_name().startswith(REGISTER_MARK):
            reason = check_mark(node, kernel)
            if reason is not None:
                why.append(f"registers({node.mark_get_id().get_name().split(':')[1]!r}): "
                           f"{reason}")
        return True
    tree.get_root().foreach_descendant_top_down(visit)
    if why:
        raise ScheduleError(why[0])


#: the options of polyc's scheduler (ScheduleSpace.scheduler)
SCHEDULER_OPTIONS = {"scheduler", "fusion", "diamond"}


def _same_loop(kernel: Kernel, stmt: str, expr: str, loops: Mapping[str, str]
               ) -> tuple[str, int] | None:
    """``(loop, 0)`` when ``expr`` is one of ``loops`` (name -> expression) over
    ``stmt``'s instances, ``(loop, T)`` when it is ``T*floor(loop/T)`` (a tile loop of
    size ``T``), else None -- decided by isl."""
    def as_map(text: str) -> isl.Map:
        return _loop_map(kernel, stmt, text)
    try:
        mine = as_map(expr)
    except isl.Error:
        return None
    sizes = {int(x) for x in re.findall(r"(?:mod |/)(\d+)", expr)}
    # the loops whose expression the text mentions first: a single tile (N = T) is the
    # constant 0, equal to any loop's tile of that size
    words = set(re.findall(r"[A-Za-z_]\w*", expr))
    ranked = sorted(loops.items(), key=lambda kv: not (set(re.findall(r"[A-Za-z_]\w*",
                                                                         kv[1])) <= words))
    for name, text in ranked:
        if as_map(text).is_equal(mine):
            return name, 0
        for t in sorted(sizes):
            if t > 1 and as_map(f"{t}*floor(({text})/{t})").is_equal(mine):
                return name, t
    return None


def _extent_within(kernel: Kernel, stmt: str, outer: Sequence[str], text: str) -> int | None:
    """The most values the loop ``text`` of ``stmt`` takes in one iteration of the loops
    ``outer`` (their expressions), or None when unbounded."""
    m = _loop_map(kernel, stmt, ", ".join([*outer, text]))
    n = m.dim(isl.dim_type.out)
    pairs = isl.Map.from_range(m.range()).move_dims(isl.dim_type.in_, 0, isl.dim_type.out, 0,
                                                    n - 1)  # outer values -> the loop's
    if pairs.is_empty():
        return None
    lo, hi = pairs.lexmin_pw_multi_aff().get_pw_aff(0), pairs.lexmax_pw_multi_aff().get_pw_aff(0)
    extent = hi.sub(lo).max_val()
    return extent.to_python() + 1 if extent.is_int() else None


def _loop_map(kernel: Kernel, stmt: str, text: str) -> isl.Map:
    """``{ stmt[x] -> [text] }`` over ``stmt``'s instances (a loop's expression)."""
    s = kernel.statement(stmt)
    return isl.Map(f"{params_prefix(kernel.sizes)}{{ {stmt}[{', '.join(s.iterators)}] -> "
                   f"[{text}] }}").intersect_domain(s.domain).intersect_params(kernel.context)


def _aligned(kernel: Kernel, stmt: str, have: Sequence[Dim], want: Sequence[Dim]) -> bool:
    """Whether ``have`` runs ``stmt``'s instances as ``want`` does, dimension by dimension
    (a tile loop ``floor(e/T)`` standing for ``T*floor(e/T)``)."""
    if len(have) != len(want):
        return False

    def as_map(text: str) -> isl.Map:
        return _loop_map(kernel, stmt, text)
    for a, b in zip(have, want):
        if a.loop != b.loop or (not a.loop and a.expr != b.expr):
            return False
        if not a.loop:
            continue
        theirs = as_map(b.expr)
        if as_map(a.expr).is_equal(theirs):
            continue
        m = re.fullmatch(r"floor\(\((.*)\)/(\d+)\)", a.expr.replace(" ", ""))
        if m is None or not as_map(f"{m.group(2)}*({a.expr})").is_equal(theirs):
            return False
    return True


#: marks of an isl schedule tree read by ScheduleSpace.from_schedule, as its marks
_IMPORTED_MARKS = {"parallel": "parallel", "simd": "vectorize"}


def _tidy(text: str) -> str:
    """isl's print of a tile loop ``-31 + m + (-1 - m) mod 32`` as ``32*floor((m)/32)``
    (the same function)."""
    m = re.fullmatch(r"-(\d+) \+ (\w+) \+ \(-1 - \2\) mod (\d+)", text.strip())
    if m and int(m.group(1)) + 1 == int(m.group(3)):
        return f"{m.group(3)}*floor(({m.group(2)})/{m.group(3)})"
    return text


def _loop_name(text: str, iterators: Sequence[str], depth: int) -> str:
    """A loop's name from its expression: the iterator, ``<it>_tile`` for
    ``floor((it)/n)``, else ``c<depth>``."""
    bare = text.replace(" ", "")
    for it in iterators:
        if bare in (it, f"({it})"):
            return it
        tiles = (f"floor(({it})/", f"(floor(({it})/")
        if bare.startswith(tiles) or re.fullmatch(rf"\d+\*floor\(\({it}\)/\d+\)", bare):
            return f"{it}_tile"
    return f"c{depth}"


def _fresh(name: str, taken: set[str]) -> str:
    out, k = name, 2
    while out in taken:
        out, k = f"{name}{k}", k + 1
    taken.add(out)
    return out


def _split_loops(row: list[Dim], n: int) -> tuple[list[Dim], list[Dim]]:
    """The dimensions up to and including the ``n``-th named loop, and the rest."""
    count = 0
    for i, d in enumerate(row):
        if d.loop and d.name:
            count += 1
            if count == n:
                return row[:i + 1], row[i + 1:]
    return row, []


def _simplify(rows: dict[str, list[Dim]], group: list[str], d: int) -> None:
    """Drop the sequence positions below the top that order nothing (every statement
    sharing the loops above has the same value), in place: ``for t: for i: S`` is
    ``[0, t, i]``, not ``[0, t, 0, i, 0]``, so that its loops are consecutive."""
    while True:
        here = [rows[s][d] for s in group if d < len(rows[s])]
        if len(here) < len(group) or not here:
            return
        if all(not x.loop for x in here):
            values = sorted({int(x.expr) for x in here})
            if len(values) == 1 and d > 0:
                for s in group:
                    del rows[s][d]
                continue
            for v in values:
                _simplify(rows, [s for s in group if int(rows[s][d].expr) == v], d + 1)
            return
        if all(x.loop for x in here):
            d += 1
            continue
        return


def _pad(rows: tuple[tuple[str, tuple[Dim, ...]], ...]) -> tuple[tuple[str, tuple[Dim, ...]], ...]:
    """Every statement's dimensions to the same length (trailing ``0`` loops), with
    trailing padding common to all removed and positions that order nothing dropped."""
    table = {n: list(r) for n, r in rows}
    _simplify(table, [n for n, _ in rows], 0)
    rows = tuple((n, tuple(table[n])) for n, _ in rows)
    stripped = []
    for n, r in rows:
        r = list(r)
        while r and r[-1].loop and not r[-1].name:
            r.pop()
        stripped.append((n, r))
    depth = max((len(r) for _, r in stripped), default=0)
    return tuple((n, tuple(r + [Dim("", "0")] * (depth - len(r)))) for n, r in stripped)


class Knob:
    """A choice among ``values`` for a primitive's argument (``polyc.knob([16, 32, 64])``):
    a space whose steps use knobs records them unapplied; :func:`polyc.search` tries
    the combinations, :meth:`ScheduleSpace.with_values` fixes them."""
    _count = itertools.count()

    def __init__(self, values: Iterable[Any], name: str | None = None):
        self.values = tuple(values)
        if not self.values:
            raise ScheduleError("a knob needs at least one value")
        self.name = name or f"knob{next(Knob._count)}"

    def __repr__(self) -> str:
        return f"knob({list(self.values)!r}, name={self.name!r})"

    __str__ = __repr__


def knob(values: Iterable[Any], name: str | None = None) -> Knob:
    """A knob over ``values`` (see :class:`Knob`)."""
    return Knob(values, name)


def _knobs_in(args: Any) -> list[Knob]:
    if isinstance(args, Knob):
        return [args]
    if isinstance(args, (tuple, list)):
        return [k for a in args for k in _knobs_in(a)]
    return []


def _substitute(args: Any, table: dict[int, Any]) -> Any:
    if isinstance(args, Knob):
        return table[id(args)]
    if isinstance(args, tuple):
        return tuple(_substitute(a, table) for a in args)
    if isinstance(args, list):
        return [_substitute(a, table) for a in args]
    return args


def _knobbable(name: str) -> None:
    """Wrap primitive ``name``: with a knob in its arguments, or steps with knobs already
    pending, it is recorded instead of applied."""
    method = getattr(ScheduleSpace, name)
    signature = inspect.signature(method)

    @functools.wraps(method)
    def primitive(self: ScheduleSpace, *args: Any, **kwargs: Any) -> ScheduleSpace:
        if kwargs:  # keyword arguments become positional (steps are positional)
            bound = signature.bind(self, *args, **kwargs)
            args = tuple(bound.args[1:])
        if self.pending or _knobs_in(args):
            return replace(self, pending=self.pending + (Step(name, tuple(args)),))
        return method(self, *args)

    setattr(ScheduleSpace, name, primitive)


for _name in PRIMITIVES:
    _knobbable(_name)
