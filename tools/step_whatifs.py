"""What bounds issue 20's floors, asked of the performance model (docs/performance.md, "The
collective unit's own time" quotes the table). GPT-2 1.5B on 4 u280x4 cards, one step each of:
a decode token at position 66, a decode batch of 8 streams at position 66 (batch 8 / batch 1
tokens/s = 8 x the first / the second) and a prefill step of 32 tokens at position 32 (its
cycles per token; 200 K cycles a ms at 200 MHz). None of the what-ifs but the first is built:

- STOREs an element a cycle: the store engine as it was before its row path;
- a batch's sums through one segment: the halves of a decode batch share one all-gather
  buffer (no ``Placement.v_gb2``), as before it, so a half's first addition reads both
  operands through one VSP segment's port;
- a CVT16 after each all-reduce: the prefill all-reduce without its fp16 copy into XB
  (``emit.ALLREDUCE_X16 = False``, as it was before COLL.x16);
- decoupled issue: an instruction takes a scoreboard entry (32) and a place in its unit's
  queue (8) without waiting for its hazards; each unit starts its instructions in order once
  the older ones they conflict with are done (``CardModel(decoupled=...)``);
- the CVT16 passes over x free: any CVT16 of 1,024 words or more takes one cycle (before
  COLL.x16, its bound; after it, what is left of such passes);
- the collective unit pipelined: it takes the next COLL once the last one's data have moved,
  not after its frames' latency on the links (``CardModel(coll_pipelined=True)``);
- link latency halved: 250 cycles a hop instead of 500 (a config, for the sensitivity);
- a split step's second half one part behind the first (``emit.SPLIT_LAG = 1``), not two:
  its attention beside the first half's attn.c_proj, not the first half's MLP; and three or
  four parts behind, with three layer-parameter areas (``param_areas=3``: with two, the
  first half would load a layer's parameters over an area the second half still reads);
- LayerNorm statistics on every card: ``emit.SHARE_LN = False``;
- MLP columns moved off the card with 7 heads: 192 of its 1,600 to the other three;
- every COLL one cycle (a bound: the same programs, their collectives free), alone and with
  decoupled issue of deep queues (64 a unit, 256 scoreboard entries): what the units' own
  chains leave when nothing waits on a link;
- everything named at once (a bound): the all-gather's sums done by the collective unit as
  the blocks land (every ADD of 1,024 words or more one cycle), vector operations over many
  (head, token) segments in one pass (every other VEC below 1,024 words but GELU, CVT16 and
  RSQRT one cycle), the
  one-beat all-gathers of the LayerNorm statistics free, the collective unit pipelined, the
  vector unit pipelined and decoupled issue (64, 256);
- the collective unit's VSP reader and writer as they were, with an idle cycle between beats
  (R + 1 cycles a beat, not R: ``Overheads(coll_beat_gap=1)``); and the unit as it is with a
  VSP read and write port for each ring direction (``coll_port_dirs=1``, not built): what its
  own time costs;
- R = 8: a weight tile meets 8 tokens a cycle (twice the matrix unit's MACs), so a batch of 8
  is one group, its weights streamed once (not split: split_at leaves no half of two); and
  with everything named above at once (a bound).

    python tools/step_whatifs.py            # every row
    python tools/step_whatifs.py "R = 8"    # "as built" and the rows whose name holds the text
    python tools/step_whatifs.py --chain "everything"   # and what card 0's steps waited on
                                                        # (host.perf.critical_chain), per row
"""

import sys
from contextlib import contextmanager, nullcontext
from dataclasses import replace
from pathlib import Path
from unittest.mock import patch

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import host.compiler.emit as emit  # noqa: E402
import host.compiler.partition as partition  # noqa: E402
import host.compiler.placement as placement  # noqa: E402
import host.perf as hp  # noqa: E402
from gen.config import load_config  # noqa: E402
from host.compiler import CompiledModel  # noqa: E402
from host.model import SHAPES, Gpt2  # noqa: E402


