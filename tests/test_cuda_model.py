"""ONNX models on the CUDA target: one library per model (:mod:`polyc.codegen.cuda_model`),
run through the CPU emulation against onnxruntime (small inputs), the same ``.cu`` built
by nvcc (``-Werror all-warnings``, no spills, at most 48 KiB shared memory, blocks equal
to their launch bounds), the Gather index checks, device pointers and the no-device
error."""
from __future__ import annotations

import ctypes
import os
import re
import shutil

import numpy as np
import pytest

from conftest import ON_GPU

import polyc
from polyc import model as pm
from polyc.codegen.nvcc import build_cuda, parse_ptxas
from polyc.codegen.runtime import load_library
from polyc.errors import CallError, RunError

ort = pytest.importorskip("onnxruntime")
onnx = pytest.importorskip("onnx")

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
MODELS = ["mlp", "small_cnn", "transformer_layer"]
NVCC = shutil.which(polyc.Options().nvcc)
needs_nvcc = pytest.mark.skipif(NVCC is None, reason="nvcc not found (POLYC_NVCC)")


def _path(name: str) -> str:
    return os.path.join(ROOT, "examples", f"{name}.onnx")


def _feeds(path_or_bytes, seed: int = 0) -> dict[str, np.ndarray]:
    sess = ort.InferenceSession(path_or_bytes, providers=["CPUExecutionProvider"])
    rng = np.random.default_rng(seed)
    return {i.name: rng.standard_normal([d if isinstance(d, int) else 1 for d in i.shape])
            .astype(np.float32) for i in sess.get_inputs()}


def _set_order(m, order: int) -> None:
    if ON_GPU:  # the device's own order (POLYC_TEST_ON_GPU)
        return
    fn = load_library(m._library.path).polyc_emu_set_order
    fn.argtypes, fn.restype = [ctypes.c_int], None
    fn(order)


@pytest.mark.parametrize("name", MODELS)
def test_emulated_model_matches_onnxruntime_in_both_orders(name):
    path = _path(name)
    m = polyc.compile_onnx(path, target="cuda", emulate=True)
    assert "__global__" in m.c_source and f"{m.name}_run_device" in m.header
    feeds = _feeds(path)
    ref = ort.InferenceSession(path, providers=["CPUExecutionProvider"]).run(None, feeds)
    try:
        _set_order(m, 0)
        forward = m.run(None, feeds)
        _set_order(m, 1)
        reverse = m.run(None, feeds)
    finally:
        _set_order(m, -1)
    for a, b, r in zip(forward, reverse, ref):
        np.testing.assert_allclose(a, r, rtol=1e-4, atol=1e-4)
        assert a.tobytes() == b.tobytes(), "thread order changed the bits: a race"
    assert m.run(None, feeds)[0].tobytes() == forward[0].tobytes()  # weights stay uploaded


def test_files_and_arena(tmp_path):
    m = polyc.compile_onnx(_path("small_cnn"), target="cuda", emulate=True,
                           output_dir=str(tmp_path))
    for ext in (".so", ".h", ".cu", ".weights"):
        assert os.path.exists(os.path.join(tmp_path, "small_cnn" + ext))
    cu = m.c_source
    assert re.search(r"cudaMalloc\(\(void \*\*\)&polyc_arena, \d+u\)", cu)
    assert cu.count("cudaMemcpyHostToDevice") >= 2  # the weights once, the input per run
    # the arena is the C target's plan of the same program (plus the operators'
    # temporaries): the C target's without Winograd, which only it runs
    direct = polyc.Options(winograd=False)
    c = pm.model_source(pm.lower_onnx(_path("small_cnn"), options=direct), direct,
                        name="small_cnn")
    assert m.source.plan.arena_bytes == c.plan.arena_bytes


def _gather_model() -> bytes:
    from onnx import TensorProto, helper, numpy_helper
    table = np.arange(24, dtype=np.float32).reshape(6, 4)
    g = helper.make_graph(
        [helper.make_node("Gather", ["table", "idx"], ["g"], axis=0, name="lookup"),
         helper.make_node("Relu", ["g"], ["y"])], "gather",
        [helper.make_tensor_value_info("idx", TensorProto.INT64, [3])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [3, 4])],
        [numpy_helper.from_array(table, "table")])
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 13)]).SerializeToString()


