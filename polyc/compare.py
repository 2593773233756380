"""Compare schedules of one operator side by side: ``polyc.compare``.

    table = polyc.compare(op, {"default": None, "skewed": s}, sizes={"T": 50, "N": 4000})
    print(table)          # time (median), GFLOP/s, speed-up over the first, correctness

Every variant (``None``: polyc's own schedule; a :class:`ScheduleSpace` or a saved
:class:`ScheduleTrace`; :class:`Options` or a dict of option changes such as
``{"scheduler": "pluto", "tile": False}``) is compiled first, then run on the same
random inputs: its outputs are compared with the first variant's (``allclose``), and the variants are
timed in interleaved rounds (``repeat`` of them; the median is reported), arrays a C
region updates in place restored before each run, outside the timed call. Flops are
counted exactly with isl (instances of each statement times its arithmetic operations).
"""
from __future__ import annotations

import math
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import islpy as isl
import numpy as np

from . import expr as E
from .errors import CallError
from .ir import Kernel


@dataclass(frozen=True)
class Row:
    name: str
    seconds: float
    gflops: float
    speedup: float
    correct: bool
    error: str = ""


@dataclass(frozen=True)
class Comparison:
    """The result of :func:`compare`: one :class:`Row` per variant, in the given order."""
    operator: str
    sizes: tuple[tuple[str, int], ...]
    flops: int
    rows: tuple[Row, ...]

    def __str__(self) -> str:
        sizes = ", ".join(f"{k}={v}" for k, v in self.sizes)
        lines = [f"{self.operator} ({sizes}): {self.flops:,} flops",
                 f"{'schedule':<16} {'time (ms)':>12} {'GFLOP/s':>9} {'speed-up':>9}  check"]
        for r in self.rows:
            check = "ok" if r.correct else f"WRONG {r.error}".strip()
            lines.append(f"{r.name:<16} {r.seconds * 1e3:12.3f} {r.gflops:9.2f} "
                         f"{r.speedup:9.2f}  {check}")
        return "\n".join(lines)


def flop_count(kernel: Kernel, sizes: Mapping[str, int]) -> int:
    """Arithmetic operations of one call: per statement, its instances (counted by isl
    for these sizes) times the operations of its value (plus one for a reduction)."""
    total = 0
    for s in kernel.statements:
        dom = s.domain
        for i in reversed(range(dom.dim(isl.dim_type.param))):
            name = dom.get_dim_name(isl.dim_type.param, i)
            dom = dom.fix_val(isl.dim_type.param, i,
                              isl.Val.int_from_si(dom.get_ctx(), int(sizes[name])))
            dom = dom.project_out(isl.dim_type.param, i, 1)
        ops = _operations(s.value) + (1 if s.is_reduction else 0)
        total += int(dom.count_val().to_python()) * ops
    return total


def _operations(e: E.Expr) -> int:
    if isinstance(e, E.Binary):
        own = 1 if e.op in ("+", "-", "*", "/", "%") else 0
        return own + _operations(e.a) + _operations(e.b)
    if isinstance(e, E.Unary):
        return (1 if e.op == "-" else 0) + _operations(e.x)
    if isinstance(e, E.Call):
        return 1 + sum(_operations(a) for a in e.args)
    if isinstance(e, E.Select):
        return _operations(e.cond) + _operations(e.a) + _operations(e.b)
    if isinstance(e, E.Cast):
        return _operations(e.x)
    return 0


