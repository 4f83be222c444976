"""The performance model (host/perf.py) and `gptfpga perf`.

- the model's structural constants are the RTL's (pipeline latencies, scoreboard, fetch);
- it predicts the Verilated card's cycles within 10% on whole decode and prefill steps of the
  demo model on tiny, one card and appliances of 2 and 4 (medium and 300 MHz are in `gptfpga
  bench calibrate`, whose figures docs/perf-calibration.json records and this file checks);
- its collective cost is within 10% of the collective engine's RTL on decode-sized
  all-reduces, and of COLLs through the card's collective unit (the recorded calibration,
  up to a prefill step's all-reduce on u280x4's ring);
- on several cards the slowest card sets the pace; the model never beats the HBM roofline;
- `gptfpga perf --json` prints the fields the issue names; bad input gives one line, exit 2.
"""

import json
import subprocess
import sys
from pathlib import Path

import pytest

from gen.config import load_config
from host import perf
from host.model import SHAPES

ROOT = Path(__file__).resolve().parent.parent
TOL = 0.10


def test_constants_are_the_rtls():
    from hw.arith.dot import DotArray
    from hw.arith.special import Exp, Gelu, Recip, Rsqrt
    from hw.arith.units import Fp32Add, Fp32Max, Fp32Mul, Fp32ToFp16
    from hw.core import dma, fetch, issue, vpu_lanes, wfifo
    assert (perf.ADD_LAT, perf.MUL_LAT, perf.MAX_LAT, perf.CVT_LAT) == (
        Fp32Add.LATENCY, Fp32Mul.LATENCY, Fp32Max.LATENCY, Fp32ToFp16.LATENCY)
    assert (perf.EXP_LAT, perf.RECIP_LAT, perf.RSQRT_LAT, perf.GELU_LAT) == (
        Exp.LATENCY, Recip.LATENCY, Rsqrt.LATENCY, Gelu.LATENCY)
    assert set(perf.SPECIAL_VOPS) == set(vpu_lanes.SPECIAL_VOPS)
    for w in (2, 4, 16, 32, 64, 256):
        assert perf.dot_latency(w) == DotArray.latency(w), w
    assert perf.SCOREBOARD == issue.ENTRIES
    assert (perf.FETCH_CHUNK, perf.FETCH_DEPTH) == (fetch.CHUNK, fetch.DEPTH)
    assert (perf.DMA_RD_QUEUE, perf.STORE_QUEUE) == (dma.READ_QUEUE, dma.STORE_QUEUE)
    assert (perf.WFIFO_QUEUE, perf.WFIFO_POP_TO_TILE) == (wfifo.QUEUE, wfifo.POP_TO_TILE)


def test_model_matches_rtl_on_tiny():
    """Whole prefill, decode and batched decode steps of the demo model on the Verilated tiny
    card alone and on appliances of 2 and 4 tiny cards (their collective units, the link
    models: every card's program of the step, the split ones merged as the runtime merges
    them)."""
    from sim.bench import _calibration_cases, calibrate_perf
    cases = [c for c in _calibration_cases() if c[1].name == "tiny"]
    result = calibrate_perf(cases=cases, collectives=False, log=print)
    for r in result["steps"]:
        assert abs(r["error"]) <= TOL, r
    assert {(r["step"], r["cards"]) for r in result["steps"]} == {
        (step, cards) for step in ("prefill", "decode", "batch") for cards in (1, 2, 4)}


