"""From an isl schedule tree to an isl AST.

The scheduler marks bands with ``"parallel"`` and ``"simd"`` mark nodes: the outermost
loop of the band below the mark is the one to annotate. In the AST a mark sits above
whatever isl generated for that band, and when the band's outermost dimension takes a
single value (a size fixed to 1, say) isl generates no loop for it: the first ``for``
below the mark is then an inner dimension, which may carry a dependence. To apply a mark
only to the loop it was meant for, :func:`build_ast` renames each mark ``"parallel"`` to
``"parallel@d"`` with ``d`` the schedule depth of its band, and names the AST iterators
after their schedule depth (``polyc_c3`` is schedule dimension 3); the emitter then
matches the two::

    mark "parallel"              mark "parallel@1"
      band [m, n] (depth 1)  ->    for (polyc_c1 ...)   gets the pragma
                                   (no for polyc_c1: nothing does)

The AST is built in ``kernel.context`` so that isl never emits a guard the size
constraints already imply.

A ``"register:<statement>:<box>:<vector bits>"`` mark (``polyc.schedule.register_tile``) asks for
the statement's write footprint below it to live in a local accumulator array. When isl
has generated such a mark, :func:`build_ast` computes, with the AST build at that point,
the first element and the extent of the footprint in each array dimension as isl AST
expressions of the loops around it (a register tile at an array edge is smaller), keeps
them in a :class:`Promotion` and annotates the AST mark node with the key of that
record (isl may generate one mark several times: full and partial tiles).
"""
from __future__ import annotations

import re
from dataclasses import dataclass

import islpy as isl

from polyc.errors import InternalError
from polyc.ir import Kernel
from polyc.marks import private_positions, register_mark

#: mark ids that carry a decision of the scheduler into the AST (``wavefront``: the loop
#: over a wavefront's fronts, whose parallel loop inside shares one parallel region;
#: ``cyclic``: a parallel loop whose iterations go to the threads in turn)
LOOP_MARKS = ("parallel", "simd", "reduce", "wavefront", "cyclic")
#: the prefix of an unroll mark, ``unroll:4`` (unroll by 4: a loop pragma)
UNROLL = "unroll:"
def is_loop_mark(name: str) -> bool:
    """``parallel``, ``simd``, ``reduce``, ``wavefront``, ``cyclic`` or ``unroll:<factor>``."""
    return name in LOOP_MARKS or (name.startswith(UNROLL) and name[len(UNROLL):].isdigit()) \
        or ("@" not in name and private_positions(name) is not None)  # (untagged, as the others)
_ITERATOR = re.compile(r"polyc_c([0-9]+)")


@dataclass(frozen=True)
class Promotion:
    """The accumulator of one generated ``register`` mark: the statement and array, the
    box of the accumulator (per array dimension), and per dimension the first element
    (``lo``) and the extent minus one (``span``) of the footprint, as isl AST expressions."""
    stmt: str
    array: str
    box: tuple[int, ...]
    lo: tuple[isl.AstExpr, ...]
    span: tuple[isl.AstExpr, ...]
    #: the vector width the scheduler sized the tile for (512: ask gcc for zmm registers)
    vector_bits: int = 0
    #: the initialisation statement whose constant the accumulator starts from ("": the
    #: accumulator is loaded from the array)
    init: str = ""
    #: the statement the copy-out runs on each accumulator element instead of storing it
    #: ("": stored); its iterators come from the element (``polyc.ir.element_iterators``)
    epilogue: str = ""
    #: the statement is a byte dot product (``polyc.ir.quad_dot``): its column loop may be
    #: written with ``vpdpbusd`` (:mod:`polyc.codegen.c_family`)
    quad: bool = False


def build_ast(kernel: Kernel, schedule: isl.Schedule,
              promotions: dict[str, Promotion] | None = None) -> isl.AstNode:
    """The isl AST of ``schedule``, with depth-named iterators and depth-tagged marks.

    ``register`` marks are annotated with a key of ``promotions`` (filled here)."""
    annotated, depth = annotate_marks(schedule)
    ctx = schedule.get_ctx()
    ids = isl.IdList.alloc(ctx, depth)
    for d in range(depth):
        ids = ids.add(isl.Id(f"polyc_c{d}", context=ctx))
    build = isl.AstBuild.from_context(kernel.context).set_iterators(ids)
    promotions = {} if promotions is None else promotions
    errors: list[BaseException] = []

    def after_mark(node: isl.AstNode, at: isl.AstBuild) -> isl.AstNode:
        # an exception raised inside an isl callback crashes the process: collect it
        try:
            m = register_mark(node.mark_get_id().get_name())
            if m is None:
                return node
            key = f"polyc_promotion{len(promotions)}"
            promotions[key] = _promotion(kernel, m.stmt, m.box, m.bits, m.init, m.epilogue,
                                         m.quad, at)
            return node.set_annotation(isl.Id(key, context=ctx))
        except BaseException as e:  # noqa: BLE001 -- re-raised after isl returns
            errors.append(e)
            return node

    build, handle = build.set_after_each_mark(after_mark)
    before = set(promotions)

    def built(tree: isl.Schedule) -> isl.AstNode:
        for key in set(promotions) - before:  # (an earlier, failed try's marks)
            del promotions[key]
        errors.clear()
        return build.node_from_schedule(tree)

    try:
        tree = built(annotated)
    except isl.Error:
        # isl may fail on a band's isolate option (a register tile's rows of a
        # triangle's partial tiles: syrk at 150 with 4 x 32 tiles of 16-lane vectors):
        # the option only asks for the full tiles' code apart, so drop it from one
        # band, then from all
        n = _isolating_bands(annotated)
        tree = None
        for drop in [{k} for k in range(n)] + ([set(range(n))] if n > 1 else []):
            try:
                tree = built(_without_isolation(annotated, drop))
                break
            except isl.Error:
                continue
        if tree is None:
            raise
    del handle
    if errors:
        raise InternalError(f"register promotion failed: {errors[0]}") from errors[0]
    return tree


