"""Compile a GPT-2 onto a card: the HBM image (weight tiles in stream order, parameters,
constants, KV cache) and, per generation step, the instruction stream.

Layouts (L lanes, W width, G = 8 row blocks per group):
- a weight matrix [out, in] is padded to whole L x W tiles and stored in the MATVEC stream
  order for groups of G row blocks: for each group, column block by column block, row block
  by row block; one tile per stripe row;
- the K cache of a head is a matrix [position, head_dim] in row-block-major tiles, so that a
  new position appends W-element groups (one per column block) to one lane of a tile;
- the V cache of a head is stored transposed, [head_dim, position], in column-block-major
  tiles (group = all row blocks), so that new positions append whole tiles at the end;
- q is pre-scaled by 1/sqrt(head_dim) in the weights (exact when head_dim is a power of 4);
- parameters (LayerNorm, biases) and constants are fp32, loaded with LOAD.f32.

Prefetch: matrices are cut into MATVECs of at most half the weight FIFO (whole groups), and
each MATVEC's WLOAD is placed as early as the ISA allows: in MATVEC order, once its data are
in HBM (K/V after their STOREs), and while the streamed-but-unclaimed tiles fit in the FIFO.
So the weights of the next matrices stream while the vector unit works.
"""

from dataclasses import dataclass

import numpy as np

from hw.isa import encode

from .errors import UserError

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
        from sim.progs import write_stripes
        for row, data in self.parts:
            write_stripes(dev, self.cfg, row, data)


class Vsp:
    """Bump allocator for VSP words or XB words, aligned."""

    def __init__(self, words, align, what):
        self.words, self.align, self.what = words, align, what
        self.next = 0

    def __call__(self, n, align=None):
        a = _up(self.next, align or self.align)
        if a + n > self.words:
            raise UserError(f"model: needs more than the {self.words} {self.what} words this "
                            f"build has (core.{'vsp' if self.what == 'VSP' else 'xb'}_words)")
        self.next = a + n
        return a


