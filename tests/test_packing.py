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


def test_rows_of_unequal_work_take_several_blocks_a_thread():
    """A triangle's rows (unequal work) take at least 4 blocks a thread: syrk's 301 rows
    at 2 threads 42 rows a block (8 blocks), not two halves of 154."""
    assert cache_blocks.balanced_rows(301, 337, 2, 7) == 154
    assert cache_blocks.balanced_rows(301, 337, 2, 7, per_thread=4) == 42
    assert cache_blocks.balanced_rows(2048, 256, 2, 8, per_thread=4) == 256  # (already 4)


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
    """1200 rows on a 1 MB L2 and 2 threads (the A block takes half the L2: budget 512
    rows of 256): 4 blocks of 304 (the last 288); 600 rows, 2 blocks of 304. One thread:
    the same budget, 600 rows in 2 blocks of 304; 1100 rows in 3 of 368."""
    monkeypatch.setattr(machine, "l2_bytes", lambda: 1 << 20)
    for m, rows in ((1200, 304), (600, 304)):
        op = polyc.define(MATMUL, threads=2, register_tile=(8, 64))
        _check(op, [(m, 256), (256, 70)], lambda A, B: A @ B)
        assert _row_block(op) == rows, m
        assert "omp parallel for" in op.c_source
    for m, rows in ((600, 304), (1100, 368)):
        one = polyc.define(MATMUL, threads=1, register_tile=(8, 64))
        _check(one, [(m, 256), (256, 70)], lambda A, B: A @ B)
        assert _row_block(one) == rows, m


def test_rows_from_l2_size(monkeypatch):
    """The row block follows the L2: half of it holds the A block (rows x 256)."""
    monkeypatch.setattr(machine, "l2_bytes", lambda: 1 << 20)
    op = polyc.define(MATMUL, threads=1, register_tile=(8, 64))
    _check(op, [(2048, 256), (256, 64)], lambda A, B: A @ B)
    assert _row_block(op) == 512
    monkeypatch.setattr(machine, "l2_bytes", lambda: 256 << 10)
    small = polyc.define(MATMUL, threads=1, register_tile=(8, 64))
    _check(small, [(2048, 256), (256, 64)], lambda A, B: A @ B)
    assert _row_block(small) == 128


def test_explicit_tiles_and_parametric_kernels_keep_their_rows():
    # (8-row register tiles: the rows are whole register tiles)
    op = polyc.define(MATMUL, tile=(32, 64, 512), threads=1, register_tile=(8, 64))
    _check(op, [(300, 37), (37, 70)], lambda A, B: A @ B)
    assert _row_block(op) == 32
    par = polyc.define(MATMUL, specialize=False, threads=2, register_tile=(8, 64))
    _check(par, [(300, 37), (37, 70)], lambda A, B: A @ B)
    assert _row_block(par) == 32


def test_few_rows_split_their_columns():
    """16 x 784 x 512 on 2 threads: split by rows each thread streams all of ``B``
    (1.6 MB) for its 8 rows; split by columns each reads half of it in 1 KB runs of each
    row, which is not a fine split (``optimize.FINE_SPLIT_BYTES``): the columns."""
    op = polyc.define(MATMUL, threads=2)
    _check(op, [(16, 784), (784, 512)], lambda A, B: A @ B)
    lines = op.c_source.splitlines()
    loops = [lines[i + 1].strip() for i, x in enumerate(lines) if "omp parallel for" in x]
    assert loops and not re.match(r"for \(int64_t c0 = 0; c0 <= 15;", loops[-1]), loops


def test_near_tie_keeps_the_row_split(monkeypatch, avx512_model):
    """2100 x 256 x 2100 on 2 threads: a row split leaves each thread all of the packed
    ``B`` (33 blocks of 64 columns: 0.6% more bytes than ``A``), a split of the column
    blocks all of ``A``. Within :data:`optimize.SHARED_SLACK` that is a tie, and the
    threads split the rows (each reuses its ``A`` block over every column block; matmul
    3000 by column blocks streamed ``A`` once per block); with no slack, the column
    blocks: the busiest thread's 17 blocks are 4.25 KB of each row of ``C``, not a fine
    split (``optimize.FINE_SPLIT_BYTES``). At 1000 x 1000 x 400 each thread's columns
    are 800 bytes of a row, a fine split: the rows even with no slack. All right."""
    from polyc.schedule import machine, optimize
    monkeypatch.setattr(machine, "l2_bytes", lambda: 1 << 20)  # (the tiles of a 1 MB L2)
    shapes = [(2100, 256), (256, 2100)]

    def parallel_loops(op):
        lines = op.c_source.splitlines()
        return [lines[i + 1].strip() for i, x in enumerate(lines) if "omp parallel for" in x]

    op = polyc.define(MATMUL, threads=2)
    _check(op, shapes, lambda A, B: A @ B)
    assert "_packed[" in op.c_source
    assert re.match(r"for \(int64_t c0 = 0; c0 <= 2099; c0 \+= \d+\)", parallel_loops(op)[-1])
    monkeypatch.setattr(optimize, "SHARED_SLACK", 1.0)
    cols = polyc.define(MATMUL, threads=2)
    _check(cols, shapes, lambda A, B: A @ B)
    assert parallel_loops(cols)[-1] == "for (int64_t c0 = 0; c0 <= 32; c0 += 1)"
    fine = polyc.define(MATMUL, threads=2)
    _check(fine, [(1000, 1000), (1000, 400)], lambda A, B: A @ B)
    assert re.match(r"for \(int64_t c0 = 0; c0 <= 999; c0 \+= \d+\)", parallel_loops(fine)[-1])
