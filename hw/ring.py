"""The ring's geometry: what the hardware and the host side both compute about a collective.

Pure Python (no Amaranth, no numpy), like hw/isa.py: the host imports it too. The card's
collective unit (hw/core/coll.py) computes the same figures in hardware, the bare node's
driver (sim/fabric.py) writes them into the node's segment tables, the references
(sim/ref/collective.py, sim/ref/ring.py) place and count data by them, and the performance
model (host/perf.py) prices them.

A message of n fp32 words travels in link beats of B = link.data_bits / 32 words:
nb = ceil(n / B) beats, the last zero-padded. On a one-way ring all of it goes round the
right-hand ring (card i sends to i + 1); on a bidirectional ring the first ceil(nb / 2) beats
go right and the rest left (card i sends to i - 1). Each such part of pb beats is cut into N
segments, segment j being beats [floor(j pb / N), floor((j + 1) pb / N)) of the part: sizes
differ by at most one beat. All-gather's segment j is instead card j's whole block of the
part (its beats at j nb in the destination). Segments travel in frames of F beats, one chunk
of the schedule each.
"""

from dataclasses import dataclass

__all__ = ["MAX_CARDS", "OP_AG", "OP_RS", "OP_AR", "OPS", "OP_NAMES", "N_BITS", "MIN_LINK_BITS",
           "MIN_RING_LINK_BITS", "DIV_BITS", "beats", "parts", "segments", "segment_table", "chunks",
           "NodeParams", "node_params"]

MAX_CARDS = 16                      # cards in a ring at most (the segment tables' depth)
OP_AG, OP_RS, OP_AR = 0, 1, 2       # COLL's cop (hw/isa.py), the engine's op
OPS = {"allgather": OP_AG, "reducescatter": OP_RS, "allreduce": OP_AR}
OP_NAMES = {code: name for name, code in OPS.items()}
N_BITS = 24                         # COLL's n: words of a card's input, at most 2^24 - 1
MIN_LINK_BITS = 128                 # the link layer's trailer: 128 bits of a beat
# The collective unit's divider splits a part of pb <= nb = ceil((2^24 - 1) / B) beats in
# DIV_BITS-bit registers: nb <= 2^21 for B >= 8, so a card with a ring needs link beats of
# at least 256 bits (with 128, B = 4, nb reaches 2^22 and would not fit).
DIV_BITS = 22
MIN_RING_LINK_BITS = 256


def beats(n, B):
    """Link beats of a message of ``n`` words, ``B`` words to a beat: ceil(n / B)."""
    return -(-n // B)


def parts(nb, bidirectional):
    """[(first beat, beats, direction)] of a message of ``nb`` beats: the right-hand ring's
    part (direction +1), and on a bidirectional ring the left-hand ring's (-1)."""
    if not bidirectional:
        return [(0, nb, +1)]
    a = -(-nb // 2)
    return [(0, a, +1), (a, nb - a, -1)]


def segments(pb, N):
    """[(first beat, beats)] of the ``N`` segments of a part of ``pb`` beats (first beats
    relative to the part): segment j starts at floor(j pb / N)."""
    return [(j * pb // N, (j + 1) * pb // N - j * pb // N) for j in range(N)]


def segment_table(op, nb, N, bidirectional):
    """{direction: [(first beat, beats)] for segment j = 0 .. N - 1}: the node's segment table
    of each ring direction (first beats counted from the message's first beat). Reduce-scatter
    and all-reduce: the part's segments; all-gather (``op`` OP_AG): card j's block of the part,
    at j nb."""
    table = {}
    for p0, pb, d in parts(nb, bidirectional):
        if op == OP_AG:
            table[d] = [(j * nb + p0, pb) for j in range(N)]
        else:
            table[d] = [(p0 + s0, sb) for s0, sb in segments(pb, N)]
    return table


def chunks(nbeats, F):
    """Chunks (frames of ``F`` beats) of a segment of ``nbeats`` beats: ceil(nbeats / F)."""
    return -(-nbeats // F)


@dataclass(frozen=True)
class NodeParams:
    """The link layer's and the ring engine's sizes for a config (``node_params``).

    Attributes
    ----------
    data_bits : int
        Link beat (``link.data_bits``).
    frame_beats : int
        F: payload beats per frame, one chunk of the schedule (``link.chunk_bytes`` / beat bytes).
    group : int
        K: chunks in flight per round, enough that K F covers the link latency and a frame.
    rx_frames : int
        The receive buffer and the send window in frames (2K rounded up to a power of two).
    timeout : int
        Cycles without an acknowledgement before the sender goes back.
    retries : int
        Timeouts in a row before the link is reported dead.
    """

    data_bits: int
    frame_beats: int
    group: int
    rx_frames: int
    timeout: int
    retries: int


def node_params(cfg):
    """Link-layer sizes for a config: K chunks cover the link latency, buffers hold 2K frames.

    Raises ``ValueError`` for a ``link.data_bits`` below ``MIN_LINK_BITS`` (gen/config.py
    rejects such configs first)."""
    D = cfg.link.data_bits
    if D < MIN_LINK_BITS:
        raise ValueError(f"link.data_bits: got {D}; the collective engine needs at least "
                         f"{MIN_LINK_BITS}")
    F = max(1, cfg.link.chunk_bytes // (D // 8))
    K = -(-(cfg.link.latency_cycles + F + 48) // F)
    R = 1 << (2 * K - 1).bit_length()
    timeout = 4 * cfg.link.latency_cycles + 2 * R * (F + 1) + 256
    return NodeParams(D, F, K, R, timeout, 8)
