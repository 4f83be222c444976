"""cocotb tests of one LinkPort (hw/collective/link.py) driven directly: the test is its user
(``send``, ``recv``) and its peer on the wire (``tx``, ``rx``), so it can put on the wire what
no LinkPort sends. The fabric (sim/fabric.py) joins ports to ports through a channel that
drops frames and flips bits at random; these tests reach what that cannot:

- a control frame's CRC covers the whole beat, the 384 bits above the trailer and the
  trailer's fields a control frame does not use (seq, len, pad, tag) included: an ACK with
  those bits set, and its CRC over them, is taken; the same frame with one of them
  flipped after its CRC is refused (a CRC error, the sender's window unmoved);
- ``rx``'s payload is ignored while ``rx_valid`` is low (AXI4-Stream): idle cycles carry
  random bits, ``last`` among them, between the beats of frames, of a frame the receiver
  drops for want of room too;
- an ACK that acknowledges frames the port has not sent does not move its window: the frame
  it has sent is still resent at the timeout, whole;
- the receive side's flow control, beat-exact, while its user stalls and resumes: the credit
  it advertises is its frame buffer plus exactly ``READ_AHEAD`` beats read ahead of its user;
- every frame the receive side accepts, and every frame it consumes, is told to the peer by
  an ACK within ``ACK_BOUND`` cycles, with no resend from the peer (an ACK event in the very
  cycle a pending ACK is taken is not merged into it and lost);
- the send side's read-ahead, with the wire stalled: a NAK taken then is obeyed behind
  exactly the frames started within ``TX_READ_AHEAD`` beats, and no more.

Every frame the port sends is checked as it goes: its CRC field matches its content, a data
frame's payload and tag are those its user gave under that sequence number, the trailer's
fields its kind does not use (a data frame's ack, credit and pad; a control frame's seq, len,
pad and tag) and the bits above the trailer are zero.

Parameters arrive in the environment: GPTFPGA_PARAMS (JSON: data_bits, frame_beats,
rx_frames, timeout, retries) and GPTFPGA_SEED. The top is the port as Verilog with its flat ports
(``rx_payload``, ``send_payload``, ...): the port itself, or sim/mutate.py's mutant wrapper.
"""

import bisect
import itertools
import json
import logging
import os
import random
import zlib
from collections import deque

import cocotb
from cocotb.clock import Clock
from cocotb.triggers import ReadOnly, RisingEdge

P = json.loads(os.environ["GPTFPGA_PARAMS"])
SEED = int(os.environ.get("GPTFPGA_SEED", "1"))
D, F, R, TIMEOUT = P["data_bits"], P["frame_beats"], P["rx_frames"], P["timeout"]
RETRIES = P["retries"]
BEAT_BYTES = D // 8
KIND_DATA, KIND_ACK, KIND_NAK = 1, 2, 3
# Trailer (the low 128 bits of a trailer beat): (offset, width) of each field
FIELDS = {"kind": (0, 2), "seq": (2, 16), "ack": (18, 16), "credit": (34, 16), "len": (50, 8),
          "pad": (58, 6), "tag": (64, 32), "crc": (96, 32)}
CRC_MASK = ((1 << 32) - 1) << 96
LAST = 1 << D                 # Beat: data, then last
# The receiver's read-ahead (LinkRx's deliver stage): it moves beats from its frame buffer
# into its 8-deep output FIFO, ahead of its user, while that FIFO and the read in flight hold
# fewer than 6 beats (``(out_fifo.level + rd_pending) < 6``), and no further.
READ_AHEAD = 6
# The sender's read-ahead (LinkTx's send stage), the same bound on the other side: it reads a
# frame's beats from its window into its 8-deep output FIFO, ahead of the wire, while that FIFO
# and the read in flight hold fewer than 6 beats, and starts a frame only then.
TX_READ_AHEAD = 6
# The cycles from an event the receive side acknowledges (a data frame's trailer taken from
# ``rx``, a frame's last beat taken by the user) to the ACK that reports it on ``tx``: the
# frame's check (1), want_ack set (1), an ACK already being sent (its CRC, then its beat: 3),
# this one's (3), with room to spare. Not a cycle count the port must meet exactly.
ACK_BOUND = 16


