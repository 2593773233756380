"""ONNX NN op lowerings (Conv, ConvTranspose, pools) against onnx's reference
evaluator and onnxruntime, one node at a time (tests/onnx_node_harness.py)."""
from __future__ import annotations

import numpy as np
import pytest
from onnx_node_harness import check_node, graph_of, lower_node, make_model, rand

from polyc.frontend import from_tc
from polyc.frontend.onnx_graph import UnsupportedOpError

X = rand(1, 3, 7, 9)

CONV = {
    "stride_pads_dilation_bias": (dict(x=X, w=rand(4, 3, 3, 3), b=rand(4)),
                                  dict(strides=[2, 1], pads=[1, 0, 2, 1], dilations=[2, 1])),
    "group3_stride2": (dict(x=X, w=rand(6, 1, 3, 3)), dict(group=3, strides=[2, 2],
                                                          pads=[1, 1, 1, 1])),
    "group2": (dict(x=rand(2, 4, 5, 6), w=rand(6, 2, 3, 2), b=rand(6)),
               dict(group=2, pads=[0, 1, 1, 0])),
    "depthwise_same_upper": (dict(x=X, w=rand(3, 1, 3, 3), b=rand(3)),
                             dict(group=3, auto_pad="SAME_UPPER")),
    "same_lower_stride2_k4": (dict(x=X, w=rand(2, 3, 4, 4)),
                              dict(auto_pad="SAME_LOWER", strides=[2, 2])),
    "valid_stride2": (dict(x=X, w=rand(2, 3, 3, 2)), dict(auto_pad="VALID", strides=[2, 3])),
    "plain_1x1": (dict(x=X, w=rand(5, 3, 1, 1)), {}),
    "conv1d": (dict(x=rand(2, 3, 11), w=rand(4, 3, 3), b=rand(4)),
               dict(strides=[2], pads=[1, 2], dilations=[2])),
    "conv3d": (dict(x=rand(1, 2, 4, 5, 6), w=rand(3, 2, 2, 3, 2)),
               dict(pads=[1, 0, 1, 0, 1, 1], strides=[1, 2, 1])),
    "float64": (dict(x=X.astype(np.float64), w=rand(2, 3, 3, 3, dtype=np.float64)),
                dict(pads=[1, 1, 1, 1])),
}


@pytest.mark.parametrize("case", list(CONV))
def test_conv(case):
    inputs, attrs = CONV[case]
    check_node("Conv", inputs, rtol=1e-4, atol=1e-4, **attrs)


def test_padding_copies_into_a_padded_temporary():
    model = make_model("Conv", dict(x=X, w=rand(2, 3, 3, 3)), ["y"], strides=[2, 2],
                       pads=[1, 2, 1, 0])
    src = lower_node(graph_of(model, {}))[0]
    conv_line = next(line for line in src.splitlines() if "+=!" in line)
    assert "?" not in conv_line  # the guards are in the copy, not in the hot loop
    kernel = from_tc(src)
    assert kernel.statements[-1].domain.is_box()  # rectangular: register tiling applies


def test_conv_weights_as_initializers():
    check_node("Conv", dict(x=X), consts=dict(w=rand(2, 3, 3, 3), b=rand(2)),
               pads=[1, 1, 1, 1], rtol=1e-4, atol=1e-4)


CONV_T = {
    "stride2_pads_bias": (dict(x=rand(1, 3, 4, 5), w=rand(3, 2, 3, 3), b=rand(2)),
                          dict(strides=[2, 2], pads=[1, 0, 1, 1])),
    "group3": (dict(x=rand(1, 6, 3, 4), w=rand(6, 2, 3, 3)), dict(group=3, strides=[2, 1])),
    "output_padding": (dict(x=rand(1, 2, 3, 4), w=rand(2, 3, 3, 3)),
                       dict(strides=[2, 3], output_padding=[1, 2])),
    "output_shape": (dict(x=rand(1, 1, 3, 3), w=rand(1, 2, 3, 3)),
                     dict(strides=[3, 2], output_shape=[10, 8])),
    "same_upper": (dict(x=rand(1, 2, 3, 4), w=rand(2, 2, 3, 3)),
                   dict(strides=[2, 2], auto_pad="SAME_UPPER")),
    "dilation2": (dict(x=rand(1, 2, 4, 4), w=rand(2, 3, 3, 2)), dict(dilations=[2, 2])),
    "convt1d": (dict(x=rand(2, 2, 5), w=rand(2, 3, 4), b=rand(3)),
                dict(strides=[3], pads=[1, 2])),
}


@pytest.mark.parametrize("case", list(CONV_T))
def test_conv_transpose(case):
    inputs, attrs = CONV_T[case]
    # onnx's reference mishandles group > 1 (it splits the weight by output channels)
    check_node("ConvTranspose", inputs, rtol=1e-4, atol=1e-4,
               use_reference=attrs.get("group", 1) == 1, **attrs)


