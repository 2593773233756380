"""The TC and einsum frontends: kernels checked directly (shapes, dtypes, domains, ops) and
run by a small reference interpreter of the IR against numpy (no C compiler needed)."""
from __future__ import annotations

import itertools
import math

import islpy as isl
import numpy as np
import pytest

from polyc import expr as E
from polyc.frontend import from_einsum, from_tc, parse_tc, tc_defs
from polyc.frontend import tc_parser as P
from polyc.frontend.tc_ranges import Lin, bound_index, floor_div, to_expr
from polyc.ir import Kernel

RNG = np.random.default_rng(0)


# -- a reference interpreter of the IR --------------------------------------------------

_CALLS = {
    "exp": math.exp, "log": math.log, "sqrt": math.sqrt, "tanh": math.tanh,
    "sigmoid": lambda x: 1 / (1 + math.exp(-x)), "abs": abs, "fabs": abs,
    "fmax": max, "fmin": min, "max": max, "min": min, "pow": math.pow,
    "relu": lambda x: max(x, 0),
}


def _ev(e: E.Expr, env: dict, bufs: dict):
    if isinstance(e, E.Const):
        return e.value
    if isinstance(e, (E.Index, E.Size)):
        return env[e.name]
    if isinstance(e, E.Read):
        return bufs[e.array][tuple(_ev(i, env, bufs) for i in e.indices)].item()
    if isinstance(e, E.Unary):
        x = _ev(e.x, env, bufs)
        return -x if e.op == "-" else (not x)
    if isinstance(e, E.Select):
        return _ev(e.a, env, bufs) if _ev(e.cond, env, bufs) else _ev(e.b, env, bufs)
    if isinstance(e, E.Call):
        return _CALLS[e.fn](*(_ev(a, env, bufs) for a in e.args))
    if isinstance(e, E.Cast):
        return np.dtype(e.dtype).type(_ev(e.x, env, bufs)).item()
    a, b = _ev(e.a, env, bufs), _ev(e.b, env, bufs)
    if e.op == "/" and isinstance(a, int) and isinstance(b, int):
        return int(a / b)
    ops = {"+": a + b, "-": a - b, "*": a * b, "//": a // b if b else 0,
           "%": a % b if b else 0, "==": a == b, "!=": a != b, "<": a < b, ">": a > b,
           "<=": a <= b, ">=": a >= b, "&&": a and b, "||": a or b}
    return a / b if e.op == "/" else ops[e.op]


def _points(dom: isl.Set, sizes: dict[str, int]) -> list[tuple[int, ...]]:
    for name, v in sizes.items():
        pos = dom.find_dim_by_name(isl.dim_type.param, name)
        if pos >= 0:
            dom = dom.fix_val(isl.dim_type.param, pos, isl.Val.int_from_si(dom.get_ctx(), v))
    n = dom.dim(isl.dim_type.set)
    pts: list[tuple[int, ...]] = []
    dom.foreach_point(lambda p: pts.append(tuple(
        p.get_coordinate_val(isl.dim_type.set, i).to_python() for i in range(n))))
    return sorted(pts)


def run(k: Kernel, *inputs: np.ndarray) -> list[np.ndarray]:
    """Execute ``k`` statement by statement, points in lexicographic order."""
    sizes: dict[str, int] = {}
    bufs = {}
    for name, x in zip(k.inputs, inputs):
        a = k.array(name)
        assert np.ndim(x) == a.rank
        for d, n in zip(a.shape, np.shape(x)):
            if isinstance(d, E.Size):
                assert sizes.setdefault(d.name, n) == n, f"size {d.name}"
        bufs[name] = np.asarray(x, dtype=a.dtype)
    for a in k.arrays:
        if a.role != "input":
            shape = tuple(E.evaluate(d, sizes) for d in a.shape)
            bufs[a.name] = np.full(shape, 7, dtype=a.dtype)  # garbage to catch missing inits
    combine = {"+": lambda x, y: x + y, "*": lambda x, y: x * y, "max": max, "min": min}
    for s in k.statements:
        for pt in _points(s.domain, sizes):
            env = dict(sizes, **dict(zip(s.iterators, pt)))
            w = tuple(_ev(i, env, bufs) for i in s.write.indices)
            v = _ev(s.value, env, bufs)
            buf = bufs[s.write.array]
            buf[w] = v if s.op == "=" else combine[s.op](buf[w].item(), v)
    return [bufs[o] for o in k.outputs]


