"""The collective unit: COLL instructions executed by the card's ring node (hw/collective).

    COLL -> geometry -> segment tables -> (all-gather: own block into place) -> node run
                                  VSP <-> width adapters <-> node memory ports

The node moves link beats of B = link.data_bits / 32 words; the scratchpad moves rows of P
(vector_lanes) words, so each beat is R = B / P rows. The unit computes what the driver of
the bare node (sim/fabric.py) writes by hand, from the instruction and the ``card``
register: nb = ceil(n / B) beats, the ring parts (all of it one way, or ceil(nb / 2) beats
right and the rest left when the ``card`` register says the ring runs both ways) and each
part's N segments,
start_j = floor(j pb / N), found with one 22-step division per part and a running remainder.
Then:

- all-gather runs in place: the unit first copies the card's own input (zero-padded to nb
  beats) to its block at dst + card * nb * B, and the node sends every block from there;
- reduce-scatter and all-reduce read the input at src (words past n read as +0, the
  padding of the ISA) and write the result at dst.

The node's three memory ports per ring direction share one VSP read port and one VSP write
port of this unit, arbitrated round-robin per beat; each beat is R row accesses, so the
unit moves at most P words a cycle each way (the link's 62.5 B/cycle needs P >= 16).

With the COLL's ``hbm`` bit, src and dst are HBM stripe rows and the node's ports go to HBM
instead (hw/dma/beats.py, shared with the DMA on every channel by hw/dma/mux.py): each read
port through a prefetcher that streams ahead of the engine's requests in runs (bursts per
channel), restarting where a request breaks the sequence and dropping what the old stream
fetched beyond its last request; writes gathered into bursts by HbmBeats. All-gather's own
block is copied HBM to HBM first, its writes answered before the node starts. The COLL is
done when every write is answered and the prefetchers are empty (docs/collectives.md).

Errors (RING_ERROR, with the pc of the COLL): a link whose retries ran out, a frame the
schedule did not expect (a peer that disagrees on the COLL: frames carry n's low bits and
the cop in their tags), or ``timeout`` cycles without a
beat on either link (a peer that never reaches its COLL). After one the ring's link state is
unknown: the unit refuses further COLLs (RING_ERROR at once) until the kernel is reset.
"""

from amaranth.hdl import Cat, Const, Module, Mux, Signal
from amaranth.lib import stream, wiring
from amaranth.lib.fifo import SyncFIFO, SyncFIFOBuffered
from amaranth.lib.wiring import In, Out

from hw import stream as hw_stream
from hw.collective.engine import MAX_CARDS, OP_AG
from hw.collective.link import Beat
from hw.collective.node import CollNode, node_kwargs, node_params
from hw.dma.beats import BeatWrite, ReadRun, page_beats

from .cmds import CollCmd
from .vsp import ReadPort, WritePort

__all__ = ["CollUnit", "ring_ok"]

DIV_BITS = 22          # nb <= (2^24 - 1) / B + 1 <= 2^22 for B >= 4 (link.data_bits >= 128)


def ring_ok(card_reg):
    """The ``card`` register describes a ring this unit can run: 2..MAX_CARDS cards, id < cards."""
    card, cards = card_reg[0:8], card_reg[8:16]
    return (cards >= 2) & (cards <= MAX_CARDS) & (card < cards)


def _log2(v):
    assert v & (v - 1) == 0, v
    return v.bit_length() - 1