POOLS = {
    "max_stride2_pads_ceil": ("MaxPool", dict(kernel_shape=[3, 3], strides=[2, 2],
                                              pads=[1, 0, 1, 1], ceil_mode=1)),
    "max_dilation": ("MaxPool", dict(kernel_shape=[2, 3], dilations=[2, 2], pads=[1, 1, 1, 1])),
    "max_same_upper": ("MaxPool", dict(kernel_shape=[3, 3], strides=[2, 2],
                                       auto_pad="SAME_UPPER")),
    "max_nopad": ("MaxPool", dict(kernel_shape=[2, 2], strides=[2, 2])),
    "avg_exclude_pad": ("AveragePool", dict(kernel_shape=[3, 3], strides=[2, 2],
                                            pads=[1, 0, 2, 1])),
    "avg_include_pad": ("AveragePool", dict(kernel_shape=[3, 3], strides=[2, 2],
                                            pads=[1, 0, 2, 1], count_include_pad=1)),
    "avg_ceil": ("AveragePool", dict(kernel_shape=[3, 2], strides=[2, 2], ceil_mode=1)),
    "avg_ceil_include_pad": ("AveragePool", dict(kernel_shape=[3, 3], strides=[2, 2],
                                                 pads=[1, 1, 0, 0], ceil_mode=1,
                                                 count_include_pad=1)),
    "avg_same_lower": ("AveragePool", dict(kernel_shape=[3, 3], strides=[2, 2],
                                           auto_pad="SAME_LOWER")),
    "avg_nopad": ("AveragePool", dict(kernel_shape=[3, 3], strides=[1, 2])),
}


@pytest.mark.parametrize("case", list(POOLS))
def test_pool(case):
    op, attrs = POOLS[case]
    check_node(op, dict(x=X), **attrs)


@pytest.mark.parametrize("op", ["MaxPool", "AveragePool"])
def test_pool_1d(op):
    check_node(op, dict(x=rand(2, 3, 10)), kernel_shape=[3], strides=[2], pads=[1, 1])


@pytest.mark.parametrize("op", ["GlobalAveragePool", "GlobalMaxPool"])
@pytest.mark.parametrize("shape", [(1, 3, 7, 9), (2, 5, 6)])
def test_global_pool(op, shape):
    # onnx's reference GlobalMaxPool drops the channel axis of 3-D inputs
    check_node(op, dict(x=rand(*shape)), use_reference=len(shape) == 4 or op[6] != "M")


def test_maxpool_indices_unsupported():
    model = make_model("MaxPool", dict(x=X), ["y", "idx"], kernel_shape=[2, 2])
    with pytest.raises(UnsupportedOpError, match="n0.*MaxPool.*Indices"):
        lower_node(graph_of(model, {}))


def test_unknown_auto_pad():
    model = make_model("Conv", dict(x=X, w=rand(2, 3, 3, 3)), ["y"], auto_pad="VALID")
    graph = graph_of(model, {})
    node = graph.nodes[0]
    attrs = dict(node.attrs, auto_pad="SAME_MIDDLE")
    import dataclasses
    graph = dataclasses.replace(graph, nodes=(dataclasses.replace(node, attrs=attrs),))
    with pytest.raises(UnsupportedOpError, match="auto_pad='SAME_MIDDLE'.*supported"):
        lower_node(graph)


# -- ceil_mode pool shapes: onnx's shape inference keeps a last window that starts in the
# right padding (one element too many); the importer recomputes the shape as onnxruntime

CEIL_POOLS = {
    # (input shape, attrs): each has a dimension where inference is off by one
    "max_7x9_k3s2_pads1021": ((1, 1, 7, 9), dict(kernel_shape=[3, 3], strides=[2, 2],
                                                 pads=[1, 0, 2, 1])),
    "max_1d_k3s3_pads02": ((2, 3, 8), dict(kernel_shape=[3], strides=[3], pads=[0, 2])),
    "max_dilated": ((1, 2, 9, 6), dict(kernel_shape=[2, 2], strides=[3, 2], pads=[0, 1, 1, 1],
                                       dilations=[2, 1])),
    "max_3d": ((1, 1, 5, 6, 6), dict(kernel_shape=[2, 3, 2], strides=[2, 2, 3],
                                     pads=[0, 1, 0, 1, 2, 1])),
    # VALID: no padding, a stride longer than the kernel
    "max_1d_valid_k2s4": ((1, 2, 8), dict(kernel_shape=[2], strides=[4], auto_pad="VALID")),
}


