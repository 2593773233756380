"""The budget on isl's dataflow analysis (``polyc.deps.budgeted_flow``): kernels whose
accesses divide (``A(i / 2)``) are analysed within ``FLOW_OPERATIONS``; past it the
dependences, live instances and uninitialized reads are over-approximated (every
earlier write of an element, every instance live, every array read), and the compiled
kernel is still right. The reproducer that ran for minutes is
``tests/fuzz/regressions/dataflow_budget_quasi_affine.py``."""
from __future__ import annotations

import numpy as np
import pytest

import polyc
from polyc import deps as D
from polyc.pipeline import prepare_kernel

SRC = """def f(float(N) A) -> (B, C) {
    T(i) = A(i) * 2.0
    T(i) = T(i) + A(i / 2) where i in 0:N
    B(i) = T(i / 2) + T(i)
    C(i) +=! T(j) * A(i) where j in 0:N
}"""


def _ref(a):
    t = a * 2.0
    t = t + a[np.arange(len(a)) // 2]
    b = t[np.arange(len(a)) // 2] + t
    c = t.sum() * a
    return b, c


@pytest.mark.parametrize("budget", [D.FLOW_OPERATIONS, 1])
@pytest.mark.parametrize("opts", [{}, {"tile": False}, {"scheduler": "pluto"},
                                  {"specialize": False},
                                  {"target": "cuda", "emulate": True}])
def test_right_within_and_past_the_budget(budget, opts, monkeypatch):
    monkeypatch.setattr(D, "FLOW_OPERATIONS", budget)
    op = polyc.define(SRC, **opts)
    a = np.random.default_rng(2).standard_normal(37).astype(np.float32)
    for got, want in zip(op(a), _ref(a.astype(np.float64))):
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)


def test_past_the_budget_is_an_over_approximation(monkeypatch):
    kernel = prepare_kernel(polyc.define(SRC).kernel, polyc.Options())
    assert D._quasi_affine(kernel)
    exact = D.compute_dependences(kernel)
    live = D.live_instances(kernel)
    unset = D.arrays_read_uninitialized(kernel)
    monkeypatch.setattr(D, "FLOW_OPERATIONS", 1)
    assert D.budgeted_flow(kernel, *([exact.flow] * 4)) is None
    rough = D.compute_dependences(kernel)
    for name in ("flow", "anti", "output", "reduction"):
        assert getattr(exact, name).is_subset(getattr(rough, name)), name
    assert live.is_subset(D.live_instances(kernel))
    assert unset <= D.arrays_read_uninitialized(kernel)
