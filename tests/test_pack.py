"""Packing of a contraction's large operand into column blocks (polyc/pack.py): which
kernels are packed, the rewritten kernel's shape, and results against numpy on sizes
that are not multiples of the block or of the register tile, on every scheduler option,
1 and 2 threads and under the sanitizers. The thresholds are lowered so that small
(fast) sizes are packed."""
from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import warnings

import numpy as np
import pytest
from conftest import assert_matches_numpy, random_inputs

import polyc
from polyc import pack
from polyc.codegen.toolchain import asan_runtime, sanitizer_environment
from polyc.errors import PolycWarning
from polyc.schedule import register_tile

MATMUL = """
def matmul(float(M,K) A, float(K,N) B) -> (C) {
    C(m,n) +=! A(m,k) * B(k,n)
}"""
TOL = dict(rtol=1e-4, atol=1e-3)
OPTIONS = [dict(), dict(threads=2), dict(fusion="min"), dict(fusion="max"),
           dict(scheduler="pluto"), dict(register_tile=(4, 32)), dict(tile=(16, 8, 32))]


@pytest.fixture
def small_thresholds(monkeypatch):
    """Pack from 8 rows and any operand size (the defaults want big matmuls)."""
    monkeypatch.setattr(pack, "MIN_ROWS", 8)
    monkeypatch.setattr(pack, "MIN_ROWS_SHORT_ROWS", 8)
    monkeypatch.setattr(pack, "MIN_BYTES_L2_FRACTION", 1 << 30)


def _packed(op) -> bool:
    return "_packed[" in op.c_source


def _nr(dtype="float32") -> int:
    return register_tile.machine_shape(dtype, polyc.Options())[1]


def _run(src, shapes, ref, dtype="float32", seed=0, tol=TOL, **opts):
    op = polyc.define(src, **opts)
    xs = random_inputs([(s, dtype) for s in shapes], seed)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", PolycWarning)  # isl's fusion budget under "max"
        got = op(*xs)
    assert_matches_numpy(got, ref(*xs), **tol)
    return op


@pytest.mark.parametrize("opts", OPTIONS, ids=lambda o: ",".join(f"{k}={v}" for k, v in o.items())
                         or "default")
@pytest.mark.parametrize("m,k,n", [(37, 53, 130), (9, 70, 2 * 64 + 63), (130, 1, 65)])
def test_matmul_packed_matches_numpy(m, k, n, opts, small_thresholds):
    """A partial last block (``n`` not a multiple of the block), odd rows and depths."""
    op = _run(MATMUL, [(m, k), (k, n)], lambda a, b: a @ b, **opts)
    assert _packed(op) == (n > _nr()), op.c_source


def test_packed_kernel_shape(small_thresholds):
    """The copy comes first, the result's column iterator is split into a block and a
    lane (the initialisation too), and the contraction reads the packed copy."""
    op = _run(MATMUL, [(20, 30), (30, 200)], lambda a, b: a @ b)
    src = op.c_source
    nr = _nr()
    assert f"B_packed[(nb * K + d0) * {nr} + ni] = B[d0 * N + ({nr} * nb + ni)]" in src
    assert "B_packed[(n_blk * K + k) * " in src
    assert src.index("B_packed[(nb") < src.index("B_packed[(n_blk")


def test_temporary_operand(small_thresholds):
    """An operand the kernel computes before the contraction is packed after it."""
    src = """
    def f(float(M,K) A, float(K,N) B) -> (C) {
        B2(k,n) = B(k,n) * 2
        C(m,n) +=! A(m,k) * B2(k,n)
    }"""
    for opts in (dict(), dict(fusion="max"), dict(scheduler="pluto")):
        op = _run(src, [(25, 31), (31, 140)], lambda a, b: a @ (2 * b), **opts)
        assert "B2_packed[" in op.c_source


