"""The static GPU report of a CUDA operator: what a profiler would say, without a GPU.

Per kernel (``str(report)`` prints it; the records are for tests and tools):

* grid, block and what was mapped (or why nothing was: one block of one thread);
* per access of each statement, from the access relation and the thread mapping, with
  isl: take two instances that a warp runs at the same time on neighbouring lanes (equal
  schedule time except one more along the member on ``threadIdx.x``); the set of
  differences of their row-major element offsets says **coalesced** (always 1),
  **broadcast** (always 0: one address for the whole warp), **strided by k** (always k)
  or **irregular** (several differences);
* per access served from ``__shared__`` memory, the **bank-conflict degree** of the warp:
  with a stride of ``w`` 4-byte words between lanes, ``gcd(w, 32)`` lanes share a bank
  (``w = 0`` is a broadcast: no conflict);
* from ``ptxas -v`` (the library's nvcc build, or one made for the report): registers,
  shared memory, stack, spills;
* the theoretical occupancy on the target architecture, from the per-SM limits NVIDIA
  publishes (sm_80: 64K registers, 2048 threads, 32 blocks, 164 KiB shared memory), the
  register allocation granularity (256 per warp) and the 1 KiB shared memory each
  block reserves;
* warnings: spills, every global access that is neither coalesced nor a broadcast (an
  uncoalesced stream), a kernel on one thread.
"""
from __future__ import annotations

import math
import os
from dataclasses import dataclass, field
from typing import Any

import islpy as isl

from polyc import dtypes as D
from polyc import expr as E
from polyc.errors import ToolchainError
from polyc.ir import Access, Kernel, Statement

from .cuda import GpuKernel
from .nvcc import PtxasInfo, parse_ptxas, ptxas_report


@dataclass(frozen=True)
class SmLimits:
    registers: int
    threads: int
    blocks: int
    shared_bytes: int
    #: shared memory the driver reserves per resident block
    reserved_shared: int = 1024


#: per-SM limits (CUDA C Programming Guide, "Compute Capabilities")
SM_LIMITS = {
    75: SmLimits(65536, 1024, 16, 64 * 1024, 0),
    80: SmLimits(65536, 2048, 32, 164 * 1024),
    86: SmLimits(65536, 1536, 16, 100 * 1024),
    87: SmLimits(65536, 2048, 32, 164 * 1024),
    89: SmLimits(65536, 1536, 24, 100 * 1024),
    90: SmLimits(65536, 2048, 32, 228 * 1024),
}
WARP = 32
REGISTER_GRANULE = 256  # registers are allocated per warp in units of 256


@dataclass(frozen=True)
class AccessReport:
    statement: str
    kind: str  # "read" or "write"
    array: str
    text: str  # the access as written: "A[m, k]"
    #: "coalesced", "broadcast", "strided", "irregular" or "n/a" (and why, in detail)
    coalescing: str
    #: element stride between neighbouring lanes (for "strided"; 1 coalesced, 0 broadcast)
    stride: int | None = None
    #: served from a __shared__ tile (the global reads are the cooperative copy-in)
    shared: bool = False
    #: lanes of a warp that hit one shared memory bank (1: no conflict)
    bank_conflicts: int | None = None
    detail: str = ""


@dataclass(frozen=True)
class Occupancy:
    blocks_per_sm: int
    warps_per_sm: int
    max_warps: int
    limited_by: str

    @property
    def fraction(self) -> float:
        return self.warps_per_sm / self.max_warps if self.max_warps else 0.0


@dataclass(frozen=True)
class KernelReport:
    name: str
    statements: tuple[str, ...]
    grid: tuple[str, str, str]
    block: tuple[int, int, int]
    mapping: str
    note: str
    shared: tuple[tuple[str, tuple[int, ...], int], ...]
    accesses: tuple[AccessReport, ...]
    ptxas: PtxasInfo | None
    occupancy: Occupancy | None
    warnings: tuple[str, ...] = field(default=())
    #: the register tile: the array and its points per thread, if any
    registers: tuple[str, tuple[int, ...]] | None = None

    @property
    def threads(self) -> int:
        x, y, z = self.block
        return x * y * z

    def access(self, array: str, kind: str | None = None) -> AccessReport:
        """The first access of ``array`` (of ``kind``: "read"/"write")."""
        for a in self.accesses:
            if a.array == array and (kind is None or a.kind == kind):
                return a
        raise KeyError(array)


