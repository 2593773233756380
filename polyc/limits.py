"""The limits polyc puts on its input, in one place (listed in README.md).

Each one is far above what real programs use (the ONNX lowering of ResNet-50, VGG-19,
DenseNet-121 and friends, and the TC examples, stay at least 10x below every one), and
each one turns what would be a hang, a ``RecursionError`` or a crash deep inside the
compiler into a :class:`~polyc.errors.CompileError` (or, at call time, a
:class:`~polyc.errors.CallError`) that names the limit, its value and where it was hit.
The source limits are checked while parsing, so a source far over a limit is refused
after reading only as far as the limit.
"""
from __future__ import annotations

import functools
import os

#: depth of an expression: nested parentheses, calls, unary operators, ``?:`` branches,
#: and the operands of a chain of binary operators (``a + b + c`` has depth 3). The
#: compiler walks expressions recursively; 128 keeps it far from Python's recursion
#: limit (it fails near 500). The ONNX lowering's deepest expression has depth 10.
MAX_EXPR_DEPTH = 128

#: nodes of one expression once its ``where`` let-bindings are substituted (bindings
#: that use each other twice double in size at each step: 40 of them would make a
#: tree of 2**40 nodes, which every later pass walks).
MAX_EXPR_NODES = 65536

#: statements in one ``def``. Scheduling time grows faster than linearly (256 chained
#: statements schedule in about 2 s; 10,000 would run for hours). An ONNX kernel has at
#: most a few tens (fusion groups are at most 6 nodes).
MAX_STATEMENTS = 256

#: ``def``s in one source text.
MAX_DEFS = 1024

#: parameters plus outputs of one ``def`` (a Concat of many inputs is one kernel).
MAX_DEF_TENSORS = 1024

#: indices of one statement (its loop depth: left-hand side plus reduction indices),
#: and the rank of a declared tensor; numpy arrays have at most 32 (numpy < 2) or 64
#: dimensions, isl's scheduler slows down sharply with the dimension.
MAX_INDICES = 32

#: characters of a name (def, tensor, size, index). ONNX tensor names become TC names
#: and can be long (TensorFlow exports join fused op names); the compile cache hashes
#: long names, so the limit only guards against absurd input.
MAX_NAME_LENGTH = 1024

#: elements of one array at call time: the generated C computes element offsets in
#: int64_t, and no machine holds 2**48 elements.
MAX_ARRAY_ELEMENTS = 2 ** 48


def max_array_bytes_origin() -> str:
    """Where :func:`max_array_bytes` comes from, for messages."""
    if os.environ.get("POLYC_MAX_ARRAY_BYTES", "").strip().isdigit():
        return "set by POLYC_MAX_ARRAY_BYTES"
    return "this machine's memory"


def max_array_bytes() -> int:
    """Bytes a call may allocate for one array (an output or a temporary), and for all
    of them together: the machine's physical memory (``POLYC_MAX_ARRAY_BYTES``
    overrides it). A bigger array would fail in numpy's ``MemoryError`` or, worse,
    be overcommitted and killed by the kernel half-way through the call."""
    env = os.environ.get("POLYC_MAX_ARRAY_BYTES", "").strip()
    if env.isdigit():
        return int(env)
    return _physical_memory()


@functools.lru_cache(maxsize=1)
def _physical_memory() -> int:
    try:
        return os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (AttributeError, OSError, ValueError):
        return 2 ** 40