def test_batched_and_epilogue(small_thresholds):
    """A batched B (its batch index kept before the packed rows) and an epilogue reading
    the result (left on its own iterators)."""
    src = """
    def bmm(float(Bt,M,K) A, float(Bt,K,N) B, float(N) bias) -> (C, D) {
        C(b,m,n) +=! A(b,m,k) * B(b,k,n)
        D(b,m,n) = C(b,m,n) + bias(n)
    }"""
    for opts in (dict(), dict(threads=2), dict(scheduler="pluto"), dict(fusion="max")):
        op = polyc.define(src, **opts)
        a, b, bias = random_inputs([((3, 17, 23), "float32"), ((3, 23, 150), "float32"),
                                    ((150,), "float32")], 1)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", PolycWarning)
            c, d = op(a, b, bias)
        assert _packed(op)
        assert_matches_numpy(c, a @ b, **TOL)
        assert_matches_numpy(d, a @ b + bias, **TOL)


@pytest.mark.parametrize("dtype,tol", [("float64", dict(rtol=1e-10, atol=1e-10)),
                                       ("float16", dict(rtol=2e-2, atol=2e-2))])
def test_other_dtypes(dtype, tol, small_thresholds):
    """double (another block width) and float16 (accumulated in float32 first)."""
    src = MATMUL.replace("float(", f"{dtype}(")
    op = _run(src, [(21, 40), (40, 170)],
              lambda a, b: (a.astype(np.float64) @ b.astype(np.float64)).astype(dtype),
              dtype=dtype, tol=tol)
    assert _packed(op)


_SANITIZED = """
import sys
sys.path.insert(0, {tests!r})
import polyc
from polyc import pack
from conftest import assert_matches_numpy, random_inputs
pack.MIN_ROWS, pack.MIN_ROWS_SHORT_ROWS, pack.MIN_BYTES_L2_FRACTION = 8, 8, 1 << 30
for opts in (dict(), dict(threads=2), dict(fusion="max")):
    op = polyc.define({src!r}, sanitize=True, cflags=("-Wall", "-Wextra", "-Werror"), **opts)
    a, b = random_inputs([((13, 29), "float32"), ((29, 150), "float32")], 0)
    assert_matches_numpy(op(a, b), a @ b, rtol=1e-4, atol=1e-3)
    assert "_packed[" in op.c_source
print("SANITIZED OK")
"""


@pytest.mark.skipif(asan_runtime() is None, reason="gcc has no libasan.so")
def test_sanitizers():
    """The copy and the split contraction stay inside their arrays (ASan/UBSan, in a
    child process that loads the ASan runtime first; see test_sanitizers.py)."""
    script = _SANITIZED.format(tests=os.path.dirname(os.path.abspath(__file__)), src=MATMUL)
    done = subprocess.run([sys.executable, "-c", script], env=sanitizer_environment(),
                          capture_output=True, text=True, timeout=600, check=False)
    assert done.returncode == 0 and "SANITIZED OK" in done.stdout, \
        f"stdout:\n{done.stdout[-3000:]}\nstderr:\n{done.stderr[-5000:]}"


NT = "def f(float(M,K) A, float(N,K) B) -> (C) { C(m,n) +=! A(m,k) * B(n,k) }"
SYRK = """
def syrk(float(N,N) C_in, float(N,M) A) -> (float(N,N) C) {
    C(i,j) = (j <= i) ? 1.2 * C_in(i,j) : C_in(i,j)
    C(i,j) += 1.5 * A(i,k) * A(j,k) where exists A(i - j, k)
}"""


def _syrk_ref(c, a):
    return np.where(np.tri(len(c), dtype=bool), 1.2 * c + 1.5 * (a @ a.T), c)


@pytest.mark.parametrize("opts", OPTIONS, ids=lambda o: ",".join(f"{k}={v}" for k, v in o.items())
                         or "default")
