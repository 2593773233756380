"""C expressions: identifiers, literals, isl AST expressions and statement bodies.

Every printer returns a :class:`Piece`, the C text plus the precedence of its outermost
operator, so that parentheses are added only where C needs them (and where ``gcc -Wall``
asks for them: ``&&`` inside ``||``, a comparison inside a comparison).

Types follow :func:`polyc.expr.infer_dtype`; a subexpression whose dtype differs from
what its parent computes in is converted with an explicit cast, so C's own usual
arithmetic conversions never decide a result (``X[i] / D`` with ``D`` a size is
``X[i] / (float)D``). Untyped literals are printed directly in the type of their
context (``2.0f``, ``INFINITY``, ``INT32_MIN``).
"""
from __future__ import annotations

import functools
import math
import re
from typing import Any
from dataclasses import dataclass

import islpy as isl

from polyc import dtypes as D
from polyc import expr as E
from polyc.errors import InternalError

#: C type of each polyc dtype's stored elements (``bool`` from <stdbool.h> is C's ``_Bool``,
#: one byte like numpy's; float16 and bfloat16 their bits in a uint16_t)
CTYPES = {d.name: d.ctype for d in D.BY_NAME.values()}


def compute_ctype(dtype: str) -> str:
    """The C type a value of ``dtype`` is held in while computing (float for float16)."""
    d = D.get(dtype)
    return CTYPES[d.compute] if d.storage_only or (d.is_int and d.bits < 8) else d.ctype


def _tag(dtype: str) -> str:
    return dtype.replace("float", "f")


def converted(dtype: str) -> bool:
    """Elements of ``dtype`` are converted to compute with (:func:`load`, :func:`store`)."""
    d = D.get(dtype)
    return d.storage_only or (d.is_int and d.bits < 8)


def load(dtype: str, x: Piece) -> Piece:
    """A stored element ``x`` of ``dtype`` as a value to compute with."""
    d = D.get(dtype)
    if d.is_int and d.bits < 8:  # int4: the low bits of the byte, sign-extended
        mask, sign = (1 << d.bits) - 1, 1 << (d.bits - 1)
        if d.kind == "u":
            return Piece(f"({x.at(MUL)} & {mask})")
        return Piece(f"(((int32_t){x.at(PRIMARY)} & {mask}) ^ {sign}) - {sign}", ADD)
    tag = _conversion(dtype)
    return call(f"polyc_{tag}_load", x) if tag else x


def store(dtype: str, x: Piece) -> Piece:
    """A computed value ``x`` of ``dtype`` as the element to store (a value already
    rounded to ``dtype`` is stored without that rounding: rounding twice to one format
    is rounding once; an element of ``dtype`` loaded and stored unchanged is copied as
    its bits: a float16 transpose was 7x slower through the two conversions)."""
    d = D.get(dtype)
    if d.is_int and d.bits < 8:  # int4: its low bits (as ml_dtypes stores them)
        return Piece(f"({d.ctype})((uint32_t){x.at(PRIMARY)} & {(1 << d.bits) - 1}u)", UNARY)
    tag = _conversion(dtype)
    if not tag:
        return x
    copied = _called(x, f"polyc_{tag}_load")
    if copied is not None:  # an element of the same type copied: its bits
        return copied
    return call(f"polyc_{tag}_store", _called(x, _rounding(dtype)) or x)


def _rounding(dtype: str) -> str:
    """The helper that rounds a float to the storage-only float ``dtype``."""
    if D.get(dtype).minifloat:
        return f"polyc_{_tag(dtype)}_round"
    return f"polyc_round_{'f16' if dtype == 'float16' else 'bf16'}"


def _called(x: Piece, fn: str) -> Piece | None:
    """The argument of ``x`` when ``x`` is exactly one call of ``fn``, else None."""
    text = x.text
    if not (text.startswith(fn + "(") and text.endswith(")")):
        return None
    depth = 0
    for i, ch in enumerate(text[len(fn):], len(fn)):
        depth += ch == "("
        depth -= ch == ")"
        if depth == 0 and i != len(text) - 1:
            return None  # ``f(a) + f(b)``: not one call
    return Piece(text[len(fn) + 1:-1])


#: the helper rounding a row of floats to float16 in place, by the helper of one float
ROUND_ROWS = {"polyc_round_f16": "polyc_round_f16_row"}


def hoist_roundings(text: str, fn: str, temp: str) -> tuple[list[str], str] | None:
    """The C statement ``text`` with each call of ``fn`` (``fn(a)``, or ``(float)fn(a)``)
    replaced by ``temp.format(k)`` (an element of the ``k``-th temporary), innermost
    first: ``([a0, a1, ...], rest)``, where ``a<k>`` is the value to round into the
    ``k``-th temporary (it may read the ones before it), ``rest`` the statement that
    reads them. None where ``text`` calls no
    ``fn``, or where a call might not be evaluated (under ``?:``, ``&&`` or ``||``: its
    argument may read what a condition guards)."""
    if fn + "(" not in text or any(op in text for op in ("?", "&&", "||")):
        return None
    call_re = re.compile(r"(\(float\))?" + re.escape(fn) + r"\(")
    args: list[str] = []
    while True:
        for m in call_re.finditer(text):
            depth, j = 1, m.end()
            while depth:
                depth += (text[j] == "(") - (text[j] == ")")
                j += 1
            arg = text[m.end():j - 1]
            if fn + "(" not in arg:  # innermost
                text = text[:m.start()] + temp.format(len(args)) + text[j:]
                args.append(arg)
                break
        else:
            return args, text


#: helpers that map a value of any float format to a value of the same format (relu:
#: 0 or the value itself), so a rounding of their result to it changes nothing
_FORMAT_PRESERVING = ("polyc_reluf",)


def _rounded(x: Piece, fn: str) -> bool:
    """Whether ``x`` is a value already rounded by ``fn``: ``fn(y)``, or ``relu(fn(y))``."""
    if _called(x, fn) is not None:
        return True
    args = [_called(x, g) for g in _FORMAT_PRESERVING]
    return any(a is not None and _called(a, fn) is not None for a in args)


def _conversion(dtype: str) -> str | None:
    """The tag of a float type's conversion helpers (``polyc_<tag>_load``/``_store``)."""
    if D.get(dtype).minifloat:
        return _tag(dtype)
    return {"float16": "f16", "bfloat16": "bf16"}.get(dtype)

# -- identifiers ------------------------------------------------------------------------

_C_KEYWORDS = """auto break case char const continue default do double else enum extern float
for goto if inline int long register restrict return short signed sizeof static struct switch
typedef union unsigned void volatile while _Alignas _Alignof _Atomic _Bool _Complex _Generic
_Imaginary _Noreturn _Static_assert _Thread_local asm typeof alignas alignof bool true false
static_assert thread_local noreturn complex imaginary NULL main"""
#: C++'s keywords beyond C's: the CUDA target is C++, and C++ programs include the headers
_CXX_KEYWORDS = """and and_eq bitand bitor catch char8_t char16_t char32_t class compl concept
const_cast consteval constexpr constinit co_await co_return co_yield decltype delete
dynamic_cast explicit export friend mutable namespace new noexcept not not_eq nullptr
operator or or_eq private protected public reinterpret_cast requires static_cast template
this throw try typeid typename using virtual wchar_t xor xor_eq"""
_LIBC_NAMES = """int8_t int16_t int32_t int64_t uint8_t uint16_t uint32_t uint64_t intptr_t
uintptr_t size_t ptrdiff_t float_t double_t INT32_MIN INT32_MAX INT64_MIN INT64_MAX INT64_C
INFINITY NAN HUGE_VAL HUGE_VALF errno assert offsetof
malloc calloc realloc free aligned_alloc madvise abort exit atexit memset memcpy memmove memcmp
strlen abs labs llabs div ldiv rand srand qsort bsearch atoi atol atof strtod printf puts
acos acosh asin asinh atan atan2 atanh cbrt ceil copysign cos cosh erf erfc exp exp2 expm1
fabs fdim floor fma fmax fmin fmod frexp hypot ilogb ldexp lgamma llrint llround log log10
log1p log2 logb lrint lround modf nan nearbyint nextafter nexttoward pow remainder remquo
rint round scalbln scalbn sin sinh sqrt tan tanh tgamma trunc gamma j0 j1 jn y0 y1 yn
signbit isnan isinf isfinite isnormal fpclassify isgreater isless"""
_MATH_F = """acos acosh asin asinh atan atan2 atanh cbrt ceil copysign cos cosh erf erfc exp
exp2 expm1 fabs fdim floor fma fmax fmin fmod frexp hypot ldexp lgamma log log10 log1p log2
logb modf nearbyint nextafter pow remainder rint round sin sinh sqrt tan tanh tgamma trunc"""

#: names no generated identifier may take (C keywords, libc/libm names and macros)
RESERVED = frozenset(_C_KEYWORDS.split() + _CXX_KEYWORDS.split() + _LIBC_NAMES.split()
                     + [n + "f" for n in _MATH_F.split()] + [n + "l" for n in _MATH_F.split()])
