"""Register tiles on the GPU (issue 10, part 2): each thread keeps the accumulators of
several points in registers across the reduction (PPCG's private memory), and those
kernels still match numpy in both thread orders under the emulation, build with nvcc
without spills, and say so in the report.
"""
from __future__ import annotations

import shutil

import numpy as np
import pytest
from conftest import random_inputs
from test_cuda_emulation import assert_same_bits, run_both_orders
from test_e2e_numpy import CASES

import polyc
from polyc.options import Options

#: reductions whose write follows the mapped members (register tiles apply), and the
#: shapes: sizes that are not multiples of the block (32 x 8) nor of the tile
REDUCTIONS = {
    "matmul": [[(70, 37), (37, 130)], [(1, 1), (1, 1)], [(9, 45), (45, 3)]],
    "batched_matmul": [[(3, 37, 29), (3, 29, 41)]],
    "conv2d_stride1": [[(2, 3, 19, 37), (5, 3, 3, 3)]],
    "tensordot": [[(7, 5, 3), (5, 3, 13)]],
    "mlp_relu": [[(7, 37), (13, 37), (13,), (5, 13), (5,)]],
}


@pytest.mark.parametrize("case, points", [(c, p) for c in sorted(REDUCTIONS)
                                          for p in (True, (3, 2), False)]
                         + [("matmul", (1, 5)), ("batched_matmul", (2, 2, 2))])
def test_register_tiles_match_numpy_in_both_orders(case, points):
    src, _, ref = CASES[case]
    op = polyc.define(src, target="cuda", emulate=True, gpu_register_tile=points)
    for seed, shapes in enumerate(REDUCTIONS[case]):
        inputs = random_inputs([(s, "float32") for s in shapes], seed)
        fwd, rev = run_both_orders(op, inputs)
        assert_same_bits(fwd, rev)
        want = ref(*inputs)
        for got, w in zip(fwd, want if isinstance(want, tuple) else (want,)):
            np.testing.assert_allclose(got, w, rtol=1e-4, atol=1e-4)
    if case == "matmul":
        assert ("polyc_reg_C" in op.cuda_source) == (points not in (False, (1, 1))), \
            op.cuda_source


def test_matmul_register_tile_layout():
    op = polyc.define(CASES["matmul"][0], target="cuda", emulate=True)
    A, B = random_inputs([((70, 129), "float32"), ((129, 130), "float32")], 1)
    np.testing.assert_allclose(op(A, B), A @ B, rtol=1e-4, atol=1e-4)
    src = op.cuda_source
    # 2 x 4 points per thread of a 32 x 8 block: 64 x 32 tiles, C kept in registers
    assert "registers: C[4, 2] per thread" in src
    assert "float polyc_reg_C[4][2] = {};" in src
    assert "tile 64, 32 threads" in src and "tile 32, 8 threads" in src
    assert src.count("POLYC_UNROLL") >= 6  # copy-in, copy-out (2 each), the point loops
    report = op.gpu_report
    k = report.kernel("S1")
    assert k.registers == ("C", (4, 2))
    assert "registers: C[4][2] per thread" in str(report)


def test_no_register_tile_without_a_reduction_loop():
    """An elementwise kernel (no reduction member) has nothing to keep."""
    op = polyc.define("def add(float(M,N) A, float(M,N) B) -> (C) { C(m,n) = A(m,n) + B(m,n) }",
                      target="cuda", emulate=True)
    A, B = random_inputs([((37, 70), "float32"), ((37, 70), "float32")])
    np.testing.assert_allclose(op(A, B), A + B)
    assert "polyc_reg_" not in op.cuda_source


def test_register_tile_option_checked():
    with pytest.raises(polyc.CompileError, match="gpu_register_tile"):
        Options(target="cuda", gpu_register_tile=(0, 2))
    with pytest.raises(polyc.CompileError, match="gpu_register_tile"):
        Options(target="cuda", gpu_register_tile=(2, 2, 2, 2))


@pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc is not installed")
@pytest.mark.parametrize("sizes", [{"M": 1024, "K": 1024, "N": 1024},
                                   {"M": 70, "K": 129, "N": 130}])
def test_register_tiled_matmul_builds_without_spills(sizes):
    op = polyc.define(CASES["matmul"][0], target="cuda")
    compiled = op.compiled_for(sizes)
    from polyc.codegen.nvcc import ptxas_report
    info = ptxas_report(compiled.source.text, "matmul", op.options)
    assert "polyc_reg_C" in compiled.source.text
    for name, k in info.items():
        assert not k.spills, f"{name} spills: {k}"
        assert k.stack_bytes == 0, f"{name} uses a stack frame (the tile is not in registers)"
