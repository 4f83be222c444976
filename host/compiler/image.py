"""A card's HBM: what goes in which stripe rows, and the bytes of what the host writes there.

Owns
----
- ``HbmImage``: stripe rows allocated in order, with the bytes of the parts that have values;
- ``build_image``: the allocation of everything a card keeps in HBM, in this order: the
  LayerNorm constants, a row of zeros (decode's mask), the token and position embeddings
  (fp16, one token a whole number of stripe rows), per layer its matrices (c_attn,
  attn.c_proj, c_fc, mlp.c_proj by column parts, each in stream order: ``layout``) and its
  parameter vector (``ParamLayout``), the LM head and its bias, the K/V caches
  (``KvLayout``, one contiguous region, zeroed when a model is loaded), the logits, the
  hidden-state dumps; the program goes after them. The result is an ``HbmLayout``.

A shapes-only compile (no weights) allocates the same rows and writes no bytes.
"""

from dataclasses import dataclass
from typing import NamedTuple

import numpy as np

from hw.isa import FORMATS

from ..errors import UserError
from ..stripes import write_stripes
from . import weights as wts
from .layout import GROUP, i8_stream, round_up, stream_tiles, tiles_in_stream_order
from .quant import quantize_rows
from .schedule import mlp_proj_split

__all__ = ["quant_summary", "HbmImage", "Matrix", "LayerRows", "HbmLayout", "build_image", "ROW_BITS",
           "PROGRAM_GAP_ROWS"]

# The instructions' stripe-row fields (LOAD, STORE, WLOAD, COLL's HBM rows) are ROW_BITS wide:
# everything but the program must lie in the first 2^ROW_BITS rows.
ROW_BITS = min(f.bits for fmt in FORMATS for f in fmt.fields if f.name == "row")
PROGRAM_GAP_ROWS = 4        # rows left free between the last allocation and the program


def quant_summary(entries):
    """(largest, mean) relative error per row of ``HbmImage.quant`` entries (largest, sum,
    rows), pooled over any number of matrices and images; None if there are none."""
    if not entries:
        return None
    return max(q[0] for q in entries), sum(q[1] for q in entries) / sum(q[2] for q in entries)


