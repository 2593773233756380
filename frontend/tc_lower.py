"""Semantic checks of a parsed TC ``def`` and its lowering to a :class:`polyc.ir.Kernel`.

For each TC statement, in program order:

1. the right-hand side is lowered to a :mod:`polyc.expr` tree (``where`` let-bindings
   substituted, names resolved to tensors, sizes or indices, index expressions checked
   affine); the indices absent from the left-hand side are the reduction indices;
2. range inference (:mod:`.tc_ranges`) gives every index an interval from the accesses,
   the ``where i in lo:hi`` clauses overriding it;
3. a tensor written for the first time gets its shape from the ranges of its indices
   (the exclusive upper bounds, or 0 where a range is empty: ``max(N - K + 1, 0)``;
   these indices never start below 0) and its dtype from the value. An output's first
   write may not be a reduction without ``!`` (nothing would initialise it; a
   temporary accumulated that way starts from zeros);
4. the iteration domain is the rectangle of the ranges. An unconditional read (or an
   ``exists`` access) that the rectangle does not keep in bounds (two indices ranged by
   other accesses, as in ``B(i + j)``; a `where` range wider than a tensor; several sizes
   bounding an index, as in ``A(i) + B(i)`` with different sizes) adds its bounds to the
   domain as extra constraints. Reads under ``?:`` or on the right of ``&&``/``||`` are
   assumed guarded by the user and do not restrict the domain. A write outside its
   tensor is an error;
5. a ``!`` form emits an ``init`` statement (the reduction identity) before the update.
"""
from __future__ import annotations

from dataclasses import dataclass

import islpy as isl

from polyc import expr as E
from polyc.errors import RangeInferenceError, SemanticError
from polyc.guards import guards_to_domains
from polyc.ir import Access, Array, Kernel, Statement, make_domain, params_prefix
from polyc.ir import reduction_identity as identity

from . import tc_parser as P
from . import tc_ranges as R
from .tc_expr import ExprLowering, Scope, check_name, dtype_of, err, lower_size_expr

OP_OF = {"=": "=", "+=": "+", "*=": "*", "min=": "min", "max=": "max"}


@dataclass
class Tensor:
    """What the lowering knows of a tensor; ``shape`` is None until it is first written."""
    name: str
    dtype: str | None
    shape: tuple[E.Expr, ...] | None
    role: str
    span: P.Span


