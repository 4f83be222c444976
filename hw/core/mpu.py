"""The matrix unit: ``lanes x width`` fp16 multipliers, one fp32 adder tree per lane, fp32
accumulators, fed one weight tile per cycle.

A MATVEC walks its tiles in the stream order (groups of row blocks; within a group, column
block by column block; within that, row block by row block; each tile used by every token in
turn) and issues one *step* (tile, token) per cycle. Per step, lane l computes the tree of
the ``width`` products of its tile row with the token's input block from XB, and adds that
partial sum to its accumulator slot (row block, token): the bias (or -0) on the first column
block, the slot's running sum after. After the last column block the slot's value goes to an
output FIFO, from which it is written to the VSP.

The pipelines have no enable; the step sequencer guarantees everything they need:
- a step that updates a slot waits until the slot's previous update has been written back
  (only possible when group x tokens is small);
- a step that ends a row waits for room in the output FIFO (credits);
- a step that starts a tile waits for the weight FIFO.
The bias of each group is loaded from the VSP into one of two banks while the previous group
runs, and read at step issue, then carried down the pipeline with the step.
"""

from amaranth.hdl import Cat, Const, Module, Mux, Signal
from amaranth.lib import data, stream, wiring
from amaranth.lib.fifo import SyncFIFOBuffered
from amaranth.lib.memory import Memory
from amaranth.lib.wiring import In, Out

from hw.arith.special import AdderTree
from hw.arith.units import Fp16MulFp32, Fp32Add
from hw.isa import ACC_DEPTH

from .cmds import MatvecCmd
from .vsp import ReadPort, WritePort

__all__ = ["Mpu"]

NEG_ZERO = 0x80000000



class XbRead(wiring.Signature):
    def __init__(self, row_bits, width):
        super().__init__({"addr": Out(row_bits), "data": In(16 * width)})


