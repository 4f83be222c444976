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

__all__ = ["NEG_ZERO", "NEG_INF", "UNIT_TYPES", "TYPE_CODE", "VOP_TYPE", "SPECIAL_TYPES",
           "SPECIAL_VOPS", "VpuLane", "SpecialLane", "VpuLanes"]

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


# The cheap units every lane has, and the special-function units that ``share`` lanes take
# turns on (docs/performance.md: a row of EXP, RECIP, RSQRT or GELU takes ``share`` cycles).
SPECIAL_TYPES = ("EXP", "RECIP", "RSQRT", "GELU")
LANE_UNITS = {t: u for t, u in UNITS.items() if t not in SPECIAL_TYPES}
SPECIAL_UNITS = {t: u for t, u in UNITS.items() if t in SPECIAL_TYPES}
SPECIAL_VOPS = tuple(op for op, t in VOP_TYPE.items() if t in SPECIAL_TYPES)


def _select(m, utype, outs, o):
    """``o`` = the output of the unit type ``utype`` names, among ``outs`` (others: 0)."""
    with m.Switch(utype):
        for t, code in TYPE_CODE.items():
            if t in outs:
                with m.Case(code):
                    m.d.comb += o.eq(outs[t])


class VpuLane(wiring.Component):
    """One lane's own units (ADD, MUL, MAX, CVT, PASS): all fed ``a`` (and ``b``) every cycle,
    the result chosen by type.

    Units have no enable: a result is the unit's output at its latency (``UNIT_TYPES``) after
    the operands; PASS is one register (``a``, or -inf where ``masked``).

    Members
    -------
    a, b : ``In(32)``
        Operands.
    masked : ``In(1)``
        PASS gives -inf instead of ``a`` (MASK past k).
    utype : ``In(range(len(UNIT_TYPES)))``
        The unit whose output is ``o`` (``TYPE_CODE``; a special type gives 0 here).
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
        outs = {}
        for t, cls in LANE_UNITS.items():
            m.submodules[t.lower()] = u = cls()
            m.d.comb += u.a.eq(self.a)
            if hasattr(u, "b"):
                m.d.comb += u.b.eq(self.b)
            outs[t] = u.o
        outs["PASS"] = Signal(32, name="pass", reset_less=True)
        m.d.sync += outs["PASS"].eq(Mux(self.masked, NEG_INF, self.a))
        _select(m, self.utype, outs, self.o)
        return m


class SpecialLane(wiring.Component):
    """The special-function units (EXP, RECIP, RSQRT, and GELU on those two), fed ``a`` every
    cycle, the result chosen by type.

    GELU has no unit of its own: its polynomial front feeds the EXP unit and its ``+ 1`` the
    RECIP unit while ``utype`` is GELU (the sequencer drains the lanes between passes, so a
    pass has the units to itself); same operations, same stages as
    :class:`hw.arith.special.Gelu`, for about half its LUTs.

    Members
    -------
    a : ``In(32)``
    utype : ``In(range(len(UNIT_TYPES)))``
    o : ``Out(32)``
        The chosen unit's output (a lane type gives 0 here).
    """

    utype: In(range(len(UNIT_TYPES)))
    a: In(32)
    o: Out(32)

    def elaborate(self, platform):
        m = Module()
        outs, units = {}, {}
        for t, cls in SPECIAL_UNITS.items():
            m.submodules[t.lower()] = u = units[t] = cls()
            if t not in ("EXP", "RECIP"):
                m.d.comb += u.a.eq(self.a)
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
        _select(m, self.utype, outs, self.o)
        return m


class VpuLanes(wiring.Component):
    """``lanes`` lanes side by side, ``lanes / share`` special-function units among them, and
    when their results are valid.

    A row of a special type (``SPECIAL_TYPES``) goes in over ``share`` consecutive cycles,
    ``phase`` 0, 1, ...: in phase h special unit q takes lane ``h * lanes / share + q``'s
    operand. Its results leave the units over ``share`` consecutive cycles too; all but the
    last phase's wait in delay lines (no enable: the phases are consecutive), so the row
    comes out whole with the last. Every other type takes a row a cycle.

    Parameters
    ----------
    lanes : int
    share : int
        Lanes per special-function unit (a divisor of ``lanes``).

    Members
    -------
    feed : ``In(1)``
        A row of operands (a phase of one, for a special type) enters the lanes.
    phase : ``In(max(1, ceil(log2(share))))``
        Which phase of the row ``feed`` carries (0 for the other types).
    utype : ``In(range(len(UNIT_TYPES)))``
    a, b : ``In(32 * lanes)``
        The rows of operands, lane j in bits ``[32 j, 32 j + 32)``.
    masked : ``In(lanes)``
        Per lane: PASS gives -inf.
    o : ``Out(32 * lanes)``
        The row of results.
    valid : ``Out(1)``
        ``o`` is a row's results: ``feed`` (of a special row, its last phase) delayed by the
        type's latency (one chain of registers per type, only the current type's carrying
        valids).
    """

    def __init__(self, *, lanes, share=1):
        if share < 1 or lanes % share:
            raise ValueError(f"share: got {share}; allowed: a divisor of lanes ({lanes})")
        self._lanes, self._share = lanes, share
        super().__init__({
            "feed": In(1), "phase": In(max(1, (share - 1).bit_length())), "utype": In(range(len(UNIT_TYPES))),
            "a": In(32 * lanes), "b": In(32 * lanes), "masked": In(lanes),
            "o": Out(32 * lanes), "valid": Out(1),
        })

    def elaborate(self, platform):
        m = Module()
        P, S = self._lanes, self._share
        Q = P // S

        def word(x, j):
            return x[32 * j:32 * (j + 1)]

        lane_o = []
        for j in range(P):
            m.submodules[f"lane{j}"] = lane = VpuLane()
            m.d.comb += [lane.utype.eq(self.utype), lane.a.eq(word(self.a, j)),
                         lane.b.eq(word(self.b, j)), lane.masked.eq(self.masked[j])]
            lane_o.append(lane.o)
        # Special unit q's results by phase: phase h's (lanes h Q + q) leave S - 1 - h
        # cycles before the last phase's.
        spec_o = [None] * P
        for q in range(Q):
            m.submodules[f"spec{q}"] = spec = SpecialLane()
            if S == 1:
                m.d.comb += spec.a.eq(word(self.a, q))
            else:
                with m.Switch(self.phase):
                    for h in range(S):
                        with m.Case(h):
                            m.d.comb += spec.a.eq(word(self.a, h * Q + q))
            m.d.comb += spec.utype.eq(self.utype)
            for h in range(S):
                late = delay(m, spec.o, S - 1 - h, name=f"spec{q}_ph{h}_", reset_less=True)
                spec_o[h * Q + q] = late[-1] if late else spec.o
        special = Signal(name="special_type")
        m.d.comb += special.eq(Cat(*(self.utype == TYPE_CODE[t] for t in SPECIAL_TYPES)).any())
        for j in range(P):
            m.d.comb += word(self.o, j).eq(Mux(special, spec_o[j], lane_o[j]))
        last = self.phase == S - 1 if S > 1 else 1
        ends = [delay(m, self.feed & (self.utype == TYPE_CODE[t])
                      & (last if t in SPECIAL_TYPES else 1), lat, name=f"v_{t.lower()}")[-1]
                for t, lat in UNIT_TYPES.items()]
        m.d.comb += self.valid.eq(Cat(*ends).any())
        return m