@pytest.mark.parametrize("case", ["nt", "syrk"])
def test_transposed_operand_packed(case, opts, small_thresholds):
    """An operand read along the reduction (``B(n, k)``; syrk's ``A(j, k)`` beside its
    untouched ``A(i, k)``, over a triangle) is packed transposed, its blocks walked by
    the column tile: the same sums as numpy's, partial blocks and rows included."""
    if case == "nt":
        op = _run(NT, [(37, 53), (2 * 64 + 63, 53)], lambda a, b: a @ b.T, **opts)
        assert "B_packed[(nb * K + d0) * " in op.c_source
        if set(opts) <= {"threads"}:  # the default schedule: the column tile (rows x
            # lanes), not the dot form's rows of scalar sums
            assert re.search(r"float polyc_acc\[\d+\]\[\d+\]", op.c_source)
    else:
        op = _run(SYRK, [(150, 150), (150, 41)], _syrk_ref, **opts)
        assert "A_packed[(nb * M + d0) * " in op.c_source
        assert "A[i * M + k]" in op.c_source  # the other read keeps A itself
    assert _packed(op)


def test_isolation_isl_rejects_is_dropped(monkeypatch, small_thresholds):
    """On a CPU with 16-lane vectors, syrk at 150 with 4 x 32 register tiles gets an
    ``isolate`` option (the rows of the triangle's partial tiles) that isl's AST
    generator fails on; the option only asks for the full tiles' code apart, so the AST
    is built without it and the result stays right (any CPU: the width is set here)."""
    monkeypatch.setattr(register_tile, "vector_bits", lambda: 512)
    monkeypatch.setattr(register_tile, "vector_registers", lambda: 32)
    op = _run(SYRK, [(150, 150), (150, 41)], _syrk_ref, register_tile=(4, 32))
    assert _packed(op) and "polyc_acc" in op.c_source


def test_transposed_pack_keeps_each_sum_in_order(small_thresholds):
    """The column tile over the transposed pack adds each sum's terms in ``k`` order,
    as the untiled loop does: bit for bit the same float64 results."""
    exact = polyc.Options().cflags + ("-ffp-contract=off",)
    c, a = random_inputs([((90, 90), "float64"), ((90, 77), "float64")], 3)
    src = SYRK.replace("float(", "double(")
    got = polyc.define(src, options=polyc.Options(cflags=exact))(c, a)
    plain = polyc.define(src, options=polyc.Options(register_tile=False, tile=False,
                                                    pack=False, cflags=exact))(c, a)
    np.testing.assert_array_equal(got, plain)


@pytest.mark.parametrize("src,shapes", [
    # no reduction: nothing to reuse
    ("def f(float(M,N) A, float(M,N) B) -> (C) { C(m,n) = A(m,n) * B(m,n) }",
     [(20, 150), (20, 150)]),
])
def test_not_packed(src, shapes, small_thresholds):
    op = polyc.define(src)
    xs = random_inputs([(s, "float32") for s in shapes], 0)
    op(*xs)
    assert not _packed(op)


def test_thresholds_and_options(monkeypatch):
    """Not packed: few rows (more of them where ``B``'s rows are shorter than a page),
    an operand that fits in the L2, ``pack=False``, no register tiles, no tiles, a user
    schedule or the CUDA target."""
    a, b = random_inputs([((20, 30), "float32"), ((30, 200), "float32")], 0)
    monkeypatch.setattr(pack, "MIN_BYTES_L2_FRACTION", 1 << 30)
    monkeypatch.setattr(pack, "MIN_ROWS", 21)
    monkeypatch.setattr(pack, "MIN_ROWS_SHORT_ROWS", 21)
    op = polyc.define(MATMUL)
    op(a, b)
    assert not _packed(op)  # 20 rows
    monkeypatch.setattr(pack, "MIN_ROWS", 20)
    op = polyc.define(MATMUL)
    op(a, b)
    assert not _packed(op)  # 20 rows of B 800 bytes long: under a page
    monkeypatch.setattr(pack, "PAGE_BYTES", 800)
    op = polyc.define(MATMUL)
    op(a, b)
    assert _packed(op)  # a "page" of 800 bytes: B's rows are long
    monkeypatch.setattr(pack, "PAGE_BYTES", 4096)
    monkeypatch.setattr(pack, "MIN_ROWS_SHORT_ROWS", 20)
    op = polyc.define(MATMUL)
    op(a, b)
    assert _packed(op)
    for opts in (dict(pack=False), dict(register_tile=False), dict(tile=False)):
        op = polyc.define(MATMUL, **opts)
        assert_matches_numpy(op(a, b), a @ b, **TOL)
        assert not _packed(op), opts
    monkeypatch.setattr(pack, "MIN_BYTES_L2_FRACTION", 1)  # B (24 KB) fits in the L2
    op = polyc.define(MATMUL)
    op(a, b)
    assert not _packed(op)


