"""What identifies the CPU polyc runs on, read once from ``/proc/cpuinfo``.

A leaf module that every layer may import: the scheduler's machine model
(:mod:`polyc.schedule.machine`) reads the feature flags, and the code generator's build
cache (:mod:`polyc.codegen.toolchain`) keys ``-march=native`` builds by the description.
The files those per-machine caches keep are written by :func:`write_atomically`.
"""
from __future__ import annotations

import functools
import hashlib
import os
import platform
import tempfile


@functools.lru_cache(maxsize=1)
def cpu_flags() -> frozenset[str]:
    """The feature flags of this CPU (``/proc/cpuinfo``; empty where it cannot be read)."""
    try:
        with open("/proc/cpuinfo") as f:
            return frozenset(next((ln.split(":", 1)[1].split() for ln in f
                                   if ln.startswith("flags")), []))
    except OSError:
        return frozenset()


@functools.lru_cache(maxsize=1)
def cpu_description() -> str:
    """The CPU model and feature flags (``/proc/cpuinfo``'s ``model name`` and ``flags``
    lines): what tells one CPU's ``-march=native`` builds, tuning and probes from
    another's."""
    try:
        with open("/proc/cpuinfo") as f:
            lines = [ln for ln in f if ln.startswith(("model name", "flags"))]
        return "".join(sorted(set(lines)))
    except OSError:
        return platform.processor() or platform.machine()


def cpu_key() -> str:
    """:func:`cpu_description` hashed: the name of this CPU's files in the cache."""
    return hashlib.sha256(cpu_description().encode()).hexdigest()[:16]


def write_atomically(path: str, data: str | bytes) -> None:
    """Write ``data`` to ``path`` (its directory made if missing) so that a reader never
    sees half a file: a temporary file beside it, then ``os.replace``."""
    directory = os.path.dirname(os.path.abspath(path))
    os.makedirs(directory, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=os.path.basename(path) + ".", suffix=".tmp",
                               dir=directory)
    try:
        with os.fdopen(fd, "wb" if isinstance(data, bytes) else "w") as f:
            f.write(data)
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise
