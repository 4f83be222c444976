"""The weight FIFO (hw/core/card.py): weight tiles between the read DMA and the matrix unit,
built for the board.

A tile is one stripe, a beat of every HBM channel. The FIFO is ``channels`` FIFOs of one
channel's beats each, in lockstep (the same writes, the same pops), so that nothing in it is
wider than a channel and each can sit beside its memory:

- the storage, ``depth`` beats of ``data_bits``, has no initial contents and a read latency of
  two cycles (the RAM's read and its output register: what a URAM288 cascade does at speed);
- a read is issued ahead, while there is room for its beat in a queue of ``QUEUE`` beats
  after the output register, so that the head of the queue is ready before it is popped;
- ``pop`` is registered, one copy in every channel (``take``), and the consumer's tile
  register takes each channel's head beat under that channel's copy the cycle after the pop:
  the consumer's decision fans out to a flip-flop per channel, not to the whole tile or the
  memories' read enables.

Read it as: tiles pushed through ``w``; ``avail`` says a tile may be popped this cycle (no
earlier pop has claimed it); a pop in cycle s shows the tile in ``head`` with ``take`` in
s + 1, so a tile register loaded then holds it from s + 2 (``POP_TO_TILE``).
"""

from amaranth.hdl import Module, Signal
from amaranth.lib import stream, wiring
from amaranth.lib.fifo import SyncFIFO
from amaranth.lib.memory import Memory
from amaranth.lib.wiring import In, Out

__all__ = ["WeightRead", "ChannelFifo", "WeightFifo", "QUEUE", "POP_TO_TILE"]

QUEUE = 4           # beats read ahead (in flight or queued): a place serves a beat 4 cycles
POP_TO_TILE = 2     # a pop in cycle s: the tile in the consumer's register from cycle s + 2


class WeightRead(wiring.Signature):
    """The consumer's side of :class:`WeightFifo`: ``pop`` (out) while ``avail``; ``head``
    and the per-channel registered pops ``take`` (in) the cycle after."""

    def __init__(self, channels, data_bits):
        self.channels, self.data_bits = channels, data_bits
        super().__init__({"pop": Out(1), "avail": In(1), "head": In(channels * data_bits),
                          "take": In(channels)})


