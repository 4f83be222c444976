"""Float64 GPT-2 in numpy: the accuracy reference for the compiled model.

Weights are given with Hugging Face's names and conventions (Conv1D weights [in, out], the LM
head tied to the token embedding). ``forward`` runs a whole sequence (no KV cache is needed
for a reference); ``hidden`` returns the residual stream after every layer as well.
"""

import numpy as np

__all__ = ["forward", "hidden", "layer_norm", "gelu_tanh"]


def layer_norm(x, g, b, eps):
    mu = x.mean(-1, keepdims=True)
    var = ((x - mu) ** 2).mean(-1, keepdims=True)
    return (x - mu) / np.sqrt(var + eps) * g + b


def gelu_tanh(x):
    return 0.5 * x * (1 + np.tanh(np.sqrt(2 / np.pi) * (x + 0.044715 * x ** 3)))


def _block(x, w, i, n_head, eps):
    p = f"h.{i}."
    T, d = x.shape
    hd = d // n_head
    a = layer_norm(x, w[p + "ln_1.weight"], w[p + "ln_1.bias"], eps)
    qkv = a @ w[p + "attn.c_attn.weight"] + w[p + "attn.c_attn.bias"]
    q, k, v = qkv[:, :d], qkv[:, d:2 * d], qkv[:, 2 * d:]
    out = np.empty_like(q)
    mask = np.tril(np.ones((T, T), bool))
    for h in range(n_head):
        s = slice(h * hd, (h + 1) * hd)
        sc = q[:, s] @ k[:, s].T / np.sqrt(hd)
        sc = np.where(mask, sc, -np.inf)
        sc = np.exp(sc - sc.max(-1, keepdims=True))
        sc /= sc.sum(-1, keepdims=True)
        out[:, s] = sc @ v[:, s]
    x = x + out @ w[p + "attn.c_proj.weight"] + w[p + "attn.c_proj.bias"]
    a = layer_norm(x, w[p + "ln_2.weight"], w[p + "ln_2.bias"], eps)
    h = gelu_tanh(a @ w[p + "mlp.c_fc.weight"] + w[p + "mlp.c_fc.bias"])
    return x + h @ w[p + "mlp.c_proj.weight"] + w[p + "mlp.c_proj.bias"]


def hidden(weights, tokens, n_head, n_layer, eps=1e-5):
    """Residual stream after the embedding and after each layer: [n_layer + 1, T, d]."""
    w = {k: np.asarray(v, np.float64) for k, v in weights.items()}
    tokens = np.asarray(tokens)
    x = w["wte.weight"][tokens] + w["wpe.weight"][np.arange(len(tokens))]
    out = [x]
    for i in range(n_layer):
        x = _block(x, w, i, n_head, eps)
        out.append(x)
    return np.stack(out)


def forward(weights, tokens, n_head, n_layer, eps=1e-5):
    """Logits [T, vocab] for every position of ``tokens``."""
    x = hidden(weights, tokens, n_head, n_layer, eps)[-1]
    w = {k: np.asarray(v, np.float64) for k, v in weights.items() if k.startswith(("ln_f", "wte"))}
    x = layer_norm(x, w["ln_f.weight"], w["ln_f.bias"], eps)
    return x @ w["wte.weight"].T
