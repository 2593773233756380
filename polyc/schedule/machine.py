"""Facts about the CPU that tile-size rules use, read once from the system."""
from __future__ import annotations

import functools
import os

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


@functools.lru_cache(maxsize=1)
def cpu_flags() -> frozenset[str]:
    """The feature flags of this CPU (``/proc/cpuinfo``; empty where it cannot be read)."""
    try:
        with open("/proc/cpuinfo") as f:
            return frozenset(next((ln.split(":", 1)[1].split() for ln in f
                                   if ln.startswith("flags")), []))
    except OSError:
        return frozenset()


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
