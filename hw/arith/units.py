"""Pipelined floating-point units. Each takes a new input every cycle, has a fixed latency
(``LATENCY``, in cycles from input to registered output) and no handshake: whoever uses a
unit carries the valid bit alongside (see :mod:`hw.arith.pipe`).

Datapath registers have no reset (``reset_less``): a pipeline of values needs none, and
without one Vivado and Yosys can pack delay lines into SRL shift registers.

Bit-exact references: :mod:`sim.ref.arith`. Numerics contract: docs/numerics.md.
"""

from amaranth.hdl import Cat, Const, Module, Mux, Signal, signed
from amaranth.lib import wiring
from amaranth.lib.wiring import In, Out

from .fp import F16_QNAN, F32_QNAN, lzc, round_pack32, unpack16, unpack32

__all__ = ["Fp32Add", "Fp32Mul", "Fp16MulFp32", "Fp16ToFp32", "Fp32ToFp16", "Fp32Max",
           "Int8ToFp16", "UNITS", "fp16_to_fp32_comb"]


class Fp32Add(wiring.Component):
    """binary32 adder, round to nearest even, DAZ/FTZ. Latency 6.

    Stages: (1) unpack, order operands by magnitude; (2) align the smaller with guard, round
    and sticky bits; (3) add or subtract; (4) count leading zeros; (5) normalize; (6) round
    and pack.

    Members
    -------
    a, b : ``In(32)``
    o : ``Out(32)``
    """

    LATENCY = 6
    a: In(32)
    b: In(32)
    o: Out(32)

    def elaborate(self, platform):
        m = Module()
        sa, ea, fa, za, ia, na = unpack32(self.a)
        sb, eb, fb, zb, ib, nb = unpack32(self.b)

        # -- 1: specials, magnitude order (DAZ: a subnormal's magnitude is 0)
        ka = Mux(za, 0, self.a[0:31])
        kb = Mux(zb, 0, self.b[0:31])
        swap = kb > ka
        e_big, e_small = Mux(swap, eb, ea), Mux(swap, ea, eb)
        f_big, f_small = Mux(swap, fb, fa), Mux(swap, fa, fb)
        z_big, z_small = Mux(swap, zb, za), Mux(swap, za, zb)
        s1_sign = Signal(reset_less=True)
        s1_sub = Signal(reset_less=True)
        s1_e = Signal(8, reset_less=True)
        s1_mbig = Signal(24, reset_less=True)
        s1_msmall = Signal(24, reset_less=True)
        s1_d = Signal(5, reset_less=True)
        s1_nan = Signal(reset_less=True)
        s1_inf = Signal(reset_less=True)
        s1_infsign = Signal(reset_less=True)
        s1_bothzero = Signal(reset_less=True)
        s1_zerosign = Signal(reset_less=True)
        diff = e_big - e_small
        m.d.sync += [
            s1_sign.eq(Mux(swap, sb, sa)),
            s1_sub.eq(sa ^ sb),
            s1_e.eq(e_big),
            s1_mbig.eq(Mux(z_big, 0, Cat(f_big, 1))),
            s1_msmall.eq(Mux(z_small, 0, Cat(f_small, 1))),
            s1_d.eq(Mux(diff > 27, 27, diff)),
            s1_nan.eq(na | nb | (ia & ib & (sa != sb))),
            s1_inf.eq(ia | ib),
            s1_infsign.eq(Mux(ia, sa, sb)),
            s1_bothzero.eq(za & zb),
            s1_zerosign.eq(sa & sb),
        ]

        # -- 2: align: 24-bit significand + guard, round, sticky (bits shifted out OR into S)
        wide = Signal(54)
        m.d.comb += wide.eq(Cat(Const(0, 27), Const(0, 3), s1_msmall) >> s1_d)
        s2_small = Signal(27, reset_less=True)
        s2 = _carry(m, s1_sign, s1_sub, s1_e, s1_mbig, s1_nan, s1_inf, s1_infsign, s1_bothzero,
                    s1_zerosign, name="s2")
        m.d.sync += s2_small.eq(Cat(wide[27] | (wide[0:27] != 0), wide[28:54]))

        # -- 3: add or subtract (the big operand is never smaller: no negative results)
        big27 = Cat(Const(0, 3), s2["mbig"])
        s3_sum = Signal(28, reset_less=True)
        m.d.sync += s3_sum.eq(Mux(s2["sub"], big27 - s2_small, big27 + s2_small))
        s3 = _carry(m, *s2.values(), name="s3")

        # -- 4: leading zeros of the 27 bits below the carry
        lz = lzc(m, s3_sum[0:27])
        s4_sum = Signal(28, reset_less=True)
        s4_lz = Signal(5, reset_less=True)
        m.d.sync += [s4_sum.eq(s3_sum), s4_lz.eq(lz)]
        s4 = _carry(m, *s3.values(), name="s4")

        # -- 5: normalize to a leading one at bit 26 (right by one on carry, else left by lz)
        s5_norm = Signal(27, reset_less=True)
        s5_exp = Signal(signed(11), reset_less=True)
        s5_cancel = Signal(reset_less=True)
        with m.If(s4_sum[27]):
            m.d.sync += [s5_norm.eq(Cat(s4_sum[0] | s4_sum[1], s4_sum[2:28])),
                         s5_exp.eq(s4["e"] + 1)]
        with m.Else():
            m.d.sync += [s5_norm.eq((s4_sum[0:27] << s4_lz)[0:27]),
                         s5_exp.eq(s4["e"] - s4_lz)]
        m.d.sync += s5_cancel.eq(s4_sum == 0)
        s5 = _carry(m, *s4.values(), name="s5")

        # -- 6: round and pack. An exact zero sum is +0 (round to nearest even), unless both
        # inputs were zeros: then -0 only if both were -0.
        zero = s5["bothzero"] | s5_cancel
        zsign = Mux(s5["bothzero"], s5["zerosign"], 0)
        packed = round_pack32(
            m, sign=Mux(s5["inf"], s5["infsign"], Mux(zero, zsign, s5["sign"])),
            exp=s5_exp, sig=s5_norm[3:27], guard=s5_norm[2], sticky=s5_norm[1] | s5_norm[0],
            zero=zero & ~s5["inf"], inf=s5["inf"], nan=s5["nan"])
        m.d.sync += self.o.eq(packed)
        return m


