"""Running one fuzz case against polyc, classifying the outcome, and shrinking failures.

:func:`execute` runs the interpreter (the oracle) and polyc on a :class:`gen.Case` and
returns an :class:`Outcome`: ``ok``, ``invalid`` (the interpreter rejects the program:
says nothing about polyc), ``wrong`` (a result differs: values, shape or dtype),
``crash`` (polyc raised something that is not a :class:`polyc.CompileError`),
``refusal`` (a ``CompileError`` on a program the interpreter runs). :func:`shrink`
minimises a failing case (drops defs, statements, outputs, clauses; simplifies
expressions; shrinks sizes and data; resets options) while it fails the same way, and
:func:`write_reproducer` writes a small self-contained Python file.
"""
from __future__ import annotations

import dataclasses
import pprint
import re
import time
import traceback
from dataclasses import dataclass, field, replace

import numpy as np

try:
    from . import gen as G
    from . import interp as I
except ImportError:  # run as a script from tests/fuzz
    import gen as G  # type: ignore
    import interp as I  # type: ignore


@dataclass
class Outcome:
    kind: str                       # ok, invalid, wrong, crash, refusal
    message: str = ""
    expected: list = field(default_factory=list)
    stable: list = field(default_factory=list)
    actual: list = field(default_factory=list)
    detail: str = ""

    @property
    def failed(self) -> bool:
        return self.kind in ("wrong", "crash", "refusal")

    def signature(self) -> tuple:
        """What "fails the same way" means while shrinking."""
        return (self.kind, normalize(self.message))


def normalize(message: str) -> str:
    """A message with positions, names and numbers taken out (to group failures)."""
    m = message.splitlines()[0] if message else ""
    m = re.sub(r"^\d+:\d+: ", "", m)
    m = re.sub(r"'[^']*'", "'_'", m)
    m = re.sub(r"\([^()]*\)", "(_)", m)
    m = re.sub(r"\b\d+\b", "N", m)
    return m[:160]


def oracle(case: G.Case):
    """(expected outputs, stable masks, dtypes) or raises I.Invalid."""
    if case.einsum:
        with np.errstate(all="ignore"):
            try:
                np.einsum(case.einsum, *case.inputs)
            except ValueError as e:
                raise I.Invalid(f"numpy rejects the einsum: {e}") from None
            exp = np.einsum(case.einsum, *case.inputs)
            wide = np.einsum(case.einsum, *[a.astype(np.float64) if a.dtype.kind == "f" else a
                                            for a in case.inputs])
        dt = str(np.asarray(exp).dtype)
        return [np.asarray(exp)], [I.stable_mask(exp, wide, dt)], [dt]
    d = case.entry_def
    with np.errstate(all="ignore"):
        exp, dts = I.run(d, case.inputs)
        wide, _ = I.run(d, case.inputs, wide=True)
    return exp, [I.stable_mask(e, w, t) for e, w, t in zip(exp, wide, dts)], dts


def run_polyc(case: G.Case):
    """polyc's outputs for the case. A PolycWarning (an optimisation given up, such as
    fusion past the scheduler's budget) is not a failure: the result is still checked."""
    import warnings

    import polyc
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", polyc.errors.PolycWarning)
        if case.einsum:
            return [polyc.einsum(case.einsum, *case.inputs, **case.options)]
        op = polyc.define(case.source, name=case.entry if len(case.defs) > 1 else None,
                          **case.options)
        out = op(*case.inputs)
    return list(out) if isinstance(out, tuple) else [out]


#: seconds polyc may take on one case (compile and run); more is reported as a crash
TIMEOUT_S = 60


def _with_timeout(fn, seconds):
    import signal
    import threading
    if threading.current_thread() is not threading.main_thread():
        return fn()

    def alarm(signum, frame):
        raise TimeoutError

    old = signal.signal(signal.SIGALRM, alarm)
    signal.alarm(seconds)
    try:
        return fn()
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, old)