#: prefixes owned by the generated prelude and by OpenMP
RESERVED_PREFIXES = ("polyc_", "omp_")
#: loop variables are c0, c1, ... (the isl schedule depth); user names never take that form
_LOOP_VAR = re.compile(r"c[0-9]+")


def sanitize(name: str) -> str:
    """A valid C identifier for ``name`` that is not reserved (not yet unique)."""
    s = re.sub(r"[^A-Za-z0-9_]", "_", name) or "v"
    if s[0].isdigit() or s[0] == "_":
        s = "v" + s
    if s in RESERVED or _LOOP_VAR.fullmatch(s) or s.startswith(RESERVED_PREFIXES):
        s += "_"
    return s


class Namer:
    """Gives each user name a distinct sanitised C identifier."""

    def __init__(self, taken: tuple[str, ...] | set[str] = ()) -> None:
        self.taken = set(taken)

    def fresh(self, name: str) -> str:
        base = sanitize(name)
        cand, i = base, 0
        while cand in self.taken:
            i += 1
            cand = f"{base}_{i}"
        self.taken.add(cand)
        return cand

    def child(self) -> Namer:
        """A namer for a nested scope: sees every name taken so far."""
        return Namer(self.taken)


def loop_var(depth: int) -> str:
    return f"c{depth}"


# -- pieces and literals ----------------------------------------------------------------

PRIMARY, UNARY, NEG_LITERAL, MUL, ADD, REL, EQ, AND, OR, COND = 16, 15, 14, 13, 12, 10, 9, 5, 4, 3
_PREC = {"*": MUL, "/": MUL, "%": MUL, "+": ADD, "-": ADD, "<": REL, ">": REL, "<=": REL,
         ">=": REL, "==": EQ, "!=": EQ, "&&": AND, "||": OR}


@dataclass(frozen=True)
class Piece:
    text: str
    prec: int = PRIMARY

    def at(self, need: int) -> str:
        """The text, parenthesised unless it binds at least as tightly as ``need``."""
        return self.text if self.prec >= need else f"({self.text})"


def binary(op: str, a: Piece, b: Piece) -> Piece:
    p = _PREC[op]
    if p in (AND, OR):        # gcc -Wparentheses: never mix && and || unparenthesised
        return Piece(f"{_logic_operand(a, p)} {op} {_logic_operand(b, p)}", p)
    if p in (REL, EQ):        # nor chain comparisons
        return Piece(f"{a.at(ADD)} {op} {b.at(ADD)}", p)
    return Piece(f"{a.at(p)} {op} {b.at(p + 1)}", p)


def _logic_operand(x: Piece, p: int) -> str:
    return x.text if x.prec == p or x.prec > AND else f"({x.text})"


def call(fn: str, *args: Piece) -> Piece:
    return Piece(f"{fn}({', '.join(a.text for a in args)})")


def cast(dtype: str, x: Piece) -> Piece:
    """``x`` converted to ``dtype``; to bool as ``x != 0`` (gcc warns on ``(bool)(a * b)``)."""
    if dtype == "bool":
        return binary("!=", x, Piece("0"))
    d = D.get(dtype)
    if d.minifloat or d.storage_only:  # rounded to the type, held as a float (once)
        return x if _rounded(x, _rounding(dtype)) else call(_rounding(dtype), x)
    if d.is_int and d.bits < 8:  # int4, uint2...: wrapped to their bits, one per byte
        mask, sign = (1 << d.bits) - 1, 1 << (d.bits - 1)
        if d.kind == "u":
            return Piece(f"({d.ctype})((uint32_t)(int32_t){x.at(PRIMARY)} & {mask}u)", UNARY)
        return Piece(f"({d.ctype})((((int32_t){x.at(PRIMARY)} & {mask}) ^ {sign}) - {sign})",
                     UNARY)
    return Piece(f"({CTYPES[dtype]}){x.at(PRIMARY)}", UNARY)


def select(c: Piece, a: Piece, b: Piece) -> Piece:
    return Piece(f"{c.at(OR)} ? {a.at(OR)} : {b.at(OR)}", COND)


_INT_LIMITS = {name: D.get(name).limits for name in D.INTS}


def literal(value: float | bool, dtype: str) -> Piece:
    """``value`` as a C constant of ``dtype``."""
    if dtype == "bool":
        return Piece("true" if value else "false")
    if dtype in _INT_LIMITS:
        lo, hi = _INT_LIMITS[dtype]
        tag = dtype.upper()
        unsigned = dtype.startswith("u")
        if isinstance(value, float) and not math.isfinite(value):
            if math.isnan(value):
                raise InternalError(f"NaN has no {dtype} value")
            if value < 0 and unsigned:
                return Piece("0")
            return Piece(f"{tag}_MAX" if value > 0 else f"{tag}_MIN",
                         PRIMARY if value > 0 else NEG_LITERAL)
        v = int(value)
        if v <= lo or v >= hi:
            if v not in (lo, hi):
                raise InternalError(f"literal {v} does not fit {dtype}")
            if not (unsigned and v == 0) and D.get(dtype).bits >= 32:
                return Piece(f"{tag}_MAX" if v == hi else f"{tag}_MIN")
        text = (str(v) if -2**31 < v < 2**31 else f"UINT64_C({v})" if v >= 2**63
                else f"INT64_C({v})")
        if unsigned and v >= 2**31:
            text = f"UINT{max(D.get(dtype).bits, 32)}_C({v})"
        return Piece(text, NEG_LITERAL if v < 0 else PRIMARY)
    f = float(value)
    single = dtype != "float64"
    if math.isnan(f):
        return Piece("NAN" if single else "(double)NAN", PRIMARY if single else UNARY)
    if math.isinf(f):
        text = "INFINITY" if single else "HUGE_VAL"
        return Piece(text if f > 0 else "-" + text, PRIMARY if f > 0 else NEG_LITERAL)
    text = repr(f) + ("f" if single else "")
    return Piece(text, NEG_LITERAL if text.startswith("-") else PRIMARY)


# -- isl AST expressions (loop bounds, guards, statement arguments: int64) ---------------

_ISL_BINARY = {"add": "+", "sub": "-", "mul": "*", "div": "/", "pdiv_q": "/", "pdiv_r": "%",
               "zdiv_r": "%", "eq": "==", "le": "<=", "lt": "<", "ge": ">=", "gt": ">",
               "and_": "&&", "and_then": "&&", "or_": "||", "or_else": "||"}


def isl_expr(e: isl.AstExpr, names: dict[str, str]) -> Piece:
    """C for an isl AST expression; ``names`` maps isl ids (sizes, loop iterators) to C."""
    t = e.get_type()
    if t == isl.ast_expr_type.int:
        return literal(int(e.get_val().to_python()), "int64")
    if t == isl.ast_expr_type.id:
        name = e.get_id().get_name()
        if name not in names:
            raise InternalError(f"isl AST uses an unknown identifier {name!r}")
        return Piece(names[name])
    op = e.get_op_type().name
    args = [isl_expr(e.get_op_arg(i), names) for i in range(e.get_op_n_arg())]
    if op in _ISL_BINARY:
        return binary(_ISL_BINARY[op], *args)
    if op == "minus":
        return Piece(f"-{args[0].at(PRIMARY)}", UNARY)
    if op in ("max", "min"):
        acc = args[0]
        for a in args[1:]:
            acc = call(f"polyc_{op}_i64", acc, a)
        return acc
    if op == "fdiv_q":
        return call("polyc_floord_i64", *args)
    if op in ("cond", "select"):
        return select(*args)
    raise InternalError(f"unsupported isl AST expression {e.to_C_str()!r} ({op})")


# -- statement bodies ---------------------------------------------------------------------

#: math built-ins printed as the libm function (``f`` suffix for float32)
_LIBM = {"exp", "log", "sqrt", "tanh", "fabs", "pow", "sin", "cos", "tan",
         "asin", "acos", "atan", "atan2", "sinh", "cosh", "asinh", "acosh", "atanh", "exp2",
         "expm1", "log2", "log10", "log1p", "cbrt", "erf", "erfc", "floor", "ceil", "trunc",
         "fmod", "hypot", "fma", "copysign"}
#: built-ins printed as a helper of the prelude, or as another libm function
_HELPER = {"sigmoid": "polyc_sigmoid", "relu": "polyc_relu", "rsqrt": "polyc_rsqrt",
           "round": "rint",  # rint: round half to even, as numpy does
           "fmax": "polyc_fmax", "fmin": "polyc_fmin"}  # fmax's semantics, vectorizable
#: the helpers' suffix of each integer dtype (narrow ones compute in 32 bits)
_SUFFIX = {name: ("_u" if name.startswith("u") else "_i") + D.get(name).compute[-2:]
           for name in D.INTS}


#: the integer types narrower than their computation (C's promotion to int), by the
#: suffix of their own max and min helpers
_NARROW_SUFFIX = {name: ("_u" if name.startswith("u") else "_i") + str(D.get(name).bits)
                  for name in D.INTS if D.get(name).bits in (8, 16)}


