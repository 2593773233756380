"""This session's new ONNX ops on both targets (C, and CUDA through the emulation)
against onnxruntime (onnx's reference where onnxruntime has no kernel), one small model
per op, on sizes that are not multiples of any tile or block."""
from __future__ import annotations

import numpy as np
import pytest
from onnx import TensorProto as T
from onnx import helper, numpy_helper

import polyc

ort = pytest.importorskip("onnxruntime")
F, I64, U8, I8, H = T.FLOAT, T.INT64, T.UINT8, T.INT8, T.FLOAT16


def _case(name):
    rng = np.random.default_rng(len(name))
    if name == "attention":
        nodes = [helper.make_node("Attention", ["q", "k", "v"], ["y"], is_causal=1)]
        ins = [("q", F, [2, 3, 5, 8]), ("k", F, [2, 3, 7, 8]), ("v", F, [2, 3, 7, 6])]
        return nodes, ins, [], 23
    if name == "gru":
        nodes = [helper.make_node("GRU", ["x", "w", "r"], ["y", "yh"], hidden_size=5,
                                  direction="bidirectional")]
        ins = [("x", F, [4, 3, 6]), ("w", F, [2, 15, 6]), ("r", F, [2, 15, 5])]
        return nodes, ins, [], 14
    if name == "lstm":
        nodes = [helper.make_node("LSTM", ["x", "w", "r"], ["y", "yh", "yc"], hidden_size=7)]
        ins = [("x", F, [5, 2, 3]), ("w", F, [1, 28, 3]), ("r", F, [1, 28, 7])]
        return nodes, ins, [], 14
    if name == "qlinear_matmul":
        nodes = [helper.make_node("QLinearMatMul", ["a", "sa", "za", "b", "sb", "zb", "sy",
                                                    "zy"], ["y"])]
        ins = [("a", U8, [5, 37]), ("b", U8, [37, 11])]
        inits = [numpy_helper.from_array(np.array(v, dt), n) for n, v, dt in (
            ("sa", 0.02, np.float32), ("za", 120, np.uint8), ("sb", 0.01, np.float32),
            ("zb", 130, np.uint8), ("sy", 0.3, np.float32), ("zy", 100, np.uint8))]
        return nodes, ins, inits, 13
    if name == "quantize":
        nodes = [helper.make_node("QuantizeLinear", ["x", "s", "z"], ["q"], axis=1),
                 helper.make_node("DequantizeLinear", ["q", "s", "z"], ["y"], axis=1)]
        ins = [("x", F, [3, 5, 7])]
        inits = [numpy_helper.from_array(rng.uniform(0.01, 0.1, 5).astype(np.float32), "s"),
                 numpy_helper.from_array(rng.integers(-5, 5, 5).astype(np.int8), "z")]
        return nodes, ins, inits, 19
    if name == "gridsample":
        nodes = [helper.make_node("GridSample", ["x", "g"], ["y"], mode="cubic",
                                  padding_mode="reflection")]
        return nodes, [("x", F, [1, 2, 5, 7]), ("g", F, [1, 3, 6, 2])], [], 20
    if name == "topk_scatter_onehot":
        k = numpy_helper.from_array(np.array([3], np.int64), "k")
        depth = numpy_helper.from_array(np.array(5, np.int64), "depth")
        vals = numpy_helper.from_array(np.array([0.0, 2.0], np.float32), "vals")
        nodes = [helper.make_node("TopK", ["x", "k"], ["tv", "ti"]),
                 helper.make_node("ScatterND", ["x", "ind", "u"], ["sn"], reduction="add"),
                 helper.make_node("OneHot", ["oi", "depth", "vals"], ["oh"])]
        ins = [("x", F, [4, 9]), ("ind", I64, [3, 1]), ("u", F, [3, 9]), ("oi", I64, [6])]
        return nodes, ins, [k, depth, vals], 18
    if name == "resize_cubic_dft":
        sc = numpy_helper.from_array(np.array([1, 1, 1.7, 0.6], np.float32), "sc")
        nodes = [helper.make_node("Resize", ["x", "", "sc"], ["rs"], mode="cubic"),
                 helper.make_node("DFT", ["s"], ["df"], axis=1)]
        return nodes, [("x", F, [1, 2, 5, 9]), ("s", F, [2, 7, 1])], [sc], 19
    if name == "half_and_int8":
        nodes = [helper.make_node("Mul", ["h", "h2"], ["hm"]),
                 helper.make_node("Add", ["hm", "h"], ["ha"]),
                 helper.make_node("Add", ["i", "i2"], ["ia"])]
        ins = [("h", H, [3, 37]), ("h2", H, [3, 37]), ("i", I8, [3, 37]), ("i2", I8, [3, 37])]
        return nodes, ins, [], 17
    raise KeyError(name)


CASES = ["attention", "gru", "lstm", "qlinear_matmul", "quantize", "gridsample",
         "topk_scatter_onehot", "resize_cubic_dft", "half_and_int8"]


def _feeds(ins, seed):
    rng = np.random.default_rng(seed)
    out = {}
    for name, t, shape in ins:
        dt = helper.tensor_dtype_to_np_dtype(t)
        if name in ("ind",):
            out[name] = rng.integers(-4, 4, shape).astype(dt)
        elif name == "oi":
            out[name] = rng.integers(-5, 5, shape).astype(dt)
        elif name == "g":
            out[name] = rng.uniform(-1.3, 1.3, shape).astype(dt)
        elif np.dtype(dt).kind in "iu":
            info = np.iinfo(dt)
            out[name] = rng.integers(info.min, info.max, shape, endpoint=True).astype(dt)
        else:
            out[name] = (rng.standard_normal(shape) * 0.7).astype(dt)
    return out


@pytest.mark.parametrize("target", ["c", "cuda"])
@pytest.mark.parametrize("name", CASES)
def test_new_ops_match_onnxruntime(name, target):
    nodes, ins, inits, opset = _case(name)
    outs = [o for n in nodes for o in n.output]
    g = helper.make_graph(nodes, name, [helper.make_tensor_value_info(n, t, s)
                                        for n, t, s in ins],
                          [helper.make_tensor_value_info(o, T.UNDEFINED, None) for o in outs],
                          inits)
    model = helper.make_model(g, opset_imports=[helper.make_opsetid("", opset)],
                              ir_version=10 if opset >= 21 else 8)
    feeds = _feeds(ins, 3)
    try:
        want = ort.InferenceSession(model.SerializeToString(),
                                    providers=["CPUExecutionProvider"]).run(None, feeds)
    except Exception:  # no onnxruntime kernel for this op/type: onnx's reference
        from onnx.reference import ReferenceEvaluator
        want = ReferenceEvaluator(model).run(None, feeds)
    kw = dict(target="cuda", emulate=True) if target == "cuda" else {}
    got = polyc.compile_onnx(model, **kw).run(None, feeds)
    for o, g_, w in zip(outs, got, want):
        w = np.asarray(w)
        assert g_.dtype == w.dtype, o
        if w.dtype.kind == "f":
            tol = 2e-3 if w.dtype == np.float16 else 1e-4
            np.testing.assert_allclose(g_.astype(np.float64), w.astype(np.float64), rtol=tol,
                                       atol=tol * max(1.0, float(np.abs(w).max())),
                                       err_msg=o)
        elif name == "qlinear_matmul":  # onnxruntime's requantisation: within a quantum
            assert np.abs(g_.astype(np.int64) - w.astype(np.int64)).max() <= 1
        else:
            np.testing.assert_array_equal(g_, w, err_msg=o)
