"""Batched decode (issue 20, item 5): several prompts decoded together, every stream
bit-identical to its prompt's own run, on the ISS and on Verilated cards; the build's limit on
streams and the command line's several prompts."""

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from gen.config import load_config
from host.compiler import CompiledModel
from host.compiler.emit import split_at
from host.errors import UserError
from host.model import load_checkpoint
from host.runtime import DEMO_MODEL, BatchGeneration, Sampling, generate, make_cards
from host.tokenizer import load_tokenizer

ROOT = Path(__file__).resolve().parent.parent
CFG = ROOT / "configs" / "tiny.yaml"
# prompts of different lengths: their streams sit at different positions in every batch
PROMPTS = ("The machine wrote", "Once upon a time there was a", "A")


@pytest.fixture(scope="module")
def demo():
    return load_config(CFG), load_checkpoint(DEMO_MODEL), load_tokenizer(DEMO_MODEL)


def _solo(cfg, model, backend, cards, ids, steps, **kw):
    return generate(cfg, make_cards(cfg, model, backend, cards), None, ids, steps, keep_logits=True, **kw)


def _batch(cfg, model, backend, cards, prompts, steps, **kw):
    g = BatchGeneration(cfg, make_cards(cfg, model, backend, cards, streams=len(prompts)), prompts,
                        steps, keep_logits=True, **kw)
    order = list(g)
    return g, order


def _check_streams(g, solos):
    for s, (tokens, logits, _) in enumerate(solos):
        assert g.tokens[s] == tokens, f"stream {s}: tokens {g.tokens[s]} alone {tokens}"
        assert g.logits[s].shape == logits.shape
        assert np.array_equal(g.logits[s].view(np.uint32), logits.view(np.uint32)), \
            f"stream {s}: logits differ from its own run"


@pytest.mark.parametrize("vsp_words", [None, 32768])
def test_batch_of_four_split_iss(demo, vsp_words):
    """Four streams on two cards: the step is cut in two interleaved halves of two streams
    (emit.split_program), each half's collectives and vector work beside the other's MATVECs;
    every stream still bit-identical to its prompt alone (whose 7-token prefill step is cut
    too). With tiny's VSP the halves share one all-gather buffer; with twice it each half has
    its own (Placement.v_gb2), its blocks placed from card 0's at the buffer's end."""
    cfg, model, tok = demo
    if vsp_words:
        cfg = cfg.replace(**{"core.vsp_words": vsp_words})
    prompts = [tok.encode(p) for p in (*PROMPTS, "It was the best of times")]
    cm = CompiledModel(cfg, model, cards=2, streams=4)
    assert (cm.plan.v_gb2 is not None) == bool(vsp_words)
    assert split_at(cm, 4) == 2 and split_at(cm, 3) is None and split_at(cm, 7) == 4
    g, order = _batch(cfg, model, "iss", 2, prompts, 4)
    _check_streams(g, [_solo(cfg, model, "iss", 2, p, 4) for p in prompts])
    assert all(c["step_tokens"] == 4 for c in g.stats.decode_steps)


@pytest.mark.parametrize("cards", [1, 2])
def test_batch_equals_solo_iss(demo, cards):
    """Three prompts decoded together on the ISS (one card; two cards, where card 0's
    projections start from each token's residual, MATVEC.btok): every stream's tokens and
    logits bit-identical to its prompt alone."""
    cfg, model, tok = demo
    prompts = [tok.encode(p) for p in PROMPTS]
    g, order = _batch(cfg, model, "iss", cards, prompts, 6)
    _check_streams(g, [_solo(cfg, model, "iss", cards, p, 6) for p in prompts])
    assert len(order) == 18 and len(g.stats.decode_steps) == 5
    assert all(c["step_tokens"] == 3 for c in g.stats.decode_steps)


