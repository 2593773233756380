"""Ops of recurrent sequence models (opset 27): CausalConvWithState and LinearAttention.

* CausalConvWithState (Mamba, Gated DeltaNet): a depthwise 1-D convolution over the
  past state followed by the input, ``Y(b,c,t) = sum_k W(c,0,k) P(b,c,t+k) + B(c)``
  where ``P`` is the past (zeros when absent) then the input, read in place (the guard
  picks the tensor); optionally SiLU. The present state is the last ``k - 1``
  positions of ``P``.
* LinearAttention: the recurrence ``S_t = a_t S_{t-1} + k_t (x) v'_t``, ``o_t = scale
  q_t^T S_t`` over the time steps, per batch and key/value head, with the four update
  rules (``linear``; ``gated``: ``a_t = exp(g_t)``; ``delta``/``gated_delta``:
  ``v'_t = beta_t (v_t - a_t S_{t-1}^T k_t)``), and grouped-query heads (each state
  read by ``q_num_heads / kv_num_heads`` query heads). The step's statements share
  their loop over time (``Lowered.loops``, as the RNNs do); the state's storage is
  folded to two steps (``Lowered.folds``: slot ``t % 2``), the step's temporaries
  to one, so memory does not grow with the sequence (the dependences on a slot's
  previous contents keep the steps in order). Computed in float32 (a float16
  model's state too), as onnx's reference does.
"""
from __future__ import annotations

import math

from .onnx_graph import LowerContext, Lowered, Node, register
from .onnx_ops_math import FLOATS, cast_to, lit, present, ref, stmt, str_attr, temp_stmt, \
    unsupported


@register("CausalConvWithState")
def causal_conv_with_state(node: Node, ctx: LowerContext) -> Lowered:
    x, w = node.inputs[:2]
    y, state = (list(node.outputs) + ["", ""])[:2]
    nb, nc, length = ctx.shape(x)
    k = ctx.shape(w)[2]
    dt = ctx.dtype(x)
    if dt not in FLOATS:
        raise unsupported(node, f"an input of dtype {dt}")
    act = str_attr(node, "activation", "none")
    if act not in ("none", "silu", "swish"):
        raise unsupported(node, f"activation {act!r}")
    past = node.inputs[3] if present(node, 3) and k > 1 else ""  # k = 1: no past
    if state and 0 in ctx.shape(state):
        state = ""  # k = 1: the state is empty (a constant)

    def padded(p: str) -> str:  # position p of the past followed by the input
        old = ref(ctx, past, ["b", "c", p]) if past else lit(0, dt)
        return f"({p} < {k - 1} ? {old} : {ref(ctx, x, ['b', 'c', f'{p} - {k - 1}'])})"
    stmts = []
    if y:
        conv = ctx.temp("conv")
        bias = f" + {ref(ctx, node.inputs[2], ['c'])}" if present(node, 2) else ""
        stmts.append(temp_stmt(ctx, conv, ["b", "c", "t"], (nb, nc, length), "+=!",
                               f"{ref(ctx, w, ['c', '0', 'j'])} * {padded('t + j')}",
                               lets=[f"j in 0:{k}"]))
        v = f"({conv}(b, c, t){bias})"
        if act != "none":
            f = cast_to("float32", v)
            v = cast_to(dt, f"{f} * sigmoid({f})") if dt != "float32" else f"{v} * sigmoid({v})"
        stmts.append(stmt(ctx, y, ["b", "c", "t"], "=", v))
    if state:
        stmts.append(stmt(ctx, state, ["b", "c", "s"], "=", padded(f"s + {length}")))
    return Lowered(stmts)


