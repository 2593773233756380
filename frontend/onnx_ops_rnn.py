"""ONNX's recurrent layers, RNN, GRU and LSTM, as loops over time around contractions.

Per direction, with ``s`` the step (time ``s``, or ``T-1-s`` in reverse):

* ``XW(s,b,q) +=! X(t_s,b,i) * W(q,i)`` -- every step's input projection, for all the
  gates at once (a matmul the scheduler tiles and runs in parallel over ``s``);
* ``HR(s,b,q) +=! Hprev(s,b,k) * R(q,k)`` with ``Hprev(s) = s == 0 ? initial_h :
  H(s-1)`` -- the recurrence; the scheduler finds the dependence of step ``s`` on step
  ``s-1`` and keeps ``s`` outermost and sequential around it;
* the gates and the new state ``H(s,b,j)`` (and LSTM's cell ``C(s,b,j)``), elementwise.

The outputs ``Y``, ``Y_h``, ``Y_c`` read the states. ``sequence_lens`` (forward only):
past a batch's length its state stays and its ``Y`` rows are 0. Activations, their
alpha/beta, ``clip``, ``layout``, GRU's ``linear_before_reset`` and LSTM's peepholes
follow ONNX; LSTM's ``input_forget`` is refused.
"""
from __future__ import annotations

from .onnx_graph import LowerContext, Lowered, Node, register
from .onnx_ops_math import lit, present, ref, str_attr, temp_stmt, unsupported

_GATES = {"RNN": 1, "GRU": 3, "LSTM": 4}
_DEFAULTS = {"RNN": ["Tanh"], "GRU": ["Sigmoid", "Tanh"], "LSTM": ["Sigmoid", "Tanh", "Tanh"]}


def _activation(node: Node, name: str, alpha: float | None, beta: float | None, dt: str):
    a = lambda v, d: lit(v if v is not None else d, dt)  # noqa: E731
    table = {
        "Tanh": lambda x: f"tanh({x})",
        "Sigmoid": lambda x: f"sigmoid({x})",
        "Relu": lambda x: f"relu({x})",
        "Softsign": lambda x: f"({x}) / ({lit(1.0, dt)} + abs({x}))",
        "Softplus": lambda x: f"log({lit(1.0, dt)} + exp({x}))",
        "LeakyRelu": lambda x: f"({x} >= {lit(0.0, dt)} ? {x} : {a(alpha, 0.01)} * {x})",
        "ThresholdedRelu": lambda x: f"({x} > {a(alpha, 1.0)} ? {x} : {lit(0.0, dt)})",
        "Elu": lambda x: f"({x} >= {lit(0.0, dt)} ? {x} : {a(alpha, 1.0)} * "
                         f"(exp({x}) - {lit(1.0, dt)}))",
        "HardSigmoid": lambda x: f"max({lit(0.0, dt)}, min({lit(1.0, dt)}, "
                                 f"{a(alpha, 0.2)} * {x} + {a(beta, 0.5)}))",
        "ScaledTanh": lambda x: f"{a(alpha, 1.0)} * tanh({a(beta, 1.0)} * {x})",
        "Affine": lambda x: f"{a(alpha, 1.0)} * {x} + {a(beta, 0.0)}",
    }
    if name not in table:
        raise unsupported(node, f"activation {name!r} (supported: {', '.join(table)})")
    fn = table[name]
    return lambda x: fn(f"({x})")


def _strs(node: Node, key: str) -> list[str]:
    return [v.decode() if isinstance(v, bytes) else v for v in (node.attr(key, []) or [])]


