"""Channel-last convolutions (frontend/onnx_layout.py), pointwise inlining
(polyc/inline.py) and the register tile fitted to small extents
(register_tile.fit_shape, optimize._fit_panel): results against onnxruntime / numpy on
sizes that are not multiples of any tile, and the structure each one promises."""
from __future__ import annotations

import re
import warnings

import numpy as np
import onnx
import pytest
from conftest import assert_matches_numpy, random_inputs
from onnx import TensorProto, helper, numpy_helper
from onnx_models import onnxruntime_outputs

import polyc
from polyc import expr as E
from polyc import model as model_module
from polyc import pipeline
from polyc.errors import PolycWarning
from polyc.frontend import from_tc
from polyc.frontend.onnx_layout import CONV_NHWC
from polyc.inline import inline_pointwise
from polyc.model import lower_onnx
from polyc.schedule import machine, optimize, register_tile

pytestmark = pytest.mark.filterwarnings("error::polyc.errors.PolycWarning")


def _conv_model(c: int, m: int, h: int, w: int, k: int, stride: int, pad: int,
                residual: bool = True, bias: bool = True, seed: int = 0) -> onnx.ModelProto:
    """Conv(+bias) -> Add(residual from a second input) -> Relu, weights as initializers."""
    rng = np.random.default_rng(seed)
    oh, ow = (h + 2 * pad - k) // stride + 1, (w + 2 * pad - k) // stride + 1
    inits = [numpy_helper.from_array((rng.standard_normal((m, c, k, k)) * 0.2)
                                     .astype(np.float32), "W")]
    conv_in = ["x", "W"]
    if bias:
        inits.append(numpy_helper.from_array(rng.standard_normal(m).astype(np.float32), "B"))
        conv_in.append("B")
    nodes = [helper.make_node("Conv", conv_in, ["c"], pads=[pad] * 4, strides=[stride] * 2)]
    ins = [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, c, h, w])]
    last = "c"
    if residual:
        nodes.append(helper.make_node("Add", ["c", "r"], ["a"]))
        ins.append(helper.make_tensor_value_info("r", TensorProto.FLOAT, [1, m, oh, ow]))
        last = "a"
    nodes.append(helper.make_node("Relu", [last], ["y"]))
    g = helper.make_graph(nodes, "conv", ins,
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, m, oh, ow])],
                          inits)
    model = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    return model


def _feeds(model: onnx.ModelProto, seed: int = 1) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    out = {}
    for vi in model.graph.input:
        shape = [d.dim_value for d in vi.type.tensor_type.shape.dim]
        out[vi.name] = rng.standard_normal(shape).astype(np.float32)
    return out


def _check_against_onnxruntime(model: onnx.ModelProto, cache: str, winograd: bool = True
                               ) -> None:
    """polyc's output equals onnxruntime's, compiled for 1 and for 2 threads."""
    feeds = _feeds(model)
    want = onnxruntime_outputs(model, feeds)[0]
    for threads in (1, 2):
        m = polyc.compile_onnx(model, options=polyc.Options(threads=threads, cache_dir=cache,
                                                            winograd=winograd))
        np.testing.assert_allclose(m.run(None, feeds)[0], want, rtol=1e-4, atol=1e-4)


# (C, M, H, W, k, stride, pad): narrow outputs, strides, 1x1 and 3x3, odd extents that
# leave partial register tiles (M=48 is 3 vectors; W=9 gives 9 or 5 output columns)
SHAPES = [
    (16, 32, 7, 7, 3, 1, 1),
    (32, 48, 9, 11, 3, 2, 1),
    (16, 64, 13, 13, 1, 2, 0),
    (32, 16, 5, 9, 1, 1, 0),
    (16, 32, 40, 40, 3, 2, 1),  # wide input, strided: channel-last too
    (24, 32, 6, 6, 2, 1, 0),
    (16, 192, 7, 9, 3, 1, 1),  # three weight blocks of 64 output channels
    (20, 80, 6, 5, 3, 2, 1),  # five blocks of 16
    (24, 144, 9, 13, 1, 1, 0),  # three blocks of 48 (MobileNetV2's expand convs)
    (16, 96, 5, 11, 3, 1, 1),  # two blocks of 48
    # fewer input channels than a vector, on outputs narrower than one: LeNet-5's second
    # conv (6 channels, 5x5, 10 columns), a strided stem, one input channel
    (6, 16, 14, 14, 5, 1, 0),
    (3, 32, 20, 20, 3, 2, 1),
    (1, 32, 11, 13, 3, 1, 1),
]


@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "x".join(map(str, s)))
@pytest.mark.parametrize("residual", [True, False])
def test_channel_last_conv_matches_onnxruntime(shape, residual, tmp_cache):
    """Direct (``winograd=False``): every shape runs channel-last."""
    model = _conv_model(*shape, residual=residual, bias=residual)
    program = lower_onnx(model, options=polyc.Options(winograd=False))
    convs = [s for s in program.steps if any("v_yt" == a.name for a in s.kernel.arrays)]
    assert convs, "the conv was expected to run channel-last"
    _check_against_onnxruntime(model, tmp_cache, winograd=False)


@pytest.mark.parametrize("shape", [(3, 16, 16, 16, 1, 1, 0), (8, 24, 9, 17, 1, 1, 0)],
                         ids=lambda s: "x".join(map(str, s)))
@pytest.mark.parametrize("residual", [True, False])
def test_pointwise_conv_runs_as_a_flat_matmul(shape, residual, tmp_cache):
    """1x1 unit-stride convs left NCHW (fewer input channels than a vector) over >= 128
    pixels read the input as (N, C, H*W) (a view: the buffer bound to a kernel
    parameter of another shape) and write in one pass."""
    model = _conv_model(*shape, residual=residual, bias=residual)
    (step,) = lower_onnx(model).steps
    assert any(a.name.startswith("v_yf") for a in step.kernel.arrays)
    bound = dict(zip(step.args, step.kernel.inputs + step.kernel.outputs))
    assert len(step.kernel.array(bound["x"]).shape) == 3  # x read as (N, C, H*W)
    _check_against_onnxruntime(model, tmp_cache)


@pytest.mark.parametrize("shape", [(8, 32, 23, 25, 1, 2, 0), (8, 16, 40, 31, 1, 3, 0)],
                         ids=lambda s: "x".join(map(str, s)))
@pytest.mark.parametrize("residual", [True, False])
def test_strided_pointwise_conv_subsamples_then_runs_flat(shape, residual, tmp_cache):
    """A strided 1x1 conv over >= 128 output pixels copies the pixels it reads (a Slice
    with steps, its own step) and then runs as the flat matmul over them."""
    model = _conv_model(*shape, residual=residual, bias=residual)
    sub, conv = lower_onnx(model).steps
    assert any("subsample" in o for o in sub.origin)
    assert any(a.name.startswith("v_yf") for a in conv.kernel.arrays)
    _check_against_onnxruntime(model, tmp_cache)


def test_few_channel_convs_stay_nchw():
    """Fewer input channels than a vector in a 1x1 conv or on fewer output channels
    than a vector, or output channels no block fits."""
    for shape in [(8, 32, 9, 9, 1, 1, 0), (3, 8, 40, 40, 3, 2, 1), (16, 1000, 3, 3, 1, 1, 0)]:
        program = lower_onnx(_conv_model(*shape, residual=False))
        assert not any(a.name == "v_yt" for s in program.steps for a in s.kernel.arrays), shape


def _stem_model(attrs: dict, m: int = 24, then_conv: bool = True) -> onnx.ModelProto:
    """Conv over 3 channels (a stem) -> Clip -> (a 3x3 Conv over its ``m`` channels)."""
    rng = np.random.default_rng(5)
    w = (rng.standard_normal((m, 3, 7, 5)) * 0.2).astype(np.float32)
    w2 = (rng.standard_normal((16, m, 3, 3)) * 0.2).astype(np.float32)
    nodes = [helper.make_node("Conv", ["x", "W", "B"], ["c"], **attrs),
             helper.make_node("Clip", ["c", "lo", "hi"], ["r" if then_conv else "y"])]
    if then_conv:
        nodes.append(helper.make_node("Conv", ["r", "W2"], ["y"], pads=[1] * 4))
    g = helper.make_graph(nodes, "stem",
                          [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3, 37, 41])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
                          [numpy_helper.from_array(w, "W"), numpy_helper.from_array(w2, "W2"),
                           numpy_helper.from_array(rng.standard_normal(m).astype(np.float32), "B"),
                           numpy_helper.from_array(np.float32(0), "lo"),
                           numpy_helper.from_array(np.float32(6), "hi")])
    model = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    return model


