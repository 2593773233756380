"""Frontends: TC language and einsum strings -> polyc IR.

* :func:`parse_tc` -- TC source to the parser's AST (``list[Def]``, with line:col spans);
* :func:`tc_defs` -- the names of the defs of a TC source;
* :func:`from_tc` -- one def of a TC source to a :class:`polyc.ir.Kernel`;
* :func:`from_einsum` -- a numpy einsum string to a :class:`polyc.ir.Kernel`.
"""
from __future__ import annotations

from .einsum import from_einsum
from .tc_lower import from_tc, tc_defs
from .tc_parser import parse_tc

__all__ = ["from_einsum", "from_tc", "parse_tc", "tc_defs"]
