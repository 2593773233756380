"""Range inference decided by isl: bounds whose order depends on the sizes become a
``min``/``max`` extent, empty ranges give empty loops and zero-size outputs, and every
such kernel computes what numpy computes, for specialised and generic libraries and
under every fusion mode."""
from __future__ import annotations

import numpy as np
import pytest

import polyc
from polyc import expr as E
from polyc.frontend import from_tc

OPTION_SETS = [dict(), dict(specialize=False), dict(fusion="min", tile=False),
               dict(fusion="max", threads=2, register_tile=False)]


def rand(*shape, seed=0):
    return np.random.default_rng(seed).standard_normal(shape).astype(np.float32)


def shape_text(src: str, array: str) -> list[str]:
    return [E.show(d) for d in from_tc(src).array(array).shape]


TWO_BOUNDS = """
def f(float(Q, R) A) -> (O1) {
  O1(w) *=! fmax(fabs(A(w + j, j)), A(j, j))
}"""


def two_bounds_ref(a):
    q, r = a.shape
    j_hi = min(q, r)
    out = np.ones(q - j_hi + 1, np.float32)
    for w in range(out.shape[0]):
        for j in range(j_hi):
            out[w] *= max(abs(a[w + j, j]), a[j, j])
    return out


def test_index_bounded_by_two_sizes_takes_their_min():
    """j is bounded by R (second dimension) and by Q (A(j, j)): its range is min(Q, R),
    and w's extent follows from it (the issue's example: A of shape (1, 5))."""
    assert shape_text(TWO_BOUNDS, "O1") == ["((Q - min(R, Q)) + 1)"]


@pytest.mark.parametrize("opts", OPTION_SETS)
@pytest.mark.parametrize("shape", [(1, 5), (5, 1), (4, 4), (7, 3), (3, 7)])
def test_two_bounds_runs(shape, opts):
    f = polyc.define(TWO_BOUNDS, **opts)
    a = rand(*shape)
    got = f(a)
    np.testing.assert_allclose(got, two_bounds_ref(a), rtol=1e-5)


SEVERAL_OUTPUTS = """
def f(float(L, G) A, float(G) B, float(8, L, G) C) -> (O2, O3, O1) {
  O1 *=! tanh(B(x0))
  O1 max= fmax(fmax(C(l, l, q), exp(C(3*s + 2, s, q))), 0.0)
  O2(s) +=! C(s + kh, kh, kh)
  O3(l) *=! fabs(O1) / (1 + O2(l)*O2(l))
}"""


@pytest.mark.parametrize("opts", OPTION_SETS)
@pytest.mark.parametrize("l_g", [(6, 1), (2, 5), (9, 9)])
def test_outputs_read_later_get_their_true_extent(l_g, opts):
    ell, g = l_g
    a, b, c = rand(ell, g), rand(g, seed=1), rand(8, ell, g, seed=2)
    o2, o3, o1 = polyc.define(SEVERAL_OUTPUTS, **opts)(a, b, c)
    k = min(ell, g)
    want1 = np.float32(np.prod(np.tanh(b)))
    for ll in range(min(8, ell)):
        for q in range(g):
            want1 = max(want1, c[ll, ll, q])
    for s in range(min(2, ell)):
        for q in range(g):
            want1 = max(want1, np.exp(c[3 * s + 2, s, q]))
    want2 = np.array([sum(c[s + kh, kh, kh] for kh in range(k)) for s in range(8 - k + 1)])
    assert o2.shape == (8 - k + 1,) and o3.shape == o2.shape
    np.testing.assert_allclose(o1, want1, rtol=1e-5)
    np.testing.assert_allclose(o2, want2, rtol=1e-5)
    np.testing.assert_allclose(o3, np.abs(want1) / (1 + want2 * want2), rtol=1e-5)