def rand(*shape, dtype="float32"):
    return RNG.standard_normal(shape).astype(dtype)


def same_set(s: isl.Set, text: str) -> bool:
    return s.is_equal(isl.Set(text))


def show_shape(k: Kernel, name: str) -> list[str]:
    return [E.show(d) for d in k.array(name).shape]


# -- parser -------------------------------------------------------------------------------

def test_parse_spans_and_structure():
    src = """# a comment
def f(float(M, 256) A, float x) -> (int32(M) C, D) {
    C(i) = int32(A(i, 0) * x)  # trailing comment
    D max=! A(i, j) where i in 0:M, exists A(i, j)
}"""
    [d] = parse_tc(src)
    assert d.name == "f" and d.span == P.Span(2, 1)
    assert [p.name for p in d.params] == ["A", "x"]
    assert d.params[0].type.dims == (P.Name("M", P.Span(2, 13)), P.Number(256, P.Span(2, 16)))
    assert d.params[1].type.dims == ()
    assert d.returns[0].type.dtype == "int32" and d.returns[1].type is None
    s0, s1 = d.body
    assert s0.span == P.Span(3, 5) and s0.op == "=" and isinstance(s0.rhs, P.CastExpr)
    assert s1.indices == () and s1.op == "max=!" and len(s1.clauses) == 2
    assert isinstance(s1.clauses[0], P.RangeClause) and isinstance(s1.clauses[1], P.ExistsClause)


def test_parse_precedence_ternary_and_dims():
    [d] = parse_tc("def f(float(N) A) -> (B) { B(i) = i < 2 && A(i) > 0 ? -A.0 + 2 * 3 : 1e-5 }")
    rhs = d.body[0].rhs
    assert isinstance(rhs, P.Ternary) and rhs.cond.op == "&&"
    assert rhs.a.op == "+" and isinstance(rhs.a.a, P.UnaryOp) and isinstance(rhs.a.a.x, P.DimOf)
    assert rhs.a.b.op == "*" and rhs.b == P.Number(1e-5, P.Span(1, 70))


def test_tc_defs_and_pick():
    src = "def a(float(N) X) -> (Y) { Y(i) = X(i) }\ndef b(float(N) X) -> (Y) { Y(i) = -X(i) }"
    assert tc_defs(src) == ["a", "b"]
    assert from_tc(src, "b").name == "b"


# -- TC kernels -----------------------------------------------------------------------------

MATMUL = "def matmul(float(M,K) A, float(K,N) B) -> (C) { C(m,n) +=! A(m,k) * B(k,n) }"


def test_matmul():
    k = from_tc(MATMUL)
    assert k.name == "matmul" and k.sizes == ("M", "K", "N")
    assert k.inputs == ("A", "B") and k.outputs == ("C",)
    c = k.array("C")
    assert c.role == "output" and c.dtype == "float32" and c.shape == (E.Size("M"), E.Size("N"))
    init, upd = k.statements
    assert (init.name, init.kind, init.op, init.iterators) == ("S0", "init", "=", ("m", "n"))
    assert init.value == E.Const(0.0, "float32")
    assert same_set(init.domain, "[M,K,N] -> { S0[m,n] : 0 <= m < M and 0 <= n < N }")
    assert (upd.name, upd.kind, upd.op, upd.iterators) == ("S1", "compute", "+", ("m", "n", "k"))
    assert upd.reduction_iterators == ("k",) and upd.origin == "line 1"
    assert same_set(upd.domain,
                    "[M,K,N] -> { S1[m,n,k] : 0 <= m < M and 0 <= n < N and 0 <= k < K }")
    assert upd.value == E.Binary("*", E.Read("A", (E.Index("m"), E.Index("k"))),
                                 E.Read("B", (E.Index("k"), E.Index("n"))))
    a, b = rand(3, 4), rand(4, 5)
    np.testing.assert_allclose(run(k, a, b)[0], a @ b, rtol=1e-5)


