"""Fault injection at the card (issue 21 item 3): the Verilated card's HBM, instruction-port
and link models answer with errors, stop answering, corrupt an instruction word or drop a
link for a while (sim.system.Fault, RtlAppliance.link_outage), and each fault must end with

- its status code and pc in the status register, by the rule docs/verification.md states
  ("Fault injection"): an error response names the instruction whose access it answered (the
  LOAD or WLOAD whose burst, the STORE whose write, the instruction whose fetch), the first in
  program order; TIMEOUT names the oldest instruction not completed when the watchdog fired;
  RING_ERROR the COLL; a corrupted word whatever the ISS says of the same word;
- a clean stop: the kernel idle (ap_idle) and no AXI transaction open in any port's model;
- the host's one-line error naming the card, through host.runtime.Cards (the layer a
  generation runs on) and the demo model's generation;
- a correct run on the same card after the next start (after a reset where the fault outlives
  the run: a port silent for good, a link given up), bit-identical to the ISS;

and nothing hangs: the watchdog (TIMEOUT, 2^20 cycles without progress), the collective
unit's timeout (RING_ERROR) and the host's wall-clock bound each end a run.

Burst numbers count a port's ARs (AWs) from when the fault is set; on tiny.yaml a LOAD or
WLOAD of up to 32 stripe rows from a row aligned to 32 is one burst on every channel, a
linear fp32 STORE one single-beat write per channel and stripe row, a fetch one burst per 16
instructions.
"""

import numpy as np
import pytest

from gen.config import load_config
from host.errors import CardError
from host.runtime import Cards
from host.stripes import read_stripes, write_stripes
from hw import regs
from hw.dma.reader import burst_block
from hw.isa import ERROR_CODES, FORMAT_BY_NAME, decode, encode
from sim.progs import Layout, ProgramGen, random_hbm, snapshot, write_image
from sim.ref.dma import split_bursts
from sim.ref.iss import IssDevice
from sim.ref.ring import IssRing

ROOT = __import__("pathlib").Path(__file__).resolve().parent.parent
E = ERROR_CODES
WATCHDOG = 1 << 20
ZERO_ROW = 4096          # rows nobody writes: LOADs from here clear the VSP

pytestmark = pytest.mark.rtl


@pytest.fixture(scope="module")
def cfg():
    return load_config(ROOT / "configs" / "tiny.yaml")


@pytest.fixture(scope="module")
def lib(cfg):
    from sim.system import build_card
    return build_card(cfg)[0]


def _card(cfg, lib, cards=1, **kw):
    from sim.system import RtlAppliance
    return RtlAppliance(cfg, cards, lib=lib, **kw)


class _Step:
    """A stand-in for a compiled model whose every step is ``prog``: host.runtime.Cards runs it
    as it runs a model's step (load, start, wait with the timeout, status), so the errors are
    the ones a generation raises."""
    T = 1

    def __init__(self, prog, prog_addr):
        self.prog, self.prog_addr = prog, prog_addr

    def step(self, tokens, pos0, stream=0):
        return self.prog


def _step(app, progs, lay, timeout_s=600.0):
    """Run one program per card of ``app`` through host.runtime.Cards; returns the CardError's
    message (None if the step succeeded)."""
    cms = [_Step(p, lay.prog_addr) for p in progs]
    cards = Cards(cms, app.devices, app if app.cards > 1 else None)
    try:
        cards.step([0], 0, timeout_s)
    except CardError as e:
        msg = str(e)
        assert "\n" not in msg, msg
        return msg
    return None


def _status(dev):
    return dev.read_reg(regs.COUNTERS["status"][0])


def _st(name, pc):
    return pc << 8 | E[name]


def _clean_stop(app, card=0, at_done=True):
    """No port's model had a transaction open when the card raised ap_done (``at_done``), none
    has one now, and the kernel reports ap_idle."""
    if at_done:
        assert app.open_at_done(card) == 0, f"{app.open_at_done(card)} transactions open at ap_done"
    assert app.open_transactions(card) == {}, app.open_transactions(card)
    assert app.devices[card].read_reg(regs.CTRL) & 0x4, "ap_idle low after the stop"