STEM_ATTRS = [dict(strides=[2, 2], pads=[3, 3, 3, 3]),
              dict(strides=[3, 2], pads=[1, 2, 0, 1], dilations=[2, 2]),
              dict(strides=[1, 2], pads=[0, 1, 2, 0])]


@pytest.mark.parametrize("then_conv", [True, False])
@pytest.mark.parametrize("attrs", STEM_ATTRS)
def test_stem_runs_channel_last_from_its_nchw_input(attrs, then_conv, tmp_cache):
    """A stem (3 input channels, a vector of output channels that block) runs
    channel-last reading the caller's NCHW input in place: no transposition of the
    input, and none between it and the channel-last conv after it."""
    model = _stem_model(attrs, then_conv=then_conv)
    program = lower_onnx(model, options=polyc.Options(winograd=False))
    stem = program.steps[0]
    assert any(a.name == "v_yt" for a in stem.kernel.arrays)
    bound = dict(zip(stem.args, stem.kernel.inputs + stem.kernel.outputs))
    assert [d.value for d in stem.kernel.array(bound["x"]).shape] == [2, 3, 37, 41]
    convs = [s for s in program.steps if any(a.name == "v_yt" for a in s.kernel.arrays)]
    assert len(program.steps) == len(convs) + 1  # and the graph output's transposition
    assert program.steps[-1].args[-1] == "y" and program.steps[-1] not in convs
    _check_against_onnxruntime(model, tmp_cache, winograd=False)
    _check_against_onnxruntime(model, tmp_cache)


def test_layout_pass_transposes_the_weights_once():
    from polyc.frontend.onnx_import import load_graph
    from polyc.frontend.onnx_passes import optimize_graph
    model = _conv_model(16, 32, 7, 7, 3, 1, 1)
    stats: dict[str, int] = {}
    g = optimize_graph(load_graph(model), stats)
    conv = next(n for n in g.nodes if n.op_type == CONV_NHWC)
    assert stats["conv_channels_last"] == 1
    w = numpy_helper.to_array(model.graph.initializer[0])
    # blocked (M / MB, KH, KW, C, MB): 32 output channels make one block of 32
    np.testing.assert_array_equal(g.constants[conv.inputs[1]],
                                  w.transpose(2, 3, 1, 0)[None])
    assert "W" not in g.constants  # the NCHW weights are gone


@pytest.mark.parametrize("m,block", [(16, 16), (48, 48), (96, 48), (144, 48), (160, 32),
                                     (128, 64), (2048, 64), (80, 16), (24, 24), (40, 40)])