def float_fn(name: str, dtype: str) -> str:
    """The C name of a float function for ``dtype`` (``expf`` for float32 and float16)."""
    return name + ("f" if dtype != "float64" else "")


def _wraps(dtype: str) -> bool:
    """An integer dtype narrower than its arithmetic: results are wrapped back to it."""
    return D.get(dtype).is_int and D.get(dtype).compute != dtype


class BodyPrinter:
    """Prints the value and write of one statement instance.

    ``index_names`` maps the statement's iterators to C expressions (its local
    variables), ``size_names`` and ``array_names`` map user names to C identifiers.
    """

    def __init__(self, dtypes: dict[str, str], shapes: dict[str, tuple[E.Expr, ...]],
                 size_names: dict[str, str], array_names: dict[str, str],
                 index_names: dict[str, str]):
        self.dtypes, self.shapes = dtypes, shapes
        self.size_names, self.array_names, self.index_names = size_names, array_names, index_names
        #: arrays kept in a register tile's accumulator: array -> (C name, [(dim, offset)]
        #: or [(dim, offset, step)])
        self.promoted: dict[str, tuple[str, list[tuple[Any, ...]]]] = {}
        self._exact: E.Expr | None = None

    def dtype(self, e: E.Expr) -> str:
        return E.infer_dtype(e, self.dtypes)

    def expr(self, e: E.Expr, want: str, exact: bool = False) -> Piece:
        """``e`` as a C expression of type ``want``.

        float16 arithmetic rounds every result to float16, as float16 hardware (and
        numpy, and onnxruntime) does; with ``exact``, ``e``'s own arithmetic operation does
        not (a reduction's product, accumulated in float32 as BLAS libraries do)."""
        if exact:
            self._exact = e
        if isinstance(e, E.Const):
            v = e.value if e.dtype is None else _coerce(e.value, e.dtype)
            return literal(v, want)
        have = self.dtype(e)
        p = self._raw(e, have)
        if have == want or (D.get(have).storage_only and D.get(have).compute == want):
            return p  # a float16 value is held as a float already
        return cast(want, p)

    def element(self, array: str, indices: tuple[E.Expr, ...]) -> Piece:
        """``A[i*N + j]``: the row-major element of ``array``."""
        promoted = self.promoted.get(array)
        if promoted is not None:  # acc[i0 - lo0][i1 - lo1]: a register tile's element
            acc, dims = promoted   # ([(i - lo) / step] where a dimension has a step)
            return Piece(acc + "".join(
                f"[{self.expr(indices[d], 'int64').at(ADD)} - {lo}]" if not step else
                f"[({self.expr(indices[d], 'int64').at(ADD)} - {lo}) / {step[0]}]"
                for d, lo, *step in dims))
        extents = self.shapes[array]
        # an indirect index (a read of an int32 tensor...) is computed in its own type,
        # then widened: the element offset is int64 arithmetic
        indices = tuple(i if E.is_affine(i) or self.dtype(i) == "int64" else E.Cast("int64", i)
                        for i in indices)
        indices, extents = _unsplit(tuple(indices), tuple(extents))
        lin: E.Expr = indices[0] if indices else E.Const(0)
        for idx, ext in zip(indices[1:], extents[1:]):
            lin = E.Binary("+", E.Binary("*", lin, ext), idx)
        return Piece(f"{self.array_names[array]}[{self.expr(lin, 'int64').text}]")

    def _narrow(self, e: E.Expr) -> str | None:
        """The 8- or 16-bit integer type every value of ``e`` belongs to: its own, or that
        of all operands of a max or min (which C's promotion computes in 32 bits)."""
        t = self._own(e)
        if t in _NARROW_SUFFIX:
            return t
        if isinstance(e, E.Call) and e.fn in ("max", "min") and e.args:
            ts = {self._narrow(a) for a in e.args}
            if len(ts) == 1:
                return ts.pop()
        return None

    def _raw(self, e: E.Expr, t: str) -> Piece:
        if isinstance(e, E.Index):
            return Piece(self.index_names[e.name])
        if isinstance(e, E.Size):
            return Piece(self.size_names[e.name])
        if isinstance(e, E.Read):
            element = self.element(e.array, e.indices)
            return element if e.array in self.promoted else load(t, element)
        if isinstance(e, E.Cast):
            clamped = E.clamped_narrowing(e, e.dtype)
            wide = self.clamp(clamped) if clamped is not None else None
            if wide is not None:  # through int32 (the same value: it is in range), which
                # gcc 12 narrows in vectors (vpmovdb); a float to byte conversion it
                # juggles through mask registers, 3x slower
                return cast(e.dtype, cast("int32", wide))
            return cast(e.dtype, self.expr(e.x, self._own(e.x)))
        if isinstance(e, E.Unary):
            if e.op == "!" or t == "bool":
                return Piece(f"!{self.expr(e.x, self._own(e.x)).at(PRIMARY)}", UNARY)
            if _wraps(t):
                u = D.get(t).compute
                return cast(t, Piece(f"-{self.expr(e.x, u).at(PRIMARY)}", UNARY))
            return Piece(f"-{self.expr(e.x, t).at(PRIMARY)}", UNARY)
        if isinstance(e, E.Binary):
            if _wraps(t) and e.op not in E.COMPARISONS:
                return cast(t, self._binary(e, D.get(t).compute))
            if self._rounds(e, t) and e.op not in E.COMPARISONS:
                return cast(t, self._binary(e, t))
            return self._binary(e, t)
        if isinstance(e, E.Select):
            return select(self.expr(e.cond, self._own(e.cond)), self.expr(e.a, t),
                          self.expr(e.b, t))
        if isinstance(e, E.Call) and e.fn in E.BITCASTS:
            return self._bitcast(e, t)
        if isinstance(e, E.Call):
            if _wraps(t):
                return cast(t, self._call(e, D.get(t).compute))
            if D.get(t).storage_only and e.fn not in ("max", "min", "abs", "fabs", "relu"):
                return cast(t, self._call(e, t))
            return self._call(e, t)
        raise InternalError(f"cannot print expression {e!r}")

    def clamp(self, clamped: E.Call) -> Piece | None:
        """A :func:`polyc.expr.clamped_narrowing` value as one ``polyc_clamp_hi`` / ``_lo`` call (a
        vminps and a vmaxps; the NaN-aware ``polyc_fmaxf(lo, polyc_fminf(hi, x))`` it
        replaces gives the same value once converted); None for other float types."""
        t = self.dtype(clamped)
        suffix = {"float32": "f", "float64": ""}.get(t)
        if suffix is None:
            return None
        inner = clamped.args[1]
        lo, hi = (clamped.args[0], inner.args[0]) if clamped.fn == "max" else \
            (inner.args[0], clamped.args[0])
        fn = ("polyc_clamp_hi" if clamped.fn == "max" else "polyc_clamp_lo") + suffix
        rounded = _rounded_sum(inner.args[1], self.dtype)
        if rounded is None or not CLAMP_BEFORE_ROUNDING or \
                not all(float(b.value).is_integer() for b in (lo, hi)):
            return call(fn, self.expr(inner.args[1], t), self.expr(lo, t), self.expr(hi, t))
        # ``clamp(rint(y) + c, lo, hi)`` as ``rint(clamp(y, lo - c, hi - c)) + c``: equal
        # when lo, hi and c are integers that float holds exactly (rint is monotone and
        # keeps integers; NaN gives hi either way), and gcc 12 then keeps the clamp a
        # compare and blend in float; clamped after rint, it pushed the blends past the
        # int conversion into mask registers (a QDQ residual sum 0.33 -> 0.25 ms)
        y, c = rounded
        point = c.x if isinstance(c, E.Cast) else c  # (the zero point: a literal, or not)
        floor = float(lo.value) - (0.0 if point is None else float(point.value)
                                   if isinstance(point, E.Const) else float("nan"))
        if floor >= 0 and DROP_CLAMPED_RELU:
            y = _without_relu(y, t, self.dtype)
        rint = float_fn("rint", t)
        if c is None:
            return call(rint, call(fn, self.expr(y, t), self.expr(lo, t), self.expr(hi, t)))
        cp = self.expr(c, t)
        bound = [binary("-", self.expr(b, t), cp) for b in (lo, hi)]
        return binary("+", call(rint, call(fn, self.expr(y, t), *bound)), cp)

    def _bitcast(self, e: E.Call, t: str) -> Piece:
        """The bits of the operand (in its stored form) read as ``t`` (same width)."""
        (x,) = e.args
        s = self._own(x)
        if D.get(s).itemsize != D.get(t).itemsize or D.get(s).bits != D.get(t).bits:
            raise InternalError(f"bit cast of {s} to {t}: widths differ")
        v = self.expr(x, s)
        if converted(s):
            v = store(s, v)
        src, dst = CTYPES[s], CTYPES[t]
        raw = Piece(f"({{ {src} polyc_v = {v.text}; {dst} polyc_r; "
                    f"memcpy(&polyc_r, &polyc_v, sizeof polyc_r); polyc_r; }})")
        return load(t, raw) if converted(t) else raw

    def _rounds(self, e: E.Expr, t: str) -> bool:
        return D.get(t).storage_only and e is not self._exact

    def _own(self, e: E.Expr) -> str:
        """The type to print a truth value or cast operand in (literals: bool or their own)."""
        if isinstance(e, E.Const) and e.dtype is None:
            return "bool" if isinstance(e.value, bool) else ("int32" if isinstance(e.value, int)
                                                             else "float32")
        return self.dtype(e)

    def _binary(self, e: E.Binary, t: str) -> Piece:
        op = e.op
        if op in ("&&", "||"):
            return binary(op, self.expr(e.a, self._own(e.a)), self.expr(e.b, self._own(e.b)))
        if op in E.COMPARISONS:
            u = self.dtype(E.Binary("+", e.a, e.b))
            return binary(op, self.expr(e.a, u), self.expr(e.b, u))
        a, b = self.expr(e.a, t), self.expr(e.b, t)
        if t == "bool":  # numpy: + is or, * is and, - is xor
            return binary({"+": "||", "*": "&&"}.get(op, "!="), a, b)
        if op == "//":
            return (call("polyc_floord" + _SUFFIX[t], a, b) if t in _SUFFIX
                    else call(float_fn("floor", t), binary("/", a, b)))
        if op == "%":
            return call("polyc_mod" + _SUFFIX.get(t, "f" if t != "float64" else ""), a, b)
        if op == "/" and t in _SUFFIX:  # total: no trap on 0 nor on INT_MIN / -1
            return call("polyc_div" + _SUFFIX[t], a, b)
        return binary(op, a, b)

    def _call(self, e: E.Call, t: str) -> Piece:
        fn = e.fn
        narrow = self._narrow(e) if fn in ("max", "min") and t in _SUFFIX else None
        if narrow is not None:
            # of bytes (or 16-bit values): in their own type (the same value, one of the
            # operands), which gcc vectorizes as bytes; promoted, in 32-bit lanes (a
            # uint8 max pool: 4x the instructions)
            return call(f"polyc_{fn}{_NARROW_SUFFIX[narrow]}",
                        *[self._call(a, narrow) if isinstance(a, E.Call) and
                          a.fn in ("max", "min") and self._own(a) != narrow else
                          self.expr(a, narrow) for a in e.args])
        args = [self.expr(a, t) for a in e.args]
        if t == "bool":  # max/min/abs/relu of truth values
            return binary({"max": "||", "min": "&&"}[fn], *args) if fn in ("max", "min") \
                else args[0]
        if fn in E.BIT_OPS:
            if t not in _SUFFIX:
                raise InternalError(f"{fn} of a {t} value (integers only)")
            return _bit_op(fn, t, args)
        if t in _SUFFIX:  # integer max/min/abs/relu
            if fn == "relu":
                return call("polyc_max" + _SUFFIX[t], args[0], literal(0, t))
            return call(f"polyc_{fn}{_SUFFIX[t]}", *args)
        if fn in ("max", "min"):
            fn = "f" + fn
        elif fn == "abs":
            fn = "fabs"
        if fn in _LIBM:
            return call(float_fn(fn, t), *args)
        if fn in _HELPER:
            return call(float_fn(_HELPER[fn], t), *args)
        raise InternalError(f"unknown built-in function {fn!r}")


