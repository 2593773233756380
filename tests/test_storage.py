"""Storage: dead writes removed before scheduling (``polyc/dead.py``), temporaries
sharing storage once scheduled (``polyc/share.py``), the loop depth of border pieces in
``smart`` fusion, and bands left untiled where tiles reuse nothing
(``polyc.schedule.cache_blocks.streams``).

Every kernel is checked against numpy on sizes that are not multiples of the tiles, on
each scheduler option, and called twice (a wrongly shared temporary would read what an
earlier call or array left in the memory).
"""
from __future__ import annotations

import sys
from pathlib import Path

import islpy as isl
import numpy as np
import pytest

import polyc
from polyc import expr as E
from polyc import pipeline, share
from polyc.check import iter_nodes
from polyc.deps import compute_dependences
from polyc.frontend import from_tc
from polyc.schedule import cache_blocks, scheduler

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "examples" / "benchmarks"))
from polybench_kernels import _jacobi_ref, jacobi_tc  # noqa: E402

OPTIONS = {
    "default": polyc.Options(),
    "pluto": polyc.Options(scheduler="pluto"),
    "fusion-min": polyc.Options(fusion="min"),
    "fusion-max": polyc.Options(fusion="max"),
    "no-tile": polyc.Options(tile=False),
    "tile-8": polyc.Options(tile=(8, 8)),
    "generic-sizes": polyc.Options(specialize=False),
    "serial": polyc.Options(parallel=False),
}

# a copy, then its interior overwritten: the copy's interior is dead
BORDER = """
def k(float(N,N) X, float(N,N) Y_in) -> (Y) {
    Y(i,j) = Y_in(i,j)
    Y(i,j) = 0.25 * (X(i-1,j) + X(i+1,j) + X(i,j-1) + X(i,j+1)) where i in 1:N-1, j in 1:N-1
}"""


def _statement(kernel, array, index=0):
    return [s for s in kernel.statements if s.write.array == array][index]


# -- dead writes -------------------------------------------------------------------------

def test_overwritten_interior_leaves_the_border():
    kernel = pipeline.prepare_kernel(from_tc(BORDER))
    copy = _statement(kernel, "Y")
    border = isl.Set("[N] -> { S0[i, j] : 0 <= i < N and 0 <= j < N and "
                     "(i = 0 or i = N - 1 or j = 0 or j = N - 1) }")
    assert copy.domain.intersect_params(kernel.context).is_equal(
        border.intersect_params(kernel.context))
    assert scheduler.loop_depth(copy, kernel) == 1  # four one-loop pieces
    assert scheduler.loop_depth(_statement(kernel, "Y", 1), kernel) == 2


