"""Outputs whose size depends on the data: NonZero, Compress, Unique, NonMaxSuppression.

Each is checked against onnxruntime (onnx's reference where onnxruntime has no kernel)
on random data of odd sizes, through the Python API (which cuts each output to its
count), on both targets (C, and CUDA through the CPU emulation); the C library's own
view (the bound-sized buffer and the count output) is checked too, and so are the ops
downstream that keep the count (Transpose, Gather, Cast...) and the refusal of one that
would read past it.
"""
from __future__ import annotations

import re

import numpy as np
import pytest
from onnx import TensorProto as T
from onnx import helper, numpy_helper
from onnx.reference import ReferenceEvaluator

import polyc
from polyc.frontend.onnx_graph import UnsupportedOpError

ort = pytest.importorskip("onnxruntime")
F, I64, B = T.FLOAT, T.INT64, T.BOOL
TARGETS = [pytest.param({}, id="c"),
           pytest.param({"target": "cuda", "emulate": True}, id="cuda-emulated")]


def _model(nodes, ins, outs, inits=(), opset=19):
    graph = helper.make_graph(nodes, "dyn", [helper.make_tensor_value_info(n, t, s)
                                             for n, t, s in ins],
                              [helper.make_tensor_value_info(n, t, None) for n, t in outs],
                              list(inits))
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])


def _expected(model, feed, use_ort=True):
    if use_ort:
        sess = ort.InferenceSession(model.SerializeToString(),
                                    providers=["CPUExecutionProvider"])
        return sess.run(None, feed)
    return ReferenceEvaluator(model).run(None, feed)


def _check(model, feed, target, use_ort=True, values=None):
    compiled = polyc.compile_onnx(model, **target, values=values)
    want = _expected(model, {**feed, **(values or {})}, use_ort)
    got = compiled.run(None, feed)
    assert len(got) == len(want)
    for g, w in zip(got, want):
        assert g.shape == w.shape and g.dtype == w.dtype, (g.shape, w.shape, g.dtype, w.dtype)
        np.testing.assert_array_equal(g, w)
    return compiled


@pytest.mark.parametrize("target", TARGETS)
def test_nonzero(target):
    rng = np.random.default_rng(1)
    model = _model([helper.make_node("NonZero", ["x"], ["y"])], [("x", F, [3, 5, 7])],
                   [("y", I64)])
    compiled = None
    for density in (0.0, 0.3, 1.0):  # none, some, all: the count's two ends
        x = np.where(rng.random((3, 5, 7)) < density, rng.standard_normal((3, 5, 7)),
                     0).astype(np.float32)
        if compiled is None:
            compiled = _check(model, {"x": x}, target)
        else:
            got, = compiled.run(None, {"x": x})
            np.testing.assert_array_equal(got, np.array(np.nonzero(x)))
    assert compiled.dynamic_outputs == {"y": (1, (3, 105))}
    assert compiled.output_names == ["y"]


@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize("axis", [None, 0, -1])
def test_compress(axis, target):
    rng = np.random.default_rng(2)
    x = rng.standard_normal((4, 9)).astype(np.float32)
    n = 4 if axis == 0 else (9 if axis == -1 else 30)
    kw = {} if axis is None else {"axis": axis}
    model = _model([helper.make_node("Compress", ["x", "c"], ["y"], **kw)],
                   [("x", F, [4, 9]), ("c", B, [n])], [("y", F)])
    compiled = _check(model, {"x": x, "c": rng.random(n) < 0.5}, target)
    for c in (np.zeros(n, bool), np.ones(n, bool)):
        got, = compiled.run(None, {"x": x, "c": c})
        np.testing.assert_array_equal(got, np.compress(c, x, axis=axis))


@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize("axis,ordered", [(None, 1), (None, 0), (0, 1), (1, 1), (1, 0)])
def test_unique(axis, ordered, target):
    rng = np.random.default_rng(3)
    x = rng.integers(0, 3, (7, 5)).astype(np.float32)
    x[4] = x[1]  # a repeated row
    x[:, 3] = x[:, 0]  # and column
    kw = {"sorted": ordered} if axis is None else {"sorted": ordered, "axis": axis}
    model = _model([helper.make_node("Unique", ["x"], ["y", "i", "inv", "n"], **kw)],
                   [("x", F, [7, 5])], [("y", F), ("i", I64), ("inv", I64), ("n", I64)],
                   opset=11)
    _check(model, {"x": x}, target)