def _bit_op(fn: str, t: str, args: list[Piece]) -> Piece:
    if fn == "bitnot":
        return Piece(f"~{args[0].at(PRIMARY)}", UNARY)
    if fn in ("bitand", "bitor", "bitxor"):  # & | ^ bind looser than comparisons: parenthesise
        op = {"bitand": "&", "bitor": "|", "bitxor": "^"}[fn]
        return Piece(f"({args[0].at(MUL)} {op} {args[1].at(MUL)})")
    # as ONNX's BitShift: a count outside [0, width) gives 0 (a negative value shifted
    # right: -1); a signed value shifts left as its unsigned bits (no overflow)
    a, b = args
    d = D.get(t)
    in_range = binary("<", b, Piece(str(d.bits)))
    if d.kind == "i":
        in_range = binary("&&", binary(">=", b, Piece("0")), in_range)
    if fn == "shl":
        shifted = (Piece(f"({CTYPES[t]})((u{CTYPES[t]}){a.at(PRIMARY)} << {b.at(MUL)})", UNARY)
                   if d.kind == "i" else Piece(f"({a.at(MUL)} << {b.at(MUL)})"))
        return select(in_range, shifted, literal(0, t))
    shifted = Piece(f"({a.at(MUL)} >> {b.at(MUL)})")
    out = select(binary("<", a, Piece("0")), literal(-1, t), literal(0, t)) \
        if d.kind == "i" else literal(0, t)
    return select(in_range, shifted, Piece(f"({out.text})"))


def _coerce(value: float | bool, dtype: str) -> int | float | bool:
    if dtype == "bool":
        return bool(value)
    if dtype in _INT_LIMITS and math.isfinite(value):
        return int(value)
    return value


def update(op: str, target: Piece, value: Piece, dtype: str, stored: bool = True) -> str:
    """The C statement ``target OP= value`` of a statement with combine operator ``op``.

    ``target`` is an element of an array of ``dtype`` (``stored``), or an accumulator
    held in the type it computes in (a register tile's)."""
    if stored and converted(dtype):  # float16, int4...: widen, combine, narrow back
        old = load(dtype, target)
        if op != "=":
            if op in ("+", "*"):
                value = binary(op, old, value)
            elif dtype in _SUFFIX:
                value = call(f"polyc_{op}{_SUFFIX[dtype]}", old, value)
            else:
                value = call(float_fn(_HELPER["f" + op], dtype), old, value)
        return f"{target.text} = {store(dtype, value).text}"
    if op == "=":
        return f"{target.text} = {value.text}"
    if dtype == "bool":
        logic = {"+": "||", "max": "||", "*": "&&", "min": "&&"}[op]
        return f"{target.text} = {binary(logic, target, value).text}"
    if op in ("+", "*"):
        return f"{target.text} {op}= {value.text}"
    if op in ("max", "min"):
        fn = (f"polyc_{op}{_SUFFIX[dtype]}" if dtype in _SUFFIX
              else float_fn(_HELPER["f" + op], dtype))
        return f"{target.text} = {call(fn, target, value).text}"
    raise InternalError(f"unknown statement operator {op!r}")


#: the float16/bfloat16 conversions (name -> C definition), for the C prelude and as
#: CUDA device functions
CONVERSIONS: dict[str, str] = {
    "polyc_f16_load": """\
/* float16 is stored as its bits and computed in float. The conversions are exact
   (rounding to nearest even; subnormals, infinities and NaN kept) and branch-free,
   so that gcc vectorizes them (it does not vectorize _Float16's without AVX512-FP16)
   */
static inline float polyc_f16_load(uint16_t h)
{
  const uint32_t em = h & 0x7fffu, bits = em << 13;
  float f;
  memcpy(&f, &bits, sizeof f);
  f *= 0x1p112f;  /* re-biases the exponent; a subnormal comes out right too */
  uint32_t r;
  memcpy(&r, &f, sizeof r);
  r = em >= 0x7c00u ? (bits | 0x7f800000u) : r;  /* infinity, NaN */
  r |= (uint32_t)(h & 0x8000u) << 16;
  memcpy(&f, &r, sizeof f);
  return f;
}""",
    "polyc_f16_store": """\
static inline uint16_t polyc_f16_store(float x)
{
  uint32_t u, sub_bits;
  memcpy(&u, &x, sizeof u);
  const uint32_t sign = u & 0x80000000u, a = u ^ sign, magic = 126u << 23;
  float fa, fm;
  memcpy(&fa, &a, sizeof fa);
  memcpy(&fm, &magic, sizeof fm);
  const float sub = fa + fm;  /* a subnormal result: the FPU rounds it */
  memcpy(&sub_bits, &sub, sizeof sub_bits);
  const uint32_t normal = (a + 0xc8000fffu + ((a >> 13) & 1u)) >> 13;
  const uint32_t o = a >= 0x47800000u ? (a > 0x7f800000u ? 0x7e00u : 0x7c00u)
                     : (a < 0x38800000u ? sub_bits - magic : normal);
  return (uint16_t)(o | (sign >> 16));
}""",
    "polyc_round_f16": """\
/* a float rounded to the nearest float16 (ties to even), kept in a float: the same bits
   as polyc_f16_load(polyc_f16_store(x)) for every float (checked over all 2^32), in a
   third of the operations. Adding s, the power of two whose float ulp is x's float16
   ulp (2^-24 at the least: float16's subnormals), rounds x there; a magnitude from
   65520 on is infinity, a NaN the quiet NaN */
static inline float polyc_round_f16(float x)
{
  uint32_t u, rb;
  memcpy(&u, &x, sizeof u);
  const uint32_t sign = u & 0x80000000u, a = u ^ sign, e = a & 0x7f800000u;
  const uint32_t sb = (e > (113u << 23) ? e : (113u << 23)) + (13u << 23);
  float s, ax;
  memcpy(&s, &sb, sizeof s);
  memcpy(&ax, &a, sizeof ax);
  const float r = (ax + s) - s;
  memcpy(&rb, &r, sizeof rb);
  rb = a >= 0x477ff000u ? (a > 0x7f800000u ? 0x7fc00000u : 0x7f800000u) : rb;
  rb |= sign;
  memcpy(&x, &rb, sizeof x);
  return x;
}""",
    "polyc_bf16_load": """\
/* bfloat16: the high half of a float's bits; rounded to nearest even, NaN kept */
static inline float polyc_bf16_load(uint16_t h)
{
  uint32_t u = (uint32_t)h << 16;
  float f;
  memcpy(&f, &u, sizeof f);
  return f;
}""",
    "polyc_bf16_store": """\
static inline uint16_t polyc_bf16_store(float f)
{
  uint32_t u;
  memcpy(&u, &f, sizeof u);
  if ((u & 0x7fffffffu) > 0x7f800000u)
    return (uint16_t)((u >> 16) | 0x40u);
  return (uint16_t)((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
}""",
    "polyc_round_bf16": """\
static inline float polyc_round_bf16(float f) { return polyc_bf16_load(polyc_bf16_store(f)); }""",
}


