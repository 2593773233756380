"""Pictures of schedules (matplotlib, optional: ``pip install polyc[plots]``).

* :func:`iteration_space` -- the instances of one statement over two of its loops, for
  small sizes: the dependences between them as arrows, coloured by kind; each point
  coloured by the tile the schedule puts it in (the ``_tile`` loops of a
  :class:`ScheduleSpace`), and the execution order of the tiles as numbers;
* :func:`dependence_graph` -- statements as nodes, dependences as edges labelled with
  their kind and array;
* :func:`roofline` -- a :class:`polyc.compare.Comparison` on a roofline: each variant's
  GFLOP/s against its arithmetic intensity (flops per byte of its arrays' footprint),
  under the machine's peaks (given, or measured here by a short numpy benchmark).

Each returns the matplotlib figure and writes it when ``path`` is given.
``ScheduleSpace.plot(path)`` and its ``_repr_png_`` (notebooks) use
:func:`iteration_space`.
"""
from __future__ import annotations

import io
import time
from collections.abc import Mapping
from typing import Any

import islpy as isl
import numpy as np

from .errors import PolycError

KIND_COLOURS = {"flow": "tab:red", "anti": "tab:blue", "output": "tab:green",
                "reduction": "tab:grey"}
#: at most this many points are drawn (small sizes: the picture must stay readable)
MAX_POINTS = 4096


def _pyplot() -> Any:
    try:
        import matplotlib
        matplotlib.use("Agg", force=False)
        import matplotlib.pyplot as plt
    except ImportError:
        raise PolycError("pictures need matplotlib: pip install matplotlib "
                         "(or polyc[plots])") from None
    return plt


def _points(s: isl.Set) -> list[tuple[int, ...]]:
    pts: list[tuple[int, ...]] = []
    n = s.dim(isl.dim_type.set)

    def add(p: isl.Point) -> None:
        if len(pts) <= MAX_POINTS:
            pts.append(tuple(p.get_coordinate_val(isl.dim_type.set, i).to_python()
                             for i in range(n)))
    s.foreach_point(add)
    if len(pts) > MAX_POINTS:
        raise PolycError(f"the iteration space has more than {MAX_POINTS} points: "
                         "plot it for smaller sizes")
    return pts


def _fix(s: Any, sizes: Mapping[str, int]) -> Any:
    """``s`` (set or map) with its parameters fixed to ``sizes`` and projected out."""
    for i in reversed(range(s.dim(isl.dim_type.param))):
        name = s.get_dim_name(isl.dim_type.param, i)
        if name not in sizes:
            raise PolycError(f"give the size {name} to plot (sizes={{...}})")
        s = s.fix_val(isl.dim_type.param, i, isl.Val.int_from_si(s.get_ctx(), int(sizes[name])))
        s = s.project_out(isl.dim_type.param, i, 1)
    return s


