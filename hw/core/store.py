"""The store engine's parts (hw/core/dma.py's DmaWrite): the element walk that places each
element of a STORE (its address generator, through one fp32 -> fp16 converter), the packer
that merges consecutive elements into strobed channel beats, and the AXI writer that sends the
beats as single-beat writes and counts their responses.
"""

from amaranth.hdl import Cat, Const, Module, Mux, Signal
from amaranth.lib import data, stream, wiring
from amaranth.lib.wiring import In, Out

from hw.arith.pipe import delay
from hw.arith.units import Fp32ToFp16
from hw.axi import Axi4WriteSignature, Burst

from .cmds import StoreCmd
from .vsp import word_select

__all__ = ["Elem", "Beat", "StoreWalk", "BeatPacker", "BeatWriter"]

ROW_BITS = StoreCmd["row"].width                  # stripe row
BYTE_BITS = 16                                     # byte in the stripe (off + strides)
CH_BITS = 8                                        # channel of a beat

# What the walk places at once: one element (``rows`` 0), or with ``rows`` a VSP row's first
# elements, contiguous from ``byte`` (row mode, ``hw.isa.store_row_mode``). Its stripe row
# and byte, the fp32 words of the row (``data``) and their fp16 roundings (``half``), the
# element's lane, and the strobe of its bytes in their channel beat.
def Elem(lanes, beat_bytes):
    return data.StructLayout({"last": 1, "row": ROW_BITS, "byte": BYTE_BITS, "rows": 1,
                              "lane": range(lanes), "strb": beat_bytes,
                              "data": 32 * lanes, "half": 16 * lanes})


def Beat(beat_bytes):
    """One channel beat to write: channel, stripe row, data and byte strobes."""
    return data.StructLayout({"ch": CH_BITS, "row": ROW_BITS, "data": 8 * beat_bytes,
                              "strb": beat_bytes})


