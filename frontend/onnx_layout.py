"""Layout choice for convolutions: which Convs run channel-last, with channel-last
activations between them.

A model's graph and the caller's arrays are NCHW. An NCHW convolution vectorizes along
the output width ``ow``: good on wide feature maps, poor on narrow or strided ones
(ResNet-50's 14x14 and 7x7 layers fill 7 or 14 of 16 float lanes of an AVX-512 vector,
and a stride-2 layer reads its input with a stride-2 vector access), and a depthwise
convolution has no reduction over channels to block. Channel-last (NHWC), the vector
loop is the output channel instead.

A Conv chosen here (:func:`wants_nhwc`) becomes polyc's own op ``PolycConvNHWC``
between two ``Transpose`` nodes::

    Xt = Transpose(X, perm=[0, 2, 3, 1])      (NCHW -> NHWC)
    Yt = PolycConvNHWC(Xt, Wb, B)             (lowered by onnx_ops_nn.conv_nhwc)
    Y  = Transpose(Yt, perm=[0, 3, 1, 2])     (NHWC -> NCHW)

with the weights laid out once, here, at compile time (:func:`nhwc_weights`): blocked
``(M / MB, KH, KW, C, MB)`` for a dense Conv (``MB`` = 64, 32 or 16 output channels,
each block one contiguous stream), ``(KH, KW, C)`` for a depthwise one. Then
:func:`sink_transposes` moves each transposition back to NCHW below the elementwise ops
that read it (bias, Relu, Clip, the residual Add) until it meets the next Conv's
transposition to NHWC, and the pair cancels: a chain of convolutions runs channel-last
from its first Conv to its last, and the graph transposes only where an op that needs
NCHW reads (a reshape, the graph's output); a pool (max, average, global average or
max) reading a transposition back to NCHW pools channel-last instead (``polyc_layout``
``"nhwc"``; the transposition moves onto its output), and
per-tensor QuantizeLinear / DequantizeLinear pass it on as elementwise ops do. The
integer convolutions of a quantized model on 512-bit VNNI come between such
transpositions too (:func:`.onnx_passes.convs_as_dot_products`), and this pass sinks
theirs. Before, each channel-last Conv
transposed its own input and output inside its kernel; on MobileNetV2's 7x7 and 14x14
layers those copies cost more than the convolutions.

The rule: a 2-D Conv with constant weights of the input's float type, either dense with
output channels that block (:func:`channel_block`) and at least a vector of input
channels (:data:`CHANNEL_MULTIPLE`) or a kernel larger than 1x1 on an output narrower than a vector and than its
output channels (its NCHW vectors would be emptier: LeNet-5's second conv, 6 channels
on 10 columns, took 17 us NCHW and 8 us channel-last, the whole model 1.24 -> 0.63 ms),
or depthwise (one group per channel) over at least a vector of channels. A stem -- a
kernel past 1x1 over fewer input channels, at least a vector of output channels that
block -- runs channel-last too, but reads the graph's NCHW input in place
(``PolycConvNHWC`` with ``polyc_input_layout="nchw"``, no transposition before it): its
output needs no transposition to the channel-last layers after it (ResNet-18 at 1 thread,
same process, 20.5 -> 19.6 ms; ResNet-50 64.2 -> 63.4 ms).

With ``winograd`` (``Options.winograd``, the C target), a dense channel-last Conv that
is 3x3, unit-stride, undilated and float32 (:func:`wants_winograd`) runs by Winograd's
minimal filtering (:mod:`.winograd`) instead, as three nodes between the same
transpositions::

    V  = PolycWinogradInput(Xt)              (alpha, alpha, N, TH, TW, C) transformed tiles
    Mt = MatMul(Reshape(V), U)               per tile position: (T, C) @ (C, M)
    Yt = PolycWinogradOutput(Reshape(Mt), B) (lowered by onnx_ops_nn.winograd_output)

``U`` the weights transformed here (:func:`winograd_weights`; in column blocks, a
``PolycMatMulBlocked``, past 64 output channels); the output transform is the anchor
the bias and the elementwise epilogue join.

A strided 1x1 Conv left NCHW over at least :data:`FLAT_PIXELS` output pixels becomes a
``Slice`` with steps (the pixels it reads, one cheap copy of ``C*OH*OW`` elements) and
a unit-stride 1x1 Conv, which runs as a matmul over the flattened pixels
(:func:`wants_subsampling`).
"""
from __future__ import annotations

