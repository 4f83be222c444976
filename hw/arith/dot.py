"""Block floating-point dot products: matrix unit v2's arithmetic (docs/numerics.md).

A block of fp16 values is aligned once to its largest exponent, as two's-complement integers
(:class:`BlockAlign`); a dot product of two aligned blocks is an exact integer sum of exact
integer products (:class:`IntDot`: one DSP48E2 multiply per product, 25 x 18 bits, and an
adder tree); one rounding makes it fp32 (:class:`BfpToFp32`). In the matrix unit the
activations are aligned once per column block and shared by every lane, and a weight row
once per tile and shared by every token that meets it: the alignment is paid per block, not
per product. :class:`Fp16Dot` is one lane with both alignments, the unit the tests prove.

Widths: activations keep ``A_BITS`` = 24 magnitude bits (exact within 2^13 of their block's
largest value), weights ``B_BITS`` = 17 (exact within 2^6 of their row's largest), so that
a product is one DSP48E2 multiply (27 x 18 signed). A sum of ``width`` products has fewer
than A_BITS + B_BITS + log2(width) + 1 bits: no overflow for any width.

Every stage is a few LUT levels or one carry chain between registers; datapath registers
have no reset.

Bit-exact reference: :func:`sim.ref.arith.bfp_dot`.
"""

from amaranth.hdl import Cat, Const, Module, Mux, Signal, signed
from amaranth.lib import wiring
from amaranth.lib.wiring import In, Out

from .fp import F32_QNAN, round_pack32
from .pipe import delay, ram_delay
from .tables import A_BITS, B_BITS

__all__ = ["A_BITS", "B_BITS", "CHAIN", "chain_length", "BlockAlign", "IntDot", "BfpToFp32",
           "DotLane", "DotArray", "DotArrayI16", "Fp16Dot", "I8Dot"]

# An element's class beside its aligned value: bits of BlockAlign.flags, per element.
NAN, INF, ZERO, SIGN = range(4)


def _levels(width):
    return (width - 1).bit_length()


# Products summed along a chain of this many multipliers (a DSP48E2 column's P -> PCIN
# cascade: the adds in the DSPs' post-adders), the chains' sums by an adder tree.
CHAIN = 16


def chain_length(width):
    """The chain length a dot product of ``width`` uses: ``CHAIN``, or ``width`` if shorter."""
    return min(CHAIN, width)


def _check_chain(width, chain):
    if chain < 1 or chain & (chain - 1) or chain > width:
        raise ValueError(f"chain must be a power of two in [1, {width}], not {chain!r}")