def test_blocked_weights(m, block):
    from polyc.frontend.onnx_layout import blocked_weights, channel_block
    assert channel_block(m) == block
    w = np.random.default_rng(0).standard_normal((m, 5, 3, 2)).astype(np.float32)
    b = blocked_weights(w)
    assert b.shape == (m // block, 3, 2, 5, block)
    for mm in (0, block - 1, m - 1):
        np.testing.assert_array_equal(b[mm // block, :, :, :, mm % block],
                                      w[mm].transpose(1, 2, 0))


def test_epilogue_is_one_statement():
    """Bias and Relu become one pass after the contraction."""
    program = lower_onnx(_conv_model(16, 32, 7, 7, 3, 1, 1, residual=False),
                         options=polyc.Options(winograd=False))
    (step,) = [s for s in program.steps if any(a.name == "v_yt" for a in s.kernel.arrays)]
    last = step.kernel.statements[-1]
    assert "relu" in str(last.value) and last.write.array == step.kernel.outputs[0]
    # the padded copy-in (its inside and its pad: polyc.guards), init, update, epilogue
    assert len(step.kernel.statements) == 5
    assert step.kernel.statements[1].name == step.kernel.statements[0].name + "_pad"


CHAIN = """
def chain(float(N,M) A, float(M) B, float(N,M) R) -> (Z) {
    T(n,m) = A(n,m) + B(m)
    T(n,m) = T(n,m) * 2.0
    U(n,m) = R(n,m) + T(n,m)
    Z(n,m) = fmax(U(n,m), 0.0)
}"""


def test_inline_chain_matches_numpy():
    k = from_tc(CHAIN)
    inlined = inline_pointwise(k)
    assert len(inlined.statements) == 1 and not inlined.temporaries
    xs = random_inputs([((13, 29), "float32"), ((29,), "float32"), ((13, 29), "float32")])
    got = polyc.Operator(inlined)(*xs)
    assert_matches_numpy(got, np.maximum(xs[2] + (xs[0] + xs[1]) * 2.0, 0.0))


@pytest.mark.parametrize("src", [
    # T read twice by later statements: kept
    """def f(float(N) A) -> (Y, Z) {
        T(i) = A(i) * 2.0
        Y(i) = T(i) + 1.0
        Z(i) = T(i) - 1.0
    }""",
    # T broadcast: each element read M times, kept
    """def f(float(N) A, float(M) B) -> (Y) {
        T(i) = A(i) * 2.0
        Y(i,j) = T(i) + B(j)
    }""",
    # a reduction reads T many times per element: inlining would recompute it
    """def f(float(N,K) A, float(K,M) B) -> (Y) {
        T(k,m) = B(k,m) * 2.0
        Y(n,m) +=! A(n,k) * T(k,m)
    }""",
    # A, which T's value reads, is overwritten before the reader
    """def f(float(N) X) -> (Y, A) {
        A(i) = X(i)
        T(i) = A(i) * 2.0
        A(i) = 0.0
        Y(i) = T(i)
    }""",
])
def test_inline_keeps_what_it_must(src):
    k = from_tc(src)
    before = len(k.statements)
    inlined = inline_pointwise(k)
    t_kept = any(s.write.array == "T" for s in inlined.statements)
    assert t_kept, f"T was inlined: {len(inlined.statements)} of {before} statements left"


def test_inline_through_a_shifted_read():
    src = """def f(float(N) A) -> (Y) {
        T(i) = A(i) * 2.0 where i in 0:N
        Y(i) = T(i + 1) where i in 0:N-1
    }"""
    inlined = inline_pointwise(from_tc(src))
    assert len(inlined.statements) == 1
    x = random_inputs([((19,), "float32")])[0]
    assert_matches_numpy(polyc.Operator(inlined)(x), 2 * x[1:])


def test_inline_keeps_results_of_kept_cases():
    src = """def f(float(N) X) -> (Y, A) {
        A(i) = X(i)
        T(i) = A(i) * 2.0
        A(i) = 0.0
        Y(i) = T(i)
    }"""
    x = random_inputs([((17,), "float32")])[0]
    y, a = polyc.Operator(inline_pointwise(from_tc(src)))(x)
    assert_matches_numpy(y, 2 * x)
    assert_matches_numpy(a, np.zeros_like(x))


@pytest.mark.parametrize("ext_u, ext_v, want", [
    (7, 512, (7, 64)), (14, 512, (7, 64)), (28, 2048, (7, 64)), (56, 64, (8, 64)),
    (1024, 1024, (8, 64)), (37, 1024, (8, 64)), (3, 512, (3, 64)),
    (32, 32, (16, 32)), (8, 16, (8, 16)), (None, 16, (8, 16)), (100, None, (8, 64)),
])
def test_fit_shape(ext_u, ext_v, want):
    assert register_tile.fit_shape(8, 64, 16, ext_u, ext_v) == want


@pytest.mark.parametrize("ext_u, ext_v, want", [
    (7, 512, (7, 64)), (14, 512, (7, 64)), (56, 64, (7, 64)), (49, 256, (7, 64)),
    (1024, 1024, (6, 64)), (128, 768, (6, 64)), (5, 512, (5, 64)), (None, 512, (6, 64)),
    (32, 32, (13, 32)), (8, 16, (8, 16)),
])
def test_fit_shape_spill_free(ext_u, ext_v, want):
    """The AVX-512 machine shape 6 x 64 (24 accumulators, 4 column vectors and a
    broadcast: 29 of 32 registers): 7 rows only where 7 divides the rows, narrower
    columns give their registers to rows."""
    assert register_tile.fit_shape(6, 64, 16, ext_u, ext_v) == want


def test_machine_shape_fits_the_registers():
    mr, nr = register_tile.machine_shape("float32", polyc.Options())
    lanes = register_tile.vector_bits() // 32
    nv = nr // lanes
    assert mr * nv + nv + 1 <= register_tile.vector_registers() < (mr + 1) * nv + nv + 1


def test_panel_fits_l2_and_matmul_keeps_its_tiles(monkeypatch, avx512_model):
    monkeypatch.setattr(optimize.machine, "l2_bytes", lambda: 1 << 20)
    monkeypatch.setattr(optimize.machine, "l1d_bytes", lambda: 32 << 10)
    mm = from_tc("def mm(float(M,K) A, float(K,N) B) -> (C) { C(m,n) +=! A(m,k) * B(k,n) }")
    s = pipeline.schedule_kernel(mm.specialize(dict(M=1024, K=1024, N=1024)),
                                 polyc.Options()).schedule
    # the whole reduction (a 1024-step chunk) by 128 columns: B's 512 KB panel is half
    # of a 1 MB L2
    assert "mod 1024" in str(s) and "mod 128" in str(s), str(s)
    conv = from_tc("""def c(float(1,9,9,512) X, float(3,3,512,512) W) -> (Y) {
        Y(n,h,w,m) +=! X(n,h+kh,w+kw,c) * W(kh,kw,c,m)
    }""").specialize({})
    s = str(pipeline.schedule_kernel(conv, polyc.Options()).schedule)
    conv_part = s.split('filter: "{ S1')[-1]  # (the init's filter gone: a whole sum)
    assert "(m - (m) mod 64)" in conv_part and "(m - (m) mod 512)" not in conv_part


def test_deep_panel_splits_its_reduction(monkeypatch, avx512_model):
    """A 3x3 convolution over 512 channels at 64 columns has a 1.2 MB panel, over half
    a 1 MB L2 however narrow its columns: its channels are cut into balanced tiles
    (3 x 171) so that the panel fits; a matmul's 1024-step chunk is left as it was."""
    monkeypatch.setattr(optimize.machine, "l2_bytes", lambda: 1 << 20)
    monkeypatch.setattr(optimize.machine, "l1d_bytes", lambda: 48 << 10)
    conv = from_tc("""def c(float(1,9,9,512) X, float(3,3,512,512) W) -> (Y) {
        Y(n,h,w,m) +=! X(n,h+kh,w+kw,c) * W(kh,kw,c,m)
    }""").specialize({})
    s = str(pipeline.schedule_kernel(conv, polyc.Options()).schedule)
    assert "(c) mod 171" in s and "(m - (m) mod 64)" in s, s
    monkeypatch.setattr(optimize, "FIT_DEPTH", False)
    assert "(c) mod" not in str(pipeline.schedule_kernel(conv, polyc.Options()).schedule)


_SPLIT_CONV = """def c(float(2,8,7,40) X, float(3,3,40,37) W) -> (Y) {
    Y(n,h,w,m) +=! X(n,h+kh,w+kw,c) * W(kh,kw,c,m)
}"""


@pytest.mark.parametrize("opts", [{}, {"threads": 2}, {"scheduler": "pluto"}])
def test_split_reduction_matches_numpy(opts, monkeypatch):
    """With an L2 of 16 KB the conv's 40 channels are cut into partial tiles: the sums,
    the accumulators copied in and out per tile, match numpy (the CUDA target too)."""
    monkeypatch.setenv("POLYC_L2_BYTES", str(16 << 10))
    machine.l2_bytes.cache_clear()
    try:
        op = polyc.define(_SPLIT_CONV, **opts)
        x, w = random_inputs([((2, 8, 7, 40), "float32"), ((3, 3, 40, 37), "float32")], 5)
        want = np.zeros((2, 6, 5, 37), np.float32)
        for kh in range(3):
            for kw in range(3):
                want += np.einsum("nhwc,cm->nhwm", x[:, kh:kh + 6, kw:kw + 5], w[kh, kw])
        assert_matches_numpy(op(x, w), want, rtol=1e-4, atol=1e-4)
        assert "polyc_acc" in op.c_source and "(c) mod" in str(op.schedule)
        if not opts:  # the CUDA target too (emulated)
            cuda = polyc.define(_SPLIT_CONV, target="cuda", emulate=True)
            assert_matches_numpy(cuda(x, w), want, rtol=1e-4, atol=1e-4)
    finally:
        monkeypatch.delenv("POLYC_L2_BYTES")
        machine.l2_bytes.cache_clear()


@pytest.mark.parametrize("batch", [1, 5])
def test_gemm_with_constant_transposed_b_is_stored_transposed(batch, tmp_cache):
    from polyc.frontend.onnx_import import load_graph
    from polyc.frontend.onnx_passes import optimize_graph
    rng = np.random.default_rng(3)
    w = rng.standard_normal((37, 53)).astype(np.float32)
    c = rng.standard_normal(37).astype(np.float32)
    node = helper.make_node("Gemm", ["x", "W", "C"], ["y"], transB=1, alpha=0.5, beta=2.0)
    g = helper.make_graph([node], "fc",
                          [helper.make_tensor_value_info("x", TensorProto.FLOAT, [batch, 53])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [batch, 37])],
                          [numpy_helper.from_array(w, "W"), numpy_helper.from_array(c, "C")])
    model = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    stats: dict[str, int] = {}
    graph = optimize_graph(load_graph(model), stats)
    gemm = graph.nodes[0]
    assert stats["gemm_transposed"] == 1 and gemm.attrs["transB"] == 0
    np.testing.assert_array_equal(graph.constants[gemm.inputs[1]], w.T)
    feeds = _feeds(model)
    got = polyc.compile_onnx(model, options=polyc.Options(cache_dir=tmp_cache)).run(None, feeds)
    np.testing.assert_allclose(got[0], onnxruntime_outputs(model, feeds)[0], rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("attrs", STEM_ATTRS)
def test_strided_conv_reads_phase_planes(attrs, tmp_cache):
    """A strided conv that stays NCHW (few input channels, fewer output channels than a
    vector) splits its padded input into stride x stride phase planes: unit-stride
    reads along the output row."""
    rng = np.random.default_rng(5)
    w = (rng.standard_normal((8, 3, 7, 5)) * 0.2).astype(np.float32)
    node = helper.make_node("Conv", ["x", "W"], ["y"], **attrs)
    g = helper.make_graph([node], "stem",
                          [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3, 37, 41])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
                          [numpy_helper.from_array(w, "W")])
    model = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    (step,) = lower_onnx(model).steps
    assert any(a.name.startswith("v_xphase") for a in step.kernel.arrays)
    _check_against_onnxruntime(model, tmp_cache)


def test_split_for_threads_gives_the_parallel_loop_work():
    reg = register_tile.Plan("S", "Y", u=2, v=3, mr=7, nr=64, box=(1, 1, 7, 64))
    flags = [True, True, True, True, False]
    # one 28-row tile, one 512-channel panel: the longest member is cut in two
    got = optimize._split_for_threads([32, 32, 35, 512, 256], [1, 28, 28, 512, 256],
                                      flags, reg, 2)
    assert got == [32, 32, 35, 256, 256]
    # already two tiles somewhere: unchanged; one thread: unchanged
    same = [32, 16, 35, 512, 256]
    assert optimize._split_for_threads(same, [1, 28, 28, 512, 256], flags, reg, 2) == same
    assert optimize._split_for_threads([32, 32, 35, 512, 256], [1, 28, 28, 512, 256],
                                       flags, reg, 1) == [32, 32, 35, 512, 256]
    # the register tile's row member is cut in whole register tiles (28 rows, 7 a tile:
    # 14 + 14; 30 rows in tiles of 9: 18 + 12, 1.2x an even share), unless those are too
    # uneven (20 rows in tiles of 7: 14 + 6 is 1.4x an even share, so 10 + 10)
    plan = lambda mr: register_tile.Plan("S", "Y", 0, 1, mr, 16, (mr, 16))  # noqa: E731
    assert optimize._split_for_threads([64, 64], [28, 20], [True, True], plan(7), 2) == [14, 64]
    assert optimize._split_for_threads([64, 64], [30, 20], [True, True], plan(9), 2) == [18, 64]
    assert optimize._split_for_threads([64, 64], [20, 20], [True, True], plan(7), 2) == [10, 64]


def test_parallel_tiles_are_balanced():
    """The parallel member's tiles: a multiple of the threads, of one size, in whole
    register tiles (MobileNetV2's 56 rows in tiles of 32 left one thread 24 rows)."""
    reg = register_tile.Plan("S", "Y", u=2, v=3, mr=14, nr=16, box=(1, 1, 14, 16))
    extents = [56, 1, 56, 144, 24]
    assert optimize._balanced([32, 1, 56, 16, 24], extents, 0, reg, 2) == [28, 1, 56, 16, 24]
    # 28 rows in 16 + 12: 14 + 14; tiles already even: unchanged; one thread: unchanged
    assert optimize._balanced([16, 1, 56, 16, 24], [28] + extents[1:], 0, reg, 2)[0] == 14
    assert optimize._balanced([14, 1, 56, 16, 24], [28] + extents[1:], 0, reg, 2)[0] == 14
    assert optimize._balanced([32, 1, 56, 16, 24], extents, 0, reg, 1)[0] == 32
    # the register tile's rows stay whole: 56 columns in tiles of 42 become 28 + 28
    got = optimize._balanced([1, 1, 42, 16, 24], [1, 1, 56, 144, 24], 2, reg, 2)
    assert got[2] == 28
    assert optimize._balanced([32, 1, 56, 16, 24], extents, None, reg, 2)[0] == 32
    # nine channel blocks in tiles of two: 6 + 3 blocks under the static schedule;
    # tiles of one block give 5 + 4 (MobileNetV2's 576-channel 1x1 convolution)
    assert optimize._balanced([2, 14, 14], [9, 14, 14], 0, None, 2)[0] == 1
    assert optimize._busiest_share(9, 2, 2) == 6 and optimize._busiest_share(9, 1, 2) == 5
    flags = [True, True, True, True, False]
    assert optimize._default_member([32, 1, 56, 16, 24], extents, flags) == 0
    assert optimize._default_member([56, 1, 14, 16, 24], extents, flags) == 3


@pytest.mark.parametrize("m,serial_split", [(64, "columns"), (1024, "rows")])
def test_threads_split_the_member_that_shares_least(m, serial_split, tmp_cache):
    """A MatMul of a 64-row batch by a 784 x 512 constant: the threads split the column
    blocks (each thread reads half the weights and all of the small input), not the rows
    (each thread would stream all the weights); with 1024 rows they split the rows.
    Both match numpy."""
    k, n = 96, 512
    rng = np.random.default_rng(0)
    w = (rng.standard_normal((k, n)) * 0.1).astype(np.float32)
    g = helper.make_graph([helper.make_node("MatMul", ["x", "W"], ["y"])], "mm",
                          [helper.make_tensor_value_info("x", TensorProto.FLOAT, [m, k])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [m, n])],
                          [numpy_helper.from_array(w, "W")])
    model = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    x = rng.standard_normal((m, k)).astype(np.float32)
    c = polyc.compile_onnx(model, options=polyc.Options(threads=2, cache_dir=tmp_cache))
    np.testing.assert_allclose(c(x)[0], x @ w, rtol=1e-4, atol=1e-4)
    import re
    head = re.search(r"omp parallel for num_threads\(2\)\n\s*for \(int64_t c0 = 0; c0 <= (\d+);",
                     c.c_source)
    assert head is not None
    blocks = n // model_module._widest_block(polyc.Options())  # (this CPU's column blocks)
    assert int(head.group(1)) == ({"columns": blocks, "rows": m}[serial_split] - 1)


