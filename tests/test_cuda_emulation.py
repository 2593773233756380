"""The CUDA target run on the CPU: the generated ``.cu`` built with g++ and ``cuda_emu.h``.

Every operator is compared with numpy on sizes that are not multiples of the tiles, with
the threads of each barrier interval run forward and then in reverse: the two results
must be bit-identical (a difference is a race between threads of a block). Injected
bugs must be caught: a missing ``__syncthreads()`` (wrong result or the orders differ),
an off-by-one in a global or a shared index (ASan/UBSan, in a child Python that preloads
the ASan runtime as ``test_sanitizers.py`` does), a divergent barrier, a host pointer
passed to a kernel.
"""
from __future__ import annotations

import os
import re
import subprocess
import sys

import numpy as np
import pytest
from conftest import ON_GPU, random_inputs
from test_e2e_numpy import CASES

import polyc
from polyc.codegen.cuda_runtime import CudaFunction
from polyc.codegen.nvcc import build_cuda
from polyc.frontend import from_einsum
from polyc.pipeline import bind_sizes

TESTS = os.path.dirname(os.path.abspath(__file__))
EMULATED = dict(target="cuda", emulate=True)

#: the operators of the issue's matrix: (case of test_e2e_numpy, fusion modes)
MATRIX = [("matmul", ("smart", "max")), ("batched_matmul", ("smart",)),
          ("conv2d_stride1", ("smart",)), ("conv2d_padded", ("smart",)),
          ("maxpool", ("smart",)), ("avgpool", ("smart",)), ("softmax", ("smart", "max")),
          ("layernorm", ("smart",)), ("mlp_relu", ("smart",)), ("tensordot", ("smart",))]


def _as_tuple(x):
    return x if isinstance(x, tuple) else (x,)


def run_both_orders(op, inputs):
    """The operator's outputs with threads run forward, then in reverse (on a GPU, with
    ``POLYC_TEST_ON_GPU``: the device's order, twice)."""
    fwd = _as_tuple(op(*inputs))
    if ON_GPU:
        return fwd, _as_tuple(op(*inputs))
    fn = op.compiled_for(bind_sizes(op.kernel, inputs)).function
    fn.set_thread_order("reverse")
    try:
        rev = _as_tuple(op(*inputs))
    finally:
        fn.set_thread_order("forward")
    return fwd, rev


def assert_same_bits(a, b):
    for x, y in zip(a, b):
        assert x.dtype == y.dtype and x.shape == y.shape
        assert np.array_equal(x.view(np.uint8), y.view(np.uint8)), "orders differ: a race"


@pytest.mark.parametrize("case,fusion", [(c, f) for c, fs in MATRIX for f in fs])
def test_emulated_matches_numpy_in_both_orders(case, fusion):
    src, shape_sets, ref = CASES[case]
    op = polyc.define(src, fusion=fusion, **EMULATED)
    for seed, shapes in enumerate(shape_sets):
        inputs = random_inputs([(s, "float32") for s in shapes], seed)
        fwd, rev = run_both_orders(op, inputs)
        assert_same_bits(fwd, rev)
        want = _as_tuple(ref(*inputs))
        for got, w in zip(fwd, want):
            np.testing.assert_allclose(got, w, rtol=1e-4, atol=1e-4)


def test_einsum_emulated(monkeypatch):
    X, Y = random_inputs([((3, 7, 37), "float32"), ((3, 37, 13), "float32")], 3)
    fwd = polyc.einsum("bij,bjk->bik", X, Y, **EMULATED)
    np.testing.assert_allclose(fwd, np.einsum("bij,bjk->bik", X, Y), rtol=1e-4, atol=1e-4)
    monkeypatch.setenv("POLYC_EMU_ORDER", "reverse")  # read by cuda_emu.h at each launch
    assert_same_bits((fwd,), (polyc.einsum("bij,bjk->bik", X, Y, **EMULATED),))
    op = polyc.Operator(from_einsum("ij,jk->ik", ["float32"] * 2, [2, 2]),
                        polyc.Options(**EMULATED))
    A, B = random_inputs([((70, 37), "float32"), ((37, 130), "float32")])
    np.testing.assert_allclose(op(A, B), A @ B, rtol=1e-4, atol=1e-4)