class ChannelFifo(wiring.Component):
    """One channel's part of :class:`WeightFifo`.

    Parameters
    ----------
    data_bits : int
    depth : int
        A power of two (the pointers wrap).

    Members
    -------
    w_data : ``In(data_bits)``; w_en : ``In(1)``
        A beat written (the caller checked ``w_rdy``).
    w_rdy : ``Out(1)``
        The storage has room for a beat.
    pop : ``In(1)``
        The head beat is taken (registered here: it leaves the queue next cycle).
    count : ``Out(range(QUEUE + 1))``
        Beats in the queue (registered), the one being popped included.
    pending : ``Out(1)``
        The registered pop: the head beat leaves the queue this cycle (the consumer's tile
        register takes ``head`` now).
    head : ``Out(data_bits)``
        The queue's head beat (while ``count`` > 0).
    level : ``Out(range(depth + QUEUE + 3))``
        Beats held: stored, in flight and queued.
    """

    def __init__(self, *, data_bits, depth):
        if depth < 2 or depth & (depth - 1):
            raise ValueError(f"depth must be a power of two >= 2, not {depth!r}")
        self._bits, self._depth = data_bits, depth
        super().__init__({
            "w_data": In(data_bits), "w_en": In(1), "w_rdy": Out(1),
            "pop": In(1), "count": Out(range(QUEUE + 1)), "pending": Out(1),
            "head": Out(data_bits), "level": Out(range(depth + QUEUE + 3)),
        })

    def elaborate(self, platform):
        m = Module()
        D = self._depth
        abits = max(1, (D - 1).bit_length())
        m.submodules.mem = mem = Memory(shape=self._bits, depth=D, init=[])
        wp = mem.write_port()
        rp = mem.read_port(transparent_for=())
        m.submodules.queue = q = SyncFIFO(width=self._bits, depth=QUEUE)

        stored = Signal(range(D + 1))       # written and not read yet
        wptr, rptr = Signal(abits), Signal(abits)
        m.d.comb += [self.w_rdy.eq(stored < D),
                     wp.addr.eq(wptr), wp.data.eq(self.w_data), wp.en.eq(self.w_en)]
        with m.If(self.w_en):
            m.d.sync += wptr.eq(wptr + 1)

        # Reads ahead: while a beat is stored and the queue has room for it and the ones in
        # flight (the beat leaving this cycle's place counted free). A read issued in cycle r:
        # RAM data in r + 1, output register in r + 2, into the queue then, poppable from
        # r + 3 and gone in r + 4: QUEUE = 4 places keep one pop a cycle.
        inflight = Signal(range(3))
        rd = Signal()
        m.d.comb += rd.eq((stored != 0) & (q.level + inflight - self.pending < QUEUE))
        m.d.comb += [rp.addr.eq(rptr), rp.en.eq(1)]
        with m.If(rd):
            m.d.sync += rptr.eq(rptr + 1)
        m.d.sync += stored.eq(stored + self.w_en - rd)
        v1, v2 = Signal(), Signal()
        oreg = Signal(self._bits, reset_less=True)
        m.d.sync += [v1.eq(rd), v2.eq(v1), oreg.eq(rp.data)]
        m.d.sync += inflight.eq(inflight + rd - v2)
        m.d.comb += [q.w_data.eq(oreg), q.w_en.eq(v2)]

        # The pop, registered: the head leaves the cycle after.
        m.d.sync += self.pending.eq(self.pop)
        m.d.comb += [q.r_en.eq(self.pending), self.head.eq(q.r_data), self.count.eq(q.level),
                     self.level.eq(stored + inflight + q.level)]
        return m


class WeightFifo(wiring.Component):
    """``channels`` :class:`ChannelFifo` in lockstep: tiles in as whole stripes, out a
    channel's beat at a time, each with its own registered pop.

    Parameters
    ----------
    channels, data_bits, depth : int

    Members
    -------
    w : ``In(stream.Signature(channels * data_bits))``
        Tiles from the read DMA.
    r : ``In(WeightRead(channels, data_bits))``
        ``r.pop``: take a tile (only while ``r.avail``: a tile is queued that no pop has
        claimed yet). ``r.head``: the queued head tile, channel k's beat in bits
        ``[k data_bits, (k + 1) data_bits)``. ``r.take[k]``: channel k's registered pop, its
        beat of ``head`` is the popped tile's this cycle (the cycle after ``pop``), for the
        consumer's tile register to take.
    pops : ``Out(1)``
        A tile leaves (channel 0's registered pop).
    level : ``Out(range(depth + QUEUE + 3))``
        Tiles held.
    """

    def __init__(self, *, channels, data_bits, depth):
        self._channels, self._bits, self._depth = channels, data_bits, depth
        super().__init__({
            "w": In(stream.Signature(channels * data_bits)),
            "r": In(WeightRead(channels, data_bits)), "pops": Out(1),
            "level": Out(range(depth + QUEUE + 3)),
        })

    def elaborate(self, platform):
        m = Module()
        B = self._bits
        chans = []
        for k in range(self._channels):
            m.submodules[f"ch{k}"] = ch = ChannelFifo(data_bits=B, depth=self._depth)
            chans.append(ch)
            m.d.comb += [ch.w_data.eq(self.w.payload[B * k:B * (k + 1)]),
                         ch.w_en.eq(self.w.valid & self.w.ready), ch.pop.eq(self.r.pop),
                         self.r.head[B * k:B * (k + 1)].eq(ch.head), self.r.take[k].eq(ch.pending)]
        # Every channel holds the same beats: channel 0 speaks for all.
        c0 = chans[0]
        m.d.comb += [self.w.ready.eq(c0.w_rdy), self.level.eq(c0.level), self.pops.eq(c0.pending),
                     self.r.avail.eq(c0.count > c0.pending)]
        return m
