"""The schedule workbench (issue 11, part 1): schedules as immutable, legality-checked
objects edited by primitives. Per primitive: a legal use gives the numpy result on odd
sizes; an illegal use is refused naming the dependence (kind, statements, array, a
concrete pair of instances). Save, load and replay give the same C.
"""
from __future__ import annotations

import numpy as np
import pytest
from conftest import random_inputs

import polyc
from polyc.errors import ScheduleError

MATMUL = "def mm(float(M,K) A, float(K,N) B) -> (C) { C(m,n) +=! A(m,k) * B(k,n) }"
#: a producer and a consumer reading one element ahead: fusing needs a shift
SHIFTED = """
def pc(float(N) A) -> (B) {
  T(i) = A(i) * 2.0 where i in 0:N
  B(i) = T(i) + T(i + 1) where i in 0:N - 1
}
"""
#: three statements, two of them independent
CHAIN = """
def chain(float(M,N) X) -> (Y, Z) {
  Y(i, j) = X(i, j) + 1.0
  Z(i, j) = Y(i, j) * 2.0
}
"""


def mm_inputs(seed=0):
    return random_inputs([((37, 29), "float32"), ((29, 45), "float32")], seed)


def assert_matmul(op, space, seed=0):
    A, B = mm_inputs(seed)
    C = op.with_schedule(space)(A, B)
    np.testing.assert_allclose(C, A @ B, rtol=1e-4, atol=1e-4)


@pytest.fixture(scope="module")
def mm():
    return polyc.define(MATMUL)


def test_default_is_source_order_and_readable(mm):
    s = mm.schedule_space()
    assert s.statements == ("S0", "S1")
    assert s.loops("S1") == ("m", "n", "k")
    text = str(s)
    assert "for m:" in text and "S1: C(m, n) += (A(m, k) * B(k, n))" in text
    assert "S1: [1, m, n, k]" in text
    assert_matmul(mm, s)


@pytest.mark.parametrize("steps", [
    [("tile", "S1", ("m", "n"), (32, 16))],
    [("tile", "S1", ("m", "n", "k"), (8, 8, 8)), ("tile", "S1", ("m_tile",), (2,))],
    [("split", "S1", "k", 5)],
    [("interchange", "S1", "n", "k"), ("vectorize", "S1", "n")],
    [("reorder", "S1", "k", "m", "n")],
    [("skew", "S1", "m", "n", 2)],
    [("reverse", "S1", "n"), ("reverse", "S0", "m")],
    [("shift", "S1", "k", 3)],
    [("fuse", 2, "S0", "S1"), ("tile", "S1", ("m", "n"), (16, 16)), ("parallel", "S1", "m_tile")],
    [("fuse", 1, "S0", "S1"), ("distribute", "S0")],
    [("parallel", "S1", "m"), ("parallel", "S0", "n")],
    [("unroll", "S1", "k", 4)],
    [("interchange", "S1", "n", "k"), ("unroll_and_jam", "S1", "m", 4),
     ("vectorize", "S1", "n"), ("unroll", "S1", "k", 2)],
])
def test_legal_primitives_match_numpy(mm, steps):
    s = mm.schedule_space()
    for name, *args in steps:
        s = getattr(s, name)(*args)
    assert len(s.trace().steps) == len(steps)
    assert_matmul(mm, s)
    assert_matmul(mm, s, seed=1)


def test_parallel_reduction_loop_is_refused(mm):
    with pytest.raises(ScheduleError) as info:
        mm.schedule_space().parallel("S1", "k")
    msg = str(info.value)
    assert "parallel('S1', 'k') is illegal" in msg and "reduction dependence S1 -> S1" in msg
    assert "of C" in msg and "S1[" in msg


def test_fusing_a_consumer_that_reads_ahead_is_refused_with_the_fix():
    op = polyc.define(SHIFTED)
    s = op.schedule_space()
    with pytest.raises(ScheduleError) as info:
        s.fuse(1, "S0", "S1")
    msg = str(info.value)
    assert "flow dependence S0 -> S1 of T" in msg
    assert "writes what S1[" in msg  # a concrete pair of instances
    assert "legal after shift('S1', 'i', 1) first" in msg
    fused = s.shift("S1", "i", 1).fuse(1, "S0", "S1")
    A = random_inputs([((40,), "float32")])[0]
    B = op.with_schedule(fused)(A)
    np.testing.assert_allclose(B, 2 * A[:-1] + 2 * A[1:], rtol=1e-6)
    assert "for i:" in str(fused) and str(fused).count("for i") == 1


