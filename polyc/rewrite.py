"""Rewrites of a kernel's statements and arrays for the schedule workbench: Kernel -> Kernel.

The primitives of :class:`polyc.schedule.space.ScheduleSpace` that change *what* runs
rather than *when* call these passes; each keeps the kernel's meaning by construction
(its preconditions are checked here and refused with :class:`ScheduleError` naming what
fails), and the new kernel's dependences are then computed again from scratch, so the
schedule the user builds on it is checked as any other:

* :func:`split_statement` -- index-set splitting and peeling: the instances of a
  statement in a set become a statement of their own, at the same place in program
  order (both pieces keep the original's position vector, so the order between their
  instances is the original one);
* :func:`inline_statement` -- ``compute_inline``: a pointwise statement writing a
  temporary is substituted into every statement that reads it (recomputing it where a
  reader reads an element several times) and dropped;
* :func:`relayout` -- a temporary's dimensions permuted (its storage order), every
  access rewritten;
* :func:`cache_read` -- a copy of the part of an array a statement reads into a new
  temporary (optionally in another dimension order: packing), read instead;
* :func:`cache_write` -- a reduction accumulated into a new temporary and copied out
  after it;
* :func:`rfactor` -- a reduction over ``k`` split into ``F`` partial reductions over
  ``k mod F`` (a temporary with one more dimension) and a final reduction of them.

Statements created here get fresh names derived from the statement they come from
(``S1_1``, ``S1_2``...); arrays from the array (``A_local``, ``C_rf``).
"""
from __future__ import annotations

from dataclasses import replace

import islpy as isl

from . import expr as E
from .deps import program_order
from .errors import ScheduleError
from .ir import (REDUCTION_OPS, Access, Array, Kernel, Statement, params_prefix,
                 reduction_identity)

Order = dict[str, tuple[int | str, ...]]


# -- helpers ---------------------------------------------------------------------------

def fresh_statement(kernel: Kernel, base: str, taken: set[str] | None = None) -> str:
    names = {s.name for s in kernel.statements} | (taken or set())
    k = 1
    while f"{base}_{k}" in names:
        k += 1
    return f"{base}_{k}"


def fresh_array(kernel: Kernel, base: str) -> str:
    names = {a.name for a in kernel.arrays}
    out, k = base, 2
    while out in names:
        out, k = f"{base}{k}", k + 1
    return out


def _orders(kernel: Kernel) -> Order:
    return {s.name: kernel.position(s.name) for s in kernel.statements}


def _rebuilt(kernel: Kernel, statements: list[Statement], order: Order,
             arrays: tuple[Array, ...] | None = None) -> Kernel:
    """``kernel`` with these statements (and arrays), every statement's position vector
    given explicitly (so that pieces of one statement can share one)."""
    used = {a for s in statements for a in ({s.write.array} | {r.array for r in s.reads})}
    arrays = tuple(a for a in (arrays or kernel.arrays) if a.role != "temp" or a.name in used)
    return Kernel(kernel.name, kernel.sizes, arrays, tuple(statements), kernel.inputs,
                  kernel.outputs, kernel.context, kernel.fixed_sizes,
                  tuple((s.name, order[s.name]) for s in statements),
                  constants=kernel.constants)


def _alone(kernel: Kernel, stmt: str, what: str) -> int:
    """The top-level position of ``stmt``, which must have a loop nest of its own (new
    statements go before or after that nest)."""
    order = _orders(kernel)
    top = order[stmt][0]
    if any(o[0] == top for name, o in order.items() if name != stmt):
        raise ScheduleError(f"{what}: {stmt} shares its loops with other statements of the "
                            "C source; only a statement with a loop nest of its own can be "
                            "rewritten this way")
    return int(top)


