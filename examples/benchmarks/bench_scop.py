"""Benchmark: C loop nests (``#pragma scop``) through polyc against gcc on the same C.

    python3 examples/benchmarks/bench_scop.py [--repeat 5] [--size small|large]
                                              [--kernels jacobi-1d,seidel-2d,...] [--quick]
                                              [--compile-timeout 60]

``--quick`` is ``--size small --repeat 1`` (a smoke test). Each kernel is a C function
written in the Pluto/PolyBench style -- stencils (jacobi-1d in float, jacobi-2d, heat-3d,
seidel-2d in place) and linear algebra (gemm, atax, bicg, mvt), double unless said --
whose ``#pragma scop`` region polyc reads with :func:`polyc.scop`. In one process, per
kernel:

* **gcc**: the very same C function compiled by ``gcc -O3 -march=native`` into a shared
  library and called through ctypes with pointers to the numpy arrays (1 thread);
* **isl 1t / 2t**: ``polyc.scop(src, function=..., threads=1)`` and ``threads=2``,
  polyc's own schedule (isl's scheduler, tiling, register tiles, OpenMP);
* **untiled 1t**: the same with ``tile=False``;
* **rect 1t / 2t** and **diamond 1t / 2t**: polyc's Pluto-style scheduler
  (``scheduler="pluto"``) with rectangular tiles (``diamond=False``) and with diamond
  tiles (concurrent start); a tiled band without a parallel loop runs its tiles as a
  wavefront;
* **hand 1t / 2t** (stencils): one hand schedule from the workbench
  (``op.schedule_space()``), compiled with ``threads=1`` and ``threads=2``: the spatial
  loops skewed by the time loop (after shifting and fusing the two statements of a
  Jacobi time step), the band tiled, each statement given its own vectorized innermost
  loop inside a tile, and the tiles run as a wavefront whose inner tile loop is
  parallel (see ``tiled_*`` below).

The versions are timed alternately (medians over ``--repeat`` runs, the arrays a kernel
writes restored from a saved copy before each run, outside the timed region). Every
polyc version is checked against gcc's output (``allclose``) and the table gives, per
kernel, gcc's time and each polyc version's speed-up over it (gcc time / polyc time,
above 1: polyc is faster),
with ``ok`` or ``FAIL`` beside it, and polyc's compile time (all versions; gcc's part
of it may come from polyc's library cache, filled by an earlier run); then the
geometric mean per column. A version polyc cannot build shows ``error`` (the error is
printed under the table, with polyc's warnings), one whose automatic schedule takes
longer than ``--compile-timeout`` seconds to compile (tried in a forked child) shows
``timeout``; ``-``: no hand schedule (the linear-algebra kernels).
"""
from __future__ import annotations

import argparse
import ctypes
import os
import subprocess
import sys
import tempfile
import time
import warnings
from collections.abc import Callable
from dataclasses import dataclass, field

# polyc's runtime sets this itself before loading the first OpenMP library; set here too
# so that it also holds if something else pulls libgomp in first
os.environ.setdefault("OMP_PROC_BIND", "close")

import numpy as np  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from bench_polybench import _median, _seconds  # noqa: E402
from scop_kernels import (  # noqa: E402
    ATAX,
    BICG,
    GEMM,
    HEAT_3D,
    JACOBI_1D,
    JACOBI_2D,
    MVT,
    SEIDEL_2D,
)

import polyc  # noqa: E402
from polyc import expr as E  # noqa: E402
from polyc.api import ScopOperator  # noqa: E402
from polyc.codegen.runtime import NUMPY_DTYPES  # noqa: E402
from polyc.schedule.scheduler import time_limited  # noqa: E402


# -- hand schedules (the workbench) --------------------------------------------------------
# Each takes the default (source-order) schedule space and returns the tiled one. The
# Jacobi-style stencils: the second statement of a time step shifted by one point and
# fused with the first, the spatial loops skewed by 2t, the band tiled; then
# ``fuse(k + 1, ...)`` on the k tile loops and t gives each statement its own innermost
# loop nest inside the tile (no guards in the inner loop, which is then vectorizable:
# fused point by point, the second statement reads what the first wrote one iteration
# before). A time-tiled band carries dependences on every loop, so none of its loops is
# parallel as it stands: skewing the outer tile loop into the next one and interchanging
# them runs the tiles as a wavefront, whose inner tile loop the workbench accepts as
# parallel (the tiles of one wavefront depend on none of each other).


