"""The matrix unit's bias banks (hw/core/mpu.py): each group's bias loaded from the VSP into
one of two banks while the previous group runs, read by the steps as they issue.
"""

from amaranth.hdl import Cat, Const, Module, Mux, Signal
from amaranth.lib import wiring
from amaranth.lib.memory import Memory
from amaranth.lib.wiring import In, Out

from hw.isa import ACC_DEPTH, MAX_TOKENS

from .cmds import MatvecCmd
from .mpu_seq import SLOT_BITS, group_rows
from .vsp import ReadPort

__all__ = ["BiasBanks"]


class BiasBanks(wiring.Component):
    """Two banks of ``ACC_DEPTH`` rows of ``reuse`` x ``lanes`` fp32 words: the bias of the group
    being issued, and the next group's, loaded group after group into alternate banks.

    A row serves one step: its ``reuse`` tokens' biases side by side. A shared bias (the
    MATVEC's one vector) is written into every token's place of the row of its row block; a
    bias per token (``btok``) into the row of its accumulator slot (row block, token group),
    token t's at place t mod ``reuse``.

    Parameters
    ----------
    lanes, vector_lanes, vsp_row_bits : int
    reuse : int
        Tokens a step (R).
    int8 : bool
        The build computes int8 tiles: a MATVEC.i8's row block is 2 x lanes rows (twice the
        VSP rows) and a row of the bank holds R / 2 tokens' biases, 2 x lanes words each.

    Members
    -------
    mv : ``In(MatvecCmd)``; active : ``In(1)``
        The MATVEC being issued (its bias, dstride, rb, group, tokens, bias_en, btok).
    begin : ``In(1)``
        A MATVEC is taken: both banks empty, loading starts over from group 0.
    r : ``Out(ReadPort)``
        VSP reads of the bias.
    block, slot : ``In(SLOT_BITS)``
        Row block of the issuing step in its group, and its accumulator slot.
    data : ``Out(32 * lanes * reuse)``
        Its bias row from the issuing bank: a synchronous read, valid one cycle after issue.
    ready : ``Out(1)``
        The issuing bank is loaded.
    free : ``In(1)``
        The issuing group's last step issues: its bank empties, the next bank issues.
    """

    def __init__(self, *, lanes, vector_lanes, vsp_row_bits, reuse=1, int8=False):
        self._lanes, self._vlanes, self._reuse, self._int8 = lanes, vector_lanes, reuse, int8
        super().__init__({
            "mv": In(MatvecCmd), "active": In(1), "begin": In(1),
            "r": Out(ReadPort(vsp_row_bits, vector_lanes)),
            "block": In(SLOT_BITS), "slot": In(SLOT_BITS), "data": Out(32 * lanes * reuse),
            "ready": Out(1), "free": In(1),
        })

    def elaborate(self, platform):
        m = Module()
        P, L, R, mv = self._vlanes, self._lanes, self._reuse, self.mv
        rshift = (R - 1).bit_length()
        lpr = L // P                              # VSP rows per bias row of one token
        # with i8: a row block's bias is 2 x lanes words (lprq VSP rows), R / 2 tokens a step
        i8 = mv.i8 if self._int8 else Const(0, 1)
        lprq = Mux(i8, 2 * lpr, lpr) if self._int8 else lpr
        m.submodules.mem = mem = Memory(shape=32 * L * R, depth=2 * ACC_DEPTH, init=[])
        bw = mem.write_port(granularity=32)
        br = mem.read_port(transparent_for=())
        btok = mv.bias_en & mv.btok
        bank = Signal()                  # bank of the group being issued
        bank_ready = Signal(2)
        m.d.comb += [br.addr.eq(Cat(Mux(btok, self.slot, self.block), bank)), br.en.eq(1),
                     self.data.eq(br.data), self.ready.eq(bank_ready.bit_select(bank, 1))]

        # The loader: a group's VSP rows into its bank. Requests walk row block, token (btok),
        # VSP row of the token's bias row; the responses come back in order and walk the same.
        ld_active = Signal()
        ld_bank = Signal()
        ld_rows = Signal(16)             # VSP rows to read for the group
        ld_req = Signal(16)
        ld_got = Signal(16)
        ld_next_g0 = Signal(16)          # next group to load
        ld_done_all = Signal()
        ntok = Mux(btok, mv.tokens, 1)   # bias rows a row block
        ds = mv.dstride                  # VSP rows from one token's bias to the next
        # the request side: its row block's first VSP row, its token's, its place in that
        q_rbase = Signal(len(self.r.req.payload))
        q_tbase = Signal(len(self.r.req.payload))
        q_sub = Signal(range(max(2 * lpr if self._int8 else lpr, 2)))
        q_t = Signal(range(MAX_TOKENS))
        m.d.comb += [self.r.req.valid.eq(ld_active & (ld_req < ld_rows)),
                     self.r.req.payload.eq(q_tbase + q_sub)]
        with m.If(self.r.req.valid & self.r.req.ready):
            m.d.sync += ld_req.eq(ld_req + 1)
            with m.If(q_sub != lprq - 1):
                m.d.sync += q_sub.eq(q_sub + 1)
            with m.Else():
                m.d.sync += q_sub.eq(0)
                with m.If(q_t != ntok - 1):
                    m.d.sync += [q_t.eq(q_t + 1), q_tbase.eq(q_tbase + ds)]
                with m.Else():
                    m.d.sync += [q_t.eq(0), q_rbase.eq(q_rbase + lprq), q_tbase.eq(q_rbase + lprq)]
        # the response side: the bank row (block, or slot with btok) and the place in it
        g_srow = Signal(SLOT_BITS + 1)   # bank row of the row block's first token group
        g_row = Signal(SLOT_BITS + 1)
        g_sub = Signal(range(max(2 * lpr if self._int8 else lpr, 2)))
        g_t = Signal(range(MAX_TOKENS))
        ntg = Mux(btok, (mv.tokens + (R - 1)) >> rshift, 1)      # bank rows a row block
        place = Const(0, 1) if R == 1 else g_t[0:rshift]
        last_place = place == R - 1
        words = ((1 << P) - 1)
        one = Signal(L * R)              # btok: the token's place only
        every = Signal(L * R)            # shared: every token's place
        one16 = Const(words, L * R) << (place * L + g_sub * P)
        every16 = Cat(*([(Const(words, L) << (g_sub * P))[0:L]] * R))
        if self._int8:                   # R / 2 places of 2 x lanes words
            h = rshift - 1
            place8 = Const(0, 1) if h == 0 else g_t[0:h]
            ntg = Mux(i8, Mux(btok, (mv.tokens + (R // 2 - 1)) >> h, 1), ntg)
            last_place = Mux(i8, place8 == R // 2 - 1, last_place)
            one16 = Mux(i8, Const(words, L * R) << (place8 * (2 * L) + g_sub * P), one16)
            every16 = Mux(i8, Cat(*([(Const(words, 2 * L) << (g_sub * P))[0:2 * L]] * (R // 2))),
                          every16)
        m.d.comb += [one.eq(one16), every.eq(every16)]
        m.d.comb += [bw.addr.eq(Cat(g_row[0:SLOT_BITS], ld_bank)),
                     bw.data.eq(Cat(*([self.r.resp.payload] * (lpr * R)))),
                     bw.en.eq(Mux(self.r.resp.valid, Mux(btok, one, every), 0))]
        with m.If(self.r.resp.valid):
            m.d.sync += ld_got.eq(ld_got + 1)
            with m.If(g_sub != lprq - 1):
                m.d.sync += g_sub.eq(g_sub + 1)
            with m.Else():
                m.d.sync += g_sub.eq(0)
                with m.If(g_t != ntok - 1):
                    m.d.sync += g_t.eq(g_t + 1)
                    if R > 1:
                        with m.If(last_place):
                            m.d.sync += g_row.eq(g_row + 1)
                    else:
                        m.d.sync += g_row.eq(g_row + 1)
                with m.Else():
                    m.d.sync += [g_t.eq(0), g_srow.eq(g_srow + ntg), g_row.eq(g_srow + ntg)]
        with m.If(self.active & mv.bias_en & ~ld_active & ~ld_done_all &
                  ~bank_ready.bit_select(ld_bank, 1)):
            base = mv.bias + ld_next_g0 * lprq
            m.d.sync += [ld_active.eq(1), ld_req.eq(0), ld_got.eq(0),
                         ld_rows.eq(group_rows(mv, ld_next_g0) * lprq * ntok),
                         q_rbase.eq(base), q_tbase.eq(base), q_sub.eq(0), q_t.eq(0),
                         g_srow.eq(0), g_row.eq(0), g_sub.eq(0), g_t.eq(0)]
        # After a load finishes, move on to the next group and bank.
        with m.If(ld_active & (ld_got == ld_rows)):
            nxt = ld_next_g0 + group_rows(mv, ld_next_g0)
            m.d.sync += [ld_active.eq(0), bank_ready.bit_select(ld_bank, 1).eq(1),
                         ld_next_g0.eq(nxt), ld_bank.eq(~ld_bank), ld_done_all.eq(nxt >= mv.rb)]

        with m.If(self.free):
            m.d.sync += [bank_ready.bit_select(bank, 1).eq(0), bank.eq(~bank)]
        with m.If(self.begin):
            m.d.sync += [bank.eq(0), bank_ready.eq(0), ld_active.eq(0), ld_bank.eq(0),
                         ld_next_g0.eq(0), ld_done_all.eq(0), ld_got.eq(0), ld_rows.eq(0)]
        return m
