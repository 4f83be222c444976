"""cocotb regression of the collective unit's HBM path (hw/dma/beats.py HbmBeats): every channel
a cocotbext-axi AXI RAM (read and write side on one memory), runs of link beats read and beats
written at once.

Parameters arrive in the environment: GPTFPGA_PARAMS (JSON: channels, hbm_bits, data_bits,
run, page_beats) and GPTFPGA_SEED. Every test prints its seed.

The Python model of the stripe layout (the module docstring of hw/dma/beats.py): link beat
``b`` is stripe row ``b // per`` of group ``b % per``, the k = data_bits / hbm_bits channels
``[h k, h k + k)``, channel ``h k + j`` holding bits ``[j hbm_bits, (j + 1) hbm_bits)`` at
``ptr_c + row * hbm_bits / 8``. Checks:

- each read run's beats come back in order, bit-exact against the model's memory;
- after the last write, ``w_idle`` rises only once every burst is answered, and every channel's
  memory equals the model (written beats there, nothing else touched);
- buffers (``ptr_c``) page aligned or only beat aligned, at random per channel;
- on every channel: at most ``max_outstanding`` bursts in flight each way (when given), bursts
  inside the channel's buffer and inside one 4 KiB page, WLAST on
  the (len + 1)-th beat, AR/AW/W held stable while waiting for READY, one W burst per AW in
  order (its beats may come before its AW, as AXI allows);
- ``err`` only after a response other than OKAY.
"""

import json
import logging
import os
import random

import cocotb
from cocotb.clock import Clock
from cocotb.triggers import ReadOnly, RisingEdge
from cocotbext.axi import AxiRamRead, AxiRamWrite, AxiReadBus, AxiWriteBus

P = json.loads(os.environ["GPTFPGA_PARAMS"])
SEED = int(os.environ.get("GPTFPGA_SEED", "1"))
C, HB, D, RUN, PAGE_BEATS = P["channels"], P["hbm_bits"], P["data_bits"], P["run"], P["page_beats"]
MAX_OUT = P.get("max_outstanding")       # bursts in flight per channel and direction, or None
K = D // HB                  # channels of a link beat
PER = C // K                 # link beats of a stripe row
HBB = HB // 8                # bytes of a channel beat
PAGE = 4096
MEMC = 1 << 18               # bytes of each channel's memory
FLUSH_IDLE = 4               # hw/dma/beats.py: idle cycles that close an open write run


def pause(rng, p):
    while True:
        yield rng.random() < p


def locate(b):
    """(row, [channels]) of link beat ``b``."""
    h = b % PER
    return b // PER, list(range(h * K, h * K + K))


class FaultyRead(AxiRamRead):
    fault = None        # (lo, hi) byte range answered with SLVERR

    async def _read(self, address, length):
        if self.fault and self.fault[0] <= address < self.fault[1]:
            raise ValueError(f"injected read fault at {address:#x}")
        return await super()._read(address, length)


class FaultyWrite(AxiRamWrite):
    fault = None

    async def _write(self, address, data):
        if self.fault and self.fault[0] <= address < self.fault[1]:
            raise ValueError(f"injected write fault at {address:#x}")
        return await super()._write(address, data)


