"""Compiler options: one frozen record for the whole compiler.

This is the only module that reads ``POLYC_*`` environment variables:

* ``POLYC_CACHE_DIR``: where compiled libraries are cached (default ``~/.cache/polyc``).
* ``POLYC_DUMP``: a directory; each pipeline stage writes ``NN-stage.txt`` there.
* ``POLYC_CC``: the C compiler (default ``gcc``).
* ``POLYC_SANITIZE``: ``1`` makes ``sanitize`` default to True: every library is built
  with ASan/UBSan (the process must have the ASan runtime loaded first, see
  :func:`polyc.codegen.toolchain.sanitizer_environment`).
* ``POLYC_NVCC``: the CUDA compiler (default ``nvcc``).
"""
from __future__ import annotations

import dataclasses
import os
from dataclasses import dataclass

FUSION_MODES = ("min", "smart", "max")
TARGETS = ("c", "cuda")
SCHEDULERS = ("isl", "pluto")


@dataclass(frozen=True)
class Options:
    """How to compile (never what to compute).

    :fusion: ``"min"`` (one loop nest per strongly connected component),
        ``"smart"`` (isl's default clustering) or ``"max"`` (fuse whole components).
    :tile: ``True`` for the default tile-size rule, ``False`` for no tiling, or a
        tuple of sizes applied to the members of each permutable band (the last
        size repeats when a band is deeper).
    :parallel: mark the outermost coincident loop ``omp parallel for``.
    :vectorize: mark a stride-1 coincident innermost loop ``omp simd``.
    :register_tile: register tiling of contractions (see
        :mod:`polyc.schedule.register_tile`): ``True`` for the machine's default
        ``(MR, NR)`` accumulator block, a tuple ``(MR, NR)``, or ``False`` for none.
    :threads: OpenMP thread count for the compiled code (None: the OpenMP default).
    :specialize: compile code for the concrete sizes of each call (cached per
        size signature) instead of code that takes sizes as parameters.
    :cflags: extra flags for the C compiler. The default, ``-ffp-contract=fast``, lets
        gcc fuse ``a * b + c`` into one FMA instruction (``-std=c11`` turns that off;
        the result is at least as accurate); flags given here replace it.
    :sanitize: compile with ``-fsanitize=address,undefined`` (for tests).
    :schedule: a schedule written by the user (isl union map text such as
        ``{ S0[m,n] -> [0,m,n,0]; S1[m,n,k] -> [1,m,k,n] }``); it is checked against
        the dependences and refused with an explanation when illegal.
    :tune: auto-tune each kernel with fixed sizes (:mod:`polyc.tune`): ``True`` for the
        default search budget per kernel, a number for that many seconds per kernel,
        ``False`` for none. Only ``fusion``, ``tile`` and ``register_tile`` change.
    :target: ``"c"`` (C with OpenMP, built by ``cc``) or ``"cuda"`` (CUDA C, built by
        ``nvcc``; see :mod:`polyc.codegen.cuda`).
    :emulate: CUDA only: build the same ``.cu`` with g++ and the CPU emulation of
        ``codegen/cuda_emu.h`` instead of nvcc (runs without a GPU).
    :gpu_block: CUDA threads per block along x, y, z (a whole number of warps, at most
        1024); None: the rule of :func:`polyc.schedule.gpu_map.block_sizes`.
    :gpu_tile: CUDA tile sizes along x, y, z (multiples of the block); None: the block.
    :gpu_arch: the SM architecture nvcc builds SASS for (its PTX is embedded too).
    :gpu_shared: promote tiles of arrays reused within a block to ``__shared__`` memory.
    :gpu_register_tile: keep a reduction's accumulators in registers, each thread
        computing several points strided by the block (PPCG's private memory): ``True``
        for the default points per thread (x, y), a tuple for others, ``False`` for none.
        With ``gpu_tile`` given, the tile decides the points per thread.
    :nvcc_flags: extra flags for nvcc (``("-Werror", "all-warnings")`` in the tests).
    :scheduler: ``"isl"`` (isl's scheduler) or ``"pluto"`` (polyc's Pluto-style one,
        :mod:`polyc.schedule.pluto`: bounded dependence distances, permutable bands,
        its own fusion heuristics); the band optimisations after it are the same.
    :diamond: with ``scheduler="pluto"``, diamond tiles for time-iterated stencils
        (concurrent start of the tiles of a wavefront instead of a pipeline).
    :pack: copy the large operand of a big contraction into column blocks before it
        runs (:mod:`polyc.pack`; C target, fixed sizes, register tiles on).
    :winograd: ONNX models, C target: run each dense 3x3 unit-stride float32 Conv by
        Winograd's minimal filtering (:mod:`polyc.frontend.winograd`): ``True`` picks
        ``F(4x4, 3x3)`` (4x fewer multiplications) for outputs from 14x14 on and
        ``F(2x2, 3x3)`` (2.25x) below, ``2`` or ``4`` forces that output tile, ``False``
        runs the direct convolution. The results differ from the direct convolution's
        by rounding (about 1e-5 of the output's range with 4x4 tiles, 1e-6 with 2x2).
    """

    fusion: str = "smart"
    tile: bool | tuple[int, ...] = True
    parallel: bool = True
    vectorize: bool = True
    register_tile: bool | tuple[int, int] = True
    threads: int | None = None
    specialize: bool = True
    cc: str = dataclasses.field(default_factory=lambda: os.environ.get("POLYC_CC", "gcc"))
    cflags: tuple[str, ...] = ("-ffp-contract=fast",)
    sanitize: bool = dataclasses.field(
        default_factory=lambda: os.environ.get("POLYC_SANITIZE", "") not in ("", "0"))
    #: a user schedule (isl union map or schedule tree text); checked, used as written
    schedule: str | None = None
    cache_dir: str = dataclasses.field(default_factory=lambda: os.environ.get(
        "POLYC_CACHE_DIR", os.path.join(os.path.expanduser("~"), ".cache", "polyc")))
    dump_dir: str | None = dataclasses.field(
        default_factory=lambda: os.environ.get("POLYC_DUMP") or None)
    #: auto-tuning: False, True (the default budget) or seconds per kernel
    tune: bool | float = False
    target: str = "c"
    emulate: bool = False
    gpu_block: tuple[int, ...] | None = None
    gpu_tile: tuple[int, ...] | None = None
    gpu_arch: str = "sm_80"
    nvcc: str = dataclasses.field(default_factory=lambda: os.environ.get("POLYC_NVCC", "nvcc"))
    nvcc_flags: tuple[str, ...] = ()
    gpu_shared: bool = True
    gpu_register_tile: bool | tuple[int, ...] = True
    scheduler: str = "isl"
    diamond: bool = True
    pack: bool = True
    winograd: bool | int = True

    def __post_init__(self) -> None:
        from .errors import CompileError
        if self.fusion not in FUSION_MODES:
            raise CompileError(f"unknown fusion mode {self.fusion!r}; expected one of {FUSION_MODES}")
        if isinstance(self.tile, tuple) and any(int(t) < 1 for t in self.tile):
            raise CompileError(f"tile sizes must be positive, got {self.tile}")
        if isinstance(self.tile, list):
            object.__setattr__(self, "tile", tuple(self.tile))
        if isinstance(self.register_tile, list):
            object.__setattr__(self, "register_tile", tuple(self.register_tile))
        if isinstance(self.register_tile, tuple) and (
                len(self.register_tile) != 2 or any(int(t) < 1 for t in self.register_tile)):
            raise CompileError(f"register_tile must be (rows, columns) of positive sizes, "
                               f"got {self.register_tile}")
        if self.scheduler not in SCHEDULERS:
            raise CompileError(f"unknown scheduler {self.scheduler!r}; expected one of "
                               f"{SCHEDULERS}")
        if not (isinstance(self.winograd, bool) or (type(self.winograd) is int
                                                     and self.winograd in (2, 4))):
            raise CompileError(f"winograd must be True, False, 2 or 4 (the output tile), "
                               f"got {self.winograd!r}")
        if self.target not in TARGETS:
            raise CompileError(f"unknown target {self.target!r}; expected one of {TARGETS}")
        if self.emulate and self.target != "cuda":
            raise CompileError("emulate=True runs CUDA on the CPU: it needs target='cuda'")
        if isinstance(self.gpu_register_tile, list):
            object.__setattr__(self, "gpu_register_tile", tuple(self.gpu_register_tile))
        if isinstance(self.gpu_register_tile, tuple) and (
                not 1 <= len(self.gpu_register_tile) <= 3
                or any(int(t) < 1 or int(t) > 16 for t in self.gpu_register_tile)):
            raise CompileError("gpu_register_tile must be up to three points per thread "
                               f"(x, y, z) between 1 and 16, got {self.gpu_register_tile}")
        for name in ("gpu_block", "gpu_tile", "nvcc_flags"):
            if isinstance(getattr(self, name), list):
                object.__setattr__(self, name, tuple(getattr(self, name)))
        for name in ("gpu_block", "gpu_tile"):
            sizes = getattr(self, name)
            if sizes is not None and not (1 <= len(sizes) <= 3 and all(
                    isinstance(t, int) and t >= 1 for t in sizes)):
                raise CompileError(f"{name} must be 1 to 3 positive sizes (x, y, z), got {sizes}")
        if self.gpu_block is not None:
            total = 1
            for t in self.gpu_block:
                total *= t
            if total % 32 or total > 1024:
                raise CompileError(f"gpu_block {self.gpu_block} has {total} threads; a block "
                                   "must be a whole number of warps (32) and at most 1024")
        if not (self.gpu_arch.startswith("sm_") and self.gpu_arch[3:].isdigit()):
            raise CompileError(f"gpu_arch must look like 'sm_80', got {self.gpu_arch!r}")
        if self.threads is not None and self.threads < 1:
            raise CompileError(f"threads must be >= 1, got {self.threads}")
        if not isinstance(self.tune, bool) and not (
                isinstance(self.tune, (int, float)) and self.tune > 0):
            raise CompileError(f"tune must be True, False or a positive number of seconds, "
                               f"got {self.tune!r}")

    def replace(self, **changes: object) -> Options:
        return dataclasses.replace(self, **changes)  # type: ignore[arg-type]
