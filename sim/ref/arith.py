"""Bit-exact numpy references of the arithmetic units (hw/arith/).

Every function takes and returns arrays of bit patterns (uint16 for binary16, uint32 for
binary32) and is vectorized: a million vectors take a fraction of a second.

Where IEEE arithmetic is the definition (add, mul, conversions) the reference is numpy's own
float16/float32 arithmetic plus the subnormal and NaN policy below, not a copy of the RTL's
algorithm. The special functions (exp, recip, rsqrt, gelu) are defined as fixed sequences of
those IEEE operations plus small tables and integer steps; the RTL builds the same sequence
from its own units, so the two agree bit for bit exactly when every unit does.

Policy (docs/numerics.md):

- binary32 arithmetic flushes subnormals: inputs that are subnormal count as zero of the same
  sign (DAZ), and a result whose correctly rounded IEEE value is subnormal becomes zero of the
  same sign (FTZ, applied after IEEE rounding).
- binary16 inputs keep their subnormals (they are exact in binary32); fp32 -> fp16 rounds to
  nearest even into fp16's subnormal range as IEEE does, and overflows to infinity.
- Every NaN result is the canonical quiet NaN: 0x7FC00000 (fp32), 0x7E00 (fp16).
- max/min: NaN if either input is NaN; otherwise by IEEE total order (-0 < +0).
"""

import numpy as np

from hw.arith import tables as T

__all__ = [
    "F32_QNAN", "F16_QNAN",
    "fp16_mul_to_fp32", "fp32_add", "fp32_mul", "fp16_to_fp32", "fp32_to_fp16", "fp32_max",
    "fp32_min", "int8_to_fp16", "adder_tree", "block_align", "bfp_dot", "i8_dot", "i16_dot",
    "int_dot", "exp", "recip", "rsqrt", "gelu",
    "f32", "bits32", "EXP_TABLE", "RECIP_SEED", "RSQRT_SEED",
]

F32_QNAN = np.uint32(0x7FC00000)
F16_QNAN = np.uint16(0x7E00)


def f32(bits):
    """uint32 bit patterns -> float32 values (a view, no rounding)."""
    return np.asarray(bits, np.uint32).view(np.float32)


def bits32(x):
    """float values -> uint32 bit patterns of their float32 rounding."""
    return np.asarray(x, np.float32).view(np.uint32)


def _daz(bits):
    bits = np.asarray(bits, np.uint32)
    return np.where((bits & 0x7F800000) == 0, bits & 0x80000000, bits).astype(np.uint32)


def _finish(values):
    """float32 results -> bits, with FTZ after rounding and canonical NaN."""
    b = np.asarray(values, np.float32).view(np.uint32)
    b = np.where((b & 0x7F800000) == 0, b & 0x80000000, b)
    return np.where(np.isnan(values), F32_QNAN, b).astype(np.uint32)


def fp32_add(a, b):
    with np.errstate(all="ignore"):
        return _finish(f32(_daz(a)) + f32(_daz(b)))


def fp32_mul(a, b):
    with np.errstate(all="ignore"):
        return _finish(f32(_daz(a)) * f32(_daz(b)))


def fp16_to_fp32(h):
    v = np.asarray(h, np.uint16).view(np.float16).astype(np.float32)
    return np.where(np.isnan(v), F32_QNAN, v.view(np.uint32)).astype(np.uint32)


def fp16_mul_to_fp32(a, b):
    """Exact: an fp16 x fp16 product always fits binary32 (22-bit significand, 2^-48..2^31)."""
    with np.errstate(all="ignore"):
        p = f32(fp16_to_fp32(a)) * f32(fp16_to_fp32(b))
    return np.where(np.isnan(p), F32_QNAN, p.view(np.uint32)).astype(np.uint32)


def fp32_to_fp16(a):
    with np.errstate(all="ignore"):
        h = f32(_daz(a)).astype(np.float16)
    return np.where(np.isnan(h), F16_QNAN, h.view(np.uint16)).astype(np.uint16)


def int8_to_fp16(a):
    """int8 (two's complement in uint8 or int8) -> fp16, exact."""
    return np.asarray(a).astype(np.int8).astype(np.float16).view(np.uint16)


def _order_key(bits):
    """IEEE total-order key of non-NaN binary32 bits (as int64)."""
    b = bits.astype(np.int64)
    return np.where(b & 0x80000000, -(b & 0x7FFFFFFF) - 1, b)


