"""Nests that stream the same large array fused into one outer loop
(:mod:`polyc.schedule.fuse`): the result against numpy, at sizes whose arrays exceed
any L2 and that are no multiples of the register tiles, under both schedulers; the
fused loop where one thread runs, the separate nests where two threads would do more."""
from __future__ import annotations

import sys
from pathlib import Path

import islpy as isl
import numpy as np
import pytest

import polyc
from codegen_helpers import fused_bands
from polyc import marks, share
from polyc.schedule import fuse, machine, optimize

ATAX = """
def atax(double(M,N) A, double(N) x) -> (y) {
    tmp(i) +=! A(i,j) * x(j)
    y(j) +=! A(i,j) * tmp(i)
}"""

ATAX_F32 = ATAX.replace("double", "float")

#: the second nest reads the first's next row: fused with a shift of one row
SHIFTED = """
def shifted(float(N,M) A) -> (T, C) {
    T(i,j) = A(i,j) * A(i+1,j) where i in 0:N-1, j in 0:M
    C(i,j) = T(i,j) + 2 * T(i+1,j) - A(i,j) where i in 0:N-2, j in 0:M
}"""


#: the two products share no dependence: the second is placed where it reads the rows of
#: A the first reads (its member j, A's row index), and the run is led by the first
#: product's row member i, not its column member j (rows stream, columns would not)
BICG = """
def bicg(double(N,M) A, double(M) p, double(N) r) -> (s, q) {
    s(j) +=! r(i) * A(i,j)
    q(i) +=! A(i,j) * p(j)
}"""

MVT = """
def mvt(double(N) y1, double(N) y2, double(N,N) A) -> (x1, x2) {
    x1(i) +=! A(i,j) * y1(j)
    x2(i) +=! A(j,i) * y2(j)
}"""


def _big(rows: int, itemsize: int) -> int:
    """Columns making ``rows`` rows larger than 3 L2s."""
    return 3 * machine.l2_bytes() // (rows * itemsize) + 7


@pytest.mark.parametrize("scheduler", ["isl", "pluto"])
@pytest.mark.parametrize("src,dtype", [(ATAX, np.float64), (ATAX_F32, np.float32)])
def test_atax_fuses_its_two_sweeps(src, dtype, scheduler):
    m = 301
    n = _big(m, np.dtype(dtype).itemsize)
    rng = np.random.default_rng(3)
    A = rng.standard_normal((m, n)).astype(dtype)
    x = rng.standard_normal(n).astype(dtype)
    want = A.astype(np.float64).T @ (A.astype(np.float64) @ x.astype(np.float64))
    for threads in (1, 2):
        op = polyc.define(src, options=polyc.Options(threads=threads, scheduler=scheduler))
        got = op(A, x)
        tol = 1e-10 if dtype == np.float64 else 2e-3
        np.testing.assert_allclose(got, want, rtol=tol, atol=tol * np.abs(want).max())
        compiled = op.compiled_for({"M": m, "N": n})
        fused = fused_bands(compiled.schedule)
        summed = "reduction(+:" in compiled.c_source
        if threads == 1:
            assert fused and not summed, "the two sweeps over A share one outer loop"
        elif n * np.dtype(dtype).itemsize <= fuse.PRIVATE_MAX_BYTES:
            # fused too, the loop parallel: each thread sums y over its rows of A
            assert fused and summed
        else:  # two threads over the separate sweeps read A faster than one fused
            assert not fused


@pytest.mark.parametrize("scheduler", ["isl", "pluto"])
def test_shifted_nests_fuse_and_stay_correct(scheduler):
    n, m = 97, _big(97, 4)
    A = np.random.default_rng(4).standard_normal((n, m)).astype(np.float32)
    T = A[:-1] * A[1:]
    want_c = T[:-1] + 2 * T[1:] - A[:-2]
    op = polyc.define(SHIFTED, options=polyc.Options(threads=1, scheduler=scheduler))
    got_t, got_c = op(A)
    np.testing.assert_allclose(got_t, T, rtol=1e-6)
    np.testing.assert_allclose(got_c, want_c, rtol=1e-5, atol=1e-5)
    assert fused_bands(op.compiled_for({"N": n, "M": m}).schedule)