@pytest.mark.parametrize("n", [1, 2, 3, 37])
@pytest.mark.parametrize("opt", list(OPTIONS), ids=str)
def test_border_copy_runs_right(n, opt):
    rng = np.random.default_rng(n)
    x, y = rng.standard_normal((n, n), np.float32), rng.standard_normal((n, n), np.float32)
    want = y.copy()
    want[1:-1, 1:-1] = 0.25 * (x[:-2, 1:-1] + x[2:, 1:-1] + x[1:-1, :-2] + x[1:-1, 2:])
    op = polyc.define(BORDER, options=OPTIONS[opt])
    for _ in range(2):
        np.testing.assert_allclose(op(x, y), want, rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("source, kept", [
    # the copy is read before it is overwritten: all of it stays
    ("""def k(float(N) X) -> (Y, Z) {
          Y(i) = X(i)
          Z(i) = Y(i) * 2.0
          Y(i) = 3.0 * X(i) where i in 1:N
        }""", "all"),
    # a sum onto the copy reads it
    ("""def k(float(N,M) X) -> (Y) {
          Y(i) = X(i,0)
          Y(i) += X(i,j)
        }""", "all"),
    # all of it overwritten: the statement goes
    ("""def k(float(N) X) -> (Y) {
          Y(i) = X(i)
          Y(i) = 2.0 * X(i)
        }""", "none"),
    # a temporary nothing reads: the statement goes
    ("""def k(float(N) X) -> (Y) {
          T(i) = X(i) * 5.0
          Y(i) = X(i) + 1.0
        }""", "none"),
    # the overwrite reads indirectly: the copy is still all overwritten
    ("""def k(float(N) X, int32(N) I) -> (Y) {
          Y(i) = X(i)
          Y(i) = X(I(i)) where i in 0:N
        }""", "none"),
])
def test_what_the_dead_write_pass_keeps(source, kept):
    kernel = from_tc(source, allow_indirect=True)
    after = pipeline.prepare_kernel(kernel)
    first = kernel.statements[0]
    survivor = [s for s in after.statements if s.name == first.name]
    if kept == "all":
        assert survivor and survivor[0].domain.is_equal(first.domain)
    else:
        assert not survivor
    assert after.statements[-1].domain.is_equal(kernel.statements[-1].domain)


def test_statements_without_instances_go():
    """A statement whose domain is empty at the kernel's sizes (a sum over the steps
    after the first, with one step) runs nothing and is dropped, whatever its kind."""
    src = """def k(float(4, 1) X) -> (Y) {
                 Y(i) +=! X(i, j - 1) where j in 1:1
                 Y(i) = Y(i) + 1.0
             }"""
    kernel = from_tc(src)
    after = pipeline.prepare_kernel(kernel)
    assert len(after.statements) == len(kernel.statements) - 1
    x = np.arange(4, dtype=np.float32).reshape(4, 1)
    np.testing.assert_array_equal(polyc.define(src)(x), np.ones(4, np.float32))


def test_partly_overwritten_output_keeps_the_rest():
    src = """def k(float(N) X) -> (Y) {
                 Y(i) = X(i)
                 Y(i) = 0.0 where i in 0:N-1
             }"""
    kernel = pipeline.prepare_kernel(from_tc(src))
    assert kernel.statements[0].domain.intersect_params(kernel.context).is_equal(
        isl.Set("[N] -> { S0[i = N - 1] }").intersect_params(kernel.context))
    x = np.arange(9, dtype=np.float32) + 1
    np.testing.assert_array_equal(polyc.define(src)(x), np.where(np.arange(9) < 8, 0, x))


# -- shared storage ----------------------------------------------------------------------

@pytest.mark.parametrize("n", [9, 97])
@pytest.mark.parametrize("opt", list(OPTIONS), ids=str)
def test_jacobi_sweeps_run_in_the_outputs(n, opt):
    """jacobi-2d unrolled over 3 steps into temporaries: dead copies go, every
    temporary lives in one of the two outputs (specialized sizes), results exact."""
    op = polyc.define(jacobi_tc(3), options=OPTIONS[opt])
    rng = np.random.default_rng(n)
    a, b = rng.standard_normal((n, n)), rng.standard_normal((n, n))
    want = _jacobi_ref(3)(a, b)
    for _ in range(2):
        got = op(a, b)
        for g, w in zip(got, want):
            np.testing.assert_allclose(g, w, rtol=1e-12, atol=1e-12)
    kernel = op._shown().scheduled.kernel
    # 97x97 doubles: past MIN_SHARED_BYTES; fused sweeps (max fusion, Pluto) overlap
    if opt in ("default", "fusion-min", "no-tile", "tile-8", "serial") and n == 97:
        assert not kernel.temporaries, [t.name for t in kernel.temporaries]


@pytest.mark.parametrize("n", [37, 130])
@pytest.mark.parametrize("scheduler", ["isl", "pluto"])
def test_fused_jacobi_sweeps_run_in_place(tiny_l2, n, scheduler):
    """With an L2 smaller than the arrays, the unrolled sweeps fuse into one loop over the
    rows (each sweep a row behind the last) and still run in the two outputs: the
    borders each later sweep copies again are left out, so the sweeps cycle through the
    same two arrays as the in-place C does. Exact at 1 and 2 threads."""
    rng = np.random.default_rng(n)
    a, b = rng.standard_normal((n, n)), rng.standard_normal((n, n))
    want = _jacobi_ref(3)(a, b)
    for threads in (1, 2):
        op = polyc.define(jacobi_tc(3), options=polyc.Options(threads=threads,
                                                              scheduler=scheduler))
        for _ in range(2):
            for g, w in zip(op(a, b), want):
                np.testing.assert_allclose(g, w, rtol=1e-12, atol=1e-12)
        scheduled = op._shown().scheduled
        if threads == 1 and scheduler == "isl":  # (Pluto fuses on its own terms)
            assert _fused(scheduled.schedule), "the sweeps share one loop over the rows"
        if n * n * 8 >= share.MIN_SHARED_BYTES:
            assert not scheduled.kernel.temporaries, \
                [t.name for t in scheduled.kernel.temporaries]
            copies = [t for t in scheduled.kernel.statements if isinstance(t.value, E.Read)]
            # each output's border (4n - 4 elements) copied once
            assert sum(_instances(t) for t in copies) == 2 * (4 * n - 4)


def _fused(schedule: isl.Schedule) -> bool:
    """Whether a loop runs several statements (a band with a sequence below it)."""
    return any(node.get_type() == isl.schedule_node_type.band and node.n_children()
               and node.child(0).get_type() == isl.schedule_node_type.sequence
               for node in iter_nodes(schedule.get_root()))


def _instances(s) -> int:
    dom = s.domain.project_out(isl.dim_type.param, 0, s.domain.dim(isl.dim_type.param))
    return dom.count_val().to_python()


def test_a_copy_is_kept_where_storage_changed_since():
    """Once T1 and T2 live in T0's storage, T2's copy of A repeats T0's copy, but T1
    wrote those elements in between: the copy stays (its values are not there any
    more). And one that writes more than the copy before it keeps the rest."""
    src = """def k(double(N) A, double(N) B) -> (Y, Z, W) {
                 T0(i) = A(i)
                 Y(i) = T0(i) * 2.0
                 T1(i) = Y(i) + 1.0
                 Z(i) = T1(i) * 3.0
                 T2(i) = A(i)
                 W(i) = T2(i) - Z(i)
             }"""
    n = 10_001
    a, b = np.random.default_rng(5).standard_normal((2, n))
    for opt in ("fusion-min", "default"):
        op = polyc.define(src, options=OPTIONS[opt])
        for _ in range(2):
            y, z, w = op(a, b)
            np.testing.assert_allclose(y, 2 * a)
            np.testing.assert_allclose(z, 3 * (2 * a + 1))
            np.testing.assert_allclose(w, a - z)


def test_repeated_copies_go_and_partial_ones_shrink():
    """share._without_repeats on its own: the second copy of X's first half from A goes,
    the third (the whole of X) keeps only the half not copied before."""
    src = """def k(double(N) A) -> (double(N) X) {
                 X(i) = A(i) where i in 0:N/2
                 X(i) = A(i) where i in 0:N/2
                 X(i) = A(i) where i in 0:N
             }"""
    kernel = from_tc(src).specialize({"N": 10})
    out = share._without_repeats(kernel)
    assert len(out.statements) == 2
    assert _instances(out.statements[1]) == 5


def test_temporaries_that_meet_keep_their_own_storage():
    """T is read after U is written (program order): they never share."""
    src = """def k(double(N,N) X) -> (Y) {
                 T(i,j) = X(i,j) + 1.0
                 U(i,j) = X(i,j) * 2.0
                 Y(i,j) = T(i,j) + U(i,j)
             }"""
    op = polyc.define(src, options=polyc.Options(fusion="min"))
    x = np.random.default_rng(0).standard_normal((100, 100))
    np.testing.assert_allclose(op(x), (x + 1) + 2 * x)
    assert len(op._shown().scheduled.kernel.temporaries) == 2


def test_a_chain_of_temporaries_shares_two_buffers():
    src = """def k(double(N,N) X) -> (Y) {
                 T0(i,j) = X(i,j) + 1.0
                 T1(i,j) = T0(i,j) * 2.0
                 T2(i,j) = T1(i,j) - 3.0
                 T3(i,j) = T2(i,j) * T2(i,j)
                 Y(i) +=! T3(i,j)
             }"""
    op = polyc.define(src, options=polyc.Options(fusion="min"))
    x = np.random.default_rng(1).standard_normal((100, 100))
    for _ in range(2):
        np.testing.assert_allclose(op(x), ((((x + 1) * 2) - 3) ** 2).sum(1))
    temps = [t.name for t in op._shown().scheduled.kernel.temporaries]
    assert temps == ["T0", "T1"]  # T2 in T0's storage, T3 in T1's


def test_an_output_not_written_everywhere_takes_no_temporary():
    """Y's border is never written (it stays zero): a temporary in Y's storage would
    leave its own values there."""
    src = """def k(double(N,N) X) -> (double(N,N) Y) {
                 T(i,j) = X(i,j) * 3.0
                 Y(i,j) = T(i,j) + 1.0 where i in 1:N-1, j in 0:N
             }"""
    op = polyc.define(src, options=polyc.Options(fusion="min"))
    x = np.random.default_rng(2).standard_normal((100, 100))
    want = np.zeros_like(x)
    want[1:-1] = 3 * x[1:-1] + 1
    for _ in range(2):
        np.testing.assert_allclose(op(x), want)
    assert [t.name for t in op._shown().scheduled.kernel.temporaries] == ["T"]


def test_a_temporary_read_before_written_keeps_its_zeros():
    src = """def k(double(N) X) -> (Y) {
                 T(i) += X(i)
                 U(i) = T(i) * 2.0
                 V(i) += U(i)
                 Y(i) = V(i) + 1.0
             }"""
    op = polyc.define(src, options=polyc.Options(fusion="min"))
    x = np.random.default_rng(3).standard_normal(20000)
    for _ in range(2):
        np.testing.assert_allclose(op(x), 2 * x + 1)


# -- untiled streaming bands -------------------------------------------------------------

def _streams(tc: str, **sizes: int) -> bool:
    """:func:`cache_blocks.streams` on the band of isl's schedule of ``tc`` that runs
    its last statement."""
    kernel = pipeline.prepare_kernel(from_tc(tc).specialize(sizes))
    sched = scheduler.compute_schedule(kernel, compute_dependences(kernel), polyc.Options())
    last = kernel.statements[-1].name
    todo = [sched.get_root()]
    while todo:
        node = todo.pop()
        if node.get_type() == isl.schedule_node_type.band and any(
                node.get_domain().get_set_list().get_at(i).get_tuple_name() == last
                for i in range(node.get_domain().n_set())):
            return cache_blocks.streams(node, kernel)
        todo += [node.child(i) for i in range(node.n_children())]
    raise AssertionError(f"no band runs {last}")


STENCIL = "def s(float(N,N) X) -> (Y) { Y(i,j) = X(i-1,j) + X(i+1,j) + X(i,j) where i in 1:N-1 }"


def test_stencil_band_is_not_tiled():
    assert _streams(STENCIL, N=300)
    op = polyc.define(BORDER, options=polyc.Options(threads=1))
    op.compiled_for({"N": 300})
    assert "+= 32" not in op.c_source and "+= 512" not in op.c_source


@pytest.mark.parametrize("tc", [
    "def t(float(N,N) X) -> (Y) { Y(i,j) = X(j,i) }",                      # transposed
    "def mm(float(N,N) A, float(N,N) B) -> (C) { C(i,j) +=! A(i,k) * B(k,j) }",  # reuse
    "def b(float(N,N) X, float(N) V) -> (Y) { Y(i,j) = X(i,j) * V(i) + X(j,j) }",  # column
], ids=["transpose", "matmul", "column"])
def test_bands_with_reuse_keep_their_tiles(tc):
    assert not _streams(tc, N=300)


def test_broadcast_rows_stream():
    assert _streams("def b(float(N,N) X, float(N) V, float(N) U) -> (Y) "
                    "{ Y(i,j) = X(i,j) * V(i) + U(j) }", N=300)


def test_rows_too_big_for_the_cache_keep_tiles(monkeypatch):
    monkeypatch.setattr(cache_blocks.machine, "l2_bytes", lambda: 4096)
    assert not _streams(STENCIL, N=300)


def test_output_written_only_by_an_epilogue():
    """Y is written only by the matmul's epilogue (run at the register tiles' copy-out,
    not in the schedule tree); T is big enough to take part in sharing (review: the
    planner crashed on Y's empty place in the tree)."""
    src = """def k(double(N,N) X) -> (Y) {
                 T(i,j) = X(j,i) * 0.5
                 M(i,j) +=! T(i,k) * X(k,j)
                 Y(i,j) = M(i,j) * 2.0
             }"""
    x = np.random.default_rng(0).standard_normal((100, 100))
    for opt in ("default", "fusion-min", "serial"):
        np.testing.assert_allclose(polyc.define(src, options=OPTIONS[opt])(x), x.T @ x,
                                   rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("src", ["border", "jacobi"])
def test_dead_writes_and_sharing_on_cuda_emulation(src):
    """The border copy and the shared Jacobi temporaries through the CUDA target, run by
    the CPU emulation of the .cu."""
    opts = polyc.Options(target="cuda", emulate=True)
    rng = np.random.default_rng(5)
    if src == "border":
        x, y = rng.standard_normal((37, 37), np.float32), rng.standard_normal((37, 37), np.float32)
        want = y.copy()
        want[1:-1, 1:-1] = 0.25 * (x[:-2, 1:-1] + x[2:, 1:-1] + x[1:-1, :-2] + x[1:-1, 2:])
        np.testing.assert_allclose(polyc.define(BORDER, options=opts)(x, y), want,
                                   rtol=1e-5, atol=1e-5)
        return
    a, b = rng.standard_normal((97, 97)), rng.standard_normal((97, 97))
    for g, w in zip(polyc.define(jacobi_tc(3), options=opts)(a, b), _jacobi_ref(3)(a, b)):
        np.testing.assert_allclose(g, w, rtol=1e-12, atol=1e-12)