class Mpu(wiring.Component):
    """Matrix unit.

    Members
    -------
    cmd : ``In(stream.Signature(MatvecCmd))``  (checked instructions only)
    tiles : ``In(stream.Signature(lanes * width * 16))``  the weight FIFO's output
    xb : ``Out(XbRead)``  synchronous read, one cycle
    r_bias : ``Out(ReadPort)`` ; w_out : ``Out(WritePort)``
    done : ``Out(1)``  pulse as a MATVEC's last output is written
    busy, starve : ``Out(1)``  (starve: a step waits for a tile)
    discard : ``In(1)``  while idle, drop tiles (stopping after an error or leftover tiles)
    """

    def __init__(self, *, lanes, width, vector_lanes, vsp_rows, xb_words):
        self.L, self.W, self.P = lanes, width, vector_lanes
        self.vsp_row_bits = (vsp_rows - 1).bit_length()
        self.xb_row_bits = max(1, (xb_words // width - 1).bit_length())
        self.tree_lat = AdderTree.latency(width)
        super().__init__({
            "cmd": In(stream.Signature(MatvecCmd)),
            "tiles": In(stream.Signature(lanes * width * 16)),
            "xb": Out(XbRead(self.xb_row_bits, width)),
            "r_bias": Out(ReadPort(self.vsp_row_bits, vector_lanes)),
            "w_out": Out(WritePort(self.vsp_row_bits, vector_lanes)),
            "done": Out(1),
            "busy": Out(1),
            "starve": Out(1),
            "discard": In(1),
        })

    def elaborate(self, platform):
        m = Module()
        L, W, P = self.L, self.W, self.P
        pshift = (P - 1).bit_length()
        wshift = (W - 1).bit_length()
        lpr = L // P                                # VSP rows per output row block
        ADD = Fp32Add.LATENCY
        X = 1 + Fp16MulFp32.LATENCY + self.tree_lat  # step issue -> partial sum valid
        # Step k issued in cycle s reads its slot in cycle s + X - 1 (the accumulator's read
        # port, data in s + X) and writes it back in cycle s + X + ADD. A later step on the same
        # slot must read in a cycle after that write: it may issue at s + ADD + 2 at the
        # earliest, so it waits while the slot was updated in the last ADD + 1 cycles.
        # With group x tokens >= ADD + 2 (= 8) rotating slots this never stalls.
        WINDOW = ADD + 1

        cmd = Signal(MatvecCmd)
        active = Signal()

        # -- loop counters ----------------------------------------------------------------
        g0 = Signal(16)          # first row block of the current group
        gs = Signal(9)           # row blocks in the current group
        c = Signal(12)
        ri = Signal(8)           # row block within the group
        t = Signal(4)
        issued_all = Signal()

        # -- bias banks: two groups of up to ACC_DEPTH row blocks of L words ----------------
        bias_mem = Memory(shape=32 * L, depth=2 * ACC_DEPTH, init=[])
        m.submodules.bias_mem = bias_mem
        bw = bias_mem.write_port(granularity=32)
        br = bias_mem.read_port(transparent_for=())
        bank = Signal()                  # bank of the group being issued
        bank_ready = Signal(2)
        ld_active = Signal()
        ld_bank = Signal()
        ld_g0 = Signal(16)               # group being loaded
        ld_rows = Signal(16)             # VSP rows to read for it
        ld_req = Signal(16)
        ld_got = Signal(16)
        ld_next_g0 = Signal(16)          # next group to load
        ld_done_all = Signal()

        # -- accumulators -----------------------------------------------------------------
        acc = Memory(shape=32 * L, depth=ACC_DEPTH, init=[])
        m.submodules.acc = acc
        aw = acc.write_port()
        ar = acc.read_port(transparent_for=())

        # -- output FIFO: one entry per finished (row block, token): L words and a row ----
        out_fifo = SyncFIFOBuffered(width=32 * L + self.vsp_row_bits + 1, depth=64)
        m.submodules.out_fifo = out_fifo
        finals_in_flight = Signal(range(128))

        # -- the step being issued ------------------------------------------------------------
        slot = Signal(6)
        m.d.comb += slot.eq((ri * cmd.tokens + t)[0:6])
        first_c = c == 0
        last_c = c == cmd.cb - 1
        need_tile = t == 0
        # Slots written back by the steps of the last WINDOW cycles (bit 6: valid).
        recent = [Signal(7, name=f"recent{i}") for i in range(WINDOW)]
        hazard = Const(0, 1)
        for rr in recent:
            hazard = hazard | (rr[6] & (rr[0:6] == slot))
        hazard = hazard & ~first_c          # the first column block does not read its slot
        credit_ok = (out_fifo.level + finals_in_flight) < 60
        tile_ok = ~need_tile | self.tiles.valid
        bias_ok = ~cmd.bias_en | bank_ready.bit_select(bank, 1)
        can_step = active & ~issued_all & tile_ok & ~hazard & (~last_c | credit_ok) & bias_ok
        m.d.comb += self.starve.eq(active & ~issued_all & ~tile_ok)

        step = Signal()
        m.d.comb += step.eq(can_step)
        # recent slots shift register (bubbles shift in as invalid)
        m.d.sync += recent[0].eq(Cat(slot, step & ~last_c))
        for i in range(1, WINDOW):
            m.d.sync += recent[i].eq(recent[i - 1])

        # -- tile register, XB read, bias read ------------------------------------------------
        tile = Signal(L * W * 16, reset_less=True)
        pop = step & need_tile
        m.d.comb += self.tiles.ready.eq(pop | (~active & self.discard))
        # A transposed tile (MATVEC.tt) is put right as it is taken: element (r, c) from
        # c * L + r (a fixed permutation of the wires).
        tposed = Cat(*[self.tiles.payload[16 * (c * L + r):16 * (c * L + r + 1)]
                       for r in range(L) for c in range(W)])
        with m.If(pop):
            m.d.sync += tile.eq(Mux(cmd.tt, tposed, self.tiles.payload))
        xrow = Signal(self.xb_row_bits)
        m.d.comb += xrow.eq((cmd.xb >> wshift) + t * (cmd.xstride >> wshift) + c)
        m.d.comb += self.xb.addr.eq(xrow)
        m.d.comb += [br.addr.eq(Cat(ri[0:6], bank)), br.en.eq(1)]

        # VSP row of the output of this step's (row block, token)
        orow = Signal(self.vsp_row_bits)
        m.d.comb += orow.eq((cmd.dst >> pshift) + ((t * cmd.dstride) >> pshift) + ((g0 + ri) * lpr))

        # -- metadata down the pipeline --------------------------------------------------------
        meta = data.StructLayout({"valid": 1, "first": 1, "last": 1, "end": 1, "slot": 6,
                                  "row": self.vsp_row_bits, "bias_en": 1})
        s1 = Signal(meta)
        final_step = ((t == cmd.tokens - 1) & (ri == gs - 1) & (c == cmd.cb - 1)
                      & (g0 + gs >= cmd.rb))
        m.d.sync += [s1.valid.eq(step), s1.first.eq(first_c), s1.last.eq(last_c), s1.slot.eq(slot),
                     s1.end.eq(final_step), s1.row.eq(orow), s1.bias_en.eq(cmd.bias_en)]
        with m.If(step):
            m.d.sync += finals_in_flight.eq(finals_in_flight + last_c)

        # -- multipliers and trees (inputs at stage 1) -------------------------------------------
        partials = []
        for l in range(L):
            tr = AdderTree(W)
            m.submodules[f"tree{l}"] = tr
            for j in range(W):
                mul = Fp16MulFp32()
                m.submodules[f"mul{l}_{j}"] = mul
                k = l * W + j
                m.d.comb += [mul.a.eq(tile[16 * k:16 * (k + 1)]),
                             mul.b.eq(self.xb.data[16 * j:16 * (j + 1)]),
                             tr.a[32 * j:32 * (j + 1)].eq(mul.o)]
            partials.append(tr.o)

        # Carry metadata and the bias from stage 1 to stage X (partial sums valid).
        def delay(sig, n, name):
            for i in range(n):
                r = Signal.like(sig, name=f"{name}{i}", reset_less=not name.startswith("meta"))
                m.d.sync += r.eq(sig)
                sig = r
            return sig

        bias1 = br.data                        # read at issue, valid at stage 1
        mX = delay(s1, X - 1, "meta_x")
        biasX = delay(bias1, X - 1, "bias_x")
        # Accumulator read one cycle ahead of stage X.
        mXm1 = delay(s1, X - 2, "meta_xm") if X >= 2 else s1
        m.d.comb += [ar.addr.eq(mXm1.slot), ar.en.eq(1)]

        adders = []
        for l in range(L):
            add = Fp32Add()
            m.submodules[f"acc_add{l}"] = add
            init = Mux(mX.bias_en, biasX[32 * l:32 * (l + 1)], NEG_ZERO)
            m.d.comb += [add.a.eq(Mux(mX.first, init, ar.data[32 * l:32 * (l + 1)])),
                         add.b.eq(partials[l])]
            adders.append(add.o)
        mA = delay(mX, ADD, "meta_a")
        result = Cat(*adders)
        m.d.comb += [aw.addr.eq(mA.slot), aw.data.eq(result), aw.en.eq(mA.valid & ~mA.last)]
        m.d.comb += [out_fifo.w_en.eq(mA.valid & mA.last),
                     out_fifo.w_data.eq(Cat(result, mA.row, mA.end))]
        with m.If(mA.valid & mA.last):
            m.d.sync += finals_in_flight.eq(finals_in_flight - 1 + (step & last_c))

        # -- output writer: L/P VSP rows per entry -------------------------------------------
        wsub = Signal(range(lpr + 1))
        entry = out_fifo.r_data
        wrow = entry[32 * L:32 * L + self.vsp_row_bits]
        wend = entry[32 * L + self.vsp_row_bits]          # the last output of a MATVEC
        m.d.comb += [self.w_out.req.valid.eq(out_fifo.r_rdy),
                     self.w_out.req.payload.row.eq(wrow + wsub),
                     self.w_out.req.payload.mask.eq((1 << P) - 1)]
        sub = entry[0:32 * P]
        for k in range(1, lpr):
            sub = Mux(wsub == k, entry[32 * P * k:32 * P * (k + 1)], sub)
        m.d.comb += self.w_out.req.payload.data.eq(sub)
        with m.If(self.w_out.req.valid & self.w_out.req.ready):
            with m.If(wsub == lpr - 1):
                m.d.sync += wsub.eq(0)
                m.d.comb += [out_fifo.r_en.eq(1), self.done.eq(wend)]
            with m.Else():
                m.d.sync += wsub.eq(wsub + 1)

        # -- bias loader: group after group, into alternate banks -----------------------------
        m.d.comb += [self.r_bias.req.valid.eq(ld_active & (ld_req < ld_rows)),
                     self.r_bias.req.payload.eq((cmd.bias >> pshift) + ld_g0 * lpr + ld_req)]
        with m.If(self.r_bias.req.valid & self.r_bias.req.ready):
            m.d.sync += ld_req.eq(ld_req + 1)
        # VSP row k of the group lands in bias row k // lpr, words (k % lpr) * P ...
        got_row = ld_got >> (lpr - 1).bit_length() if lpr > 1 else ld_got
        got_sub = ld_got[0:(lpr - 1).bit_length()] if lpr > 1 else Const(0, 1)
        m.d.comb += [bw.addr.eq(Cat(got_row[0:6], ld_bank)),
                     bw.data.eq(Cat(*([self.r_bias.resp.payload] * lpr))),
                     bw.en.eq(Mux(self.r_bias.resp.valid, ((1 << P) - 1) << (got_sub * P), 0))]
        with m.If(self.r_bias.resp.valid):
            m.d.sync += ld_got.eq(ld_got + 1)
        gs_of = lambda start: Mux(cmd.rb - start < cmd.group, cmd.rb - start, cmd.group)  # noqa: E731
        with m.If(active & cmd.bias_en & ~ld_active & ~ld_done_all &
                  ~bank_ready.bit_select(ld_bank, 1)):
            m.d.sync += [ld_active.eq(1), ld_g0.eq(ld_next_g0), ld_req.eq(0), ld_got.eq(0),
                         ld_rows.eq(gs_of(ld_next_g0) * lpr)]
        # After a load finishes, move on to the next group and bank.
        ld_finish = ld_active & (ld_got == ld_rows)
        with m.If(ld_finish):
            nxt = ld_next_g0 + gs_of(ld_next_g0)
            m.d.sync += [ld_active.eq(0), bank_ready.bit_select(ld_bank, 1).eq(1),
                         ld_next_g0.eq(nxt), ld_bank.eq(~ld_bank), ld_done_all.eq(nxt >= cmd.rb)]

        # -- sequencing -------------------------------------------------------------------------
        with m.If(step):
            with m.If(t == cmd.tokens - 1):
                m.d.sync += t.eq(0)
                with m.If(ri == gs - 1):
                    m.d.sync += ri.eq(0)
                    with m.If(c == cmd.cb - 1):
                        m.d.sync += c.eq(0)
                        # group finished: free its bias bank, go to the next group
                        m.d.sync += bank_ready.bit_select(bank, 1).eq(0)
                        m.d.sync += bank.eq(~bank)
                        nxt = g0 + gs
                        m.d.sync += [g0.eq(nxt), gs.eq(gs_of(nxt))]
                        with m.If(nxt >= cmd.rb):
                            m.d.sync += issued_all.eq(1)
                    with m.Else():
                        m.d.sync += c.eq(c + 1)
                with m.Else():
                    m.d.sync += ri.eq(ri + 1)
            with m.Else():
                m.d.sync += t.eq(t + 1)

        # Back to back: the next MATVEC is taken as soon as this one has issued its last step;
        # the steps still in the pipeline carry everything they need (slot, row, bias), and
        # each MATVEC's last output, marked `end`, signals its completion in order.
        drain = (finals_in_flight != 0) | (out_fifo.level != 0) | (wsub != 0)
        m.d.comb += self.cmd.ready.eq(~active | (issued_all & ~step))
        with m.If(active & issued_all):
            m.d.sync += active.eq(0)
        with m.If(self.cmd.valid & self.cmd.ready):
            p = self.cmd.payload
            m.d.sync += [cmd.eq(p), active.eq(1), g0.eq(0), c.eq(0), ri.eq(0), t.eq(0),
                         issued_all.eq(0), bank.eq(0), bank_ready.eq(0), ld_active.eq(0),
                         ld_bank.eq(0), ld_next_g0.eq(0), ld_done_all.eq(0), ld_got.eq(0),
                         ld_rows.eq(0),
                         gs.eq(Mux(p.rb < p.group, p.rb, p.group))]
        m.d.comb += self.busy.eq(active | drain)
        return m

