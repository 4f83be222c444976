"""Integer weights (core.weight_dtype int8 or int16): how the compiler quantizes a matrix, a
row at a time (docs/numerics.md). The card's arithmetic on the result is
``sim.ref.arith.i8_dot`` (``i16_dot``).
"""

import numpy as np

__all__ = ["quantize_rows"]


_QMAX = {np.int8: 127, np.int16: 32767}


def quantize_rows(w, *, keep_sum=False, dtype=np.int8):
    """Symmetric integers per row with a power-of-two scale (core.weight_dtype int8, or int16
    with ``dtype``): w [rows, cols] (float; finite) -> (q [rows, cols] of ``dtype``, e uint8
    [rows]) with w ~= q * 2^(e - 127). With Q = 127 (int8) or 32767 (int16), the scale is the
    smallest power of two with max|row| / scale <= Q, so the row's largest weight maps to
    (Q + 1) / 2 .. Q; q = w / scale rounded to nearest, ties to even. A zero row gets scale 1
    (e = 127) and zeros. Raises ValueError on a NaN or an infinity.

    With ``keep_sum`` each row's sum is kept too: sum(q) = round(sum(w) / scale) (0 for a
    row that sums to 0, as a LayerNorm-folded matrix's centred rows do), by moving the
    elements whose rounding was closest to the other way one step further (each then within
    one step instead of half a step; |q| <= Q kept)."""
    qmax = _QMAX[np.dtype(dtype).type]
    w = np.asarray(w, np.float64)
    if not np.isfinite(w).all():
        raise ValueError("weights hold a NaN or an infinity")
    m = np.abs(w).max(axis=-1)
    _, ex = np.frexp(m / qmax)                      # m/Q = f 2^ex, f in [0.5, 1)
    # smallest 2^k >= m / Q: k = ex, or ex - 1 when m / Q is itself a power of two
    k = np.where(np.frexp(m / qmax)[0] == 0.5, ex - 1, ex)
    k = np.where(m > 0, k, 0)
    if (k + 127 < 0).any() or (k + 127 > 255).any():
        raise ValueError("a row's scale is outside fp32's exponent range")
    v = np.ldexp(w, -k[..., None])
    q = np.rint(v)                                  # numpy's rint: ties to even
    if keep_sum:
        q = _keep_row_sums(v, q, qmax)
    return q.astype(dtype), (k + 127).astype(np.uint8)


def _keep_row_sums(v, q, qmax):
    """q (rounded v) with each row's sum moved to round(sum(v)): the elements whose residual
    v - q points most the needed way step by one, in order, skipping +-qmax bounds."""
    q = q.copy()
    need = np.rint(v.sum(axis=-1)) - q.sum(axis=-1)
    for i in np.nonzero(need)[0]:
        n, r = int(need[i]), v[i] - q[i]
        step = 1 if n > 0 else -1
        order = np.argsort(-r * step, kind="stable")
        ok = order[np.abs(q[i][order] + step) <= qmax][:abs(n)]
        q[i][ok] += step
    return q
