"""cocotb regression of the AXI burst read engine against cocotbext-axi's AXI RAM.

Parameters arrive in the environment: GPTFPGA_PARAMS (JSON: reader parameters, beat bytes,
block) and GPTFPGA_SEED. Every test prints its seed; rerun one with the same seed to
reproduce it.

The RAM is 1 MiB and aliases every address modulo its size, so buffer bases carry random
high address bits (above bit 20, up to bit 63) while the data come from the same 1 MiB: the
AR monitor checks every ARADDR, high bits included, against the reference. Two of the random
tests use complementary high bits, so every address bit above the RAM's is seen both 0 and 1.
Every beat's data, ``last`` and ``err`` are checked; a beat the RAM fails comes back as
SLVERR with zero data.
"""

import json
import os
import random

import cocotb
import numpy as np
from cocotb.clock import Clock
from cocotb.triggers import ReadOnly, RisingEdge
from cocotbext.axi import AxiRamRead, AxiReadBus

from sim.ref.dma import expected_beats, split_bursts

P = json.loads(os.environ["GPTFPGA_PARAMS"])
SEED = int(os.environ.get("GPTFPGA_SEED", "1"))
BEAT = P["beat_bytes"]
BLOCK = P["block"]
MEM_BYTES = 1 << 20
# address bits the RAM aliases away: a base's bits here reach ARADDR, not the data
HIGH_MASK = ((1 << 64) - 1) & ~(MEM_BYTES - 1)
HIGH = random.Random(SEED).getrandbits(64) & HIGH_MASK


def pause(rng, p_stall):
    while True:
        yield rng.random() < p_stall


class FaultyRam(AxiRamRead):
    """AXI RAM whose reads fail (the model answers SLVERR, data zero) at or above
    ``fault_from``, or for a beat in ``fault_beats`` (beat indices); both on the address
    modulo the RAM's size, as AxiRamRead reads it."""

    fault_from = MEM_BYTES
    fault_beats = frozenset()

    def faulty(self, address):
        a = address % self.size
        return a >= self.fault_from or a // BEAT in self.fault_beats

    async def _read(self, address, length):
        if self.faulty(address):
            raise ValueError(f"injected fault at {address:#x}")
        return await super()._read(address, length)


