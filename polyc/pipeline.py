"""The compiler, one straight list of named stages.

    kernel (from a frontend)
      -> prepare    float16 sums widened, dead writes removed (unless the user schedules)
      -> check      accesses stay in bounds
      -> deps       exact dataflow dependences (isl)
      -> schedule   isl's ILP scheduler under the fusion mode (or the user's schedule)
      -> align      nests whose dependences keep loops aligned fused along them
                    (C target; checked against the dependences at once)
      -> fuse       nests that read the same large arrays fused into one outer loop
                    (C target; checked likewise)
      -> optimize   band order, tiling, parallel and SIMD marks, register tiles
      -> legality   every dependence and every mark checked against the schedule
      -> storage    folded temporaries, temporaries sharing storage (checked again)
      -> c          isl AST -> C through cgen
      -> build      gcc -> shared library (cached by content hash)

With ``Options.target == "cuda"`` the stages after legality are instead: gpu_map
(kernels, blocks/threads, shared memory: ``polyc.schedule.gpu_map``) -> cuda (the ``.cu``:
``codegen/cuda.py``) -> build (nvcc, or g++ with ``cuda_emu.h`` when ``emulate``).

With ``Options.dump_dir`` (``POLYC_DUMP=dir``) every stage writes ``NN-stage.txt``.
"""
from __future__ import annotations

import os
import warnings
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

import islpy as isl

from . import check
from .codegen import CompiledFunction, CSource, bind_sizes, build_shared, generate_c
from .codegen.runtime import check_inputs
from .codegen.toolchain import file_stem
from .dead import drop_dead_writes
from .deps import Dependences, compute_dependences
from .errors import CompileError, InternalError, PolycWarning, ScheduleError
from .ir import Kernel
from .options import Options
from .pack import hoist_row_factors, pack_operands
from .printer import show_kernel
from .widen import widen_accumulators
from .schedule.align import fuse_aligned
from .schedule.fuse import fuse_streams
from .schedule.optimize import optimize
from .share import share_storage
from .schedule.scheduler import compute_schedule

T = TypeVar("T")

__all__ = ["Compiled", "Scheduled", "bind_sizes", "check_inputs", "compile_kernel", "schedule_kernel"]


@dataclass(frozen=True, eq=False)
class Scheduled:
    """A kernel with its dependences and its checked, optimized schedule."""
    kernel: Kernel
    deps: Dependences
    schedule: isl.Schedule


@dataclass(frozen=True, eq=False)
class Compiled:
    """The result of every stage: C source, header, and (when built) the loaded function."""
    scheduled: Scheduled
    source: CSource
    function: CompiledFunction | None
    #: the CUDA kernels (target "cuda"), each with its block/thread mapping
    gpu_kernels: tuple[Any, ...] = ()
    options: Options | None = None

    @property
    def schedule(self) -> isl.Schedule:
        return self.scheduled.schedule

    @property
    def c_source(self) -> str:
        return self.source.text

    @property
    def cuda_source(self) -> str:
        """The ``.cu`` text (target ``"cuda"``)."""
        if self.options is None or self.options.target != "cuda":
            raise CompileError("this kernel was compiled for the C target (target='cuda' "
                               "gives CUDA)")
        return self.source.text

    @property
    def gpu_report(self) -> Any:
        """The static GPU report (:mod:`polyc.codegen.gpu_report`) of the CUDA kernels."""
        if self.options is None or self.options.target != "cuda":
            raise CompileError("this kernel was compiled for the C target: no GPU report")
        from .codegen.gpu_report import report
        return report(self)

    @property
    def header(self) -> str:
        return self.source.header

    @property
    def library_path(self) -> str:
        if self.function is None:
            raise InternalError("this kernel was generated but not built")
        return self.function.path

    @property
    def ir_text(self) -> str:
        return show_kernel(self.scheduled.kernel)

    @property
    def deps_text(self) -> str:
        return self.scheduled.deps.dump()

    def run(self, inputs: Sequence[Any], sizes: dict[str, int] | None = None,
            signature: tuple | None = None) -> tuple[Any, ...]:
        if self.function is None:
            raise InternalError("this kernel was generated but not built")
        return self.function(inputs, sizes, signature=signature)


class _Stages:
    def __init__(self, options: Options, name: str):
        self.options, self.name, self.count = options, name, 0

    def __call__(self, stage: str, value: T, show: Callable[[T], str] = str) -> T:
        self.count += 1
        if self.options.dump_dir:
            os.makedirs(self.options.dump_dir, exist_ok=True)
            path = os.path.join(self.options.dump_dir,
                                f"{file_stem(self.name)}-{self.count:02d}-{stage}.txt")
            with open(path, "w") as f:
                f.write(show(value) + "\n")
        return value


