"""The matrix unit's bias banks (hw/core/mpu.py): each group's bias loaded from the VSP into
one of two banks while the previous group runs, read by the steps as they issue.
"""

from amaranth.hdl import Cat, Const, Module, Mux, Signal
from amaranth.lib import wiring
from amaranth.lib.memory import Memory
from amaranth.lib.wiring import In, Out

from hw.isa import ACC_DEPTH

from .cmds import MatvecCmd
from .mpu_seq import SLOT_BITS, group_rows
from .vsp import ReadPort

__all__ = ["BiasBanks"]


class BiasBanks(wiring.Component):
    """Two banks of ``ACC_DEPTH`` rows of ``lanes`` fp32 words: the bias of the group being
    issued, and the next group's, loaded group after group into alternate banks.

    Parameters
    ----------
    lanes, vector_lanes, vsp_row_bits : int

    Members
    -------
    mv : ``In(MatvecCmd)``; active : ``In(1)``
        The MATVEC being issued (its bias, rb, group, bias_en).
    begin : ``In(1)``
        A MATVEC is taken: both banks empty, loading starts over from group 0.
    r : ``Out(ReadPort)``
        VSP reads of the bias.
    block : ``In(SLOT_BITS)``
        Row block of the issuing step in its group.
    data : ``Out(32 * lanes)``
        Its bias row from the issuing bank: a synchronous read, valid one cycle after issue.
    ready : ``Out(1)``
        The issuing bank is loaded.
    free : ``In(1)``
        The issuing group's last step issues: its bank empties, the next bank issues.
    """

    def __init__(self, *, lanes, vector_lanes, vsp_row_bits):
        self._lanes, self._vlanes = lanes, vector_lanes
        super().__init__({
            "mv": In(MatvecCmd), "active": In(1), "begin": In(1),
            "r": Out(ReadPort(vsp_row_bits, vector_lanes)),
            "block": In(SLOT_BITS), "data": Out(32 * lanes), "ready": Out(1), "free": In(1),
        })

    def elaborate(self, platform):
        m = Module()
        P, mv = self._vlanes, self.mv
        pshift = (P - 1).bit_length()
        lpr = self._lanes // P                   # VSP rows per bias row
        m.submodules.mem = mem = Memory(shape=32 * self._lanes, depth=2 * ACC_DEPTH, init=[])
        bw = mem.write_port(granularity=32)
        br = mem.read_port(transparent_for=())
        bank = Signal()                  # bank of the group being issued
        bank_ready = Signal(2)
        m.d.comb += [br.addr.eq(Cat(self.block, bank)), br.en.eq(1), self.data.eq(br.data),
                     self.ready.eq(bank_ready.bit_select(bank, 1))]

        # The loader: a group's VSP rows into its bank, row k into bias row k // lpr.
        ld_active = Signal()
        ld_bank = Signal()
        ld_g0 = Signal(16)               # group being loaded
        ld_rows = Signal(16)             # VSP rows to read for it
        ld_req = Signal(16)
        ld_got = Signal(16)
        ld_next_g0 = Signal(16)          # next group to load
        ld_done_all = Signal()
        m.d.comb += [self.r.req.valid.eq(ld_active & (ld_req < ld_rows)),
                     self.r.req.payload.eq((mv.bias >> pshift) + ld_g0 * lpr + ld_req)]
        with m.If(self.r.req.valid & self.r.req.ready):
            m.d.sync += ld_req.eq(ld_req + 1)
        got_row = ld_got >> (lpr - 1).bit_length() if lpr > 1 else ld_got
        got_sub = ld_got[0:(lpr - 1).bit_length()] if lpr > 1 else Const(0, 1)
        m.d.comb += [bw.addr.eq(Cat(got_row[0:SLOT_BITS], ld_bank)),
                     bw.data.eq(Cat(*([self.r.resp.payload] * lpr))),
                     bw.en.eq(Mux(self.r.resp.valid, ((1 << P) - 1) << (got_sub * P), 0))]
        with m.If(self.r.resp.valid):
            m.d.sync += ld_got.eq(ld_got + 1)
        with m.If(self.active & mv.bias_en & ~ld_active & ~ld_done_all &
                  ~bank_ready.bit_select(ld_bank, 1)):
            m.d.sync += [ld_active.eq(1), ld_g0.eq(ld_next_g0), ld_req.eq(0), ld_got.eq(0),
                         ld_rows.eq(group_rows(mv, ld_next_g0) * lpr)]
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