def test_recorded_calibration():
    """docs/perf-calibration.json (gptfpga bench calibrate) covers decode and prefill on tiny
    and medium and on appliances of 2 and 4 tiny cards, and COLLs through the card's
    collective unit; every step and COLL is within 10% of the RTL, and today's model still
    gives the recorded model cycles (change the model, re-run the calibration)."""
    from host.compiler import CompiledModel
    from host.model import Gpt2
    from sim.bench import _calibration_cases, calibration_programs
    cal = json.loads((ROOT / "docs" / "perf-calibration.json").read_text())
    seen = {(r["config"], r["step"], r["cards"]) for r in cal["steps"]}
    assert seen >= {("tiny", "prefill", 1), ("tiny", "decode", 1), ("tiny", "batch", 1),
                    ("medium", "prefill", 1), ("medium", "decode", 1)}
    assert seen >= {("tiny", step, cards) for step in ("prefill", "decode", "batch") for cards in (2, 4)}
    assert cal["calibration_error"] == max(abs(r["error"]) for r in cal["steps"]) <= TOL
    cases = {name: (cfg, make, steps, cards) for name, cfg, make, steps, cards in _calibration_cases()}
    built = {}
    for r in cal["steps"]:
        assert r["error"] == round((r["model_cycles"] - r["rtl_cycles"]) / r["rtl_cycles"], 4)
        cfg, make, steps, cards = cases[r["case"]]
        assert r["cards"] == cards
        if r["case"] not in built:
            streams = max([t for k, t, _ in steps if k == "batch"], default=1)
            model = Gpt2(make().shape, None)
            built[r["case"]] = [CompiledModel(cfg, model, card=i, cards=cards, streams=streams)
                                for i in range(cards)]
        progs = calibration_programs(built[r["case"]], r["step"], r["tokens"], r["position"])
        assert perf.simulate(cfg, progs)["cycles"] == r["model_cycles"], r
    # COLLs through the card's collective unit, at the sizes of GPT-2 1.5B on u280x4's ring
    from sim.bench import CARD_COLL_CASES, card_coll_configs
    cfgs = card_coll_configs()
    rows = cal["card_collectives"]
    assert [(r["config"], r["op"], r["cards"], r["words"]) for r in rows] == CARD_COLL_CASES
    assert cal["card_collective_error"] == max(abs(r["error"]) for r in rows) <= TOL
    for r in rows:
        assert r["error"] == round((r["model_cycles"] - r["rtl_cycles"]) / r["rtl_cycles"], 4)
        model = perf.coll_cycles(cfgs[r["config"]], r["cards"], r["words"], op=r["op"])
        assert model == r["model_cycles"], r


@pytest.mark.parametrize("op, cards, words", [("allreduce", 2, 128), ("allreduce", 4, 768),
                                               ("allgather", 2, 128), ("allgather", 4, 768)])
def test_collective_model_matches_engine(op, cards, words):
    from sim.fabric import run_collective
    cfg = load_config(ROOT / "configs" / "tiny.yaml")
    fig, *_ = run_collective(cfg, op, words, cards=cards)
    model = perf.coll_cycles(cfg, cards, words, card=False, op=op)
    err = (model - fig["cycles"]) / fig["cycles"]
    print(f"{op} of {words} words on {cards} cards: engine {fig['cycles']}, model {model} ({err:+.1%})")
    assert abs(err) <= TOL


@pytest.mark.rtl
def test_model_matches_the_rtl_ring():
    """A prefill and a decode step of the demo model split over 2 Verilated tiny cards (the
    all-reduces through the cards' collective units and the link models) against the model's
    replay of the same two programs, within TOL."""
    from host.model import load_checkpoint
    from host.runtime import DEMO_MODEL, make_cards
    cfg = load_config(ROOT / "configs" / "tiny.yaml")
    cards = make_cards(cfg, load_checkpoint(DEMO_MODEL), "rtl", 2)
    cards.load()
    for tokens, pos in (([5, 6, 7, 8], 0), ([9], 4)):
        rtl = cards.step(tokens, pos, 600)["cycles"]
        # the programs the cards ran: a split step merged as the runtime chose
        lead, lag = cards.cms[0].merges.get(len(tokens), (0, None))
        model = perf.simulate(cfg, [cm.step(tokens, pos, lead=lead, lag=lag) for cm in cards.cms])["cycles"]
        err = (model - rtl) / rtl
        print(f"2 cards, {len(tokens)} token(s) at {pos}: RTL {rtl}, model {model} ({err:+.1%})")
        assert abs(err) <= TOL


