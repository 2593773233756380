"""Control flow with static structure, flattened into the graph before import.

* ``Scan`` (opset 9 on): the body is copied once per step of the (static) scan length,
  each copy reading its step's slices (``Gather`` at a constant index along the scan
  axis, from the end for a reversed input) and the previous copy's states; the scan
  outputs are the steps' elements stacked along their axis (``Unsqueeze`` + ``Concat``,
  in reverse for a reversed output). The copies then compile as ordinary operators,
  fused and scheduled across steps.
* ``If``: both branches are inlined and their outputs chosen with ``Where(cond, ...)``
  (ONNX operators have no side effects, so computing the branch not taken is only work);
  with a constant condition only the branch taken is.

* ``Loop`` with a static trip count: unrolled, each copy of the body under the
  loop's running condition (see :func:`_unroll_loop`).

Branches or bodies that produce sequences or optionals are left alone (polyc then names
the op as unsupported), and so is a Loop without a static trip count.
"""
from __future__ import annotations

from collections.abc import Callable

import numpy as np
import onnx
from onnx import helper, numpy_helper


#: the most iterations a Loop is unrolled to (each is a copy of its body)
MAX_LOOP_TRIPS = 1024
#: why a Scan, Loop or If was left in the graph
NOT_FLATTENED = ("its body could not be flattened into the graph (sequences or optionals, "
                 "a scan length or trip count that is not static or over "
                 f"{MAX_LOOP_TRIPS}, a loop that runs no step, or opset 8's batched Scan)")


def flatten_control_flow(proto: onnx.ModelProto, shapes: dict[str, list[int]]) -> bool:
    """Replace the Scan, Loop and If nodes of ``proto``'s graph in place (``shapes``: the
    static dims of the graph's tensors); True if anything changed."""
    g = proto.graph
    opset = max((o.version for o in proto.opset_import if o.domain in ("", "ai.onnx")),
                default=1)
    consts = {t.name: numpy_helper.to_array(t) for t in g.initializer}
    made_by = {o: n for n in g.node for o in n.output if o}
    inits: list[onnx.TensorProto] = []

    def expand(n: onnx.NodeProto, _index: int) -> list[onnx.NodeProto] | None:
        nonlocal consts
        if n.domain not in ("", "ai.onnx"):
            return None
        if n.op_type == "Scan" and opset >= 9:
            return _unroll_scan(n, shapes, opset, inits)
        if n.op_type == "Loop":
            return _unroll_loop(n, made_by, consts, shapes, opset, inits)
        if n.op_type == "If":
            cond = _static_value(n.input[0], made_by, consts, shapes, opset)
            if cond is not None:
                consts = {**consts, n.input[0]: cond}
            return _inline_if(n, consts, inits)
        return None
    changed = replace_nodes(g, expand)
    if changed:
        g.initializer.extend(inits)
    return changed


def replace_nodes(g: onnx.GraphProto,
                  expand: Callable[[onnx.NodeProto, int], list[onnx.NodeProto] | None]) -> bool:
    """Each node of ``g`` replaced by ``expand(node, index)`` where that is not None (in
    place, in order); True if any was."""
    out: list[onnx.NodeProto] = []
    changed = False
    for k, n in enumerate(g.node):
        made = expand(n, k)
        if made is None:
            out.append(n)
        else:
            out.extend(made)
            changed = True
    if changed:
        del g.node[:]
        g.node.extend(out)
    return changed


def _static_value(name: str, made_by: dict[str, onnx.NodeProto],
                  consts: dict[str, np.ndarray], shapes: dict[str, list[int]],
                  opset: int) -> np.ndarray | None:
    """The value of ``name`` when it depends only on constants and on the (static) shapes
    of tensors (an If whose condition tests a rank or an extent), else None."""
    if name in consts:
        return np.asarray(consts[name])
    nodes: list[onnx.NodeProto] = []
    seen: set[str] = set()

    def visit(t: str) -> bool:
        if not t or t in consts or t in seen:
            return True
        n = made_by.get(t)
        if n is None or n.op_type in ("If", "Loop", "Scan"):
            return False
        if n.op_type in ("Shape", "Size") and n.input[0] in shapes:
            pass  # depends on a shape only
        elif not all(visit(x) for x in n.input):
            return False
        seen.update(o for o in n.output if o)
        nodes.append(n)
        return True
    if not visit(name):
        return None
    from onnx.reference import ReferenceEvaluator
    feeds = {}
    for n in nodes:  # a shape's tensor stands in as zeros of its shape
        if n.op_type in ("Shape", "Size") and n.input[0] not in seen:
            feeds[n.input[0]] = np.zeros(shapes[n.input[0]], np.float32)
    inputs = [helper.make_tensor_value_info(k, onnx.TensorProto.FLOAT, None) for k in feeds]
    inits = [numpy_helper.from_array(np.asarray(v), k) for k, v in consts.items()
             if any(k in n.input for n in nodes)]
    graph = helper.make_graph(nodes, "cond", inputs,
                              [helper.make_tensor_value_info(name, onnx.TensorProto.BOOL, None)],
                              inits)
    try:
        model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
        return np.asarray(ReferenceEvaluator(model).run(None, feeds)[0])
    except Exception:  # noqa: BLE001 -- not evaluable here: both branches are kept
        return None


