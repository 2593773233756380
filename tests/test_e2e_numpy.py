"""End to end: TC operators compiled by polyc against numpy references.

Every case runs under every fusion mode, on sizes that are not multiples of the tile
sizes (1, 7, 37, 130 against the default tiles 32/64/512 and the explicit tiles below).
"""
from __future__ import annotations

import numpy as np
import pytest
from conftest import assert_matches_numpy, input_dtypes, random_inputs

import polyc

FUSIONS = ("min", "smart", "max")


def _windows(I, k, stride):
    win = np.lib.stride_tricks.sliding_window_view(I, (k, k), axis=(2, 3))
    return win[:, :, ::stride, ::stride]


def conv_ref(I, Wt, stride=1):
    return np.einsum("nchwij,fcij->nfhw", _windows(I, Wt.shape[2], stride), Wt)


def softmax_ref(X):
    e = np.exp(X - X.max(axis=1, keepdims=True))
    return e / e.sum(axis=1, keepdims=True)


CASES = {
    "matmul": ("""
def matmul(float(M,K) A, float(K,N) B) -> (C) {
    C(m,n) +=! A(m,k) * B(k,n)
}""", [[(7, 37), (37, 13)], [(1, 1), (1, 1)], [(130, 7), (7, 37)]], lambda A, B: A @ B),
    "batched_matmul": ("""
def bmm(float(B,M,K) X, float(B,K,N) Y) -> (Z) {
    Z(b,m,n) +=! X(b,m,k) * Y(b,k,n)
}""", [[(3, 7, 37), (3, 37, 13)], [(1, 1, 1), (1, 1, 1)]], lambda X, Y: X @ Y),
    "matvec": ("""
def matvec(float(M,K) A, float(K) x) -> (y) {
    y(m) +=! A(m,k) * x(k)
}""", [[(37, 130), (130,)], [(1, 7), (7,)]], lambda A, x: A @ x),
    "int8_matmul_nt": ("""
def nt(uint8(M,K) A, int8(N,K) B) -> (C) {
    C(m,n) +=! int32(A(m,k)) * int32(B(n,k))
}""", [[(7, 70), (13, 70)], [(1, 1), (1, 1)], [(37, 130), (9, 130)]],
        lambda A, B: A.astype(np.int32) @ B.astype(np.int32).T),
    "transpose": ("""
def transpose(float(M,N) A) -> (T) {
    T(j,i) = A(i,j)
}""", [[(37, 130)], [(1, 7)]], lambda A: A.T),
    "conv2d_stride1": ("""
def conv(float(N,C,H,W) I, float(F,C,KH,KW) Wt) -> (O) {
    O(n,f,h,w) +=! I(n,c,h+kh,w+kw) * Wt(f,c,kh,kw)
}""", [[(2, 3, 9, 11), (5, 3, 3, 3)], [(1, 1, 7, 7), (1, 1, 1, 1)]], conv_ref),
    "conv2d_stride2_where": ("""
def conv(float(N,C,H,W) I, float(F,C,3,3) Wt, float(F) bias) -> (O) {
    O(n,f,h,w) +=! I(n,c,2*h+kh,2*w+kw) * Wt(f,c,kh,kw) where kh in 0:3, kw in 0:3
    O(n,f,h,w) = O(n,f,h,w) + bias(f)
}""", [[(2, 3, 9, 12), (4, 3, 3, 3), (4,)], [(1, 2, 3, 3), (1, 2, 3, 3), (1,)]],
        lambda I, Wt, b: conv_ref(I, Wt, 2) + b[None, :, None, None]),
    "conv2d_padded": ("""
def conv_pad(float(N,C,H,W) I, float(F,C,3,3) Wt) -> (O) {
    O(n,f,h,w) +=! (h+kh-1 >= 0 && h+kh-1 < H && w+kw-1 >= 0 && w+kw-1 < W)
                   ? I(n,c,h+kh-1,w+kw-1) * Wt(f,c,kh,kw) : 0.0
        where h in 0:H, w in 0:W, kh in 0:3, kw in 0:3
}""", [[(2, 3, 9, 12), (4, 3, 3, 3)], [(1, 1, 1, 1), (1, 1, 3, 3)]],
        lambda I, Wt: conv_ref(np.pad(I, ((0, 0), (0, 0), (1, 1), (1, 1))), Wt)),
    "maxpool": ("""
def maxpool(float(N,C,H,W) I) -> (O) {
    O(n,c,h,w) max=! I(n,c,2*h+kh,2*w+kw) where kh in 0:2, kw in 0:2
}""", [[(2, 3, 9, 12)], [(1, 1, 2, 2)]], lambda I: _windows(I, 2, 2).max(axis=(4, 5))),
    "avgpool": ("""
def avgpool(float(N,C,H,W) I) -> (O) {
    O(n,c,h,w) +=! I(n,c,h+kh,w+kw) / 9.0 where kh in 0:3, kw in 0:3
}""", [[(2, 3, 9, 12)], [(1, 1, 3, 3)]], lambda I: _windows(I, 3, 1).mean(axis=(4, 5))),
    "softmax": ("""
def softmax(float(N,C) X) -> (Y) {
    mx(n) max=! X(n,c)
    e(n,c) = exp(X(n,c) - mx(n))
    s(n) +=! e(n,c)
    Y(n,c) = e(n,c) / s(n)
}""", [[(37, 130)], [(1, 1)], [(7, 3)]], softmax_ref),
    "log_softmax": ("""
def log_softmax(float(N,C) X) -> (Y) {
    mx(n) max=! X(n,c)
    s(n) +=! exp(X(n,c) - mx(n))
    Y(n,c) = X(n,c) - mx(n) - log(s(n))
}""", [[(37, 130)], [(1, 7)]], lambda X: np.log(softmax_ref(X))),
    "layernorm": ("""
def layernorm(float(N,D) X, float(D) gamma, float(D) beta) -> (Y) {
    mean(n) +=! X(n,d) / D
    var(n) +=! (X(n,d) - mean(n)) * (X(n,d) - mean(n)) / D
    Y(n,d) = (X(n,d) - mean(n)) / sqrt(var(n) + 1e-5) * gamma(d) + beta(d)
}""", [[(7, 130), (130,), (130,)], [(1, 1), (1,), (1,)]],
        lambda X, g, b: (X - X.mean(1, keepdims=True)) / np.sqrt(X.var(1, keepdims=True) + 1e-5)
        * g + b),
    "mlp_relu": ("""
def mlp(float(B,I) X, float(H,I) W1, float(H) b1, float(O,H) W2, float(O) b2) -> (Y) {
    h1(b,h) +=! X(b,i) * W1(h,i)
    a1(b,h) = fmax(h1(b,h) + b1(h), 0.0)
    Y(b,o) +=! a1(b,h) * W2(o,h)
    Y(b,o) = Y(b,o) + b2(o)
}""", [[(7, 37), (13, 37), (13,), (5, 13), (5,)], [(1, 1), (1, 1), (1,), (1, 1), (1,)]],
        lambda X, W1, b1, W2, b2: np.maximum(X @ W1.T + b1, 0) @ W2.T + b2),
    "tensordot": ("""
def tensordot(float(I,K,L) A, float(K,L,J) B) -> (C) {
    C(i,j) +=! A(i,k,l) * B(k,l,j)
}""", [[(7, 5, 3), (5, 3, 13)]], lambda A, B: np.tensordot(A, B, axes=2)),
    "outer": ("""
def outer(float(M) a, float(N) b) -> (O) {
    O(i,j) = a(i) * b(j)
}""", [[(37,), (13,)], [(1,), (1,)]], np.outer),
}


