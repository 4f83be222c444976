"""Arithmetic units: every unit in Verilator against its bit-exact numpy reference.

Each RTL test runs the corner cases of sim/ref/vectors.py plus at least 200,000 seeded random
vectors through a UnitArray of several lanes, one new input per lane per cycle, and checks
every output value and that it appears exactly LATENCY cycles after its input. DotArrayI16,
whose cache tiles take several cycles a step, has a testbench of its own (sim/tb/tb_dot_i16.py:
3,000 steps in make test, 200,000 in make soak).
"""

import json

import numpy as np
import pytest
from amaranth.hdl import Module
from amaranth.lib import wiring
from amaranth.lib.wiring import In, Out

from host.files import write_if_changed
from hw.arith import SPECIALS, UNITS, AdderTree
from hw.arith.dot import DotArray, DotArrayI16, Fp16Dot, I8Dot
from hw.arith.units import Fp32Max
from sim.cocotb_run import ROOT, run_cocotb
from sim.harness import UnitArray
from sim.ref import arith as A

N_RANDOM = 200_000
BUILD = ROOT / "build" / "arith"
TREE_WIDTH = 16

class _I8DotABC(I8Dot):
    """I8Dot with its inputs under the harness's names (a: q, b: x, c: e)."""
    a = property(lambda self: self.q)
    b = property(lambda self: self.x)
    c = property(lambda self: self.e)


class _DotPair(wiring.Component):
    """The matrix unit's DotArray in an int8 build, one lane of two products (a token's two
    rows in int8 mode), its mode chosen step by step: a the tile, b the two blocks, c the
    two rows' scale exponents and the mode bit (sim.ref.vectors.dot_pair)."""

    def __init__(self, width):
        self.width = width
        self.LATENCY = DotArray.latency(width)
        super().__init__({"a": In(16 * width), "b": In(32 * width), "c": In(24), "o": Out(64)})

    def elaborate(self, platform):
        m = Module()
        m.submodules.arr = arr = DotArray(lanes=1, width=self.width, reuse=2, int8=True)
        m.d.comb += [arr.w.eq(self.a), arr.x.eq(self.b), arr.e8.eq(self.c[0:16]),
                     arr.i8.eq(self.c[16]), self.o.eq(arr.o)]
        return m


# name -> (factory, latency, input widths, output width, lanes)
CASES = {name: (cls, cls.LATENCY, ins, out, 16) for name, (cls, ins, out) in UNITS.items()}
CASES["fp32_min"] = (lambda: Fp32Max(minimum=True), Fp32Max.LATENCY, (32, 32), 32, 16)
for _name, _cls in SPECIALS.items():
    CASES[_name] = (_cls, _cls.LATENCY, (32,), 32, 4 if _name == "gelu" else 8)
CASES[f"adder_tree_{TREE_WIDTH}"] = (lambda: AdderTree(TREE_WIDTH), AdderTree.latency(TREE_WIDTH),
                                     (32 * TREE_WIDTH,), 32, 4)
# matrix unit v2's dot product at tiny's width and at u280x4's
for _w in (16, 64):
    CASES[f"bfp_dot_{_w}"] = ((lambda w=_w: Fp16Dot(w)), Fp16Dot.latency(_w), (16 * _w, 16 * _w), 32, 2)
    # its int8 rows: int8 weights, fp16 activations, the row's scale exponent
    CASES[f"i8_dot_{_w}"] = ((lambda w=_w: _I8DotABC(w)), I8Dot.latency(_w), (8 * _w, 16 * _w, 8), 32, 2)
# the array of an int8 build, switching between fp16 and int8 tiles step by step
CASES["dot_pair_16"] = ((lambda: _DotPair(16)), DotArray.latency(16), (16 * 16, 32 * 16, 24), 64, 2)


def run_unit(name, seed, n_random):
    factory, latency, ins, out, lanes = CASES[name]
    from gen.verilog import to_verilog
    top = f"arith_{name}_x{lanes}"
    path = BUILD / f"{top}.v"
    text = to_verilog(UnitArray(factory, latency, lanes, ins, out), top)
    BUILD.mkdir(parents=True, exist_ok=True)
    write_if_changed(path, text)
    run_cocotb([path], top, "sim.tb.tb_arith", extra_env={
        "GPTFPGA_UNIT": name, "GPTFPGA_LANES": str(lanes), "GPTFPGA_LATENCY": str(latency),
        "GPTFPGA_OUT_BITS": str(out), "GPTFPGA_N": str(n_random), "GPTFPGA_SEED": str(seed)})


@pytest.mark.rtl
@pytest.mark.parametrize("name", list(CASES))
def test_unit_rtl(name, seed):
    run_unit(name, seed, N_RANDOM)


@pytest.mark.soak
@pytest.mark.parametrize("name", list(CASES))
def test_unit_soak(name, seed):
    run_unit(name, seed + 1, 10_000_000)


