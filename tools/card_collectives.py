"""COLLs through the Verilated card's collective unit against the performance model's cost
(host/perf.py ``_card_coll_cycles``): the grid its constants were fitted to (docs/performance.md,
"The collective unit's own time"). tiny (a one-way ring, 4 VSP rows a link beat) and a small
core with u280x4's link, ring and vector lanes (``sim.bench.coll_calibration_config``), 2 to 4
cards, all-gathers and all-reduces of 16 to 51,200 fp32 words where the VSP holds them; prints
each case and the worst and rms relative errors. `gptfpga bench calibrate` records 22 of them.
Slow: two Verilator builds (cached), then minutes.

    python tools/card_collectives.py
"""

import math
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from sim import bench  # noqa: E402

SIZES = {"tiny": (16, 128, 512, 1024, 1600, 2048, 4096, 6400),
         "tiny-u280x4-ring": (16, 128, 512, 1024, 1600, 2048, 3200, 4096, 6400, 12800, 25600, 51200)}


def cases():
    out = []
    for name, cfg in bench.card_coll_configs().items():
        for cards in (2, 3, 4):
            for op in ("allgather", "allreduce"):
                for words in SIZES[name]:
                    dst = bench.card_coll_dst(words)
                    if dst + (words * cards if op == "allgather" else dst) <= cfg.core.vsp_words:
                        out.append((name, op, cards, words))
    return out


def main():
    rows = bench.calibrate_card_collectives(cases=cases(), log=print)
    errs = [r["error"] for r in rows]
    print(f"{len(rows)} COLLs: worst {max(map(abs, errs)):.1%}, "
          f"rms {math.sqrt(sum(e * e for e in errs) / len(errs)):.1%}")


if __name__ == "__main__":
    main()
