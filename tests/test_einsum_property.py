"""``polyc.einsum`` against ``numpy.einsum``: random specifications (hypothesis) and a
table of classic ones.

The random specifications have 1-3 operands of rank 0-4 over a small alphabet (with an
upper-case letter sometimes, which changes how polyc names sizes), letters repeated within
an operand (diagonals and traces), batch letters shared by every operand, implicit outputs
and explicit ones (any subset of the letters, in any order), and any number of reduced
letters. Every letter has one size in 1..6. Floats are compared with tolerances that grow
with the reduction length; integers exactly.
"""
from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import polyc

LOWER = "abcde"
UPPER = "A"
FLOATS = ("float32", "float64")
INTS = ("int32", "int64")


@st.composite
def einsum_problems(draw):
    """(spec, shapes, dtypes, seed).

    Choices are ordered so that hypothesis's simplest draws (the first element of each
    ``sampled_from``, the identity permutation) are still interesting: two rank-2
    operands with distinct letters and an explicit output.
    """
    alphabet = LOWER + (UPPER if draw(st.sampled_from((False, True))) else "")
    n_ops = draw(st.sampled_from((2, 3, 1)))
    batch = draw(st.sampled_from((0, 1, 2))) if n_ops > 1 else 0
    order = draw(st.permutations(alphabet))
    batch_letters, rest = list(order[:batch]), order[batch:]
    operands = []
    for k in range(n_ops):
        rank = draw(st.sampled_from((2, 3, 1, 4, 0)))
        rank = max(rank, batch)
        # each operand takes a window of the other letters, so operands share some
        own = list(draw(st.permutations(rest)))[:rank - batch] if k else rest[:rank - batch]
        if own and draw(st.sampled_from((False, False, True))):  # a diagonal or a trace
            own[draw(st.integers(0, len(own) - 1))] = draw(st.sampled_from(own))
        operands.append("".join(draw(st.permutations(batch_letters + list(own)))))
    used = sorted({c for op in operands for c in op})
    if draw(st.sampled_from((False, True))):
        spec = ",".join(operands)                   # implicit output
    else:
        out = draw(st.permutations(used))[:draw(st.integers(0, len(used)))] if used else []
        spec = ",".join(operands) + "->" + "".join(out)
    size = {c: draw(st.sampled_from((3, 1, 2, 4, 5, 6))) for c in used}
    shapes = [tuple(size[c] for c in op) for op in operands]
    pool = draw(st.sampled_from((FLOATS, FLOATS, INTS)))
    if draw(st.sampled_from((False, False, False, True))):  # sometimes mixed dtypes
        dtypes = [draw(st.sampled_from(pool)) for _ in operands]
    else:
        dtypes = [draw(st.sampled_from(pool))] * n_ops
    return spec, shapes, dtypes, draw(st.integers(0, 2**32 - 1))


def _inputs(shapes, dtypes, seed):
    rng = np.random.default_rng(seed)
    out = []
    for shape, dtype in zip(shapes, dtypes):
        if np.dtype(dtype).kind == "f":
            out.append(rng.standard_normal(shape).astype(dtype))
        else:
            out.append(rng.integers(-4, 5, size=shape).astype(dtype))
    return out


def _reduction_length(spec, shapes):
    """How many products each output element sums (1 when nothing is reduced)."""
    lhs, arrow, rhs = spec.partition("->")
    operands = lhs.split(",")
    size = {c: n for op, shape in zip(operands, shapes) for c, n in zip(op, shape)}
    if arrow:
        out = set(rhs)
    else:
        counts = {c: lhs.count(c) for c in size}
        out = {c for c, n in counts.items() if n == 1}
    return math.prod(n for c, n in size.items() if c not in out)


def check_einsum(spec, *operands):
    got = polyc.einsum(spec, *operands)
    want = np.einsum(spec, *operands)
    assert isinstance(got, np.ndarray), type(got)
    assert got.shape == want.shape, (spec, got.shape, want.shape)
    assert got.dtype == want.dtype, (spec, got.dtype, want.dtype)
    if want.dtype.kind in "iu":
        np.testing.assert_array_equal(got, want, err_msg=spec)
        return
    n = _reduction_length(spec, [np.shape(x) for x in operands])
    eps = np.finfo(want.dtype).eps
    # each operand is O(1); a sum of n products carries ~n*eps relative rounding error
    tol = 8 * eps * max(n, 1) * (1 + len(operands))
    scale = max(1.0, float(np.sqrt(n)))
    np.testing.assert_allclose(got, want, rtol=tol, atol=tol * scale, err_msg=spec)


@settings(max_examples=40, deadline=None, database=None, derandomize=True,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(einsum_problems())
def test_einsum_matches_numpy(problem):
    spec, shapes, dtypes, seed = problem
    check_einsum(spec, *_inputs(shapes, dtypes, seed))


CLASSIC = [
    ("ij,jk->ik", [(7, 5), (5, 3)]),
    ("ii->", [(6, 6)]),
    ("ii->i", [(6, 6)]),
    ("bij,bjk->bik", [(3, 4, 5), (3, 5, 2)]),
    ("ijk->", [(2, 3, 4)]),
    ("ij->ji", [(3, 7)]),
    ("i,j->ij", [(4,), (5,)]),
    ("ijkl,jl->ik", [(2, 3, 4, 5), (3, 5)]),
    ("ij,ij->", [(4, 6), (4, 6)]),
    ("ij,ij->ij", [(4, 6), (4, 6)]),
    ("...ij,...jk->...ik", [(2, 3, 4, 5), (2, 3, 5, 6)]),
    ("...ij,...jk->...ik", [(4, 5), (5, 6)]),
    ("ij,jk", [(7, 5), (5, 3)]),
]


@pytest.mark.parametrize("dtype", ["float32", "float64", "int64"])
@pytest.mark.parametrize("spec,shapes", CLASSIC, ids=[f"{s}:{len(sh[0])}d" for s, sh in CLASSIC])
def test_classic_einsums(spec, shapes, dtype):
    check_einsum(spec, *_inputs(shapes, [dtype] * len(shapes), seed=len(spec)))