@dataclass(frozen=True)
class GpuReport:
    operator: str
    arch: str
    sizes: tuple[tuple[str, int], ...]
    kernels: tuple[KernelReport, ...]
    ptxas_note: str = ""

    def kernel(self, statement: str) -> KernelReport:
        """The kernel running ``statement`` (``"S1"``)."""
        for k in self.kernels:
            if statement in k.statements:
                return k
        raise KeyError(statement)

    @property
    def warnings(self) -> tuple[str, ...]:
        return tuple(f"{k.name}: {w}" for k in self.kernels for w in k.warnings)

    def __str__(self) -> str:
        sizes = ", ".join(f"{s}={v}" for s, v in self.sizes) or "generic sizes"
        lines = [f"GPU report: {self.operator} for {self.arch} ({sizes})"]
        if self.ptxas_note:
            lines.append(f"  ptxas: {self.ptxas_note}")
        for k in self.kernels:
            lines.append(f"kernel {k.name} ({', '.join(k.statements)}): grid "
                         f"({', '.join(k.grid)}) x block ({', '.join(map(str, k.block))}) "
                         f"= {k.threads} threads/block")
            lines.append(f"  mapping: {k.mapping}")
            if k.note:
                lines.append(f"  note: {k.note}")
            for name, box, nbytes in k.shared:
                lines.append(f"  shared: {name}{''.join(f'[{b}]' for b in box)} "
                             f"({nbytes} bytes)")
            if k.registers is not None:
                name, points = k.registers
                lines.append(f"  registers: {name}{''.join(f'[{p}]' for p in points)} per "
                             "thread (accumulators kept across the reduction)")
            if k.ptxas is not None:
                p = k.ptxas
                lines.append(f"  ptxas: {p.registers} registers, {p.shared_bytes} bytes shared, "
                             f"{p.stack_bytes} bytes stack, spills {p.spill_stores}/"
                             f"{p.spill_loads} bytes (stores/loads), {p.barriers} barriers")
            if k.occupancy is not None:
                o = k.occupancy
                lines.append(f"  occupancy: {o.blocks_per_sm} blocks/SM, {o.warps_per_sm}/"
                             f"{o.max_warps} warps = {100 * o.fraction:.0f}% "
                             f"(limited by {o.limited_by})")
            for a in k.accesses:
                where = "shared" if a.shared else "global"
                text = f"    {a.statement} {a.kind:5} {a.text}: {a.coalescing}"
                if a.coalescing == "strided":
                    text += f" by {a.stride} elements"
                if a.detail:
                    text += f" ({a.detail})"
                if a.shared:
                    text += (f"; from {where} memory, bank conflicts: "
                             f"{a.bank_conflicts}-way" if a.bank_conflicts and
                             a.bank_conflicts > 1 else f"; from {where} memory, no bank "
                             "conflict")
                lines.append(text)
            lines += [f"  WARNING: {w}" for w in k.warnings]
        return "\n".join(lines)


def report(compiled: Any) -> GpuReport:
    """The report of a :class:`polyc.pipeline.Compiled` of target ``"cuda"``."""
    kernel: Kernel = compiled.scheduled.kernel
    options = compiled.options
    fn = compiled.function
    ptxas, note = _ptxas(compiled.source.text, compiled.source.function_name, options,
                         None if fn is None or getattr(fn, "emulated", True) else fn.path)
    kernels = kernel_reports(kernel, compiled.gpu_kernels, compiled.source.launches,
                             "polyc_kernel", ptxas, options.gpu_arch)
    return GpuReport(kernel.name, options.gpu_arch, kernel.fixed_sizes, tuple(kernels), note)


def _ptxas(text: str, stem: str, options: Any, built: str | None
           ) -> tuple[dict[str, PtxasInfo], str]:
    """ptxas's figures for ``text`` (from the nvcc build at ``built`` when there is one),
    or none and why."""
    if built is not None and os.path.exists(built[: -len(".so")] + ".ptxas.txt"):
        with open(built[: -len(".so")] + ".ptxas.txt") as f:
            return parse_ptxas(f.read()), ""
    try:
        return ptxas_report(text, stem, options), ""
    except (ToolchainError, OSError) as err:
        return {}, f"no ptxas figures ({str(err).splitlines()[0]})"


def kernel_reports(kernel: Kernel, gpu: tuple[GpuKernel, ...], launch_list: Any, prefix: str,
                   ptxas: dict[str, PtxasInfo], arch: str) -> list[KernelReport]:
    """A :class:`KernelReport` per GPU kernel of ``kernel`` (named ``<prefix><index>``)."""
    limits = SM_LIMITS.get(int(arch[3:]), SM_LIMITS[80])
    launches = {launch.name: launch for launch in launch_list}
    kernels = []
    for gk in gpu:
        name = f"{prefix}{gk.index}"
        launch = launches[name]
        accesses = tuple(_accesses(kernel, gk))
        info = ptxas.get(name)
        occ = occupancy(info, gk.threads, limits) if info is not None else None
        mapping = ", ".join(f"band member {d.member} -> {d.axis} (tile {d.tile}, "
                            f"{d.block} threads)" for d in gk.dims) or "none (one thread)"
        kernels.append(KernelReport(
            name, gk.statements, launch.grid, launch.block, mapping, gk.note,
            tuple((sa.array, sa.box, sa.nbytes) for sa in gk.shared), accesses, info, occ,
            tuple(_warnings(gk, accesses, info)),
            None if gk.private is None else (gk.private.array, gk.private.points)))
    return kernels


