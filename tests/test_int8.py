"""Integer weights (core.weight_dtype int8 and int16, MATVEC.i8): the quantization, the
reference dot product, the ISS's MATVEC, the compiler's stream of tiles and scales, the whole
model against float64, and the card's RTL: random programs with integer MATVECs on Verilated
tiny-int8 and tiny-int16 cards, bit for bit against the ISS. (The demo model on 1 and 2 cards
against the ISS: tests/test_runtime.py::test_rtl_int8_matches_iss and
test_rtl_int16_matches_iss; the arrays alone: tests/test_arith.py, dot_pair_16 and
dot_array_i16.)
"""

import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from gen.config import ConfigError, load_config
from host.compiler import CompiledModel
from host.compiler.layout import i8_stream, stream_tiles
from host.compiler.quant import quantize_rows
from host.model import load_checkpoint
from host.tokenizer import load_tokenizer
from hw.isa import QGROUP, VOPS, decode, encode
from sim.ref import arith as A
from sim.ref import gpt2 as ref
from sim.ref.iss import Iss, IssError

ROOT = Path(__file__).resolve().parent.parent
TINY8 = ROOT / "configs" / "tiny-int8.yaml"
TINY16 = ROOT / "configs" / "tiny-int16.yaml"
QCONFIGS = {"int8": TINY8, "int16": TINY16}
DEMO = ROOT / "host" / "demo"
PROMPT = "The machine wrote"
# ISS with int8 weights against float64 (fp16 weights), demo model: worst logit error 7.0e-3
# of the spread over 24 steps (fp16 weights: 5.4e-4; int16: 2.1e-4); docs/numerics.md
INT8_LOGIT_TOL = 1.5e-2
INT16_LOGIT_TOL = 1e-3          # (tests/test_runtime.py's LOGIT_TOL for fp16 weights: 5e-3)


def _f32(bits):
    return np.asarray(bits, np.uint32).view(np.float32)


# -- quantization --------------------------------------------------------------------------

def test_quantize_rows(seed):
    rng = np.random.default_rng(seed)
    print(f"seed {seed}")
    w = rng.standard_normal((64, 300)) * np.exp2(rng.integers(-12, 4, (64, 1)))
    w[5] = 0.0
    q, e = quantize_rows(w)
    s = np.exp2(e.astype(np.float64) - 127)
    assert q.dtype == np.int8 and e.dtype == np.uint8
    assert (np.abs(q.astype(int)) <= 127).all()
    top = np.abs(q.astype(int)).max(axis=1)
    nz = np.abs(w).max(axis=1) > 0
    assert ((top[nz] >= 64) & (top[nz] <= 127)).all()          # the smallest power of two
    assert (q[5] == 0).all() and e[5] == 127                    # a zero row: scale 1
    err = np.abs(w / s[:, None] - q)
    assert (err <= 0.5).all()                                   # round to nearest
    # ties to even
    q2, e2 = quantize_rows(np.array([[2.5, -3.5, 0.5, 127.0, -1.5]]))
    assert e2[0] == 127 and q2[0].tolist() == [2, -4, 0, 127, -2]


def test_quantize_rows_keep_sum(seed):
    rng = np.random.default_rng(seed + 1)
    w = rng.standard_normal((40, 200))
    w -= w.mean(axis=1, keepdims=True)                          # a folded LayerNorm's rows
    q, e = quantize_rows(w, keep_sum=True)
    s = np.exp2(e.astype(np.float64) - 127)
    assert (q.astype(int).sum(axis=1) == 0).all()
    assert (np.abs(w / s[:, None] - q) < 1.0).all()
    q0, _ = quantize_rows(w)
    assert (q0.astype(int).sum(axis=1) != 0).any()              # plain rounding does not keep it


