"""Where things are, in tiles, vector words and stripe rows: the weight tiles' stream order, the
sizes and strides of a card's vectors, the K/V caches' layout and a layer's parameter vector.

Owns
----
- ``GROUP`` and ``tiles_in_stream_order``: the order in which a MATVEC consumes a weight
  matrix's tiles, which is the order the HBM image stores them in;
- ``Dims``: the per-token vector sizes of a card's share (c_attn's output rows K, V, q, the
  scores, the heads' outputs, the MLP's columns, the logits) in VSP/XB words;
- ``KvLayout``: the K and V caches of a layer, the one statement of their tile layout (the
  HBM image sizes them by it, the emitter's STOREs write and its MATVECs read by it);
- ``ParamLayout``: a layer's biases as one fp32 vector (HBM and VSP share its offsets).

Pure arithmetic and numpy; nothing here knows the schedule or the buffers' places.
"""

from dataclasses import dataclass

import numpy as np

from hw.isa import QGROUP

__all__ = ["GROUP", "round_up", "tiles_in_stream_order", "i8_stream", "stream_tiles",
           "Dims", "KvLayout", "ParamLayout",
           "param_align"]

GROUP = 8           # row blocks per group: >= the accumulator's reuse distance (Fp32Add + 2)
assert GROUP <= QGROUP      # MATVEC.i8's groups are GROUP row blocks: within the scale register