def _tensor_only(graph: onnx.GraphProto) -> bool:
    """No sequence, map or optional among the graph's inputs and outputs (a value
    declared without a type counts as a tensor: shape inference says what it is)."""
    return all(not v.HasField("type") or v.type.HasField("tensor_type")
               for v in list(graph.input) + list(graph.output))


def renamed_node(n: onnx.NodeProto, index: int, prefix: str, inputs: list[str],
                 outputs: list[str]) -> onnx.NodeProto:
    """A copy of ``n`` named under ``prefix``, reading ``inputs`` and writing
    ``outputs``."""
    c = onnx.NodeProto()
    c.CopyFrom(n)
    c.name = f"{prefix}{n.name or n.op_type + '_' + str(index)}"
    del c.input[:]
    c.input.extend(inputs)
    del c.output[:]
    c.output.extend(outputs)
    return c


def _copy_body(body: onnx.GraphProto, prefix: str, names: dict[str, str],
               inits: list[onnx.TensorProto], seen_inits: set[str]) -> list[onnx.NodeProto]:
    """The body's nodes renamed under ``prefix`` (``names`` maps body names to outer
    ones and grows with each copied output); its initializers become the graph's."""
    for t in body.initializer:
        name = f"{prefix}{t.name}"
        names[t.name] = name
        if name not in seen_inits:
            seen_inits.add(name)
            c = onnx.TensorProto()
            c.CopyFrom(t)
            c.name = name
            inits.append(c)
    nodes = []
    for k, n in enumerate(body.node):
        inputs = [names.get(x, x) if x else x for x in n.input]
        names.update({o: f"{prefix}{o}" for o in n.output if o})
        nodes.append(renamed_node(n, k, prefix, inputs,
                                  [names.get(o, o) if o else o for o in n.output]))
    return nodes


def _const(name: str, value, inits: list[onnx.TensorProto]) -> str:
    inits.append(numpy_helper.from_array(np.asarray(value), name))
    return name


def _unroll_scan(n: onnx.NodeProto, shapes: dict[str, list[int]], opset: int,
                 inits: list[onnx.TensorProto]) -> list[onnx.NodeProto] | None:
    attrs = {a.name: helper.get_attribute_value(a) for a in n.attribute}
    body = attrs["body"]
    m = int(attrs["num_scan_inputs"])
    if not _tensor_only(body):
        return None
    n_state = len(n.input) - m
    scan_in = list(n.input[n_state:])
    in_axes = list(attrs.get("scan_input_axes", [0] * m))
    in_dirs = list(attrs.get("scan_input_directions", [0] * m))
    k_out = len(body.output) - n_state
    out_axes = list(attrs.get("scan_output_axes", [0] * k_out))
    out_dirs = list(attrs.get("scan_output_directions", [0] * k_out))
    if not scan_in or any(x not in shapes for x in scan_in):
        return None
    ranks = [len(shapes[x]) for x in scan_in]
    in_axes = [a + r if a < 0 else a for a, r in zip(in_axes, ranks)]
    steps = shapes[scan_in[0]][in_axes[0]]
    if any(shapes[x][a] != steps for x, a in zip(scan_in, in_axes)):
        return None
    base = n.name or f"scan_{n.output[0]}"
    nodes: list[onnx.NodeProto] = []
    state = list(n.input[:n_state])
    collected: list[list[str]] = [[] for _ in range(k_out)]
    seen: set[str] = set()
    for t in range(steps):
        prefix = f"{base}/step{t}/"
        names: dict[str, str] = {}
        for i, v in enumerate(body.input[:n_state]):
            names[v.name] = state[i]
        for j, v in enumerate(body.input[n_state:]):
            at = steps - 1 - t if in_dirs[j] else t
            idx = _const(f"{prefix}index{j}", np.array(at, np.int64), inits)
            elem = f"{prefix}{v.name}__slice"
            nodes.append(helper.make_node("Gather", [scan_in[j], idx], [elem],
                                          name=f"{prefix}slice{j}", axis=in_axes[j]))
            names[v.name] = elem
        nodes += _copy_body(body, prefix, names, inits, seen)
        state = [names[o.name] for o in body.output[:n_state]]
        for k, o in enumerate(body.output[n_state:]):
            collected[k].append(names[o.name])
    for i in range(n_state):
        if n.output[i]:
            nodes.append(helper.make_node("Identity", [state[i]], [n.output[i]],
                                          name=f"{base}/state{i}"))
    for k in range(k_out):
        out = n.output[n_state + k]
        if not out:
            continue
        elems = collected[k][::-1] if out_dirs[k] else collected[k]
        rank = len(shapes.get(elems[0], [])) if elems[0] in shapes else None
        axis = out_axes[k]
        if axis < 0:
            if rank is None:
                return None
            axis += rank + 1
        parts = []
        for t, e in enumerate(elems):
            u = f"{base}/out{k}/{t}"
            if opset >= 13:
                ax = _const(f"{u}/axes", np.array([axis], np.int64), inits)
                nodes.append(helper.make_node("Unsqueeze", [e, ax], [u], name=u))
            else:
                nodes.append(helper.make_node("Unsqueeze", [e], [u], name=u, axes=[axis]))
            parts.append(u)
        nodes.append(helper.make_node("Concat", parts, [out], name=f"{base}/out{k}",
                                      axis=axis))
    return nodes




