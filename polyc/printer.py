"""Human-readable text of IR records (for POLYC_DUMP, messages and golden tests)."""
from __future__ import annotations

from . import expr as E
from .ir import Kernel, Statement


def show_statement(s: Statement) -> str:
    w = E.show(E.Read(s.write.array, s.write.indices))
    op = "=" if s.op == "=" else f"{s.op}="
    return f"{s.name}: {w} {op} {E.show(s.value)}    # {s.domain}"


def show_kernel(k: Kernel) -> str:
    lines = [f"kernel {k.name}({', '.join(k.inputs)}) -> ({', '.join(k.outputs)})",
             f"  sizes: {', '.join(k.sizes) or '-'}    context: {k.context}"]
    for a in k.arrays:
        dims = ", ".join(E.show(d) for d in a.shape)
        lines.append(f"  {a.role:6} {a.dtype}({dims}) {a.name}")
    lines += ["  " + show_statement(s) for s in k.statements]
    return "\n".join(lines)
