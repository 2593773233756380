"""Layout choice for convolutions: which Conv runs channel-last inside its kernel.

A model's activations stay NCHW between kernels (the layout of the graph and of the
caller's arrays). Inside one Conv kernel, though, the layout decides the micro-kernel:
an NCHW convolution vectorizes along the output width ``ow``. That is good on wide
feature maps and poor on narrow or strided ones: ResNet-50's 14x14 and 7x7 layers fill
7 or 14 of 16 float lanes of an AVX-512 vector and leave the register tile (8 x 64 by
default) with partial tiles only, and a stride-2 layer reads its input with a stride-2
vector access. Those layers ran at 25-45 GFLOP/s where the wide ones reach ~95.

A **channel-last** Conv (chosen here, lowered by :func:`onnx_ops_nn.conv`) computes::

    Xt(n, h, w, c)           = X(n, c, h - pad, w - pad)   (0 in the padding: one copy)
    Yt(n, oh, ow, mb, mi)   +=! Xt(n, oh*s + kh*d, ow*s + kw*d, c) * Wb(mb, kh, kw, c, mi)
    Y(n, m, oh, ow)          = Yt(n, oh, ow, m / MB, m % MB) (+ B(m))   (back to NCHW)

with ``Wb`` the weights blocked to ``(M / MB, KH, KW, C, MB)`` once, here, at compile
time (:func:`blocked_weights`; ``MB`` is 64, 32 or 16 output channels): the weights of
one block are one contiguous stream. The vector loop is now the output channel ``mi``
within a block (a whole number of vectors), the register tile's rows run over ``ow``
(the tile adapts its row count to the extent: 7 rows for widths 7, 14, 28), and the
input is read one broadcast scalar at a time whatever the stride. The two copies move
``C*H*W + M*OH*OW`` elements against ``2*M*C*KH*KW*OH*OW`` flops: noise for the layers
chosen.

The rule (:func:`wants_channels_last`): a 2-D Conv with group 1, constant float weights,
an output channel count that fills whole vectors, at least that many input channels,
and an output narrower than :data:`NARROW` or a horizontal stride above 1 -- except a
1x1 unit-stride Conv over at least :data:`FLAT_PIXELS` pixels, which stays NCHW as a
matmul over the flattened pixels (contiguous, long vector loops, no transposition).

A strided 1x1 Conv over at least :data:`FLAT_PIXELS` output pixels (ResNet's
downsampling shortcuts, 1x1 stride 2) becomes a ``Slice`` with steps (the pixels it
reads, one cheap copy of ``C*OH*OW`` elements) and a unit-stride 1x1 Conv, which then
runs as the flat matmul (:func:`wants_subsampling`). Channel-last, the same layer ran at
60-80 GFLOP/s and scaled 1.2x from 1 to 2 threads (its copies gather along channels).
"""
from __future__ import annotations

import dataclasses
from collections import Counter
from collections.abc import Callable

import numpy as np

from .onnx_graph import Graph, Node, TensorInfo

#: the internal Conv attribute that :func:`onnx_ops_nn.conv` reads (weights blocked)
CHANNELS_LAST = "polyc_channels_last"
#: output widths below this run channel-last (NCHW vectors along ``ow`` waste lanes)
NARROW = 32
#: a 1x1 unit-stride Conv with at least this many output pixels stays NCHW: it runs as
#: a matmul over the flattened ``H*W`` pixels, no transposition needed
FLAT_PIXELS = 128
#: output channels must be a multiple of this (16 float32 lanes of AVX-512)
CHANNEL_MULTIPLE = 16


def wants_channels_last(node: Node, graph: Graph) -> bool:
    """The cost rule of the module doc."""
    if node.op_type != "Conv" or node.attrs.get(CHANNELS_LAST) or len(node.inputs) < 2:
        return False
    x, w, y = node.inputs[0], node.inputs[1], node.outputs[0]
    weights = graph.constants.get(w)
    if weights is None or weights.ndim != 4 or int(node.attrs.get("group", 1)) != 1:
        return False
    if graph.tensors[x].dtype not in ("float32", "float64") or weights.dtype != \
            np.dtype(graph.tensors[x].dtype):
        return False
    ys = graph.tensors[y].shape
    if len(ys) != 4 or weights.shape[0] % CHANNEL_MULTIPLE or weights.shape[1] < CHANNEL_MULTIPLE:
        return False  # (a stem conv over 3 input channels stays NCHW: measured faster)
    strides = [int(s) for s in node.attrs.get("strides", [1, 1])]
    if len(strides) == 2 and strides[1] > 1:
        return True
    if strides == [1, 1] and _pointwise_unpadded(node, weights) and \
            ys[2] * ys[3] >= FLAT_PIXELS:
        return False  # a matmul over the flattened pixels (onnx_ops_nn._conv_1x1_flat)
    return ys[3] < NARROW


def _pointwise_unpadded(node: Node, weights: np.ndarray) -> bool:
    return all(int(k) == 1 for k in weights.shape[2:]) and \
        not any(int(p) for p in node.attrs.get("pads", [])) and \
        node.attrs.get("auto_pad", "NOTSET") in ("NOTSET", b"NOTSET", "VALID", b"VALID")


