"""Benchmark: ResNet-50's convolution layers, each as a one-Conv ONNX model (Conv with
bias, then Relu, weights as initializers), compiled by polyc against onnxruntime.

    python3 examples/benchmarks/bench_conv.py [--repeat 15] [--rounds 3] [--threads 1,2]
                                              [--layers 3x3-512-7,...]

Every distinct (C, M, H, kernel, stride) of ResNet-50 v1 (batch 1) is a layer; each is
timed as in bench_onnx.py (a child process per thread count with OMP_NUM_THREADS and
OMP_PROC_BIND=close, each side in its own blocks, medians of medians) and its output is
checked against onnxruntime's beside the figure. The layout polyc chose (NCHW,
channel-last, or Winograd's F(m x m, 3x3) for the unit-stride 3x3 layers:
frontend/onnx_layout.py) is printed too; GFLOP/s count the direct convolution's
multiply-adds (for a Winograd layer, an effective rate).
"""
from __future__ import annotations

import argparse
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

#: name -> (C, M, H (= W), kernel, stride, pad): ResNet-50 v1's distinct conv layers
LAYERS = {
    "7x7-64-224-s2": (3, 64, 224, 7, 2, 3),
    "1x1-64-56": (64, 64, 56, 1, 1, 0),
    "3x3-64-56": (64, 64, 56, 3, 1, 1),
    "1x1-64x256-56": (64, 256, 56, 1, 1, 0),
    "1x1-256x64-56": (256, 64, 56, 1, 1, 0),
    "1x1-256x128-56": (256, 128, 56, 1, 1, 0),
    "3x3-128-56-s2": (128, 128, 56, 3, 2, 1),
    "1x1-256x512-56-s2": (256, 512, 56, 1, 2, 0),
    "1x1-128x512-28": (128, 512, 28, 1, 1, 0),
    "1x1-512x128-28": (512, 128, 28, 1, 1, 0),
    "3x3-128-28": (128, 128, 28, 3, 1, 1),
    "3x3-256-28-s2": (256, 256, 28, 3, 2, 1),
    "1x1-512x1024-28-s2": (512, 1024, 28, 1, 2, 0),
    "1x1-256x1024-14": (256, 1024, 14, 1, 1, 0),
    "1x1-1024x256-14": (1024, 256, 14, 1, 1, 0),
    "3x3-256-14": (256, 256, 14, 3, 1, 1),
    "3x3-512-14-s2": (512, 512, 14, 3, 2, 1),
    "1x1-1024x2048-14-s2": (1024, 2048, 14, 1, 2, 0),
    "1x1-512x2048-7": (512, 2048, 7, 1, 1, 0),
    "1x1-2048x512-7": (2048, 512, 7, 1, 1, 0),
    "3x3-512-7": (512, 512, 7, 3, 1, 1),
}


def conv_model(c: int, m: int, h: int, k: int, stride: int, pad: int):
    import numpy as np
    from onnx import TensorProto, helper, numpy_helper
    rng = np.random.default_rng(0)
    oh = (h + 2 * pad - k) // stride + 1
    w = (rng.standard_normal((m, c, k, k)) * (2.0 / (c * k * k)) ** 0.5).astype(np.float32)
    b = (0.1 * rng.standard_normal(m)).astype(np.float32)
    nodes = [helper.make_node("Conv", ["x", "W", "B"], ["c"], pads=[pad] * 4,
                              strides=[stride] * 2),
             helper.make_node("Relu", ["c"], ["y"])]
    g = helper.make_graph(nodes, "conv",
                          [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, c, h, h])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, m, oh, oh])],
                          [numpy_helper.from_array(w, "W"), numpy_helper.from_array(b, "B")])
    model = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8  # onnxruntime reads IR <= 10
    return model, 2 * m * c * k * k * oh * oh


def child(threads: int, repeat: int, rounds: int, names: list[str]) -> None:
    import cores
    import numpy as np
    from bench_onnx import _median_pair, ort_session

    import polyc
    from polyc.frontend.onnx_import import load_graph
    from polyc.frontend.onnx_layout import CONV_NHWC, WINOGRAD_INPUT
    from polyc.frontend.onnx_passes import optimize_graph

    ratios = []
    for name in names:
        model, flops = conv_model(*LAYERS[name])
        x = np.random.default_rng(1).standard_normal(
            [d.dim_value for d in model.graph.input[0].type.tensor_type.shape.dim]
        ).astype(np.float32)
        ops = {n.op_type for n in optimize_graph(load_graph(model), winograd=True).nodes}
        layout = "Winograd" if WINOGRAD_INPUT in ops else "NHWC" if CONV_NHWC in ops \
            else "NCHW"
        compiled = polyc.compile_onnx(model, options=polyc.Options(threads=threads))
        sess = ort_session(model, threads)
        want = sess.run(None, {"x": x})[0]
        got = compiled(x)[0]
        ok = bool(np.allclose(got, want, rtol=1e-3, atol=1e-4 * max(1.0, np.abs(want).max())))
        (tp, to), near = cores.probed(threads, lambda c=compiled, s=sess, x=x: _median_pair(
            lambda: c(x), lambda: s.run(None, {"x": x}), repeat, rounds))
        ratios.append(tp / to)
        print(f"{name:20s} threads={threads} {layout}  polyc {tp * 1e3:7.3f} ms "
              f"({flops / tp / 1e9:5.1f} GFLOP/s)  onnxruntime {to * 1e3:7.3f} ms "
              f"({flops / to / 1e9:5.1f})  ratio polyc/ort {tp / to:5.2f}  correct={ok}"
              + (f"  {cores.describe(near)}" if near else ""), flush=True)
    geo = float(np.exp(np.mean(np.log(ratios))))
    print(f"threads={threads}: geometric mean of the latency ratios polyc/ort {geo:.2f} "
          f"over {len(ratios)} layers", flush=True)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--layers", default=",".join(LAYERS))
    p.add_argument("--repeat", type=int, default=15)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--threads", default="1,2")
    p.add_argument("--child", type=int, help=argparse.SUPPRESS)
    a = p.parse_args()
    names = a.layers.split(",")
    unknown = [n for n in names if n not in LAYERS]
    if unknown:
        p.error(f"unknown layers {unknown}; known: {', '.join(LAYERS)}")
    if a.child:
        child(a.child, a.repeat, a.rounds, names)
        return
    from bench_onnx import run_children
    run_children(__file__, a.threads, ["--repeat", str(a.repeat), "--rounds", str(a.rounds),
                                       "--layers", a.layers])

if __name__ == "__main__":
    main()