def _insert(kernel: Kernel, stmt: str, before: list[Statement], replaced: list[Statement],
            after: list[Statement]) -> tuple[list[Statement], Order]:
    """The statements with ``stmt`` replaced by ``before + replaced + after``, each of
    them a top-level nest of its own in that order (top positions renumbered)."""
    order = _orders(kernel)
    top = _alone(kernel, stmt, "rewrite")
    new_order: Order = {}
    stmts: list[Statement] = []
    for s in kernel.statements:
        o = order[s.name]
        if s.name != stmt:
            shift = 0 if int(o[0]) < top else len(before) + len(replaced) + len(after) - 1
            new_order[s.name] = (int(o[0]) + shift, *o[1:])
            stmts.append(s)
            continue
        for k, piece in enumerate(before + replaced + after):
            new_order[piece.name] = (top + k, *piece.iterators)
            stmts.append(piece)
    return stmts, new_order


def replace_statement(kernel: Kernel, stmt: str, before: list[Statement],
                      replaced: list[Statement], arrays: tuple[Array, ...] | None = None
                      ) -> Kernel:
    """``kernel`` with ``stmt`` (a loop nest of its own) replaced by ``before +
    replaced``, each a nest of its own in that order, and with ``arrays`` (default: its
    own). Refused (:class:`ScheduleError`) when ``stmt`` shares its loops."""
    stmts, order = _insert(kernel, stmt, before, replaced, [])
    return _rebuilt(kernel, stmts, order, arrays)


def _renamed(domain: isl.Set, name: str, iterators: tuple[str, ...]) -> isl.Set:
    d = domain.set_tuple_name(name)
    for i, it in enumerate(iterators):
        d = d.set_dim_name(isl.dim_type.set, i, it)
    return d


def _map_reads(e: E.Expr, array: str, fn) -> E.Expr:
    return E.map_expr(e, lambda x: fn(x) if isinstance(x, E.Read) and x.array == array
                      else None)


def _footprint(kernel: Kernel, s: Statement, array: str, name: str,
               iterators: tuple[str, ...]) -> isl.Set:
    """The elements of ``array`` that ``s`` reads, as the domain of statement ``name``."""
    shape = kernel.array(array).shape
    rel = None
    for r in E.reads(s.value):
        if r.array != array:
            continue
        if not all(E.is_affine(i) for i in r.indices):
            raise ScheduleError(f"{s.name} reads {array} at a non-affine index: its "
                                "footprint is not known")
        m = Access(r.array, r.indices).relation(s.domain, shape)
        rel = m if rel is None else rel.union(m)
    if rel is None:
        raise ScheduleError(f"{s.name} does not read {array}")
    # only the elements inside the array: a read under a guard (``i < N ? A(i) : 0``) has
    # out-of-bounds indices that never run, and the copy must not touch them
    inside = isl.Set(f"{params_prefix(kernel.sizes)}{{ {array}[{', '.join(iterators)}] : "
                     + " and ".join(f"0 <= {it} < {E.to_isl(x)}"
                                    for it, x in zip(iterators, shape)) + " }") \
        if shape else isl.Set(f"{params_prefix(kernel.sizes)}{{ {array}[] }}")
    found = rel.range().intersect(inside).coalesce()
    return _renamed(found, name, iterators).intersect_params(kernel.context)


def _instance(point: isl.Point, name: str) -> str:
    """``S0[0, 3] (with M=1, K=4)``: a sample point of a statement's instances."""
    space = point.get_space()
    coords = [point.get_coordinate_val(isl.dim_type.set, i).to_python()
              for i in range(space.dim(isl.dim_type.set))]
    params = [f"{space.get_dim_name(isl.dim_type.param, i)}="
              f"{point.get_coordinate_val(isl.dim_type.param, i).to_python()}"
              for i in range(space.dim(isl.dim_type.param))]
    return f"{name}[{', '.join(map(str, coords))}]" + (f" (with {', '.join(params)})"
                                                          if params else "")


def _writers(kernel: Kernel, array: str) -> list[str]:
    return [s.name for s in kernel.statements if s.write.array == array]


# -- the rewrites ----------------------------------------------------------------------

