"""Lowering driver: a static ONNX :class:`Graph` -> a :class:`polyc.program.Program`.

:func:`lower_graph` first checks every node's op type against the registry of op
lowerings (``onnx_graph.REGISTRY``, filled by ``onnx_ops_math``, ``onnx_ops_nn`` and
``onnx_ops_shape``) and reports *all* unsupported nodes at once. Then, for each fusion
group (``onnx_passes.fusion_groups`` unless given), it calls the nodes' lowerings with
one :class:`LowerContext` and joins their TC statements into one ``def``:

* inputs: tensors the statements read that the group does not produce (graph inputs,
  constants -- which become Program weights -- and other groups' results);
* outputs: tensors the group produces that a later group or the graph's outputs need;
* everything else: temporaries of the kernel.

Inputs and outputs are declared with their full static types, so shapes are exact. The
def goes through the TC frontend (``polyc.frontend.from_tc``) into a Kernel: one
:class:`Step`; the run-time index checks its lowerings ask for (``Lowered.checks``)
become the Program's index checks (:class:`~polyc.program.IndexCheck`) of that step.
A node lowered as a :class:`View` becomes a Program alias (its element count checked).
Graph outputs that no step writes (a graph input, a constant, a view) get a copy step.
"""
from __future__ import annotations

import inspect
import re
from collections.abc import Callable, Sequence
from dataclasses import replace

import numpy as np

from polyc import dtypes as D
from polyc.errors import CompileError, InternalError
from polyc.inline import inline_pointwise
from polyc.ir import Kernel
from polyc.program import Buffer, IndexCheck, Program, Step, alias_root

from .onnx_dynamic import dynamic_extents
from .onnx_graph import (
    REGISTRY,
    Graph,
    LowerContext,
    Lowered,
    Node,
    TensorInfo,
    UnsupportedOpError,
    View,
    supported_ops,
)

_TC_DTYPE = {d.name: d.tc for d in D.BY_NAME.values()}
ProgressFn = Callable[[int, int, Sequence[str]], None]


def load_lowerings() -> None:
    """Import the modules that register op lowerings."""
    from . import onnx_ops_math  # noqa: F401
    try:
        from . import onnx_ops_nn  # noqa: F401
    except ImportError as e:
        if "onnx_ops_nn" not in str(e):
            raise
    try:
        from . import onnx_ops_shape  # noqa: F401
    except ImportError as e:
        if "onnx_ops_shape" not in str(e):
            raise
    from . import onnx_ops_attention  # noqa: F401
    from . import onnx_ops_quant  # noqa: F401
    from . import onnx_ops_rnn  # noqa: F401
    from . import onnx_ops_index  # noqa: F401
    from . import onnx_ops_select  # noqa: F401
    from . import onnx_ops_sequence  # noqa: F401


def check_supported(graph: Graph) -> None:
    """Raise :class:`UnsupportedOpError` listing every node whose op has no lowering."""
    load_lowerings()
    bad = [n for n in graph.nodes if n.op_type not in REGISTRY or n.domain not in ("", "ai.onnx")]
    if not bad:
        return
    listed = "\n".join(f"  node {n.name!r}: {(n.domain + '.') if n.domain else ''}{n.op_type}"
                       for n in bad[:50])
    more = f"\n  ... and {len(bad) - 50} more" if len(bad) > 50 else ""
    kinds = sorted({n.op_type for n in bad})
    raise UnsupportedOpError(
        f"{len(bad)} node(s) use op types polyc does not support ({', '.join(kinds)}):\n"
        f"{listed}{more}\nsupported ops: {', '.join(supported_ops())}")


def _check_view(node: Node, view: View, graph: Graph) -> None:
    """A view's output shares its input's storage: their element counts must agree
    (the importer's validation says so for every model; this guards graphs built or
    rewritten otherwise)."""
    from .onnx_validate import OnnxValidationError
    x, y = graph.tensors[view.input].shape, graph.tensors[view.output].shape
    nx, ny = int(np.prod(x, dtype=np.int64)), int(np.prod(y, dtype=np.int64))
    if nx != ny:
        raise OnnxValidationError(f"node {node.name!r} ({node.op_type}): cannot reshape "
                                  f"{view.input!r} of shape {list(x)} ({nx} elements) to "
                                  f"{list(y)} ({ny} elements)")