class BlockAlign(wiring.Component):
    """Align ``width`` fp16 values to the largest exponent among them.

    ``o`` holds each value as a two's-complement integer of ``bits`` + 1 bits, truncated
    toward zero: value ~= o * 2^(e - 14 - bits); ``e`` is the block's exponent (biased, 1 for
    zeros and subnormals, and for a block with no finite nonzero value). Infinities and NaNs
    align as 0; ``flags`` carries each element's (nan, inf, zero, sign), 4 bits an element.

    Stages: unpack; one pairwise-max level of the exponents per stage; the shift distances;
    the shift; the sign. Latency ``latency(width)``.

    With ``skew`` = C > 1, element j's ``o`` comes ``j mod C`` cycles later than the others
    (``e`` and ``flags`` do not): the input skew of :class:`IntDot`'s chains of C. Its wait for
    the block's exponent is that much longer, in the same shift registers (up to 32 stages a
    LUT), so the skew costs no LUTs; the block's exponent is carried C - 1 registers further.

    Members
    -------
    a : ``In(16 * width)``, value 0 in the low bits
    o : ``Out((bits + 1) * width)``; e : ``Out(5)``; flags : ``Out(4 * width)``
    """

    def __init__(self, width, bits, *, skew=1):
        if width < 2 or width & (width - 1):
            raise ValueError(f"width must be a power of two >= 2, not {width!r}")
        if not 11 <= bits <= 32:
            raise ValueError(f"bits must be in [11, 32], not {bits!r}")
        _check_chain(width, skew)
        self.width, self.bits, self.skew = width, bits, skew
        self.LATENCY = self.latency(width)
        super().__init__({"a": In(16 * width), "o": Out((bits + 1) * width), "e": Out(5),
                          "flags": Out(4 * width)})

    @staticmethod
    def latency(width):
        return 1 + _levels(width) + 3

    def elaborate(self, platform):
        m = Module()
        W, n = self.width, self.bits
        sig, exp, neg, fl = [], [], [], []
        for j in range(W):
            h = self.a[16 * j:16 * (j + 1)]
            e, f, s = h[10:15], h[0:10], h[15]
            special = e == 0x1F
            e1 = Signal(5, name=f"e1_{j}", reset_less=True)
            m1 = Signal(11, name=f"m1_{j}", reset_less=True)
            f1 = Signal(4, name=f"f1_{j}", reset_less=True)
            m.d.sync += [e1.eq(Mux(special | (e == 0), 1, e)),
                         m1.eq(Mux(special, 0, Cat(f, e != 0))),
                         f1.eq(Cat(special & (f != 0), special & (f == 0), (e == 0) & (f == 0), s))]
            exp.append(e1)
            sig.append(m1)
            fl.append(f1)
            neg.append(f1[SIGN])
        # the block's exponent: a pairwise max per stage while the values wait
        level, k = exp, 0
        while len(level) > 1:
            nxt = []
            for i in range(0, len(level), 2):
                r = Signal(5, name=f"emax{k}_{i // 2}", reset_less=True)
                a, b = level[i], level[i + 1]
                m.d.sync += r.eq(Mux(a > b, a, b))
                nxt.append(r)
            level, k = nxt, k + 1
        lv, C = _levels(W), self.skew
        sk = [j % C for j in range(W)]
        ed = [delay(m, x, lv + sk[j], name=f"ed{j}_", reset_less=True)[-1] for j, x in enumerate(exp)]
        md = [delay(m, x, lv + 1 + sk[j], name=f"md{j}_", reset_less=True)[-1]
              for j, x in enumerate(sig)]
        fd = [delay(m, x, lv + 3, name=f"fd{j}_", reset_less=True)[-1] for j, x in enumerate(fl)]
        sd = [delay(m, x, lv + 2 + sk[j], name=f"sd{j}_", reset_less=True)[-1]
              for j, x in enumerate(neg)]
        E = level[0]
        E2 = delay(m, E, 3, name="eout", reset_less=True)
        Es = [E] + delay(m, E, C - 1, name="eskew", reset_less=True)
        outs = []
        for j in range(W):
            d = Signal(5, name=f"d{j}", reset_less=True)
            m.d.sync += d.eq(Es[sk[j]] - ed[j])
            mag = Signal(n, name=f"mag{j}", reset_less=True)
            m.d.sync += mag.eq(Cat(Const(0, n - 11), md[j]) >> d)
            o = Signal(signed(n + 1), name=f"al{j}", reset_less=True)
            m.d.sync += o.eq(Mux(sd[j], -mag, mag))
            outs.append(o)
        m.d.comb += [self.o.eq(Cat(*outs)), self.e.eq(E2[-1]), self.flags.eq(Cat(*fd))]
        return m


