"""DepthToSpace, ReverseSequence, TensorScatter, Scatter, GroupNormalization, and ONNX
functions expanded at import (ops defined as functions -- HannWindow,
MeanVarianceNormalization, SwiGLU -- and a model's local functions), against
onnxruntime or onnx's reference, on odd sizes, on the C target and the CUDA emulation."""
from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto as T
from onnx import helper, numpy_helper
from onnx.reference import ReferenceEvaluator

import polyc

ort = pytest.importorskip("onnxruntime")
F, I64 = T.FLOAT, T.INT64
TARGETS = [pytest.param({}, id="c"),
           pytest.param({"target": "cuda", "emulate": True}, id="cuda-emulated")]


def _model(nodes, ins, outs, inits=(), opset=17, functions=()):
    graph = helper.make_graph(nodes, "more", [helper.make_tensor_value_info(n, t, s)
                                              for n, t, s in ins],
                              [helper.make_tensor_value_info(n, t, None) for n, t in outs],
                              list(inits))
    imports = [helper.make_opsetid("", opset)]
    if functions:
        imports.append(helper.make_opsetid("local", 1))
    return helper.make_model(graph, opset_imports=imports, ir_version=10,
                             functions=list(functions))


def _check(model, feed, target=None, use_ort=True, rtol=1e-5, atol=1e-6):
    if use_ort:
        sess = ort.InferenceSession(model.SerializeToString(),
                                    providers=["CPUExecutionProvider"])
        want = sess.run(None, feed)
    else:
        want = ReferenceEvaluator(model).run(None, feed)
    got = polyc.compile_onnx(model, **(target or {})).run(None, feed)
    for g, w in zip(got, want):
        assert g.shape == w.shape and g.dtype == w.dtype, (g.shape, w.shape, g.dtype, w.dtype)
        np.testing.assert_allclose(g, w, rtol=rtol, atol=atol)


RNG = np.random.default_rng(11)


@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize("mode", ["DCR", "CRD"])
def test_depth_to_space(mode, target):
    model = _model([helper.make_node("DepthToSpace", ["x"], ["y"], blocksize=3, mode=mode)],
                   [("x", F, [2, 18, 3, 5])], [("y", F)])
    _check(model, {"x": RNG.standard_normal((2, 18, 3, 5)).astype(np.float32)}, target)


@pytest.mark.parametrize("time_axis", [0, 1])
@pytest.mark.parametrize("target", TARGETS)
def test_reverse_sequence(time_axis, target):
    shape = [7, 4, 3] if time_axis == 0 else [4, 7, 3]
    model = _model([helper.make_node("ReverseSequence", ["x", "lens"], ["y"],
                                     time_axis=time_axis, batch_axis=1 - time_axis)],
                   [("x", F, shape), ("lens", I64, [4])], [("y", F)])
    _check(model, {"x": RNG.standard_normal(shape).astype(np.float32),
                   "lens": np.array([7, 1, 4, 6], np.int64)}, target)


@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize("mode", ["linear", "circular"])
def test_tensor_scatter(mode, target):
    """A KV cache of 9 positions, 3 new ones written per batch at its own index."""
    model = _model([helper.make_node("TensorScatter", ["past", "new", "at"], ["present"],
                                     mode=mode)],
                   [("past", F, [2, 3, 9, 4]), ("new", F, [2, 3, 3, 4]), ("at", I64, [2])],
                   [("present", F)], opset=24)
    at = np.array([2, 7] if mode == "circular" else [0, 5], np.int64)
    _check(model, {"past": RNG.standard_normal((2, 3, 9, 4)).astype(np.float32),
                   "new": RNG.standard_normal((2, 3, 3, 4)).astype(np.float32), "at": at},
           target, use_ort=False)


@pytest.mark.parametrize("target", TARGETS)
def test_scatter_opset10(target):
    model = _model([helper.make_node("Scatter", ["x", "i", "u"], ["y"], axis=1)],
                   [("x", F, [3, 5]), ("i", I64, [3, 2]), ("u", F, [3, 2])], [("y", F)],
                   opset=10)
    _check(model, {"x": RNG.standard_normal((3, 5)).astype(np.float32),
                   "i": np.array([[0, 4], [2, 1], [3, 3]], np.int64),
                   "u": RNG.standard_normal((3, 2)).astype(np.float32)}, target)


