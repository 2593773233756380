"""The names of the schedule's mark nodes that carry a decision from the scheduler to
the checks and to code generation: written in one place, read in one place.

Both sides of the pipeline import this module (the scheduler writes the names, the
checks and code generation parse them); it depends on nothing but the standard library.

``register:<statement>:<box>:<bits>[q][:<init>[:<epilogue>]]``
    the statement's write footprint below the mark lives in a local accumulator of
    ``box`` elements (``"register:S1:8,64:512"``); ``bits``: the vector width the tile
    was sized for, ending in ``q`` when the statement is a byte dot product written with
    ``vpdpbusd``; ``init``: the initialisation statement whose constant the accumulator
    starts from; ``epilogue``: the pointwise statement the copy-out runs
    (:mod:`polyc.schedule.register_tile`).
``private:<positions>``
    the mark above a fused loop whose threads may each add into their own copy of the
    arrays at these positions of the kernel's arrays (``private:3,5``; positions, since a
    model's names may hold any character); ``private:`` alone names none
    (:mod:`polyc.schedule.fuse`): an OpenMP array reduction in C.

Code generation tags a mark with the schedule depth of its band (``"private:3@2"``);
the parsers here read a name with or without that tag.
"""
from __future__ import annotations

from dataclasses import dataclass

REGISTER = "register"
PRIVATE = "private:"


@dataclass(frozen=True)
class RegisterMark:
    """A parsed ``register`` mark."""
    stmt: str
    box: tuple[int, ...]
    bits: int
    init: str = ""
    epilogue: str = ""
    quad: bool = False

    @property
    def name(self) -> str:
        head = f"{REGISTER}:{self.stmt}:{','.join(map(str, self.box))}:{self.bits}" \
            f"{'q' if self.quad else ''}"
        if self.epilogue:
            return f"{head}:{self.init}:{self.epilogue}"
        return f"{head}:{self.init}" if self.init else head


def register_mark(name: str) -> RegisterMark | None:
    """The :class:`RegisterMark` of a mark's name; None for another mark."""
    parts = name.split(":")
    if len(parts) not in (4, 5, 6) or parts[0] != REGISTER:
        return None
    bits = parts[3]
    try:
        return RegisterMark(parts[1], tuple(int(s) for s in parts[2].split(",")),
                            int(bits[:-1] if bits.endswith("q") else bits),
                            parts[4] if len(parts) >= 5 else "",
                            parts[5] if len(parts) == 6 else "", bits.endswith("q"))
    except ValueError:
        return None


def private_mark(positions: list[int] | tuple[int, ...]) -> str:
    """``"private:3,5"`` for the arrays at positions 3 and 5 of the kernel's arrays."""
    return PRIVATE + ",".join(map(str, positions))


def private_positions(name: str) -> list[int] | None:
    """The array positions of a ``private:`` mark's name (``[]`` for ``"private:"``);
    None for another mark."""
    if not name.startswith(PRIVATE):
        return None
    rest = name[len(PRIVATE):].partition("@")[0]
    parts = rest.split(",") if rest else []
    return [int(x) for x in parts] if all(x.isdigit() for x in parts) else None
