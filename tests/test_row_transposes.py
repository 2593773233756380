"""Sums along the rows of a row-major matrix, ``y(i) +=! A(i,j) * x(j)``, on in-register
transposes (``codegen.c_family._Walker._rows_variant``): the rows-only dot tile loads
whole rows, transposes blocks of them so that each vector lane is one row, and adds
each column's terms in order. Checked against numpy at sizes that are no multiple of a
vector, both float types, both schedulers, 1 and 2 threads; the sums' order bit for bit
against a sequential reference; the transposes themselves; the value forms it takes and
those it leaves to the plain loop; 256-bit vectors (two groups of lanes per tile)."""
from __future__ import annotations

import ctypes
import os
import re
import subprocess
import sys

import numpy as np
import pytest

import polyc
from polyc.codegen import c_expr, c_family
from polyc.codegen.toolchain import asan_runtime, sanitizer_environment
from polyc.schedule import register_tile

SRC = "def mv({t}(M,N) A, {t}(N) x) -> (y) {{ y(i) +=! A(i,j) * x(j) }}"
TYPES = {"float": np.float32, "double": np.float64}
WIDE = register_tile.vector_bits() >= 256  # the variant is planned for 256 or 512 bits


def _transposed(op, sizes) -> bool:
    return "polyc_transpose_" in op.compiled_for(sizes).c_source


def _exact_data(rng, m: int, n: int, t):
    """Values of at most 11 significant bits over a wide range of exponents: every
    product is exact in float32, so FMA or not gives the same terms, while the sums'
    roundings depend on their order."""
    def values(shape, spread):
        mant = rng.integers(-1024, 1024, shape).astype(np.float64)
        return (mant * 2.0 ** rng.integers(-spread, spread, shape)).astype(t)
    wide = 1 if t == np.float32 else 3  # (double holds more: spread its values more)
    return values((m, n), 12 * wide), values(n, 6 * wide)


def _sequential(a, x):
    """Each row's sum in column order, rounded to the type at each step."""
    acc = np.zeros(a.shape[0], a.dtype)
    for j in range(a.shape[1]):
        acc = (acc + a[:, j] * x[j]).astype(a.dtype)
    return acc


@pytest.mark.parametrize("scheduler", ["isl", "pluto"])
@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize("m,n", [(2003, 1001), (37, 13), (17, 16), (16, 47), (3, 17), (1, 1)])
@pytest.mark.parametrize("dtype", ["float", "double"])
def test_row_sums_match_numpy(dtype, m, n, threads, scheduler):
    rng = np.random.default_rng(m * n + threads)
    t = TYPES[dtype]
    a, x = rng.standard_normal((m, n)).astype(t), rng.standard_normal(n).astype(t)
    op = polyc.define(SRC.format(t=dtype), threads=threads, scheduler=scheduler)
    want = (a.astype(np.float64) @ x.astype(np.float64)).astype(t)
    np.testing.assert_allclose(op(a, x), want, rtol=1e-4 if dtype == "float" else 1e-12,
                               atol=1e-3 if dtype == "float" else 1e-12)
    if WIDE and m >= 16 and n >= 16 and threads == 1:
        assert _transposed(op, {"M": m, "N": n})


@pytest.mark.parametrize("dtype", ["float", "double"])
def test_each_row_sums_in_column_order(dtype):
    """Bit for bit the sequential sum of each row (a reassociated sum, as BLAS does,
    rounds differently on these values), through full tiles and a partial last one,
    full blocks of columns and a tail."""
    t = TYPES[dtype]
    a, x = _exact_data(np.random.default_rng(5), 203, 109, t)
    op = polyc.define(SRC.format(t=dtype), threads=1)
    got = op(a, x)
    np.testing.assert_array_equal(got, _sequential(a, x))
    assert not np.array_equal(got, (a.astype(np.float64) @ x.astype(np.float64)).astype(t)
                              if dtype == "float" else a @ x)
    if WIDE:
        assert _transposed(op, {"M": 203, "N": 109})


