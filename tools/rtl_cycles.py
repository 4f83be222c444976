"""Cycle counts of the Verilated RTL, for refactors that must not change behaviour.

    python tools/rtl_cycles.py --write     # record tools/rtl_cycles.json
    python tools/rtl_cycles.py --check     # compare against it: exit 1 on any difference

Covers the performance model's calibration steps (the demo model on a tiny card: prefill and
two decode steps; GPT-2-small-shaped layers on medium at 200 and 300 MHz; the collective
engine's all-reduces and all-gathers on 2 and 4 u280x4 nodes), all-reduces through the card
kernel's collective unit on 2 tiny cards (from the VSP and from HBM), and the demo model
generating on 1 and 2 Verilated tiny cards (prefill and decode cycles per token, the tokens).
Slow (Verilator builds of the tiny and medium cards): minutes, not seconds.
"""

import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
RECORD = ROOT / "tools" / "rtl_cycles.json"
sys.path.insert(0, str(ROOT))

from gen.config import load_config  # noqa: E402
from sim import bench  # noqa: E402


def main():
    log = print if "-v" in sys.argv else (lambda *a, **k: None)
    tiny = load_config(ROOT / "configs" / "tiny.yaml")
    res = {}
    cal = bench.calibrate_perf(log=log)
    for r in cal["steps"]:
        res[f"step {r['case']} {r['step']} {r['tokens']}@{r['position']}"] = r["rtl_cycles"]
    for r in cal["collectives"]:
        res[f"node {r['config']} {r['op']} {r['cards']} cards {r['words']} words"] = r["rtl_cycles"]
    for r in bench.bench_card_collective(tiny, cards=(2,), sizes={"vsp": (4 << 10,),
                                                                  "hbm": (16 << 10, 256 << 10)},
                                         log=log):
        res[f"card allreduce {r['cards']} cards from {r['from']} {r['size']} B"] = r["cycles"]
    run = bench.bench_run(tiny, new_tokens=4, cards=(1, 2), log=log)
    for r in run["runs"]:
        res[f"run demo {r['cards']} cards"] = {k: r[k] for k in ("prefill_cycles", "hbm_bytes_per_token",
                                                                  "decode_cycles_per_token",
                                                                  "decode_tokens")}
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
