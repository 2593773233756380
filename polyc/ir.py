"""The polyhedral IR of polyc: frozen records that frontends build and passes transform.

Glossary (used with these meanings everywhere in polyc):

* **size** (parameter): a symbolic extent such as ``M``; sizes are isl parameters.
* **array**: a named, typed, row-major tensor whose extents are affine expressions of sizes.
* **statement**: one assignment ``write OP= value`` executed once per point of its
  **iteration domain**, an isl set ``[M,N] -> { S1[m,n,k] : ... }`` whose tuple name is
  the statement's name and whose dimensions are its **iterators**.
* **access relation**: an isl map from a statement's domain to array elements
  (``{ S1[m,n,k] -> A[m,k] }``); one write and any number of reads per statement.
* **reduction statement**: ``op`` is ``+ * max min``; its iterators absent from the
  write are **reduction iterators**; the updates of one element commute.
* **schedule**: an isl schedule tree mapping every statement instance to a time;
  a **band** is a node of consecutive schedule dimensions (loops); a band member is
  **coincident** when the loop carries no dependence that forbids running its
  iterations at once; a **permutable** band may be interchanged and **tiled**
  into a **tile** band (loops over tiles) above a **point** band (loops inside a tile).
"""
from __future__ import annotations

from dataclasses import dataclass, field, replace

import islpy as isl

from . import dtypes as D
from . import expr as E

#: combine operators of statements, with the identity used by the ``!`` forms
REDUCTION_OPS = ("+", "*", "max", "min")
ASSIGN = "="


def reduction_identity(op: str, dtype: str) -> E.Const:
    """The identity of reduction ``op`` in ``dtype`` (the value a ``!`` form starts from)."""
    if dtype == "bool":
        return E.Const(op in ("*", "min"), dtype)
    if dtype in E.FLOAT_DTYPES:
        values = {"+": 0.0, "*": 1.0, "max": float("-inf"), "min": float("inf")}
        return E.Const(values[op], dtype)
    lo, hi = D.get(dtype).limits
    values_i = {"+": 0, "*": 1, "max": lo, "min": hi}
    return E.Const(values_i[op], dtype)


@dataclass(frozen=True)
class Array:
    """A tensor: ``name`` (a C identifier), ``dtype`` and ``shape`` (affine in sizes).

    ``role`` is ``"input"``, ``"output"`` or ``"temp"`` (allocated by the kernel).
    """
    name: str
    dtype: str
    shape: tuple[E.Expr, ...]
    role: str = "input"

    @property
    def rank(self) -> int:
        return len(self.shape)


@dataclass(frozen=True, eq=False)
class Access:
    """One access of a statement: ``array[indices]``.

    Indices are affine in its iterators and sizes, except for the indirect reads a
    frontend accepts on request (``X(I(i), j)``, see ``from_tc(allow_indirect=True)``):
    the relation of a non-affine index does not constrain that dimension.
    """
    array: str
    indices: tuple[E.Expr, ...]

    @property
    def is_affine(self) -> bool:
        return all(E.is_affine(i) for i in self.indices)

    def relation(self, domain: isl.Set, shape: tuple[E.Expr, ...] | None = None) -> isl.Map:
        """The access relation, restricted to ``domain`` (``shape``: :func:`access_relation`)."""
        return access_relation(domain, self.array, self.indices, shape)


@dataclass(frozen=True, eq=False)
class Statement:
    """``write = value`` (op ``"="``) or ``write = write OP value`` (a reduction update).

    ``domain`` is an isl set named ``name`` over ``iterators``; ``origin`` says where the
    statement came from (``"line 3"``, an ONNX node) for messages.
    """
    name: str
    domain: isl.Set
    iterators: tuple[str, ...]
    write: Access
    op: str
    value: E.Expr
    origin: str = ""
    #: "init" for the identity-initialisation of a `!` reduction, else "compute"
    kind: str = "compute"

    @property
    def is_reduction(self) -> bool:
        return self.op in REDUCTION_OPS

    @property
    def reads(self) -> tuple[Access, ...]:
        """Read accesses: those of ``value``, plus the written element of a reduction."""
        rs = tuple(Access(r.array, r.indices) for r in E.reads(self.value))
        if self.is_reduction:
            rs = (self.write,) + rs
        return rs

    @property
    def reduction_iterators(self) -> tuple[str, ...]:
        used: set[str] = set()
        for i in self.write.indices:
            used |= E.free_names(i)[0]
        return tuple(it for it in self.iterators if it not in used) if self.is_reduction else ()


