"""The middle of the pipeline: dependences, schedules, legality, dumps.

Dependences and schedules are compared as isl objects (``is_equal`` against maps
written in the test), never as printed text.
"""
from __future__ import annotations

import os

import islpy as isl
import numpy as np
import pytest

import polyc
from polyc import check, ir
from polyc import expr as E
from polyc.deps import compute_dependences
from polyc.frontend import from_tc
from polyc.options import Options
from polyc.pipeline import schedule_kernel
from polyc.schedule.scheduler import compute_schedule, fusion_groups

MATMUL = """
def matmul(float(M,K) A, float(K,N) B) -> (C) {
    C(m,n) +=! A(m,k) * B(k,n)
}"""
SOFTMAX = """
def softmax(float(N,C) X) -> (Y) {
    mx(n) max=! X(n,c)
    e(n,c) = exp(X(n,c) - mx(n))
    s(n) +=! e(n,c)
    Y(n,c) = e(n,c) / s(n)
}"""


def umap(text: str) -> isl.UnionMap:
    return isl.UnionMap(text)


def test_matmul_dependences():
    """The init reaches every update (reduction writes do not kill); the updates' own
    chain is a reduction dependence, not a validity one."""
    d = compute_dependences(from_tc(MATMUL))
    dom = "0 <= m < M and 0 <= n < N and 0 <= k < K"
    assert d.flow.is_equal(umap(f"[M,K,N] -> {{ S0[m,n] -> S1[m,n,k] : {dom} }}"))
    assert d.output.is_equal(d.flow)
    assert d.anti.is_empty()
    assert d.reduction.is_equal(umap(
        f"[M,K,N] -> {{ S1[m,n,k] -> S1[m,n,k2] : {dom} and k < k2 < K }}"))
    assert d.validity.is_subset(d.coincidence)


def test_non_commuting_update_keeps_its_chain():
    """``A(i) += A(i-1)``-like updates read their own array elsewhere: no relaxation."""
    k = from_tc("""
def scan(float(N) X) -> (Y) {
    Y(i) = X(i)
    Y(i) += Y(i-1) where i in 1:N
}""")
    d = compute_dependences(k)
    assert d.reduction.is_empty()
    assert not d.flow.intersect(umap("[N] -> { S1[i] -> S1[j] }")).is_empty()


def test_fusion_groups():
    k = from_tc(SOFTMAX)
    dims = lambda groups: [[len(s.iterators) for s in g] for g in groups]
    assert dims(fusion_groups(k, "min")) == [[1], [2], [2], [1], [2], [2]]
    assert dims(fusion_groups(k, "smart")) == [[1], [2, 2], [1], [2, 2]]
    assert dims(fusion_groups(k, "max")) == [[1, 2, 2, 1, 2, 2]]


@pytest.mark.parametrize("fusion", ["min", "smart", "max"])
def test_schedules_respect_dependences(fusion):
    for src in (MATMUL, SOFTMAX):
        k = from_tc(src)
        d = compute_dependences(k)
        check.check_schedule(k, d, compute_schedule(k, d, Options(fusion=fusion)))
        check.check_schedule(k, d, schedule_kernel(k, Options(fusion=fusion)).schedule)


def test_matmul_band_order_and_tiles():
    """The reduction band is ordered (m, k, n): n innermost for SIMD, m parallel."""
    s = schedule_kernel(from_tc(MATMUL), Options(fusion="smart", tile=(8, 4, 16))).schedule
    text = str(s)
    assert '"parallel"' in text and '"simd"' in text
    ast = isl.AstBuild.from_context(isl.Set("[M,K,N] -> { : M > 0 and K > 0 and N > 0 }"))
    c = ast.node_from_schedule(s).to_C_str()
    assert "+= 8" in c and "+= 4" in c and "+= 16" in c
    assert c.rindex("S1(") > c.rindex("for (")  # the statement sits in the innermost loop


def test_illegal_user_schedule_explained():
    k = from_tc(MATMUL)
    with pytest.raises(polyc.ScheduleError, match="breaks a dependence.*S0"):
        schedule_kernel(k, Options(schedule="[M,K,N] -> { S0[m,n] -> [1,m,n,0];"
                                            " S1[m,n,k] -> [0,m,n,k] }"))
    with pytest.raises(polyc.ScheduleError, match="cover"):
        schedule_kernel(k, Options(schedule="[M,K,N] -> { S0[m,n] -> [0,m,n,0] }"))


def test_parallel_mark_on_reduction_loop_refused():
    k = from_tc(MATMUL)
    d = compute_dependences(k)
    sched = isl.Schedule.from_domain(k.domain()).insert_partial_schedule(
        isl.MultiUnionPwAff.from_union_map(umap(
            "[M,K,N] -> { S0[m,n] -> [0,m,0,n]; S1[m,n,k] -> [1,m,k,n] }")))
    node = sched.get_root().child(0).band_split(2).child(0)  # the band (k/0, n)
    bad = node.insert_mark(isl.Id("parallel")).get_schedule()
    with pytest.raises(polyc.ScheduleError, match="carries a dependence"):
        check.check_schedule(k, d, bad)


