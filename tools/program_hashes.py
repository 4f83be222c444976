"""Hashes of what the compiler emits, for refactors that must not change behaviour.

    python tools/program_hashes.py --write     # record tools/program_hashes.json
    python tools/program_hashes.py --check     # compare against it: exit 1 on any difference

Covers the demo model on 1-4 tiny cards (image and programs: prefill, decode at several
positions, the all-logits and hidden-state dumps), GPT-2-small-shaped layers with random
weights on medium (image and programs), and GPT-2 1.5B's shapes on 1, 2, 4 and 16 u280x4
cards (programs and the HBM layout, no weights). A program's hash covers its instruction
words; an image's, every allocated part (stripe row and bytes), the KV cache's rows and the
program address.
"""

import hashlib
import json
import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
RECORD = ROOT / "tools" / "program_hashes.json"
sys.path.insert(0, str(ROOT))

from gen.config import load_config  # noqa: E402
from host.compiler import CompiledModel  # noqa: E402
from host.model import SHAPES, Gpt2, Gpt2Shape, load_checkpoint, random_gpt2  # noqa: E402


def _h(*chunks):
    h = hashlib.sha256()
    for c in chunks:
        h.update(c if isinstance(c, bytes) else repr(c).encode())
    return h.hexdigest()[:16]


def program_hash(words):
    return _h(b"".join(int(w).to_bytes(16, "little") for w in words))


def image_hash(cm):
    parts = [(row, bytes(data)) for row, data in cm.img.parts]
    return _h(*(p for row, data in parts for p in (row, data)), cm.kv_rows, cm.prog_addr)


def case(cm, steps):
    out = {"image": image_hash(cm) if cm.weights is not None else _h(cm.kv_rows, cm.prog_addr,
                                                                       cm.img.next_row),
           "T": cm.T}
    for name, tokens, pos in steps:
        toks = [(7 * k + 3) % cm.sh.vocab for k in range(tokens or cm.T)]
        out[name] = program_hash(cm.step(toks, pos))
    return out


def main():
    tiny = load_config(ROOT / "configs" / "tiny.yaml")
    medium = load_config(ROOT / "configs" / "medium.yaml")
    u280 = load_config(ROOT / "configs" / "u280x4.yaml")
    res = {}
    demo = load_checkpoint(ROOT / "host" / "demo")
    steps = [("prefill0", None, 0), ("prefill3", 3, 5), ("decode19", 1, 19), ("decode100", 1, 100),
             ("decode127", 1, 127)]
    for cards in (1, 2, 3, 4):
        for card in range(cards):
            res[f"tiny demo {card}/{cards}"] = case(CompiledModel(tiny, demo, card=card, cards=cards),
                                                    steps)
    for kw in ({"all_logits": True}, {"dump_hidden": True}, {"param_areas": 1}, {"max_tokens": 3}):
        res[f"tiny demo 0/1 {kw}"] = case(CompiledModel(tiny, demo, **kw), steps)
        res[f"tiny demo 1/2 {kw}"] = case(CompiledModel(tiny, demo, card=1, cards=2, **kw), steps)
    small2 = Gpt2Shape(n_layer=2, n_head=12, d_model=768, vocab=1024, n_positions=128)
    m = random_gpt2(small2, np.random.default_rng(0))
    med_steps = [("prefill0", None, 0), ("decode4", 1, 4), ("decode100", 1, 100)]
    res["medium small2 0/1"] = case(CompiledModel(medium, m), med_steps)
    res["medium small2 300MHz"] = case(CompiledModel(medium.replace(clock_mhz=300), m), med_steps)
    xl = Gpt2(SHAPES["gpt2-xl"], None)
    xl_steps = [("prefill0", None, 0), ("decode64", 1, 64), ("decode1000", 1, 1000)]
    for cards in (1, 2, 4, 16):
        c = u280.replace(cards=cards)
        for card in sorted({0, cards - 1}):
            res[f"u280x4 gpt2-xl {card}/{cards}"] = case(CompiledModel(c, xl, card=card, cards=cards),
                                                         xl_steps)
    # The performance model's figures on the same programs (host/perf.py replays them).
    from host.perf import predict, simulate
    for cards in (1, 2, 4):
        cms = [CompiledModel(tiny, demo, card=i, cards=cards) for i in range(cards)]
        for name, tokens, pos in steps:
            toks = [(7 * k + 3) % demo.shape.vocab for k in range(tokens or cms[0].T)]
            r = simulate(tiny, [cm.step(toks, pos) for cm in cms])
            res[f"perf tiny demo {cards} {name}"] = r["cycles"]
    for cards in (1, 2, 4, 16):
        r = predict(u280.replace(cards=cards), SHAPES["gpt2-xl"], cards=cards, prompt=64, new_tokens=64)
        res[f"perf u280x4 gpt2-xl {cards} [64:64]"] = r
    text = json.dumps(res, indent=1, sort_keys=True) + "\n"
    if "--write" in sys.argv:
        RECORD.write_text(text)
    elif "--check" in sys.argv:
        old = json.loads(RECORD.read_text())
        bad = [k for k in sorted(set(old) | set(res)) if old.get(k) != res.get(k)]
        for k in bad:
            print(f"differs: {k}: recorded {old.get(k)}, now {res.get(k)}")
        print(f"{len(res) - len(bad)} of {len(res)} cases identical")
        sys.exit(1 if bad else 0)
    else:
        sys.stdout.write(text)


if __name__ == "__main__":
    main()