def split_statement(kernel: Kernel, stmt: str, condition: str | isl.Set,
                    note: str = "") -> tuple[Kernel, str]:
    """The instances of ``stmt`` that satisfy ``condition`` (isl constraints over its
    iterators and the sizes, e.g. ``i < 1``, or a set of its instances, described by
    ``note``) become a new statement (returned), the others stay ``stmt``. Refused when
    either piece would be empty for every size (an empty piece of a kernel specialised to
    sizes is kept: a trace replays on any size). Each piece's ``origin`` ends with
    ``piece: ...``, what it holds."""
    s = kernel.statement(stmt)
    if isinstance(condition, isl.Set):
        cond = condition
    else:
        try:
            cond = isl.Set(f"{params_prefix(kernel.sizes)}{{ {stmt}[{', '.join(s.iterators)}]"
                           f" : {condition} }}")
        except isl.Error as err:
            raise ScheduleError(f"the condition {condition!r} on {stmt} is not affine in "
                                f"{', '.join(s.iterators)} and the sizes: {err}") from None
    inside = s.domain.intersect(cond).intersect_params(kernel.context)
    outside = s.domain.subtract(cond).intersect_params(kernel.context)
    note = note or str(condition)
    for part, what in ((inside, "is in"), (outside, "is outside")):
        if part.is_empty() and not kernel.fixed_sizes:  # (a trace replays on any size)
            raise ScheduleError(f"no instance of {stmt} {what} {note} for any size: "
                                "nothing to split")
    name = fresh_statement(kernel, stmt)
    piece = replace(s, name=name, domain=_renamed(inside.coalesce(), name, s.iterators),
                    origin=f"{s.origin}; piece: {note} of {stmt}".lstrip("; "))
    rest = replace(s, domain=outside.coalesce(),
                   origin=f"{s.origin}; piece: not {note}".lstrip("; "))
    order = _orders(kernel)
    order[name] = order[stmt]
    stmts: list[Statement] = []
    for x in kernel.statements:
        stmts += [rest, piece] if x.name == stmt else [x]
    return _rebuilt(kernel, stmts, order), name


def inline_statement(kernel: Kernel, stmt: str) -> Kernel:
    """``compute_inline``: substitute the value of ``stmt`` (a plain assignment
    ``T(i, j...) = f(...)`` of a temporary, over its own iterators in order) into every
    later statement that reads ``T``, and drop it. Refused unless ``stmt`` is the only
    writer of ``T``, nothing writes what it reads, and every element read was written by
    it."""
    s = kernel.statement(stmt)
    t = s.write.array
    what = f"compute_inline({stmt!r})"
    if kernel.array(t).role != "temp":
        raise ScheduleError(f"{what}: {stmt} writes {t}, an {kernel.array(t).role} of "
                            f"{kernel.name}; only a temporary's statement can be inlined")
    if s.is_reduction:
        raise ScheduleError(f"{what}: {stmt} is a reduction ({t} {s.op}= ...); only a "
                            "plain assignment can be inlined")
    idx = s.write.indices
    if len(idx) != len(s.iterators) or not all(
            isinstance(x, E.Index) and x.name == it for x, it in zip(idx, s.iterators)):
        raise ScheduleError(f"{what}: {stmt} writes {t} at {E.show(E.Read(t, idx))}, not at "
                            f"its iterators ({', '.join(s.iterators)}) in order")
    others = [w for w in _writers(kernel, t) if w != stmt]
    if others:
        raise ScheduleError(f"{what}: {t} is also written by {', '.join(others)}")
    sources = {r.array for r in E.reads(s.value)}
    if t in sources:
        raise ScheduleError(f"{what}: {stmt} reads the array it writes")
    written = [w.name for w in kernel.statements if w.write.array in sources]
    if written:
        raise ScheduleError(f"{what}: {', '.join(written)} write(s) what {stmt} reads "
                            f"({', '.join(sorted(sources))}): its value depends on when it "
                            "runs")
    readers = [r for r in kernel.statements if t in {x.array for x in r.reads}]
    if not readers:
        raise ScheduleError(f"{what}: nothing reads {t}")
    own = s.write.relation(s.domain).range().intersect_params(kernel.context)
    for r in readers:
        for x in r.reads:
            if x.array != t:
                continue
            if not x.is_affine:
                raise ScheduleError(f"{what}: {r.name} reads {t} at a non-affine index")
            read = x.relation(r.domain).range().intersect_params(kernel.context)
            if not read.is_subset(own):
                raise ScheduleError(f"{what}: {r.name} reads elements of {t} that {stmt} "
                                    f"does not write (e.g. {read.subtract(own).sample_point()})")
    dtypes = {a.name: a.dtype for a in kernel.arrays}
    value = s.value
    if E.infer_dtype(value, dtypes) != dtypes[t]:
        value = E.Cast(dtypes[t], value)

    def substitute(x: E.Read) -> E.Expr:
        env = dict(zip(s.iterators, x.indices))
        return E.map_expr(value, lambda y: env.get(y.name) if isinstance(y, E.Index) else None)

    order = _orders(kernel)
    stmts = [replace(r, value=_map_reads(r.value, t, substitute)) if r in readers else r
             for r in kernel.statements if r.name != stmt]
    return _rebuilt(kernel, stmts, order)