#: libm functions glibc's libmvec has vector variants of (float and double), by the
#: glibc release that added them
#: (not the two-argument ones, pow, atan2 and hypot: gcc 12 crashes on a powf declared so
#: whose exponent is a constant, LRN's ``powf(x, 0.5f)``)
LIBMVEC = {(2, 22): ("exp", "log", "sin", "cos"),
           (2, 35): ("acos", "acosh", "asin", "asinh", "atan", "atanh", "cbrt", "cosh",
                     "erf", "erfc", "exp10", "exp2", "expm1", "log10", "log1p", "log2",
                     "sinh", "tan", "tanh")}


def _libmvec_declarations() -> list[str]:
    """libm's functions declared ``omp declare simd`` where glibc's libmvec has their
    vector variants: gcc then calls those in SIMD loops (``_ZGVeN16v_erff``, 16 lanes,
    within 4 ulp) instead of one scalar call per element. glibc's own math.h declares
    them so only under -ffast-math; the BERT layer's GELU spent 10% of its time in
    scalar erff."""
    lines = ["/* libm's vector variants (glibc's libmvec) for gcc's SIMD loops */",
             "#if defined(__x86_64__) && defined(__GLIBC__) && defined(_OPENMP) \\",
             "    && !defined(__FAST_MATH__)",
             '#define POLYC_SIMD_DECL _Pragma("omp declare simd notinbranch")']
    for (major, minor), names in LIBMVEC.items():
        lines.append(f"#if __GLIBC__ > {major} || (__GLIBC__ == {major} && "
                     f"__GLIBC_MINOR__ >= {minor})")
        for name in names:
            for ct, sfx in (("float", "f"), ("double", "")):
                lines.append(f"POLYC_SIMD_DECL extern {ct} {name}{sfx}({ct});")
        lines.append("#endif")
    return lines + ["#endif"]


#: blocks of at least this many bytes get transparent huge pages asked for
#: (:func:`_alloc_helper`)
HUGE_PAGE_MIN_BYTES = 4 << 20


def _alloc_helper(huge_pages: bool) -> list[str]:
    """``polyc_alloc(bytes)``: a 64-byte aligned block of ``bytes`` (rounded up to 64).

    A block of :data:`HUGE_PAGE_MIN_BYTES` or more (a matmul's packed panels, a model's
    weights and its arena) is aligned to 2 MiB and advised ``MADV_HUGEPAGE``: numpy does
    the same for its arrays, and with 4 KiB pages the packed panels of a 3000-square
    matmul cost 2% of its time on one thread (TLB misses on Zen 5). Only on Linux for
    x86-64 and AArch64, whose ``MADV_HUGEPAGE`` is 14, declared here rather than taken
    from <sys/mman.h>: under ``-std=c11`` that header hides ``madvise``, and a feature
    macro would have to precede every include of the file. A hint only: where the kernel
    has transparent huge pages off, the pages stay small."""
    lines = ["/* a 64-byte aligned block of bytes (rounded up to 64); a big one on 2 MiB",
             "   boundaries with transparent huge pages asked for (fewer TLB misses) */"]
    if huge_pages:
        lines += [
            "#if defined(__linux__) && (defined(__x86_64__) || defined(__aarch64__))",
            "extern int madvise(void *, size_t, int);",
            "#define POLYC_HUGE_PAGE ((size_t)2 << 20)",
            "#endif"]
    lines += [
        "__attribute__((unused)) static void *polyc_alloc(size_t bytes)",
        "{",
        "#ifdef POLYC_HUGE_PAGE",
        f"  if (bytes >= (size_t){HUGE_PAGE_MIN_BYTES}u) {{",
        "    const size_t rounded = (bytes + POLYC_HUGE_PAGE - 1) & ~(POLYC_HUGE_PAGE - 1);",
        "    void *p = aligned_alloc(POLYC_HUGE_PAGE, rounded);",
        "    if (p)",
        "      (void)madvise(p, rounded, 14);  /* MADV_HUGEPAGE */",
        "    return p;",
        "  }",
        "#endif",
        "  return aligned_alloc(64, (bytes + 63) & ~(size_t)63);",
        "}"]
    return lines


