"""Reliable link layer on the AXI4-Stream ports between ring neighbours.

Whatever the network below drops or corrupts, the layer delivers every payload once, in order,
or reports the link dead.

Frames. A data frame is 1..F payload beats followed by a trailer beat (``tlast``); a control
frame (ACK or NAK) is a trailer alone. The trailer (the low 128 bits of the beat) holds kind,
sequence number, acknowledgement, credit, payload length, a 32-bit tag for the user and the
CRC-32 (Ethernet polynomial, amaranth.lib.crc) of the whole frame with the CRC field zero.

Reliability (go-back-N). The sender keeps up to ``window`` frames until they are acknowledged.
The receiver accepts only the frame it expects, with a good CRC, into a buffer of
``rx_frames`` frames; it answers ACK(next expected, credit) as frames arrive and are consumed,
and NAK(next expected) once when it sees a bad or out-of-order frame. The sender never sends
past the receiver's credit (so buffers cannot overflow), goes back to the first unacknowledged
frame on a NAK or when no acknowledgement has come for ``timeout`` cycles, and reports the
link dead after ``retries`` timeouts in a row.
"""

from amaranth.hdl import Cat, Const, Module, Mux, Signal
from amaranth.lib import crc, data, stream, wiring
from amaranth.lib.fifo import SyncFIFOBuffered
from amaranth.lib.memory import Memory
from amaranth.lib.wiring import In, Out

__all__ = ["Trailer", "FrameInfo", "KIND_DATA", "KIND_ACK", "KIND_NAK", "LinkTx", "LinkRx",
           "LinkPort", "CRC", "Beat", "Payload"]

KIND_DATA, KIND_ACK, KIND_NAK = 1, 2, 3
SEQ_BITS = 16

Trailer = data.StructLayout({
    "kind": 2, "seq": SEQ_BITS, "ack": SEQ_BITS, "credit": SEQ_BITS, "len": 8, "pad": 6,
    "tag": 32, "crc": 32,
})   # 128 bits: the low part of a trailer beat

FrameInfo = data.StructLayout({"len": 8, "tag": 32})   # a received frame's payload beats and tag


class _CRCProcessor(crc.Processor):
    """amaranth.lib.crc's processor with each next-state bit as one balanced XOR reduction.

    The library builds each bit as a left-deep chain of up to (32 + data bits) two-input XORs;
    at 512 data bits that makes Amaranth's netlist pass quadratic in the chain length (minutes
    per node) and the Verilog megabytes long. Same matrices, same ports, same behaviour.
    """

    def elaborate(self, platform):
        m = Module()
        crc_reg = Signal(self._crc_width, init=self._initial_crc.value)
        data_in = Signal(self._data_width)
        m.d.comb += data_in.eq(self.data[::-1] if self._reflect_input else self.data)
        out = crc_reg[::-1] if self._reflect_output else crc_reg
        m.d.comb += [self.crc.eq(out ^ self._xor_output), self.match_detected.eq(out == self._residue)]
        source = Mux(self.start, self._initial_crc, crc_reg)
        with m.If(self.valid):
            for i in range(self._crc_width):
                terms = ([source[j] for j in range(self._crc_width) if self._matrix_f[j][i]] +
                         [data_in[j] for j in range(self._data_width) if self._matrix_g[j][i]])
                m.d.sync += crc_reg[i].eq(Cat(*terms).xor() if terms else 0)
        with m.Elif(self.start):
            m.d.sync += crc_reg.eq(self._initial_crc)
        return m


class _CRC:
    """CRC-32 (Ethernet) over ``data_bits``-bit words: ``.create()`` gives the processor."""

    def __init__(self, data_bits):
        self.parameters = crc.catalog.CRC32_ETHERNET(data_bits)

    def create(self):
        return _CRCProcessor(self.parameters)

    def compute(self, data):
        return self.parameters.compute(data)


def CRC(data_bits):
    return _CRC(data_bits)


def Beat(data_bits):
    """A beat on the wire: data and last (tkeep is all ones)."""
    return data.StructLayout({"data": data_bits, "last": 1})


