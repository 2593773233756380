"""A Pluto-style scheduler (``Options(scheduler="pluto")``), beside isl's.

Bondhugula et al.'s algorithm (PLDI 2008), written on isl:

* a schedule row of statement ``S`` is ``phi_S(i) = c_S . i + d_S`` with non-negative
  integer coefficients (``c`` at most :data:`MAX_COEFFICIENT`, ``d`` at most
  :data:`MAX_SHIFT`);
* rows are found one at a time, each the lexicographic minimum (isl's integer LP,
  ``lexmin``) of ``(u, w, c, d)`` under, for every dependence ``S -> T`` not satisfied
  by an earlier band, **validity** ``phi_T(t) - phi_S(s) >= 0`` and **bounding**
  ``phi_T(t) - phi_S(s) <= u . N + w`` over its polyhedron: the dependence distances of
  the row are bounded as tightly as possible (locality), and ``u = 0`` rows carry them
  a constant distance (tiles that communicate little). The universally quantified
  constraints are linearised with the affine form of Farkas' lemma, which isl computes
  (``coefficients()``: every affine form non-negative on a polyhedron);
* each statement that still needs a row gets one linearly independent of its earlier
  ones (Pluto's rule: non-negative against a basis of their orthogonal complement, the
  sum at least 1);
* the rows found while every dependence of the band stays valid form a **permutable
  band** (tileable); when no row exists, the band ends and the dependences it
  satisfies (distance at least 1) are dropped; with none left to drop, the statements
  are **cut** into the strongly connected components of the remaining dependences,
  ordered topologically (a sequence), which satisfies the dependences between them.

Fusion: ``fusion="max"`` cuts only when it must; ``"smart"`` cuts first between
components whose loop depths differ; ``"min"`` cuts every component first. The result
is an isl schedule tree whose bands are permutable and whose members are flagged
coincident when they carry no dependence: polyc's band optimisations (tiling, register
tiles, parallel and SIMD marks) apply to it as to isl's.
"""
from __future__ import annotations

from dataclasses import dataclass
from fractions import Fraction
from math import lcm

import islpy as isl

from ..deps import Dependences
from ..errors import ScheduleError
from ..ir import Kernel

#: largest iterator coefficient of a row, and largest constant shift
MAX_COEFFICIENT = 4
MAX_SHIFT = 16


@dataclass
class _Edge:
    src: str
    dst: str
    #: the dependence polyhedron, a wrapped set ``[S[s] -> T[t]]`` (sizes' context applied)
    poly: isl.Set
    #: ``coefficients()`` of ``poly``, flattened: ``[c_cst, c_params..., c_s..., c_t...]``
    farkas: list[tuple[bool, list[int], int]]


@dataclass
class _Row:
    """One schedule dimension of every statement: a loop row or a sequence position."""
    loop: bool
    #: statement -> (coefficients, constant) for a loop; statement -> position otherwise
    values: dict


def pluto_schedule(kernel: Kernel, deps: Dependences, fusion: str = "smart",
                   diamond: bool = False) -> isl.Schedule:
    """The schedule tree (see the module doc); ``diamond``: concurrent start for
    time-iterated stencils (:meth:`_Pluto._diamond`). :class:`ScheduleError` when no
    legal schedule within the coefficient bounds exists (polyc then uses isl's)."""
    return _Pluto(kernel, deps, fusion, diamond).run()