class CollUnit(wiring.Component):
    """Members
    -------
    cmd : In(stream(CollCmd)); done : Out(1) pulse per COLL (with ``err`` on a RING_ERROR)
    err : Out(1) pulse; err_pc : Out(24); busy : Out(1); progress : Out(1) pulse
    card_reg : In(32)  the ``card`` register (id, cards, bidirectional)
    r_tx, r_rx, l_tx, l_rx : the link ports (stream of Beat)
    rd : Out(ReadPort); wr : Out(WritePort)  one VSP port each way
    hrd : Out(hw.stream.ReadPort(ReadRun, D)); hwr : Out(stream(BeatWrite)); hw_idle : In(1)
        COLL with hbm: runs of beats read from HBM, beats written (hw/dma/beats.py)
    tx_beats, rx_beats : Out(2)  payload beats sent / received this cycle
    retx, crc_error : Out(2)  frames sent again / received with a bad CRC this cycle
    """

    def __init__(self, cfg, *, timeout):
        c = cfg.core
        self.P = c.vector_lanes
        self.params = node_params(cfg)
        self.D = self.params.data_bits
        self.B = self.D // 32
        if self.B % self.P:
            from gen.config import ConfigError
            raise ConfigError(f"core.vector_lanes: got {self.P}; the collective unit needs a divisor "
                              f"of link.data_bits / 32 = {self.B}")
        self.R = self.B // self.P
        hb, C = cfg.hbm.data_bits, cfg.hbm.channels
        if self.D % hb or C % (self.D // hb) or (C // (self.D // hb)) & (C // (self.D // hb) - 1):
            from gen.config import ConfigError
            raise ConfigError(f"link.data_bits: got {self.D}; COLL on HBM needs a link beat of whole "
                              f"hbm.data_bits = {hb} channel beats, a power of two of them per "
                              f"stripe row of hbm.channels = {C}")
        self.per_row = C // (self.D // hb)               # link beats per stripe row
        # COLL on HBM: each node read port streams ahead through its own prefetch FIFO, in
        # runs of `run` beats (bursts of run / per_row beats per channel); `ahead` beats in
        # flight cover the HBM latency at a beat a cycle
        self.run = min(32, self.per_row * 8)
        self.pq = 1 << (cfg.hbm.latency_cycles + 2 * self.run + 16).bit_length()
        self.ahead = self.pq - self.run
        self.page_beats = page_beats(C, hb, self.D)
        self.row_bits = (c.vsp_words // self.P - 1).bit_length()
        self.timeout = timeout
        self.node = CollNode(**node_kwargs(cfg))
        beat = stream.Signature(Beat(self.D))
        super().__init__({
            "cmd": In(stream.Signature(CollCmd)),
            "done": Out(1), "err": Out(1), "err_pc": Out(24), "busy": Out(1), "progress": Out(1),
            "card_reg": In(32),
            "r_tx": Out(beat), "r_rx": In(beat), "l_tx": Out(beat), "l_rx": In(beat),
            "rd": Out(ReadPort(self.row_bits, self.P)), "wr": Out(WritePort(self.row_bits, self.P)),
            "tx_beats": Out(2), "rx_beats": Out(2), "retx": Out(2), "crc_error": Out(2),
            "hrd": Out(hw_stream.ReadPort(ReadRun, self.D)),
            "hwr": Out(stream.Signature(BeatWrite(self.D))), "hw_idle": In(1),
        })

    def elaborate(self, platform):
        m = Module()
        m.submodules.node = node = self.node
        P, B, R, D = self.P, self.B, self.R, self.D
        lb, lr = _log2(B), _log2(R)
        F = self.params.frame_beats
        lf = _log2(F)
        RW = self.row_bits
        wiring.connect(m, node.r_tx, wiring.flipped(self.r_tx))
        wiring.connect(m, wiring.flipped(self.r_rx), node.r_rx)
        wiring.connect(m, node.l_tx, wiring.flipped(self.l_tx))
        wiring.connect(m, wiring.flipped(self.l_rx), node.l_rx)
        m.d.comb += [self.tx_beats.eq(node.pay_tx), self.rx_beats.eq(node.pay_rx),
                     self.retx.eq(node.retx), self.crc_error.eq(node.crc_error)]

        # -- the instruction and its geometry ---------------------------------------------------
        cop, src, dst, n, pc = (Signal(2), Signal(24), Signal(24), Signal(24), Signal(24))
        hbm = Signal()
        nb = Signal(DIV_BITS + 1)
        N = Signal(range(MAX_CARDS + 1))
        me = Signal(range(MAX_CARDS))
        m.d.comb += [N.eq(self.card_reg[8:16]), me.eq(self.card_reg[0:8])]
        is_ag = cop == OP_AG
        part = Signal()                                   # 0: right-hand ring, 1: left-hand
        pb0 = Signal(DIV_BITS + 1)
        bidir = self.card_reg[16]                         # both ring directions
        m.d.comb += pb0.eq(Mux(bidir, (nb + 1) >> 1, nb))
        pb = Mux(part, nb - pb0, pb0)
        p0 = Mux(part, pb0, 0)
        max_r, max_l = Signal(24), Signal(24)
        dead = Signal()
        m.d.comb += [node.op.eq(cop), node.fp16.eq(0), node.cards.eq(N), node.card.eq(me),
                     node.bidir.eq(bidir), node.chunk_log2.eq(lf),
                     node.group.eq(self.params.group), node.src.eq(0), node.dst.eq(0),
                     node.max_chunks_r.eq(max_r), node.max_chunks_l.eq(max_l),
                     # every frame carries n's low bits and cop: peers that disagree on the COLL
                     # (any two n with the same beat count differ in their low 6 bits) see a
                     # tag the schedule does not expect
                     node.check.eq(Cat(n[0:6], cop))]

        # division pb = qp N + rp (restoring, one bit a cycle), then the table's running sums
        dvd, qp, rp = Signal(DIV_BITS), Signal(DIV_BITS), Signal(range(2 * MAX_CARDS))
        step = Signal(range(DIV_BITS + 1))
        j = Signal(range(MAX_CARDS + 1))
        s0, racc, jnb = Signal(DIV_BITS + 1), Signal(range(2 * MAX_CARDS)), Signal(24)
        rem2 = Cat(dvd[DIV_BITS - 1], rp)                 # (rp << 1) | next dividend bit
        carry = (racc + rp) >= N
        seg_beats = Mux(is_ag, pb, qp + carry)
        seg_at = Mux(is_ag, jnb + p0, s0 + p0)
        longest = Mux(is_ag, pb, qp + (rp != 0))
        chunks = (longest + (F - 1)) >> lf

        # all-gather's copy of the own block: rows k < nb R, from src to dst + me nb R rows
        k = Signal(DIV_BITS + lr + 1)
        own_row = Signal(24)
        kr, own_b = Signal(DIV_BITS + 1), Signal(32)
        COPY_AHEAD = 64
        cq = SyncFIFO(width=D, depth=COPY_AHEAD)
        m.submodules.copy_q = cq
        cdata = Signal(32 * P)
        src_row = src >> _log2(P)
        dst_row = dst >> _log2(P)
        # with hbm: the first link beats of the input and the result in HBM (hw/dma/beats.py)
        lpr = _log2(self.per_row)
        src_b, dst_b = src << lpr, dst << lpr

        def lane_mask(word0, limit):
            return Cat(*[(word0 + lane) < limit for lane in range(P)])

        def masked(rdata, mask):
            return Cat(*[Mux(mask[lane], rdata[32 * lane:32 * lane + 32], 0) for lane in range(len(mask))])

        def lane_mask_b(word0, limit):                    # the B words of a beat
            return Cat(*[(word0 + w) < limit for w in range(B)])

        # -- beat <-> row adapters (active while the node runs) ------------------------------------
        running = Signal()
        start_pf, draining, copying = Signal(), Signal(), Signal()
        rports = [node.mem_r_rd_src, node.mem_r_rd_op, node.mem_l_rd_src, node.mem_l_rd_op]
        wports = [node.mem_r_wr, node.mem_l_wr]
        AG_LIMIT = 1 << 29                                # all-gather reads its padded block
        # reads from the VSP: a request is one beat, R row reads; replies routed back in order
        route = SyncFIFO(width=2, depth=4)
        m.submodules.route = route
        r_last, r_sel = Signal(2), Signal(2)
        r_busy, r_j = Signal(), Signal(range(R))
        r_row, r_word, r_lim = Signal(RW + 1), Signal(30), Signal(30)
        r_mask = Signal(P)
        en = Cat(*[p.en for p in rports])
        with m.Switch(r_last):
            for last in range(4):
                with m.Case(last):
                    for q in reversed([(last + 1 + o) % 4 for o in range(4)]):
                        with m.If(en[q]):
                            m.d.comb += r_sel.eq(q)
        r_take = running & ~dead & ~hbm & ~r_busy & en.any() & route.w_rdy
        for q, port in enumerate(rports):
            is_src = q % 2 == 0
            base = Mux(is_ag, dst_row, src_row) if is_src else src_row
            lim = Mux(is_ag, AG_LIMIT, n) if is_src else n
            beat_addr = port.addr[0:DIV_BITS + 1]
            with m.If(r_take & (r_sel == q)):
                m.d.comb += port.ready.eq(1)
                m.d.sync += [r_busy.eq(1), r_j.eq(0), r_last.eq(q),
                             r_row.eq(base + (beat_addr << lr)),
                             r_word.eq(beat_addr << lb), r_lim.eq(lim)]
        m.d.comb += [route.w_en.eq(r_take), route.w_data.eq(r_sel)]

        # with hbm: a prefetcher per read port. A request for the beat after the port's last
        # one is a hit (its data are or will be in the port's FIFO); any other beat starts a
        # new stream there, once every earlier request has been fetched: the beats fetched
        # past the old stream's last request are dropped as they come out. Each prefetcher
        # keeps up to `ahead` beats requested from HBM beyond its port's requests, never past
        # the port's end of the message (own block for all-gather's sends, the input else).
        RUN, PQ, AHEAD = self.run, self.pq, self.ahead
        lpage = _log2(self.page_beats)
        pf_want, pf_len, pf_top = [], [], []
        pf_pop, pf_inq = [], []
        h_route = SyncFIFO(width=2 + 9, depth=16)          # (port, beats) of runs in flight
        m.submodules.h_route = h_route
        hq_fifo = []
        for q, port in enumerate(rports):
            is_src = q % 2 == 0
            pq = SyncFIFOBuffered(width=D, depth=PQ)
            DW = PQ.bit_length()
            pend = SyncFIFO(width=B + DW, depth=32)           # requests awaiting data: word mask,
                                                              # and the beats to drop before it
            m.submodules[f"pq{q}"], m.submodules[f"pend{q}"] = pq, pend
            hq_fifo.append(pq)
            nxt, top = Signal(32, name=f"pf{q}_next"), Signal(32, name=f"pf{q}_top")
            live = Signal(name=f"pf{q}_live")
            inq = Signal(range(PQ + 1), name=f"pf{q}_inq")      # fetched (or asked) and not popped
            dcount = Signal(DW, name=f"pf{q}_dropped")          # dropped for the head request
            hbase = Mux(is_ag, dst_b, src_b) if is_src else src_b
            end = Signal(32, name=f"pf{q}_end")
            m.d.comb += end.eq(Mux(is_ag, own_b + nb, src_b + nb) if is_src else src_b + nb)
            lim = Mux(is_ag, AG_LIMIT, n) if is_src else n
            beat_addr = port.addr[0:DIV_BITS + 1]
            b = hbase + beat_addr
            hit = live & (b == nxt)
            accept = running & ~dead & hbm & port.en & pend.w_rdy & (hit | (top >= nxt))
            with m.If(hbm):
                m.d.comb += port.ready.eq(accept)
            # a new stream drops the beats fetched past the old one's last request (top >= nxt)
            m.d.comb += [pend.w_en.eq(accept),
                         pend.w_data.eq(Cat(lane_mask_b(beat_addr << lb, lim),
                                            Mux(hit, 0, top - nxt)[0:DW]))]
            with m.If(start_pf):
                m.d.sync += [live.eq(0), nxt.eq(0), top.eq(0)]
            with m.Elif(accept):
                m.d.sync += nxt.eq(b + 1)
                with m.If(~hit):
                    m.d.sync += [top.eq(b), live.eq(1)]
            # the next run: up to RUN beats, within the page and the port's end
            ln = Signal(9, name=f"pf{q}_len")
            page_end = ((top >> lpage) + 1) << lpage
            room_end = Mux(page_end < end, page_end, end)
            m.d.comb += ln.eq(Mux(room_end - top < RUN, room_end - top, RUN))
            # (not while a new stream is being accepted: its `top` is being moved)
            want = (running & hbm & live & (top < end) & (top < nxt + AHEAD)
                    & (inq + RUN <= PQ) & ~(accept & ~hit))
            pf_want.append(want)
            pf_len.append(ln)
            pf_top.append(top)
            # out of the FIFO, in order: for the oldest request, the beats to drop before it,
            # then its beat; at the end, whatever was fetched and never asked for
            dropping = pend.r_rdy & (dcount != pend.r_data[B:])
            drop = dropping & pq.r_rdy
            serve = pend.r_rdy & ~dropping & pq.r_rdy
            flush = draining & pq.r_rdy
            pop = drop | serve | flush
            m.d.comb += [pq.r_en.eq(pop), pend.r_en.eq(serve)]
            with m.If(hbm):
                m.d.comb += [port.rvalid.eq(serve),
                             port.data.eq(masked(pq.r_data, pend.r_data[0:B]))]
            with m.If(drop):
                m.d.sync += dcount.eq(dcount + 1)
            with m.Elif(serve):
                m.d.sync += dcount.eq(0)
            pf_pop.append(pop)
            pf_inq.append(inq)
        # one run at a time to HbmBeats, round-robin over the prefetchers
        h_last, h_sel = Signal(2), Signal(2)
        want_v = Cat(*pf_want)
        with m.Switch(h_last):
            for last in range(4):
                with m.Case(last):
                    for q in reversed([(last + 1 + o) % 4 for o in range(4)]):
                        with m.If(want_v[q]):
                            m.d.comb += h_sel.eq(q)
        h_go = Signal()
        with m.If(running):
            m.d.comb += self.hrd.req.valid.eq(want_v.any() & h_route.w_rdy)
            for q in range(4):
                with m.If(h_sel == q):
                    m.d.comb += [self.hrd.req.payload.beat.eq(pf_top[q]),
                                 self.hrd.req.payload.len.eq(pf_len[q])]
            m.d.comb += h_go.eq(self.hrd.req.valid & self.hrd.req.ready)
        m.d.comb += [h_route.w_en.eq(h_go), h_route.w_data.eq(Cat(h_sel, self.hrd.req.payload.len))]
        with m.If(h_go):
            m.d.sync += h_last.eq(h_sel)
        for q in range(4):
            with m.If(h_go & (h_sel == q)):
                m.d.sync += pf_top[q].eq(pf_top[q] + pf_len[q])
            m.d.sync += pf_inq[q].eq(pf_inq[q] + Mux(h_go & (h_sel == q), pf_len[q], 0) - pf_pop[q])
        # the beats of each run into its port's FIFO
        h_j = Signal(9)
        h_port, h_len = h_route.r_data[0:2], h_route.r_data[2:]
        with m.If(~copying):
            for q in range(4):
                m.d.comb += [hq_fifo[q].w_en.eq(self.hrd.resp.valid & (h_port == q)),
                             hq_fifo[q].w_data.eq(self.hrd.resp.payload)]
            with m.If(self.hrd.resp.valid):
                with m.If(h_j == h_len - 1):
                    m.d.comb += h_route.r_en.eq(1)
                    m.d.sync += h_j.eq(0)
                with m.Else():
                    m.d.sync += h_j.eq(h_j + 1)
        pf_idle = ~h_route.r_rdy & Cat(*[v == 0 for v in pf_inq]).all()
        word_now = r_word + (r_j << _log2(P))
        past = word_now >= r_lim
        # rows wholly past the input read a row that exists (src's first) and are masked to zero
        c_req = Signal()
        c_row = Signal(RW)
        with m.If(running):
            m.d.comb += [self.rd.req.valid.eq(r_busy),
                         self.rd.req.payload.eq(Mux(past, src_row, r_row + r_j))]
        with m.Else():
            m.d.comb += [self.rd.req.valid.eq(c_req), self.rd.req.payload.eq(c_row)]
        with m.If(running & r_busy & self.rd.req.ready):
            m.d.sync += r_mask.eq(lane_mask(word_now, r_lim))
            with m.If(r_j == R - 1):
                m.d.sync += r_busy.eq(0)
            with m.Else():
                m.d.sync += r_j.eq(r_j + 1)
        # collector: R rows make a beat, row 0 in the low bits
        acc = Signal(D)
        a_j = Signal(range(R))
        row_in = masked(self.rd.resp.payload, r_mask)
        beat = Cat(acc[32 * P:], row_in) if R > 1 else row_in
        deliver = running & ~hbm & self.rd.resp.valid & (a_j == R - 1)
        with m.If(running & self.rd.resp.valid):
            m.d.sync += acc.eq(beat)
            m.d.sync += a_j.eq(Mux(a_j == R - 1, 0, a_j + 1))
        m.d.comb += route.r_en.eq(deliver)
        for q, port in enumerate(rports):
            with m.If(~hbm):
                m.d.comb += [port.rvalid.eq(deliver & (route.r_data == q)), port.data.eq(beat)]

        # writes: one beat at a time, R row writes
        w_last, w_sel = Signal(), Signal()
        w_busy, w_j = Signal(), Signal(range(R))
        w_row, w_buf = Signal(RW + 1), Signal(D)
        both = wports[0].en & wports[1].en
        m.d.comb += w_sel.eq(Mux(both, ~w_last, wports[1].en))
        w_take = running & ~dead & ~hbm & ~w_busy & (wports[0].en | wports[1].en)
        hw_ask = running & ~dead & hbm & (wports[0].en | wports[1].en)
        hw_take = hw_ask & self.hwr.ready
        m.d.comb += self.hwr.valid.eq(hw_ask)
        for q, port in enumerate(wports):
            m.d.comb += port.ready.eq((w_take | hw_take) & (w_sel == q))
            with m.If(w_sel == q):
                m.d.comb += [self.hwr.payload.beat.eq(dst_b + port.addr[0:DIV_BITS + 1]),
                             self.hwr.payload.data.eq(port.data)]
            with m.If(hw_take & (w_sel == q)):
                m.d.sync += w_last.eq(q)
            with m.If(w_take & (w_sel == q)):
                m.d.sync += [w_busy.eq(1), w_j.eq(0), w_last.eq(q), w_buf.eq(port.data),
                             w_row.eq(dst_row + (port.addr[0:DIV_BITS + 1] << lr))]
        c_wr = Signal()
        c_wrow = Signal(RW + 1)
        with m.If(running):
            m.d.comb += [self.wr.req.valid.eq(w_busy), self.wr.req.payload.row.eq(w_row + w_j),
                         self.wr.req.payload.mask.eq(Const((1 << P) - 1, P)),
                         self.wr.req.payload.data.eq(w_buf[0:32 * P])]
        with m.Else():
            m.d.comb += [self.wr.req.valid.eq(c_wr), self.wr.req.payload.row.eq(c_wrow),
                         self.wr.req.payload.mask.eq(Const((1 << P) - 1, P)),
                         self.wr.req.payload.data.eq(cdata)]
        with m.If(running & w_busy & self.wr.req.ready):
            m.d.sync += w_buf.eq(w_buf >> (32 * P))
            with m.If(w_j == R - 1):
                m.d.sync += w_busy.eq(0)
            with m.Else():
                m.d.sync += w_j.eq(w_j + 1)

        # -- progress and the no-progress timeout -----------------------------------------------------
        wire = node.tx_beat_r | node.tx_beat_l | node.rx_beat_r | node.rx_beat_l
        grant = ((self.rd.req.valid & self.rd.req.ready) | (self.wr.req.valid & self.wr.req.ready)
                 | (self.hrd.req.valid & self.hrd.req.ready) | (self.hwr.valid & self.hwr.ready)
                 | self.hrd.resp.valid)
        m.d.comb += self.progress.eq(wire | grant | self.done)
        idle = Signal(range(self.timeout + 1))

        # -- the sequence ---------------------------------------------------------------------------
        m.d.comb += self.err_pc.eq(pc)
        with m.FSM():
            with m.State("IDLE"):
                m.d.comb += self.cmd.ready.eq(1)
                with m.If(self.cmd.valid):
                    p = self.cmd.payload
                    m.d.sync += [cop.eq(p.cop), src.eq(p.src), dst.eq(p.dst), n.eq(p.n), pc.eq(p.pc),
                                 hbm.eq(p.hbm), nb.eq((p.n + (B - 1)) >> lb), part.eq(0)]
                    with m.If(dead):
                        m.next = "FAIL"
                    with m.Else():
                        m.next = "DIV0"
            with m.State("DIV0"):
                m.d.sync += [dvd.eq(pb), qp.eq(0), rp.eq(0), step.eq(0)]
                m.next = "DIV"
            with m.State("DIV"):
                ge = rem2 >= N
                m.d.sync += [rp.eq(Mux(ge, rem2 - N, rem2)), qp.eq(Cat(ge, qp)), dvd.eq(dvd << 1),
                             step.eq(step + 1)]
                with m.If(step == DIV_BITS - 1):
                    m.d.sync += [j.eq(0), s0.eq(0), racc.eq(0), jnb.eq(0)]
                    m.next = "TABLE"
            with m.State("TABLE"):
                m.d.comb += [node.seg_we.eq(1), node.seg_left.eq(part), node.seg_addr.eq(j),
                             node.seg_data.src.eq(seg_at), node.seg_data.dst.eq(seg_at),
                             node.seg_data.beats.eq(seg_beats)]
                m.d.sync += [j.eq(j + 1), s0.eq(s0 + seg_beats), jnb.eq(jnb + nb),
                             racc.eq(Mux(carry, racc + rp - N, racc + rp))]
                with m.If(j == N - 1):
                    with m.If(part):
                        m.d.sync += max_l.eq(chunks)
                    with m.Else():
                        m.d.sync += [max_r.eq(chunks), max_l.eq(0)]
                    with m.If(~part & bidir):
                        m.d.sync += part.eq(1)
                        m.next = "DIV0"
                    with m.Elif(is_ag & hbm):
                        m.d.sync += [k.eq(0), kr.eq(0), own_b.eq(dst_b + me * nb)]
                        m.next = "HCOPY"
                    with m.Elif(is_ag):
                        m.d.sync += [k.eq(0), own_row.eq(dst_row + me * (nb << lr))]
                        m.next = "COPY_RD"
                    with m.Else():
                        m.next = "START"
            with m.State("COPY_RD"):
                with m.If(k == (nb << lr)):
                    m.next = "START"
                with m.Else():
                    m.d.comb += [c_req.eq(1),
                                 c_row.eq(Mux((k << _log2(P)) >= n, src_row, src_row + k))]
                    with m.If(self.rd.req.ready):
                        m.next = "COPY_DATA"
            with m.State("COPY_DATA"):
                m.d.sync += cdata.eq(masked(self.rd.resp.payload, lane_mask(k << _log2(P), n)))
                m.next = "COPY_WR"
            with m.State("COPY_WR"):
                m.d.comb += [c_wr.eq(1), c_wrow.eq(own_row + k)]
                with m.If(self.wr.req.ready):
                    m.d.sync += k.eq(k + 1)
                    m.next = "COPY_RD"
            with m.State("HCOPY"):
                # the own block from HBM to HBM: runs of reads at most COPY_AHEAD beats ahead
                # of the writes (the copy FIFO's depth); replies are never held back
                src_at = src_b + kr
                c_end = ((src_at >> lpage) + 1) << lpage
                c_lim = Mux(c_end - src_at < nb - kr, c_end - src_at, nb - kr)
                c_len = Mux(c_lim < RUN, c_lim, RUN)
                m.d.comb += [copying.eq(1),
                             self.hrd.req.valid.eq((kr < nb) & (kr - k + c_len <= COPY_AHEAD)),
                             self.hrd.req.payload.beat.eq(src_at), self.hrd.req.payload.len.eq(c_len),
                             cq.w_en.eq(self.hrd.resp.valid), cq.w_data.eq(self.hrd.resp.payload),
                             self.hwr.valid.eq(cq.r_rdy), self.hwr.payload.beat.eq(own_b + k),
                             self.hwr.payload.data.eq(masked(cq.r_data, lane_mask_b(k << lb, n))),
                             cq.r_en.eq(self.hwr.ready)]
                with m.If(self.hrd.req.valid & self.hrd.req.ready):
                    m.d.sync += kr.eq(kr + c_len)
                with m.If(self.hwr.valid & self.hwr.ready):
                    m.d.sync += k.eq(k + 1)
                with m.If(k == nb):
                    m.next = "SETTLE"
            with m.State("SETTLE"):
                # every write of the copy answered before the node reads the block
                with m.If(self.hw_idle):
                    m.next = "START"
            with m.State("START"):
                m.d.comb += [node.start.eq(1), start_pf.eq(1)]
                m.d.sync += idle.eq(0)
                m.next = "RUN"
            with m.State("RUN"):
                m.d.comb += running.eq(1)
                m.d.sync += idle.eq(Mux(self.progress, 0, idle + 1))
                with m.If(node.link_error.any() | node.order_error | (idle == self.timeout)):
                    m.next = "FAIL"
                with m.Elif(~node.busy & ~r_busy & ~w_busy & ~route.r_rdy):
                    m.next = "DRAIN"
            with m.State("DRAIN"):
                # prefetched beats nobody asked for are dropped; every write answered
                m.d.comb += draining.eq(1)
                with m.If(pf_idle & self.hw_idle):
                    m.d.comb += self.done.eq(1)
                    m.next = "IDLE"
            with m.State("FAIL"):
                m.d.comb += [self.done.eq(1), self.err.eq(1)]
                m.d.sync += dead.eq(1)
                m.next = "IDLE"
        m.d.comb += self.busy.eq(~self.cmd.ready)
        return m
