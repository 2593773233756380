"""Dead writes: statement instances whose value nothing observes are removed.

A TC definition updates part of an array by writing all of it and then overwriting a
region (``B(i,j) = B_in(i,j)`` then ``B(i,j) = ... where i in 1:N-1, j in 1:N-1``); an
ONNX ``Pad`` fills its output and then copies the input into the middle. Run as
written, the first statement writes every element and the second writes most of them
again, and a loop nest that fuses the two runs both under a guard inside its
innermost (vector) loop. Exact dataflow says which instances are overwritten before
anything reads them (:func:`polyc.deps.live_instances`): here, the copy's interior.
This pass restricts each plain assignment's domain to its live instances (the copy
keeps the border) and drops a statement none of whose instances is live.

Only plain assignments with affine writes shrink: a reduction's update reads what it
writes, and a write whose element is data-dependent may not hide the one before it.
The pass runs before scheduling (:func:`polyc.pipeline.prepare_kernel`), never under a
user's schedule, which names the statements' domains as written.
"""
from __future__ import annotations

from collections import Counter
from dataclasses import replace

from .deps import live_instances
from .ir import Kernel


def drop_dead_writes(kernel: Kernel) -> Kernel:
    """``kernel`` with every plain assignment restricted to its live instances, and
    every statement without instances dropped."""
    kernel = _drop_empty(kernel)
    writers = Counter(s.write.array for s in kernel.statements)
    # an instance dies when a later write hides it (a second writer of its array), or
    # when nothing reads its array at all; both are rare, so test before asking isl
    read = {r.array for s in kernel.statements for r in s.reads}
    candidates = [s for s in kernel.statements if s.op == "=" and s.write.is_affine
                  and (writers[s.write.array] > 1
                       or (s.write.array not in read and s.write.array not in kernel.outputs))]
    if not candidates:
        return kernel
    live = live_instances(kernel)
    domains, dropped = {}, set()
    for s in candidates:
        mine = s.domain.intersect(live.extract_set(s.domain.get_space())).coalesce()
        if mine.is_empty():
            dropped.add(s.name)
        elif not mine.is_equal(s.domain.intersect_params(kernel.context)):
            domains[s.name] = mine
    if len(dropped) == len(kernel.statements):
        # nothing is live: the outputs have no elements at these sizes (fuzz seed 3855:
        # ``O1(i, j)`` over ``j in 0:N-1`` at N = 1). The statements stay as they are (they
        # write nothing, or nothing anyone reads) rather than leave a kernel of none
        return kernel
    if not domains and not dropped:
        return kernel
    statements = tuple(replace(s, domain=domains[s.name]) if s.name in domains else s
                       for s in kernel.statements)
    return _without(replace(kernel, statements=statements), dropped)


def _drop_empty(kernel: Kernel) -> Kernel:
    """``kernel`` without its statements of no instance at its sizes (a recurrence's
    update that reads the step before, over one step: NonMaxSuppression of a single
    box), which run nothing and which a program-order schedule cannot place; all of
    them kept when all are empty (see above)."""
    empty = {s.name for s in kernel.statements
             if s.domain.intersect_params(kernel.context).is_empty()}
    if not empty or len(empty) == len(kernel.statements):
        return kernel
    return _without(kernel, empty)


def _without(kernel: Kernel, names: set[str]) -> Kernel:
    """``kernel`` without the statements ``names`` (nor their program-order positions)."""
    if not names:
        return kernel
    return replace(kernel, statements=tuple(s for s in kernel.statements if s.name not in names),
                   order=tuple((n, beta) for n, beta in kernel.order if n not in names))
