"""The documented limits of ``polyc.limits`` and the errors a person can act on.

One test per class of bad input: each asserts the error class, the words (the limit's
name and value) and the location; those that once hung or crashed deep in the compiler
assert a (generous) wall-time bound too.
"""
from __future__ import annotations

import dataclasses
import os
import time

import numpy as np
import pytest

import polyc
from polyc import limits, pipeline
from polyc.codegen.runtime import check_array_sizes
from polyc.codegen.toolchain import MAX_STEM, file_stem
from polyc.errors import CallError, ParseError, SemanticError
from polyc.frontend import from_einsum, from_tc

SIG = "def f(float(N) A) -> (B) {\n"


def one(rhs: str, clauses: str = "") -> str:
    """A def whose one statement ``B(i) = rhs`` is line 2 (``rhs`` starts at 2:9)."""
    return f"{SIG} B(i) = {rhs}{clauses}\n}}"


class Timer:
    def __enter__(self):
        self.start = time.perf_counter()
        return self

    def __exit__(self, *exc):
        self.seconds = time.perf_counter() - self.start


def refused(source: str, cls, regex: str, seconds: float = 5.0):
    with Timer() as t, pytest.raises(cls, match=regex) as info:
        from_tc(source)
    assert t.seconds < seconds, f"refused after {t.seconds:.1f} s"
    return info.value


# -- statements, defs, tensors, names ---------------------------------------------------

def test_ten_thousand_statements_refused_at_once():
    body = "\n".join(f"T{k}(i) = A(i)" for k in range(10_000))
    e = refused(f"{SIG}{body}\nB(i) = A(i)\n}}", ParseError,
                r"^258:1: def 'f' has more than 256 statements .*the limit is 256 "
                r"\(polyc\.limits\.MAX_STATEMENTS\)")
    assert (e.line, e.col) == (258, 1) and e.source_line == "T256(i) = A(i)"


def test_statements_up_to_the_limit_are_accepted():
    n = limits.MAX_STATEMENTS
    body = "\n".join(f"T{k}(i) = A(i)" for k in range(n - 1))
    kernel = from_tc(f"{SIG}{body}\nB(i) = A(i)\n}}")
    assert len(kernel.statements) == n


def test_too_many_defs():
    src = "def f(float(N) A) -> (B) { B(i) = A(i) }\n" * (limits.MAX_DEFS + 5)
    refused(src, ParseError, r"^1025:1: more than 1024 defs .*polyc\.limits\.MAX_DEFS")


def test_too_many_tensors_in_a_def():
    params = ", ".join(f"float(N) A{k}" for k in range(limits.MAX_DEF_TENSORS))
    refused(f"def f({params}) -> (B) {{ B(i) = A0(i) }}", ParseError,
            r"^1:1: def 'f' has 1025 inputs and outputs; the limit is 1024 "
            r"\(polyc\.limits\.MAX_DEF_TENSORS\)")


def test_too_many_indices_on_the_left():
    idx = ",".join(f"i{k}" for k in range(40))
    e = refused(f"{SIG} B({idx}) = A(i0)\n}}", ParseError,
                r"^2:\d+: more than 32 indices; the limit is 32 \(polyc\.limits\.MAX_INDICES\)")
    assert e.source_line.lstrip().startswith("B(i0,")
    assert e.col == e.source_line.index("i32") + 1  # the 33rd index


def test_too_many_reduction_indices():
    reads = " * ".join(f"A(k{k})" for k in range(40))
    e = refused(f"{SIG} B(i) +=! A(i) * {reads}\n}}", SemanticError,
                r"^2:\d+: the statement has more than 32 indices \(with 'k31'\); the limit is "
                r"32 \(polyc\.limits\.MAX_INDICES\)")
    assert e.col == e.source_line.index("k31") + 1


def test_rank_limit():
    dims = ",".join(["N"] * 33)
    refused(f"def f(float({dims}) A) -> (B) {{ B(i) = A(i) }}", ParseError,
            r"^1:\d+: more than 32 dimensions; the limit is 32 \(polyc\.limits\.MAX_INDICES\)")


def test_name_length_limit():
    name = "f" * 5000
    refused(f"def {name}(float(N) A) -> (B) {{ B(i) = A(i) }}", ParseError,
            r"^1:5: name f{20}\.\.\. is 5000 characters long; the limit is 1024 "
            r"\(polyc\.limits\.MAX_NAME_LENGTH\)")


