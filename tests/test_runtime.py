"""The host runtime: the demo model, tokenizer, generation loop and `gptfpga run`.

- the demo model loads (safetensors, shapes checked) and its tokenizer round-trips text;
- ISS against the float64 GPT-2: logits of every generated position within the stated
  tolerance and the same greedy tokens over 32 steps (1 card);
- RTL against ISS: bit-identical logits and tokens (1 card; 8 steps here, 32 in soak; 2 cards
  of the Verilated ring against the ISS ring, 4 cards in soak);
- RTL with random stalls on every HBM port and link against RTL without: bit-identical tokens,
  logits, HBM images and VSP (1 and 2 cards, 3 steps here; more steps, 4 cards and other stall
  rates in soak);
- sampling is seeded and respects top-k;
- bad input gives one line and exit code 2.
"""

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from gen.config import load_config
from host.compiler import CompiledModel
from host.model import load_checkpoint
from host.runtime import DEMO_MODEL, Sampling, generate, pick
from host.tokenizer import load_tokenizer
from sim.ref import gpt2 as ref

ROOT = Path(__file__).resolve().parent.parent
CFG = ROOT / "configs" / "tiny.yaml"
PROMPT = "The machine wrote"
# Largest |logit difference| between the ISS (fp16 weights and activations into the matrix
# unit, fp32 accumulation and vector unit) and float64 on the fp16 weights, relative to the
# logits' spread (max - min) at that position.
LOGIT_TOL = 5e-3


@pytest.fixture(scope="module")
def demo():
    cfg = load_config(CFG)            # 2 cards: the card kernel with its ring links, run alone
    model = load_checkpoint(DEMO_MODEL)
    tok = load_tokenizer(DEMO_MODEL)
    return cfg, model, tok


def test_demo_model_and_tokenizer(demo):
    cfg, model, tok = demo
    sh = model.shape
    lim = load_config(CFG).core.limits
    assert (sh.d_model, sh.n_head, sh.n_layer) == (128, 4, 4)
    assert sh.vocab <= lim.vocab and sh.n_positions <= lim.seq_len
    ids = tok.encode(PROMPT)
    assert all(0 <= i < sh.vocab for i in ids) and tok.decode(ids) == PROMPT
    # Weights are stored in fp16: the float32 copy must be exactly representable.
    w = model.weights["h.0.attn.c_attn.weight"]
    assert np.array_equal(w.astype(np.float16).astype(np.float32), w)


def _greedy_float64(model, ids, steps):
    sh = model.shape
    seq, out, logits = list(ids), [], []
    for _ in range(steps):
        lg = ref.forward(model.weights, seq, sh.n_head, sh.n_layer, sh.eps)[-1]
        logits.append(lg)
        out.append(int(np.argmax(lg)))
        seq.append(out[-1])
    return out, np.stack(logits)


