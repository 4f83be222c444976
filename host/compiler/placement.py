"""Where a step's vectors live on chip (VSP words, XB words), and how many tokens a step takes.

Owns
----
- ``Allocator``: first fit over VSP or XB words, placing buffers that a two-operand vector
  operation reads together in different VSP segments (a segment has one read port) where
  there is room;
- ``Placement``: the buffer plan of one card, a frozen result;
- ``candidates`` and ``choose``: the plan is the first of an explicit list of candidates
  (parameter areas, tokens per step, placement by segment) whose buffers fit, chosen for the
  largest share of any card, so that every card of an appliance steps alike; each card then
  places its own, smaller or equal, buffers with that candidate.

The ISA's VSP and XB addresses (hw/isa.py: ADDR_BITS words; MATVEC's 16-bit rows) cap both
spaces at 2^20 words (the config checks them).
"""

from dataclasses import dataclass

import numpy as np

from hw.isa import MAX_TOKENS

from ..errors import UserError
from .layout import GROUP, param_align, round_up

__all__ = ["Allocator", "Candidate", "candidates", "Placement", "NoRoom", "place", "choose"]


class Allocator:
    """First-fit allocator of ``words`` words (VSP or XB), aligned to ``align`` words.

    The VSP's segments (``segment`` words each) have one read port each: a buffer given
    ``avoid`` (buffers a two-operand vector operation reads it with) goes where it shares no
    segment with them if there is room, else anywhere (unless ``strict``).

    A request that does not fit returns None and marks the allocator ``short`` (unless
    ``optional``): a plan is checked once, after its requests, instead of after each.
    """

    def __init__(self, words, align, what, key, segment=None):
        self.words, self.align, self.what, self.key = words, align, what, key
        self.segment = segment or words
        self.used = {}                      # start -> end
        self.short = False

    def copy(self):
        """An allocator in the same state, for a trial placement."""
        c = Allocator(self.words, self.align, self.what, self.key, self.segment)
        c.used, c.short = dict(self.used), self.short
        return c

    @property
    def free(self):
        """Words not allocated (holes included)."""
        return self.words - sum(hi - lo for lo, hi in self.used.items())

    @property
    def shortage(self):
        """The message of a plan that did not fit here."""
        return (f"model: needs more than the {self.words} {self.what} words this build has "
                f"(core.{self.key})")

    def _segs(self, a, n):
        return set(range(a // self.segment, (a + max(n, 1) - 1) // self.segment + 1))

    def _fits(self, a, n):
        return a + n <= self.words and all(a + n <= lo or hi <= a for lo, hi in self.used.items())

    def find(self, n, avoid=(), strict=False, split=None):
        """The first word where a buffer of ``n`` words fits, or None. ``split``: where room
        allows, word ``split`` of the buffer starts a segment (a two-operand pass reads the
        words before it with those after it); split first, then apart, then anywhere."""
        al = self.align
        cands = sorted({round_up(x, al) for x in [0, *self.used.values(),
                                                  *range(0, self.words, self.segment)]})
        bad = set().union(*(self._segs(b, self.used[b] - b) for b in avoid if b in self.used))
        apart = [a for a in cands if not self._segs(a, n) & bad]
        tries = [apart] if strict else [apart, cands]
        if split is not None:
            at = [b - split for b in range(self.segment, self.words, self.segment)
                  if b - split >= 0 and (b - split) % al == 0]
            tries = [[a for a in at if not self._segs(a, n) & bad]] + ([] if strict else [at]) + tries
        return next((a for t in tries for a in t if self._fits(a, n)), None)

    def __call__(self, n, avoid=(), strict=False, split=None, optional=False):
        """Allocate ``n`` words (``find``); their first word, or None (then ``short`` unless
        ``optional``)."""
        a = self.find(n, avoid, strict, split)
        if a is None:
            self.short = self.short or not optional
            return None
        self.used[a] = a + n
        return a


@dataclass(frozen=True)
class Candidate:
    """A try at a plan: ``param_areas`` layer-parameter areas (2: the next layer's load while
    this layer runs; 1: the load after the layer's last use; 3, asked for only: a split
    step's second half may run further behind, a what-if of tools/step_whatifs.py), ``T``
    tokens per step, and whether buffers read together are placed apart by VSP segment
    (``by_segment``)."""

    param_areas: int
    T: int
    by_segment: bool


def candidates(*, max_tokens=None, param_areas=None):
    """The candidates, best first: placed by segment before not (placing apart leaves holes);
    two parameter areas before one, even at fewer tokens per step (two keep a LOAD per layer
    off every decode step's critical path; more tokens per step buy prefill little, there is
    no weight reuse yet); then the most tokens per step, at most MAX_TOKENS. ``max_tokens``
    and ``param_areas`` fix those where given."""
    if max_tokens is not None and not 1 <= max_tokens <= MAX_TOKENS:
        raise ValueError(f"max_tokens: got {max_tokens}; allowed 1..{MAX_TOKENS} (MATVEC.tokens)")
    if param_areas is not None and param_areas not in (1, 2, 3):
        raise ValueError(f"param_areas: got {param_areas}; allowed 1, 2 or 3")
    return [Candidate(a, T, s) for s in (True, False) for a in ([param_areas] if param_areas else [2, 1])
            for T in ([max_tokens] if max_tokens else range(MAX_TOKENS, 0, -1))]


@dataclass(frozen=True)
class Placement:
    """One card's on-chip buffers for steps of up to ``T`` tokens (VSP words unless x_*, XB
    words; per token at the strides of ``Dims``).

    Attributes
    ----------
    T, param_areas, by_segment : int, int, bool
        The candidate this plan was made for.
    v_const : int
        1 / d and eps (LayerNorm constants).
    v_mask : int
        Decode's causal mask over nS scores: 0 up to the step's position, -inf past it.
    v_x : int
        The residual stream x (whole COLL beats: an all-reduce's result).
    v_g : int or None
        Decode's all-gather of the cards' partial sums, ``g_blk`` words a card (card 0's block
        in another segment than the rest), where it fits; None: the all-reduce instead.
    g_blk : int
        A card's block of the all-gather (dS in whole COLL beats).
    v_y, v_yb : int
        A projection's output (all-reduced in place), mlp.c_proj's second column part's.
    v_qkv, v_sc, v_att, v_h : int
        c_attn's output, the scores, the heads' outputs, c_fc's output.
    v_zinv : int
        The softmax sums' reciprocals: over the scores (dead by then) where they are as long.
    v_a, v_scal : int
        The LayerNorms' x - mean (squared) and the scalars (``Emitter.scalar``), away from the
        matrix unit's outputs where room allows (a segment takes one write a cycle).
    v_pars : (int, ...)
        The layer-parameter areas, ``param_areas`` of them, layer i in area i % param_areas.
    v_logits, v_hbias : int or (int, int)
        The LM head's logits and bias: one buffer each with all_logits; else two each (the
        same twice where the whole slice is one ``chunk``), chunk k in buffer k % 2.
    chunk : int or None
        Logits per LM head buffer (whole groups of row blocks and stripe rows); None with
        all_logits.
    x_a, x_q, x_p, x_att, x_h : int
        XB: fp16(x), q, the probabilities, the heads' outputs (c_proj's input, dense),
        GELU's output (mlp.c_proj's input).
    streams : int
        Streams of a decode batch the plan holds (1: no batch).
    v_masks : int or None
        With streams > 1: the causal masks of the batch's tokens 1, 2, ... (nS words each;
        token 0's is v_mask).
    v_gb : int or None
        With streams > 1 and the all-gather: its buffer for a batch (every token's partial
        sums, a card's block of ``round_up(streams dS, beat)`` words), card 0's block alone
        in a segment where room allows (as ``v_g``'s).
    v_gb2 : int or None
        The same for the second half of a split batch (``emit.split_program``), where room
        allows (else that half takes the rest of ``v_gb``). With it, each half places its
        blocks (of its own tokens, a smaller stride) so that card 0's block ends where
        ``v_gb``'s (``v_gb2``'s) does: every addition of the sums then reads two segments.
    v_ln : int or None
        Several cards and tokens: the LayerNorm's r of this card's share of a step's tokens
        (``round_up(ceil(T / cards) P, beat)`` words), then every card's, gathered.
    v_ln2 : int or None
        The same for the second half of a split step (``emit.split_program``).
    """

    T: int
    param_areas: int
    by_segment: bool
    v_const: int
    v_mask: int
    v_x: int
    v_g: int | None
    g_blk: int
    v_y: int
    v_yb: int
    v_qkv: int
    v_sc: int
    v_att: int
    v_zinv: int
    v_h: int
    v_a: int
    v_scal: int
    v_pars: tuple
    v_logits: int | tuple
    v_hbias: int | tuple
    chunk: int | None
    x_a: int
    x_q: int
    x_p: int
    x_att: int
    x_h: int
    streams: int = 1
    v_masks: int | None = None
    v_gb: int | None = None
    v_gb2: int | None = None
    v_ln: int | None = None
    v_ln2: int | None = None


@dataclass(frozen=True)
class NoRoom:
    """A candidate that does not fit: ``message`` names the space that ran out."""

    message: str


def place(cfg, shape, dims, cand, *, cards, all_logits, gather=None, streams=1, ln=None):
    """The Placement of candidate ``cand`` for a share of dims ``dims``, or NoRoom.

    ``gather``: decode's all-gather buffer (several cards only) is placed if it fits (None),
    must be (True) or is not (False); so is the LayerNorm's buffer (``ln``). ``streams`` > 1:
    a decode batch's buffers are placed after everything else (so that a stream's steps use
    the same buffers as without a batch: the same programs, the same arithmetic)."""
    c, P, T, d = cfg.core, cfg.core.vector_lanes, cand.T, shape.d_model
    B = cfg.link.data_bits // 32                    # a COLL beat, words
    v = Allocator(c.vsp_words, P, "VSP", "vsp_words",
                  c.vsp_words // c.vsp_segments if cand.by_segment else c.vsp_words)
    b = {}
    b["v_const"] = v(P)
    b["v_mask"] = v(dims.nS)
    b["v_x"] = v(round_up(T * dims.dS, B))
    # Decode's all-reduces as an all-gather of the cards' partial sums (N - 1 ring steps
    # instead of 2(N - 1)) and their sum in card order on every card, x = p0 + p1, then
    # x += p2 ...: card 0's block in another segment than the rest (and x where room
    # allows), so that each addition reads its operands from two segments.
    b["g_blk"] = round_up(dims.dS, B)
    b["v_g"] = None
    if cards > 1 and gather is not False:
        b["v_g"] = v(cards * b["g_blk"], avoid=[b["v_x"]], split=b["g_blk"], optional=gather is None)
    b["v_y"] = v(round_up(T * dims.dS, B), avoid=[b["v_x"]])
    b["v_yb"] = v(T * dims.dS, avoid=[b["v_x"], b["v_y"]])
    b["v_qkv"] = v(T * dims.qS)
    b["v_sc"] = v(T * dims.H * dims.nS)
    b["v_att"] = v(T * dims.aS)
    b["v_zinv"] = b["v_sc"] if dims.H * dims.nS >= dims.aS else v(T * dims.aS)
    b["v_h"] = v(T * dims.fS)
    outs = [b["v_qkv"], b["v_h"], b["v_y"], b["v_yb"]]
    b["v_a"] = v(T * dims.dS, avoid=outs)
    b["v_scal"] = v((4 + 2 * dims.H) * T * P, avoid=outs)
    # Parameter areas: c_attn's bias first, up to a stripe row's boundary (layer 0 loads it
    # alone), away from the outputs whose ADDs read the biases.
    align = param_align(P, cfg.stripe_bytes)
    plen = round_up(dims.qS, align) + sum(round_up(n, P) for n in (d, dims.F, d))
    readers = [b["v_y"], b["v_qkv"], b["v_h"]]
    a = v(plen, avoid=readers)
    b["v_pars"] = (a, *(v(plen, avoid=readers) for _ in range(cand.param_areas - 1)))
    if v.short:
        return NoRoom(v.shortage)
    if all_logits:
        b["v_logits"], b["v_hbias"], b["chunk"] = v(T * dims.vS), v(dims.vS), None
        if v.short:
            return NoRoom(v.shortage)
    else:
        head = _head_buffers(cfg, dims, v)
        if head is None:
            return NoRoom(v.shortage)
        b["v_logits"], b["v_hbias"], b["chunk"] = head
    xb = Allocator(c.xb_words, c.width, "XB", "xb_words")
    b["x_a"] = xb(T * dims.dS)
    b["x_q"] = xb(T * dims.dq)
    b["x_p"] = xb(T * dims.H * dims.nS)
    b["x_att"] = xb(T * dims.dq)
    b["x_h"] = xb(T * dims.fS)
    if xb.short:
        return NoRoom(xb.shortage)
    # The LayerNorm statistics of a step's tokens shared out over the cards (Emitter._ln_stats):
    # a card's r's, then every card's, a COLL beat block each (optional: without, every card
    # computes every token's).
    # (And the same for a split step's second half: emit.split_program.)
    n = round_up(-(-T // cards) * P, B) * (cards + 1)
    b["v_ln"] = b["v_ln2"] = None
    if cards > 1 and T > 1 and ln is not False:
        b["v_ln"] = v(2 * n, optional=ln is None)
        b["v_ln2"] = b["v_ln"] + n if b["v_ln"] is not None else None
    b["streams"] = streams
    if streams > 1:
        b["v_masks"] = v((streams - 1) * dims.nS)
        if b["v_g"] is not None:
            blk = round_up(streams * dims.dS, B)
            b["v_gb"] = v(cards * blk, split=blk)
            b["v_gb2"] = v(cards * blk, split=blk, optional=True)
        if v.short:
            return NoRoom(f"{v.shortage} to decode {streams} streams together")
    return Placement(T=T, param_areas=cand.param_areas, by_segment=cand.by_segment, **b)


def _head_buffers(cfg, dims, v):
    """(logits, bias, chunk) of the LM head in chunks (generation: the last token's logits),
    allocated in ``v``, or None where none fits. The whole slice in one chunk (a buffer each
    for the logits and the bias) if it fits, else the largest chunk, whole groups of row
    blocks and stripe rows, whose four buffers (two each: one chunk's logits are stored while
    the next is computed) fit; the biases in other segments than the logits if that can be
    (their ADD reads both)."""
    unit = int(np.lcm(cfg.core.tile_rows * GROUP, cfg.stripe_bytes // 4))
    whole = round_up(dims.vS, unit)
    top = min(whole, max(unit, v.free // 4 // unit * unit))
    tries = [(whole, strict, 1) for strict in (True, False)]
    tries += [(k, strict, 2) for k in range(top, 0, -unit) for strict in (True, False)]
    for chunk, strict, bufs in tries:
        trial = v.copy()
        logits = tuple(trial(chunk) for _ in range(bufs))
        hbias = tuple(trial(chunk, avoid=list(logits), strict=strict) for _ in range(bufs))
        if not trial.short:
            v.used = trial.used
            return logits * (2 // bufs), hbias * (2 // bufs), chunk
    return None


def choose(cfg, shape, largest, mine, *, cards, all_logits, max_tokens=None, param_areas=None,
           streams=1):
    """This card's Placement: the first of ``candidates`` that fits the largest share's dims
    ``largest``, made for this card's dims ``mine`` (with the all-gather where the largest
    share has it, so that every card's programs have the same COLLs). Raises UserError where
    no candidate fits, naming the space the last one ran out of.

    The candidate does not depend on ``streams``: it is the first that also holds the buffers
    of a batch of the build's core.limits.streams (where one does), so that a stream's steps
    are the same whether it is decoded alone or in any batch (a prompt's logits depend on the
    size of its prefill steps, in their last bits). With ``streams`` > 1 the batch's buffers
    must then fit beside it."""
    def with_batch(cand, plan, n):
        """The largest share's plan for ``cand`` with a batch of ``n`` streams' buffers."""
        return place(cfg, shape, largest, cand, cards=cards, all_logits=all_logits, streams=n,
                     gather=plan.v_g is not None, ln=plan.v_ln is not None)

    most = cfg.core.limits.streams
    first = chosen = None
    for cand in candidates(max_tokens=max_tokens, param_areas=param_areas):
        plan = place(cfg, shape, largest, cand, cards=cards, all_logits=all_logits)
        if not isinstance(plan, Placement):
            continue
        first = first or (cand, plan)
        if most == 1 or (most <= cand.T and isinstance(with_batch(cand, plan, most), Placement)):
            chosen = (cand, plan)
            break
    if first is None:
        raise UserError(plan.message)
    cand, plan = chosen or first      # (no room for a whole batch: steps as large as fit alone)
    if streams > cand.T:
        raise UserError(f"model: {streams} streams decoded together need steps of {streams} tokens; "
                        f"this model's steps hold {cand.T} on this build (its VSP and XB); allowed: "
                        f"at most {cand.T} streams")
    if streams > 1:
        plan = with_batch(cand, plan, streams)
        if isinstance(plan, NoRoom):
            raise UserError(plan.message)
    own = place(cfg, shape, mine, cand, cards=cards, all_logits=all_logits, gather=plan.v_g is not None,
                streams=streams, ln=plan.v_ln is not None)
    if isinstance(own, NoRoom):         # (a smaller share fits where the largest did)
        raise UserError(own.message)
    return own
