"""The Pluto-style scheduler (issue 11, part 2): ``Options(scheduler="pluto")``.

Its schedules are the ones Pluto's papers show (jacobi-1d skewed by 2t, seidel-2d's
(t, t+i, 2t+i+j)), its bands are permutable with the right coincident members, and every
operator of the end-to-end matrix and every C stencil gives numpy's result through it
with each fusion mode.
"""
from __future__ import annotations

import warnings

import islpy as isl
import numpy as np
import pytest
from conftest import random_inputs
from test_e2e_numpy import CASES
from test_scop import (
    GEMM,
    JACOBI_1D,
    JACOBI_2D,
    SEIDEL_2D,
    ref_jacobi_1d,
    ref_jacobi_2d,
    ref_seidel_2d,
)

import polyc
from polyc.deps import compute_dependences
from polyc.errors import PolycWarning
from polyc.schedule import pluto
from polyc.schedule.pluto import pluto_schedule


def schedule_of(op, fusion="max"):
    return pluto_schedule(op.kernel, compute_dependences(op.kernel), fusion)


def test_stencil_schedules_are_plutos():
    jac = schedule_of(polyc.scop(JACOBI_1D)).get_map()
    want = isl.UnionMap("[T, N] -> { S0[t, i] -> [t, 2t + i, 0]; S1[t, i] -> [t, 1 + 2t + i, 1] }")
    assert jac.is_equal(want.intersect_domain(jac.domain()))
    sei = schedule_of(polyc.scop(SEIDEL_2D)).get_map()
    want = isl.UnionMap("[T, N] -> { S0[t, i, j] -> [t, t + i, 2t + i + j] }")
    assert sei.is_equal(want.intersect_domain(sei.domain()))


def test_bands_are_permutable_with_coincident_flags():
    mm = polyc.define(CASES["matmul"][0])
    band = schedule_of(mm).get_root().child(0)
    assert band.get_type() == isl.schedule_node_type.band and band.band_get_permutable()
    flags = [bool(band.band_member_get_coincident(i)) for i in range(band.band_n_member())]
    assert flags == [True, True, False]  # m, n parallel; k carries the reduction
    sei = schedule_of(polyc.scop(SEIDEL_2D)).get_root().child(0)
    assert sei.band_get_permutable() and sei.band_n_member() == 3
    assert not any(sei.band_member_get_coincident(i) for i in range(3))


@pytest.mark.parametrize("fusion", ["min", "smart", "max"])
@pytest.mark.parametrize("case", ["matmul", "batched_matmul", "conv2d_stride2_where",
                                  "softmax", "layernorm", "mlp_relu", "maxpool", "transpose"])
