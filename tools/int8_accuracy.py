"""The demo model with int8 and int16 weights against fp16 weights and float64: perplexity on
a passage of its training text and on a held-out passage (written for this check, not in the
corpus), and the logit error against float64 over every position. Runs the ISS (bit-exact to
what the card computes) on one tiny card. Then random GPT-2s of GPT-2 small's width (d_model
768, 12 heads, 2 layers, a vocabulary of 1024; GPT-2's initialisation) on one medium card,
fp16, int8 and int16 weights (core.reuse 2): greedy decoding against float64, the worst logit
error relative to the spread, how many greedy tokens equal float64's, and the int8 logits
against the fp16 ones. docs/numerics.md quotes both tables.

    python tools/int8_accuracy.py
"""

import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from gen.config import load_config  # noqa: E402
from host.compiler import CompiledModel  # noqa: E402
from host.model import load_checkpoint  # noqa: E402
from host.tokenizer import load_tokenizer  # noqa: E402
from sim.ref import gpt2 as ref  # noqa: E402
from sim.ref.iss import IssDevice  # noqa: E402

HELD_OUT = ("At dawn the keeper walked along the shore and counted the boats that had come in "
            "during the night. The machine listened to the wind and wrote a short line about "
            "the colour of the water, and she read it aloud to the gulls.")


def iss_logits(cfg, model, ids):
    """Logits at every position of ``ids`` (one card's ISS, steps of the compiled T tokens)."""
    cm = CompiledModel(cfg, model, all_logits=True)
    dev = IssDevice(cfg)
    cm.load(dev)
    out = []
    for p in range(0, len(ids), cm.T):
        toks = ids[p:p + cm.T]
        c = dev.run(cm.step(toks, p), cm.prog_addr, timeout_s=600)
        if c["status"] & 0xFF:
            raise RuntimeError(f"status {c['status']:#x}")
        out.append(cm.read_logits(dev, len(toks)))
    return np.concatenate(out).astype(np.float64)


def perplexity(logits, ids):
    """exp(mean negative log-likelihood of ids[1:] given the logits before them)."""
    lg = logits[:-1]
    lg = lg - lg.max(-1, keepdims=True)
    logp = lg - np.log(np.exp(lg).sum(-1, keepdims=True))
    return float(np.exp(-logp[np.arange(len(ids) - 1), ids[1:]].mean()))


def main():
    model = load_checkpoint(ROOT / "host" / "demo")
    tok = load_tokenizer(ROOT / "host" / "demo")
    n = model.shape.n_positions
    corpus = (ROOT / "tools" / "demo_corpus.txt").read_text()
    texts = {"training text": tok.encode(corpus)[200:200 + n], "held-out text": tok.encode(HELD_OUT)[:n]}
    sh = model.shape
    print("| text | tokens | float64 | fp16 weights (ISS) | int8 weights (ISS) "
          "| int16 weights (ISS) | worst logit error, fp16 | int8 | int16 |")
    print("|---|---|---|---|---|---|---|---|---|")
    for name, ids in texts.items():
        f64 = ref.forward(model.weights, ids, sh.n_head, sh.n_layer, sh.eps)
        spread = f64.max(-1) - f64.min(-1)
        row = [name, str(len(ids)), f"{perplexity(f64, ids):.3f}"]
        errs = []
        for cfg_name in ("tiny", "tiny-int8", "tiny-int16"):
            cfg = load_config(ROOT / "configs" / f"{cfg_name}.yaml").replace(cards=1)
            lg = iss_logits(cfg, model, ids)
            row.append(f"{perplexity(lg, ids):.3f}")
            errs.append(f"{(np.abs(lg - f64).max(-1) / spread).max():.1e}")
        print("| " + " | ".join(row + errs) + " |")


def greedy_iss(cfg, model, ids, steps):
    """Greedy decoding on one card's ISS: the generated tokens and each step's logits."""
    cm = CompiledModel(cfg, model)
    dev = IssDevice(cfg)
    cm.load(dev)
    seq, out = list(ids), []
    for p in range(0, len(ids), cm.T):                      # the prompt, steps of T tokens
        toks = ids[p:p + cm.T]
        c = dev.run(cm.step(toks, p), cm.prog_addr, timeout_s=600)
        if c["status"] & 0xFF:
            raise RuntimeError(f"status {c['status']:#x}")
    lg = cm.read_logits(dev, 1)[-1].astype(np.float64)
    for _ in range(steps):
        out.append(lg)
        seq.append(int(np.argmax(lg)))
        c = dev.run(cm.step([seq[-1]], len(seq) - 1), cm.prog_addr, timeout_s=600)
        if c["status"] & 0xFF:
            raise RuntimeError(f"status {c['status']:#x}")
        lg = cm.read_logits(dev, 1)[-1].astype(np.float64)
    return seq[len(ids):], np.stack(out)


def random_models(seeds=(1, 2, 3), steps=16):
    from host.model import Gpt2Shape, random_gpt2
    shape = Gpt2Shape(n_layer=2, n_head=12, d_model=768, vocab=1024, n_positions=128)
    medium = load_config(ROOT / "configs" / "medium.yaml")
    cfgs = {"fp16": medium, "int8": medium.replace(**{"core.reuse": 2, "core.weight_dtype": "int8"}),
            "int16": medium.replace(**{"core.weight_dtype": "int16"})}
    print("| random GPT-2, seed | worst logit error / spread, fp16 | int8 | int16 | int8 against "
          "fp16 | greedy steps equal to float64's, fp16 | int8 | int16 | float64's top-2 margin / "
          "spread where int8 first differs |")
    print("|---|---|---|---|---|---|---|---|---|")
    for seed in seeds:
        rng = np.random.default_rng(seed)
        model = random_gpt2(shape, rng)
        ids = [int(t) for t in rng.integers(0, shape.vocab, 8)]
        seq, f64 = list(ids), []
        for _ in range(steps):                               # float64's greedy run
            lg = ref.forward(model.weights, seq, shape.n_head, shape.n_layer, shape.eps)[-1]
            f64.append(lg)
            seq.append(int(np.argmax(lg)))
        want, f64 = seq[len(ids):], np.stack(f64)
        spread = f64.max(-1) - f64.min(-1)
        top2 = np.sort(f64, -1)[:, -2:]
        margin = (top2[:, 1] - top2[:, 0]) / spread
        runs = {k: greedy_iss(cfg, model, ids, steps) for k, cfg in cfgs.items()}

        def agree(a, b):                # steps before the first different token
            return next((i for i, (x, y) in enumerate(zip(a, b, strict=True)) if x != y), steps)

        def err(lg, ref_lg, n, spread=spread):   # the steps both saw the same text, and the next
            n = min(n + 1, steps)
            return (np.abs(lg[:n] - ref_lg[:n]).max(-1) / spread[:n]).max()
        row = [str(seed)]
        n16, n8 = agree(runs["fp16"][0], want), agree(runs["int8"][0], want)
        ni = agree(runs["int16"][0], want)
        row += [f"{err(runs['fp16'][1], f64, n16):.1e}", f"{err(runs['int8'][1], f64, n8):.1e}",
                f"{err(runs['int16'][1], f64, ni):.1e}",
                f"{err(runs['int8'][1], runs['fp16'][1], agree(runs['int8'][0], runs['fp16'][0])):.1e}",
                f"{n16} of {steps}", f"{n8} of {steps}", f"{ni} of {steps}",
                f"{margin[n8]:.1e}" if n8 < steps else "-"]
        print("| " + " | ".join(row) + " |")

if __name__ == "__main__":
    main()
    print()
    random_models()
