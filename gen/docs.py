"""Docs generated from the code and from the bench's results: ``python -m gen.docs`` rewrites
them, tests check they are fresh.

Whole files (docs/configs.md, docs/isa.md) come from the config schema and the ISA. The
README's figures come from the JSON that ``make bench`` records in docs/bench/ (and the
performance model's calibration, docs/perf-calibration.json): each figure block of README.md
sits between ``<!-- begin generated: NAME -->`` and ``<!-- end generated: NAME -->`` and is
rewritten from those files, so that no figure in the README is typed by hand.
"""

import json
import re
import sys
from pathlib import Path

from .config import schema_rows

ROOT = Path(__file__).resolve().parent.parent
BENCH = ROOT / "docs" / "bench"


def configs_md():
    lines = ["# Config reference", "",
             "Generated from `gen/config.py` (`python -m gen.docs`); every key is required "
             "unless it has a default.", "",
             "| key | allowed | meaning |", "|---|---|---|"]
    lines += [f"| `{k}` | {a} | {d} |" for k, a, d in schema_rows()]
    from gen.config import DEVICE, DEVICE_DSPS, DEVICE_URAM_BITS
    lines += ["", "Checked across keys (each refused with one line naming the key, the value and "
              "what is allowed; the device limits also by how much):", "",
              f"- `core.lanes` x `core.width` x `core.reuse` multipliers (one DSP each) at most "
              f"{DEVICE_DSPS:,}, the DSP slices of {DEVICE};",
              f"- the weight FIFO, `core.weight_fifo_tiles` stripes of all channels, at most "
              f"{DEVICE_URAM_BITS / 8 / 2**20:.2f} MiB, the URAM of {DEVICE};",
              "- a weight tile is one stripe: `core.lanes` x `core.width` x 2 bytes = "
              "`hbm.channels` x `hbm.data_bits` / 8;",
              "- `core.weight_dtype: int8` needs `core.reuse` >= 2;",
              "- `core.cache_phases` > 1 only with `core.weight_dtype: int16`, and it divides "
              "`core.lanes`;",
              "- `core.vector_lanes` divides `core.lanes`; a VSP segment holds at least 4 "
              "rows; `core.xb_words` >= `core.width`;",
              "- with `cards` > 1, what the collective unit needs of `link.data_bits` "
              "(docs/collectives.md)."]
    return "\n".join(lines) + "\n"


def isa_md():
    from hw.isa import isa_markdown
    return isa_markdown()


# -- README figures from the bench's JSON ---------------------------------------------------
def _bench(name):
    path = BENCH / f"{name}.json"
    if not path.exists():
        raise FileNotFoundError(f"{path.relative_to(ROOT)}: missing; `make bench` records it")
    return json.loads(path.read_text())


def _n(v, digits=None):
    """A figure as the README prints it: thousands separated, ``digits`` decimals if given."""
    if digits is not None:
        return f"{v:,.{digits}f}"
    return f"{v:,}" if isinstance(v, int) or float(v).is_integer() else f"{v}"


def fig_core():
    rs = [_bench("core-tiny"), _bench("core-medium")]
    head = " | ".join(r["config"] for r in rs)
    lines = [f"| figure (Verilated card, the design's own counters) | {head} |",
             "|---|" + "---|" * len(rs),
             "| HBM utilization, GPT-2-small's matrices (768x768 ... 3072x768) | "
             + " | ".join(_n(r["hbm_utilization_matvec"], 3) for r in rs) + " |",
             f"| HBM utilization, one decoder layer at the config's largest width, decode, "
             f"{rs[0]['layer']['kv_positions']} cached positions | "
             + " | ".join(f"{_n(r['hbm_utilization_layer'], 3)} (d_model {r['layer']['d_model']})"
                          for r in rs) + " |",
             "| decode cycles per layer | " + " | ".join(_n(r["decode_cycles_per_layer"]) for r in rs)
             + " |"]
    return "\n".join(lines)


def fig_run():
    r = _bench("run-tiny")
    runs = r["runs"]
    head = " | ".join(f"{x['cards']} card{'s' if x['cards'] > 1 else ''}" for x in runs)
    rows = [("prefill cycles per prompt token", "prefill_cycles_per_token", 0),
            ("decode cycles per token", "decode_cycles_per_token", 0),
            (f"decode ms per token at {runs[0]['clock_mhz']:g} MHz", "decode_ms_per_token_at_clock", 3),
            ("HBM utilization over whole decode tokens (every card's HBM)", "hbm_utilization_decode", 2)]
    lines = [f"| {r['model'].replace('demo', 'demo model', 1)}, Verilated {r['config']} appliance, "
             f"{runs[0]['prompt_tokens']} prompt tokens, {runs[0]['decode_tokens']} decode steps | "
             f"{head} |", "|---|" + "---|" * len(runs)]
    for label, key, d in rows:
        lines.append(f"| {label} | " + " | ".join(_n(x[key], d) for x in runs) + " |")
    return "\n".join(lines)