def round_up(x, m):
    """``x`` rounded up to a multiple of ``m`` (both positive integers)."""
    return -(-x // m) * m


def tiles_in_stream_order(mat, L, W, group):
    """fp16 matrix [rows, cols] -> (tiles [n, L, W], rb, cb) in the MATVEC stream order.

    The matrix is zero-padded to rb x cb tiles of L rows by W columns; the tiles follow
    the order MATVEC consumes them in (hw/isa.py): groups of ``group`` row blocks; within a
    group, column block by column block; within that, row block by row block.
    """
    rows, cols = mat.shape
    R, C = round_up(rows, L), round_up(cols, W)
    pad = np.zeros((R, C), np.float16)
    pad[:rows, :cols] = mat
    rb, cb = R // L, C // W
    blocks = pad.reshape(rb, L, cb, W).transpose(0, 2, 1, 3)       # [rb, cb, L, W]
    order = [(r, c) for g0 in range(0, rb, group) for c in range(cb)
             for r in range(g0, min(g0 + group, rb))]
    return np.stack([blocks[r, c] for r, c in order]), rb, cb


def i8_stream(q, e, rows, W, group, S):
    """Integer matrix q [n, cols] (int8, or int16 stored little-endian) with its rows' scale
    exponents e [n] -> (stream uint8 [k, S], rb, cb): the tiles of ``rows`` rows by W columns
    (row-major) in the MATVEC stream order of
    ``tiles_in_stream_order``, each group's tiles preceded by one stripe row (S bytes) holding
    its rows' exponents, a byte a row (hw/isa.py MATVEC.i8). Padding rows are zero with scale
    exponent 127 (a scale of 1)."""
    n, cols = q.shape
    R, C = round_up(n, rows), round_up(cols, W)
    if group * rows > S:
        raise ValueError(f"a group's {group * rows} scales exceed a stripe row of {S} bytes")
    pad = np.zeros((R, C), q.dtype.newbyteorder("<"))
    pad[:n, :cols] = q
    ep = np.full(R, 127, np.uint8)
    ep[:n] = e
    rb, cb = R // rows, C // W
    blocks = pad.reshape(rb, rows, cb, W).transpose(0, 2, 1, 3)     # [rb, cb, rows, W]
    out = []
    for g0 in range(0, rb, group):
        g1 = min(g0 + group, rb)
        head = np.zeros(S, np.uint8)
        head[:(g1 - g0) * rows] = ep[g0 * rows:g1 * rows]
        out.append(head)
        out += [blocks[r, c].view(np.uint8).reshape(-1) for c in range(cb) for r in range(g0, g1)]
    return np.stack(out), rb, cb


def stream_tiles(rb, cb, group, i8):
    """Stripe rows of a matrix of rb x cb tiles in the stream: its tiles, and with ``i8`` a
    row of scales before each group's."""
    return rb * cb + (-(-rb // group) if i8 else 0)


@dataclass(frozen=True)
class Dims:
    """Sizes of one share's per-token vectors (words) and of a model's tiles.

    Attributes
    ----------
    H, F, V : int
        The share: heads, MLP columns, vocabulary entries.
    hdp : int
        A head's q/k/v padded to whole column blocks (head_dim rounded up to W).
    hvp : int
        A head's V rows: hdp and a block of L more, the first of them all ones (zero weights,
        bias 1), so that p.V gives the softmax's sum beside the head's output.
    dS : int
        The residual stream's token stride (d_model rounded up to W).
    nS : int
        Scores per (token, head) at most: the context in whole groups of row blocks.
    dq, dv : int
        The heads' q (or K) rows, H hdp, and their V rows, H hvp.
    qS : int
        c_attn's output rows per token, rounded up to W: K at ``k_off``, V at ``v_off``, q at
        ``q_off``. K and V first, so that the caches' STOREs start while the MATVEC still
        runs; q, which the K MATVECs wait for anyway, last.
    aS : int
        The attention output's token stride (dv rounded up to W).
    fS : int
        c_fc's output token stride (F rounded up to W).
    vS : int
        The logits' token stride (V rounded up to L).
    """

    H: int
    F: int
    V: int
    hdp: int
    hvp: int
    dS: int
    nS: int
    dq: int
    dv: int
    qS: int
    aS: int
    fS: int
    vS: int

    @classmethod
    def of(cls, shape, L, W, *, H, F, V, tile_rows=None):
        """The dims of a share of ``H`` heads, ``F`` MLP columns and ``V`` vocabulary entries
        of a model of shape ``shape`` on a core of L lanes and width W (weight tiles of
        ``tile_rows`` rows, L by default; 2L with int8 weights: the logits' stride is whole
        tiles of rows)."""
        hdp = round_up(shape.head_dim, W)
        hvp = hdp + L
        dq, dv = H * hdp, H * hvp
        return cls(H=H, F=F, V=V, hdp=hdp, hvp=hvp, dS=round_up(shape.d_model, W),
                   nS=round_up(shape.n_positions, max(W, L * GROUP)), dq=dq, dv=dv,
                   qS=round_up(2 * dq + dv, W), aS=round_up(dv, W), fS=round_up(F, W),
                   vS=round_up(V, tile_rows or L))

    @property
    def k_off(self):
        return 0

    @property
    def v_off(self):
        return self.dq

    @property
    def q_off(self):
        return self.dq + self.dv


@dataclass(frozen=True)
class KvLayout:
    """The K and V caches of one layer on one card, in stripe rows of HBM (one L x W tile a
    row), as offsets from the layer's first K row and first V row. This is the one statement
    of the layout: the HBM image sizes the caches by it, the emitter's STOREs write into them
    and its MATVECs read them by it.

    Both caches keep the card's heads side by side, so that one STORE per token writes a new
    position's K (V) for every head.

    K: head h's K is a matrix [position, hdp] (row block r: positions [rL, (r + 1)L); column
    block c: dimensions [cW, (c + 1)W)). Tile (h, r, c) is at
    ``(r // G) * H G cbk + h G cbk + c G + r % G`` (G = GROUP, cbk = hdp / W): within each
    group of G row blocks the heads side by side, each head's tiles in its MATVEC's stream
    order. A new position p is one lane (p % L) of row block p // L in every (h, c) tile: W
    fp16 words each, tiles G rows apart.

    V: head h's V is transposed, a matrix [hvp, position] (row block j: rows [jL, (j + 1)L);
    column block c: positions [cW, (c + 1)W)). Tile (h, j, c) is at
    ``c H rbv + h rbv + j`` (rbv = hvp / L), and each tile is stored transposed (element
    (r, c) at c L + r: MATVEC.tt), so that a new position's L values in a tile are
    contiguous: one write beat per tile instead of L (HBM writes are single beats), the
    tiles of column block p // W consecutive rows.

    Attributes
    ----------
    H, L, W : int
        The card's heads, the core's lanes and width.
    cbk : int
        K's column blocks per head (hdp / W).
    rbv : int
        V's row blocks per head (hvp / L).
    k_rows, v_rows : int
        Stripe rows of a layer's K cache (whole groups of row blocks over the context) and of
        its V cache (whole column blocks over the context).
    """

    H: int
    L: int
    W: int
    cbk: int
    rbv: int
    k_rows: int
    v_rows: int

    @classmethod
    def of(cls, dims, L, W, n_positions):
        """The caches of a share of ``dims.H`` heads over a context of ``n_positions``."""
        cbk, rbv = dims.hdp // W, dims.hvp // L
        kb = round_up(n_positions, L * GROUP) // L * cbk        # K tiles per head
        vb = round_up(n_positions, W) // W * rbv                # V tiles per head
        return cls(H=dims.H, L=L, W=W, cbk=cbk, rbv=rbv, k_rows=dims.H * kb, v_rows=dims.H * vb)

    @property
    def k_group_rows(self):
        """Stripe rows of one group of G row blocks of K, every head's."""
        return self.H * GROUP * self.cbk

    def k_tile(self, h, r, c):
        """Row of K's tile (head h, row block r, column block c)."""
        return (r // GROUP) * self.k_group_rows + h * GROUP * self.cbk + c * GROUP + r % GROUP

    def v_tile(self, h, j, c):
        """Row of V's tile (head h, row block j, column block c)."""
        return c * self.H * self.rbv + h * self.rbv + j

    def k_row_blocks(self, positions):
        """K's row blocks a MATVEC over ``positions`` positions reads: whole groups."""
        return round_up(-(-positions // self.L), GROUP)

    def v_col_blocks(self, positions):
        """V's column blocks a MATVEC over ``positions`` positions reads."""
        return -(-positions // self.W)

    def k_store(self, base, p):
        """STORE fields (but vsp and n) that write position p's K, every head's (dq words in
        head order, W-element groups one per (h, c) tile), the cache's first row at ``base``."""
        return dict(row=base + self.k_tile(0, p // self.L, 0), off=(p % self.L) * 2 * self.W,
                    lepg=self.W.bit_length() - 1, lgpr=0, gstride=0, rstride=GROUP)

    def v_store(self, base, p, h0):
        """STORE fields (but vsp and n) that write position p's V from head h0 on (hvp words a
        head, L-element groups one per (h, j) tile), the cache's first row at ``base``."""
        return dict(row=base + self.v_tile(h0, 0, p // self.W), off=2 * self.L * (p % self.W),
                    lepg=self.L.bit_length() - 1, lgpr=0, gstride=0, rstride=1)

    def k_runs(self, base, h, positions):
        """(first row, tiles) runs of head h's K over ``positions`` positions in its MATVEC's
        stream order (group ``GROUP``): one run per group of row blocks."""
        return [(base + self.k_tile(h, gi * GROUP, 0), GROUP * self.cbk)
                for gi in range(self.k_row_blocks(positions) // GROUP)]

    def v_runs(self, base, h, positions, group):
        """(first row, tiles) runs of head h's V over ``positions`` positions in its MATVEC's
        stream order for ``group`` row blocks per group: groups, then column blocks."""
        return [(base + self.v_tile(h, g0, c), min(group, self.rbv - g0))
                for g0 in range(0, self.rbv, group) for c in range(self.v_col_blocks(positions))]


def param_align(P, stripe_bytes):
    """Where a layer's parameter vector's second part starts: a multiple of the VSP's P words
    and of a stripe row's fp32 words (layer 0 loads the first part alone)."""
    return int(np.lcm(P, stripe_bytes // 4))


@dataclass(frozen=True)
class ParamLayout:
    """A layer's parameters as one fp32 vector, the same in HBM and in a VSP area: c_attn's
    bias (2 dq + dv rows: K, V, q), attn.c_proj's (d), c_fc's (F), mlp.c_proj's (d). Each part
    starts at a multiple of P words, the second at a multiple of ``param_align``.

    Attributes
    ----------
    offsets : tuple of int
        The four parts' first words.
    length : int
        The vector's words.
    """

    offsets: tuple
    length: int

    @classmethod
    def of(cls, sizes, P, first_align):
        """The layout of parts of ``sizes`` words (the first padded to ``first_align``)."""
        offs, n = [], 0
        for k, size in enumerate(sizes):
            offs.append(n)
            n = round_up(n + size, first_align if k == 0 else P)
        return cls(tuple(offs), n)

    def pack(self, parts):
        """The fp32 vector of ``parts`` (arrays of the sizes this layout was made for)."""
        v = np.zeros(self.length, np.float32)
        for o, p in zip(self.offsets, parts, strict=True):
            v[o:o + len(p)] = p
        return v