def test_gather_index_checks():
    data = _gather_model()
    m = polyc.compile_onnx(data, target="cuda", emulate=True, name="gather")
    assert m.program.checks, "the Gather's indices should be checked at run time"
    sess = ort.InferenceSession(data, providers=["CPUExecutionProvider"])
    idx = np.array([5, -1, 0], dtype=np.int64)
    np.testing.assert_array_equal(m.run(None, {"idx": idx})[0],
                                  sess.run(None, {"idx": idx})[0])
    with pytest.raises(RunError, match=r"lookup.*Gather.*index 6 at \[1\]"):
        m.run(None, {"idx": np.array([0, 6, 1], dtype=np.int64)})
    # the model still runs after a refused input
    np.testing.assert_array_equal(m.run(None, {"idx": idx})[0],
                                  sess.run(None, {"idx": idx})[0])


@pytest.mark.emulation_only
def test_run_device_refuses_host_pointers():
    """``<m>_run_device`` takes device pointers; the emulation reports host ones."""
    m = polyc.compile_onnx(_path("mlp"), target="cuda", emulate=True)
    lib = load_library(m._library.path)
    fn = getattr(lib, f"{m.name}_run_device")
    fn.argtypes, fn.restype = [ctypes.c_void_p] * 3, ctypes.c_int
    x = _feeds(_path("mlp"))["x"]
    y = np.zeros((4, 10), np.float32)
    status = fn(m._library._handle, x.ctypes.data, y.ctypes.data)
    assert status == 3
    message = getattr(lib, f"{m.name}_last_error")
    message.restype = ctypes.c_char_p
    assert b"launch of polyc_k" in message() and b"device pointer" in message()


@needs_nvcc
@pytest.mark.parametrize("name", MODELS)
def test_nvcc_builds_model_clean_and_fits(name):
    options = polyc.Options(target="cuda", nvcc_flags=("-Werror", "all-warnings"))
    source = pm.model_source(pm.lower_onnx(_path(name)), options, name=name)
    library = build_cuda(source.text, source.name, options)
    with open(library[:-3] + ".ptxas.txt") as f:
        info = parse_ptxas(f.read())
    bounds = {k: int(b) for b, k in re.findall(
        r"__launch_bounds__\((\d+), 1\) (polyc_k\d+_\d+)\(", source.text)}
    launched = {k: int(x) * int(y) * int(z) for k, x, y, z in re.findall(
        r"POLYC_LAUNCH\((polyc_k\d+_\d+), dim3\([^;]*?\), dim3\((\d+), (\d+), (\d+)\)",
        source.text)}
    assert set(bounds) == set(info) and set(launched) <= set(bounds)
    for k, threads in launched.items():
        assert threads == bounds[k], k
    for k, p in info.items():
        assert not p.spills, (k, p)
        assert p.shared_bytes <= 48 * 1024, (k, p)


@needs_nvcc
def test_without_a_device_init_says_why():
    """nvcc's library: without a usable GPU, init fails with the CUDA runtime's error
    (with one, the model runs and matches onnxruntime)."""
    path = _path("mlp")
    try:
        m = polyc.compile_onnx(path, target="cuda")
    except CallError as err:
        assert "no usable CUDA device: cudaGetDeviceCount returned" in str(err)
        return
    feeds = _feeds(path)
    ref = ort.InferenceSession(path, providers=["CPUExecutionProvider"]).run(None, feeds)
    np.testing.assert_allclose(m.run(None, feeds)[0], ref[0], rtol=1e-4, atol=1e-4)


def test_command_line_model(tmp_path):
    from polyc.cli import main
    out = str(tmp_path)
    assert main(["compile", _path("mlp"), "--target", "cuda", "--emulate", "-q", "-o", out]) == 0
    assert sorted(os.listdir(out)) == ["mlp.cu", "mlp.h", "mlp.so", "mlp.weights"]


@needs_nvcc
def test_command_line_model_with_nvcc(tmp_path):
    """``polyc compile model.onnx --target cuda`` writes the files without a GPU."""
    from polyc.cli import main
    out = str(tmp_path)
    assert main(["compile", _path("mlp"), "--target", "cuda", "-q", "-o", out]) == 0
    assert sorted(os.listdir(out)) == ["mlp.cu", "mlp.h", "mlp.so", "mlp.weights"]


LIGHT = [pytest.param("squeezenet"),
         *(pytest.param(n, marks=pytest.mark.slow)
           for n in ("shufflenet", "resnet50", "inception_v1", "densenet121"))]