def iteration_space(space: Any, sizes: Mapping[str, int], stmt: str | None = None,
                    loops: tuple[str, str] | None = None, path: str | None = None,
                    title: str | None = None) -> Any:
    """Instances of ``stmt`` (the first statement by default) over ``loops`` (its first
    two iterators), dependences between them, tiles and tile order (see module doc)."""
    plt = _pyplot()
    kernel = space.kernel
    stmt = stmt or space.statements[0]
    s = kernel.statement(stmt)
    its = list(s.iterators)
    if len(its) < 1:
        raise PolycError(f"{stmt} has no loop to draw")
    loops = loops or (tuple(its[:2]) if len(its) >= 2 else (its[0], its[0]))
    axes = [its.index(x) for x in loops]
    points = _points(_fix(s.domain, sizes))
    smap = space.schedule_map().intersect_domain(isl.UnionSet.from_set(s.domain))
    times = {}
    mlist = smap.get_map_list()
    for i in range(mlist.n_map()):
        m = _fix(mlist.get_at(i), sizes)
        n_in = m.dim(isl.dim_type.in_)

        def add(p: isl.Point, n_in: int = n_in, m: isl.Map = m) -> None:
            coords = [p.get_coordinate_val(isl.dim_type.set, k).to_python()
                      for k in range(n_in + m.dim(isl.dim_type.out))]
            times[tuple(coords[:n_in])] = tuple(coords[n_in:])
        m.wrap().foreach_point(add)
    row = dict(space.dims)[stmt]
    tile_dims = [d for d, dim in enumerate(row) if dim.loop and dim.name.endswith("_tile")]
    fig, ax = plt.subplots(figsize=(6, 5))
    xs = [p[axes[0]] for p in points]
    ys = [p[axes[1]] for p in points]
    if tile_dims:
        keys = sorted({tuple(times[p][d] for d in tile_dims) for p in points})
        index = {k: n for n, k in enumerate(keys)}
        colour = [index[tuple(times[p][d] for d in tile_dims)] for p in points]
        ax.scatter(xs, ys, c=colour, cmap="tab20", s=28, zorder=3)
        for k, n in index.items():  # the tile's execution order at its centre
            members = [p for p in points if tuple(times[p][d] for d in tile_dims) == k]
            cx = np.mean([p[axes[0]] for p in members])
            cy = np.mean([p[axes[1]] for p in members])
            ax.annotate(str(n), (cx, cy), fontsize=8, ha="center", va="center", zorder=4,
                        bbox={"boxstyle": "circle,pad=0.15", "fc": "white", "alpha": 0.7})
    else:
        order = sorted(points, key=lambda p: times[p])
        rank = {p: n for n, p in enumerate(order)}
        ax.scatter(xs, ys, c=[rank[p] for p in points], cmap="viridis", s=28, zorder=3)
    for kind in ("flow", "anti", "output", "reduction"):
        rel = getattr(space.deps, kind).intersect_params(kernel.context)
        mine = rel.intersect_domain(isl.UnionSet.from_set(s.domain)) \
            .intersect_range(isl.UnionSet.from_set(s.domain))
        if mine.is_empty():
            continue
        pairs = _fix(isl.Map.from_union_map(mine), sizes)
        drawn = 0
        n = len(its)

        def arrow(p: isl.Point, kind: str = kind, n: int = n) -> None:
            nonlocal drawn
            if drawn > 400:
                return
            c = [p.get_coordinate_val(isl.dim_type.set, k).to_python() for k in range(2 * n)]
            a, b = c[:n], c[n:]
            if all(a[k] == b[k] for k in range(n) if k not in axes) or n <= 2:
                ax.annotate("", xy=(b[axes[0]], b[axes[1]]), xytext=(a[axes[0]], a[axes[1]]),
                            arrowprops={"arrowstyle": "->", "color": KIND_COLOURS[kind],
                                        "lw": 0.8, "alpha": 0.6}, zorder=2)
                drawn += 1
        pairs.wrap().foreach_point(arrow)
        ax.plot([], [], color=KIND_COLOURS[kind], label=f"{kind} dependence")
    ax.set_xlabel(loops[0])
    ax.set_ylabel(loops[1])
    shown = ", ".join(f"{k}={v}" for k, v in sizes.items())
    ax.set_title(title or f"{kernel.name}: {stmt} ({shown})")
    if ax.get_legend_handles_labels()[0]:
        ax.legend(loc="upper left", fontsize=8, framealpha=0.8)
    fig.tight_layout()
    if path:
        fig.savefig(path, dpi=110)
    return fig


