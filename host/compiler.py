"""Compile a GPT-2 onto a card: the HBM image (weight tiles in stream order, parameters,
constants, KV cache) and, per generation step, the instruction stream.

Layouts (L lanes, W width, G = 8 row blocks per group):
- a weight matrix [out, in] is padded to whole L x W tiles and stored in the MATVEC stream
  order for groups of G row blocks: for each group, column block by column block, row block
  by row block; one tile per stripe row;
- the K caches of a layer (per head a matrix [position, head_dim]) in row-block-major tiles,
  the heads side by side within each group of G row blocks, so that one STORE writes a new
  position's K for every head (W-element groups into one lane of a tile per column block);
- the V caches of a layer (per head [hdp + L, position], transposed, with a row of ones that
  makes p.V give the softmax's sum) in column-block-major tiles, the heads side by side and
  each tile stored transposed (MATVEC.tt), so that one STORE writes a new position's V for
  every head, one write beat per tile;
- c_attn, c_fc and the LM head carry the LayerNorm before them (fold_layer_norm); q is
  pre-scaled by 1/sqrt(head_dim) in the weights (exact when head_dim is a power of 4);
- parameters (biases) and constants are fp32, loaded with LOAD.f32.

The step's schedule (which vector work runs beside which MATVEC, where LOADs and STOREs go)
is described in docs/architecture.md.

Prefetch: matrices are cut into MATVECs of at most half the weight FIFO (whole groups), and
each MATVEC's WLOAD is placed as early as the ISA allows: in MATVEC order, once its data are
in HBM (K/V after their STOREs), and while the streamed-but-unclaimed tiles fit in the FIFO.
So the weights of the next matrices stream while the vector unit works.
"""

import copy
from dataclasses import dataclass

import numpy as np

from hw.isa import encode

from .errors import UserError
from .stripes import read_stripes, write_stripes

__all__ = ["CompiledModel", "tiles_in_stream_order", "check_limits", "GROUP"]

GROUP = 8           # row blocks per group: >= the accumulator's reuse distance (Fp32Add + 2)


