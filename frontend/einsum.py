"""numpy einsum strings -> polyc IR, through the TC frontend.

``from_einsum("bij,bjk->bik", ["float32", "float32"])`` checks the string as numpy does
(errors are :class:`~polyc.errors.ParseError` with the column), then writes the TC
definition it means and lowers it with :func:`.tc_lower.from_tc`::

    def einsum(float32(B,I,J) X0, float32(B,J,K) X1) -> (float32(B,I,K) out) {
      out(b,i,k) +=! X0(b,i,j) * X1(b,j,k)
    }

Inputs are ``X0, X1, ...``, the output ``out``. Each label is an index and a size
(label ``i`` -> size ``I``; when the string also has upper-case labels, ``N_i`` and
``N_I``); the same label has the same size everywhere, so a repeated label in one
operand takes a diagonal (``"ii->i"``) or a trace (``"ii->"``). Without ``->`` the
output is the labels that appear once, in ASCII order, after the ``...`` dims.
``...`` stands for ``rank - len(labels)`` dims (``ranks`` is then required), aligned
right across operands as numpy broadcasting does; broadcast dims are sizes ``D0, D1...``
shared by all operands, so stretching a dim of size 1 is not supported. The output
dtype is numpy's result type of the inputs; inputs of another dtype are cast to it.
"""
from __future__ import annotations

import numpy as np

from polyc.errors import CompileError, ParseError, SemanticError, UnsupportedError
from polyc.expr import DTYPES
from polyc.ir import Kernel

from .tc_lower import from_tc

ELLIPSIS = "..."


def _fail(message: str, col: int) -> ParseError:
    return ParseError(f"bad einsum string: {message}", 1, col)


def parse_spec(spec: str) -> tuple[list[list[tuple[str, int]]], list[tuple[str, int]] | None]:
    """(operands, output or None); each a list of (label or ``...``, 1-based column)."""
    operands: list[list[tuple[str, int]]] = [[]]
    output: list[tuple[str, int]] | None = None
    pos = 0
    while pos < len(spec):
        ch, col = spec[pos], pos + 1
        cur = output if output is not None else operands[-1]
        if ch.isascii() and ch.isalpha():
            cur.append((ch, col))
        elif spec.startswith(ELLIPSIS, pos):
            if any(label == ELLIPSIS for label, _ in cur):
                raise _fail("'...' appears twice in one operand", col)
            cur.append((ELLIPSIS, col))
            pos += 2
        elif spec.startswith("->", pos):
            if output is not None:
                raise _fail("'->' appears twice", col)
            output = []
            pos += 1
        elif ch == "," and output is None:
            operands.append([])
        elif ch != " ":
            what = "',' in the output" if ch == "," else f"character {ch!r}"
            raise _fail(f"unexpected {what} (labels are letters; '...' and '->' are the only "
                        f"other tokens)", col)
        pos += 1
    return operands, output


def _check_output(operands, output) -> None:
    seen_in = {label for op in operands for label, _ in op}
    seen_out: set[str] = set()
    for label, col in output:
        if label in seen_out:
            raise _fail(f"output label {label!r} appears more than once", col)
        if label != ELLIPSIS and label not in seen_in:
            raise _fail(f"output label {label!r} is not in any input", col)
        seen_out.add(label)


def _implicit_output(operands) -> list[tuple[str, int]]:
    counts: dict[str, int] = {}
    for op in operands:
        for label, _ in op:
            counts[label] = counts.get(label, 0) + 1
    once = sorted((lb for lb, n in counts.items() if n == 1 and lb != ELLIPSIS), key=ord)
    return ([(ELLIPSIS, 0)] if ELLIPSIS in counts else []) + [(lb, 0) for lb in once]


