"""tb_arith's regression once per mutant of an arithmetic unit (sim/mutate.py).

The DUT is sim.mutate.MutantArray: the unit's lanes with every mutation behind ``mutsel``.
Environment: tb_arith's, plus GPTFPGA_MUTANTS (mutants 1..N; 0 is the unmutated unit) and
GPTFPGA_MUT_OUT (where the JSON {k: failure message, or null if the test passed} goes).

Every mutant sees the same vectors and valid pattern (the same seed), as the unit's own
test would in a run of its own. The unmutated unit must pass, or the run fails.
"""

import json
import os

import cocotb
import numpy as np
from cocotb.clock import Clock

from sim.tb.tb_arith import SEED, check_vectors

MUTANTS = int(os.environ["GPTFPGA_MUTANTS"])
OUT = os.environ["GPTFPGA_MUT_OUT"]


@cocotb.test()
async def every_mutant(dut):
    cocotb.start_soon(Clock(dut.clk, 4, unit="ns").start())
    results = {}
    for k in range(MUTANTS + 1):
        dut.mutsel.value = k
        try:
            await check_vectors(dut, np.random.default_rng(SEED))
            results[k] = None
        except AssertionError as e:
            results[k] = str(e).splitlines()[0][:300]
        print(f"tb_mutate_arith: mutant {k}: {'survived' if results[k] is None else 'killed'}")
        with open(OUT, "w") as f:
            json.dump(results, f)
    assert results[0] is None, f"the unmutated unit fails its own test: {results[0]}"
