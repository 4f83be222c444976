"""DMA between the HBM channels and the core.

Read side (LOAD, WLOAD): one AXI burst read engine per channel, all given the same stripe
rows; their beats are joined into stripes (one beat of every channel). A WLOAD's stripes are
weight tiles for the weight FIFO; a LOAD's stripes are fp16 vectors, converted to fp32 and
written to the VSP ``P`` words per cycle. The parts: hw/core/load.py.

Write side (STORE): VSP rows are read, split into elements, rounded to fp16 and placed by the
instruction's pattern; consecutive elements that land in one channel beat are merged into one
strobed single-beat AXI write. Every write's response is awaited before the STORE completes.
The parts: hw/core/store.py.
"""

from amaranth.hdl import Cat, Module, Mux, Signal
from amaranth.lib import data, stream, wiring
from amaranth.lib.fifo import SyncFIFOBuffered
from amaranth.lib.wiring import In, Out

from hw.axi import Axi4ReadSignature, Axi4WriteSignature
from hw.dma.reader import AxiBurstReader
from hw.stream import ReadAhead

from .cmds import PC_BITS, DmaReadCmd, StoreCmd
from .load import LoadCmd, LoadWriter, RunFanout, StripeJoin
from .store import Beat, BeatPacker, BeatWriter, StoreWalk
from .vsp import ReadPort, WritePort

__all__ = ["DmaRead", "DmaWrite", "READ_QUEUE", "STORE_QUEUE", "RUN_BITS"]

READ_QUEUE = 4           # LOADs and WLOADs queued ahead of the readers
STORE_QUEUE = 2          # STOREs issued ahead of the store engine (hw/core/card.py)
RUN_BITS = DmaReadCmd["count"].width      # a run's stripe rows: the readers' len_bits at least

# The read DMA's queue entry: what the data side needs of a LOAD or WLOAD.
_Head = data.StructLayout({"wload": 1, "load": LoadCmd, "pc": DmaReadCmd["pc"].shape})


