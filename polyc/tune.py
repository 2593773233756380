"""Auto-tuning: a bounded, interruptible search over how one kernel is scheduled.

    m = polyc.compile_onnx("model.onnx", options=Options(tune=True), progress=True)
    mm = polyc.define(src, tune=30.0)        # seconds per kernel; sizes come from the call

``Options.tune`` only ever changes *how* a kernel is compiled: the tile sizes
(``Options.tile``), the register tile (``Options.register_tile``) and the fusion mode.
For one kernel with every size fixed (:func:`tuned_options`):

1. **cost model** (:func:`skip_reason`): a kernel with no reduction, with fewer than
   :data:`MIN_WORK` reduction statement instances (bounding boxes of the iteration
   domains), with indirect accesses or with non-float arrays is not searched: it keeps
   the options it was given. Most kernels of a model (elementwise, pooling, small
   matrix products) stop here.
2. **cache**: the choice for (kernel up to names, the other options, thread count) is
   kept in ``<cache_dir>/tuning/<machine>.json``, one file per CPU model and feature
   set (written atomically); a cached entry means no search.
3. **search** (:func:`tune_kernel`): the options as given first, then register tile
   shapes, tile sizes scaled from the default rule (around the best so far), and the
   other fusion mode of ``min``/``smart`` (not ``max``: isl's whole-component scheduler
   can run for minutes on a padded convolution, where nothing can stop it). Each
   candidate is compiled by :func:`polyc.pipeline.compile_kernel`
   (a candidate whose C equals one already timed is not built again), run on random
   inputs, checked against the first candidate's result, and timed (the median of a
   few runs, each a loop over the raw C function). The search stops after ``budget``
   seconds or ``max_candidates`` candidates; Ctrl-C stops it and keeps the best so far
   (not cached, and a model compile searches no further kernel). A candidate must beat
   the options as given by :data:`MIN_GAIN`, in the search and again when the two are
   re-timed alternately at the end, to replace them: noise must not pick a candidate.
"""
from __future__ import annotations

import ctypes
import hashlib
import json
import os
import sys
import time
import warnings
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import islpy as isl
import numpy as np

from . import dtypes as D
from . import expr as E
from .errors import PolycWarning
from .ir import Kernel
from .codegen.toolchain import restore_cpus
from .options import Options
from . import host
from .schedule.tiling import box_volume

#: seconds of search per kernel for ``Options(tune=True)``
DEFAULT_BUDGET = 10.0
#: candidates (the options as given included) tried at most per kernel
MAX_CANDIDATES = 16
#: reduction statement instances below which a kernel is not searched
MIN_WORK = 1 << 22
#: a candidate replaces the options as given only when at least this much faster
MIN_GAIN = 0.03
#: timed runs per candidate (the median is kept), and the seconds each run aims at
RUNS = 5
RUN_SECONDS = 0.02
#: bump when the meaning of an entry changes: older entries are then ignored
FORMAT = 1

_FLOAT = ("float32", "float64")


@dataclass(frozen=True)
class Candidate:
    """The tuned fields of :class:`Options` (what a cache entry records)."""
    fusion: str
    tile: bool | tuple[int, ...]
    register_tile: bool | tuple[int, int]

    @staticmethod
    def of(options: Options) -> Candidate:
        return Candidate(options.fusion, options.tile, options.register_tile)

    def apply(self, options: Options) -> Options:
        return options.replace(fusion=self.fusion, tile=self.tile,
                               register_tile=self.register_tile, tune=False)

    def to_json(self) -> dict[str, Any]:
        def value(v: Any) -> Any:
            return list(v) if isinstance(v, tuple) else v
        return {"fusion": self.fusion, "tile": value(self.tile),
                "register_tile": value(self.register_tile)}

    @staticmethod
    def from_json(d: dict[str, Any]) -> Candidate:
        def value(v: Any) -> Any:
            return tuple(int(x) for x in v) if isinstance(v, list) else bool(v)
        return Candidate(str(d["fusion"]), value(d["tile"]), value(d["register_tile"]))

    def describe(self) -> str:
        def show(v: Any) -> str:
            return "x".join(map(str, v)) if isinstance(v, tuple) else ("default" if v else "off")
        return f"fusion={self.fusion} tile={show(self.tile)} registers={show(self.register_tile)}"


