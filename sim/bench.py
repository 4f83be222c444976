"""Performance figures: ``gptfpga bench core|collective|run|calibrate|perf``.

Figures are cycles from the card's own counters; HBM utilization is weight bytes read over
(cycles x the config's peak HBM bytes per cycle). Wall-clock figures (simulation speed, build
time) describe this machine, not the design.
"""

import json
import time
from pathlib import Path

import numpy as np

from host.perf import recorded_calibration
from host.progress import quiet
from hw.isa import encode

ROOT = Path(__file__).resolve().parent.parent

__all__ = ["bench_core", "bench_collective", "plot_collective", "collective_table", "bench_run",
           "run_table", "calibrate_perf", "recorded_calibration", "bench_perf", "perf_table",
           "plot_roofline"]

# GPT-2 small's matrices (out x in): c_attn, attn.c_proj, mlp.c_fc, mlp.c_proj.
GPT2_SMALL_MATVECS = [(2304, 768), (768, 768), (3072, 768), (768, 3072)]


def _matvec_program(cfg, shapes):
    """The matrices as MATVECs of at most half the weight FIFO each: whole groups of 8 row
    blocks, and where one group of a wide matrix is too many tiles, column slices accumulated
    in place (bias = dst). Each WLOAD goes as far ahead as the FIFO allows."""
    L, W = cfg.core.lanes, cfg.core.width
    depth = cfg.core.weight_fifo_tiles
    jobs, row, tiles = [], 0, 0
    for rows, cols in shapes:
        rb, cb = -(-rows // L), -(-cols // W)
        slices = -(-8 * cb // depth)                      # column slices (one group fits)
        cs = -(-cb // slices)
        per = max(1, (depth // 2) // (8 * cs)) * 8
        # Slice by slice, so that the MATVECs accumulating into a row block are far apart.
        for c0 in range(0, cb, cs):
            for r0 in range(0, rb, per):
                n = min(per, rb - r0)
                jobs.append((row, n, min(cs, cb - c0), r0 * L, c0 > 0))
                row += n * min(cs, cb - c0)
        tiles += rb * cb
    prog, avail, k = [], 0, 0
    for j, (_r, n, cb, dst, acc) in enumerate(jobs):
        while k < len(jobs) and (k == j or avail + jobs[k][1] * jobs[k][2] <= depth):
            prog.append(encode("WLOAD", row=jobs[k][0], tiles=jobs[k][1] * jobs[k][2]))
            avail += jobs[k][1] * jobs[k][2]
            k += 1
        P = cfg.core.vector_lanes              # (MATVEC's VSP addresses are rows)
        prog.append(encode("MATVEC", xb=0, dst=dst // P, rb=n, cb=cb, group=8, tokens=1,
                           bias=dst // P, bias_en=int(acc)))
        avail -= n * cb
    prog.append(encode("HALT"))
    return prog, tiles


def _layer_runs(cfg, dev_factory, positions, log, progress=None):
    """Decode-step counters for models of 1 and 2 layers at the config's largest width."""
    from host.compiler import CompiledModel
    from host.model import Gpt2Shape, random_gpt2
    lim = cfg.core.limits
    out = {}
    progress = progress or quiet()
    for n_layer in (1, 2):
        progress.step(f"decode step, {n_layer} layer(s)", f"prefill of {positions} positions")
        shape = Gpt2Shape(n_layer=n_layer, n_head=lim.heads, d_model=lim.d_model,
                          vocab=min(lim.vocab, 1024), n_positions=min(lim.seq_len, max(positions + 1, 64)))
        cm = CompiledModel(cfg, random_gpt2(shape, np.random.default_rng(0)))
        dev = dev_factory()
        cm.load(dev)
        toks = list(np.random.default_rng(1).integers(0, shape.vocab, positions + 1))
        for p in range(0, positions, cm.T):
            c = dev.run(cm.step(toks[p:min(p + cm.T, positions)], p), cm.prog_addr, timeout_s=3600)
            assert c["status"] & 0xFF == 0, f"prefill failed: {c['status']:#x}"
        t0 = time.monotonic()
        c = dev.run(cm.step(toks[positions:positions + 1], positions), cm.prog_addr, timeout_s=3600)
        assert c["status"] & 0xFF == 0, f"decode failed: {c['status']:#x}"
        c["wall"] = time.monotonic() - t0
        out[n_layer] = c
        log(f"  decode step with {n_layer} layer(s), d_model {shape.d_model}, KV cache of "
            f"{positions} positions: {c['cycles']} cycles")
    return out


def bench_core(cfg, *, positions=32, log=print, progress=None):
    from sim.system import RtlDevice, build_card
    progress = progress or quiet()
    progress.total = 4
    progress.step("Verilator build of the card", "cached after the first")
    lib, built, seconds = build_card(cfg, log=log)
    if not built:
        meta = json.loads((lib.parent / "build.json").read_text())
        seconds = meta.get("seconds", 0.0)
    peak = cfg.hbm_bytes_per_cycle
    result = {"config": cfg.name, "verilator_build_seconds": round(seconds, 1)}

    dev = RtlDevice(cfg, lib=lib)
    progress.step("GPT-2-small matvecs")
    prog, tiles = _matvec_program(cfg, GPT2_SMALL_MATVECS)
    t0 = time.monotonic()
    c = dev.run(prog, 1 << 26, timeout_s=3600)
    wall = time.monotonic() - t0
    assert c["status"] & 0xFF == 0, f"matvec program failed: {c['status']:#x}"
    wbytes = tiles * cfg.stripe_bytes
    result["matvec"] = {"shapes": GPT2_SMALL_MATVECS, "tiles": tiles, "cycles": c["cycles"],
                        "weight_bytes": wbytes, "mpu_starve": c["mpu_starve"]}
    result["hbm_utilization_matvec"] = round(wbytes / (c["cycles"] * peak), 4)
    sim_cycles, sim_wall = c["cycles"], wall
    log(f"  GPT-2-small matvecs: {tiles} tiles in {c['cycles']} cycles")

    runs = _layer_runs(cfg, lambda: RtlDevice(cfg, lib=lib), positions, log, progress)
    one, two = runs[1], runs[2]
    cyc = two["cycles"] - one["cycles"]
    rd = two["hbm_rd_bytes"] - one["hbm_rd_bytes"]
    result["decode_cycles_per_layer"] = cyc
    result["layer"] = {
        "d_model": cfg.core.limits.d_model, "heads": cfg.core.limits.heads, "kv_positions": positions,
        "hbm_bytes": rd,
        "matrix_busy": two["mpu_busy"] - one["mpu_busy"],
        "vector_busy": two["vpu_busy"] - one["vpu_busy"],
        "dma_stall": two["mpu_starve"] - one["mpu_starve"],
        "control_stall": two["issue_stall"] - one["issue_stall"],
        "decode_step_cycles_1_layer": one["cycles"], "decode_step_cycles_2_layers": two["cycles"],
    }
    result["hbm_utilization_layer"] = round(rd / (cyc * peak), 4)
    sim_cycles += one["cycles"] + two["cycles"]
    sim_wall += one["wall"] + two["wall"]
    result["sim_cycles_per_second"] = round(sim_cycles / sim_wall)
    return result


# -- collectives ------------------------------------------------------------------------------
SWEEP_BYTES = [64 << (2 * k) for k in range(10)]          # 64 B .. 16 MiB, powers of 4
SWEEP_CARDS = (2, 4, 8)


def _hops(op, n):
    """Sequential ring steps of one collective: what a message's latency cannot go below."""
    return 2 * (n - 1) if op == "allreduce" else n - 1


def bench_collective(cfg, *, sizes=SWEEP_BYTES, cards=SWEEP_CARDS, log=print, progress=None):
    """busbw against message size (nccl-tests' definitions) on the simulated ring.

    The sweep is all-reduce of fp32 vectors of ``size`` bytes per card, unidirectional and
    bidirectional; all-gather (``size`` = the whole gathered vector, as nccl-tests counts it)
    and reduce-scatter (``size`` = each card's input) run at 1 MiB and the largest size.
    Small-message latency is compared with the floor of its hops: sequential ring steps x the
    link model's latency.
    """
    from sim.fabric import build_fabric, node_params, run_collective
    progress = progress or quiet()
    big = sorted({1 << 20, max(sizes)})
    progress.total = 1 + len(cards) * 2 * (len(sizes) + 2 * len(big))
    progress.step("Verilator build of the collective node", "cached after the first")
    lib = build_fabric(node_params(cfg), log=log)
    rows = []

    def one(op, size, n, bidi):
        progress.step(f"{op} of {size} B on {n} cards{' both ways' if bidi else ''}")
        per_card = size // n if op == "allgather" else size
        elements = max(1, per_card // 4)
        fig, *_ = run_collective(cfg, op, elements, cards=n, bidirectional=bidi, lib=lib)
        if not fig["ok"]:
            raise RuntimeError(f"{op} of {size} B on {n} cards: result differs from numpy")
        fig["size"] = size
        fig["hops"] = _hops(op, n)
        fig["latency_floor_cycles"] = fig["hops"] * cfg.link.latency_cycles
        rows.append(fig)
        log(f"  {op:13s} {size:>9d} B  {n} cards  {'bi ' if bidi else 'uni'}  {fig['cycles']:>8d} cycles  "
            f"busbw {fig['busbw_fraction_of_link_peak']:.3f} of peak")
        return fig

    for n in cards:
        for bidi in (False, True):
            for size in sizes:
                one("allreduce", size, n, bidi)
            for op in ("allgather", "reducescatter"):
                for size in big:
                    one(op, size, n, bidi)
    big = [r for r in rows if r["size"] >= 1 << 20]
    small = [r for r in rows if r["size"] == min(sizes) and r["op"] == "allreduce"]
    return {
        "config": cfg.name, "link_peak_bytes_per_cycle": cfg.link_bytes_per_cycle,
        "link_latency_cycles": cfg.link.latency_cycles, "chunk_bytes": cfg.link.chunk_bytes,
        "min_busbw_fraction_at_1MiB_or_more": min(r["busbw_fraction_of_link_peak"] for r in big),
        "small_message": [{"cards": r["cards"], "bidirectional": r["bidirectional"], "bytes": r["size"],
                           "cycles": r["cycles"], "floor_cycles": r["latency_floor_cycles"],
                           "overhead_cycles_per_hop": round((r["cycles"] - r["latency_floor_cycles"])
                                                            / r["hops"], 1)} for r in small],
        "runs": rows,
    }


CARD_SIZES = {"vsp": (4 << 10, 16 << 10, 32 << 10), "hbm": (16 << 10, 256 << 10, 1 << 20, 4 << 20)}


def bench_card_collective(cfg, *, cards=(2, 4), sizes=CARD_SIZES, log=print, progress=None):
    """All-reduce through the card kernel's collective unit on the Verilated appliance (COLL
    from the VSP and, with hbm, from HBM stripe rows to HBM), checked against numpy's
    reference; busbw as in the fabric sweep, from the card's cycle counter (COLL + HALT)."""
    import numpy as np

    from host.stripes import read_stripes, write_stripes
    from hw.isa import encode
    from sim.progs import Layout
    from sim.ref import collective as ref
    from sim.system import RtlAppliance, build_card
    progress = progress or quiet()
    cases = [(w, z, c) for c in cards for w, sz in sizes.items() for z in sz]
    progress.total = (progress.total or 0) + 1 + len(cases)       # after bench_collective's
    progress.step("Verilator build of the card", "cached after the first")
    lib, _, _ = build_card(cfg, log=log)
    lay = Layout(cfg)
    S, B = cfg.stripe_bytes, cfg.link.data_bits // 32
    rng = np.random.default_rng(0)
    rows = []
    for where, size, n_cards in cases:
        progress.step(f"card all-reduce of {size} B from the {where.upper()} on {n_cards} cards")
        n = size // 4
        app = RtlAppliance(cfg, n_cards, lib=lib)
        x = rng.standard_normal((n_cards, n)).astype(np.float32)
        if where == "hbm":
            src, dst = 4096, 4096 + -(-size // S) + 16
            for i, d in enumerate(app.devices):
                write_stripes(d, cfg, src, x[i])
            prog = [encode("COLL", cop=2, src=src, dst=dst, n=n, hbm=1), encode("HALT")]
        else:
            src, dst = 0, n
            for i, d in enumerate(app.devices):
                write_stripes(d, cfg, lay.data_rows[0], x[i])
            prog = [encode("LOAD", vsp=0, n=n, row=lay.data_rows[0], f32=1), encode("FENCE"),
                    encode("COLL", cop=2, src=src, dst=dst, n=n), encode("FENCE"),
                    encode("STORE", vsp=dst, n=n, row=lay.out_rows[0],
                           lepg=(S // 4).bit_length() - 1, lgpr=0, gstride=0, rstride=1, f32=1),
                    encode("HALT")]
        st = app.run([prog] * n_cards, lay.prog_addr, timeout_s=900)
        want = ref.reference("allreduce", x.view(np.uint32), B,
                             bidirectional=cfg.topology == "bidirectional_ring")[0][:n]
        out_row = dst if where == "hbm" else lay.out_rows[0]
        ok = st == [(len(prog) - 1) << 8] * n_cards and all(
            np.array_equal(read_stripes(d, cfg, out_row, -(-size // S)).view(np.uint32)[:n], want)
            for d in app.devices)
        if not ok:
            raise RuntimeError(f"card all-reduce of {size} B from {where}: wrong result ({st})")
        c = app.devices[0].counters()
        cyc = c["cycles"]
        if where == "vsp":      # the COLL alone: the LOAD and STORE around it are timed apart
            base = RtlAppliance(cfg, n_cards, lib=lib)
            p0 = prog[:2] + prog[3:]
            base.run([p0] * n_cards, lay.prog_addr, timeout_s=900)
            cyc -= base.devices[0].counters()["cycles"]
        bus = size / cyc * 2 * (n_cards - 1) / n_cards
        rows.append({"from": where, "size": size, "cards": n_cards, "cycles": int(cyc),
                     "busbw_bytes_per_cycle": round(bus, 2),
                     "busbw_fraction_of_link_peak": round(bus / cfg.link_bytes_per_cycle, 3)})
        log(f"  card all-reduce from {where}: {size:>8d} B  {n_cards} cards  {cyc:>8d} cycles  "
            f"busbw {rows[-1]['busbw_fraction_of_link_peak']:.3f} of peak")
    return rows


def plot_collective(result, path):
    """busbw (fraction of link peak) against message size, one line per ring."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, ax = plt.subplots(figsize=(7, 4.2), dpi=110)
    runs = [r for r in result["runs"] if r["op"] == "allreduce"]
    for n in sorted({r["cards"] for r in runs}):
        for bidi in (False, True):
            pts = sorted((r["size"], r["busbw_fraction_of_link_peak"]) for r in runs
                         if r["cards"] == n and r["bidirectional"] == bidi)
            ax.plot([p[0] for p in pts], [p[1] for p in pts], marker="o", ms=3,
                    ls="--" if bidi else "-",
                    label=f"{n} cards, {'bidirectional' if bidi else 'unidirectional'}")
    ax.axhline(0.9, color="grey", lw=0.8, ls=":")
    ax.set_xscale("log", base=2)
    ax.set_xlabel("message size per card (bytes)")
    ax.set_ylabel("busbw / link peak")
    ax.set_ylim(0, 1.02)
    ax.set_title(f"all-reduce on the simulated ring ({result['config']}: "
                 f"{result['link_peak_bytes_per_cycle']:g} B/cycle per link, "
                 f"{result['link_latency_cycles']}-cycle links)", fontsize=9)
    ax.grid(True, which="both", lw=0.3)
    ax.legend(fontsize=7, loc="upper left")
    fig.tight_layout()
    _save_png(fig, path)
    plt.close(fig)


def collective_table(result):
    runs = result["runs"]
    keys = sorted({(r["cards"], r["bidirectional"]) for r in runs})
    sizes = sorted({r["size"] for r in runs if r["op"] == "allreduce"})
    cols = " | ".join(f"{n} cards {'bi' if b else 'uni'}" for n, b in keys)
    head = f"| op, size (busbw / link peak) | {cols} |"
    lines = [head, "|---|" + "---|" * len(keys)]
    for op in ("allreduce", "allgather", "reducescatter"):
        for s in sizes if op == "allreduce" else sorted({r["size"] for r in runs if r["op"] == op}):
            cells = []
            for n, b in keys:
                r = [x for x in runs if x["op"] == op and x["size"] == s and x["cards"] == n
                     and x["bidirectional"] == b]
                cells.append(f"{r[0]['busbw_fraction_of_link_peak']:.3f}" if r else "")
            label = f"{op} {_size(s)}"
            lines.append(f"| {label} | " + " | ".join(cells) + " |")
    lines.append("")
    lines.append("| small message (all-reduce) | cycles | floor (hops x link latency) | overhead per hop |")
    lines.append("|---|---|---|---|")
    for r in result["small_message"]:
        lines.append(f"| {r['bytes']} B, {r['cards']} cards {'bi' if r['bidirectional'] else 'uni'} | "
                     f"{r['cycles']} | {r['floor_cycles']} | {r['overhead_cycles_per_hop']} |")
    if result.get("card"):
        lines.append("")
        lines.append("| all-reduce through the card kernel (Verilated appliance) | cycles "
                     "| busbw / link peak |")
        lines.append("|---|---|---|")
        for r in result["card"]:
            lines.append(f"| {_size(r['size'])} from the {r['from'].upper()}, {r['cards']} cards | "
                         f"{r['cycles']} | {r['busbw_fraction_of_link_peak']:.3f} |")
    return "\n".join(lines)


def _size(b):
    for unit, k in (("MiB", 20), ("KiB", 10)):
        if b >= 1 << k:
            return f"{b >> k} {unit}"
    return f"{b} B"


# -- the runtime ------------------------------------------------------------------------------
def bench_run(cfg, *, prompt="On a rock at the edge of the northern sea", new_tokens=16,
              cards=(1, 2, 4), log=print, progress=None):
    """The demo model through `gptfpga run`'s loop on the Verilated appliance of 1, 2 and 4
    cards (several only when the config's card kernel has ring links): prefill and decode cycles
    per token, HBM utilization over whole decode tokens (of every card's HBM), link bytes per
    token (all cards' sends), and the simulation's wall time per token."""
    from host.model import load_checkpoint
    from host.runtime import DEMO_MODEL, generate, make_cards
    from host.tokenizer import load_tokenizer
    model = load_checkpoint(DEMO_MODEL)
    ids = load_tokenizer(DEMO_MODEL).encode(prompt)
    runs = []
    progress = progress or quiet()
    todo = [c for c in cards if c == 1 or cfg.ring_links]
    progress.total = len(todo)
    for n in todo:
        progress.step(f"demo model on {n} Verilated card(s)", f"{new_tokens} tokens")
        out, _, stats = generate(cfg, make_cards(cfg, model, "rtl", n), None, ids, new_tokens)
        fig = stats.summary(cfg)
        log(f"  demo model on {n} card(s), {len(ids)}-token prompt, {len(out)} tokens: decode "
            f"{fig['decode_cycles_per_token']} cycles/token, prefill {fig['prefill_cycles_per_token']}, "
            f"HBM utilization {fig['hbm_utilization_decode']}")
        runs.append({"prompt_tokens": len(ids), "generated": len(out), **fig})
    return {"config": cfg.name, "model": "demo (d_model 128, 4 layers, 4 heads)",
            "model_bytes_per_token": int(model.shape.n_params * 2), "runs": runs}


def run_table(result):
    rows = [("prefill cycles per prompt token", "prefill_cycles_per_token"),
            ("decode cycles per token", "decode_cycles_per_token"),
            ("decode ms per token at the clock", "decode_ms_per_token_at_clock"),
            ("HBM utilization over whole decode tokens", "hbm_utilization_decode"),
            ("HBM bytes per decode token (all cards)", "hbm_bytes_per_token"),
            ("link bytes per decode token (all cards)", "link_bytes_per_token"),
            ("simulation wall seconds per decode token", "wall_seconds_per_decode_token")]
    runs = result["runs"]
    heads = [f"{result['config']}, {r['cards']} card{'s' if r['cards'] > 1 else ''}" for r in runs]
    lines = ["| figure | " + " | ".join(heads) + " |",
             "|---|" + "---|" * len(runs)]
    lines += [f"| {label} | " + " | ".join(str(r[key]) for r in runs) + " |" for label, key in rows]
    return "\n".join(lines)


# -- the performance model ----------------------------------------------------------------------

def _calibration_cases():
    """(name, config, model factory, steps, cards): the runs the model is held to. Each step is
    (kind, tokens, first position); the KV cache is whatever the earlier steps left (the cycles
    do not depend on its values). A "batch" step decodes ``tokens`` streams together, stream s
    at position first + s. With several cards, the Verilated appliance (the cards' collective
    units and the link models) runs every card's program of the step, the model the same
    programs together (``host.perf.simulate``); a prefill step there is the runtime's: cut in
    two halves and merged as the model chooses (host.compiler.tune: the lead and the second
    half's lag), a batch of 4 is cut in two halves of 2 (lead 0), as the runtime runs them."""
    from gen.config import load_config
    from host.model import Gpt2Shape, load_checkpoint, random_gpt2
    from host.runtime import DEMO_MODEL
    tiny = load_config(ROOT / "configs" / "tiny.yaml")
    tiny8 = load_config(ROOT / "configs" / "tiny-int8.yaml")
    tiny16 = load_config(ROOT / "configs" / "tiny-int16.yaml")
    medium = load_config(ROOT / "configs" / "medium.yaml")
    small2 = Gpt2Shape(n_layer=2, n_head=12, d_model=768, vocab=1024, n_positions=128)
    return [
        ("tiny, demo model", tiny, lambda: load_checkpoint(DEMO_MODEL),
         [("prefill", None, 0), ("decode", 1, 19), ("decode", 1, 100), ("batch", 4, 19)], 1),
        ("tiny-int8, demo model", tiny8, lambda: load_checkpoint(DEMO_MODEL),
         [("prefill", None, 0), ("decode", 1, 19), ("batch", 4, 19)], 1),
        ("tiny-int16, demo model", tiny16, lambda: load_checkpoint(DEMO_MODEL),
         [("prefill", None, 0), ("decode", 1, 19), ("decode", 1, 100), ("batch", 4, 19)], 1),
        ("medium, GPT-2-small layers x 2", medium,
         lambda: random_gpt2(small2, np.random.default_rng(0)),
         [("prefill", None, 0), ("decode", 1, 4), ("decode", 1, 100)], 1),
        ("medium at 300 MHz (HBM below the port rate)", medium.replace(clock_mhz=300),
         lambda: random_gpt2(small2, np.random.default_rng(0)), [("decode", 1, 4)], 1),
        ("tiny x 2 cards, demo model", tiny, lambda: load_checkpoint(DEMO_MODEL),
         [("prefill", None, 0), ("decode", 1, 19), ("batch", 4, 19)], 2),
        ("tiny x 4 cards, demo model", tiny, lambda: load_checkpoint(DEMO_MODEL),
         [("prefill", None, 0), ("decode", 1, 19), ("batch", 4, 19)], 4),
    ]


def calibration_programs(cms, kind, tokens, pos):
    """Every card's program of a calibration step (``_calibration_cases``): ``cms`` one
    CompiledModel per card. The lead of a split prefill step is the model's choice, as the
    runtime's (host.compiler.tune; kept in ``cms[0].merges``, so a replay gets the same)."""
    from host.compiler.tune import step_programs
    if kind == "batch":
        return [cm.step_batch([(1, pos + s, s) for s in range(tokens)]) for cm in cms]
    return step_programs(cms, [1] * tokens, pos)


def coll_calibration_config():
    """u280x4's collective unit on a small core, for the Verilated appliance: u280x4's link,
    ring and vector lanes (a link beat is one VSP row, both ways round the ring), tiny's
    memories otherwise (the VSP large enough for a prefill step's all-reduce), 16 lanes x 16."""
    from gen.config import load_config
    u = load_config(ROOT / "configs" / "u280x4.yaml")
    tiny = load_config(ROOT / "configs" / "tiny.yaml")
    return tiny.replace(**{
        "name": "tiny-u280x4-ring", "topology": u.topology, "core.lanes": u.core.vector_lanes,
        "core.width": 16, "core.vector_lanes": u.core.vector_lanes, "core.vsp_words": 131072,
        "hbm.channels": 8, "hbm.data_bits": 512, "link.data_bits": u.link.data_bits,
        "link.latency_cycles": u.link.latency_cycles, "link.gbits_per_s": u.link.gbits_per_s,
        "link.chunk_bytes": u.link.chunk_bytes, "clock_mhz": u.clock_mhz})


# (config, op, cards, fp32 words): COLLs through the card's collective unit. The sizes of
# GPT-2 1.5B on u280x4: a LayerNorm's statistics (16), a decode token's sums (1,600), a
# decode batch's half (6,400), a prefill step's all-reduce (32 tokens, 51,200).
CARD_COLL_CASES = ([("tiny", op, n, w) for op in ("allgather", "allreduce") for n in (2, 4)
                    for w in (16, 512, 2048)]
                   + [("tiny-u280x4-ring", op, n, w) for op, ws in (("allgather", (16, 1600, 6400)),
                                                                    ("allreduce", (1600, 51200)))
                      for n in (2, 4) for w in ws])


def card_coll_configs():
    """The configs of ``CARD_COLL_CASES`` by name."""
    from gen.config import load_config
    return {"tiny": load_config(ROOT / "configs" / "tiny.yaml"),
            "tiny-u280x4-ring": coll_calibration_config()}


def card_coll_dst(words):
    """Where a card-COLL case puts its result in the VSP (its input at word 0)."""
    return -(-words // 64) * 64


def calibrate_card_collectives(*, cases=CARD_COLL_CASES, log=print, progress=None):
    """COLLs on the VSP through the card's collective unit on the Verilated appliance (every
    card the same COLL and HALT, less a HALT alone) against ``host.perf.coll_cycles``."""
    from host.perf import coll_cycles
    from sim.progs import Layout
    from sim.system import RtlAppliance, build_card
    cfgs = card_coll_configs()
    progress = progress or quiet()
    rows, libs, halt = [], {}, {}

    def cycles(name, cards, prog):
        cfg = cfgs[name]
        app = RtlAppliance(cfg, cards, lib=libs[name])
        st = app.run([prog] * cards, Layout(cfg).prog_addr, timeout_s=900)
        if any(x & 0xFF for x in st):
            raise RuntimeError(f"{name}, {cards} cards: status {st} running {len(prog)} instructions")
        return max(d.counters()["cycles"] for d in app.devices)
    for name, op, cards, words in cases:
        cfg = cfgs[name]
        if name not in libs:
            progress.note(f"{name}: building the Verilated card")
            libs[name] = build_card(cfg, log=log)[0]
        progress.step(f"{op} of {words} words on {cards} {name} cards (the card's unit)")
        if (name, cards) not in halt:                  # a HALT alone: the start and the end
            halt[name, cards] = cycles(name, cards, [encode("HALT")])
        coll = encode("COLL", cop=0 if op == "allgather" else 2, src=0, dst=card_coll_dst(words), n=words)
        rtl = cycles(name, cards, [coll, encode("HALT")]) - halt[name, cards]
        model = coll_cycles(cfg, cards, words, op=op)
        err = (model - rtl) / rtl
        rows.append({"config": name, "op": op, "cards": cards, "words": words, "rtl_cycles": rtl,
                     "model_cycles": model, "error": round(err, 4)})
        log(f"  {op} of {words} words on {cards} {name} cards (the card's unit): RTL {rtl}, "
            f"model {model} ({err:+.1%})")
    return rows


def calibrate_perf(*, log=print, cases=None, collectives=True, progress=None):
    """The performance model against the Verilated card's cycle counter, step by step (one card,
    or every card of a tiny appliance); the collective model against the collective engine's
    RTL for decode-sized all-reduces; and with ``collectives`` also COLLs through the card's
    collective unit (``calibrate_card_collectives``)."""
    from host.perf import coll_cycles, simulate
    from host.runtime import make_cards
    from sim.fabric import run_collective
    runs = []
    progress = progress or quiet()
    cases = cases or _calibration_cases()
    coll_cases = [(op, n, w) for op in ("allreduce", "allgather") for n in (2, 4) for w in (1024, 1600)]
    coll_cases = coll_cases if collectives else []
    progress.total = (sum(len(c[3]) for c in cases) + len(coll_cases)
                      + (len(CARD_COLL_CASES) if collectives else 0))
    for name, cfg, make, steps, cards in cases:
        progress.note(f"{name}: compiling, building the Verilated card")
        streams = max([t for k, t, _ in steps if k == "batch"], default=1)
        appliance = make_cards(cfg, make(), "rtl", cards, streams=streams)
        appliance.load()
        for kind, tokens, pos in steps:
            progress.step(f"{name}: {kind} at {pos}")
            tokens = tokens or appliance.T
            progs = calibration_programs(appliance.cms, kind, tokens, pos)
            rtl = appliance.run(progs, pos, timeout_s=3600)     # (a CardError if a card fails)
            model = simulate(cfg, progs)["cycles"]
            err = (model - rtl["cycles"]) / rtl["cycles"]
            runs.append({"case": name, "config": cfg.name, "clock_mhz": cfg.clock_mhz, "cards": cards,
                         "step": kind, "tokens": tokens, "position": pos, "rtl_cycles": rtl["cycles"],
                         "model_cycles": model, "error": round(err, 4)})
            log(f"  {name}: {kind} {tokens} token(s) at {pos}: RTL {rtl['cycles']}, model {model} "
                f"({err:+.1%})")
    colls = []
    from gen.config import load_config
    u = load_config(ROOT / "configs" / "u280x4.yaml")
    for op, cards, words in coll_cases:
        progress.step(f"{op} of {words} words on {cards} cards ({u.name})")
        fig, *_ = run_collective(u, op, words, cards=cards,
                                 bidirectional=u.topology == "bidirectional_ring")
        model = coll_cycles(u.replace(cards=cards), cards, words, card=False, op=op)
        err = (model - fig["cycles"]) / fig["cycles"]
        colls.append({"config": u.name, "op": op, "cards": cards, "words": words,
                      "rtl_cycles": fig["cycles"], "model_cycles": model,
                      "error": round(err, 4)})
        log(f"  {op} of {words} words on {cards} cards ({u.name}): RTL {fig['cycles']}, "
            f"model {model} ({err:+.1%})")
    cards = calibrate_card_collectives(log=log, progress=progress) if collectives else []
    return {"steps": runs, "collectives": colls, "card_collectives": cards,
            "calibration_error": max(abs(r["error"]) for r in runs),
            "collective_error": max((abs(r["error"]) for r in colls), default=None),
            "card_collective_error": max((abs(r["error"]) for r in cards), default=None)}


def bench_perf(cfg, *, shapes=("gpt2-medium", "gpt2-large", "gpt2-xl"), cards=(1, 2, 4),
               clocks=(200, 300), lengths=(32, 64, 128), log=print, progress=None):
    """The side-by-side: projected figures of GPT-2 345M, 774M and 1.5B on 1, 2 and 4 cards of
    ``cfg`` at each clock, for [input:output] lengths, next to DFX's published ones."""
    from host.errors import UserError
    from host.model import SHAPES
    from host.perf import DFX, StepCosts, predict
    rows = []
    progress = progress or quiet()
    progress.total = len(shapes) * len(cards) * len(clocks) + 6        # and the what-ifs
    for shape in shapes:
        for n in cards:
            for mhz in clocks:
                progress.step(f"{shape} on {n} card(s) at {mhz} MHz")
                c = cfg.replace(cards=n, clock_mhz=mhz)
                try:
                    costs = StepCosts(c, SHAPES[shape], n)
                except UserError as e:
                    rows.append({"model": shape, "cards": n, "clock_mhz": mhz, "fits": False,
                                 "why": str(e)})
                    log(f"  {shape} on {n} card(s) at {mhz} MHz: does not fit ({e})")
                    continue
                for L in lengths:
                    r = predict(c, SHAPES[shape], cards=n, prompt=L, new_tokens=L, costs=costs)
                    rows.append({"model": shape, "fits": True, "in_out": f"{L}:{L}", **r})
                log(f"  {shape} on {n} card(s) at {mhz} MHz: decode {rows[-1]['decode_ms_per_token']} "
                    f"ms/token ({rows[-1]['hbm_roofline_fraction']} of the HBM roofline)")
    what_if = _what_if(cfg, log, progress=progress)
    cal = recorded_calibration()
    return {"config": cfg.name, "source": "projected by the performance model (host/perf.py), "
            "not measured: no RTL appliance of several cards yet, and never on a board",
            "calibration_error": cal and cal["calibration_error"], "dfx": DFX, "rows": rows,
            "what_if": what_if}


def _what_if(cfg, log, shape="gpt2-xl", cards=4, length=64, progress=None):
    """GPT-2 1.5B on 4 cards, [64:64] at 200 MHz, with one design parameter changed at a time:
    where the decode time goes, and what would buy it back."""
    import dataclasses

    from host.errors import UserError
    from host.model import SHAPES
    from host.perf import predict
    base = cfg.replace(cards=cards, clock_mhz=200)
    core = base.core
    # the vector unit at its widest: as many lanes as the matrix unit's, each with its own
    # special-function units
    wide = dataclasses.replace(base, core=dataclasses.replace(core, vector_lanes=core.lanes,
                                                              special_share=1))
    if core.vector_lanes < core.lanes:
        vname, vshort = (f"vector unit {core.lanes} lanes (from {core.vector_lanes})",
                         f"{core.lanes} vector lanes")
    else:
        vname, vshort = (f"special functions on every vector lane (from one per "
                         f"{core.special_share})", "special functions on every lane")
    variants = [("as configured", base),
                (vname, wide),
                (f"link latency 100 cycles (from {base.link.latency_cycles})",
                 dataclasses.replace(base, link=dataclasses.replace(base.link, latency_cycles=100))),
                ("both", dataclasses.replace(
                    wide, link=dataclasses.replace(base.link, latency_cycles=100)))]
    from host.perf import StepCosts
    variants.append(("all-gather by exchange (not built: each card's whole vector both ways, "
                     "ceil((N-1)/2) hops)", base))
    variants.append((f"exchange and {vshort}", wide))
    out = []
    progress = progress or quiet()
    for name, c in variants:
        progress.step(f"what if: {name.split(' (')[0]}")
        algo = "exchange" if "exchange" in name else "ring"
        try:
            costs = StepCosts(c, SHAPES[shape], cards, coll_algorithm=algo)
        except UserError as e:      # the what-ifs are of GPT-2 1.5B: a small config cannot hold it
            log(f"  what if, {shape} on {cards} cards of {cfg.name}: not evaluated ({e})")
            return []
        r = predict(c, SHAPES[shape], cards=cards, prompt=length, new_tokens=length, costs=costs)
        out.append({"variant": name, "model": shape, "cards": cards, "in_out": f"{length}:{length}",
                    "decode_ms_per_token": r["decode_ms_per_token"],
                    "hbm_roofline_fraction": r["hbm_roofline_fraction"]})
        log(f"  what if, {shape} on {cards} cards: {name}: decode {r['decode_ms_per_token']} ms/token")
    return out


def perf_table(result):
    lines = ["| model | cards | MHz | in:out | decode ms/token | prefill ms/input token | total ms | "
             "HBM roofline fraction | DFX decode ms/token |", "|---|---|---|---|---|---|---|---|---|"]
    for r in result["rows"]:
        dfx = result["dfx"].get(r["model"], {}).get("decode_ms_per_token", "")
        dfx = dfx if (r["cards"] == 4 and r["clock_mhz"] == 200) else ""
        if not r["fits"]:
            lines.append(f"| {r['model']} | {r['cards']} | {r['clock_mhz']} | - | does not fit: "
                         f"{r['why'].split(': ', 1)[-1]} | | | | |")
            continue
        lines.append(f"| {r['model']} | {r['cards']} | {r['clock_mhz']:g} | {r['in_out']} | "
                     f"{r['decode_ms_per_token']} | {r['prefill_ms_per_token']} | {r['total_ms']} | "
                     f"{r['hbm_roofline_fraction']} | {dfx} |")
    return "\n".join(lines)


def what_if_table(result):
    if not result["what_if"]:
        return f"what-ifs of GPT-2 1.5B on 4 cards: not evaluated ({result['config']} cannot hold it)"
    lines = ["| GPT-2 1.5B, 4 cards, 200 MHz, [64:64] | decode ms/token | HBM roofline fraction |",
             "|---|---|---|"]
    for r in result["what_if"]:
        lines.append(f"| {r['variant']} | {r['decode_ms_per_token']} | {r['hbm_roofline_fraction']} |")
    return "\n".join(lines)


def plot_roofline(result, path):
    """Decode ms/token against cards, ours and DFX's, with the HBM roofline (PNG)."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, axes = plt.subplots(1, 2, figsize=(11, 4))
    rows = [r for r in result["rows"] if r["fits"] and r["in_out"] == "64:64"]
    for ax, mhz in zip(axes, (200, 300), strict=True):
        for model in dict.fromkeys(r["model"] for r in rows):
            rs = [r for r in rows if r["model"] == model and r["clock_mhz"] == mhz]
            if not rs:
                continue
            line, = ax.plot([r["cards"] for r in rs], [r["decode_ms_per_token"] for r in rs], "o-",
                            label=f"{model} (model)")
            ax.plot([r["cards"] for r in rs], [r["hbm_roofline_decode_ms_per_token"] for r in rs], ":",
                    color=line.get_color(), label=f"{model} HBM roofline")
            d = result["dfx"].get(model)
            if d and mhz == 200:
                ax.plot([4], [d["decode_ms_per_token"]], "x", ms=10, color=line.get_color(),
                        label=f"{model} DFX (paper)")
        ax.set_xlabel("U280 cards")
        ax.set_ylabel("decode ms per token")
        ax.set_xticks([1, 2, 4])
        ax.set_title(f"{result['config']} at {mhz} MHz, [64:64], projected")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    _save_png(fig, path, dpi=110)
    plt.close(fig)


def _save_png(fig, path, **kw):
    """A matplotlib figure to ``path`` as PNG, whole or not at all."""
    from host.files import atomic_output
    with atomic_output(path, "wb", flag="--plot") as f:
        fig.savefig(f, format="png", **kw)
