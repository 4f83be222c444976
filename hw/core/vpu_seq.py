"""The vector unit's sequencer: an instruction as a plan of passes (hw/core/vpu.py).

A *pass* reads rows of operand a (and b), pushes them through the lanes and writes the
results; its parameters are one register, ``Pass``, that the other parts of the unit read.
Elementwise operations are one pass; a reduction is row-halving passes (VSP to the scratch,
then scratch to scratch) followed by lane folds, as docs/isa.md defines them.
"""

from amaranth.hdl import Const, Module, Mux, Signal
from amaranth.lib import data, enum, stream, wiring
from amaranth.lib.wiring import In, Out

from hw.isa import ADDR_BITS, BINARY_VOPS, REDUCE_VOPS, VOPS

from .cmds import VecCmd
from .vpu_lanes import TYPE_CODE, VOP_TYPE
from .vsp import ReadPort, word_select

__all__ = ["BMode", "Target", "pass_layout", "VpuSequencer"]

# rows of a pass: up to 2^ADDR_BITS - 1 elements, one a row at vector_lanes = 1
ROW_COUNT_BITS = ADDR_BITS + 1

V = {name: code for name, (code, _, _) in VOPS.items()}


class BMode(enum.Enum, shape=2):
    """Where a pass's operand b comes from."""
    NONE = 0            # no operand b
    VSP = 1             # VSP rows
    SCRATCH = 2         # the reduction scratch's rows
    BCAST = 3           # one word (``bval``) for every element


class Target(enum.Enum, shape=2):
    """Where a pass's results go."""
    VSP = 0             # VSP rows from dst
    XB = 1              # fp16 rows into XB from dst (CVT16)
    SCRATCH = 2         # scratch rows (a reduction's intermediate passes)
    WORD = 3            # lane 0 into the VSP word dst (a reduction's result)


def pass_layout(row_bits, lanes):
    """The pass register: operand sources and row counts, reduction flags, the target."""
    return data.StructLayout({
        "a_vsp": 1,                 # operand a from the VSP (else the scratch)
        "a_base": row_bits,
        "b_mode": BMode,
        "b_same": 1,                # b is a (src2 == src1): read once, not twice from a segment
        "b_base": row_bits,
        "b_off": ROW_COUNT_BITS,                # reductions: b row = i + b_off
        "in_rows": ROW_COUNT_BITS,
        "out_rows": ROW_COUNT_BITS,
        "first": 1,                 # first reduction pass: lanes beyond n are the identity
        "fold": 1,                  # lane fold pass
        "fw": range(lanes + 1),     # fold: lanes valid in the row
        "final": 1,                 # this pass writes the reduction result to dst
        "target": Target,
    })


class VpuSequencer(wiring.Component):
    """One vector instruction at a time, as passes.

    Parameters
    ----------
    lanes : int
        Words per VSP row.
    row_bits : int
        VSP row address bits.

    Members
    -------
    cmd : ``In(stream.Signature(VecCmd))``
        Taken when idle.
    vec : ``Out(VecCmd)``
        The instruction in progress (registered when taken).
    utype : ``Out(range(len(UNIT_TYPES)))``
        Its unit type (``TYPE_CODE``), registered.
    is_red : ``Out(1)``
        It is a reduction, registered.
    pas : ``Out(pass_layout(row_bits, lanes))``
        The pass in progress, loaded as ``start`` pulses.
    start : ``Out(1)``
        A pass begins: its parameters load (they are valid from the next cycle on), the row
        counters of the other parts clear.
    running : ``Out(1)``
        A pass is in progress (from the cycle after ``start``).
    bval : ``Out(32)``
        The broadcast word (BCAST: read before the pass).
    bc : ``Out(ReadPort)``
        The broadcast word's read (the vector unit puts it on operand b's VSP port).
    drained : ``In(1)``
        Every row of the pass written and nothing left in the lanes (the write-back's).
    done : ``Out(1)``
        Pulse as the instruction's last pass ends.
    busy : ``Out(1)``
    """

    def __init__(self, *, lanes, row_bits):
        self._lanes, self._row_bits = lanes, row_bits
        super().__init__({
            "cmd": In(stream.Signature(VecCmd)),
            "vec": Out(VecCmd), "utype": Out(range(len(TYPE_CODE))), "is_red": Out(1),
            "pas": Out(pass_layout(row_bits, lanes)), "start": Out(1), "running": Out(1),
            "bval": Out(32),
            "bc": Out(ReadPort(row_bits, lanes)),
            "drained": In(1),
            "done": Out(1), "busy": Out(1),
        })

    def _start(self, m, plan):
        """Begin a pass with the parameters ``plan``."""
        m.d.sync += [getattr(self.pas, k).eq(v) for k, v in plan.items()]
        m.d.sync += self.running.eq(1)
        m.d.comb += self.start.eq(1)

    def _finish(self, m):
        m.d.sync += self.running.eq(0)
        m.d.comb += self.done.eq(1)

    def elaborate(self, platform):
        m = Module()
        P = self._lanes
        shift = (P - 1).bit_length()              # word address -> row
        lbits = max(1, (P - 1).bit_length())      # bits of a lane index
        c, vec, pas = self.cmd.payload, self.vec, self.pas
        pass_done = self.running & self.drained
        rows_left = Signal(ROW_COUNT_BITS)      # rows in the scratch after the last row pass
        bc_wait = Signal()          # broadcast word requested, data next
        m.d.comb += self.busy.eq(self.running | self.cmd.valid)

        with m.FSM():
            with m.State("IDLE"):
                m.d.comb += self.cmd.ready.eq(1)
                with m.If(self.cmd.valid):
                    m.d.sync += [vec.eq(c), self.is_red.eq(c.vop.matches(*REDUCE_VOPS))]
                    with m.Switch(c.vop):
                        for name, t in VOP_TYPE.items():
                            with m.Case(V[name]):
                                m.d.sync += self.utype.eq(TYPE_CODE[t])
                    with m.If(c.vop.matches(*REDUCE_VOPS)):
                        plan = _first_halving(c, P)
                        self._start(m, plan)
                        m.d.sync += rows_left.eq(plan["out_rows"])
                        m.next = "RED"
                    with m.Elif(c.vop.matches(*BINARY_VOPS) & c.bcast):
                        m.next = "BCAST"
                    with m.Else():
                        self._start(m, _elementwise(c, P))
                        m.next = "ELEM"
            with m.State("BCAST"):
                # Read the broadcast word (its own request; the b FIFO is not involved), then
                # run the elementwise pass.
                with m.If(~bc_wait):
                    m.d.comb += [self.bc.req.valid.eq(1), self.bc.req.payload.eq(vec.src2 >> shift)]
                    with m.If(self.bc.req.ready):
                        m.d.sync += bc_wait.eq(1)
                with m.If(bc_wait & self.bc.resp.valid):
                    m.d.sync += bc_wait.eq(0)
                    lane = vec.src2[0:lbits] if P > 1 else Const(0, 1)
                    m.d.sync += self.bval.eq(word_select(self.bc.resp.payload, lane, 32, P))
                    self._start(m, _broadcast(vec, P))
                    m.next = "ELEM"
            with m.State("ELEM"):
                with m.If(pass_done):
                    self._finish(m)
                    m.next = "IDLE"
            with m.State("RED"):
                with m.If(pass_done):
                    with m.If(pas.final):
                        self._finish(m)
                        m.next = "IDLE"
                    with m.Elif(rows_left > 1):
                        plan = _next_halving(rows_left, P)
                        self._start(m, plan)
                        m.d.sync += rows_left.eq(plan["out_rows"])
                    with m.Else():
                        self._start(m, _fold(pas, P))
        return m


