"""Band edits on the schedule tree: member permutation, tiling, splitting.

Each function takes a band node and returns the node at the same position of the
edited tree. Tiling a permutable band B of n members with sizes t::

    band B (i, j, k)              band (floor(i/ti)*ti, ...)   <- tile loops
      ...               ==>         band (i, j, k)             <- point loops
                                      ...

(point loops are not shifted to start at 0: the AST keeps the original iterators.)
"""
from __future__ import annotations

import islpy as isl

from .scheduler import isl_options


def member_count(node: isl.ScheduleNode) -> int:
    return node.band_n_member()


def coincident_flags(node: isl.ScheduleNode) -> list[bool]:
    return [bool(node.band_member_get_coincident(i)) for i in range(node.band_n_member())]


def permute_band(node: isl.ScheduleNode, order: list[int]) -> isl.ScheduleNode:
    """Reorder the members of a permutable band (``order[new] = old``); flags follow."""
    n = node.band_n_member()
    if order == list(range(n)):
        return node
    flags = coincident_flags(node)
    mupa = node.band_get_partial_schedule()
    upas = [mupa.get_union_pw_aff(old) for old in order]
    new = isl.MultiUnionPwAff.from_union_pw_aff_list(
        mupa.get_space(), _upa_list(upas))
    node = node.delete().insert_partial_schedule(new)
    node = node.band_set_permutable(1)
    for new_pos, old in enumerate(order):
        node = node.band_member_set_coincident(new_pos, int(flags[old]))
    return node


def multi_union_pw_aff(upas: list[isl.UnionPwAff]) -> isl.MultiUnionPwAff:
    """The members ``upas`` as one partial schedule (an unnamed set space of their
    number of dimensions), for a band inserted anew."""
    space = upas[0].get_space().set_from_params().add_dims(isl.dim_type.set, len(upas))
    return isl.MultiUnionPwAff.from_union_pw_aff_list(space, _upa_list(upas))


def _upa_list(upas: list[isl.UnionPwAff]) -> isl.UnionPwAffList:
    lst = isl.UnionPwAffList.alloc(upas[0].get_ctx(), len(upas))
    for u in upas:
        lst = lst.add(u)
    return lst


def tile_band(node: isl.ScheduleNode, sizes: list[int]) -> isl.ScheduleNode:
    """Tile a permutable band; returns the tile band (its child is the point band)."""
    space = node.band_get_space()
    mv = isl.MultiVal.zero(space)
    ctx = node.get_ctx()
    for i, t in enumerate(sizes):
        mv = mv.set_val(i, isl.Val.int_from_si(ctx, t))
    with isl_options(ctx, tile_shift_point_loops=0, tile_scale_tile_loops=1):
        return node.band_tile(mv)


def split_last(node: isl.ScheduleNode) -> isl.ScheduleNode:
    """Split off the last member of a band; returns the node of the one-member band."""
    n = node.band_n_member()
    if n == 1:
        return node
    return node.band_split(n - 1).child(0)


def wavefront(tiles: isl.ScheduleNode, sizes: list[int] | None = None) -> isl.ScheduleNode:
    """The tile band ``[T0, T1, ..., Tk]`` of a permutable band without a parallel member
    as ``[T0 + ... + Tk]`` above ``[T1, ..., Tk]``: every dependence has non-negative
    tile distances, so those with a zero sum stay inside one tile and the inner members
    are parallel at a fixed wavefront (all of them flagged coincident). Tiles of unequal
    ``sizes`` (the tile loops scaled by them) sum their tile numbers, ``Ti / size_i``
    (the scaled coordinates' sum is no wavefront: one tile a front). Returns the inner
    band; its parent is the wavefront band."""
    n = tiles.band_n_member()
    mupa = tiles.band_get_partial_schedule()
    parts = [mupa.get_union_pw_aff(i) for i in range(n)]
    counted = parts if sizes is None or len(set(sizes[:n])) == 1 else \
        [p.scale_down_val(isl.Val.int_from_si(p.get_ctx(), sizes[i]))
         for i, p in enumerate(parts)]
    front = counted[0]
    for p in counted[1:]:
        front = front.add(p)
    new = isl.MultiUnionPwAff.from_union_pw_aff_list(mupa.get_space(),
                                                     _upa_list([front, *parts[1:]]))
    node = tiles.delete().insert_partial_schedule(new).band_set_permutable(1)
    for i in range(1, n):
        node = node.band_member_set_coincident(i, 1)
    return node.band_split(1).child(0)


def box_volume(s: isl.Set) -> int | None:
    """The points of the bounding box of ``s`` (0 when empty; None when a bound is not a
    number): a statement's instances, cheaply (isl counts points one by one)."""
    if s.is_empty():
        return 0
    s = s.project_out(isl.dim_type.param, 0, s.dim(isl.dim_type.param))
    volume = 1
    for i in range(s.dim(isl.dim_type.set)):
        lo, hi = s.dim_min_val(i), s.dim_max_val(i)
        if not (lo.is_int() and hi.is_int()):
            return None
        volume *= max(0, hi.to_python() - lo.to_python() + 1)
    return volume


def isolate_option(full: isl.Set, d: int) -> isl.UnionSet:
    """The AST option that isolates the values ``full`` (the ``d`` dimensions of the
    schedule above a band, then the band's) of a band at depth ``d``: isl generates
    their code apart from the rest's, without the rest's bound checks."""
    opt = isl.Map.from_range(full).move_dims(isl.dim_type.in_, 0, isl.dim_type.out, 0, d)
    opt = opt.reset_tuple_id(isl.dim_type.in_).reset_tuple_id(isl.dim_type.out)
    return isl.UnionSet.from_set(opt.wrap().set_tuple_name("isolate"))


def full_blocks(have: isl.Map, blocks: list[tuple[int, int, int, int]]) -> isl.Set:
    """The values of ``have``'s domain (loops above some points, say) under which every
    block is full: ``have`` maps them to the points that exist; each block ``(out, at,
    scale, size)`` asks that output dimension ``out`` take every value from ``scale``
    times input dimension ``at`` on, ``size`` of them (``scale`` 1 for a tile loop that
    counts in points, ``u`` for one that counts steps of ``u``)."""
    ls = isl.LocalSpace.from_space(have.get_space())
    ctx = have.get_ctx()

    def val(x: int) -> isl.Val:
        return isl.Val.int_from_si(ctx, x)
    box = isl.Map.universe(have.get_space())
    for out, at, scale, size in blocks:
        box = box.add_constraint(isl.Constraint.alloc_inequality(ls)  # out >= scale * at
                                 .set_coefficient_val(isl.dim_type.out, out, val(1))
                                 .set_coefficient_val(isl.dim_type.in_, at, val(-scale)))
        box = box.add_constraint(isl.Constraint.alloc_inequality(ls)  # out < scale*at + size
                                 .set_coefficient_val(isl.dim_type.out, out, val(-1))
                                 .set_coefficient_val(isl.dim_type.in_, at, val(scale))
                                 .set_constant_val(val(size - 1)))
    partial = box.intersect_domain(have.domain()).subtract(have).domain()
    return have.domain().subtract(partial)
