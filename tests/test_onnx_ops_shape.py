"""ONNX shape and data-movement lowerings against onnx's reference evaluator and
onnxruntime, one node at a time (tests/onnx_node_harness.py)."""
from __future__ import annotations

import numpy as np
import pytest
from onnx import TensorProto, helper
from onnx_node_harness import check_node, graph_of, lower_node, make_model, rand, run_lowered

from polyc.frontend.onnx_graph import UnsupportedOpError, View

I64 = np.int64


def ints(*v):
    return np.array(v, dtype=I64)


# -- views -------------------------------------------------------------------------------

VIEWS = {
    "reshape": ("Reshape", dict(x=rand(2, 3, 4)), dict(shape=ints(4, -1)), {}),
    "flatten": ("Flatten", dict(x=rand(2, 3, 4, 5)), {}, dict(axis=2)),
    "squeeze": ("Squeeze", dict(x=rand(1, 3, 1, 5)), dict(axes=ints(0, 2)), {}),
    "unsqueeze": ("Unsqueeze", dict(x=rand(3, 5)), dict(axes=ints(0, -1)), {}),
    "identity": ("Identity", dict(x=rand(3, 5)), {}, {}),
    "dropout": ("Dropout", dict(x=rand(3, 5)), {}, {}),
}


@pytest.mark.parametrize("case", list(VIEWS))
def test_views(case):
    op, inputs, consts, attrs = VIEWS[case]
    check_node(op, inputs, consts=consts, **attrs)
    res = lower_node(graph_of(make_model(op, inputs, ["y"], consts, **attrs), {}))[4]
    assert isinstance(res, View) and (res.output, res.input) == ("y", "x")


def test_dropout_training_is_refused():
    # the mask of inference is supported (test_onnx_ops_nn); training (random) is not
    model = make_model("Dropout", dict(x=rand(3, 5)), ["y", "mask"],
                       dict(r=np.array(0.5, np.float32), t=np.array(True)), opset=13)
    with pytest.raises(UnsupportedOpError, match="n0.*Dropout.*training_mode"):
        lower_node(graph_of(model, {}))


# -- data movement ----------------------------------------------------------------------

def test_transpose():
    check_node("Transpose", dict(x=rand(2, 3, 4, 5)), perm=[0, 2, 3, 1])
    check_node("Transpose", dict(x=rand(3, 1, 4)))
    check_node("Transpose", dict(x=np.arange(6, dtype=I64).reshape(2, 3)), perm=[1, 0])


@pytest.mark.parametrize("axis", [0, 1, -1])
def test_concat(axis):
    shapes = {0: [(2, 3, 4), (1, 3, 4), (3, 3, 4)], 1: [(2, 1, 4), (2, 3, 4), (2, 2, 4)],
              -1: [(2, 3, 4), (2, 3, 1), (2, 3, 5)]}[axis]
    check_node("Concat", {f"a{k}": rand(*s, seed=k) for k, s in enumerate(shapes)}, axis=axis)


def test_concat_int_and_single_input():
    check_node("Concat", dict(a=ints(1, 2), b=ints(3, 4, 5)), axis=0)
    check_node("Concat", dict(a=rand(2, 3)), axis=1)


def test_split():
    x = rand(3, 10)
    check_node("Split", dict(x=x), ["y0", "y1", "y2"], opset=11, axis=1, split=[2, 5, 3])
    check_node("Split", dict(x=x), ["y0", "y1"], consts=dict(split=ints(4, 6)), axis=1)
    check_node("Split", dict(x=x), ["y0", "y1", "y2"], opset=18, axis=-1, num_outputs=3)
    check_node("Split", dict(x=rand(4, 3)), ["y0", "y1"])


SLICES = {
    "basic": ((ints(1, 0), ints(3, 5), ints(0, 2), None)),
    "negative": ((ints(-3, -4), ints(-1, 100), ints(0, -1), None)),
    "steps": ((ints(0, 1), ints(4, 6), ints(0, 2), ints(2, 3))),
    "negative_steps": ((ints(-1, 5), ints(-100, 0), ints(1, 2), ints(-2, -1))),
    "clamped": ((ints(-1000,), ints(2**62,), ints(1,), None)),
    "no_axes": ((ints(1, 1, 2), ints(4, 3, 6), None, None)),
}


