"""Scalar expressions of statement bodies and affine index expressions.

A small frozen tree. The same nodes describe:

* statement bodies (``A(m,k) * B(k,n)``, ``exp(X(i) - mx(0))``),
* index expressions of accesses (affine in iterators and sizes: ``2*h + kh``),
* array extents (affine, possibly with floor division, in the sizes: ``(H - KH)//2 + 1``).

Names: :class:`Index` is an iterator of the statement's domain, :class:`Size` a size
parameter (``M``), :class:`Read` an element of an array. Types are the dtype strings
of :data:`DTYPES`.
"""
from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Union

from . import dtypes as D

DTYPES = D.ORDER
FLOAT_DTYPES = D.FLOATS

#: Names of the built-in functions and their arity (None: any).
BUILTINS: dict[str, int | None] = {
    "exp": 1, "log": 1, "sqrt": 1, "tanh": 1, "sigmoid": 1, "abs": 1, "fabs": 1,
    "fmax": 2, "fmin": 2, "pow": 2, "max": 2, "min": 2,
    "sin": 1, "cos": 1, "tan": 1, "asin": 1, "acos": 1, "atan": 1, "atan2": 2,
    "sinh": 1, "cosh": 1, "asinh": 1, "acosh": 1, "atanh": 1,
    "exp2": 1, "expm1": 1, "log2": 1, "log10": 1, "log1p": 1, "cbrt": 1, "rsqrt": 1,
    "erf": 1, "erfc": 1, "floor": 1, "ceil": 1, "round": 1, "trunc": 1,
    "fmod": 2, "hypot": 2, "fma": 3, "copysign": 2, "relu": 1,
    # integer bit operations (shifts by the type's width or more give 0)
    "bitand": 2, "bitor": 2, "bitxor": 2, "bitnot": 1, "shl": 2, "shr": 2,
}
#: built-ins whose result has their operands' type (not promoted to a float)
TYPE_KEEPING = ("max", "min", "abs", "relu", "bitand", "bitor", "bitxor", "bitnot", "shl",
                "shr")
BIT_OPS = TYPE_KEEPING[4:]
#: ``bits_<dtype>(x)``: ``x``'s bits read as ``dtype`` (same width; ONNX's BitCast)
BITCASTS = {f"bits_{name}": name for name in DTYPES}
BUILTINS.update({fn: 1 for fn in BITCASTS})

BINARY_OPS = ("+", "-", "*", "/", "%", "//", "==", "!=", "<", ">", "<=", ">=", "&&", "||")
COMPARISONS = ("==", "!=", "<", ">", "<=", ">=", "&&", "||")


@dataclass(frozen=True)
class Const:
    value: Union[int, float, bool]
    dtype: str | None = None  # None: takes the type of the context


@dataclass(frozen=True)
class Index:
    """An iterator of the statement's iteration domain, used as a value or an index."""
    name: str


@dataclass(frozen=True)
class Size:
    """A size parameter (``M``, ``K``), used as a value or in an index/extent."""
    name: str


@dataclass(frozen=True)
class Read:
    """``array(indices...)``; a rank-0 array has no indices."""
    array: str
    indices: tuple[Expr, ...]


@dataclass(frozen=True)
class Unary:
    op: str  # "-", "!"
    x: Expr


@dataclass(frozen=True)
class Binary:
    op: str  # one of BINARY_OPS; "//" is floor division (affine contexts only)
    a: Expr
    b: Expr


@dataclass(frozen=True)
class Select:
    cond: Expr
    a: Expr
    b: Expr


@dataclass(frozen=True)
class Call:
    fn: str  # a key of BUILTINS
    args: tuple[Expr, ...]


@dataclass(frozen=True)
class Cast:
    dtype: str
    x: Expr


Expr = Union[Const, Index, Size, Read, Unary, Binary, Select, Call, Cast]


def children(e: Expr) -> tuple[Expr, ...]:
    if isinstance(e, Read):
        return e.indices
    if isinstance(e, (Unary, Cast)):
        return (e.x,)
    if isinstance(e, Binary):
        return (e.a, e.b)
    if isinstance(e, Select):
        return (e.cond, e.a, e.b)
    if isinstance(e, Call):
        return e.args
    return ()


def walk(e: Expr) -> Iterator[Expr]:
    """Pre-order traversal."""
    yield e
    for c in children(e):
        yield from walk(c)


def reads(e: Expr) -> tuple[Read, ...]:
    """Every array read in ``e`` (indices of reads included), in order."""
    return tuple(x for x in walk(e) if isinstance(x, Read))


def unconditional_reads(e: Expr) -> list[Read]:
    """Reads evaluated whatever the data: not in ``?:`` branches nor right of ``&& ||``.

    Only these must stay inside their arrays; a guarded read (TC's padded-convolution
    idiom ``cond ? I(h+kh-1) : 0``) may point outside where its guard is false. The reads
    inside an indirect index (``I(i)`` in ``X(I(i), j)``) are evaluated with their read.
    """
    if isinstance(e, Read):
        return [e] + [r for i in e.indices for r in unconditional_reads(i)]
    if isinstance(e, Select):
        return unconditional_reads(e.cond)
    if isinstance(e, Binary) and e.op in ("&&", "||"):
        return unconditional_reads(e.a)
    return [r for c in children(e) for r in unconditional_reads(c)]