def field(t, name):
    off, w = FIELDS[name]
    return (t >> off) & ((1 << w) - 1)


def trailer(**values):
    t = 0
    for name, v in values.items():
        off, w = FIELDS[name]
        assert 0 <= v < 1 << w, (name, v)
        t |= v << off
    return t


def crc(beats):
    """CRC-32 (Ethernet) of a frame's beats (data words, low byte first), its CRC field zero."""
    beats = list(beats)
    beats[-1] &= ~CRC_MASK
    return zlib.crc32(b"".join(b.to_bytes(BEAT_BYTES, "little") for b in beats))


def with_crc(beats):
    beats = list(beats)
    beats[-1] = (beats[-1] & ~CRC_MASK) | crc(beats) << 96
    return beats


def data_frame(payload, seq, tag):
    """The beats (data words) of a data frame as a sender puts it on the wire."""
    return with_crc([*payload, trailer(kind=KIND_DATA, seq=seq, len=len(payload), tag=tag)])


def ctl_frame(kind, ack, credit, upper=0):
    """A control frame's one beat; ``upper``: the bits above the trailer (zero from a
    LinkPort), covered by the CRC."""
    return with_crc([trailer(kind=kind, ack=ack, credit=credit) | upper << 128])[0]


class Port:
    """The port's user and its peer, one call of :meth:`step` a clock cycle.

    ``rx`` (to the port): a queue of beats ``(data, last)``, or ``("idle", payload)``: a cycle
    with ``rx_valid`` low and that on ``rx_payload``; between queued beats the payload is
    random. ``user``: payload beats ``(data, last, tag)`` for ``send``. Taken from the port:
    ``frames`` (each a list of data words, from ``tx``), ``got`` (``recv``'s beats)."""

    def __init__(self, dut, rng):
        self.dut, self.rng = dut, rng
        self.rx, self.user = deque(), deque()
        self.frames, self.got = [], []
        self._cur = []
        self.recv_ready = 1
        self.tx_ready = 1               # the wire's ready (0: the peer stalls the port's sends)
        self.cycle = 0
        self.crc_errors = self.retx = 0
        self.dead_ok = False            # a test that waits for the link to be reported dead
        self.dead_at = None             # the cycle ``error`` was first seen
        self.sent = {}                  # seq -> (payload, tag): the user's frames, in order
        self._fill = []                 # beats of the user's frame being taken
        self._next = 0
        self._ctl_seen = 0              # frames[] read by new_control_frames

    async def reset(self):
        cocotb.start_soon(Clock(self.dut.clk, 10, unit="ns").start())
        self.dut.rst.value = 1
        self._drive()
        for _ in range(4):
            await RisingEdge(self.dut.clk)
        self.dut.rst.value = 0

    def _drive(self):
        d = self.dut
        head = self.rx[0] if self.rx else None
        if head is not None and head[0] != "idle":
            d.rx_valid.value = 1
            d.rx_payload.value = head[0] | (LAST if head[1] else 0)
        else:
            d.rx_valid.value = 0
            d.rx_payload.value = head[1] if head is not None else self.rng.getrandbits(D + 1)
        if self.user:
            data, last, tag = self.user[0]
            d.send_valid.value = 1
            d.send_payload.value = data | (LAST if last else 0) | tag << (D + 1)
        else:
            d.send_valid.value = 0
            d.send_payload.value = self.rng.getrandbits(D + 33)
        d.recv_ready.value = self.recv_ready
        d.tx_ready.value = self.tx_ready

    async def step(self):
        d = self.dut
        self._drive()
        await ReadOnly()
        head = self.rx[0] if self.rx else None
        if head is not None and (head[0] == "idle" or int(d.rx_ready.value)):
            self.rx.popleft()
        if self.user and int(d.send_ready.value):
            data, last, tag = self.user.popleft()
            self._fill.append((data, tag))
            if last:
                self.sent[self._next] = ([b for b, _ in self._fill], self._fill[0][1])
                self._next += 1
                self._fill = []
        if int(d.recv_valid.value) and self.recv_ready:
            v = int(d.recv_payload.value)
            self.got.append((v & ((1 << D) - 1), (v >> D) & 1, v >> (D + 1)))
        if int(d.tx_valid.value) and self.tx_ready:
            v = int(d.tx_payload.value)
            self._cur.append(v & ((1 << D) - 1))
            if v & LAST:
                self._check(self._cur)
                self.frames.append(self._cur)
                self._cur = []
        self.crc_errors += int(d.crc_error.value)
        self.retx += int(d.retx.value)
        if int(d.error.value):
            assert self.dead_ok, "the port reports its link dead"
            if self.dead_at is None:
                self.dead_at = self.cycle
        await RisingEdge(d.clk)
        self.cycle += 1

    def _check(self, beats):
        t = beats[-1] & ((1 << 128) - 1)
        assert field(t, "crc") == crc(beats), f"cycle {self.cycle}: a frame with a wrong CRC"
        if len(beats) > 1:
            seq = field(t, "seq")
            assert seq in self.sent, f"cycle {self.cycle}: frame {seq} sent before its user gave it"
            payload, tag = self.sent[seq]
            assert field(t, "kind") == KIND_DATA and field(t, "len") == len(payload), hex(t)
            assert field(t, "tag") == tag and beats[:-1] == payload, f"frame {seq} not as given"
            unused = ("ack", "credit", "pad")
        else:
            assert field(t, "kind") in (KIND_ACK, KIND_NAK), hex(t)
            unused = ("seq", "len", "pad", "tag")
        # the fields a frame of its kind does not use are zero, and so are the bits above the
        # trailer: the wire carries nothing but the frame
        assert all(field(t, name) == 0 for name in unused) and beats[-1] >> 128 == 0, \
            f"cycle {self.cycle}: {'a data' if len(beats) > 1 else 'a control'} frame with " \
            f"{[n for n in unused if field(t, n)]} or the bits above its trailer not zero: {hex(beats[-1])}"

    async def run(self, cycles):
        for _ in range(cycles):
            await self.step()

    async def until(self, cond, limit, what):
        for _ in range(limit):
            if cond():
                return
            await self.step()
        raise AssertionError(f"{what}: not within {limit} cycles")

    def put_frame(self, beats):
        """Queue a frame's beats on ``rx``, the last marked last."""
        self.rx.extend((b, i == len(beats) - 1) for i, b in enumerate(beats))

    def data_frames(self, start=0):
        """(seq, beats) of the data frames sent since ``frames[start]``."""
        return [(field(f[-1], "seq"), f) for f in self.frames[start:] if len(f) > 1]

    def new_control_frames(self):
        """(kind, ack, credit) of each frame sent since the last call, for a test whose user
        gives the port nothing to send: every one of them must be a control frame."""
        out = []
        for f in self.frames[self._ctl_seen:]:
            assert len(f) == 1, "the port sent a data frame: its user gave none"
            out.append((field(f[0], "kind"), field(f[0], "ack"), field(f[0], "credit")))
        self._ctl_seen = len(self.frames)
        return out

    def acked(self):
        """The last acknowledgement the port sent (the next frame it expects), or None."""
        acks = [field(f[0], "ack") for f in self.frames
                if len(f) == 1 and field(f[0], "kind") == KIND_ACK]
        return acks[-1] if acks else None