def test_quantize_rows_int16(seed):
    """int16: the row's largest weight maps to 16384..32767, round to nearest even, a zero
    row at scale 1, the rows' sums kept with keep_sum (|q| <= 32767)."""
    rng = np.random.default_rng(seed + 16)
    print(f"seed {seed}")
    w = rng.standard_normal((64, 300)) * np.exp2(rng.integers(-12, 4, (64, 1)))
    w[7] = 0.0
    w[9] *= 32767.0 / np.abs(w[9]).max()        # a row whose largest is 32767: scale 1
    for keep in (False, True):
        q, e = quantize_rows(w, keep_sum=keep, dtype=np.int16)
        s = np.exp2(e.astype(np.float64) - 127)
        assert q.dtype == np.int16 and e.dtype == np.uint8
        qi = q.astype(int)
        assert (np.abs(qi) <= 32767).all()
        top = np.abs(qi).max(axis=1)
        nz = np.abs(w).max(axis=1) > 0
        assert ((top[nz] >= 16384) & (top[nz] <= 32767)).all()
        assert (q[7] == 0).all() and e[7] == 127 and e[9] == 127
        err = np.abs(w / s[:, None] - qi)
        if keep:
            assert (err <= 1.0).all()
            assert np.array_equal(qi.sum(axis=1), np.rint((w / s[:, None]).sum(axis=1)))
        else:
            assert (err <= 0.5).all()
    q2, e2 = quantize_rows(np.array([[2.5, -3.5, 0.5, 32767.0, -1.5]]), dtype=np.int16)
    assert e2[0] == 127 and q2[0].tolist() == [2, -4, 0, 32767, -2]


@pytest.mark.parametrize("bad", [np.nan, np.inf, -np.inf])
def test_quantize_rows_refuses_non_finite(bad):
    w = np.ones((2, 8))
    w[1, 3] = bad
    with pytest.raises(ValueError, match="NaN or an infinity"):
        quantize_rows(w)


# -- the reference dot product -------------------------------------------------------------

def _x(rng, n, W):
    x = rng.standard_normal((n, W)) * np.exp2(rng.integers(-6, 6, (n, W)))
    return x.astype(np.float16).view(np.uint16)


def test_i8_dot_is_bfp_dot_of_the_integers(seed):
    """At scale 1 an int8 row is exact in fp16 and exact after its alignment (8 bits within
    the 17 of a weight), so i8_dot equals the fp16 dot product of the same integers."""
    rng = np.random.default_rng(seed + 2)
    W = 64
    q = rng.integers(-128, 128, (500, W)).astype(np.int8)
    q[0] = -128
    q[1] = 127
    q[2] = 0
    x = _x(rng, 500, W)
    got = A.i8_dot(q, x, 127)
    want = A.bfp_dot(A.int8_to_fp16(q), x)
    assert np.array_equal(got, want)


def test_i8_dot_scale_and_range(seed):
    rng = np.random.default_rng(seed + 3)
    W = 16
    q = rng.integers(-127, 128, (400, W)).astype(np.int8)
    x = _x(rng, 400, W)
    x[200:] = (rng.standard_normal((200, W)) * 2.0 ** -13).astype(np.float16).view(np.uint16)
    base = _f32(A.i8_dot(q, x, 127)).astype(np.float64)
    for e in (100, 127, 140):                                   # exact powers of two in range
        assert np.array_equal(_f32(A.i8_dot(q, x, e)).astype(np.float64), base * 2.0 ** (e - 127))
    # at the bottom of fp32's range: normal results scale exactly, those below it are flushed
    # to zero with their sign; at the top, infinity
    for e in (0, 1, 5):
        got = _f32(A.i8_dot(q, x, e)).astype(np.float64)
        want = base * 2.0 ** (e - 127)
        normal = np.abs(want) >= 2.0 ** -126
        below = np.abs(want) < 2.0 ** -126 * 0.99
        assert np.array_equal(got[normal], want[normal]), e
        assert (got[below] == 0).all() and (np.signbit(got[below]) == (want[below] < 0)).all(), e
        assert below.any() or e == 5
    big = _f32(A.i8_dot(q[:200], x[:200], 255)).astype(np.float64)
    want = base[:200] * 2.0 ** 128
    over = np.abs(want) >= 2.0 ** 128
    assert over.any() and np.isinf(big[over]).all() and (np.sign(big[over]) == np.sign(want[over])).all()
    assert np.array_equal(big[~over], want[~over])
    assert np.array_equal(A.i8_dot(np.zeros((1, W), np.int8), x[:1], 127), [0])   # +0