class StoreWalk(wiring.Component):
    """A STORE's elements, each with the stripe row and byte it goes to: an element a cycle,
    or a VSP row a cycle where its pattern allows (``hw.isa.store_row_mode``: whole rows to a
    group, each row's bytes inside one channel beat; the linear vectors, the K cache's rows
    and the V cache's columns of the compiler's programs).

    Walks the STORE's pattern (docs/isa.md): element i is place ``i % epg`` of group
    ``i / epg``, groups ``gstride`` bytes apart, ``2^lgpr`` groups to a row, rows ``rstride``
    stripe rows apart. Every lane of a row goes through its own fp32 -> fp16 converter; the
    place rides beside them.

    Parameters
    ----------
    lanes : int
        Words per VSP row.
    beat_bytes : int
        Bytes of a channel beat.

    Members
    -------
    cmd : ``In(StoreCmd)``
        The STORE in progress (held by the store engine).
    start : ``In(stream.Signature(StoreCmd, always_ready=True))``
        A STORE begins: element 0, at its first row and offset (row mode decided here).
    active : ``In(1)``
        A STORE is in progress.
    rows : ``In(stream.Signature(32 * lanes))``
        The STORE's VSP rows in order; a row is taken after its last element (the rest of a
        partial last row is dropped).
    queued : ``In(4)``
        Beats waiting for the AXI writer: an element (a row) is launched while they and the
        launches in the converters are fewer than 5 (the beat FIFO's room; a launch makes
        at most one beat).
    o : ``Out(stream.Signature(Elem(lanes, beat_bytes), always_ready=True))``
        The elements or rows, ``Fp32ToFp16.LATENCY`` (2) cycles after their launch (their
        place in registers beside the converters).
    launch : ``Out(range(lanes + 1))``
        Elements entering the converters this cycle (0, 1, or a row's with row mode).
    idle : ``Out(1)``
        Every element of the STORE launched, none in the converters.

    Timing: one launch per cycle at most; ``launch`` is combinational (rows, credit), the
    place registers move with it; ``o`` is the converters' output beside two registers of
    metadata.
    """

    def __init__(self, *, lanes, beat_bytes):
        self._lanes, self._beat = lanes, beat_bytes
        super().__init__({
            "cmd": In(StoreCmd), "start": In(stream.Signature(StoreCmd, always_ready=True)),
            "active": In(1),
            "rows": In(stream.Signature(32 * lanes)),
            "queued": In(4),
            "o": Out(stream.Signature(Elem(lanes, beat_bytes), always_ready=True)),
            "launch": Out(range(lanes + 1)), "idle": Out(1),
        })

    def elaborate(self, platform):
        m = Module()
        P, cmd = self._lanes, self.cmd
        pl = (P - 1).bit_length()                          # log2 of the lanes
        convs = [Fp32ToFp16() for _ in range(P)]
        for k, conv in enumerate(convs):
            m.submodules[f"conv{k}"] = conv
            m.d.comb += conv.a.eq(self.rows.payload[32 * k:32 * (k + 1)])
        lane = Signal(range(P + 1))
        i = Signal(17)                     # element index
        e = Signal(16)                     # place in the group
        k = Signal(16)                     # group in the row
        row = Signal(ROW_BITS)
        byte = Signal(BYTE_BITS)           # byte in the stripe
        rows = Signal()                    # row mode (the STORE's, from its start)
        zl = Mux(cmd.f32, 2, 1)            # log2 of the element size in bytes
        step = Mux(rows, P, 1)             # elements a launch
        epg_m1 = (Const(1, 17) << cmd.lepg) - 1
        gpr_m1 = (Const(1, 17) << cmd.lgpr) - 1
        in_conv = Signal(range(4))
        go = Signal()
        left = cmd.n - i
        m.d.comb += [go.eq(self.active & (i < cmd.n) & self.rows.valid & ((self.queued + in_conv) < 5)),
                     self.launch.eq(Mux(go, Mux(rows, Mux(left < P, left, P), 1), 0))]
        with m.If(go):
            m.d.sync += i.eq(i + step)
            with m.If(rows | (lane == P - 1)):
                m.d.sync += lane.eq(0)
                m.d.comb += self.rows.ready.eq(1)
            with m.Else():
                m.d.sync += lane.eq(lane + 1)
            with m.If(e == epg_m1 + 1 - step):             # the group's last element (row)
                m.d.sync += e.eq(0)
                with m.If(k == gpr_m1):
                    m.d.sync += [k.eq(0), row.eq(row + cmd.rstride), byte.eq(cmd.off)]
                with m.Else():
                    m.d.sync += [k.eq(k + 1), byte.eq(byte - (e << zl) + cmd.gstride)]
            with m.Else():
                m.d.sync += [e.eq(e + step), byte.eq(byte + (step << zl))]
        # The last lane of a partial final row: drop the rest of the row.
        with m.If(self.active & (i == cmd.n) & self.rows.valid & (lane != 0)):
            m.d.comb += self.rows.ready.eq(1)
            m.d.sync += lane.eq(0)
        with m.If(self.start.valid):
            p = self.start.payload
            # row mode (``hw.isa.store_row_mode``): a row's bytes rb = P z, at most a beat;
            # groups of whole rows; off and gstride multiples of rb
            ok16, ok32 = 2 * P <= self._beat, 4 * P <= self._beat
            rbl = Mux(p.f32, pl + 2, pl + 1)               # log2 of rb
            mask = (Const(1, 13) << rbl) - 1
            m.d.sync += [i.eq(0), lane.eq(0), e.eq(0), k.eq(0), row.eq(p.row), byte.eq(p.off),
                         rows.eq(Mux(p.f32, ok32, ok16) & (p.lepg >= pl)
                                 & ((p.off & mask) == 0) & ((p.gstride & mask) == 0))]

        # The launch's place beside the converters (latency 2).
        meta = data.StructLayout({"last": 1, "row": ROW_BITS, "byte": BYTE_BITS,
                                  "rows": 1, "cnt": range(P + 1), "lane": range(P),
                                  "data": 32 * P})
        m0 = Signal(meta)
        m.d.comb += [m0.last.eq(i + step >= cmd.n), m0.row.eq(row),
                     m0.byte.eq(byte), m0.rows.eq(rows), m0.cnt.eq(self.launch),
                     m0.lane.eq(lane), m0.data.eq(self.rows.payload)]
        assert Fp32ToFp16.LATENCY == 2
        valid = delay(m, go, 2, name="meta_v")
        m1 = delay(m, m0, 1, name="meta1_", reset_less=True)[-1]
        m2 = delay(m, m1, 1, name="meta2_", reset_less=True)[-1]
        # the strobe, from the first register to the second: the launch's bytes (an element's
        # z, a row's count x z) from its byte in the beat
        B = self._beat
        strb = Signal(B, reset_less=True)
        nbytes = m1.cnt << Mux(cmd.f32, 2, 1)
        m.d.sync += strb.eq(((Const(1, B + 1) << nbytes) - 1) << m1.byte[0:(B - 1).bit_length()])
        m.d.sync += in_conv.eq(in_conv + go - valid[-1])
        out = self.o.payload
        m.d.comb += [self.o.valid.eq(valid[-1]), out.last.eq(m2.last), out.row.eq(m2.row),
                     out.byte.eq(m2.byte), out.rows.eq(m2.rows), out.strb.eq(strb),
                     out.lane.eq(m2.lane), out.data.eq(m2.data),
                     out.half.eq(Cat(*[c.o for c in convs])),
                     self.idle.eq((i >= cmd.n) & (in_conv == 0) & ~Cat(*valid).any())]
        return m


