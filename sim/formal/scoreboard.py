"""The issue stage's scoreboard (hw/core/scoreboard.py): an instruction never issues while its
ranges conflict with one in flight."""

from amaranth.hdl import Assert, Assume, Const, Cover, Module, Signal
from amaranth.lib import data, wiring
from amaranth.lib.wiring import In

from hw.core.decode import Space
from hw.core.scoreboard import ENTRIES, UNIT_CODE, Ranges, Scoreboard
from hw.isa import UNITS

from .axi import no_reset

__all__ = ["ScoreboardHarness", "hazard"]

_Range = data.StructLayout({"en": 1, "space": Space, "lo": 4, "hi": 4})
_Narrow = data.StructLayout({"rd1": _Range, "rd2": _Range, "wr": _Range, "wr2": _Range})


def _overlap(a, b):
    return a.en & b.en & (a.space == b.space) & (a.lo < b.hi) & (b.lo < a.hi)


def hazard(new, old):
    """``new`` must wait for ``old``: it writes what ``old`` reads or writes, or reads what
    ``old`` writes (the specification, written apart from the scoreboard's own)."""
    writes, reads = (new.wr, new.wr2), (new.rd1, new.rd2)
    hit = Const(0, 1)
    for w in writes:
        for o in (old.rd1, old.rd2, old.wr, old.wr2):
            hit = hit | _overlap(w, o)
    for r in reads:
        for o in (old.wr, old.wr2):
            hit = hit | _overlap(r, o)
    return hit


class ScoreboardHarness(wiring.Component):
    """A ``Scoreboard`` of every unit, issued any instructions whenever it has ``room`` (even
    conflicting ones, which hw/core/issue.py holds back: a superset of its behaviours), each
    unit completing its own in order at any time.

    One issued instruction, chosen freely (``pick``), is watched from its issue until its
    unit completes it (the instructions of its unit issued before it first).

    Properties: while the watched instruction is in flight, any instruction that hazards
    against it sees ``conflict``, so it cannot issue; the scoreboard is not ``empty``.
    """

    def __init__(self):
        super().__init__({"ranges": In(_Narrow), "unit": In(range(len(UNITS))), "alloc": In(1),
                          "done": In(len(UNITS)), "pick": In(1)})

    def elaborate(self, platform):
        m = Module()
        m.submodules.dut = dut = Scoreboard(units=UNITS)
        no_reset(m)
        # Bounds of 4 bits (zero extended): the comparisons are the same at any width, and
        # the solver spends its time on the entries' bookkeeping instead of 26-bit orders.
        ranges = Signal(Ranges)
        for name in ("rd1", "rd2", "wr", "wr2"):
            r, f = getattr(ranges, name), getattr(self.ranges, name)
            m.d.comb += [r.en.eq(f.en), r.space.eq(f.space), r.lo.eq(f.lo), r.hi.eq(f.hi)]
        m.d.comb += [dut.ranges.eq(ranges), dut.unit.eq(self.unit), dut.alloc.eq(self.alloc),
                     dut.done.eq(self.done),
                     Assume(self.unit < len(UNITS)),
                     Assume(~self.alloc | dut.room)]
        count = [Signal(range(ENTRIES + 1), name=f"inflight_{u}") for u in UNITS]
        for k, u in enumerate(UNITS):
            mine = self.alloc & (self.unit == UNIT_CODE[u])
            m.d.sync += count[k].eq(count[k] + mine - self.done[k])
            m.d.comb += Assume(~self.done[k] | (count[k] != 0))
        watching = Signal()
        watched = Signal(Ranges)
        w_unit = Signal(range(len(UNITS)))
        ahead = Signal(range(ENTRIES + 1))        # its unit's instructions issued before it
        with m.If(self.alloc & self.pick & ~watching):
            m.d.sync += [watching.eq(1), watched.eq(ranges), w_unit.eq(self.unit)]
            with m.Switch(self.unit):
                for k, u in enumerate(UNITS):
                    with m.Case(UNIT_CODE[u]):
                        m.d.sync += ahead.eq(count[k] - self.done[k])
        with m.Elif(watching & self.done.bit_select(w_unit, 1)):
            with m.If(ahead == 0):
                m.d.sync += watching.eq(0)
            with m.Else():
                m.d.sync += ahead.eq(ahead - 1)
        m.d.comb += [
            Assert(~(watching & hazard(ranges, watched)) | dut.conflict,
                   "scoreboard: a hazard against an instruction in flight not seen"),
            Assert(~watching | ~dut.empty, "scoreboard: empty with an instruction in flight"),
            Cover(watching & dut.conflict & (ahead == 2)),
        ]
        return m
