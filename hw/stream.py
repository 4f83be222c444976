"""Stream utilities shared by the core and the link ports, and the one request/reply protocol
of every memory-like read port (the vector scratchpad's, the collective engine's, HBM beats).
"""

from amaranth.hdl import Module, Signal
from amaranth.lib import stream, wiring
from amaranth.lib.wiring import In, Out

__all__ = ["SkidBuffer", "ReadPort"]


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
