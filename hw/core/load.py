"""The read DMA's parts (hw/core/dma.py's DmaRead): a run of stripe rows handed to every
channel's reader, the channels' beats joined into stripes, and a LOAD's stripes written to
the VSP.
"""

from amaranth.hdl import Cat, Module, Mux, Signal
from amaranth.lib import data, stream, wiring
from amaranth.lib.fifo import SyncFIFO
from amaranth.lib.wiring import In, Out

from hw.arith.units import fp16_to_fp32_comb
from hw.dma.reader import ReadCommand
from hw.isa import ADDR_BITS

from .cmds import DmaReadCmd
from .vsp import WritePort

__all__ = ["Run", "LoadCmd", "Stripe", "RunFanout", "StripeJoin", "LoadWriter"]

# A run of stripe rows, as every channel's reader is given it.
Run = data.StructLayout({"row": DmaReadCmd["row"].shape, "count": DmaReadCmd["count"].shape})
# What the LOAD writer needs of a LOAD.
LoadCmd = data.StructLayout({f: DmaReadCmd[f].shape for f in ("vsp", "n", "f32")})


def Stripe(bits):
    """A stripe (one beat of every channel): its bits, the last of its run, a beat's error."""
    return data.StructLayout({"data": bits, "last": 1, "err": 1})


class RunFanout(wiring.Component):
    """The same run of beats to every channel's reader, runs queued ahead.

    A run is held until every reader has taken it; each reader takes it when its command port
    is free, independently of the others.

    Parameters
    ----------
    channels : int
    depth : int
        Runs queued (a ``SyncFIFO``).
    beat_addr_bits, len_bits : int
        The readers' command layout (``hw.dma.reader.ReadCommand``).

    Members
    -------
    i : ``In(stream.Signature(Run))``
        Runs (stripe row, stripe rows); ``ready`` is the queue's room.
    o : ``Out(stream.Signature(ReadCommand)).array(channels)``
        The readers' commands: the run at the head of the queue, to each reader once.
    pending : ``Out(1)``
        A run is queued.

    Timing: a run is offered to the readers the cycle after it enters the queue; the queue
    moves on in the cycle its last reader takes it.
    """

    def __init__(self, *, channels, depth, beat_addr_bits, len_bits):
        self._channels, self._depth = channels, depth
        super().__init__({
            "i": In(stream.Signature(Run)),
            "o": Out(stream.Signature(ReadCommand(beat_addr_bits, len_bits))).array(channels),
            "pending": Out(1),
        })

    def elaborate(self, platform):
        m = Module()
        m.submodules.runs = runs = SyncFIFO(width=Run.size, depth=self._depth)
        wiring.connect(m, wiring.flipped(self.i), runs.w_stream)
        head = Run(runs.r_data)
        sent = Signal(self._channels)            # readers that have taken the head run
        all_sent = Cat(*[sent[k] | o.ready for k, o in enumerate(self.o)]).all()
        for k, o in enumerate(self.o):
            m.d.comb += [o.valid.eq(runs.r_rdy & ~sent[k]),
                         o.payload.addr.eq(head.row), o.payload.beats.eq(head.count)]
        with m.If(runs.r_rdy & all_sent):
            m.d.comb += runs.r_en.eq(1)
            m.d.sync += sent.eq(0)
        with m.Else():
            for k, o in enumerate(self.o):
                with m.If(o.valid & o.ready):
                    m.d.sync += sent[k].eq(1)
        m.d.comb += self.pending.eq(runs.r_rdy)
        return m


class StripeJoin(wiring.Component):
    """The channels' beats joined into stripes: channel k's beat is bits
    ``[k * data_bits, (k + 1) * data_bits)`` of the stripe.

    Parameters
    ----------
    channels, data_bits : int

    Members
    -------
    i : ``In(stream.Signature(reader beat)).array(channels)``
        The readers' beats (``hw.dma.reader.AxiBurstReader.data``).
    o : ``Out(stream.Signature(Stripe(channels * data_bits)))``
        Valid when every channel has a beat; ``last`` is channel 0's, ``err`` is set when a
        beat has an error or the channels' ``last`` flags disagree (all were given the same
        runs).

    Combinational: no register, every beat taken in the cycle its stripe is.
    """

    def __init__(self, *, channels, data_bits):
        beat = data.StructLayout({"data": data_bits, "last": 1, "err": 1})
        super().__init__({
            "i": In(stream.Signature(beat)).array(channels),
            "o": Out(stream.Signature(Stripe(channels * data_bits))),
        })

    def elaborate(self, platform):
        m = Module()
        lasts = Cat(*[i.payload.last for i in self.i])
        m.d.comb += [
            self.o.valid.eq(Cat(*[i.valid for i in self.i]).all()),
            self.o.payload.data.eq(Cat(*[i.payload.data for i in self.i])),
            self.o.payload.last.eq(self.i[0].payload.last),
            self.o.payload.err.eq(Cat(*[i.payload.err for i in self.i]).any()
                                  | (lasts.any() & ~lasts.all())),
        ]
        for i in self.i:
            m.d.comb += i.ready.eq(self.o.valid & self.o.ready)
        return m


