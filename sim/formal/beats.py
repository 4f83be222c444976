"""The collective unit's HBM path (hw/dma/beats.py's HbmBeats): every channel's AXI4 read and
write manager under any runs to read, any beats to write and any AXI timing."""

from amaranth.hdl import Assert, Assume, Cat, Const, Cover, Module
from amaranth.lib import wiring
from amaranth.lib.wiring import In

from hw.dma.beats import BeatWrite, HbmBeats, ReadRun

from .axi import env_of, no_reset, past, read_env, read_manager, write_env, write_manager

__all__ = ["BeatsHarness"]


class BeatsHarness(wiring.Component):
    """``HbmBeats`` of ``channels`` channels with link beats of ``data_bits``: read runs
    (1..run beats within one page, as the collective unit asks) and written beats free, each
    held until taken; channel bases beat aligned, any page offset, constant.

    Properties: each channel's AXI4 read and write manager properties (``max_outstanding``
    bursts per channel and direction); ``w_idle`` only when no write is owed.
    """

    def __init__(self, *, channels=2, hbm_bits=64, data_bits=64, run=4, runs=4, queue=2,
                 max_outstanding=4):
        self._p = dict(channels=channels, hbm_bits=hbm_bits, data_bits=data_bits, run=run,
                       runs=runs, queue=queue)
        self._mo = max_outstanding
        members = {"rd_valid": In(1), "rd": In(ReadRun), "wr_valid": In(1),
                   "wr": In(BeatWrite(data_bits))}
        for c in range(channels):
            members[f"ptr{c}"] = In(64)
            members.update({f"r{c}_{n}": v for n, v in read_env(hbm_bits).items()})
            members.update({f"w{c}_{n}": v for n, v in write_env().items()})
        super().__init__(members)

    def _held_input(self, m, valid, ready, payload, name):
        """A stream source: held until taken, payload unchanged."""
        was = past(m, valid & ~ready, f"{name}_held")
        before = past(m, payload, f"{name}_was")
        with m.If(was):
            m.d.comb += [Assume(valid), Assume(payload.as_value() == before)]

    def elaborate(self, platform):
        m = Module()
        p, C = self._p, self._p["channels"]
        m.submodules.dut = dut = HbmBeats(**p, max_outstanding=self._mo)
        no_reset(m)
        m.d.comb += [dut.rd.req.valid.eq(self.rd_valid), dut.rd.req.payload.eq(self.rd),
                     dut.wr.valid.eq(self.wr_valid), dut.wr.payload.eq(self.wr)]
        self._held_input(m, self.rd_valid, dut.rd.req.ready, self.rd, "rd")
        self._held_input(m, self.wr_valid, dut.wr.ready, self.wr, "wr")
        lpb = (dut.page_beats - 1).bit_length()
        last = self.rd.beat + self.rd.len - 1
        m.d.comb += [Assume((self.rd.len >= 1) & (self.rd.len <= p["run"])),
                     Assume((self.rd.beat >> lpb) == (last >> lpb)), Assume(last[32] == 0)]
        started = past(m, Const(1, 1), "started")
        ptrs = [getattr(self, f"ptr{c}") for c in range(C)]
        ptrs_was = past(m, ptrs, "ptrs_was")
        with m.If(started):
            m.d.comb += Assume(ptrs_was == Cat(*ptrs))
        bb = p["hbm_bits"] // 8
        owed = Const(0, 1)
        for c in range(C):
            m.d.comb += [getattr(dut, f"ptr_{c}").eq(ptrs[c]),
                         Assume(ptrs[c][:(bb - 1).bit_length()] == 0)]
            kw = dict(beat_bytes=bb, max_burst=p["run"], max_outstanding=self._mo)
            rbus = read_manager(m, getattr(dut, f"axi_r_{c}"), env_of(self, f"r{c}_", read_env(0)),
                                name=f"ar{c}", **kw)
            wbus = write_manager(m, getattr(dut, f"axi_w_{c}"), env_of(self, f"w{c}_", write_env()),
                                 name=f"aw{c}", **kw)
            owed = owed | (wbus.outstanding != 0)
            m.d.comb += [Cover(rbus.ar & (getattr(dut, f"axi_r_{c}").araddr[:12] != 0)),
                         Cover(wbus.owed != 0)]
        m.d.comb += Assert(~(dut.w_idle & ~self.wr_valid) | ~owed, "beats: idle with a write owed")
        return m
