"""An interpreter of TC semantics in plain numpy: the oracle of the differential fuzzer.

Written independently of polyc (it imports neither ``polyc`` nor ``frontend``). It holds
the fuzzer's own AST of TC programs, its printer and parser (the generator builds ASTs;
reproducers are replayed from source), and :func:`run`, which executes a ``def`` on numpy
arrays with the concrete sizes bound from them:

* statements run in program order; a statement's indices are its LHS indices followed
  by the reduction indices (indices on the RHS not on the LHS, by first appearance);
* range inference is TC's, with integer arithmetic (see :meth:`Machine.ranges`);
* a tensor written for the first time gets the shape ``max(hi, 0)`` of its LHS indices
  and the dtype of the value (polyc's documented ``infer_dtype`` rules); outputs start
  as zeros, temporaries undefined (reading an element nobody wrote is an invalid program);
* the iteration domain is the box of the ranges where every unconditional read (and
  ``exists`` access) is in bounds; guarded reads must be in bounds wherever evaluated;
* ``!`` first sets the LHS box to the reduction identity; arithmetic is done in the
  inferred dtypes as C does (float32 in float32, integer ``/`` truncating), except
  ``%``, which is polyc's floor modulo (the result has the divisor's sign, as in index
  expressions, Python and ONNX's Mod) for integers and floats alike.

Anything that makes a program invalid (an out-of-bounds evaluated read, an unranged index,
integer overflow or division by zero, a float->int conversion out of range...) raises
:class:`Invalid`: the case is skipped, it says nothing about polyc. ``wide=True`` runs the
same program with float32 computed in float64 and float64 in long double: elements that
differ between the two runs are numerically unstable and are not compared.
"""
from __future__ import annotations

import math
import re
from dataclasses import dataclass
from typing import Union

import numpy as np

# ======================================================================================
# AST
# ======================================================================================


@dataclass(frozen=True)
class Num:
    value: Union[int, float]      # non-negative; a float prints with a '.'


@dataclass(frozen=True)
class Name:
    name: str                     # index, size, rank-0 tensor or let-binding


@dataclass(frozen=True)
class Read:
    tensor: str
    args: tuple


@dataclass(frozen=True)
class Dim:
    tensor: str
    k: int


@dataclass(frozen=True)
class Un:
    op: str                       # '-' or '!'
    x: object


@dataclass(frozen=True)
class Bin:
    op: str
    a: object
    b: object


@dataclass(frozen=True)
class Tern:
    c: object
    a: object
    b: object


@dataclass(frozen=True)
class Call:
    fn: str
    args: tuple


@dataclass(frozen=True)
class Cast:
    ty: str
    x: object


@dataclass(frozen=True)
class RangeC:
    index: str
    lo: object
    hi: object


@dataclass(frozen=True)
class ExistsC:
    tensor: str
    args: tuple


@dataclass(frozen=True)
class LetC:
    name: str
    value: object


@dataclass(frozen=True)
class Stmt:
    tensor: str
    indices: tuple
    op: str
    rhs: object
    clauses: tuple = ()


@dataclass(frozen=True)
class Param:
    ty: str
    dims: Union[tuple, None]      # None: rank 0; items: size name (str) or literal (int)
    name: str


@dataclass(frozen=True)
class Ret:
    name: str
    ty: Union[str, None] = None
    dims: Union[tuple, None] = None


@dataclass(frozen=True)
class Def:
    name: str
    params: tuple
    rets: tuple
    body: tuple


TYPES = {"float": "float32", "float32": "float32", "double": "float64", "float64": "float64",
         "int32": "int32", "int64": "int64", "bool": "bool"}
INT_LIMITS = {"int32": (-2 ** 31, 2 ** 31 - 1), "int64": (-2 ** 63, 2 ** 63 - 1)}

# ======================================================================================
# printer
# ======================================================================================

_LEVEL = {"||": 1, "&&": 2, "==": 3, "!=": 3, "<": 4, ">": 4, "<=": 4, ">=": 4,
          "+": 5, "-": 5, "*": 6, "/": 6, "%": 6}


def _prec(e) -> int:
    if isinstance(e, Tern):
        return 0
    if isinstance(e, Bin):
        return _LEVEL[e.op]
    if isinstance(e, Un):
        return 7
    return 8


def show(e, need: int = 0) -> str:
    """TC text of an expression, parenthesised only where the grammar needs it."""
    if isinstance(e, Num):
        s = repr(e.value)
    elif isinstance(e, Name):
        s = e.name
    elif isinstance(e, Read):
        s = f"{e.tensor}({', '.join(show(a) for a in e.args)})" if e.args else e.tensor
    elif isinstance(e, Dim):
        s = f"{e.tensor}.{e.k}"
    elif isinstance(e, Un):
        inner = show(e.x, 7)
        if isinstance(e.x, Un) or inner.startswith(("-", "!")):
            inner = f"({inner})"
        s = e.op + inner
    elif isinstance(e, Bin):
        p = _LEVEL[e.op]
        s = f"{show(e.a, p)} {e.op} {show(e.b, p + 1)}"
    elif isinstance(e, Tern):
        s = f"{show(e.c, 1)} ? {show(e.a)} : {show(e.b)}"
    elif isinstance(e, Call):
        s = f"{e.fn}({', '.join(show(a) for a in e.args)})"
    elif isinstance(e, Cast):
        s = f"{e.ty}({show(e.x)})"
    else:
        raise TypeError(e)
    return f"({s})" if _prec(e) < need else s


