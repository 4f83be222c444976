"""Round-robin arbitration, the one arbiter of the design: the AXI multiplexers that share an
HBM channel (hw/dma/mux.py) and the collective unit's shared ports (hw/core/coll.py) use it.
"""

from amaranth.hdl import Cat, Module, Signal
from amaranth.lib import stream, wiring
from amaranth.lib.wiring import In, Out

__all__ = ["RoundRobin", "StreamArbiter"]


class RoundRobin(wiring.Component):
    """Round-robin choice among ``count`` requesters.

    Parameters
    ----------
    count : int
        Requesters (at least 1).

    Members
    -------
    requests : ``In(count)``
        One bit per requester.
    grant : ``Out(range(count))``
        The first requester after the one last served, cyclically in index order, whose
        request is high; the last served when no request is.
    advance : ``In(1)``
        ``grant`` is served this cycle: it becomes the last served.

    Timing: ``grant`` is combinational from ``requests`` and one register, the last served
    (initially requester 0, so requester 1 comes first), which ``advance`` loads.
    """

    def __init__(self, *, count):
        if not isinstance(count, int) or count < 1:
            raise ValueError(f"count: got {count!r}; allowed: a positive integer")
        self._count = count
        super().__init__({"requests": In(count), "grant": Out(range(count)), "advance": In(1)})

    def elaborate(self, platform):
        m = Module()
        M = self._count
        last = Signal(range(M))
        m.d.comb += self.grant.eq(last)
        with m.Switch(last):
            for lst in range(M):
                with m.Case(lst):
                    # the later assignment wins: the requester right after `last` last
                    for q in reversed([(lst + 1 + o) % M for o in range(M)]):
                        with m.If(self.requests[q]):
                            m.d.comb += self.grant.eq(q)
        with m.If(self.advance):
            m.d.sync += last.eq(self.grant)
        return m


class StreamArbiter(wiring.Component):
    """``count`` streams into one, round-robin per transfer.

    Parameters
    ----------
    shape : ShapeLike
        Payload shape.
    count : int
        Input streams.

    Members
    -------
    i : ``In(stream.Signature(shape)).array(count)``
        The inputs; the granted one's ``ready`` is high in the cycle its payload goes.
    o : ``Out(stream.Signature(shape))``
        ``valid`` when any input is; the granted input's payload.
    grant : ``Out(range(count))``
        The input presented on ``o`` (the round-robin choice among the valid ones).

    Timing: combinational from inputs to output (no register but the arbiter's last served,
    which each transfer on ``o`` updates).
    """

    def __init__(self, shape, *, count):
        self._count = count
        super().__init__({"i": In(stream.Signature(shape)).array(count),
                          "o": Out(stream.Signature(shape)), "grant": Out(range(count))})

    def elaborate(self, platform):
        m = Module()
        m.submodules.rr = rr = RoundRobin(count=self._count)
        go = self.o.valid & self.o.ready
        m.d.comb += [rr.requests.eq(Cat(*[i.valid for i in self.i])), rr.advance.eq(go),
                     self.grant.eq(rr.grant), self.o.valid.eq(rr.requests.any())]
        for q, i in enumerate(self.i):
            with m.If(rr.grant == q):
                m.d.comb += [self.o.payload.eq(i.payload), i.ready.eq(go)]
        return m
