"""Sums down the columns of a row-major matrix, ``x(i) +=! A(j,i) * y(j)``
(:func:`polyc.schedule.cache_blocks.sums_down_columns`): untiled rows, the steps of the
sum unrolled and jammed into the vector loop in their order (``optimize._jam``), a last
step of fewer rows apart; the results against numpy at sizes that are no multiple of
the jam or of a vector, every dtype it applies to, both schedulers, 1 and 2 threads."""
from __future__ import annotations

import re

import numpy as np
import pytest

import polyc
from polyc.schedule import machine, optimize

SRC = "def c({t}(N,M) A, {t}(N) y) -> (x) {{ x(i) +=! A(j,i) * y(j) }}"
TYPES = {"float": np.float32, "double": np.float64, "int32": np.int32}


def _body_copies(src: str, write: str) -> int:
    """The most statements ``write +=`` in the body of one ``omp simd`` loop."""
    most = 0
    for m in re.finditer(r"#pragma omp simd\n\s*for \([^\n]*\n(\s*)\{\n(.*?)\n\1\}", src, re.S):
        most = max(most, m.group(2).count(f"{write} +="))
    return most


@pytest.mark.parametrize("scheduler", ["isl", "pluto"])
@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize("n,m", [(2003, 1001), (37, 13), (3, 17), (1, 1)])
@pytest.mark.parametrize("dtype", ["float", "double", "int32"])
def test_sums_down_columns_match_numpy(dtype, n, m, threads, scheduler):
    rng = np.random.default_rng(n * m)
    t = TYPES[dtype]
    if dtype == "int32":
        a, y = rng.integers(-50, 50, (n, m), dtype=t), rng.integers(-50, 50, n, dtype=t)
    else:
        a, y = rng.standard_normal((n, m)).astype(t), rng.standard_normal(n).astype(t)
    op = polyc.define(SRC.format(t=dtype), threads=threads, scheduler=scheduler)
    got = op(a, y)
    want = (y.astype(np.float64) @ a.astype(np.float64)).astype(t)
    if dtype == "int32":
        np.testing.assert_array_equal(got, want)
    else:
        np.testing.assert_allclose(got, want, rtol=1e-4 if dtype == "float" else 1e-12,
                                   atol=1e-3 if dtype == "float" else 1e-12)
    if n >= 4 and m >= 16:
        src = op.compiled_for({"N": n, "M": m}).c_source
        assert _body_copies(src, "x[i]") == optimize.JAM_SUMS, src
        if threads == 1:  # whole rows: the vector loop runs over all the columns
            assert f"<= {m - 1}; c" in src


def test_the_sums_take_whole_rows_and_unrolled_steps():
    """Float 2003 x 1001, one thread: 500 steps of 4 rows, each a vector loop over a
    whole row with the 4 rows' terms in order, then the last 3 rows apart."""
    op = polyc.define(SRC.format(t="float"), threads=1)
    a = np.ones((2003, 1001), np.float32)
    np.testing.assert_array_equal(op(a, np.ones(2003, np.float32)), np.full(1001, 2003.0))
    src = op.compiled_for({"N": 2003, "M": 1001}).c_source
    assert re.search(r"for \(int64_t (c\d+) = 0; \1 <= 499; \1 \+= 1\)", src)
    rows = [int(x) for x in re.findall(r"const int64_t j = (?:4 \* c\d+ \+ )?(\d+);", src)]
    assert rows[-3:] == [2000, 2001, 2002] and _body_copies(src, "x[i]") == 4
    assert "if (" not in src[src.index("x[i] = 0"):]  # no test inside the vector loops


def test_sums_too_large_for_the_l1_keep_their_tiles(monkeypatch):
    """Where the sums (the columns of ``x``) do not fit half the L1, the band keeps its
    tiles (each tile's columns reused from the L1) and nothing is jammed."""
    monkeypatch.setenv("POLYC_L1D_BYTES", "4096")
    machine.l1d_bytes.cache_clear()
    try:
        op = polyc.define(SRC.format(t="float"), threads=1)
        a = np.random.default_rng(1).standard_normal((300, 1001)).astype(np.float32)
        y = np.random.default_rng(2).standard_normal(300).astype(np.float32)
        np.testing.assert_allclose(op(a, y), y @ a, rtol=1e-4, atol=1e-3)
        assert _body_copies(op.compiled_for({"N": 300, "M": 1001}).c_source, "x[i]") == 1
    finally:
        monkeypatch.delenv("POLYC_L1D_BYTES")
        machine.l1d_bytes.cache_clear()


BICG = """
def bicg(double(N,M) A, double(M) p, double(N) r) -> (s, q) {
    s(j) +=! r(i) * A(i,j)
    q(i) +=! A(i,j) * p(j)
}"""


@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize("n,m", [(301, 97), (250, 131)])
def test_fused_sums_down_columns_jam_from_each_fused_tile(n, m, threads, monkeypatch):
    """bicg with an L2 of 64 KB: its two sweeps over ``A`` fuse along the rows, in
    fused tiles of some rows (no multiple of 4, as a rule); the sums down the columns
    (``s``) count their steps of 4 rows from each tile's start, the last one shorter,
    with no test inside a vector loop; exact against numpy."""
    monkeypatch.setenv("POLYC_L2_BYTES", "65536")
    machine.l2_bytes.cache_clear()
    try:
        rng = np.random.default_rng(n)
        a, p, r = rng.standard_normal((n, m)), rng.standard_normal(m), rng.standard_normal(n)
        op = polyc.define(BICG, threads=threads)
        s, q = op(a, p, r)
        np.testing.assert_allclose(s, r @ a, rtol=1e-12, atol=1e-12)
        np.testing.assert_allclose(q, a @ p, rtol=1e-12, atol=1e-12)
        src = op.compiled_for({"N": n, "M": m}).c_source
        # (steps from the fused tile's start: ``i = R * c0 + 4 * c3 + 3``)
        assert re.search(r"i = \d+ \* c0 \+ 4 \* c\d+ \+ 3;", src), src
        assert _body_copies(src, "s[j]") == optimize.JAM_SUMS
        for m_ in re.finditer(r"#pragma omp simd\n\s*for \([^\n]*\n(\s*)\{\n(.*?)\n\1\}", src,
                              re.S):
            assert "if (" not in m_.group(2), m_.group(0)
    finally:
        monkeypatch.delenv("POLYC_L2_BYTES")
        machine.l2_bytes.cache_clear()


@pytest.mark.parametrize("scheduler", ["isl", "pluto"])
def test_sums_down_columns_on_cuda_emulated(scheduler):
    """The same sums on the CUDA target, emulated on the CPU, at odd sizes: numpy's."""
    rng = np.random.default_rng(5)
    a, y = rng.standard_normal((203, 77)), rng.standard_normal(203)
    op = polyc.define(SRC.format(t="double"), target="cuda", emulate=True, scheduler=scheduler)
    np.testing.assert_allclose(op(a, y), y @ a, rtol=1e-12, atol=1e-12)