class TB:
    def __init__(self, dut, seed, *, p_stall_ar=0.0, p_stall_r=0.0, p_stall_out=0.0):
        self.dut = dut
        self.seed = seed
        self.rng = random.Random(seed)
        self.p_stall_out = p_stall_out
        self.ram = FaultyRam(AxiReadBus.from_prefix(dut, "axi"), dut.clk, dut.rst, size=MEM_BYTES)
        # Let the RAM accept as many bursts as the engine wants in flight.
        self.ram.ar_channel.queue_occupancy_limit = 64
        if p_stall_ar:
            self.ram.ar_channel.set_pause_generator(pause(self.rng, p_stall_ar))
        if p_stall_r:
            self.ram.r_channel.set_pause_generator(pause(self.rng, p_stall_r))
        self.cycle = 0            # clock cycles since the monitor started
        self.ars = []             # AR handshakes: (araddr, arlen)
        self.ar_cycles = []       # the cycle of each
        self.ar_stalls = 0        # cycles with arvalid and not arready
        self.accepts = []         # the cycle each command was accepted (send)
        self.r_beats = 0          # R handshakes so far
        self.parked = []          # R beats (by index) that went into the skid register
        self.out = []             # beats delivered: (data, last, err)
        self.max_inflight = 0
        self.inflight_violation = None
        # Expected AR bursts and beats (expect()), compared as they come: the first difference
        # is kept in ``bad`` and ends the test at the next send or drain step, so that a
        # mutant that goes wrong early fails in seconds (check() still compares everything).
        self.exp_ars = self.exp_out = None
        self.bad = None

    def expect(self, mem, base, cmds):
        self.exp_ars = [(base + a * BEAT, n - 1) for addr, beats in cmds
                        for a, n in split_bursts(addr, beats, BLOCK)]
        self.exp_out = expected_out(mem, base, cmds, self.ram)

    def compare(self, what, got, exp):
        """Note the first difference of the newest of ``got`` from ``exp``."""
        i = len(got) - 1
        if exp is not None and self.bad is None and (i >= len(exp) or got[i] != exp[i]):
            self.bad = (f"seed {self.seed}: {what} {i} differs from the reference: "
                        f"{'one too many' if i >= len(exp) else 'expected ' + str(exp[i])[:120]}")

    def fail_fast(self):
        if self.bad is not None:
            raise AssertionError(self.bad)

    async def reset(self):
        dut = self.dut
        cocotb.start_soon(Clock(dut.clk, 5, unit="ns").start())
        dut.rst.value = 1
        dut.cmd_valid.value = 0
        dut.data_ready.value = 0
        dut.base.value = 0
        for _ in range(4):
            await RisingEdge(dut.clk)
        dut.rst.value = 0
        await RisingEdge(dut.clk)
        cocotb.start_soon(self.monitor())
        cocotb.start_soon(self.sink())

    async def monitor(self):
        """Record AR bursts and their cycles; track bursts in flight against the limit; note
        the R beats that the output's skid buffer parks in its skid register (an R beat
        taken while the output holds a beat its consumer does not take: hw/stream.py's
        SkidBuffer, whose input ready is "skid register empty").

        Every loop samples in ReadOnly, the settled values that the coming edge will take,
        then waits for that edge: nothing is written in the ReadOnly phase.
        """
        dut = self.dut
        inflight = 0
        while True:
            await ReadOnly()
            if dut.axi_arvalid.value:
                if dut.axi_arready.value:
                    self.ars.append((int(dut.axi_araddr.value), int(dut.axi_arlen.value)))
                    self.compare("AR burst", self.ars, self.exp_ars)
                    self.ar_cycles.append(self.cycle)
                    inflight += 1
                else:
                    self.ar_stalls += 1
            if dut.axi_rvalid.value and dut.axi_rready.value:
                if dut.data_valid.value and not dut.data_ready.value:
                    self.parked.append(self.r_beats)
                self.r_beats += 1
                if dut.axi_rlast.value:
                    inflight -= 1
            self.max_inflight = max(self.max_inflight, inflight)
            if inflight > P["max_outstanding"] and self.inflight_violation is None:
                self.inflight_violation = inflight
            await RisingEdge(dut.clk)
            self.cycle += 1

    async def sink(self):
        dut = self.dut
        mask = (1 << (8 * BEAT)) - 1
        while True:
            ready = self.rng.random() >= self.p_stall_out
            dut.data_ready.value = int(ready)
            await ReadOnly()
            if ready and dut.data_valid.value:
                payload = int(dut.data_payload.value)
                self.out.append((payload & mask, (payload >> (8 * BEAT)) & 1,
                                 (payload >> (8 * BEAT + 1)) & 1))
                self.compare("beat", self.out, self.exp_out)
            await RisingEdge(dut.clk)

    async def send(self, addr, beats, timeout=20000):
        """Offer a command until the engine takes it; fail after ``timeout`` cycles (a mutant
        that never takes one then fails in seconds, not at the mutation run's time limit)."""
        dut = self.dut
        dut.cmd_payload.value = addr | (beats << P["beat_addr_bits"])
        dut.cmd_valid.value = 1
        for _ in range(timeout):
            self.fail_fast()
            await ReadOnly()
            accepted = bool(dut.cmd_ready.value)
            if accepted:
                self.accepts.append(self.cycle)
            await RisingEdge(dut.clk)
            if accepted:
                break
        else:
            raise AssertionError(f"command ({addr}, {beats}) not taken in {timeout} cycles")
        dut.cmd_valid.value = 0

    async def drain(self, nbeats):
        """Wait until ``nbeats`` beats are out, then 50 cycles more. Give up when no beat has
        come out for 2000 cycles, or after 40 cycles a missing beat (the slowest consumer
        takes a beat in 10 cycles on average)."""
        last_n, idle = len(self.out), 0
        for _ in range(1000 + 40 * max(0, nbeats - len(self.out))):
            self.fail_fast()
            if len(self.out) >= nbeats or idle > 2000:
                break
            await RisingEdge(self.dut.clk)
            idle = 0 if len(self.out) != last_n else idle + 1
            last_n = len(self.out)
        for _ in range(50):
            await RisingEdge(self.dut.clk)
        self.fail_fast()


