"""Compiler options: one frozen record for the whole compiler.

This is the only module that reads ``POLYC_*`` environment variables:

* ``POLYC_CACHE_DIR``: where compiled libraries are cached (default ``~/.cache/polyc``).
* ``POLYC_DUMP``: a directory; each pipeline stage writes ``NN-stage.txt`` there.
* ``POLYC_CC``: the C compiler (default ``gcc``).
"""
from __future__ import annotations

import dataclasses
import os
from dataclasses import dataclass

FUSION_MODES = ("min", "smart", "max")


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
    sanitize: bool = False
    #: a user schedule (isl union map or schedule tree text); checked, used as written
    schedule: str | None = None
    cache_dir: str = dataclasses.field(default_factory=lambda: os.environ.get(
        "POLYC_CACHE_DIR", os.path.join(os.path.expanduser("~"), ".cache", "polyc")))
    dump_dir: str | None = dataclasses.field(
        default_factory=lambda: os.environ.get("POLYC_DUMP") or None)
    #: auto-tuning: False, True (the default budget) or seconds per kernel
    tune: bool | float = False

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
        if self.threads is not None and self.threads < 1:
            raise CompileError(f"threads must be >= 1, got {self.threads}")
        if not isinstance(self.tune, bool) and not (
                isinstance(self.tune, (int, float)) and self.tune > 0):
            raise CompileError(f"tune must be True, False or a positive number of seconds, "
                               f"got {self.tune!r}")

    def replace(self, **changes: object) -> Options:
        return dataclasses.replace(self, **changes)  # type: ignore[arg-type]