@pytest.mark.parametrize("name", LIGHT)
def test_light_model_emulated(name):
    """onnx's light zoo models (224x224, seeded random weights) through the emulation."""
    import sys
    sys.path.insert(0, os.path.join(ROOT, "examples"))
    import onnx_models as om
    model = om.randomized_light_model(name)
    m = polyc.compile_onnx(model, target="cuda", emulate=True, name=name)
    feeds = om.input_feeds(model)
    for ours, ref in zip(m.run(None, feeds), om.onnxruntime_outputs(model, feeds)):
        scale = float(np.abs(ref).max()) or 1.0
        np.testing.assert_allclose(ours / scale, ref / scale, rtol=0, atol=1e-5)


@needs_nvcc
def test_whole_model_gpu_report():
    """Every distinct operator of a model in one report: mapping, shared memory, register
    tiles, coalescing of every global access, ptxas figures, occupancy."""
    m = polyc.compile_onnx(_path("small_cnn"), target="cuda", emulate=True)
    report = m.gpu_report
    assert len(report.operators) == m.source.functions
    assert sum(report.steps) == len(m.program.steps)
    kernels = report.kernels
    assert kernels and all(k.ptxas is not None and not k.ptxas.spills for k in kernels)
    assert all(k.occupancy is not None and k.occupancy.fraction > 0 for k in kernels)
    assert all(a.coalescing for k in kernels for a in k.accesses)
    text = str(report)
    arch = polyc.Options(target="cuda").gpu_arch
    assert text.startswith(f"GPU report: model {m.name} for {arch}")
    assert "global accesses coalesced or broadcast" in text and "occupancy: lowest" in text
    assert text.count("\noperator ") == len(report.operators)
    with pytest.raises(polyc.CompileError, match="C target"):
        _ = polyc.compile_onnx(_path("mlp")).gpu_report


def test_new_ops_on_the_cuda_target():
    """GatherElements, GatherND, LpPool, Range and the two losses, through the emulation,
    against onnxruntime on odd sizes; a target outside the classes is refused at the run
    (the check runs on the device's buffer)."""
    from onnx import TensorProto, helper, numpy_helper
    F, I64 = TensorProto.FLOAT, TensorProto.INT64
    nodes = [helper.make_node("GatherElements", ["x", "ie"], ["ge"], axis=1),
             helper.make_node("GatherND", ["x", "ind"], ["gn"]),
             helper.make_node("LpPool", ["img"], ["lp"], kernel_shape=[3, 2], p=2,
                              pads=[1, 0, 1, 1]),
             helper.make_node("Range", ["r0", "r1", "r2"], ["rg"]),
             helper.make_node("NegativeLogLikelihoodLoss", ["x", "t"], ["nll"],
                              reduction="mean", ignore_index=-1, name="nll"),
             helper.make_node("SoftmaxCrossEntropyLoss", ["x", "t"], ["sce"],
                              reduction="sum", ignore_index=-1)]
    g = helper.make_graph(nodes, "newops", [
        helper.make_tensor_value_info("x", F, [5, 7]),
        helper.make_tensor_value_info("ie", I64, [5, 3]),
        helper.make_tensor_value_info("ind", I64, [2, 1]),
        helper.make_tensor_value_info("img", F, [1, 3, 7, 5]),
        helper.make_tensor_value_info("t", I64, [5])],
        [helper.make_tensor_value_info(n, F, None) for n in ("ge", "gn", "lp", "nll", "sce")]
        + [helper.make_tensor_value_info("rg", I64, [4])],
        [numpy_helper.from_array(np.array(v, np.int64), n)
         for n, v in (("r0", 3), ("r1", 14), ("r2", 3))])
    data = helper.make_model(g, opset_imports=[helper.make_opsetid("", 18)],
                             ir_version=8).SerializeToString()
    m = polyc.compile_onnx(data, target="cuda", emulate=True, name="newops")
    rng = np.random.default_rng(5)
    t = np.array([0, -1, 6, 3, 2], np.int64)
    feed = {"x": rng.standard_normal((5, 7)).astype(np.float32),
            "ie": rng.integers(-7, 7, (5, 3)).astype(np.int64),
            "ind": np.array([[4], [-2]], np.int64),
            "img": rng.standard_normal((1, 3, 7, 5)).astype(np.float32),
            "t": t}
    want = ort.InferenceSession(data, providers=["CPUExecutionProvider"]).run(
        ["ge", "gn", "lp", "nll", "sce", "rg"], feed)
    got = m.run(["ge", "gn", "lp", "nll", "sce", "rg"], feed)
    for g_, w in zip(got, want):
        np.testing.assert_allclose(g_, w, rtol=1e-5, atol=1e-5)
    with pytest.raises(RunError, match=r"nll.*target 7 at \[2\]"):
        m.run(None, dict(feed, t=np.array([0, -1, 7, 3, 2], np.int64)))
