"""The CUDA printer: one ``__global__`` kernel per :class:`GpuKernel`, and a host wrapper.

The kernels' bodies come from the same isl AST walk as the C target
(:mod:`.c_family`); only the dialect and the frame differ. One file::

    <helpers: polyc_min_i64 ... as __host__ __device__ functions>
    #ifndef POLYC_LAUNCH          (cuda_emu.h defines its own, before this file)
    #define POLYC_LAUNCH(kernel, grid, block, ...) kernel<<<grid, block>>>(__VA_ARGS__)
    #endif

    __global__ void __launch_bounds__(256, 1) polyc_kernel1(int64_t M, ..., float *__restrict__ C)
    {
      __shared__ float polyc_shared_A[8][32];       // arrays promoted by gpu_map, if any
      const int64_t polyc_b0 = blockIdx.x, polyc_t0 = threadIdx.x;   // those it uses
      <the loops of one thread: mapped loops are single assignments plus guards>
    }

A kernel with shared arrays is printed from the schedule of a whole block; at the shared
mark (between the tile loops and the point loops) every thread of the block runs::

      { lo/extent of each tile (isl, per iteration of the loops above)
        for (i = polyc_tid; i < extent0 * extent1; i += threads)      // coalesced copy-in
          polyc_shared_A[i / extent1][i % extent1] = A[(lo0 + i / extent1) * K + ...];
        __syncthreads();
        for (n = 32*b0 + t0; n <= ...; n += 32) if (n >= ...)          // point loops, each
          ... polyc_shared_A[m - lo0][k - lo1] ...                   // thread its points
        __syncthreads(); }                                            // before the next copy

    POLYC_EXPORT const char *matmul_last_error(void);     // the message of the last failure
    POLYC_EXPORT int matmul(int64_t M, ..., const float *A, ..., float *C)
    {
      cudaGetDeviceCount          -> 4 and "no usable CUDA device: ..." when it fails
      cudaMalloc, cudaMemcpy in   (inputs and outputs: outputs are updated in place)
      POLYC_LAUNCH(...) per kernel, in dependence order; cudaGetLastError after each
      cudaDeviceSynchronize, cudaMemcpy out, cudaFree
    }

Every CUDA call is checked; a failure stores "<call> returned <code> (<name>: <text>)" in
a thread-local buffer and returns 3 (never exits). Status 1: the sizes violate the
kernel's context, as in the C target. The file includes nothing CUDA-specific (nvcc
includes ``cuda_runtime.h`` itself) and launches only through ``POLYC_LAUNCH``, so that
``g++ -include cuda_emu.h -x c++`` builds the same text for the CPU emulation.
"""
from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

import cgen
import islpy as isl

from polyc import dtypes as D
from polyc import expr as E
from polyc.errors import InternalError, UnsupportedError
from polyc.ir import Access, Kernel
from polyc.options import Options

from .ast import annotate_marks, loop_depth, size_check
from .c_expr import (ADD, CONVERSIONS, CTYPES, PRELUDE, PRIMARY, Piece, compute_ctype, isl_expr,
                     load, loop_var, store)
from .c_family import CDialect, CSource, _block, _mentions, _product, _Symbols, _Walker
from .initial_values import reads_before_writing

#: The mapping comes from ``polyc.schedule.gpu_map`` (``GpuKernel``, ``MappedDim``,
#: ``SharedArray`` records), which the code generator does not import (the layering
#: rule of tests/test_packaging.py): it reads their attributes, and the name of the
#: shared-memory mark is part of the schedule, like the CPU's "parallel" marks.
GpuKernel = Any
MappedDim = Any
SharedArray = Any
#: the mark ``gpu_map`` puts between a kernel's tile band and its point band
SHARED_MARK = "polyc_shared"
#: the mark above the reduction's tile loops of a register-tiled kernel
PRIVATE_MARK = "polyc_private"

#: status codes of the host wrapper beyond the C target's 0 (ok) and 1 (sizes)
STATUS_CUDA_ERROR = 3
STATUS_NO_DEVICE = 4


class CudaDialect(CDialect):
    """CUDA C++ device code: no pragmas, ``__restrict__``, no CPU attributes."""
    function_qualifier = "__global__"
    restrict = "__restrict__"
    wide_vector_attribute = ""
    accumulator_attribute = ""
    unroll_pragma = "unroll {}"
    iterator_prefix = "[[maybe_unused]] "
    vnni_intrinsics = False
    panel_prefetch = False
    round_rows = False
    row_transposes = False
    window_loads = False


@dataclass(frozen=True)
class LaunchInfo:
    """How the wrapper launches one kernel (grid as C text of the sizes)."""
    name: str
    grid: tuple[str, str, str]
    block: tuple[int, int, int]
    note: str = ""
    #: the user names (sizes and arrays) the kernel takes, in parameter order
    args: tuple[str, ...] = ()


@dataclass(frozen=True)
class CudaSource(CSource):
    """A ``.cu`` file: :class:`CSource` plus the kernels it launches."""
    launches: tuple[LaunchInfo, ...] = field(default=())


#: the C prelude's one-line helpers (name -> definition) as host/device functions
HELPERS = {name: text.replace("static inline ", "static inline __host__ __device__ ", 1)
           for name, text in CONVERSIONS.items()}  # first: one-liners below call them