def _wavefront(s: polyc.ScheduleSpace, outer: str, inner: str) -> polyc.ScheduleSpace:
    """Tiles of the loops ``outer``, ``inner`` (of S0's nest) as a wavefront: ``inner``
    := ``inner + outer``, the two swapped, ``outer`` (now inside) parallel."""
    return (s.skew("S0", outer, inner, 1).interchange("S0", outer, inner)
            .parallel("S0", outer))


def tiled_jacobi_1d(s: polyc.ScheduleSpace) -> polyc.ScheduleSpace:
    """(t, i) tiled (32 x 2048) after the shift, fusion and skew; wavefront over the
    (t, i) tiles; each statement's i loop vectorized."""
    s = (s.shift("S1", "i", 1).fuse(2, "S0", "S1").skew("S0", "t", "i", 2)
         .tile("S0", ("t", "i"), (32, 2048)).fuse(3, "S0", "S1"))
    return _wavefront(s, "t_tile", "i_tile").vectorize("S0", "i").vectorize("S1", "i")


def tiled_jacobi_2d(s: polyc.ScheduleSpace) -> polyc.ScheduleSpace:
    """As jacobi-1d in two dimensions: (t, i, j) tiled (8 x 32 x 256) after skewing i
    and j by 2t; wavefront over the (t, i) tiles."""
    s = (s.shift("S1", "i", 1).shift("S1", "j", 1).fuse(3, "S0", "S1")
         .skew("S0", "t", "i", 2).skew("S0", "t", "j", 2)
         .tile("S0", ("t", "i", "j"), (8, 32, 256)).fuse(4, "S0", "S1"))
    return _wavefront(s, "t_tile", "i_tile").vectorize("S0", "j").vectorize("S1", "j")


def tiled_heat_3d(s: polyc.ScheduleSpace) -> polyc.ScheduleSpace:
    """(t, i, j) tiled (4 x 16 x 16) after skewing i, j, k by 2t (k stays whole,
    innermost); wavefront over the (t, i) tiles."""
    s = (s.shift("S1", "i", 1).shift("S1", "j", 1).shift("S1", "k", 1)
         .fuse(4, "S0", "S1")
         .skew("S0", "t", "i", 2).skew("S0", "t", "j", 2).skew("S0", "t", "k", 2)
         .tile("S0", ("t", "i", "j"), (4, 16, 16)).fuse(4, "S0", "S1"))
    return _wavefront(s, "t_tile", "i_tile").vectorize("S0", "k").vectorize("S1", "k")


def tiled_seidel_2d(s: polyc.ScheduleSpace) -> polyc.ScheduleSpace:
    """Pluto's skew (i += t, j += t + i), (t, i, j) tiled (4 x 32 x 64); the time steps
    are few, so the wavefront is over the (i, j) tiles. The inner loop reads what the
    previous iteration wrote (A[i][j - 1]): nothing to vectorize."""
    s = (s.skew("S0", "t", "i", 1).skew("S0", "t", "j", 1).skew("S0", "i", "j", 1)
         .tile("S0", ("t", "i", "j"), (4, 32, 64)))
    return _wavefront(s, "i_tile", "j_tile")


# -- the benchmark table -------------------------------------------------------------------


@dataclass(frozen=True)
class Kernel:
    name: str
    function: str
    source: str
    #: sizes (the C function's int parameters) per --size
    sizes: dict[str, dict[str, int]]
    #: float/double scalar parameters
    scalars: dict[str, float] = field(default_factory=dict)
    #: the hand schedule, or None (the linear-algebra kernels: polyc's own only)
    tiled: Callable[[polyc.ScheduleSpace], polyc.ScheduleSpace] | None = None