import dataclasses
from collections import Counter
from collections.abc import Callable

import numpy as np

from .onnx_graph import Graph, Node, TensorInfo

#: a strided 1x1 Conv left NCHW over at least this many output pixels is subsampled
#: first (:func:`wants_subsampling`)
FLAT_PIXELS = 128
#: a vector of float32 channels on AVX-512 (16 lanes): the least input channels of a
#: dense channel-last Conv, the least channels of a depthwise one, the smallest block
CHANNEL_MULTIPLE = 16


#: a stem Conv (a few input channels, say RGB) runs channel-last reading its NCHW input
#: in place (``polyc_input_layout="nchw"``): an NHWC input would be a transposition and
#: a padded copy with an inner loop of 3 channels (MobileNetV2 at 1 thread: 7.24 -> 7.48
#: ms), an NCHW stem a transposition of its output to the next channel-last Conv
STEM_NCHW_INPUT = True


#: polyc's own op: a 2-D Conv over NHWC input giving NHWC output (weights blocked
#: ``(M/MB, KH, KW, C, MB)``, or ``(KH, KW, C)`` for a depthwise one); lowered by
#: :func:`.onnx_ops_nn.conv_nhwc`
CONV_NHWC = "PolycConvNHWC"
#: polyc's own ops: a 3x3, stride-1 Conv over NHWC input giving NHWC output by
#: Winograd's minimal filtering, as ``V = PolycWinogradInput(X)``, ``Mt = MatMul(V, U)``
#: (``U`` the transformed weights, :func:`winograd_weights`) and ``Y =
#: PolycWinogradOutput(Mt, B)``; lowered by :func:`.onnx_ops_nn.winograd_input` and
#: :func:`.onnx_ops_nn.winograd_output`
WINOGRAD_INPUT, WINOGRAD_OUTPUT = "PolycWinogradInput", "PolycWinogradOutput"
#: polyc's own op: a MatMul (or a Gemm without transposes) whose constant ``B`` is stored
#: in column blocks ``(ceil(N / NB), K, NB)`` (:func:`blocked_columns`); lowered by
#: :func:`.onnx_ops_math.matmul_blocked`
MATMUL_BLOCKED = "PolycMatMulBlocked"
#: the columns of a block of a blocked MatMul's ``B``: four AVX-512 float vectors, the
#: register tile's width
COLUMN_BLOCK = 64
#: the perms of ``Transpose`` between the graph's NCHW and channel-last activations
TO_NHWC, TO_NCHW = (0, 2, 3, 1), (0, 3, 1, 2)


def wants_nhwc(node: Node, graph: Graph) -> str | None:
    """``"dense"``, ``"stem"`` or ``"depthwise"`` when the Conv ``node`` runs
    channel-last between channel-last activations (see the module doc), else None: a
    2-D Conv with constant weights of the input's float type, either group 1 with at
    least a vector of input channels (:data:`CHANNEL_MULTIPLE`) and output channels that
    block (:func:`channel_block`) -- or, with fewer, a kernel past 1x1 over an output
    narrower than a vector and than its output channels --, or a stem (``"stem"``: fewer
    input channels, a kernel past 1x1, at least a vector of output channels that block;
    it reads its NCHW input in place, :data:`STEM_NCHW_INPUT`), or one group per channel
    (depthwise, a channel multiplier of 1) over at least a vector of channels."""
    if node.op_type != "Conv" or len(node.inputs) < 2:
        return None
    x, w, y = node.inputs[0], node.inputs[1], node.outputs[0]
    weights = graph.constants.get(w)
    if weights is None or weights.ndim != 4 or len(graph.tensors[x].shape) != 4:
        return None
    if graph.tensors[x].dtype not in ("float32", "float64") or weights.dtype != \
            np.dtype(graph.tensors[x].dtype):
        return None
    m, cg = weights.shape[:2]
    c, group = graph.tensors[x].shape[1], int(node.attrs.get("group", 1))
    if len(graph.tensors[y].shape) != 4:
        return None
    ow = graph.tensors[y].shape[3]
    narrow = ow < CHANNEL_MULTIPLE and ow < m and weights[0, 0].size > 1
    if group == 1 and (cg >= CHANNEL_MULTIPLE or narrow) and channel_block(m) is not None:
        return "dense"
    if STEM_NCHW_INPUT and group == 1 and m >= CHANNEL_MULTIPLE and \
            channel_block(m) is not None and weights[0, 0].size > 1:
        return "stem"
    if group == c == m and cg == 1 and m >= CHANNEL_MULTIPLE:
        return "depthwise"
    return None


