"""Link-layer checks the mutation score asked for (sim/mutate.py ``link_port``; issue 21 item 4).

The link port's mutants that survived tests/test_collective_node.py and were not proved
equivalent showed gaps, each closed here and run by ``python -m sim.mutate link_port`` beside
that module. On the same N-card fabric (sim/fabric.py, Verilated collective nodes):

- control traffic was never counted: a receiver that wants to acknowledge all the time sends
  an ACK frame every few cycles and every collective still comes out right;
- sequence numbers, acknowledgements and credits stayed below 2^8 (at most a couple of hundred
  frames a link), so a wrong high bit of any of them went unseen, and 16-bit wrap-around was
  never run; nor was a go-back with high sequence numbers (a sender that goes back to a wrong
  base once bit 13 is set);
- acknowledgements that arrive while the sender resends after a timeout were never run: a
  sender that refills the slots of frames it has still to resend (the LinkTx slot-reuse bug
  the formal proof found, undone) passed every collective, the CRC catching its mixed frames.
  The link model recomputes each frame's CRC as sent; those counts were never looked at.

On one port driven directly by a cocotb test (sim/tb/tb_link_port.py, sim/link_dut.py), what
a LinkPort never sends and so the fabric cannot put on the wire: a control frame's CRC over
the bits above its trailer (three receiving-CRC mutants ignored one of those bits), random
payload on idle cycles (a receiver that updated its drop flag from them), an ACK of frames
never sent (a sender that took it); and, what the fabric never checks: the credit the
receive side advertises while its user stalls (its buffer of R frames plus exactly the six
beats its output stage reads ahead: a receiver that read seven ahead), every frame taken or
consumed acknowledged within a bound with no resend, one NAK for every bad frame, the
link reported dead after exactly ``retries`` timeouts in a row, every frame on the wire with
the fields its kind does not use zero (a sender that set a bit of a data frame's credit field),
and a go-back behind exactly the six beats the send stage reads ahead of a stalled wire (a
sender that read eight ahead).

And the relational proof (sim.mutate.prove_step_related) that shows six other survivors
equivalent, on a small unit against mutants written by hand.
"""

import ctypes
import dataclasses

import pytest

from gen.config import load_config
from sim import fabric

CFG = fabric.ROOT / "configs" / "tiny.yaml"


@pytest.fixture(scope="module")
def lib():
    cfg = load_config(CFG)
    return fabric.build_fabric(fabric.node_params(cfg))


@pytest.fixture
def wire(monkeypatch):
    """Every node's counters (sim.fabric.Fabric.stats: wire beats each way, retransmissions)
    of the runs that follow, taken as each run's fabric is closed."""
    runs = []
    close = fabric.Fabric.close

    def keep(self):
        if getattr(self, "_f", None):
            runs.append([self.stats(i) for i in range(self.cards)])
        close(self)

    monkeypatch.setattr(fabric.Fabric, "close", keep)
    return runs