class BeatPacker(wiring.Component):
    """Consecutive elements that land in one channel beat merged into one strobed beat.

    Parameters
    ----------
    beat_bytes : int
        Bytes of a channel beat.
    lanes : int
        Words per VSP row.

    Members
    -------
    i : ``In(stream.Signature(Elem(lanes, beat_bytes), always_ready=True))``
        Placed elements or row chunks (fp16 ``half``, or the fp32 ``data`` with ``f32``).
    f32 : ``In(1)``
        The STORE writes fp32 words.
    o : ``Out(stream.Signature(Beat(beat_bytes), always_ready=True))``
        Finished beats (never refused: the walk's credit keeps room for them).
    idle : ``Out(1)``
        No beat being merged, none to flush.

    Timing: a beat goes out in the cycle an element for another beat (or row) arrives, with
    the STORE's last element when it merges, else one cycle after it (registered ``flush``).
    """

    def __init__(self, *, beat_bytes, lanes):
        self._bytes, self._lanes = beat_bytes, lanes
        super().__init__({
            "i": In(stream.Signature(Elem(lanes, beat_bytes), always_ready=True)), "f32": In(1),
            "o": Out(stream.Signature(Beat(beat_bytes), always_ready=True)),
            "idle": Out(1),
        })

    def elaborate(self, platform):
        m = Module()
        B, el = self._bytes, self.i.payload
        bshift = (B - 1).bit_length()
        cur = Signal(Beat(B))
        cur_v = Signal()
        ch = el.byte >> bshift
        same = cur_v & (cur.ch == ch) & (cur.row == el.row)
        new_data = Signal(8 * B)
        new_strb = Signal(B)
        P = self._lanes
        word = word_select(el.data, el.lane, 32, P)
        half = word_select(el.half, el.lane, 16, P)
        # the element (or the row chunk) repeated over the beat; the strobe picks its place
        elem = Mux(self.f32, Cat(*([word] * (B // 4))), Cat(*([half] * (B // 2))))
        row16 = Cat(*([el.half] * max(1, B // (2 * P))))[:8 * B]
        row32 = Cat(*([el.data] * max(1, B // (4 * P))))[:8 * B]
        m.d.comb += [new_data.eq(Mux(el.rows, Mux(self.f32, row32, row16), elem)),
                     new_strb.eq(el.strb)]
        flush = Signal()
        emit = self.o.payload
        with m.If(self.i.valid):
            with m.If(same):
                merged = Signal(8 * B)
                for b in range(B):
                    m.d.comb += merged[8 * b:8 * (b + 1)].eq(
                        Mux(new_strb[b], new_data[8 * b:8 * (b + 1)], cur.data[8 * b:8 * (b + 1)]))
                with m.If(el.last):
                    m.d.comb += [self.o.valid.eq(1), emit.ch.eq(cur.ch), emit.row.eq(cur.row),
                                 emit.data.eq(merged), emit.strb.eq(cur.strb | new_strb)]
                    m.d.sync += cur_v.eq(0)
                with m.Else():
                    m.d.sync += [cur.data.eq(merged), cur.strb.eq(cur.strb | new_strb)]
            with m.Else():
                with m.If(cur_v):
                    m.d.comb += [self.o.valid.eq(1), emit.eq(cur)]
                m.d.sync += [cur_v.eq(1), cur.ch.eq(ch), cur.row.eq(el.row), cur.data.eq(new_data),
                             cur.strb.eq(new_strb)]
        # A last element that started a new beat is emitted the cycle after.
        m.d.sync += flush.eq(self.i.valid & el.last & ~same)
        with m.If(flush & cur_v):
            m.d.comb += [self.o.valid.eq(1), emit.eq(cur)]
            m.d.sync += cur_v.eq(0)
        m.d.comb += self.idle.eq(~cur_v & ~flush)
        return m


class BeatWriter(wiring.Component):
    """Beats as single-beat AXI writes on their channels; responses counted.

    AW and W of a beat go out together on its channel (either may be accepted first); at most
    ``max_outstanding`` writes on each channel await their response.

    Parameters
    ----------
    channels, data_bits, max_outstanding : int

    Members
    -------
    i : ``In(stream.Signature(Beat))``
        The beats; one is taken when both its AW and its W have been accepted.
    axi : ``Out(Axi4WriteSignature(addr_bits=64, data_bits=data_bits)).array(channels)``
    ptr : ``In(64).array(channels)``
        Channel buffer bases (a beat's address is ``ptr + row * beat_bytes``).
    sent : ``Out(1)``
        A beat was taken.
    err : ``Out(1)``
        Sticky until ``clear``: a response other than OKAY, or with an ID never used.
    clear : ``In(1)``
        ``err`` falls (a run starts).
    idle : ``Out(1)``
        No write awaits its response.

    Timing: AW and W are valid combinationally on the FIFO's head (and its channel's room); a
    beat is taken in the cycle its second handshake completes (one beat per cycle at most);
    the per-channel ``outstanding`` counts and the sent flags are registers.
    """

    def __init__(self, *, channels, data_bits, max_outstanding):
        self._channels, self._bytes, self._max_out = channels, data_bits // 8, max_outstanding
        super().__init__({
            "i": In(stream.Signature(Beat(data_bits // 8))),
            "axi": Out(Axi4WriteSignature(addr_bits=64, data_bits=data_bits)).array(channels),
            "ptr": In(64).array(channels),
            "sent": Out(1), "err": Out(1), "idle": Out(1), "clear": In(1),
        })

    def elaborate(self, platform):
        m = Module()
        C, head = self._channels, self.i.payload
        bshift = (self._bytes - 1).bit_length()
        # Writes awaiting their response, per channel: a channel's AXI port never has more
        # than max_outstanding (a total of C x max_outstanding let one channel have them all).
        outstanding = [Signal(range(self._max_out + 1), name=f"outstanding{c}") for c in range(C)]
        aw_sent = Signal()
        w_sent = Signal()
        aw_ok = Signal()
        w_ok = Signal()
        for c, axi in enumerate(self.axi):
            mine = self.i.valid & (head.ch == c)
            room = outstanding[c] < self._max_out
            m.d.comb += [
                axi.awid.eq(0), axi.awlen.eq(0), axi.awsize.eq(bshift), axi.awburst.eq(Burst.INCR),
                axi.awaddr.eq(self.ptr[c] + (head.row << bshift)),
                axi.awvalid.eq(mine & ~aw_sent & room),
                axi.wdata.eq(head.data), axi.wstrb.eq(head.strb), axi.wlast.eq(1),
                axi.wvalid.eq(mine & ~w_sent & room),
                axi.bready.eq(1),
            ]
            with m.If(axi.bvalid & ((axi.bresp != 0) | (axi.bid != 0))):
                m.d.sync += self.err.eq(1)
        with m.If(self.clear):
            m.d.sync += self.err.eq(0)
        for c, axi in enumerate(self.axi):
            with m.If(head.ch == c):
                m.d.comb += [aw_ok.eq(aw_sent | (axi.awvalid & axi.awready)),
                             w_ok.eq(w_sent | (axi.wvalid & axi.wready))]
        with m.If(self.i.valid & aw_ok & w_ok):
            m.d.comb += [self.i.ready.eq(1), self.sent.eq(1)]
            m.d.sync += [aw_sent.eq(0), w_sent.eq(0)]
        with m.Elif(self.i.valid):
            m.d.sync += [aw_sent.eq(aw_ok), w_sent.eq(w_ok)]
        for c, axi in enumerate(self.axi):
            m.d.sync += outstanding[c].eq(outstanding[c] + (self.sent & (head.ch == c)) - axi.bvalid)
        m.d.comb += self.idle.eq(Cat(*[(n == 0) & ~axi.bvalid
                                       for n, axi in zip(outstanding, self.axi, strict=True)]).all())
        return m
