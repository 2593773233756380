"""Hand-built kernels and simple schedules for the code generator's tests."""
from __future__ import annotations

import islpy as isl

from polyc import expr as E
from polyc import ir

WARNINGS_AS_ERRORS = ("-Wall", "-Wextra", "-Werror")

I, J, K_ = E.Index("i"), E.Index("j"), E.Index("k")
ZERO = E.Const(0)


def read(array: str, *indices: E.Expr) -> E.Read:
    return E.Read(array, tuple(indices))


def statement(name: str, sizes: tuple[str, ...], iterators: tuple[str, ...],
              extents: tuple[E.Expr, ...], write: tuple, op: str, value: E.Expr) -> ir.Statement:
    """``write OP= value`` over ``0 <= iterator < extent``; ``write`` is (array, indices)."""
    bounds = {it: (ZERO, ext) for it, ext in zip(iterators, extents)}
    domain = ir.make_domain(name, iterators, sizes, bounds)
    return ir.Statement(name, domain, iterators, ir.Access(write[0], tuple(write[1])), op, value)


def kernel(name: str, sizes: tuple[str, ...], arrays: list[ir.Array],
           statements: list[ir.Statement], context: str | None = None) -> ir.Kernel:
    inputs = tuple(a.name for a in arrays if a.role == "input")
    outputs = tuple(a.name for a in arrays if a.role == "output")
    ctx = isl.Set(context) if context else None
    return ir.Kernel(name, sizes, tuple(arrays), tuple(statements), inputs, outputs, ctx)


def matmul(names: tuple[str, str, str] = ("A", "B", "C"), dtype: str = "float32") -> ir.Kernel:
    """C[m,n] = 0; C[m,n] += A[m,k] * B[k,n]."""
    a, b, c = names
    sizes = ("M", "K", "N")
    M, K, N = (E.Size(s) for s in sizes)
    m, n, k = E.Index("m"), E.Index("n"), E.Index("k")
    arrays = [ir.Array(a, dtype, (M, K)), ir.Array(b, dtype, (K, N)),
              ir.Array(c, dtype, (M, N), "output")]
    init = statement("S0", sizes, ("m", "n"), (M, N), (c, (m, n)), "=", E.Const(0.0))
    upd = statement("S1", sizes, ("m", "n", "k"), (M, N, K), (c, (m, n)), "+",
                    E.Binary("*", read(a, m, k), read(b, k, n)))
    return kernel("matmul", sizes, arrays, [init, upd])


def fused_matmul_schedule(knl: ir.Kernel, mark: str | None = "parallel") -> isl.Schedule:
    """One band ``[m, n, (0|1), (0|k)]`` for init and update, with ``mark`` above it."""
    umap = isl.UnionMap("[M, K, N] -> { S0[m, n] -> [m, n, 0, 0]; S1[m, n, k] -> [m, n, 1, k] }")
    sched = isl.Schedule.from_domain(knl.domain()).insert_partial_schedule(
        isl.MultiUnionPwAff.from_union_map(umap))
    if mark:
        sched = sched.get_root().child(0).insert_mark(isl.Id(mark)).get_schedule()
    return sched


def sequence_schedule(knl: ir.Kernel, marks: dict[tuple[str, int], list[str]] | None = None
                      ) -> isl.Schedule:
    """Statements one after the other, each a nest of one-member bands (one per loop).

    ``marks[(statement, loop position)]`` lists the mark ids to put above that loop's band.
    """
    marks = marks or {}
    ctx = knl.context.get_ctx()
    params = ir.params_prefix(knl.sizes)
    filters = isl.UnionSetList.alloc(ctx, len(knl.statements))
    for s in knl.statements:
        filters = filters.add(isl.UnionSet.from_set(s.domain).intersect_params(knl.context))
    node = isl.Schedule.from_domain(knl.domain()).get_root().child(0).insert_sequence(filters)
    for pos, s in enumerate(knl.statements):
        node = node.child(pos).child(0)
        its = ", ".join(s.iterators)
        for j in reversed(range(len(s.iterators))):
            umap = isl.UnionMap(f"{params}{{ {s.name}[{its}] -> [{s.iterators[j]}] }}")
            node = node.insert_partial_schedule(isl.MultiUnionPwAff.from_union_map(umap))
            for m in marks.get((s.name, j), []):
                node = node.insert_mark(isl.Id(m))
        node = node.parent().parent()
    return node.get_schedule()


def fused_bands(schedule: isl.Schedule) -> list[int]:
    """The number of statements under each band that has a sequence below it (a loop
    that nests fused into it share: :mod:`polyc.schedule.fuse`, :mod:`polyc.schedule.align`)."""
    found = []

    def visit(node: isl.ScheduleNode) -> bool:
        if node.get_type() == isl.schedule_node_type.band and node.n_children() \
                and node.child(0).get_type() == isl.schedule_node_type.sequence:
            found.append(node.get_domain().n_set())
        return True

    schedule.get_root().foreach_descendant_top_down(visit)
    return found
