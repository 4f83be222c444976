"""cocotb regression of hw.arith.dot.DotArrayI16 against sim.ref.arith (bfp_dot, i16_dot).

Environment: GPTFPGA_PARAMS (JSON: lanes, width, reuse, aligners, latency), GPTFPGA_N (steps),
GPTFPGA_SEED.

A random sequence of steps, one issue cycle each for an int16 tile and P = lanes / aligners
for a cache tile (``phase`` 0 .. P - 1, the tile and the activations held; a third of them
given stored transposed, ``tt``), back to back in any order, with a few idle cycles of random
inputs between them. Every int16 step's outputs are checked ``latency`` cycles after its
cycle and every cache step's after its last phase,
all lanes and tokens, bit for bit: int16 rows against ``i16_dot`` (int16 extremes, zero rows,
every scale exponent, specials in the activations), fp16 cache tiles against ``bfp_dot``
(sim/ref/vectors.py's corners and random rows, specials in both).
"""

import json
import os

import cocotb
import numpy as np
from cocotb.clock import Clock
from cocotb.triggers import ReadOnly, RisingEdge

from sim.ref import arith as A
from sim.ref.vectors import F16_SPECIALS, _dot_vectors, _f16_rows

P_ = json.loads(os.environ["GPTFPGA_PARAMS"])
L, W, R, AL, LAT = P_["lanes"], P_["width"], P_["reuse"], P_["aligners"], P_["latency"]
PH = L // AL
N = int(os.environ["GPTFPGA_N"])
SEED = int(os.environ["GPTFPGA_SEED"])


def _int(arr):
    return int.from_bytes(np.ascontiguousarray(arr).tobytes(), "little")


def _q_rows(rng, n):
    """int16 rows: the extremes, zero rows, small values, the whole range."""
    kind = rng.integers(0, 6, n)
    q = rng.integers(-32768, 32768, (n, W))
    q[kind == 0] = rng.choice([-32768, 32767, 0, -1, 1], (int((kind == 0).sum()), W))
    q[kind == 1] = 0
    q[kind == 2] = rng.integers(-128, 128, (int((kind == 2).sum()), W))
    q[kind == 3] = rng.choice([-32768, 32767], (int((kind == 3).sum()), W))
    return q.astype(np.int16)


def _x_blocks(rng, n):
    """fp16 activations: a layer's spread, the whole range, raw bits, a special now and then."""
    kind = rng.integers(0, 4, n)
    x = _f16_rows(rng, n, W, 10, 19)
    x[kind == 1] = _f16_rows(rng, int((kind == 1).sum()), W, 1, 30)
    x[kind == 2] = rng.integers(0, 1 << 16, (int((kind == 2).sum()), W), dtype=np.uint16)
    sp = np.nonzero(kind == 3)[0]
    x[sp, rng.integers(0, W, len(sp))] = rng.choice(F16_SPECIALS, len(sp))
    return x


@cocotb.test()
async def steps_against_reference(dut):
    rng = np.random.default_rng(SEED)
    print(f"tb_dot_i16: seed={SEED} lanes={L} width={W} reuse={R} aligners={AL} "
          f"(phases {PH}) latency={LAT} steps={N}")
    cw, cx = _dot_vectors(W, 4 * N, rng)          # cache tiles' rows and blocks, corners first
    nc = len(cw) // L
    steps = []                                     # (kind, w, x, e, tt)
    ci = 0
    for _ in range(N):
        kind = rng.choice(["int16", "cache", "idle"], p=[0.5, 0.42, 0.08])
        if kind == "cache" and ci < nc:
            w = cw[ci * L:(ci + 1) * L]
            x = cx[ci * L:ci * L + R] if rng.random() < 0.5 else _x_blocks(rng, R)
            ci += 1
            steps.append(("cache", w, x, rng.integers(0, 256, L).astype(np.uint8),
                          int(rng.random() < 0.33)))
        elif kind == "idle":
            steps.append(("idle", rng.integers(0, 1 << 16, (L, W), dtype=np.uint16),
                          _x_blocks(rng, R), rng.integers(0, 256, L).astype(np.uint8),
                          int(rng.integers(0, 2))))
        else:       # (tt is ignored for an int16 tile: given at random)
            e = np.where(rng.random(L) < 0.5, rng.integers(0, 256, L), rng.integers(100, 130, L))
            steps.append(("int16", _q_rows(rng, L).view(np.uint16), _x_blocks(rng, R),
                          e.astype(np.uint8), int(rng.integers(0, 2))))
    kinds = [s[0] for s in steps]
    assert "cache" in kinds and "int16" in kinds

    # expected results, [steps, R, L]
    exp = np.zeros((len(steps), R, L), np.uint32)
    for kind in ("int16", "cache"):
        idx = [i for i, k in enumerate(kinds) if k == kind]
        w = np.stack([steps[i][1] for i in idx])
        x = np.stack([steps[i][2] for i in idx])
        if kind == "int16":
            e = np.stack([steps[i][3] for i in idx])
            exp[idx] = A.i16_dot(w.view(np.int16)[:, None], x[:, :, None], e[:, None, :])
        else:
            exp[idx] = A.bfp_dot(w[:, None], x[:, :, None])

    # issue cycles: (step index or None, cache bit, phase)
    issue = []
    for i, (kind, *_rest) in enumerate(steps):
        if kind == "cache":
            issue += [(i, 1, g, g == PH - 1) for g in range(PH)]
        elif kind == "int16":
            issue.append((i, 0, 0, True))
        else:
            issue.append((i, int(rng.integers(0, 2)), int(rng.integers(0, PH)), False))
    issue += [(None, 0, 0, False)] * (LAT + 2)

    cocotb.start_soon(Clock(dut.clk, 4, unit="ns").start())
    dut.rst.value = 1
    await RisingEdge(dut.clk)
    dut.rst.value = 0
    checked, bad = 0, []
    for cyc, (i, cache, phase, _result) in enumerate(issue):
        if i is not None:
            kind, w, x, e, tt = steps[i]
            # a transposed cache tile: element (r, c) at c * lanes + r
            wv = w.T if (tt and kind == "cache") else w
            dut.w.value, dut.x.value, dut.e.value = _int(wv), _int(x), _int(e)
            dut.tt.value = tt
        dut.cache.value = cache
        if PH > 1:
            dut.phase.value = phase
        await ReadOnly()
        j = cyc - LAT
        if j >= 0 and issue[j][3]:
            s = issue[j][0]
            got = np.frombuffer(int(dut.o.value).to_bytes(4 * R * L, "little"), np.uint32).reshape(R, L)
            checked += 1
            if not np.array_equal(got, exp[s]) and len(bad) < 6:
                bad.append(f"  step {s} ({kinds[s]}, issued cycle {j}): rtl "
                           f"{[hex(v) for v in got.ravel()]} ref {[hex(v) for v in exp[s].ravel()]}")
        await RisingEdge(dut.clk)
    want = sum(1 for k in kinds if k != "idle")
    assert checked == want, (checked, want)
    assert not bad, f"DotArrayI16: steps differ (seed {SEED}):\n" + "\n".join(bad)
    ntt = sum(1 for s in steps if s[0] == "cache" and s[4])
    print(f"tb_dot_i16: {checked} steps ({kinds.count('int16')} int16, {kinds.count('cache')} "
          f"cache, {ntt} of them transposed) bit-exact")
