"""Register tiling (polyc/schedule/register_tile.py): the schedule it builds, the C it
prints (a local accumulator, copy-in/copy-out, unrolled rows) and results against numpy
on sizes that are not multiples of the register or cache tiles (partial register tiles
at every array edge), for float32/float64/int32, every fusion mode, on and off."""
from __future__ import annotations

import re

import numpy as np
import pytest
from conftest import assert_matches_numpy, random_inputs
from test_e2e_numpy import CASES

import polyc
from polyc import expr as E
from polyc import ir, pipeline
from polyc.schedule import register_tile
from codegen_helpers import kernel, read, statement

pytestmark = pytest.mark.filterwarnings("error::polyc.errors.PolycWarning")

MATMUL = CASES["matmul"][0]
TYPES = {"float32": "float", "float64": "double", "int32": "int32"}
TOL = {"float32": dict(rtol=1e-4, atol=1e-3), "float64": dict(rtol=1e-10, atol=1e-10),
       "int32": dict(rtol=0, atol=0)}


def _define(src: str, dtype: str = "float32", **options):
    return polyc.define(src.replace("float(", TYPES[dtype] + "("), **options)


def _check(op, shapes, ref, dtype="float32", seed=0):
    xs = random_inputs([(s, dtype) for s in shapes], seed)
    assert_matches_numpy(op(*xs), ref(*xs), **TOL[dtype])


def _register_marks(op) -> list[str]:
    return re.findall(r'mark: "(register:[^"]*)"', str(op.schedule))


def test_matmul_c_has_accumulator_and_unrolled_rows():
    op = _define(MATMUL, register_tile=(8, 64))
    _check(op, [(130, 37), (37, 257)], lambda A, B: A @ B)
    c = op.c_source
    assert "float polyc_acc[8][64] __attribute__((aligned(64)));" in c
    # full tiles: the 8 rows are unrolled (no row loop), each a simd loop over columns
    assert all(f"const int64_t m = c3 + {r};" in c for r in range(1, 8))
    assert c.count("polyc_acc[m - polyc_lo0][n - polyc_lo1] +=") >= 8
    assert "C[m * N + n] +=" not in c  # every update goes to the accumulator
    # k (37) fits one reduction tile: the accumulator starts from the init S0's zero
    # (tests/test_register_init.py), and copies out
    assert _register_marks(op) == ["register:S1:8,64:" + str(register_tile.vector_bits())
                                   + ":S0"]
    assert "polyc_acc[polyc_r0][polyc_r1] = 0.0f" in c
    assert "] = polyc_acc[polyc_r0][polyc_r1];" in c
    # a reduction of 37 steps: the copy-in and copy-out keep their row loops
    assert "#pragma GCC unroll" not in c


@pytest.mark.parametrize("k,unrolled", [(9, True), (32, True), (33, False)])
def test_short_reduction_tiles_unroll_their_copies(k, unrolled):
    """A register tile whose reduction takes at most ``ROWS_UNROLLED_STEPS`` steps
    unrolls the rows of its copy-in and copy-out (gcc keeps the accumulator in registers
    from its zeroing to its store: no memset, no round trip through the stack)."""
    op = _define(MATMUL, register_tile=(8, 64))
    _check(op, [(43, k), (k, 131)], lambda A, B: A @ B)
    c = op.c_source
    rows = re.findall(r"#pragma GCC unroll 8\s*for \(int64_t polyc_r0 = 0;", c)
    assert (len(rows) >= 2) == unrolled


def test_machine_default_shape():
    op = _define(MATMUL)
    _check(op, [(37, 130), (130, 257)], lambda A, B: A @ B)
    mr, nr = register_tile.machine_shape("float32", polyc.Options())
    assert f"float polyc_acc[{mr}][{nr}]" in op.c_source
    if register_tile.vector_bits() >= 512:
        assert 'target("prefer-vector-width=512")' in op.c_source
    assert register_tile.machine_shape("float64", polyc.Options())[1] * 2 == nr
    assert register_tile.machine_shape("float32", polyc.Options(register_tile=False)) is None


def test_register_tile_off():
    op = _define(MATMUL, register_tile=False)
    _check(op, [(130, 37), (37, 257)], lambda A, B: A @ B)
    assert "polyc_acc" not in op.c_source and not _register_marks(op)


@pytest.mark.parametrize("dtype", list(TYPES))
@pytest.mark.parametrize("mkn", [(1, 1, 1), (7, 37, 130), (130, 7, 257), (257, 130, 37),
                                 (37, 257, 7), (130, 130, 130)])