@dataclass(frozen=True, eq=False)
class Kernel:
    """A whole operator: sizes, arrays and statements in program order.

    ``inputs`` and ``outputs`` name arrays in signature order; the other arrays are
    temporaries. ``context`` holds the constraints on sizes (every extent positive...).
    """
    name: str
    sizes: tuple[str, ...]
    arrays: tuple[Array, ...]
    statements: tuple[Statement, ...]
    inputs: tuple[str, ...]
    outputs: tuple[str, ...]
    context: isl.Set = field(default=None)  # type: ignore[assignment]
    #: scalar size values fixed at compile time (specialisation); empty: generic code
    fixed_sizes: tuple[tuple[str, int], ...] = ()
    #: the program order when statements share loops (C input): per statement, its
    #: position vector -- ints (positions in a sequence) and iterator names (loops),
    #: e.g. ``(0, "t", 1, "i", 0)``. Empty: each statement is a loop nest of its own, in
    #: sequence (TC, einsum, ONNX)
    order: tuple[tuple[str, tuple[int | str, ...]], ...] = ()
    #: ``(temporary, k)``: store it in ``k`` slots of its first dimension once the kernel
    #: is scheduled, if the schedule allows it (:func:`polyc.pipeline.fold_storage_hints`;
    #: a recurrence's state over time). The schedule is computed without: folded
    #: accesses (``t % 2``) make isl's scheduler 20-40x slower
    folds: tuple[tuple[str, int], ...] = ()
    #: flags of early exits from loops shared by statements (``order``): a temporary
    #: written at each step ``t`` of such a loop (``flag(t, ...)``, folded or not), after
    #: whose step the loop may stop when the flag is 0. The frontend that sets it
    #: promises that the later steps change nothing read after the loop -- with the
    #: storage its ``folds`` give (:func:`polyc.pipeline.fold_storage_hints` drops the
    #: exits with the folds when the schedule does not allow them). An optimization
    #: only: a target may run every step (CUDA does)
    exits: tuple[str, ...] = ()
    #: inputs whose values are fixed before any run (a model's weights): every thread
    #: may read them from a shared cache as they are, where an input that another kernel
    #: has just written sits in the caches of the cores that wrote it. Scheduling hints
    #: only (:func:`polyc.schedule.optimize._replicated_bytes`)
    constants: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        if self.context is None:
            object.__setattr__(self, "context", default_context(self.sizes, self.arrays))

    def array(self, name: str) -> Array:
        for a in self.arrays:
            if a.name == name:
                return a
        raise KeyError(name)

    def statement(self, name: str) -> Statement:
        for s in self.statements:
            if s.name == name:
                return s
        raise KeyError(name)

    @property
    def temporaries(self) -> tuple[Array, ...]:
        return tuple(a for a in self.arrays if a.role == "temp")

    def domain(self) -> isl.UnionSet:
        """The union of all iteration domains, with fixed sizes substituted."""
        u = isl.UnionSet.empty(self.context.get_space())
        for s in self.statements:
            u = u.union(isl.UnionSet.from_set(s.domain))
        return u.intersect_params(self.context)

    def specialize(self, values: dict[str, int]) -> Kernel:
        """The same kernel with every size fixed to ``values`` (in the context)."""
        ctx = self.context
        for name, v in values.items():
            pos = ctx.find_dim_by_name(isl.dim_type.param, name)
            if pos >= 0:
                ctx = ctx.fix_val(isl.dim_type.param, pos, isl.Val.int_from_si(ctx.get_ctx(), v))
        return replace(self, context=ctx, fixed_sizes=tuple(sorted(values.items())))

    def position(self, stmt: str) -> tuple[int | str, ...]:
        """The program-order position vector of ``stmt`` (see :attr:`order`)."""
        for name, beta in self.order:
            if name == stmt:
                return beta
        s = self.statement(stmt)
        return (self.statements.index(s), *s.iterators)


