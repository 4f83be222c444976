"""Amaranth component -> Verilog, with flat, Vitis-style port names.

Turning a whole card into RTLIL is Amaranth's slow part (about 70 s for the tiny card; Yosys
then writes the Verilog in a few seconds), and one test run needs the same card's netlist
several times (emitted, linted, Verilated, packaged for Vitis). A caller that can name what
it built passes ``cache_key``: the RTLIL is then kept in ``build/rtlil/``, keyed by that
name, the module name, a hash of every source file of ``hw/`` and ``gen/`` and the versions of
Amaranth and numpy, so any edit to the hardware or the generator makes a new entry. On a hit the component
is never elaborated: the files that build tops for this (gen/tops.py, gen/package.py,
sim/system.py, sim/fabric.py) turn Amaranth's UnusedElaboratable warning off on their first line.
"""

import hashlib
import os
import re
import tempfile
from pathlib import Path

import amaranth
from amaranth._toolchain.yosys import find_yosys
from amaranth.back import rtlil
from amaranth.hdl import Const, Elaboratable, Signal, Value, ValueCastable
from amaranth.hdl._ir import PortDirection
from amaranth.lib import wiring

__all__ = ["PortDirection", "flat_ports", "to_verilog", "drop_zero_meminit"]

ROOT = Path(__file__).resolve().parent.parent
RTLIL_CACHE = ROOT / "build" / "rtlil"
RTLIL_CACHE_ENTRIES = 16          # the oldest entries beyond this many are removed


def flat_ports(component, sep="_"):
    """Ports of a component as ``{name: (signal, direction)}``, nested names joined by ``sep``.

    ``m_axi_hbm0`` with member ``araddr`` becomes ``m_axi_hbm0_araddr`` (Amaranth's default
    joins with ``__``, which Vivado does not recognise as an AXI interface).
    """
    ports = {}
    for path, member, value in component.signature.flatten(component):
        if isinstance(value, ValueCastable):
            value = value.as_value()
        if not isinstance(value, Value) or isinstance(value, Const):
            continue   # a constant member (e.g. an always-ready stream's ready): not a port
        if member.flow == wiring.In:
            direction = PortDirection.Input
        else:
            direction = PortDirection.Output
        name = sep.join(str(p) for p in path)
        if name in ports:
            raise ValueError(f"port name {name!r} is produced twice when flattening with {sep!r}")
        if isinstance(value, Signal) and value.name != name:
            # Name the signal after its port, so that Yosys does not keep the old name as a
            # second, unused wire beside the port.
            value.name = name
        ports[name] = (value, direction)
    return ports


def _sources_digest():
    import numpy  # hw/arith/tables.py computes the ROMs with it
    h = hashlib.sha256(f"{amaranth.__version__}|{numpy.__version__}".encode())
    for f in sorted([*(ROOT / "hw").rglob("*.py"), *(ROOT / "gen").rglob("*.py")]):
        h.update(str(f.relative_to(ROOT)).encode())
        h.update(f.read_bytes())
    return h.hexdigest()


def _count_as_elaborated(component):
    """A cached netlist stands for the component's elaboration: the elaboratables it holds
    (built in constructors) count as used, or Amaranth warns of each as it is collected."""
    stack, seen = [component], set()
    while stack:
        o = stack.pop()
        if id(o) in seen:
            continue
        seen.add(id(o))
        if isinstance(o, Elaboratable):
            o._MustUse__used = True
            stack.extend(getattr(o, "__dict__", {}).values())
        elif isinstance(o, (list, tuple)):
            stack.extend(o)
        elif isinstance(o, dict):
            stack.extend(o.values())