def test_batched_matmul_and_matvec_and_transpose():
    k = from_tc("def bmm(float(B,M,K) X, float(B,K,N) Y) -> (Z) "
                "{ Z(b,m,n) +=! X(b,m,k) * Y(b,k,n) }")
    assert show_shape(k, "Z") == ["B", "M", "N"]
    x, y = rand(2, 3, 4), rand(2, 4, 3)
    np.testing.assert_allclose(run(k, x, y)[0], x @ y, rtol=1e-5)
    k = from_tc("def mv(float(M,K) A, float(K) x) -> (y) { y(m) +=! A(m,k) * x(k) }")
    a, v = rand(3, 4), rand(4)
    np.testing.assert_allclose(run(k, a, v)[0], a @ v, rtol=1e-5)
    k = from_tc("def tr(double(M,N) A) -> (B) { B(n,m) = A(m,n) }")
    assert k.array("B").dtype == "float64" and show_shape(k, "B") == ["N", "M"]
    assert len(k.statements) == 1 and k.statements[0].op == "="
    a = rand(3, 5, dtype="float64")
    np.testing.assert_array_equal(run(k, a)[0], a.T)


CONV = """
def conv(float(N,C,H,W) I, float(M,C,KH,KW) W1) -> (O) {
    O(n,m,h,w) +=! I(n,c,{s}*h+kh,{s}*w+kw) * W1(m,c,kh,kw)
}"""


def _conv_ref(x, w, s):
    n, _, h, wd = x.shape
    m, _, kh, kw = w.shape
    oh, ow = (h - kh) // s + 1, (wd - kw) // s + 1
    out = np.zeros((n, m, oh, ow))
    for i, j in itertools.product(range(oh), range(ow)):
        patch = x[:, :, s * i:s * i + kh, s * j:s * j + kw]
        out[:, :, i, j] = np.einsum("nchw,mchw->nm", patch, w)
    return out


def test_conv_stride1():
    k = from_tc(CONV.replace("{s}", "1"))
    # a kernel larger than the image leaves the range of h empty: the extent is 0 then
    h_ext = E.Binary("+", E.Binary("-", E.Size("H"), E.Size("KH")), E.Const(1))
    assert k.array("O").shape[2] == E.Call("max", (h_ext, E.Const(0)))
    assert show_shape(k, "O")[3] == "max(((W - KW) + 1), 0)"
    upd = k.statements[1]
    assert upd.iterators == ("n", "m", "h", "w", "c", "kh", "kw")
    assert same_set(upd.domain, "[N,C,H,W,M,KH,KW] -> { S1[n,m,h,w,c,kh,kw] : 0 <= n < N and "
                    "0 <= m < M and 0 <= h <= H - KH and 0 <= w <= W - KW and 0 <= c < C and "
                    "0 <= kh < KH and 0 <= kw < KW }")
    x, w = rand(1, 2, 5, 4), rand(3, 2, 2, 3)
    np.testing.assert_allclose(run(k, x, w)[0], _conv_ref(x, w, 1), rtol=1e-4, atol=1e-5)


def test_conv_stride2():
    k = from_tc(CONV.replace("{s}", "2"))
    assert show_shape(k, "O")[2:] == ["max((((H - KH) // 2) + 1), 0)",
                                      "max((((W - KW) // 2) + 1), 0)"]
    assert same_set(k.statements[0].domain, "[N,C,H,W,M,KH,KW] -> { S0[n,m,h,w] : "
                    "0 <= n < N and 0 <= m < M and 0 <= 2h <= H - KH and 0 <= 2w <= W - KW }")
    x, w = rand(1, 2, 7, 6), rand(2, 2, 3, 2)
    np.testing.assert_allclose(run(k, x, w)[0], _conv_ref(x, w, 2), rtol=1e-4, atol=1e-5)


