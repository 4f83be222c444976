"""A GPT-2 compiled for one card of an appliance: the object the runtime, the performance model
and the tools hold.

Owns
----
``check_limits`` (a model against the build's core.limits) and ``CompiledModel``, which puts
the parts together (``Partition``, ``Dims``, ``Placement``, ``KvLayout``, ``ParamLayout``, the
HBM image) and offers what a host does with a card: load the image, get a step's program, read
the logits and the hidden-state dumps back.
"""

import numpy as np

from hw.isa import INSN_BITS

from ..errors import UserError
from ..stripes import read_stripes, write_stripes
from .emit import Emitter, split_at, split_program
from .image import build_image
from .layout import GROUP, Dims, KvLayout, ParamLayout, param_align
from .partition import Partition
from .placement import choose

__all__ = ["CompiledModel", "check_limits"]


def check_limits(cfg, shape, what="model"):
    """UserError naming the first of the model's sizes beyond the build's core.limits."""
    lim = cfg.core.limits
    for name, have, cap in (("d_model", shape.d_model, lim.d_model), ("heads", shape.n_head, lim.heads),
                            ("layers", shape.n_layer, lim.layers), ("vocab", shape.vocab, lim.vocab),
                            ("seq_len", shape.n_positions, lim.seq_len)):
        if have > cap:
            raise UserError(f"{what}: {name} {have} exceeds the build's core.limits.{name} = {cap} "
                            f"(by {have - cap}); use a larger config")


