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


def test_padding_restricts_the_domain_instead_of_a_guard():
    model = make_model("Conv", dict(x=X, w=rand(2, 3, 3, 3)), ["y"], strides=[2, 2],
                       pads=[1, 2, 1, 0])
    src = lower_node(graph_of(model, {}))[0]
    assert "?" not in src and "+=!" in src
    kernel = from_tc(src)
    update = kernel.statements[1]
    assert not update.domain.is_box()  # bounded by the reads of X, not a rectangle


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
