"""C loop nests as input (issue 11, part 4): ``polyc.scop`` reads the ``#pragma scop``
region of a C function (pycparser), keeps C's program order (statements sharing loops),
runs it against a Python transcription of the same loops, and every schedule primitive
works on it: stencils skewed and tiled, illegal steps refused with the dependence.
"""
from __future__ import annotations

import os
import sys

import numpy as np
import pytest

import polyc
from polyc.errors import ParseError, ScheduleError, SemanticError, UnsupportedError

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
                                "examples", "benchmarks"))
#: the kernels' C (shared with examples/benchmarks/bench_scop.py)
from scop_kernels import GEMM, HEAT_3D, JACOBI_1D, JACOBI_2D, SEIDEL_2D  # noqa: E402





TRIANGLE = r"""
void lower(int N, float L[N][N], float x[N])
{
#pragma scop
  for (int i = 0; i < N; i++)
    for (int j = 0; j < N; j++)
      if (j <= i && i + j != 3)
        L[i][j] = L[i][j] * 2.0f + x[j];
      else
        L[i][j] = sqrtf(fabsf(x[i]));
#pragma endscop
}
"""


def ref_jacobi_1d(T, A, B):
    A, B = A.copy(), B.copy()
    c = np.float32(0.33333)
    for _ in range(T):
        B[1:-1] = c * (A[:-2] + A[1:-1] + A[2:])
        A[1:-1] = c * (B[:-2] + B[1:-1] + B[2:])
    return A, B


def ref_jacobi_2d(T, A, B):
    A, B = A.copy(), B.copy()
    for _ in range(T):
        # the C's order of the sums: centre, j - 1, j + 1, i - 1, i + 1
        B[1:-1, 1:-1] = 0.2 * (A[1:-1, 1:-1] + A[1:-1, :-2] + A[1:-1, 2:] + A[:-2, 1:-1]
                               + A[2:, 1:-1])
        A[1:-1, 1:-1] = 0.2 * (B[1:-1, 1:-1] + B[1:-1, :-2] + B[1:-1, 2:] + B[:-2, 1:-1]
                               + B[2:, 1:-1])
    return A, B


def ref_seidel_2d(T, A):
    A = A.copy()
    n = A.shape[0]
    for _ in range(T):
        for i in range(1, n - 1):
            for j in range(1, n - 1):
                A[i, j] = (A[i - 1, j - 1] + A[i - 1, j] + A[i - 1, j + 1] + A[i, j - 1]
                           + A[i, j] + A[i, j + 1] + A[i + 1, j - 1] + A[i + 1, j]
                           + A[i + 1, j + 1]) / 9.0
    return A


def run_jacobi_1d(op, T=5, N=37, seed=0):
    rng = np.random.default_rng(seed)
    A = rng.standard_normal(N).astype(np.float32)
    B = rng.standard_normal(N).astype(np.float32)
    want = ref_jacobi_1d(T, A, B)
    got = op(T=T, N=N, A=A, B=B)
    for g, w in zip(got, want):
        np.testing.assert_allclose(g, w, rtol=1e-5, atol=1e-6)
    return got


def test_jacobi_1d_runs_in_place_as_the_c_would():
    op = polyc.scop(JACOBI_1D, function="jacobi_1d")
    assert op.kernel.outputs == ("A", "B") and op.kernel.inputs == ()
    rng = np.random.default_rng(1)
    A = rng.standard_normal(33).astype(np.float32)
    B = np.zeros(33, np.float32)
    want = ref_jacobi_1d(4, A, B)
    A2, B2 = op(4, 33, A, B)  # positional, in the C parameter order
    assert A2 is A and B2 is B  # updated in place
    np.testing.assert_allclose(A, want[0], rtol=1e-5, atol=1e-6)
    text = str(op.schedule_space())
    assert "S0: [0, t, 0, i]" in text and "S1: [0, t, 1, i]" in text


def test_jacobi_1d_fused_skewed_tiled():
    op = polyc.scop(JACOBI_1D)
    s = op.schedule_space()
    fused = s.shift("S1", "i", 1).fuse(2, "S0", "S1")
    with pytest.raises(ScheduleError) as info:
        fused.tile("S0", ("t", "i"), (4, 16))  # rectangular tiles of an unskewed stencil
    msg = str(info.value)
    assert "dependence S1 -> S0 of A" in msg and "legal after skew('S0', 't', 'i', 2)" in msg
    tiled = fused.skew("S0", "t", "i", 2).tile("S0", ("t", "i"), (4, 16))
    for T, N in ((5, 37), (1, 3), (9, 70)):
        run_jacobi_1d(op.with_schedule(tiled), T, N)
    with pytest.raises(ScheduleError, match="parallel\\('S0', 't'\\) is illegal"):
        tiled.parallel("S0", "t")


