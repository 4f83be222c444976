"""The weight FIFO of hw/core/wfifo.py in amaranth.sim: tiles come out in order, whole (every
channel's beat of the same tile), at one pop a cycle once queued, and the writer is held off
exactly when the storage is full; against a Python queue, random pushes and pops (seeded)."""

import random
from collections import deque

import pytest
from amaranth.sim import Simulator

from hw.core.wfifo import QUEUE, WeightFifo

CH, BITS = 3, 8


def _tile(n):
    """Tile n: channel k's beat is (n * 7 + k) mod 256, so a mixed tile shows."""
    return sum(((n * 7 + k) & 0xFF) << (BITS * k) for k in range(CH))


def _run(depth, p_push, p_pop, cycles, seed):
    dut = WeightFifo(channels=CH, data_bits=BITS, depth=depth)
    rng = random.Random(seed)
    got, pops_at, model = [], [], deque()
    stats = {"pushed": 0, "full_cycles": 0}

    async def bench(ctx):
        pushed, tile_reg, pending = 0, None, []       # pending: cycles the pops take effect
        for cyc in range(cycles):
            push = rng.random() < p_push
            ctx.set(dut.w.valid, push)
            ctx.set(dut.w.payload, _tile(pushed))
            avail = ctx.get(dut.r.avail)
            pop = avail and rng.random() < p_pop
            ctx.set(dut.r.pop, pop)
            # The registered pops of the cycle before: every channel's at once.
            take = ctx.get(dut.r.take)
            assert take in (0, (1 << CH) - 1), f"cycle {cyc}: channels out of step, take {take:b}"
            if take:
                tile_reg = ctx.get(dut.r.head)
                assert pending and pending.pop(0) == cyc, f"cycle {cyc}: take without a pop"
                got.append(tile_reg)
            ready = ctx.get(dut.w.ready)
            # (level counts the tile leaving this cycle: it goes at the clock edge)
            assert ctx.get(dut.level) == len(model) - len(got) + bool(take), f"cycle {cyc}: level"
            if push and ready:
                model.append(pushed)
                pushed += 1
                stats["pushed"] += 1
            if not ready:
                stats["full_cycles"] += 1
            if pop:
                pops_at.append(cyc)
                pending.append(cyc + 1)
            await ctx.tick()
        assert not pending or pending == [cycles]

    sim = Simulator(dut)
    sim.add_clock(1e-8)
    sim.add_testbench(bench)
    sim.run()
    return got, pops_at, stats


@pytest.mark.parametrize("depth", [2, 4, 16])
def test_tiles_in_order_whole_and_none_lost(depth, seed):
    got, _, stats = _run(depth, p_push=0.7, p_pop=0.6, cycles=600, seed=seed + depth)
    assert got == [_tile(n) for n in range(len(got))], "tiles out of order or mixed"
    assert stats["pushed"] - len(got) <= depth + QUEUE + 2
    assert len(got) > 100


def test_one_pop_a_cycle_once_queued(seed):
    """Pushing and popping every cycle: after the first tile's way through (written, read,
    output register, queue: the performance model's WFIFO_IN_TO_POP cycles), a tile leaves
    every cycle."""
    from host.perf import WFIFO_IN_TO_POP
    got, pops_at, _ = _run(8, p_push=1.0, p_pop=1.0, cycles=200, seed=seed)
    first = pops_at[0]
    assert pops_at == list(range(first, first + len(pops_at))), "a bubble between pops"
    assert first == WFIFO_IN_TO_POP
    assert got == [_tile(n) for n in range(len(got))]


def test_writer_held_off_when_full(seed):
    """No pops: the FIFO takes depth + QUEUE + the reads in flight, then refuses."""
    got, _, stats = _run(4, p_push=1.0, p_pop=0.0, cycles=60, seed=seed)
    assert got == []
    assert stats["pushed"] == 4 + QUEUE
    assert stats["full_cycles"] > 40
