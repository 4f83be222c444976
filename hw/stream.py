"""Stream utilities shared by the core and the link ports, and the one request/reply protocol
of every memory-like read port (the vector scratchpad's, the collective engine's, HBM beats).
"""

from amaranth.hdl import Module, Signal
from amaranth.lib import stream, wiring
from amaranth.lib.fifo import SyncFIFOBuffered
from amaranth.lib.wiring import In, Out

__all__ = ["SkidBuffer", "ReadPort", "ReadAhead"]


class ReadPort(wiring.Signature):
    """A requester's view of a read port: requests out, replies in.

    ``req`` is a valid/ready stream of requests (``request`` shape). ``resp`` carries the
    replies in request order, each request answered by the number of replies its port
    defines (one, or a run's beats); the requester always takes them (``always_ready``), so it
    asks only for what it has room for.

    Parameters
    ----------
    request, reply : ShapeLike
        The request's and the reply's payload shapes.
    """

    def __init__(self, request, reply):
        self.request, self.reply = request, reply
        super().__init__({
            "req": Out(stream.Signature(request)),
            "resp": In(stream.Signature(reply, always_ready=True)),
        })


class SkidBuffer(wiring.Component):
    """Register slice for a valid/ready stream, full throughput, all outputs registered.

    Cuts the combinational paths in both directions (``o.valid``/``o.payload`` and ``i.ready``
    all come from flops), at one cycle of latency, so that a stream can cross a long route at
    300 MHz. Two entries: the output register and a skid register that catches the beat
    accepted in the cycle the consumer stalls.

    Parameters
    ----------
    shape : ShapeLike
        Payload shape.

    Members
    -------
    i : ``In(stream.Signature(shape))``
    o : ``Out(stream.Signature(shape))``
    """

    def __init__(self, shape):
        self._shape = shape
        super().__init__({"i": In(stream.Signature(shape)), "o": Out(stream.Signature(shape))})

    def elaborate(self, platform):
        m = Module()
        held = Signal.like(self.i.payload, name="held")
        skid_full = Signal()

        # i.ready is registered: it is "the skid register is empty".
        m.d.comb += self.i.ready.eq(~skid_full)
        with m.If(self.o.ready | ~self.o.valid):
            # Output register is free this cycle: fill it from the skid, else from the input.
            with m.If(skid_full):
                m.d.sync += [self.o.payload.eq(held), self.o.valid.eq(1), skid_full.eq(0)]
            with m.Else():
                m.d.sync += [self.o.payload.eq(self.i.payload), self.o.valid.eq(self.i.valid)]
        with m.Elif(self.i.valid & ~skid_full):
            # Output stalled while a beat arrives: park it in the skid register.
            m.d.sync += [held.eq(self.i.payload), skid_full.eq(1)]
        return m


class ReadAhead(wiring.Component):
    """A FIFO that a unit reads rows into ahead of use, with a credit for the read in flight.

    The owner issues at most one read per cycle, each answered one cycle later (the VSP's
    ports, the scratch's); ``room`` says another read may go out: the FIFO's entries plus the
    read in flight are below ``limit``, so that every answer finds a free entry
    (``depth - limit`` spare). The store engine's VSP rows and the vector unit's two operands
    are read this way.

    Parameters
    ----------
    width : int
        Bits of a row.
    depth : int
        FIFO entries.
    limit : int
        Entries plus the read in flight below which ``room`` is set.

    Members
    -------
    inflight : ``In(1)``
        A read went out last cycle (the owner's register): its answer is due now.
    room : ``Out(1)``
        Another read may be issued (combinational on ``inflight`` and the FIFO's level).
    w : ``In(stream.Signature(width, always_ready=True))``
        The answers, pushed into the FIFO.
    o : ``Out(stream.Signature(width))``
        The FIFO's output (``SyncFIFOBuffered``: one cycle from ``w`` to ``o``, at the least).
    empty : ``Out(1)``
        Nothing in the FIFO.
    """

    def __init__(self, *, width, depth=8, limit=6):
        if not 0 < limit < depth:
            raise ValueError(f"limit must be in (0, depth = {depth}), not {limit!r}")
        self._width, self._depth, self._limit = width, depth, limit
        super().__init__({
            "inflight": In(1), "room": Out(1),
            "w": In(stream.Signature(width, always_ready=True)),
            "o": Out(stream.Signature(width)),
            "empty": Out(1),
        })

    def elaborate(self, platform):
        m = Module()
        m.submodules.fifo = fifo = SyncFIFOBuffered(width=self._width, depth=self._depth)
        m.d.comb += [self.room.eq((fifo.level + self.inflight) < self._limit),
                     self.empty.eq(fifo.level == 0),
                     fifo.w_en.eq(self.w.valid), fifo.w_data.eq(self.w.payload)]
        wiring.connect(m, fifo.r_stream, wiring.flipped(self.o))
        return m