def execute(case: G.Case) -> Outcome:
    try:
        expected, stable, dtypes = oracle(case)
    except I.Invalid as e:
        return Outcome("invalid", str(e))
    import polyc
    try:
        actual = _with_timeout(lambda: run_polyc(case), TIMEOUT_S)
    except TimeoutError:
        return Outcome("crash", f"timeout: polyc took more than {TIMEOUT_S} s", expected, stable)
    except polyc.CompileError as e:
        if "outside its shape" in str(e):
            # polyc checks writes for every value of the sizes; the generator checks a
            # sample of sizes only, so a program valid for these sizes may still be refused
            return Outcome("invalid", f"sizes-dependent write refused: {e}")
        if " out of bounds: " in str(e) and not case.options.get("specialize", True):
            # likewise every access (check_accesses_in_bounds), but specialised to these
            # sizes such a refusal is a disagreement with the interpreter, and a failure
            return Outcome("invalid", f"sizes-dependent access refused: {e}")
        return Outcome("refusal", f"{type(e).__name__}: {e}", expected, stable,
                       detail=traceback.format_exc(limit=-4))
    except Exception as e:  # noqa: BLE001 - any other exception is a compiler crash
        msg = f"{type(e).__name__}: {e}"
        return Outcome("crash", msg, expected, stable, detail=traceback.format_exc())
    actual = [np.asarray(a) for a in actual]
    out = Outcome("ok", "", expected, stable, actual)
    if len(actual) != len(expected):
        out.kind, out.message = "wrong", f"{len(actual)} outputs, expected {len(expected)}"
        return out
    for k, (e, s, a, dt) in enumerate(zip(expected, stable, actual, dtypes)):
        if a.shape != e.shape:
            out.kind, out.message = "wrong", f"output {k}: shape {a.shape}, expected {e.shape}"
            return out
        if str(a.dtype) != dt:
            out.kind, out.message = "wrong", f"output {k}: dtype {a.dtype}, expected {dt}"
            return out
        bad = I.compare(e, s, a, dt)
        if bad:
            out.kind = "wrong"
            out.message = f"output {k}: {len(bad)} of {e.size} elements differ"
            out.detail = "; ".join(f"{i}: expected {x!r}, got {y!r}" for i, x, y in bad[:8])
            return out
    return out


# -- shrinking --------------------------------------------------------------------------------

def _subexprs(e):
    return list(G.walk(e))


def _children(e):
    if isinstance(e, (I.Un, I.Cast)):
        return [e.x]
    if isinstance(e, I.Bin):
        return [e.a, e.b]
    if isinstance(e, I.Tern):
        return [e.a, e.b, e.c]
    if isinstance(e, I.Call):
        return list(e.args)
    return []


def _expr_candidates(e):
    """Simpler versions of ``e``: a node replaced by a child or by a small literal."""
    out = []
    for node in _subexprs(e):
        for ch in _children(node):
            out.append(G.replace_node(e, node, ch))
        if not isinstance(node, (I.Num, I.Name)) and not (
                isinstance(node, I.Read) and all(isinstance(a, I.Name) for a in node.args)):
            out.append(G.replace_node(e, node, I.Num(1.0)))
        if isinstance(node, I.Read):
            args = tuple(next((x for x in G.walk(a) if isinstance(x, I.Name)), a)
                         for a in node.args)
            if args != node.args:
                out.append(G.replace_node(e, node, I.Read(node.tensor, args)))
    return out


def _def_candidates(d: I.Def):
    body = list(d.body)
    for k in range(len(body)):                      # drop a statement
        yield replace(d, body=tuple(body[:k] + body[k + 1:]))
    if len(d.rets) > 1:                             # drop an output (and what writes it)
        for r in d.rets:
            yield replace(d, rets=tuple(x for x in d.rets if x is not r),
                          body=tuple(s for s in body if s.tensor != r.name))
    for k, s in enumerate(body):                    # drop clauses, `!`, simplify the RHS
        def put(st):
            return replace(d, body=tuple(body[:k] + [st] + body[k + 1:]))
        for c in range(len(s.clauses)):
            yield put(replace(s, clauses=s.clauses[:c] + s.clauses[c + 1:]))
        for c, cl in enumerate(s.clauses):
            if isinstance(cl, I.LetC):   # inline the let
                rhs = _substitute(s.rhs, cl.name, cl.value)
                yield put(replace(s, rhs=rhs, clauses=s.clauses[:c] + s.clauses[c + 1:]))
        for rhs in _expr_candidates(s.rhs):
            yield put(replace(s, rhs=rhs))


