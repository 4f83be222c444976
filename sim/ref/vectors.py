"""Test vectors for the arithmetic units: corner cases first, then seeded random vectors.

``unit_vectors(name, n_random, rng)`` returns a tuple of input arrays (one per operand) and
the reference function; every corner case the numerics contract names is in the corner set:
signed zeros, infinities, NaNs (quiet, signalling, negative), largest and smallest normals,
subnormals, rounding ties, overflow and underflow boundaries, catastrophic cancellation.
"""

import numpy as np

from . import arith as A

__all__ = ["UNIT_REFS", "unit_vectors", "exhaustive_vectors"]

UNIT_REFS = {
    "fp16_mul_fp32": A.fp16_mul_to_fp32,
    "fp32_add": A.fp32_add,
    "fp32_mul": A.fp32_mul,
    "fp16_to_fp32": A.fp16_to_fp32,
    "fp32_to_fp16": A.fp32_to_fp16,
    "fp32_max": A.fp32_max,
    "fp32_min": A.fp32_min,
    "int8_to_fp16": A.int8_to_fp16,
    "exp": A.exp,
    "recip": A.recip,
    "rsqrt": A.rsqrt,
    "gelu": A.gelu,
}

F32_SPECIALS = np.array([
    0x00000000, 0x80000000,              # +-0
    0x7F800000, 0xFF800000,              # +-inf
    0x7FC00000, 0xFFC00000, 0x7F800001, 0x7FBFFFFF, 0xFFFFFFFF,   # NaNs: quiet, signalling
    0x00800000, 0x80800000,              # smallest normals
    0x7F7FFFFF, 0xFF7FFFFF,              # largest normals
    0x00000001, 0x807FFFFF, 0x00400000,  # subnormals (DAZ: count as zero)
    0x3F800000, 0xBF800000, 0x3F800001, 0x3F7FFFFF, 0x40000000, 0x3F000000,
    0x33800000, 0x33800001, 0x337FFFFF,  # 2^-24 and neighbours: ties against 1.0
    0x4B000000, 0x4B800000, 0x34000000,
], dtype=np.uint32)

F16_SPECIALS = np.array([
    0x0000, 0x8000, 0x7C00, 0xFC00, 0x7E00, 0xFE00, 0x7C01, 0x7DFF,
    0x0400, 0x8400, 0x7BFF, 0xFBFF, 0x0001, 0x8001, 0x03FF, 0x83FF, 0x0200,
    0x3C00, 0xBC00, 0x3C01, 0x3BFF, 0x4000, 0x3800,
], dtype=np.uint16)


def _pairs(values):
    a, b = np.meshgrid(values, values, indexing="ij")
    return a.ravel(), b.ravel()


def _near(rng, n, lo_exp, hi_exp):
    """fp32 values with biased exponents in [lo_exp, hi_exp] and random signs/mantissas."""
    e = rng.integers(lo_exp, hi_exp + 1, n, dtype=np.uint32)
    return (rng.integers(0, 2, n, dtype=np.uint32) << 31) | (e << 23) | \
        rng.integers(0, 1 << 23, n, dtype=np.uint32)


def _rand32(rng, n):
    """A mix: uniform bit patterns, similar exponents (cancellation), the ML range."""
    k = n // 4
    u = rng.integers(0, 1 << 32, k, dtype=np.uint64).astype(np.uint32)
    ml = A.bits32(rng.standard_normal(k) * np.exp(rng.uniform(-8, 8, k)))
    lo = _near(rng, k, 1, 40)
    hi = _near(rng, n - 3 * k, 200, 254)
    return np.concatenate([u, ml, lo, hi])


