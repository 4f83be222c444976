"""The matrix unit: ``lanes`` block floating-point dot products of ``width`` fp16 pairs
(hw/arith/dot.py: the input block aligned once for every lane, each tile row once, exact
integer sums rounded once to fp32), fp32 accumulators, fed one weight tile per cycle.

A MATVEC walks its tiles in the stream order (groups of row blocks; within a group, column
block by column block; within that, row block by row block; each tile used by every token
group in turn) and issues one *step* (tile, token group) per cycle. A token group is ``reuse``
(R) consecutive tokens: the tile meets all of them in the step, so a MATVEC over T tokens takes
ceil(T / R) steps per tile. Per step, lane l computes the dot product of its tile row with each
token's input block from XB (R read ports; docs/numerics.md), and adds those partial sums to
its accumulator slot (row block, token group): the bias (or -0) on the first column block,
the slot's running sums after. After the last column block the slot's values go to an output
FIFO, from which they are written to the VSP token by token.

The pipelines have no enable; the step sequencer guarantees everything they need:
- a step that updates a slot waits until the slot's previous update has been written back
  (only possible when group x tokens is small);
- a step that ends a row waits for room in the output FIFO (credits);
- a step that starts a tile waits for the weight FIFO.
The bias of each group is loaded from the VSP into one of two banks while the previous group
runs, and read at step issue, then carried down the pipeline with the step.

The parts: the step sequencer (hw/core/mpu_seq.py), the bias banks (hw/core/mpu_bias.py),
the tile register with the dot products and the accumulators
(hw/core/mpu_datapath.py), the output writer (hw/core/mpu_out.py).
"""

from amaranth.hdl import Module, Signal
from amaranth.lib import data, stream, wiring
from amaranth.lib.wiring import In, Out

from hw.arith.dot import DotArray
from hw.arith.pipe import delay
from hw.arith.units import Fp32Add

from .cmds import MatvecCmd
from .mpu_bias import BiasBanks
from .mpu_datapath import Accumulators, MacArray
from .mpu_out import OutWriter
from .mpu_seq import MpuSequencer
from .vsp import ReadPort, WritePort
from .wfifo import WeightRead

__all__ = ["Mpu", "XbRead"]


class XbRead(wiring.Signature):
    """Read ports of XB, one per token of a step (``reuse``): a row address each, the row of
    ``width`` fp16 words one cycle later (port j's in ``data[16 width j, 16 width (j + 1))``)."""

    def __init__(self, row_bits, width, reuse=1):
        super().__init__({"addr": Out(data.ArrayLayout(row_bits, reuse)),
                          "data": In(16 * width * reuse)})