def test_batch_sampled_and_early_end(demo):
    """Sampling (each stream its own generator from the seed) and a stream that ends early
    at an end-of-text id while the others go on: the batch shrinks, every stream still equal
    to its own run."""
    cfg, model, tok = demo
    prompts = [tok.encode(p) for p in PROMPTS]
    sampling = Sampling(temperature=0.9, top_k=40, seed=11)
    solos = [_solo(cfg, model, "iss", 2, p, 8, sampling=sampling) for p in prompts]
    eos = solos[1][0][2]            # stream 1's third token ends it
    solos = [_solo(cfg, model, "iss", 2, p, 8, sampling=sampling, eos=eos) for p in prompts]
    g, _ = _batch(cfg, model, "iss", 2, prompts, 8, sampling=sampling, eos=eos)
    _check_streams(g, solos)
    lens = [len(t) for t in g.tokens]
    assert lens[1] <= 3 < max(lens), lens
    assert [c["step_tokens"] for c in g.stats.decode_steps][-1] < 3


@pytest.mark.rtl
@pytest.mark.parametrize("cards", [1, 2])
def test_batch_equals_solo_rtl(demo, cards):
    """The batch on Verilated cards: bit-identical to the same batch on the ISS and to each
    prompt's own run (the solo runs on the ISS are bit-identical to the cards': test_runtime).
    The cycles are printed, not asserted: the demo model's weights are too few for a batch to
    gain on them (its steps wait on the per-token chain, not on HBM; docs/performance.md)."""
    cfg, model, tok = demo
    prompts = [tok.encode(p) for p in PROMPTS]
    g, _ = _batch(cfg, model, "rtl", cards, prompts, 4)
    iss, _ = _batch(cfg, model, "iss", cards, prompts, 4)
    assert g.tokens == iss.tokens
    for a, b in zip(g.logits, iss.logits, strict=True):
        assert np.array_equal(a.view(np.uint32), b.view(np.uint32))
    _check_streams(g, [_solo(cfg, model, "iss", cards, p, 4) for p in prompts])
    solo = _solo(cfg, model, "rtl", cards, prompts[0], 4)[2].summary(cfg)["decode_cycles_per_token"]
    fig = g.stats.summary(cfg)
    print(f"{cards} RTL card(s): a batch of 3 decodes {fig['decode_cycles_per_step']} cycles a step, "
          f"{fig['decode_cycles_per_token']} a token; one stream alone {solo} a token")
    assert fig["decode_cycles_per_step"] > 0 and fig["decode_steps"] == 3


def test_streams_limit(demo):
    """More streams than the build's core.limits.streams (tiny: 4), or than a step's tokens,
    is a one-line UserError naming the limit."""
    cfg, model, _ = demo
    with pytest.raises(UserError, match=r"core.limits.streams"):
        CompiledModel(cfg, model, streams=cfg.core.limits.streams + 1)
    with pytest.raises(UserError, match=r"at most 2 streams"):
        CompiledModel(cfg, model, streams=3, max_tokens=2)
    cm = CompiledModel(cfg, model, streams=2)
    with pytest.raises(ValueError, match="distinct"):
        cm.step_batch([(1, 3, 0), (2, 4, 0)])


def test_single_stream_build_is_unchanged(demo):
    """A model compiled for batches steps a lone stream exactly as one compiled without: the
    batch's buffers and caches come after everything else."""
    cfg, model, _ = demo
    one, four = CompiledModel(cfg, model, cards=2), CompiledModel(cfg, model, cards=2, streams=4)
    for tokens, pos in (([5, 6, 7], 0), ([9], 12)):
        assert one.step(tokens, pos) == four.step(tokens, pos)


def _cli(*args):
    return subprocess.run([sys.executable, "-m", "host.cli", "run", "--backend", "iss", *args],
                          capture_output=True, text=True, cwd=ROOT, timeout=600)