def compare(op: Any, variants: Mapping[str, Any], sizes: Mapping[str, int] | None = None,
            repeat: int = 9, inputs: Mapping[str, Any] | None = None,
            seed: int = 0, rtol: float = 1e-4, atol: float = 1e-5) -> Comparison:
    """Time ``variants`` of ``op`` side by side (see the module doc). ``sizes`` gives
    every size (C input: the ``int`` parameters); ``inputs`` may give some arrays
    (and, for C input, scalars) by name, the rest are random."""
    if not variants:
        raise CallError("compare needs at least one variant")
    kernel: Kernel = op.kernel
    sizes = dict(sizes or {})
    missing = [s for s in kernel.sizes if s not in sizes]
    if missing:
        raise CallError(f"compare: give the sizes {missing} of {kernel.name}")
    data = _inputs(op, sizes, dict(inputs or {}), np.random.default_rng(seed))
    compiled = {name: _variant(op, v) for name, v in variants.items()}
    runners = {name: _runner(c, sizes, data) for name, c in compiled.items()}
    results = {}
    for name, (prepare, run) in runners.items():
        prepare()
        results[name] = run()
    first = next(iter(results.values()))
    checks: dict[str, tuple[bool, str]] = {}
    for name, out in results.items():
        ok, why = True, ""
        for a, b in zip(out, first):
            if not np.allclose(a, b, rtol=rtol, atol=atol, equal_nan=True):
                ok, why = False, f"(max difference {np.nanmax(np.abs(a - b)):.3g})"
                break
        checks[name] = (ok, why)
    times: dict[str, list[float]] = {name: [] for name in runners}
    for _ in range(max(1, repeat)):
        for name, (prepare, run) in runners.items():
            prepare()
            t0 = time.perf_counter()
            run()
            times[name].append(time.perf_counter() - t0)
    flops = flop_count(kernel, sizes)
    medians = {name: float(np.median(ts)) for name, ts in times.items()}
    base = next(iter(medians.values()))
    rows = tuple(Row(name, medians[name], flops / medians[name] / 1e9 if medians[name] else
                     math.inf, base / medians[name] if medians[name] else math.inf,
                     *checks[name]) for name in runners)
    return Comparison(kernel.name, tuple(sorted(sizes.items())), flops, rows)


def _variant(op: Any, v: Any) -> Any:
    """The operator of one variant: ``None`` (``op`` itself), a schedule (space or
    trace), :class:`Options`, or a dict of option changes (``{"scheduler": "pluto"}``)."""
    from .options import Options
    if v is None:
        return op
    if isinstance(v, dict):
        return op._with_options(op.options.replace(**v))
    if isinstance(v, Options):
        return op._with_options(v)
    return op.with_schedule(v)


def _inputs(op: Any, sizes: dict[str, int], given: dict[str, Any],
            rng: np.random.Generator) -> dict[str, Any]:
    """Every array the operator takes (and C scalars), random unless given."""
    from .codegen.runtime import NUMPY_DTYPES
    kernel: Kernel = op.kernel
    out: dict[str, Any] = {}
    names = list(kernel.inputs) + (list(kernel.outputs) if hasattr(op, "scop") else [])
    for name in names:
        arr = kernel.array(name)
        if name in given:
            out[name] = given[name]
            continue
        shape = tuple(E.evaluate(d, sizes) for d in arr.shape)
        dtype = NUMPY_DTYPES[arr.dtype]
        if arr.rank == 0 and hasattr(op, "scop"):
            out[name] = float(rng.uniform(0.5, 1.5))
        elif dtype.kind == "f":
            out[name] = rng.uniform(-1, 1, shape).astype(dtype)
        elif dtype.kind == "b":
            out[name] = rng.random(shape) < 0.5
        else:
            out[name] = rng.integers(0, 8, shape).astype(dtype)
    return out


def _runner(op: Any, sizes: dict[str, int], data: dict[str, Any]
            ) -> tuple[Callable[[], Any], Callable[[], list[np.ndarray]]]:
    """``(prepare, run)``: ``prepare`` restores arrays a C region updates in place;
    ``run`` calls the operator and returns its outputs (copies)."""
    kernel: Kernel = op.kernel
    if hasattr(op, "scop"):  # a C region: called like the C function, outputs in place
        own = {k: (v.copy() if isinstance(v, np.ndarray) else v) for k, v in data.items()}
        written = set(kernel.outputs)

        def prepare() -> None:
            for k in written:
                np.copyto(own[k], data[k])

        def run_scop() -> list[np.ndarray]:
            out = op(**sizes, **{k: own[k] for k in data})
            outs = out if isinstance(out, tuple) else (out,)
            return [np.array(o) for o in outs]
        return prepare, run_scop
    arrays = [data[n] for n in kernel.inputs]
    fn = op.compiled_for(sizes).function

    def run_tc() -> list[np.ndarray]:
        return list(fn(arrays, sizes))
    return (lambda: None), run_tc
