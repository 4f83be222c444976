"""s_axi_control: the Vitis ap_ctrl_hs register block (hw/regs.py), AXI4-Lite, 32-bit."""

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
    args : the argument registers, one ``Out`` per entry of regs.ARGS and ``hbm_ptr_<k>``
    <counter> : ``In(64)`` for each of regs.COUNTERS
    interrupt : Out(1)
    """

    def __init__(self, channels):
        self.channels = channels
        members = {"axi": Out(AxiLiteSignature(addr_bits=regs.ADDR_BITS, data_bits=32)),
                   "start": Out(1), "done": In(1), "interrupt": Out(1)}
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
        a = self.axi
        ap_start = Signal()
        ap_done = Signal()
        ap_idle = Signal(init=1)
        gie = Signal()
        ier = Signal(2)
        isr = Signal(2)
        m.d.comb += self.interrupt.eq(gie & (ier & isr).any())

        # -- writes: take AW and W together -------------------------------------------------
        bvalid = Signal()
        m.d.comb += [a.bvalid.eq(bvalid), a.bresp.eq(0)]
        wr = a.awvalid & a.wvalid & ~bvalid
        m.d.comb += [a.awready.eq(wr), a.wready.eq(wr)]
        with m.If(wr):
            m.d.sync += bvalid.eq(1)
        with m.If(bvalid & a.bready):
            m.d.sync += bvalid.eq(0)
        # Word registers: an address that is not word aligned matches none of them.
        waddr = a.awaddr
        wdata = a.wdata
        strb = a.wstrb
        m.d.comb += self.start.eq(0)
        with m.If(wr):
            with m.Switch(waddr):
                with m.Case(regs.CTRL):
                    with m.If(wdata[0] & ap_idle):
                        m.d.sync += [ap_start.eq(1), ap_idle.eq(0)]
                        m.d.comb += self.start.eq(1)
                with m.Case(regs.GIE):
                    m.d.sync += gie.eq(wdata[0])
                with m.Case(regs.IER):
                    m.d.sync += ier.eq(wdata[0:2])
                with m.Case(regs.ISR):
                    m.d.sync += isr.eq(isr ^ wdata[0:2])     # toggle on write
                for addr, sig, off in self._regs():
                    with m.Case(addr):
                        for b in range(4):          # byte enables
                            with m.If(strb[b]):
                                m.d.sync += sig[off + 8 * b:off + 8 * b + 8].eq(wdata[8 * b:8 * b + 8])
        # ap_start is cleared once the kernel has taken it (ap_ready in the same cycle).
        with m.If(ap_start):
            m.d.sync += ap_start.eq(0)
        with m.If(self.done):
            m.d.sync += [ap_done.eq(1), ap_idle.eq(1), isr[0].eq(1)]

        # -- reads ------------------------------------------------------------------------------
        rvalid = Signal()
        rdata = Signal(32)
        m.d.comb += [a.rvalid.eq(rvalid), a.rdata.eq(rdata), a.rresp.eq(0), a.arready.eq(~rvalid)]
        raddr = a.araddr
        with m.If(a.arvalid & a.arready):
            m.d.sync += rvalid.eq(1)
            m.d.sync += rdata.eq(0)
            with m.Switch(raddr):
                with m.Case(regs.CTRL):
                    m.d.sync += rdata.eq(Cat(ap_start, ap_done, ap_idle, ap_start))
                    m.d.sync += ap_done.eq(0)        # clear on read
                with m.Case(regs.GIE):
                    m.d.sync += rdata.eq(gie)
                with m.Case(regs.IER):
                    m.d.sync += rdata.eq(ier)
                with m.Case(regs.ISR):
                    m.d.sync += rdata.eq(isr)
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
        # A done pulse in the same cycle as a read of CTRL must not be lost.
        with m.If(self.done):
            m.d.sync += ap_done.eq(1)
        return m