@pytest.mark.rtl
@pytest.mark.parametrize("cards", [2, 3])
def test_control_traffic_is_bounded(lib, wire, cards):
    """A clean one-way all-gather: the data direction carries each frame once (its payload
    beats and a trailer), and the other direction only acknowledgements, one-beat control
    frames, at most two per data frame (the receiver asks for one when it accepts a frame and
    when it hands it on; asks still pending merge)."""
    cfg = load_config(CFG)
    p = fabric.node_params(cfg)
    n = 5000
    fig, *_ = fabric.run_collective(cfg, "allgather", n, cards=cards, seed=7, lib=lib)
    assert fig["ok"] and fig["retransmissions"] == 0
    W = p.data_bits // 32
    nb = -(-n // W)
    frames = (cards - 1) * -(-nb // p.frame_beats)      # each link carries N - 1 segments
    payload = (cards - 1) * nb
    (stats,) = wire
    for i, s in enumerate(stats):
        assert s["tx_beats_r"] == payload + frames, (i, s)
        assert 0 < s["tx_beats_l"] <= 2 * frames, (i, s)
        assert s["rx_beats_l"] == payload + frames, (i, s)


@pytest.mark.rtl
def test_sequence_numbers_wrap(lib, wire, monkeypatch):
    """Over 2^16 frames through each link in one all-reduce (2 cards, one beat a frame:
    the engine's chunk is 2^chunk_log2 beats, here 0, and a link of 2 cycles): sequence
    numbers, acknowledgements and credits run through every bit and wrap around; still
    bit-exact, every frame sent once."""
    cfg = load_config(CFG)
    p = fabric.node_params(cfg)
    # a short link, so that the window of frames in flight does not bound the rate (seconds,
    # not half a minute); run_collective chunks by the node's frame, which stays 64 beats in
    # the RTL
    cfg = dataclasses.replace(cfg, link=dataclasses.replace(cfg.link, latency_cycles=2))
    monkeypatch.setattr(fabric, "node_params", lambda c: dataclasses.replace(p, frame_beats=1))
    W = p.data_bits // 32
    nb = 70_000                                           # beats: 35,000 chunks a segment
    fig, *_ = fabric.run_collective(cfg, "allreduce", nb * W, cards=2, seed=11, lib=lib)
    assert fig["ok"] and fig["retransmissions"] == 0 and fig["crc_errors"] == 0
    (stats,) = wire
    for s in stats:
        assert s["tx_beats_r"] == 2 * nb > 2 * (1 << 16)   # each frame: one payload beat, a trailer
        assert 0 < s["tx_beats_l"] <= 2 * nb


class _Stepped:
    """A fabric library whose ``fab_run`` runs ``step`` cycles at a time and calls
    ``hook(fab, cycles run)`` between steps (link faults at chosen times); the rest passes
    through."""

    def __init__(self, lib, fab, hook, step):
        self._lib, self._fab, self._hook, self._step = lib, fab, hook, step

    def __getattr__(self, name):
        return getattr(self._lib, name)

    def fab_run(self, f, max_cycles):
        done = 0
        while done < max_cycles:
            n = min(self._step, max_cycles - done)
            r = self._lib.fab_run(f, n)
            if r == -2:
                return -2
            if r >= 0:
                return done + r
            done += n
            self._hook(self._fab, done)
        return -1


def _bad_frames(fab):
    """Frames put on any wire of ``fab`` with a CRC field that does not match their content
    (the link model recomputes every frame's CRC as sent: a sender's fault, not the
    channel's)."""
    L = fab._lib
    L.fab_bad_frames.restype = ctypes.c_uint64
    L.fab_bad_frames.argtypes = [ctypes.c_void_p, ctypes.c_int, ctypes.c_int]
    return sum(int(L.fab_bad_frames(fab._f, i, d)) for i in range(fab.cards) for d in (0, 1))


@pytest.fixture
def timed_faults(monkeypatch):
    """``install(hook, step)``: every fabric made after it runs through :class:`_Stepped`;
    returns a list that gets each fabric's bad frames (:func:`_bad_frames`) as it is closed."""
    bad = []

    def install(hook, step=8):
        init, close = fabric.Fabric.__init__, fabric.Fabric.close

        def patched_init(self, *a, **kw):
            init(self, *a, **kw)
            self._lib = _Stepped(self._lib, self, hook, step)

        def patched_close(self):
            if getattr(self, "_f", None):
                bad.append(_bad_frames(self))
            close(self)

        monkeypatch.setattr(fabric.Fabric, "__init__", patched_init)
        monkeypatch.setattr(fabric.Fabric, "close", patched_close)
        return bad
    return install


@pytest.mark.rtl
def test_late_acks_during_a_resend(lib, timed_faults):
    """The acknowledgements of card 0's frames are lost until card 0 times out and resends
    its window; they come back while it resends (card 1 had every frame: it acknowledges the
    duplicates). Each acknowledgement then moves the sender's base past the frame it is
    resending. The frames it still has to resend must stay whole while new frames are
    filled in behind them: every frame on the wire carries the CRC of its own content, no
    CRC error anywhere (the channel flips no bit), and the all-gather is exact. The link
    is a quarter of the line rate, so the fill runs ahead of the resend."""
    cfg = load_config(CFG)
    cfg = dataclasses.replace(cfg, link=dataclasses.replace(cfg.link,
                                                            gbits_per_s=cfg.link.gbits_per_s / 4))
    state = {"phase": 0}

    def hook(fab, cycles):
        if state["phase"] == 0 and cycles >= 3000:      # well into the stream
            fab._lib.fab_set_link(fab._f, 0, 1, 0.0, 1.0)   # 1.L -> 0.R: card 0's acks lost
            state["phase"] = 1
        elif state["phase"] == 1 and fab.stats(0)["retransmissions"] > 0:
            fab._lib.fab_set_link(fab._f, 0, 1, 0.0, 0.0)   # back while card 0 resends
            state["phase"] = 2

    bad = timed_faults(hook)
    fig, *_ = fabric.run_collective(cfg, "allgather", 40_000, cards=2, seed=5, lib=lib)
    assert state["phase"] == 2, "card 0 never resent: the scenario did not happen"
    assert bad == [0], f"{bad} frames sent with a CRC not their own"
    assert fig["crc_errors"] == 0 and fig["retransmissions"] > 0, fig
    assert fig["ok"]


@pytest.mark.rtl
def test_go_back_at_every_sequence_number_range(lib, wire, timed_faults, monkeypatch):
    """test_sequence_numbers_wrap's run (over 2^16 one-beat frames a link, so sequence
    numbers, acknowledgements and credits run through every bit and wrap), with card 0's
    data direction cut after every 4096 frames it sends, until it has sent one more: each cut
    loses a frame, the receiver NAKs, and the sender goes back to its base, once with each of
    the high bits of the sequence numbers set and across the wrap. Still bit-exact, no CRC
    error (the channel drops whole frames, it flips no bit), and each go-back resends at most
    a window of frames."""
    cfg = load_config(CFG)
    p = fabric.node_params(cfg)
    cfg = dataclasses.replace(cfg, link=dataclasses.replace(cfg.link, latency_cycles=2))
    monkeypatch.setattr(fabric, "node_params", lambda c: dataclasses.replace(p, frame_beats=1))
    W = p.data_bits // 32
    nb = 70_000
    every = 4096                              # frames between cuts
    state = {"cuts": 0, "until": None}

    def hook(fab, cycles):
        sent = fab.stats(0)["tx_beats_r"]        # one payload beat and a trailer a frame
        if state["until"] is not None and sent >= state["until"]:
            fab._lib.fab_set_link(fab._f, 0, 0, 0.0, 0.0)
            state["until"] = None
        if state["until"] is None and sent >= 2 * every * (state["cuts"] + 1):
            # 0.R -> 1.L drops every frame until card 0 has sent one more
            fab._lib.fab_set_link(fab._f, 0, 0, 0.0, 1.0)
            state["until"] = sent + 2
            state["cuts"] += 1

    bad = timed_faults(hook, step=2)
    # the clean run takes about 5.4 cycles a frame; each cut may cost up to a timeout
    budget = 8 * nb + (nb // every + 1) * p.timeout
    fig, *_ = fabric.run_collective(cfg, "allreduce", nb * W, cards=2, seed=11, lib=lib,
                                    max_cycles=budget)
    assert state["cuts"] >= nb // every, state
    assert bad == [0] and fig["crc_errors"] == 0, (bad, fig)
    assert fig["ok"]
    assert 0 < fig["retransmissions"] <= p.rx_frames * state["cuts"], (fig, state)


@pytest.mark.rtl
def test_port_driven_directly(tmp_path, seed):
    """sim/tb/tb_link_port.py's cocotb tests, on one port with the test as its user and its
    peer: what a LinkPort never sends, the fabric cannot put on the wire (a control frame's
    CRC over the bits above its trailer, random payload on idle cycles, an ACK of frames
    never sent), the receive side's credit, beat-exact, under a user that stalls and
    resumes, its ACKs and NAKs never lost, the sender's retry count, the unused fields of
    every frame sent, and the sender's go-back behind its read-ahead on a stalled wire."""
    from sim.link_dut import run_port_tests
    assert run_port_tests(tmp_path, seed=seed) == 8


def test_relational_proof(tmp_path):
    """sim.mutate.prove_step_related, the proof that leaves six of the link port's survivors
    out of its count (Yosys only, a few seconds), on a one-stage pipeline (``o_data`` = the
    data register while the valid register is set, OR a register that only ever loads 0)
    against mutants written by hand: each is proved with the relation that holds for it,
    and not with none, nor with a relation that is false (a bit that is read taken as free,
    an invariant the mutant breaks, no contract where one is needed)."""
    import re

    from amaranth.hdl import Module, Mux, Signal
    from amaranth.lib import wiring
    from amaranth.lib.wiring import In, Out

    from gen.verilog import to_verilog
    from sim.mutate import Mutants, Relation, _ports_of, prove_step_equivalent, prove_step_related, run_yosys

    class Stage(wiring.Component):
        i_valid: In(1)
        i_data: In(4)
        o_valid: Out(1)
        o_data: Out(4)

        def elaborate(self, platform):
            m = Module()
            data = Signal(4)
            zero = Signal(4)
            m.d.sync += self.o_valid.eq(self.i_valid)
            with m.If(self.i_valid):
                m.d.sync += [data.eq(self.i_data), zero.eq(0)]
            m.d.comb += self.o_data.eq(Mux(self.o_valid, data, 0) | zero)
            return m

    (tmp_path / "unit.v").write_text(to_verilog(Stage(), "stage"))
    run_yosys("read_verilog unit.v\nprep -top stage\nflatten\nopt_clean\nwrite_rtlil design.il\n",
              tmp_path, "prep.log")
    design = (tmp_path / "design.il").read_text()
    cells = re.findall(r"^  cell \$mux (\S+)\n(.*?)^  end$", design, re.M | re.S)

    def hold(reg):         # the multiplexer `i_valid ? <load> : <reg>` of a register
        (c,) = [c for c, body in cells if re.search(rf"connect \\A \\{reg}$", body, re.M)
                and re.search(r"connect \\S \\i_valid$", body, re.M)]
        return c

    muts = [f"-mode const0 -module stage -cell {hold('data')} -port A -portbit 0",   # held: no reader
            f"-mode const0 -module stage -cell {hold('zero')} -port A -portbit 1",   # 0 anyway
            f"-mode const1 -module stage -cell {hold('zero')} -port A -portbit 1",   # not 0: shows
            f"-mode const0 -module stage -cell {hold('data')} -port B -portbit 3"]   # loads bit 3 as 0
    script = ["read_rtlil design.il"] + [f"mutate -ctrl mutsel 3 {k} {m}" for k, m in enumerate(muts, 1)]
    script += ["opt_clean", "write_rtlil mutated.il", "write_verilog -noattr mutated.v"]
    run_yosys("\n".join(script) + "\n", tmp_path, "mutate.log")
    mutants = Mutants("stage", tmp_path, muts, 3, _ports_of((tmp_path / "mutated.v").read_text(), "stage"))
    assert [prove_step_equivalent(mutants, k) for k in range(5)] == [True, False, False, False, False]
    held = Relation("data is read only while o_valid is set", free=[("data", 0, 1, ("o_valid", 0))])
    always = Relation("data[0] read by nothing (false)", free=[("data", 0, 1, None)])
    zero = Relation("zero is 0", invariants=[("zero", 0, 4, "==", 0, None)])
    small = Relation("users send data below 8", contract="!(i_valid && i_data[3])")
    assert prove_step_related(mutants, 0, held) and prove_step_related(mutants, 0, zero)
    assert prove_step_related(mutants, 1, held) and not prove_step_related(mutants, 1, always)
    assert not prove_step_related(mutants, 1, zero)
    assert prove_step_related(mutants, 2, zero) and not prove_step_related(mutants, 2, held)
    assert not prove_step_related(mutants, 3, zero)
    assert prove_step_related(mutants, 4, small) and not prove_step_related(mutants, 4, held)
