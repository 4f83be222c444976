"""COLL on the ISS ring (sim/ref/ring.py): the collective contract the card kernel's engine
meets (the Verilated cards: test_ring_cards_rtl.py; the bare node: test_collective_node.py).

Results are checked against numpy float32 additions in the documented ring order (numpy's
own IEEE arithmetic, not sim/ref/arith), placement per the ISA, link byte counters against
the ring schedule, and the RING_ERROR cases.
"""

import numpy as np
import pytest

from gen.config import load_config
from hw.isa import ERROR_CODES, encode
from sim.ref.ring import IssRing

ROOT = __import__("pathlib").Path(__file__).resolve().parent.parent
PROG = 1 << 16


def _cfg(cards, bidirectional):
    cfg = load_config(ROOT / "configs" / "tiny.yaml")
    return cfg.replace(cards=cards, topology="bidirectional_ring" if bidirectional else "ring")


def _expected_allreduce(x, B, bidirectional):
    """Independent of sim/ref: numpy float32 sums in ring order, segment by segment."""
    N, n = x.shape
    nb = -(-n // B)
    pad = np.zeros((N, nb * B), np.float32)
    pad[:, :n] = x
    out = np.zeros(nb * B, np.float32)
    halves = [(0, nb, 1)] if not bidirectional else [(0, -(-nb // 2), 1), (-(-nb // 2), nb // 2, -1)]
    for p0, pb, d in halves:
        for j in range(N):
            lo, hi = p0 + j * pb // N, p0 + (j + 1) * pb // N
            order = [(j + d * k) % N for k in range(1, N + 1)]
            acc = pad[order[0], lo * B:hi * B].copy()
            for c in order[1:]:
                acc = (acc + pad[c, lo * B:hi * B]).astype(np.float32)
            out[lo * B:hi * B] = acc
    return out


@pytest.mark.parametrize("cards", [2, 3, 4])
@pytest.mark.parametrize("bidirectional", [False, True])
@pytest.mark.parametrize("n", [1, 37, 400])
def test_coll_on_the_ring(cards, bidirectional, n, seed):
    cfg = _cfg(cards, bidirectional)
    B = cfg.link.data_bits // 32
    nb = -(-n // B)
    rng = np.random.default_rng(seed + 7 * n + cards)
    x = (rng.standard_normal((cards, n)) * 8).astype(np.float32)
    src, ar, ag, rs = 0, 1024, 2048, 4096
    ring = IssRing(cfg)
    for i, dev in enumerate(ring.devices):
        dev.iss.vsp[src:src + n] = x[i].view(np.uint32)
    prog = [encode("COLL", cop=2, src=src, dst=ar, n=n), encode("COLL", cop=0, src=src, dst=ag, n=n),
            encode("COLL", cop=1, src=src, dst=rs, n=n), encode("HALT")]
    status = ring.run([prog] * cards, PROG)
    assert status == [3 << 8] * cards          # HALT at pc 3
    want = _expected_allreduce(x, B, bidirectional)
    for i, dev in enumerate(ring.devices):
        v = dev.iss.vsp
        assert np.array_equal(v[ar:ar + nb * B], want.view(np.uint32)), f"card {i} all-reduce"
        for j in range(cards):
            assert np.array_equal(v[ag + j * nb * B:ag + j * nb * B + n], x[j].view(np.uint32))
        owned = np.zeros(nb * B, bool)
        halves = [(0, nb)] if not bidirectional else [(0, -(-nb // 2)), (-(-nb // 2), nb // 2)]
        for p0, pb in halves:
            owned[(p0 + i * pb // cards) * B:(p0 + (i + 1) * pb // cards) * B] = True
        assert np.array_equal(v[rs:rs + nb * B][owned], want.view(np.uint32)[owned])
        assert not v[rs:rs + nb * B][~owned].any()            # the rest untouched (zero)
        c = dev.iss.counters
        # all-reduce ~ 2(N-1)/N of the message, all-gather and reduce-scatter (N-1)/N and (N-1)
        assert c["link_tx_bytes"] > 0 and c["link_rx_bytes"] > 0
    total_tx = sum(d.iss.counters["link_tx_bytes"] for d in ring.devices)
    msg = nb * B * 4
    # every byte sent is received; the schedule's totals: AR 2(N-1), RS (N-1), AG N(N-1) messages
    assert total_tx == sum(d.iss.counters["link_rx_bytes"] for d in ring.devices)
    assert total_tx == (2 * (cards - 1) + (cards - 1)) * msg + cards * (cards - 1) * msg


def test_ring_errors():
    cfg = _cfg(3, False)
    R = ERROR_CODES["RING_ERROR"]
    ok = [encode("COLL", cop=2, src=0, dst=64, n=16), encode("HALT")]
    # peers disagree on n
    ring = IssRing(cfg)
    bad = [encode("COLL", cop=2, src=0, dst=64, n=32), encode("HALT")]
    assert ring.run([ok, ok, bad], PROG) == [R, R, R]
    # a card that never joins: it halts normally, the others end with RING_ERROR at the COLL
    ring = IssRing(cfg)
    assert ring.run([ok, ok, [encode("HALT")]], PROG) == [R, R, 0]
    # a card whose operands are out of range: its own error, RING_ERROR for its peers
    ring = IssRing(cfg)
    far = [encode("COLL", cop=2, src=0, dst=cfg.core.vsp_words - 8, n=16), encode("HALT")]
    assert ring.run([ok, far, ok], PROG) == [R, ERROR_CODES["VSP_RANGE"], R]
    # misaligned and overlapping operands
    ring = IssRing(cfg)
    mis = [encode("COLL", cop=2, src=1, dst=64, n=16), encode("HALT")]
    assert ring.run([mis, ok, ok], PROG)[0] == ERROR_CODES["ALIGN"]
    ring = IssRing(cfg)
    ovl = [encode("COLL", cop=2, src=0, dst=8, n=16), encode("HALT")]
    assert ring.run([ovl, ok, ok], PROG)[0] == ERROR_CODES["OVERLAP"]
    # in place is allowed
    ring = IssRing(cfg)
    inplace = [encode("COLL", cop=2, src=0, dst=0, n=16), encode("HALT")]
    assert ring.run([inplace] * 3, PROG) == [1 << 8] * 3
    # an operation that does not exist
    ring = IssRing(cfg)
    nop = [encode("COLL", cop=3, src=0, dst=64, n=16), encode("HALT")]
    assert ring.run([nop] * 3, PROG) == [ERROR_CODES["ILLEGAL_OPCODE"]] * 3