def test_matmul_uses_shared_memory_and_barriers():
    op = polyc.define(CASES["matmul"][0], **EMULATED)
    A, B = random_inputs([((70, 37), "float32"), ((37, 130), "float32")])
    np.testing.assert_allclose(op(A, B), A @ B, rtol=1e-4, atol=1e-4)
    cu = op.cuda_source
    assert "__shared__ float polyc_shared_A[32][32]" in cu  # 32 x 64 tiles of C: 2 x 4
    assert "__shared__ float polyc_shared_B[32][64]" in cu  # points per thread
    assert cu.count("__syncthreads()") == 2
    assert "<<<" not in cu.replace("kernel<<<grid, block>>>", "")  # launches via the macro
    report = op.gpu_report
    k = report.kernel("S1")
    assert [name for name, _, _ in k.shared] == ["A", "B"]


@pytest.mark.parametrize("block,tile", [((32, 4), (64, 8)), ((64, 2), (64, 2)), ((128,), None),
                                        ((32, 1), None)])
def test_block_and_tile_options(block, tile):
    # (32, 1) without a register tile: one row per block
    plain = {"gpu_register_tile": False} if block == (32, 1) else {}
    op = polyc.define(CASES["matmul"][0], gpu_block=block, gpu_tile=tile, **plain, **EMULATED)
    A, B = random_inputs([((70, 37), "float32"), ((37, 130), "float32")], 1)
    fwd, rev = run_both_orders(op, [A, B])
    assert_same_bits(fwd, rev)
    np.testing.assert_allclose(fwd[0], A @ B, rtol=1e-4, atol=1e-4)
    threads = int(np.prod(block))
    assert f"__launch_bounds__({threads}, 1)" in op.cuda_source
    if block == (32, 1):  # one row per tile: isl prints no m loop, the thread is a guard
        assert "== polyc_t1" in op.cuda_source


def test_block_option_checked():
    with pytest.raises(polyc.CompileError, match="whole number of warps"):
        polyc.Options(target="cuda", gpu_block=(30, 1))
    with pytest.raises(polyc.CompileError, match="target"):
        polyc.Options(target="opencl")
    op = polyc.define(CASES["matmul"][0], gpu_block=(32, 8), gpu_tile=(48, 8), **EMULATED)
    with pytest.raises(polyc.CompileError, match="multiple of the block"):
        op(*random_inputs([((7, 5), "float32"), ((5, 3), "float32")]))


def test_kernel_without_parallel_loop_runs_on_one_thread():
    op = polyc.define("""
def stats(float(N) X) -> (total, biggest) {
    total +=! X(i)
    biggest max=! X(i)
}""", **EMULATED)
    X, = random_inputs([((130,), "float32")])
    total, biggest = op(X)
    np.testing.assert_allclose(total, X.sum(), rtol=1e-5, atol=1e-5)
    assert biggest == X.max()
    report = op.gpu_report
    assert all(k.block == (1, 1, 1) for k in report.kernels)
    assert "one thread" in str(report)


def test_sizes_with_empty_output():
    src, _, ref = CASES["conv2d_stride1"]
    op = polyc.define(src, **EMULATED)
    I, W = random_inputs([((1, 2, 2, 2), "float32"), ((3, 2, 3, 3), "float32")])
    assert op(I, W).shape == (1, 3, 0, 0)


def _built(op, inputs, text):
    """``text`` (an edited .cu of ``op``) built for the emulation and loaded."""
    c = op.compiled_for(bind_sizes(op.kernel, inputs))
    path = build_cuda(text, c.source.function_name + "_edited", op.options)
    return CudaFunction(c.scheduled.kernel, path, c.source.function_name, c.source, True)


@pytest.mark.emulation_only
def test_missing_barrier_is_caught():
    op = polyc.define(CASES["matmul"][0], **EMULATED)
    A, B = random_inputs([((70, 37), "float32"), ((37, 130), "float32")], 2)
    good = op(A, B)
    for which in (0, 1):  # the barrier after the copy-in, then the one before the next
        parts = op.cuda_source.split("__syncthreads();")
        assert len(parts) == 3
        text = parts[0]
        for i, part in enumerate(parts[1:]):
            text += ("/* barrier removed */" if i == which else "__syncthreads();") + part
        bad = _built(op, [A, B], text)
        fwd = bad([A, B])[0]
        bad.set_thread_order("reverse")
        rev = bad([A, B])[0]
        wrong = not np.allclose(fwd, A @ B, rtol=1e-4, atol=1e-4)
        differs = not np.array_equal(fwd, rev)
        assert wrong or differs, f"removing barrier {which} went unnoticed"
    np.testing.assert_allclose(good, A @ B, rtol=1e-4, atol=1e-4)


