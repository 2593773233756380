"""The C-family emitter: walks the isl AST once and prints C through cgen.

A dialect (:class:`CDialect` and its subclasses) holds what changes between targets:
pragmas, qualifiers, the index type. The function it generates for a kernel::

    int <kernel>(int64_t <sizes>..., const T *restrict <inputs>..., T *restrict <outputs>...)
    {
      if (!(<sizes satisfy kernel.context>))
        return 1;
      {                                   // only for specialised kernels (fixed sizes)
        const int64_t M = 100;
        T *restrict tmp = <a part of polyc_scratch(...)>;  // temporaries, from the
                                              // thread's scratch block; 2 on failure
                                              // (zeroed with memset where a statement
                                              // may read an element before it is written)
        <loop nest>
        return 0;
      }
    }

Below a ``register`` mark (:mod:`polyc.schedule.register_tile`) the nest keeps one
statement's write footprint in a local array::

    {
      float polyc_acc[8][64] __attribute__((aligned(64)));
      const int64_t polyc_lo0 = c3, polyc_lo1 = c4;       // first element of the tile
      for (r0 ...) #pragma omp simd for (r1 ...) polyc_acc[r0][r1] = C[...];   // copy-in
                                     // (= 0.0f instead: the initialisation dropped by
                                     //  polyc.schedule.optimize.drop_dead_inits)
      <loops>   ... polyc_acc[m - polyc_lo0][n - polyc_lo1] += A[...] * B[...];
      for (r0 ...) #pragma omp simd for (r1 ...) C[...] = polyc_acc[r0][r1];   // copy-out
    }

A function with such a block asks gcc for 512-bit vectors where the CPU has them
(``-march=native`` alone prefers 256 bits on some AVX-512 CPUs).

The tile of a byte dot product (a mark whose bits end in ``q``: ``polyc.ir.quad_dot``)
runs its reduction loop as one call of a ``vpdpbusd`` micro-kernel
(:func:`.c_expr.vnni_kernel`, a function of its own), behind ``#if __AVX512VNNI__`` with
the loops above as the ``#else``; its accumulator rows are whole vectors. An epilogue
clamping into a narrow integer type (a requantization) computes the clamped values as
int32 in one loop and narrows them in a second (gcc vectorizes both).
"""
from __future__ import annotations

import math
import re
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import cgen
import islpy as isl

from polyc import dtypes as D
from polyc import expr as E
from polyc.errors import InternalError
from polyc.ir import (QUAD_LANES, Kernel, Statement, element_iterators, fixed_bytes, quad_dot,
                      row_dot)
from polyc.marks import private_positions, register_mark
from polyc.options import Options

from .ast import (
    UNROLL,
    Promotion,
    build_ast,
    loop_depth,
    parse_mark,
    size_check,
)
from .c_expr import (
    CTYPES,
    ROUND_ROWS,
    prelude_for,
    shuffle_index,
    ADD,
    PRIMARY,
    BodyPrinter,
    Namer,
    Piece,
    compute_ctype,
    hoist_roundings,
    isl_expr,
    literal,
    load,
    loop_var,
    store,
    update,
    vnni_kernel_name,
    vnni_operand_types,
)
from .initial_values import reads_before_writing


@dataclass(frozen=True)
class CSource:
    """Generated C for one kernel.

    ``arg_names``/``arg_types`` are the C parameters in calling order (sizes, inputs,
    outputs); ``size_names`` and ``array_names`` pair each user name with its C name.
    """
    text: str
    header: str
    function_name: str
    kernel_name: str
    arg_names: tuple[str, ...]
    arg_types: tuple[str, ...]
    size_names: tuple[tuple[str, str], ...] = field(default=())
    array_names: tuple[tuple[str, str], ...] = field(default=())


class CDialect:
    """Plain C11, sequential. Subclasses override attributes, not the walk."""
    #: qualifier written before the return type (``__global__`` for a CUDA kernel)
    function_qualifier = ""
    restrict = "restrict"
    index_type = "int64_t"
    parallel_pragma: str | None = None
    simd_pragma: str | None = None
    parallel_simd_pragma: str | None = None
    #: clause appended to the parallel pragma when ``options.threads`` is set
    threads_clause = ""
    #: a parallel region without a loop (around a wavefront's loop over its fronts), the
    #: loop of such a region its threads share, and a block one of them runs; None for
    #: none (the fronts' loops then each start their own ``parallel_pragma``)
    region_pragma: str | None = None
    #: appended to a parallel loop's pragma whose iterations go to the threads in turn
    cyclic_clause = ""
    sum_clause = ""
    shared_loop_pragma = ""
    single_pragma = ""
    #: written before a function holding register tiles on a CPU with 512-bit vectors
    wide_vector_attribute = '__attribute__((target("prefer-vector-width=512")))'
    #: qualifiers of a register tile's local accumulator array
    accumulator_attribute = "__attribute__((aligned(64)))"
    #: a byte dot product's register tile may be written with x86 VNNI intrinsics
    #: (behind ``#if``: the plain loop where the compiler's target lacks them)
    vnni_intrinsics = True
    #: a float register tile may prefetch its next weight panel (``__builtin_prefetch``)
    panel_prefetch = True
    #: a register tile's copy-out may round its rows to float16 with x86 F16C intrinsics
    #: (:meth:`_Walker._rounded_rows`; behind ``#if``)
    round_rows = True
    #: a float rows-only dot tile may run its reduction on in-register transposes of its
    #: rows (:meth:`_Walker._rows_variant`; gcc vector extensions, behind ``#if``)
    row_transposes = True
    #: a vector loop reading one row of an array at several offsets along its index may
    #: load each vector of that row once and shift it (:meth:`_Walker._window_loop`; gcc
    #: vector extensions, behind ``#if``)
    window_loads = True

    #: the pragma that unrolls the next loop by a factor (``{}``); "" for none
    unroll_pragma = "GCC unroll {}"
    #: before a statement's iterator declarations (an iterator a register tile's access
    #: no longer mentions is unused: nvcc's -Werror all-warnings refuses that)
    iterator_prefix = ""

    def loop_pragmas(self, parallel: bool, simd: bool, options: Options,
                     cyclic: bool = False, sums: tuple[tuple[str, int], ...] = ()
                     ) -> list[str]:
        """The pragmas to put before a loop the schedule marked parallel and/or simd
        (``cyclic``: its iterations go to the threads in turn; ``sums``: the arrays,
        C name and element count, each thread adds into a copy of)."""
        par = self.parallel_pragma if parallel and options.parallel else None
        vec = self.simd_pragma if simd and options.vectorize else None
        threads = self.threads_clause.format(options.threads) if options.threads else ""
        if cyclic:
            threads += self.cyclic_clause
        threads += "".join(self.sum_clause.format(n, c) for n, c in sums)
        if par and vec and self.parallel_simd_pragma:
            return [self.parallel_simd_pragma + threads]
        return ([par + threads] if par else []) + ([vec] if vec else [])


class OpenMPDialect(CDialect):
    """C11 with OpenMP: ``parallel`` marks become ``omp parallel for``, ``simd`` ``omp simd``."""
    parallel_pragma = "omp parallel for"
    simd_pragma = "omp simd"
    parallel_simd_pragma = "omp parallel for simd"
    threads_clause = " num_threads({})"
    region_pragma = "omp parallel"
    cyclic_clause = " schedule(static, 1)"
    sum_clause = " reduction(+: {}[0:{}])"
    shared_loop_pragma = "omp for"
    single_pragma = "omp single"


@dataclass(frozen=True)
class CFunction:
    """One kernel as a C function definition, without the prelude (so that many kernels
    can share one translation unit that includes :data:`PRELUDE` once)."""
    name: str
    #: the block comment describing the calling convention
    comment: str
    #: ``int name(...);``
    declaration: str
    #: the definition (comment not included)
    definition: str
    arg_names: tuple[str, ...]
    arg_types: tuple[str, ...]
    size_names: tuple[tuple[str, str], ...] = field(default=())
    array_names: tuple[tuple[str, str], ...] = field(default=())


def generate_function(kernel: Kernel, schedule: isl.Schedule, options: Options | None = None,
                      dialect: CDialect | None = None, *, name: str | None = None,
                      static: bool = False) -> CFunction:
    """The C function of ``kernel`` executing its statements in the order of ``schedule``.

    ``schedule`` is over ``kernel.domain()``; its ``"parallel"``/``"simd"`` marks
    annotate the outermost loop of the band below them. ``name`` (a C identifier, used
    as given) replaces the sanitised kernel name; ``static`` gives the function internal
    linkage. The text needs :data:`PRELUDE` before it.
    """
    options = options or Options()
    dialect = dialect or OpenMPDialect()
    sym = _Symbols.of(kernel, name)
    promotions: dict[str, Promotion] = {}
    tree = build_ast(kernel, schedule, promotions)
    body = _Walker(kernel, sym, dialect, options, promotions).node(tree, (), False)
    storage = "static " if static else ""
    wide = any(p.vector_bits >= 512 for p in promotions.values())
    attributes = dialect.wide_vector_attribute if wide else ""
    fn = _function(kernel, sym, dialect, body, storage, attributes)
    params = _parameters(kernel, sym, dialect)
    return CFunction(sym.function, _describe(kernel, sym, dialect),
                     str(_declaration(kernel, sym, dialect, storage)), str(fn),
                     tuple(p.name for p in params), tuple(p.typename for p in params),
                     tuple(sym.sizes.items()), tuple(sym.arrays.items()))


def generate_c(kernel: Kernel, schedule: isl.Schedule, options: Options | None = None,
               dialect: CDialect | None = None) -> CSource:
    """A whole translation unit (prelude + :func:`generate_function`) and its header."""
    fn = generate_function(kernel, schedule, options, dialect)
    text = f"{fn.comment}\n{prelude_for(fn.definition)}\n\n{fn.definition}\n"
    header = (f"{fn.comment}\n#include <stdint.h>\n#include <stdbool.h>\n\n"
              f"{fn.declaration}\n")
    return CSource(text, header, fn.name, kernel.name, fn.arg_names, fn.arg_types,
                   fn.size_names, fn.array_names)


@dataclass
class _Symbols:
    """C names of the kernel's function, sizes and arrays (unique, never reserved)."""
    function: str
    sizes: dict[str, str]
    arrays: dict[str, str]
    namer: Namer

    @classmethod
    def of(cls, kernel: Kernel, function_name: str | None = None) -> _Symbols:
        namer = Namer()
        if function_name is None:
            function = namer.fresh(kernel.name)
        else:
            function = function_name
            namer.taken.add(function)
        sizes = {s: namer.fresh(s) for s in kernel.sizes}
        order = list(kernel.inputs) + list(kernel.outputs) + [a.name for a in kernel.temporaries]
        arrays = {a: namer.fresh(a) for a in order}
        return cls(function, sizes, arrays, namer)

    def printer(self, kernel: Kernel, index_names: dict[str, str]) -> BodyPrinter:
        return BodyPrinter({a.name: a.dtype for a in kernel.arrays},
                           {a.name: a.shape for a in kernel.arrays},
                           self.sizes, self.arrays, index_names)


Pending = tuple[tuple[str, int], ...]