class _Pluto:
    def __init__(self, kernel: Kernel, deps: Dependences, fusion: str, diamond: bool = False):
        self.kernel, self.fusion, self.diamond = kernel, fusion, diamond
        self.stmts = [s.name for s in kernel.statements]
        self.dims = {s.name: len(s.iterators) for s in kernel.statements}
        self.params = list(kernel.sizes)
        validity = deps.validity.intersect_params(kernel.context)
        self.edges: list[_Edge] = []
        maps = validity.get_map_list()
        for i in range(maps.n_map()):
            m = maps.get_at(i)
            if m.is_empty():
                continue
            poly = m.wrap()
            self.edges.append(_Edge(m.get_tuple_name(isl.dim_type.in_),
                                    m.get_tuple_name(isl.dim_type.out), poly,
                                    _farkas(poly)))
        #: what a parallel loop must not carry: validity and the reductions' own order
        self.coincidence: list[_Edge] = []
        maps = deps.coincidence.intersect_params(kernel.context).get_map_list()
        for i in range(maps.n_map()):
            m = maps.get_at(i)
            if not m.is_empty():
                self.coincidence.append(_Edge(m.get_tuple_name(isl.dim_type.in_),
                                              m.get_tuple_name(isl.dim_type.out),
                                              m.wrap(), []))
        #: rows found so far (loops and sequence positions), outermost first
        self.rows: list[_Row] = []
        #: where each band starts (row indices of its first loop row)
        self.bands: list[tuple[int, int]] = []
        self.hyper: dict[str, list[list[int]]] = {s: [] for s in self.stmts}

    # -- the main loop -----------------------------------------------------------------

    def run(self) -> isl.Schedule:
        live = list(self.edges)
        self._initial_cuts(live)
        live = [e for e in live if not self._cut_apart(e)]
        band_start = len(self.rows)
        while any(len(self.hyper[s]) < self.dims[s] for s in self.stmts):
            row = self._solve(live)
            if row is not None:
                self.rows.append(_Row(True, row))
                for s, (c, _) in row.items():
                    if any(c) and len(self.hyper[s]) < self.dims[s] \
                            and _independent(self.hyper[s], c):
                        self.hyper[s].append(c)
                continue
            if len(self.rows) > band_start:  # end the band: drop what it satisfies
                if self.diamond:
                    self._diamond(live, band_start)
                self.bands.append((band_start, len(self.rows)))
                live = [e for e in live if not self._satisfied(e, band_start)]
                band_start = len(self.rows)
                continue
            if not self._cut(live):
                raise ScheduleError(f"{self.kernel.name}: the Pluto scheduler found no legal "
                                    "row within its coefficient bounds")
            live = [e for e in live if not self._cut_apart(e)]
            band_start = len(self.rows)
        if len(self.rows) > band_start:
            if self.diamond:
                self._diamond(live, band_start)
            self.bands.append((band_start, len(self.rows)))
            live = [e for e in live if not self._satisfied(e, band_start)]
        if live:  # instances that every row runs at the same time: order the statements
            if any(e.src == e.dst for e in live) or not self._cut(live):
                raise ScheduleError(f"{self.kernel.name}: the Pluto scheduler left "
                                    "dependences unordered")
        return self._tree()

    # -- the ILP -----------------------------------------------------------------------

    def _unknowns(self) -> list[str]:
        names = [f"u{k}" for k in range(len(self.params))] + ["w"]
        for s in self.stmts:  # the last iterator's coefficient first: lexmin prefers
            # rows along the outer iterators (the source's loop order)
            names += [f"c_{s}_{j}" for j in reversed(range(self.dims[s]))] + [f"d_{s}"]
        return names

    def _solve(self, live: list[_Edge], fixed: list[str] | None = None) -> dict | None:
        """The next row (lexmin), or None. ``fixed`` (the diamond search) gives the
        coefficients as equalities in an extra unknown ``lam``, which may make them
        negative; no independence constraint is added then."""
        conds: list[str] = []
        low = -MAX_COEFFICIENT if fixed else 0
        for s in self.stmts:
            cs = [f"c_{s}_{j}" for j in range(self.dims[s])]
            conds += [f"{low} <= {c} <= {MAX_COEFFICIENT}" for c in cs]
            conds.append(f"0 <= d_{s} <= {MAX_SHIFT}")
            if len(self.hyper[s]) < self.dims[s] and not fixed:
                conds += _independence(self.hyper[s], cs)
        conds += [f"u{k} >= 0" for k in range(len(self.params))] + ["w >= 0"]
        conds += ["1 <= lam <= 8"] + (fixed or [])
        for e in live:
            conds += self._edge_constraints(e)
        names = self._unknowns()
        names = names[:len(self.params) + 1] + ["lam"] + names[len(self.params) + 1:]
        text = f"{{ [{', '.join(names)}] : {' and '.join(conds)} }}"
        space = isl.Set(text)
        if space.is_empty():
            return None
        point = space.lexmin().sample_point()
        values = [point.get_coordinate_val(isl.dim_type.set, i).to_python()
                  for i in range(space.dim(isl.dim_type.set))]
        out, k = {}, len(self.params) + 2
        for s in self.stmts:
            n = self.dims[s]
            out[s] = (list(reversed(values[k:k + n])), values[k + n])
            k += n + 1
        return out

    def _edge_constraints(self, e: _Edge) -> list[str]:
        """Validity and bounding of ``e`` on the unknowns, through Farkas' lemma."""
        ns, nt = self.dims[e.src], self.dims[e.dst]
        np_ = len(self.params)
        cs = [f"c_{e.src}_{j}" for j in range(ns)]
        ct = [f"c_{e.dst}_{j}" for j in range(nt)]
        shift = f"(d_{e.dst} - d_{e.src})"
        validity = [shift] + ["0"] * np_ + [f"-{c}" for c in cs] + ct
        bounding = [f"(w - {shift})"] + [f"u{k}" for k in range(np_)] + cs + [f"-{c}" for c in ct]
        out = []
        for coords in (validity, bounding):
            for eq, coeffs, const in e.farkas:
                terms = [f"{a}*({x})" for a, x in zip(coeffs, coords) if a]
                expr = " + ".join(terms + [str(const)]) if terms else str(const)
                out.append(f"{expr} {'=' if eq else '>='} 0")
        return out

    # -- diamond tiling ---------------------------------------------------------------

    def _diamond(self, live: list[_Edge], start: int) -> None:
        """Concurrent start (Bandishti et al., SC'12): when the band's first row is the
        time loop ``f`` (every statement's first iterator) and the next row ``g`` skews
        space by time, replace them by ``g`` and its mirror ``h = lam * f - g`` (valid
        for every dependence of the band, ``lam`` as small as possible). ``f`` is then
        strictly inside the cone of ``g`` and ``h``: the tiles of a wavefront over
        ``(g, h)`` start together instead of in a pipeline (diamond tiles)."""
        band = self.rows[start:]
        if len(band) < 2 or not all(r.loop for r in band[:2]):
            return
        if any(not r.loop and len(set(r.values.values())) > 1 for r in self.rows[:start]):
            return  # statements cut apart: their rows are not one band's
        f, g = band[0], band[1]
        for s in self.stmts:
            c, _ = f.values[s]
            if self.dims[s] == 0 or c != [1] + [0] * (self.dims[s] - 1):
                return
            if not any(g.values[s][0][1:]):
                return  # g does not involve space
        fixed = []
        for s in self.stmts:
            gc = g.values[s][0]
            fixed.append(f"c_{s}_0 = lam - {gc[0]}")
            fixed += [f"c_{s}_{j} = {-gc[j]}" for j in range(1, self.dims[s])]
        mirror = self._solve(live, fixed)
        if mirror is None:
            return
        self.rows[start] = g
        self.rows[start + 1] = _Row(True, mirror)

    # -- satisfaction and cuts ---------------------------------------------------------

    def _distance_at_most_zero(self, e: _Edge, row: _Row) -> isl.Set:
        """The pairs of ``e`` with ``phi_T(t) - phi_S(s) <= 0`` at ``row``."""
        ns, nt = self.dims[e.src], self.dims[e.dst]
        s = [f"s{j}" for j in range(ns)]
        t = [f"t{j}" for j in range(nt)]
        if row.loop:
            (c1, d1), (c2, d2) = row.values[e.src], row.values[e.dst]
            diff = " + ".join([f"{a}*{x}" for a, x in zip(c2, t)]
                              + [f"-{a}*{x}" for a, x in zip(c1, s)] + [str(d2 - d1)])
        else:
            diff = str(row.values[e.dst] - row.values[e.src])
        prefix = f"[{', '.join(self.params)}] -> " if self.params else ""
        text = (f"{prefix}{{ [{e.src}[{', '.join(s)}] -> {e.dst}[{', '.join(t)}]] : "
                f"{diff} <= 0 }}")
        return isl.Set(text)

    def _satisfied(self, e: _Edge, start: int) -> bool:
        """Whether the rows from ``start`` on carry ``e`` (strictly positive distance at
        one of them, with zero before it is implied by validity)."""
        rest = e.poly
        for row in self.rows[start:]:
            rest = rest.intersect(self._distance_at_most_zero(e, row))
            if rest.is_empty():
                return True
        return False

    def _cut_apart(self, e: _Edge) -> bool:
        """Whether a sequence row already orders ``e``'s statements (source first)."""
        for row in self.rows:
            if not row.loop and row.values[e.src] != row.values[e.dst]:
                return True
        return False

    def _components(self, live: list[_Edge]) -> list[list[str]]:
        """Strongly connected components of the statements under ``live``, in a
        topological order (sources first; ties in source order)."""
        succ: dict[str, set[str]] = {s: set() for s in self.stmts}
        for e in live:
            if e.src != e.dst:
                succ[e.src].add(e.dst)
        reach = {s: _reach(s, succ) for s in self.stmts}
        comps: list[list[str]] = []
        seen: set[str] = set()
        for s in self.stmts:
            if s in seen:
                continue
            comp = [t for t in self.stmts if t in reach[s] and s in reach[t]] or [s]
            if s not in comp:
                comp = [s] + comp
            seen |= set(comp)
            comps.append(comp)
        order: list[list[str]] = []
        placed: set[str] = set()
        while comps:
            for c in comps:
                preds = {e.src for e in live if e.dst in c and e.src not in c}
                if preds <= placed:
                    order.append(c)
                    placed |= set(c)
                    comps.remove(c)
                    break
            else:  # a cycle between components cannot happen; keep source order
                order += comps
                break
        return order

    def _cut(self, live: list[_Edge]) -> bool:
        """A sequence row between the components of ``live`` (False: one component)."""
        comps = self._components(live)
        if len(comps) < 2:
            return False
        self._sequence(comps)
        return True

    def _sequence(self, groups: list[list[str]]) -> None:
        values = {s: k for k, g in enumerate(groups) for s in g}
        self.rows.append(_Row(False, values))

    def _initial_cuts(self, live: list[_Edge]) -> None:
        if self.fusion == "max" or len(self.stmts) < 2:
            return
        comps = self._components(live)
        if self.fusion == "min":
            groups = comps
        else:  # smart: keep neighbouring components of the same depth together
            groups = []
            for c in comps:
                depth = max(self.dims[s] for s in c)
                if groups and max(self.dims[s] for s in groups[-1]) == depth:
                    groups[-1] = groups[-1] + c
                else:
                    groups.append(c)
        if len(groups) > 1:
            self._sequence(groups)

    # -- the tree ----------------------------------------------------------------------

    def _tree(self) -> isl.Schedule:
        band_of = {}
        for b, (lo, hi) in enumerate(self.bands):
            for r in range(lo, hi):
                band_of[r] = b
        root = isl.Schedule.from_domain(self.kernel.domain()).get_root().child(0)
        node = self._build(root, list(self.stmts), 0, band_of)
        return node.get_schedule()

    def _build(self, node: isl.ScheduleNode, stmts: list[str], r: int,
               band_of: dict[int, int]) -> isl.ScheduleNode:
        if r == len(self.rows):
            return node
        row = self.rows[r]
        if not row.loop:
            values = sorted({row.values[s] for s in stmts})
            if len(values) == 1:
                return self._build(node, stmts, r + 1, band_of)
            groups = [[s for s in stmts if row.values[s] == v] for v in values]
            filters = isl.UnionSetList.alloc(node.get_ctx(), len(groups))
            for g in groups:
                filters = filters.add(self._domain(g))
            node = node.insert_sequence(filters)
            for i, g in enumerate(groups):
                node = self._build(node.child(i).child(0), g, r + 1, band_of).parent().parent()
            return node
        b = band_of.get(r)
        end = r + 1
        while end < len(self.rows) and self.rows[end].loop and band_of.get(end) == b:
            end += 1
        umaps = []
        for k in range(r, end):
            umap = isl.UnionMap.empty(self.kernel.context.get_space())
            for s in stmts:
                umap = umap.union(isl.UnionMap.from_map(self._row_map(s, self.rows[k])))
            umaps.append(umap)
        full = umaps[0]
        for u in umaps[1:]:
            full = full.flat_range_product(u)
        if full.is_empty():  # statements that run for no sizes of the context
            return self._build(node, stmts, end, band_of)
        node = node.insert_partial_schedule(isl.MultiUnionPwAff.from_union_map(full))
        node = node.band_set_permutable(1)
        for k in range(end - r):
            node = node.band_member_set_coincident(k, int(self._coincident(stmts, r, k + r)))
        return self._build(node.child(0), stmts, end, band_of).parent()

    def _row_map(self, s: str, row: _Row) -> isl.Map:
        st = self.kernel.statement(s)
        its = list(st.iterators)
        c, d = row.values[s]
        expr = " + ".join([f"{a}*{x}" for a, x in zip(c, its) if a] + [str(d)])
        prefix = f"[{', '.join(self.params)}] -> " if self.params else ""
        return isl.Map(f"{prefix}{{ {s}[{', '.join(its)}] -> [{expr}] }}") \
            .intersect_domain(st.domain)

    def _coincident(self, stmts: list[str], start: int, r: int) -> bool:
        """No dependence between ``stmts`` has a non-zero distance at row ``r`` among
        the pairs with zero distance at every row before the band (``start``). Not
        conditioned on the band's earlier members, as isl's flags: polyc's band passes
        may move a coincident member first (jacobi-2d's diamond band: ``2t + j`` is
        parallel once ``2t + i`` and ``2t - i`` are fixed, not alone)."""
        for e in self.coincidence:
            if e.src not in stmts or e.dst not in stmts:
                continue
            rest = e.poly
            for row in self.rows[:start]:
                rest = rest.intersect(self._distance_at_most_zero(e, row)) \
                    .intersect(self._distance_at_least_zero(e, row))
            if rest.is_empty():
                continue
            if not rest.intersect(self._distance_at_most_zero(e, self.rows[r])) \
                    .intersect(self._distance_at_least_zero(e, self.rows[r])).is_equal(rest):
                return False
        return True

    def _distance_at_least_zero(self, e: _Edge, row: _Row) -> isl.Set:
        """The pairs of ``e`` with ``phi_T(t) - phi_S(s) >= 0`` at ``row``."""
        neg = _Row(row.loop, {k: ([-a for a in v[0]], -v[1]) if row.loop else -v
                              for k, v in row.values.items()})
        return self._distance_at_most_zero(e, neg)

    def _domain(self, stmts: list[str]) -> isl.UnionSet:
        out = isl.UnionSet.empty(self.kernel.context.get_space())
        for s in stmts:
            out = out.union(isl.UnionSet.from_set(self.kernel.statement(s).domain))
        return out.intersect_params(self.kernel.context)