class Mpu(wiring.Component):
    """Matrix unit.

    Parameters
    ----------
    lanes, width : int
        Output rows per step, and the columns of a tile.
    vector_lanes, vsp_rows : int
        The VSP's words per row, and rows.
    xb_words : int
    channels : int
        The weight FIFO's channels (HBM channels: a tile is a beat of each).
    reuse : int
        Token vectors that meet each tile per step (R): a MATVEC over T tokens takes
        ceil(T / R) steps per tile.
    weights : str
        ``core.weight_dtype``: "int8", MATVEC.i8 too (a tile of 2 x lanes int8 rows meets
        R / 2 tokens a step, each group's scale row popped before its tiles); "int16",
        MATVEC.i8 of lanes int16 rows (R tokens a step, the scale rows as int8's) and the
        fp16 tiles (the K and V caches) in ``cache_phases`` cycles a step.
    cache_phases : int
        ``core.cache_phases`` (int16 builds).

    Members
    -------
    cmd : ``In(stream.Signature(MatvecCmd))``  (checked instructions only)
    wf : ``Out(WeightRead(channels, ...))``  the weight FIFO's read side (hw/core/wfifo.py)
    xb : ``Out(XbRead)``  ``reuse`` synchronous reads, one cycle
    r_bias : ``Out(ReadPort)`` ; w_out : ``Out(WritePort)``
    done : ``Out(1)``  pulse as a MATVEC's last output is written
    busy, starve : ``Out(1)``  (starve: a step waits for a tile)
    discard : ``In(1)``  while idle, drop tiles (stopping after an error or leftover tiles)
    """

    def __init__(self, *, lanes, width, vector_lanes, vsp_rows, xb_words, channels, reuse=1,
                 weights="fp16", cache_phases=1):
        self.L, self.W, self.P, self.R, self.C = lanes, width, vector_lanes, reuse, channels
        self.int8, self.int16 = weights == "int8", weights == "int16"
        self.phases = cache_phases
        self.vsp_row_bits = (vsp_rows - 1).bit_length()
        self.xb_row_bits = max(1, (xb_words // width - 1).bit_length())
        super().__init__({
            "cmd": In(stream.Signature(MatvecCmd)),
            "wf": Out(WeightRead(channels, lanes * width * 16 // channels)),
            "xb": Out(XbRead(self.xb_row_bits, width, reuse)),
            "r_bias": Out(ReadPort(self.vsp_row_bits, vector_lanes)),
            "w_out": Out(WritePort(self.vsp_row_bits, vector_lanes)),
            "done": Out(1),
            "busy": Out(1),
            "starve": Out(1),
            "discard": In(1),
        })

    def elaborate(self, platform):
        m = Module()
        L, W, P, R, rows = self.L, self.W, self.P, self.R, self.vsp_row_bits
        # Step issue -> partial sums: the weight FIFO's registered pop, the tile and XB
        # registers, the dot products.
        X = 2 + DotArray.latency(W)
        # Step k issued in cycle s reads its slot in cycle s + X - 1 (the accumulator's read
        # port, data in s + X) and writes it back in cycle s + X + ADD. A later step on the same
        # slot must read in a cycle after that write: it may issue at s + ADD + 2 at the
        # earliest, so it waits while the slot was updated in the last ADD + 1 cycles.
        # With group x tokens >= ADD + 2 (= 8) rotating slots this never stalls.
        m.submodules.seq = seq = MpuSequencer(lanes=L, width=W, vector_lanes=P, vsp_row_bits=rows,
                                              xb_row_bits=self.xb_row_bits,
                                              window=Fp32Add.LATENCY + 1, reuse=R,
                                              int8=self.int8, int16=self.int16,
                                              phases=self.phases)
        m.submodules.bias = bias = BiasBanks(lanes=L, vector_lanes=P, vsp_row_bits=rows, reuse=R,
                                             int8=self.int8)
        m.submodules.mac = mac = MacArray(lanes=L, width=W, channels=self.C, reuse=R,
                                          int8=self.int8, int16=self.int16, phases=self.phases)
        m.submodules.acc = acc = Accumulators(lanes=L, row_bits=rows, align=X - 2, reuse=R)
        m.submodules.out = out = OutWriter(lanes=L, vector_lanes=P, row_bits=rows, reuse=R)

        # Steps: a MATVEC's (tile, token) pairs, as the tiles, the bias and the room allow.
        wiring.connect(m, wiring.flipped(self.cmd), seq.cmd)
        m.d.comb += [seq.tile_valid.eq(self.wf.avail), seq.bias_ready.eq(bias.ready),
                     seq.credit.eq(out.credit), self.starve.eq(seq.starve),
                     bias.mv.eq(seq.mv), bias.active.eq(seq.active), bias.begin.eq(seq.begin),
                     bias.block.eq(seq.block), bias.slot.eq(seq.slot), bias.free.eq(seq.group_done),
                     out.claim.eq(seq.claim)]
        wiring.connect(m, bias.r, wiring.flipped(self.r_bias))

        # Stage 0 -> 1 -> 2: the tile popped, into the tile register under the weight FIFO's
        # registered pops; the tokens' input blocks and the bias row read, then registered.
        # While idle and told to (stopping), tiles are popped and dropped.
        drop = ~seq.active & self.discard & self.wf.avail
        m.d.comb += [self.wf.pop.eq(seq.pop | drop), mac.head.eq(self.wf.head),
                     mac.take.eq(self.wf.take), self.xb.addr.eq(seq.xrow)]
        x2 = Signal(len(self.xb.data), reset_less=True)
        bias2 = Signal(len(bias.data), reset_less=True)
        s2 = delay(m, seq.s1, 1, name="s2")[-1]
        m.d.sync += [x2.eq(self.xb.data), bias2.eq(bias.data)]
        # Stage 2 -> X -> X + ADD: products, trees, accumulation; finished rows out.
        m.d.comb += [mac.x.eq(x2), acc.meta.eq(s2.as_value()[:len(acc.meta.as_value())]),
                     acc.bias.eq(bias2), acc.partial.eq(mac.o)]
        # the tile's transposition: as it is taken, or (int16) by the array, step by step
        m.d.comb += mac.tt.eq(s2.tt if self.int16 else seq.mv.tt)
        if self.int8 or self.int16:
            m.d.comb += [mac.scale.eq(seq.scale), mac.i8.eq(s2.i8), mac.block.eq(s2.block)]
        if self.phases > 1:
            m.d.comb += mac.phase.eq(s2.phase)
        wiring.connect(m, acc.o, out.i)
        wiring.connect(m, out.w, wiring.flipped(self.w_out))
        m.d.comb += [self.done.eq(out.done), self.busy.eq(seq.active | out.busy)]
        return m