def test_jacobi_2d_time_tiled_with_parallel_wavefront_free_inner_loops():
    op = polyc.scop(JACOBI_2D)
    rng = np.random.default_rng(2)
    N, T = 23, 4
    A, B = rng.standard_normal((N, N)), rng.standard_normal((N, N))
    want = ref_jacobi_2d(T, A, B)
    s = op.schedule_space().parallel("S0", "i").parallel("S1", "i").vectorize("S0", "j")
    got = op.with_schedule(s)(T=T, N=N, A=A.copy(), B=B.copy())
    for g, w in zip(got, want):
        np.testing.assert_allclose(g, w, rtol=1e-12)
    got = op(T=T, N=N, A=A.copy(), B=B.copy())  # polyc's own schedule
    for g, w in zip(got, want):
        np.testing.assert_allclose(g, w, rtol=1e-12)


def test_seidel_2d_needs_skewing():
    op = polyc.scop(SEIDEL_2D)
    s = op.schedule_space()
    with pytest.raises(ScheduleError, match="parallel\\('S0', 'j'\\) is illegal"):
        s.parallel("S0", "j")
    with pytest.raises(ScheduleError, match="interchange\\('S0', 't', 'i'\\) is illegal"):
        s.interchange("S0", "t", "i")
    with pytest.raises(ScheduleError, match="unroll_and_jam\\('S0', 'i', 2\\) is illegal"):
        s.unroll_and_jam("S0", "i", 2)  # i inside j: breaks the (i - 1, j + 1) dependence
    wave = s.skew("S0", "t", "i", 1).skew("S0", "t", "j", 1).skew("S0", "i", "j", 1) \
        .tile("S0", ("t", "i", "j"), (2, 4, 8))
    rng = np.random.default_rng(3)
    A = rng.standard_normal((13, 13))
    want = ref_seidel_2d(3, A)
    got = op.with_schedule(wave)(T=3, N=13, A=A.copy())
    np.testing.assert_allclose(got, want, rtol=1e-12)
    np.testing.assert_allclose(op(T=3, N=13, A=A.copy()), want, rtol=1e-12)


def test_gemm_with_scalars_and_compound_assignments():
    op = polyc.scop(GEMM, function="gemm")
    rng = np.random.default_rng(4)
    C = rng.standard_normal((17, 23))
    A, B = rng.standard_normal((17, 9)), rng.standard_normal((9, 23))
    want = 0.5 * C + 1.5 * (A @ B)
    got = op(17, 23, 9, 1.5, 0.5, C, A, B)
    assert got is C
    np.testing.assert_allclose(C, want, rtol=1e-12)
    s = op.schedule_space().tile("S1", ("k", "j"), (4, 8)).parallel("S0", "i")
    C2 = rng.standard_normal((17, 23))
    want2 = 0.5 * C2 + 1.5 * (A @ B)
    op.with_schedule(s)(17, 23, 9, 1.5, 0.5, C2, A, B)
    np.testing.assert_allclose(C2, want2, rtol=1e-12)


def test_if_else_and_math_calls():
    op = polyc.scop(TRIANGLE)
    rng = np.random.default_rng(5)
    L = rng.standard_normal((9, 9)).astype(np.float32)
    x = rng.standard_normal(9).astype(np.float32)
    want = L.copy()
    for i in range(9):
        for j in range(9):
            want[i, j] = L[i, j] * 2 + x[j] if j <= i and i + j != 3 else np.sqrt(abs(x[i]))
    np.testing.assert_allclose(op(N=9, L=L, x=x), want, rtol=1e-6)


@pytest.mark.parametrize("body, words, line", [
    ("A[i * i] = 1.0f;", "an index of A must be affine", 5),
    ("A[i] = g(A[i]);", "unknown function 'g'", 5),
    ("while (1) A[i] = 0.0f;", "While is not supported", 5),
    ("A[i] = A[i] + Q;", "unknown name 'Q'", 5),
    ("A[i] = (i + 1) / 2;", "integer division", 5),
])
def test_unsupported_c_is_refused_with_line_and_column(body, words, line):
    src = ("void f(int N, float A[N])\n{\n#pragma scop\n  for (int i = 0; i < N; i++)\n"
           f"    {body}\n#pragma endscop\n}}\n")
    with pytest.raises((UnsupportedError, SemanticError)) as info:
        polyc.scop(src)
    err = info.value
    assert words in str(err) and err.line == line and err.col is not None
    assert "^" in str(err)  # the source line with a caret