def fig_collectives():
    r = _bench("collective-tiny")
    runs = r["runs"]

    def span(op, size):
        v = [x["busbw_fraction_of_link_peak"] for x in runs if x["op"] == op and x["size"] == size]
        return f"{min(v):.2f}-{max(v):.2f}" if v else "-"

    ops = ("allreduce", "allgather", "reducescatter")
    big = sorted(set.intersection(*({x["size"] for x in runs if x["op"] == op} for op in ops)))
    cards = sorted({x["cards"] for x in runs})
    lines = [f"| busbw / link peak, {', '.join(map(str, cards))} cards, uni- and bidirectional | "
             + " | ".join(_size(s) for s in big) + " |", "|---|" + "---|" * len(big)]
    for op in ops:
        lines.append(f"| {op} | " + " | ".join(span(op, s) for s in big) + " |")
    lines += ["", "| small all-reduce | cycles | floor (hops x link latency) |", "|---|---|---|"]
    for x in r["small_message"]:
        lines.append(f"| {x['bytes']} B, {x['cards']} cards, {'bi' if x['bidirectional'] else 'uni'}"
                     f"directional | {_n(x['cycles'])} | {_n(x['floor_cycles'])} |")
    if r.get("card"):
        lines += ["", "| all-reduce through the card kernel, HBM to HBM | cycles | busbw / link peak |",
                  "|---|---|---|"]
        for x in r["card"]:
            if x["from"] == "hbm" and x["size"] >= 1 << 20:
                lines.append(f"| {_size(x['size'])}, {x['cards']} Verilated {r['config']} cards | "
                             f"{_n(x['cycles'])} | {x['busbw_fraction_of_link_peak']:.2f} |")
    return "\n".join(lines)


def _size(b):
    for unit, k in (("MiB", 20), ("KiB", 10)):
        if b >= 1 << k:
            return f"{b >> k} {unit}"
    return f"{b} B"


PERF_ROWS = (("gpt2-medium", 4), ("gpt2-large", 4), ("gpt2-xl", 1), ("gpt2-xl", 2), ("gpt2-xl", 4))
PERF_NAMES = {"gpt2-medium": "GPT-2 345M", "gpt2-large": "GPT-2 774M", "gpt2-xl": "GPT-2 1.5B"}
PERF_IN_OUT, PERF_MHZ = "64:64", 200


def fig_perf():
    r = _bench("perf-u280x4")
    lines = ["| model | cards | in:out tokens | decode ms/token | prefill ms per input token | HBM "
             "roofline fraction | DFX (paper) decode | vs DFX |", "|---|---|---|---|---|---|---|---|"]
    for model, cards in PERF_ROWS:
        row = [x for x in r["rows"] if x["model"] == model and x["cards"] == cards and x["fits"]
               and x["clock_mhz"] == PERF_MHZ and x["in_out"] == PERF_IN_OUT]
        if not row:
            raise ValueError(f"perf-u280x4.json: no {model} row on {cards} cards at {PERF_MHZ} MHz, "
                             f"{PERF_IN_OUT}")
        x = row[0]
        dfx = r["dfx"].get(model, {}).get("decode_ms_per_token") if cards == 4 else None
        lines.append(f"| {PERF_NAMES[model]} | {cards} | {x['in_out']} | {x['decode_ms_per_token']:.2f} | "
                     f"{x['prefill_ms_per_token']:.2f} | {x['hbm_roofline_fraction']:.2f} | "
                     + (f"{dfx} ms/token | {dfx / x['decode_ms_per_token']:.2f}x |" if dfx else " | |"))
    cal = json.loads((ROOT / "docs" / "perf-calibration.json").read_text())
    lines += ["", f"{r['config']} at {PERF_MHZ} MHz; in:out {PERF_IN_OUT} is {PERF_IN_OUT.split(':')[0]} "
              f"prompt tokens then {PERF_IN_OUT.split(':')[1]} generated ones, decode figures averaged "
              f"over the generated tokens. The model is within {cal['calibration_error']:.1%} of the "
              f"Verilated card's cycle counts on {len(cal['steps'])} decode and prefill steps (tiny "
              f"and medium, one card; tiny appliances of 2 and 4 cards), within "
              f"{cal['collective_error']:.1%} of the collective engine's on "
              f"{len(cal['collectives'])} decode-sized all-reduces and all-gathers"
              + (f", and within {cal['card_collective_error']:.1%} on {len(cal['card_collectives'])} "
                 f"COLLs through the card's collective unit" if cal.get("card_collectives") else "")
              + "."]
    return "\n".join(lines)