def test_unique_float_corners():
    """-0.0 equals 0.0; NaNs are one value, sorted last (numpy's unique)."""
    model = _model([helper.make_node("Unique", ["x"], ["y", "i", "inv", "n"])],
                   [("x", F, [8])], [("y", F), ("i", I64), ("inv", I64), ("n", I64)],
                   opset=11)
    x = np.array([1.0, np.nan, -0.0, 0.0, np.nan, -2.0, 1.0, np.inf], np.float32)
    y, i, inv, n = polyc.compile_onnx(model).run(None, {"x": x})
    wy, wi, winv, wn = np.unique(x, return_index=True, return_inverse=True,
                                 return_counts=True)
    np.testing.assert_array_equal(y, wy)
    np.testing.assert_array_equal(i, wi)
    np.testing.assert_array_equal(inv, winv)
    np.testing.assert_array_equal(n, wn)


def _boxes(rng, batches, n, center):
    corners = rng.uniform(0, 10, (batches, n, 2)).astype(np.float32)
    sizes = rng.uniform(0.5, 4, (batches, n, 2)).astype(np.float32)
    if center:
        return np.concatenate([corners, sizes], axis=2)
    flip = rng.random((batches, n, 1)) < 0.3  # some boxes with corners swapped
    other = corners + sizes
    return np.where(flip, np.concatenate([other, corners], 2),
                    np.concatenate([corners, other], 2)).astype(np.float32)


def _nms_model(b, c, n):
    """NonMaxSuppression of ``b x n`` boxes and ``b x c x n`` scores, every input given
    (the per-class limit at compile time, the thresholds at run time)."""
    return _model([helper.make_node("NonMaxSuppression",
                                    ["boxes", "scores", "k", "iou", "score"], ["sel"])],
                  [("boxes", F, [b, n, 4]), ("scores", F, [b, c, n]), ("k", I64, [1]),
                   ("iou", F, [1]), ("score", F, [1])], [("sel", I64)], opset=11)


@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize("center,thresholds", [(0, True), (1, True), (0, False)])
def test_non_max_suppression(center, thresholds, target):
    rng = np.random.default_rng(4 + center)
    b, c, n = 2, 3, 23
    boxes = _boxes(rng, b, n, center)
    scores = rng.random((b, c, n)).astype(np.float32)
    scores[0, 1, 5] = scores[0, 1, 7]  # a tie: the lower index first
    ins = ["boxes", "scores", "k"] + (["iou", "score"] if thresholds else [])
    model = _model([helper.make_node("NonMaxSuppression", ins, ["sel"],
                                     center_point_box=center)],
                   [("boxes", F, [b, n, 4]), ("scores", F, [b, c, n]), ("k", I64, [1])]
                   + ([("iou", F, [1]), ("score", F, [1])] if thresholds else []),
                   [("sel", I64)], opset=11)
    feed = {"boxes": boxes, "scores": scores}
    if thresholds:
        feed.update(iou=np.array([0.2], np.float32), score=np.array([0.3], np.float32))
    compiled = _check(model, feed, target, values={"k": np.array([6], np.int64)})
    assert compiled.dynamic_outputs == {"sel": (0, (b * c * 6, 3))}
    if thresholds:  # the same library, other thresholds at run time
        for iou, score in ((0.0, 0.0), (0.7, 0.9), (1.0, 1.0)):
            feed.update(iou=np.array([iou], np.float32), score=np.array([score], np.float32))
            got, = compiled.run(None, feed)
            want, = _expected(model, {**feed, "k": np.array([6], np.int64)})
            np.testing.assert_array_equal(got, want)


@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize("per_class", [3, 100])
def test_non_max_suppression_many_classes(per_class, target):
    """18 classes (the greedy loop's vectors over classes: a full vector and a tail),
    a per-class limit that binds and one past the box count, and the corner cases of
    the overlap test: identical boxes (IoU 1), zero-area boxes, NaN and tied scores
    (a NaN never passes the score threshold)."""
    rng = np.random.default_rng(7)
    b, c, n = 1, 18, 37
    boxes = _boxes(rng, b, n, 0)
    boxes[0, 4] = boxes[0, 9]  # the same box twice
    boxes[0, 11, 2:] = boxes[0, 11, :2]  # a box of zero area
    scores = rng.random((b, c, n)).astype(np.float32)
    scores[0, 2, 3] = np.nan
    scores[0, 5, [1, 8, 20]] = scores[0, 5, 30]  # ties: lower indices first
    model = _nms_model(b, c, n)
    feed = {"boxes": boxes, "scores": scores, "iou": np.array([0.3], np.float32),
            "score": np.array([0.1], np.float32)}
    _check(model, feed, target, values={"k": np.array([per_class], np.int64)})