def test_bad_signatures_and_loops():
    with pytest.raises(UnsupportedError, match="pointer"):
        polyc.scop("void f(int N, float *A) { A[0] = 1.0f; }")
    with pytest.raises(UnsupportedError, match="step by \\+1"):
        polyc.scop("void f(int N, float A[N]) { for (int i = 0; i < N; i += 2) A[i] = 0.0f; }")
    with pytest.raises(SemanticError, match="no function 'g'"):
        polyc.scop("void f(int N, float A[N]) { A[0] = 1.0f; }", function="g")
    with pytest.raises(ParseError, match="C syntax error"):
        polyc.scop("void f(int N, float A[N]) { A[0] = ; }")
    with pytest.raises(polyc.CallError, match="must be a float32\\[5\\]"):
        polyc.scop("void f(int N, float A[N]) { for (int i = 0; i < N; i++) A[i] = 1.0f; }")(
            N=5, A=np.zeros(4, np.float32))


PROGRAM = r"""
#include <stdio.h>

/* gemm as a program: the region is replaced, main stays */
void kernel_gemm(int NI, int NJ, int NK, double alpha, double beta,
                 double C[NI][NJ], double A[NI][NK], double B[NK][NJ])
{
  int i, j, k;
#pragma scop
  for (i = 0; i < NI; i++) {
    for (j = 0; j < NJ; j++)
      C[i][j] *= beta;
    for (k = 0; k < NK; k++)
      for (j = 0; j < NJ; j++)
        C[i][j] += alpha * A[i][k] * B[k][j];
  }
#pragma endscop
}

int main(void)
{
  enum { NI = 37, NJ = 41, NK = 29 };
  static double A[NI][NK], B[NK][NJ], C[NI][NJ];
  for (int i = 0; i < NI; i++)
    for (int k = 0; k < NK; k++) A[i][k] = (double)((i * k + 1) % 7) / 7.0;
  for (int k = 0; k < NK; k++)
    for (int j = 0; j < NJ; j++) B[k][j] = (double)((k + 2 * j) % 5) / 5.0;
  for (int i = 0; i < NI; i++)
    for (int j = 0; j < NJ; j++) C[i][j] = (double)(i - j) / 3.0;
  kernel_gemm(NI, NJ, NK, 1.5, 0.5, C, A, B);
  double sum = 0;
  for (int i = 0; i < NI; i++)
    for (int j = 0; j < NJ; j++) sum += C[i][j] * (1 + (i + j) % 3);
  printf("%.9f\n", sum);
  return 0;
}
"""


def test_command_line_rewrites_the_c_file(tmp_path):
    """``polyc compile file.c --emit c``: the same program, its region replaced by a call
    of polyc's code; it builds and prints what the original prints."""
    import subprocess

    from test_cli import polyc as run_cli
    src = tmp_path / "gemm.c"
    src.write_text(PROGRAM)
    done = run_cli("compile", str(src), "--emit", "c")
    assert done.returncode == 0, done.stderr
    out = tmp_path / "gemm.polyc.c"
    out.write_text(done.stdout)
    assert "(void)polyc_kernel_gemm" in done.stdout and "int main(void)" in done.stdout
    printed = []
    for c in (src, out):
        exe = tmp_path / (c.stem + ".exe")
        subprocess.run(["gcc", "-O2", "-fopenmp", "-o", str(exe), str(c), "-lm"], check=True)
        printed.append(subprocess.run([str(exe)], capture_output=True, text=True,
                                      check=True).stdout)
    assert printed[0] == printed[1] and printed[0].strip()
    done = run_cli("compile", str(src), "-o", str(tmp_path / "build"))
    assert done.returncode == 0, done.stderr
    assert (tmp_path / "build" / "gemm.polyc.c").exists()
    bad = tmp_path / "bad.c"
    bad.write_text("void f(int N, float A[N]) {\n#pragma scop\n  A[N * N] = 0.0f;\n"
                   "#pragma endscop\n}\n")
    done = run_cli("compile", str(bad), "--emit", "c")
    assert done.returncode != 0 and "Traceback" not in done.stderr
    assert "3:" in done.stderr and "affine" in done.stderr