def test_matmul_sizes_and_types(dtype, mkn):
    m, k, n = mkn
    op = _define(MATMUL, dtype)
    _check(op, [(m, k), (k, n)], lambda A, B: A @ B, dtype)
    if min(mkn) > 1:
        assert _register_marks(op)


@pytest.mark.parametrize("fusion", ["min", "smart", "max"])
@pytest.mark.parametrize("reg", [True, False])
def test_matmul_fusion_modes(fusion, reg):
    op = _define(MATMUL, fusion=fusion, register_tile=reg)
    _check(op, [(130, 37), (37, 257)], lambda A, B: A @ B)
    if not reg:
        assert not _register_marks(op)
    elif fusion != "max":  # max fuses the initialisation into the (m, n) band
        assert _register_marks(op)


@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_register_tiles_straddle_cache_tiles(dtype):
    """Register tiles (3 x 5) that do not divide the cache tiles (7, 11, 13): partial
    register tiles inside every cache tile, not only at the array edges."""
    op = _define(MATMUL, dtype, register_tile=(3, 5), tile=(7, 11, 13))
    _check(op, [(37, 130), (130, 257)], lambda A, B: A @ B, dtype)
    assert "polyc_acc[3][5]" in op.c_source


def test_parametric_kernel():
    """``specialize=False``: one library for every size; the full-tile test is symbolic."""
    op = _define(MATMUL, specialize=False)
    for seed, (m, k, n) in enumerate([(130, 37, 257), (7, 1, 70), (1, 130, 1), (64, 64, 64)]):
        _check(op, [(m, k), (k, n)], lambda A, B: A @ B, seed=seed)
    assert _register_marks(op)


@pytest.mark.parametrize("dtype", ["float32", "int32"])
def test_batched_matmul(dtype):
    src, _, ref = CASES["batched_matmul"]
    op = _define(src, dtype)
    _check(op, [(3, 37, 130), (3, 130, 257)], ref, dtype)
    marks = _register_marks(op)
    assert marks and marks[0].split(":")[2].startswith("1,")  # rows are m, not the batch


@pytest.mark.parametrize("case,shapes", [
    ("conv2d_stride1", [(2, 5, 13, 70), (37, 5, 3, 3)]),
    ("conv2d_stride2_where", [(2, 5, 13, 140), (37, 5, 3, 3), (37,)]),
    ("conv2d_padded", [(2, 5, 13, 70), (37, 5, 3, 3)]),
])
@pytest.mark.parametrize("specialize", [True, False])
def test_convolutions(case, shapes, specialize):
    src, _, ref = CASES[case]
    op = _define(src, specialize=specialize)
    _check(op, shapes, ref)
    marks = _register_marks(op)
    assert marks
    # rows are output channels f, columns the output width w: box [1, MR, 1, NR]
    box = marks[0].split(":")[2].split(",")
    assert box[0] == "1" and box[2] == "1" and int(box[1]) > 1 and int(box[3]) > 1


def test_gemm_with_bias_under_fusion():
    src = """
def gemm(float(M,K) A, float(K,N) B, float(N) bias) -> (Y) {
    Y(m,n) +=! A(m,k) * B(k,n)
    Y(m,n) = Y(m,n) + bias(n)
}"""
    for fusion in ("min", "smart", "max"):
        op = _define(src, fusion=fusion)
        _check(op, [(130, 37), (37, 257), (257,)], lambda A, B, b: A @ B + b)


@pytest.mark.parametrize("src,shapes,ref", [
    (CASES["matvec"][0], [(37, 130), (130,)], lambda A, x: A @ x),    # rank-1 write
    ("""
def gemm_tb(float(M,K) A, float(N,K) B) -> (C) {
    C(m,n) +=! A(m,k) * B(n,k)
}""", [(37, 130), (70, 130)], lambda A, B: A @ B.T),                   # reduction innermost
])
def test_reduction_innermost_gets_dot_rows(src, shapes, ref):
    """No column-form tile (no stride-1 parallel loop to vectorize): a rank-1 write or
    a reduction walking both operands contiguously gets the dot-product form instead,
    rows only for a float sum (``register_tile.plan_dot``), and no ``simd`` loop.
    (Without ``pack=False`` the second operand of ``gemm_tb`` is packed transposed and
    the column tile runs over it: ``test_pack.test_transposed_operand_packed``.)"""
    op = _define(src, pack=False)
    _check(op, shapes, ref)
    marks = _register_marks(op)
    assert marks and '"simd"' not in str(op.schedule)
    boxes = [[int(x) for x in m.split(":")[2].split(",")] for m in marks]
    assert all(sum(x > 1 for x in box) == 1 for box in boxes), marks