def _carry(m, sign, sub, e, mbig, nan, inf, infsign, bothzero, zerosign, *, name):
    """Register the adder's side-band state into the next stage; returns it by name."""
    names = ["sign", "sub", "e", "mbig", "nan", "inf", "infsign", "bothzero", "zerosign"]
    out = {}
    for n, v in zip(names, [sign, sub, e, mbig, nan, inf, infsign, bothzero, zerosign], strict=True):
        r = Signal.like(v, name=f"{name}_{n}", reset_less=True)
        m.d.sync += r.eq(v)
        out[n] = r
    return out


class Fp32Mul(wiring.Component):
    """binary32 multiplier, round to nearest even, DAZ/FTZ. Latency 4.

    Stages: (1) unpack, exponent sum; (2, 3) 24 x 24 product, registered twice so that it
    maps onto cascaded DSP48E2 slices with their pipeline registers; (4) normalize by one
    bit, round and pack.
    """

    LATENCY = 4
    a: In(32)
    b: In(32)
    o: Out(32)

    def elaborate(self, platform):
        m = Module()
        sa, ea, fa, za, ia, na = unpack32(self.a)
        sb, eb, fb, zb, ib, nb = unpack32(self.b)
        s1_ma, s1_mb = Signal(24, reset_less=True), Signal(24, reset_less=True)
        s1_exp = Signal(signed(11), reset_less=True)
        s1_flags = Signal(4, reset_less=True)    # sign, zero, inf, nan
        m.d.sync += [
            s1_ma.eq(Cat(fa, 1)),
            s1_mb.eq(Cat(fb, 1)),
            s1_exp.eq(ea + eb - 127),
            s1_flags.eq(Cat(sa ^ sb, za | zb, ia | ib, na | nb | (ia & zb) | (ib & za))),
        ]
        s2_p = Signal(48, reset_less=True)
        s3_p = Signal(48, reset_less=True)
        s2_exp, s3_exp = Signal(signed(11), reset_less=True), Signal(signed(11), reset_less=True)
        s2_flags, s3_flags = Signal(4, reset_less=True), Signal(4, reset_less=True)
        m.d.sync += [s2_p.eq(s1_ma * s1_mb), s2_exp.eq(s1_exp), s2_flags.eq(s1_flags),
                     s3_p.eq(s2_p), s3_exp.eq(s2_exp), s3_flags.eq(s2_flags)]
        hi = s3_p[47]
        sig = Mux(hi, s3_p[24:48], s3_p[23:47])
        guard = Mux(hi, s3_p[23], s3_p[22])
        sticky = Mux(hi, s3_p[0:23] != 0, s3_p[0:22] != 0)
        sign, zero, inf, nan = s3_flags[0], s3_flags[1], s3_flags[2], s3_flags[3]
        packed = round_pack32(m, sign=sign, exp=s3_exp + hi, sig=sig, guard=guard, sticky=sticky,
                              zero=zero & ~inf, inf=inf, nan=nan)
        m.d.sync += self.o.eq(packed)
        return m


