"""Winograd convolutions (frontend/winograd.py, onnx_layout.wants_winograd,
onnx_ops_nn.winograd_input / winograd_output): the transform matrices against the direct correlation, and
compiled 3x3 convolutions against onnxruntime on output sizes that leave partial tiles,
padded or not, several weight blocks, a batch, at 1 and 2 threads; what runs by
Winograd and what does not; the direct path (``winograd=False``) and the CLI switch."""
from __future__ import annotations

import os
import subprocess
import sys

import numpy as np
import onnx
import pytest
from onnx import helper, numpy_helper
from onnx.reference import ReferenceEvaluator
from onnx_models import onnxruntime_outputs

import polyc
from polyc.codegen.toolchain import sanitizer_environment
from polyc.frontend import winograd
from polyc.frontend.onnx_layout import winograd_weights
from polyc.model import lower_onnx

pytestmark = pytest.mark.filterwarnings("error::polyc.errors.PolycWarning")


@pytest.mark.parametrize("m", [2, 4])
def test_transforms_compute_the_correlation(m):
    """``A^T [(G g G^T) . (B^T d B)] A`` is the valid 3x3 correlation of an ``(m + 2)``
    square tile (in float64, to rounding)."""
    bt, g, at = winograd.matrices(m)
    rng = np.random.default_rng(m)
    d = rng.standard_normal((m + 2, m + 2))
    k = rng.standard_normal((3, 3))
    got = at @ ((g @ k @ g.T) * (bt @ d @ bt.T)) @ at.T
    want = np.array([[np.sum(d[i:i + 3, j:j + 3] * k) for j in range(m)] for i in range(m)])
    np.testing.assert_allclose(got, want, rtol=1e-12, atol=1e-12)


def test_linear_skips_zeros_and_unit_coefficients():
    bt, _, _ = winograd.matrices(2)
    assert winograd.linear(bt[0], ["d0", "d1", "d2", "d3"]) == "(d0 - d2)"
    assert winograd.linear(np.array([0.0, 0.5, -2.0]), ["x", "y", "z"]) == \
        "(0.5 * y - 2.0 * z)"
    assert winograd.linear(np.array([-1.0, 0.0]), ["x", "y"]) == "(-x)"


@pytest.mark.parametrize("m", [2, 4])
def test_weights_are_transformed_per_position(m):
    """``(M, C, 3, 3)`` -> ``(alpha * alpha, C, M)``: position ``a * alpha + b`` holds
    ``(G w G^T)[a, b]`` as a ``(C, M)`` matrix, the MatMul's right operand."""
    w = np.random.default_rng(0).standard_normal((96, 5, 3, 3)).astype(np.float32)
    u = winograd_weights(w, m)
    _, g, _ = winograd.matrices(m)
    alpha = m + 2
    assert u.shape == (alpha * alpha, 5, 96)
    for mm in (0, 40, 95):
        full = g @ w[mm, 3].astype(np.float64) @ g.T
        np.testing.assert_allclose(u[:, 3, mm].reshape(alpha, alpha), full, rtol=1e-6)


def _conv(n: int, c: int, m: int, h: int, w: int, pads, *, bias=True, relu=True,
          auto_pad: str | None = None, dilation: int = 1, stride: int = 1,
          dtype=np.float32, seed: int = 0) -> onnx.ModelProto:
    rng = np.random.default_rng(seed)
    elem = helper.np_dtype_to_tensor_dtype(np.dtype(dtype))
    inits = [numpy_helper.from_array((rng.standard_normal((m, c, 3, 3)) / np.sqrt(9 * c))
                                     .astype(dtype), "W")]
    ins = ["x", "W"]
    if bias:
        inits.append(numpy_helper.from_array(rng.standard_normal(m).astype(dtype), "B"))
        ins.append("B")
    attrs = {"auto_pad": auto_pad} if auto_pad else {"pads": list(pads)}
    if dilation != 1:
        attrs["dilations"] = [dilation, dilation]
    if stride != 1:
        attrs["strides"] = [stride, stride]
    nodes = [helper.make_node("Conv", ins, ["c" if relu else "y"], **attrs)]
    if relu:
        nodes.append(helper.make_node("Relu", ["c"], ["y"]))
    g = helper.make_graph(nodes, "conv", [helper.make_tensor_value_info("x", elem, [n, c, h, w])],
                          [helper.make_tensor_value_info("y", elem, None)], inits)
    model = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    return model


