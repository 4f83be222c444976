"""Link beats to and from HBM stripe rows: the collective unit's path to HBM (COLL with hbm).

A stripe row is one beat of every channel (channel c holds bytes [c Hb, (c + 1) Hb) of the
stripe, Hb = hbm.data_bits / 8). A link beat of D bits is k = D / hbm.data_bits channel
beats, so a row holds per = C / k link beats (a *group* of k channels each), and absolute
beat b is stripe row b // per, group b % per: word i of a message at row r is at byte 4i of
the run of stripes from r, as LOAD.f32 and STORE.f32 place it.

Reads come as *runs*: ``len`` consecutive beats from ``beat``. A run is one AXI burst on each
channel of each group it touches (the group's beats are every per-th beat of the run, in
consecutive rows), queued per channel so that ARVALID never waits for a peer channel. The
channels answer in order, so the oldest run's next beat is always at the heads of its group's
reply FIFOs, and beats are joined from there in run order (``rd.resp``, never held back: the
caller asks only for what it has room for). Writes come one beat at a time
and are gathered into runs of consecutive beats (up to ``run`` beats; a run also ends when no
beat arrives for a few cycles), each written as one AXI burst per channel touched. Runs never
cross a 4 KiB page of a channel's buffer; a buffer base that is not page aligned moves the
pages, and a channel's burst that would cross one goes as two (AXI's rule whatever the base;
the W beats follow their AW, never ahead of the burst it presents). With
``max_outstanding``, no channel has more bursts than that in flight in either direction.
``w_idle`` once every write has its response, ``idle`` once every read has its beats too;
a response other than OKAY sets ``err`` (sticky until ``clear``).
"""

from amaranth.hdl import Cat, Const, Module, Mux, Signal
from amaranth.lib import data, stream, wiring
from amaranth.lib.fifo import SyncFIFO, SyncFIFOBuffered
from amaranth.lib.wiring import In, Out

from hw.axi import Axi4ReadSignature, Axi4WriteSignature, Burst
from hw.stream import ReadPort

__all__ = ["HbmBeats", "BeatWrite", "ReadRun", "page_beats"]

PAGE = 4096
FLUSH_IDLE = 4          # cycles without a written beat that close the open write run


def BeatWrite(data_bits):
    return data.StructLayout({"beat": 32, "data": data_bits})


ReadRun = data.StructLayout({"beat": 32, "len": 8})

# A burst queued for one channel: its first stripe row and AXI's len (beats - 1).
_Burst = data.StructLayout({"row": 24, "len": 8})