class IntDot(wiring.Component):
    """The exact integer dot product of two aligned blocks and IEEE's special result.

    ``a`` (``a_bits`` + 1-bit integers) times ``b`` (``b_bits`` + 1), element by element, each
    product registered once (a DSP48E2's M register), then summed along chains of ``chain``
    products: the chain's k-th multiplier adds its product to the (k-1)-th's registered sum
    (P = M + PCIN: the DSP48E2's post-adder and cascade, no LUTs), so element j must arrive
    ``j mod chain`` cycles after the others (:class:`BlockAlign`'s ``skew``); the chains'
    sums meet in a pairwise adder tree, one level per stage. ``chain`` = 1 is a plain tree.
    Beside it, the elements' classes (unskewed) give IEEE's special result of the exact
    products: NaN if a NaN or an infinity times a zero is among them, or infinities of both
    signs; else an infinity of the sign of those present.

    Members
    -------
    a, fa : the first block and its flags (BlockAlign.o, BlockAlign.flags)
    b, fb : the second
    o : ``Out(signed(sum_bits))``, ``nan``, ``pinf``, ``ninf`` : ``Out(1)``
    """

    def __init__(self, width, a_bits, b_bits, *, chain=1):
        _check_chain(width, chain)
        self.width, self.a_bits, self.b_bits, self.chain = width, a_bits, b_bits, chain
        self.sum_bits = self.bits(width, a_bits, b_bits)
        self.LATENCY = self.latency(width, chain)
        super().__init__({"a": In((a_bits + 1) * width), "fa": In(4 * width),
                          "b": In((b_bits + 1) * width), "fb": In(4 * width),
                          "o": Out(signed(self.sum_bits)), "nan": Out(1), "pinf": Out(1),
                          "ninf": Out(1)})

    @staticmethod
    def bits(width, a_bits, b_bits):
        """The sum's width: |sum| < width * 2^(a_bits + b_bits)."""
        return a_bits + b_bits + _levels(width) + 1

    @staticmethod
    def latency(width, chain=1):
        """Element 0's arrival to the sum: its product, the chain's ``chain`` sums, the tree."""
        return 1 + chain + _levels(width // chain)

    def elaborate(self, platform):
        m = Module()
        W, A, B, C = self.width, self.a_bits + 1, self.b_bits + 1, self.chain
        cbits = A + B + _levels(C)          # a chain's sum: |sum| < C * 2^(A + B - 2)
        level, ends = [], [None] * (W // C)
        pn, pp, pm = [], [], []
        for j in range(W):
            x = self.a[A * j:A * (j + 1)].as_signed()
            y = self.b[B * j:B * (j + 1)].as_signed()
            prod = Signal(signed(A + B), name=f"m{j}", reset_less=True)
            acc = Signal(signed(cbits), name=f"p{j}", reset_less=True)
            m.d.sync += prod.eq(x * y)
            c, k = divmod(j, C)
            m.d.sync += acc.eq(prod if k == 0 else ends[c] + prod)
            ends[c] = acc
            fx, fy = self.fa[4 * j:4 * (j + 1)], self.fb[4 * j:4 * (j + 1)]
            nan = fx[NAN] | fy[NAN] | (fx[INF] & fy[ZERO]) | (fy[INF] & fx[ZERO])
            inf = (fx[INF] | fy[INF]) & ~nan
            neg = fx[SIGN] ^ fy[SIGN]
            pn.append(nan)
            pp.append(inf & ~neg)
            pm.append(inf & neg)
        level, k, bits = ends, 0, cbits
        while len(level) > 1:
            bits += 1
            nxt = []
            for i in range(0, len(level), 2):
                r = Signal(signed(bits), name=f"s{k}_{i // 2}", reset_less=True)
                m.d.sync += r.eq(level[i] + level[i + 1])
                nxt.append(r)
            level, k = nxt, k + 1
        # the classes: one OR level, then carried beside the sum
        any_n, any_p, any_m = (Signal(name=n, reset_less=True) for n in ("any_nan", "any_pinf", "any_ninf"))
        m.d.sync += [any_n.eq(Cat(*pn).any()), any_p.eq(Cat(*pp).any()), any_m.eq(Cat(*pm).any())]
        cls = Signal(3, name="cls", reset_less=True)         # nan, +inf, -inf
        m.d.sync += cls.eq(Cat(any_n | (any_p & any_m), any_p, any_m))
        cls_o = delay(m, cls, self.LATENCY - 2, name="cls_d", reset_less=True)[-1]
        m.d.comb += [self.o.eq(level[0]),
                     self.nan.eq(cls_o[0]), self.pinf.eq(cls_o[1]), self.ninf.eq(cls_o[2])]
        return m


class BfpToFp32(wiring.Component):
    """An integer ``s`` worth s * 2^(e - bias) rounded to fp32 (nearest even), or the special
    result the flags name (NaN over infinity). A zero sum gives +0.

    Stages: magnitude and sign; normalization, two shift steps (32, 16, ... 1) a stage; round
    and pack. ``e`` arrives with ``s`` (any unsigned width); ``bias`` is a constant.

    Members
    -------
    s : ``In(signed(sum_bits))``; e : ``In(e_bits)`` (a width, or a signed shape); nan, pinf,
    ninf : ``In(1)``
    o : ``Out(32)``
    """

    def __init__(self, sum_bits, e_bits, bias):
        self.sum_bits, self.e_bits, self.bias = sum_bits, e_bits, bias
        n = sum_bits - 1
        if n < 25:
            raise ValueError(f"sum_bits must be at least 26, not {sum_bits}")
        self._steps = self._shifts(n)
        self.LATENCY = self.latency(sum_bits)
        super().__init__({"s": In(signed(sum_bits)), "e": In(e_bits), "nan": In(1),
                          "pinf": In(1), "ninf": In(1), "o": Out(32)})

    @staticmethod
    def _shifts(n):
        return [1 << k for k in range(5, -1, -1) if (1 << k) < n]

    @classmethod
    def latency(cls, sum_bits):
        return 1 + -(-len(cls._shifts(sum_bits - 1)) // 2) + 1

    def elaborate(self, platform):
        m = Module()
        n = self.sum_bits - 1
        cbits = n.bit_length()
        mag = Signal(n, name="mag", reset_less=True)
        sign = Signal(reset_less=True)
        e = Signal(self.e_bits, name="e1", reset_less=True)
        # (with a signed e the result may leave fp32's range: round_pack32 flushes and overflows)
        cls = Signal(3, name="cls1", reset_less=True)
        m.d.sync += [mag.eq(Mux(self.s < 0, -self.s, self.s)), sign.eq(self.s < 0), e.eq(self.e),
                     cls.eq(Cat(self.nan, self.pinf, self.ninf))]
        cnt = Const(0, cbits)
        steps = list(self._steps)
        stage = 0
        while steps:
            pair, steps = steps[:2], steps[2:]
            v, c = mag, cnt
            for k in pair:
                top = v[n - k:n] == 0
                v, c = Mux(top, Cat(Const(0, k), v[0:n - k]), v), Mux(top, c + k, c)
            mag2 = Signal(n, name=f"nrm{stage}", reset_less=True)
            cnt2 = Signal(cbits, name=f"cnt{stage}", reset_less=True)
            sign2 = Signal(name=f"sg{stage}", reset_less=True)
            e2 = Signal(self.e_bits, name=f"e_{stage}", reset_less=True)
            cls2 = Signal(3, name=f"cls_{stage}", reset_less=True)
            m.d.sync += [mag2.eq(v), cnt2.eq(c), sign2.eq(sign), e2.eq(e), cls2.eq(cls)]
            mag, cnt, sign, e, cls, stage = mag2, cnt2, sign2, e2, cls2, stage + 1
        zero = mag[n - 1] == 0            # normalized: the top bit is set unless the sum was 0
        sig = mag[n - 24:n]
        guard = mag[n - 25]
        sticky = mag[0:n - 25].any() if n > 25 else Const(0, 1)
        # sig (leading one at bit 23) is worth sig * 2^(exp - 150): exp = n - 24 - cnt + e
        # - bias + 150
        exp = Signal(signed(12), name="xexp")
        m.d.comb += exp.eq(e + (n + 126 - self.bias) - cnt)
        packed = round_pack32(m, sign=sign & ~zero, exp=exp, sig=sig, guard=guard, sticky=sticky,
                              zero=zero, inf=0, nan=0, name="pk")
        nan, pinf, ninf = cls[0], cls[1], cls[2]
        m.d.sync += self.o.eq(Mux(nan, F32_QNAN, Mux(pinf, 0x7F800000, Mux(ninf, 0xFF800000, packed))))
        return m


def _int_rows(m, rows, exps, *, width, chain, b_bits, tag):
    """Integer weight rows as a lane's products take them, past the weight alignment: each
    row's values (``width`` signed integers of at most ``b_bits`` + 1 bits, at most 16 here),
    sign-extended to the multipliers' input, with their flags (nan, inf, zero, sign) and the
    row's scale exponent ``e`` (2^(e - 127)) as a weight exponent (e - 127 + 14 + b_bits, so
    that the single rounding's constants are fp16's), each at the time BlockAlign's outputs
    have theirs: value i ``BlockAlign.latency + i mod chain`` cycles after ``rows``, flags and
    exponent ``BlockAlign.latency`` after. The values' and flags' delay lines are in block RAM
    (:func:`ram_delay`): one memory a chain position, every row's values of that position in
    it, the flags with position 0's (as SRLs they were a LUT a bit: 19 K on u280x4). Returns
    (values, flags, exponent) a row; ``exps``: each row's 8-bit scale exponent."""
    lat = BlockAlign.latency(width)
    n = len(rows)
    assert len(exps) == n and all(len(row) == width for row in rows)
    items = [(row[i], lat + i % chain) for row in rows for i in range(width)]
    items += [(Cat(row[i] == 0, row[i] < 0), lat) for row in rows for i in range(width)]  # zero, sign
    late = ram_delay(m, items, name=f"{tag}_rd")
    out = []
    for r, e in enumerate(exps):
        bs, fs = [], []
        for i in range(width):
            b = Signal(signed(b_bits + 1), name=f"{tag}{r}_b{i}")
            m.d.comb += b.eq(late[r * width + i].as_signed())             # sign-extended
            bs.append(b)
            fs.append(Cat(Const(0, 2), late[n * width + r * width + i]))    # nan inf zero sign
        eb = Signal(signed(9), name=f"{tag}{r}_eb", reset_less=True)
        m.d.sync += eb.eq(e - (127 - 14 - b_bits))
        ebd = delay(m, eb, lat - 1, name=f"{tag}{r}_ebd", reset_less=True)[-1] if lat > 1 else eb
        out.append((bs, Cat(*fs), ebd))
    return out


class DotArray(wiring.Component):
    """``lanes`` dot products of ``width`` fp16 weights each (a tile: lane l's row in ``w``)
    with ``reuse`` blocks of ``width`` fp16 activations ``x`` (one per token), every pair:
    each token's activations are aligned once for every lane, each weight row once for every
    token. Token j's lane l result is ``bfp_dot(w[l], x[j])`` (:func:`sim.ref.arith.bfp_dot`),
    ``latency(width)`` cycles later.

    With ``int8`` (a build for ``core.weight_dtype: int8``, ``reuse`` even) the array also
    computes int8 tiles, step by step as ``i8`` says: ``w`` is then ``2 * lanes`` rows of
    ``width`` int8 weights (row r at bytes [r width, (r + 1) width)), ``e8`` their scales'
    exponents (byte r: row r's scale is 2^(e - 127)), and product j of lane l is
    :func:`sim.ref.arith.i8_dot` of row ``(j mod 2) * lanes + l`` with ``x``'s block j: the
    two products of a pair (2t, 2t + 1) take one token's two rows of the lane, so the
    outputs, token t's row r in word ``2 t lanes + r``, are in the order the rows are. The
    int8 values go to the multipliers as they are, past the weight alignment (an int8 value
    is exact in the multiplier's 18-bit input), on delay lines of their own with the
    alignment's latency and skew; a 2:1 choice per multiplier input, the step's ``i8`` flag
    carried beside each element, picks them. The rows' exponents enter the single rounding
    beside the activations' (``DotLane`` with a signed weight exponent).

    Members
    -------
    w : ``In(16 * width * lanes)``, lane 0's row in the low bits
    x : ``In(16 * width * reuse)``, token 0's block in the low bits
    o : ``Out(32 * lanes * reuse)``, token j's lane l in word ``j * lanes + l``
    i8 : ``In(1)``; e8 : ``In(16 * lanes)``  (with ``int8`` only)
    """

    def __init__(self, *, lanes, width, reuse=1, a_bits=A_BITS, b_bits=B_BITS, chain=None,
                 int8=False):
        if int8 and reuse % 2:
            raise ValueError(f"int8 needs an even reuse, not {reuse!r}")
        self.lanes, self.width, self.reuse, self.int8 = lanes, width, reuse, int8
        self.a_bits, self.b_bits = a_bits, b_bits
        self.chain = chain_length(width) if chain is None else chain
        self.LATENCY = self.latency(width, a_bits, b_bits, self.chain)
        extra = {"i8": In(1), "e8": In(16 * lanes)} if int8 else {}
        super().__init__({"w": In(16 * width * lanes), "x": In(16 * width * reuse),
                          "o": Out(32 * lanes * reuse), **extra})

    @staticmethod
    def latency(width, a_bits=A_BITS, b_bits=B_BITS, chain=None):
        return BlockAlign.latency(width) + DotLane.latency(width, a_bits, b_bits, chain)

    def elaborate(self, platform):
        m = Module()
        W, L, rowbits = self.width, self.lanes, 16 * self.width
        xals = []
        for j in range(self.reuse):
            m.submodules[f"xal{j}" if self.reuse > 1 else "xal"] = xal = BlockAlign(
                W, self.a_bits, skew=self.chain)
            m.d.comb += xal.a.eq(self.x[rowbits * j:rowbits * (j + 1)])
            xals.append(xal)
        rows8 = self._int8_rows(m) if self.int8 else None
        for lane in range(L):
            m.submodules[f"wal{lane}"] = wal = BlockAlign(W, self.b_bits, skew=self.chain)
            m.d.comb += wal.a.eq(self.w[rowbits * lane:rowbits * (lane + 1)])
            if self.int8:
                sel = self._int8_select(m, lane)
            for j, xal in enumerate(xals):
                name = f"lane{lane}" if self.reuse == 1 else f"lane{lane}_t{j}"
                m.submodules[name] = dl = DotLane(W, a_bits=self.a_bits, b_bits=self.b_bits,
                                                  chain=self.chain, eb_signed=self.int8)
                k = j * L + lane
                m.d.comb += [dl.a.eq(xal.o), dl.fa.eq(xal.flags), dl.ea.eq(xal.e),
                             self.o[32 * k:32 * (k + 1)].eq(dl.o)]
                if self.int8:
                    b8, f8, e8 = rows8[(j % 2) * L + lane]
                    m.d.comb += [
                        dl.b.eq(Cat(*[Mux(sel[i % self.chain], b8[i].as_unsigned(),
                                          wal.o.word_select(i, self.b_bits + 1))
                                      for i in range(W)])),
                        dl.fb.eq(Mux(sel[0], f8, wal.flags)),
                        dl.eb.eq(Mux(sel[0], e8, wal.e))]
                else:
                    m.d.comb += [dl.b.eq(wal.o), dl.fb.eq(wal.flags), dl.eb.eq(wal.e)]
        return m

    def _int8_select(self, m, lane):
        """The step's ``i8`` flag for lane ``lane``'s multiplier inputs: ``sel[s]`` beside the
        values of skew s (``BlockAlign.latency + s`` cycles late), from a copy of the flag
        registered for the lane (its fan-out's own)."""
        lat = BlockAlign.latency(self.width)
        i8 = Signal(name=f"i8_{lane}", reset_less=True)
        m.d.sync += i8.eq(self.i8)
        chain = [i8] + delay(m, i8, lat - 2 + self.chain, name=f"i8_{lane}_d", reset_less=True)
        return [chain[lat - 1 + s] for s in range(self.chain)]

    def _int8_rows(self, m):
        """Every row of an int8 tile (row r = h * lanes + lane: lane ``lane``'s products of
        tokens with j mod 2 = h take it) as the products take it (:func:`_int_rows`)."""
        W = self.width
        rows = [[self.w[8 * (r * W + i):8 * (r * W + i + 1)].as_signed() for i in range(W)]
                for r in range(2 * self.lanes)]
        exps = [self.e8[8 * r:8 * (r + 1)] for r in range(2 * self.lanes)]
        return _int_rows(m, rows, exps, width=W, chain=self.chain, b_bits=self.b_bits, tag="q")


class DotArrayI16(wiring.Component):
    """The matrix unit's array for int16 weights (docs/performance.md, the route to R = 4):
    ``lanes`` dot products of ``width`` weights with ``reuse`` blocks of fp16 activations a
    step, as :class:`DotArray`, for two kinds of tile:

    - an *int16 tile* (``cache`` low in its cycle): ``w`` is ``lanes`` rows of ``width`` int16
      weights (row r at bits [16 width r, 16 width (r + 1))), ``e`` the rows' scale exponents
      (byte r: 2^(e - 127)); token j's lane l is :func:`sim.ref.arith.i16_dot` of row l with
      block j. The integers go to the multipliers as they are (exact in their 18-bit input),
      past any alignment, on delay lines with the alignment's latency and the chains' skew
      (in block RAM: a memory a chain position, :meth:`_int16_rows`).
    - a *cache tile* (fp16, the K and V caches the card writes at run time): ``aligners`` = A
      weight-row alignments (``BlockAlign``) serve the ``lanes`` rows over P = lanes / A
      consecutive cycles, ``phase`` 0 .. P - 1, rows [g A, (g + 1) A) in phase g, with ``w``
      and ``x`` held over the P cycles; with ``tt`` the tile is stored transposed (element
      (r, c) at bits 16 (c lanes + r): the V cache, MATVEC.tt), each alignment taking its row
      from there (a choice of 2P rows of its inputs, instead of a transposition of the whole
      tile in front of the tile register); token j's lane l is :func:`sim.ref.arith.bfp_dot` of
      row l with block j, delivered ``LATENCY`` cycles after the last phase. The lanes of
      phase g take their rows in that phase's cycle (the held activations' alignment gives
      the same block every cycle), and their results wait P - 1 - g cycles at the output: 32
      bits a token, instead of a row's 18 bits an element before the multipliers.

    Every cycle is a step: an int16 tile's result comes ``LATENCY`` cycles after its cycle,
    a cache tile's after its last phase; the outputs of a cache tile's other phases are not
    results. Kinds may follow each other in any order, with no bubble.

    Members
    -------
    w : ``In(16 * width * lanes)``; x : ``In(16 * width * reuse)``, token 0's block low
    e : ``In(8 * lanes)``; cache : ``In(1)``; phase : ``In(bits of P - 1)`` (P > 1 only)
    tt : ``In(1)``  a cache tile stored transposed (ignored for an int16 tile)
    o : ``Out(32 * lanes * reuse)``, token j's lane l in word ``j * lanes + l``
    """

    def __init__(self, *, lanes, width, reuse=1, aligners=None, a_bits=A_BITS, b_bits=B_BITS,
                 chain=None):
        aligners = lanes if aligners is None else aligners
        if aligners < 1 or lanes % aligners:
            raise ValueError(f"aligners must divide lanes ({lanes}), not {aligners!r}")
        if b_bits < 16:
            raise ValueError(f"b_bits must hold an int16 weight (>= 16), not {b_bits!r}")
        self.lanes, self.width, self.reuse, self.aligners = lanes, width, reuse, aligners
        self.phases = lanes // aligners
        self.a_bits, self.b_bits = a_bits, b_bits
        self.chain = chain_length(width) if chain is None else chain
        self.LATENCY = self.latency(width, a_bits, b_bits, self.chain)
        extra = {"phase": In((self.phases - 1).bit_length())} if self.phases > 1 else {}
        super().__init__({"w": In(16 * width * lanes), "x": In(16 * width * reuse),
                          "e": In(8 * lanes), "cache": In(1), "tt": In(1), **extra,
                          "o": Out(32 * lanes * reuse)})

    @staticmethod
    def latency(width, a_bits=A_BITS, b_bits=B_BITS, chain=None):
        return DotArray.latency(width, a_bits, b_bits, chain)

    def elaborate(self, platform):
        m = Module()
        W, L, A, P, C = self.width, self.lanes, self.aligners, self.phases, self.chain
        rowbits = 16 * W
        lat = BlockAlign.latency(W)
        xals = []
        for j in range(self.reuse):
            m.submodules[f"xal{j}"] = xal = BlockAlign(W, self.a_bits, skew=C)
            m.d.comb += xal.a.eq(self.x[rowbits * j:rowbits * (j + 1)])
            xals.append(xal)

        def row(r):
            return self.w[rowbits * r:rowbits * (r + 1)]

        def trow(r):        # row r of a tile stored transposed: element c at c lanes + r
            return Cat(*[self.w[16 * (c * L + r):16 * (c * L + r + 1)] for c in range(W)])

        # the cache tiles' alignments: aligner k takes row g A + k in phase g
        wals = []
        for k in range(A):
            m.submodules[f"wal{k}"] = wal = BlockAlign(W, self.b_bits, skew=C)
            pick = Mux(self.tt, trow(k), row(k))
            for g in range(1, P):
                pick = Mux(self.phase == g, Mux(self.tt, trow(g * A + k), row(g * A + k)), pick)
            m.d.comb += wal.a.eq(pick)
            wals.append(wal)
        # the step's kind beside each skew of the multipliers' inputs (a copy per lane)
        # and at the output
        odelay = DotLane.latency(W, self.a_bits, self.b_bits, C)
        rows = self._int16_rows(m)
        for lane in range(L):
            g, wal = lane // A, wals[lane % A]
            cache = Signal(name=f"cache{lane}", reset_less=True)
            m.d.sync += cache.eq(self.cache)
            kinds = [cache] + delay(m, cache, lat + odelay - 1, name=f"cache{lane}_d",
                                    reset_less=True)
            sel = [kinds[lat - 1 + s] for s in range(C)]
            at_out = kinds[lat - 1 + odelay]
            bs, fs, eb = rows[lane]
            b = Cat(*[Mux(sel[i % C], wal.o.word_select(i, self.b_bits + 1), bs[i].as_unsigned())
                      for i in range(W)])
            fb = Mux(sel[0], wal.flags, fs)
            ebm = Mux(sel[0], wal.e, eb)
            for j, xal in enumerate(xals):
                m.submodules[f"lane{lane}_t{j}"] = dl = DotLane(
                    W, a_bits=self.a_bits, b_bits=self.b_bits, chain=C, eb_signed=True)
                k = j * L + lane
                m.d.comb += [dl.a.eq(xal.o), dl.fa.eq(xal.flags), dl.ea.eq(xal.e),
                             dl.b.eq(b), dl.fb.eq(fb), dl.eb.eq(ebm)]
                o = dl.o
                if P - 1 - g:
                    # a cache tile's lanes of phase g finished P - 1 - g cycles early
                    held = delay(m, dl.o, P - 1 - g, name=f"o{k}_d", reset_less=True)[-1]
                    o = Mux(at_out, held, dl.o)
                m.d.comb += self.o[32 * k:32 * (k + 1)].eq(o)
        return m

    def _int16_rows(self, m):
        """Every lane's int16 row as its products take it (:func:`_int_rows`)."""
        W, L = self.width, self.lanes
        rows = [[self.w[16 * (lane * W + i):16 * (lane * W + i + 1)].as_signed() for i in range(W)]
                for lane in range(L)]
        exps = [self.e[8 * lane:8 * (lane + 1)] for lane in range(L)]
        return _int_rows(m, rows, exps, width=W, chain=self.chain, b_bits=self.b_bits, tag="q")


class DotLane(wiring.Component):
    """A lane's own part of :class:`DotArray`: two aligned blocks (BlockAlign's outputs, with
    their exponents) -> their exact integer dot product (:class:`IntDot`) -> fp32
    (:class:`BfpToFp32`). Latency ``IntDot.latency + BfpToFp32.latency``.

    Members
    -------
    a, fa, ea : the activations' BlockAlign outputs (``a_bits``); b, fb, eb : the weights'
    (``eb`` 5 bits, a BlockAlign's exponent; with ``eb_signed`` a signed 9-bit exponent: an
    int8 row's, :class:`I8Dot`)
    o : ``Out(32)``
    """

    def __init__(self, width, *, a_bits=A_BITS, b_bits=B_BITS, chain=None, eb_signed=False):
        self.width, self.a_bits, self.b_bits = width, a_bits, b_bits
        self.chain = chain_length(width) if chain is None else chain
        self.eb_signed = eb_signed
        self.LATENCY = self.latency(width, a_bits, b_bits, self.chain)
        super().__init__({"a": In((a_bits + 1) * width), "fa": In(4 * width), "ea": In(5),
                          "b": In((b_bits + 1) * width), "fb": In(4 * width),
                          "eb": In(signed(9) if eb_signed else 5), "o": Out(32)})

    @staticmethod
    def latency(width, a_bits=A_BITS, b_bits=B_BITS, chain=None):
        chain = chain_length(width) if chain is None else chain
        return IntDot.latency(width, chain) + BfpToFp32.latency(IntDot.bits(width, a_bits, b_bits))

    def elaborate(self, platform):
        m = Module()
        W = self.width
        m.submodules.dot = dot = IntDot(W, self.a_bits, self.b_bits, chain=self.chain)
        # value = sum * 2^(ea + eb - 28 - a_bits - b_bits)
        eshape = signed(11) if self.eb_signed else 6
        m.submodules.cvt = cvt = BfpToFp32(dot.sum_bits, eshape, 28 + self.a_bits + self.b_bits)
        esum = Signal(eshape, name="esum", reset_less=True)
        m.d.sync += esum.eq(self.ea + self.eb)
        e_at = delay(m, esum, dot.LATENCY - 1, name="esum_d", reset_less=True)[-1]
        m.d.comb += [dot.a.eq(self.a), dot.fa.eq(self.fa), dot.b.eq(self.b), dot.fb.eq(self.fb),
                     cvt.s.eq(dot.o), cvt.e.eq(e_at),
                     cvt.nan.eq(dot.nan), cvt.pinf.eq(dot.pinf), cvt.ninf.eq(dot.ninf),
                     self.o.eq(cvt.o)]
        return m


class Fp16Dot(wiring.Component):
    """One lane of :class:`DotArray` with its own activations: the dot product of ``width``
    fp16 weights (``a``) and fp16 activations (``b``) as fp32, per
    :func:`sim.ref.arith.bfp_dot`. Latency ``latency(width)``.

    Members
    -------
    a, b : ``In(16 * width)``; o : ``Out(32)``
    """

    def __init__(self, width, *, a_bits=A_BITS, b_bits=B_BITS):
        self.width, self.a_bits, self.b_bits = width, a_bits, b_bits
        self.LATENCY = DotArray.latency(width, a_bits, b_bits)
        super().__init__({"a": In(16 * width), "b": In(16 * width), "o": Out(32)})

    @staticmethod
    def latency(width, a_bits=A_BITS, b_bits=B_BITS):
        return DotArray.latency(width, a_bits, b_bits)

    def elaborate(self, platform):
        m = Module()
        m.submodules.arr = arr = DotArray(lanes=1, width=self.width, a_bits=self.a_bits,
                                          b_bits=self.b_bits)
        m.d.comb += [arr.w.eq(self.a), arr.x.eq(self.b), self.o.eq(arr.o)]
        return m


class I8Dot(wiring.Component):
    """A dot product of ``width`` int8 weights ``q`` and fp16 activations ``x`` with the row's
    power-of-two scale 2^(``e`` - 127), as fp32, per :func:`sim.ref.arith.i8_dot`: the
    activations aligned as in :class:`DotArray`, the weights are the integers themselves (an
    int8 row needs no alignment: its value is exact in the 18-bit multiplier input), the scale's
    exponent enters the single rounding beside the block's (``DotLane`` with a signed weight
    exponent: e - 127 + 14 + B_BITS, so the constants are fp16's). The int8 rows' path of the
    matrix unit v2 (docs/numerics.md, "int8 weights"), the unit the tests prove.

    Members
    -------
    q : ``In(8 * width)``, element j in bits [8 j, 8 j + 8); x : ``In(16 * width)``;
    e : ``In(8)``; o : ``Out(32)``
    """

    def __init__(self, width, *, a_bits=A_BITS, b_bits=B_BITS):
        self.width, self.a_bits, self.b_bits = width, a_bits, b_bits
        self.chain = chain_length(width)
        self.LATENCY = self.latency(width, a_bits, b_bits)
        super().__init__({"q": In(8 * width), "x": In(16 * width), "e": In(8), "o": Out(32)})

    @staticmethod
    def latency(width, a_bits=A_BITS, b_bits=B_BITS):
        return DotArray.latency(width, a_bits, b_bits)

    def elaborate(self, platform):
        m = Module()
        W, C = self.width, self.chain
        m.submodules.xal = xal = BlockAlign(W, self.a_bits, skew=C)
        m.submodules.lane = lane = DotLane(W, a_bits=self.a_bits, b_bits=self.b_bits, chain=C,
                                           eb_signed=True)
        m.d.comb += xal.a.eq(self.x)
        values = [self.q[8 * j:8 * (j + 1)].as_signed() for j in range(W)]
        [(bs, fs, eb)] = _int_rows(m, [values], [self.e], width=W, chain=C, b_bits=self.b_bits,
                                   tag="q")
        m.d.comb += [lane.a.eq(xal.o), lane.fa.eq(xal.flags), lane.ea.eq(xal.e),
                     lane.b.eq(Cat(*bs)), lane.fb.eq(fs), lane.eb.eq(eb), self.o.eq(lane.o)]
        return m
