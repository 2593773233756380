"""The ``polyc`` command line, run as a subprocess (``python -m polyc`` and, when it is
installed, the ``polyc`` console script), including a C program that links the library
it writes."""
from __future__ import annotations

import os
import shutil
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
MATMUL_TC = os.path.join(ROOT, "examples", "matmul.tc")

LAUNCHERS = [pytest.param([sys.executable, "-m", "polyc"], id="python-m")]
if shutil.which("polyc"):
    LAUNCHERS.append(pytest.param([shutil.which("polyc")], id="console-script"))


def polyc(*args: str, launcher: list[str] | None = None, cwd: str | None = None):
    done = subprocess.run([*(launcher or LAUNCHERS[0].values[0]), *args], capture_output=True,
                          text=True, timeout=300, check=False, cwd=cwd)
    return done


def assert_clean_failure(done, code: int | None = None):
    """A non-zero exit with a one-line ``polyc: error`` and no Python traceback."""
    assert done.returncode != 0, done.stdout
    if code is not None:
        assert done.returncode == code, (done.returncode, done.stderr)
    assert "Traceback" not in done.stderr, done.stderr
    assert "polyc: error" in done.stderr, done.stderr


@pytest.mark.parametrize("launcher", LAUNCHERS)
def test_help(launcher):
    done = polyc("--help", launcher=launcher)
    assert done.returncode == 0, done.stderr
    assert "compile" in done.stdout
    sub = polyc("compile", "--help", launcher=launcher)
    assert sub.returncode == 0, sub.stderr
    for flag in ("--emit", "--sizes", "--fusion", "--tile", "-o"):
        assert flag in sub.stdout


def test_no_command_is_a_usage_error():
    done = polyc()
    assert done.returncode == 2 and "usage" in done.stderr and "Traceback" not in done.stderr


def test_machine_prints_what_polyc_plans_with():
    """``polyc machine``: the caches and vector width the rules read, the register tiles
    they give, and the strided-panel probe (the environment's value here: conftest)."""
    from polyc.schedule import machine, register_tile
    done = polyc("machine")
    assert done.returncode == 0, done.stderr
    out = done.stdout
    assert f"L1d: {machine.l1d_bytes() // 1024} KiB" in out
    assert f"L2: {machine.l2_bytes() // 1024} KiB" in out
    assert f"vector width: {register_tile.vector_bits()} bits" in out
    shape = register_tile.machine_shape("float32", __import__("polyc").Options())
    assert f"register tile float32: {shape[0]} x {shape[1]}" in out
    assert "strided panel cost: 1.00 (packing from the default rows)" in out
    slow = subprocess.run([sys.executable, "-m", "polyc", "machine"], capture_output=True,
                          text=True, timeout=300, check=False,
                          env={**os.environ, "POLYC_STRIDED_PANEL_COST": "1.6"})
    assert "strided panel cost: 1.60 (packing from fewer rows)" in slow.stdout, slow.stderr


MAIN_C = r"""
#include <math.h>
#include <stdio.h>
#include "matmul.h"

enum { M = 7, K = 5, N = 3 };

int main(void)
{
    float A[M][K], B[K][N], C[M][N], R[M][N];
    for (int m = 0; m < M; m++)
        for (int k = 0; k < K; k++)
            A[m][k] = (float)((m * 3 + k * 7) % 11) - 5.0f;
    for (int k = 0; k < K; k++)
        for (int n = 0; n < N; n++)
            B[k][n] = (float)((k * 5 + n * 2) % 9) * 0.5f - 2.0f;
    for (int m = 0; m < M; m++)
        for (int n = 0; n < N; n++) {
            C[m][n] = 12345.0f;  /* the kernel initialises its output (+=!) */
            R[m][n] = 0.0f;
            for (int k = 0; k < K; k++)
                R[m][n] += A[m][k] * B[k][n];
        }
    int status = matmul(M, K, N, &A[0][0], &B[0][0], &C[0][0]);
    if (status != 0) {
        printf("status %d\n", status);
        return 2;
    }
    int bad = 0;
    for (int m = 0; m < M; m++)
        for (int n = 0; n < N; n++)
            if (fabsf(C[m][n] - R[m][n]) > 1e-4f * (1.0f + fabsf(R[m][n]))) {
                printf("C[%d][%d] = %g, expected %g\n", m, n, C[m][n], R[m][n]);
                bad = 1;
            }
    /* sizes outside the kernel's context are refused with status 1 */
    if (matmul(0, K, N, &A[0][0], &B[0][0], &C[0][0]) != 1) {
        printf("M = 0 was not refused\n");
        bad = 1;
    }
    if (!bad)
        printf("matmul ok\n");
    return bad;
}
"""