def show_clause(c) -> str:
    if isinstance(c, RangeC):
        return f"{c.index} in {show(c.lo, 1)}:{show(c.hi, 1)}"
    if isinstance(c, ExistsC):
        return f"exists {c.tensor}({', '.join(show(a) for a in c.args)})"
    return f"{c.name} = {show(c.value)}"


def show_stmt(s: Stmt) -> str:
    lhs = f"{s.tensor}({', '.join(s.indices)})" if s.indices else s.tensor
    text = f"{lhs} {s.op} {show(s.rhs)}"
    if s.clauses:
        text += " where " + ", ".join(show_clause(c) for c in s.clauses)
    return text


def _show_type(ty: str, dims) -> str:
    return ty if dims is None else f"{ty}({', '.join(str(d) for d in dims)})"


def show_def(d: Def) -> str:
    params = ", ".join(f"{_show_type(p.ty, p.dims)} {p.name}" for p in d.params)
    rets = [r.name if r.ty is None else f"{_show_type(r.ty, r.dims)} {r.name}" for r in d.rets]
    rets_s = rets[0] if len(rets) == 1 and d.rets[0].ty is None and len(d.name) % 2 else \
        f"({', '.join(rets)})"
    body = "".join(f"  {show_stmt(s)}\n" for s in d.body)
    return f"def {d.name}({params}) -> {rets_s} {{\n{body}}}\n"


def show_source(defs) -> str:
    return "\n".join(show_def(d) for d in defs)

# ======================================================================================
# parser (of the language the printer writes; used to replay reproducers)
# ======================================================================================


_TOKEN = re.compile(r"""\s+|\#[^\n]*
  |(?P<num>\d+\.\d*(?:[eE][-+]?\d+)?|\d+[eE][-+]?\d+|\d+)
  |(?P<op>\+=!|\*=!|min=!|max=!|\+=|\*=|min=|max=|->|==|!=|<=|>=|&&|\|\||[-+*/%<>=!?:(),.{}])
  |(?P<name>[A-Za-z_]\w*)""", re.X)


class SyntaxErr(Exception):
    pass


class _Parser:
    def __init__(self, text: str):
        self.toks: list[tuple[str, str]] = []
        pos = 0
        while pos < len(text):
            m = _TOKEN.match(text, pos)
            if not m:
                raise SyntaxErr(f"bad character at {pos}: {text[pos:pos + 10]!r}")
            pos = m.end()
            if m.lastgroup:
                self.toks.append((m.lastgroup, m.group(m.lastgroup)))
        self.toks.append(("eof", ""))
        self.i = 0

    def peek(self, k=0):
        return self.toks[min(self.i + k, len(self.toks) - 1)]

    def at(self, *texts):
        t = self.peek()
        return t[0] != "num" and t[1] in texts

    def take(self, text=None):
        t = self.peek()
        if text is not None and (t[1] != text or t[0] == "num"):
            raise SyntaxErr(f"expected {text!r}, got {t[1]!r}")
        self.i += 1
        return t[1]

    def name(self):
        t = self.peek()
        if t[0] != "name":
            raise SyntaxErr(f"expected a name, got {t[1]!r}")
        self.i += 1
        return t[1]

    def defs(self):
        out = []
        while self.peek()[0] != "eof":
            out.append(self.definition())
        return out

    def comma(self, close, item):
        items = []
        if self.at(close):
            self.take(close)
            return tuple(items)
        items.append(item())
        while self.at(","):
            self.take(",")
            items.append(item())
        self.take(close)
        return tuple(items)

    def dims(self):
        def dim():
            t = self.peek()
            self.i += 1
            return int(t[1]) if t[0] == "num" else t[1]
        if self.at("("):
            self.take("(")
            return self.comma(")", dim)
        return None

    def definition(self):
        self.take("def")
        name = self.name()
        self.take("(")

        def param():
            ty = self.name()
            dims = self.dims()
            return Param(ty, dims, self.name())

        params = self.comma(")", param)
        self.take("->")

        def ret():
            if self.peek()[1] in TYPES and (self.peek(1)[1] == "(" or self.peek(1)[0] == "name"):
                ty = self.name()
                dims = self.dims()
                return Ret(self.name(), ty, dims)
            return Ret(self.name())

        if self.at("("):
            self.take("(")
            rets = self.comma(")", ret)
        else:
            rets = (ret(),)
        self.take("{")
        body = []
        while not self.at("}"):
            body.append(self.statement())
        self.take("}")
        return Def(name, params, rets, tuple(body))

    def statement(self):
        t = self.name()
        idx = ()
        if self.at("("):
            self.take("(")
            idx = self.comma(")", self.name)
        op = self.take()
        rhs = self.expr()
        clauses = []
        if self.at("where") and self.peek()[0] == "name":
            self.take("where")
            clauses.append(self.clause())
            while self.at(","):
                self.take(",")
                clauses.append(self.clause())
        return Stmt(t, idx, op, rhs, tuple(clauses))

    def clause(self):
        if self.at("exists"):
            self.take("exists")
            n = self.name()
            self.take("(")
            return ExistsC(n, self.comma(")", self.expr))
        n = self.name()
        if self.at("in"):
            self.take("in")
            lo = self.binary(1)
            self.take(":")
            return RangeC(n, lo, self.binary(1))
        self.take("=")
        return LetC(n, self.expr())

    def expr(self):
        c = self.binary(1)
        if not self.at("?"):
            return c
        self.take("?")
        a = self.expr()
        self.take(":")
        return Tern(c, a, self.expr())

    def binary(self, level):
        if level == 7:
            return self.unary()
        a = self.binary(level + 1)
        while self.peek()[0] == "op" and _LEVEL.get(self.peek()[1]) == level:
            op = self.take()
            a = Bin(op, a, self.binary(level + 1))
        return a

    def unary(self):
        if self.at("-", "!"):
            op = self.take()
            return Un(op, self.unary())
        return self.postfix()

    def postfix(self):
        t = self.peek()
        if t[0] == "num":
            self.i += 1
            return Num(float(t[1]) if any(c in t[1] for c in ".eE") else int(t[1]))
        if self.at("("):
            self.take("(")
            e = self.expr()
            self.take(")")
            return e
        n = self.name()
        if self.at("("):
            self.take("(")
            args = self.comma(")", self.expr)
            if n in TYPES:
                return Cast(n, args[0])
            if n in FUNCS or n in ("max", "min"):
                return Call(n, args)
            return Read(n, args)
        if self.at("."):
            self.take(".")
            return Dim(n, int(self.take()))
        return Name(n)


