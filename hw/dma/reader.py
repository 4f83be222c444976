"""AXI4 burst read engine: one per HBM channel.

A command names a run of beats in the channel (``addr`` in beats, ``beats``); the engine cuts
it into INCR bursts and keeps up to ``max_outstanding`` of them in flight, so that the HBM's
latency is hidden and the channel delivers a beat every cycle. Data come out in order on a
registered stream, with ``last`` on the final beat of each command.

Burst cutting (the contract the reference in ``sim/ref/dma.py`` reproduces, on absolute beat
addresses ``base / beat_bytes + addr``): a burst never crosses a boundary of
``min(max_burst, 4096 / beat_bytes)`` beats of the address space, so every burst is at most
``max_burst`` beats, never crosses a 4 KiB page (AXI's rule) whether or not ``base`` is page
aligned, and bursts after the first of a command are aligned to their own length, which is
what HBM controllers serve best. ``base`` must be beat aligned.
"""

from amaranth.hdl import Module, Mux, Signal, unsigned
from amaranth.lib import data, stream, wiring
from amaranth.lib.fifo import SyncFIFO
from amaranth.lib.wiring import In, Out

from ..axi import Axi4ReadSignature, Burst
from ..stream import SkidBuffer

__all__ = ["ReadCommand", "AxiBurstReader", "burst_block"]