def setup(dut):
    rng = random.Random(SEED)
    logging.getLogger("cocotb").info("seed %d", SEED)
    return Port(dut, rng), rng


@cocotb.test()
async def control_crc_covers_the_whole_beat(dut):
    port, rng = setup(dut)
    await port.reset()
    for i in range(24):
        port.user.append((rng.getrandbits(D), 1, 1000 + i))
    # the receiver's initial credit: R frames, then the sender waits
    await port.run(200)
    assert [s for s, _ in port.data_frames()] == list(range(R)), port.data_frames()
    upper_ones = (1 << (D - 128)) - 1
    # an ACK with every bit above the trailer set, its CRC over them: taken
    port.rx.append((ctl_frame(KIND_ACK, 4, 4 + R, upper_ones), 1))
    n = len(port.frames)
    await port.until(lambda: any(s == R + 3 for s, _ in port.data_frames(n)), 300,
                     "an ACK with the bits above its trailer set (CRC over them) was not taken")
    assert port.crc_errors == 0
    # the same with one of those bits flipped after its CRC: refused, nothing moves
    for bit in (128, 179, 289, 374, 406, 480, D - 1):
        beat = ctl_frame(KIND_ACK, 12, 12 + R, upper_ones) ^ 1 << bit
        port.rx.append((beat, 1))
        before, n = port.crc_errors, len(port.frames)
        await port.run(60)
        assert port.crc_errors == before + 1, f"a control frame with bit {bit} flipped was taken"
        assert not port.data_frames(n), f"a control frame with bit {bit} flipped moved the window"
    # random bits above the trailer, the CRC over them: taken
    port.rx.append((ctl_frame(KIND_ACK, 12, 12 + R, rng.getrandbits(D - 128)), 1))
    n = len(port.frames)
    await port.until(lambda: any(s == 15 for s, _ in port.data_frames(n)), 300,
                     "an ACK with random bits above its trailer (CRC over them) was not taken")
    # the trailer's fields a control frame does not use (seq, len, pad, tag) all ones, and
    # random bits above it, the CRC over all of them: taken
    unused = trailer(kind=KIND_ACK, seq=0xFFFF, ack=16, credit=16 + R, len=0xFF, pad=0x3F,
                     tag=0xFFFFFFFF)
    port.rx.append((with_crc([unused | rng.getrandbits(D - 128) << 128])[0], 1))
    n = len(port.frames)
    await port.until(lambda: any(s == 23 for s, _ in port.data_frames(n)), 300,
                     "an ACK with its unused trailer fields set (CRC over them) was not taken")
    assert port.crc_errors == 7


