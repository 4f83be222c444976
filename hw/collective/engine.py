"""Ring collective engine: all-gather, reduce-scatter and all-reduce, chunked and pipelined.

One ``RingChannel`` per ring direction. A message part is cut into N segments, each segment
into chunks of ``2^chunk_log2`` beats (one link frame each). Chunks are taken in groups of
``group`` (K); for each group the channel runs rounds r = 0 .. last + 1:

    round 0          send chunk c of segment send(0) from local memory, for c in the group
    round r >= 1     receive chunk c of segment recv(r - 1) from upstream, for c in the group;
                     reduce-scatter rounds add the local operand (fp32, incoming first); then
                     forward it as round r's frame, or write it to the destination

All-gather works in place: each card's block already sits at its place in the destination,
which is where round 0 reads it from. Every card walks the same order, so frames need no
addressing: the k-th frame received is the
k-th frame the upstream card sent. The schedule cannot deadlock (round r of a card needs only
round r - 1 of its upstream neighbour, whose K frames fit in the receiver's 2K-frame buffer),
and with K x chunk >= link latency + chunk the link never idles (round r + 1's frames arrive
while round r is still being sent). Chunks a segment does not have are skipped by both sides.

Segment indices, right-hand ring (send to card i + 1), as in sim/ref/collective.py:
    reduce-scatter round r: send i - 1 - r, receive i - 2 - r      (r < N - 1)
    all-gather phase r':    send i - r',    receive i - 1 - r'     (r' = r, or r - (N - 1)
                                                                    within an all-reduce)
The left-hand ring is the same with the offsets' signs flipped. The geometry (segment
offsets and lengths, in beats) comes from a table the driver writes.
"""

from amaranth.hdl import Cat, Const, Module, Mux, Signal
from amaranth.lib import data, stream, wiring
from amaranth.lib.fifo import SyncFIFO, SyncFIFOBuffered
from amaranth.lib.memory import Memory
from amaranth.lib.wiring import In, Out

from hw.arith.units import Fp32Add, fp16_to_fp32_comb

from .link import Payload

__all__ = ["RingChannel", "OP_AG", "OP_RS", "OP_AR", "SegEntry", "MAX_CARDS", "MemRead",
           "MemWrite"]

OP_AG, OP_RS, OP_AR = 0, 1, 2
MAX_CARDS = 16
SegEntry = data.StructLayout({"src": 32, "dst": 32, "beats": 32})


class MemRead(wiring.Signature):
    """Read port of the node's memory (addresses in beats).

    A request goes when ``en`` and ``ready`` are both high (``en`` never waits for ``ready``);
    replies come back in request order, any number of cycles later (at least one), as
    ``rvalid`` with ``data``, and are always taken: the engine asks only for what it has room
    for. Fits a private buffer (one cycle), the card's arbitrated scratchpad or HBM.
    """

    def __init__(self, data_bits):
        super().__init__({"en": Out(1), "ready": In(1), "addr": Out(32), "rvalid": In(1),
                          "data": In(data_bits)})


class MemWrite(wiring.Signature):
    """Write port of the node's memory: a write goes when ``en`` and ``ready`` are high."""

    def __init__(self, data_bits):
        super().__init__({"en": Out(1), "ready": In(1), "addr": Out(32), "data": Out(data_bits)})


class _Walk:
    """(group, round, chunk) counters walking the schedule; `exists` says whether the chunk is
    part of its segment (built by the caller)."""

    def __init__(self, name):
        self.g = Signal(24, name=f"{name}_g")      # first chunk of the group
        self.r = Signal(6, name=f"{name}_r")
        self.c = Signal(8, name=f"{name}_c")       # chunk within the group
        self.done = Signal(name=f"{name}_done")

    def advance(self, m, group, rounds, groups_end):
        """Move to the next (g, r, c): c fastest, then r, then g."""
        with m.If(self.c == group - 1):
            m.d.sync += self.c.eq(0)
            with m.If(self.r == rounds - 1):
                m.d.sync += self.r.eq(0)
                m.d.sync += self.g.eq(self.g + group)
                with m.If(self.g + group >= groups_end):
                    m.d.sync += self.done.eq(1)
            with m.Else():
                m.d.sync += self.r.eq(self.r + 1)
        with m.Else():
            m.d.sync += self.c.eq(self.c + 1)

    def reset(self):
        return [self.g.eq(0), self.r.eq(0), self.c.eq(0), self.done.eq(0)]


