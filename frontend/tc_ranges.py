"""Range inference for TC statements, on exact affine arithmetic decided by isl.

A :class:`Lin` is an integer affine form ``sum(coef * atom) + const`` whose atoms are
names (sizes or indices), floor divisions ``floor(Lin / d)`` and the ``min``/``max`` of
forms in the sizes (:class:`MinMax`). Range inference works on these forms and turns
the results back into :mod:`polyc.expr` trees, so extents read ``H - KH + 1``,
``(H - KH) // 2 + 1`` or ``Q - min(Q, R) + 1`` rather than whatever a solver prints.

The algorithm is TC's (see :func:`infer_ranges`): rounds in which every index that is
the only not-yet-ranged index of some access dimension gets the largest interval that
keeps that access in bounds for all values of the already-ranged indices. When several
accesses bound an index, its range is their intersection: the greatest lower bound and
the least upper bound. Which bound is tightest is asked of isl over the sizes' context
(a bound that never wins is dropped); where it depends on the sizes, the bound is their
``min``/``max`` -- a piecewise affine extent, exact for every size, never a guess.
"""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Union

from polyc import expr as E

Atom = Union[str, "Floor", "MinMax"]


@dataclass(frozen=True)
class Floor:
    """The atom ``floor(num / den)`` with ``den >= 2``."""
    num: Lin
    den: int


@dataclass(frozen=True)
class MinMax:
    """The atom ``min(args)`` or ``max(args)`` (``op``) of two or more forms in sizes."""
    op: str
    args: tuple[Lin, ...]


class Lin:
    """An immutable affine form; equal forms compare and hash equal."""

    __slots__ = ("const", "terms")

    def __init__(self, terms: dict[Atom, int] | None = None, const: int = 0):
        self.terms = {a: c for a, c in (terms or {}).items() if c != 0}
        self.const = const

    @staticmethod
    def of(atom: Atom, coef: int = 1) -> Lin:
        return Lin({atom: coef})

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Lin) and self.terms == other.terms and self.const == other.const

    def __hash__(self) -> int:
        return hash((frozenset(self.terms.items()), self.const))

    def __repr__(self) -> str:
        return f"Lin({E.show(to_expr(self))})"

    def __add__(self, other: Lin | int) -> Lin:
        if isinstance(other, int):
            return Lin(self.terms, self.const + other)
        terms = dict(self.terms)
        for a, c in other.terms.items():
            terms[a] = terms.get(a, 0) + c
        return Lin(terms, self.const + other.const)

    def __neg__(self) -> Lin:
        return self.scale(-1)

    def __sub__(self, other: Lin | int) -> Lin:
        return self + (-other)

    def scale(self, k: int) -> Lin:
        return Lin({a: c * k for a, c in self.terms.items()}, self.const * k)

    @property
    def is_const(self) -> bool:
        return not self.terms

    def names(self) -> set[str]:
        """Every name in the form, inside floor atoms too."""
        out: set[str] = set()
        for a in self.terms:
            if isinstance(a, str):
                out.add(a)
            elif isinstance(a, Floor):
                out |= a.num.names()
            else:
                for x in a.args:
                    out |= x.names()
        return out


