"""The matrix unit's step sequencer (hw/core/mpu.py): a MATVEC's (tile, token group) steps in
the stream order, one per cycle when nothing forbids it. A token group is ``reuse`` (R)
consecutive tokens that meet the tile in the same step (the last group of a MATVEC may have
fewer).

A step may not issue while (a) it starts a tile and the weight FIFO has none, (b) it updates an
accumulator slot whose last update is still in the pipeline, (c) it ends a row and the output
FIFO has no room reserved for it, (d) its group's bias is not loaded yet.
"""

from amaranth.hdl import Cat, Const, Module, Mux, Signal
from amaranth.lib import data, stream, wiring
from amaranth.lib.wiring import In, Out

from hw.isa import ACC_DEPTH, MAX_TOKENS

from .cmds import MatvecCmd

__all__ = ["SLOT_BITS", "step_layout", "group_rows", "SlotWindow", "MpuSequencer"]

SLOT_BITS = (ACC_DEPTH - 1).bit_length()     # an accumulator slot (hw.isa.ACC_DEPTH of them)


def step_layout(row_bits, reuse=1, int8=False, phases=1, int16=False):
    """What a step carries down the pipeline (with ``int8``, an integer-weight build: its mode
    and row block, which picks its rows' scales; with ``int16`` its MATVEC's tt, the array
    transposing a cache tile's rows itself, and with ``phases`` > 1 the cycle's phase of a
    cache tile). These are set in every cycle, valid or not."""
    # (the integer fields last: the accumulators take the rest)
    extra = {"i8": 1, "block": SLOT_BITS} if int8 or int16 else {}
    if int16:
        extra["tt"] = 1
    if phases > 1:
        extra["phase"] = (phases - 1).bit_length()
    return data.StructLayout({
        "valid": 1,
        "first": 1,             # first column block: start from the bias (or -0), not the slot
        "last": 1,              # last column block: the sum is final, to the output FIFO
        "end": 1,               # the MATVEC's last output
        "slot": SLOT_BITS,      # accumulator slot (row block, token group)
        "rows": data.ArrayLayout(row_bits, reuse),  # VSP row of each token's output
        "n": reuse.bit_length(),  # tokens in the group (the first n of the reuse)
        "bias_en": 1,
        **extra,
    })


def group_rows(mv, start):
    """Row blocks of the group that starts at row block ``start`` (comb)."""
    return Mux(mv.rb - start < mv.group, mv.rb - start, mv.group)


class SlotWindow(wiring.Component):
    """The accumulator slots updated by the steps of the last ``window`` cycles.

    A step issued in cycle s reads its slot ahead of stage X and writes it back ADD cycles
    later; a later step on the same slot must read after that write, so it waits while the slot
    was updated in the last ``Fp32Add.LATENCY + 1`` cycles (``window``).

    Parameters
    ----------
    window : int

    Members
    -------
    slot : ``In(SLOT_BITS)``
        The slot of the step being issued.
    update : ``In(1)``
        It issues this cycle and will update its slot (not the last column block).
    hazard : ``Out(1)``
        ``slot`` was updated by one of the last ``window`` steps (a shift register of slots,
        bubbles shifting in as invalid).
    """

    slot: In(SLOT_BITS)
    update: In(1)
    hazard: Out(1)

    def __init__(self, *, window):
        self._window = window
        super().__init__()

    def elaborate(self, platform):
        m = Module()
        recent = [Signal(SLOT_BITS + 1, name=f"recent{i}") for i in range(self._window)]
        m.d.sync += recent[0].eq(Cat(self.slot, self.update))
        for i in range(1, self._window):
            m.d.sync += recent[i].eq(recent[i - 1])
        hazard = Const(0, 1)
        for r in recent:
            hazard = hazard | (r[SLOT_BITS] & (r[0:SLOT_BITS] == self.slot))
        m.d.comb += self.hazard.eq(hazard)
        return m