def fp32_max(a, b):
    a, b = _daz(a), _daz(b)
    nan = np.isnan(f32(a)) | np.isnan(f32(b))
    r = np.where(_order_key(a) >= _order_key(b), a, b)
    return np.where(nan, F32_QNAN, r).astype(np.uint32)


def fp32_min(a, b):
    a, b = _daz(a), _daz(b)
    nan = np.isnan(f32(a)) | np.isnan(f32(b))
    r = np.where(_order_key(a) <= _order_key(b), a, b)
    return np.where(nan, F32_QNAN, r).astype(np.uint32)


def adder_tree(x):
    """Sum the last axis (a power of two long) pairwise: ((x0+x1)+(x2+x3))+... in fp32."""
    x = np.asarray(x, np.uint32)
    n = x.shape[-1]
    if n & (n - 1):
        raise ValueError(f"adder_tree: width must be a power of two, not {n}")
    while x.shape[-1] > 1:
        x = fp32_add(x[..., 0::2], x[..., 1::2])
    return x[..., 0]


# -- block floating-point dot products (hw/arith/dot.py) ------------------------------------
# Matrix unit v2's arithmetic: each block of fp16 values is aligned once to its largest
# exponent as integers, the dot product is an exact integer sum, and one rounding makes it
# fp32. docs/numerics.md states the contract.

def _unpack16(h):
    """(sign, exponent (subnormals and zeros at 1), 11-bit significand (0 for inf/NaN), nan,
    inf, zero) of fp16 bit patterns, as int64 arrays and bool masks."""
    h = np.asarray(h, np.uint16).astype(np.int64)
    s, e, f = h >> 15, (h >> 10) & 0x1F, h & 0x3FF
    special = e == 31
    m = np.where(special, 0, np.where(e == 0, f, f | 0x400))
    return s, np.maximum(e, 1), m, special & (f != 0), special & (f == 0), (e == 0) & (f == 0)


def _align(h, bits):
    """block_align's integers and exponent, and the elements' sign, nan, inf, zero masks."""
    s, e, m, nan, inf, zero = _unpack16(h)
    e = np.where(nan | inf, 1, e)
    E = e.max(axis=-1)
    mag = (m << (bits - 11)) >> np.minimum(E[..., None] - e, 62)
    return np.where(s == 1, -mag, mag), E, s, nan, inf, zero


def block_align(h, bits):
    """Align each block (the last axis) of fp16 values to the block's largest exponent:
    signed integers of ``bits`` magnitude bits, truncated toward zero, and the block's
    exponent E, so that value ~= a * 2^(E - 14 - bits). A block with no finite nonzero value
    has E = 1; infinities and NaNs align as 0 (bfp_dot's flags carry them)."""
    return _align(h, bits)[:2]


_CHUNK = 1 << 16


def bfp_dot(w, x, *, a_bits=T.A_BITS, b_bits=T.B_BITS):
    """Dot products of fp16 rows: w [..., W] (weights, aligned per row to ``b_bits``) and
    x [..., W] (activations, aligned per block to ``a_bits``), broadcast against each other;
    the exact integer sum, rounded once to fp32 (nearest even). +0 when the sum is 0.
    Specials as IEEE gives them for the exact products: NaN if an input is NaN, an infinity
    meets a zero, or infinities of both signs meet; otherwise the infinity of the products.
    Each block is aligned once, before broadcasting (as the matrix unit shares them)."""
    w, x = np.asarray(w, np.uint16), np.asarray(x, np.uint16)
    if w.shape == x.shape and w.ndim == 2 and len(w) > _CHUNK:
        # bounded memory for the soak's millions of rows
        return np.concatenate([bfp_dot(w[i:i + _CHUNK], x[i:i + _CHUNK], a_bits=a_bits,
                                       b_bits=b_bits) for i in range(0, len(w), _CHUNK)])
    b, ew, sw, nw, iw, zw = _align(w, b_bits)
    a, ex, sx, nx, ix, zx = _align(x, a_bits)
    total = (a * b).sum(axis=-1)                      # exact: |total| < 2^53
    r = np.ldexp(total.astype(np.float64), (ex + ew - 28 - a_bits - b_bits).astype(np.int64))
    out = r.astype(np.float32).view(np.uint32)        # one rounding of an exact value
    pnan = nw | nx | (iw & zx) | (ix & zw)
    pinf = (iw | ix) & ~pnan
    neg = (sw ^ sx) == 1
    ipos, ineg = (pinf & ~neg).any(axis=-1), (pinf & neg).any(axis=-1)
    nan = pnan.any(axis=-1) | (ipos & ineg)
    out = np.where(ipos, np.uint32(0x7F800000), np.where(ineg, np.uint32(0xFF800000), out))
    return np.where(nan, F32_QNAN, out).astype(np.uint32)



