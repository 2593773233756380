"""Calling an operator from ``polyc.define`` with bad arguments: every mistake is a
``polyc.CallError`` whose message names the argument and what is wrong (never a crash,
never a silent cast); unusual but valid arrays (transposed, strided, unaligned, read-only)
give the right result. Each check runs with specialised code (the default) and with one
generic library (``specialize=False``): the two take different paths before the C call.
"""
from __future__ import annotations

import numpy as np
import pytest

import polyc

MATMUL = """
def matmul(float(M,K) A, float(K,N) B) -> (C) {
    C(m,n) +=! A(m,k) * B(k,n)
}"""

SCALE = """
def scale(float(N) X, float s) -> (Y) {
    Y(i) = X(i) * s
}"""

ISCALE = """
def iscale(int32(N) X, int32 s) -> (Y) {
    Y(i) = X(i) * s
}"""


@pytest.fixture(params=[True, False], ids=["specialized", "generic"])
def specialize(request):
    return request.param


@pytest.fixture
def mm(specialize):
    return polyc.define(MATMUL, specialize=specialize)


def f32(*shape, seed=0):
    return np.random.default_rng(seed).standard_normal(shape).astype(np.float32)


A, B = f32(7, 5), f32(5, 3, seed=1)


def _raises(op, args, pattern):
    with pytest.raises(polyc.CallError, match=pattern) as info:
        op(*args)
    return info.value


def test_good_call(mm):
    C = mm(A, B)
    assert C.shape == (7, 3) and C.dtype == np.float32 and C.flags.c_contiguous
    np.testing.assert_allclose(C, A @ B, rtol=1e-5, atol=1e-5)


def test_wrong_dtype_float64(mm):
    _raises(mm, (A, B.astype(np.float64)),
            r"input 'B' \(argument 1\): expected dtype float32, got float64")
    _raises(mm, (A.astype(np.float64), B), r"input 'A' .*expected dtype float32, got float64"
            r".*astype\(np\.float32\)")


def test_int32_into_float32(mm):
    _raises(mm, (A.astype(np.int32), B), r"input 'A' .*expected dtype float32, got int32")


@pytest.mark.parametrize("dtype", [np.float16, np.bool_, np.complex64, ">f4"])
def test_other_dtypes_are_not_cast(mm, dtype):
    _raises(mm, (A, B.astype(dtype)), r"input 'B' .*expected dtype float32, got")


def test_int_kernel_refuses_floats(specialize):
    op = polyc.define(ISCALE, specialize=specialize)
    X = np.arange(4, dtype=np.int32)
    np.testing.assert_array_equal(op(X, 3), X * 3)
    _raises(op, (X.astype(np.float32), 3), r"input 'X' .*expected dtype int32, got float32")
    _raises(op, (X.astype(np.int64), 3), r"input 'X' .*expected dtype int32, got int64")
    _raises(op, (X, 2.0), r"input 's' .*int32, got float")


def test_int_scalar_out_of_range(specialize):
    op = polyc.define(ISCALE, specialize=specialize)
    _raises(op, (np.arange(4, dtype=np.int32), 2**40), r"input 's'")


def test_scalar_inputs(specialize):
    op = polyc.define(SCALE, specialize=specialize)
    X = np.arange(4, dtype=np.float32)
    for s in (2, 2.5, np.float32(2.5), np.array(2.5, np.float32)):
        np.testing.assert_allclose(op(X, s), X * np.float32(s))
    _raises(op, (X, True), r"input 's' .*float32, got bool")
    _raises(op, (X, "2"), r"input 's' .*float32, got str")
    _raises(op, (X, None), r"input 's' .*float32, got NoneType")
    _raises(op, (X, [2.0]), r"input 's'.*(expected rank 0, got shape \(1,\)|expected a numpy array)")
    _raises(op, (X, np.array(2.5)), r"input 's' .*expected dtype float32, got float64")


@pytest.mark.parametrize("args, pattern", [
    ((A, B[0]), r"input 'B'.*expected rank 2, got shape \(3,\)"),
    ((A[None], B), r"input 'A'.*expected rank 2, got shape \(1, 7, 5\)"),
    ((A.reshape(-1), B), r"input 'A'.*expected rank 2, got shape \(35,\)"),
    ((A, np.float32(1)), r"input 'B'.*expected rank 2, got shape \(\)"),
], ids=["rank1", "rank3", "flat", "scalar"])
def test_wrong_rank(mm, args, pattern):
    _raises(mm, args, pattern)


def test_inconsistent_sizes(mm):
    err = _raises(mm, (A, f32(6, 3)),
                  r"size K is 5 from dimension 1 of 'A' but 6 from dimension 0 of 'B'")
    assert isinstance(err, ValueError)  # CallError is also a ValueError