class _Walker:
    """isl AST -> list of cgen nodes; ``pending`` carries loop marks down to their loop."""

    def __init__(self, kernel: Kernel, sym: _Symbols, dialect: CDialect, options: Options,
                 promotions: dict[str, Promotion] | None = None):
        self.kernel, self.sym, self.dialect, self.options = kernel, sym, dialect, options
        self.isl_names = dict(sym.sizes)  # isl identifier -> C (sizes, then loop iterators)
        self.promotions = promotions or {}
        #: arrays held in a local accumulator here: array -> (C name, [(dim, offset name)])
        self.promoted: dict[str, tuple[str, list[tuple[Any, ...]]]] = {}

    def node(self, n: isl.AstNode, pending: Pending, in_parallel: bool) -> list[cgen.Generable]:
        t = n.get_type()
        if t == isl.ast_node_type.for_:
            return self._for(n, pending, in_parallel)
        if t == isl.ast_node_type.block:
            kids = n.block_get_children()
            return [g for i in range(kids.n_ast_node())
                    for g in self.node(kids.get_at(i), pending, in_parallel)]
        if t == isl.ast_node_type.if_:
            then = _block(self.node(n.if_get_then_node(), pending, in_parallel))
            other = (_block(self.node(n.if_get_else_node(), pending, in_parallel))
                     if n.if_has_else_node() else None)
            return [cgen.If(self._isl(n.if_get_cond()).text, then, other)]
        if t == isl.ast_node_type.mark:
            name = n.mark_get_id().get_name()
            if register_mark(name) is not None:
                return self._promoted(self.promotions[n.get_annotation().get_name()],
                                      n.mark_get_node(), pending, in_parallel)
            mark = parse_mark(name)
            return self.node(n.mark_get_node(), pending + ((mark,) if mark else ()), in_parallel)
        if t == isl.ast_node_type.user:
            return [self._user(n.user_get_expr())]
        raise InternalError(f"unexpected isl AST node type {t}")

    def _promoted(self, p: Promotion, body: isl.AstNode, pending: Pending,
                  in_parallel: bool) -> list[cgen.Generable]:
        """The block of a register tile: accumulator, copy-in, ``body``, copy-out."""
        if p.array in self.promoted:
            raise InternalError(f"nested register tiles of {p.array}")
        dtype = self.kernel.array(p.array).dtype
        it = self.dialect.index_type
        kept = [d for d, size in enumerate(p.box) if size > 1] or [len(p.box) - 1]
        acc = "polyc_acc"
        # a byte dot product's rows are whole vectors (the VNNI variant moves them as such)
        dims = [-(-p.box[d] // QUAD_LANES) * QUAD_LANES if p.quad and d == kept[-1]
                else p.box[d] for d in kept]
        # (zeroed: the micro-kernel loads and stores its lanes past the box and the rows
        # a partial tile does not have; nothing reads them, but nothing is uninitialised)
        code: list[cgen.Generable] = [cgen.Statement(
            f"{compute_ctype(dtype)} {acc}{''.join(f'[{n}]' for n in dims)} "
            f"{self.dialect.accumulator_attribute}".rstrip()
            + (" = {0}" if p.quad else ""))]
        code += [cgen.Statement(f"const {it} polyc_lo{d} = {self._isl(e).text}")
                 for d, e in enumerate(p.lo)]
        spans = {d: self._isl(p.span[d]).at(ADD) for d in kept}
        names = {f"polyc_i{d}": f"(polyc_lo{d} + polyc_r{d})" if d in kept else f"polyc_lo{d}"
                 for d in range(len(p.box))}
        printer = self.sym.printer(self.kernel, names)
        stored = printer.element(p.array, tuple(E.Index(f"polyc_i{d}")
                                                for d in range(len(p.box))))
        element = stored.text
        local = acc + "".join(f"[polyc_r{d}]" for d in kept)

        steps = _reduction_steps(body)
        short = steps is not None and steps <= ROWS_UNROLLED_STEPS

        def copy(stmt: str) -> cgen.Generable:
            return copy_block(cgen.Statement(stmt))

        def vector_loop(stmt: cgen.Generable) -> list[cgen.Generable]:
            d = kept[-1]
            loop = cgen.For(f"{it} polyc_r{d} = 0", f"polyc_r{d} <= {spans[d]}",
                            f"polyc_r{d} += 1", _block([stmt]))
            if self.options.vectorize and self.dialect.simd_pragma:
                return [cgen.Pragma(self.dialect.simd_pragma), loop]
            return [loop]

        def copy_block(stmt: cgen.Generable) -> cgen.Generable:
            lane = f"polyc_r{kept[-1]}"
            hoisted = self._hoisted_roundings(stmt, lane)
            body = vector_loop(stmt) if hoisted is None else self._rounded_rows(
                hoisted, lane, dims[-1], f"{spans[kept[-1]]} + 1", vector_loop)
            for d in reversed(kept[:-1]):
                loop = cgen.For(f"{it} polyc_r{d} = 0", f"polyc_r{d} <= {spans[d]}",
                                f"polyc_r{d} += 1", _block(body))
                body = [loop]
                if short and self.dialect.unroll_pragma \
                        and spans[d].isdigit():  # (a partial tile's row count is an
                    # expression: gcc ignores the pragma there, with a warning)
                    body.insert(0, cgen.Pragma(self.dialect.unroll_pragma.format(
                        dims[kept.index(d)])))
            return _block(body)

        self.promoted[p.array] = (acc, [(d, f"polyc_lo{d}") for d in kept])
        try:
            inner = self.node(body, pending, in_parallel)
            rows = None
            if not p.quad and self.dialect.row_transposes and self.options.vectorize \
                    and ROW_TRANSPOSES:
                rows = self._rows_variant(p, kept, body, inner, in_parallel)
            if rows is not None:
                inner = rows
            elif p.quad and self.dialect.vnni_intrinsics and self.options.vectorize:
                inner = self._quad_variant(p, kept, body, inner)
            elif not p.quad and self.dialect.panel_prefetch and PANEL_PREFETCH:
                inner = self._panel_prefetch(p, kept, body, inner)
        finally:
            del self.promoted[p.array]
        start = load(dtype, stored).text
        if p.init:  # the reduction's initial constant (its statement is not scheduled)
            start = printer.expr(self.kernel.statement(p.init).value, dtype).text
        narrow: list[cgen.Generable] = []
        if p.epilogue:  # the statement that read the array, run on the accumulator
            out, wide = self._epilogue(p, names, local)
            if wide is not None:  # computed into int32 first: see _epilogue
                held = local.replace(acc, "polyc_narrow", 1)
                narrow = [cgen.Statement(f"int32_t polyc_narrow{''.join(f'[{n}]' for n in dims)} "
                                         f"{self.dialect.accumulator_attribute}".rstrip()),
                          copy_block(cgen.Statement(f"{held} = (int32_t)({wide})"))]
                out = cgen.Statement(out.text.replace("polyc_narrowed_value", held))
        else:
            out = cgen.Statement(f"{element} = {store(dtype, Piece(local)).text}")
        rest = [copy(f"{local} = {start}")] + inner + narrow + [copy_block(out)]
        text = "\n".join(str(g) for g in rest)
        code = [c for i, c in enumerate(code)  # an epilogue may not need every corner
                if i == 0 or _mentions(text, f"polyc_lo{i - 1}")]
        return [cgen.Block(code + rest)]

    def _rounded_rows(self, hoisted: tuple[str, list[str], str], lane: str, width: int,
                      count: str,
                      vector_loop: Callable[[cgen.Generable], list[cgen.Generable]]
                      ) -> list[cgen.Generable]:
        """A statement that rounds to float16 over a register tile's row, its roundings
        ``hoisted`` (:meth:`_hoisted_roundings`; ``vector_loop``: a loop over the lanes
        ``lane`` < ``count`` <= ``width``): one loop per rounding that computes its
        argument into a local row and a call that rounds the row
        (:data:`.c_expr.ROUND_ROWS`, F16C's conversions), then the loop of the rest::

            float polyc_t0[64];
            #pragma omp simd
            for (r = 0; r <= 63; r += 1) polyc_t0[r] = polyc_acc[i][r] + bias[...];
            polyc_round_f16_row(polyc_t0, 63 + 1);
            #pragma omp simd
            for (r = 0; r <= 63; r += 1) out[...] = polyc_reluf(polyc_t0[r]);

        ResNet-50 in float16 at one thread: 0.967x of the time (rounding nothing at all
        would give 0.95x), Zen 5."""
        row_fn, args, rest = hoisted
        code: list[cgen.Generable] = []
        for k, arg in enumerate(args):
            code.append(cgen.Statement(f"float polyc_t{k}[{width}] "
                                       f"{self.dialect.accumulator_attribute}".rstrip()))
            code += vector_loop(cgen.Statement(f"polyc_t{k}[{lane}] = {arg}"))
            code.append(cgen.Statement(f"{row_fn}(polyc_t{k}, {count})"))
        return code + vector_loop(cgen.Statement(rest))

    def _hoisted_roundings(self, stmt: cgen.Generable, lane: str
                           ) -> tuple[str, list[str], str] | None:
        """The row helper, the arguments and the rest of ``stmt`` with its float16
        roundings hoisted (:func:`.c_expr.hoist_roundings`, the rows indexed by
        ``lane``); None where there are none to hoist, or the target rounds no rows."""
        if not (ROUND_ROWS_F16 and self.dialect.round_rows and self.options.vectorize):
            return None
        for fn, row_fn in ROUND_ROWS.items():
            hoisted = hoist_roundings(str(stmt).rstrip(";"), fn, f"polyc_t{{}}[{lane}]")
            if hoisted is not None:
                return (row_fn, *hoisted)
        return None

    def _panel_prefetch(self, p: Promotion, kept: list[int], body: isl.AstNode,
                        inner: list[cgen.Generable]) -> list[cgen.Generable]:
        """``inner`` (the register tile's loops) with a prefetch of the next weight
        panel at each step of its innermost reduction loop::

            for (k ...) {
              __builtin_prefetch((const void *)((uintptr_t)&W[<the panel's first element>]
                  + PANEL + 64 * ((polyc_lo<row> / MR * STEPS + <this step>) & (P - 1))),
                  0, 3);
              <the rows' vector loops>
            }

        ``W`` is the operand the vector loop walks and the rows do not (a conv's or a
        blocked MatMul's weights ``W(nb, .., k, ni)``, a Winograd product's
        ``U(pos, nb, k, ni)``, a packed matmul's ``Bb(nb, k, ni)`` whose lane ``ni`` is a
        part of the write's column ``NR * nb + ni``): the next panel, the one the
        thread's next column block reads, is the ``PANEL`` bytes (the stride of its
        innermost block index, ``LINES`` cache lines, ``P`` that rounded up to a power
        of two) that follow this one. Only where
        the tile sums its whole reduction (a reduction tile's next chunk, not the next
        panel, would come next: ResNet-50's stride-2 3x3 conv lost 15% at 2 threads
        prefetching the wrong one, the Winograd products as much prefetching along
        ``pos``). Each step prefetches one line, the row tiles one after another
        through the panel's lines in order (tile number times the ``STEPS`` of a tile,
        plus the step's number), so the lines the next panel's first row tile needs
        first come first; a panel's first row tile would otherwise wait on memory for
        its weights. Measured on a Zen 5 EPYC, one thread: matmul 2048 (30-row cache
        tiles of five row tiles over 512 KB panels) 224 -> 240 GFLOP/s (a line of the
        same step's run instead, a different one per tile, left it at 221); 2 threads
        408 -> 450; BERT 0.93x, ResNet-50 0.96x, MobileNetV2 1.00x of the time
        without. Not where ``W`` has one block: no next panel (MobileNetV2 took 1.04x
        with its one-block 1x1 convs prefetching past their weights).

        A tile over one chunk of a tiled reduction (a single loop ``k = e .. e + T - 1``,
        the chunks' loop just outside the row tiles) prefetches the next chunk the same
        way, where its steps' runs are adjacent (``W(.., k, ni)`` with ``ni`` the tile's
        whole run): ``T`` runs on, ``STEPS = T``. Matmul 4096 (chunks of 256) 221 -> 232
        GFLOP/s at one thread, 447 -> 474 at two; BERT 0.98x. A chunk may be several
        runs, one per step of reduction loops above it in the tile (a 3x3 conv's taps
        over ``W(mb, kh, kw, c, mi)`` chunked along ``c``): a line's run and its place in
        the run give its address. Past the last chunk (perhaps shorter) comes what
        follows its run in memory (one run), or the next block's first chunk (several).

        The tile's number counts every tile that reads the panel (:meth:`_row_tile_number`:
        a conv's output rows ``oh`` as well as its columns), and where those tiles have
        fewer steps than the next panel has lines, each step prefetches several (at most
        :data:`PREFETCH_LINES_MAX`). ResNet-50's 7x7 layers had had seven tiles
        prefetching a quarter of the next panel, and its Winograd products (16 rows:
        three tiles) three quarters or half; with these and the 3x3 conv's runs,
        ResNet-50 at one thread took 0.94x the time (0.97x at two), its float16 twin
        0.98x (2 threads), MobileNetV2 0.98x, ResNet-18 0.98x, BERT 0.99x. Prefetches do
        not fault; the address is computed as an integer (no pointer past an array).
        ``inner`` unchanged where the shape differs, and where the tile's vectors overflow
        a 256-bit machine's 16 registers (:func:`_overflows_registers`)."""
        if SPILLED_TILES_UNFETCHED and _overflows_registers(
                p, self.kernel.array(p.array).dtype):
            return inner
        stmt = self.kernel.statement(p.stmt)
        write = stmt.write.indices
        cols = len(p.box) - 1
        rows = write[kept[0]] if len(kept) == 2 else None
        if kept[-1] != cols or (rows is not None and not isinstance(rows, E.Index)):
            return inner
        found = _reduction_chain(body)
        if found is None:
            return inner
        chain, chunk = found
        loop = chain[-1][0]
        users = _user_calls(loop.for_get_body())
        simd = _first_for(loop.for_get_body())
        if not users or simd is None or any(
                u.get_op_arg(0).get_id().get_name() != p.stmt for u in users):
            return inner
        v = simd.for_get_iterator().get_id().get_name()
        call = [users[0].get_op_arg(i + 1) for i in range(len(stmt.iterators))]
        operand = _panel_operand(stmt, call, v, rows, cols)
        if operand is None:
            return inner
        w, blocks = operand
        sizes = dict(self.kernel.fixed_sizes)
        arr = self.kernel.array(w.array)
        try:  # the next panel: one step of the innermost block index
            item = D.itemsize(arr.dtype)
            stride = item * math.prod(E.evaluate(x, sizes) for x in arr.shape[blocks[-1] + 1:])
            count = math.prod(E.evaluate(x, sizes) for x in arr.shape[:blocks[-1] + 1])
        except Exception:  # a symbolic size: no constant panel stride
            return inner
        runs: list[tuple[int, int]] = []  # a chunk's runs: (trips, bytes between runs)
        if chunk:  # the next chunk: the runs of the next steps, where they are adjacent
            placed = [_plain_index(w, stmt.iterators, call, lp) for lp, _ in chain]
            if any(j is None for j in placed):
                return inner
            strides = [item * math.prod(E.evaluate(x, sizes) for x in arr.shape[j + 1:])
                       for j in placed]
            step, extent = strides[-1], E.evaluate(arr.shape[placed[-1]], sizes)
            if step != p.box[cols] * item:
                return inner
            runs = [(trips, s) for (_, trips), s in zip(chain[:-1], strides[:-1])]
            block = stride if count >= 2 else 0  # (one block: its own first chunk again)
            stride = step * chain[-1][1]
        elif count < 2:
            return inner  # no next panel
        used = E.free_names(w)[0]  # the iterators W's element needs, at the panel's
        args = {it: a for it, a in zip(stmt.iterators, call)  # start: the lane at the
                if it in used}  # vector loop's, the reductions at their loops' first
        loops = [lp for lp, _ in chain] + [simd]
        iterators = [lp.for_get_iterator().get_id().get_name() for lp in loops]
        with self._bound(dict.fromkeys(iterators, _LOOP_VARIABLE)):
            firsts = [self._isl(lp.for_get_init()).text for lp in loops]
        if any(_LOOP_VARIABLE in f for f in firsts):  # a first step set by another loop
            return inner
        with self._bound({n: f"({f})" for n, f in zip(iterators, firsts)}):
            values = {it: self._isl(a).text for it, a in args.items()}
        firsts = firsts[:-1]  # (the vector loop's first lane: in values)
        terms, inner_trips = [], 1  # this step's number in the tile's reduction
        for (lp, trips), first in reversed(list(zip(chain, firsts))):
            it = self._isl(lp.for_get_iterator()).text
            term = it if first in ("0", "(0)") else f"({it} - {first})"
            terms.append(term if inner_trips == 1 else f"{term} * {inner_trips}")
            inner_trips *= trips
        flat = " + ".join(reversed(terms))
        run_lines = max(1, stride // 64)
        lines = run_lines * math.prod(t for t, _ in runs)
        scope = self.sym.namer.child()
        names = {it: scope.fresh(f"polyc_pf_{it}") for it in values}
        element = self.sym.printer(self.kernel, names).element(w.array, w.indices).text
        # the row tile's number (consecutive tiles: consecutive numbers) times the steps
        # of a tile, plus this step's: consecutive lines of the next panel, in order
        number, tiles = self._row_tile_number(p, stmt, w, cols)
        spread = f"({number}) * {inner_trips} + {flat}" if number else flat
        # lines a step: the panel's lines over the steps of all the tiles that read it
        per_step = min(PREFETCH_LINES_MAX, -(-lines // (tiles * inner_trips)))
        kname = self._isl(loop.for_get_iterator()).text
        it = self.dialect.index_type
        decls = [cgen.Statement(f"const {it} {names[x]} = {v}") for x, v in values.items()]
        ahead = f"{stride}u"
        if chunk:  # past the reduction's last chunk (perhaps a shorter one) what follows
            # its run in memory (the next block, or the next step of a reduction loop
            # outside the tile); past a chunk of several runs, the next block's first
            first = firsts[-1]
            after = f"{block} - {step} * {first}" if runs else f"{step} * ({extent} - {first})"
            ahead = f"(uint64_t)({first} + {chain[-1][1]} < {extent} ? {stride} : {after})"
        fetches = _line_prefetches(f"(uintptr_t)&{element} + {ahead}", spread, per_step,
                                   lines, run_lines, runs)
        prefix = [cgen.Block(decls + fetches)]
        return _prepend_in_loop(inner, f" {kname} = ", prefix) or inner

    @contextmanager
    def _bound(self, values: dict[str, str]) -> Iterator[None]:
        """The AST iterators ``values`` names print as the C given there while in the
        ``with`` block (a loop's iterator at its first step, say); restored after."""
        saved = {n: self.isl_names.get(n) for n in values}
        self.isl_names.update(values)
        try:
            yield
        finally:
            for n, old in saved.items():
                if old is None:
                    del self.isl_names[n]
                else:
                    self.isl_names[n] = old

    def _row_tile_number(self, p: Promotion, stmt: Statement, w: E.Read,
                         cols: int) -> tuple[str, int]:
        """The C expression numbering the register tile among those that read the same
        panel of ``w`` (consecutive tiles, consecutive numbers), and how many there are:
        the tile's place along each dimension of the write that ``w`` does not follow
        (its index an iterator ``w`` does not read), ``polyc_lo<d> / box``. A convolution's
        output row ``oh`` (a loop outside the tile) counts as well as its columns ``ow``
        (the tile's rows): ResNet-50's 7x7 layers had seven tiles prefetching the same
        lines. ``("", 1)`` where the sizes are not constants."""
        read = E.free_names(w)[0]
        sizes = dict(self.kernel.fixed_sizes)
        shape = self.kernel.array(stmt.write.array).shape
        number, tiles = "", 1
        for d, ix in enumerate(stmt.write.indices):
            if d == cols or not isinstance(ix, E.Index) or ix.name in read:
                continue
            try:
                count = -(-E.evaluate(shape[d], sizes) // p.box[d])
            except Exception:
                return "", 1
            if count < 2:
                continue
            term = f"polyc_lo{d} / {p.box[d]}" if p.box[d] > 1 else f"polyc_lo{d}"
            number = f"({number}) * {count} + {term}" if number else term
            tiles *= count
        return number, tiles

    def _rows_variant(self, p: Promotion, kept: list[int], body: isl.AstNode,
                      plain: list[cgen.Generable], in_parallel: bool
                      ) -> list[cgen.Generable] | None:
        """The reduction loop of a float rows-only dot tile (``acc(i) += A(i,j) * x(j)``:
        one accumulator per row, each summing its row's terms in ``j`` order) on vectors
        whose lanes are the rows, where the C compiler targets the vector width the tile
        was planned for; ``plain`` (the loop as it is) otherwise; None where the tile is
        not of that form::

            #if defined(__AVX512F__) && <gcc>
            { polyc_f32x16 polyc_s0 = {0}; memcpy(&polyc_s0, &polyc_acc[0], ROWS * 4);
              int64_t c4 = <first step>;
              for (; c4 <= <last step> - 15; c4 += 16) {
                polyc_f32x16 polyc_w0[16];                  // 16 columns of ROWS rows
                memcpy(&polyc_w0[0], &A[(polyc_lo0 + 0) * N + c4], 64); ...
                polyc_transpose_f32x16(polyc_w0);           // [column][row]
                for (polyc_c = 0; polyc_c < 16; polyc_c++)  // the columns in order
                  polyc_s0 = polyc_s0 + polyc_w0[polyc_c] * x[c4 + polyc_c];
              }
              memcpy(&polyc_acc[0], &polyc_s0, ROWS * 4);
              for (; c4 <= <last step>; c4 += 1) <the rows' statements>
            }
            #else
            <plain>
            #endif

        Each lane adds its row's terms one after another in column order, as the plain
        loop does. The roundings may still differ in the last bit: gcc contracts the
        vector ``s + w * x`` into an FMA, while the plain loop's products (and the
        scalar tail's) it may or may not contract; where every product is exact the
        sums are the same bit for bit. The plain loop's rows are scalar chains that gcc
        gathers across rows; the transposes (log2(L) stages of two-vector shuffles, L =
        lanes) load whole rows instead. Rows past ``L`` are further vectors of lanes
        (double: two groups of 8 on AVX-512), so their chains interleave. A tile of
        fewer than ``L / 2`` rows keeps the plain loop: the block costs a whole
        transpose however few its rows (7 rows of 20000 columns: 0.12 ms against 0.10).
        Float 2000x2000 ``A @ x`` at one thread, Zen 5: 0.69 -> 0.27 ms. The value may
        multiply, add, subtract and divide the row read, reads along ``j`` alone
        (broadcast), reads of neither and constants, all of the accumulator's float
        type."""
        bits = {512: "__AVX512F__", 256: "__AVX2__"}.get(p.vector_bits)
        if bits is None or len(kept) != 1 or self.kernel.exits or \
                body.get_type() != isl.ast_node_type.for_ or body.for_is_degenerate() or \
                self._isl(body.for_get_inc()).text != "1":
            return None
        d = kept[0]
        stmt = self.kernel.statement(p.stmt)
        dtype = self.kernel.array(p.array).dtype
        if stmt.write.array != p.array:  # (row_dot below asks for a float sum)
            return None
        write = stmt.write.indices
        row = write[d]
        sums = [it for it in stmt.iterators if not any(it in E.free_names(x)[0] for x in write)]
        if not isinstance(row, E.Index) or len(sums) != 1 or \
                any(row.name in E.free_names(x)[0] for i, x in enumerate(write) if i != d):
            return None
        q = sums[0]
        walked = row_dot(stmt, self.kernel, row.name, q)
        if walked is None:
            return None
        inner_body = body.for_get_body()
        loop = _sum_loop(body, p.stmt)
        if loop is None:
            return None
        iterator, kind, calls = loop
        # the body: the rows' statements, unrolled, nothing else (no tests)
        steps = [inner_body] if inner_body.get_type() != isl.ast_node_type.block else \
            list(inner_body.block_get_children().get_at(i)
                 for i in range(inner_body.block_get_children().n_ast_node()))
        span = self._isl(p.span[d]).text
        if any(n.get_type() != isl.ast_node_type.user for n in steps) or not span.isdigit() \
                or len(calls) != int(span) + 1 or len(calls) < 2 or len(calls) > p.box[d]:
            return None
        cond = body.for_get_cond()
        var = self.isl_names[iterator] = loop_var(loop_depth(iterator))
        args = [{it: self._isl(c.get_op_arg(i + 1)).text for i, it in enumerate(stmt.iterators)}
                for c in calls]
        # the rows are the tile's (distinct rows, as many as its span); every other
        # iterator is the same in each, the sum's the loop's own (plus a constant)
        if len({a[row.name] for a in args}) != len(calls) or any(
                a[it] != args[0][it] for a in args for it in stmt.iterators if it != row.name) \
                or not _moves_by_one(calls[0].get_op_arg(1 + stmt.iterators.index(q)),
                                     iterator) \
                or any(var in v for it, v in args[0].items() if it != q):
            return None
        itemsize = D.get(dtype).itemsize
        lanes = p.vector_bits // 8 // itemsize
        rows = len(calls)
        if rows < lanes // 2:
            return None
        counts = [min(lanes, rows - g) for g in range(0, rows, lanes)]  # rows per group
        tag = f"{'f32' if dtype == 'float32' else 'f64'}x{lanes}"
        vec, ctype = f"polyc_{tag}", CTYPES[dtype]
        it = self.dialect.index_type
        names = {k: f"({v})" for k, v in args[0].items() if k != row.name}
        names[q] = f"({args[0][q]} + polyc_c)"
        printer = self.sym.printer(self.kernel, names)
        at0 = self.sym.printer(self.kernel, {**names, q: f"({args[0][q]})"})
        last = len(walked.indices) - 1
        first = at0.expr(walked.indices[last], "int64").text
        code: list[cgen.Generable] = []
        for g, count in enumerate(counts):
            code.append(cgen.Statement(f"{vec} polyc_s{g} = {{0}}"))
            code.append(cgen.Statement(f"memcpy(&polyc_s{g}, &polyc_acc[{g * lanes}], "
                                       f"{count} * sizeof({ctype}))"))
        code.append(cgen.Statement(f"{it} {var} = {self._isl(body.for_get_init()).text}"))
        bound = self._isl(cond.get_op_arg(1)).text
        step: list[cgen.Generable] = []
        for g, count in enumerate(counts):
            step.append(cgen.Statement(f"{vec} polyc_w{g}[{lanes}]"))
            for r in range(lanes):
                if r < count:
                    element = self.sym.printer(self.kernel, {
                        **names, q: f"({args[0][q]})",
                        row.name: f"(polyc_lo{d} + {g * lanes + r})"}).element(
                        walked.array, walked.indices).text
                    step.append(cgen.Statement(
                        f"memcpy(&polyc_w{g}[{r}], &{element}, sizeof({vec}))"))
                else:
                    step.append(cgen.Statement(f"polyc_w{g}[{r}] = ({vec}){{0}}"))
            step.append(cgen.Statement(f"polyc_transpose_{tag}(polyc_w{g})"))
            printer.promoted = {walked.array: (f"polyc_w{g}", [(last, f"({first})")])}
            value = printer.expr(stmt.value, dtype, exact=stmt.is_reduction).text
            step += [cgen.Pragma(self.dialect.unroll_pragma.format(lanes)), cgen.For(
                "int polyc_c = 0", f"polyc_c < {lanes}", "polyc_c++",
                cgen.Statement(f"polyc_s{g} = polyc_s{g} + ({value})"))]
        test = "<=" if kind == isl.ast_expr_op_type.le else "<"
        code.append(cgen.For("", f"{var} {test} ({bound}) - {lanes - 1}", f"{var} += {lanes}",
                             cgen.Block(step)))
        for g, count in enumerate(counts):
            code.append(cgen.Statement(f"memcpy(&polyc_acc[{g * lanes}], &polyc_s{g}, "
                                       f"{count} * sizeof({ctype}))"))
        tail = self.node(inner_body, (), in_parallel)
        code.append(cgen.For("", f"{var} {test} {bound}", f"{var} += 1", _block(tail)))
        return [cgen.Line(f"#if defined({bits}) && defined(__GNUC__) && !defined(__clang__)"),
                cgen.Block(code), cgen.Line("#else"), *plain, cgen.Line("#endif")]

    def _quad_variant(self, p: Promotion, kept: list[int], body: isl.AstNode,
                      plain: list[cgen.Generable]) -> list[cgen.Generable]:
        """The reduction loop of a byte dot product's register tile (``p.quad``) as one
        call of a VNNI micro-kernel (``c_expr.vnni_kernel``), and ``plain`` (the same
        loops in C) where the compiler's target has no AVX-512 VNNI::

            #if defined(__AVX512VNNI__) ...
            { const __mmask16 polyc_lanes[NV] = {...};
              polyc_vnni_<MR>x<NV>_x<..>_w<..>_r<..>(&polyc_acc[0][0], &X[<first step, row,
                  lane>], &W[<first step, row>], <steps>, polyc_lanes, <rows>); }
            #else
            <plain>
            #endif

        The micro-kernel is its own function: inside a kernel's loop nest gcc 12 kept
        copies of the accumulators in other registers and on the stack (2x slower).
        ``plain`` alone where the loop below the mark is not one reduction loop over
        the statement, or the arrays' strides are not constants."""
        quad = self._quad_call(p, kept, body)
        if quad is None:
            return plain
        return [cgen.Line(f"#if {QUAD_TARGET}"), quad, cgen.Line("#else"), *plain,
                cgen.Line("#endif")]

    def _quad_call(self, p: Promotion, kept: list[int], body: isl.AstNode
                   ) -> cgen.Generable | None:
        cols = len(p.box) - 1
        if kept[-1] != cols or body.get_type() != isl.ast_node_type.for_ or \
                self._isl(body.for_get_inc()).text != "1":
            return None
        rows = kept[0] if len(kept) == 2 else None
        stmt = self.kernel.statement(p.stmt)
        write = stmt.write.indices
        lane = write[cols]
        reductions = [it for it in stmt.iterators
                      if not any(it in E.free_names(ix)[0] for ix in write)]
        row = write[rows] if rows is not None else None
        if not isinstance(lane, E.Index) or len(reductions) != 1 or \
                (row is not None and not isinstance(row, E.Index)):
            return None
        quad = quad_dot(stmt, self.kernel, lane.name)
        loop = _sum_loop(body, p.stmt)
        if quad is None or loop is None:
            return None
        iterator, kind, users = loop
        cond = body.for_get_cond()
        q = reductions[0]
        steps_x = _byte_stride(self.kernel, quad.lanes, q)
        steps_w = _byte_stride(self.kernel, quad.broadcast, q)
        rows_w = _byte_stride(self.kernel, quad.broadcast, row.name) if row is not None else 0
        # the micro-kernel walks both operands forwards, the lanes not with the rows
        if not steps_x or not steps_w or steps_x < 0 or steps_w < 0 or rows_w is None \
                or rows_w < 0 or (row is not None and
                                  _byte_stride(self.kernel, quad.lanes, row.name) != 0):
            return None
        init = self._isl(body.for_get_init()).text
        bound = self._isl(cond.get_op_arg(1)).text
        steps = (f"({bound}) - ({init}) + 1" if kind == isl.ast_expr_op_type.le
                 else f"({bound}) - ({init})")
        call = users[0]
        args = {it: call.get_op_arg(i + 1) for i, it in enumerate(stmt.iterators)}
        if not _moves_by_one(args[q], iterator):
            return None  # the reduction is not this loop's iterator (plus a constant)
        with self._bound({iterator: _LOOP_VARIABLE}):
            others = {it: self._isl(a).text for it, a in args.items()
                      if it not in (lane.name, q) and (row is None or it != row.name)}
        with self._bound({iterator: f"({init})"}):
            first = self._isl(args[q]).text
        if any(_LOOP_VARIABLE in v for v in others.values()) or _LOOP_VARIABLE in first:
            return None
        values = {**others, q: first, lane.name: f"polyc_lo{cols}"}
        if row is not None:
            values[row.name] = f"polyc_lo{rows}"
        names = {it: f"({v})" for it, v in values.items()}
        printer = self.sym.printer(self.kernel, names)
        x = printer.element(quad.lanes.array, quad.lanes.indices).text
        w = printer.element(quad.broadcast.array, quad.broadcast.indices).text
        mr = p.box[rows] if rows is not None else 1
        nv = -(-p.box[cols] // QUAD_LANES)
        width = self._isl(p.span[cols]).at(ADD)
        height = self._isl(p.span[rows]).at(ADD) if rows is not None else "0"
        masks = ", ".join(f"polyc_lanes16({width} + 1 - {QUAD_LANES * j})" for j in range(nv))
        acc = "&polyc_acc[0][0]" if rows is not None else "&polyc_acc[0]"

        xt, wt = vnni_operand_types(quad.signed_lanes)

        def call(partial: bool) -> str:
            name = vnni_kernel_name(mr, nv, steps_x, steps_w, rows_w, partial,
                                    quad.signed_lanes)
            return (f"{name}({acc}, (const {xt} *)&{x}, (const {wt} *)&{w}, {steps}, "
                    f"polyc_lanes, {height} + 1)")
        return cgen.Block([
            cgen.Statement(f"const __mmask16 polyc_lanes[{nv}] = {{{masks}}}"),
            cgen.If(f"{height} + 1 >= {mr}", cgen.Statement(call(False)),
                    cgen.Statement(call(True)))])

    def _epilogue(self, p: Promotion, names: dict[str, str], local: str
                  ) -> tuple[cgen.Statement, str | None]:
        """The epilogue statement of ``p`` at one accumulator element: its iterators from
        the element's indices (``names``: ``polyc_i<d>`` -> C), its read of the array
        the accumulator ``local``.

        A value clamped into a narrow integer type, ``uint8(max(0.0, min(255.0, x)))``
        (a requantization), comes as two parts: the C of the clamped value (one
        ``polyc_clamp_hi``: the same value once converted), which the caller stores as
        int32 in a first loop, and the statement storing
        ``polyc_narrowed_value`` (that int32, narrowed) in a second. gcc 12 vectorizes
        neither a float-to-byte conversion nor much around it in one loop of 16 lanes
        (1.3 ns an element; 0.57 in two loops). The int32 holds the clamped value
        exactly, so the two are the one conversion."""
        stmt = self.kernel.statement(p.epilogue)
        read = next(r for r in E.reads(stmt.value) if r.array == p.array)
        element = tuple(E.Index(f"polyc_i{d}") for d in range(len(p.box)))
        its = element_iterators(tuple(read.indices), stmt.iterators, element,
                                stmt.domain.intersect_params(self.kernel.context))
        if its is None:
            raise InternalError(f"the epilogue {stmt.name} of a register tile of {p.array} "
                                f"does not give its iterators")
        # the iterators substituted, not declared: the write's index of a flattened
        # element, ``(e // 14, e % 14)``, prints as ``e`` again (``c_expr._unsplit``)
        def sub(x: E.Expr) -> E.Expr | None:
            return its[x.name] if isinstance(x, E.Index) and x.name in its else None
        printer = self.sym.printer(self.kernel, names)
        printer.promoted = {**self.promoted, p.array: (local, [])}  # its reads: this element
        dtype = self.kernel.array(stmt.write.array).dtype
        target = printer.element(stmt.write.array,
                                 tuple(E.map_expr(ix, sub) for ix in stmt.write.indices))
        value_e = E.map_expr(stmt.value, sub)
        clamped = E.clamped_narrowing(value_e, dtype) if stmt.op == "=" else None
        if clamped is not None:
            t = printer.dtype(clamped)
            wide = (printer.clamp(clamped) or printer.expr(clamped, t)).text
            value = Piece(f"({CTYPES[dtype]})polyc_narrowed_value", PRIMARY)
            return cgen.Statement(update(stmt.op, target, value, dtype)), wide
        value = printer.expr(value_e, dtype, exact=stmt.is_reduction)
        return cgen.Statement(update(stmt.op, target, value, dtype,
                                     stored=stmt.write.array not in printer.promoted)), None

    def _isl(self, e: isl.AstExpr) -> Piece:
        return isl_expr(e, self.isl_names)

    def _for(self, n: isl.AstNode, pending: Pending, in_parallel: bool) -> list[cgen.Generable]:
        iterator = n.for_get_iterator().get_id().get_name()
        depth = loop_depth(iterator)
        var = self.isl_names[iterator] = loop_var(depth)
        if n.for_is_degenerate():  # one iteration: no loop, no pragma
            body = self.node(n.for_get_body(), (), in_parallel)
            init = self._isl(n.for_get_init()).text
            used = _mentions("\n".join(str(g) for g in body), var)
            decl = [cgen.Statement(f"const {self.dialect.index_type} {var} = {init}")] if used else []
            return [cgen.Block(decl + body)]
        kinds = {kind for kind, d in pending if d == depth}  # marks of a band at this depth
        if "reduce" in kinds and self.dialect.simd_pragma and self.options.vectorize \
                and n.for_get_body().get_type() == isl.ast_node_type.user:
            return self._vector_reduction(n, var, in_parallel)
        if "wavefront" in kinds and not in_parallel and self.dialect.region_pragma \
                and self.options.parallel and not self.kernel.exits:
            return self._wavefront(n, var, pending)
        parallel = "parallel" in kinds and not in_parallel
        pragmas = self.dialect.loop_pragmas(parallel, "simd" in kinds, self.options,
                                            "cyclic" in kinds, self._sums(kinds))
        parallel = parallel and any("parallel" in p for p in pragmas)
        unroll = [k[len(UNROLL):] for k in kinds if k.startswith(UNROLL)]
        # gcc takes no unroll pragma beside an OpenMP one on the same loop (the schedule
        # workbench refuses both; the OpenMP one wins here)
        if unroll and self.dialect.unroll_pragma and not pragmas:
            pragmas.append(self.dialect.unroll_pragma.format(unroll[0]))
        body = self.node(n.for_get_body(), (), in_parallel or parallel)
        if not parallel and "simd" not in kinds:
            body += self._exit(n, iterator, var)
        tail = None if parallel or "simd" not in kinds or not pragmas \
            else vector_tail(n, iterator, TAIL_LANES)
        if tail is not None:  # the main loop, then the remainder as a vector loop of its own
            lo, split, hi = tail
            plain = [node for a, b in ((lo, split - 1), (split, hi))
                     for node in [cgen.Pragma(p) for p in pragmas] + [cgen.For(
                         f"{self.dialect.index_type} {var} = {a}", f"{var} <= {b}",
                         f"{var} += 1", _block(body))]]
        else:
            plain = [cgen.Pragma(p) for p in pragmas] + [self._loop(n, var, body)]
        if "simd" in kinds and pragmas and not parallel:
            rounded = self._rounded_loop(n, iterator, var, pragmas, body)
            if rounded is not None:
                return rounded
            window = self._window_loop(n, iterator, var, pragmas, body, plain)
            if window is not None:
                return window
        return plain

    def _sums(self, kinds: set[str]) -> tuple[tuple[str, int], ...]:
        """The arrays a ``private:`` mark among ``kinds`` names, with their element
        counts (an OpenMP array reduction: each thread adds into its own copy)."""
        out = []
        for kind in kinds:
            for k in private_positions(kind) or ():
                a = self.kernel.arrays[k]
                size = fixed_bytes(self.kernel, a.name)
                if size is None:
                    raise InternalError(f"private array {a.name} has no fixed size")
                out.append((self.sym.arrays[a.name], size // D.itemsize(a.dtype)))
        return tuple(sorted(out))

    def _wavefront(self, n: isl.AstNode, var: str, pending: Pending) -> list[cgen.Generable]:
        """The loop over a wavefront's fronts (``n``) inside one parallel region: every
        thread runs it, the parallel loop of each front is shared among them (its end a
        barrier), and whatever else a front holds runs on one thread (``omp single``,
        a barrier too). One region instead of one a front: a front of a Jacobi
        stencil's tiles is a few microseconds of work."""
        threads = self.dialect.threads_clause.format(self.options.threads) \
            if self.options.threads else ""
        body = self._shared(n.for_get_body(), ())
        return [cgen.Pragma(self.dialect.region_pragma + threads),
                cgen.Block([self._loop(n, var, body)])]

    def _shared(self, n: isl.AstNode, pending: Pending) -> list[cgen.Generable]:
        """``n`` inside a parallel region (:meth:`_wavefront`): a loop marked parallel
        becomes the region's shared loop, blocks, conditions (on the fronts' iterators
        alone: every thread takes the same branch) and marks are walked through, and
        anything else runs on one thread."""
        t = n.get_type()
        if t == isl.ast_node_type.block:
            kids = n.block_get_children()
            return [g for i in range(kids.n_ast_node())
                    for g in self._shared(kids.get_at(i), pending)]
        if t == isl.ast_node_type.if_:
            then = _block(self._shared(n.if_get_then_node(), pending))
            other = (_block(self._shared(n.if_get_else_node(), pending))
                     if n.if_has_else_node() else None)
            return [cgen.If(self._isl(n.if_get_cond()).text, then, other)]
        if t == isl.ast_node_type.mark \
                and register_mark(n.mark_get_id().get_name()) is None:
            mark = parse_mark(n.mark_get_id().get_name())
            return self._shared(n.mark_get_node(), pending + ((mark,) if mark else ()))
        if t == isl.ast_node_type.for_ and not n.for_is_degenerate():
            iterator = n.for_get_iterator().get_id().get_name()
            depth = loop_depth(iterator)
            kinds = {kind for kind, d in pending if d == depth}
            if "parallel" in kinds:
                var = self.isl_names[iterator] = loop_var(depth)
                body = self.node(n.for_get_body(), (), True)
                pragma = self.dialect.shared_loop_pragma
                return [cgen.Pragma(pragma), self._loop(n, var, body)]
        return [cgen.Pragma(self.dialect.single_pragma),
                _block(self.node(n, pending, True))]

    def _rounded_loop(self, n: isl.AstNode, iterator: str, var: str, pragmas: list[str],
                      body: list[cgen.Generable]) -> list[cgen.Generable] | None:
        """The vector loop ``n`` of one statement (``body``, as :meth:`_statement`
        prints it) that rounds to float16, over a constant range of at most
        :data:`ROUND_ROW_MAX` elements, as :meth:`_rounded_rows` writes a register
        tile's row: a loop per rounding into a local row, rounded at once, then the loop
        of the rest (a Winograd convolution's output transform with its bias, in
        float16). None for any other loop."""
        bounds = constant_bounds(n, iterator)
        if n.for_get_body().get_type() != isl.ast_node_type.user or bounds is None \
                or not 0 < bounds[1] - bounds[0] + 1 <= ROUND_ROW_MAX or len(body) != 1:
            return None
        printed = body[0]  # the iterators' declarations and the statement, or the latter
        decls = list(printed.contents[:-1]) if isinstance(printed, cgen.Block) else []
        code = printed.contents[-1] if isinstance(printed, cgen.Block) else printed
        lo, width = bounds[0], bounds[1] - bounds[0] + 1
        lane = f"{var} - {lo}" if lo else var
        hoisted = self._hoisted_roundings(code, lane)
        if hoisted is None:
            return None

        def vector_loop(s: cgen.Generable) -> list[cgen.Generable]:
            used = [d for d in decls  # (an unused one: gcc -Wall warns)
                    if _mentions(str(s), str(d).split(" = ")[0].split()[-1])]
            return [cgen.Pragma(p) for p in pragmas] + [self._loop(n, var, used + [s])]
        return [cgen.Block(self._rounded_rows(hoisted, lane, width, str(width), vector_loop))]

    def _window_loop(self, n: isl.AstNode, iterator: str, var: str, pragmas: list[str],
                     body: list[cgen.Generable], plain: list[cgen.Generable]
                     ) -> list[cgen.Generable] | None:
        """The vector loop ``n`` of one statement (``body``, as :meth:`_statement`
        prints it; ``plain``: the loop as it is otherwise written) that reads a row of an array at several offsets along the loop (a
        stencil's ``A(i,j-1) + A(i,j) + A(i,j+1)``) with each vector of that row loaded
        once: the loop steps by whole vectors, loads the vector one ahead, and gets each
        offset's operand by a two-vector shuffle (gcc prints ``valignd``); every other
        read is one vector load, the value is the statement's expression on vectors,
        and the remainder runs as the plain loop. None where the loop or its statement
        is not of that form (:func:`_window_plan`)::

            #if defined(__AVX512F__) && <gcc>
            { int64_t polyc_at = <first>;
              { const int64_t i = ...;                        // the loop's invariants
                if (polyc_at + K <= <last>) {
                  polyc_f32x16 polyc_c0; memcpy(&polyc_c0, &A[i * N + (<j> - 1)], 64);
                  for (; polyc_at + K <= <last>; polyc_at += 16) {
                    const int64_t j = polyc_at;
                    polyc_f32x16 polyc_n0; memcpy(&polyc_n0, &A[...] + 16, 64);
                    polyc_f32x16 polyc_v1 = __builtin_shuffle(polyc_c0, polyc_n0, ...);
                    ...   polyc_f32x16 polyc_r = 0.2f * (polyc_v1 + polyc_v0 + ...);
                    memcpy(&B[i * N + j], &polyc_r, 64);  polyc_c0 = polyc_n0; } } }
              #pragma omp simd
              for (int64_t c2 = polyc_at; c2 <= <last>; c2 += 1) <the statement> }
            #elif defined(__AVX2__) && <gcc>   (the same on 256-bit vectors)
            #else
            <the plain loop>
            #endif

        ``K`` keeps every load among the elements the plain loop reads. The operations
        are the statement's, in its order, on each lane: the same values as the plain
        loop's, bit for bit. On the Zen 4 (AVX-512 on a 256-bit datapath), float32
        jacobi-2d, 1300 x 1300, four steps of fused sweeps: 3.3 -> 2.7 ms (1.2x), where
        the plain loop's five loads a vector, four across a cache line, bound it."""
        if not (WINDOW_LOADS and self.dialect.window_loads and self.options.vectorize) \
                or n.for_get_body().get_type() != isl.ast_node_type.user:
            return None
        inc, cond = n.for_get_inc(), n.for_get_cond()
        if inc.get_type() != isl.ast_expr_type.int or inc.get_val().to_python() != 1 \
                or cond.get_type() != isl.ast_expr_type.op \
                or cond.get_op_type() not in (isl.ast_expr_op_type.le, isl.ast_expr_op_type.lt) \
                or cond.get_op_arg(0).get_type() != isl.ast_expr_type.id \
                or cond.get_op_arg(0).get_id().get_name() != iterator:
            return None
        call = n.for_get_body().user_get_expr()
        stmt = self.kernel.statement(call.get_op_arg(0).get_id().get_name())
        args = [call.get_op_arg(i + 1) for i in range(len(stmt.iterators))]
        values = {it: self._isl(a).text for it, a in zip(stmt.iterators, args)}
        moving = [it for it in stmt.iterators if _mentions(values[it], var)]
        if len(moving) != 1 or not _moves_by_one(args[stmt.iterators.index(moving[0])],
                                                 iterator):
            return None
        dtype = self.kernel.array(stmt.write.array).dtype
        plans = [_window_plan(self.kernel, stmt, moving[0], self.sym.arrays, self.promoted,
                              bits // 8 // max(1, D.get(dtype).itemsize))
                 for _, bits in WINDOW_WIDTHS]
        if not any(plans):
            return None
        test = "<=" if cond.get_op_type() == isl.ast_expr_op_type.le else "<"
        last = self._isl(cond.get_op_arg(1)).text
        first = self._isl(n.for_get_init()).text
        self.isl_names[iterator] = "polyc_at"
        try:
            at_values = {it: self._isl(a).text for it, a in zip(stmt.iterators, args)}
        finally:
            self.isl_names[iterator] = var
        code: list[cgen.Generable] = [cgen.Line(
            f"#if defined({WINDOW_WIDTHS[0][0]}) && defined(__GNUC__) && !defined(__clang__)")]
        for k, ((macro, bits), plan) in enumerate(zip(WINDOW_WIDTHS, plans)):
            if k:
                code.append(cgen.Line(
                    f"#elif defined({macro}) && defined(__GNUC__) && !defined(__clang__)"))
            code += [self._window_block(stmt, plan, bits, moving[0], at_values, first, test,
                                        last, var, pragmas, body)] if plan else plain
        return code + [cgen.Line("#else"), *plain, cgen.Line("#endif")]

    def _window_block(self, stmt: Statement, plan: _WindowPlan, bits: int, moving: str,
                      values: dict[str, str], first: str, test: str, last: str, var: str,
                      pragmas: list[str], body: list[cgen.Generable]) -> cgen.Block:
        """:meth:`_window_loop`'s code for vectors of ``bits`` bits."""
        it = self.dialect.index_type
        itemsize = D.get(plan.dtype).itemsize
        lanes = bits // 8 // itemsize
        kind = "f32" if plan.dtype == "float32" else "f64"
        vec = f"polyc_{kind}x{lanes}"
        nbytes = lanes * itemsize
        scope = self.sym.namer.child()
        used = _used_iterators(stmt)
        names = {x: scope.fresh(x) for x in stmt.iterators if x in used}
        outside = [cgen.Statement(f"const {it} {names[x]} = {values[x]}")
                   for x in stmt.iterators if x in names and x != moving]
        inside = [cgen.Statement(f"const {it} {names[moving]} = {values[moving]}")] \
            if moving in names else []
        printer = self.sym.printer(self.kernel, names)
        before = self.sym.printer(self.kernel, {**names, moving: f"({values[moving]})"})
        # the last start of a vector step keeps each load within what the loop reads:
        # a window's vector one ahead ends 2 * lanes - 1 - spread past the step's first
        # element, a plain load lanes - 1 past it
        ahead = max([lanes - 1] + [2 * lanes - 1 - (w.offsets[-1] - w.offsets[0])
                                   for w in plan.windows])
        room = f"polyc_at + {ahead} {test} ({last})"
        start: list[cgen.Generable] = []
        step: list[cgen.Generable] = list(inside)
        shift: list[cgen.Generable] = []
        # each moving read's vector, by a key no array of the kernel can have (the
        # printer takes it for a rank-0 array held in a local: its C name)
        operands: dict[E.Read, str] = {}
        names_of: dict[str, str] = {}
        for g, w in enumerate(plan.windows):
            at = printer.element(w.first.array, w.first.indices).text
            start.append(cgen.Statement(f"{vec} polyc_c{g}"))
            start.append(cgen.Statement(
                f"memcpy(&polyc_c{g}, &{before.element(w.first.array, w.first.indices).text}"
                f", {nbytes})"))
            step.append(cgen.Statement(f"{vec} polyc_n{g}"))
            step.append(cgen.Statement(f"memcpy(&polyc_n{g}, &{at} + {lanes}, {nbytes})"))
            for read, offset in w.reads:
                name = names_of[f"<window {len(operands)}>"] = f"polyc_v{len(operands)}"
                k = offset - w.offsets[0]
                if k == 0:
                    step.append(cgen.Statement(f"const {vec} {name} = polyc_c{g}"))
                elif k == lanes:
                    step.append(cgen.Statement(f"const {vec} {name} = polyc_n{g}"))
                else:
                    step.append(cgen.Statement(
                        f"const {vec} {name} = __builtin_shuffle(polyc_c{g}, polyc_n{g}, "
                        f"{shuffle_index(kind, lanes, k)})"))
                operands[read] = f"<window {len(operands)}>"
            shift.append(cgen.Statement(f"polyc_c{g} = polyc_n{g}"))
        for read in plan.singles:
            name = names_of[f"<window {len(operands)}>"] = f"polyc_v{len(operands)}"
            step.append(cgen.Statement(f"{vec} {name}"))
            step.append(cgen.Statement(
                f"memcpy(&{name}, &{printer.element(read.array, read.indices).text}, "
                f"{nbytes})"))
            operands[read] = f"<window {len(operands)}>"
        # the statement's expression with its moving reads as the vectors above (held
        # as rank-0 arrays "promoted" to those names: the printer writes the name)
        value = E.map_expr(stmt.value, lambda x: E.Read(operands[x], ())
                           if isinstance(x, E.Read) and x in operands else None)
        printer.dtypes = {**printer.dtypes, **dict.fromkeys(names_of, plan.dtype)}
        printer.promoted = {key: (name, []) for key, name in names_of.items()}
        result = printer.expr(value, plan.dtype).text
        printer.promoted = {}
        target = printer.element(stmt.write.array, stmt.write.indices).text
        step.append(cgen.Statement(f"const {vec} polyc_r = {result}"))
        step.append(cgen.Statement(f"memcpy(&{target}, &polyc_r, {nbytes})"))
        loop = cgen.For("", room, f"polyc_at += {lanes}", cgen.Block(step + shift))
        tail = [cgen.Pragma(p) for p in pragmas] + [cgen.For(
            f"{it} {var} = polyc_at", f"{var} {test} ({last})", f"{var} += 1", _block(body))]
        return cgen.Block([cgen.Statement(f"{it} polyc_at = {first}"),
                           cgen.Block(outside + [cgen.If(room, cgen.Block(start + [loop]))]),
                           *tail])

    def _loop(self, n: isl.AstNode, var: str, body: list[cgen.Generable]) -> cgen.For:
        """The loop of the AST's ``for`` node ``n`` as written, around ``body``."""
        return cgen.For(f"{self.dialect.index_type} {var} = {self._isl(n.for_get_init()).text}",
                        self._isl(n.for_get_cond()).text,
                        f"{var} += {self._isl(n.for_get_inc()).text}", _block(body))

    def _vector_reduction(self, n: isl.AstNode, var: str,
                          in_parallel: bool) -> list[cgen.Generable]:
        """A loop marked ``reduce`` (:func:`polyc.schedule.vector.reduction_member`: one
        max or min statement whose element stays put) whose body is that statement, as
        an OpenMP SIMD reduction (any other body, a guard, runs as the plain loop)::

            { float polyc_red = -INFINITY;
              #pragma omp simd reduction(max:polyc_red)
              for (...) polyc_red = polyc_fmaxf(polyc_red, X[...]);
              mx[...] = polyc_fmaxf(mx[...], polyc_red); }

        Each lane folds its terms from the identity and the lanes combine at the end:
        the same maximum as the loop in order (its float start is that identity too),
        up to the sign of a zero result."""
        body = n.for_get_body()
        call = body.user_get_expr()
        stmt = self.kernel.statement(call.get_op_arg(0).get_id().get_name())
        values = {it: self._isl(call.get_op_arg(i + 1)).text
                  for i, it in enumerate(stmt.iterators)}
        dtype = self.kernel.array(stmt.write.array).dtype
        outside = self.sym.printer(self.kernel, {it: f"({v})" for it, v in values.items()})
        target = outside.element(stmt.write.array, stmt.write.indices)
        red = "polyc_red"
        self.promoted[stmt.write.array] = (red, [])
        try:
            inner = self.node(body, (), in_parallel)
        finally:
            del self.promoted[stmt.write.array]
        identity = literal(float("-inf") if stmt.op == "max" else float("inf"), dtype)
        return [cgen.Block([
            cgen.Statement(f"{compute_ctype(dtype)} {red} = {identity.text}"),
            cgen.Pragma(f"{self.dialect.simd_pragma} reduction({stmt.op}:{red})"),
            self._loop(n, var, inner),
            cgen.Statement(update(stmt.op, target, Piece(red), dtype))])]

    def _exit(self, n: isl.AstNode, iterator: str, var: str) -> list[cgen.Generable]:
        """``if (flag == 0) break;`` at the end of a step of a loop the kernel may leave
        early (``Kernel.exits``): the loop whose body runs the last statement writing the
        flag at this loop's step. Nothing for any other loop."""
        if not self.kernel.exits:
            return []
        last = None
        for call in _user_calls(n.for_get_body()):
            stmt = self.kernel.statement(call.get_op_arg(0).get_id().get_name())
            if stmt.write.array not in self.kernel.exits or not stmt.iterators:
                continue
            arg = call.get_op_arg(1)
            if arg.get_type() == isl.ast_expr_type.id and arg.get_id().get_name() == iterator:
                last = stmt
        if last is None:
            return []
        step = last.iterators[0]
        if any(E.free_names(i)[0] - {step} for i in last.write.indices):
            return []  # a flag per step only (not per element of a step)
        flag = self.sym.printer(self.kernel, {step: var}).element(last.write.array,
                                                                  last.write.indices)
        return [cgen.If(f"{flag.text} == 0", cgen.Statement("break"))]

    def _user(self, call: isl.AstExpr) -> cgen.Generable:
        stmt = self.kernel.statement(call.get_op_arg(0).get_id().get_name())
        if call.get_op_n_arg() != len(stmt.iterators) + 1:
            raise InternalError(f"statement {stmt.name} has {len(stmt.iterators)} iterators "
                                f"but the AST passes {call.get_op_n_arg() - 1}")
        return self._statement(stmt, {it: self._isl(call.get_op_arg(i + 1)).text
                                      for i, it in enumerate(stmt.iterators)})

    def _statement(self, stmt: Statement, values: dict[str, str]) -> cgen.Generable:
        """``stmt`` at the instance whose iterators have the C values ``values``."""
        scope = self.sym.namer.child()
        used = _used_iterators(stmt)
        index_names, decls = {}, []
        for it in stmt.iterators:
            if it in used:
                index_names[it] = scope.fresh(it)
                decls.append(cgen.Statement(
                    f"{self.dialect.iterator_prefix}const {self.dialect.index_type} "
                    f"{index_names[it]} = {values[it]}"))
        printer = self.sym.printer(self.kernel, index_names)
        printer.promoted = self.promoted
        dtype = self.kernel.array(stmt.write.array).dtype
        target = printer.element(stmt.write.array, stmt.write.indices)
        value = printer.expr(stmt.value, dtype, exact=stmt.is_reduction)
        code = cgen.Statement(update(stmt.op, target, value, dtype,
                                     stored=stmt.write.array not in printer.promoted))
        return cgen.Block(decls + [code]) if decls else code


#: the compiler target the VNNI variant needs
QUAD_TARGET = "defined(__AVX512VNNI__) && defined(__AVX512F__)"


#: the copy-in and copy-out of a register tile whose reduction takes at most this many
#: steps unroll their rows (the loops outside the vector one): gcc then keeps the
#: accumulator in registers from its zeroing to its store where it did a ``memset`` and
#: a round trip through the stack, which costs as much as a short reduction. MobileNetV2's
#: depthwise tiles (9 taps) 5-10% faster warm, the model 0.985x at 1 thread (Zen 5). A
#: long reduction gains nothing, and an epilogue with many constants then spills the
#: accumulators (ResNet-50 in float16, its two float16 roundings: 1.013x with every
#: tile unrolled)
ROWS_UNROLLED_STEPS = 32
#: register tiles round their rows to float16 with F16C (:meth:`_Walker._rounded_rows`)
ROUND_ROWS_F16 = True
#: ... and so do plain vector loops over at most this many elements
ROUND_ROW_MAX = 1024
#: float rows-only dot tiles run on in-register transposes (:meth:`_Walker._rows_variant`)
ROW_TRANSPOSES = True
#: float register tiles prefetch their next weight panel (:meth:`_Walker._panel_prefetch`)
PANEL_PREFETCH = True
#: ... and a tile over a chunk of its reduction the next chunk
CHUNK_PREFETCH = True
#: at most this many lines a step where the tiles that read a panel have fewer steps
#: than the next panel has lines (Winograd's products: three tiles of 16 rows)
PREFETCH_LINES_MAX = 4
#: wrap a step's prefetch line in a panel of one run at the panel's lines rounded up to
#: a power of two, a mask, instead of a % (a multiply and shifts a step); the lines past
#: the panel's end fall on what follows it, and a prefetch does not fault (a panel of
#: several runs keeps its %: its line's run and place divide anyway). Zen 2 EPYC, one
#: thread, A/B in one process: matmul 64x784x512 73.3 -> 81.3 GFLOP/s, 128x768x3072
#: 72.2 -> 78.1; mlp_b64 0.946 -> 0.875 ms, BERT layer 23.0 -> 21.6 ms; ResNet-50,
#: MobileNetV2 1.00x
PREFETCH_MASK = True
#: tiles whose vectors overflow the registers (:func:`_overflows_registers`) prefetch
#: nothing
SPILLED_TILES_UNFETCHED = True


def _overflows_registers(p: Promotion, dtype: str) -> bool:
    """Whether register tile ``p``, on vectors of 256 bits or fewer (16 registers, no
    broadcast operand), needs more vector registers than there are: its rows of
    accumulator vectors, a row of loaded column vectors and the broadcast value (a
    7-row tile of two vectors: 17). gcc then reads one column vector from memory in
    every FMA of its row, a load a row each step, and the loop is bound by its loads: a
    prefetch's load and address arithmetic come on top. On a Zen 2 EPYC (AVX2), one
    thread, ResNet-50's 7-row stride-2 3x3 convs and its stem took 7-11% less time
    without their prefetches, the model 0.99x. With AVX-512 (32 registers; a broadcast can be an FMA's
    memory operand) such tiles keep them."""
    bits = p.vector_bits
    if not bits or bits >= 512:
        return False
    d = D.get(D.get(dtype).compute)
    lanes = bits // 8 // d.itemsize if d.itemsize else 0
    if lanes < 1 or not p.box:
        return False
    vectors = -(-p.box[-1] // lanes)
    return math.prod(p.box[:-1]) * vectors + vectors + 1 > 16


def _line_prefetches(base: str, spread: str, per_step: int, lines: int, run_lines: int,
                     runs: list[tuple[int, int]]) -> list[cgen.Generable]:
    """The prefetches of one step: ``per_step`` consecutive lines from line ``per_step *
    spread`` of the panel at address ``base``, modulo ``lines`` (a panel of one run: a
    mask at ``lines`` rounded up to a power of two, :data:`PREFETCH_MASK`). A panel of
    several runs (``runs``: each reduction loop's trips and the bytes between its runs,
    outermost first; ``run_lines`` lines a run) places a line by its run's digits and
    its place in the run."""
    code: list[cgen.Generable] = []
    for j in range(per_step):
        line = spread if per_step == 1 else \
            f"{per_step} * ({spread})" + (f" + {j}" if j else "")
        # unsigned: a signed % cost five more integer instructions a step, 13% of
        # matmul 2048 on AVX2's 6 x 16 tile (12 FMAs a step; Zen 2 EPYC); and a mask,
        # not a %, where the lines are not a power of two (:data:`PREFETCH_MASK`)
        wrap = 1 << (lines - 1).bit_length()
        line = f"(uint64_t)({line}) & {wrap - 1}u" if (PREFETCH_MASK and not runs) or \
            wrap == lines else f"(uint64_t)({line}) % {lines}u"
        if not runs:
            offset = f"64u * ({line})"
        else:  # the run the line falls in, and the line within the run
            code.append(cgen.Statement(f"const uint64_t polyc_pf_line{j} = {line}"))
            run = f"(polyc_pf_line{j} / {run_lines})"
            parts, below = [], 1
            for trips, gap in reversed(runs):
                digit = f"{run} / {below} % {trips}" if below > 1 else f"{run} % {trips}"
                parts.append(f"{gap}u * ({digit})")
                below *= trips
            offset = " + ".join(reversed(parts)) + f" + 64u * (polyc_pf_line{j} % {run_lines})"
        code.append(cgen.Statement(
            f"__builtin_prefetch((const void *)({base} + {offset}), 0, 3)"))
    return code


def _plain_index(w: E.Read, iterators: tuple[str, ...], call: list[isl.AstExpr],
                 loop: isl.AstNode) -> int | None:
    """The one index of ``w`` that is the statement iterator loop ``loop`` runs, alone,
    that iterator in no other index of ``w``; else None."""
    k = _iterator_at(iterators, call, loop.for_get_iterator().get_id().get_name())
    if len(k) != 1:
        return None
    at = [j for j, ix in enumerate(w.indices) if isinstance(ix, E.Index) and ix.name == k[0]]
    if len(at) != 1 or any(k[0] in E.free_names(ix)[0]
                           for j, ix in enumerate(w.indices) if j != at[0]):
        return None
    return at[0]


#: what an AST iterator prints as where its value must not appear (the C then refuses)
_LOOP_VARIABLE = "polyc_no_loop_variable"


def _reduction_chain(body: isl.AstNode) -> tuple[list[tuple[isl.AstNode, int]], bool] | None:
    """The reduction loops below a register mark (``body``) down to the innermost, with
    their trip counts, each over its whole extent; or ending in one loop over a chunk of
    a tiled reduction (``True``: its next chunk comes next). None for any other nest."""
    chain = []
    loop = body
    while True:
        if loop.get_type() != isl.ast_node_type.for_:
            return None
        found = _loop_trips(loop)
        last = loop.for_get_body().get_type() != isl.ast_node_type.for_
        if found is None or (found[1] and not (CHUNK_PREFETCH and last)):
            return None
        trips, chunk = found
        chain.append((loop, trips))
        if last:
            return chain, chunk
        loop = loop.for_get_body()


def _panel_operand(stmt: Statement, call: list[isl.AstExpr], v: str, rows: E.Index | None,
                   cols: int) -> tuple[E.Read, list[int]] | None:
    """The operand whose panels a register tile of ``stmt`` streams (``call``: the
    statement's iterators at the innermost step, ``v`` the vector loop's iterator, ``rows``
    the tile's row index, ``cols`` the write's column dimension): the one read the vector
    loop walks and the rows do not, with its block indices (those naming an iterator
    that is neither a reduction's nor the lane's). None where there is no such single
    operand or it has no block index."""
    write = stmt.write.indices
    # the iterator the vector loop runs: the write's last index, or its lane in a
    # packed block
    lanes = _iterator_at(stmt.iterators, call, v)
    if len(lanes) != 1 or lanes[0] not in E.free_names(write[cols])[0]:
        return None
    lane = lanes[0]
    reductions = {it for it in stmt.iterators
                  if not any(it in E.free_names(ix)[0] for ix in write)}
    panel = [r for r in E.reads(stmt.value) if r.array != stmt.write.array
             and any(lane in E.free_names(ix)[0] for ix in r.indices)
             and (rows is None or not any(rows.name in E.free_names(ix)[0]
                                          for ix in r.indices))]
    if len(panel) != 1 or len(panel[0].indices) < 2:
        return None
    w = panel[0]
    blocks = [j for j, ix in enumerate(w.indices)
              if E.free_names(ix)[0] and not E.free_names(ix)[0] & reductions
              and lane not in E.free_names(ix)[0]]
    return (w, blocks) if blocks else None


def _reduction_steps(n: isl.AstNode) -> int | None:
    """The steps of the loops below a register mark (``n``, down to the first node that
    is not a loop: the block of a step's unrolled rows): their trip counts multiplied,
    1 for a degenerate loop, a chunk's at most; None where one is not a constant."""
    steps = 1
    while n.get_type() == isl.ast_node_type.for_:
        if not n.for_is_degenerate():
            trips = _loop_trips(n)
            if trips is None:
                return None
            steps *= trips[0]
        n = n.for_get_body()
    return steps


def _loop_trips(n: isl.AstNode) -> tuple[int, bool] | None:
    """``(iterations, chunk)`` of loop ``n`` when it steps by 1 between two integer
    constants (``chunk`` False), or from an expression ``e`` to ``e + c`` (one chunk of a
    tiled loop, ``chunk`` True; ``min(x, e + c)``, the last chunk shorter); else None."""
    inc, cond, init = n.for_get_inc(), n.for_get_cond(), n.for_get_init()
    if inc.get_type() != isl.ast_expr_type.int or inc.get_val().to_python() != 1 \
            or cond.get_type() != isl.ast_expr_type.op or cond.get_op_n_arg() != 2 \
            or cond.get_op_type() not in (isl.ast_expr_op_type.le, isl.ast_expr_op_type.lt):
        return None
    bound = cond.get_op_arg(1)
    closed = 1 if cond.get_op_type() == isl.ast_expr_op_type.le else 0
    if init.get_type() == isl.ast_expr_type.int:
        if bound.get_type() != isl.ast_expr_type.int:
            return None
        return max(0, bound.get_val().to_python() - init.get_val().to_python() + closed), False

    def added(x: isl.AstExpr) -> bool:
        return x.get_type() == isl.ast_expr_type.op and x.get_op_n_arg() == 2 \
            and x.get_op_type() == isl.ast_expr_op_type.add

    if bound.get_type() == isl.ast_expr_type.op and \
            bound.get_op_type() == isl.ast_expr_op_type.min:
        adds = [x for x in (bound.get_op_arg(i) for i in range(bound.get_op_n_arg()))
                if added(x)]
        if len(adds) != 1:
            return None
        bound = adds[0]
    if not added(bound):
        return None
    base, c = bound.get_op_arg(0), bound.get_op_arg(1)
    if c.get_type() != isl.ast_expr_type.int or not base.is_equal(init):
        return None
    trips = c.get_val().to_python() + closed
    return (trips, True) if trips > 0 else None


def _iterator_at(iterators: tuple[str, ...], call: list[isl.AstExpr], loop: str
                 ) -> list[str]:
    """The statement iterators whose argument in ``call`` is loop iterator ``loop``."""
    return [it for it, a in zip(iterators, call)
            if a.get_type() == isl.ast_expr_type.id and a.get_id().get_name() == loop]


def _first_for(n: isl.AstNode) -> isl.AstNode | None:
    """The first loop below ``n`` (through blocks, marks and ifs), or None."""
    t = n.get_type()
    if t == isl.ast_node_type.for_:
        return n
    if t == isl.ast_node_type.block:
        kids = n.block_get_children()
        for i in range(kids.n_ast_node()):
            found = _first_for(kids.get_at(i))
            if found is not None:
                return found
        return None
    if t == isl.ast_node_type.mark:
        return _first_for(n.mark_get_node())
    if t == isl.ast_node_type.if_:
        return _first_for(n.if_get_then_node())
    return None


def _prepend_in_loop(code: list[cgen.Generable], start: str,
                     prefix: list[cgen.Generable]) -> list[cgen.Generable] | None:
    """``code`` with ``prefix`` put first in the body of each loop whose start contains
    ``start`` (every copy the AST printed: full and partial tiles), or None if none."""
    found = False

    def walk(g: cgen.Generable) -> cgen.Generable:
        nonlocal found
        if isinstance(g, cgen.For):
            body = walk(g.body)
            if start in g.start:
                found = True
                kids = list(body.contents) if isinstance(body, cgen.Block) else [body]
                body = cgen.Block(prefix + kids)
            return cgen.For(g.start, g.condition, g.update, body)
        if isinstance(g, cgen.Block):
            return cgen.Block([walk(c) for c in g.contents])
        if isinstance(g, cgen.If):
            return cgen.If(g.condition, walk(g.then_),
                           walk(g.else_) if g.else_ is not None else None)
        return g
    out = [walk(g) for g in code]
    return out if found else None


def _sum_loop(n: isl.AstNode, stmt: str) -> tuple[str, Any, list[isl.AstExpr]] | None:
    """The iterator of a register tile's reduction loop ``n``, its condition's operator
    (``le`` or ``lt``: ``iterator <= bound`` or ``< bound``) and the statement calls
    below it, all of ``stmt``; None where the loop or its calls are not of that form."""
    cond = n.for_get_cond()
    kind = cond.get_op_type()
    iterator = n.for_get_iterator().get_id().get_name()
    calls = _user_calls(n.for_get_body())
    if kind not in (isl.ast_expr_op_type.le, isl.ast_expr_op_type.lt) or \
            cond.get_op_arg(0).get_type() != isl.ast_expr_type.id or \
            cond.get_op_arg(0).get_id().get_name() != iterator or not calls or \
            any(c.get_op_arg(0).get_id().get_name() != stmt for c in calls):
        return None
    return iterator, kind, calls


def _user_calls(n: isl.AstNode) -> list[isl.AstExpr]:
    """The statement calls in the AST below ``n``."""
    t = n.get_type()
    if t == isl.ast_node_type.user:
        return [n.user_get_expr()]
    if t == isl.ast_node_type.for_:
        return _user_calls(n.for_get_body())
    if t == isl.ast_node_type.if_:
        return _user_calls(n.if_get_then_node()) + (
            _user_calls(n.if_get_else_node()) if n.if_has_else_node() else [])
    if t == isl.ast_node_type.block:
        kids = n.block_get_children()
        return [c for i in range(kids.n_ast_node()) for c in _user_calls(kids.get_at(i))]
    if t == isl.ast_node_type.mark:
        return _user_calls(n.mark_get_node())
    return []


#: the lanes a loop's remainder is counted in (:func:`vector_tail`): 32-bit lanes of a
#: 512-bit vector, the widest unit; a whole number of them is also one of 256-bit vectors
TAIL_LANES = 16
#: a vector loop of a constant trip count below this many vectors has its remainder split
#: off (:func:`vector_tail`)
TAIL_SPLIT_VECTORS = 16


def constant_bounds(n: isl.AstNode, iterator: str) -> tuple[int, int] | None:
    """``(lo, hi)`` when the loop ``n`` over ``iterator`` runs ``lo..hi``, two constants,
    by steps of one; else None."""
    init, cond, inc = n.for_get_init(), n.for_get_cond(), n.for_get_inc()
    if inc.get_type() != isl.ast_expr_type.int or inc.get_val().to_python() != 1 \
            or init.get_type() != isl.ast_expr_type.int \
            or cond.get_type() != isl.ast_expr_type.op \
            or cond.get_op_type() not in (isl.ast_expr_op_type.le, isl.ast_expr_op_type.lt):
        return None
    a, b = cond.get_op_arg(0), cond.get_op_arg(1)
    if not (a.get_type() == isl.ast_expr_type.id and a.get_id().get_name() == iterator
            and b.get_type() == isl.ast_expr_type.int):
        return None
    return (init.get_val().to_python(),
            b.get_val().to_python() - (cond.get_op_type() == isl.ast_expr_op_type.lt))


def vector_tail(n: isl.AstNode, iterator: str, lanes: int) -> tuple[int, int, int] | None:
    """``(lo, split, hi)`` when the ``omp simd`` loop ``n`` runs ``lo..hi`` (constants,
    step 1) and its trip count leaves a remainder of two or more past a whole number of
    ``lanes``-wide vectors (``split`` is where the remainder starts), the loop being
    short (:data:`TAIL_SPLIT_VECTORS`); else None.

    gcc runs such a remainder one element at a time (it has no masked epilogues before
    gcc 14), and in a short loop it is a large share of the work: the benchmarks'
    NonMaxSuppression tail, whose step loops run over 20 classes (a 16-lane vector and 4
    scalar iterations), took 1.85 ms without the split and 1.37 ms with it, the
    remainder a loop of its own that gcc vectorizes with narrower vectors."""
    bounds = constant_bounds(n, iterator)
    if bounds is None:
        return None
    lo, hi = bounds
    trip = hi - lo + 1
    if trip <= lanes or trip >= TAIL_SPLIT_VECTORS * lanes or trip % lanes < 2:
        return None
    return lo, hi + 1 - trip % lanes, hi


def _moves_by_one(e: isl.AstExpr, iterator: str) -> bool:
    """``e`` is the loop iterator ``iterator``, or it plus or minus an integer."""
    if e.get_type() == isl.ast_expr_type.id:
        return e.get_id().get_name() == iterator
    if e.get_type() != isl.ast_expr_type.op or \
            e.get_op_type() not in (isl.ast_expr_op_type.add, isl.ast_expr_op_type.sub):
        return False
    a, b = e.get_op_arg(0), e.get_op_arg(1)
    return (a.get_type() == isl.ast_expr_type.id and a.get_id().get_name() == iterator
            and b.get_type() == isl.ast_expr_type.int)


def _byte_stride(kernel: Kernel, read: E.Read, it: str) -> int | None:
    """How many bytes ``read``'s element moves when iterator ``it`` grows by one (the
    array's shape constant, its indices affine); None when unknown."""
    shape = kernel.array(read.array).shape
    if not all(isinstance(d, E.Const) for d in shape) or \
            not all(E.is_affine(ix) for ix in read.indices):
        return None
    step, total = D.get(kernel.array(read.array).dtype).itemsize, 0
    for ix, d in zip(reversed(read.indices), reversed(shape)):
        names, sizes = E.free_names(ix)
        if sizes:
            return None
        env = dict.fromkeys(names, 0)
        total += step * (E.evaluate(ix, {**env, it: 1}) - E.evaluate(ix, {**env, it: 0})
                         if it in names else 0)
        step *= int(d.value)
    return total


#: vector loops that read a row at several offsets load each of its vectors once
#: (:meth:`_Walker._window_loop`)
WINDOW_LOADS = True
#: the vector widths a window loop is written for, each behind its compiler target
WINDOW_WIDTHS = (("__AVX512F__", 512), ("__AVX2__", 256))


@dataclass(frozen=True)
class _Window:
    """The reads of one row of an array at several offsets along a loop: ``reads``
    pairs each with its offset, ``first`` reads at the lowest, ``offsets`` are sorted."""
    first: E.Read
    offsets: tuple[int, ...]
    reads: tuple[tuple[E.Read, int], ...]


@dataclass(frozen=True)
class _WindowPlan:
    dtype: str
    windows: tuple[_Window, ...]
    #: the other reads that move with the loop (one vector load each)
    singles: tuple[E.Read, ...]


#: the operations a window loop's value may hold: what gcc's vector extensions take
#: between vectors and scalars alike, as the statement's C spells them
_WINDOW_OPS = ("+", "-", "*", "/")


def _window_plan(kernel: Kernel, stmt: Statement, it: str, c_names: dict[str, str],
                 promoted: dict[str, Any], lanes: int) -> _WindowPlan | None:
    """How :meth:`_Walker._window_loop` loads the operands of ``stmt`` in a vector loop
    over its iterator ``it``: None unless the statement writes a float32 or float64
    element that moves by one element along ``it`` (``=``, no reduction), its value is
    ``+ - * /`` of literals and reads of its type, every read either keeps still or moves
    as the write does, none reads the written array, and at least one array's row is
    read at two or more offsets at most ``lanes`` elements apart (a window; offsets
    further apart load a vector each)."""
    dtype = kernel.array(stmt.write.array).dtype
    if dtype not in ("float32", "float64") or stmt.op != "=" \
            or not E.unit_last(stmt.write.indices, it) or stmt.write.array in promoted:
        return None
    written = c_names[stmt.write.array]
    dtypes = {a.name: a.dtype for a in kernel.arrays}
    groups: dict[tuple[Any, ...], dict[int, list[E.Read]]] = {}
    for x in _value_nodes(stmt.value):
        if isinstance(x, E.Binary) and x.op in _WINDOW_OPS or \
                isinstance(x, E.Unary) and x.op == "-":
            if E.infer_dtype(x, dtypes) != dtype:
                return None
            continue
        if isinstance(x, E.Const):
            if isinstance(x.value, bool) or x.dtype not in (None, dtype):
                return None
            continue
        if not isinstance(x, E.Read) or x.array in promoted \
                or c_names[x.array] == written or dtypes[x.array] != dtype \
                or not all(E.is_affine(ix) for ix in x.indices):
            return None
        if any(it in E.free_names(ix)[0] for ix in x.indices):
            if not E.unit_last(x.indices, it):
                return None
            last = x.indices[-1]
            names, sizes = E.free_names(last)
            zero = dict.fromkeys(names | sizes, 0)
            base = E.evaluate(last, zero)
            slope = tuple(sorted((v, E.evaluate(last, {**zero, v: 1}) - base)
                                 for v in names | sizes))
            key = (x.array, x.indices[:-1], slope)
            groups.setdefault(key, {}).setdefault(base, []).append(x)
    windows, singles = [], []
    for offsets in groups.values():
        ds = sorted(offsets)
        if len(ds) > 1 and ds[-1] - ds[0] <= lanes:
            windows.append(_Window(offsets[ds[0]][0], tuple(ds), tuple(
                (r, d) for d in ds for r in dict.fromkeys(offsets[d]))))
        else:
            singles += [r for d in ds for r in dict.fromkeys(offsets[d])]
    if not windows:
        return None
    return _WindowPlan(dtype, tuple(windows), tuple(singles))


def _value_nodes(e: E.Expr) -> Iterator[E.Expr]:
    """The nodes of value ``e`` in pre-order, not those of its reads' indices."""
    yield e
    if not isinstance(e, E.Read):
        for c in E.children(e):
            yield from _value_nodes(c)


def _block(body: list[cgen.Generable]) -> cgen.Block:
    """``{ body }``; a statement's own block is the loop's (no ``{ { ... } }``)."""
    return body[0] if len(body) == 1 and isinstance(body[0], cgen.Block) else cgen.Block(body)


def _used_iterators(stmt: Statement) -> set[str]:
    used: set[str] = set()
    for e in (*stmt.write.indices, stmt.value):
        used |= E.free_names(e)[0]
    return used


def _parameters(kernel: Kernel, sym: _Symbols, dialect: CDialect) -> list[cgen.Value]:
    r = dialect.restrict
    params = [cgen.Value("int64_t", sym.sizes[s]) for s in kernel.sizes]
    for names, const in ((kernel.inputs, "const "), (kernel.outputs, "")):
        for a in names:
            ctype = CTYPES[kernel.array(a).dtype]
            params.append(cgen.Value(f"{const}{ctype} *{r}", sym.arrays[a]))
    return params


def _declaration(kernel: Kernel, sym: _Symbols, dialect: CDialect,
                 storage: str = "") -> cgen.FunctionDeclaration:
    ret = " ".join(filter(None, (storage.strip(), dialect.function_qualifier, "int")))
    return cgen.FunctionDeclaration(cgen.Value(ret, sym.function),
                                    _parameters(kernel, sym, dialect))


def _function(kernel: Kernel, sym: _Symbols, dialect: CDialect,
              body: list[cgen.Generable], storage: str = "",
              attributes: str = "") -> cgen.FunctionBody:
    # a temporary only register tiles' epilogues read is never stored: not allocated
    body_text = "\n".join(str(g) for g in body)
    temps = [(sym.arrays[a.name], CTYPES[a.dtype], a.shape,
              reads_before_writing(kernel, a.name)) for a in kernel.temporaries
             if _mentions(body_text, sym.arrays[a.name])]
    printer = sym.printer(kernel, {})
    inner: list[cgen.Generable] = []
    if temps:  # one block of the thread's scratch (see PRELUDE), carved in 64-byte steps
        sizes = []
        for i, (name, ctype, shape, _zeroed) in enumerate(temps):
            count = printer.expr(_product(shape), "int64").text
            inner.append(cgen.Statement(
                f"const size_t polyc_bytes{i} = polyc_bytes({count}, sizeof({ctype}))"))
            sizes.append(f"polyc_bytes{i}")
        inner.append(cgen.Statement(
            f"unsigned char *const polyc_scratch_at = polyc_scratch({' + '.join(sizes)})"))
        inner.append(cgen.If("!polyc_scratch_at", cgen.Statement("return 2")))
        offset = "polyc_scratch_at"
        for i, (name, ctype, shape, zeroed) in enumerate(temps):
            inner.append(cgen.Statement(
                f"{ctype} *{dialect.restrict} {name} = ({ctype} *)(void *)({offset})"))
            if zeroed:
                inner.append(cgen.Statement(f"memset({name}, 0, polyc_bytes{i})"))
            offset = f"{offset} + polyc_bytes{i}"
    inner += body + [cgen.Statement("return 0")]

    outer: list[cgen.Generable] = []
    check = size_check(kernel)
    if check is not None:
        cond = isl_expr(check, dict(sym.sizes))
        outer.append(cgen.If(f"!{cond.at(PRIMARY)}", cgen.Statement("return 1")))
    fixed = dict(kernel.fixed_sizes)
    inner_text = "\n".join(str(g) for g in inner)
    consts = [cgen.Statement(f"const int64_t {sym.sizes[s]} = {fixed[s]}")
              for s in kernel.sizes if s in fixed and _mentions(inner_text, sym.sizes[s])]
    outer += [cgen.Block(consts + inner)] if consts else inner
    text = "\n".join(str(g) for g in outer)
    unused = [cgen.Statement(f"(void){p.name}") for p in _parameters(kernel, sym, dialect)
              if not _mentions(text, p.name)]
    storage = " ".join(filter(None, (attributes, storage.strip())))
    return cgen.FunctionBody(_declaration(kernel, sym, dialect, storage),
                             cgen.Block(unused + outer))


def _product(shape: tuple[E.Expr, ...]) -> E.Expr:
    total: E.Expr = shape[0] if shape else E.Const(1)
    for extent in shape[1:]:
        total = E.Binary("*", total, extent)
    return total


def _mentions(text: str, name: str) -> bool:
    return re.search(rf"\b{re.escape(name)}\b", text) is not None


def _describe(kernel: Kernel, sym: _Symbols, dialect: CDialect) -> str:
    """The comment above the function: the calling convention of this kernel."""
    def shape(a: str) -> str:
        arr = kernel.array(a)
        dims = [E.show(E.map_expr(d, lambda x: E.Size(sym.sizes[x.name])
                                  if isinstance(x, E.Size) else None)) for d in arr.shape]
        return arr.dtype + "".join(f"[{d}]" for d in dims)

    lines = [f"Generated by polyc from kernel {kernel.name!r}.", "",
             f"{_declaration(kernel, sym, dialect)}", ""]
    if kernel.sizes:
        lines.append(f"  sizes (int64): {', '.join(sym.sizes[s] for s in kernel.sizes)}")
    for role, names in (("input ", kernel.inputs), ("output", kernel.outputs)):
        lines += [f"  {role} {sym.arrays[a]}: {shape(a)}" for a in names]
    lines += [f"  temporary {sym.arrays[a.name]}: {shape(a.name)}" for a in kernel.temporaries]
    if kernel.fixed_sizes:
        lines.append("  specialised for " + ", ".join(
            f"{sym.sizes[s]} = {v}" for s, v in kernel.fixed_sizes))
    lines += ["", "Arrays are dense and row-major (C order); outputs are updated in place.",
              "Returns 0 on success, 1 when the sizes violate",
              f"  {kernel.context}", "2 when temporary storage cannot be allocated."]
    body = "\n".join((" * " + ln).rstrip() for ln in lines).replace("*/", "* /")
    return f"/*\n{body}\n */"