HELPERS.update({re.search(r"(polyc_\w+)\(", ln).group(1):  # type: ignore[union-attr]
                ln.replace("static inline ", "static inline __host__ __device__ ", 1)
                for ln in PRELUDE.splitlines()
                if ln.startswith("static inline ") and ln.rstrip().endswith("}")
                and re.search(r"(polyc_\w+)\(", ln).group(1) not in CONVERSIONS})  # type: ignore[union-attr]


def _device_prelude(used: str) -> str:
    """Includes, the launch and export macros, and the helpers ``used`` mentions (nvcc
    warns about unused static functions)."""
    wanted = {name for name in HELPERS if _mentions(used, name)}
    while True:  # and the helpers those helpers call
        more = {name for name in HELPERS if name not in wanted
                and any(_mentions(HELPERS[w], name) for w in wanted)}
        if not more:
            break
        wanted |= more
    helpers = [d for name, d in HELPERS.items() if name in wanted]
    return "\n".join([
        "#include <stdint.h>", "#include <stdbool.h>", "#include <stdio.h>",
        "#include <string.h>", "#include <math.h>", "",
        "#ifndef POLYC_LAUNCH  /* cuda_emu.h (CPU emulation) defines its own */",
        "#define POLYC_LAUNCH(kernel, grid, block, ...) kernel<<<grid, block>>>(__VA_ARGS__)",
        "#endif",
        "#ifdef __CUDACC__  /* unrolled by nvcc: a register tile's indices become constants */",
        "#define POLYC_UNROLL _Pragma(\"unroll\")",
        "#define POLYC_ASSUME(c) __builtin_assume(c)",
        "#else",
        "#define POLYC_UNROLL",
        "#define POLYC_ASSUME(c) ((void)0)",
        "#endif",
        "#ifndef POLYC_EXPORT",
        '#define POLYC_EXPORT extern "C" __attribute__((visibility("default")))',
        "#endif", "",
        "/* helpers: floor division and modulo round towards -infinity (as in isl) */",
        *helpers])


def generate_cuda(kernel: Kernel, kernels: list[GpuKernel],
                  options: Options | None = None) -> CudaSource:
    """The ``.cu`` text of ``kernel`` mapped as ``kernels`` (see the module doc)."""
    options = options or Options(target="cuda")
    sym = _Symbols.of(kernel)
    device, launches = device_kernels(kernel, kernels, options, sym=sym)
    host, params = _wrapper(kernel, sym, tuple(launches))
    comment = _comment(kernel, sym, tuple(launches))
    prelude = _device_prelude("\n".join(device + [host]))
    text = "\n\n".join([comment, prelude, *device, host]) + "\n"
    decl = f"int {sym.function}({', '.join(f'{t} {n}' for t, n in params)});"
    header = (f"{comment}\n#include <stdint.h>\n#include <stdbool.h>\n#include <stddef.h>\n\n"
              f"#ifdef __cplusplus\nextern \"C\" {{\n#endif\n{decl}\n"
              f"const char *{sym.function}_last_error(void);\n"
              f"/* the same on device pointers (no copies), and device memory */\n"
              f"{decl[:-1].replace(sym.function + '(', sym.function + '_device(', 1)};\n"
              f"int {sym.function}_device_malloc(void **pointer, size_t bytes);\n"
              f"int {sym.function}_device_free(void *pointer);\n"
              f"int {sym.function}_device_memcpy(void *to, const void *from, size_t bytes, "
              f"int kind);\n"
              f"int {sym.function}_device_memset(void *pointer, int value, size_t bytes);\n"
              f"#ifdef __cplusplus\n}}\n#endif\n")
    return CudaSource(text, header, sym.function, kernel.name,
                      tuple(n for _, n in params), tuple(t for t, _ in params),
                      tuple(sym.sizes.items()), tuple(sym.arrays.items()), tuple(launches))


def device_kernels(kernel: Kernel, kernels: list[GpuKernel], options: Options,
                   prefix: str = "polyc_kernel", sym: _Symbols | None = None
                   ) -> tuple[list[str], list[LaunchInfo]]:
    """The ``__global__`` functions of ``kernel`` mapped as ``kernels``, named
    ``<prefix><index>``, and how to launch each (a model's library prints several
    operators' kernels in one file, each with its own prefix)."""
    for arr in kernel.arrays:
        if D.get(arr.dtype).minifloat:
            raise UnsupportedError(
                f"array {arr.name!r} of kernel {kernel.name!r} has dtype {arr.dtype}, which "
                f"the CUDA target does not compile yet (the C target does: its conversions "
                f"use tables the device code does not have)")
    dialect = CudaDialect()
    sym = sym or _Symbols.of(kernel)
    device, launches = [], []
    for gk in kernels:
        name = f"{prefix}{gk.index}"
        code, args = _kernel_function(kernel, sym, dialect, options, gk, name)
        device.append(code)
        launches.append(LaunchInfo(name, _grid(kernel, sym, gk), gk.block, gk.note, args))
    return device, launches


