"""The AXI burst read engine: amaranth.sim for quick checks, cocotb in Verilator for the proof."""

import json
import random

import numpy as np
import pytest
from amaranth.sim import Simulator

from gen.tops import reader_params
from hw.dma.reader import AxiBurstReader, burst_block
from sim.cocotb_run import build_cached, run_cocotb
from sim.ref.dma import expected_beats, split_bursts


def test_split_bursts_reference():
    # 4 KiB = 128 beats of 32 bytes; block 32: boundaries every 32 beats.
    assert split_bursts(30, 5, 32) == [(30, 2), (32, 3)]
    assert split_bursts(0, 64, 32) == [(0, 32), (32, 32)]
    assert split_bursts(7, 0, 32) == []
    assert sum(n for _, n in split_bursts(5, 1000, 16)) == 1000
    for a, n in split_bursts(5, 1000, 16):
        assert a // 16 == (a + n - 1) // 16


def run_amaranth(params, commands, mem, base, latency, *, out_stall=None):
    dut = AxiBurstReader(**params)
    bb = params["data_bits"] // 8
    sim = Simulator(dut)
    sim.add_clock(5e-9)
    out, ars, cycles_of_beat = [], [], []
    state = {"done": False}

    async def slave(ctx):
        queue = []          # bursts accepted: [cycle ready, addr, len]
        cycle = 0
        ctx.set(dut.axi.arready, 1)
        cur = None
        async for _clk, _rst, arvalid, araddr, arlen, rready in ctx.tick().sample(
                dut.axi.arvalid, dut.axi.araddr, dut.axi.arlen, dut.axi.rready):
            cycle += 1
            # What happened at this edge:
            if arvalid:
                ars.append((araddr, arlen))
                queue.append([cycle + latency, araddr, arlen + 1, 0])
            if cur is not None and rready:
                cur[3] += 1
                if cur[3] == cur[2]:
                    queue.remove(cur)
            # Drive R for the next cycle.
            cur = queue[0] if queue and queue[0][0] <= cycle else None
            if cur is None:
                ctx.set(dut.axi.rvalid, 0)
            else:
                addr = cur[1] + cur[3] * bb
                ctx.set(dut.axi.rvalid, 1)
                ctx.set(dut.axi.rdata, int.from_bytes(mem[addr:addr + bb].tobytes(), "little"))
                ctx.set(dut.axi.rlast, cur[3] == cur[2] - 1)
            if state["done"]:
                return

    async def sink(ctx):
        rng = random.Random(7)
        cycle = 0
        ready = 1
        ctx.set(dut.data.ready, ready)
        async for _clk, _rst, valid, payload in ctx.tick().sample(dut.data.valid, dut.data.payload):
            cycle += 1
            if valid and ready:
                out.append((payload.data, payload.last))
                cycles_of_beat.append(cycle)
            ready = 1 if out_stall is None else int(rng.random() >= out_stall)
            ctx.set(dut.data.ready, ready)
            if state["done"]:
                return

    async def driver(ctx):
        ctx.set(dut.base, base)
        for addr, beats in commands:
            ctx.set(dut.cmd.payload, {"addr": addr, "beats": beats})
            ctx.set(dut.cmd.valid, 1)
            await ctx.tick().until(dut.cmd.ready)
        ctx.set(dut.cmd.valid, 0)
        total = sum(b for _, b in commands)
        for _ in range(20000):
            if len(out) >= total:
                break
            await ctx.tick()
        await ctx.tick().repeat(5)
        state["done"] = True
        await ctx.tick().repeat(2)

    sim.add_process(slave)
    sim.add_process(sink)
    sim.add_testbench(driver)
    sim.run()
    return out, ars, cycles_of_beat


def small_params():
    return dict(data_bits=256, beat_addr_bits=12, len_bits=12, max_burst=8, max_outstanding=4)


def test_amaranth_random(seed):
    params = small_params()
    bb = 32
    rng = random.Random(seed)
    mem = np.random.default_rng(seed).integers(0, 256, 1 << 17, dtype=np.uint8)
    base = 64
    cmds = [(rng.randrange(3000), rng.randint(1, 40)) for _ in range(12)]
    out, ars, _ = run_amaranth(params, cmds, mem, base, latency=6, out_stall=0.3)
    exp_data, exp_last = expected_beats(mem, base, bb, cmds)
    # bursts are cut on absolute beat addresses (base / bb + addr)
    assert [a for a in ars] == [(a * bb, n - 1) for addr, beats in cmds
                                for a, n in split_bursts(base // bb + addr, beats, 8)]
    assert len(out) == len(exp_data)
    for (d, last), ref, ref_last in zip(out, exp_data, exp_last, strict=True):
        assert d == int.from_bytes(ref.tobytes(), "little")
        assert last == ref_last


def test_amaranth_base_off_page():
    """A base that is beat aligned but not page aligned: no burst crosses a 4 KiB page (the
    engine cut bursts on the beat index alone, and bursts straddled pages; found by the
    formal proof in sim/formal/reader.py)."""
    params = dict(small_params(), max_burst=8)
    bb = 32
    mem = np.random.default_rng(7).integers(0, 256, 1 << 17, dtype=np.uint8)
    base = 4096 - 3 * bb
    cmds = [(0, 40), (125, 9), (1, 7)]
    out, ars, _ = run_amaranth(params, cmds, mem, base, latency=4)
    for addr, length in ars:
        assert addr // 4096 == (addr + (length + 1) * bb - 1) // 4096, f"burst {addr:#x}+{length + 1}"
    exp_data, _ = expected_beats(mem, base, bb, cmds)
    assert [d for d, _ in out] == [int.from_bytes(r.tobytes(), "little") for r in exp_data]


def test_amaranth_full_rate():
    """Fed by a slave with latency 20 and no stalls, a long command streams one beat per cycle."""
    params = small_params()
    mem = np.arange(1 << 16, dtype=np.uint32).view(np.uint8)
    out, _, cycles = run_amaranth(params, [(0, 200)], mem, 0, latency=20)
    assert len(out) == 200
    assert cycles[-1] - cycles[0] == 199, f"200 beats took {cycles[-1] - cycles[0] + 1} cycles"


@pytest.mark.rtl
def test_rtl_cocotb(cfg, emitted, seed):
    params = reader_params(cfg)
    p = dict(params, beat_bytes=cfg.hbm_beat_bytes,
             block=burst_block(params["max_burst"], cfg.hbm_beat_bytes))
    run_cocotb([emitted["hbm_reader"]], "hbm_reader", "sim.tb.tb_hbm_reader",
               extra_env={"GPTFPGA_PARAMS": json.dumps(p), "GPTFPGA_SEED": str(seed)})
    # The build is cached by content: asking again builds nothing.
    _, _, built_now = build_cached([emitted["hbm_reader"]], "hbm_reader")
    assert not built_now