def _prelude(huge_pages: bool = True) -> str:
    lines = [
        "#include <stdint.h>", "#include <stdbool.h>", "#include <stdlib.h>",
        "#include <string.h>", "#include <math.h>", "#include <pthread.h>", "",
        *_libmvec_declarations(), "",
        "/* helpers: floor division and modulo round towards -infinity (as in isl and Python) */"]
    # integer division and modulo are total: by 0 they give 0 (as numpy), and the signed
    # INT_MIN / -1 wraps (as numpy): the C operators trap on both (SIGFPE)
    for ct, sfx in (("uint32_t", "_u32"), ("uint64_t", "_u64")):
        lines += [
            f"static inline {ct} polyc_div{sfx}({ct} a, {ct} b) {{ return b == 0 ? 0 : a / b; }}",
            f"static inline {ct} polyc_floord{sfx}({ct} a, {ct} b) {{ return b == 0 ? 0 : a / b; }}",
            f"static inline {ct} polyc_mod{sfx}({ct} a, {ct} b) {{ return b == 0 ? 0 : a % b; }}",
            f"static inline {ct} polyc_min{sfx}({ct} a, {ct} b) {{ return a < b ? a : b; }}",
            f"static inline {ct} polyc_max{sfx}({ct} a, {ct} b) {{ return a > b ? a : b; }}",
            f"static inline {ct} polyc_abs{sfx}({ct} a) {{ return a; }}"]
    for name, sfx in _NARROW_SUFFIX.items():
        ct = CTYPES[name]
        lines += [
            f"static inline {ct} polyc_min{sfx}({ct} a, {ct} b) {{ return a < b ? a : b; }}",
            f"static inline {ct} polyc_max{sfx}({ct} a, {ct} b) {{ return a > b ? a : b; }}"]
    for ct, sfx, uct in (("int32_t", "_i32", "uint32_t"), ("int64_t", "_i64", "uint64_t")):
        neg = f"({ct})(({uct})0 - ({uct})a)"  # -a, wrapping
        lines += [
            (f"static inline {ct} polyc_div{sfx}({ct} a, {ct} b) "
             f"{{ return b == 0 ? 0 : b == -1 ? {neg} : a / b; }}"),
            (f"static inline {ct} polyc_floord{sfx}({ct} a, {ct} b) "
             f"{{ return b == 0 ? 0 : b == -1 ? {neg} : "
             "a / b - (a % b != 0 && (a < 0) != (b < 0)); }"),
            (f"static inline {ct} polyc_mod{sfx}({ct} a, {ct} b) "
             f"{{ if (b == 0 || b == -1) return 0; const {ct} r = a % b; "
             "return r != 0 && (r < 0) != (b < 0) ? r + b : r; }"),
            f"static inline {ct} polyc_min{sfx}({ct} a, {ct} b) {{ return a < b ? a : b; }}",
            f"static inline {ct} polyc_max{sfx}({ct} a, {ct} b) {{ return a > b ? a : b; }}",
            f"static inline {ct} polyc_abs{sfx}({ct} a) {{ return a < 0 ? -a : a; }}"]
    for ct, f in (("float", "f"), ("double", "")):
        one, zero = ("1.0f", "0.0f") if f else ("1.0", "0.0")
        lines += [
            f"static inline {ct} polyc_sigmoid{f}({ct} x) {{ return {one} / ({one} + exp{f}(-x)); }}",
            # ``x < 0 ? 0 : x`` (NaN and -0 kept, as numpy's maximum), written as a
            # vmaxps and a fix-up: the one select, gcc 12 carried its mask into the
            # operations that follow (masked divisions, masks spilled): a QDQ residual sum
            # 10% slower
            (f"static inline {ct} polyc_relu{f}({ct} x) "
             f"{{ const {ct} m = x > {zero} ? x : {zero}; "
             f"return (x != x || x == {zero}) ? x : m; }}"),
            f"static inline {ct} polyc_rsqrt{f}({ct} x) {{ return {one} / sqrt{f}(x); }}",
            # fmax/fmin (a NaN operand yields the other) as selects that gcc vectorizes,
            # and keeps branch-free in scalar code: without -ffinite-math-only, fmaxf()
            # is a libm call per element
            (f"static inline {ct} polyc_fmax{f}({ct} a, {ct} b) "
             f"{{ const {ct} m = a > b ? a : b; return b != b ? a : m; }}"),
            (f"static inline {ct} polyc_fmin{f}({ct} a, {ct} b) "
             f"{{ const {ct} m = a < b ? a : b; return b != b ? a : m; }}"),
            # max(lo, min(hi, x)) and min(hi, max(lo, x)) of constants lo <= hi, for a
            # value then converted to an integer (a zero's sign is lost anyway): NaN
            # gives hi, resp. lo, as the fmax/fmin above; one vminpd and one vmaxpd
            (f"static inline {ct} polyc_clamp_hi{f}({ct} x, {ct} lo, {ct} hi) "
             f"{{ const {ct} t = x < hi ? x : hi; return t > lo ? t : lo; }}"),
            (f"static inline {ct} polyc_clamp_lo{f}({ct} x, {ct} lo, {ct} hi) "
             f"{{ const {ct} t = x > lo ? x : lo; return t < hi ? t : hi; }}"),
            # floor modulo: the result has the divisor's sign, a zero result too (as
            # Python's and numpy's: -0.5 % 0.5 is +0.0, which copysign can see)
            (f"static inline {ct} polyc_mod{f}({ct} a, {ct} b) "
             f"{{ const {ct} r = fmod{f}(a, b); return r == {zero} ? copysign{f}({zero}, b) "
             f": (r < {zero}) != (b < {zero}) ? r + b : r; }}")]
    lines += [
        *[line for text in CONVERSIONS.values() for line in text.splitlines()],
        "/* bytes for count elements of elem bytes, rounded up to 64 */",
        "static inline size_t polyc_bytes(int64_t count, size_t elem)",
        "{",
        "  return ((size_t)count * elem + 63) & ~(size_t)63;",
        "}",
        *_alloc_helper(huge_pages),
        "/* a kernel's temporaries live in a per-thread scratch block that is kept between",
        "   calls: a fresh allocation of megabytes costs a page fault per 4 KB on every call",
        "   (glibc returns large blocks to the system). The block is thread-local; a",
        "   pthread key (when one can be had: a process has about a thousand, and every",
        "   polyc library takes one) frees it when its thread ends, and unloading the",
        "   library frees the unloading thread's. NULL when memory runs out. */",
        "typedef struct { void *data; size_t bytes; } polyc_scratch_block;",
        "static __thread polyc_scratch_block polyc_scratch_mine;",
        "static pthread_key_t polyc_scratch_key;",
        "static pthread_once_t polyc_scratch_once = PTHREAD_ONCE_INIT;",
        "static int polyc_scratch_ok;",
        "static void polyc_scratch_release(void *block)",
        "{",
        "  polyc_scratch_block *b = (polyc_scratch_block *)block;",
        "  free(b->data);",
        "  b->data = NULL;",
        "  b->bytes = 0;",
        "}",
        "static void polyc_scratch_setup(void)",
        "{",
        "  polyc_scratch_ok = pthread_key_create(&polyc_scratch_key, polyc_scratch_release) == 0;",
        "}",
        "__attribute__((destructor, unused)) static void polyc_scratch_unload(void)",
        "{",
        "  polyc_scratch_release(&polyc_scratch_mine);",
        "  if (polyc_scratch_ok) {",
        "    pthread_key_delete(polyc_scratch_key);",
        "    polyc_scratch_ok = 0;",
        "  }",
        "}",
        "__attribute__((unused)) static void *polyc_scratch(size_t bytes)",
        "{",
        "  polyc_scratch_block *b = &polyc_scratch_mine;",
        "  if (bytes == 0)  /* only empty temporaries: still a valid block */",
        "    bytes = 64;",
        "  if (b->bytes < bytes) {",
        "    if (!b->data) {  /* this thread's first block: have it freed at thread exit */",
        "      pthread_once(&polyc_scratch_once, polyc_scratch_setup);",
        "      if (polyc_scratch_ok)",
        "        pthread_setspecific(polyc_scratch_key, b);",
        "    }",
        "    free(b->data);",
        "    b->bytes = 0;",
        "    if (!(b->data = polyc_alloc(bytes)))",
        "      return NULL;",
        "    b->bytes = bytes;",
        "  }",
        "  return b->data;",
        "}"]
    return "\n".join(lines)


#: includes and helper functions at the top of every generated file
PRELUDE = _prelude()


#: the helpers of the VNNI code of byte dot products (``polyc.codegen.c_family``)
VNNI_HELPERS = """#if defined(__AVX512VNNI__) && defined(__AVX512F__)
#include <immintrin.h>
/* the first n (clamped to 0..16) of 16 lanes */
__attribute__((unused)) static inline __mmask16 polyc_lanes16(int64_t n)
{
  return n <= 0 ? (__mmask16)0 : n >= 16 ? (__mmask16)0xFFFF : (__mmask16)((1u << n) - 1u);
}
/* four bytes at p in every 32-bit lane */
__attribute__((unused)) static inline __m512i polyc_bcast4(const void *p)
{
  int32_t v;
  memcpy(&v, p, 4);
  return _mm512_set1_epi32(v);
}
#endif"""


def vnni_kernel_name(mr: int, nv: int, x_step: int, w_step: int, w_row: int,
                     partial: bool = False, signed_lanes: bool = False) -> str:
    """The VNNI micro-kernel (:func:`vnni_kernel`) of ``mr`` rows of ``nv`` vectors
    whose lanes move ``x_step`` bytes a step and whose weights move ``w_step`` bytes a
    step and ``w_row`` bytes a row (``partial``: for fewer rows than ``mr``;
    ``signed_lanes``: the lanes are the int8 operand, the broadcast the uint8 one)."""
    return (f"polyc_vnni_{mr}x{nv}_x{x_step}_w{w_step}_r{w_row}"
            f"{'_s' if signed_lanes else ''}{'_part' if partial else ''}")


_VNNI_NAME = re.compile(
    r"polyc_vnni_([0-9]+)x([0-9]+)_x([0-9]+)_w([0-9]+)_r([0-9]+)(_s)?(_part)?")


def vnni_operand_types(signed_lanes: bool) -> tuple[str, str]:
    """The C types of a VNNI micro-kernel's lanes and broadcast operands."""
    return ("int8_t", "uint8_t") if signed_lanes else ("uint8_t", "int8_t")


#: how far ahead (in cycles of ``vpdpbusd`` issue, at about two a cycle) a VNNI
#: micro-kernel prefetches its lanes operand (:func:`vnni_prefetch_steps`)
VNNI_PREFETCH_CYCLES = 160


