"""The performance model: cycles per token of any config and GPT-2 shape, without RTL.

It replays the compiler's own instruction streams (shapes-only compiles: the programs and the
HBM placement a real model would get) through a model of the card's timing, instruction by
instruction, with the structure of the RTL (docs/architecture.md):

- fetch: bursts of 16 instructions from HBM, at most 32 fetched ahead of the decoder;
- in-order issue through decode and issue stages, 8 scoreboard entries, and the address-range
  hazards of hw/core/issue.py (a new instruction waits while it would write what an older one
  reads or writes, or read what an older one writes); an instruction also waits for its unit's
  command port (the matrix unit takes the next MATVEC when the last has issued its last step,
  the vector unit and the store engine one instruction at a time, LOAD/WLOAD up to 4 ahead);
- the read DMA: the stripes of LOADs and WLOADs in order after the HBM latency, at the
  channels' rate (one beat per cycle, or less where the HBM's bandwidth per channel is lower
  than the port: U280 at 300 MHz), WLOAD tiles into the weight FIFO while it has room;
  a LOAD writes a stripe to the VSP at vector_lanes elements per cycle;
- the matrix unit: one (tile, token) step per cycle, a tile only once it is in the FIFO, the
  accumulator's reuse distance (Fp32Add.LATENCY + 2 steps) between a slot's updates, the
  bias of the first group loaded before it starts, and the pipeline's depth (multiplier, adder
  tree, accumulator adder, output writer) to its completion;
- the vector unit: each pass = rows of vector_lanes elements, one per cycle, plus the unit's
  latency and the pass's fixed overhead; reductions are the ISA's row-halving passes and lane
  folds;
- the store engine: one element per cycle, or a VSP row where the pattern allows (whole rows
  to a group, inside a channel beat), then the write responses;
- COLL: one at a time in the collective unit; every card waits for the slowest, then the ring
  all-reduce's (or all-gather's) cost from the link's latency and rate, the per-hop overhead
  measured on the collective engine, and the framing.

Every constant that is not a structural fact of the RTL (a pipeline latency from hw/arith, a
FIFO depth) is one of the few fixed overheads in ``Overheads``; `gptfpga bench calibrate`
(sim.bench.calibrate_perf) measures the model against the RTL's cycle counters (the Verilated
card and the collective engine) and records the errors in docs/perf-calibration.json.
"""

import json
import math
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from hw.isa import BINARY_VOPS, REDUCE_VOPS, UNIT_OF, VOP_BY_CODE, VOPS, decode, store_row_mode
from hw.ring import DIV_BITS, beats

__all__ = ["Overheads", "CardModel", "simulate", "StepCosts", "predict", "coll_cycles", "DFX",
           "CALIBRATION", "recorded_calibration"]

# The model against the RTL: `gptfpga bench calibrate` (sim.bench.calibrate_perf) writes it.
CALIBRATION = Path(__file__).resolve().parent.parent / "docs" / "perf-calibration.json"


def recorded_calibration():
    """The last calibration's result (docs/perf-calibration.json), or None."""
    return json.loads(CALIBRATION.read_text()) if CALIBRATION.exists() else None


# Pipeline latencies of the arithmetic units (hw/arith; tests/test_perf.py checks them).
ADD_LAT, MUL_LAT, MAX_LAT, CVT_LAT = 6, 4, 1, 2
EXP_LAT, RECIP_LAT, RSQRT_LAT, GELU_LAT = 66, 42, 50, 141
VOP_LAT = {"ADD": ADD_LAT, "SUB": ADD_LAT, "MUL": MUL_LAT, "MAX": MAX_LAT, "MOV": 1, "MASK": 1,
           "EXP": EXP_LAT, "RECIP": RECIP_LAT, "RSQRT": RSQRT_LAT, "GELU": GELU_LAT,
           "CVT16": CVT_LAT, "REDSUM": ADD_LAT, "REDMAX": MAX_LAT}
# Operations on the special-function units, which core.special_share lanes take turns on
# (hw/core/vpu_lanes.SPECIAL_VOPS; tests/test_perf.py checks them).
SPECIAL_VOPS = ("EXP", "RECIP", "RSQRT", "GELU")
SCOREBOARD = 8
FETCH_CHUNK, FETCH_DEPTH = 16, 32
DMA_RD_QUEUE = 4
STORE_QUEUE = 2                  # hw/core/dma.py
# an i8 MATVEC's tiles include a scale row a group, ceil(rb / group): the issue stage's
# divider takes a bit a cycle (hw/core/issue.py)
I8_CLAIM = 16
ACC_REUSE = ADD_LAT + 2          # steps between two updates of one accumulator slot
# The weight FIFO (hw/core/wfifo.py): beats read ahead of the storage, a tile's cycles from
# its write to its first possible pop, and from a pop to the tile register.
WFIFO_QUEUE, WFIFO_IN_TO_POP, WFIFO_POP_TO_TILE = 4, 4, 2