def Payload(data_bits):
    """A payload beat between the link layer and its user: data, last of frame, frame tag."""
    return data.StructLayout({"data": data_bits, "last": 1, "tag": 32})


def _trailer_beat(data_bits, t):
    return Cat(t.as_value() if hasattr(t, "as_value") else t, Const(0, data_bits - 128))


class LinkTx(wiring.Component):
    """Sender of data frames (and of their retransmissions).

    Members
    -------
    i : In(stream(Payload))  frames to send (``last`` ends a frame of at most ``frame_beats``)
    o : Out(stream(Beat))  frames on the wire (to the port's arbiter)
    ack_valid, ack_seq, ack_credit, nak_valid, nak_seq : In  decoded control frames
    error : Out(1)  sticky: the link is dead (``retries`` timeouts without progress)
    retx : Out(1)  pulse per frame sent again
    """

    def __init__(self, *, data_bits, frame_beats, window, rx_frames, timeout, retries):
        self.D, self.F, self.WIN = data_bits, frame_beats, window
        self.rx_frames, self.timeout, self.retries = rx_frames, timeout, retries
        super().__init__({
            "i": In(stream.Signature(Payload(data_bits))),
            "o": Out(stream.Signature(Beat(data_bits))),
            "ack_valid": In(1), "ack_seq": In(SEQ_BITS), "ack_credit": In(SEQ_BITS),
            "nak_valid": In(1), "nak_seq": In(SEQ_BITS),
            "error": Out(1), "retx": Out(1),
        })

    def elaborate(self, platform):
        m = Module()
        D, F, WIN = self.D, self.F, self.WIN
        wbits = (WIN - 1).bit_length()
        slot_beats = F
        store = Memory(shape=D, depth=WIN * slot_beats, init=[])
        m.submodules.store = store
        sw = store.write_port()
        sr = store.read_port(transparent_for=())
        trailers = Memory(shape=Trailer, depth=WIN, init=[])
        m.submodules.trailers = trailers
        tw_ = trailers.write_port()
        tr_ = trailers.read_port(transparent_for=())
        # Two CRC units, one per frame parity: a frame's trailer is finished while the next
        # frame's payload already streams in, so the sender takes a beat every cycle.
        m.submodules.crc0 = c0 = CRC(D).create()
        m.submodules.crc1 = c1 = CRC(D).create()
        lens = Memory(shape=8, depth=WIN, init=[])
        m.submodules.lens = lens
        lw = lens.write_port()
        lr = lens.read_port(domain="comb")

        base = Signal(SEQ_BITS)          # oldest unacknowledged
        next_seq = Signal(SEQ_BITS)      # next to commit (trailer written)
        fill_seq = Signal(SEQ_BITS)      # the frame being filled
        send_seq = Signal(SEQ_BITS)      # next to send
        limit = Signal(SEQ_BITS, init=self.rx_frames)   # receiver credit: send while seq < limit

        # -- fill: payload beats into the slot of fill_seq, CRC alongside ----------------------
        k = Signal(8)
        tag = Signal(32)
        # A slot is filled again only when its frame is acknowledged and the sender is past it:
        # acknowledgements of frames sent before a go-back can move base beyond send_seq, and
        # the sender then still reads (resends) those frames.
        oldest = Mux(_behind(send_seq, base), send_seq, base)
        room = (fill_seq - oldest)[0:SEQ_BITS] < WIN
        slot_fill = fill_seq[0:wbits] if wbits else Const(0, 1)
        par = fill_seq[0]
        m.d.comb += self.i.ready.eq(room)
        # finishing pipeline: f1 feeds the trailer (CRC field 0) to its unit, f2 stores it
        f1 = Signal(data.StructLayout({"v": 1, "t": Trailer, "par": 1}))
        f2 = Signal(data.StructLayout({"v": 1, "t": Trailer, "par": 1}))
        with m.If(self.i.valid & self.i.ready):
            beat = self.i.payload
            m.d.comb += [sw.en.eq(1), sw.addr.eq(slot_fill * slot_beats + k), sw.data.eq(beat.data)]
            for unit, p in ((c0, 0), (c1, 1)):
                with m.If(par == p):
                    m.d.comb += [unit.valid.eq(1), unit.start.eq(k == 0), unit.data.eq(beat.data)]
            ftag = Mux(k == 0, beat.tag, tag)
            with m.If(k == 0):
                m.d.sync += tag.eq(beat.tag)
            with m.If(beat.last):
                m.d.sync += [k.eq(0), fill_seq.eq(fill_seq + 1), f1.v.eq(1), f1.par.eq(par),
                             f1.t.kind.eq(KIND_DATA), f1.t.seq.eq(fill_seq), f1.t.len.eq(k + 1),
                             f1.t.tag.eq(ftag)]
            with m.Else():
                m.d.sync += [k.eq(k + 1), f1.v.eq(0)]
        with m.Else():
            m.d.sync += f1.v.eq(0)
        with m.If(f1.v):
            for unit, p in ((c0, 0), (c1, 1)):
                with m.If(f1.par == p):
                    m.d.comb += [unit.valid.eq(1), unit.data.eq(_trailer_beat(D, f1.t))]
        m.d.sync += f2.eq(f1)
        with m.If(f2.v):
            t2 = Signal(Trailer)
            m.d.comb += [t2.eq(f2.t), t2.crc.eq(Mux(f2.par, c1.crc, c0.crc))]
            slot_f2 = f2.t.seq[0:wbits] if wbits else Const(0, 1)
            m.d.comb += [tw_.en.eq(1), tw_.addr.eq(slot_f2), tw_.data.eq(t2),
                         lw.en.eq(1), lw.addr.eq(slot_f2), lw.data.eq(f2.t.len)]
            m.d.sync += next_seq.eq(f2.t.seq + 1)

        # -- send: payload beats of send_seq's slot, then its trailer ---------------------
        out_fifo = SyncFIFOBuffered(width=Beat(D).size, depth=8)
        m.submodules.out_fifo = out_fifo
        m.d.comb += [self.o.valid.eq(out_fifo.r_rdy), self.o.payload.eq(out_fifo.r_data),
                     out_fifo.r_en.eq(self.o.ready)]
        sending = Signal()
        b = Signal(8)                     # beat of the frame being read (F = the trailer)
        slot_send = send_seq[0:wbits] if wbits else Const(0, 1)
        m.d.comb += lr.addr.eq(slot_send)
        flen = lr.data
        rd_pending = Signal()
        rd_last = Signal()
        go_back = Signal()                # pending: restart at base after this frame
        can_start = (send_seq != next_seq) & ((send_seq - limit)[0:SEQ_BITS].as_signed() < 0) & ~self.error
        room_out = (out_fifo.level + rd_pending) < 6
        with m.If(~sending):
            with m.If(go_back):
                m.d.sync += [send_seq.eq(base), go_back.eq(0)]
            with m.Elif(can_start & room_out):
                m.d.sync += [sending.eq(1), b.eq(0)]
        read = sending & room_out
        m.d.comb += [sr.en.eq(1), sr.addr.eq(slot_send * slot_beats + b),
                     tr_.en.eq(1), tr_.addr.eq(slot_send)]
        m.d.sync += [rd_pending.eq(read), rd_last.eq(b == flen)]
        with m.If(read):
            with m.If(b == flen):
                m.d.sync += [sending.eq(0), send_seq.eq(send_seq + 1)]
            with m.Else():
                m.d.sync += b.eq(b + 1)
        out_beat = Signal(Beat(D))
        m.d.comb += [out_beat.data.eq(Mux(rd_last, _trailer_beat(D, tr_.data), sr.data)),
                     out_beat.last.eq(rd_last), out_fifo.w_en.eq(rd_pending), out_fifo.w_data.eq(out_beat)]

        # -- acknowledgements, go-back, timeout -----------------------------------------------
        timer = Signal(range(self.timeout + 1))
        tries = Signal(range(self.retries + 2))
        high_water = Signal(SEQ_BITS)     # highest seq sent so far + 1 (a resend is a retx)
        with m.If(read & (b == flen)):
            with m.If(((high_water - send_seq)[0:SEQ_BITS] == 0) | ((high_water - send_seq)[SEQ_BITS - 1])):
                m.d.sync += high_water.eq(send_seq + 1)
            with m.Else():
                m.d.comb += self.retx.eq(1)
        progress = Signal()
        with m.If(self.ack_valid):
            adv = (self.ack_seq - base)[0:SEQ_BITS]
            with m.If((adv != 0) & (adv <= (next_seq - base)[0:SEQ_BITS])):
                m.d.sync += base.eq(self.ack_seq)
                m.d.comb += progress.eq(1)
            m.d.sync += limit.eq(self.ack_credit)
        with m.If(self.nak_valid):
            adv = (self.nak_seq - base)[0:SEQ_BITS]
            with m.If(adv <= (next_seq - base)[0:SEQ_BITS]):
                m.d.sync += [base.eq(self.nak_seq), go_back.eq(1)]
                with m.If(adv != 0):
                    m.d.comb += progress.eq(1)
        # The timer runs only while frames have been sent and not acknowledged (waiting for the
        # receiver's credit is not a loss).
        with m.If(progress | (base == send_seq)):
            m.d.sync += [timer.eq(0)]
            with m.If(progress):
                m.d.sync += tries.eq(0)
        with m.Elif(timer == self.timeout):
            m.d.sync += [timer.eq(0), go_back.eq(1), tries.eq(tries + 1)]
            with m.If(tries == self.retries):
                m.d.sync += self.error.eq(1)
        with m.Else():
            m.d.sync += timer.eq(timer + 1)
        return m