def test_cli_several_prompts(demo, tmp_path):
    """--prompt given twice and --prompt-ids with ';': one JSON object with ``streams``, each
    stream's tokens those of its prompt alone; --dump-logits [stream, position, vocabulary]."""
    cfg, model, tok = demo
    logits = tmp_path / "l.npy"
    p = _cli("--prompt", PROMPTS[0], "--prompt", PROMPTS[2], "--new-tokens", "4", "--json",
             "--dump-logits", str(logits))
    assert p.returncode == 0, p.stderr
    r = json.loads(p.stdout)
    assert [s["prompt_ids"] for s in r["streams"]] == [tok.encode(PROMPTS[0]), tok.encode(PROMPTS[2])]
    for s in r["streams"]:
        alone = json.loads(_cli("--prompt-ids", ",".join(map(str, s["prompt_ids"])), "--new-tokens", "4",
                                "--json").stdout)
        assert s["tokens"] == alone["tokens"] and s["text"] == alone["text"]
        assert alone["streams"] == [{"prompt_ids": s["prompt_ids"], "tokens": s["tokens"], "text": s["text"]}]
    lg = np.load(logits)
    assert lg.shape == (2, 4, model.shape.vocab)
    assert [[int(np.argmax(x)) for x in row] for row in lg] == [s["tokens"] for s in r["streams"]]
    ids = ";".join(",".join(map(str, s["prompt_ids"])) for s in r["streams"])
    q = json.loads(_cli("--prompt-ids", ids, "--new-tokens", "4", "--json").stdout)
    assert q["streams"] == r["streams"]


@pytest.mark.parametrize("args, needle", [
    (["--prompt", "a"] * 5, "at most 4"),                      # tiny builds 4 streams
    (["--prompt-ids", "1,2;"], "prompt 2 of 2"),
    (["--prompt-ids", "1,2;3,x"], "prompt 2 of 2"),
    (["--prompt-ids", "1;2", "--new-tokens", "200"], "--new-tokens"),
])
def test_cli_several_prompts_bad_input(args, needle):
    p = _cli(*args)
    assert p.returncode == 2, p.stderr
    lines = p.stderr.strip().splitlines()
    assert len(lines) == 1 and needle in lines[0] and "Traceback" not in p.stderr, p.stderr


def test_perf_batch():
    """gptfpga perf --batch B: the decode figures per step of B streams, decode_tokens_per_s of
    all of them (B tokens a step); a batch step models more cycles than a lone stream's and
    fewer than B of them (the weights stream once); more streams than the build's limit is a
    one-line error."""
    from host.api import perf
    one = perf(CFG, DEMO_MODEL, cards=2, prompt_tokens=8, new_tokens=4, batch=1)
    four = perf(CFG, DEMO_MODEL, cards=2, prompt_tokens=8, new_tokens=4, batch=4)
    assert one["batch"] == 1 and four["batch"] == 4
    assert four["decode_tokens_per_s"] == pytest.approx(
        4 * 1000 * four["clock_mhz"] * 1e3 / four["decode_cycles_per_token"], rel=1e-3)
    c1, c4 = one["decode_cycles_per_token"], four["decode_cycles_per_token"]
    assert c1 < c4 < 4 * c1
    gain = four["decode_tokens_per_s"] / one["decode_tokens_per_s"]
    print(f"tiny, the demo model, 2 cards: batch 4 decodes {four['decode_tokens_per_s']} tokens/s, "
          f"batch 1 {one['decode_tokens_per_s']} ({gain:.2f}x)")
    with pytest.raises(UserError, match=r"--batch: got 5; allowed: 1..4"):
        perf(CFG, "gpt2", batch=5)


@pytest.mark.parametrize("cards", [1, 2])
def test_gelu_regions_compute_what_token_by_token_does(demo, cards, monkeypatch):
    """Prefill steps and a batch (ISS) give bit for bit the logits of token-by-token GELUs
    (emit.GELU_REGIONS off): the regions change where the values lie, not the values."""
    import host.compiler.emit as emit
    cfg, model, _ = demo

    def run():
        _, logits, _ = _solo(cfg, model, "iss", cards, [5, 17, 99, 250, 3, 7, 11, 300, 42], 3)
        g, _ = _batch(cfg, model, "iss", cards, [[5, 17, 99], [250, 3], [7]], 3)
        return [np.asarray(x).view(np.uint32) for x in (logits, *g.logits)]

    regions = run()
    monkeypatch.setattr(emit, "GELU_REGIONS", False)
    alone = run()
    assert all(np.array_equal(a, b) for a, b in zip(regions, alone, strict=True))


