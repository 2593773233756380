"""The main job: compile a small ONNX model into a C library and run it from Python and C.

    python3 examples/onnx_model.py [MODEL.onnx]      (default: examples/small_cnn.onnx)

1. ``polyc.compile_onnx`` writes build/small_cnn/{small_cnn.so, .h, .c, .weights};
2. the model runs from Python (``CompiledModel.run``, the call onnxruntime users know);
3. examples/run_small_cnn.c is compiled against the header and run: no Python inside;
4. both outputs are compared with onnx's reference implementation (ReferenceEvaluator).
"""
from __future__ import annotations

import os
import subprocess
import sys

import numpy as np
import onnx
from onnx.reference import ReferenceEvaluator

import polyc

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)


def main() -> None:
    path = sys.argv[1] if len(sys.argv) > 1 else os.path.join(HERE, "small_cnn.onnx")
    out_dir = os.path.join(ROOT, "build", "small_cnn")
    model = polyc.compile_onnx(path, output_dir=out_dir, name="small_cnn", progress=True)
    print(f"library: {model.library_path}\nheader:  {model.header_path}\n"
          f"weights: {model.weights_path}\narena:   {model.arena_bytes} bytes")

    x = np.random.default_rng(0).standard_normal((1, 3, 32, 32)).astype(np.float32)
    (y_python,) = model.run(None, {"x": x})
    (y_ref,) = ReferenceEvaluator(onnx.load(path)).run(None, {"x": x})

    # the same library from a C program
    exe = os.path.join(out_dir, "run_small_cnn")
    subprocess.run(["gcc", os.path.join(HERE, "run_small_cnn.c"), f"-I{out_dir}",
                    model.library_path, f"-Wl,-rpath,{out_dir}", "-o", exe], check=True)
    x.tofile(os.path.join(out_dir, "input.bin"))
    subprocess.run([exe, model.weights_path, os.path.join(out_dir, "input.bin"),
                    os.path.join(out_dir, "output.bin")], check=True)
    y_c = np.fromfile(os.path.join(out_dir, "output.bin"), dtype=np.float32).reshape(y_ref.shape)

    for label, y in (("Python", y_python), ("C", y_c)):
        err = np.abs(y - y_ref).max() / max(np.abs(y_ref).max(), 1e-30)
        print(f"{label:6s} vs onnx.reference: max relative difference {err:.2e}")
        assert err < 1e-4, f"{label} output disagrees with the reference"
    print("top class:", int(y_python.argmax()), "(reference:", int(y_ref.argmax()), ")")


if __name__ == "__main__":
    main()