class LinkRx(wiring.Component):
    """Receiver of data frames: in order, CRC checked, delivered once.

    Members
    -------
    i : In(stream(Beat))  data frames from the port
    o : Out(stream(Payload))  payload beats in order
    ctl_valid, ctl_kind, ctl_seq, ctl_credit : Out  the control frame to send (held until
        ``ctl_ready``; ACKs are merged, a NAK is sent once per expected sequence number)
    ctl_ready : In(1)
    crc_error : Out(1) pulse
    """

    def __init__(self, *, data_bits, frame_beats, rx_frames):
        self.D, self.F, self.R = data_bits, frame_beats, rx_frames
        super().__init__({
            "i": In(stream.Signature(Beat(data_bits))),
            "o": Out(stream.Signature(Payload(data_bits))),
            "ctl_valid": Out(1), "ctl_kind": Out(2), "ctl_seq": Out(SEQ_BITS),
            "ctl_credit": Out(SEQ_BITS), "ctl_ready": In(1),
            "crc_error": Out(1),
        })

    def elaborate(self, platform):
        m = Module()
        D, F, R = self.D, self.F, self.R
        rbits = (R - 1).bit_length()
        buf = Memory(shape=D, depth=R * F, init=[])
        m.submodules.buf = buf
        bw = buf.write_port()
        br = buf.read_port(transparent_for=())
        meta = Memory(shape=FrameInfo, depth=R, init=[])
        m.submodules.meta = meta
        mw = meta.write_port()
        mr = meta.read_port(domain="comb")
        # Two CRC units, one per frame parity: a frame is checked in the cycle after its trailer
        # while the next frame's first beat already comes in.
        m.submodules.crc0 = c0 = CRC(D).create()
        m.submodules.crc1 = c1 = CRC(D).create()

        expected = Signal(SEQ_BITS)       # next sequence number to accept
        delivered = Signal(SEQ_BITS)      # next to hand to the user
        k = Signal(8)                     # payload beats of the frame so far
        drop = Signal()                   # this frame is discarded (no room)
        par = Signal()                    # parity of the frame coming in
        chk = Signal(data.StructLayout({"v": 1, "t": Trailer, "k": 9, "drop": 1, "par": 1}))
        # The frame coming in is taken as `expected`, or as `expected + 1` when the frame before
        # it is being accepted in this very cycle (its check runs the cycle after its trailer,
        # while the next frame's first beat may already come in). A frame that is checked and
        # not accepted (a duplicate, a gap, a bad CRC) leaves the next one at `expected`: were
        # its first beat written to `expected + 1`, a retransmitted `expected` would be
        # delivered with the first beat of whatever frame last filled its slot.
        accept_now = Signal()
        wr_seq = expected + accept_now
        slot_in = wr_seq[0:rbits] if rbits else Const(0, 1)
        slot_chk = expected[0:rbits] if rbits else Const(0, 1)
        has_room = ((wr_seq - delivered)[0:SEQ_BITS] < R)

        # -- receive ---------------------------------------------------------------------------
        m.d.comb += self.i.ready.eq(1)
        m.d.sync += chk.v.eq(0)
        with m.If(self.i.valid):
            beat = self.i.payload
            unit_data = Signal(D)
            with m.If(beat.last):
                z = Signal(Trailer)
                m.d.comb += [z.eq(beat.data[0:128]), z.crc.eq(0),
                             unit_data.eq(Cat(z.as_value(), beat.data[128:D]))]
                m.d.sync += [chk.v.eq(1), chk.t.eq(beat.data[0:128]), chk.k.eq(k), chk.drop.eq(drop),
                             chk.par.eq(par), k.eq(0), drop.eq(0), par.eq(~par)]
            with m.Else():
                m.d.comb += unit_data.eq(beat.data)
                with m.If(k == 0):
                    m.d.sync += drop.eq(~has_room)
                with m.If(~((k == 0) & ~has_room) & ~(drop & (k != 0)) & (k < F)):
                    m.d.comb += [bw.en.eq(1), bw.addr.eq(slot_in * F + k), bw.data.eq(beat.data)]
                m.d.sync += k.eq(k + 1)
            for unit, p in ((c0, 0), (c1, 1)):
                with m.If(par == p):
                    m.d.comb += [unit.valid.eq(1), unit.start.eq(k == 0), unit.data.eq(unit_data)]

        nak_sent_for = Signal(SEQ_BITS + 1)    # bit 16: a NAK was sent for `expected`
        want_ack = Signal()
        want_nak = Signal()

        # -- control frames to send ---------------------------------------------------------------
        # The flags are cleared here, before the statements below that set them: a frame
        # accepted, a duplicate or a frame consumed in the very cycle a pending ACK is taken
        # leaves want_ack set (the ACK taken carries the state from before it), and so does a
        # bad frame in the cycle an ACK or a NAK is taken for want_nak (a NAK is still sent once
        # per expected sequence number: nak_due). Later statements win in Amaranth.
        nak_due = want_nak & ~(nak_sent_for[SEQ_BITS] & (nak_sent_for[0:SEQ_BITS] == expected))
        m.d.comb += [self.ctl_valid.eq(want_ack | nak_due),
                     self.ctl_kind.eq(Mux(nak_due, KIND_NAK, KIND_ACK)),
                     self.ctl_seq.eq(expected), self.ctl_credit.eq(delivered + R)]
        with m.If(self.ctl_valid & self.ctl_ready):
            with m.If(nak_due):
                m.d.sync += [want_nak.eq(0), nak_sent_for.eq(Cat(expected, Const(1, 1)))]
            with m.Else():
                m.d.sync += [want_ack.eq(0), want_nak.eq(0)]
        with m.Elif(want_nak & ~nak_due):
            m.d.sync += want_nak.eq(0)

        with m.If(chk.v):
            held = chk.t
            crc_ok = Mux(chk.par, c1.crc, c0.crc) == held.crc
            good = crc_ok & (held.kind == KIND_DATA) & (held.len == chk.k) & (chk.k != 0) & (chk.k <= F)
            with m.If(~crc_ok):
                m.d.comb += self.crc_error.eq(1)
            with m.If(good & (held.seq == expected) & ~chk.drop):
                m.d.comb += [accept_now.eq(1),
                             mw.en.eq(1), mw.addr.eq(slot_chk), mw.data.len.eq(held.len),
                             mw.data.tag.eq(held.tag)]
                m.d.sync += [expected.eq(expected + 1), want_ack.eq(1)]
            with m.Elif(good & _behind(held.seq, expected)):
                m.d.sync += want_ack.eq(1)          # a duplicate: tell the sender where we are
            with m.Elif(~chk.drop):
                m.d.sync += want_nak.eq(1)          # bad, or a gap: go back to expected

        # -- deliver -----------------------------------------------------------------------------
        out_fifo = SyncFIFOBuffered(width=Payload(D).size, depth=8)
        m.submodules.out_fifo = out_fifo
        m.d.comb += [self.o.valid.eq(out_fifo.r_rdy), self.o.payload.eq(out_fifo.r_data),
                     out_fifo.r_en.eq(self.o.ready)]
        slot_out = delivered[0:rbits] if rbits else Const(0, 1)
        m.d.comb += mr.addr.eq(slot_out)
        dlen = mr.data.len
        dtag = mr.data.tag
        d = Signal(8)
        rd_pending = Signal()
        rd_last = Signal()
        rd_tag = Signal(32)
        avail = delivered != expected
        read = avail & ((out_fifo.level + rd_pending) < 6)
        m.d.comb += [br.en.eq(1), br.addr.eq(slot_out * F + d)]
        m.d.sync += [rd_pending.eq(read), rd_last.eq(d == dlen - 1), rd_tag.eq(dtag)]
        with m.If(read):
            with m.If(d == dlen - 1):
                m.d.sync += [d.eq(0), delivered.eq(delivered + 1), want_ack.eq(1)]
            with m.Else():
                m.d.sync += d.eq(d + 1)
        out_beat = Signal(Payload(D))
        m.d.comb += [out_beat.data.eq(br.data), out_beat.last.eq(rd_last), out_beat.tag.eq(rd_tag),
                     out_fifo.w_en.eq(rd_pending), out_fifo.w_data.eq(out_beat)]

        return m


