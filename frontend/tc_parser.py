"""Lexer and parser of the Tensor Comprehensions language, producing a small AST.

Every node carries a :class:`Span` (1-based line and column of its first token) so that
the lowering can point at the source in its messages. The grammar (see
``shared/TC_LANGUAGE.md``)::

    def    := 'def' NAME '(' [param {',' param}] ')' '->' (ret | '(' ret {',' ret} ')')
              '{' stmt* '}'
    param  := TYPE ['(' dim {',' dim} ')'] NAME          dim := NAME | INT
    ret    := [TYPE ['(' dim {',' dim} ')']] NAME
    stmt   := NAME ['(' [NAME {',' NAME}] ')'] OP expr ['<=>' NAME '(' args ')']
              ['where' clause {',' clause}]
    clause := NAME 'in' expr ':' expr | 'exists' NAME '(' args ')' | NAME '=' expr
    OP     := '=' | '+=' | '*=' | 'min=' | 'max=' | '+=!' | '*=!' | 'min=!' | 'max=!'

Expressions have the C precedences: ``?:`` < ``||`` < ``&&`` < ``== !=`` <
``< > <= >=`` < ``+ -`` < ``* / %`` < unary ``- !`` < ``T.k``. ``NAME(args)`` is a
tensor read, a built-in call or (with a type name) a cast: the lowering decides.
Statements are separated by nothing but whitespace; ``#`` starts a comment.
"""
from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Union

from polyc.errors import ParseError

#: every scalar type name of TC (the lowering rejects those polyc does not compile)
TC_TYPES = ("bool", "uint8", "uint16", "uint32", "uint64", "int8", "int16", "int32",
            "int64", "float16", "float32", "float64", "float", "double", "half", "byte")
#: assignment operators of statements
ASSIGN_OPS = ("=", "+=", "*=", "min=", "max=", "+=!", "*=!", "min=!", "max=!")
KEYWORDS = ("def", "where", "exists", "in")


@dataclass(frozen=True)
class Span:
    line: int
    col: int


# -- expressions ----------------------------------------------------------------------

@dataclass(frozen=True)
class Number:
    value: int | float
    span: Span


@dataclass(frozen=True)
class Name:
    """A bare identifier: an index, a size, a rank-0 tensor or a `where` let-binding."""
    name: str
    span: Span


@dataclass(frozen=True)
class Apply:
    """``name(args)``: a tensor read or a built-in call."""
    name: str
    args: tuple[Expr, ...]
    span: Span


@dataclass(frozen=True)
class CastExpr:
    dtype: str  # a TC type name
    x: Expr
    span: Span


@dataclass(frozen=True)
class DimOf:
    """``T.k``: the extent of dimension ``k`` of tensor ``T``."""
    tensor: str
    dim: int
    span: Span


@dataclass(frozen=True)
class UnaryOp:
    op: str
    x: Expr
    span: Span


@dataclass(frozen=True)
class BinaryOp:
    op: str
    a: Expr
    b: Expr
    span: Span  # of the operator


@dataclass(frozen=True)
class Ternary:
    cond: Expr
    a: Expr
    b: Expr
    span: Span


Expr = Union[Number, Name, Apply, CastExpr, DimOf, UnaryOp, BinaryOp, Ternary]


# -- definitions ----------------------------------------------------------------------

@dataclass(frozen=True)
class TensorType:
    """``float(M, 256)``; ``dims`` is empty for a scalar (rank-0) type."""
    dtype: str
    dims: tuple[Name | Number, ...]
    span: Span


@dataclass(frozen=True)
class Param:
    type: TensorType
    name: str
    span: Span  # of the name


@dataclass(frozen=True)
class Return:
    name: str
    type: TensorType | None
    span: Span


@dataclass(frozen=True)
class RangeClause:
    index: str
    lo: Expr
    hi: Expr
    span: Span


@dataclass(frozen=True)
class ExistsClause:
    access: Apply
    span: Span


@dataclass(frozen=True)
class LetClause:
    name: str
    value: Expr
    span: Span


Clause = Union[RangeClause, ExistsClause, LetClause]


@dataclass(frozen=True)
class Stmt:
    tensor: str
    indices: tuple[Name, ...]
    op: str  # one of ASSIGN_OPS
    rhs: Expr
    clauses: tuple[Clause, ...]
    span: Span  # of the written tensor
    op_span: Span


@dataclass(frozen=True)
class Def:
    name: str
    params: tuple[Param, ...]
    returns: tuple[Return, ...]
    body: tuple[Stmt, ...]
    span: Span


# -- lexer ----------------------------------------------------------------------------

