"""CausalConvWithState and LinearAttention (opset 27) against onnx's reference, on odd
sizes, on the C target and the CUDA emulation; and the storage folding that keeps the
linear attention's state at two steps whatever the sequence length."""
from __future__ import annotations

from dataclasses import replace

import islpy as isl
import numpy as np
import pytest
from onnx import TensorProto as T
from onnx import helper
from onnx.reference import ReferenceEvaluator

import polyc
from polyc import expr as E
from polyc.errors import ScheduleError
from polyc.frontend import from_tc
from polyc.model import lower_onnx, schedule_function
from polyc.rewrite import fold_storage

F = T.FLOAT
TARGETS = [pytest.param({}, id="c"),
           pytest.param({"target": "cuda", "emulate": True}, id="cuda-emulated")]


def _model(node, ins, outs):
    graph = helper.make_graph([node], "seq", [helper.make_tensor_value_info(n, t, s)
                                              for n, t, s in ins],
                              [helper.make_tensor_value_info(n, F, None) for n in outs])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 27)],
                             ir_version=11)


def _check(model, feed, target, rtol=1e-4, atol=1e-5):
    want = ReferenceEvaluator(model).run(None, feed)
    compiled = polyc.compile_onnx(model, **target)
    got = compiled.run(None, feed)
    for g, w in zip(got, want):
        assert g.shape == w.shape
        np.testing.assert_allclose(g, w, rtol=rtol, atol=atol)
    return compiled


@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize("past,bias,act", [(False, False, "none"), (True, True, "silu"),
                                           (True, False, "swish")])
def test_causal_conv_with_state(past, bias, act, target):
    rng = np.random.default_rng(7)
    b, c, length, k = 2, 5, 9, 4
    ins = [("x", F, [b, c, length]), ("w", F, [c, 1, k])]
    feed = {"x": rng.standard_normal((b, c, length)).astype(np.float32),
            "w": rng.standard_normal((c, 1, k)).astype(np.float32)}
    names = ["x", "w", "bias" if bias else "", "past" if past else ""]
    if bias:
        ins.append(("bias", F, [c]))
        feed["bias"] = rng.standard_normal(c).astype(np.float32)
    if past:
        ins.append(("past", F, [b, c, k - 1]))
        feed["past"] = rng.standard_normal((b, c, k - 1)).astype(np.float32)
    node = helper.make_node("CausalConvWithState", names, ["y", "state"], activation=act)
    _check(_model(node, ins, ["y", "state"]), feed, target)


def _linear_attention_case(rule, hq, hk, steps, past, decay_width="dk"):
    rng = np.random.default_rng(hash((rule, hq, hk, steps)) % 1000)
    b, dk, dv = 2, 3, 5
    ins = [("q", F, [b, steps, hq * dk]), ("k", F, [b, steps, hk * dk]),
           ("v", F, [b, steps, hk * dv])]
    feed = {n: (0.5 * rng.standard_normal(s)).astype(np.float32) for n, _, s in ins}
    names = ["q", "k", "v", "", "", ""]
    if past:
        ins.append(("past", F, [b, hk, dk, dv]))
        feed["past"] = rng.standard_normal((b, hk, dk, dv)).astype(np.float32)
        names[3] = "past"
    if rule in ("gated", "gated_delta"):
        w = hk * dk if decay_width == "dk" else hk
        ins.append(("g", F, [b, steps, w]))
        feed["g"] = -np.abs(rng.standard_normal((b, steps, w))).astype(np.float32)
        names[4] = "g"
    if rule in ("delta", "gated_delta"):
        ins.append(("beta", F, [b, steps, hk]))
        feed["beta"] = rng.uniform(0, 1, (b, steps, hk)).astype(np.float32)
        names[5] = "beta"
    while names and not names[-1]:
        names.pop()
    node = helper.make_node("LinearAttention", names, ["o", "state"], update_rule=rule,
                            q_num_heads=hq, kv_num_heads=hk)
    return _model(node, ins, ["o", "state"]), feed