@pytest.mark.emulation_only
def test_divergent_barrier_and_host_pointer_are_reported():
    op = polyc.define(CASES["matmul"][0], **EMULATED)
    A, B = random_inputs([((70, 37), "float32"), ((37, 130), "float32")], 2)
    op(A, B)
    text = op.cuda_source
    # only thread 0 reaches the first barrier
    divergent = text.replace("__syncthreads();", "if (polyc_tid == 0) __syncthreads();", 1)
    with pytest.raises(polyc.CallError, match="divergent __syncthreads"):
        _built(op, [A, B], divergent)([A, B])
    # the kernels get the host pointer C instead of the device copy
    m = re.search(r"polyc_status = polyc_launch_all\(.*, (polyc_d\d+)\);", text)
    assert m is not None
    host = text.replace(m.group(0), m.group(0).replace(m.group(1) + ");", "C);"))
    with pytest.raises(polyc.CallError, match="not a device pointer"):
        _built(op, [A, B], host)([A, B])


@pytest.mark.emulation_only
def test_launch_limits_are_checked():
    op = polyc.define(CASES["matmul"][0], **EMULATED)
    A, B = random_inputs([((7, 5), "float32"), ((5, 3), "float32")])
    op(A, B)
    text = op.cuda_source.replace("dim3(32, 8, 1)", "dim3(32, 64, 1)", 1)
    with pytest.raises(polyc.CallError, match="cudaErrorInvalidConfiguration"):
        _built(op, [A, B], text)([A, B])


def _asan_runtime() -> str | None:
    out = subprocess.run(["gcc", "-print-file-name=libasan.so"], capture_output=True, text=True,
                         check=False)
    path = out.stdout.strip()
    return path if out.returncode == 0 and os.path.isabs(path) else None


_CHILD = """
import sys
sys.path.insert(0, {tests!r})
import numpy as np, polyc
from conftest import ON_GPU, random_inputs
from test_e2e_numpy import CASES
from test_cuda_emulation import _built
op = polyc.define(CASES["matmul"][0], target="cuda", emulate=True, sanitize=True)
A, B = random_inputs([((70, 37), "float32"), ((37, 130), "float32")], 4)
C = op(A, B)
np.testing.assert_allclose(C, A @ B, rtol=1e-4, atol=1e-4)
print("clean run ok", flush=True)
edit = {edit!r}
if edit:
    text = op.cuda_source.replace(edit[0], edit[1], 1)
    assert text != op.cuda_source
    _built(op, [A, B], text)([A, B])
    print("injected bug NOT caught", flush=True)
"""


@pytest.mark.skipif(_asan_runtime() is None, reason="gcc has no libasan.so")
@pytest.mark.parametrize("edit,report", [
    (None, None),
    (("C[m * N + n] = 0.0f", "C[m * N + n + 1] = 0.0f"), "heap-buffer-overflow"),
    (("polyc_shared_B[polyc_r0][polyc_r1] =", "polyc_shared_B[polyc_r0][polyc_r1 + 1] ="),
     "out of bounds for type"),
], ids=["clean", "global-off-by-one", "shared-off-by-one"])
@pytest.mark.emulation_only
def test_sanitizers_catch_off_by_one(edit, report):
    env = dict(os.environ, LD_PRELOAD=_asan_runtime(),
               ASAN_OPTIONS="detect_leaks=0:abort_on_error=1",
               UBSAN_OPTIONS="halt_on_error=1:print_stacktrace=1")
    script = _CHILD.format(tests=TESTS, edit=edit)
    done = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True,
                          text=True, timeout=300, check=False)
    out = f"stdout:\n{done.stdout[-3000:]}\nstderr:\n{done.stderr[-5000:]}"
    assert "clean run ok" in done.stdout, out
    if edit is None:
        assert done.returncode == 0, out
    else:
        assert done.returncode != 0 and "NOT caught" not in done.stdout, out
        assert report in done.stderr, out
