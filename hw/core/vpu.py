"""The vector unit: fp32 operations on VSP vectors, ``P`` elements per cycle.

One instruction at a time. An instruction is one or more *passes*; a pass reads rows of ``P``
words (operand a, and operand b unless it is broadcast, absent or the identity), pushes them
through the lanes' units at one row per cycle, and writes the results in order. Elementwise
operations are one pass from the VSP to the VSP (or to XB for CVT16); with x16 each result row
also goes through a row of fp16 converters to XB, their latency after its VSP write. Reductions are row
halving passes (VSP to an internal scratch, then scratch to scratch) followed by lane folds,
exactly as docs/isa.md defines them.

The units have no enable, so the result writes cannot wait: the VPU's write port has the
highest priority on the VSP. Reads go through the VSP arbiter and may wait; they fill small
FIFOs ahead of the lanes.

The parts: the sequencer (hw/core/vpu_seq.py) plans the passes; the operand fetch and the
lane feed (hw/core/vpu_operands.py) bring the rows; the lanes (hw/core/vpu_lanes.py) compute;
the write-back (hw/core/vpu_writeback.py) puts the results away.
"""

from amaranth.hdl import Module, Mux
from amaranth.lib import stream, wiring
from amaranth.lib.memory import Memory
from amaranth.lib.wiring import In, Out

from .cmds import VecCmd
from .vpu_lanes import VpuLanes
from .vpu_operands import LaneFeed, OperandFetch
from .vpu_seq import VpuSequencer
from .vpu_writeback import VpuWriteback, XbWrite
from .vsp import ReadPort, WritePort

__all__ = ["Vpu", "XbWrite"]


class Vpu(wiring.Component):
    """Vector unit.

    Parameters
    ----------
    lanes : int
        fp32 elements per cycle (the VSP's words per row).
    vsp_rows : int
    xb_words, width : int
        XB's fp16 words, and its words per row.
    red_max : int
        The longest reduction (the scratch holds half its rows).
    special_share : int
        Lanes per special-function unit (EXP, RECIP, RSQRT, GELU): a row of those takes that
        many cycles (``VpuLanes``).

    Members
    -------
    cmd : ``In(stream.Signature(VecCmd))``  (only legal, checked instructions arrive here)
    done : ``Out(1)``  pulse as an instruction's last result is written
    busy : ``Out(1)``
    r_a, r_b : ``Out(ReadPort)``  VSP reads (operand a, operand b)
    w : ``Out(WritePort)``  VSP writes (must be granted at once)
    xb : ``Out(XbWrite)``
    """

    def __init__(self, *, lanes, vsp_rows, xb_words, width, red_max, special_share=1):
        self.P, self.S = lanes, special_share
        self.row_bits = (vsp_rows - 1).bit_length()
        self.W = width
        self.xb_row_bits = max(1, (xb_words // width - 1).bit_length())
        red_rows = -(-red_max // lanes)
        self.scratch_rows = max(1, -(-red_rows // 2))
        super().__init__({
            "cmd": In(stream.Signature(VecCmd)),
            "done": Out(1),
            "busy": Out(1),
            "r_a": Out(ReadPort(self.row_bits, lanes)),
            "r_b": Out(ReadPort(self.row_bits, lanes)),
            "w": Out(WritePort(self.row_bits, lanes)),
            "xb": Out(XbWrite(self.xb_row_bits, width)),
        })

    def elaborate(self, platform):
        m = Module()
        P, rb, sr = self.P, self.row_bits, self.scratch_rows
        m.submodules.seq = seq = VpuSequencer(lanes=P, row_bits=rb)
        m.submodules.fetch = fetch = OperandFetch(lanes=P, row_bits=rb, scratch_rows=sr)
        m.submodules.feed = feed = LaneFeed(lanes=P, row_bits=rb, share=self.S)
        m.submodules.lanes = lanes = VpuLanes(lanes=P, share=self.S)
        m.submodules.wb = wb = VpuWriteback(lanes=P, row_bits=rb, width=self.W,
                                            xb_row_bits=self.xb_row_bits, scratch_rows=sr)
        m.submodules.scratch = scratch = Memory(shape=32 * P, depth=sr, init=[])

        # The instruction, and its passes to every part.
        wiring.connect(m, wiring.flipped(self.cmd), seq.cmd)
        m.d.comb += [self.done.eq(seq.done), self.busy.eq(seq.busy)]
        for part in (fetch, feed, wb):
            m.d.comb += [part.pas.eq(seq.pas), part.start.eq(seq.start)]
        m.d.comb += [fetch.running.eq(seq.running), fetch.is_red.eq(seq.is_red),
                     feed.running.eq(seq.running), feed.is_red.eq(seq.is_red),
                     feed.vec.eq(seq.vec), feed.bval.eq(seq.bval), wb.vec.eq(seq.vec)]

        # Operands: VSP or scratch rows, into the lanes. Operand b's VSP port also reads the
        # broadcast word, before its pass.
        wiring.connect(m, fetch.r_a, wiring.flipped(self.r_a))
        _share(m, self.r_b, seq.bc, fetch.r_b)
        wiring.connect(m, fetch.s_a, scratch.read_port(transparent_for=()))
        wiring.connect(m, fetch.s_b, scratch.read_port(transparent_for=()))
        wiring.connect(m, fetch.a, feed.a)
        wiring.connect(m, fetch.b, feed.b)
        m.d.comb += [lanes.feed.eq(feed.feed), lanes.phase.eq(feed.phase),
                     lanes.utype.eq(seq.utype), lanes.a.eq(feed.oa),
                     lanes.b.eq(feed.ob), lanes.masked.eq(feed.masked)]

        # Results.
        m.d.comb += [wb.valid.eq(lanes.valid), wb.res.eq(lanes.o), seq.drained.eq(wb.drained)]
        # (The write port's ready is not looked at: the VSP grants it first.)
        m.d.comb += [self.w.req.valid.eq(wb.w.req.valid), self.w.req.payload.eq(wb.w.req.payload)]
        wiring.connect(m, wb.xb, wiring.flipped(self.xb))
        wiring.connect(m, wb.s_w, scratch.write_port())
        return m


def _share(m, port, first, second):
    """VSP read ``port`` used by two requesters, ``first`` whenever it asks; both see every
    reply (each takes only those it waits for)."""
    m.d.comb += [
        port.req.valid.eq(Mux(first.req.valid, 1, second.req.valid)),
        port.req.payload.eq(Mux(first.req.valid, first.req.payload, second.req.payload)),
        first.req.ready.eq(port.req.ready), second.req.ready.eq(port.req.ready),
    ]
    for p in (first, second):
        m.d.comb += [p.resp.valid.eq(port.resp.valid), p.resp.payload.eq(port.resp.payload)]
