"""The table of docs/performance.md, "The interleave's lead": modelled cycles per input token
of a prefill step (a full step of T tokens at position T, as the second step of a 64-token
prompt) merged with each lead of host.compiler.tune.LEADS, GPT-2 shapes on 2 and 4 u280x4
cards, and a decode batch of 8 streams. Run: python tools/interleave_leads.py (about 15
minutes on 2 cores)."""

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from gen.config import load_config  # noqa: E402
from host.compiler import CompiledModel  # noqa: E402
from host.compiler.tune import LEADS  # noqa: E402
from host.model import SHAPES, Gpt2  # noqa: E402
from host.perf import simulate  # noqa: E402

CASES = [("gpt2-medium", 2), ("gpt2-medium", 4), ("gpt2-large", 4), ("gpt2-xl", 2), ("gpt2-xl", 4)]


def main():
    cfg = load_config(ROOT / "configs" / "u280x4.yaml")
    print("| model, cards | " + " | ".join(f"lead {k}" for k in LEADS) + " |")
    print("|---|" + "---|" * len(LEADS))
    for name, cards in CASES:
        model = Gpt2(SHAPES[name], None)
        cms = [CompiledModel(cfg, model, card=i, cards=cards) for i in range(cards)]
        T = cms[0].T
        per = [simulate(cfg, [cm.step([0] * T, T, lead=k) for cm in cms])["cycles"] / T for k in LEADS]
        best = min(per)
        cells = [f"**{p:,.0f}**" if p == best else f"{p:,.0f}" for p in per]
        print(f"| {name}, {cards} cards, steps of {T} | " + " | ".join(cells) + " |", flush=True)
    model = Gpt2(SHAPES["gpt2-xl"], None)
    cms = [CompiledModel(cfg, model, card=i, cards=4, streams=8) for i in range(4)]
    per = [simulate(cfg, [cm.step_batch([(0, 66, s) for s in range(8)], lead=k) for cm in cms])["cycles"]
           for k in LEADS]
    cells = [f"{p:,}" for p in per]
    print("| gpt2-xl, 4 cards, a decode step of 8 streams (cycles) | " + " | ".join(cells) + " |")


if __name__ == "__main__":
    main()