def _substitute(e, name, value):
    for node in list(G.walk(e)):
        if isinstance(node, I.Name) and node.name == name:
            e = G.replace_node(e, node, value)
    return e


def _size_candidates(case: G.Case):
    """Smaller inputs: each size variable (or literal-free dim) reduced."""
    if case.einsum:
        return
    d = case.entry_def
    sizes = {}
    for p, a in zip(d.params, case.inputs):
        for dm, n in zip(p.dims or (), a.shape):
            if isinstance(dm, str):
                sizes[dm] = n
    for name, n in sizes.items():
        for new in sorted({1, n // 2, n - 1}):
            if not 1 <= new < n:
                continue
            inputs = []
            for p, a in zip(d.params, case.inputs):
                sl = tuple(slice(0, new) if dm == name else slice(None) for dm in (p.dims or ()))
                inputs.append(np.ascontiguousarray(a[sl]))
            yield replace(case, inputs=inputs)


def _data_candidates(case: G.Case):
    for k, a in enumerate(case.inputs):
        if a.size and a.dtype != bool and np.any(a != 1):
            inputs = list(case.inputs)
            inputs[k] = np.ones_like(a)
            yield replace(case, inputs=inputs)


def _option_candidates(case: G.Case):
    defaults = {"fusion": "smart", "tile": True, "specialize": True, "threads": 1,
                "register_tile": True, "gpu_register_tile": True, "gpu_block": None,
                "scheduler": "isl"}
    for k, v in case.options.items():
        if defaults.get(k, v) != v:
            yield replace(case, options={**case.options, k: defaults[k]})


def _case_candidates(case: G.Case):
    if not case.einsum and len(case.defs) > 1:
        yield replace(case, defs=[case.entry_def])
    yield from _option_candidates(case)
    if not case.einsum:
        d = case.entry_def
        for nd in _def_candidates(d):
            yield replace(case, defs=[nd if x is d else x for x in case.defs])
    yield from _size_candidates(case)
    yield from _data_candidates(case)


def _remove_unused_inputs(case):
    """Inputs no statement reads are dropped from the signature too."""
    if case.einsum:
        return case
    d = case.entry_def
    src = I.show_source([replace(d, params=())])
    keep = [k for k, p in enumerate(d.params) if re.search(rf"\b{p.name}\b", src)]
    if len(keep) == len(d.params):
        return case
    nd = replace(d, params=tuple(d.params[k] for k in keep))
    return replace(case, defs=[nd if x is d else x for x in case.defs],
                   inputs=[case.inputs[k] for k in keep])


def shrink(case: G.Case, outcome: Outcome, budget_s: float = 120.0, log=None):
    """The smallest case found that fails with the same signature (and its outcome)."""
    sig = outcome.signature()
    t0 = time.time()
    best, best_out = case, outcome
    progress = True
    tried = 0
    while progress and time.time() - t0 < budget_s:
        progress = False
        for cand in _case_candidates(best):
            if time.time() - t0 > budget_s:
                break
            tried += 1
            for c in (_remove_unused_inputs(cand), cand):
                try:
                    out = execute(c)
                except Exception:  # noqa: BLE001 - a candidate the tools cannot handle
                    continue
                if out.signature() == sig:
                    best, best_out = c, out
                    progress = True
                    break
            if progress:
                if log:
                    log(f"  shrink: {len(best.source)} chars after {tried} tries")
                break
    return best, best_out


# -- reproducers --------------------------------------------------------------------------------

def _arr(a) -> str:
    a = np.asarray(a)
    text = f"np.array({a.tolist()!r}, dtype={str(a.dtype)!r})".replace("nan", "float('nan')") \
        .replace("inf", "float('inf')")
    # an empty array's list loses the extents after the zero one: keep the shape
    return f"{text}.reshape({a.shape!r})" if a.size == 0 else text


TEMPLATE = '''"""polyc fuzz reproducer ({kind}): {message}

seed {seed}; found by tests/fuzz (python3 tests/fuzz/campaign.py). Run: python3 {{this file}}
{detail}"""
import numpy as np

SOURCE = {source!r}
ENTRY = {entry!r}
EINSUM = {einsum!r}
OPTIONS = {options!r}
INPUTS = [{inputs}]
#: the interpreter's outputs (tests/fuzz/interp.py) and where they are numerically stable
EXPECTED = [{expected}]
STABLE = [{stable}]
KIND = {kind!r}
MESSAGE = {message!r}
#: set to a string while the bug is known and not fixed (the regression test then xfails)
OPEN = {open!r}


def run():
    import polyc
    if EINSUM:
        return [polyc.einsum(EINSUM, *INPUTS, **OPTIONS)]
    out = polyc.define(SOURCE, name=ENTRY, **OPTIONS)(*INPUTS)
    return list(out) if isinstance(out, tuple) else [out]


def check():
    """Raises AssertionError (or polyc's error) while the bug is there."""
    actual = run()
    assert len(actual) == len(EXPECTED), (len(actual), len(EXPECTED))
    for k, (e, s, a) in enumerate(zip(EXPECTED, STABLE, actual)):
        a = np.asarray(a)
        assert a.shape == e.shape, f"output {{k}}: shape {{a.shape}}, expected {{e.shape}}"
        assert a.dtype == e.dtype, f"output {{k}}: dtype {{a.dtype}}, expected {{e.dtype}}"
        if e.dtype.kind == "f":
            ok = np.isclose(a, e, rtol=2e-3, atol=1e-4, equal_nan=True) | (a == e) | ~s
        else:
            ok = (a == e) | ~s
        assert ok.all(), f"output {{k}}: expected\\n{{e}}\\ngot\\n{{a}}"


if __name__ == "__main__":
    check()
    print("ok")
'''


def run_reproducer(mod):
    """polyc's outputs for a reproducer module's case (its SOURCE or EINSUM, ENTRY,
    OPTIONS and INPUTS), as the written reproducers' ``run()`` computes them."""
    import polyc
    if mod.EINSUM:
        return [polyc.einsum(mod.EINSUM, *mod.INPUTS, **mod.OPTIONS)]
    out = polyc.define(mod.SOURCE, name=mod.ENTRY, **mod.OPTIONS)(*mod.INPUTS)
    return list(out) if isinstance(out, tuple) else [out]


def check_reproducer(mod):
    """Raises AssertionError (or polyc's error) while the reproducer's bug is there: the
    check of the written reproducers' ``check()``, for the data-only files kept in
    ``tests/fuzz/regressions/``."""
    actual = run_reproducer(mod)
    assert len(actual) == len(mod.EXPECTED), (len(actual), len(mod.EXPECTED))
    for k, (e, s, a) in enumerate(zip(mod.EXPECTED, mod.STABLE, actual)):
        a = np.asarray(a)
        assert a.shape == e.shape, f"output {k}: shape {a.shape}, expected {e.shape}"
        assert a.dtype == e.dtype, f"output {k}: dtype {a.dtype}, expected {e.dtype}"
        if e.dtype.kind == "f":
            ok = np.isclose(a, e, rtol=2e-3, atol=1e-4, equal_nan=True) | (a == e) | ~s
        else:
            ok = (a == e) | ~s
        assert ok.all(), f"output {k}: expected\n{e}\ngot\n{a}"


def reproducer_text(case: G.Case, out: Outcome, open_reason=None) -> str:
    detail = ""
    if out.detail:
        detail = "\n" + "\n".join("    " + ln for ln in out.detail.strip().splitlines()[-12:]) + "\n"
    return TEMPLATE.format(
        kind=out.kind, message=out.message.replace('"""', "'''"), seed=case.seed,
        detail=detail.replace('"""', "'''").replace("\\", "/"),
        source=case.source, entry=case.entry or None, einsum=case.einsum,
        options=case.options, inputs=", ".join(_arr(a) for a in case.inputs),
        expected=", ".join(_arr(a) for a in out.expected),
        stable=", ".join(_arr(a) for a in out.stable), open=open_reason)


def write_reproducer(case: G.Case, out: Outcome, directory: str, open_reason=None) -> str:
    import hashlib
    import os
    os.makedirs(directory, exist_ok=True)
    text = reproducer_text(case, out, open_reason)
    h = hashlib.sha1((case.source + str(case.einsum)).encode()).hexdigest()[:8]
    path = os.path.join(directory, f"{out.kind}_{case.seed}_{h}.py")
    with open(path, "w") as f:
        f.write(text)
    return path
