"""Whole ONNX models compiled by polyc against onnxruntime and onnx's expected outputs.

* models built here (MLP, small CNN, transformer encoder layer) against onnxruntime;
* the architectures shipped inside the onnx package with their own weights, against the
  expected outputs shipped beside them — and, because those weights are constant fills
  (a wrong backend can pass them), with seeded random weights against onnxruntime.
"""
from __future__ import annotations

import numpy as np
import onnx_models as M
import pytest

import polyc
from polyc.schedule import machine


def _compare(got, want, rtol, atol_scale):
    assert len(got) == len(want)
    for g, w in zip(got, want):
        assert g.shape == w.shape, (g.shape, w.shape)
        atol = atol_scale * max(float(np.abs(w).max()), 1.0)
        np.testing.assert_allclose(g, w, rtol=rtol, atol=atol)


@pytest.mark.parametrize("build", [M.mlp, M.small_cnn, M.transformer_layer],
                         ids=lambda f: f.__name__)
def test_built_models_match_onnxruntime(build):
    model = build()
    feeds = M.input_feeds(model, seed=1)
    compiled = polyc.compile_onnx(model)
    got = compiled.run(None, feeds)
    _compare(got, M.onnxruntime_outputs(model, feeds), rtol=1e-3, atol_scale=1e-4)
    # the positional form gives the same
    _compare(list(compiled(*feeds.values())), got, rtol=0, atol_scale=0)


@pytest.mark.parametrize("name", M.LIGHT_MODELS)
def test_light_models(name):
    """Shipped weights against the shipped output; random weights against onnxruntime."""
    model = M.light_model(name)
    feeds = M.light_input_feeds(model)
    compiled = polyc.compile_onnx(model)
    want = M.light_expected_output(name)
    got = compiled.run(None, feeds)[0]
    np.testing.assert_allclose(got, want, rtol=2e-3, atol=1e-6)

    randomized = M.randomized_light_model(name, seed=0)
    feeds = M.input_feeds(randomized, seed=2)
    got = polyc.compile_onnx(randomized).run(None, feeds)
    _compare(got, M.onnxruntime_outputs(randomized, feeds), rtol=2e-3, atol_scale=1e-4)


def _max_rel(got, want) -> float:
    got, want = np.asarray(got, np.float64), np.asarray(want, np.float64)
    return float(np.abs(got - want).max() / max(np.abs(want).max(), 1e-30))


def test_resnet50_float16_matches_onnxruntime():
    """ResNet-50 (onnx's light model, random weights scaled to stay within float16's
    range) converted to float16: stored and rounded as float16 at every op, its sums
    accumulated in float32. Against onnxruntime's float16 run and the float32 model:
    within 3% of the logits' range (about 150 float16 roundings deep; onnxruntime keeps
    some intermediates in float32 and lands nearer the float32 answer)."""
    model = M.randomized_light_model("resnet50", seed=0, gain=0.5)
    feeds = M.input_feeds(model, seed=2)
    half = M.to_float16(model)
    feeds16 = {k: v.astype(np.float16) for k, v in feeds.items()}
    got = polyc.compile_onnx(half).run(None, feeds16)[0]
    assert got.dtype == np.float16
    want32 = M.onnxruntime_outputs(model, feeds)[0]
    want16 = M.onnxruntime_outputs(half, feeds16)[0]
    assert _max_rel(got, want16) < 0.03
    assert _max_rel(got, want32) < 0.03
    assert np.corrcoef(got.astype(np.float64).ravel(), want32.ravel())[0, 1] > 0.999


def _qdq(model, seeds=(3, 4)):
    return M.quantize_qdq(model, [M.input_feeds(model, seed=s) for s in seeds])


def test_small_cnn_qdq_runs_integer_convolutions():
    """A QDQ-quantized CNN (onnxruntime's static quantizer): every Conv (and Gemm) with
    its DequantizeLinear inputs, ReLU and QuantizeLinear output runs as one integer
    convolution; the result is within a few output quanta of onnxruntime's int8 run and
    of its float fake-quantized run (the sums differ only in float rounding, which
    moves a value across a rounding boundary now and then)."""
    from polyc.frontend.onnx_passes import pass_stats
    model = M.small_cnn()
    q = _qdq(model)
    feeds = M.input_feeds(model, seed=2)
    got = polyc.compile_onnx(q).run(None, feeds)[0]
    convs = sum(n.op_type == "Conv" for n in model.graph.node)
    fcs = sum(n.op_type in ("Gemm", "MatMul") for n in model.graph.node)
    # (a fully-connected layer as a 1x1 convolution)
    assert pass_stats()["qdq_gemms"] == fcs > 0
    assert pass_stats()["qdq_convs"] == convs + fcs and convs > 0
    want = M.onnxruntime_outputs(q, feeds)[0]
    assert _max_rel(got, want) < 0.05
    assert np.corrcoef(got.ravel(), want.ravel())[0, 1] > 0.999


def test_resnet50_int8_qdq_matches_onnxruntime():
    """ResNet-50 quantized by onnxruntime (QDQ, uint8 activations, int8 per-channel
    weights): all 53 convolutions and the classifier (as a 1x1 convolution) run exactly
    on the integers (as VNNI dot products on a CPU that has them). onnxruntime's int8 run and its
    float run of the same QDQ graph differ from each other by about 1.5% of the logits'
    range (a quantum here and there, compounded over 50 layers); polyc is as near."""
    from polyc.frontend.onnx_passes import pass_stats
    model = M.randomized_light_model("resnet50", seed=0)
    q = _qdq(model)
    feeds = M.input_feeds(model, seed=2)
    got = polyc.compile_onnx(q).run(None, feeds)[0]
    assert pass_stats()["qdq_convs"] == 54 and pass_stats()["qdq_gemms"] == 1
    # on the integers with a CPU's dot products (VNNI), else as exact float convolutions
    assert pass_stats()["conv_dot"] == (54 if machine.has_integer_dot() else 0)
    want = M.onnxruntime_outputs(q, feeds)[0]
    assert _max_rel(got, want) < 0.03
    assert np.corrcoef(got.ravel(), want.ravel())[0, 1] > 0.999