def test_reversing_a_fused_loop_with_a_carried_dependence_is_refused():
    op = polyc.define(SHIFTED)
    fused = op.schedule_space().shift("S1", "i", 1).fuse(1, "S0", "S1")
    with pytest.raises(ScheduleError, match="flow dependence S0 -> S1"):
        fused.reverse("S0", "i")


def test_statement_order_is_checked():
    op = polyc.define(CHAIN)
    s = op.schedule_space()
    with pytest.raises(ScheduleError, match="flow dependence S0 -> S1 of Y"):
        s.fuse(2, "S1", "S0")  # the consumer first
    both = s.fuse(2, "S0", "S1").parallel("S0", "i").vectorize("S1", "j")
    X = random_inputs([((13, 19), "float32")])[0]
    Y, Z = op.with_schedule(both)(X)
    np.testing.assert_allclose(Z, (X + 1) * 2)


def test_bad_arguments_are_named(mm):
    s = mm.schedule_space()
    with pytest.raises(ScheduleError, match="no loop 'q'.*m, n, k"):
        s.tile("S1", ("q",), (4,))
    with pytest.raises(ScheduleError, match="no statement 'S9'"):
        s.parallel("S9", "m")
    with pytest.raises(ScheduleError, match="consecutive"):
        s.tile("S1", ("m", "k"), (4, 4))
    with pytest.raises(ScheduleError, match="innermost"):
        s.vectorize("S1", "m")
    with pytest.raises(ScheduleError, match="positive"):
        s.split("S1", "k", 0)


def test_save_load_replay_give_the_same_c(mm, tmp_path):
    s = mm.schedule_space().fuse(2, "S0", "S1").tile("S1", ("m", "n"), (16, 8)) \
        .parallel("S1", "m_tile")
    path = tmp_path / "mm.sched"
    s.save(str(path))
    loaded = polyc.load_schedule(str(path))
    assert loaded.steps == s.trace().steps
    a, b = mm.with_schedule(s), mm.with_schedule(loaded)
    A, B = mm_inputs()
    np.testing.assert_array_equal(a(A, B), b(A, B))
    assert a.c_source == b.c_source
    again = mm.schedule_space().replay(loaded)
    assert str(again) == str(s)
    # the trace replays on other sizes (a new specialisation per call)
    A2, B2 = random_inputs([((5, 3), "float32"), ((3, 70), "float32")], 4)
    np.testing.assert_allclose(a(A2, B2), A2 @ B2, rtol=1e-5, atol=1e-5)


def test_saved_schedules_are_validated(tmp_path):
    bad = tmp_path / "bad.sched"
    bad.write_text('{"format": 1, "kernel": "mm", "steps": [["explode", "S1"]]}')
    with pytest.raises(ScheduleError, match="unknown primitive 'explode'"):
        polyc.load_schedule(str(bad))
    bad.write_text("not json")
    with pytest.raises(ScheduleError, match="not a saved polyc schedule"):
        polyc.load_schedule(str(bad))


def test_a_refused_trace_is_refused_at_with_schedule():
    op = polyc.define(SHIFTED)
    trace = polyc.ScheduleTrace((polyc.schedule.space.Step("fuse", (1, "S0", "S1")),))
    with pytest.raises(ScheduleError, match="flow dependence"):
        op.with_schedule(trace)


def test_tree_has_marks_and_sequences(mm):
    s = mm.schedule_space().fuse(2, "S0", "S1").parallel("S1", "m")
    text = s.isl_text()
    assert 'mark: "parallel"' in text and "sequence" in text
    compiled = mm.with_schedule(s)
    A, B = mm_inputs()
    compiled(A, B)
    assert "#pragma omp parallel for" in compiled.c_source


def test_compare_times_and_checks_variants(mm):
    s = mm.schedule_space()
    table = polyc.compare(mm, {"default": None, "source": s,
                               "tiled": s.tile("S1", ("m", "n"), (16, 32))},
                          sizes={"M": 37, "N": 45, "K": 29}, repeat=3)
    assert [r.name for r in table.rows] == ["default", "source", "tiled"]
    assert table.flops == 2 * 37 * 45 * 29  # one multiply and one add per instance of S1
    assert all(r.correct and r.seconds > 0 and r.gflops > 0 for r in table.rows)
    assert table.rows[0].speedup == 1.0
    text = str(table)
    assert "GFLOP/s" in text and text.count(" ok") == 3
    with pytest.raises(polyc.CallError, match="give the sizes"):
        polyc.compare(mm, {"default": None}, sizes={"M": 3})