@dataclass(frozen=True)
class SharedCopy:
    """One shared array at one generated :data:`SHARED_MARK`: per array dimension the
    first element and the extent minus one of what the block reads in this iteration of
    the loops above (isl AST expressions of those loops and the block indices)."""
    array: SharedArray
    lo: tuple[isl.AstExpr, ...]
    span: tuple[isl.AstExpr, ...]


def kernel_ast(kernel: Kernel, gk: GpuKernel,
               copies: dict[str, list[SharedCopy]] | None = None) -> isl.AstNode:
    """isl's AST of one thread of ``gk`` (iterators ``polyc_c<schedule depth>``); each
    generated shared mark is annotated with a key of ``copies`` (filled here)."""
    annotated, depth = annotate_marks(gk.schedule)
    ctx = gk.schedule.get_ctx()
    ids = isl.IdList.alloc(ctx, depth)
    for d in range(depth):
        ids = ids.add(isl.Id(f"polyc_c{d}", context=ctx))
    build = isl.AstBuild.from_context(gk.context).set_iterators(ids)
    copies = {} if copies is None else copies
    errors: list[BaseException] = []
    stmts = [kernel.statement(n) for n in gk.statements]

    def after_mark(node: isl.AstNode, at: isl.AstBuild) -> isl.AstNode:
        try:  # an exception inside an isl callback would crash the process: keep it
            name = node.mark_get_id().get_name()
            key = f"polyc_copy{len(copies)}"
            if name == SHARED_MARK:
                found = [_copy(kernel, read_relation(kernel, stmts, sa.array), sa, at)
                         for sa in gk.shared]
                copies[key] = [c for c in found if c is not None]
            elif name == PRIVATE_MARK:
                p = gk.private
                found = _copy(kernel, write_relation(kernel, stmts, p.array), p, at)
                if found is None:
                    raise InternalError(f"the register tile of {p.array} is empty")
                copies[key] = [found]
            else:
                return node
            return node.set_annotation(isl.Id(key, context=ctx))
        except BaseException as e:  # noqa: BLE001 -- re-raised after isl returns
            errors.append(e)
            return node

    build, handle = build.set_after_each_mark(after_mark)
    tree = build.node_from_schedule(annotated)
    del handle
    if errors:
        raise InternalError(f"shared memory promotion failed: {errors[0]}") from errors[0]
    return tree


def read_relation(kernel: Kernel, stmts: list, array: str) -> isl.UnionMap:
    """``{ S[i] -> array[...] }``: the reads of ``array`` by ``stmts``."""
    rel = isl.UnionMap.empty(kernel.context.get_space())
    for s in stmts:
        for r in E.reads(s.value):
            if r.array == array:
                rel = rel.union(isl.UnionMap.from_map(Access(r.array, r.indices)
                                                      .relation(s.domain)))
    return rel.intersect_params(kernel.context)


def write_relation(kernel: Kernel, stmts: list, array: str) -> isl.UnionMap:
    """``{ S[i] -> array[...] }``: the writes of ``array`` by ``stmts``."""
    rel = isl.UnionMap.empty(kernel.context.get_space())
    for s in stmts:
        if s.write.array == array:
            rel = rel.union(isl.UnionMap.from_map(s.write.relation(s.domain)))
    return rel.intersect_params(kernel.context)


def _copy(kernel: Kernel, relation: isl.UnionMap, sa: Any,
          build: isl.AstBuild) -> SharedCopy | None:
    """The box of the elements ``relation`` touches in one iteration of the loops above
    ``build``'s position (the whole block's instances); None when there are none here
    (a branch of a fused kernel whose statements do not read the array: fuzz seed 131)."""
    sched = build.get_schedule()
    footprint = sched.reverse().apply_range(relation)
    if footprint.is_empty():
        return None
    if footprint.n_map() != 1:
        raise InternalError(f"the footprint of {sa.array} is {footprint}")
    fp = footprint.get_map_list().get_at(0)
    rank = fp.dim(isl.dim_type.out)
    los, spans = [], []
    for d in range(rank):
        proj = fp.project_out(isl.dim_type.out, d + 1, rank - d - 1) \
            .project_out(isl.dim_type.out, 0, d)
        lo = proj.lexmin_pw_multi_aff().get_pw_aff(0)
        hi = proj.lexmax_pw_multi_aff().get_pw_aff(0)
        los.append(build.expr_from_pw_aff(lo))
        spans.append(build.expr_from_pw_aff(hi.sub(lo)))
    return SharedCopy(sa, tuple(los), tuple(spans))


