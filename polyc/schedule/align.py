"""Fuse sibling loop nests along the loops their dependences keep aligned.

isl's scheduler leaves apart nests whose bands differ past their shared loops. The two
passes of a Winograd transform (:mod:`polyc.frontend.winograd`) are the case in point:
each 1-D pass is one nest per row of the transform matrix, ``W(b, i, ty, tx, c)`` over
``(i, ty, tx, c)`` and then ``V(a, b, ty, tx, c)`` over ``(b, ty, tx, c)``, twelve nests
in sequence, each streaming its whole array (1.8 MB for a 56x56x64 layer) through
memory before the next begins, and each below the work a parallel loop takes
(``optimize.TINY_WORK``), so that all ran on one thread. Every
dependence between them joins instances of one tile ``(ty, tx)`` and channel ``c``::

    sequence                            band (ty, tx)        <- permutable, parallel
      filter S2: band (i, ty, tx, c)      sequence
      ...                        ==>        filter S2: band (i, c)
      filter S8: band (b, ty, tx, c)        ...
      ...                                   filter S8: band (b, c)

so the tile's twelve nests run one after another on data that stays in the L1 cache,
and the threads share the tiles.

**Which nests.** The children of the top sequence whose statements are plain
assignments (no reduction and no initialisation: register tiles and their first-visit
initialisations keep their own nests) and whose band is permutable and the whole nest.
A child that is a band, a set or a sequence over such nests (isl sets independent
nests side by side, or runs them in one shared loop) counts as those nests, each under
the shared band's members and its own, where no dependence goes from a later of them to
an earlier one (distributing the shared loop then keeps every dependence) and where they
all join one fused component. Of each nest the coincident members may move out,
except its vector loop (the member of best stride-1 score, :mod:`.vector`), which
stays innermost in every nest.

**Which members.** Two members, of two nests a dependence joins, are aligned when every
such dependence has distance zero between them (``{ f_b(sink) - f_a(source) }`` within
``{0}``, for all sizes).
Nests joined by aligned members form a component; a component whose nests are
consecutive in the sequence fuses along its classes of aligned members (found along a
spanning tree of its dependences, then checked on every dependence between its nests),
when at least one class is left and a nest passes a value to another (a flow
dependence: what the fusion keeps in cache).

**Why it is legal.** The fused members are coincident within each nest and at
distance zero between nests, so the new band is permutable and coincident, and what
stays of each nest's band is permutable still; every dependence between nests stays
within one fused iteration, where the sequence keeps the program order.
:func:`polyc.check.check_schedule` verifies the result all the same, as for every
schedule.
"""
from __future__ import annotations

from dataclasses import dataclass

import islpy as isl

from ..deps import Dependences
from ..ir import Kernel
from ..options import Options
from . import tiling
from .vector import best_member

#: fuse at all (a switch for measurements)
FUSE_ALIGNED = True
#: nests of the top sequence past which the pass does not look (its pairwise
#: dependence tests grow with their square)
MAX_NESTS = 64


@dataclass(frozen=True)
class _Nest:
    """A loop nest of the top sequence, or one of those a child of it holds (``owner``:
    the child's position): its filter, the members of its band (None: not a candidate)
    and their coincidence, and the members that may move out."""
    filter: isl.UnionSet
    owner: int
    members: list[isl.UnionPwAff] | None = None
    coincident: tuple[bool, ...] = ()
    free: tuple[int, ...] = ()


def fuse_aligned(schedule: isl.Schedule, kernel: Kernel, deps: Dependences,
                 options: Options) -> isl.Schedule:
    """``schedule`` with its components of aligned nests fused (see the module doc)."""
    if not FUSE_ALIGNED or options.target != "c" or options.fusion == "min":
        return schedule
    top = schedule.get_root().child(0)
    if top.get_type() != isl.schedule_node_type.sequence or top.n_children() > MAX_NESTS:
        return schedule
    validity = deps.validity
    nests: list[_Nest] = []
    for i in range(top.n_children()):
        nests.extend(_nests(top.child(i), i, kernel, validity))
    if len(nests) > MAX_NESTS:
        return schedule
    joined: dict[tuple[int, int], isl.UnionMap] = {}
    for b, nb in enumerate(nests):
        if nb.members is None:
            continue
        into = validity.intersect_range(nb.filter)
        for a in range(b):
            if nests[a].members is not None:
                d = into.intersect_domain(nests[a].filter)
                if not d.is_empty():
                    joined[(a, b)] = d
    pairs = {ab: _aligned_pairs(nests[ab[0]], nests[ab[1]], d) for ab, d in joined.items()}
    groups: list[tuple[list[int], list[list[int]]]] = []
    for comp in _components(len(nests), [ab for ab, p in pairs.items() if p]):
        if len(comp) < 2 or comp != list(range(comp[0], comp[-1] + 1)):
            continue
        owners = {nests[k].owner for k in comp}
        if any(n.owner in owners and k not in comp for k, n in enumerate(nests)):
            continue  # a shared loop is distributed only when all of it fuses
        inside = {ab: p for ab, p in pairs.items() if ab[0] in comp and ab[1] in comp}
        classes = _classes(comp, nests, inside)
        if classes and _passes_values(comp, nests, deps.flow):
            groups.append((comp, classes))
    if not groups:
        return schedule
    return _rebuild(schedule, nests, groups)


