"""Facts about the CPU that tile-size rules use, read once from the system."""
from __future__ import annotations

import functools
import json
import os
import subprocess
import tempfile

from ..host import cpu_flags, cpu_key, write_atomically

#: assumed when /sys does not say (common L2 and L1 data sizes per core)
DEFAULT_L2_BYTES = 1 << 20
DEFAULT_L1D_BYTES = 32 << 10


def _parse_size(text: str) -> int | None:
    text = text.strip().upper()
    scale = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}.get(text[-1:], 1)
    digits = text.rstrip("KMG")
    return int(digits) * scale if digits.isdigit() else None


@functools.lru_cache(maxsize=1)
def l2_bytes() -> int:
    """The per-core L2 (unified, level 2) cache size of CPU 0 (``POLYC_L2_BYTES``
    overrides it: to plan for another CPU, or to make small test kernels take the
    paths of large ones)."""
    return _cache_bytes("POLYC_L2_BYTES", "2", ("Unified",), DEFAULT_L2_BYTES)


def panel_bytes() -> int:
    """The bytes a register tile's operand panel may take: half the L2 (the rows that
    reuse it and their other operand take the rest). :func:`polyc.schedule.optimize`
    sizes cache tiles by it, and :func:`strided_panel_cost` its probe's."""
    return l2_bytes() // 2


@functools.lru_cache(maxsize=1)
def l1d_bytes() -> int:
    """The per-core L1 data cache size of CPU 0 (``POLYC_L1D_BYTES`` overrides it)."""
    return _cache_bytes("POLYC_L1D_BYTES", "1", ("Data",), DEFAULT_L1D_BYTES)


def _cache_bytes(variable: str, level: str, types: tuple[str, ...], default: int) -> int:
    env = os.environ.get(variable, "").strip()
    if env.isdigit() and int(env) > 0:
        return int(env)
    base = "/sys/devices/system/cpu/cpu0/cache"
    for i in range(8):
        try:
            with open(f"{base}/index{i}/level") as f:
                found = f.read().strip()
            with open(f"{base}/index{i}/size") as f:
                size = _parse_size(f.read())
            with open(f"{base}/index{i}/type") as f:
                kind = f.read().strip()
        except OSError:
            continue
        if found == level and size and (kind in types or level == "2"):
            return size
    return default


def has_integer_dot() -> bool:
    """Whether the CPU multiplies and sums groups of 8-bit integers in one instruction
    (VNNI's ``vpdpbusd``: AVX-512 VNNI, or AVX-VNNI on 256-bit vectors)."""
    flags = cpu_flags()
    return "avx512_vnni" in flags or "avx_vnni" in flags


def has_vnni512() -> bool:
    """Whether the CPU has AVX-512 VNNI (``vpdpbusd`` on 512-bit vectors): the register
    tiles of byte dot products call a micro-kernel of those instructions."""
    flags = cpu_flags()
    return "avx512_vnni" in flags and "avx512f" in flags


def _process_cpus() -> int:
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except (AttributeError, OSError):
        return max(1, os.cpu_count() or 1)


#: the CPUs this process may run on, read at import: once a polyc library has run a
#: parallel region under ``OMP_PROC_BIND``, libgomp has pinned the calling thread to
#: one CPU and asking again would say 1
_CPUS = _process_cpus()


def threads(requested: int | None = None) -> int:
    """The threads an ``omp parallel for`` will use: ``requested`` (``Options.threads``),
    else ``OMP_NUM_THREADS``, else the CPUs this process may run on (libgomp's default)."""
    if requested:
        return requested
    env = os.environ.get("OMP_NUM_THREADS", "").split(",")[0].strip()
    if env.isdigit() and int(env) > 0:
        return int(env)
    return _CPUS