class MpuSequencer(wiring.Component):
    """Issues a MATVEC's steps: groups of row blocks; within a group, column block by column
    block; within that, row block by row block; each tile used by every token group in turn
    (``reuse`` tokens a step).

    Back to back: the next MATVEC is taken as soon as this one has issued its last step; the
    steps still in the pipeline carry everything they need (slot, row, bias), and each
    MATVEC's last output, marked ``end``, signals its completion in order.

    Parameters
    ----------
    lanes, width, vector_lanes : int
    vsp_row_bits, xb_row_bits : int
    window : int
        ``SlotWindow``'s.
    reuse : int
        Tokens per step (R).
    int8 : bool
        The build computes int8 tiles (MATVEC.i8): such a MATVEC's step takes R / 2 tokens
        (a token's two rows of each lane: its 2 x lanes rows, output as two row blocks of
        lanes rows, ``rows[2 t]`` and ``rows[2 t + 1]``), and each group starts with a pop
        of its scale row (``scale``: the tile goes to the scale register, no step issues).
    int16 : bool
        The build computes int16 tiles (MATVEC.i8 of an int16 build): R tokens a step as
        fp16's, each group's scale row popped before its tiles as int8's.
    phases : int
        With ``int16``: a step of an fp16 tile (a K or V cache's) takes ``phases``
        consecutive cycles, phase 0 .. phases - 1 (``s1.phase``), its tile and XB rows held:
        the checks are made, the tile popped and the output claimed in phase 0, the step's
        metadata is valid, its slot updated and the loop advanced in the last phase
        (``DotArrayI16``: the result follows the last phase).

    Members
    -------
    cmd : ``In(stream.Signature(MatvecCmd))``
    mv : ``Out(MatvecCmd)``
        The MATVEC being issued (registered when taken).
    active : ``Out(1)``
        Steps of ``mv`` are left to issue (or the last just issued).
    begin : ``Out(1)``
        Pulse: a MATVEC is taken.
    tile_valid : ``In(1)``
        The weight FIFO has a tile.
    credit : ``In(1)``
        The output FIFO has room for one more row (``OutWriter.credit``).
    bias_ready : ``In(1)``
        The issuing group's bias bank is loaded.
    step : ``Out(1)``
        A step issues (combinational).
    pop : ``Out(1)``
        It starts a tile: the weight FIFO's tile is taken.
    claim : ``Out(1)``
        It ends a row (reserves room in the output FIFO).
    group_done : ``Out(1)``
        It is its group's last (the group's bias bank is free).
    xrow : ``Out(ArrayLayout(xb_row_bits, reuse))``
        XB row of each token's input block (read at issue; past the group's tokens: unused).
    block, slot : ``Out(SLOT_BITS)``
        Its row block in the group and its accumulator slot (the bias bank's row, read at
        issue: the block's for a shared bias, the slot's for one per token).
    s1 : ``Out(step_layout(vsp_row_bits, reuse))``
        The step's metadata, registered: valid one cycle after issue (stage 1).
    starve : ``Out(1)``
        A step waits for a tile.
    scale : ``Out(1)``  (with ``int8``)
        The pop is a group's scale row (combinational, with ``pop``).
    """

    def __init__(self, *, lanes, width, vector_lanes, vsp_row_bits, xb_row_bits, window, reuse=1,
                 int8=False, int16=False, phases=1):
        assert not (int8 and int16) and (int16 or phases == 1)
        self._lanes, self._width, self._vlanes = lanes, width, vector_lanes
        self._window, self._reuse, self._int8 = window, reuse, int8
        self._int16, self._phases = int16, phases
        qw = int8 or int16
        super().__init__({
            **({"scale": Out(1)} if qw else {}),
            "cmd": In(stream.Signature(MatvecCmd)),
            "mv": Out(MatvecCmd), "active": Out(1), "begin": Out(1),
            "tile_valid": In(1), "credit": In(1), "bias_ready": In(1),
            "step": Out(1), "pop": Out(1), "claim": Out(1), "group_done": Out(1),
            "xrow": Out(data.ArrayLayout(xb_row_bits, reuse)), "block": Out(SLOT_BITS),
            "slot": Out(SLOT_BITS),
            "s1": Out(step_layout(vsp_row_bits, reuse, qw, phases, int16)),
            "starve": Out(1),
        })

    def elaborate(self, platform):
        m = Module()
        mv, step, R = self.mv, self.step, self._reuse
        rshift = (R - 1).bit_length()
        lpr = self._lanes // self._vlanes           # VSP rows per output row block
        g0 = Signal(16)          # first row block of the current group
        gs = Signal(9)           # row blocks in the current group
        c = Signal(MatvecCmd["cb"].width)
        ri = Signal(8)           # row block within the group
        t = Signal(range(MAX_TOKENS))          # first token of the step's group
        ntg = Signal(range(MAX_TOKENS + 1))    # token groups of the MATVEC: ceil(tokens / tokens a step)
        issued_all = Signal()
        # int8 (MATVEC.i8): R / 2 tokens a step, each a pair of the R products and two row
        # blocks of output; a scale row popped before each group's tiles (int16: the scale
        # row, R tokens a step)
        qw = self._int8 or self._int16
        i8 = mv.i8 if qw else Const(0, 1)
        need_scale = Signal()    # the group's scale row is still to be popped
        tstep = Mux(i8, R // 2, R) if self._int8 else R
        tgroup = Mux(i8, t >> max(rshift - 1, 0), t >> rshift) if self._int8 else t >> rshift
        # int16's fp16 (cache) tiles: a step over `phases` cycles; `ph` its phase, `held` in
        # phases 1 .. phases - 1 (the step goes on whatever else happens), `fin` its last
        Ph = self._phases
        if Ph > 1:
            ph = Signal(range(Ph))
            held = ph != 0
        else:
            ph, held = Const(0, 1), Const(0, 1)

        # The step's place, and what may hold it back.
        m.submodules.window = window = SlotWindow(window=self._window)
        slot = (ri * ntg + tgroup)[0:SLOT_BITS]
        first_c, last_c, need_tile = c == 0, c == mv.cb - 1, t == 0
        hazard = window.hazard & ~first_c       # the first column block does not read its slot
        tile_ok = ~need_tile | self.tile_valid
        bias_ok = ~mv.bias_en | self.bias_ready
        waiting = self.active & ~issued_all
        scale_pop = waiting & need_scale & self.tile_valid & ~held
        start = Signal()         # a step starts (its first, or only, cycle)
        fin = Signal()           # a step ends: its metadata valid, its slot updated, the loop on
        m.d.comb += [start.eq(waiting & ~held & ~need_scale & tile_ok & ~hazard
                              & (~last_c | self.credit) & bias_ok),
                     step.eq(start | held),
                     self.starve.eq(waiting & ~held & (need_scale | need_tile) & ~self.tile_valid),
                     self.pop.eq((start & need_tile) | scale_pop), self.claim.eq(start & last_c),
                     self.block.eq(ri[0:SLOT_BITS]), self.slot.eq(slot)]
        if Ph > 1:
            multi = ~i8                          # an fp16 tile: phases cycles
            m.d.comb += fin.eq(Mux(multi, step & (ph == Ph - 1), start))
            with m.If(step & multi):
                m.d.sync += ph.eq(Mux(ph == Ph - 1, 0, ph + 1))
            m.d.sync += self.s1.phase.eq(ph)
        else:
            m.d.comb += fin.eq(start)
        m.d.comb += [window.slot.eq(slot), window.update.eq(fin & ~last_c)]
        if qw:
            m.d.comb += self.scale.eq(scale_pop)
        xs, ds = mv.xstride, mv.dstride        # (MATVEC's addresses are rows)
        xrow0 = mv.xb + t * xs + c
        row0 = mv.dst + t * ds + (g0 + ri) * lpr
        row8 = mv.dst + t * ds + (g0 + ri) * (2 * lpr)
        for j in range(R):
            x16, r16 = xrow0 + j * xs, row0 + j * ds
            if self._int8:      # product j: token t + j / 2, row block half j mod 2
                x16 = Mux(i8, xrow0 + (j // 2) * xs, x16)
                r16 = Mux(i8, row8 + (j // 2) * ds + (j % 2) * lpr, r16)
            m.d.comb += self.xrow[j].eq(x16)
            m.d.sync += self.s1.rows[j].eq(r16)
        last_t, last_ri = t + tstep >= mv.tokens, ri == gs - 1
        ntok = Mux(last_t, mv.tokens - t, tstep)
        m.d.sync += [self.s1.valid.eq(fin), self.s1.first.eq(first_c), self.s1.last.eq(last_c),
                     self.s1.slot.eq(slot), self.s1.bias_en.eq(mv.bias_en),
                     self.s1.n.eq(Mux(i8, ntok << 1, ntok) if self._int8 else ntok),
                     self.s1.end.eq(last_t & last_ri & last_c & (g0 + gs >= mv.rb))]
        if qw:
            m.d.sync += [self.s1.i8.eq(i8), self.s1.block.eq(ri[0:SLOT_BITS])]
        if self._int16:
            m.d.sync += self.s1.tt.eq(mv.tt)

        # The loop nest: token, row block in the group, column block, group.
        m.d.comb += self.group_done.eq(fin & last_t & last_ri & last_c)
        with m.If(fin):
            m.d.sync += t.eq(Mux(last_t, 0, t + tstep))
            with m.If(last_t):
                m.d.sync += ri.eq(Mux(last_ri, 0, ri + 1))
                with m.If(last_ri):
                    m.d.sync += c.eq(Mux(last_c, 0, c + 1))
        with m.If(scale_pop):
            m.d.sync += need_scale.eq(0)
        with m.If(self.group_done):
            nxt = g0 + gs
            m.d.sync += [g0.eq(nxt), gs.eq(group_rows(mv, nxt)), need_scale.eq(i8)]
            with m.If(nxt >= mv.rb):
                m.d.sync += [issued_all.eq(1), need_scale.eq(0)]

        # The next MATVEC is taken in the cycle this one issues its last step, or when idle.
        m.d.comb += [self.cmd.ready.eq(~self.active | (issued_all & ~step)),
                     self.begin.eq(self.cmd.valid & self.cmd.ready)]
        with m.If(self.active & issued_all):
            m.d.sync += self.active.eq(0)
        with m.If(self.begin):
            p = self.cmd.payload
            ntg16 = (p.tokens + R - 1) >> rshift
            m.d.sync += [mv.eq(p), self.active.eq(1), g0.eq(0), c.eq(0), ri.eq(0), t.eq(0),
                         issued_all.eq(0), gs.eq(Mux(p.rb < p.group, p.rb, p.group)),
                         ntg.eq(Mux(p.i8, (p.tokens + R // 2 - 1) >> max(rshift - 1, 0), ntg16)
                                if self._int8 else ntg16),
                         need_scale.eq(p.i8 if qw else 0)]
        return m