def nhwc_weights(w: np.ndarray, kind: str, widest: int = COLUMN_BLOCK) -> np.ndarray:
    """The weights of a channel-last Conv: :func:`blocked_weights` for a dense one (a stem's too),
    ``(KH, KW, C)`` for a depthwise one (``(C, 1, KH, KW)``: the channel innermost, the
    vector loop's)."""
    return w[:, 0].transpose(1, 2, 0) if kind == "depthwise" else blocked_weights(w, widest)


def wants_winograd(node: Node, graph: Graph) -> bool:
    """Whether a dense channel-last Conv (:func:`wants_nhwc`) can run by Winograd's
    ``F(m x m, 3x3)`` (:mod:`.winograd`): float32, 3x3, unit-stride and undilated, over
    at least a vector of input channels, and not a quantized convolution's exact
    integer sums in float32 (``polyc_exact``: Winograd's transforms round)."""
    if wants_nhwc(node, graph) != "dense" or node.attrs.get("polyc_exact"):
        return False
    weights = graph.constants[node.inputs[1]]
    if weights.dtype != np.float32 or weights.shape[2:] != (3, 3) or \
            weights.shape[1] < CHANNEL_MULTIPLE:
        return False
    return all(int(s) == 1 for s in node.attrs.get("strides", [1, 1])) and \
        all(int(d) == 1 for d in node.attrs.get("dilations", [1, 1]))


def winograd_weights(w: np.ndarray, m: int) -> np.ndarray:
    """``(M, C, 3, 3)`` weights as the transformed filters of Winograd's ``F(m x m,
    3x3)``, one ``(C, M)`` matrix per position of the tile: ``(alpha * alpha, C, M)``
    (:func:`.winograd.filter_transform`)."""
    from .winograd import filter_transform
    u = filter_transform(w, m)
    alpha, _, m, c = u.shape
    return u.reshape(alpha * alpha, m, c).transpose(0, 2, 1)


def pointwise_unpadded(node: Node, weights: np.ndarray) -> bool:
    """Whether the convolution ``node`` of ``weights`` is 1x1 with no padding."""
    return all(int(k) == 1 for k in weights.shape[2:]) and \
        not any(int(p) for p in node.attrs.get("pads", [])) and \
        node.attrs.get("auto_pad", "NOTSET") in ("NOTSET", b"NOTSET", "VALID", b"VALID")


def wants_subsampling(node: Node, graph: Graph) -> bool:
    """A group-1, unpadded, strided 1x1 Conv with constant weights over at least
    :data:`FLAT_PIXELS` output pixels: it reads only every ``stride``-th pixel, so the
    pixels are copied out first (see the module doc)."""
    if node.op_type != "Conv" or len(node.inputs) < 2:
        return False
    weights = graph.constants.get(node.inputs[1])
    if weights is None or weights.ndim < 3 or int(node.attrs.get("group", 1)) != 1:
        return False
    strides = [int(s) for s in node.attrs.get("strides", [1] * (weights.ndim - 2))]
    ys = graph.tensors[node.outputs[0]].shape
    return any(s > 1 for s in strides) and pointwise_unpadded(node, weights) and \
        len(ys) == weights.ndim and int(np.prod(ys[2:])) >= FLAT_PIXELS


#: the widths a weight block of a channel-last Conv may take, widest first: the register
#: tile's columns are one block, and the wider the block the fewer loads per FMA
CHANNEL_BLOCKS = (64, 48, 32, CHANNEL_MULTIPLE)