def _norm16(m, e, f, name):
    """fp16 magnitude -> (11-bit significand with leading one at bit 10, unbiased exponent).

    Subnormals are normalized (they are exact in fp32); zero gives significand 0.
    """
    lz = lzc(m, f, name=f"{name}_lz")            # 0..10 leading zeros in the 10-bit fraction
    sig = Signal(11, name=f"{name}_sig")
    exp = Signal(signed(7), name=f"{name}_exp")
    with m.If(e != 0):
        m.d.comb += [sig.eq(Cat(f, 1)), exp.eq(e - 15)]
    with m.Else():
        m.d.comb += [sig.eq((f << (lz + 1))[0:11]), exp.eq(-15 - lz)]
    return sig, exp


class Fp16MulFp32(wiring.Component):
    """fp16 x fp16 -> fp32, exact (no rounding ever happens). Latency 3.

    The matrix unit's multiplier. Stages: (1) unpack, normalize subnormals; (2) 11 x 11
    product; (3) pack. fp16 subnormals are kept (they are exact in fp32).
    """

    LATENCY = 3
    a: In(16)
    b: In(16)
    o: Out(32)

    def elaborate(self, platform):
        m = Module()
        sa, ea, fa, za, ia, na = unpack16(self.a)
        sb, eb, fb, zb, ib, nb = unpack16(self.b)
        siga, expa = _norm16(m, ea, fa, "a")
        sigb, expb = _norm16(m, eb, fb, "b")
        zero_a = za & (fa == 0)
        zero_b = zb & (fb == 0)
        s1_ma, s1_mb = Signal(11, reset_less=True), Signal(11, reset_less=True)
        s1_exp = Signal(signed(8), reset_less=True)
        s1_flags = Signal(4, reset_less=True)
        m.d.sync += [
            s1_ma.eq(siga), s1_mb.eq(sigb), s1_exp.eq(expa + expb),
            s1_flags.eq(Cat(sa ^ sb, zero_a | zero_b, ia | ib,
                            na | nb | (ia & zero_b) | (ib & zero_a))),
        ]
        s2_p = Signal(22, reset_less=True)
        s2_exp = Signal(signed(8), reset_less=True)
        s2_flags = Signal(4, reset_less=True)
        m.d.sync += [s2_p.eq(s1_ma * s1_mb), s2_exp.eq(s1_exp), s2_flags.eq(s1_flags)]
        hi = s2_p[21]
        frac = Mux(hi, Cat(Const(0, 2), s2_p[0:21]), Cat(Const(0, 3), s2_p[0:20]))
        exp = s2_exp + hi + 127
        sign, zero, inf, nan = s2_flags[0], s2_flags[1], s2_flags[2], s2_flags[3]
        with m.If(nan):
            m.d.sync += self.o.eq(F32_QNAN)
        with m.Elif(inf):
            m.d.sync += self.o.eq(Cat(Const(0, 23), Const(0xFF, 8), sign))
        with m.Elif(zero):
            m.d.sync += self.o.eq(Cat(Const(0, 31), sign))
        with m.Else():
            m.d.sync += self.o.eq(Cat(frac, exp[0:8], sign))
        return m


