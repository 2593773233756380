"""Lowering of TC expressions (parser AST) to :mod:`polyc.expr` trees.

Names resolve, in this order, to a ``where`` let-binding (substituted), a tensor (a
rank-0 read), a size (:class:`polyc.expr.Size`) or else an index of the statement
(:class:`polyc.expr.Index`, recorded with the span of its first occurrence).
``NAME(args)`` is a tensor read if ``NAME`` is a tensor, else a built-in call. Index
expressions of reads must be affine in indices and sizes (``i / 2`` with a positive
constant divisor is read as floor division); polyc rejects indirect indices
(``A(B(i))``) where TC only warns, unless the lowering is asked to accept them
(``allow_indirect``, used by the ONNX lowerings of Gather and friends): then an index may
be any integer expression (reads of integer tensors, ``?:``, ``min``/``max``, products of
indices), and such an index constrains neither range inference nor the bounds checks --
whoever writes it must keep it inside the tensor (clamp or guard it).

An unknown name gets the closest known one suggested (``did you mean 'B'?``). Let-bindings
are substituted; the result must stay within :data:`polyc.limits.MAX_EXPR_DEPTH` levels and
:data:`polyc.limits.MAX_EXPR_NODES` nodes (bindings that use each other twice double in
size at each step), and a statement within :data:`polyc.limits.MAX_INDICES` indices.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from polyc import dtypes as D
from polyc import expr as E
from polyc import limits
from polyc.errors import CompileError, SemanticError, UnsupportedError

from . import tc_parser as P

#: TC type names polyc compiles, and the dtype each one means
DTYPE_OF = dict(D.TC_NAMES)

#: built-ins of TC (CUDA math names); those missing from E.BUILTINS are unsupported
TC_BUILTINS = frozenset(["acos", "acosh", "asin", "asinh", "atan", "atan2", "atanh", "cbrt", "ceil", "copysign", "cos", "cosh", "cospi", "cyl_bessel_i0", "cyl_bessel_i1", "erf", "erfc", "erfcinv", "erfcx", "erfinv", "exp", "exp10", "exp2", "expm1", "fabs", "fdim", "fdivide", "floor", "fma", "fmax", "fmin", "fmod", "hypot", "j0", "j1", "lgamma", "log", "log10", "log1p", "log2", "logb", "nextafter", "norm3d", "norm4d", "normcdf", "normcdfinv", "pow", "rcbrt", "remainder", "rhypot", "rnorm3d", "rnorm4d", "round", "rsqrt", "sin", "sinh", "sinpi", "sqrt", "tan", "tanh", "tgamma", "trunc", "y0", "y1", "min", "max"])


#: names isl cannot parse as variables, and C keywords (names become C identifiers)
RESERVED = frozenset(["and", "or", "not", "mod", "floor", "ceil", "exists", "min", "max", "infty", "NaN", "true", "false", "rat", "implies", "xor", "auto", "break", "case", "char", "const", "continue", "default", "do", "else", "enum", "extern", "for", "goto", "if", "inline", "int", "long", "register", "restrict", "return", "short", "signed", "sizeof", "static", "struct", "switch", "typedef", "union", "unsigned", "void", "volatile", "while"])


def err(cls: type[CompileError], message: str, span: P.Span) -> CompileError:
    """``cls`` at ``span`` (with its source line when the span has it)."""
    return P.error(cls, message, span)


def check_name(name: str, span: P.Span, what: str) -> None:
    """Sizes, indices and tensors become isl and C names: reject the reserved ones."""
    if name in RESERVED:
        raise err(UnsupportedError, f"{what} name {name!r} is reserved (in isl or C); "
                                    f"please rename it", span)


def dtype_of(type_name: str, span: P.Span) -> str:
    if type_name not in DTYPE_OF:
        raise err(UnsupportedError, f"type {type_name!r} is not supported by polyc "
                                    f"(supported: {', '.join(DTYPE_OF)})", span)
    return DTYPE_OF[type_name]


def start(e: P.Expr) -> P.Span:
    """The span of the leftmost token of ``e``."""
    if isinstance(e, P.BinaryOp):
        return start(e.a)
    if isinstance(e, P.Ternary):
        return start(e.cond)
    return e.span


@dataclass
class Scope:
    """Names visible in a statement. ``tensors`` maps names to objects with ``shape``
    (None until first written) and ``dtype``; ``index_spans`` fills up, in order of first
    occurrence, as indices are met (it starts with the left-hand side's)."""
    sizes: list[str]
    tensors: dict[str, Any]
    index_spans: dict[str, P.Span] = field(default_factory=dict)
    #: accept non-affine and indirect (data-dependent) index expressions
    allow_indirect: bool = False


class ExprLowering:
    """Lowers the expressions of one statement; ``clauses`` supply its let-bindings."""

    def __init__(self, scope: Scope, clauses: tuple[P.Clause, ...] = ()):
        self.scope = scope
        self.lets: dict[str, P.LetClause] = {}
        self.let_values: dict[str, E.Expr] = {}
        self.active: set[str] = set()
        #: id -> (depth, nodes, the node) of lowered expressions, let-bindings expanded
        self.measured: dict[int, tuple[int, int, E.Expr]] = {}
        self.exists = [c.access for c in clauses if isinstance(c, P.ExistsClause)]
        for c in clauses:
            if isinstance(c, P.LetClause):
                if c.name in self.lets or c.name in scope.tensors or c.name in scope.sizes \
                        or c.name in scope.index_spans:
                    raise err(SemanticError, f"let-binding {c.name!r} hides another name",
                              c.span)
                self.lets[c.name] = c

    def exists_reads(self) -> list[E.Read]:
        out = []
        for a in self.exists:
            if a.name not in self.scope.tensors:
                raise err(SemanticError, f"unknown tensor {a.name!r} in exists clause"
                          f"{P.did_you_mean(a.name, self.scope.tensors)}", a.span)
            out.append(self.read(a.name, a.args, a.span))
        return out

    def value(self, e: P.Expr) -> E.Expr:
        x = self.lower(e)
        if self.lets:  # only let-bindings make an expression larger than its text
            self.measure(x, e)
        return x

    def measure(self, x: E.Expr, e: P.Expr) -> None:
        """Check ``x`` (the lowering of ``e``) against the size limits; iterative and
        memoised, so shared subtrees (let-bindings) are measured once."""
        memo = self.measured
        stack: list[tuple[E.Expr, bool]] = [(x, False)]
        while stack:
            y, ready = stack.pop()
            if id(y) in memo:
                continue
            kids = E.children(y)
            if ready:
                depth = 1 + max((memo[id(k)][0] for k in kids), default=0)
                nodes = 1 + sum(memo[id(k)][1] for k in kids)
                memo[id(y)] = (depth, nodes, y)
            else:
                stack.append((y, True))
                stack.extend((k, False) for k in kids if id(k) not in memo)
        depth, nodes, _ = memo[id(x)]
        if depth > limits.MAX_EXPR_DEPTH:
            raise err(SemanticError, f"expression too deep once its let-bindings are "
                      f"substituted ({depth} levels); the limit is {limits.MAX_EXPR_DEPTH} "
                      f"(polyc.limits.MAX_EXPR_DEPTH)", start(e))
        if nodes > limits.MAX_EXPR_NODES:
            raise err(SemanticError, f"expression too large once its let-bindings are "
                      f"substituted ({nodes} nodes); the limit is {limits.MAX_EXPR_NODES} "
                      f"(polyc.limits.MAX_EXPR_NODES)", start(e))

    def lower(self, e: P.Expr) -> E.Expr:
        if isinstance(e, P.Number):
            return E.Const(e.value)
        if isinstance(e, P.Name):
            return self.name(e)
        if isinstance(e, P.Apply):
            return self.apply(e)
        if isinstance(e, P.CastExpr):
            return E.Cast(dtype_of(e.dtype, e.span), self.value(e.x))
        if isinstance(e, P.DimOf):
            return self.dim_of(e)
        if isinstance(e, P.UnaryOp):
            x = self.value(e.x)
            if e.op == "-" and isinstance(x, E.Const) and not isinstance(x.value, bool):
                return E.Const(-x.value, x.dtype)
            return E.Unary(e.op, x)
        if isinstance(e, P.BinaryOp):
            return E.Binary(e.op, self.value(e.a), self.value(e.b))
        if isinstance(e, P.Ternary):
            return E.Select(self.value(e.cond), self.value(e.a), self.value(e.b))
        raise TypeError(e)

    def name(self, n: P.Name) -> E.Expr:
        if n.name in self.lets:
            return self.let(n)
        if n.name in self.scope.tensors:
            return self.read(n.name, (), n.span)
        if n.name in self.scope.sizes:
            return E.Size(n.name)
        if n.name not in self.scope.index_spans:
            check_name(n.name, n.span, "index")
            if len(self.scope.index_spans) >= limits.MAX_INDICES:
                raise err(SemanticError, f"the statement has more than {limits.MAX_INDICES} "
                          f"indices (with {n.name!r}); the limit is {limits.MAX_INDICES} "
                          f"(polyc.limits.MAX_INDICES)", n.span)
            self.scope.index_spans[n.name] = n.span
        return E.Index(n.name)

    def let(self, n: P.Name) -> E.Expr:
        if n.name in self.active:
            raise err(SemanticError, f"let-binding {n.name!r} refers to itself", n.span)
        if n.name not in self.let_values:
            if len(self.active) >= limits.MAX_EXPR_DEPTH:
                raise err(SemanticError, f"let-bindings nested too deeply (more than "
                          f"{limits.MAX_EXPR_DEPTH} use one another); the limit is "
                          f"{limits.MAX_EXPR_DEPTH} (polyc.limits.MAX_EXPR_DEPTH)", n.span)
            self.active.add(n.name)
            self.let_values[n.name] = self.value(self.lets[n.name].value)
            self.active.discard(n.name)
        return self.let_values[n.name]

    def apply(self, e: P.Apply) -> E.Expr:
        if e.name in self.scope.tensors:
            return self.read(e.name, e.args, e.span)
        if e.name in self.scope.sizes or e.name in self.lets:
            raise err(SemanticError, f"{e.name!r} is not a tensor or a function", e.span)
        if e.name in E.BUILTINS:
            arity = E.BUILTINS[e.name]
            if arity is not None and arity != len(e.args):
                raise err(SemanticError, f"{e.name} takes {arity} argument(s), got "
                                         f"{len(e.args)}", e.span)
            return E.Call(e.name, tuple(self.value(a) for a in e.args))
        if e.name in TC_BUILTINS:
            raise err(UnsupportedError, f"built-in function {e.name!r} is not supported by "
                                        f"polyc", e.span)
        known = [*self.scope.tensors, *E.BUILTINS, *DTYPE_OF]
        raise err(SemanticError, f"unknown tensor or function {e.name!r}"
                                 f"{P.did_you_mean(e.name, known)}", e.span)

    def read(self, name: str, args: tuple[P.Expr, ...], span: P.Span) -> E.Read:
        t = self.scope.tensors[name]
        if t.shape is None:
            raise err(SemanticError, f"tensor {name!r} is read before it is written (its "
                                     f"shape is not known yet)", span)
        if len(args) != len(t.shape):
            raise err(SemanticError, f"{name!r} has rank {len(t.shape)} but is accessed with "
                                     f"{len(args)} index(es)", span)
        return E.Read(name, tuple(self.index(a) for a in args))

    def index(self, a: P.Expr) -> E.Expr:
        """An index expression of a read: affine in indices and sizes, else an error
        (unless ``allow_indirect``: then any integer expression)."""
        x = E.map_expr(self.value(a), _int_division)
        if self.scope.allow_indirect and not E.is_affine(x):
            dtype = E.infer_dtype(x, {n: t.dtype for n, t in self.scope.tensors.items()
                                      if t.dtype is not None})
            if dtype not in D.INTS:
                raise err(SemanticError, f"index {E.show(x)} has type {dtype}; an index "
                          f"must be an integer (cast it, e.g. int64(...))", start(a))
            return x
        inner = [r.array for r in E.walk(x) if isinstance(r, E.Read)]
        if inner:
            raise err(UnsupportedError, f"indirect index {E.show(x)}: it reads tensor "
                      f"{inner[0]!r}; polyc needs indices affine in the indices and sizes",
                      start(a))
        if not E.is_affine(x):
            raise err(UnsupportedError, f"non-affine index {E.show(x)}: polyc needs indices "
                      f"affine in the indices and sizes (products with constants, `/` and "
                      f"`%` by positive constants)", start(a))
        return x

    def dim_of(self, e: P.DimOf) -> E.Expr:
        t = self.scope.tensors.get(e.tensor)
        if t is None:
            raise err(SemanticError, f"unknown tensor {e.tensor!r}"
                                     f"{P.did_you_mean(e.tensor, self.scope.tensors)}", e.span)
        if t.shape is None:
            raise err(SemanticError, f"the shape of {e.tensor!r} is not known yet", e.span)
        if not 0 <= e.dim < len(t.shape):
            raise err(SemanticError, f"{e.tensor!r} has rank {len(t.shape)}, it has no "
                                     f"dimension {e.dim}", e.span)
        return t.shape[e.dim]


def _int_division(e: E.Expr) -> E.Expr | None:
    if isinstance(e, E.Binary) and e.op == "/" and isinstance(e.b, E.Const) \
            and isinstance(e.b.value, int) and e.b.value > 0:
        return E.Binary("//", e.a, e.b)
    return None


def lower_size_expr(scope: Scope, e: P.Expr) -> E.Expr:
    """A bound of a ``where`` range: affine in sizes (constants, sizes, ``T.k``)."""
    x = E.map_expr(ExprLowering(Scope(scope.sizes, scope.tensors)).value(e), _int_division)
    for n in sorted(E.free_names(x)[0]):
        raise err(SemanticError, f"range bound {E.show(x)} uses {n!r}, which is not a size "
                                 f"of the signature{P.did_you_mean(n, scope.sizes)}", start(e))
    if E.reads(x) or not E.is_affine(x):
        raise err(SemanticError, f"range bound {E.show(x)} is not an affine expression of "
                                 f"sizes (constants, size names, T.k)", start(e))
    return x