#: the C program behind :func:`strided_panel_cost`: one float register tile of the
#: machine's shape (``MR`` rows of ``NR`` columns in vectors of ``VB`` bytes, given as
#: ``-D``; its accumulators held in registers, so that the tile runs near the FMA peak
#: and its loads show) swept with a reduction of ``K`` steps over the weight panels of a
#: 512-wide matrix in two ways: as short rows 2 KB apart, in the order an unpacked
#: schedule runs them (a ``CACHE_TILE``-column cache tile, each row tile through its
#: panels), and packed, one contiguous panel after another, each reused by all the row
#: tiles. It prints the best time of the first over the best of the second. ``K`` and
#: ``CACHE_TILE`` are the scheduler's own on this machine (:func:`strided_panel_cost`).
#: (The first probe's tile kept its accumulators in memory: compute-bound at half the
#: peak, it read 1.01 on a Zen 2 EPYC where this one reads 1.5, as whole matmuls do
#: there. The second swept a fixed 512 steps and 128 columns, half the reduction that
#: the scheduler's register tiles sweep: on a Xeon with a 48 KB L1 and a 2 MB L2 it read
#: 1.08-1.20, below :data:`polyc.pack.STRIDED_PANEL_SLOW`, while packing made
#: 128x3072x768 1.6x faster and 64x784x512 1.1x; at 1024 steps and 256 columns it
#: reads 1.9 there.)
_PROBE_C = r"""
#define _POSIX_C_SOURCE 200112L
#include <stdio.h>
#include <stdlib.h>
#include <time.h>
#define WIDE 512
#define ROW_TILES 8
#define NV (NR * 4 / VB)
typedef float vf __attribute__((vector_size(VB), aligned(4)));
static double now(void) { struct timespec t; clock_gettime(CLOCK_MONOTONIC, &t);
                          return t.tv_sec + t.tv_nsec * 1e-9; }
__attribute__((noinline)) static void tile(const float *restrict a, const float *restrict b,
                                           long stride, float *restrict c) {
  vf acc[MR][NV];
  #pragma GCC unroll 32
  for (int r = 0; r < MR; r++)
    #pragma GCC unroll 32
    for (int j = 0; j < NV; j++) acc[r][j] = (vf){0};
  for (long k = 0; k < K; k++) {
    vf w[NV];
    #pragma GCC unroll 32
    for (int j = 0; j < NV; j++) w[j] = *(const vf *)(b + k * stride + j * (VB / 4));
    #pragma GCC unroll 32
    for (int r = 0; r < MR; r++) {
      float x = a[r * K + k];
      #pragma GCC unroll 32
      for (int j = 0; j < NV; j++) acc[r][j] += x * w[j];
    }
  }
  #pragma GCC unroll 32
  for (int r = 0; r < MR; r++)
    #pragma GCC unroll 32
    for (int j = 0; j < NV; j++) *(vf *)(c + r * NR + j * (VB / 4)) += acc[r][j];
}
int main(void) {
  float *b = aligned_alloc(64, sizeof(float) * K * WIDE);
  float *p = aligned_alloc(64, sizeof(float) * K * WIDE);
  float *a = aligned_alloc(64, sizeof(float) * MR * K * ROW_TILES);
  static float c[MR * NR] __attribute__((aligned(64)));
  if (!a || !b || !p) return 1;
  for (long i = 0; i < (long)K * WIDE; i++) b[i] = 1e-3f * (float)(i % 7);
  for (long nb = 0; nb < WIDE / NR; nb++)  /* the same values, panel after panel */
    for (long i = 0; i < (long)K * NR; i++) p[nb * K * NR + i] = b[(i / NR) * WIDE + nb * NR + i % NR];
  for (long i = 0; i < (long)MR * K * ROW_TILES; i++) a[i] = 1e-3f * (float)(i % 5);
  double best[2] = {1e30, 1e30};
  for (int rep = 0; rep < 15; rep++)
    for (int v = 0; v < 2; v++) {
      double t = now();
      if (v == 0)
        for (int ct = 0; ct < WIDE / CACHE_TILE; ct++)
          for (int rt = 0; rt < ROW_TILES; rt++)
            for (int nb = ct * CACHE_TILE / NR; nb < (ct + 1) * CACHE_TILE / NR; nb++)
              tile(a + rt * MR * K, b + nb * NR, WIDE, c);
      else
        for (int nb = 0; nb < WIDE / NR; nb++)
          for (int rt = 0; rt < ROW_TILES; rt++)
            tile(a + rt * MR * K, p + (long)nb * K * NR, NR, c);
      t = now() - t;
      if (t < best[v]) best[v] = t;
    }
  printf("%.4f %g\n", best[0] / best[1], (double)c[0]);
  return 0;
}
"""