def relayout(kernel: Kernel, array: str, order: tuple[int, ...]) -> Kernel:
    """The temporary ``array`` stored with its dimensions in ``order`` (dimension
    ``order[0]`` outermost): its shape and every access permuted."""
    a = kernel.array(array)
    what = f"layout({array!r}, {tuple(order)})"
    if a.role != "temp":
        raise ScheduleError(f"{what}: {array} is an {a.role} of {kernel.name}: its layout is "
                            "the caller's; only temporaries can be laid out anew (cache_read "
                            "makes one)")
    if sorted(order) != list(range(a.rank)):
        raise ScheduleError(f"{what}: give a permutation of 0..{a.rank - 1}")

    def perm(x: tuple) -> tuple:
        return tuple(x[d] for d in order)

    def stmt(s: Statement) -> Statement:
        write = Access(array, perm(s.write.indices)) if s.write.array == array else s.write
        value = _map_reads(s.value, array, lambda r: E.Read(array, perm(r.indices)))
        return replace(s, write=write, value=value)
    arrays = tuple(replace(x, shape=perm(x.shape)) if x.name == array else x
                   for x in kernel.arrays)
    return _rebuilt(kernel, [stmt(s) for s in kernel.statements], _orders(kernel), arrays)


def cache_read(kernel: Kernel, stmt: str, array: str,
               order: tuple[int, ...] | None = None) -> tuple[Kernel, str, str]:
    """A copy ``A_local(i...) = A(i...)`` of the elements of ``array`` that ``stmt``
    reads, made just before ``stmt``, which reads the copy instead; ``order`` lays the
    copy out in another dimension order (packing). Returns the kernel, the copy's
    statement and the new array. Refused when ``stmt`` writes ``array``."""
    s = kernel.statement(stmt)
    a = kernel.array(array)
    what = f"cache_read({stmt!r}, {array!r})"
    if s.write.array == array:
        raise ScheduleError(f"{what}: {stmt} writes {array}; cache_write caches a written "
                            "array")
    _alone(kernel, stmt, what)
    name = fresh_statement(kernel, stmt)
    local = fresh_array(kernel, f"{array}_local")
    iters = tuple(f"i{d}" for d in range(a.rank))
    domain = _footprint(kernel, s, array, name, iters)
    index = tuple(E.Index(i) for i in iters)
    copy = Statement(name, domain, iters, Access(local, index), "=", E.Read(array, index),
                     f"cache_read of {array} for {stmt}")
    reader = replace(s, value=_map_reads(s.value, array, lambda r: E.Read(local, r.indices)))
    arrays = kernel.arrays + (Array(local, a.dtype, a.shape, "temp"),)
    stmts, positions = _insert(kernel, stmt, [copy], [reader], [])
    out = _rebuilt(kernel, stmts, positions, arrays)
    if order is not None:
        out = relayout(out, local, tuple(order))
    return out, name, local