def test_i8_dot_specials():
    one = np.float16(1).view(np.uint16)
    inf, nan = np.float16(np.inf).view(np.uint16), np.float16(np.nan).view(np.uint16)
    ninf = np.float16(-np.inf).view(np.uint16)
    x = np.array([[inf, one, one, one], [inf, one, one, one], [nan, one, one, one],
                  [inf, ninf, one, one]], np.uint16)
    q = np.array([[3, 1, 1, 1], [0, 1, 1, 1], [1, 1, 1, 1], [1, 1, 1, 1]], np.int8)
    r = _f32(A.i8_dot(q, x, 127))
    assert r[0] == np.inf                                       # inf x 3
    assert np.isnan(r[1])                                       # inf x a zero weight
    assert np.isnan(r[2])
    assert np.isnan(r[3])                                       # +inf and -inf
    assert _f32(A.i8_dot(np.array([[-2, 1, 1, 1]], np.int8), x[:1], 127))[0] == -np.inf


# -- the ISS's MATVEC.i8 -------------------------------------------------------------------

def _iss_matvec(cfg, q, e, x, *, tokens=1, group=8, bias=None, **fields):
    """Run one i8 MATVEC of matrix q (rows x cols int8, exponents e) on token vectors x [T,
    cols] on a fresh ISS; the output rows [T, rows] (fp32)."""
    iss = Iss(cfg)
    L2, W, S = cfg.core.tile_rows, cfg.core.width, cfg.stripe_bytes
    data, rb, cb = i8_stream(q, e, L2, W, group, S)
    from host.stripes import write_stripes
    write_stripes(_Dev(iss), cfg, 10, data.reshape(-1))
    T = tokens
    xs = np.zeros((T, cb * W), np.float16)
    xs[:, :x.shape[1]] = x
    iss.xb[:T * cb * W] = xs.view(np.uint16).reshape(-1)
    P = cfg.core.vector_lanes                     # (MATVEC's addresses are rows)
    f = dict(xb=0, dst=4096 // P, rb=rb, cb=cb, group=group, tokens=T, xstride=cb if T > 1 else 0,
             dstride=rb * L2 // P if T > 1 else 0, i8=1, **fields)
    if bias is not None:
        iss.vsp[1024:1024 + rb * L2] = np.zeros(rb * L2, np.float32).view(np.uint32)
        iss.vsp[1024:1024 + len(bias)] = np.asarray(bias, np.float32).view(np.uint32)
        f.update(bias=1024 // P, bias_en=1)
    iss.fifo = []
    for w in (encode("WLOAD", row=10, tiles=stream_tiles(rb, cb, group, True)), encode("MATVEC", **f)):
        iss.step(decode(w))
    assert not iss.fifo
    out = iss.vsp[4096:4096 + T * rb * L2].view(np.float32).reshape(T, rb * L2)
    return out[:, :q.shape[0]], rb, cb


class _Dev:
    """Just enough of a Device for write_stripes into an Iss."""

    def __init__(self, iss):
        self.iss = iss

    def write_hbm(self, channel, offset, data):
        self.iss.hbm[channel][offset:offset + len(data)] = data


@pytest.mark.parametrize("dtype", ["int8", "int16"])
def test_iss_i8_matvec(seed, dtype):
    """One MATVEC.i8 (several groups, the last one short; 1 and 3 tokens; with a bias) equals
    the reference dot products per column block, summed in the accumulator's order (an int8
    build's tiles of 2 L int8 rows, an int16 build's of L int16 rows)."""
    cfg = load_config(QCONFIGS[dtype])
    rng = np.random.default_rng(seed + 4)
    W, L2 = cfg.core.width, cfg.core.tile_rows
    rows, cols = 150, 40                         # 19 (int16: 38) row blocks, 3 column blocks
    w = rng.standard_normal((rows, cols)) * np.exp2(rng.integers(-8, 2, (rows, 1)))
    q, e = quantize_rows(w, dtype=np.dtype(dtype))
    if dtype == "int16":
        q[3, :5] = [-32768, 32767, 0, -1, 1]                    # the extremes in one row
    for T in (1, 3):
        x = rng.standard_normal((T, cols)).astype(np.float16)
        bias = rng.standard_normal(rows).astype(np.float32)
        got, rb, cb = _iss_matvec(cfg, q, e, x, tokens=T, bias=bias)
        qp = np.zeros((rb * L2, cb * W), q.dtype)
        qp[:rows, :cols] = q
        ep = np.full(rb * L2, 127, np.uint8)
        ep[:rows] = e
        xp = np.zeros((T, cb * W), np.float16)
        xp[:, :cols] = x
        acc = np.zeros((T, rb * L2), np.uint32)
        acc[:, :rows] = np.asarray(bias, np.float32).view(np.uint32)
        for c in range(cb):
            part = A.int_dot(qp[None, :, c * W:(c + 1) * W], xp.view(np.uint16)[:, None, c * W:(c + 1) * W],
                             ep[None, :])
            acc = A.fp32_add(acc, part)
        assert np.array_equal(got.view(np.uint32), acc[:, :rows]), T


@pytest.mark.parametrize("case", ["fp16 build", "tt", "group too large", "int16 tt",
                                  "int16 group too large", "group over QGROUP",
                                  "int16 group over QGROUP"])
def test_iss_i8_bad_field(case):
    cfg = load_config(ROOT / "configs" / "tiny.yaml" if case == "fp16 build"
                      else TINY16 if case.startswith("int16") else TINY8)
    iss = Iss(cfg)
    f = dict(xb=0, dst=0, rb=1, cb=1, group=1, tokens=1, i8=1)
    if case.endswith("tt"):
        f["tt"] = 1
    if case.endswith("group too large"):      # a group's scales must fit in one stripe row
        f["group"] = cfg.stripe_bytes // cfg.core.tile_rows + 1
        f["rb"] = f["group"]
    if case.endswith("over QGROUP"):          # ... and in the scale register
        f["group"] = f["rb"] = QGROUP + 1
        assert f["group"] * cfg.core.tile_rows <= cfg.stripe_bytes
    iss.fifo = []
    with pytest.raises(IssError) as e:
        iss.step(decode(encode("MATVEC", **f)))
    assert e.value.code == 2                # BAD_FIELD


# -- the compiler --------------------------------------------------------------------------

@pytest.fixture(scope="module")
def demo():
    return load_checkpoint(DEMO), load_tokenizer(DEMO)


@pytest.mark.parametrize("config, shape", [("tiny", None), ("tiny-int8", None), ("tiny-int16", None),
                                           ("u280x4", "gpt2-xl")])
def test_every_mlp_row_gets_its_gelu_once(demo, config, shape):
    """c_fc's chunks get their GELU in pairs, the last two alone; with an odd number of
    chunks before those (tiny-int8: 3 chunks; GPT-2 1.5B on one u280x4 card: 5) the first
    used to be left out. Every row of the MLP's hidden vector, every token, once a layer."""
    from host.model import SHAPES, Gpt2
    cfg = load_config(ROOT / "configs" / f"{config}.yaml").replace(cards=1)
    model = demo[0] if shape is None else Gpt2(SHAPES[shape], None)      # shapes only
    cm = CompiledModel(cfg, model, all_logits=shape is None)
    v_h, fS = cm.plan.v_h, cm.dims.fS
    for T in range(1, min(2, cm.T) + 1):
        seen = np.zeros(T * fS, int)
        for w in cm.step(list(range(1, T + 1)), 0):
            d = decode(w)
            if d.op == "VEC" and d.vop == VOPS["GELU"][0] and v_h <= d.dst < v_h + T * fS:
                seen[d.dst - v_h:d.dst - v_h + d.n] += 1
        n = cm.sh.n_layer                                       # once a layer
        assert (seen == n).all(), (config, T, np.nonzero(seen != n)[0][:10])


@pytest.mark.parametrize("dtype", ["int8", "int16"])
def test_int8_image_streams_scales(demo, dtype):
    """Each integer matrix in HBM: per group a row of exponents, then its tiles (2L int8 rows,
    L int16)."""
    cfg = load_config(QCONFIGS[dtype]).replace(cards=1)
    cm = CompiledModel(cfg, demo[0], all_logits=True)
    mats = [m for lay in cm.hbm.layers for m in (lay.qkv, lay.proj, lay.fc, *(p for p, _ in lay.fc2))]
    mats.append(cm.hbm.head)
    groups = sum(-(-m.rb // 8) for m in mats)
    tiles = sum(m.rb * m.cb for m in mats)
    # the i8 MATVECs of a step claim exactly those rows: tiles and scale rows
    words = [decode(w) for w in cm.step([1], 0)]
    rb_cb = [(d.rb, d.cb, d.group) for d in words if d.op == "MATVEC" and d.i8]
    assert sum(r * c for r, c, _ in rb_cb) == tiles
    assert sum(-(-r // g) for r, _, g in rb_cb) == groups
    assert not any(d.i8 for d in words if d.op == "MATVEC" and d.tt)
    err = cm.img.quant_error()
    assert err is not None and 0 < err[1] <= err[0] < (0.05 if dtype == "int8" else 2e-4)


def _greedy_float64(model, ids, steps):
    sh = model.shape
    seq, logits = list(ids), []
    for _ in range(steps):
        lg = ref.forward(model.weights, seq, sh.n_head, sh.n_layer, sh.eps)[-1]
        logits.append(lg)
        seq.append(int(np.argmax(lg)))
    return seq[len(ids):], np.stack(logits)


@pytest.mark.parametrize("dtype, cards", [("int8", 1), ("int8", 2), ("int16", 1), ("int16", 2)])
def test_iss_int8_against_float64(demo, dtype, cards):
    """The demo model with int8 (int16) weights on the ISS (1 and 2 cards) against float64
    with the checkpoint's fp16 weights: greedy tokens equal wherever float64's top-2 margin is
    clear (over 2% of the logits' spread), the worst logit error within INT8_LOGIT_TOL
    (INT16_LOGIT_TOL)."""
    from host.runtime import generate, make_cards
    model, tok = demo
    cfg = load_config(QCONFIGS[dtype]).replace(cards=cards)
    ids = tok.encode(PROMPT)
    app = make_cards(cfg, model, "iss", cards)
    out, logits, _ = generate(cfg, app, None, ids, 24, keep_logits=True)
    want, wl = _greedy_float64(model, ids, 24)
    spread = wl.max(-1) - wl.min(-1)
    top2 = np.sort(wl, -1)[:, -2:]
    clear = (top2[:, 1] - top2[:, 0]) / spread > 0.02
    for k in range(24):                # up to the first unclear step both follow the same text
        if not clear[k]:
            break
        assert out[k] == want[k], (k, out, want)
    err = (np.abs(logits - wl).max(-1) / spread).max()
    print(f"{dtype} ISS on {cards} card(s) vs float64: worst logit error {err:.2e} of the spread")
    assert err < (INT8_LOGIT_TOL if dtype == "int8" else INT16_LOGIT_TOL)


# -- what the config refuses ---------------------------------------------------------------

def test_int8_needs_reuse_two():
    cfg = load_config(TINY8)
    with pytest.raises(ConfigError, match=r"core.weight_dtype: got 'int8' with core.reuse 1"):
        cfg.replace(**{"core.reuse": 1})


def test_cache_phases_only_int16_and_dividing_lanes():
    with pytest.raises(ConfigError, match=r"core.cache_phases: got 2 with core.weight_dtype "
                                          r"'int8'; allowed: 1"):
        load_config(TINY8).replace(**{"core.cache_phases": 2})
    with pytest.raises(ConfigError, match=r"core.cache_phases: got 8; allowed: a divisor of "
                                          r"core.lanes \(4\)"):
        load_config(TINY16).replace(**{"core.cache_phases": 8})
    assert load_config(TINY16).replace(**{"core.reuse": 1}).core.reuse == 1   # R = 1 is fine


# -- the card's RTL -------------------------------------------------------------------------

N_RTL_PROGRAMS = 60


@pytest.mark.rtl
@pytest.mark.parametrize("dtype", ["int8", "int16"])
def test_random_programs_rtl(seed, dtype):
    """Random valid programs on a Verilated tiny-int8 (tiny-int16) card, half of their MATVECs
    integer (random int8 or int16 tiles with zeros and both extremes, scale rows near 2^0 with
    a few extremes, several groups, several tokens, a bias shared or per token, mixed with
    fp16 MATVECs, transposed or not: in tiny-int16 those take 4 phases a step): status,
    counters, HBM outputs and the VSP bit for bit against the ISS (tests/test_core.py runs
    them on an fp16 card; the soak runs hundreds here). Then a MATVEC.i8 whose group is over
    QGROUP (its scales would fit the stripe, not the scale register) stops the card with
    BAD_FIELD at its pc, as the ISS."""
    from hw.isa import ERROR_CODES
    from sim.progs import compare_runs, fresh_pair, random_programs
    from sim.system import RtlDevice
    cfg = load_config(QCONFIGS[dtype])
    rtl = RtlDevice(cfg)
    ops = random_programs(cfg, rtl, seed, N_RTL_PROGRAMS)
    want = {"MATVEC.i8", "MATVEC.i8.btok", "MATVEC.i8.tokens", "MATVEC.btok", "WLOAD"}
    assert want <= ops, f"not covered: {want - ops}"
    g = QGROUP + 1
    assert g * cfg.core.tile_rows <= cfg.stripe_bytes
    lay, _, iss = fresh_pair(cfg, rtl, seed)
    prog = [encode("WLOAD", row=64, tiles=g + 1),
            encode("MATVEC", rb=g, cb=1, group=g, tokens=1, i8=1), encode("HALT")]
    c = compare_runs(cfg, lay, iss, rtl, prog)
    assert c["status"] == (1 << 8 | ERROR_CODES["BAD_FIELD"]), f"status {c['status']:#x}"


@pytest.mark.soak
@pytest.mark.parametrize("dtype", ["int8", "int16"])
def test_random_programs_rtl_soak(seed, dtype):
    from sim.progs import random_programs
    from sim.system import RtlDevice
    cfg = load_config(QCONFIGS[dtype])
    random_programs(cfg, RtlDevice(cfg), seed + 1, 1000)


def test_cli_int8_refuses_non_finite_checkpoint(tmp_path):
    """An int8 run of a checkpoint with a NaN: one line naming the tensor, exit 2 (the load
    refuses it before the quantizer would)."""
    import shutil

    from safetensors.numpy import load_file, save_file
    d = tmp_path / "model"
    shutil.copytree(DEMO, d)
    t = load_file(d / "model.safetensors")
    name = next(k for k in t if k.endswith("mlp.c_fc.weight"))
    t[name] = t[name].copy()
    t[name].flat[7] = np.nan
    save_file(t, d / "model.safetensors")
    p = subprocess.run([sys.executable, "-m", "host.cli", "run", "--config", str(TINY8), "--model",
                        str(d), "--new-tokens", "2"], capture_output=True, text=True, cwd=ROOT)
    lines = [x for x in p.stderr.splitlines() if x.startswith("gptfpga:")]
    assert p.returncode == 2 and len(lines) == 1 and "holds nan" in lines[0], p.stderr
    assert "Traceback" not in p.stderr