def parse(text: str) -> list[Def]:
    return _Parser(text).defs()

# ======================================================================================
# dtypes (polyc's documented rules: bool < int32 < int64 < float32 < float64; literals,
# sizes and indices are "weak" and never widen a typed operand)
# ======================================================================================


_RANK = {"bool": 0, "int32": 1, "int64": 2, "float32": 3, "float64": 4}
COMPARE = ("==", "!=", "<", ">", "<=", ">=", "&&", "||")


def _promote(a, b):
    return a if _RANK[a] >= _RANK[b] else b


def _join(x, y):
    (a, wa), (b, wb) = x, y
    if wa and not wb:
        return (_promote(b, "float32") if a.startswith("float") and not b.startswith("float")
                else b), False
    if wb and not wa:
        return (_promote(a, "float32") if b.startswith("float") and not a.startswith("float")
                else a), False
    return _promote(a, b), wa and wb


# resolved expression nodes (names bound)
@dataclass(frozen=True)
class Lit:
    value: Union[int, float, bool]


@dataclass(frozen=True)
class Idx:
    name: str


@dataclass(frozen=True)
class SizeV:
    value: int
    dtype: str        # int64 for a size variable, int32 for a literal extent (T.k)


@dataclass(frozen=True)
class RRead:
    tensor: str
    args: tuple


# ======================================================================================
# numeric helpers
# ======================================================================================

def _erf(x):
    return np.vectorize(math.erf, otypes=[np.float64])(x.astype(np.float64))


def _erfc(x):
    return np.vectorize(math.erfc, otypes=[np.float64])(x.astype(np.float64))


def _fma(a, b, c):
    wide = np.longdouble
    return a.astype(wide) * b.astype(wide) + c.astype(wide)


#: float built-ins: numpy implementation (computed in the argument dtype unless noted)
FUNCS = {
    "exp": np.exp, "log": np.log, "sqrt": np.sqrt, "tanh": np.tanh,
    "sigmoid": lambda x: x.dtype.type(1) / (x.dtype.type(1) + np.exp(-x)),
    "abs": np.abs, "fabs": np.abs, "fmax": np.fmax, "fmin": np.fmin, "pow": np.power,
    "max": np.fmax, "min": np.fmin, "sin": np.sin, "cos": np.cos, "tan": np.tan,
    "asin": np.arcsin, "acos": np.arccos, "atan": np.arctan, "atan2": np.arctan2,
    "sinh": np.sinh, "cosh": np.cosh, "asinh": np.arcsinh, "acosh": np.arccosh,
    "atanh": np.arctanh, "exp2": np.exp2, "expm1": np.expm1, "log2": np.log2,
    "log10": np.log10, "log1p": np.log1p, "cbrt": np.cbrt,
    "rsqrt": lambda x: x.dtype.type(1) / np.sqrt(x), "erf": _erf, "erfc": _erfc,
    "floor": np.floor, "ceil": np.ceil, "round": np.rint, "trunc": np.trunc,
    "fmod": np.fmod, "hypot": np.hypot, "fma": _fma, "copysign": np.copysign,
    "relu": lambda x: np.where(x < 0, x.dtype.type(0), x),
}
ARITY = {"fmax": 2, "fmin": 2, "pow": 2, "max": 2, "min": 2, "atan2": 2, "fmod": 2,
         "hypot": 2, "copysign": 2, "fma": 3}


class Invalid(Exception):
    """The program (with these inputs) is not a valid TC program: skip the case."""


@dataclass
class Tensor:
    name: str
    dtype: Union[str, None]
    role: str                          # input, output, temp
    data: Union[np.ndarray, None] = None
    defined: Union[np.ndarray, None] = None
    dims: Union[tuple, None] = None    # declared dims (size names / literals), if any


def _identity(op, dtype):
    if dtype == "bool":
        return op in ("*", "min")
    if dtype in INT_LIMITS:
        lo, hi = INT_LIMITS[dtype]
        return {"+": 0, "*": 1, "min": hi, "max": lo}[op]
    return {"+": 0.0, "*": 1.0, "min": math.inf, "max": -math.inf}[op]