class DefLowering:
    """Lowers one ``def``: the signature first, then each statement in order."""

    def __init__(self, d: P.Def, allow_indirect: bool = False):
        self.d = d
        self.allow_indirect = allow_indirect
        self.sizes: list[str] = []
        self.tensors: dict[str, Tensor] = {}
        self.statements: list[Statement] = []
        self.temps: list[str] = []
        self.written: set[str] = set()

    def kernel(self) -> Kernel:
        self.signature()
        for stmt in self.d.body:
            self.statement(stmt)
        for r in self.d.returns:
            if self.tensors[r.name].shape is None:
                raise err(SemanticError, f"output {r.name!r} is never written", r.span)
        names = [p.name for p in self.d.params] + [r.name for r in self.d.returns] + self.temps
        arrays = tuple(Array(n, self.tensors[n].dtype, self.tensors[n].shape,
                             self.tensors[n].role) for n in names)
        return guards_to_domains(Kernel(self.d.name, tuple(self.sizes), arrays,
                                        tuple(self.statements),
                                        tuple(p.name for p in self.d.params),
                                        tuple(r.name for r in self.d.returns)))

    # -- signature ----------------------------------------------------------------------

    def signature(self) -> None:
        for p in self.d.params:
            self.declare(p.name, p.span, p.type, "input")
        for r in self.d.returns:
            self.declare(r.name, r.span, r.type, "output")

    def declare(self, name: str, span: P.Span, ty: P.TensorType | None, role: str) -> None:
        check_name(name, span, "tensor")
        if name in self.tensors:
            raise err(SemanticError, f"duplicate name {name!r} in the signature of "
                                     f"{self.d.name!r}", span)
        dtype = shape = None
        if ty is not None:
            dtype = dtype_of(ty.dtype, ty.span)
            shape = tuple(self.size_dim(x) for x in ty.dims)
        self.tensors[name] = Tensor(name, dtype, shape, role, span)
        if name in self.sizes:
            raise err(SemanticError, f"{name!r} is both a size and a tensor", span)

    def size_dim(self, x: P.Name | P.Number) -> E.Expr:
        if isinstance(x, P.Number):
            if x.value < 1:
                raise err(SemanticError, f"a literal size must be positive, got {x.value}",
                          x.span)
            return E.Const(x.value)
        if x.name in self.tensors:
            raise err(SemanticError, f"{x.name!r} is both a size and a tensor", x.span)
        if x.name not in self.sizes:
            check_name(x.name, x.span, "size")
            self.sizes.append(x.name)
        return E.Size(x.name)

    # -- statements ---------------------------------------------------------------------

    def statement(self, stmt: P.Stmt) -> None:
        target = self.check_lhs(stmt)
        if (target.role == "output" and stmt.op != "=" and not stmt.op.endswith("!")
                and target.name not in self.written):
            raise err(SemanticError, f"output {target.name!r} is reduced with `{stmt.op}` "
                      f"before any statement initialises it: write `{stmt.op}!` to start "
                      f"from the reduction's identity, or assign it in an earlier statement",
                      stmt.span)
        self.written.add(target.name)
        scope = Scope(self.sizes, self.tensors, {i.name: i.span for i in stmt.indices},
                      self.allow_indirect)
        low = ExprLowering(scope, stmt.clauses)
        value = low.value(stmt.rhs)
        lhs = [i.name for i in stmt.indices]
        red = [i for i in scope.index_spans if i not in lhs]
        base_op = stmt.op.rstrip("!")
        if base_op == "=" and red:
            raise err(SemanticError, f"{red[0]!r} is not a tensor, a size or an index of the "
                      f"left-hand side: `=` cannot reduce over it (use a reduction such as "
                      f"`+=!`)", scope.index_spans[red[0]])
        iters = lhs + red
        exists = low.exists_reads()
        for r in exists:
            for i in r.indices:
                for n in E.free_names(i)[0] - set(iters):
                    raise err(SemanticError, f"index {n!r} of an exists clause is not used "
                              f"by the statement", scope.index_spans[n])
        fixed = self.where_ranges(stmt, scope, iters)
        reads = list(E.reads(value)) + list(exists)
        ranges = self.ranges(stmt, target, iters, fixed, reads, scope)
        if target.shape is None:
            # an empty range (upper bound below 0 for some sizes) makes an empty dimension
            target.shape = tuple(R.to_expr(R.nonnegative(ranges[i][1], self.le)) for i in lhs)
            target.dtype = target.dtype or E.infer_dtype(value, self.dtypes())
        bounds = {i: (R.to_expr(ranges[i][0]), R.to_expr(ranges[i][1])) for i in iters}
        write = Access(target.name, tuple(E.Index(i) for i in lhs))
        origin = f"line {stmt.span.line}"
        if stmt.op.endswith("!"):
            dom = make_domain(self.next_name(), tuple(lhs), tuple(self.sizes), bounds)
            self.statements.append(Statement(
                dom.get_tuple_name(), dom, tuple(lhs), write, "=",
                identity(OP_OF[base_op], target.dtype), origin, kind="init"))
        name = self.next_name()
        extra = self.extra_constraints(name, stmt, iters, bounds, write, value, exists)
        dom = make_domain(name, tuple(iters), tuple(self.sizes), bounds, extra)
        self.statements.append(Statement(name, dom, tuple(iters), write, OP_OF[base_op],
                                         value, origin))

    def next_name(self) -> str:
        return f"S{len(self.statements)}"

    def dtypes(self) -> dict[str, str]:
        return {n: t.dtype for n, t in self.tensors.items() if t.dtype is not None}

    def check_lhs(self, stmt: P.Stmt) -> Tensor:
        """The written tensor (a new temporary on its first write), after the LHS checks."""
        name = stmt.tensor
        if name in self.sizes:
            raise err(SemanticError, f"{name!r} is a size, not a tensor", stmt.span)
        t = self.tensors.get(name)
        if t is not None and t.role == "input":
            raise err(SemanticError, f"cannot write to input {name!r}", stmt.span)
        check_name(name, stmt.span, "tensor")
        seen: set[str] = set()
        for i in stmt.indices:
            check_name(i.name, i.span, "index")
            if i.name in self.sizes:
                raise err(SemanticError, f"{i.name!r} is a size; it cannot be used as an "
                                         f"index on the left-hand side", i.span)
            if i.name in self.tensors or i.name == name:
                raise err(SemanticError, f"{i.name!r} is a tensor; it cannot be used as an "
                                         f"index", i.span)
            if i.name in seen:
                raise err(SemanticError, f"index {i.name!r} appears twice on the left-hand "
                                         f"side", i.span)
            seen.add(i.name)
        if t is None:
            t = Tensor(name, None, None, "temp", stmt.span)
            self.tensors[name] = t
            self.temps.append(name)
        if t.shape is not None and len(t.shape) != len(stmt.indices):
            raise err(SemanticError, f"{name!r} has rank {len(t.shape)} but is written with "
                                     f"{len(stmt.indices)} indices", stmt.span)
        return t

    def where_ranges(self, stmt: P.Stmt, scope: Scope, iters: list[str]) -> dict[str, R.Range]:
        fixed: dict[str, R.Range] = {}
        for c in stmt.clauses:
            if not isinstance(c, P.RangeClause):
                continue
            if c.index not in iters:
                what = "a size" if c.index in self.sizes else "not an index of the statement"
                raise err(SemanticError, f"where clause ranges {c.index!r}, which is {what}",
                          c.span)
            lo, hi = (R.from_expr(lower_size_expr(scope, x)) for x in (c.lo, c.hi))
            fixed[c.index] = (lo, hi)
        return fixed

    # -- range inference and domains -------------------------------------------------

    def context_conds(self) -> list[str]:
        """What holds for every call: sizes are positive (they are extents of inputs).
        Extents of outputs and temporaries may be 0 (an empty range), so they add nothing."""
        return [f"{s} >= 1" for s in self.sizes]

    def le(self, a: R.Lin, b: R.Lin) -> bool:
        """True if ``a <= b`` for every value of the sizes allowed by the context."""
        diff = b - a
        if diff.is_const:
            return diff.const >= 0
        conds = " and ".join(self.context_conds() + [f"{R.to_isl(a)} > {R.to_isl(b)}"])
        return isl.Set(f"{params_prefix(self.sizes)}{{ : {conds} }}").is_empty()

    def ranges(self, stmt: P.Stmt, target: Tensor, iters: list[str],
               fixed: dict[str, R.Range], reads: list[E.Read], scope: Scope
               ) -> dict[str, R.Range]:
        accesses = [(r.indices, self.tensors[r.array].shape) for r in reads]
        if target.shape is not None:
            accesses.insert(0, (tuple(E.Index(i.name) for i in stmt.indices), target.shape))
        # a non-affine (indirect) index does not constrain the ranges, as in TC
        constraints = [R.Constraint(R.from_expr(i), R.from_expr(d, extent=True))
                       for idx, shape in accesses for i, d in zip(idx, shape)
                       if E.is_affine(i)]
        new = frozenset(i.name for i in stmt.indices) if target.shape is None else frozenset()
        ranges = R.infer_ranges(iters, fixed, constraints, self.le, new)
        for i in iters:
            if i not in ranges:
                raise err(RangeInferenceError, f"cannot infer the range of index {i!r}; add "
                          f"`where {i} in 0:N`", scope.index_spans[i])
        return ranges

    def extra_constraints(self, name: str, stmt: P.Stmt, iters: list[str],
                          bounds: dict[str, tuple[E.Expr, E.Expr]], write: Access,
                          value: E.Expr, exists: list[E.Read]) -> tuple[str, ...]:
        """Bounds of unconditional reads the rectangle does not imply (see module doc).

        The write is checked on the box of the left-hand side's ranges, what a ``!``
        initialisation writes whatever the reduction ranges."""
        ctx = isl.Set(f"{params_prefix(self.sizes)}{{ : {' and '.join(self.context_conds())} }}"
                      if self.sizes else "{ : }")

        def box(its: list[str]) -> isl.Set:
            return make_domain(name, tuple(its), tuple(self.sizes), bounds).intersect_params(ctx)

        def missing(access, dom: isl.Set, its: list[str]) -> list[str]:
            head = f"{params_prefix(self.sizes)}{{ {name}[{', '.join(its)}] : "
            shape = self.tensors[access.array].shape
            conds = [f"0 <= {E.to_isl(i)} < {E.to_isl(d)}"
                     for i, d in zip(access.indices, shape) if E.is_affine(i)]
            return [c for c in conds if not dom.is_subset(isl.Set(head + c + " }"))]

        lhs = [i.name for i in write.indices]  # type: ignore[attr-defined]
        if missing(write, box(lhs), lhs):
            raise err(RangeInferenceError, f"the statement writes {write.array!r} outside "
                      f"its shape ({', '.join(E.show(d) for d in self.tensors[write.array].shape)})"
                      f"; check the `where` ranges", stmt.span)
        rect = box(iters)
        extra: list[str] = []
        for r in list(E.unconditional_reads(value)) + exists:
            extra += [c for c in missing(r, rect, iters) if c not in extra]
        return tuple(extra)


