"""``gptfpga emit``: a config's tops as Verilog, the resolved config as JSON, and a report."""

import hashlib
from pathlib import Path

from .tops import TOPS, build_top, top_key
from .verilog import PortDirection, flat_ports, to_verilog

__all__ = ["emit", "port_table", "output_names"]


def port_table(component):
    """[(name, 'in'|'out', width)] of a component's flattened ports."""
    rows = []
    for name, (sig, direction) in flat_ports(component).items():
        rows.append((name, "in" if direction is PortDirection.Input else "out", len(sig)))
    return rows


def output_names(tops=None):
    """The file names :func:`emit` writes for ``tops`` (None: every top)."""
    return [f"{t}.v" for t in (TOPS if tops is None else tops)] + ["config.json", "report.md"]


def emit(cfg, outdir, *, tops=None, progress=None):
    """Write ``<top>.v`` for each top, ``config.json`` and ``report.md`` into ``outdir``.

    Returns ``{top: path of its Verilog}``. Files whose content is unchanged are not
    rewritten, so their timestamps (and any build keyed on them) stay put; the others are
    written whole or not at all (host.files.atomic_write). ``progress``
    (host.progress.Progress) is told each top.
    """
    from host.progress import quiet
    progress = progress or quiet()
    outdir = Path(outdir)
    outdir.mkdir(parents=True, exist_ok=True)
    names = list(TOPS) if tops is None else list(tops)
    written = {}
    sections = []
    for name in names:
        progress.step(name, "elaborating")
        component = build_top(name, cfg)
        progress.note("converting to Verilog")
        text = to_verilog(component, name, cache_key=top_key(name, cfg))
        path = outdir / f"{name}.v"
        _write_if_changed(path, text)
        written[name] = path
        rows = port_table(component)
        digest = hashlib.sha256(text.encode()).hexdigest()[:16]
        lines = [f"## {name}", "", f"`{path.name}`, {len(text.splitlines())} lines, sha256 {digest}",
                 "", "| port | dir | bits |", "|---|---|---|"]
        lines += [f"| {p} | {d} | {w} |" for p, d, w in rows]
        sections.append("\n".join(lines))
    _write_if_changed(outdir / "config.json", cfg.to_json() + "\n")
    derived = cfg.derived()
    head = [f"# {cfg.name}: emit report", "",
            f"{cfg.cards} card(s), {cfg.topology}, {cfg.clock_mhz:g} MHz; core {cfg.core.lanes} lanes "
            f"x {cfg.core.width} wide, {cfg.core.weight_dtype} weights; HBM {cfg.hbm.channels} x "
            f"{cfg.hbm.data_bits} bits; links {cfg.link.data_bits} bits at {cfg.link.gbits_per_s:g} Gb/s.",
            "", "| derived figure | value |", "|---|---|"]
    head += [f"| {k} | {v} |" for k, v in derived.items()]
    _write_if_changed(outdir / "report.md", "\n".join(head) + "\n\n" + "\n\n".join(sections) + "\n")
    return written


def _write_if_changed(path, text):
    from host.files import write_if_changed
    write_if_changed(path, text)
