"""One generation step's instruction stream.

Owns
----
``Emitter``: the order of a step's instructions: the embeddings, per layer the LayerNorm and
c_attn with the K/V caches' STOREs, attention, attn.c_proj, the LayerNorm and c_fc with GELU,
mlp.c_proj (each projection with its residual or all-reduce), then the LM head. Which vector
work runs beside which MATVEC, and why, is in docs/architecture.md ("Compiling GPT-2").

Instructions are collected with each MATVEC as a ``schedule.Job``; ``schedule.place_wloads``
then places the WLOADs. The emitter reads a ``CompiledModel``'s public parts: its partition,
``Dims``, ``Placement``, ``HbmLayout``, ``KvLayout`` and ``ParamLayout``.
"""

from dataclasses import dataclass, field, replace
from functools import partial

import numpy as np

from hw.isa import ACC_DEPTH, decode, encode

from ..errors import UserError
from .image import LayerRows
from .interleave import Barrier, interleave
from .layout import GROUP, round_up, stream_tiles
from .schedule import Job, chunk_blocks, matrix_chunks, place_wloads

__all__ = ["Emitter", "split_program", "split_at"]
# The LayerNorm statistics of several tokens shared out over the cards (Emitter._ln_stats);
# False (a what-if) has every card compute every token's.
SHARE_LN = True
# c_fc's output of several tokens in two token-major regions, one GELU pass over each
# (Emitter.mlp); False (a what-if, and the tests' reference) token by token.
GELU_REGIONS = True
# The prefill all-reduce writes x's fp16 copy into XB itself (COLL.x16, Emitter.projection);
# False (a what-if, and the tests' reference) converts x with a CVT16 pass.
ALLREDUCE_X16 = True
# A split step's second half runs SPLIT_LAG parts behind the first (split_program), unless the
# merge asks otherwise: host.compiler.tune tries 1 and 2 for prefill steps. More needs more
# parameter areas than two (the first half would load a layer's parameters over an area the
# second still reads): 3 and 4 with three are what-ifs (tools/step_whatifs.py).
SPLIT_LAG = 2


@dataclass
class _Layer:
    """What the parts of one layer's emission share.

    Attributes
    ----------
    index : int
    rows : LayerRows
        The layer's rows in HBM.
    par : int
        The VSP parameter area the layer's parameters are in.
    biases : tuple of int
        VSP words of c_attn's, attn.c_proj's, c_fc's and mlp.c_proj's biases.
    k_stored : set of int
        Tokens whose K has been STOREd.
    v_stored : dict
        Token -> the heads (0 .. n - 1) whose V has been STOREd.
    k_wait : int or None
        The program position from which the K tiles may stream: the chunk work after the one
        that STOREd the last token's K (a WLOAD right behind its STORE would hold in-order
        issue until the STORE is done).
    v_later : list
        Several tokens: their V STOREs, emitted among the scores' vector work instead of
        after each token's c_attn chunk work (``_spread_v_stores``): the K STOREs, which the
        K MATVECs wait for, go out first, and the store engine's queue does not hold in-order
        issue through the tokens' chunk work.
    """

    index: int
    rows: LayerRows
    par: int
    biases: tuple
    k_stored: set = field(default_factory=set)
    v_stored: dict = field(default_factory=dict)
    k_wait: int | None = None
    v_later: list = field(default_factory=list)
    v_done: int = 0


@dataclass
class _LogitsBuffer:
    """One LM head chunk's logits in a VSP buffer: ``rows`` logits from logit ``first`` of the
    slice for the MATVEC's tokens ``toks`` (step tokens), token j's at ``buf + j stride``
    and stored from HBM row ``row + j row_stride``, the first ``done[j]`` of them STOREd."""

    buf: int
    first: int
    rows: int
    toks: list
    stride: int
    row: int
    row_stride: int
    done: list