def channel_block(m: int, widest: int = COLUMN_BLOCK) -> int | None:
    """Output channels per weight block of a channel-last Conv: the widest of
    :data:`CHANNEL_BLOCKS` up to ``widest`` (the register tile's columns: 64, four
    AVX-512 float vectors; 16 on AVX2, whose tile is two 8-float vectors) that divides
    ``m``, else all ``m`` in one block up to 64 (24 channels: one and a half vectors);
    None past that (1000 channels: no block size fits). Which Convs block does not
    depend on ``widest`` (every width is a multiple of 16).

    A block as wide as the tile is one contiguous stream per tile; a wider one is read
    one tile's columns at a time, a run of a line or two a row apart. Zen 2 EPYC (AVX2),
    A/B in one process, blocks of 16 against up to 64 (the matmuls' column blocks
    likewise), time at 1 / 2 threads: MobileNetV2 0.97x / 0.95x, ResNet-50 0.97x /
    0.95x, BERT layer 0.95x / 0.94x, the MLP of batch 64 0.94x / 0.98x.

    Three vectors (48) come before two: MobileNetV2's 144 output channels took blocks of
    16, a register tile of 14 pixels by one vector (15 loads for 14 FMAs); in blocks of 48
    its tile is 8 pixels by three (11 loads for 24 FMAs). Zen 5, one process: its 56x56
    expand convs 0.135 -> 0.111 ms at 1 thread, 0.081 -> 0.065 at 2; the 112x112 one (96
    channels, 32 before) 0.175 -> 0.141 at 2; the model 0.97-0.98x at 1 and 2 threads."""
    return next((b for b in CHANNEL_BLOCKS if b <= max(widest, CHANNEL_MULTIPLE)
                 and m % b == 0), m if m <= 64 else None)