def _fused_along(schedule: isl.Schedule, iterator: str) -> bool:
    """Whether, in the fused band, each statement over ``i`` and ``j`` takes one value
    of the fused loop per value of ``iterator`` (the loop runs along it)."""
    found = []

    def visit(node: isl.ScheduleNode) -> bool:
        if node.get_type() == isl.schedule_node_type.band and node.n_children() \
                and node.child(0).get_type() == isl.schedule_node_type.sequence:
            found.append(node.band_get_partial_schedule_union_map())
        return True

    schedule.get_root().foreach_descendant_top_down(visit)
    maps: list[isl.Map] = []
    found[0].foreach_map(maps.append)
    two_d = [m for m in maps if m.dim(isl.dim_type.in_) == 2]
    assert two_d
    for m in two_d:
        names = [m.get_dim_name(isl.dim_type.in_, d) for d in range(2)]
        fixed = m.fix_val(isl.dim_type.in_, names.index(iterator),
                          isl.Val.int_from_si(m.get_ctx(), 0))
        if not fixed.range().is_singleton():
            return False
    return True


@pytest.mark.parametrize("scheduler", ["isl", "pluto"])
def test_independent_sweeps_fuse_along_the_rows(scheduler):
    n, m = 211, _big(211, 8)
    rng = np.random.default_rng(7)
    A = rng.standard_normal((n, m))
    p, r = rng.standard_normal(m), rng.standard_normal(n)
    op = polyc.define(BICG, options=polyc.Options(threads=1, scheduler=scheduler))
    s, q = op(A, p, r)
    np.testing.assert_allclose(s, A.T @ r, rtol=1e-10, atol=1e-9)
    np.testing.assert_allclose(q, A @ p, rtol=1e-10, atol=1e-9)
    compiled = op.compiled_for({"N": n, "M": m})
    assert fused_bands(compiled.schedule)
    assert _fused_along(compiled.schedule, "i")  # A's rows, not its columns

    k = 2 * machine.l2_bytes() // (8 * 200) + 200
    rng = np.random.default_rng(8)
    A = rng.standard_normal((k, k))
    y1, y2 = rng.standard_normal(k), rng.standard_normal(k)
    op = polyc.define(MVT, options=polyc.Options(threads=1, scheduler=scheduler))
    x1, x2 = op(y1, y2, A)
    np.testing.assert_allclose(x1, A @ y1, rtol=1e-10, atol=1e-9)
    np.testing.assert_allclose(x2, A.T @ y2, rtol=1e-10, atol=1e-9)
    assert fused_bands(op.compiled_for({"N": k}).schedule)


def _private_marks(schedule: isl.Schedule) -> list[isl.ScheduleNode]:
    from polyc.check import iter_nodes
    return [n for n in iter_nodes(schedule.get_root())
            if n.get_type() == isl.schedule_node_type.mark
            and n.mark_get_id().get_name().startswith(marks.PRIVATE)]


@pytest.mark.parametrize("scheduler", ["isl", "pluto"])
@pytest.mark.parametrize("name", ["ATAX", "BICG", "MVT"])
def test_sums_the_fused_loop_carries_get_a_copy_per_thread(tiny_l2, name, scheduler):
    """At two threads the fused loop runs in parallel, each thread adding into its own
    copy of the vector the fused rows of ``A`` sum into (an OpenMP array reduction);
    at one thread it runs alone, no copies; the same results as numpy either way, at
    odd sizes."""
    src = globals()[name]
    rng = np.random.default_rng(13)
    m, n = 301, 299  # (enough work for a parallel loop)
    A = rng.standard_normal((m, n) if name != "MVT" else (m, m))
    args = {"ATAX": (A, rng.standard_normal(n)),
            "BICG": (A, rng.standard_normal(n), rng.standard_normal(m)),
            "MVT": (rng.standard_normal(m), rng.standard_normal(m), A)}[name]
    want = {"ATAX": lambda A, x: (A.T @ (A @ x),),
            "BICG": lambda A, p, r: (A.T @ r, A @ p),
            "MVT": lambda y1, y2, A: (A @ y1, A.T @ y2)}[name](*args)
    sizes = {"ATAX": {"M": m, "N": n}, "BICG": {"N": m, "M": n}, "MVT": {"N": m}}[name]
    for threads in (1, 2):
        op = polyc.define(src, options=polyc.Options(threads=threads, scheduler=scheduler))
        got = op(*args)
        for g, w in zip(got if isinstance(got, tuple) else (got,), want):
            np.testing.assert_allclose(g, w, rtol=1e-10, atol=1e-10)
        compiled = op.compiled_for(sizes)
        assert fused_bands(compiled.schedule)
        assert ("reduction(+:" in compiled.c_source) is (threads == 2)
        assert bool(_private_marks(compiled.schedule)) is (threads == 2)


