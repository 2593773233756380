"""RNN, GRU and LSTM (``frontend/onnx_ops_rnn.py``: loops over time around contractions)
against onnxruntime, on sizes the node tests do not use: several batches and steps,
both directions, GRU's ``linear_before_reset``, varying ``sequence_lens``, ``clip`` and
non-default activations."""
from __future__ import annotations

import numpy as np
import pytest
from onnx import TensorProto, helper

import polyc

ort = pytest.importorskip("onnxruntime")
GATES = {"RNN": 1, "GRU": 3, "LSTM": 4}


def _model(op: str, steps: int, batch: int, n_in: int, hidden: int, dirs: int,
           with_lens: bool, **attrs):
    g = GATES[op]
    ins = [("X", [steps, batch, n_in]), ("W", [dirs, g * hidden, n_in]),
           ("R", [dirs, g * hidden, hidden]), ("B", [dirs, 2 * g * hidden])]
    names = ["X", "W", "R", "B"]
    if with_lens:
        ins.append(("L", [batch]))
        names.append("L")
    outs = ["Y", "Y_h"] + (["Y_c"] if op == "LSTM" else [])
    node = helper.make_node(op, names, outs, hidden_size=hidden, **attrs)
    graph = helper.make_graph(
        [node], "g",
        [helper.make_tensor_value_info(n, TensorProto.INT32 if n == "L" else TensorProto.FLOAT,
                                       s) for n, s in ins],
        [helper.make_tensor_value_info(o, TensorProto.FLOAT, None) for o in outs])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 14)],
                             ir_version=8), ins


@pytest.mark.parametrize("op,direction,attrs", [
    ("RNN", "bidirectional", {}),
    ("RNN", "forward", {"activations": ["Relu"], "clip": 2.5}),
    ("GRU", "bidirectional", {}),
    ("GRU", "forward", {"linear_before_reset": 1}),
    ("GRU", "reverse", {"activations": ["HardSigmoid", "Softsign"]}),
    ("GRU", "forward", {"activations": ["HardSigmoid", "Tanh"]}),
    ("RNN", "forward", {"activations": ["LeakyRelu"], "activation_alpha": [0.3]}),
    ("RNN", "reverse", {"activations": ["ScaledTanh"], "activation_alpha": [1.5],
                        "activation_beta": [0.7]}),
    ("GRU", "forward", {"activations": ["Sigmoid", "Softsign"]}),
    ("LSTM", "bidirectional", {}),
    ("LSTM", "forward", {"clip": 1.0}),
])
def test_recurrent_layers_match_onnxruntime(op, direction, attrs):
    dirs = 2 if direction == "bidirectional" else 1
    if "activations" in attrs:
        attrs = dict(attrs, activations=attrs["activations"] * dirs)
    model, ins = _model(op, 6, 3, 5, 7, dirs, False, direction=direction, **attrs)
    rng = np.random.default_rng(len(op) + dirs)
    feeds = {n: (rng.standard_normal(s) * 0.5).astype(np.float32) for n, s in ins}
    want = ort.InferenceSession(model.SerializeToString(),
                                providers=["CPUExecutionProvider"]).run(None, feeds)
    got = polyc.compile_onnx(model).run(None, feeds)
    for g, w in zip(got, want):
        np.testing.assert_allclose(g, w, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("op", ["RNN", "GRU", "LSTM"])
def test_sequence_lens_freeze_the_state(op):
    """Past a batch's length its Y rows are 0 and its last state is the one at its end."""
    model, ins = _model(op, 5, 3, 4, 6, 1, True)
    rng = np.random.default_rng(9)
    feeds = {n: (rng.standard_normal(s) * 0.5).astype(np.float32) for n, s in ins if n != "L"}
    feeds["L"] = np.array([5, 2, 3], np.int32)
    want = ort.InferenceSession(model.SerializeToString(),
                                providers=["CPUExecutionProvider"]).run(None, feeds)
    got = polyc.compile_onnx(model).run(None, feeds)
    for g, w in zip(got, want):
        np.testing.assert_allclose(g, w, rtol=1e-4, atol=1e-5)
