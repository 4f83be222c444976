"""Two or more AXI4 managers sharing one HBM channel port.

Reads: AR is arbitrated round-robin per burst; every accepted AR records its manager in an
order FIFO, and the R beats (in AR order: one ID, an in-order subordinate) go back to the
manager at its head until RLAST. Writes: a manager keeps the AW and W channels from its AW
until both its AW and its last W beat have gone (the managers here present AW and W
together); B responses go back in AW order the same way. A channel held with VALID high and
READY low keeps its manager, so what the subordinate sees obeys AXI's stability rule.
"""

from amaranth.hdl import Cat, Module, Mux, Signal
from amaranth.lib import wiring
from amaranth.lib.fifo import SyncFIFO
from amaranth.lib.wiring import In, Out

from hw.arbiter import RoundRobin

__all__ = ["AxiReadMux", "AxiWriteMux"]


def _arbiter(m, valids, locked, held):
    """The manager that owns the channel: the round-robin choice among ``valids``, or ``held``
    while ``locked`` (offered to the arbiter as the only request, so that it is the grant and
    becomes the last served when it goes)."""
    m.submodules.arb = arb = RoundRobin(count=len(valids))
    one_hot = Cat(*[held == i for i in range(len(valids))])
    m.d.comb += arb.requests.eq(Mux(locked, one_hot, Cat(*valids)))
    return arb


class AxiReadMux(wiring.Component):
    """Members: ``m<i>`` In(sig) the managers' ports; ``s`` Out(sig) to the subordinate."""

    def __init__(self, sig, managers=2, depth=32):
        self.M, self.depth, self.sig = managers, depth, sig
        members = {f"m{i}": In(sig) for i in range(managers)}
        members["s"] = Out(sig)
        super().__init__(members)

    def elaborate(self, platform):
        m = Module()
        M = self.M
        mgr = [getattr(self, f"m{i}") for i in range(M)]
        s = self.s
        order = SyncFIFO(width=max(1, (M - 1).bit_length()), depth=self.depth)
        m.submodules.order = order
        held, locked = Signal(range(M)), Signal()
        arb = _arbiter(m, [p.arvalid for p in mgr], locked, held)
        cur = arb.grant
        ar_fields = ("arid", "araddr", "arlen", "arsize", "arburst")
        for i, p in enumerate(mgr):
            with m.If(cur == i):
                m.d.comb += [getattr(s, f).eq(getattr(p, f)) for f in ar_fields]
                m.d.comb += [s.arvalid.eq(p.arvalid & order.w_rdy),
                             p.arready.eq(s.arready & order.w_rdy)]
        ar = s.arvalid & s.arready
        m.d.comb += [order.w_en.eq(ar), order.w_data.eq(cur), arb.advance.eq(ar)]
        with m.If(ar):
            m.d.sync += locked.eq(0)
        with m.Elif(s.arvalid):
            m.d.sync += [locked.eq(1), held.eq(cur)]
        head = order.r_data
        for i, p in enumerate(mgr):
            m.d.comb += [p.rid.eq(s.rid), p.rdata.eq(s.rdata), p.rresp.eq(s.rresp),
                         p.rlast.eq(s.rlast), p.rvalid.eq(s.rvalid & order.r_rdy & (head == i))]
            with m.If(head == i):
                m.d.comb += s.rready.eq(order.r_rdy & p.rready)
        m.d.comb += order.r_en.eq(s.rvalid & s.rready & s.rlast)
        return m


class AxiWriteMux(wiring.Component):
    """Members: ``m<i>`` In(sig) the managers' ports; ``s`` Out(sig) to the subordinate."""

    def __init__(self, sig, managers=2, depth=32):
        self.M, self.depth, self.sig = managers, depth, sig
        members = {f"m{i}": In(sig) for i in range(managers)}
        members["s"] = Out(sig)
        super().__init__(members)

    def elaborate(self, platform):
        m = Module()
        M = self.M
        mgr = [getattr(self, f"m{i}") for i in range(M)]
        s = self.s
        order = SyncFIFO(width=max(1, (M - 1).bit_length()), depth=self.depth)
        m.submodules.order = order
        held, locked, aw_done, w_done = Signal(range(M)), Signal(), Signal(), Signal()
        arb = _arbiter(m, [p.awvalid for p in mgr], locked, held)
        cur = arb.grant
        aw_fields = ("awid", "awaddr", "awlen", "awsize", "awburst")
        w_fields = ("wdata", "wstrb", "wlast")
        for i, p in enumerate(mgr):
            with m.If(cur == i):
                m.d.comb += [getattr(s, f).eq(getattr(p, f)) for f in aw_fields + w_fields]
                # W only for the manager whose AW won (or went), never before it: not while
                # the order FIFO, full, keeps its AW off the port
                w_go = ~w_done & (locked | (p.awvalid & order.w_rdy))
                m.d.comb += [s.awvalid.eq(p.awvalid & ~aw_done & order.w_rdy),
                             p.awready.eq(s.awready & ~aw_done & order.w_rdy),
                             s.wvalid.eq(p.wvalid & w_go), p.wready.eq(s.wready & w_go)]
        aw = s.awvalid & s.awready
        w_end = s.wvalid & s.wready & s.wlast
        aw_ok, w_ok = aw_done | aw, w_done | w_end
        m.d.comb += [order.w_en.eq(aw), order.w_data.eq(cur), arb.advance.eq(aw_ok & w_ok)]
        with m.If(aw_ok & w_ok):
            m.d.sync += [locked.eq(0), aw_done.eq(0), w_done.eq(0)]
        with m.Elif(s.awvalid | s.wvalid | locked):
            m.d.sync += [locked.eq(1), held.eq(cur), aw_done.eq(aw_ok), w_done.eq(w_ok)]
        head = order.r_data
        for i, p in enumerate(mgr):
            m.d.comb += [p.bid.eq(s.bid), p.bresp.eq(s.bresp),
                         p.bvalid.eq(s.bvalid & order.r_rdy & (head == i))]
            with m.If(head == i):
                m.d.comb += s.bready.eq(order.r_rdy & p.bready)
        m.d.comb += order.r_en.eq(s.bvalid & s.bready)
        return m
