"""The matrix unit's array for the route to R = 4, measured in Yosys (synth_xilinx -family xcup,
as `gptfpga synth`): a slice of 4 lanes x 64 wide at R = 4, today's DotArray (a weight-row
aligner a lane) against DotArrayI16 with one aligner for the 4 lanes (a quarter of the card's
16 lanes: u280x4's array would be four such slices sharing the activations' alignments) and
with two. docs/performance.md quotes the table; each synthesis takes about 10 minutes.

    python tools/synth_dot_arrays.py [NAME ...]
"""

import json
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from gen.synth import synth_verilog  # noqa: E402
from gen.verilog import to_verilog  # noqa: E402
from hw.arith.dot import DotArray, DotArrayI16  # noqa: E402

CASES = {
    "dot_array_4x64_r4": lambda: DotArray(lanes=4, width=64, reuse=4),
    "dot_i16_4x64_r4_a1": lambda: DotArrayI16(lanes=4, width=64, reuse=4, aligners=1),
    "dot_i16_4x64_r4_a2": lambda: DotArrayI16(lanes=4, width=64, reuse=4, aligners=2),
}


def main(names):
    out = ROOT / "build" / "synth" / "dot_arrays"
    out.mkdir(parents=True, exist_ok=True)
    for name in names or list(CASES):
        if name not in CASES:
            print(f"unknown array {name!r}; allowed: {', '.join(CASES)}", file=sys.stderr)
            sys.exit(2)
        t = time.time()
        path = out / f"{name}.v"
        path.write_text(to_verilog(CASES[name](), name))
        counts = synth_verilog(path, name, workdir=out / f"work_{name}")
        counts.pop("cells", None)
        print(json.dumps({"array": name, "seconds": round(time.time() - t), **counts}), flush=True)


if __name__ == "__main__":
    main(sys.argv[1:])