class Emitter:
    """Builds one step's program for ``tokens`` at positions pos0, pos0 + 1, ... of stream
    ``stream`` of a ``CompiledModel`` ``cm`` (the caller checks their count and positions);
    or, with ``batch`` = [(position, stream)] a decode batch: token t of stream batch[t][1]
    at position batch[t][0], each stream with its own K/V caches and causal mask.

    A batch computes each stream's token as that stream's own one-token step does (the same
    operations on the same values; a MATVEC's tokens do not meet): the weight MATVECs take
    every stream's token at once, attention runs stream by stream over its own caches, the
    projections' partial sums start from each token's own residual (MATVEC.btok), and every
    token's logits are stored.

    ``program()`` returns the instruction words, the WLOADs placed by ``place_wloads``: as
    early as their data allow and the weight FIFO holds, in MATVEC order."""

    def __init__(self, cm, tokens, pos0, stream=0, batch=None, half=None):
        self.sh, self.dims, self.b, self.hbm = cm.sh, cm.dims, cm.plan, cm.hbm
        # half = (t0, lead, tokens of the whole step): one of the two halves of a step of
        # ``split_program``: its tokens are the step's t0, t0 + 1, ...; the lead half (the
        # first) loads what both read (the constants, the layers' parameters)
        self.t0, self.lead, self.T_step = half if half is not None else (0, True, len(tokens))
        if self.t0:
            self.b = _shifted(cm.plan, cm.dims, self.t0, cm.part.cards, cm.cfg.link.data_bits // 32,
                              cm.cfg.core.vector_lanes)
        self.marks = []            # program positions of the ends of its parts (split_program)
        self.param_loads = {}      # layer li -> the position of the LOAD of layer li + 1's parameters
        self.kv, self.params = cm.kv, cm.params
        self.card, self.cards = cm.part.card, cm.part.cards
        self.all_logits, self.dump_hidden = cm.all_logits, cm.dump_hidden
        c = cm.cfg.core
        self.L, self.W, self.P, self.S = c.lanes, c.width, c.vector_lanes, cm.cfg.stripe_bytes
        # weight matrices: tiles of LW rows, integers (int8, int16) with a row of scales per
        # group (i8); the K and V caches: fp16 tiles of L rows
        self.LW, self.i8 = c.tile_rows, c.int_weights
        self.beat = cm.cfg.link.data_bits // 32      # a COLL beat, fp32 words
        self.fifo = c.weight_fifo_tiles
        self.tokens, self.pos0 = tokens, pos0
        self.T = len(tokens)
        self.cm, self.batch = cm, batch
        self.pos = [p for p, _ in batch] if batch else [pos0 + t for t in range(self.T)]
        self.streams = [s for _, s in batch] if batch else [stream] * self.T
        # decode: every token at its stream's last position (one token, or a batch): the
        # causal mask is the K MATVECs' bias, the projections' collective an all-gather
        self.decode = self.T == 1 or batch is not None
        self.out = []              # instruction words and Jobs
        self.kv_ready = 0          # K/V tiles may stream only after this position (their STOREs)
        self.w_ready = 0           # no weight tiles stream before this position
        # fp16(x) goes to x_a with the residual stream's last write (VEC.x16) instead of a
        # CVT16 pass of its own where x has no padding words (d a multiple of W) to convert.
        self.x16_x = cm.sh.d_model % self.W == 0
        self.xa_ready = False      # x_a holds fp16(x) of the step's tokens (ln_matvec)
        self.xa = self.b.x_a       # the XB input of the last ln_matvec
        # q's rows go to XB as fp16 with their LayerNorm fix-up (for the K MATVECs) where they
        # start at a whole VSP word group; else a CVT16 pass converts them.
        self.q16 = self.dims.q_off % self.P == 0
        self.r_at = {}             # token -> the VSP word of its LayerNorm's r, where shared
        self.after_coll = 0        # the program position after the last projection's COLL

    # -- instructions ---------------------------------------------------------------------------
    def e(self, op, **f):
        self.out.append(encode(op, **f))

    def vec(self, vop, dst, src1, n, src2=0, bcast=0, k=0, xdst=None):
        """A VEC; with ``xdst`` the result goes to XB (fp16) at xdst too (VEC.x16)."""
        self.e("VEC", vop=vop, dst=dst, src1=src1, src2=src2, n=n, bcast=bcast, k=k,
               x16=int(xdst is not None), xdst=xdst or 0)

    def store_f32(self, vsp, n, row):
        """STORE ``n`` fp32 words from VSP word ``vsp`` to stripe rows from ``row``."""
        per_row = self.S // 4
        lepg = per_row.bit_length() - 1
        for a in range(0, n, 1 << 15):
            k = min(1 << 15, n - a)
            self.e("STORE", vsp=vsp + a, n=k, row=row + a // per_row, off=0, lepg=lepg, lgpr=0,
                   gstride=0, rstride=1, f32=1)

    def scalar(self, t, k):
        """Token t's scalar slot k (P words each; 4 + 2H per token): 0..3 LayerNorm, 4 + h
        head h's max, 4 + H on: the heads' softmax sums, side by side."""
        return self.b.v_scal + ((4 + 2 * self.dims.H) * t + k) * self.P

    def mask(self, t):
        """VSP word of token t's causal mask (decode)."""
        t += self.t0
        if t == 0:
            return self.b.v_mask
        return self.b.v_masks + (t - 1) * self.dims.nS

    def matvec(self, m, xb, xstride, dst, dstride, bias=None, group=GROUP, kv=None, tokens=None,
               then=None, first=None, defer_last=False, tt=0, short_tail=False, btok=0,
               regions=None):
        """MATVEC jobs for matrix ``m`` = (first tile row, rb, cb): one per chunk of whole
        groups of row blocks (``schedule.matrix_chunks``). ``kv``: the matrix is a head's K or
        V cache, one job whose tiles are the runs ``kv`` (first row, tiles), streamed once the
        caches hold this step's rows (``kv_ready``). ``first()`` emits instructions right
        after the first MATVEC.

        ``then(t, row0, rows)`` emits the vector work on a finished chunk of the output (token
        t's rows row0 .. row0 + rows). Each chunk's work goes after the *next* chunk's MATVEC:
        in-order issue then waits for chunk k while chunk k + 1 already runs, so the matrix
        unit stays busy and the vector unit works beside it instead of after it. With
        ``defer_last`` the last chunk's work is returned (a function) for the caller to
        place. ``regions``: the output's rows in regions of their own, each token-major
        (``_region``); else token t's row r is at dst + t dstride + r."""
        row, rb, cb = m
        T = self.T if tokens is None else tokens
        group = min(group, ACC_DEPTH // T)
        i8 = self.i8 and not kv
        L = self.LW if not kv else self.L
        assert not i8 or group == GROUP, group     # (the image's scale rows are per GROUP)
        if kv:
            chunks = [(0, rb)]
        else:
            chunks = matrix_chunks(rb, cb, group=group, fifo_tiles=self.fifo, L=L, W=self.W,
                                   short_tail=short_tail, i8=i8)
        prev = None
        for r0, n in chunks:
            # (a job's tiles follow the matrix's stream order only from a group's start)
            assert kv or r0 % group == 0, (r0, group)
            tiles = stream_tiles(n, cb, group, i8)
            if tiles > self.fifo:
                raise UserError(f"model: {tiles} tiles in one MATVEC exceed the weight FIFO's "
                                f"{self.fifo} (core.weight_fifo_tiles)")
            cdst, cstride = _region(regions, r0 * L, n * L) if regions else (dst + r0 * L, dstride)
            f = self._matvec_rows(xb=xb, dst=cdst, xstride=xstride if T > 1 else 0,
                                  dstride=cstride if T > 1 else 0,
                                  bias=(bias + r0 * L) if bias is not None else 0)
            f.update(rb=n, cb=cb, group=group, tokens=T, bias_en=int(bias is not None), tt=tt,
                     i8=int(i8))
            if btok and T > 1:
                f["btok"] = 1
            runs = kv if kv else [(self._block_row(row, r0, cb, i8), tiles)]
            self.out.append(Job(tuple(runs), tiles, f, max(self.w_ready, self.kv_ready if kv else 0)))
            if first is not None and prev is None:
                first()
            if then is not None and prev is not None:
                self._then(then, T, prev, L)
            prev = (r0, n)
        if then is not None:
            if defer_last:
                return partial(self._then, then, T, prev, L)
            self._then(then, T, prev, L)
        return None

    def _matvec_rows(self, *, xb, xstride, dst, dstride, bias):
        """MATVEC's address fields from word addresses: XB rows of width words, VSP rows of
        vector_lanes words (the buffers are placed so: Placement)."""
        W, P = self.W, self.P
        for name, v, unit in (("xb", xb, W), ("xstride", xstride, W), ("dst", dst, P),
                              ("dstride", dstride, P), ("bias", bias, P)):
            assert v % unit == 0, (name, v, unit)
        return dict(xb=xb // W, xstride=xstride // W, dst=dst // P, dstride=dstride // P, bias=bias // P)

    @staticmethod
    def _block_row(row, r0, cb, i8):
        """The stream row of row block r0 (a group's first) of a matrix stored from ``row``."""
        return row + r0 * cb + (r0 // GROUP if i8 else 0)

    def _then(self, then, T, chunk, L):
        r0, n = chunk
        for t in range(T):
            then(t, r0 * L, n * L)

    # -- LayerNorm folded into the next matrix --------------------------------------------------
    def ln_fixup(self, t, y, n, bias, x16=None):
        """y[0:n] = r y + bias[0:n], r token t's 1 / sqrt(var + eps) (ln_matvec). ``x16`` =
        (k, xdst): elements k.. also go to XB from xdst (fp16), for the next MATVEC."""
        self.vec("MUL", y, y, n, src2=self.r_at.get(t, self.scalar(t, 1)), bcast=1)
        k, xdst = x16 if x16 is not None else (n, None)
        if k > 0:
            self.vec("ADD", y, y, k, src2=bias)
        if k < n:
            self.vec("ADD", y + k, y + k, n - k, src2=bias + k, xdst=xdst)

    def ln_matvec(self, m, dst, dstride, bias, then, defer_last=False, toks=None, before=None,
                  xq=None, regions=None, **kw):
        """LayerNorm of the residual stream x followed by matrix ``m`` (its LayerNorm folded
        in: weights.fold_layer_norm): the matrix unit starts on fp16(x) at once; the mean and
        r = 1 / sqrt(var + eps) of each token run on the vector unit beside the first chunk;
        each finished chunk of rows becomes r z + bias (then ``then(t, row0, rows)``).
        ``toks``: the tokens (default all) whose x go in, as the MATVEC's tokens 0, 1, ...;
        ``bias + r``: the VSP word of the bias for output row r; ``before()`` is emitted ahead
        of the statistics. ``xq`` = (row, xb, stride): output rows from ``row`` on also go to
        XB as fp16, token j's at xb + j stride.

        fp16(x) is in x_a already (token t at x_a + t dS) where the residual stream's last
        writer put it there (VEC.x16: self.xa_ready); else a CVT16 puts it there."""
        b, T, dS = self.b, self.T, self.dims.dS
        toks = list(range(T)) if toks is None else toks
        if self.xa_ready:
            assert toks == list(range(toks[0], toks[0] + len(toks)))
            self.xa = b.x_a + toks[0] * dS
        else:
            self.xa = b.x_a
            if toks == list(range(T)):
                self.vec("CVT16", b.x_a, b.v_x, T * dS)
            else:
                for j, t in enumerate(toks):
                    self.vec("CVT16", b.x_a + j * dS, b.v_x + t * dS, dS)
        self.xa_ready = False
        return self.matvec(m, self.xa, dS, dst, dstride, first=partial(self._ln_stats, toks, before),
                           then=partial(self._ln_finish, toks, (dst, dstride, regions), bias, xq, then),
                           defer_last=defer_last, tokens=len(toks), regions=regions, **kw)

    def _ln_stats(self, toks, before):
        """The LayerNorm statistics up to the sum of squares (issued before the second chunk).

        Several tokens on several cards (where the Placement has ``v_ln``): every card holds
        the same x, so each card takes ceil(tokens / cards) of the tokens, card c the c-th
        run of them, through to r = 1 / sqrt(var + eps), and an all-gather gives every card
        every token's r (the same words: the same instructions on the same x), in ``r_at``."""
        b, dS, d = self.b, self.dims.dS, self.sh.d_model
        if before is not None:
            before()
        self.r_at = {}
        share = self.cards > 1 and len(toks) > 1 and b.v_ln is not None and SHARE_LN
        k = -(-len(toks) // self.cards)
        mine = toks[self.card * k:(self.card + 1) * k] if share else toks
        for i, t in enumerate(mine):
            x, sq = b.v_x + t * dS, b.v_a + t * dS
            s0 = self.scalar(t, 0)
            self.vec("REDSUM", s0, x, d)
            self.vec("MUL", s0, s0, 1, src2=b.v_const, bcast=1)         # 1 / d
            self.vec("SUB", sq, x, d, src2=s0, bcast=1)
            self.vec("MUL", sq, sq, d, src2=sq)
            self.vec("REDSUM", self.scalar(t, 1), sq, d)
            if share:
                self._ln_r(t, b.v_ln + i * self.P)
        if share:
            blk = round_up(k * self.P, self.beat)
            gathered = b.v_ln + round_up(k * self.P, self.beat)
            self.e("COLL", cop=0, src=b.v_ln, dst=gathered, n=k * self.P)
            self.r_at = {t: gathered + (j // k) * blk + (j % k) * self.P for j, t in enumerate(toks)}

    def _ln_r(self, t, dst):
        """r = 1 / sqrt(var + eps) of token t into ``dst`` (its sum of squares in slot 1)."""
        s1 = self.scalar(t, 1)
        self.vec("MUL", s1, s1, 1, src2=self.b.v_const, bcast=1)        # 1 / d
        self.vec("ADD", s1, s1, 1, src2=self.b.v_const + 1, bcast=1)    # eps
        self.vec("RSQRT", dst, s1, 1)

    def _ln_finish(self, toks, out, bias, xq, then, j, r, n):
        """The fix-up of a finished chunk (rows r .. r + n of the MATVEC's token j), then
        ``then``; with the first chunk, r = 1 / sqrt(var + eps) first (unless shared)."""
        t = toks[j]
        if r == 0 and t not in self.r_at:   # the first chunk: r, after the second chunk's issue
            self._ln_r(t, self.scalar(t, 1))
        x16 = None
        if xq is not None and r + n > xq[0]:
            k = max(xq[0] - r, 0)
            x16 = (k, xq[1] + j * xq[2] + r + k - xq[0])
        dst, dstride, regions = out
        y, stride = _region(regions, r, n) if regions else (dst + r, dstride)
        self.ln_fixup(t, y + j * stride, n, bias + r, x16=x16)
        then(j, r, n)

    # -- the step -------------------------------------------------------------------------------
    def program(self):
        """The step's instruction words."""
        self.items()
        self.e("HALT")
        return place_wloads(self.out, self.fifo)

    def items(self):
        """The step's instructions and Jobs (``out``) but the HALT, the ends of its parts in
        ``marks``: the embeddings, each layer's four (``layer``), the LM head."""
        b, sh, rows, dS, d = self.b, self.sh, self.hbm, self.dims.dS, self.sh.d_model
        # Embeddings and constants.
        # (the embeddings ahead of any weight tile in the read DMA's order: the first
        # LayerNorm waits for them)
        for t, tok in enumerate(self.tokens):
            if not 0 <= tok < sh.vocab:
                raise UserError(f"token id {tok} is outside the vocabulary (0..{sh.vocab - 1})")
            self.e("LOAD", vsp=b.v_x + t * dS, n=d, row=rows.wte_row + tok * rows.tok_rows)
            self.e("LOAD", vsp=b.v_y + t * dS, n=d, row=rows.wpe_row + self.pos[t] * rows.tok_rows)
        if self.lead:
            self.e("LOAD", vsp=b.v_const, n=2, row=rows.const_row, f32=1)
        if self.decode:
            # Decode: the causal mask is the K MATVECs' bias (scores past the position
            # become -inf as they are summed), built once for every layer and head (the MASK
            # in layer 0, behind the first MATVEC); one a stream in a batch.
            for t in range(self.T):
                self.e("LOAD", vsp=self.mask(t), n=self.dims.nS, row=rows.zero_row, f32=1)
        # The first tiles stream from here, while the embeddings are added up.
        self.w_ready = len(self.out)
        for t in range(self.T):
            x = b.v_x + t * dS
            self.vec("ADD", x, x, d, src2=b.v_y + t * dS, xdst=b.x_a + t * dS if self.x16_x else None)
        self.xa_ready = self.x16_x
        self.dump(0)
        self.marks.append(len(self.out))
        for li, lr in enumerate(rows.layers):
            self.layer(li, lr)
        self.lm_head()
        self.marks.append(len(self.out))

    def dump(self, k):
        """With dump_hidden: the residual stream into hidden-state dump k."""
        if self.dump_hidden:
            self.store_f32(self.b.v_x, self.T * self.dims.dS,
                           self.hbm.hidden_row + k * self.hbm.hidden_stride)

    def layer(self, li, lr):
        """Decoder layer li (rows ``lr``): LayerNorm and c_attn with the K/V caches' STOREs,
        attention, attn.c_proj, the MLP; the next layer's parameters."""
        par = self.b.v_pars[li % len(self.b.v_pars)]
        st = _Layer(li, lr, par, tuple(par + o for o in self.params.offsets))
        self.qkv(st)
        self.marks.append(len(self.out))
        self.attention(st)
        self.marks.append(len(self.out))
        self.projection([(lr.proj, 0)], self.b.x_att, self.dims.dq, st.biases[1])
        # (the part ends with its COLL: the sums after it wait for it, and begin the next part)
        self.marks.append(self.after_coll)
        if self.b.param_areas > 1 and self.lead:
            # Into the other area, while this layer runs: here, where the weight FIFO is
            # full with c_fc's tiles and the read DMA would idle through the LayerNorm (a
            # LOAD fills the VSP at vector_lanes words a cycle; earlier in the layer it
            # held up the K and V tiles behind it).
            self.next_params(li)
        self.mlp(st)
        if self.b.param_areas == 1:     # over this layer's, after their last use
            self.next_params(li)
        self.dump(li + 1)
        self.marks.append(self.after_coll)

    def next_params(self, li):
        """LOAD layer li + 1's parameters (if any) into its area."""
        if li + 1 < len(self.hbm.layers):
            self.param_loads[li] = len(self.out)
            self.e("LOAD", vsp=self.b.v_pars[(li + 1) % len(self.b.v_pars)], n=self.params.length,
                   row=self.hbm.layers[li + 1].params, f32=1)

    def _first_params(self, st):
        """Layer 0's parameters: c_attn's bias behind the first chunk's tiles (needed when that
        chunk is done), the rest later (``attention``); the other layers' come in the layer
        before. In decode, the causal mask too."""
        if self.lead:
            self.e("LOAD", vsp=st.par, n=self.params.offsets[1], row=st.rows.params, f32=1)
        self.w_ready = len(self.out)
        if self.decode:
            for t in range(self.T):
                self.vec("MASK", self.mask(t), self.mask(t), self.dims.nS, k=self.pos[t])

    def qkv(self, st):
        """LayerNorm and c_attn; each finished chunk's K and V rows go to the caches
        (``store_kv``), q's to XB as fp16 where ``q16``."""
        dims = self.dims
        self.ln_matvec(st.rows.qkv, self.b.v_qkv, dims.qS, st.biases[0], partial(self.store_kv, st),
                       before=partial(self._first_params, st) if st.index == 0 else None,
                       xq=(dims.q_off, self.b.x_q, dims.dq) if self.q16 else None)

    def store_kv(self, st, t, r, n):
        """c_attn's chunk work on token t's rows r .. r + n: the token's new K row goes into
        the cache as soon as c_attn's K rows are final, its V column by the heads whose V rows
        are (the V STORE is slow: one channel takes a position's values, a beat per tile; the
        first heads' go out a chunk earlier). The K MATVECs wait for them; their tiles may
        stream from the next chunk's work on (``_Layer.k_wait``)."""
        b, dims, kv = self.b, self.dims, self.kv
        p = self.pos[t]
        kbase, vbase = self.cm.kv_caches(st.index, self.streams[t])
        if st.k_wait is None and self.T - 1 in st.k_stored:
            st.k_wait = len(self.out)
        if r + n >= dims.k_off + dims.dq and t not in st.k_stored:
            self.e("STORE", vsp=b.v_qkv + t * dims.qS + dims.k_off, n=dims.dq, **kv.k_store(kbase, p))
            st.k_stored.add(t)
        h0 = st.v_stored.get(t, 0)
        h1 = min(dims.H, max(0, r + n - dims.v_off) // dims.hvp)
        if h1 > h0:
            store = encode("STORE", vsp=b.v_qkv + t * dims.qS + dims.v_off + h0 * dims.hvp,
                           n=(h1 - h0) * dims.hvp, **kv.v_store(vbase, p, h0))
            if self.T > 1:      # (later, among the scores' vector work: _spread_v_stores)
                st.v_later.append(store)
            else:
                self.out.append(store)
            st.v_stored[t] = h1

    def attention(self, st):
        """Attention, heads side by side so that the units overlap: the matrix unit runs the
        q.K^T of every head back to back while the vector unit takes each head's scores as
        they come; exp and the fp16 conversions run once over all heads.

        Layouts: q16 [t][h][hdp], scores and probabilities [t][h][sK], sK the rows the K
        MATVECs write at this position (whole groups; not the context's nS: EXP and CVT16
        pass over what is live, rows past the position masked)."""
        if self.batch is not None:
            self.attention_batch(st)
            return
        b, dims, kv, T, L, W = self.b, self.dims, self.kv, self.T, self.L, self.W
        H, hdp, hvp, dq, aS = dims.H, dims.hdp, dims.hvp, dims.dq, dims.aS
        positions = self.pos0 + T
        kbase, vbase = self.cm.kv_caches(st.index, self.streams[0])      # (the step's one stream)
        rbk, cbv = kv.k_row_blocks(positions), kv.v_col_blocks(positions)
        vgrp = min(kv.rbv, ACC_DEPTH // T)         # V tiles in stream order: groups, then columns
        sK = round_up(rbk * L, W)
        HN = H * sK
        self._q_to_xb()
        self.kv_ready = st.k_wait if st.k_wait is not None else len(self.out)
        for h in range(H):
            self.matvec((0, rbk, kv.cbk), b.x_q + h * hdp, dq, b.v_sc + h * sK, HN,
                        kv=kv.k_runs(kbase, h, positions), bias=b.v_mask if T == 1 else None)
        self._rest_of_layer0_params(st)
        ns = cbv * W
        v_ready = []
        spread = self._spread_v_stores(st, H * T)
        for h in range(H):
            for t in range(T):
                next(spread)
                s = b.v_sc + t * HN + h * sK
                m = self.scalar(t, 4 + h)
                if T > 1:
                    self.vec("MASK", s, s, ns, k=self.pos0 + t)
                self.vec("REDMAX", m, s, ns)
                self.vec("SUB", s, s, ns, src2=m, bcast=1)
            # Head h's V tiles stream from here: the V STOREs are done by now (earlier, in-order
            # issue would hold the K MATVECs behind WLOADs waiting for them), and spread over
            # the heads, their WLOADs do not fill the read DMA's queue of four at once. (Not
            # before the last V STORE: the WLOAD of a tile must follow the STORE into it.)
            v_ready.append(len(self.out))
        v_ready = [max(r, st.v_done) for r in v_ready]
        # The probabilities' normalization is deferred past p.V: the V MATVECs take the
        # unnormalized exp(s - max) (in (0, 1], as fp16) and give each head's sum of them
        # beside its output (the V rows of ones); one RECIP over the output from the first
        # sum to the last takes the sums' reciprocals (the others go unused), and each head's
        # output is scaled by its (the MUL writing c_proj's fp16 input).
        self.vec("EXP", b.v_sc, b.v_sc, T * HN, xdst=b.x_p)
        for h in range(H):
            self.kv_ready = v_ready[h]
            self.matvec((0, kv.rbv, cbv), b.x_p + h * sK, HN, b.v_att + h * hvp, aS, group=vgrp,
                        kv=kv.v_runs(vbase, h, positions, vgrp), tt=1)
        self._scale_heads()

    def _spread_v_stores(self, st, steps):
        """A generator to advance once before each of ``steps`` pieces of the scores' vector
        work: it emits the deferred V STOREs (``_Layer.v_later``) spread evenly over them,
        one every steps / stores, and sets ``st.v_done`` to the program position after the
        last (the V tiles stream from there on)."""
        later, st.v_later = st.v_later, []
        st.v_done = len(self.out)
        for i in range(steps):
            for j, w in enumerate(later):
                if j * steps // len(later) == i:
                    self.out.append(w)
                    st.v_done = len(self.out)
            yield
        while True:
            yield

    def _q_to_xb(self):
        """q as fp16 into XB for the K MATVECs, where c_attn's fix-up did not put it there."""
        b, dims = self.b, self.dims
        if not self.q16:
            for t in range(self.T):
                self.vec("CVT16", b.x_q + t * dims.dq, b.v_qkv + t * dims.qS + dims.q_off, dims.dq)

    def _rest_of_layer0_params(self, st):
        """Layer 0's parameters after c_attn's bias (``_first_params``), behind the K MATVECs."""
        if st.index == 0 and self.lead:
            o = self.params.offsets[1]
            self.e("LOAD", vsp=st.par + o, n=self.params.length - o, row=st.rows.params + o * 4 // self.S,
                   f32=1)

    def _scale_heads(self):
        """The softmax's deferred normalization: one RECIP over the heads' outputs from the
        first sum to the last (the V rows of ones put each head's sum beside its output), then
        each head's output times its reciprocal, written to XB as c_proj's fp16 input."""
        b, dims, T = self.b, self.dims, self.T
        H, hdp, hvp, dq, aS = dims.H, dims.hdp, dims.hvp, dims.dq, dims.aS
        self.vec("RECIP", b.v_zinv + hdp, b.v_att + hdp, (T - 1) * aS + (H - 1) * hvp + 1)
        for h in range(H):
            for t in range(T):
                a = b.v_att + t * aS + h * hvp
                self.vec("MUL", a, a, hdp, src2=b.v_zinv + t * aS + h * hvp + hdp, bcast=1,
                         xdst=b.x_att + t * dq + h * hdp)

    def attention_batch(self, st):
        """A decode batch's attention: each stream's token as its own one-token step takes
        it (``attention`` with T = 1: K and V MATVECs over its own caches, its mask the K
        MATVECs' bias, its scores' max and the V MATVECs' column blocks over its own
        positions), laid out side by side at the batch's largest score stride; exp, the
        fp16 conversions and the sums' reciprocals once over every stream's."""
        b, dims, kv, T, L, W = self.b, self.dims, self.kv, self.T, self.L, self.W
        H, hdp, hvp, dq, aS = dims.H, dims.hdp, dims.hvp, dims.dq, dims.aS
        positions = [p + 1 for p in self.pos]
        caches = [self.cm.kv_caches(st.index, s) for s in self.streams]
        rbk = [kv.k_row_blocks(n) for n in positions]
        cbv = [kv.v_col_blocks(n) for n in positions]
        vgrp = min(kv.rbv, ACC_DEPTH)               # (a lone token's V group)
        sK = round_up(max(rbk) * L, W)
        HN = H * sK
        self._q_to_xb()
        self.kv_ready = st.k_wait if st.k_wait is not None else len(self.out)
        for h in range(H):
            for t in range(T):
                self.matvec((0, rbk[t], kv.cbk), b.x_q + t * dq + h * hdp, 0,
                            b.v_sc + t * HN + h * sK, 0, tokens=1,
                            kv=kv.k_runs(caches[t][0], h, positions[t]), bias=self.mask(t))
        self._rest_of_layer0_params(st)
        v_ready = []
        spread = self._spread_v_stores(st, H * T)
        for h in range(H):
            for t in range(T):
                next(spread)
                s = b.v_sc + t * HN + h * sK
                m = self.scalar(t, 4 + h)
                self.vec("REDMAX", m, s, cbv[t] * W)
                self.vec("SUB", s, s, cbv[t] * W, src2=m, bcast=1)
            v_ready.append(len(self.out))
        v_ready = [max(r, st.v_done) for r in v_ready]
        self.vec("EXP", b.v_sc, b.v_sc, T * HN, xdst=b.x_p)
        for h in range(H):
            self.kv_ready = v_ready[h]
            for t in range(T):
                self.matvec((0, kv.rbv, cbv[t]), b.x_p + t * HN + h * sK, 0, b.v_att + t * aS + h * hvp,
                            0, group=vgrp, tokens=1, tt=1,
                            kv=kv.v_runs(caches[t][1], h, positions[t], vgrp))
        self._scale_heads()

    def mlp(self, st):
        """LayerNorm, c_fc with GELU, mlp.c_proj. mlp.c_proj in two parts by columns where the
        image stores it so (schedule.mlp_proj_split): the first, over the columns of all but
        c_fc's last chunk, runs while the vector unit takes that chunk's GELU.

        Several tokens (a step's, or a batch's): c_fc's output goes in two regions, the
        columns of mlp.c_proj's first part and its second's, each token-major (token t's
        rows of a region at its base + t x its width), in VSP and in XB alike: a GELU over
        a region is then one pass over every token's rows (its pipeline's latency once, not
        once a token), and each part of mlp.c_proj reads its region with that width as
        its stride. (Where c_fc's rows do not fill whole column blocks, token by token.)"""
        fc, fS = st.rows.fc, self.dims.fS
        LW = self.LW
        b, T = self.b, self.T
        if GELU_REGIONS and T > 1 and len(st.rows.fc2) == 2 and fc.rb * LW == fS:
            fa = st.rows.fc2[1][1]
            regions = [(0, b.v_h, fa), (fa, b.v_h + T * fa, fS - fa)]
            inputs = [(b.x_h, fa), (b.x_h + T * fa, fS - fa)]
            gelu = partial(self._region_gelu, regions, inputs)
            tail = self.ln_matvec(fc, b.v_h, fS, st.biases[2], gelu, defer_last=True, regions=regions)
            self.projection(st.rows.fc2, b.x_h, fS, st.biases[3], first=tail, inputs=inputs)
            return
        gelu = partial(self._fc_gelu, fc.rb * LW, chunk_blocks(fc.cb, self.fifo, GROUP, self.i8) * LW)
        tail = self.ln_matvec(fc, b.v_h, fS, st.biases[2], gelu, defer_last=True)
        fc_tail = partial(self._fc_tail, tail, fc.rb * LW)
        if len(st.rows.fc2) == 2:     # after the first part's first MATVEC: it does not read them
            self.projection(st.rows.fc2, b.x_h, fS, st.biases[3], first=fc_tail)
        else:                         # (in-order issue: a later writer would not hold it back)
            fc_tail()
            self.projection(st.rows.fc2, b.x_h, fS, st.biases[3])

    def _region_gelu(self, regions, inputs, t, r, n):
        """c_fc's chunk work in regions (``mlp``): once the last token's rows of a region's
        last chunk are fixed up, GELU over the region, every token's rows, into XB."""
        for (row0, v, width), (x, _) in zip(regions, inputs, strict=True):
            if t == self.T - 1 and r + n == row0 + width:
                self.vec("GELU", v, v, self.T * width, xdst=x)

    def gelu(self, t, r, n):
        """GELU and the fp16 copy for the next MATVEC."""
        h = self.b.v_h + t * self.dims.fS + r
        self.vec("GELU", h, h, n, xdst=self.b.x_h + t * self.dims.fS + r)

    def _fc_gelu(self, fc_rows, crow, t, r, n):
        """c_fc's chunk work: GELU over two chunks at once (its pipeline is long: GELU_LAT
        cycles a pass, host/perf.py), but the last chunk and one before it alone, so that
        mlp.c_proj's first part does not wait for the last chunk."""
        i, last = r // crow, -(-fc_rows // crow) - 1
        if i >= last - 1:
            if i % 2 and i - 1 < last - 1:      # the chunk before waited to pair with this one
                self.gelu(t, r - crow, crow)
            self.gelu(t, r, n)
        elif i % 2:
            self.gelu(t, r - crow, n + crow)

    def _fc_tail(self, tail, fc_rows):
        """c_fc's last chunk's GELU, and GELU over x_h's columns past the matrix's last row
        block."""
        tail()
        fS = self.dims.fS
        if fc_rows < fS:
            for t in range(self.T):
                self.gelu(t, fc_rows, fS - fc_rows)

    def residual(self, t, r, n, y=None, to_xa=False):
        """x += y on the rows a MATVEC job finished (and fp16(x) into x_a with ``to_xa``)."""
        b, dS = self.b, self.dims.dS
        y = b.v_y if y is None else y
        self.vec("ADD", b.v_x + t * dS + r, b.v_x + t * dS + r, n, src2=y + t * dS + r,
                 xdst=b.x_a + t * dS + r if to_xa else None)

    def projection(self, parts, xb, xstride, bias, first=None, inputs=None):
        """y = m x + bias into v_y, then x += y. On one card the bias rides in the MATVEC and
        the residual follows each finished chunk; on several, every card holds a partial sum
        in v_y, and the bias and the residual ride in them: card 0's MATVEC starts from x
        (its bias operand, each token's own: MATVEC.btok), card 1's from the bias, and the
        collective writes the new x: in decode an all-gather and the sums in card order (where
        its buffer fits), in prefill (and otherwise) an all-reduce, whose result the next
        LayerNorm converts to fp16.
        ``parts``: (matrix, first input column) parts by columns, the first into v_y, a
        second into v_yb and added up (one card), or from v_y's sums on (several);
        ``first()`` is emitted after the first MATVEC. ``inputs``: each part's (XB base,
        stride) instead of (xb + its first column, xstride)."""
        b, T, dS = self.b, self.T, self.dims.dS
        assert len(parts) <= 2
        bufs = [b.v_y, b.v_yb]
        one = self.cards == 1
        first_bias = bias if one else {0: b.v_x, 1: bias}.get(self.card)
        btok = int(not one and self.card == 0)     # x: each token's own
        x16 = self.x16_x
        for k, (mk, c0) in enumerate(parts):
            last = k == len(parts) - 1          # (its residuals write fp16(x) too)
            # On several cards the second part's sums start from the first's (its bias, each
            # token's own, in place) instead of going to v_yb and an ADD over every token.
            onto = k == 1 and not one
            x, xs = inputs[k] if inputs else (xb + c0, xstride)
            self.matvec(mk, x, xs, bufs[0] if onto else bufs[k], dS,
                        bias=first_bias if k == 0 else (b.v_y if onto else None),
                        then=partial(self.residual, y=bufs[k], to_xa=x16 and last) if one else None,
                        first=first if k == 0 else None, short_tail=one and last,
                        btok=btok if k == 0 else int(onto))
        self.xa_ready = x16 and one     # (several cards: the collective below decides)
        self.after_coll = len(self.out)
        if one:
            return
        if self.decode and b.v_g is not None:
            # all-gather, then x = ((p0 + p1) + p2) + ... in card order, alike on every card;
            # the last addition writes fp16(x) for the next MATVEC. (A batch: every token's
            # partial sums in a card's block, in its own buffer.)
            g, blk = (b.v_g, b.g_blk) if self.batch is None else (b.v_gb, round_up(T * dS, self.beat))
            if self.batch is not None and b.v_gb2 is not None:
                # (this half's blocks with card 0's ending where the buffer's does)
                g += round_up(b.streams * dS, self.beat) - blk
            self.e("COLL", cop=0, src=b.v_y, dst=g, n=T * dS)
            self.after_coll = len(self.out)
            for j in range(1, self.cards):
                self.vec("ADD", b.v_x, g if j == 1 else b.v_x, T * dS, src2=g + j * blk,
                         xdst=b.x_a if x16 and j == self.cards - 1 else None)
            self.xa_ready = x16
            return
        # the all-reduce writes x and, where its beats end with x (no word past x_a), fp16(x)
        # into x_a for the next LayerNorm's MATVEC (COLL.x16) instead of a CVT16 pass
        x16 = x16 and ALLREDUCE_X16 and (T * dS) % self.beat == 0
        self.e("COLL", cop=2, src=b.v_y, dst=b.v_x, n=T * dS, **({"x16": 1, "xdst": b.x_a} if x16 else {}))
        self.xa_ready = x16
        self.after_coll = len(self.out)

    def lm_head(self):
        """Final LayerNorm and the LM head (the token embedding, tied), the LayerNorm folded
        into the head's own copy of the embedding and its bias loaded by chunks beside the
        logits. With all_logits every token's logits, in one buffer; else (generation) the
        last token's, by chunks of the Placement's two buffers: one chunk's logits are
        STOREd while the next computes."""
        b, T, rows, dims = self.b, self.T, self.hbm, self.dims
        head = rows.head
        if self.batch is not None:
            self.lm_head_batch()
            return
        if self.t0 + self.T < self.T_step:      # (a lead half: the step's last token is not its)
            return
        if self.all_logits:
            self.e("LOAD", vsp=b.v_hbias, n=dims.vS, row=rows.head_bias_row, f32=1)
            self.ln_matvec(head, b.v_logits, dims.vS, b.v_hbias, lambda j, r, n: None)
            self.store_f32(b.v_logits, T * dims.vS, rows.logits_row)
            return
        self._head_chunks(b.v_logits, b.v_hbias, b.chunk, [T - 1], 0, rows.logits_row, 0)

    def lm_head_batch(self):
        """A decode batch's LM head: every token's logits (``lm_head``'s chunks, each MATVEC
        taking every token; the logits of a chunk in the scores' and c_fc's buffers, dead by
        now, a token's after another's), token j's stored at the batch's logits row j."""
        b, T, L, dims = self.b, self.T, self.LW, self.dims
        unit = int(np.lcm(L * GROUP, self.S // 4))
        room = min(b.T * dims.H * dims.nS, b.T * dims.fS) // self.T_step   # words a token, each buffer
        hbias = b.v_hbias if isinstance(b.v_hbias, tuple) else (b.v_hbias,) * 2
        chunk = min(b.chunk or round_up(dims.vS, unit), room // unit * unit, round_up(dims.vS, unit))
        if chunk == 0:
            raise UserError(f"model: the LM head's logits of {T} streams do not fit in the "
                            f"buffers they share; allowed: fewer streams")
        self._head_chunks((b.v_sc, b.v_h), hbias, chunk, list(range(T)), round_up(chunk, self.P),
                          self.hbm.batch_logits_row + self.t0 * self.hbm.logits_rows, self.hbm.logits_rows)

    def _head_chunks(self, bufs, hbias, chunk, toks, stride, row, row_stride):
        """The LM head by chunks of ``chunk`` logits, chunk k's in ``bufs[k % 2]`` with its bias
        in ``hbias[k % 2]``, for step tokens ``toks`` (_LogitsBuffer: ``stride``, ``row``,
        ``row_stride``): the first chunk's MATVEC with the LayerNorm (ln_matvec), the others'
        with its fix-up alone; each finished chunk's logits stored while the next computes."""
        L, rows = self.LW, self.hbm
        head, per_row = rows.head, self.S // 4
        per = chunk // L                                  # LM head row blocks per buffer
        chunks = [(r0, min(per, head.rb - r0)) for r0 in range(0, head.rb, per)]
        for k, (r0, n) in enumerate(chunks):
            hb = hbias[k % 2]
            out = _LogitsBuffer(bufs[k % 2], r0 * L, n * L, toks, stride, row, row_stride, [0] * len(toks))
            self.e("LOAD", vsp=hb, n=n * L, row=rows.head_bias_row + r0 * L // per_row, f32=1)
            m = (self._block_row(head.row, r0, head.cb, self.i8), n, head.cb)
            tail = k == len(chunks) - 1         # (what the last job's work costs shows)
            if k == 0:
                self.ln_matvec(m, out.buf, stride, hb, partial(self._store_logits, out), toks=toks,
                               short_tail=tail)
            else:      # (the statistics are done: the fix-up alone)
                self.matvec(m, self.xa, self.dims.dS, out.buf, stride, tokens=len(toks),
                            then=partial(self._fix_store_logits, out, hb), short_tail=tail)

    def _store_logits(self, out, j, r, rows):
        """Each MATVEC chunk's logits (of its token j) go out while the next chunk computes,
        in whole stripe rows (the buffer's rest at its end)."""
        per_row = self.S // 4
        end = r + rows if r + rows == out.rows else (r + rows) // per_row * per_row
        done = out.done[j]
        if end > done:
            self.store_f32(out.buf + j * out.stride + done, end - done,
                           out.row + j * out.row_stride + (out.first + done) // per_row)
            out.done[j] = end

    def _fix_store_logits(self, out, hb, j, r, rows):
        self.ln_fixup(out.toks[j], out.buf + j * out.stride + r, rows, hb + r)
        self._store_logits(out, j, r, rows)


def _region(regions, r, n):
    """(VSP word of token 0's row r, the stride between tokens) where rows r .. r + n lie:
    ``regions`` = [(first row, base, width)], by rows, token t's rows of a region at base +
    t width (the rows must not cross into the next region)."""
    row0, base, width = next(g for g in reversed(regions) if g[0] <= r)
    assert r + n <= row0 + width, (r, n, row0, width)
    return base + r - row0, width


def _shifted(plan, dims, k, cards, beat, P):
    """``plan`` for the second half of a split step (``split_program``): every per-token
    buffer from the step's token k on (the half's token 0), and the second of the halves'
    all-gather and LayerNorm buffers."""
    f = dict(v_x=dims.dS, v_y=dims.dS, v_yb=dims.dS, v_a=dims.dS, v_qkv=dims.qS,
             v_sc=dims.H * dims.nS, v_att=dims.aS, v_zinv=dims.aS, v_h=dims.fS,
             v_scal=(4 + 2 * dims.H) * P, x_a=dims.dS, x_q=dims.dq, x_p=dims.H * dims.nS,
             x_att=dims.dq, x_h=dims.fS)
    new = {name: getattr(plan, name) + k * stride for name, stride in f.items()}
    if plan.v_zinv == plan.v_sc:         # (in its own scores' buffer, as the first half's is)
        new["v_zinv"] = new["v_sc"]
    if plan.v_gb2 is not None:
        new["v_gb"] = plan.v_gb2
    elif plan.v_gb is not None:
        new["v_gb"] = plan.v_gb + cards * round_up(k * dims.dS, beat)
    new["v_ln"] = plan.v_ln2
    return replace(plan, **new)


def split_at(cm, T):
    """Where a step of T tokens is cut in two by ``split_program``, or None: not cut. A step is
    cut on several cards (where the collectives are) with two parameter areas, and not with
    the hidden-state dumps or every token's logits; the first half takes a multiple of
    core.reuse tokens (a weight tile meets R tokens a cycle: halves of ceil(T / 2) and the
    rest would cost the matrix unit more cycles than the whole step), and both halves at
    least two tokens (so never fewer than four)."""
    if T < 4:
        return None
    R = cm.cfg.core.reuse
    a = min(T - 1, R * -(-T // (2 * R)))
    if (cm.cards == 1 or cm.plan.param_areas < 2 or cm.dump_hidden or cm.all_logits or not cm.split
            or a < 2 or T - a < 2):
        return None
    return a


def split_program(cm, tokens, pos0, stream=0, batch=None, lead=0, lag=None):
    """A step of several tokens as two halves whose instructions interleave, so that one
    half's collectives and vector work run beside the other's MATVECs (in-order issue holds
    an instruction behind a COLL's or a MATVEC's reader; the other half's work does not
    read them). The halves are Emitters of the step's first ``split_at`` tokens and of the
    rest, each its own buffers (the rest's the plan's from its first token on: ``_shifted``)
    and each token computed as in the whole step (a MATVEC's tokens do not meet; the
    LayerNorm statistics and the all-gather's sums are a token's own). With a batch, the
    halves' streams; in prefill, the first half's positions then the second's (whose
    attention reads the first's K and V: its STOREs come before, in the order below).

    The order, by parts (``Emitter.items``: the embeddings, per layer Q = LayerNorm and
    c_attn, T = attention, P = attn.c_proj and its collective, M = the MLP and its
    collective; the LM head), the second half two parts (SPLIT_LAG) behind the first:
    a.pre b.pre | a.Q0 a.T0 a.P0 b.Q0 a.M0 b.T0 | a.Q1 b.P0 a.T1 b.M0 a.P1 b.Q1 a.M1 b.T1 |
    ... | b.P(L-1) b.M(L-1) a.head b.head. The first half loads the next layer's parameters
    in its P (after the second half's M of the layer before, the last to read that area);
    every card has the same COLLs in the same order. ``lead``: the merge's (interleave);
    ``lag``: the parts the second half runs behind the first (default SPLIT_LAG; 1 or 2
    with two parameter areas, up to 6 with three)."""
    T = len(tokens)
    a = split_at(cm, T)
    halves = []
    for k, (t0, n) in enumerate(((0, a), (a, T - a))):
        e = Emitter(cm, tokens[t0:t0 + n], pos0 + (t0 if batch is None else 0), stream=stream,
                    batch=batch[t0:t0 + n] if batch is not None else None, half=(t0, k == 0, T))
        e.items()
        ends = e.marks
        parts = [e.out[lo:hi] for lo, hi in zip([0] + ends[:-1], ends, strict=True)]
        halves.append((e, parts, [0] + ends[:-1]))
    L = len(cm.hbm.layers)
    order = [(0, 0), (1, 0)]

    def part(h, layer, stage):
        return (h, 1 + 4 * layer + stage)

    Q, A, P, M = range(4)
    lag = SPLIT_LAG if lag is None else lag
    if not 1 <= lag <= 4 * cm.plan.param_areas - 6:     # (the loads' barriers below allow it)
        raise ValueError(f"split_program: lag {lag}; allowed 1..{4 * cm.plan.param_areas - 6} "
                         f"with {cm.plan.param_areas} parameter areas")
    for j in range(4 * L + lag):         # the first half's part j, the second's j - lag
        order += [(0, 1 + j)] * (j < 4 * L) + [(1, 1 + j - lag)] * (j >= lag)
    order += [(0, 1 + 4 * L), (1, 1 + 4 * L)]
    assert sorted(order) == [(h, i) for h in range(2) for i in range(2 + 4 * L)]
    # The COLLs in that order; the orders between the halves that their values depend on.
    colls = []
    for h, i in order:
        e, parts, _ = halves[h]
        colls += [h] * sum(1 for x in parts[i] if not isinstance(x, Job) and decode(x).op == "COLL")
    count = [0, 0]
    coll_order = []
    for h in colls:
        coll_order.append((h, count[h]))
        count[h] += 1
    (ea, pa, sa), (eb, pb, sb) = halves

    def start(h, i):
        return halves[h][2][i]

    def end(h, i):
        return halves[h][2][i] + len(halves[h][1][i])

    bars = [Barrier(1, start(1, part(1, 0, Q)[1]), end(0, part(0, 0, A)[1]))]  # constants, layer 0's
    for li, pos in ea.param_loads.items():   # layer li + 1's parameters, where layer li + 1 - areas's were
        bars.append(Barrier(1, start(1, part(1, li + 1, Q)[1]), pos + 1))
        if li + 1 >= cm.plan.param_areas:       # (the area's last reader: layer li + 1 - areas)
            bars.append(Barrier(0, pos, end(1, part(1, li + 1 - cm.plan.param_areas, M)[1])))
    if batch is None:      # prefill: the second half's attention reads the first's K and V
        bars += [Barrier(1, start(1, part(1, li, A)[1]), end(0, part(0, li, A)[1])) for li in range(L)]
    bars.append(Barrier(1, start(1, 1 + 4 * L), end(0, 1 + 4 * L)))            # the LM heads' biases
    merged, where = interleave(cm.cfg, [ea.out, eb.out], bars, coll_order, lead=lead, cards=cm.cards)
    half_of = {id(x): h for h, e in enumerate((ea, eb)) for x in e.out if isinstance(x, Job)}
    out = []
    for item in merged:
        if isinstance(item, Job):     # (its earliest: a position in its half's items)
            item = replace(item, earliest=where[half_of[id(item)]][item.earliest])
        out.append(item)
    out.append(encode("HALT"))
    return place_wloads(out, cm.cfg.core.weight_fifo_tiles)