KERNELS = [
    Kernel("jacobi-1d", "jacobi_1d", JACOBI_1D,
           {"large": dict(T=300, N=400000), "small": dict(T=10, N=1000)},
           tiled=tiled_jacobi_1d),
    Kernel("jacobi-2d", "jacobi_2d", JACOBI_2D,
           {"large": dict(T=50, N=1000), "small": dict(T=5, N=40)}, tiled=tiled_jacobi_2d),
    Kernel("heat-3d", "heat_3d", HEAT_3D,
           {"large": dict(T=30, N=100), "small": dict(T=4, N=12)}, tiled=tiled_heat_3d),
    Kernel("seidel-2d", "seidel_2d", SEIDEL_2D,
           {"large": dict(T=10, N=1000), "small": dict(T=3, N=30)}, tiled=tiled_seidel_2d),
    Kernel("gemm", "gemm", GEMM,
           {"large": dict(NI=800, NJ=900, NK=1000), "small": dict(NI=40, NJ=50, NK=60)},
           scalars=dict(alpha=1.5, beta=1.2)),
    Kernel("atax", "atax", ATAX,
           {"large": dict(M=3800, N=4200), "small": dict(M=60, N=70)}),
    Kernel("bicg", "bicg", BICG,
           {"large": dict(M=3800, N=4200), "small": dict(M=60, N=70)}),
    Kernel("mvt", "mvt", MVT, {"large": dict(N=4000), "small": dict(N=60)}),
]

#: polyc's automatic versions: column -> (threads, options): isl's scheduler (tiled, and
#: untiled), the Pluto-style one with rectangular tiles and with diamond tiles
AUTOMATIC = {"isl 1t": (1, {}), "isl 2t": (2, {}), "untiled 1t": (1, {"tile": False}),
             "rect 1t": (1, {"scheduler": "pluto", "diamond": False}),
             "rect 2t": (2, {"scheduler": "pluto", "diamond": False}),
             "diamond 1t": (1, {"scheduler": "pluto"}),
             "diamond 2t": (2, {"scheduler": "pluto"})}
#: column headings of the polyc versions, in table order (hand: the workbench schedule)
VARIANTS = (*AUTOMATIC, "hand 1t", "hand 2t")
#: allclose tolerances against gcc, per element type
TOLERANCES = {np.dtype(np.float32): dict(rtol=1e-4, atol=1e-5),
              np.dtype(np.float64): dict(rtol=1e-9, atol=1e-12)}


def cpu_model() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return "unknown CPU"


def build_gcc(k: Kernel, op: ScopOperator, workdir: str) -> Callable[..., None]:
    """The kernel's C function compiled by gcc -O3 -march=native, typed from its
    signature (ints, doubles/floats, arrays as pointers)."""
    src = os.path.join(workdir, f"{k.function}.c")
    lib = os.path.join(workdir, f"{k.function}.so")
    with open(src, "w") as f:
        f.write(k.source)
    subprocess.run([os.environ.get("CC", "gcc"), "-O3", "-march=native", "-shared", "-fPIC",
                    "-o", lib, src, "-lm"], check=True)
    fn = getattr(ctypes.CDLL(lib), k.function)
    kinds = {"size": ctypes.c_int, "array": ctypes.c_void_p}
    scalars = {"float32": ctypes.c_float, "float64": ctypes.c_double}
    fn.argtypes = [kinds.get(p.kind) or scalars[p.dtype] for p in op.scop.params]
    fn.restype = None
    return fn


def make_arrays(op: ScopOperator, sizes: dict[str, int],
                rng: np.random.Generator) -> dict[str, np.ndarray]:
    """Random arrays in [0, 1) of each array parameter's dtype and shape."""
    out = {}
    for p in op.scop.params:
        if p.kind == "array":
            arr = op.kernel.array(p.name)
            shape = tuple(E.evaluate(d, sizes) for d in arr.shape)
            out[p.name] = rng.random(shape).astype(NUMPY_DTYPES[arr.dtype])
    return out