def cache_write(kernel: Kernel, stmt: str) -> tuple[Kernel, str, str]:
    """``stmt`` (and the statement that initialises what it accumulates, if one comes
    just before it) write a new temporary ``C_local`` instead of its array ``C``; a copy
    ``C(i...) = C_local(i...)`` of the elements it writes follows it. Returns the kernel,
    the copy's statement and the new array. Refused when ``stmt`` reads elements of ``C``
    that it and its initialisation did not write (the temporary would start undefined)."""
    s = kernel.statement(stmt)
    c = s.write.array
    a = kernel.array(c)
    what = f"cache_write({stmt!r})"
    _alone(kernel, stmt, what)
    group = [s]
    i = kernel.statements.index(s)
    if i > 0:
        prev = kernel.statements[i - 1]
        if prev.write.array == c and prev.kind == "init" and not prev.is_reduction:
            _alone(kernel, prev.name, what)
            group = [prev, s]
    written = None
    for g in group:
        w = g.write.relation(g.domain).range()
        written = w if written is None else written.union(w)
    # every read of C in the group must see a value the group wrote (exact dataflow over
    # the group alone): else the temporary would be read before it is set
    space = kernel.context.get_space()
    reads, writes = isl.UnionMap.empty(space), isl.UnionMap.empty(space)
    for g in group:
        writes = writes.union(isl.UnionMap.from_map(g.write.relation(g.domain)))
        for x in g.reads:
            if x.array == c:
                reads = reads.union(isl.UnionMap.from_map(x.relation(g.domain)))
    order = program_order(kernel).intersect_domain(isl.UnionSet.from_set(s.domain).union(
        isl.UnionSet.from_set(group[0].domain)))
    flow = isl.UnionAccessInfo.from_sink(reads).set_must_source(writes) \
        .set_schedule_map(order).compute_flow()
    unset = flow.get_may_no_source().intersect_params(kernel.context)
    if not unset.is_empty():
        first = _instance(unset.domain().sample_point(), s.name)
        raise ScheduleError(f"{what}: {first} reads an element of {c} that is not written "
                            f"before it{' by its initialisation' if len(group) > 1 else ''}"
                            " (the temporary would start undefined)")
    local = fresh_array(kernel, f"{c}_local")
    name = fresh_statement(kernel, stmt)
    iters = tuple(f"i{d}" for d in range(a.rank))
    domain = _renamed(written.coalesce(), name, iters).intersect_params(kernel.context)
    index = tuple(E.Index(i) for i in iters)
    out_copy = Statement(name, domain, iters, Access(c, index), "=", E.Read(local, index),
                         f"cache_write of {c} for {stmt}")

    def redirect(g: Statement) -> Statement:
        return replace(g, write=Access(local, g.write.indices),
                       value=_map_reads(g.value, c, lambda r: E.Read(local, r.indices)))
    arrays = kernel.arrays + (Array(local, a.dtype, a.shape, "temp"),)
    new = {g.name: redirect(g) for g in group}
    k2 = _rebuilt(kernel, [new.get(x.name, x) for x in kernel.statements], _orders(kernel),
                  arrays)
    stmts, positions = _insert(k2, stmt, [], [new[stmt]], [out_copy])
    return _rebuilt(k2, stmts, positions, arrays), name, local


