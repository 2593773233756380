"""Frontends: TC language and einsum strings -> polyc IR.

* :func:`parse_tc` -- TC source to the parser's AST (``list[Def]``, with line:col spans);
* :func:`tc_defs` -- the names of the defs of a TC source;
* :func:`from_tc` -- one def of a TC source to a :class:`polyc.ir.Kernel`;
* :func:`from_einsum` -- a numpy einsum string to a :class:`polyc.ir.Kernel`;
* ONNX (imported on first use, as they need the ``onnx`` package):
  :func:`load_graph` -- a model file/bytes/ModelProto to a static ``onnx_graph.Graph``;
  :func:`optimize_graph` (and :func:`pass_stats`) -- the graph passes;
  :func:`fusion_groups` -- the partition into kernels;
  :func:`lower_graph` -- the Graph to a :class:`polyc.program.Program`.
"""
from __future__ import annotations

from .einsum import from_einsum
from .tc_lower import from_tc, tc_defs
from .tc_parser import parse_tc

__all__ = ["from_einsum", "from_tc", "fusion_groups", "load_graph", "lower_graph",
           "optimize_graph", "parse_tc", "pass_stats", "tc_defs"]

_LAZY = {"load_graph": "onnx_import", "optimize_graph": "onnx_passes",
         "pass_stats": "onnx_passes", "fusion_groups": "onnx_passes",
         "lower_graph": "onnx_lower"}


def __getattr__(name: str):
    if name in _LAZY:
        import importlib
        return getattr(importlib.import_module(f".{_LAZY[name]}", __name__), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