def _behind(a, b):
    """a is before b (sequence numbers, modulo)."""
    diff = (b - a)[0:SEQ_BITS]
    return (diff != 0) & ~diff[SEQ_BITS - 1]


class LinkPort(wiring.Component):
    """One link port: a sender and a receiver sharing the wire pair.

    The transmit side sends data frames from the sender and control frames for the receiver
    (whole frames, control first); the receive side passes data frames to the receiver and
    decodes control frames (CRC checked) for the sender.

    Members
    -------
    tx : Out(AXI4-Stream-like stream of Beat); rx : In(stream of Beat)
    send : In(stream(Payload)) ; recv : Out(stream(Payload))
    error : Out(1); retx, crc_error, tx_beat, rx_beat : Out(1) pulses
    """

    def __init__(self, *, data_bits, frame_beats, window, rx_frames, timeout, retries):
        self.D = data_bits
        self.ltx = LinkTx(data_bits=data_bits, frame_beats=frame_beats, window=window,
                          rx_frames=rx_frames, timeout=timeout, retries=retries)
        self.lrx = LinkRx(data_bits=data_bits, frame_beats=frame_beats, rx_frames=rx_frames)
        super().__init__({
            "tx": Out(stream.Signature(Beat(data_bits))),
            "rx": In(stream.Signature(Beat(data_bits))),
            "send": In(stream.Signature(Payload(data_bits))),
            "recv": Out(stream.Signature(Payload(data_bits))),
            "error": Out(1), "retx": Out(1), "crc_error": Out(1),
            "tx_beat": Out(1), "rx_beat": Out(1),
        })

    def elaborate(self, platform):
        m = Module()
        D = self.D
        m.submodules.ltx = ltx = self.ltx
        m.submodules.lrx = lrx = self.lrx
        wiring.connect(m, wiring.flipped(self.send), ltx.i)
        wiring.connect(m, lrx.o, wiring.flipped(self.recv))
        m.d.comb += [self.error.eq(ltx.error), self.retx.eq(ltx.retx),
                     self.crc_error.eq(lrx.crc_error)]

        # -- transmit: control frames (one beat, CRC in a cycle) between data frames -------------
        m.submodules.ccrc = ccrc = CRC(D).create()
        in_data = Signal()                 # a data frame is being passed through
        ctl_state = Signal(2)              # 0 idle, 1 CRC running, 2 frame ready
        ctl = Signal(Trailer)
        m.d.comb += [ctl.kind.eq(lrx.ctl_kind), ctl.seq.eq(0), ctl.ack.eq(lrx.ctl_seq),
                     ctl.credit.eq(lrx.ctl_credit)]
        ctl_held = Signal(Trailer)
        with m.Switch(ctl_state):
            with m.Case(0):
                with m.If(lrx.ctl_valid):
                    m.d.comb += [lrx.ctl_ready.eq(1), ccrc.valid.eq(1), ccrc.start.eq(1),
                                 ccrc.data.eq(_trailer_beat(D, ctl))]
                    m.d.sync += [ctl_held.eq(ctl), ctl_state.eq(1)]
            with m.Case(1):
                m.d.sync += [ctl_held.crc.eq(ccrc.crc), ctl_state.eq(2)]
        send_ctl = (ctl_state == 2) & ~in_data
        with m.If(send_ctl):
            m.d.comb += [self.tx.valid.eq(1), self.tx.payload.data.eq(_trailer_beat(D, ctl_held)),
                         self.tx.payload.last.eq(1)]
            with m.If(self.tx.ready):
                m.d.sync += ctl_state.eq(0)
        with m.Else():
            m.d.comb += [self.tx.valid.eq(ltx.o.valid), self.tx.payload.eq(ltx.o.payload),
                         ltx.o.ready.eq(self.tx.ready)]
            with m.If(ltx.o.valid & self.tx.ready):
                m.d.sync += in_data.eq(~ltx.o.payload.last)
        m.d.comb += self.tx_beat.eq(self.tx.valid & self.tx.ready)

        # -- receive: a frame whose first beat is its last is a control frame -------------------
        m.submodules.rcrc = rcrc = CRC(D).create()
        first = Signal(init=1)
        ctl_check = Signal()
        rheld = Signal(Trailer)
        beat = self.rx.payload
        is_ctl = first & beat.last
        m.d.comb += self.rx_beat.eq(self.rx.valid & self.rx.ready)
        with m.If(is_ctl):
            m.d.comb += self.rx.ready.eq(~ctl_check)
            with m.If(self.rx.valid & ~ctl_check):
                z = Signal(Trailer)
                m.d.comb += [z.eq(beat.data[0:128]), z.crc.eq(0)]
                m.d.comb += [rcrc.valid.eq(1), rcrc.start.eq(1),
                             rcrc.data.eq(Cat(z.as_value(), beat.data[128:D]))]
                m.d.sync += [rheld.eq(beat.data[0:128]), ctl_check.eq(1)]
        with m.Else():
            m.d.comb += [lrx.i.valid.eq(self.rx.valid), lrx.i.payload.eq(beat),
                         self.rx.ready.eq(lrx.i.ready)]
        with m.If(self.rx.valid & self.rx.ready):
            m.d.sync += first.eq(beat.last)
        with m.If(ctl_check):
            m.d.sync += ctl_check.eq(0)
            ok = rcrc.crc == rheld.crc
            m.d.comb += [ltx.ack_valid.eq(ok & (rheld.kind == KIND_ACK)),
                         ltx.nak_valid.eq(ok & (rheld.kind == KIND_NAK)),
                         ltx.ack_seq.eq(rheld.ack), ltx.ack_credit.eq(rheld.credit),
                         ltx.nak_seq.eq(rheld.ack)]
            with m.If(~ok):
                m.d.comb += self.crc_error.eq(1)
        return m