# -- where a burst comes from ------------------------------------------------------------------
def read_burst_pcs(cfg, prog):
    """The pc of each read burst a channel's reader issues for ``prog``, in order (every channel
    reads the same runs): LOAD and WLOAD runs cut by the reader's rule (sim/ref/dma.py)."""
    block = burst_block(cfg.hbm.max_burst_beats, cfg.hbm_beat_bytes)
    out = []
    for pc, w in enumerate(prog):
        d = decode(w)
        if d.op == "LOAD":
            rows = -(-d.n * (4 if d.f32 else 2) // cfg.stripe_bytes)
        elif d.op == "WLOAD":
            rows = d.tiles
        else:
            continue
        out += [pc] * len(split_bursts(d.row, rows, block))
    return out


def write_burst_pcs(cfg, prog):
    """The pc of each write a channel's store engine issues for ``prog``: linear fp32 STOREs of
    whole stripe rows only (one single-beat write per channel and row)."""
    per_row = cfg.stripe_bytes // 4
    out = []
    for pc, w in enumerate(prog):
        d = decode(w)
        if d.op != "STORE":
            continue
        assert d.f32 and d.off == 0 and d.rstride == 1 and 1 << d.lepg == per_row and d.n % per_row == 0
        out += [pc] * (d.n // per_row)
    return out


def _store(cfg, vsp, n, row):
    return encode("STORE", vsp=vsp, n=n, row=row, off=0, lepg=(cfg.stripe_bytes // 4).bit_length() - 1,
                  lgpr=0, gstride=0, rstride=1, f32=1)


# -- the correct run after the fault -----------------------------------------------------------
def _image(cfg, lay, devs, seed):
    """The random programs' HBM image into every device, their output rows cleared."""
    write_image(cfg, lay, random_hbm(cfg, np.random.default_rng(seed), lay), devs)


def rerun_matches_iss(cfg, app, seed, card=0):
    """The next start on card ``card`` of ``app``: a random program of every instruction kind
    against a new ISS on the same image (the VSP and XB the program may read cleared first:
    the card's are what the failed run left), status, counters, HBM outputs and the VSP dump
    bit for bit."""
    lay = Layout(cfg)
    dev, iss = app.devices[card], IssDevice(cfg)
    _image(cfg, lay, [dev, iss], seed)
    xw = cfg.core.xb_words
    prog = ([encode("LOAD", vsp=0, n=xw, row=ZERO_ROW, f32=1),
             encode("VEC", vop="CVT16", dst=0, src1=0, n=xw)]
            + ProgramGen(cfg, np.random.default_rng(seed), lay).program(30))
    ci, cr = (d.run(prog, lay.prog_addr, timeout_s=300) for d in (iss, dev))
    assert cr["status"] == ci["status"] == (len(prog) - 1) << 8, (cr["status"], ci["status"])
    for k in ("hbm_rd_bytes", "hbm_wr_bytes", "insns"):
        assert cr[k] == ci[k], (k, cr[k], ci[k])
    diff = np.flatnonzero(snapshot(dev, cfg, lay) != snapshot(iss, cfg, lay))
    assert diff.size == 0, f"{diff.size} bytes differ after the fault, first at {diff[:8]}"
    _clean_stop(app, card)


# -- error responses ---------------------------------------------------------------------------
def _data_program(cfg, lay):
    """LOADs (one burst each), a WLOAD and its MATVEC, vector work, STOREs of whole rows."""
    out = lay.out_rows[0]
    return [encode("LOAD", vsp=0, n=512, row=0),                  # pc 0: rows 0..7
            encode("LOAD", vsp=512, n=512, row=32, f32=1),        # pc 1: rows 32..47
            encode("WLOAD", row=64, tiles=4),                     # pc 2
            encode("MATVEC", rb=1, cb=4, group=1, tokens=1, dst=2048 // cfg.core.vector_lanes),
            encode("VEC", vop="ADD", dst=1024, src1=0, src2=512, n=512),
            _store(cfg, 1024, 64, out),                           # pc 5: 2 writes per channel
            _store(cfg, 0, 32, out + 8),                          # pc 6: 1 write
            _store(cfg, 2048, 96, out + 16),                      # pc 7: 3 writes
            encode("HALT")]


READ_CASES = [  # (channel, burst, response)
    (1, 2, "SLVERR"),           # the second LOAD
    (3, 1, "DECERR"),           # the first LOAD
    (0, 3, "SLVERR"),           # the WLOAD, whose tiles a MATVEC has already claimed
]


@pytest.mark.parametrize("channel, at, resp", READ_CASES)
def test_read_error(cfg, lib, channel, at, resp):
    """SLVERR or DECERR on one read burst of one channel: AXI_ERROR at the LOAD or WLOAD that
    burst belongs to; the beats still arrive (and are dropped into the VSP or the weight FIFO),
    everything issued finishes, then the card is idle and runs the next program correctly."""
    from sim.system import Fault
    lay = Layout(cfg)
    app = _card(cfg, lib)
    prog = _data_program(cfg, lay)
    pc = read_burst_pcs(cfg, prog)[at - 1]
    app.set_fault(Fault("read_error", port=channel, at=at, resp=resp))
    msg = _step(app, [prog], lay)
    assert msg == f"device: card 0: the step at position 0 stopped with status AXI_ERROR (pc {pc})"
    assert _status(app.devices[0]) == _st("AXI_ERROR", pc)
    assert app.port_state(0, channel)["errors_given"] == 1
    _clean_stop(app)
    rerun_matches_iss(cfg, app, seed=channel)


@pytest.mark.parametrize("channel, at, resp", [(2, 3, "SLVERR"), (0, 1, "DECERR"), (3, 6, "SLVERR")])
def test_write_error(cfg, lib, channel, at, resp):
    """An error response to one write of a STORE: AXI_ERROR at that STORE (its other writes
    are still answered before it completes)."""
    from sim.system import Fault
    lay = Layout(cfg)
    app = _card(cfg, lib)
    prog = _data_program(cfg, lay)
    pc = write_burst_pcs(cfg, prog)[at - 1]
    app.set_fault(Fault("write_error", port=channel, at=at, resp=resp))
    msg = _step(app, [prog], lay)
    assert msg == f"device: card 0: the step at position 0 stopped with status AXI_ERROR (pc {pc})"
    assert _status(app.devices[0]) == _st("AXI_ERROR", pc)
    _clean_stop(app)
    rerun_matches_iss(cfg, app, seed=10 + channel)


def test_error_response_is_reported_in_program_order(cfg, lib):
    """A LOAD's error response arrives (64 cycles of HBM latency) after the illegal opcode
    behind it has already stopped issue: the status becomes the LOAD's AXI_ERROR, the first
    error in program order, not the ILLEGAL_OPCODE found first."""
    from sim.system import Fault
    lay = Layout(cfg)
    app = _card(cfg, lib)
    prog = [encode("LOAD", vsp=0, n=64, row=0), 15, encode("HALT")]
    assert IssDevice(cfg).run(prog, lay.prog_addr)["status"] == _st("ILLEGAL_OPCODE", 1)
    app.set_fault(Fault("read_error", port=2, at=1))
    assert app.devices[0].run(prog, lay.prog_addr)["status"] == _st("AXI_ERROR", 0)
    _clean_stop(app)
    rerun_matches_iss(cfg, app, seed=3)


def test_instruction_fetch_error(cfg, lib):
    """An error response to the program's second fetch burst (pcs 16..31): the first 16
    instructions run, AXI_ERROR at pc 16 (every instruction of the burst carries the error;
    the first one reaching issue stops the run)."""
    from sim.system import Fault
    lay = Layout(cfg)
    app = _card(cfg, lib)
    prog = [encode("LOAD", vsp=64 * k, n=64, row=k) for k in range(20)] + [encode("HALT")]
    app.set_fault(Fault("read_error", port="insn", at=2, resp="DECERR"))
    msg = _step(app, [prog], lay)
    assert msg.endswith("stopped with status AXI_ERROR (pc 16)") and "card 0" in msg, msg
    assert app.devices[0].counters()["insns"] == 16
    _clean_stop(app)
    rerun_matches_iss(cfg, app, seed=4)


# -- a corrupted instruction word --------------------------------------------------------------
FLIPS = {  # name: (pc, bit of the 128-bit word), what the corrupted word is
    "opcode": (1, 3),               # LOAD (3) -> 11: no such opcode
    "vsp_field": (2, 4 + 15),       # LOAD.vsp + 32768: beyond the VSP
    # LOAD.row + 16: a valid LOAD of other data (silent)
    "row_field": (1, FORMAT_BY_NAME["LOAD"].offsets()["row"][0] + 4),
    "vop": (4, 4 + 4),              # VEC.vop ADD -> another operation or none
}


@pytest.mark.parametrize("case", list(FLIPS))
def test_corrupted_instruction_word(cfg, lib, case):
    """One bit of one instruction flips on its way from HBM (the fetch port's model XORs it
    into the beat): the card does what the ISS does with the corrupted program, status and
    every byte alike. A flip that leaves a valid instruction is silent (the ISA has no parity):
    only the ISS's outputs on the corrupted program reveal it."""
    from sim.system import Fault
    lay = Layout(cfg)
    pc, bit = FLIPS[case]
    prog = [encode("LOAD", vsp=0, n=512, row=0),
            encode("LOAD", vsp=512, n=512, row=16),
            encode("LOAD", vsp=1024, n=512, row=32),
            encode("VEC", vop="EXP", dst=2048, src1=0, n=512),
            encode("VEC", vop="ADD", dst=3072, src1=512, src2=1024, n=512),
            _store(cfg, 2048, 2048, lay.out_rows[0]),
            encode("HALT")]
    bad = list(prog)
    bad[pc] ^= 1 << bit
    app, iss = _card(cfg, lib), IssDevice(cfg)
    _image(cfg, lay, [app.devices[0], iss], 5)
    app.set_fault(Fault("flip", port="insn", addr=lay.prog_addr + 16 * pc, mask=1 << bit))
    want = iss.run(bad, lay.prog_addr)["status"]
    got = app.devices[0].run(prog, lay.prog_addr)["status"]
    assert got == want, (hex(got), hex(want))
    if case == "row_field":
        assert want == _st("OK", 6)
    else:
        assert want & 0xFF and want >> 8 == pc, hex(want)
    assert np.array_equal(snapshot(app.devices[0], cfg, lay), snapshot(iss, cfg, lay))
    assert app.port_state(0, "insn")["beats_flipped"] == 1
    _clean_stop(app)
    app.clear_faults()
    rerun_matches_iss(cfg, app, seed=6)


def test_corrupted_coll_word_on_one_card(cfg, lib):
    """A bit of card 1's COLL (on HBM) flips on its way from HBM: n = 8192 becomes 8193, so
    card 1's frames carry another tag than card 0 expects and the other way round. Both cards
    end with RING_ERROR at the COLL, as the ISS ring does on the corrupted programs; the COLL
    fails while its HBM reads are streaming, and the cards still stop with every access
    answered. The ring then needs a reset; after it the all-reduce is correct."""
    from sim.system import Fault
    lay = Layout(cfg)
    prog = _ring_program(cfg, lay, hbm=True)
    pc = next(pc for pc, w in enumerate(prog) if decode(w).op == "COLL")
    bit = FORMAT_BY_NAME["COLL"].offsets()["n"][0]          # n bit 0
    bad = list(prog)
    bad[pc] ^= 1 << bit
    assert decode(bad[pc]).n == 8193
    iss = IssRing(cfg, 2)
    app = _card(cfg, lib, 2)
    _ring_inputs(cfg, lay, [iss, app], 17)
    want = iss.run([prog, bad], lay.prog_addr)
    assert want == [_st("RING_ERROR", pc)] * 2
    app.set_fault(Fault("flip", card=1, port="insn", addr=lay.prog_addr + 16 * pc, mask=1 << bit))
    msg = _step(app, [prog] * 2, lay)
    assert msg == f"device: card 0: the step at position 0 stopped with status RING_ERROR (pc {pc})"
    assert [_status(d) for d in app.devices] == want
    for i in range(2):
        _clean_stop(app, i)
    app.reset()
    _ring_matches_iss(cfg, app, lay, prog, seed=18)


# -- a port that stops answering -----------------------------------------------------------------
def _stuck_program(cfg, lay):
    out = lay.out_rows[0]
    return [encode("LOAD", vsp=0, n=512, row=0),                  # pc 0
            _store(cfg, 0, 64, out),                              # pc 1: 2 writes a channel
            encode("LOAD", vsp=512, n=512, row=32),               # pc 2
            encode("VEC", vop="ADD", dst=1024, src1=0, src2=512, n=512),   # waits for pc 2
            _store(cfg, 1024, 64, out + 8),                       # pc 4
            encode("HALT")]


# Each costs the watchdog's 2^20 cycles (about 18 s): two in make test, the rest in make soak.
SILENT = [  # (kind, port, at, the pc it stops at, why)
    pytest.param("no_r", 1, 2, 2, "the second LOAD's beats never come", id="no_r-1"),
    pytest.param("no_b", 3, 3, 4, "the second STORE's first write is never answered", id="no_b-3",
                 marks=pytest.mark.soak),
    pytest.param("no_r", "insn", 2, 16, "instructions 16.. never arrive", id="no_r-insn",
                 marks=pytest.mark.soak),
]


@pytest.mark.parametrize("kind, port, at, pc, why", SILENT)
def test_port_stops_answering_then_recovers(cfg, lib, kind, port, at, pc, why):
    """The port stops answering for longer than the watchdog: TIMEOUT at the oldest
    instruction not completed; the kernel stops issuing and refuses a start (the host says so
    in one line naming the card) while its access is open; once the port answers again the
    card drains by itself, is idle with nothing open, and runs the next program correctly."""
    from sim.system import Fault
    lay = Layout(cfg)
    app = _card(cfg, lib)
    prog = _stuck_program(cfg, lay)
    if port == "insn":
        prog = [encode("LOAD", vsp=64 * k, n=64, row=k) for k in range(20)] + [encode("HALT")]
    extra = 50_000
    app.set_fault(Fault(kind, port=port, at=at, cycles=WATCHDOG + extra))
    msg = _step(app, [prog], lay)
    assert msg == f"device: card 0: the step at position 0 stopped with status TIMEOUT (pc {pc})", why
    dev = app.devices[0]
    c = dev.counters()
    assert WATCHDOG <= c["cycles"] <= WATCHDOG + extra, c["cycles"]
    assert app.port_state(0, port)["silent"] == 1
    # still busy: the next start is refused in one line, the run is not started
    msg = _step(app, [prog], lay, timeout_s=60)    # refused at once, not run
    assert msg.startswith("device: card 0 is still busy from its last run"), msg
    assert _status(dev) == _st("TIMEOUT", pc)
    assert app.open_at_done(0) > 0                # TIMEOUT: ap_done with the access open
    app.clock(extra)
    assert app.port_state(0, port)["silent"] == 0
    _clean_stop(app, at_done=False)
    # nothing was issued after the TIMEOUT: only what was in flight completed
    assert dev.counters()["insns"] == c["insns"]
    rerun_matches_iss(cfg, app, seed=7)


@pytest.mark.parametrize("kind, port, pc", [pytest.param("no_ar", 2, 2, marks=pytest.mark.soak),
                                            ("no_aw", 0, 4)])
def test_port_dead_until_reset(cfg, lib, kind, port, pc):
    """A port that never takes the burst's address again (ARREADY or AWREADY low for good). The
    host's wall-clock bound ends its wait first (one line naming the card); the watchdog's
    TIMEOUT follows at the stuck instruction; every start is refused while the access cannot
    complete; after a reset the same card runs correctly."""
    from sim.system import Fault
    lay = Layout(cfg)
    app = _card(cfg, lib)
    prog = _stuck_program(cfg, lay)
    at = 2 if kind == "no_ar" else 3
    app.set_fault(Fault(kind, port=port, at=at))
    # a bound far below the watchdog: the host gives up after its first slice of cycles
    msg = _step(app, [prog], lay, timeout_s=1e-6)
    assert msg == "device: card 0: the step at position 0 did not finish within 1e-06 s (--timeout)"
    dev = app.devices[0]
    assert dev.wait(600) == _st("TIMEOUT", pc)
    for _ in range(2):
        msg = _step(app, [prog], lay, timeout_s=60)
        assert msg.startswith("device: card 0 is still busy from its last run"), msg
    app.reset()
    _clean_stop(app, at_done=False)
    rerun_matches_iss(cfg, app, seed=8)


# -- a link that goes down mid-collective --------------------------------------------------------
def _ring_program(cfg, lay, hbm):
    """A LOAD of the card's vector, an all-reduce of 8192 words (VSP, or HBM rows), a reader of
    its result, the VSP dump."""
    gen = ProgramGen(cfg, np.random.default_rng(0), lay)
    if hbm:
        coll = encode("COLL", cop=2, src=ZERO_ROW + 1024, dst=ZERO_ROW + 2048, n=8192, hbm=1)
        use = encode("LOAD", vsp=8192, n=8192, row=ZERO_ROW + 2048, f32=1)
    else:
        coll = encode("COLL", cop=2, src=0, dst=8192, n=8192)
        use = encode("VEC", vop="ADD", dst=4096, src1=8192, src2=8192, n=4096)
    return ([encode("LOAD", vsp=0, n=8192, row=lay.data_rows[0], f32=1)]
            + ([_store(cfg, 0, 8192, ZERO_ROW + 1024)] if hbm else [])
            + [coll, use] + gen.dump(cfg.core.vsp_words) + [encode("HALT")])


def _ring_inputs(cfg, lay, rings, seed):
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((2, 8192)).astype(np.float32)
    for ring in rings:
        for i, dev in enumerate(ring.devices):
            write_stripes(dev, cfg, lay.data_rows[0], x[i])


def _ring_matches_iss(cfg, app, lay, prog, seed):
    iss = IssRing(cfg, 2)
    _ring_inputs(cfg, lay, [iss, app], seed)
    want = iss.run([prog] * 2, lay.prog_addr)
    assert want == [(len(prog) - 1) << 8] * 2
    assert app.run([prog] * 2, lay.prog_addr, timeout_s=300) == want
    for i in range(2):
        a = read_stripes(iss.devices[i], cfg, lay.dump_row, lay.dump_rows)
        b = read_stripes(app.devices[i], cfg, lay.dump_row, lay.dump_rows)
        assert np.array_equal(a, b), f"card {i}: VSP differs from the ISS ring"
        _clean_stop(app, i)


def test_link_down_and_back_mid_collective(cfg, lib):
    """Card 0's link to card 1 loses every beat for 3,000 cycles, from its third frame of an
    all-reduce on: the link layer's go-back-N resends what was lost once the link is back, the
    COLL completes (status OK on both cards), and the results equal the ISS ring's bit for
    bit; the retransmissions are counted."""
    lay = Layout(cfg)
    app = _card(cfg, lib, 2)
    app.link_outage(0, +1, after_frames=2, cycles=3_000)
    prog = _ring_program(cfg, lay, hbm=False)
    _ring_matches_iss(cfg, app, lay, prog, seed=11)
    assert app.outage_lost() > 0
    assert sum(d.counters()["link_retx"] for d in app.devices) > 0
    assert app.link_stats()["bad_crc_frames"] == 0


def test_link_down_for_good_mid_collective(cfg, lib):
    """The same link down for longer than its retries (COLL on HBM): card 0's link port gives
    the link up and its COLL ends with RING_ERROR; card 1, whose data never come, ends with
    RING_ERROR at its COLL after the collective unit's timeout; both stop cleanly (every HBM
    access of the COLL answered). A program without COLL then runs correctly; a COLL fails at
    once until the cards are reset (the ring's link state is unknown); after a reset the
    all-reduce is correct again."""
    lay = Layout(cfg)
    app = _card(cfg, lib, 2)
    prog = _ring_program(cfg, lay, hbm=True)
    coll_pc = next(pc for pc, w in enumerate(prog) if decode(w).op == "COLL")
    _ring_inputs(cfg, lay, [app], 12)
    app.link_outage(0, +1, after_frames=2, cycles=10 * WATCHDOG)
    msg = _step(app, [prog] * 2, lay)
    assert msg == f"device: card 0: the step at position 0 stopped with status RING_ERROR (pc {coll_pc})"
    assert [_status(d) for d in app.devices] == [_st("RING_ERROR", coll_pc)] * 2
    for i in range(2):
        _clean_stop(app, i)
    rerun_matches_iss(cfg, app, seed=13, card=1)
    coll = [encode("COLL", cop=2, src=0, dst=8192, n=64), encode("HALT")]
    msg = _step(app, [coll] * 2, lay)
    assert msg == "device: card 0: the step at position 0 stopped with status RING_ERROR (pc 0)"
    app.reset()
    _ring_matches_iss(cfg, app, lay, prog, seed=14)


@pytest.mark.parametrize("kind, at", [("read_error", 9), ("write_error", 257)])
def test_collective_hbm_access_error(cfg, lib, kind, at):
    """An error response to the collective unit's own HBM access (COLL on HBM, through the
    card's AXI multiplexers and HbmBeats): card 0's first read burst of the COLL (after its
    LOAD's 8 bursts a channel), or its first write (after the STORE's 256 writes a channel).
    Card 0 ends with AXI_ERROR at the COLL; the COLL itself runs to its end, so card 1's
    completes (with what card 0 sent: the step as a whole failed, and the host says so naming
    card 0); both stop cleanly, and the ring runs correctly at the next start."""
    from sim.system import Fault
    lay = Layout(cfg)
    app = _card(cfg, lib, 2)
    prog = _ring_program(cfg, lay, hbm=True)
    coll_pc = next(pc for pc, w in enumerate(prog) if decode(w).op == "COLL")
    assert read_burst_pcs(cfg, prog[:coll_pc]) == [0] * 8
    assert write_burst_pcs(cfg, prog[:coll_pc]) == [1] * 256
    _ring_inputs(cfg, lay, [app], 15)
    app.set_fault(Fault(kind, card=0, port=1, at=at))
    msg = _step(app, [prog] * 2, lay)
    assert msg == f"device: card 0: the step at position 0 stopped with status AXI_ERROR (pc {coll_pc})"
    assert [_status(d) for d in app.devices] == [_st("AXI_ERROR", coll_pc), (len(prog) - 1) << 8]
    for i in range(2):
        _clean_stop(app, i)
    _ring_matches_iss(cfg, app, lay, prog, seed=16)


# -- the demo model ------------------------------------------------------------------------------
def test_generation_fails_in_one_line_and_runs_again(cfg, lib):
    """The demo model's generation on one Verilated card, an SLVERR on channel 2's 40th read
    burst of the prompt's step: a CardError of one line naming card 0 and the LOAD or WLOAD
    that burst belongs to; the next generation on the same card gives the ISS's tokens and
    logits bit for bit."""
    from host.compiler import CompiledModel
    from host.model import load_checkpoint
    from host.runtime import DEMO_MODEL, generate
    from sim.system import Fault
    model = load_checkpoint(DEMO_MODEL)
    cm = CompiledModel(cfg, model)
    ids = [5, 17, 300]
    app = _card(cfg, lib)
    dev = app.devices[0]
    pc = read_burst_pcs(cfg, cm.step(ids, 0))[40 - 1]
    cm.load(dev)
    app.set_fault(Fault("read_error", port=2, at=40))
    with pytest.raises(CardError) as e:
        generate(cfg, cm, dev, ids, 3)
    assert str(e.value) == (f"device: card 0: the step at position 0 stopped with status "
                            f"AXI_ERROR (pc {pc})")
    _clean_stop(app)
    toks, logits, _ = generate(cfg, cm, dev, ids, 3, keep_logits=True)
    want, want_logits, _ = generate(cfg, cm, IssDevice(cfg), ids, 3, keep_logits=True)
    assert toks == want
    assert np.array_equal(logits.view(np.uint32), want_logits.view(np.uint32))


# -- a randomized campaign (make soak) ---------------------------------------------------------
@pytest.mark.soak
def test_fault_campaign_soak(cfg, lib, seed):
    """Hundreds of random programs, each with one random fault on one card that runs them all:
    an error response on a random read burst of a random channel (AXI_ERROR at the burst's
    instruction) or of the fetch (AXI_ERROR at the first instruction of the burst), on a random
    write (AXI_ERROR at a STORE), a bit flipped in a random instruction (the ISS's status and
    outputs on the corrupted program), or a port silent for fewer cycles than the watchdog
    (only later: the ISS's results). Every run stops cleanly and the next start runs a
    program bit-identical to the ISS."""
    from sim.system import Fault
    lay = Layout(cfg)
    app = _card(cfg, lib)
    dev = app.devices[0]
    rng = np.random.default_rng(seed)
    # the program far from anything a corrupted row field can reach (the last MB of channel 0)
    prog_addr = (cfg.hbm.channel_mbytes - 1) << 20
    kinds = ["read_error", "fetch_error", "write_error", "flip", "silence"]
    seen = dict.fromkeys(kinds, 0)
    for case in range(200):
        kind = kinds[case % len(kinds)]
        iss = IssDevice(cfg)
        _image(cfg, lay, [dev, iss], int(rng.integers(1 << 30)))
        xw = cfg.core.xb_words
        prog = ([encode("LOAD", vsp=0, n=xw, row=ZERO_ROW, f32=1),
                 encode("VEC", vop="CVT16", dst=0, src1=0, n=xw)]
                + ProgramGen(cfg, rng, lay).program(int(rng.integers(5, 40))))
        body = len(prog) - len(ProgramGen(cfg, rng, lay).dump()) - 1
        what = f"case {case} (seed {seed}): {kind}"
        bad, want = list(prog), None
        if kind == "read_error":
            pcs = read_burst_pcs(cfg, prog)
            at = int(rng.integers(1, len(pcs) + 1))
            app.set_fault(Fault("read_error", port=int(rng.integers(cfg.hbm.channels)), at=at,
                                resp=str(rng.choice(["SLVERR", "DECERR"]))))
            want = _st("AXI_ERROR", pcs[at - 1])
        elif kind == "fetch_error":
            at = int(rng.integers(1, -(-len(prog) // 16) + 1))
            app.set_fault(Fault("read_error", port="insn", at=at))
            want = _st("AXI_ERROR", 16 * (at - 1))
        elif kind == "write_error":
            # the VSP dump alone writes 128 beats a channel
            app.set_fault(Fault("write_error", port=int(rng.integers(cfg.hbm.channels)),
                                at=int(rng.integers(1, 129))))
        elif kind == "flip":
            pc, bit = int(rng.integers(2, body)), int(rng.integers(128))
            bad[pc] ^= 1 << bit
            app.set_fault(Fault("flip", port="insn", addr=prog_addr + 16 * pc, mask=1 << bit))
        else:
            port = int(rng.integers(cfg.hbm.channels))
            app.set_fault(Fault(str(rng.choice(["no_r", "no_ar", "no_b", "no_aw"])), port=port,
                                at=int(rng.integers(1, 9)), cycles=int(rng.integers(1, 20_000))))
        got = dev.run(prog, prog_addr, timeout_s=600)["status"]
        ref = iss.run(bad, prog_addr, timeout_s=600)["status"]
        try:
            if kind in ("read_error", "fetch_error"):
                assert got == want, f"status {got:#x}, expected {want:#x}"
            elif kind == "write_error":
                assert got & 0xFF == E["AXI_ERROR"] and decode(prog[got >> 8]).op == "STORE", f"{got:#x}"
            else:
                assert got == ref, f"status {got:#x}, ISS {ref:#x}"
                diff = np.flatnonzero(snapshot(dev, cfg, lay) != snapshot(iss, cfg, lay))
                assert diff.size == 0, f"{diff.size} bytes differ from the ISS's, first at {diff[:8]}"
            _clean_stop(app)
            app.clear_faults()
            if case % 10 == 0:
                rerun_matches_iss(cfg, app, seed=int(rng.integers(1 << 30)))
        except AssertionError as e:
            raise AssertionError(f"{what}: {e}") from None
        seen[kind] += 1
    print(seen)