@cocotb.test()
async def idle_rx_payload_is_ignored(dut):
    port, rng = setup(dut)
    await port.reset()
    port.recv_ready = 0
    # more frames than the receiver holds (R in its buffer, a few in its output FIFO) while
    # its user takes nothing: the last ones find no room and are dropped
    frames = [[rng.getrandbits(D) for _ in range(2 + s % 2)] for s in range(R + 6)]

    def put(seq):
        beats = data_frame(frames[seq], seq, 500 + seq)
        for i, b in enumerate(beats):
            port.rx.append((b, i == len(beats) - 1))
            # idle cycles after each beat: random payload, then all ones (last set)
            port.rx.append(("idle", rng.getrandbits(D + 1)))
            port.rx.append(("idle", (1 << (D + 1)) - 1))

    for seq in range(len(frames)):
        put(seq)
    await port.until(lambda: not port.rx, 1000, "the port did not take the beats")
    await port.run(20)
    taken = port.acked()
    assert taken is not None and R <= taken < len(frames), f"frames taken: {taken}"
    assert not port.got and port.crc_errors == 0

    def want(seqs):
        return [(b, int(i == len(frames[s]) - 1), 500 + s) for s in seqs
                for i, b in enumerate(frames[s])]

    port.recv_ready = 1
    await port.run(200)
    assert port.got == want(range(taken)), "the frames delivered are not the frames taken"
    for seq in range(taken, len(frames)):      # the sender's go-back: the dropped frames again
        put(seq)
    await port.until(lambda: not port.rx, 1000, "the port did not take the beats")
    await port.run(100)
    assert port.got == want(range(len(frames)))
    assert port.crc_errors == 0


@cocotb.test()
async def ack_beyond_the_frames_sent_is_ignored(dut):
    port, rng = setup(dut)
    await port.reset()
    port.user.extend([(rng.getrandbits(D), 0, 77), (rng.getrandbits(D), 1, 77)])
    await port.until(lambda: port.data_frames(), 100, "the port did not send its frame")
    # an ACK of frames 0..4 with credit to 5 + R: only frame 0 was ever given and sent
    port.rx.append((ctl_frame(KIND_ACK, 5, 5 + R), 1))
    n = len(port.frames)
    await port.until(lambda: port.data_frames(n), TIMEOUT + 200,
                     "the unacknowledged frame was not resent at the timeout")
    (seq, _), *_ = port.data_frames(n)
    assert seq == 0 and port.retx == 1, (seq, port.retx)
    port.rx.append((ctl_frame(KIND_ACK, 1, 1 + R), 1))
    n = len(port.frames)
    await port.run(TIMEOUT + 200)
    assert not port.data_frames(n), "frames sent after the last one was acknowledged"