class _CudaWalker(_Walker):
    """The C walk, plus the shared-memory marks: cooperative copy-in, barriers."""

    def __init__(self, kernel: Kernel, sym: _Symbols, dialect: CDialect, options: Options,
                 gk: GpuKernel, copies: dict[str, list[SharedCopy]]):
        super().__init__(kernel, sym, dialect, options, {})
        self.gk, self.copies = gk, copies
        #: ``__shared__`` declarations, printed at the top of the kernel
        self.shared_decls: dict[str, str] = {}
        #: thread-mapped loops around the node being printed (their schedule depths)
        self.active: list[int] = []

    def _user(self, call: isl.AstExpr) -> cgen.Generable:
        """A statement; in a block-level kernel, guarded by its thread when isl printed
        no loop for a thread-mapped member (its value was fixed by the loops above)."""
        code = super()._user(call)
        missing = [d for depth, d in self.gk.thread_depths if depth not in self.active]
        if not missing:
            return code
        conds = []
        for d in missing:
            value = self._member_value(d, call)
            base = (f"{d.lo} + " if d.lo else "") + f"{d.tile} * {d.block_param}"
            offset = f"{value} - ({base})"
            conds.append(f"{offset} == {d.thread_param}" if d.tile == d.block
                         else f"({offset}) % {d.block} == {d.thread_param}")
        return cgen.If(" && ".join(conds), code)

    def _exit(self, n: isl.AstNode, iterator: str, var: str) -> list[cgen.Generable]:
        """A loop's early exit (``Kernel.exits``) in a kernel of one thread only: with
        threads, the flag one thread writes would need a barrier before all read it, and
        every thread would have to leave together. Elsewhere the loop runs every step
        (the later ones change nothing)."""
        return [] if self.gk.dims else super()._exit(n, iterator, var)

    def _member_value(self, d: MappedDim, call: isl.AstExpr) -> str:
        """C text of the mapped member's value for the statement instance of ``call``."""
        name = call.get_op_arg(0).get_id().get_name()
        found: list[isl.PwAff] = []
        d.function.foreach_pw_aff(lambda p: found.append(p) if p.get_domain_space()
                                  .get_tuple_name(isl.dim_type.set) == name else None)
        pieces: list[isl.Aff] = []
        for pa in found:
            pa.foreach_piece(lambda _s, aff: pieces.append(aff))
        if len(pieces) == 1 and pieces[0].dim(isl.dim_type.div) == 0:
            aff = pieces[0]
            terms = []
            for i in range(aff.dim(isl.dim_type.in_)):
                c = aff.get_coefficient_val(isl.dim_type.in_, i).to_python()
                if c:
                    arg = self._isl(call.get_op_arg(i + 1)).at(PRIMARY)
                    terms.append(arg if c == 1 else f"{c} * {arg}")
            const = aff.get_constant_val().to_python()
            if aff.dim(isl.dim_type.param) == 0 or all(
                    aff.get_coefficient_val(isl.dim_type.param, i).to_python() == 0
                    for i in range(aff.dim(isl.dim_type.param))):
                return "(" + " + ".join(terms + ([str(const)] if const else [])) + ")" \
                    if terms else str(const)
        raise InternalError(f"cannot print the mapped member {d.axis} of {name}: {found}")

    def node(self, n: isl.AstNode, pending: tuple, in_parallel: bool) -> list[cgen.Generable]:
        if n.get_type() == isl.ast_node_type.mark:
            name = n.mark_get_id().get_name()
            if name == SHARED_MARK:
                return self._shared(self.copies[n.get_annotation().get_name()],
                                    n.mark_get_node(), pending, in_parallel)
            if name == PRIVATE_MARK:
                return self._private(self.copies[n.get_annotation().get_name()][0],
                                     n.mark_get_node(), pending, in_parallel)
        return super().node(n, pending, in_parallel)

    def _private(self, c: SharedCopy, body: isl.AstNode, pending: tuple,
                 in_parallel: bool) -> list[cgen.Generable]:
        """A register tile: the thread's elements of the array (``base + B*p`` along each
        mapped axis, p < points) loaded into a local array before the reduction's loops
        and stored after them; unrolled, so that nvcc keeps them in registers. Elements
        outside the block's box of this iteration are neither loaded nor stored."""
        p = self.gk.private
        a = p.array
        name = f"polyc_reg_{self.sym.arrays[a]}"
        dtype = self.kernel.array(a).dtype
        ctype = compute_ctype(dtype)  # held as computed (a float for float16)
        mapped = [(d, self.gk.dims[axis]) for d, axis in enumerate(p.axes) if axis is not None]
        code: list[cgen.Generable] = [cgen.Statement(
            f"{ctype} {name}{''.join(f'[{n}]' for n in p.points)} = {{}}")]
        lo = [f"{name}_lo{d}" for d in range(len(p.axes))]
        hi = [f"{name}_hi{d}" for d in range(len(p.axes))]
        for d in range(len(p.axes)):
            code.append(cgen.Statement(f"const int64_t {lo[d]} = {self._isl(c.lo[d]).text}"))
        base = {}
        for d, m in mapped:
            code.append(cgen.Statement(f"const int64_t {hi[d]} = {lo[d]} + "
                                       f"{self._isl(c.span[d]).at(ADD)}"))
            base[d] = f"{name}_base{d}"
            first = ((f"{m.lo} + " if m.lo else "")
                     + f"{m.tile} * {m.block_param} + {m.thread_param}")
            code.append(cgen.Statement(f"const int64_t {base[d]} = {first}"))
        names = {f"polyc_g{d}": lo[d] for d in range(len(p.axes))}
        for k, (d, m) in enumerate(mapped):
            names[f"polyc_g{d}"] = f"({base[d]} + {m.block} * polyc_p{k})"
        printer = self.sym.printer(self.kernel, names)
        stored = printer.element(a, tuple(E.Index(f"polyc_g{d}") for d in range(len(p.axes))))
        element = stored.text
        local = name + "".join(f"[polyc_p{k}]" for k in range(len(mapped)))
        inside = " && ".join(f"{names[f'polyc_g{d}']} >= {lo[d]} && "
                             f"{names[f'polyc_g{d}']} <= {hi[d]}" for d, _ in mapped)

        def copy(stmt: str) -> cgen.Generable:
            loop: cgen.Generable = cgen.If(inside, cgen.Statement(stmt))
            for k in reversed(range(len(mapped))):
                loop = cgen.Block([cgen.Line("POLYC_UNROLL"),
                                   cgen.For(f"int polyc_p{k} = 0", f"polyc_p{k} < {p.points[k]}",
                                            f"polyc_p{k}++", _block([loop]))])
            return loop

        self.promoted[a] = (name, [(d, base[d], m.block) for d, m in mapped])
        try:
            inner = self.node(body, pending, in_parallel)
        finally:
            self.promoted.pop(a, None)
        return [cgen.Block(code + [copy(f"{local} = {load(dtype, stored).text}")] + inner
                           + [copy(f"{element} = {store(dtype, Piece(local)).text}")])]

    def _for(self, n: isl.AstNode, pending: tuple, in_parallel: bool) -> list[cgen.Generable]:
        """A point loop mapped to threads (kernels with shared arrays, see
        :func:`polyc.schedule.gpu_map._promote`): thread ``t`` of the block runs the
        values ``tile start + t + B*q`` of the loop."""
        iterator = n.for_get_iterator().get_id().get_name()
        depth = loop_depth(iterator)
        d = dict(self.gk.thread_depths).get(depth)
        if d is None:
            return super()._for(n, pending, in_parallel)
        var = self.isl_names[iterator] = loop_var(depth)
        init = self._isl(n.for_get_init()).text
        base = (f"{d.lo} + " if d.lo else "") + f"{d.tile} * {d.block_param} + {d.thread_param}"
        self.active.append(depth)
        try:
            body = self.node(n.for_get_body(), (), in_parallel)
        finally:
            self.active.pop()
        if n.for_is_degenerate():
            mine = (f"{var} - ({base}) == 0" if d.tile == d.block
                    else f"({var} - ({base})) % {d.block} == 0")
            return [cgen.Block([cgen.Statement(f"const int64_t {var} = {init}"),
                                cgen.If(mine, cgen.Block(body))])]
        inc = self._isl(n.for_get_inc()).text
        if inc != "1":
            raise InternalError(f"a thread-mapped loop steps by {inc}")
        if self.gk.private is not None:  # a register tile: the thread's points, unrolled
            q = f"polyc_q{depth}"
            cond = self._isl(n.for_get_cond()).text
            return [cgen.Block([cgen.Line("POLYC_UNROLL"), cgen.For(
                f"int {q} = 0", f"{q} < {d.tile // d.block}", f"{q}++",
                cgen.Block([cgen.Statement(f"const int64_t {var} = {base} + {d.block} * {q}"),
                            cgen.If(f"{var} >= {init} && {cond}", cgen.Block(body))]))])]
        return [cgen.For(f"int64_t {var} = {base}", self._isl(n.for_get_cond()).text,
                         f"{var} += {d.block}",
                         cgen.Block([cgen.If(f"{var} >= {init}", cgen.Block(body))]))]

    def _shared(self, copies: list[SharedCopy], body: isl.AstNode, pending: tuple,
                in_parallel: bool) -> list[cgen.Generable]:
        code: list[cgen.Generable] = []
        for c in copies:
            a = c.array.array
            name = f"polyc_shared_{self.sym.arrays[a]}"
            dtype = self.kernel.array(a).dtype
            ctype = compute_ctype(dtype)  # held as computed (a float for float16)
            self.shared_decls[name] = (f"__shared__ {ctype} {name}"
                                       + "".join(f"[{b}]" for b in c.array.box))
            rank = len(c.lo)
            lo = [f"{name}_lo{d}" for d in range(rank)]
            n = [f"{name}_n{d}" for d in range(rank)]
            code += [cgen.Statement(f"const int64_t {lo[d]} = {self._isl(c.lo[d]).text}")
                     for d in range(rank)]
            code += [cgen.Statement(f"const int64_t {n[d]} = {self._isl(c.span[d]).at(ADD)} + 1")
                     for d in range(rank)]
            # element polyc_i of the tile (row-major over its extents) -> polyc_r<d>
            loop: list[cgen.Generable] = []
            for d in range(rank):
                inner = " * ".join(n[d + 1:])
                q = f"polyc_i / ({inner})" if inner else "polyc_i"
                r = f"{q} % {n[d]}" if d else q
                loop.append(cgen.Statement(f"const int64_t polyc_r{d} = {r}"))
            names = {f"polyc_g{d}": f"({lo[d]} + polyc_r{d})" for d in range(rank)}
            printer = self.sym.printer(self.kernel, names)
            element = printer.element(a, tuple(E.Index(f"polyc_g{d}") for d in range(rank)))
            local = name + "".join(f"[polyc_r{d}]" for d in range(rank))
            loop.append(cgen.Statement(f"{local} = {load(dtype, element).text}"))
            total = " * ".join(n)
            code.append(cgen.For("int64_t polyc_i = polyc_tid", f"polyc_i < {total}",
                                 f"polyc_i += {self.gk.threads}", cgen.Block(loop)))
            self.promoted[a] = (name, [(d, lo[d]) for d in range(rank)])
        try:
            inner = self.node(body, pending, in_parallel)
        finally:
            for c in copies:
                self.promoted.pop(c.array.array, None)
        sync = cgen.Statement("__syncthreads()")
        return [cgen.Block(code + [sync] + inner + [sync])]


