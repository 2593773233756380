"""Indirect (data-dependent) and non-affine indices: ``from_tc(..., allow_indirect=True)``.

Such an index does not constrain range inference nor the bounds checks, its access
relation leaves that array dimension free (within the extent), so dependences are
over-approximated; the generated C computes it in int64.
"""
from __future__ import annotations

import islpy as isl
import numpy as np
import pytest

import polyc
from polyc import expr as E
from polyc.api import Operator
from polyc.check import check_accesses_in_bounds
from polyc.deps import compute_dependences
from polyc.errors import SemanticError, UnsupportedError
from polyc.frontend import from_tc
from polyc.ir import access_relation

RNG = np.random.default_rng(0)
X57 = RNG.standard_normal((5, 7)).astype(np.float32)


def op(src, **options):
    return Operator(from_tc(src, allow_indirect=True), polyc.Options().replace(**options))


def test_gather_rows_int64():
    f = op("def g(float(R,C) X, int64(N) I) -> (Y) { Y(i, j) = X(I(i), j) }")
    idx = np.array([4, 0, 2, 2, 1, 3], np.int64)
    np.testing.assert_array_equal(f(X57, idx), X57[idx])
    assert f.kernel.array("Y").shape == (E.Size("N"), E.Size("C"))


def test_select_wraps_negative_indices():
    f = op("""def g(float(5,7) X, int64(4) I) -> (Y) {
        Y(i, j) = X(I(i) < 0 ? I(i) + 5 : I(i), j)
    }""")
    idx = np.array([0, -1, 4, -5], np.int64)
    np.testing.assert_array_equal(f(X57, idx), X57[idx])


def test_min_max_clamp_int32_indices_printed_in_int64():
    f = op("def g(float(5,7) X, int32(4) I) -> (Y) { Y(i, j) = X(min(max(I(i), 0), 4), j) }")
    idx = np.array([0, -3, 9, 2], np.int32)
    np.testing.assert_array_equal(f(X57, idx), X57[np.clip(idx, 0, 4)])
    assert "(int64_t)polyc_min_i32(polyc_max_i32(" in f.c_source


def test_non_affine_product_and_reduction():
    f = op("def g(float(9) X) -> (Y) { Y(i, j) = X(i * j) where i in 0:3, j in 0:3 }")
    x = np.arange(9, dtype=np.float32)
    np.testing.assert_array_equal(f(x), np.outer(np.arange(3), np.arange(3)).astype(np.float32))
    bag = op("def bag(float(5,7) X, int64(6) I) -> (S) { S(j) +=! X(I(i), j) }")
    idx = np.array([4, 0, 2, 2, 1, 3], np.int64)
    np.testing.assert_allclose(bag(X57, idx), X57[idx].sum(0), rtol=1e-5)


@pytest.mark.parametrize("fusion", ["min", "max"])
def test_dependences_through_an_indirect_read(fusion):
    src = """def g(float(5) X, int64(4) I) -> (Y) {
        Z(k) = X(k) * 2.0
        T(i) = I(i) + 1
        Y(i) = Z(min(T(i), 4))
    }"""
    kernel = from_tc(src, allow_indirect=True)
    deps = compute_dependences(kernel)
    flow = deps.flow
    # every Z element may be read by every Y instance, and T(i) flows to Y(i)
    z_to_y = isl.UnionMap("{ S0[k] -> S2[i] : 0 <= k < 5 and 0 <= i < 4 }")
    t_to_y = isl.UnionMap("{ S1[i] -> S2[i] : 0 <= i < 4 }")
    assert z_to_y.is_subset(flow) and t_to_y.is_subset(flow)
    f = Operator(kernel, polyc.Options().replace(fusion=fusion))
    x = np.arange(5, dtype=np.float32)
    idx = np.array([3, 0, -1, 7], np.int64)
    np.testing.assert_array_equal(f(x, idx), 2 * x[np.minimum(idx + 1, 4)])


def test_access_relation_leaves_the_dimension_free():
    dom = isl.Set("{ S[i, j] : 0 <= i < 4 and 0 <= j < 7 }")
    ind = (E.Read("I", (E.Index("i"),)), E.Index("j"))
    rel = access_relation(dom, "X", ind, (E.Const(5), E.Const(7)))
    assert rel.is_equal(isl.Map("{ S[i, j] -> X[a, j] : 0 <= i < 4 and 0 <= j < 7 and "
                                "0 <= a < 5 }"))
    free = access_relation(dom, "X", ind)
    assert free.range().is_equal(isl.Set("{ X[a, j] : 0 <= j < 7 }"))


def test_bounds_check_skips_indirect_dimensions_only():
    kernel = from_tc("def g(float(5,7) X, int64(4) I) -> (Y) { Y(i, j) = X(I(i), j) }",
                     allow_indirect=True)
    check_accesses_in_bounds(kernel)  # the indirect dimension is the writer's job
    # the read of I inside the index is an ordinary access: it bounds i
    assert kernel.array("Y").shape[0] == E.Const(4)


def test_rejected_without_the_flag():
    for src in ("def g(float(5,7) X, int64(4) I) -> (Y) { Y(i, j) = X(I(i), j) }",
                "def g(float(9) X) -> (Y) { Y(i, j) = X(i * j) where i in 0:3, j in 0:3 }"):
        with pytest.raises(UnsupportedError, match="index"):
            polyc.define(src)
        with pytest.raises(UnsupportedError, match="index"):
            from_tc(src)


def test_float_index_rejected():
    with pytest.raises(SemanticError, match="must be an integer"):
        from_tc("def g(float(5) X, float(4) F) -> (Y) { Y(i) = X(F(i)) }", allow_indirect=True)
