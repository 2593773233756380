"""Max and min reductions along contiguous rows run as OpenMP SIMD reductions
(:func:`polyc.schedule.vector.reduction_member`, the ``reduce`` mark): each vector loads
terms of one row instead of gathering one term from each of 16 rows. The result is the
in-order loop's, bit for bit (NaN terms ignored as ``fmax`` does, infinities, rows of
a length no multiple of a vector), on both schedulers and with or without tiling."""
from __future__ import annotations

import numpy as np
import pytest

from polyc import pipeline
from polyc.errors import ScheduleError
from polyc.frontend import from_tc
from polyc.options import Options
from polyc.schedule import optimize
from polyc.schedule.vector import reduce_problem

SOFTMAX = """def softmax(float(N,D) X) -> (Y, mx, s) {
    mx(n) max=! X(n,d)
    s(n) +=! exp(X(n,d) - mx(n))
    Y(n,d) = exp(X(n,d) - mx(n)) / s(n)
}"""
ROW_MIN = """def rowmin(int32(B,N,D) A) -> (mn) {
    mn(b,n) min=! A(b,n,d)
}"""
COLUMN_MAX = """def colmax(float(N,D) X) -> (mx) {
    mx(d) max=! X(n,d)
}"""


def _run(source, inputs, monkeypatch, tmp_path, on, **options):
    monkeypatch.setattr(optimize, "REDUCE_ALONG_ROWS", on)
    compiled = pipeline.compile_kernel(from_tc(source), Options(
        cache_dir=str(tmp_path / str(on)), cflags=("-Wall", "-Wextra", "-Werror"), **options))
    return compiled.source.text, compiled.function(list(inputs))


def _rows(n, d, seed):
    x = np.random.default_rng(seed).standard_normal((n, d)).astype(np.float32)
    x[0, 5] = np.nan                 # ignored, as fmax ignores it
    x[1, :] = -np.inf                # a row of -inf: the max is -inf
    x[2, :] = np.nan                 # a row of NaN: the start, -inf
    x[3, d - 1] = np.inf
    x[4, :] = 0.0
    x[4, ::3] = -0.0
    return x


@pytest.mark.parametrize("scheduler", ["isl", "pluto"])
@pytest.mark.parametrize("tile", [True, False])
@pytest.mark.parametrize("n,d", [(37, 300), (5, 17), (12, 128)])
def test_row_max_is_the_in_order_loops(n, d, scheduler, tile, monkeypatch, tmp_path):
    x = _rows(n, d, n * d)
    kw = dict(scheduler=scheduler, tile=tile)
    text_off, off = _run(SOFTMAX, [x], monkeypatch, tmp_path, False, **kw)
    text_on, on = _run(SOFTMAX, [x], monkeypatch, tmp_path, True, **kw)
    assert "reduction(max:polyc_red)" in text_on and "reduction(" not in text_off
    for a, b in zip(on, off):
        np.testing.assert_array_equal(a, b)
    finite = np.isfinite(x).all(1)
    np.testing.assert_array_equal(on[1][finite], x[finite].max(1))
    e = np.exp(x[finite] - x[finite].max(1, keepdims=True))
    np.testing.assert_allclose(on[0][finite], e / e.sum(1, keepdims=True), rtol=1e-5,
                               atol=1e-7)


def test_the_cuda_target_is_untouched(monkeypatch, tmp_path):
    """The CUDA target maps its own schedule (no ``reduce`` mark): the emulated softmax
    gives the C target's row maxima, and a softmax within rounding."""
    x = _rows(37, 300, 9)
    _, want = _run(SOFTMAX, [x], monkeypatch, tmp_path, True)
    text, got = _run(SOFTMAX, [x], monkeypatch, tmp_path / "cuda", True, target="cuda",
                     emulate=True)
    assert "reduction(" not in text
    np.testing.assert_array_equal(got[1], want[1])
    np.testing.assert_allclose(got[0], want[0], rtol=1e-5, atol=1e-7)


def test_integer_row_min_and_specialised_sizes(monkeypatch, tmp_path):
    a = np.random.default_rng(3).integers(-2**31, 2**31 - 1, (3, 7, 45), dtype=np.int32)
    for specialize in (False, True):
        text, (mn,) = _run(ROW_MIN, [a], monkeypatch, tmp_path / str(specialize), True,
                           specialize=specialize)
        assert "reduction(min:polyc_red)" in text
        np.testing.assert_array_equal(mn, a.min(2))


def test_column_max_stays_vectorized_across_columns(monkeypatch, tmp_path):
    """A max over rows with contiguous columns vectorizes across columns (no gather)."""
    x = np.random.default_rng(4).standard_normal((50, 33)).astype(np.float32)
    text, (mx,) = _run(COLUMN_MAX, [x], monkeypatch, tmp_path, True)
    assert "reduction(" not in text
    np.testing.assert_array_equal(mx, x.max(0))


def test_only_order_free_reductions_from_their_identity_qualify():
    k = from_tc(SOFTMAX)
    assert reduce_problem(k.statement(_writer(k, "mx")), k) is None
    assert "no max or min" in reduce_problem(k.statement(_writer(k, "s")), k)
    k = from_tc("def f(float(N,D) X) -> (M) {\n M(n) = X(n,0)\n M(n) max= X(n,d)\n}")
    assert "does not start from" in reduce_problem(k.statement(_writer(k, "M")), k)


def test_a_reduce_mark_on_a_sum_is_refused(tmp_path):
    """The legality check names a ``reduce`` mark on a loop whose terms must stay in
    order (a float sum)."""
    k = from_tc("def f(float(N,D) X) -> (s) { s(n) +=! X(n,d) }").specialize(dict(N=4, D=8))
    init, red = (s.name for s in k.statements)
    tree = (f'{{ domain: "{{ {init}[n] : 0 <= n < 4; {red}[n, d] : 0 <= n < 4 and '
            f'0 <= d < 8 }}", child: {{ sequence: [ {{ filter: "{{ {init}[n] }}" }}, '
            f'{{ filter: "{{ {red}[n, d] }}", child: {{ schedule: "[{{ {red}[n, d] -> [(n)] }}]", '
            f'child: {{ mark: "reduce", child: {{ schedule: "[{{ {red}[n, d] -> [(d)] }}]" }} }} }} }} ] }} }}')
    with pytest.raises(ScheduleError, match="no vector reduction"):
        pipeline.compile_kernel(k, Options(cache_dir=str(tmp_path), schedule=tree))


def _writer(kernel, array):
    return next(s.name for s in kernel.statements if s.write.array == array and s.op != "=")


def test_a_max_started_from_data_keeps_its_gathers(monkeypatch, tmp_path):
    """Started from its first term (which may be NaN) instead of the identity, a max
    stays the in-order loop: the lanes, started from -inf, would lose that NaN."""
    src = "def f(float(N,D) X) -> (M) {\n M(n) = X(n,0)\n M(n) max= X(n,d)\n}"
    x = _rows(9, 40, 1)
    x[6, 0] = np.nan
    text, (m,) = _run(src, [x], monkeypatch, tmp_path, True)
    assert "reduction(" not in text
    _, (m_off,) = _run(src, [x], monkeypatch, tmp_path, False)
    np.testing.assert_array_equal(m, m_off)
