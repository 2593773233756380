"""ONNX models built for the tests and benchmarks, with seeded random weights.

* :func:`mlp`, :func:`small_cnn`, :func:`transformer_layer`: models written with
  ``onnx.helper`` (opset 17, IR version 8 so that onnxruntime accepts them);
* :func:`light_model` / :func:`randomized_light_model`: the real architectures that ship
  inside the onnx package (ResNet-50, VGG-19, ...), as shipped (constant weights) or
  with their weight fills replaced by seeded random tensors.
"""
from __future__ import annotations

import os

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

OPSET = 17
IR_VERSION = 8
LIGHT_DIR = os.path.join(os.path.dirname(onnx.__file__), "backend", "test", "data", "light")
LIGHT_MODELS = ("resnet50", "squeezenet", "vgg19", "inception_v1", "inception_v2",
                "densenet121", "shufflenet", "bvlc_alexnet", "zfnet512")


class _Builder:
    def __init__(self, seed: int):
        self.rng = np.random.default_rng(seed)
        self.nodes: list[onnx.NodeProto] = []
        self.inits: list[onnx.TensorProto] = []
        self.count = 0

    def weight(self, name: str, shape: tuple[int, ...], scale: float | None = None) -> str:
        fan_in = int(np.prod(shape[1:])) if len(shape) > 1 else shape[0]
        s = scale if scale is not None else np.sqrt(2.0 / max(fan_in, 1))
        value = (self.rng.standard_normal(shape) * s).astype(np.float32)
        self.inits.append(numpy_helper.from_array(value, name))
        return name

    def const(self, name: str, value: np.ndarray) -> str:
        self.inits.append(numpy_helper.from_array(np.asarray(value), name))
        return name

    def op(self, op_type: str, inputs: list[str], n_out: int = 1, **attrs) -> str | list[str]:
        self.count += 1
        outs = [f"{op_type.lower()}{self.count}_{i}" for i in range(n_out)]
        self.nodes.append(helper.make_node(op_type, inputs, outs, name=f"{op_type}_{self.count}",
                                           **attrs))
        return outs[0] if n_out == 1 else outs

    def model(self, name: str, inputs, outputs) -> onnx.ModelProto:
        graph = helper.make_graph(self.nodes, name, inputs, outputs, self.inits)
        m = helper.make_model(graph, opset_imports=[helper.make_opsetid("", OPSET)])
        m.ir_version = IR_VERSION
        onnx.checker.check_model(m)
        return m


def _io(name: str, shape) -> onnx.ValueInfoProto:
    return helper.make_tensor_value_info(name, TensorProto.FLOAT, list(shape))


def mlp(batch: int = 4, d_in: int = 64, hidden: int = 128, d_out: int = 10,
        seed: int = 0) -> onnx.ModelProto:
    """x -> MatMul+Add -> Relu -> MatMul+Add -> Relu -> Gemm."""
    b = _Builder(seed)
    h = b.op("Add", [b.op("MatMul", ["x", b.weight("w1", (d_in, hidden))]),
                     b.weight("b1", (hidden,), 0.1)])
    h = b.op("Relu", [h])
    h = b.op("Relu", [b.op("Add", [b.op("MatMul", [h, b.weight("w2", (hidden, hidden))]),
                                   b.weight("b2", (hidden,), 0.1)])])
    y = b.op("Gemm", [h, b.weight("w3", (d_out, hidden)), b.weight("b3", (d_out,), 0.1)],
             transB=1)
    b.nodes[-1].output[0] = "y"
    del y
    return b.model("mlp", [_io("x", (batch, d_in))], [_io("y", (batch, d_out))])


