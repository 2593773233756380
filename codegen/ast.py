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
"""
from __future__ import annotations

import re

import islpy as isl

from polyc.errors import InternalError
from polyc.ir import Kernel

#: mark ids that carry a decision of the scheduler into the AST
LOOP_MARKS = ("parallel", "simd")
_ITERATOR = re.compile(r"polyc_c([0-9]+)")


def build_ast(kernel: Kernel, schedule: isl.Schedule) -> isl.AstNode:
    """The isl AST of ``schedule``, with depth-named iterators and depth-tagged marks."""
    annotated, depth = annotate_marks(schedule)
    ctx = schedule.get_ctx()
    ids = isl.IdList.alloc(ctx, depth)
    for d in range(depth):
        ids = ids.add(isl.Id(f"polyc_c{d}", context=ctx))
    build = isl.AstBuild.from_context(kernel.context).set_iterators(ids)
    return build.node_from_schedule(annotated)


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
            if name in LOOP_MARKS:
                band_depth = node.child(0).get_schedule_depth()
                node = node.delete().insert_mark(isl.Id(f"{name}@{band_depth}"))
        return node

    return schedule.map_schedule_node_bottom_up(visit), depth[0]


def parse_mark(name: str) -> tuple[str, int] | None:
    """``("parallel", 1)`` for the mark ``"parallel@1"``; None for other marks."""
    kind, _, depth = name.partition("@")
    if kind in LOOP_MARKS and depth.isdigit():
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
