"""The bare collective node: ring collectives on the simulated N-card fabric (Verilator),
bit-exact against numpy.

Nodes: hw/collective (link layer + ring engine); fabric: sim/cpp/fabric_sim.cpp; reference:
sim/ref/collective.py. (The same collectives through the card kernel's collective unit:
test_ring_cards_rtl.py; on the ISS ring: test_ring_iss.py; the geometry: test_ring_geometry.py.)
"""

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from gen.config import load_config
from sim.ref import collective as R

ROOT = Path(__file__).resolve().parent.parent
CFG = ROOT / "configs" / "tiny.yaml"


def test_reference_orders():
    """The reference sums in the documented ring order (checked on values where order shows)."""
    big, small = np.float32(2.0**24), np.float32(1.0)
    x = np.array([[big], [small], [-big]], np.float32).view(np.uint32)   # N = 3, n = 1
    # right-hand ring, segment 0 of a 1-beat message: start at card 1: (1 + -2^24) + 2^24 = 0
    got = R.reference("allreduce", x, 1)[0].view(np.float32)
    assert got[0] == np.float32(0.0)
    assert R.reduce_order(0, 3, +1) == [1, 2, 0] and R.reduce_order(0, 3, -1) == [2, 1, 0]


@pytest.fixture(scope="module")
def fabric_lib():
    from sim.fabric import build_fabric, node_params
    cfg = load_config(CFG)
    return cfg, build_fabric(node_params(cfg))


SIZES = [1, 37, 1000]          # one element; not a multiple of the cards or the beat; several chunks


@pytest.mark.rtl
@pytest.mark.parametrize("op", ["allgather", "reducescatter", "allreduce"])
@pytest.mark.parametrize("cards", [2, 3, 4, 8])
@pytest.mark.parametrize("bidirectional", [False, True])
def test_collectives_bit_exact(fabric_lib, op, cards, bidirectional, seed):
    from sim.fabric import run_collective
    cfg, lib = fabric_lib
    for n in SIZES + ([5000] if cards == 4 else []):
        fig, _, outputs, expect = run_collective(cfg, op, n, cards=cards, bidirectional=bidirectional,
                                                 seed=seed + n, lib=lib)
        assert fig["ok"], f"{op} {cards} cards n={n}: differs from numpy (seed {seed + n})"
        assert fig["retransmissions"] == 0 and fig["crc_errors"] == 0
        assert [len(o) for o in outputs] == [len(e) for e in expect]


@pytest.mark.rtl
def test_fp16_inputs(fabric_lib, seed):
    from sim.fabric import run_collective
    cfg, lib = fabric_lib
    for op in ("allgather", "reducescatter", "allreduce"):
        fig, *_ = run_collective(cfg, op, 700, cards=3, dtype="fp16", seed=seed, lib=lib)
        assert fig["ok"], op


@pytest.mark.rtl
@pytest.mark.parametrize("ber,drop", [(2e-5, 0.0), (0.0, 0.05), (1e-5, 0.03)])
def test_faults_are_recovered(fabric_lib, ber, drop, seed):
    """Bit errors and dropped frames: results still exact, losses repaired by retransmission."""
    from sim.fabric import run_collective
    cfg, lib = fabric_lib
    fig, *_ = run_collective(cfg, "allreduce", 4000, cards=4, bidirectional=True, ber=ber, drop=drop,
                             seed=seed, lib=lib)
    assert fig["ok"]
    assert fig["retransmissions"] > 0
    if ber:
        assert fig["crc_errors"] > 0


@pytest.mark.rtl
@pytest.mark.parametrize("op,run_seed", [("allgather", 0), ("allgather", 2), ("allreduce", 2)])
def test_frames_after_a_go_back_keep_their_first_beat(fabric_lib, op, run_seed):
    """Long messages (70,000 words: 69 frames a segment) through 2% dropped frames. After a
    go-back the receiver sees duplicates and out-of-order frames; a frame arriving while the one
    before it was being checked and *not* accepted used to write its first beat one slot too
    far, and the retransmitted frame was then delivered with the first beat of a later frame
    (these seeds hit it: a beat of the result was another beat's value)."""
    from sim.fabric import run_collective
    cfg, lib = fabric_lib
    fig, *_ = run_collective(cfg, op, 70000, cards=2, drop=0.02, seed=run_seed, lib=lib)
    assert fig["retransmissions"] > 0
    assert fig["ok"]


