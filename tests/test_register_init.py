"""Register tiles that start from the reduction's initial constant
(register_tile.first_visit_init, optimize.drop_dead_inits) and kernel temporaries in the
thread's scratch block (codegen/c_expr.py PRELUDE): results against numpy on sizes that
are not multiples of any tile, at 1 and 2 threads, and the cases that must keep the
initialisation."""
from __future__ import annotations

import re
import threading

import numpy as np
import pytest
from conftest import assert_matches_numpy, random_inputs

import polyc
from polyc.schedule import register_tile

pytestmark = pytest.mark.filterwarnings("error::polyc.errors.PolycWarning")

MATMUL = """
def mm(float(M,K) A, float(K,N) B) -> (C) {
    C(m,n) +=! A(m,k) * B(k,n)
}"""
# the product's consumer reads C after the reduction: the init may still go
MATMUL_THEN_SCALE = """
def mms(float(M,K) A, float(K,N) B) -> (D) {
    C(m,n) +=! A(m,k) * B(k,n)
    D(m,n) = C(m,n) * 2.0
}"""
# a max-plus product: the accumulator starts from -inf
MAXPLUS = """
def maxplus(float(M,K) A, float(K,N) B) -> (C) {
    C(m,n) max=! A(m,k) + B(k,n)
}"""
TOL = dict(rtol=1e-4, atol=1e-3)