def burst_block(max_burst, beat_bytes):
    """Beats between the boundaries no burst crosses: ``min(max_burst, 4096 / beat_bytes)``."""
    return min(max_burst, 4096 // beat_bytes)


def ReadCommand(addr_bits, len_bits):
    """Command layout: ``addr`` (beat index in the channel), ``beats`` (run length, >= 1)."""
    return data.StructLayout({"addr": unsigned(addr_bits), "beats": unsigned(len_bits)})


class AxiBurstReader(wiring.Component):
    """AXI4 burst read engine for one HBM channel.

    Parameters
    ----------
    data_bits : int
        AXI data width (256 or 512 for HBM).
    beat_addr_bits : int
        Width of a beat address inside the channel.
    len_bits : int
        Width of a command's beat count.
    max_burst : int
        Longest burst, in beats (power of two, at most 256).
    max_outstanding : int
        Bursts in flight (issued, last beat not yet returned).

    Members
    -------
    cmd : ``In(stream.Signature(ReadCommand))``
        Commands. A command of 0 beats reads nothing and raises ``error[1]``.
    data : ``Out(stream.Signature({"data", "last", "err"}))``
        Read data in order; ``last`` marks the final beat of a command, ``err`` a beat that
        came back with an error response.
    axi : ``Out(Axi4ReadSignature)``
        The AXI4 AR/R channels.
    base : ``In(64)``
        Byte address of beat 0 (the buffer base the host passes to the kernel), beat aligned,
        held while the engine is busy.
    error : ``Out(2)``
        Sticky flags, cleared by reset only: bit 0, a beat came back with a response other than OKAY
        (or an ID never issued);
        bit 1, a command of 0 beats was given.
    busy : ``Out(1)``
        A command is being issued or bursts are in flight.
    """

    def __init__(self, *, data_bits, beat_addr_bits, len_bits, max_burst, max_outstanding):
        if max_burst not in (1, 2, 4, 8, 16, 32, 64, 128, 256):
            raise ValueError(f"max_burst must be a power of two in [1, 256], not {max_burst!r}")
        if not 1 <= max_outstanding <= 64:
            raise ValueError(f"max_outstanding must be in [1, 64], not {max_outstanding!r}")
        if not 1 <= len_bits <= 32:
            raise ValueError(f"len_bits must be in [1, 32], not {len_bits!r}")
        self._data_bits = data_bits
        self._beat_bytes = data_bits // 8
        self._shift = (self._beat_bytes - 1).bit_length()
        self._beat_addr_bits = beat_addr_bits
        self._len_bits = len_bits
        self._max_outstanding = max_outstanding
        self.block = burst_block(max_burst, self._beat_bytes)
        super().__init__({
            "cmd": In(stream.Signature(ReadCommand(beat_addr_bits, len_bits))),
            "data": Out(stream.Signature(data.StructLayout({"data": data_bits, "last": 1, "err": 1}))),
            "axi": Out(Axi4ReadSignature(addr_bits=64, data_bits=data_bits)),
            "base": In(64),
            "error": Out(2),
            "busy": Out(1),
        })

    def elaborate(self, platform):
        m = Module()
        block = self.block
        block_bits = (block - 1).bit_length()

        # Issue side: the command being cut into bursts.
        active = Signal()
        cur = Signal(self._beat_addr_bits)
        remaining = Signal(self._len_bits)

        # Boundaries are counted in absolute beats (base + cur): a base that is not aligned to
        # the block (to a 4 KiB page) moves them, so no burst crosses a page whatever the base.
        to_boundary = Signal(block_bits + 1)
        if block_bits:
            here = (self.base[self._shift:self._shift + block_bits] + cur[:block_bits])[:block_bits]
            m.d.comb += to_boundary.eq(block - here)
        else:
            m.d.comb += to_boundary.eq(block)
        burst = Signal(block_bits + 1)
        m.d.comb += burst.eq(Mux(remaining < to_boundary, remaining, to_boundary))
        final = Signal()   # this burst ends the command
        m.d.comb += final.eq(remaining <= to_boundary)

        # Bursts loaded into the AR register and not yet finished by their last R beat.
        inflight = Signal(range(self._max_outstanding + 1))
        r_done = Signal()
        m.d.comb += r_done.eq(self.axi.rvalid & self.axi.rready & self.axi.rlast)

        # One bit per burst in flight: does it end its command?
        ends = SyncFIFO(width=1, depth=self._max_outstanding)
        m.submodules.ends = ends

        ar_free = ~self.axi.arvalid | self.axi.arready
        load = Signal()
        m.d.comb += load.eq(active & ar_free & (inflight < self._max_outstanding))

        m.d.comb += [
            self.axi.arid.eq(0),
            self.axi.arsize.eq(self._shift),
            self.axi.arburst.eq(Burst.INCR),
        ]
        with m.If(self.axi.arvalid & self.axi.arready):
            m.d.sync += self.axi.arvalid.eq(0)
        with m.If(load):
            m.d.sync += [
                self.axi.arvalid.eq(1),
                self.axi.araddr.eq(self.base + (cur << self._shift)),
                self.axi.arlen.eq(burst - 1),
                cur.eq(cur + burst),
                remaining.eq(remaining - burst),
            ]
            m.d.comb += [ends.w_en.eq(1), ends.w_data.eq(final)]
            with m.If(final):
                m.d.sync += active.eq(0)

        # A new command is taken when idle, or in the cycle the current one issues its last burst.
        m.d.comb += self.cmd.ready.eq(~active | (load & final))
        with m.If(self.cmd.valid & self.cmd.ready & (self.cmd.payload.beats == 0)):
            m.d.sync += self.error[1].eq(1)
        with m.Elif(self.cmd.valid & self.cmd.ready):
            m.d.sync += [
                active.eq(1),
                cur.eq(self.cmd.payload.addr),
                remaining.eq(self.cmd.payload.beats),
            ]

        m.d.sync += inflight.eq(inflight + load - r_done)

        # Return side: R beats into a register slice; the end flag of each burst from the FIFO.
        m.submodules.skid = skid = SkidBuffer(self.data.payload.shape())
        m.d.comb += [
            skid.i.valid.eq(self.axi.rvalid),
            skid.i.payload.data.eq(self.axi.rdata),
            skid.i.payload.last.eq(self.axi.rlast & ends.r_data),
            skid.i.payload.err.eq((self.axi.rresp != 0) | (self.axi.rid != 0)),
            self.axi.rready.eq(skid.i.ready),
            ends.r_en.eq(r_done),
        ]
        wiring.connect(m, skid.o, wiring.flipped(self.data))

        # Anything but OKAY, or an ID this engine never issued, is an error.
        with m.If(self.axi.rvalid & self.axi.rready & ((self.axi.rresp != 0) | (self.axi.rid != 0))):
            m.d.sync += self.error[0].eq(1)
        m.d.comb += self.busy.eq(active | (inflight != 0) | self.data.valid)
        return m