def random_commands(rng, n, max_beat):
    cmds = []
    for _ in range(n):
        kind = rng.random()
        if kind < 0.3:
            beats = rng.randint(1, 4)
        elif kind < 0.8:
            beats = rng.randint(1, 3 * BLOCK)
        else:
            beats = rng.randint(1, 600)
        if rng.random() < 0.3:   # start just before a block or 4 KiB boundary
            page = rng.randrange(max_beat // BLOCK - 20)
            addr = page * BLOCK + BLOCK - rng.randint(1, 3)
        else:
            addr = rng.randrange(max_beat - beats)
        cmds.append((addr, beats))
    return cmds


def expected_out(mem, base, cmds, ram):
    """Every beat the engine must deliver, (data, last, err): the RAM's bytes at the base's
    low bits (sim.ref.dma.expected_beats), and zero data with err for a beat the RAM fails."""
    low = base % MEM_BYTES
    exp_data, exp_last = expected_beats(mem, low, BEAT, cmds)
    addrs = [low + (addr + i) * BEAT for addr, beats in cmds for i in range(beats)]
    out = []
    for ref, last, a in zip(exp_data, exp_last, addrs, strict=True):
        bad = ram.faulty(a)
        out.append((0 if bad else int.from_bytes(ref.tobytes(), "little"), int(last), int(bad)))
    return out


def check(tb, seed, cmds, base, mem):
    """The AR bursts (every ARADDR, high bits included), every beat delivered, the limit on
    bursts in flight, the error flags, and the engine idle at the end."""
    dut = tb.dut
    exp_ars = [(base + a * BEAT, n - 1) for addr, beats in cmds for a, n in split_bursts(addr, beats, BLOCK)]
    first_diff = next((i for i, (x, y) in enumerate(zip(tb.ars, exp_ars, strict=False)) if x != y), None)
    assert tb.ars == exp_ars, (f"seed {seed}: AR bursts differ from the reference ({len(tb.ars)} "
                               f"vs {len(exp_ars)} bursts, first difference at {first_diff})")
    exp = expected_out(mem, base, cmds, tb.ram)
    assert len(tb.out) == len(exp), f"seed {seed}: {len(tb.out)} beats out, expected {len(exp)}"
    for i, ((d, last, err), (ref, ref_last, ref_err)) in enumerate(zip(tb.out, exp, strict=True)):
        assert d == ref, f"seed {seed}: beat {i} data differs (err {ref_err})"
        assert last == ref_last, f"seed {seed}: beat {i} last={last}, expected {ref_last}"
        assert err == ref_err, f"seed {seed}: beat {i} err={err}, expected {ref_err}"
    assert tb.inflight_violation is None, f"seed {seed}: {tb.inflight_violation} bursts in flight"
    want = int(any(e for _, _, e in exp))
    assert int(dut.error.value) == want, f"seed {seed}: error flags {int(dut.error.value)}, expected {want}"
    # every beat delivered and 50 cycles since: nothing in flight, so the engine is idle
    # (a mutant holding busy high survived without this: sim/mutate.py)
    assert int(dut.busy.value) == 0, f"seed {seed}: busy after every beat was delivered"
    return exp


async def run_random(dut, seed, n_cmds, *, high, p_fault=0.0, **stalls):
    """``n_cmds`` random commands from a base with the high bits ``high``; a fraction
    ``p_fault`` of the RAM's beats fail (SLVERR)."""
    tb = TB(dut, seed, **stalls)
    mem = np.random.default_rng(seed).integers(0, 256, MEM_BYTES, dtype=np.uint8)
    tb.ram.write(0, mem.tobytes())
    if p_fault:
        bad = np.random.default_rng(seed + 1).random(MEM_BYTES // BEAT) < p_fault
        tb.ram.fault_beats = frozenset(np.flatnonzero(bad).tolist())
    low = BEAT * 64 * tb.rng.randrange(4)
    base = high | low
    print(f"tb_hbm_reader: seed={seed} stalls={stalls} base={base:#x} p_fault={p_fault}")
    await tb.reset()
    dut.base.value = base
    max_beat = (MEM_BYTES - low) // BEAT
    cmds = random_commands(tb.rng, n_cmds, max_beat)
    tb.expect(mem, base, cmds)
    for addr, beats in cmds:
        await tb.send(addr, beats)
    await tb.drain(sum(beats for _, beats in cmds))
    tb.exp = check(tb, seed, cmds, base, mem)
    return tb


@cocotb.test()
async def random_no_stalls(dut):
    tb = await run_random(dut, SEED, 60, high=HIGH)
    # With a RAM that never stalls, the engine must run ahead of the data.
    assert tb.max_inflight >= 2, f"never more than {tb.max_inflight} burst in flight"


@cocotb.test()
async def random_backpressure(dut):
    await run_random(dut, SEED + 1, 120, high=HIGH ^ HIGH_MASK, p_stall_ar=0.3, p_stall_r=0.3,
                     p_stall_out=0.4)


@cocotb.test()
async def outstanding_limit(dut):
    """A consumer that stalls hard lets the AR side run to the limit, and no further."""
    tb = await run_random(dut, SEED + 2, 40, high=HIGH, p_stall_out=0.9)
    assert tb.max_inflight == P["max_outstanding"], \
        f"max in flight {tb.max_inflight}, expected the limit {P['max_outstanding']}"


@cocotb.test()
async def zero_length_command(dut):
    tb = TB(dut, SEED)
    await tb.reset()
    await tb.send(5, 0)
    for _ in range(20):
        await RisingEdge(dut.clk)
    assert tb.ars == [] and tb.out == [], "a 0-beat command must read nothing"
    assert int(dut.error.value) == 0b10, f"error flags {int(dut.error.value):#b}, expected 0b10"
    # The engine still works after it.
    tb.ram.write(0, bytes(range(256)) * (4 * BEAT // 256 + 1))
    await tb.send(0, 2)
    await tb.drain(2)
    assert len(tb.out) == 2 and tb.out[1][1] == 1 and tb.out[1][2] == 0


@cocotb.test()
async def slave_error(dut):
    """A beat that comes back SLVERR sets error bit 0; the burst still completes in order, the
    failed beats flagged ``err`` with the RAM's zero data, the others with theirs."""
    tb = TB(dut, SEED)
    mem = np.random.default_rng(SEED).integers(0, 256, 128 * BEAT, dtype=np.uint8)
    tb.ram.write(0, mem.tobytes())
    tb.ram.fault_from = 100 * BEAT
    await tb.reset()
    await tb.send(90, 8)
    await tb.drain(8)
    assert int(dut.error.value) == 0, "error raised before any faulty beat"
    await tb.send(98, 4)
    await tb.drain(12)
    assert len(tb.out) == 12, f"{len(tb.out)} beats, expected 12 (errors still return data)"
    exp = expected_out(mem, 0, [(90, 8), (98, 4)], tb.ram)
    assert [err for _, _, err in exp] == [0] * 10 + [1] * 2
    for i, ((d, last, err), (ref, ref_last, ref_err)) in enumerate(zip(tb.out, exp, strict=True)):
        assert (d == ref, last, err) == (True, ref_last, ref_err), \
            (f"beat {i}: data {'ok' if d == ref else 'differs'}, last {last}, err {err}; "
             f"expected last {ref_last}, err {ref_err}")
    assert int(dut.error.value) == 0b01, f"error flags {int(dut.error.value):#b}, expected 0b01"


@cocotb.test()
async def random_slave_errors(dut):
    """Random commands over a RAM whose beats fail at random (SLVERR), the output stalled
    often: error beats go through the skid register as well as the direct path, and every
    beat's data, last and err are checked."""
    tb = await run_random(dut, SEED + 3, 50, high=HIGH ^ HIGH_MASK, p_fault=0.2,
                          p_stall_r=0.2, p_stall_out=0.5)
    errs_parked = sum(tb.exp[i][2] for i in tb.parked)
    errs = sum(e for _, _, e in tb.exp)
    print(f"tb_hbm_reader: {errs} error beats of {len(tb.exp)}, {len(tb.parked)} beats through the "
          f"skid register, {errs_parked} of them error beats")
    assert errs_parked > 0 and errs_parked < errs, "no error beat through both paths"


@cocotb.test()
async def back_to_back(dut):
    """Full command rate: with a RAM and a consumer that never stall, a command is accepted
    in the cycle the one before it loads its last burst, so command i + 1 is accepted
    bursts(i) cycles after command i, and the bursts go out one a cycle (an engine that takes
    a command only when idle loses a cycle a command: sim/mutate.py's hbm_reader mutant 43).
    Each round's commands fit the limit on bursts in flight, which then never holds the
    issue back."""
    seed = SEED + 4
    tb = TB(dut, seed)
    mem = np.random.default_rng(seed).integers(0, 256, MEM_BYTES, dtype=np.uint8)
    tb.ram.write(0, mem.tobytes())
    base = HIGH | BEAT * BLOCK * tb.rng.randrange(16)
    print(f"tb_hbm_reader: seed={seed} base={base:#x}")
    await tb.reset()
    dut.base.value = base
    max_beat = (MEM_BYTES - base % MEM_BYTES) // BEAT
    rounds = []
    for _ in range(8):
        round_cmds, bursts = [], 0
        while True:
            beats = tb.rng.randint(1, 4) if tb.rng.random() < 0.5 else tb.rng.randint(1, BLOCK)
            if tb.rng.random() < 0.3:   # across a block boundary: two bursts
                addr = BLOCK * tb.rng.randrange(1, max_beat // BLOCK - 1) - tb.rng.randint(1, beats)
            else:
                addr = tb.rng.randrange(max_beat - beats)
            n = len(split_bursts(addr, beats, BLOCK))
            if bursts + n > P["max_outstanding"]:
                break
            round_cmds.append((addr, beats))
            bursts += n
        rounds.append(round_cmds)
    cmds = [c for r in rounds for c in r]
    tb.expect(mem, base, cmds)
    delivered = 0
    for rnd, round_cmds in enumerate(rounds):
        first_cmd, first_ar = len(tb.accepts), len(tb.ar_cycles)
        for addr, beats in round_cmds:
            await tb.send(addr, beats)
        delivered += sum(beats for _, beats in round_cmds)
        await tb.drain(delivered)
        assert tb.ar_stalls == 0, f"seed {seed}: the RAM stalled AR (the test assumes it never does)"
        acc, arc = tb.accepts[first_cmd:], tb.ar_cycles[first_ar:]
        gaps = [b - a for a, b in zip(acc, acc[1:], strict=False)]
        want = [len(split_bursts(a, n, BLOCK)) for a, n in round_cmds[:-1]]
        assert gaps == want, (f"seed {seed}, round {rnd}: commands accepted {gaps} cycles apart, "
                              f"expected {want} (the bursts of each command before)")
        bursts = sum(len(split_bursts(a, n, BLOCK)) for a, n in round_cmds)
        assert arc == list(range(acc[0] + 2, acc[0] + 2 + bursts)), \
            f"seed {seed}, round {rnd}: AR handshakes at {arc}, command accepted at {acc[0]}"
    check(tb, seed, cmds, base, mem)
