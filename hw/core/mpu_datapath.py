"""The matrix unit's datapath (hw/core/mpu.py): the tile register, the block floating-point
dot products (hw/arith/dot.py), and the accumulators. No enables: the step sequencer decides
what enters, and every step's metadata rides beside its data.

    stage 0   step issues: a tile popped (a new one), XB rows and bias row read
    stage 1   the weight FIFO's registered pops; XB data, bias data, step metadata (s1)
    stage 2   tile register, XB data register, bias and metadata (s2)
    stage X   partial sums out of the dot products (X = 2 + DotArray.latency(width));
              the slot's running sum read one cycle earlier
    X + ADD   the accumulated rows: back into their slot, or (last column block) out
"""

from amaranth.hdl import Cat, Module, Mux, Signal
from amaranth.lib import data, stream, wiring
from amaranth.lib.memory import Memory
from amaranth.lib.wiring import In, Out

from hw.arith.dot import DotArray, DotArrayI16
from hw.arith.pipe import delay
from hw.arith.units import Fp32Add
from hw.isa import ACC_DEPTH, QGROUP

from .mpu_seq import SLOT_BITS, step_layout

__all__ = ["NEG_ZERO", "out_layout", "MacArray", "Accumulators"]

NEG_ZERO = 0x80000000


def out_layout(lanes, row_bits, reuse=1):
    """A finished output row block of up to ``reuse`` tokens: ``lanes`` fp32 sums and a VSP row
    for each (token j's in word ``j * lanes + l`` and ``rows[j]``), how many tokens are real
    (``n``, 1..reuse: the first ``n``), the MATVEC's last."""
    return data.StructLayout({"data": 32 * lanes * reuse,
                              "rows": data.ArrayLayout(row_bits, reuse),
                              "n": reuse.bit_length(), "end": 1})


