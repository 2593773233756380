"""ONNX import (loading, checks, static shapes, dtypes), graph passes (constant
folding, dead nodes, common subexpressions, BatchNormalization folding, no-ops),
fusion groups and the lowering driver's errors and Program structure."""
from __future__ import annotations

from collections import Counter

import ml_dtypes
import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper
from test_onnx_ops_math import (
    F,
    I64,
    compile_model,
    make_model,
    rand,
    reference,
    run_program,
)

import polyc
from polyc.errors import CompileError
from polyc.frontend import onnx_passes as P
from polyc.frontend.onnx_graph import REGISTRY, UnsupportedOpError, View
from polyc.frontend.onnx_import import graph_to_model, load_graph
from polyc.frontend.onnx_lower import load_lowerings, lower_graph


def _mlp(batch="N"):
    nodes = [helper.make_node("MatMul", ["x", "w"], ["h"]),
             helper.make_node("Add", ["h", "b"], ["a"]),
             helper.make_node("Relu", ["a"], ["y"])]
    g = helper.make_graph(nodes, "mlp", [helper.make_tensor_value_info("x", TensorProto.FLOAT,
                                                                       [batch, 4])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [batch, 3])],
                          [numpy_helper.from_array(rand((4, 3)), "w"),
                           numpy_helper.from_array(rand((3,)), "b")])
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)


def _same_as_reference(original, graph, feeds, rtol=1e-5, atol=1e-5):
    """The optimized graph, exported back to ONNX, computes what the original does."""
    want = reference(original, feeds)
    got = reference(graph_to_model(graph), feeds)
    for g, w in zip(got, want):
        np.testing.assert_allclose(g, w, rtol=rtol, atol=atol)


# -- loading --------------------------------------------------------------------------------

def test_missing_file(tmp_path):
    with pytest.raises(CompileError, match="no such file"):
        load_graph(tmp_path / "nope.onnx")


def test_malformed_file(tmp_path):
    bad = tmp_path / "bad.onnx"
    bad.write_bytes(b"\x08\x07\x12\xff\xffnot a protobuf at all" * 3)
    with pytest.raises(CompileError, match=r"bad\.onnx.*not a valid ONNX model"):
        load_graph(bad)
    empty = tmp_path / "empty.onnx"
    empty.write_bytes(b"")
    with pytest.raises(CompileError, match=r"empty\.onnx.*not a valid ONNX model"):
        load_graph(empty)