@pytest.mark.rtl
@pytest.mark.parametrize("op, cards, words", [("allgather", 2, 512), ("allgather", 4, 2048),
                                               ("allreduce", 2, 16), ("allreduce", 4, 2048)])
def test_card_collective_model_matches_rtl(op, cards, words):
    """One COLL through the collective unit of Verilated tiny cards (its VSP ports, the own
    block's copy, the ring's schedule) against ``coll_cycles``; the u280x4 ring's are in
    tests/test_ring_u280x4_rtl.py (make soak: a Verilator build of their own) and the recorded
    calibration."""
    from sim.bench import calibrate_card_collectives
    [r] = calibrate_card_collectives(cases=[("tiny", op, cards, words)], log=print)
    assert abs(r["error"]) <= TOL, r


def test_allreduce_what_if():
    """The exchange all-reduce and all-gather (what-ifs, not built) beat the ring's on
    decode-sized messages of the bidirectional u280x4 ring, the ring's all-gather beats its
    all-reduce (half the steps), and an unknown algorithm or collective is refused."""
    cfg = load_config(ROOT / "configs" / "u280x4.yaml")
    assert perf.coll_cycles(cfg, 4, 1600, algorithm="exchange") < perf.coll_cycles(cfg, 4, 1600)
    ag = [perf.coll_cycles(cfg, 4, 1600, algorithm=a, op="allgather") for a in ("exchange", "ring")]
    assert ag[0] < ag[1] < perf.coll_cycles(cfg, 4, 1600)
    assert perf.coll_cycles(cfg, 1, 1600, algorithm="exchange") == 0
    with pytest.raises(ValueError):
        perf.coll_cycles(cfg, 4, 1600, algorithm="tree")
    with pytest.raises(ValueError):
        perf.coll_cycles(cfg, 4, 1600, op="broadcast")


def test_cards_wait_for_each_other_at_every_coll():
    """GPT-2 1.5B on 4 cards: 25 heads as 6, 6, 6, 7. Every COLL ends when the last card
    reaches it plus the all-reduce's cost, so the step takes the slowest card's time alone
    plus most of 96 all-reduces (two per layer, all-gathers in decode: each depends on the one
    before through the layer's chain; what overlaps them is the tail work the chain does not
    wait for, such as a STORE's write responses or a parameter LOAD), and every card ends at
    the same COLL-paced time give or take its own tail. No card beats the HBM's time for its weights."""
    cfg = load_config(ROOT / "configs" / "u280x4.yaml")
    costs = perf.StepCosts(cfg, SHAPES["gpt2-xl"], 4)
    assert [cm.H for cm in costs.cms] == [6, 6, 6, 7]
    progs = [cm.step([0], 100) for cm in costs.cms]
    joint = perf.simulate(cfg, progs)
    alone = []
    for prog in progs:
        g = perf.CardModel(cfg).run(prog)
        try:
            t = next(g)[0]
            while True:
                t = g.send(t + 1)[0]        # every COLL done at once, alone
        except StopIteration as stop:
            alone.append(stop.value["cycles"])
    # one token: d_model words, all-gathered (and summed on every card)
    assert all(cm.v_g is not None for cm in costs.cms)
    coll = perf.coll_cycles(cfg, 4, costs.cms[0].dS, op="allgather")
    assert coll > 0
    assert joint["cycles"] >= 96 * coll
    assert joint["cycles"] - max(alone) >= 0.85 * 96 * coll
    assert joint["cycles"] == max(c["cycles"] for c in joint["cards"])
    assert joint["cards"][3]["vpu_busy"] > joint["cards"][0]["vpu_busy"]      # 7 heads vs 6
    for c in joint["cards"]:
        assert c["cycles"] >= c["hbm_rd_bytes"] / cfg.hbm_bytes_per_cycle


