"""polyc as an ONNX backend (``onnx.backend.base.Backend``), so that onnx's own backend
test runner can drive it::

    import polyc.backend as backend
    rep = backend.prepare(model, "CPU")          # compiles the model into a C library
    outputs = rep.run([x])                        # a namedtuple of outputs, graph order
    outputs = backend.run_node(node, [a, b])      # one node, built into a model

Keyword arguments of ``prepare``/``run_model``: ``options`` (a :class:`polyc.Options`),
``shapes`` (symbolic input dimensions) and ``progress``. Unsupported ops or dtypes raise
(:class:`polyc.CompileError` subclasses) before any code is generated.

A model whose graph inputs include *parameters* (a Reduce's axes, a Slice's bounds, Pad's
pads, Split's sizes, TopK's K, a Reshape's shape: see
:data:`polyc.frontend.onnx_import.PARAMETER_SLOTS`) is specialised on their values: the
prepared model (:attr:`PolycBackendRep.parameters` names them) compiles at its first run
for those values, and again for each new set of values (each compiled model is kept,
keyed by the values); an unsupported op then raises at that run.
"""
from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import onnx
from onnx import helper
from onnx.backend.base import Backend, BackendRep, Device, DeviceType, namedtupledict

from .errors import CallError
from .model import CompiledModel, compile_onnx

#: IR version of the models run_node builds (one every onnx release can check)
_RUN_NODE_IR_VERSION = 8


class PolycBackendRep(BackendRep):
    """A prepared model: compiled and loaded, or -- with :attr:`parameters` -- compiled
    at each run for new values of those inputs (see the module doc)."""

    def __init__(self, compiled: CompiledModel | None, model: onnx.ModelProto | None = None,
                 parameters: Sequence[str] = (), inputs: Sequence[str] = (),
                 compile_args: Mapping[str, Any] | None = None):
        self.compiled = compiled
        #: graph inputs the model is specialised on (compiled per set of their values)
        self.parameters = tuple(parameters)
        self._model, self._inputs = model, tuple(inputs)
        self._args = dict(compile_args or {})
        self._by_values: dict[tuple[Any, ...], CompiledModel] = {}

    @property
    def input_names(self) -> tuple[str, ...]:
        return self._inputs if self.parameters else tuple(self.compiled.input_names)

    def _specialised(self, feed: dict[str, Any]) -> CompiledModel:
        values = {p: np.asarray(feed.pop(p)) for p in self.parameters}
        key = tuple((p, v.dtype.str, v.shape, v.tobytes()) for p, v in values.items())
        if key not in self._by_values:
            self._by_values[key] = compile_onnx(self._model, values=values, **self._args)
        return self._by_values[key]

    def run(self, inputs: Any, **kwargs: Any) -> tuple[Any, ...]:
        """Outputs in graph order for ``inputs``: arrays in the order of the graph's
        inputs (initializers excluded), a single array, or a dict name -> array."""
        names = self.input_names
        if isinstance(inputs, Mapping):
            feed = dict(inputs)
        else:
            if isinstance(inputs, np.ndarray):
                inputs = [inputs]
            if not isinstance(inputs, Sequence) or len(inputs) != len(names):
                n = len(inputs) if isinstance(inputs, Sequence) else 1
                raise CallError(f"the model takes {len(names)} inputs ({', '.join(names)}), "
                                f"got {n}")
            feed = dict(zip(names, inputs))
        if self.parameters:
            missing = [p for p in self.parameters if p not in feed]
            if missing:
                raise CallError(f"the model's parameters {missing} need values at each run")
            compiled = self._specialised(feed)
        else:
            compiled = self.compiled
        outs = compiled.run(None, feed)
        return namedtupledict("Outputs", compiled.output_names)(*outs)


