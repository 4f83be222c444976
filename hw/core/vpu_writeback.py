"""The vector unit's write-back (hw/core/vpu.py): each row of results to where the pass puts
it (VSP rows, XB as fp16, the reduction scratch, or a reduction's word), and with x16 the
same row as fp16 into XB.
"""

from amaranth.hdl import Cat, Const, Module, Signal
from amaranth.lib import memory, wiring
from amaranth.lib.wiring import In, Out

from hw.arith.pipe import delay
from hw.arith.units import Fp32ToFp16

from .cmds import VecCmd
from .vpu_seq import ROW_COUNT_BITS, Target, pass_layout
from .vsp import WritePort

__all__ = ["XbWrite", "VpuWriteback"]


class XbWrite(wiring.Signature):
    """Write port into XB: a row of ``width`` fp16 words with a per-word enable."""

    def __init__(self, row_bits, width):
        super().__init__({"en": Out(1), "row": Out(row_bits), "mask": Out(width),
                          "data": Out(16 * width)})


class VpuWriteback(wiring.Component):
    """Rows of results written where the pass says, in order, the cycle they come out of the
    lanes (the lanes cannot wait: the VSP grants this port first).

    Parameters
    ----------
    lanes, row_bits : int
        The VSP's words per row and row address bits.
    width : int
        fp16 words per XB row.
    xb_row_bits : int
    scratch_rows : int

    Members
    -------
    pas : ``In(pass_layout)``; start : ``In(1)``
        The pass (target, rows); a pass begins (the row counter clears).
    vec : ``In(VecCmd)``
        The instruction (dst, n, x16, xdst).
    valid : ``In(1)``; res : ``In(32 * lanes)``
        A row of results (the lanes').
    w : ``Out(WritePort)``
        VSP writes (rows, or a reduction's word: lane 0 into the lane of dst).
    xb : ``Out(XbWrite)``
        XB writes: CVT16's rows, and x16's copies ``Fp32ToFp16.LATENCY`` cycles after their
        VSP write (XB's port is free then: x16 and CVT16 never share a pass).
    s_w : ``In(memory.WritePort.Signature(...))``
        The reduction scratch's write port.
    drained : ``Out(1)``
        Every row of the pass written, none in the lanes or the x16 converters.
    """

    def __init__(self, *, lanes, row_bits, width, xb_row_bits, scratch_rows):
        self._lanes, self._width = lanes, width
        super().__init__({
            "pas": In(pass_layout(row_bits, lanes)), "start": In(1), "vec": In(VecCmd),
            "valid": In(1), "res": In(32 * lanes),
            "w": Out(WritePort(row_bits, lanes)),
            "xb": Out(XbWrite(xb_row_bits, width)),
            "s_w": In(memory.WritePort.Signature(addr_width=(scratch_rows - 1).bit_length(),
                                                 shape=32 * lanes)),
            "drained": Out(1),
        })

    def elaborate(self, platform):
        m = Module()
        P, W, pas, vec = self._lanes, self._width, self.pas, self.vec
        shift = (P - 1).bit_length()              # word address -> row
        xsh = (W - 1).bit_length()                # XB word address -> row
        results = [self.res[32 * j:32 * (j + 1)] for j in range(P)]
        wi = Signal(ROW_COUNT_BITS)                           # row of the pass written next
        elem_mask = Signal(P)                     # the elements of the row (n may end in it)
        for j in range(P):
            m.d.comb += elem_mask[j].eq((wi != pas.out_rows - 1) | (j < vec.n - (wi << shift)))

        def xb_place(addr):
            """XB row of word ``addr``, and the row's lane mask moved to its place."""
            return addr >> xsh, elem_mask << (addr[0:xsh] if xsh else Const(0, 1))

        with m.If(self.valid):
            m.d.sync += wi.eq(wi + 1)
            with m.Switch(pas.target):
                with m.Case(Target.VSP):
                    m.d.comb += [self.w.req.valid.eq(1),
                                 self.w.req.payload.row.eq((vec.dst >> shift) + wi),
                                 self.w.req.payload.mask.eq(elem_mask),
                                 self.w.req.payload.data.eq(self.res)]
                with m.Case(Target.XB):   # CVT16: P fp16 words at dst + wi * P
                    row, mask = xb_place(vec.dst + (wi << shift))
                    cvt = Cat(*[r[0:16] for r in results])
                    m.d.comb += [self.xb.en.eq(1), self.xb.row.eq(row), self.xb.mask.eq(mask),
                                 self.xb.data.eq(Cat(*([cvt] * (W // P))))]
                with m.Case(Target.SCRATCH):
                    m.d.comb += [self.s_w.en.eq(1), self.s_w.addr.eq(wi), self.s_w.data.eq(self.res)]
                with m.Case(Target.WORD):   # the reduction's word: lane 0 into dst
                    lane = vec.dst[0:max(1, shift)] if P > 1 else Const(0, 1)
                    m.d.comb += [self.w.req.valid.eq(1),
                                 self.w.req.payload.row.eq(vec.dst >> shift),
                                 self.w.req.payload.mask.eq(Const(1, P) << lane),
                                 self.w.req.payload.data.eq(Cat(*([results[0]] * P)))]
        with m.If(self.start):
            m.d.sync += wi.eq(0)

        # x16: the row written to the VSP also goes to XB as fp16, the converters' latency later.
        XL = Fp32ToFp16.LATENCY
        halves = []
        for j in range(P):
            m.submodules[f"xcvt{j}"] = u = Fp32ToFp16()
            m.d.comb += u.a.eq(results[j])
            halves.append(u.o)
        row, mask = xb_place(vec.xdst + (wi << shift))
        x_v = delay(m, self.valid & vec.x16 & (pas.target == Target.VSP), XL, name="x_v")
        x_row = delay(m, row, XL, name="x_row", shape=len(self.xb.row))
        x_mask = delay(m, mask, XL, name="x_mask", shape=W)
        with m.If(x_v[-1]):
            m.d.comb += [self.xb.en.eq(1), self.xb.row.eq(x_row[-1]), self.xb.mask.eq(x_mask[-1]),
                         self.xb.data.eq(Cat(*([Cat(*halves)] * (W // P))))]
        m.d.comb += self.drained.eq((wi == pas.out_rows) & ~self.valid & ~Cat(*x_v).any())
        return m