def test_too_many_arguments(mm):
    _raises(mm, (A, B, B), r"matmul takes 2 inputs \(A, B\), got 3")


def test_too_few_arguments_when_sizes_are_bound(specialize):
    op = polyc.define("def add(float(N) A, float(N) B) -> (C) {\n  C(i) = A(i) + B(i)\n}",
                      specialize=specialize)
    _raises(op, (np.ones(3, np.float32),), r"add takes 2 inputs \(A, B\), got 1")


@pytest.mark.parametrize("args", [(A,), ()], ids=["one", "none"])
def test_too_few_arguments(mm, args):
    _raises(mm, args, r"matmul takes 2 inputs \(A, B\), got " + str(len(args)))


@pytest.mark.parametrize("bad", [A.tolist(), tuple(map(tuple, A.tolist())), None, "A", 1.5,
                                 {"A": 1}, memoryview(A), np.empty((7, 5), object)],
                         ids=["list", "tuple", "None", "str", "float", "dict", "memoryview",
                              "object-array"])
def test_non_array_argument(mm, bad):
    """Anything that is not a float32 ndarray is refused by name (lists included: they
    are never converted, as dtypes are never guessed)."""
    _raises(mm, (bad, B), r"input 'A'.*(numpy array of float32|rank 2|dtype float32)")


def test_ragged_list_argument(mm):
    _raises(mm, ([[1.0, 2.0], [3.0]], B), r"input 'A'")


@pytest.mark.parametrize("args, pattern", [
    ((f32(0, 5), B), r"array 'A': dimension 0 \(M\) is 0 .*at least 1"),
    ((f32(7, 0), f32(0, 3)), r"array 'A': dimension 1 \(K\) is 0 .*at least 1"),
    ((A, f32(5, 0)), r"array 'B': dimension 1 \(N\) is 0 .*at least 1"),
], ids=["M", "K", "N"])
def test_zero_size_dimension(mm, args, pattern):
    _raises(mm, args, pattern)


def _unaligned(a: np.ndarray) -> np.ndarray:
    buf = np.zeros(a.nbytes + 1, np.uint8)
    out = np.frombuffer(buf.data, dtype=a.dtype, count=a.size, offset=1).reshape(a.shape)
    out[...] = a
    assert not out.flags.aligned
    return out


@pytest.mark.parametrize("make_a", [
    lambda: A.copy(),                                 # contiguous, for reference
    lambda: f32(5, 7, seed=3).T,                      # transposed view (Fortran order)
    lambda: f32(7, 10, seed=4)[:, ::2],               # strided columns
    lambda: f32(7, 5, seed=5)[::-1],                  # negative stride
    lambda: np.broadcast_to(f32(1, 5, seed=6), (7, 5)),  # zero stride, read-only
    lambda: _unaligned(A),
], ids=["contiguous", "transposed", "strided", "reversed", "broadcast", "unaligned"])
def test_unusual_layouts_give_the_right_result(mm, make_a):
    a = make_a()
    before = a.copy()
    C = mm(a, B)
    np.testing.assert_allclose(C, np.asarray(a) @ B, rtol=1e-5, atol=1e-5)
    np.testing.assert_array_equal(a, before)  # inputs are never written


def test_transposed_operands_both(mm):
    a, b = f32(5, 7, seed=7).T, f32(3, 5, seed=8).T
    np.testing.assert_allclose(mm(a, b), a @ b, rtol=1e-5, atol=1e-5)


def test_results_are_fresh_arrays(mm):
    C1 = mm(A, B)
    C2 = mm(A, B)
    assert C1 is not C2 and not np.shares_memory(C1, C2)
    C1[...] = 0
    np.testing.assert_allclose(C2, A @ B, rtol=1e-5, atol=1e-5)


def test_errors_leave_the_operator_usable(mm):
    with pytest.raises(polyc.CallError):
        mm(A, f32(6, 3))
    with pytest.raises(polyc.CallError):
        mm(A.astype(np.float64), B)
    np.testing.assert_allclose(mm(A, B), A @ B, rtol=1e-5, atol=1e-5)


def test_compiled_for_names_the_sizes_it_lacks():
    """``compiled_for`` without a size the kernel has: a CallError naming it; a value for
    a name that is no size is ignored (it used to reach code generation: KeyError)."""
    op = polyc.define(MATMUL)
    with pytest.raises(polyc.CallError, match=r"compiled_for takes a value for each of its "
                       r"sizes \['M', 'K', 'N'\]; missing: \['N'\]"):
        op.compiled_for({"M": 4, "K": 5})
    src = op.compiled_for({"M": 4, "K": 5, "N": 6, "Q": 2}).c_source
    assert "Q" not in src.split("*/")[0]