def blocked_weights(w: np.ndarray, widest: int = COLUMN_BLOCK) -> np.ndarray:
    """``(M, C, KH, KW)`` weights as ``(M / MB, KH, KW, C, MB)``: the weights of one block
    of ``MB`` output channels are one contiguous stream, in the order the channel-last
    contraction reads them (an ``(KH, KW, C, M)`` layout read ``MB`` channels at a time
    has a stride of ``M``: at 512 channels two blocks per 4 KB page, which the hardware
    prefetcher does not follow across pages). Blocks of :func:`channel_block`."""
    m, c, kh, kw = w.shape
    mb = channel_block(m, widest)
    return w.reshape(m // mb, mb, c, kh, kw).transpose(0, 3, 4, 2, 1)


def wants_transposed_gemm(node: Node, graph: Graph) -> bool:
    """A Gemm with ``transB=1`` and constant 2-D ``B`` (a fully-connected layer stored
    ``(out, in)``): its contraction would run along ``B``'s rows, a scalar reduction."""
    if node.op_type != "Gemm" or not int(node.attrs.get("transB", 0)) or len(node.inputs) < 2:
        return False
    b = graph.constants.get(node.inputs[1])
    return b is not None and b.ndim == 2


def wants_blocked_columns(node: Node, graph: Graph, constants: dict[str, np.ndarray]) -> bool:
    """A MatMul, or a Gemm without transposes, whose ``B`` is a 2-D constant of the
    input's float type with more than :data:`COLUMN_BLOCK` columns (or fewer that are no
    whole cache lines: :data:`PAD_NARROW_COLUMNS`), over an input of rank 2 or more:
    ``B`` is stored in column blocks (:func:`blocked_columns`). Read in
    its ``(K, N)`` layout, each register tile walks ``K`` rows a whole row of ``B``
    apart -- a page apart or more at 1024 columns and past, which the hardware
    prefetcher and the TLB follow poorly (matmul 2048: 70 GFLOP/s against 151
    blocked, on a Sapphire Rapids class Xeon)."""
    if node.op_type not in ("MatMul", "Gemm") or len(node.inputs) < 2:
        return False
    if node.op_type == "Gemm" and (int(node.attrs.get("transA", 0))
                                   or int(node.attrs.get("transB", 0))):
        return False
    b = constants.get(node.inputs[1])
    x = graph.tensors.get(node.inputs[0])
    if b is None or b.ndim != 2 or x is None or len(x.shape) < 2:
        return False
    if x.dtype not in ("float32", "float64") or b.dtype != np.dtype(x.dtype):
        return False
    return b.shape[1] > COLUMN_BLOCK or (
        PAD_NARROW_COLUMNS and b.shape[1] % _line_elements(b.dtype) != 0
        and x.shape[-2] >= NARROW_ROWS_MIN)


#: a constant ``B`` of at most :data:`COLUMN_BLOCK` columns that are not whole cache
#: lines (an MLP's 10 classes) is one block padded with zero columns to whole lines
#: (:func:`blocked_columns`), over at least ``NARROW_ROWS_MIN`` rows of ``A`` (for fewer,
#: a matrix-vector product, the padding would only add weight bytes to stream). gcc cut
#: a row of 10 floats into 8 + 2 lanes: two vector FMAs a step where 16 padded lanes take
#: one. MLP batch 64 (784-512-512-10), Zen 5: its last Gemm 13 -> 5 us
PAD_NARROW_COLUMNS = True
NARROW_ROWS_MIN = 16


def _line_elements(dtype: np.dtype) -> int:
    """Elements of ``dtype`` in a 64-byte cache line (a 512-bit vector)."""
    return 64 // np.dtype(dtype).itemsize


def blocked_columns(b: np.ndarray, widest: int = COLUMN_BLOCK) -> np.ndarray:
    """``(K, N)`` as ``(ceil(N / NB), K, NB)``, ``NB`` = ``widest`` (the register tile's
    columns, at most :data:`COLUMN_BLOCK`), the last block padded with zero columns: the
    ``K x NB`` block a register tile's columns read is one contiguous stream. At most
    :data:`COLUMN_BLOCK` columns are one block of whole cache lines."""
    k, n = b.shape
    line = _line_elements(b.dtype)
    nb = min(widest, COLUMN_BLOCK) if n > COLUMN_BLOCK else -(-n // line) * line
    nbk = -(-n // nb)
    padded = np.zeros((k, nbk * nb), b.dtype)
    padded[:, :n] = b
    return padded.reshape(k, nbk, nb).transpose(1, 0, 2)


def choose_conv_layouts(graph: Graph, stats: Counter | None = None,
                        winograd: bool | int = False, widest: int = COLUMN_BLOCK) -> Graph:
    """Make the Convs that run channel-last ``PolycConvNHWC`` between transpositions,
    with their weights laid out, and sink the transpositions (:func:`sink_transposes`);
    split each strided 1x1 Conv over many pixels into a strided ``Slice`` and a
    unit-stride Conv, and give each Gemm with ``transB=1`` and constant ``B`` the
    transposed ``B`` (``transB=0``: the layer then vectorizes along its outputs, a GEMV
    streaming contiguous rows); a MatMul or Gemm with a constant ``B`` of many columns
    then becomes ``PolycMatMulBlocked`` over ``B`` in column blocks. The new weights are
    new constants; the old ones go when nothing else reads them. With ``winograd``
    (True, or a tile: :func:`.winograd.tile_for`), a channel-last Conv that
    :func:`wants_winograd` becomes Winograd's three nodes (:data:`WINOGRAD_INPUT`)
    instead of ``PolycConvNHWC``. ``widest``: the register tile's columns, the widest
    weight block (:func:`channel_block`, :func:`blocked_columns`)."""
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
            value = np.ascontiguousarray(layout(constants[w]))
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

    node_names = {n.name for n in graph.nodes}

    def node_name(base: str) -> str:
        name, k = base, 1
        while name in node_names:
            name, k = f"{base}_{k}", k + 1
        node_names.add(name)
        return name

    def transposed_tensor(x: str, perm: tuple[int, ...], base: str) -> str:
        info = tensors[x]
        name = fresh(base)
        tensors[name] = TensorInfo(name, info.dtype, tuple(info.shape[p] for p in perm))
        return name

    def winograd_nodes(n: Node, xt: str, yt: str) -> list[Node]:
        """``n`` (NHWC ``xt`` -> ``yt``) as Winograd's input transform, a batched MatMul
        by the transformed weights over the flattened tiles and the output transform
        (with ``n``'s bias)."""
        from .winograd import tile_for
        dtype, c = tensors[xt].dtype, tensors[xt].shape[3]
        batch, oh, ow, m = tensors[yt].shape
        tile = tile_for(oh, ow, winograd)
        alpha, th, tw = tile + 2, -(-oh // tile), -(-ow // tile)
        tiles = (alpha, alpha, batch, th, tw)

        def tensor(tag: str, shape: tuple[int, ...]) -> str:
            name = fresh(f"{n.outputs[0]}_wino_{tag}")
            tensors[name] = TensorInfo(name, dtype, shape)
            return name

        def reshape(x: str, tag: str, shape: tuple[int, ...]) -> Node:
            to = constant(f"{n.name}_wino_{tag}_shape", np.asarray(shape, np.int64))
            return Node(node_name(f"{n.name}_wino_{tag}"), "Reshape", (x, to),
                        (tensor(tag, shape),))

        # more output channels than a column block: the products' weights in column
        # blocks too, one contiguous stream per block (7x7x512 layers: 3.6 -> 1.4 ms)
        blocked = m > COLUMN_BLOCK
        u = copy(n.inputs[1], f"winograd{tile}" + ("_blocked" if blocked else ""),
                 (lambda w: np.stack([blocked_columns(p, widest)
                                      for p in winograd_weights(w, tile)]))
                 if blocked else (lambda w: winograd_weights(w, tile)))
        geometry = {k: v for k, v in n.attrs.items() if k in ("pads", "auto_pad")}
        v = Node(node_name(f"{n.name}_wino_in"), WINOGRAD_INPUT, (xt,),
                 (tensor("v", tiles + (c,)),),
                 {**geometry, "polyc_tile": tile, "polyc_output": [oh, ow]})
        flat = reshape(v.outputs[0], "vflat", (alpha * alpha, batch * th * tw, c))
        mm = Node(node_name(f"{n.name}_wino_mm"), MATMUL_BLOCKED if blocked else "MatMul",
                  (flat.outputs[0], u),
                  (tensor("m", (alpha * alpha, batch * th * tw, m)),))
        products = reshape(mm.outputs[0], "mtiles", tiles + (m,))
        return [v, flat, mm, products,
                Node(n.name, WINOGRAD_OUTPUT, (products.outputs[0],) + n.inputs[2:], (yt,),
                     {"polyc_tile": tile})]

    for n in graph.nodes:
        kind = wants_nhwc(n, graph)
        if kind is not None:
            x, y = n.inputs[0], n.outputs[0]
            yt = transposed_tensor(y, TO_NHWC, f"{y}_nhwc")
            w = None if kind != "stem" and winograd is not False and wants_winograd(n, graph) \
                else copy(n.inputs[1], kind, lambda v, k=kind: nhwc_weights(v, k, widest))
            if kind == "stem":  # its NCHW input read in place
                nodes.append(dataclasses.replace(
                    n, op_type=CONV_NHWC, inputs=(x, w) + n.inputs[2:], outputs=(yt,),
                    attrs={**n.attrs, "polyc_input_layout": "nchw"}))
                stats["conv_stem_channels_last"] += 1
            else:
                xt = transposed_tensor(x, TO_NHWC, f"{x}_nhwc")
                nodes.append(Node(node_name(f"{n.name}_to_nhwc"), "Transpose", (x,), (xt,),
                                  {"perm": list(TO_NHWC)}))
                if w is None:
                    nodes.extend(winograd_nodes(n, xt, yt))
                    stats["conv_winograd"] += 1
                else:
                    nodes.append(dataclasses.replace(n, op_type=CONV_NHWC,
                                                     inputs=(xt, w) + n.inputs[2:], outputs=(yt,)))
            n = Node(node_name(f"{n.name}_to_nchw"), "Transpose", (yt,), (y,),
                     {"perm": list(TO_NCHW)})
            stats["conv_channels_last"] += 1
        elif wants_subsampling(n, graph):
            n = subsample(n)
            stats["conv_subsampled"] += 1
            subsampled += 1
        elif wants_transposed_gemm(n, graph):
            inputs = (n.inputs[0], copy(n.inputs[1], "t", np.transpose)) + n.inputs[2:]
            n = dataclasses.replace(n, inputs=inputs, attrs={**n.attrs, "transB": 0})
            stats["gemm_transposed"] += 1
        if wants_blocked_columns(n, graph, constants):
            attrs = {"alpha": float(n.attrs.get("alpha", 1.0)),
                     "beta": float(n.attrs.get("beta", 1.0))} if n.op_type == "Gemm" else {}
            inputs = (n.inputs[0], copy(n.inputs[1], "blocked",
                                        lambda v: blocked_columns(v, widest))) + n.inputs[2:]
            n = dataclasses.replace(n, op_type=MATMUL_BLOCKED, inputs=inputs, attrs=attrs)
            stats["matmul_blocked"] += 1
        nodes.append(n)
    channel_last_ints = any(n.op_type == "PolycConvDot" and
                            n.attrs.get("polyc_layout") == "nhwc" for n in nodes)
    if not transposed and not subsampled and not channel_last_ints:
        return graph
    graph = dataclasses.replace(graph, nodes=tuple(nodes), constants=constants, tensors=tensors)
    return eliminate_dead_nodes(_merge_transposes(sink_transposes(graph, stats), stats), stats)


def _merge_transposes(graph: Graph, stats: Counter) -> Graph:
    """One ``Transpose`` for each tensor and perm: two channel-last Convs reading one
    NCHW tensor (a residual block's first convolution and its projection shortcut) each
    brought their own transposition of it."""
    first: dict[tuple, str] = {}
    renames: dict[str, str] = {}
    nodes = []
    for n in graph.nodes:
        if renames:
            n = dataclasses.replace(n, inputs=tuple(renames.get(t, t) for t in n.inputs))
        if n.op_type == "Transpose" and len(n.outputs) == 1 and \
                n.outputs[0] not in graph.outputs:
            key = (n.inputs[0], tuple(int(p) for p in n.attrs.get("perm", ())))
            if key in first:
                renames[n.outputs[0]] = first[key]
                stats["transposes_merged"] += 1
                continue
            first[key] = n.outputs[0]
        nodes.append(n)
    return dataclasses.replace(graph, nodes=tuple(nodes)) if renames else graph


#: ops that act on each element alone (any other input a scalar): they commute with a
#: Transpose of their input
_UNARY = frozenset([
    "Relu", "LeakyRelu", "Clip", "Sigmoid", "HardSigmoid", "HardSwish", "Tanh", "Elu", "Selu",
    "Celu", "Softplus", "Softsign", "Mish", "Gelu", "Erf", "Exp", "Log", "Neg", "Abs", "Sqrt",
    "Reciprocal", "Swish", "ThresholdedRelu", "Floor", "Ceil", "Round", "Sign", "Cast",
    "PolycRoundHalf"])
#: ops of one tensor and scalar parameters that act on each element alone: they commute
#: with a Transpose of that tensor when the parameters are scalars (per-tensor
#: quantization; a per-axis scale is not, and keeps the Transpose where it is)
_SCALED = frozenset(["QuantizeLinear", "DequantizeLinear"])
#: pools that run channel-last (``polyc_layout`` ``"nhwc"``: onnx_ops_nn's pools) when
#: their input is a Transpose from channel-last
_POOLS = frozenset(["MaxPool", "AveragePool", "GlobalAveragePool", "GlobalMaxPool"])
#: ops of several same-shaped operands, element by element (scalars broadcast)
_NARY = frozenset(["Add", "Sub", "Mul", "Div", "Pow", "Max", "Min", "Sum", "Mean"])
#: ops of one tensor and parameters per channel (axis 1) or scalar, element by element,
#: that run channel-last (``polyc_layout`` ``"nhwc"``: the parameters then index the last
#: axis) when their tensor is a Transpose from channel-last: the requantization of a
#: quantized convolution's sums
_PER_CHANNEL = frozenset(["PolycRequantize"])


def sink_transposes(graph: Graph, stats: Counter | None = None) -> Graph:
    """Move each ``Transpose`` below the elementwise ops that read it, and cancel the
    pairs that meet: ``Relu(Transpose(a, p))`` becomes ``Transpose(Relu(a), p)``,
    ``Add(Transpose(a, p), Transpose(b, p))`` becomes ``Transpose(Add(a, b), p)``, and
    ``Transpose(Transpose(a, p), q)`` becomes ``a`` when ``q`` undoes ``p`` (else one
    ``Transpose``). Between two channel-last Convs the transposition back to NCHW then
    meets the next one's transposition to NHWC, through the bias, activation and
    residual additions in between, and both go: the activations stay channel-last."""
    stats = stats if stats is not None else Counter()
    tensors = dict(graph.tensors)
    source: dict[str, tuple[str, tuple[int, ...]]] = {}  # Transpose output -> (input, perm)
    renames: dict[str, str] = {}
    names = {n.name for n in graph.nodes}
    nodes: list[Node] = []

    def fresh(base: str, taken) -> str:
        name, k = base, 1
        while name in taken:
            name, k = f"{base}_{k}", k + 1
        return name

    def scalar(t: str) -> bool:
        return not t or all(d == 1 for d in tensors[t].shape)

    def sunk(n: Node) -> tuple[str, ...] | None:
        """The perm to move below ``n`` (all its non-scalar inputs Transposes by it)."""
        if n.op_type in _POOLS and len(n.outputs) == 1 and len(n.inputs) == 1 and \
                n.inputs[0] in source and source[n.inputs[0]][1] == TO_NCHW and \
                not n.attrs.get("polyc_layout"):
            return TO_NCHW  # it pools channel-last instead (polyc_layout "nhwc")
        if n.op_type in _PER_CHANNEL:
            return TO_NCHW if _channel_last_ready(n, source, tensors) else None
        if len(n.outputs) != 1 or n.op_type not in _UNARY | _SCALED | _NARY:
            return None
        wide = [t for t in n.inputs if not scalar(t)]
        if not wide or any(t not in source for t in wide):
            return None
        if n.op_type not in _NARY and wide != [n.inputs[0]]:
            return None
        perms = {source[t][1] for t in wide}
        shapes = {tensors[t].shape for t in wide}
        if len(perms) != 1 or shapes != {tensors[n.outputs[0]].shape}:
            return None
        return perms.pop()

    for n in graph.nodes:
        if renames:
            n = dataclasses.replace(n, inputs=tuple(renames.get(t, t) for t in n.inputs))
        if n.op_type == "Transpose" and n.inputs[0] in source:
            x, p = source[n.inputs[0]]
            q = tuple(p[i] for i in _perm(n, tensors))
            if q == tuple(range(len(q))) and n.outputs[0] not in graph.outputs:
                renames[n.outputs[0]] = x
                stats["transposes_cancelled"] += 2
                continue
            n = dataclasses.replace(n, inputs=(x,), attrs={**n.attrs, "perm": list(q)})
        perm = sunk(n)
        if perm is not None:
            y = n.outputs[0]
            inner = fresh(f"{y}_t", tensors)
            shape = [0] * len(perm)  # Transpose(inner, perm) is y
            for i, p in enumerate(perm):
                shape[p] = tensors[y].shape[i]
            tensors[inner] = TensorInfo(inner, tensors[y].dtype, tuple(shape))
            attrs = {**n.attrs, "polyc_layout": "nhwc"} \
                if n.op_type in _POOLS | _PER_CHANNEL else n.attrs
            nodes.append(dataclasses.replace(
                n, inputs=tuple(source[t][0] if t in source else t for t in n.inputs),
                outputs=(inner,), attrs=attrs))
            name = fresh(f"{n.name}_transpose", names)
            names.add(name)
            n = Node(name, "Transpose", (inner,), (y,), {"perm": list(perm)})
            stats["transposes_sunk"] += 1
        if n.op_type == "Transpose":
            source[n.outputs[0]] = (n.inputs[0], _perm(n, tensors))
        nodes.append(n)
    return dataclasses.replace(graph, nodes=tuple(nodes), tensors=tensors)


def _channel_last_ready(n: Node, source: dict[str, tuple[str, tuple[int, ...]]],
                        tensors) -> bool:
    """Whether the per-channel op ``n`` (:data:`_PER_CHANNEL`) can run channel-last
    below the Transpose of its first input: that Transpose brings it from channel-last,
    ``n`` is still NCHW and of one shape with it, and every other input is a scalar or a
    vector along the channels."""
    x = n.inputs[0]
    if len(n.outputs) != 1 or x not in source or source[x][1] != TO_NCHW or \
            n.attrs.get("polyc_layout") or \
            tensors[x].shape != tensors[n.outputs[0]].shape:
        return False
    channels = tensors[x].shape[1]
    for t in n.inputs[1:]:
        if not t:
            continue
        if t in source:
            return False
        shape = tensors[t].shape
        if any(d != 1 for d in shape) and tuple(shape) != (channels,):
            return False
    return True


def _perm(n: Node, tensors) -> tuple[int, ...]:
    r = len(tensors[n.inputs[0]].shape)
    return tuple(int(p) % r for p in n.attrs.get("perm", range(r - 1, -1, -1)))