def params_prefix(sizes: tuple[str, ...] | list[str]) -> str:
    return f"[{', '.join(sizes)}] -> " if sizes else ""


def default_context(sizes: tuple[str, ...], arrays: tuple[Array, ...]) -> isl.Set:
    """Sizes are positive, and so is every input extent (outputs and temporaries may be
    empty: an index range that is empty for some sizes gives an extent of 0)."""
    conds = [f"{s} >= 1" for s in sizes]
    for a in arrays:
        if a.role != "input":
            continue
        for d in a.shape:
            if not isinstance(d, E.Const):
                conds.append(f"{E.to_isl(d)} >= 1")
    body = " and ".join(conds)
    return isl.Set(f"{params_prefix(sizes)}{{ : {body} }}" if body else "{ : }")


def fixed_bytes(kernel: "Kernel", array: str) -> int | None:
    """The bytes of one of ``kernel``'s arrays under its fixed sizes (None when a
    dimension is not a number: a size without a fixed value)."""
    a = kernel.array(array)
    sizes = dict(kernel.fixed_sizes)
    n = D.itemsize(a.dtype)
    for d in a.shape:
        idx, names = E.free_names(d)
        if idx or not names <= sizes.keys():
            return None
        n *= int(E.evaluate(d, {k: sizes[k] for k in names}))
    return n


def array_box(kernel: "Kernel", array: str) -> isl.Set:
    """``{ array[e..] : 0 <= e_d < extent_d }``: every element of ``array``, in the
    kernel's context."""
    arr = kernel.array(array)
    names = [f"d{i}" for i in range(arr.rank)]
    conds = " and ".join(f"0 <= {d} < {E.to_isl(x)}" for d, x in zip(names, arr.shape))
    text = f"{params_prefix(kernel.sizes)}{{ {array}[{', '.join(names)}]" + \
        (f" : {conds} }}" if conds else " }")
    return isl.Set(text).intersect_params(kernel.context)


def access_relation(domain: isl.Set, array: str, indices: tuple[E.Expr, ...],
                    shape: tuple[E.Expr, ...] | None = None) -> isl.Map:
    """``{ S[iters] -> array[indices] }`` restricted to ``domain``.

    A non-affine (indirect, data-dependent) index is over-approximated, as PPCG does
    for may-accesses: that dimension of the element may be any value -- any value in
    ``0 <= d < extent`` when the array's ``shape`` is given.
    """
    space = domain.get_space()
    sizes = [space.get_dim_name(isl.dim_type.param, i) for i in range(space.dim(isl.dim_type.param))]
    iters = [space.get_dim_name(isl.dim_type.set, i) for i in range(space.dim(isl.dim_type.set))]
    name = domain.get_tuple_name()
    idx, conds = [], []
    for d, i in enumerate(indices):
        if E.is_affine(i):
            idx.append(E.to_isl(i))
        else:
            var = f"polyc_any{d}"
            idx.append(var)
            if shape is not None:
                conds.append(f"0 <= {var} < {E.to_isl(shape[d])}")
    body = f" : {' and '.join(conds)}" if conds else ""
    m = isl.Map(f"{params_prefix(sizes)}{{ {name}[{', '.join(iters)}] -> "
                f"{array}[{', '.join(idx)}]{body} }}")
    return m.intersect_domain(domain)


