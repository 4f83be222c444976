"""cocotb regression of the AXI multiplexers (hw/dma/mux.py) through gen.tops.AxiMux: ``M``
cocotbext-axi managers share one cocotbext-axi AXI RAM, reading and writing at once.

Parameters arrive in the environment: GPTFPGA_PARAMS (JSON: managers, beat_bytes, depth: the
order FIFOs' entries) and GPTFPGA_SEED. Every test prints its seed.

Checks, against a Python model of the memory (bytes) and of the multiplexers (who owns which
burst):

- every read returns the model's bytes, every write lands there, nothing else changes, and all
  responses are OKAY (or SLVERR exactly where the RAM fails);
- on the subordinate side, each AR/AW is the granted manager's, unchanged; the R beats and B
  responses go back to the manager of the oldest open burst, in order; W beats come only from
  the manager whose AW has gone, WLAST on the (len + 1)-th beat;
- AXI's stability rule on every channel the multiplexers drive: a VALID held high with READY
  low stays high with its payload unchanged (AR, AW, W towards the RAM; R, B towards the
  managers);
- round robin: a manager passed over while requesting is served before the one that passed it
  is served again;
- bursts in flight never exceed the order FIFO's depth (and reach it when R is stalled hard).
"""

import json
import logging
import os
import random

import cocotb
from cocotb.clock import Clock
from cocotb.triggers import ReadOnly, RisingEdge
from cocotbext.axi import AxiBus, AxiMaster, AxiRam
from cocotbext.axi.constants import AxiResp

P = json.loads(os.environ["GPTFPGA_PARAMS"])
SEED = int(os.environ.get("GPTFPGA_SEED", "1"))
M = P["managers"]
BEAT = P["beat_bytes"]
DEPTH = P["depth"]
MEM = 1 << 20
PAGE = 4096
READ_AREA = MEM // 2                       # reads below, each manager's writes in its own slice
W_SLICE = (MEM - READ_AREA) // M

AR, R, AW, W, B = "ar", "r", "aw", "w", "b"
PAYLOAD = {AR: ("araddr", "arlen", "arsize", "arburst", "arid"),
           AW: ("awaddr", "awlen", "awsize", "awburst", "awid"),
           W: ("wdata", "wstrb", "wlast"),
           R: ("rdata", "rresp", "rlast", "rid"),
           B: ("bresp", "bid")}


def pause(rng, p):
    while True:
        yield rng.random() < p


class FaultyRam(AxiRam):
    """AXI RAM that answers SLVERR for reads and writes in [fault_lo, fault_hi)."""

    fault_lo = fault_hi = 0

    def _faulty(self, address, length):
        return address < self.fault_hi and address + length > self.fault_lo

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        ram = self
        read, write = self.read_if._read, self.write_if._write

        async def faulty_read(address, length):
            if ram._faulty(address, length):
                raise ValueError(f"injected read fault at {address:#x}")
            return await read(address, length)

        async def faulty_write(address, data):
            if ram._faulty(address, len(data)):
                raise ValueError(f"injected write fault at {address:#x}")
            return await write(address, data)

        self.read_if._read, self.write_if._write = faulty_read, faulty_write