@pytest.mark.parametrize("launcher", LAUNCHERS)
def test_compile_library_and_link_it_from_c(launcher, tmp_path):
    out = tmp_path / "out dir"  # a space in the path survives
    done = polyc("compile", MATMUL_TC, "-o", str(out), launcher=launcher)
    assert done.returncode == 0, done.stderr
    for ext in ("so", "h", "c"):
        assert (out / f"matmul.{ext}").is_file(), os.listdir(out)
    assert "matmul.so" in done.stdout
    header = (out / "matmul.h").read_text()
    assert "int matmul(int64_t M, int64_t K, int64_t N," in header
    assert "#pragma omp parallel for" in (out / "matmul.c").read_text()

    main_c = tmp_path / "main.c"
    main_c.write_text(MAIN_C)
    exe = tmp_path / "main"
    cc = os.environ.get("POLYC_CC", "gcc")
    build = subprocess.run([cc, "-std=c11", "-Wall", "-Wextra", "-Werror", str(main_c),
                            f"-I{out}", str(out / "matmul.so"), "-fopenmp", "-lm",
                            f"-Wl,-rpath,{out}", "-o", str(exe)],
                           capture_output=True, text=True, timeout=120, check=False)
    assert build.returncode == 0, build.stderr
    run = subprocess.run([str(exe)], capture_output=True, text=True, timeout=60, check=False,
                         env=dict(os.environ, OMP_NUM_THREADS="2"))
    assert run.returncode == 0, run.stdout + run.stderr
    assert run.stdout.strip() == "matmul ok"


def test_default_output_directory_is_build(tmp_path):
    done = polyc("compile", MATMUL_TC, cwd=str(tmp_path))
    assert done.returncode == 0, done.stderr
    assert sorted(os.listdir(tmp_path / "build")) == ["matmul.c", "matmul.h", "matmul.so"]


def test_emit_c_is_parallel():
    done = polyc("compile", MATMUL_TC, "--emit", "c")
    assert done.returncode == 0, done.stderr
    assert "#pragma omp parallel for" in done.stdout
    assert "int matmul(int64_t M, int64_t K, int64_t N" in done.stdout


def test_emit_header():
    done = polyc("compile", MATMUL_TC, "--emit", "header")
    assert done.returncode == 0, done.stderr
    assert "int matmul(" in done.stdout and "#include <stdint.h>" in done.stdout
    assert "#pragma" not in done.stdout


def test_emit_schedule():
    done = polyc("compile", MATMUL_TC, "--emit", "schedule")
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("{ domain:"), done.stdout[:200]
    assert "S0[m, n]" in done.stdout and "S1[m, n, k]" in done.stdout
    assert 'mark: "parallel"' in done.stdout


def test_emit_ir():
    done = polyc("compile", MATMUL_TC, "--emit", "ir")
    assert done.returncode == 0, done.stderr
    assert "kernel matmul(A, B) -> (C)" in done.stdout
    assert "input  float32(M, K) A" in done.stdout
    assert "C(m, n) +=" in done.stdout


def test_emit_deps():
    done = polyc("compile", MATMUL_TC, "--emit", "deps")
    assert done.returncode == 0, done.stderr
    assert "flow:" in done.stdout and "reduction:" in done.stdout


def test_sizes_specialise_the_code():
    done = polyc("compile", MATMUL_TC, "--emit", "c", "--sizes", "M=7,K=5,N=3")
    assert done.returncode == 0, done.stderr
    assert "specialised for K = 5, M = 7, N = 3" in done.stdout
    generic = polyc("compile", MATMUL_TC, "--emit", "c")
    assert "specialised" not in generic.stdout


def test_fusion_min():
    done = polyc("compile", MATMUL_TC, "--emit", "schedule", "--fusion", "min")
    assert done.returncode == 0, done.stderr
    assert "sequence" in done.stdout  # init and update in separate nests
    bad = polyc("compile", MATMUL_TC, "--fusion", "most")
    assert bad.returncode == 2 and "invalid choice" in bad.stderr


def test_tile_sizes():
    done = polyc("compile", MATMUL_TC, "--emit", "c", "--tile", "4,4,4")
    assert done.returncode == 0, done.stderr
    assert "+= 4" in done.stdout
    sched = polyc("compile", MATMUL_TC, "--emit", "schedule", "--tile", "4,4,4")
    assert sched.returncode == 0 and "(m) mod 4" in sched.stdout, sched.stdout[:500]
    untiled = polyc("compile", MATMUL_TC, "--emit", "schedule", "--tile", "none")
    assert untiled.returncode == 0 and "mod" not in untiled.stdout
    assert_clean_failure(polyc("compile", MATMUL_TC, "--tile", "4,x"))
    assert_clean_failure(polyc("compile", MATMUL_TC, "--tile", "0,4"), code=1)


def test_no_parallel_no_simd():
    done = polyc("compile", MATMUL_TC, "--emit", "c", "--no-parallel", "--no-simd")
    assert done.returncode == 0, done.stderr
    assert "#pragma omp" not in done.stdout