class DmaRead(wiring.Component):
    """LOAD and WLOAD over all channels.

    Up to ``READ_QUEUE`` instructions wait in a queue, so that issue goes on while a reader is
    still cutting the last run into bursts; every reader is given the same run of beats.

    Parameters
    ----------
    channels : int
    data_bits, beat_addr_bits, len_bits, max_burst, max_outstanding : int
        Each channel's ``hw.dma.reader.AxiBurstReader``; ``len_bits`` at least ``RUN_BITS``.
    vector_lanes, vsp_rows : int
        The VSP's rows and words per row.

    Members
    -------
    cmd : ``In(stream.Signature(DmaReadCmd))``
    done : ``Out(1)``
        Pulse per finished instruction, in order: a WLOAD's last stripe into the weight FIFO,
        a LOAD's last row into the VSP.
    axi : ``Out(Axi4ReadSignature).array(channels)``
        The channels' AR and R channels.
    ptr : ``In(64).array(channels)``
        Channel buffer bases.
    tiles : ``Out(stream.Signature(stripe bits))``
        WLOAD stripes into the weight FIFO.
    w : ``Out(WritePort)``
        LOAD results into the VSP.
    busy : ``Out(1)``
        An instruction is queued or a reader is busy.
    err : ``Out(1)``; err_pc : ``Out(PC_BITS)``
        Sticky until ``clear``: a beat came back with an error, or the channels' runs
        disagree; the pc of the instruction whose stripe it was (the first such).
    clear : ``In(1)``
        A run starts: ``err`` falls.
    stripe : ``Out(1)``
        Pulse per stripe taken from the readers.
    """

    def __init__(self, *, channels, data_bits, beat_addr_bits, len_bits, max_burst,
                 max_outstanding, vector_lanes, vsp_rows):
        if len_bits < RUN_BITS:
            raise ValueError(f"len_bits must be at least {RUN_BITS} (a run's stripe rows), "
                             f"not {len_bits!r}")
        self._channels, self._data_bits = channels, data_bits
        self._reader = dict(data_bits=data_bits, beat_addr_bits=beat_addr_bits,
                            len_bits=len_bits, max_burst=max_burst,
                            max_outstanding=max_outstanding)
        self._lanes = vector_lanes
        self._row_bits = (vsp_rows - 1).bit_length()
        super().__init__({
            "cmd": In(stream.Signature(DmaReadCmd)),
            "done": Out(1),
            "axi": Out(Axi4ReadSignature(addr_bits=64, data_bits=data_bits)).array(channels),
            "ptr": In(64).array(channels),
            "tiles": Out(stream.Signature(channels * data_bits)),
            "w": Out(WritePort(self._row_bits, vector_lanes)),
            "busy": Out(1),
            "err": Out(1), "err_pc": Out(PC_BITS), "clear": In(1),
            "stripe": Out(1),
        })

    def elaborate(self, platform):
        m = Module()
        C = self._channels
        m.submodules.heads = heads = SyncFIFOBuffered(width=_Head.size, depth=READ_QUEUE)
        m.submodules.fanout = fanout = RunFanout(
            channels=C, depth=READ_QUEUE, beat_addr_bits=self._reader["beat_addr_bits"],
            len_bits=self._reader["len_bits"])
        m.submodules.join = join = StripeJoin(channels=C, data_bits=self._data_bits)
        m.submodules.load = load = LoadWriter(stripe_bits=C * self._data_bits,
                                              lanes=self._lanes, row_bits=self._row_bits)
        wiring.connect(m, load.w, wiring.flipped(self.w))
        readers = []
        for k in range(C):
            m.submodules[f"rd{k}"] = rd = AxiBurstReader(**self._reader)
            readers.append(rd)
            wiring.connect(m, wiring.flipped(self.axi[k]), rd.axi)
            wiring.connect(m, fanout.o[k], rd.cmd)
            wiring.connect(m, rd.data, join.i[k])
            m.d.comb += rd.base.eq(self.ptr[k])

        # Command side: the instruction into the queue, its run to the readers.
        cmd, queued = self.cmd.payload, _Head(heads.w_data)
        m.d.comb += [
            self.cmd.ready.eq(heads.w_rdy & fanout.i.ready),
            heads.w_en.eq(self.cmd.valid & self.cmd.ready),
            queued.wload.eq(cmd.wload),
            queued.load.vsp.eq(cmd.vsp), queued.load.n.eq(cmd.n), queued.load.f32.eq(cmd.f32),
            queued.pc.eq(cmd.pc),
            fanout.i.valid.eq(self.cmd.valid & heads.w_rdy),
            fanout.i.payload.row.eq(cmd.row), fanout.i.payload.count.eq(cmd.count),
        ]

        # Data side: a WLOAD's stripes into the weight FIFO, a LOAD's to the LOAD writer.
        head, stripes = _Head(heads.r_data), join.o
        wload = heads.r_rdy & head.wload
        m.d.comb += [
            self.tiles.valid.eq(wload & stripes.valid),
            self.tiles.payload.eq(stripes.payload.data),
            load.cmd.valid.eq(heads.r_rdy & ~head.wload), load.cmd.payload.eq(head.load),
            load.i.valid.eq(load.cmd.valid & stripes.valid), load.i.payload.eq(stripes.payload),
            stripes.ready.eq(Mux(wload, self.tiles.ready, load.cmd.valid & load.i.ready)),
        ]
        take = stripes.valid & stripes.ready
        with m.If(self.clear):
            m.d.sync += self.err.eq(0)
        with m.Elif(take & stripes.payload.err & ~self.err):
            m.d.sync += [self.err.eq(1), self.err_pc.eq(head.pc)]
        finished = (wload & take & stripes.payload.last) | load.cmd.ready
        m.d.comb += [heads.r_en.eq(finished), self.done.eq(finished), self.stripe.eq(take),
                     self.busy.eq((heads.level != 0) | fanout.pending | self.cmd.valid
                                  | Cat(*[rd.busy for rd in readers]).any())]
        return m