def test_compare_c_input_restores_in_place_arrays():
    from test_scop import JACOBI_1D
    op = polyc.scop(JACOBI_1D)
    s = op.schedule_space()
    tiled = s.shift("S1", "i", 1).fuse(2, "S0", "S1").skew("S0", "t", "i", 2) \
        .tile("S0", ("t", "i"), (4, 32))
    table = polyc.compare(op, {"source": s, "tiled": tiled}, sizes={"T": 6, "N": 101},
                          repeat=3)
    assert all(r.correct for r in table.rows), str(table)
    assert table.flops == 2 * 6 * 99 * 3  # two statements, 99 points, 3 operations each


def test_unroll_pragmas_reach_the_c(mm):
    s = mm.schedule_space().interchange("S1", "n", "k").unroll_and_jam("S1", "m", 4) \
        .vectorize("S1", "n")
    assert "for m:  # unroll:4" in str(s)
    compiled = mm.with_schedule(s)
    assert_matmul(mm, s)
    src = compiled.c_source
    assert "#pragma GCC unroll 4" in src and "#pragma omp simd" in src
    with pytest.raises(ScheduleError, match="from 2 to 64"):
        s.unroll("S1", "k", 1)
    with pytest.raises(ScheduleError, match="outside its innermost loop"):
        mm.schedule_space().unroll_and_jam("S1", "k", 2)


def test_knobs_are_recorded_then_fixed(mm):
    s = mm.schedule_space().tile("S1", ("m", "n"), sizes=(polyc.knob([8, 16], "tm"),
                                                          polyc.knob([16, 32], "tn"))) \
        .parallel("S1", "m_tile")
    assert [k.name for k in s.knobs()] == ["tm", "tn"]
    assert list(s.candidates()) == [(8, 16), (8, 32), (16, 16), (16, 32)]
    assert "steps with knobs (not applied yet)" in str(s)
    with pytest.raises(ScheduleError, match="has knobs"):
        s.check()
    with pytest.raises(ScheduleError, match="has knobs"):
        mm.with_schedule(s)
    fixed = s.with_values({"tm": 16, "tn": 32})
    assert [str(x) for x in fixed.trace().steps] == [
        "tile('S1', ('m', 'n'), (16, 32))", "parallel('S1', 'm_tile')"]
    assert_matmul(mm, fixed)
    with pytest.raises(ScheduleError, match="not a value"):
        s.with_values((12, 16))


@pytest.mark.parametrize("strategy", ["exhaustive", "random", "model"])
def test_search_logs_every_candidate(tmp_path, strategy):
    from test_scop import JACOBI_1D
    op = polyc.scop(JACOBI_1D)
    fused = op.schedule_space().shift("S1", "i", 1).fuse(2, "S0", "S1")
    s = fused.skew("S0", "t", "i", polyc.knob([0, 2], "skew")) \
        .tile("S0", ("t", "i"), (polyc.knob([2, 4], "tt"), 16))
    log = tmp_path / "search.jsonl"
    found = polyc.search(op, s, sizes={"T": 5, "N": 67}, budget=120, strategy=strategy,
                         log=str(log), repeat=1, progress=False)
    assert found.tried == found.total == 4
    records = polyc.load_search_log(str(log))
    assert len(records) == 4 and {tuple(r.values.items()) for r in records} == {
        (("skew", a), ("tt", b)) for a in (0, 2) for b in (2, 4)}
    illegal = [r for r in records if r.values["skew"] == 0]
    assert all(not r.correct and r.error.startswith("illegal:") and "dependence" in r.error
               for r in illegal)  # rectangular time tiles of an unskewed stencil
    legal = [r for r in records if r.values["skew"] == 2]
    assert all(r.correct and r.seconds > 0 for r in legal)
    assert found.best is not None and found.best_record.values["skew"] == 2
    assert "candidates tried" in str(found)
    run_jacobi = __import__("test_scop").run_jacobi_1d
    run_jacobi(op.with_schedule(found.best), T=5, N=67)


def test_search_budget_and_arguments(mm):
    s = mm.schedule_space().split("S1", "k", polyc.knob([4, 8]))
    found = polyc.search(mm, s, sizes={"M": 9, "N": 9, "K": 9}, budget=0, progress=False)
    assert found.tried == 0 and found.best is None and found.total == 2
    with pytest.raises(polyc.CallError, match="strategy"):
        polyc.search(mm, s, sizes={"M": 9, "N": 9, "K": 9}, strategy="annealing")
    with pytest.raises(ScheduleError, match="no knobs"):
        polyc.search(mm, mm.schedule_space(), sizes={"M": 9, "N": 9, "K": 9})