@dataclass(frozen=True)
class Token:
    kind: str  # "name", "int", "float", "op", "eof"
    text: str
    span: Span


_TOKEN_RE = re.compile(r"""
    (?P<ws>[ \t\r\f\v]+) | (?P<nl>\n) | (?P<comment>\#[^\n]*)
  | (?P<float>\d+\.\d*(?:[eE][+-]?\d+)? | \d+[eE][+-]?\d+)
  | (?P<int>\d+)
  | (?P<name>[A-Za-z_][A-Za-z_0-9]*)
  | (?P<bad>-= | /= | %= | <=!)
  | (?P<op><=> | \+=! | \*=! | -> | \+= | \*= | == | != | <= | >= | && | \|\|
            | [-+*/%()\[\]{},:?!<>=.])
""", re.VERBOSE)


def tokenize(source: str) -> list[Token]:
    """Split ``source`` into tokens; ``min=``/``max=`` (and ``!`` forms) are single ops."""
    toks: list[Token] = []
    pos, line, line_start = 0, 1, 0
    while pos < len(source):
        m = _TOKEN_RE.match(source, pos)
        span = Span(line, pos - line_start + 1)
        if m is None:
            raise ParseError(f"unexpected character {source[pos]!r}", span.line, span.col)
        kind, text = m.lastgroup, m.group()
        pos = m.end()
        if kind == "nl":
            line, line_start = line + 1, pos
        elif kind == "bad":
            raise ParseError(f"unknown operator {text!r}; TC's assignment operators are "
                             f"{', '.join(ASSIGN_OPS)}", span.line, span.col)
        elif kind in ("name", "int", "float", "op"):
            if kind == "name" and text in ("min", "max") and source.startswith("=", pos) \
                    and not source.startswith("==", pos):
                bang = source.startswith("=!", pos) and not source.startswith("=!=", pos)
                text += "=!" if bang else "="
                pos += len(text) - 3
                kind = "op"
            toks.append(Token(kind, text, span))
    toks.append(Token("eof", "", Span(line, pos - line_start + 1)))
    return toks


# -- parser ---------------------------------------------------------------------------

_BINARY_LEVELS = (("||",), ("&&",), ("==", "!="), ("<", ">", "<=", ">="), ("+", "-"),
                  ("*", "/", "%"))