def make_domain(name: str, iterators: tuple[str, ...], sizes: tuple[str, ...],
                bounds: dict[str, tuple[E.Expr, E.Expr]],
                extra: tuple[str, ...] = ()) -> isl.Set:
    """The rectangular domain ``lo <= it < hi`` for each iterator, plus ``extra`` isl constraints."""
    conds = [f"{E.to_isl(bounds[it][0])} <= {it} < {E.to_isl(bounds[it][1])}" for it in iterators]
    conds += list(extra)
    body = " and ".join(conds) if conds else ""
    text = f"{params_prefix(sizes)}{{ {name}[{', '.join(iterators)}]" + (f" : {body} }}" if body else " }")
    return isl.Set(text)


def element_iterators(indices: tuple[E.Expr, ...], iterators: tuple[str, ...],
                      element: tuple[E.Expr, ...], domain: isl.Set | None = None
                      ) -> dict[str, E.Expr] | None:
    """The ``iterators`` as expressions of the indices ``element`` of the element an
    access with ``indices`` reads: the inverse of the access, for the forms ``it + c``
    (``it = e - c``) and an adjacent pair ``(it + c) // k, (it + c) % k`` (``it = k*e0 +
    e1 - c``), and an iterator ``domain`` fixes to one value (a batch of 1); None when
    some iterator is not given so. Only the forms are inverted: whether the access is
    one-to-one is the caller's to check."""
    def shifted(ix: E.Expr) -> tuple[str, int] | None:
        """``(it, c)`` for ``ix == it + c``."""
        if not E.is_affine(ix) or any(isinstance(x, E.Binary) and x.op in ("//", "%")
                                      for x in E.walk(ix)):
            return None
        its, sizes = E.free_names(ix)
        if len(its) != 1 or sizes:
            return None
        it = next(iter(its))
        base = E.evaluate(ix, {it: 0})
        return (it, base) if E.evaluate(ix, {it: 1}) - base == 1 else None

    found: dict[str, E.Expr] = {}
    d = 0
    while d < len(indices):
        ix = indices[d]
        nxt = indices[d + 1] if d + 1 < len(indices) else None
        if isinstance(ix, E.Binary) and ix.op == "//" and isinstance(ix.b, E.Const) \
                and isinstance(nxt, E.Binary) and nxt.op == "%" and nxt.a == ix.a \
                and nxt.b == ix.b and (inner := shifted(ix.a)) is not None:
            it, c = inner
            value = E.Binary("+", E.Binary("*", ix.b, element[d]), element[d + 1])
            found.setdefault(it, E.Binary("-", value, E.Const(c)) if c else value)
            d += 2
            continue
        if E.free_names(ix)[0]:
            one = shifted(ix)
            if one is None:
                flat = _unflatten(ix, element[d], iterators, domain)
                if flat is None:
                    return None
                for it, value in flat.items():
                    found.setdefault(it, value)
                d += 1
                continue
            it, c = one
            found.setdefault(it, E.Binary("-", element[d], E.Const(c)) if c else element[d])
        d += 1
    if domain is not None:
        for d, it in enumerate(iterators):
            if it not in found:
                v = domain.plain_get_val_if_fixed(isl.dim_type.set, d)
                if not v.is_nan() and v.is_int():
                    found[it] = E.Const(v.to_python())
    return found if set(iterators) <= found.keys() else None