def test_thresholds_where_strided_runs_are_slow(monkeypatch):
    """Where the probe says the prefetchers do not follow a tile's strided runs, the copy
    pays from far fewer rows: :data:`pack.SLOW_STRIDES_MIN_ROWS` (long rows of ``B``),
    :data:`pack.SLOW_STRIDES_MIN_ROWS_SHORT` (rows shorter than a page)."""
    from polyc.schedule import machine
    a, b = random_inputs([((20, 30), "float32"), ((30, 200), "float32")], 0)
    monkeypatch.setattr(pack, "MIN_BYTES_L2_FRACTION", 1 << 30)
    monkeypatch.setattr(pack, "MIN_ROWS", 8)
    monkeypatch.setattr(pack, "MIN_ROWS_SHORT_ROWS", 8)
    monkeypatch.setattr(pack, "SLOW_STRIDES_MIN_ROWS", 21)
    monkeypatch.setattr(pack, "SLOW_STRIDES_MIN_ROWS_SHORT", 21)
    for cost, packed in ((1.0, True), (pack.STRIDED_PANEL_SLOW, True), (1.5, False)):
        monkeypatch.setattr(machine, "strided_panel_cost", lambda *shape, c=cost: c)
        op = polyc.define(MATMUL)
        assert_matches_numpy(op(a, b), a @ b, **TOL)
        assert _packed(op) == packed, cost  # 20 rows: the slow-strides threshold is 21
    monkeypatch.setattr(pack, "SLOW_STRIDES_MIN_ROWS_SHORT", 20)
    op = polyc.define(MATMUL)
    assert_matches_numpy(op(a, b), a @ b, **TOL)
    assert _packed(op)  # B's rows (800 bytes) are short: 20 rows are enough
    monkeypatch.setattr(pack, "SLOW_STRIDES_MIN_ROWS_SHORT", 21)
    monkeypatch.setattr(pack, "PAGE_BYTES", 800)
    monkeypatch.setattr(pack, "SLOW_STRIDES_MIN_ROWS", 20)
    op = polyc.define(MATMUL)
    assert_matches_numpy(op(a, b), a @ b, **TOL)
    assert _packed(op)  # long rows now: their threshold (20) holds


def test_strided_panel_probe(monkeypatch, tmp_path):
    """The probe builds and runs at this machine's tile shape and at another (a positive
    time ratio), is kept per CPU and tile shape in the cache directory and read back from
    there, gives way to ``POLYC_STRIDED_PANEL_COST``, and says 1.0 (the old thresholds)
    where it cannot run or the shape is not whole vectors."""
    from polyc.schedule import machine
    if shutil.which(os.environ.get("POLYC_CC", "gcc")) is None:
        pytest.skip("no C compiler")
    for shape in ((6, 16, 32), (4, 32, 32), (6, 64, 64), (6, 16, 32, 1024, 64)):
        cost = machine._run_probe(*shape)
        assert cost is not None and 0.2 < cost < 20, shape
    monkeypatch.setenv("POLYC_CACHE_DIR", str(tmp_path))
    monkeypatch.delenv("POLYC_STRIDED_PANEL_COST", raising=False)
    ran = []
    monkeypatch.setattr(machine, "_run_probe", lambda *shape: ran.append(shape) or 1.7)
    machine.strided_panel_cost.cache_clear()
    try:
        assert machine.strided_panel_cost(6, 16, 32) == 1.7
        monkeypatch.setattr(machine, "_run_probe", lambda *shape: ran.append(shape) or 1.2)
        assert machine.strided_panel_cost(4, 16, 32) == 1.2  # another shape: its own
        assert [r[:3] for r in ran] == [(6, 16, 32), (4, 16, 32)]
        assert all(r[3] == 512 and 16 <= r[4] <= 512 and r[4] & (r[4] - 1) == 0
                   for r in ran)  # the default 512 steps; a power-of-two cache tile
        assert machine.strided_panel_cost(6, 16, 32, 1024) == 1.2  # other steps: its own
        assert ran[-1][3] == 1024 and len(ran) == 3
        assert os.path.isfile(machine._probe_path())
        assert machine._probe_path().startswith(str(tmp_path))
        assert machine.strided_panel_cost(6, 12, 32) == 1.0  # not whole vectors: not run
        assert len(ran) == 3
        monkeypatch.setattr(machine, "_run_probe", lambda *shape: None)
        machine.strided_panel_cost.cache_clear()
        assert machine.strided_panel_cost(6, 16, 32) == 1.7  # from the cache file
        assert machine.strided_panel_cost(4, 16, 32) == 1.2
        os.remove(machine._probe_path())
        machine.strided_panel_cost.cache_clear()
        assert machine.strided_panel_cost(6, 16, 32) == 1.0  # no probe, no file
        monkeypatch.setenv("POLYC_STRIDED_PANEL_COST", "2.5")
        machine.strided_panel_cost.cache_clear()
        assert machine.strided_panel_cost(6, 16, 32) == 2.5
    finally:
        machine.strided_panel_cost.cache_clear()


