"""Every formal proof of the project: harness, method, depth, and why that depth is enough.

Quick proofs run in ``make test``; deep ones (``deep=True``) in ``make soak``; all of them in
``make formal``. Depths in cycles from reset; a ``prove`` holds in every reachable state: by
k-induction (``smtbmc``, k = depth) or by ABC's pdr (``ABC_PDR``, no depth).
"""

from functools import partial

from . import ABC_BMC, ABC_PDR, Proof
from .beats import BeatsHarness
from .fetch import FetchHarness
from .link import LinkHarness, LinkPortHarness, dead_bound
from .mux import PROOFS as _MUX_PROOFS
from .reader import ReaderHarness
from .regs import ControlHarness
from .scoreboard import ScoreboardHarness
from .store import StoreHarness

__all__ = ["PROOFS", "quick", "deep"]

_PDR = (
    "Unbounded: ABC's pdr (IC3) proves every assertion in every reachable state, for any "
    "input sequence of any length, by building an inductive invariant of its own (no depth "
    "to argue, no invariant stated in the harness); {more}")

_READER_WHY = _PDR.format(more=(
    "about 2 s here. It replaces a bounded run of {n} cycles, which rested on the argument that "
    "every state of the engine (the command being cut, up to max_outstanding bursts in "
    "flight, the skid buffer) is reached within 2 + max_outstanding * (max_burst + 1) + 2 "
    "cycles of reset."))

_DEAD = dead_bound(frame_beats=2, timeout=4, retries=1)

_LINK_DEAD_WHY = (
    "Bounded. One port (frames of 2 beats, window 2, 2 receive frames, timeout 4, 1 retry) "
    "with any peer's acknowledgements, credits and data before its wire dies; link_error "
    "must follow a frame "
    f"sent and unacknowledged on the dead wire within {_DEAD} cycles "
    "((retries + 1) timeouts of timeout + 1 cycles, a go-back between them, slack), so a "
    "depth of d covers every death whose first unacknowledged frame comes by cycle "
    f"d - {_DEAD} - 2: here a window of frames sent, acknowledged or not, and a go-back.")

_LINK_WHY = (
    "Bounded: two ports (frames of 2 beats, window 2, 2 receive frames, timeout 8, 1 retry), "
    "data {way}, any drops, stalls and CRC-detected corruption. The first beat reaches the "
    "peer's user at step 13 at the earliest (fill, trailer, replay memory, output FIFO, wire, "
    "check, receive buffer, output FIFO); {reach}")

_LINK_PORT_DEEP_WHY = (
    "Bounded, with ABC's bmc3 (smtbmc would take about 20 minutes at this depth). Earliest "
    "steps with any peer: a NAK 2, an acknowledgement 7, data frames' trailers on the wire 9, "
    "12, 16 (the third frame, in a reused slot) and 19; a go-back's first resend 10 (after a "
    "NAK), the first timeout 11, a resend after a timeout alone 14, the whole window resent "
    "after timeouts alone 18, link_error (a second timeout without progress) 19, a fifth "
    "frame 20. 24 cycles hold all of these and 4 cycles or more after each: third and fourth "
    "frames filled into reused slots after go-backs with acknowledgements arriving during "
    "the resend, a full window resent, the wire after link_error.")