def _tc_type(info: TensorInfo) -> str:
    dims = ",".join(str(d) for d in info.shape)
    return f"{_TC_DTYPE[info.dtype]}({dims})" if dims else _TC_DTYPE[info.dtype]


def _check_not_empty(tensor: str, shape: tuple[int, ...], where: str) -> None:
    if 0 in shape:
        raise UnsupportedOpError(f"{where}: tensor {tensor!r} has a zero-size dimension "
                                 f"{shape}; polyc does not compile empty tensors")


def sanitize(name: str) -> str:
    s = re.sub(r"[^A-Za-z0-9_]", "_", name) or "model"
    if s[0].isdigit() or s[0] == "_":
        s = "m" + s
    return s


def _from_tc() -> Callable[[str], Kernel]:
    from . import from_tc
    try:
        params = inspect.signature(from_tc).parameters
    except (TypeError, ValueError):
        params = {}
    if "allow_indirect" in params:
        return lambda text: from_tc(text, allow_indirect=True)
    return lambda text: from_tc(text)


def _numbered(text: str) -> str:
    return "\n".join(f"{i + 1:4d} | {line}" for i, line in enumerate(text.splitlines()))


def _call_lowering(node: Node, ctx: LowerContext) -> Lowered | View:
    fn = REGISTRY[node.op_type]
    where = f"node {node.name!r} ({node.op_type})"
    try:
        result = fn(node, ctx)
    except UnsupportedOpError as e:
        if node.name in str(e):
            raise
        raise UnsupportedOpError(f"{where}: {e}") from None
    except CompileError as e:
        if node.name in str(e):
            raise
        raise type(e)(f"{where}: {e}") from None
    except Exception as e:
        raise InternalError(f"the lowering of {where} failed ({type(e).__name__}: {e}); "
                            f"this is a bug in polyc's {node.op_type} lowering") from e
    if not isinstance(result, (Lowered, View)):
        raise InternalError(f"the lowering of {where} returned {type(result).__name__}, "
                            f"not Lowered or View")
    return result


def _share_loops(kernel: Kernel, results: list[Lowered]) -> Kernel:
    """``kernel`` with the statements of each result's ``loops`` range sharing their
    outer loop (positions ``(first, t, k, other iterators...)``) and its ``scaffold``
    statements dropped. Statement ``i`` of the group's TC is on line ``i + 2``."""
    if not any(r.loops or r.scaffold for r in results):
        return kernel
    groups: dict[int, tuple[str, int]] = {}  # TC line -> (iterator, group id)
    drop: set[str] = set()
    offset = 0
    for r in results:
        for it, first, last in r.loops:
            for i in range(first, last + 1):
                groups[offset + i + 2] = (it, offset + first)
        drop.update(f"line {offset + i + 2}" for i in r.scaffold)
        offset += len(r.statements)
    stmts = [st for st in kernel.statements if st.origin not in drop]
    order: list[tuple[str, tuple[int | str, ...]]] = []
    base: dict[int, int] = {}
    count: dict[int, int] = {}
    for index, st in enumerate(stmts):
        line = int(st.origin.split()[-1]) if st.origin.startswith("line ") else -1
        if line not in groups:
            order.append((st.name, (index, *st.iterators)))
            continue
        it, gid = groups[line]
        if st.iterators[:1] != (it,):
            raise InternalError(f"statement {st.name} ({st.origin}) does not start with "
                                f"the shared loop {it!r}")
        b = base.setdefault(gid, index)
        k = count.get(gid, 0)
        count[gid] = k + 1
        order.append((st.name, (b, it, k, *st.iterators[1:])))
    written = {st.write.array for st in stmts}
    arrays = tuple(a for a in kernel.arrays if a.role != "temp" or a.name in written)
    return Kernel(kernel.name, kernel.sizes, arrays, tuple(stmts), kernel.inputs,
                  kernel.outputs, kernel.context, kernel.fixed_sizes, tuple(order),
                  constants=kernel.constants)


