"""Formal proofs (sim/formal/, SymbiYosys with Yices): the quick ones here, the deep ones in
make soak; every one in make formal. Plus the simulated regressions of what they found."""

import pytest
from amaranth.hdl import Assert, Module, Signal
from amaranth.lib import wiring
from amaranth.lib.wiring import In
from amaranth.sim import Simulator

from hw.core.store import BeatWriter
from sim.formal import ABC_BMC, Proof, check
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


class _Counter(wiring.Component):
    """Counts the cycles with ``en``; asserts the count never reaches 5 (first at step 5)."""

    en: In(1)

    def elaborate(self, platform):
        m = Module()
        count = Signal(4)
        with m.If(self.en):
            m.d.sync += count.eq(count + 1)
        m.d.comb += Assert(count != 5, "count reached 5")
        return m


@pytest.mark.parametrize("engine", ["abc bmc3", ABC_BMC])
def test_abc_engine(engine, tmp_path):
    """The ABC engine (sim/formal/abc.py) passes what holds for the depth, and fails what
    does not at the step smtbmc names, with its counterexample replayed (also after the
    scorr preprocessing, which changes the model's latches)."""
    ok = check(Proof("abc_ok", _Counter, "bmc", 5, "", engine=engine), workdir=tmp_path / "ok")
    assert ok.passed, str(ok)
    bad = check(Proof("abc_bad", _Counter, "bmc", 8, "", engine=engine), workdir=tmp_path / "bad")
    assert not bad.passed
    assert "failed assertion at step 5" in bad.detail, str(bad)
