"""The order in which two halves of a step's instructions are merged into one program.

Owns
----
``interleave``: given the two halves' items (instruction words and ``schedule.Job``s, each
half in its own order), the order constraints between them (``Barrier``s) and the order of
their COLLs, the merged item list: each next item taken from the half whose next item
would issue first on the card, as far as a simple estimate of the card's timing tells
(in-order issue, one instruction at a time in the vector unit, the store engine and the
collective unit, a MATVEC after the matrix unit's last step, and the address hazards of
the issue stage: a reader after its writer, a writer after its readers and writers).

``lead`` biases the estimate towards the vector unit's work: after an elementwise VEC the
estimate takes the vector unit as free ``lead`` times the operation's latency before it is
(not below its issue), so that the next VEC, of either half, looks as early as that and is
taken ahead of the other half's items. The right lead depends on the step (on prefill steps
of GPT-2 models on 2 and 4 u280x4 cards, 1, 2 and 3 each won somewhere: docs/performance.md,
"The interleave's lead"): ``host.compiler.tune`` picks it by the performance model.

The estimate only chooses the order: every order the constraints allow computes the same
values (each half's items keep their order; the barriers keep the orders between halves that
the values depend on), and every card has the same COLLs in the same order (``coll_order``),
whatever its own estimate chose around them. Its durations are the performance model's
(``host.perf``: the vector unit's passes, collectives) or simpler (a MATVEC a step per tile
and token group, a STORE an element a cycle).
"""

import math
from dataclasses import dataclass

from hw.isa import REDUCE_VOPS, decode

from .schedule import Job

__all__ = ["Barrier", "interleave"]


@dataclass(frozen=True)
class Barrier:
    """Half ``h``'s item at position ``at`` (of its own list) may not be taken before the
    other half's first ``after`` items are."""

    h: int
    at: int
    after: int


def interleave(cfg, halves, barriers, coll_order, lead=0, *, cards):
    """The merged items of ``halves`` (two lists), and for each half the merged position of
    each of its positions (and of its end), as a list. ``coll_order``: [(half, k)], the
    order of the halves' COLLs (the k-th of half ``half``); ``lead`` >= 0 (above);
    ``cards``: the cards the program runs on (a COLL's estimate), not the config's count."""
    from ..perf import CVT_LAT, VOP_BY_CODE, VOP_LAT, CardModel, coll_cycles  # (its durations)
    model = CardModel(cfg, cards=cards)
    R, depth = cfg.core.reuse, 40
    need = [dict(), dict()]
    for bar in barriers:
        need[bar.h][bar.at] = max(need[bar.h].get(bar.at, 0), bar.after)
    decoded = [[_decode(x) for x in half] for half in halves]
    colls = [[i for i, (op, _) in enumerate(d) if op == "COLL"] for d in decoded]
    coll_k = [{i: k for k, i in enumerate(c)} for c in colls]
    nxt = [0, 0]
    next_coll = 0
    merged, where = [], [[0] * (len(h) + 1) for h in halves]
    # the estimate's state: the last issue, each unit's next free cycle, what is in flight
    last = 0
    free = {"vpu": 0, "mpu": 0, "dma_wr": 0, "coll": 0, "dma_rd": 0}
    stores = []
    inflight = []                                   # (done, reads, writes)

    def ready(h):
        i = nxt[h]
        if i >= len(halves[h]) or nxt[1 - h] < need[h].get(i, 0):
            return False
        op, _ = decoded[h][i]
        return op != "COLL" or (next_coll < len(coll_order) and coll_order[next_coll] == (h, coll_k[h][i]))

    def estimate(h):
        op, f = decoded[h][nxt[h]]
        reads, writes = model._ranges(op, f)
        t = last
        for done, er, ew in inflight:
            if done >= t and (any(_hits(w, r) for w in writes for r in er + ew)
                              or any(_hits(r, w) for r in reads for w in ew)):
                t = done + 1
        unit = _UNIT.get(op)
        if unit == "dma_wr" and len(stores) > 2:
            t = max(t, stores[-3] + 1)
        elif unit in ("vpu", "mpu", "coll"):
            t = max(t, free[unit])
        return t, reads, writes

    while nxt[0] < len(halves[0]) or nxt[1] < len(halves[1]):
        cands = [h for h in (0, 1) if ready(h)]
        if not cands:
            raise AssertionError(f"interleave: both halves held at {nxt} (the barriers or the COLL order)")
        est = {h: estimate(h) for h in cands}
        h = min(cands, key=lambda k: (est[k][0], k))
        t, reads, writes = est[h]
        op, f = decoded[h][nxt[h]]
        if op == "VEC":
            done = t + 1 + model.vec_cycles(f)
            free["vpu"] = done + 1
            if lead and f["vop"] not in REDUCE_VOPS:
                lat = VOP_LAT[VOP_BY_CODE[f["vop"]]] + (CVT_LAT if f["x16"] else 0)
                free["vpu"] = max(t + 2, free["vpu"] - lead * lat)
        elif op == "MATVEC":
            start = max(t, free["mpu"])
            steps = f["rb"] * f["cb"] * math.ceil(f["tokens"] / R)
            free["mpu"] = start + steps
            done = start + steps + depth
        elif op == "STORE":
            start = max(t, free["dma_wr"])
            done = start + f["n"] + 108
            free["dma_wr"] = done
            stores.append(done)
        elif op == "COLL":
            words = f["n"]
            done = t + coll_cycles(cfg, cards, words, op="allgather" if f["cop"] == 0 else "allreduce")
            free["coll"] = done + 1
            next_coll += 1
        elif op == "LOAD":
            start = max(t, free["dma_rd"])
            done = start + cfg.hbm.latency_cycles + f["n"] // cfg.core.vector_lanes
            free["dma_rd"] = done
        else:
            done = t + 1
        last = t
        inflight = [e for e in inflight if e[0] >= t] + [(done, reads, writes)]
        where[h][nxt[h]] = len(merged)
        merged.append(halves[h][nxt[h]])
        nxt[h] += 1
    for h in (0, 1):
        where[h][len(halves[h])] = len(merged)
    assert next_coll == len(coll_order), (next_coll, len(coll_order))
    return merged, where


_UNIT = {"VEC": "vpu", "MATVEC": "mpu", "STORE": "dma_wr", "COLL": "coll", "LOAD": "dma_rd"}


def _decode(item):
    if isinstance(item, Job):
        return "MATVEC", item.fields
    ins = decode(item)
    return ins.op, ins.fields


def _hits(a, b):
    return a[0] == b[0] and a[1] < b[2] and b[1] < a[2]