def programs(cfg, param_areas=None):
    model = Gpt2(SHAPES["gpt2-xl"], None)
    cms = [CompiledModel(cfg, model, card=i, cards=4, streams=8, param_areas=param_areas) for i in range(4)]
    T = cms[0].T
    return ([cm.step([0], 66) for cm in cms],
            [cm.step_batch([(0, 66, s) for s in range(8)]) for cm in cms],
            [cm.step([0] * T, 32) for cm in cms], T)


CHAIN = "--chain" in sys.argv
CHAINS = []     # with --chain: (the step, perf.critical_chain of its card 0), the row's


def figures(cfg, progs, **what_if):
    one, batch, prefill, T = progs
    (r1, r8), rp = ([hp.simulate(cfg, p, trace=CHAIN, **what_if) for p in (one, batch)],
                    hp.simulate(cfg, prefill, **what_if))
    if CHAIN:           # (the decode and batch steps' runs, traced)
        CHAINS.extend((step, hp.critical_chain(p, r)) for step, p, r in
                      (("decode step, 1 token", one, r1), ("batch step, 8 streams", batch, r8)))
    c1, c8, cp = r1["cycles"], r8["cycles"], rp["cycles"]
    return c1, c8, 8 * c1 / c8, cp / T


def _cvt_free(vec_cycles):
    def cycles(self, f):
        if hp.VOP_BY_CODE[f["vop"]] == "CVT16" and f["n"] >= 1024:
            return 1
        return vec_cycles(self, f)
    return cycles


def _one_gather_buffer(place):
    def placed(*args, **kwargs):
        plan = place(*args, **kwargs)
        return replace(plan, v_gb2=None) if isinstance(plan, placement.Placement) else plan
    return placed


def _one_cycle(*args, **kwargs):
    return 1


def _everything_free(vec_cycles, coll_cycles):
    """The vector and collective costs of the bound 'everything named at once'."""
    def vec(self, f):
        name = hp.VOP_BY_CODE[f["vop"]]
        if (name == "ADD" and f["n"] >= 1024) or (name not in ("ADD", "GELU", "CVT16", "RSQRT")
                                                  and f["n"] < 1024):
            return 1
        return vec_cycles(self, f)

    def coll(cfg, cards, words, **kwargs):
        return 1 if words < 100 else coll_cycles(cfg, cards, words, **kwargs)
    return vec, coll


def _mlp_off_the_largest(of, moved):
    def partition_of(cls, shape, *, card, cards, lanes):
        p = of(cls, shape, card=card, cards=cards, lanes=lanes)
        heads = [partition.share(shape.n_head, cards, c)[1] for c in range(cards)]
        big = [c for c in range(cards) if heads[c] == max(heads)]
        if len(big) == cards:
            return p
        base = shape.d_ff // cards
        cols = [base - moved if c in big else base + moved * len(big) // (cards - len(big))
                for c in range(cards)]
        assert sum(cols) == shape.d_ff, cols
        return replace(p, f0=sum(cols[:card]), mine=partition.Share(p.mine.H, cols[card], p.mine.V),
                       largest=partition.Share(p.largest.H, max(cols), p.largest.V))
    return classmethod(partition_of)