def test_model_waits_for_write_after_read():
    """A LOAD into words a long GELU still reads waits for the GELU (the RTL scoreboard's
    write-after-read rule); a LOAD elsewhere does not."""
    from hw.isa import encode
    cfg = load_config(ROOT / "configs" / "tiny.yaml")
    gelu = encode("VEC", vop="GELU", dst=4096, src1=0, n=4096)
    times = []
    for vsp in (0, 8192):
        prog = [gelu, encode("LOAD", vsp=vsp, n=8, row=0), encode("HALT")]
        m = perf.CardModel(cfg, trace=True)
        g = m.run(prog)
        with pytest.raises(StopIteration):
            next(g)
        times.append(m.trace)
    (_, _, _, gelu_done), (_, _, load_at, _) = times[0][0], times[0][1]
    assert load_at > gelu_done
    assert times[1][1][2] < times[1][0][3]


def test_collective_unit_takes_one_coll_at_a_time_and_trace_says_what_held_issue():
    """Two COLLs that share no words: the second issues only once the first is done (the
    collective unit takes one at a time); a VEC reading the last one's result is held by a
    hazard on it, which the trace table names."""
    from hw.isa import encode
    cfg = load_config(ROOT / "configs" / "tiny.yaml")
    prog = [encode("COLL", cop=0, src=0, dst=1024, n=64), encode("COLL", cop=0, src=2048, dst=4096, n=64),
            encode("VEC", vop="EXP", dst=8192, src1=8192, n=64),
            encode("VEC", vop="EXP", dst=8192, src1=8192, n=64), encode("HALT")]
    r = perf.simulate(cfg, [prog, prog], trace=True)
    (_, _, _, first_done), (_, _, second_at, _) = r["cards"][0]["trace"][:2]
    assert second_at > first_done
    rows = perf.trace_table([prog, prog], r)
    assert rows[1]["held"] == "unit" and rows[1]["held_by"] == 0
    assert rows[3]["held"] in ("hazard", "unit") and rows[3]["held_by"] == 2