def _rtlil(component, name, ports, cache_key):
    if cache_key is None:
        return drop_zero_meminit(rtlil.convert(component, name=name, ports=ports, emit_src=False))
    key = hashlib.sha256(f"{_sources_digest()}|{name}|{cache_key}".encode()).hexdigest()[:24]
    path = RTLIL_CACHE / f"{name}-{key}.il"
    if path.exists():
        return _cached(component, path)
    RTLIL_CACHE.mkdir(parents=True, exist_ok=True)
    # A process (make test runs one per core) that wants a netlist another one is elaborating
    # waits for it instead of elaborating it a second time.
    from sim.toolchain import build_lock
    with build_lock(path):
        if path.exists():
            return _cached(component, path)
        text = drop_zero_meminit(rtlil.convert(component, name=name, ports=ports, emit_src=False))
        # Written whole, then renamed: a concurrent reader sees the old state or the new file.
        with tempfile.NamedTemporaryFile("w", dir=RTLIL_CACHE, suffix=".tmp", delete=False) as f:
            f.write(text)
        os.replace(f.name, path)
    entries = sorted(RTLIL_CACHE.glob("*.il"), key=lambda p: p.stat().st_mtime, reverse=True)
    for old in entries[RTLIL_CACHE_ENTRIES:]:
        old.unlink(missing_ok=True)
        Path(f"{old}.lock").unlink(missing_ok=True)
    return text


def _cached(component, path):
    os.utime(path)
    _count_as_elaborated(component)
    return path.read_text()


# Amaranth gives every memory an initial value, all zeros where the design gave none
# (``init=[]``): a $meminit_v2 cell that Yosys writes as an ``initial`` block. A block RAM
# may take one, an UltraRAM cannot (it has no INIT): the all-zero ones are dropped, so no
# memory of the card has initial contents and none may rely on them (each starts from its
# writes, as on the board). Memories with real contents (the arithmetic tables) keep theirs.
_ZERO_MEMINIT = re.compile(r"  cell \$meminit_v2 \S+\n(?:    (?!connect \\DATA).*\n)*"
                           r"    connect \\DATA \d+'0+\n(?:    .*\n)*  end\n")


def drop_zero_meminit(text):
    """RTLIL ``text`` without its all-zero memory initializations."""
    return _ZERO_MEMINIT.sub("", text)


def to_verilog(component, name, *, extra_ports=None, purge=False, cache_key=None, module=None):
    """Verilog text of ``component`` as module ``name``.

    ``extra_ports`` adds ``{name: (signal, direction)}`` entries (e.g. a Vitis top's
    ``ap_clk``); the ``sync`` domain's clock and reset become ``clk`` and ``rst`` otherwise.

    ``purge=True`` also removes the wires Amaranth keeps only as debug names (every named
    signal and struct field gets one, most unused by the logic): the netlist is the same, and
    Verilator's unused-signal lint then speaks only of real dead logic. Used by ``lint``.

    ``cache_key`` (a string naming how ``component`` was built, extra ports included) keeps
    the RTLIL for the next call with the same key and sources (see the module's docstring).
    ``module`` renames the top module only (submodules keep ``name.`` as their prefix), so one
    cached netlist serves under two top names.
    """
    ports = flat_ports(component)
    if extra_ports:
        ports.update(extra_ports)
    text = _rtlil(component, name, ports, cache_key)
    if module is not None and module != name:
        # Amaranth's built-in Yosys has no `rename`; the top's name appears once, in its header.
        header = f"\nmodule \\{name}\n"
        assert text.count(header) == 1, name
        text = text.replace(header, f"\nmodule \\{module}\n")
    yosys = find_yosys(lambda ver: ver >= (0, 40))
    # Amaranth's own script (amaranth.back.verilog), or for purge=True a full `proc`:
    # opt_clean skips modules that still hold processes.
    script = [f"read_rtlil <<rtlil\n{text}\nrtlil", "proc" if purge else "proc -nomux -norom",
              "memory_collect"]
    if purge:
        script.append("opt_clean -purge")
    script.append("write_verilog -norename")
    return yosys.run(["-q", "-"], "\n".join(script), ignore_warnings=True)