def dependence_graph(space: Any, path: str | None = None) -> Any:
    """Statements on a circle, an arrow per (kind, source, sink) with its arrays."""
    plt = _pyplot()
    kernel = space.kernel
    names = list(space.statements)
    angle = {n: 2 * np.pi * k / max(1, len(names)) for k, n in enumerate(names)}
    pos = {n: (np.cos(a), np.sin(a)) for n, a in angle.items()}
    fig, ax = plt.subplots(figsize=(5, 5))
    for n, (x, y) in pos.items():
        ax.annotate(n, (x, y), ha="center", va="center", fontsize=11, zorder=3,
                    bbox={"boxstyle": "round", "fc": "white"})
    seen = set()
    for kind in ("flow", "anti", "output", "reduction"):
        rel = getattr(space.deps, kind)
        ml = rel.get_map_list()
        for i in range(ml.n_map()):
            m = ml.get_at(i)
            a, b = m.get_tuple_name(isl.dim_type.in_), m.get_tuple_name(isl.dim_type.out)
            if (kind, a, b) in seen or m.is_empty():
                continue
            seen.add((kind, a, b))
            arrays = ", ".join(space._arrays(kind, a, b)) if kind != "reduction" else \
                kernel.statement(a).write.array
            (x0, y0), (x1, y1) = pos[a], pos[b]
            if a == b:
                ax.annotate(f"{kind} {arrays}", (x0, y0 + 0.18), fontsize=8, ha="center",
                            color=KIND_COLOURS[kind])
                continue
            ax.annotate("", xy=(x1, y1), xytext=(x0, y0),
                        arrowprops={"arrowstyle": "->", "color": KIND_COLOURS[kind],
                                    "connectionstyle": "arc3,rad=0.15"})
            ax.annotate(f"{kind} {arrays}", ((x0 + x1) / 2, (y0 + y1) / 2), fontsize=8,
                        color=KIND_COLOURS[kind], ha="center")
    ax.set_xlim(-1.6, 1.6)
    ax.set_ylim(-1.6, 1.6)
    ax.axis("off")
    ax.set_title(f"dependences of {kernel.name}")
    fig.tight_layout()
    if path:
        fig.savefig(path, dpi=110)
    return fig


def measured_peaks(seconds: float = 0.3) -> tuple[float, float]:
    """(GFLOP/s, GB/s) measured here with numpy: a float32 matrix product and a copy of
    a 256 MiB array (the roofline's roof when none is given)."""
    a = np.random.default_rng(0).random((1024, 1024), np.float32)
    t0, n = time.perf_counter(), 0
    while time.perf_counter() - t0 < seconds:
        a @ a
        n += 1
    flops = 2 * 1024 ** 3 * n / (time.perf_counter() - t0) / 1e9
    src = np.ones(64 * 2 ** 20, np.float32)
    dst = np.empty_like(src)
    t0, n = time.perf_counter(), 0
    while time.perf_counter() - t0 < seconds:
        np.copyto(dst, src)
        n += 1
    bandwidth = 2 * src.nbytes * n / (time.perf_counter() - t0) / 1e9
    return flops, bandwidth


def roofline(comparison: Any, kernel: Any, path: str | None = None,
             peaks: tuple[float, float] | None = None) -> Any:
    """The variants of ``comparison`` (:func:`polyc.compare`) under the roofline of
    ``peaks`` (GFLOP/s, GB/s; measured when None). A variant's intensity is its flops
    over the bytes of every array it touches once (the compulsory traffic)."""
    plt = _pyplot()
    from .codegen.runtime import NUMPY_DTYPES
    from . import expr as E
    sizes = dict(comparison.sizes)
    nbytes = 0
    for a in kernel.arrays:
        n = 1
        for d in a.shape:
            n *= E.evaluate(d, sizes)
        nbytes += n * NUMPY_DTYPES[a.dtype].itemsize
    intensity = comparison.flops / max(1, nbytes)
    flops, bandwidth = peaks or measured_peaks()
    fig, ax = plt.subplots(figsize=(6, 4))
    xs = np.logspace(-2, 3, 200)
    ax.loglog(xs, np.minimum(flops, bandwidth * xs), color="black", lw=1.5,
              label=f"roof: {flops:.0f} GFLOP/s, {bandwidth:.0f} GB/s")
    for r in comparison.rows:
        ax.loglog([intensity], [r.gflops], "o", label=f"{r.name}: {r.gflops:.1f} GFLOP/s")
    ax.set_xlabel("arithmetic intensity (flops / byte of compulsory traffic)")
    ax.set_ylabel("GFLOP/s")
    ax.set_title(f"{comparison.operator} ({', '.join(f'{k}={v}' for k, v in sizes.items())})")
    ax.legend(fontsize=8)
    fig.tight_layout()
    if path:
        fig.savefig(path, dpi=110)
    return fig


def png_bytes(fig: Any) -> bytes:
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=90)
    _pyplot().close(fig)
    return buf.getvalue()