def test_float16_sums_are_privatized_in_their_float_accumulators(tiny_l2):
    """float16 arrays are stored as their bits: a copy per thread is made only of an
    array whose C type adds as its sums do (here bicg's float32 accumulators)."""
    import re
    src = BICG.replace("double", "float16")
    rng = np.random.default_rng(15)
    A = rng.standard_normal((301, 299)).astype(np.float16)
    p, r = rng.standard_normal(299).astype(np.float16), rng.standard_normal(301).astype(np.float16)
    op = polyc.define(src, options=polyc.Options(threads=2))
    s, q = op(A, p, r)
    A64, p64, r64 = (x.astype(np.float64) for x in (A, p, r))
    np.testing.assert_allclose(s.astype(np.float64), A64.T @ r64, rtol=0.02, atol=0.1)
    np.testing.assert_allclose(q.astype(np.float64), A64 @ p64, rtol=0.02, atol=0.1)
    compiled = op.compiled_for({"N": 301, "M": 299})
    private = re.findall(r"reduction\(\+: (\w+)\[", compiled.c_source)
    dtypes = {a.name: a.dtype for a in compiled.scheduled.kernel.arrays}
    assert private and all(dtypes[n] in fuse.PRIVATE_DTYPES for n in private), private


def test_private_marks_are_checked(tiny_l2):
    """The checks refuse a parallel loop whose ``private:`` mark names an array another
    statement of the loop reads (or none where the loop carries a sum)."""
    from polyc.check import check_schedule
    op = polyc.define(MVT, options=polyc.Options(threads=2))
    rng = np.random.default_rng(14)
    op(rng.standard_normal(301), rng.standard_normal(301), rng.standard_normal((301, 301)))
    scheduled = op.compiled_for({"N": 301}).scheduled
    kernel, deps = scheduled.kernel, scheduled.deps
    [mark] = _private_marks(scheduled.schedule)
    check_schedule(kernel, deps, scheduled.schedule)  # as compiled: fine
    names = [a.name for a in kernel.arrays]
    for other, why in (("A", "touches"), ("y1", "touches"), ("", "carries a dependence")):
        bad = fuse.private_mark((other,), kernel) if other else marks.PRIVATE
        edited = mark.delete().insert_mark(isl.Id(bad)).get_schedule()
        with pytest.raises(polyc.ScheduleError, match=why):
            check_schedule(kernel, deps, edited)
    assert "x2" in names


def test_small_arrays_are_not_fused():
    """Arrays that fit in the cache: the nests keep their own loops (and threads)."""
    A = np.random.default_rng(5).standard_normal((33, 41))
    x = np.random.default_rng(6).standard_normal(41)
    op = polyc.define(ATAX, options=polyc.Options(threads=1))
    np.testing.assert_allclose(op(A, x), A.T @ (A @ x), rtol=1e-10)
    assert not fused_bands(op.compiled_for({"M": 33, "N": 41}).schedule)


def test_min_fusion_keeps_the_nests_apart():
    m, n = 37, _big(37, 8)
    A = np.random.default_rng(9).standard_normal((m, n))
    x = np.random.default_rng(10).standard_normal(n)
    op = polyc.define(ATAX, options=polyc.Options(threads=1, fusion="min"))
    np.testing.assert_allclose(op(A, x), A.T @ (A @ x), rtol=1e-10, atol=1e-9)
    assert not fused_bands(op.compiled_for({"M": m, "N": n}).schedule)


def test_fused_rows_mark():
    assert fuse.fused_rows(f"{fuse.FUSED}:39") == 39
    assert fuse.fused_rows("parallel") is None
    assert fuse.fused_rows(f"{fuse.FUSED}:x") is None
    assert fuse.fused_columns(f"{fuse.FUSED}:39") is None
    assert fuse.fused_rows(f"{fuse.FUSED}:7:48") == 7
    assert fuse.fused_columns(f"{fuse.FUSED}:7:48") == 48
    assert fuse.fused_columns(f"{fuse.FUSED}:7:x") is None
    assert fuse.fused_columns("parallel") is None