def test_conv_with_where_ranges_and_padding():
    """`where` ranges override inference; guarded reads (under ?:) do not cut the domain."""
    k = from_tc("""
def conv_pad(float(N,C,H,W) I, float(M,C,3,3) W1) -> (O) {
    O(n,m,h,w) +=! (h+kh-1 >= 0 && h+kh-1 < H && w+kw-1 >= 0 && w+kw-1 < W)
                   ? I(n,c,h+kh-1,w+kw-1) * W1(m,c,kh,kw) : 0.0
        where h in 0:H, w in 0:W, kh in 0:3, kw in 0:3
}""")
    assert show_shape(k, "O") == ["N", "M", "H", "W"] and show_shape(k, "W1")[2:] == ["3", "3"]
    assert k.statements[1].iterators == ("n", "m", "h", "w", "kh", "kw", "c")
    assert same_set(k.statements[1].domain, "[N,C,H,W,M] -> { S1[n,m,h,w,kh,kw,c] : "
                    "0 <= n < N and 0 <= m < M and 0 <= h < H and 0 <= w < W and 0 <= c < C "
                    "and 0 <= kh < 3 and 0 <= kw < 3 }")
    x, w = rand(1, 2, 4, 5), rand(2, 2, 3, 3)
    ref = _conv_ref(np.pad(x, ((0, 0), (0, 0), (1, 1), (1, 1))), w, 1)
    np.testing.assert_allclose(run(k, x, w)[0], ref, rtol=1e-4, atol=1e-5)


def test_max_pool_and_average_pool():
    k = from_tc("""
def maxpool(float(N,C,H,W) I) -> (O) {
    O(n,c,h,w) max=! I(n,c,2*h+kh,2*w+kw) where kh in 0:2, kw in 0:2
}""")
    init, upd = k.statements
    assert init.value == E.Const(float("-inf"), "float32") and upd.op == "max"
    assert show_shape(k, "O") == ["N", "C", "(H // 2)", "(W // 2)"]
    x = rand(1, 2, 5, 4)
    ref = x[:, :, :4, :4].reshape(1, 2, 2, 2, 2, 2).max(axis=(3, 5))
    np.testing.assert_allclose(run(k, x)[0], ref)
    k = from_tc("""
def avgpool(float(N,C,H,W) I) -> (O) {
    O(n,c,h,w) +=! I(n,c,h+kh,w+kw) / (KH * KW) where kh in 0:KH, kw in 0:KW
}""".replace("(N,C,H,W) I", "(N,C,H,W) I, float(KH,KW) unused"))
    assert show_shape(k, "O") == ["N", "C", "max(((H - KH) + 1), 0)", "max(((W - KW) + 1), 0)"]
    x = rand(1, 1, 4, 4)
    ref = _conv_ref(x, np.ones((1, 1, 2, 3)) / 6, 1)
    np.testing.assert_allclose(run(k, x, np.zeros((2, 3)))[0], ref, rtol=1e-5)


SOFTMAX = """
def softmax(float(N,C) X) -> (Y) {
    mx(n) max=! X(n,c)
    e(n,c) = exp(X(n,c) - mx(n))
    s(n) +=! e(n,c)
    Y(n,c) = e(n,c) / s(n)
}"""


def _softmax(x):
    e = np.exp(x - x.max(axis=1, keepdims=True))
    return e / e.sum(axis=1, keepdims=True)


def test_softmax_temporaries():
    k = from_tc(SOFTMAX)
    assert [a.name for a in k.arrays] == ["X", "Y", "mx", "e", "s"]
    assert [a.role for a in k.arrays] == ["input", "output", "temp", "temp", "temp"]
    assert [t.name for t in k.temporaries] == ["mx", "e", "s"]
    assert show_shape(k, "mx") == ["N"] and show_shape(k, "e") == ["N", "C"]
    assert [(s.name, s.kind, s.op) for s in k.statements] == [
        ("S0", "init", "="), ("S1", "compute", "max"), ("S2", "compute", "="),
        ("S3", "init", "="), ("S4", "compute", "+"), ("S5", "compute", "=")]
    assert [s.origin for s in k.statements] == ["line 3", "line 3", "line 4", "line 5",
                                                "line 5", "line 6"]
    assert k.statements[2].value == E.Call("exp", (E.Binary(
        "-", E.Read("X", (E.Index("n"), E.Index("c"))), E.Read("mx", (E.Index("n"),))),))
    x = rand(3, 5)
    np.testing.assert_allclose(run(k, x)[0], _softmax(x), rtol=1e-5)