def _tiled_k() -> int:
    """A reduction too deep to stay whole in registers (``optimize._whole_reduction``):
    a register tile's rows of ``A`` past the L1, and its column panel past a quarter of
    the L2."""
    from polyc.schedule import machine
    _, nr = register_tile.machine_shape("float32", polyc.Options())
    return max(machine.l1d_bytes() // 4, machine.l2_bytes() // 4 // (4 * nr)) + 7


@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize("m,k,n", [(37, 200, 45), (9, 3, 131), (70, 256, 66)])
def test_untiled_reduction_starts_from_the_init(threads, m, k, n):
    op = polyc.define(MATMUL, threads=threads)
    a, b = random_inputs([((m, k), "float32"), ((k, n), "float32")], seed=k)
    assert_matches_numpy(op(a, b), a @ b, **TOL)
    assert register_tile.dropped_inits(op.schedule) == {"S0"}
    body = op.c_source[op.c_source.rindex("int mm("):]
    assert re.search(r"polyc_acc\[[^=]*= 0\.0f;", body)  # the accumulator starts at 0
    assert not re.search(r"\bC\[[^=]*= 0\.0f;", body)  # and C is never zeroed


@pytest.mark.parametrize("threads", [1, 2])
def test_tiled_reduction_keeps_the_init(threads):
    """With ``k`` longer than one reduction tile (256), a register tile's rows of ``A``
    larger than the L1 and its column panel than a quarter of the L2 (so the reduction
    is not kept whole), an element is visited once per tile: the accumulator must be
    loaded, and the zeroing stays."""
    k = _tiled_k()
    op = polyc.define(MATMUL, threads=threads)
    a, b = random_inputs([((33, k), "float32"), ((k, 70), "float32")])
    assert_matches_numpy(op(a, b), a @ b, rtol=1e-4, atol=1e-3 * np.sqrt(k))
    assert not register_tile.dropped_inits(op.schedule)


@pytest.mark.parametrize("threads", [1, 2])
def test_whole_reduction_in_registers(threads):
    """``k = 600``: a register tile's 6 rows of ``A`` (14 KB) fit in the L1, so each tile
    sums its whole reduction (optimize._whole_reduction): no second visit, the init goes."""
    from polyc.schedule import machine
    if machine.l1d_bytes() < 6 * 600 * 4:
        pytest.skip("an L1 smaller than 14 KB")
    op = polyc.define(MATMUL, threads=threads)
    a, b = random_inputs([((33, 600), "float32"), ((600, 70), "float32")])
    assert_matches_numpy(op(a, b), a @ b, **TOL)
    assert register_tile.dropped_inits(op.schedule) == {"S0"}


@pytest.mark.parametrize("threads", [1, 2])
def test_consumer_after_the_reduction(threads):
    op = polyc.define(MATMUL_THEN_SCALE, threads=threads)
    a, b = random_inputs([((29, 64), "float32"), ((64, 83), "float32")])
    assert_matches_numpy(op(a, b), 2 * (a @ b), **TOL)
    # the init goes, and the scaling runs at the tile's copy-out (an epilogue)
    assert register_tile.dropped_inits(op.schedule) == {"S0", "S2"}


def test_max_reduction_starts_from_minus_infinity():
    op = polyc.define(MAXPLUS)
    a, b = random_inputs([((21, 50), "float32"), ((50, 70), "float32")])
    want = (a[:, :, None] + b[None, :, :]).max(axis=1)
    assert_matches_numpy(op(a, b), want, **TOL)
    assert register_tile.dropped_inits(op.schedule) == {"S0"}


def test_checker_refuses_a_forged_init_mark():
    """A mark that claims the init where the reduction is tiled above it is unsafe."""
    import islpy as isl

    from polyc.check import iter_nodes
    k = _tiled_k()  # (a reduction tiled: not whole in registers)
    op = polyc.define(MATMUL)
    a, b = random_inputs([((33, k), "float32"), ((k, 70), "float32")])
    op(a, b)
    scheduled = op._shown().scheduled
    marks = [n for n in iter_nodes(scheduled.schedule.get_root())
             if n.get_type() == isl.schedule_node_type.mark
             and n.mark_get_id().get_name().startswith("register:")]
    assert marks
    name = marks[0].mark_get_id().get_name()
    forged = marks[0].delete().insert_mark(isl.Id(name + ":S0"))
    assert register_tile.first_visit_init(forged, scheduled.kernel,
                                          forged.get_schedule().get_map()) == ""
    assert "may not start from S0" in register_tile.check_mark(forged, scheduled.kernel)


def test_scratch_is_per_thread():
    """Concurrent calls from several threads, each with its own sizes (a parametric
    kernel whose temporary grows and shrinks), never share a temporary."""
    op = polyc.define("""
def rowsoftmax(float(M,N) X) -> (Y) {
    mx(i) max=! X(i,j)
    Y(i,j) = exp(X(i,j) - mx(i))
}""")
    errors = []

    def work(seed: int) -> None:
        rng = np.random.default_rng(seed)
        try:
            for _ in range(20):
                m, n = (int(v) for v in rng.integers(1, 300, 2))
                x = rng.standard_normal((m, n)).astype(np.float32)
                want = np.exp(x - x.max(axis=1, keepdims=True))
                np.testing.assert_allclose(op(x), want, rtol=1e-5, atol=1e-6)
        except BaseException as e:  # noqa: BLE001 -- reported by the main thread
            errors.append(e)
    op(np.ones((2, 2), np.float32))  # compile once, before the threads race
    threads = [threading.Thread(target=work, args=(s,)) for s in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors[0]



# -- epilogues: the consumer of a register tile run at its copy-out --------------------------

EPILOGUE_OPTIONS = {"default": {}, "serial": dict(parallel=False), "tile-16": dict(tile=(16, 16, 16)),
                    "register-3x5": dict(register_tile=(3, 5)), "pluto": dict(scheduler="pluto")}
BLOCKED = """
def f(float(N,H,C) X, float(2,C,32) W, float(64) B) -> (Y) {
    T(n,h,mb,mi) +=! X(n,h,c) * W(mb,c,mi) where mb in 0:2, mi in 0:32
    Y(n,h,m) = max(T(n,h,m/32,m%32) + B(m), 0.0) where m in 0:64
}"""


@pytest.mark.parametrize("opt", list(EPILOGUE_OPTIONS), ids=str)
@pytest.mark.parametrize("shape", [(1, 13, 16), (3, 9, 40)], ids=str)
def test_blocked_epilogue_runs_at_the_copy_out(opt, shape):
    """A channel-last conv's copy-out: bias and Relu on each accumulator element, the
    blocked temporary never stored."""
    n, h, c = shape
    op = polyc.define(BLOCKED, **EPILOGUE_OPTIONS[opt])
    rng = np.random.default_rng(c)
    x = rng.standard_normal((n, h, c)).astype(np.float32)
    w = rng.standard_normal((2, c, 32)).astype(np.float32)
    b = rng.standard_normal(64).astype(np.float32)
    want = np.maximum(np.einsum("nhc,mci->nhmi", x, w).reshape(n, h, 64) + b, 0)
    for _ in range(2):
        assert_matches_numpy(op(x, w, b), want, **TOL)
    marks = [m for m in register_tile.register_marks(op.schedule) if register_tile.mark_epilogue(m)]
    # (16-wide reduction tiles split a sum over 40 channels: partial sums, no epilogue)
    if opt != "pluto" and not (opt == "tile-16" and c > 16):
        assert marks, register_tile.register_marks(op.schedule)
    if marks:
        body = op.c_source[op.c_source.rindex("int f("):]
        assert not re.search(r"\bT\[[^=]*\] = ", body)  # T is never stored


@pytest.mark.parametrize("src, why", [
    ("""def f(float(M,K) A, float(K,N) B) -> (D, E) {
            C(m,n) +=! A(m,k) * B(k,n)
            D(m,n) = C(m,n) * 2.0
            E(m,n) = C(m,n) + 1.0
        }""", "two statements read C"),
    ("""def f(float(M,K) A, float(K,N) B) -> (D) {
            C(m,n) +=! A(m,k) * B(k,n)
            D(m,n) = C(m,n+1) * 2.0 where n in 0:N-1
        }""", "the consumer reads a shifted element (not every C element once)"),
    ("""def f(float(M,K) A, float(K,N) B, float(M,N) R) -> (D) {
            U(m,n) = R(m,n) * 3.0
            C(m,n) +=! A(m,k) * B(k,n)
            D(m,n) = C(m,n) + U(m,n)
        }""", "the consumer reads a temporary another statement computes"),
    ("""def f(float(M,K) A, float(K,N) B) -> (C, D) {
            C(m,n) +=! A(m,k) * B(k,n)
            D(m,n) = C(m,n) * 2.0
        }""", "C is an output"),
])
def test_what_takes_no_epilogue(src, why):
    op = polyc.define(src, threads=1)
    m, k, n = 29, 40, 83
    rng = np.random.default_rng(0)
    args = [rng.standard_normal((m, k)).astype(np.float32),
            rng.standard_normal((k, n)).astype(np.float32)]
    if "R" in src:
        args.append(rng.standard_normal((m, n)).astype(np.float32))
    op(*args)
    assert not [mk for mk in register_tile.register_marks(op.schedule)
                if register_tile.mark_epilogue(mk)], why


def test_a_reduction_split_over_tiles_takes_no_epilogue():
    k = _tiled_k()  # (a reduction tiled: not whole in registers)
    op = polyc.define(MATMUL_THEN_SCALE, threads=1)
    a, b = random_inputs([((33, k), "float32"), ((k, 70), "float32")])
    assert_matches_numpy(op(a, b), 2 * (a @ b), rtol=1e-4, atol=1e-3 * np.sqrt(k))
    assert not register_tile.dropped_inits(op.schedule)


def test_legality_check_refuses_a_false_epilogue():
    """A register mark naming an epilogue that does not qualify is refused."""
    from polyc import check, pipeline
    from polyc.errors import ScheduleError
    from polyc.frontend import from_tc
    src = """def f(float(M,K) A, float(K,N) B) -> (D, E) {
                C(m,n) +=! A(m,k) * B(k,n)
                D(m,n) = C(m,n) * 2.0
                E(m,n) = C(m,n) + 1.0
            }"""
    kernel = from_tc(src).specialize({"M": 29, "K": 40, "N": 83})
    sched = pipeline.schedule_kernel(kernel, polyc.Options(threads=1))
    text = sched.schedule.to_str()
    marks = [mk for mk in register_tile.register_marks(sched.schedule) if mk.count(":") == 4]
    assert marks
    forged = text.replace(marks[0], marks[0] + ":S2")
    import islpy as isl
    bad = isl.Schedule.read_from_str(sched.schedule.get_ctx(), forged)
    bad = bad.intersect_domain(isl.UnionSet.from_set(
        kernel.statement("S0").domain).union(isl.UnionSet.from_set(kernel.statement("S1").domain))
        .union(isl.UnionSet.from_set(kernel.statement("S3").domain)))
    with pytest.raises(ScheduleError):
        check.check_schedule(sched.kernel, sched.deps, bad)


@pytest.mark.parametrize("l2,whole", [(128 << 10, False), (1 << 20, True)])
def test_whole_reduction_follows_the_caches(monkeypatch, l2, whole):
    """The rule reads the machine: with an L1 of 4 KB (``POLYC_L1D_BYTES``) a register
    tile's rows of the ``k = 600`` reduction do not fit it, and its column panel
    (``600 x NR``: 38 KB at 16 columns, 154 KB at 64) keeps the sum whole only in an L2
    four times its size or more: in a 128 KB L2 the reduction is tiled again and its
    init kept, in a 1 MB one not; the result the same."""
    from polyc.schedule import machine
    monkeypatch.setenv("POLYC_L1D_BYTES", "4096")
    monkeypatch.setenv("POLYC_L2_BYTES", str(l2))
    machine.l1d_bytes.cache_clear()
    machine.l2_bytes.cache_clear()
    try:
        assert machine.l1d_bytes() == 4096 and machine.l2_bytes() == l2
        op = polyc.define(MATMUL, threads=1)
        a, b = random_inputs([((33, 600), "float32"), ((600, 70), "float32")])
        assert_matches_numpy(op(a, b), a @ b, **TOL)
        assert bool(register_tile.dropped_inits(op.schedule)) == whole
    finally:
        monkeypatch.delenv("POLYC_L1D_BYTES")
        monkeypatch.delenv("POLYC_L2_BYTES")
        machine.l1d_bytes.cache_clear()
        machine.l2_bytes.cache_clear()