def _kernels(model: onnx.ModelProto, **opts) -> list[str]:
    """The arrays of every kernel of ``model``'s program (Winograd's: ``..._wino_v``
    transformed tiles, ``..._wino_m`` their products)."""
    return [a.name for s in lower_onnx(model, options=polyc.Options(**opts)).steps
            for a in s.kernel.arrays]


def _winograd(names: list[str]) -> bool:
    return any(a.endswith("_wino_v") for a in names) and \
        any(a.endswith("_wino_m") for a in names)


# (N, C, M, H, W, pads): output extents odd and even (partial 2x2 tiles at the bottom
# and the right), no padding, uneven padding, pads of 2 (an output larger than the
# input), 16 input channels (one vector), three weight blocks of 64, 48 (three of 16)
SHAPES = [
    (1, 16, 32, 7, 7, (1, 1, 1, 1)),
    (1, 32, 48, 9, 12, (1, 1, 1, 1)),
    (2, 24, 16, 6, 11, (0, 0, 0, 0)),
    (1, 16, 192, 5, 8, (1, 0, 0, 1)),
    (1, 20, 64, 4, 5, (2, 2, 2, 2)),
    (1, 64, 64, 23, 17, (1, 1, 1, 1)),
]


@pytest.mark.parametrize("tile", [2, 4])
@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "x".join(map(str, s[:5])) +
                         "p" + "".join(map(str, s[5])))
