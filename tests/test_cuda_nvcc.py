"""The CUDA target built by nvcc (no GPU needed), the no-device error, the static report.

Each operator's ``.cu`` builds with ``-Werror all-warnings``; ptxas's resource lines are
parsed and a kernel fails the test when it spills, uses more than 48 KiB of shared
memory, or is launched with a block size different from its ``__launch_bounds__``.
Calling a non-emulated operator without a usable device raises ``CallError`` (on a
machine with a GPU the same test checks the result instead).
"""
from __future__ import annotations

import re
import shutil

import numpy as np
import pytest
from conftest import random_inputs
from test_e2e_numpy import CASES

import polyc
from polyc.codegen.gpu_report import SM_LIMITS, bank_conflicts, occupancy
from polyc.codegen.nvcc import PtxasInfo, parse_ptxas, ptxas_report
from polyc.pipeline import bind_sizes

NVCC = shutil.which(polyc.Options().nvcc)
needs_nvcc = pytest.mark.skipif(NVCC is None, reason="nvcc not found (POLYC_NVCC)")
STRICT = dict(target="cuda", nvcc_flags=("-Werror", "all-warnings"))
EINSUM = ("""
def einsum(float(B,I,J) X, float(B,J,K) Y) -> (Z) {
    Z(b,i,k) +=! X(b,i,j) * Y(b,j,k)
}""", [[(3, 7, 37), (3, 37, 13)]], None)
OPERATORS = ["matmul", "batched_matmul", "conv2d_stride1", "maxpool", "softmax", "layernorm",
             "einsum"]


def _case(name):
    return EINSUM if name == "einsum" else CASES[name]


def launch_blocks(cu: str) -> dict[str, tuple[int, int]]:
    """Per kernel: (``__launch_bounds__``, threads of the block it is launched with)."""
    bounds = {m.group(2): int(m.group(1)) for m in re.finditer(
        r"__launch_bounds__\((\d+), 1\) (polyc_kernel\d+)\(", cu)}
    out = {}
    for m in re.finditer(r"POLYC_LAUNCH\((polyc_kernel\d+), dim3\([^;]*?\), "
                         r"dim3\((\d+), (\d+), (\d+)\)", cu):
        out[m.group(1)] = (bounds[m.group(1)],
                           int(m.group(2)) * int(m.group(3)) * int(m.group(4)))
    assert set(out) == set(bounds), (bounds, out)
    return out


@needs_nvcc
@pytest.mark.parametrize("name", OPERATORS)
def test_nvcc_builds_clean_and_fits(name):
    src, shape_sets, _ = _case(name)
    op = polyc.define(src, **STRICT)
    inputs = random_inputs([(s, "float32") for s in shape_sets[0]], 0)
    compiled = op.compiled_for(bind_sizes(op.kernel, inputs))  # nvcc -Werror all-warnings
    with open(compiled.library_path[:-3] + ".ptxas.txt") as f:
        info = parse_ptxas(f.read())
    blocks = launch_blocks(compiled.cuda_source)
    assert set(info) == set(blocks)
    for kernel, (bound, threads) in blocks.items():
        assert bound == threads, f"{kernel}: __launch_bounds__({bound}) but {threads} threads"
        assert threads <= 1024 and (threads % 32 == 0 or threads == 1)
        p = info[kernel]
        assert not p.spills, p
        assert p.shared_bytes <= 48 * 1024, p
        assert p.registers * threads <= 65536, p


@needs_nvcc
def test_no_gpu_raises_call_error_or_runs():
    src, shape_sets, ref = CASES["matmul"]
    op = polyc.define(src, target="cuda")
    A, B = random_inputs([(s, "float32") for s in shape_sets[0]])
    try:
        C = op(A, B)
    except polyc.CallError as err:  # this machine: no driver, cudaGetDeviceCount -> 35
        assert "no usable CUDA device: cudaGetDeviceCount returned" in str(err)
    else:  # a machine with a GPU
        np.testing.assert_allclose(C, ref(A, B), rtol=1e-4, atol=1e-4)


@pytest.mark.cuda
@needs_nvcc
def test_on_a_real_device():
    src, shape_sets, ref = CASES["softmax"]
    op = polyc.define(src, target="cuda")
    X, = random_inputs([(s, "float32") for s in shape_sets[0]])
    try:
        Y = op(X)
    except polyc.CallError as err:
        pytest.skip(f"no usable CUDA device: {err}")
    np.testing.assert_allclose(Y, ref(X), rtol=1e-4, atol=1e-4)


def test_missing_nvcc_is_a_toolchain_error(tmp_path):
    op = polyc.define(CASES["matmul"][0], target="cuda", nvcc=str(tmp_path / "no-nvcc"),
                      cache_dir=str(tmp_path))
    with pytest.raises(polyc.ToolchainError, match="no-nvcc"):
        op(*random_inputs([((3, 2), "float32"), ((2, 4), "float32")]))