@cocotb.test()
async def credit_under_back_pressure(dut):
    """The receive side's flow control, beat-exact, while its user stalls and resumes.

    Contract: the link layer's credit (hw/collective/link.py: the receiver accepts frames into
    a buffer of ``rx_frames`` = R frames and answers ACK(next expected, credit) as frames
    arrive and are consumed; the sender never sends past the credit, so no buffer overflows).
    A frame is consumed when its last beat has left the buffer for the output stage, which
    reads ahead of the user by ``READ_AHEAD`` beats: no more (the output FIFO's bound), and
    no fewer while frames wait. So, with U beats taken by the user and W(b) the number of
    frames wholly within the first b beats the peer sent:

    - every ACK's credit is at most R + W(U + READ_AHEAD), and credits and acknowledgements
      never go back;
    - the test is the peer and sends only within the credit: no frame is dropped (no NAK
      ever, every frame acknowledged);
    - once the user has stalled long enough, the credit is exactly R + W(U + READ_AHEAD)
      and acknowledges every frame sent: the port holds its whole buffer and read-ahead, and
      says so by its ACKs alone (the peer never resends: see ``settle``);
    - a user ready in every cycle of a burst gets a beat in every one of them.

    The user's pattern: a stall from reset, then rounds of a burst of 1 to 12 beats (ready
    every cycle) or random ready, each followed by a stall; one-beat frames first (the credit
    then counts beats), then frames of 1 to 8 beats (read-ahead ends inside a frame). Last,
    every beat is delivered, in order, with its frame's tag and ``last``."""
    port, rng = setup(dut)
    await port.reset()
    lengths = [1] * 200 + [rng.randint(1, 8) for _ in range(400)]
    frames = [[rng.getrandbits(D) for _ in range(n)] for n in lengths]
    ends = list(itertools.accumulate(lengths))

    def whole(beats):
        """Frames wholly within the first ``beats`` beats."""
        return bisect.bisect_right(ends, beats)

    peer = {"next": 0, "credit": R, "ack": 0, "send": True}

    def take_acks():
        """The port's control frames since the last call, checked against the bound."""
        u = len(port.got)
        for kind, ack, credit in port.new_control_frames():
            assert kind == KIND_ACK, \
                f"cycle {port.cycle}: a NAK (a frame sent within credit was dropped or lost)"
            bound = R + whole(u + READ_AHEAD)
            assert peer["credit"] <= credit <= bound, \
                (f"cycle {port.cycle}: credit {credit} after {peer['credit']}, user took {u} "
                 f"beats: at most {bound} (R + the frames within {READ_AHEAD} beats ahead)")
            assert peer["ack"] <= ack <= peer["next"], (port.cycle, ack, peer)
            peer.update(credit=credit, ack=ack)

    async def cycles(n):
        for _ in range(n):
            take_acks()
            s = peer["next"]
            if peer["send"] and not port.rx and s < peer["credit"]:
                assert s < len(frames), "the test ran out of frames"
                port.put_frame(data_frame(frames[s], s, 0x5000 + s))
                peer["next"] = s + 1
            await port.step()
        take_acks()

    async def settle(limit=300):
        """The port's state as its ACKs alone tell it (the peer resends nothing): within
        ``limit`` cycles its credit and acknowledgement reach what the port holds, and stay."""
        u = len(port.got)
        want = R + whole(u + READ_AHEAD)
        for _ in range(limit):
            if (peer["credit"], peer["ack"], peer["next"]) == (want, want, want):
                break
            await cycles(1)
        await cycles(40)
        return u, want

    async def stall(n=150):
        port.recv_ready = 0
        await cycles(n)
        u, want = await settle()
        assert (peer["credit"], peer["ack"], peer["next"]) == (want, want, want), \
            (f"cycle {port.cycle}: user stalled after {u} beats: credit {peer['credit']}, "
             f"ack {peer['ack']} of {peer['next']} frames sent; want {want} (R + the frames "
             f"within {READ_AHEAD} beats ahead), by the port's ACKs alone")

    await stall()
    for rnd in range(40):
        if rnd % 2 == 0:                    # a burst of k beats, the user ready every cycle
            k = rng.randint(1, 12)
            u = len(port.got)
            port.recv_ready = 1
            await cycles(k)
            assert len(port.got) == u + k, \
                f"round {rnd}: {len(port.got) - u} beats in {k} cycles of a ready user"
        else:                               # random ready
            p = rng.choice((0.2, 0.5, 0.8))
            for _ in range(rng.randint(5, 30)):
                port.recv_ready = int(rng.random() < p)
                await cycles(1)
        await stall()
    assert peer["next"] > 200, "no frame longer than one beat was sent"
    peer["send"] = False
    port.recv_ready = 1
    n = peer["next"]
    want = [(b, int(i == len(frames[s]) - 1), 0x5000 + s) for s in range(n)
            for i, b in enumerate(frames[s])]
    await port.until(lambda: len(port.got) >= len(want), 1000, "the frames sent were not delivered")
    await cycles(20)
    assert port.got == want, "the beats delivered are not the frames sent"
    assert port.crc_errors == 0


