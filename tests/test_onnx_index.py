"""OneHot, TopK and ScatterElements (``frontend/onnx_ops_index.py``) against onnxruntime
on sizes and cases the node tests do not use: long rows with ties, the smallest K along
the first axis, duplicate scatter targets combined by a reduction, negative indices."""
from __future__ import annotations

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper

import polyc

ort = pytest.importorskip("onnxruntime")


def _run_both(nodes, inputs, outputs, feeds, inits=()):
    g = helper.make_graph(nodes, "g", [helper.make_tensor_value_info(n, t, s)
                                       for n, t, s in inputs],
                          [helper.make_tensor_value_info(n, t, None) for n, t in outputs],
                          list(inits))
    model = helper.make_model(g, opset_imports=[helper.make_opsetid("", 18)], ir_version=8)
    want = ort.InferenceSession(model.SerializeToString(),
                                providers=["CPUExecutionProvider"]).run(None, feeds)
    got = polyc.compile_onnx(model).run(None, feeds)
    return got, want


@pytest.mark.parametrize("largest,axis", [(1, -1), (0, 0)])
def test_topk_with_ties(largest, axis):
    x = np.random.default_rng(1).integers(0, 9, (5, 37)).astype(np.float32)  # many ties
    k = np.array([4], np.int64)
    node = helper.make_node("TopK", ["x", "k"], ["v", "i"], axis=axis, largest=largest)
    got, want = _run_both([node], [("x", TensorProto.FLOAT, [5, 37])],
                          [("v", TensorProto.FLOAT), ("i", TensorProto.INT64)], {"x": x},
                          [numpy_helper.from_array(k, "k")])
    for g, w in zip(got, want):
        np.testing.assert_array_equal(g, w)


@pytest.mark.parametrize("reduction", ["add", "mul", "max", "min"])
def test_scatter_elements_reduces_duplicate_targets(reduction):
    rng = np.random.default_rng(2)
    data = rng.standard_normal((6, 9)).astype(np.float32)
    ind = rng.integers(-6, 6, (4, 9)).astype(np.int64)   # duplicates and negatives
    upd = rng.standard_normal((4, 9)).astype(np.float32)
    node = helper.make_node("ScatterElements", ["d", "i", "u"], ["y"], axis=0,
                            reduction=reduction)
    got, want = _run_both([node], [("d", TensorProto.FLOAT, [6, 9]),
                                   ("i", TensorProto.INT64, [4, 9]),
                                   ("u", TensorProto.FLOAT, [4, 9])],
                          [("y", TensorProto.FLOAT)], {"d": data, "i": ind, "u": upd})
    np.testing.assert_allclose(got[0], want[0], rtol=1e-6, atol=1e-6)


def test_one_hot_negative_indices_and_axis():
    ind = np.array([[0, -1, 3], [2, -4, 1]], np.int64)
    node = helper.make_node("OneHot", ["i", "depth", "vals"], ["y"], axis=1)
    inits = [numpy_helper.from_array(np.array(4, np.int64), "depth"),
             numpy_helper.from_array(np.array([-2.0, 5.0], np.float32), "vals")]
    got, want = _run_both([node], [("i", TensorProto.INT64, [2, 3])],
                          [("y", TensorProto.FLOAT)], {"i": ind}, inits)
    np.testing.assert_array_equal(got[0], want[0])
