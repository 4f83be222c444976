"""Performance of the card in Verilator: ``gptfpga bench core``.

Figures are cycles from the card's own counters; HBM utilization is weight bytes read over
(cycles x the config's peak HBM bytes per cycle). Wall-clock figures (simulation speed, build
time) describe this machine, not the design.
"""

import json
import time

import numpy as np

from hw.isa import encode

__all__ = ["bench_core"]

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
        prog.append(encode("MATVEC", xb=0, dst=dst, rb=n, cb=cb, group=8, tokens=1,
                           bias=dst, bias_en=int(acc)))
        avail -= n * cb
    prog.append(encode("HALT"))
    return prog, tiles


def _layer_runs(cfg, dev_factory, positions, log):
    """Decode-step counters for models of 1 and 2 layers at the config's largest width."""
    from host.compiler import CompiledModel
    from host.model import Gpt2Shape, random_gpt2
    lim = cfg.core.limits
    out = {}
    for n_layer in (1, 2):
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


def bench_core(cfg, *, positions=32, log=print):
    from sim.system import RtlDevice, build_card
    lib, built, seconds = build_card(cfg, log=log)
    if not built:
        meta = json.loads((lib.parent / "build.json").read_text())
        seconds = meta.get("seconds", 0.0)
    peak = cfg.hbm_bytes_per_cycle
    result = {"config": cfg.name, "verilator_build_seconds": round(seconds, 1)}

    dev = RtlDevice(cfg, lib=lib)
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

    runs = _layer_runs(cfg, lambda: RtlDevice(cfg, lib=lib), positions, log)
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