@cocotb.test()
async def every_event_is_acknowledged(dut):
    """Contract (hw/collective/link.py): the receiver "answers ACK(next expected, credit) as
    frames arrive and are consumed"; ACKs still pending merge, so one ACK may report several
    events, but none is lost. So, with the peer sending nothing twice:

    - once the port has taken the trailer of data frame s (within credit, good CRC), an ACK
      with acknowledgement >= s + 1 is on ``tx`` within ``ACK_BOUND`` cycles;
    - once its user has taken the last beat of frame s (so the port has consumed it), an ACK
      with credit >= s + 1 + R is on ``tx`` within ``ACK_BOUND`` cycles;
    - every control frame is an ACK, credits and acknowledgements never go back, and every
      frame is delivered in order.

    The peer sends frames of 1 to 4 beats (most of one) within the credit, after gaps of 0
    to 30 idle cycles, each with a random 32-bit tag; the user alternates spells of 1 to 20
    cycles of random or full ready (events close together, ACKs merging) with stalls of 20
    to 60 cycles (the last event of a spell then has no later event to carry its news).
    Last, every beat is delivered in order with its frame's tag (every bit of it, through
    stalls that hold a beat on ``recv``) and ``last``."""
    port, rng = setup(dut)
    await port.reset()
    n = 1000
    lengths = [rng.choice((1, 1, 2, 3, 4)) for _ in range(n)]
    frames = [[rng.getrandbits(D) for _ in range(k)] for k in lengths]
    tags = [rng.getrandbits(32) for _ in range(n)]     # every bit of a tag, held while stalled
    ends = list(itertools.accumulate(lengths))
    peer = {"next": 0, "credit": R, "ack": 0, "gap": 0, "in_flight": None}
    due = []                        # (deadline cycle, field, value it must reach, what)
    log = logging.getLogger("cocotb")

    def take_acks():
        for kind, ack, credit in port.new_control_frames():
            assert kind == KIND_ACK, f"cycle {port.cycle}: a NAK (no frame was lost)"
            assert peer["ack"] <= ack <= peer["next"], (port.cycle, ack, peer)
            assert peer["credit"] <= credit, (port.cycle, credit, peer)
            peer.update(ack=ack, credit=credit)
        for item in list(due):
            deadline, name, value, what = item
            if peer[name] >= value:
                due.remove(item)
            else:
                assert port.cycle <= deadline, \
                    (f"cycle {port.cycle}: {what} at cycle {deadline - ACK_BOUND}, and no ACK "
                     f"with {name} >= {value} within {ACK_BOUND} cycles ({name} "
                     f"{peer[name]}): the peer would have to resend")

    usr = {"mode": "random", "left": 0, "p": 0.5}
    got_frames = 0
    while got_frames < n:
        # the peer: the next frame within the credit, after its gap
        if peer["in_flight"] is None and peer["next"] < n and peer["next"] < peer["credit"]:
            if peer["gap"] > 0:
                peer["gap"] -= 1
            else:
                s = peer["next"]
                port.put_frame(data_frame(frames[s], s, tags[s]))
                peer.update(next=s + 1, in_flight=s, gap=rng.choice((0, 0, 0, 1, 2, 5, 30)))
        # the user: spells of random ready, and stalls
        if usr["left"] == 0:
            usr["mode"] = rng.choice(("random", "stall"))
            usr["left"] = rng.randint(1, 20) if usr["mode"] == "random" else rng.randint(20, 60)
            usr["p"] = rng.choice((0.5, 1.0, 1.0))
        usr["left"] -= 1
        port.recv_ready = int(usr["mode"] == "random" and rng.random() < usr["p"])
        before = len(port.got)
        await port.step()
        if peer["in_flight"] is not None and not port.rx:       # its trailer taken
            s = peer["in_flight"]
            due.append((port.cycle + ACK_BOUND, "ack", s + 1, f"frame {s} taken"))
            peer["in_flight"] = None
        while got_frames < n and len(port.got) >= ends[got_frames] > before:
            s = got_frames
            due.append((port.cycle + ACK_BOUND, "credit", s + 1 + R, f"frame {s} delivered"))
            got_frames += 1
        take_acks()
        assert port.cycle < 40 * n, "the frames were not delivered"
    await port.run(ACK_BOUND + 4)
    take_acks()
    assert not due, due
    want = [(b, int(i == len(frames[s]) - 1), tags[s]) for s in range(n)
            for i, b in enumerate(frames[s])]
    assert port.got == want, "the beats delivered are not the frames sent (data, last, tag)"
    assert port.crc_errors == 0 and port.retx == 0
    log.info("%d frames in %d cycles, %d ACKs", n, port.cycle, len(port.frames))