class MacArray(wiring.Component):
    """The tile register and ``lanes`` block floating-point dot products of ``width``
    (:class:`hw.arith.dot.DotArray`: each token's input block aligned once for every lane,
    each tile row once for every token): token j's lane l partial sum of tile row l times
    token j's input block, as fp32.

    The tile register is loaded a channel's beat at a time, each part under its channel's
    registered pop from the weight FIFO (hw/core/wfifo.py), with its own registered copy of
    the transposition flag: a transposed tile (MATVEC.tt) has element (r, c) at c * lanes + r,
    a fixed permutation of the wires put right as the tile is taken.

    Parameters
    ----------
    lanes, width : int
    channels : int
        The weight FIFO's channels (the tile's parts).
    reuse : int
        Tokens that meet the tile per step (R): R input blocks, R x lanes partial sums.

    int8 : bool
        The build computes int8 tiles too (``DotArray``'s int8 mode): a group's scale row is
        popped like a tile and taken, a channel's part under its pop, into the scale register
        instead of the tile register; each step's rows' exponents are picked from it by the
        step's row block in the group.
    int16 : bool
        The build's weight tiles are int16 (:class:`hw.arith.dot.DotArrayI16`): scale rows as
        int8's, a byte a tile row; its fp16 tiles (the K and V caches) through lanes /
        ``phases`` row alignments, a step's ``phases`` cycles with the tile held. The tile
        register takes a tile as it is stored: a transposed one's rows are picked by the
        alignments (``tt`` is then the step's, at the tile register).

    Members
    -------
    head : ``In(16 * lanes * width)``; take : ``In(channels)``
        The weight FIFO's head tile and its per-channel registered pops (``WeightRead``).
    tt : ``In(1)``
        The tile being popped (the cycle before ``take``) is stored transposed; with
        ``int16``, the step at the tile register is a transposed cache tile's.
    x : ``In(16 * width * reuse)``
        The step's input blocks, token 0's in the low bits, beside the tile register.
    o : ``Out(32 * lanes * reuse)``
        The partial sums, token j's lane l in word ``j * lanes + l``,
        ``DotArray.latency(width)`` cycles after the tile register.
    scale : ``In(1)``  (with ``int8`` or ``int16``)
        The tile being popped is a scale row (as ``tt``, the cycle before ``take``).
    i8 : ``In(1)``; block : ``In(SLOT_BITS)``  (with ``int8`` or ``int16``)
        The step at the tile register: integer weights, and its row block in its group.
    phase : ``In(bits of phases - 1)``  (with ``int16`` and ``phases`` > 1)
        The cycle's phase of a cache tile's step, at the tile register.
    """

    def __init__(self, *, lanes, width, channels, reuse=1, int8=False, int16=False, phases=1):
        assert not (int8 and int16) and (int16 or phases == 1)
        self._lanes, self._width, self._channels, self._reuse = lanes, width, channels, reuse
        self._int8, self._int16, self._phases = int8, int16, phases
        if (16 * lanes * width) % channels:
            raise ValueError(f"a tile of {16 * lanes * width} bits is not {channels} channel beats")
        extra = {"scale": In(1), "i8": In(1), "block": In(SLOT_BITS)} if int8 or int16 else {}
        if phases > 1:
            extra["phase"] = In((phases - 1).bit_length())
        super().__init__({"head": In(16 * lanes * width), "take": In(channels), "tt": In(1),
                          "x": In(16 * width * reuse), "o": Out(32 * lanes * reuse), **extra})

    def elaborate(self, platform):
        m = Module()
        L, W, C, p = self._lanes, self._width, self._channels, self.head
        B = 16 * L * W // C
        tile = Signal(L * W * 16, reset_less=True)
        tposed = Cat(*[p[16 * (c * L + r):16 * (c * L + r + 1)] for r in range(L) for c in range(W)])
        # the scale row of the group being issued: 2 x lanes bytes (int8) or lanes bytes
        # (int16) for each of its row blocks, at most QGROUP of them (the ISA's limit)
        qw = self._int8 or self._int16
        eb = 16 * L if self._int8 else 8 * L     # a row block's scale bits
        sbits = eb * QGROUP
        qb = (QGROUP - 1).bit_length()           # the step's row block in its group: < QGROUP
        scales = Signal(sbits, reset_less=True) if qw else None
        e = scales.word_select(self.block[:qb], eb) if qw else None    # the step's rows' scales
        for k in range(C):
            tt = Signal(name=f"tt{k}")          # the pop's flag, one copy a channel
            m.d.sync += tt.eq(self.tt)
            part = slice(B * k, B * (k + 1))
            # (int16: as stored, the array transposes a cache tile's rows)
            taken = p[part] if self._int16 else Mux(tt, tposed[part], p[part])
            if qw:
                sc = Signal(name=f"sc{k}")      # ... and the scale row's
                m.d.sync += sc.eq(self.scale)
                with m.If(self.take[k] & ~sc):
                    m.d.sync += tile[part].eq(taken)
                if B * k < sbits:
                    spart = slice(B * k, min(B * (k + 1), sbits))
                    with m.If(self.take[k] & sc):
                        m.d.sync += scales[spart].eq(p[spart])
            else:
                with m.If(self.take[k]):
                    m.d.sync += tile[part].eq(taken)
        if self._int16:
            m.submodules.dot = dot = DotArrayI16(lanes=L, width=W, reuse=self._reuse,
                                                 aligners=L // self._phases)
            m.d.comb += [dot.w.eq(tile), dot.x.eq(self.x), self.o.eq(dot.o), dot.tt.eq(self.tt),
                         dot.cache.eq(~self.i8), dot.e.eq(e)]
            if self._phases > 1:
                m.d.comb += dot.phase.eq(self.phase)
            return m
        m.submodules.dot = dot = DotArray(lanes=L, width=W, reuse=self._reuse, int8=self._int8)
        m.d.comb += [dot.w.eq(tile), dot.x.eq(self.x), self.o.eq(dot.o)]
        if self._int8:
            m.d.comb += [dot.i8.eq(self.i8), dot.e8.eq(e)]
        return m


class Accumulators(wiring.Component):
    """The running sums: one slot of ``reuse`` x ``lanes`` fp32 words per (row block, token
    group) of a MATVEC group.

    A step's partial sums are added to its slot (to the bias, or -0, on the first column
    block: each token's bias, the same row for all unless the MATVEC has one per token); the
    sum goes back into the slot, or out after the last column block. The step's metadata and
    bias, taken at the tile register's stage, are delayed to stage X beside the arithmetic.

    Parameters
    ----------
    lanes, row_bits, reuse : int
    align : int
        Cycles from the tile register to stage X (the dot products' latency).

    Members
    -------
    meta : ``In(step_layout(row_bits, reuse))``; bias : ``In(32 * lanes * reuse)``
        The step's metadata and its tokens' bias rows at the tile register's stage.
    partial : ``In(32 * lanes * reuse)``
        Its partial sums at stage X.
    o : ``Out(stream.Signature(out_layout(lanes, row_bits, reuse), always_ready=True))``
        Finished rows (last column block), ``Fp32Add.LATENCY`` cycles after stage X.
    """

    def __init__(self, *, lanes, row_bits, align, reuse=1):
        self._lanes, self._align, self._reuse = lanes, align, reuse
        super().__init__({
            "meta": In(step_layout(row_bits, reuse)), "bias": In(32 * lanes * reuse),
            "partial": In(32 * lanes * reuse),
            "o": Out(stream.Signature(out_layout(lanes, row_bits, reuse), always_ready=True)),
        })

    def elaborate(self, platform):
        m = Module()
        L, R, n = self._lanes, self._reuse, self._align
        m.submodules.acc = acc = Memory(shape=32 * L * R, depth=ACC_DEPTH, init=[])
        aw = acc.write_port()
        ar = acc.read_port(transparent_for=())
        mX = delay(m, self.meta, n, name="meta_x")[-1]
        biasX = delay(m, self.bias, n, name="bias_x", reset_less=True)[-1]
        # The slot is read one cycle ahead of stage X.
        mXm1 = delay(m, self.meta, n - 1, name="meta_xm")[-1] if n >= 2 else self.meta
        m.d.comb += [ar.addr.eq(mXm1.slot), ar.en.eq(1)]
        sums = []
        for k in range(L * R):
            m.submodules[f"acc_add{k}"] = add = Fp32Add()
            word = slice(32 * k, 32 * (k + 1))
            init = Mux(mX.bias_en, biasX[word], NEG_ZERO)
            m.d.comb += [add.a.eq(Mux(mX.first, init, ar.data[word])), add.b.eq(self.partial[word])]
            sums.append(add.o)
        mA = delay(m, mX, Fp32Add.LATENCY, name="meta_a")[-1]
        result = Cat(*sums)
        m.d.comb += [aw.addr.eq(mA.slot), aw.data.eq(result), aw.en.eq(mA.valid & ~mA.last),
                     self.o.valid.eq(mA.valid & mA.last), self.o.payload.data.eq(result),
                     self.o.payload.rows.eq(mA.rows), self.o.payload.n.eq(mA.n),
                     self.o.payload.end.eq(mA.end)]
        return m