def test_log_softmax():
    k = from_tc("""
def log_softmax(float(N,C) X) -> (Y) {
    mx(n) max=! X(n,c)
    s(n) +=! exp(X(n,c) - mx(n))
    Y(n,c) = X(n,c) - mx(n) - log(s(n))
}""")
    x = rand(2, 6)
    np.testing.assert_allclose(run(k, x)[0], np.log(_softmax(x)), rtol=1e-5, atol=1e-6)


def test_layernorm_sizes_as_values():
    k = from_tc("""
def layernorm(float(N,D) X, float(D) g, float(D) b) -> (Y) {
    mean(n) +=! X(n,d) / D
    var(n) +=! (X(n,d) - mean(n)) * (X(n,d) - mean(n)) / D
    Y(n,d) = g(d) * (X(n,d) - mean(n)) * rsqrt(var(n) + 1e-5) + b(d)
}""")
    assert k.statements[1].value == E.Binary(
        "/", E.Read("X", (E.Index("n"), E.Index("d"))), E.Size("D"))
    assert k.array("mean").dtype == "float32"
    _CALLS["rsqrt"] = lambda v: 1 / math.sqrt(v)
    x, g, b = rand(3, 8), rand(8), rand(8)
    mu, var = x.mean(1, keepdims=True), x.var(1, keepdims=True)
    np.testing.assert_allclose(run(k, x, g, b)[0], g * (x - mu) / np.sqrt(var + 1e-5) + b,
                               rtol=1e-4, atol=1e-5)


def test_mlp_relu_and_let_binding():
    k = from_tc("""
def mlp(float(B,I) X, float(H,I) W1, float(H) b1, float(O,H) W2, float(O) b2) -> (Y) {
    h1(b,h) +=! X(b,i) * W1(h,i)
    r(b,h) = fmax(h1(b,h) + b1(h), 0)
    Y(b,o) +=! r(b,h) * W2(o,h) + z where z = b2(o) / H
}""")
    assert k.sizes == ("B", "I", "H", "O") and show_shape(k, "Y") == ["B", "O"]
    assert k.statements[2].value == E.Call("fmax", (E.Binary(
        "+", E.Read("h1", (E.Index("b"), E.Index("h"))), E.Read("b1", (E.Index("h"),))),
        E.Const(0)))
    x, w1, b1, w2, b2 = rand(2, 3), rand(4, 3), rand(4), rand(5, 4), rand(5)
    ref = np.maximum(x @ w1.T + b1, 0) @ w2.T + b2
    np.testing.assert_allclose(run(k, x, w1, b1, w2, b2)[0], ref, rtol=1e-4, atol=1e-5)


def test_tensordot_and_outer_product():
    k = from_tc("def td(float(A,B,C) X, float(B,C,D) Y) -> (Z) "
                "{ Z(a,d) +=! X(a,b,c) * Y(b,c,d) }")
    assert k.statements[1].iterators == ("a", "d", "b", "c")
    x, y = rand(2, 3, 4), rand(3, 4, 2)
    np.testing.assert_allclose(run(k, x, y)[0], np.tensordot(x, y, 2), rtol=1e-5)
    k = from_tc("def outer(float(M) x, float(N) y) -> (Z) { Z(i,j) = x(i) * y(j) }")
    a, b = rand(3), rand(4)
    np.testing.assert_allclose(run(k, a, b)[0], np.outer(a, b), rtol=1e-6)