@pytest.fixture
def small_l1(monkeypatch):
    """An L1 of 4 KB (``POLYC_L1D_BYTES``): a fused stencil tile holds a few rows of a
    small kernel's columns, as it does of a large one's on a real L1."""
    monkeypatch.setenv("POLYC_L1D_BYTES", "4096")
    machine.l1d_bytes.cache_clear()
    yield
    monkeypatch.delenv("POLYC_L1D_BYTES")
    machine.l1d_bytes.cache_clear()


def _tiles_of_rows_and_columns(schedule: isl.Schedule) -> list[int]:
    """The members of each band that has a sequence of nests below it, directly or
    under a ``parallel`` mark and the band of a wavefront's tiles."""
    found = []

    def visit(node: isl.ScheduleNode) -> bool:
        if node.get_type() == isl.schedule_node_type.band and node.n_children():
            below = node.child(0)
            while below.get_type() in (isl.schedule_node_type.mark,
                                       isl.schedule_node_type.band):
                below = below.child(0)
            if below.get_type() == isl.schedule_node_type.sequence \
                    and node.parent().get_type() != isl.schedule_node_type.band \
                    and node.parent().get_type() != isl.schedule_node_type.mark:
                found.append(node.band_n_member())
        return True

    schedule.get_root().foreach_descendant_top_down(visit)
    return found


@pytest.mark.parametrize("n", [9, 37, 130, 203])
@pytest.mark.parametrize("threads", [1, 2])
def test_stencil_sweeps_fuse_rows_and_columns(tiny_l2, small_l1, n, threads):
    """The unrolled sweeps of jacobi-2d fuse along the rows and along the columns too,
    each sweep a row and a column behind the last: a band of tiles of both, which two
    threads run as a wavefront (one parallel region, each front's tiles shared) and
    one thread in tiles of whole rows, or row by row where two rows do not fit half
    the L1. Exact, in the two outputs, at sizes no multiple of a tile."""
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "examples" / "benchmarks"))
    from polybench_kernels import _jacobi_ref, jacobi_tc
    rng = np.random.default_rng(n)
    a, b = rng.standard_normal((n, n)), rng.standard_normal((n, n))
    op = polyc.define(jacobi_tc(3), options=polyc.Options(threads=threads))
    for _ in range(2):
        for g, w in zip(op(a, b), _jacobi_ref(3)(a, b)):
            np.testing.assert_allclose(g, w, rtol=1e-12, atol=1e-12)
    if n < 37:
        return
    compiled = op.compiled_for({"N": n})
    if n * n * 8 >= share.MIN_SHARED_BYTES:  # (the sweeps run in the two outputs)
        assert not compiled.scheduled.kernel.temporaries
    if threads == 2 and n >= 130:  # (a smaller grid is too little work for threads)
        src = compiled.c_source
        region = src.index("#pragma omp parallel num_threads(2)\n")
        assert src.index("#pragma omp for\n", region) > region
    elif threads == 2 or n * 16 * 2 <= 4096 // fuse.COLUMN_L1_FRACTION:
        # (one thread: tiles of whole rows, two of them at least in half the L1)
        assert 2 in _tiles_of_rows_and_columns(compiled.schedule)
        if threads == 2:
            assert "omp for" not in compiled.c_source
    else:  # one thread, a row too long for two in half the L1: the rows fuse alone
        assert fused_bands(compiled.schedule)
        assert 2 not in _tiles_of_rows_and_columns(compiled.schedule)


def test_stencil_columns_stay_apart_where_a_sweep_reads_whole_rows(tiny_l2, small_l1):
    """atax's second product reads every column the first summed: no column shift
    keeps its dependences within a few columns, so only the rows fuse."""
    op = polyc.define(ATAX, options=polyc.Options(threads=1))
    m, n = 97, 131
    rng = np.random.default_rng(0)
    A, x = rng.standard_normal((m, n)), rng.standard_normal(n)
    np.testing.assert_allclose(op(A, x), A.T @ (A @ x), rtol=1e-10, atol=1e-9)
    schedule = op.compiled_for({"M": m, "N": n}).schedule
    assert fused_bands(schedule) and 2 not in _tiles_of_rows_and_columns(schedule)


#: two stencil sweeps and a sum over both results: the sum would join a run of fused
#: rows and columns, where two tiles of one front would add to its one element at once
SWEEPS_AND_SUM = """
def chain(double(N,M) A) -> (T1, s) {
    T0(i,j) = A(i,j)
    T0(i,j) = A(i-1,j) + A(i+1,j) + A(i,j-1) + A(i,j+1) where i in 1:N-1, j in 1:M-1
    T1(i,j) = A(i,j)
    T1(i,j) = T0(i-1,j) + T0(i+1,j) + T0(i,j-1) + T0(i,j+1) where i in 1:N-1, j in 1:M-1
    s(z) +=! T1(i,j) * T0(i,j) where z in 0:1
}"""


