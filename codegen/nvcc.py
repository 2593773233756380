"""Build generated CUDA: nvcc for the GPU, g++ with ``cuda_emu.h`` for the CPU emulation.

Both are cached like the C target's gcc builds (:mod:`.toolchain`): ``<cache>/<function>-
<hash>.so`` with the ``.cu`` kept beside it, the key hashing the text, the flags and the
compiler's version. An nvcc build also keeps ptxas's resource report beside the library
(``.ptxas.txt``), so that a cached library still has its figures (:func:`ptxas_report`).

nvcc builds SASS for ``Options.gpu_arch`` plus its PTX (newer GPUs JIT the PTX), links
cudart statically (the library needs only libc/libstdc++), and asks ptxas for
``-v,-warn-spills``. The emulation build is ``g++ -std=c++17 -x c++ -include
cuda_emu.h`` on the same text (with ``Options.sanitize``: ASan/UBSan and ucontext fibers).
"""
from __future__ import annotations

import ctypes
import functools
import hashlib
import json
import os
import re
import subprocess
import tempfile
import threading
from dataclasses import dataclass

from polyc.errors import ToolchainError
from polyc.host import write_atomically
from polyc.options import Options

from .toolchain import SANITIZE_FLAGS, _run_compiler, file_stem

#: the emulation header, shipped as package data next to this module
EMU_HEADER = os.path.join(os.path.dirname(os.path.abspath(__file__)), "cuda_emu.h")


class CudaToolchainError(ToolchainError):
    """nvcc (or the emulation's C++ compiler) failed or is missing: the command, its
    stderr and where the ``.cu`` was kept."""

    def __init__(self, command: list[str], returncode: int, stderr: str, source_path: str):
        super().__init__(command, returncode, stderr, source_path)
        kept = f"; source kept at {source_path}" if source_path else ""
        self.args = (f"{os.path.basename(command[0])} failed (exit {returncode}){kept}\n"
                     f"command: {' '.join(command)}\n{stderr}",)


def nvcc_flags(options: Options) -> list[str]:
    cc = options.gpu_arch[3:]
    return ["-O3", "-std=c++17", "-shared", "-Xcompiler", "-fPIC,-fvisibility=hidden",
            "-gencode", f"arch=compute_{cc},code=sm_{cc}",
            "-gencode", f"arch=compute_{cc},code=compute_{cc}",
            "-cudart", "static", "-Xptxas", "-v,-warn-spills", *options.nvcc_flags]


def cxx_for(cc: str) -> str:
    """The C++ driver beside the C compiler ``cc`` (gcc -> g++, clang -> clang++)."""
    base = os.path.basename(cc)
    if "clang" in base:
        return cc.replace("clang", "clang++", 1) if "clang++" not in base else cc
    if "gcc" in base:
        return cc[: len(cc) - len(base)] + base.replace("gcc", "g++", 1)
    return "g++"


def emulation_flags(options: Options) -> list[str]:
    flags = ["-std=c++17", "-O2", "-shared", "-fPIC", "-fvisibility=hidden", "-Wall",
             "-Wextra", "-x", "c++", "-include", EMU_HEADER]
    if options.sanitize:
        flags += [*SANITIZE_FLAGS, "-DPOLYC_EMU_UCONTEXT"]
    return flags


@functools.cache
def _version(tool: str) -> str:
    command = [tool, "--version"]
    try:
        done = subprocess.run(command, capture_output=True, text=True, check=False)
    except OSError as err:
        raise CudaToolchainError(command, 127, f"cannot run {tool}: {err} (set POLYC_NVCC to the "
                             "CUDA compiler, or use emulate=True)", "") from err
    if done.returncode != 0:
        raise CudaToolchainError(command, done.returncode, done.stderr, "")
    return done.stdout.strip()


def build_cuda(text: str, stem: str, options: Options) -> str:
    """The shared library of ``text`` built by nvcc, or by g++ with the emulation header
    when ``options.emulate``; cached. Raises :class:`ToolchainError` on failure."""
    if options.emulate:
        emulated_device(options)  # before the library can be loaded
        return _build(cxx_for(options.cc), emulation_flags(options), text, stem, "emu",
                      options.cache_dir)
    return _build(options.nvcc, nvcc_flags(options), text, stem, "cuda", options.cache_dir,
                  keep_stderr=True)