class Fp16ToFp32(wiring.Component):
    """fp16 -> fp32, exact (subnormals normalized). Latency 1."""

    LATENCY = 1
    a: In(16)
    o: Out(32)

    def elaborate(self, platform):
        m = Module()
        m.d.sync += self.o.eq(fp16_to_fp32_comb(m, self.a, "a"))
        return m


def fp16_to_fp32_comb(m, h, name):
    """fp16 bits -> fp32 bits, combinational (exact; canonical NaN)."""
    out = Signal(32, name=f"{name}_f32")
    s, e, f, z, inf, nan = unpack16(h)
    _sig, exp = _norm16(m, e, f, name)
    # The fraction below the leading one (which fp32 leaves implied).
    lz = lzc(m, f, name=f"{name}_flz")
    frac = Mux(e != 0, f, (f << (lz + 1))[0:10])
    with m.If(nan):
        m.d.comb += out.eq(F32_QNAN)
    with m.Elif(inf):
        m.d.comb += out.eq(Cat(Const(0, 23), Const(0xFF, 8), s))
    with m.Elif(z & (f == 0)):
        m.d.comb += out.eq(Cat(Const(0, 31), s))
    with m.Else():
        m.d.comb += out.eq(Cat(Const(0, 13), frac, (exp + 127)[0:8], s))
    return out


class Fp32ToFp16(wiring.Component):
    """fp32 -> fp16, round to nearest even, fp16 subnormals produced, overflow to inf. Latency 2.

    The rounding increment is added to the packed exponent-and-fraction field, so a carry out
    of the fraction moves the exponent (and the largest finite value to infinity) as IEEE
    requires.
    """

    LATENCY = 2
    a: In(32)
    o: Out(16)

    def elaborate(self, platform):
        m = Module()
        s, e, f, z, inf, nan = unpack32(self.a)
        eh = Signal(signed(10))
        m.d.comb += eh.eq(e - 112)                 # fp16 biased exponent if normal
        s1_sign = Signal(reset_less=True)
        s1_sig = Signal(24, reset_less=True)
        s1_eh = Signal(signed(10), reset_less=True)
        s1_shift = Signal(5, reset_less=True)                       # right shift for subnormal results
        s1_kind = Signal(2, reset_less=True)                        # 0 finite, 1 zero, 2 inf, 3 nan
        shift = 14 - eh
        m.d.sync += [
            s1_sign.eq(s), s1_sig.eq(Cat(f, 1)), s1_eh.eq(eh),
            s1_shift.eq(Mux(shift > 25, 25, shift)),
            s1_kind.eq(Mux(nan, 3, Mux(inf | (eh >= 31), 2, Mux(z, 1, 0)))),
        ]
        # Normal: keep 11 bits. Subnormal: shift right first (value in units of 2^-24).
        normal = s1_eh >= 1
        wide = Signal(50)
        m.d.comb += wide.eq(Cat(Const(0, 26), s1_sig) >> s1_shift)
        kept = Mux(normal, s1_sig[13:24], wide[26:37])
        guard = Mux(normal, s1_sig[12], wide[25])
        sticky = Mux(normal, s1_sig[0:12] != 0, wide[0:25] != 0)
        up = guard & (sticky | kept[0])
        field = Mux(normal, Cat(kept[0:10], s1_eh[0:5]), kept)   # exponent:fraction, 15 bits
        with m.Switch(s1_kind):
            with m.Case(3):
                m.d.sync += self.o.eq(F16_QNAN)
            with m.Case(2):
                m.d.sync += self.o.eq(Cat(Const(0x7C00, 15), s1_sign))
            with m.Case(1):
                m.d.sync += self.o.eq(Cat(Const(0, 15), s1_sign))
            with m.Default():
                m.d.sync += self.o.eq(Cat((field + up)[0:15], s1_sign))
        return m