def fold_storage_hints(kernel: Kernel, schedule: isl.Schedule) -> tuple[Kernel, Any]:
    """``kernel`` with its temporaries folded as its ``folds`` ask
    (:func:`polyc.rewrite.fold_storage`: a recurrence's state kept for its last steps),
    when ``schedule`` -- computed for the unfolded kernel -- respects the dependences of
    the folded one (the slots' reuse adds anti and output dependences: checked here,
    which costs a fraction of scheduling); else ``kernel`` as it is, its full storage.
    Returns the kernel and the folded kernel's dependences (None when not folded)."""
    if not kernel.folds:
        return kernel, None
    from dataclasses import replace as _replace
    from .rewrite import fold_storage
    folded = _replace(kernel, folds=())
    try:
        for array, slots in kernel.folds:
            folded = fold_storage(folded, array, slots)
        deps = compute_dependences(folded)
        check.check_schedule(folded, deps, schedule)
    except ScheduleError:  # full storage: an exit's later steps would matter then
        return _replace(kernel, folds=(), exits=()), None
    return folded, deps


def schedule_kernel(kernel: Kernel, options: Options, stage: _Stages | None = None) -> Scheduled:
    """Stages check .. legality."""
    stage = stage or _Stages(options, kernel.name)
    if options.schedule is None:  # a user's schedule names the statements as they are
        kernel = prepare_kernel(kernel, options)
    kernel = stage("ir", kernel, show_kernel)
    check.check_accesses_in_bounds(kernel)
    deps = stage("deps", compute_dependences(kernel), Dependences.dump)
    if options.schedule is not None:
        rewritten, sched = user_schedule(kernel, options.schedule)
        if rewritten is not kernel:  # the workbench's statement and array rewrites
            kernel = stage("rewritten", rewritten, show_kernel)
            deps = stage("deps", compute_dependences(kernel), Dependences.dump)
        sched = stage("schedule", sched)
        check.check_schedule(kernel, deps, sched)
        return Scheduled(kernel, deps, sched)
    plain = stage("schedule", compute_schedule(kernel, deps, options))
    if options.target == "cuda":  # tiled and mapped by polyc.schedule.gpu_map instead
        check.check_schedule(kernel, deps, plain)
        return _folded(Scheduled(kernel, deps, plain))
    plain = stage("align", _fused(fuse_aligned, plain, kernel, deps, options))
    plain = stage("fuse", _fused(fuse_streams, plain, kernel, deps, options))
    sched = stage("optimize", optimize(plain, kernel, options))
    try:
        check.check_schedule(kernel, deps, sched)
    except ScheduleError as e:
        # a bug in our band edits: keep the user's code correct, say so loudly
        warnings.warn(PolycWarning(f"{kernel.name}: the optimized schedule was refused ({e}); "
                                   "falling back to isl's schedule. Please report this."),
                      stacklevel=3)
        sched = plain
        try:
            check.check_schedule(kernel, deps, sched)
        except ScheduleError as e2:
            raise InternalError(f"{kernel.name}: isl's schedule is illegal: {e2}") from e2
    return _folded(Scheduled(kernel, deps, sched))


def _fused(fuse: Callable[..., isl.Schedule], plain: isl.Schedule, kernel: Kernel,
           deps: Dependences, options: Options) -> isl.Schedule:
    """``plain`` with nests fused by ``fuse`` (the nests that stream the same large
    arrays, :mod:`polyc.schedule.fuse`; those aligned by their dependences,
    :mod:`polyc.schedule.align`), when that is legal; else ``plain``."""
    fused = fuse(plain, kernel, deps, options)
    if fused is plain:
        return plain
    try:
        check.check_schedule(kernel, deps, fused)
    except ScheduleError as e:
        warnings.warn(PolycWarning(f"{kernel.name}: the fused schedule was refused ({e}); "
                                   "keeping isl's. Please report this."), stacklevel=3)
        return plain
    return fused


def prepare_kernel(kernel: Kernel, options: Options | None = None) -> Kernel:
    """The rewrites made before scheduling, unless the user gives the schedule: float16
    sums accumulate in float32 (:mod:`polyc.widen`), dead writes go (:mod:`polyc.dead`),
    and with ``options``, the row factors of large contractions are computed apart and
    their large operands packed (:mod:`polyc.pack`).
    Applying it to its own result changes nothing."""
    kernel = drop_dead_writes(widen_accumulators(kernel))
    return kernel if options is None else pack_operands(hoist_row_factors(kernel, options),
                                                        options)


def storage_rewrites(kernel: Kernel, schedule: isl.Schedule
                     ) -> tuple[Kernel, Any, isl.Schedule]:
    """The rewrites of a kernel's storage once ``schedule`` is known: its folds
    (:func:`fold_storage_hints`), then temporaries sharing storage
    (:func:`polyc.share.share_storage`). Returns the kernel, its dependences when they
    changed (else None) and its schedule (less the copies sharing made repeats)."""
    kernel, deps = fold_storage_hints(kernel, schedule)
    shared, shared_deps, schedule = share_storage(kernel, schedule)
    return (shared, shared_deps, schedule) if shared_deps is not None \
        else (kernel, deps, schedule)