class _Parser:
    """Recursive descent over the token list; one method per grammar rule."""

    def __init__(self, source: str):
        self.toks = tokenize(source)
        self.pos = 0

    # token helpers
    @property
    def tok(self) -> Token:
        return self.toks[self.pos]

    def peek(self, k: int = 1) -> Token:
        return self.toks[min(self.pos + k, len(self.toks) - 1)]

    def at(self, *texts: str) -> bool:
        t = self.tok
        return t.kind in ("op", "name") and t.text in texts

    def advance(self) -> Token:
        t = self.tok
        self.pos += 1
        return t

    def fail(self, expected: str, tok: Token | None = None) -> ParseError:
        t = tok or self.tok
        found = "end of input" if t.kind == "eof" else repr(t.text)
        return ParseError(f"expected {expected}, found {found}", t.span.line, t.span.col)

    def expect(self, text: str) -> Token:
        if not self.at(text):
            raise self.fail(repr(text))
        return self.advance()

    def name(self, what: str = "a name") -> Token:
        t = self.tok
        if t.kind != "name" or t.text in KEYWORDS:
            raise self.fail(what)
        return self.advance()

    # definitions
    def defs(self) -> list[Def]:
        out = []
        while self.tok.kind != "eof":
            out.append(self.definition())
        return out

    def definition(self) -> Def:
        start = self.expect("def").span
        name = self.name("the name of the def").text
        self.expect("(")
        params = self.comma_list(")", self.param)
        self.expect("->")
        if self.at("("):
            self.advance()
            returns = self.comma_list(")", self.ret)
        else:
            returns = (self.ret(),)
        self.expect("{")
        body = []
        while not self.at("}"):
            body.append(self.statement())
        self.advance()
        return Def(name, params, returns, tuple(body), start)

    def comma_list(self, close: str, item):
        """``item {',' item} close`` (possibly empty); consumes ``close``."""
        items = []
        if not self.at(close):
            items.append(item())
            while self.at(","):
                self.advance()
                items.append(item())
        self.expect(close)
        return tuple(items)

    def tensor_type(self) -> TensorType:
        t = self.tok
        if t.kind != "name" or t.text not in TC_TYPES:
            raise self.fail("a type (float, int32, ...)")
        self.advance()
        dims: tuple[Name | Number, ...] = ()
        if self.at("("):
            self.advance()
            dims = self.comma_list(")", self.dim)
            if not dims:
                raise self.fail("a size", self.toks[self.pos - 1])
        return TensorType(t.text, dims, t.span)

    def dim(self) -> Name | Number:
        t = self.tok
        if t.kind == "int":
            self.advance()
            return Number(int(t.text), t.span)
        n = self.name("a size name or an integer")
        return Name(n.text, n.span)

    def param(self) -> Param:
        ty = self.tensor_type()
        n = self.name("a parameter name")
        return Param(ty, n.text, n.span)

    def ret(self) -> Return:
        ty = None
        if self.tok.kind == "name" and self.tok.text in TC_TYPES and \
                (self.peek().kind == "name" or self.peek().text == "("):
            ty = self.tensor_type()
        n = self.name("an output name")
        return Return(n.text, ty, n.span)

    # statements
    def statement(self) -> Stmt:
        lhs = self.name("a statement (TENSOR(indices) OP expr) or '}'")
        indices: tuple[Name, ...] = ()
        if self.at("("):
            self.advance()
            indices = self.comma_list(")", self.lhs_index)
        op = self.tok
        if op.kind != "op" or op.text not in ASSIGN_OPS:
            raise self.fail(f"an assignment operator ({' '.join(ASSIGN_OPS)})")
        self.advance()
        rhs = self.expr()
        if self.at("<=>"):  # TC's gradient annotation: parsed and ignored
            self.advance()
            self.name("a gradient name")
            self.expect("(")
            self.comma_list(")", self.expr)
        clauses: list[Clause] = []
        if self.at("where"):
            self.advance()
            clauses.append(self.clause())
            while self.at(","):
                self.advance()
                clauses.append(self.clause())
        return Stmt(lhs.text, indices, op.text, rhs, tuple(clauses), lhs.span, op.span)

    def lhs_index(self) -> Name:
        n = self.name("an index name (indices on the left-hand side are plain names)")
        return Name(n.text, n.span)

    def clause(self) -> Clause:
        t = self.tok
        if self.at("exists"):
            self.advance()
            n = self.name("a tensor name")
            self.expect("(")
            return ExistsClause(Apply(n.text, self.comma_list(")", self.expr), n.span), t.span)
        n = self.name("a where clause (i in lo:hi, exists T(...), name = expr)")
        if self.at("in"):
            self.advance()
            lo = self.binary(0)
            self.expect(":")
            return RangeClause(n.text, lo, self.binary(0), t.span)
        if self.at("="):
            self.advance()
            return LetClause(n.text, self.expr(), t.span)
        raise self.fail("'in' or '=' in a where clause")

    # expressions
    def expr(self) -> Expr:
        cond = self.binary(0)
        if not self.at("?"):
            return cond
        q = self.advance()
        a = self.expr()
        self.expect(":")
        return Ternary(cond, a, self.expr(), q.span)

    def binary(self, level: int) -> Expr:
        if level == len(_BINARY_LEVELS):
            return self.unary()
        a = self.binary(level + 1)
        while self.tok.kind == "op" and self.tok.text in _BINARY_LEVELS[level]:
            op = self.advance()
            a = BinaryOp(op.text, a, self.binary(level + 1), op.span)
        return a

    def unary(self) -> Expr:
        if self.at("-", "!", "+"):
            op = self.advance()
            x = self.unary()
            return x if op.text == "+" else UnaryOp(op.text, x, op.span)
        return self.postfix()

    def postfix(self) -> Expr:
        t = self.tok
        if t.kind in ("int", "float"):
            self.advance()
            return Number(int(t.text) if t.kind == "int" else float(t.text), t.span)
        if self.at("("):
            self.advance()
            e = self.expr()
            self.expect(")")
            return e
        if t.kind != "name" or t.text in KEYWORDS:
            raise self.fail("an expression")
        self.advance()
        if self.at("("):
            self.advance()
            args = self.comma_list(")", self.expr)
            if t.text in TC_TYPES:
                if len(args) != 1:
                    raise ParseError(f"a cast to {t.text} takes one argument",
                                     t.span.line, t.span.col)
                return CastExpr(t.text, args[0], t.span)
            return Apply(t.text, args, t.span)
        if self.at("."):
            self.advance()
            k = self.tok
            if k.kind != "int":
                raise self.fail(f"a dimension number after '{t.text}.'")
            self.advance()
            return DimOf(t.text, int(k.text), t.span)
        return Name(t.text, t.span)


def parse_tc(source: str) -> list[Def]:
    """Parse TC source text (one or more ``def``) into a list of :class:`Def`."""
    return _Parser(source).defs()
