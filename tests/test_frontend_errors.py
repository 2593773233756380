"""One row per user error of the TC and einsum frontends: (input, error class, message).

Every regex starts with the ``line:col:`` the message must carry (einsum strings are
line 1, the column is in the string).
"""
from __future__ import annotations

import pytest
from polyc.frontend import from_einsum, from_tc

from polyc.errors import (
    CompileError,
    ParseError,
    RangeInferenceError,
    SemanticError,
    UnsupportedError,
)


def body(*lines: str, sig: str = "float(N) A") -> str:
    """A def ``f(sig) -> (B)`` whose statements start on line 2."""
    return f"def f({sig}) -> (B) {{\n" + "\n".join(lines) + "\n}"


TC_ERRORS = [
    # syntax
    (body("B(i) -= A(i)"), ParseError, r"^2:6: unknown operator '-='"),
    (body("B(i) /= A(i)"), ParseError, r"^2:6: unknown operator '/='"),
    (body("B(i) <= A(i)"), ParseError, r"^2:6: expected an assignment operator .* found '<='"),
    (body("B(i) = A(i) +* 2"), ParseError, r"^2:14: expected an expression, found '\*'"),
    (body("B(i+1) = A(i)"), ParseError, r"^2:4: expected '\)', found '\+'"),
    (body("B(i) = A(i) $"), ParseError, r"^2:13: unexpected character '\$'"),
    (body("B(i) = A(i) * <sh>"), ParseError, r"^2:15: expected an expression, found '<'"),
    ("def f(float(N) A) -> (B) { B(i) = A(i)", ParseError, r"^1:39: .* found end of input"),
    ("def f(float(N) A) -> (B) { B(i) = A(i) where i 0:N }", ParseError,
     r"^1:48: expected 'in' or '=' in a where clause"),
    ("def (float(N) A) -> (B) {}", ParseError, r"^1:5: expected the name of the def"),
    ("def f(float(N) A) -> (B) { B(i) = A.x }", ParseError,
     r"^1:37: expected a dimension number after 'A.'"),
    (body("B(i) = float(A(i), 2)"), ParseError, r"^2:8: a cast to float takes one argument, "
     r"found 2"),
    ("def f(flot(N) A) -> (B) { B(i) = A(i) }", ParseError,
     r"^1:7: unknown type 'flot' \(did you mean 'float'\?\)"),
    ("def f(float(N) A) -> (int33(N) B) { B(i) = A(i) }", ParseError,
     r"^1:23: unknown type 'int33' \(did you mean 'int32'\?\)"),
    ("def f(float(N) A) -> (B) { B(i) = A(i) ", ParseError,
     r"^1:40: expected a statement .* or '}', found end of input"),
    ("def f(float(N A) -> (B) { B(i) = A(i) }", ParseError, r"^1:15: expected '\)', found 'A'"),
    # empty defs
    ("def f() -> () {}", SemanticError, r"^1:9: def 'f' has no outputs"),
    ("def f(float(N) A) -> (B) {}", SemanticError, r"^1:26: def 'f' has no statements"),
    # names, ranks, operators
    (body("B(i) = Bb(i)"), SemanticError,
     r"^2:8: unknown tensor or function 'Bb' \(did you mean 'B'\?\)"),
    (body("B(i) = sqr(A(i))"), SemanticError,
     r"^2:8: unknown tensor or function 'sqr' \(did you mean 'sqrt'\?\)"),
    (body("B(i) = A(i) + AA.0"), SemanticError,
     r"^2:15: unknown tensor 'AA' \(did you mean 'A'\?\)"),
    (body("B(i) = A(i) where exists AA(i)"), SemanticError,
     r"^2:26: unknown tensor 'AA' in exists clause \(did you mean 'A'\?\)"),
    (body("B(i) = A(i) where i in 0:NN", sig="float(NN1) A"), SemanticError,
     r"^2:26: range bound NN uses 'NN', which is not a size of the signature "
     r"\(did you mean 'NN1'\?\)"),
    (body("B(i) = C(i)"), SemanticError, r"^2:8: unknown tensor or function 'C'"),
    (body("B(i) = foo(A(i))"), SemanticError, r"^2:8: unknown tensor or function 'foo'"),
    (body("B(i) = exp(A(i), 2)"), SemanticError, r"^2:8: exp takes 1 argument\(s\), got 2"),
    (body("B(i) = A(i) + C(i)", "C(i) = A(i)"), SemanticError,
     r"^2:15: unknown tensor or function 'C'"),
    (body("B(i) = A(i)", sig="float(N,M) A"), SemanticError,
     r"^2:8: 'A' has rank 2 but is accessed with 1 index\(es\)"),
    (body("B(i) = A"), SemanticError, r"^2:8: 'A' has rank 1 but is accessed with 0"),
    (body("B(i) = A(i)", "B(i, j) = A(i)"), SemanticError,
     r"^3:1: 'B' has rank 1 but is written with 2 indices"),
    (body("B(i) = A(i, j)", sig="float(N,M) A"), SemanticError,
     r"^2:13: 'j' is not a tensor, a size or an index of the left-hand side: `=` cannot "
     r"reduce over it \(use a reduction such as `\+=!`\)"),
    (body("A(i) = 1.0 where i in 0:N", "B(i) = A(i)"), SemanticError,
     r"^2:1: cannot write to input 'A'"),
    (body("B(N) = A(N)"), SemanticError,
     r"^2:3: 'N' is a size; it cannot be used as an index on the left-hand side"),
    (body("B(i, i) = A(i)"), SemanticError, r"^2:6: index 'i' appears twice"),
    (body("B(A) = 1.0"), SemanticError, r"^2:3: 'A' is a tensor; it cannot be used as an index"),
    (body("N(i) = A(i)"), SemanticError, r"^2:1: 'N' is a size, not a tensor"),
    (body("B(i) = A(i)", sig="float(N) A, float(N) A"), SemanticError,
     r"^1:28: duplicate name 'A' in the signature of 'f'"),
    ("def f(float(N) A) -> (A) { A(i) = 1 }", SemanticError, r"^1:23: duplicate name 'A'"),
    (body("B(i) = A(i)", sig="float(N) A, float(A) C"), SemanticError,
     r"^1:25: 'A' is both a size and a tensor"),
    ("def f(float(N) A) -> (B) { B(i) = A(i) }\ndef f(float(N) A) -> (B) { B(i) = A(i) }",
     SemanticError, r"^2:1: duplicate def 'f'"),
    ("def f(float(N) A) -> (B, C) {\nB(i) = A(i)\n}", SemanticError,
     r"^1:26: output 'C' is never written"),
    (body("B(i) = A(i) where q in 0:N"), SemanticError,
     r"^2:19: where clause ranges 'q', which is not an index of the statement"),
    (body("B(i) = A(i) where i in 0:j"), SemanticError,
     r"^2:26: range bound j uses 'j', which is not a size of the signature"),
    (body("B(i) = A(i) where i in 0:N*N"), SemanticError,
     r"^2:26: range bound \(N \* N\) is not an affine expression of sizes"),
    (body("B(i) = A(i) + A.3"), SemanticError, r"^2:15: 'A' has rank 1, it has no dimension 3"),
    (body("B(i) = x where x = x + 1"), SemanticError, r"^2:20: let-binding 'x' refers to itself"),
    (body("B(i) = A(i) where A = 1"), SemanticError, r"^2:19: let-binding 'A' hides"),
    (body("B(i) = A(i) where exists A(q)"), SemanticError,
     r"^2:28: index 'q' of an exists clause is not used by the statement"),
    (body("B(i) = A(i) where exists Z(i)"), SemanticError,
     r"^2:26: unknown tensor 'Z' in exists clause"),
    (body("B(i) = N(i)"), SemanticError, r"^2:8: 'N' is not a tensor or a function"),
    ("def f(float(N) A) -> (B, C) {\nB(i) = C(i)\nC(i) = A(i)\n}", SemanticError,
     r"^2:8: tensor 'C' is read before it is written"),
    (body("B(i) = A(i)", sig="float(0) A"), SemanticError, r"^1:13: a literal size must be "),
    # range inference
    (body("B(i) = 1.0"), RangeInferenceError,
     r"^2:3: cannot infer the range of index 'i'; add `where i in 0:N`"),
    (body("B(i) +=! A(i) * k"), RangeInferenceError,
     r"^2:17: cannot infer the range of index 'k'"),
    (body("B(i) +=! A(i / 2)"), RangeInferenceError, r"^2:3: cannot infer the range of index 'i'"),
    ("def f(float(N) A) -> (float(N) B) {\nB(i) = A(0) where i in 0:N+1\n}",
     RangeInferenceError, r"^2:1: the statement writes 'B' outside its shape \(N\)"),
    # unsupported
    (body("B(i) = A(I(i))", sig="float(N) A, int32(N) I"), UnsupportedError,
     r"^2:10: indirect index I\(i\): it reads tensor 'I'"),
    (body("B(i) +=! A(i * j)"), UnsupportedError, r"^2:12: non-affine index \(i \* j\)"),
    (body("B(i) +=! A(i / j)"), UnsupportedError, r"^2:12: non-affine index \(i / j\)"),
    (body("B(i) = A(i * 0.5)"), UnsupportedError, r"^2:10: non-affine index"),
    (body("B(i) = A(i)", sig="float(mod) A"), UnsupportedError,
     r"^1:13: size name 'mod' is reserved \(in isl or C\)"),
    (body("B(floor) = A(floor)"), UnsupportedError, r"^2:3: index name 'floor' is reserved"),
    (body("B(i) +=! A(i) * A(rat)"), UnsupportedError, r"^2:19: index name 'rat' is reserved"),
    (body("int(i) = A(i)"), UnsupportedError, r"^2:1: tensor name 'int' is reserved"),
    (body("B(i) = erfinv(A(i))"), UnsupportedError,
     r"^2:8: built-in function 'erfinv' is not supported by polyc"),
]