def _ellipsis_dims(spec, operands, ranks) -> list[int]:
    """How many dims ``...`` covers in each operand (0 where it is absent)."""
    has = [any(lb == ELLIPSIS for lb, _ in op) for op in operands]
    if ranks is None:
        if any(has):
            raise SemanticError(f"einsum {spec!r} uses '...': pass ranks= so that polyc "
                                f"knows how many dims it covers")
        return [0] * len(operands)
    if len(ranks) != len(operands):
        raise SemanticError(f"einsum {spec!r} has {len(operands)} operand(s) but "
                            f"{len(ranks)} ranks were given")
    out = []
    for k, (op, rank) in enumerate(zip(operands, ranks)):
        n = rank - sum(lb != ELLIPSIS for lb, _ in op)
        if n < 0 or (n > 0 and not has[k]):
            raise SemanticError(f"operand {k} of einsum {spec!r} has rank {rank}, which does "
                                f"not match its labels {''.join(lb for lb, _ in op)!r}")
        out.append(n)
    return out


def _result_dtype(dtypes: list[str]) -> str:
    try:
        names = [np.dtype(d).name for d in dtypes]
    except TypeError as e:
        raise UnsupportedError(f"unknown dtype in {dtypes}: {e}") from None
    for n in names:
        if n not in DTYPES:
            raise UnsupportedError(f"dtype {n!r} is not supported (supported: "
                                   f"{', '.join(DTYPES)})")
    out = np.result_type(*names).name if names else "float32"
    if out not in DTYPES:
        raise UnsupportedError(f"the result dtype {out!r} of {names} is not supported")
    return out


def einsum_to_tc(spec: str, dtypes: list[str], ranks: list[int] | None = None) -> str:
    """The TC definition ``def einsum(...)`` that computes ``spec``."""
    operands, output = parse_spec(spec)
    if len(operands) != len(dtypes):
        raise SemanticError(f"einsum {spec!r} has {len(operands)} operand(s) but "
                            f"{len(dtypes)} dtypes were given")
    if output is None:
        output = _implicit_output(operands)
    _check_output(operands, output)
    nell = _ellipsis_dims(spec, operands, ranks)
    nb = max(nell, default=0)
    if nb and not any(lb == ELLIPSIS for lb, _ in output):
        col = spec.index("->") + 3
        raise _fail(f"the inputs have {nb} broadcast dim(s) under '...' but the output has "
                    f"no '...'", col)
    upper = any(lb.isupper() for op in operands for lb, _ in op)

    def dims(labels, n):  # (index names, size names) of an operand with n '...' dims
        idx: list[str] = []
        for lb, _ in labels:
            idx += [f"d{k}" for k in range(nb - n, nb)] if lb == ELLIPSIS else [lb]
        sizes = [("D" + i[1:]) if len(i) > 1 else (f"N_{i}" if upper else i.upper())
                 for i in idx]
        return idx, sizes

    out_dtype = _result_dtype(dtypes)
    params, reads = [], []
    for k, (op, dt, n) in enumerate(zip(operands, dtypes, nell)):
        idx, sizes = dims(op, n)
        dt = np.dtype(dt).name
        params.append(f"{dt}({','.join(sizes)}) X{k}" if sizes else f"{dt} X{k}")
        read = f"X{k}({','.join(idx)})" if idx else f"X{k}"
        reads.append(read if dt == out_dtype else f"{out_dtype}({read})")
    oidx, osizes = dims(output, nb)
    ret = f"{out_dtype}({','.join(osizes)}) out" if osizes else f"{out_dtype} out"
    lhs = f"out({','.join(oidx)})" if oidx else "out"
    reduced = {i for op, n in zip(operands, nell) for i in dims(op, n)[0]} - set(oidx)
    op = "+=!" if reduced else "="
    value = " * ".join(reads) if reads else "1"
    return (f"def einsum({', '.join(params)}) -> ({ret}) {{\n"
            f"  {lhs} {op} {value}\n}}\n")


def from_einsum(spec: str, dtypes: list[str], ranks: list[int] | None = None) -> Kernel:
    """The kernel of ``numpy.einsum(spec, X0, X1, ...)`` for inputs of ``dtypes``.

    ``ranks`` (the number of dims of each input) is needed only when ``spec`` has ``...``.
    An error in ``spec`` shows ``spec`` with a caret under the column.
    """
    try:
        text = einsum_to_tc(spec, dtypes, ranks)
    except CompileError as e:
        if e.line == 1 and "\n" not in spec:
            e.source_line = spec
        raise
    try:
        return from_tc(text, "einsum")
    except CompileError as e:
        e.source_line = None  # a line of the TC written here, not of the user's string
        raise
