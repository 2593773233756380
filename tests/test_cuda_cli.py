"""``polyc compile FILE.tc --target cuda``: the ``.cu``, the C header and the library
(nvcc, or g++ with the CPU emulation under ``--emulate``), ``--emit cuda`` and ``--emit
report``; a C program and ctypes call the emulated library and are checked against numpy."""
from __future__ import annotations

import ctypes
import os
import shutil
import subprocess

import numpy as np
import pytest
from test_cli import MATMUL_TC, assert_clean_failure, polyc

import polyc as polyc_pkg

NVCC = shutil.which(polyc_pkg.Options().nvcc)
needs_nvcc = pytest.mark.skipif(NVCC is None, reason="nvcc not found (POLYC_NVCC)")

MAIN_C = r"""
#include <math.h>
#include <stdio.h>
#include "matmul.h"

enum { M = 9, K = 37, N = 33 };

int main(void)
{
    static float A[M * K], B[K * N], C[M * N];
    for (int i = 0; i < M * K; i++) A[i] = (float)((i * 7) % 11) - 5.0f;
    for (int i = 0; i < K * N; i++) B[i] = (float)((i * 5) % 13) - 6.0f;
    const int status = matmul(M, K, N, A, B, C);
    if (status != 0) {
        printf("status %d: %s\n", status, matmul_last_error());
        return status;
    }
    for (int m = 0; m < M; m++)
        for (int n = 0; n < N; n++) {
            float want = 0;
            for (int k = 0; k < K; k++) want += A[m * K + k] * B[k * N + n];
            if (fabsf(C[m * N + n] - want) > 1e-3f) {
                printf("C[%d][%d] = %g, expected %g\n", m, n, C[m * N + n], want);
                return 9;
            }
        }
    printf("ok\n");
    return 0;
}
"""


def _link_and_run(out: str) -> subprocess.CompletedProcess:
    main = os.path.join(out, "main.c")
    with open(main, "w") as f:
        f.write(MAIN_C)
    exe = os.path.join(out, "main")
    subprocess.run(["gcc", "-O1", "-o", exe, main, "-I", out, "-L", out, "-l:matmul.so",
                    f"-Wl,-rpath,{out}", "-lm"], check=True, capture_output=True, text=True)
    return subprocess.run([exe], capture_output=True, text=True, timeout=120, check=False)


def test_emulated_library_from_the_command_line(tmp_path):
    out = str(tmp_path)
    done = polyc("compile", MATMUL_TC, "--target", "cuda", "--emulate", "-o", out)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["wrote", *(os.path.join(out, "matmul" + e)
                                              for e in (".so", ".h", ".cu"))]
    with open(os.path.join(out, "matmul.cu")) as f:
        cu = f.read()
    assert "__global__" in cu and "POLYC_LAUNCH(" in cu
    with open(os.path.join(out, "matmul.h")) as f:
        header = f.read()
    assert "int matmul(int64_t M, int64_t K, int64_t N" in header
    assert "matmul_last_error(void)" in header and 'extern "C"' in header
    # a C caller linked against the library
    run = _link_and_run(out)
    assert run.returncode == 0 and run.stdout == "ok\n", run.stdout + run.stderr
    # ctypes against numpy
    lib = ctypes.CDLL(os.path.join(out, "matmul.so"))
    rng = np.random.default_rng(0)
    A = rng.standard_normal((17, 40)).astype(np.float32)
    B = rng.standard_normal((40, 70)).astype(np.float32)
    C = np.full((17, 70), np.nan, np.float32)
    ptr = ctypes.POINTER(ctypes.c_float)
    lib.matmul.argtypes = [ctypes.c_int64] * 3 + [ptr] * 3
    lib.matmul.restype = ctypes.c_int
    status = lib.matmul(17, 40, 70, *(a.ctypes.data_as(ptr) for a in (A, B, C)))
    assert status == 0
    np.testing.assert_allclose(C, A @ B, rtol=1e-4, atol=1e-4)
    lib.matmul.argtypes = [ctypes.c_int64] * 3 + [ptr] * 3
    assert lib.matmul(0, 40, 70, *(a.ctypes.data_as(ptr) for a in (A, B, C))) == 1  # sizes


