"""Random valid TC programs (and einsum specs) for differential fuzzing; deterministic per seed.

:func:`case` returns a :class:`Case`: the ASTs of one to three ``def`` (one is picked by
name), numpy inputs, and compiler options. Every statement is checked by the interpreter
(:mod:`.interp`) as it is generated: a candidate the interpreter calls invalid (an index
it cannot range, an out-of-bounds guarded read, integer overflow...) is replaced by
another, so the programs produced are valid by construction and by check.
"""
from __future__ import annotations

import copy
import os
import random
from dataclasses import dataclass, field

import numpy as np

try:
    from . import interp as I
except ImportError:  # run as a script from tests/fuzz
    import interp as I  # type: ignore

SIZE_NAMES = ["M", "N", "K", "P", "Q", "R"]
INPUT_NAMES = ["A", "B", "X", "Y", "Z", "E"]
LHS_NAMES = ["i", "j", "h", "w"]
RED_NAMES = ["r", "s", "t"]
TC_TYPE = {"float32": ["float", "float32"], "float64": ["double", "float64"],
           "int32": ["int32"], "int64": ["int64"], "bool": ["bool"]}
FLOAT_FNS1 = ["exp", "tanh", "sigmoid", "abs", "fabs", "sin", "cos", "tan", "atan", "sinh",
              "cosh", "asinh", "exp2", "expm1", "cbrt", "erf", "erfc", "floor", "ceil",
              "round", "trunc", "relu"]
POS_FNS = ["log", "log2", "log10", "sqrt", "rsqrt"]   # argument made >= 0.5
FNS2 = ["fmax", "fmin", "max", "min", "atan2", "hypot", "copysign"]

OPTION_CYCLE = dict(fusion=["min", "smart", "max"], tile=[True, False],
                    specialize=[True, False], threads=[1, 2], register_tile=[True, False])


@dataclass
class Case:
    seed: int
    defs: list
    entry: str
    inputs: list
    options: dict
    einsum: str | None = None          # an einsum case: spec (defs unused)
    meta: dict = field(default_factory=dict)

    @property
    def source(self) -> str:
        return I.show_source(self.defs) if self.defs else ""

    @property
    def entry_def(self):
        return I.find_def(self.defs, self.entry)


#: the grid of the CUDA target (``POLYC_FUZZ_TARGET=cuda``: run on the CPU emulation)
CUDA_OPTION_CYCLE = dict(fusion=["min", "smart", "max"], specialize=[True, False],
                         gpu_register_tile=[True, False, (3, 2)],
                         gpu_block=[None, (32, 2), (64,)])


def options_for(seed: int) -> dict:
    """A point of the option grid (cycled so that every value is hit often)."""
    out, k = {}, seed
    cuda = os.environ.get("POLYC_FUZZ_TARGET") == "cuda"
    if cuda:  # POLYC_TEST_ON_GPU=sm_90: nvcc and the device instead of the emulation
        arch = os.environ.get("POLYC_TEST_ON_GPU", "")
        out = {"target": "cuda", "emulate": arch in ("", "0")}
        if arch not in ("", "0"):
            out["gpu_arch"] = arch
    for name, values in (CUDA_OPTION_CYCLE if cuda else OPTION_CYCLE).items():
        out[name] = values[k % len(values)]
        k //= len(values)
    if os.environ.get("POLYC_FUZZ_SCHEDULER", "isl") != "isl":
        out["scheduler"] = os.environ["POLYC_FUZZ_SCHEDULER"]
    return out


class Retry(Exception):
    pass


