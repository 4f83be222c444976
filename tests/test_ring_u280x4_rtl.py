"""u280x4's collective unit on the Verilated appliance: a link beat of one VSP row (R = 1, the
reader's, collector's and writer's one-row branches in hw/core/coll.py) and both ring
directions, on a small core with u280x4's link, ring and vector lanes
(``sim.bench.coll_calibration_config``; tiny, which test_ring_cards_rtl.py runs, has R = 4 and
one direction). The same COLL program as there against the ISS ring, bit for bit; and the
collective unit's time at a decode token's all-gather against the performance model.
In ``make soak``: the card's Verilator build takes about 6 minutes, too long for make test."""

import pytest
from test_ring_cards_rtl import _run_both, assert_rings_agree

from sim.bench import coll_calibration_config

TOL = 0.10          # as tests/test_perf.py holds the model to the tiny cards' COLLs

pytestmark = pytest.mark.soak


@pytest.fixture(scope="module")
def ring():
    return coll_calibration_config()


@pytest.fixture(scope="module")
def ring_lib(ring):
    from sim.system import build_card
    lib, _, _ = build_card(ring)
    return lib


def test_coll_matches_iss_ring_at_a_row_a_beat(ring, ring_lib, seed):
    cards = 4
    assert_rings_agree(ring, cards, *_run_both(ring, cards, seed + cards, ring_lib))


@pytest.mark.parametrize("op, words", [("allgather", 1600), ("allreduce", 1600)])
def test_card_collective_model_matches_rtl_at_a_row_a_beat(ring_lib, op, words):
    """A decode token's sums on 4 cards (the card's unit at a beat a cycle, shared by the two
    directions) against ``coll_cycles``."""
    from sim.bench import calibrate_card_collectives
    [r] = calibrate_card_collectives(cases=[("tiny-u280x4-ring", op, 4, words)], log=print)
    assert abs(r["error"]) <= TOL, r