class Machine:
    """Runs the statements of one ``def`` on concrete inputs."""

    def __init__(self, d: Def, inputs, wide: bool = False):
        self.d, self.wide = d, wide
        self.sizes: dict[str, int] = {}
        self.tensors: dict[str, Tensor] = {}
        if len(inputs) != len(d.params):
            raise Invalid("wrong number of inputs")
        for p, a in zip(d.params, inputs):
            dtype = TYPES[p.ty]
            a = np.asarray(a)
            if a.dtype != np.dtype(dtype):
                raise Invalid(f"input {p.name} has dtype {a.dtype}, expected {dtype}")
            dims = p.dims or ()
            if a.ndim != len(dims):
                raise Invalid(f"input {p.name} has rank {a.ndim}")
            for dm, n in zip(dims, a.shape):
                self._bind(dm, n)
            data = a.astype(self.np(dtype))
            self.tensors[p.name] = Tensor(p.name, dtype, "input", data, np.ones(a.shape, bool),
                                          dims)
        for r in d.rets:
            t = Tensor(r.name, TYPES[r.ty] if r.ty else None, "output", dims=r.dims)
            if r.ty is not None:
                dims = r.dims or ()
                for dm in dims:
                    if isinstance(dm, str) and dm not in self.sizes:
                        raise Invalid(f"size {dm} of output {r.name} is not bound by an input")
                shape = tuple(self.sizes[dm] if isinstance(dm, str) else dm for dm in dims)
                t.data = np.zeros(shape, self.np(t.dtype))
                t.defined = np.ones(shape, bool)
            self.tensors[r.name] = t

    def _bind(self, dm, n):
        if isinstance(dm, int):
            if dm != n:
                raise Invalid(f"literal size {dm} != {n}")
        elif self.sizes.setdefault(dm, n) != n:
            raise Invalid(f"size {dm} bound to {self.sizes[dm]} and {n}")

    def np(self, dtype):
        """The numpy type computations of ``dtype`` are done in."""
        if self.wide and dtype == "float32":
            return np.float64
        if self.wide and dtype == "float64":
            return np.longdouble
        return np.dtype(dtype).type

    def run(self):
        for s in self.d.body:
            self.statement(s)
        outs = []
        for r in self.d.rets:
            t = self.tensors[r.name]
            if t.data is None:
                raise Invalid(f"output {r.name} is never written")
            outs.append(t.data)
        return outs

    # -- names ------------------------------------------------------------------------

    def resolve(self, e, lets, order, seen_lets=()):
        """AST -> resolved tree; ``order`` collects index names by first appearance."""
        R = lambda x: self.resolve(x, lets, order, seen_lets)  # noqa: E731
        if isinstance(e, Num):
            return Lit(e.value)
        if isinstance(e, Name):
            n = e.name
            if n in lets:
                if n in seen_lets:
                    raise Invalid(f"let {n} refers to itself")
                return self.resolve(lets[n], lets, order, seen_lets + (n,))
            if n in self.tensors:
                return self.read(n, ())
            if n in self.sizes:
                return SizeV(self.sizes[n], "int64")
            if n not in order:
                order.append(n)
            return Idx(n)
        if isinstance(e, Read):
            if e.tensor not in self.tensors:
                if e.tensor in FUNCS:
                    return R(Call(e.tensor, e.args))
                raise Invalid(f"unknown tensor {e.tensor}")
            return self.read(e.tensor, tuple(self.index(R(a)) for a in e.args))
        if isinstance(e, Dim):
            t = self.tensors.get(e.tensor)
            if t is None or t.data is None or not 0 <= e.k < t.data.ndim:
                raise Invalid(f"bad dimension {e.tensor}.{e.k}")
            if t.dims is not None:
                dm = t.dims[e.k]
                return SizeV(self.sizes[dm], "int64") if isinstance(dm, str) else \
                    SizeV(dm, "int32")
            return SizeV(t.data.shape[e.k], "int64")
        if isinstance(e, Un):
            x = R(e.x)
            if e.op == "-" and isinstance(x, Lit) and not isinstance(x.value, bool):
                return Lit(-x.value)
            return Un(e.op, x)
        if isinstance(e, Bin):
            return Bin(e.op, R(e.a), R(e.b))
        if isinstance(e, Tern):
            return Tern(R(e.c), R(e.a), R(e.b))
        if isinstance(e, Call):
            if e.fn not in FUNCS or len(e.args) != ARITY.get(e.fn, 1):
                raise Invalid(f"bad call {e.fn}")
            return Call(e.fn, tuple(R(a) for a in e.args))
        if isinstance(e, Cast):
            if e.ty not in TYPES:
                raise Invalid(f"bad type {e.ty}")
            return Cast(TYPES[e.ty], R(e.x))
        raise TypeError(e)

    def read(self, name, args):
        t = self.tensors[name]
        if t.data is None:
            raise Invalid(f"{name} is read before it is written")
        if len(args) != t.data.ndim:
            raise Invalid(f"{name} read with {len(args)} indices, rank {t.data.ndim}")
        return RRead(name, args)

    def index(self, x):
        """An index expression must be affine; ``/`` by a positive constant is floor division."""
        def fix(e):
            if isinstance(e, Bin):
                a, b = fix(e.a), fix(e.b)
                if e.op == "/" and isinstance(b, Lit) and isinstance(b.value, int) and b.value > 0:
                    return Bin("//", a, b)
                return Bin(e.op, a, b)
            if isinstance(e, Un):
                return Un(e.op, fix(e.x))
            return e
        x = fix(x)
        if self.linear(x) is None:
            raise Invalid("non-affine index")
        return x

    def linear(self, e):
        """(coefficients of indices, constant, opaque // and % terms) or None."""
        if isinstance(e, Idx):
            return {e.name: 1}, 0, []
        if isinstance(e, SizeV):
            return {}, e.value, []
        if isinstance(e, Lit):
            if isinstance(e.value, bool) or not isinstance(e.value, int):
                return None
            return {}, e.value, []
        if isinstance(e, Un) and e.op == "-":
            r = self.linear(e.x)
            if r is None:
                return None
            return {k: -v for k, v in r[0].items()}, -r[1], [(-s, t) for s, t in r[2]]
        if isinstance(e, Bin) and e.op in ("+", "-"):
            a, b = self.linear(e.a), self.linear(e.b)
            if a is None or b is None:
                return None
            sg = 1 if e.op == "+" else -1
            co = dict(a[0])
            for k, v in b[0].items():
                co[k] = co.get(k, 0) + sg * v
            return co, a[1] + sg * b[1], a[2] + [(sg * s, t) for s, t in b[2]]
        if isinstance(e, Bin) and e.op == "*":
            a, b = self.linear(e.a), self.linear(e.b)
            if a is None or b is None:
                return None
            if not a[0] and not a[2]:
                a, b = b, a
            if b[0] or b[2]:
                return None
            c = b[1]
            return {k: v * c for k, v in a[0].items()}, a[1] * c, [(s * c, t) for s, t in a[2]]
        if isinstance(e, Bin) and e.op in ("//", "%"):
            a, b = self.linear(e.a), self.linear(e.b)
            if a is None or b is None or b[0] or b[2] or b[1] <= 0:
                return None
            return {}, 0, [(1, e)]
        return None

    # -- statements ---------------------------------------------------------------------

    def statement(self, s: Stmt):
        target = self.tensors.get(s.tensor)
        if target is not None and target.role == "input":
            raise Invalid(f"write to input {s.tensor}")
        if len(set(s.indices)) != len(s.indices) or any(
                i in self.sizes or i in self.tensors or i == s.tensor for i in s.indices):
            raise Invalid("bad LHS indices")
        if target is None:
            target = self.tensors[s.tensor] = Tensor(s.tensor, None, "temp")
        if target.data is not None and target.data.ndim != len(s.indices):
            raise Invalid("LHS rank mismatch")
        lets = {}
        for c in s.clauses:
            if isinstance(c, LetC):
                if c.name in lets or c.name in self.tensors or c.name in self.sizes \
                        or c.name in s.indices:
                    raise Invalid("let hides a name")
                lets[c.name] = c.value
        order = list(s.indices)
        value = self.resolve(s.rhs, lets, order)
        red = order[len(s.indices):]
        base = s.op.rstrip("!")
        if base not in ("=", "+=", "*=", "min=", "max="):
            raise Invalid(f"bad operator {s.op}")
        if base == "=" and (red or s.op.endswith("!")):
            raise Invalid("`=` with reduction indices")
        iters = order
        exists = []
        for c in s.clauses:
            if isinstance(c, ExistsC):
                if c.tensor not in self.tensors:
                    raise Invalid("unknown tensor in exists")
                probe = list(iters)
                r = self.resolve(Read(c.tensor, c.args), lets, probe)
                if probe != iters:
                    raise Invalid("exists uses an index the statement does not")
                exists.append(r)
        fixed = {}
        for c in s.clauses:
            if isinstance(c, RangeC):
                if c.index not in iters:
                    raise Invalid("where range of a non-index")
                fixed[c.index] = (self.size_expr(c.lo), self.size_expr(c.hi))
        reads = _reads(value) + exists
        accesses = [(r.args, self.tensors[r.tensor].data.shape) for r in reads]
        if target.data is not None:
            accesses.insert(0, (tuple(Idx(i) for i in s.indices), target.data.shape))
        # the indices of a tensor's first write (they give it its shape) never start below 0
        first = set(s.indices) if target.data is None else set()
        ranges = self.ranges(iters, fixed, accesses, first)
        if target.data is None:
            shape = tuple(max(ranges[i][1], 0) for i in s.indices)
            if target.dtype is None:
                target.dtype = self.dtype(value)
            target.data = np.zeros(shape, self.np(target.dtype))
            target.defined = np.full(shape, target.role == "output")
        self.update(s, target, iters, ranges, value, exists, base)

    def size_expr(self, e) -> int:
        x = self.index(self.resolve(e, {}, []))
        if any(isinstance(n, (Idx, RRead)) for n in _walk(x)):
            raise Invalid("range bound uses an index")
        return int(self.eval_index(x, {}))

    def ranges(self, iters, fixed, accesses, nonnegative=frozenset()):
        """TC range inference, in rounds, with the sizes known; the indices in
        ``nonnegative`` start at 0 at the lowest."""
        ranges = dict(fixed)
        while True:
            found: dict[str, tuple[int, int]] = {}
            for idx, shape in accesses:
                for e, ext in zip(idx, shape):
                    lin = self.linear(e)
                    if lin is None:
                        continue
                    co, const, opaque = lin
                    co = {k: v for k, v in co.items() if v != 0}
                    free = [k for k in co if k not in ranges]
                    inner = set()
                    for _, t in opaque:
                        inner |= {n.name for n in _walk(t) if isinstance(n, Idx)}
                    if len(free) != 1 or any(k not in ranges for k in inner):
                        continue
                    x = free[0]
                    fmin = fmax = const
                    for k, v in co.items():
                        if k == x:
                            continue
                        # the bounds TC derives symbolically: the minimum at the lower
                        # end for a positive coefficient (also when the range is empty)
                        lo, hi = ranges[k]
                        ends = (v * lo, v * (hi - 1)) if v > 0 else (v * (hi - 1), v * lo)
                        fmin += ends[0]
                        fmax += ends[1]
                    for sg, t in opaque:
                        names = sorted({n.name for n in _walk(t) if isinstance(n, Idx)})
                        grids = np.meshgrid(*[np.arange(*ranges[n]) for n in names],
                                            indexing="ij") if names else []
                        vals = sg * np.asarray(self.eval_index(t, dict(zip(names, grids))))
                        if vals.size == 0:
                            continue
                        fmin += int(vals.min())
                        fmax += int(vals.max())
                    c = co[x]
                    lo_b, hi_b = -fmin, ext - 1 - fmax     # lo_b <= c*x <= hi_b
                    if c > 0:
                        lo, hi = -((-lo_b) // c), hi_b // c + 1
                    else:
                        lo, hi = -((-hi_b) // c), lo_b // c + 1
                    if x in found:
                        found[x] = (max(found[x][0], lo), min(found[x][1], hi))
                    else:
                        found[x] = (lo, hi)
            if not found:
                break
            ranges.update({x: (max(lo, 0) if x in nonnegative else lo, hi)
                           for x, (lo, hi) in found.items()})
        for i in iters:
            if i not in ranges:
                raise Invalid(f"cannot infer the range of {i}")
        return ranges

    # -- evaluation ---------------------------------------------------------------------

    def update(self, s, target, iters, ranges, value, exists, base):
        box = tuple(max(ranges[i][1] - ranges[i][0], 0) for i in iters)
        grid = {}
        for k, i in enumerate(iters):
            shp = [1] * len(iters)
            shp[k] = -1
            grid[i] = np.broadcast_to(np.arange(ranges[i][0], ranges[i][0] + box[k])
                                      .reshape(shp), box)
        self.grid, self.box = grid, box
        lhs = [grid[i] for i in s.indices]
        inb = np.ones(box, bool)
        for ix, n in zip(lhs, target.data.shape):
            inb &= (ix >= 0) & (ix < n)
        if not inb.all():
            raise Invalid(f"the statement writes {s.tensor} outside its shape")
        dom = np.ones(box, bool)
        for r in _unconditional(value) + exists:
            t = self.tensors[r.tensor]
            for e, n in zip(r.args, t.data.shape):
                v = np.broadcast_to(self.eval_index(e, grid), box)
                dom &= (v >= 0) & (v < n)
        op = base.rstrip("=") or "="
        op = {"+": "+", "*": "*", "min": "min", "max": "max", "=": "="}[op]
        lhs_box = tuple(slice(max(ranges[i][0], 0), max(ranges[i][1], 0)) for i in s.indices)
        if s.op.endswith("!"):
            target.data[lhs_box] = _identity(op, target.dtype)
            target.defined[lhs_box] = True
        with np.errstate(all="ignore"):
            vals = self.ev(value, target.dtype, dom)
        vals = np.broadcast_to(vals, box)[dom]
        data, dt = target.data, target.dtype
        flat, dflat = data.reshape(-1), target.defined.reshape(-1)
        where = np.ravel_multi_index(tuple(ix[dom] for ix in lhs), data.shape) if lhs \
            else np.zeros(len(vals), np.intp)
        if op != "=" and not dflat[where].all():
            raise Invalid(f"{s.tensor} is accumulated into before it is initialised")
        if op == "=":
            flat[where] = vals
        elif dt == "bool":
            (np.logical_or if op in ("+", "max") else np.logical_and).at(flat, where, vals)
        elif dt in INT_LIMITS:
            acc = flat.astype(object)
            fn = {"+": lambda a, b: a + b, "*": lambda a, b: a * b, "min": min, "max": max}[op]
            lo, hi = INT_LIMITS[dt]
            for w, v in zip(where.tolist(), vals.tolist()):
                acc[w] = fn(acc[w], int(v))
                if not lo <= acc[w] <= hi:
                    raise Invalid("integer overflow in a reduction")
            flat[...] = acc.astype(flat.dtype)
        else:
            ufunc = {"+": np.add, "*": np.multiply, "min": np.fmin, "max": np.fmax}[op]
            with np.errstate(all="ignore"):
                ufunc.at(flat, where, vals)
        dflat[where] = True
        assert np.shares_memory(flat, data) or data.size == 0

    def eval_index(self, e, env):
        """Integer index expression (floor division and modulo, as isl)."""
        if isinstance(e, Idx):
            return env[e.name]
        if isinstance(e, SizeV):
            return e.value
        if isinstance(e, Lit):
            return int(e.value)
        if isinstance(e, Un):
            return -self.eval_index(e.x, env)
        a, b = self.eval_index(e.a, env), self.eval_index(e.b, env)
        return {"+": lambda: a + b, "-": lambda: a - b, "*": lambda: a * b,
                "//": lambda: a // b, "%": lambda: a % b}[e.op]()

    # dtypes
    def infer(self, e):
        if isinstance(e, Lit):
            v = e.value
            return ("bool" if isinstance(v, bool) else "int32" if isinstance(v, int)
                    else "float32"), True
        if isinstance(e, Idx):
            return "int64", True
        if isinstance(e, SizeV):
            return e.dtype, True
        if isinstance(e, RRead):
            return self.tensors[e.tensor].dtype, False
        if isinstance(e, Cast):
            return e.ty, False
        if isinstance(e, Un):
            return ("bool", False) if e.op == "!" else self.infer(e.x)
        if isinstance(e, Bin):
            if e.op in COMPARE:
                return "bool", False
            return _join(self.infer(e.a), self.infer(e.b))
        if isinstance(e, Tern):
            return _join(self.infer(e.a), self.infer(e.b))
        if isinstance(e, Call):
            t = self.infer(e.args[0])
            for a in e.args[1:]:
                t = _join(t, self.infer(a))
            if e.fn in ("max", "min", "abs", "relu"):
                return t
            return _promote(t[0], "float32"), t[1]
        raise TypeError(e)

    def dtype(self, e):
        return self.infer(e)[0]

    def own(self, e):
        if isinstance(e, Lit):
            v = e.value
            return "bool" if isinstance(v, bool) else "int32" if isinstance(v, int) else "float32"
        return self.dtype(e)

    def ev(self, e, want, active):
        """``e`` computed in its own dtype, then converted to ``want`` (a literal is
        written directly in ``want``)."""
        if isinstance(e, Lit):
            return self.literal(e.value, want)
        have = self.dtype(e)
        v = self.raw(e, have, active)
        return v if have == want else self.convert(v, have, want, active)

    def literal(self, v, dt):
        if dt == "bool":
            return np.bool_(bool(v))
        if dt in INT_LIMITS:
            return np.dtype(dt).type(int(v))
        return self.np(dt)(v)

    def convert(self, v, have, want, active):
        v = np.asarray(v)
        if want == "bool":
            return v != 0
        if want in INT_LIMITS and have.startswith("float"):
            lo, hi = INT_LIMITS[want]
            bad = ~np.isfinite(v) | (v <= lo - 1) | (v >= hi + 1)
            if np.any(np.broadcast_to(bad, self.box) & active):
                raise Invalid(f"float -> {want} conversion out of range")
            return np.where(bad, 0, np.trunc(np.where(bad, 0, v))).astype(want)
        return v.astype(self.np(want))

    def check_int(self, v, dt, active):
        lo, hi = INT_LIMITS[dt]
        bad = (v < lo) | (v > hi)
        if np.any(np.broadcast_to(bad, self.box) & active):
            raise Invalid("integer overflow")
        return np.where(bad, 0, v).astype(dt)

    def raw(self, e, t, active):
        if isinstance(e, Idx):
            return self.grid[e.name]
        if isinstance(e, SizeV):
            return np.dtype(e.dtype).type(e.value)
        if isinstance(e, RRead):
            tensor = self.tensors[e.tensor]
            if not e.args:
                if tensor.defined is not None and not tensor.defined[()] and np.any(active):
                    raise Invalid(f"read of {e.tensor}, which nobody wrote")
                return tensor.data[()]
            idx = []
            ok = np.ones(self.box, bool)
            for a, n in zip(e.args, tensor.data.shape):
                v = np.broadcast_to(self.eval_index(a, self.grid), self.box)
                ok &= (v >= 0) & (v < n)
                idx.append(np.clip(v, 0, max(n - 1, 0)))
            if np.any(active & ~ok):
                raise Invalid(f"an evaluated read of {e.tensor} is out of bounds")
            if not all(tensor.data.shape):
                return np.zeros(self.box, tensor.data.dtype)
            if not np.all(tensor.defined[tuple(idx)] | ~active):
                raise Invalid(f"read of an element of {e.tensor} nobody wrote")
            return tensor.data[tuple(idx)]
        if isinstance(e, Cast):
            own = self.own(e.x)
            return self.convert(self.ev(e.x, own, active), own, e.ty, active)
        if isinstance(e, Un):
            if e.op == "!":
                return self.ev(e.x, self.own(e.x), active) == 0
            if t == "bool":
                raise Invalid("unary minus of a bool")
            v = self.ev(e.x, t, active)
            if t in INT_LIMITS:
                return self.check_int(-np.asarray(v).astype(object), t, active) \
                    if t == "int64" else self.check_int(-np.asarray(v, np.int64), t, active)
            return -v
        if isinstance(e, Bin):
            return self.binary(e, t, active)
        if isinstance(e, Tern):
            c = np.broadcast_to(self.ev(e.c, self.own(e.c), active) != 0, self.box)
            a = self.ev(e.a, t, active & c)
            b = self.ev(e.b, t, active & ~c)
            return np.where(c, a, b)
        if isinstance(e, Call):
            return self.call(e, t, active)
        raise TypeError(e)

    def binary(self, e, t, active):
        op = e.op
        if op in ("&&", "||"):
            a = np.broadcast_to(self.ev(e.a, self.own(e.a), active) != 0, self.box)
            sub = active & a if op == "&&" else active & ~a
            b = np.broadcast_to(self.ev(e.b, self.own(e.b), sub) != 0, self.box)
            return (a & b) if op == "&&" else (a | b)
        if op in COMPARE:
            u = _join(self.infer(e.a), self.infer(e.b))[0]
            a, b = self.ev(e.a, u, active), self.ev(e.b, u, active)
            return {"==": np.equal, "!=": np.not_equal, "<": np.less, ">": np.greater,
                    "<=": np.less_equal, ">=": np.greater_equal}[op](a, b)
        a, b = self.ev(e.a, t, active), self.ev(e.b, t, active)
        if t == "bool":
            if op == "+":
                return a | b
            if op == "*":
                return a & b
            raise Invalid(f"{op} of bools")
        if t in INT_LIMITS:
            if t == "int64":
                a, b = np.asarray(a).astype(object), np.asarray(b).astype(object)
            else:
                a, b = np.asarray(a, np.int64), np.asarray(b, np.int64)
            if op in ("/", "%"):
                zero = np.broadcast_to(b == 0, self.box)
                if np.any(zero & active):
                    raise Invalid("integer division by zero")
                b = np.where(b == 0, 1, b)
                q = np.abs(a) // np.abs(b)
                q = np.where((a < 0) != (b < 0), -q, q)   # C: truncation toward zero
                r = q if op == "/" else a % b             # polyc: floor modulo
            else:
                r = {"+": lambda: a + b, "-": lambda: a - b, "*": lambda: a * b}[op]()
            return self.check_int(r, t, active)
        if op == "/":
            return a / b
        if op == "%":
            return np.mod(a, b)
        return {"+": lambda: a + b, "-": lambda: a - b, "*": lambda: a * b}[op]()

    def call(self, e, t, active):
        args = [np.asarray(self.ev(a, t, active)) for a in e.args]
        fn = e.fn
        if t == "bool":
            if fn == "max":
                return args[0] | args[1]
            if fn == "min":
                return args[0] & args[1]
            return args[0]
        if t in INT_LIMITS:
            if fn == "relu":
                return np.maximum(args[0], 0).astype(t)
            if fn == "abs":
                return self.check_int(np.abs(args[0].astype(object)), t, active)
            return (np.maximum if fn == "max" else np.minimum)(*args).astype(t)
        r = FUNCS[fn](*args)
        return np.asarray(r).astype(self.np(t))


def _walk(e):
    yield e
    if isinstance(e, (Un, Cast)):
        yield from _walk(e.x)
    elif isinstance(e, Bin):
        yield from _walk(e.a)
        yield from _walk(e.b)
    elif isinstance(e, Tern):
        for x in (e.c, e.a, e.b):
            yield from _walk(x)
    elif isinstance(e, (Call, RRead)):
        for x in e.args:
            yield from _walk(x)


def _reads(e):
    return [x for x in _walk(e) if isinstance(x, RRead)]


def _unconditional(e):
    if isinstance(e, RRead):
        return [e]
    if isinstance(e, Tern):
        return _unconditional(e.c)
    if isinstance(e, Bin) and e.op in ("&&", "||"):
        return _unconditional(e.a)
    if isinstance(e, (Un, Cast)):
        return _unconditional(e.x)
    if isinstance(e, Bin):
        return _unconditional(e.a) + _unconditional(e.b)
    if isinstance(e, Call):
        return [r for a in e.args for r in _unconditional(a)]
    return []


def find_def(defs, name):
    for d in defs:
        if d.name == name:
            return d
    raise Invalid(f"no def {name}")


def run(d: Def, inputs, wide: bool = False):
    """The outputs of ``d`` on ``inputs`` (in return order), as numpy arrays of the
    output dtypes (``wide``: computed in wider floats, see the module docstring)."""
    m = Machine(d, inputs, wide)
    outs = m.run()
    return [np.asarray(o).astype(np.dtype(m.tensors[r.name].dtype)) if not wide else
            np.asarray(o) for o, r in zip(outs, d.rets)], \
        [m.tensors[r.name].dtype for r in d.rets]


@np.errstate(all="ignore")
def compare(expected, stable, actual, dtype):
    """Indices (as a list of (index, expected, actual)) where ``actual`` differs;
    ``stable`` masks out numerically unstable elements. NaN equals NaN."""
    e = np.asarray(expected)
    a = np.asarray(actual)
    if dtype.startswith("float"):
        tol = 2e-3 if dtype == "float32" else 1e-7
        ef, af = e.astype(np.float64), a.astype(np.float64)
        finite = np.isfinite(ef)
        scale = max(1.0, float(np.abs(ef[finite]).max())) if finite.any() else 1.0
        same = (ef == af) | (np.isnan(ef) & np.isnan(af)) | (
            finite & np.isfinite(af) & (np.abs(ef - af) <= tol * np.abs(ef) + tol * 0.1 * scale))
    else:
        same = e == a
    bad = ~same & stable
    return [(tuple(int(x) for x in i), e[i].item(), a[i].item())
            for i in zip(*np.nonzero(bad))] if e.ndim else \
        ([((), e.item(), a.item())] if bad else [])


@np.errstate(all="ignore")
def stable_mask(exact, wide, dtype):
    """Elements where the exact and the wide run agree (closely, for floats)."""
    e, w = np.asarray(exact), np.asarray(wide)
    if not dtype.startswith("float"):
        return e == w.astype(e.dtype) if dtype != "bool" else e == (w != 0)
    ef, wf = e.astype(np.float64), w.astype(np.float64)
    tol = 1e-4 if dtype == "float32" else 1e-10
    return (ef == wf) | (np.isnan(ef) & np.isnan(wf)) | (
        np.isfinite(ef) & np.isfinite(wf) & (np.abs(ef - wf) <= tol * (1 + np.abs(wf))))
