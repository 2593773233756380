"""The schedule workbench's primitives that rewrite statements and arrays (issue 11,
part 1; :mod:`polyc.rewrite`): index-set split and peel, compute_inline, layout,
cache_read / cache_write (packing), rfactor, compute_at / reverse_compute_at and
decompose_reduction. Per primitive: a legal use gives the numpy result on odd sizes (and
on other sizes through the trace); an illegal use is refused naming what fails or the
dependence it breaks. Save, load and replay give the same C.
"""
from __future__ import annotations

import os
import sys

import numpy as np
import pytest
from conftest import random_inputs

import polyc
from polyc.errors import ScheduleError
from polyc.schedule.space import Step

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
                                "examples", "benchmarks"))
from scop_kernels import GEMM, JACOBI_1D  # noqa: E402
from test_scop import run_jacobi_1d  # noqa: E402

#: a scaled copy of A (a temporary) feeding a matmul
SCALED_MM = """
def smm(float(M,K) A, float(K,N) B) -> (C) {
    T(m,k) = A(m,k) * 2.0
    C(m,n) +=! T(m,k) * B(k,n)
}"""
SIZES = [((13, 7), (7, 11)), ((5, 30), (30, 3)), ((1, 1), (1, 17))]


@pytest.fixture(scope="module")
def smm():
    return polyc.define(SCALED_MM)


def assert_smm(op, space):
    """``space`` compiled, on every size of SIZES (the trace replayed for each)."""
    fast = op.with_schedule(space)
    for k, (sa, sb) in enumerate(SIZES):
        A, B = random_inputs([(sa, "float32"), (sb, "float32")], k)
        np.testing.assert_allclose(fast(A, B), (2 * A) @ B, rtol=1e-4, atol=1e-4)


LEGAL = {
    "peel front": lambda s: s.peel("S2", "k", 1),
    "peel back, distributed": lambda s: s.peel("S2", "k", 0, 2).distribute("S2_1"),
    "split_index_set": lambda s: s.split_index_set("S2", "m", "floor(M/2)"),
    "split_index_set, tiled apart": lambda s: s.split_index_set("S2", "n", 4)
    .distribute("S2_1").tile("S2_1", ("m", "n"), (4, 8)),
    "compute_inline": lambda s: s.compute_inline("S0"),
    "layout": lambda s: s.layout("T", (1, 0)),
    "cache_read packed": lambda s: s.cache_read("S2", "B", (1, 0)),
    "cache_read at": lambda s: s.cache_read("S0", "A").compute_at("S0_1", "S0", "m"),
    "cache_write": lambda s: s.cache_write("S2"),
    "rfactor vectorized": lambda s: s.rfactor("S2", "k", 4).split("S2", "k", 4)
    .vectorize("S2", "k"),
    "compute_at": lambda s: s.compute_at("S0", "S2", "m"),
    "decompose_reduction": lambda s: s.decompose_reduction("S2", "k"),
    "decompose_reduction top": lambda s: s.decompose_reduction("S2", "m"),
}


@pytest.mark.parametrize("name", LEGAL)
def test_legal_rewrites_match_numpy(smm, name):
    space = LEGAL[name](smm.schedule_space())
    assert_smm(smm, space)
    str(space)  # printable


def test_what_the_rewrites_look_like(smm):
    s = smm.schedule_space()
    text = str(s.peel("S2", "k", 1))
    assert "(the first 1 of k of S2)" in text and "(not the first 1 of k)" in text
    text = str(s.rfactor("S2", "k", 4))
    assert "S2_1: C_rf(i0, i1, kk) = 0.0" in text and "C_rf(m, n, (k % 4)) +=" in text
    assert "S2_2: C(i0, i1) += C_rf(i0, i1, kk)" in text
    text = str(s.cache_read("S2", "B", (1, 0)))
    assert "B_local(i1, i0) = B(i0, i1)" in text and "B_local(n, k)" in text
    assert "A(m, k) * 2.0) * B(k, n)" in str(s.compute_inline("S0"))
    placed = s.compute_at("S0", "S2", "m")
    assert dict(placed.dims)["S0"][1].name == "m" and "S0: T(m, k)" in str(placed)


