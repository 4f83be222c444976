"""Link beats to and from HBM stripe rows: the collective unit's path to HBM (COLL with hbm).

A stripe row is one beat of every channel (channel c holds bytes [c Hb, (c + 1) Hb) of the
stripe, Hb = hbm.data_bits / 8). A link beat of D bits is k = D / hbm.data_bits channel
beats, so a row holds C / k link beats, and absolute beat b is stripe row b // (C / k),
channels (b % (C / k)) k .. + k - 1: word i of a message at row r is at byte 4i of the run of
stripes from r, as LOAD.f32 and STORE.f32 place it.

Reads: each request (a beat number) becomes one single-beat AXI read on each of its k
channels (queued per channel, so that ARVALID never waits for a peer channel); the channels'
replies come back in order per channel, so the oldest request's pieces are always at the
heads of its channels' reply FIFOs, and the beat is joined from there. Replies come out in
request order and are not held back (``rvalid`` with ``rdata``): at most ``depth`` requests
are open. Writes: each beat is k single-beat strobed writes, one per channel; ``w_idle`` once
every write has its response. A response other than OKAY sets ``err`` (sticky).
"""

from amaranth.hdl import Cat, Const, Module, Signal
from amaranth.lib import data, stream, wiring
from amaranth.lib.fifo import SyncFIFO, SyncFIFOBuffered
from amaranth.lib.wiring import In, Out

from hw.axi import Axi4ReadSignature, Axi4WriteSignature, Burst

__all__ = ["HbmBeats", "BeatWrite"]


def BeatWrite(data_bits):
    return data.StructLayout({"beat": 32, "data": data_bits})


