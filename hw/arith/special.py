"""The vector unit's special functions, each a fixed pipeline of fp32 units and small ROMs.

Every function is the exact sequence of operations that its reference in
:mod:`sim.ref.arith` performs (same constants, same tables, same order), so RTL and reference
agree bit for bit because each unit does. Methods and measured error bounds:
docs/numerics.md.
"""

from amaranth.hdl import Cat, Const, Module, Mux
from amaranth.lib import wiring
from amaranth.lib.wiring import In, Out

from . import tables as ref
from .fp import F32_QNAN
from .pipe import Pipeline
from .units import Fp32Add

__all__ = ["Exp", "Recip", "Rsqrt", "Gelu", "AdderTree", "build_exp", "build_recip",
           "build_rsqrt", "build_gelu", "SPECIALS"]

_INF = 0x7F800000


def _scale(y, n):
    """y * 2^n for normal y (exponent arithmetic), FTZ below 2^-126, inf above; NaN, inf and
    zero pass through."""
    s, e, f = y[31], y[23:31], y[0:23]
    e2 = e + n
    special = (e == 0xFF) | (e == 0)
    return Mux(special, y,
               Mux(e2 >= 255, Cat(Const(0, 23), Const(0xFF, 8), s),
                   Mux(e2 <= 0, Cat(Const(0, 31), s), Cat(f, e2[0:8], s))))


def build_exp(p, x):
    """e^x: clamp to [-104, 89], k = round(x 32/ln2), r = x - k ln2/32 (Cody-Waite),
    e^x = 2^(k>>5) * T[k&31] * (1 + r + r^2/2 + r^3/6)."""
    c = p.const
    xc = p.min(p.max(x, c(ref.EXP_LO)), c(ref.EXP_HI))
    t = p.mul(xc, c(ref.EXP_K))
    tm = p.add(t, c(ref.EXP_MAGIC))
    kf = p.add(tm, c(ref.EXP_NEG_MAGIC))
    k = p.comb(lambda v: (v[0:23] - 0x400000)[0:16].as_signed(), tm, reg=False)
    r = p.add(xc, p.mul(kf, c(ref.EXP_NEG_HI)))
    r = p.add(r, p.mul(kf, c(ref.EXP_NEG_LO)))
    poly = p.add(p.mul(p.mul(r, r), p.add(p.mul(r, c(ref.EXP_C3)), c(ref.EXP_C2))), r)
    tj = p.rom(ref.EXP_TABLE, lambda v: v[0:5], k)
    y = p.add(tj, p.mul(tj, poly))
    out = p.comb(lambda yv, kv: _scale(yv, kv[5:16].as_signed()), y, k)
    return p.comb(lambda xv, ov: Mux((xv[23:31] == 0xFF) & (xv[0:23] != 0), F32_QNAN, ov), x, out)


def _newton_recip(p, m, y):
    e = p.add(p.const(ref.ONE), p.neg(p.mul(m, y)))
    return p.add(y, p.mul(y, e))


def build_recip(p, x):
    """1/x: m = mantissa in [1, 2), 128-entry seed, two Newton steps y += y (1 - m y)."""
    m = p.comb(lambda v: Cat(v[0:23], Const(127, 8), Const(0, 1)), x, reg=False)
    y = p.rom(ref.RECIP_SEED, lambda v: v[16:23], x)
    y = _newton_recip(p, m, _newton_recip(p, m, y))

    def finish(xv, yv):
        s, e, f = xv[31], xv[23:31], xv[0:23]
        scaled = _scale(yv | Cat(Const(0, 31), s), 127 - e)
        return Mux(e == 0, Cat(Const(_INF, 31), s),
                   Mux(e != 0xFF, scaled, Mux(f == 0, Cat(Const(0, 31), s), F32_QNAN)))
    return p.comb(finish, x, y)


def _newton_rsqrt(p, half_m, y):
    c = p.add(p.const(ref.HALF), p.neg(p.mul(p.mul(y, y), half_m)))
    return p.add(y, p.mul(y, c))