class DefGen:
    """Generates one ``def`` whose statements the interpreter accepts."""

    def __init__(self, rng: random.Random, name: str):
        self.rng, self.name = rng, name

    def chance(self, p):
        return self.rng.random() < p

    # -- signature and inputs ------------------------------------------------------------

    def signature(self):
        r = self.rng
        nsizes = r.choice([1, 2, 2, 3, 3, 4])
        self.sizes = {}
        for n in r.sample(SIZE_NAMES, nsizes):
            self.sizes[n] = 1 if self.chance(0.15) else r.randint(1, 9 if self.chance(0.3) else 6)
        self.params = []
        for name in INPUT_NAMES[:r.choice([1, 1, 2, 2, 2, 3, 3, 4])]:
            dtype = r.choices(["float32", "float64", "int32", "int64", "bool"],
                              [75, 8, 9, 4, 4])[0]
            rank = r.choices([0, 1, 2, 3], [8, 30, 45, 17])[0]
            dims = tuple(r.randint(1, 6) if self.chance(0.12) else r.choice(list(self.sizes))
                         for _ in range(rank))
            self.params.append(I.Param(r.choice(TC_TYPE[dtype]), dims if rank else None, name))
        # rank-0 params print as `float x`: name them in lower case
        self.params = [I.Param(p.ty, p.dims, p.name.lower() if p.dims is None else p.name)
                       for p in self.params]
        used = {d for p in self.params for d in (p.dims or ()) if isinstance(d, str)}
        self.sizes = {k: v for k, v in self.sizes.items() if k in used}

    def make_inputs(self):
        out = []
        for p in self.params:
            dtype = I.TYPES[p.ty]
            shape = tuple(self.sizes[d] if isinstance(d, str) else d for d in (p.dims or ()))
            out.append(random_array(self.rng, dtype, shape))
        return out

    # -- the body ------------------------------------------------------------------------

    def generate(self):
        r = self.rng
        self.signature()
        self.inputs = self.make_inputs()
        nouts = r.choice([1, 1, 1, 2, 2, 3])
        self.rets = []
        for k in range(nouts):
            if self.sizes and self.chance(0.12):   # a typed output: shape and dtype fixed
                dims = tuple(r.choice(list(self.sizes)) if self.chance(0.8) else r.randint(1, 5)
                             for _ in range(r.choice([0, 1, 1, 2])))
                dtype = r.choices(["float32", "float64", "int32"], [70, 20, 10])[0]
                self.rets.append(I.Ret(f"O{k + 1}", r.choice(TC_TYPE[dtype]), dims or None))
            else:
                self.rets.append(I.Ret(f"O{k + 1}"))
        self.written = set()
        sig = I.Def(self.name, tuple(self.params), tuple(self.rets), ())
        self.machine = I.Machine(sig, self.inputs)
        # polyc checks writes and bounds for every value of the sizes, not only these: a
        # statement must also be valid with other sizes (an approximation of "for all")
        self.alts = []
        main_sizes = self.sizes
        for k in range(10):
            self.sizes = {n: 1 if k == 0 else 9 if k == 1 else r.randint(1, 9)
                          for n in main_sizes}
            self.alts.append(I.Machine(sig, self.make_inputs()))
        self.sizes = main_sizes
        self.body = []
        nstmts = r.choice([1, 2, 2, 3, 3, 4, 5])
        ntemps = 0
        for k in range(max(nstmts, nouts)):
            unwritten = [o.name for o in self.rets if o.name not in self.written]
            left = max(nstmts, nouts) - k
            written = sorted(self.written)
            if unwritten and (left <= len(unwritten) or self.chance(0.5)):
                target = unwritten[0]
            elif written and self.chance(0.4):
                target = r.choice(written)
            elif ntemps < 2 and self.chance(0.6):
                ntemps += 1
                target = f"T{ntemps}"
            elif unwritten:
                target = unwritten[0]
            else:
                target = r.choice(written) if written else unwritten[0]
            self.add_statement(target)
        for o in self.rets:
            if o.name not in self.written:
                raise Retry("output not written")
        return I.Def(self.name, tuple(self.params), tuple(self.rets), tuple(self.body))

    def add_statement(self, target):
        for _ in range(30):
            try:
                st = self.statement(target)
            except Retry:
                continue
            m = copy.deepcopy(self.machine)
            try:
                m.statement(st)
            except I.Invalid:
                continue
            alts, ok = [], True
            for a in self.alts:
                a = copy.deepcopy(a)
                try:
                    a.statement(st)
                    alts.append(a)
                except I.Invalid as e:
                    # polyc refuses writes outside the target for any sizes; other
                    # problems with other sizes are not its business (stop checking them)
                    if "outside its shape" in str(e):
                        ok = False
                        break
            if not ok:
                continue
            if not self.interesting(m, st):
                continue
            self.machine, self.alts = m, alts
            self.body.append(st)
            self.written.add(target)
            return
        raise Retry(f"no valid statement for {target}")

    def interesting(self, m, st):
        t = m.tensors[st.tensor]
        return t.data.size <= 800

    def statement(self, target):
        r = self.rng
        t = self.machine.tensors.get(target)
        exists = t is not None and t.data is not None
        rank = t.data.ndim if exists else r.choices([0, 1, 2, 3], [15, 40, 35, 10])[0]
        lhs = LHS_NAMES[:rank]
        nred = r.choices([0, 1, 2], [40, 45, 15])[0]
        self.pool = lhs + RED_NAMES[:nred]
        self.lhs, self.target = lhs, target
        self.target_exists = exists
        self.guarded = 0
        rhs = self.expr(r.choice([1, 2, 2, 3]), "f" if self.chance(0.8) else
                        r.choice(["i", "b"]))
        # make sure reduction indices appear (else they are simply not there)
        clauses = []
        used = self.indices_in(rhs)
        for i in lhs:
            if i not in used and not exists:
                clauses.append(I.RangeC(i, I.Num(0), self.extent_expr()))
        red = [i for i in used if i not in lhs]
        if red:
            op = r.choice(["+=", "*=", "min=", "max=", "+=", "+="])
        else:
            op = r.choice(["=", "=", "=", "+=", "max=", "min=", "*="])
        if op != "=" and (target not in self.written or self.chance(0.7)):
            op += "!"
        # where ranges on LHS / reduction indices
        for i in list(lhs) + red:
            if any(isinstance(c, I.RangeC) and c.index == i for c in clauses):
                continue
            if self.chance(0.12):
                lo = I.Num(r.choice([0, 0, 1]))
                clauses.append(I.RangeC(i, lo, self.extent_expr()))
        if self.chance(0.15) and (lhs or red):
            ex = self.exists_clause(lhs + red)
            if ex is not None:
                clauses.append(ex)
        if self.chance(0.2):
            rhs, let = self.let(rhs)
            if let is not None:
                clauses.append(let)
        r.shuffle(clauses)
        return I.Stmt(target, tuple(lhs), op, rhs, tuple(clauses))

    def indices_in(self, e):
        out = []
        for x in walk(e):
            if isinstance(x, I.Name) and x.name in self.pool and x.name not in out:
                out.append(x.name)
        return out

    def extent_expr(self):
        r = self.rng
        names = list(self.sizes)
        k = r.random()
        if names and k < 0.6:
            s = I.Name(r.choice(names))
            return s if self.chance(0.7) else I.Bin("-", s, I.Num(1))
        decl = [p for p in self.params if p.dims]
        if decl and k < 0.8:
            p = r.choice(decl)
            return I.Dim(p.name, r.randrange(len(p.dims)))
        return I.Num(r.randint(1, 6))

    def exists_clause(self, idx):
        cands = [p for p in self.params if p.dims]
        if not cands:
            return None
        p = self.rng.choice(cands)
        return I.ExistsC(p.name, tuple(I.Name(self.rng.choice(idx)) for _ in p.dims))

    def let(self, rhs):
        subs = [x for x in walk(rhs) if isinstance(x, (I.Read, I.Call, I.Bin))]
        if not subs:
            return rhs, None
        sub = self.rng.choice(subs)
        name = "v" + str(self.rng.randint(0, 9))
        return replace_node(rhs, sub, I.Name(name)), I.LetC(name, sub)

    # -- expressions ----------------------------------------------------------------------

    def readable(self):
        out = []
        for n, t in self.machine.tensors.items():
            if t.data is None or n == self.target or (t.role == "output" and n not in
                                                      self.written):
                continue
            out.append(n)
        return out

    def expr(self, depth, kind):
        """A random expression; ``kind`` steers the type: f(loat), i(nt) or b(ool)."""
        r = self.rng
        if depth <= 0 or self.chance(0.2):
            return self.leaf(kind)
        if kind == "b":
            k = r.random()
            if k < 0.55:
                op = r.choice(["<", ">", "<=", ">=", "==", "!="])
                sub = r.choice(["f", "f", "i"])
                return I.Bin(op, self.expr(depth - 1, sub), self.expr(depth - 1, sub))
            if k < 0.8:
                return I.Bin(r.choice(["&&", "||"]), self.expr(depth - 1, "b"),
                             self.expr(depth - 1, "b"))
            if k < 0.9:
                return I.Un("!", self.expr(depth - 1, "b"))
            return I.Cast("bool", self.expr(depth - 1, "i"))
        k = r.random()
        if k < 0.35:
            op = r.choice(["+", "-", "*", "+", "*"])
            return I.Bin(op, self.expr(depth - 1, kind), self.expr(depth - 1, kind))
        if k < 0.45:
            return I.Bin("/", self.expr(depth - 1, kind), self.divisor(depth - 1, kind))
        if k < 0.5:
            return I.Bin("%", self.expr(depth - 1, kind), self.divisor(depth - 1, kind))
        if k < 0.58:
            return I.Tern(self.expr(depth - 1, "b"), self.expr(depth - 1, kind),
                          self.expr(depth - 1, kind))
        if k < 0.65:
            return self.guarded_read(kind)
        if k < 0.7:
            return I.Un("-", self.expr(depth - 1, kind))
        if kind == "i":
            k2 = r.random()
            if k2 < 0.4:
                return I.Call(r.choice(["max", "min"]), (self.expr(depth - 1, "i"),
                                                           self.expr(depth - 1, "i")))
            if k2 < 0.6:
                return I.Call("abs", (self.expr(depth - 1, "i"),))
            if k2 < 0.7:
                return I.Call("relu", (self.expr(depth - 1, "i"),))
            return I.Cast(r.choice(["int32", "int64"]),
                          I.Call(r.choice(["floor", "ceil", "round", "trunc"]),
                                 (I.Call("tanh", (self.expr(depth - 1, "f"),)),)))
        if k < 0.75:
            return I.Cast(r.choice(["float", "float32", "float64", "double"]),
                          self.expr(depth - 1, r.choice(["i", "f", "b"])))
        return self.call(depth - 1)

    def call(self, depth):
        r = self.rng
        k = r.random()
        sub = lambda: self.expr(depth, "f")  # noqa: E731
        if k < 0.45:
            return I.Call(r.choice(FLOAT_FNS1), (sub(),))
        if k < 0.6:
            return I.Call(r.choice(POS_FNS), (self.positive(sub()),))
        if k < 0.75:
            return I.Call(r.choice(FNS2), (sub(), sub()))
        fn = r.choice(["log1p", "acosh", "asin", "acos", "atanh", "pow", "fmod", "fma"])
        if fn == "log1p":
            return I.Call(fn, (I.Call("fabs", (sub(),)),))
        if fn == "acosh":
            return I.Call(fn, (I.Bin("+", I.Call("fabs", (sub(),)), I.Num(1)),))
        if fn in ("asin", "acos", "atanh"):
            return I.Call(fn, (I.Bin("*", I.Call("sin", (sub(),)), I.Num(0.875)),))
        if fn == "pow":
            return I.Call(fn, (self.positive(sub()), I.Num(r.choice([2, 3, 0.5, 1.5]))
                               if self.chance(0.6) else I.Call("sin", (sub(),))))
        if fn == "fmod":
            return I.Call(fn, (sub(), self.positive(sub())))
        return I.Call(fn, (sub(), sub(), sub()))

    def positive(self, e):
        return I.Bin("+", I.Call("fabs", (e,)), I.Num(0.5))

    def nonneg(self, depth, kind):
        e = self.expr(depth, kind)
        return I.Call("abs" if kind == "i" else "fabs", (e,))

    def divisor(self, depth, kind, positive=False):
        r = self.rng
        k = r.random()
        if k < 0.4:
            v = r.choice([2, 3, 4, 7]) if kind == "i" else r.choice([2, 4, 0.5, 0.25, 3])
            return I.Num(v) if positive or self.chance(0.7) else I.Un("-", I.Num(v))
        if k < 0.6 and self.sizes:
            return I.Name(r.choice(list(self.sizes)))
        e = self.expr(depth, kind)
        return I.Bin("+", I.Call("abs" if kind == "i" else "fabs", (e,)), I.Num(1))

    def leaf(self, kind):
        r = self.rng
        k = r.random()
        if kind == "b":
            if k < 0.6:
                a = self.leaf(r.choice(["f", "i"]))
                return I.Bin(r.choice(["<", ">=", "==", "!="]), a, self.leaf("f"))
            bools = [n for n in self.readable() if self.machine.tensors[n].dtype == "bool"]
            if bools and k < 0.9:
                return self.read(r.choice(bools))
            return I.Bin(r.choice(["<", ">", "<="]), I.Name(r.choice(self.pool)) if self.pool
                         else I.Num(1), I.Num(r.randint(0, 3)))
        if k < 0.62:
            cands = self.readable()
            if cands:
                want = [n for n in cands if (self.machine.tensors[n].dtype or "").startswith(
                    "float" if kind == "f" else "int")]
                return self.read(r.choice(want if want and self.chance(0.8) else cands))
        if k < 0.75 and self.pool:
            return I.Name(r.choice(self.pool))
        if k < 0.8 and self.sizes:
            return I.Name(r.choice(list(self.sizes)))
        if k < 0.84:
            decl = [p for p in self.params if p.dims]
            if decl:
                p = r.choice(decl)
                return I.Dim(p.name, r.randrange(len(p.dims)))
        if kind == "i":
            return I.Num(r.randint(0, 5))
        return I.Num(r.choice([0.5, 1.0, 2.0, 0.25, 1.5, 3.0, 0.125]))

    def read(self, name, allow_offsets=True):
        t = self.machine.tensors[name]
        if t.data.ndim == 0:
            return I.Name(name)
        args = tuple(self.index_expr(d, t, allow_offsets) for d in range(t.data.ndim))
        return I.Read(name, args)

    def extent_of(self, t, d):
        """A TC expression of the extent of dim ``d`` of ``t`` (for guards)."""
        if t.dims is not None:
            dm = t.dims[d]
            k = self.rng.random()
            if k < 0.4:
                return I.Dim(t.name, d)
            return I.Name(dm) if isinstance(dm, str) else I.Num(dm)
        return I.Num(t.data.shape[d])

    def index_expr(self, d, t, allow_offsets=True):
        r = self.rng
        pool = self.pool
        if not pool:
            return I.Num(r.randrange(t.data.shape[d]) if t.data.shape[d] else 0)
        x = I.Name(r.choice(pool))
        # prefer an index of the LHS that no read uses yet
        k = r.random()
        if k < 0.6 or not allow_offsets:
            return x
        y = I.Name(r.choice(pool))
        if k < 0.68:
            return I.Bin("+", x, I.Num(r.choice([1, 2])))
        if k < 0.74:
            return I.Bin("-", x, I.Num(1))
        if k < 0.82:
            return I.Bin("+", x, y) if x != y else x
        if k < 0.87:
            return I.Bin("+", I.Bin("*", I.Num(2), x), y) if x != y else \
                I.Bin("*", I.Num(2), x)
        if k < 0.93:
            ext = self.extent_of(t, d)
            return I.Bin("-", I.Bin("-", ext, I.Num(1)), x)
        if k < 0.96:
            return I.Bin("/", x, I.Num(2))
        if k < 0.98:
            return I.Num(r.randrange(max(t.data.shape[d], 1)))
        return I.Bin("%", x, I.Num(2))

    def guarded_read(self, kind):
        """``guard ? T(e...) : other``, the guard keeping every index in bounds."""
        cands = [n for n in self.readable() if self.machine.tensors[n].data.ndim]
        if not cands:
            return self.leaf(kind)
        t = self.machine.tensors[self.rng.choice(cands)]
        args, conds = [], []
        for d in range(t.data.ndim):
            x = I.Name(self.rng.choice(self.pool)) if self.pool else I.Num(0)
            e = self.rng.choice([I.Bin("-", x, I.Num(1)), I.Bin("+", x, I.Num(1)), x,
                                 I.Bin("+", x, I.Name(self.rng.choice(self.pool)))
                                 if self.pool else x])
            args.append(e)
            if e != x:
                conds.append(I.Bin(">=", e, I.Num(0)))
                if not self.chance(0.15):
                    conds.append(I.Bin("<", e, self.extent_of(t, d)))
        read = I.Read(t.name, tuple(args))
        if not conds:
            conds = [I.Bin(">=", args[0], I.Num(0))]
        g = conds[0]
        for c in conds[1:]:
            g = I.Bin("&&", g, c)
        other = I.Num(0) if self.chance(0.7) else self.leaf(kind)
        return I.Tern(g, read, other) if self.chance(0.8) else I.Tern(I.Un("!", g), other, read)