# The passes' parameters (every field of the pass register).

def _elementwise(c, P):
    """One pass over the VSP rows of src1 (and src2), to dst (XB for CVT16)."""
    shift = (P - 1).bit_length()
    nrows = (c.n + (P - 1)) >> shift
    binary = c.vop.matches(*BINARY_VOPS)
    same = binary & (c.src2 == c.src1)
    return dict(a_vsp=1, a_base=c.src1 >> shift, b_same=same,
                b_mode=Mux(binary & ~same, BMode.VSP, BMode.NONE), b_base=c.src2 >> shift,
                b_off=0, in_rows=nrows, out_rows=nrows, first=0, fold=0, fw=P, final=0,
                target=Mux(c.vop == V["CVT16"], Target.XB, Target.VSP))


def _broadcast(c, P):
    """The elementwise pass with operand b the broadcast word."""
    shift = (P - 1).bit_length()
    nrows = (c.n + (P - 1)) >> shift
    return dict(a_vsp=1, a_base=c.src1 >> shift, b_same=0, b_mode=BMode.BCAST, b_base=0, b_off=0,
                in_rows=nrows, out_rows=nrows, first=0, fold=0, fw=P, final=0, target=Target.VSP)


def _first_halving(c, P):
    """A reduction's first pass: row i + h onto row i of src1's rows, into the scratch (or,
    with one lane and one row left, the result)."""
    shift = (P - 1).bit_length()
    nrows = (c.n + (P - 1)) >> shift
    h = (nrows + 1) >> 1
    last = (h == 1) & (P == 1)
    return dict(a_vsp=1, a_base=c.src1 >> shift, b_same=0, b_mode=BMode.VSP,
                b_base=c.src1 >> shift, b_off=h, in_rows=nrows, out_rows=h, first=1, fold=0,
                fw=P, final=last, target=Mux(last, Target.WORD, Target.SCRATCH))


def _next_halving(rows, P):
    """Another row-halving pass, scratch to scratch."""
    h = (rows + 1) >> 1
    last = (h == 1) & (P == 1)
    return dict(a_vsp=0, a_base=0, b_same=0, b_mode=BMode.SCRATCH, b_base=0, b_off=h,
                in_rows=rows, out_rows=h, first=0, fold=0, fw=P, final=last,
                target=Mux(last, Target.WORD, Target.SCRATCH))


def _fold(pas, P):
    """The lane folds of the last row: width P, P/2, ..., 2 (the last writes the result)."""
    fw = Mux(pas.fold, pas.fw >> 1, P)
    return dict(a_vsp=0, a_base=0, b_same=0, b_mode=BMode.NONE, b_base=0, b_off=0, in_rows=1,
                out_rows=1, first=0, fold=1, fw=fw, final=fw == 2,
                target=Mux(fw == 2, Target.WORD, Target.SCRATCH))
