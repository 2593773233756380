"""Shared test set-up: a compile cache for the session, and the
differential helper ``assert_matches_numpy``."""
from __future__ import annotations

import os

import sys

import numpy as np
import pytest

# the model builders live in examples/ (the README's example and the benchmarks use them)
sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
                                "examples"))
os.environ.setdefault("POLYC_CACHE_DIR", os.path.join(os.path.dirname(os.path.dirname(
    os.path.abspath(__file__))), ".polyc_cache"))
# the code the tests compile does not hang on how this machine's prefetchers time a probe
# (polyc.schedule.machine.strided_panel_cost); the probe's own tests set it themselves
os.environ.setdefault("POLYC_STRIDED_PANEL_COST", "1")


def _on_gpu() -> None:
    """``POLYC_TEST_ON_GPU=sm_90 python3 -m pytest tests/test_cuda_*.py`` on a machine
    with a GPU: every CUDA operator the tests build for the CPU emulation is built by nvcc
    for that architecture and run on the device instead, against the same references."""
    if not ON_GPU:
        return
    import polyc
    post_init = polyc.Options.__post_init__
    default_arch = polyc.Options().gpu_arch

    def on_device(self):
        if self.target == "cuda":
            object.__setattr__(self, "emulate", False)
            if self.gpu_arch == default_arch:
                object.__setattr__(self, "gpu_arch", ON_GPU)
        post_init(self)
    polyc.Options.__post_init__ = on_device


#: the architecture the CUDA tests run on (``POLYC_TEST_ON_GPU``), or "" for the emulation
_ARCH = os.environ.get("POLYC_TEST_ON_GPU", "")
ON_GPU = "" if _ARCH in ("", "0") else _ARCH if _ARCH.startswith("sm_") else "sm_90"
_on_gpu()


def pytest_collection_modifyitems(config, items):
    """On a GPU, tests of the emulation's own checks (thread orders, its sanitizers, its
    device-pointer registry) are skipped: the device behaves as the hardware does."""
    if not ON_GPU:
        return
    skip = pytest.mark.skip(reason="a check of the CPU emulation itself (POLYC_TEST_ON_GPU)")
    for item in items:
        if item.get_closest_marker("emulation_only"):
            item.add_marker(skip)


def pytest_configure(config):
    """``POLYC_SANITIZE=1 python3 -m pytest ...`` builds every library with ASan/UBSan
    (Options reads it); such libraries load only into a process whose first library is
    the ASan runtime, so the run starts again under :func:`sanitizer_environment`."""
    if os.environ.get("POLYC_SANITIZE", "") in ("", "0") or \
            "libasan" in os.environ.get("LD_PRELOAD", ""):
        return
    from polyc.codegen.toolchain import sanitizer_environment
    env = sanitizer_environment()
    if env is None:
        raise SystemExit("POLYC_SANITIZE is set but gcc has no ASan runtime (libasan.so)")
    capture = config.pluginmanager.getplugin("capturemanager")
    if capture is not None:  # give the new run the real stdout/stderr
        capture.suspend_global_capture(in_=True)
    sys.stdout.flush()
    sys.stderr.flush()
    os.execve(sys.executable, [sys.executable, "-m", "pytest", *sys.argv[1:]], env)


def input_dtypes(op) -> list[str]:
    """The numpy dtypes of an operator's inputs, in order."""
    from polyc import dtypes as D
    return [str(D.numpy_dtype(op.kernel.array(name).dtype)) for name in op.input_names]


def random_inputs(shapes_dtypes, seed=0):
    rng = np.random.default_rng(seed)
    out = []
    for shape, dtype in shapes_dtypes:
        if np.dtype(dtype).kind == "f":
            out.append(rng.standard_normal(shape).astype(dtype))
        else:
            out.append(rng.integers(-5, 6, size=shape).astype(dtype))
    return out


def assert_matches_numpy(got, want, rtol=1e-4, atol=1e-4):
    got = got if isinstance(got, tuple) else (got,)
    want = want if isinstance(want, tuple) else (want,)
    assert len(got) == len(want)
    for g, w in zip(got, want):
        w = np.asarray(w)
        assert g.shape == w.shape, (g.shape, w.shape)
        np.testing.assert_allclose(g, w, rtol=rtol, atol=atol)


@pytest.fixture
def tmp_cache(tmp_path):
    return str(tmp_path / "cache")


@pytest.fixture
def avx512_model(monkeypatch):
    """The scheduler's machine model of an AVX-512 CPU (32 vector registers of 512 bits)
    whatever CPU runs the tests: for tests of schedule shapes that the register tile's
    width decides (a 64-column tile is one 64-channel weight block; on AVX2 a tile is 16
    columns). The C still builds for this CPU and must still be right: code written for
    512-bit vectors keeps its portable form where the CPU has no AVX-512."""
    from polyc.schedule import register_tile
    monkeypatch.setattr(register_tile, "vector_bits", lambda: 512)
    monkeypatch.setattr(register_tile, "vector_registers", lambda: 32)


@pytest.fixture
def avx2_model(monkeypatch):
    """The scheduler's machine model of an AVX2 CPU (16 vector registers of 256 bits),
    whatever CPU runs the tests (:func:`avx512_model`'s counterpart)."""
    from polyc.schedule import register_tile
    monkeypatch.setattr(register_tile, "vector_bits", lambda: 256)
    monkeypatch.setattr(register_tile, "vector_registers", lambda: 16)


@pytest.fixture
def tiny_l2(monkeypatch):
    """An L2 of 256 bytes (``POLYC_L2_BYTES``): small kernels take the fused path
    (:mod:`polyc.schedule.fuse`)."""
    from polyc.schedule import machine
    monkeypatch.setenv("POLYC_L2_BYTES", "256")
    machine.l2_bytes.cache_clear()
    yield
    monkeypatch.delenv("POLYC_L2_BYTES")
    machine.l2_bytes.cache_clear()
