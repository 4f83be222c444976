"""Pipelined FP16/FP32 arithmetic: the matrix and vector units are built from these.

Numerics contract: docs/numerics.md. Bit-exact references: sim/ref/arith.py.
"""

from .special import SPECIALS, AdderTree, Exp, Gelu, Recip, Rsqrt
from .units import UNITS, Fp16MulFp32, Fp16ToFp32, Fp32Add, Fp32Max, Fp32Mul, Fp32ToFp16, Int8ToFp16

__all__ = ["UNITS", "SPECIALS", "AdderTree", "Exp", "Gelu", "Recip", "Rsqrt", "Fp16MulFp32",
           "Fp16ToFp32", "Fp32Add", "Fp32Max", "Fp32Mul", "Fp32ToFp16", "Int8ToFp16"]