def walk(e):
    yield e
    if isinstance(e, (I.Un, I.Cast)):
        yield from walk(e.x)
    elif isinstance(e, I.Bin):
        yield from walk(e.a)
        yield from walk(e.b)
    elif isinstance(e, I.Tern):
        for x in (e.c, e.a, e.b):
            yield from walk(x)
    elif isinstance(e, (I.Call, I.Read)):
        for x in e.args:
            yield from walk(x)


def replace_node(e, old, new):
    """``e`` with the first occurrence (pre-order) of ``old`` replaced by ``new``."""
    done = [False]

    def go(x):
        if not done[0] and x is old:
            done[0] = True
            return new
        if isinstance(x, I.Un):
            return I.Un(x.op, go(x.x))
        if isinstance(x, I.Cast):
            return I.Cast(x.ty, go(x.x))
        if isinstance(x, I.Bin):
            return I.Bin(x.op, go(x.a), go(x.b))
        if isinstance(x, I.Tern):
            return I.Tern(go(x.c), go(x.a), go(x.b))
        if isinstance(x, I.Call):
            return I.Call(x.fn, tuple(go(a) for a in x.args))
        if isinstance(x, I.Read):
            return I.Read(x.tensor, tuple(go(a) for a in x.args))
        return x
    return go(e)