@pytest.mark.rtl
def test_dead_link_reported(fabric_lib):
    """A dead link: every node stops with the link error (no hang) well inside the budget."""
    from sim.fabric import LinkDead, node_params, run_collective
    cfg, lib = fabric_lib
    with pytest.raises(LinkDead) as e:
        run_collective(cfg, "allreduce", 2000, cards=3, dead_link=1, lib=lib)
    assert "dead" in str(e.value)
    assert e.value.figures["retransmissions"] >= node_params(cfg).retries


@pytest.mark.rtl
def test_cli(fabric_lib, tmp_path):
    save = tmp_path / "r.npz"
    proc = subprocess.run([sys.executable, "-m", "host.cli", "collective", "--config", str(CFG), "--op",
                           "allreduce", "--elements", "100", "--cards", "3", "--json", "--save", str(save)],
                          capture_output=True, text=True, cwd=ROOT)
    assert proc.returncode == 0, proc.stderr
    fig = json.loads(proc.stdout)
    for key in ("ok", "cycles", "bytes", "algbw_bytes_per_cycle", "busbw_bytes_per_cycle",
                "busbw_fraction_of_link_peak", "retransmissions", "crc_errors"):
        assert key in fig
    z = np.load(save)
    assert z["inputs"].shape == (3, 100)
    ref = z["inputs"].astype(np.float64).sum(0)
    assert np.allclose(z["outputs"][:, :100], ref[None], rtol=1e-5, atol=1e-5)
    dead = subprocess.run([sys.executable, "-m", "host.cli", "collective", "--config", str(CFG), "--op",
                           "allgather", "--elements", "100", "--drop", "1.0"],
                          capture_output=True, text=True, cwd=ROOT)
    assert dead.returncode == 1
    # one error line (a progress line may come before it when the run takes seconds)
    errors = [ln for ln in dead.stderr.splitlines() if ln.startswith("gptfpga:")]
    assert len(errors) == 1 and "link" in errors[0], dead.stderr
    assert all(ln.startswith(("gptfpga:", "collective ")) for ln in dead.stderr.splitlines()), dead.stderr
    bad = subprocess.run([sys.executable, "-m", "host.cli", "collective", "--config", str(CFG), "--op",
                          "allgather", "--elements", "0"], capture_output=True, text=True, cwd=ROOT)
    assert bad.returncode == 2 and "--elements: got 0" in bad.stderr


@pytest.mark.rtl
def test_bench_sweep_and_plot(fabric_lib, tmp_path):
    """The bench's sweep on a small grid: figures consistent, latency never below its floor."""
    from sim import bench
    cfg = load_config(CFG)
    res = bench.bench_collective(cfg, sizes=[64, 1 << 16], cards=(3,), log=lambda m: None)
    runs = res["runs"]
    assert {r["op"] for r in runs} == {"allreduce", "allgather", "reducescatter"}
    assert all(r["ok"] for r in runs)
    for r in runs:
        assert r["cycles"] >= r["latency_floor_cycles"] == r["hops"] * cfg.link.latency_cycles
        assert 0 < r["busbw_fraction_of_link_peak"] <= 1.0
    ar = {(r["size"], r["bidirectional"]): r for r in runs if r["op"] == "allreduce"}
    assert ar[(64, False)]["hops"] == 4
    frac = {k: r["busbw_fraction_of_link_peak"] for k, r in ar.items()}
    assert frac[(1 << 16, False)] > 10 * frac[(64, False)]
    assert res["min_busbw_fraction_at_1MiB_or_more"] == min(
        r["busbw_fraction_of_link_peak"] for r in runs if r["size"] >= 1 << 20)
    table = bench.collective_table(res)
    assert "allreduce 64 KiB" in table and "reducescatter 1 MiB" in table
    png = tmp_path / "busbw.png"
    bench.plot_collective(res, png)
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


@pytest.mark.rtl
@pytest.mark.parametrize("op", ["allgather", "reducescatter", "allreduce"])
@pytest.mark.parametrize("latency, jitter, stall", [(2, 0, 0.0), (4, 12, 0.4)])
def test_slow_memory(fabric_lib, op, latency, jitter, stall, seed):
    """The engine's memory ports tolerate any latency and backpressure (the card's scratchpad
    and HBM are not one-cycle memories): replies late, jittered, ports refusing requests;
    still bit-exact."""
    from sim.fabric import run_collective
    cfg, lib = fabric_lib
    for cards, bidi in ((2, False), (4, True)):
        for n in (37, 5000):
            fig, *_ = run_collective(cfg, op, n, cards=cards, bidirectional=bidi, seed=seed + n, lib=lib,
                                     mem_latency=latency, mem_jitter=jitter, mem_stall=stall)
            assert fig["ok"], f"{op} {cards} cards n={n} memory {latency}/{jitter}/{stall} (seed {seed + n})"
