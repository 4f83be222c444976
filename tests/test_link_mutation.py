"""Link-layer checks the mutation score asked for (sim/mutate.py ``link_port``; issue 21 item 4).

The link port's mutants that survived tests/test_collective_node.py and were not proved
equivalent showed two gaps, each closed here, on the same N-card fabric (sim/fabric.py,
Verilated collective nodes) and run by ``python -m sim.mutate link_port`` beside that module:

- control traffic was never counted: a receiver that wants to acknowledge all the time sends
  an ACK frame every few cycles and every collective still comes out right;
- sequence numbers, acknowledgements and credits stayed below 2^8 (at most a couple of hundred
  frames a link), so a wrong high bit of any of them went unseen, and 16-bit wrap-around was
  never run.
"""

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