@dataclass
class LayerRows:
    params: int
    qkv: tuple
    proj: tuple
    fc: tuple
    fc2: tuple
    k: list
    v: list


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
        self.dS = _up(d, W)                   # token strides, whole XB blocks
        # Scores per (token, head): the K MATVEC computes whole groups of row blocks.
        self.nS = _up(sh.n_positions, max(W, L * GROUP))
        self.all_logits = all_logits
        # Tokens per step: as many as the on-chip buffers hold, at most 8 (the ISA's limit),
        # chosen for the largest share so that every card of the appliance steps alike (each
        # card then places its own, smaller or equal, buffers).
        self._tmp_in_h = all(_up(F, L) >= _up(F, W) >= self.dS
                             for F in (_share(sh.d_ff, cards, i)[1] for i in range(cards)))
        self._shares(self.Hmax, -(-sh.d_ff // cards), vl)
        # Two parameter areas (the next layer's parameters load while this layer runs) where
        # they fit, else one (the load waits for the layer's last use of its parameters). Two
        # areas at fewer tokens per step come first: they keep a LOAD per layer off the
        # critical path of every decode step, while more tokens per step buy prefill little
        # (no weight reuse yet).
        tries = [(a, T) for a in ([param_areas] if param_areas else [2, 1])
                 for T in ([max_tokens] if max_tokens else range(8, 0, -1))]
        for k, (self.param_areas, self.T) in enumerate(tries):
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
        self.qS = _up(3 * self.dq, self.W)
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

        self.layers = []
        for i in range(sh.n_layer):
            p = f"h.{i}."
            # Rows of the padded qkv output: q heads, k heads, v heads, each hdp rows.
            bqkv = np.zeros(3 * dq, np.float32)

            def qkv(p=p, bqkv=bqkv):
                wa, ba = w[p + "attn.c_attn.weight"].T, w[p + "attn.c_attn.bias"]   # [3d, d]
                out = np.zeros((3 * dq, d), np.float32)
                for part in range(3):
                    for h in range(H):
                        g = h0 + h                                 # the model's head index
                        src = slice(part * d + g * hd, part * d + (g + 1) * hd)
                        dst = slice(part * dq + h * hdp, part * dq + h * hdp + hd)
                        s = scale if part == 0 else 1.0
                        out[dst] = wa[src] * s
                        bqkv[dst] = ba[src] * s
                return out

            def proj(p=p):
                out = np.zeros((d, dq), np.float32)        # input columns in the padded layout
                for h in range(H):
                    g = h0 + h
                    out[:, h * hdp:h * hdp + hd] = w[p + "attn.c_proj.weight"].T[:, g * hd:(g + 1) * hd]
                return out

            m_qkv = self._matrix(3 * dq, d, qkv)           # fills bqkv
            m_proj = self._matrix(d, dq, proj)
            m_fc = self._matrix(F, d, lambda p=p: w[p + "mlp.c_fc.weight"].T[f0:f0 + F])
            m_fc2 = self._matrix(d, F, lambda p=p: w[p + "mlp.c_proj.weight"].T[:, f0:f0 + F])
            params = self._param_vector([vec(p + "ln_1.weight", d), vec(p + "ln_1.bias", d), bqkv,
                                         vec(p + "attn.c_proj.bias", d), vec(p + "ln_2.weight", d),
                                         vec(p + "ln_2.bias", d),
                                         vec(p + "mlp.c_fc.bias", sh.d_ff)[f0:f0 + F],
                                         vec(p + "mlp.c_proj.bias", d)])
            prow, _ = img.alloc(params.nbytes, params if w is not None else None)
            self._layer_offsets, self._layer_len = self._param_offsets, self._param_len
            self.layers.append(LayerRows(params=prow, qkv=m_qkv, proj=m_proj, fc=m_fc, fc2=m_fc2,
                                         k=[], v=[]))
        lnf = self._param_vector([vec("ln_f.weight", d), vec("ln_f.bias", d)])
        self.lnf_row, _ = img.alloc(lnf.nbytes, lnf if w is not None else None)
        self.head = self._matrix(self.Vn, d, lambda: w["wte.weight"][self.v0:self.v0 + self.Vn])
        # The KV caches, one contiguous region (zeroed when a model is loaded).
        kb = _up(sh.n_positions, L * GROUP) // L * (hdp // W)
        vb = _up(sh.n_positions, W) // W * (hdp // L)
        kv0 = img.next_row
        for rows in self.layers:
            for _h in range(H):
                rows.k.append(img.alloc(kb * self.S)[0])
                rows.v.append(img.alloc(vb * self.S)[0])
        self.kv_rows = (kv0, img.next_row)
        self.logits_row, _ = img.alloc((self.T if self.all_logits else 1) * self.vS * 4)
        per = -(-self.T * self.dS * 4 // self.S)
        self.hidden_row, _ = img.alloc((sh.n_layer + 1) * per * self.S)
        self.prog_addr = (img.next_row + 4) * self.cfg.hbm_beat_bytes
        if img.next_row + 4 > self.cfg.channel_rows:
            raise UserError(f"model: needs {img.next_row} stripe rows of HBM per channel; the build has "
                            f"{self.cfg.channel_rows}")

    def _param_vector(self, parts):
        """fp32 vector of parts, each starting at a multiple of P (the VSP offsets match)."""
        offs, n = [], 0
        for p in parts:
            offs.append(n)
            n = _up(n + len(p), self.P)
        v = np.zeros(n, np.float32)
        for o, p in zip(offs, parts, strict=True):
            v[o:o + len(p)] = p
        self._param_offsets = offs
        self._param_len = n
        return v

    def _alloc_onchip(self):
        c, sh, T = self.cfg.core, self.sh, self.T
        d, F = sh.d_model, self._Fbuf
        v = Vsp(c.vsp_words, self.P, "VSP")
        self.v_const = v(self.P)
        self.v_x = v(T * self.dS)
        self.v_a = v(T * self.dS)
        self.v_y = v(_up(T * self.dS, self.B))     # all-reduced in place: whole COLL beats
        self.v_qkv = v(T * self.qS)
        self.v_sc = v(T * self._Hbuf * self.nS)
        self.v_att = v(T * _up(self.dq, self.W))
        self.v_h = v(T * self.fS)
        # LayerNorm's scratch (squares) lives in the MLP's hidden buffer where c_fc's rows
        # cover a token's whole stride (no tail for the GELU pass past its last row block to
        # find the squares in) on every card, and that stride holds d_model: the LayerNorms
        # run before c_fc writes it and after mlp.c_proj has read its fp16 copy (x_h).
        self.v_tmp = self.v_h if self._tmp_in_h else v(self.dS)
        plen = sum(_up(n, self.P) for n in (d, d, 3 * self.dq, d, d, d, F, d))
        # Two parameter areas, alternate layers: the next layer's LOAD does not wait for the
        # last readers of this layer's parameters. One where two do not fit.
        a = v(plen)
        self.v_pars = (a, v(plen) if self.param_areas == 2 else a)
        self.v_scal = v((4 + 2 * self._Hbuf) * T * self.P)
        if self.all_logits:
            self.v_logits = v(T * self.vS)
        else:
            # The LM head in chunks of whole groups of row blocks, two buffers: one chunk's
            # logits are stored while the next is computed.
            unit = int(np.lcm(self.L * GROUP, self.S // 4))
            self.chunk = min(_up(self.vS, unit), max(unit, (c.vsp_words - v.next) // 2 // unit * unit))
            self.v_logits = (v(self.chunk), v(self.chunk))
        xb = Vsp(c.xb_words, self.W, "XB")
        self.x_a = xb(T * self.dS)
        self.x_q = xb(T * self.dq)
        self.x_p = xb(T * self._Hbuf * self.nS)
        self.x_att = xb(T * _up(self.dq, self.W))
        self.x_h = xb(T * self.fS)

    def load(self, dev):
        """Write the image (weights, parameters, constants, zeroed KV cache) into a card."""
        if self.weights is None:
            raise ValueError("a shapes-only compile has no image to load")
        self.img.write(dev)
        from sim.progs import write_stripes
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
        from sim.progs import read_stripes
        T = T if self.all_logits else 1
        rows = -(-T * self.vS * 4 // self.S)
        raw = read_stripes(dev, self.cfg, self.logits_row, rows)[:T * self.vS * 4].view(np.float32)
        return raw.reshape(T, self.vS)[:, :self.Vn]

    def read_hidden(self, dev, T):
        from sim.progs import read_stripes
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
    row: int
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

    def e(self, op, **f):
        self.out.append(encode(op, **f))

    def schedule(self):
        depth = self.cm.cfg.core.weight_fifo_tiles
        out, avail, k = [], 0, 0
        jobs = self.jobs

        def stream(j):
            out.append(encode("WLOAD", row=j.row, tiles=j.tiles))
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

    def vec(self, vop, dst, src1, n, src2=0, bcast=0, k=0):
        self.e("VEC", vop=vop, dst=dst, src1=src1, src2=src2, n=n, bcast=bcast, k=k)

    def matvec(self, m, xb, xstride, dst, dstride, bias=None, group=GROUP, kv=False, tokens=None,
               then=None):
        """MATVEC jobs for matrix ``m`` = (first tile row, rb, cb): one per chunk of whole
        groups of row blocks, each at most half the weight FIFO (so that two fit).

        ``then(t, row0, rows)`` emits the vector work on a finished chunk of the output (token
        t's rows row0 .. row0 + rows). Each chunk's work goes after the *next* chunk's MATVEC:
        in-order issue then waits for chunk k while chunk k + 1 already runs, so the matrix
        unit stays busy and the vector unit works beside it instead of after it."""
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
            per = max(1, (depth // 2) // per_group) * group
            chunks = [(r0, min(per, rb - r0)) for r0 in range(0, rb, per)]
        L = self.cm.L
        prev = None
        for r0, n in chunks:
            if n * cb > depth:
                raise UserError(f"model: {n * cb} tiles in one MATVEC exceed the weight FIFO's "
                                f"{depth} (core.weight_fifo_tiles)")
            f = dict(xb=xb, dst=dst + r0 * L, rb=n, cb=cb, group=group, tokens=T,
                     xstride=xstride if T > 1 else 0, dstride=dstride if T > 1 else 0,
                     bias=(bias + r0 * L) if bias is not None else 0, bias_en=int(bias is not None))
            self.out.append(_Job(len(self.jobs), row + r0 * cb, n * cb, f,
                                 self.kv_ready if kv else 0))
            self.jobs.append(self.out[-1])
            if then is not None and prev is not None:
                self._then(then, T, prev, L)
            prev = (r0, n)
        if then is not None:
            self._then(then, T, prev, L)

    def _then(self, then, T, chunk, L):
        r0, n = chunk
        for t in range(T):
            then(t, r0 * L, n * L)

    def scalar(self, t, k):
        return self.cm.v_scal + ((4 + 2 * self.cm.H) * t + k) * self.cm.P

    def layer_norm(self, t, src, dst, g, b):
        cm, d = self.cm, self.cm.sh.d_model
        s0, s1 = self.scalar(t, 0), self.scalar(t, 1)
        inv_d, eps = cm.v_const, cm.v_const + 1
        self.vec("REDSUM", s0, src, d)
        self.vec("MUL", s0, s0, 1, src2=inv_d, bcast=1)
        self.vec("SUB", dst, src, d, src2=s0, bcast=1)
        self.vec("MUL", cm.v_tmp, dst, d, src2=dst)
        self.vec("REDSUM", s1, cm.v_tmp, d)
        self.vec("MUL", s1, s1, 1, src2=inv_d, bcast=1)
        self.vec("ADD", s1, s1, 1, src2=eps, bcast=1)
        self.vec("RSQRT", s1, s1, 1)
        self.vec("MUL", dst, dst, d, src2=s1, bcast=1)
        self.vec("MUL", dst, dst, d, src2=g)
        self.vec("ADD", dst, dst, d, src2=b)

    def program(self):
        cm, T, sh = self.cm, self.T, self.cm.sh
        d, H, hdp, dq = sh.d_model, cm.H, cm.hdp, cm.dq
        L, W, P = cm.L, cm.W, cm.P
        dS, qS, nS, fS = cm.dS, cm.qS, cm.nS, cm.fS
        aS = _up(dq, W)
        last = self.pos0 + T - 1
        # Embeddings and constants.
        self.e("LOAD", vsp=cm.v_const, n=2, row=cm.const_row, f32=1)
        for t, tok in enumerate(self.tokens):
            if not 0 <= tok < sh.vocab:
                raise UserError(f"token id {tok} is outside the vocabulary (0..{sh.vocab - 1})")
            x = cm.v_x + t * dS
            self.e("LOAD", vsp=x, n=d, row=cm.wte_row + tok * cm.tok_rows)
            self.e("LOAD", vsp=cm.v_y + t * dS, n=d, row=cm.wpe_row + (self.pos0 + t) * cm.tok_rows)
            self.vec("ADD", x, x, d, src2=cm.v_y + t * dS)
        self.dump(0)
        po = cm._layer_offsets
        head_row, head_rb, head_cb = cm.head
        per = head_rb if cm.all_logits else cm.chunk // L      # LM head row blocks per VSP buffer
        chunks = [(r0, min(per, head_rb - r0)) for r0 in range(0, head_rb, per)]
        self.e("LOAD", vsp=cm.v_pars[0], n=cm._layer_len, row=cm.layers[0].params, f32=1)

        def residual(t, r, n):     # x += y on the rows a MATVEC job finished
            self.vec("ADD", cm.v_x + t * dS + r, cm.v_x + t * dS + r, n, src2=cm.v_y + t * dS + r)

        def gelu(t, r, n):         # GELU and the fp16 copy for the next MATVEC
            h = cm.v_h + t * fS + r
            self.vec("GELU", h, h, n)
            self.vec("CVT16", cm.x_h + t * fS + r, h, n)

        for li, lr in enumerate(cm.layers):
            par = cm.v_pars[li % 2]
            g1, b1, bqkv, bproj, g2, b2, bfc, bfc2 = (par + o for o in po)
            for t in range(T):
                self.layer_norm(t, cm.v_x + t * dS, cm.v_a + t * dS, g1, b1)
            self.vec("CVT16", cm.x_a, cm.v_a, T * dS)
            self.matvec(lr.qkv, cm.x_a, dS, cm.v_qkv, qS, bias=bqkv)

            def next_params(li=li):
                nxt = cm.v_pars[(li + 1) % 2]
                if li + 1 < len(cm.layers):
                    self.e("LOAD", vsp=nxt, n=cm._layer_len, row=cm.layers[li + 1].params, f32=1)
                else:
                    self.e("LOAD", vsp=nxt, n=_up(d, P) + d, row=cm.lnf_row, f32=1)

            if cm.param_areas == 2:     # into the other area, while this layer runs
                next_params()
            # New K rows and V columns into the caches. K tiles are in the MATVEC stream order
            # with whole groups: tile (r, c) at (r // G) * G * cb + c * G + r % G.
            cbk = hdp // W
            for t in range(T):
                p = self.pos0 + t
                r = p // L
                for h in range(H):
                    k = cm.v_qkv + t * qS + dq + h * hdp
                    v = cm.v_qkv + t * qS + 2 * dq + h * hdp
                    self.e("STORE", vsp=k, n=hdp, row=lr.k[h] + (r // GROUP) * GROUP * cbk + r % GROUP,
                           off=(p % L) * 2 * W, lepg=W.bit_length() - 1, lgpr=0, gstride=0,
                           rstride=GROUP)
                    self.e("STORE", vsp=v, n=hdp, row=lr.v[h] + (p // W) * (hdp // L), off=2 * (p % W),
                           lepg=0, lgpr=L.bit_length() - 1, gstride=2 * W, rstride=1)
            rbk = _up(-(-(last + 1) // L), GROUP)          # whole groups (rows past `last` masked)
            rbv, cbv = hdp // L, -(-(last + 1) // W)
            kmat = [(lr.k[h], rbk, cbk) for h in range(H)]
            vmat = [(lr.v[h], rbv, cbv) for h in range(H)]
            self.kv_ready = len(self.out)      # the caches now hold this step's rows
            # Attention, heads side by side so that the units overlap: the matrix unit runs the
            # q.K^T of every head back to back while the vector unit takes each head's scores
            # as they come; exp and the fp16 conversions run once over all heads.
            # Layouts: q16 [t][h][hdp], scores and probabilities [t][h][nS].
            HN = H * nS
            for t in range(T):
                self.vec("CVT16", cm.x_q + t * dq, cm.v_qkv + t * qS, dq)
            for h in range(H):
                self.matvec(kmat[h], cm.x_q + h * hdp, dq, cm.v_sc + h * nS, HN, kv=True)
            ns = cbv * W
            for h in range(H):
                for t in range(T):
                    s = cm.v_sc + t * HN + h * nS
                    m = self.scalar(t, 4 + 2 * h)
                    self.vec("MASK", s, s, ns, k=self.pos0 + t)
                    self.vec("REDMAX", m, s, ns)
                    self.vec("SUB", s, s, ns, src2=m, bcast=1)
            self.vec("EXP", cm.v_sc, cm.v_sc, T * HN)
            for h in range(H):
                for t in range(T):
                    s = cm.v_sc + t * HN + h * nS
                    z = self.scalar(t, 5 + 2 * h)
                    self.vec("REDSUM", z, s, ns)
                    self.vec("RECIP", z, z, 1)
                    self.vec("MUL", s, s, ns, src2=z, bcast=1)
            self.vec("CVT16", cm.x_p, cm.v_sc, T * HN)
            assert rbv <= 64 // T, "V cache layout: all row blocks of a head in one group"
            for h in range(H):
                self.matvec(vmat[h], cm.x_p + h * nS, HN, cm.v_att + h * hdp, aS, group=rbv, kv=True)
            self.vec("CVT16", cm.x_att, cm.v_att, T * aS)
            self.projection(lr.proj, cm.x_att, aS, bproj, residual)
            for t in range(T):
                self.layer_norm(t, cm.v_x + t * dS, cm.v_a + t * dS, g2, b2)
            self.vec("CVT16", cm.x_a, cm.v_a, T * dS)
            self.matvec(lr.fc, cm.x_a, dS, cm.v_h, fS, bias=bfc, then=gelu)
            if lr.fc[1] * L < fS:       # columns of x_h past the matrix's last row block
                for t in range(T):
                    gelu(t, lr.fc[1] * L, fS - lr.fc[1] * L)
            self.projection(lr.fc2, cm.x_h, fS, bfc2, residual)
            if cm.param_areas == 1:     # over this layer's, after their last use
                next_params()
            self.dump(li + 1)
        # Final LayerNorm and the LM head (the token embedding, tied).
        par = cm.v_pars[len(cm.layers) % 2]
        for t in range(T):
            self.layer_norm(t, cm.v_x + t * dS, cm.v_a + t * dS, par, par + _up(d, P))
        if cm.all_logits:
            self.vec("CVT16", cm.x_a, cm.v_a, T * dS)
            self.matvec(cm.head, cm.x_a, dS, cm.v_logits, cm.vS)
            self.store_f32(cm.v_logits, T * cm.vS, cm.logits_row)
        else:      # generation needs the last position's logits only
            self.vec("CVT16", cm.x_a, cm.v_a + (T - 1) * dS, dS)
            per_row = cm.S // 4
            for k, (r0, n) in enumerate(chunks):
                buf = cm.v_logits[k % 2]
                self.matvec((head_row + r0 * head_cb, n, head_cb), cm.x_a, 0, buf, 0, tokens=1)
                self.store_f32(buf, n * L, cm.logits_row + r0 * L // per_row)
        self.e("HALT")
        return self.schedule()

    def projection(self, m, xb, xstride, bias, residual):
        """y = m x + bias into v_y, then x += y. On one card the bias rides in the MATVEC and
        the residual follows each finished chunk; on several, every card holds a partial sum
        in v_y: add them up over the ring (in place), then the bias once, then the residual."""
        cm, T, dS, d = self.cm, self.T, self.cm.dS, self.cm.sh.d_model
        if cm.cards == 1:
            self.matvec(m, xb, xstride, cm.v_y, dS, bias=bias, then=residual)
            return
        self.matvec(m, xb, xstride, cm.v_y, dS)
        self.e("COLL", cop=2, src=cm.v_y, dst=cm.v_y, n=T * dS)
        for t in range(T):
            y = cm.v_y + t * dS
            self.vec("ADD", y, y, d, src2=bias)
        self.vec("ADD", cm.v_x, cm.v_x, T * dS, src2=cm.v_y)

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