@pytest.mark.parametrize("target", TARGETS)
def test_detector_tail_keeps_the_count(target):
    """NMS -> the box column of its output -> the boxes themselves, and a Cast and a
    Transpose of NonZero: every op keeps the count, and each output is cut to it."""
    rng = np.random.default_rng(5)
    n = 17
    boxes = _boxes(rng, 1, n, 0)
    scores = rng.random((1, 1, n)).astype(np.float32)
    two = numpy_helper.from_array(np.array([2], np.int64), "two")
    zero = numpy_helper.from_array(np.array([0], np.int64), "zero")
    k = numpy_helper.from_array(np.array([5], np.int64), "k")
    iou = numpy_helper.from_array(np.array([0.3], np.float32), "iou")
    nodes = [helper.make_node("NonMaxSuppression", ["boxes", "scores", "k", "iou"], ["sel"]),
             helper.make_node("Gather", ["sel", "two"], ["col"], axis=1),
             helper.make_node("Squeeze", ["col"], ["idx"], ),
             helper.make_node("Gather", ["boxes", "zero"], ["b0"], axis=0),
             helper.make_node("Squeeze", ["b0", "zero"], ["b2"]),
             helper.make_node("Gather", ["b2", "idx"], ["picked"], axis=0),
             helper.make_node("Mul", ["picked", "scale"], ["scaled"]),
             helper.make_node("Greater", ["scores", "half"], ["hi"]),
             helper.make_node("NonZero", ["hi"], ["nz"]),
             helper.make_node("Transpose", ["nz"], ["nzt"], perm=[1, 0]),
             helper.make_node("Cast", ["nzt"], ["nzf"], to=F)]
    scale = numpy_helper.from_array(np.array([1, 2, 3, 4], np.float32), "scale")
    half = numpy_helper.from_array(np.array(0.5, np.float32), "half")
    model = _model(nodes, [("boxes", F, [1, n, 4]), ("scores", F, [1, 1, n])],
                   [("scaled", F), ("nzf", F)], [two, zero, k, iou, scale, half],
                   opset=13)
    compiled = _check(model, {"boxes": boxes, "scores": scores}, target)
    assert set(compiled.dynamic_outputs) == {"scaled", "nzf"}
    # the C library: bound-sized buffers, then one count per dynamic output
    source = compiled.source
    assert [t.name for t in source.outputs][:2] == ["scaled", "nzf"]
    assert len(source.outputs) == 4
    assert "depends on the data" in compiled.header


@pytest.mark.parametrize("consumer", ["ReduceSum", "Shape", "Reshape"])
def test_reading_past_the_count_is_refused(consumer):
    nodes = [helper.make_node("NonZero", ["x"], ["nz"])]
    inits = []
    if consumer == "ReduceSum":
        nodes.append(helper.make_node("ReduceSum", ["nz"], ["y"], keepdims=0))
    elif consumer == "Shape":
        nodes.append(helper.make_node("Shape", ["nz"], ["y"]))
    else:
        inits.append(numpy_helper.from_array(np.array([-1], np.int64), "flat"))
        nodes.append(helper.make_node("Reshape", ["nz", "flat"], ["y"]))
    model = _model(nodes, [("x", F, [4, 6])], [("y", I64)], inits, opset=13)
    with pytest.raises(UnsupportedOpError, match=rf"\({consumer}\) reads 'nz'.*depends on the "
                                                 r"data \(computed by node 'NonZero_0'\)"):
        polyc.compile_onnx(model)


def test_constant_condition_compress_is_static():
    x = np.arange(20, dtype=np.float32).reshape(4, 5)
    cond = numpy_helper.from_array(np.array([1, 0, 1, 1, 0], bool), "c")
    model = _model([helper.make_node("Compress", ["x", "c"], ["y"], axis=1)],
                   [("x", F, [4, 5])], [("y", F)], [cond])
    compiled = _check(model, {"x": x}, {})
    assert compiled.dynamic_outputs == {}