def test_scalars_casts_dims_and_typed_outputs():
    k = from_tc("""
def f(float(M,256) A, float alpha, int32(M) idx) -> (int64(M) C, v) {
    C(i) = int64(A(i, A.1 - 1) * alpha) + idx(i)
    v min=! A(i, j) * alpha
}""")
    assert k.array("alpha").shape == () and k.array("A").shape == (E.Size("M"), E.Const(256))
    assert k.array("C").dtype == "int64" and k.array("v").shape == ()
    assert k.statements[0].value.a.x.a.indices[1] == E.Binary("-", E.Const(256), E.Const(1))
    assert k.statements[1].value == E.Const(float("inf"), "float32")
    assert k.statements[2].write.indices == () and k.statements[2].iterators == ("i", "j")
    a, idx = rand(2, 256), np.array([3, 4], dtype="int32")
    c, v = run(k, a, np.float32(2.0), idx)
    np.testing.assert_array_equal(c, (a[:, 255] * 2).astype("int64") + idx)
    assert v == pytest.approx((a * 2).min())


def test_reduction_identities_and_accumulation_without_bang():
    k = from_tc("""
def g(int32(N) X) -> (P, Q, R) {
    P *=! X(i)
    Q(j) min=! X(i) * j where j in 0:2
    R = 5
    R += X(i)
}""")
    ops = [(s.kind, s.op, s.value) for s in k.statements if s.kind == "init"]
    assert ops == [("init", "=", E.Const(1, "int32")), ("init", "=", E.Const(2**31 - 1, "int32"))]
    assert k.array("R").dtype == "int32" and k.statements[-1].op == "+"
    x = np.array([2, -3, 4], dtype="int32")
    p, q, r = run(k, x)
    assert p == -24 and list(q) == [0, -3] and r == 8


def test_affine_offsets_reversal_and_mod():
    k = from_tc("""
def h(float(N) A, float(K) F) -> (B, R, Y) {
    B(i) +=! A(i + k) * F(k)
    R(i) = A(N - 1 - i)
    Y(i) = A(i) + A(i % 2)
}""")
    assert show_shape(k, "B") == ["max(((N - K) + 1), 0)"] and show_shape(k, "R") == ["N"]
    a, f = rand(6), rand(3)
    b, r, y = run(k, a, f)
    np.testing.assert_allclose(b, np.correlate(a, f, "valid"), rtol=1e-5)
    np.testing.assert_array_equal(r, a[::-1])
    np.testing.assert_allclose(y, a + a[np.arange(6) % 2])


def test_lower_bound_and_extra_constraints():
    """A `where` range starting above 0; two unranged indices in one access restrict the
    domain rather than leave it out of bounds; several sizes bounding one index too."""
    k = from_tc("""
def d(float(N) A, float(M) Bv, float(N) C) -> (X, Y, Z) {
    X(i) = A(i) - A(i - 1) where i in 1:N
    Y(i) +=! A(i) * Bv(j) * C(i + j)
    Z(i) +=! A(j) * Bv(j) where i in 0:2
}""")
    assert same_set(k.statements[0].domain, "[N, M] -> { S0[i] : 1 <= i < N }")
    assert same_set(k.statements[2].domain,
                    "[N, M] -> { S2[i, j] : 0 <= i < N and 0 <= j < M and i + j < N }")
    assert same_set(k.statements[4].domain,
                    "[N, M] -> { S4[i, j] : 0 <= i < 2 and 0 <= j < N and j < M }")


def test_output_written_twice_and_reread():
    k = from_tc("""
def two(float(N) A) -> (float(N) B) {
    B(i) = A(i)
    B(i) += B(i) * 2
    B(i) *= 3 where i in 0:1
}""")
    assert len(k.statements) == 3 and k.array("B").role == "output"
    np.testing.assert_allclose(run(k, np.array([1.0, 2.0], dtype="float32"))[0], [9.0, 6.0])


# -- range inference arithmetic ------------------------------------------------------------