# -- public API -----------------------------------------------------------------------

def tc_defs(source: str) -> list[str]:
    """The names of the ``def``s in ``source``, in order."""
    return [d.name for d in P.parse_tc(source)]


def from_tc(source: str, name: str | None = None, *, allow_indirect: bool = False) -> Kernel:
    """Parse ``source`` and lower the ``def`` called ``name`` (optional if there is one).

    ``allow_indirect`` accepts non-affine and data-dependent indices (``X(I(i), j)``,
    ``X(min(max(I(i), 0), 4), j)``); they constrain neither range inference nor the
    bounds checks, so the source must keep them inside their tensors. Without it such an
    index is an :class:`~polyc.errors.UnsupportedError`.
    """
    defs = P.parse_tc(source)
    seen: dict[str, P.Def] = {}
    for d in defs:
        if d.name in seen:
            raise err(SemanticError, f"duplicate def {d.name!r}", d.span)
        seen[d.name] = d
    if not defs:
        raise SemanticError("the source contains no def")
    if name is None and len(defs) > 1:
        raise SemanticError(f"the source has several defs ({', '.join(seen)}); pass name= "
                            f"to pick one")
    if name is not None and name not in seen:
        raise SemanticError(f"no def named {name!r}; the source has: {', '.join(seen)}")
    return DefLowering(seen[name] if name is not None else defs[0], allow_indirect).kernel()