class TB:
    def __init__(self, dut, seed, *, stall=0.0, idle=0.0):
        self.dut, self.seed = dut, seed
        self.rng = random.Random(seed)
        logging.getLogger(f"cocotb.{dut._name}").setLevel(logging.WARNING)  # the AXI models' chatter
        self.idle = idle
        self.rd_ram, self.wr_ram = [], []
        for c in range(C):
            r = FaultyRead(AxiReadBus.from_prefix(dut, f"axi_r_{c}"), dut.clk, dut.rst, size=MEMC)
            w = FaultyWrite(AxiWriteBus.from_prefix(dut, f"axi_w_{c}"), dut.clk, dut.rst, mem=r.mem)
            r.ar_channel.queue_occupancy_limit = 64
            w.aw_channel.queue_occupancy_limit = 64
            self.rd_ram.append(r)
            self.wr_ram.append(w)
            for k, ch in enumerate((r.ar_channel, r.r_channel, w.aw_channel, w.w_channel, w.b_channel)):
                if stall:
                    ch.set_pause_generator(pause(random.Random(seed * 1000 + 8 * c + k), stall))
        # each channel's buffer somewhere in its memory: page aligned, or only beat aligned (a
        # run's burst then may cross a page of the address space and must go as two)
        self.ptr = [self.rng.randrange(MEMC // 2 // PAGE) * PAGE
                    + (0 if self.rng.random() < 0.5 else self.rng.randrange(PAGE // HBB) * HBB)
                    for _ in range(C)]
        self.model = [bytearray(random.Random(seed * 7 + c).randbytes(MEMC)) for c in range(C)]
        for c in range(C):
            self.rd_ram[c].write(0, bytes(self.model[c]))
        # buffer beats: those that fit every channel's memory from its ptr
        self.beats = min((MEMC - p) // HBB for p in self.ptr) * PER
        self.got = []                 # read beats, in order
        self.errors = []
        self.w_in = 0                 # link beats accepted for writing
        self.cycles = 0
        self.max_open = 0
        self.max_burst_open = 0       # bursts in flight on one channel in one direction

    def fail(self, msg):
        if len(self.errors) < 20:
            self.errors.append(f"cycle {self.cycles}: {msg}")

    def beat_value(self, b):
        row, chans = locate(b)
        v = 0
        for j, c in enumerate(chans):
            a = self.ptr[c] + row * HBB
            v |= int.from_bytes(self.model[c][a:a + HBB], "little") << (j * HB)
        return v

    def write_model(self, b, value):
        row, chans = locate(b)
        for j, c in enumerate(chans):
            a = self.ptr[c] + row * HBB
            self.model[c][a:a + HBB] = ((value >> (j * HB)) & ((1 << HB) - 1)).to_bytes(HBB, "little")

    async def reset(self):
        dut = self.dut
        cocotb.start_soon(Clock(dut.clk, 5, unit="ns").start())
        dut.rst.value = 1
        dut.rd_req_valid.value = 0
        dut.wr_valid.value = 0
        for c in range(C):
            getattr(dut, f"ptr_{c}").value = self.ptr[c]
        for _ in range(4):
            await RisingEdge(dut.clk)
        dut.rst.value = 0
        await RisingEdge(dut.clk)
        cocotb.start_soon(self.monitor())

    async def monitor(self):
        """The AXI side of every channel and the read replies, sampled each cycle."""
        dut = self.dut
        chans = []
        for c in range(C):
            r, w = f"axi_r_{c}_", f"axi_w_{c}_"
            g = {n: getattr(dut, r + n) for n in ("arvalid", "arready", "araddr", "arlen", "rvalid",
                                                 "rready", "rlast")}
            g.update({n: getattr(dut, w + n) for n in ("awvalid", "awready", "awaddr", "awlen",
                                                      "wvalid", "wready", "wlast", "wdata",
                                                      "bvalid", "bready")})
            chans.append(g)
        held = {}
        wq = [[] for _ in range(C)]           # each channel's W bursts (_w_address)
        rd_open, wr_open = [0] * C, [0] * C   # bursts in flight per channel and direction
        aw_n = b_n = w_beats = 0
        while True:
            await ReadOnly()
            self.cycles += 1
            if int(dut.rd_resp_valid.value):
                self.got.append(int(dut.rd_resp_payload.value))
            for c, g in enumerate(chans):
                for ch, pay in (("ar", ("araddr", "arlen")), ("aw", ("awaddr", "awlen")),
                                ("w", ("wdata", "wlast"))):
                    v, r = int(g[ch + "valid"].value), int(g[ch + "ready"].value)
                    payload = tuple(int(g[n].value) for n in pay)
                    key = (c, ch)
                    if key in held and (not v or payload != held[key]):
                        self.fail(f"channel {c} {ch}: VALID dropped or payload changed before READY")
                    if v and not r:
                        held[key] = payload
                    else:
                        held.pop(key, None)
                    if v and r and ch in ("ar", "aw"):
                        addr, ln = payload
                        lo = self.ptr[c]
                        if addr < lo or addr + (ln + 1) * HBB > MEMC or addr % HBB:
                            self.fail(f"channel {c} {ch} burst at {addr:#x} len {ln} outside the buffer")
                        if addr // PAGE != (addr + (ln + 1) * HBB - 1) // PAGE:
                            self.fail(f"channel {c} {ch} burst at {addr:#x} len {ln} crosses 4 KiB")
                        if ch == "aw":
                            self._w_address(c, wq[c], ln + 1)
                            aw_n += 1
                            wr_open[c] += 1
                        else:
                            rd_open[c] += 1
                    if v and r and ch == "w":
                        w_beats += 1
                        self._w_beat(c, wq[c], payload[1])
                if int(g["bvalid"].value) and int(g["bready"].value):
                    b_n += 1
                    wr_open[c] -= 1
                if int(g["rvalid"].value) and int(g["rready"].value) and int(g["rlast"].value):
                    rd_open[c] -= 1
                self.max_burst_open = max(self.max_burst_open, rd_open[c], wr_open[c])
                if MAX_OUT is not None and max(rd_open[c], wr_open[c]) > MAX_OUT:
                    self.fail(f"channel {c}: {rd_open[c]} reads, {wr_open[c]} writes in flight, "
                              f"beyond max_outstanding {MAX_OUT}")
            if int(dut.wr_valid.value) and int(dut.wr_ready.value):
                self.w_in += 1
            self.max_open = max(self.max_open, aw_n - b_n)
            if int(dut.w_idle.value) and (aw_n != b_n or w_beats != self.w_in * K):
                self.fail(f"w_idle with {aw_n - b_n} bursts unanswered, {self.w_in * K - w_beats} "
                          "channel beats unwritten")
            await RisingEdge(dut.clk)

    # One channel's W bursts in AW order: {need (beats; None until the AW), seen, done}. AXI
    # lets a burst's W beats come before its AW (HbmBeats sends them as soon as they are in).
    def _w_address(self, c, bursts, beats):
        early = next((b for b in bursts if b["need"] is None), None)
        if early is None:
            bursts.append({"need": beats, "seen": 0, "done": False})
        else:
            early["need"] = beats
            if early["seen"] > beats or (early["done"] and early["seen"] != beats):
                self.fail(f"channel {c}: {early['seen']} W beats (WLAST: {early['done']}) before "
                          f"an AW of {beats}")
        self._w_retire(bursts)

    def _w_beat(self, c, bursts, last):
        cur = next((b for b in bursts if not b["done"]), None)
        if cur is None:
            cur = {"need": None, "seen": 0, "done": False}
            bursts.append(cur)
        cur["seen"] += 1
        if cur["need"] is not None and last != (cur["seen"] == cur["need"]):
            self.fail(f"channel {c}: WLAST={last} on beat {cur['seen']} of a burst of {cur['need']}")
        cur["done"] = bool(last) or cur["seen"] == cur["need"]
        self._w_retire(bursts)

    @staticmethod
    def _w_retire(bursts):
        while bursts and bursts[0]["done"] and bursts[0]["need"] is not None:
            bursts.pop(0)

    async def _taken(self, ready, what, timeout=20_000):
        """Hold VALID until ``ready`` takes it; a hang is an error after ``timeout`` cycles."""
        for _ in range(timeout):
            await ReadOnly()
            taken = int(ready.value)
            await RisingEdge(self.dut.clk)
            if taken:
                return
        raise AssertionError(f"seed {self.seed}: {what} not taken in {timeout} cycles (a hang)")

    async def _offer(self, valid, payload, value, ready, what):
        """Idle cycles at random, then ``value`` offered on ``valid``/``payload`` until taken."""
        while self.idle and self.rng.random() < self.idle:
            await RisingEdge(self.dut.clk)
        payload.value = value
        valid.value = 1
        await self._taken(ready, what)
        valid.value = 0

    async def reads(self, runs):
        dut = self.dut
        for b, n in runs:
            await self._offer(dut.rd_req_valid, dut.rd_req_payload, b | (n << 32), dut.rd_req_ready,
                              f"read run ({b}, {n})")

    async def writes(self, beats):
        """``beats``: [(beat, value) or ('idle', cycles)]."""
        dut = self.dut
        for item in beats:
            if item[0] == "idle":
                for _ in range(item[1]):
                    await RisingEdge(dut.clk)
                continue
            b, value = item
            await self._offer(dut.wr_valid, dut.wr_payload, b | (value << 32), dut.wr_ready,
                              f"write of beat {b}")
            self.write_model(b, value)

    def random_runs(self, n, lo, hi):
        """``n`` read runs in beats [lo, hi): lengths 1..run, never across a page; a third end
        exactly at a page's end, some are the longest."""
        runs = []
        for _ in range(n):
            ln = self.rng.choice([1, RUN, self.rng.randint(1, RUN)])
            if self.rng.random() < 0.3:
                page = self.rng.randrange(lo // PAGE_BEATS + 1, hi // PAGE_BEATS)
                b = page * PAGE_BEATS - ln
            else:
                b = self.rng.randrange(lo, hi - ln)
                b -= max(0, (b + ln) - ((b // PAGE_BEATS) + 1) * PAGE_BEATS)
            runs.append((b, ln))
        return runs

    def random_writes(self, n, lo, hi):
        """About ``n`` beats to write in [lo, hi): consecutive stretches (some longer than a run,
        some across a page), jumps, and idle gaps around the flush time."""
        out, b = [], self.rng.randrange(lo, hi)
        while len(out) < n:
            if self.rng.random() < 0.3:
                b = self.rng.randrange(lo, hi - 1)
            elif self.rng.random() < 0.2:
                b = (b // PAGE_BEATS + 1) * PAGE_BEATS - self.rng.randint(1, 3)
            for _ in range(self.rng.choice([1, 2, RUN, RUN + 3, self.rng.randint(1, 2 * RUN)])):
                if b >= hi:
                    b = lo
                out.append((b, self.rng.getrandbits(D)))
                b += 1
            if self.rng.random() < 0.3:
                out.append(("idle", self.rng.choice([FLUSH_IDLE - 1, FLUSH_IDLE, FLUSH_IDLE + 1, 20])))
        return out

    async def wait_idle(self, n_read, timeout=50_000):
        dut = self.dut
        for _ in range(timeout):
            await ReadOnly()
            done = len(self.got) >= n_read and int(dut.w_idle.value) and not int(dut.wr_valid.value)
            await RisingEdge(dut.clk)
            if done:
                break
        else:
            raise AssertionError(f"seed {self.seed}: no end after {timeout} cycles: {len(self.got)} "
                                 f"of {n_read} read beats, w_idle={int(dut.w_idle.value)} (a hang)")
        for _ in range(20):
            await RisingEdge(dut.clk)

    def verify(self, expected_reads, *, err=0):
        seed = self.seed
        assert not self.errors, f"seed {seed}: " + "\n".join(self.errors)
        assert len(self.got) == len(expected_reads), \
            f"seed {seed}: {len(self.got)} beats read, expected {len(expected_reads)}"
        for i, (got, want) in enumerate(zip(self.got, expected_reads, strict=True)):
            assert got == want, f"seed {seed}: read beat {i} differs from the model"
        for c in range(C):
            mem = self.rd_ram[c].read(0, MEMC)
            if mem != bytes(self.model[c]):
                at = next(a for a in range(MEMC) if mem[a] != self.model[c][a])
                raise AssertionError(f"seed {seed}: channel {c} memory differs from the model at "
                                     f"{at:#x} (buffer from {self.ptr[c]:#x})")
        assert int(self.dut.err.value) == err, f"seed {seed}: err={int(self.dut.err.value)}, expected {err}"


async def traffic(dut, seed, n, **kw):
    tb = TB(dut, seed, **kw)
    print(f"tb_hbm_beats: seed={seed} channels={C} hbm_bits={HB} data_bits={D} run={RUN} "
          f"n={n} {kw}")
    await tb.reset()
    half = tb.beats // 2
    runs = tb.random_runs(n, 0, half)                  # reads below half, writes above
    expected = [tb.beat_value(b + i) for b, ln in runs for i in range(ln)]
    wr = tb.random_writes(4 * n, half, tb.beats)
    rd_task = cocotb.start_soon(tb.reads(runs))
    await tb.writes(wr)
    await rd_task
    await tb.wait_idle(len(expected))
    tb.verify(expected)
    print(f"tb_hbm_beats: {tb.cycles} cycles, {len(expected)} beats read, {tb.w_in} written, "
          f"max write bursts open {tb.max_open}, max on one channel and direction "
          f"{tb.max_burst_open} (limit {MAX_OUT})")
    return tb


@cocotb.test(timeout_time=2, timeout_unit="ms")
async def random_no_stalls(dut):
    await traffic(dut, SEED, int(os.environ.get("GPTFPGA_N", "40")))


@cocotb.test(timeout_time=2, timeout_unit="ms")
async def random_backpressure(dut):
    """Idle inputs and backpressure on every channel's AR, R, AW, W and B."""
    await traffic(dut, SEED + 1, int(os.environ.get("GPTFPGA_N", "40")), stall=0.5, idle=0.3)


@cocotb.test(timeout_time=2, timeout_unit="ms")
async def corners(dut):
    """Back-to-back longest runs, runs from every group and ending on a page's end, a write run
    across a page (two bursts), beats backwards, and gaps of FLUSH_IDLE - 1 and FLUSH_IDLE
    cycles (the open run kept, then closed)."""
    tb = TB(dut, SEED + 2, stall=0.2)
    print(f"tb_hbm_beats: seed={SEED + 2} corners")
    await tb.reset()
    pb = PAGE_BEATS
    runs = [(0, RUN), (RUN, RUN), (2 * RUN, RUN)]                           # back to back
    runs += [(pb + g, RUN) for g in range(PER)]                             # every first group
    runs += [(2 * pb - RUN, RUN), (3 * pb - 1, 1), (3 * pb, 1)]             # to a page's end
    expected = [tb.beat_value(b + i) for b, ln in runs for i in range(ln)]
    base = tb.beats // 2 // pb * pb + pb
    v = tb.rng.getrandbits
    wr = [(base + pb - 3 + i, v(D)) for i in range(6)]                      # across a page
    wr += [(base + 10, v(D)), ("idle", FLUSH_IDLE - 1), (base + 11, v(D)),
           ("idle", FLUSH_IDLE), (base + 12, v(D)), ("idle", FLUSH_IDLE + 1)]
    wr += [(base + 40 - i, v(D)) for i in range(5)]                          # backwards
    wr += [(base + 2 * pb + i, v(D)) for i in range(3 * RUN + 1)]            # longer than runs
    wr += [(base + 2 * pb, v(D))]                                            # rewrite a beat
    rd_task = cocotb.start_soon(tb.reads(runs))
    await tb.writes(wr)
    await rd_task
    await tb.wait_idle(len(expected))
    tb.verify(expected)


@cocotb.test(timeout_time=2, timeout_unit="ms")
async def slave_errors(dut):
    """A read answered SLVERR on one channel and a write answered SLVERR on another set the
    sticky ``err``; the beats still come back in order (zeros where the RAM failed) and every
    write still ends with its response."""
    tb = TB(dut, SEED + 3, stall=0.2)
    print(f"tb_hbm_beats: seed={SEED + 3} slave errors")
    await tb.reset()
    runs = [(0, RUN), (RUN, RUN)]
    expected = [tb.beat_value(b + i) for b, ln in runs for i in range(ln)]
    await tb.reads(runs[:1])
    await tb.wait_idle(RUN)
    assert int(dut.err.value) == 0, f"seed {tb.seed}: err before any error"
    # channel 0 fails on the rows of the second run
    row0 = RUN // PER
    rc = 0
    tb.rd_ram[rc].fault = (tb.ptr[rc] + row0 * HBB, tb.ptr[rc] + (row0 + RUN // PER) * HBB)
    for i in range(RUN):
        row, chans = locate(RUN + i)
        if rc in chans:
            j = chans.index(rc)
            expected[RUN + i] &= ~(((1 << HB) - 1) << (j * HB))
    await tb.reads(runs[1:])
    await tb.wait_idle(2 * RUN)
    for _ in range(10):
        await RisingEdge(dut.clk)
    assert int(dut.err.value) == 1, f"seed {tb.seed}: a SLVERR read did not set err (or it fell)"
    # a reset clears it; then a write to the last channel fails: it is answered, w_idle comes
    dut.rst.value = 1
    for _ in range(3):
        await RisingEdge(dut.clk)
    dut.rst.value = 0
    await RisingEdge(dut.clk)
    assert int(dut.err.value) == 0, f"seed {tb.seed}: err after a reset"
    wc = C - 1
    base = tb.beats // 2
    tb.wr_ram[wc].fault = (0, MEMC)
    before = bytes(tb.model[wc])
    beats = [(base + i, tb.rng.getrandbits(D)) for i in range(2 * PER)]
    await tb.writes(beats)
    await tb.wait_idle(2 * RUN)
    tb.model[wc][:] = before               # the failed channel's bytes stay as they were
    tb.verify(expected, err=1)
