"""Differential fuzzing of polyc against an independent TC interpreter (tests/fuzz/).

* unit tests of the interpreter (the oracle) against hand-computed numpy results;
* the printer/parser round trip of generated programs;
* a fixed-seed slice of the campaign (``python3 tests/fuzz/campaign.py`` runs long ones);
* every reproducer kept in ``tests/fuzz/regressions/`` (bugs the fuzzer found).
"""
from __future__ import annotations

import glob
import importlib.util
import os
import sys
import warnings

import numpy as np
import pytest

from polyc.errors import PolycWarning

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "fuzz"))

import gen as G  # noqa: E402
import interp as I  # noqa: E402
import shrink as S  # noqa: E402

REGRESSIONS = sorted(glob.glob(os.path.join(os.path.dirname(__file__), "fuzz", "regressions",
                                            "*.py")))
#: the CI slice: seeds and count (about a minute on two cores)
SLICE_SEED, SLICE_N = 20240, 300
#: the CUDA target's slice, run by the CPU emulation (about half a minute; campaigns with
#: --target cuda run long ones)
CUDA_SLICE_SEED, CUDA_SLICE_N = 30240, 40


def interpret(src, *inputs, name=None):
    defs = I.parse(src)
    d = defs[0] if name is None else I.find_def(defs, name)
    outs, _ = I.run(d, list(inputs))
    return outs


# -- the oracle itself ---------------------------------------------------------------------

def test_interp_matmul():
    rng = np.random.default_rng(0)
    a, b = rng.random((3, 4), np.float32), rng.random((4, 5), np.float32)
    c, = interpret("def mm(float(M,K) A, float(K,N) B) -> (C) { C(m,n) +=! A(m,k) * B(k,n) }",
                   a, b)
    assert c.dtype == np.float32 and c.shape == (3, 5)
    np.testing.assert_allclose(c, a @ b, rtol=1e-6)


def test_interp_where_reduction():
    x = np.arange(12, dtype=np.float64).reshape(3, 4)
    s, m = interpret("""def f(double(M,N) X) -> (S, Mx) {
        S(i) +=! X(i, j) where j in 1:N
        Mx max=! X(i, j) * 2 where i in 0:M - 1
    }""", x)
    np.testing.assert_array_equal(s, x[:, 1:].sum(1))
    assert m.shape == () and m == 2 * x[:2].max()


def test_interp_min_range():
    # j ranges over [0, min(Q,R)); w over [0, Q - min(Q,R) + 1)
    a = np.array([[1, -2, 3, 4, 5]], np.float32)
    o, = interpret("""def f(float(Q, R) A) -> (O1) {
      O1(w) *=! fmax(fabs(A(w + j, j)), A(j, j))
    }""", a)
    assert o.shape == (1,) and o[0] == 1.0
    a = np.arange(20, dtype=np.float32).reshape(5, 4) - 7
    o, = interpret("""def f(float(Q, R) A) -> (O1) {
      O1(w) *=! fmax(fabs(A(w + j, j)), A(j, j))
    }""", a)
    want = [np.prod([max(abs(a[w + j, j]), a[j, j]) for j in range(4)]) for w in range(2)]
    np.testing.assert_allclose(o, want, rtol=1e-6)


def test_interp_guarded_padding_and_domain():
    x = np.arange(1, 6, dtype=np.float32)
    w = np.array([1, 10, 100], np.float32)
    o, v = interpret("""def conv(float(N) X, float(K) W) -> (O, V) {
      O(i) +=! (i + k - 1 >= 0 && i + k - 1 < N) ? X(i + k - 1) * W(k) : 0 where i in 0:N, k in 0:K
      V(i) +=! X(i + k) * W(k)
    }""", x, w)
    pad = np.concatenate([[0], x, [0]])
    np.testing.assert_array_equal(o, [pad[i:i + 3] @ w for i in range(5)])
    np.testing.assert_array_equal(v, [x[i:i + 3] @ w for i in range(3)])


def test_interp_integer_semantics_and_types():
    a = np.array([-7, 7, -1, 6], np.int32)
    q, r, f, b = interpret("""def f(int32(N) A) -> (Q, R, F, B) {
      Q(i) = A(i) / 2
      R(i) = A(i) % 3
      F(i) = A(i) / 2.0
      B(i) = A(i) > 0 && A(i) < 7
    }""", a)
    assert q.dtype == np.int32 and list(q) == [-3, 3, 0, 3]        # truncation
    assert list(r) == [2, 1, 2, 0]                # polyc's %: floor modulo (divisor's sign)
    assert f.dtype == np.float32 and list(f) == [-3.5, 3.5, -0.5, 3.0]
    assert b.dtype == np.bool_ and list(b) == [False, False, False, True]


def test_interp_identity_and_accumulation():
    x = np.array([[1, 5], [3, 2]], np.int64)
    mn, acc = interpret("""def f(int64(M,N) X) -> (Mn, Acc) {
      Mn(i) min=! X(i, j) where j in 0:0
      Acc(i) = X(i, 0)
      Acc(i) += X(i, j) * i
    }""", x)
    assert list(mn) == [2 ** 63 - 1] * 2
    assert list(acc) == [1, 3 + 3 + 2]


def test_interp_rejects_invalid():
    with pytest.raises(I.Invalid):   # an unguarded read does not extend the range
        interpret("def f(float(N) A) -> (O) { O(i) = A(i + k) }", np.ones(3, np.float32))
    with pytest.raises(I.Invalid):   # a guard that does not protect the read
        interpret("def f(float(N) A) -> (O) { O(i) = i >= 0 ? A(i + 1) : 0 where i in 0:N }",
                  np.ones(3, np.float32))