def main():
    cfg = load_config(ROOT / "configs" / "u280x4.yaml")
    base = programs(cfg)
    none = nullcontext()
    cvt_free = patch.object(hp.CardModel, "vec_cycles", _cvt_free(hp.CardModel.vec_cycles))
    slow = cfg.replace(**{"link.latency_cycles": 250})
    wide = cfg.replace(**{"core.reuse": 8})
    vec_free, coll_free = _everything_free(hp.CardModel.vec_cycles, hp.coll_cycles)

    @contextmanager
    def everything():
        with patch.object(hp.CardModel, "vec_cycles", vec_free), patch.object(hp, "coll_cycles", coll_free):
            yield
    rows = [  # (name, what it patches, the figures)
        ("as built", none, lambda: figures(cfg, base)),
        ("STOREs an element a cycle (before the row path)",
         patch.object(hp.CardModel, "_store_walk", lambda self, f: f["n"]), lambda: figures(cfg, base)),
        ("a batch's sums through one segment (before Placement.v_gb2)",
         patch.object(placement, "place", _one_gather_buffer(placement.place)),
         lambda: figures(cfg, programs(cfg))),
        ("a CVT16 pass after each all-reduce (before COLL.x16)",
         patch.object(emit, "ALLREDUCE_X16", False), lambda: figures(cfg, programs(cfg))),
        ("decoupled issue", none, lambda: figures(cfg, base, decoupled=(8, 32))),
        ("the CVT16 passes over x free", cvt_free, lambda: figures(cfg, base)),
        ("decoupled issue and the CVT16 passes free", cvt_free,
         lambda: figures(cfg, base, decoupled=(8, 32))),
        ("the collective unit pipelined", none, lambda: figures(cfg, base, coll_pipelined=True)),
        ("link latency halved (250 cycles)", none, lambda: figures(slow, programs(slow))),
        ("a split step's second half one part behind the first, not two",
         patch.object(emit, "SPLIT_LAG", 1), lambda: figures(cfg, programs(cfg))),
        ("three parameter areas, the second half three parts behind", patch.object(emit, "SPLIT_LAG", 3),
         lambda: figures(cfg, programs(cfg, param_areas=3))),
        ("three parameter areas, the second half four parts behind", patch.object(emit, "SPLIT_LAG", 4),
         lambda: figures(cfg, programs(cfg, param_areas=3))),
        ("LayerNorm statistics on every card", patch.object(emit, "SHARE_LN", False),
         lambda: figures(cfg, programs(cfg))),
        ("192 MLP columns off the card with 7 heads",
         patch.object(partition.Partition, "of",
                      _mlp_off_the_largest(partition.Partition.of.__func__, 192)),
         lambda: figures(cfg, programs(cfg))),
        ("every COLL one cycle (a bound)", patch.object(hp, "coll_cycles", _one_cycle),
         lambda: figures(cfg, base)),
        ("every COLL one cycle, decoupled issue (64, 256)", patch.object(hp, "coll_cycles", _one_cycle),
         lambda: figures(cfg, base, decoupled=(64, 256))),
        ("everything named at once (a bound)", everything(),
         lambda: figures(cfg, base, decoupled=(64, 256), coll_pipelined=True, vec_pipelined=True)),
        ("the collective unit at R + 1 cycles a beat (as it was: an idle cycle between beats)", none,
         lambda: figures(cfg, base, overheads=hp.Overheads(coll_beat_gap=1))),
        ("the collective unit with a VSP port per ring direction", none,
         lambda: figures(cfg, base, overheads=hp.Overheads(coll_port_dirs=1))),
        ("R = 8: a batch of 8 one group, its weights streamed once", none,
         lambda: figures(wide, programs(wide))),
        ("R = 8 and everything named at once (a bound)", everything(),
         lambda: figures(wide, programs(wide), decoupled=(64, 256), coll_pipelined=True, vec_pipelined=True)),
    ]
    print("| what-if, GPT-2 1.5B, 4 u280x4 cards | decode step, 1 token | batch step, 8 streams "
          "| batch 8 / batch 1 tokens/s | prefill step of 32, cycles a token |")
    print("|---|---|---|---|---|")
    args = [a for a in sys.argv[1:] if a != "--chain"]
    only = args[0] if args else None
    chains = []
    for name, patched, run in rows:
        if only is not None and name != "as built" and only not in name:
            continue
        with patched:
            c1, c8, ratio, per = run()
        print(f"| {name} | {c1:,} | {c8:,} | {ratio:.2f}x | {per:,.0f} |", flush=True)
        chains += [(name, step, chain) for step, chain in CHAINS]
        CHAINS.clear()
    for name, step, chain in chains:
        print(f"\n{name}, {step}: card 0's chain, {sum(c for _, c, _ in chain):,} cycles\n")
        print("| on the chain | cycles | instructions |\n|---|---|---|")
        for what, cycles, n in chain[:12]:
            print(f"| {what} | {cycles:,} | {n:,} |")


if __name__ == "__main__":
    main()