def build_rsqrt(p, x):
    """1/sqrt(x): x = 4^h m', m' in [1, 4); seed by (parity, 6 mantissa bits); two Newton
    steps y += y (1/2 - (m'/2) y^2)."""
    odd = p.comb(lambda v: ~v[23], x, reg=False)      # unbiased exponent odd
    half_m = p.comb(lambda v, o: Cat(v[0:23], (126 + o)[0:8], Const(0, 1)), x, odd, reg=False)
    y = p.rom(ref.RSQRT_SEED, lambda v: Cat(v[17:23], ~v[23]), x)
    y = _newton_rsqrt(p, half_m, _newton_rsqrt(p, half_m, y))

    def finish(xv, yv):
        s, e, f = xv[31], xv[23:31], xv[0:23]
        h = (e - 127 - ~e[0]) >> 1         # x = 4^h m'  (arithmetic shift of an even value)
        scaled = _scale(yv, -h)
        nan = ((e == 0xFF) & (f != 0)) | (s & (e != 0))
        return Mux(nan, F32_QNAN,
                   Mux(e == 0, Cat(Const(_INF, 31), s),
                       Mux(e == 0xFF, Const(0, 32), scaled)))
    return p.comb(finish, x, y)


def build_gelu(p, x, *, exp=build_exp, recip=build_recip):
    """GELU, tanh form, as x / (1 + e^(-2u)), u = sqrt(2/pi) (x + 0.044715 x^3).

    ``exp`` and ``recip`` build e^v and 1/v (``(p, node) -> node``): inline by default; a
    vector lane passes its own EXP and RECIP units instead (hw/core/vpu_lanes.py), which a
    GELU pass has to itself."""
    c = p.const
    x3 = p.mul(p.mul(x, x), x)
    v = p.mul(p.add(x, p.mul(x3, c(ref.GELU_C))), c(ref.GELU_NEG_2S))
    g = p.mul(x, recip(p, p.add(exp(p, v), c(ref.ONE))))
    return p.comb(lambda xv, gv: Mux(xv == 0xFF800000, 0x80000000, gv), x, g)


class _Special(wiring.Component):
    """A one-input fp32 special function as a component (a -> o, fixed latency)."""

    BUILD = None
    LATENCY = None
    a: In(32)
    o: Out(32)

    def __init_subclass__(cls, **kwargs):
        super().__init_subclass__(**kwargs)
        dry = Pipeline(None)
        cls.LATENCY = cls.BUILD(dry, dry.input(None)).stage

    def elaborate(self, platform):
        m = Module()
        p = Pipeline(m, name="f")
        out = type(self).BUILD(p, p.input(self.a))
        assert out.stage == self.LATENCY
        m.d.comb += self.o.eq(out.value)
        return m


class Exp(_Special):
    """e^x in fp32 (see :func:`build_exp`)."""
    BUILD = staticmethod(build_exp)


class Recip(_Special):
    """1/x in fp32 (see :func:`build_recip`)."""
    BUILD = staticmethod(build_recip)


class Rsqrt(_Special):
    """1/sqrt(x) in fp32 (see :func:`build_rsqrt`)."""
    BUILD = staticmethod(build_rsqrt)


class Gelu(_Special):
    """GELU (tanh form) in fp32 (see :func:`build_gelu`)."""
    BUILD = staticmethod(build_gelu)


class AdderTree(wiring.Component):
    """Sum of ``width`` fp32 values by a pairwise tree in a fixed order:
    level by level, adjacent pairs: ((x0 + x1) + (x2 + x3)) + ... Latency log2(width) x 6.

    Members
    -------
    a : ``In(32 * width)``: the values, x0 in the low bits.
    o : ``Out(32)``
    """

    def __init__(self, width):
        if width < 2 or width & (width - 1):
            raise ValueError(f"width must be a power of two >= 2, not {width!r}")
        self.width = width
        self.LATENCY = self.latency(width)
        super().__init__({"a": In(32 * width), "o": Out(32)})

    @staticmethod
    def latency(width):
        return (width.bit_length() - 1) * Fp32Add.LATENCY

    def elaborate(self, platform):
        m = Module()
        p = Pipeline(m, name="t")
        level = [p.input(self.a[32 * k:32 * (k + 1)]) for k in range(self.width)]
        while len(level) > 1:
            level = [p.add(level[k], level[k + 1]) for k in range(0, len(level), 2)]
        assert level[0].stage == self.LATENCY
        m.d.comb += self.o.eq(level[0].value)
        return m


SPECIALS = {"exp": Exp, "recip": Recip, "rsqrt": Rsqrt, "gelu": Gelu}