@pytest.mark.parametrize("step,words", [
    (lambda s: s.rfactor("S0", "k", 4), "S0 is not a reduction"),
    (lambda s: s.rfactor("S2", "m", 4), "'m' is not a reduction iterator of S2"),
    (lambda s: s.rfactor("S2", "k", 1), "at least 2"),
    (lambda s: s.peel("S2", "k", 0, 0), "peel a positive number"),
    (lambda s: s.peel("S2", "q", 1), "no loop 'q'"),
    (lambda s: s.split_index_set("S2", "m", "M"), "no instance of S2 is in m >= M"),
    (lambda s: s.split_index_set("S2", "m", "M*M"), "not affine"),
    (lambda s: s.compute_inline("S2"), "C, an output of smm"),
    (lambda s: s.layout("A", (1, 0)), "A is an input of smm"),
    (lambda s: s.layout("T", (0, 0)), "permutation"),
    (lambda s: s.layout("Q", (0,)), "no array 'Q'"),
    (lambda s: s.cache_read("S2", "C"), "S2 writes C"),
    (lambda s: s.compute_at("S2", "S0", "m"), "S0 reads nothing S2 writes"),
], ids=lambda x: x if isinstance(x, str) else "")
def test_bad_rewrites_are_named(smm, step, words):
    with pytest.raises(ScheduleError, match=words.replace("(", r"\(").replace(")", r"\)")
                       .replace("*", r"\*")):
        step(smm.schedule_space())


def test_illegal_placements_name_the_dependence(smm):
    s = smm.schedule_space()
    # S2 inside S0's loop m: before S1 initialises C
    with pytest.raises(ScheduleError) as info:
        s.reverse_compute_at("S2", "S0", "m")
    assert "dependence S1 -> S2" in str(info.value) and "S1[0, 0]" in str(info.value)
    # a reduction's loop is not vectorizable; after rfactor its inner part is
    with pytest.raises(ScheduleError, match="reduction dependence S2 -> S2 of C"):
        s.split("S2", "k", 4).vectorize("S2", "k")


CHAIN = """
def chain(float(M,N) X) -> (Z) {
  Y(i, j) = X(i, j) + 1.0
  Z(i, j) = Y(i, j) * 2.0 + Y(i, N - 1 - j)
}
"""


def test_reverse_compute_at_puts_a_consumer_in_the_producer_loop():
    op = polyc.define(CHAIN)
    s = op.schedule_space().reverse_compute_at("S1", "S0", "i")
    assert "S1: [0, i, 1, i2=i, j]" in str(s)  # Z inside S0's loop i, after its body
    for shape in ((7, 5), (1, 9), (12, 1)):
        X, = random_inputs([(shape, "float32")])
        Y = X + 1
        np.testing.assert_allclose(op.with_schedule(s)(X), Y * 2 + Y[:, ::-1], rtol=1e-6)
    # at j: the last producer iteration Z(i, j) needs is max(j, N-1-j), piecewise
    with pytest.raises(ScheduleError, match="not one affine function"):
        op.schedule_space().reverse_compute_at("S1", "S0", "j")


ACC = r"""
void acc(int M, int K, float A[M][K], float C[M])
{
#pragma scop
  for (int m = 0; m < M; m++)
    for (int k = 0; k < K; k++)
      C[m] = C[m] + A[m][k];
#pragma endscop
}
"""


def test_cache_write_needs_an_initialised_temporary():
    with pytest.raises(ScheduleError, match=r"S0\[0, 0\] \(with M=1, K=1\) reads an "
                       "element of C that is not written before it"):
        polyc.scop(ACC).schedule_space().cache_write("S0")


