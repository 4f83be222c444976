"""Weight storage formats for the matrix unit, measured before any RTL (issue 20, the LUTs for
R = 4; docs/numerics.md quotes the table).

Every matrix of the model (the four of each layer and the LM head) is rounded to a format and
the model runs in float64 otherwise (sim/ref/gpt2.py), so the table shows what the format
alone does to the logits, against the same model with its own weights:

- block 17 bits: each run of 64 weights of a row aligned to its largest (17 magnitude bits,
  truncated toward zero), as the matrix unit aligns a tile row today (hw/arith/dot.py);
- block 15 bits: the same with 15 bits, what 16-bit pre-aligned weights with a sign could hold
  (one exponent per 64 weights beside them);
- int16 / int12 / int8 with a scale per row: symmetric, a power-of-two scale per output row,
  rounded to nearest even (int8 is core.weight_dtype int8's host/compiler/quant.py).

Models: the demo model on 128 tokens of its training text, and random GPT-2s of GPT-2 small's
width (2 layers, GPT-2's initialisation; seeds 1 to 3) on 32 random tokens. Each cell: the
worst and the mean over positions of max |logit error| / the logits' spread, and the positions
whose top token is unchanged.

    python tools/weight_formats.py
"""

import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from host.compiler.quant import quantize_rows  # noqa: E402
from host.model import Gpt2Shape, load_checkpoint, random_gpt2  # noqa: E402
from host.tokenizer import load_tokenizer  # noqa: E402
from sim.ref import gpt2 as ref  # noqa: E402

MATRICES = ("attn.c_attn.weight", "attn.c_proj.weight", "mlp.c_fc.weight", "mlp.c_proj.weight")


def block_aligned(rows, bits, block=64):
    """Each ``block`` weights of a row aligned to the largest among them: ``bits`` magnitude
    bits, truncated toward zero (quantum 2^(floor(log2 max) + 1 - bits))."""
    out = np.empty_like(rows)
    for c0 in range(0, rows.shape[1], block):
        b = rows[:, c0:c0 + block]
        m = np.abs(b).max(-1, keepdims=True)
        q = np.exp2(np.floor(np.log2(np.where(m > 0, m, 1.0))) + 1 - bits)
        out[:, c0:c0 + block] = np.trunc(b / q) * q
    return out


def scaled_rows(rows, qmax):
    """Symmetric integers with the smallest power-of-two scale per row that holds the row's
    largest within ``qmax``, rounded to nearest even."""
    m = np.abs(rows).max(-1, keepdims=True)
    s = np.exp2(np.ceil(np.log2(np.where(m > 0, m / qmax, 1.0))))
    return np.rint(rows / s) * s


def int8_rows(rows):
    q, e = quantize_rows(rows)
    return q.astype(np.float64) * np.exp2(e.astype(np.float64) - 127)[:, None]


FORMATS = {
    "block 17 bits (built)": lambda r: block_aligned(r, 17),
    "block 15 bits": lambda r: block_aligned(r, 15),
    "int16, scale per row": lambda r: scaled_rows(r, 32767),
    "int12, scale per row": lambda r: scaled_rows(r, 2047),
    "int8, scale per row": int8_rows,
}


def logits(weights, shape, ids, fmt):
    w = {k: np.asarray(v, np.float64) for k, v in weights.items()}
    q = dict(w)
    for i in range(shape.n_layer):
        for name in MATRICES:
            k = f"h.{i}.{name}"
            q[k] = fmt(w[k].T).T            # Conv1D is [in, out]: a row is one output's weights
    x = ref.hidden(q, ids, shape.n_head, shape.n_layer, shape.eps)[-1]
    x = ref.layer_norm(x, w["ln_f.weight"], w["ln_f.bias"], shape.eps)
    return x @ fmt(w["wte.weight"]).T       # the LM head (the embedding lookup keeps fp16)


def row(name, weights, shape, ids):
    base = logits(weights, shape, ids, lambda r: r)
    spread = base.max(-1) - base.min(-1)
    top = base.argmax(-1)
    cells = []
    for fmt in FORMATS.values():
        lg = logits(weights, shape, ids, fmt)
        e = np.abs(lg - base).max(-1) / spread
        cells.append(f"{e.max():.1e} / {e.mean():.1e} ({int((lg.argmax(-1) == top).sum())} of {len(ids)})")
    return f"| {name} | " + " | ".join(cells) + " |"


def main():
    print("| model | " + " | ".join(FORMATS) + " |")
    print("|---|" + "---|" * len(FORMATS))
    demo = load_checkpoint(ROOT / "host" / "demo")
    tok = load_tokenizer(ROOT / "host" / "demo")
    text = (ROOT / "tools" / "demo_corpus.txt").read_text()
    ids = tok.encode(text)[200:200 + demo.shape.n_positions]
    print(row("demo model, training text", demo.weights, demo.shape, ids), flush=True)
    shape = Gpt2Shape(n_layer=2, n_head=12, d_model=768, vocab=1024, n_positions=128)
    for seed in (1, 2, 3):
        rng = np.random.default_rng(seed)
        model = random_gpt2(shape, rng)
        ids = [int(t) for t in rng.integers(0, shape.vocab, 32)]
        print(row(f"random GPT-2 small width, seed {seed}", model.weights, shape, ids), flush=True)


if __name__ == "__main__":
    main()