@pytest.mark.parametrize("cut", [True, False])
def test_threads_cut_a_one_tile_member_that_shares_least(cut, tmp_cache, monkeypatch):
    """A channel-last 1x1 conv over a 28x28 output, 128 -> 512 channels (ResNet-50's
    res3): its 28 rows are one cache tile. Cut for the threads (``CUT_TO_SHARE_LEAST``),
    each thread reads the input rows it writes and all 256 KB of weights; otherwise the
    threads split the eight channel blocks and each reads all 400 KB of input. Both
    match onnxruntime."""
    monkeypatch.setattr(optimize, "CUT_TO_SHARE_LEAST", cut)
    model = _conv_model(128, 512, 28, 28, 1, 1, 0, residual=False)
    feeds = _feeds(model)
    want = onnxruntime_outputs(model, feeds)[0]
    m = polyc.compile_onnx(model, options=polyc.Options(threads=2, cache_dir=tmp_cache,
                                                         winograd=False))
    np.testing.assert_allclose(m.run(None, feeds)[0], want, rtol=1e-4, atol=1e-4)
    src = open(m.library_path[:-3] + ".c").read()
    conv = next(k for k in src.split("Generated by polyc from kernel")[1:] if "polyc_acc[" in k)
    head = re.search(r"omp parallel for[^\n]*\n\s*for \(int64_t c0 = 0; c0 <= (\d+); "
                     r"c0 \+= (\d+)\)", conv)
    assert head is not None
    if cut:  # the rows, 14 + 14
        assert head.groups() == ("27", "14"), head.group(0)
    else:  # the channel blocks (8 of 64 channels on AVX-512, 32 of 16 on AVX2)
        blocks = 512 // model_module._widest_block(polyc.Options())
        assert head.group(1) == str(blocks - 1), head.group(0)


def test_split_for_threads_skips_a_member_it_cannot_cut():
    """A 32-channel vector member is one register tile wide: the rows are cut instead."""
    reg = register_tile.Plan("S", "Y", u=2, v=3, mr=8, nr=32, box=(1, 1, 8, 32))
    got = optimize._split_for_threads([32, 32, 32, 32, 256], [1, 8, 8, 32, 288],
                                      [True, True, True, True, False], reg, 2)
    assert got == [32, 4, 32, 32, 256]


# -- channel-last activations between convolutions -------------------------------------------

def _block_model(c: int, hidden: int, h: int, w: int, stride: int, residual: bool,
                 dilation: int = 1, seed: int = 0) -> onnx.ModelProto:
    """A MobileNetV2 block: 1x1 expansion + Clip(0, 6), 3x3 depthwise (stride, pad 1,
    dilation) + Clip, 1x1 projection, residual Add when ``residual``; then a Relu."""
    rng = np.random.default_rng(seed)

    def weight(name, shape):
        return numpy_helper.from_array((rng.standard_normal(shape) * 0.3).astype(np.float32), name)
    inits = [weight("We", (hidden, c, 1, 1)), weight("Be", (hidden,)),
             weight("Wd", (hidden, 1, 3, 3)), weight("Bd", (hidden,)),
             weight("Wp", (c, hidden, 1, 1)), weight("Bp", (c,)),
             numpy_helper.from_array(np.array(0, np.float32), "lo"),
             numpy_helper.from_array(np.array(6, np.float32), "hi")]
    pad = dilation
    nodes = [helper.make_node("Conv", ["x", "We", "Be"], ["e"]),
             helper.make_node("Clip", ["e", "lo", "hi"], ["ec"]),
             helper.make_node("Conv", ["ec", "Wd", "Bd"], ["d"], group=hidden,
                              strides=[stride] * 2, pads=[pad] * 4, dilations=[dilation] * 2),
             helper.make_node("Clip", ["d", "lo", "hi"], ["dc"]),
             helper.make_node("Conv", ["dc", "Wp", "Bp"], ["p"])]
    last = "p"
    if residual:
        nodes.append(helper.make_node("Add", ["x", "p"], ["a"]))
        last = "a"
    nodes.append(helper.make_node("Relu", [last], ["y"]))
    oh, ow = (h - 1) // stride + 1, (w - 1) // stride + 1
    g = helper.make_graph(nodes, "block",
                          [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, c, h, w])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, c, oh, ow])],
                          inits)
    model = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    return model


@pytest.mark.parametrize("c,hidden,h,w,stride,residual,dilation", [
    (16, 96, 9, 11, 1, True, 1),
    (24, 144, 7, 7, 2, False, 1),
    (16, 40, 13, 6, 2, False, 1),    # 40 output channels: one block of 40
    (32, 48, 10, 9, 1, True, 2),     # dilated depthwise
], ids=str)
def test_channel_last_block_matches_onnxruntime(c, hidden, h, w, stride, residual, dilation,
                                                tmp_cache):
    """Every Conv of the block runs channel-last (the depthwise one too); the only
    transpositions left are at the graph's input and output."""
    from polyc.frontend.onnx_import import load_graph
    from polyc.frontend.onnx_passes import optimize_graph
    model = _block_model(c, hidden, h, w, stride, residual, dilation)
    g = optimize_graph(load_graph(model))
    ops = [n.op_type for n in g.nodes]
    assert ops.count(CONV_NHWC) == 3 and ops.count("Transpose") == 2, ops
    _check_against_onnxruntime(model, tmp_cache)