@pytest.mark.parametrize("threads", [1, 2])
def test_a_sum_keeps_the_columns_apart(tiny_l2, small_l1, threads):
    """A run with a reduction fuses no columns (at 2 threads the legality check refused
    the wavefront, with a warning: an error here); the results against numpy."""
    n, m = 97, 131
    A = np.random.default_rng(0).standard_normal((n, m))
    T1, s = polyc.define(SWEEPS_AND_SUM, options=polyc.Options(threads=threads))(A)
    T0 = A.copy()
    T0[1:-1, 1:-1] = A[:-2, 1:-1] + A[2:, 1:-1] + A[1:-1, :-2] + A[1:-1, 2:]
    want = A.copy()
    want[1:-1, 1:-1] = T0[:-2, 1:-1] + T0[2:, 1:-1] + T0[1:-1, :-2] + T0[1:-1, 2:]
    np.testing.assert_allclose(T1, want, rtol=1e-12)
    np.testing.assert_allclose(s, [(want * T0).sum()], rtol=1e-10)


def _random_stencil_chain(rng) -> str:
    """Two to four sweeps over an N x M grid, each a cross of taps on the last sweep's
    result and up to two more within two rows and columns (lopsided: the shifts along
    both members differ), the border copied from the input first, as the unrolled
    Jacobi does."""
    lines, src = [], "A"
    steps = int(rng.integers(2, 5))
    for k in range(steps):
        taps = {(-1, 0), (1, 0), (0, -1), (0, 1)} | {  # (a cross: isl keeps them apart)
            (int(rng.integers(-1, 2)), int(rng.integers(-1, 2)))
            for _ in range(int(rng.integers(0, 3)))}
        lo_i, hi_i = max(0, -min(d for d, _ in taps)), max(0, max(d for d, _ in taps))
        lo_j, hi_j = max(0, -min(d for _, d in taps)), max(0, max(d for _, d in taps))
        expr = " + ".join(f"{rng.integers(1, 9) / 8} * {src}({_at('i', di)},{_at('j', dj)})"
                          for di, dj in sorted(taps))
        dst = f"T{k}"
        lines += [f"{dst}(i,j) = A(i,j)",
                  f"{dst}(i,j) = {expr} where i in {lo_i}:N-{hi_i}, j in {lo_j}:M-{hi_j}"]
        src = dst
    body = "\n    ".join(lines)
    return f"def chain(double(N,M) A) -> ({src}) {{\n    {body}\n}}"


def _at(it: str, d: int) -> str:
    return it if d == 0 else f"{it}{d:+d}"


@pytest.mark.parametrize("seed", range(16))
@pytest.mark.filterwarnings("ignore:.*exceeded its budget")  # (then one nest at a time)
def test_random_stencil_chains_against_the_interpreter(tiny_l2, small_l1, monkeypatch, seed):
    """Random chains of lopsided stencil sweeps, fused along rows and columns or not,
    against the fuzzers' reference interpreter, at 1 and 2 threads (the small grids
    run parallel loops too)."""
    monkeypatch.setattr(optimize, "TINY_WORK", 0)
    import os
    import sys
    sys.path.insert(0, os.path.join(os.path.dirname(__file__), "fuzz"))
    import interp as I

    rng = np.random.default_rng(seed)
    src = _random_stencil_chain(rng)
    (d,) = I.parse(src)
    n, m = int(rng.integers(5, 90)), int(rng.integers(5, 90))
    inputs = [rng.standard_normal((n, m))]
    want, _ = I.run(d, inputs)
    for threads in (1, 2):
        got = polyc.define(src, options=polyc.Options(threads=threads))(*inputs)
        np.testing.assert_allclose(got, np.asarray(want[0]), rtol=1e-12, atol=1e-12,
                                   err_msg=src)