def rfactor(kernel: Kernel, stmt: str, loop: str, factor: int) -> tuple[Kernel, tuple[str, str],
                                                                        str]:
    """The reduction ``C(w) op= f(x)`` of ``stmt`` over its reduction iterator ``loop``
    (``k``) in ``factor`` partial results: ``C_rf(w, kk) = identity`` (a new statement),
    ``C_rf(w, k mod factor) op= f(x)`` (``stmt``), then ``C(w) op= C_rf(w, kk)`` over
    ``kk`` (a new statement). The iterations of ``k`` that differ by less than ``factor``
    then update different elements: ``k``'s inner loop after ``split(k, factor)`` can be
    vectorized or run in parallel. Returns the kernel, (the init, the final reduction)
    and the new array. Only for a reduction whose value does not read ``C``."""
    s = kernel.statement(stmt)
    what = f"rfactor({stmt!r}, {loop!r}, {factor})"
    if not isinstance(factor, int) or factor < 2:
        raise ScheduleError(f"{what}: the factor must be an integer of at least 2")
    if s.op not in REDUCTION_OPS:
        raise ScheduleError(f"{what}: {stmt} is not a reduction")
    c = s.write.array
    if any(r.array == c for r in E.reads(s.value)):
        raise ScheduleError(f"{what}: {stmt} reads {c}, the array it reduces into: its "
                            "updates do not commute")
    if loop not in s.reduction_iterators:
        raise ScheduleError(f"{what}: {loop!r} is not a reduction iterator of {stmt} "
                            f"(those: {', '.join(s.reduction_iterators) or 'none'})")
    _alone(kernel, stmt, what)
    a = kernel.array(c)
    rf = fresh_array(kernel, f"{c}_rf")
    taken: set[str] = set()
    init_name = fresh_statement(kernel, stmt, taken)
    taken.add(init_name)
    final_name = fresh_statement(kernel, stmt, taken)
    iters = tuple(f"i{d}" for d in range(a.rank)) + ("kk",)
    written = s.write.relation(s.domain).range().intersect_params(kernel.context)
    base = _renamed(written.coalesce(), init_name, iters[:-1])
    box = base.add_dims(isl.dim_type.set, 1).set_dim_name(isl.dim_type.set, a.rank, "kk")
    box = box.set_tuple_name(init_name).intersect(isl.Set(
        f"{params_prefix(kernel.sizes)}{{ {init_name}[{', '.join(iters)}] : "
        f"0 <= kk < {factor} }}")).intersect_params(kernel.context)
    index = tuple(E.Index(i) for i in iters)
    init = Statement(init_name, box, iters, Access(rf, index), "=",
                     reduction_identity(s.op, a.dtype), f"rfactor init of {c}", kind="init")
    part = replace(s, write=Access(rf, s.write.indices + (
        E.Binary("%", E.Index(loop), E.Const(factor)),)))
    final = Statement(final_name, box.set_tuple_name(final_name), iters,
                      Access(c, index[:-1]), s.op, E.Read(rf, index),
                      f"rfactor of {stmt} over {loop}")
    arrays = kernel.arrays + (Array(rf, a.dtype, a.shape + (E.Const(factor),), "temp"),)
    stmts, positions = _insert(kernel, stmt, [init], [part], [final])
    return _rebuilt(kernel, stmts, positions, arrays), (init_name, final_name), rf


# -- storage folding ------------------------------------------------------------------