def map_expr(e: Expr, fn: Callable[[Expr], Expr | None]) -> Expr:
    """Rebuild ``e`` bottom-up; ``fn`` returns a replacement or None to keep the node."""
    if isinstance(e, Read):
        e = Read(e.array, tuple(map_expr(i, fn) for i in e.indices))
    elif isinstance(e, Unary):
        e = Unary(e.op, map_expr(e.x, fn))
    elif isinstance(e, Cast):
        e = Cast(e.dtype, map_expr(e.x, fn))
    elif isinstance(e, Binary):
        e = Binary(e.op, map_expr(e.a, fn), map_expr(e.b, fn))
    elif isinstance(e, Select):
        e = Select(map_expr(e.cond, fn), map_expr(e.a, fn), map_expr(e.b, fn))
    elif isinstance(e, Call):
        e = Call(e.fn, tuple(map_expr(a, fn) for a in e.args))
    r = fn(e)
    return e if r is None else r


# -- affine expressions ---------------------------------------------------------------

def is_affine(e: Expr) -> bool:
    """True if ``e`` is quasi-affine in indices and sizes (what isl can represent)."""
    if isinstance(e, (Index, Size)):
        return True
    if isinstance(e, Const):
        return isinstance(e.value, int) and not isinstance(e.value, bool)
    if isinstance(e, Unary):
        return e.op == "-" and is_affine(e.x)
    if isinstance(e, Binary):
        if e.op in ("+", "-"):
            return is_affine(e.a) and is_affine(e.b)
        if e.op == "*":
            return (is_affine(e.a) and is_affine(e.b)
                    and (_is_constant(e.a) or _is_constant(e.b)))
        if e.op in ("//", "%"):
            return is_affine(e.a) and _is_constant(e.b) and _const_value(e.b) > 0
    return False


def _is_constant(e: Expr) -> bool:
    return all(not isinstance(x, (Index, Size, Read)) for x in walk(e)) and is_affine(e)


def _const_value(e: Expr) -> int:
    return int(evaluate(e, {}))


def to_isl(e: Expr) -> str:
    """An affine expression in isl's textual syntax (``floor(x/2)`` for ``x // 2``).

    Extents may also take the ``min``/``max`` of two such expressions (piecewise affine:
    range inference gives ``min(Q, R)`` when neither size bounds the other)."""
    if isinstance(e, (Index, Size)):
        return e.name
    if isinstance(e, Const):
        return str(int(e.value))
    if isinstance(e, Unary) and e.op == "-":
        return f"(-{to_isl(e.x)})"
    if isinstance(e, Binary):
        if e.op == "//":
            return f"floor(({to_isl(e.a)})/{to_isl(e.b)})"
        if e.op == "%":
            return f"(({to_isl(e.a)}) mod {to_isl(e.b)})"
        if e.op in ("+", "-", "*"):
            return f"({to_isl(e.a)} {e.op} {to_isl(e.b)})"
    if isinstance(e, Call) and e.fn in ("min", "max") and len(e.args) == 2:
        return f"{e.fn}({to_isl(e.args[0])}, {to_isl(e.args[1])})"
    raise ValueError(f"not an affine expression: {e!r}")


def evaluate(e: Expr, env: dict[str, int]) -> int:
    """Evaluate an integer (affine) expression with sizes and indices bound in ``env``."""
    if isinstance(e, (Index, Size)):
        return env[e.name]
    if isinstance(e, Const):
        return int(e.value)
    if isinstance(e, Unary) and e.op == "-":
        return -evaluate(e.x, env)
    if isinstance(e, Binary):
        a, b = evaluate(e.a, env), evaluate(e.b, env)
        ops = {"+": a + b, "-": a - b, "*": a * b}
        if e.op in ops:
            return ops[e.op]
        if e.op == "//":
            return a // b
        if e.op == "%":
            return a % b
    if isinstance(e, Call) and e.fn in ("min", "max"):
        values = [evaluate(x, env) for x in e.args]
        return min(values) if e.fn == "min" else max(values)
    raise ValueError(f"cannot evaluate {e!r} as an integer")


def unit_last(indices: tuple[Expr, ...], it: str) -> bool:
    """``it`` appears in the last of ``indices`` only, with coefficient 1 (an affine index
    without ``//`` or ``%``): consecutive values of ``it`` are consecutive elements."""
    if not indices or any(it in free_names(ix)[0] for ix in indices[:-1]):
        return False
    last = indices[-1]
    if not is_affine(last) or any(isinstance(x, Binary) and x.op in ("//", "%")
                                  for x in walk(last)):
        return False
    idx, sizes = free_names(last)
    env = dict.fromkeys(idx | sizes, 0)
    base = evaluate(last, env)
    env[it] = 1
    return evaluate(last, env) - base == 1


