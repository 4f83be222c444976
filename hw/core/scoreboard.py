"""The issue stage's scoreboard (hw/core/issue.py): the address ranges of the instructions in
flight, and which of them a new instruction conflicts with.
"""

from amaranth.hdl import Const, Module, Mux, Signal
from amaranth.lib import data, wiring
from amaranth.lib.fifo import SyncFIFO
from amaranth.lib.wiring import In, Out

from hw.isa import UNITS

from .cmds import PC_BITS
from .decode import Range

__all__ = ["ENTRIES", "Ranges", "Scoreboard"]

ENTRIES = 8
UNIT_CODE = {u: i for i, u in enumerate(UNITS)}
# What an instruction reads (rd1, rd2) and writes (wr; wr2: a VEC.x16's XB copy).
Ranges = data.StructLayout({"rd1": Range, "rd2": Range, "wr": Range, "wr2": Range})


def _overlap(a, b):
    return a.en & b.en & (a.space == b.space) & (a.lo < b.hi) & (b.lo < a.hi)


class Scoreboard(wiring.Component):
    """``ENTRIES`` in-flight instructions' ranges; each unit completes its instructions in
    order, so a FIFO per unit holds their entries and a unit's ``done`` frees its oldest.

    A new instruction conflicts with an entry when it would write what the entry reads or
    writes, or read what the entry writes.

    Parameters
    ----------
    units : tuple of str
        The units of the card (``hw.isa.UNITS``, the collective unit only with ring links).

    Members
    -------
    ranges : ``In(Ranges)``
        The instruction waiting to issue.
    conflict : ``Out(1)``
        It conflicts with an entry in flight (combinational).
    unit : ``In(range(len(UNITS)))``
        Its unit (``UNIT_CODE``).
    room : ``Out(1)``
        A free entry, and room in its unit's FIFO.
    alloc : ``In(1)``
        It issues: its ranges take the lowest free entry (from the next cycle on).
    done : ``In(len(units))``
        Per unit of ``units``: its oldest instruction completes (its entry is free next cycle).
    empty : ``Out(1)``
        No instruction in flight.
    pc : ``In(PC_BITS)``
        The pc of the instruction that issues (kept with its entry).
    oldest : ``Out(PC_BITS)``
        The pc of the oldest instruction in flight (registered: one cycle late; the watchdog's
        TIMEOUT names it). pcs rise in issue order within a run, so it is the least.
    """

    def __init__(self, *, units):
        self._units = tuple(units)
        super().__init__({
            "ranges": In(Ranges), "conflict": Out(1),
            "unit": In(range(len(UNITS))), "room": Out(1), "alloc": In(1),
            "done": In(len(self._units)), "empty": Out(1),
            "pc": In(PC_BITS), "oldest": Out(PC_BITS),
        })

    def elaborate(self, platform):
        m = Module()
        new = self.ranges
        ev = Signal(ENTRIES)
        ent = [Signal(Ranges, name=f"ent{i}") for i in range(ENTRIES)]
        conflict = Const(0, 1)
        for i, e in enumerate(ent):
            hit = Const(0, 1)
            for wr in (new.wr, new.wr2):
                hit = (hit | _overlap(wr, e.rd1) | _overlap(wr, e.rd2) | _overlap(wr, e.wr)
                       | _overlap(wr, e.wr2))
            for r in (new.rd1, new.rd2):
                hit = hit | _overlap(r, e.wr) | _overlap(r, e.wr2)
            conflict = conflict | (ev[i] & hit)
        free = Signal(range(ENTRIES))
        for i in reversed(range(ENTRIES)):
            with m.If(~ev[i]):
                m.d.comb += free.eq(i)
        m.d.comb += [self.conflict.eq(conflict), self.empty.eq(~ev.any())]

        # Each unit's entries in issue order; its done frees the oldest.
        clear = Signal(ENTRIES)
        unit_room = Signal()
        for k, u in enumerate(self._units):
            m.submodules[f"order_{u}"] = order = SyncFIFO(width=(ENTRIES - 1).bit_length(),
                                                          depth=ENTRIES)
            mine = self.unit == UNIT_CODE[u]
            m.d.comb += [order.r_en.eq(self.done[k]),
                         order.w_en.eq(self.alloc & mine), order.w_data.eq(free)]
            with m.If(self.done[k]):
                m.d.comb += clear.bit_select(order.r_data, 1).eq(1)
            with m.If(mine):
                m.d.comb += unit_room.eq(order.w_rdy)
        m.d.comb += self.room.eq(~ev.all() & unit_room)

        # Each entry's pc; the least of those in flight, by a tree of comparisons.
        pcs = [Signal(PC_BITS, name=f"pc{i}") for i in range(ENTRIES)]
        level = [(ev[i], pcs[i]) for i in range(ENTRIES)]
        while len(level) > 1:
            nxt = []
            for (va, pa), (vb, pb) in zip(level[0::2], level[1::2], strict=True):
                pick_a = va & (~vb | (pa <= pb))
                nxt.append((va | vb, Mux(pick_a, pa, pb)))
            level = nxt
        m.d.sync += self.oldest.eq(level[0][1])

        with m.If(self.alloc):
            with m.Switch(free):
                for i in range(ENTRIES):
                    with m.Case(i):
                        m.d.sync += [ent[i].eq(new), pcs[i].eq(self.pc)]
            m.d.sync += ev.eq((ev & ~clear) | (Const(1, ENTRIES) << free))
        with m.Else():
            m.d.sync += ev.eq(ev & ~clear)
        return m
