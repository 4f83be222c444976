"""Amaranth test harnesses: wrappers that let one cocotb clock push many vectors through.

``UnitArray`` puts ``lanes`` copies of a fixed-latency unit side by side and carries a valid
bit down a shift register of the unit's latency, so a test can check that every input
produces its output exactly ``LATENCY`` cycles later, one new input per cycle.
"""

from amaranth.hdl import Module, Signal
from amaranth.lib import wiring
from amaranth.lib.wiring import In, Out

__all__ = ["UnitArray"]


class UnitArray(wiring.Component):
    """``lanes`` instances of ``factory()`` (a unit of ``latency`` cycles), packed operands.

    Members
    -------
    in_valid : In(1)
    in_a, in_b, in_c : In(lanes * input width): lane k in bits [k*w, (k+1)*w) (one for each
        of the unit's inputs ``a``, ``b``, ``c``, as many as ``in_widths``)
    out_valid : Out(1)
    out_o : Out(lanes * output width)
    """

    def __init__(self, factory, latency, lanes, in_widths, out_width):
        self._factory = factory
        self._lanes = lanes
        self._in_widths, self._out_width = in_widths, out_width
        self.latency = latency
        members = {"in_valid": In(1), "out_valid": Out(1), "out_o": Out(lanes * out_width)}
        for name, w in zip("abc", in_widths, strict=False):
            members[f"in_{name}"] = In(lanes * w)
        super().__init__(members)

    def elaborate(self, platform):
        m = Module()
        ow = self._out_width
        for k in range(self._lanes):
            u = self._factory()
            m.submodules[f"lane{k}"] = u
            for name, w in zip("abc", self._in_widths, strict=False):
                m.d.comb += getattr(u, name).eq(getattr(self, f"in_{name}")[k * w:(k + 1) * w])
            m.d.comb += self.out_o[k * ow:(k + 1) * ow].eq(u.o)
        valid = self.in_valid
        for i in range(self.latency):
            r = Signal(name=f"valid{i + 1}")
            m.d.sync += r.eq(valid)
            valid = r
        m.d.comb += self.out_valid.eq(valid)
        return m
