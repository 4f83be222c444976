"""The vector scratchpad (VSP): fp32 words in rows of ``P`` (the vector lanes), split by
address into independently ported segments.

Each segment is a simple dual-port memory (one read, one write per cycle). Several units
read and write the VSP; in each cycle each segment grants one read and one write, by fixed
priority in the order the ports are listed. A requester holds its request (``req.valid``)
until granted (``req.ready``); the row comes back one cycle after the grant (``resp``, always
taken: hw/stream.py's ReadPort). Units that cannot stall are listed first so that they are
always granted (the vector unit's write port: its pipelines have no enable).
"""

from amaranth.hdl import Const, Module, Mux, Signal
from amaranth.lib import data, stream, wiring
from amaranth.lib.memory import Memory
from amaranth.lib.wiring import In, Out

from hw import stream as hw_stream

__all__ = ["ReadPort", "WritePort", "Vsp", "word_select"]


def word_select(row, index, width, count):
    """Word ``index`` (a comb value) of the ``count`` words of ``width`` bits in ``row``, word 0
    where ``index`` is past the last: a multiplexer, as the units pick a lane of a row."""
    out = row[0:width]
    for k in range(1, count):
        out = Mux(index == k, row[width * k:width * (k + 1)], out)
    return out


class ReadPort(hw_stream.ReadPort):
    """A requester's view of a VSP read port: a row address per request, the row's ``lanes``
    fp32 words back one cycle after the grant."""

    def __init__(self, row_bits, lanes):
        self.row_bits, self.lanes = row_bits, lanes
        super().__init__(row_bits, 32 * lanes)


class WritePort(wiring.Signature):
    """A requester's view of a VSP write port: row, lane mask and data."""

    def __init__(self, row_bits, lanes):
        self.row_bits, self.lanes = row_bits, lanes
        super().__init__({
            "req": Out(stream.Signature(data.StructLayout({
                "row": row_bits, "mask": lanes, "data": 32 * lanes}))),
        })


class Vsp(wiring.Component):
    """Segmented scratchpad.

    Parameters
    ----------
    words : int
        Capacity in fp32 words.
    lanes : int
        Words per row.
    segments : int
        Address-range segments (each its own memory, one read and one write per cycle).
    readers, writers : list of str
        Port names, highest priority first.

    Members
    -------
    r_<name> : ``In(ReadPort)`` for each reader; ``w_<name>`` : ``In(WritePort)`` for each writer.
    """

    def __init__(self, *, words, lanes, segments, readers, writers):
        self.words, self.lanes, self.segments = words, lanes, segments
        self.rows = words // lanes
        self.seg_rows = self.rows // segments
        self.row_bits = (self.rows - 1).bit_length()
        self.readers, self.writers = list(readers), list(writers)
        members = {}
        for r in self.readers:
            members[f"r_{r}"] = In(ReadPort(self.row_bits, lanes))
        for w in self.writers:
            members[f"w_{w}"] = In(WritePort(self.row_bits, lanes))
        super().__init__(members)

    def _seg(self, row):
        sb = (self.segments - 1).bit_length()
        if sb == 0:
            return Const(0, 1)
        return row[self.row_bits - sb:self.row_bits]

    def _local(self, row):
        sb = (self.segments - 1).bit_length()
        return row[0:self.row_bits - sb] if sb else row

    def elaborate(self, platform):
        m = Module()
        P = self.lanes
        reads = [getattr(self, f"r_{r}") for r in self.readers]
        writes = [getattr(self, f"w_{w}") for w in self.writers]
        # Which segment granted each reader last cycle (for the data mux).
        got = [Signal(range(self.segments), name=f"got_{r}") for r in self.readers]
        got_valid = [Signal(name=f"gotv_{r}") for r in self.readers]
        seg_data = []
        for s in range(self.segments):
            mem = Memory(shape=32 * P, depth=self.seg_rows, init=[])
            m.submodules[f"seg{s}"] = mem
            wp = mem.write_port(granularity=32)
            rp = mem.read_port(transparent_for=())
            seg_data.append(rp.data)
            # Read arbitration: first requester (in priority order) targeting this segment.
            taken = Const(0, 1)
            for k, port in enumerate(reads):
                want = port.req.valid & (self._seg(port.req.payload) == s)
                grant = want & ~taken
                with m.If(grant):
                    m.d.comb += [rp.addr.eq(self._local(port.req.payload)), port.req.ready.eq(1)]
                    m.d.sync += got[k].eq(s)
                taken = taken | want
            m.d.comb += rp.en.eq(1)
            # Write arbitration.
            taken = Const(0, 1)
            for port in writes:
                p = port.req.payload
                want = port.req.valid & (self._seg(p.row) == s)
                grant = want & ~taken
                with m.If(grant):
                    m.d.comb += [wp.addr.eq(self._local(p.row)), wp.data.eq(p.data),
                                 wp.en.eq(p.mask), port.req.ready.eq(1)]
                taken = taken | want
        for k, port in enumerate(reads):
            m.d.sync += got_valid[k].eq(port.req.valid & port.req.ready)
            m.d.comb += [port.resp.valid.eq(got_valid[k]), port.resp.payload.eq(_mux(got[k], seg_data))]
        return m


def _mux(sel, values):
    out = values[0]
    for i, v in enumerate(values[1:], 1):
        out = Mux(sel == i, v, out)
    return out
