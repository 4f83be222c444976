"""The vector unit's operands (hw/core/vpu.py): rows of operand a and b read from the VSP or
the reduction scratch into FIFOs, then fed to the lanes a row per cycle with the identity,
fold, broadcast and sign fix-ups of the pass.
"""

from amaranth.hdl import Cat, Const, Module, Mux, Signal
from amaranth.lib import memory, stream, wiring
from amaranth.lib.wiring import In, Out

from hw.isa import VOPS
from hw.stream import ReadAhead

from .cmds import VecCmd
from .vpu_lanes import NEG_INF, NEG_ZERO, SPECIAL_VOPS
from .vpu_seq import ROW_COUNT_BITS, BMode, pass_layout
from .vsp import ReadPort, word_select

__all__ = ["OperandFetch", "LaneFeed", "b_needed"]

V = {name: code for name, (code, _, _) in VOPS.items()}


def b_needed(pas, is_red, i):
    """Comb: does row ``i`` of the pass read a row of operand b? (A reduction's rows past
    ``in_rows`` take the identity instead.)"""
    return Mux(pas.b_mode == BMode.VSP, Mux(is_red, (i + pas.b_off) < pas.in_rows, 1),
               Mux(pas.b_mode == BMode.SCRATCH, (i + pas.b_off) < pas.in_rows, 0))


class OperandFetch(wiring.Component):
    """Rows of operands a and b into two FIFOs (``hw.stream.ReadAhead``), from the VSP or the
    scratch, as far ahead as the FIFOs have room.

    Parameters
    ----------
    lanes, row_bits : int
        The VSP's words per row and row address bits.
    scratch_rows : int
        Rows of the reduction scratch.

    Members
    -------
    pas : ``In(pass_layout)``; is_red : ``In(1)``
        The pass and whether it is a reduction's.
    running : ``In(1)``; start : ``In(1)``
        A pass is in progress; one begins (the row counters clear).
    r_a, r_b : ``Out(ReadPort)``
        VSP reads (they may wait for the VSP's arbiters).
    s_a, s_b : ``In(memory.ReadPort.Signature(...))``
        The scratch's read ports (synchronous, always granted).
    a, b : ``Out(stream.Signature(32 * lanes))``
        The operand rows in order. Rows of b that a reduction takes as the identity are not
        read and not in ``b``.

    Timing: a row read in cycle t (VSP grant or scratch read) is in its FIFO at t + 1.
    """

    def __init__(self, *, lanes, row_bits, scratch_rows):
        sig = memory.ReadPort.Signature(addr_width=(scratch_rows - 1).bit_length(),
                                        shape=32 * lanes)
        super().__init__({
            "pas": In(pass_layout(row_bits, lanes)), "is_red": In(1),
            "running": In(1), "start": In(1),
            "r_a": Out(ReadPort(row_bits, lanes)), "r_b": Out(ReadPort(row_bits, lanes)),
            "s_a": In(sig), "s_b": In(sig),
            "a": Out(stream.Signature(32 * lanes)), "b": Out(stream.Signature(32 * lanes)),
        })
        self._lanes = lanes

    def elaborate(self, platform):
        m = Module()
        pas = self.pas
        m.submodules.fa = fa = ReadAhead(width=32 * self._lanes)
        m.submodules.fb = fb = ReadAhead(width=32 * self._lanes)
        ri_a = Signal(ROW_COUNT_BITS)
        ri_b = Signal(ROW_COUNT_BITS)
        issue_a = Signal()
        issue_b = Signal()
        can_a = self.running & (ri_a < pas.out_rows) & fa.room
        can_b = self.running & (ri_b < pas.out_rows) & fb.room
        with m.If(pas.a_vsp):
            m.d.comb += [self.r_a.req.valid.eq(can_a), self.r_a.req.payload.eq(pas.a_base + ri_a),
                         issue_a.eq(can_a & self.r_a.req.ready)]
        with m.Else():
            m.d.comb += [self.s_a.addr.eq(ri_a), issue_a.eq(can_a)]
        need_b_read = (pas.b_mode == BMode.VSP) | (pas.b_mode == BMode.SCRATCH)
        with m.If(need_b_read & ~b_needed(pas, self.is_red, ri_b) & can_b):
            m.d.sync += ri_b.eq(ri_b + 1)          # identity row: nothing to read
        with m.Elif(pas.b_mode == BMode.VSP):
            m.d.comb += [self.r_b.req.valid.eq(can_b),
                         self.r_b.req.payload.eq(pas.b_base + ri_b + Mux(self.is_red, pas.b_off, 0)),
                         issue_b.eq(can_b & self.r_b.req.ready)]
        with m.Elif(pas.b_mode == BMode.SCRATCH):
            m.d.comb += [self.s_b.addr.eq(ri_b + pas.b_off), issue_b.eq(can_b)]
        m.d.comb += [self.s_a.en.eq(1), self.s_b.en.eq(1)]
        with m.If(issue_a):
            m.d.sync += ri_a.eq(ri_a + 1)
        with m.If(issue_b):
            m.d.sync += ri_b.eq(ri_b + 1)
        with m.If(self.start):
            m.d.sync += [ri_a.eq(0), ri_b.eq(0)]

        # The rows arrive a cycle after their read: from the VSP or from the scratch.
        out_a = Signal()
        out_b = Signal()
        a_from_vsp = Signal()
        b_from_vsp = Signal()
        m.d.sync += [out_a.eq(issue_a), out_b.eq(issue_b),
                     a_from_vsp.eq(pas.a_vsp), b_from_vsp.eq(pas.b_mode == BMode.VSP)]
        m.d.comb += [
            fa.inflight.eq(out_a), fb.inflight.eq(out_b),
            fa.w.valid.eq(Mux(a_from_vsp, self.r_a.resp.valid, out_a)),
            fa.w.payload.eq(Mux(a_from_vsp, self.r_a.resp.payload, self.s_a.data)),
            fb.w.valid.eq(out_b),
            fb.w.payload.eq(Mux(b_from_vsp, self.r_b.resp.payload, self.s_b.data)),
        ]
        wiring.connect(m, fa.o, wiring.flipped(self.a))
        wiring.connect(m, fb.o, wiring.flipped(self.b))
        return m


