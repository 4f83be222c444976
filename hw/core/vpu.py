"""The vector unit: fp32 operations on VSP vectors, ``P`` elements per cycle.

One instruction at a time. An instruction is one or more *passes*; a pass reads rows of ``P``
words (operand a, and operand b unless it is broadcast, absent or the identity), pushes them
through the lanes' units at one row per cycle, and writes the results in order. Elementwise
operations are one pass from the VSP to the VSP (or to XB for CVT16); with x16 each result row
also goes through a row of fp16 converters to XB, their latency after its VSP write. Reductions are row
halving passes (VSP to an internal scratch, then scratch to scratch) followed by lane folds,
exactly as docs/isa.md defines them.

The units have no enable, so the result writes cannot wait: the VPU's write port has the
highest priority on the VSP. Reads go through the VSP arbiter and may wait; they fill small
FIFOs ahead of the lanes.
"""

from amaranth.hdl import Cat, Const, Module, Mux, Signal
from amaranth.lib import stream, wiring
from amaranth.lib.fifo import SyncFIFOBuffered
from amaranth.lib.memory import Memory
from amaranth.lib.wiring import In, Out

from hw.arith.special import Exp, Gelu, Recip, Rsqrt
from hw.arith.units import Fp32Add, Fp32Max, Fp32Mul, Fp32ToFp16
from hw.isa import BINARY_VOPS, VOPS

from .cmds import VecCmd
from .vsp import ReadPort, WritePort

__all__ = ["Vpu", "XbWrite"]

NEG_ZERO = 0x80000000
NEG_INF = 0xFF800000

# Unit types and their latencies.
UNIT_TYPES = {
    "ADD": Fp32Add.LATENCY, "MUL": Fp32Mul.LATENCY, "MAX": Fp32Max.LATENCY, "PASS": 1,
    "EXP": Exp.LATENCY, "RECIP": Recip.LATENCY, "RSQRT": Rsqrt.LATENCY, "GELU": Gelu.LATENCY,
    "CVT": Fp32ToFp16.LATENCY,
}
TYPE_CODE = {t: i for i, t in enumerate(UNIT_TYPES)}
VOP_TYPE = {"ADD": "ADD", "SUB": "ADD", "MUL": "MUL", "MAX": "MAX", "MOV": "PASS", "MASK": "PASS",
            "EXP": "EXP", "RECIP": "RECIP", "RSQRT": "RSQRT", "GELU": "GELU", "CVT16": "CVT",
            "REDSUM": "ADD", "REDMAX": "MAX"}
V = {name: code for name, (code, _, _) in VOPS.items()}


class XbWrite(wiring.Signature):
    """Write port into XB: a row of ``width`` fp16 words with a per-word enable."""

    def __init__(self, row_bits, width):
        super().__init__({"en": Out(1), "row": Out(row_bits), "mask": Out(width),
                          "data": Out(16 * width)})