def test_cuda_target_not_packed(small_thresholds):
    op = polyc.define(MATMUL, target="cuda", emulate=True)
    a, b = random_inputs([((20, 30), "float32"), ((30, 200), "float32")], 0)
    assert_matches_numpy(op(a, b), a @ b, **TOL)
    assert "_packed" not in op.cuda_source
    nt = polyc.define(NT, target="cuda", emulate=True)  # nor a transposed operand
    bt = np.ascontiguousarray(b.T)
    assert_matches_numpy(nt(a, bt), a @ b, **TOL)
    assert "_packed" not in nt.cuda_source


def test_onnx_matmul_of_two_inputs_is_packed(small_thresholds, tmp_path):
    """A model's MatMul whose B is a graph input (no constant to lay out at compile time)
    is packed at run time; the model's step schedule is the packed kernel's."""
    from onnx import TensorProto, helper
    node = helper.make_node("MatMul", ["a", "b"], ["y"])
    g = helper.make_graph([node], "mm",
                          [helper.make_tensor_value_info("a", TensorProto.FLOAT, (3, 40, 37)),
                           helper.make_tensor_value_info("b", TensorProto.FLOAT, (3, 37, 150))],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)])
    model = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    a, b = random_inputs([((3, 40, 37), "float32"), ((3, 37, 150), "float32")], 2)
    for opts in (dict(), dict(threads=2)):
        m = polyc.compile_onnx(model, options=polyc.Options(cache_dir=str(tmp_path), **opts))
        assert "_packed[" in m.c_source
        assert_matches_numpy(m.run(None, {"a": a, "b": b})[0], a @ b, **TOL)


def test_every_transposed_operand_packed(small_thresholds):
    """syr2k reads two operands along the reduction (``A(j,k)``, ``B(j,k)``): both are
    packed, or the column tile would walk one of them strided."""
    src = """
    def syr2k(float(N,N) C_in, float(N,M) A, float(N,M) B) -> (float(N,N) C) {
        C(i,j) = (j <= i) ? 1.2 * C_in(i,j) : C_in(i,j)
        C(i,j) += A(j,k) * 1.5 * B(i,k) + B(j,k) * 1.5 * A(i,k) where exists A(i - j, k)
    }"""
    for opts in (dict(), dict(threads=2), dict(scheduler="pluto")):
        op = _run(src, [(130, 130), (130, 37), (130, 37)],
                  lambda c, a, b: np.where(np.tri(len(c), dtype=bool),
                                           1.2 * c + 1.5 * (b @ a.T + a @ b.T), c), **opts)
        assert "A_packed[" in op.c_source and "B_packed[" in op.c_source


GEMM = """
def gemm(float(NI,NJ) C_in, float(NI,NK) A, float(NK,NJ) B) -> (C) {
    C(i,j) = 1.2 * C_in(i,j)
    C(i,j) += 1.5 * A(i,k) * B(k,j)
}"""


