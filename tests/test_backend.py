"""``polyc.backend``: the ``onnx.backend.base.Backend`` interface, against onnx's reference
evaluator."""
from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper
from onnx.reference import ReferenceEvaluator

import polyc
from polyc import backend

OPTIONS = polyc.Options(cflags=("-O1",))


def conv_relu_model(seed=0):
    rng = np.random.default_rng(seed)
    w = numpy_helper.from_array(rng.standard_normal((4, 3, 3, 3)).astype(np.float32), "W")
    b = numpy_helper.from_array(rng.standard_normal(4).astype(np.float32), "B")
    nodes = [helper.make_node("Conv", ["x", "W", "B"], ["c"], pads=[1, 1, 1, 1], name="conv"),
             helper.make_node("Relu", ["c"], ["y"], name="relu")]
    graph = helper.make_graph(
        nodes, "conv_relu", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, 8, 8])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4, 8, 8])], [w, b])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    return model


def test_prepare_and_run_match_the_reference():
    model = conv_relu_model()
    rep = backend.prepare(model, "CPU", options=OPTIONS)
    x = np.random.default_rng(1).standard_normal((1, 3, 8, 8)).astype(np.float32)
    (want,) = ReferenceEvaluator(model).run(None, {"x": x})
    out = rep.run([x])
    assert isinstance(out, tuple) and len(out) == 1
    np.testing.assert_allclose(out[0], want, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(out.y, want, rtol=1e-5, atol=1e-5)  # namedtuple by output name
    np.testing.assert_allclose(out["y"], want, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(rep.run({"x": x})[0], want, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(rep.run(x)[0], want, rtol=1e-5, atol=1e-5)
    with pytest.raises(polyc.CallError, match="takes 1 inputs"):
        rep.run([x, x])


def test_run_model():
    model = conv_relu_model(2)
    x = np.ones((1, 3, 8, 8), np.float32)
    (want,) = ReferenceEvaluator(model).run(None, {"x": x})
    (got,) = backend.run_model(model, [x], options=OPTIONS)
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("node, shapes", [
    (helper.make_node("Relu", ["a"], ["b"]), [(3, 4)]),
    (helper.make_node("Add", ["a", "b"], ["c"]), [(2, 3, 4), (3, 1)]),
    (helper.make_node("MatMul", ["a", "b"], ["c"]), [(2, 5), (5, 3)]),
])
def test_run_node(node, shapes):
    rng = np.random.default_rng(0)
    inputs = [rng.standard_normal(s).astype(np.float32) for s in shapes]
    got = backend.run_node(node, inputs, options=OPTIONS)
    model = backend.node_model(node, inputs, opset=17)
    want = ReferenceEvaluator(model).run(None, dict(zip(node.input, inputs)))
    assert len(got) == len(want)
    for g, w in zip(got, want):
        np.testing.assert_allclose(g, w, rtol=1e-5, atol=1e-5)


def test_devices():
    assert backend.supports_device("CPU")
    assert not backend.supports_device("CUDA")
    assert not backend.supports_device("TPU")
    with pytest.raises(ValueError, match="CPU only"):
        backend.prepare(conv_relu_model(), "CUDA")


def test_unsupported_op_is_refused_with_the_node_name():
    node = helper.make_node("Det", ["a"], ["b"], name="the_det")
    graph = helper.make_graph([node], "det",
                              [helper.make_tensor_value_info("a", TensorProto.FLOAT, [3, 3])],
                              [helper.make_tensor_value_info("b", TensorProto.FLOAT, [])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    with pytest.raises(polyc.CompileError, match="the_det.*Det|Det.*the_det"):
        backend.prepare(model, "CPU", options=OPTIONS)


def test_module_is_an_onnx_backend():
    assert issubclass(backend.PolycBackend, onnx.backend.base.Backend)
    for fn in ("prepare", "run_model", "run_node", "supports_device"):
        assert callable(getattr(backend, fn))
