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
from ..ir import Access, Kernel, quad_dot

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