@dataclass(frozen=True)
class ModelGpuReport:
    """The GPU report of a whole model: one :class:`GpuReport` per distinct operator
    (kernels named ``polyc_k<operator>_<index>`` in the model's ``.cu``) and how many of
    the model's steps run it."""
    model: str
    arch: str
    operators: tuple[GpuReport, ...]
    steps: tuple[int, ...]
    ptxas_note: str = ""

    @property
    def kernels(self) -> tuple[KernelReport, ...]:
        return tuple(k for op in self.operators for k in op.kernels)

    @property
    def warnings(self) -> list[str]:
        return [f"{op.operator}: {w}" for op in self.operators for w in op.warnings]

    def __str__(self) -> str:
        kernels = self.kernels
        occ = [k.occupancy.fraction for k in kernels if k.occupancy is not None]
        accesses = [a for k in kernels for a in k.accesses]
        coalesced = sum(1 for a in accesses if a.coalescing in ("coalesced", "broadcast"))
        lines = [f"GPU report: model {self.model} for {self.arch}: {len(self.operators)} "
                 f"distinct operators, {len(kernels)} kernels, {sum(self.steps)} steps",
                 f"  global accesses coalesced or broadcast: {coalesced} of {len(accesses)}; "
                 f"kernels with register tiles: {sum(1 for k in kernels if k.registers)}, "
                 f"with shared memory: {sum(1 for k in kernels if k.shared)}"]
        if occ:
            lines.append(f"  occupancy: lowest {min(occ):.0%}, median "
                         f"{sorted(occ)[len(occ) // 2]:.0%}")
        if self.ptxas_note:
            lines.append(f"  ptxas: {self.ptxas_note}")
        lines.append(f"  warnings: {len(self.warnings)}")
        for op, n in zip(self.operators, self.steps):
            lines += ["", f"operator {op.operator} (run by {n} step{'s' if n != 1 else ''}):",
                      *("  " + ln for ln in str(op).splitlines()[1:])]
        return "\n".join(lines)


def model_report(source: Any, options: Any, built: str | None = None) -> ModelGpuReport:
    """The report of a CUDA model's :class:`polyc.codegen.model.ModelSource` (ptxas's
    figures from the nvcc build at ``built``, or from a build made here)."""
    ptxas, note = _ptxas(source.text, source.name, options, built)
    operators = []
    for i, (kernel, gpu, launches, _) in enumerate(source.gpu_operators):
        kernels = kernel_reports(kernel, gpu, launches, f"polyc_k{i}_", ptxas, options.gpu_arch)
        operators.append(GpuReport(kernel.name, options.gpu_arch, kernel.fixed_sizes,
                                   tuple(kernels)))
    return ModelGpuReport(source.name, options.gpu_arch, tuple(operators),
                          tuple(n for *_, n in source.gpu_operators), note)