def _unflatten(ix: E.Expr, e: E.Expr, iterators: tuple[str, ...],
               domain: isl.Set | None) -> dict[str, E.Expr] | None:
    """The iterators of a flattened index ``ix = c0*i0 + c1*i1 + ... + i_last (+ c)``
    as expressions of its value ``e`` (``i_k = (e - c) // c_k % n_k``), when ``domain``
    bounds each ``i_k`` after the first to ``0 .. n_k - 1`` with ``c_(k-1) = c_k * n_k``
    (the row-major order of the pixels ``p = W*h + w``); else None."""
    if domain is None or not E.is_affine(ix) or any(
            isinstance(x, E.Binary) and x.op in ("//", "%") for x in E.walk(ix)):
        return None
    its, sizes = E.free_names(ix)
    if sizes or len(its) < 2 or not its <= set(iterators):
        return None
    env = dict.fromkeys(its, 0)
    base = E.evaluate(ix, env)
    coef = {}
    for it in its:
        coef[it] = E.evaluate(ix, {**env, it: 1}) - base
    order = sorted(its, key=lambda it: -coef[it])
    if coef[order[-1]] != 1:
        return None
    dom = domain.project_out(isl.dim_type.param, 0, domain.dim(isl.dim_type.param))
    if dom.is_empty():
        return None
    value = E.Binary("-", e, E.Const(base)) if base else e
    out: dict[str, E.Expr] = {}
    for k, it in enumerate(order):
        if k == 0:
            out[it] = E.Binary("//", value, E.Const(coef[it])) if coef[it] != 1 else value
            continue
        i = iterators.index(it)
        lo, hi = dom.dim_min_val(i), dom.dim_max_val(i)
        if not (lo.is_int() and hi.is_int()) or lo.to_python() != 0:
            return None
        n = hi.to_python() + 1
        if coef[order[k - 1]] != coef[it] * n:
            return None
        part = E.Binary("//", value, E.Const(coef[it])) if coef[it] != 1 else value
        out[it] = E.Binary("%", part, E.Const(n))
    return out


#: int32 lanes of a 512-bit vector: the lanes of one ``vpdpbusd``
QUAD_LANES = 16


@dataclass(frozen=True)
class QuadDot:
    """A statement ``acc(..) += sum_{r<4} int32(X(.., p, r)) * int32(W(.., r))`` of
    ``uint8`` and ``int8`` operands (:func:`quad_dot`): per element of ``acc``, the four
    products of one 32-bit lane of ``vpdpbusd`` (AVX-512 VNNI). ``lanes`` is ``X`` at
    ``r = 0``: consecutive ``p`` are consecutive groups of four bytes, so a vector of
    lanes is one contiguous load; ``broadcast`` is ``W`` at ``r = 0``: four bytes the
    lanes share. ``signed_lanes``: ``X`` is the int8 operand and ``W`` the uint8 one (a
    convolution with its output channels on the lanes: the weights are the vectors, the
    input's four channels of one pixel the broadcast)."""
    lanes: E.Read
    broadcast: E.Read
    signed_lanes: bool = False


def _terms(e: E.Expr) -> list[E.Expr]:
    if isinstance(e, E.Binary) and e.op == "+":
        return _terms(e.a) + _terms(e.b)
    return [e]


def _widened_read(e: E.Expr) -> E.Read | None:
    """``R`` of ``int32(R)`` (a cast to int32 of a plain read)."""
    if isinstance(e, E.Cast) and e.dtype == "int32" and isinstance(e.x, E.Read):
        return e.x
    return None