@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize("groups", [3, 1])
def test_group_normalization(groups, target):
    c, g, opset = 6, groups, 21
    pc = c
    inits = [numpy_helper.from_array(RNG.standard_normal(pc).astype(np.float32), "s"),
             numpy_helper.from_array(RNG.standard_normal(pc).astype(np.float32), "b")]
    model = _model([helper.make_node("GroupNormalization", ["x", "s", "b"], ["y"],
                                     num_groups=g, epsilon=1e-3)],
                   [("x", F, [2, c, 5, 3])], [("y", F)], inits, opset=opset)
    _check(model, {"x": RNG.standard_normal((2, c, 5, 3)).astype(np.float32)}, target,
           use_ort=False, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("target", TARGETS)
def test_function_ops_are_expanded(target):
    """HannWindow, MeanVarianceNormalization and SwiGLU have no lowering of their own:
    ONNX defines them as functions of other ops, and their bodies compile."""
    size = numpy_helper.from_array(np.array(10, np.int64), "n")
    nodes = [helper.make_node("HannWindow", ["n"], ["w"], periodic=0),
             helper.make_node("MeanVarianceNormalization", ["x"], ["m"], axes=[0, 2]),
             helper.make_node("SwiGLU", ["x", "x2"], ["s"], alpha=1.5)]
    model = _model(nodes, [("x", F, [3, 4, 5]), ("x2", F, [3, 4, 5])],
                   [("w", F), ("m", F), ("s", F)], [size], opset=28)
    _check(model, {"x": RNG.standard_normal((3, 4, 5)).astype(np.float32),
                   "x2": RNG.standard_normal((3, 4, 5)).astype(np.float32)},
           target, use_ort=False, rtol=1e-4, atol=1e-5)


def test_local_functions_are_inlined():
    """A model calling its own function (as exporters write a module once)."""
    fn = helper.make_function("local", "ScaledGelu", ["a"], ["b"],
                              [helper.make_node("Mul", ["a", "a"], ["sq"]),
                               helper.make_node("Add", ["a", "sq"], ["b"])],
                              [helper.make_opsetid("", 17)])
    nodes = [helper.make_node("ScaledGelu", ["x"], ["h"], domain="local"),
             helper.make_node("ScaledGelu", ["h"], ["y"], domain="local")]
    model = _model(nodes, [("x", F, [4, 7])], [("y", F)], functions=[fn])
    model.graph.output[0].type.tensor_type.shape.dim.add().dim_value = 4
    model.graph.output[0].type.tensor_type.shape.dim.add().dim_value = 7
    onnx.checker.check_model(model)
    _check(model, {"x": RNG.standard_normal((4, 7)).astype(np.float32)})


@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize("mode,transform", [("avg", "half_pixel"),
                                            ("avg", "output_half_pixel"),
                                            ("max", "output_half_pixel")])
def test_roi_align(mode, transform, target):
    """Regions inside, across the border and outside the feature map."""
    rois = np.array([[0.5, 1.0, 6.0, 5.5], [-3.0, -2.0, 4.0, 3.0], [2.0, 2.0, 2.5, 2.2],
                     [5.0, 4.0, 12.0, 9.0], [10.0, 10.0, 14.0, 13.0]], np.float32)
    model = _model([helper.make_node("RoiAlign", ["x", "rois", "b"], ["y"], mode=mode,
                                     coordinate_transformation_mode=transform,
                                     output_height=3, output_width=4, sampling_ratio=2,
                                     spatial_scale=0.9)],
                   [("x", F, [2, 3, 7, 9]), ("rois", F, [5, 4]), ("b", I64, [5])],
                   [("y", F)], opset=16)
    _check(model, {"x": RNG.standard_normal((2, 3, 7, 9)).astype(np.float32), "rois": rois,
                   "b": np.array([0, 1, 1, 0, 1], np.int64)}, target, rtol=1e-4, atol=1e-5)


def test_roi_align_batch_index_out_of_range():
    model = _model([helper.make_node("RoiAlign", ["x", "rois", "b"], ["y"], sampling_ratio=1)],
                   [("x", F, [2, 3, 7, 9]), ("rois", F, [1, 4]), ("b", I64, [1])],
                   [("y", F)], opset=16)
    compiled = polyc.compile_onnx(model)
    feed = {"x": np.zeros((2, 3, 7, 9), np.float32),
            "rois": np.array([[0, 0, 3, 3]], np.float32), "b": np.array([2], np.int64)}
    with pytest.raises(polyc.RunError, match=r"RoiAlign.*batch index 2.*valid: 0 to 1"):
        compiled.run(None, feed)


@pytest.mark.parametrize("target", TARGETS)
def test_empty_tensors_fold_to_constants(target):
    """An empty Slice concatenated with data, a reduction over an empty axis (its
    identity) and an empty graph output: no kernel sees an extent of 0."""
    ints = lambda name, v: numpy_helper.from_array(np.array(v, np.int64), name)  # noqa: E731
    nodes = [helper.make_node("Slice", ["x", "s0", "s1", "ax"], ["empty"]),  # x[:, 3:3]
             helper.make_node("Concat", ["x", "empty"], ["cat"], axis=1),
             helper.make_node("Relu", ["cat"], ["y"]),
             helper.make_node("ReduceMax", ["empty", "ax"], ["mx"], keepdims=1),
             helper.make_node("Add", ["mx", "y"], ["z"]),
             helper.make_node("Neg", ["empty"], ["e2"])]
    model = _model(nodes, [("x", F, [2, 5])], [("y", F), ("z", F), ("e2", F)],
                   [ints("s0", [3]), ints("s1", [3]), ints("ax", [1])], opset=18)
    _check(model, {"x": RNG.standard_normal((2, 5)).astype(np.float32)}, target)


def test_function_body_of_the_models_opset():
    """MeanVarianceNormalization at opset 15 expands into the opset-13 body (its opset-18
    body passes ReduceMean's axes as an input, which opset 15 does not have)."""
    model = _model([helper.make_node("MeanVarianceNormalization", ["x"], ["m"])],
                   [("x", F, [2, 3, 4, 5])], [("m", F)], opset=15)
    _check(model, {"x": RNG.standard_normal((2, 3, 4, 5)).astype(np.float32)},
           use_ort=False, rtol=1e-4, atol=1e-5)