class HbmImage:
    """A card's HBM contents, allocated by stripe rows (``cfg.stripe_bytes`` bytes each).

    Attributes
    ----------
    next_row : int
        The first row not allocated.
    parts : list of (int, numpy.ndarray)
        (first row, bytes) of every allocation made with data.
    """

    def __init__(self, cfg):
        self.cfg = cfg
        self.S = cfg.stripe_bytes
        self.next_row = 0
        self.parts = []          # (row, bytes)
        self.quant = []          # int8/int16 weights: (largest, sum, rows) of relative errors per row

    def note_quant(self, w, q, e):
        """Record a quantized matrix's error: per row, |w - q scale| / |w| (norms of the row),
        the rows that are not all zero."""
        w = np.asarray(w, np.float64)
        deq = q.astype(np.float64) * np.exp2(e.astype(np.float64) - 127)[:, None]
        norm = np.linalg.norm(w, axis=1)
        keep = norm > 0
        rel = np.linalg.norm(w - deq, axis=1)[keep] / norm[keep]
        if rel.size:
            self.quant.append((float(rel.max()), float(rel.sum()), int(rel.size)))

    def quant_error(self):
        """(largest, mean) relative error per row over every quantized matrix, or None."""
        return quant_summary(self.quant)

    def alloc(self, nbytes, data=None):
        """(first row, rows) of ``nbytes`` bytes (at least one row), holding ``data`` if given."""
        row = self.next_row
        rows = max(1, -(-nbytes // self.S))
        self.next_row += rows
        if data is not None:
            self.parts.append((row, np.frombuffer(np.ascontiguousarray(data).tobytes(), np.uint8)))
        return row, rows

    def write(self, dev):
        """Write every part into a Device's HBM."""
        for row, data in self.parts:
            write_stripes(dev, self.cfg, row, data)


class Matrix(NamedTuple):
    """A weight matrix in HBM: its first tile's row, rb row blocks by cb column blocks."""

    row: int
    rb: int
    cb: int


@dataclass(frozen=True)
class LayerRows:
    """A layer's rows in HBM: its parameter vector, matrices, and K and V caches' first rows.
    ``fc2``: mlp.c_proj as (matrix, first input column) parts."""

    params: int
    qkv: Matrix
    proj: Matrix
    fc: Matrix
    fc2: tuple
    k: int
    v: int


@dataclass(frozen=True)
class HbmLayout:
    """Where everything is in a card's HBM (stripe rows, but ``prog_addr``: a byte address).

    Attributes
    ----------
    const_row, zero_row : int
        1 / d and eps (fp32); nS fp32 zeros.
    wte_row, wpe_row, tok_rows : int
        The embeddings, token (position) i at row ``wte_row + i tok_rows``.
    layers : tuple of LayerRows
    head : Matrix
    head_bias_row : int
    kv_rows : (int, int)
        The K/V caches' rows [lo, hi).
    logits_row : int
        The logits (fp32, vS words a token).
    hidden_row, hidden_stride : int
        The residual stream after the embeddings and after each layer (dump_hidden), dump k
        at ``hidden_row + k hidden_stride``, T dS fp32 words each.
    prog_addr : int
        Channel 0's byte address of the program.
    stream_kv : tuple
        A decode batch's other streams' caches: for stream s >= 1, entry s - 1 holds each
        layer's (first K row, first V row) (stream 0's are the layers' own).
    batch_logits_row, logits_rows : int
        A decode batch's logits: token j's at ``batch_logits_row + j logits_rows`` (fp32, vS
        words from a stripe row's start).
    """

    const_row: int
    zero_row: int
    wte_row: int
    wpe_row: int
    tok_rows: int
    layers: tuple
    head: Matrix
    head_bias_row: int
    kv_rows: tuple
    logits_row: int
    hidden_row: int
    hidden_stride: int
    prog_addr: int
    stream_kv: tuple = ()
    batch_logits_row: int = 0
    logits_rows: int = 0


def _matrix(img, L, W, rows, cols, mat, *, folded=False):
    """Allocate a [rows, cols] weight matrix in stream order holding ``mat`` (None: its rows
    only): fp16 tiles of L rows, or with integer weights (``img.cfg``) tiles of
    ``core.tile_rows`` rows (2L int8, L int16) and each group's row of scales
    (``layout.i8_stream``), the matrix quantized row by row (``quant.quantize_rows``; its
    errors kept in ``img.quant``). A LayerNorm-``folded`` matrix keeps its rows' zero sums
    through the rounding, so that x's mean still drops out (``weights.fold_layer_norm``;
    docs/numerics.md)."""
    c = img.cfg.core
    if c.int_weights:
        LQ = c.tile_rows
        rb, cb = -(-rows // LQ), -(-cols // W)
        if mat is None:
            row, _ = img.alloc(stream_tiles(rb, cb, GROUP, True) * img.S)
            return Matrix(row, rb, cb)
        assert mat.shape == (rows, cols), (mat.shape, rows, cols)
        try:
            q, e = quantize_rows(mat, keep_sum=folded, dtype=np.dtype(c.weight_dtype))
        except ValueError as err:
            raise UserError(f"model: a {rows} x {cols} weight matrix cannot be quantized to "
                            f"{c.weight_dtype}: {err}") from None
        img.note_quant(mat, q, e)
        data, rb, cb = i8_stream(q, e, LQ, W, GROUP, img.S)
        row, _ = img.alloc(data.nbytes, data)
        return Matrix(row, rb, cb)
    rb, cb = -(-rows // L), -(-cols // W)
    if mat is None:
        row, _ = img.alloc(rb * cb * L * W * 2)
        return Matrix(row, rb, cb)
    assert mat.shape == (rows, cols), (mat.shape, rows, cols)
    tiles, rb, cb = tiles_in_stream_order(mat.astype(np.float16), L, W, GROUP)
    row, _ = img.alloc(tiles.nbytes, tiles)
    return Matrix(row, rb, cb)


def _layer(img, cfg, shape, w, i, part, dims, params):
    """Layer i's matrices and parameter vector: (params row, qkv, proj, fc, fc2 parts)."""
    L, W, d, F = cfg.core.lanes, cfg.core.width, shape.d_model, part.mine.F
    some = w is not None
    wqkv, bqkv = wts.c_attn(w, i, shape, part, dims) if some else (None, None)
    qkv = _matrix(img, L, W, 2 * dims.dq + dims.dv, d, wqkv, folded=True)
    proj = _matrix(img, L, W, d, dims.dq, wts.attn_proj(w, i, shape, part, dims) if some else None)
    wfc, bfc = wts.c_fc(w, i, part) if some else (None, None)
    fc = _matrix(img, L, W, F, d, wfc, folded=True)
    fa = mlp_proj_split(F, d, cfg.core.tile_rows, W, cfg.core.weight_fifo_tiles,
                        cfg.core.int_weights)
    fc2 = tuple((_matrix(img, L, W, d, c1 - c0, wts.mlp_proj(w, i, part, c0, c1) if some else None), c0)
                for c0, c1 in ((0, fa), (fa, F)) if c1 > c0)
    vec = params.pack(wts.layer_params(w, i, bqkv, bfc)) if some else None
    prow, _ = img.alloc(params.length * 4, vec)
    return prow, qkv, proj, fc, fc2


def build_image(cfg, shape, w, part, dims, kv, params, *, T, all_logits, streams=1):
    """(HbmImage, HbmLayout) of a card's share ``part`` (dims ``dims``, caches ``kv``,
    parameter vectors ``params``) of a model of shape ``shape`` with weights ``w`` (None: a
    shapes-only compile, rows without bytes), for steps of up to ``T`` tokens and decode
    batches of up to ``streams`` streams (their other caches and their logits after
    everything else, so that stream 0's rows are those of a build without batches). Raises
    UserError where it does not fit in the build's HBM."""
    img, S, d = HbmImage(cfg), cfg.stripe_bytes, shape.d_model
    L, W = cfg.core.lanes, cfg.core.width
    const_row, _ = img.alloc(S, np.array([1.0 / d, shape.eps], np.float32))
    zero_row, _ = img.alloc(round_up(dims.nS * 4, S), np.zeros(dims.nS, np.float32))
    tok_rows = max(1, -(-2 * d // S))
    emb = {}
    for name, count in (("wte", shape.vocab), ("wpe", shape.n_positions)):
        table = None
        if w is not None:
            table = np.zeros((count, tok_rows * S // 2), np.float16)
            table[:, :d] = w[f"{name}.weight"]
        emb[name], _ = img.alloc(count * tok_rows * S, table)
    layers = [_layer(img, cfg, shape, w, i, part, dims, params) for i in range(shape.n_layer)]
    wh, hbias = wts.lm_head(w, part, dims) if w is not None else (None, None)
    head = _matrix(img, L, W, part.mine.V, d, wh, folded=True)
    head_bias_row, _ = img.alloc(dims.vS * 4, hbias)
    kv0 = img.next_row
    caches = [(img.alloc(kv.k_rows * S)[0], img.alloc(kv.v_rows * S)[0]) for _ in layers]
    kv_rows = (kv0, img.next_row)
    logits_row, _ = img.alloc((T if all_logits else 1) * dims.vS * 4)
    hidden_stride = -(-T * dims.dS * 4 // S)
    hidden_row, _ = img.alloc((shape.n_layer + 1) * hidden_stride * S)
    stream_kv = tuple(tuple((img.alloc(kv.k_rows * S)[0], img.alloc(kv.v_rows * S)[0]) for _ in layers)
                      for _ in range(streams - 1))
    logits_rows = -(-dims.vS * 4 // S)
    batch_logits_row = img.alloc(streams * logits_rows * S)[0] if streams > 1 else 0
    if img.next_row + PROGRAM_GAP_ROWS > cfg.channel_rows:
        raise UserError(f"model: needs {img.next_row} stripe rows of HBM per channel; the build has "
                        f"{cfg.channel_rows}")
    if img.next_row > 1 << ROW_BITS:
        raise UserError(f"model: needs {img.next_row} stripe rows of HBM per channel; the "
                        f"instructions' {ROW_BITS}-bit row fields (hw/isa.py) address {1 << ROW_BITS}, "
                        f"fewer than the build's {cfg.channel_rows}; allowed: a model of at most "
                        f"{1 << ROW_BITS} rows a card (more cards, or a smaller model)")
    return img, HbmLayout(
        const_row=const_row, zero_row=zero_row, wte_row=emb["wte"], wpe_row=emb["wpe"], tok_rows=tok_rows,
        layers=tuple(LayerRows(prow, qkv, proj, fc, fc2, k, v)
                     for (prow, qkv, proj, fc, fc2), (k, v) in zip(layers, caches, strict=True)),
        head=head, head_bias_row=head_bias_row, kv_rows=kv_rows, logits_row=logits_row,
        hidden_row=hidden_row, hidden_stride=hidden_stride,
        prog_addr=(img.next_row + PROGRAM_GAP_ROWS) * cfg.hbm_beat_bytes,
        stream_kv=stream_kv, batch_logits_row=batch_logits_row, logits_rows=logits_rows)