def occupancy(info: PtxasInfo, threads: int, limits: SmLimits) -> Occupancy:
    """Resident blocks and warps per SM for a kernel with ``info``'s resources."""
    warps = -(-threads // WARP)
    max_warps = limits.threads // WARP
    bounds = {"threads": limits.threads // (warps * WARP), "blocks": limits.blocks}
    if info.registers:
        per_warp = -(-info.registers * WARP // REGISTER_GRANULE) * REGISTER_GRANULE
        bounds["registers"] = limits.registers // (per_warp * warps)
    if info.shared_bytes:
        bounds["shared memory"] = limits.shared_bytes // (info.shared_bytes
                                                          + limits.reserved_shared)
    limited_by = min(bounds, key=lambda k: bounds[k])
    blocks = bounds[limited_by]
    return Occupancy(blocks, min(max_warps, blocks * warps), max_warps, limited_by)


def _warnings(gk: GpuKernel, accesses: tuple[AccessReport, ...],
              info: PtxasInfo | None) -> list[str]:
    out = []
    if info is not None and info.spills:
        out.append(f"spills registers ({info.spill_stores} bytes stored, {info.spill_loads} "
                   "bytes loaded per thread)")
    bad = [a for a in accesses if not a.shared and a.coalescing in ("strided", "irregular")]
    if bad:
        which = ", ".join(f"{a.statement} {a.kind} {a.text} ({a.coalescing}"
                          + (f" by {a.stride})" if a.stride is not None else ")") for a in bad)
        out.append(f"uncoalesced global memory stream: {which}")
    if not gk.dims:
        out.append("no parallel loop: the kernel runs on one thread")
    return out


def _accesses(kernel: Kernel, gk: GpuKernel) -> list[AccessReport]:
    shared = {sa.array: sa for sa in gk.shared}
    out = []
    for name in gk.statements:
        s = kernel.statement(name)
        pairs = _lane_pairs(kernel, gk, s)
        listed = [("write", s.write)] + [("read", Access(r.array, r.indices))
                                         for r in E.reads(s.value)]
        for kind, acc in listed:
            arr = kernel.array(acc.array)
            text = f"{acc.array}[{', '.join(E.show(i) for i in acc.indices)}]"
            verdict, stride, detail = _verdict(kernel, s, acc, arr.shape, pairs)
            sa = shared.get(acc.array) if kind == "read" else None
            conflicts = None
            if sa is not None:
                _, box_stride, _ = _verdict(kernel, s, acc, tuple(E.Const(b) for b in sa.box),
                                            pairs)
                conflicts = bank_conflicts(box_stride, D.itemsize(arr.dtype)) \
                    if box_stride is not None else None
            out.append(AccessReport(name, kind, acc.array, text, verdict, stride,
                                    sa is not None, conflicts, detail))
    return out


def bank_conflicts(stride: int, itemsize: int) -> int:
    """Lanes of a warp that hit one bank, for an element stride between lanes."""
    words = abs(stride) * itemsize // 4 if itemsize >= 4 else 0
    return 1 if words == 0 else math.gcd(words, 32)


def _lane_pairs(kernel: Kernel, gk: GpuKernel, s: Statement) -> isl.UnionMap | None:
    """``{ S[i] -> S[i'] }``: instances neighbouring lanes of a warp run together."""
    if not gk.dims:
        return None
    time = gk.time.intersect_domain(isl.UnionSet.from_set(s.domain))
    if time.is_empty():
        return None
    m = time.get_map_list().get_at(0)
    n = m.dim(isl.dim_type.out)
    x = gk.time_dims[0]
    src = [f"c{i}" for i in range(n)]
    dst = [f"c{i} + 1" if i == x else f"c{i}" for i in range(n)]
    shift = isl.UnionMap(f"{{ [{', '.join(src)}] -> [{', '.join(dst)}] }}")
    return time.apply_range(shift).apply_range(time.reverse())


def _verdict(kernel: Kernel, s: Statement, acc: Access, shape: tuple[E.Expr, ...],
             pairs: isl.UnionMap | None) -> tuple[str, int | None, str]:
    """Coalescing of ``acc`` between neighbouring lanes: the verdict, the element stride
    (row-major over ``shape``; None when a size is not fixed) and a detail."""
    if pairs is None:
        return "n/a", None, "one thread"
    if not acc.indices:
        return "broadcast", 0, "a scalar"
    rel = acc.relation(s.domain, kernel.array(acc.array).shape).intersect_params(kernel.context)
    rel_u = isl.UnionMap.from_map(rel)
    deltas = pairs.apply_domain(rel_u).apply_range(rel_u).deltas()
    vectors: list[tuple[int, ...]] = []
    irregular = [False]

    def collect(st: isl.Set) -> None:
        st = st.project_out(isl.dim_type.param, 0, st.dim(isl.dim_type.param))
        if st.is_empty():
            return
        v = []
        for d in range(st.dim(isl.dim_type.set)):
            lo, hi = st.dim_min_val(d), st.dim_max_val(d)
            if not (lo.is_int() and hi.is_int()) or lo.to_python() != hi.to_python():
                irregular[0] = True
                return
            v.append(lo.to_python())
        vectors.append(tuple(v))

    deltas.foreach_set(collect)
    if irregular[0] or len(set(vectors)) > 1:
        return "irregular", None, "the distance between lanes varies"
    if not vectors:
        return "n/a", None, "one element along x"
    v = vectors[0]
    fixed = dict(kernel.fixed_sizes)
    try:
        extents = [E.evaluate(d, fixed) for d in shape]
        stride: int | None = 0
        for d, dv in enumerate(v):
            scale = 1
            for e in extents[d + 1:]:
                scale *= e
            stride = (stride or 0) + dv * scale
    except (KeyError, ValueError, TypeError):
        stride = None
    if all(x == 0 for x in v):
        return "broadcast", 0, "one address per warp"
    if all(x == 0 for x in v[:-1]) and v[-1] == 1:
        return "coalesced", 1, "consecutive lanes, consecutive elements"
    if stride == 1:
        return "coalesced", 1, "consecutive lanes, consecutive elements"
    return "strided", stride, f"index step {list(v)} between lanes"