@pytest.mark.parametrize("m,n", [(1, 1), (2, 3), (13, 7), (27, 40), (40, 27)])
@pytest.mark.parametrize("scheduler", ["isl", "pluto"])
def test_fused_at_odd_small_sizes(tiny_l2, m, n, scheduler):
    """Sizes below, at and past a register tile's rows, each kernel fused."""
    rng = np.random.default_rng(m * 100 + n)
    A = rng.standard_normal((m, n))
    x, y1 = rng.standard_normal(n), rng.standard_normal(m)
    opts = polyc.Options(threads=1, scheduler=scheduler)
    atax = polyc.define(ATAX, options=opts)
    np.testing.assert_allclose(atax(A, x), A.T @ (A @ x), rtol=1e-10, atol=1e-10)
    s, q = polyc.define(BICG, options=opts)(A, x, y1)
    np.testing.assert_allclose(s, A.T @ y1, rtol=1e-10, atol=1e-10)
    np.testing.assert_allclose(q, A @ x, rtol=1e-10, atol=1e-10)
    if m * n * 8 > 256 and m > 1:
        assert fused_bands(atax.compiled_for({"M": m, "N": n}).schedule)


#: nests over one matrix: (statement, the vectors it reads {v} from, where its result
#: goes): "rows" vectors have N elements (A's rows), "cols" M (A's columns)
_NESTS = [
    ("{out}(i) +=! A(i, j) * {v}(j)", "cols", "rows"),
    ("{out}(j) +=! A(i, j) * {v}(i)", "rows", "cols"),
    ("{out}(j) +=! A(i + 1, j) * {v}(i) where i in 0:N-1", "rows", "cols"),
    ("{out}(i) +=! A(i, j) * {v}(j) + A(i + 1, j) where i in 0:N-1", "cols", None),
    ("{out}(i, j) = A(i, j) - 2 * A(i + 1, j) where i in 0:N-1", None, None),
]


def _random_chain(rng) -> str:
    """Two or three nests over one matrix: row and column sums, products with an
    earlier nest's result (shifted by a row or not), a shifted elementwise pass."""
    lines, vectors = [], {"rows": ["r"], "cols": ["x"]}
    for k in range(rng.integers(2, 4)):
        text, reads, result = _NESTS[rng.integers(len(_NESTS))]
        v = vectors[reads][rng.integers(len(vectors[reads]))] if reads else ""
        lines.append(text.format(out=f"O{k}", v=v))
        if result:
            vectors[result].append(f"O{k}")
    outs = ", ".join(f"O{k}" for k in range(len(lines)))
    body = "\n    ".join(lines)
    return (f"def chain(double(N,M) A, double(M) x, double(N) r) -> ({outs}) {{\n"
            f"    {body}\n}}")


@pytest.mark.parametrize("seed", range(24))
def test_random_chains_against_the_interpreter(tiny_l2, seed):
    """Random chains of nests over one matrix, fused or not, against the fuzzers'
    reference interpreter, under both schedulers, at 1 and 2 threads."""
    import os
    import sys
    sys.path.insert(0, os.path.join(os.path.dirname(__file__), "fuzz"))
    import interp as I

    rng = np.random.default_rng(seed)
    src = _random_chain(rng)
    try:
        (d,) = I.parse(src)
    except Exception:  # noqa: BLE001 -- a template the interpreter's parser refuses
        pytest.skip("not parsed")
    n, m = int(rng.integers(2, 40)), int(rng.integers(1, 40))
    inputs = [rng.standard_normal((n, m)), rng.standard_normal(m), rng.standard_normal(n)]
    want, _ = I.run(d, inputs)
    for scheduler in ("isl", "pluto"):
        for threads in (1, 2):
            got = polyc.define(src, options=polyc.Options(threads=threads,
                                                          scheduler=scheduler))(*inputs)
            got = got if isinstance(got, tuple) else (got,)
            for g, w in zip(got, want):
                np.testing.assert_allclose(g, np.asarray(w), rtol=1e-9, atol=1e-9,
                                           err_msg=src)


def test_cuda_target_keeps_the_nests_apart(tiny_l2, tmp_cache):
    """The CUDA target maps isl's schedule to kernels itself (no fusion pass), through
    the CPU emulation, against numpy at sizes no multiple of its blocks."""
    rng = np.random.default_rng(11)
    A, x = rng.standard_normal((27, 40)), rng.standard_normal(40)
    op = polyc.define(ATAX, options=polyc.Options(target="cuda", emulate=True,
                                                  cache_dir=tmp_cache))
    np.testing.assert_allclose(np.asarray(op(A, x)), A.T @ (A @ x), rtol=1e-10, atol=1e-10)
    assert not fused_bands(op.compiled_for({"M": 27, "N": 40}).schedule)