class LoadWriter(wiring.Component):
    """A LOAD's stripes into the VSP, ``lanes`` elements per cycle.

    A stripe is held and written out in rows of ``lanes`` elements (fp16 converted to fp32, or
    fp32 words as they are with ``f32``), the elements past the LOAD's ``n`` masked off.

    Parameters
    ----------
    stripe_bits : int
    lanes : int
        Words per VSP row.
    row_bits : int
        VSP row address bits.

    Members
    -------
    cmd : ``In(stream.Signature(LoadCmd))``
        The LOAD at the head of the read DMA's queue; taken (``ready``, a pulse) as its last
        stripe is written: that is the LOAD's completion.
    i : ``In(stream.Signature(Stripe))``
        The LOAD's stripes (``err`` is not used here); taken when none is held.
    w : ``Out(WritePort)``
        VSP writes, one row per cycle while granted.

    Timing: a stripe taken in cycle t is written from cycle t + 1 on (``held`` register); the
    next stripe is taken in the cycle after the last row of this one.
    """

    def __init__(self, *, stripe_bits, lanes, row_bits):
        self._stripe_bits, self._lanes = stripe_bits, lanes
        super().__init__({
            "cmd": In(stream.Signature(LoadCmd)),
            "i": In(stream.Signature(Stripe(stripe_bits))),
            "w": Out(WritePort(row_bits, lanes)),
        })

    def elaborate(self, platform):
        m = Module()
        P = self._lanes
        pshift = (P - 1).bit_length()
        elems = self._stripe_bits // 16          # fp16 elements per stripe
        cmd = self.cmd.payload
        held = Signal(self._stripe_bits, reset_less=True)
        held_valid = Signal()
        held_last = Signal()
        pos = Signal(range(elems // P + 1))      # write beat within the stripe
        done_elems = Signal(ADDR_BITS + 1)                  # elements of this LOAD consumed so far
        m.d.comb += self.i.ready.eq(~held_valid)
        with m.If(self.i.valid & self.i.ready):
            m.d.sync += [held.eq(self.i.payload.data), held_valid.eq(1),
                         held_last.eq(self.i.payload.last), pos.eq(0)]

        # Elements [e0, e0 + P) of the LOAD: row pos of the held stripe.
        e0 = done_elems + (pos << pshift)
        words = []
        for j in range(P):
            h = Signal(16, name=f"ld_h{j}")
            m.d.comb += h.eq(_lane(held, 16, j, P, pos))
            words.append(Mux(cmd.f32, _lane(held, 32, j, P, pos),
                             fp16_to_fp32_comb(m, h, f"ld{j}")))
        mask = Signal(P)
        for j in range(P):
            m.d.comb += mask[j].eq(e0 + j < cmd.n)
        in_range = e0 < cmd.n
        m.d.comb += [self.w.req.valid.eq(held_valid & in_range & self.cmd.valid),
                     self.w.req.payload.row.eq((cmd.vsp >> pshift) + (e0 >> pshift)),
                     self.w.req.payload.mask.eq(mask),
                     self.w.req.payload.data.eq(Cat(*words))]

        beats_per_stripe = Mux(cmd.f32, elems // (2 * P), elems // P)
        stripe_elems = Mux(cmd.f32, elems // 2, elems)
        beat_done = held_valid & (~in_range | (self.w.req.valid & self.w.req.ready))
        with m.If(beat_done):
            with m.If((pos == beats_per_stripe - 1) | ~in_range):
                m.d.sync += [held_valid.eq(0), done_elems.eq(done_elems + stripe_elems)]
                with m.If(held_last):
                    m.d.sync += done_elems.eq(0)
                    m.d.comb += self.cmd.ready.eq(1)
            with m.Else():
                m.d.sync += pos.eq(pos + 1)
        return m




def _lane(row, bits, j, lanes, pos):
    """Lane ``j`` of VSP row ``pos`` of a stripe's ``bits``-bit words, ``lanes`` to a row (the
    stripe's first word where ``pos`` is past its rows)."""
    sel = row[0:bits]
    for q in range(len(row) // (bits * lanes)):
        sel = Mux(pos == q, row[bits * (q * lanes + j):bits * (q * lanes + j + 1)], sel)
    return sel