class _ProgramBuilder:
    def __init__(self, graph: Graph):
        self.graph = graph
        self.steps: list[Step] = []
        self.checks: list[IndexCheck] = []
        self.aliases: list[tuple[str, str]] = []
        self.copies: list[tuple[str, str]] = []  # (graph output, source tensor)
        self.from_tc = _from_tc()
        self.users: dict[str, set[str]] = {}
        for n in graph.nodes:
            for x in n.inputs:
                if x:
                    self.users.setdefault(x, set()).add(n.name)
        self.kernel_names: set[str] = set()
        #: weights that are no graph tensor (the values of constant graph outputs)
        self.extra: dict[str, tuple[TensorInfo, np.ndarray]] = {}
        #: graph outputs whose extent depends on data, and their counts (outputs too)
        found = dynamic_extents(graph)
        self.extents = {o: found[o] for o in graph.outputs if o in found}
        self.counts = list(dict.fromkeys(e.count for e in self.extents.values()))

    # -- groups -----------------------------------------------------------------------
    def lower_group(self, nodes: list[Node]) -> None:
        ctx = LowerContext(self.graph)
        results = [(_call_lowering(n, ctx), n) for n in nodes]
        views = [r for r, _ in results if isinstance(r, View)]
        if views and len(nodes) > 1:
            # views are aliases, not code: lower the runs between them as groups
            run: list[Node] = []
            for r, n in results:
                if isinstance(r, View):
                    if run:
                        self.lower_group(run)
                        run = []
                    self.lower_group([n])
                else:
                    run.append(n)
            if run:
                self.lower_group(run)
            return
        if views:
            v = views[0]
            _check_view(nodes[0], v, self.graph)
            if v.output in self.graph.outputs:  # a graph output is its own storage
                self.add_copy(v.output, v.input)
                self.copies.append((v.output, v.input))
            else:
                self.aliases.append((v.output, v.input))
            return
        self.compile_group(nodes, ctx, [r for r, _ in results])  # type: ignore[misc]

    def compile_group(self, nodes: list[Node], ctx: LowerContext,
                      results: list[Lowered]) -> None:
        graph = self.graph
        statements = [s for r in results for s in r.statements]
        body = "\n".join(f"    {s}" for s in statements)
        tokens = set(re.findall(r"[A-Za-z_][A-Za-z0-9_]*", body))
        names = ctx.named_tensors()
        produced = [o for n in nodes for o in n.outputs if o]
        produced_set = set(produced)
        in_group = {n.name for n in nodes}
        checks = [c for r in results for c in r.checks]
        # an index tensor the group computes itself is checked after the step: it
        # must then be one of the kernel's outputs (a buffer)
        checked_inside = {c.buffer for c in checks if c.buffer in produced_set}
        where = ", ".join(f"{n.name!r} ({n.op_type})" for n in nodes)
        inputs = [t for t, tc in names.items() if t not in produced_set and tc in tokens]
        outputs = []
        for t in dict.fromkeys(produced):
            needed = t in graph.outputs or bool(self.users.get(t, set()) - in_group) \
                or t in checked_inside or t in self.counts
            if not needed or (0 in ctx.shape(t) and t in graph.constants):
                continue  # (an empty output is a constant: nothing to compute)
            _check_not_empty(t, ctx.shape(t), where)
            if t not in names or names[t] not in tokens:
                raise InternalError(f"the lowering of {where} does not compute {t!r}, which "
                                    f"is needed by other nodes or is a graph output")
            outputs.append(t)
        for t in inputs:
            _check_not_empty(t, ctx.shape(t), where)
        kname = self.kernel_name(nodes)
        views = [(tc, t) for tc, (t, _) in ctx.views().items() if tc in tokens]
        if any(t in produced_set for _, t in views):
            raise InternalError(f"the lowering of {where} views a tensor the group computes")
        params = ", ".join([f"{ctx.tc_type(t)} {names[t]}" for t in inputs] +
                           [f"{ctx.view_type(tc)} {tc}" for tc, _ in views])
        rets = ", ".join(f"{ctx.tc_type(t)} {names[t]}" for t in outputs)
        text = f"def {kname}({params}) -> ({rets}) {{\n{body}\n}}\n"
        kernel = self.compile_tc(text, where)
        kernel = _share_loops(kernel, results)
        folds = tuple(f for r in results for f in r.folds)
        if folds:  # applied once scheduled (polyc.pipeline.fold_storage_hints)
            kernel = replace(kernel, folds=folds)
        exits = tuple(e for r in results for e in r.exits)
        if exits:
            kernel = replace(kernel, exits=exits)
        self.verify(kernel, ctx, where, text)
        kernel = inline_pointwise(kernel)
        weights = tuple(names[t] for t in inputs if t in graph.constants or t in self.extra)
        if weights:
            kernel = replace(kernel, constants=weights)
        args = inputs + [t for _, t in views] + outputs
        for c in checks:
            if c.buffer not in args:
                raise InternalError(f"the index check of {where} reads {c.buffer!r}, which "
                                    f"is no buffer of the step")
            self.checks.append(replace(c, step=len(self.steps),
                                       after_step=c.buffer in checked_inside))
        self.steps.append(Step(kernel, tuple(args), tuple(n.name for n in nodes)))

    def compile_tc(self, text: str, where: str) -> Kernel:
        try:
            return self.from_tc(text)
        except CompileError as e:
            raise InternalError(f"the TC generated for {where} is rejected by the TC "
                                f"frontend: {e}\n{_numbered(text)}") from e

    def verify(self, kernel: Kernel, ctx: LowerContext, where: str, text: str) -> None:
        """Temporaries that stand for graph tensors must have the graph's shape and dtype."""
        from polyc import expr as E
        for a in kernel.arrays:
            t = ctx.tensor_of(a.name)
            if t is None or t not in self.graph.tensors:
                continue
            try:
                shape = tuple(E.evaluate(d, {}) for d in a.shape)
            except (ValueError, KeyError):
                shape = None
            info = ctx.info(t)
            if shape != info.shape or a.dtype != info.dtype:
                got = f"{a.dtype}{list(shape) if shape is not None else a.shape}"
                raise InternalError(f"the lowering of {where} computes {t!r} as {got}, but "
                                    f"the graph says {info.dtype}{list(info.shape)}\n"
                                    f"{_numbered(text)}")

    def kernel_name(self, nodes: list[Node]) -> str:
        base = sanitize(f"k{len(self.steps)}_{nodes[0].name}")[:48]
        name, k = base, 1
        while name in self.kernel_names:
            name = f"{base}_{k}"
            k += 1
        self.kernel_names.add(name)
        return name

    # -- copies of graph outputs that no step writes ------------------------------------
    def root(self, name: str) -> str:
        return alias_root(self.aliases, name)

    def info(self, name: str) -> TensorInfo:
        if name in self.extra:
            return self.extra[name][0]
        return self.graph.tensors[name]

    def add_copy(self, out: str, src: str) -> None:
        """A step ``out = src`` (``src`` read in row-major order if its shape differs)."""
        src = self.root(src)
        if src == out:  # a constant graph output: copied from a weight of another name
            value = self.graph.constants[out]
            base, k = f"{out}_value", 1
            src = base
            while src in self.graph.tensors or src in self.extra:
                src = f"{base}_{k}"
                k += 1
            info = self.graph.tensors[out]
            self.extra[src] = (TensorInfo(src, info.dtype, info.shape), value)
        dst_info, src_info = self.info(out), self.info(src)
        _check_not_empty(out, dst_info.shape, f"graph output {out!r}")
        dst_shape, src_shape = dst_info.shape, src_info.shape
        y, x = "t_out", "t_in"
        idx = [f"i{d}" for d in range(len(dst_shape))]
        if dst_shape == src_shape:
            src_idx = idx
        else:
            lin_terms = []
            stride = 1
            for d in reversed(range(len(dst_shape))):
                if dst_shape[d] != 1:
                    lin_terms.append(f"{stride}*{idx[d]}" if stride != 1 else idx[d])
                stride *= dst_shape[d]
            lin = " + ".join(reversed(lin_terms)) or "0"
            src_idx = []
            stride = 1
            strides = []
            for d in reversed(range(len(src_shape))):
                strides.append(stride)
                stride *= src_shape[d]
            strides.reverse()
            for d, (s, n) in enumerate(zip(strides, src_shape)):
                if n == 1:
                    src_idx.append("0")
                    continue
                e = f"({lin})" if s == 1 else f"(({lin}) / {s})"
                src_idx.append(e if d == 0 else f"({e} % {n})")
        lhs = f"{y}({', '.join(idx)})" if idx else y
        rhs = f"{x}({', '.join(src_idx)})" if src_shape else x
        ranges = ", ".join(f"{i} in 0:{n}" for i, n in zip(idx, dst_shape))
        stmt = f"{lhs} = {rhs}" + (f" where {ranges}" if ranges else "")
        kname = self.kernel_name([Node(f"copy_{out}", "Identity", (src,), (out,))])
        text = (f"def {kname}({_tc_type(src_info)} {x}) -> ({_tc_type(dst_info)} {y}) {{\n"
                f"    {stmt}\n}}\n")
        kernel = self.compile_tc(text, f"the copy of {src!r} to graph output {out!r}")
        self.steps.append(Step(kernel, (src, out), (f"copy of {src} to {out}",)))

    # -- the program --------------------------------------------------------------------
    def program(self) -> Program:
        graph = self.graph
        written = {a for s in self.steps for a in s.args[len(s.kernel.inputs):]}
        alias_views = {v for v, _ in self.aliases}
        for out in dict.fromkeys(graph.outputs):
            if out in graph.inputs:
                raise UnsupportedOpError(f"graph output {out!r} is also a graph input; "
                                         f"polyc needs outputs distinct from inputs")
            if out in written or any(out == o for o, _ in self.copies):
                continue
            if 0 in self.info(out).shape:
                continue  # no elements: nothing to write
            if out in graph.constants or out in alias_views:
                self.add_copy(out, out)
            else:
                raise InternalError(f"graph output {out!r} is computed by no step")
        outputs = list(dict.fromkeys(graph.outputs)) + self.counts
        names: list[str] = list(graph.inputs) + outputs
        for s in self.steps:
            names.extend(s.args)
        for v, b in self.aliases:
            names.extend((v, b))
        kinds: dict[str, str] = {}

        def kind(n: str) -> str:
            if n in graph.inputs:
                return "input"
            if n in graph.outputs or n in self.counts:
                return "output"
            if n in graph.constants:
                return "weight"
            return "temp"

        buffers = []
        weights = []
        for n in dict.fromkeys(names):
            info = self.info(n)
            k = kind(self.root(n)) if n in alias_views else kind(n)
            if n in self.extra:
                k = "weight"
                weights.append((n, np.asarray(self.extra[n][1], order="C")))
            elif k == "weight" and n not in alias_views:
                weights.append((n, np.asarray(graph.constants[n], order="C")))
            kinds[n] = k
            buffers.append(Buffer(n, info.dtype, tuple(info.shape), k))
        extents = tuple((o, e.axis, e.count) for o, e in self.extents.items())
        return Program(sanitize(graph.name), tuple(buffers), tuple(graph.inputs),
                       tuple(graph.outputs) + tuple(self.counts), tuple(weights),
                       tuple(self.steps), tuple(self.aliases), tuple(self.checks), extents)


def lower_graph(graph: Graph, groups: list[list[Node]] | None = None,
                progress: ProgressFn | None = None) -> Program:
    """The Program computing ``graph``: one step per fusion group (see the module doc).

    ``groups`` defaults to :func:`onnx_passes.fusion_groups`; ``progress(i, n, names)``
    is called before each group is lowered (``names``: the group's node names).
    """
    check_supported(graph)
    if groups is None:
        from .onnx_passes import fusion_groups
        groups = fusion_groups(graph)
    covered = [n.name for g in groups for n in g]
    if sorted(covered) != sorted(n.name for n in graph.nodes):
        raise InternalError("the fusion groups do not partition the graph's nodes")
    builder = _ProgramBuilder(graph)
    for i, group in enumerate(groups):
        if progress is not None:
            progress(i, len(groups), [n.name for n in group])
        builder.lower_group(list(group))
    return builder.program()