C_MAIN = r"""
#include <stdio.h>
#include "nz.h"
int main(int argc, char **argv) {
    nz_model *m = nz_init(argv[1]);
    if (!m) return 10;
    float x[3][4] = {{0, 1, 0, -2}, {0, 0, 0, 0}, {3, 0, 0, 4}};
    int64_t nz[2][12];
    int64_t count = -1;
    if (nz_run(m, &x[0][0], &nz[0][0], &count) != 0) return 11;
    printf("%lld", (long long)count);
    for (int d = 0; d < 2; d++)
        for (int64_t k = 0; k < count; k++) printf(" %lld", (long long)nz[d][k]);
    for (int64_t k = count; k < 12; k++) if (nz[0][k] || nz[1][k]) return 12;
    printf("\n");
    nz_free(m);
    return 0;
}
"""


def test_c_program_reads_the_count(tmp_path):
    """From C: the output at its largest shape, the count as one more output."""
    import subprocess
    z = numpy_helper.from_array(np.array(0.0, np.float32), "z")
    model = _model([helper.make_node("Abs", ["x"], ["a"]),
                    helper.make_node("Greater", ["a", "z"], ["m"]),
                    helper.make_node("NonZero", ["m"], ["nz"])],
                   [("x", F, [3, 4])], [("nz", I64)], [z], opset=17)
    compiled = polyc.compile_onnx(model, name="nz", output_dir=str(tmp_path))
    (tmp_path / "main.c").write_text(C_MAIN)
    exe = str(tmp_path / "main")
    cc = subprocess.run(["gcc", "-std=c11", "-Wall", "-Werror", "-I", str(tmp_path),
                         str(tmp_path / "main.c"), compiled.library_path,
                         f"-Wl,-rpath,{tmp_path}", "-o", exe], capture_output=True, text=True)
    assert cc.returncode == 0, cc.stderr
    run = subprocess.run([exe, compiled.weights_path], capture_output=True, text=True)
    assert run.returncode == 0, run
    x = np.array([[0, 1, 0, -2], [0, 0, 0, 0], [3, 0, 0, 4]], np.float32)
    want = np.array(np.nonzero(x))
    assert run.stdout.split() == [str(want.shape[1])] + [str(v) for v in want.reshape(-1)]


def test_nms_with_nan_scores_and_castlike():
    """NaN scores rank last (the ranks stay a permutation: no read past the boxes); a
    CastLike of a dynamic tensor keeps its axis whatever the rank of its type input."""
    rng = np.random.default_rng(9)
    boxes = _boxes(rng, 1, 6, 0)
    scores = rng.random((1, 1, 6)).astype(np.float32)
    scores[0, 0, [1, 4]] = np.nan
    k = numpy_helper.from_array(np.array([6], np.int64), "k")
    like = numpy_helper.from_array(np.zeros((1, 1, 1), np.float32), "like")
    nodes = [helper.make_node("NonMaxSuppression", ["boxes", "scores", "k"], ["sel"]),
             helper.make_node("CastLike", ["sel", "like"], ["self"])]
    model = _model(nodes, [("boxes", F, [1, 6, 4]), ("scores", F, [1, 1, 6])],
                   [("sel", I64), ("self", F)], [k, like], opset=15)
    compiled = polyc.compile_onnx(model)
    sel, self_ = compiled.run(None, {"boxes": boxes, "scores": scores})
    assert compiled.dynamic_outputs["self"][0] == 0
    assert sel.shape[1] == 3 and self_.shape == sel.shape
    finite = [int(i) for i in sel[:, 2] if not np.isnan(scores[0, 0, i])]
    ranked = sorted(finite, key=lambda i: (-scores[0, 0, i], i))
    assert finite == [i for i in ranked if i in finite]  # the finite ones in score order
    assert set(int(i) for i in sel[:, 2]) <= set(range(6))


