"""COLL through the card kernel's collective unit (hw/core/coll.py) on the Verilated appliance:
N card kernels joined by link models, against the ISS ring (test_ring_iss.py).

Each card LOADs its own random fp32 vector, runs a sequence of all-reduces (in place and not),
all-gathers and reduce-scatters of sizes the ring does not divide, some of them overlapping
other work, and dumps its whole VSP; the HBM images, status words and link byte counters must
equal the ISS ring's (sim/ref/ring.py) bit for bit. Then the failure cases: a peer that stops
before its COLL, a card with no ring, a lossy link.
"""

import numpy as np
import pytest

from gen.config import load_config
from host.stripes import read_stripes, write_stripes
from hw import regs
from hw.isa import ERROR_CODES, encode
from sim.progs import Layout, ProgramGen
from sim.ref.ring import IssRing

ROOT = __import__("pathlib").Path(__file__).resolve().parent.parent


@pytest.fixture(scope="module")
def tiny():
    return load_config(ROOT / "configs" / "tiny.yaml")


@pytest.fixture(scope="module")
def card_lib(tiny):
    from sim.system import build_card
    lib, _, _ = build_card(tiny)
    return lib


def _program(cfg, lay, cards):
    """LOAD the card's vector, then COLLs of several kinds and sizes, a VEC between them, the
    VSP dump and HALT."""
    P = cfg.core.vector_lanes
    n_in = 1024
    prog = [encode("LOAD", vsp=0, n=n_in, row=lay.data_rows[0], f32=1)]
    cases = [  # (cop, src, dst, n, XB word of an fp16 copy or None)
        (2, 0, 2048, 1, None),      # one word: one beat, segments of zero beats
        (2, 0, 2048, 37, 5120),     # with its fp16 copy (COLL.x16): 3 beats, 48 words
        (0, 0, 4096, 37, None),     # all-gather, out of place
        (1, 0, 6144, 400, None),    # reduce-scatter, N does not divide 25 beats
        (2, 512, 512, 300, None),   # all-reduce in place
        (2, 0, 9216, 1024, 4096),   # 64 beats: one frame per segment; its fp16 copy
        (0, 0, 0, 40, None),        # all-gather with src == dst: block 0 lands on the input
    ]
    for k, (cop, src, dst, n, xdst) in enumerate(cases):
        if k == 5:              # the vector unit writing XB while the COLL's copy does
            prog.append(encode("VEC", vop="CVT16", dst=6144, src1=0, n=1024))
        prog.append(encode("COLL", cop=cop, src=src, dst=dst, n=n,
                           **({} if xdst is None else {"x16": 1, "xdst": xdst})))
        if k == 2:              # independent vector work overlapping a collective
            prog.append(encode("VEC", vop="EXP", dst=12288, src1=0, n=256))
        if k == 4:              # a reader of the in-place result waits for it
            prog.append(encode("VEC", vop="ADD", dst=12800, src1=512, src2=512, n=P * 75))
    # XB back into the VSP: identity tiles (``_identity_tiles``) over the copies, a token a
    # width of XB words (these MATVECs wait for the COLLs' XB ranges)
    W, L = cfg.core.width, cfg.core.lanes
    for xb, tokens, dst in ((4096, 32, 13312), (4096 + 32 * W, 32, 13824), (5120, 3, 14336),
                            (6144, 32, 14400)):
        prog += [encode("WLOAD", row=IDENTITY_ROW, tiles=W // L),
                 encode("MATVEC", xb=xb // W, dst=dst // P, rb=W // L, cb=1, group=W // L,
                        tokens=tokens, xstride=1, dstride=W // P)]
    gen = ProgramGen(cfg, np.random.default_rng(0), lay)
    return prog + gen.dump(cfg.core.vsp_words) + [encode("HALT")]


IDENTITY_ROW = 64               # (Layout's tile rows)


def _identity_tiles(cfg):
    """W / L weight tiles (a stripe row each) of the W x W identity in fp16: tile r holds rows
    rL .. rL + L - 1, row i's 1.0 at column rL + i."""
    W, L = cfg.core.width, cfg.core.lanes
    t = np.zeros((W // L, L, W), np.float16)
    for r in range(W // L):
        for i in range(L):
            t[r, i, r * L + i] = 1.0
    return t.view(np.uint8).reshape(-1)


def _inputs(cfg, lay, cards, seed):
    rng = np.random.default_rng(seed)
    print(f"seed {seed}")
    x = (rng.standard_normal((cards, 1024)) * np.exp(rng.uniform(-3, 3, (cards, 1024)))).astype(np.float32)
    x[:, 5] = [np.float32(1e30) * (1 if i % 2 else -1) for i in range(cards)]   # cancellation
    x[0, 6] = np.float32("inf")
    return x


def _run_both(cfg, cards, seed, lib, *, setup=None):
    from sim.system import RtlAppliance
    lay = Layout(cfg)
    prog = _program(cfg, lay, cards)
    x = _inputs(cfg, lay, cards, seed)
    iss = IssRing(cfg, cards)
    rtl = RtlAppliance(cfg, cards, lib=lib)
    if setup:
        setup(rtl)
    for ring in (iss, rtl):
        for i, dev in enumerate(ring.devices):
            write_stripes(dev, cfg, lay.data_rows[0], x[i].view(np.uint8))
            write_stripes(dev, cfg, IDENTITY_ROW, _identity_tiles(cfg))
    st_iss = iss.run([prog] * cards, lay.prog_addr)
    st_rtl = rtl.run([prog] * cards, lay.prog_addr, timeout_s=600)
    return lay, prog, iss, rtl, st_iss, st_rtl


@pytest.mark.parametrize("cards, bidirectional", [(2, False), (3, False), (2, True), (3, True), (4, True)])
def test_coll_matches_iss_ring(tiny, card_lib, cards, bidirectional, seed):
    """(The ring's direction is a bit of the ``card`` register: one card kernel runs both.)"""
    cfg = tiny.replace(topology="bidirectional_ring" if bidirectional else "ring")
    assert_rings_agree(cfg, cards, *_run_both(cfg, cards, seed + cards, card_lib))


def assert_rings_agree(cfg, cards, lay, prog, iss, rtl, st_iss, st_rtl):
    """Every card HALTed at the program's end on both rings, with the same VSP dump and the
    same link, instruction and HBM byte counters; no frame with a bad CRC."""
    assert st_iss == [(len(prog) - 1) << 8] * cards, st_iss
    assert st_rtl == st_iss
    for i in range(cards):
        a = read_stripes(iss.devices[i], cfg, lay.dump_row, lay.dump_rows)
        b = read_stripes(rtl.devices[i], cfg, lay.dump_row, lay.dump_rows)
        bad = np.flatnonzero(a.view(np.uint32) != b.view(np.uint32))
        assert bad.size == 0, f"card {i}: {bad.size} VSP words differ, first at word {bad[:8]}"
        ci, cr = iss.devices[i].counters(), rtl.devices[i].counters()
        for k in ("link_tx_bytes", "link_rx_bytes", "insns", "hbm_rd_bytes", "hbm_wr_bytes"):
            assert cr[k] == ci[k], (i, k, cr[k], ci[k])
        assert cr["link_tx_bytes"] > 0
    assert rtl.link_stats()["bad_crc_frames"] == 0


def test_coll_survives_a_lossy_link(tiny, card_lib, seed):
    # The link models draw their faults from a fixed sequence: these rates give a few dropped
    # and a few dozen flipped beats on this collective (dropped 3, flipped 21 of 93 frames once
    # LinkRx stopped losing ACKs, which removed resends and with them the flips of 2e-5).
    def faults(rtl):
        rtl.set_link(0, +1, ber=8e-5, drop=0.1)
        rtl.set_link(1, -1, drop=0.1)
    lay, prog, iss, rtl, st_iss, st_rtl = _run_both(tiny, 2, seed, card_lib, setup=faults)
    assert st_rtl == st_iss == [(len(prog) - 1) << 8] * 2
    for i in range(2):
        a = read_stripes(iss.devices[i], tiny, lay.dump_row, lay.dump_rows)
        b = read_stripes(rtl.devices[i], tiny, lay.dump_row, lay.dump_rows)
        assert np.array_equal(a, b), f"card {i}"
    s = rtl.link_stats()
    print("link stats", s)
    assert s["dropped"] > 0 and s["flipped"] > 0 and s["bad_crc_frames"] == 0
    c = [d.counters() for d in rtl.devices]
    assert sum(x["link_retx"] for x in c) > 0 and sum(x["link_crc_errors"] for x in c) > 0
    for i in range(2):          # payload counted once, whatever was sent again
        assert c[i]["link_tx_bytes"] == iss.devices[i].counters()["link_tx_bytes"]


def test_peer_that_never_arrives_is_a_ring_error(tiny, card_lib):
    """Card 1 stops at a misaligned LOAD before its COLL: card 0's COLL ends with RING_ERROR at
    the COLL's pc, within the collective unit's no-progress timeout (half the watchdog)."""
    from sim.system import RtlAppliance
    lay = Layout(tiny)
    coll = encode("COLL", cop=2, src=0, dst=1024, n=64)
    progs = [[encode("FENCE"), coll, encode("HALT")],
             [encode("LOAD", vsp=2, n=4, row=0), coll, encode("HALT")]]
    iss = IssRing(tiny, 2)
    want = iss.run(progs, lay.prog_addr)
    assert want == [(1 << 8) | ERROR_CODES["RING_ERROR"], ERROR_CODES["ALIGN"]]
    rtl = RtlAppliance(tiny, 2, lib=card_lib)
    assert rtl.run(progs, lay.prog_addr, timeout_s=300) == want
    # the ring is down until reset: a further COLL fails at once
    assert rtl.devices[0].run([coll, encode("HALT")], lay.prog_addr)["status"] == ERROR_CODES["RING_ERROR"]


def test_link_that_dies_after_its_coll_is_reported_by_the_next(tiny, card_lib):
    """Every acknowledgement to card 0 is lost (the left-hand link into its R port, which on a
    unidirectional ring carries nothing else): its data still arrive, so its COLLs complete
    (a COLL does not wait for its last frames' acknowledgements) until its link port, having
    timed out `retries` times, gives the link up. The next COLL on card 0 then ends at once
    with RING_ERROR at its pc, and card 1 stops too; nothing hangs."""
    from sim.system import RtlAppliance
    lay = Layout(tiny)
    coll = encode("COLL", cop=0, src=0, dst=1024, n=16)
    # (a long vector pass after each COLL lets the link port's timeouts run out in few runs)
    prog = [coll, encode("VEC", vop="EXP", dst=4096, src1=4096, n=4096), encode("HALT")]
    rtl = RtlAppliance(tiny, 2, lib=card_lib)
    rtl.set_link(0, -1, drop=1.0)
    ok = [(len(prog) - 1) << 8] * 2
    runs = []
    for _ in range(20):
        runs.append(rtl.run([prog, prog], lay.prog_addr, timeout_s=300))
        if runs[-1] != ok:
            break
    assert len(runs) > 1 and all(r == ok for r in runs[:-1]), runs
    last = runs[-1]
    assert last[0] == ERROR_CODES["RING_ERROR"], runs           # at the COLL, pc 0
    assert last[1] in (ok[1], ERROR_CODES["RING_ERROR"]), runs
    assert rtl.link_stats()["dropped"] > 0


@pytest.mark.parametrize("other", [dict(cop=2, n=40), dict(cop=0, n=37)])
def test_peers_that_disagree_are_a_ring_error(tiny, card_lib, other):
    """Card 1's COLL differs from card 0's in n (37 and 40 words: the same 3 beats, the same
    frames) or in cop: both cards end with RING_ERROR at the COLL, as on the ISS ring, not
    with a silently different result."""
    from sim.system import RtlAppliance
    lay = Layout(tiny)
    progs = [[encode("FENCE"), encode("COLL", cop=2, src=0, dst=1024, n=37), encode("HALT")],
             [encode("FENCE"), encode("COLL", src=0, dst=1024, **other), encode("HALT")]]
    want = IssRing(tiny, 2).run(progs, lay.prog_addr)
    assert want == [(1 << 8) | ERROR_CODES["RING_ERROR"]] * 2
    assert RtlAppliance(tiny, 2, lib=card_lib).run(progs, lay.prog_addr, timeout_s=300) == want


def test_coll_without_a_ring_is_illegal(tiny, card_lib):
    """One card alone (cards field 0 in the ``card`` register): COLL is ILLEGAL_OPCODE, as on
    the lone ISS; the checks of the instruction itself in the ISS ring's order."""
    from sim.ref.iss import IssDevice
    from sim.system import RtlAppliance
    lay = Layout(tiny)
    app = RtlAppliance(tiny, 1, lib=card_lib)
    dev = app.devices[0]
    coll = encode("COLL", cop=2, src=0, dst=1024, n=64)
    for d in (IssDevice(tiny), dev):
        assert d.run([encode("FENCE"), coll, encode("HALT")], lay.prog_addr)["status"] == \
            (1 << 8) | ERROR_CODES["ILLEGAL_OPCODE"]
    # with a ring in the register, the instruction's own checks, as the ISS ring makes them
    vw = tiny.core.vsp_words
    cases = [(dict(cop=3, src=0, dst=1024, n=4), "ILLEGAL_OPCODE"),
             (dict(cop=2, src=0, dst=1024, n=0), "BAD_FIELD"),
             (dict(cop=2, src=2, dst=1024, n=4), "ALIGN"),
             (dict(cop=0, src=0, dst=vw - 32, n=20), "VSP_RANGE"),
             (dict(cop=2, src=0, dst=8, n=20), "OVERLAP"),
             (dict(cop=2, src=tiny.channel_rows - 4, dst=0, n=200, hbm=1), "HBM_RANGE"),
             (dict(cop=0, src=0, dst=tiny.channel_rows - 8, n=200, hbm=1), "HBM_RANGE"),
             (dict(cop=2, src=100, dst=104, n=200, hbm=1), "OVERLAP"),
             (dict(cop=1, src=100, dst=100, n=0, hbm=1), "BAD_FIELD"),
             # COLL.x16: an all-reduce in the VSP only, its copy aligned and inside XB
             (dict(cop=0, src=0, dst=1024, n=16, x16=1), "BAD_FIELD"),
             (dict(cop=1, src=0, dst=1024, n=16, x16=1), "BAD_FIELD"),
             (dict(cop=2, src=0, dst=8, n=16, hbm=1, x16=1), "BAD_FIELD"),
             (dict(cop=2, src=0, dst=1024, n=16, x16=1, xdst=2), "ALIGN"),
             (dict(cop=2, src=0, dst=vw - 32, n=40, x16=1, xdst=2), "ALIGN"),
             (dict(cop=2, src=0, dst=vw - 32, n=40, x16=1, xdst=tiny.core.xb_words - 64),
              "VSP_RANGE"),
             (dict(cop=2, src=0, dst=1024, n=40, x16=1, xdst=tiny.core.xb_words - 32), "XB_RANGE"),
             (dict(cop=2, src=0, dst=8, n=16, x16=1, xdst=tiny.core.xb_words), "XB_RANGE")]
    for fields, name in cases:
        dev.write_reg(regs.ARGS["card"][0], 0 | 2 << 8)
        got = dev.run([encode("COLL", **fields), encode("HALT")], lay.prog_addr)["status"]
        assert got == ERROR_CODES[name], (fields, name, got)
        ring = IssRing(tiny, 2)
        st = ring.run([[encode("COLL", **fields), encode("HALT")]] * 2, lay.prog_addr)
        assert st[0] == ERROR_CODES[name], (fields, st)


# COLL on HBM: messages larger than the VSP (16,384 words on tiny), from HBM rows to HBM rows
HBM_CASES = [  # (cop, src row, dst row, n)
    (2, 4096, 5000, 20000),         # all-reduce of 80 KB per card, out of place
    (0, 4096, 6000, 5000),          # all-gather
    (1, 4096, 7000, 9999),          # reduce-scatter, segments N does not divide
    (2, 8000, 8000, 777),           # all-reduce in place
    (0, 8200, 8200, 300),           # all-gather onto its own input
    (2, 9000, 11000, 45000),        # 180 KB: prefetch streams restarting at every segment
]
HBM_REGION = (4096, 12500)


def _hbm_program(cfg, lay):
    """HBM COLLs with LOADs, STOREs and vector work on the same HBM channels beside them, a LOAD
    of a COLL's result (the scoreboard orders it after the COLL), the VSP dump, HALT."""
    prog = [encode("LOAD", vsp=0, n=1024, row=lay.data_rows[0], f32=1)]
    for k, (cop, src, dst, n) in enumerate(HBM_CASES):
        prog.append(encode("COLL", cop=cop, src=src, dst=dst, n=n, hbm=1))
        if k == 0:      # independent traffic on the channels while the all-reduce runs
            prog += [encode("LOAD", vsp=2048, n=2048, row=lay.data_rows[0], f32=1),
                     encode("STORE", vsp=0, n=1024, row=lay.out_rows[0],
                            lepg=(cfg.stripe_bytes // 4).bit_length() - 1, lgpr=0, gstride=0,
                            rstride=1, f32=1),
                     encode("VEC", vop="EXP", dst=12288, src1=0, n=1024)]
    # the all-reduce's result back into the VSP (waits for the first COLL's HBM rows)
    prog.append(encode("LOAD", vsp=4096, n=8192, row=5000, f32=1))
    gen = ProgramGen(cfg, np.random.default_rng(0), lay)
    return prog + gen.dump(cfg.core.vsp_words) + [encode("HALT")]


@pytest.mark.parametrize("cards, bidirectional", [(2, False), (3, True)])
def test_coll_on_hbm_matches_iss_ring(tiny, card_lib, cards, bidirectional, seed):
    _coll_on_hbm(tiny, card_lib, cards, bidirectional, seed)


def test_coll_on_hbm_stalled(tiny, card_lib, seed):
    """The same with random stalls on every HBM port and link (sim.system.Stalls): the card's
    AXI multiplexers share each channel between the DMA and the collective unit's HbmBeats
    while the channel and the links stall."""
    from sim.system import Stalls
    fast = _coll_on_hbm(tiny, card_lib, 2, False, seed)
    slow = _coll_on_hbm(tiny, card_lib, 2, False, seed, stalls=Stalls(seed=seed))
    print(f"COLL on HBM, 2 cards: {fast} cycles unstalled, {slow} stalled ({slow / fast:.3f}x)")
    assert slow > fast


def _coll_on_hbm(tiny, card_lib, cards, bidirectional, seed, stalls=None):
    """COLLs on HBM beside LOAD/STORE traffic on ``cards`` cards against the ISS ring; returns
    the RTL's cycles (the slowest card's)."""
    from sim.system import RtlAppliance
    cfg = tiny.replace(topology="bidirectional_ring" if bidirectional else "ring")
    lay = Layout(cfg)
    prog = _hbm_program(cfg, lay)
    rng = np.random.default_rng(seed + 10 * cards)
    print(f"seed {seed + 10 * cards}")
    iss, rtl = IssRing(cfg, cards), RtlAppliance(cfg, cards, lib=card_lib, stalls=stalls)
    inputs = []
    for i in range(cards):
        x = (rng.standard_normal(20000) * np.exp(rng.uniform(-4, 4, 20000))).astype(np.float32)
        z = rng.standard_normal(45000).astype(np.float32)
        y = rng.standard_normal(2000).astype(np.float32)
        inputs.append(x.view(np.uint32))
        # the message region: random words around the inputs, so that the words past each n
        # (which the COLLs must read as +0) and the rows a result must not touch are not zero
        region = rng.integers(0, 2**32, (HBM_REGION[1] - HBM_REGION[0]) * cfg.stripe_bytes // 4,
                              dtype=np.uint32)
        at = lambda row: (row - HBM_REGION[0]) * cfg.stripe_bytes // 4   # noqa: E731
        region[at(4096):at(4096) + 20000] = x.view(np.uint32)
        region[at(8000):at(8000) + 777] = y[:777].view(np.uint32)
        region[at(8200):at(8200) + 300] = y[1000:1300].view(np.uint32)
        region[at(9000):at(9000) + 45000] = z.view(np.uint32)
        for ring in (iss, rtl):
            dev = ring.devices[i]
            write_stripes(dev, cfg, HBM_REGION[0], region)
            write_stripes(dev, cfg, lay.data_rows[0], x[:2048])
    st_iss = iss.run([prog] * cards, lay.prog_addr)
    st_rtl = rtl.run([prog] * cards, lay.prog_addr, timeout_s=900)
    assert st_iss == [(len(prog) - 1) << 8] * cards, st_iss
    assert st_rtl == st_iss
    nrows = HBM_REGION[1] - HBM_REGION[0]
    for i in range(cards):
        for what, row, rows in (("VSP dump", lay.dump_row, lay.dump_rows),
                                ("HBM messages", HBM_REGION[0], nrows),
                                ("STORE rows", lay.out_rows[0], 64)):
            a = read_stripes(iss.devices[i], cfg, row, rows).view(np.uint32)
            b = read_stripes(rtl.devices[i], cfg, row, rows).view(np.uint32)
            bad = np.flatnonzero(a != b)
            assert bad.size == 0, f"card {i}, {what}: {bad.size} words differ, first at {bad[:8]}"
        ci, cr = iss.devices[i].counters(), rtl.devices[i].counters()
        for k in ("link_tx_bytes", "link_rx_bytes", "insns", "hbm_rd_bytes", "hbm_wr_bytes"):
            assert cr[k] == ci[k], (i, k, cr[k], ci[k])
    # the ISS ring's HBM plumbing against the reference collective on the inputs it was given
    from sim.ref import collective as ref
    B = cfg.link.data_bits // 32
    got = read_stripes(iss.devices[0], cfg, 5000, 625).view(np.uint32)[:20000]
    want = ref.reference("allreduce", np.stack(inputs), B, bidirectional=bidirectional)[0][:20000]
    assert np.array_equal(got, want.view(np.uint32))
    return max(int(d.counters()["cycles"]) for d in rtl.devices)


def test_collective_cli_through_the_card(card_lib, tmp_path):
    """`gptfpga collective --through-card`: the collective as COLLs on HBM on the Verilated
    card kernels, checked against numpy, through a lossy link too; a dead link is one line and
    exit code 1; fp16 (the bare nodes' option) is refused in one line."""
    import json
    import subprocess
    import sys
    cfg_path = str(ROOT / "configs" / "tiny.yaml")

    def cli(*args):
        return subprocess.run([sys.executable, "-m", "host.cli", "collective", "--config", cfg_path,
                               "--through-card", *args], capture_output=True, text=True, cwd=ROOT)

    save = tmp_path / "ag.npz"
    proc = cli("--op", "allgather", "--elements", "70000", "--cards", "2", "--drop", "0.02",
               "--seed", "2", "--json", "--save", str(save))
    assert proc.returncode == 0, proc.stderr
    fig = json.loads(proc.stdout)
    assert fig["ok"] and fig["retransmissions"] > 0
    z = np.load(save)
    x = z["inputs"]
    assert z["outputs"].shape == (2, 2 * 70000)           # the user's layout: blocks back to back
    for i in range(2):
        assert np.array_equal(z["outputs"][i].view(np.uint32), x.reshape(-1).view(np.uint32)), i
    proc = cli("--op", "reducescatter", "--elements", "5000", "--cards", "3", "--bidirectional", "--json")
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout)["ok"]
    dead = cli("--op", "allreduce", "--elements", "1000", "--drop", "1.0")
    assert dead.returncode == 1
    # one line for the failure (after the progress lines a run this long prints in a log)
    errors = [ln for ln in dead.stderr.strip().splitlines() if not ln.startswith("collective allreduce: ")]
    assert len(errors) == 1 and "RING_ERROR" in errors[0] and "Traceback" not in dead.stderr
    fp16 = cli("--op", "allreduce", "--elements", "10", "--dtype", "fp16")
    assert fp16.returncode == 2 and "--dtype: got fp16" in fp16.stderr


def test_card_collective_bench(card_lib):
    """`gptfpga bench collective`'s card table on a small grid: results checked against the
    reference inside, figures consistent, and HBM ahead of the VSP's one port at equal size."""
    from sim.bench import bench_card_collective, collective_table
    rows = bench_card_collective(load_config(ROOT / "configs" / "tiny.yaml"), cards=(2,),
                                 sizes={"vsp": (16384,), "hbm": (16384, 262144)}, log=lambda *a: None)
    assert [(r["from"], r["size"], r["cards"]) for r in rows] == \
        [("vsp", 16384, 2), ("hbm", 16384, 2), ("hbm", 262144, 2)]
    for r in rows:
        assert 0 < r["busbw_fraction_of_link_peak"] <= 1, r
        assert r["busbw_bytes_per_cycle"] == pytest.approx(r["size"] / r["cycles"], rel=2e-3)
    assert rows[2]["busbw_fraction_of_link_peak"] > 2 * rows[0]["busbw_fraction_of_link_peak"]
    table = collective_table({"runs": [], "small_message": [], "card": rows})
    assert "| 256 KiB from the HBM, 2 cards |" in table


def test_coll_with_data_on_the_vsp_of_one_card_and_in_hbm_of_another(tiny, card_lib):
    """Where a card keeps its part of a COLL (VSP or HBM) is its own business: the ring sees the
    same frames. Card 0 all-reduces from its VSP, card 1 from HBM rows, as on the ISS ring."""
    from sim.system import RtlAppliance
    lay = Layout(tiny)
    rng = np.random.default_rng(7)
    x = rng.standard_normal((2, 300)).astype(np.float32)
    store = encode("STORE", vsp=1024, n=304, row=lay.out_rows[0],
                   lepg=(tiny.stripe_bytes // 4).bit_length() - 1, lgpr=0, gstride=0, rstride=1, f32=1)
    progs = [[encode("LOAD", vsp=0, n=300, row=lay.data_rows[0], f32=1),
              encode("COLL", cop=2, src=0, dst=1024, n=300), store, encode("HALT")],
             [encode("COLL", cop=2, src=4096, dst=4200, n=300, hbm=1), encode("HALT")]]
    iss, rtl = IssRing(tiny, 2), RtlAppliance(tiny, 2, lib=card_lib)
    for ring in (iss, rtl):
        write_stripes(ring.devices[0], tiny, lay.data_rows[0], x[0])
        write_stripes(ring.devices[1], tiny, 4096, x[1])
    want = iss.run(progs, lay.prog_addr)
    assert want == [3 << 8, 1 << 8]
    assert rtl.run(progs, lay.prog_addr, timeout_s=300) == want
    for ring in (iss, rtl):
        a = read_stripes(ring.devices[0], tiny, lay.out_rows[0], 10).view(np.uint32)[:304]
        b = read_stripes(ring.devices[1], tiny, 4200, 10).view(np.uint32)[:304]
        assert np.array_equal(a, b)
    for k in (lay.out_rows[0], 4200):
        dev = 0 if k == lay.out_rows[0] else 1
        assert np.array_equal(read_stripes(iss.devices[dev], tiny, k, 10),
                              read_stripes(rtl.devices[dev], tiny, k, 10))
