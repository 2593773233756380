"""Benchmark: polyc-compiled matmul and 2-D convolution against numpy, side by side.

    python3 examples/benchmarks/bench_core.py [--repeat 7] [--rounds 3] [--sizes 1024]
                                              [--rect 1024x256x2048,...] [--no-conv]

``--sizes 256,512,1024,2048`` times square matmuls; ``--rect MxKxN`` (comma-separated,
any number) adds rectangular ones, C(M,N) = A(M,K) @ B(K,N), printed the same way.

For each thread count (1, 2) the script runs itself in a child process with
OMP_NUM_THREADS / OPENBLAS_NUM_THREADS set (both libraries read them at start-up) and
OMP_PROC_BIND=close, and an empty polyc cache (libraries built afresh: see
``bench_polybench``); within a child, polyc and numpy are timed in alternating blocks
(their idle thread pools spin; see ``bench_onnx._median_pair``) and the medians are
compared.
Each figure is printed with a correctness check against numpy, and each thread count's
matmuls end in a summary line (geometric mean ratio, how many at least 1.0x).
"""
from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
# alternating blocks of each side, the median of their medians (the reason is in its doc)
from bench_onnx import _median_pair, summary  # noqa: E402

CONV = """
def conv2d(float(N,C,H,W) I, float(F,C,KH,KW) Wt) -> (O) {
    O(n,f,h,w) +=! I(n,c,h+kh,w+kw) * Wt(f,c,kh,kw)
}"""
MATMUL = """
def matmul(float(M,K) A, float(K,N) B) -> (C) {
    C(m,n) +=! A(m,k) * B(k,n)
}"""


def parse_shapes(sizes: str, rect: str) -> list[tuple[int, int, int]]:
    """(M, K, N) of each matmul: the squares of ``--sizes``, then the ``--rect`` shapes."""
    shapes = [(n, n, n) for n in (int(s) for s in sizes.split(",") if s.strip())]
    for r in (r for r in rect.split(",") if r.strip()):
        parts = r.lower().split("x")
        if len(parts) != 3 or not all(p.strip().isdigit() and int(p) > 0 for p in parts):
            raise SystemExit(f"--rect wants MxKxN with positive integers, got {r!r}")
        shapes.append(tuple(int(p) for p in parts))  # type: ignore[arg-type]
    return shapes


def child(threads: int, repeat: int, shapes: list[tuple[int, int, int]],
          conv_too: bool = True, rounds: int = 3) -> None:
    import numpy as np

    import polyc

    rng = np.random.default_rng(0)
    mm = polyc.define(MATMUL, threads=threads)
    ratios: list[float] = []
    checks: list[bool] = []
    for m, k, n in shapes:
        A = rng.standard_normal((m, k), dtype=np.float32)
        B = rng.standard_normal((k, n), dtype=np.float32)
        ok = np.allclose(mm(A, B), A @ B, rtol=1e-3, atol=1e-2 * np.sqrt(k))
        tp, tn = _median_pair(lambda: mm(A, B), lambda: A @ B, repeat, rounds)
        flops = 2.0 * m * k * n
        print(f"matmul {m}x{k}x{n} f32  threads={threads}  polyc {flops / tp / 1e9:7.1f} GFLOP/s"
              f"  numpy {flops / tn / 1e9:7.1f} GFLOP/s  ratio {tn / tp:5.2f}  correct={ok}",
              flush=True)
        ratios.append(tn / tp)
        checks.append(ok)
    summary(f"matmul threads={threads}", "shapes", "speed ratio polyc/numpy", ratios, checks,
            "at least 1.0x numpy's speed", lambda r: r >= 1.0)
    if not conv_too:
        return

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
    tp, tn = _median_pair(lambda: conv(I, Wt), numpy_conv, repeat, rounds)
    flops = 2.0 * N * F * OH * OW * C * K * K
    print(f"conv2d {N}x{C}x{H}x{W} * {F}x{C}x{K}x{K} f32  threads={threads}  polyc "
          f"{flops / tp / 1e9:7.1f} GFLOP/s  numpy(im2col+sgemm) {flops / tn / 1e9:7.1f} GFLOP/s"
          f"  ratio {tn / tp:5.2f}  correct={ok}", flush=True)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--repeat", type=int, default=7, help="runs in a block")
    p.add_argument("--rounds", type=int, default=3,
                   help="blocks of each side, alternating (the median of their medians)")
    p.add_argument("--sizes", default="1024", help="comma-separated square matmul sizes "
                   "(e.g. 256,512,1024,2048; empty for none)")
    p.add_argument("--rect", default="", help="comma-separated rectangular matmuls MxKxN "
                   "(e.g. 1024x256x2048: A is MxK, B is KxN)")
    p.add_argument("--no-conv", action="store_true", help="matmuls only")
    p.add_argument("--threads", default="1,2")
    p.add_argument("--child", type=int, help=argparse.SUPPRESS)
    a = p.parse_args()
    shapes = parse_shapes(a.sizes, a.rect)
    if a.child:
        child(a.child, a.repeat, shapes, not a.no_conv, a.rounds)
        return
    for t in (int(x) for x in a.threads.split(",")):
        # a fresh polyc cache: libraries built afresh, as bench_polybench's
        cache = tempfile.mkdtemp(prefix="polyc-bench-")
        env = dict(os.environ, OMP_NUM_THREADS=str(t), OPENBLAS_NUM_THREADS=str(t),
                   OMP_PROC_BIND="close", POLYC_CACHE_DIR=cache)
        # this machine may set these for old OpenBLAS builds; they slow a current numpy
        env.pop("OPENBLAS_CORETYPE", None), env.pop("OPENBLAS_L2_SIZE", None)
        try:
            subprocess.run([sys.executable, __file__, "--child", str(t), "--repeat",
                            str(a.repeat), "--rounds", str(a.rounds), "--sizes", a.sizes,
                            "--rect", a.rect] + (["--no-conv"] if a.no_conv else []),
                           env=env, check=True)
        finally:
            shutil.rmtree(cache, ignore_errors=True)


if __name__ == "__main__":
    main()