def _graph(nodes, inputs, outputs, shapes):
    from polyc.frontend.onnx_graph import Graph, TensorInfo
    return Graph("g", tuple(nodes), tuple(inputs), tuple(outputs),
                 {t: TensorInfo(t, "float32", s) for t, s in shapes.items()}, {})


def test_sink_transposes_cancels_and_composes():
    from polyc.frontend.onnx_graph import Node
    from polyc.frontend.onnx_layout import sink_transposes
    shapes = {"x": (1, 2, 3, 4), "t": (1, 3, 4, 2), "r": (1, 3, 4, 2), "b": (1, 2, 3, 4),
              "s": (1,), "m": (1, 3, 4, 2), "u": (1, 2, 3, 4), "v": (4, 3, 2, 1)}
    nodes = [Node("a", "Transpose", ("x",), ("t",), {"perm": [0, 2, 3, 1]}),
             Node("relu", "Relu", ("t",), ("r",)),
             Node("mul", "Mul", ("r", "s"), ("m",)),            # a scalar operand
             Node("back", "Transpose", ("m",), ("u",), {"perm": [0, 3, 1, 2]}),
             Node("rev", "Transpose", ("m",), ("v",), {"perm": [2, 1, 3, 0]})]
    g = sink_transposes(_graph(nodes, ["x", "s"], ["u", "v"], shapes))
    by_out = {n.outputs[0]: n for n in g.nodes}
    # Relu and Mul run on x itself; u is then a transposition of nothing: an identity
    # of a graph output is kept as a Transpose by the identity perm
    assert by_out["u"].op_type == "Transpose" and by_out["u"].attrs["perm"] == [0, 1, 2, 3]
    # v composes both perms into one Transpose of the Mul's NCHW result
    assert by_out["v"].op_type == "Transpose" and by_out["v"].attrs["perm"] == [3, 2, 1, 0]
    mul = next(n for n in g.nodes if n.op_type == "Mul")
    assert g.tensors[mul.outputs[0]].shape == (1, 2, 3, 4)


def test_sink_transposes_leaves_broadcasts_alone():
    from polyc.frontend.onnx_graph import Node
    from polyc.frontend.onnx_layout import sink_transposes
    shapes = {"x": (1, 2, 3, 4), "t": (1, 3, 4, 2), "c": (2,), "y": (1, 3, 4, 2)}
    nodes = [Node("a", "Transpose", ("x",), ("t",), {"perm": [0, 2, 3, 1]}),
             Node("add", "Add", ("t", "c"), ("y",))]  # c broadcasts along the last axis
    g = sink_transposes(_graph(nodes, ["x", "c"], ["y"], shapes))
    assert [n.op_type for n in g.nodes] == ["Transpose", "Add"]


@pytest.mark.parametrize("multiplier, sinks", [((2,), True), ((1,), True), ((3,), False)],
                         ids=["per-channel", "scalar", "other-length"])
def test_sink_transposes_through_a_requantization(multiplier, sinks):
    """PolycRequantize of a transposition from channel-last runs channel-last
    (``polyc_layout`` nhwc, its multiplier then indexing the last axis) when its other
    inputs are scalars or vectors along the channels; a vector of another length keeps
    the Transpose above it."""
    from polyc.frontend.onnx_graph import Node
    from polyc.frontend.onnx_layout import sink_transposes
    shapes = {"x": (1, 3, 4, 2), "t": (1, 2, 3, 4), "k": multiplier, "y": (1, 2, 3, 4)}
    nodes = [Node("a", "Transpose", ("x",), ("t",), {"perm": [0, 3, 1, 2]}),
             Node("q", "PolycRequantize", ("t", "k", "", "", ""), ("y",),
                  {"polyc_multiplier": 1})]
    g = sink_transposes(_graph(nodes, ["x", "k"], ["y"], shapes))
    q = next(n for n in g.nodes if n.op_type == "PolycRequantize")
    if sinks:
        assert q.inputs[0] == "x" and q.attrs["polyc_layout"] == "nhwc"
        assert g.tensors[q.outputs[0]].shape == (1, 3, 4, 2)
        assert [n.op_type for n in g.nodes] == ["Transpose", "PolycRequantize", "Transpose"]
    else:
        assert q.inputs[0] == "t" and "polyc_layout" not in q.attrs


def test_sink_transposes_with_a_transposed_scalar_operand():
    """Add(Transpose(s), Transpose(v)) with s all ones: the sunk Add has v's shape
    (review: it took the first transposed operand's, the scalar's)."""
    rng = np.random.default_rng(0)
    nodes = [helper.make_node("Gemm", ["a", "WG"], ["g"], transB=1),  # makes the layout pass run
             helper.make_node("Transpose", ["v"], ["vt"], perm=[0, 2, 3, 1]),
             helper.make_node("Transpose", ["s"], ["st"], perm=[0, 2, 3, 1]),
             helper.make_node("Add", ["st", "vt"], ["z"])]
    io = helper.make_tensor_value_info
    g = helper.make_graph(nodes, "g", [io("a", TensorProto.FLOAT, [2, 4]),
                                       io("v", TensorProto.FLOAT, [1, 3, 4, 5]),
                                       io("s", TensorProto.FLOAT, [1, 1, 1, 1])],
                          [io("g", TensorProto.FLOAT, [2, 8]), io("z", TensorProto.FLOAT, [1, 4, 5, 3])],
                          [numpy_helper.from_array(rng.standard_normal((8, 4)).astype(np.float32),
                                                   "WG")])
    model = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    feeds = {"a": rng.standard_normal((2, 4)).astype(np.float32),
             "v": rng.standard_normal((1, 3, 4, 5)).astype(np.float32),
             "s": np.full((1, 1, 1, 1), 0.5, np.float32)}
    want = onnxruntime_outputs(model, feeds)
    got = polyc.compile_onnx(model).run(None, feeds)
    for g_, w_ in zip(got, want):
        np.testing.assert_allclose(g_, w_, rtol=1e-5, atol=1e-5)


def test_padded_pointwise_conv_with_a_relu(tmp_cache):
    """A padded 1x1 Conv then Relu: the Relu runs at the register tiles' copy-out and
    writes the output alone (review: storage sharing crashed on an output that only an
    epilogue writes)."""
    _check_against_onnxruntime(_conv_model(32, 32, 40, 40, 1, 1, 1, residual=False), tmp_cache)