class DmaWrite(wiring.Component):
    """STORE: VSP -> fp16 -> strobed single-beat AXI writes on the channels.

    One STORE at a time: its VSP rows are read ahead (``hw.stream.ReadAhead``), its elements
    walked and converted (``StoreWalk``: an element a cycle, or a row a cycle where the pattern
    allows), merged into beats (``BeatPacker``) that wait in a
    FIFO of 8, and written (``BeatWriter``); the STORE is done when every response is in.

    Parameters
    ----------
    channels, data_bits, max_outstanding : int
        The HBM channels (``max_outstanding`` writes in flight on each).
    vector_lanes, vsp_rows : int

    Members
    -------
    cmd : ``In(stream.Signature(StoreCmd))``
    done : ``Out(1)``
        Pulse per finished STORE (its last write's response received).
    r : ``Out(ReadPort)``
        VSP reads.
    axi : ``Out(Axi4WriteSignature).array(channels)``
        The channels' AW, W and B channels.
    ptr : ``In(64).array(channels)``
    busy : ``Out(1)``
    err : ``Out(1)``; err_pc : ``Out(PC_BITS)``
        Sticky until ``clear``: a write's response was not OKAY (or had an unknown ID); the pc
        of the STORE it answered (the first such).
    clear : ``In(1)``
        A run starts: ``err`` falls.
    beat : ``Out(1)``
        Pulse per beat written.
    elem : ``Out(range(vector_lanes + 1))``; elem_f32 : ``Out(1)``
        Elements entering the converters this cycle; the STORE's elements are fp32 (4 bytes,
        else 2).
    """

    def __init__(self, *, channels, data_bits, vector_lanes, vsp_rows, max_outstanding):
        self._channels, self._data_bits, self._max_out = channels, data_bits, max_outstanding
        self._lanes = vector_lanes
        row_bits = (vsp_rows - 1).bit_length()
        super().__init__({
            "cmd": In(stream.Signature(StoreCmd)),
            "done": Out(1),
            "r": Out(ReadPort(row_bits, vector_lanes)),
            "axi": Out(Axi4WriteSignature(addr_bits=64, data_bits=data_bits)).array(channels),
            "ptr": In(64).array(channels),
            "busy": Out(1),
            "err": Out(1), "err_pc": Out(PC_BITS), "clear": In(1),
            "beat": Out(1),
            "elem": Out(range(vector_lanes + 1)),
            "elem_f32": Out(1),
        })

    def elaborate(self, platform):
        m = Module()
        P = self._lanes
        pshift = (P - 1).bit_length()
        m.submodules.rows = rows = ReadAhead(width=32 * P)
        m.submodules.walk = walk = StoreWalk(lanes=P, beat_bytes=self._data_bits // 8)
        m.submodules.pack = pack = BeatPacker(beat_bytes=self._data_bits // 8, lanes=P)
        m.submodules.beats = beats = SyncFIFOBuffered(width=Beat(self._data_bits // 8).size,
                                                      depth=8)
        m.submodules.writer = writer = BeatWriter(
            channels=self._channels, data_bits=self._data_bits, max_outstanding=self._max_out)
        cmd = Signal(StoreCmd)
        active = Signal()
        start = self.cmd.valid & self.cmd.ready

        # The STORE's VSP rows, read ahead.
        rows_total = (cmd.n + (P - 1)) >> pshift
        rreq = Signal(16)
        inflight = Signal()
        issue = self.r.req.valid & self.r.req.ready
        m.d.comb += [self.r.req.valid.eq(active & (rreq < rows_total) & rows.room),
                     self.r.req.payload.eq((cmd.vsp >> pshift) + rreq),
                     rows.inflight.eq(inflight),
                     rows.w.valid.eq(self.r.resp.valid), rows.w.payload.eq(self.r.resp.payload)]
        m.d.sync += inflight.eq(issue)
        with m.If(issue):
            m.d.sync += rreq.eq(rreq + 1)

        # Rows -> elements -> beats -> the beat FIFO -> AXI writes.
        wiring.connect(m, rows.o, walk.rows)
        m.d.comb += [walk.cmd.eq(cmd), walk.active.eq(active), walk.queued.eq(beats.level),
                     walk.start.valid.eq(start), walk.start.payload.eq(self.cmd.payload),
                     pack.f32.eq(cmd.f32)]
        wiring.connect(m, walk.o, pack.i)
        m.d.comb += [beats.w_en.eq(pack.o.valid), beats.w_data.eq(pack.o.payload)]
        wiring.connect(m, beats.r_stream, writer.i)
        for k in range(self._channels):
            wiring.connect(m, wiring.flipped(self.axi[k]), writer.axi[k])
            m.d.comb += writer.ptr[k].eq(self.ptr[k])
        # The responses of a STORE all come before it is done, so an error answers ``cmd``;
        # its pc is kept from the cycle before the writer's (registered) flag rises.
        with m.If(~writer.err):
            m.d.sync += self.err_pc.eq(cmd.pc)
        m.d.comb += [writer.clear.eq(self.clear), self.err.eq(writer.err), self.beat.eq(writer.sent),
                     self.elem.eq(walk.launch), self.elem_f32.eq(cmd.f32)]

        # Command and completion.
        m.d.comb += self.cmd.ready.eq(~active)
        with m.If(start):
            m.d.sync += [cmd.eq(self.cmd.payload), active.eq(1), rreq.eq(0)]
        finished = (active & walk.idle & rows.empty & ~inflight & (rreq == rows_total) & pack.idle
                    & (beats.level == 0) & writer.idle)
        with m.If(finished):
            m.d.sync += active.eq(0)
            m.d.comb += self.done.eq(1)
        m.d.comb += self.busy.eq(active)
        return m
