"""Train the demo model that `make run` uses: a small GPT-2 on tools/demo_corpus.txt.

    .venv/bin/python tools/train_demo.py [--steps 3000] [--out host/demo] [--check]

The corpus was written for gptfpga (no third-party text). The tokenizer is a byte-level BPE
(GPT-2's scheme) with 512 tokens, trained on the corpus by the `tokenizers` library; the model
is GPT-2's architecture (pre-LN blocks, tanh GELU, learned positions, LM head tied to the token
embedding) at d_model 128, 4 heads, 4 layers, 128 positions: it fits configs/tiny.yaml.
Training is plain numpy (float32, hand-written backward pass checked against finite
differences by --check), Adam with warm-up and cosine decay. The result is written as a
Hugging Face GPT-2 directory: config.json, model.safetensors (float16), vocab.json, merges.txt.
"""

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
EPS = 1e-5
C_GELU = np.sqrt(2 / np.pi)


def init(shape, rng):
    d, F, L = shape["d"], 4 * shape["d"], shape["layers"]
    p = {"wte.weight": rng.normal(0, 0.02, (shape["vocab"], d)),
         "wpe.weight": rng.normal(0, 0.01, (shape["ctx"], d)),
         "ln_f.weight": np.ones(d), "ln_f.bias": np.zeros(d)}
    for i in range(L):
        h = f"h.{i}."
        p.update({h + "ln_1.weight": np.ones(d), h + "ln_1.bias": np.zeros(d),
                  h + "attn.c_attn.weight": rng.normal(0, 0.02, (d, 3 * d)),
                  h + "attn.c_attn.bias": np.zeros(3 * d),
                  h + "attn.c_proj.weight": rng.normal(0, 0.02 / np.sqrt(2 * L), (d, d)),
                  h + "attn.c_proj.bias": np.zeros(d),
                  h + "ln_2.weight": np.ones(d), h + "ln_2.bias": np.zeros(d),
                  h + "mlp.c_fc.weight": rng.normal(0, 0.02, (d, F)), h + "mlp.c_fc.bias": np.zeros(F),
                  h + "mlp.c_proj.weight": rng.normal(0, 0.02 / np.sqrt(2 * L), (F, d)),
                  h + "mlp.c_proj.bias": np.zeros(d)})
    return {k: v.astype(np.float32) for k, v in p.items()}


def ln_fwd(x, g, b):
    mu = x.mean(-1, keepdims=True)
    xc = x - mu
    rs = 1 / np.sqrt((xc * xc).mean(-1, keepdims=True) + EPS)
    xh = xc * rs
    return xh * g + b, (xh, rs, g)


def ln_bwd(dy, cache):
    xh, rs, g = cache
    dxh = dy * g
    dg = (dy * xh).reshape(-1, xh.shape[-1]).sum(0)
    db = dy.reshape(-1, xh.shape[-1]).sum(0)
    dx = rs * (dxh - dxh.mean(-1, keepdims=True) - xh * (dxh * xh).mean(-1, keepdims=True))
    return dx, dg, db