# DotArrayI16 (int16 tiles and cache tiles through fewer aligners, step by step): every
# aligner count of a 4-lane array at tiny's width, the tokens of a step at R = 2
I16_ARRAYS = {"a4": dict(lanes=4, width=16, reuse=2, aligners=4),
              "a2": dict(lanes=4, width=16, reuse=1, aligners=2),
              "a1": dict(lanes=4, width=16, reuse=2, aligners=1)}


def run_dot_i16(name, seed, steps):
    from gen.verilog import to_verilog
    p = I16_ARRAYS[name]
    arr = DotArrayI16(**p)
    top = f"dot_i16_{name}"
    path = BUILD / f"{top}.v"
    text = to_verilog(arr, top)
    BUILD.mkdir(parents=True, exist_ok=True)
    write_if_changed(path, text)
    run_cocotb([path], top, "sim.tb.tb_dot_i16", extra_env={
        "GPTFPGA_PARAMS": json.dumps({**p, "latency": arr.LATENCY}),
        "GPTFPGA_N": str(steps), "GPTFPGA_SEED": str(seed)})


@pytest.mark.rtl
@pytest.mark.parametrize("name", ["a2", "a1"])
def test_dot_array_i16_rtl(name, seed):
    """DotArrayI16 against bfp_dot and i16_dot, step by step, the kinds mixed with no bubble
    (sim/tb/tb_dot_i16.py); the array with an aligner a lane (a4) in make soak."""
    run_dot_i16(name, seed, 3000)


@pytest.mark.soak
@pytest.mark.parametrize("name", list(I16_ARRAYS))
def test_dot_array_i16_soak(name, seed):
    run_dot_i16(name, seed + 1, 200_000)


def test_latencies_documented():
    """The latencies in docs/numerics.md are the units' own."""
    doc = (ROOT / "docs" / "numerics.md").read_text()
    for name, (_, latency, _, _, _) in CASES.items():
        assert f"| `{name}` | {latency} |" in doc, name


def test_reference_ieee_properties():
    """Spot checks of the references against the contract, independent of the RTL."""
    one, two = np.uint32(0x3F800000), np.uint32(0x40000000)
    assert A.fp32_add(one, one) == two
    assert A.fp32_add(np.uint32(0x3F800000), np.uint32(0xBF800000)) == 0           # x - x = +0
    assert A.fp32_add(np.uint32(0x80000000), np.uint32(0x80000000)) == 0x80000000  # -0 + -0 = -0
    assert A.fp32_add(np.uint32(0x7F800000), np.uint32(0xFF800000)) == A.F32_QNAN
    assert A.fp32_add(np.uint32(0x00000001), np.uint32(0)) == 0                     # DAZ
    assert A.fp32_mul(np.uint32(0x00800000), np.uint32(0x3F000000)) == 0            # FTZ
    assert A.fp32_mul(np.uint32(0x7F7FFFFF), two) == 0x7F800000                     # overflow
    assert A.fp32_to_fp16(A.bits32(65520.0)) == 0x7C00                               # tie -> inf
    assert A.fp32_to_fp16(A.bits32(2.0**-25)) == 0                                   # tie -> even 0
    assert A.fp32_to_fp16(A.bits32(3 * 2.0**-26)) == 1                               # subnormal
    assert A.fp16_to_fp32(np.uint16(1)) == A.bits32(2.0**-24)                        # exact
    assert A.fp32_max(np.uint32(0x80000000), np.uint32(0)) == 0
    assert A.fp32_min(np.uint32(0x80000000), np.uint32(0)) == 0x80000000


def _ulps(got_bits, ref64):
    got = A.f32(got_bits).astype(np.float64)
    spacing = np.spacing(np.abs(ref64.astype(np.float32))).astype(np.float64)
    return np.abs(got - ref64) / spacing


# Error bounds stated in docs/numerics.md, measured on dense sweeps against float64.
def test_special_function_error_bounds():
    x = np.linspace(-87.0, 88.0, 1_000_001).astype(np.float32)
    assert _ulps(A.exp(A.bits32(x)), np.exp(x.astype(np.float64))).max() <= 1.1
    x = np.exp2(np.linspace(-125, 125, 1_000_001)).astype(np.float32)
    assert _ulps(A.recip(A.bits32(x)), 1 / x.astype(np.float64)).max() <= 1.3
    assert _ulps(A.rsqrt(A.bits32(x)), 1 / np.sqrt(x.astype(np.float64))).max() <= 1.2
    x = np.linspace(-10, 10, 1_000_001).astype(np.float32)
    x64 = x.astype(np.float64)
    g64 = x64 / (1 + np.exp(-2 * np.sqrt(2 / np.pi) * (x64 + 0.044715 * x64**3)))
    assert np.abs(A.f32(A.gelu(A.bits32(x))) - g64).max() <= 6e-7
    x = np.linspace(-3, 3, 1_000_001).astype(np.float32)
    x64 = x.astype(np.float64)
    g64 = x64 / (1 + np.exp(-2 * np.sqrt(2 / np.pi) * (x64 + 0.044715 * x64**3)))
    assert _ulps(A.gelu(A.bits32(x)), g64).max() <= 16