def _device_arrays(kernel: Kernel) -> list[tuple[str, bool]]:
    """Every array the kernels take, in parameter order, and whether it is read-only."""
    return ([(a, True) for a in kernel.inputs] + [(a, False) for a in kernel.outputs]
            + [(a.name, False) for a in kernel.temporaries])


def _kernel_params(kernel: Kernel, sym: _Symbols) -> list[tuple[str, str, str]]:
    """(C type, C name, user name) of every size and array a kernel may take."""
    params = [("int64_t", sym.sizes[s], s) for s in kernel.sizes]
    for a, const in _device_arrays(kernel):
        ctype = CTYPES[kernel.array(a).dtype]
        params.append((f"{'const ' if const else ''}{ctype} *__restrict__", sym.arrays[a], a))
    return params


def _kernel_function(kernel: Kernel, sym: _Symbols, dialect: CudaDialect, options: Options,
                     gk: GpuKernel, name: str) -> tuple[str, tuple[str, ...]]:
    """The kernel's definition, and the user names of the sizes and arrays it takes."""
    copies: dict[str, list[SharedCopy]] = {}
    tree = kernel_ast(kernel, gk, copies)
    walker = _CudaWalker(kernel, sym, dialect, options, gk, copies)
    for d in gk.dims:
        walker.isl_names[d.block_param] = d.block_param
        walker.isl_names[d.thread_param] = d.thread_param
    body = walker.node(tree, (), False)
    text = "\n".join(str(g) for g in body)
    ids = []
    for d in gk.dims:
        ids += [(d.block_param, f"blockIdx.{d.axis}"), (d.thread_param, f"threadIdx.{d.axis}")]
    bx, by, _ = gk.block
    ids.append(("polyc_tid", f"(threadIdx.x + {bx} * (threadIdx.y + {by} * threadIdx.z))"))
    prologue: list[cgen.Generable] = [cgen.Statement(decl)
                                      for decl in walker.shared_decls.values()]
    prologue += [cgen.Statement(f"const int64_t {name} = (int64_t){value}")
                 for name, value in ids if _mentions(text, name)]
    # the launch's block bounds the thread indices: nvcc can then drop the guards of a
    # register tile's unrolled points in full tiles, and share their shared-memory loads
    # (1.9x on a 4096 matmul on an H100)
    prologue += [cgen.Statement(f"POLYC_ASSUME(threadIdx.{d.axis} < {d.block})")
                 for d in gk.dims if _mentions(text, d.thread_param)]
    used = [p for p in _kernel_params(kernel, sym) if _mentions(text, p[1])]
    params = ", ".join(f"{t} {n}" for t, n, _ in used) or "void"
    # at least one block per SM: ptxas may then use the registers a register tile needs
    # instead of spilling to fit more blocks
    head = f"__global__ void __launch_bounds__({gk.threads}, 1) {name}({params})"
    what = ", ".join(gk.statements)
    mapping = ", ".join(f"member {d.member} -> {d.axis} (tile {d.tile}, {d.block} threads)"
                        for d in gk.dims) or "one thread"
    if gk.shared:
        mapping += "; shared: " + ", ".join(
            f"{sa.array}{list(sa.box)}" for sa in gk.shared)
    if gk.private is not None:
        mapping += (f"; registers: {gk.private.array}{list(gk.private.points)} per thread")
    note = f"\n   {gk.note}" if gk.note else ""
    return (f"/* kernel {gk.index}: {what}; {mapping}{note} */\n"
            f"{head}\n{cgen.Block(prologue + body)}"), tuple(p[2] for p in used)