@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize("rule,hq,hk,steps,past", [
    ("linear", 2, 2, 7, False), ("gated", 4, 2, 6, True), ("delta", 3, 3, 5, True),
    ("gated_delta", 4, 1, 9, False), ("gated_delta", 2, 2, 1, True)])
def test_linear_attention(rule, hq, hk, steps, past, target):
    model, feed = _linear_attention_case(rule, hq, hk, steps, past)
    _check(model, feed, target)


def test_linear_attention_per_head_decay_and_state_storage():
    """A long sequence: the state is stored for two steps, not for every step."""
    model, feed = _linear_attention_case("gated", 2, 2, 40, True, decay_width="head")
    _check(model, feed, {})
    step = lower_onnx(model).steps[0]
    assert step.kernel.folds  # asked for by the lowering, applied once scheduled:
    kernel, _ = schedule_function(polyc.Options())(step.kernel)
    state = [a for a in kernel.arrays if a.name.startswith("v_state")]
    assert state and state[0].shape[0] == E.Const(2)
    assert not kernel.folds


def test_fold_storage_refuses_a_read_further_back():
    k = from_tc("def f(float(8) X) -> (Y) {\n"
                " T(t) = X(t) where t in 0:8\n"
                " T(t) = t >= 3 ? T(t - 3) + X(t) : X(t) where t in 0:8\n"
                " Y(t) = T(t)\n}")
    # the two statements writing T share their loop over t; Y reads T in a loop of its own
    k = replace(k, order=(("S0", (0, "t", 0)), ("S1", (0, "t", 1)), ("S2", (1, "t"))))
    with pytest.raises(ScheduleError, match="S1 reads 'T' at step \\(t - 3\\), not one of "
                                            "the last 2"):
        fold_storage(k, "T", 2)
    with pytest.raises(ScheduleError, match="S2 reads 'T' at step t, not one of the last 4"):
        fold_storage(k, "T", 4)  # every step of T, read after the loop
    assert fold_storage(k, "T", 8) is k


def test_fold_storage_refuses_a_reduction_over_steps():
    """``H(t, i) +=! X(t, i, j)``, read at one step afterwards: its initialisation and its
    updates are separate loops, so one slot would sum every step's values."""
    k = from_tc("def f(float(5,3,4) X) -> (Y) {\n"
                " H(t, i) +=! X(t, i, j)\n"
                " Y(i) = H(4, i)\n}")
    with pytest.raises(ScheduleError, match="do not share one loop"):
        fold_storage(k, "H", 1)


def test_folded_recurrence_steps_are_vectorized_not_parallel():
    """A recurrence with folded state keeps the source's order, as a tree: the shared
    step loop outermost (sequential), each statement's own loops in a band flagged from
    the dependences -- coincident members become SIMD loops, and a step's few
    thousand instances get no parallel region of their own (one per step would cost
    more than the step)."""
    model, feed = _linear_attention_case("gated", 2, 2, 40, True, decay_width="head")
    compiled = _check(model, feed, {})
    source = compiled.c_source
    body = source[source.index("for (int64_t c0 = 0; c0 <= 39; c0 += 1)"):]
    assert "#pragma omp simd" in body[:body.index("\n  }\n")]
    assert "omp parallel" not in body[:body.index("\n  }\n")]
    step = lower_onnx(model).steps[0]
    kernel, schedule = schedule_function(polyc.Options())(step.kernel)
    bands = []

    def visit(node):
        if node.get_type() == isl.schedule_node_type.band:
            bands.append([bool(node.band_member_get_coincident(i))
                          for i in range(node.band_n_member())])
        for i in range(node.n_children()):
            visit(node.child(i))
    visit(schedule.get_root())
    assert bands[0] == [False] or bands[0][0] is False  # the steps, in order
    assert any(any(b) for b in bands[1:])  # the statements' own loops: parallel members