@pytest.mark.parametrize("case", list(SLICES))
def test_slice(case):
    starts, ends, axes, steps = SLICES[case]
    consts = dict(starts=starts, ends=ends)
    order = ["x", "starts", "ends"]
    if axes is not None:
        consts["axes"] = axes
    order.append("axes")
    if steps is not None:
        consts["steps"] = steps
    order.append("steps")
    check_node("Slice", dict(x=rand(5, 4, 7)), consts=consts, _inputs=order)


def test_slice_opset9_attributes():
    check_node("Slice", dict(x=rand(5, 4, 7)), opset=9, starts=[1, -3], ends=[4, 100],
               axes=[0, 2])


def test_gather_runtime_indices():
    x = rand(5, 4, 3)
    check_node("Gather", dict(x=x, i=ints(0, -1, 3, -5)), axis=0)
    check_node("Gather", dict(x=x, i=np.array([[1, -2], [3, 0], [2, 2]], np.int32)), axis=1)
    check_node("Gather", dict(x=x, i=np.array(-1, dtype=I64)), axis=2)


def test_gather_constant_indices():
    x = rand(5, 4, 3)
    check_node("Gather", dict(x=x), consts=dict(i=np.array(2, dtype=I64)), axis=1)
    check_node("Gather", dict(x=x), consts=dict(i=ints(4, 2, 0)), axis=0)   # progression
    check_node("Gather", dict(x=x), consts=dict(i=ints(3, -4, 1, 1)), axis=1)
    src = lower_node(graph_of(make_model("Gather", dict(x=x), ["y"], dict(i=ints(4, 2, 0))),
                              {}))[0]
    assert "t_i" not in src  # an affine index, not a read of the indices


def test_gather_elements():
    x = rand(4, 5, 3)
    rng = np.random.default_rng(3)
    for axis in (0, 1, 2, -1):
        d = x.shape[axis]
        i = rng.integers(-d, d, size=(2, 5, 3) if axis == 0 else (4, 3, 3) if axis == 1
                         else (4, 5, 2)).astype(np.int64)
        # onnx's reference evaluator refuses a negative axis here: onnxruntime checks it
        check_node("GatherElements", dict(x=x, i=i), axis=axis, use_reference=axis >= 0)
    check_node("GatherElements", dict(x=x), consts=dict(i=np.zeros((4, 5, 1), np.int32)),
               axis=2)


def test_gather_nd():
    x = rand(3, 3, 4)
    check_node("GatherND", dict(x=x, i=np.array([[0, 2], [-1, 1]], np.int64)))
    check_node("GatherND", dict(x=x, i=np.array([[[1]], [[-3]]], np.int64)))
    check_node("GatherND", dict(x=x, i=np.array([[1], [0], [2]], np.int64)), batch_dims=1)
    check_node("GatherND", dict(x=rand(2, 3, 4)), consts=dict(i=np.array([[1, 2], [0, 0]],
                                                                         np.int64)))


def test_range_of_constants():
    for start, limit, delta, dt in ((1, 10, 3, np.int64), (10, -3, -4, np.int32),
                                   (0.5, 2.0, 0.25, np.float32), (3.0, 1.0, -0.5, np.float64)):
        consts = {k: np.array(v, dt) for k, v in zip(("s", "l", "d"), (start, limit, delta))}
        check_node("Range", {}, consts=consts, opset=11)


def test_gather_clamps_out_of_range_indices():
    x = rand(5, 3)
    i = ints(7, -9, 2)
    model = make_model("Gather", dict(x=x, i=i), ["y"], axis=0)
    want = x[np.clip(np.where(i < 0, i + 5, i), 0, 4)]
    got, src = run_lowered(model, dict(x=x, i=i), dict(y=want))
    np.testing.assert_array_equal(got["y"], want)
    assert "min(max(" in src