def wants_subsampling(node: Node, graph: Graph) -> bool:
    """A group-1, unpadded, strided 1x1 Conv with constant weights over at least
    :data:`FLAT_PIXELS` output pixels: it reads only every ``stride``-th pixel, so the
    pixels are copied out first (see the module doc)."""
    if node.op_type != "Conv" or node.attrs.get(CHANNELS_LAST) or len(node.inputs) < 2:
        return False
    weights = graph.constants.get(node.inputs[1])
    if weights is None or weights.ndim < 3 or int(node.attrs.get("group", 1)) != 1:
        return False
    strides = [int(s) for s in node.attrs.get("strides", [1] * (weights.ndim - 2))]
    ys = graph.tensors[node.outputs[0]].shape
    return any(s > 1 for s in strides) and _pointwise_unpadded(node, weights) and \
        len(ys) == weights.ndim and int(np.prod(ys[2:])) >= FLAT_PIXELS


def channel_block(m: int) -> int:
    """Output channels per weight block of a channel-last Conv: 64 (four AVX-512 float
    vectors, the register tile's width) when they divide ``m``, else 32, else 16."""
    return next(b for b in (64, 32, CHANNEL_MULTIPLE) if m % b == 0)


def blocked_weights(w: np.ndarray) -> np.ndarray:
    """``(M, C, KH, KW)`` weights as ``(M / MB, KH, KW, C, MB)``: the weights of one block
    of ``MB`` output channels are one contiguous stream, in the order the channel-last
    contraction reads them (an ``(KH, KW, C, M)`` layout read ``MB`` channels at a time
    has a stride of ``M``: at 512 channels two blocks per 4 KB page, which the hardware
    prefetcher does not follow across pages)."""
    m, c, kh, kw = w.shape
    mb = channel_block(m)
    return w.reshape(m // mb, mb, c, kh, kw).transpose(0, 3, 4, 2, 1)


def wants_transposed_gemm(node: Node, graph: Graph) -> bool:
    """A Gemm with ``transB=1`` and constant 2-D ``B`` (a fully-connected layer stored
    ``(out, in)``): its contraction would run along ``B``'s rows, a scalar reduction."""
    if node.op_type != "Gemm" or not int(node.attrs.get("transB", 0)) or len(node.inputs) < 2:
        return False
    b = graph.constants.get(node.inputs[1])
    return b is not None and b.ndim == 2


def choose_conv_layouts(graph: Graph, stats: Counter | None = None) -> Graph:
    """Mark the Convs that run channel-last and give them blocked weights,
    split each strided 1x1 Conv over many pixels into a strided ``Slice`` and a
    unit-stride Conv, and give each Gemm with ``transB=1`` and constant ``B`` the
    transposed ``B`` (``transB=0``: the layer then vectorizes along its outputs, a GEMV
    streaming contiguous rows). The new weights are new constants; the old ones go when
    nothing else reads them."""
    from .onnx_passes import eliminate_dead_nodes
    stats = stats if stats is not None else Counter()
    constants, tensors = dict(graph.constants), dict(graph.tensors)
    nodes: list[Node] = []
    transposed: dict[tuple[str, str], str] = {}  # (weight, layout) -> its copy
    subsampled = 0

    def fresh(base: str) -> str:
        name, k = base, 1
        while name in tensors:
            name, k = f"{base}_{k}", k + 1
        return name

    def constant(base: str, value: np.ndarray) -> str:
        name = fresh(base)
        constants[name] = value
        tensors[name] = TensorInfo(name, str(value.dtype), tuple(value.shape))
        return name

    def copy(w: str, tag: str, layout: Callable[[np.ndarray], np.ndarray]) -> str:
        if (w, tag) not in transposed:
            value = np.ascontiguousarray(layout(graph.constants[w]))
            transposed[(w, tag)] = constant(f"{w}_{tag}", value)
        return transposed[(w, tag)]

    def subsample(n: Node) -> Node:
        """Emit the strided ``Slice`` of ``n``'s input; ``n`` at unit stride."""
        x, strides = n.inputs[0], [int(s) for s in n.attrs["strides"]]
        xs = graph.tensors[x].shape
        params = {"starts": [0] * len(strides), "ends": list(xs[2:]),
                  "axes": list(range(2, len(xs))), "steps": strides}
        args = [constant(f"{n.name}_subsample_{key}", np.asarray(v, np.int64))
                for key, v in params.items()]
        sub = fresh(f"{x}_every_{'x'.join(map(str, strides))}")
        tensors[sub] = TensorInfo(sub, graph.tensors[x].dtype,
                                  xs[:2] + graph.tensors[n.outputs[0]].shape[2:])
        nodes.append(Node(f"{n.name}_subsample", "Slice", (x, *args), (sub,)))
        return dataclasses.replace(n, inputs=(sub,) + n.inputs[1:],
                                   attrs={**n.attrs, "strides": [1] * len(strides)})

    for n in graph.nodes:
        if wants_subsampling(n, graph):
            n = subsample(n)
            stats["conv_subsampled"] += 1
            subsampled += 1
        elif wants_channels_last(n, graph):
            inputs = (n.inputs[0], copy(n.inputs[1], "blocked", blocked_weights)) + n.inputs[2:]
            n = dataclasses.replace(n, inputs=inputs, attrs={**n.attrs, CHANNELS_LAST: 1})
            stats["conv_channels_last"] += 1
        elif wants_transposed_gemm(n, graph):
            inputs = (n.inputs[0], copy(n.inputs[1], "t", np.transpose)) + n.inputs[2:]
            n = dataclasses.replace(n, inputs=inputs, attrs={**n.attrs, "transB": 0})
            stats["gemm_transposed"] += 1
        nodes.append(n)
    if not transposed and not subsampled:
        return graph
    return eliminate_dead_nodes(dataclasses.replace(
        graph, nodes=tuple(nodes), constants=constants, tensors=tensors), stats)