class PolycBackend(Backend):
    """ONNX models compiled by polyc into C (OpenMP) on the CPU."""

    @classmethod
    def supports_device(cls, device: str) -> bool:
        try:
            return Device(device).type == DeviceType.CPU
        except Exception:
            return False

    @classmethod
    def prepare(cls, model: onnx.ModelProto, device: str = "CPU",
                **kwargs: Any) -> PolycBackendRep:
        if not cls.supports_device(device):
            raise ValueError(f"polyc runs models on the CPU only, not on {device!r}")
        super().prepare(model, device, **kwargs)
        from .frontend.onnx_import import check_tensor_interface, parameter_inputs, \
            read_model
        args = dict(shapes=kwargs.get("shapes"), options=kwargs.get("options"),
                    progress=kwargs.get("progress", False), name=kwargs.get("name"))
        params = parameter_inputs(model)
        if params:
            proto, _ = read_model(model)
            check_tensor_interface(proto)  # refused now, not at the first run
            inits = {t.name for t in proto.graph.initializer}
            inputs = [i.name for i in proto.graph.input if i.name not in inits]
            return PolycBackendRep(None, proto, params, inputs, args)
        return PolycBackendRep(compile_onnx(model, **args))

    @classmethod
    def run_model(cls, model: onnx.ModelProto, inputs: Any, device: str = "CPU",
                  **kwargs: Any) -> tuple[Any, ...]:
        return cls.prepare(model, device, **kwargs).run(inputs)

    @classmethod
    def run_node(cls, node: onnx.NodeProto, inputs: Any, device: str = "CPU",
                 outputs_info: Sequence[tuple[Any, tuple[int, ...]]] | None = None,
                 **kwargs: Any) -> tuple[Any, ...]:
        """Run one node: a model is built around it from the inputs' dtypes and shapes
        (``opset_version`` in ``kwargs`` picks the opset, default onnx's newest)."""
        super().run_node(node, inputs, device, outputs_info,
                         **{k: v for k, v in kwargs.items() if k == "opset_version"})
        arrays = [np.asarray(x) for x in (inputs.values() if isinstance(inputs, Mapping)
                                          else inputs)]
        model = node_model(node, arrays, outputs_info, kwargs.pop("opset_version", None))
        rep = cls.prepare(model, device, **kwargs)
        return rep.run(arrays)


def node_model(node: onnx.NodeProto, inputs: Sequence[np.ndarray],
               outputs_info: Sequence[tuple[Any, tuple[int, ...]]] | None = None,
               opset: int | None = None) -> onnx.ModelProto:
    """A one-node model whose graph inputs are the node's (non-empty) inputs, typed like
    ``inputs``; output types come from ``outputs_info`` or onnx's shape inference."""
    names = [n for n in node.input if n]
    if len(inputs) != len(names):
        raise CallError(f"node {node.name or node.op_type} has {len(names)} inputs "
                        f"({', '.join(names)}), got {len(inputs)} arrays")
    graph_inputs = [helper.make_tensor_value_info(n, helper.np_dtype_to_tensor_dtype(x.dtype),
                                                  x.shape) for n, x in zip(names, inputs)]
    outputs = [n for n in node.output if n]
    if outputs_info:
        graph_outputs = [helper.make_tensor_value_info(
            n, helper.np_dtype_to_tensor_dtype(np.dtype(dt)), shape)
            for n, (dt, shape) in zip(outputs, outputs_info)]
    else:
        graph_outputs = [onnx.ValueInfoProto(name=n) for n in outputs]
    opset = opset or onnx.defs.onnx_opset_version()
    graph = helper.make_graph([node], f"{node.op_type}_node", graph_inputs, graph_outputs)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid(node.domain, opset)])
    model.ir_version = _RUN_NODE_IR_VERSION
    if not outputs_info:
        inferred = onnx.shape_inference.infer_shapes(model, strict_mode=True)
        types = {v.name: v.type for v in list(inferred.graph.value_info)
                 + list(inferred.graph.output)}
        for out in model.graph.output:
            if out.name in types:
                out.type.CopyFrom(types[out.name])
    return model


prepare = PolycBackend.prepare
run_model = PolycBackend.run_model
run_node = PolycBackend.run_node
supports_device = PolycBackend.supports_device