@pytest.mark.parametrize("threads", [1, 2])
def test_column_blocks_of_a_gemv_get_register_rows(threads):
    """A vector times column-blocked weights (a batch-1 fully connected layer:
    ``Yt(m, nb, ni) += x(m, k) * Wb(nb, k, ni)``): no row shares the weights' vector loads,
    yet its rows are the column blocks, kept in registers across the reduction (before,
    each step loaded and stored the sums). At 2 threads the 16 blocks are cut 8 + 8, not
    in whole 6-row register tiles as 12 + 4."""
    src = """
def gemv(float(M,K) A, float(NB,K,NI) W) -> (Y) {
    Y(m,nb,ni) +=! A(m,k) * W(nb,k,ni)
}"""
    op = _define(src, threads=threads)
    _check(op, [(1, 301), (16, 301, 64)], lambda A, W: np.einsum("mk,bki->mbi", A, W))
    assert _register_marks(op)
    if threads == 2:
        assert re.search(r"omp parallel for num_threads\(2\)\s*for \(int64_t (c\d+) = 0; "
                         r"\1 <= 15; \1 \+= 8\)", op.c_source), op.c_source


def test_tiny_kernels_stay_sequential():
    small = _define(MATMUL)
    _check(small, [(7, 13), (13, 30)], lambda A, B: A @ B)
    assert "omp parallel" not in small.c_source
    big = _define(MATMUL)  # 130 * 97 * 257 = 3.2M instances (the limit is 256k)
    _check(big, [(130, 97), (97, 257)], lambda A, B: A @ B)
    assert "omp parallel for" in big.c_source
    generic = _define(MATMUL, specialize=False)  # sizes unknown: parallel
    _check(generic, [(7, 13), (13, 30)], lambda A, B: A @ B)
    assert "omp parallel for" in generic.c_source


def test_options_validation():
    with pytest.raises(polyc.CompileError):
        polyc.Options(register_tile=(8,))
    with pytest.raises(polyc.CompileError):
        polyc.Options(register_tile=(0, 64))
    assert polyc.Options(register_tile=[4, 16]).register_tile == (4, 16)


def test_footprint_must_be_a_box():
    """A write whose footprint in one register tile has holes (``C[2m][n]``, built by
    hand: TC writes plain indices) is not promoted: its copy-out would write elements
    that no iteration computed."""
    sizes = ("M", "K", "N")
    M, K, N = (E.Size(s) for s in sizes)
    m, n, k = E.Index("m"), E.Index("n"), E.Index("k")
    two_m = E.Binary("*", E.Const(2), m)
    arrays = [ir.Array("A", "float32", (M, K)), ir.Array("B", "float32", (K, N)),
              ir.Array("C", "float32", (E.Binary("*", E.Const(2), M), N), "output")]
    upd = statement("S1", sizes, ("m", "n", "k"), (M, N, K), ("C", (two_m, n)), "+",
                    E.Binary("*", read("A", m, k), read("B", k, n)))
    knl = kernel("strided", sizes, arrays, [upd]).specialize({"M": 37, "K": 13, "N": 70})
    done = pipeline.compile_kernel(knl, polyc.Options())
    assert "register:" not in str(done.schedule) and "polyc_acc" not in done.c_source
    A, B = random_inputs([((37, 13), "float32"), ((13, 70), "float32")])
    C = np.full((74, 70), 3.0, np.float32)
    done.function([A, B], outputs=[C])
    want = np.full((74, 70), 3.0, np.float32)
    want[0::2] += A @ B
    np.testing.assert_allclose(C, want, rtol=1e-4, atol=1e-3)


def _user_tree(mark_parent: str, mark_child: str, mark: str) -> str:
    return ('{ domain: "[M, K, N] -> { S0[m, n] : 0 <= m < M and 0 <= n < N; '
            'S1[m, n, k] : 0 <= m < M and 0 <= n < N and 0 <= k < K }", child: { sequence: [ '
            '{ filter: "[M, K, N] -> { S0[m, n] }", child: { schedule: '
            '"[M, K, N] -> [{ S0[m, n] -> [(m)] }, { S0[m, n] -> [(n)] }]" } }, '
            '{ filter: "[M, K, N] -> { S1[m, n, k] }", child: { schedule: "' + mark_parent
            + '", child: { mark: "' + mark + '", child: { schedule: "' + mark_child
            + '" } } } } ] } }')


