"""The store engine's AXI writer (hw/core/store.py's BeatWriter, the only part of DmaWrite on
the bus): each channel's AW/W/B port held to the AXI4 write manager's properties."""

from amaranth.hdl import Assert, Assume, Cat, Const, Cover, Module
from amaranth.lib import wiring
from amaranth.lib.wiring import In

from hw.core.store import Beat, BeatWriter

from .axi import env_of, no_reset, past, write_env, write_manager

__all__ = ["StoreHarness"]


class StoreHarness(wiring.Component):
    """A ``BeatWriter`` of ``channels`` channels fed any beats (a FIFO's output: held until
    taken), with any AW/W/B timing and responses and any beat-aligned channel bases.

    Properties: each channel's AXI4 write manager properties (single-beat bursts, at most
    ``max_outstanding`` awaiting B on each channel); ``idle`` with no beat waiting only when no write is owed.
    """

    def __init__(self, *, channels=2, data_bits=256, max_outstanding=2):
        self._c, self._db, self._mo = channels, data_bits, max_outstanding
        members = {"valid": In(1), "beat": In(Beat(data_bits // 8))}
        for c in range(channels):
            members[f"ptr{c}"] = In(64)
            members.update({f"c{c}_{n}": v for n, v in write_env().items()})
        super().__init__(members)

    def elaborate(self, platform):
        m = Module()
        C, bb = self._c, self._db // 8
        m.submodules.dut = dut = BeatWriter(channels=C, data_bits=self._db,
                                            max_outstanding=self._mo)
        no_reset(m)
        m.d.comb += [dut.i.valid.eq(self.valid), dut.i.payload.eq(self.beat),
                     Assume(self.beat.ch < C)]
        held = past(m, self.valid & ~dut.i.ready, "in_held")
        beat_was = past(m, self.beat, "beat_was")
        with m.If(held):
            m.d.comb += [Assume(self.valid), Assume(self.beat.as_value() == beat_was)]
        started = past(m, Const(1, 1), "started")
        ptrs = [getattr(self, f"ptr{c}") for c in range(C)]
        ptrs_was = past(m, ptrs, "ptrs_was")
        with m.If(started):
            m.d.comb += Assume(ptrs_was == Cat(*ptrs))
        owed = Const(0, 1)
        for c in range(C):
            m.d.comb += [dut.ptr[c].eq(ptrs[c]), Assume(ptrs[c][:5] == 0)]
            env = env_of(self, f"c{c}_", write_env())
            bus = write_manager(m, dut.axi[c], env, beat_bytes=bb, max_burst=1,
                                max_outstanding=self._mo, name=f"aw{c}")
            owed = owed | (bus.outstanding != 0)
            m.d.comb += Cover(bus.outstanding == self._mo)
        # DmaWrite's completion: idle with no beat left to take
        m.d.comb += Assert(~(dut.idle & ~self.valid) | ~owed, "store: idle with a write owed")
        return m