def _unroll_loop(n: onnx.NodeProto, made_by: dict[str, onnx.NodeProto],
                 consts: dict[str, np.ndarray], shapes: dict[str, list[int]], opset: int,
                 inits: list[onnx.TensorProto]) -> list[onnx.NodeProto] | None:
    """A Loop with a static trip count ``M``, unrolled into ``M`` copies of its body.

    When the loop's condition is known true at every step (no condition, or a constant
    one the body passes on unchanged) every copy runs. Otherwise each copy runs under a
    flag -- the initial condition, then each step's ``cond_out`` and-ed in -- its
    states advancing only while the flag holds (``Where``), and each scan output keeps
    the steps that ran: ``Compress`` by the flags, an output whose length depends on
    the data (see :mod:`.onnx_dynamic`). The copies past the loop's end are computed and
    dropped: a body whose indices polyc checks at run time is not unrolled so (integer
    division by zero, also possible there, is 0 in polyc, never a trap)."""
    attrs = {a.name: helper.get_attribute_value(a) for a in n.attribute}
    body = attrs["body"]
    if not _tensor_only(body) or not n.input or not n.input[0]:
        return None  # sequences, or no trip count (a while loop): not unrolled
    trips = _static_value(n.input[0], made_by, consts, shapes, opset)
    if trips is None:
        return None
    trips = int(np.asarray(trips).reshape(-1)[0])
    if not 0 < trips <= MAX_LOOP_TRIPS:
        return None
    cond_in = n.input[1] if len(n.input) > 1 else ""
    first = True if not cond_in else _static_value(cond_in, made_by, consts, shapes, opset)
    n_state = len(n.input) - 2
    b_iter, b_cond = body.input[0].name, body.input[1].name
    b_cond_out = body.output[0].name
    passes_on = _passes_on(body, b_cond_out, b_cond)
    static = first is not None and bool(np.asarray(first).reshape(-1)[0]) and passes_on
    if first is not None and not bool(np.asarray(first).reshape(-1)[0]):
        return None  # no step runs: the scan outputs are empty
    if not static and any(x.op_type in _CHECKED_INDEX_OPS for x in body.node):
        # the copies past the loop's end run too (their results are dropped): an index
        # they compute from the last state could fail a run-time check on valid input
        return None
    base = n.name or f"loop_{n.output[0]}"
    nodes: list[onnx.NodeProto] = []
    seen: set[str] = set()
    state = list(n.input[2:])
    scalar = _const(f"{base}/scalar", np.zeros(0, np.int64), inits)

    def as_scalar(c: str, name: str) -> str:  # a condition given as [1]: a scalar
        nodes.append(helper.make_node("Reshape", [c, scalar], [name], name=name))
        return name
    k_out = len(body.output) - 1 - n_state
    collected: list[list[str]] = [[] for _ in range(k_out)]
    flags: list[str] = []
    true = _const(f"{base}/true", np.array(True), inits)
    active = true if static or not cond_in else as_scalar(cond_in, f"{base}/cond")
    for t in range(trips):
        prefix = f"{base}/iter{t}/"
        names = {b_iter: _const(f"{prefix}iteration", np.array(t, np.int64), inits),
                 b_cond: active}
        for i, v in enumerate(body.input[2:2 + n_state]):
            names[v.name] = state[i]
        nodes += _copy_body(body, prefix, names, inits, seen)
        outs = [names.get(o.name, o.name) for o in body.output]
        if static:
            state = outs[1:1 + n_state]
        else:
            flags.append(active)
            held = []
            for i, v in enumerate(outs[1:1 + n_state]):
                h = f"{prefix}state{i}"
                nodes.append(helper.make_node("Where", [active, v, state[i]], [h], name=h))
                held.append(h)
            state = held
            nxt = f"{prefix}running"
            nodes.append(helper.make_node("And", [active, as_scalar(outs[0], f"{prefix}cond")],
                                          [nxt], name=nxt))
            active = nxt
        for k in range(k_out):
            collected[k].append(outs[1 + n_state + k])
    for i in range(n_state):
        if n.output[i]:
            nodes.append(helper.make_node("Identity", [state[i]], [n.output[i]],
                                          name=f"{base}/state{i}"))
    if not static and any(n.output[n_state:]):
        mask = f"{base}/ran"
        parts = []
        for t, f in enumerate(flags):
            u = f"{base}/ran{t}"
            nodes.append(_unsqueeze0(f, u, opset, inits))
            parts.append(u)
        nodes.append(helper.make_node("Concat", parts, [mask], name=mask, axis=0))
    for k in range(k_out):
        out = n.output[n_state + k]
        if not out:
            continue
        parts = []
        for t, e in enumerate(collected[k]):
            u = f"{base}/out{k}/{t}"
            nodes.append(_unsqueeze0(e, u, opset, inits))
            parts.append(u)
        stacked = out if static else f"{base}/out{k}/all"
        nodes.append(helper.make_node("Concat", parts, [stacked], name=f"{base}/out{k}",
                                      axis=0))
        if not static:
            nodes.append(helper.make_node("Compress", [stacked, mask], [out],
                                          name=f"{base}/out{k}/ran", axis=0))
    return nodes