@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize("n", [24, 25])
def test_greedy_selection_stops_early(n, target):
    """The greedy loop over the ranks stops once no class can keep another box (every
    list full, or the box at the rank fails the score threshold): on C a ``break`` after
    such a rank, one of the last rank's parity (the state is read from its slots once the
    loop is over: box counts of both parities). The output equals onnxruntime's whether
    the loop stops early (a small per-class limit, a high threshold) or runs to the end."""
    rng = np.random.default_rng(11 + n)
    b, c = 2, 5
    boxes = _boxes(rng, b, n, 0)
    scores = rng.random((b, c, n)).astype(np.float32)
    scores[1, 3] = 0.05  # a class where nothing passes: done at rank 0
    model = _nms_model(b, c, n)
    for k, iou, score in ((3, 0.5, 0.1), (2, 0.0, 0.0), (n, 0.4, 0.6), (n, 1.0, 0.0)):
        feed = {"boxes": boxes, "scores": scores, "iou": np.array([iou], np.float32),
                "score": np.array([score], np.float32)}
        compiled = _check(model, feed, target, values={"k": np.array([k], np.int64)})
        if not target:
            assert re.search(r"if \(v_more\w*\[0\] == 0\)\s*break;", compiled.c_source)


@pytest.mark.parametrize("options", [dict(fusion="min"), dict(tile=False, register_tile=False),
                                     dict(parallel=False)], ids=str)
def test_greedy_selection_under_scheduler_options(options):
    """The early exit and the folded state hold under the other schedules too (fusion
    "max" and the Pluto scheduler run past their time budgets on this kernel, 7 and 12 s,
    and fall back to isl's default with a warning: checked by hand, not here)."""
    rng = np.random.default_rng(13)
    b, c, n = 1, 3, 25
    boxes, scores = _boxes(rng, b, n, 0), rng.random((b, c, n)).astype(np.float32)
    model = _nms_model(b, c, n)
    feed = {"boxes": boxes, "scores": scores, "iou": np.array([0.3], np.float32),
            "score": np.array([0.2], np.float32)}
    _check(model, feed, {"options": polyc.Options(**options)},
           values={"k": np.array([3], np.int64)})


def test_nms_float16_scores_and_float64_refused():
    """float16 boxes and scores (keys from the scores widened to float32, exactly) match
    onnx's reference; float64 scores are refused with the reason (ONNX's op takes float)."""
    rng = np.random.default_rng(12)
    n = 19
    boxes = _boxes(rng, 1, n, 0).astype(np.float16)
    scores = rng.random((1, 2, n)).astype(np.float16)
    scores[0, 1, 4] = scores[0, 1, 9]
    k = numpy_helper.from_array(np.array([4], np.int64), "k")
    iou = numpy_helper.from_array(np.array([0.3], np.float32), "iou")
    node = helper.make_node("NonMaxSuppression", ["boxes", "scores", "k", "iou"], ["sel"])
    model = _model([node], [("boxes", T.FLOAT16, [1, n, 4]), ("scores", T.FLOAT16, [1, 2, n])],
                   [("sel", I64)], [k, iou], opset=11)
    _check(model, {"boxes": boxes, "scores": scores}, {}, use_ort=False)
    model = _model([node], [("boxes", T.DOUBLE, [1, n, 4]), ("scores", T.DOUBLE, [1, 2, n])],
                   [("sel", I64)], [k, iou], opset=11)
    with pytest.raises(UnsupportedOpError, match="scores of dtype float64"):
        polyc.compile_onnx(model)


def test_greedy_steps_keep_whole_vectors_at_two_threads():
    """The class loops inside NonMaxSuppression's greedy recurrence are too small for a
    parallel loop, so at 2 threads they are not cut into per-thread tiles either: 20
    classes run as a vector of 16 and one of 4 at 1 and at 2 threads alike (cut in
    two halves of 10, the steps ran 1.25x slower)."""
    import re
    rng = np.random.default_rng(3)
    b, c, n = 1, 20, 120
    boxes, scores = _boxes(rng, b, n, 0), rng.random((b, c, n)).astype(np.float32)
    model = _model([helper.make_node("NonMaxSuppression", ["boxes", "scores", "k", "iou"],
                                     ["sel"])],
                   [("boxes", F, [b, n, 4]), ("scores", F, [b, c, n]), ("k", I64, [1]),
                    ("iou", F, [1])], [("sel", I64)], opset=11)
    feed = {"boxes": boxes, "scores": scores, "iou": np.array([0.4], np.float32)}
    whole = []
    for threads in (1, 2):
        compiled = _check(model, feed, {"options": polyc.Options(threads=threads)},
                          values={"k": np.array([10], np.int64)})
        src = compiled.c_source
        whole.append((len(re.findall(r"= 0; (c\d+) <= 15; \1 \+= 1\)", src)),
                      len(re.findall(r"= 16; (c\d+) <= 19; \1 \+= 1\)", src))))
    assert whole[0] == whole[1] and whole[0][0] >= 4