@needs_nvcc
def test_failing_nvcc_reports_command_and_stderr(tmp_path):
    op = polyc.define(CASES["matmul"][0], target="cuda", nvcc_flags=("--no-such-flag",),
                      cache_dir=str(tmp_path))
    with pytest.raises(polyc.ToolchainError) as info:
        op(*random_inputs([((3, 2), "float32"), ((2, 4), "float32")]))
    assert "--no-such-flag" in str(info.value) and info.value.stderr
    assert info.value.source_path.endswith(".cu")


@needs_nvcc
def test_matmul_report_coalescing_and_occupancy():
    op = polyc.define(CASES["matmul"][0], target="cuda", emulate=True)
    A = np.zeros((1024, 1024), np.float32)
    report = op.compiled_for(bind_sizes(op.kernel, [A, A])).gpu_report
    k = report.kernel("S1")
    # 2 x 4 points per thread (a register tile): 64 x 32 elements of C per block
    assert k.block == (32, 8, 1) and k.grid == ("16", "32", "1")
    assert k.registers == ("C", (4, 2))
    assert k.access("C", "write").coalescing == "coalesced"
    assert k.access("B").coalescing == "coalesced"
    assert k.access("A").coalescing == "broadcast"
    assert k.access("A").shared and k.access("A").bank_conflicts == 1
    assert k.access("B").shared and k.access("B").bank_conflicts == 1
    assert k.ptxas is not None and k.ptxas.registers > 0 and not k.ptxas.spills
    assert k.ptxas.shared_bytes == (32 * 32 + 32 * 64) * 4 and k.ptxas.stack_bytes == 0
    assert k.occupancy is not None and 0 < k.occupancy.fraction <= 1
    assert not report.warnings, report.warnings
    text = str(report)
    assert "A[m, k]: broadcast" in text and "B[k, n]: coalesced" in text


def test_transpose_report_warns_about_strides():
    op = polyc.define(CASES["transpose"][0], target="cuda", emulate=True)
    A = np.zeros((64, 96), np.float32)
    report = op.compiled_for(bind_sizes(op.kernel, [A])).gpu_report
    (k,) = report.kernels
    # T(j,i) = A(i,j): x runs along i (the write's last index), the read strides by a row
    assert (k.access("T").coalescing, k.access("T").stride) == ("coalesced", 1)
    assert (k.access("A").coalescing, k.access("A").stride) == ("strided", 96)
    assert any("uncoalesced" in w and "A[i, j]" in w for w in report.warnings), report


def test_occupancy_and_bank_conflict_rules():
    sm80 = SM_LIMITS[80]
    assert occupancy(PtxasInfo("k", registers=32), 256, sm80).fraction == 1.0
    o = occupancy(PtxasInfo("k", registers=64), 256, sm80)
    assert (o.blocks_per_sm, o.limited_by) == (4, "registers")
    o = occupancy(PtxasInfo("k", registers=16, shared_bytes=40 * 1024), 128, sm80)
    assert (o.blocks_per_sm, o.limited_by) == (4, "shared memory")
    assert [bank_conflicts(s, 4) for s in (0, 1, 2, 32, 33)] == [1, 1, 2, 32, 1]


def test_parse_ptxas_lines():
    text = """ptxas info    : 0 bytes gmem
ptxas info    : Compiling entry function '_Z13polyc_kernel1llPKfS0_Pf' for 'sm_80'
ptxas info    : Function properties for _Z13polyc_kernel1llPKfS0_Pf
    0 bytes stack frame, 8 bytes spill stores, 4 bytes spill loads
ptxas info    : Used 40 registers, used 1 barriers, 5120 bytes smem, 392 bytes cmem[0]
"""
    (p,) = parse_ptxas(text).values()
    assert (p.kernel, p.registers, p.shared_bytes, p.barriers) == ("polyc_kernel1", 40, 5120, 1)
    assert p.spills and (p.spill_stores, p.spill_loads) == (8, 4)


@needs_nvcc
def test_ptxas_report_of_emulated_text(tmp_path):
    op = polyc.define(CASES["softmax"][0], target="cuda", emulate=True,
                      cache_dir=str(tmp_path))
    X, = random_inputs([((37, 130), "float32")])
    c = op.compiled_for(bind_sizes(op.kernel, [X]))
    info = ptxas_report(c.cuda_source, "softmax", op.options)
    assert len(info) == len(c.gpu_kernels)


@needs_nvcc
def test_gpu_arch_option_reaches_nvcc_and_the_report():
    op = polyc.define(CASES["maxpool"][0], target="cuda", gpu_arch="sm_90")
    I, = random_inputs([((2, 3, 9, 12), "float32")])
    compiled = op.compiled_for(bind_sizes(op.kernel, [I]))
    with open(compiled.library_path[:-3] + ".ptxas.txt") as f:
        assert "for 'sm_90'" in f.read()
    report = compiled.gpu_report
    assert report.arch == "sm_90" and all(k.occupancy is not None for k in report.kernels)
    with pytest.raises(polyc.CompileError, match="gpu_arch"):
        polyc.Options(target="cuda", gpu_arch="hopper")
