"""Decode, check and issue: the controller's in-order front end and its scoreboard.

Stage D decodes the instruction at the head of the fetch stream and evaluates every check
that depends on the instruction alone, in the order the ISS makes them (sim/ref/iss.py), so
that the first failing check gives the same status code. Stage I adds the checks that depend
on the state (tiles streamed and not yet claimed), and issues the instruction to its unit's
queue once it conflicts with no instruction still in flight.

The scoreboard holds the address ranges (VSP words, XB words, HBM stripe rows) that each
in-flight instruction reads and writes. A new instruction waits while it would write what
an older one reads or writes, or read what an older one writes. Everything else overlaps:
weight streaming for the next MATVEC while the vector unit works, a STORE beside a LOAD...

The first error stops issue; the core then lets what was issued finish (dropping weight
tiles that no MATVEC will take) and reports the error code and its pc.
"""

from amaranth.hdl import Cat, Const, Module, Mux, Signal
from amaranth.lib import data, stream, wiring
from amaranth.lib.fifo import SyncFIFO
from amaranth.lib.wiring import In, Out

from hw.isa import (
    ACC_DEPTH,
    BINARY_VOPS,
    ERROR_CODES,
    FORMAT_BY_NAME,
    FORMATS,
    MAX_TOKENS,
    OPCODES,
    REDUCE_VOPS,
    UNITS,
    VOPS,
)

from .cmds import CollCmd, DmaReadCmd, MatvecCmd, StoreCmd, VecCmd, fields
from .coll import ring_ok
from .fetch import FetchedInsn

__all__ = ["Issue", "ENTRIES"]

ENTRIES = 8
E = ERROR_CODES
SPACE_VSP, SPACE_XB, SPACE_HBM = 0, 1, 2

Range = data.StructLayout({"en": 1, "space": 2, "lo": 26, "hi": 26})
UNIT_CODE = {u: i for i, u in enumerate(UNITS)}
# Stage D's instruction kind is its opcode (0, which is illegal, once it has failed a check).
KIND = {"NONE": 0, **OPCODES}

Decoded = data.StructLayout({
    "kind": 4, "err": 4, "pc": 24, "word": 128, "need": 28, "add": 24,
    "rd1": Range, "rd2": Range, "wr": Range, "wr2": Range,
})


def _field(word, op, name):
    lsb, bits = FORMAT_BY_NAME[op].offsets()[name]
    return word[lsb:lsb + bits]


def _first(pairs):
    """Code of the first true condition of [(cond, code), ...], else 0 (comb)."""
    out = Const(0, 4)
    for cond, code in reversed(pairs):
        out = Mux(cond, code, out)
    return out


def _overlap(a, b):
    return a.en & b.en & (a.space == b.space) & (a.lo < b.hi) & (b.lo < a.hi)