class LaneFeed(wiring.Component):
    """A row of operands into the lanes each cycle both operands are there; a row of a special
    operation (EXP, RECIP, RSQRT, GELU) over ``share`` cycles, one phase each, the row popped
    with its last.

    Forms each lane's operands for the pass: a reduction's first pass gives the lanes past
    ``n`` the identity (-0 for a sum, -inf for a max), a fold pairs lane j with lane j + fw/2,
    a broadcast gives every lane ``bval``, SUB flips b's sign; MASK marks the lanes past k.

    Parameters
    ----------
    lanes, row_bits : int
    share : int
        Lanes per special-function unit (``VpuLanes``).

    Members
    -------
    pas : ``In(pass_layout)``; is_red, running, start : ``In(1)``
    vec : ``In(VecCmd)``
        The instruction (vop, n, k).
    bval : ``In(32)``
        The broadcast word.
    a, b : ``In(stream.Signature(32 * lanes))``
        Operand rows (``OperandFetch``); b only where the row needs it.
    feed : ``Out(1)``
        A row (a phase of one) goes into the lanes (both FIFOs popped as needed with a row's
        last phase).
    phase : ``Out(max(1, ceil(log2(share))))``
        The phase ``feed`` carries (0 but for special operations).
    oa, ob : ``Out(32 * lanes)``
        The lanes' operands, combinational on the FIFOs' outputs.
    masked : ``Out(lanes)``
        MASK: the lane's element is past k.
    """

    def __init__(self, *, lanes, row_bits, share=1):
        self._lanes, self._share = lanes, share
        super().__init__({
            "pas": In(pass_layout(row_bits, lanes)), "is_red": In(1), "running": In(1),
            "start": In(1), "vec": In(VecCmd), "bval": In(32),
            "a": In(stream.Signature(32 * lanes)), "b": In(stream.Signature(32 * lanes)),
            "feed": Out(1), "phase": Out(max(1, (share - 1).bit_length())),
            "oa": Out(32 * lanes), "ob": Out(32 * lanes), "masked": Out(lanes),
        })

    def elaborate(self, platform):
        m = Module()
        P, pas, vec = self._lanes, self.pas, self.vec
        lbits = max(1, (P - 1).bit_length())      # bits of a lane index
        S = self._share
        fi = Signal(ROW_COUNT_BITS)                           # row of the pass fed next
        bn = b_needed(pas, self.is_red, fi)
        m.d.comb += self.feed.eq(self.running & (fi < pas.out_rows) & self.a.valid
                                 & (~bn | self.b.valid))
        # A special operation's row stays at the FIFOs' heads for its share phases (unary:
        # operand a only; the phases are consecutive cycles, a.valid staying high).
        last = Signal()
        if S > 1:
            special = Signal()
            m.d.comb += [special.eq(vec.vop.matches(*(V[op] for op in SPECIAL_VOPS))),
                         last.eq(~special | (self.phase == S - 1))]
            with m.If(self.feed & special):
                m.d.sync += self.phase.eq(Mux(self.phase == S - 1, 0, self.phase + 1))
            with m.If(self.start):
                m.d.sync += self.phase.eq(0)
        else:
            m.d.comb += last.eq(1)
        m.d.comb += [self.a.ready.eq(self.feed & last), self.b.ready.eq(self.feed & bn & last)]
        with m.If(self.feed & last):
            m.d.sync += fi.eq(fi + 1)
        with m.If(self.start):
            m.d.sync += fi.eq(0)

        ident = Mux(vec.vop == V["REDMAX"], Const(NEG_INF, 32), Const(NEG_ZERO, 32))
        for j in range(P):
            av = self.a.payload[32 * j:32 * (j + 1)]
            bv = self.b.payload[32 * j:32 * (j + 1)]
            idx_a = Cat(Const(j, lbits), fi)[:32] if P > 1 else fi
            idx_b = Cat(Const(j, lbits), fi + pas.b_off)[:32] if P > 1 else fi + pas.b_off
            a_ok = ~pas.first | (idx_a < vec.n)
            b_ok = bn & (~pas.first | (idx_b < vec.n))
            a_j, b_j = self.oa[32 * j:32 * (j + 1)], self.ob[32 * j:32 * (j + 1)]
            with m.If(pas.fold):
                # Fold: lane j meets lane j + fw/2 of the same row.
                half = pas.fw >> 1
                hi = Signal(32, name=f"hi{j}")
                m.d.comb += hi.eq(word_select(self.a.payload, j + half, 32, P))
                m.d.comb += [a_j.eq(av), b_j.eq(Mux(j < half, hi, ident))]
            with m.Elif(self.is_red):
                m.d.comb += [a_j.eq(Mux(a_ok, av, ident)), b_j.eq(Mux(b_ok, bv, ident))]
            with m.Else():
                bb = Mux(pas.b_mode == BMode.BCAST, self.bval, Mux(pas.b_same, av, bv))
                m.d.comb += [a_j.eq(av), b_j.eq(Mux(vec.vop == V["SUB"], bb ^ NEG_ZERO, bb))]
            m.d.comb += self.masked[j].eq((vec.vop == V["MASK"]) & (idx_a > vec.k))
        return m