def small_cnn(batch: int = 1, size: int = 32, seed: int = 0) -> onnx.ModelProto:
    """Conv+BN+Relu, MaxPool, Conv(stride 2)+Relu, residual Add, GlobalAveragePool, Gemm."""
    b = _Builder(seed)
    c = b.op("Conv", ["x", b.weight("c1w", (16, 3, 3, 3)), b.weight("c1b", (16,), 0.1)],
             pads=[1, 1, 1, 1])
    c = b.op("BatchNormalization", [c, b.const("bn_s", 1 + 0.1 * b.rng.standard_normal(16)
                                                .astype(np.float32)),
                                    b.weight("bn_b", (16,), 0.1), b.weight("bn_m", (16,), 0.1),
                                    b.const("bn_v", (0.5 + b.rng.random(16)).astype(np.float32))])
    c = b.op("Relu", [c])
    c = b.op("MaxPool", [c], kernel_shape=[2, 2], strides=[2, 2])
    d = b.op("Relu", [b.op("Conv", [c, b.weight("c2w", (32, 16, 3, 3)),
                                    b.weight("c2b", (32,), 0.1)], pads=[1, 1, 1, 1],
                           strides=[2, 2])])
    e = b.op("Conv", [d, b.weight("c3w", (32, 32, 3, 3)), b.weight("c3b", (32,), 0.1)],
             pads=[1, 1, 1, 1])
    e = b.op("Relu", [b.op("Add", [e, d])])
    g = b.op("Flatten", [b.op("GlobalAveragePool", [e])])
    b.op("Gemm", [g, b.weight("fcw", (10, 32)), b.weight("fcb", (10,), 0.1)], transB=1)
    b.nodes[-1].output[0] = "y"
    return b.model("small_cnn", [_io("x", (batch, 3, size, size))], [_io("y", (batch, 10))])


def transformer_layer(batch: int = 1, seq: int = 16, d_model: int = 64, heads: int = 4,
                      d_ff: int = 128, seed: int = 0) -> onnx.ModelProto:
    """A post-norm encoder layer: multi-head attention, residual + LayerNorm, GELU FFN,
    residual + LayerNorm."""
    b = _Builder(seed)
    dk = d_model // heads

    def linear(x: str, n_in: int, n_out: int, tag: str) -> str:
        return b.op("Add", [b.op("MatMul", [x, b.weight(f"{tag}_w", (n_in, n_out),
                                                        1 / np.sqrt(n_in))]),
                            b.weight(f"{tag}_b", (n_out,), 0.1)])

    def heads_first(x: str) -> str:  # (B, S, D) -> (B, H, S, dk)
        r = b.op("Reshape", [x, b.const(f"shape{b.count}", np.array([batch, seq, heads, dk]))])
        return b.op("Transpose", [r], perm=[0, 2, 1, 3])

    def layernorm(x: str, tag: str) -> str:
        return b.op("LayerNormalization", [x, b.const(f"{tag}_g", np.ones(d_model, np.float32)
                                                      + 0.1 * b.rng.standard_normal(d_model)
                                                      .astype(np.float32)),
                                           b.weight(f"{tag}_b", (d_model,), 0.1)],
                    axis=-1, epsilon=1e-5)

    q, k, v = (heads_first(linear("x", d_model, d_model, t)) for t in ("q", "k", "v"))
    kt = b.op("Transpose", [k], perm=[0, 1, 3, 2])
    scores = b.op("Div", [b.op("MatMul", [q, kt]),
                          b.const("sqrt_dk", np.array(np.sqrt(dk), np.float32))])
    attn = b.op("Softmax", [scores], axis=-1)
    ctx = b.op("Transpose", [b.op("MatMul", [attn, v])], perm=[0, 2, 1, 3])
    ctx = b.op("Reshape", [ctx, b.const("merge", np.array([batch, seq, d_model]))])
    h = layernorm(b.op("Add", ["x", linear(ctx, d_model, d_model, "o")]), "ln1")
    f = linear(h, d_model, d_ff, "ff1")
    # GELU, exact form: 0.5 * f * (1 + erf(f / sqrt(2)))
    erf = b.op("Erf", [b.op("Div", [f, b.const("sqrt2", np.array(np.sqrt(2), np.float32))])])
    gelu = b.op("Mul", [b.op("Mul", [f, b.const("half", np.array(0.5, np.float32))]),
                        b.op("Add", [erf, b.const("one", np.array(1.0, np.float32))])])
    out = layernorm(b.op("Add", [h, linear(gelu, d_ff, d_model, "ff2")]), "ln2")
    b.nodes[-1].output[0] = "y"
    del out
    return b.model("transformer_layer", [_io("x", (batch, seq, d_model))],
                   [_io("y", (batch, seq, d_model))])


