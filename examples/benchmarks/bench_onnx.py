"""Benchmark: whole ONNX models compiled by polyc against onnxruntime, side by side.

    python3 examples/benchmarks/bench_onnx.py [--models mlp,small_cnn,transformer_layer,resnet50]
                                              [--repeat 15] [--threads 1,2]

For each thread count the script runs itself in a child process (OMP_NUM_THREADS,
OMP_PROC_BIND=close; onnxruntime gets intra_op_num_threads). In the child each model is
compiled by polyc (compile time reported, cold: an empty cache directory) and loaded in
onnxruntime; then the two are run alternately and the medians compared. The outputs are
checked against each other beside each figure.
"""
from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

MODELS = ("mlp", "small_cnn", "transformer_layer", "resnet50")


def _model(name: str):
    import onnx_models as M
    if name in M.LIGHT_MODELS:
        return M.randomized_light_model(name, seed=0)
    return getattr(M, name)()


def _median_pair(f, g, repeat):
    f(), g()
    tf, tg = [], []
    for _ in range(repeat):
        t = time.perf_counter(); f(); tf.append(time.perf_counter() - t)  # noqa: E702
        t = time.perf_counter(); g(); tg.append(time.perf_counter() - t)  # noqa: E702
    tf.sort(), tg.sort()
    return tf[len(tf) // 2], tg[len(tg) // 2]


def child(threads: int, repeat: int, models: list[str]) -> None:
    import numpy as np
    import onnx_models as M
    import onnxruntime as ort

    import polyc

    for name in models:
        model = _model(name)
        feeds = M.input_feeds(model, seed=1)
        t0 = time.perf_counter()
        compiled = polyc.compile_onnx(model, options=polyc.Options(threads=threads))
        compile_s = time.perf_counter() - t0
        opts = ort.SessionOptions()
        opts.intra_op_num_threads, opts.inter_op_num_threads = threads, 1
        opts.log_severity_level = 3
        sess = ort.InferenceSession(model.SerializeToString(), opts,
                                    providers=["CPUExecutionProvider"])
        want = sess.run(None, feeds)
        got = compiled.run(None, feeds)
        scale = max(float(np.abs(want[0]).max()), 1.0)
        ok = all(np.allclose(g, w, rtol=2e-3, atol=1e-4 * scale) for g, w in zip(got, want))
        tp, to = _median_pair(lambda: compiled.run(None, feeds), lambda: sess.run(None, feeds),
                              repeat)
        print(f"{name:18s} threads={threads}  polyc {tp * 1e3:8.2f} ms  onnxruntime "
              f"{to * 1e3:8.2f} ms  latency ratio polyc/ort {tp / to:5.2f}  "
              f"compile {compile_s:6.1f} s  correct={ok}", flush=True)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--models", default=",".join(MODELS))
    p.add_argument("--repeat", type=int, default=15)
    p.add_argument("--threads", default="1,2")
    p.add_argument("--child", type=int, help=argparse.SUPPRESS)
    a = p.parse_args()
    models = a.models.split(",")
    if a.child:
        child(a.child, a.repeat, models)
        return
    for t in (int(x) for x in a.threads.split(",")):
        with tempfile.TemporaryDirectory() as cache:
            env = dict(os.environ, OMP_NUM_THREADS=str(t), OMP_PROC_BIND="close",
                       POLYC_CACHE_DIR=cache)
            subprocess.run([sys.executable, __file__, "--child", str(t), "--repeat",
                            str(a.repeat), "--models", a.models], env=env, check=True)


if __name__ == "__main__":
    main()