def test_vec_pipelined_what_if_overlaps_independent_passes_only():
    """CardModel(vec_pipelined=True): the next VEC starts while the last one's pipeline
    drains, its results written after the last one's (one write port); one that reads the
    last one's result, a reduction, and GELU after EXP wait for the last one's end."""
    from hw.isa import decode, encode
    cfg = load_config(ROOT / "configs" / "tiny.yaml")

    def cycles(prog, **kw):
        return perf.simulate(cfg, [prog], **kw)["cycles"]

    apart = [encode("VEC", vop="EXP", dst=4096 * k, src1=4096 * k + 1024, n=64) for k in range(4)]
    chain = [encode("VEC", vop="EXP", dst=0, src1=0, n=64) for _ in range(4)]
    halt = [encode("HALT")]
    assert cycles(apart + halt, vec_pipelined=True) <= cycles(apart + halt) - 3 * perf.EXP_LAT
    assert cycles(chain + halt, vec_pipelined=True) == cycles(chain + halt)

    def dones(prog):
        r = perf.simulate(cfg, [prog + halt], vec_pipelined=True, trace=True)["cards"][0]
        return [done for _pc, _op, _issue, done in r["trace"][:len(prog)]]

    exp = encode("VEC", vop="EXP", dst=0, src1=1024, n=64)
    for op, kw in (("MUL", dict(src2=8192)), ("REDSUM", {}), ("GELU", {})):
        after = encode("VEC", vop=op, dst=4096, src1=5120, n=64, **kw)
        first, second = dones([exp, after])
        rows = -(-64 // cfg.core.vector_lanes)
        if op == "MUL":          # in order: its rows written after the EXP's last
            assert second >= first + rows
        else:                    # the EXP's pipeline drained first: the whole pass after it
            assert second >= first + perf.CardModel(cfg).vec_cycles(decode(after).fields)


def test_decoupled_what_if_lets_independent_units_pass_a_held_instruction():
    """CardModel(decoupled=(queue, entries)): issue does not wait for an instruction's
    hazards; a STORE behind a VEC that waits for an EXP starts at once (in order it waits
    with the VEC), while a chain of dependent passes takes as long as in order."""
    from hw.isa import encode
    cfg = load_config(ROOT / "configs" / "tiny.yaml")

    def run(prog, **kw):
        r = perf.simulate(cfg, [prog + [encode("HALT")]], trace=True, **kw)["cards"][0]
        return r["cycles"], [issue for _pc, _op, issue, _done in r["trace"]]

    exp = encode("VEC", vop="EXP", dst=0, src1=1024, n=256)
    mul = encode("VEC", vop="MUL", dst=2048, src1=0, src2=4096, n=256)     # reads the EXP's
    store = encode("STORE", vsp=8192, n=64, row=512, lepg=6)
    _, in_order = run([exp, mul, store])
    _, dec = run([exp, mul, store], decoupled=(4, 16))
    assert dec[1] == in_order[1], "the MUL still waits for the EXP"
    assert dec[2] < in_order[1] <= in_order[2], "the STORE does not wait behind the MUL"
    chain = [encode("VEC", vop="EXP", dst=0, src1=0, n=64) for _ in range(4)]
    assert run(chain, decoupled=(4, 16))[0] == run(chain)[0]


def test_coll_pipelined_what_if_frees_the_unit_before_the_frames_arrive():
    """CardModel(coll_pipelined=True) on two cards: a second, independent COLL starts once
    the first one's data have moved, not a whole ring latency later."""
    from hw.isa import encode
    cfg = load_config(ROOT / "configs" / "tiny.yaml").replace(cards=2)
    prog = [encode("COLL", cop=0, src=0, dst=1024, n=16),
            encode("COLL", cop=0, src=4096, dst=5120, n=16), encode("HALT")]

    def starts(**kw):
        r = perf.simulate(cfg, [prog, prog], trace=True, **kw)["cards"][0]
        return [issue for _pc, _op, issue, _done in r["trace"]]

    serial, piped = starts(), starts(coll_pipelined=True)
    assert serial[1] - piped[1] >= cfg.link.latency_cycles


def test_reuse_what_if_holds_a_tile_ceil_t_over_r_cycles():
    """The weight-reuse what-if (CardModel's ``reuse``): a MATVEC of 8 tokens over 64 tiles
    whose tiles are all in the FIFO holds each tile ceil(8 / R) cycles, so the matrix unit's
    busy time falls by the tile count times the cycles saved; R = 1 is the card as built."""
    from hw.isa import encode
    cfg = load_config(ROOT / "configs" / "tiny.yaml")
    prog = [encode("WLOAD", row=0, tiles=64), encode("FENCE"),
            encode("MATVEC", xb=0, dst=0, rb=8, cb=8, group=8, tokens=8, xstride=128 // cfg.core.width,
                   dstride=32 // cfg.core.vector_lanes), encode("HALT")]

    def busy(reuse):
        g = perf.CardModel(cfg, reuse=reuse).run(prog)
        with pytest.raises(StopIteration) as stop:
            next(g)
        return stop.value.value["mpu_busy"]

    b = {r: busy(r) for r in (1, 2, 3, 8)}
    for r in (2, 3, 8):
        assert b[1] - b[r] == 64 * (8 - -(-8 // r)), b


def test_runahead_what_if_takes_two_tiles_a_cycle_from_a_backlog():
    """The one-token run-ahead what-if (CardModel's ``runahead``): with every tile of a
    one-token MATVEC already in the FIFO, pairs of tiles share a cycle where the accumulators'
    reuse distance allows: groups of 16 row blocks (8 cycles a column block) run at two tiles a
    cycle, groups of 8 at one after their first column block (the slot's next update waits);
    off, one a cycle."""
    from hw.isa import encode
    cfg = load_config(ROOT / "configs" / "tiny.yaml")

    def busy(group, runahead):
        prog = [encode("WLOAD", row=0, tiles=128), encode("FENCE"),
                encode("MATVEC", xb=0, dst=0, rb=16, cb=8, group=group, tokens=1), encode("HALT")]
        g = perf.CardModel(cfg, runahead=runahead).run(prog)
        with pytest.raises(StopIteration) as stop:
            next(g)
        return stop.value.value["mpu_busy"]

    assert busy(16, False) - busy(16, True) == 64           # 128 tiles in 64 cycles, not 128
    assert 0 < busy(8, False) - busy(8, True) <= 8


def test_prediction_never_beats_the_roofline():
    cfg = load_config(ROOT / "configs" / "u280x4.yaml")
    for cards in (2, 4):
        r = perf.predict(cfg.replace(cards=cards), SHAPES["gpt2-medium"], cards=cards, prompt=8,
                         new_tokens=8)
        assert 0 < r["hbm_roofline_fraction"] <= 1
        assert r["decode_ms_per_token"] >= r["hbm_roofline_decode_ms_per_token"]
        # prefill of 8 tokens and 7 decode steps (the first new token comes from the prefill)
        want = (8 * r["prefill_cycles_per_token"] + 7 * r["decode_cycles_per_token"]) / 200e3
        assert r["total_ms"] == pytest.approx(want, rel=1e-3)


def _cli(*args):
    return subprocess.run([sys.executable, "-m", "host.cli", "perf", *args], capture_output=True,
                          text=True, cwd=ROOT, timeout=600)


def test_cli_perf_json():
    p = _cli("--config", "configs/u280x4.yaml", "--model-shape", "gpt2-medium", "--cards", "4",
             "--prompt-tokens", "8", "--new-tokens", "8", "--json")
    assert p.returncode == 0, p.stderr
    r = json.loads(p.stdout)
    for key in ("decode_ms_per_token", "prefill_ms_per_token", "hbm_roofline_fraction",
                "calibration_error", "card_collective_model_error"):
        assert key in r, key
    cal = json.loads((ROOT / "docs" / "perf-calibration.json").read_text())
    assert r["calibration_error"] == cal["calibration_error"]
    assert r["card_collective_model_error"] == cal["card_collective_error"]
    assert r["cards"] == 4 and r["decode_ms_per_token"] > 0 and 0 < r["hbm_roofline_fraction"] <= 1
    assert r["decode_ms_per_token"] == pytest.approx(r["decode_cycles_per_token"] / 200e3, abs=1e-4)
    # one stream: tokens per second is the inverse of the decode time
    assert r["decode_tokens_per_s"] == pytest.approx(200e6 / r["decode_cycles_per_token"], abs=0.01)


def test_cli_perf_model_directory():
    """A Hugging Face directory's config.json gives the shape: the demo model on 2 tiny cards."""
    p = _cli("--config", "configs/tiny.yaml", "--model-shape", "host/demo", "--cards", "2",
             "--prompt-tokens", "8", "--new-tokens", "8", "--json")
    assert p.returncode == 0, p.stderr
    r = json.loads(p.stdout)
    assert r["cards"] == 2 and r["tokens_per_step"] == 8 and r["decode_steps"] == 7
    assert r["weight_bytes"] == 2 * (4 * 12 * 128 * 128 + 512 * 128)   # 4 layers of 12 d^2, the head


def test_cli_perf_trace(tmp_path):
    """--trace: the first decode step's timeline on every card, as the model ran it: in-order
    issue, each instruction done after it issued, the same COLLs (all-gathers in decode) on
    every card, the cards' last instructions ending by the step's cycles, and the matrix
    unit's idle time before the MATVECs covering at least the all-gathers."""
    out = tmp_path / "trace.json"
    p = _cli("--config", "configs/tiny.yaml", "--model-shape", "host/demo", "--cards", "2",
             "--prompt-tokens", "8", "--new-tokens", "8", "--json", "--trace", str(out))
    assert p.returncode == 0, p.stderr
    assert json.loads(p.stdout)["cards"] == 2
    t = json.loads(out.read_text())
    assert t["step"] == "decode" and t["position"] == 8 and t["cards"] == 2
    colls = []
    for card in range(2):
        rows = [r for r in t["rows"] if r["card"] == card]
        assert [r["pc"] for r in rows] == list(range(len(rows)))
        assert all(b["issue"] >= a["issue"] for a, b in zip(rows, rows[1:], strict=False))
        assert all(r["done"] > r["issue"] for r in rows)
        assert max(r["done"] for r in rows) <= t["cycles"]
        colls.append([(r["cop"], r["n"], r["done"]) for r in rows if r["op"] == "COLL"])
        # the matrix unit idles at least through every all-gather (nothing to multiply
        # before the residual stream is whole again)
        mv = [r for r in rows if r["op"] == "MATVEC"]
        gathers = sum(r["done"] - r["issue"] for r in rows if r["op"] == "COLL")
        assert gathers < sum(r["mpu_idle_before"] for r in mv) < t["cycles"]
    assert colls[0] == colls[1] and [c[0] for c in colls[0]] == [0] * 8    # 2 per layer


@pytest.mark.parametrize("args, needle", [
    (["--model-shape", "gpt3"], "--model-shape"),
    (["--model-shape", "gpt2-xl", "--config", "configs/tiny.yaml"], "d_model"),
    (["--model-shape", "gpt2", "--cards", "0"], "--cards"),
    (["--model-shape", "gpt2", "--prompt-tokens", "1000", "--new-tokens", "26"], "context"),
    (["--model-shape", "gpt2", "--new-tokens", "0"], "--new-tokens"),
    (["--model-shape", "/nonexistent/config.json"], "--model-shape"),
    (["--model-shape", "host/demo", "--config", "configs/tiny.yaml", "--trace",
      "/nonexistent/trace.json"], "--trace"),
])
def test_cli_perf_bad_input(args, needle):
    if "--config" not in args:
        args = ["--config", "configs/u280x4.yaml", *args]
    p = _cli(*args)
    assert p.returncode == 2, p.stderr
    lines = p.stderr.strip().splitlines()
    assert len(lines) == 1 and needle in lines[0] and "Traceback" not in p.stderr, p.stderr


def test_critical_chain_follows_what_held_issue_and_adds_up():
    """perf.critical_chain walks back from the instruction that ends last: two COLLs (the
    second held by the collective unit) end after two EXPs that wait on each other, so the
    chain is the two COLLs and its charges add up to the first issue to the last end."""
    from hw.isa import encode
    cfg = load_config(ROOT / "configs" / "tiny.yaml")
    prog = [encode("COLL", cop=0, src=0, dst=1024, n=64), encode("COLL", cop=0, src=2048, dst=4096, n=64),
            encode("VEC", vop="EXP", dst=8192, src1=8192, n=64),
            encode("VEC", vop="EXP", dst=8192, src1=8192, n=64), encode("HALT")]
    r = perf.simulate(cfg, [prog, prog], trace=True)
    trace = r["cards"][0]["trace"]
    chain = perf.critical_chain([prog, prog], r)
    assert [(what, n) for what, _, n in chain] == [("COLL all-gather of 64 words", 2)]
    assert chain[0][1] == max(done for *_, done in trace) - trace[0][2]
    # a chain of EXPs on one card: every one on it, charged its own time
    exps = [encode("VEC", vop="EXP", dst=0, src1=0, n=64) for _ in range(3)] + [encode("HALT")]
    r = perf.simulate(cfg, [exps], trace=True)
    trace = r["cards"][0]["trace"]
    (what, cycles, n), = perf.critical_chain([exps], r)
    assert (what, n) == ("VEC EXP", 3) and cycles == trace[-1][3] - trace[0][2]