@dataclass
class TuneResult:
    """What :func:`tune_kernel` decided for one kernel."""
    kernel: str
    options: Options  # the options to compile with (``tune`` off)
    #: "skipped: <why>", "cached", "searched", "interrupted"
    status: str
    best_s: float | None = None
    default_s: float | None = None
    tried: int = 0
    seconds: float = 0.0
    timings: list[tuple[Candidate, float]] = field(default_factory=list)

    @property
    def searched(self) -> bool:
        return self.status in ("searched", "interrupted")


# -- the cost model ----------------------------------------------------------------------

def estimated_work(kernel: Kernel) -> int:
    """Reduction statement instances (the bounding box of each domain; 0 when a domain
    is not bounded by constants)."""
    total = 0
    for s in kernel.statements:
        if s.is_reduction:
            total += box_volume(s.domain.intersect_params(kernel.context)) or 0
    return total


def instances(kernel: Kernel) -> tuple[int, int] | None:
    """Statement instances of the reductions and of the other statements (the bounding
    box of each domain; None where a domain is not bounded by constants)."""
    red = other = 0
    for s in kernel.statements:
        domain = s.domain.intersect_params(kernel.context)
        n = box_volume(domain) or 0
        if n == 0 and not domain.is_empty():
            return None
        if s.is_reduction:
            red += n
        else:
            other += n
    return red, other


def skip_reason(kernel: Kernel, options: Options, min_work: int | None = None) -> str | None:
    """Why ``kernel`` is not searched (None: it is); ``min_work``: :data:`MIN_WORK`."""
    min_work = MIN_WORK if min_work is None else min_work
    if options.schedule is not None:
        return "a user schedule"
    if len(kernel.fixed_sizes) != len(kernel.sizes):
        return "sizes not fixed"
    if any(a.dtype not in _FLOAT for a in kernel.arrays):
        return "non-float arrays"
    for s in kernel.statements:
        if not s.write.is_affine or not all(E.is_affine(i) for r in E.reads(s.value)
                                            for i in r.indices):
            return "indirect accesses"
    if not any(s.is_reduction for s in kernel.statements):
        return "no reduction"
    work = estimated_work(kernel)
    if work < min_work:
        return f"little work ({work} reduction instances)"
    return None


# -- the cache ---------------------------------------------------------------------------

def cache_path(options: Options) -> str:
    return os.path.join(options.cache_dir, "tuning", host.cpu_key() + ".json")


def thread_count(options: Options) -> int:
    """The threads the compiled code will run on (``Options.threads``, else OpenMP's)."""
    from .schedule.machine import threads
    return threads(options.threads)


def entry_key(kernel: Kernel, options: Options) -> str:
    """The kernel up to names, every option that changes its speed, the thread count."""
    from .codegen.model import kernel_key
    base = json.dumps([FORMAT, kernel_key(kernel), Candidate.of(options).to_json(),
                       options.parallel, options.vectorize, options.cc, list(options.cflags),
                       options.sanitize])
    return f"{hashlib.sha256(base.encode()).hexdigest()[:40]}-t{thread_count(options)}"


_WARNED: set[str] = set()


def load_cache(path: str) -> dict[str, Any]:
    """The entries in ``path`` ({} when missing; a warning and {} when unreadable)."""
    try:
        with open(path) as f:
            data = json.load(f)
        if not isinstance(data, dict) or not isinstance(data.get("entries"), dict):
            raise ValueError("no 'entries' object")
        return data["entries"]
    except FileNotFoundError:
        return {}
    except (OSError, ValueError) as e:
        if path not in _WARNED:
            _WARNED.add(path)
            warnings.warn(PolycWarning(f"ignoring the unreadable tuning cache {path} ({e}); "
                                       "it will be rewritten"), stacklevel=2)
        return {}