class Issue(wiring.Component):
    """Members
    -------
    insn : In(stream(FetchedInsn)); exhausted : In(1); start : In(1); misaligned : In(1)
    q_<unit> : Out(stream(cmd)) per unit; done_<unit> : In(1) per unit (coll only with a ring)
    card_reg : In(32) the ``card`` register; coll_err : In(1) with coll_err_pc : In(24)
    quiet : In(1)  (every unit idle, no tile left in flight: the stop can complete)
    axi_err : In(1)  (a data access got an error response)
    finish : Out(1) pulse; status : Out(32); stopping : Out(1); running : Out(1)
    stall : Out(1); issued : Out(1)
    """

    def __init__(self, cfg):
        c = cfg.core
        self.P, self.L, self.W = c.vector_lanes, c.lanes, c.width
        self.S = cfg.stripe_bytes
        self.vsp_words, self.xb_words = c.vsp_words, c.xb_words
        self.rows = cfg.channel_rows
        self.red_max = cfg.reduce_max
        self.fifo_depth = c.weight_fifo_tiles
        self.ring = cfg.ring_links                # a collective unit is part of the card
        self.B = cfg.link.data_bits // 32
        self.units = tuple(u for u in UNITS if u != "coll" or self.ring)
        ring = {"q_coll": Out(stream.Signature(CollCmd)), "done_coll": In(1), "coll_err": In(1),
                "coll_err_pc": In(24)} if self.ring else {}
        super().__init__({
            **ring, "card_reg": In(32),
            "insn": In(stream.Signature(FetchedInsn)),
            "exhausted": In(1), "start": In(1), "misaligned": In(1),
            "q_dma_rd": Out(stream.Signature(DmaReadCmd)),
            "q_dma_wr": Out(stream.Signature(StoreCmd)),
            "q_mpu": Out(stream.Signature(MatvecCmd)),
            "q_vpu": Out(stream.Signature(VecCmd)),
            "done_dma_rd": In(1), "done_dma_wr": In(1), "done_mpu": In(1), "done_vpu": In(1),
            "quiet": In(1), "axi_err": In(1),
            "finish": Out(1), "status": Out(32), "stopping": Out(1), "running": Out(1),
            "stall": Out(1), "issued": Out(1), "retired": Out(1),
        })

    # -- stage D: decode and static checks ------------------------------------------------
    def decode(self, m, w, pc, fetch_err):
        P, L, W, S = self.P, self.L, self.W, self.S
        pl = (P - 1).bit_length()
        wl = (W - 1).bit_length()
        ll = (L - 1).bit_length()
        sl = (S - 1).bit_length()
        VW, XW, ROWS = self.vsp_words, self.xb_words, self.rows
        d = Signal(Decoded)
        op = w[0:4]
        m.d.comb += [d.pc.eq(pc), d.word.eq(w)]

        def rng(r, space, lo, hi):
            return [r.en.eq(1), r.space.eq(space), r.lo.eq(lo), r.hi.eq(hi)]

        with m.Switch(op):
            with m.Case(OPCODES["HALT"]):
                m.d.comb += d.kind.eq(KIND["HALT"])
            with m.Case(OPCODES["FENCE"]):
                m.d.comb += d.kind.eq(KIND["FENCE"])
            with m.Case(OPCODES["LOAD"]):
                f = {n: _field(w, "LOAD", n) for n in ("vsp", "n", "row", "f32")}
                nrows = ((f["n"] << Mux(f["f32"], 2, 1)) + (S - 1)) >> sl
                m.d.comb += d.kind.eq(KIND["LOAD"])
                m.d.comb += d.err.eq(_first([
                    (f["n"] == 0, E["BAD_FIELD"]),
                    (f["vsp"][0:pl] != 0 if pl else Const(0, 1), E["ALIGN"]),
                    (f["vsp"] + f["n"] > VW, E["VSP_RANGE"]),
                    (f["row"] + nrows > ROWS, E["HBM_RANGE"]),
                ]))
                m.d.comb += rng(d.rd1, SPACE_HBM, f["row"], f["row"] + nrows)
                m.d.comb += rng(d.wr, SPACE_VSP, f["vsp"], f["vsp"] + f["n"])
            with m.Case(OPCODES["STORE"]):
                f = {n: _field(w, "STORE", n) for n in
                     ("vsp", "n", "row", "off", "lepg", "lgpr", "gstride", "rstride", "f32")}
                epg = Const(1, 17) << f["lepg"]
                zl = Mux(f["f32"], 2, 1)                 # log2 of the element size
                zmis = Mux(f["f32"], f["off"][0:2] != 0, f["off"][0]) | \
                    Mux(f["f32"], f["gstride"][0:2] != 0, f["gstride"][0])
                ngroups = (f["n"] + epg - 1) >> f["lepg"]
                nrows = (ngroups + (Const(1, 17) << f["lgpr"]) - 1) >> f["lgpr"]
                span = Signal(32)
                m.d.comb += span.eq(((f["gstride"] << f["lgpr"]) - f["gstride"]) + (epg << zl) + f["off"])
                last_row = Signal(42)
                m.d.comb += last_row.eq(f["row"] + (nrows - 1) * f["rstride"])
                m.d.comb += d.kind.eq(KIND["STORE"])
                m.d.comb += d.err.eq(_first([
                    ((f["n"] == 0) | zmis | (span > S)
                     | ((f["lgpr"] != 0) & (f["gstride"] < (epg << zl)))
                     | ((nrows > 1) & (f["rstride"] == 0)), E["BAD_FIELD"]),
                    (f["vsp"][0:pl] != 0 if pl else Const(0, 1), E["ALIGN"]),
                    (f["vsp"] + f["n"] > VW, E["VSP_RANGE"]),
                    (last_row >= ROWS, E["HBM_RANGE"]),
                ]))
                m.d.comb += rng(d.rd1, SPACE_VSP, f["vsp"], f["vsp"] + f["n"])
                m.d.comb += rng(d.wr, SPACE_HBM, f["row"], last_row + 1)
            with m.Case(OPCODES["WLOAD"]):
                f = {n: _field(w, "WLOAD", n) for n in ("row", "tiles")}
                m.d.comb += d.kind.eq(KIND["WLOAD"])
                m.d.comb += d.err.eq(_first([
                    (f["tiles"] == 0, E["BAD_FIELD"]),
                    (f["row"] + f["tiles"] > ROWS, E["HBM_RANGE"]),
                ]))
                m.d.comb += rng(d.rd1, SPACE_HBM, f["row"], f["row"] + f["tiles"])
                m.d.comb += d.add.eq(f["tiles"])
            with m.Case(OPCODES["MATVEC"]):
                f = {n: _field(w, "MATVEC", n) for n in
                     ("xb", "dst", "bias", "rb", "cb", "group", "tokens", "xstride", "dstride", "bias_en")}
                T = f["tokens"]
                multi = T > 1
                rbl = f["rb"] << ll
                dspan = Signal(24)
                m.d.comb += dspan.eq((T - 1) * f["dstride"] + rbl)
                xspan = Signal(24)
                m.d.comb += xspan.eq((T - 1) * f["xstride"] + (f["cb"] << wl))
                bias_lo, bias_hi = f["bias"], f["bias"] + rbl
                dst_lo, dst_hi = f["dst"], f["dst"] + dspan
                m.d.comb += d.kind.eq(KIND["MATVEC"])
                m.d.comb += d.err.eq(_first([
                    ((f["rb"] == 0) | (f["cb"] == 0) | (f["group"] == 0) | (T == 0) | (T > MAX_TOKENS)
                     | (f["group"] * T > ACC_DEPTH) | (multi & (f["dstride"] < rbl)), E["BAD_FIELD"]),
                    ((f["xb"][0:wl] != 0) | (multi & (f["xstride"][0:wl] != 0))
                     | ((f["dst"][0:pl] != 0) | (multi & (f["dstride"][0:pl] != 0))
                        | (f["bias_en"] & (f["bias"][0:pl] != 0)) if pl else Const(0, 1)),
                     E["ALIGN"]),
                    (f["bias_en"] & ~(~multi & (f["bias"] == f["dst"]))
                     & (bias_lo < dst_hi) & (dst_lo < bias_hi), E["OVERLAP"]),
                    ((dst_hi > VW) | (f["bias_en"] & (bias_hi > VW)), E["VSP_RANGE"]),
                    (f["xb"] + xspan > XW, E["XB_RANGE"]),
                ]))
                m.d.comb += rng(d.rd1, SPACE_XB, f["xb"], f["xb"] + xspan)
                with m.If(f["bias_en"]):
                    m.d.comb += rng(d.rd2, SPACE_VSP, bias_lo, bias_hi)
                m.d.comb += rng(d.wr, SPACE_VSP, dst_lo, dst_hi)
                m.d.comb += d.need.eq(f["rb"] * f["cb"])
            with m.Case(OPCODES["VEC"]):
                f = {n: _field(w, "VEC", n) for n in
                     ("vop", "dst", "src1", "src2", "n", "k", "bcast", "x16", "xdst")}
                vop, n, bc, x16 = f["vop"], f["n"], f["bcast"], f["x16"]
                binary = vop.matches(*BINARY_VOPS)
                red = vop.matches(*REDUCE_VOPS)
                cvt = vop == VOPS["CVT16"][0]
                b_n = Mux(bc, 1, n)
                d_n = Mux(red, 1, n)
                ov = lambda a0, an, b0, bn: (a0 < b0 + bn) & (b0 < a0 + an)  # noqa: E731
                m.d.comb += d.kind.eq(KIND["VEC"])
                mis = (lambda v: v[0:pl] != 0) if pl else (lambda v: Const(0, 1))
                m.d.comb += d.err.eq(_first([
                    (vop >= len(VOPS), E["ILLEGAL_OPCODE"]),
                    ((n == 0) | (red & (n > self.red_max)) | (x16 & (red | cvt)), E["BAD_FIELD"]),
                    (mis(f["src1"]) | (binary & ~bc & mis(f["src2"])) | (~red & mis(f["dst"]))
                     | (x16 & mis(f["xdst"])), E["ALIGN"]),
                    (~red & ~cvt & ((ov(f["dst"], n, f["src1"], n) & (f["dst"] != f["src1"]))
                                   | (binary & bc & ov(f["dst"], n, f["src2"], 1))
                                   | (binary & ~bc & ov(f["dst"], n, f["src2"], n)
                                      & (f["dst"] != f["src2"]))), E["OVERLAP"]),
                    ((f["src1"] + n > VW) | (binary & (f["src2"] + b_n > VW))
                     | (~cvt & (f["dst"] + d_n > VW)), E["VSP_RANGE"]),
                    ((cvt & (f["dst"] + n > XW)) | (x16 & (f["xdst"] + n > XW)), E["XB_RANGE"]),
                ]))
                m.d.comb += rng(d.rd1, SPACE_VSP, f["src1"], f["src1"] + n)
                with m.If(binary):
                    m.d.comb += rng(d.rd2, SPACE_VSP, f["src2"], f["src2"] + b_n)
                m.d.comb += rng(d.wr, Mux(cvt, SPACE_XB, SPACE_VSP), f["dst"], f["dst"] + d_n)
                with m.If(x16):
                    m.d.comb += rng(d.wr2, SPACE_XB, f["xdst"], f["xdst"] + n)
            if self.ring:
                with m.Case(OPCODES["COLL"]):
                    f = {n: _field(w, "COLL", n) for n in ("cop", "src", "dst", "n", "hbm")}
                    lb = (self.B - 1).bit_length()
                    words = ((f["n"] + (self.B - 1)) >> lb) << lb          # nb beats of B words
                    out = Signal(30)
                    m.d.comb += out.eq(Mux(f["cop"] == 0, words * self.card_reg[8:13], words))
                    # with hbm: stripe rows of the input and of the result
                    r_in, r_out = Signal(25), Signal(25)
                    m.d.comb += [r_in.eq(((f["n"] << 2) + (S - 1)) >> sl),
                                 r_out.eq(((out << 2) + (S - 1)) >> sl)]
                    a_n = Mux(f["hbm"], r_in, f["n"])           # input and result extents
                    a_out = Mux(f["hbm"], r_out, out)
                    mis = (lambda v: v[0:pl] != 0) if pl else (lambda v: Const(0, 1))
                    m.d.comb += d.kind.eq(KIND["COLL"])
                    m.d.comb += d.err.eq(_first([
                        (~ring_ok(self.card_reg) | (f["cop"] == 3), E["ILLEGAL_OPCODE"]),
                        (f["n"] == 0, E["BAD_FIELD"]),
                        (~f["hbm"] & (mis(f["src"]) | mis(f["dst"])), E["ALIGN"]),
                        (~f["hbm"] & ((f["src"] + f["n"] > VW) | (f["dst"] + out > VW)),
                         E["VSP_RANGE"]),
                        (f["hbm"] & ((f["src"] + r_in > ROWS) | (f["dst"] + r_out > ROWS)),
                         E["HBM_RANGE"]),
                        ((f["src"] != f["dst"]) & (f["src"] < f["dst"] + a_out)
                         & (f["dst"] < f["src"] + a_n), E["OVERLAP"]),
                    ]))
                    space = Mux(f["hbm"], SPACE_HBM, SPACE_VSP)
                    m.d.comb += rng(d.rd1, space, f["src"], f["src"] + a_n)
                    m.d.comb += rng(d.wr, space, f["dst"], f["dst"] + a_out)
            with m.Default():
                m.d.comb += [d.kind.eq(KIND["NONE"]), d.err.eq(E["ILLEGAL_OPCODE"])]
        with m.If(fetch_err):
            m.d.comb += d.err.eq(E["AXI_ERROR"])
        return d

    def elaborate(self, platform):
        m = Module()
        # -- stage D ------------------------------------------------------------------------
        dec = self.decode(m, self.insn.payload.word, self.insn.payload.pc, self.insn.payload.err)
        dv = Signal()
        dq = Signal(Decoded)
        consume = Signal()           # stage I takes the instruction in dq
        m.d.comb += self.insn.ready.eq(~dv | consume)
        with m.If(self.insn.valid & self.insn.ready):
            m.d.sync += [dq.eq(dec), dv.eq(1)]
        with m.Elif(consume):
            m.d.sync += dv.eq(0)

        # -- scoreboard -------------------------------------------------------------------------
        ev = Signal(ENTRIES)
        ent = [Signal(data.StructLayout({"rd1": Range, "rd2": Range, "wr": Range, "wr2": Range}),
                      name=f"ent{i}") for i in range(ENTRIES)]
        conflict = Const(0, 1)
        for i in range(ENTRIES):
            e = ent[i]
            hit = Const(0, 1)
            for wr in (dq.wr, dq.wr2):
                hit = (hit | _overlap(wr, e.rd1) | _overlap(wr, e.rd2) | _overlap(wr, e.wr)
                       | _overlap(wr, e.wr2))
            for r in (dq.rd1, dq.rd2):
                hit = hit | _overlap(r, e.wr) | _overlap(r, e.wr2)
            conflict = conflict | (ev[i] & hit)
        free = Signal(range(ENTRIES))
        any_free = ~ev.all()
        for i in reversed(range(ENTRIES)):
            with m.If(~ev[i]):
                m.d.comb += free.eq(i)
        order = {u: SyncFIFO(width=3, depth=ENTRIES) for u in self.units}
        for u, fifo in order.items():
            m.submodules[f"order_{u}"] = fifo
            done = getattr(self, f"done_{u}")
            m.d.comb += fifo.r_en.eq(done)
        clear = Signal(ENTRIES)
        for u, fifo in order.items():
            with m.If(getattr(self, f"done_{u}")):
                m.d.comb += clear.bit_select(fifo.r_data, 1).eq(1)
        empty = ~ev.any()

        # -- stage I ----------------------------------------------------------------------------
        avail = Signal(32)           # tiles streamed by WLOADs and not claimed by MATVECs
        status = Signal(32)
        state_run = Signal()
        state_stop = Signal()
        m.d.comb += [self.status.eq(status), self.stopping.eq(state_stop),
                     self.running.eq(state_run | state_stop)]
        err = Signal(4)
        kind = dq.kind
        m.d.comb += err.eq(Mux(dq.err != 0, dq.err,
                           Mux((kind == KIND["WLOAD"]) & (avail + dq.add > self.fifo_depth),
                               E["WEIGHT_OVERFLOW"],
                           Mux((kind == KIND["MATVEC"]) & (dq.need > avail), E["WEIGHT_UNDERFLOW"],
                           Mux((kind == KIND["HALT"]) & (avail != 0), E["WEIGHT_LEFTOVER"], 0)))))
        unit = Signal(range(len(UNITS)))
        with m.Switch(kind):
            for u in UNITS:
                with m.Case(*(f.opcode for f in FORMATS if f.unit == u)):
                    m.d.comb += unit.eq(UNIT_CODE[u])
        w = dq.word
        # Unit commands: the instruction's fields as they are (hw/core/cmds.py), but the read
        # DMA's, which serves LOAD and WLOAD.
        lo = lambda op, n: _field(w, op, n)  # noqa: E731
        S, sl = self.S, (self.S - 1).bit_length()
        m.d.comb += [
            self.q_dma_rd.payload.wload.eq(kind == KIND["WLOAD"]),
            self.q_dma_rd.payload.row.eq(Mux(kind == KIND["WLOAD"], lo("WLOAD", "row"), lo("LOAD", "row"))),
            self.q_dma_rd.payload.count.eq(Mux(kind == KIND["WLOAD"], lo("WLOAD", "tiles"),
                                               ((lo("LOAD", "n") << Mux(lo("LOAD", "f32"), 2, 1))
                                                + (S - 1)) >> sl)),
            self.q_dma_rd.payload.f32.eq(lo("LOAD", "f32")),
            self.q_dma_rd.payload.vsp.eq(lo("LOAD", "vsp")),
            self.q_dma_rd.payload.n.eq(lo("LOAD", "n")),
        ]
        m.d.comb += [self.q_dma_wr.payload.eq(fields(w, "STORE")),
                     self.q_mpu.payload.eq(fields(w, "MATVEC")),
                     self.q_vpu.payload.eq(fields(w, "VEC"))]
        queues = {u: getattr(self, f"q_{u}") for u in self.units}
        if self.ring:
            m.d.comb += self.q_coll.payload.eq(Cat(fields(w, "COLL"), dq.pc))
        # valid never depends on ready: `want` is everything but the queue's ready.
        q_ready = Signal()
        o_ready = Signal()
        for u, q in queues.items():
            with m.If(unit == UNIT_CODE[u]):
                m.d.comb += [q_ready.eq(q.ready), o_ready.eq(order[u].w_rdy)]
        dispatchable = kind.matches(*(f.opcode for f in FORMATS if f.unit != "ctrl"))
        want = Signal()
        go = Signal()
        m.d.comb += want.eq(state_run & dv & (err == 0) & dispatchable & ~conflict & any_free & o_ready)
        m.d.comb += go.eq(want & q_ready)
        for u, q in queues.items():
            m.d.comb += q.valid.eq(want & (unit == UNIT_CODE[u]))
            m.d.comb += [order[u].w_en.eq(go & (unit == UNIT_CODE[u])), order[u].w_data.eq(free)]
        fence_ok = state_run & dv & (err == 0) & (kind == KIND["FENCE"]) & empty
        m.d.comb += consume.eq(go | fence_ok)
        m.d.comb += [self.issued.eq(go), self.stall.eq(state_run & dv & ~consume & (err == 0))]
        with m.If(consume):
            m.d.comb += self.retired.eq(1)

        new_ev = Signal(ENTRIES)
        m.d.comb += new_ev.eq(ev & ~clear)
        with m.If(go):
            with m.Switch(free):
                for i in range(ENTRIES):
                    with m.Case(i):
                        m.d.sync += [ent[i].rd1.eq(dq.rd1), ent[i].rd2.eq(dq.rd2), ent[i].wr.eq(dq.wr),
                                     ent[i].wr2.eq(dq.wr2)]
            m.d.sync += ev.eq(new_ev | (Const(1, ENTRIES) << free))
            with m.If(kind == KIND["WLOAD"]):
                m.d.sync += avail.eq(avail + dq.add)
            with m.If(kind == KIND["MATVEC"]):
                m.d.sync += avail.eq(avail - dq.need)
        with m.Else():
            m.d.sync += ev.eq(new_ev)

        # -- run / stop ---------------------------------------------------------------------------
        coll_err = self.coll_err if self.ring else Const(0, 1)
        coll_err_pc = self.coll_err_pc if self.ring else Const(0, 24)   # (no unit: never read)

        def stop_with(code, pc):
            code = Const(code, 4) if isinstance(code, int) else code
            return [status.eq(Cat(code, Const(0, 4), pc)), state_run.eq(0), state_stop.eq(1)]

        with m.If(self.start):
            # A new run: nothing of the last one (e.g. its HALT) may stay in stage D.
            m.d.sync += [state_run.eq(1), state_stop.eq(0), avail.eq(0), status.eq(0), dv.eq(0)]
            with m.If(self.misaligned):
                m.d.sync += stop_with(E["ALIGN"], 0)
        with m.Elif(state_run):
            with m.If(self.axi_err):
                m.d.sync += stop_with(E["AXI_ERROR"], dq.pc)
            with m.Elif(coll_err):
                m.d.sync += stop_with(E["RING_ERROR"], coll_err_pc)
            with m.Elif(dv & (err != 0)):
                m.d.sync += stop_with(err, dq.pc)
            with m.Elif(dv & (kind == KIND["HALT"]) & empty):
                m.d.sync += stop_with(0, dq.pc)
                m.d.comb += self.retired.eq(1)
            with m.Elif(~dv & ~self.insn.valid & self.exhausted):
                m.d.sync += stop_with(E["PROGRAM_OVERRUN"], self.insn.payload.pc)
        with m.Elif(state_stop):
            with m.If(self.axi_err & (status[0:4] == 0)):
                m.d.sync += status[0:4].eq(E["AXI_ERROR"])
            with m.Elif(coll_err & (status[0:4] == 0)):
                m.d.sync += status.eq(Cat(Const(E["RING_ERROR"], 8), coll_err_pc))
            with m.If(empty & self.quiet):
                m.d.sync += state_stop.eq(0)
                m.d.comb += self.finish.eq(1)
        return m