#: ops whose indices polyc checks at run time (a failed check stops the run)
_CHECKED_INDEX_OPS = frozenset(["Gather", "GatherElements", "GatherND", "ScatterND",
                                "ScatterElements", "NegativeLogLikelihoodLoss",
                                "SoftmaxCrossEntropyLoss", "RoiAlign"])


def _passes_on(body: onnx.GraphProto, out: str, inp: str) -> bool:
    """The body's ``out`` is its input ``inp``, directly or through Identity nodes."""
    made = {o: x for x in body.node for o in x.output}
    seen = set()
    while out != inp and out not in seen:
        seen.add(out)
        x = made.get(out)
        if x is None or x.op_type != "Identity":
            return False
        out = x.input[0]
    return out == inp


def _unsqueeze0(x: str, out: str, opset: int, inits: list[onnx.TensorProto]) -> onnx.NodeProto:
    if opset >= 13:
        ax = _const(f"{out}/axes", np.array([0], np.int64), inits)
        return helper.make_node("Unsqueeze", [x, ax], [out], name=out)
    return helper.make_node("Unsqueeze", [x], [out], name=out, axes=[0])


def _inline_if(n: onnx.NodeProto, consts: dict[str, np.ndarray],
               inits: list[onnx.TensorProto]) -> list[onnx.NodeProto] | None:
    attrs = {a.name: helper.get_attribute_value(a) for a in n.attribute}
    then_g, else_g = attrs["then_branch"], attrs["else_branch"]
    if not (_tensor_only(then_g) and _tensor_only(else_g)):
        return None
    base = n.name or f"if_{n.output[0]}"
    cond = n.input[0]
    seen: set[str] = set()
    if cond in consts:  # the branch taken, alone
        g = then_g if bool(np.asarray(consts[cond]).reshape(-1)[0]) else else_g
        names: dict[str, str] = {}
        nodes = _copy_body(g, f"{base}/", names, inits, seen)
        return nodes + [helper.make_node("Identity", [names.get(o.name, o.name)], [out],
                                         name=f"{base}/out{k}")
                        for k, (o, out) in enumerate(zip(g.output, n.output)) if out]
    tn: dict[str, str] = {}
    en: dict[str, str] = {}
    nodes = _copy_body(then_g, f"{base}/then/", tn, inits, seen)
    nodes += _copy_body(else_g, f"{base}/else/", en, inits, seen)
    for k, out in enumerate(n.output):
        if out:
            a = tn.get(then_g.output[k].name, then_g.output[k].name)
            b = en.get(else_g.output[k].name, else_g.output[k].name)
            nodes.append(helper.make_node("Where", [cond, a, b], [out], name=f"{base}/out{k}"))
    return nodes