@pytest.mark.parametrize("source,cls,regex", TC_ERRORS)
def test_tc_error(source, cls, regex):
    with pytest.raises(cls, match=regex) as info:
        from_tc(source, "f")
    e = info.value
    assert e.line is not None and e.col is not None
    # the source line follows the message, with a caret under the column
    assert e.source_line == source.split("\n")[e.line - 1]
    first, shown, caret = str(e).split("\n")
    assert first.startswith(f"{e.line}:{e.col}: ") and shown == "    " + e.source_line
    assert caret == "    " + " " * (e.col - 1) + "^"


def test_def_selection_errors():
    two = "def a(float(N) X) -> (Y) { Y(i) = X(i) }\ndef b(float(N) X) -> (Y) { Y(i) = X(i) }"
    with pytest.raises(SemanticError, match=r"several defs \(a, b\); pass name="):
        from_tc(two)
    with pytest.raises(SemanticError, match=r"no def named 'c'; the source has: a, b"):
        from_tc(two, "c")
    with pytest.raises(SemanticError, match=r"no def"):
        from_tc("# nothing here\n")


EINSUM_ERRORS = [
    ("ij,jk->iz", 2, None, ParseError, r"^1:9: bad einsum string: output label 'z' is not in"),
    ("ij->ii", 1, None, ParseError, r"^1:6: .*output label 'i' appears more than once"),
    ("ij->i->j", 1, None, ParseError, r"^1:6: .*'->' appears twice"),
    ("i1", 1, None, ParseError, r"^1:2: .*unexpected character '1'"),
    ("ij.k", 1, None, ParseError, r"^1:3: .*unexpected character '\.'"),
    ("i-j", 1, None, ParseError, r"^1:2: .*unexpected character '-'"),
    ("i->,", 1, None, ParseError, r"^1:4: .*unexpected ',' in the output"),
    ("......i", 1, [3], ParseError, r"^1:4: .*'\.\.\.' appears twice in one operand"),
    ("...i->i", 1, [2], ParseError, r"^1:7: .*broadcast dim\(s\) under '\.\.\.' but the output"),
    ("ij,jk", 1, None, SemanticError, r"has 2 operand\(s\) but 1 dtypes"),
    ("...i", 1, None, SemanticError, r"uses '\.\.\.': pass ranks="),
    ("ij,k", 2, [3, 1], SemanticError, r"operand 0 of einsum 'ij,k' has rank 3"),
    ("ij", ["complex64"], None, UnsupportedError, r"dtype 'complex64' is not supported"),
]


@pytest.mark.parametrize("spec,dtypes,ranks,cls,regex", EINSUM_ERRORS)
def test_einsum_error(spec, dtypes, ranks, cls, regex):
    if isinstance(dtypes, int):
        dtypes = ["float32"] * dtypes
    with pytest.raises(cls, match=regex):
        from_einsum(spec, dtypes, ranks)


def test_every_error_is_a_compile_error():
    for _, cls, _ in TC_ERRORS:
        assert issubclass(cls, CompileError)
