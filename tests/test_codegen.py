"""C generation: hand-built kernels, simple schedules, results against numpy.

Every kernel is compiled with ``-Wall -Wextra -Werror``: the generated C must be
warning-free.
"""
from __future__ import annotations

import re

import islpy as isl
import numpy as np
import pytest
from codegen_helpers import (
    WARNINGS_AS_ERRORS,
    ZERO,
    I,
    J,
    fused_matmul_schedule,
    kernel,
    matmul,
    read,
    sequence_schedule,
    statement,
)
from polyc.codegen import compile_kernel, generate_c, sanitize
from polyc.codegen.c_expr import BodyPrinter, Piece, binary, literal

import polyc
from polyc import expr as E
from polyc import ir
from polyc.errors import CallError
from polyc.options import Options

RNG = np.random.default_rng(0)


@pytest.fixture
def options(tmp_path):
    return Options(cache_dir=str(tmp_path), cflags=WARNINGS_AS_ERRORS)


def rand(*shape, dtype=np.float32):
    return RNG.standard_normal(shape).astype(dtype)


@pytest.mark.parametrize("m, k, n", [(1, 1, 1), (7, 5, 3), (37, 7, 1), (1, 37, 7)])
def test_matmul_fused_parallel(options, m, k, n):
    knl = matmul()
    fn = compile_kernel(knl, fused_matmul_schedule(knl), options)
    a, b = rand(m, k), rand(k, n)
    (c,) = fn([a, b])
    np.testing.assert_allclose(c, a @ b, rtol=1e-5, atol=1e-5)
    assert "#pragma omp parallel for\n" in fn.source.text


def test_signature_and_header(options):
    src = generate_c(matmul(), fused_matmul_schedule(matmul()), options)
    proto = ("int matmul(int64_t M, int64_t K, int64_t N, const float *restrict A, "
             "const float *restrict B, float *restrict C)")
    assert proto in src.text and proto + ";" in src.header
    assert src.arg_names == ("M", "K", "N", "A", "B", "C")
    assert "if (!(M >= 1 && K >= 1 && N >= 1))\n    return 1;" in src.text
    assert "C[m * N + n] += A[m * K + k] * B[k * N + n];" in src.text


def test_sequence_marks_simd_and_threads(options):
    knl = matmul()
    marks = {("S0", 0): ["parallel"], ("S0", 1): ["simd"], ("S1", 0): ["parallel"]}
    fn = compile_kernel(knl, sequence_schedule(knl, marks), options.replace(threads=3))
    text = fn.source.text
    assert text.count("#pragma omp parallel for num_threads(3)") == 2
    assert re.search(r"#pragma omp simd\n\s*for \(int64_t c1 = 0; c1 < N;", text)
    a, b = rand(7, 37), rand(37, 5)
    np.testing.assert_allclose(fn([a, b])[0], a @ b, rtol=1e-5, atol=1e-5)


def test_marks_respect_options(options):
    knl = matmul()
    sched = sequence_schedule(knl, {("S0", 0): ["parallel", "simd"]})
    assert "#pragma omp parallel for simd" in generate_c(knl, sched, options).text
    text = generate_c(knl, sched, options.replace(parallel=False, vectorize=False)).text
    assert "#pragma" not in text


def test_nested_parallel_mark_is_dropped(options):
    knl = matmul()
    sched = sequence_schedule(knl, {("S1", 0): ["parallel"], ("S1", 1): ["parallel"]})
    assert generate_c(knl, sched, options).text.count("omp parallel for") == 1


def test_specialised_sizes(options):
    knl = matmul().specialize({"M": 7, "K": 5, "N": 3})
    fn = compile_kernel(knl, fused_matmul_schedule(knl), options)
    assert "if (!(M == 7 && K == 5 && N == 3))" in fn.source.text
    assert "const int64_t N = 3;" in fn.source.text
    a, b = rand(7, 5), rand(5, 3)
    np.testing.assert_allclose(fn([a, b])[0], a @ b, rtol=1e-5, atol=1e-6)
    with pytest.raises(CallError, match="compiled for"):
        fn([rand(6, 5), b])
    # the C check itself, below the Python one
    c = np.zeros((6, 3), np.float32)
    assert fn._fn(6, 5, 3, rand(6, 5).ctypes.data, b.ctypes.data, c.ctypes.data) == 1


def test_parallel_mark_on_degenerate_loop_is_not_moved(options):
    """With M = 1 the band's outer loop disappears; the mark must not fall on loop n."""
    knl = matmul().specialize({"M": 1, "K": 4, "N": 5})
    text = generate_c(knl, fused_matmul_schedule(knl), options).text
    assert "pragma" not in text and "c1 < 5" in text.replace("c1 <= 4", "c1 < 5")