def floor_div(x: Lin, d: int) -> Lin:
    """``floor(x / d)`` for ``d >= 1``, with multiples of ``d`` taken out of the floor.

    What stays inside keeps its sign (``(H - KH) // 2``, ``(H - 1) // 2``), so extents
    read as written by hand.
    """
    if d == 1:
        return x
    def rem(c: int) -> int:  # truncating remainder: keeps the sign of c
        return c % d if c >= 0 else -(-c % d)
    rest = {a: rem(c) for a, c in x.terms.items()}
    outside = Lin({a: (c - rest[a]) // d for a, c in x.terms.items()},
                  (x.const - rem(x.const)) // d)
    inside = Lin(rest, rem(x.const))
    if inside.is_const:
        return outside + inside.const // d
    return outside + Lin.of(Floor(inside, d))


def ceil_div(x: Lin, d: int) -> Lin:
    return -floor_div(-x, d)


# -- conversions ----------------------------------------------------------------------

def from_expr(e: E.Expr, extent: bool = False) -> Lin | None:
    """The form of an affine ``polyc.expr`` tree (indices and sizes alike), else None.

    With ``extent``, ``min``/``max`` calls are forms too (the extents range inference
    gives, :class:`MinMax`); an index expression with them is not affine."""
    if isinstance(e, (E.Index, E.Size)):
        return Lin.of(e.name)
    if isinstance(e, E.Const):
        ok = isinstance(e.value, int) and not isinstance(e.value, bool)
        return Lin(const=e.value) if ok else None
    if isinstance(e, E.Unary) and e.op == "-":
        x = from_expr(e.x, extent)
        return None if x is None else -x
    if extent and isinstance(e, E.Call) and e.fn in ("min", "max"):
        args = [from_expr(a, extent) for a in e.args]
        return None if None in args else Lin.of(MinMax(e.fn, tuple(args)))  # type: ignore
    if not isinstance(e, E.Binary):
        return None
    a, b = from_expr(e.a, extent), from_expr(e.b, extent)
    if a is None or b is None:
        return None
    if e.op == "+":
        return a + b
    if e.op == "-":
        return a - b
    if e.op == "*" and (a.is_const or b.is_const):
        return b.scale(a.const) if a.is_const else a.scale(b.const)
    if e.op in ("//", "%") and b.is_const and b.const > 0:
        q = floor_div(a, b.const)
        return q if e.op == "//" else a - q.scale(b.const)
    return None


def to_expr(x: Lin, is_index: Callable[[str], bool] = lambda _: False) -> E.Expr:
    """A readable tree: positive terms first, then negative ones, then the constant."""
    def atom(a: Atom) -> E.Expr:
        if isinstance(a, Floor):
            return E.Binary("//", to_expr(a.num, is_index), E.Const(a.den))
        if isinstance(a, MinMax):
            out = to_expr(a.args[0], is_index)
            for x in a.args[1:]:
                out = E.Call(a.op, (out, to_expr(x, is_index)))
            return out
        return E.Index(a) if is_index(a) else E.Size(a)

    def term(a: Atom, c: int) -> E.Expr:
        return atom(a) if c == 1 else E.Binary("*", E.Const(c), atom(a))

    pos = [(a, c) for a, c in x.terms.items() if c > 0]
    neg = [(a, -c) for a, c in x.terms.items() if c < 0]
    if pos:
        out = term(*pos[0])
        for a, c in pos[1:]:
            out = E.Binary("+", out, term(a, c))
    elif neg and x.const == 0:
        out = E.Unary("-", term(*neg[0]))
        neg = neg[1:]
    else:
        return _sub_all(E.Const(x.const), neg, term)
    out = _sub_all(out, neg, term)
    if x.const > 0:
        return E.Binary("+", out, E.Const(x.const))
    if x.const < 0:
        return E.Binary("-", out, E.Const(-x.const))
    return out


def _sub_all(out: E.Expr, neg, term) -> E.Expr:
    for a, c in neg:
        out = E.Binary("-", out, term(a, c))
    return out


def to_isl(x: Lin) -> str:
    return E.to_isl(to_expr(x))


# -- range inference ------------------------------------------------------------------

Range = tuple[Lin, Lin]  # [lo, hi)


def extremes(x: Lin, ranges: dict[str, Range]) -> tuple[Lin, Lin]:
    """The least and greatest value of ``x`` when each ranged index runs over its range.

    Names not in ``ranges`` (sizes) stay symbolic; floor atoms are monotone in their
    numerator, so their extremes are the floors of the numerator's extremes.
    """
    lo, hi = Lin(const=x.const), Lin(const=x.const)
    for a, c in x.terms.items():
        if isinstance(a, Floor):
            nlo, nhi = extremes(a.num, ranges)
            alo, ahi = floor_div(nlo, a.den), floor_div(nhi, a.den)
        elif a in ranges:
            alo, ahi = ranges[a][0], ranges[a][1] - 1
        else:
            alo = ahi = Lin.of(a)
        lo, hi = (lo + alo.scale(c), hi + ahi.scale(c)) if c > 0 else \
                 (lo + ahi.scale(c), hi + alo.scale(c))
    return lo, hi


def bound_index(e: Lin, extent: Lin, x: str, ranges: dict[str, Range]) -> Range | None:
    """The range of ``x`` that keeps ``0 <= e < extent`` for all values of the other indices.

    None when ``x`` occurs inside a floor atom (then the access does not bound it).
    """
    c = e.terms.get(x, 0)
    if c == 0 or any(not isinstance(a, str) and x in Lin.of(a).names() for a in e.terms):
        return None
    rmin, rmax = extremes(Lin({a: k for a, k in e.terms.items() if a != x}, e.const), ranges)
    if c > 0:  # c*x >= -rmin  and  c*x <= extent - 1 - rmax
        return ceil_div(-rmin, c), floor_div(extent - 1 - rmax, c) + 1
    d = -c     # d*x <= rmin  and  d*x >= rmax - extent + 1
    return ceil_div(rmax - extent + 1, d), floor_div(rmin, d) + 1


@dataclass(frozen=True)
class Constraint:
    """Dimension ``dim`` of an access: ``0 <= index < extent`` must hold."""
    index: Lin
    extent: Lin


def infer_ranges(indices: list[str], fixed: dict[str, Range], constraints: list[Constraint],
                 le: Callable[[Lin, Lin], bool], nonnegative_indices: frozenset[str] = frozenset()
                 ) -> dict[str, Range]:
    """TC's range inference: the range of every index it can range.

    ``fixed`` are the `where` ranges (never re-inferred). The indices in
    ``nonnegative_indices`` (those of a tensor's first write, which gets its shape from
    them) never start below 0. Each round, every index that is
    the only unranged index of some constraint gets the intersection of the ranges all
    such constraints give it; a constraint with two unranged indices waits for a later
    round. ``le(a, b)`` proves ``a <= b`` for all sizes (isl, in the caller's context);
    bounds whose order depends on the sizes are kept together as a ``min``/``max``.
    """
    ranges = dict(fixed)
    while True:
        found: dict[str, list[Range]] = {}
        for con in constraints:
            unknown = [n for n in con.index.names() if n in indices and n not in ranges]
            if len(unknown) == 1:
                r = bound_index(con.index, con.extent, unknown[0], ranges)
                if r is not None:
                    found.setdefault(unknown[0], []).append(r)
        if not found:
            return ranges
        for x, rs in found.items():
            los = [r[0] for r in rs] + ([Lin()] if x in nonnegative_indices else [])
            ranges[x] = (tightest(los, "max", le), tightest([r[1] for r in rs], "min", le))


def tightest(bounds: list[Lin], op: str, le: Callable[[Lin, Lin], bool]) -> Lin:
    """``min(bounds)`` (``op == "min"``) or ``max(bounds)``, without the bounds that isl
    proves never win; a single survivor is returned as it is."""
    def tighter(a: Lin, b: Lin) -> bool:  # a is at least as tight as b for every size
        return le(a, b) if op == "min" else le(b, a)

    flat: list[Lin] = []
    for b in bounds:
        atom = next(iter(b.terms), None)
        if (len(b.terms) == 1 and b.const == 0 and isinstance(atom, MinMax)
                and atom.op == op and b.terms[atom] == 1):
            flat += atom.args
        else:
            flat.append(b)
    kept: list[Lin] = []
    for b in flat:
        if any(k == b or tighter(k, b) for k in kept):
            continue
        kept = [k for k in kept if not tighter(b, k)] + [b]
    return kept[0] if len(kept) == 1 else Lin.of(MinMax(op, tuple(kept)))


def nonnegative(x: Lin, le: Callable[[Lin, Lin], bool]) -> Lin:
    """``max(x, 0)``: the extent an exclusive upper bound gives (0 for an empty range)."""
    return tightest([x, Lin()], "max", le)
