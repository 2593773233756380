"""Pictures (issue 11, part 5): iteration spaces with dependences and tiles, dependence
graphs, rooflines -- written to files, and inline in notebooks (``_repr_png_``)."""
from __future__ import annotations

import pytest
from test_scop import JACOBI_1D, SEIDEL_2D

import polyc
from polyc.errors import PolycError

pytest.importorskip("matplotlib")
from polyc import plot  # noqa: E402

PNG = b"\x89PNG\r\n\x1a\n"


def test_iteration_space_with_tiles_and_dependences(tmp_path):
    op = polyc.scop(JACOBI_1D)
    s = op.schedule_space().shift("S1", "i", 1).fuse(2, "S0", "S1") \
        .skew("S0", "t", "i", 2).tile("S0", ("t", "i"), (4, 8))
    path = tmp_path / "tiles.png"
    fig = s.plot(str(path), sizes={"T": 8, "N": 20})
    assert path.read_bytes().startswith(PNG)
    ax = fig.axes[0]
    assert ax.get_xlabel() == "t" and ax.get_ylabel() == "i"
    labels = {t.get_text() for t in ax.texts}
    assert {"0", "1", "2"} <= labels  # tile execution order
    assert s._repr_png_().startswith(PNG)


def test_seidel_dependences_over_two_loops(tmp_path):
    s = polyc.scop(SEIDEL_2D).schedule_space()
    fig = s.plot(str(tmp_path / "seidel.png"), sizes={"T": 1, "N": 9}, loops=("i", "j"))
    legend = [t.get_text() for t in fig.axes[0].get_legend().get_texts()]
    assert "flow dependence" in legend
    with pytest.raises(PolycError, match="more than"):
        s.plot(sizes={"T": 50, "N": 100})


def test_dependence_graph_and_roofline(tmp_path):
    op = polyc.scop(JACOBI_1D)
    s = op.schedule_space()
    fig = s.plot_dependences(str(tmp_path / "deps.png"))
    texts = {t.get_text() for t in fig.axes[0].texts}
    assert {"S0", "S1"} <= texts and any(t.startswith("flow") for t in texts)
    table = polyc.compare(op, {"source": s}, sizes={"T": 4, "N": 500}, repeat=1)
    fig = plot.roofline(table, op.kernel, str(tmp_path / "roof.png"), peaks=(100.0, 20.0))
    assert (tmp_path / "roof.png").read_bytes().startswith(PNG)
    assert any("roof" in t.get_text() for t in fig.axes[0].get_legend().get_texts())
