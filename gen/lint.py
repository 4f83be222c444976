"""Verilator -Wall lint of a config's emitted tops.

Lints the purged netlist (see :func:`gen.verilog.to_verilog`) with the waivers of
``gen/lint.vlt``, which cover only what Amaranth's and Yosys's Verilog writers produce by
design. Anything else Verilator reports is returned, and ``gptfpga lint`` fails on it.
"""

import re
import subprocess
from pathlib import Path

from sim.toolchain import verilator_env, verilator_root

from .tops import TOPS, build_top, top_key
from .verilog import to_verilog

__all__ = ["lint", "LINT_VLT"]

LINT_VLT = Path(__file__).resolve().parent / "lint.vlt"
_WARN = re.compile(r"^%(Warning|Error)-?([A-Z0-9_]*): (.*)$")


def lint(cfg, outdir, *, tops=None, progress=None):
    """{top: [warning lines]} for each top of ``cfg``; an empty list means clean.

    ``progress`` (host.progress.Progress) is told each top and each stage: elaboration,
    conversion to Verilog (Yosys; the longest stage for a large card), Verilator's lint.
    """
    from host.files import atomic_write
    from host.progress import quiet
    progress = progress or quiet()
    outdir = Path(outdir)
    outdir.mkdir(parents=True, exist_ok=True)
    env = verilator_env()
    results = {}
    for name in (tops or TOPS):
        path = outdir / f"{name}.v"
        progress.step(f"{cfg.name}/{name}", "elaborating")
        top = build_top(name, cfg)
        progress.note("converting to Verilog (Yosys)")
        atomic_write(path, to_verilog(top, name, purge=True, cache_key=top_key(name, cfg)))
        progress.note("verilator --lint-only -Wall")
        proc = subprocess.run(
            [str(verilator_root() / "bin" / "verilator"), "--lint-only", "-Wall", "--top-module", name,
             str(LINT_VLT), str(path)],
            capture_output=True, text=True, env=env)
        warnings = [line for line in proc.stderr.splitlines()
                    if _WARN.match(line) and not line.startswith("%Error: Exiting")]
        if proc.returncode and not warnings:
            warnings = [f"verilator exited with {proc.returncode}: {proc.stderr.strip()[:500]}"]
        results[name] = warnings
    return results