def fig_resources():
    r = _bench("synth-card-u280x4")
    t = r["total"]
    cells = {"LUT": t["LUT"] + t["LUTMEM"], "FF": t["FF"], "DSP": t["DSP"], "BRAM36": t["BRAM36"],
             "URAM": t["URAM"]}
    lines = [f"| {r['config']} card | " + " | ".join(cells) + " |", "|---|" + "---|" * len(cells),
             "| every module synthesized, summed | " + " | ".join(_n(v) for v in cells.values()) + " |",
             "| share of the U280 | " + " | ".join(f"{r['u280_share'][k]:.0%}" for k in cells) + " |"]
    big = max(r["modules"], key=lambda m: m["total"]["LUT"])
    shape = (f" Counted from their shapes (Yosys maps them to flip-flops): "
             f"{', '.join(m['path'] for m in r['from_shape'])}." if r["from_shape"] else "")
    lines += ["", f"`lut_fraction` {r['lut_fraction']:.4f}, `dsp_fraction` {r['dsp_fraction']:.4f}: the "
              f"whole card's LUTs (logic, {_n(t['LUT'])}, and as shift registers or distributed RAM, "
              f"{_n(t['LUTMEM'])}) / {_n(r['u280']['LUT'])} and DSPs / {_n(r['u280']['DSP'])}, the "
              f"platform excluded (issue 20's floors: 0.45 and 0.55). The largest module: "
              f"`{big['name']}` ({big['class']}), {_n(big['total']['LUT'] + big['total']['LUTMEM'])} "
              f"LUTs; per module in docs/resources.md.{shape}"]
    return "\n".join(lines)


def fig_arith():
    from .synth import DFX_UNITS
    r = _bench("synth-arith")
    lines = ["| arithmetic unit (one instance) | latency, cycles | LUT | FF | DSP48E2 |",
             "|---|---|---|---|---|"]
    for name in ("fp32_add", "bfp_dot_64", "dot_lane_64", "block_align_64_x", "block_align_64_w",
                 "fp16_mul_fp32", "adder_tree_64"):
        u = r[name]
        lines.append(f"| `{name}` | {u['latency']} | {_n(u['LUT'])} | {_n(u['FF'])} | {u['DSP']} |")
    for name, u in DFX_UNITS.items():
        lines.append(f"| DFX's {name} (MICRO'22) | {u['latency']} | | | {u['DSP']} |")
    return "\n".join(lines)


def fig_calibration():
    """docs/perf-calibration.json as the table of docs/performance.md."""
    cal = json.loads((ROOT / "docs" / "perf-calibration.json").read_text())
    lines = ["| run | step | RTL cycles | model cycles | error |", "|---|---|---|---|---|"]
    for r in cal["steps"]:
        lines.append(f"| {r['case']} | {r['step']}, {r['tokens']} token(s) at position "
                     f"{r['position']} | {_n(r['rtl_cycles'])} | {_n(r['model_cycles'])} | "
                     f"{r['error']:+.1%} |")
    for r in cal["collectives"]:
        op = {"allreduce": "all-reduce", "allgather": "all-gather"}[r["op"]]
        lines.append(f"| {op}, {r['words']} fp32 words, {r['cards']} cards ({r['config']}, "
                     f"collective engine RTL on the fabric) | one COLL | {_n(r['rtl_cycles'])} | "
                     f"{_n(r['model_cycles'])} | {r['error']:+.1%} |")
    for r in cal.get("card_collectives", []):
        op = {"allreduce": "all-reduce", "allgather": "all-gather"}[r["op"]]
        lines.append(f"| {op}, {_n(r['words'])} fp32 words, {r['cards']} cards ({r['config']}, "
                     f"COLL through the Verilated card's collective unit) | one COLL | "
                     f"{_n(r['rtl_cycles'])} | {_n(r['model_cycles'])} | {r['error']:+.1%} |")
    lines += ["", f"Largest error over the card's steps: {cal['calibration_error']:.1%} (issue "
              f"20's bar: 3%); over the collective engine alone: {cal['collective_error']:.1%}"
              + (f"; over the COLLs through the card's collective unit: "
                 f"{cal['card_collective_error']:.1%}" if cal.get("card_collectives") else "") + "."]
    return "\n".join(lines)


