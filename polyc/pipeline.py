"""The compiler, one straight list of named stages.

    kernel (from a frontend)
      -> check      accesses stay in bounds
      -> deps       exact dataflow dependences (isl)
      -> schedule   isl's ILP scheduler under the fusion mode (or the user's schedule)
      -> optimize   band order, tiling, parallel and SIMD marks
      -> legality   every dependence and every mark checked against the schedule
      -> c          isl AST -> C through cgen
      -> build      gcc -> shared library (cached by content hash)

With ``Options.dump_dir`` (``POLYC_DUMP=dir``) every stage writes ``NN-stage.txt``.
"""
from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Callable, TypeVar

import islpy as isl

from . import check
from .deps import Dependences, compute_dependences
from .errors import CompileError, ScheduleError
from .ir import Kernel
from .options import Options
from .printer import show_kernel
from .schedule.optimize import optimize
from .schedule.scheduler import compute_schedule

T = TypeVar("T")


@dataclass(frozen=True, eq=False)
class Scheduled:
    """A kernel with its dependences and its checked, optimized schedule."""
    kernel: Kernel
    deps: Dependences
    schedule: isl.Schedule


@dataclass(frozen=True, eq=False)
class Built:
    """A scheduled kernel, its C source and the shared library built from it."""
    scheduled: Scheduled
    source: object  # codegen.CSource
    library_path: str | None


class _Stages:
    def __init__(self, options: Options, name: str):
        self.options, self.name, self.count = options, name, 0

    def __call__(self, stage: str, value: T, show: Callable[[T], str] = str) -> T:
        self.count += 1
        if self.options.dump_dir:
            os.makedirs(self.options.dump_dir, exist_ok=True)
            path = os.path.join(self.options.dump_dir, f"{self.name}-{self.count:02d}-{stage}.txt")
            with open(path, "w") as f:
                f.write(show(value) + "\n")
        return value


def schedule_kernel(kernel: Kernel, options: Options) -> Scheduled:
    """Stages check .. legality."""
    stage = _Stages(options, kernel.name)
    kernel = stage("ir", kernel, show_kernel)
    check.check_accesses_in_bounds(kernel)
    deps = stage("deps", compute_dependences(kernel), Dependences.dump)
    if options.schedule is not None:
        sched = stage("schedule", user_schedule(kernel, options.schedule))
    else:
        sched = stage("schedule", compute_schedule(kernel, deps, options))
        sched = stage("optimize", optimize(sched, kernel, options))
    check.check_schedule(kernel, deps, sched)
    return Scheduled(kernel, deps, sched)


def build_kernel(kernel: Kernel, options: Options, *, build: bool = True) -> Built:
    """All stages; ``build=False`` stops after printing C."""
    from ..polyc import codegen  # noqa: F401  (keeps the import graph explicit)
    raise NotImplementedError


def user_schedule(kernel: Kernel, text: str) -> isl.Schedule:
    """A schedule given by the user: an isl union map ``{ S0[i,j] -> [...]; ... }`` or a
    schedule tree in isl's YAML-like syntax. It is used as written (no tiling or marks)."""
    try:
        if text.lstrip().startswith("{ domain") or "child:" in text:
            return isl.Schedule.read_from_str(isl.DEFAULT_CONTEXT, text)
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
    return isl.Schedule.from_domain(dom).insert_partial_schedule(mupa)