def cached_candidate(kernel: Kernel, options: Options) -> Candidate | None:
    entry = load_cache(cache_path(options)).get(entry_key(kernel, options))
    if not isinstance(entry, dict):
        return None
    try:
        return Candidate.from_json(entry)
    except (KeyError, TypeError, ValueError):
        return None


def store(kernel: Kernel, options: Options, entry: dict[str, Any]) -> None:
    """Add ``entry`` for ``kernel`` to the machine's file (re-read first; tmp + replace)."""
    path = cache_path(options)
    os.makedirs(os.path.dirname(path), exist_ok=True)
    entries = load_cache(path)
    entries[entry_key(kernel, options)] = entry
    cpu = host.cpu_description()
    data = {"format": FORMAT, "machine": cpu.splitlines()[0] if cpu else "",
            "entries": entries}
    host.write_atomically(path, json.dumps(data, indent=1, sort_keys=True))


# -- candidates --------------------------------------------------------------------------

def register_shapes(dtype: str = "float32") -> list[tuple[int, int]]:
    """``(MR, NR)`` register tiles worth trying on this CPU (NR in elements of ``dtype``)."""
    from .schedule.register_tile import vector_bits
    bits = vector_bits()
    if bits >= 512:
        shapes = [(8, 64), (6, 64), (4, 64), (8, 32), (12, 32), (14, 16)]
    elif bits >= 256:
        shapes = [(6, 16), (4, 16), (8, 8), (4, 24), (3, 32), (12, 8)]
    else:
        shapes = [(4, 8), (6, 8), (8, 4), (4, 12), (3, 16), (12, 4)]
    if dtype in ("float64", "int64"):  # half as many elements per vector
        return [(mr, max(1, nr // 2)) for mr, nr in shapes]
    return shapes


@dataclass(frozen=True)
class BandShape:
    """The main band of a kernel, in the order the optimizer tiles it: ``outer``
    coincident members, then ``reduction`` members, then the vector member if any."""
    outer: int
    reduction: int
    vector: bool


def main_band(kernel: Kernel, options: Options) -> BandShape | None:
    """The shape of the deepest permutable band of isl's schedule (None when there is no
    band of two or more members, or on any surprise: tile candidates are then skipped)."""
    try:
        from .deps import compute_dependences
        from .schedule import optimize as opt
        from .schedule import tiling
        from .schedule.scheduler import compute_schedule
        sched = compute_schedule(kernel, compute_dependences(kernel), options)
        best: BandShape | None = None
        best_n = 1
        todo = [sched.get_root()]
        while todo:
            node = todo.pop()
            if (node.get_type() == isl.schedule_node_type.band and node.band_get_permutable()
                    and node.band_n_member() > best_n):
                flags = tiling.coincident_flags(node)
                vec = None
                if opt._is_leaf_band(node):
                    inner, simd = opt._innermost_member(node, kernel)
                    vec = inner if simd and options.vectorize else None
                n_c = sum(flags) - (1 if vec is not None else 0)
                best = BandShape(n_c, len(flags) - sum(flags), vec is not None)
                best_n = node.band_n_member()
            todo.extend(node.child(i) for i in range(node.n_children()))
        return best
    except Exception:
        return None


def tile_tuple(band: BandShape, outer: int, reduction: int, vector: int,
               register: tuple[int, int] | None) -> tuple[int, ...]:
    """Tile sizes for ``band``; with a register tile, rounded to multiples of it (the
    default rule does the same)."""
    if register is not None:
        mr, nr = register
        outer, vector = -(-outer // mr) * mr, -(-vector // nr) * nr
    return ((outer,) * band.outer + (reduction,) * band.reduction
            + ((vector,) if band.vector else ()))


def _defaults() -> tuple[int, int, int]:
    from .schedule import optimize as opt
    return (getattr(opt, "DEFAULT_TILE_OUTER", 32), getattr(opt, "DEFAULT_TILE_REDUCTION", 64),
            getattr(opt, "DEFAULT_TILE_VECTOR", 512))


def _dtype(kernel: Kernel) -> str:
    for s in kernel.statements:
        if s.is_reduction:
            return kernel.array(s.write.array).dtype
    return "float32"


def candidates(kernel: Kernel, options: Options, best: Callable[[], Candidate],
               band: BandShape | None) -> Iterator[Candidate]:
    """The options as given, register tile shapes, then tile sizes (for ``band``, see
    :func:`main_band`) around ``best()`` (the best so far, read when they are
    generated), then the other fusion modes."""
    base = Candidate.of(options)
    yield base
    from .schedule.register_tile import machine_shape
    default_reg = machine_shape(_dtype(kernel), options.replace(register_tile=True))
    if options.register_tile is not False:
        for shape in register_shapes(_dtype(kernel)):
            if shape != default_reg or options.register_tile is not True:
                yield Candidate(base.fusion, base.tile, shape)
        yield Candidate(base.fusion, base.tile, False)
    if band is not None and options.tile is True:
        o, r, v = _defaults()
        now = best()
        reg = now.register_tile
        shape = (reg if isinstance(reg, tuple) else default_reg) if reg is not False else None
        if shape is not None:  # the chunk the compiler gives a register tile of that shape
            from .schedule.optimize import reduction_chunk
            r = reduction_chunk(shape[0], D.itemsize(_dtype(kernel)))
        variants = [(o * 2, r, v), (o, r * 2, v), (o, r // 2, v), (o // 2, r, v),
                    (o, r, v // 2), (o * 2, r * 2, v), (o, r, v * 2)]
        for outer, red, vec in variants:
            yield Candidate(now.fusion, tile_tuple(band, outer, red, vec, shape), now.register_tile)
    now = best()
    # not "max": isl's whole-component scheduler can take minutes on a padded conv
    # (inside isl, where neither a budget nor Ctrl-C can stop it)
    for mode in ("min", "smart"):
        if mode != now.fusion:
            yield Candidate(mode, now.tile, now.register_tile)


# -- running one candidate ---------------------------------------------------------------

class _Bench:
    """Random inputs, zeroed outputs and the size arguments of one kernel, allocated once."""

    def __init__(self, kernel: Kernel, seed: int = 0):
        from .codegen.runtime import NUMPY_DTYPES, output_shapes
        rng = np.random.default_rng(seed)
        sizes = dict(kernel.fixed_sizes)
        env = {s: sizes[s] for s in kernel.sizes}
        self.inputs = []
        for name in kernel.inputs:
            arr = kernel.array(name)
            shape = tuple(E.evaluate(d, env) for d in arr.shape)
            self.inputs.append(rng.standard_normal(shape).astype(NUMPY_DTYPES[arr.dtype]))
        self.outputs = [np.zeros(shape, dtype=NUMPY_DTYPES[kernel.array(o).dtype])
                        for o, shape in zip(kernel.outputs, output_shapes(kernel, env))]
        self.args = [env[s] for s in kernel.sizes] + [a.ctypes.data for a in
                                                      self.inputs + self.outputs]
        self.kernel = kernel

    def function(self, path: str, name: str) -> Callable[..., int]:
        from .codegen.runtime import load_library
        fn = getattr(load_library(path), name)
        fn.restype = ctypes.c_int
        fn.argtypes = [ctypes.c_int64] * len(self.kernel.sizes) + [ctypes.c_void_p] * (
            len(self.kernel.inputs) + len(self.kernel.outputs))
        return fn

    def result(self, fn: Callable[..., int]) -> list[np.ndarray]:
        for y in self.outputs:
            y.fill(0)
        status = fn(*self.args)
        if status != 0:
            raise RuntimeError(f"{self.kernel.name} returned status {status}")
        return [y.copy() for y in self.outputs]

    def time(self, fn: Callable[..., int], calls: int, runs: int,
             give_up: float | None = None) -> float:
        """The median over ``runs`` of the mean time of ``calls`` calls; stops early
        (returning the first run) when a run is slower than ``give_up`` seconds."""
        args = self.args
        clock = time.perf_counter
        times = []
        for _ in range(runs):
            t = clock()
            for _ in range(calls):
                fn(*args)
            times.append((clock() - t) / calls)
            if give_up is not None and times[-1] > give_up:
                return times[-1]
        times.sort()
        return times[len(times) // 2]


def _same(got: list[np.ndarray], want: list[np.ndarray]) -> bool:
    for g, w in zip(got, want):
        scale = float(np.max(np.abs(w), initial=1.0)) if w.size else 1.0
        if not np.isfinite(scale):
            scale = 1.0
        if not np.allclose(g, w, rtol=1e-3, atol=1e-4 * scale, equal_nan=True):
            return False
    return True


class _Bar:
    """``tune k12_Conv [#####.....] 5/10 best 1.23 ms`` on stderr (redrawn in place on a
    terminal, one final line otherwise)."""

    def __init__(self, name: str, total: int, enabled: bool):
        self.name, self.total, self.enabled = name, max(total, 1), enabled
        self.tty = enabled and sys.stderr.isatty()
        self.text = ""

    def show(self, done: int, best: float | None, final: bool = False, note: str = "") -> None:
        if not self.enabled:
            return
        width = 10
        filled = min(width, width * done // self.total)
        best_text = f" best {best * 1e3:.3f} ms" if best is not None else ""
        self.text = (f"tune {self.name} [{'#' * filled}{'.' * (width - filled)}] "
                     f"{done}/{self.total}{best_text}{note}")
        if self.tty:
            sys.stderr.write("\r\033[K" + self.text + ("\n" if final else ""))
            sys.stderr.flush()
        elif final:
            print(self.text, file=sys.stderr, flush=True)


# -- the search --------------------------------------------------------------------------

def budget_of(options: Options) -> float:
    return DEFAULT_BUDGET if options.tune is True else float(options.tune or DEFAULT_BUDGET)


def tune_kernel(kernel: Kernel, options: Options, *, budget: float | None = None,
                max_candidates: int | None = None, progress: bool = False,
                use_cache: bool = True, search: bool = True,
                min_work: int | None = None) -> TuneResult:
    """Decide the options for ``kernel`` (see the module doc): ``budget`` seconds
    (default: from ``options.tune``), ``max_candidates`` (:data:`MAX_CANDIDATES`),
    ``min_work`` (:data:`MIN_WORK`); ``search=False`` only looks in the cache."""
    max_candidates = MAX_CANDIDATES if max_candidates is None else max_candidates
    start = time.perf_counter()
    plain = options.replace(tune=False)
    why = skip_reason(kernel, options, min_work)
    if why is not None:
        return TuneResult(kernel.name, plain, f"skipped: {why}")
    if use_cache:
        found = cached_candidate(kernel, options)
        if found is not None:
            return TuneResult(kernel.name, found.apply(options), "cached")
    if not search:
        return TuneResult(kernel.name, plain, "skipped: not searched")
    budget = budget_of(options) if budget is None else budget
    try:
        result = _search(kernel, plain, budget, max_candidates, progress)
    finally:
        restore_cpus()  # a parallel region pinned this thread: compilers would inherit it
    result.seconds = time.perf_counter() - start
    if use_cache and result.status == "searched":
        best = Candidate.of(result.options)
        store(kernel, options, {**best.to_json(), "kernel": kernel.name,
                                "best_ms": _ms(result.best_s), "default_ms": _ms(result.default_s),
                                "tried": result.tried, "seconds": round(result.seconds, 2)})
    return result


def _ms(s: float | None) -> float | None:
    return None if s is None else round(s * 1e3, 4)


def _search(kernel: Kernel, options: Options, budget: float, max_candidates: int,
            progress: bool) -> TuneResult:
    from . import pipeline
    from .codegen import build_shared

    start = time.perf_counter()
    base = Candidate.of(options)
    bench = _Bench(kernel)
    reference: list[np.ndarray] | None = None
    best: tuple[float, Candidate] | None = None
    default_s: float | None = None
    calls = 1
    seen: set[Candidate] = set()
    by_source: dict[str, float] = {}
    timings: list[tuple[Candidate, float]] = []
    built = 0  # candidates built and timed (not those whose C was already timed)
    band = main_band(kernel, options)
    total = min(max_candidates, len(set(candidates(kernel, options, lambda: base, band))))
    bar = _Bar(kernel.name, total, progress)
    interrupted = False
    functions: dict[Candidate, Callable[..., int]] = {}
    stream = candidates(kernel, options, lambda: best[1] if best else base, band)
    try:
        for cand in stream:
            if cand in seen:
                continue
            seen.add(cand)
            elapsed = time.perf_counter() - start
            # stop before a candidate that would likely end past the budget
            if built >= max_candidates or (built and elapsed + elapsed / built > budget):
                break
            first = reference is None
            try:
                with warnings.catch_warnings():
                    if not first:  # a candidate the optimizer refuses is not worth a warning
                        warnings.simplefilter("error", PolycWarning)
                    compiled = pipeline.compile_kernel(kernel, cand.apply(options), build=False)
                text = compiled.source.text
                if text in by_source:  # the same C as a candidate already timed
                    timings.append((cand, by_source[text]))
                    continue
                path = build_shared(compiled.source, options)
            except Exception:
                if first:
                    raise
                continue
            built += 1
            fn = bench.function(path, compiled.source.function_name)
            got = bench.result(fn)
            if first:
                reference = got
                one = bench.time(fn, 1, 1)
                calls = max(1, min(1000, int(RUN_SECONDS / max(one, 1e-7))))
            elif not _same(got, reference):  # a compiler bug: never pick it
                warnings.warn(PolycWarning(
                    f"{kernel.name}: tuning candidate {cand.describe()} computes a "
                    "different result than the default; skipped. Please report this."),
                    stacklevel=3)
                continue
            seconds = bench.time(fn, calls, RUNS, give_up=None if best is None else 3 * best[0])
            by_source[text] = seconds
            functions[cand] = fn
            timings.append((cand, seconds))
            if first:
                default_s = seconds
                best = (seconds, cand)
            elif seconds < best[0] and seconds < default_s * (1 - MIN_GAIN):  # type: ignore[index,operator]
                best = (seconds, cand)
            bar.show(built, best[0] if best else None)
    except KeyboardInterrupt:
        interrupted = True
        if best is None:  # nothing measured yet: the options as given
            bar.show(built, None, final=True, note=" interrupted")
            return TuneResult(kernel.name, options, "interrupted", tried=built)
    assert best is not None
    if best[1] != base and not interrupted:
        best, default_s = _confirm(bench, functions[base], functions[best[1]], calls, best,
                                   base)
    note = " interrupted" if interrupted else ""
    if best[1] != base and default_s:
        note += f" ({default_s / best[0]:.2f}x: {best[1].describe()})"
    bar.show(built, best[0], final=True, note=note)
    return TuneResult(kernel.name, best[1].apply(options), "interrupted" if interrupted
                      else "searched", best[0], default_s, built, timings=timings)


def _confirm(bench: _Bench, base_fn: Callable[..., int], best_fn: Callable[..., int],
             calls: int, best: tuple[float, Candidate],
             base: Candidate) -> tuple[tuple[float, Candidate], float | None]:
    """Time the options as given and the best candidate again, alternately: a machine's
    noise must not pick a candidate (the best keeps its place only when it still wins by
    :data:`MIN_GAIN`). Returns the best and the time of the options as given."""
    try:
        tb, tx = [], []
        for _ in range(3):
            tb.append(bench.time(base_fn, calls, 3))
            tx.append(bench.time(best_fn, calls, 3))
    except KeyboardInterrupt:
        return best, None
    b, x = sorted(tb)[1], sorted(tx)[1]
    return ((x, best[1]) if x < b * (1 - MIN_GAIN) else (b, base)), b


def tuned_options(kernel: Kernel, options: Options, *, progress: bool = False,
                  search: bool = True) -> Options:
    """The options to compile ``kernel`` with when ``options.tune`` is on (``options``
    with ``tune`` off when it is not, or when the kernel is not searched)."""
    if not options.tune:
        return options
    return tune_kernel(kernel, options, progress=progress, search=search).options
