"""s_axi_control: the Vitis ap_ctrl_hs register block (hw/regs.py), AXI4-Lite, 32-bit."""

from types import SimpleNamespace

from amaranth.hdl import Cat, Module, Signal
from amaranth.lib import wiring
from amaranth.lib.wiring import In, Out

from hw import regs
from hw.axi import AxiLiteSignature

__all__ = ["Control"]


class Control(wiring.Component):
    """AXI4-Lite register block.

    Members
    -------
    axi : Out(AxiLiteSignature)  (the signature is written from the subordinate side)
    start : Out(1) pulse when the host sets ap_start while the kernel is idle
    done : In(1) pulse when the kernel finishes (sets ap_done, ap_idle, ISR)
    busy : In(1) the kernel has not stopped yet although it reported done (after a TIMEOUT it
        drains what it had open): ap_idle reads 0 and ap_start is ignored meanwhile
    args : the argument registers, one ``Out`` per entry of regs.ARGS and ``hbm_ptr_<k>``
    <counter> : ``In(64)`` for each of regs.COUNTERS
    interrupt : Out(1)
    """

    def __init__(self, channels):
        self.channels = channels
        members = {"axi": Out(AxiLiteSignature(addr_bits=regs.ADDR_BITS, data_bits=32)),
                   "start": Out(1), "done": In(1), "busy": In(1), "interrupt": Out(1)}
        for name, (_, bits, _) in regs.ARGS.items():
            members[name] = Out(bits)
        for k in range(channels):
            members[f"hbm_ptr_{k}"] = Out(64)
        for name in regs.COUNTERS:
            members[name] = In(32 if name == "status" else 64)
        super().__init__(members)

    def _regs(self):
        """[(address, signal, bit offset)] of every writable 32-bit word."""
        out = []
        for name, (addr, bits, _) in regs.ARGS.items():
            sig = getattr(self, name)
            for k in range(bits // 32):
                out.append((addr + 4 * k, sig, 32 * k))
        for c in range(self.channels):
            sig = getattr(self, f"hbm_ptr_{c}")
            out += [(regs.hbm_ptr(c), sig, 0), (regs.hbm_ptr(c) + 4, sig, 32)]
        return out

    def elaborate(self, platform):
        m = Module()
        ap = SimpleNamespace(start=Signal(name="ap_start"), done=Signal(name="ap_done"),
                             idle=Signal(name="ap_idle", init=1), gie=Signal(name="gie"),
                             ier=Signal(2, name="ier"), isr=Signal(2, name="isr"))
        m.d.comb += self.interrupt.eq(ap.gie & (ap.ier & ap.isr).any())
        self._writes(m, ap)
        # ap_start is cleared once the kernel has taken it (ap_ready in the same cycle).
        with m.If(ap.start):
            m.d.sync += ap.start.eq(0)
        with m.If(self.done):
            m.d.sync += [ap.done.eq(1), ap.idle.eq(1), ap.isr[0].eq(1)]
        self._reads(m, ap)
        # A done pulse in the same cycle as a read of CTRL must not be lost.
        with m.If(self.done):
            m.d.sync += ap.done.eq(1)
        return m

    def _writes(self, m, ap):
        """AW and W taken together, B answered OKAY; the word registers by their byte strobes
        (an address that is not word aligned matches none of them)."""
        a = self.axi
        bvalid = Signal()
        m.d.comb += [a.bvalid.eq(bvalid), a.bresp.eq(0)]
        wr = a.awvalid & a.wvalid & ~bvalid
        m.d.comb += [a.awready.eq(wr), a.wready.eq(wr)]
        with m.If(wr):
            m.d.sync += bvalid.eq(1)
        with m.If(bvalid & a.bready):
            m.d.sync += bvalid.eq(0)
        wdata, strb = a.wdata, a.wstrb
        m.d.comb += self.start.eq(0)
        with m.If(wr):
            with m.Switch(a.awaddr):
                with m.Case(regs.CTRL):
                    with m.If(wdata[0] & ap.idle & ~self.busy):
                        m.d.sync += [ap.start.eq(1), ap.idle.eq(0)]
                        m.d.comb += self.start.eq(1)
                with m.Case(regs.GIE):
                    m.d.sync += ap.gie.eq(wdata[0])
                with m.Case(regs.IER):
                    m.d.sync += ap.ier.eq(wdata[0:2])
                with m.Case(regs.ISR):
                    m.d.sync += ap.isr.eq(ap.isr ^ wdata[0:2])     # toggle on write
                for addr, sig, off in self._regs():
                    with m.Case(addr):
                        for b in range(4):          # byte enables
                            with m.If(strb[b]):
                                m.d.sync += sig[off + 8 * b:off + 8 * b + 8].eq(wdata[8 * b:8 * b + 8])

    def _reads(self, m, ap):
        """AR taken when no R is pending; the word registered into R (CTRL's read clears
        ap_done)."""
        a = self.axi
        rvalid = Signal()
        rdata = Signal(32)
        m.d.comb += [a.rvalid.eq(rvalid), a.rdata.eq(rdata), a.rresp.eq(0), a.arready.eq(~rvalid)]
        with m.If(a.arvalid & a.arready):
            m.d.sync += [rvalid.eq(1), rdata.eq(0)]
            with m.Switch(a.araddr):
                with m.Case(regs.CTRL):
                    m.d.sync += rdata.eq(Cat(ap.start, ap.done, ap.idle & ~self.busy, ap.start))
                    m.d.sync += ap.done.eq(0)        # clear on read
                with m.Case(regs.GIE):
                    m.d.sync += rdata.eq(ap.gie)
                with m.Case(regs.IER):
                    m.d.sync += rdata.eq(ap.ier)
                with m.Case(regs.ISR):
                    m.d.sync += rdata.eq(ap.isr)
                for addr, sig, off in self._regs():
                    with m.Case(addr):
                        m.d.sync += rdata.eq(sig[off:off + 32])
                for name, (addr, _) in regs.COUNTERS.items():
                    sig = getattr(self, name)
                    with m.Case(addr):
                        m.d.sync += rdata.eq(sig[0:32])
                    if len(sig) > 32:
                        with m.Case(addr + 4):
                            m.d.sync += rdata.eq(sig[32:64])
        with m.If(rvalid & a.rready):
            m.d.sync += rvalid.eq(0)