@cocotb.test()
async def nak_for_every_bad_frame(dut):
    """Contract (hw/collective/link.py): the receiver answers "NAK(next expected) once when it
    sees a bad or out-of-order frame": once per expected sequence number, and not lost to an
    ACK going out at the same time. The peer sends good frame s, then, after 0 to 15 idle
    cycles (so that the bad frame's check falls on every cycle of the port's ACK traffic for
    frame s: its accept, its consumption), frame s + 1 with one payload bit flipped after its
    CRC; within ``ACK_BOUND`` cycles of that frame's trailer the port must send NAK(s + 1),
    exactly one. The peer then goes back and sends s + 1 whole; at the end every good frame
    is delivered once, in order."""
    port, rng = setup(dut)
    await port.reset()
    st = {"credit": R, "naks": []}
    given = []

    async def step():
        await port.step()
        for kind, ack, credit in port.new_control_frames():
            if kind == KIND_NAK:
                st["naks"].append(ack)
            else:
                st["credit"] = max(st["credit"], credit)

    async def send(seq, flip=False):
        payload = [rng.getrandbits(D) for _ in range(rng.randint(1, 2))]
        beats = data_frame(payload, seq, 0x9000 + seq)
        if flip:
            beats[rng.randrange(len(payload))] ^= 1 << rng.randrange(D)
        port.put_frame(beats)
        for _ in range(100):
            if not port.rx:
                return payload
            await step()
        raise AssertionError("the port did not take the frame")

    seq = 0
    for trial in range(64):
        for _ in range(200):
            if seq + 2 <= st["credit"]:
                break
            await step()
        else:
            raise AssertionError("no credit for the next two frames")
        given.append((seq, await send(seq)))
        for _ in range(trial % 16):
            await step()
        bad = seq + 1
        await send(bad, flip=True)
        for _ in range(ACK_BOUND):
            if bad in st["naks"]:
                break
            await step()
        assert st["naks"] == [bad], \
            (f"trial {trial} (gap {trial % 16}): NAKs {st['naks']} within {ACK_BOUND} cycles "
             f"of bad frame {bad}, want one NAK({bad})")
        for _ in range(ACK_BOUND):
            await step()
        assert st["naks"] == [bad], f"trial {trial}: NAKs {st['naks']}, want one NAK({bad})"
        st["naks"] = []
        seq = bad                         # the go-back: frame s + 1 again, whole
    for _ in range(100):
        await step()
    want = [(b, int(i == len(p) - 1), 0x9000 + s) for s, p in given for i, b in enumerate(p)]
    assert port.got == want, "the frames delivered are not the good frames sent"
    assert port.crc_errors == 64


