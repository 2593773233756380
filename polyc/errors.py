"""The error tree of polyc.

User errors (something in the input or the call is wrong) derive from
:class:`CompileError` or :class:`CallError`; compiler bugs are
:class:`InternalError`; a failing C compiler is :class:`ToolchainError`.
"""
from __future__ import annotations


class PolycError(Exception):
    """Root of every error polyc raises on purpose."""


class CompileError(PolycError):
    """The input program is wrong or unsupported.

    ``line`` and ``col`` (1-based) locate the problem in the source when it has
    one; the message then starts with ``line:col:``.
    """

    def __init__(self, message: str, line: int | None = None, col: int | None = None,
                 source_name: str | None = None):
        self.bare_message = message
        self.line = line
        self.col = col
        self.source_name = source_name
        where = ""
        if line is not None:
            where = f"{line}:{col or 0}: "
            if source_name:
                where = f"{source_name}:{where}"
        super().__init__(where + message)


class ParseError(CompileError):
    """The text is not in the TC language (or not an einsum string)."""


class SemanticError(CompileError):
    """Parsed, but means nothing: unknown tensor, rank mismatch, bad type..."""


class RangeInferenceError(CompileError):
    """The range of an index cannot be inferred from the accesses or `where` clauses."""


class UnsupportedError(CompileError):
    """Valid input that polyc does not (yet) compile; the message says what and where."""


class ScheduleError(CompileError):
    """A schedule (given or computed) violates the dependences or is malformed."""


class CallError(PolycError, ValueError):
    """A compiled operator was called with arrays of the wrong dtype, rank or size."""


class ToolchainError(PolycError):
    """The C compiler failed. Carries the command, its stderr and where the source was kept."""

    def __init__(self, command: list[str], returncode: int, stderr: str, source_path: str):
        self.command = command
        self.returncode = returncode
        self.stderr = stderr
        self.source_path = source_path
        super().__init__(
            f"C compiler failed (exit {returncode}); source kept at {source_path}\n"
            f"command: {' '.join(command)}\n{stderr}")


class InternalError(PolycError):
    """A bug in polyc. Please report it with the input that caused it."""


class PolycWarning(UserWarning):
    """Something was compiled, but not as well as asked (e.g. an optimisation was dropped)."""
