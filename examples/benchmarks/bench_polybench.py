"""Benchmark: PolyBench kernels in the TC language, polyc against the naive loop nest.

    python3 examples/benchmarks/bench_polybench.py [--repeat 5] [--size large|medium|small]
                                                   [--kernels gemm,atax,...] [--notes]
                                                   [--dtype float64|float32]

Each kernel of ``polybench_kernels.py`` (gemm, gemver, 2mm, 3mm, syrk, syr2k, atax, bicg,
mvt, gesummv, doitgen, covariance, jacobi-2d with 5 and 9 points, heat-3d; double
precision, or single with ``--dtype float32``; PolyBench's LARGE sizes by default, the
stencils with 4 time steps) runs three ways in one process:

* **gcc**: PolyBench's reference loop nest, sizes as compile-time constants, compiled
  with ``gcc -O3 -march=native`` into a shared library called through ctypes, single
  threaded;
* **polyc 1t / 2t**: the TC definition compiled by polyc with ``Options(threads=1)``
  and ``threads=2``.

The three are timed alternately (medians over ``--repeat`` runs; in/out arrays are
restored before each run, outside the timed region, and polyc writes into preallocated
outputs as the C does; the arrays a side only writes are zeroed before its run, so
that both start with what they write in cache, ``--cold-outputs`` not) and the speed-ups of polyc over gcc are printed, each with a
correctness check: polyc (1 and 2 threads), the naive C and numpy all agree
(``allclose``). ``--notes`` prints how each PolyBench construct was written in TC.

Each line ends with the cross-core round trip probed before and after its timed runs
(:mod:`cores`), and the run with all of them: on a 2-vCPU guest the host moves the
vCPUs apart for seconds at a time, and the 2-thread figures of a line probed far apart
read for that.
"""
from __future__ import annotations

import argparse
import ctypes
import os
import subprocess
import sys
import tempfile
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from polybench_kernels import BENCHES, NOTES, Bench, as_float32, c_source  # noqa: E402

import cores  # noqa: E402
import polyc  # noqa: E402
from polyc import pipeline  # noqa: E402

#: PolyBench's MEDIUM and SMALL sizes (LARGE is each Bench's default)
PRESETS = {
    "medium": {"gemm": dict(NI=200, NJ=220, NK=240), "2mm": dict(NI=180, NJ=190, NK=210, NL=220),
               "3mm": dict(NI=180, NJ=190, NK=200, NL=210, NM=220),
               "syrk": dict(N=240, M=200), "syr2k": dict(N=240, M=200),
               "atax": dict(M=390, N=410), "bicg": dict(M=390, N=410), "mvt": dict(N=400),
               "gesummv": dict(N=250), "doitgen": dict(NR=50, NQ=40, NP=60),
               "covariance": dict(M=240, N=260), "jacobi-2d": dict(N=250),
               "gemver": dict(N=400), "jacobi-2d-9": dict(N=250), "heat-3d": dict(N=40)},
    "small": {"gemm": dict(NI=60, NJ=70, NK=80), "2mm": dict(NI=40, NJ=50, NK=70, NL=80),
              "3mm": dict(NI=40, NJ=50, NK=60, NL=70, NM=80),
              "syrk": dict(N=80, M=60), "syr2k": dict(N=80, M=60),
              "atax": dict(M=116, N=124), "bicg": dict(M=116, N=124), "mvt": dict(N=120),
              "gesummv": dict(N=90), "doitgen": dict(NR=25, NQ=20, NP=30),
              "covariance": dict(M=80, N=100), "jacobi-2d": dict(N=90),
              "gemver": dict(N=120), "jacobi-2d-9": dict(N=90), "heat-3d": dict(N=20)},
}


def build_naive(b: Bench, sizes: dict[str, int], workdir: str) -> ctypes.CDLL:
    src = os.path.join(workdir, f"{b.name}.c")
    lib = os.path.join(workdir, f"{b.name}.so")
    with open(src, "w") as f:
        f.write(c_source(b, sizes))
    subprocess.run([os.environ.get("CC", "gcc"), "-O3", "-march=native", "-shared", "-fPIC",
                    "-o", lib, src], check=True)
    dll = ctypes.CDLL(lib)
    dll.kernel.argtypes = [ctypes.POINTER(ctypes.c_void_p)]
    dll.kernel.restype = None
    return dll


