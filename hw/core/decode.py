"""Stage D of the issue stage (hw/core/issue.py): decode an instruction word and evaluate
every check that depends on the instruction alone, in the order the ISS makes them
(sim/ref/iss.py), so that the first failing check gives the same status code; and the address
ranges the instruction reads and writes, for the scoreboard.
"""

from amaranth.hdl import Const, Module, Mux, Signal
from amaranth.lib import data, enum, wiring
from amaranth.lib.wiring import In, Out

from hw.isa import (
    ACC_DEPTH,
    BINARY_VOPS,
    ERROR_CODES,
    INSN_BITS,
    MAX_TOKENS,
    OPCODE_BITS,
    OPCODES,
    QGROUP,
    REDUCE_VOPS,
    VOPS,
)

from .cmds import PC_BITS, MatvecCmd, fields, format_layout
from .coll import ring_ok

__all__ = ["Space", "Range", "KIND", "Decoded", "Decoder"]

E = ERROR_CODES


class Space(enum.Enum, shape=2):
    """The address spaces the scoreboard tracks."""
    VSP = 0             # VSP words
    XB = 1              # XB words
    HBM = 2             # HBM stripe rows


Range = data.StructLayout({"en": 1, "space": Space, "lo": 26, "hi": 26})
# Stage D's instruction kind is its opcode (0, which is illegal, once it has failed a check).
KIND = {"NONE": 0, **OPCODES}

Decoded = data.StructLayout({
    "kind": OPCODE_BITS, "err": 4, "pc": PC_BITS, "word": INSN_BITS,
    "need": MatvecCmd["rb"].width + MatvecCmd["cb"].width,     # MATVEC: tiles it claims (rb cb)
    "add": format_layout("WLOAD")["tiles"].width,              # WLOAD: tiles it streams
    "rd1": Range, "rd2": Range, "wr": Range, "wr2": Range,
})


def _first(pairs):
    """Code of the first true condition of [(cond, code), ...], else 0 (comb)."""
    out = Const(0, 4)
    for cond, code in reversed(pairs):
        out = Mux(cond, code, out)
    return out


def _range(r, space, lo, hi):
    return [r.en.eq(1), r.space.eq(space), r.lo.eq(lo), r.hi.eq(hi)]


