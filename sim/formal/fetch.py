"""Instruction fetch (hw/core/fetch.py): the program buffer's AXI4 read manager under any
start/stop pattern, program address, length and buffer base."""

from amaranth.hdl import Assert, Assume, Cat, Const, Cover, Module
from amaranth.lib import wiring
from amaranth.lib.wiring import In

from hw.core.fetch import Fetch
from hw.isa import INSN_BITS

from .axi import no_reset, past, read_env, read_manager

__all__ = ["FetchHarness"]

BEAT_BYTES = INSN_BITS // 8
MAX_BURST = 16          # hw/core/fetch.py's reader
MAX_OUTSTANDING = 4


class FetchHarness(wiring.Component):
    """``Fetch`` with free ``start``, ``stop``, decoder ``ready`` and AXI timing; the program's
    address, length and buffer base (16-byte aligned, any page offset) constant.

    Properties: the AXI4 read manager's (at most 16-beat bursts, 4 outstanding); not busy
    while a burst is owed, so a stopped core's bursts are drained before ``busy`` falls.
    """

    def __init__(self):
        super().__init__({"start": In(1), "stop": In(1), "ready": In(1), "prog_addr": In(64),
                          "prog_len": In(32), "insn_ptr": In(64), **read_env(INSN_BITS)})

    def elaborate(self, platform):
        m = Module()
        m.submodules.dut = dut = Fetch()
        no_reset(m)
        m.d.comb += [dut.start.eq(self.start), dut.stop.eq(self.stop),
                     dut.out.ready.eq(self.ready), dut.prog_addr.eq(self.prog_addr),
                     dut.prog_len.eq(self.prog_len), dut.insn_ptr.eq(self.insn_ptr)]
        started = past(m, Const(1, 1), "started")
        regs = [self.prog_addr, self.prog_len, self.insn_ptr]
        was = past(m, regs, "regs_was")
        with m.If(started):
            m.d.comb += Assume(was == Cat(*regs))
        m.d.comb += [Assume(self.insn_ptr[:4] == 0), Assume(self.prog_addr[:4] == 0)]
        bus = read_manager(m, dut.axi, self, beat_bytes=BEAT_BYTES, max_burst=MAX_BURST,
                           max_outstanding=MAX_OUTSTANDING)
        m.d.comb += [
            Assert(dut.busy | (bus.outstanding == 0), "fetch: idle with a burst owed"),
            Cover(bus.ar & (dut.axi.arlen == MAX_BURST - 1) & (dut.axi.araddr[:12] != 0)),
            Cover(dut.out.valid & dut.out.ready & (dut.out.payload.pc == 3)),
        ]
        return m
