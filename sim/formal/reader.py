"""The HBM channel's AXI burst read engine (hw/dma/reader.py), alone: commands, base address
and R channel free; its AR/R port held to the AXI4 manager properties (sim/formal/axi.py)."""

from amaranth.hdl import Assert, Assume, Const, Cover, Module
from amaranth.lib import wiring
from amaranth.lib.wiring import In

from hw.dma.reader import AxiBurstReader

from .axi import no_reset, past, read_env, read_manager

__all__ = ["ReaderHarness"]


class ReaderHarness(wiring.Component):
    """An ``AxiBurstReader`` with any commands, any beat-aligned base (page aligned or not,
    constant while the engine runs), any AR/R timing and responses, any output backpressure.

    Properties: the AXI4 read manager's; the engine is not idle while a burst is owed.
    """

    def __init__(self, *, data_bits=512, beat_addr_bits=10, len_bits=6, max_burst=8,
                 max_outstanding=2):
        self._params = dict(data_bits=data_bits, beat_addr_bits=beat_addr_bits, len_bits=len_bits,
                            max_burst=max_burst, max_outstanding=max_outstanding)
        super().__init__({"cmd_valid": In(1), "cmd_addr": In(beat_addr_bits),
                          "cmd_beats": In(len_bits), "base": In(64), "out_ready": In(1),
                          **read_env(data_bits)})

    def elaborate(self, platform):
        m = Module()
        p = self._params
        m.submodules.dut = dut = AxiBurstReader(**p)
        no_reset(m)
        bb = p["data_bits"] // 8
        shift = (bb - 1).bit_length()
        m.d.comb += [dut.cmd.valid.eq(self.cmd_valid), dut.cmd.payload.addr.eq(self.cmd_addr),
                     dut.cmd.payload.beats.eq(self.cmd_beats), dut.base.eq(self.base),
                     dut.data.ready.eq(self.out_ready)]
        base_was = past(m, self.base, "base_was")
        started = past(m, Const(1, 1), "started")
        m.d.comb += Assume(self.base[:shift] == 0)
        with m.If(started & (dut.busy | past(m, dut.busy, "busy_was"))):
            m.d.comb += Assume(self.base == base_was)
        bus = read_manager(m, dut.axi, self, beat_bytes=bb, max_burst=p["max_burst"],
                           max_outstanding=p["max_outstanding"])
        m.d.comb += [
            Assert(dut.busy | (bus.outstanding == 0), "reader: idle with a burst owed"),
            Cover(bus.ar & (dut.axi.arlen == p["max_burst"] - 1) & (dut.axi.araddr[:12] != 0)),
            Cover(bus.outstanding == p["max_outstanding"]),
            Cover(dut.data.valid & dut.data.ready & dut.data.payload.last),
        ]
        return m
