"""The demo model with int8 weights against fp16 weights and float64: perplexity on a passage
of its training text and on a held-out passage (written for this check, not in the corpus),
and the logit error against float64 over every position. Runs the ISS (bit-exact to what the
card computes) on one tiny card; docs/numerics.md quotes its table.

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
          "| worst logit error, fp16 | int8 |")
    print("|---|---|---|---|---|---|---|")
    for name, ids in texts.items():
        f64 = ref.forward(model.weights, ids, sh.n_head, sh.n_layer, sh.eps)
        spread = f64.max(-1) - f64.min(-1)
        row = [name, str(len(ids)), f"{perplexity(f64, ids):.3f}"]
        errs = []
        for cfg_name in ("tiny", "tiny-int8"):
            cfg = load_config(ROOT / "configs" / f"{cfg_name}.yaml").replace(cards=1)
            lg = iss_logits(cfg, model, ids)
            row.append(f"{perplexity(lg, ids):.3f}")
            errs.append(f"{(np.abs(lg - f64).max(-1) / spread).max():.1e}")
        print("| " + " | ".join(row + errs) + " |")


if __name__ == "__main__":
    main()