# -- expression depth ---------------------------------------------------------------------

DEEP = {
    "parentheses": lambda n: "(" * n + "A(i)" + ")" * n,
    "calls": lambda n: "exp(" * n + "A(i)" + ")" * n,
    "unary minus": lambda n: "-" * n + "A(i)",
    "ternaries": lambda n: "A(i) > 0 ? " * n + "A(i)" + " : 1.0" * n,
}


@pytest.mark.parametrize("kind", DEEP)
def test_ten_thousand_nested_levels_refused(kind):
    e = refused(one(DEEP[kind](10_000)), ParseError,
                r"^2:\d+: expression nested too deeply .*the limit is 128 "
                r"\(polyc\.limits\.MAX_EXPR_DEPTH\)")
    assert e.line == 2 and e.col > 9


def test_long_operator_chain_refused():
    refused(one(" + ".join(["A(i)"] * 10_000)), ParseError,
            r"^2:\d+: expression too deep \(10001 levels.*split it over several "
            r"statements\); the limit is 128 \(polyc\.limits\.MAX_EXPR_DEPTH\)")


@pytest.mark.parametrize("kind", DEEP)
def test_nesting_at_the_limit_compiles(kind):
    """Just under the limit, every pass (lowering, scheduling, C printing) stays within
    Python's recursion limit."""
    n = limits.MAX_EXPR_DEPTH - 3
    kernel = from_tc(one(DEEP[kind](n)))
    assert "B[" in pipeline.compile_kernel(kernel, polyc.Options(), build=False).c_source


def test_operator_chain_at_the_limit_runs():
    n = limits.MAX_EXPR_DEPTH - 2  # leaves A(i) are 2 deep: depth n + 1
    op = polyc.define(one(" + ".join(["A(i)"] * n)))
    x = np.arange(4, dtype=np.float32)
    np.testing.assert_allclose(op(x), n * x)


def test_let_bindings_that_double_are_refused():
    lets = ", ".join(f"x{k} = x{k - 1} + x{k - 1}" for k in range(1, 41))
    refused(one("x40", f" where x0 = A(i), {lets}"), SemanticError,
            r"^2:\d+: expression too large once its let-bindings are substituted "
            r"\(\d+ nodes\); the limit is 65536 \(polyc\.limits\.MAX_EXPR_NODES\)", 2.0)


def test_let_chain_too_deep_is_refused():
    lets = ", ".join(f"x{k} = x{k - 1}" for k in range(1, 1001))
    refused(one("x1000", f" where x0 = A(i), {lets}"), SemanticError,
            r"^2:\d+: let-bindings nested too deeply .*polyc\.limits\.MAX_EXPR_DEPTH", 2.0)


# -- empty defs -------------------------------------------------------------------------

@pytest.mark.parametrize("source,regex", [
    ("def f() -> () {}", r"^1:9: def 'f' has no outputs"),
    ("def f(float(N) A) -> () { }", r"^1:19: def 'f' has no outputs"),
    ("def f(float(N) A) -> (B) {}", r"^1:26: def 'f' has no statements"),
    ("def f(float(N) A) -> (B) {\n  # nothing\n}", r"^1:26: def 'f' has no statements"),
])
def test_empty_def(source, regex):
    refused(source, SemanticError, regex)


def test_scheduler_refuses_a_kernel_without_statements():
    kernel = dataclasses.replace(from_tc(one("A(i)")), statements=())
    with pytest.raises(SemanticError, match="kernel 'f' has no statements"):
        pipeline.compile_kernel(kernel, polyc.Options(), build=False)


# -- misspelt types, unknown names, carets ------------------------------------------------

@pytest.mark.parametrize("source,regex", [
    ("def f(flot(N) A) -> (B) { B(i) = A(i) }",
     r"^1:7: unknown type 'flot' \(did you mean 'float'\?\)"),
    ("def f(flot A) -> (B) { B = A }", r"^1:7: unknown type 'flot' \(did you mean 'float'\?\)"),
    ("def f(float(N) A) -> (dobule(N) B) { B(i) = A(i) }",
     r"^1:23: unknown type 'dobule' \(did you mean 'double'\?\)"),
    ("def f(qqq(N) A) -> (B) { B(i) = A(i) }",
     r"^1:7: unknown type 'qqq'; the types are bool, int2, .*float64, .*half, byte"),
])
def test_misspelt_type(source, regex):
    refused(source, ParseError, regex)


