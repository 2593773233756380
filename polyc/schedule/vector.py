"""Which loop of a band to vectorize: the stride-1 score of band members.

A member is a good SIMD loop when, for every statement under the band, it is one
iterator ``it`` of the statement (unit coefficient) and the accesses move along
their last (contiguous) dimension with ``it`` — the write counts double. An access
that does not involve ``it`` is loop-invariant (a broadcast) and scores 0; an access
whose non-last index involves ``it`` is strided and scores negative, except the lanes
of a byte dot product (:func:`polyc.ir.quad_dot`: groups of four bytes, one per lane).
"""
from __future__ import annotations

import islpy as isl

from .. import expr as E
from ..ir import Access, Kernel, Statement, quad_dot

NOT_A_LOOP = -10**6


def member_iterators(node: isl.ScheduleNode, member: int) -> dict[str, str | None]:
    """For each statement under the band: the iterator this member equals, or None."""
    upa = node.band_get_partial_schedule().get_union_pw_aff(member)
    result: dict[str, str | None] = {}

    def per_pw(pa: isl.PwAff) -> None:
        name = pa.get_domain_space().get_tuple_name(isl.dim_type.set)
        found: list[str | None] = []

        def per_piece(_set: isl.Set, aff: isl.Aff) -> None:
            n = aff.dim(isl.dim_type.in_)
            coefs = [aff.get_coefficient_val(isl.dim_type.in_, i).to_python() for i in range(n)]
            nz = [i for i, c in enumerate(coefs) if c != 0]
            divs = aff.dim(isl.dim_type.div)
            if len(nz) == 1 and coefs[nz[0]] == 1 and divs == 0:
                found.append(aff.get_dim_name(isl.dim_type.in_, nz[0]))
            else:
                found.append(None)

        pa.foreach_piece(per_piece)
        result[name] = found[0] if len(set(found)) == 1 else None

    upa.foreach_pw_aff(per_pw)
    return result


def _access_score(access: Access, it: str) -> int:
    involved = [it in E.free_names(ix)[0] for ix in access.indices]
    if not any(involved):
        return 0
    if involved[-1] and not any(involved[:-1]):
        return 1
    return -1


def stride_score(kernel: Kernel, node: isl.ScheduleNode, member: int) -> int:
    """Sum of access scores over the statements under the band (see module doc)."""
    total = 0
    for stmt_name, it in member_iterators(node, member).items():
        if it is None:
            return NOT_A_LOOP
        s = kernel.statement(stmt_name)
        quad = quad_dot(s, kernel, it)  # its lanes' reads are contiguous vectors
        total += 2 * _access_score(s.write, it)
        total += sum(1 if quad and r.array == quad.lanes.array else _access_score(r, it)
                     for r in s.reads if r is not s.write)
    return total


def best_member(kernel: Kernel, node: isl.ScheduleNode, members) -> tuple[int | None, int]:
    """Of ``members`` of the band, the one with the best positive stride score (the
    last on ties) and its score; ``(None, 0)`` when none scores above 0."""
    best: tuple[int | None, int] = (None, 0)
    for i in members:
        score = stride_score(kernel, node, i)
        if score > 0 and score >= best[1]:
            best = (i, score)
    return best


# -- vector reductions ----------------------------------------------------------------------

#: the mark of a loop run as an OpenMP SIMD reduction (``polyc.codegen.c_family``)
REDUCE = "reduce"
#: the reductions whose terms may combine in any order: exactly, for these types (a float
#: max or min differs at most in the sign of a zero result, as numpy's own may)
_ORDER_FREE = ("max", "min")
_REDUCIBLE = ("float32", "float64", "int32", "int64")
#: the value a max / min reduction of floats must start from (:func:`reduction_member`)
_IDENTITY = {"max": float("-inf"), "min": float("inf")}


def reduction_member(node: isl.ScheduleNode, kernel: Kernel) -> int | None:
    """The member of a leaf band to run innermost as a vector reduction: for a band over
    one max or min reduction (``mx(n) max=! X(n,d)``) with one reduction member that
    walks the last index of every read mentioning it with unit stride, and no
    coincident member that does -- vectorized across ``n``, each lane loads from
    another row (a softmax's row maxima: a gather per vector). None otherwise."""
    names = member_iterators(node, 0)
    if len(names) != 1:
        return None
    (name,) = names
    s = kernel.statement(name)
    if reduce_problem(s, kernel) is not None:
        return None
    flags = [node.band_member_get_coincident(i) for i in range(node.band_n_member())]
    its = [member_iterators(node, i).get(name) for i in range(node.band_n_member())]
    reductions = [i for i, f in enumerate(flags) if not f]
    if len(reductions) != 1 or its[reductions[0]] is None:
        return None
    r = reductions[0]
    walked = [a for a in s.reads if a.array != s.write.array
              and any(its[r] in E.free_names(ix)[0] for ix in a.indices)]
    if not walked or not all(E.unit_last(a.indices, its[r]) for a in walked):
        return None
    if any(it is not None and all(_access_score(a, it) == 1 for a in walked)
           for i, it in enumerate(its) if flags[i]):
        return None
    return r


def reduce_problem(s: Statement, kernel: Kernel) -> str | None:
    """Why statement ``s`` may not run its reduction loop as a vector reduction, or None:
    it must be a max or min of a 32- or 64-bit number reading its accumulator only as
    the element it updates, and a float one must start from the identity (its only
    other writer an init statement of that constant: a NaN start would not survive)."""
    dtype = kernel.array(s.write.array).dtype
    if s.op not in _ORDER_FREE or dtype not in _REDUCIBLE or not s.write.is_affine:
        return f"{s.name} is no max or min reduction of a 32- or 64-bit number"
    if any(r.array == s.write.array and tuple(r.indices) != tuple(s.write.indices)
           for r in E.reads(s.value)):
        return f"{s.name} reads its accumulator at another element"
    if dtype.startswith("float"):
        writers = [t for t in kernel.statements if t.write.array == s.write.array
                   and t.name != s.name]
        if len(writers) != 1 or writers[0].kind != "init" or writers[0].op != "=" \
                or not isinstance(writers[0].value, E.Const) \
                or float(writers[0].value.value) != _IDENTITY[s.op]:
            return f"{s.name} does not start from {_IDENTITY[s.op]}"
    return None


def reduce_mark_problem(band: isl.ScheduleNode, kernel: Kernel) -> str | None:
    """Why the one-member ``band`` under a :data:`REDUCE` mark may not run as a vector
    reduction, or None: it runs one statement (:func:`reduce_problem`) whose write does
    not move with the loop. The dependences it carries are then the reduction's own,
    through the element it updates, whose terms combine in any order."""
    if band.band_n_member() != 1:
        return "the marked band has several members"
    names = member_iterators(band, 0)
    if len(names) != 1 or None in names.values():
        return "the marked loop runs several statements, or none as one iterator"
    ((name, it),) = names.items()
    s = kernel.statement(name)
    if any(it in E.free_names(ix)[0] for ix in s.write.indices):
        return f"{name} writes another element at each step"
    return reduce_problem(s, kernel)
