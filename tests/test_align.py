"""Sibling nests fused along the loops their dependences keep aligned
(:mod:`polyc.schedule.align`): a two-pass transform against numpy under every scheduler
and fusion mode, at sizes that are no multiples of the tiles; the fused band where the
passes meet at distance zero, none where a read is shifted; and the Winograd input
transform of a convolution running its tiles in parallel."""
from __future__ import annotations

import re

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

import polyc
from codegen_helpers import fused_bands
from polyc.schedule import align

#: two 1-D passes, each a statement per row of its matrix (as Winograd's transforms):
#: W's rows b from D's rows i, then V's rows a from W's rows; every read of W by V is
#: at the same (t, c) as its write
TWO_PASS = """
def twopass(float(R, T, C) D) -> (V) {
    W(b, i, t, c) = 0.0 where b in 0:2, i in 0:3, t in 0:T, c in 0:C
    V(a, b, t, c) = 0.0 where a in 0:2, b in 0:2, t in 0:T, c in 0:C
    W(b, i, t, c) = D(i, t, c) + D(i + 1, t, c) where b in 0:1, i in 0:3, t in 0:T, c in 0:C
    W(b, i, t, c) = D(i, t, c) - 2 * D(i + 1, t, c) where b in 1:2, i in 0:3, t in 0:T, c in 0:C
    V(a, b, t, c) = W(b, 0, t, c) + W(b, 1, t, c) + W(b, 2, t, c) SHIFT OVER(0:1)
    V(a, b, t, c) = W(b, 0, t, c) - W(b, 2, t, c) OVER(1:2)
}"""


def _source(shifted: bool) -> str:
    """The two passes; ``shifted``: the first row of V also reads W at ``t + 1``."""
    rows = "T - 1" if shifted else "T"
    over = re.sub(r"OVER\((\d:\d)\)", rf"where a in \1, b in 0:2, t in 0:{rows}, c in 0:C",
                  TWO_PASS)
    return over.replace("SHIFT", "+ W(b, 1, t + 1, c)" if shifted else "")


def _reference(D: np.ndarray, shifted: bool) -> np.ndarray:
    D = D.astype(np.float64)
    W = np.stack([D[:3] + D[1:4], D[:3] - 2 * D[1:4]])  # (b, i, t, c)
    V = np.zeros((2, 2) + D.shape[1:])
    V[0] = W[:, 0] + W[:, 1] + W[:, 2]
    V[1] = W[:, 0] - W[:, 2]
    if shifted:
        V[0, :, :-1] += W[:, 1, 1:]
        V[:, :, -1] = 0.0
    return V


@pytest.mark.parametrize("scheduler", ["isl", "pluto"])
@pytest.mark.parametrize("fusion", ["smart", "max", "min"])
@pytest.mark.parametrize("shifted", [False, True])
def test_two_pass_transform_is_correct(scheduler, fusion, shifted):
    D = np.random.default_rng(5).standard_normal((4, 37, 45)).astype(np.float32)
    want = _reference(D, shifted)
    for threads in (1, 2):
        op = polyc.define(_source(shifted), options=polyc.Options(
            threads=threads, scheduler=scheduler, fusion=fusion))
        got = op(D)
        if shifted:
            got = np.array(got)
            got[:, :, -1] = 0.0  # (rows V does not write)
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)


def test_passes_fuse_where_aligned_and_only_there(monkeypatch):
    sizes = {"R": 4, "T": 37, "C": 45}
    D = np.random.default_rng(6).standard_normal((4, 37, 45)).astype(np.float32)

    def fused(shifted: bool) -> list[int]:
        op = polyc.define(_source(shifted), options=polyc.Options(threads=1))
        op(D)
        return fused_bands(op.compiled_for(sizes).schedule)

    assert 4 in fused(False), "the four nests run per (t) in one band"
    assert not fused(True), "a read one t ahead aligns no loop: the nests stay apart"
    monkeypatch.setattr(align, "FUSE_ALIGNED", False)
    assert not fused(False)


def _conv(c: int, hw: int) -> onnx.ModelProto:
    rng = np.random.default_rng(0)
    w = (rng.standard_normal((c, c, 3, 3)) / np.sqrt(9 * c)).astype(np.float32)
    g = helper.make_graph(
        [helper.make_node("Conv", ["x", "w"], ["y"], pads=[1] * 4, kernel_shape=[3, 3])],
        "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, c, hw, hw])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, c, hw, hw])],
        [numpy_helper.from_array(w, "w")])
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])


def test_winograd_input_transform_runs_its_tiles_in_parallel(tmp_path):
    """The twelve 1-D passes of a 56x56 layer's input transform fuse into one nest over
    the tiles, which two threads share (apart, each pass was under the work of a
    parallel loop and they all ran on one thread)."""
    model = _conv(32, 54)
    m = polyc.compile_onnx(model, options=polyc.Options(threads=2, winograd=4))
    x = np.random.default_rng(1).standard_normal((1, 32, 54, 54)).astype(np.float32)
    import onnxruntime as ort
    want = ort.InferenceSession(model.SerializeToString(),
                                providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]
    got = m(x)
    got = got[0] if isinstance(got, (list, tuple)) else got
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4 * np.abs(want).max())
    src = open(m.library_path[:-3] + ".c").read()
    body = re.search(r"static int \w+_wino_in\(.*?\n}\n", src, re.S)
    assert body is not None
    assert "#pragma omp parallel" in body.group(0)