@pytest.mark.parametrize("kind,lanes", [("f32", 16), ("f32", 8), ("f64", 8), ("f64", 4)])
def test_transpose_helper(kind, lanes, tmp_path):
    """``polyc_transpose_<kind>x<lanes>`` turns ``v[r][l]`` into ``v[l][r]`` (compiled for
    this machine: gcc lowers the vectors it lacks to narrower ones)."""
    ctype = "float" if kind == "f32" else "double"
    vec = f"polyc_{kind}x{lanes}"
    src = tmp_path / "t.c"
    src.write_text("#include <stdint.h>\n#include <string.h>\n"
                   + c_expr.vector_types(kind, lanes) + "\n"
                   + c_expr.transpose_helper(kind, lanes) + f"""
void run({ctype} *m) {{
  {vec} v[{lanes}];
  memcpy(v, m, sizeof v);
  polyc_transpose_{kind}x{lanes}(v);
  memcpy(m, v, sizeof v);
}}
""")
    lib = tmp_path / "t.so"
    subprocess.run(["gcc", "-O2", "-march=native", "-shared", "-fPIC", "-Wall", "-Werror",
                    str(src), "-o", str(lib)], check=True)
    dt = np.float32 if kind == "f32" else np.float64
    m = np.arange(lanes * lanes, dtype=dt).reshape(lanes, lanes)
    out = m.copy()
    ctypes.CDLL(str(lib)).run(out.ctypes.data_as(ctypes.c_void_p))
    np.testing.assert_array_equal(out, m.T)


FORMS = {
    # (TC value, numpy of A, x; whether the variant takes it)
    "scaled": ("1.5 * A(i,j) * x(j)", lambda a, x: 1.5 * a @ x, True),
    "swapped": ("x(j) * A(i,j)", lambda a, x: a @ x, True),
    "divided": ("A(i,j) / x(j) - 2.0 * A(i,j+0)", None, False),  # two row reads
    "negated": ("-A(i,j) * x(j) + x(j)", lambda a, x: -(a @ x) + x.sum(), True),
    "plain sum": ("A(i,j)", lambda a, x: a.sum(1), True),
    "row read": ("A(i,j) * x(j) * b(i)", None, False),
    "function": ("exp(A(i,j)) * x(j)", lambda a, x: np.exp(a) @ x, False),
    # the row array read a second time: its block would stand for both reads
    "corner": ("A(i,j) * A(0,0)", lambda a, x: a.sum(1) * a[0, 0], False),
}


@pytest.mark.parametrize("form", sorted(FORMS))
def test_value_forms(form):
    value, ref, taken = FORMS[form]
    src = (f"def f(float(M,N) A, float(N) x, float(M) b) -> (y) "
           f"{{ y(i) +=! {value} }}")
    rng = np.random.default_rng(3)
    a = rng.uniform(0.5, 1.5, (45, 67)).astype(np.float32)
    x = rng.uniform(0.5, 1.5, 67).astype(np.float32)
    b = rng.uniform(0.5, 1.5, 45).astype(np.float32)
    op = polyc.define(src, threads=1)
    got = op(a, x, b)
    a64, x64 = a.astype(np.float64), x.astype(np.float64)
    if form == "divided":
        want = (a64 / x64).sum(1) - 2.0 * a64.sum(1)
    elif form == "row read":
        want = (a64 @ x64) * b
    else:
        want = ref(a64, x64)
    np.testing.assert_allclose(got, want, rtol=2e-5, atol=1e-4)
    if WIDE:
        assert _transposed(op, {"M": 45, "N": 67}) == taken


@pytest.mark.parametrize("m,n", [(16, 16), (37, 53)])
def test_gram_matrix_reads_its_rows_twice(m, n):
    """``C(i,k) +=! A(i,j) * A(k,j)`` (PolyBench's syrk is of this form) reads the row
    array twice: the plain loop, and the right sums."""
    src = "def g(float(M,N) A) -> (C) { C(i,k) +=! A(i,j) * A(k,j) }"
    a = np.random.default_rng(m).standard_normal((m, n)).astype(np.float32)
    op = polyc.define(src, threads=1)
    np.testing.assert_allclose(op(a), a.astype(np.float64) @ a.T.astype(np.float64),
                               rtol=1e-4, atol=1e-4)
    assert not _transposed(op, {"M": m, "N": n})