class Checker:
    """The multiplexers' protocol, checked every cycle (module docstring)."""

    def __init__(self, dut):
        self.dut = dut
        self.s = {ch: self._chan("s", ch) for ch in PAYLOAD}
        self.m = [{ch: self._chan(f"m{i}", ch) for ch in PAYLOAD} for i in range(M)]
        self.errors = []
        self.ar_owner, self.aw_owner = [], []       # managers of open bursts, oldest first
        self.w_owner = []                           # [manager, beats left] of AWs awaiting W
        self.b_owner = []
        self.max_rd_open = self.max_wr_open = 0
        self.grants = {AR: [], AW: []}
        self.grant_cycles = {AR: [], AW: []}
        self.passed = {AR: [set() for _ in range(M)], AW: [set() for _ in range(M)]}
        self.held = {}                              # (side, channel) -> payload held last cycle
        self.cycles = 0

    def _chan(self, prefix, ch):
        d = self.dut
        valid, ready = (getattr(d, f"{prefix}_{ch}valid"), getattr(d, f"{prefix}_{ch}ready"))
        fields = [getattr(d, f"{prefix}_{f}") for f in PAYLOAD[ch]]
        return valid, ready, fields

    @staticmethod
    def _val(sig):
        return int(sig.value)

    def fail(self, msg):
        if len(self.errors) < 20:
            self.errors.append(f"cycle {self.cycles}: {msg}")

    def _stable(self, key, chan):
        valid, ready, fields = chan
        v, r = self._val(valid), self._val(ready)
        payload = tuple(self._val(f) for f in fields)
        if key in self.held:
            if not v:
                self.fail(f"{key}: VALID dropped before READY")
            elif payload != self.held[key]:
                self.fail(f"{key}: payload changed while VALID waited for READY")
        if v and not r:
            self.held[key] = payload
        else:
            self.held.pop(key, None)
        return v and r, payload

    def _who(self, ch):
        """The managers whose channel ``ch`` hands over this cycle."""
        return [i for i in range(M) if self._val(self.m[i][ch][0]) and self._val(self.m[i][ch][1])]

    def _grant(self, ch, g):
        requesting = [j for j in range(M) if j != g and self._val(self.m[j][ch][0])]
        for j in range(M):
            if g in self.passed[ch][j]:
                self.fail(f"{ch}: manager {g} served again while manager {j}, passed over by it, "
                          "still waits")
        self.passed[ch][g] = set()
        for j in requesting:
            self.passed[ch][j].add(g)
        self.grants[ch].append(g)
        self.grant_cycles[ch].append(self.cycles)

    # W bursts on the subordinate side, in AW order: {mgr, need (beats; None until the AW),
    # seen, done}. AXI lets a burst's W beats come before its AW; the multiplexer lets only the
    # manager that won the arbitration send them.
    def _w_address(self, i, beats):
        early = next((b for b in self.w_owner if b["need"] is None), None)
        if early is None:
            self.w_owner.append({"mgr": i, "need": beats, "seen": 0, "done": False})
        else:
            if early["mgr"] != i:
                self.fail(f"AW of manager {i} after W beats of manager {early['mgr']}")
            early["need"] = beats
            if early["seen"] > beats or (early["done"] and early["seen"] != beats):
                self.fail(f"{early['seen']} W beats (WLAST: {early['done']}) before an AW of {beats}")
        self._w_retire()

    def _w_beat(self, i, last):
        cur = next((b for b in self.w_owner if not b["done"]), None)
        if cur is None:
            cur = {"mgr": i, "need": None, "seen": 0, "done": False}
            self.w_owner.append(cur)
        if cur["mgr"] != i:
            self.fail(f"W beat of manager {i} inside manager {cur['mgr']}'s burst")
        cur["seen"] += 1
        if cur["need"] is not None and last != (cur["seen"] == cur["need"]):
            self.fail(f"WLAST={last} on beat {cur['seen']} of a burst of {cur['need']}")
        cur["done"] = bool(last) or cur["seen"] == cur["need"]
        self._w_retire()

    def _w_retire(self):
        while self.w_owner and self.w_owner[0]["done"] and self.w_owner[0]["need"] is not None:
            self.w_owner.pop(0)

    async def run(self):
        dut = self.dut
        while True:
            await ReadOnly()
            self.cycles += 1
            go = {}
            for ch in (AR, AW, W):
                go[ch], pay = self._stable(("s", ch), self.s[ch])
                mine = self._who(ch)
                if go[ch]:
                    if len(mine) != 1:
                        self.fail(f"s {ch} handshake with managers {mine} handing over")
                        continue
                    i = mine[0]
                    mp = tuple(self._val(f) for f in self.m[i][ch][2])
                    if mp != pay:
                        self.fail(f"s {ch} payload differs from manager {i}'s")
                    if ch == AR:
                        self._grant(AR, i)
                        self.ar_owner.append(i)
                    elif ch == AW:
                        self._grant(AW, i)
                        self.b_owner.append(i)
                        self._w_address(i, int(dut.s_awlen.value) + 1)
                    else:
                        self._w_beat(i, int(dut.s_wlast.value))
                elif mine:
                    self.fail(f"manager(s) {mine} {ch} handshake without the subordinate's")
            for ch, owners in ((R, self.ar_owner), (B, self.b_owner)):
                s_valid, s_ready, s_fields = self.s[ch]
                s_go = self._val(s_valid) and self._val(s_ready)
                s_pay = tuple(self._val(f) for f in s_fields)
                for i in range(M):
                    m_go, m_pay = self._stable((f"m{i}", ch), self.m[i][ch])
                    if self._val(self.m[i][ch][0]):
                        if not owners or owners[0] != i:
                            self.fail(f"{ch} VALID to manager {i}; the oldest burst is "
                                      f"{owners[0] if owners else 'none'}'s")
                        elif m_pay != s_pay:
                            self.fail(f"{ch} payload to manager {i} differs from the subordinate's")
                    if m_go and not s_go:
                        self.fail(f"{ch} handshake of manager {i} without the subordinate's")
                if s_go:
                    if not owners:
                        self.fail(f"{ch} from the subordinate with no burst open")
                    elif not self._who(ch):
                        self.fail(f"{ch} taken from the subordinate, given to no manager")
                    elif ch == B or int(dut.s_rlast.value):
                        owners.pop(0)
            self.max_rd_open = max(self.max_rd_open, len(self.ar_owner))
            self.max_wr_open = max(self.max_wr_open, len(self.b_owner))
            if len(self.ar_owner) > DEPTH or len(self.b_owner) > DEPTH:
                self.fail(f"{len(self.ar_owner)} reads / {len(self.b_owner)} writes open, "
                          f"beyond the order FIFO's {DEPTH}")
            await RisingEdge(dut.clk)