def _up(x, m):
    return -(-x // m) * m


def check_limits(cfg, shape, what="model"):
    """UserError naming the first of the model's sizes beyond the build's core.limits."""
    lim = cfg.core.limits
    for name, have, cap in (("d_model", shape.d_model, lim.d_model), ("heads", shape.n_head, lim.heads),
                            ("layers", shape.n_layer, lim.layers), ("vocab", shape.vocab, lim.vocab),
                            ("seq_len", shape.n_positions, lim.seq_len)):
        if have > cap:
            raise UserError(f"{what}: {name} {have} exceeds the build's core.limits.{name} = {cap} "
                            f"(by {have - cap}); use a larger config")


def _share(n, cards, card):
    """(first, count) of card ``card``'s balanced share of ``n`` items over ``cards``."""
    lo, hi = card * n // cards, (card + 1) * n // cards
    return lo, hi - lo


def fold_layer_norm(wt, bias, g, b):
    """A LayerNorm (gain g, shift b) folded into the linear layer after it (weights wt
    [out, d], bias): W (((x - mean) r) g + b) + bias = r (W diag(g) (I - 11^T / d)) x + (W b +
    bias), r = 1 / sqrt(var + eps). The matrix unit then runs on x itself (its fp16 copy) while
    the vector unit computes the mean and r beside it, and each output row becomes r z + bias'.
    The centred matrix's rows sum to zero, so x's mean drops out of z in exact arithmetic; in
    fp16 weights the residue is about |mean| / std x 2^-12 of z (docs/numerics.md). Computed in
    float64, returned as float32 (the image rounds the weights to fp16 once)."""
    wg = np.asarray(wt, np.float64) * np.asarray(g, np.float64)[None, :]
    wc = wg - wg.mean(axis=1, keepdims=True)
    b2 = np.asarray(bias, np.float64) + np.asarray(wt, np.float64) @ np.asarray(b, np.float64)
    return wc.astype(np.float32), b2.astype(np.float32)


def tiles_in_stream_order(mat, L, W, group):
    """fp16 matrix [rows, cols] -> tiles [n, L, W] in the MATVEC stream order."""
    rows, cols = mat.shape
    R, C = _up(rows, L), _up(cols, W)
    pad = np.zeros((R, C), np.float16)
    pad[:rows, :cols] = mat
    rb, cb = R // L, C // W
    blocks = pad.reshape(rb, L, cb, W).transpose(0, 2, 1, 3)       # [rb, cb, L, W]
    order = [(r, c) for g0 in range(0, rb, group) for c in range(cb)
             for r in range(g0, min(g0 + group, rb))]
    return np.stack([blocks[r, c] for r, c in order]), rb, cb


class HbmImage:
    """A card's HBM contents, allocated by stripe rows."""

    def __init__(self, cfg):
        self.cfg = cfg
        self.S = cfg.stripe_bytes
        self.next_row = 0
        self.parts = []          # (row, bytes)

    def alloc(self, nbytes, data=None):
        row = self.next_row
        rows = max(1, -(-nbytes // self.S))
        self.next_row += rows
        if data is not None:
            self.parts.append((row, np.frombuffer(np.ascontiguousarray(data).tobytes(), np.uint8)))
        return row, rows

    def write(self, dev):
        for row, data in self.parts:
            write_stripes(dev, self.cfg, row, data)


class Vsp:
    """First-fit allocator for VSP words or XB words, aligned. The VSP's segments have one
    read port each: a buffer given ``avoid`` (buffers a two-operand vector operation reads it
    with) goes where it shares no segment with them if there is room, else anywhere."""

    def __init__(self, words, align, what, segment=None):
        self.words, self.align, self.what = words, align, what
        self.segment = segment or words
        self.used = {}                      # start -> end

    def _segs(self, a, n):
        return set(range(a // self.segment, (a + max(n, 1) - 1) // self.segment + 1))

    def _fits(self, a, n):
        return a + n <= self.words and all(a + n <= lo or hi <= a for lo, hi in self.used.items())

    def __call__(self, n, align=None, avoid=(), strict=False, split=None):
        """``split``: where room allows, word ``split`` of the buffer starts a segment (a
        two-operand pass reads the words before it with those after it)."""
        al = align or self.align
        cands = sorted({_up(x, al) for x in [0, *self.used.values(),
                                              *range(0, self.words, self.segment)]})
        bad = set().union(*(self._segs(b, self.used[b] - b) for b in avoid if b in self.used))
        apart = [a for a in cands if not self._segs(a, n) & bad]
        tries = [apart] if strict else [apart, cands]
        if split is not None:       # split first, then apart
            at = [b - split for b in range(self.segment, self.words, self.segment)
                  if b - split >= 0 and (b - split) % al == 0]
            tries = [[a for a in at if not self._segs(a, n) & bad]] + ([] if strict else [at]) + tries
        a = next((a for t in tries for a in t if self._fits(a, n)), None)
        if a is None:
            raise UserError(f"model: needs more than the {self.words} {self.what} words this "
                            f"build has (core.{'vsp' if self.what == 'VSP' else 'xb'}_words)")
        self.used[a] = a + n
        return a


@dataclass
class LayerRows:
    params: int
    qkv: tuple
    proj: tuple
    fc: tuple
    fc2: list            # [(matrix, first column)]: mlp.c_proj by parts of its columns
    k: int           # the K cache of every head (layout in _Emitter.program)
    v: int           # the V cache of every head


class CompiledModel:
    """A GPT-2 compiled for card ``card`` of ``cards`` (intra-layer, as DFX does: this card's
    share of the heads, of the MLP's columns and of the vocabulary; an all-reduce (COLL) after
    each projection gives every card the whole residual stream)."""

    def __init__(self, cfg, model, *, card=0, cards=1, max_tokens=None, dump_hidden=False,
                 all_logits=False, param_areas=None):
        self.cfg, self.model = cfg, model
        sh = model.shape
        self.weights = model.weights      # None: a shapes-only compile (programs, no image)
        c = cfg.core
        self.L, self.W, self.P = c.lanes, c.width, c.vector_lanes
        self.S = cfg.stripe_bytes
        self.sh = sh
        self.dump_hidden = dump_hidden
        check_limits(cfg, sh)
        self.card, self.cards = card, cards
        if not 1 <= cards <= sh.n_head:
            raise UserError(f"--cards: {cards} cards for a model of {sh.n_head} heads; allowed: "
                            f"1 to {sh.n_head} (every card takes at least one head)")
        # This card's share of the heads and MLP columns: balanced, the first cards taking
        # one fewer where N does not divide (GPT-2 1.5B's 25 heads on 4 cards: 6, 6, 6, 7).
        self.h0, self.H = _share(sh.n_head, cards, card)
        self.f0, self.F = _share(sh.d_ff, cards, card)
        self.Hmax = -(-sh.n_head // cards)          # the largest share (tokens per step)
        vl = _up(-(-sh.vocab // cards), self.L)
        self.v0 = card * vl                                          # this card's vocabulary slice
        self.Vn = min(vl, sh.vocab - self.v0)
        if self.Vn < 1:
            raise UserError(f"--cards: {cards} cards are more than the vocabulary of {sh.vocab} "
                            f"can be split over")
        self.B = cfg.link.data_bits // 32                            # COLL beat, words
        L, W = self.L, self.W
        d, hd = sh.d_model, sh.head_dim
        self.hdp = _up(hd, W)                 # a head's q/k/v padded to whole blocks
        # A head's V rows: hdp and a block of L more whose first row is 1 for every position
        # (its weights 0, its bias 1): p.V then gives the softmax's sum beside the output.
        self.hvp = self.hdp + L
        self.dS = _up(d, W)                   # token strides, whole XB blocks
        # Scores per (token, head): the K MATVEC computes whole groups of row blocks.
        self.nS = _up(sh.n_positions, max(W, L * GROUP))
        self.all_logits = all_logits
        # Tokens per step: as many as the on-chip buffers hold, at most 8 (the ISA's limit),
        # chosen for the largest share so that every card of the appliance steps alike (each
        # card then places its own, smaller or equal, buffers).
        self._shares(self.Hmax, -(-sh.d_ff // cards), vl)
        # Two parameter areas (the next layer's parameters load while this layer runs) where
        # they fit, else one (the load waits for the layer's last use of its parameters). Two
        # areas at fewer tokens per step come first: they keep a LOAD per layer off the
        # critical path of every decode step, while more tokens per step buy prefill little
        # (no weight reuse yet).
        # Placing buffers apart by VSP segment (Vsp's avoid) leaves holes: where nothing fits
        # with it, the buffers are placed without it.
        tries = [(a, T, s) for s in (True, False) for a in ([param_areas] if param_areas else [2, 1])
                 for T in ([max_tokens] if max_tokens else range(8, 0, -1))]
        for k, (self.param_areas, self.T, self._by_segment) in enumerate(tries):
            self._gather = None
            try:
                self._alloc_onchip()
                break
            except UserError:
                if k == len(tries) - 1:
                    raise
        self._shares(self.H, self.F, self.Vn)
        self._alloc_onchip()                  # this card's share fits where the largest did
        self.img = HbmImage(cfg)
        self._build_image()

    def _shares(self, H, F, Vn):
        """Sizes that follow this card's share of heads, MLP columns and vocabulary."""
        self.dq = H * self.hdp
        self.dv = H * self.hvp
        self.aS = _up(self.dv, self.W)
        self.qS = _up(2 * self.dq + self.dv, self.W)
        # c_attn's output rows: K, then V, then q, so that the caches' STOREs (V's is slow: a
        # new position's values go to one channel as single beats) start while the MATVEC
        # still runs, and q, which the K MATVECs wait for anyway, comes last.
        self.k_off, self.v_off, self.q_off = 0, self.dq, self.dq + self.dv
        self.fS = _up(F, self.W)
        self.vS = _up(Vn, self.L)
        self._Hbuf, self._Fbuf = H, F

    # -- HBM image --------------------------------------------------------------------------
    def _matrix(self, rows, cols, make):
        """Allocate a [rows, cols] weight matrix in stream order; ``make()`` gives its values
        (not called for a shapes-only compile)."""
        L, W = self.L, self.W
        rb, cb = -(-rows // L), -(-cols // W)
        if self.weights is None:
            row, _ = self.img.alloc(rb * cb * L * W * 2)
            return row, rb, cb
        mat = make()
        assert mat.shape == (rows, cols), (mat.shape, rows, cols)
        tiles, rb, cb = tiles_in_stream_order(mat.astype(np.float16), L, W, GROUP)
        row, _ = self.img.alloc(tiles.nbytes, tiles)
        return row, rb, cb

    def _build_image(self):
        sh, w = self.sh, self.weights
        d, H, hd = sh.d_model, self.H, sh.head_dim
        hdp, dq, L, W = self.hdp, self.dq, self.L, self.W
        h0, f0, F = self.h0, self.f0, self.F
        img = self.img
        self.const_row, _ = img.alloc(self.S, np.array([1.0 / d, sh.eps], np.float32))
        self.zero_row, _ = img.alloc(_up(self.nS * 4, self.S), np.zeros(self.nS, np.float32))
        self.tok_rows = max(1, -(-2 * d // self.S))
        for name, count in (("wte", sh.vocab), ("wpe", sh.n_positions)):
            table = None
            if w is not None:
                table = np.zeros((count, self.tok_rows * self.S // 2), np.float16)
                table[:, :d] = w[f"{name}.weight"]
            row, _ = img.alloc(count * self.tok_rows * self.S, table)
            setattr(self, f"{name}_row", row)
        scale = 1.0 / np.sqrt(hd)

        def vec(name, n):
            return np.zeros(n, np.float32) if w is None else w[name]

        dv, hvp = self.dv, self.hvp
        self.layers = []
        for i in range(sh.n_layer):
            p = f"h.{i}."
            # Rows of the padded qkv output: k heads (hdp rows each), v heads (hvp), q heads.
            bqkv = np.zeros(2 * dq + dv, np.float32)
            bfc = np.zeros(F, np.float32)

            def qkv(p=p, bqkv=bqkv):
                wa, ba = fold_layer_norm(w[p + "attn.c_attn.weight"].T, w[p + "attn.c_attn.bias"],
                                         w[p + "ln_1.weight"], w[p + "ln_1.bias"])   # [3d, d]
                out = np.zeros((2 * dq + dv, d), np.float32)
                for part in range(3):
                    for h in range(H):
                        g = h0 + h                                 # the model's head index
                        src = slice(part * d + g * hd, part * d + (g + 1) * hd)
                        r0 = (self.q_off, self.k_off, self.v_off)[part] + h * (hvp if part == 2 else hdp)
                        s = scale if part == 0 else 1.0
                        out[r0:r0 + hd] = wa[src] * s
                        bqkv[r0:r0 + hd] = ba[src] * s
                for h in range(H):
                    bqkv[self.v_off + h * hvp + hdp] = 1.0     # the row of ones
                return out

            def proj(p=p):
                out = np.zeros((d, dq), np.float32)        # input columns: the heads, hdp each
                for h in range(H):
                    g = h0 + h
                    out[:, h * hdp:h * hdp + hd] = w[p + "attn.c_proj.weight"].T[:, g * hd:(g + 1) * hd]
                return out

            m_qkv = self._matrix(2 * dq + dv, d, qkv)      # fills bqkv
            m_proj = self._matrix(d, dq, proj)
            def fc(p=p, bfc=bfc):
                wf, bf = fold_layer_norm(w[p + "mlp.c_fc.weight"].T[f0:f0 + F],
                                         w[p + "mlp.c_fc.bias"][f0:f0 + F],
                                         w[p + "ln_2.weight"], w[p + "ln_2.bias"])
                bfc[:] = bf
                return wf

            m_fc = self._matrix(F, d, fc)                   # fills bfc
            fa = self._fc2_split(F, d)
            m_fc2 = [(self._matrix(d, c1 - c0, lambda c0=c0, c1=c1, p=p:
                                   w[p + "mlp.c_proj.weight"].T[:, f0 + c0:f0 + c1]), c0)
                     for c0, c1 in ((0, fa), (fa, F)) if c1 > c0]
            params = self._param_vector([bqkv, vec(p + "attn.c_proj.bias", d), bfc,
                                         vec(p + "mlp.c_proj.bias", d)], self.par_align)
            prow, _ = img.alloc(params.nbytes, params if w is not None else None)
            self._layer_offsets, self._layer_len = self._param_offsets, self._param_len
            self.layers.append(LayerRows(params=prow, qkv=m_qkv, proj=m_proj, fc=m_fc, fc2=m_fc2,
                                         k=0, v=0))
        hbias = np.zeros(self.vS, np.float32)

        def head():
            wh, bh = fold_layer_norm(w["wte.weight"][self.v0:self.v0 + self.Vn],
                                     np.zeros(self.Vn), w["ln_f.weight"], w["ln_f.bias"])
            hbias[:self.Vn] = bh
            return wh

        self.head = self._matrix(self.Vn, d, head)          # fills hbias
        self.head_bias_row, _ = img.alloc(hbias.nbytes, hbias if w is not None else None)
        # The KV caches, one contiguous region (zeroed when a model is loaded); per layer the
        # heads side by side, so that one STORE writes a token's K (V) for every head.
        kb = _up(sh.n_positions, L * GROUP) // L * (hdp // W)
        vb = _up(sh.n_positions, W) // W * (self.hvp // L)
        kv0 = img.next_row
        for rows in self.layers:
            rows.k = img.alloc(H * kb * self.S)[0]
            rows.v = img.alloc(H * vb * self.S)[0]
        self.kv_rows = (kv0, img.next_row)
        self.logits_row, _ = img.alloc((self.T if self.all_logits else 1) * self.vS * 4)
        per = -(-self.T * self.dS * 4 // self.S)
        self.hidden_row, _ = img.alloc((sh.n_layer + 1) * per * self.S)
        self.prog_addr = (img.next_row + 4) * self.cfg.hbm_beat_bytes
        if img.next_row + 4 > self.cfg.channel_rows:
            raise UserError(f"model: needs {img.next_row} stripe rows of HBM per channel; the build has "
                            f"{self.cfg.channel_rows}")

    def _fc2_split(self, F, d):
        """mlp.c_proj's columns [0, fa) and [fa, F): fa = the rows of all but the last of the
        MATVEC chunks c_fc runs in (_Emitter.matvec), so that the first part can run while the
        last chunk's GELU does; F (no split) where c_fc is one chunk."""
        L, W = self.L, self.W
        rb, per = -(-F // L), self.chunk_blocks(-(-d // W))
        fa = (-(-rb // per) - 1) * per * L
        return fa if 0 < fa < F and fa % W == 0 else F

    def chunk_blocks(self, cb, group=GROUP):
        """Row blocks per MATVEC chunk of a weight matrix of ``cb`` column blocks: whole
        groups, at most half the weight FIFO (_Emitter.matvec)."""
        return max(1, (self.cfg.core.weight_fifo_tiles // 2) // (group * cb)) * group

    def _param_vector(self, parts, first_align=None):
        """fp32 vector of parts, each starting at a multiple of P (the VSP offsets match), the
        second at a multiple of ``first_align`` (a stripe row: the first part loads alone)."""
        offs, n = [], 0
        for k, p in enumerate(parts):
            offs.append(n)
            n = _up(n + len(p), first_align if k == 0 and first_align else self.P)
        v = np.zeros(n, np.float32)
        for o, p in zip(offs, parts, strict=True):
            v[o:o + len(p)] = p
        self._param_offsets = offs
        self._param_len = n
        return v

    def _alloc_onchip(self):
        c, sh, T = self.cfg.core, self.sh, self.T
        d, F = sh.d_model, self._Fbuf
        v = Vsp(c.vsp_words, self.P, "VSP",
                c.vsp_words // c.vsp_segments if self._by_segment else c.vsp_words)
        self.v_const = v(self.P)
        self.v_mask = v(self.nS)      # decode: 0 up to the step's position, -inf past it
        self.v_x = v(_up(T * self.dS, self.B))     # (an all-reduce's result: whole beats)
        # Decode's all-reduces as an all-gather of the cards' partial sums (N - 1 ring steps
        # instead of 2(N - 1)) and their sum in card order on every card, x = p0 + p1, then
        # x += p2 ...: card 0's block in another segment than the rest (and x where room
        # allows), so that each addition reads its operands from two segments. Where it fits
        # (decided for the largest share, so that every card's programs have the same COLLs).
        self.v_g = None
        self.g_blk = _up(self.dS, self.B)         # a card's block of the all-gather's result
        if self.cards > 1 and self._gather is not False:
            try:
                self.v_g = v(self.cards * self.g_blk, avoid=[self.v_x], split=self.g_blk)
            except UserError:
                if self._gather:
                    raise
        if self._gather is None:
            self._gather = self.v_g is not None
        self.v_y = v(_up(T * self.dS, self.B), avoid=[self.v_x])   # all-reduced in place
        self.v_yb = v(T * self.dS, avoid=[self.v_x, self.v_y])      # mlp.c_proj's second part
        self.v_qkv = v(T * self.qS)
        self.v_sc = v(T * self._Hbuf * self.nS)
        self.v_att = v(T * self.aS)
        # The softmax sums' reciprocals go over the scores (dead once converted for p.V).
        self.v_zinv = self.v_sc if self._Hbuf * self.nS >= self.aS else v(T * self.aS)
        self.v_h = v(T * self.fS)
        # The LayerNorms' statistics write these beside the MATVEC writing its output: away
        # from the matrix unit's outputs where room allows (a segment takes one write a
        # cycle, and the vector unit's go first).
        outs = [self.v_qkv, self.v_h, self.v_y, self.v_yb]
        self.v_a = v(T * self.dS, avoid=outs)                       # x - mean, squared
        self.v_scal = v((4 + 2 * self._Hbuf) * T * self.P, avoid=outs)
        # (c_attn's bias first, up to a stripe boundary: layer 0 loads it alone, first)
        self.par_align = int(np.lcm(self.P, self.S // 4))
        plen = _up(self.qS, self.par_align) + sum(_up(n, self.P) for n in (d, F, d))
        # Two parameter areas, alternate layers: the next layer's LOAD does not wait for the
        # last readers of this layer's parameters. One where two do not fit.
        readers = [self.v_y, self.v_qkv, self.v_h]               # their ADDs read the biases
        a = v(plen, avoid=readers)
        self.v_pars = (a, v(plen, avoid=readers) if self.param_areas == 2 else a)
        if self.all_logits:
            self.v_logits = v(T * self.vS)
            self.v_hbias = v(self.vS)
        else:
            # The LM head in chunks of whole groups of row blocks, two buffers: one chunk's
            # logits are stored while the next is computed.
            unit = int(np.lcm(self.L * GROUP, self.S // 4))
            free = c.vsp_words - sum(hi - lo for lo, hi in v.used.items())
            whole = _up(self.vS, unit)
            top = min(whole, max(unit, free // 4 // unit * unit))
            # The whole head in one chunk (a buffer each for logits and bias) if it fits, else
            # the largest chunk whose four buffers fit where room is left; the biases in other
            # segments than the logits if that can be (their ADD reads both).
            tries = [(whole, s, 1) for s in (True, False)]
            tries += [(k, s, 2) for k in range(top, 0, -unit) for s in (True, False)]
            for self.chunk, strict, bufs in tries:
                try:
                    trial = copy.deepcopy(v)
                    logits = tuple(trial(self.chunk) for _ in range(bufs))
                    hbias = tuple(trial(self.chunk, avoid=list(logits), strict=strict)
                                  for _ in range(bufs))
                    logits, hbias = logits * (2 // bufs), hbias * (2 // bufs)
                    break
                except UserError:
                    if not strict and self.chunk <= unit:
                        raise
            v.used = trial.used
            self.v_logits, self.v_hbias = logits, hbias
        xb = Vsp(c.xb_words, self.W, "XB")
        self.x_a = xb(T * self.dS)
        self.x_q = xb(T * self.dq)
        self.x_p = xb(T * self._Hbuf * self.nS)
        self.x_att = xb(T * self.dq)         # the heads' outputs, dense: c_proj's input
        self.x_h = xb(T * self.fS)

    def load(self, dev):
        """Write the image (weights, parameters, constants, zeroed KV cache) into a card."""
        if self.weights is None:
            raise ValueError("a shapes-only compile has no image to load")
        self.img.write(dev)
        lo, hi = self.kv_rows
        if hi > lo:
            write_stripes(dev, self.cfg, lo, np.zeros((hi - lo) * self.S, np.uint8))

    # -- programs ---------------------------------------------------------------------------
    def step(self, tokens, pos0):
        """Program for ``tokens`` (at most max_tokens) at positions pos0, pos0 + 1, ..."""
        T = len(tokens)
        if not 1 <= T <= self.T:
            raise ValueError(f"step: {T} tokens; 1..{self.T} allowed")
        if pos0 + T > self.sh.n_positions:
            raise UserError(f"prompt: position {pos0 + T - 1} is beyond the model's context "
                            f"({self.sh.n_positions} positions)")
        return _Emitter(self, list(tokens), pos0).program()

    def read_logits(self, dev, T):
        """Logits of the step's tokens (all of them if compiled with all_logits, else the last)."""
        T = T if self.all_logits else 1
        rows = -(-T * self.vS * 4 // self.S)
        raw = read_stripes(dev, self.cfg, self.logits_row, rows)[:T * self.vS * 4].view(np.float32)
        return raw.reshape(T, self.vS)[:, :self.Vn]

    def read_hidden(self, dev, T):
        per = -(-self.T * self.dS * 4 // self.S)
        out = []
        for k in range(self.sh.n_layer + 1):
            raw = read_stripes(dev, self.cfg, self.hidden_row + k * per, per)
            vals = raw[:self.T * self.dS * 4].view(np.float32).reshape(self.T, self.dS)
            out.append(vals[:T, :self.sh.d_model])
        return np.stack(out)


@dataclass
class _Job:
    """One MATVEC and the tiles it consumes; its WLOAD is placed by the scheduler."""
    index: int
    segs: list             # (first stripe row, tiles): the WLOADs that stream its tiles
    tiles: int
    fields: dict
    earliest: int          # position in the program before which its tiles may not stream


class _Emitter:
    """Builds one step's program (see the module docstring for the order of things).

    Instructions are collected with MATVECs as jobs; ``schedule`` then places every job's
    WLOAD as early as its data allow and the weight FIFO holds (the ISA's rule: tiles streamed
    and unclaimed never exceed core.weight_fifo_tiles), in MATVEC order."""

    def __init__(self, cm, tokens, pos0):
        self.cm, self.tokens, self.pos0 = cm, tokens, pos0
        self.T = len(tokens)
        self.out = []
        self.jobs = []
        self.kv_ready = 0          # K/V tiles may stream only after this position (their STOREs)
        self.w_ready = 0           # no weight tiles stream before this position
        # fp16(x) goes to x_a with the residual stream's last write (VEC.x16) instead of a
        # CVT16 pass of its own where x has no padding words (d a multiple of W) to convert.
        self.x16_x = cm.sh.d_model % cm.W == 0
        self.xa_ready = False      # x_a holds fp16(x) of the step's tokens (ln_matvec)
        self.xa = cm.x_a           # the XB input of the last ln_matvec

    def e(self, op, **f):
        self.out.append(encode(op, **f))

    def schedule(self):
        depth = self.cm.cfg.core.weight_fifo_tiles
        out, avail, k = [], 0, 0
        jobs = self.jobs

        def stream(j):
            for row, tiles in j.segs:
                out.append(encode("WLOAD", row=row, tiles=tiles))
            return j.tiles

        for idx, item in enumerate(self.out):
            while k < len(jobs) and jobs[k].earliest <= idx and avail + jobs[k].tiles <= depth:
                avail += stream(jobs[k])
                k += 1
            if isinstance(item, _Job):
                if k == item.index:          # not streamed yet: everything before is claimed
                    avail += stream(item)
                    k += 1
                out.append(encode("MATVEC", **item.fields))
                avail -= item.tiles
            else:
                out.append(item)
        assert k == len(jobs) and avail == 0
        return out

    def vec(self, vop, dst, src1, n, src2=0, bcast=0, k=0, xdst=None):
        """A VEC; with ``xdst`` the result goes to XB (fp16) at xdst too (VEC.x16)."""
        self.e("VEC", vop=vop, dst=dst, src1=src1, src2=src2, n=n, bcast=bcast, k=k,
               x16=int(xdst is not None), xdst=xdst or 0)

    def matvec(self, m, xb, xstride, dst, dstride, bias=None, group=GROUP, kv=None, tokens=None,
               then=None, first=None, defer_last=False, tt=0, short_tail=False):
        """MATVEC jobs for matrix ``m`` = (first tile row, rb, cb): one per chunk of whole
        groups of row blocks, each at most half the weight FIFO (so that two fit). ``kv``: the
        matrix is a head's K or V cache, one job whose tiles are the runs of rows ``kv``
        (first row, tiles), streamed once the caches hold this step's rows. ``first()`` emits
        instructions right after the first MATVEC.

        ``then(t, row0, rows)`` emits the vector work on a finished chunk of the output (token
        t's rows row0 .. row0 + rows). Each chunk's work goes after the *next* chunk's MATVEC:
        in-order issue then waits for chunk k while chunk k + 1 already runs, so the matrix
        unit stays busy and the vector unit works beside it instead of after it. With
        ``short_tail`` the last chunk is the matrix's last group: the work on it, which
        nothing hides, is short."""
        row, rb, cb = m
        depth = self.cm.cfg.core.weight_fifo_tiles
        T = self.T if tokens is None else tokens
        group = min(group, 64 // T)
        if kv:
            chunks = [(0, rb)]
        else:
            per_group = group * cb
            if per_group > depth:
                raise UserError(f"model: one group of {group} row blocks of a {rb * self.cm.L} x "
                                f"{cb * self.cm.W} matrix is {per_group} tiles, more than the weight "
                                f"FIFO's {depth} (core.weight_fifo_tiles)")
            per = self.cm.chunk_blocks(cb, group)
            chunks = [(r0, min(per, rb - r0)) for r0 in range(0, rb, per)]
            r0, n = chunks[-1]
            k = (n - 1) // group * group        # (the tiles are stored by whole groups)
            if short_tail and k > 0:
                chunks[-1:] = [(r0, k), (r0 + k, n - k)]
        L = self.cm.L
        prev = None
        for r0, n in chunks:
            # (a job's tiles follow the matrix's stream order only from a group's start)
            assert kv or r0 % group == 0, (r0, group)
            if n * cb > depth:
                raise UserError(f"model: {n * cb} tiles in one MATVEC exceed the weight FIFO's "
                                f"{depth} (core.weight_fifo_tiles)")
            f = dict(xb=xb, dst=dst + r0 * L, rb=n, cb=cb, group=group, tokens=T,
                     xstride=xstride if T > 1 else 0, dstride=dstride if T > 1 else 0,
                     bias=(bias + r0 * L) if bias is not None else 0, bias_en=int(bias is not None),
                     tt=tt)
            segs = kv if kv else [(row + r0 * cb, n * cb)]
            self.out.append(_Job(len(self.jobs), segs, n * cb, f,
                                 max(self.w_ready, self.kv_ready if kv else 0)))
            self.jobs.append(self.out[-1])
            if first is not None and prev is None:
                first()
            if then is not None and prev is not None:
                self._then(then, T, prev, L)
            prev = (r0, n)
        if then is not None:
            if defer_last:      # the caller places the last chunk's work (returned)
                return lambda: self._then(then, T, prev, L)
            self._then(then, T, prev, L)
        return None

    def _then(self, then, T, chunk, L):
        r0, n = chunk
        for t in range(T):
            then(t, r0 * L, n * L)

    def scalar(self, t, k):
        """Token t's scalar slot k (P words each; 4 + 2H per token): 0..3 LayerNorm, 4 + h
        head h's max, 4 + H on: the heads' softmax sums, side by side."""
        return self.cm.v_scal + ((4 + 2 * self.cm.H) * t + k) * self.cm.P

    def ln_fixup(self, t, y, n, bias, x16=None):
        """y[0:n] = r y + bias[0:n], r token t's 1 / sqrt(var + eps) (ln_matvec). ``x16`` =
        (k, xdst): elements k.. also go to XB from xdst (fp16), for the next MATVEC."""
        self.vec("MUL", y, y, n, src2=self.scalar(t, 1), bcast=1)
        k, xdst = x16 if x16 is not None else (n, None)
        if k > 0:
            self.vec("ADD", y, y, k, src2=bias)
        if k < n:
            self.vec("ADD", y + k, y + k, n - k, src2=bias + k, xdst=xdst)

    def ln_matvec(self, m, dst, dstride, bias, then, defer_last=False, toks=None, before=None,
                  xq=None, **kw):
        """LayerNorm of the residual stream x followed by matrix ``m`` (its LayerNorm folded
        in: fold_layer_norm): the matrix unit starts on fp16(x) at once; the mean and
        r = 1 / sqrt(var + eps) of each token run on the vector unit beside the first chunk;
        each finished chunk of rows becomes r z + bias (then ``then(t, row0, rows)``).
        ``toks``: the tokens (default all) whose x go in, as the MATVEC's tokens 0, 1, ...;
        ``bias + r``: the VSP word of the bias for output row r. ``xq`` = (row, xb, stride):
        output rows from ``row`` on also go to XB as fp16, token j's at xb + j stride.

        fp16(x) is in x_a already (token t at x_a + t dS) where the residual stream's last
        writer put it there (VEC.x16: self.xa_ready); else a CVT16 puts it there."""
        cm, T, dS, d = self.cm, self.T, self.cm.dS, self.cm.sh.d_model
        inv_d, eps = cm.v_const, cm.v_const + 1
        toks = list(range(T)) if toks is None else toks
        if self.xa_ready:
            assert toks == list(range(toks[0], toks[0] + len(toks)))
            self.xa = cm.x_a + toks[0] * dS
        else:
            self.xa = cm.x_a
            if toks == list(range(T)):
                self.vec("CVT16", cm.x_a, cm.v_x, T * dS)
            else:
                for j, t in enumerate(toks):
                    self.vec("CVT16", cm.x_a + j * dS, cm.v_x + t * dS, dS)
        self.xa_ready = False

        def stats():        # up to the sum of squares: issued before the second chunk
            if before is not None:
                before()
            for t in toks:
                x, sq = cm.v_x + t * dS, cm.v_a + t * dS
                s0 = self.scalar(t, 0)
                self.vec("REDSUM", s0, x, d)
                self.vec("MUL", s0, s0, 1, src2=inv_d, bcast=1)
                self.vec("SUB", sq, x, d, src2=s0, bcast=1)
                self.vec("MUL", sq, sq, d, src2=sq)
                self.vec("REDSUM", self.scalar(t, 1), sq, d)

        def finish(j, r, n):
            t = toks[j]
            if r == 0:      # the first chunk: r for this token, after the second chunk's issue
                s1 = self.scalar(t, 1)
                self.vec("MUL", s1, s1, 1, src2=inv_d, bcast=1)
                self.vec("ADD", s1, s1, 1, src2=eps, bcast=1)
                self.vec("RSQRT", s1, s1, 1)
            x16 = None
            if xq is not None and r + n > xq[0]:
                k = max(xq[0] - r, 0)
                x16 = (k, xq[1] + j * xq[2] + r + k - xq[0])
            self.ln_fixup(t, dst + j * dstride + r, n, bias + r, x16=x16)
            then(j, r, n)

        return self.matvec(m, self.xa, dS, dst, dstride, first=stats, then=finish,
                           defer_last=defer_last, tokens=len(toks), **kw)

    def program(self):
        cm, sh, dS, d = self.cm, self.cm.sh, self.cm.dS, self.cm.sh.d_model
        # Embeddings and constants.
        # (the embeddings ahead of any weight tile in the read DMA's order: the first
        # LayerNorm waits for them)
        for t, tok in enumerate(self.tokens):
            if not 0 <= tok < sh.vocab:
                raise UserError(f"token id {tok} is outside the vocabulary (0..{sh.vocab - 1})")
            self.e("LOAD", vsp=cm.v_x + t * dS, n=d, row=cm.wte_row + tok * cm.tok_rows)
            self.e("LOAD", vsp=cm.v_y + t * dS, n=d, row=cm.wpe_row + (self.pos0 + t) * cm.tok_rows)
        self.e("LOAD", vsp=cm.v_const, n=2, row=cm.const_row, f32=1)
        if self.T == 1:
            # One token: the causal mask is the K MATVECs' bias (scores past the position
            # become -inf as they are summed), built once for every layer and head (the MASK
            # in layer 0, behind the first MATVEC).
            self.e("LOAD", vsp=cm.v_mask, n=cm.nS, row=cm.zero_row, f32=1)
        # The first tiles stream from here, while the embeddings are added up.
        self.w_ready = len(self.out)
        for t in range(self.T):
            x = cm.v_x + t * dS
            self.vec("ADD", x, x, d, src2=cm.v_y + t * dS,
                     xdst=cm.x_a + t * dS if self.x16_x else None)
        self.xa_ready = self.x16_x
        self.dump(0)
        for li, lr in enumerate(cm.layers):
            self.layer(li, lr)
        self.lm_head()
        self.e("HALT")
        return self.schedule()

    def residual(self, t, r, n, y=None, to_xa=False):
        """x += y on the rows a MATVEC job finished (and fp16(x) into x_a with ``to_xa``)."""
        cm, dS = self.cm, self.cm.dS
        y = cm.v_y if y is None else y
        self.vec("ADD", cm.v_x + t * dS + r, cm.v_x + t * dS + r, n, src2=y + t * dS + r,
                 xdst=cm.x_a + t * dS + r if to_xa else None)

    def gelu(self, t, r, n):
        """GELU and the fp16 copy for the next MATVEC."""
        cm, fS = self.cm, self.cm.fS
        h = cm.v_h + t * fS + r
        self.vec("GELU", h, h, n, xdst=cm.x_h + t * fS + r)

    def layer(self, li, lr):
        """Decoder layer li: LayerNorm and c_attn, the KV caches, attention, c_proj,
        LayerNorm and c_fc with GELU, mlp.c_proj; the residuals."""
        cm, T = self.cm, self.T
        H, hdp, dq = cm.H, cm.hdp, cm.dq
        L, W = cm.L, cm.W
        qS, fS, aS, hvp = cm.qS, cm.fS, cm.aS, cm.hvp
        last = self.pos0 + T - 1
        gelu = self.gelu
        par = cm.v_pars[li % 2]
        bqkv, bproj, bfc, bfc2 = (par + o for o in cm._layer_offsets)

        def next_params():
            nxt = cm.v_pars[(li + 1) % 2]
            if li + 1 < len(cm.layers):
                self.e("LOAD", vsp=nxt, n=cm._layer_len, row=cm.layers[li + 1].params, f32=1)

        # The KV caches, per layer the heads side by side so that one STORE per token
        # writes K (V) for every head. K: tile (head h, row block r, column block c) at
        # (r // G) * H * G * cbk + h * G * cbk + c * G + r % G (a head's tiles in its
        # MATVEC's stream order within each group of G row blocks). V (V^T, hvp rows by
        # positions): tile (h, row block j, column block c) at c * H * rbv + h * rbv + j,
        # stored transposed (MATVEC.tt): a new position's L values in a tile are contiguous,
        # one write beat, not L.
        cbk, rbv = hdp // W, hvp // L
        kgrp = H * GROUP * cbk                  # rows of one group of row blocks, all heads
        stored = set()                          # ("k", token) already STOREd
        v_stored = {}                           # token -> heads of its V STOREd

        def store_k(t):
            p = self.pos0 + t
            r = p // L
            self.e("STORE", vsp=cm.v_qkv + t * qS + cm.k_off, n=dq,
                   row=lr.k + (r // GROUP) * kgrp + r % GROUP, off=(p % L) * 2 * W,
                   lepg=W.bit_length() - 1, lgpr=0, gstride=0, rstride=GROUP)

        def store_v(t, h0, h1):
            """Heads h0 .. h1 - 1 of token t's V (their tiles are consecutive rows)."""
            p = self.pos0 + t
            self.e("STORE", vsp=cm.v_qkv + t * qS + cm.v_off + h0 * hvp, n=(h1 - h0) * hvp,
                   row=lr.v + (p // W) * H * rbv + h0 * rbv, off=2 * L * (p % W),
                   lepg=L.bit_length() - 1, lgpr=0, gstride=0, rstride=1)

        k_wait = []        # program positions after the K STOREs' next chunk

        def qkv_done(t, r, n):
            # A token's new K row goes into the cache as soon as c_attn's K rows are
            # final, its V column once the V rows are: the K MATVECs wait for them. Their
            # tiles may stream from the next chunk's work on (a WLOAD right behind the STOREs
            # would hold in-order issue, and the fix-ups with it, until they are done).
            if ("k", T - 1) in stored and not k_wait:
                k_wait.append(len(self.out))
            if r + n >= cm.k_off + dq and ("k", t) not in stored:
                store_k(t)
                stored.add(("k", t))
            # V by the heads whose rows are final (the STORE is slow: one channel takes a
            # position's values, a beat per tile; the first heads' go out a chunk earlier).
            v0 = v_stored.get(t, 0)
            v1 = min(H, max(0, r + n - cm.v_off) // hvp)
            if v1 > v0:
                store_v(t, v0, v1)
                v_stored[t] = v1

        def first_params():
            # Layer 0's parameters: c_attn's bias behind the first chunk's tiles (needed when
            # that chunk is done), the rest later; the other layers' come in the layer before.
            if li == 0:
                self.e("LOAD", vsp=par, n=cm._layer_offsets[1], row=lr.params, f32=1)
                self.w_ready = len(self.out)
                if T == 1:
                    self.vec("MASK", cm.v_mask, cm.v_mask, cm.nS, k=self.pos0)

        # q's rows go to XB as fp16 with their LayerNorm fix-up, for the K MATVECs.
        q16 = cm.q_off % cm.P == 0
        self.ln_matvec(lr.qkv, cm.v_qkv, qS, bqkv, qkv_done, before=first_params,
                       xq=(cm.q_off, cm.x_q, dq) if q16 else None)
        rbk = _up(-(-(last + 1) // L), GROUP)          # whole groups (rows past `last` masked)
        cbv = -(-(last + 1) // W)
        kseg = [[(lr.k + gi * kgrp + h * GROUP * cbk, GROUP * cbk) for gi in range(rbk // GROUP)]
                for h in range(H)]
        vgrp = min(rbv, 64 // T)         # V tiles in stream order: groups, then columns
        vseg = [[(lr.v + c * H * rbv + h * rbv + g0, min(vgrp, rbv - g0))
                 for g0 in range(0, rbv, vgrp) for c in range(cbv)] for h in range(H)]
        # Attention, heads side by side so that the units overlap: the matrix unit runs the
        # q.K^T of every head back to back while the vector unit takes each head's scores
        # as they come; exp and the fp16 conversions run once over all heads.
        # Layouts: q16 [t][h][hdp], scores and probabilities [t][h][sK], sK the rows the K
        # MATVECs write at this position (not the context's nS: EXP and CVT16 pass over
        # what is live).
        sK = _up(rbk * L, W)
        HN = H * sK
        if not q16:
            for t in range(T):
                self.vec("CVT16", cm.x_q + t * dq, cm.v_qkv + t * qS + cm.q_off, dq)
        self.kv_ready = k_wait[0] if k_wait else len(self.out)
        for h in range(H):
            self.matvec((0, rbk, cbk), cm.x_q + h * hdp, dq, cm.v_sc + h * sK, HN, kv=kseg[h],
                        bias=cm.v_mask if T == 1 else None)
        if li == 0:
            o = cm._layer_offsets[1]
            self.e("LOAD", vsp=par + o, n=cm._layer_len - o, row=lr.params + o * 4 // cm.S, f32=1)
        ns = cbv * W
        v_ready = []
        for h in range(H):
            for t in range(T):
                s = cm.v_sc + t * HN + h * sK
                m = self.scalar(t, 4 + h)
                if T > 1:
                    self.vec("MASK", s, s, ns, k=self.pos0 + t)
                self.vec("REDMAX", m, s, ns)
                self.vec("SUB", s, s, ns, src2=m, bcast=1)
            # Head h's V tiles stream from here: the V STOREs are done by now (earlier, in-order
            # issue would hold the K MATVECs behind WLOADs waiting for them), and spread over
            # the heads, their WLOADs do not fill the read DMA's queue of four at once.
            v_ready.append(len(self.out))
        # The probabilities' normalization is deferred past p.V: the V MATVECs take the
        # unnormalized exp(s - max) (in (0, 1], as fp16) and give each head's sum of them
        # beside its output (the V rows of ones); one RECIP over the output from the first
        # sum to the last takes the sums' reciprocals (the others go unused), and each head's
        # output is scaled by its (the MUL writing c_proj's fp16 input).
        self.vec("EXP", cm.v_sc, cm.v_sc, T * HN, xdst=cm.x_p)
        for h in range(H):
            self.kv_ready = v_ready[h]
            self.matvec((0, rbv, cbv), cm.x_p + h * sK, HN, cm.v_att + h * hvp, aS, group=vgrp,
                        kv=vseg[h], tt=1)
        self.vec("RECIP", cm.v_zinv + hdp, cm.v_att + hdp, (T - 1) * aS + (H - 1) * hvp + 1)
        for h in range(H):
            for t in range(T):
                a = cm.v_att + t * aS + h * hvp
                self.vec("MUL", a, a, hdp, src2=cm.v_zinv + t * aS + h * hvp + hdp, bcast=1,
                         xdst=cm.x_att + t * dq + h * hdp)
        self.projection(lr.proj, cm.x_att, dq, bproj)
        if cm.param_areas == 2:
            # Into the other area, while this layer runs: here, where the weight FIFO is
            # full with c_fc's tiles and the read DMA would idle through the LayerNorm (a
            # LOAD fills the VSP at vector_lanes words a cycle; earlier in the layer it
            # held up the K and V tiles behind it).
            next_params()
        # mlp.c_proj in two parts by columns (fold_layer_norm's sibling in _build_image):
        # the first, over the columns of all but c_fc's last chunk, runs while the vector
        # unit takes that chunk's GELU.
        fc_rows, crow = lr.fc[1] * L, cm.chunk_blocks(lr.fc[2]) * L

        def fc_done(t, r, n):
            # GELU over two chunks at once (its pipeline is long: 141 cycles a pass), but
            # the last chunk and one before it alone, so that mlp.c_proj's first part
            # does not wait for the last chunk.
            if r + n >= fc_rows or r + n + crow >= fc_rows:
                gelu(t, r, n)
            elif (r // crow) % 2:
                gelu(t, r - crow, n + crow)

        tail = self.ln_matvec(lr.fc, cm.v_h, fS, bfc, fc_done, defer_last=True)

        def fc_tail():
            tail()
            if lr.fc[1] * L < fS:       # columns of x_h past the matrix's last row block
                for t in range(T):
                    gelu(t, lr.fc[1] * L, fS - lr.fc[1] * L)

        if len(lr.fc2) == 2:     # after the first part's first MATVEC: it does not read them
            self.projection(lr.fc2, cm.x_h, fS, bfc2, first=fc_tail)
        else:                    # (in-order issue: a later writer would not hold it back)
            fc_tail()
            self.projection(lr.fc2, cm.x_h, fS, bfc2)
        if cm.param_areas == 1:     # over this layer's, after their last use
            next_params()
        self.dump(li + 1)

    def lm_head(self):
        cm, T, L = self.cm, self.T, self.cm.L
        head_row, head_rb, head_cb = cm.head
        per = head_rb if cm.all_logits else cm.chunk // L      # LM head row blocks per VSP buffer
        chunks = [(r0, min(per, head_rb - r0)) for r0 in range(0, head_rb, per)]
        # Final LayerNorm and the LM head (the token embedding, tied), the LayerNorm folded
        # into the head's own copy of the embedding (fold_layer_norm) and its bias loaded by
        # parts beside the logits.
        per_row = cm.S // 4
        if cm.all_logits:
            self.e("LOAD", vsp=cm.v_hbias, n=cm.vS, row=cm.head_bias_row, f32=1)
            self.ln_matvec(cm.head, cm.v_logits, cm.vS, cm.v_hbias, lambda j, r, n: None)
            self.store_f32(cm.v_logits, T * cm.vS, cm.logits_row)
        else:      # generation needs the last position's logits only
            for k, (r0, n) in enumerate(chunks):
                buf, hb = cm.v_logits[k % 2], cm.v_hbias[k % 2]
                self.e("LOAD", vsp=hb, n=n * L, row=cm.head_bias_row + r0 * L // per_row, f32=1)
                done = [0]              # logits of this buffer stored so far

                def store(j, r, rows, buf=buf, r0=r0, n=n, done=done):
                    # Each MATVEC chunk's logits go out while the next chunk computes, in
                    # whole stripe rows (the last chunk's rest at the end).
                    end = r + rows if r + rows == n * L else (r + rows) // per_row * per_row
                    if end > done[0]:
                        self.store_f32(buf + done[0], end - done[0],
                                       cm.logits_row + (r0 * L + done[0]) // per_row)
                        done[0] = end

                tail = k == len(chunks) - 1         # (what the last job's work costs shows)
                if k == 0:
                    self.ln_matvec((head_row + r0 * head_cb, n, head_cb), buf, 0, hb, store,
                                   toks=[T - 1], short_tail=tail)
                else:      # (the statistics are done: the fix-up alone)
                    def fix(j, r, rows, buf=buf, hb=hb, store=store):
                        self.ln_fixup(T - 1, buf + r, rows, hb + r)
                        store(j, r, rows)

                    self.matvec((head_row + r0 * head_cb, n, head_cb), self.xa, 0, buf, 0,
                                tokens=1, then=fix, short_tail=tail)

    def projection(self, m, xb, xstride, bias, first=None):
        """y = m x + bias into v_y, then x += y. On one card the bias rides in the MATVEC and
        the residual follows each finished chunk; on several, every card holds a partial sum
        in v_y: add them up over the ring, then the bias once, then the residual. In decode
        the bias and the residual ride in the partial sums: card 0's MATVEC starts from x
        (its bias operand), card 1's from the bias, and the all-reduce writes the new x.
        ``m`` may be a list of (matrix, first column): parts by columns, the first into v_y,
        the second into v_yb, added up; ``first()`` is emitted after the first MATVEC."""
        cm, T, dS, d = self.cm, self.T, self.cm.dS, self.cm.sh.d_model
        parts = m if isinstance(m, list) else [(m, 0)]
        assert len(parts) <= 2
        bufs = [cm.v_y, cm.v_yb]
        one = cm.cards == 1
        fold = not one and T == 1             # (a MATVEC's bias is one vector for all tokens)
        first_bias = bias if one else {0: cm.v_x, 1: bias}.get(cm.card) if fold else None
        x16 = self.x16_x
        for k, (mk, c0) in enumerate(parts):
            last = k == len(parts) - 1          # (its residuals write fp16(x) too)
            self.matvec(mk, xb + c0, xstride, bufs[k], dS, bias=first_bias if k == 0 else None,
                        then=(lambda t, r, n, y=bufs[k], xa=x16 and last:
                              self.residual(t, r, n, y, to_xa=xa)) if one else None,
                        first=first if k == 0 else None, short_tail=one and last)
        self.xa_ready = x16 and not fold    # (a COLL writes x itself: ln_matvec converts it)
        if one:
            return
        if len(parts) == 2:
            self.vec("ADD", cm.v_y, cm.v_y, T * dS, src2=cm.v_yb)
        if fold and cm.v_g is not None:
            # all-gather, then x = ((p0 + p1) + p2) + ... in card order, alike on every card;
            # the last addition writes fp16(x) for the next MATVEC.
            self.e("COLL", cop=0, src=cm.v_y, dst=cm.v_g, n=dS)
            for j in range(1, cm.cards):
                self.vec("ADD", cm.v_x, cm.v_g if j == 1 else cm.v_x, dS, src2=cm.v_g + j * cm.g_blk,
                         xdst=cm.x_a if x16 and j == cm.cards - 1 else None)
            self.xa_ready = x16
            return
        if fold:
            self.e("COLL", cop=2, src=cm.v_y, dst=cm.v_x, n=T * dS)
            return
        self.e("COLL", cop=2, src=cm.v_y, dst=cm.v_y, n=T * dS)
        for t in range(T):
            y = cm.v_y + t * dS
            self.vec("ADD", y, y, d, src2=bias)
        self.vec("ADD", cm.v_x, cm.v_x, T * dS, src2=cm.v_y, xdst=cm.x_a if x16 else None)

    def store_f32(self, vsp, n, row):
        per_row = self.cm.S // 4
        lepg = per_row.bit_length() - 1
        for a in range(0, n, 1 << 15):
            k = min(1 << 15, n - a)
            self.e("STORE", vsp=vsp + a, n=k, row=row + a // per_row, off=0, lepg=lepg, lgpr=0,
                   gstride=0, rstride=1, f32=1)

    def dump(self, k):
        cm = self.cm
        if cm.dump_hidden:
            rows = -(-cm.T * cm.dS * 4 // cm.S)
            self.store_f32(cm.v_x, self.T * cm.dS, cm.hidden_row + k * rows)