def test_few_rows_keep_the_plain_loop():
    """A tile of fewer rows than half a vector's lanes (7 rows of float32 on AVX-512, 3
    on AVX2) keeps the plain loop: a transpose of mostly empty rows costs more than it
    saves."""
    rows = max(1, register_tile.vector_bits() // 32 // 2 - 1)
    a = np.random.default_rng(10).standard_normal((rows, 3000)).astype(np.float32)
    x = np.random.default_rng(11).standard_normal(3000).astype(np.float32)
    op = polyc.define(SRC.format(t="float"), threads=1)
    np.testing.assert_allclose(op(a, x), a @ x, rtol=1e-4, atol=1e-3)
    assert not _transposed(op, {"M": rows, "N": 3000})


def test_offset_rows_and_batches():
    """A read along ``j`` with an offset (``A(b, i + 1, j + 2)``) and an iterator outside
    the tile (a batch): the tile's rows and columns are the read's own."""
    src = ("def f(float(B,M,N) A, float(B,K) x) -> (y) "
           "{ y(b,i) +=! A(b,i+1,j+2) * x(b,j) where i in 0:M-1, j in 0:N-2 }")
    rng = np.random.default_rng(4)
    a = rng.standard_normal((3, 41, 53)).astype(np.float32)
    x = rng.standard_normal((3, 51)).astype(np.float32)
    op = polyc.define(src, threads=1)
    got = op(a, x)
    want = np.einsum("bij,bj->bi", a[:, 1:, 2:].astype(np.float64), x.astype(np.float64))
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)
    if WIDE:
        assert _transposed(op, {"B": 3, "M": 41, "N": 53, "K": 51})


@pytest.mark.parametrize("dtype", ["float", "double"])
def test_256_bit_vectors(dtype, monkeypatch):
    """Tiles planned for 256-bit vectors: 8 float lanes (two groups for 16 rows) or 4
    doubles, each group its own chain; the same bits as the sequential sums."""
    if register_tile.vector_bits() < 256:
        pytest.skip("no 256-bit vectors on this CPU")
    monkeypatch.setattr(register_tile, "vector_bits", lambda: 256)
    t = TYPES[dtype]
    a, x = _exact_data(np.random.default_rng(6), 101, 77, t)
    op = polyc.define(SRC.format(t=dtype), threads=1)
    np.testing.assert_array_equal(op(a, x), _sequential(a, x))
    src = op.compiled_for({"M": 101, "N": 77}).c_source
    lanes = 8 if dtype == "float" else 4
    assert f"polyc_transpose_{'f32' if dtype == 'float' else 'f64'}x{lanes}(" in src
    assert "polyc_s1" in src  # rows past the lanes: a second group


def test_without_the_variant_the_same_results(monkeypatch):
    """The switch off: the plain rows, the same sums (the exact data), no transposes."""
    a, x = _exact_data(np.random.default_rng(7), 64, 100, np.float32)
    monkeypatch.setattr(c_family, "ROW_TRANSPOSES", False)
    op = polyc.define(SRC.format(t="float"), threads=1)
    np.testing.assert_array_equal(op(a, x), _sequential(a, x))
    assert not _transposed(op, {"M": 64, "N": 100})


_CHILD = """
import numpy as np, polyc
src = {src!r}
rng = np.random.default_rng(8)
for dt, t in (("float", np.float32), ("double", np.float64)):
    a, x = rng.standard_normal((38, 50)).astype(t), rng.standard_normal(50).astype(t)
    op = polyc.define(src.format(t=dt), threads=1, sanitize=True,
                      cflags=("-Wall", "-Wextra", "-Werror"))
    assert np.allclose(op(a, x), a @ x, rtol=1e-4, atol=1e-4)
    print("ok", dt, "polyc_transpose_" in op.compiled_for({{"M": 38, "N": 50}}).c_source,
          flush=True)
"""


@pytest.mark.skipif(asan_runtime() is None, reason="gcc has no libasan.so")
def test_warning_free_and_sanitized():
    """The variant's C compiles without warnings under -Wall -Wextra -Werror and runs
    clean under AddressSanitizer and UBSan (every row load inside the matrix)."""
    done = subprocess.run([sys.executable, "-c", _CHILD.format(src=SRC)],
                          env=sanitizer_environment(), capture_output=True, text=True,
                          timeout=600, check=False,
                          cwd=os.path.dirname(os.path.abspath(__file__)))
    report = f"stdout:\n{done.stdout[-3000:]}\nstderr:\n{done.stderr[-5000:]}"
    assert done.returncode == 0, report
    for dt in ("float", "double"):
        assert f"ok {dt} {WIDE}" in done.stdout, report


def test_cuda_target_keeps_its_mapping():
    """The CUDA target has no such variant (its dialect); the matrix-vector product is
    right there too (the CPU emulation)."""
    rng = np.random.default_rng(9)
    a, x = rng.standard_normal((37, 45)).astype(np.float32), rng.standard_normal(45).astype(np.float32)
    op = polyc.define(SRC.format(t="float"), target="cuda", emulate=True)
    np.testing.assert_allclose(op(a, x), a @ x, rtol=1e-4, atol=1e-4)
    assert not re.search(r"polyc_transpose_\w+\(", op.cuda_source or "")
