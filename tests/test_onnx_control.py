"""Control flow flattened at import (frontend/onnx_control.py): Scan, If and Loop,
against onnxruntime, on the C target and the CUDA emulation."""
from __future__ import annotations

import numpy as np
import pytest
from onnx import TensorProto as T
from onnx import helper, numpy_helper

import polyc
from polyc.frontend.onnx_graph import UnsupportedOpError

ort = pytest.importorskip("onnxruntime")
F, I64, B = T.FLOAT, T.INT64, T.BOOL
TARGETS = [pytest.param({}, id="c"),
           pytest.param({"target": "cuda", "emulate": True}, id="cuda-emulated")]


def _vi(name, dt, shape):
    return helper.make_tensor_value_info(name, dt, shape)


def _model(nodes, ins, outs, inits=(), opset=16):
    graph = helper.make_graph(nodes, "control", [_vi(*i) for i in ins],
                              [_vi(n, t, None) for n, t in outs], list(inits))
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)],
                             ir_version=8)


def _check(model, feed, target=None, values=None):
    compiled = polyc.compile_onnx(model, values=values, **(target or {}))
    sess = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    want = sess.run(None, {**feed, **(values or {})})
    got = compiled.run(None, feed)
    for g, w in zip(got, want):
        assert g.shape == w.shape and g.dtype == w.dtype, (g.shape, w.shape)
        np.testing.assert_allclose(g, w, rtol=1e-5, atol=1e-6)
    return compiled


def _loop_body(limit: float | None):
    """x -> x * 1.5 + 1 per step; the scan output is the step's x; with ``limit`` the
    loop goes on while max(x) < limit (a data-dependent number of steps)."""
    nodes = [helper.make_node("Mul", ["x_in", "k"], ["mm"]),
             helper.make_node("Add", ["mm", "one"], ["x_out"]),
             helper.make_node("Identity", ["x_out"], ["scan"])]
    if limit is None:
        nodes.append(helper.make_node("Identity", ["c_in"], ["c_out"]))
    else:
        nodes += [helper.make_node("ReduceMax", ["x_out"], ["mx"], keepdims=0),
                  helper.make_node("Less", ["mx", "lim"], ["c_out"])]
    inits = [numpy_helper.from_array(np.array(1.5, np.float32), "k"),
             numpy_helper.from_array(np.array(1.0, np.float32), "one"),
             numpy_helper.from_array(np.array(limit or 0, np.float32), "lim")]
    return helper.make_graph(nodes, "body", [_vi("i", I64, []), _vi("c_in", B, []),
                                             _vi("x_in", F, [3])],
                             [_vi("c_out", B, []), _vi("x_out", F, [3]), _vi("scan", F, [3])],
                             inits)


@pytest.mark.parametrize("target", TARGETS)
def test_loop_with_static_trip_count(target):
    m = numpy_helper.from_array(np.array(6, np.int64), "m")
    model = _model([helper.make_node("Loop", ["m", "", "x"], ["xf", "xs"],
                                     body=_loop_body(None))],
                   [("x", F, [3])], [("xf", F), ("xs", F)], [m])
    compiled = _check(model, {"x": np.array([0.5, -1, 2], np.float32)}, target)
    assert compiled.dynamic_outputs == {}


@pytest.mark.parametrize("target", TARGETS)
def test_loop_that_stops_on_data(target):
    """The condition is computed from the state: how many steps run depends on x; the
    scan output is cut to the steps that ran, the state is the last one's."""
    m = numpy_helper.from_array(np.array(9, np.int64), "m")
    model = _model([helper.make_node("Loop", ["m", "c", "x"], ["xf", "xs"],
                                     body=_loop_body(40.0))],
                   [("x", F, [3]), ("c", B, [])], [("xf", F), ("xs", F)], [m])
    compiled = None
    for x, c in (([0.5, -1, 2], True), ([30, 1, 2], True), ([100, 0, 0], True),
                 ([0, 0, 0], False), ([-5, -5, -5], True)):
        feed = {"x": np.array(x, np.float32), "c": np.array(c)}
        if compiled is None:
            compiled = _check(model, feed, target)
        else:
            sess = ort.InferenceSession(model.SerializeToString(),
                                        providers=["CPUExecutionProvider"])
            for g, w in zip(compiled.run(None, feed), sess.run(None, feed)):
                assert g.shape == w.shape
                np.testing.assert_allclose(g, w, rtol=1e-6)
    assert compiled.dynamic_outputs == {"xs": (0, (9, 3))}