def fold_storage(kernel: Kernel, array: str, slots: int) -> Kernel:
    """A temporary indexed first by a loop's step (a recurrence's state) stored in
    ``slots`` steps: index ``t - c`` becomes ``(t + slots - c) % slots``.

    Each step must read only the ``slots`` last steps' values, so that a slot is never
    overwritten before its last read. Checked on the accesses: every write's first index
    is the statement's first iterator (the step ``t``), and they all run in one loop
    (one statement, or statements sharing their outer loop: ``kernel.order``), a
    reduction's with its initialisation; every read's is ``t - c`` with
    ``0 <= c < slots`` in a statement of that loop, or a constant among the last
    ``slots`` steps in a statement after the loop (the final state).
    The dependences of the new kernel (the slots' reuse adds anti and output
    dependences) are computed from scratch, so the schedule is checked as any other.
    With as many slots as steps, the kernel is returned as it is."""
    a = kernel.array(array)
    if a.role != "temp":
        raise ScheduleError(f"fold_storage: {array!r} is not a temporary")
    try:
        steps = int(E.evaluate(a.shape[0], {}))
    except (ValueError, KeyError):
        raise ScheduleError(f"fold_storage: {array!r} has no constant first extent") from None
    if slots < 1:
        raise ScheduleError(f"fold_storage: {slots} slots for {array!r}")
    if slots >= steps:
        return kernel  # nothing to fold

    def offset(e: E.Expr, it: str) -> int | None:
        """c when ``e`` is ``it - c`` (or ``it``), else None."""
        if e == E.Index(it):
            return 0
        if isinstance(e, E.Binary) and e.op == "-" and e.a == E.Index(it) \
                and isinstance(e.b, E.Const) and isinstance(e.b.value, int):
            return int(e.b.value)
        return None

    def folded(e: E.Expr, it: str | None) -> E.Expr:
        if slots == 1:
            return E.Const(0)
        c = None if it is None else offset(e, it)
        if c is not None:
            return E.Binary("%", E.Binary("+", E.Index(it), E.Const(slots - c)) if c else
                            E.Index(it), E.Const(slots))
        return E.Const(int(E.evaluate(e, {})) % slots)

    writing = [s for s in kernel.statements if s.write.array == array]
    writers = {_loop_of(kernel, s) for s in writing}
    if len(writers) != 1:
        raise ScheduleError(f"fold_storage: the statements writing {array!r} "
                            f"({', '.join(s.name for s in writing)}) do not share one loop")
    if any(s.is_reduction for s in writing) and not any(s.kind == "init" for s in writing):
        # an update reads its own target: without an initialisation in the loop each
        # step would accumulate onto the slot's previous contents
        raise ScheduleError(f"fold_storage: {array!r} is reduced without being "
                            f"initialised in its loop")
    last_writer = max(kernel.position(s.name)[0] for s in writing)

    def check_read(r: E.Read, s: Statement) -> None:
        it = s.iterators[0] if s.iterators else None
        e = r.indices[0]
        c = None if it is None else offset(e, it)
        if c is not None and 0 <= c < slots and writers == {_loop_of(kernel, s)}:
            return
        try:
            v = int(E.evaluate(e, {}))
        except (ValueError, KeyError):
            v = None
        after = kernel.position(s.name)[0] > last_writer  # once the loop is over
        if v is not None and steps - slots <= v < steps and after:
            return
        raise ScheduleError(f"fold_storage: {s.name} reads {array!r} at step "
                            f"{E.show(e)}, not one of the last {slots}")

    stmts = []
    for s in kernel.statements:
        write = s.write
        if write.array == array:
            if not s.iterators or write.indices[0] != E.Index(s.iterators[0]):
                raise ScheduleError(f"fold_storage: {s.name} writes {array!r} at step "
                                    f"{E.show(write.indices[0])}, not at its first iterator")
            write = Access(array, (folded(write.indices[0], s.iterators[0]),)
                           + write.indices[1:])
        for r in E.reads(s.value):
            if r.array == array:
                check_read(r, s)
        it = s.iterators[0] if s.iterators else None

        def fold_read(e: E.Expr, it=it) -> E.Expr | None:
            if isinstance(e, E.Read) and e.array == array:
                return E.Read(array, (folded(e.indices[0], it),) + tuple(
                    E.map_expr(i, fold_read) for i in e.indices[1:]))
            return None
        stmts.append(replace(s, write=write, value=E.map_expr(s.value, fold_read)))
    arrays = tuple(replace(x, shape=(E.Const(slots),) + tuple(x.shape[1:]))
                   if x.name == array else x for x in kernel.arrays)
    return replace(kernel, arrays=arrays, statements=tuple(stmts))


def _loop_of(kernel: Kernel, s: Statement) -> tuple[int | str, ...]:
    """The outer loop statement ``s`` runs in: shared with others when the kernel's
    order says so (``(position, iterator, ...)``), else its own."""
    pos = kernel.position(s.name)
    if kernel.order and len(pos) >= 2 and isinstance(pos[1], str):
        return pos[:2]
    return (s.name,)