def test_user_schedule_register_marks_are_checked():
    """A register mark in a schedule written by the user is verified like the
    scheduler's own: a safe one is used, an unsafe one refused with the reason."""
    tiles = ("[M, K, N] -> [{ S1[m, n, k] -> [(m - (m) mod 4)] }, "
             "{ S1[m, n, k] -> [(n - (n) mod 8)] }]")
    points = ("[M, K, N] -> [{ S1[m, n, k] -> [(k)] }, { S1[m, n, k] -> [(m)] }, "
              "{ S1[m, n, k] -> [(n)] }]")
    safe = _define(MATMUL, schedule=_user_tree(tiles, points, "register:S1:4,8:256"))
    _check(safe, [(37, 13), (13, 70)], lambda A, B: A @ B)
    assert "float polyc_acc[4][8]" in safe.c_source
    small = _define(MATMUL, schedule=_user_tree(tiles, points, "register:S1:2,8:256"))
    with pytest.raises(polyc.ScheduleError, match="do not form a box"):
        _check(small, [(37, 13), (13, 70)], lambda A, B: A @ B)


@pytest.mark.parametrize("scheduler", ["isl", "pluto"])
@pytest.mark.parametrize("threads", [1, 2])
def test_row_sums_run_their_reduction_innermost(scheduler, threads):
    """A row sum (``s(n) +=! X(n,d)``, a LayerNormalization's mean) walks each row's
    contiguous elements in independent chains (the rows-only dot-product tile) instead
    of a vector loop over rows loading each lane from another row: no ``omp simd`` loop
    over ``n`` is left. Each row still adds its terms in order: the sums are bit for bit
    a sequential float32 sum's."""
    op = polyc.define("def rs(float(N,D) X) -> (s) { s(n) +=! X(n,d) }",
                      options=polyc.Options(threads=threads, scheduler=scheduler))
    x = np.random.default_rng(2).standard_normal((37, 300)).astype(np.float32)
    got = op(x)
    want = np.zeros(37, np.float32)
    for d in range(300):
        want += x[:, d]
    np.testing.assert_array_equal(got, want)
    assert "polyc_acc[" in op.c_source
    assert not re.search(r"#pragma omp simd\s*\n\s*for \(int64_t c\d+ = 0; c\d+ <= 36;",
                         op.c_source)


def test_row_sums_on_the_cuda_target():
    """The row sum on the CUDA target (the CPU emulation): each row's terms in order, as
    a sequential float32 sum."""
    op = polyc.define("def rs(float(N,D) X) -> (s) { s(n) +=! X(n,d) }", target="cuda",
                      emulate=True)
    x = np.random.default_rng(3).standard_normal((37, 300)).astype(np.float32)
    want = np.zeros(37, np.float32)
    for d in range(300):
        want += x[:, d]
    np.testing.assert_allclose(op(x), want, rtol=1e-5, atol=1e-4)


def test_register_tile_prefetches_the_next_weight_panel(avx512_model):
    """A float register tile over blocked weights ``W(nb, k, ni)`` that sums its whole
    reduction prefetches, at each step, a line of the next block's panel (``K * NI``
    elements on); one whose reduction is cut into chunks, a line of its next chunk
    (``32 * NI`` elements on: it comes next, not the next panel); the sums are
    unchanged. The CUDA target does not prefetch."""
    src = """
def blocked(float(M,K) A, float(NB,K,NI) W) -> (Y) {
    Y(m,nb,ni) +=! A(m,k) * W(nb,k,ni)
}"""
    shapes = [(47, 320), (20, 320, 64)]  # 47 rows: a partial row tile too
    ref = lambda A, W: np.einsum("mk,bki->mbi", A, W)  # noqa: E731
    op = _define(src)
    _check(op, shapes, ref)
    assert f"+ {320 * 64 * 4}u + 64u * ((uint64_t)" in op.c_source, op.c_source
    cut = _define(src, tile=(8, 4, 32, 64))
    _check(cut, shapes, ref)
    assert _register_marks(cut)
    line = next(x for x in cut.c_source.splitlines() if "__builtin_prefetch" in x)
    # the next chunk, 32 runs on; past the last, what follows its run (320 - start)
    assert re.search(rf"\(uint64_t\)\((c\d+) \+ 32 < 320 \? {32 * 64 * 4} : "
                     rf"{64 * 4} \* \(320 - \1\)\) \+ 64u \* \(\(uint64_t\)\(\(polyc_lo0 / ",
                     line), line
    assert f"& {32 * 64 * 4 // 64 - 1}u)), 0, 3);" in line and f" + {320 * 64 * 4}u" not in line
    gpu = polyc.define(src, target="cuda", emulate=True)
    _check(gpu, shapes, ref)
    assert "__builtin_prefetch" not in gpu.cuda_source


