"""Instruction fetch: bursts of instructions from the program buffer (m_axi_insn) into a FIFO.

Runs ahead of the decoder by up to the FIFO's depth. Each instruction carries its pc and
whether its beat came back with an error, so that an error is reported at the instruction it
hit, not at the fetch that ran ahead. When the core stops, outstanding bursts are drained and
discarded before the next start.
"""

from amaranth.hdl import Module, Mux, Signal
from amaranth.lib import data, stream, wiring
from amaranth.lib.fifo import SyncFIFOBuffered
from amaranth.lib.wiring import In, Out

from hw.axi import Axi4ReadSignature
from hw.dma.reader import AxiBurstReader
from hw.isa import INSN_BITS

from .cmds import PC_BITS

__all__ = ["Fetch", "FetchedInsn"]

FetchedInsn = data.StructLayout({"word": INSN_BITS, "pc": PC_BITS, "err": 1})
DEPTH = 32
CHUNK = 16
# A FIFO entry: the instruction and whether its beat came back with an error.
_Entry = data.StructLayout({"word": INSN_BITS, "err": 1})


class Fetch(wiring.Component):
    """Members
    -------
    start : In(1) pulse; stop : In(1) (level: the core is stopping or stopped)
    prog_addr, insn_ptr : In(64); prog_len : In(32)
    axi : Out(Axi4ReadSignature(addr_bits=64, data_bits=128))  the program buffer's reads
    out : Out(stream(FetchedInsn)); exhausted : Out(1) (all prog_len instructions delivered)
    busy : Out(1) (bursts in flight or undelivered data)
    """

    def __init__(self):
        super().__init__({
            "start": In(1), "stop": In(1),
            "prog_addr": In(64), "insn_ptr": In(64), "prog_len": In(32),
            "axi": Out(Axi4ReadSignature(addr_bits=64, data_bits=INSN_BITS)),
            "out": Out(stream.Signature(FetchedInsn)),
            "exhausted": Out(1),
            "busy": Out(1),
        })

    def elaborate(self, platform):
        m = Module()
        m.submodules.reader = rd = AxiBurstReader(data_bits=INSN_BITS, beat_addr_bits=60,
                                                  len_bits=24, max_burst=16, max_outstanding=4)
        wiring.connect(m, wiring.flipped(self.axi), rd.axi)
        m.submodules.fifo = fifo = SyncFIFOBuffered(width=_Entry.size, depth=DEPTH)
        w, r = _Entry(fifo.w_data), _Entry(fifo.r_data)
        m.d.comb += rd.base.eq(self.insn_ptr)

        requested = Signal(32)      # instructions asked for
        arrived = Signal(32)        # instructions received (pc of the next beat)
        delivered = Signal(32)      # pc of the next instruction out
        active = Signal()

        remaining = self.prog_len - requested
        chunk = Mux(remaining < CHUNK, remaining, CHUNK)
        room = (fifo.level + (requested - arrived)) <= (DEPTH - CHUNK)
        m.d.comb += [rd.cmd.valid.eq(active & ~self.stop & (requested < self.prog_len) & room),
                     rd.cmd.payload.addr.eq((self.prog_addr >> 4) + requested),
                     rd.cmd.payload.beats.eq(chunk)]
        with m.If(rd.cmd.valid & rd.cmd.ready):
            m.d.sync += requested.eq(requested + chunk)

        # Stopping: beats still in flight are taken and dropped, the FIFO is emptied.
        m.d.comb += [rd.data.ready.eq(fifo.w_rdy | self.stop),
                     fifo.w_en.eq(rd.data.valid & ~self.stop),
                     w.word.eq(rd.data.payload.data), w.err.eq(rd.data.payload.err)]
        with m.If(rd.data.valid & rd.data.ready):
            m.d.sync += arrived.eq(arrived + 1)

        m.d.comb += [self.out.valid.eq(fifo.r_rdy & active & ~self.stop),
                     self.out.payload.word.eq(r.word),
                     self.out.payload.err.eq(r.err),
                     self.out.payload.pc.eq(delivered),
                     fifo.r_en.eq((self.out.valid & self.out.ready) | self.stop),
                     self.exhausted.eq(active & (delivered >= self.prog_len))]
        with m.If(self.out.valid & self.out.ready):
            m.d.sync += delivered.eq(delivered + 1)

        m.d.comb += self.busy.eq(rd.busy | (fifo.level != 0))
        with m.If(self.start):
            m.d.sync += [active.eq(1), requested.eq(0), arrived.eq(0), delivered.eq(0)]
        return m