@pytest.mark.parametrize("fusion", FUSIONS)
@pytest.mark.parametrize("case", sorted(CASES))
def test_case_matches_numpy(case, fusion):
    src, shape_sets, ref = CASES[case]
    op = polyc.define(src, fusion=fusion)
    for seed, shapes in enumerate(shape_sets):
        inputs = random_inputs(list(zip(shapes, input_dtypes(op))), seed)
        assert_matches_numpy(op(*inputs), ref(*inputs), rtol=1e-4, atol=1e-4)


SCHEDULE_OPTIONS = [
    dict(tile=False),
    dict(tile=(5, 3, 7)),
    dict(tile=(2,), parallel=False, vectorize=False),
    dict(specialize=False),
    dict(threads=2),
]


@pytest.mark.parametrize("opts", SCHEDULE_OPTIONS, ids=str)
@pytest.mark.parametrize("case", ["matmul", "conv2d_stride2_where", "softmax", "mlp_relu",
                                  "int8_matmul_nt"])
def test_scheduler_options(case, opts):
    src, shape_sets, ref = CASES[case]
    for fusion in FUSIONS:
        op = polyc.define(src, fusion=fusion, **opts)
        for seed, shapes in enumerate(shape_sets):
            inputs = random_inputs(list(zip(shapes, input_dtypes(op))), seed)
            assert_matches_numpy(op(*inputs), ref(*inputs), rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("dtype,tc", [("float64", "double"), ("int32", "int32"),
                                      ("int64", "int64")])
def test_dtypes(dtype, tc):
    op = polyc.define(f"""
def matmul({tc}(M,K) A, {tc}(K,N) B) -> (C) {{
    C(m,n) +=! A(m,k) * B(k,n)
}}""")
    A, B = random_inputs([((7, 37), dtype), ((37, 13), dtype)])
    C = op(A, B)
    assert C.dtype == np.dtype(dtype)
    np.testing.assert_allclose(C, A @ B, rtol=1e-10)


def test_several_outputs_and_scalars():
    op = polyc.define("""
def stats(float(N) X) -> (total, biggest) {
    total +=! X(i)
    biggest max=! X(i)
}""")
    X, = random_inputs([((130,), "float32")])
    total, biggest = op(X)
    assert total.shape == () and biggest.shape == ()
    np.testing.assert_allclose(total, X.sum(), rtol=1e-5, atol=1e-5)
    assert biggest == X.max()


def test_several_defs_pick_by_name():
    src = CASES["matmul"][0] + CASES["transpose"][0]
    op = polyc.define(src, name="transpose")
    A, = random_inputs([((7, 13), "float32")])
    np.testing.assert_array_equal(op(A), A.T)
    with pytest.raises(polyc.CompileError):
        polyc.define(src)


def test_generated_matmul_is_tiled_parallel_and_vectorized():
    op = polyc.define(CASES["matmul"][0])
    A, B = random_inputs([((130, 70), "float32"), ((70, 600), "float32")])
    op(A, B)
    c = op.c_source
    assert "#pragma omp parallel for" in c
    assert "#pragma omp simd" in c
    # tile loops step by the tile sizes: at most 512 columns in whole register tiles
    # (600 columns run as 512 + 88 on one thread, as 320 + 280 shared by two), the
    # machine's register tiles
    import re
    from polyc.schedule.register_tile import machine_shape
    mr, nr = machine_shape("float32", polyc.Options())
    steps = {int(x) for x in re.findall(r"\+= (\d+)\)", c)}
    assert any(s % nr == 0 and nr < s <= 512 for s in steps), steps
    assert f"+= {mr}" in c and f"+= {nr}" in c
    tree = str(op.schedule)
    assert "mark" in tree and "parallel" in tree and "simd" in tree


def test_user_schedule_checked():
    src = CASES["matmul"][0]
    ok = polyc.define(src, schedule="[M,K,N] -> { S0[m,n] -> [0,m,n,0]; S1[m,n,k] -> [1,m,k,n] }")
    A, B = random_inputs([((7, 5), "float32"), ((5, 3), "float32")])
    np.testing.assert_allclose(ok(A, B), A @ B, rtol=1e-5)
    bad = polyc.define(src, schedule="[M,K,N] -> { S0[m,n] -> [1,m,n,0]; S1[m,n,k] -> [0,m,k,n] }")
    with pytest.raises(polyc.ScheduleError, match="breaks a dependence"):
        bad(A, B)