def _grid(kernel: Kernel, sym: _Symbols, gk: GpuKernel) -> tuple[str, str, str]:
    texts = []
    build = isl.AstBuild.from_context(isl.Set.universe(kernel.context.get_space()))
    for d in gk.dims:
        texts.append(isl_expr(build.expr_from_pw_aff(d.grid), dict(sym.sizes)).text)
    texts += ["1"] * (3 - len(texts))
    return (texts[0], texts[1], texts[2])


def _wrapper(kernel: Kernel, sym: _Symbols, launches: tuple[LaunchInfo, ...]
             ) -> tuple[str, list[tuple[str, str]]]:
    """The host side: ``<fn>`` (host arrays: copied in and out), ``<fn>_device`` (device
    arrays: no copies) and the device-memory calls polyc's Python runtime uses for
    device arrays (``<fn>_device_malloc``, ``_free``, ``_memcpy``, ``_memset``)."""
    fn = sym.function
    params = [("int64_t", sym.sizes[s]) for s in kernel.sizes]
    for names, const in ((kernel.inputs, "const "), (kernel.outputs, "")):
        params += [(f"{const}{CTYPES[kernel.array(a).dtype]} *", sym.arrays[a]) for a in names]
    printer = sym.printer(kernel, {})
    arrays = _device_arrays(kernel)
    dev = {a: f"polyc_d{i}" for i, (a, _) in enumerate(arrays)}
    bytes_of = {a: f"polyc_bytes{i}" for i, (a, _) in enumerate(arrays)}
    user = [a for a, _ in arrays if kernel.array(a).role != "temp"]
    temps = [a for a, _ in arrays if kernel.array(a).role == "temp"]
    sizes_text = "".join(f"{sym.sizes[s]}, " for s in kernel.sizes)

    def byte_counts(names: list[str]) -> list[str]:
        out = []
        for a in names:
            ctype = CTYPES[kernel.array(a).dtype]
            count = printer.expr(_product(kernel.array(a).shape), "int64").text
            out.append(f"const size_t {bytes_of[a]} = (size_t)({count}) * sizeof({ctype});")
        return out

    def allocate(names: list[str]) -> list[str]:
        out = [f"{CTYPES[kernel.array(a).dtype]} *{dev[a]} = NULL;" for a in names]
        return out + [f"POLYC_CHECK(\"cudaMalloc\", cudaMalloc((void **)&{dev[a]}, "
                      f"{bytes_of[a]} ? {bytes_of[a]} : 1));" for a in names]

    def free(names: list[str]) -> list[str]:
        out = []
        for a in names:
            out += [f"if ({dev[a]}) {{",
                    f"  const cudaError_t polyc_e = cudaFree({dev[a]});",
                    "  if (polyc_e != cudaSuccess && polyc_status == 0)",
                    "    polyc_status = polyc_fail(\"cudaFree\", polyc_e);", "}"]
        return out

    def function(head: str, body: list[str], tail: list[str]) -> list[str]:
        return ([head, "{"] + ["  " + ln for ln in body]
                + [ln if ln.endswith(":") else "  " + ln for ln in tail] + ["}", ""])

    # the launches, on device arrays (inputs and outputs given, temporaries allocated)
    launch_params = ", ".join([f"{t} {n}" for t, n in params[:len(kernel.sizes)]]
                              + [f"{t}{dev[a]}" for (t, _), a in
                                 zip(params[len(kernel.sizes):], user)]) or "void"
    body = ["int polyc_status = 0;", *byte_counts(temps), *allocate(temps)]
    for a in temps:
        if reads_before_writing(kernel, a):
            body.append(f"POLYC_CHECK(\"cudaMemset\", cudaMemset({dev[a]}, 0, {bytes_of[a]}));")
    for launch in launches:
        args = "".join(f", {sym.sizes[a] if a in sym.sizes else dev[a]}" for a in launch.args)
        grid = ", ".join(f"(unsigned)({g})" for g in launch.grid)
        block = ", ".join(str(b) for b in launch.block)
        nonconst = [g for g in launch.grid if not g.isdigit()]
        call = [f"POLYC_LAUNCH({launch.name}, dim3({grid}), dim3({block}){args});",
                f"POLYC_CHECK(\"launch of {launch.name}\", cudaGetLastError());"]
        if any(g == "0" for g in launch.grid):
            continue  # nothing to run for these sizes
        if nonconst:
            cond = " && ".join(f"({g}) > 0" for g in nonconst)
            body += [f"if ({cond}) {{"] + ["  " + c for c in call] + ["}"]
        else:
            body += call
    body.append("POLYC_CHECK(\"cudaDeviceSynchronize\", cudaDeviceSynchronize());")
    lines = [*_error_calls(fn),
             "#define POLYC_CHECK(name, call) do { const cudaError_t polyc_e = (call); \\",
             "    if (polyc_e != cudaSuccess) { polyc_status = polyc_fail(name, polyc_e); \\",
             "                                  goto polyc_done; } } while (0)", "",
             ""]
    lines += function(f"static int polyc_launch_all({launch_params})", body,
                      ["polyc_done:", *free(temps), "return polyc_status;"])
    check = size_check(kernel)
    guard = ([f"if (!{isl_expr(check, dict(sym.sizes)).at(PRIMARY)}) return 1;"]
             if check is not None else [])
    device_args = ", ".join(n for _, n in params) or ""
    lines += function(
        f"POLYC_EXPORT int {fn}_device({', '.join(f'{t} {n}' for t, n in params)})",
        guard + ["const int polyc_device = polyc_device_ready();",
                 "if (polyc_device) return polyc_device;",
                 f"return polyc_launch_all({device_args});"], [])
    body = guard + ["const int polyc_device = polyc_device_ready();",
                    "if (polyc_device) return polyc_device;", "int polyc_status = 0;",
                    *byte_counts(user), *allocate(user)]
    for a in user:
        body.append(f"if ({bytes_of[a]}) POLYC_CHECK(\"cudaMemcpy (to the device)\", "
                    f"cudaMemcpy({dev[a]}, {sym.arrays[a]}, {bytes_of[a]}, "
                    "cudaMemcpyHostToDevice));")
    body.append(f"polyc_status = polyc_launch_all({sizes_text}{', '.join(dev[a] for a in user)});")
    body.append("if (polyc_status) goto polyc_done;")
    for a in kernel.outputs:
        body.append(f"if ({bytes_of[a]}) POLYC_CHECK(\"cudaMemcpy (to the host)\", "
                    f"cudaMemcpy({sym.arrays[a]}, {dev[a]}, {bytes_of[a]}, "
                    "cudaMemcpyDeviceToHost));")
    lines += function(f"POLYC_EXPORT int {fn}({', '.join(f'{t} {n}' for t, n in params)})",
                      body, ["polyc_done:", *free(user), "return polyc_status;"])
    lines += _memory_calls(fn) + ["#undef POLYC_CHECK"]
    return "\n".join(lines), params


