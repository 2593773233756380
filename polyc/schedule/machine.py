"""Facts about the CPU that tile-size rules use, read once from the system."""
from __future__ import annotations

import functools

#: assumed when /sys does not say (a common L2 size per core)
DEFAULT_L2_BYTES = 1 << 20


def _parse_size(text: str) -> int | None:
    text = text.strip().upper()
    scale = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}.get(text[-1:], 1)
    digits = text.rstrip("KMG")
    return int(digits) * scale if digits.isdigit() else None


@functools.lru_cache(maxsize=1)
def l2_bytes() -> int:
    """The per-core L2 (unified, level 2) cache size of CPU 0."""
    base = "/sys/devices/system/cpu/cpu0/cache"
    for i in range(8):
        try:
            with open(f"{base}/index{i}/level") as f:
                level = f.read().strip()
            with open(f"{base}/index{i}/size") as f:
                size = _parse_size(f.read())
        except OSError:
            continue
        if level == "2" and size:
            return size
    return DEFAULT_L2_BYTES