def test_syntax_error_has_file_line_col(tmp_path):
    bad = tmp_path / "bad.tc"
    bad.write_text("def f(float(N) A) -> (B) {\n    B(i) = A(i) +\n}\n")
    done = polyc("compile", str(bad), "-o", str(tmp_path / "out"))
    assert_clean_failure(done, code=1)
    assert f"{bad}:3:1:" in done.stderr, done.stderr
    assert not (tmp_path / "out").exists()


def test_semantic_error_has_file_line_col(tmp_path):
    bad = tmp_path / "sem.tc"
    bad.write_text("def f(float(N) A) -> (B) {\n    B(i) = Q(i)\n}\n")
    done = polyc("compile", str(bad), "--emit", "c")
    assert_clean_failure(done, code=1)
    assert f"{bad}:2:" in done.stderr and "Q" in done.stderr, done.stderr


def test_unknown_size_name(tmp_path):
    done = polyc("compile", MATMUL_TC, "--sizes", "M=7,Q=3", "-o", str(tmp_path))
    assert_clean_failure(done)
    assert "Q" in done.stderr and "M" in done.stderr


@pytest.mark.parametrize("sizes", ["M=x", "M", "M=-3", "M=99999999999999999999"])
def test_malformed_sizes(sizes):
    done = polyc("compile", MATMUL_TC, "--emit", "c", "--sizes", sizes)
    assert_clean_failure(done)
    assert "NAME=INT" in done.stderr


def test_zero_size_is_refused(tmp_path):
    assert_clean_failure(polyc("compile", MATMUL_TC, "-o", str(tmp_path), "--sizes", "M=0"))


def test_missing_file(tmp_path):
    done = polyc("compile", str(tmp_path / "nope.tc"))
    assert_clean_failure(done, code=1)
    assert "nope.tc" in done.stderr


def test_name_picks_a_def(tmp_path):
    src = tmp_path / "two.tc"
    src.write_text(open(MATMUL_TC).read() + "\ndef copy(float(N) X) -> (Y) {\n  Y(i) = X(i)\n}\n")
    both = polyc("compile", str(src), "--emit", "ir")
    assert_clean_failure(both, code=1)
    done = polyc("compile", str(src), "--name", "copy", "--emit", "ir")
    assert done.returncode == 0, done.stderr
    assert "kernel copy(X) -> (Y)" in done.stdout


def test_error_shows_the_source_line_and_a_caret(tmp_path):
    bad = tmp_path / "typo.tc"
    bad.write_text("def f(float(N) A) -> (B) {\n    B(i) = Bb(i)\n}\n")
    done = polyc("compile", str(bad), "--emit", "c")
    assert_clean_failure(done, code=1)
    lines = done.stderr.splitlines()
    assert lines[0] == f"polyc: error: {bad}:2:12: unknown tensor or function 'Bb' " \
                       "(did you mean 'B'?)", done.stderr
    assert lines[1:3] == ["        B(i) = Bb(i)", "               ^"], done.stderr


@pytest.mark.parametrize("name", ["model.txt", "matmul", "m.cpp"])
def test_unknown_extension_is_refused(tmp_path, name):
    src = tmp_path / name
    src.write_text(open(MATMUL_TC).read())
    done = polyc("compile", str(src), "--emit", "ir")
    assert_clean_failure(done)
    assert "cannot tell the language" in done.stderr, done.stderr
    for word in (".tc", ".onnx", "--lang tc", "--lang onnx"):
        assert word in done.stderr, done.stderr
    ok = polyc("compile", str(src), "--lang", "tc", "--emit", "ir")
    assert ok.returncode == 0, ok.stderr
    assert "kernel matmul(A, B) -> (C)" in ok.stdout


def test_tc_text_in_a_c_file_is_a_clean_c_error(tmp_path):
    src = tmp_path / "m.c"
    src.write_text(open(MATMUL_TC).read())
    done = polyc("compile", str(src), "--emit", "c")
    assert_clean_failure(done)
    assert "C syntax error" in done.stderr, done.stderr


def test_onnx_model_named_tc_is_refused(tmp_path):
    fake = tmp_path / "mlp.tc"
    fake.write_bytes(open(os.path.join(ROOT, "examples", "mlp.onnx"), "rb").read())
    done = polyc("compile", str(fake), "--emit", "c")
    assert_clean_failure(done, code=1)
    assert f"{fake}: not a TC-language source: the file is binary" in done.stderr, done.stderr
    assert "--lang onnx" in done.stderr


def test_tc_text_named_onnx_is_refused(tmp_path):
    fake = tmp_path / "matmul.onnx"
    fake.write_text(open(MATMUL_TC).read())
    done = polyc("compile", str(fake), "--emit", "c")
    assert_clean_failure(done, code=1)
    assert f"{fake}: not an ONNX model: the file is TC-language text" in done.stderr
    assert "--lang tc" in done.stderr