class Vpu(wiring.Component):
    """Vector unit.

    Members
    -------
    cmd : ``In(stream.Signature(VecCmd))``  (only legal, checked instructions arrive here)
    done : ``Out(1)``  pulse as an instruction's last result is written
    busy : ``Out(1)``
    r_a, r_b : ``Out(ReadPort)``  VSP reads (operand a, operand b)
    w : ``Out(WritePort)``  VSP writes (must be granted at once)
    xb : ``Out(XbWrite)``
    """

    def __init__(self, *, lanes, vsp_rows, xb_words, width, red_max):
        self.P = lanes
        self.vsp_rows = vsp_rows
        self.row_bits = (vsp_rows - 1).bit_length()
        self.W = width
        self.xb_rows = xb_words // width
        self.red_max = red_max
        red_rows = -(-red_max // lanes)
        self.scratch_rows = max(1, -(-red_rows // 2))
        super().__init__({
            "cmd": In(stream.Signature(VecCmd)),
            "done": Out(1),
            "busy": Out(1),
            "r_a": Out(ReadPort(self.row_bits, lanes)),
            "r_b": Out(ReadPort(self.row_bits, lanes)),
            "w": Out(WritePort(self.row_bits, lanes)),
            "xb": Out(XbWrite(max(1, (self.xb_rows - 1).bit_length()), width)),
        })

    def elaborate(self, platform):
        m = Module()
        P = self.P
        lbits = max(1, (P - 1).bit_length())      # bits of a lane index
        shift = (P - 1).bit_length()              # word address -> row

        cmd = Signal(VecCmd)
        utype = Signal(range(len(UNIT_TYPES)))
        is_red = Signal()

        # -- pass registers ---------------------------------------------------------------
        a_vsp = Signal()            # operand a from the VSP (else the scratch)
        a_base = Signal(self.row_bits)
        b_mode = Signal(2)          # 0 none, 1 VSP rows, 2 scratch rows, 3 broadcast
        b_same = Signal()           # b is a (src2 == src1): read once, not twice from a segment
        b_base = Signal(self.row_bits)
        b_off = Signal(16)          # reductions: b row = i + b_off
        in_rows = Signal(16)
        out_rows = Signal(16)
        first = Signal()            # first reduction pass: lanes beyond n are the identity
        fold = Signal()             # lane fold pass
        fw = Signal(range(P + 1))   # fold: lanes valid in the row
        final = Signal()            # this pass writes the reduction result to dst
        target = Signal(2)          # 0 VSP dst rows, 1 XB, 2 scratch, 3 VSP dst word
        bval = Signal(32)

        ri_a = Signal(16)
        ri_b = Signal(16)
        fi = Signal(16)
        wi = Signal(16)

        # -- operand FIFOs ------------------------------------------------------------------
        fa = SyncFIFOBuffered(width=32 * P, depth=8)
        fb = SyncFIFOBuffered(width=32 * P, depth=8)
        m.submodules.fa = fa
        m.submodules.fb = fb
        out_a = Signal()            # a read in flight (data next cycle)
        out_b = Signal()

        # -- scratch for reductions -----------------------------------------------------------
        scratch = Memory(shape=32 * P, depth=self.scratch_rows, init=[])
        m.submodules.scratch = scratch
        s_w = scratch.write_port()
        s_ra = scratch.read_port(transparent_for=())
        s_rb = scratch.read_port(transparent_for=())

        running = Signal()          # a pass is in progress
        m.d.comb += self.busy.eq(running | self.cmd.valid)

        # b row for feed row i: needed?  (reductions: only while i + b_off < in_rows)
        def b_needed(i):
            return Mux(b_mode == 1, Mux(is_red, (i + b_off) < in_rows, 1),
                       Mux(b_mode == 2, (i + b_off) < in_rows, 0))

        # -- read issue -------------------------------------------------------------------
        can_a = running & (ri_a < out_rows) & ((fa.level + out_a) < 6)
        can_b = running & (ri_b < out_rows) & ((fb.level + out_b) < 6)
        need_b_read = (b_mode == 1) | (b_mode == 2)
        issue_a = Signal()
        issue_b = Signal()
        with m.If(a_vsp):
            m.d.comb += [self.r_a.req.valid.eq(can_a), self.r_a.req.payload.eq(a_base + ri_a),
                         issue_a.eq(can_a & self.r_a.req.ready)]
        with m.Else():
            m.d.comb += [s_ra.addr.eq(ri_a), issue_a.eq(can_a)]
        m.d.comb += s_ra.en.eq(1)
        b_row_needed = b_needed(ri_b)
        with m.If(need_b_read & ~b_row_needed & can_b):
            m.d.sync += ri_b.eq(ri_b + 1)          # identity row: nothing to read
        with m.Elif(b_mode == 1):
            m.d.comb += [self.r_b.req.valid.eq(can_b),
                         self.r_b.req.payload.eq(b_base + ri_b + Mux(is_red, b_off, 0)),
                         issue_b.eq(can_b & self.r_b.req.ready)]
        with m.Elif(b_mode == 2):
            m.d.comb += [s_rb.addr.eq(ri_b + b_off), issue_b.eq(can_b)]
        m.d.comb += s_rb.en.eq(1)
        with m.If(issue_a):
            m.d.sync += ri_a.eq(ri_a + 1)
        with m.If(issue_b):
            m.d.sync += ri_b.eq(ri_b + 1)
        # Data one cycle after the read: push into the FIFOs.
        a_from_vsp = Signal()
        b_from_vsp = Signal()
        m.d.sync += [out_a.eq(issue_a), out_b.eq(issue_b), a_from_vsp.eq(a_vsp),
                     b_from_vsp.eq(b_mode == 1)]
        m.d.comb += [
            fa.w_en.eq(Mux(a_from_vsp, self.r_a.resp.valid, out_a)),
            fa.w_data.eq(Mux(a_from_vsp, self.r_a.resp.payload, s_ra.data)),
            fb.w_en.eq(out_b), fb.w_data.eq(Mux(b_from_vsp, self.r_b.resp.payload, s_rb.data)),
        ]

        # -- feed the lanes -------------------------------------------------------------------
        bn = b_needed(fi)
        feed = Signal()
        m.d.comb += feed.eq(running & (fi < out_rows) & fa.r_rdy & (~bn | fb.r_rdy))
        m.d.comb += [fa.r_en.eq(feed), fb.r_en.eq(feed & bn)]
        with m.If(feed):
            m.d.sync += fi.eq(fi + 1)

        ident = Mux(cmd.vop == V["REDMAX"], Const(NEG_INF, 32), Const(NEG_ZERO, 32))
        lanes_a, lanes_b = [], []
        for j in range(P):
            av = fa.r_data[32 * j:32 * (j + 1)]
            bv = fb.r_data[32 * j:32 * (j + 1)]
            idx_a = Cat(Const(j, lbits), fi)[:32] if P > 1 else fi
            idx_b = Cat(Const(j, lbits), fi + b_off)[:32] if P > 1 else fi + b_off
            a_ok = ~first | (idx_a < cmd.n)
            b_ok = bn & (~first | (idx_b < cmd.n))
            a_j = Signal(32, name=f"a{j}")
            b_j = Signal(32, name=f"b{j}")
            with m.If(fold):
                # Fold: lane j meets lane j + fw/2 of the same row.
                half = fw >> 1
                hi = Signal(32, name=f"hi{j}")
                m.d.comb += hi.eq(_lane_select(fa.r_data, j + half, P))
                m.d.comb += [a_j.eq(av), b_j.eq(Mux(j < half, hi, ident))]
            with m.Elif(is_red):
                m.d.comb += [a_j.eq(Mux(a_ok, av, ident)), b_j.eq(Mux(b_ok, bv, ident))]
            with m.Else():
                bb = Mux(b_mode == 3, bval, Mux(b_same, av, bv))
                m.d.comb += [a_j.eq(av), b_j.eq(Mux(cmd.vop == V["SUB"], bb ^ NEG_ZERO, bb))]
            lanes_a.append(a_j)
            lanes_b.append(b_j)

        # Valid chains, one per unit type (only the current type's carries valids).
        res_valid = Signal()
        chains = {}
        for t, lat in UNIT_TYPES.items():
            v = feed & (utype == TYPE_CODE[t])
            for s in range(lat):
                r = Signal(name=f"v_{t.lower()}{s}")
                m.d.sync += r.eq(v)
                v = r
            chains[t] = v
        m.d.comb += res_valid.eq(_or(chains.values()))

        results = []
        for j in range(P):
            units = {
                "ADD": Fp32Add(), "MUL": Fp32Mul(), "MAX": Fp32Max(), "EXP": Exp(),
                "RECIP": Recip(), "RSQRT": Rsqrt(), "GELU": Gelu(), "CVT": Fp32ToFp16(),
            }
            for t, u in units.items():
                m.submodules[f"{t.lower()}{j}"] = u
                m.d.comb += u.a.eq(lanes_a[j])
                if hasattr(u, "b"):
                    m.d.comb += u.b.eq(lanes_b[j])
            # PASS: MOV, or MASK (elements past k become -inf); one register.
            pas = Signal(32, name=f"pass{j}", reset_less=True)
            elem = Cat(Const(j, lbits), fi)[:32] if P > 1 else fi
            m.d.sync += pas.eq(Mux((cmd.vop == V["MASK"]) & (elem > cmd.k), NEG_INF, lanes_a[j]))
            r = Signal(32, name=f"res{j}")
            outs = {**{t: u.o for t, u in units.items()}, "PASS": pas}
            with m.Switch(utype):
                for t, code in TYPE_CODE.items():
                    with m.Case(code):
                        m.d.comb += r.eq(outs[t])
            results.append(r)
        res_row = Cat(*results)

        # -- write the results ----------------------------------------------------------------
        last_row = wi == out_rows - 1
        rem = cmd.n - (wi << shift)                   # elements left from this row on
        elem_mask = Signal(P)
        for j in range(P):
            m.d.comb += elem_mask[j].eq(~last_row | (j < rem))
        dst_row = cmd.dst >> shift
        with m.If(res_valid):
            m.d.sync += wi.eq(wi + 1)
            with m.Switch(target):
                with m.Case(0):   # VSP rows
                    m.d.comb += [self.w.req.valid.eq(1),
                                 self.w.req.payload.row.eq(dst_row + wi),
                                 self.w.req.payload.mask.eq(elem_mask),
                                 self.w.req.payload.data.eq(res_row)]
                with m.Case(1):   # XB (CVT16): P fp16 words at dst + wi * P
                    xa = cmd.dst + (wi << shift)
                    xsh = (self.W - 1).bit_length()
                    cvt = Cat(*[res[0:16] for res in results])
                    pos = xa[0:xsh] if xsh else Const(0, 1)
                    m.d.comb += [self.xb.en.eq(1), self.xb.row.eq(xa >> xsh),
                                 self.xb.data.eq(Cat(*([cvt] * (self.W // P)))),
                                 self.xb.mask.eq(elem_mask << pos)]
                with m.Case(2):   # scratch row wi
                    m.d.comb += [s_w.en.eq(1), s_w.addr.eq(wi), s_w.data.eq(res_row)]
                with m.Case(3):   # the reduction's word: lane 0 into dst
                    lane = cmd.dst[0:lbits] if P > 1 else Const(0, 1)
                    m.d.comb += [self.w.req.valid.eq(1),
                                 self.w.req.payload.row.eq(dst_row),
                                 self.w.req.payload.mask.eq(Const(1, P) << lane),
                                 self.w.req.payload.data.eq(Cat(*([results[0]] * P)))]

        # x16: the row written to the VSP also goes to XB as fp16, the converters' latency later
        # (XB's port is free then: x16 and CVT16 never share a pass, and the pass waits for it).
        XL = Fp32ToFp16.LATENCY
        x_cv = []
        for j in range(P):
            u = Fp32ToFp16()
            m.submodules[f"xcvt{j}"] = u
            m.d.comb += u.a.eq(results[j])
            x_cv.append(u.o)
        xsh = (self.W - 1).bit_length()
        x_addr = cmd.xdst + (wi << shift)
        x_v = [Signal(name=f"x_v{s}") for s in range(XL)]
        x_row = [Signal(len(self.xb.row), name=f"x_row{s}") for s in range(XL)]
        x_mask = [Signal(self.W, name=f"x_mask{s}") for s in range(XL)]
        m.d.sync += [x_v[0].eq(res_valid & cmd.x16 & (target == 0)), x_row[0].eq(x_addr >> xsh),
                     x_mask[0].eq(elem_mask << (x_addr[0:xsh] if xsh else Const(0, 1)))]
        for s in range(1, XL):
            m.d.sync += [x_v[s].eq(x_v[s - 1]), x_row[s].eq(x_row[s - 1]), x_mask[s].eq(x_mask[s - 1])]
        x_busy = _or(x_v)
        with m.If(x_v[-1]):
            m.d.comb += [self.xb.en.eq(1), self.xb.row.eq(x_row[-1]), self.xb.mask.eq(x_mask[-1]),
                         self.xb.data.eq(Cat(*([Cat(*x_cv)] * (self.W // P))))]

        # -- sequencing ------------------------------------------------------------------------
        def start_pass(**kv):
            regs = {"a_vsp": a_vsp, "a_base": a_base, "b_mode": b_mode, "b_same": b_same,
                    "b_base": b_base, "b_off": b_off, "in_rows": in_rows, "out_rows": out_rows,
                    "first": first, "fold": fold, "fw": fw, "final": final, "target": target}
            stmts = [ri_a.eq(0), ri_b.eq(0), fi.eq(0), wi.eq(0), running.eq(1)]
            kv.setdefault("b_same", 0)
            for k, v in kv.items():
                stmts.append(regs[k].eq(v))
            return stmts

        c = self.cmd.payload
        nrows_c = (c.n + (P - 1)) >> shift
        pass_done = running & (wi == out_rows) & ~res_valid & ~x_busy
        rows_left = Signal(16)      # rows in the scratch after the last row pass
        bc_wait = Signal()          # broadcast word requested, data next

        with m.FSM():
            with m.State("IDLE"):
                m.d.comb += self.cmd.ready.eq(1)
                with m.If(self.cmd.valid):
                    m.d.sync += [cmd.eq(c), is_red.eq((c.vop == V["REDSUM"]) | (c.vop == V["REDMAX"]))]
                    with m.Switch(c.vop):
                        for name, t in VOP_TYPE.items():
                            with m.Case(V[name]):
                                m.d.sync += utype.eq(TYPE_CODE[t])
                    with m.If((c.vop == V["REDSUM"]) | (c.vop == V["REDMAX"])):
                        h = (nrows_c + 1) >> 1
                        m.d.sync += start_pass(
                            a_vsp=1, a_base=c.src1 >> shift, b_mode=1, b_base=c.src1 >> shift,
                            b_off=h, in_rows=nrows_c, out_rows=h, first=1, fold=0, fw=P,
                            final=(h == 1) & (P == 1), target=Mux((h == 1) & (P == 1), 3, 2))
                        m.d.sync += rows_left.eq(h)
                        m.next = "RED"
                    with m.Elif(_binary(c.vop) & c.bcast):
                        m.next = "BCAST"
                    with m.Else():
                        same = _binary(c.vop) & (c.src2 == c.src1)
                        m.d.sync += start_pass(
                            a_vsp=1, a_base=c.src1 >> shift, b_same=same,
                            b_mode=Mux(_binary(c.vop) & ~same, 1, 0), b_base=c.src2 >> shift, b_off=0,
                            in_rows=nrows_c, out_rows=nrows_c, first=0, fold=0, fw=P, final=0,
                            target=Mux(c.vop == V["CVT16"], 1, 0))
                        m.next = "ELEM"
            with m.State("BCAST"):
                # Read the broadcast word (its own request; the b FIFO is not involved), then
                # run the elementwise pass.
                with m.If(~bc_wait):
                    m.d.comb += [self.r_b.req.valid.eq(1),
                                 self.r_b.req.payload.eq(cmd.src2 >> shift)]
                    with m.If(self.r_b.req.ready):
                        m.d.sync += bc_wait.eq(1)
                with m.If(bc_wait & self.r_b.resp.valid):
                    m.d.sync += bc_wait.eq(0)
                    lane = cmd.src2[0:lbits] if P > 1 else Const(0, 1)
                    m.d.sync += bval.eq(_lane_select(self.r_b.resp.payload, lane, P))
                    nr = (cmd.n + (P - 1)) >> shift
                    m.d.sync += start_pass(
                        a_vsp=1, a_base=cmd.src1 >> shift, b_mode=3, b_base=0, b_off=0,
                        in_rows=nr, out_rows=nr, first=0, fold=0, fw=P, final=0, target=0)
                    m.next = "ELEM"
            with m.State("ELEM"):
                with m.If(pass_done):
                    m.d.sync += running.eq(0)
                    m.d.comb += self.done.eq(1)
                    m.next = "IDLE"
            with m.State("RED"):
                with m.If(pass_done):
                    with m.If(final):
                        m.d.sync += running.eq(0)
                        m.d.comb += self.done.eq(1)
                        m.next = "IDLE"
                    with m.Elif(rows_left > 1):
                        h = (rows_left + 1) >> 1
                        last = (h == 1) & (P == 1)
                        m.d.sync += start_pass(
                            a_vsp=0, a_base=0, b_mode=2, b_base=0, b_off=h, in_rows=rows_left,
                            out_rows=h, first=0, fold=0, fw=P, final=last, target=Mux(last, 3, 2))
                        m.d.sync += rows_left.eq(h)
                    with m.Else():
                        # Lane folds: width P, P/2, ..., 2.
                        nfw = Mux(fold, fw >> 1, P)
                        m.d.sync += start_pass(
                            a_vsp=0, a_base=0, b_mode=0, b_base=0, b_off=0, in_rows=1, out_rows=1,
                            first=0, fold=1, fw=nfw, final=nfw == 2, target=Mux(nfw == 2, 3, 2))
        return m


def _binary(vop):
    """Comb: is ``vop`` a two-operand operation?"""
    return vop.matches(*BINARY_VOPS)


def _lane_select(row, lane, lanes):
    """Word ``lane`` (a comb value or int) of a row of ``lanes`` fp32 words."""
    if isinstance(lane, int):
        return row[32 * lane:32 * (lane + 1)] if lane < lanes else Const(0, 32)
    out = row[0:32]
    for j in range(1, lanes):
        out = Mux(lane == j, row[32 * j:32 * (j + 1)], out)
    return out


def _or(values):
    out = Const(0, 1)
    for v in values:
        out = out | v
    return out