def compiles_in_time(op: polyc.Operator, sizes: dict[str, int],
                     seconds: float) -> tuple[str | None, float]:
    """(None if ``op`` compiles for ``sizes`` within ``seconds``, else why not: "timeout"
    or the error; the seconds it took). Tried in a forked child (polyc's
    :func:`~polyc.schedule.scheduler.time_limited`), as isl's scheduler cannot be
    interrupted; the parent compiles again at its first call (gcc's part then comes from
    polyc's cache)."""
    start = time.perf_counter()
    if seconds <= 0 or not hasattr(os, "fork"):
        return None, 0.0

    def compile_quietly() -> str:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            op.compiled_for(sizes)
        return "ok"
    try:  # a child that fails is run again here, which raises its error
        done = time_limited(compile_quietly, seconds)
    except Exception as err:  # noqa: BLE001 -- any failure is reported in the table
        return f"{type(err).__name__}: {err}", time.perf_counter() - start
    return (None if done is not None else "timeout"), time.perf_counter() - start


def _short(text: str, n: int = 400) -> str:
    text = " ".join(text.split())
    return text if len(text) <= n else text[:n] + " ..."


class Version:
    """One way to run the kernel: its own copies of the arrays the kernel writes
    (restored from ``original`` before each run), the read-only ones shared."""

    def __init__(self, run: Callable[[dict[str, np.ndarray]], object],
                 original: dict[str, np.ndarray], written: tuple[str, ...]):
        self.original, self.written = original, written
        self.arrays = {n: (a.copy() if n in written else a) for n, a in original.items()}
        self.call = lambda: run(self.arrays)
        self.times: list[float] = []

    def restore(self) -> None:
        for n in self.written:
            np.copyto(self.arrays[n], self.original[n])

    def timed(self) -> None:
        self.restore()
        self.times.append(_seconds(self.call))

    def agrees(self, ref: Version) -> bool:
        return all(np.allclose(self.arrays[n], ref.arrays[n],
                               **TOLERANCES[self.arrays[n].dtype]) for n in self.written)


@dataclass
class Row:
    """One kernel's results: gcc's median seconds; per polyc version (speed-up, ok) or
    a word saying why there is none; polyc's compile seconds; notes (errors, warnings)."""
    gcc: float = 0.0
    cells: dict[str, object] = field(default_factory=dict)
    compile_s: float = 0.0
    notes: list[str] = field(default_factory=list)


def run_kernel(k: Kernel, size: str, repeat: int, workdir: str, timeout: float) -> Row:
    sizes = k.sizes[size]
    row = Row()
    ops = {name: polyc.scop(k.source, function=k.function, threads=t, **opts)
           for name, (t, opts) in AUTOMATIC.items()}
    op = ops["isl 1t"]
    original = make_arrays(op, sizes, np.random.default_rng(0))
    written = op.scop.written
    values = {**sizes, **k.scalars}
    fn = build_gcc(k, op, workdir)
    order = [p.name for p in op.scop.params]

    def gcc(arrays: dict[str, np.ndarray]) -> None:
        fn(*[arrays[n].ctypes.data if n in arrays else values[n] for n in order])

    ref = Version(gcc, original, written)
    candidates: dict[str, polyc.Operator] = dict(ops)
    if k.tiled is None:
        row.cells["hand 1t"] = row.cells["hand 2t"] = "-"
    else:
        try:
            space = k.tiled(op.schedule_space())
            for t in (1, 2):
                candidates[f"hand {t}t"] = ops[f"isl {t}t"].with_schedule(space)
        except polyc.PolycError as err:  # a primitive refused (ScheduleError)
            row.notes.append(f"hand schedule refused: {type(err).__name__}: "
                             f"{_short(str(err))}")
            row.cells["hand 1t"] = row.cells["hand 2t"] = "n/a"
    # compile (polyc's automatic schedule under a time limit), warm up, check against gcc
    ref.restore()
    ref.call()
    versions: dict[str, Version] = {}
    for name, o in candidates.items():
        if name.endswith("2t") and row.cells.get(name[:-2] + "1t") == "timeout":
            row.cells[name] = "timeout"  # the same scheduling as 1t: not run again
            continue
        why, took = compiles_in_time(o, sizes, timeout) if name in AUTOMATIC \
            else (None, 0.0)
        row.compile_s += took
        if why == "timeout":
            row.cells[name] = "timeout"
            row.notes.append(f"{name}: polyc did not compile within {timeout:g} s "
                             "(--compile-timeout)")
            continue
        v = Version(lambda arrays, o=o: o(**values, **arrays), original, written)
        v.restore()
        failure, start = None, time.perf_counter()
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            try:
                v.call()  # compiles (again, for an auto version)
            except Exception as err:  # reported in the table, the other versions still run
                failure = f"{type(err).__name__}: {_short(str(err))}"
        row.compile_s += time.perf_counter() - start if not took else 0.0
        for w in caught:
            row.notes.append(f"{name}: {w.category.__name__}: {_short(str(w.message))}")
        if failure is not None:
            row.cells[name] = "error"
            row.notes.append(f"{name}: {failure}")
            continue
        versions[name] = v
    ok = {name: v.agrees(ref) for name, v in versions.items()}
    # timed, alternately
    for _ in range(repeat):
        ref.timed()
        for v in versions.values():
            v.timed()
    row.gcc = _median(ref.times)
    for name, v in versions.items():
        row.cells[name] = (row.gcc / _median(v.times), ok[name])
    return row