class Decoder(wiring.Component):
    """Decode and static checks (combinational).

    Parameters
    ----------
    vector_lanes, lanes, width : int
        The core's (addresses aligned to a VSP row, XB row; a row block's rows).
    stripe_bytes, channel_rows : int
        HBM stripe rows: their bytes and how many.
    vsp_words, xb_words : int
    reduce_max : int
        The longest reduction.
    ring : bool
        A collective unit is part of the card (else COLL is illegal).
    link_words : int
        fp32 words of a link beat (COLL pads to them).
    qrows : int
        MATVEC.i8's tile rows a lane: 2 (an int8 build), 1 (int16), 0 (fp16: MATVEC.i8 is
        BAD_FIELD). The tiles an i8 MATVEC claims beyond rb x cb (a scale row a group) are
        the issue stage's.

    Members
    -------
    word : ``In(INSN_BITS)``; pc : ``In(PC_BITS)``
    fetch_err : ``In(1)``
        The instruction's fetch came back with an error (AXI_ERROR, whatever the word).
    card_reg : ``In(32)``
        The ``card`` register (COLL's checks and extent; with ``ring`` only).
    d : ``Out(Decoded)``
        Kind, first error code (0: none), pc and word; the ranges read (rd1, rd2) and written
        (wr, wr2); the tiles a MATVEC needs or a WLOAD adds.
    """

    def __init__(self, *, vector_lanes, lanes, width, stripe_bytes, vsp_words, xb_words,
                 channel_rows, reduce_max, ring, link_words, qrows=0):
        assert qrows in (0, 1, 2), qrows
        self.P, self.L, self.W, self.S = vector_lanes, lanes, width, stripe_bytes
        self.qrows = qrows
        self.vsp_words, self.xb_words, self.rows = vsp_words, xb_words, channel_rows
        self.red_max, self.ring, self.B = reduce_max, ring, link_words
        super().__init__({
            "word": In(INSN_BITS), "pc": In(PC_BITS), "fetch_err": In(1),
            **({"card_reg": In(32)} if ring else {}),
            "d": Out(Decoded),
        })

    def _misaligned(self, v):
        """``v`` is not a multiple of the VSP row (comb)."""
        pl = (self.P - 1).bit_length()
        return v[0:pl] != 0 if pl else Const(0, 1)

    def elaborate(self, platform):
        m = Module()
        d, w = self.d, self.word
        m.d.comb += [d.pc.eq(self.pc), d.word.eq(w)]
        checks = {"LOAD": self._load, "STORE": self._store, "WLOAD": self._wload,
                  "MATVEC": self._matvec, "VEC": self._vec}
        if self.ring:
            checks["COLL"] = self._coll
        with m.Switch(w[0:OPCODE_BITS]):
            for op in ("HALT", "FENCE"):
                with m.Case(OPCODES[op]):
                    m.d.comb += d.kind.eq(KIND[op])
            for op, check in checks.items():
                with m.Case(OPCODES[op]):
                    m.d.comb += d.kind.eq(KIND[op])
                    check(m, fields(w, op), d)
            with m.Default():
                m.d.comb += [d.kind.eq(KIND["NONE"]), d.err.eq(E["ILLEGAL_OPCODE"])]
        with m.If(self.fetch_err):
            m.d.comb += d.err.eq(E["AXI_ERROR"])
        return m

    def _load(self, m, f, d):
        sl = (self.S - 1).bit_length()
        nrows = ((f.n << Mux(f.f32, 2, 1)) + (self.S - 1)) >> sl
        m.d.comb += d.err.eq(_first([
            (f.n == 0, E["BAD_FIELD"]),
            (self._misaligned(f.vsp), E["ALIGN"]),
            (f.vsp + f.n > self.vsp_words, E["VSP_RANGE"]),
            (f.row + nrows > self.rows, E["HBM_RANGE"]),
        ]))
        m.d.comb += _range(d.rd1, Space.HBM, f.row, f.row + nrows)
        m.d.comb += _range(d.wr, Space.VSP, f.vsp, f.vsp + f.n)

    def _store(self, m, f, d):
        epg = Const(1, 17) << f.lepg
        zl = Mux(f.f32, 2, 1)                 # log2 of the element size
        zmis = (Mux(f.f32, f.off[0:2] != 0, f.off[0])
                | Mux(f.f32, f.gstride[0:2] != 0, f.gstride[0]))
        ngroups = (f.n + epg - 1) >> f.lepg
        nrows = (ngroups + (Const(1, 17) << f.lgpr) - 1) >> f.lgpr
        span = Signal(32)
        m.d.comb += span.eq(((f.gstride << f.lgpr) - f.gstride) + (epg << zl) + f.off)
        last_row = Signal(42)
        m.d.comb += last_row.eq(f.row + (nrows - 1) * f.rstride)
        m.d.comb += d.err.eq(_first([
            ((f.n == 0) | zmis | (span > self.S)
             | ((f.lgpr != 0) & (f.gstride < (epg << zl)))
             | ((nrows > 1) & (f.rstride == 0)), E["BAD_FIELD"]),
            (self._misaligned(f.vsp), E["ALIGN"]),
            (f.vsp + f.n > self.vsp_words, E["VSP_RANGE"]),
            (last_row >= self.rows, E["HBM_RANGE"]),
        ]))
        m.d.comb += _range(d.rd1, Space.VSP, f.vsp, f.vsp + f.n)
        m.d.comb += _range(d.wr, Space.HBM, f.row, last_row + 1)

    def _wload(self, m, f, d):
        m.d.comb += d.err.eq(_first([
            (f.tiles == 0, E["BAD_FIELD"]),
            (f.row + f.tiles > self.rows, E["HBM_RANGE"]),
        ]))
        m.d.comb += _range(d.rd1, Space.HBM, f.row, f.row + f.tiles)
        m.d.comb += d.add.eq(f.tiles)

    def _matvec(self, m, f, d):
        wl = (self.W - 1).bit_length()
        ll = (self.L - 1).bit_length()
        pl = (self.P - 1).bit_length()
        T = f.tokens
        multi = T > 1
        # rows of output: rb row blocks of lanes rows, of 2 x lanes with int8's i8
        rbl = Mux(f.i8, f.rb << (ll + 1), f.rb << ll) if self.qrows == 2 else f.rb << ll
        if self.qrows:  # integer tiles: not transposed; a group's scales fit in a stripe row
            ql = ll + self.qrows - 1       # and in the scale register
            bad_i8 = f.i8 & (f.tt | ((f.group << ql) > self.S) | (f.group > QGROUP))
        else:           # the card computes with fp16 tiles only
            bad_i8 = f.i8
        # the addresses in words (the fields are rows: width XB words, vector_lanes VSP words)
        xb, xstride = f.xb << wl, f.xstride << wl
        dst, dstride, bias = f.dst << pl, f.dstride << pl, f.bias << pl
        dspan = Signal(28)
        m.d.comb += dspan.eq((T - 1) * dstride + rbl)
        xspan = Signal(28)
        m.d.comb += xspan.eq((T - 1) * xstride + (f.cb << wl))
        btok = f.bias_en & f.btok             # a bias per token, at the output's stride
        bias_lo, bias_hi = bias, bias + Mux(btok, dspan, rbl)
        dst_lo, dst_hi = dst, dst + dspan
        m.d.comb += d.err.eq(_first([
            ((f.rb == 0) | (f.cb == 0) | (f.group == 0) | (T == 0) | (T > MAX_TOKENS)
             | (f.group * T > ACC_DEPTH) | (multi & (dstride < rbl))
             | bad_i8, E["BAD_FIELD"]),
            (f.bias_en & ~((~multi | btok) & (f.bias == f.dst))
             & (bias_lo < dst_hi) & (dst_lo < bias_hi), E["OVERLAP"]),
            ((dst_hi > self.vsp_words) | (f.bias_en & (bias_hi > self.vsp_words)), E["VSP_RANGE"]),
            (xb + xspan > self.xb_words, E["XB_RANGE"]),
        ]))
        m.d.comb += _range(d.rd1, Space.XB, xb, xb + xspan)
        with m.If(f.bias_en):
            m.d.comb += _range(d.rd2, Space.VSP, bias_lo, bias_hi)
        m.d.comb += _range(d.wr, Space.VSP, dst_lo, dst_hi)
        m.d.comb += d.need.eq(f.rb * f.cb)

    def _vec(self, m, f, d):
        vop, n, bc, x16 = f.vop, f.n, f.bcast, f.x16
        binary = vop.matches(*BINARY_VOPS)
        red = vop.matches(*REDUCE_VOPS)
        cvt = vop == VOPS["CVT16"][0]
        b_n = Mux(bc, 1, n)
        d_n = Mux(red, 1, n)
        VW, XW, mis = self.vsp_words, self.xb_words, self._misaligned

        def ov(a0, an, b0, bn):
            return (a0 < b0 + bn) & (b0 < a0 + an)
        m.d.comb += d.err.eq(_first([
            (vop >= len(VOPS), E["ILLEGAL_OPCODE"]),
            ((n == 0) | (red & (n > self.red_max)) | (x16 & (red | cvt)), E["BAD_FIELD"]),
            (mis(f.src1) | (binary & ~bc & mis(f.src2)) | (~red & mis(f.dst))
             | (x16 & mis(f.xdst)), E["ALIGN"]),
            (~red & ~cvt & ((ov(f.dst, n, f.src1, n) & (f.dst != f.src1))
                           | (binary & bc & ov(f.dst, n, f.src2, 1))
                           | (binary & ~bc & ov(f.dst, n, f.src2, n) & (f.dst != f.src2))),
             E["OVERLAP"]),
            ((f.src1 + n > VW) | (binary & (f.src2 + b_n > VW))
             | (~cvt & (f.dst + d_n > VW)), E["VSP_RANGE"]),
            ((cvt & (f.dst + n > XW)) | (x16 & (f.xdst + n > XW)), E["XB_RANGE"]),
        ]))
        m.d.comb += _range(d.rd1, Space.VSP, f.src1, f.src1 + n)
        with m.If(binary):
            m.d.comb += _range(d.rd2, Space.VSP, f.src2, f.src2 + b_n)
        m.d.comb += _range(d.wr, Mux(cvt, Space.XB, Space.VSP), f.dst, f.dst + d_n)
        with m.If(x16):
            m.d.comb += _range(d.wr2, Space.XB, f.xdst, f.xdst + n)

    def _coll(self, m, f, d):
        S, sl, card = self.S, (self.S - 1).bit_length(), self.card_reg
        lb = (self.B - 1).bit_length()
        words = ((f.n + (self.B - 1)) >> lb) << lb          # nb beats of B words
        out = Signal(30)
        m.d.comb += out.eq(Mux(f.cop == 0, words * card[8:13], words))
        # with hbm: stripe rows of the input and of the result
        r_in, r_out = Signal(25), Signal(25)
        m.d.comb += [r_in.eq(((f.n << 2) + (S - 1)) >> sl), r_out.eq(((out << 2) + (S - 1)) >> sl)]
        a_n = Mux(f.hbm, r_in, f.n)           # input and result extents
        a_out = Mux(f.hbm, r_out, out)
        mis = self._misaligned
        m.d.comb += d.err.eq(_first([
            (~ring_ok(card) | (f.cop == 3), E["ILLEGAL_OPCODE"]),
            ((f.n == 0) | (f.x16 & (f.hbm | (f.cop != 2))), E["BAD_FIELD"]),
            ((~f.hbm & (mis(f.src) | mis(f.dst))) | (f.x16 & mis(f.xdst)), E["ALIGN"]),
            (~f.hbm & ((f.src + f.n > self.vsp_words) | (f.dst + out > self.vsp_words)),
             E["VSP_RANGE"]),
            (f.hbm & ((f.src + r_in > self.rows) | (f.dst + r_out > self.rows)), E["HBM_RANGE"]),
            (f.x16 & (f.xdst + out > self.xb_words), E["XB_RANGE"]),
            ((f.src != f.dst) & (f.src < f.dst + a_out) & (f.dst < f.src + a_n), E["OVERLAP"]),
        ]))
        space = Mux(f.hbm, Space.HBM, Space.VSP)
        m.d.comb += _range(d.rd1, space, f.src, f.src + a_n)
        m.d.comb += _range(d.wr, space, f.dst, f.dst + a_out)
        with m.If(f.x16):           # (an all-reduce: out is its nb x B words)
            m.d.comb += _range(d.wr2, Space.XB, f.xdst, f.xdst + out)