def emulated_device(options: Options) -> None:
    """Load the emulated device's memory (one registry of device blocks per process, see
    ``cuda_emu.h``) before any emulated library: built once, loaded with RTLD_GLOBAL so
    that a block one library's ``cudaMalloc`` returns is a device pointer for all."""
    if _DEVICE:
        return
    flags = ["-std=c++17", "-O2", "-shared", "-fPIC", "-fvisibility=hidden", "-x", "c++",
             "-DPOLYC_EMU_DEVICE_LIBRARY", "-include", EMU_HEADER]
    path = _build(cxx_for(options.cc), flags, "/* the emulated device's memory */\n",
                  "polyc_emu_device", "emu", options.cache_dir)
    with _DEVICE_LOCK:
        if not _DEVICE:
            _DEVICE.append(ctypes.CDLL(path, mode=ctypes.RTLD_GLOBAL))


_DEVICE: list[ctypes.CDLL] = []
_DEVICE_LOCK = threading.Lock()


def _build(tool: str, flags: list[str], text: str, stem: str, tag: str, cache: str,
           keep_stderr: bool = False) -> str:
    with open(EMU_HEADER) as f:  # part of every key: the emulation includes it
        header = f.read() if tag != "cuda" else ""
    key = hashlib.sha256(json.dumps([text, flags, _version(tool), header]).encode()).hexdigest()
    os.makedirs(cache, exist_ok=True)
    base = os.path.join(cache, f"{file_stem(stem)}-{tag}-{key[:32]}")
    library, source = base + ".so", base + ".cu"
    if os.path.exists(library):
        return library
    write_atomically(source, text)
    fd, tmp = tempfile.mkstemp(prefix=os.path.basename(base) + ".", suffix=".so.tmp",
                               dir=cache)
    os.close(fd)
    command = [tool, *flags, "-o", tmp, source]
    try:
        done = _run_compiler(command)
        if isinstance(done, OSError):
            raise CudaToolchainError(command, 127, f"cannot run {tool}: {done} (set POLYC_NVCC, "
                                     "or use emulate=True)", source) from done
        if done.returncode != 0:
            raise CudaToolchainError(command, done.returncode, done.stderr, source)
        if keep_stderr:
            write_atomically(base + ".ptxas.txt", done.stderr)
        os.replace(tmp, library)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)
    return library


@dataclass(frozen=True)
class PtxasInfo:
    """ptxas's resource figures of one kernel."""
    kernel: str
    registers: int = 0
    shared_bytes: int = 0
    stack_bytes: int = 0
    spill_stores: int = 0
    spill_loads: int = 0
    barriers: int = 0

    @property
    def spills(self) -> bool:
        return self.spill_stores > 0 or self.spill_loads > 0


_ENTRY = re.compile(r"Compiling entry function '([^']+)'")
_PROPS = re.compile(r"(\d+) bytes stack frame, (\d+) bytes spill stores, (\d+) bytes spill loads")
_USED = re.compile(r"Used (\d+) registers")
_SMEM = re.compile(r"(\d+) bytes smem")
_BARRIERS = re.compile(r"used (\d+) barriers")


def _demangle(symbol: str) -> str:
    """``polyc_kernel1`` for ``_Z13polyc_kernel1llPKfS0_Pf`` (plain names pass)."""
    m = re.match(r"_Z(\d+)", symbol)
    return symbol[m.end(): m.end() + int(m.group(1))] if m else symbol


def parse_ptxas(text: str) -> dict[str, PtxasInfo]:
    """Per kernel (by its unmangled name): registers, shared memory, stack and spills,
    from the ``ptxas info`` lines of ``-Xptxas -v``."""
    out: dict[str, dict[str, int]] = {}
    name = None
    for line in text.splitlines():
        m = _ENTRY.search(line)
        if m:
            name = _demangle(m.group(1))
            out[name] = {}
            continue
        if name is None:
            continue
        p = _PROPS.search(line)
        if p:
            out[name].update(stack_bytes=int(p.group(1)), spill_stores=int(p.group(2)),
                             spill_loads=int(p.group(3)))
        u = _USED.search(line)
        if u:
            out[name]["registers"] = int(u.group(1))
            s = _SMEM.search(line)
            out[name]["shared_bytes"] = int(s.group(1)) if s else 0
            b = _BARRIERS.search(line)
            out[name]["barriers"] = int(b.group(1)) if b else 0
    return {k: PtxasInfo(k, **v) for k, v in out.items()}


def ptxas_report(text: str, stem: str, options: Options) -> dict[str, PtxasInfo]:
    """ptxas's figures for ``text`` (builds it with nvcc if that was not done yet)."""
    library = build_cuda(text, stem, options.replace(emulate=False))
    with open(library[: -len(".so")] + ".ptxas.txt") as f:
        return parse_ptxas(f.read())
