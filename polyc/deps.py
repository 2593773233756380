"""Exact dataflow dependences of a kernel, computed by isl.

Three kinds, each an isl union map from source instance to sink instance:

* flow (read after write), value-based: the sink reads what the source wrote;
* anti (write after read), memory-based;
* output (write after write).

Indirect reads (``X(I(i), j)``) read any element along their non-affine dimensions
(:func:`polyc.ir.access_relation`): the dependences are over-approximated, never missed.

Reductions: the updates of one element by a reduction statement (``C(m,n) +=
A(m,k) * B(k,n)``) commute. Their writes are therefore *may* sources (they never
hide an earlier write: the init statement of ``+=!`` reaches every update, not only
the first), and the dependences of a reduction statement on itself through its
target element are kept apart, in ``reduction``: they do not constrain the order
(``validity``), but a loop that carries them is not parallel (``coincidence``).
"""
from __future__ import annotations

from dataclasses import dataclass

import islpy as isl

from . import expr as E
from .ir import Kernel, Statement, array_box, params_prefix


@dataclass(frozen=True, eq=False)
class Dependences:
    """Dependences of one kernel (isl union maps over statement instances)."""
    flow: isl.UnionMap
    anti: isl.UnionMap
    output: isl.UnionMap
    #: self-dependences of reduction statements through their target (order-free)
    reduction: isl.UnionMap
    #: the original program order, instance -> time
    original_schedule: isl.UnionMap

    @property
    def validity(self) -> isl.UnionMap:
        """What every schedule must respect (instances in order)."""
        return self.flow.union(self.anti).union(self.output).coalesce()

    @property
    def coincidence(self) -> isl.UnionMap:
        """What a parallel (or SIMD) loop must not carry."""
        return self.validity.union(self.reduction).coalesce()

    @property
    def proximity(self) -> isl.UnionMap:
        """What the scheduler tries to keep close (all dependences)."""
        return self.coincidence

    def dump(self) -> str:
        return "\n".join(f"{k}: {v}" for k, v in (
            ("flow", self.flow), ("anti", self.anti), ("output", self.output),
            ("reduction", self.reduction), ("original", self.original_schedule)))


def program_order(kernel: Kernel) -> isl.UnionMap:
    """``{ S_s[i...] -> [s, i..., 0...] }``: statements in sequence, each in its loop
    order -- or, when statements share loops (``kernel.order``, C input), their position
    vectors ``[0, t, 1, i, 0]``."""
    betas = [tuple(str(x) for x in kernel.position(s.name)) for s in kernel.statements]
    depth = max((len(b) for b in betas), default=0)
    umap = isl.UnionMap.empty(kernel.context.get_space())
    for s, beta in zip(kernel.statements, betas):
        its = list(s.iterators)
        time = list(beta) + ["0"] * (depth - len(beta))
        m = isl.Map(f"{params_prefix(kernel.sizes)}{{ {s.name}[{', '.join(its)}] -> "
                    f"[{', '.join(time)}] }}")
        umap = umap.union(isl.UnionMap.from_map(m.intersect_domain(s.domain)))
    return umap


def _accesses(kernel: Kernel, stmts: list[Statement], kind: str) -> isl.UnionMap:
    umap = isl.UnionMap.empty(kernel.context.get_space())
    for s in stmts:
        accesses = [s.write] if kind == "write" else list(s.reads)
        for a in accesses:
            shape = kernel.array(a.array).shape
            umap = umap.union(isl.UnionMap.from_map(a.relation(s.domain, shape)))
    return umap.intersect_params(kernel.context)


def is_relaxable_reduction(s: Statement) -> bool:
    """A reduction whose value does not read its own target array (so updates commute)."""
    return s.is_reduction and all(r.array != s.write.array for r in E.reads(s.value))


def compute_dependences(kernel: Kernel) -> Dependences:
    """Flow, anti, output and reduction dependences of ``kernel`` (see the module doc)."""
    order = program_order(kernel)
    red = [s for s in kernel.statements if is_relaxable_reduction(s)]
    plain = [s for s in kernel.statements if not is_relaxable_reduction(s)]
    must_w = _accesses(kernel, plain, "write")
    may_w = _accesses(kernel, red, "write")
    writes = must_w.union(may_w)
    reads = _accesses(kernel, list(kernel.statements), "read")

    def flow_from(sink: isl.UnionMap, must: isl.UnionMap, may: isl.UnionMap) -> isl.UnionMap:
        found = budgeted_flow(kernel, sink, must, may, order)
        if found is not None:
            return found[0]
        # past the budget: every earlier write of the element (no write hides another)
        # -- more dependences than there are, never fewer
        earlier = order.lex_lt_union_map(order)
        return must.union(may).apply_range(sink.reverse()).intersect(earlier)

    flow = flow_from(reads, must_w, may_w)
    output = flow_from(writes, must_w, may_w)
    empty = isl.UnionMap.empty(writes.get_space())
    anti = flow_from(writes, empty, reads)

    reduction = isl.UnionMap.empty(flow.get_space())
    for s in red:
        mine = _self_pairs(s)
        for d in (flow, output, anti):
            reduction = reduction.union(d.intersect(mine))
        flow, output, anti = (d.subtract(mine) for d in (flow, output, anti))
    return Dependences(flow.coalesce(), anti.coalesce(), output.coalesce(),
                       reduction.coalesce(), order)


#: isl operations one dataflow analysis may take: isl's exact analysis can run for
#: minutes on a few statements with quasi-affine accesses (fuzz seed 52626: five
#: statements, ``X(i, j / 2)``, ``B(i / 2, i, j)``; more than 5 minutes); the callers
#: then fall back to over-approximations. Real operators take far less
FLOW_OPERATIONS = 3_000_000


