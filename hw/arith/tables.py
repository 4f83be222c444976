"""Constants and tables of the special functions, as binary32 bit patterns (pure Python).

One definition, used by the RTL (hw/arith/special.py) and by the numpy references
(sim/ref/arith.py) alike: the tables are part of each function's definition.
"""

import math
import struct

__all__ = ["f32_bits"]


def f32_bits(x: float) -> int:
    """Bit pattern of ``x`` rounded to binary32 (to nearest even)."""
    return struct.unpack("<I", struct.pack("<f", x))[0]


ONE = f32_bits(1.0)
HALF = f32_bits(0.5)

# exp(x) = 2^(k>>5) * 2^((k&31)/32) * e^r,  k = round(x * 32/ln2),  r = x - k ln2/32.
EXP_LO = f32_bits(-104.0)          # below: the result is under 2^-126 and flushes to 0
EXP_HI = f32_bits(89.0)            # above: the result overflows to inf
EXP_K = f32_bits(32 / math.log(2))
EXP_MAGIC = f32_bits(1.5 * 2**23)  # t + MAGIC rounds t to an integer held in the low bits
EXP_NEG_MAGIC = f32_bits(-1.5 * 2**23)
_LN2_32 = math.log(2) / 32
_HI = round(_LN2_32 * 2**16) / 2**16   # 11 significant bits: k * HI is exact for |k| < 2^13
EXP_NEG_HI = f32_bits(-_HI)
EXP_NEG_LO = f32_bits(-(_LN2_32 - _HI))
EXP_C3 = f32_bits(1 / 6)
EXP_C2 = f32_bits(0.5)
EXP_TABLE = [f32_bits(2 ** (j / 32)) for j in range(32)]

# 1/m for m in [1, 2): seed at the middle of each of 128 intervals.
RECIP_SEED = [f32_bits(1 / (1 + (i + 0.5) / 128)) for i in range(128)]

# 1/sqrt(m') for m' in [1, 2) (entries 0..63) and [2, 4) (64..127), 64 intervals each.
RSQRT_SEED = ([f32_bits(1 / math.sqrt(1 + (i + 0.5) / 64)) for i in range(64)] +
              [f32_bits(1 / math.sqrt(2 * (1 + (i + 0.5) / 64))) for i in range(64)])

GELU_C = f32_bits(0.044715)
GELU_NEG_2S = f32_bits(-2 * math.sqrt(2 / math.pi))

# Block floating-point dot products (hw/arith/dot.py, sim.ref.arith.bfp_dot): magnitude bits
# kept by the alignment of activations and of weights (docs/numerics.md).
A_BITS = 24          # DSP48E2 A port: 27 bits signed
B_BITS = 17          # DSP48E2 B port: 18 bits signed