def test_heat_3d_statements_sharing_the_time_loop_stay_in_order():
    """Two statements that feed each other across time steps: isl's scheduler takes
    minutes on them and its budget fallback once cut them apart in program order
    (illegal: S1 at t feeds S0 at t + 1). Now the time is bounded and the fallback is
    the source's own loop nest; the result is exact."""
    import time
    import warnings

    def ref(T, A, B):
        A, B = A.copy(), B.copy()
        for _ in range(T):
            for src, dst in ((A, B), (B, A)):
                c = src[1:-1, 1:-1, 1:-1]
                dst[1:-1, 1:-1, 1:-1] = c + 0.125 * (
                    src[2:, 1:-1, 1:-1] - 2 * c + src[:-2, 1:-1, 1:-1]) + 0.125 * (
                    src[1:-1, 2:, 1:-1] - 2 * c + src[1:-1, :-2, 1:-1]) + 0.125 * (
                    src[1:-1, 1:-1, 2:] - 2 * c + src[1:-1, 1:-1, :-2])
        return A, B
    rng = np.random.default_rng(6)
    A, B = rng.standard_normal((9, 9, 9)), rng.standard_normal((9, 9, 9))
    op = polyc.scop(HEAT_3D)
    t0 = time.monotonic()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", polyc.errors.PolycWarning)
        got = op(T=3, N=9, A=A.copy(), B=B.copy())
    assert time.monotonic() - t0 < 90
    for g, w in zip(got, ref(3, A, B)):
        np.testing.assert_allclose(g, w, rtol=1e-12)


@pytest.mark.parametrize("scheduler", ["isl", "pluto"])
def test_c_input_on_the_cuda_target(scheduler):
    """A C region compiled for CUDA (run by the CPU emulation): statements sharing the
    time loop, arrays updated in place through the host wrapper."""
    op = polyc.scop(JACOBI_1D, target="cuda", emulate=True, scheduler=scheduler)
    run_jacobi_1d(op, T=4, N=37)
    op = polyc.scop(GEMM, target="cuda", emulate=True, scheduler=scheduler)
    rng = np.random.default_rng(9)
    C, A, B = (rng.standard_normal((17, 23)), rng.standard_normal((17, 9)),
               rng.standard_normal((9, 23)))
    want = 0.5 * C + 1.5 * (A @ B)
    np.testing.assert_allclose(op(17, 23, 9, 1.5, 0.5, C, A, B), want, rtol=1e-12)


@pytest.mark.parametrize("threads", [1, 2])
def test_gemm_scaling_is_distributed_from_the_product(threads):
    """``C[i][j] *= beta`` and the product's ``k`` loop share the ``i`` loop, and no
    dependence runs from the product back to the scaling: the nest is distributed
    (``scheduler._distributed``), the product alone gets its register tile, and the
    result stays the C's, bit for bit (the sums keep their order), at sizes that are no
    multiple of the tiles."""
    op = polyc.scop(GEMM, function="gemm", threads=threads)
    rng = np.random.default_rng(7)
    sizes = dict(NI=61, NJ=75, NK=53)
    C = rng.standard_normal((61, 75))
    A, B = rng.standard_normal((61, 53)), rng.standard_normal((53, 75))
    want = C * 0.5
    for k in range(53):  # the C's own order of the sums
        want = want + 1.5 * A[:, k:k + 1] * B[k:k + 1, :]
    src = op.compiled_for(sizes).c_source
    assert "polyc_acc" in src
    op(61, 75, 53, 1.5, 0.5, C, A, B)
    np.testing.assert_allclose(C, want, rtol=1e-13, atol=1e-13)


def test_c_nests_with_a_backward_dependence_stay_together():
    """jacobi-1d's two sweeps share the time loop and each reads what the other wrote
    at the step before: no cut between them is legal, so they stay one run even under
    ``fusion="min"`` (which cuts wherever it may)."""
    from polyc.deps import compute_dependences
    from polyc.schedule.scheduler import fusion_groups
    kernel = polyc.scop(JACOBI_1D, function="jacobi_1d").kernel
    deps = compute_dependences(kernel)
    assert [len(g) for g in fusion_groups(kernel, "min", deps.validity)] == [2]
    gemm = polyc.scop(GEMM, function="gemm").kernel
    groups = fusion_groups(gemm, "smart", compute_dependences(gemm).validity)
    assert [[s.name for s in g] for g in groups] == [["S0"], ["S1"]]


@pytest.mark.parametrize("threads", [1, 2])
def test_time_tiles_sweep_long_rows(threads):
    """A time-skewed jacobi-1d tile sweeps long rows (``optimize._stencil_rows``: up to
    2048 points, a few tiles a thread kept for the wavefront), not 64-point ones, and
    its tiles of unequal sizes still run as a wavefront at 2 threads; exact results."""
    import re
    op = polyc.scop(JACOBI_1D, function="jacobi_1d", threads=threads)
    src = op.compiled_for(dict(T=150, N=20001)).c_source
    spans = [int(m) for m in re.findall(r"c5 <= polyc_min_i64\(19999, [^;]*?\+ (\d+)\);", src)]
    assert spans and min(spans) >= 1000, spans
    if threads == 2:  # (one parallel region, each front's tiles shared)
        assert "#pragma omp parallel num_threads(2)" in src and "#pragma omp for" in src
    run_jacobi_1d(op, T=150, N=20001)  # (checks against numpy)
