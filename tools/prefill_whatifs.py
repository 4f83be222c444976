"""What is left of issue 20's prefill floor, asked of the performance model (docs/performance.md,
"Steps of 32 tokens" quotes the table). GPT-2 1.5B on 4 u280x4 cards, 64 prompt tokens, the
prefill's ms per input token under what-ifs none of which is built:

- ``vec_pipelined``: the vector unit takes its next VEC while the last one's pipeline drains,
  its results written in order (``host.perf.CardModel``'s what-if: a shorter pipeline after a
  longer one starts later; reductions and GELU next to EXP or RECIP wait for the drain);
- elementwise latency once in 16: every elementwise VEC's pipeline latency, pass overhead and
  fp16 copy's latency counted 1/16 (a bound for a VEC that runs over a step's tokens: one
  pass's latency for 16 tokens' rows); reductions as they are;
- a special-function unit per lane (core.special_share 1: EXP, RECIP, RSQRT and GELU at a row
  a cycle, twice the units);
- R = 8: eight token vectors meet each weight tile a cycle (core.reuse 8).

    python tools/prefill_whatifs.py
"""

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import host.perf as hp  # noqa: E402
from gen.config import load_config  # noqa: E402
from host.model import SHAPES  # noqa: E402


def prefill_ms(cfg, *, pipelined=False, latency_once_in=1):
    """Prefill ms per input token of GPT-2 1.5B on 4 cards, [64:2], under the what-ifs."""
    init, cycles = hp.CardModel.__init__, hp.CardModel.vec_cycles

    def patched_init(self, *a, **k):
        k["vec_pipelined"] = k.get("vec_pipelined") or pipelined
        init(self, *a, **k)

    def patched_cycles(self, f):
        c = cycles(self, f)
        if f["vop"] not in hp.REDUCE_VOPS:
            lat = hp.VOP_LAT[hp.VOP_BY_CODE[f["vop"]]] + self.o.vec_pass + (hp.CVT_LAT if f["x16"] else 0)
            c -= lat - lat // latency_once_in
        return c

    hp.CardModel.__init__, hp.CardModel.vec_cycles = patched_init, patched_cycles
    try:
        r = hp.predict(cfg, SHAPES["gpt2-xl"], cards=4, prompt=64, new_tokens=2)
    finally:
        hp.CardModel.__init__, hp.CardModel.vec_cycles = init, cycles
    return r["prefill_ms_per_token"], r["tokens_per_step"]


def main():
    cfg = load_config(ROOT / "configs" / "u280x4.yaml")
    r8 = cfg.replace(**{"core.reuse": 8})
    s1 = cfg.replace(**{"core.special_share": 1})
    both = {"pipelined": True, "latency_once_in": 16}
    rows = [("as built", cfg, {}),
            ("the vector unit takes the next VEC while the last drains (results in order)", cfg,
             {"pipelined": True}),
            ("elementwise passes' latency once in 16", cfg, {"latency_once_in": 16}),
            ("both", cfg, both),
            ("a special-function unit per lane", s1, {}),
            ("a special-function unit per lane, and both", s1, both),
            ("R = 8", r8, {}),
            ("R = 8 and both", r8, both)]
    print("| what-if, GPT-2 1.5B, 4 u280x4 cards, [64:64] | tokens a step | prefill ms per input token |")
    print("|---|---|---|")
    for name, c, kw in rows:
        ms, T = prefill_ms(c, **kw)
        print(f"| {name} | {T} | {ms:.3f} |", flush=True)


if __name__ == "__main__":
    main()