PADS = {
    "constant": (dict(pads=ints(0, 1, 2, 0, 2, 1)), dict(mode="constant"),
                 dict(cv=np.array(1.5, np.float32))),
    "constant_default": (dict(pads=ints(1, 0, 0, 0, 2, 3)), {}, {}),
    "reflect": (dict(pads=ints(0, 2, 1, 0, 1, 3)), dict(mode="reflect"), {}),
    "edge": (dict(pads=ints(1, 3, 0, 2, 0, 4)), dict(mode="edge"), {}),
    "negative": (dict(pads=ints(0, -1, 2, 0, 1, -2)), {}, {}),
}


@pytest.mark.parametrize("case", list(PADS))
def test_pad(case):
    consts, attrs, cv = PADS[case]
    # onnx's reference (np.pad) refuses negative pads: onnxruntime is the reference
    check_node("Pad", dict(x=rand(2, 4, 5)), consts={**consts, **cv},
               _inputs=["x", "pads", "cv"], use_reference=case != "negative", **attrs)


def test_pad_wrap_axes_and_runtime_value():
    check_node("Pad", dict(x=rand(2, 4, 5)), consts=dict(pads=ints(3, 1, 2, 6), axes=ints(1, 2)),
               opset=19, mode="wrap", _inputs=["x", "pads", "", "axes"])
    check_node("Pad", dict(x=rand(3, 4), cv=np.array(-2.0, np.float32)),
               consts=dict(pads=ints(1, 1, 1, 1)), _inputs=["x", "pads", "cv"])


def test_pad_opset2_attribute():
    check_node("Pad", dict(x=rand(3, 4)), opset=2, pads=[0, 1, 2, 0], value=3.0)


def test_expand_tile():
    check_node("Expand", dict(x=rand(3, 1)), consts=dict(shape=ints(2, 3, 4)))
    check_node("Tile", dict(x=rand(2, 3)), consts=dict(r=ints(3, 2)))


# -- shapes and constants ------------------------------------------------------------

def test_shape_size_constants():
    x = rand(2, 3, 5)
    check_node("Shape", dict(x=x))
    check_node("Shape", dict(x=x), start=1, opset=15)
    check_node("Size", dict(x=x))
    check_node("ConstantOfShape", {}, consts=dict(s=ints(2, 3)), _inputs=["s"])
    check_node("ConstantOfShape", {}, consts=dict(s=ints(4,)), _inputs=["s"],
               value=helper.make_tensor("v", TensorProto.INT64, [1], [7]))
    check_node("Constant", {}, _inputs=[],
               value=helper.make_tensor("v", TensorProto.FLOAT, [2, 3], [1, 2, 3, 4, 5, 6.5]))
    check_node("Constant", {}, _inputs=[], value_ints=[3, 1, 4])


# -- Resize ---------------------------------------------------------------------------

def _resize(x, attrs, scales=None, sizes=None, opset=18, **kw):
    consts = {}
    order = ["x", "", "scales" if scales is not None else "", "sizes" if sizes is not None
             else ""]
    if scales is not None:
        consts["scales"] = np.array(scales, np.float32)
    if sizes is not None:
        consts["sizes"] = ints(*sizes)
    return check_node("Resize", dict(x=x), consts=consts, opset=opset, _inputs=order,
                      **attrs, **kw)


X = rand(1, 2, 5, 7)
RESIZES = {
    "nearest_x2_asym_floor": (dict(mode="nearest", coordinate_transformation_mode="asymmetric",
                                   nearest_mode="floor"), [1, 1, 2, 2], None),
    "nearest_sizes_halfpixel": (dict(mode="nearest"), None, [1, 2, 8, 10]),
    "nearest_prefer_ceil": (dict(mode="nearest", nearest_mode="round_prefer_ceil"),
                            [1, 1, 1.5, 2.5], None),
    "nearest_ceil_down": (dict(mode="nearest", nearest_mode="ceil"), None, [1, 2, 3, 4]),
    "nearest_align_corners": (dict(mode="nearest", coordinate_transformation_mode=
                                   "align_corners"), None, [1, 2, 9, 3]),
    "nearest_pytorch": (dict(mode="nearest", coordinate_transformation_mode=
                             "pytorch_half_pixel", nearest_mode="floor"), [1, 1, 0.5, 3], None),
    "linear_x2_halfpixel": (dict(mode="linear"), [1, 1, 2, 2], None),
    "linear_sizes_align": (dict(mode="linear", coordinate_transformation_mode="align_corners"),
                           None, [1, 2, 8, 4]),
    "linear_pytorch_down": (dict(mode="linear", coordinate_transformation_mode=
                                 "pytorch_half_pixel"), None, [1, 2, 1, 3]),
    "linear_asymmetric": (dict(mode="linear", coordinate_transformation_mode="asymmetric"),
                          [1, 1, 1.7, 0.6], None),
    "linear_symmetric": (dict(mode="linear", coordinate_transformation_mode=
                              "half_pixel_symmetric"), [1, 1, 1.5, 0.6], None),
}