def _error_calls(fn: str) -> list[str]:
    """The message buffer, ``<fn>_last_error``, ``polyc_fail`` and ``polyc_device_ready``."""
    return ["static thread_local char polyc_message[1024];",
            f"POLYC_EXPORT const char *{fn}_last_error(void)", "{",
            "  return polyc_message;", "}", "",
            "static int polyc_fail(const char *call, cudaError_t e)", "{",
            "  snprintf(polyc_message, sizeof polyc_message, \"%s returned %d (%s: %s)\",",
            "           call, (int)e, cudaGetErrorName(e), cudaGetErrorString(e));",
            f"  return {STATUS_CUDA_ERROR};", "}", "", *_device_check(), ""]


def memory_library_source(fn: str = "polyc") -> str:
    """A ``.cu`` with only the device-memory calls (``<fn>_device_malloc`` ...), for
    :func:`polyc.to_device` before any operator is compiled."""
    body = "\n".join([*_error_calls(fn), *_memory_calls(fn)])
    return "\n\n".join([_device_prelude(body), body]) + "\n"


def _device_check() -> list[str]:
    """``polyc_device_ready()``: 0, or 4 with the message when there is no usable device."""
    return ["static int polyc_device_ready(void)", "{",
            "  int polyc_count = 0;",
            "  const cudaError_t polyc_first = cudaGetDeviceCount(&polyc_count);",
            "  if (polyc_first == cudaSuccess && polyc_count > 0) return 0;",
            "  if (polyc_first != cudaSuccess)",
            "    snprintf(polyc_message, sizeof polyc_message, \"no usable CUDA device: "
            "cudaGetDeviceCount returned %d (%s: %s)\",",
            "             (int)polyc_first, cudaGetErrorName(polyc_first), "
            "cudaGetErrorString(polyc_first));",
            "  else",
            "    snprintf(polyc_message, sizeof polyc_message, \"no usable CUDA device: "
            "cudaGetDeviceCount found none\");",
            f"  return {STATUS_NO_DEVICE};", "}"]