def _isolate_options(node: isl.ScheduleNode) -> tuple[isl.UnionSet, bool]:
    """The band ``node``'s AST build options without its ``isolate`` option, and whether
    it had one."""
    opts = node.band_get_ast_build_options()
    kept = isl.UnionSet.empty(opts.get_space())
    found = False
    sets = opts.get_set_list()
    for s in (sets.get_at(i) for i in range(sets.n_set())):
        if s.get_tuple_name() == "isolate":
            found = True
        else:
            kept = kept.union(isl.UnionSet.from_set(s))
    return kept, found


def _isolating_bands(schedule: isl.Schedule) -> int:
    """How many bands of ``schedule`` have an ``isolate`` option."""
    count = [0]

    def visit(node: isl.ScheduleNode) -> isl.ScheduleNode:
        if node.get_type() == isl.schedule_node_type.band and _isolate_options(node)[1]:
            count[0] += 1
        return node

    schedule.map_schedule_node_bottom_up(visit)
    return count[0]


def _without_isolation(schedule: isl.Schedule, drop: set[int]) -> isl.Schedule:
    """``schedule`` with the ``isolate`` option of the bands numbered ``drop`` (in the
    bottom-up order of :func:`_isolating_bands`) removed."""
    if not drop:
        return schedule
    seen = [0]

    def visit(node: isl.ScheduleNode) -> isl.ScheduleNode:
        if node.get_type() != isl.schedule_node_type.band:
            return node
        kept, found = _isolate_options(node)
        if not found:
            return node
        seen[0] += 1
        return node.band_set_ast_build_options(kept) if seen[0] - 1 in drop else node

    return schedule.map_schedule_node_bottom_up(visit)


def _promotion(kernel: Kernel, stmt_name: str, box: tuple[int, ...], bits: int, init: str,
               epilogue: str, quad: bool, build: isl.AstBuild) -> Promotion:
    s = kernel.statement(stmt_name)
    sched = build.get_schedule().intersect_domain(isl.UnionSet.from_set(s.domain))
    write = isl.UnionMap.from_map(s.write.relation(s.domain))
    fp_u = sched.reverse().apply_range(write)
    if fp_u.n_map() != 1:
        raise InternalError(f"the footprint of {stmt_name} at its register mark is {fp_u}")
    fp = fp_u.get_map_list().get_at(0).reset_tuple_id(isl.dim_type.out)
    rank = fp.dim(isl.dim_type.out)
    if rank != len(box):
        raise InternalError(f"register mark of {stmt_name}: box {box} for a rank-{rank} write")
    los, spans = [], []
    for d in range(rank):
        proj = fp.project_out(isl.dim_type.out, d + 1, rank - d - 1).project_out(
            isl.dim_type.out, 0, d)
        lo = proj.lexmin_pw_multi_aff().get_pw_aff(0)
        hi = proj.lexmax_pw_multi_aff().get_pw_aff(0)
        los.append(build.expr_from_pw_aff(lo))
        spans.append(build.expr_from_pw_aff(hi.sub(lo)))
    return Promotion(stmt_name, s.write.array, box, tuple(los), tuple(spans), bits, init,
                     epilogue, quad)


def annotate_marks(schedule: isl.Schedule) -> tuple[isl.Schedule, int]:
    """``schedule`` with loop marks tagged by their band's depth, and the tree's total depth."""
    depth = [0]

    def visit(node: isl.ScheduleNode) -> isl.ScheduleNode:
        here = node.get_schedule_depth()
        kind = node.get_type()
        if kind == isl.schedule_node_type.band:
            here += node.band_n_member()
        depth[0] = max(depth[0], here)
        if kind == isl.schedule_node_type.mark:
            name = node.mark_get_id().get_name()
            if is_loop_mark(name):
                band_depth = node.child(0).get_schedule_depth()
                node = node.delete().insert_mark(isl.Id(f"{name}@{band_depth}"))
        return node

    return schedule.map_schedule_node_bottom_up(visit), depth[0]


def parse_mark(name: str) -> tuple[str, int] | None:
    """``("parallel", 1)`` for the mark ``"parallel@1"``; None for other marks."""
    kind, _, depth = name.partition("@")
    if is_loop_mark(kind) and depth.isdigit():
        return kind, int(depth)
    return None


def loop_depth(iterator: str) -> int:
    """The schedule depth of an AST loop iterator named by :func:`build_ast`."""
    m = _ITERATOR.fullmatch(iterator)
    if m is None:
        raise InternalError(f"isl AST iterator {iterator!r} was not named by polyc")
    return int(m.group(1))


def size_check(kernel: Kernel) -> isl.AstExpr | None:
    """An isl AST expression true exactly when the sizes lie in ``kernel.context``.

    None when every size value is allowed (the context is the universe).
    """
    context = kernel.context
    if context.is_params() and context.plain_is_universe():
        return None
    build = isl.AstBuild.from_context(isl.Set.universe(context.get_space()))
    e = build.expr_from_set(context)
    if e.get_type() == isl.ast_expr_type.int and e.get_val().to_python() != 0:
        return None
    return e