def _farkas(poly: isl.Set) -> list[tuple[bool, list[int], int]]:
    """The constraints of the (flattened) set of affine forms non-negative on ``poly``:
    ``(equality, coefficients over [c_cst, c_params..., c_vars...], constant)``."""
    pieces = poly.get_basic_set_list()
    if any(pieces.get_at(i).dim(isl.dim_type.div) for i in range(pieces.n_basic_set())):
        # strided accesses: isl's Farkas dual takes no existentials; their rational
        # relaxation is a superset, whose valid forms are valid here too (conservative)
        poly = poly.remove_divs()
    flat = poly.coefficients().flatten()
    out = []
    n = flat.dim(isl.dim_type.set)
    cons = flat.get_constraint_list()
    for i in range(cons.n_constraint()):
        con = cons.get_at(i)
        vals = [con.get_coefficient_val(isl.dim_type.set, k) for k in range(n)]
        vals.append(con.get_constant_val())
        fracs = [Fraction(v.get_num_si(), v.get_den_val().to_python()) for v in vals]
        scale = 1
        for f in fracs:
            scale = lcm(scale, f.denominator)
        ints = [int(f * scale) for f in fracs]
        out.append((con.is_equality(), ints[:-1], ints[-1]))
    return out


def _reach(start: str, succ: dict[str, set[str]]) -> set[str]:
    seen, todo = {start}, [start]
    while todo:
        for t in succ[todo.pop()]:
            if t not in seen:
                seen.add(t)
                todo.append(t)
    return seen