def test_emit_cuda_prints_the_source():
    done = polyc("compile", MATMUL_TC, "--target", "cuda", "--emit", "cuda")
    assert done.returncode == 0, done.stderr
    assert "__global__ void __launch_bounds__(256, 1) polyc_kernel" in done.stdout
    assert 'POLYC_EXPORT int matmul(' in done.stdout
    header = polyc("compile", MATMUL_TC, "--target", "cuda", "--emit", "header")
    assert header.returncode == 0 and "matmul_last_error" in header.stdout


@pytest.mark.parametrize("argv", [
    ["--emit", "cuda"], ["--emit", "report"], ["--emulate"], ["--gpu-arch", "sm_90"],
    ["--target", "cuda", "--emit", "c"], ["--target", "cuda", "--gpu-block", "32,x"],
    ["--target", "cuda", "--gpu-arch", "80"],
])
def test_cuda_flags_are_checked(argv):
    assert_clean_failure(polyc("compile", MATMUL_TC, *argv))


@needs_nvcc
def test_emit_report_with_ptxas_figures():
    done = polyc("compile", MATMUL_TC, "--target", "cuda", "--emit", "report",
                 "--sizes", "M=256,K=256,N=256", "--gpu-arch", "sm_90")
    assert done.returncode == 0, done.stderr
    text = done.stdout
    assert "GPU report: matmul for sm_90 (K=256, M=256, N=256)" in text
    assert "registers" in text and "occupancy" in text
    assert "write C[m, n]: coalesced" in text
    assert "read  B[k, n]: coalesced" in text and "bank conflict" in text
    assert "registers: C[4][2] per thread" in text


@needs_nvcc
def test_emit_report_of_a_whole_model():
    model = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
                         "examples", "mlp.onnx")
    done = polyc("compile", model, "--target", "cuda", "--emit", "report", "--quiet")
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("GPU report: model mlp for sm_80")
    assert "\noperator " in done.stdout and "ptxas:" in done.stdout


@needs_nvcc
def test_nvcc_library_from_the_command_line(tmp_path):
    """The nvcc-built library links like the C target's; without a usable GPU its
    call returns 4 and says why (with one, the C caller checks the product)."""
    out = str(tmp_path)
    done = polyc("compile", MATMUL_TC, "--target", "cuda", "-o", out)
    assert done.returncode == 0, done.stderr
    run = _link_and_run(out)
    if run.returncode == 4:
        assert run.stdout.startswith("status 4: no usable CUDA device: cudaGetDeviceCount "
                                     "returned"), run.stdout
    else:
        assert run.returncode == 0 and run.stdout == "ok\n", run.stdout + run.stderr


BENCH_GPU = os.path.join(os.path.dirname(MATMUL_TC), "benchmarks", "bench_gpu.py")


def _bench_gpu(*args: str) -> subprocess.CompletedProcess:
    import sys
    return subprocess.run([sys.executable, BENCH_GPU, *args], capture_output=True, text=True,
                          timeout=600, check=False)


@needs_nvcc
def test_bench_gpu_refuses_politely_without_a_gpu():
    done = _bench_gpu("--sizes", "256", "--repeat", "2")
    assert done.returncode == 0, done.stderr
    if "no GPU benchmark" in done.stdout:  # here: no driver
        assert "cudaGetDeviceCount returned" in done.stdout and "--report" in done.stdout
    else:  # a machine with a GPU: the figures, each with its check
        assert "GEMM float32" in done.stdout and "  256: polyc" in done.stdout


@needs_nvcc
def test_bench_gpu_report():
    done = _bench_gpu("--report")
    assert done.returncode == 0, done.stderr
    text = done.stdout
    assert "GPU report: matmul for sm_80 (K=1024, M=1024, N=1024)" in text
    assert "GPU report: conv for sm_80 (C=64, F=64, H=58, KH=3, KW=3, N=1, W=58)" in text
    assert text.count("ptxas:") >= 4 and text.count("occupancy:") >= 4
    assert "read  I[n, c, (h + kh), (w + kw)]: coalesced" in text
    assert "bank conflict" in text and "Traceback" not in done.stderr
