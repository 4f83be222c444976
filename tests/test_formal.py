"""Formal proofs (sim/formal/, SymbiYosys with Yices): the quick ones here, the deep ones in
make soak; every one in make formal. Plus the simulated regressions of what they found."""

import pytest
from amaranth.sim import Simulator

from hw.core.store import BeatWriter
from sim.formal import check
from sim.formal.proofs import deep, quick


@pytest.mark.parametrize("proof", quick(), ids=lambda p: p.name)
def test_quick(proof, tmp_path):
    result = check(proof, workdir=tmp_path)
    print(result)
    assert result.passed, str(result)


@pytest.mark.soak
@pytest.mark.parametrize("proof", deep(), ids=lambda p: p.name)
def test_deep(proof, tmp_path):
    result = check(proof, workdir=tmp_path)
    print(result)
    assert result.passed, str(result)


def test_store_outstanding_per_channel():
    """Beats all for channel 0, no response ever: at most max_outstanding AWs go out on it
    (the writer used to count one budget of channels x max_outstanding for all channels,
    and let channel 0 have it all; found by the proof ``store``)."""
    dut = BeatWriter(channels=2, data_bits=256, max_outstanding=2)
    sim = Simulator(dut)
    sim.add_clock(5e-9)
    seen = []

    async def bench(ctx):
        for k in range(2):
            ctx.set(dut.axi[k].awready, 1)
            ctx.set(dut.axi[k].wready, 1)
        ctx.set(dut.i.valid, 1)
        ctx.set(dut.i.payload.ch, 0)
        for _ in range(20):
            ctx.set(dut.i.payload.row, len(seen))
            _, _, aw = await ctx.tick().sample(dut.axi[0].awvalid)
            if aw:
                seen.append(1)

    sim.add_testbench(bench)
    sim.run()
    assert len(seen) == 2, f"{len(seen)} writes awaiting a response on channel 0"