def dot_latency(width):
    """hw.arith.dot.DotArray.latency: the block alignment (unpack, a max level a stage, three
    more), the product's register, the sums along a chain of up to 16 products (one a
    stage, the DSP48E2 cascade) and an adder level a stage over the chains, then the
    rounding (the magnitude, the normalizing shifts two a stage, the pack). The sum is at
    least 42 bits wide, so the normalization takes 6 shifts."""
    levels = (width - 1).bit_length()
    chain = min(16, width)
    return (1 + levels + 3) + (1 + chain + (width // chain - 1).bit_length()) + (1 + 3 + 1)


@dataclass(frozen=True)
class Overheads:
    """Fixed cycles of the RTL's control that the structure above does not name."""
    vec_pass: int = 4          # a vector pass: start, first read, FIFO, feed
    vec_bcast: int = 3         # reading a broadcast operand first
    vec_issue: int = 1         # the unit back to IDLE after an instruction
    dma_first: int = 4         # command to AR, R to stripe join
    load_tail: int = 2         # last VSP write to done
    store_fixed: int = 8       # VSP read, conversion, coalescing, AW/W
    store_queue: int = 1       # through the queue ahead of the store engine
    mpu_start: int = 2         # command to the first step (bias-free)
    mpu_tail: int = 3          # last accumulation to done (output FIFO, writer)
    halt: int = 3              # HALT to ap_done
    coll_hop: int = 20         # collective engine per ring step beyond the link
    # The collective unit on the card (hw/core/coll.py around the engine), fitted to the
    # Verilated appliance's COLLs (docs/performance.md, "The collective unit's own time"):
    coll_step: int = 18        # a ring step beyond the link's latency: framing, CRC, tables
    coll_step_port: int = 2    # ... and per VSP cycle of a beat (the reader's and writer's turn)
    coll_slack: int = 16       # beats a received frame is sent on ahead of its VSP writes
    coll_copy_row: int = 3     # all-gather's own block: cycles a row (read, register, write)
    coll_beat_gap: int = 0     # the unit's VSP reader and writer: idle cycles between beats (1 before)
    coll_port_dirs: int = 2    # ring directions sharing the unit's VSP read and write port
    coll_ag_wait: float = 0.25  # all-gather: share of each later step's latency the writes wait
    coll_ag_write: float = 1.1  # all-gather: the writer's cycles a beat over its R
    coll_ar_port: float = 0.9   # all-reduce: the rounds' segments through the ports, overlapped


class CardModel:
    """Timing of one card's program. ``run(words)`` is a generator: it yields each COLL's
    (time ready, fields) and expects the time it completes; it returns the figures."""

    def __init__(self, cfg, *, overheads=Overheads(), trace=False, cards=None, reuse=None,
                 runahead=False, vec_pipelined=False, decoupled=None, coll_pipelined=False):
        self.cfg, self.o = cfg, overheads
        # a what-if: the collective unit takes the next COLL once the last one's data have
        # moved, its frames' time on the links (each hop's latency) not holding it
        self.coll_pipelined = coll_pipelined
        # a what-if: issue does not wait for an instruction's hazards; it takes a scoreboard
        # entry (``decoupled[1]`` of them) and a place in its unit's queue (``decoupled[0]``
        # deep), and the unit starts it, in the unit's order, once the older instructions it
        # conflicts with are done
        self.decoupled = decoupled
        # a what-if (docs/performance.md): the vector unit takes the next VEC while the last's
        # pipeline drains, as one write port allows: the results are written in order, so the
        # next VEC's first row comes out after the last one's last (its x16 copy included: a
        # shorter pipeline starts that much later); a reduction (its passes share the scratch),
        # and GELU next to EXP or RECIP (GELU runs on those units), wait for the drain; a VEC
        # that reads the last one's result waits for it (the scoreboard)
        self.vec_pipelined = vec_pipelined
        # a what-if (docs/performance.md): a one-token fp16 MATVEC takes two tiles a cycle
        # (two of a lane's R dot products, each with its own weight alignment) while they are
        # there, as far as the accumulators' reuse distance allows
        self.runahead = runahead
        # token vectors meeting a weight tile per cycle: the config's (core.reuse), or a what-if
        self.R = cfg.core.reuse if reuse is None else reuse
        self.cards = cards or cfg.cards
        self.trace = [] if trace else None      # (pc, op, issue cycle, done cycle)
        # with trace: per instruction, (the cycle it could have issued in order, and what held
        # it from there: None, or (hazard | scoreboard | unit, the index of the instruction
        # it waited for))
        self.why = [] if trace else None
        c = cfg.core
        self.L, self.W, self.P = c.lanes, c.width, c.vector_lanes
        self.S = cfg.stripe_bytes
        self.depth = c.weight_fifo_tiles
        self.lat = cfg.hbm.latency_cycles
        # Stripes per cycle: every channel delivers a beat per cycle, or less where the HBM's
        # bandwidth per channel is below the port's width.
        self.rate = cfg.hbm_channel_bytes_per_cycle / cfg.hbm_beat_bytes
        # a step's issue to its partial sums: the pop to the tile register, the dot products
        self.X = WFIFO_POP_TO_TILE + dot_latency(self.W)
        self.lpr = max(1, self.L // self.P)
        # an i8 MATVEC's tile rows a lane: 2 (int8), 1 (int16); an int16 build's fp16 tiles
        # (the K and V caches) go through lanes / cache_phases alignments, cache_phases cycles
        self.qrows = c.tile_rows // self.L if c.int_weights else 1
        self.cache_phases = c.cache_phases
        self.seg = c.vsp_words // c.vsp_segments      # VSP words per segment (one read a cycle)
        self.beat = cfg.hbm_beat_bytes
        # write beats in flight: max_outstanding per channel, each for the latency and a cycle
        self.wr_gap = (self.lat + 2) / cfg.hbm.max_outstanding

    # -- durations of the vector unit -------------------------------------------------------
    def vec_cycles(self, f):
        P, o = self.P, self.o
        name = VOP_BY_CODE[f["vop"]]
        lat = VOP_LAT[name]
        rows = -(-f["n"] // P)
        if f["vop"] in REDUCE_VOPS:
            cyc, left = 0, rows
            first = True
            while True:                      # row-halving passes, at least one
                h = (left + 1) // 2
                # the first reads both halves from the VSP: one segment, one read a cycle
                cyc += h * (2 if first and left > 1 and self._same_seg(f["src1"], f["src1"] + f["n"] - 1)
                            else 1) + lat + o.vec_pass
                first = False
                left = h
                if left == 1:
                    break
            folds = int(math.log2(P)) if P > 1 else 0
            return cyc + folds * (1 + lat + o.vec_pass)
        extra = o.vec_bcast if (f["vop"] in BINARY_VOPS and f["bcast"]) else 0
        if (f["vop"] in BINARY_VOPS and not f["bcast"] and f["src1"] != f["src2"]
                and self._same_seg(f["src1"], f["src2"])):
            rows *= 2                        # both operands through one segment's read port
        if name in SPECIAL_VOPS:
            rows *= self.cfg.core.special_share   # lanes take turns on a special unit
        return rows + lat + o.vec_pass + extra + (CVT_LAT if f["x16"] else 0)

    def _store_walk(self, f):
        """Cycles of a STORE's walk: a VSP row a cycle where its pattern allows
        (hw.isa.store_row_mode), else an element a cycle."""
        if store_row_mode(f["f32"], f["lepg"], f["off"], f["gstride"], self.P, self.beat):
            return -(-f["n"] // self.P)
        return f["n"]

    def _store_beats(self, f):
        """Write beats a STORE sends to its busiest channel (each group's bytes in whole
        beats, from the group's first byte)."""
        z = 4 if f["f32"] else 2
        epg, gpr = 1 << f["lepg"], 1 << f["lgpr"]
        groups = -(-f["n"] // epg)
        span = min(epg, f["n"]) * z
        per = -(-span // self.beat)                        # beats per group
        g = np.arange(min(groups, gpr))                    # a row's groups (every row alike)
        first = (f["off"] + g * f["gstride"]) // self.beat
        chans = np.concatenate([first + k for k in range(per)]) % (self.S // self.beat)
        rows = -(-groups // gpr)
        return int(np.bincount(chans).max()) * rows

    def _same_seg(self, a, b):
        return a // self.seg == b // self.seg

    # -- the program ---------------------------------------------------------------------------
    def run(self, words):
        o, P, S = self.o, self.P, self.S
        insns = [decode(w) for w in words]
        n = len(insns)
        enter = np.zeros(n + 1, np.int64)       # cycle each instruction enters stage D
        req = {}                                # fetch burst -> cycle requested
        arrive_prev = 0
        inflight = []                           # (done, reads, writes, index)
        # the collective unit takes one COLL at a time (hw/core/coll.py: ready only when idle)
        unit_free = {"vpu": 0, "mpu": 0, "coll": 0}
        unit_last = {"vpu": None, "mpu": None, "coll": None}  # (the instruction holding each)
        store_done = []                         # done cycles of STOREs, in order
        store_free = 0                          # the store engine takes the next STORE
        dma_done = []                           # done cycles of LOAD/WLOAD, in order
        data_end = 0                            # last stripe of the read DMA
        # weight FIFO: arrival and consumption cycle of each tile, in stream order
        total = sum(ins.fields["tiles"] for ins in insns if ins.op == "WLOAD")
        tile_in = np.zeros(total, np.int64)
        tile_out = np.zeros(total, np.int64)
        streamed = claimed = 0
        mpu_last_step = -1
        mpu_busy_until = 0
        busy = {"mpu": 0, "vpu": 0}
        hbm_rd = 0
        prev_issue = 0
        t_end = 0
        last_vec = None                         # (done, operation, reduction) of the last VEC
        starts = {}                             # (decoupled) each unit's starts, in order
        for i, ins in enumerate(insns):
            # -- fetch ----------------------------------------------------------------------
            b = i // FETCH_CHUNK
            if b not in req:
                # burst b may be asked for once instructions 0 .. 16(b-1)-1 have left the FIFO
                gate = 1 if b < 2 else int(enter[FETCH_CHUNK * (b - 1) - 1]) + 1
                req[b] = max(req.get(b - 1, 0) + 1, gate)
            arrive = max(req[b] + self.lat + 2 + (i - b * FETCH_CHUNK), arrive_prev + 1)
            arrive_prev = arrive
            enter[i] = max(arrive, prev_issue)
            t = int(enter[i]) + 1
            op = ins.op
            f = ins.fields
            if op == "MATVEC" and f.get("i8", 0):
                t += I8_CLAIM     # the issue stage counts its tiles (scale rows) first
            reads, writes = self._ranges(op, f)
            if op in ("HALT", "FENCE"):
                t = max([t] + [d + 1 for d, *_ in inflight])
                prev_issue = t
                inflight = []
                if op == "HALT":
                    t_end = t + o.halt
                    break
                continue
            t0 = t
            unit = UNIT_OF[op]
            if self.decoupled:
                qd, sb = self.decoupled
                live = sorted(d for d, *_ in inflight if d >= t)
                if len(live) >= sb:
                    t = max(t, live[len(live) - sb] + 1)
                mine = starts.setdefault(unit, [])
                if unit in ("vpu", "mpu", "coll") and len(mine) >= qd:
                    t = max(t, mine[-qd] + 1)
                pending = [d for d in (dma_done if unit == "dma_rd" else store_done) if d >= t]
                if unit == "dma_rd" and len(pending) >= DMA_RD_QUEUE:
                    t = max(t, pending[len(pending) - DMA_RD_QUEUE] + 1)
                elif unit == "dma_wr" and len(pending) > STORE_QUEUE:
                    t = max(t, pending[len(pending) - STORE_QUEUE - 1] + 1)
                issue = t
                inflight = [e for e in inflight if e[0] >= issue]
                t = max(_after_hazards(t, inflight, reads, writes), mine[-1] if mine else 0)
                why = ("hazard", _blocker(t, inflight)) if t > t0 else None
            else:
                t, why = _after_hazards(t, inflight, reads, writes), None
                if t > t0:
                    why = ("hazard", _blocker(t, inflight))
                live = sorted(d for d, *_ in inflight if d >= t)
                if len(live) >= SCOREBOARD:
                    t1 = t
                    t = max(t, live[len(live) - SCOREBOARD] + 1)
                    t = _after_hazards(t, inflight, reads, writes)
                    if t > t1:
                        why = ("scoreboard", _blocker(t, inflight))
            t1 = t
            if unit == "dma_rd":
                pending = [d for d in dma_done if d >= t]
                if len(pending) >= DMA_RD_QUEUE:
                    t = max(t, pending[len(pending) - DMA_RD_QUEUE] + 1)
            elif unit == "dma_wr":          # the queue ahead of the store engine has room
                pending = [d for d in store_done if d >= t]
                if len(pending) > STORE_QUEUE:
                    t = max(t, pending[len(pending) - STORE_QUEUE - 1] + 1)
            elif unit in unit_free:
                t = max(t, unit_free[unit])
            if t > t1:
                why = ("unit", unit_last.get(unit))
            if op == "COLL":
                done = yield t, f
                done = max(int(done), t + 1)
                unit_free["coll"], unit_last["coll"] = done + 1, i
                if self.coll_pipelined:
                    hops = (self.cards - 1) * (1 if f["cop"] == 0 else 2)
                    unit_free["coll"] = max(t + 2, done + 1 - hops * (self.cfg.link.latency_cycles
                                                                      + self.o.coll_hop))
            elif op == "VEC":
                cyc = self.vec_cycles(f)
                name = VOP_BY_CODE[f["vop"]]
                red = f["vop"] in REDUCE_VOPS
                lat = VOP_LAT[name] + (CVT_LAT if f["x16"] else 0)
                if self.vec_pipelined and last_vec is not None:
                    last_done, last_name, last_red = last_vec
                    both = {last_name, name}
                    if red or last_red or ("GELU" in both and both & {"EXP", "RECIP"}):
                        t = max(t, last_done + o.vec_issue)             # the drain
                    else:                    # the first row out after the last one's last
                        t = max(t, last_done - lat - o.vec_pass + 1)
                done = t + 1 + cyc
                last_vec = (done, name, red)
                held = cyc
                if self.vec_pipelined and not red:
                    held = cyc - lat
                busy["vpu"] += held
                unit_free["vpu"] = t + 1 + held + o.vec_issue
                unit_last["vpu"] = i
            elif op == "STORE":
                # one element a cycle; single-beat writes, at most max_outstanding per channel
                # awaiting their response
                start = max(t + 1 + o.store_queue, store_free)
                walk = max(self._store_walk(f), self._store_beats(f) * self.wr_gap)
                done = start + o.store_fixed + walk + self.lat
                store_free = done + 1
                store_done.append(done)
            elif op in ("LOAD", "WLOAD"):
                start = max(t + 1 + self.lat + o.dma_first, data_end + 1)
                if op == "WLOAD":
                    k = f["tiles"]
                    hbm_rd += k * S
                    base = streamed
                    idx = np.arange(k)
                    want = start + (idx / self.rate).astype(np.int64)
                    # room in the FIFO: tile j enters after tile j - (depth + read-ahead)
                    # has left it (its place in the queue, then the storage's, freed)
                    j = base + idx - self.depth - WFIFO_QUEUE
                    room = np.zeros(k, np.int64)
                    has = j >= 0           # claimed by an issued MATVEC (the ISA's FIFO rule)
                    room[has] = tile_out[j[has]] + 2
                    arr = _chain(np.maximum(want, room), np.ones(k, np.int64))
                    tile_in[base:base + k] = arr
                    streamed += k
                    data_end = int(arr[-1])
                    done = data_end + 1
                else:
                    z = 4 if f["f32"] else 2
                    per_stripe = S // z
                    nbytes = f["n"] * z
                    stripes = -(-nbytes // S)
                    hbm_rd += stripes * S
                    full, rest = divmod(f["n"], per_stripe)
                    wcyc = full * max(1, per_stripe // P) + -(-rest // P)
                    data_end = start + max(stripes / self.rate, wcyc)
                    data_end = int(math.ceil(data_end))
                    done = data_end + o.load_tail
                dma_done = dma_done[1 - DMA_RD_QUEUE:] + [done]
            elif op == "MATVEC":
                rb, cb, T, grp = f["rb"], f["cb"], f["tokens"], f["group"]
                # i8 (docs/performance.md): an int8 tile is 2L rows, a token takes two of the
                # R dot products of each lane (int16: L rows, as fp16), and each group starts
                # with its row of scales (one step)
                i8 = f.get("i8", 0)
                q = self.qrows if i8 else 1
                lpr = self.lpr * q
                k = rb * cb + (-(-rb // grp) if i8 else 0)
                first = max(t + 1 + o.mpu_start, mpu_last_step + 1)
                if f["bias_en"]:        # the first group's bias rows (each token's with btok)
                    first += min(grp, rb) * lpr * (T if f.get("btok", 0) else 1) + 2
                # the tiles of this MATVEC in stream order, and the minimum spacing of steps
                gaps = []
                # cycles a tile is held: ceil(T / R), with int8 ceil(2T / R); an int16 build's
                # fp16 tile cache_phases times that
                per = -(-T // (self.R // q))
                if not i8:
                    per *= self.cache_phases
                ahead = self.runahead and T == 1 and self.R >= 2 and not i8
                hold = per
                for g0 in range(0, rb, grp):
                    gs = min(grp, rb - g0)
                    geff = -(-gs // 2) if ahead else gs * per
                    if i8:
                        gaps.append(hold)
                        hold = 1
                    for c in range(cb):
                        for r in range(gs):
                            if r == 0 and c > 0 and geff < ACC_REUSE:
                                gaps.append(per + ACC_REUSE - geff)
                            elif ahead and r % 2:
                                gaps.append(0)          # the pair's second tile, same cycle
                            else:
                                gaps.append(hold)
                            hold = per
                gaps = np.array(gaps, np.int64)
                gaps[0] = 0
                avail = tile_in[claimed:claimed + k] + WFIFO_IN_TO_POP
                avail[0] = max(avail[0], first)
                steps = _chain(avail, gaps)
                tile_out[claimed:claimed + k] = steps
                claimed += k
                last = int(steps[-1]) + per - 1
                mpu_last_step = last
                unit_free["mpu"] = last + 1
                unit_last["mpu"] = i
                outs = rb * T * lpr
                done = max(last + self.X + ADD_LAT + o.mpu_tail + lpr,
                           first + self.X + ADD_LAT + outs)
                busy["mpu"] += max(0, done - max(first, mpu_busy_until))   # union of MATVECs
                mpu_busy_until = max(mpu_busy_until, done)
            else:
                raise ValueError(f"perf model: instruction {op} at {i}")
            if self.decoupled:
                starts[unit].append(t)
            else:
                issue = t                       # in order: the issue is the unit's start
            prev_issue = issue
            inflight = [e for e in inflight if e[0] >= issue] + [(done, reads, writes, i)]
            if self.trace is not None:
                self.trace.append((i, op, t, int(done)))
                self.why.append((t0, why))
        return {"cycles": int(t_end), "hbm_rd_bytes": int(hbm_rd), "mpu_busy": busy["mpu"],
                "vpu_busy": busy["vpu"], "insns": n}

    def _ranges(self, op, f):
        """(reads, writes) address ranges as hw/core/issue.py holds them: (space, lo, hi)."""
        S = self.S
        if op == "LOAD":
            rows = -(-(f["n"] * (4 if f["f32"] else 2)) // S)
            return [("hbm", f["row"], f["row"] + rows)], [("vsp", f["vsp"], f["vsp"] + f["n"])]
        if op == "STORE":
            epg, gpr = 1 << f["lepg"], 1 << f["lgpr"]
            groups = -(-f["n"] // epg)
            rows = -(-groups // gpr)
            last = f["row"] + (rows - 1) * f["rstride"]
            return [("vsp", f["vsp"], f["vsp"] + f["n"])], [("hbm", f["row"], last + 1)]
        if op == "WLOAD":
            return [("hbm", f["row"], f["row"] + f["tiles"])], []
        if op == "MATVEC":         # (its addresses are rows: width XB, vector_lanes VSP words)
            T, W, P = f["tokens"], self.W, self.P
            rbl = f["rb"] * self.L * (self.qrows if f.get("i8", 0) else 1)
            xb, dst, bias, ds = f["xb"] * W, f["dst"] * P, f["bias"] * P, f["dstride"] * P
            reads = [("xb", xb, xb + (T - 1) * f["xstride"] * W + f["cb"] * W)]
            if f["bias_en"]:
                bspan = (T - 1) * ds + rbl if f.get("btok", 0) else rbl
                reads.append(("vsp", bias, bias + bspan))
            return reads, [("vsp", dst, dst + (T - 1) * ds + rbl)]
        if op == "VEC":
            vop = f["vop"]
            n = f["n"]
            reads = [("vsp", f["src1"], f["src1"] + n)]
            if vop in BINARY_VOPS:
                reads.append(("vsp", f["src2"], f["src2"] + (1 if f["bcast"] else n)))
            d = 1 if vop in REDUCE_VOPS else n
            space = "xb" if vop == VOPS["CVT16"][0] else "vsp"
            writes = [(space, f["dst"], f["dst"] + d)]
            if f["x16"]:                     # the fp16 copy (VEC.x16)
                writes.append(("xb", f["xdst"], f["xdst"] + n))
            return reads, writes
        if op == "COLL":
            n = f["n"]
            if f["hbm"]:
                return ([("hbm", f["src"], f["src"] + -(-4 * n // S))],
                        [("hbm", f["dst"], f["dst"] + -(-4 * n // S))])
            B = self.cfg.link.data_bits // 32        # the result: whole beats, N blocks of
            out = -(-n // B) * B * (self.cards if f["cop"] == 0 else 1)  # them if gathered
            writes = [("vsp", f["dst"], f["dst"] + out)]
            if f.get("x16"):                         # its fp16 copy in XB
                writes.append(("xb", f["xdst"], f["xdst"] + out))
            return [("vsp", f["src"], f["src"] + n)], writes
        return [], []


def _hits(a, b):
    return a[0] == b[0] and a[1] < b[2] and b[1] < a[2]


def _after_hazards(t, inflight, reads, writes):
    """The first cycle from ``t`` at which an instruction reading ``reads`` and writing
    ``writes`` conflicts with none of the in-flight (done, reads, writes): it may not write
    what one reads or writes, nor read what one writes (hw/core/issue.py)."""
    for done, er, ew, _ in inflight:
        if done >= t and (any(_hits(w, r) for w in writes for r in er + ew)
                          or any(_hits(r, w) for r in reads for w in ew)):
            t = done + 1
    return t


def _blocker(t, inflight):
    """The in-flight instruction whose completion let an instruction issue at ``t``."""
    return next((i for done, _, _, i in inflight if done + 1 == t), None)


def _chain(avail, gaps):
    """s[k] = max(s[k-1] + gaps[k], avail[k]) (s[0] = avail[0]), vectorized."""
    offs = np.cumsum(gaps)
    return np.maximum.accumulate(avail - offs) + offs


def coll_cycles(cfg, cards, words, *, overheads=Overheads(), algorithm="ring", card=True,
                op="allreduce"):
    """Cycles of a ring collective of ``words`` fp32 words (whole link beats) per card over
    ``cards``. A step sends a segment through one link and the next card takes it whole (its
    CRC checked) before it adds it or sends it on: per step the link's latency, the segment's
    beats in and then out at the line rate (a trailer beat per frame), and the engine's
    overhead. All-reduce: 2(N-1) steps of 1/N of the message (half of it each way on a
    bidirectional ring). All-gather (``op``): N-1 steps of a card's whole vector (half each
    way), and its own block's first send. The collective is done when this card's result is
    whole (the link layer keeps every frame until it is acknowledged). This is the
    small-message regime of GPT-2's decode (a few KiB); `gptfpga bench calibrate` records the error against
    the collective engine's RTL (``card=False``: the node alone, on a one-cycle memory). With
    ``card`` (the default), a COLL through the card's collective unit (``_card_coll_cycles``,
    fitted to the Verilated appliance: its one VSP port each way, the own block's copy), or
    with ``algorithm="exchange"`` the what-if above around the unit's setup and copy."""
    if cards == 1:
        return 0
    if op not in ("allreduce", "allgather"):
        raise ValueError(f"collective {op!r}")
    if algorithm not in ("ring", "exchange"):
        raise ValueError(f"collective algorithm {algorithm!r}")
    if card and algorithm == "ring":
        return _card_coll_cycles(cfg, cards, words, overheads, op)
    beat = cfg.link.data_bits // 8
    nb = beats(words, beat // 4)
    dirs = 2 if cfg.topology == "bidirectional_ring" else 1
    frame = max(1, cfg.link.chunk_bytes // beat)
    lat = cfg.link.latency_cycles

    def wire(beats):            # payload and a trailer beat per frame, at the line rate
        return (beats + -(-beats // frame)) * beat / cfg.link_bytes_per_cycle

    # (card=False: the node alone on a one-cycle memory; or the exchange what-if, not built.)
    rows = max(1, (beat // 4) // cfg.core.vector_lanes) if card else 1
    setup = dirs * (DIV_BITS + 2 + cards) + 3 if card else 0
    first, add, own = 0, 0, 0
    if algorithm == "exchange":
        # Not built, a what-if: every card's whole vector both ways, ceil((N-1)/2) steps; as an
        # all-reduce, every card then sums the N vectors in card order (one beat a cycle).
        seg, steps = nb, -(-(cards - 1) // dirs)
        add = (cards - 1) * nb if op == "allreduce" else 0
    elif op == "allgather":
        seg, steps = -(-nb // dirs), cards - 1
    else:
        seg, steps = -(-nb // (cards * dirs)), 2 * (cards - 1)
    move = max(wire(seg), seg * rows)
    if op == "allgather" or algorithm == "exchange":
        first = move
        own = nb * rows if card else 0
    return int(math.ceil(steps * (lat + overheads.coll_hop + 2 * move) + first + setup + own + add))


def _card_coll_cycles(cfg, cards, words, o, op):
    """A COLL on the VSP through the card's collective unit (``coll_cycles``' default): the
    geometry's setup, an all-gather's copy of its own block, then the ring's schedule. The VSP's
    one read port and one write port serve both ring directions, a beat at a time, R rows a beat
    (hw/core/coll.py's VspBeatReader and VspBeatWriter: R cycles a beat; R + 1 before they took
    the next beat in the cycle of the last row: ``coll_beat_gap``); a frame is taken whole (its
    CRC) before it is added to, written or sent on; a step costs the link's latency and the
    engine's time. Two bounds: the chain of a segment's first frame through every step (each
    sent on as it is written, or as its operands are read in reduce-scatter rounds, and then
    the rest of the segment behind it), and the ports' work (all-gather: the N - 1 blocks
    written, behind the first step's latency and part of the others'; all-reduce: every round's
    segment through a port in turn). Fitted to COLLs of 16 to 51,200 words on 2 to 4 Verilated
    cards of two regimes (tiny's unidirectional ring at 4 VSP rows a beat; u280x4's link, ring
    and vector lanes on a small core: a row a beat, both ways): tools/card_collectives.py's 113
    within 10.6%, 3.4% rms; the sizes GPT-2 1.5B uses on 4 u280x4 cards within 5.9%."""
    beat = cfg.link.data_bits // 8
    B = beat // 4
    nb = beats(words, B)
    dirs = 2 if cfg.topology == "bidirectional_ring" else 1
    F = max(1, cfg.link.chunk_bytes // beat)              # beats a frame
    lat = cfg.link.latency_cycles
    R = max(1, B // cfg.core.vector_lanes)                # VSP rows a beat
    port = min(dirs, o.coll_port_dirs) * (R + o.coll_beat_gap)   # a direction's beat, a port
    w = beat / cfg.link_bytes_per_cycle * (1 + 1 / F)     # a beat on the wire (and trailers)
    rate = max(w, port)
    setup = dirs * (DIV_BITS + 2 + cards) + 3
    ag = op == "allgather"
    own = o.coll_copy_row * nb * R if ag else 0
    s = -(-nb // dirs) if ag else -(-nb // (cards * dirs))  # a segment, beats a direction
    steps = cards - 1 if ag else 2 * (cards - 1)
    f = min(s, F)
    step = lat + o.coll_step + o.coll_step_port * (R + o.coll_beat_gap)
    on = min(f, o.coll_slack) * w + max(0, f - o.coll_slack) * rate   # received, written, sent on
    on_rs = f * rate                                                  # its operands read first
    sends = (cards - 2) * on + (0 if ag else (cards - 1) * on_rs)
    chain = f * port + steps * step + sends + f * w + f * port + (s - f) * rate
    if ag:
        work = step + o.coll_ag_wait * (steps - 1) * step + o.coll_ag_write * (cards - 1) * s * port
    else:
        work = step + o.coll_ar_port * (2 * cards - 1) * s * port
    return int(math.ceil(setup + own + max(chain, work)))


def simulate(cfg, programs, *, overheads=Overheads(), coll_algorithm="ring", trace=False, reuse=None,
             **what_if):
    """Run one step's programs (one per card) through the model; the COLLs synchronize the
    cards. Returns per-card figures and the step's cycles (the slowest card).
    ``coll_algorithm``: "ring" (the collective engine's) or "exchange" (a what-if). With
    ``trace``, each card's figures also hold "trace": [(pc, op, issue cycle, done cycle)].
    ``reuse``: token vectors meeting each weight tile per cycle (a what-if; default the
    config's core.reuse). ``what_if``: CardModel's what-ifs (runahead, vec_pipelined,
    decoupled, coll_pipelined)."""
    cards = len(programs)
    models = [CardModel(cfg, overheads=overheads, cards=cards, trace=trace, reuse=reuse, **what_if)
              for _ in programs]
    gens = [m.run(p) for m, p in zip(models, programs, strict=True)]
    results = [None] * cards
    waiting = [None] * cards

    def resume(i, value=None):
        try:
            waiting[i] = gens[i].send(value) if value is not None else next(gens[i])
        except StopIteration as stop:
            waiting[i], results[i] = None, stop.value

    for i in range(cards):
        resume(i)
    while any(w is not None for w in waiting):
        if any(w is None for w in waiting):
            raise ValueError("perf model: the cards' programs disagree on their COLLs")
        ready = max(w[0] for w in waiting)
        f = waiting[0][1]
        if f["hbm"] or f["cop"] not in (0, 2):
            raise ValueError("perf model: only all-reduces and all-gathers on the VSP are "
                             "modelled (the compiler's COLLs); this program has another COLL")
        op = "allreduce" if f["cop"] == 2 else "allgather"
        done = ready + 1 + coll_cycles(cfg, cards, f["n"], overheads=overheads,
                                       algorithm=coll_algorithm, op=op)
        for i in range(cards):
            resume(i, done)
    if trace:
        for r, m in zip(results, models, strict=True):
            r["trace"], r["why"] = m.trace, m.why
    return {"cycles": max(r["cycles"] for r in results), "cards": results}


def trace_table(programs, result):
    """One row per instruction and card of a traced ``simulate`` (JSON-ready): the card, pc,
    opcode, the cycle it issued and the cycle it was done, its fields, the matrix unit's
    idle cycles before it (a MATVEC's wait for its input: the decode chain's stalls), and what
    held its issue past the cycle in-order issue allowed: ``held`` (hazard, scoreboard or
    unit) and ``held_by``, the pc of the instruction it waited for (None: the read DMA's or
    the store engine's queue)."""
    rows = []
    for card, (prog, r) in enumerate(zip(programs, result["cards"], strict=True)):
        mpu_free = 0
        why = r.get("why") or [(None, None)] * len(r["trace"])
        for (pc, op, issue, done), (_, held) in zip(r["trace"], why, strict=True):
            row = {"card": card, "pc": pc, "op": op, "issue": int(issue), "done": int(done),
                   **{k: int(v) for k, v in decode(prog[pc]).fields.items()}}
            if held is not None:
                row["held"], row["held_by"] = held[0], held[1]
            if op == "MATVEC":
                row["mpu_idle_before"] = max(0, int(issue) - mpu_free)
                mpu_free = max(mpu_free, int(done))
            rows.append(row)
    return rows


def critical_chain(programs, result, card=0):
    """What one card's step waited on, from a traced ``simulate``: the chain walked back from
    the card's instruction that ends last to its first, each step to what held the
    instruction's issue (the instruction ``held_by`` names) or, where nothing did, to the one
    before it in order. Each instruction on the chain is charged the cycles from where the
    chain leaves it (the end of the instruction it held, or the issue of the one after it)
    back to where it joins its predecessor (that one's end, or its own issue), so the charges
    add up to the cycles from the first instruction's issue to the last end. Returns
    [(what, cycles, instructions)], the most cycles first; ``what`` is the opcode,
    ``VEC <op>`` or ``COLL <all-gather|all-reduce> of <n> words``."""
    rows = [r for r in trace_table(programs, result) if r["card"] == card]
    by_pc = {r["pc"]: r for r in rows}
    cycles, count = {}, {}

    def what(r):
        if r["op"] == "VEC":
            return f"VEC {VOP_BY_CODE[r['vop']]}"
        if r["op"] == "COLL":
            return f"COLL {'all-gather' if r['cop'] == 0 else 'all-reduce'} of {r['n']} words"
        return r["op"]

    cur = max(rows, key=lambda r: (r["done"], r["pc"]))
    until = cur["done"]
    while cur is not None:
        held = by_pc.get(cur.get("held_by"))
        joins = min(held["done"] if held is not None else cur["issue"], until)
        k = what(cur)
        cycles[k] = cycles.get(k, 0) + until - joins
        count[k] = count.get(k, 0) + 1
        cur, until = (held if held is not None else by_pc.get(cur["pc"] - 1)), joins
    return sorted(((k, cycles[k], count[k]) for k in cycles), key=lambda x: (-x[1], x[0]))


# -- whole generations ---------------------------------------------------------------------------
# DFX (Hong et al., MICRO'22), 4 x U280 at 200 MHz, FP16: figures read from the paper
# (../shared/references.md); decode ms per output token, prefill ms per input token.
DFX = {
    "gpt2-medium": {"decode_ms_per_token": 5.4, "prefill_ms_per_token": 5.5},
    "gpt2-xl": {"decode_ms_per_token": 6.9, "prefill_ms_per_token": 5.5},
}


class StepCosts:
    """Shapes-only compiles of one model for N cards, and the modelled cycles of its steps,
    sampled at a few positions and interpolated linearly in between (a step's cost grows
    linearly with its position: the attention over the KV cache)."""

    def __init__(self, cfg, shape, cards, *, overheads=Overheads(), coll_algorithm="ring",
                 reuse=None, max_tokens=None, streams=1):
        from .compiler import CompiledModel, check_limits
        from .model import Gpt2
        check_limits(cfg, shape, "--model-shape")
        model = Gpt2(shape, None)
        self.reuse = reuse
        self.cms = [CompiledModel(cfg, model, card=i, cards=cards, max_tokens=max_tokens, streams=streams)
                    for i in range(cards)]
        self.T, self.cfg, self.o = self.cms[0].T, cfg, overheads
        self.cards, self.shape, self.coll_algorithm = cards, shape, coll_algorithm
        self._memo = {}

    def at(self, tokens, pos0):
        """Modelled cycles of one step of ``tokens`` tokens at positions pos0 ..."""
        from .compiler.tune import tuned
        key = (tokens, pos0)
        if key not in self._memo:
            def cycles(progs):
                return simulate(self.cfg, progs, overheads=self.o, reuse=self.reuse,
                                coll_algorithm=self.coll_algorithm)["cycles"]
            progs, got = tuned(self.cms, [0] * tokens, pos0, measure=cycles)
            self._memo[key] = got if got is not None else cycles(progs)
        return self._memo[key]

    def batch_at(self, streams, pos):
        """Modelled cycles of one decode step of a batch of ``streams`` streams, each at
        position ``pos`` (CompiledModel.step_batch)."""
        key = ("batch", streams, pos)
        if key not in self._memo:
            progs = [cm.step_batch([(0, pos, s) for s in range(streams)]) for cm in self.cms]
            self._memo[key] = simulate(self.cfg, progs, overheads=self.o, reuse=self.reuse,
                                       coll_algorithm=self.coll_algorithm)["cycles"]
        return self._memo[key]

    def curve(self, tokens, first, last, samples=5, batch=None):
        """Cycles of steps at positions first .. last (inclusive, stride ``tokens``); with
        ``batch``, of decode steps of that many streams (stride 1)."""
        xs = np.arange(first, last + 1, tokens)
        pts = sorted({int(xs[round(k * (len(xs) - 1) / max(1, samples - 1))]) for k in range(samples)})
        cost = (lambda p: self.at(tokens, p)) if batch is None else (lambda p: self.batch_at(batch, p))
        return np.interp(xs, pts, [cost(p) for p in pts])


def predict(cfg, shape, *, cards, prompt, new_tokens, costs=None, overheads=Overheads(), batch=1):
    """Prefill and decode figures for ``prompt`` input tokens and ``new_tokens`` generated
    ones, as `gptfpga run` steps them: prefill in steps of T tokens, then one token per step
    (the first generated token comes out of the prefill, so ``total_ms`` is the prefill and
    ``new_tokens - 1`` decode steps; with one new token, the decode figures are those of a
    step at the prompt's end, not part of the total: at position ``prompt``, or at the last
    position, ``n_positions - 1``, when the prompt fills the model's context).

    ``batch`` > 1: that many streams of such a prompt, as `gptfpga run` with several prompts
    runs them (each prompt's prefill alone, then decode steps of every stream's token:
    ``costs`` compiled for at least that many streams). The decode figures are then per step
    (the time each stream waits for its next token) and ``decode_tokens_per_s`` counts every
    stream's tokens."""
    c = costs or StepCosts(cfg, shape, cards, overheads=overheads, streams=batch)
    T = c.T
    full = prompt // T
    pre = c.curve(T, 0, (full - 1) * T).sum() if full else 0.0
    if prompt % T:
        pre += c.at(prompt % T, full * T)
    steps = max(0, new_tokens - 1)
    many = batch if batch > 1 else None
    decode = c.curve(1, prompt, prompt + steps - 1, batch=many).sum() if steps else 0.0
    last = min(prompt, shape.n_positions - 1)
    per_tok = decode / steps if steps else (c.at(1, last) if many is None else c.batch_at(batch, last))
    clock = cfg.clock_mhz * 1e3                       # cycles per ms
    weights = _weight_bytes(shape, cfg.core.weight_bytes)
    ideal = weights / cards / cfg.hbm_bytes_per_cycle  # a card's share at the HBM's peak
    return {
        "cards": cards, "clock_mhz": cfg.clock_mhz, "prompt_tokens": prompt,
        "new_tokens": new_tokens, "tokens_per_step": T, "decode_steps": steps,
        "batch": batch,
        "prefill_cycles_per_token": round(float(pre) / prompt, 1),
        "decode_cycles_per_token": round(float(per_tok), 1),
        "prefill_ms_per_token": round(float(pre) / prompt / clock, 4),
        "decode_ms_per_token": round(float(per_tok) / clock, 4),
        # every stream's tokens together
        "decode_tokens_per_s": round(batch * 1000.0 * clock / float(per_tok), 2),
        "total_ms": round(float(batch * pre + decode) / clock, 3),
        "weight_bytes": int(weights),
        "hbm_roofline_decode_ms_per_token": round(ideal / clock, 4),
        "hbm_roofline_fraction": round(ideal / float(per_tok), 4),
    }


def _weight_bytes(shape, nbytes=2):
    """Bytes of the weight matrices a decode step streams (the four per layer and the LM head;
    ``nbytes`` a weight: 2 fp16 or int16, 1 int8), the HBM roofline's numerator."""
    d, F = shape.d_model, shape.d_ff
    per_layer = 3 * d * d + d * d + 2 * d * F
    return nbytes * (shape.n_layer * per_layer + shape.vocab * d)