def test_round_trip_of_generated_programs():
    for seed in range(200):
        c = G.case(seed)
        if c.einsum:
            continue
        src = c.source
        assert I.parse(src) == c.defs, src
        assert I.show_source(I.parse(src)) == src


def test_generator_is_deterministic():
    a, b = G.case(77), G.case(77)
    assert a.source == b.source and a.options == b.options
    assert all(np.array_equal(x, y) for x, y in zip(a.inputs, b.inputs))


# -- polyc against the oracle ----------------------------------------------------------------

@pytest.fixture(scope="module")
def cache_dir(tmp_path_factory):
    old = os.environ.get("POLYC_CACHE_DIR")
    d = str(tmp_path_factory.mktemp("polyc-fuzz-cache"))
    os.environ["POLYC_CACHE_DIR"] = d
    yield d
    if old is None:
        os.environ.pop("POLYC_CACHE_DIR", None)
    else:
        os.environ["POLYC_CACHE_DIR"] = old


@pytest.mark.parametrize("target, first, count", [("c", SLICE_SEED, SLICE_N),
                                                  ("cuda", CUDA_SLICE_SEED, CUDA_SLICE_N)])
def test_fuzz_slice(cache_dir, monkeypatch, target, first, count):
    """A fixed slice of the campaign (the CUDA target's through the CPU emulation);
    failures are reported with their source."""
    monkeypatch.setenv("POLYC_FUZZ_TARGET", target)
    failures = []
    for seed in range(first, first + count):
        c = G.case(seed)
        out = S.execute(c)
        if out.failed:
            failures.append(f"seed {seed}: {out.kind}: {out.message}\n{out.detail}\n"
                            f"{c.source or c.einsum}\ninputs {[a.shape for a in c.inputs]} "
                            f"options {c.options}")
    assert not failures, "\n\n".join(failures)


def test_sizes_dependent_access_refusal_is_an_invalid_case(cache_dir, monkeypatch):
    """Seed 7025 on the CUDA target (H200 campaign): ``B(i + 1, i - 1)`` guarded on its
    rows only reaches past ``B``'s columns when ``N > Q + 2``. Compiled for symbolic sizes,
    polyc refuses it, rightly: an invalid case, not a failure. Specialised to the drawn
    sizes (where it is in bounds), it compiles and agrees with the interpreter."""
    from dataclasses import replace
    monkeypatch.setenv("POLYC_FUZZ_TARGET", "cuda")
    case = G.case(7025)
    assert case.options["specialize"] is False
    out = S.execute(case)
    assert out.kind == "invalid" and "out of bounds" in out.message, out.message
    out = S.execute(replace(case, options={**case.options, "specialize": True}))
    assert out.kind == "ok", out.message


#: the schedule workbench's slice: random primitive sequences (tests/fuzz/workbench.py)
WORKBENCH_SEED, WORKBENCH_N, WORKBENCH_STEPS = 200, 25, 6


def test_workbench_fuzz_slice(cache_dir):
    """Random primitives on random programs: every step the workbench accepts leaves a
    schedule that computes the interpreter's result (seeds 207, 227, ... found a loop
    both unrolled and parallel, which gcc refuses to compile; seed 24 a shape with no
    schedule tree; seed 134 a compute_at replayed on sizes where its statement is empty;
    seed 1480, 8 steps, a cache_read copying a guarded read's out-of-bounds elements:
    heap corruption; seed 3017, registers replayed on sizes where the statement is empty)."""
    import workbench as W
    failures = []
    seeds = [(s, WORKBENCH_STEPS) for s in range(WORKBENCH_SEED, WORKBENCH_SEED + WORKBENCH_N)]
    for seed, steps in seeds + [(24, 5), (134, 5), (481, 6), (1480, 8), (3017, 8)]:
        r = W.run_isolated(seed, steps)
        if r["kind"] in ("wrong", "crash"):
            failures.append(f"seed {seed}: {r['kind']}: {r['message']}\n{r['source']}\n"
                            f"steps: {r['steps']}\n{r.get('detail', '')}")
    assert not failures, "\n\n".join(failures)


@pytest.mark.parametrize("path", REGRESSIONS, ids=[os.path.basename(p) for p in REGRESSIONS])
def test_regression(path, cache_dir):
    spec = importlib.util.spec_from_file_location(os.path.basename(path)[:-3], path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    if mod.SOURCE and not mod.EINSUM:   # the oracle still agrees with the recorded results
        d = I.find_def(I.parse(mod.SOURCE), mod.ENTRY or I.parse(mod.SOURCE)[0].name)
        outs, _ = I.run(d, mod.INPUTS)
        for e, s, o in zip(mod.EXPECTED, mod.STABLE, outs):
            assert o.shape == e.shape and o.dtype == e.dtype
            assert (np.isclose(o, e, equal_nan=True) | ~s).all() if e.dtype.kind == "f" \
                else ((o == e) | ~s).all()
    if getattr(mod, "SLOW", False) and not os.environ.get("POLYC_FUZZ_SLOW"):
        pytest.skip("a slow-compile reproducer (set POLYC_FUZZ_SLOW=1 to run it)")
    with warnings.catch_warnings():  # a warning (an optimisation given up) is no failure
        warnings.simplefilter("ignore", PolycWarning)
        if mod.OPEN:
            try:
                S._with_timeout(lambda: S.check_reproducer(mod), 20)
            except (Exception, TimeoutError) as e:  # noqa: BLE001
                pytest.xfail(f"{mod.OPEN}: {type(e).__name__}: {str(e)[:200]}")
            return
        S._with_timeout(lambda: S.check_reproducer(mod), 60)