def test_chunk_of_several_runs_prefetches_each_run_of_the_next_chunk(avx512_model):
    """A tile over the taps ``t`` and one chunk of ``k`` of ``W(nb, t, k, ni)`` (a 3x3
    conv's weights chunked along its input channels) reads three runs of the chunk,
    ``K * NI`` elements apart: its prefetch finds a line's run (``line / 128``) and its
    place in the run; past the last chunk, the next block's first. The sums are
    unchanged, with a partial row tile (47 rows)."""
    src = """
def taps(float(M,T,K) A, float(NB,T,K,NI) W) -> (Y) {
    Y(m,nb,ni) +=! A(m,t,k) * W(nb,t,k,ni)
}"""
    op = _define(src, tile=(8, 4, 3, 32, 64))
    _check(op, [(47, 3, 320), (4, 3, 320, 64)],
           lambda A, W: np.einsum("mtk,btki->mbi", A, W))
    c = op.c_source
    assert re.search(r"const uint64_t polyc_pf_line0 = \(uint64_t\)\(\(polyc_lo0 / 6\) \* 96 \+ c\d+ \* 32 "
                     r"\+ \(c\d+ - c\d+\)\) % 384u;", c), c
    line = next(x for x in c.splitlines() if "__builtin_prefetch" in x)
    assert f": {3 * 320 * 64 * 4} - {64 * 4} * c" in line, line  # the next block's first
    assert f"+ {320 * 64 * 4}u * ((polyc_pf_line0 / 128) % 3) + 64u * (polyc_pf_line0 % 128)" \
        in line, line


def test_few_row_tiles_prefetch_several_lines_a_step(avx512_model):
    """Two 6-row tiles of 320 steps cannot prefetch the next panel's 1280 lines one a
    step: each step prefetches two (``2 * n`` and ``2 * n + 1``), wrapped at 2048 (a
    mask; the lines past 1280 fall on what follows the panel). A conv-like write
    ``Y(h, w, nb, ni)`` numbers its tiles along ``h`` (a loop outside the tile) as well:
    five of them, each prefetching its own lines. The sums are unchanged."""
    src = """
def blocked(float(M,K) A, float(NB,K,NI) W) -> (Y) {
    Y(m,nb,ni) +=! A(m,k) * W(nb,k,ni)
}"""
    op = _define(src)
    _check(op, [(12, 320), (5, 320, 64)], lambda A, W: np.einsum("mk,bki->mbi", A, W))
    fetches = [x for x in op.c_source.splitlines() if "__builtin_prefetch" in x]
    assert any(re.search(r"\(uint64_t\)\(2 \* \(\(polyc_lo0 / 6\) \* 320 \+ c\d+\)\) & 2047u\)", x)
               for x in fetches), fetches
    assert any(re.search(r"\(uint64_t\)\(2 \* \(\(polyc_lo0 / 6\) \* 320 \+ c\d+\) \+ 1\) & 2047u\)", x)
               for x in fetches), fetches
    conv = _define("""
def rows(float(H,W,K) X, float(NB,K,NI) Wt) -> (Y) {
    Y(h,w,nb,ni) +=! X(h,w,k) * Wt(nb,k,ni)
}""")
    _check(conv, [(5, 7, 64), (3, 64, 64)], lambda X, W: np.einsum("hwk,bki->hwbi", X, W))
    line = next(x for x in conv.c_source.splitlines() if "__builtin_prefetch" in x)
    assert re.search(r"\(\(uint64_t\)\(\(polyc_lo0\) \* 64 \+ c\d+\) & 255u\)", line), line