def _memory_calls(fn: str) -> list[str]:
    """Device memory for callers that hold device arrays (polyc's ``DeviceArray``): each
    returns 0 or the status of a failed CUDA call, with its message."""
    ready = ["const int polyc_device = polyc_device_ready();",
             "if (polyc_device) return polyc_device;"]

    def call(signature: str, name: str, expr: str) -> list[str]:
        return [f"POLYC_EXPORT int {fn}_device_{signature}", "{", *("  " + r for r in ready),
                f"  const cudaError_t polyc_e = {expr};",
                f"  return polyc_e == cudaSuccess ? 0 : polyc_fail(\"{name}\", polyc_e);",
                "}", ""]
    return (call("malloc(void **pointer, size_t bytes)", "cudaMalloc",
                 "cudaMalloc(pointer, bytes ? bytes : 1)")
            + call("free(void *pointer)", "cudaFree", "cudaFree(pointer)")
            + call("memcpy(void *to, const void *from, size_t bytes, int kind)", "cudaMemcpy",
                   "cudaMemcpy(to, from, bytes, (cudaMemcpyKind)kind)")
            + call("memset(void *pointer, int value, size_t bytes)", "cudaMemset",
                   "cudaMemset(pointer, value, bytes)"))


def _comment(kernel: Kernel, sym: _Symbols, launches: tuple[LaunchInfo, ...]) -> str:
    lines = [f"Generated by polyc (CUDA) from kernel {kernel.name!r}.", "",
             f"int {sym.function}(sizes..., inputs..., outputs...): host arrays, "
             "copied to and from the device.",
             "Returns 0 on success, 1 when the sizes violate", f"  {kernel.context},",
             f"{STATUS_CUDA_ERROR} when a CUDA call fails, {STATUS_NO_DEVICE} when there "
             f"is no usable device; {sym.function}_last_error() says which and why.", ""]
    for launch in launches:
        lines.append(f"{launch.name}: grid ({', '.join(launch.grid)}), "
                     f"block ({', '.join(map(str, launch.block))})"
                     + (f": {launch.note}" if launch.note else ""))
    if kernel.fixed_sizes:
        lines.append("specialised for " + ", ".join(
            f"{sym.sizes[s]} = {v}" for s, v in kernel.fixed_sizes))
    body = "\n".join((" * " + ln).rstrip() for ln in lines).replace("*/", "* /")
    return f"/*\n{body}\n */"
