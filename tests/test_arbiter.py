"""The round-robin arbiter of hw/arbiter.py (used by the AXI multiplexers and the collective
unit), in amaranth.sim against a Python model of the same rule."""

import random

import pytest
from amaranth.sim import Simulator

from hw.arbiter import RoundRobin, StreamArbiter


def _model(requests, last, count):
    """The first requester after ``last``, cyclically, whose request is set; ``last`` if none."""
    for o in range(1, count + 1):
        q = (last + o) % count
        if requests >> q & 1:
            return q
    return last


@pytest.mark.parametrize("count", [1, 2, 3, 4])
def test_round_robin_matches_the_rule(count, seed):
    dut = RoundRobin(count=count)
    rng = random.Random(seed + count)

    async def bench(ctx):
        last = 0
        for _ in range(300):
            requests, advance = rng.randrange(1 << count), rng.random() < 0.7
            ctx.set(dut.requests, requests)
            ctx.set(dut.advance, advance)
            grant = ctx.get(dut.grant)
            assert grant == _model(requests, last, count), (requests, last)
            await ctx.tick()
            if advance:
                last = grant

    sim = Simulator(dut)
    sim.add_clock(1e-8)
    sim.add_testbench(bench)
    sim.run()


def test_stream_arbiter_serves_every_input_in_turn():
    """Three inputs always valid, the output always ready: they go in turn, each payload with
    its own ready."""
    dut = StreamArbiter(8, count=3)

    async def bench(ctx):
        for q, i in enumerate(dut.i):
            ctx.set(i.valid, 1)
            ctx.set(i.payload, 10 + q)
        ctx.set(dut.o.ready, 1)
        order = []
        for _ in range(6):
            assert ctx.get(dut.o.valid)
            q = ctx.get(dut.grant)
            assert ctx.get(dut.o.payload) == 10 + q
            assert [ctx.get(i.ready) for i in dut.i] == [int(k == q) for k in range(3)]
            order.append(q)
            await ctx.tick()
        assert order == [1, 2, 0, 1, 2, 0]
        for i in dut.i:
            ctx.set(i.valid, 0)
        assert not ctx.get(dut.o.valid) and not any(ctx.get(i.ready) for i in dut.i)

    sim = Simulator(dut)
    sim.add_clock(1e-8)
    sim.add_testbench(bench)
    sim.run()