def test_elementwise_math_and_size_as_value(options):
    """Y[i,j] = exp(X[i,j]) / N + sigmoid(X[i,j]) * i - relu(-X[i,j]) + 2.5"""
    sizes = ("M", "N")
    M, N = E.Size("M"), E.Size("N")
    x = read("X", I, J)
    value = E.Binary("+", E.Binary("-", E.Binary("+",
        E.Binary("/", E.Call("exp", (x,)), N),
        E.Binary("*", E.Call("sigmoid", (x,)), I)),
        E.Call("relu", (E.Unary("-", x),))), E.Const(2.5))
    st = statement("S", sizes, ("i", "j"), (M, N), ("Y", (I, J)), "=", value)
    knl = kernel("ew", sizes, [ir.Array("X", "float32", (M, N)),
                               ir.Array("Y", "float32", (M, N), "output")], [st])
    fn = compile_kernel(knl, sequence_schedule(knl, {("S", 0): ["parallel"]}), options)
    assert "expf(" in fn.source.text and "(float)N" in fn.source.text and "2.5f" in fn.source.text
    X = rand(7, 37)
    ii = np.arange(7, dtype=np.float32)[:, None]
    want = np.exp(X) / 37 + 1 / (1 + np.exp(-X)) * ii - np.maximum(-X, 0) + 2.5
    np.testing.assert_allclose(fn([X])[0], want, rtol=1e-5, atol=1e-5)


def softmax_numerator() -> ir.Kernel:
    """mx[i] = -inf; mx[i] = max(mx[i], X[i,j]); Y[i,j] = exp(X[i,j] - mx[i]) (mx temporary)."""
    sizes = ("M", "N")
    M, N = E.Size("M"), E.Size("N")
    arrays = [ir.Array("X", "float64", (M, N)), ir.Array("Y", "float64", (M, N), "output"),
              ir.Array("mx", "float64", (M,), "temp")]
    return kernel("softmax_num", sizes, arrays, [
        statement("S0", sizes, ("i",), (M,), ("mx", (I,)), "=", E.Const(float("-inf"))),
        statement("S1", sizes, ("i", "j"), (M, N), ("mx", (I,)), "max", read("X", I, J)),
        statement("S2", sizes, ("i", "j"), (M, N), ("Y", (I, J)), "=",
                  E.Call("exp", (E.Binary("-", read("X", I, J), read("mx", I)),)))])


def test_temporary(options):
    knl = softmax_numerator()
    fn = compile_kernel(knl, sequence_schedule(knl), options)
    assert "polyc_bytes(M, sizeof(double))" in fn.source.text and "-HUGE_VAL" in fn.source.text
    assert "fmax(" in fn.source.text and "polyc_scratch(polyc_bytes0)" in fn.source.text
    for m, n in [(1, 1), (7, 37), (37, 7)]:
        X = rand(m, n, dtype=np.float64)
        want = np.exp(X - X.max(axis=1, keepdims=True))
        np.testing.assert_allclose(fn([X])[0], want, rtol=1e-12)


def test_rank0_output_and_scalar_input(options):
    """s = sum_i X[i] * alpha (alpha a rank-0 input), in float64."""
    sizes = ("N",)
    N = E.Size("N")
    arrays = [ir.Array("X", "float64", (N,)), ir.Array("alpha", "float64", ()),
              ir.Array("s", "float64", (), "output")]
    knl = kernel("dotsum", sizes, arrays, [
        statement("S0", sizes, (), (), ("s", ()), "=", E.Const(0)),
        statement("S1", sizes, ("i",), (N,), ("s", ()), "+",
                  E.Binary("*", read("X", I), read("alpha")))])
    fn = compile_kernel(knl, sequence_schedule(knl), options)
    X = rand(37, dtype=np.float64)
    (s,) = fn([X, 0.5])
    assert s.shape == () and s.dtype == np.float64
    np.testing.assert_allclose(s, X.sum() * 0.5)
    np.testing.assert_allclose(fn([X, np.array(2.0)])[0], X.sum() * 2)