def test_winograd_conv_matches_onnxruntime(shape, tile, tmp_cache):
    """Each tile (4x4 tiles overhang a 7-wide output by 1, a 5-wide by 3), at 1 and
    2 threads."""
    model = _conv(*shape, bias=shape[1] != 24, relu=shape[1] != 20)
    assert _winograd(_kernels(model, winograd=tile))
    x = np.random.default_rng(1).standard_normal(shape[:2] + shape[3:5]).astype(np.float32)
    want = onnxruntime_outputs(model, {"x": x})[0]
    for threads in (1, 2):
        m = polyc.compile_onnx(model, options=polyc.Options(threads=threads, cache_dir=tmp_cache,
                                                            winograd=tile))
        np.testing.assert_allclose(m.run(None, {"x": x})[0], want, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("shape", [SHAPES[1], SHAPES[4]], ids=["9x12", "pads2"])
def test_padded_copy_switch_gives_the_same_result(shape, tmp_cache, monkeypatch):
    """The input transform reads X under guards by default; with a padded copy of it
    (``onnx_ops_nn.WINOGRAD_PADDED_COPY``) the result is the same, pads of 2 included."""
    from polyc.frontend import onnx_ops_nn
    model = _conv(*shape)
    x = np.random.default_rng(2).standard_normal(shape[:2] + shape[3:5]).astype(np.float32)
    want = onnxruntime_outputs(model, {"x": x})[0]
    got = []
    for padded in (False, True):
        monkeypatch.setattr(onnx_ops_nn, "WINOGRAD_PADDED_COPY", padded)
        m = polyc.compile_onnx(model, options=polyc.Options(threads=2, cache_dir=tmp_cache,
                                                            winograd=4))
        got.append(m.run(None, {"x": x})[0])
        np.testing.assert_allclose(got[-1], want, rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(got[0], got[1], rtol=1e-6, atol=1e-6)


def test_tile_choice():
    """``F(4x4, 3x3)`` from :data:`winograd.WIDE` on, 2x2 below; forced tiles; an
    unimplemented one refused (by :class:`polyc.Options` too)."""
    assert winograd.tile_for(56, 56) == winograd.tile_for(14, 20) == 4
    assert winograd.tile_for(7, 7) == winograd.tile_for(13, 56) == 2
    assert winograd.tile_for(7, 7, 4) == 4 and winograd.tile_for(56, 56, 2) == 2
    with pytest.raises(ValueError):
        winograd.tile_for(56, 56, 3)
    with pytest.raises(polyc.errors.CompileError):
        polyc.Options(winograd=3)
    for shape, positions in (((1, 16, 16, 14, 14, (1, 1, 1, 1)), 36),
                             ((1, 16, 16, 7, 7, (1, 1, 1, 1)), 16)):
        program = lower_onnx(_conv(*shape))
        products = [a.shape for s in program.steps for a in s.kernel.arrays
                    if a.name.endswith("_wino_m")]
        assert products and all(p[0].value == positions for p in products)


_SANITIZED_CHILD = """
import os, sys
sys.path.insert(0, {tests!r})
sys.path.insert(0, os.path.join(os.path.dirname({tests!r}), "examples"))
import numpy as np
import polyc
from test_winograd import _conv
from onnx.reference import ReferenceEvaluator
model = _conv(1, 16, 16, 9, 7, (1, 1, 1, 1))
x = np.random.default_rng(2).standard_normal((1, 16, 9, 7)).astype(np.float32)
want = ReferenceEvaluator(model).run(None, {{"x": x}})[0]
m = polyc.compile_onnx(model, options=polyc.Options(sanitize=True))
assert b"__asan_" in open(m.library_path, "rb").read(), "not instrumented"
assert "wino" in m.c_source
np.testing.assert_allclose(m.run(None, {{"x": x}})[0], want, rtol=1e-4, atol=1e-4)
print("ok", flush=True)
"""


@pytest.mark.skipif(sanitizer_environment() is None, reason="gcc has no libasan.so")
def test_winograd_conv_under_sanitizers():
    """Every read of the padded input and of the tiles stays inside its buffer (odd
    output extents: the last tiles read padding past the input), in a child process
    with the ASan runtime preloaded."""
    script = _SANITIZED_CHILD.format(tests=os.path.dirname(os.path.abspath(__file__)))
    done = subprocess.run([sys.executable, "-c", script], env=sanitizer_environment(),
                          capture_output=True, text=True, timeout=600, check=False)
    assert done.returncode == 0 and "ok" in done.stdout, \
        f"stdout:\n{done.stdout[-3000:]}\nstderr:\n{done.stderr[-5000:]}"


def test_same_padding_and_direct_switch(tmp_cache):
    """``auto_pad=SAME_UPPER`` runs by Winograd; ``winograd=False`` gives the direct
    channel-last convolution, with the same results to rounding."""
    model = _conv(1, 32, 32, 10, 9, None, auto_pad="SAME_UPPER")
    x = np.random.default_rng(3).standard_normal((1, 32, 10, 9)).astype(np.float32)
    assert _winograd(_kernels(model))
    assert "v_yt" in _kernels(model, winograd=False)
    outs = [polyc.compile_onnx(model, options=polyc.Options(cache_dir=tmp_cache, winograd=w))
            .run(None, {"x": x})[0] for w in (True, False)]
    np.testing.assert_allclose(outs[0], outs[1], rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("kw", [dict(stride=2), dict(dilation=2), dict(dtype=np.float64)],
                         ids=["strided", "dilated", "float64"])
def test_other_convs_stay_direct(kw, tmp_cache):
    """Strided, dilated and float64 3x3 convolutions are not Winograd's."""
    model = _conv(1, 16, 32, 12, 12, (1, 1, 1, 1), **kw)
    names = _kernels(model)
    assert not any("wino" in a for a in names)
    dtype = kw.get("dtype", np.float32)
    x = np.random.default_rng(4).standard_normal((1, 16, 12, 12)).astype(dtype)
    want = ReferenceEvaluator(model).run(None, {"x": x})[0]
    m = polyc.compile_onnx(model, options=polyc.Options(cache_dir=tmp_cache))
    np.testing.assert_allclose(m.run(None, {"x": x})[0], want, rtol=1e-4, atol=1e-4)


def test_cuda_target_keeps_the_direct_convolution(tmp_cache):
    model = _conv(1, 16, 16, 6, 6, (1, 1, 1, 1))
    names = _kernels(model, target="cuda", emulate=True)
    assert not any("wino" in a for a in names)


def test_cli_no_winograd(tmp_path):
    path = tmp_path / "conv.onnx"
    onnx.save(_conv(1, 16, 16, 6, 6, (1, 1, 1, 1)), str(path))
    sources = {}
    for flags in ((), ("--no-winograd",)):
        sources[flags] = subprocess.run(
            [sys.executable, "-m", "polyc", "compile", str(path), "--emit", "c", "-q", *flags],
            check=True, capture_output=True, text=True).stdout
    assert "wino_v" in sources[()] and "wino" not in sources[("--no-winograd",)]


def test_quantized_convolutions_stay_exact():
    """A QDQ model's convolutions computed exactly in float32 (no integer dot products)
    are never Winograd's: its transforms round, the integer sums must not."""
    import onnx_models as M
    from polyc.frontend.onnx_import import load_graph
    from polyc.frontend.onnx_passes import optimize_graph
    model = M.small_cnn()
    ops = [n.op_type for n in optimize_graph(load_graph(model), winograd=True).nodes]
    assert "PolycWinogradInput" in ops  # the float model's 3x3 layer is
    q = M.quantize_qdq(model, [M.input_feeds(model, seed=s) for s in (3, 4)])
    ops = [n.op_type for n in
           optimize_graph(load_graph(q), integer_dot=False, winograd=True).nodes]
    assert "PolycWinogradInput" not in ops and "PolycConvNHWC" in ops
