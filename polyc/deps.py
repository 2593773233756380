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
        info = isl.UnionAccessInfo.from_sink(sink).set_must_source(must).set_may_source(may)
        return info.set_schedule_map(order).compute_flow().get_may_dependence()

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
    flow = _flow(kernel, sinks, order).get_may_dependence()
    return flow.domain()


def _flow(kernel: Kernel, sinks: isl.UnionMap, order: isl.UnionMap) -> isl.UnionFlow:
    """isl's dataflow from the kernel's writes to ``sinks``: a write hides what came
    before it (a must source) unless it is a commuting reduction's (see
    :func:`compute_dependences`) or its element is data-dependent."""
    may = [s for s in kernel.statements if is_relaxable_reduction(s) or not s.write.is_affine]
    must = [s for s in kernel.statements if s not in may]
    info = isl.UnionAccessInfo.from_sink(sinks).set_must_source(
        _accesses(kernel, must, "write")).set_may_source(_accesses(kernel, may, "write"))
    return info.set_schedule_map(order).compute_flow()


def arrays_read_uninitialized(kernel: Kernel) -> set[str]:
    """The arrays some read of which may find no earlier write in the kernel: inputs,
    and temporaries read where nothing wrote them (zero-filled by codegen)."""
    reads = _accesses(kernel, list(kernel.statements), "read")
    unread = _flow(kernel, reads, program_order(kernel)).get_may_no_source()
    maps = unread.get_map_list()
    return {maps.get_at(i).get_tuple_name(isl.dim_type.out) for i in range(maps.n_map())}


def _self_pairs(s: Statement) -> isl.UnionMap:
    """``{ S[i] -> S[j] }`` for all pairs of instances of ``s`` writing the same element."""
    w = s.write.relation(s.domain)
    return isl.UnionMap.from_map(w.apply_range(w.reverse()))