def test_allreduce_x16_computes_what_a_cvt16_pass_does(demo, monkeypatch):
    """Prefill steps on 2 cards (ISS) give bit for bit the logits of an all-reduce followed by
    a CVT16 pass (emit.ALLREDUCE_X16 off): COLL.x16's fp16 copy rounds as CVT16 rounds. The
    programs do differ: the all-reduces carry x16 and the CVT16s after them are gone."""
    import host.compiler.emit as emit
    from hw.isa import decode
    cfg, model, _ = demo
    tokens = [5, 17, 99, 250, 3, 7, 11, 300, 42]

    def run():
        _, logits, _ = _solo(cfg, model, "iss", 2, tokens, 3)
        return np.asarray(logits).view(np.uint32)

    def colls():
        from host.compiler import CompiledModel
        cm = CompiledModel(cfg, model, card=0, cards=2)
        prog = cm.step(tokens[:cm.T], 0)
        return [decode(w) for w in prog if decode(w).op in ("COLL", "VEC")]

    with_x16 = run()
    ins = colls()
    assert any(i.op == "COLL" and i.cop == 2 and i.x16 for i in ins)
    monkeypatch.setattr(emit, "ALLREDUCE_X16", False)
    assert not any(i.op == "COLL" and i.x16 for i in colls())
    assert np.array_equal(with_x16, run())


def test_every_merge_gives_the_same_logits_iss(demo, monkeypatch):
    """A prefill step on 2 cards (ISS) merged with each lead of host.compiler.tune.LEADS and
    each lag of its LAGS: the orders differ, the logits are bit for bit the same (the tuner
    chooses among them for time only)."""
    import host.compiler.tune as tune
    cfg, model, _ = demo
    tokens = [5, 17, 99, 250, 3, 7, 11, 300, 42]
    got, orders = [], set()
    for lag in tune.LAGS:
        for lead in tune.LEADS:
            monkeypatch.setattr(tune, "LEADS", (lead,))
            monkeypatch.setattr(tune, "LAGS", (lag,))
            cards = make_cards(cfg, model, "iss", 2)
            _, logits, _ = generate(cfg, cards, None, tokens, 2, keep_logits=True)
            assert set(cards.cms[0].merges.values()) == {(lead, lag)}
            orders.add(tuple(cards.cms[0].step(tokens[:cards.T], 0, lead=lead, lag=lag)))
            got.append(np.asarray(logits).view(np.uint32))
            monkeypatch.undo()
    assert len(orders) > 4
    assert all(np.array_equal(g, got[0]) for g in got[1:])


@pytest.mark.parametrize("lag", [3, 4])
def test_three_parameter_areas_and_a_later_second_half_give_the_same_logits_iss(demo, monkeypatch, lag):
    """The what-if of tools/step_whatifs.py: three layer-parameter areas, a split prefill
    step's second half ``lag`` parts behind the first (with two areas it may not be): the
    order differs, the logits on 2 cards (ISS) are bit for bit those of the build's split."""
    import host.compiler.placement as placement
    import host.compiler.tune as tune
    cfg, model, _ = demo
    tokens = [5, 17, 99, 250, 3, 7, 11, 300, 42]

    def run():
        cards = make_cards(cfg, model, "iss", 2)
        _, logits, _ = generate(cfg, cards, None, tokens, 2, keep_logits=True)
        return cards.cms[0], np.asarray(logits).view(np.uint32)

    cm, want = run()
    assert split_at(cm, cm.T) and cm.param_areas == 2
    candidates = placement.candidates
    monkeypatch.setattr(placement, "candidates", lambda **kw: candidates(**{**kw, "param_areas": 3}))
    cm3, got = run()              # (three areas: fewer tokens a step on tiny)
    assert cm3.param_areas == 3 and len(set(cm3.plan.v_pars)) == 3 and split_at(cm3, cm3.T)
    assert np.array_equal(got, want)
    merge = cm3.merges[cm3.T]
    monkeypatch.setattr(tune, "LAGS", (lag,))
    cm3, got = run()
    assert cm3.merges[cm3.T][1] == lag
    assert cm3.step(tokens[:cm3.T], 0, lag=lag) != cm3.step(tokens[:cm3.T], 0, lag=merge[1])
    assert np.array_equal(got, want)
    with pytest.raises(ValueError, match="lag 7"):
        cm3.step(tokens[:cm3.T], 0, lag=7)