def _add_corners(rng):
    a, b = _pairs(F32_SPECIALS)
    extra_a, extra_b = [a], [b]
    # catastrophic cancellation: x + -(x +- few ulps), and x + -x
    x = _near(rng, 4000, 1, 254)
    d = rng.integers(-3, 4, 4000).astype(np.int64)
    y = ((x.astype(np.int64) + d) & 0x7FFFFFFF).astype(np.uint32) | (~x & 0x80000000)
    extra_a += [x, x]
    extra_b += [y, x ^ np.uint32(0x80000000)]
    # every cancellation depth: x + -(x with significand bit k flipped and random bits below),
    # so the difference's leading one lands on each bit of the aligned sum (the normalizing
    # shift of every length; a mutant of the leading-zero count at 11 survived without these)
    for k in range(24):
        x = _near(rng, 50, 1, 254)
        low = rng.integers(0, 1 << k, 50, dtype=np.uint32) if k else np.zeros(50, np.uint32)
        y = (x ^ np.uint32(1 << k) ^ low) ^ np.uint32(0x80000000)
        extra_a.append(x)
        extra_b.append(y)
    # every exponent difference 0..40 with ties: b = half an ulp of a, and neighbours
    for diff in range(0, 41):
        xa = _near(rng, 200, 100, 200)
        eb = ((xa >> 23) & 0xFF) - np.uint32(min(diff, 99))
        xb = (rng.integers(0, 2, 200, dtype=np.uint32) << 31) | (eb << 23) | \
            rng.choice(np.array([0, 1, 0x7FFFFF, 0x400000, 0x3FFFFF], np.uint32), 200)
        extra_a.append(xa)
        extra_b.append(xb)
    # sums near the underflow boundary and near overflow
    extra_a += [_near(rng, 3000, 1, 3), _near(rng, 3000, 252, 254)]
    extra_b += [_near(rng, 3000, 1, 3), _near(rng, 3000, 252, 254)]
    return np.concatenate(extra_a), np.concatenate(extra_b)


def _mul_corners(rng):
    a, b = _pairs(F32_SPECIALS)
    extra_a, extra_b = [a], [b]
    # products around 2^-126 (FTZ after IEEE rounding) and around the overflow boundary
    for target in (2.0**-126, 2.0**-127, 2.0**128, 2.0**-149):
        xa = A.bits32(np.exp2(rng.uniform(-60, 60, 4000)) * rng.choice([-1, 1], 4000))
        xb = A.bits32(target / A.f32(xa).astype(np.float64))
        for delta in range(-4, 5):
            extra_a.append(xa)
            extra_b.append((xb.astype(np.int64) + delta).astype(np.uint32))
    # exact min-normal round-up: significand product of all ones at exponent 0
    x = np.float32(2.0**-63)
    extra_a.append(A.bits32(np.array([x * np.float32(1 - 2**-24) * 2, x], np.float32)))
    extra_b.append(A.bits32(np.array([x, x * np.float32(1 - 2**-24) * 2], np.float32)))
    # ties: products whose dropped half is exactly 1/2
    xa = A.bits32(1 + rng.integers(0, 1 << 12, 3000) * 2.0**-12)
    xb = A.bits32(1 + rng.integers(0, 1 << 12, 3000) * 2.0**-12)
    extra_a.append(xa)
    extra_b.append(xb)
    return np.concatenate(extra_a), np.concatenate(extra_b)


def _to16_corners(rng):
    near = np.array([65504, 65519, 65520, 65521, 65536, 2.0**-14, 2.0**-24, 2.0**-25,
                     3 * 2.0**-26, 2.0**-25 * 1.0000001, 2.0**-14 - 2.0**-25, 2.0**-14 - 2.0**-26,
                     1 + 2.0**-11, 1 + 3 * 2.0**-11, 1 + 2.0**-11 + 2.0**-20, 1e-10, 1e10], np.float64)
    near = np.concatenate([near, -near])
    # every fp16 value and the midpoints between neighbours (ties), as fp32
    h = np.arange(0x7C00, dtype=np.uint32)
    vals = A.f32(A.fp16_to_fp32(h.astype(np.uint16))).astype(np.float64)
    mids = (vals[:-1] + vals[1:]) / 2
    allv = np.concatenate([vals, mids, -mids])
    return np.concatenate([F32_SPECIALS, A.bits32(near), A.bits32(allv)])


