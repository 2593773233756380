"""Cache blocking of register-tiled contractions (polyc/schedule/cache_blocks.py): the row
block a cache tile gets from the L2 size and the thread count, and results against numpy on
sizes that are not multiples of any tile (partial row blocks, partial register tiles), for
matmul, batched matmul and a 1x1 convolution, under 1 and 2 threads."""
from __future__ import annotations

import re

import numpy as np
import pytest
from conftest import assert_matches_numpy, random_inputs
from test_e2e_numpy import CASES

import polyc
from polyc.schedule import cache_blocks, machine

pytestmark = pytest.mark.filterwarnings("error::polyc.errors.PolycWarning")

MATMUL = CASES["matmul"][0]
BMM, _, BMM_REF = CASES["batched_matmul"]
CONV1X1 = """
def conv1x1(float(N,C,H,W) I, float(F,C) Wt) -> (O) {
    O(n,f,h,w) +=! I(n,c,h,w) * Wt(f,c)
}"""
TOL = dict(rtol=1e-4, atol=1e-3)


def _check(op, shapes, ref, seed=0):
    xs = random_inputs([(s, "float32") for s in shapes], seed)
    assert_matches_numpy(op(*xs), ref(*xs), **TOL)


def _row_block(op) -> int:
    """The cache tile of ``m`` in the contraction's tile band (``m - (m) mod R``)."""
    found = re.findall(r"S1\[m, n, k\] -> \[\(m - \(m\) mod ([0-9]+)\)\]", str(op.schedule))
    assert found, op.schedule
    return int(found[0])


@pytest.mark.parametrize("extent,budget,threads,mr,rows", [
    (2048, 256, 2, 8, 256),   # 8 blocks: 4 per thread
    (1024, 256, 2, 8, 256),
    (1280, 256, 2, 8, 216),   # 6 equal blocks rather than 5 of 256 (3 + 2 per thread)
    (300, 256, 2, 8, 152),    # two halves, not 256 + 44
    (300, 256, 1, 8, 152),
    (7, 256, 2, 8, 8),        # never below one register tile
    (1, 256, 1, 6, 6),
])
def test_balanced_rows(extent, budget, threads, mr, rows):
    assert cache_blocks.balanced_rows(extent, budget, threads, mr) == rows


@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize("m,k,n", [(1, 1, 1), (7, 7, 7), (37, 37, 37), (130, 130, 130),
                                   (300, 300, 300), (300, 37, 513), (517, 300, 70)])
def test_matmul_odd_sizes(m, k, n, threads):
    op = polyc.define(MATMUL, threads=threads)
    _check(op, [(m, k), (k, n)], lambda A, B: A @ B)


@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize("b,m,k,n", [(1, 7, 37, 130), (3, 300, 37, 70), (2, 130, 300, 37)])
def test_batched_matmul_odd_sizes(b, m, k, n, threads):
    op = polyc.define(BMM, threads=threads)
    _check(op, [(b, m, k), (b, k, n)], BMM_REF)


@pytest.mark.parametrize("threads", [1, 2])
def test_conv1x1(threads):
    op = polyc.define(CONV1X1, threads=threads)
    _check(op, [(2, 37, 13, 70), (300, 37)],
           lambda I, W: np.einsum("nchw,fc->nfhw", I, W))


def test_rows_balance_threads(monkeypatch):
    """600 rows on a 1 MB L2 (budget 256) and 2 threads: 4 blocks of 152 (the last 144)."""
    monkeypatch.setattr(machine, "l2_bytes", lambda: 1 << 20)
    op = polyc.define(MATMUL, threads=2, register_tile=(8, 64))
    _check(op, [(600, 256), (256, 70)], lambda A, B: A @ B)
    assert _row_block(op) == 152
    assert "omp parallel for" in op.c_source


def test_rows_from_l2_size(monkeypatch):
    """The row block follows the L2: a quarter of it holds the A block (rows x 256)."""
    monkeypatch.setattr(machine, "l2_bytes", lambda: 1 << 20)
    op = polyc.define(MATMUL, threads=1, register_tile=(8, 64))
    _check(op, [(2048, 256), (256, 64)], lambda A, B: A @ B)
    assert _row_block(op) == 256
    monkeypatch.setattr(machine, "l2_bytes", lambda: 256 << 10)
    small = polyc.define(MATMUL, threads=1, register_tile=(8, 64))
    _check(small, [(2048, 256), (256, 64)], lambda A, B: A @ B)
    assert _row_block(small) == 64


def test_explicit_tiles_and_parametric_kernels_keep_their_rows():
    # (8-row register tiles: the rows are whole register tiles)
    op = polyc.define(MATMUL, tile=(32, 64, 512), threads=1, register_tile=(8, 64))
    _check(op, [(300, 37), (37, 70)], lambda A, B: A @ B)
    assert _row_block(op) == 32
    par = polyc.define(MATMUL, specialize=False, threads=2, register_tile=(8, 64))
    _check(par, [(300, 37), (37, 70)], lambda A, B: A @ B)
    assert _row_block(par) == 32