def test_caret_under_the_column():
    e = refused("def f(float(N) A) -> (B) {\n\tB(i) = Bb(i)\n}", SemanticError,
                r"^2:9: unknown tensor or function 'Bb' \(did you mean 'B'\?\)")
    lines = str(e).split("\n")
    assert lines[0] == "2:9: unknown tensor or function 'Bb' (did you mean 'B'?)"
    assert lines[1] == "    \tB(i) = Bb(i)"
    assert lines[2] == "    \t       ^"  # the tab is kept so the caret lines up
    assert e.bare_message.startswith("unknown tensor")


def test_einsum_error_points_into_the_string():
    with pytest.raises(ParseError) as info:
        from_einsum("ij,jk->iz", ["float32"] * 2)
    assert str(info.value).split("\n")[1:] == ["    ij,jk->iz", "            ^"]


# -- array sizes at call time -------------------------------------------------------------

OUTER = "def f(float(N) A) -> (B) { B(i,j) = A(i) * A(j) }"


@pytest.mark.parametrize("specialize", [True, False], ids=["specialized", "generic"])
def test_array_too_big_for_memory(specialize, monkeypatch):
    monkeypatch.delenv("POLYC_MAX_ARRAY_BYTES", raising=False)
    calls = []
    monkeypatch.setattr(np, "zeros", lambda *a, **k: calls.append(a))
    op = polyc.define(OUTER, specialize=specialize)
    with Timer() as t, pytest.raises(CallError, match=(
            r"^f: array 'B' of shape \(1048576, 1048576\) needs 4\.0 TiB \(1099511627776 "
            r"elements of float32\), more than the limit of [\d.]+ [GMT]iB \(polyc\.limits\."
            r"max_array_bytes\(\): this machine's memory\) with N=1048576$")):
        op(np.empty(2**20, np.float32))
    assert t.seconds < 5 and not calls  # refused before compiling or allocating


def test_array_bytes_limit_from_the_environment(monkeypatch):
    monkeypatch.setenv("POLYC_MAX_ARRAY_BYTES", "1000")
    op = polyc.define(OUTER)
    assert op(np.ones(15, np.float32)).shape == (15, 15)  # 900 bytes
    with pytest.raises(CallError, match=r"array 'B' of shape \(16, 16\) needs 1024 bytes "
                       r"\(256 elements of float32\), more than the limit of 1000 bytes"):
        op(np.ones(16, np.float32))


def test_array_elements_limit():
    op = polyc.define(OUTER)
    with pytest.raises(CallError, match=r"^f: array 'B' of shape \(33554432, 33554432\) has "
                       r"1125899906842624 elements; the limit is 281474976710656 = 2\*\*48 "
                       r"\(polyc\.limits\.MAX_ARRAY_ELEMENTS\)"):
        op(np.empty(2**25, np.float32))


def test_temporaries_count_towards_the_bytes_limit(monkeypatch):
    kernel = from_tc("def f(float(N) A) -> (C) {\n T(i,j) = A(i) * A(j)\n"
                     " C(i) +=! T(i,j)\n}")
    check_array_sizes(kernel, {"N": 10})
    monkeypatch.setenv("POLYC_MAX_ARRAY_BYTES", "420")
    with pytest.raises(CallError, match=r"the arrays a call allocates need 440 bytes together "
                       r"\(C 40 bytes, T 400 bytes\), more than the limit of 420 bytes "
                       r"\(polyc\.limits\.max_array_bytes\(\): set by POLYC_MAX_ARRAY_BYTES\)"):
        check_array_sizes(kernel, {"N": 10})


# -- cache file names -----------------------------------------------------------------------

def test_file_stem():
    assert file_stem("matmul") == "matmul"
    long_a, long_b = "k" * 300 + "a", "k" * 300 + "b"
    assert len(file_stem(long_a)) == MAX_STEM and file_stem(long_a) != file_stem(long_b)
    assert file_stem(long_a).startswith("k" * 40)
    assert "/" not in file_stem("../x/y") and file_stem("../x/y") != "../x/y"


def test_long_operator_name_compiles_with_a_short_cache_name(tmp_path):
    name = "op_" + "x" * 900
    op = polyc.define(f"def {name}(float(N) A) -> (B) {{ B(i) = A(i) * 2.0 }}",
                      cache_dir=str(tmp_path))
    np.testing.assert_allclose(op(np.ones(3, np.float32)), 2.0)
    files = os.listdir(tmp_path)
    assert files and all(len(f) < 120 for f in files), files
