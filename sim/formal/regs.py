"""s_axi_control (hw/core/ctrl.py's Control, the register map of hw/regs.py): the AXI4-Lite
subordinate's handshakes under any lawful manager."""

from amaranth.hdl import Assert, Assume, Cat, Cover, Module, Signal
from amaranth.lib import wiring
from amaranth.lib.wiring import In, Out

from hw import regs
from hw.axi import AxiLiteSignature
from hw.core.ctrl import Control

from .axi import no_reset, past

__all__ = ["ControlHarness"]


class ControlHarness(wiring.Component):
    """``Control`` of one HBM channel under any AXI4-Lite manager that keeps VALID and the
    payload until READY, with any ``done`` pulses and counter values.

    Properties (each proved for every reachable state, by k-induction): one B for every write
    (AW and W) accepted and none without, one R for every AR and none without, at most one of
    each owed at a time; B and R held until taken with their payload unchanged; responses
    OKAY.
    """

    def __init__(self):
        super().__init__({"axi": Out(AxiLiteSignature(addr_bits=regs.ADDR_BITS, data_bits=32)),
                          "done": In(1)})

    def elaborate(self, platform):
        m = Module()
        m.submodules.dut = dut = Control(1)
        no_reset(m)
        wiring.connect(m, wiring.flipped(self.axi), dut.axi)
        s = self.axi
        m.d.comb += dut.done.eq(self.done)
        self._manager(m, s)
        self._writes(m, s)
        self._reads(m, s)
        return m

    def _manager(self, m, s):
        """The manager's side: AW, W and AR held with their payload until taken."""
        for valid, ready, payload, name in ((s.awvalid, s.awready, [s.awaddr], "aw"),
                                            (s.wvalid, s.wready, [s.wdata, s.wstrb], "w"),
                                            (s.arvalid, s.arready, [s.araddr], "ar")):
            was = past(m, valid & ~ready, f"{name}_src_held")
            before = past(m, payload, f"{name}_src_was")
            with m.If(was):
                m.d.comb += [Assume(valid), Assume(Cat(*payload) == before)]

    def _writes(self, m, s):
        aw, w, b = s.awvalid & s.awready, s.wvalid & s.wready, s.bvalid & s.bready
        aw_n = Signal(range(-2, 3), name="aw_minus_b")
        w_n = Signal(range(-2, 3), name="w_minus_b")
        m.d.sync += [aw_n.eq(aw_n + aw - b), w_n.eq(w_n + w - b)]
        self._response(m, s.bvalid, s.bready, s.bresp, "b")
        m.d.comb += [
            Assert(aw == w, "ctrl: AW and W not taken together"),
            Assert((aw_n >= 0) & (aw_n <= 1), "ctrl: B without its write, or two owed"),
            Assert(s.bvalid == (aw_n == 1), "ctrl: B not offered while owed"),
            Assert(aw_n == w_n, "ctrl: AW and W counts differ"),
            Cover(b & (past(m, s.awaddr, "awaddr_was") == regs.CTRL)),
        ]

    def _reads(self, m, s):
        ar, r = s.arvalid & s.arready, s.rvalid & s.rready
        n = Signal(range(-2, 3), name="ar_minus_r")
        m.d.sync += n.eq(n + ar - r)
        self._response(m, s.rvalid, s.rready, s.rresp, "r", data=s.rdata)
        m.d.comb += [
            Assert((n >= 0) & (n <= 1), "ctrl: R without its AR, or two owed"),
            Assert(s.rvalid == (n == 1), "ctrl: R not offered while owed"),
            Cover(r & (s.rdata[2] == 0)),
        ]

    def _response(self, m, valid, ready, resp, name, data=None):
        """A subordinate's response: held until READY, payload unchanged, OKAY."""
        was = past(m, valid & ~ready, f"{name}_held")
        payload = [resp] if data is None else [resp, data]
        before = past(m, payload, f"{name}_was")
        m.d.comb += [Assert(~was | valid, f"ctrl: {name.upper()}VALID dropped before READY"),
                     Assert(~was | (Cat(*payload) == before),
                            f"ctrl: {name.upper()} payload changed before READY"),
                     Assert(~valid | (resp == 0), f"ctrl: {name.upper()} not OKAY")]