def test_channel_last_block_on_cuda_emulation():
    """The same block through the CUDA target, run by the CPU emulation of the .cu."""
    model = _block_model(16, 96, 9, 11, 1, True)
    feeds = _feeds(model)
    want = onnxruntime_outputs(model, feeds)[0]
    m = polyc.compile_onnx(model, options=polyc.Options(target="cuda", emulate=True))
    np.testing.assert_allclose(m.run(None, feeds)[0], want, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("op,a_shape,n,extra", [
    ("MatMul", (37, 53), 130, {}),           # a partial last block (130 = 2 x 64 + 2)
    ("MatMul", (2, 3, 7, 29), 256, {}),      # batch dimensions, whole blocks
    ("Gemm", (19, 41), 100, dict(alpha=0.5, beta=2.0)),
    ("Gemm", (5, 70), 192, dict(transB=1)),  # transposed first, then blocked
    ("Gemm", (37, 53), 10, dict(transB=1)),  # 10 classes: one block of 16 columns
    ("MatMul", (2, 19, 29), 40, {}),         # one block of 48
])
def test_matmul_with_constant_b_runs_on_column_blocks(op, a_shape, n, extra, tmp_cache):
    """A MatMul (or a Gemm without transposes) with a constant B of more than 64
    columns reads B in column blocks (64, K, 64), one of fewer columns that are not
    whole cache lines in one block padded to whole lines (10 -> 16): against
    onnxruntime, on sizes that are not multiples of the block or of the register
    tile."""
    from polyc.frontend.onnx_import import load_graph
    from polyc.frontend.onnx_layout import COLUMN_BLOCK, MATMUL_BLOCKED, blocked_columns
    from polyc.frontend.onnx_passes import optimize_graph
    rng = np.random.default_rng(11)
    k = a_shape[-1]
    w = rng.standard_normal((n, k) if extra.get("transB") else (k, n)).astype(np.float32)
    inits = [numpy_helper.from_array(w, "W")]
    ins = ["x", "W"]
    if op == "Gemm":
        inits.append(numpy_helper.from_array(rng.standard_normal(n).astype(np.float32), "C"))
        ins.append("C")
    node = helper.make_node(op, ins, ["y"], **extra)
    g = helper.make_graph([node], "fc",
                          [helper.make_tensor_value_info("x", TensorProto.FLOAT, a_shape)],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)], inits)
    model = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    stats: dict[str, int] = {}
    graph = optimize_graph(load_graph(model), stats)
    blocked = [x for x in graph.nodes if x.op_type == MATMUL_BLOCKED]
    assert stats["matmul_blocked"] == 1 and len(blocked) == 1
    want_b = blocked_columns(w.T if extra.get("transB") else w)
    nb = COLUMN_BLOCK if n > COLUMN_BLOCK else -(-n // 16) * 16
    assert want_b.shape == (-(-n // nb), k, nb)
    np.testing.assert_array_equal(graph.constants[blocked[0].inputs[1]], want_b)
    _check_against_onnxruntime(model, tmp_cache)
    feeds = _feeds(model)
    want = onnxruntime_outputs(model, feeds)[0]
    options = [dict(scheduler="pluto"), dict(fusion="min"), dict(register_tile=False),
               dict(tile=False)]
    if op == "MatMul" and len(a_shape) == 2:  # isl gives up fusing all after 5 s (a warning)
        options.append(dict(fusion="max"))
    for opts in options:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", PolycWarning)
            m = polyc.compile_onnx(model, options=polyc.Options(cache_dir=tmp_cache, **opts))
        np.testing.assert_allclose(m.run(None, feeds)[0], want, rtol=1e-4, atol=1e-4)
    cuda = polyc.compile_onnx(model, target="cuda", emulate=True,  # the CUDA target too
                              options=polyc.Options(cache_dir=tmp_cache))
    np.testing.assert_allclose(cuda.run(None, feeds)[0], want, rtol=1e-4, atol=1e-4)


def test_blocked_columns_pads_the_last_block():
    b = np.arange(3 * 70, dtype=np.float32).reshape(3, 70)
    from polyc.frontend.onnx_layout import blocked_columns
    blocks = blocked_columns(b)
    assert blocks.shape == (2, 3, 64)
    np.testing.assert_array_equal(blocks[1, :, :6], b[:, 64:])
    assert not blocks[1, :, 6:].any()
    np.testing.assert_array_equal(blocks[0], b[:, :64])
    narrow = blocked_columns(b[:, :10])  # one block of whole cache lines
    assert narrow.shape == (1, 3, 16) and not narrow[0, :, 10:].any()
    np.testing.assert_array_equal(narrow[0, :, :10], b[:, :10])
    assert blocked_columns(b[:, :10].astype(np.float64)).shape == (1, 3, 16)
    assert blocked_columns(b[:, :8].astype(np.float64)).shape == (1, 3, 8)


@pytest.mark.parametrize("rows,n,blocked", [(3, 10, False), (16, 10, True), (64, 32, False)])
def test_narrow_columns_are_padded_over_enough_rows(rows, n, blocked):
    """A narrow constant B (not whole cache lines) is padded only under at least
    ``NARROW_ROWS_MIN`` rows of A (a matrix-vector product would stream more weight
    bytes for nothing); whole lines (32 floats) are left as they are."""
    from polyc.frontend.onnx_import import load_graph
    from polyc.frontend.onnx_layout import MATMUL_BLOCKED
    from polyc.frontend.onnx_passes import optimize_graph
    w = np.random.default_rng(1).standard_normal((24, n)).astype(np.float32)
    g = helper.make_graph([helper.make_node("MatMul", ["x", "W"], ["y"])], "fc",
                          [helper.make_tensor_value_info("x", TensorProto.FLOAT, [rows, 24])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
                          [numpy_helper.from_array(w, "W")])
    model = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    graph = optimize_graph(load_graph(model), {})
    assert any(x.op_type == MATMUL_BLOCKED for x in graph.nodes) == blocked


@pytest.mark.parametrize("attrs", [dict(strides=[2, 2], pads=[0, 2, 1, 0]),
                                   dict(strides=[1, 1], pads=[2, 1, 2, 1], dilations=[2, 1]),
                                   dict(strides=[3, 2], pads=[1, 1, 1, 1])])
def test_depthwise_conv_reads_its_padding_through_guards(attrs, tmp_cache):
    """A channel-last depthwise Conv reads its input in place, the padding as guards
    (no padded copy), its accumulators in a register tile (rows of output pixels
    sharing the tap's weights): asymmetric pads, strides and dilations, on every
    scheduler option, against onnxruntime."""
    rng = np.random.default_rng(9)
    c = 40
    w = (rng.standard_normal((c, 1, 3, 3)) * 0.3).astype(np.float32)
    b = rng.standard_normal(c).astype(np.float32)
    node = helper.make_node("Conv", ["x", "W", "B"], ["y"], group=c, **attrs)
    g = helper.make_graph([node], "dw",
                          [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, c, 11, 9])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
                          [numpy_helper.from_array(w, "W"), numpy_helper.from_array(b, "B")])
    model = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    _check_against_onnxruntime(model, tmp_cache)
    feeds = _feeds(model)
    want = onnxruntime_outputs(model, feeds)[0]
    default = polyc.compile_onnx(model, options=polyc.Options(cache_dir=tmp_cache))
    assert "polyc_acc" in default.c_source and "xpad" not in default.c_source
    for opts in (dict(scheduler="pluto"), dict(fusion="min"), dict(register_tile=False),
                 dict(tile=False)):
        m = polyc.compile_onnx(model, options=polyc.Options(cache_dir=tmp_cache, **opts))
        assert "xpad" not in m.c_source
        np.testing.assert_allclose(m.run(None, feeds)[0], want, rtol=1e-4, atol=1e-4)
    cuda = polyc.compile_onnx(model, target="cuda", emulate=True,  # the CUDA target too
                              options=polyc.Options(cache_dir=tmp_cache))
    np.testing.assert_allclose(cuda.run(None, feeds)[0], want, rtol=1e-4, atol=1e-4)


def _parallel_extent_at_two_threads(model: onnx.ModelProto, cache: str) -> str:
    """The last value of the first ``parallel`` loop in ``model``'s register-tiled
    kernel, compiled for 2 threads, once its output matches onnxruntime's."""
    feeds = _feeds(model)
    want = onnxruntime_outputs(model, feeds)[0]
    m = polyc.compile_onnx(model, options=polyc.Options(threads=2, cache_dir=cache))
    np.testing.assert_allclose(m.run(None, feeds)[0], want, rtol=1e-4, atol=1e-4)
    conv = next(k for k in m.c_source.split("Generated by polyc from kernel")[1:]
                if "polyc_acc[" in k)
    head = re.search(r"omp parallel for[^\n]*\n\s*for \(int64_t c0 = 0; c0 <= (\d+);", conv)
    assert head is not None
    return head.group(1)


@pytest.mark.parametrize("fine", [4096, 0])
def test_depthwise_conv_threads_split_rows_not_a_pixels_channels(fine, tmp_cache,
                                                                  monkeypatch):
    """A channel-last depthwise conv of two float register tiles' width of channels (32
    on AVX2, 128 on AVX-512) shares nothing between threads split by channels but its
    3x3 weights; yet each thread would then read and write half of every pixel, a line
    or two apart. Such a fine split counts its arrays as read by every thread
    (``FINE_SPLIT_BYTES``), so the two threads split the 37 rows; without the rule, the
    channels. Both match onnxruntime."""
    from polyc.schedule import register_tile
    monkeypatch.setattr(optimize, "FINE_SPLIT_BYTES", fine)
    rng = np.random.default_rng(3)
    shape = register_tile.machine_shape("float32", polyc.Options(register_tile=True))
    c = 2 * shape[1] if shape else 32
    w = (rng.standard_normal((c, 1, 3, 3)) * 0.3).astype(np.float32)
    b = rng.standard_normal(c).astype(np.float32)
    node = helper.make_node("Conv", ["x", "W", "B"], ["y"], group=c, pads=[1, 1, 1, 1])
    g = helper.make_graph([node], "dw",
                          [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, c, 37, 23])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
                          [numpy_helper.from_array(w, "W"), numpy_helper.from_array(b, "B")])
    model = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    assert _parallel_extent_at_two_threads(model, tmp_cache) == ("36" if fine else str(c - 1))


def test_fine_split_measures_the_span_a_thread_runs():
    """A thread's run of ``j`` spans ``share`` elements of ``A(i, j)``, half as many of
    ``A(i, j / 2)``: under ``FINE_SPLIT_BYTES`` of float32 a fine split, at or over it
    not; ``A(i, 0)`` or an index ``j`` is not last in is no split of that array."""
    n = optimize.FINE_SPLIT_BYTES // 4
    k = from_tc("def f(float(N,M) A) -> (B) { B(i,j) = A(i, j/2) + A(j % 8, 0) where j in 0:M }"
                ).specialize({"N": 8, "M": 4096})
    s = k.statements[0]
    half, col = E.reads(s.value)
    j = s.iterators[1]
    assert [optimize._fine_split(k, s.write, j, m) for m in (n - 24, n)] == [True, False]
    assert [optimize._fine_split(k, half, j, m) for m in (2 * n - 48, 2 * n)] == [True, False]
    assert not optimize._fine_split(k, col, j, 10)
    assert not optimize._fine_split(k, s.write, j, None)


@pytest.mark.parametrize("cost", [3, 1])
def test_threads_read_all_weights_before_all_of_a_written_input(cost, tmp_cache,
                                                                 monkeypatch):
    """MobileNetV2's expand conv at 14x14, 64 -> 384 channels: split by channels, each
    thread reads all 50 KB of input, which the step before wrote (half of it from the
    other core's cache); split by rows, all 98 KB of weights, constants in a shared
    cache. The lowering marks the weights (``Kernel.constants``), and a written byte
    counts ``WRITTEN_SHARE_COST`` times a constant one: the threads split the rows;
    counted alike, the channels. Both match onnxruntime."""
    monkeypatch.setattr(optimize, "WRITTEN_SHARE_COST", cost)
    model = _conv_model(64, 384, 14, 14, 1, 1, 0, residual=False)
    kernel = max((s.kernel for s in lower_onnx(model).steps), key=lambda k: len(k.inputs))
    assert kernel.constants and set(kernel.constants) < set(kernel.inputs)
    blocks = 384 // model_module._widest_block(polyc.Options())
    assert _parallel_extent_at_two_threads(model, tmp_cache) == \
        ("13" if cost > 1 else str(blocks - 1))


@pytest.mark.parametrize("shape", [(6, 16, 14, 14, 5, 1, 0), (3, 32, 20, 20, 3, 2, 1)],
                         ids=lambda s: "x".join(map(str, s)))
def test_narrow_few_channel_conv_on_cuda(shape, tmp_cache):
    """The few-channel channel-last convs (outputs of 10 columns) on the CUDA target too,
    through the CPU emulation, against onnxruntime."""
    model = _conv_model(*shape, residual=True, bias=True)
    assert any(a.name == "v_yt" for s in lower_onnx(model).steps for a in s.kernel.arrays)
    feeds = _feeds(model)
    want = onnxruntime_outputs(model, feeds)[0]
    m = polyc.compile_onnx(model, options=polyc.Options(cache_dir=tmp_cache), target="cuda",
                           emulate=True)
    np.testing.assert_allclose(m.run(None, feeds)[0], want, rtol=1e-4, atol=1e-4)


def _conv_graph(name: str, nodes, x_shape, y_shape, convs: dict, seed: int):
    """A float model of ``nodes`` from ``x`` to ``y``, each weight of ``convs`` (name ->
    (M, C, K)) random, and its graph after polyc's passes."""
    from polyc.frontend.onnx_import import load_graph
    from polyc.frontend.onnx_passes import optimize_graph
    rng = np.random.default_rng(seed)
    inits = [numpy_helper.from_array((rng.standard_normal((m, c, k, k)) * 0.2)
                                     .astype(np.float32), w) for w, (m, c, k) in convs.items()]
    g = helper.make_graph(nodes, name,
                          [helper.make_tensor_value_info("x", TensorProto.FLOAT, list(x_shape))],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, list(y_shape))],
                          inits)
    model = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    return model, optimize_graph(load_graph(model, None))


