"""polyc.guards: affine guards of reductions (iterator against iterator) become domain
constraints; a padded copy splits into its inside and its pad; everything else stays
as written."""
from __future__ import annotations

import islpy as isl
import numpy as np
import pytest

import polyc
from polyc import expr as E
from polyc.frontend import from_tc


def _domain(kernel, k):
    return kernel.statements[k].domain


def test_triangle_moves_into_the_domain():
    k = from_tc("def f(float(9) X) -> (Y) {\n"
                " Y(i) +=! (j < i && X(j) > 0.0) ? X(j) : 0.0 where i in 0:9, j in 0:9\n}")
    want = isl.Set("{ S1[i, j] : 0 <= j < i <= 8 }")
    assert _domain(k, 1).is_equal(want)
    x = np.random.default_rng(0).standard_normal(9).astype(np.float32)
    y = polyc.define("def f(float(9) X) -> (Y) {\n Y(i) +=! (j < i && X(j) > 0.0) ? X(j) : 0.0 "
                     "where i in 0:9, j in 0:9\n}")(x)
    want_y = [np.where(x[:i] > 0, x[:i], 0).sum() for i in range(9)]
    np.testing.assert_allclose(y, want_y, rtol=1e-6)


@pytest.mark.parametrize("src", [
    # the other branch is not the identity: every instance counts
    "def f(float(9) X) -> (Y) { Y(i) +=! (j < i) ? X(j) : 1.0 where i in 0:9, j in 0:9 }",
    # a bound against a constant (padding) stays a guard
    "def f(float(9) X) -> (Y) { Y(i) +=! (i + j - 1 >= 0) ? X(j) : 0.0 where i in 0:9, "
    "j in 0:9 }",
    # not a reduction, and its other branch reads: not a padded copy
    "def f(float(9) X) -> (Y) { Y(i) = (i < 4) ? X(i) : X(0) }"])
def test_other_guards_stay(src):
    k = from_tc(src)
    last = k.statements[-1]
    assert "Select" in type(last.value).__name__
    box = isl.Set("{ [i, j] : 0 <= i <= 8 and 0 <= j <= 8 }" if len(last.iterators) == 2
                  else "{ [i] : 0 <= i <= 8 }")
    assert last.domain.reset_tuple_id().is_equal(box)


def test_max_reduction_with_its_identity():
    k = from_tc("def f(float(7) X) -> (Y) {\n"
                " Y(i) max=! (j <= i) ? X(j) : (-1.0/0.0) where i in 0:7, j in 0:7\n}")
    assert _domain(k, 1).is_equal(isl.Set("{ S1[i, j] : 0 <= j <= i <= 6 }"))
    x = np.random.default_rng(1).standard_normal(7).astype(np.float32)
    f = polyc.define("def f(float(7) X) -> (Y) {\n Y(i) max=! (j <= i) ? X(j) : (-1.0/0.0) "
                     "where i in 0:7, j in 0:7\n}")
    np.testing.assert_array_equal(f(x), np.maximum.accumulate(x))


def test_padded_copy_splits_into_inside_and_pad():
    """An assignment whose guard is affine bounds and whose other branch reads nothing
    (a padded window's copy) becomes the copy of the inside, unguarded, and the pad: the
    same elements get the same values."""
    src = ("def f(float(7, 5) X) -> (Y) { Y(i, j) = (i - 1 >= 0 && i - 1 < 7 && j + 2 < 5) "
           "? X(i - 1, j + 2) : -3.0 where i in 0:9, j in 0:6 }")
    k = from_tc(src)
    assert [s.name for s in k.statements] == ["S0", "S0_pad"]
    inside, pad = k.statements
    assert isinstance(inside.value, E.Read) and isinstance(pad.value, E.Const)
    assert inside.domain.reset_tuple_id().is_equal(
        isl.Set("{ [i, j] : 1 <= i <= 7 and 0 <= j <= 2 }"))
    assert pad.domain.reset_tuple_id().is_equal(
        isl.Set("{ [i, j] : 0 <= i <= 8 and 0 <= j <= 5 }").subtract(
            isl.Set("{ [i, j] : 1 <= i <= 7 and 0 <= j <= 2 }")))
    x = np.random.default_rng(1).standard_normal((7, 5)).astype(np.float32)
    want = np.full((9, 6), -3.0, np.float32)
    want[1:8, 0:3] = x[:, 2:5]
    for opt in (polyc.Options(), polyc.Options(scheduler="pluto"), polyc.Options(tile=False)):
        np.testing.assert_array_equal(polyc.define(src, options=opt)(x), want)


def test_guard_always_true_or_false_leaves_one_statement():
    k = from_tc("def f(float(9) X) -> (Y) { Y(i) = (i < 20) ? X(i) : 0.0 }")
    assert len(k.statements) == 1 and isinstance(k.statements[0].value, E.Read)
    k = from_tc("def f(float(9) X) -> (Y) { Y(i) = (i > 20) ? X(i) : 0.0 }")
    assert len(k.statements) == 1 and isinstance(k.statements[0].value, E.Const)


def test_recurrence_through_a_guard_is_not_split():
    """``Y(i) = i >= 1 ? Y(i - 1) + X(i) : 1`` reads what its pad writes: split, the
    inside would run before the pad it reads."""
    src = ("def f(float(9) X) -> (Y) { Y(i) = X(i) where i in 0:9\n"
           "Y(i) = (i >= 1) ? Y(i - 1) + X(i) : 1.0 where i in 0:9 }")
    k = from_tc(src)
    assert len(k.statements) == 2 and isinstance(k.statements[-1].value, E.Select)
    x = np.arange(9, dtype=np.float32)
    np.testing.assert_array_equal(polyc.define(src)(x), np.concatenate([[1], 1 + np.cumsum(x[1:])]))
