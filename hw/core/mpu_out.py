"""The matrix unit's output writer (hw/core/mpu.py): finished row blocks (of up to ``reuse``
tokens) wait in a FIFO and go to the VSP a row of ``vector_lanes`` words at a time.
"""

from amaranth.hdl import Module, Signal
from amaranth.lib import stream, wiring
from amaranth.lib.fifo import SyncFIFOBuffered
from amaranth.lib.wiring import In, Out

from .mpu_datapath import out_layout
from .vsp import WritePort, word_select

__all__ = ["OutWriter", "OUT_DEPTH", "OUT_CREDIT"]

OUT_DEPTH = 64          # output FIFO entries
OUT_CREDIT = 60         # rows in the FIFO or on their way below which a row may be started


class OutWriter(wiring.Component):
    """Finished row blocks into the VSP, ``lanes / vector_lanes`` VSP rows for each of an
    entry's tokens, token by token.

    The matrix unit's pipeline cannot wait, so every row that ends in it has its FIFO entry
    reserved when its last step issues (``claim``): ``credit`` says one more may.

    Parameters
    ----------
    lanes, vector_lanes, row_bits, reuse : int

    Members
    -------
    i : ``In(stream.Signature(out_layout(lanes, row_bits, reuse), always_ready=True))``
        Finished rows (the accumulators'); never refused.
    claim : ``In(1)``
        A step that ends a row issues.
    credit : ``Out(1)``
        Rows in the FIFO and claimed are fewer than ``OUT_CREDIT``.
    w : ``Out(WritePort)``
        VSP writes, a row per cycle while granted.
    done : ``Out(1)``
        Pulse as a MATVEC's last row (``end``) is written.
    busy : ``Out(1)``
        Rows claimed, queued or being written.

    Timing: a row pushed in cycle t can be written from t + 1 (``SyncFIFOBuffered``), one VSP
    row per granted cycle; ``credit`` is combinational on the FIFO's level and the claims.
    """

    def __init__(self, *, lanes, vector_lanes, row_bits, reuse=1):
        self._lanes, self._vlanes, self._row_bits = lanes, vector_lanes, row_bits
        self._reuse = reuse
        super().__init__({
            "i": In(stream.Signature(out_layout(lanes, row_bits, reuse), always_ready=True)),
            "claim": In(1), "credit": Out(1),
            "w": Out(WritePort(row_bits, vector_lanes)),
            "done": Out(1), "busy": Out(1),
        })

    def elaborate(self, platform):
        m = Module()
        P, R, lpr = self._vlanes, self._reuse, self._lanes // self._vlanes
        layout = out_layout(self._lanes, self._row_bits, R)
        m.submodules.fifo = fifo = SyncFIFOBuffered(width=layout.size, depth=OUT_DEPTH)
        m.d.comb += [fifo.w_en.eq(self.i.valid), fifo.w_data.eq(self.i.payload)]
        in_flight = Signal(range(2 * OUT_DEPTH))    # rows claimed and not in the FIFO yet
        with m.If(self.claim):
            m.d.sync += in_flight.eq(in_flight + 1)
        with m.If(self.i.valid):
            m.d.sync += in_flight.eq(in_flight - 1 + self.claim)
        m.d.comb += self.credit.eq((fifo.level + in_flight) < OUT_CREDIT)

        # An entry is n tokens of lpr VSP rows: row wsub of token j is the entry's words
        # [(j lpr + wsub) P, (j lpr + wsub + 1) P), written at rows[j] + wsub.
        entry = layout(fifo.r_data)
        wsub = Signal(range(lpr + 1))
        tj = Signal(range(R + 1))
        m.d.comb += [self.w.req.valid.eq(fifo.r_rdy),
                     self.w.req.payload.row.eq(entry.rows[tj] + wsub),
                     self.w.req.payload.mask.eq((1 << P) - 1),
                     self.w.req.payload.data.eq(word_select(entry.data, tj * lpr + wsub, 32 * P,
                                                            lpr * R))]
        with m.If(self.w.req.valid & self.w.req.ready):
            with m.If(wsub == lpr - 1):
                m.d.sync += wsub.eq(0)
                with m.If(tj == entry.n - 1):
                    m.d.sync += tj.eq(0)
                    m.d.comb += [fifo.r_en.eq(1), self.done.eq(entry.end)]
                with m.Else():
                    m.d.sync += tj.eq(tj + 1)
            with m.Else():
                m.d.sync += wsub.eq(wsub + 1)
        m.d.comb += self.busy.eq((in_flight != 0) | (fifo.level != 0) | (wsub != 0) | (tj != 0))
        return m