def test_two_convs_of_one_input_share_its_transposition(tmp_cache):
    """Two channel-last Convs reading one NCHW tensor (a residual block's first
    convolution and its projection shortcut) read one transposition of it, and the
    result is onnxruntime's."""
    nodes = [helper.make_node("MaxPool", ["x"], ["p"], kernel_shape=[2, 2], strides=[2, 2]),
             helper.make_node("Conv", ["p", "W1"], ["a"], pads=[1, 1, 1, 1]),
             helper.make_node("Conv", ["p", "W2"], ["b"]),
             helper.make_node("Add", ["a", "b"], ["y"])]
    model, graph = _conv_graph("shortcut", nodes, (1, 16, 18, 14), (1, 32, 9, 7),
                               {"W1": (32, 16, 3), "W2": (32, 16, 1)}, seed=3)
    to_nhwc = [n for n in graph.nodes if n.op_type == "Transpose" and
               list(n.attrs["perm"]) == [0, 2, 3, 1]]
    assert sum(n.op_type == CONV_NHWC for n in graph.nodes) == 2 and len(to_nhwc) == 1
    _check_against_onnxruntime(model, tmp_cache)


def test_pool_between_channel_last_convs_runs_channel_last(tmp_cache):
    """A MaxPool between two channel-last Convs pools channel-last (no transposition
    around it) and gives onnxruntime's result, on the C target at 1 and 2 threads and on
    the CUDA target (emulated); odd sizes, padding and a stride."""
    nodes = [helper.make_node("Conv", ["x", "W1"], ["a"], pads=[1, 1, 1, 1]),
             helper.make_node("Relu", ["a"], ["r"]),
             helper.make_node("MaxPool", ["r"], ["p"], kernel_shape=[3, 3], strides=[2, 2],
                              pads=[1, 1, 1, 1]),
             helper.make_node("Conv", ["p", "W2"], ["y"])]
    model, graph = _conv_graph("pooled", nodes, (1, 16, 13, 11), (1, 24, 7, 6),
                               {"W1": (32, 16, 3), "W2": (24, 32, 1)}, seed=5)
    pool, = [n for n in graph.nodes if n.op_type == "MaxPool"]
    assert pool.attrs.get("polyc_layout") == "nhwc"
    assert sum(n.op_type == "Transpose" for n in graph.nodes) == 2  # input and output
    _check_against_onnxruntime(model, tmp_cache)
    feeds = _feeds(model)
    cuda = polyc.compile_onnx(model, target="cuda", emulate=True,
                              options=polyc.Options(cache_dir=tmp_cache))
    np.testing.assert_allclose(cuda.run(None, feeds)[0], onnxruntime_outputs(model, feeds)[0],
                               rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("pool,attrs,nhw", [
    ("GlobalAveragePool", {}, (1, 7, 6)),  # a small plane: its taps unrolled
    ("GlobalAveragePool", {}, (2, 13, 11)),  # a reduction over the plane
    ("GlobalMaxPool", {}, (2, 7, 6)),
    ("GlobalMaxPool", {}, (1, 13, 11)),
    ("AveragePool", dict(kernel_shape=[3, 3], strides=[2, 2], pads=[1, 1, 1, 1]), (2, 13, 11)),
    ("AveragePool", dict(kernel_shape=[2, 3], strides=[1, 2], pads=[0, 1, 1, 0],
                         count_include_pad=1), (1, 9, 10)),
], ids=["gap_unrolled", "gap_batch2", "gmp_unrolled_batch2", "gmp", "avgpool_batch2",
        "avgpool_include_pad"])
def test_pools_after_a_channel_last_conv_run_channel_last(pool, attrs, nhw, tmp_cache):
    """A global or average pool reading a channel-last Conv's output pools channel-last
    (``polyc_layout`` ``"nhwc"``, its channels the vector loop): the transposition back
    to NCHW moves below it, onto its smaller output (MobileNetV2's last conv wrote 7 x 7
    x 1280 channel-last, and a transposition read all of it again before the pool). The
    result is onnxruntime's, at 1 and 2 threads and on the CUDA target (emulated)."""
    nodes = [helper.make_node("Conv", ["x", "W1"], ["a"], pads=[1, 1, 1, 1]),
             helper.make_node("Relu", ["a"], ["r"]),
             helper.make_node(pool, ["r"], ["y"], **attrs)]
    n, h, w = nhw
    model, graph = _conv_graph("pooled", nodes, (n, 16, h, w), (n, 48) + (None, None),
                               {"W1": (48, 16, 3)}, seed=6)
    node, = [n for n in graph.nodes if n.op_type == pool]
    assert node.attrs.get("polyc_layout") == "nhwc"
    producer = {o: n for n in graph.nodes for o in n.outputs}
    assert producer[node.inputs[0]].op_type != "Transpose"
    _check_against_onnxruntime(model, tmp_cache)
    feeds = _feeds(model)
    cuda = polyc.compile_onnx(model, target="cuda", emulate=True,
                              options=polyc.Options(cache_dir=tmp_cache))
    np.testing.assert_allclose(cuda.run(None, feeds)[0], onnxruntime_outputs(model, feeds)[0],
                               rtol=1e-4, atol=1e-4)


def test_uneven_parallel_member_gives_way_to_an_even_one():
    """When the threads' shares of the parallel member's tiles are uneven (144 channels
    in 64-channel register tiles: 128 + 16), another coincident member is cut for them
    instead (28 rows: 14 + 14); an even split is kept as it is."""
    reg = register_tile.Plan("S", "Y", u=1, v=4, mr=7, nr=64, box=(1, 7, 1, 1, 64))
    flags = [True, True, False, False, True]
    sizes, member = optimize._evened([28, 28, 256, 256, 128], [28, 28, 3, 3, 144], flags,
                                     reg, 2, 4)
    assert (sizes, member) == ([14, 28, 256, 256, 128], 0)
    assert optimize._uneven(sizes, [28, 28, 3, 3, 144], 0, 2) == 1.0
    # 384 channels in tiles of 192: even, unchanged; one thread: unchanged
    assert optimize._evened([28, 14, 256, 256, 192], [14, 14, 3, 3, 384], flags, reg, 2,
                            4) == ([28, 14, 256, 256, 192], 4)
    assert optimize._evened([28, 28, 256, 256, 128], [28, 28, 3, 3, 144], flags, reg, 1,
                            4) == ([28, 28, 256, 256, 128], 4)


@pytest.mark.parametrize("threads", [1, 2])
def test_pointwise_conv_split_by_rows_is_correct(threads):
    """A 1x1 convolution whose channels (144) split unevenly between two threads runs
    its rows in parallel instead (the C shows it), and matches numpy at 1 and 2 threads."""
    rng = np.random.default_rng(5)
    x = rng.standard_normal((1, 24, 28, 28)).astype(np.float32)
    w = (rng.standard_normal((144, 24, 1, 1)) * 0.2).astype(np.float32)
    nodes = [helper.make_node("Conv", ["x", "w"], ["y"]),
             helper.make_node("Relu", ["y"], ["z"])]
    g = helper.make_graph(nodes, "pw", [helper.make_tensor_value_info("x", TensorProto.FLOAT,
                                                                        x.shape)],
                          [helper.make_tensor_value_info("z", TensorProto.FLOAT, None)],
                          [numpy_helper.from_array(w, "w")])
    model = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)
    m = polyc.compile_onnx(model, options=polyc.Options(threads=threads))
    (got,) = m.run(None, {"x": x})
    if threads == 2:
        src = open(m.library_path[:-3] + ".c").read()
        loops = re.findall(r"#pragma omp parallel for.*\n\s*for \(int64_t c0 = 0; "
                           r"(c0 <= \d+; c0 \+= \d+)", src)
        assert loops == ["c0 <= 27; c0 += 14"], loops
    want = np.maximum(np.einsum("nchw,mc->nmhw", x, w[:, :, 0, 0]), 0)
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("threads", [1, 2])
def test_small_panel_blocks_run_inside_the_rows(threads, tmp_cache, monkeypatch, avx512_model):
    """A 1x1 conv over 16 channels into 144 (three 48-channel weight blocks, a 9 KB panel)
    runs its blocks inside the register tile's rows (``_panels_inside_rows``): each
    pixel's 144 outputs are written together. The copy-out then writes runs of 144
    channels (``* 144 +`` with the block inside the pixel loop); the result matches
    onnxruntime either way."""
    model = _conv_model(16, 144, 19, 23, 1, 1, 0, residual=False)
    feeds = _feeds(model)
    want = onnxruntime_outputs(model, feeds)[0]
    sources = {}
    for inside in (False, True):
        monkeypatch.setattr(optimize, "PANELS_INSIDE_ROWS", inside)
        m = polyc.compile_onnx(model, options=polyc.Options(
            threads=threads, cache_dir=f"{tmp_cache}/{inside}", winograd=False))
        np.testing.assert_allclose(m.run(None, feeds)[0], want, rtol=1e-4, atol=1e-4)
        src = open(m.library_path[:-3] + ".c").read()
        sources[inside] = src[src.index("Generated by polyc from kernel 'k0_"):]
    assert sources[False] != sources[True]
    # with the blocks inside, the block loop is the innermost loop around the register
    # tile: the last "for" before the accumulators' declaration walks the blocks
    inner = sources[True].split("polyc_acc[")[0].rsplit("for (", 1)[1]
    outer = sources[False].split("polyc_acc[")[0].rsplit("for (", 1)[1]
    assert "<= 2;" in inner and "<= 2;" not in outer