def vnni_prefetch_steps(mr: int, nv: int) -> int:
    """Steps ahead of the current one whose lanes a VNNI micro-kernel prefetches.

    The lanes operand (the weights of a conv) is the stream of a register tile: one
    ``nv``-vector run per step, a weight row apart. When a layer's weights are larger
    than the L2 (ResNet-50's last 3x3 convs: 2.4 MB of int8), the first row tile of
    each cache tile reads its panel from memory, and the hardware prefetcher, which
    sees one short run per page-sized stride, leaves most of that latency exposed:
    measured on a Zen 5 EPYC with the weights cold, the 7x7x512 3x3 conv ran at 440
    GOPS, 800-880 with the runs prefetched 16-24 steps ahead (990 with them in cache,
    where the prefetches cost nothing measurable). Between 4 and 32 steps."""
    return min(32, max(4, VNNI_PREFETCH_CYCLES * 2 // (mr * nv)))


def vnni_kernel(mr: int, nv: int, x_step: int, w_step: int, w_row: int,
                partial: bool = False, signed_lanes: bool = False) -> str:
    """The C of a register tile's byte dot products on AVX-512 VNNI::

        acc[i][16 j + l] += sum_{s < steps} sum_{r < 4} x[s*XS + 64 j + 4 l + r] * w[s*WS + i*WR + r]

    for the ``mr x nv`` vectors of int32 sums of ``acc`` (rows of ``16 nv``) and the lanes
    of vector ``j`` that ``lanes[j]`` selects (the others add 0). One ``vpdpbusd`` a
    vector and step, the accumulators in registers: one loop, in a function of its own
    (gcc 12 kept copies of the accumulators in other registers and on the stack when
    the loop shared a function with other code, or with a second loop, 2x slower). The
    ``partial`` kernel takes the rows below ``rows`` (the others repeat row 0: a partial
    tile reads no weight past its last row). ``noipa``: a copy specialised to a call's
    constant trip count had the copies again. ``x`` is uint8 and ``w`` int8, or with
    ``signed_lanes`` the other way round (``vpdpbusd`` takes its unsigned bytes first)."""
    acc = [(i, j) for i in range(mr) for j in range(nv)]
    v = ", ".join(f"a{i}_{j} = _mm512_load_si512(acc + {i * nv * 16 + 16 * j})" for i, j in acc)
    ks = ", ".join(f"k{j} = lanes[{j}]" for j in range(nv))
    xs = ", ".join(f"x{j} = _mm512_maskz_loadu_epi32(k{j}, x + {64 * j})" for j in range(nv))
    ahead = vnni_prefetch_steps(mr, nv) * x_step
    body = [*(f"    _mm_prefetch((const char *)x + {ahead + 64 * j}, _MM_HINT_T0);"
              for j in range(nv)),
            f"    const __m512i {xs};", "    __m512i b;"]
    for i in range(mr):
        body.append(f"    b = polyc_bcast4(w + {f'o{i}' if partial else i * w_row});")
        body += [f"    a{i}_{j} = _mm512_dpbusd_epi32(a{i}_{j}, "
                 f"{f'b, x{j}' if signed_lanes else f'x{j}, b'});" for j in range(nv)]
    offsets = ", ".join(f"o{i} = (int64_t)({i} < rows ? {i} : 0) * {w_row}" for i in range(mr))
    xt, wt = vnni_operand_types(signed_lanes)
    name = vnni_kernel_name(mr, nv, x_step, w_step, w_row, partial, signed_lanes)
    lines = [
        f"__attribute__((noipa, unused)) static void {name}(int32_t *restrict acc, "
        f"const {xt} *restrict x, const {wt} *restrict w, int64_t steps, "
        "const __mmask16 *restrict lanes, int64_t rows)",
        "{",
        f"  const __mmask16 {ks};",
        f"  const int64_t {offsets};" if partial else "  (void)rows;",
        f"  __m512i {v};",
        f"  for (int64_t s = 0; s < steps; s++, x += {x_step}, w += {w_step}) {{",
        *body,
        "  }",
        *[f"  _mm512_store_si512(acc + {i * nv * 16 + 16 * j}, a{i}_{j});" for i, j in acc],
        "}"]
    return "\n".join(lines)


#: :data:`ROUND_ROWS`' helper, for the prelude of a text that calls it
ROUND_ROW_HELPER = """/* a row of n floats rounded to float16 in place: polyc_round_f16 of each (the same
   value; a NaN stays a NaN, its payload kept in the vector lanes), with F16C's
   conversions where the target has them: two instructions for 16 floats where
   polyc_round_f16 takes a dozen (gcc 12 vectorizes neither _Float16's conversions nor
   __builtin_convertvector to them) */
#if defined(__AVX512F__) || defined(__F16C__)
#include <immintrin.h>
#endif
static inline void polyc_round_f16_row(float *p, int64_t n)
{
  int64_t i = 0;
#if defined(__AVX512F__)
/* (an immediate: the intrinsic is a macro without optimisation, -O0) */
#define POLYC_RNE (_MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC)
  for (; i + 16 <= n; i += 16)
    _mm512_storeu_ps(p + i, _mm512_cvtph_ps(_mm512_cvtps_ph(_mm512_loadu_ps(p + i),
                                                            POLYC_RNE)));
  if (i < n) {
    const __mmask16 m = (__mmask16)((1u << (n - i)) - 1u);
    _mm512_mask_storeu_ps(p + i, m, _mm512_cvtph_ps(
        _mm512_cvtps_ph(_mm512_maskz_loadu_ps(m, p + i), POLYC_RNE)));
    i = n;
  }
#undef POLYC_RNE
#elif defined(__F16C__)
  for (; i + 8 <= n; i += 8)
    _mm256_storeu_ps(p + i, _mm256_cvtph_ps(_mm256_cvtps_ph(_mm256_loadu_ps(p + i),
                                                            _MM_FROUND_TO_NEAREST_INT)));
#endif
  for (; i < n; i++)
    p[i] = polyc_round_f16(p[i]);
}"""


_TRANSPOSE_NAME = re.compile(r"polyc_transpose_(f32|f64)x(\d+)\(")
#: a gcc vector type the code names (:func:`vector_types`)
_VECTOR_NAME = re.compile(r"\bpolyc_(f32|f64)x(\d+)\b")


@functools.lru_cache(maxsize=None)
def vector_types(kind: str, lanes: int) -> str:
    """gcc's vector type of ``lanes`` floats (``kind`` f32 or f64),
    ``polyc_<kind>x<lanes>``, and the vector of as many integers of their width that
    indexes a ``__builtin_shuffle`` of two of them (``polyc_<kind>x<lanes>_index``);
    gcc only."""
    ctype = "float" if kind == "f32" else "double"
    itype = "int32_t" if kind == "f32" else "int64_t"
    vec, idx = f"polyc_{kind}x{lanes}", f"polyc_{kind}x{lanes}_index"
    size = lanes * (4 if kind == "f32" else 8)
    return "\n".join(["#if defined(__GNUC__) && !defined(__clang__)",
                      f"typedef {ctype} {vec} __attribute__((vector_size({size})));",
                      f"typedef {itype} {idx} __attribute__((vector_size({size})));",
                      "#endif"])


def shuffle_index(kind: str, lanes: int, first: int) -> str:
    """The index vector of a ``__builtin_shuffle(a, b, ...)`` that takes ``lanes``
    consecutive elements of ``a`` followed by ``b`` from element ``first`` on (0 is
    ``a`` itself, ``lanes`` is ``b``): gcc prints an ``valignd`` / ``vpalignr`` /
    ``vpermt2ps``."""
    return f"(polyc_{kind}x{lanes}_index){{{', '.join(str(first + l) for l in range(lanes))}}}"


@functools.lru_cache(maxsize=None)
def transpose_helper(kind: str, lanes: int) -> str:
    """The in-place transpose of a ``lanes x lanes`` block of :func:`vector_types`
    vectors (``polyc_transpose_<kind>x<lanes>``: ``v[r][l]`` becomes ``v[l][r]``), for
    the rows-only dot tiles of ``polyc.codegen.c_family``. Stage ``s`` (``lanes/2`` down
    to 1) swaps bit ``s`` of the row with bit ``s`` of the lane: for each pair of rows
    ``r`` and ``r + s`` (bit ``s`` of ``r`` clear) two two-vector shuffles,
    ``lanes * log2(lanes)`` in all; gcc picks the instructions (``vpermt2ps``,
    ``vshuff32x4``, ``vshufps``...)."""
    vec, idx = f"polyc_{kind}x{lanes}", f"polyc_{kind}x{lanes}_index"
    lines = ["#if defined(__GNUC__) && !defined(__clang__)",
             f"static inline __attribute__((always_inline)) void "
             f"polyc_transpose_{kind}x{lanes}({vec} *v)", "{", f"  {vec} a, b;"]
    s = lanes // 2
    while s:
        low = [l if not l & s else lanes + l - s for l in range(lanes)]
        high = [l + s if not l & s else lanes + l for l in range(lanes)]
        for r in range(lanes):
            if r & s:
                continue
            lines.append(f"  a = v[{r}]; b = v[{r + s}];")
            lines.append(f"  v[{r}] = __builtin_shuffle(a, b, ({idx}){{"
                         f"{', '.join(map(str, low))}}});")
            lines.append(f"  v[{r + s}] = __builtin_shuffle(a, b, ({idx}){{"
                         f"{', '.join(map(str, high))}}});")
        s //= 2
    return "\n".join(lines + ["}", "#endif"])


def prelude_for(text: str) -> str:
    """:data:`PRELUDE`, and the conversions of the minifloat types ``text`` uses (and the
    VNNI micro-kernels and the float16 row rounding it calls)."""
    extra = [_minifloat_helpers(name) for name in D.FLOATS
             if D.get(name).minifloat and f"polyc_{_tag(name)}_" in text]
    kernels = sorted({(*(int(g) for g in m.groups()[:5]), bool(m.group(7)), bool(m.group(6)))
                      for m in _VNNI_NAME.finditer(text)})
    if ROUND_ROWS["polyc_round_f16"] + "(" in text:
        extra.append(ROUND_ROW_HELPER)
    extra += [vector_types(kind, int(lanes))
              for kind, lanes in sorted({m.groups() for m in _VECTOR_NAME.finditer(text)})]
    extra += [transpose_helper(kind, int(lanes))
              for kind, lanes in sorted({m.groups() for m in _TRANSPOSE_NAME.finditer(text)})]
    if kernels:
        extra.append(VNNI_HELPERS.replace(
            "#endif", "\n".join(vnni_kernel(*k) for k in kernels) + "\n#endif"))
    return "\n".join([PRELUDE, *extra])


@functools.lru_cache(maxsize=None)
def _minifloat_helpers(dtype: str) -> str:
    """Tables and functions converting ``dtype`` (a float8 or float4 type) to and from
    float, computed from ml_dtypes' own conversions: a read looks its code up; a write
    finds the nearest of the sorted non-negative values (ties to the even code), and a
    magnitude past the largest one rounds to it or overflows (to infinity where the type
    has one, else NaN) as ml_dtypes' rounding does."""
    import numpy as np
    d = D.get(dtype)
    t = "polyc_" + _tag(dtype)
    ncodes = 1 << d.bits
    values = np.arange(ncodes, dtype=np.uint8).view(d.numpy).astype(np.float32)
    finite = [(float(v), c) for c, v in enumerate(values)
              if np.isfinite(v) and not np.signbit(v)]
    finite.sort()
    pos = [v for v, _ in finite]
    codes = [c for _, c in finite]
    top = pos[-1]
    # the overflow threshold: the smallest float32 above the largest value that does not
    # convert back to it
    def stays(bits: int) -> bool:
        x = np.array([bits], np.uint32).view(np.float32)
        return bool(x.astype(d.numpy).astype(np.float32)[0] == top)
    lo_bits = int(np.array([top], np.float32).view(np.uint32)[0])
    hi_bits = 0x7F800000  # +inf
    if stays(hi_bits):  # the type saturates (float4e2m1): nothing overflows
        over = "INFINITY"
    else:
        while hi_bits - lo_bits > 1:  # lo stays, hi overflows
            mid = (lo_bits + hi_bits) // 2
            lo_bits, hi_bits = (mid, hi_bits) if stays(mid) else (lo_bits, mid)
        over = repr(float(np.array([hi_bits], np.uint32).view(np.float32)[0])) + "f"
    nan = [c for c, v in enumerate(values) if np.isnan(v)]
    neg_zero = [c for c, v in enumerate(values) if v == 0 and np.signbit(v)]
    inf = [c for c, v in enumerate(values) if np.isinf(v) and v > 0]
    big = inf[0] if inf else (nan[0] if nan else codes[-1])
    sign_bit = 1 << (d.bits - 1)
    nan_code = nan[0] if nan else 0
    nan_result = int(np.array([np.nan], np.float32).astype(d.numpy).view(np.uint8)[0])
    def fmt(v: float) -> str:
        if np.isnan(v):
            return "NAN"
        if np.isinf(v):
            return "INFINITY" if v > 0 else "-INFINITY"
        return repr(v) + "f"
    unused = "__attribute__((unused)) static const"
    lines = [
        f"{unused} float {t}_values[{ncodes}] = {{{', '.join(fmt(float(v)) for v in values)}}};",
        f"{unused} float {t}_pos[{len(pos)}] = {{{', '.join(fmt(v) for v in pos)}}};",
        f"{unused} uint8_t {t}_code[{len(pos)}] = {{{', '.join(map(str, codes))}}};",
        f"static inline float {t}_load(uint8_t c) {{ return {t}_values[c & {ncodes - 1}]; }}",
        f"static inline uint8_t {t}_store(float f)",
        "{",
        f"  if (f != f) return {nan_result};",
        "  const int neg = signbit(f) != 0;",
        "  const float a = fabsf(f);",
        "  uint8_t c;",
        f"  if (a >= {over}) c = {big};",
        "  else {",
        f"    int lo = 0, hi = {len(pos) - 1};",
        "    while (lo < hi) {  /* the last value <= a */",
        "      const int mid = (lo + hi + 1) / 2;",
        f"      if ({t}_pos[mid] <= a) lo = mid; else hi = mid - 1;",
        "    }",
        f"    c = {t}_code[lo];",
        f"    if (lo + 1 < {len(pos)}) {{",
        f"      const float down = a - {t}_pos[lo], up = {t}_pos[lo + 1] - a;",
        f"      if (up < down || (up == down && ({t}_code[lo] & 1)))",
        f"        c = {t}_code[lo + 1];",
        "    }",
        "  }",
    ]
    # the sign bit; a type without a negative zero (fnuz) has 0 for -0, and NaN stays NaN
    keep = (f" && c != {nan_code}" if nan else "") + ("" if neg_zero else " && c != 0")
    lines.append(f"  if (neg{keep}) c |= {sign_bit};")
    lines += ["  return c;", "}",
              f"static inline float {t}_round(float f) {{ return {t}_load({t}_store(f)); }}"]
    return "\n".join(lines)


def _unsplit(indices: tuple[E.Expr, ...], extents: tuple[E.Expr, ...]
             ) -> tuple[tuple[E.Expr, ...], tuple[E.Expr, ...]]:
    """Adjacent indices ``x // c, x % c`` over a last extent of ``c`` (a channel ``m``
    read from blocks ``(m / 64, m % 64)``) address element ``x`` of the two dimensions
    merged: ``(x // c) * c + x % c == x`` for every integer ``x`` (floor division, the
    remainder of the divisor's sign). One index, not a division and a remainder per
    element: the loop over ``x`` reads contiguously and vectorizes."""
    out_i, out_e = list(indices[:1]), list(extents[:1])
    for idx, ext in zip(indices[1:], extents[1:]):
        prev = out_i[-1] if out_i else None
        if isinstance(idx, E.Binary) and idx.op == "%" and isinstance(idx.b, E.Const) \
                and idx.b.value > 0 and ext == idx.b and isinstance(prev, E.Binary) \
                and prev.op == "//" and prev.a == idx.a and prev.b == idx.b:
            out_i[-1] = idx.a
            out_e[-1] = E.Binary("*", out_e[-1], ext)
            continue
        out_i.append(idx)
        out_e.append(ext)
    return tuple(out_i), tuple(out_e)


#: print a clamped narrowing of a rounded value with the clamp inside the rounding
#: (:meth:`BodyPrinter.clamp`)
CLAMP_BEFORE_ROUNDING = True


#: drop a relu that a clamp at a bound of at least zero makes redundant
#: (:func:`_without_relu`; a switch for measurements)
DROP_CLAMPED_RELU = True


def _without_relu(y: E.Expr, t: str, dtype_of) -> E.Expr:
    """``y`` (of float type ``t``) without its outer ``relu``, seen through divisions and
    multiplications by positive constants (``relu(a + b) / s``), for a value clamped
    below at a bound of at least zero: the clamp gives the same for every ``x``.
    Positive ``x`` and NaN pass both; a negative ``x``, or ``-inf``, becomes 0 under the
    relu and stays at most -0 without it, and the clamp takes either to its lower bound;
    relu keeps -0 as it is. A QDQ residual sum ``rint(clamp(relu(a + b) / s, 0, 255))``
    then keeps no NaN-aware compare-and-blend chain: 0.83x of the time of its loop
    (Zen 5, 401408 elements, the same bytes out). ``y`` itself where there is no such
    relu."""
    def bare(e):
        return e.x if isinstance(e, E.Cast) and e.dtype == t and dtype_of(e.x) == t else e

    def positive(e):
        e = bare(e)
        return isinstance(e, E.Const) and isinstance(e.value, (int, float)) \
            and not isinstance(e.value, bool) and e.value > 0 and math.isfinite(e.value)

    e = bare(y)
    if isinstance(e, E.Call) and e.fn == "relu" and len(e.args) == 1 \
            and dtype_of(e.args[0]) == t:
        return e.args[0]
    if isinstance(e, E.Binary) and dtype_of(e) == t:
        if e.op in ("/", "*") and positive(e.b):
            inner = _without_relu(e.a, t, dtype_of)
            return y if inner is e.a else E.Binary(e.op, inner, e.b)
        if e.op == "*" and positive(e.a):
            inner = _without_relu(e.b, t, dtype_of)
            return y if inner is e.b else E.Binary(e.op, e.a, inner)
    return y


def _rounded_sum(x: E.Expr, dtype_of) -> tuple[E.Expr, E.Expr | None] | None:
    """``(y, c)`` when ``x`` is ``round(y) + c`` (or ``c + round(y)``; ``c`` None for a
    bare ``round(y)`` or a literal zero) with ``c`` an integer of at most 16 bits: a
    literal, or a value of an integer type that narrow (a zero point); else None."""
    def bare(e):  # without a conversion to its own type
        return e.x if isinstance(e, E.Cast) and e.dtype == dtype_of(e.x) else e

    def is_round(e):
        e = bare(e)
        return isinstance(e, E.Call) and e.fn == "round" and len(e.args) == 1

    def small_integer(e):
        if isinstance(e, E.Cast):
            e = e.x
        if isinstance(e, E.Const):
            return isinstance(e.value, (int, float)) and not isinstance(e.value, bool) \
                and float(e.value).is_integer() and abs(e.value) <= 1 << 16
        d = D.get(dtype_of(e))
        return d.is_int and d.bits <= 16
    x = bare(x)
    if is_round(x):
        return bare(x).args[0], None
    if isinstance(x, E.Binary) and x.op == "+":
        for r, c in ((x.a, x.b), (x.b, x.a)):
            if is_round(r) and small_integer(c):
                literal = c.x if isinstance(c, E.Cast) else c
                zero = isinstance(literal, E.Const) and literal.value == 0
                return bare(r).args[0], None if zero else c
    return None
