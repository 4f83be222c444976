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

A channel is three components around two FIFOs:

    recv -> ChannelRx (receiving walk, operand reads) -> ReducePipe (fp32 adds) -+-> forward FIFO
                                                                                 +-> write FIFO -> wr
    send <- ChannelTx (sending walk: round 0 from local reads, later rounds from the forward FIFO)
"""

from amaranth.hdl import Cat, Const, Module, Mux, Signal
from amaranth.lib import data, stream, wiring
from amaranth.lib.fifo import SyncFIFO, SyncFIFOBuffered
from amaranth.lib.memory import Memory
from amaranth.lib.wiring import In, Out

from hw import stream as hw_stream
from hw.arith.units import Fp32Add, fp16_to_fp32_comb
from hw.ring import MAX_CARDS, OP_AG, OP_AR

from .link import Payload

__all__ = ["RingChannel", "ChannelTx", "ChannelRx", "ReducePipe", "SegEntry", "ChannelConfig",
           "Tag", "Meta", "ReduceIn", "ReduceOut", "MemReadPort", "MemWrite"]

SegEntry = data.StructLayout({"src": 32, "dst": 32, "beats": 32})

# What a channel runs: set before ``start`` and held while it runs.
ChannelConfig = data.StructLayout({
    "op": 2, "fp16": 1, "cards": range(MAX_CARDS + 1), "card": range(MAX_CARDS), "left": 1,
    "chunk_log2": 4, "group": 8, "src": 32, "dst": 32,
    "max_chunks": 24,     # chunks of the longest segment
    "check": 8,           # a byte every card must agree on (the card's: n and cop)
})

# A frame's tag (the link layer carries it in the trailer): its chunk, the schedule step that
# sent it, and the collective's check byte. A receiver compares it with what it expects.
Tag = data.StructLayout({"chunk": 16, "step": 8, "check": 8})

# What a received beat carries through the reduction to the forward or write FIFO: whether
# its operand is added (a reduce-scatter round), the frame's end, where it goes (the next
# round's frame, the destination or both), the tag it is forwarded with and its address.
Meta = data.StructLayout({"rs": 1, "last": 1, "fwd": 1, "wr": 1, "tag": Tag, "addr": 32})


def ReduceIn(data_bits):
    """A received beat, its operand (read for reduce-scatter rounds) and its meta."""
    return data.StructLayout({"data": data_bits, "operand": data_bits, "meta": Meta})


def ReduceOut(data_bits):
    """The beat to forward or write (the sum, or the received beat) and its meta."""
    return data.StructLayout({"data": data_bits, "meta": Meta})


class MemReadPort(hw_stream.ReadPort):
    """A read port of the node's memory (hw/stream.py's request/reply protocol).

    A request on ``req`` is a beat address (``req.valid`` never waits for ``req.ready``); the
    beats come back on ``resp`` in request order, any number of cycles later (at least one),
    and are always taken: the engine asks only for what it has room for. Fits a private
    buffer (one cycle), the card's arbitrated scratchpad or HBM.
    """

    def __init__(self, data_bits):
        self.data_bits = data_bits
        super().__init__(32, data_bits)


def MemWrite(data_bits):
    """A write to the node's memory: a beat and its beat address (the write port is a
    ``stream.Signature`` of them; a write goes when valid and ready)."""
    return data.StructLayout({"addr": 32, "data": data_bits})


def _to_f32(m, beat, fp16, name):
    """fp16 in the low half of each word -> fp32 words when ``fp16``, else the words."""
    words = []
    for w in range(len(beat) // 32):
        word = beat[32 * w:32 * (w + 1)]
        conv = fp16_to_fp32_comb(m, word[0:16], f"{name}{w}")
        words.append(Mux(fp16, conv, word))
    return Cat(*words)


def _last_step(cfg):
    """Tag (step) of the last frames a channel sends."""
    N = cfg.cards
    return Mux(cfg.op == OP_AR, 2 * N - 3, N - 2)


def _seg(m, cfg, k, name):
    """Segment i - k (right-hand ring) or i + k (left-hand ring), mod N; 0 <= k < 3N."""
    N = cfg.cards
    up = cfg.card + k
    down = cfg.card + 3 * N - k
    v = Mux(cfg.left, up, down)
    for _ in range(4):
        v = Mux(v >= N, v - N, v)
    out = Signal(range(MAX_CARDS), name=name)
    m.d.comb += out.eq(v)
    return out


def _chunks(cfg, seg):
    """Chunks of segment entry ``seg``."""
    cl = cfg.chunk_log2
    return (seg.beats + (Const(1, 32) << cl) - 1) >> cl


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


class ChannelTx(wiring.Component):
    """The sending side of a ring channel: its walk of the schedule, frame by frame.

    Round 0's frames are read from local memory (one beat per request, converted to fp32
    unless all-gather) into an 8-beat local FIFO; later rounds' frames come from the forward
    FIFO, which the receiving side fills in the same order. Chunks a segment does not have
    are skipped, one a cycle.

    Members
    -------
    start : In(1)  pulse: back to the schedule's start (wins over the walk)
    active : In(1)  the channel runs
    config : In(ChannelConfig)
    seg_addr : Out(range(MAX_CARDS)); seg : In(SegEntry)
        the segment table, read asynchronously (the segment of the current round)
    rd : Out(MemReadPort)  local reads
    fwd : In(stream(Payload))  frames of rounds >= 1 (the forward FIFO's head)
    send : Out(stream(Payload))  to the link sender
    done : Out(1)  every frame of the schedule handed on (registered)
    idle : Out(1)  no local read in flight or waiting (combinational)

    Timing: at most 6 local beats asked for or waiting; a reply goes into the local FIFO the
    cycle it arrives and can be sent the cycle after. Round 0's frames still in the local
    FIFO go before a forwarded frame.

    Parameters
    ----------
    data_bits : int
        The link beat.
    """

    def __init__(self, *, data_bits):
        self.D = data_bits
        super().__init__({
            "start": In(1), "active": In(1), "config": In(ChannelConfig),
            "seg_addr": Out(range(MAX_CARDS)), "seg": In(SegEntry),
            "rd": Out(MemReadPort(data_bits)),
            "fwd": In(stream.Signature(Payload(data_bits))),
            "send": Out(stream.Signature(Payload(data_bits))),
            "done": Out(1), "idle": Out(1),
        })

    def elaborate(self, platform):
        m = Module()
        cfg, D = self.config, self.D
        cl = cfg.chunk_log2
        last_step = _last_step(cfg)
        N = cfg.cards
        tw = _Walk("tx")
        t_round = tw.r                 # frames with tag = round (round last + 1 sends nothing)
        rs = (cfg.op != OP_AG) & (t_round < N - 1)
        ag = Mux(cfg.op == OP_AR, t_round - (N - 1), t_round)
        m.d.comb += self.seg_addr.eq(_seg(m, cfg, Mux(rs, t_round + 1, ag), "jt"))
        st = self.seg
        t_chunk = tw.g + tw.c
        t_nchunks = _chunks(cfg, st)
        t_exists = (t_round <= last_step) & (t_chunk < t_nchunks)
        t_beats = Mux(t_chunk == t_nchunks - 1, st.beats - (t_chunk << cl), Const(1, 32) << cl)
        tb = Signal(16)                 # beat within the current frame

        # round 0: local reads, one beat ahead into a FIFO, with their (last, tag) beside
        lf = SyncFIFOBuffered(width=Payload(D).size, depth=8)
        m.submodules.lf = lf
        LocalMeta = data.StructLayout({"last": 1, "tag": Tag})
        lm = SyncFIFO(width=LocalMeta.size, depth=8)      # readable the cycle after it is written
        m.submodules.lm = lm
        l_out = Signal(range(16))       # local reads requested and not yet answered
        local = self.active & ~tw.done & (t_round == 0)
        want_read = local & t_exists & ((lf.level + l_out) < 6)
        can_read = want_read & self.rd.req.ready
        m.d.comb += [self.rd.req.valid.eq(want_read),
                     self.rd.req.payload.eq(cfg.src + st.src + (t_chunk << cl) + tb)]
        frame_end = tb == t_beats - 1
        l_reply = self.rd.resp.valid
        m.d.sync += l_out.eq(l_out + can_read - l_reply)
        lm_in = Signal(LocalMeta)
        m.d.comb += [lm_in.last.eq(frame_end), lm_in.tag.chunk.eq(t_chunk[0:16]),
                     lm_in.tag.step.eq(0), lm_in.tag.check.eq(cfg.check),
                     lm.w_en.eq(can_read), lm.w_data.eq(lm_in), lm.r_en.eq(l_reply)]
        local_in = Signal(Payload(D))
        l_meta = LocalMeta(lm.r_data)
        m.d.comb += [local_in.data.eq(Mux(cfg.op == OP_AG, self.rd.resp.payload,
                                          _to_f32(m, self.rd.resp.payload, cfg.fp16, "lc"))),
                     local_in.last.eq(l_meta.last), local_in.tag.eq(l_meta.tag),
                     lf.w_en.eq(l_reply), lf.w_data.eq(local_in)]
        m.d.comb += self.idle.eq((lf.level == 0) & (l_out == 0))

        # The link sender takes frames in schedule order: round 0 from the local FIFO, later
        # rounds from the forward FIFO (which the receiving walk fills in the same order).
        fwd_turn = self.active & ~tw.done & (t_round != 0) & t_exists & self.idle
        with m.If(fwd_turn):
            m.d.comb += [self.send.valid.eq(self.fwd.valid), self.send.payload.eq(self.fwd.payload),
                         self.fwd.ready.eq(self.send.ready)]
        with m.Else():
            m.d.comb += [self.send.valid.eq(lf.r_rdy), self.send.payload.eq(lf.r_data),
                         lf.r_en.eq(self.send.ready)]

        # the walk: a local frame's last read, a forwarded frame's last beat, or a skip
        skip = self.active & ~tw.done & ~t_exists
        with m.If(can_read):
            with m.If(frame_end):
                m.d.sync += tb.eq(0)
            with m.Else():
                m.d.sync += tb.eq(tb + 1)
        fwd_last = fwd_turn & self.fwd.valid & self.send.ready & self.fwd.payload.last
        with m.If((can_read & frame_end) | skip | fwd_last):
            tw.advance(m, cfg.group, last_step + 2, cfg.max_chunks)
        with m.If(self.start):
            m.d.sync += [tb.eq(0), *tw.reset()]
        m.d.comb += self.done.eq(tw.done)
        return m


class ChannelRx(wiring.Component):
    """The receiving side of a ring channel: its walk of the schedule, beat by beat.

    Each received beat is checked against the schedule (the frame's tag on its last beat),
    and in reduce-scatter rounds its operand is read from local memory at the same time;
    beats wait in a 32-deep FIFO for their operands, which the memory answers into another,
    and leave on ``o`` (never held back) once both are there.

    Parameters
    ----------
    data_bits : int
        The link beat.

    Members
    -------
    start : In(1)  pulse: back to the schedule's start, ``order_error`` cleared (wins)
    active : In(1)  the channel runs
    config : In(ChannelConfig)
    seg_addr : Out(range(MAX_CARDS)); seg : In(SegEntry)  the segment table (asynchronous)
    recv : In(stream(Payload))  from the link receiver
    rd : Out(MemReadPort)  operand reads
    room : In(1)  the FIFOs downstream have room for one more beat
    o : Out(stream(ReduceIn, always_ready))  beats to reduce
    taken : Out(1)  a beat was taken from ``recv`` (combinational)
    done : Out(1)  every frame of the schedule received (registered)
    order_error : Out(1)  sticky: a frame's tag is not the one the schedule expects
    """

    def __init__(self, *, data_bits):
        self.D = data_bits
        super().__init__({
            "start": In(1), "active": In(1), "config": In(ChannelConfig),
            "seg_addr": Out(range(MAX_CARDS)), "seg": In(SegEntry),
            "recv": In(stream.Signature(Payload(data_bits))),
            "rd": Out(MemReadPort(data_bits)), "room": In(1),
            "o": Out(stream.Signature(ReduceIn(data_bits), always_ready=True)),
            "taken": Out(1), "done": Out(1), "order_error": Out(1),
        })

    def elaborate(self, platform):
        m = Module()
        cfg, D = self.config, self.D
        N, cl = cfg.cards, cfg.chunk_log2
        last_step = _last_step(cfg)
        rw = _Walk("rx")
        r_step = rw.r - 1               # tag of the frames received in round r (r >= 1)
        r_step8 = Signal(8)             # its tag field, exactly 8 bits wide
        m.d.comb += r_step8.eq(r_step)
        r_rs = (cfg.op != OP_AG) & (r_step < N - 1)
        r_ag = Mux(cfg.op == OP_AR, r_step - (N - 1), r_step)
        m.d.comb += self.seg_addr.eq(_seg(m, cfg, Mux(r_rs, r_step + 2, r_ag + 1), "jr"))
        sr = self.seg
        r_chunk = rw.g + rw.c
        r_exists = (rw.r != 0) & (r_chunk < _chunks(cfg, sr))
        rb = Signal(16)
        rv = self.recv
        pre = rv.valid & self.active & ~rw.done & r_exists & self.room
        take = pre & (~r_rs | self.rd.req.ready)
        m.d.comb += [rv.ready.eq(take), self.taken.eq(take)]
        off = (r_chunk << cl) + rb
        m.d.comb += [self.rd.req.valid.eq(pre & r_rs), self.rd.req.payload.eq(cfg.src + sr.src + off)]
        tag = Tag(rv.payload.tag)
        with m.If(take):
            with m.If(rv.payload.last):
                m.d.sync += rb.eq(0)
                with m.If((tag.chunk != r_chunk[0:16]) | (tag.step != r_step8) | (tag.check != cfg.check)):
                    m.d.sync += self.order_error.eq(1)
            with m.Else():
                m.d.sync += rb.eq(rb + 1)
        with m.If((take & rv.payload.last) | (self.active & ~rw.done & ~r_exists)):
            rw.advance(m, cfg.group, last_step + 2, cfg.max_chunks)
        with m.If(self.start):
            m.d.sync += [rb.eq(0), *rw.reset(), self.order_error.eq(0)]
        m.d.comb += self.done.eq(rw.done)

        # Received beats wait in `pf` for their operand (reduce-scatter rounds), which the
        # memory answers into `of` in request order.
        Held = data.StructLayout({"data": D, "meta": Meta})
        pf = SyncFIFO(width=Held.size, depth=32)
        of = SyncFIFO(width=D, depth=32)
        m.submodules.pf, m.submodules.of = pf, of
        held_in = Signal(Held)
        m.d.comb += [held_in.data.eq(rv.payload.data), held_in.meta.rs.eq(r_rs),
                     held_in.meta.last.eq(rv.payload.last),
                     held_in.meta.fwd.eq(r_step < last_step),
                     held_in.meta.wr.eq((r_rs & (r_step == N - 2)) | ~r_rs),
                     held_in.meta.tag.chunk.eq(r_chunk[0:16]), held_in.meta.tag.step.eq(r_step8 + 1),
                     held_in.meta.tag.check.eq(cfg.check),
                     held_in.meta.addr.eq(cfg.dst + sr.dst + off),
                     pf.w_en.eq(take), pf.w_data.eq(held_in),
                     of.w_en.eq(self.rd.resp.valid), of.w_data.eq(self.rd.resp.payload)]
        head = Held(pf.r_data)
        go = pf.r_rdy & (~head.meta.rs | of.r_rdy)
        m.d.comb += [pf.r_en.eq(go), of.r_en.eq(go & head.meta.rs),
                     self.o.valid.eq(go), self.o.payload.data.eq(head.data),
                     self.o.payload.operand.eq(of.r_data), self.o.payload.meta.eq(head.meta)]
        return m


class ReducePipe(wiring.Component):
    """Received beat + operand -> the beat to forward or write: fp32 additions, no stall.

    Parameters
    ----------
    data_bits : int
        The link beat (data_bits / 32 adders).

    Members
    -------
    fp16 : In(1)  operands are fp16 (in the low half of each word): converted exactly first
    i : In(stream(ReduceIn, always_ready))  a beat (``ChannelRx.o``)
    o : Out(stream(ReduceOut, always_ready))  data = beat + operand word by word
        (fp32, beat first) when ``meta.rs``, else the beat

    Timing: 1 + Fp32Add.LATENCY cycles from ``i`` to ``o``, one beat a cycle; the input is
    registered, the adders' pipelines follow, and the meta and the beat travel beside them.
    """

    def __init__(self, *, data_bits):
        self.D, self.W = data_bits, data_bits // 32
        super().__init__({
            "fp16": In(1),
            "i": In(stream.Signature(ReduceIn(data_bits), always_ready=True)),
            "o": Out(stream.Signature(ReduceOut(data_bits), always_ready=True)),
        })

    def elaborate(self, platform):
        m = Module()
        D = self.D
        s1 = Signal(data.StructLayout({"v": 1, "meta": Meta}))
        s1_in = Signal(D, reset_less=True)
        s1_op = Signal(D, reset_less=True)
        m.d.sync += [s1.v.eq(self.i.valid), s1.meta.eq(self.i.payload.meta),
                     s1_in.eq(self.i.payload.data), s1_op.eq(self.i.payload.operand)]
        operand = _to_f32(m, s1_op, self.fp16, "op")
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
        m.d.comb += [self.o.valid.eq(meta.v), self.o.payload.meta.eq(meta.meta),
                     self.o.payload.data.eq(Mux(meta.meta.rs, Cat(*sums), raw))]
        return m


class RingChannel(wiring.Component):
    """One direction of a ring collective.

    Parameters
    ----------
    data_bits : int
        The link beat.

    Members
    -------
    start : In(1) pulse; done : Out(1) level (idle)
    config : In(ChannelConfig)  held while the channel runs
    seg_we, seg_addr, seg_data : In  the segment table
    send : Out(stream(Payload)) to the link sender; recv : In(stream(Payload)) from the receiver
    rd_src, rd_op : Out(MemReadPort); wr : Out(stream(MemWrite))
    order_error : Out(1) sticky: a received frame's tag is not the one the schedule expects;
        tag = chunk (16 bits), step (8), check (8)

    Timing: a received beat reaches the forward or write FIFO 1 + Fp32Add.LATENCY cycles
    after it is taken; the receiver takes beats only while the forward FIFO, the write FIFO
    and the adders together hold fewer than 30, so no FIFO overflows whatever the memory's
    latency. Done once every beat of this card's result is written and every beat it sends
    is in the link layer, which keeps each frame until it is acknowledged and delivers it or
    reports the link dead: the last acknowledgement's latency is not the collective's.
    """

    def __init__(self, *, data_bits):
        self.D = data_bits
        super().__init__({
            "start": In(1), "done": Out(1), "config": In(ChannelConfig),
            "seg_we": In(1), "seg_addr": In(range(MAX_CARDS)), "seg_data": In(SegEntry),
            "send": Out(stream.Signature(Payload(data_bits))),
            "recv": In(stream.Signature(Payload(data_bits))),
            "rd_src": Out(MemReadPort(data_bits)), "rd_op": Out(MemReadPort(data_bits)),
            "wr": Out(stream.Signature(MemWrite(data_bits))),
            "order_error": Out(1),
        })

    def elaborate(self, platform):
        m = Module()
        D = self.D
        segs = Memory(shape=SegEntry, depth=MAX_CARDS, init=[])
        m.submodules.segs = segs
        sw = segs.write_port()
        m.d.comb += [sw.en.eq(self.seg_we), sw.addr.eq(self.seg_addr), sw.data.eq(self.seg_data)]
        seg_tx = segs.read_port(domain="comb")
        seg_rx = segs.read_port(domain="comb")
        m.submodules.tx = tx = ChannelTx(data_bits=D)
        m.submodules.rx = rx = ChannelRx(data_bits=D)
        m.submodules.pipe = pipe = ReducePipe(data_bits=D)
        fw = SyncFIFOBuffered(width=Payload(D).size, depth=32)       # frames to forward
        wf = SyncFIFOBuffered(width=MemWrite(D).size, depth=32)      # results to write
        m.submodules.fw, m.submodules.wf = fw, wf

        active = Signal()
        for side, seg in ((tx, seg_tx), (rx, seg_rx)):
            m.d.comb += [side.start.eq(self.start), side.active.eq(active),
                         side.config.eq(self.config), seg.addr.eq(side.seg_addr), side.seg.eq(seg.data)]
        wiring.connect(m, tx.rd, wiring.flipped(self.rd_src))
        wiring.connect(m, tx.send, wiring.flipped(self.send))
        wiring.connect(m, rx.rd, wiring.flipped(self.rd_op))
        wiring.connect(m, wiring.flipped(self.recv), rx.recv)
        wiring.connect(m, rx.o, pipe.i)
        m.d.comb += [pipe.fp16.eq(self.config.fp16), self.order_error.eq(rx.order_error)]

        # the adders' results: forwarded as the next round's frames, and/or written
        res = pipe.o.payload
        fwd_in, wr_in = Signal(Payload(D)), Signal(MemWrite(D))
        m.d.comb += [fwd_in.data.eq(res.data), fwd_in.last.eq(res.meta.last), fwd_in.tag.eq(res.meta.tag),
                     fw.w_en.eq(pipe.o.valid & res.meta.fwd), fw.w_data.eq(fwd_in),
                     tx.fwd.valid.eq(fw.r_rdy), tx.fwd.payload.eq(fw.r_data), fw.r_en.eq(tx.fwd.ready),
                     wr_in.addr.eq(res.meta.addr), wr_in.data.eq(res.data),
                     wf.w_en.eq(pipe.o.valid & res.meta.wr), wf.w_data.eq(wr_in),
                     self.wr.valid.eq(wf.r_rdy), self.wr.payload.eq(wf.r_data), wf.r_en.eq(self.wr.ready)]
        # beats taken and not yet out of the adders: the budget keeps every FIFO from overflowing
        in_flight = Signal(range(64))
        m.d.sync += in_flight.eq(in_flight + rx.taken - pipe.o.valid)
        m.d.comb += rx.room.eq((fw.level + wf.level + in_flight) < 32 - 2)

        m.d.comb += self.done.eq(~active)
        with m.If(self.start):
            m.d.sync += active.eq(1)
        with m.Elif(active & tx.done & rx.done & tx.idle & (fw.level == 0) & (in_flight == 0)
                    & (wf.level == 0)):
            m.d.sync += active.eq(0)
        return m
