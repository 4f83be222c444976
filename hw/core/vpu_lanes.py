"""The vector unit's lanes: every functional unit of a lane fed the same operands each cycle,
the result picked by the instruction's unit type, and when that result comes out
(hw/core/vpu.py).
"""

from amaranth.hdl import Cat, Module, Mux, Signal
from amaranth.lib import wiring
from amaranth.lib.wiring import In, Out

from hw.arith.pipe import Node, Pipeline, delay
from hw.arith.special import Exp, Gelu, Recip, Rsqrt, build_gelu
from hw.arith.units import Fp32Add, Fp32Max, Fp32Mul, Fp32ToFp16
from hw.isa import VOPS

__all__ = ["NEG_ZERO", "NEG_INF", "UNIT_TYPES", "TYPE_CODE", "VOP_TYPE", "VpuLane", "VpuLanes"]

NEG_ZERO = 0x80000000
NEG_INF = 0xFF800000

# The functional units of a lane by type (PASS: MOV and MASK, one register; GELU: its own
# front and back around the lane's EXP and RECIP units).
UNITS = {"ADD": Fp32Add, "MUL": Fp32Mul, "MAX": Fp32Max, "EXP": Exp, "RECIP": Recip,
         "RSQRT": Rsqrt, "CVT": Fp32ToFp16}
# Unit types and their latencies; a type's code is its place here.
UNIT_TYPES = {
    "ADD": Fp32Add.LATENCY, "MUL": Fp32Mul.LATENCY, "MAX": Fp32Max.LATENCY, "PASS": 1,
    "EXP": Exp.LATENCY, "RECIP": Recip.LATENCY, "RSQRT": Rsqrt.LATENCY, "GELU": Gelu.LATENCY,
    "CVT": Fp32ToFp16.LATENCY,
}
TYPE_CODE = {t: i for i, t in enumerate(UNIT_TYPES)}
# The unit type that computes each operation of the ISA.
VOP_TYPE = {"ADD": "ADD", "SUB": "ADD", "MUL": "MUL", "MAX": "MAX", "MOV": "PASS", "MASK": "PASS",
            "EXP": "EXP", "RECIP": "RECIP", "RSQRT": "RSQRT", "GELU": "GELU", "CVT16": "CVT",
            "REDSUM": "ADD", "REDMAX": "MAX"}
assert set(VOP_TYPE) == set(VOPS), "every vector operation of hw/isa.py needs a unit type"


class VpuLane(wiring.Component):
    """One lane: all its units fed ``a`` (and ``b``) every cycle, the result chosen by type.

    Units have no enable: a result is the unit's output at its latency (``UNIT_TYPES``) after
    the operands; PASS is one register (``a``, or -inf where ``masked``). GELU has no unit of
    its own: its polynomial front feeds the EXP unit and its ``+ 1`` the RECIP unit while
    ``utype`` is GELU (the sequencer drains the lanes between passes, so a pass has the
    lane's units to itself); same operations, same stages as :class:`hw.arith.special.Gelu`,
    for about half its LUTs.

    Members
    -------
    a, b : ``In(32)``
        Operands.
    masked : ``In(1)``
        PASS gives -inf instead of ``a`` (MASK past k).
    utype : ``In(range(len(UNIT_TYPES)))``
        The unit whose output is ``o`` (``TYPE_CODE``).
    o : ``Out(32)``
        The chosen unit's output (combinational on the units' output registers).
    """

    utype: In(range(len(UNIT_TYPES)))
    a: In(32)
    b: In(32)
    masked: In(1)
    o: Out(32)

    def elaborate(self, platform):
        m = Module()
        outs, units = {}, {}
        for t, cls in UNITS.items():
            m.submodules[t.lower()] = u = units[t] = cls()
            if t not in ("EXP", "RECIP"):
                m.d.comb += u.a.eq(self.a)
            if hasattr(u, "b"):
                m.d.comb += u.b.eq(self.b)
            outs[t] = u.o
        gelu = Signal(name="gelu_pass")
        m.d.comb += gelu.eq(self.utype == TYPE_CODE["GELU"])

        def shared(t):
            def build(p, node):
                u = units[t]
                m.d.comb += u.a.eq(Mux(gelu, p.at(node, node.stage), self.a))
                return Node(u.o, node.stage + u.LATENCY)
            return build

        p = Pipeline(m, name="gelu")
        out = build_gelu(p, p.input(self.a), exp=shared("EXP"), recip=shared("RECIP"))
        assert out.stage == Gelu.LATENCY, (out.stage, Gelu.LATENCY)
        outs["GELU"] = out.value
        outs["PASS"] = Signal(32, name="pass", reset_less=True)
        m.d.sync += outs["PASS"].eq(Mux(self.masked, NEG_INF, self.a))
        with m.Switch(self.utype):
            for t, code in TYPE_CODE.items():
                with m.Case(code):
                    m.d.comb += self.o.eq(outs[t])
        return m


class VpuLanes(wiring.Component):
    """``lanes`` lanes side by side, and when their results are valid.

    Parameters
    ----------
    lanes : int

    Members
    -------
    feed : ``In(1)``
        A row of operands enters the lanes.
    utype : ``In(range(len(UNIT_TYPES)))``
    a, b : ``In(32 * lanes)``
        The rows of operands, lane j in bits ``[32 j, 32 j + 32)``.
    masked : ``In(lanes)``
        Per lane: PASS gives -inf.
    o : ``Out(32 * lanes)``
        The row of results.
    valid : ``Out(1)``
        ``o`` is a row's results: ``feed`` delayed by the type's latency (one chain of
        registers per type, only the current type's carrying valids).
    """

    def __init__(self, *, lanes):
        self._lanes = lanes
        super().__init__({
            "feed": In(1), "utype": In(range(len(UNIT_TYPES))),
            "a": In(32 * lanes), "b": In(32 * lanes), "masked": In(lanes),
            "o": Out(32 * lanes), "valid": Out(1),
        })

    def elaborate(self, platform):
        m = Module()
        for j in range(self._lanes):
            m.submodules[f"lane{j}"] = lane = VpuLane()
            word = slice(32 * j, 32 * (j + 1))
            m.d.comb += [lane.utype.eq(self.utype), lane.a.eq(self.a[word]),
                         lane.b.eq(self.b[word]), lane.masked.eq(self.masked[j]),
                         self.o[word].eq(lane.o)]
        ends = [delay(m, self.feed & (self.utype == TYPE_CODE[t]), lat, name=f"v_{t.lower()}")[-1]
                for t, lat in UNIT_TYPES.items()]
        m.d.comb += self.valid.eq(Cat(*ends).any())
        return m