def test_truncated_file(tmp_path):
    data = _mlp(2).SerializeToString()
    path = tmp_path / "cut.onnx"
    for cut in (len(data) // 3, len(data) // 2, len(data) - 7, 5):
        path.write_bytes(data[:cut])
        with pytest.raises(CompileError, match=r"cut\.onnx.*not a valid ONNX model"):
            load_graph(path)
    with pytest.raises(CompileError, match="not a valid ONNX model"):
        load_graph(data[: len(data) // 2])  # bytes too


def test_invalid_model_is_a_compile_error():
    node = helper.make_node("Relu", ["x", "extra"], ["y"])  # Relu takes one input
    model = make_model([node], [("x", F, (2,)), ("extra", F, (2,))], [("y", F, (2,))])
    with pytest.raises(CompileError, match="not a valid ONNX model"):
        load_graph(model)


def test_symbolic_batch_needs_a_shape():
    with pytest.raises(CompileError) as e:
        load_graph(_mlp("N"))
    msg = str(e.value)
    assert "'x'" in msg and "N" in msg and "--shape x=1,4" in msg and "shapes=" in msg
    graph = load_graph(_mlp("N"), shapes={"x": [2, 4]})
    assert graph.tensors["x"].shape == (2, 4) and graph.tensors["y"].shape == (2, 3)
    model = _mlp("N")
    x = rand((2, 4))
    (got,) = run_program(lower_graph(P.optimize_graph(load_graph(model, {"x": (2, 4)}))),
                         {"x": x})
    np.testing.assert_allclose(got, reference(model, {"x": x})[0], rtol=1e-5, atol=1e-6)


def test_bad_shapes_argument():
    with pytest.raises(CompileError, match="not a graph input.*x"):
        load_graph(_mlp("N"), shapes={"input": [1, 4]})
    with pytest.raises(CompileError, match="rank 2"):
        load_graph(_mlp("N"), shapes={"x": [1, 4, 1]})
    with pytest.raises(CompileError, match="dimension 1 fixed to 4"):
        load_graph(_mlp("N"), shapes={"x": [1, 5]})


def test_unsupported_dtypes_name_tensor_and_node():
    node = helper.make_node("Relu", ["x"], ["y"])
    model = make_model([node], [], [])
    model.graph.input.append(helper.make_tensor_value_info("x", TensorProto.FLOAT8E8M0, [2]))
    model.graph.output.append(helper.make_tensor_value_info("y", TensorProto.FLOAT8E8M0, [2]))
    with pytest.raises(UnsupportedOpError, match=r"'x'.*graph input.*float8e8m0"):
        load_graph(model)
    nodes = [helper.make_node("Cast", ["x"], ["q"], to=TensorProto.FLOAT8E8M0, name="to_e8m0"),
             helper.make_node("Cast", ["q"], ["y"], to=TensorProto.FLOAT)]
    model = make_model(nodes, [("x", F, (2,))], [("y", F, (2,))])
    with pytest.raises(UnsupportedOpError, match=r"'q'.*to_e8m0.*float8e8m0"):
        load_graph(model)


def test_custom_domain_is_unsupported():
    node = helper.make_node("FusedGemm", ["x"], ["y"], domain="com.microsoft", name="fg")
    g = helper.make_graph([node], "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2])])
    model = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17),
                                                helper.make_opsetid("com.microsoft", 1)],
                              ir_version=8)
    with pytest.raises(UnsupportedOpError, match=r"fg.*com\.microsoft"):
        load_graph(model)


def test_unsupported_ops_are_all_listed_before_lowering():
    nodes = [helper.make_node("Det", ["x"], ["d1"], name="first_det"),
             helper.make_node("Relu", ["x"], ["r"]),
             helper.make_node("Det", ["r"], ["d2"])]
    model = make_model(nodes, [("x", F, (2, 3, 3))], [("d1", F, (2,)), ("d2", F, (2,))])
    graph = load_graph(model)
    with pytest.raises(UnsupportedOpError) as e:
        lower_graph(graph)
    msg = str(e.value)
    assert "'first_det'" in msg and "'Det_2'" in msg and "Det" in msg  # anonymous: Det_2
    assert "supported ops:" in msg and "Relu" in msg and "MatMul" in msg


def test_old_ir_weights_listed_as_inputs_are_constants():
    model = _mlp(2)
    model.ir_version = 3
    model.opset_import[0].version = 9
    for init in model.graph.initializer:
        model.graph.input.append(helper.make_tensor_value_info(init.name, init.data_type,
                                                               list(init.dims)))
    graph = load_graph(model)
    assert graph.inputs == ("x",) and set(graph.constants) == {"w", "b"}


def test_constants_attributes_and_names():
    nodes = [helper.make_node("Constant", [], ["c"], value_floats=[1.0, 2.0, 3.0]),
             helper.make_node("Constant", [], ["k"], value_int=2),
             helper.make_node("Add", ["x", "c"], ["a"]),
             helper.make_node("LeakyRelu", ["a"], ["y"], alpha=0.25, name="lr")]
    model = make_model(nodes, [("x", F, (2, 3))], [("y", F, (2, 3)), ("k", I64, ())])
    graph = load_graph(model)
    assert [n.name for n in graph.nodes] == ["Add_2", "lr"]
    assert graph.constants["c"].dtype == np.float32 and graph.constants["k"] == 2
    assert graph.nodes[1].attrs == {"alpha": 0.25}
    x = rand((2, 3))
    got = run_program(lower_graph(P.optimize_graph(graph)), {"x": x})
    for g, w in zip(got, reference(model, {"x": x})):
        np.testing.assert_allclose(g, w, rtol=1e-6, atol=1e-7)


# -- passes ---------------------------------------------------------------------------------

def _shape_chain_model():
    """Weights as ConstantOfShape fills, a Shape -> Gather -> Concat -> Reshape chain,
    a dead branch and a duplicated subexpression."""
    nodes = [
        helper.make_node("ConstantOfShape", ["wshape"], ["w"],
                         value=numpy_helper.from_array(np.array([0.25], F))),
        helper.make_node("Shape", ["x"], ["s"]),
        helper.make_node("Gather", ["s", "zero"], ["n"], axis=0),
        helper.make_node("Unsqueeze", ["n", "axes0"], ["n1"]),
        helper.make_node("Concat", ["n1", "minus1"], ["newshape"], axis=0),
        helper.make_node("Reshape", ["x", "newshape"], ["flat"]),
        helper.make_node("MatMul", ["flat", "w"], ["m"]),
        helper.make_node("Sigmoid", ["m"], ["s1"]),
        helper.make_node("Sigmoid", ["m"], ["s2"]),
        helper.make_node("Add", ["s1", "s2"], ["y"]),
        helper.make_node("Exp", ["m"], ["dead"]),
        helper.make_node("Neg", ["dead"], ["dead2"]),
    ]
    inits = [("wshape", np.array([12, 5], I64)), ("zero", np.array(0, I64)),
             ("axes0", np.array([0], I64)), ("minus1", np.array([-1], I64))]
    return make_model(nodes, [("x", F, (2, 3, 4))], [("y", F, None)], inits, opset=13)


def test_constant_folding_dce_cse():
    model = _shape_chain_model()
    graph = load_graph(model)  # folds the shape computation to find the Reshape's shape
    assert graph.tensors["y"].shape == (2, 5)
    assert "Shape" not in [n.op_type for n in graph.nodes]
    stats: dict[str, int] = {}
    opt = P.optimize_graph(graph, stats)
    assert stats == P.pass_stats()
    ops = [n.op_type for n in opt.nodes]
    assert ops == ["Reshape", "MatMul", "Sigmoid", "Add"], ops
    assert stats["cse"] == 1 and stats["dead"] >= 2
    assert opt.constants["w"].shape == (12, 5)
    _same_as_reference(model, opt, {"x": rand((2, 3, 4))})


def test_fold_constants_pass():
    nodes = [helper.make_node("ConstantOfShape", ["wshape"], ["w"],
                              value=numpy_helper.from_array(np.array([0.5], F))),
             helper.make_node("Shape", ["x"], ["s"]),
             helper.make_node("Gather", ["s", "one"], ["n"], axis=0),
             helper.make_node("Cast", ["n"], ["nf"], to=TensorProto.FLOAT),
             helper.make_node("Mul", ["x", "nf"], ["xs"]),
             helper.make_node("MatMul", ["xs", "w"], ["y"])]
    model = make_model(nodes, [("x", F, (2, 3))], [("y", F, None)],
                       [("wshape", np.array([3, 4], I64)), ("one", np.array(1, I64))])
    graph = load_graph(model)
    assert len(graph.nodes) == 6  # shapes were static: nothing folded at import
    stats = Counter()
    folded = P.fold_constants(graph, stats)
    assert [n.op_type for n in folded.nodes] == ["Mul", "MatMul"] and stats["folded"] == 4
    assert folded.constants["nf"].dtype == np.float32 and folded.constants["nf"] == 3.0
    _same_as_reference(model, folded, {"x": rand((2, 3))})
    x = rand((2, 3))
    (got,) = run_program(lower_graph(P.optimize_graph(graph)), {"x": x})
    np.testing.assert_allclose(got, reference(model, {"x": x})[0], rtol=1e-5, atol=1e-6)


def test_constant_of_shape_fills_are_folded_even_when_large():
    node = helper.make_node("ConstantOfShape", ["shape"], ["w"],
                            value=numpy_helper.from_array(np.array([0.5], F)))
    add = helper.make_node("Add", ["x", "w"], ["y"])
    model = make_model([node, add], [("x", F, (1, 1))], [("y", F, None)],
                       [("shape", np.array([2100, 2100], I64))])
    opt = P.optimize_graph(load_graph(model))
    assert [n.op_type for n in opt.nodes] == ["Add"] and opt.constants["w"].nbytes > 16e6


def test_huge_expand_of_a_constant_is_not_folded():
    node = helper.make_node("Expand", ["one", "shape"], ["big"])
    add = helper.make_node("Add", ["x", "big"], ["y"])
    model = make_model([node, add], [("x", F, (1, 1))], [("y", F, None)],
                       [("one", np.array([1.0], F)), ("shape", np.array([2100, 2100], I64))])
    opt = P.optimize_graph(load_graph(model))
    assert [n.op_type for n in opt.nodes] == ["Expand", "Add"]


def test_cse_merges_identical_constants_and_nodes():
    nodes = [helper.make_node("Mul", ["x", "c1"], ["a"]),
             helper.make_node("Mul", ["x", "c2"], ["b"]),
             helper.make_node("Sub", ["a", "b"], ["y"])]
    c = rand((3,))
    model = make_model(nodes, [("x", F, (2, 3))], [("y", F, None)], [("c1", c), ("c2", c.copy())])
    opt = P.optimize_graph(load_graph(model))
    assert [n.op_type for n in opt.nodes] == ["Mul", "Sub"] and len(opt.constants) == 1
    assert P.pass_stats()["cse_constants"] == 1 and P.pass_stats()["cse"] == 1


def _bn_inits(c):
    return [("scale", rand((c,))), ("bias", rand((c,))), ("mean", rand((c,))),
            ("var", rand((c,), F, 0.5, 2.0))]


def test_batchnorm_folded_into_conv():
    nodes = [helper.make_node("Conv", ["x", "w", "cb"], ["c"], pads=[1, 1, 1, 1]),
             helper.make_node("BatchNormalization", ["c", "scale", "bias", "mean", "var"],
                              ["y"], epsilon=1e-3)]
    model = make_model(nodes, [("x", F, (1, 2, 5, 5))], [("y", F, None)],
                       [("w", rand((4, 2, 3, 3))), ("cb", rand((4,)))] + _bn_inits(4))
    opt = P.optimize_graph(load_graph(model))
    assert [n.op_type for n in opt.nodes] == ["Conv"] and opt.nodes[0].outputs == ("y",)
    assert P.pass_stats()["batchnorm_folded"] == 1
    _same_as_reference(model, opt, {"x": rand((1, 2, 5, 5))}, rtol=1e-4, atol=1e-5)
    # without a bias, and grouped
    nodes[0] = helper.make_node("Conv", ["x", "w"], ["c"], group=2)
    model = make_model(nodes, [("x", F, (1, 2, 5, 5))], [("y", F, None)],
                       [("w", rand((4, 1, 3, 3)))] + _bn_inits(4))
    opt = P.optimize_graph(load_graph(model))
    assert [n.op_type for n in opt.nodes] == ["Conv"]
    _same_as_reference(model, opt, {"x": rand((1, 2, 5, 5))}, rtol=1e-4, atol=1e-5)


def test_batchnorm_not_folded_when_conv_output_is_shared():
    nodes = [helper.make_node("Conv", ["x", "w"], ["c"]),
             helper.make_node("BatchNormalization", ["c", "scale", "bias", "mean", "var"], ["b"]),
             helper.make_node("Add", ["b", "c"], ["y"])]
    model = make_model(nodes, [("x", F, (1, 2, 4, 4))], [("y", F, None)],
                       [("w", rand((3, 2, 1, 1)))] + _bn_inits(3))
    opt = P.optimize_graph(load_graph(model))
    assert "BatchNormalization" in [n.op_type for n in opt.nodes]


@pytest.mark.parametrize("trans_b,c_shape", [(0, (3,)), (1, (1, 3)), (1, None), (0, (2, 3))])
def test_batchnorm_folded_into_gemm(trans_b, c_shape):
    ins = ["x", "w"] + (["c"] if c_shape else [])
    nodes = [helper.make_node("Gemm", ins, ["g"], transB=trans_b, alpha=0.7, beta=1.3),
             helper.make_node("BatchNormalization", ["g", "scale", "bias", "mean", "var"], ["y"])]
    inits = [("w", rand((3, 4) if trans_b else (4, 3)))] + _bn_inits(3)
    if c_shape:
        inits.append(("c", rand(c_shape)))
    model = make_model(nodes, [("x", F, (2, 4))], [("y", F, None)], inits)
    opt = P.optimize_graph(load_graph(model))
    assert [n.op_type for n in opt.nodes] == ["Gemm"]
    x = rand((2, 4))
    _same_as_reference(model, opt, {"x": x}, rtol=1e-4, atol=1e-5)
    (got,) = run_program(lower_graph(opt), {"x": x})
    np.testing.assert_allclose(got, reference(model, {"x": x})[0], rtol=1e-4, atol=1e-5)


def test_noops_removed():
    nodes = [helper.make_node("Identity", ["x"], ["i"]),
             helper.make_node("Relu", ["i"], ["r"]),
             helper.make_node("Dropout", ["r"], ["d", "mask"], ratio=0.3),  # opset 11
             helper.make_node("Cast", ["d"], ["c"], to=TensorProto.FLOAT),
             helper.make_node("Sigmoid", ["c"], ["s"]),
             helper.make_node("Identity", ["s"], ["y"])]
    model = make_model(nodes, [("x", F, (2, 3))], [("y", F, None)], opset=11)
    opt = P.optimize_graph(load_graph(model))
    assert [n.op_type for n in opt.nodes] == ["Relu", "Sigmoid"]
    assert opt.nodes[1].outputs == ("y",) and opt.outputs == ("y",)
    _same_as_reference(model, opt, {"x": rand((2, 3))})
    x = rand((2, 3))
    (got,) = run_program(lower_graph(opt), {"x": x})
    np.testing.assert_allclose(got, reference(model, {"x": x})[0], rtol=1e-6, atol=1e-7)


def test_dropout_with_used_mask_is_kept():
    nodes = [helper.make_node("Dropout", ["x"], ["d", "mask"])]
    model = make_model(nodes, [("x", F, (2, 3))], [("d", F, None), ("mask", np.bool_, None)],
                       opset=13)
    opt = P.optimize_graph(load_graph(model))
    assert [n.op_type for n in opt.nodes] == ["Dropout"]


# -- fusion groups --------------------------------------------------------------------------

def test_fusion_groups():
    nodes = [helper.make_node("MatMul", ["x", "w"], ["m"], name="mm"),
             helper.make_node("Add", ["m", "b"], ["a"], name="add"),
             helper.make_node("Relu", ["a"], ["r"], name="relu"),
             helper.make_node("Flatten", ["r"], ["f"], name="flat"),
             helper.make_node("Softmax", ["f"], ["s"], name="sm"),
             helper.make_node("Tanh", ["s"], ["t"], name="tanh"),
             helper.make_node("Exp", ["t"], ["e"], name="exp"),   # t read twice: stops
             helper.make_node("Mul", ["t", "e"], ["y"], name="mul")]
    model = make_model(nodes, [("x", F, (2, 3, 4))], [("y", F, None)],
                       [("w", rand((4, 5))), ("b", rand((5,)))])
    groups = P.fusion_groups(load_graph(model))
    assert [[n.name for n in g] for g in groups] == [
        ["mm", "add", "relu"], ["flat"], ["sm"], ["tanh"], ["exp", "mul"]]


def test_fusion_groups_size_limit_and_graph_outputs():
    ops = ["Relu", "Neg", "Exp", "Sigmoid", "Tanh", "Abs", "Floor", "Ceil"]
    nodes, prev = [], "x"
    for k, op in enumerate(ops):
        nodes.append(helper.make_node(op, [prev], [f"v{k}"], name=f"n{k}"))
        prev = f"v{k}"
    model = make_model(nodes, [("x", F, (3,))], [(prev, F, None), ("v2", F, None)])
    groups = P.fusion_groups(load_graph(model))
    assert [len(g) for g in groups] == [3, 5]  # v2 is a graph output: the chain stops there
    groups = P.fusion_groups(load_graph(model), max_size=2)
    assert [len(g) for g in groups] == [2, 1, 2, 2, 1]


def test_fusion_groups_respect_topological_order():
    """An elementwise node joins its producer's group only if its other inputs are
    computed no later; a producer alone in its group whose only reader it is moves into
    the reader's group instead (``a``, computed where ``add`` reads it)."""
    nodes = [helper.make_node("Relu", ["x"], ["a"], name="a"),
             helper.make_node("Softmax", ["x"], ["s"], name="s"),
             helper.make_node("Add", ["a", "s"], ["y"], name="add")]
    model = make_model(nodes, [("x", F, (2, 3))], [("y", F, None)])
    graph = load_graph(model)
    groups = P.fusion_groups(graph)
    assert [[n.name for n in g] for g in groups] == [["s"], ["a", "add"]]
    x = rand((2, 3))
    (got,) = run_program(lower_graph(graph), {"x": x})
    np.testing.assert_allclose(got, reference(model, {"x": x})[0], rtol=1e-5, atol=1e-6)


def test_fusion_groups_join_the_largest_group_pulling_lone_producers():
    """GELU as BERT exports it: ``(x * 0.5) * (erf(x / sqrt2) + 1)``. The last Mul joins
    the erf's group (the largest it may join) and the lone ``x * 0.5``, computed after
    that group started, comes along: one kernel, not two. A lone producer that reads a
    tensor computed after the group does not move, so the node stays out."""
    def gelu(extra):
        nodes = [helper.make_node("MatMul", ["x", "w"], ["h"], name="mm"),
                 helper.make_node("Div", ["h", "sqrt2"], ["d"], name="div"),
                 helper.make_node("Erf", ["d"], ["e"], name="erf"),
                 helper.make_node("Mul", ["h", extra], ["half"], name="half"),
                 helper.make_node("Add", ["e", "one"], ["e1"], name="plus"),
                 helper.make_node("Mul", ["half", "e1"], ["y"], name="out")]
        return make_model(nodes, [("x", F, (4, 6))], [("y", F, None)],
                          [("w", rand((6, 5))), ("sqrt2", np.array(1.4142135, np.float32)),
                           ("one", np.array(1.0, np.float32)),
                           ("c", np.array(0.5, np.float32))])
    model = gelu("c")
    graph = load_graph(model)
    assert [[n.name for n in g] for g in P.fusion_groups(graph)] == [
        ["mm"], ["div", "erf", "plus", "half", "out"]]
    x = rand((4, 6))
    (got,) = run_program(lower_graph(graph), {"x": x})
    np.testing.assert_allclose(got, reference(model, {"x": x})[0], rtol=1e-5, atol=1e-6)
    # "half" reads a Softmax computed after the erf's group started: it cannot move there
    nodes = list(gelu("c").graph.node)
    nodes.insert(3, helper.make_node("Softmax", ["h"], ["sm"], name="sm"))
    nodes[4] = helper.make_node("Mul", ["h", "sm"], ["half"], name="half")
    model = make_model(nodes, [("x", F, (4, 6))], [("y", F, None)],
                       list((i.name, numpy_helper.to_array(i))
                            for i in gelu("c").graph.initializer))
    graph = load_graph(model)
    groups = [[n.name for n in g] for g in P.fusion_groups(graph)]
    assert ["div", "erf", "plus"] in groups and ["half", "out"] in groups, groups
    (got,) = run_program(lower_graph(graph), {"x": x})
    np.testing.assert_allclose(got, reference(model, {"x": x})[0], rtol=1e-5, atol=1e-6)


def _ensure_flatten(monkeypatch):
    load_lowerings()
    if "Flatten" not in REGISTRY:  # the shape lowerings may not be there yet
        monkeypatch.setitem(REGISTRY, "Flatten", lambda n, ctx: View(n.outputs[0], n.inputs[0]))


# -- the Program -----------------------------------------------------------------------------

def test_program_structure_views_and_output_copies(monkeypatch):
    _ensure_flatten(monkeypatch)
    nodes = [helper.make_node("Relu", ["x"], ["r"]),
             helper.make_node("Flatten", ["r"], ["f"]),
             helper.make_node("Sigmoid", ["f"], ["y"]),
             helper.make_node("Flatten", ["x"], ["fx"])]
    model = make_model(nodes, [("x", F, (2, 3, 2))], [("y", F, None), ("f", F, None),
                                                       ("fx", F, None), ("c", F, None)],
                       [("c", rand((2, 2)))])
    seen = []
    program = lower_graph(load_graph(model), progress=lambda i, n, names: seen.append((i, n)))
    assert program.name == "test" and program.inputs == ("x",)
    assert program.outputs == ("y", "f", "fx", "c")
    kinds = {b.name: b.kind for b in program.buffers}
    assert kinds == {"x": "input", "y": "output", "f": "output", "fx": "output",
                     "c": "output", "r": "temp", "c_value": "weight"}
    assert program.aliases == ()  # both views are graph outputs: copied
    assert set(dict(program.weights)) == {"c_value"}
    assert seen and seen[0] == (0, len(seen))
    x = rand((2, 3, 2))
    got = run_program(program, {"x": x})
    for g, w in zip(got, reference(model, {"x": x})):
        np.testing.assert_allclose(g, w, rtol=1e-6, atol=1e-7)


def test_program_alias_of_an_intermediate(monkeypatch):
    _ensure_flatten(monkeypatch)
    nodes = [helper.make_node("Relu", ["x"], ["r"]),
             helper.make_node("Flatten", ["r"], ["f"]),
             helper.make_node("MatMul", ["f", "w"], ["y"])]
    model = make_model(nodes, [("x", F, (2, 3, 2))], [("y", F, None)], [("w", rand((6, 4)))])
    program = lower_graph(load_graph(model))
    assert program.aliases == (("f", "r"),) and program.root("f") == "r"
    assert program.buffer("f").kind == "temp" and program.buffer("w").kind == "weight"
    x = rand((2, 3, 2))
    (got,) = run_program(program, {"x": x})
    np.testing.assert_allclose(got, reference(model, {"x": x})[0], rtol=1e-5, atol=1e-6)


def test_graph_output_equal_to_input_is_refused():
    model = make_model([helper.make_node("Relu", ["x"], ["y"])], [("x", F, (2,))],
                       [("y", F, None), ("x", F, (2,))])
    with pytest.raises(CompileError, match="'x' is also a graph input"):
        compile_model(model)


def test_lowering_bug_is_an_internal_error(monkeypatch):
    from polyc.errors import InternalError
    from polyc.frontend.onnx_graph import Lowered
    monkeypatch.setitem(REGISTRY, "Relu", lambda n, ctx: Lowered(
        [f"{ctx.name(n.outputs[0])}(i) = {ctx.name(n.inputs[0])}(i, j)"]))
    model = make_model([helper.make_node("Relu", ["x"], ["y"], name="broken")],
                       [("x", F, (2, 3))], [("y", F, None)])
    with pytest.raises(InternalError, match=r"(?s)'broken' \(Relu\).*def k0_broken"):
        compile_model(model)


def test_fusion_groups_pull_only_single_reader_same_shape_producers():
    """A producer read twice, a graph output or a broadcast one stays in its group."""
    nodes = [helper.make_node("Relu", ["x"], ["a"], name="a"),        # read twice
             helper.make_node("Neg", ["x"], ["b"], name="b"),         # a graph output
             helper.make_node("Exp", ["v"], ["c"], name="c"),         # broadcast (3,)
             helper.make_node("Softmax", ["x"], ["s"], name="s"),
             helper.make_node("Add", ["s", "a"], ["t"], name="t"),
             helper.make_node("Add", ["t", "b"], ["u"], name="u"),
             helper.make_node("Mul", ["u", "c"], ["w"], name="w"),
             helper.make_node("Sub", ["w", "a"], ["y"], name="y")]
    model = make_model(nodes, [("x", F, (2, 3)), ("v", F, (3,))], [("y", F, None), ("b", F, None)])
    graph = load_graph(model)
    groups = [[n.name for n in g] for g in P.fusion_groups(graph)]
    assert ["a"] in groups and ["b"] in groups and ["c"] in groups, groups
    feeds = {"x": rand((2, 3)), "v": rand((3,))}
    got = run_program(lower_graph(graph), feeds)
    for g, w in zip(got, reference(model, feeds)):
        np.testing.assert_allclose(g, w, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("opset", [13, 21])
def test_dequantized_weights_are_folded(opset):
    """A DequantizeLinear of constant weights (per output channel) folds at compile time
    at every opset, onnx's reference evaluator having none before opset 19; the folded
    values are those the lowering computes (float32 operands, then the product)."""
    rng = np.random.default_rng(5)
    w = rng.integers(-128, 128, (6, 4)).astype(np.int8)
    scale = rng.uniform(0.01, 0.1, 6).astype(np.float32)
    zero = rng.integers(-5, 5, 6).astype(np.int8)
    nodes = [helper.make_node("DequantizeLinear", ["w", "s", "z"], ["wf"], axis=0),
             helper.make_node("MatMul", ["x", "wf"], ["y"])]
    model = make_model(nodes, [("x", F, (3, 6))], [("y", F, None)],
                       [("w", w), ("s", scale), ("z", zero)], opset=opset)
    graph = P.optimize_graph(load_graph(model))
    assert not any(n.op_type == "DequantizeLinear" for n in graph.nodes)
    folded = next(v for k, v in graph.constants.items() if v.shape == (6, 4))
    want = (w.astype(np.float32) - zero.astype(np.float32)[:, None]) * scale[:, None]
    np.testing.assert_array_equal(folded, want)
    x = rand((3, 6))
    (got,) = run_program(lower_graph(graph), {"x": x})
    np.testing.assert_allclose(got, x @ want, rtol=1e-5, atol=1e-6)


def _half_residual_block(dtype, extra_sum_input=False):
    """conv -> relu -> conv, + the block's input (Sum), relu, then a second block on
    its result: the residual tensor is read by a convolution and by an addition."""
    rng = np.random.default_rng(11)
    t = TensorProto.FLOAT16 if dtype == "float16" else TensorProto.BFLOAT16

    def weights(shape, name):
        w = (rng.standard_normal(shape) * 0.3).astype(np.float32)
        if dtype == "float16":
            return numpy_helper.from_array(w.astype(np.float16), name)
        return helper.make_tensor(name, t, shape, w.flatten().tolist())
    nodes, inits, x = [], [], "x"
    for b in range(2):
        inits += [weights((6, 6, 3, 3), f"w{b}a"), weights((6, 6, 1, 1), f"w{b}b")]
        nodes += [helper.make_node("Conv", [x, f"w{b}a"], [f"c{b}"], pads=[1, 1, 1, 1]),
                  helper.make_node("Relu", [f"c{b}"], [f"r{b}"]),
                  helper.make_node("Conv", [f"r{b}", f"w{b}b"], [f"d{b}"]),
                  helper.make_node("Mul", [f"d{b}", "half"], [f"m{b}"]),
                  helper.make_node("Sum", [f"m{b}", x] + ([x] if extra_sum_input else []),
                                   [f"s{b}"]),
                  helper.make_node("Relu", [f"s{b}"], [f"y{b}"])]
        x = f"y{b}"
    inits.append(helper.make_tensor("half", t, (), [0.5]))
    g = helper.make_graph(nodes, "res", [helper.make_tensor_value_info("x", t, (1, 6, 7, 9))],
                          [helper.make_tensor_value_info("y1", t, None),
                           helper.make_tensor_value_info("s0", t, None)], inits)
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_half_values_between_ops_are_stored_in_float(monkeypatch, dtype):
    """A float16 (bfloat16) residual sum read by a convolution and by the next sum is
    held in a float32 tensor (rounded by PolycRoundHalf), not converted to its bits and
    back at each write and read: the outputs are the same, bit for bit, as with the
    half tensors, and close to onnxruntime's (numpy's for bfloat16)."""
    model = _half_residual_block(dtype)
    x = np.random.default_rng(3).standard_normal((1, 6, 7, 9)).astype(np.float32)
    feeds = {"x": x.astype(np.float16 if dtype == "float16" else ml_dtypes.bfloat16)}
    graph = P.optimize_graph(load_graph(model))
    assert P.pass_stats()["half_values_in_float"] > 0
    halves = [t for t, info in graph.tensors.items() if info.dtype == dtype and any(
        t in n.inputs or t in n.outputs for n in graph.nodes)]
    # only the input, the two outputs and s0's copy for the graph output stay half
    assert set(halves) <= {"x", "y1", "s0"}, halves
    assert sum(n.op_type == "PolycRoundHalf" for n in graph.nodes) >= 4
    got = polyc.compile_onnx(model).run(None, feeds)
    monkeypatch.setattr(P, "half_values_in_float", lambda g, stats=None: g)
    plain = P.optimize_graph(load_graph(model))
    assert sum(info.dtype == dtype for info in plain.tensors.values()) > len(halves)
    want = polyc.compile_onnx(model).run(None, feeds)
    for a, b in zip(got, want):
        np.testing.assert_array_equal(a, b)
    if dtype == "float16":
        ref = reference(model, feeds)
        for a, b in zip(got, ref):
            np.testing.assert_allclose(a.astype(np.float32), b.astype(np.float32),
                                       rtol=2e-2, atol=2e-2)


def test_half_values_in_float_on_the_cuda_target():
    """The float16 residual blocks (their PolycRoundHalf nodes) on the CUDA target, run
    by the CPU emulation, agree with the C target's result."""
    model = _half_residual_block("float16")
    x = np.random.default_rng(4).standard_normal((1, 6, 7, 9)).astype(np.float16)
    want = polyc.compile_onnx(model).run(None, {"x": x})
    got = polyc.compile_onnx(model, target="cuda", emulate=True).run(None, {"x": x})
    for a, b in zip(got, want):
        np.testing.assert_allclose(a.astype(np.float32), b.astype(np.float32),
                                   rtol=1e-2, atol=1e-2)


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_half_values_in_float_through_views_pools_and_other_ops(monkeypatch, dtype):
    """Transpose, Concat, MaxPool, Clip, Reshape, Neg, Abs and Max run on the float32
    values; Mul, Sub and Div round once after; a Softmax (not one of them) reads its
    input narrowed back, and its result is widened for the Max after it; both graph
    outputs are narrowed at the end. Bit for bit the outputs of the half tensors."""
    t = TensorProto.FLOAT16 if dtype == "float16" else TensorProto.BFLOAT16
    npd = np.float16 if dtype == "float16" else ml_dtypes.bfloat16

    def const(name, v):
        return helper.make_tensor(name, t, (), [v])
    nodes = [helper.make_node("Transpose", ["x"], ["xt"], perm=[0, 1, 3, 2]),
             helper.make_node("Mul", ["xt", "k"], ["m"]),
             helper.make_node("Sub", ["m", "x2"], ["d"]),
             helper.make_node("Concat", ["d", "m"], ["cc"], axis=1),
             helper.make_node("MaxPool", ["cc"], ["p"], kernel_shape=[2, 2]),
             helper.make_node("Clip", ["p", "lo", "hi"], ["cl"]),
             helper.make_node("Div", ["cl", "k"], ["dv"]),
             helper.make_node("Reshape", ["dv", "shape"], ["r"]),
             helper.make_node("Softmax", ["r"], ["sm"], axis=-1),
             helper.make_node("Neg", ["r"], ["ng"]),
             helper.make_node("Abs", ["ng"], ["ab"]),
             helper.make_node("Max", ["ab", "sm"], ["y"])]
    inits = [const("k", 0.37), const("lo", -0.5), const("hi", 1.25),
             numpy_helper.from_array(np.array([1, 4, -1], np.int64), "shape")]
    g = helper.make_graph(nodes, "views", [helper.make_tensor_value_info("x", t, (1, 2, 5, 6)),
                                           helper.make_tensor_value_info("x2", t, (1, 2, 6, 5))],
                          [helper.make_tensor_value_info("y", t, None),
                           helper.make_tensor_value_info("r", t, None)], inits)
    model = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)
    rng = np.random.default_rng(1)
    feeds = {"x": rng.standard_normal((1, 2, 5, 6)).astype(np.float32).astype(npd),
             "x2": rng.standard_normal((1, 2, 6, 5)).astype(np.float32).astype(npd)}
    graph = P.optimize_graph(load_graph(model))
    assert P.pass_stats()["half_values_in_float"] == 11
    assert sum(n.op_type == "PolycRoundHalf" for n in graph.nodes) == 3
    got = polyc.compile_onnx(model).run(None, feeds)
    monkeypatch.setattr(P, "half_values_in_float", lambda g, stats=None: g)
    want = polyc.compile_onnx(model).run(None, feeds)
    for a, b in zip(got, want):
        assert a.dtype == npd
        np.testing.assert_array_equal(a.view(np.uint16), b.view(np.uint16))


def test_half_sum_of_three_is_not_rounded_once():
    """A float16 Sum of three rounds after each addition: it is not computed in float32
    and rounded once (that could differ); its inputs are narrowed back for it."""
    graph = P.optimize_graph(load_graph(_half_residual_block("float16", True)))
    sums = [n for n in graph.nodes if n.op_type == "Sum"]
    assert sums and all(graph.tensors[n.outputs[0]].dtype == "float16" for n in sums)


def test_float16_pool_between_convolutions_runs_in_float(monkeypatch):
    """A float16 MaxPool whose result only the next Conv reads (widened, as float16
    convolutions run in float32) pools the widened values: no MaxPool on float16 is
    left, and the result is, bit for bit, the one of pooling the float16 values."""
    rng = np.random.default_rng(8)
    w1 = (rng.standard_normal((8, 3, 3, 3)) * 0.3).astype(np.float16)
    w2 = (rng.standard_normal((4, 8, 1, 1)) * 0.3).astype(np.float16)
    nodes = [helper.make_node("Conv", ["x", "w1"], ["c1"], pads=[1, 1, 1, 1]),
             helper.make_node("Relu", ["c1"], ["r1"]),
             helper.make_node("MaxPool", ["r1"], ["p"], kernel_shape=[3, 3], strides=[2, 2],
                              pads=[1, 1, 1, 1]),
             helper.make_node("Conv", ["p", "w2"], ["y"])]
    f16 = TensorProto.FLOAT16
    graph_proto = helper.make_graph(
        nodes, "pool", [helper.make_tensor_value_info("x", f16, (1, 3, 11, 9))],
        [helper.make_tensor_value_info("y", f16, None)],
        [numpy_helper.from_array(w1, "w1"), numpy_helper.from_array(w2, "w2")])
    model = helper.make_model(graph_proto, opset_imports=[helper.make_opsetid("", 17)],
                              ir_version=8)
    x = rng.standard_normal((1, 3, 11, 9)).astype(np.float16)
    graph = P.optimize_graph(load_graph(model))
    pools = [n for n in graph.nodes if n.op_type == "MaxPool"]
    assert pools and all(graph.tensors[n.inputs[0]].dtype == "float32" for n in pools)
    (got,) = polyc.compile_onnx(model).run(None, {"x": x})
    monkeypatch.setattr(P, "half_values_in_float", lambda g, stats=None: g)
    plain = P.optimize_graph(load_graph(model))
    assert any(plain.tensors[n.inputs[0]].dtype == "float16"
               for n in plain.nodes if n.op_type == "MaxPool")
    (want,) = polyc.compile_onnx(model).run(None, {"x": x})
    np.testing.assert_array_equal(got, want)
    np.testing.assert_allclose(got.astype(np.float32), reference(model, {"x": x})[0]
                               .astype(np.float32), rtol=2e-2, atol=2e-2)