@pytest.mark.parametrize("case", list(RESIZES))
def test_resize(case):
    attrs, scales, sizes = RESIZES[case]
    _resize(X, attrs, scales, sizes, rtol=1e-5, atol=1e-5)


def test_resize_nearest_is_affine():
    model = make_model("Resize", dict(x=X), ["y"], dict(scales=np.array([1, 1, 2, 3], np.float32)),
                       _inputs=["x", "", "scales"], mode="nearest",
                       coordinate_transformation_mode="asymmetric", nearest_mode="floor")
    src = lower_node(graph_of(model, {}))[0]
    assert "?" not in src and "min(" not in src


@pytest.mark.parametrize("mode,coord,nearest", [
    ("nearest", "half_pixel", "round_prefer_floor"), ("nearest", "asymmetric", "floor"),
    ("nearest", "align_corners", "round_prefer_ceil"), ("nearest", "pytorch_half_pixel", "ceil"),
    ("linear", "half_pixel", "floor"), ("linear", "align_corners", "floor"),
    ("linear", "half_pixel_symmetric", "floor")])
def test_resize_runtime_scales(mode, coord, nearest):
    """Scales given at run time: the coordinates are computed from the scales tensor.
    (Binary fractions with integral output widths: onnxruntime computes in float32 and
    with integer widths, the reference in float64 with scale * width.)"""
    scales = np.array([1, 1, 1.5, 0.625], np.float32)
    check_node("Resize", dict(x=rand(1, 2, 4, 8), scales=scales), _inputs=["x", "", "scales"],
               opset=18,
               mode=mode, coordinate_transformation_mode=coord, nearest_mode=nearest)


def test_resize_runtime_sizes():
    """Sizes given at run time: the (static) output shape gives them."""
    check_node("Resize", dict(x=X, sizes=ints(1, 2, 9, 4)), _inputs=["x", "", "", "sizes"],
               opset=18, mode="linear")
    check_node("Resize", dict(x=X, sizes=ints(1, 2, 9, 4)), _inputs=["x", "", "", "sizes"],
               opset=18, mode="nearest")


def test_upsample():
    check_node("Upsample", dict(x=X), consts=dict(s=np.array([1, 1, 2, 3], np.float32)),
               opset=9, mode="nearest")


def test_resize_unsupported():
    model = make_model("Resize", dict(x=X), ["y"], dict(scales=np.array([1, 2, 2, 2], np.float32)),
                       _inputs=["x", "", "scales"], mode="cubic")
    with pytest.raises(UnsupportedOpError, match="Resize.*cubic resize of 3 axes"):
        lower_node(graph_of(model, {}))
    model = make_model("Resize", dict(x=X), ["y"], dict(scales=np.array([1, 1, 2, 2], np.float32)),
                       _inputs=["x", "", "scales"], mode="linear", antialias=1)
    with pytest.raises(UnsupportedOpError, match="antialias"):
        lower_node(graph_of(model, {}))
    model = make_model("Resize", dict(x=X), ["y"], dict(scales=np.array([1, 1, 2, 2], np.float32)),
                       _inputs=["x", "", "scales"], coordinate_transformation_mode=
                       "tf_crop_and_resize")
    with pytest.raises(UnsupportedOpError, match="coordinate_transformation_mode"):
        lower_node(graph_of(model, {}))


def test_non_constant_parameter_is_unsupported():
    model = make_model("Slice", dict(x=rand(5, 4), starts=ints(1), ends=ints(3)), ["y"])
    with pytest.raises(UnsupportedOpError, match="n0.*Slice.*constant"):
        lower_node(graph_of(model, {}))