def test_loop_trip_count_as_a_parameter():
    """A trip count given as an input is a parameter (the model is compiled for its
    value), and so are the inputs it is computed from."""
    model = _model([helper.make_node("Add", ["n", "two"], ["m"]),
                    helper.make_node("Loop", ["m", "", "x"], ["xf", "xs"],
                                     body=_loop_body(None))],
                   [("x", F, [3]), ("n", I64, [])], [("xf", F), ("xs", F)],
                   [numpy_helper.from_array(np.array(2, np.int64), "two")])
    with pytest.raises(UnsupportedOpError, match="'n'"):
        polyc.compile_onnx(model)
    _check(model, {"x": np.array([1, 2, 3], np.float32)}, values={"n": np.array(3, np.int64)})


def test_loop_without_trip_count_is_refused():
    model = _model([helper.make_node("Loop", ["", "c", "x"], ["xf", "xs"],
                                     body=_loop_body(40.0))],
                   [("x", F, [3]), ("c", B, [])], [("xf", F), ("xs", F)])
    with pytest.raises(UnsupportedOpError, match="Loop.*trip count"):
        polyc.compile_onnx(model)


@pytest.mark.parametrize("target", TARGETS)
def test_if_on_data_and_on_a_shape(target):
    def branch(op, name):
        return helper.make_graph([helper.make_node(op, ["x", "x"], [name])], f"b_{op}", [],
                                 [_vi(name, F, [2, 5])])
    nodes = [helper.make_node("ReduceSum", ["x"], ["s"], keepdims=0),
             helper.make_node("Greater", ["s", "zero"], ["pos"]),
             helper.make_node("If", ["pos"], ["y"], then_branch=branch("Add", "ta"),
                              else_branch=branch("Mul", "tb")),
             helper.make_node("Shape", ["x"], ["shp"]),
             helper.make_node("ReduceMax", ["shp"], ["big"], keepdims=0),
             helper.make_node("Greater", ["big", "four"], ["wide"]),
             helper.make_node("If", ["wide"], ["z"], then_branch=branch("Sub", "tc"),
                              else_branch=branch("Max", "td"))]
    inits = [numpy_helper.from_array(np.array(0, np.float32), "zero"),
             numpy_helper.from_array(np.array(4, np.int64), "four")]
    model = _model(nodes, [("x", F, [2, 5])], [("y", F), ("z", F)], inits)
    rng = np.random.default_rng(0)
    for _ in range(2):
        _check(model, {"x": rng.standard_normal((2, 5)).astype(np.float32)}, target)


@pytest.mark.parametrize("target", TARGETS)
def test_scan_running_sum(target):
    body = helper.make_graph([helper.make_node("Add", ["s_in", "e"], ["s_out"]),
                              helper.make_node("Identity", ["s_out"], ["o"])], "scan_body",
                             [_vi("s_in", F, [4]), _vi("e", F, [4])],
                             [_vi("s_out", F, [4]), _vi("o", F, [4])])
    model = _model([helper.make_node("Scan", ["s0", "xs"], ["sf", "ys"], body=body,
                                     num_scan_inputs=1, scan_input_directions=[1])],
                   [("s0", F, [4]), ("xs", F, [5, 4])], [("sf", F), ("ys", F)])
    rng = np.random.default_rng(1)
    _check(model, {"s0": rng.standard_normal(4).astype(np.float32),
                   "xs": rng.standard_normal((5, 4)).astype(np.float32)}, target)


def test_loop_condition_of_shape_one():
    """Runtimes take a Loop condition of shape [1] as well as a scalar."""
    body = _loop_body(40.0)
    body.input[1].type.tensor_type.shape.dim.add().dim_value = 1
    m = numpy_helper.from_array(np.array(5, np.int64), "m")
    model = _model([helper.make_node("Loop", ["m", "c", "x"], ["xf", "xs"], body=body)],
                   [("x", F, [3]), ("c", B, [1])], [("xf", F), ("xs", F)], [m])
    _check(model, {"x": np.array([1, 2, 3], np.float32), "c": np.array([True])})
