"""ONNX Attention (opset 23) as contractions around a softmax.

``Y = softmax(softcap(Q K^T * scale) + bias) V`` per batch and query head, in five
statements the scheduler sees whole (and fuses where it can):

* the present key and value (the past cache followed by the new keys), when a past is
  given or the node asks for them;
* the scores ``S(b,h,i,j) +=! (Q*s)(b,h,i,d) * (K*s)(b,h/r,j,d)`` with ``s = sqrt(scale)``
  (as ONNX's function body scales both operands), ``r`` query heads per key head
  (grouped-query attention);
* the row maximum and the sum of exponentials of the logits (scores, soft-capped, plus
  the bias: the attention mask, a boolean mask as 0 or -inf, a mask shorter than the
  keys padded with -inf; the causal mask ``j <= i + offset`` and the sliding window
  around ``i + offset``, where the offset is the past's length, or with an external
  cache ``nonpad_kv_seqlen[b] - Sq``, read at run time with the keys past it masked);
* the probabilities, 0 on a row every key of which is masked;
* ``Y(b,h,i,v) +=! P(b,h,i,j) * V(b,h/r,j,v)``.

3-D inputs (``[batch, sequence, heads * head size]``) are read in place: the head is a
quasi-affine function of the hidden index (``c / Dv``, ``c % Dv``), no transposes.
The optional fourth output is the scores, the soft-capped scores, the logits or the
probabilities (``qk_matmul_output_mode`` 0 to 3).
"""
from __future__ import annotations

import numpy as np

from polyc import dtypes as D

from .onnx_graph import LowerContext, Lowered, Node, register
from .onnx_import import DTYPES
from .onnx_ops_math import cast_to, lit, present, ref, stmt, temp_stmt, unsupported



