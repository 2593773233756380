"""Inlining of pointwise temporaries: Kernel -> Kernel.

A chain of elementwise statements after a contraction (an ONNX Conv's bias, then the
residual Add, then Relu) is lowered one statement per op, each a full pass over a
feature map through a temporary::

    S2: Y(n,m,h,w) = Y(n,m,h,w) + B(m)
    S3: T(i0,i1,i2,i3) = R(0,i1,i2,i3) + Y(0,i1,i2,i3)
    S4: Z(i0,i1,i2,i3) = relu(T(0,i1,i2,i3))

This pass substitutes such a statement's value into its one reader and drops it, so the
chain is one pass that never stores its intermediates: ``S4: Z(..) = relu(R(..) + (Y(..)
+ B(i1)))``. A statement ``S`` writing array ``T`` is inlined into the statement ``R``
that reads it when:

* ``S`` is a plain assignment (no reduction) whose write indices are its iterators, in
  order, and ``T`` is a temporary of the kernel (its value is not seen outside) or ``R``
  overwrites every element of ``T`` that ``S`` wrote (an output's in-place chain
  ``Y = Y + B; Y = relu(Y)`` becomes ``Y = relu(Y + B)``);
* ``R`` is the only later statement that reads ``T``, no statement between them writes
  ``T``, every element ``R`` reads was written by ``S``, and ``R`` reads each element
  once (an injective access: inlining a convolution's input copy into the convolution
  would recompute it for every output channel) -- both checked with isl;
* nothing between ``S`` and ``R`` writes an array that ``S`` reads, and ``R`` writes
  no such array except ``T`` itself, element by element (``T(x) = f(T(x))``).

Then every value ``R`` reads from ``T`` is the value ``S`` stored (program order is the
kernel's semantics), so substituting is exact. A value whose type differs from ``T``'s
is cast to it, as the store did.
"""
from __future__ import annotations

from dataclasses import replace

from . import dtypes as D
from . import expr as E
from .ir import Kernel, Statement


def inline_pointwise(kernel: Kernel) -> Kernel:
    """``kernel`` with every inlinable statement inlined (see the module doc).

    A kernel whose statements share loops (``kernel.order``: a recurrence, where a
    statement reads what a later one wrote at an earlier step) is left as it is: the
    rules here reason about statements that run one after another. An order that gives
    each statement a loop nest of its own (an op that dropped its scaffold statements:
    Winograd's transforms) is no such kernel."""
    if _shares_loops(kernel):
        return kernel
    while True:
        found = _find(kernel)
        if found is None:
            return kernel
        kernel = _inline(kernel, *found)


def _find(kernel: Kernel) -> tuple[int, int] | None:
    temps = {a.name for a in kernel.temporaries}
    stmts = kernel.statements
    for i, s in enumerate(stmts):
        t = s.write.array
        if s.is_reduction or not _writes_own_point(s):
            continue
        readers = [j for j in range(i + 1, len(stmts)) if t in _read_arrays(stmts[j])]
        if len(readers) != 1:
            continue
        j = readers[0]
        between = stmts[i + 1:j]
        if any(b.write.array == t for b in between):
            continue
        sources = _read_arrays(s)
        if any(b.write.array in sources for b in between):
            continue
        r = stmts[j]
        if r.write.array in sources and not (r.write.array == t and _pointwise_in_place(r)):
            continue
        if not _covers(s, r, kernel):
            continue
        if t not in temps and not _overwrites(r, s, kernel):
            continue
        return i, j
    return None


def _shares_loops(kernel: Kernel) -> bool:
    """Whether two statements of ``kernel`` start at one position of its order (run in
    one outer loop)."""
    firsts = [beta[0] for _, beta in kernel.order]
    return len(set(firsts)) != len(firsts)


def _read_arrays(s: Statement) -> set[str]:
    return {a.array for a in s.reads}


def _writes_own_point(s: Statement) -> bool:
    """The write is ``T(i0, i1, ...)`` over the statement's iterators, in order."""
    idx = s.write.indices
    return len(idx) == len(s.iterators) and all(
        isinstance(x, E.Index) and x.name == it for x, it in zip(idx, s.iterators))


def _pointwise_in_place(r: Statement) -> bool:
    """Every read of the written array is the written element."""
    return all(tuple(x.indices) == tuple(r.write.indices)
               for x in E.reads(r.value) if x.array == r.write.array) and not r.is_reduction


def _covers(s: Statement, r: Statement, kernel: Kernel) -> bool:
    """Every element of ``T`` that ``r`` reads is one that ``s`` writes."""
    t = s.write.array
    written = s.write.relation(s.domain).range()
    for x in r.reads:
        if x.array != t:
            continue
        if not x.is_affine:
            return False
        rel = x.relation(r.domain).intersect_params(kernel.context)
        if not rel.is_injective():  # each element read once: nothing is recomputed
            return False
        read = rel.range()
        if not read.intersect_params(kernel.context).is_subset(
                written.intersect_params(kernel.context)):
            return False
    return True


def _overwrites(r: Statement, s: Statement, kernel: Kernel) -> bool:
    """``r`` writes every element ``s`` wrote (so ``s``'s stores are never seen: an
    output's in-place chain ``Y = Y + B; Y = relu(Y)`` becomes ``Y = relu(Y + B)``)."""
    if r.write.array != s.write.array or not r.write.is_affine:
        return False
    mine = s.write.relation(s.domain).range().intersect_params(kernel.context)
    theirs = r.write.relation(r.domain).range().intersect_params(kernel.context)
    return mine.is_subset(theirs)


def _inline(kernel: Kernel, i: int, j: int) -> Kernel:
    s, r = kernel.statements[i], kernel.statements[j]
    t = s.write.array
    dtypes = {a.name: a.dtype for a in kernel.arrays}
    value = s.value
    # the temporary's type is kept: a narrower one (float16 computed in float) rounds
    if E.infer_dtype(value, dtypes) != dtypes[t] or D.get(dtypes[t]).storage_only:
        value = E.Cast(dtypes[t], value)

    def substitute(x: E.Expr) -> E.Expr | None:
        if not (isinstance(x, E.Read) and x.array == t):
            return None
        env = dict(zip(s.iterators, x.indices))
        return E.map_expr(value, lambda y: env.get(y.name) if isinstance(y, E.Index) else None)

    merged = replace(r, value=E.map_expr(r.value, substitute),
                     origin=", ".join(filter(None, (s.origin, r.origin))))
    stmts = [merged if k == j else st for k, st in enumerate(kernel.statements) if k != i]
    used = {a for st in stmts for a in ({st.write.array} | _read_arrays(st))}
    arrays = tuple(a for a in kernel.arrays if a.role != "temp" or a.name in used)
    return Kernel(kernel.name, kernel.sizes, arrays, tuple(stmts), kernel.inputs,
                  kernel.outputs, kernel.context, kernel.fixed_sizes,
                  tuple(o for o in kernel.order if o[0] != s.name),
                  constants=kernel.constants)