def fig_per_mac():
    """LUTs and DSPs per MAC of a 16-lane x 64-wide matrix unit (u280x4's), the arithmetic
    before matrix unit v2 against v2's (hw/arith/dot.py), from the units' own synthesis:
    a lane's products, tree and rounding per MAC, plus the weights' alignment shared by the R
    tokens that meet a tile and the activations' shared by the 16 lanes."""
    r = _bench("synth-arith")
    L, W = 16, 64
    old = r["fp16_mul_fp32"]["LUT"] + r[f"adder_tree_{W}"]["LUT"] / W
    lane, ax, aw = r[f"dot_lane_{W}"], r[f"block_align_{W}_x"], r[f"block_align_{W}_w"]
    own = lane["LUT"] / W
    lines = ["| MAC of a 16 x 64 matrix unit | LUT per MAC | DSP48E2 per MAC | of which |",
             "|---|---|---|---|",
             f"| before v2: fp16 x fp16 -> fp32 multiplier, fp32 adder tree | {old:.0f} | "
             f"{r['fp16_mul_fp32']['DSP']} | multiplier {r['fp16_mul_fp32']['LUT']}, tree "
             f"{r[f'adder_tree_{W}']['LUT'] / W:.0f} |"]
    from .config import load_config
    core = load_config(ROOT / "configs" / "u280x4.yaml").core
    for R in (1, 2, 4):
        # per MAC: a lane's own; the weight row's alignment shared by R tokens; the activations'
        # (one per token) shared by the L lanes
        tot = own + aw["LUT"] / W / R + ax["LUT"] / W / L
        which = " (u280x4's)" if R == core.reuse and core.weight_dtype == "fp16" else ""
        lines.append(f"| v2 block floating point, R = {R}{which} | {tot:.0f} | {lane['DSP'] // W} | "
                     f"lane {own:.0f}, weight alignment {aw['LUT'] / W / R:.0f}, activation "
                     f"alignment {ax['LUT'] / W / L:.1f} |")
    if core.weight_dtype == "int16":
        # the card's whole array (its own logic too: the int16 rows' choice, the cache rows'
        # phases), from the card's synthesis
        node = {"children": _bench("synth-card-u280x4")["modules"]}
        for name in ("mpu", "mac", "dot"):
            node = next(c for c in node["children"] if c["name"] == name)
        dot = node["total"]
        macs = L * W * core.reuse
        lines.append(f"| v2 int16 weights, R = {core.reuse}, {L // core.cache_phases} cache-row "
                     f"alignments (u280x4's, the card's whole array) | "
                     f"{(dot['LUT'] + dot['LUTMEM']) / macs:.0f} | {dot['DSP'] / macs:.0f} | "
                     f"lane {own:.0f}, cache-row alignment "
                     f"{aw['LUT'] * L / core.cache_phases / macs:.1f}, activation alignment "
                     f"{ax['LUT'] / W / L:.1f}, the rest the array's own logic and delay lines |")
    return "\n".join(lines)


def synth_full(name):
    from .synth import card_table
    return card_table(_bench(f"synth-card-{name}")).rstrip("\n")


def perf_full():
    from sim.bench import perf_table
    return perf_table(_bench("perf-u280x4"))


def perf_what_if():
    from sim.bench import what_if_table
    return what_if_table(_bench("perf-u280x4"))


# Blocks of figures, by name: README's summaries and docs/performance.md's full tables.
FIGURES = {"core": fig_core, "run": fig_run, "collectives": fig_collectives, "perf": fig_perf,
           "resources": fig_resources, "arith": fig_arith, "per-mac": fig_per_mac,
           "calibration": fig_calibration,
           "synth-u280x4": lambda: synth_full("u280x4"), "synth-tiny": lambda: synth_full("tiny"),
           "synth-u280x4-int8": lambda: synth_full("u280x4-int8"),
           "perf-full": perf_full, "perf-what-if": perf_what_if}
_BLOCK = re.compile(r"(<!-- begin generated: ([\w-]+) -->\n)(.*?)(<!-- end generated: \2 -->)", re.S)


def with_figures(path):
    """The Markdown file ``path`` with every figure block rewritten from the bench's JSON."""
    text = (ROOT / path).read_text()

    def fill(m):
        if m.group(2) not in FIGURES:
            raise ValueError(f"{path}: unknown generated block {m.group(2)!r}; known: {', '.join(FIGURES)}")
        return m.group(1) + FIGURES[m.group(2)]() + "\n" + m.group(4)
    return _BLOCK.sub(fill, text)


GENERATED = {"docs/configs.md": configs_md, "docs/isa.md": isa_md,
             **{p: (lambda p=p: with_figures(p)) for p in ("README.md", "docs/performance.md",
                                                            "docs/resources.md")}}


def stale():
    """Paths of generated docs whose content differs from what the code generates now."""
    return [p for p, fn in GENERATED.items()
            if not (ROOT / p).exists() or (ROOT / p).read_text() != fn()]


def main():
    for p, fn in GENERATED.items():
        text = fn()
        tmp = ROOT / (p + ".tmp")
        tmp.write_text(text)
        tmp.replace(ROOT / p)
        print(f"wrote {p}")


if __name__ == "__main__":
    sys.exit(main())