def _cell(value: object) -> str:
    if isinstance(value, tuple):
        ratio, ok = value
        return f"{ratio:5.2f} {'ok' if ok else 'FAIL'}"
    return str(value)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--repeat", type=int, default=5)
    p.add_argument("--size", choices=("large", "small"), default="large")
    p.add_argument("--kernels", default=",".join(k.name for k in KERNELS))
    p.add_argument("--quick", action="store_true", help="small sizes, one repeat")
    p.add_argument("--compile-timeout", type=float, default=60.0,
                   help="seconds polyc's automatic schedule may take to compile (0: no limit)")
    a = p.parse_args()
    if a.quick:
        a.size, a.repeat = "small", 1
    wanted = [w for w in a.kernels.split(",") if w]
    unknown = set(wanted) - {k.name for k in KERNELS}
    if unknown:
        p.error(f"unknown kernels {sorted(unknown)}; known: {[k.name for k in KERNELS]}")
    print(f"CPU: {cpu_model()}, {len(os.sched_getaffinity(0))} CPUs for this process; "
          f"OMP_PROC_BIND={os.environ.get('OMP_PROC_BIND')}")
    print(f"C loop nests via polyc.scop, size {a.size}, median of {a.repeat}. x = speed-up "
          f"over gcc -O3 -march=native on the same C (1 thread), ok = allclose to gcc's "
          f"output; isl / rect / diamond = polyc's schedule by isl's scheduler / the "
          f"Pluto-style one with rectangular / diamond tiles (untiled: isl's, no tiling), "
          f"hand = a workbench schedule, 1t/2t = threads", flush=True)
    head = f"{'kernel':<10} {'sizes':<22} {'gcc ms':>9}" + "".join(
        f" | {v:>11}" for v in VARIANTS) + " | compile"
    print(head)
    print("-" * len(head), flush=True)
    ratios: dict[str, list[float]] = {v: [] for v in VARIANTS}
    notes, failed = [], []
    with tempfile.TemporaryDirectory() as work:
        for k in KERNELS:
            if k.name not in wanted:
                continue
            r = run_kernel(k, a.size, a.repeat, work, a.compile_timeout)
            sizes = ",".join(f"{n}={v}" for n, v in k.sizes[a.size].items())
            line = f"{k.name:<10} {sizes:<22} {r.gcc * 1e3:9.2f}"
            for v in VARIANTS:
                cell = r.cells[v]
                line += f" | {_cell(cell):>11}"
                if isinstance(cell, tuple):
                    ratios[v].append(cell[0])
                    if not cell[1]:
                        failed.append(f"{k.name} {v}")
                elif cell not in ("-",):
                    failed.append(f"{k.name} {v} ({cell})")
            print(line + f" | {r.compile_s:7.1f} s", flush=True)
            notes += [f"{k.name}: {n}" for n in r.notes]
    print("-" * len(head))
    means = ""
    for v in VARIANTS:
        g = f"{float(np.exp(np.mean(np.log(ratios[v])))):5.2f}" if ratios[v] else "-"
        means += f" | {g:>11}"
    print(f"{'geomean':<10} {'(over the kernels with a figure)':<32}" + means)
    if failed:
        print(f"not ok: {', '.join(failed)}")
    if notes:
        print("notes:")
        for n in notes:
            print(f"  {n}")


if __name__ == "__main__":
    main()
