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