def _independent(rows: list[list[int]], c: list[int]) -> bool:
    return _rank(rows + [c]) > _rank(rows)


def _rank(rows: list[list[int]]) -> int:
    m = [[Fraction(x) for x in r] for r in rows]
    rank, col = 0, 0
    ncols = len(m[0]) if m else 0
    while rank < len(m) and col < ncols:
        pivot = next((i for i in range(rank, len(m)) if m[i][col] != 0), None)
        if pivot is None:
            col += 1
            continue
        m[rank], m[pivot] = m[pivot], m[rank]
        for i in range(len(m)):
            if i != rank and m[i][col] != 0:
                f = m[i][col] / m[rank][col]
                m[i] = [a - f * b for a, b in zip(m[i], m[rank])]
        rank += 1
        col += 1
    return rank


def _independence(rows: list[list[int]], cs: list[str]) -> list[str]:
    """Pluto's linear independence: against a basis ``b`` of the orthogonal complement
    of ``rows`` (first non-zero entry positive), ``b . c >= 0`` each and ``>= 1`` summed."""
    n = len(cs)
    basis = _null_space(rows, n) if rows else [[1 if i == j else 0 for i in range(n)]
                                              for j in range(n)]
    dots = [" + ".join(f"{b}*{c}" for b, c in zip(vec, cs) if b) or "0" for vec in basis]
    return [f"{d} >= 0" for d in dots] + [f"{' + '.join(f'({d})' for d in dots)} >= 1"]