def test_packed_matmul_prefetches_the_next_panel_in_order():
    """A matmul whose ``B`` is packed into column blocks (``Bb(nb, k, ni)``, the lane
    ``ni`` a part of the write's ``64 * nb + ni``) and whose register tiles sum the whole
    reduction prefetches the next block's panel too, one line per step, the row tiles
    one after another through its lines (``tile * K + k`` of ``K * NR * 4 / 64``), so
    the panel's first tile finds it in cache; the product is unchanged, with partial
    row and column tiles (130 x 1100)."""
    src = """
def mm(float(M,K) A, float(K,N) B) -> (C) {
    C(m,n) +=! A(m,k) * B(k,n)
}"""
    shapes = [(130, 512), (512, 1100)]  # B's rows past a page: packed from 128 rows
    op = _define(src)
    _check(op, shapes, lambda A, B: A @ B)
    assert "_packed[" in op.c_source, op.c_source
    mr, nr = register_tile.machine_shape("float32", polyc.Options())  # this CPU's
    line = next(x for x in op.c_source.splitlines() if "__builtin_prefetch" in x)
    assert f"+ {512 * nr * 4}u + 64u * ((uint64_t)((polyc_lo0 / {mr}) * 512 + " in line, line
    lines = 512 * nr * 4 // 64  # (a mask: the lines up to a power of two)
    assert line.rstrip().endswith(f"& {(1 << (lines - 1).bit_length()) - 1}u)), 0, 3);"), line


def test_reduction_chunk_follows_the_l1(monkeypatch):
    """A register tile's reduction chunk keeps its ``MR`` rows of the row operand in the
    L1: 1024 float32 steps of 6 rows on a 48 KB or a 32 KB L1, 256 on an 8 KB one, 128
    on a 2 KB one, within 128..1024; the fixed default where the rule is switched off."""
    from polyc.schedule import machine, optimize
    for l1, chunk in ((48 * 1024, 1024), (32 * 1024, 1024), (8 * 1024, 256), (2048, 128),
                      (1 << 20, 1024)):
        monkeypatch.setattr(machine, "l1d_bytes", lambda l1=l1: l1)
        assert optimize.reduction_chunk(6, 4) == chunk, l1
    monkeypatch.setattr(optimize, "CHUNK_FROM_L1", False)
    assert optimize.reduction_chunk(6, 4) == optimize.DEFAULT_TILE_REDUCTION_REGISTER


def test_box_test_within_its_budget(monkeypatch):
    """The box test that decides a register mark runs within
    :data:`register_tile.FOOTPRINT_OPERATIONS` isl operations: a matmul's needs a few
    tens of thousands. Past the budget the band keeps no register tile, and the result
    is the same; the final check (no budget) still passes."""
    a, b = random_inputs([((37, 45), "float32"), ((45, 70), "float32")], 3)
    op = _define(MATMUL)
    assert_matches_numpy(op(a, b), a @ b, rtol=1e-4, atol=1e-4)
    assert _register_marks(op)
    monkeypatch.setattr(register_tile, "FOOTPRINT_OPERATIONS", 10)
    op = _define(MATMUL)
    assert_matches_numpy(op(a, b), a @ b, rtol=1e-4, atol=1e-4)
    assert not _register_marks(op)
    assert "polyc_acc" not in op.c_source


def test_tiles_that_overflow_avx2_registers_prefetch_nothing(avx2_model, monkeypatch):
    """On 256-bit vectors (16 registers), a conv-like tile of 7 rows of two vectors needs
    17 registers (gcc reads a column vector from memory in each FMA instead): it takes no
    prefetch; 6 rows (15 registers) keep theirs. With AVX-512 the 7-row tile keeps its
    prefetch. The sums are unchanged."""
    src = """
def rows(float(H,W,K) X, float(NB,K,NI) Wt) -> (Y) {
    Y(h,w,nb,ni) +=! X(h,w,k) * Wt(nb,k,ni)
}"""
    for width, fetches in ((7, False), (6, True)):
        conv = _define(src)
        _check(conv, [(5, width, 64), (3, 64, 16)],
               lambda X, W: np.einsum("hwk,bki->hwbi", X, W))
        assert f"float polyc_acc[{width}][16]" in conv.c_source, conv.c_source
        assert ("__builtin_prefetch" in conv.c_source) == fetches, width
    monkeypatch.setattr(register_tile, "vector_bits", lambda: 512)
    monkeypatch.setattr(register_tile, "vector_registers", lambda: 32)
    conv = _define(src)
    _check(conv, [(5, 7, 64), (3, 64, 64)], lambda X, W: np.einsum("hwk,bki->hwbi", X, W))
    assert "float polyc_acc[7][64]" in conv.c_source, conv.c_source
    assert "__builtin_prefetch" in conv.c_source