def test_elementwise_over_two_sizes():
    src = "def f(float(N) A, float(M) C) -> (B) { B(i) = A(i) + C(i) }"
    assert shape_text(src, "B") == ["min(N, M)"]
    f = polyc.define(src)
    a, c = rand(5), rand(3, seed=1)
    np.testing.assert_allclose(f(a, c), a[:3] + c)
    np.testing.assert_allclose(f(c, a), a[:3] + c)


@pytest.mark.parametrize("opts", [dict(), dict(specialize=False)])
def test_empty_range_gives_a_zero_size_output(opts):
    f = polyc.define("def f(float(N) A) -> (B) { B(i) = 2 * A(i + 5) }", **opts)
    assert f(np.arange(3, dtype=np.float32)).shape == (0,)
    np.testing.assert_allclose(f(np.arange(8, dtype=np.float32)), [10, 12, 14])


@pytest.mark.parametrize("opts", [dict(), dict(specialize=False), dict(fusion="max")])
def test_kernel_larger_than_image_gives_empty_output_and_empty_consumers(opts):
    src = """
def f(float(H) I, float(K) W) -> (O, S) {
  O(h) +=! I(h + k) * W(k)
  S +=! O(h)
}"""
    f = polyc.define(src, **opts)
    o, s = f(rand(3), rand(5, seed=1))
    assert o.shape == (0,) and s.shape == () and s == 0
    i, w = rand(9), rand(4, seed=1)
    o, s = f(i, w)
    want = np.correlate(i, w, mode="valid")
    np.testing.assert_allclose(o, want, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(s, want.sum(), rtol=1e-4, atol=1e-5)


def test_generic_header_documents_piecewise_shapes():
    f = polyc.define(TWO_BOUNDS, specialize=False)
    a = rand(3, 6)
    np.testing.assert_allclose(f(a), two_bounds_ref(a), rtol=1e-5)
    assert "min(" in f.c_source


def test_lower_bounds_take_their_max():
    """i - P >= 0 and i - Q >= 0: i starts at max(P, Q); elements below stay zero."""
    src = """
def f(float(P) X, float(Q) Y, float(N) A) -> (B) {
  B(i) = A(i - P) + A(i - Q) where i in 0:N
}"""
    k = from_tc(src)
    dom = k.statements[-1].domain
    assert not dom.is_empty()
    f = polyc.define(src)
    a = rand(10)
    got = f(rand(2), rand(4, seed=1), a)
    want = np.zeros(10, np.float32)
    for i in range(10):
        if i - 2 >= 0 and i - 4 >= 0:
            want[i] = a[i - 2] + a[i - 4]
    np.testing.assert_allclose(got, want)


def test_output_reduced_before_any_initialisation_is_refused():
    from polyc.errors import SemanticError
    with pytest.raises(SemanticError, match=r"^2:1: output 'C' is reduced with `\+=` before "
                       r"any statement initialises it: write `\+=!`"):
        from_tc("def f(float(M,K) A) -> (C) {\nC(m) += A(m, k)\n}")
    # assigned first, then accumulated: fine
    f = polyc.define("def f(float(M,K) A) -> (C) {\nC(m) = 1.0 where m in 0:M\n"
                     "C(m) += A(m, k)\n}")
    a = rand(3, 4)
    np.testing.assert_allclose(f(a), 1 + a.sum(axis=1), rtol=1e-5)


def test_initialisation_writing_outside_is_refused_even_if_the_update_is_empty():
    """Found by the fuzzer (seed 177): the update's domain was empty (a read always out of
    bounds), so only the `!` initialisation wrote O1(i, j) with i up to M - 1 > N - 1;
    the frontend checks the write on the box of the left-hand side's ranges."""
    from polyc.errors import RangeInferenceError
    src = ("def f(float(N, M, M) B) -> (float(N, M) O1) {\n"
           "  O1(i, j) +=! B(j, B.1, j - 1) <= B(s + r, i, s) where i in 1:M\n}\n")
    with pytest.raises(RangeInferenceError, match=r"^2:3: the statement writes 'O1' outside"):
        from_tc(src)
