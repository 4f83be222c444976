"""Formal proofs (sim/formal/, SymbiYosys with Yices): the quick ones here, the deep ones in
make soak; every one in make formal. Plus the simulated regressions of what they found."""

import pytest
from amaranth.hdl import Assert, Module, Mux, Signal
from amaranth.lib import wiring
from amaranth.lib.wiring import In
from amaranth.sim import Simulator

from hw.core.store import BeatWriter
from sim.formal import ABC_BMC, ABC_PDR, Proof, check
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


class _Decade(wiring.Component):
    """An 8-bit counter that counts the cycles with ``en`` from 0 to 9 and wraps; asserts it
    is never ``bad``. For a ``bad`` of 10 or more that holds in every reachable state, but
    not inductively below k = bad - 9 (the unreachable states 10, 11, ... lead to ``bad``):
    the invariant count <= 9 is what proves it."""

    en: In(1)

    def __init__(self, bad):
        self.bad = bad
        super().__init__()

    def elaborate(self, platform):
        m = Module()
        count = Signal(8)
        with m.If(self.en):
            m.d.sync += count.eq(Mux(count == 9, 0, count + 1))
        m.d.comb += Assert(count != self.bad, "count reached bad")
        return m


@pytest.mark.parametrize("engine", [ABC_PDR, "abc scorr; dc2; pdr"])
def test_abc_pdr(engine, tmp_path):
    """ABC's pdr (sim/formal/abc.py) proves a property true in every reachable state that
    k-induction at k = 8 does not, and fails one that is false, at the step smtbmc names when
    it replays the counterexample (also after the scorr preprocessing)."""
    def proof(name, bad, engine=engine, mode="prove"):
        return check(Proof(name, lambda: _Decade(bad), mode, 8, "", engine=engine),
                     workdir=tmp_path / name)
    ok = proof("ok", 200)
    assert ok.passed, str(ok)
    kind = proof("kind", 200, engine="smtbmc yices")
    assert not kind.passed, "k-induction at k = 8 should not close without the invariant"
    bad = proof("bad", 7)
    assert not bad.passed
    assert "failed assertion at step 7" in bad.detail, str(bad)
    with pytest.raises(ValueError):
        Proof("bmc", _Counter, "bmc", 8, "", engine=ABC_PDR)


@pytest.mark.parametrize("status, line", [
    (["snl_UNSAT", "25", "unknown"], "Property proved."),
    (["snl_SAT", "6", "unknown", "0", "7"], 'Output 0 of miter "top" was asserted in frame 7.'),
    (["snl_SAT", "7", "unknown", "1"], 'Output 1 of miter "top" was asserted in frame 7.'),
    (["snl_UNK", "30", "unknown"], None),
    ([], None),
])
def test_abc_pdr_verdicts(status, line, monkeypatch, tmp_path):
    """The lines sim/formal/abc.py prints for SymbiYosys from ABC's status after pdr: a pass
    only for snl_UNSAT (proved); undecided or stopped by -T (no status), no verdict."""
    from sim.formal import abc
    monkeypatch.setattr(abc, "_abc", lambda cmds, cwd, timeout=None: status)
    lines, code = abc.run("read_aiger m.aig; fold; strash; pdr -v -l -T 5; write_cex -a t.aiw",
                          cwd=tmp_path)
    assert code == 0
    verdicts = [x for x in lines if not x.startswith("abc shim:")]
    assert verdicts == ([line] if line else []), lines