class RingChannel(wiring.Component):
    """One direction of a ring collective.

    Members
    -------
    start : In(1) pulse; done : Out(1) level (idle)
    op, fp16, cards, card, left, chunk_log2, group, src, dst, max_chunks : In  configuration
        (max_chunks: chunks of the longest segment)
    seg_we, seg_addr, seg_data : In  the segment table
    send : Out(stream(Payload)) to the link sender; recv : In(stream(Payload)) from the receiver
    rd_src, rd_op : Out(MemRead); wr : Out(MemWrite)
    order_error : Out(1) sticky: a received frame's tag is not the one the schedule expects
    check : In(8)  a byte of the collective every card must agree on (the card's: n and cop),
        carried in every frame's tag: tag = chunk (16 bits), step (8), check (8)
    """

    def __init__(self, *, data_bits):
        self.D = data_bits
        self.W = data_bits // 32
        super().__init__({
            "start": In(1), "done": Out(1),
            "op": In(2), "fp16": In(1), "cards": In(range(MAX_CARDS + 1)),
            "card": In(range(MAX_CARDS)), "left": In(1), "chunk_log2": In(4), "group": In(8),
            "src": In(32), "dst": In(32), "max_chunks": In(24), "check": In(8),
            "seg_we": In(1), "seg_addr": In(range(MAX_CARDS)), "seg_data": In(SegEntry),
            "send": Out(stream.Signature(Payload(data_bits))),
            "recv": In(stream.Signature(Payload(data_bits))),
            "rd_src": Out(MemRead(data_bits)), "rd_op": Out(MemRead(data_bits)),
            "wr": Out(MemWrite(data_bits)),
            "order_error": Out(1),
        })

    def _to_f32(self, m, beat, name):
        """fp16 in the low half of each word -> fp32 words (in fp16 mode)."""
        words = []
        for w in range(self.W):
            word = beat[32 * w:32 * (w + 1)]
            conv = fp16_to_fp32_comb(m, word[0:16], f"{name}{w}")
            words.append(Mux(self.fp16, conv, word))
        return Cat(*words)

    def _seg(self, m, k, name):
        """Segment i - k (right-hand ring) or i + k (left-hand ring), mod N; 0 <= k < 3N."""
        N = self.cards
        up = self.card + k
        down = self.card + 3 * N - k
        v = Mux(self.left, up, down)
        for _ in range(4):
            v = Mux(v >= N, v - N, v)
        out = Signal(range(MAX_CARDS), name=name)
        m.d.comb += out.eq(v)
        return out

    def elaborate(self, platform):
        m = Module()
        D = self.D
        N = self.cards
        K = self.group
        segs = Memory(shape=SegEntry, depth=MAX_CARDS, init=[])
        m.submodules.segs = segs
        sw = segs.write_port()
        m.d.comb += [sw.en.eq(self.seg_we), sw.addr.eq(self.seg_addr), sw.data.eq(self.seg_data)]
        seg_tx = segs.read_port(domain="comb")
        seg_rx = segs.read_port(domain="comb")

        active = Signal()
        last_step = Mux(self.op == OP_AR, 2 * N - 3, N - 2)   # tag of the last frames sent
        rounds = last_step + 2                                 # rounds per group (0 .. last+1)
        cl = self.chunk_log2

        def send_seg_k(step):       # k in "i -/+ k" of the segment sent with tag `step`
            rs = (self.op != OP_AG) & (step < N - 1)
            ag = Mux(self.op == OP_AR, step - (N - 1), step)
            return Mux(rs, step + 1, ag)

        # -- the sending walk --------------------------------------------------------------------
        tw = _Walk("tx")
        t_round = tw.r                 # frames with tag = round (round last + 1 sends nothing)
        m.d.comb += seg_tx.addr.eq(self._seg(m, send_seg_k(t_round), "jt"))
        st = seg_tx.data
        t_chunk = tw.g + tw.c
        t_nchunks = (st.beats + (Const(1, 32) << cl) - 1) >> cl
        t_exists = (t_round <= last_step) & (t_chunk < t_nchunks)
        t_beats = Mux(t_chunk == t_nchunks - 1, st.beats - (t_chunk << cl), Const(1, 32) << cl)
        tb = Signal(16)                 # beat within the current frame
        # round 0: local reads, one beat ahead into a FIFO; rounds >= 1: the forward FIFO
        lf = SyncFIFOBuffered(width=D + 1 + 32, depth=8)
        m.submodules.lf = lf
        fw = SyncFIFOBuffered(width=D + 1 + 32, depth=32)
        m.submodules.fw = fw
        # meta (last, tag) of the local reads in flight, readable the cycle after it is written
        lm = SyncFIFO(width=1 + 32, depth=8)
        m.submodules.lm = lm
        l_out = Signal(range(16))       # local reads requested and not yet answered
        local = active & ~tw.done & (t_round == 0)
        want_read = local & t_exists & ((lf.level + l_out) < 6)
        can_read = want_read & self.rd_src.ready
        m.d.comb += [self.rd_src.en.eq(want_read),
                     self.rd_src.addr.eq(self.src + st.src + (t_chunk << cl) + tb)]
        frame_end = tb == t_beats - 1
        with m.If(can_read):
            with m.If(frame_end):
                m.d.sync += tb.eq(0)
                tw.advance(m, K, rounds, self.max_chunks)
            with m.Else():
                m.d.sync += tb.eq(tb + 1)
        # forwarded frames are counted as they leave the forward FIFO (below)
        skip = active & ~tw.done & ~t_exists
        with m.If(skip):
            tw.advance(m, K, rounds, self.max_chunks)
        l_reply = self.rd_src.rvalid
        m.d.sync += l_out.eq(l_out + can_read - l_reply)
        m.d.comb += [lm.w_en.eq(can_read),
                     lm.w_data.eq(Cat(frame_end, t_chunk[0:16], Const(0, 8), self.check)),   # step 0
                     lm.r_en.eq(l_reply)]
        local_data = Mux(self.op == OP_AG, self.rd_src.data, self._to_f32(m, self.rd_src.data, "lc"))
        m.d.comb += [lf.w_en.eq(l_reply), lf.w_data.eq(Cat(local_data, lm.r_data))]

        # The link sender takes frames in schedule order: round 0 from the local FIFO, later
        # rounds from the forward FIFO (which the receiving walk fills in the same order).
        # (Round 0's frames still in the local FIFO go first.)
        fwd_turn = active & ~tw.done & (t_round != 0) & t_exists & (lf.level == 0) & (l_out == 0)
        with m.If(fwd_turn):
            m.d.comb += [self.send.valid.eq(fw.r_rdy), self.send.payload.data.eq(fw.r_data[0:D]),
                         self.send.payload.last.eq(fw.r_data[D]),
                         self.send.payload.tag.eq(fw.r_data[D + 1:D + 33]),
                         fw.r_en.eq(self.send.ready)]
            with m.If(fw.r_rdy & self.send.ready):
                with m.If(fw.r_data[D]):
                    tw.advance(m, K, rounds, self.max_chunks)
        with m.Else():
            m.d.comb += [self.send.valid.eq(lf.r_rdy), self.send.payload.data.eq(lf.r_data[0:D]),
                         self.send.payload.last.eq(lf.r_data[D]),
                         self.send.payload.tag.eq(lf.r_data[D + 1:D + 33]),
                         lf.r_en.eq(self.send.ready)]

        # -- the receiving walk -------------------------------------------------------------------
        rw = _Walk("rx")
        r_step = rw.r - 1               # tag of the frames received in round r (r >= 1)
        r_step8 = Signal(8)             # its tag field, exactly 8 bits wide
        m.d.comb += r_step8.eq(r_step)
        r_rs = (self.op != OP_AG) & (r_step < N - 1)
        r_ag = Mux(self.op == OP_AR, r_step - (N - 1), r_step)
        m.d.comb += seg_rx.addr.eq(self._seg(m, Mux(r_rs, r_step + 2, r_ag + 1), "jr"))
        sr = seg_rx.data
        r_chunk = rw.g + rw.c
        r_nchunks = (sr.beats + (Const(1, 32) << cl) - 1) >> cl
        r_exists = (rw.r != 0) & (r_chunk < r_nchunks)
        rb = Signal(16)
        rv = self.recv
        # Received beats wait in `pf` for their operand (reduce-scatter rounds), which the
        # memory answers into `of` in request order; results to be written wait in `wf`.
        # in_flight counts beats taken and not yet out of the adder pipeline; the budget keeps
        # every FIFO from overflowing whatever the memory's latency.
        Meta = data.StructLayout({"rs": 1, "last": 1, "fwd": 1, "wr": 1, "tag": 32, "addr": 32})
        pf = SyncFIFO(width=D + Meta.size, depth=32)
        of = SyncFIFO(width=D, depth=32)
        wf = SyncFIFOBuffered(width=32 + D, depth=32)
        m.submodules.pf, m.submodules.of, m.submodules.wf = pf, of, wf
        in_flight = Signal(range(64))
        room = (fw.level + wf.level + in_flight) < 32 - 2
        pre = rv.valid & active & ~rw.done & r_exists & room
        take = pre & (~r_rs | self.rd_op.ready)
        m.d.comb += rv.ready.eq(take)
        r_skip = active & ~rw.done & ~r_exists
        with m.If(r_skip):
            rw.advance(m, K, rounds, self.max_chunks)
        off = (r_chunk << cl) + rb
        m.d.comb += [self.rd_op.en.eq(pre & r_rs), self.rd_op.addr.eq(self.src + sr.src + off)]
        with m.If(take):
            with m.If(rv.payload.last):
                m.d.sync += rb.eq(0)
                rw.advance(m, K, rounds, self.max_chunks)
                with m.If(rv.payload.tag != Cat(r_chunk[0:16], r_step8, self.check)):
                    m.d.sync += self.order_error.eq(1)
            with m.Else():
                m.d.sync += rb.eq(rb + 1)
        meta_in = Signal(Meta)
        m.d.comb += [meta_in.rs.eq(r_rs), meta_in.last.eq(rv.payload.last),
                     meta_in.fwd.eq(r_step < last_step),
                     meta_in.wr.eq((r_rs & (r_step == N - 2)) | ~r_rs),
                     meta_in.tag.eq(Cat(r_chunk[0:16], (r_step8 + 1)[0:8], self.check)),
                     meta_in.addr.eq(self.dst + sr.dst + off),
                     pf.w_en.eq(take), pf.w_data.eq(Cat(rv.payload.data, meta_in)),
                     of.w_en.eq(self.rd_op.rvalid), of.w_data.eq(self.rd_op.data)]
        head = Meta(pf.r_data[D:])
        go = pf.r_rdy & (~head.rs | of.r_rdy)
        m.d.comb += [pf.r_en.eq(go), of.r_en.eq(go & head.rs)]
        s1 = Signal(data.StructLayout({"v": 1, "rs": 1, "last": 1, "fwd": 1, "wr": 1,
                                       "tag": 32, "addr": 32}))
        s1_in = Signal(D, reset_less=True)
        s1_op = Signal(D, reset_less=True)
        m.d.sync += [s1.v.eq(go), s1.rs.eq(head.rs), s1.last.eq(head.last), s1.fwd.eq(head.fwd),
                     s1.wr.eq(head.wr), s1.tag.eq(head.tag), s1.addr.eq(head.addr),
                     s1_in.eq(pf.r_data[0:D]), s1_op.eq(of.r_data)]
        operand = self._to_f32(m, s1_op, "op")
        sums = []
        for w in range(self.W):
            add = Fp32Add()
            m.submodules[f"add{w}"] = add
            m.d.comb += [add.a.eq(s1_in[32 * w:32 * (w + 1)]), add.b.eq(operand[32 * w:32 * (w + 1)])]
            sums.append(add.o)
        meta, raw = s1, s1_in
        for k in range(Fp32Add.LATENCY):
            nm = Signal.like(meta, name=f"pm{k}")
            nr = Signal.like(raw, name=f"pr{k}", reset_less=True)
            m.d.sync += [nm.eq(meta), nr.eq(raw)]
            meta, raw = nm, nr
        result = Mux(meta.rs, Cat(*sums), raw)
        m.d.sync += in_flight.eq(in_flight + take - meta.v)
        m.d.comb += [fw.w_en.eq(meta.v & meta.fwd), fw.w_data.eq(Cat(result, meta.last, meta.tag))]
        m.d.comb += [wf.w_en.eq(meta.v & meta.wr), wf.w_data.eq(Cat(meta.addr, result)),
                     self.wr.en.eq(wf.r_rdy), self.wr.addr.eq(wf.r_data[0:32]),
                     self.wr.data.eq(wf.r_data[32:]), wf.r_en.eq(self.wr.ready)]

        # -- start and finish -----------------------------------------------------------------------
        m.d.comb += self.done.eq(~active)
        with m.If(self.start):
            m.d.sync += [active.eq(1), tb.eq(0), rb.eq(0), *tw.reset(), *rw.reset(),
                         self.order_error.eq(0)]
        # Done once every beat of this card's result is written and every beat it sends is in
        # the link layer, which keeps each frame until it is acknowledged and delivers it or
        # reports the link dead: the last acknowledgement's latency is not the collective's.
        with m.Elif(active & tw.done & rw.done & (lf.level == 0) & (l_out == 0) & (fw.level == 0)
                    & (in_flight == 0) & (wf.level == 0)):
            m.d.sync += active.eq(0)
        return m