def quad_dot(stmt: Statement, kernel: Kernel, lane_iterator: str) -> QuadDot | None:
    """The :class:`QuadDot` form of ``stmt`` with its lanes along ``lane_iterator``, or
    None. Of the two operands of each product, one uint8 and one int8, ``X`` is the one
    whose second-to-last index holds ``lane_iterator`` (with coefficient 1, and nowhere
    else); ``X``'s last dimension has extent 4 and its last index is the constant ``r``;
    ``W`` does not depend on ``lane_iterator`` and differs between the terms only by its
    last index, the same constant ``r``."""
    if stmt.op != "+" or kernel.array(stmt.write.array).dtype != "int32":
        return None
    terms = _terms(stmt.value)
    if len(terms) != 4:
        return None
    by_r: dict[int, tuple[E.Read, E.Read]] = {}
    signed: bool | None = None
    for t in terms:
        if not (isinstance(t, E.Binary) and t.op == "*"):
            return None
        pair = [_widened_read(t.a), _widened_read(t.b)]
        if None in pair:
            return None
        types = [kernel.array(r.array).dtype for r in pair]
        if sorted(types) != ["int8", "uint8"]:
            return None
        x, w = pair if types[0] == "uint8" else pair[::-1]
        if not x.indices or not w.indices:
            return None
        if signed is None:  # the lanes: the operand indexed by the lane iterator
            signed = _lane_index(w, lane_iterator) and not _lane_index(x, lane_iterator)
        if signed:
            x, w = w, x
        rx, rw = x.indices[-1], w.indices[-1]
        if not (isinstance(rx, E.Const) and rx == rw and isinstance(rx.value, int)):
            return None
        by_r[rx.value] = (x, w)
    if sorted(by_r) != [0, 1, 2, 3]:
        return None
    x0, w0 = by_r[0]
    for x, w in by_r.values():
        if (x.array, x.indices[:-1], w.array, w.indices[:-1]) != \
                (x0.array, x0.indices[:-1], w0.array, w0.indices[:-1]):
            return None
    shape = kernel.array(x0.array).shape
    if len(x0.indices) < 2 or not isinstance(shape[-1], E.Const) or shape[-1].value != 4:
        return None
    if any(lane_iterator in E.free_names(ix)[0] for ix in x0.indices[:-2] + w0.indices):
        return None
    p = x0.indices[-2]
    if not E.is_affine(p) or lane_iterator not in E.free_names(p)[0]:
        return None
    names, sizes = E.free_names(p)
    env = dict.fromkeys(names | sizes, 0)
    base = E.evaluate(p, env)
    env[lane_iterator] = 1
    if E.evaluate(p, env) - base != 1:
        return None
    return QuadDot(x0, w0, bool(signed))


def _lane_index(read: E.Read, lane_iterator: str) -> bool:
    """Whether ``lane_iterator`` appears in the second-to-last index of ``read``."""
    return len(read.indices) >= 2 and lane_iterator in E.free_names(read.indices[-2])[0]


def row_dot(stmt: Statement, kernel: Kernel, row: str, q: str) -> E.Read | None:
    """The one read of ``stmt``'s value that walks both the row ``row`` and the sum ``q``
    (``q`` only in its last index, with coefficient 1, ``row`` elsewhere), the only read
    of its array, where ``stmt`` is a float sum (``+``, float32 or float64) whose value
    is what ``polyc.codegen.c_family``'s in-register transposes print on vectors: reads
    along ``q`` alone or of neither, constants, ``+ - * /`` and negation, all of the
    write's type. None otherwise. The register tile planner gives such a sum's tile
    whole vectors of rows (``polyc.schedule.register_tile.plan_dot``)."""
    if stmt.op != "+" or kernel.array(stmt.write.array).dtype not in ("float32", "float64"):
        return None
    dtype = kernel.array(stmt.write.array).dtype
    walked: list[E.Read] = []

    def fits(e: E.Expr) -> bool:  # (the operands, not the indices of reads)
        if isinstance(e, E.Binary):
            return e.op in ("+", "-", "*", "/") and fits(e.a) and fits(e.b)
        if isinstance(e, E.Unary):
            return e.op == "-" and fits(e.x)
        if isinstance(e, E.Const):
            return True
        if not isinstance(e, E.Read) or e.array == stmt.write.array or \
                kernel.array(e.array).dtype != dtype or not all(E.is_affine(x) for x in e.indices):
            return False
        used = [E.free_names(x)[0] for x in e.indices]
        on_row, on_sum = any(row in u for u in used), any(q in u for u in used)
        if on_row and on_sum:
            if row in used[-1] or not E.unit_last(e.indices, q):
                return False
            walked.append(e)
        return not on_row or on_sum

    # one read of the row array (its block replaces every read of the array: a second
    # one, A(k,j) or A(0,0), would read the block too)
    if not fits(stmt.value) or len(walked) != 1 or \
            sum(r.array == walked[0].array for r in E.reads(stmt.value)) != 1:
        return None
    return walked[0]