def loss_and_grads(p, tok, tgt, shape):
    """Mean cross-entropy of predicting tgt from tok [B, T], and its gradients."""
    B, T = tok.shape
    d, H, L = shape["d"], shape["heads"], shape["layers"]
    hd = d // H
    g = {k: np.zeros_like(v) for k, v in p.items()}
    x = p["wte.weight"][tok] + p["wpe.weight"][:T]
    mask = np.triu(np.full((T, T), -1e9, np.float32), 1)
    caches = []
    for i in range(L):
        h = f"h.{i}."
        a, c1 = ln_fwd(x, p[h + "ln_1.weight"], p[h + "ln_1.bias"])
        qkv = a @ p[h + "attn.c_attn.weight"] + p[h + "attn.c_attn.bias"]
        q, k, v = (qkv[..., j * d:(j + 1) * d].reshape(B, T, H, hd).transpose(0, 2, 1, 3) for j in range(3))
        s = q @ k.transpose(0, 1, 3, 2) / np.sqrt(hd) + mask
        s = np.exp(s - s.max(-1, keepdims=True))
        att = s / s.sum(-1, keepdims=True)
        o = (att @ v).transpose(0, 2, 1, 3).reshape(B, T, d)
        x1 = x + o @ p[h + "attn.c_proj.weight"] + p[h + "attn.c_proj.bias"]
        a2, c2 = ln_fwd(x1, p[h + "ln_2.weight"], p[h + "ln_2.bias"])
        u = a2 @ p[h + "mlp.c_fc.weight"] + p[h + "mlp.c_fc.bias"]
        t = np.tanh(C_GELU * (u + 0.044715 * u ** 3))
        f = 0.5 * u * (1 + t)
        x = x1 + f @ p[h + "mlp.c_proj.weight"] + p[h + "mlp.c_proj.bias"]
        caches.append((a, c1, q, k, v, att, o, a2, c2, u, t, f))
    xf, cf = ln_fwd(x, p["ln_f.weight"], p["ln_f.bias"])
    logits = xf @ p["wte.weight"].T
    logits -= logits.max(-1, keepdims=True)
    e = np.exp(logits)
    prob = e / e.sum(-1, keepdims=True)
    n = B * T
    flat = prob.reshape(n, -1)
    loss = -np.log(flat[np.arange(n), tgt.reshape(-1)] + 1e-30).mean()
    dlog = flat.copy()
    dlog[np.arange(n), tgt.reshape(-1)] -= 1
    dlog = (dlog / n).reshape(B, T, -1)
    g["wte.weight"] += dlog.reshape(n, -1).T @ xf.reshape(n, d)
    dx, g["ln_f.weight"], g["ln_f.bias"] = ln_bwd(dlog @ p["wte.weight"], cf)
    for i in reversed(range(L)):
        h = f"h.{i}."
        a, c1, q, k, v, att, o, a2, c2, u, t, f = caches[i]
        g[h + "mlp.c_proj.weight"] = f.reshape(n, -1).T @ dx.reshape(n, d)
        g[h + "mlp.c_proj.bias"] = dx.reshape(n, d).sum(0)
        df = dx @ p[h + "mlp.c_proj.weight"].T
        du = df * (0.5 * (1 + t) + 0.5 * u * (1 - t * t) * C_GELU * (1 + 3 * 0.044715 * u * u))
        g[h + "mlp.c_fc.weight"] = a2.reshape(n, d).T @ du.reshape(n, -1)
        g[h + "mlp.c_fc.bias"] = du.reshape(n, -1).sum(0)
        dx2, g[h + "ln_2.weight"], g[h + "ln_2.bias"] = ln_bwd(du @ p[h + "mlp.c_fc.weight"].T, c2)
        dx1 = dx + dx2
        g[h + "attn.c_proj.weight"] = o.reshape(n, d).T @ dx1.reshape(n, d)
        g[h + "attn.c_proj.bias"] = dx1.reshape(n, d).sum(0)
        do = (dx1 @ p[h + "attn.c_proj.weight"].T).reshape(B, T, H, hd).transpose(0, 2, 1, 3)
        datt = do @ v.transpose(0, 1, 3, 2)
        dv = att.transpose(0, 1, 3, 2) @ do
        ds = att * (datt - (datt * att).sum(-1, keepdims=True)) / np.sqrt(hd)
        dq = ds @ k
        dk = ds.transpose(0, 1, 3, 2) @ q
        dqkv = np.concatenate([z.transpose(0, 2, 1, 3).reshape(B, T, d) for z in (dq, dk, dv)], -1)
        g[h + "attn.c_attn.weight"] = a.reshape(n, d).T @ dqkv.reshape(n, -1)
        g[h + "attn.c_attn.bias"] = dqkv.reshape(n, -1).sum(0)
        da, g[h + "ln_1.weight"], g[h + "ln_1.bias"] = ln_bwd(dqkv @ p[h + "attn.c_attn.weight"].T, c1)
        dx = dx1 + da
    np.add.at(g["wte.weight"], tok.reshape(-1), dx.reshape(n, d))
    g["wpe.weight"][:T] += dx.sum(0)
    return float(loss), g


def grad_check():
    """Finite differences (float64) against the backward pass on a very small model."""
    rng = np.random.default_rng(0)
    shape = {"d": 8, "heads": 2, "layers": 2, "vocab": 11, "ctx": 6}
    p = {k: v.astype(np.float64) * 10 for k, v in init(shape, rng).items()}
    tok = rng.integers(0, 11, (2, 5))
    tgt = rng.integers(0, 11, (2, 5))
    _, g = loss_and_grads(p, tok, tgt, shape)
    worst = 0.0
    for name, w in p.items():
        for idx in list(np.ndindex(w.shape))[:6]:
            old = w[idx]
            w[idx] = old + 1e-6
            lp, _ = loss_and_grads(p, tok, tgt, shape)
            w[idx] = old - 1e-6
            lm, _ = loss_and_grads(p, tok, tgt, shape)
            w[idx] = old
            num = (lp - lm) / 2e-6
            worst = max(worst, abs(num - g[name][idx]) / max(1e-6, abs(num) + abs(g[name][idx])))
    print(f"gradient check: worst relative error {worst:.2e}")
    return worst < 1e-4