@pytest.mark.parametrize("c", [-3, -2, -1, 1, 2, 3])
@pytest.mark.parametrize("a", [-2, -1, 0, 2])
def test_bound_index_is_exact(c, a):
    """bound_index(c*x + a*y + P + 1, H) gives exactly the x keeping it in [0, H)."""
    lo, hi = bound_index(Lin({"x": c, "y": a, "P": 1}, 1), Lin({"H": 1}), "x",
                         {"y": (Lin(), Lin({"Y": 1}))})
    for h, y, p in itertools.product(range(1, 8), range(1, 4), range(0, 3)):
        env = {"H": h, "Y": y, "P": p}
        good = [x for x in range(-20, 20)
                if all(0 <= c * x + a * yy + p + 1 < h for yy in range(y))]
        assert good == list(range(E.evaluate(to_expr(lo), env), E.evaluate(to_expr(hi), env)))


def test_floor_div_normal_form():
    assert E.show(to_expr(floor_div(Lin({"H": 1, "K": -1}, 2), 2))) == "(((H - K) // 2) + 1)"
    assert E.show(to_expr(floor_div(Lin({"H": 4}, -2), 2))) == "((2 * H) - 1)"


# -- einsum ---------------------------------------------------------------------------------

EINSUM_CASES = [
    ("ij,jk->ik", [(3, 4), (4, 5)]),
    ("bij,bjk->bik", [(2, 3, 4), (2, 4, 3)]),
    ("ii->", [(4, 4)]),
    ("ii->i", [(4, 4)]),
    ("ij->ji", [(2, 3)]),
    ("ijk->kij", [(2, 3, 4)]),
    ("ijk->", [(2, 3, 4)]),
    ("ijk,jk->i", [(2, 3, 4), (3, 4)]),
    ("i,j->ij", [(3,), (4,)]),
    ("ij,jk", [(3, 4), (4, 5)]),
    ("ba", [(2, 3)]),
    ("Ba,aC", [(2, 3), (3, 2)]),
    ("i,i", [(5,), (5,)]),
    ("iij->j", [(3, 3, 2)]),
    (",i->i", [(), (3,)]),
]


@pytest.mark.parametrize("spec,shapes", EINSUM_CASES)
def test_einsum_matches_numpy(spec, shapes):
    xs = [rand(*s) for s in shapes]
    k = from_einsum(spec, ["float32"] * len(xs))
    assert k.inputs == tuple(f"X{i}" for i in range(len(xs))) and k.outputs == ("out",)
    ref = np.einsum(spec, *xs)
    got = run(k, *xs)[0]
    assert got.shape == ref.shape and got.dtype == np.float32
    np.testing.assert_allclose(got, ref, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("spec,shapes", [
    ("...ij,...jk->...ik", [(2, 3, 2, 4), (2, 3, 4, 2)]),
    ("...i,...i", [(2, 3), (3,)]),
    ("i...->...", [(3, 2, 2)]),
    ("...ii->...i", [(2, 3, 3)]),
])
def test_einsum_ellipsis(spec, shapes):
    xs = [rand(*s) for s in shapes]
    k = from_einsum(spec, ["float32"] * len(xs), [len(s) for s in shapes])
    np.testing.assert_allclose(run(k, *xs)[0], np.einsum(spec, *xs), rtol=1e-4, atol=1e-5)


def test_einsum_kernel_structure_and_dtypes():
    k = from_einsum("bij,bjk->bik", ["float32", "float64"])
    assert k.sizes == ("B", "I", "J", "K") and k.array("out").dtype == "float64"
    assert k.statements[1].value.a == E.Cast(
        "float64", E.Read("X0", (E.Index("b"), E.Index("i"), E.Index("j"))))
    assert same_set(k.statements[1].domain, "[B,I,J,K] -> { S1[b,i,k,j] : 0 <= b < B and "
                    "0 <= i < I and 0 <= k < K and 0 <= j < J }")
    k = from_einsum("ii->", ["int32"])
    assert k.array("out").shape == () and k.array("X0").shape == (E.Size("I"),) * 2
    assert k.array("out").dtype == "int32" and k.statements[1].reduction_iterators == ("i",)
    assert from_einsum("ij,j->i", ["int32", "float32"]).array("out").dtype == "float64"
    k = from_einsum("ij->ji", ["bool"])
    assert len(k.statements) == 1 and k.statements[0].op == "="