#: the probe's version, part of its key in the cache file (a new probe measures anew)
PROBE_VERSION = 3


@functools.lru_cache(maxsize=8)
def strided_panel_cost(mr: int, nr: int, vector_bytes: int, steps: int = 512) -> float:
    """How many times longer a float register tile of ``mr`` x ``nr`` (vectors of
    ``vector_bytes``) takes when its weight panels are short rows of a wider matrix (2 KB
    apart: shorter than a page), run as an unpacked schedule runs them, than when each
    panel is one contiguous run reused by all the row tiles. Each tile sums ``steps``
    reduction steps (the scheduler's reduction chunk), and the unpacked cache tile is as
    many columns as half the L2 holds at that depth (as the scheduler sizes it), a
    power of two from ``nr`` to 512. Near 1 where the hardware
    prefetchers follow such strided runs within a page; well above it where they do not,
    and packing the operand (:mod:`polyc.pack`) pays at fewer rows of reuse.

    Measured once per CPU and tile shape by a small C program (:data:`_PROBE_C`, built
    with ``POLYC_CC`` or gcc, ``-O3 -march=native``, best of 15 runs of each), and kept
    in ``<POLYC_CACHE_DIR>/machine/<cpu>.json``; ``POLYC_STRIDED_PANEL_COST`` overrides
    it. 1.0 (the prefetchers assumed to follow) where the program cannot be built or
    run, or the shape is not whole vectors."""
    env = os.environ.get("POLYC_STRIDED_PANEL_COST", "").strip()
    try:
        if env and float(env) > 0:
            return float(env)
    except ValueError:
        pass
    if mr < 1 or vector_bytes < 4 or nr * 4 % vector_bytes or 512 % nr or steps < 1:
        return 1.0
    cols = panel_bytes() // (steps * 4)
    cache_tile = max(nr, min(512, 1 << max(0, cols.bit_length() - 1)))
    key = f"strided_panel_cost v{PROBE_VERSION} {mr}x{nr} {vector_bytes} {steps} {cache_tile}"
    path = _probe_path()
    cached = _read_probes(path).get(key)
    if isinstance(cached, (int, float)) and cached > 0:
        return float(cached)
    cost = _run_probe(mr, nr, vector_bytes, steps, cache_tile)
    if cost is None:
        return 1.0
    try:  # (re-read: another process may have kept another shape meanwhile)
        write_atomically(path, json.dumps({**_read_probes(path), key: cost}))
    except OSError:
        pass
    return cost


def _read_probes(path: str) -> dict:
    """The probes kept in ``path`` (empty where it is missing or unreadable)."""
    try:
        with open(path) as f:
            known = json.load(f)
    except (OSError, ValueError):
        return {}
    return known if isinstance(known, dict) else {}


def _probe_path() -> str:
    from ..options import Options  # (its default cache directory: POLYC_CACHE_DIR's)
    return os.path.join(Options().cache_dir, "machine", cpu_key() + ".json")


def _run_probe(mr: int, nr: int, vector_bytes: int, steps: int = 512,
               cache_tile: int = 128) -> float | None:
    cc = os.environ.get("POLYC_CC", "gcc")
    with tempfile.TemporaryDirectory(prefix="polyc-probe-") as tmp:
        src, exe = os.path.join(tmp, "probe.c"), os.path.join(tmp, "probe")
        with open(src, "w") as f:
            f.write(_PROBE_C)
        try:
            subprocess.run([cc, "-O3", "-march=native", "-ffp-contract=fast", "-std=gnu11",
                            f"-DMR={mr}", f"-DNR={nr}", f"-DVB={vector_bytes}",
                            f"-DK={steps}", f"-DCACHE_TILE={cache_tile}",
                            "-o", exe, src], check=True, capture_output=True, timeout=120)
            out = subprocess.run([exe], check=True, capture_output=True, text=True,
                                 timeout=120).stdout.split()
            cost = float(out[0])
        except (OSError, subprocess.SubprocessError, ValueError, IndexError):
            return None
    return cost if cost > 0 else None