def page_beats(channels, hbm_bits, data_bits):
    """Link beats in the stripe rows of one 4 KiB page of a channel's buffer."""
    return (PAGE // (hbm_bits // 8)) * (channels // (data_bits // hbm_bits))


def _log2(v):
    assert v > 0 and v & (v - 1) == 0, v
    return v.bit_length() - 1


class HbmBeats(wiring.Component):
    """Members
    -------
    rd : In(ReadPort(ReadRun, data_bits))  runs to read (1 <= len <= run, within one page)
        on ``rd.req``; their beats, in order, on ``rd.resp`` (always taken)
    wr : In(stream(BeatWrite))  beats to write; w_idle : Out(1)  no write held or open
    axi_r_<c> : Out(Axi4ReadSignature); axi_w_<c> : Out(Axi4WriteSignature); ptr_<c> : In(64)
    err : Out(1)  sticky until ``clear``: a read or write answered with an error
    clear : In(1)  ``err`` falls (a run starts)
    idle : Out(1)  no read run in flight or queued and ``w_idle``: no AXI transaction open

    ``max_outstanding``: bursts in flight per channel and direction (``hbm.max_outstanding``),
    or None for no limit but the queues'.
    """

    def __init__(self, *, channels, hbm_bits, data_bits, run=16, runs=16, queue=8,
                 max_outstanding=None):
        if data_bits % hbm_bits or channels % (data_bits // hbm_bits):
            raise ValueError(f"data_bits: got {data_bits}; allowed: whole {hbm_bits}-bit channel "
                             f"beats of one stripe row of {channels} channels")
        self.C, self.HB, self.D = channels, hbm_bits, data_bits
        self.k = data_bits // hbm_bits
        self.per = channels // self.k
        if self.per & (self.per - 1):
            raise ValueError(f"channels: got {channels}; allowed: a power of two of "
                             f"{self.k}-channel groups")
        self.run, self.runs, self.queue = run, runs, queue
        self.max_outstanding = max_outstanding
        # beats of a page: rows of a 4 KiB page of one channel, times the beats per row
        self.page_beats = page_beats(channels, hbm_bits, data_bits)
        assert run <= self.page_beats and run <= 256
        members = {"rd": In(ReadPort(ReadRun, data_bits)),
                   "wr": In(stream.Signature(BeatWrite(data_bits))), "w_idle": Out(1),
                   "err": Out(1), "clear": In(1), "idle": Out(1)}
        for c in range(channels):
            members[f"axi_r_{c}"] = Out(Axi4ReadSignature(addr_bits=64, data_bits=hbm_bits))
            members[f"axi_w_{c}"] = Out(Axi4WriteSignature(addr_bits=64, data_bits=hbm_bits))
            members[f"ptr_{c}"] = In(64)
        super().__init__(members)

    def _split(self, m, b, n, name):
        """Per group h: (row of its first beat, its beats) of the run [b, b + n)."""
        per, lp = self.per, _log2(self.per)
        g0 = b[0:lp] if lp else Const(0, 1)
        out = []
        for h in range(per):
            i_h = Signal(range(per), name=f"{name}_i{h}")     # the run's first beat in group h
            m.d.comb += i_h.eq((h - g0) & (per - 1)) if lp else i_h.eq(0)
            cnt = Signal(9, name=f"{name}_n{h}")
            m.d.comb += cnt.eq(Mux(i_h < n, (n - i_h + per - 1) >> lp, 0))
            row = Signal(32, name=f"{name}_r{h}")
            m.d.comb += row.eq((b + i_h) >> lp)
            out.append((row, cnt))
        return out

    def _piece(self, m, ptr, row, off, last, name):
        """The part of a channel's burst (first row ``row``, AXI len ``last``) from its beat
        ``off`` that stays in one 4 KiB page of the address space: (first row, beats, is the
        burst's end)."""
        HB = self.HB
        bshift = (HB // 8 - 1).bit_length()
        lpr = _log2(PAGE // (HB // 8))
        start = Signal(24, name=f"{name}_start")
        room = Signal(lpr + 1, name=f"{name}_room")
        left = Signal(9, name=f"{name}_left")
        m.d.comb += [start.eq(row + off),
                     room.eq((PAGE // (HB // 8)) - (ptr[bshift:bshift + lpr] + start[:lpr])[:lpr]),
                     left.eq(last + 1 - off)]
        return start, Mux(left < room, left, room), left <= room

    def _limit(self, m, up, down, name):
        """Room for one more burst on a channel (``up`` one goes, ``down`` one ends)."""
        if self.max_outstanding is None:
            return Const(1, 1)
        n = Signal(range(self.max_outstanding + 1), name=name)
        m.d.sync += n.eq(n + up - down)
        return n < self.max_outstanding

    def elaborate(self, platform):
        m = Module()
        C, k, per, HB = self.C, self.k, self.per, self.HB
        lp = _log2(per)
        bshift = (HB // 8 - 1).bit_length()
        Q = self.queue

        def chans(h):
            return range(h * k, h * k + k)

        # -- reads -------------------------------------------------------------------------
        # each run in flight: the group of its first beat, its beats
        Run = data.StructLayout({"group": max(1, lp), "len": 9})
        order = SyncFIFO(width=Run.size, depth=self.runs)
        m.submodules.order = order
        arq = [SyncFIFOBuffered(width=_Burst.size, depth=Q) for _ in range(C)]
        rq = [SyncFIFOBuffered(width=HB, depth=Q) for _ in range(C)]
        for c in range(C):
            m.submodules[f"arq{c}"] = arq[c]
            m.submodules[f"rq{c}"] = rq[c]
        rb, rn = self.rd.req.payload.beat, self.rd.req.payload.len
        parts = self._split(m, rb, rn, "rd")
        room = Signal()
        m.d.comb += room.eq(order.w_rdy & Cat(*[q.w_rdy for q in arq]).all())
        take = self.rd.req.valid & room
        run_in = Signal(Run)
        m.d.comb += [run_in.group.eq(rb[0:lp] if lp else 0), run_in.len.eq(rn),
                     self.rd.req.ready.eq(room), order.w_en.eq(take), order.w_data.eq(run_in)]
        for h, (row, cnt) in enumerate(parts):
            burst = Signal(_Burst, name=f"rd_burst{h}")
            m.d.comb += [burst.row.eq(row[0:24]), burst.len.eq((cnt - 1)[0:8])]
            for c in chans(h):
                axi = getattr(self, f"axi_r_{c}")
                head = _Burst(arq[c].r_data)
                ptr = getattr(self, f"ptr_{c}")
                off = Signal(9, name=f"ar_off{c}")       # the head burst's beats already asked
                start, n, final = self._piece(m, ptr, head.row, off, head.len, f"ar{c}")
                ar = axi.arvalid & axi.arready
                room_c = self._limit(m, ar, axi.rvalid & axi.rready & axi.rlast, f"ar_out{c}")
                m.d.comb += [arq[c].w_en.eq(take & (cnt != 0)), arq[c].w_data.eq(burst),
                             axi.arid.eq(0), axi.arlen.eq(n - 1), axi.arsize.eq(bshift),
                             axi.arburst.eq(Burst.INCR), axi.araddr.eq(ptr + (start << bshift)),
                             axi.arvalid.eq(arq[c].r_rdy & room_c), arq[c].r_en.eq(ar & final),
                             rq[c].w_en.eq(axi.rvalid), rq[c].w_data.eq(axi.rdata),
                             axi.rready.eq(rq[c].w_rdy)]
                with m.If(ar):
                    m.d.sync += off.eq(Mux(final, 0, off + n))
                with m.If(axi.rvalid & axi.rready & (axi.rresp != 0)):
                    m.d.sync += self.err.eq(1)
        # join: beat i of the head run comes from group (g0 + i) % per
        i = Signal(9)
        head_run = Run(order.r_data)
        hlen = head_run.len
        grp = (head_run.group + i)[0:lp] if lp else Const(0, 1)
        for h in range(per):
            pieces = [rq[c] for c in chans(h)]
            with m.If(order.r_rdy & (grp == h)):
                joined = Cat(*[p.r_rdy for p in pieces]).all()
                m.d.comb += [self.rd.resp.valid.eq(joined),
                             self.rd.resp.payload.eq(Cat(*[p.r_data for p in pieces]))]
                m.d.comb += [p.r_en.eq(joined) for p in pieces]
        with m.If(self.rd.resp.valid):
            with m.If(i == hlen - 1):
                m.d.comb += order.r_en.eq(1)
                m.d.sync += i.eq(0)
            with m.Else():
                m.d.sync += i.eq(i + 1)

        # -- writes: beats gathered into runs -------------------------------------------------
        wq = [SyncFIFOBuffered(width=HB, depth=2 * Q) for _ in range(C)]
        awq = [SyncFIFOBuffered(width=_Burst.size, depth=Q) for _ in range(C)]
        for c in range(C):
            m.submodules[f"wq{c}"] = wq[c]
            m.submodules[f"awq{c}"] = awq[c]
        wb = self.wr.payload.beat
        r_start, r_len, idle = Signal(32), Signal(9), Signal(range(FLUSH_IDLE + 1))
        lpage = _log2(self.page_beats)
        joins = ((r_len != 0) & (wb == r_start + r_len) & (r_len < self.run) & (idle != FLUSH_IDLE)
                 & ((wb >> lpage) == (r_start >> lpage)))
        close = Signal()         # the open run goes to the AW queues this cycle
        m.d.comb += close.eq((r_len != 0) & ((self.wr.valid & ~joins) | (idle == FLUSH_IDLE)))
        wparts = self._split(m, r_start, r_len, "wr")
        aw_room = Cat(*[q.w_rdy for q in awq]).all()
        g_w = wb[0:lp] if lp else Const(0, 1)
        w_room = Signal()
        for h in range(per):
            with m.If(g_w == h):
                m.d.comb += w_room.eq(Cat(*[wq[c].w_rdy for c in chans(h)]).all())
        # a beat that starts a new run waits until the open one can close
        w_take = self.wr.valid & w_room & (joins | (r_len == 0) | aw_room)
        m.d.comb += self.wr.ready.eq(w_take)
        do_close = close & aw_room
        for h, (row, cnt) in enumerate(wparts):
            burst = Signal(_Burst, name=f"wr_burst{h}")
            m.d.comb += [burst.row.eq(row[0:24]), burst.len.eq((cnt - 1)[0:8])]
            for c in chans(h):
                m.d.comb += [awq[c].w_en.eq(do_close & (cnt != 0)), awq[c].w_data.eq(burst)]
        for c in range(C):
            piece = self.wr.payload.data[HB * (c % k):HB * (c % k + 1)]
            m.d.comb += [wq[c].w_en.eq(w_take & (g_w == c // k)), wq[c].w_data.eq(piece)]
        with m.If(w_take):
            m.d.sync += idle.eq(0)
            with m.If(joins):
                m.d.sync += r_len.eq(r_len + 1)
            with m.Else():
                m.d.sync += [r_start.eq(wb), r_len.eq(1)]
        with m.Elif(do_close):
            m.d.sync += [r_len.eq(0), idle.eq(0)]
        with m.Elif((r_len != 0) & (idle != FLUSH_IDLE)):
            m.d.sync += idle.eq(idle + 1)
        # per channel: the head burst's AWs (one per page it touches), its W beats behind
        # them (WLAST on the last beat of each AW's part)
        opened = Signal(range(C * 256 + 1))       # bursts whose AW went and whose B did not
        lpr = _log2(PAGE // (HB // 8))
        aws, bs = [], []
        for c in range(C):
            axi = getattr(self, f"axi_w_{c}")
            ptr = getattr(self, f"ptr_{c}")
            aoff, wn = Signal(9, name=f"aw_off{c}"), Signal(9, name=f"wn{c}")
            head = _Burst(awq[c].r_data)
            hrow, hlast = head.row, head.len
            start, n, final = self._piece(m, ptr, hrow, aoff, hlast, f"aw{c}")
            aw_done = aoff > hlast                  # every part's AW has gone
            aw_now = axi.awvalid & axi.awready
            room_c = self._limit(m, aw_now, axi.bvalid, f"aw_out{c}")
            page_end = (ptr[bshift:bshift + lpr] + (hrow + wn)[:lpr])[:lpr] == (1 << lpr) - 1
            m.d.comb += [axi.awid.eq(0), axi.awlen.eq(n - 1), axi.awsize.eq(bshift),
                         axi.awburst.eq(Burst.INCR), axi.awaddr.eq(ptr + (start << bshift)),
                         axi.awvalid.eq(awq[c].r_rdy & ~aw_done & room_c),
                         axi.wdata.eq(wq[c].r_data), axi.wstrb.eq((1 << (HB // 8)) - 1),
                         axi.wlast.eq((wn == hlast) | page_end),
                         axi.wvalid.eq(awq[c].r_rdy & wq[c].r_rdy & (wn <= hlast)
                                       & (wn < aoff + Mux(axi.awvalid, n, 0))),
                         wq[c].r_en.eq(axi.wvalid & axi.wready), axi.bready.eq(1)]
            w_all = (wn > hlast) | (axi.wvalid & axi.wready & (wn == hlast))
            with m.If((aw_done | (aw_now & final)) & w_all):
                m.d.comb += awq[c].r_en.eq(1)
                m.d.sync += [aoff.eq(0), wn.eq(0)]
            with m.Else():
                with m.If(aw_now):
                    m.d.sync += aoff.eq(aoff + n)
                with m.If(axi.wvalid & axi.wready):
                    m.d.sync += wn.eq(wn + 1)
            with m.If(axi.bvalid & (axi.bresp != 0)):
                m.d.sync += self.err.eq(1)
            aws.append(aw_now)
            bs.append(axi.bvalid)
        m.d.sync += opened.eq(opened + sum(aws) - sum(bs))
        held = Cat(*[q.r_rdy for q in wq + awq]).any()
        m.d.comb += self.w_idle.eq((r_len == 0) & ~held & (opened == 0) & ~self.wr.valid)
        # a run stays in `order` until its last beat is joined: none there, no read open
        m.d.comb += self.idle.eq(self.w_idle & ~order.r_rdy)
        with m.If(self.clear):
            m.d.sync += self.err.eq(0)
        return m