def _null_space(rows: list[list[int]], n: int) -> list[list[int]]:
    """Integer vectors spanning ``{x : rows . x = 0}``, each with its first non-zero
    entry positive."""
    m = [[Fraction(x) for x in r] for r in rows]
    pivots: list[int] = []
    rank = 0
    for col in range(n):
        pivot = next((i for i in range(rank, len(m)) if m[i][col] != 0), None)
        if pivot is None:
            continue
        m[rank], m[pivot] = m[pivot], m[rank]
        p = m[rank][col]
        m[rank] = [a / p for a in m[rank]]
        for i in range(len(m)):
            if i != rank and m[i][col] != 0:
                f = m[i][col]
                m[i] = [a - f * b for a, b in zip(m[i], m[rank])]
        pivots.append(col)
        rank += 1
    free = [c for c in range(n) if c not in pivots]
    basis = []
    for f in free:
        v = [Fraction(0)] * n
        v[f] = Fraction(1)
        for i, pc in enumerate(pivots):
            v[pc] = -m[i][f]
        scale = 1
        for x in v:
            scale = lcm(scale, x.denominator)
        ints = [int(x * scale) for x in v]
        first = next((x for x in ints if x), 1)
        basis.append([-x for x in ints] if first < 0 else ints)
    return basis