@register("Attention")
def attention(node: Node, ctx: LowerContext) -> Lowered:
    q, k, v = node.inputs[:3]
    dt = ctx.dtype(q)
    if dt not in D.FLOATS:
        raise unsupported(node, f"dtype {dt} of {q!r} (floating point only)")
    rank = ctx.rank(q)
    if rank not in (3, 4) or ctx.rank(k) != rank or ctx.rank(v) != rank:
        raise unsupported(node, "Q, K and V must all be 3-D or all 4-D")
    qs, ks, vs = ctx.shape(q), ctx.shape(k), ctx.shape(v)
    if rank == 4:
        batch, hq, sq, dk = qs
        hkv, skv, dv = ks[1], ks[2], vs[3]
    else:
        hq, hkv = int(node.attr("q_num_heads", 0)), int(node.attr("kv_num_heads", 0))
        if hq <= 0 or hkv <= 0 or qs[2] % hq or ks[2] % hkv or vs[2] % hkv:
            raise unsupported(node, "3-D inputs need q_num_heads and kv_num_heads dividing "
                                    "the hidden sizes")
        batch, sq, dk = qs[0], qs[1], qs[2] // hq
        skv, dv = ks[1], vs[2] // hkv
    if hq % hkv:
        raise unsupported(node, f"{hq} query heads are not a multiple of {hkv} key heads")
    rep = hq // hkv
    past_k = node.inputs[4] if present(node, 4) else ""
    past_v = node.inputs[5] if present(node, 5) else ""
    if bool(past_k) != bool(past_v):
        raise unsupported(node, "past_key and past_value must be given together")
    past = ctx.shape(past_k)[2] if past_k else 0
    total = past + skv
    scale = node.attr("scale", None)
    scale = 1.0 / np.sqrt(dk) if scale is None else float(scale)
    # ONNX's body multiplies both operands by sqrt(scale), rounded to the input type
    sq_scale = lit(float(D.numpy_dtype(dt).type(np.sqrt(scale))), dt)
    softcap = float(node.attr("softcap", 0.0) or 0.0)
    causal = bool(node.attr("is_causal", 0))
    mode = int(node.attr("qk_matmul_output_mode", 0))
    sp = node.attr("softmax_precision", None)
    sp_dt = DTYPES.get(int(sp)) if sp is not None else dt
    if sp_dt is None:
        raise unsupported(node, f"softmax_precision {sp}")
    outs = list(node.outputs) + [""] * (4 - len(node.outputs))
    stmts: list[str] = []
    neg_inf = lit(float("-inf"), dt)

    def head_read(x: str, b: str, h: str, s: str, d: str, size: int) -> str:
        if rank == 4:
            return ref(ctx, x, [b, h, s, d])
        return ref(ctx, x, [b, s, f"{size}*({h}) + {d}"])

    def cache(new: str, old: str, out: str, size: int, hint: str) -> tuple[str, bool]:
        """The present key or value: ``(name, is a tensor of the graph)``."""
        if not old and not out:  # read in place
            return new, True
        idx = ["b", "h", "j", "d"]
        shape = [batch, hkv, total, size]
        value = head_read(new, "b", "h", f"j - {past}" if past else "j", "d", size)
        if old:
            value = f"j < {past} ? {ref(ctx, old, idx)} : {value}"
        if out:
            stmts.append(stmt(ctx, out, idx, "=", value))
            return out, True
        name = ctx.temp(hint)
        stmts.append(temp_stmt(ctx, name, idx, shape, "=", value))
        return name, False

    key, key_graph = cache(k, past_k, outs[1], dk, "present_key")
    val, val_graph = cache(v, past_v, outs[2], dv, "present_value")

    def kv(name: str, is_graph: bool, x: str, b: str, h: str, s: str, d: str, size: int
           ) -> str:
        if is_graph and name == x:  # the node's own input, 3-D or 4-D
            return head_read(x, b, h, s, d, size)
        return ref(ctx, name, [b, h, s, d]) if is_graph else f"{name}({b}, {h}, {s}, {d})"

    kh = f"h / {rep}" if rep > 1 else "h"
    scores = ctx.temp("scores")
    s4 = [batch, hq, sq, total]
    qv = head_read(q, "b", "h", "i", "d", dk)
    kval = kv(key, key_graph, k, "b", kh, "j", "d", dk)
    stmts.append(temp_stmt(ctx, scores, ["b", "h", "i", "j"], s4, "+=!",
                           f"({qv} * {sq_scale}) * ({kval} * {sq_scale})"))
    sij = f"{scores}(b, h, i, j)"
    capped = (f"tanh({sij} / {lit(softcap, dt)}) * {lit(softcap, dt)}" if softcap > 0
              else sij)
    bias = _bias(node, ctx, total, batch, hq, sq, dt, neg_inf)
    nonpad = node.inputs[6] if present(node, 6) else ""
    if nonpad and past_k:
        raise unsupported(node, "nonpad_kv_seqlen together with a past cache")
    # where the queries sit among the keys: after the past, or (an external cache) at
    # the batch's count of valid keys, read at run time
    offset = f"({ref(ctx, nonpad, ['b'])} - {sq})" if nonpad else str(past)
    extra = []
    if causal:
        extra.append(f"(j <= i + {offset} ? {lit(0, dt)} : {neg_inf})")
    left, right = int(node.attr("left_window_size", -1)), int(node.attr("right_window_size", -1))
    window = ([f"i + {offset} - j <= {left}"] if left >= 0 else []) + \
        ([f"j - i - {offset} <= {right}"] if right >= 0 else [])
    if window:
        extra.append(f"({' && '.join(window)} ? {lit(0, dt)} : {neg_inf})")
    if nonpad:
        extra.append(f"(j < {ref(ctx, nonpad, ['b'])} ? {lit(0, dt)} : {neg_inf})")
    bias = " + ".join(([bias] if bias else []) + extra)
    logits = f"{capped} + {bias}" if bias else capped
    if sp_dt != dt:
        logits = cast_to(sp_dt, logits)
    lg = ctx.temp("logits")
    stmts.append(temp_stmt(ctx, lg, ["b", "h", "i", "j"], s4, "=", logits))
    lij = f"{lg}(b, h, i, j)"
    mx, sm, prob = ctx.temp("max"), ctx.temp("sum"), ctx.temp("prob")
    row = ["b", "h", "i"]
    stmts.append(temp_stmt(ctx, mx, row, s4[:3], "max=!", lij))
    stmts.append(temp_stmt(ctx, sm, row, s4[:3], "+=!", f"exp({lij} - {mx}(b, h, i))"))
    sp_inf = lit(float("-inf"), sp_dt)
    p = (f"{mx}(b, h, i) == {sp_inf} ? {lit(0, sp_dt)} : "
         f"exp({lij} - {mx}(b, h, i)) / {sm}(b, h, i)")
    stmts.append(temp_stmt(ctx, prob, ["b", "h", "i", "j"], s4, "=",
                           cast_to(dt, f"({p})") if sp_dt != dt else p))
    pij = f"{prob}(b, h, i, j)"
    y = outs[0]
    if rank == 4:
        vval = kv(val, val_graph, v, "b", kh, "j", "e", dv)
        stmts.append(stmt(ctx, y, ["b", "h", "i", "e"], "+=!", f"{pij} * {vval}"))
    else:
        h, e = f"c / {dv}", f"c % {dv}"
        vh = f"c / {dv * rep}" if rep > 1 else h
        vval = kv(val, val_graph, v, "b", vh, "j", e, dv)
        stmts.append(stmt(ctx, y, ["b", "i", "c"], "+=!",
                          f"{prob}(b, {h}, i, j) * {vval}"))
    if outs[3]:
        picked = {0: sij, 1: capped, 2: f"{capped} + {bias}" if bias else capped, 3: pij}
        if mode not in picked:
            raise unsupported(node, f"qk_matmul_output_mode {mode}")
        stmts.append(stmt(ctx, outs[3], ["b", "h", "i", "j"], "=", picked[mode]))
    return Lowered(stmts)


def _bias(node: Node, ctx: LowerContext, total: int, batch: int, hq: int, sq: int, dt: str,
          neg_inf: str) -> str:
    """The attention mask as an additive bias at ``(b, h, i, j)`` ("" if none)."""
    parts = []
    if present(node, 3):
        mask = node.inputs[3]
        ms = ctx.shape(mask)
        out_idx = ["b", "h", "i", "j"][4 - len(ms):]
        full = (batch, hq, sq, total)[4 - len(ms):]
        if len(ms) > 4:
            raise unsupported(node, f"attn_mask of rank {len(ms)}")
        idx = []
        for d, n in enumerate(ms):
            if n == 1 and full[d] != 1:
                idx.append("0")
            elif d == len(ms) - 1 and n <= full[d]:
                idx.append(out_idx[d])
            elif n == full[d]:
                idx.append(out_idx[d])
            else:
                raise unsupported(node, f"attn_mask shape {list(ms)} does not broadcast to "
                                        f"{[batch, hq, sq, total]}")
        m = ref(ctx, mask, idx)
        length = ms[-1]
        pad = f"j < {length}" if length < total else ""
        if ctx.dtype(mask) == "bool":
            cond = f"{pad} && {m}" if pad else m
            parts.append(f"({cond} ? {lit(0, dt)} : {neg_inf})")
        else:
            parts.append(f"({pad} ? {m} : {neg_inf})" if pad else m)
    return " + ".join(parts)