class Fp32Max(wiring.Component):
    """max (or min) of two fp32 values. Latency 1.

    NaN if either input is NaN (canonical); otherwise by IEEE total order, so that
    max(-0, +0) = +0 and min(-0, +0) = -0. Subnormal inputs count as zeros (DAZ).

    Parameters
    ----------
    minimum : bool
        Compute the minimum instead.
    """

    LATENCY = 1
    a: In(32)
    b: In(32)
    o: Out(32)

    def __init__(self, *, minimum=False):
        self.minimum = bool(minimum)
        super().__init__()

    def elaborate(self, platform):
        m = Module()
        sa, ea, fa, za, ia, na = unpack32(self.a)
        sb, eb, fb, zb, ib, nb = unpack32(self.b)
        a = Mux(za, Cat(Const(0, 31), sa), self.a)
        b = Mux(zb, Cat(Const(0, 31), sb), self.b)
        # Total order key: flip all bits of negatives, set the sign bit of positives.
        ka = Mux(a[31], ~a, a | 0x80000000)
        kb = Mux(b[31], ~b, b | 0x80000000)
        a_wins = (ka <= kb) if self.minimum else (ka >= kb)
        with m.If(na | nb):
            m.d.sync += self.o.eq(F32_QNAN)
        with m.Else():
            m.d.sync += self.o.eq(Mux(a_wins, a, b))
        return m


class Int8ToFp16(wiring.Component):
    """int8 -> fp16, exact (|v| <= 128 < 2^11). Latency 1.

    The seam for int8 weights: the matrix unit decodes each int8 weight to fp16 in front of
    its multiplier; the per-row fp16 scale is applied once to the row's fp32 sum.
    """

    LATENCY = 1
    a: In(8)
    o: Out(16)

    def elaborate(self, platform):
        m = Module()
        s = self.a[7]
        mag = Signal(8)
        m.d.comb += mag.eq(Mux(s, -self.a.as_signed(), self.a))   # 128 stays 0x80
        lz = lzc(m, mag)
        msb = Signal(3)            # position of the leading one
        m.d.comb += msb.eq(7 - lz)
        frac = Signal(10)
        m.d.comb += frac.eq((Cat(Const(0, 10), mag) >> msb)[0:10])
        with m.If(mag == 0):
            m.d.sync += self.o.eq(0)
        with m.Else():
            m.d.sync += self.o.eq(Cat(frac, (msb + 15)[0:5], s))
        return m


# name -> (class, input widths, output width): what the tests and `gptfpga synth` iterate over.
UNITS = {
    "fp16_mul_fp32": (Fp16MulFp32, (16, 16), 32),
    "fp32_add": (Fp32Add, (32, 32), 32),
    "fp32_mul": (Fp32Mul, (32, 32), 32),
    "fp16_to_fp32": (Fp16ToFp32, (16,), 32),
    "fp32_to_fp16": (Fp32ToFp16, (32,), 16),
    "fp32_max": (Fp32Max, (32, 32), 32),
    "int8_to_fp16": (Int8ToFp16, (8,), 16),
}