def test_out_of_bounds_access_reported():
    sizes = ("N",)
    x = ir.Array("X", "float32", (E.Size("N"),))
    y = ir.Array("Y", "float32", (E.Size("N"),), "output")
    dom = ir.make_domain("S0", ("i",), sizes, {"i": (E.Const(0), E.Size("N"))})
    s = ir.Statement("S0", dom, ("i",), ir.Access("Y", (E.Index("i"),)), "=",
                     E.Read("X", (E.Binary("+", E.Index("i"), E.Const(1)),)), origin="line 1")
    k = ir.Kernel("shift", sizes, (x, y), (s,), ("X",), ("Y",))
    with pytest.raises(polyc.CompileError, match="out of bounds"):
        check.check_accesses_in_bounds(k)


def test_dump_writes_every_stage(tmp_path):
    op = polyc.define(MATMUL, dump_dir=str(tmp_path))
    A = np.ones((3, 4), np.float32)
    op(A, A.T.copy())
    names = sorted(os.listdir(tmp_path))
    for stage in ("ir", "deps", "schedule", "optimize", "c", "build"):
        assert any(n.endswith(f"-{stage}.txt") for n in names), (stage, names)


@pytest.mark.parametrize("src", [
    "def f(float(300,400) A) -> (s) { s +=! A(i,j) }",
    "def f(float(300,400) A) -> (s, t) {\n t(i, j) = A(i, j) * 2.0\n"
    " s +=! A(i, j) > 0.5 ? 1.0 : 0.0\n}"])
def test_no_wavefront_over_a_reduction_into_one_element(src):
    """A sum into a scalar over a 2-D domain: a permutable band with no parallel member.
    The wavefront of tiles (for skewed stencils) would run tiles that update the same
    scalar at once; the checker refused it and polyc fell back with a warning. Now the
    optimizer does not offer it, and the sum is right at 2 threads."""
    import warnings
    kernel = from_tc(src)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        scheduled = schedule_kernel(kernel, Options(threads=2))
    check.check_schedule(scheduled.kernel, scheduled.deps, scheduled.schedule)
    a = np.random.default_rng(0).random((300, 400)).astype(np.float32)
    out = polyc.define(src, options=Options(threads=2))(a)
    s = out[0] if isinstance(out, tuple) else out
    want = a.sum(dtype=np.float64) if "0.5" not in src else float((a > 0.5).sum())
    np.testing.assert_allclose(float(s), want, rtol=1e-5)


def test_flattened_read_starts_a_fusion_group():
    """A consumer reading its producer at a flat index (``T(1, 4*h + w)``: no loop of
    the two lines up) is not given to isl's scheduler together with it (smart fusion),
    though both have two loops; a consumer reading it loop for loop is; the results are
    the same."""
    from polyc.schedule.scheduler import fusion_groups
    src = ("def f(float(2,12) X) -> (Y) {{ T(a, p) = X(a, p) * 2.0 where a in 0:2, p in 0:12\n"
           "Y(h, w) = {read} + 1.0 where h in 0:{h}, w in 0:{w} }}")
    flat = polyc.define(src.format(read="T(1, 4*h + w)", h=3, w=4))
    groups = fusion_groups(flat.kernel, "smart")
    assert [len(g) for g in groups] == [1, 1]
    aligned = polyc.define(src.format(read="T(h, w)", h=2, w=12))
    assert [len(g) for g in fusion_groups(aligned.kernel, "smart")] == [2]
    x = np.arange(24, dtype=np.float32).reshape(2, 12)
    np.testing.assert_allclose(flat(x), (x[1] * 2.0 + 1.0).reshape(3, 4))
    np.testing.assert_allclose(aligned(x), x * 2.0 + 1.0)


def test_scheduler_budget_stays_off_the_shared_context(monkeypatch):
    """isl's operation budget is a context's: the budgeted scheduler runs in a private
    context, so that other threads' isl calls on the kernel's context (a model's steps
    compiled in parallel) never count against it and fail."""
    from polyc.schedule import scheduler

    seen = []
    real = scheduler._isl_schedule

    def spy(kernel, deps, group, whole_component, ctx=None):
        seen.append((kernel.context.get_ctx().get_max_operations(),
                     ctx is not None and ctx.get_max_operations()))
        return real(kernel, deps, group, whole_component, ctx)

    monkeypatch.setattr(scheduler, "_isl_schedule", spy)
    k = from_tc("def mm(float(M,K) A, float(K,N) B) -> (C) { C(m,n) +=! A(m,k) * B(k,n) }")
    sched = compute_schedule(k, compute_dependences(k), Options())
    assert seen and all(shared == 0 and private == scheduler.ISL_OPERATIONS
                        for shared, private in seen)
    check.check_schedule(k, compute_dependences(k), sched)