def free_names(e: Expr) -> tuple[set[str], set[str]]:
    """(index names, size names) used in ``e``."""
    idx = {x.name for x in walk(e) if isinstance(x, Index)}
    siz = {x.name for x in walk(e) if isinstance(x, Size)}
    return idx, siz


def show(e: Expr) -> str:
    """Readable TC-like text of an expression (for dumps and messages)."""
    if isinstance(e, Const):
        return repr(e.value)
    if isinstance(e, (Index, Size)):
        return e.name
    if isinstance(e, Read):
        return f"{e.array}({', '.join(show(i) for i in e.indices)})" if e.indices else e.array
    if isinstance(e, Unary):
        return f"{e.op}{show(e.x)}"
    if isinstance(e, Binary):
        return f"({show(e.a)} {e.op} {show(e.b)})"
    if isinstance(e, Select):
        return f"({show(e.cond)} ? {show(e.a)} : {show(e.b)})"
    if isinstance(e, Call):
        return f"{e.fn}({', '.join(show(a) for a in e.args)})"
    if isinstance(e, Cast):
        return f"{e.dtype}({show(e.x)})"
    raise TypeError(e)


# -- types ------------------------------------------------------------------------------

_RANK = {name: i for i, name in enumerate(D.ORDER)}


def promote(a: str, b: str) -> str:
    """The type of a binary arithmetic result (a simple lattice, :data:`polyc.dtypes.ORDER`:
    bool < int8 < uint8 < ... < int64 < uint64 < float16 < bfloat16 < float32 < float64)."""
    return a if _RANK[a] >= _RANK[b] else b


def infer_dtype(e: Expr, array_dtypes: dict[str, str]) -> str:
    """The dtype of expression ``e``; literals without a dtype adapt to their operands.

    Sizes and indices used as values are int64; an untyped integer literal is int32 and an
    untyped float literal float32, both "weak" (they never widen a typed operand).
    Comparisons and logical operators give bool; math built-ins give at least float32.
    """
    t, _ = _infer(e, array_dtypes)
    return t


def _infer(e: Expr, dt: dict[str, str]) -> tuple[str, bool]:
    """(dtype, weak)."""
    if isinstance(e, Const):
        if e.dtype is not None:
            return e.dtype, False
        if isinstance(e.value, bool):
            return "bool", True
        return ("int32" if isinstance(e.value, int) else "float32"), True
    if isinstance(e, (Index, Size)):
        return "int64", True
    if isinstance(e, Read):
        return dt[e.array], False
    if isinstance(e, Cast):
        return e.dtype, False
    if isinstance(e, Unary):
        return ("bool", False) if e.op == "!" else _infer(e.x, dt)
    if isinstance(e, Binary):
        if e.op in COMPARISONS:
            return "bool", False
        return _join(_infer(e.a, dt), _infer(e.b, dt))
    if isinstance(e, Select):
        return _join(_infer(e.a, dt), _infer(e.b, dt))
    if isinstance(e, Call):
        if e.fn in BITCASTS:
            return BITCASTS[e.fn], False
        ts = [_infer(a, dt) for a in e.args]
        t = ts[0]
        for u in ts[1:]:
            t = _join(t, u)
        if e.fn in TYPE_KEEPING or _is_float(t[0]):
            return t
        return (promote(t[0], "float32"), t[1])
    raise TypeError(e)


def _join(x: tuple[str, bool], y: tuple[str, bool]) -> tuple[str, bool]:
    (a, wa), (b, wb) = x, y
    if wa and not wb:
        # a weak float literal still makes an integer expression floating point
        return (promote(b, "float32") if _is_float(a) and not _is_float(b) else b), False
    if wb and not wa:
        return (promote(a, "float32") if _is_float(b) and not _is_float(a) else a), False
    return promote(a, b), wa and wb


def _is_float(dtype: str) -> bool:
    return dtype in D.FLOATS


def clamped_narrowing(e: Expr, dtype: str) -> Expr | None:
    """``max(lo, min(hi, x))`` (or ``min(hi, max(lo, x))``) of ``T(...)``, a floating value
    clamped to constants within the range of ``T``, an integer type narrower than 32
    bits; else None."""
    d = D.get(dtype)
    if not (isinstance(e, Cast) and e.dtype == dtype and d.kind in "iu" and d.itemsize < 4):
        return None
    lo, hi = d.limits
    outer = e.x
    if not (isinstance(outer, Call) and outer.fn in ("max", "min") and len(outer.args) == 2):
        return None
    inner = outer.args[1]
    if not (isinstance(inner, Call) and {outer.fn, inner.fn} == {"max", "min"}
            and len(inner.args) == 2):
        return None
    bounds = {outer.fn: outer.args[0], inner.fn: inner.args[0]}
    if not all(isinstance(b, Const) and isinstance(b.value, (int, float))
               and lo <= b.value <= hi for b in bounds.values()):
        return None
    return outer