PROOFS = (
    Proof("reader", ReaderHarness, "prove", 1, _READER_WHY.format(n=24), engine=ABC_PDR),
    Proof("reader_cover", ReaderHarness, "cover", 20,
          "Full bursts at a page offset, max_outstanding bursts in flight and a command's last "
          "beat are all reached: the assumptions leave the engine its behaviours."),
    Proof("reader_tiny", partial(ReaderHarness, data_bits=256, max_burst=32, max_outstanding=8),
          "prove", 1, _PDR.format(more=(
              "tiny.yaml's reader (256-bit beats, 32-beat bursts, 8 outstanding), about 2 s. "
              "It replaces a bounded run of 40 cycles (reader_deep).")), engine=ABC_PDR),
    Proof("fetch", FetchHarness, "prove", 1, _PDR.format(more=(
        "about 3 s here: any start, stop, program address, length and buffer base, any "
        "number of chunks. It replaces bounded runs of 16 and 36 cycles (fetch_deep).")),
        engine=ABC_PDR),
    Proof("fetch_cover", FetchHarness, "cover", 24,
          "A 16-beat burst at a page offset and the fourth instruction delivered are reached."),
    Proof("store", StoreHarness, "bmc", 12,
          "Single-beat writes: a channel reaches max_outstanding (2) writes owed within 4 "
          "cycles, both channels within 8; 12 adds responses, stalls and reuse of the room."),
    Proof("store_deep", partial(StoreHarness, channels=2, max_outstanding=4), "bmc", 20,
          "Four writes owed per channel, filled and drained again.", deep=True),
    Proof("beats", BeatsHarness, "bmc", 8,
          "A read run or a write run reaches the AXI ports 2 cycles after it is given; 8 "
          "cycles cover bursts at any page offset (split in two), the first responses and a "
          "second run behind the first.", map_memories=False),
    Proof("beats_deep", BeatsHarness, "bmc", 14,
          "Four runs in flight on both channels, queues full, runs split across pages.",
          deep=True),
    Proof("control", ControlHarness, "prove", 4,
          "k-induction: the properties hold in every reachable state, at any depth."),
    Proof("control_cover", ControlHarness, "cover", 10,
          "A write to CTRL answered and a read answered are reached."),
    Proof("scoreboard", ScoreboardHarness, "bmc", 6,
          "Bounded: up to 5 instructions in flight with the watched one among them, and "
          "completions in any order across units. Each hazard pair of the specification is "
          "checked against every entry slot the watched instruction can take within that "
          "depth; deeper runs cost minutes a cycle (8 entries of 4 ranges).", map_memories=True),
    Proof("scoreboard_deep", ScoreboardHarness, "bmc", 8,
          "Up to 7 instructions in flight: entries freed and reused.", deep=True,
          map_memories=True),
    Proof("link_port", LinkPortHarness, "bmc", 14,
          "Bounded. One port (frames of 2 beats, window 2, 2 receive frames, timeout 4, 1 "
          "retry) with any peer's acknowledgements and credits: every frame on its wire is one "
          "its user gave, whole. 14 cycles cover two frames sent, a timeout, its go-back and "
          "acknowledgements arriving during the resend (the slot reuse this proof found).",
          map_memories=True),
    Proof("link_port_deep", LinkPortHarness, "bmc", 24, _LINK_PORT_DEEP_WHY,
          deep=True, map_memories=True, engine=ABC_BMC),
    Proof("link_dead", partial(LinkPortHarness, wire=False), "bmc", 40, _LINK_DEAD_WHY,
          deep=True, map_memories=True),
    Proof("link", partial(LinkHarness, duplex=False), "bmc", 14, _LINK_WHY.format(
        way="one way (B sends acknowledgements only)",
        reach="14 cycles reach the first frame delivered with drops, corruption and NAKs on "
              "the way, not a second frame (step 16) nor a frame delivered after a "
              "retransmission (19). link_deep goes deeper; the sender's side is proved deeper by "
              "link_port_deep."), map_memories=True),
    Proof("link_deep", LinkHarness, "bmc", 24, _LINK_WHY.format(
        way="both ways (data frames and acknowledgements share each wire)",
        reach="with ABC's bmc3 (smtbmc: 11 minutes at depth 22). Earliest steps: a frame "
              "delivered each way 13, a second frame 16, a retransmission read 18, a frame "
              "delivered after one 19. 24 cycles hold these and 5 cycles more, so a "
              "receiver taking a duplicate or a gap is caught (a receiver accepting any "
              "sequence number fails at step 16). Not reached within 22: a third frame "
              "delivered, link_error (two timeouts of 8 cycles)."),
          deep=True, map_memories=True, engine=ABC_BMC),
    Proof("link_cover", partial(LinkHarness, duplex=False, far=False), "cover", 22,
          "A second frame delivered after a retransmission, and one after a lost beat: the "
          "channel's assumptions leave the protocol its recoveries. (A third frame, a frame "
          "after a corrupted one and link_error in the pair are not reached in 22 cycles; "
          "link_dead proves link_error rises.)", deep=True, map_memories=True),) + _MUX_PROOFS


def quick():
    return [p for p in PROOFS if not p.deep]


def deep():
    return [p for p in PROOFS if p.deep]