def _ceil_pool_model(op, shape, attrs, follow=True):
    from onnx import TensorProto, helper
    nodes = [helper.make_node(op, ["x"], ["p"], name="pool", ceil_mode=1, **attrs)]
    out = "p"
    if follow:  # a consumer whose shape inference must see the corrected shape
        nodes.append(helper.make_node("Relu", ["p"], ["r"], name="relu"))
        nodes.append(helper.make_node("Flatten", ["r"], ["y"], name="flat", axis=1))
        out = "y"
    g = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT,
                                                                     list(shape))],
                          [helper.make_tensor_value_info(out, TensorProto.FLOAT, None)])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 19)])
    m.ir_version = 8
    return m


def _ort(model, x):
    import onnxruntime as rt
    return rt.InferenceSession(model.SerializeToString(),
                               providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]


def _ceil_pool_cases():
    for name, (shape, attrs) in CEIL_POOLS.items():
        yield pytest.param("MaxPool", shape, attrs, id=name)
        for cip in (0, 1):
            yield pytest.param("AveragePool", shape, dict(attrs, count_include_pad=cip),
                               id=f"{name.replace('max', 'avg')}_cip{cip}")


@pytest.mark.parametrize("op,shape,attrs", list(_ceil_pool_cases()))
def test_ceil_mode_pool_shape_matches_onnxruntime(op, shape, attrs):
    import onnx

    import polyc
    model = _ceil_pool_model(op, shape, attrs)
    x = rand(*shape)
    want = _ort(model, x)
    # the case really is one that onnx's shape inference gets wrong
    inferred = onnx.shape_inference.infer_shapes(_ceil_pool_model(op, shape, attrs, False))
    dims = [d.dim_value for d in inferred.graph.output[0].type.tensor_type.shape.dim]
    assert int(np.prod(dims)) > want.size
    got, = polyc.compile_onnx(model)(x)
    assert got.shape == want.shape
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)


def test_ceil_mode_pool_declared_output_shape_is_corrected():
    """A model that declares the (wrong) inferred shape on its output, as exporters that
    run onnx's inference write it, and a second ceil-mode pool below the first."""
    from onnx import TensorProto, helper

    import polyc
    attrs = dict(kernel_shape=[3, 3], strides=[2, 2], pads=[1, 0, 2, 1], ceil_mode=1)
    nodes = [helper.make_node("MaxPool", ["x"], ["p"], name="p1", **attrs),
             helper.make_node("AveragePool", ["p"], ["y"], name="p2", kernel_shape=[2, 2],
                              strides=[2, 2], pads=[0, 0, 1, 1], ceil_mode=1)]
    g = helper.make_graph(nodes, "g",
                          [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 2, 7, 9])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
                          value_info=[helper.make_tensor_value_info("p", TensorProto.FLOAT,
                                                                    [1, 2, 5, 5])])
    model = helper.make_model(g, opset_imports=[helper.make_opsetid("", 19)])
    model.ir_version = 8
    x = rand(1, 2, 7, 9)
    clean = helper.make_model(helper.make_graph(nodes, "g", list(g.input), list(g.output)),
                              opset_imports=[helper.make_opsetid("", 19)])
    clean.ir_version = 8
    want = _ort(clean, x)
    got, = polyc.compile_onnx(model)(x)
    assert got.shape == want.shape
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)


def test_ceil_mode_pool_shapes_rule():
    from onnx import helper

    from polyc.frontend.onnx_import import _pool_dims
    node = helper.make_node("MaxPool", ["x"], ["y"], kernel_shape=[3, 3], strides=[2, 2],
                            pads=[1, 0, 2, 1], ceil_mode=1)
    assert _pool_dims(node, [1, 1, 7, 9]) == [1, 1, 4, 5]
    same = helper.make_node("MaxPool", ["x"], ["y"], kernel_shape=[3, 3], strides=[2, 2],
                            auto_pad="SAME_UPPER", ceil_mode=1)
    assert _pool_dims(same, [1, 1, 7, 9]) is None  # inference is right there
    floor = helper.make_node("MaxPool", ["x"], ["y"], kernel_shape=[3, 3], strides=[2, 2])
    assert _pool_dims(floor, [1, 1, 7, 9]) is None


def test_lp_pool():
    x = rand(2, 3, 7, 6)
    check_node("LpPool", dict(x=x), kernel_shape=[3, 2], opset=18)  # p = 2
    check_node("LpPool", dict(x=x), kernel_shape=[3, 2], p=3, pads=[1, 0, 1, 1],
               strides=[2, 1], opset=18)
    check_node("LpPool", dict(x=rand(1, 2, 9)), kernel_shape=[4], p=1, dilations=[2],
               opset=18)


def test_dropout_mask_of_inference():
    got = check_node("Dropout", dict(x=rand(3, 4)), outputs=["y", "mask"], opset=13)
    assert got["mask"].dtype == np.bool_ and got["mask"].all()