class TB:
    def __init__(self, dut, seed, *, stall=0.0, r_stall=None, b_stall=None):
        self.dut, self.seed = dut, seed
        self.rng = random.Random(seed)
        logging.getLogger(f"cocotb.{dut._name}").setLevel(logging.WARNING)  # the AXI models' chatter
        self.ram = FaultyRam(AxiBus.from_prefix(dut, "s"), dut.clk, dut.rst, size=MEM)
        # let the RAM take as many bursts as the multiplexers send
        self.ram.read_if.ar_channel.queue_occupancy_limit = 4 * DEPTH
        self.ram.write_if.aw_channel.queue_occupancy_limit = 4 * DEPTH
        self.ram.write_if.b_channel.queue_occupancy_limit = 4 * DEPTH
        self.mgr = [AxiMaster(AxiBus.from_prefix(dut, f"m{i}"), dut.clk, dut.rst) for i in range(M)]
        for mg in self.mgr:
            mg.read_if.ar_channel.queue_occupancy_limit = 4 * DEPTH
            mg.write_if.aw_channel.queue_occupancy_limit = 4 * DEPTH
            mg.write_if.w_channel.queue_occupancy_limit = 64
        chans = [self.ram.read_if.ar_channel, self.ram.read_if.r_channel, self.ram.write_if.aw_channel,
                 self.ram.write_if.w_channel, self.ram.write_if.b_channel]
        for mg in self.mgr:
            chans += [mg.read_if.ar_channel, mg.read_if.r_channel, mg.write_if.aw_channel,
                      mg.write_if.w_channel, mg.write_if.b_channel]
        self.stall = stall
        for k, ch in enumerate(chans):
            p = stall
            if r_stall is not None and ch is self.ram.read_if.r_channel:
                p = r_stall
            if b_stall is not None and ch is self.ram.write_if.b_channel:
                p = b_stall
            if p:
                ch.set_pause_generator(pause(random.Random(seed * 1000 + k), p))
        self.model = bytearray(random.Random(seed + 1).randbytes(MEM))
        self.ram.write(0, bytes(self.model))
        self.check = Checker(dut)

    async def reset(self):
        dut = self.dut
        cocotb.start_soon(Clock(dut.clk, 5, unit="ns").start())
        dut.rst.value = 1
        for _ in range(4):
            await RisingEdge(dut.clk)
        dut.rst.value = 0
        await RisingEdge(dut.clk)
        cocotb.start_soon(self.check.run())

    def ops(self, n, *, max_len=3 * PAGE, reads=True, writes=True):
        """Per manager, ``n`` random reads and writes: byte addresses and lengths of every size
        (one beat, a few, whole pages: bursts of the longest length that fits a page), the
        writes in the manager's own slice, never overlapping one another."""
        out = []
        for i in range(M):
            lst, wpos = [], READ_AREA + i * W_SLICE
            for _ in range(n):
                kind = self.rng.random()
                if kind < 0.3:
                    length = self.rng.randint(1, BEAT)
                elif kind < 0.8:
                    length = self.rng.randint(1, 8 * BEAT)
                else:
                    length = self.rng.randint(PAGE // 2, max_len)
                page_aligned = self.rng.random() < 0.3
                if reads and (not writes or self.rng.random() < 0.5):
                    addr = self.rng.randrange(0, READ_AREA - length)
                    if page_aligned:
                        addr -= addr % PAGE
                    lst.append(("r", addr, length))
                else:
                    wpos += self.rng.randrange(0, 3 * BEAT)
                    if page_aligned:
                        wpos += -wpos % PAGE
                    if wpos + length > READ_AREA + (i + 1) * W_SLICE:
                        continue
                    lst.append(("w", wpos, self.rng.randbytes(length)))
                    wpos += length
            out.append(lst)
        return out

    async def run_ops(self, ops, *, timeout=100_000):
        """Issue every manager's operations at once (each as soon as its manager takes it) and
        wait for all; returns [(manager, op, response)]."""
        results = []

        async def one(i, op):
            mg = self.mgr[i]
            resp = await (mg.read(op[1], op[2]) if op[0] == "r" else mg.write(op[1], op[2]))
            results.append((i, op, resp))

        n = 0
        for i, lst in enumerate(ops):
            for op in lst:
                if op[0] == "w":
                    self.model[op[1]:op[1] + len(op[2])] = op[2]
                cocotb.start_soon(one(i, op))
                n += 1
        for _ in range(timeout):
            if len(results) == n:
                break
            await RisingEdge(self.dut.clk)
        else:
            raise AssertionError(f"seed {self.seed}: {n - len(results)} of {n} operations never "
                                 f"completed in {timeout} cycles (a hang)")
        for _ in range(10):
            await RisingEdge(self.dut.clk)
        return results

    def verify(self, results, *, faulty=()):
        seed = self.seed
        assert not self.check.errors, f"seed {seed}: " + "\n".join(self.check.errors)
        for i, op, resp in results:
            bad = any(lo < op[1] + (op[2] if op[0] == "r" else len(op[2])) and op[1] < hi
                      for lo, hi in faulty)
            want = AxiResp.SLVERR if bad else AxiResp.OKAY
            assert resp.resp == want, (f"seed {seed}: manager {i} {op[0]} at {op[1]:#x}: "
                                       f"response {resp.resp!r}, expected {want!r}")
            if op[0] == "r" and not bad:
                want_data = bytes(self.model[op[1]:op[1] + op[2]])
                assert resp.data == want_data, (f"seed {seed}: manager {i} read at {op[1]:#x} "
                                                f"+{op[2]}: data differs from the model")
        got = self.ram.read(0, MEM)
        if got != bytes(self.model):
            diff = next(k for k in range(MEM) if got[k] != self.model[k])
            raise AssertionError(f"seed {seed}: RAM differs from the model, first at {diff:#x}")
        assert not self.check.ar_owner and not self.check.b_owner and not self.check.w_owner, \
            f"seed {seed}: bursts left open at the end"
        c = self.check
        print(f"tb_axi_mux: {c.cycles} cycles, {len(results)} operations, AR grants "
              f"{len(c.grants[AR])}, AW grants {len(c.grants[AW])}, max open reads "
              f"{c.max_rd_open}, writes {c.max_wr_open}")


async def traffic(dut, seed, n, **kw):
    tb = TB(dut, seed, **kw)
    print(f"tb_axi_mux: seed={seed} managers={M} ops/manager={n} stalls={kw}")
    await tb.reset()
    res = await tb.run_ops(tb.ops(n))
    tb.verify(res)
    return tb


@cocotb.test(timeout_time=2, timeout_unit="ms")
async def random_no_stalls(dut):
    """Every manager reads and writes at once, nothing stalled: both channels interleave."""
    tb = await traffic(dut, SEED, int(os.environ.get("GPTFPGA_N", "24")))
    for ch in (AR, AW):
        assert len(set(tb.check.grants[ch])) == M, f"{ch}: not every manager was served"


@cocotb.test(timeout_time=2, timeout_unit="ms")
async def random_backpressure(dut):
    """Idle and backpressure on every channel of every manager and of the RAM."""
    await traffic(dut, SEED + 1, int(os.environ.get("GPTFPGA_N", "24")), stall=0.3)


@cocotb.test(timeout_time=2, timeout_unit="ms")
async def order_fifo_full(dut):
    """One-beat reads and writes from every manager against R and B channels stalled 90% of
    cycles: the bursts in flight reach the order FIFOs' depth and stop there; data still
    right."""
    tb = TB(dut, SEED + 2, r_stall=0.9, b_stall=0.9)
    print(f"tb_axi_mux: seed={SEED + 2} order FIFO full")
    await tb.reset()
    ops = [[("r", tb.rng.randrange(0, READ_AREA - BEAT) & ~(BEAT - 1), BEAT)
            for _ in range(DEPTH + 8)] +
           [("w", READ_AREA + i * W_SLICE + k * BEAT, tb.rng.randbytes(BEAT)) for k in range(DEPTH + 8)]
           for i in range(M)]
    res = await tb.run_ops(ops)
    tb.verify(res)
    c = tb.check
    assert c.max_rd_open == c.max_wr_open == DEPTH, \
        f"max open reads {c.max_rd_open}, writes {c.max_wr_open}: expected the order FIFOs' {DEPTH}"


@cocotb.test(timeout_time=2, timeout_unit="ms")
async def back_to_back_single_beats(dut):
    """One-beat reads and writes queued on every manager, nothing stalled: the RAM sees a
    new AR on consecutive cycles while requests wait, alternating between managers."""
    tb = TB(dut, SEED + 3)
    print(f"tb_axi_mux: seed={SEED + 3} back to back")
    await tb.reset()
    n = 16
    ops = [[("r", (i * n + k) * BEAT, BEAT) for k in range(n)] +
           [("w", READ_AREA + i * W_SLICE + k * BEAT, tb.rng.randbytes(BEAT)) for k in range(n)]
           for i in range(M)]
    res = await tb.run_ops(ops)
    tb.verify(res)
    g, at = tb.check.grants[AR], tb.check.grant_cycles[AR]
    assert len(g) == M * n
    # while every manager has reads queued, grants rotate strictly, one a cycle
    head = M * (n - 2)
    assert all(g[k + 1] == (g[k] + 1) % M for k in range(head - 1)), f"AR grants: {g}"
    gaps = [at[k + 1] - at[k] for k in range(head - 1)]
    print(f"tb_axi_mux: cycles between AR grants {gaps}")
    assert max(gaps) == 1, f"AR grants not back to back: {gaps}"


@cocotb.test(timeout_time=2, timeout_unit="ms")
async def max_bursts(dut):
    """Whole-page reads and writes (the longest bursts that keep to a 4 KiB page: 4096 /
    beat_bytes beats) from every manager, stalled: every burst's beats go to its owner."""
    tb = TB(dut, SEED + 4, stall=0.2)
    print(f"tb_axi_mux: seed={SEED + 4} max bursts")
    await tb.reset()
    ops = [[("r", tb.rng.randrange(READ_AREA // PAGE) * PAGE, PAGE) for _ in range(3)] +
           [("w", READ_AREA + i * W_SLICE + k * PAGE, tb.rng.randbytes(PAGE)) for k in range(3)]
           for i in range(M)]
    res = await tb.run_ops(ops)
    tb.verify(res)


@cocotb.test(timeout_time=2, timeout_unit="ms")
async def slave_errors(dut):
    """SLVERR on reads and writes of one page goes back to the manager that asked, and only to
    it; the other managers' traffic meanwhile is unaffected."""
    tb = TB(dut, SEED + 5, stall=0.2)
    print(f"tb_axi_mux: seed={SEED + 5} slave errors")
    lo_r, lo_w = 5 * PAGE, READ_AREA + 2 * PAGE
    faulty = [(lo_r, lo_r + PAGE), (lo_w, lo_w + PAGE)]
    tb.ram.fault_lo, tb.ram.fault_hi = lo_r, lo_r + PAGE
    await tb.reset()
    ops = tb.ops(8)
    ops[0] += [("r", lo_r + 64, 2 * BEAT)]
    res = await tb.run_ops(ops)
    tb.verify(res, faulty=faulty[:1])
    tb.ram.fault_lo, tb.ram.fault_hi = lo_w, lo_w + PAGE
    ops = [[] for _ in range(M)]
    ops[M - 1] = [("w", lo_w + 32, tb.rng.randbytes(3 * BEAT))]
    ops[0] = [("w", READ_AREA + k * BEAT, tb.rng.randbytes(BEAT)) for k in range(4)]
    # the faulty write does not land: the model keeps its bytes
    keep = bytes(tb.model[lo_w + 32:lo_w + 32 + 3 * BEAT])
    res = await tb.run_ops(ops)
    tb.model[lo_w + 32:lo_w + 32 + 3 * BEAT] = keep
    tb.verify(res, faulty=faulty[1:])