class CompiledModel:
    """A GPT-2 compiled for card ``card`` of ``cards`` (intra-layer, as DFX does: this card's
    share of the heads, of the MLP's columns and of the vocabulary; after each projection the
    cards' partial sums are joined over the ring so that every card holds the whole residual
    stream: in decode an all-gather (COLL) and the additions in card order, alike on every
    card; in prefill, or where the all-gather's buffer does not fit, an all-reduce).

    Parameters
    ----------
    cfg : gen.config.Config
    model : host.model.Gpt2
        Its weights None: a shapes-only compile (programs and the HBM layout, no image bytes),
        what the performance model replays.
    card, cards : int
    max_tokens : int, optional
        Tokens per step; default as many as the on-chip buffers hold, at most MAX_TOKENS.
    dump_hidden : bool
        Every step stores the residual stream after the embeddings and each layer
        (``read_hidden``).
    all_logits : bool
        Every step stores every token's logits, not only the last's.
    param_areas : int, optional
        Layer-parameter areas (2 or 1; 3 a what-if); default 2 where they fit.
    streams : int
        Streams decoded together (``step_batch``), at most the build's core.limits.streams:
        each has its own K/V caches; a stream's own steps (``step(..., stream=s)``) are
        those of a model compiled for one stream.

    Attributes
    ----------
    part : Partition
    dims : Dims
        This card's share's vector sizes.
    plan : Placement
        The on-chip buffers, chosen for the largest share of any card.
    kv : KvLayout
    params : ParamLayout
    img : HbmImage
        The image's bytes (``parts``) and rows (``next_row``); ``load`` writes it.
    hbm : HbmLayout
        Where everything is in HBM.
    T, param_areas, H, dS, v_g, v_pars, kv_rows, prog_addr
        Shorthands: the plan's tokens per step, parameter areas, all-gather buffer and
        parameter areas' VSP words; this card's heads; the residual stream's token stride;
        the K/V caches' rows [lo, hi); the program's byte address.
    """

    def __init__(self, cfg, model, *, card=0, cards=1, max_tokens=None, dump_hidden=False,
                 all_logits=False, param_areas=None, streams=1, split=True):
        self.cfg, self.sh = cfg, model.shape
        self.weights = model.weights      # None: a shapes-only compile (programs, no image)
        self.dump_hidden, self.all_logits = dump_hidden, all_logits
        self.split = split       # steps of several tokens as two interleaved halves (split_at)
        self.merges = {}         # a split step's size -> its merge's (lead, lag) (host.compiler.tune)
        sh, c = self.sh, cfg.core
        check_limits(cfg, sh)
        if not 1 <= streams <= c.limits.streams:
            raise UserError(f"--prompt: {streams} prompts decoded together; allowed: 1 to "
                            f"{c.limits.streams} on this build (core.limits.streams)")
        self.streams = streams
        self.part = Partition.of(sh, card=card, cards=cards, lanes=c.lanes)
        largest, mine = self.part.largest, self.part.mine
        if c.width % c.tile_rows:
            raise UserError(f"core.width: got {c.width}; allowed with {c.weight_dtype} weights: a "
                            f"multiple of a tile's {c.tile_rows} rows (the compiler pads vectors "
                            f"to whole column blocks)")
        self.dims = Dims.of(sh, c.lanes, c.width, H=mine.H, F=mine.F, V=mine.V, tile_rows=c.tile_rows)
        self.plan = choose(cfg, sh, Dims.of(sh, c.lanes, c.width, H=largest.H, F=largest.F, V=largest.V,
                                            tile_rows=c.tile_rows),
                           self.dims, cards=cards, all_logits=all_logits, max_tokens=max_tokens,
                           param_areas=param_areas, streams=streams)
        self.kv = KvLayout.of(self.dims, c.lanes, c.width, sh.n_positions)
        self._check_kv_jobs()
        self.params = ParamLayout.of((2 * self.dims.dq + self.dims.dv, sh.d_model, mine.F, sh.d_model),
                                     c.vector_lanes, param_align(c.vector_lanes, cfg.stripe_bytes))
        self.img, self.hbm = build_image(cfg, sh, self.weights, self.part, self.dims, self.kv, self.params,
                                         T=self.plan.T, all_logits=all_logits, streams=streams)
        self.card, self.cards = card, cards
        self.T, self.param_areas = self.plan.T, self.plan.param_areas
        self.v_g, self.v_pars = self.plan.v_g, self.plan.v_pars
        self.H, self.dS = mine.H, self.dims.dS
        self.kv_rows, self.prog_addr = self.hbm.kv_rows, self.hbm.prog_addr
        self._check_program_area()

    def _check_kv_jobs(self):
        """A K or V MATVEC streams its head's cache over the positions so far in one job, whose
        tiles must fit the weight FIFO: the largest, at the context's end, checked once here
        (not at the step that first reaches it)."""
        kv, n, fifo = self.kv, self.sh.n_positions, self.cfg.core.weight_fifo_tiles
        tiles = max(kv.k_row_blocks(n) * kv.cbk, kv.rbv * kv.v_col_blocks(n))
        if tiles > fifo:
            most = min(fifo // kv.cbk // GROUP * GROUP * kv.L, fifo // kv.rbv * kv.W)
            raise UserError(f"model: a K/V MATVEC over the model's {n} positions streams {tiles} "
                            f"tiles; the weight FIFO holds {fifo} (core.weight_fifo_tiles); allowed: "
                            f"a model of at most {most} positions (n_positions) on this build, or a "
                            f"larger core.weight_fifo_tiles")

    def _check_program_area(self):
        """The longest step's program (T tokens up to the context's end: the most tokens and
        the longest K/V runs) fits in channel 0 from ``prog_addr`` on."""
        t = min(self.T, self.sh.n_positions)
        words = len(self.step([0] * t, self.sh.n_positions - t))
        need, have = words * INSN_BITS // 8, (self.cfg.hbm.channel_mbytes << 20) - self.prog_addr
        if need > have:
            raise UserError(f"model: a step's program of {words} instructions ({need} bytes) does not "
                            f"fit in the {max(have, 0)} bytes of HBM channel 0 after the model's "
                            f"{self.img.next_row} rows; allowed: a model "
                            f"that leaves room for it (more cards, or a smaller model)")

    def load(self, dev):
        """Write the image (weights, parameters, constants, zeroed KV cache) into a card."""
        if self.weights is None:
            raise ValueError("a shapes-only compile has no image to load")
        self.img.write(dev)
        S = self.cfg.stripe_bytes
        lo, hi = self.kv_rows
        if hi > lo:
            write_stripes(dev, self.cfg, lo, np.zeros((hi - lo) * S, np.uint8))
        kv = self.kv
        for caches in self.hbm.stream_kv:           # a batch's other streams' caches
            for k, v in caches:
                write_stripes(dev, self.cfg, k, np.zeros(kv.k_rows * S, np.uint8))
                write_stripes(dev, self.cfg, v, np.zeros(kv.v_rows * S, np.uint8))

    def step(self, tokens, pos0, stream=0, lead=0, lag=None):
        """Program for ``tokens`` (at most T) of stream ``stream`` at positions pos0, pos0 + 1,
        ...; ``lead`` and ``lag``: the merge's, where the step is split in two halves
        (interleave's lead; the parts the second half runs behind the first, default
        emit.SPLIT_LAG). Every merge computes the same values: ``host.compiler.tune`` chooses
        it for time."""
        T = len(tokens)
        if not 1 <= T <= self.T:
            raise ValueError(f"step: {T} tokens; 1..{self.T} allowed")
        if not 0 <= stream < self.streams:
            raise ValueError(f"step: stream {stream}; 0..{self.streams - 1} allowed")
        if pos0 + T > self.sh.n_positions:
            raise UserError(f"prompt: position {pos0 + T - 1} is beyond the model's context "
                            f"({self.sh.n_positions} positions)")
        if split_at(self, T) is not None:
            return split_program(self, list(tokens), pos0, stream=stream, lead=lead, lag=lag)
        return Emitter(self, list(tokens), pos0, stream=stream).program()

    def step_batch(self, batch, lead=0):
        """Program of one decode step of several streams: ``batch`` = [(token, position,
        stream)], the streams distinct. Token j's logits are read with ``read_batch_logits``.
        Each stream's result is bit-identical to its own one-token ``step``. ``lead``: as
        ``step``'s (the runtime merges batches with 0)."""
        B = len(batch)
        if not 1 <= B <= self.streams:
            raise ValueError(f"step_batch: {B} streams; 1..{self.streams} allowed")
        streams = [s for _, _, s in batch]
        if len(set(streams)) != B or not all(0 <= s < self.streams for s in streams):
            raise ValueError(f"step_batch: streams {streams}; distinct, in 0..{self.streams - 1}")
        for _, p, _ in batch:
            if not 0 <= p < self.sh.n_positions:
                raise UserError(f"prompt: position {p} is beyond the model's context "
                                f"({self.sh.n_positions} positions)")
        toks, pairs = [t for t, _, _ in batch], [(p, s) for _, p, s in batch]
        if split_at(self, B) is not None:
            return split_program(self, toks, 0, batch=pairs, lead=lead)
        return Emitter(self, toks, 0, batch=pairs).program()

    def kv_caches(self, layer, stream):
        """(first K row, first V row) of ``stream``'s caches of ``layer``."""
        if stream == 0:
            lr = self.hbm.layers[layer]
            return lr.k, lr.v
        return self.hbm.stream_kv[stream - 1][layer]

    def read_batch_logits(self, dev, B):
        """Logits of a ``step_batch`` of B streams: array [B, this card's vocabulary slice]."""
        vS, S, rows = self.dims.vS, self.cfg.stripe_bytes, self.hbm.logits_rows
        raw = read_stripes(dev, self.cfg, self.hbm.batch_logits_row, B * rows)
        out = raw.reshape(B, rows * S)[:, :vS * 4].copy().view(np.float32)
        return out[:, :self.part.mine.V]

    def read_logits(self, dev, T):
        """Logits of the step's T tokens (all of them if compiled with all_logits, else the
        last): array [T or 1, this card's vocabulary slice]."""
        T = T if self.all_logits else 1
        vS, S = self.dims.vS, self.cfg.stripe_bytes
        raw = read_stripes(dev, self.cfg, self.hbm.logits_row, -(-T * vS * 4 // S))[:T * vS * 4]
        return raw.view(np.float32).reshape(T, vS)[:, :self.part.mine.V]

    def read_hidden(self, dev, T):
        """The residual stream of the step's T tokens after the embeddings and after each
        layer (compiled with dump_hidden): array [n_layer + 1, T, d_model]."""
        per, dS = self.hbm.hidden_stride, self.dims.dS
        out = []
        for k in range(self.sh.n_layer + 1):
            raw = read_stripes(dev, self.cfg, self.hbm.hidden_row + k * per, per)
            vals = raw[:self.T * dS * 4].view(np.float32).reshape(self.T, dS)
            out.append(vals[:T, :self.sh.d_model])
        return np.stack(out)
