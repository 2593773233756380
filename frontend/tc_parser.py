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

The parser enforces the source limits of :mod:`polyc.limits` as it reads (expression
depth, statements per def, defs, tensors per def, indices, name length), so a source far
over a limit is refused at the place where it crosses it, in time linear in the part read.
A def must have at least one output and one statement. Every error carries the source
line (``source_line``), shown under the message with a caret.
"""
from __future__ import annotations

import difflib
import re
from dataclasses import dataclass, field
from typing import Union

from polyc import limits
from polyc import dtypes as D
from polyc.errors import CompileError, ParseError, SemanticError

#: every scalar type name of TC (the lowering rejects those polyc does not compile)
TC_TYPES = tuple(D.TC_NAMES)
#: assignment operators of statements
ASSIGN_OPS = ("=", "+=", "*=", "min=", "max=", "+=!", "*=!", "min=!", "max=!")
KEYWORDS = ("def", "where", "exists", "in")


@dataclass(frozen=True)
class Span:
    line: int
    col: int
    #: the text of the source line (for error messages); not part of equality
    text: str | None = field(default=None, compare=False, repr=False)


def error(cls: type[CompileError], message: str, span: Span) -> CompileError:
    """``cls`` at ``span``, carrying its source line."""
    return cls(message, span.line, span.col, source_line=span.text)


def did_you_mean(name: str, candidates) -> str:
    """`` (did you mean 'x'?)`` for the known name closest to ``name``, else ``""``."""
    close = difflib.get_close_matches(name, sorted(set(candidates)), n=1, cutoff=0.6)
    if not close and len(name) <= 2:  # 'Bb' -> 'B': difflib's ratio is too strict for
        close = [c for c in sorted(set(candidates)) if c.lower() == name.lower()][:1]
    return f" (did you mean {close[0]!r}?)" if close else ""


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
    lines = source.split("\n")
    pos, line, line_start = 0, 1, 0
    while pos < len(source):
        m = _TOKEN_RE.match(source, pos)
        span = Span(line, pos - line_start + 1, lines[line - 1])
        if m is None:
            raise error(ParseError, f"unexpected character {source[pos]!r}", span)
        kind, text = m.lastgroup, m.group()
        pos = m.end()
        if kind == "nl":
            line, line_start = line + 1, pos
        elif kind == "bad":
            raise error(ParseError, f"unknown operator {text!r}; TC's assignment operators "
                        f"are {', '.join(ASSIGN_OPS)}", span)
        elif kind in ("name", "int", "float", "op"):
            if kind == "name" and len(text) > limits.MAX_NAME_LENGTH:
                raise error(ParseError, f"name {text[:20]}... is {len(text)} characters "
                            f"long; the limit is {limits.MAX_NAME_LENGTH} "
                            f"(polyc.limits.MAX_NAME_LENGTH)", span)
            if kind == "name" and text in ("min", "max") and source.startswith("=", pos) \
                    and not source.startswith("==", pos):
                bang = source.startswith("=!", pos) and not source.startswith("=!=", pos)
                text += "=!" if bang else "="
                pos += len(text) - 3
                kind = "op"
            toks.append(Token(kind, text, span))
    toks.append(Token("eof", "", Span(line, pos - line_start + 1, lines[line - 1])))
    return toks


# -- parser ---------------------------------------------------------------------------

#: binary operators and their precedence (higher binds tighter); all left-associative
_PRECEDENCE = {op: level for level, ops in enumerate(
    (("||",), ("&&",), ("==", "!="), ("<", ">", "<=", ">="), ("+", "-"), ("*", "/", "%")))
    for op in ops}


def _limit(what: str, value: int, name: str) -> str:
    return f"{what}; the limit is {value} (polyc.limits.{name})"


def expr_depth(e: Expr) -> tuple[int, Span]:
    """The depth of ``e`` (a leaf has depth 1) and the span of its deepest node; walked
    with an explicit stack, so a tree of any depth is measured without recursion."""
    best, where = 0, e.span
    stack: list[tuple[Expr, int]] = [(e, 1)]
    while stack:
        x, d = stack.pop()
        if d > best:
            best, where = d, x.span
        if isinstance(x, Apply):
            stack.extend((a, d + 1) for a in x.args)
        elif isinstance(x, (CastExpr, UnaryOp)):
            stack.append((x.x, d + 1))
        elif isinstance(x, BinaryOp):
            stack += [(x.a, d + 1), (x.b, d + 1)]
        elif isinstance(x, Ternary):
            stack += [(x.cond, d + 1), (x.a, d + 1), (x.b, d + 1)]
    return best, where


class _Parser:
    """Recursive descent over the token list; one method per grammar rule. Binary
    operators are parsed by operator precedence without recursion, and every nested
    construct counts against :data:`polyc.limits.MAX_EXPR_DEPTH`, so the Python stack
    stays a few frames per nesting level, far below its limit."""

    def __init__(self, source: str):
        self.toks = tokenize(source)
        self.pos = 0
        self.depth = 0  # expression nesting while parsing

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
        return error(ParseError, f"expected {expected}, found {found}", t.span)

    def expect(self, text: str) -> Token:
        if not self.at(text):
            raise self.fail(repr(text))
        return self.advance()

    def name(self, what: str = "a name") -> Token:
        t = self.tok
        if t.kind != "name" or t.text in KEYWORDS:
            raise self.fail(what)
        return self.advance()

    def nest(self, span: Span) -> None:
        """Enter one level of expression nesting (left with ``self.depth -= 1``)."""
        self.depth += 1
        if self.depth > limits.MAX_EXPR_DEPTH:
            raise error(ParseError, _limit("expression nested too deeply (parentheses, "
                        "calls, unary operators or ?: branches)", limits.MAX_EXPR_DEPTH,
                        "MAX_EXPR_DEPTH"), span)

    def check_depth(self, e: Expr) -> Expr:
        depth, where = expr_depth(e)
        if depth > limits.MAX_EXPR_DEPTH:
            raise error(ParseError, _limit(f"expression too deep ({depth} levels of "
                        f"operators and calls; a chain `a + b + c ...` nests one level per "
                        f"operator: split it over several statements)", limits.MAX_EXPR_DEPTH,
                        "MAX_EXPR_DEPTH"), where)
        return e

    # definitions
    def defs(self) -> list[Def]:
        out = []
        while self.tok.kind != "eof":
            if len(out) == limits.MAX_DEFS:
                raise error(ParseError, _limit(f"more than {limits.MAX_DEFS} defs in one "
                            f"source", limits.MAX_DEFS, "MAX_DEFS"),
                            self.tok.span)
            out.append(self.definition())
        return out

    def definition(self) -> Def:
        start = self.expect("def").span
        name = self.name("the name of the def").text
        self.expect("(")
        params = self.comma_list(")", self.param)
        arrow = self.expect("->")
        if self.at("("):
            self.advance()
            returns = self.comma_list(")", self.ret)
        else:
            returns = (self.ret(),)
        if not returns:
            raise error(SemanticError, f"def {name!r} has no outputs: list them after '->', "
                        f"as in `-> (B)`", arrow.span)
        if len(params) + len(returns) > limits.MAX_DEF_TENSORS:
            raise error(ParseError, _limit(f"def {name!r} has {len(params) + len(returns)} "
                        f"inputs and outputs", limits.MAX_DEF_TENSORS, "MAX_DEF_TENSORS"),
                        start)
        brace = self.expect("{")
        body: list[Stmt] = []
        while not self.at("}"):
            if len(body) == limits.MAX_STATEMENTS:
                raise error(ParseError, _limit(f"def {name!r} has more than "
                            f"{limits.MAX_STATEMENTS} statements (split it into several "
                            f"defs)", limits.MAX_STATEMENTS, "MAX_STATEMENTS"), self.tok.span)
            body.append(self.statement())
        if not body:
            raise error(SemanticError, f"def {name!r} has no statements: its body must "
                        f"compute its outputs", brace.span)
        self.advance()
        return Def(name, params, returns, tuple(body), start)

    def comma_list(self, close: str, item, limit: tuple[int, str, str] | None = None):
        """``item {',' item} close`` (possibly empty); consumes ``close``. ``limit``:
        (most items, what they are, the name of the limit)."""
        items = []
        if not self.at(close):
            items.append(item())
            while self.at(","):
                self.advance()
                if limit is not None and len(items) == limit[0]:
                    raise error(ParseError, _limit(f"more than {limit[0]} {limit[1]}",
                                limit[0], limit[2]), self.tok.span)
                items.append(item())
        self.expect(close)
        return tuple(items)

    def unknown_type(self, t: Token) -> ParseError:
        hint = did_you_mean(t.text, TC_TYPES)
        if not hint:
            hint = f"; the types are {', '.join(TC_TYPES)}"
        return error(ParseError, f"unknown type {t.text!r}{hint}", t.span)

    def tensor_type(self) -> TensorType:
        t = self.tok
        if t.kind != "name" or t.text not in TC_TYPES:
            if t.kind == "name" and t.text not in KEYWORDS and \
                    (self.peek().text == "(" or self.peek().kind == "name"):
                raise self.unknown_type(t)
            raise self.fail("a type (float, int32, ...)")
        self.advance()
        dims: tuple[Name | Number, ...] = ()
        if self.at("("):
            self.advance()
            dims = self.comma_list(")", self.dim,
                                   (limits.MAX_INDICES, "dimensions", "MAX_INDICES"))
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
        t, nxt = self.tok, self.peek()
        if t.kind == "name" and (nxt.kind == "name" or nxt.text == "("):
            if t.text not in TC_TYPES:  # `flot(N) B` or `flot B`: a misspelt type
                raise self.unknown_type(t)
            ty = self.tensor_type()
        n = self.name("an output name")
        return Return(n.text, ty, n.span)

    # statements
    def statement(self) -> Stmt:
        lhs = self.name("a statement (TENSOR(indices) OP expr) or '}'")
        indices: tuple[Name, ...] = ()
        if self.at("("):
            self.advance()
            indices = self.comma_list(")", self.lhs_index,
                                      (limits.MAX_INDICES, "indices", "MAX_INDICES"))
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
            lo = self.check_depth(self.binary())
            self.expect(":")
            return RangeClause(n.text, lo, self.check_depth(self.binary()), t.span)
        if self.at("="):
            self.advance()
            return LetClause(n.text, self.expr(), t.span)
        raise self.fail("'in' or '=' in a where clause")

    # expressions
    def expr(self) -> Expr:
        """A whole expression (its depth checked): the entry of every nested one."""
        return self.check_depth(self.ternary())

    def ternary(self) -> Expr:
        cond = self.binary()
        if not self.at("?"):
            return cond
        q = self.advance()
        self.nest(q.span)
        a = self.ternary()
        self.expect(":")
        b = self.ternary()
        self.depth -= 1
        return Ternary(cond, a, b, q.span)

    def binary(self) -> Expr:
        """Binary operators by precedence, left-associative, with explicit stacks."""
        operands = [self.unary()]
        ops: list[Token] = []

        def reduce() -> None:
            op = ops.pop()
            b = operands.pop()
            operands.append(BinaryOp(op.text, operands.pop(), b, op.span))

        while self.tok.kind == "op" and self.tok.text in _PRECEDENCE:
            level = _PRECEDENCE[self.tok.text]
            while ops and _PRECEDENCE[ops[-1].text] >= level:
                reduce()
            ops.append(self.advance())
            operands.append(self.unary())
        while ops:
            reduce()
        return operands[0]

    def unary(self) -> Expr:
        if self.at("-", "!", "+"):
            op = self.advance()
            self.nest(op.span)
            x = self.unary()
            self.depth -= 1
            return x if op.text == "+" else UnaryOp(op.text, x, op.span)
        return self.postfix()

    def postfix(self) -> Expr:
        t = self.tok
        if t.kind in ("int", "float"):
            self.advance()
            return Number(int(t.text) if t.kind == "int" else float(t.text), t.span)
        if self.at("("):
            self.advance()
            self.nest(t.span)
            e = self.ternary()
            self.depth -= 1
            self.expect(")")
            return e
        if t.kind != "name" or t.text in KEYWORDS:
            raise self.fail("an expression")
        self.advance()
        if self.at("("):
            self.advance()
            self.nest(t.span)
            args = self.comma_list(")", self.ternary)
            self.depth -= 1
            if t.text in TC_TYPES:
                if len(args) != 1:
                    raise error(ParseError, f"a cast to {t.text} takes one argument, found "
                                f"{len(args)}", t.span)
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
    """Parse TC source text (one or more ``def``) into a list of :class:`Def`.

    Raises :class:`~polyc.errors.ParseError` (or :class:`~polyc.errors.SemanticError`
    for a def without outputs or statements), each with ``line:col`` and the source line.
    """
    parser = _Parser(source)
    try:
        return parser.defs()
    except RecursionError:  # only when called from an already deep stack
        raise error(ParseError, _limit("expression nested too deeply for Python's stack",
                    limits.MAX_EXPR_DEPTH, "MAX_EXPR_DEPTH"), parser.tok.span) from None