def i8_dot(q, x, e, *, a_bits=T.A_BITS):
    """int8 rows times fp16 activations, with a power-of-two scale per row: q [..., W] (int8
    weights), x [..., W] (fp16, aligned per block to ``a_bits`` as in :func:`bfp_dot`), ``e``
    the scale's biased exponent (0..255; the scale is 2^(e - 127)), all broadcast against
    each other. The exact integer sum of the weights times the aligned activations, scaled,
    rounded once to fp32 (nearest even); a result below fp32's normal range is flushed to
    zero after rounding, its sign kept (the matrix unit's BfpToFp32); above it, infinity.
    +0 when the sum is 0. Specials as :func:`bfp_dot`, an int8 zero being a zero."""
    return int_dot(np.asarray(q).astype(np.int8), x, e, a_bits=a_bits)


def i16_dot(q, x, e, *, a_bits=T.A_BITS):
    """:func:`i8_dot` with int16 rows (``DotArrayI16``'s int16 tiles): the same contract, the
    integer sum exact as well (|q| <= 2^15: 15 + a_bits + log2(W) bits)."""
    return int_dot(np.asarray(q).astype(np.int16), x, e, a_bits=a_bits)


def int_dot(q, x, e, *, a_bits=T.A_BITS):
    """:func:`i8_dot`'s arithmetic for integer rows ``q`` of any width up to int16."""
    q = np.asarray(q)
    assert q.dtype in (np.int8, np.int16), q.dtype
    x = np.asarray(x, np.uint16)
    a, ex, sx, nx, ix, zx = _align(x, a_bits)
    total = (a * q.astype(np.int64)).sum(axis=-1)
    k = ex.astype(np.int64) - 14 - a_bits + np.asarray(e, np.int64) - 127
    with np.errstate(over="ignore"):
        r = np.ldexp(total.astype(np.float64), k).astype(np.float32)
    bits = r.view(np.uint32)
    tiny = (bits & 0x7F800000) == 0
    out = np.where(tiny, bits & np.uint32(0x80000000), bits)
    zq = q == 0
    pnan = nx | (ix & zq)
    pinf = ix & ~pnan
    neg = (sx ^ (q < 0)) == 1
    ipos, ineg = (pinf & ~neg).any(axis=-1), (pinf & neg).any(axis=-1)
    nan = pnan.any(axis=-1) | (ipos & ineg)
    out = np.where(ipos, np.uint32(0x7F800000), np.where(ineg, np.uint32(0xFF800000), out))
    return np.where(nan, F32_QNAN, out).astype(np.uint32)


# -- special functions -----------------------------------------------------------------
# Shared pieces: a binary32's fields, and scaling by a power of two with FTZ.

def _fields(a):
    a = np.asarray(a, np.uint32)
    return a >> 31, (a >> 23) & 0xFF, a & 0x7FFFFF


def _scale(y, n):
    """y * 2^n for finite nonzero normal y (int exponent arithmetic); FTZ and overflow to inf.

    NaN, inf and zero pass through unchanged.
    """
    y = np.asarray(y, np.uint32)
    s, e, f = _fields(y)
    e2 = e.astype(np.int64) + n
    out = (s << 31) | (np.clip(e2, 0, 255).astype(np.uint32) << 23) | f
    out = np.where(e2 >= 255, (s << 31) | 0x7F800000, out)
    out = np.where(e2 <= 0, s << 31, out)
    special = (e == 255) | (e == 0)
    return np.where(special, y, out).astype(np.uint32)


# Constants and tables: one definition for RTL and reference (hw/arith/tables.py).
EXP_LO, EXP_HI = np.uint32(T.EXP_LO), np.uint32(T.EXP_HI)
EXP_K, EXP_MAGIC, EXP_NEG_MAGIC = np.uint32(T.EXP_K), np.uint32(T.EXP_MAGIC), np.uint32(T.EXP_NEG_MAGIC)
EXP_NEG_HI, EXP_NEG_LO = np.uint32(T.EXP_NEG_HI), np.uint32(T.EXP_NEG_LO)
EXP_C3, EXP_C2 = np.uint32(T.EXP_C3), np.uint32(T.EXP_C2)
EXP_TABLE = np.array(T.EXP_TABLE, np.uint32)
ONE, HALF = np.uint32(T.ONE), np.uint32(T.HALF)
RECIP_SEED = np.array(T.RECIP_SEED, np.uint32)
RSQRT_SEED = np.array(T.RSQRT_SEED, np.uint32)
GELU_C, GELU_NEG_2S = np.uint32(T.GELU_C), np.uint32(T.GELU_NEG_2S)
NEG_INF = np.uint32(0xFF800000)