@pytest.mark.parametrize("cards", [1, 2, 3, 4])
def test_iss_matches_float64(demo, cards):
    """1 card, and the model split over 2, 3 and 4 cards of the ISS ring (heads, MLP columns
    and vocabulary shared out; all-reduces after the projections). 3 cards share the 4 heads
    and 512 MLP columns unevenly (1, 1, 2 heads; 170, 171, 171 columns), as GPT-2 1.5B's 25
    heads go over 4 cards."""
    from host.runtime import make_cards
    cfg, model, tok = demo
    ids = tok.encode(PROMPT)
    appliance = make_cards(cfg.replace(cards=cards), model, "iss", cards)
    out, logits, stats = generate(cfg, appliance, None, ids, 32, keep_logits=True)
    want, want_logits = _greedy_float64(model, ids, 32)
    assert out == want, f"{cards} cards: greedy tokens differ: {out} vs {want}"
    spread = want_logits.max(-1) - want_logits.min(-1)
    err = (np.abs(logits - want_logits).max(-1) / spread).max()
    print(f"ISS on {cards} card(s) vs float64: worst logit error {err:.2e} of the spread over 32 steps")
    assert err < LOGIT_TOL
    assert len(stats.decode_steps) == 31 and stats.prompt_tokens == len(ids)
    link = stats.summary(cfg)["link_bytes_per_token"]
    # two all-reduces per layer of d_model fp32 words; in decode each is an all-gather (every
    # card's vector sent on to the N-1 others) and the sum on every card
    B = cfg.link.data_bits // 32
    msg = -(-model.shape.d_model // B) * B * 4
    assert link == 2 * model.shape.n_layer * cards * (cards - 1) * msg


def _rtl_vs_iss(demo, steps):
    from sim.ref.iss import IssDevice
    from sim.system import RtlDevice
    cfg, model, tok = demo
    ids = tok.encode(PROMPT)
    runs = []
    for dev in (IssDevice(cfg), RtlDevice(cfg)):
        cm = CompiledModel(cfg, model)
        runs.append(generate(cfg, cm, dev, ids, steps, keep_logits=True))
    (t0, l0, _), (t1, l1, s1) = runs
    assert t0 == t1
    assert np.array_equal(l0.view(np.uint32), l1.view(np.uint32))
    fig = s1.summary(cfg)
    assert fig["decode_cycles_per_token"] > 0 and 0 < fig["hbm_utilization_decode"] <= 1


@pytest.mark.rtl
def test_rtl_matches_iss(demo):
    _rtl_vs_iss(demo, 8)


@pytest.mark.soak
def test_rtl_matches_iss_32_steps(demo):
    _rtl_vs_iss(demo, 32)


def _rtl_ring_vs_iss(demo, cards, steps, cfg=None):
    """The demo model split over ``cards`` Verilated cards joined by link models (``cfg``'s,
    else the demo's), against the same split on the ISS ring: identical tokens,
    bit-identical logits, the same HBM and link traffic."""
    from host.runtime import make_cards
    dcfg, model, tok = demo
    cfg = cfg or dcfg
    ids = tok.encode(PROMPT)
    runs = [generate(cfg, make_cards(cfg, model, b, cards), None, ids, steps, keep_logits=True)
            for b in ("iss", "rtl")]
    (t0, l0, s0), (t1, l1, s1) = runs
    assert t0 == t1
    assert np.array_equal(l0.view(np.uint32), l1.view(np.uint32))
    f0, f1 = s0.summary(cfg), s1.summary(cfg)
    assert f1["link_bytes_per_token"] == f0["link_bytes_per_token"]
    assert (f1["link_bytes_per_token"] > 0) == (cards > 1)
    assert f1["hbm_bytes_per_token"] == f0["hbm_bytes_per_token"] > 0
    assert f1["decode_cycles_per_token"] > 0
    print(f"{cfg.name}, {cards} RTL card(s): {f1['prefill_cycles_per_token']} prefill and "
          f"{f1['decode_cycles_per_token']} decode cycles per token, HBM utilization "
          f"{f1['hbm_utilization_decode']}")


@pytest.mark.rtl
def test_rtl_ring_matches_iss(demo):
    _rtl_ring_vs_iss(demo, 2, 8)


@pytest.mark.rtl
@pytest.mark.parametrize("cards", [1, 2])
def test_rtl_int8_matches_iss(demo, cards):
    """The demo model with int8 weights (configs/tiny-int8.yaml, quantized by the compiler)
    on 1 and 2 Verilated cards: the same tokens and bit-identical logits as the ISS, the same
    HBM traffic (tests/test_int8.py has the rest of int8). One card is a build of cards: 1 (no
    ring links, no collective unit: make test's one Verilated card of that kind)."""
    _rtl_ring_vs_iss(demo, cards, 6,
                     cfg=load_config(ROOT / "configs" / "tiny-int8.yaml").replace(cards=cards))


@pytest.mark.rtl
@pytest.mark.parametrize("cards", [1, 2])
def test_rtl_int16_matches_iss(demo, cards):
    """The demo model with int16 weights (configs/tiny-int16.yaml: the weights quantized by the
    compiler, the K and V caches' fp16 tiles through one row alignment in 4 phases) on 1 and 2
    Verilated cards: the same tokens and bit-identical logits as the ISS (tests/test_int8.py
    has the rest of the integer weights). One card runs on the ring's build (one Verilated
    library for tiny-int16; int8's one card is the build without ring links)."""
    _rtl_ring_vs_iss(demo, cards, 6, cfg=load_config(ROOT / "configs" / "tiny-int16.yaml"))


@pytest.mark.soak
def test_rtl_ring_of_four_matches_iss(demo):
    _rtl_ring_vs_iss(demo, 4, 32)


def _demo_on_cards(demo, cards, steps, *, stalls=None):
    """The demo model on ``cards`` Verilated cards (``stalls``: sim.system.Stalls on their HBM
    and link models); returns tokens, logits, summary figures, and per card its HBM image
    (rows [0, next_row): weights, K/V caches, logits) and its VSP at the end (stored raw by one
    more program)."""
    from host.runtime import Cards, compile_model
    from host.stripes import read_stripes
    from hw.isa import encode
    from sim.progs import Layout, ProgramGen
    from sim.system import RtlAppliance
    cfg, model, tok = demo
    app = RtlAppliance(cfg, cards, stalls=stalls)
    cms = compile_model(cfg, model, cards)
    toks, logits, stats = generate(cfg, Cards(cms, app.devices, app if cards > 1 else None), None,
                                   tok.encode(PROMPT), steps, keep_logits=True)
    images, vsps = [], []
    lay = Layout(cfg)
    lay.dump_row = max(cm.img.next_row for cm in cms)
    dump = ProgramGen(cfg, np.random.default_rng(0), lay).dump(cfg.core.vsp_words) + [encode("HALT")]
    at = (cfg.hbm.channel_mbytes << 20) - 16 * (len(dump) + 16)     # clear of everything else
    status = app.run([dump] * cards, at) if cards > 1 else [app.devices[0].run(dump, at)["status"]]
    assert status == [(len(dump) - 1) << 8] * cards, status
    for cm, dev in zip(cms, app.devices, strict=True):
        images.append(read_stripes(dev, cfg, 0, cm.img.next_row))
        vsps.append(read_stripes(dev, cfg, lay.dump_row, lay.dump_rows))
    app.close()
    return toks, logits, stats.summary(cfg), images, vsps


def _stalled_matches_unstalled(demo, cards, steps, stalls):
    """The demo model on cards whose HBM and link models stall at random against the same cards
    unstalled: identical tokens and bit-identical logits, HBM images and VSP contents; only
    the cycles differ (printed: the slowdown)."""
    from sim.system import build_card
    build_card(demo[0])
    runs = [_demo_on_cards(demo, cards, steps, stalls=st) for st in (None, stalls)]
    (t0, l0, f0, img0, vsp0), (t1, l1, f1, img1, vsp1) = runs
    assert t1 == t0, f"{stalls}: tokens {t1}, unstalled {t0}"
    assert np.array_equal(l1.view(np.uint32), l0.view(np.uint32)), f"{stalls}: logits differ"
    for i in range(cards):
        for what, a, b in (("HBM image", img0[i], img1[i]), ("VSP", vsp0[i], vsp1[i])):
            bad = np.flatnonzero(a != b)
            assert bad.size == 0, f"{stalls}: card {i} {what}: {bad.size} bytes differ, first at {bad[:8]}"
    assert f1["hbm_bytes_per_token"] == f0["hbm_bytes_per_token"]
    assert f1["link_bytes_per_token"] == f0["link_bytes_per_token"]
    slow = {k: (f0[k], f1[k], round(f1[k] / f0[k], 3))
            for k in ("prefill_cycles", "decode_cycles_per_token")}
    print(f"{cards} card(s), {steps} steps, {stalls}: cycles unstalled -> stalled (ratio) {slow}")
    assert f1["decode_cycles_per_token"] > f0["decode_cycles_per_token"], "the stalls stalled nothing"
    return slow


@pytest.mark.rtl
@pytest.mark.parametrize("cards", [1, 2])
def test_rtl_stalled_matches_unstalled(demo, cards):
    """Random ready stalls on AR/AW/W, held-back R and B and up to 32 cycles of extra latency on
    every HBM port, and stalled links (sim.system.Stalls): the same results, later."""
    from sim.system import Stalls
    _stalled_matches_unstalled(demo, cards, 3, Stalls(seed=cards))


@pytest.mark.soak
@pytest.mark.parametrize("cards", [1, 2, 4])
def test_rtl_stalled_matches_unstalled_soak(demo, cards):
    """32 steps; light, default and heavy stalls, each with its own seed."""
    from sim.system import Stalls
    for k, st in enumerate((Stalls(ready=0.1, valid=0.1, delay=8, link=0.1, seed=10 + cards),
                            Stalls(seed=20 + cards),
                            Stalls(ready=0.7, valid=0.7, delay=200, link=0.7, seed=30 + cards))):
        _stalled_matches_unstalled(demo, cards, 32 if k == 1 else 8, st)


@pytest.mark.rtl
def test_one_parameter_area(demo):
    """Where two layer-parameter areas do not fit the VSP (GPT-2 774M and 1.5B on one card), the
    compiler uses one and loads the next layer's parameters after this layer's last use. Only
    the program's order changes: the logits are bit-identical to the two-area program's, on
    the ISS and on the RTL."""
    from sim.ref.iss import IssDevice
    from sim.system import RtlDevice
    cfg, model, tok = demo
    ids = tok.encode(PROMPT)
    runs = []
    for areas, dev in ((2, IssDevice(cfg)), (1, IssDevice(cfg)), (1, RtlDevice(cfg))):
        cm = CompiledModel(cfg, model, param_areas=areas)
        assert cm.param_areas == areas and len(set(cm.v_pars)) == len(cm.v_pars) == areas
        runs.append(generate(cfg, cm, dev, ids, 6, keep_logits=True))
    for toks, logits, _ in runs[1:]:
        assert toks == runs[0][0]
        assert np.array_equal(logits.view(np.uint32), runs[0][1].view(np.uint32))


def test_sampling_is_seeded_and_top_k():
    rng = np.random.default_rng(0)
    logits = rng.standard_normal(50)
    top = set(np.argsort(logits)[-3:].tolist())
    s = Sampling(temperature=1.0, top_k=3, seed=7)
    a = [pick(logits, s, np.random.default_rng(7)) for _ in range(20)]
    b = [pick(logits, s, np.random.default_rng(7)) for _ in range(20)]
    assert a == b and set(a) <= top
    draws = {pick(logits, s, rng) for _ in range(200)}
    assert draws == top                       # all three, and nothing else
    assert pick(logits, Sampling(), rng) == int(np.argmax(logits))


def test_a_tiny_temperature_is_greedy_not_nan():
    """logits / 1e-320 overflows: the limit of softmax(logits / T) as T -> 0, the most likely
    token, not "Probabilities contain NaN"."""
    import warnings
    logits = np.random.default_rng(1).standard_normal(50).astype(np.float32) * 10
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        for t in (1e-320, 5e-324, 1e-300, 1e-30):
            for k in (0, 3):
                s = Sampling(temperature=t, top_k=k, seed=0)
                s.check(50)
                assert pick(logits, s, np.random.default_rng(0)) == int(np.argmax(logits)), (t, k)


def _cli(*args, timeout=600):
    return subprocess.run([sys.executable, "-m", "host.cli", "run", *args], capture_output=True,
                          text=True, cwd=ROOT, timeout=timeout)


def test_cli_iss_json(tmp_path):
    logits = tmp_path / "l.npy"
    p = _cli("--backend", "iss", "--cards", "1", "--prompt", PROMPT, "--new-tokens", "4", "--json",
             "--dump-logits", str(logits))
    assert p.returncode == 0, p.stderr
    r = json.loads(p.stdout)
    assert len(r["tokens"]) == 4 and isinstance(r["text"], str)
    for key in ("prefill_cycles", "decode_cycles_per_token", "hbm_bytes_per_token", "link_bytes_per_token"):
        assert key in r
    assert r["hbm_bytes_per_token"] > 0
    lg = np.load(logits)
    assert lg.shape == (4, load_checkpoint(DEMO_MODEL).shape.vocab)
    assert [int(np.argmax(x)) for x in lg] == r["tokens"]


@pytest.mark.parametrize("args, needle", [
    (["--model", "/nonexistent"], "--model"),
    (["--prompt-ids", "1,2,99999"], "outside the vocabulary"),
    (["--prompt-ids", "1,x"], "--prompt-ids"),
    (["--new-tokens", "500"], "context"),
    (["--max-new-tokens", "0"], "--max-new-tokens"),
    (["--prompt", ""], "--prompt"),
    (["--prompt-ids", ",".join(["5"] * 200)], "context"),
    (["--temperature", "-1"], "--temperature"),
    (["--top-k", "3"], "--top-k"),
    (["--cards", "5"], "--cards"),                 # 4 heads do not go round 5 cards
    (["--config", "configs/medium.yaml", "--cards", "2", "--backend", "rtl"], "--cards"),  # no ring links
    (["--backend", "xrt"], "--xclbin"),
])
def test_cli_bad_input(args, needle):
    extra = [] if "--cards" in args else ["--cards", "1"]
    backend = [] if "--backend" in args else ["--backend", "iss"]
    p = _cli(*backend, *extra, *args)
    assert p.returncode == 2, p.stderr
    lines = p.stderr.strip().splitlines()
    assert len(lines) == 1 and needle in lines[0] and "Traceback" not in p.stderr, p.stderr


@pytest.mark.rtl
def test_device_timeout(demo):
    """A card that does not finish (its HBM starved to a trickle): a one-line CardError naming
    the position and the timeout, raised after the wall-clock timeout, not a hang."""
    import time

    from host.errors import CardError
    from sim.system import RtlDevice
    cfg, model, tok = demo
    dev = RtlDevice(cfg, bytes_per_cycle=0.01)
    t0 = time.monotonic()
    with pytest.raises(CardError, match=r"did not finish within 0.5 s"):
        generate(cfg, CompiledModel(cfg, model), dev, tok.encode(PROMPT), 2, timeout_s=0.5)
    assert time.monotonic() - t0 < 120


def test_gpt2_small_shapes_on_four_iss_cards():
    """GPT-2 small's layer shapes (d_model 768, 12 heads, vocabulary 50257), two layers of
    random weights, split over 4 cards of the ISS ring on the medium card: realistic sizes,
    placement and limits. First-token logits against float64 on the fp16 weights."""
    from host.model import Gpt2Shape, random_gpt2
    from host.runtime import make_cards
    cfg = load_config(ROOT / "configs" / "medium.yaml").replace(cards=4)
    shape = Gpt2Shape(n_layer=2, n_head=12, d_model=768, vocab=50257, n_positions=64)
    model = random_gpt2(shape, np.random.default_rng(0))
    ids = [464, 2068, 7586, 21831]
    out, logits, _ = generate(cfg, make_cards(cfg, model, "iss", 4), None, ids, 2, keep_logits=True)
    w = {k: v.astype(np.float16).astype(np.float32) for k, v in model.weights.items()}
    want = ref.forward(w, ids, 12, 2)[-1]
    assert logits.shape == (2, 50257)
    assert np.abs(logits[0] - want).max() / (want.max() - want.min()) < LOGIT_TOL
    assert out[0] == int(np.argmax(want))


def test_uneven_mlp_tail_with_large_activations():
    """5 cards share 448 MLP columns as 89/90 each, so c_fc leaves a tail of its padded stride
    that the GELU pass zero-fills through the fp16 copy. A large activation (400: its square
    is inf in fp16) must not reach that tail: LayerNorm's scratch shares the MLP buffer only
    where no card has a tail. Regression: the shared scratch turned these logits into NaN."""
    from host.model import Gpt2Shape, random_gpt2
    from host.runtime import make_cards
    cfg = load_config(CFG)
    sh = Gpt2Shape(n_layer=2, n_head=7, d_model=112, vocab=100, n_positions=32)
    model = random_gpt2(sh, np.random.default_rng(0))
    model.weights["wte.weight"][5, 93] = 400.0
    out = []
    for cards in (1, 5):
        appliance = make_cards(cfg.replace(cards=cards), model, "iss", cards)
        _, logits, _ = generate(cfg, appliance, None, [3, 5], 1, keep_logits=True)
        assert np.isfinite(logits).all(), f"{cards} cards"
        out.append(logits)
    # (the two sum in different orders: fp32 rounding relative to the largest logit)
    np.testing.assert_allclose(out[1], out[0], rtol=1e-3, atol=1e-5 * np.abs(out[0]).max())
