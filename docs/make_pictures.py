"""Writes the pictures of the README (python3 docs/make_pictures.py; needs matplotlib)."""
from __future__ import annotations

import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "examples", "benchmarks"))

import polyc  # noqa: E402
from polyc import plot  # noqa: E402
from scop_kernels import JACOBI_1D, SEIDEL_2D  # noqa: E402


def main() -> None:
    op = polyc.scop(JACOBI_1D)
    base = op.schedule_space()
    s = base.shift("S1", "i", 1).fuse(2, "S0", "S1").skew("S0", "t", "i", 2) \
        .tile("S0", ("t", "i"), (4, 8))
    s.plot(os.path.join(HERE, "jacobi_tiles.png"), sizes={"T": 8, "N": 20})
    seidel = polyc.scop(SEIDEL_2D).schedule_space()
    seidel.plot(os.path.join(HERE, "seidel_deps.png"), sizes={"T": 1, "N": 10}, loops=("i", "j"))
    s.plot_dependences(os.path.join(HERE, "jacobi_deps.png"))
    table = polyc.compare(op, {"isl": None, "pluto diamond": {"scheduler": "pluto"},
                               "source order": base, "skewed, tiled": s},
                          sizes={"T": 100, "N": 20000}, repeat=5)
    print(table)
    plot.roofline(table, op.kernel, os.path.join(HERE, "jacobi_roofline.png"))


if __name__ == "__main__":
    main()
