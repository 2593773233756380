"""Graph inputs that a model uses as parameters (issue 12, part 3): a Reduce's axes, a
Slice's bounds, Pad's pads given as inputs. ``compile_onnx`` refuses them by name unless
``values=`` fixes them; ``polyc.backend`` specialises the model on their values at each
run (one compiled model per set of values); ``polyc compile --value`` fixes them for the C
API."""
from __future__ import annotations

import numpy as np
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper
from test_onnx_cli import polyc as run_cli

import polyc
from polyc import backend
from polyc.frontend.onnx_graph import UnsupportedOpError
from polyc.frontend.onnx_import import parameter_inputs

OPTIONS = polyc.Options(cflags=("-O1",))


def reduce_slice_model():
    """y = ReduceSum(x, axes) (keepdims), z = Slice(x, starts, ends) along axis 0 (opset
    18: both as inputs)."""
    F, I64 = TensorProto.FLOAT, TensorProto.INT64
    nodes = [helper.make_node("ReduceSum", ["x", "axes"], ["y"], keepdims=1),
             helper.make_node("Slice", ["x", "starts", "ends"], ["z"])]
    graph = helper.make_graph(nodes, "params", [
        helper.make_tensor_value_info("x", F, (3, 4, 5)),
        helper.make_tensor_value_info("axes", I64, (None,)),
        helper.make_tensor_value_info("starts", I64, (1,)),
        helper.make_tensor_value_info("ends", I64, (1,))],
        [helper.make_tensor_value_info("y", F, ("a", "b", "c")),
         helper.make_tensor_value_info("z", F, ("d", 4, 5))])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)], ir_version=8)


X = np.random.default_rng(0).standard_normal((3, 4, 5)).astype(np.float32)


def reference(axes, starts, ends):
    m = reduce_slice_model()
    feed = {"x": X, "axes": np.array(axes, np.int64), "starts": np.array(starts, np.int64),
            "ends": np.array(ends, np.int64)}
    return ort.InferenceSession(m.SerializeToString(),
                                providers=["CPUExecutionProvider"]).run(None, feed), feed


def test_parameters_are_named_and_fixed_by_values():
    m = reduce_slice_model()
    assert parameter_inputs(m) == ["axes", "starts", "ends"]
    with pytest.raises(UnsupportedOpError, match="'axes', 'starts', 'ends' are parameters"):
        polyc.compile_onnx(m, options=OPTIONS)
    want, feed = reference([0, 2], [1], [3])
    compiled = polyc.compile_onnx(m, options=OPTIONS,
                                  values={"axes": [0, 2], "starts": [1], "ends": [3]})
    assert compiled.input_names == ["x"]
    for got, w in zip(compiled.run(None, {"x": X}), want):
        np.testing.assert_allclose(got, w, rtol=1e-5, atol=1e-5)
    with pytest.raises(polyc.CompileError, match="no graph input 'nope'"):
        polyc.compile_onnx(m, options=OPTIONS, values={"nope": [1]})


def test_backend_specialises_per_set_of_values():
    rep = backend.prepare(reduce_slice_model(), "CPU", options=OPTIONS)
    assert rep.parameters == ("axes", "starts", "ends")
    for axes, starts, ends in (([1], [0], [2]), ([0, 2], [-2], [100]), ([1], [0], [2])):
        want, feed = reference(axes, starts, ends)
        got = rep.run([feed["x"], feed["axes"], feed["starts"], feed["ends"]])
        for g, w in zip(got, want):
            np.testing.assert_allclose(g, w, rtol=1e-5, atol=1e-5)
    assert len(rep._by_values) == 2  # the third run reused the first's library


def test_command_line_value(tmp_path):
    path = str(tmp_path / "params.onnx")
    with open(path, "wb") as f:
        f.write(reduce_slice_model().SerializeToString())
    done = run_cli("compile", path, "-o", str(tmp_path / "out"), "-q")
    assert done.returncode != 0 and "--value axes=" in done.stderr
    done = run_cli("compile", path, "-o", str(tmp_path / "out"), "-q", "--value", "axes=1",
                   "--value", "starts=0", "--value", "ends=2")
    assert done.returncode == 0, done.stderr
    header = open(tmp_path / "out" / "params.h").read()
    assert "axes" not in header.split("params_run")[1].split(";")[0]
