"""C loop nests (``#pragma scop`` ... ``#pragma endscop``) -> polyc IR, as Pluto and PPCG
read them.

    void jacobi_1d(int T, int N, float A[N], float B[N]) {
    #pragma scop
      for (int t = 0; t < T; t++) {
        for (int i = 1; i < N - 1; i++)
          B[i] = 0.33333f * (A[i - 1] + A[i] + A[i + 1]);
        for (int i = 1; i < N - 1; i++)
          A[i] = 0.33333f * (B[i - 1] + B[i] + B[i + 1]);
      }
    #pragma endscop
    }

The function's parameters are the kernel's interface: ``int``/``long`` parameters are
sizes (isl parameters), arrays (``float A[N][M]``, ``double``) are tensors whose extents
are affine in the sizes, ``float``/``double`` scalars are rank-0 inputs. Arrays the region
writes are updated in place (the kernel's outputs, given by the caller); the others are
inputs. The region may hold ``for`` loops with unit steps (``i++``, ``++i``, ``i += 1``)
and affine bounds (``min``/``max`` allowed), ``if`` with affine conditions, and
assignments ``A[...] = e``, ``+=``, ``-=``, ``*=``, ``/=`` (kept in program order: C's
sequential semantics, no reduction is reordered). Expressions: ``+ - * /``, unary ``-``,
casts, calls of the math functions (``sqrt``, ``exp``, ``fmax``... and their ``f``
forms), numbers, parameters and loop iterators. Everything else is refused with its
line:column. Without pragmas the whole function body is the region.

The source is parsed by pycparser (pure Python, the C99 parser everyone uses) after
comments and preprocessor lines other than ``#pragma`` are blanked (line numbers kept).
"""
from __future__ import annotations

import re
from dataclasses import dataclass

import islpy as isl

from polyc import expr as E
from polyc.errors import ParseError, SemanticError, UnsupportedError
from polyc.ir import ASSIGN, Access, Array, Kernel, Statement, default_context, params_prefix

#: C element types -> polyc dtypes
C_TYPES = {"float": "float32", "double": "float64"}
SIZE_TYPES = ("int", "long", "unsigned", "size_t", "int64_t", "int32_t")
#: C math functions -> polyc built-ins (the ``f`` forms too)
MATH = {name: name for name in E.BUILTINS} | {f"{name}f": name for name in E.BUILTINS} \
    | {"fabsf": "fabs", "fmaxf": "fmax", "fminf": "fmin", "powf": "pow"}
COMPOUND = {"+=": "+", "-=": "-", "*=": "*", "/=": "/"}


@dataclass(frozen=True)
class Param:
    """One parameter of the C function: ``kind`` is "size", "array" or "scalar"."""
    name: str
    kind: str
    dtype: str = ""


@dataclass(frozen=True)
class Scop:
    """A C function's region as a kernel, and its signature."""
    kernel: Kernel
    params: tuple[Param, ...]
    #: arrays the region writes (updated in place), in parameter order
    written: tuple[str, ...]
    #: the region's lines: its ``#pragma scop`` and ``#pragma endscop`` lines (0, 0
    #: when the whole body is the region), and the line of the function's definition
    lines: tuple[int, int]
    function_line: int = 0


def _blank(source: str) -> str:
    """Comments and preprocessor lines (but ``#pragma``) as spaces, lines kept."""
    out = re.sub(r"/\*.*?\*/", lambda m: re.sub(r"[^\n]", " ", m.group(0)), source, flags=re.S)
    out = re.sub(r"//[^\n]*", lambda m: " " * len(m.group(0)), out)
    lines = []
    for line in out.split("\n"):
        stripped = line.lstrip()
        lines.append(line if not stripped.startswith("#") or
                     stripped.startswith("#pragma") else " " * len(line))
    return "\n".join(lines)