def _nests(filt: isl.ScheduleNode, owner: int, kernel: Kernel,
           validity: isl.UnionMap) -> list[_Nest]:
    """The candidate nests of a child of the top sequence (see the module doc)."""
    f = filt.filter_get_filter()
    whole = [_Nest(f, owner)]
    band = filt.child(0)
    kinds = (isl.schedule_node_type.sequence, isl.schedule_node_type.set)
    if band.get_type() in kinds:  # nests of their own under one filter
        below, outer = band, []
    elif band.get_type() != isl.schedule_node_type.band:
        return whole
    else:
        below, outer = band.child(0), _band_members(band)
        if below.get_type() == isl.schedule_node_type.leaf:
            return [_candidate(f, owner, outer, tiling.coincident_flags(band),
                               band.band_get_permutable() or len(outer) == 1, kernel)]
    if below.get_type() not in kinds:
        return whole
    parts = []
    for k in range(below.n_children()):
        inner = below.child(k).child(0)
        if inner.get_type() != isl.schedule_node_type.band \
                or inner.child(0).get_type() != isl.schedule_node_type.leaf:
            return whole
        parts.append((below.child(k).filter_get_filter(), inner))
    for j, (fj, _) in enumerate(parts):  # no dependence from a later part to an earlier
        back = validity.intersect_domain(fj)
        if any(not back.intersect_range(fk).is_empty() for fk, _ in parts[:j]):
            return whole
    out = []
    for fk, inner in parts:
        members = [m.intersect_domain(fk) for m in outer] + _band_members(inner)
        own = validity.intersect_domain(fk).intersect_range(fk)
        flags = tuple(_coincident(m, own) for m in members)
        permutable = all(_nonnegative(m, own) for m in members)
        out.append(_candidate(fk, owner, members, flags, permutable, kernel))
    return out


def _band_members(band: isl.ScheduleNode) -> list[isl.UnionPwAff]:
    mupa = band.band_get_partial_schedule()
    return [mupa.get_union_pw_aff(m) for m in range(band.band_n_member())]


def _candidate(f: isl.UnionSet, owner: int, members: list[isl.UnionPwAff],
               coincident, permutable: bool, kernel: Kernel) -> _Nest:
    names: list[str] = []
    f.foreach_set(lambda s: names.append(s.get_tuple_name()))
    if not permutable or not all(coincident) or any(
            kernel.statement(n).is_reduction or kernel.statement(n).kind == "init"
            for n in names):  # (a loop carrying a dependence: C's `C[i][j] = C[i][j] +
        return _Nest(f, owner)  # A[i][k] * B[k][j]`, a sum in all but name)
    node = _band_node(f, members, coincident)
    # the vector loop, as optimize._innermost_member picks it (no reduction here)
    vec, _ = best_member(kernel, node, [m for m in range(len(members)) if coincident[m]])
    free = tuple(m for m in range(len(members)) if coincident[m] and m != vec)
    return _Nest(f, owner, members, tuple(coincident), free)


def _band_node(f: isl.UnionSet, members: list[isl.UnionPwAff],
               coincident) -> isl.ScheduleNode:
    """A permutable band over ``members`` on the domain ``f`` (a tree of its own)."""
    return _insert_band(isl.Schedule.from_domain(f).get_root().child(0), members, coincident)


def _insert_band(node: isl.ScheduleNode, members: list[isl.UnionPwAff],
                 coincident) -> isl.ScheduleNode:
    """A permutable band over ``members`` inserted at ``node``, with these coincidence
    flags; returns the band."""
    node = node.insert_partial_schedule(tiling.multi_union_pw_aff(members))
    node = node.band_set_permutable(1)
    for m, c in enumerate(coincident):
        node = node.band_member_set_coincident(m, int(c))
    return node


def _gaps(d: isl.UnionMap, fa: isl.UnionPwAff, fb: isl.UnionPwAff) -> isl.Set | None:
    """The distances ``fb(sink) - fa(source)`` over the dependences ``d`` (None: none)."""
    gaps = d.apply_domain(isl.UnionMap.from_union_pw_aff(fa)) \
        .apply_range(isl.UnionMap.from_union_pw_aff(fb)).deltas()
    return None if gaps.is_empty() else isl.Set.from_union_set(gaps)


def _zero(gap: isl.Set) -> isl.Set:
    return isl.Set.universe(gap.get_space()).fix_val(
        isl.dim_type.set, 0, isl.Val.zero(gap.get_ctx()))


def _coincident(f: isl.UnionPwAff, d: isl.UnionMap) -> bool:
    gap = _gaps(d, f, f)
    return gap is None or gap.is_subset(_zero(gap))


def _nonnegative(f: isl.UnionPwAff, d: isl.UnionMap) -> bool:
    gap = _gaps(d, f, f)
    return gap is None or gap.is_subset(
        isl.Set.universe(gap.get_space()).lower_bound_val(
            isl.dim_type.set, 0, isl.Val.zero(gap.get_ctx())))