def train_tokenizer(text, vocab, out):
    from tokenizers import ByteLevelBPETokenizer
    tok = ByteLevelBPETokenizer()
    tok.train_from_iterator([text], vocab_size=vocab, min_frequency=2,
                            special_tokens=["<|endoftext|>"], show_progress=False)
    out.mkdir(parents=True, exist_ok=True)
    tok.save_model(str(out))
    return tok


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=3000)
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--lr", type=float, default=3e-3)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", default=str(ROOT / "host" / "demo"))
    ap.add_argument("--check", action="store_true", help="only check the gradients")
    args = ap.parse_args(argv)
    if args.check:
        return 0 if grad_check() else 1
    shape = {"d": 128, "heads": 4, "layers": 4, "vocab": 512, "ctx": 128}
    out = Path(args.out)
    text = (ROOT / "tools" / "demo_corpus.txt").read_text()
    tok = train_tokenizer(text, shape["vocab"], out)
    shape["vocab"] = tok.get_vocab_size()
    ids = np.array(tok.encode(text).ids + [tok.token_to_id("<|endoftext|>")])
    print(f"corpus: {len(text)} characters, {len(ids)} tokens, vocabulary {shape['vocab']}")
    rng = np.random.default_rng(args.seed)
    p = init(shape, rng)
    m = {k: np.zeros_like(v) for k, v in p.items()}
    v2 = {k: np.zeros_like(v) for k, v in p.items()}
    T, b1, b2 = shape["ctx"], 0.9, 0.99
    t0 = time.time()
    ema = None
    for step in range(1, args.steps + 1):
        starts = rng.integers(0, len(ids) - T - 1, args.batch)
        tokb = np.stack([ids[s:s + T] for s in starts])
        tgtb = np.stack([ids[s + 1:s + T + 1] for s in starts])
        loss, g = loss_and_grads(p, tokb, tgtb, shape)
        ema = loss if ema is None else 0.98 * ema + 0.02 * loss
        warm = min(1.0, step / 200)
        lr = args.lr * warm * (0.1 + 0.9 * 0.5 * (1 + np.cos(np.pi * step / args.steps)))
        norm = np.sqrt(sum(float((x * x).sum()) for x in g.values()))
        clip = min(1.0, 1.0 / max(norm, 1e-12))
        for k in p:
            gk = g[k] * clip
            m[k] = b1 * m[k] + (1 - b1) * gk
            v2[k] = b2 * v2[k] + (1 - b2) * gk * gk
            upd = (m[k] / (1 - b1 ** step)) / (np.sqrt(v2[k] / (1 - b2 ** step)) + 1e-8)
            decay = 0.01 * p[k] if p[k].ndim == 2 else 0
            p[k] -= (lr * (upd + decay)).astype(np.float32)
        if step % 100 == 0 or step == args.steps:
            print(f"step {step}: loss {loss:.3f} (ema {ema:.3f}), lr {lr:.2e}, {time.time() - t0:.0f} s",
                  flush=True)
    from safetensors.numpy import save_file
    save_file({k: v.astype(np.float16) for k, v in p.items()}, str(out / "model.safetensors"),
              metadata={"format": "pt"})
    (out / "config.json").write_text(json.dumps({
        "model_type": "gpt2", "architectures": ["GPT2LMHeadModel"], "n_embd": shape["d"],
        "n_head": shape["heads"], "n_layer": shape["layers"], "n_positions": shape["ctx"],
        "n_ctx": shape["ctx"], "vocab_size": shape["vocab"], "layer_norm_epsilon": EPS,
        "activation_function": "gelu_new", "bos_token_id": tok.token_to_id("<|endoftext|>"),
        "eos_token_id": tok.token_to_id("<|endoftext|>"), "tie_word_embeddings": True}, indent=1) + "\n")
    (out / "TRAINING.json").write_text(json.dumps({
        "command": "python tools/train_demo.py " + " ".join(argv if argv is not None else sys.argv[1:]),
        "steps": args.steps, "batch": args.batch, "lr": args.lr, "seed": args.seed,
        "final_loss_ema": round(ema, 4), "corpus_tokens": int(len(ids)),
        "seconds": round(time.time() - t0)}, indent=1) + "\n")
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