def from_scop(source: str, function: str | None = None) -> Scop:
    """The ``#pragma scop`` region of ``function`` (the only function when None)."""
    from pycparser import c_ast, c_parser
    text = _blank(source)
    try:
        unit = c_parser.CParser().parse(text, filename="<scop>")
    except Exception as err:  # pycparser's ParseError: "<scop>:line:col: message"
        m = re.search(r":(\d+):(\d+): (.*)", str(err))
        line, col, msg = ((int(m.group(1)), int(m.group(2)), m.group(3)) if m
                          else (None, None, str(err)))
        raise ParseError(f"C syntax error: {msg}", line, col).attach_source(source) from None
    funcs = [d for d in unit.ext if isinstance(d, c_ast.FuncDef)]
    if function is not None:
        funcs = [f for f in funcs if f.decl.name == function]
        if not funcs:
            names = [d.decl.name for d in unit.ext if isinstance(d, c_ast.FuncDef)]
            raise SemanticError(f"no function {function!r} in the C source (functions: "
                                f"{', '.join(names) or 'none'})")
    elif len(funcs) != 1:
        marked = [f for f in funcs if any(isinstance(x, c_ast.Pragma) and x.string.strip()
                                          == "scop" for x in (f.body.block_items or []))]
        if len(marked) != 1:
            raise SemanticError(f"the C source has {len(funcs)} functions, {len(marked)} with "
                                "a '#pragma scop' region: name one with function=... "
                                "(--name on the command line)")
        funcs = marked
    try:
        return _Lower(funcs[0], source).scop()
    except (UnsupportedError, SemanticError) as err:
        raise err.attach_source(source) from None


