"""numpy reference of the ring collectives: what each card ends with, bit for bit.

Buffers hold 32-bit words, ``W`` to a link beat. A card's vector of n elements is n words
(fp32, or fp16 in the low half of each word), padded to whole beats. The message's parts and
segments are hw/ring.py's (the geometry the hardware computes): segment j of a part of ``pb``
beats is beats [floor(j pb / N), floor((j + 1) pb / N)) of it; with ``bidirectional``, the
first ceil(nb / 2) beats travel the right-hand ring (card i sends to i + 1) and the rest the
left-hand ring (i sends to i - 1), each split into N segments.

Orders (right-hand ring; the left-hand ring is the same with i - 1 and i + 1 swapped):
- reduce-scatter: card i ends with segment i, summed in ring order starting at card i + 1:
  ((x[i+1] + x[i+2]) + ...) + x[i], in fp32 (fp16 inputs converted exactly first);
- all-gather: card i's whole vector lands in every card's output block i (in place: the card's
  own block is already there);
- all-reduce: reduce-scatter, then all-gather of the reduced segments: every card ends with
  the full reduced vector.
"""

import numpy as np

from hw.ring import beats, parts, segments

from . import arith as A

__all__ = ["reduce_order", "reference", "own_segments"]


def reduce_order(j, N, direction):
    """Cards whose values are added for segment j, in order (the first is the start value)."""
    return [(j + direction * k) % N for k in range(1, N + 1)]


def _to_f32(words, dtype):
    if dtype == "fp16":
        return A.fp16_to_fp32((words & 0xFFFF).astype(np.uint16))
    return words


def reference(op, inputs, W, *, dtype="fp32", bidirectional=False):
    """Each card's output words for ``op`` on ``inputs`` [N, n] (uint32 words).

    Returns a list of arrays: all-gather [N * nb * W] words per card (block j at beat j * nb),
    reduce-scatter the card's segments of each part concatenated, all-reduce [nb * W] words.
    """
    inputs = np.asarray(inputs, np.uint32)
    N, n = inputs.shape
    nb = beats(n, W)
    x = np.zeros((N, nb * W), np.uint32)
    x[:, :n] = inputs
    if op == "allgather":
        out = x.reshape(-1)
        return [out.copy() for _ in range(N)]
    xf = np.stack([_to_f32(x[c], dtype) for c in range(N)])        # fp32 words
    reduced = np.zeros(nb * W, np.uint32)
    owner_parts = [[] for _ in range(N)]
    for p0, pb, d in parts(nb, bidirectional):
        for j, (s0, sb) in enumerate(segments(pb, N)):
            lo, hi = (p0 + s0) * W, (p0 + s0 + sb) * W
            order = reduce_order(j, N, d)
            acc = xf[order[0], lo:hi]
            for c in order[1:]:
                acc = A.fp32_add(acc, xf[c, lo:hi])
            reduced[lo:hi] = acc
            owner_parts[j].append(acc)
    if op == "reducescatter":
        return [np.concatenate(parts) if parts else np.zeros(0, np.uint32) for parts in owner_parts]
    if op == "allreduce":
        return [reduced.copy() for _ in range(N)]
    raise ValueError(f"op {op!r}")


def own_segments(buf, card, N, nb, W, bidirectional=False):
    """The words of card ``card``'s reduce-scatter result out of its result buffer ``buf``
    (words at their offsets in the message): its segment of each part, concatenated, as
    ``reference`` returns them."""
    return np.concatenate([buf[(p0 + s0) * W:(p0 + s0 + sb) * W]
                           for p0, pb, _d in parts(nb, bidirectional)
                           for j, (s0, sb) in enumerate(segments(pb, N)) if j == card]
                          or [np.zeros(0, np.uint32)])