def _seconds(f) -> float:
    t = time.perf_counter()
    f()
    return time.perf_counter() - t


def _median(xs: list[float]) -> float:
    xs = sorted(xs)
    return xs[len(xs) // 2]


def run_one(b: Bench, sizes: dict[str, int], repeat: int, workdir: str, rtol: float = 1e-6,
            atol: float = 1e-8, cold_outputs: bool = False
            ) -> tuple[float, float, list[float | None]]:
    """The speed-ups of polyc (1 and 2 threads) over the naive C, and the cross-core
    round trips probed before and after the timed runs (:mod:`cores`)."""
    rng = np.random.default_rng(0)
    inputs = [np.ascontiguousarray(x) for x in b.inputs(sizes, rng)]
    want = b.numpy(*inputs)

    # naive C: buffers bound once; in/out copies restored before each run
    t = time.perf_counter()
    dll = build_naive(b, sizes, workdir)
    t_gcc = time.perf_counter() - t
    bufs: list[np.ndarray] = []
    for kind, i in b.c_bind:
        if kind == "in":
            bufs.append(inputs[i])
        elif kind == "copy":
            bufs.append(inputs[i].copy())
        else:
            bufs.append(np.zeros_like(want[i]))
    ptrs = (ctypes.c_void_p * len(bufs))(*[a.ctypes.data for a in bufs])

    def restore():
        for (kind, i), a in zip(b.c_bind, bufs):
            if kind == "copy":
                np.copyto(a, inputs[i])

    def naive():
        dll.kernel(ptrs)

    # polyc: the specialised library, run into preallocated outputs (as the C is)
    runners, t_polyc = {}, {}
    for threads in (1, 2):
        op = polyc.define(b.tc, options=polyc.Options(threads=threads))
        arrays = pipeline.check_inputs(op.kernel, inputs)
        bound = pipeline.bind_sizes(op.kernel, arrays, None)
        t = time.perf_counter()
        fn = op.compiled_for(bound).function
        t_polyc[threads] = time.perf_counter() - t
        outs = [np.zeros_like(w) for w in want]
        runners[threads] = (lambda fn=fn, arrays=arrays, bound=bound, outs=outs:
                            fn(arrays, bound, outputs=outs), outs)

    def close(got):
        return all(g.shape == w.shape and np.allclose(g, w, rtol=rtol, atol=atol)
                   for g, w in zip(got, want))

    # warm up, and check every version against numpy
    restore(), naive()
    ok_c = close([bufs[k] for k in b.c_outs])
    for f, _ in runners.values():
        f()
    ok_p = {t: close(outs) for t, (_, outs) in runners.items()}
    times: dict[object, list[float]] = {"gcc": [], 1: [], 2: []}
    # Both sides start each run with every array they write just written, as the naive
    # C's in/out arrays are by restore(): polyc's copies of those arrays are its inputs,
    # rewritten as well (float32 jacobi-2d measured 0.77x with only the C's restored,
    # 1.0x with both), and the arrays each side only writes (the C's output buffers,
    # polyc's outputs) are zeroed before its run; otherwise polyc's outputs come from
    # DRAM while the C's arrays are in cache (the two-array stencils write 13.6 MB,
    # 4-10% of their time). ``cold_outputs`` leaves the outputs as the last run left them.
    saved = {i: inputs[i].copy() for kind, i in b.c_bind if kind == "copy"}
    c_only_out = [a for (kind, _), a in zip(b.c_bind, bufs) if kind == "out"]

    def refresh():
        for i, x in saved.items():
            np.copyto(inputs[i], x)

    def zero(arrays):
        if not cold_outputs:
            for a in arrays:
                a.fill(0)

    def timed() -> None:
        for _ in range(repeat):
            restore()
            zero(c_only_out)
            times["gcc"].append(_seconds(naive))
            for threads, (f, outs) in runners.items():
                refresh()
                zero(outs)
                times[threads].append(_seconds(f))
    _, near = cores.probed(2, timed)
    tg, t1, t2 = _median(times["gcc"]), _median(times[1]), _median(times[2])
    fl = b.flops(sizes)
    size_text = ",".join(f"{k}={v}" for k, v in sizes.items())
    check = ("ok" if ok_c and all(ok_p.values()) else
             f"MISMATCH (naive C {ok_c}, polyc 1t {ok_p[1]}, polyc 2t {ok_p[2]})")
    print(f"{b.name:<11} {size_text:<34} gcc {tg * 1e3:8.2f} ms ({fl / tg / 1e9:5.1f} GF/s)"
          f" | polyc 1t {t1 * 1e3:8.2f} ms x{tg / t1:5.2f} | 2t {t2 * 1e3:8.2f} ms "
          f"x{tg / t2:5.2f} | check {check} | compile gcc {t_gcc:.1f}s polyc "
          f"{t_polyc[1]:.1f}+{t_polyc[2]:.1f}s | 2t: {cores.describe(near)}", flush=True)
    return tg / t1, tg / t2, near


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--repeat", type=int, default=5)
    p.add_argument("--size", choices=("large", "medium", "small"), default="large")
    p.add_argument("--kernels", default=",".join(b.name for b in BENCHES))
    p.add_argument("--notes", action="store_true", help="print how the kernels are written")
    p.add_argument("--dtype", choices=("float64", "float32"), default="float64",
                   help="element type of every array, in the TC and in the C")
    p.add_argument("--cold-outputs", action="store_true",
                   help="do not zero the arrays each side only writes before its runs")
    a = p.parse_args()
    # as bench_core: this machine may set these for old OpenBLAS builds (numpy refs)
    os.environ.pop("OPENBLAS_CORETYPE", None), os.environ.pop("OPENBLAS_L2_SIZE", None)
    if a.notes:
        print(NOTES + "\n")
    wanted = a.kernels.split(",")
    unknown = set(wanted) - {b.name for b in BENCHES}
    if unknown:
        p.error(f"unknown kernels {sorted(unknown)}; known: {[b.name for b in BENCHES]}")
    single = a.dtype == "float32"
    print(f"PolyBench kernels ({'float' if single else 'double'}), size {a.size}, median of "
          f"{a.repeat}; x = speed-up of polyc over the naive loop nest (gcc -O3 "
          f"-march=native, 1 thread); all {len(BENCHES)} are written in TC (--notes: how)",
          flush=True)
    ratios = []
    with tempfile.TemporaryDirectory() as work, tempfile.TemporaryDirectory() as cache:
        # polyc's libraries built afresh (compile times cold), never loaded from files the
        # page cache has held since an earlier run: one such file, byte for byte the
        # library a fresh build gives, ran mvt 2.2x slower (1.8 vs 0.83 ms) until the
        # kernel dropped its pages (posix_fadvise DONTNEED) -- the host's doing
        before = os.environ.get("POLYC_CACHE_DIR")
        os.environ["POLYC_CACHE_DIR"] = cache
        try:
            for b in BENCHES:
                if b.name not in wanted:
                    continue
                sizes = b.sizes if a.size == "large" else PRESETS[a.size][b.name]
                # float32: the sums of a few thousand products agree to about 1e-5
                ratios.append(run_one(as_float32(b), sizes, a.repeat, work, 1e-3, 1e-4,
                                      a.cold_outputs) if single else
                              run_one(b, sizes, a.repeat, work, cold_outputs=a.cold_outputs))
        finally:
            if before is None:
                os.environ.pop("POLYC_CACHE_DIR", None)
            else:
                os.environ["POLYC_CACHE_DIR"] = before
    if ratios:
        g1 = float(np.exp(np.mean(np.log([r[0] for r in ratios]))))
        g2 = float(np.exp(np.mean(np.log([r[1] for r in ratios]))))
        print(f"geometric mean speed-up over gcc: polyc 1 thread x{g1:.2f}, 2 threads x{g2:.2f}")
        print(f"2 threads: {cores.describe([t for r in ratios for t in r[2]])}")


if __name__ == "__main__":
    main()