def _folded(scheduled: Scheduled) -> Scheduled:
    kernel, deps, schedule = storage_rewrites(scheduled.kernel, scheduled.schedule)
    return Scheduled(kernel, scheduled.deps if deps is None else deps, schedule)


#: lines of C past which a tiled kernel is compiled untiled: isl's AST of parametric tiles
#: over many fused statements can reach tens of thousands of lines (fuzz seed 9152: 9,195
#: lines that gcc -O3 took minutes on); real operators stay far below
MAX_TILED_C_LINES = 4000


def compile_kernel(kernel: Kernel, options: Options, *, build: bool = True,
                   progress: bool = False) -> Compiled:
    """Every stage; ``build=False`` stops after printing C. With ``options.tune``, a
    kernel with fixed sizes is first tuned (:mod:`polyc.tune`; ``progress``: its bar)."""
    if options.target == "cuda":
        return _compile_cuda(kernel, options, build)
    if options.tune:
        from .tune import tuned_options
        options = tuned_options(kernel, options, progress=progress)
    stage = _Stages(options, kernel.name)
    scheduled = schedule_kernel(kernel, options, stage)
    source = stage("c", generate_c(scheduled.kernel, scheduled.schedule, options),
                   lambda c: c.text)
    lines = source.text.count("\n")
    if options.tile is not False and lines > MAX_TILED_C_LINES:
        warnings.warn(PolycWarning(
            f"{kernel.name}: tiling gave {lines} lines of C (more than {MAX_TILED_C_LINES}: "
            "parametric tiles of many fused statements); compiled untiled instead"),
            stacklevel=2)
        return compile_kernel(kernel, options.replace(tile=False), build=build,
                              progress=progress)
    if not build:
        return Compiled(scheduled, source, None)
    path = stage("build", build_shared(source, options))
    return Compiled(scheduled, source, CompiledFunction(scheduled.kernel, path,
                                                        source.function_name, source))


def _compile_cuda(kernel: Kernel, options: Options, build: bool) -> Compiled:
    """Stages check .. legality, then the GPU mapping, the ``.cu`` and nvcc (or g++ with
    the CPU emulation header when ``options.emulate``)."""
    from .codegen.cuda import generate_cuda
    from .codegen.cuda_runtime import CudaFunction
    from .codegen.nvcc import build_cuda
    from .schedule.gpu_map import map_to_gpu
    stage = _Stages(options, kernel.name)
    scheduled = schedule_kernel(kernel, options, stage)
    gpu = tuple(map_to_gpu(scheduled.kernel, scheduled.deps, scheduled.schedule, options))
    source = stage("cuda", generate_cuda(scheduled.kernel, list(gpu), options), lambda c: c.text)
    if not build:
        return Compiled(scheduled, source, None, gpu, options)
    path = stage("build", build_cuda(source.text, source.function_name, options))
    fn = CudaFunction(scheduled.kernel, path, source.function_name, source, options.emulate)
    return Compiled(scheduled, source, fn, gpu, options)


def user_schedule(kernel: Kernel, text: str) -> tuple[Kernel, isl.Schedule]:
    """A schedule given by the user: an isl union map ``{ S0[i,j] -> [...]; ... }``, a
    schedule tree in isl's YAML-like syntax, or a saved polyc schedule (the steps of a
    :class:`polyc.schedule.space.ScheduleSpace`, replayed on ``kernel``). It is used as
    written (no tiling or marks added). Returns the kernel it schedules: ``kernel``, or
    the kernel a saved schedule's rewrites (``cache_read``, ``rfactor``...) made of it."""
    if text.lstrip().startswith("{") and '"format"' in text and '"steps"' in text:
        from .schedule.space import ScheduleSpace, ScheduleTrace
        space = ScheduleSpace.default(kernel).replay(ScheduleTrace.from_json(text))
        return space.kernel, space.tree()
    try:
        if text.lstrip().startswith("{ domain") or "child:" in text:
            return kernel, isl.Schedule.read_from_str(isl.DEFAULT_CONTEXT, text)
        umap = isl.UnionMap.read_from_str(isl.DEFAULT_CONTEXT, text)
    except isl.Error as e:
        raise ScheduleError(f"cannot read the schedule {text!r}: {e}") from None
    dom = kernel.domain()
    umap = umap.intersect_domain(dom)
    if not umap.domain().is_equal(dom):
        raise ScheduleError(f"the schedule does not cover every statement instance: "
                            f"missing {dom.subtract(umap.domain())}")
    try:
        mupa = isl.MultiUnionPwAff.from_union_map(umap)
    except isl.Error as e:
        raise CompileError(f"the schedule must map every statement to time vectors of one "
                           f"length: {e}") from None
    return kernel, isl.Schedule.from_domain(dom).insert_partial_schedule(mupa)
