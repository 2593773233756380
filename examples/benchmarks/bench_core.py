"""Benchmark: polyc-compiled matmul and 2-D convolution against numpy, side by side.

    python3 examples/benchmarks/bench_core.py [--repeat 7] [--sizes 1024]

For each thread count (1, 2) the script runs itself in a child process with
OMP_NUM_THREADS / OPENBLAS_NUM_THREADS set (both libraries read them at start-up) and
OMP_PROC_BIND=close; within a child, polyc and numpy are timed alternately and the
medians are compared. Each figure is printed with a correctness check against numpy.
"""
from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time

CONV = """
def conv2d(float(N,C,H,W) I, float(F,C,KH,KW) Wt) -> (O) {
    O(n,f,h,w) +=! I(n,c,h+kh,w+kw) * Wt(f,c,kh,kw)
}"""
MATMUL = """
def matmul(float(M,K) A, float(K,N) B) -> (C) {
    C(m,n) +=! A(m,k) * B(k,n)
}"""


def _median_pair(f, g, repeat):
    """Median seconds of f and of g, timed alternately (so both see the same noise)."""
    f(), g()  # warm up (and compile)
    tf, tg = [], []
    for _ in range(repeat):
        t = time.perf_counter(); f(); tf.append(time.perf_counter() - t)
        t = time.perf_counter(); g(); tg.append(time.perf_counter() - t)
    tf.sort(), tg.sort()
    return tf[len(tf) // 2], tg[len(tg) // 2]


def child(threads: int, repeat: int, sizes: list[int]) -> None:
    import numpy as np

    import polyc

    rng = np.random.default_rng(0)
    mm = polyc.define(MATMUL, threads=threads)
    for n in sizes:
        A = rng.standard_normal((n, n), dtype=np.float32)
        B = rng.standard_normal((n, n), dtype=np.float32)
        ok = np.allclose(mm(A, B), A @ B, rtol=1e-3, atol=1e-2 * np.sqrt(n))
        tp, tn = _median_pair(lambda: mm(A, B), lambda: A @ B, repeat)
        flops = 2.0 * n ** 3
        print(f"matmul {n}x{n}x{n} f32  threads={threads}  polyc {flops / tp / 1e9:7.1f} GFLOP/s"
              f"  numpy {flops / tn / 1e9:7.1f} GFLOP/s  ratio {tn / tp:5.2f}  correct={ok}",
              flush=True)

    conv = polyc.define(CONV, threads=threads)
    N, C, H, W, F, K = 1, 64, 58, 58, 64, 3
    I = rng.standard_normal((N, C, H, W), dtype=np.float32)
    Wt = rng.standard_normal((F, C, K, K), dtype=np.float32)
    OH, OW = H - K + 1, W - K + 1

    def numpy_conv():
        # im2col with strided views, then one sgemm (what a numpy user would write)
        win = np.lib.stride_tricks.sliding_window_view(I, (K, K), axis=(2, 3))
        cols = np.ascontiguousarray(win.transpose(0, 2, 3, 1, 4, 5)).reshape(N * OH * OW, C * K * K)
        return (cols @ Wt.reshape(F, -1).T).reshape(N, OH, OW, F).transpose(0, 3, 1, 2)

    ok = np.allclose(conv(I, Wt), numpy_conv(), rtol=1e-3, atol=1e-2)
    tp, tn = _median_pair(lambda: conv(I, Wt), numpy_conv, repeat)
    flops = 2.0 * N * F * OH * OW * C * K * K
    print(f"conv2d {N}x{C}x{H}x{W} * {F}x{C}x{K}x{K} f32  threads={threads}  polyc "
          f"{flops / tp / 1e9:7.1f} GFLOP/s  numpy(im2col+sgemm) {flops / tn / 1e9:7.1f} GFLOP/s"
          f"  ratio {tn / tp:5.2f}  correct={ok}", flush=True)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--repeat", type=int, default=7)
    p.add_argument("--sizes", default="1024", help="comma-separated matmul sizes")
    p.add_argument("--threads", default="1,2")
    p.add_argument("--child", type=int, help=argparse.SUPPRESS)
    a = p.parse_args()
    sizes = [int(s) for s in a.sizes.split(",")]
    if a.child:
        child(a.child, a.repeat, sizes)
        return
    for t in (int(x) for x in a.threads.split(",")):
        env = dict(os.environ, OMP_NUM_THREADS=str(t), OPENBLAS_NUM_THREADS=str(t),
                   OMP_PROC_BIND="close")
        # this machine may set these for old OpenBLAS builds; they slow a current numpy
        env.pop("OPENBLAS_CORETYPE", None), env.pop("OPENBLAS_L2_SIZE", None)
        subprocess.run([sys.executable, __file__, "--child", str(t), "--repeat", str(a.repeat),
                        "--sizes", a.sizes], env=env, check=True)


if __name__ == "__main__":
    main()
