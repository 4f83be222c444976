"""The values a card's matrices and parameter vectors hold, from a checkpoint's weights.

Owns
----
``fold_layer_norm`` and one builder per stored matrix: c_attn (with ln_1 folded in, q scaled by
1 / sqrt(head_dim), rows in the layout of ``Dims``: K, V with its row of ones, q), attn.c_proj
(input columns by head, hdp each), c_fc (with ln_2 folded in), mlp.c_proj (a range of its
input columns) and the LM head (the tied embedding with ln_f folded in), each for this card's
share (``Partition``). Builders return float32 arrays in the model's [out, in] orientation;
the HBM image rounds them to fp16 once and stores them in stream order.

``w`` is a checkpoint's weights by Hugging Face name (host/model.py), Conv1D weights [in, out].
"""

import numpy as np

__all__ = ["fold_layer_norm", "c_attn", "attn_proj", "c_fc", "mlp_proj", "lm_head", "layer_params"]


def fold_layer_norm(wt, bias, g, b):
    """A LayerNorm (gain g, shift b) folded into the linear layer after it (weights wt
    [out, d], bias): W (((x - mean) r) g + b) + bias = r (W diag(g) (I - 11^T / d)) x + (W b +
    bias), r = 1 / sqrt(var + eps). The matrix unit then runs on x itself (its fp16 copy) while
    the vector unit computes the mean and r beside it, and each output row becomes r z + bias'.
    The centred matrix's rows sum to zero, so x's mean drops out of z in exact arithmetic; in
    fp16 weights the residue is about |mean| / std x 2^-12 of z (docs/numerics.md). Computed in
    float64, returned as float32 (the image rounds the weights to fp16 once)."""
    wg = np.asarray(wt, np.float64) * np.asarray(g, np.float64)[None, :]
    wc = wg - wg.mean(axis=1, keepdims=True)
    b2 = np.asarray(bias, np.float64) + np.asarray(wt, np.float64) @ np.asarray(b, np.float64)
    return wc.astype(np.float32), b2.astype(np.float32)


def c_attn(w, i, shape, part, dims):
    """Layer i's c_attn for this card's heads, ln_1 folded in: (matrix [2 dq + dv, d], bias).

    Rows: the heads' K (hdp rows each, from ``dims.k_off``), V (hvp each, from ``dims.v_off``;
    row hdp of each head's V has zero weights and bias 1: the row of ones), q (hdp each, from
    ``dims.q_off``, weights and bias scaled by 1 / sqrt(head_dim), exact when head_dim is a
    power of 4); padding rows zero."""
    p, d, hd, H = f"h.{i}.", shape.d_model, shape.head_dim, part.mine.H
    scale = 1.0 / np.sqrt(hd)
    wa, ba = fold_layer_norm(w[p + "attn.c_attn.weight"].T, w[p + "attn.c_attn.bias"],
                             w[p + "ln_1.weight"], w[p + "ln_1.bias"])      # [3d, d]: q, k, v
    out = np.zeros((2 * dims.dq + dims.dv, d), np.float32)
    bias = np.zeros(2 * dims.dq + dims.dv, np.float32)
    for kind in range(3):
        for h in range(H):
            g = part.h0 + h                                 # the model's head index
            src = slice(kind * d + g * hd, kind * d + (g + 1) * hd)
            r0 = (dims.q_off, dims.k_off, dims.v_off)[kind] + h * (dims.hvp if kind == 2 else dims.hdp)
            s = scale if kind == 0 else 1.0
            out[r0:r0 + hd] = wa[src] * s
            bias[r0:r0 + hd] = ba[src] * s
    for h in range(H):
        bias[dims.v_off + h * dims.hvp + dims.hdp] = 1.0     # the row of ones
    return out, bias


def attn_proj(w, i, shape, part, dims):
    """Layer i's attn.c_proj for this card's heads: matrix [d, dq], input columns the heads'
    outputs, hdp each (padding columns zero)."""
    hd, hdp = shape.head_dim, dims.hdp
    wt = w[f"h.{i}.attn.c_proj.weight"].T
    out = np.zeros((shape.d_model, dims.dq), np.float32)
    for h in range(part.mine.H):
        g = part.h0 + h
        out[:, h * hdp:h * hdp + hd] = wt[:, g * hd:(g + 1) * hd]
    return out


def c_fc(w, i, part):
    """Layer i's c_fc for this card's MLP columns, ln_2 folded in: (matrix [F, d], bias [F])."""
    p, f0, F = f"h.{i}.", part.f0, part.mine.F
    return fold_layer_norm(w[p + "mlp.c_fc.weight"].T[f0:f0 + F], w[p + "mlp.c_fc.bias"][f0:f0 + F],
                           w[p + "ln_2.weight"], w[p + "ln_2.bias"])


def mlp_proj(w, i, part, c0, c1):
    """Layer i's mlp.c_proj over this card's MLP columns [c0, c1): matrix [d, c1 - c0]."""
    return w[f"h.{i}.mlp.c_proj.weight"].T[:, part.f0 + c0:part.f0 + c1]


def lm_head(w, part, dims):
    """The LM head for this card's vocabulary slice, ln_f folded into the tied embedding's
    copy: (matrix [V, d], bias [vS], padding zero)."""
    v0, V = part.v0, part.mine.V
    wh, bh = fold_layer_norm(w["wte.weight"][v0:v0 + V], np.zeros(V), w["ln_f.weight"], w["ln_f.bias"])
    bias = np.zeros(dims.vS, np.float32)
    bias[:V] = bh
    return wh, bias


def layer_params(w, i, qkv_bias, fc_bias):
    """Layer i's parameter vector's parts (``ParamLayout``): c_attn's bias and c_fc's, as
    ``c_attn`` and ``c_fc`` made them, and attn.c_proj's and mlp.c_proj's."""
    p = f"h.{i}."
    return [qkv_bias, w[p + "attn.c_proj.bias"], fc_bias, w[p + "mlp.c_proj.bias"]]