def random_array(rng: random.Random, dtype: str, shape):
    g = np.random.default_rng(rng.getrandbits(32))
    if dtype.startswith("float"):
        return (g.integers(-16, 17, size=shape) / 8).astype(dtype)
    if dtype == "bool":
        return g.random(shape) < 0.5
    return g.integers(-6, 7, size=shape).astype(dtype)


def _sprinkle_types(rng, d):
    """Sometimes declare an output's type (its dtype and shape are then fixed)."""
    return d


EINSUMS = ["ij,jk->ik", "ii->", "ii->i", "bij,bjk->bik", "ij,jk", "i,i", "ij->ji", "i,j->ij",
           "ij->", "ijk->kji", "bi,bi->b", "ij,ij->ij", "ijk,ik->ij", "...ij,...jk->...ik",
           "ij,kj", "bii->bi", "i->", "ab,bc,cd->ad", "iij->j"]


def einsum_case(rng: random.Random, seed: int) -> Case:
    spec = rng.choice(EINSUMS)
    if rng.random() < 0.3:   # a random spec: permuted output of a contraction
        labels = rng.sample("ijkl", rng.randint(2, 4))
        a = "".join(rng.sample(labels, rng.randint(1, len(labels))))
        b = "".join(rng.sample(labels, rng.randint(1, len(labels))))
        outl = [c for c in labels if c in a + b and ((c in a) != (c in b) or rng.random() < 0.3)]
        rng.shuffle(outl)
        spec = f"{a},{b}->{''.join(outl)}"
    sizes = {c: 1 if rng.random() < 0.15 else rng.randint(1, 6) for c in "abcdijkl"}
    lhs = spec.split("->")[0].split(",")
    dtype = rng.choices(["float32", "float64", "int32", "bool"], [80, 10, 7, 3])[0]
    inputs = []
    batch = (rng.randint(1, 3),) if "..." in spec else ()
    for op in lhs:
        shape = batch + tuple(sizes[c] for c in op.replace("...", ""))
        inputs.append(random_array(rng, dtype, shape))
    return Case(seed, [], "", inputs, options_for(seed), einsum=spec)


def case(seed: int) -> Case:
    """The case of ``seed``: a TC program (8 in 9) or an einsum (1 in 9)."""
    rng = random.Random(seed)
    if rng.random() < 1 / 9:
        return einsum_case(rng, seed)
    for attempt in range(50):
        try:
            sub = random.Random(rng.getrandbits(64))
            names = ["f", "g", "conv", "kernel"]
            ndefs = sub.choice([1, 1, 1, 1, 2, 3])
            defs, chosen = [], None
            pick = sub.randrange(ndefs)
            for k in range(ndefs):
                g = DefGen(sub, names[k])
                d = g.generate()
                defs.append(d)
                if k == pick:
                    chosen = g
            d = defs[pick]
            c = Case(seed, defs, d.name, chosen.inputs, options_for(seed))
            I.run(d, c.inputs)   # the whole program once more
            return c
        except (Retry, I.Invalid):
            continue
    raise RuntimeError(f"no valid program for seed {seed}")