def test_save_load_replay_give_the_same_c(smm, tmp_path):
    s = (smm.schedule_space().cache_read("S2", "B", (1, 0)).rfactor("S2", "k", 4)
         .split("S2", "k", 4).vectorize("S2", "k").peel("S2_2", "kk", 1)
         .compute_at("S0", "S2", "m"))
    path = str(tmp_path / "smm.sched")
    s.save(path)
    trace = polyc.load_schedule(path)
    replayed = smm.schedule_space().replay(trace)
    assert replayed.isl_text() == s.isl_text()
    sizes = {"M": 13, "K": 7, "N": 11}
    direct = polyc.define(SCALED_MM, specialize=True).with_schedule(s)
    loaded = polyc.define(SCALED_MM, specialize=True).with_schedule(trace)
    A, B = random_inputs([((13, 7), "float32"), ((7, 11), "float32")])
    np.testing.assert_allclose(direct(A, B), (2 * A) @ B, rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(loaded(A, B), (2 * A) @ B, rtol=1e-4, atol=1e-4)
    assert direct.compiled_for(sizes).c_source == loaded.compiled_for(sizes).c_source
    assert_smm(smm, trace)


def test_c_input_peel_and_split():
    op = polyc.scop(JACOBI_1D)
    s = op.schedule_space().shift("S1", "i", 1).fuse(2, "S0", "S1")
    for space in (s.peel("S0", "i", 1), s.peel("S1", "i", 0, 1),
                  s.split_index_set("S0", "t", 2)):
        for T, N in ((5, 37), (1, 3), (9, 70)):
            run_jacobi_1d(op.with_schedule(space), T, N)
    # the last i of each time step moved after every time step
    with pytest.raises(ScheduleError, match="flow dependence S1_1 -> S0 of A"):
        s.peel("S1", "i", 0, 1).distribute("S1_1")


def test_c_statements_sharing_loops_are_not_rewritten_apart():
    s = polyc.scop(GEMM).schedule_space()
    with pytest.raises(ScheduleError, match="S1 shares its loops with other statements"):
        s.cache_read("S1", "B")
    with pytest.raises(ScheduleError, match="S1 is not a reduction"):  # C's += is a plain
        s.rfactor("S1", "k", 4)  # assignment: C = C + ...


# -- the automatic schedule as a space -----------------------------------------------------

def test_auto_schedule_is_a_sequence_of_primitives():
    # generic code: the scheduler's choice (and so the trace) is the same for every size
    smm = polyc.define(SCALED_MM, specialize=False)
    s = smm.schedule_space(auto=True)
    steps = [str(x) for x in s.steps]
    # the scheduler's nests, then polyc's band optimisation as steps: interchange, cache
    # blocks, register tiles (a split per level, the accumulators kept by `registers`,
    # the row loop unrolled), parallel and vector loops
    assert steps[0] == "scheduler({})"
    assert {x.split("(")[0] for x in steps} == {"scheduler", "reorder", "tile", "parallel",
                                                 "vectorize", "registers", "unroll"}
    assert "registers('S2', 'k')" in steps and "vectorize('S2', 'n')" in steps
    assert "parallel('S2', 'm_tile')" in steps
    text = str(s)
    assert "m_tile = floor((m)/" in text and "# register:S2:" in text and "# vectorize" in text
    assert_smm(smm, s)
    # edit the cache blocks: the same trace with other sizes in the first tile step of S2
    trace = list(s.trace().steps)
    k = next(i for i, x in enumerate(trace) if x.name == "tile" and x.args[0] == "S2")
    trace[k] = Step("tile", (trace[k].args[0], trace[k].args[1], (16, 16, 128)))
    edited = smm.schedule_space().replay(trace)
    assert "_tile = floor((k)/16)" in str(edited)
    assert_smm(smm, edited)
    # edits name the loops of the automatic schedule of the sizes at hand: with generic
    # code (specialize=False) they are the same for every size
    generic = polyc.define(SCALED_MM, specialize=False)
    edited = generic.schedule_space(auto=True).unroll("S2", "k", 4)
    assert_smm(generic, edited)
    s = smm.schedule_space(auto=True)
    with pytest.raises(ScheduleError, match="parallel\\('S2', 'k_tile'\\) is illegal"):
        s.parallel("S2", "k_tile")
    with pytest.raises(ScheduleError, match="replaces the whole schedule"):
        smm.schedule_space().tile("S2", "m", 4).auto()
    with pytest.raises(ScheduleError, match=r"options \['gpu_block'\] do not shape"):
        smm.schedule_space(auto={"gpu_block": (32,)})


@pytest.mark.parametrize("options", [{"scheduler": "pluto"}, {"fusion": "max"},
                                     {"tile": False}])
def test_auto_schedule_of_c_input(options):
    op = polyc.scop(JACOBI_1D)
    s = op.schedule_space(auto=options)
    # a wavefront of skewed tiles is no sequence of primitives: read back whole
    assert [x.name for x in s.steps] == (["scheduler"] if options == {"tile": False}
                                         else ["auto"])
    for T, N in ((5, 37), (1, 3), (9, 70)):
        run_jacobi_1d(op.with_schedule(s), T, N)


def test_auto_schedule_of_c_gemm_is_primitives():
    op = polyc.scop(GEMM)
    s = op.schedule_space(auto=True)
    assert [x.name for x in s.steps][:3] == ["scheduler", "reorder", "tile"]
    rng = np.random.default_rng(4)
    A, B = rng.standard_normal((17, 9)), rng.standard_normal((9, 23))
    C = rng.standard_normal((17, 23))
    want = 0.5 * C + 1.5 * (A @ B)
    op.with_schedule(s)(17, 23, 9, 1.5, 0.5, C, A, B)
    np.testing.assert_allclose(C, want, rtol=1e-12)


# -- GPU bind (CUDA target, run by the CPU emulation) ---------------------------------------

MATMUL = "def mm(float(M,K) A, float(K,N) B) -> (C) { C(m,n) +=! A(m,k) * B(k,n) }"


def test_bind_maps_loops_to_blocks_and_threads():
    op = polyc.define(MATMUL, target="cuda", emulate=True)
    s = op.schedule_space()
    bound = (s.bind("S0", "n", "x").bind("S0", "m", "y")
             .bind("S1", "n", "x", 64).bind("S1", "m", "y", 4))
    assert "# gpu:x:64" in str(bound)
    fast = op.with_schedule(bound)
    for sa, sb in (((37, 29), (29, 45)), ((1, 3), (3, 130))):
        A, B = random_inputs([(sa, "float32"), (sb, "float32")])
        np.testing.assert_allclose(fast(A, B), A @ B, rtol=1e-4, atol=1e-4)
    heads = [ln for ln in fast.cuda_source.splitlines() if ln.startswith("/* kernel")]
    assert "member 1 -> x (tile 64, 64 threads), member 0 -> y (tile 4, 4 threads)" in heads[1]
    # tiles bound: each thread runs a 4x8 tile of C
    tiles = s.tile("S1", ("m", "n"), (4, 8)).bind("S1", "n_tile", "x").bind("S1", "m_tile", "y")
    A, B = random_inputs([((37, 29), "float32"), ((29, 45), "float32")])
    np.testing.assert_allclose(op.with_schedule(tiles)(A, B), A @ B, rtol=1e-4, atol=1e-4)
    # on the C target the binding is ignored
    c_op = polyc.define(MATMUL)
    np.testing.assert_allclose(c_op.with_schedule(c_op.schedule_space().replay(bound.trace()))(
        A, B), A @ B, rtol=1e-4, atol=1e-4)


def test_bad_bindings_are_refused():
    op = polyc.define(MATMUL, target="cuda", emulate=True)
    s = op.schedule_space()
    with pytest.raises(ScheduleError, match="binding S1's loop 'k' to GPU axis x is illegal: "
                       "the loop carries the reduction dependence S1 -> S1 of C"):
        s.bind("S1", "k", "x")
    with pytest.raises(ScheduleError, match="the axis is 'x', 'y' or 'z'"):
        s.bind("S1", "m", "w")
    with pytest.raises(ScheduleError, match="already bound"):
        s.bind("S1", "m", "x").bind("S1", "m", "y")
    A, B = random_inputs([((7, 5), "float32"), ((5, 3), "float32")])
    with pytest.raises(polyc.CompileError, match="must be the kernel's outermost loops"):
        op.with_schedule(s.bind("S0", "n", "x"))(A, B)
    with pytest.raises(polyc.CompileError, match="bind x first"):
        op.with_schedule(s.bind("S0", "m", "y"))(A, B)


def test_model_search_starts_from_polycs_own_cache_blocks():
    from polyc.search import _order, _polyc_tiles
    op = polyc.define(MATMUL)
    sizes = {"M": 512, "N": 512, "K": 512}
    polyc_tiles = _polyc_tiles(op, sizes)  # the auto schedule's tile steps
    assert polyc_tiles[("S1", "k")] >= 8 and ("S1", "m") in polyc_tiles
    s = op.schedule_space().tile("S1", ("m", "k", "n"), (
        polyc.knob([4, 8, 32, 128]), polyc.knob([8, 16, 64, 256]), polyc.knob([64, 512])))
    first = _order(s, s.knobs(), "model", 0, op, sizes)[0]
    best = tuple(min(k.values, key=lambda v, t=polyc_tiles[("S1", loop)]: abs(np.log(v / t)))
                 for k, loop in zip(s.knobs(), ("m", "k", "n")))
    assert first == best


def test_registers_keep_a_tile_of_accumulators():
    op = polyc.define(MATMUL)
    s = (op.schedule_space().reorder("S1", "m", "k", "n").tile("S1", ("m", "k", "n"),
                                                                (16, 32, 64))
         .split("S1", "m", 4).split("S1", "n", 32)
         .reorder("S1", "m_tile", "k_tile", "n_tile", "m_tile2", "n_tile2", "k", "m", "n"))
    r = s.registers("S1", "k").unroll("S1", "m", 4).vectorize("S1", "n")
    assert "# register:S1:4,32:" in str(r)
    A, B = random_inputs([((37, 29), "float32"), ((29, 45), "float32")])
    fast = op.with_schedule(r)
    np.testing.assert_allclose(fast(A, B), A @ B, rtol=1e-4, atol=1e-4)
    assert "polyc_acc[4][32]" in fast.compiled_for({"M": 37, "N": 45, "K": 29}).c_source
    scalar = op.schedule_space().registers("S1", "k")  # one C(m, n) below k: a scalar
    np.testing.assert_allclose(op.with_schedule(scalar)(A, B), A @ B, rtol=1e-4, atol=1e-4)
    with pytest.raises(ScheduleError, match="no box of fixed size"):
        op.schedule_space().registers("S1", "m")  # all of C below m: sizes-dependent
    with pytest.raises(ScheduleError, match="larger than 4096"):
        op.schedule_space().tile("S1", ("m", "n"), (128, 128)).registers("S1", "m")
    fused = op.schedule_space().fuse(2, "S0", "S1")
    with pytest.raises(ScheduleError, match=r"not just S1"):
        fused.tile("S0", ("m", "n"), (4, 8)).registers("S1", "m")


def test_rewrites_on_the_cuda_target():
    """Rewritten kernels (a packed cache_read, rfactor, compute_inline) with bound loops,
    through the CUDA emulation, on sizes that are not multiples of the blocks."""
    op = polyc.define(SCALED_MM, target="cuda", emulate=True)
    s = (op.schedule_space().compute_inline("S0").cache_read("S2", "B", (1, 0))
         .rfactor("S2", "k", 3)
         .bind("S2_1", "i0", "x").bind("S2_1", "i1", "y")
         .bind("S2", "n", "x", 32).bind("S2", "m", "y", 4)
         .bind("S2_3", "i0", "x").bind("S2_3", "i1", "y"))
    fast = op.with_schedule(s)
    for k, (sa, sb) in enumerate(SIZES):
        A, B = random_inputs([(sa, "float32"), (sb, "float32")], k)
        np.testing.assert_allclose(fast(A, B), (2 * A) @ B, rtol=1e-4, atol=1e-4)