def budgeted_flow(kernel: Kernel, sink: isl.UnionMap, must: isl.UnionMap, may: isl.UnionMap,
                  order: isl.UnionMap) -> tuple[isl.UnionMap, isl.UnionMap] | None:
    """isl's dataflow (``compute_flow``: its may dependences and the sinks with maybe
    no source); for a kernel whose accesses divide (:func:`_quasi_affine`, where the
    analysis can blow up) within :data:`FLOW_OPERATIONS`, None past it. That one runs
    in an isl context of its own, the budget set there (set on the kernel's context, it
    would count other threads' operations too); the maps go there and back as text,
    which costs as much as the analysis (ResNet-18's kernels: 3 s more in all, so the
    others stay where they are). A text isl cannot read back: the analysis on the
    kernel's own context, unbudgeted."""
    if not _quasi_affine(kernel):
        return _exact_flow(sink, must, may, order)
    private = isl.Context()
    private.set_max_operations(FLOW_OPERATIONS)
    ctx = kernel.context.get_ctx()
    try:
        dep, none = _exact_flow(*[isl.UnionMap.read_from_str(private, m.to_str())
                                  for m in (sink, must, may, order)])
    except isl.Error as e:
        if "maximal number of operations" in str(e):
            return None
        dep = none = None
    if dep is not None:
        try:
            return (isl.UnionMap.read_from_str(ctx, dep.to_str()),
                    isl.UnionMap.read_from_str(ctx, none.to_str()))
        except isl.Error:
            pass
    return _exact_flow(sink, must, may, order)


def _exact_flow(sink: isl.UnionMap, must: isl.UnionMap, may: isl.UnionMap,
                order: isl.UnionMap) -> tuple[isl.UnionMap, isl.UnionMap]:
    """isl's ``compute_flow``: its may dependences and the sinks with maybe no source."""
    flow = isl.UnionAccessInfo.from_sink(sink).set_must_source(must).set_may_source(may) \
        .set_schedule_map(order).compute_flow()
    return flow.get_may_dependence(), flow.get_may_no_source()


def _quasi_affine(kernel: Kernel) -> bool:
    """Some access of ``kernel`` has an index with ``//`` or ``%``."""
    return any(isinstance(x, E.Binary) and x.op in ("//", "%")
               for s in kernel.statements for a in (s.write, *s.reads)
               for ix in a.indices for x in E.walk(ix))


def live_instances(kernel: Kernel) -> isl.UnionSet:
    """The statement instances whose written value is used: read by a later instance
    (the last writer before a read, or a possible one), or the final value of an
    output. Every other instance writes a value that is overwritten, or never read,
    before anything observes it.

    The kernel's end is an extra sink: one instance per output element, after every
    statement, that reads it (sources: :func:`_flow`)."""
    order = program_order(kernel)
    depth = order.range().as_set().dim(isl.dim_type.set) if not order.is_empty() else 0
    ahead = isl.UnionMap.from_map(isl.Map(
        f"{{ [{', '.join(f't{i}' for i in range(depth))}] -> "
        f"[0{''.join(f', t{i}' for i in range(depth))}] }}"))
    order = order.apply_range(ahead)
    end_reads = isl.UnionMap.empty(kernel.context.get_space())
    for name in kernel.outputs:
        end = isl.Set.identity(array_box(kernel, name)).set_tuple_name(
            isl.dim_type.in_, f"polyc_end_{name}")
        end_reads = end_reads.union(isl.UnionMap.from_map(end))
        at_end = isl.Map.from_domain_and_range(end.domain(), isl.Set(
            f"{{ [1{', 0' * depth}] }}"))
        order = order.union(isl.UnionMap.from_map(at_end))
    sinks = _accesses(kernel, list(kernel.statements), "read").union(end_reads)
    found = _flow(kernel, sinks, order)
    if found is None:  # past the budget: every instance may be live
        return _all_instances(kernel)
    return found[0].domain()


def _all_instances(kernel: Kernel) -> isl.UnionSet:
    out = isl.UnionSet.empty(kernel.context.get_space())
    for s in kernel.statements:
        out = out.union(isl.UnionSet.from_set(s.domain))
    return out


def _flow(kernel: Kernel, sinks: isl.UnionMap, order: isl.UnionMap
          ) -> tuple[isl.UnionMap, isl.UnionMap] | None:
    """isl's dataflow from the kernel's writes to ``sinks`` (:func:`budgeted_flow`): a
    write hides what came before it (a must source) unless it is a commuting
    reduction's (see :func:`compute_dependences`) or its element is data-dependent."""
    may = [s for s in kernel.statements if is_relaxable_reduction(s) or not s.write.is_affine]
    must = [s for s in kernel.statements if s not in may]
    return budgeted_flow(kernel, sinks, _accesses(kernel, must, "write"),
                         _accesses(kernel, may, "write"), order)


def arrays_read_uninitialized(kernel: Kernel) -> set[str]:
    """The arrays some read of which may find no earlier write in the kernel: inputs,
    and temporaries read where nothing wrote them (zero-filled by codegen); past the
    dataflow's budget, every array read."""
    reads = _accesses(kernel, list(kernel.statements), "read")
    found = _flow(kernel, reads, program_order(kernel))
    if found is None:
        return {r.array for s in kernel.statements for r in s.reads}
    unread = found[1]
    maps = unread.get_map_list()
    return {maps.get_at(i).get_tuple_name(isl.dim_type.out) for i in range(maps.n_map())}


def _self_pairs(s: Statement) -> isl.UnionMap:
    """``{ S[i] -> S[j] }`` for all pairs of instances of ``s`` writing the same element."""
    w = s.write.relation(s.domain)
    return isl.UnionMap.from_map(w.apply_range(w.reverse()))
