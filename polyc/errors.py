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
    one; the message then starts with ``line:col:``. ``source_line``, when the frontend
    knows it, is the text of that line: ``str(err)`` then shows it on a second line with
    a caret under the column on a third (the first line stays ``line:col: message``).
    """

    def __init__(self, message: str, line: int | None = None, col: int | None = None,
                 source_name: str | None = None, source_line: str | None = None):
        self.bare_message = message
        self.line = line
        self.col = col
        self.source_name = source_name
        self.source_line = source_line
        where = ""
        if line is not None:
            where = f"{line}:{col or 0}: "
            if source_name:
                where = f"{source_name}:{where}"
        super().__init__(where + message)

    def attach_source(self, source: str) -> CompileError:
        """Set :attr:`source_line` from the whole ``source`` text (if not set yet)."""
        if self.source_line is None and self.line is not None:
            lines = source.split("\n")
            if 1 <= self.line <= len(lines):
                self.source_line = lines[self.line - 1]
        return self

    def __str__(self) -> str:
        text = super().__str__()
        return text + show_caret(self.source_line, self.col) if self.source_line else text


def show_caret(source_line: str | None, col: int | None) -> str:
    """``source_line`` and a caret under column ``col`` (1-based) as two lines, each
    after a newline; tabs before the column are kept so that the caret lines up."""
    if source_line is None:
        return ""
    text = source_line.rstrip("\r\n")
    if len(text) > 200:  # a very long line: show the part around the column
        start = max(0, (col or 1) - 100)
        text, col = text[start:start + 200], (col or 1) - start
    pad = "".join("\t" if ch == "\t" else " " for ch in text[:max(0, (col or 1) - 1)])
    return f"\n    {text}\n    {pad}^"


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


class RunError(CallError):
    """A run of a compiled model failed on the values of its inputs (an index out of
    range); the message is the library's ``<model>_last_error()``: it names the node."""

    def __init__(self, message: str, status: int):
        self.status = status
        super().__init__(message)


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