def lenet5(batch: int = 64, seed: int = 0) -> onnx.ModelProto:
    """LeNet-5 on 28x28 images: Conv 5x5 (padded) + Relu + MaxPool, Conv 5x5 + Relu +
    MaxPool, three Gemm layers (400 -> 120 -> 84 -> 10)."""
    b = _Builder(seed)
    c = b.op("Relu", [b.op("Conv", ["x", b.weight("c1w", (6, 1, 5, 5)),
                                    b.weight("c1b", (6,), 0.1)], pads=[2, 2, 2, 2])])
    c = b.op("MaxPool", [c], kernel_shape=[2, 2], strides=[2, 2])
    c = b.op("Relu", [b.op("Conv", [c, b.weight("c2w", (16, 6, 5, 5)),
                                    b.weight("c2b", (16,), 0.1)])])
    c = b.op("Flatten", [b.op("MaxPool", [c], kernel_shape=[2, 2], strides=[2, 2])])
    for i, (n_in, n_out) in enumerate(((400, 120), (120, 84))):
        c = b.op("Relu", [b.op("Gemm", [c, b.weight(f"f{i}w", (n_out, n_in)),
                                        b.weight(f"f{i}b", (n_out,), 0.1)], transB=1)])
    b.op("Gemm", [c, b.weight("f2w", (10, 84)), b.weight("f2b", (10,), 0.1)], transB=1)
    b.nodes[-1].output[0] = "y"
    return b.model("lenet5", [_io("x", (batch, 1, 28, 28))], [_io("y", (batch, 10))])