@cocotb.test()
async def link_dead_after_retries_in_a_row(dut):
    """Contract (hw/collective/link.py): the sender "goes back to the first unacknowledged
    frame ... when no acknowledgement has come for ``timeout`` cycles, and reports the link
    dead after ``retries`` timeouts in a row". The peer never answers frame 0: it is resent
    at each of 5 timeouts; then an ACK of it (progress) starts the count again. Frame 1 then
    goes unanswered: it is resent exactly ``retries`` times, one a timeout apart, and the
    port reports its link dead at the next timeout, not before; nothing is sent after."""
    port, rng = setup(dut)
    await port.reset()
    port.dead_ok = True
    def give(tag):
        port.user.extend([(rng.getrandbits(D), 0, tag), (rng.getrandbits(D), 1, tag)])

    give(0x1111)
    await port.until(lambda: port.data_frames(), 100, "the port did not send frame 0")
    await port.until(lambda: len(port.data_frames()) == 6, 6 * TIMEOUT + 500,
                     "frame 0 was not resent 5 times")
    assert [s for s, _ in port.data_frames()] == [0] * 6 and port.retx == 5
    assert port.dead_at is None
    port.rx.append((ctl_frame(KIND_ACK, 1, 1 + R), 1))
    give(0x2222)
    await port.until(lambda: any(s == 1 for s, _ in port.data_frames()), 100,
                     "frame 1 was not sent after frame 0 was acknowledged")
    n = len(port.frames)
    sent_at = port.cycle
    await port.until(lambda: port.dead_at is not None, (RETRIES + 2) * (TIMEOUT + 100),
                     "the link was not reported dead")
    resent = [s for s, _ in port.data_frames(n)]
    assert resent == [1] * RETRIES and port.retx == 5 + RETRIES, \
        (f"frame 1 resent {len(resent)} times ({resent}) before the link was reported dead, "
         f"want {RETRIES} (retries), after 5 timeouts of frame 0 that an ACK ended")
    assert port.dead_at - sent_at >= (RETRIES + 1) * TIMEOUT, \
        f"the link reported dead {port.dead_at - sent_at} cycles after frame 1 was sent"
    await port.run(2 * TIMEOUT)
    assert len(port.frames) == n + RETRIES, "frames sent after the link was reported dead"


@cocotb.test()
async def go_back_behind_the_read_ahead(dut):
    """Contract (hw/collective/link.py): the sender "goes back to the first unacknowledged
    frame on a NAK"; what it has already read for the wire goes out first. Its send stage
    reads ahead of the wire by ``TX_READ_AHEAD`` beats and starts a frame only below that, and
    a frame it has started is sent whole. So, with the wire stalled while the user gives 4
    frames of L payload beats (L + 1 beats each with the trailer) and a NAK of the first frame
    then taken, the wire carries, once it moves: the first ceil(TX_READ_AHEAD / (L + 1))
    frames (those started before the NAK), then all 4 again from the first, each of the
    started ones counted as a resend; nothing more once the peer acknowledges them. L runs
    over 1 to 7 in random order (the read-ahead ends on a frame's end and inside a frame),
    twice."""
    port, rng = setup(dut)
    await port.reset()
    lengths = list(range(1, 8)) * 2
    rng.shuffle(lengths)
    for trial, L in enumerate(lengths):
        s0, retx = port._next, port.retx
        port.tx_ready = 0
        for j in range(4):
            port.user.extend((rng.getrandbits(D), int(i == L - 1), 0xB000 + 16 * trial + j)
                             for i in range(L))
        await port.until(lambda: not port.user, 100, "the port did not take its user's frames")
        await port.run(40)
        port.rx.append((ctl_frame(KIND_NAK, s0, s0 + R), 1))
        await port.run(10)
        n = len(port.frames)
        port.tx_ready = 1
        started = -(-TX_READ_AHEAD // (L + 1))
        want = [*range(s0, s0 + started), *range(s0, s0 + 4)]
        k = len(want)
        await port.until(lambda n=n, k=k: len(port.data_frames(n)) >= k, 200,
                         f"trial {trial}: the frames were not sent")
        got = [s for s, _ in port.data_frames(n)]
        assert got == want and port.retx - retx == started, \
            (f"trial {trial}, frames of {L} + 1 beats, the wire stalled, NAK({s0}): frames "
             f"{got} on the wire ({port.retx - retx} resends); want {want}: the "
             f"{started} started within the {TX_READ_AHEAD} beats read ahead, then the go-back")
        port.rx.append((ctl_frame(KIND_ACK, s0 + 4, s0 + 4 + R), 1))
        n = len(port.frames)
        await port.run(60)
        assert not port.data_frames(n), f"trial {trial}: frames sent after all were acknowledged"
    assert port.crc_errors == 0