def exp(x):
    """e^x in fp32: clamp, Cody-Waite reduction by ln2/32, table of 2^(j/32), cubic for e^r."""
    x = _daz(x)
    xc = fp32_min(fp32_max(x, EXP_LO), EXP_HI)
    t = fp32_mul(xc, EXP_K)
    tm = fp32_add(t, EXP_MAGIC)                 # round(t) lands in the low mantissa bits
    kf = fp32_add(tm, EXP_NEG_MAGIC)            # round(t) as a float
    k = (tm & 0x7FFFFF).astype(np.int64) - 0x400000
    r = fp32_add(xc, fp32_mul(kf, EXP_NEG_HI))  # exact (Sterbenz)
    r = fp32_add(r, fp32_mul(kf, EXP_NEG_LO))
    q = fp32_add(fp32_mul(fp32_mul(r, r), fp32_add(fp32_mul(r, EXP_C3), EXP_C2)), r)  # e^r - 1
    tj = EXP_TABLE[k & 31]
    y = fp32_add(tj, fp32_mul(tj, q))
    out = _scale(y, k >> 5)
    return np.where(np.isnan(f32(x)), F32_QNAN, out).astype(np.uint32)


# recip: 1/m for m in [1, 2) by a 128-entry seed and two Newton steps y += y (1 - m y).


def _newton_recip(m, y):
    e = fp32_add(ONE, fp32_mul(m, y) ^ np.uint32(0x80000000))
    return fp32_add(y, fp32_mul(y, e))


def recip(x):
    x = _daz(x)
    s, e, f = _fields(x)
    m = (np.uint32(127) << 23) | f
    y = RECIP_SEED[f >> 16]
    y = _newton_recip(m, _newton_recip(m, y))
    out = _scale(y | (s << 31), 127 - e.astype(np.int64))
    out = np.where(e == 0, (s << 31) | 0x7F800000, out)     # 1/±0 = ±inf
    out = np.where((e == 255) & (f == 0), s << 31, out)     # 1/±inf = ±0
    out = np.where((e == 255) & (f != 0), F32_QNAN, out)
    return out.astype(np.uint32)


# rsqrt: x = 4^h m', m' in [1, 4); seed by (exponent parity, 6 mantissa bits), two Newton
# steps y += y (1/2 - (m'/2) y^2).


def _newton_rsqrt(half_m, y):
    c = fp32_add(HALF, fp32_mul(fp32_mul(y, y), half_m) ^ np.uint32(0x80000000))
    return fp32_add(y, fp32_mul(y, c))


def rsqrt(x):
    x = _daz(x)
    s, e, f = _fields(x)
    odd = (e.astype(np.int64) - 127) & 1            # unbiased exponent odd: m' = 2m
    half_m = ((np.uint32(126) + odd.astype(np.uint32)) << 23) | f   # m'/2 in [0.5, 2)
    y = RSQRT_SEED[(odd << 6) | (f >> 17)]
    y = _newton_rsqrt(half_m, _newton_rsqrt(half_m, y))
    h = (e.astype(np.int64) - 127 - odd) >> 1        # x = 4^h * m'
    out = _scale(y, -h)
    out = np.where(e == 0, (s << 31) | 0x7F800000, out)          # rsqrt(±0) = ±inf
    out = np.where((e == 255) & (f == 0) & (s == 0), 0, out)      # rsqrt(+inf) = +0
    out = np.where((s == 1) & (e != 0), F32_QNAN, out)            # negative -> NaN
    out = np.where((e == 255) & (f != 0), F32_QNAN, out)
    return out.astype(np.uint32)


# GELU, tanh form: 0.5 x (1 + tanh(u)), u = sqrt(2/pi) (x + 0.044715 x^3)
#                = x / (1 + e^(-2u))           (the same function, better conditioned)


def gelu(x):
    x = _daz(x)
    x3 = fp32_mul(fp32_mul(x, x), x)
    v = fp32_mul(fp32_add(x, fp32_mul(x3, GELU_C)), GELU_NEG_2S)
    g = fp32_mul(x, recip(fp32_add(exp(v), ONE)))
    return np.where(x == NEG_INF, np.uint32(0x80000000), g).astype(np.uint32)