@pytest.mark.parametrize("opts", [dict(), dict(threads=2), dict(fusion="min"),
                                  dict(scheduler="pluto"), dict(pack=False)],
                         ids=["default", "threads2", "fusion_min", "pluto", "no_pack"])
@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_row_factor_computed_once(opts, dtype, monkeypatch):
    """gemm's ``1.5 * A(i,k)`` (free of the column ``j``) is computed once into a
    temporary before the contraction, over sizes that are not multiples of the tiles
    (130 x 77 x 150); without floating-point contraction the result is the same in every
    bit as without the temporary (the factor is rounded before it meets ``B`` either
    way; with contraction gcc may fuse a different pair in one of them)."""
    src = GEMM.replace("float(", "double(") if dtype == "float64" else GEMM
    c, a, b = random_inputs([((130, 150), dtype), ((130, 77), dtype), ((77, 150), dtype)], 3)
    op = polyc.define(src, **opts)
    assert_matches_numpy(op(c, a, b), 1.2 * c + 1.5 * (a @ b), **TOL)
    assert "C_rowf[" in op.c_source, op.c_source
    exact = polyc.define(src, cflags=("-ffp-contract=off",), **opts)
    out = exact(c, a, b)
    monkeypatch.setattr(pack, "HOIST_ROW_FACTORS", False)
    plain = polyc.define(src, cflags=("-ffp-contract=off",), **opts)
    assert np.array_equal(plain(c, a, b), out)
    assert "C_rowf[" not in plain.c_source


@pytest.mark.parametrize("src,shapes", [
    # the factor reads the array the contraction writes
    ("def f(float(N,N) A, float(N,N) B) -> (C) {\n C(i,j) = A(i,j)\n"
     " C(i,j) += 2.0 * C(i,k) * B(k,j) where exists A(k,j)\n}", [(150, 150), (150, 150)]),
    # the columns fit in one register tile (this CPU's): each factor is computed once anyway
    (GEMM, [(130, _nr() - 3), (130, 77), (77, _nr() - 3)]),
    # no factor apart from plain reads
    (MATMUL, [(130, 77), (77, 150)]),
])
def test_row_factor_left_alone(src, shapes):
    xs = random_inputs([(s, "float32") for s in shapes], 1)
    op = polyc.define(src)
    op(*xs)
    assert "_rowf[" not in op.c_source


def test_row_factor_not_under_max_fusion():
    """``fusion="max"`` keeps the factor in the contraction (a copy would be fused back
    into its loops), and is correct and quick to schedule with a reduction of 4."""
    c, a, b = random_inputs([((136, 280), "float32"), ((136, 4), "float32"),
                             ((4, 280), "float32")], 4)
    op = polyc.define(GEMM, fusion="max")
    with warnings.catch_warnings():
        warnings.simplefilter("error", PolycWarning)
        assert_matches_numpy(op(c, a, b), 1.2 * c + 1.5 * (a @ b), **TOL)
    assert "_rowf[" not in op.c_source


def test_row_factor_of_a_triangle():
    """syrk's ``1.5 * A(i,k)`` under its triangle (``j <= i``) is computed once too."""
    src = SYRK.replace("1.5 * A(i,k) * A(j,k)", "1.5 * A(i,k) * A(j,k)")
    c, a = random_inputs([((150, 150), "float32"), ((150, 90), "float32")], 2)
    op = polyc.define(src)
    assert_matches_numpy(op(c, a), _syrk_ref(c, a), **TOL)
    assert "C_rowf[" in op.c_source, op.c_source


def test_row_factor_on_the_cuda_target():
    """The CUDA target keeps the factor in the contraction (the hoist is for the CPU's
    register tiles) and computes gemm right over sizes off its tiles (the emulation)."""
    c, a, b = random_inputs([((130, 150), "float32"), ((130, 77), "float32"),
                             ((77, 150), "float32")], 5)
    op = polyc.define(GEMM, target="cuda", emulate=True)
    assert_matches_numpy(op(c, a, b), 1.2 * c + 1.5 * (a @ b), **TOL)
    assert "_rowf" not in op.cuda_source
