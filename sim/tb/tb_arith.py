"""cocotb regression of one arithmetic unit (a UnitArray of lanes) against sim/ref/arith.

Environment: GPTFPGA_UNIT (name in sim.ref.vectors.UNIT_REFS), GPTFPGA_LANES,
GPTFPGA_LATENCY, GPTFPGA_OUT_BITS, GPTFPGA_N (random vectors), GPTFPGA_SEED.

Inputs go in at one per lane per cycle, in runs of back-to-back valid cycles broken by random
bubbles; every output must appear exactly LATENCY cycles after its input, in order. That
checks throughput (a new input every cycle) and latency as well as the values.
"""

import os

import cocotb
import numpy as np
from cocotb.clock import Clock
from cocotb.triggers import ReadOnly, RisingEdge

from sim.ref.vectors import unit_vectors

UNIT = os.environ["GPTFPGA_UNIT"]
LANES = int(os.environ["GPTFPGA_LANES"])
LATENCY = int(os.environ["GPTFPGA_LATENCY"])
OUT_BITS = int(os.environ["GPTFPGA_OUT_BITS"])
N = int(os.environ["GPTFPGA_N"])
SEED = int(os.environ["GPTFPGA_SEED"])

_DT = {8: np.uint8, 16: np.uint16, 32: np.uint32, 64: np.uint64}


def pack(arr):
    """[cycles, lanes] array of w-bit values -> list of Python ints (lane 0 in the low bits)."""
    raw = np.ascontiguousarray(arr).view(np.uint8).reshape(arr.shape[0], -1)
    return [int.from_bytes(row.tobytes(), "little") for row in raw]


def _pad(x, n):
    """Repeat rows of x (shape [total, ...]) up to n rows."""
    idx = np.arange(n) % len(x)
    return np.ascontiguousarray(x[idx])


def unpack(values, bits):
    nbytes = LANES * bits // 8
    buf = b"".join(v.to_bytes(nbytes, "little") for v in values)
    return np.frombuffer(buf, dtype=_DT[bits]).reshape(len(values), LANES)


@cocotb.test()
async def vectors_against_reference(dut):
    cocotb.start_soon(Clock(dut.clk, 4, unit="ns").start())
    await check_vectors(dut, np.random.default_rng(SEED))


async def check_vectors(dut, rng):
    """The regression on a running clock (also run once per mutant by tb_mutate_arith):
    reset, the vectors, then the checks; raises AssertionError on the first that fails."""
    inputs, ref = unit_vectors(UNIT, N, rng)
    total = len(inputs[0])
    cycles = -(-total // LANES)
    padded = [_pad(x, cycles * LANES).reshape(cycles, -1) for x in inputs]
    packed = [pack(x) for x in padded]
    print(f"tb_arith: unit={UNIT} seed={SEED} vectors={total} ({N} random) lanes={LANES} "
          f"latency={LATENCY}")

    # Valid pattern: runs of 1..300 back-to-back inputs, then 0..3 bubble cycles.
    pattern = []
    while sum(pattern) < cycles:
        pattern += [1] * int(rng.integers(1, 300)) + [0] * int(rng.integers(0, 4))
    pattern += [0] * (LATENCY + 2)

    dut.rst.value = 1
    dut.in_valid.value = 0
    await RisingEdge(dut.clk)
    await RisingEdge(dut.clk)
    dut.rst.value = 0

    ports = [dut.in_a, dut.in_b, dut.in_c][:len(inputs)] if len(inputs) > 2 else \
        [dut.in_a] + ([dut.in_b] if len(inputs) > 1 else [])
    sent_cycle, got, got_cycle = [], [], []
    nxt = 0
    for cyc, v in enumerate(pattern):
        valid = bool(v) and nxt < cycles
        dut.in_valid.value = int(valid)
        if valid:
            for port, p in zip(ports, packed, strict=True):
                port.value = p[nxt]
            sent_cycle.append(cyc)
            nxt += 1
        await ReadOnly()
        if dut.out_valid.value:
            got.append(int(dut.out_o.value))
            got_cycle.append(cyc)
        await RisingEdge(dut.clk)

    assert len(got) == cycles, f"{len(got)} outputs for {cycles} inputs"
    delays = set(np.array(got_cycle) - np.array(sent_cycle))
    assert delays == {LATENCY}, f"output delays {sorted(delays)[:5]}, expected exactly {LATENCY}"

    out = unpack(got, OUT_BITS).reshape(-1)[:total]
    expect = ref(*(x[:total] for x in inputs))
    bad = np.nonzero(out != expect)[0]
    if len(bad):
        lines = []
        for i in bad[:8]:
            ins = " ".join(f"{int(x[i]):#x}" for x in inputs)
            lines.append(f"  in {ins}: rtl {int(out[i]):#x} ref {int(expect[i]):#x}")
        raise AssertionError(f"{UNIT}: {len(bad)} of {total} vectors differ (seed {SEED}):\n" +
                             "\n".join(lines))
    print(f"tb_arith: {UNIT}: {total} vectors bit-exact")