def test_integer_and_bool_semantics(options):
    """floor division/modulo, integer max/min/abs, comparisons to bool, casts, select."""
    sizes = ("N",)
    N = E.Size("N")
    x = read("X", I)
    three = E.Const(3)
    arrays = [ir.Array("X", "int32", (N,)), ir.Array("Q", "int32", (N,), "output"),
              ir.Array("P", "bool", (N,), "output"), ir.Array("F", "float32", (N,), "output"),
              ir.Array("L", "int64", (N,), "output")]
    stmts = [
        statement("S0", sizes, ("i",), (N,), ("Q", (I,)), "=", E.Binary("+",
                  E.Binary("//", x, three), E.Binary("*", E.Binary("%", x, three), E.Const(100)))),
        statement("S1", sizes, ("i",), (N,), ("P", (I,)), "=", E.Binary("&&",
                  E.Binary(">", x, ZERO), E.Binary("<", x, E.Const(4)))),
        statement("S2", sizes, ("i",), (N,), ("F", (I,)), "=", E.Select(
                  E.Binary(">=", x, ZERO), E.Cast("float32", x), E.Const(float("inf")))),
        statement("S3", sizes, ("i",), (N,), ("L", (I,)), "=", E.Call("max", (
                  E.Call("abs", (x,)), E.Binary("*", I, N)))),
        statement("S4", sizes, ("i",), (N,), ("L", (I,)), "min", E.Const(float("inf"))),
        statement("S5", sizes, ("i",), (N,), ("P", (I,)), "*",
                  E.Cast("bool", E.Binary("*", E.Binary("-", x, E.Const(1)), three)))]
    knl = kernel("ints", sizes, arrays, stmts)
    fn = compile_kernel(knl, sequence_schedule(knl), options)
    X = np.array([-7, -3, -1, 0, 1, 2, 3, 5, 8], np.int32)
    q, p, f, lng = fn([X])
    np.testing.assert_array_equal(q, X // 3 + (X % 3) * 100)
    np.testing.assert_array_equal(p, (X > 0) & (X < 4) & (X != 1))
    np.testing.assert_array_equal(f, np.where(X >= 0, X.astype(np.float32), np.inf))
    np.testing.assert_array_equal(lng, np.maximum(np.abs(X), np.arange(9) * 9))
    assert "INT64_MAX" in fn.source.text and "P[i] = P[i] && (X[i] - 1) * 3 != 0;" in fn.source.text


def test_name_sanitisation(options):
    """Arrays called like C keywords, libm functions and loop variables, iterators called
    like arrays and loop variables, a kernel named after a libm function."""
    sizes = ("N", "double")
    N, D = E.Size("N"), E.Size("double")
    it, c1 = E.Index("int"), E.Index("c1")
    arrays = [ir.Array("int", "float32", (N, D)), ir.Array("exp", "float32", (D,)),
              ir.Array("c0", "float32", (N, D), "output"), ir.Array("y0", "float32", (N,), "temp")]
    stmts = [statement("S0", sizes, ("int", "c1"), (N, D), ("c0", (it, c1)), "=",
                       E.Binary("*", read("int", it, c1), E.Call("exp", (read("exp", c1),)))),
             statement("S1", sizes, ("int",), (N,), ("y0", (it,)), "=", E.Const(1.0)),
             statement("S2", sizes, ("int", "c1"), (N, D), ("c0", (it, c1)), "+", read("y0", it))]
    knl = ir.Kernel("exp", sizes, tuple(arrays), tuple(stmts), ("int", "exp"), ("c0",))
    fn = compile_kernel(knl, sequence_schedule(knl, {("S0", 0): ["parallel"]}), options)
    assert fn.source.function_name == "exp_"
    assert dict(fn.source.size_names) == {"N": "N", "double": "double_"}
    assert dict(fn.source.array_names) == {"int": "int_", "exp": "exp__1", "c0": "c0_",
                                           "y0": "y0_"}
    assert "const int64_t int__1 = c0;" in fn.source.text  # the iterator int, renamed
    assert "const int64_t c1_ = c1;" in fn.source.text
    a, e = rand(7, 5), rand(5)
    np.testing.assert_allclose(fn([a, e])[0], a * np.exp(e) + 1, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("name, expected", [
    ("int", "int_"), ("y0", "y0_"), ("c12", "c12_"), ("polyc_x", "polyc_x_"),
    ("a-b", "a_b"), ("1x", "v1x"), ("_T", "v_T"), ("", "v"), ("sqrtf", "sqrtf_"), ("A", "A")])
def test_sanitize(name, expected):
    assert sanitize(name) == expected


def test_literals_and_precedence():
    assert literal(float("inf"), "float32").text == "INFINITY"
    assert literal(float("-inf"), "float64").text == "-HUGE_VAL"
    assert literal(-2**31, "int32").text == "INT32_MIN"
    assert literal(float("-inf"), "int64").text == "INT64_MIN"
    assert literal(0.1, "float32").text == "0.1f" and literal(3, "float64").text == "3.0"
    a, b, c = Piece("a"), Piece("b"), Piece("c")
    assert binary("-", a, binary("-", b, c)).text == "a - (b - c)"
    assert binary("*", binary("+", a, b), c).text == "(a + b) * c"
    assert binary("||", binary("&&", a, b), c).text == "(a && b) || c"
    assert binary("<", binary("<", a, b), c).text == "(a < b) < c"
    p = BodyPrinter({"X": "float32"}, {"X": ()}, {}, {"X": "X"}, {})
    assert p.expr(E.Unary("-", E.Const(-1)), "int32").text == "-(-1)"
    assert p.expr(E.Binary("-", read("X"), E.Unary("-", read("X"))), "float32").text == "X[0] - -X[0]"
    assert p.expr(read("X"), "float64").text == "(double)X[0]"


def test_isl_guards_are_emitted(options):
    """A triangular domain (j <= i) yields bounds from isl, and a guard that depends on
    the loop iterators is printed; none that the context implies."""
    sizes = ("N",)
    N = E.Size("N")
    dom = isl.Set("[N] -> { S[i, j] : 0 <= j <= i < N and (i + j) mod 2 = 0 }")
    st = ir.Statement("S", dom, ("i", "j"), ir.Access("Y", (I, J)), "=", E.Const(1.0))
    knl = ir.Kernel("tri", sizes, (ir.Array("Y", "float32", (N, N), "output"),), (st,), (), ("Y",))
    fn = compile_kernel(knl, sequence_schedule(knl), options)
    assert "N >= 1" not in fn.source.text.split("return 1;")[1]
    (y,) = fn([], sizes={"N": 7})
    ii, jj = np.indices((7, 7))
    np.testing.assert_array_equal(y, ((jj <= ii) & ((ii + jj) % 2 == 0)).astype(np.float32))


def test_libm_functions_run_as_libmvec_vectors():
    """erf and exp in a SIMD loop call glibc's vector variants (libmvec, declared ``omp
    declare simd`` by the prelude), within a few ulp of numpy's / math's values."""
    import ctypes
    import math
    import platform
    import subprocess
    op = polyc.define("def f(float(N) X) -> (Y) { Y(i) = erf(X(i)) + exp(X(i)) }")
    x = np.linspace(-4, 4, 1001).astype(np.float32)
    x[::97] = np.array([0.0, -0.0, 1e-30, -1e-30, 3.5, -3.5, 10.0, -10.0, 0.5, -0.5, 1.0],
                       np.float32)
    y = op(x)
    want = np.array([math.erf(v) + math.exp(v) for v in x.astype(np.float64)])
    np.testing.assert_allclose(y, want, rtol=4e-7, atol=1e-7)
    glibc = ctypes.CDLL(None).gnu_get_libc_version
    glibc.restype = ctypes.c_char_p
    major, minor = (int(v) for v in glibc().decode().split(".")[:2])
    if (major, minor) < (2, 35) or platform.machine() != "x86_64":
        pytest.skip("no vector erf: glibc before 2.35, or not x86-64")
    syms = subprocess.run(["nm", "-D", op.compiled_for({"N": 1001}).library_path],
                          capture_output=True, text=True, check=True).stdout
    assert re.search(r"_ZGV\w+_erff", syms) and re.search(r"_ZGV\w+_expf", syms), syms


@pytest.mark.parametrize("extra,split", [(4, True), (1, False), (0, False)])
def test_short_vector_loop_remainder_is_a_loop_of_its_own(extra, split, tmp_path):
    """A vector loop of a constant trip count just past a whole number of vectors runs
    its remainder as a second ``omp simd`` loop (vectorized with narrower vectors)
    instead of gcc's element-by-element epilogue; a remainder of one is left alone, and
    so is a loop without one."""
    from polyc.codegen.c_family import TAIL_LANES as lanes
    n = lanes + extra
    op = polyc.define("def f(float(M,N) A, float(N) b) -> (B) { B(m,n) = A(m,n) * b(n) + 1 }",
                      cache_dir=str(tmp_path), cflags=WARNINGS_AS_ERRORS)
    a, b = rand(3, n), rand(n)
    np.testing.assert_allclose(op(a, b), a * b + 1, rtol=1e-6)
    text = op.c_source
    loops = re.findall(r"#pragma omp simd\n\s*for \(int64_t (c\d+) = (\d+); \1 <= (\d+);", text)
    if split:
        assert [(lo, hi) for _, lo, hi in loops] == [("0", str(lanes - 1)),
                                                     (str(lanes), str(n - 1))], text
    else:
        assert [(lo, hi) for _, lo, hi in loops] == [("0", str(n - 1))], text