@register("LinearAttention")
def linear_attention(node: Node, ctx: LowerContext) -> Lowered:
    q, kk, v = node.inputs[:3]
    out, present_state = (list(node.outputs) + ["", ""])[:2]
    dt = ctx.dtype(q)
    if dt not in FLOATS:
        raise unsupported(node, f"an input of dtype {dt}")
    rule = str_attr(node, "update_rule", "gated_delta")
    if rule not in ("linear", "gated", "delta", "gated_delta"):
        raise unsupported(node, f"update_rule {rule!r}")
    hq, hk = int(node.attr("q_num_heads", 0)), int(node.attr("kv_num_heads", 0))
    if hq <= 0 or hk <= 0 or hq % hk:
        raise unsupported(node, f"q_num_heads {hq} must be a positive multiple of "
                                f"kv_num_heads {hk}")
    nb, steps, qw = ctx.shape(q)
    dk, dv = qw // hq, ctx.shape(v)[2] // hk
    group = hq // hk
    gating, delta = rule in ("gated", "gated_delta"), rule in ("delta", "gated_delta")
    past = node.inputs[3] if present(node, 3) else ""
    decay = node.inputs[4] if present(node, 4) else ""
    beta = node.inputs[5] if present(node, 5) else ""
    if gating != bool(decay) or delta != bool(beta):
        raise unsupported(node, f"update_rule {rule!r} "
                                f"{'needs' if gating else 'takes no'} decay and "
                                f"{'needs' if delta else 'takes no'} beta")
    scale = float(node.attr("scale", 0.0) or 0.0) or 1.0 / math.sqrt(dk)
    f32 = "float32"

    def rd(t: str, idx: list[str]) -> str:
        r = ref(ctx, t, idx)
        return r if ctx.dtype(t) == f32 else cast_to(f32, r)
    # q, k, v of step t, head h, component d (packed [B, T, H*D])
    qv = lambda h, d: rd(q, ["b", "t", f"{dk} * {h} + {d}"])  # noqa: E731
    kv = lambda d: rd(kk, ["b", "t", f"{dk} * h + {d}"])  # noqa: E731
    vv = lambda m: rd(v, ["b", "t", f"{dv} * h + {m}"])  # noqa: E731
    s = ctx.temp("state")
    shape = (steps, nb, hk, dk, dv)  # folded to two steps (see the module doc)
    before = f"(t == 0 ? {rd(past, ['b', 'h', 'd', 'm']) if past else lit(0.0, f32)} : " \
             f"{s}(t - 1, b, h, d, m))"
    if gating:
        width = ctx.shape(decay)[2]
        g = rd(decay, ["b", "t", "h" if width == hk else f"{dk} * h + d"])
        before = f"exp({g}) * {before}"
    stmts: list[str] = []
    scaffold = [len(stmts)]
    stmts.append(temp_stmt(ctx, s, ["t", "b", "h", "d", "m"], shape, "=", lit(0.0, f32)))
    first = len(stmts)
    decayed = ctx.temp("decayed")
    stmts.append(temp_stmt(ctx, decayed, ["t", "b", "h", "d", "m"], shape, "=", before))
    dec = lambda d, m: f"{decayed}(t, b, h, {d}, {m})"  # noqa: E731
    folds = [(s, 2), (decayed, 1)]
    if delta:
        got = ctx.temp("retrieved")
        stmts.append(temp_stmt(ctx, got, ["t", "b", "h", "m"], (steps, nb, hk, dv), "+=!",
                               f"{dec('e', 'm')} * {kv('e')}", lets=[f"e in 0:{dk}"]))
        folds.append((got, 1))
        bw = ctx.shape(beta)[2]
        bt = rd(beta, ["b", "t", "h" if bw == hk else "0"])
        new_v = f"{bt} * ({vv('m')} - {got}(t, b, h, m))"
    else:
        new_v = vv("m")
    stmts.append(temp_stmt(ctx, s, ["t", "b", "h", "d", "m"], shape, "=",
                           f"{dec('d', 'm')} + {kv('d')} * {new_v}"))
    if out:
        o = ctx.temp("out")
        stmts.append(temp_stmt(ctx, o, ["t", "b", "hh", "m"], (steps, nb, hq, dv), "+=!",
                               f"{qv('hh', 'e')} * {s}(t, b, hh / {group}, e, m)",
                               lets=[f"e in 0:{dk}"]))
    loops = (("t", first, len(stmts) - 1),)
    if out:
        val = f"{lit(scale, f32)} * {o}(t, b, c / {dv}, c % {dv})"
        stmts.append(stmt(ctx, out, ["b", "t", "c"], "=",
                          val if ctx.dtype(out) == f32 else cast_to(ctx.dtype(out), val)))
    if present_state:
        last = f"{s}({steps - 1}, b, h, d, m)"
        sdt = ctx.dtype(present_state)
        stmts.append(stmt(ctx, present_state, ["b", "h", "d", "m"], "=",
                          last if sdt == f32 else cast_to(sdt, last)))
    return Lowered(stmts, loops=loops, scaffold=tuple(scaffold), folds=tuple(folds))