def _special_inputs(name, rng, n):
    ranges = {"exp": (-110.0, 95.0), "recip": (-1e4, 1e4), "rsqrt": (1e-6, 1e6), "gelu": (-12.0, 12.0)}
    lo, hi = ranges[name]
    dense = A.bits32(rng.uniform(lo, hi, n // 2))
    if name in ("recip", "rsqrt"):
        dense = A.bits32(np.exp2(rng.uniform(-126, 127, n // 2)) * (1 if name == "rsqrt" else
                                                                    rng.choice([-1, 1], n // 2)))
    u = rng.integers(0, 1 << 32, n - n // 2, dtype=np.uint64).astype(np.uint32)
    return np.concatenate([dense, u])


def unit_vectors(name, n_random, rng):
    """(inputs tuple, reference) for unit ``name``: corners first, then ``n_random`` vectors."""
    ref = UNIT_REFS.get(name)
    if name in ("fp32_add", "fp32_max", "fp32_min"):
        ca, cb = _add_corners(rng)
        ra, rb = _rand32(rng, n_random), _rand32(rng, n_random)
        rb[: n_random // 4] = (ra[: n_random // 4] ^ 0x80000000) + rng.integers(
            0, 3, n_random // 4).astype(np.uint32)   # near-cancelling pairs
        return (np.concatenate([ca, ra]), np.concatenate([cb, rb])), ref
    if name == "fp32_mul":
        ca, cb = _mul_corners(rng)
        return (np.concatenate([ca, _rand32(rng, n_random)]),
                np.concatenate([cb, _rand32(rng, n_random)])), ref
    if name == "fp16_mul_fp32":
        ca, cb = _pairs(F16_SPECIALS)
        allh = np.arange(65536, dtype=np.uint16)
        fixed = np.resize(F16_SPECIALS, 65536)
        ra = rng.integers(0, 1 << 16, n_random, dtype=np.uint32).astype(np.uint16)
        rb = rng.integers(0, 1 << 16, n_random, dtype=np.uint32).astype(np.uint16)
        return (np.concatenate([ca, allh, ra]), np.concatenate([cb, fixed, rb])), ref
    if name == "fp16_to_fp32":
        return (np.concatenate([np.arange(65536, dtype=np.uint16),
                                rng.integers(0, 1 << 16, n_random, dtype=np.uint32).astype(np.uint16)]),), ref
    if name == "int8_to_fp16":
        return (np.concatenate([np.arange(256, dtype=np.uint8),
                                rng.integers(0, 256, n_random, dtype=np.uint32).astype(np.uint8)]),), ref
    if name == "fp32_to_fp16":
        return (np.concatenate([_to16_corners(rng), _rand32(rng, n_random)]),), ref
    if name.startswith("adder_tree"):
        width = int(name.split("_")[-1])
        rows = [_rand32(rng, n_random * width).reshape(n_random, width)]
        # rows that cancel to zero, rows with one special, rows mixing huge and tiny values
        c = _rand32(rng, 1000 * width).reshape(1000, width)
        c[:, 1::2] = c[:, 0::2] ^ np.uint32(0x80000000)
        sp = _near(rng, 2000 * width, 120, 135).reshape(2000, width)
        sp[np.arange(2000), rng.integers(0, width, 2000)] = rng.choice(F32_SPECIALS, 2000)
        mix = _near(rng, 2000 * width, 1, 254).reshape(2000, width)
        rows = [c, sp, mix] + rows
        return (np.concatenate(rows),), A.adder_tree
    if name.startswith("bfp_dot"):
        return _dot_vectors(int(name.split("_")[-1]), n_random, rng), A.bfp_dot
    if name.startswith("i8_dot"):
        return _i8_vectors(int(name.split("_")[-1]), n_random, rng), A.i8_dot
    if name.startswith("dot_pair"):
        return _pair_vectors(int(name.split("_")[-1]), n_random, rng), dot_pair
    if name in ("exp", "recip", "rsqrt", "gelu"):
        return (np.concatenate([F32_SPECIALS, exhaustive_vectors()[0],
                                _special_inputs(name, rng, n_random)]),), ref
    raise KeyError(name)


def _f16_rows(rng, n, width, lo_exp, hi_exp):
    """fp16 rows with exponents drawn per element from [lo_exp, hi_exp] (biased), random
    signs and fractions: the exponent spread within a row is what alignment truncates."""
    e = rng.integers(lo_exp, hi_exp + 1, (n, width), dtype=np.uint16)
    f = rng.integers(0, 1 << 10, (n, width), dtype=np.uint16)
    s = rng.integers(0, 2, (n, width), dtype=np.uint16)
    return (s << 15) | (e << 10) | f


def _dot_vectors(width, n_random, rng):
    """(weights, activations) rows of ``width`` fp16 values for bfp_dot: corners, then rows
    of narrow, wide and whole-range exponent spreads, then raw random bit patterns."""
    n = 2000
    rows_w, rows_x = [], []

    def add(w, x):
        rows_w.append(np.asarray(w, np.uint16).reshape(-1, width))
        rows_x.append(np.asarray(x, np.uint16).reshape(-1, width))

    z = np.zeros((1, width), np.uint16)
    add(z, z)                                                     # all zero
    add(z | 0x8000, z | 0x8000)                                   # -0 . -0 = +0
    ones = np.full((1, width), 0x3C00, np.uint16)
    add(ones, ones)
    # cancellation: w . x pairs that cancel exactly, and nearly
    w = _f16_rows(rng, n, width, 5, 25)
    x = _f16_rows(rng, n, width, 5, 25)
    w[:, 1::2], x[:, 1::2] = w[:, 0::2], x[:, 0::2] ^ np.uint16(0x8000)
    x[n // 2:, 1] ^= np.uint16(1)
    add(w, x)
    # largest and smallest exponents in one row (fp16 max and min subnormal beside them)
    w = _f16_rows(rng, n, width, 1, 30)
    x = _f16_rows(rng, n, width, 1, 30)
    w[:, 0], x[:, 0] = 0x7BFF, 0xFBFF
    w[:, -1], x[:, -1] = 0x0001, 0x8001
    add(w, x)
    # subnormals throughout
    add(rng.integers(0, 0x400, (n, width)) | (rng.integers(0, 2, (n, width)) << 15),
        _f16_rows(rng, n, width, 0, 3))
    # one special per row on either side (inf, NaN) against random and zero partners
    for side in (0, 1):
        w, x = _f16_rows(rng, n, width, 1, 30), _f16_rows(rng, n, width, 1, 30)
        tgt = (w, x)[side]
        cols = rng.integers(0, width, n)
        tgt[np.arange(n), cols] = rng.choice(F16_SPECIALS[2:8], n)
        other = (x, w)[side]
        other[np.arange(n // 4), cols[:n // 4]] = rng.choice([0x0000, 0x8000], n // 4)
        add(w, x)
    # +inf and -inf in one row
    w, x = _f16_rows(rng, n, width, 10, 20), _f16_rows(rng, n, width, 10, 20)
    w[:, 0], w[:, 1], x[:, 0], x[:, 1] = 0x7C00, 0x7C00, 0x3C00, 0xBC00
    add(w, x)
    # random: a quarter narrow spread (values like a layer's), a quarter wide, half raw bits
    q = n_random // 4
    add(_f16_rows(rng, q, width, 10, 17), _f16_rows(rng, q, width, 12, 19))
    add(_f16_rows(rng, q, width, 1, 30), _f16_rows(rng, q, width, 1, 30))
    r = n_random - 2 * q
    add(rng.integers(0, 1 << 16, (r, width), dtype=np.uint16),
        rng.integers(0, 1 << 16, (r, width), dtype=np.uint16))
    return np.concatenate(rows_w), np.concatenate(rows_x)


def _i8_vectors(width, n_random, rng):
    """(int8 weights, fp16 activations, scale exponents) for i8_dot: corners (int8 extremes,
    zero rows, the scale's whole range with results that flush or overflow, infinities and
    NaNs against zero and nonzero weights), then random rows."""
    n = 2000
    qs, xs, es = [], [], []

    def add(q, x, e):
        q = np.asarray(q).astype(np.int8).reshape(-1, width)
        qs.append(q.view(np.uint8))
        xs.append(np.asarray(x, np.uint16).reshape(-1, width))
        es.append(np.broadcast_to(np.asarray(e, np.uint8), (len(q),)).copy())

    x = _f16_rows(rng, n, width, 1, 30)
    for v in (-128, 127, 0, -1):
        add(np.full((n, width), v), x, rng.integers(0, 256, n))
    # every scale exponent, weights across the int8 range, activations large and tiny
    e = np.arange(256, dtype=np.uint8).repeat(8)
    m = len(e)
    add(rng.integers(-128, 128, (m, width)), _f16_rows(rng, m, width, 1, 30), e)
    add(rng.integers(-128, 128, (m, width)), _f16_rows(rng, m, width, 0, 4), e)      # subnormals
    add(rng.integers(-128, 128, (m, width)), _f16_rows(rng, m, width, 26, 30), e)
    # cancellation: q . x pairs that cancel exactly
    q = rng.integers(-128, 128, (n, width))
    x = _f16_rows(rng, n, width, 5, 25)
    q[:, 1::2], x[:, 1::2] = q[:, 0::2], x[:, 0::2] ^ np.uint16(0x8000)
    add(q, x, rng.integers(100, 150, n))
    # one special per row in the activations, against a zero or a nonzero weight
    q = rng.integers(-128, 128, (n, width))
    x = _f16_rows(rng, n, width, 1, 30)
    cols = rng.integers(0, width, n)
    x[np.arange(n), cols] = rng.choice(F16_SPECIALS[2:8], n)
    q[np.arange(n // 2), cols[:n // 2]] = 0
    add(q, x, rng.integers(0, 256, n))
    # +inf and -inf in one row
    q = rng.integers(1, 128, (n, width))
    x = _f16_rows(rng, n, width, 10, 20)
    x[:, 0], x[:, 1] = 0x7C00, 0xFC00
    add(q, x, 127)
    # random: weights like a quantized layer's (scales near 2^-7) and raw patterns
    half = n_random // 2
    add(rng.integers(-127, 128, (half, width)), _f16_rows(rng, half, width, 10, 19),
        rng.integers(110, 125, half))
    r = n_random - half
    add(rng.integers(-128, 128, (r, width)), rng.integers(0, 1 << 16, (r, width), dtype=np.uint16),
        rng.integers(0, 256, r))
    return np.concatenate(qs), np.concatenate(xs), np.concatenate(es)


def dot_pair(w, x, c):
    """The matrix unit's DotArray of one lane and two products in an int8 build, step by
    step in either mode: w [N, W] fp16 (in int8 mode its bytes are two rows of W int8
    weights), x [N, 2W] fp16 (the two products' blocks), c [N, 3] bytes (the two rows' scale
    exponents, then the mode: 1 int8). Returns [N] uint64: product 0 in the low word."""
    w, x, c = np.asarray(w, np.uint16), np.asarray(x, np.uint16), np.asarray(c, np.uint8)
    W = w.shape[-1]
    x0, x1 = x[:, :W], x[:, W:]
    q = np.ascontiguousarray(w).view(np.int8)
    fp = (A.bfp_dot(w, x0), A.bfp_dot(w, x1))
    i8 = (A.i8_dot(q[:, :W], x0, c[:, 0]), A.i8_dot(q[:, W:], x1, c[:, 1]))
    mode = (c[:, 2] & 1) == 1
    lo, hi = (np.where(mode, b, a).astype(np.uint64) for a, b in zip(fp, i8, strict=True))
    return lo | (hi << np.uint64(32))


def _pair_vectors(width, n_random, rng):
    """(w, x, c) for :func:`dot_pair`: bfp_dot's and i8_dot's vectors (corners and random),
    in a random order, so that the mode changes from one step to the next as often as not."""
    w, x = _dot_vectors(width, n_random // 2, rng)
    n16 = len(w)
    x = np.concatenate([x, x[rng.permutation(n16)]], axis=1)
    c16 = np.zeros((n16, 3), np.uint8)
    q, xq, e = _i8_vectors(width, n_random // 2, rng)
    n8 = len(q) // 2
    q = q[:2 * n8].reshape(n8, 2 * width)                  # two int8 rows a step
    w8 = q.view(np.uint16)
    x8 = xq[:2 * n8].reshape(n8, 2 * width)
    c8 = np.stack([e[0:2 * n8:2], e[1:2 * n8:2], np.ones(n8, np.uint8)], axis=1)
    order = rng.permutation(n16 + n8)
    return tuple(np.concatenate(p)[order] for p in ((w, w8), (x, x8), (c16, c8)))


def exhaustive_vectors():
    """Every fp16 value as fp32: the dense sweep for the fp32 special functions."""
    return (A.fp16_to_fp32(np.arange(65536, dtype=np.uint16)),)