@register("RNN", "GRU", "LSTM")
def recurrent(node: Node, ctx: LowerContext) -> Lowered:
    op = node.op_type
    x, w, r = node.inputs[:3]
    dt = ctx.dtype(x)
    hidden = int(node.attr("hidden_size", 0) or ctx.shape(r)[-1])
    direction = str_attr(node, "direction", "forward")
    dirs = {"forward": [False], "reverse": [True], "bidirectional": [False, True]}.get(direction)
    if dirs is None:
        raise unsupported(node, f"direction {direction!r}")
    if op == "LSTM" and node.attr("input_forget", 0):
        raise unsupported(node, "input_forget=1 (coupled input and forget gates)")
    layout = int(node.attr("layout", 0))
    xs = ctx.shape(x)
    steps, batch = (xs[1], xs[0]) if layout else (xs[0], xs[1])
    gates = _GATES[op]
    acts = _strs(node, "activations") or _DEFAULTS[op] * len(dirs)
    per = len(_DEFAULTS[op])
    alphas = list(node.attr("activation_alpha", []) or [])
    betas = list(node.attr("activation_beta", []) or [])
    if len(acts) != per * len(dirs):
        raise unsupported(node, f"{len(acts)} activations for {len(dirs)} direction(s)")
    clip = node.attr("clip", None)
    b_in = node.inputs[3] if present(node, 3) else ""
    lens = node.inputs[4] if present(node, 4) else ""
    h0 = node.inputs[5] if present(node, 5) else ""
    c0 = node.inputs[6] if op == "LSTM" and present(node, 6) else ""
    peep = node.inputs[7] if op == "LSTM" and present(node, 7) else ""
    if lens and any(dirs):
        raise unsupported(node, "sequence_lens with the reverse direction")
    outs = list(node.outputs) + [""] * (3 - len(node.outputs))
    y, y_h, y_c = outs[:3]
    zero = lit(0.0, dt)
    stmts: list[str] = []
    states: list[tuple[str, str, bool, str]] = []  # per direction: H, C, reversed, valid
    loops: list[tuple[str, int, int]] = []
    scaffold: list[int] = []

    def one_direction(d: int, reverse: bool) -> None:
        """The statements of direction ``d`` (its steps backwards when
        ``reverse``), appended to the node's."""
        fns = [_activation(node, acts[d * per + k],
                           alphas[d * per + k] if d * per + k < len(alphas) else None,
                           betas[d * per + k] if d * per + k < len(betas) else None, dt)
               for k in range(per)]
        t_of = f"{steps - 1} - s" if reverse else "s"

        def xread(i: str) -> str:
            return ref(ctx, x, ["b", t_of, i] if layout else [t_of, "b", i])

        def bias(q: str) -> str:
            if not b_in:
                return ""
            return f" + {ref(ctx, b_in, [str(d), q])} + " \
                   f"{ref(ctx, b_in, [str(d), f'{gates * hidden} + {q}'])}"

        def clipped(v: str) -> str:
            if clip is None:
                return v
            c = lit(float(clip), dt)
            return f"max(-{c}, min({c}, {v}))"
        xw, hs = ctx.temp("xw"), ctx.temp("h")
        cs = ctx.temp("c") if op == "LSTM" else ""
        stmts.append(temp_stmt(ctx, xw, ["s", "b", "q"], [steps, batch, gates * hidden], "+=!",
                               f"{xread('i')} * {ref(ctx, w, [str(d), 'q', 'i'])}"))

        def prev(state: str, init: str, k: str) -> str:
            first = ref(ctx, init, [str(d), "b", k] if not layout else ["b", str(d), k]) \
                if init else zero
            return f"(s == 0 ? {first} : {state}(s - 1, b, {k}))"
        hp = lambda k: prev(hs, h0, k)  # noqa: E731
        row = ["s", "b", "j"]
        shape = [steps, batch, hidden]
        # the states are read (at s - 1) before the statements computing them: declare
        # them for TC, then run the step's statements in one loop over s
        for st in (hs, cs):
            if st:
                scaffold.append(len(stmts))
                stmts.append(temp_stmt(ctx, st, row, shape, "=", zero))
        first = len(stmts)
        hr = ctx.temp("hr")
        rec = gates if not (op == "GRU" and not node.attr("linear_before_reset", 0)) else 2
        stmts.append(temp_stmt(ctx, hr, ["s", "b", "q"], [steps, batch, rec * hidden], "+=!",
                               f"{hp('k')} * {ref(ctx, r, [str(d), 'q', 'k'])}"))

        def pre(g: int, extra: str = "") -> str:
            q = f"{g * hidden} + j" if g else "j"
            hr_part = f" + {hr}(s, b, {q})" if g < rec else ""
            return clipped(f"{xw}(s, b, {q}){hr_part}{extra}{bias(q)}")
        valid = f"s < {ref(ctx, lens, ['b'])}" if lens else ""

        def hold(new: str, state: str, init: str) -> str:
            return f"({valid} ? {new} : {prev(state, init, 'j')})" if valid else new
        if op == "RNN":
            stmts.append(temp_stmt(ctx, hs, row, shape, "=", hold(fns[0](pre(0)), hs, h0)))
        elif op == "GRU":
            f, g = fns
            z, rg = ctx.temp("z"), ctx.temp("r")
            stmts.append(temp_stmt(ctx, z, row, shape, "=", f(pre(0))))
            stmts.append(temp_stmt(ctx, rg, row, shape, "=", f(pre(1))))
            q = f"{2 * hidden} + j"
            if rec == 2:  # (r * Hprev) R_h: the reset gate before the product
                rh = ctx.temp("rh")
                stmts.append(temp_stmt(
                    ctx, rh, row, shape, "+=!",
                    f"{rg}(s, b, k) * {hp('k')} * "
                f"{ref(ctx, r, [str(d), f'{2 * hidden} + j', 'k'])}"))
                rb = f" + {ref(ctx, b_in, [str(d), f'{5 * hidden} + j'])}" if b_in else ""
                wb = f" + {ref(ctx, b_in, [str(d), q])}" if b_in else ""
                cand = g(clipped(f"{xw}(s, b, {q}) + {rh}(s, b, j){rb}{wb}"))
            else:  # r * (Hprev R_h + Rb_h)
                rb = f" + {ref(ctx, b_in, [str(d), f'{5 * hidden} + j'])}" if b_in else ""
                wb = f" + {ref(ctx, b_in, [str(d), q])}" if b_in else ""
                cand = g(clipped(f"{xw}(s, b, {q}) + {rg}(s, b, j) * ({hr}(s, b, {q}){rb})"
                                 f"{wb}"))
            new = f"({lit(1.0, dt)} - {z}(s, b, j)) * {cand} + {z}(s, b, j) * {hp('j')}"
            stmts.append(temp_stmt(ctx, hs, row, shape, "=", hold(new, hs, h0)))
        else:  # LSTM: gates i, o, f, c in W's order; peepholes P = [Pi, Po, Pf]
            f, g, h = fns
            cp = prev(cs, c0, "j")

            def p(k: int, cell: str) -> str:
                return f" + {ref(ctx, peep, [str(d), f'{k * hidden} + j'])} * {cell}" \
                    if peep else ""
            ig, fg = ctx.temp("i"), ctx.temp("f")
            stmts.append(temp_stmt(ctx, ig, row, shape, "=", f(pre(0, p(0, cp)))))
            stmts.append(temp_stmt(ctx, fg, row, shape, "=", f(pre(2, p(2, cp)))))
            cnew = f"{fg}(s, b, j) * {cp} + {ig}(s, b, j) * {g(pre(3))}"
            stmts.append(temp_stmt(ctx, cs, row, shape, "=", hold(cnew, cs, c0)))
            cell = f"{cs}(s, b, j)"
            og = ctx.temp("o")
            stmts.append(temp_stmt(ctx, og, row, shape, "=", f(pre(1, p(1, cell)))))
            stmts.append(temp_stmt(ctx, hs, row, shape, "=",
                                   hold(f"{og}(s, b, j) * {h(cell)}", hs, h0)))
        loops.append(("s", first, len(stmts) - 1))
        states.append((hs, cs, reverse, valid))

    for d, reverse in enumerate(dirs):
        one_direction(d, reverse)
    # outputs, every direction in one statement: Y at each time, the last states
    def pick(values: list[str]) -> str:
        out = values[-1]
        for k in range(len(values) - 2, -1, -1):
            out = f"(d == {k} ? {values[k]} : {out})"
        return out
    if y:
        vals = []
        for hs, _, reverse, valid in states:
            step = f"{steps - 1} - t" if reverse else "t"
            v = f"{hs}({step}, b, j)"
            vals.append(f"({valid.replace('s <', 't <')} ? {v} : {zero})" if valid else v)
        idx = ["b", "t", "d", "j"] if layout else ["t", "d", "b", "j"]
        stmts.append(f"{ref(ctx, y, idx)} = {pick(vals)} where t in 0:{steps}, "
                     f"d in 0:{len(dirs)}, b in 0:{batch}, j in 0:{hidden}")
    for out, k in ((y_h, 0), (y_c, 1)):
        if out and states[0][k]:
            idx = ["b", "d", "j"] if layout else ["d", "b", "j"]
            vals = [f"{st[k]}({steps - 1}, b, j)" for st in states]
            stmts.append(f"{ref(ctx, out, idx)} = {pick(vals)} where d in 0:{len(dirs)}, "
                         f"b in 0:{batch}, j in 0:{hidden}")
    return Lowered(stmts, loops=tuple(loops), scaffold=tuple(scaffold))