class HbmBeats(wiring.Component):
    """Members
    -------
    rd : In(stream(32))  beat numbers to read; rvalid, rdata : Out  the beats, in order
    wr : In(stream(BeatWrite))  beats to write; w_idle : Out(1)  no write open
    axi_r_<c> : Out(Axi4ReadSignature); axi_w_<c> : Out(Axi4WriteSignature); ptr_<c> : In(64)
    err : Out(1)  sticky: a read or write answered with an error
    """

    def __init__(self, *, channels, hbm_bits, data_bits, depth=32, queue=4):
        if data_bits % hbm_bits or channels % (data_bits // hbm_bits):
            raise ValueError(f"a {data_bits}-bit beat must be whole {hbm_bits}-bit channel beats "
                             f"of one stripe row of {channels} channels")
        self.C, self.HB, self.D = channels, hbm_bits, data_bits
        self.k = data_bits // hbm_bits
        self.per = channels // self.k
        if self.per & (self.per - 1):
            raise ValueError(f"{self.per} beats per stripe row: a power of two is needed")
        self.depth, self.queue = depth, queue
        members = {"rd": In(stream.Signature(32)), "rvalid": Out(1), "rdata": Out(data_bits),
                   "wr": In(stream.Signature(BeatWrite(data_bits))), "w_idle": Out(1),
                   "err": Out(1)}
        for c in range(channels):
            members[f"axi_r_{c}"] = Out(Axi4ReadSignature(addr_bits=64, data_bits=hbm_bits))
            members[f"axi_w_{c}"] = Out(Axi4WriteSignature(addr_bits=64, data_bits=hbm_bits))
            members[f"ptr_{c}"] = In(64)
        super().__init__(members)

    def elaborate(self, platform):
        m = Module()
        C, k, per, HB = self.C, self.k, self.per, self.HB
        lp = per.bit_length() - 1
        bshift = (HB // 8 - 1).bit_length()
        gbits = max(1, lp)

        def group(b):
            return b[0:lp] if lp else Const(0, 1)

        # -- reads -------------------------------------------------------------------------
        order = SyncFIFO(width=gbits, depth=self.depth)
        m.submodules.order = order
        arq = [SyncFIFOBuffered(width=24, depth=self.queue) for _ in range(C)]
        rq = [SyncFIFOBuffered(width=HB, depth=self.queue) for _ in range(C)]
        for c in range(C):
            m.submodules[f"arq{c}"] = arq[c]
            m.submodules[f"rq{c}"] = rq[c]
        g_in = group(self.rd.payload)
        row_in = self.rd.payload >> lp
        room = Signal()
        m.d.comb += room.eq(order.w_rdy)
        for g in range(per):
            with m.If(g_in == g):
                m.d.comb += room.eq(order.w_rdy & Cat(*[arq[g * k + i].w_rdy for i in range(k)]).all())
        take = self.rd.valid & room
        m.d.comb += [self.rd.ready.eq(room), order.w_en.eq(take), order.w_data.eq(g_in)]
        for c in range(C):
            axi = getattr(self, f"axi_r_{c}")
            m.d.comb += [arq[c].w_en.eq(take & (g_in == c // k)), arq[c].w_data.eq(row_in),
                         axi.arid.eq(0), axi.arlen.eq(0), axi.arsize.eq(bshift),
                         axi.arburst.eq(Burst.INCR),
                         axi.araddr.eq(getattr(self, f"ptr_{c}") + (arq[c].r_data << bshift)),
                         axi.arvalid.eq(arq[c].r_rdy), arq[c].r_en.eq(axi.arready),
                         rq[c].w_en.eq(axi.rvalid), rq[c].w_data.eq(axi.rdata),
                         axi.rready.eq(rq[c].w_rdy)]
            with m.If(axi.rvalid & axi.rready & (axi.rresp != 0)):
                m.d.sync += self.err.eq(1)
        head = order.r_data
        for g in range(per):
            pieces = [rq[g * k + i] for i in range(k)]
            with m.If(order.r_rdy & (head == g)):
                joined = Cat(*[p.r_rdy for p in pieces]).all()
                m.d.comb += [self.rvalid.eq(joined), self.rdata.eq(Cat(*[p.r_data for p in pieces])),
                             order.r_en.eq(joined)]
                m.d.comb += [p.r_en.eq(joined) for p in pieces]

        # -- writes ------------------------------------------------------------------------
        wq = [SyncFIFOBuffered(width=24 + HB, depth=self.queue) for _ in range(C)]
        for c in range(C):
            m.submodules[f"wq{c}"] = wq[c]
        g_w = group(self.wr.payload.beat)
        row_w = self.wr.payload.beat >> lp
        w_room = Signal()
        for g in range(per):
            with m.If(g_w == g):
                m.d.comb += w_room.eq(Cat(*[wq[g * k + i].w_rdy for i in range(k)]).all())
        w_take = self.wr.valid & w_room
        m.d.comb += self.wr.ready.eq(w_room)
        pending = Signal(range(C * (self.queue + 64) + 1))     # writes queued or open
        resp = []
        for c in range(C):
            axi = getattr(self, f"axi_w_{c}")
            piece = self.wr.payload.data[HB * (c % k):HB * (c % k + 1)]
            m.d.comb += [wq[c].w_en.eq(w_take & (g_w == c // k)), wq[c].w_data.eq(Cat(row_w[0:24], piece))]
            aw_done, w_done = Signal(name=f"aw_done{c}"), Signal(name=f"w_done{c}")
            hrow, hdata = wq[c].r_data[0:24], wq[c].r_data[24:]
            m.d.comb += [axi.awid.eq(0), axi.awlen.eq(0), axi.awsize.eq(bshift),
                         axi.awburst.eq(Burst.INCR),
                         axi.awaddr.eq(getattr(self, f"ptr_{c}") + (hrow << bshift)),
                         axi.awvalid.eq(wq[c].r_rdy & ~aw_done),
                         axi.wdata.eq(hdata), axi.wstrb.eq((1 << (HB // 8)) - 1), axi.wlast.eq(1),
                         axi.wvalid.eq(wq[c].r_rdy & ~w_done), axi.bready.eq(1)]
            aw_ok = aw_done | (axi.awvalid & axi.awready)
            w_ok = w_done | (axi.wvalid & axi.wready)
            with m.If(wq[c].r_rdy & aw_ok & w_ok):
                m.d.comb += wq[c].r_en.eq(1)
                m.d.sync += [aw_done.eq(0), w_done.eq(0)]
            with m.Elif(wq[c].r_rdy):
                m.d.sync += [aw_done.eq(aw_ok), w_done.eq(w_ok)]
            with m.If(axi.bvalid & (axi.bresp != 0)):
                m.d.sync += self.err.eq(1)
            resp.append(axi.bvalid)
        m.d.sync += pending.eq(pending + (w_take * k) - sum(resp))
        m.d.comb += self.w_idle.eq(pending == 0)
        return m