@pytest.mark.parametrize("l2_kb", [256, 1024])
def test_panels_up_to_an_eighth_of_the_l2_run_inside_the_rows(l2_kb, tmp_cache, monkeypatch,
                                                            avx512_model):
    """A 1x1 conv over 64 channels into 256 with a residual add (ResNet-50's 56x56
    expansion, smaller): its four weight blocks make a 64 KB panel, past the L1 but
    within an eighth of a 1 MB L2, so the blocks run inside the rows there, and outside
    them on a 256 KB L2 (``_panels_inside_rows``). The result matches onnxruntime both
    ways."""
    monkeypatch.setattr(machine, "l2_bytes", lambda: l2_kb << 10)
    model = _conv_model(64, 256, 11, 17, 1, 1, 0, residual=True)
    feeds = _feeds(model)
    m = polyc.compile_onnx(model, options=polyc.Options(threads=1, cache_dir=tmp_cache,
                                                        winograd=False))
    np.testing.assert_allclose(m.run(None, feeds)[0], onnxruntime_outputs(model, feeds)[0],
                               rtol=1e-4, atol=1e-4)
    src = open(m.library_path[:-3] + ".c").read()
    src = src[src.index("Generated by polyc from kernel 'k0_"):]
    inner = src.split("polyc_acc[")[0].rsplit("for (", 1)[1]
    assert ("<= 3;" in inner) == (l2_kb == 1024), inner


@pytest.mark.parametrize("bits,widest", [(512, 64), (256, 16)])
def test_weight_blocks_are_as_wide_as_the_register_tile(bits, widest, tmp_cache, monkeypatch):
    """Constant weights are laid out in blocks as wide as the machine's float register
    tile (64 columns with AVX-512, 16 with AVX2: each tile's panel one contiguous
    stream); the CUDA target keeps 64. Which convs block does not change (every width
    is a multiple of 16). A blocked MatMul matches numpy either way."""
    from polyc.frontend.onnx_layout import blocked_columns, channel_block
    monkeypatch.setattr(register_tile, "vector_bits", lambda: bits)
    monkeypatch.setattr(register_tile, "vector_registers", lambda: 32 if bits == 512 else 16)
    assert model_module._widest_block(polyc.Options()) == widest
    assert model_module._widest_block(polyc.Options(target="cuda")) == 64
    assert channel_block(144, widest) == (48 if widest == 64 else 16)
    assert channel_block(24, widest) == 24 and channel_block(1000, widest) is None
    assert blocked_columns(np.ones((5, 100), np.float32), widest).shape == \
        (-(-100 // widest), 5, widest)
    rng = np.random.default_rng(4)
    w = (rng.standard_normal((70, 200)) * 0.1).astype(np.float32)
    g = helper.make_graph([helper.make_node("MatMul", ["x", "W"], ["y"])], "mm",
                          [helper.make_tensor_value_info("x", TensorProto.FLOAT, [37, 70])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [37, 200])],
                          [numpy_helper.from_array(w, "W")])
    model = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    x = rng.standard_normal((37, 70)).astype(np.float32)
    c = polyc.compile_onnx(model, options=polyc.Options(threads=1, cache_dir=tmp_cache))
    np.testing.assert_allclose(c(x)[0], x @ w, rtol=1e-4, atol=1e-4)
    assert f"float32[{-(-200 // widest)}][70][{widest}]" in c.c_source
