"""Benchmark: polyc's CUDA target on a GPU; or, with ``--report``, its static GPU report.

    python3 examples/benchmarks/bench_gpu.py [--sizes 1024,2048,4096,8192] [--repeat 10]
    python3 examples/benchmarks/bench_gpu.py --report     # no GPU needed (nvcc for ptxas)

On a machine with a usable GPU (the first CUDA runtime call succeeds):

* GEMM, float32, square sizes 1024 to 8192, against cuBLAS through cupy or torch (the
  first importable);
* ResNet-50's 3x3 convolutions (stride 1, the input pre-padded), against cuDNN through
  torch when it is importable (polyc alone otherwise);
* a model (examples/small_cnn.onnx, or ``--model``) through
  ``polyc.compile_onnx(target="cuda")`` against onnxruntime's CUDA provider when
  onnxruntime has it.

Both sides are timed the same way: host (numpy) arrays in, host arrays out, so copies
to and from the device are counted on both sides (polyc's operators take host
pointers); medians of ``--repeat`` calls after a warm-up, results checked beside each
figure. Without a usable GPU the script says why (the CUDA runtime's error) and exits 0.

``--report`` prints the static report (:mod:`polyc.codegen.gpu_report`) of a 1024x1024
float32 matmul and of ResNet-50's 3x3 64->64 56x56 convolution: grid and block, the
coalescing of every global access, bank conflicts of shared accesses, registers and
shared memory from ptxas, theoretical occupancy. It needs nvcc but no GPU.
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, ROOT)

import polyc  # noqa: E402
from polyc import pipeline  # noqa: E402
from polyc.frontend import from_tc  # noqa: E402
from polyc.errors import CallError, ToolchainError  # noqa: E402

MATMUL = """
def matmul(float(M,K) A, float(K,N) B) -> (C) {
    C(m,n) +=! A(m,k) * B(k,n)
}"""
#: stride 1, the input already padded (H + 2 by W + 2 for a 3x3 "same" convolution)
CONV = """
def conv(float(N,C,H,W) I, float(F,C,KH,KW) Wt) -> (O) {
    O(n,f,h,w) +=! I(n,c,h+kh,w+kw) * Wt(f,c,kh,kw)
}"""
#: ResNet-50 v1's 3x3 stride-1 layers: (channels, height = width)
CONV_LAYERS = [(64, 56), (128, 28), (256, 14), (512, 7)]


def probe(arch: str) -> str | None:
    """None when a GPU is usable; else why not (the wrapper's message)."""
    try:
        op = polyc.define(MATMUL, target="cuda", gpu_arch=arch)
        a = np.ones((2, 2), np.float32)
        op(a, a)
    except CallError as err:
        return str(err)
    except ToolchainError as err:
        return f"the CUDA toolchain failed: {str(err).splitlines()[0]}"
    return None


def report_of(source: str, sizes: dict[str, int], arch: str) -> str:
    """The static report of ``source`` specialised to ``sizes`` (the emulation's text is
    the GPU's; ptxas runs on an nvcc build of it, no device needed)."""
    options = polyc.Options(target="cuda", emulate=True, specialize=True, gpu_arch=arch)
    kernel = from_tc(source).specialize(sizes)
    return str(pipeline.compile_kernel(kernel, options, build=False).gpu_report)


def print_reports(arch: str) -> None:
    print(report_of(MATMUL, dict(M=1024, N=1024, K=1024), arch))
    print()
    print("ResNet-50 conv 3x3, 64 -> 64 channels, 56x56 (stride 1, input padded to 58x58):")
    print(report_of(CONV, dict(N=1, C=64, H=58, W=58, F=64, KH=3, KW=3), arch))


def median_time(fn, repeat: int) -> float:
    fn()
    times = []
    for _ in range(repeat):
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return statistics.median(times)


def gpu_library():
    """(name, matmul(a, b) -> numpy, conv(x, w) -> numpy or None) of the installed GPU
    library, host arrays in and out; None when neither cupy nor torch is importable."""
    try:
        import cupy as cp

        def mm(a, b):
            out = cp.asnumpy(cp.asarray(a) @ cp.asarray(b))
            cp.cuda.Device().synchronize()
            return out
        return "cupy (cuBLAS)", mm, _torch_conv()
    except ImportError:
        pass
    try:
        import torch
        if not torch.cuda.is_available():
            return None

        def mm(a, b):
            return (torch.from_numpy(a).cuda() @ torch.from_numpy(b).cuda()).cpu().numpy()
        return "torch (cuBLAS, cuDNN)", mm, _torch_conv()
    except ImportError:
        return None


def device_time(fn, repeat: int) -> float:
    """Median seconds of ``fn()`` on device-resident arrays (cupy: synchronised)."""
    import cupy as cp

    def synced():
        fn()
        cp.cuda.Device().synchronize()
    return median_time(synced, repeat)


def _torch_conv():
    """torch's (cuDNN) convolution, host arrays in and out; None without torch+CUDA."""
    try:
        import torch
    except ImportError:
        return None
    if not torch.cuda.is_available():
        return None
    torch.backends.cudnn.allow_tf32 = False  # float32 on both sides (TF32 is torch's default)

    def conv(x, w):
        return torch.nn.functional.conv2d(torch.from_numpy(x).cuda(),
                                          torch.from_numpy(w).cuda()).cpu().numpy()
    return conv


def bench_gemm_on_device(sizes: list[int], repeat: int, arch: str) -> None:
    """Both sides on device-resident arrays: polyc's ``<op>_device`` entry reads cupy's
    arrays through ``__cuda_array_interface__``, no copies are timed."""
    try:
        import cupy as cp
    except ImportError:
        print("GEMM on device arrays: cupy is not importable: skipped")
        return
    op = polyc.define(MATMUL, target="cuda", specialize=True, gpu_arch=arch)
    rng = np.random.default_rng(1)
    print("GEMM float32, device-resident arrays (no copies on either side)")
    for n in sizes:
        a = cp.asarray(rng.standard_normal((n, n), dtype=np.float32))
        b = cp.asarray(rng.standard_normal((n, n), dtype=np.float32))
        ours = device_time(lambda a=a, b=b: op(a, b), repeat)
        theirs = device_time(lambda a=a, b=b: a @ b, repeat)
        c = op(a, b).numpy()
        ref = np.asarray(cp.asnumpy(a), np.float64) @ np.asarray(cp.asnumpy(b), np.float64)
        err = float(np.linalg.norm(c - ref) / np.linalg.norm(ref))
        print(f"  {n:5d}: polyc {ours * 1e3:9.3f} ms ({2 * n**3 / ours / 1e9:8.1f} GFLOP/s) | "
              f"cuBLAS {theirs * 1e3:9.3f} ms ({2 * n**3 / theirs / 1e9:8.1f} GFLOP/s); "
              f"polyc speed / cuBLAS speed {theirs / ours:5.2f}; rel. error vs float64 "
              f"{err:.1e}", flush=True)


#: (gpu_block, gpu_register_tile) points of ``--sweep``: the default first
SWEEP = [(None, True), ((32, 8), (2, 4)), ((32, 8), (4, 4)), ((32, 8), (4, 8)),
         ((16, 16), (4, 4)), ((16, 16), (8, 8)), ((32, 4), (4, 8)), ((16, 8), (8, 8)),
         ((32, 8), (4, 16)), ((64, 4), (2, 8))]


def sweep_gemm(n: int, repeat: int, arch: str) -> None:
    """GEMM at one size over block shapes and register tiles, device-resident arrays."""
    import cupy as cp
    rng = np.random.default_rng(2)
    a = cp.asarray(rng.standard_normal((n, n), dtype=np.float32))
    b = cp.asarray(rng.standard_normal((n, n), dtype=np.float32))
    ref = cp.asnumpy(a).astype(np.float64) @ cp.asnumpy(b).astype(np.float64)
    theirs = device_time(lambda: a @ b, repeat)
    print(f"GEMM {n} sweep, device arrays; cuBLAS {2 * n**3 / theirs / 1e9:.0f} GFLOP/s")
    for block, points in SWEEP:
        try:
            op = polyc.define(MATMUL, target="cuda", specialize=True, gpu_arch=arch,
                              gpu_block=block, gpu_register_tile=points)
            ours = device_time(lambda op=op: op(a, b), repeat)
            err = float(np.linalg.norm(op(a, b).numpy() - ref) / np.linalg.norm(ref))
            print(f"  block {block!s:9} points {points!s:8}: {2 * n**3 / ours / 1e9:8.0f} "
                  f"GFLOP/s, {theirs / ours:5.2f} of cuBLAS; rel. error {err:.1e}", flush=True)
        except (polyc.CompileError, CallError, ToolchainError) as err:
            print(f"  block {block!s:9} points {points!s:8}: {str(err).splitlines()[0]}")


def bench_gemm(sizes: list[int], repeat: int, lib, arch: str) -> None:
    op = polyc.define(MATMUL, target="cuda", specialize=True, gpu_arch=arch)
    rng = np.random.default_rng(0)
    print("GEMM float32 (host arrays in and out on both sides)")
    for n in sizes:
        a = rng.standard_normal((n, n), dtype=np.float32)
        b = rng.standard_normal((n, n), dtype=np.float32)
        ours = median_time(lambda a=a, b=b: op(a, b), repeat)
        c = op(a, b)
        line = f"  {n:5d}: polyc {ours * 1e3:9.2f} ms ({2 * n**3 / ours / 1e9:8.1f} GFLOP/s)"
        if lib is not None:
            theirs = median_time(lambda a=a, b=b: lib[1](a, b), repeat)
            err = float(np.abs(c - lib[1](a, b)).max() / (np.abs(c).max() or 1))
            line += (f" | {lib[0]} {theirs * 1e3:9.2f} ms; polyc/them {ours / theirs:5.2f}x; "
                     f"max rel diff {err:.1e}")
        print(line, flush=True)


def bench_conv(repeat: int, lib, arch: str) -> None:
    op = polyc.define(CONV, target="cuda", specialize=True, gpu_arch=arch)
    rng = np.random.default_rng(0)
    print("ResNet-50 3x3 convolutions, stride 1, batch 1 (host arrays in and out)")
    for c, h in CONV_LAYERS:
        x = rng.standard_normal((1, c, h + 2, h + 2), dtype=np.float32)
        w = rng.standard_normal((c, c, 3, 3), dtype=np.float32) * 0.05
        ours = median_time(lambda x=x, w=w: op(x, w), repeat)
        line = f"  3x3 {c:3d}->{c:3d} {h:2d}x{h:<2d}: polyc {ours * 1e3:8.3f} ms"
        if lib is not None and lib[2] is not None:
            theirs = median_time(lambda x=x, w=w: lib[2](x, w), repeat)
            err = float(np.abs(op(x, w) - lib[2](x, w)).max())
            line += f" | cuDNN (torch) {theirs * 1e3:8.3f} ms; polyc/them {ours / theirs:5.2f}x; " \
                    f"max diff {err:.1e}"
        print(line, flush=True)


def bench_model(path: str, repeat: int, arch: str) -> None:
    try:
        import onnxruntime as ort
    except ImportError:
        print("model: onnxruntime is not installed: skipped")
        return
    if "CUDAExecutionProvider" not in ort.get_available_providers():
        print(f"model: onnxruntime has no CUDA provider ({ort.get_available_providers()}): "
              "skipped")
        return
    model = polyc.compile_onnx(path, options=polyc.Options(target="cuda", gpu_arch=arch))
    sess = ort.InferenceSession(path, providers=["CUDAExecutionProvider"])
    feeds = {i.name: np.random.default_rng(0).standard_normal(
        [d if isinstance(d, int) else 1 for d in i.shape]).astype(np.float32)
        for i in sess.get_inputs()}
    ours = median_time(lambda: model.run(feeds), repeat)
    theirs = median_time(lambda: sess.run(None, feeds), repeat)
    print(f"model {os.path.basename(path)}: polyc {ours * 1e3:.3f} ms | onnxruntime CUDA "
          f"{theirs * 1e3:.3f} ms; polyc/them {ours / theirs:.2f}x")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--report", action="store_true",
                   help="print the static GPU report of a 1024 matmul and a ResNet-50 conv "
                   "(no GPU needed)")
    p.add_argument("--arch", default="sm_80", help="the SM architecture (default sm_80)")
    p.add_argument("--sizes", default="1024,2048,4096,8192", help="GEMM sizes")
    p.add_argument("--repeat", type=int, default=10)
    p.add_argument("--sweep", type=int, metavar="N",
                   help="only: GEMM at N over block shapes and register tiles (cupy)")
    p.add_argument("--model", default=os.path.join(ROOT, "examples", "small_cnn.onnx"))
    args = p.parse_args(argv)
    if args.report:
        try:
            print_reports(args.arch)
        except ToolchainError as err:
            print(f"bench_gpu: the report needs nvcc for ptxas's figures: "
                  f"{str(err).splitlines()[0]}")
        return 0
    why = probe(args.arch)
    if why is not None:
        print(f"bench_gpu: no GPU benchmark on this machine: {why}")
        print("bench_gpu: nothing was timed; `--report` prints the static GPU report, "
              "which needs no GPU")
        return 0
    if args.sweep:
        sweep_gemm(args.sweep, args.repeat, args.arch)
        return 0
    lib = gpu_library()
    if lib is None:
        print("bench_gpu: neither cupy nor torch (with CUDA) is importable: polyc's "
              "figures only, no cuBLAS/cuDNN comparison")
    sizes = [int(s) for s in args.sizes.split(",")]
    bench_gemm_on_device(sizes, args.repeat, args.arch)
    bench_gemm(sizes, args.repeat, lib, args.arch)
    bench_conv(args.repeat, lib, args.arch)
    bench_model(args.model, args.repeat, args.arch)
    return 0


if __name__ == "__main__":
    sys.exit(main())
