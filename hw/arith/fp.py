"""Combinational building blocks shared by the floating-point units.

Formats are IEEE binary16 and binary32 as raw bit vectors. Policy (docs/numerics.md): fp32
inputs that are subnormal count as zero (DAZ); an fp32 result whose correctly rounded IEEE
value is subnormal becomes zero (FTZ after rounding); NaN results are canonical.
"""

from amaranth.hdl import Cat, Const, Mux, Signal, signed

__all__ = ["F32_QNAN", "F16_QNAN", "lzc", "round_pack32", "unpack32", "unpack16"]

F32_QNAN = 0x7FC00000
F16_QNAN = 0x7E00


def lzc(m, value, *, name="lz"):
    """Leading-zero count of ``value`` (``len(value)`` when it is zero), as a comb signal."""
    width = len(value)
    cnt = Signal(range(width + 1), name=name)
    m.d.comb += cnt.eq(width)
    # Later assignments win: scanning up from bit 0 leaves the highest set bit's count.
    for i in range(width):
        with m.If(value[i]):
            m.d.comb += cnt.eq(width - 1 - i)
    return cnt


def unpack32(x):
    """(sign, exponent, fraction, is_zero_or_subnormal, is_inf, is_nan) of an fp32 vector."""
    s, e, f = x[31], x[23:31], x[0:23]
    return s, e, f, e == 0, (e == 0xFF) & (f == 0), (e == 0xFF) & (f != 0)


def unpack16(x):
    s, e, f = x[15], x[10:15], x[0:10]
    return s, e, f, e == 0, (e == 0x1F) & (f == 0), (e == 0x1F) & (f != 0)


def round_pack32(m, *, sign, exp, sig, guard, sticky, zero, inf, nan, name="rp"):
    """Round to nearest even and pack a binary32, with FTZ after rounding.

    ``sig`` is a 24-bit significand with its leading one at bit 23, worth
    ``sig * 2^(exp - 150)`` (``exp`` the biased exponent, a signed value that may be <= 0 or
    >= 255). ``guard`` is the next bit below, ``sticky`` the OR of all bits below that.

    IEEE rounding into the subnormal range followed by a flush gives zero in every case but
    one: at ``exp == 0`` the subnormal grid is two units of ``sig`` wide, so the value rounds
    up to the smallest normal exactly when ``sig`` is all ones (the dropped unit is at least
    half and the kept part is odd). Returns a comb signal of 32 bits.
    """
    out = Signal(32, name=name)
    up = guard & (sticky | sig[0])
    rounded = Signal(25, name=f"{name}_sig")
    m.d.comb += rounded.eq(sig + up)
    e2 = Signal(signed(11), name=f"{name}_exp")
    m.d.comb += e2.eq(exp + rounded[24])
    frac = Mux(rounded[24], rounded[1:24], rounded[0:23])
    with m.If(nan):
        m.d.comb += out.eq(F32_QNAN)
    with m.Elif(inf | (e2 >= 255)):
        m.d.comb += out.eq(Cat(Const(0, 23), Const(0xFF, 8), sign))
    with m.Elif(zero):
        m.d.comb += out.eq(Cat(Const(0, 31), sign))
    with m.Elif(e2 >= 1):
        m.d.comb += out.eq(Cat(frac, e2[0:8], sign))
    with m.Elif((exp == 0) & (sig == 0xFFFFFF)):
        m.d.comb += out.eq(Cat(Const(0, 23), Const(1, 8), sign))
    with m.Else():
        m.d.comb += out.eq(Cat(Const(0, 31), sign))
    return out