class _Lower:
    def __init__(self, fn, source: str):  # noqa: ANN001 -- a pycparser FuncDef
        self.fn, self.source = fn, source
        self.params: list[Param] = []
        self.shapes: dict[str, tuple[E.Expr, ...]] = {}
        self.statements: list[Statement] = []
        self.written: set[str] = set()
        self.sizes: tuple[str, ...] = ()
        #: (statement, position vector) in program order
        self.order: list[tuple[str, tuple[int | str, ...]]] = []

    # -- errors ----------------------------------------------------------------------

    def _refuse(self, node, what: str, cls=UnsupportedError):  # noqa: ANN001, ANN202
        coord = getattr(node, "coord", None)
        line = coord.line if coord else None
        col = coord.column if coord else None
        return cls(what, line, col)

    # -- signature -------------------------------------------------------------------

    def scop(self) -> Scop:
        decl = self.fn.decl
        args = decl.type.args.params if decl.type.args else []
        for p in args:
            self._param(p)
        self.sizes = tuple(p.name for p in self.params if p.kind == "size")
        body = self.fn.body.block_items or []
        region, lines = self._region(body)
        if not region:
            raise self._refuse(self.fn, f"function {decl.name} has an empty scop region")
        for k, item in enumerate(region):
            self._stmt(item, [], [], [k])
        arrays, inputs, outputs = [], [], []
        for p in self.params:
            if p.kind == "size":
                continue
            if p.kind == "array" and p.name in self.written:
                role = "output"
                outputs.append(p.name)
            else:
                if p.kind == "scalar" and p.name in self.written:
                    raise self._refuse(self.fn, f"the region assigns the scalar parameter "
                                                f"{p.name!r} (a copy in C: write an array)")
                role = "input"
                inputs.append(p.name)
            arrays.append(Array(p.name, p.dtype, self.shapes.get(p.name, ()), role))
        used = {n for s in self.statements for n in _names(s)}
        arrays = [a for a in arrays if a.name in used or a.role == "output"]
        inputs = [n for n in inputs if n in used]
        kernel = Kernel(_c_name(decl.name), self.sizes, tuple(arrays), tuple(self.statements),
                        tuple(inputs), tuple(outputs),
                        default_context(self.sizes, tuple(arrays)), (), tuple(self.order))
        start = decl.coord.line if decl.coord else 0
        return Scop(kernel, tuple(self.params), tuple(outputs), lines, start)

    def _param(self, p) -> None:  # noqa: ANN001
        from pycparser import c_ast
        t = p.type
        dims: list = []
        while isinstance(t, (c_ast.ArrayDecl, c_ast.PtrDecl)):
            if isinstance(t, c_ast.PtrDecl):
                raise self._refuse(p, f"parameter {p.name!r} is a pointer: declare it as an "
                                      f"array with its extents ({p.name}[N][M])")
            dims.append(t.dim)
            t = t.type
        names = t.type.names if isinstance(t, c_ast.TypeDecl) and \
            isinstance(t.type, c_ast.IdentifierType) else []
        ctype = " ".join(n for n in names if n not in ("const", "restrict"))
        if not dims and any(n in SIZE_TYPES for n in names):
            self.params.append(Param(p.name, "size"))
            return
        base = C_TYPES.get(ctype)
        if base is None:
            raise self._refuse(p, f"parameter {p.name!r} has type {ctype or '?'}: polyc takes "
                                  "int sizes and float/double arrays and scalars")
        if not dims:
            self.params.append(Param(p.name, "scalar", base))
            return
        if any(d is None for d in dims):
            raise self._refuse(p, f"array parameter {p.name!r} needs every extent "
                                  f"({p.name}[N][M], not {p.name}[])")
        sizes = tuple(q.name for q in self.params if q.kind == "size")
        self.sizes = sizes
        self.shapes[p.name] = tuple(self._affine(d, (), "an array extent") for d in dims)
        self.params.append(Param(p.name, "array", base))

    def _region(self, body: list) -> tuple[list, tuple[int, int]]:
        from pycparser import c_ast
        marks = [i for i, s in enumerate(body) if isinstance(s, c_ast.Pragma)
                 and s.string.strip() in ("scop", "endscop")]
        if not marks:
            region = [s for s in body if not isinstance(s, c_ast.Decl)]
        else:
            starts = [i for i in marks if body[i].string.strip() == "scop"]
            ends = [i for i in marks if body[i].string.strip() == "endscop"]
            if len(starts) != 1 or len(ends) != 1 or ends[0] < starts[0]:
                raise self._refuse(body[marks[0]], "expected one '#pragma scop' followed by "
                                                   "one '#pragma endscop'", SemanticError)
            region = body[starts[0] + 1: ends[0]]
            outside = [s for i, s in enumerate(body) if (i < starts[0] or i > ends[0])
                       and not isinstance(s, (c_ast.Decl, c_ast.Return))]
            if outside:
                raise self._refuse(outside[0], "code outside the scop region is not "
                                               "compiled; move it inside or remove it")
        if not marks:
            return region, (0, 0)
        first, last = body[starts[0]].coord, body[ends[0]].coord
        return region, (first.line if first else 0, last.line if last else 0)

    # -- statements ------------------------------------------------------------------

    def _stmt(self, node, loops: list[str], conds: list[str],  # noqa: ANN001
              beta: list[int | str]) -> None:
        """Lower ``node`` at position ``beta`` (its program-order vector so far)."""
        from pycparser import c_ast
        if isinstance(node, c_ast.Compound):
            for k, item in enumerate(node.block_items or []):
                self._stmt(item, loops, conds, beta + [k])
        elif isinstance(node, c_ast.For):
            self._for(node, loops, conds, beta)
        elif isinstance(node, c_ast.If):
            cond = self._condition(node.cond, loops)
            self._stmt(node.iftrue, loops, conds + [cond], beta + [0])
            if node.iffalse is not None:
                self._stmt(node.iffalse, loops, conds + [f"not ({cond})"], beta + [1])
        elif isinstance(node, c_ast.Assignment):
            self._assign(node, loops, conds, beta)
        elif isinstance(node, c_ast.EmptyStatement):
            return
        elif isinstance(node, c_ast.Decl):
            raise self._refuse(node, f"a declaration ({node.name}) inside the scop region: "
                                     "polyc compiles loops and array assignments only")
        else:
            raise self._refuse(node, f"{type(node).__name__} is not supported in a scop "
                                     "(for loops, if, and array assignments only)")

    def _for(self, node, loops: list[str], conds: list[str],  # noqa: ANN001
             beta: list[int | str]) -> None:
        from pycparser import c_ast
        init = node.init
        if isinstance(init, c_ast.DeclList) and len(init.decls) == 1:
            it, lo = init.decls[0].name, init.decls[0].init
        elif isinstance(init, c_ast.Assignment) and init.op == "=" and \
                isinstance(init.lvalue, c_ast.ID):
            it, lo = init.lvalue.name, init.rvalue
        else:
            raise self._refuse(node, "a for loop must start 'for (int i = lower; ...)'")
        if it in loops or it in self.sizes:
            raise self._refuse(node, f"loop iterator {it!r} hides an enclosing loop or "
                                     "parameter of the same name")
        if lo is None:
            raise self._refuse(node, f"loop iterator {it!r} has no initial value")
        step = node.next
        unit = (isinstance(step, c_ast.UnaryOp) and step.op in ("p++", "++")
                and isinstance(step.expr, c_ast.ID) and step.expr.name == it) or (
            isinstance(step, c_ast.Assignment) and step.op == "+=" and
            isinstance(step.lvalue, c_ast.ID) and step.lvalue.name == it and
            isinstance(step.rvalue, c_ast.Constant) and step.rvalue.value == "1")
        if not unit:
            raise self._refuse(step or node, f"loop {it!r} must step by +1 (i++, ++i or "
                                             "i += 1)")
        cond = node.cond
        if not (isinstance(cond, c_ast.BinaryOp) and cond.op in ("<", "<=")
                and isinstance(cond.left, c_ast.ID) and cond.left.name == it):
            raise self._refuse(cond or node, f"the loop condition must be '{it} < upper' or "
                                             f"'{it} <= upper'")
        lower = self._isl(lo, loops)
        upper = self._isl(cond.right, loops)
        bound = [f"{it} >= {lower}", f"{it} {cond.op} {upper}"]
        body = node.stmt
        inner = beta + [it] if isinstance(body, c_ast.Compound) else beta + [it, 0]
        self._stmt(body, loops + [it], conds + bound, inner)

    def _condition(self, node, loops: list[str]) -> str:  # noqa: ANN001
        from pycparser import c_ast
        if isinstance(node, c_ast.BinaryOp) and node.op in ("&&", "||"):
            a, b = self._condition(node.left, loops), self._condition(node.right, loops)
            return f"({a}) {'and' if node.op == '&&' else 'or'} ({b})"
        if isinstance(node, c_ast.UnaryOp) and node.op == "!":
            return f"not ({self._condition(node.expr, loops)})"
        if isinstance(node, c_ast.BinaryOp) and node.op in ("<", "<=", ">", ">=", "==", "!="):
            a, b = self._isl(node.left, loops), self._isl(node.right, loops)
            op = {"==": "=", "!=": "!="}.get(node.op, node.op)
            if op == "!=":
                return f"({a} < {b} or {a} > {b})"
            return f"{a} {op} {b}"
        raise self._refuse(node, "an if condition must compare affine expressions of the "
                                 "loop iterators and parameters")

    def _assign(self, node, loops: list[str], conds: list[str],  # noqa: ANN001
                beta: list[int | str]) -> None:
        array, indices = self._ref(node.lvalue, loops)
        if array not in self.shapes:
            raise self._refuse(node.lvalue, f"{array!r} is not an array parameter of the "
                                            "function: only arrays can be assigned")
        if node.op != "=" and node.op not in COMPOUND:
            raise self._refuse(node, f"the assignment operator {node.op} is not supported")
        value = self._value(node.rvalue, loops)
        if node.op in COMPOUND:  # A[i] += e is A[i] = A[i] + e: program order kept
            value = E.Binary(COMPOUND[node.op], E.Read(array, indices), value)
        name = f"S{len(self.statements)}"
        body = " and ".join(f"({c})" for c in conds)
        text = (f"{params_prefix(self.sizes)}{{ {name}[{', '.join(loops)}]"
                + (f" : {body} }}" if body else " }"))
        try:
            domain = isl.Set(text)
        except isl.Error as err:
            raise self._refuse(node, f"the iteration domain is not affine ({err})") from None
        self.written.add(array)
        coord = node.coord
        origin = f"line {coord.line}" if coord else ""
        self.statements.append(Statement(name, domain, tuple(loops),
                                         Access(array, indices), ASSIGN, value, origin))
        self.order.append((name, tuple(beta)))

    # -- expressions -----------------------------------------------------------------

    def _ref(self, node, loops: list[str]) -> tuple[str, tuple[E.Expr, ...]]:  # noqa: ANN001
        from pycparser import c_ast
        subs = []
        while isinstance(node, c_ast.ArrayRef):
            subs.append(node.subscript)
            node = node.name
        if not isinstance(node, c_ast.ID):
            raise self._refuse(node, "expected an array element A[i][j]")
        name = node.name
        if name not in self.shapes:
            raise self._refuse(node, f"{name!r} is not an array parameter of the function",
                               SemanticError)
        subs.reverse()
        rank = len(self.shapes[name])
        if len(subs) != rank:
            raise self._refuse(node, f"{name} has {rank} dimensions, indexed with {len(subs)}",
                               SemanticError)
        return name, tuple(self._affine(s, loops, f"an index of {name}") for s in subs)

    def _affine(self, node, loops, what: str) -> E.Expr:  # noqa: ANN001
        e = self._value(node, list(loops), affine=True)
        if not E.is_affine(e):
            raise self._refuse(node, f"{what} must be affine in the loop iterators and the "
                                     f"integer parameters (got {E.show(e)})")
        return e

    def _isl(self, node, loops: list[str]) -> str:  # noqa: ANN001
        """An affine bound as isl text (``min``/``max`` allowed)."""
        from pycparser import c_ast
        if isinstance(node, c_ast.FuncCall) and getattr(node.name, "name", "") in ("min", "max"):
            args = node.args.exprs if node.args else []
            if len(args) != 2:
                raise self._refuse(node, f"{node.name.name} takes two arguments")
            return (f"{node.name.name}({self._isl(args[0], loops)}, "
                    f"{self._isl(args[1], loops)})")
        return E.to_isl(self._affine(node, loops, "a loop bound"))

    def _value(self, node, loops: list[str], affine: bool = False) -> E.Expr:  # noqa: ANN001
        from pycparser import c_ast
        if isinstance(node, c_ast.Constant):
            return self._constant(node)
        if isinstance(node, c_ast.ID):
            if node.name in loops:
                return E.Index(node.name)
            if node.name in self.sizes:
                return E.Size(node.name)
            kind = next((p for p in self.params if p.name == node.name), None)
            if kind is not None and kind.kind == "scalar" and not affine:
                return E.Read(node.name, ())
            raise self._refuse(node, f"unknown name {node.name!r} (not a loop iterator, "
                                     "parameter or scalar)", SemanticError)
        if isinstance(node, c_ast.ArrayRef):
            if affine:
                raise self._refuse(node, "an array element in an index or bound is not affine")
            array, indices = self._ref(node, loops)
            return E.Read(array, indices)
        if isinstance(node, c_ast.UnaryOp) and node.op in ("-", "+"):
            x = self._value(node.expr, loops, affine)
            return E.Unary("-", x) if node.op == "-" else x
        if isinstance(node, c_ast.BinaryOp) and node.op in ("+", "-", "*", "/"):
            a = self._value(node.left, loops, affine)
            b = self._value(node.right, loops, affine)
            if node.op == "/" and _integral(a) and _integral(b):
                raise self._refuse(node, "integer division: write a floating-point "
                                         "constant (2.0) or cast")
            return E.Binary(node.op, a, b)
        if isinstance(node, c_ast.Cast) and not affine:
            names = getattr(getattr(node.to_type.type, "type", None), "names", [])
            dtype = C_TYPES.get(" ".join(names))
            if dtype is None:
                raise self._refuse(node, f"a cast to {' '.join(names)} is not supported")
            return E.Cast(dtype, self._value(node.expr, loops))
        if isinstance(node, c_ast.FuncCall) and not affine:
            fname = getattr(node.name, "name", "")
            args = tuple(self._value(a, loops) for a in (node.args.exprs if node.args else []))
            fn = MATH.get(fname)
            if fn is None:
                raise self._refuse(node, f"unknown function {fname!r} (math functions "
                                         "such as sqrt, exp, fmax are supported)")
            arity = E.BUILTINS[fn]
            if arity is not None and arity != len(args):
                raise self._refuse(node, f"{fname} takes {arity} arguments, got {len(args)}")
            return E.Call(fn, args)
        if isinstance(node, c_ast.TernaryOp) and not affine:
            raise self._refuse(node, "the ?: operator is not supported in a scop yet")
        raise self._refuse(node, f"{type(node).__name__} is not supported in "
                                 + ("an affine expression" if affine else "an expression"))

    def _constant(self, node) -> E.Const:  # noqa: ANN001
        text = node.value.rstrip("fFlLuU")
        if node.type in ("int", "long", "unsigned int"):
            return E.Const(int(text, 0))
        if node.type in ("float", "double"):
            return E.Const(float(text))
        raise self._refuse(node, f"a {node.type} constant is not supported")


def _integral(e: E.Expr) -> bool:
    if isinstance(e, (E.Index, E.Size)):
        return True
    if isinstance(e, E.Const):
        return isinstance(e.value, int)
    if isinstance(e, E.Binary) and e.op in ("+", "-", "*"):
        return _integral(e.a) and _integral(e.b)
    if isinstance(e, E.Unary):
        return _integral(e.x)
    return False


def _names(s: Statement) -> set[str]:
    out = {s.write.array}
    out |= {r.array for r in E.reads(s.value)}
    return out


def _c_name(name: str) -> str:
    return re.sub(r"\W", "_", name)
