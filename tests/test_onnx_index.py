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


CUDA = {"target": "cuda", "emulate": True}


@pytest.mark.parametrize("dtype,target", [
    (np.float32, {}), (np.float16, {}), (np.int32, {}), (np.uint8, {}), (np.int64, {}),
    (np.float64, {}), (np.float32, CUDA), (np.float64, CUDA)], ids=str)
@pytest.mark.parametrize("largest", [1, 0])
def test_topk_dtypes_nan_and_every_k(dtype, target, largest):
    """K of 1, 4 and the row (a full sort) along a middle axis, on the dtypes with
    a 32-bit sort key (selected one after another) and the 64-bit ones (ranked), with
    ties, -0.0 beside 0.0, infinities and NaN (the highest value, as onnx's reference
    sorts: first for the largest, last for the smallest), against onnx's reference; both
    paths on CUDA (emulated) too."""
    from onnx.reference import ReferenceEvaluator
    rng = np.random.default_rng(3)
    x = rng.integers(0, 6, (3, 11, 2)).astype(dtype)  # ties
    if np.issubdtype(dtype, np.floating):
        x[0, [1, 5], 0] = np.nan
        x[1, 2, 1], x[1, 7, 1] = -0.0, 0.0
        x[2, 3, 0], x[2, 9, 0] = np.inf, -np.inf
    types = {np.float32: TensorProto.FLOAT, np.float16: TensorProto.FLOAT16,
             np.int32: TensorProto.INT32, np.uint8: TensorProto.UINT8,
             np.int64: TensorProto.INT64, np.float64: TensorProto.DOUBLE}
    for k in (1, 4, 11):
        node = helper.make_node("TopK", ["x", "k"], ["v", "i"], axis=1, largest=largest)
        g = helper.make_graph([node], "g", [helper.make_tensor_value_info("x", types[dtype],
                                                                          [3, 11, 2])],
                              [helper.make_tensor_value_info("v", types[dtype], None),
                               helper.make_tensor_value_info("i", TensorProto.INT64, None)],
                              [numpy_helper.from_array(np.array([k], np.int64), "k")])
        model = helper.make_model(g, opset_imports=[helper.make_opsetid("", 18)],
                                  ir_version=8)
        want = ReferenceEvaluator(model).run(None, {"x": x})
        got = polyc.compile_onnx(model, **target).run(None, {"x": x})
        np.testing.assert_array_equal(got[1], want[1], err_msg=f"k={k}")
        np.testing.assert_array_equal(got[0], want[0], err_msg=f"k={k}")


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