def test_operators_match_numpy(case, fusion):
    src, shape_sets, ref = CASES[case]
    op = polyc.define(src, scheduler="pluto", fusion=fusion)
    with warnings.catch_warnings():
        warnings.simplefilter("error", PolycWarning)  # no fallback to isl's scheduler
        for seed, shapes in enumerate(shape_sets):
            inputs = random_inputs([(s, "float32") for s in shapes], seed)
            got, want = op(*inputs), ref(*inputs)
            got = got if isinstance(got, tuple) else (got,)
            want = want if isinstance(want, tuple) else (want,)
            for g, w in zip(got, want):
                np.testing.assert_allclose(g, w, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("threads", [1, 2])
def test_c_stencils_match_their_reference(threads):
    rng = np.random.default_rng(0)
    op = polyc.scop(JACOBI_1D, scheduler="pluto", threads=threads)
    A, B = rng.standard_normal(101).astype(np.float32), rng.standard_normal(101).astype(np.float32)
    want = ref_jacobi_1d(7, A, B)
    for g, w in zip(op(T=7, N=101, A=A.copy(), B=B.copy()), want):
        np.testing.assert_allclose(g, w, rtol=1e-5, atol=1e-6)
    op = polyc.scop(JACOBI_2D, scheduler="pluto", threads=threads)
    A, B = rng.standard_normal((37, 37)), rng.standard_normal((37, 37))
    want = ref_jacobi_2d(5, A, B)
    for g, w in zip(op(T=5, N=37, A=A.copy(), B=B.copy()), want):
        np.testing.assert_allclose(g, w, rtol=1e-12)
    op = polyc.scop(SEIDEL_2D, scheduler="pluto", threads=threads)
    A = rng.standard_normal((29, 29))
    np.testing.assert_allclose(op(T=4, N=29, A=A.copy()), ref_seidel_2d(4, A), rtol=1e-12)
    op = polyc.scop(GEMM, scheduler="pluto", threads=threads)
    C, A, B = (rng.standard_normal((17, 23)), rng.standard_normal((17, 9)),
               rng.standard_normal((9, 23)))
    want = 0.5 * C + 1.5 * (A @ B)
    np.testing.assert_allclose(op(17, 23, 9, 1.5, 0.5, C, A, B), want, rtol=1e-12)


def test_compare_schedulers_side_by_side():
    op = polyc.scop(JACOBI_2D)
    table = polyc.compare(op, {"isl": None, "pluto": {"scheduler": "pluto"},
                               "untiled": {"tile": False}}, sizes={"T": 3, "N": 41}, repeat=2)
    assert [r.name for r in table.rows] == ["isl", "pluto", "untiled"]
    assert all(r.correct for r in table.rows), str(table)


def test_no_solution_falls_back_to_isl_with_a_warning(monkeypatch):
    monkeypatch.setattr(pluto, "MAX_COEFFICIENT", 0)  # no row can be non-trivial
    src, shape_sets, ref = CASES["transpose"]
    op = polyc.define(src, scheduler="pluto")
    inputs = random_inputs([(s, "float32") for s in shape_sets[0]])
    with pytest.warns(PolycWarning, match="using isl's scheduler"):
        np.testing.assert_allclose(op(*inputs), ref(*inputs))


def test_scheduler_option_checked():
    with pytest.raises(polyc.CompileError, match="unknown scheduler"):
        polyc.Options(scheduler="pocc")


def test_diamond_tiles_for_jacobi():
    """Bandishti et al.'s diamond tiling: jacobi-1d's (t, 2t+i) becomes (2t+i, 2t-i), so
    that the time face lies strictly inside the tiles' cone (concurrent start)."""
    op = polyc.scop(JACOBI_1D)
    deps = compute_dependences(op.kernel)
    got = pluto_schedule(op.kernel, deps, "max", diamond=True).get_map()
    want = isl.UnionMap("[T, N] -> { S0[t, i] -> [2t + i, 2t - i]; "
                        "S1[t, i] -> [1 + 2t + i, 1 + 2t - i] }")
    assert got.is_equal(want.intersect_domain(got.domain()))
    jac2 = polyc.scop(JACOBI_2D)
    got = pluto_schedule(jac2.kernel, compute_dependences(jac2.kernel), "max", diamond=True)
    want = isl.UnionMap("[T, N] -> { S0[t, i, j] -> [2t + i, 2t - i, 2t + j]; "
                        "S1[t, i, j] -> [1 + 2t + i, 1 + 2t - i, 1 + 2t + j] }")
    assert got.get_map().is_equal(want.intersect_domain(got.get_map().domain()))
    sei = polyc.scop(SEIDEL_2D)  # no valid mirror of (t + i): stays pipelined
    got = pluto_schedule(sei.kernel, compute_dependences(sei.kernel), "max", diamond=True)
    assert got.get_map().is_equal(schedule_of(sei).get_map())


@pytest.mark.parametrize("diamond", [True, False])
def test_wavefront_of_tiles_runs_in_parallel(diamond):
    """A tiled band without a parallel member (skewed stencils) runs its tiles as a
    wavefront, the inner tile loop in parallel; results stay exact at 2 threads."""
    op = polyc.scop(JACOBI_1D, scheduler="pluto", diamond=diamond, threads=2)
    rng = np.random.default_rng(1)
    A = rng.standard_normal(3001).astype(np.float32)
    B = rng.standard_normal(3001).astype(np.float32)
    want = ref_jacobi_1d(150, A, B)  # more time steps than one time tile holds
    got = op(T=150, N=3001, A=A.copy(), B=B.copy())
    for g, w in zip(got, want):
        np.testing.assert_allclose(g, w, rtol=1e-5, atol=1e-6)
    # one parallel region around the loop over the fronts, each front's tiles shared
    region = op.c_source.index("#pragma omp parallel num_threads(2)\n")
    fronts = op.c_source.index("for (", region)
    assert op.c_source.index("#pragma omp for\n", fronts) > fronts
    assert "omp parallel for" not in op.c_source


@pytest.mark.parametrize("threads", [1, 2])
def test_coincident_flags_hold_for_any_member_order(threads):
    """The band's flags say a member is parallel with only the rows outside the band
    fixed (polyc's passes may move it first): jacobi-2d's diamond band once flagged
    ``2t + j``, parallel only under ``2t + i`` and ``2t - i``, and the legality check
    refused the optimised schedule (a warning, then isl's)."""
    op = polyc.scop(JACOBI_2D, scheduler="pluto", threads=threads)
    rng = np.random.default_rng(3)
    A, B = rng.standard_normal((200, 200)), rng.standard_normal((200, 200))
    with warnings.catch_warnings():
        warnings.simplefilter("error", PolycWarning)
        got = op(T=20, N=200, A=A.copy(), B=B.copy())
    for g, w in zip(got, ref_jacobi_2d(20, A, B)):
        np.testing.assert_allclose(g, w, rtol=1e-12)


@pytest.mark.parametrize("case", ["matmul", "conv2d_stride1", "softmax", "layernorm"])
def test_cuda_target_through_the_emulation(case):
    """The Pluto scheduler's bands mapped to blocks and threads (CPU emulation), on
    sizes that are not multiples of the blocks and tiles, in both thread orders."""
    from test_cuda_emulation import assert_same_bits, run_both_orders
    src, shape_sets, ref = CASES[case]
    op = polyc.define(src, scheduler="pluto", target="cuda", emulate=True)
    inputs = random_inputs([(s, "float32") for s in shape_sets[0]], 2)
    fwd, rev = run_both_orders(op, inputs)
    assert_same_bits(fwd, rev)
    want = ref(*inputs)
    for g, w in zip(fwd, want if isinstance(want, tuple) else (want,)):
        np.testing.assert_allclose(g, w, rtol=1e-4, atol=1e-4)


def _bands(schedule):
    found = []

    def visit(node):
        if node.get_type() == isl.schedule_node_type.band:
            found.append((node.band_get_partial_schedule().to_str(), node.band_n_member(),
                          node.band_get_permutable(),
                          [node.band_member_get_coincident(m) for m in range(node.band_n_member())]))
        return True
    schedule.get_root().foreach_descendant_top_down(visit)
    return found


@pytest.mark.parametrize("shift, merges", [("0", True), ("1", False)])
def test_bands_one_above_the_other_merge_where_permutable(shift, merges):
    """``scheduler.merge_bands``: a band over a band becomes one band where no dependence
    left by the loops above runs backwards along any member of the merged band
    (``A(i,j) = A(i-1,j)``: distance (1, 0)); with ``A(i-1,j+1)`` (distance (1, -1)) the
    bands stay apart, the inner one free to run along j only once i is fixed."""
    from polyc.schedule.scheduler import merge_bands
    op = polyc.define(f"def f(float(N,M) A0) -> (A) {{ A(i,j) = A0(i,j)\n"
                      f"A(i,j) = A(i-1,j+{shift}) + 1.0 where exists A0(i-1,j+{shift}) }}")
    kernel = op.kernel
    deps = compute_dependences(kernel)
    s1 = kernel.statements[1]
    tree = isl.Schedule.from_domain(s1.domain)
    outer = isl.MultiUnionPwAff(f"[N, M] -> [{{ {s1.name}[i, j] -> [(i)] }}]")
    inner = isl.MultiUnionPwAff(f"[N, M] -> [{{ {s1.name}[i, j] -> [(j)] }}]")
    node = tree.get_root().child(0).insert_partial_schedule(inner)
    node = node.insert_partial_schedule(outer).band_set_permutable(1)
    node = node.child(0).band_set_permutable(1)
    merged = _bands(merge_bands(node.get_schedule(), deps))
    if merges:
        assert [(n, p, c) for _, n, p, c in merged] == [(2, True, [False, True])]
    else:
        assert [n for _, n, _, _ in merged] == [1, 1]


def test_covariance_product_gets_one_band_and_a_register_tile():
    """Pluto puts covariance's product ``cov(i,j) +=! d(k,i) * d(k,j)`` in ``[i]`` above
    ``[j, k]``; merged, the band is ``[i, j, k]`` (permutable, the sum ``k`` not
    coincident) and the product gets its register tile; the result is numpy's."""
    import sys
    from pathlib import Path
    sys.path.insert(0, str(Path(__file__).parent.parent / "examples" / "benchmarks"))
    from polybench_kernels import BENCHES
    b = next(x for x in BENCHES if x.name == "covariance")
    op = polyc.define(b.tc, scheduler="pluto")
    sched = polyc.pipeline.compute_schedule(op.kernel, compute_dependences(op.kernel),
                                            op.options)
    product = [x for x in _bands(sched) if "k)" in x[0]]
    assert [(n, p, c) for _, n, p, c in product] == [(3, True, [True, True, False])]
    sizes = {"N": 97, "M": 301}
    data = np.random.default_rng(3).standard_normal((sizes["N"], sizes["M"]))
    np.testing.assert_allclose(op(data), np.cov(data, rowvar=False), rtol=1e-10, atol=1e-12)
    assert "polyc_acc[" in op.compiled_for(sizes).c_source


def test_a_merge_that_loses_a_parallel_member_is_refused():
    """``A(i,j) = A(i-1,j-1)``: below ``[i]``, ``[j]`` is parallel; merged, ``[i, j]``
    is permutable but neither member is parallel, so the bands stay apart."""
    from polyc.schedule.scheduler import merge_bands
    op = polyc.define("def f(float(N,M) A0) -> (A) { A(i,j) = A0(i,j)\n"
                      "A(i,j) = A(i-1,j-1) + 1.0 where exists A0(i-1,j-1) }")
    kernel = op.kernel
    deps = compute_dependences(kernel)
    s1 = kernel.statements[1]
    tree = isl.Schedule.from_domain(s1.domain)
    node = tree.get_root().child(0).insert_partial_schedule(
        isl.MultiUnionPwAff(f"[N, M] -> [{{ {s1.name}[i, j] -> [(j)] }}]"))
    node = node.band_set_permutable(1).band_member_set_coincident(0, 1)
    node = node.insert_partial_schedule(
        isl.MultiUnionPwAff(f"[N, M] -> [{{ {s1.name}[i, j] -> [(i)] }}]")).band_set_permutable(1)
    assert [n for _, n, _, _ in _bands(merge_bands(node.get_schedule(), deps))] == [1, 1]


def test_merged_covariance_on_cuda_emulated():
    """Pluto's merged bands go to the CUDA mapping too: covariance, emulated, odd sizes."""
    import sys
    from pathlib import Path
    sys.path.insert(0, str(Path(__file__).parent.parent / "examples" / "benchmarks"))
    from polybench_kernels import BENCHES
    b = next(x for x in BENCHES if x.name == "covariance")
    data = np.random.default_rng(4).standard_normal((37, 61))
    op = polyc.define(b.tc, scheduler="pluto", target="cuda", emulate=True)
    np.testing.assert_allclose(op(data), np.cov(data, rowvar=False), rtol=1e-10, atol=1e-12)