def _aligned_pairs(a: _Nest, b: _Nest, d: isl.UnionMap) -> set[tuple[int, int]]:
    """The (member of ``a``, member of ``b``) pairs that every dependence ``d`` (``a`` ->
    ``b``) joins at distance zero."""
    out = set()
    for ma in a.free:
        for mb in b.free:
            gap = _gaps(d, a.members[ma], b.members[mb])
            if gap is not None and gap.is_subset(_zero(gap)):
                out.add((ma, mb))
    return out


def _components(n: int, edges: list[tuple[int, int]]) -> list[list[int]]:
    parent = list(range(n))

    def find(x: int) -> int:
        while parent[x] != x:
            parent[x] = parent[parent[x]]
            x = parent[x]
        return x

    for a, b in edges:
        parent[find(a)] = find(b)
    comps: dict[int, list[int]] = {}
    for i in range(n):
        comps.setdefault(find(i), []).append(i)
    return sorted(comps.values())


def _classes(comp: list[int], nests: list[_Nest],
             pairs: dict[tuple[int, int], set[tuple[int, int]]]) -> list[list[int]]:
    """The classes of aligned members of ``comp``'s nests, one member of each nest (in
    ``comp``'s order) per class, in the first nest's member order; [] when a dependence
    between two of them aligns no member."""
    if any(not p for p in pairs.values()):
        return []
    first = comp[0]
    classes: list[dict[int, int]] = [{first: m} for m in nests[first].free]
    seen, todo = {first}, [first]
    while todo:
        x = todo.pop(0)
        for (a, b), p in pairs.items():
            if x not in (a, b) or (b if x == a else a) in seen:
                continue
            y = b if x == a else a
            for cls in classes:
                if x not in cls:
                    continue
                mx = cls[x]
                used = {c[y] for c in classes if y in c}
                options = sorted(mb for ma, mb in p if ma == mx) if x == a else \
                    sorted(ma for ma, mb in p if mb == mx)
                options = [m for m in options if m not in used]
                if options:
                    cls[y] = options[0]
                else:
                    cls.pop(x)  # the class ends here: dropped below
            seen.add(y)
            todo.append(y)
    alive = [c for c in classes if len(c) == len(comp)]
    alive = [c for c in alive if all((c[a], c[b]) in p for (a, b), p in pairs.items())]
    return [[c[i] for i in comp] for c in alive]


def _passes_values(comp: list[int], nests: list[_Nest], flow: isl.UnionMap) -> bool:
    """Whether a nest of ``comp`` reads what another one wrote."""
    for k, a in enumerate(comp):
        src = flow.intersect_domain(nests[a].filter)
        for b in comp[k + 1:]:
            if not src.intersect_range(nests[b].filter).is_empty():
                return True
    return False


def _rebuild(schedule: isl.Schedule, nests: list[_Nest],
             groups: list[tuple[list[int], list[list[int]]]]) -> isl.Schedule:
    """The top sequence with each group's nests under one filter, rebuilt there as the
    fused band over a sequence of the nests' remaining bands; the other children as
    they were."""
    ctx = schedule.get_ctx()
    start = {comp[0]: (comp, classes) for comp, classes in groups}
    parts: list[tuple[isl.UnionSet, tuple[list[int], list[list[int]]] | None]] = []
    i = 0
    while i < len(nests):
        if i in start:
            comp, classes = start[i]
            u = nests[comp[0]].filter
            for k in comp[1:]:
                u = u.union(nests[k].filter)
            parts.append((u, (comp, classes)))
            i = comp[-1] + 1
        else:  # a whole child of the top sequence (its nests all stay apart)
            owner = nests[i].owner
            u = nests[i].filter
            while i + 1 < len(nests) and nests[i + 1].owner == owner:
                i += 1
                u = u.union(nests[i].filter)
            parts.append((u, None))
            i += 1
    filters = isl.UnionSetList.alloc(ctx, len(parts))
    for u, _ in parts:
        filters = filters.add(u)
    top = schedule.get_root().child(0).insert_sequence(filters)
    for pos, (_, group) in enumerate(parts):
        if group is None:
            continue
        comp, classes = group
        node = top.child(pos).child(0).cut()
        outer = []
        for cls in classes:
            f = None
            for k, m in zip(comp, cls):
                g = nests[k].members[m]
                f = g if f is None else f.union_add(g)
            outer.append(f)
        node = _insert_band(node, outer, [True] * len(outer))
        seq = isl.UnionSetList.alloc(ctx, len(comp))
        for k in comp:
            seq = seq.add(nests[k].filter)
        node = node.child(0).insert_sequence(seq)
        for j, (k, moved) in enumerate(zip(comp, zip(*classes))):
            nest = nests[k]
            rest = [m for m in range(len(nest.members)) if m not in moved]
            if rest:
                band = _insert_band(node.child(j).child(0), [nest.members[m] for m in rest],
                                    [nest.coincident[m] for m in rest])
                node = band.parent().parent()
        top = node.parent().parent().parent()
    return top.get_schedule()