def _conv_bn(b: _Builder, x: str, c_in: int, c_out: int, k: int, stride: int = 1,
             group: int = 1, act: str | None = "Relu") -> str:
    """Conv (no bias, ``k x k``, same padding) + BatchNormalization (+ Relu or Relu6)."""
    tag = f"cv{b.count}"
    y = b.op("Conv", [x, b.weight(f"{tag}_w", (c_out, c_in // group, k, k))],
             pads=[k // 2] * 4, strides=[stride, stride], group=group)
    y = b.op("BatchNormalization", [
        y, b.const(f"{tag}_s", (1 + 0.1 * b.rng.standard_normal(c_out)).astype(np.float32)),
        b.weight(f"{tag}_b", (c_out,), 0.1), b.weight(f"{tag}_m", (c_out,), 0.1),
        b.const(f"{tag}_v", (0.5 + b.rng.random(c_out)).astype(np.float32))])
    if act == "Relu":
        return b.op("Relu", [y])
    if act == "Relu6":
        return b.op("Clip", [y, b.const(f"{tag}_lo", np.array(0, np.float32)),
                             b.const(f"{tag}_hi", np.array(6, np.float32))])
    return y


def _classifier(b: _Builder, x: str, channels: int, classes: int) -> None:
    g = b.op("Flatten", [b.op("GlobalAveragePool", [x])])
    b.op("Gemm", [g, b.weight("fc_w", (classes, channels)), b.weight("fc_b", (classes,), 0.1)],
         transB=1)
    b.nodes[-1].output[0] = "y"


def resnet18(batch: int = 1, size: int = 224, classes: int = 1000,
             seed: int = 0) -> onnx.ModelProto:
    """ResNet-18 (v1, basic blocks of two 3x3 convolutions; BatchNormalization after
    every convolution, a 1x1 stride-2 projection where the shape changes)."""
    b = _Builder(seed)
    x = _conv_bn(b, "x", 3, 64, 7, 2)
    x = b.op("MaxPool", [x], kernel_shape=[3, 3], strides=[2, 2], pads=[1, 1, 1, 1])
    c_in = 64
    for c_out, stride in ((64, 1), (128, 2), (256, 2), (512, 2)):
        for block in range(2):
            s = stride if block == 0 else 1
            y = _conv_bn(b, x, c_in, c_out, 3, s)
            y = _conv_bn(b, y, c_out, c_out, 3, 1, act=None)
            short = x if s == 1 and c_in == c_out else _conv_bn(b, x, c_in, c_out, 1, s, act=None)
            x = b.op("Relu", [b.op("Add", [y, short])])
            c_in = c_out
    _classifier(b, x, 512, classes)
    return b.model("resnet18", [_io("x", (batch, 3, size, size))], [_io("y", (batch, classes))])


def mobilenet_v2(batch: int = 1, size: int = 224, classes: int = 1000,
                 seed: int = 0) -> onnx.ModelProto:
    """MobileNetV2 (width 1.0): inverted residual blocks -- 1x1 expansion + Relu6, 3x3
    depthwise convolution (group = channels) + Relu6, 1x1 linear projection, residual
    Add where the shape allows; BatchNormalization after every convolution."""
    b = _Builder(seed)
    x = _conv_bn(b, "x", 3, 32, 3, 2, act="Relu6")
    c_in = 32
    for t, c_out, n, stride in ((1, 16, 1, 1), (6, 24, 2, 2), (6, 32, 3, 2), (6, 64, 4, 2),
                                (6, 96, 3, 1), (6, 160, 3, 2), (6, 320, 1, 1)):
        for i in range(n):
            s = stride if i == 0 else 1
            hidden = c_in * t
            y = x if t == 1 else _conv_bn(b, x, c_in, hidden, 1, act="Relu6")
            y = _conv_bn(b, y, hidden, hidden, 3, s, group=hidden, act="Relu6")
            y = _conv_bn(b, y, hidden, c_out, 1, act=None)
            x = b.op("Add", [x, y]) if s == 1 and c_in == c_out else y
            c_in = c_out
    x = _conv_bn(b, x, c_in, 1280, 1, act="Relu6")
    _classifier(b, x, 1280, classes)
    return b.model("mobilenet_v2", [_io("x", (batch, 3, size, size))],
                   [_io("y", (batch, classes))])


def bert_layer(batch: int = 1, seq: int = 128, seed: int = 0) -> onnx.ModelProto:
    """One BERT-base encoder layer: :func:`transformer_layer` at d_model 768, 12 heads,
    FFN 3072, sequence 128."""
    return transformer_layer(batch, seq, 768, 12, 3072, seed)


def detector_tail(boxes: int = 500, classes: int = 20, per_class: int = 50,
                  iou: float = 0.5, score: float = 0.3) -> onnx.ModelProto:
    """A detector's post-processing: NonMaxSuppression per class, then the kept boxes
    gathered (outputs whose length depends on the data)."""
    from onnx import helper, numpy_helper
    consts = [numpy_helper.from_array(np.array(v, dt), n) for n, v, dt in (
        ("k", [per_class], np.int64), ("iou", [iou], np.float32),
        ("score", [score], np.float32), ("two", [2], np.int64), ("one", [1], np.int64),
        ("zero", [0], np.int64))]
    nodes = [helper.make_node("NonMaxSuppression", ["boxes", "scores", "k", "iou", "score"],
                              ["selected"]),
             helper.make_node("Gather", ["selected", "two"], ["column"], axis=1),
             helper.make_node("Squeeze", ["column", "one"], ["index"]),
             helper.make_node("Squeeze", ["boxes", "zero"], ["all_boxes"]),
             helper.make_node("Gather", ["all_boxes", "index"], ["kept_boxes"], axis=0)]
    graph = helper.make_graph(nodes, "detector_tail",
                              [_io("boxes", (1, boxes, 4)), _io("scores", (1, classes, boxes))],
                              [helper.make_tensor_value_info("selected", onnx.TensorProto.INT64,
                                                             None),
                               helper.make_tensor_value_info("kept_boxes",
                                                             onnx.TensorProto.FLOAT, None)],
                              consts)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)],
                             ir_version=8)


# -- the architectures shipped with onnx ---------------------------------------------------

def light_model(name: str) -> onnx.ModelProto:
    return onnx.load(os.path.join(LIGHT_DIR, f"light_{name}.onnx"))


def light_expected_output(name: str) -> np.ndarray:
    t = onnx.TensorProto()
    with open(os.path.join(LIGHT_DIR, f"light_{name}_output_0.pb"), "rb") as f:
        t.ParseFromString(f.read())
    return numpy_helper.to_array(t)


def randomized_light_model(name: str, seed: int = 0, logits: bool = True,
                           gain: float = 1.0) -> onnx.ModelProto:
    """The architecture with each ConstantOfShape weight fill replaced by a seeded random
    initializer, scaled by its use (He-style for Conv/Gemm weights, near 1 for scales and
    variances, small for biases and means) so activations stay finite through the net.

    With ``logits``, a final Softmax becomes an Identity: random weights often saturate
    the softmax to a one-hot vector, which would hide errors in everything before it.
    ``gain`` scales the Conv/Gemm weights (below 1 keeps a residual net's activations
    within float16's range)."""
    m = light_model(name)
    if logits:
        for n in m.graph.node:
            if n.op_type == "Softmax" and n.output[0] in {o.name for o in m.graph.output}:
                n.op_type = "Identity"
                del n.attribute[:]
    rng = np.random.default_rng(seed)
    consumers: dict[str, tuple[str, int]] = {}
    for n in m.graph.node:
        for i, x in enumerate(n.input):
            consumers.setdefault(x, (n.op_type, i))
    keep, inits = [], []
    for n in m.graph.node:
        if n.op_type != "ConstantOfShape":
            keep.append(n)
            continue
        shape = _constant_shape(m, n.input[0]) if n.input else ()
        op, slot = consumers.get(n.output[0], ("", 0))
        fill = _random_fill(rng, shape, op, slot)
        if op in ("Conv", "Gemm", "MatMul") and slot == 1:
            fill = (fill * gain).astype(np.float32)
        inits.append(numpy_helper.from_array(fill, n.output[0]))
    del m.graph.node[:]
    m.graph.node.extend(keep)
    used = {x for n in keep for x in n.input}
    kept_inits = [t for t in m.graph.initializer if t.name in used]
    del m.graph.initializer[:]
    m.graph.initializer.extend(kept_inits + inits)
    names = {t.name for t in m.graph.initializer}
    kept_inputs = [i for i in m.graph.input if i.name not in names and i.name in used]
    del m.graph.input[:]
    m.graph.input.extend(kept_inputs)
    m.ir_version = max(m.ir_version, 4)  # initializers need not be graph inputs from IR 4 on
    return m


def _constant_shape(m: onnx.ModelProto, name: str) -> tuple[int, ...]:
    for t in m.graph.initializer:
        if t.name == name:
            return tuple(int(v) for v in numpy_helper.to_array(t))
    for n in m.graph.node:
        if n.op_type == "Constant" and n.output[0] == name:
            return tuple(int(v) for v in numpy_helper.to_array(n.attribute[0].t))
    raise KeyError(name)


def _random_fill(rng, shape, op: str, slot: int) -> np.ndarray:
    shape = tuple(shape)
    if op in ("Conv", "Gemm", "MatMul") and slot == 1:
        fan_in = int(np.prod(shape[1:])) if op == "Conv" else shape[-1]
        return (rng.standard_normal(shape) * np.sqrt(2.0 / max(fan_in, 1))).astype(np.float32)
    if op == "BatchNormalization" and slot in (1, 4):  # scale, variance
        return (0.5 + rng.random(shape)).astype(np.float32)
    if op == "Mul" or (op == "Unsqueeze" and slot == 0):
        return (0.5 + rng.random(shape)).astype(np.float32)
    return (0.1 * rng.standard_normal(shape)).astype(np.float32)


def to_float16(model: onnx.ModelProto) -> onnx.ModelProto:
    """The model with every float32 tensor float16: initializers, graph inputs and
    outputs, Constant values, Cast targets and ConstantOfShape fills (the value records
    are dropped; shape inference gives them again)."""
    m = onnx.ModelProto()
    m.CopyFrom(model)
    F32, F16 = onnx.TensorProto.FLOAT, onnx.TensorProto.FLOAT16

    def half(t: onnx.TensorProto) -> None:
        if t.data_type == F32:
            t.CopyFrom(numpy_helper.from_array(numpy_helper.to_array(t).astype(np.float16),
                                               t.name))
    for t in m.graph.initializer:
        half(t)
    for v in list(m.graph.input) + list(m.graph.output):
        if v.type.tensor_type.elem_type == F32:
            v.type.tensor_type.elem_type = F16
    for n in m.graph.node:
        for a in n.attribute:
            if a.type == onnx.AttributeProto.TENSOR:
                half(a.t)
            if n.op_type == "Cast" and a.name == "to" and a.i == F32:
                a.i = F16
    del m.graph.value_info[:]
    return m


def quantize_qdq(model: onnx.ModelProto, feeds: list[dict[str, np.ndarray]],
                 per_channel: bool = True) -> onnx.ModelProto:
    """The model quantized by onnxruntime's static quantizer in QDQ form (uint8
    activations, int8 weights, per output channel by default), calibrated on ``feeds``."""
    import sys
    import tempfile

    # onnxruntime's quantizer imports its own top-level "onnx_model" module: hide this
    # directory's examples/onnx_model.py while it loads
    here = os.path.dirname(os.path.abspath(__file__))
    saved_path, saved_module = list(sys.path), sys.modules.pop("onnx_model", None)
    sys.path[:] = [p for p in sys.path if os.path.abspath(p or os.curdir) != here]
    try:
        from onnxruntime.quantization import (CalibrationDataReader, QuantFormat, QuantType,
                                              quantize_static)
        from onnxruntime.quantization.shape_inference import quant_pre_process
    finally:
        sys.path[:] = saved_path
        if saved_module is not None:
            sys.modules["onnx_model"] = saved_module

    class Reader(CalibrationDataReader):
        def __init__(self) -> None:
            self.it = iter(feeds)

        def get_next(self):
            return next(self.it, None)
    opset = max((o.version for o in model.opset_import if o.domain in ("", "ai.onnx")),
                default=0)
    if opset < 13:  # per-channel DequantizeLinear (its axis) needs opset 13
        from onnx import version_converter
        model = version_converter.convert_version(model, 13)
    with tempfile.TemporaryDirectory() as d:
        src, dst = os.path.join(d, "model.onnx"), os.path.join(d, "model_qdq.onnx")
        pre = os.path.join(d, "model_pre.onnx")
        onnx.save(model, src)
        # onnxruntime's recommended pre-processing: shapes, and BatchNormalization folded
        # into the convolutions (else each is quantized apart)
        quant_pre_process(src, pre, skip_symbolic_shape=True)
        quantize_static(pre, dst, Reader(), quant_format=QuantFormat.QDQ,
                        activation_type=QuantType.QUInt8, weight_type=QuantType.QInt8,
                        per_channel=per_channel)
        return onnx.load(dst)


def onnxruntime_outputs(model: onnx.ModelProto, feeds: dict[str, np.ndarray],
                        threads: int = 1, optimize: bool = True) -> list[np.ndarray]:
    """onnxruntime's outputs; with ``optimize=False`` its graph is run node by node as
    written (a QDQ model's convolutions in float between its Quantize/DequantizeLinear
    nodes: exact, where onnxruntime's fused uint8 kernels without VNNI saturate their
    16-bit pair sums, as on AVX2)."""
    import onnxruntime as ort
    opts = ort.SessionOptions()
    if not optimize:
        opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    opts.intra_op_num_threads = threads
    opts.inter_op_num_threads = 1
    opts.log_severity_level = 3
    sess = ort.InferenceSession(model.SerializeToString(), opts,
                                providers=["CPUExecutionProvider"])
    return sess.run(None, feeds)


def light_input_feeds(model: onnx.ModelProto) -> dict[str, np.ndarray]:
    """The inputs onnx's backend test runner feeds the light models (``arange(n) / n``),
    which the shipped expected outputs were computed from."""
    inits = {t.name for t in model.graph.initializer}
    feeds = {}
    for i in model.graph.input:
        if i.name not in inits:
            shape = [d.dim_value or 1 for d in i.type.tensor_type.shape.dim]
            n = int(np.prod(shape))
            feeds[i.name] = (np.arange(n).reshape(shape) / n).astype(np.float32)
    return feeds


def input_feeds(model: onnx.ModelProto, seed: int = 0) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    inits = {t.name for t in model.graph.initializer}
    feeds = {}
    for i in model.graph.input:
        if i.name in inits:
            continue
        shape = [d.dim_value for d in i.type.tensor_type.shape.dim]
        feeds[i.name] = rng.standard_normal(shape).astype(np.float32)
    return feeds


if __name__ == "__main__":
    # (re)write the small models bundled in examples/
    import sys
    out = os.path.dirname(os.path.abspath(__file__))
    for build in (small_cnn, mlp, transformer_layer):
        path = os.path.join(out, f"{build.__name__}.onnx")
        if "--write" in sys.argv:
            onnx.save(build(), path)
            print("wrote", path)
        else:
            print(build.__name__, "ok:", len(build().graph.node), "nodes")
