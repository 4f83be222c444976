"""cocotb tests of one LinkPort (hw/collective/link.py) driven directly: the test is its user
(``send``, ``recv``) and its peer on the wire (``tx``, ``rx``), so it can put on the wire what
no LinkPort sends. The fabric (sim/fabric.py) joins ports to ports through a channel that
drops frames and flips bits at random; these tests reach what that cannot:

- a control frame's CRC covers the whole beat, the 384 bits above the trailer included: an
  ACK with those bits set, and its CRC over them, is taken; the same frame with one of them
  flipped after its CRC is refused (a CRC error, the sender's window unmoved);
- ``rx``'s payload is ignored while ``rx_valid`` is low (AXI4-Stream): idle cycles carry
  random bits, ``last`` among them, between the beats of frames, of a frame the receiver
  drops for want of room too;
- an ACK that acknowledges frames the port has not sent does not move its window: the frame
  it has sent is still resent at the timeout, whole.

Every frame the port sends is checked as it goes: its CRC field matches its content, a data
frame's payload and tag are those its user gave under that sequence number.

Parameters arrive in the environment: GPTFPGA_PARAMS (JSON: data_bits, frame_beats,
rx_frames, timeout) and GPTFPGA_SEED. The top is the port as Verilog with its flat ports
(``rx_payload``, ``send_payload``, ...): the port itself, or sim/mutate.py's mutant wrapper.
"""

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
BEAT_BYTES = D // 8
KIND_DATA, KIND_ACK, KIND_NAK = 1, 2, 3
# Trailer (the low 128 bits of a trailer beat): (offset, width) of each field
FIELDS = {"kind": (0, 2), "seq": (2, 16), "ack": (18, 16), "credit": (34, 16), "len": (50, 8),
          "pad": (58, 6), "tag": (64, 32), "crc": (96, 32)}
CRC_MASK = ((1 << 32) - 1) << 96
LAST = 1 << D                 # Beat: data, then last


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
        self.cycle = 0
        self.crc_errors = self.retx = 0
        self.sent = {}                  # seq -> (payload, tag): the user's frames, in order
        self._fill = []                 # beats of the user's frame being taken
        self._next = 0

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
        d.tx_ready.value = 1

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
        if int(d.tx_valid.value):
            v = int(d.tx_payload.value)
            self._cur.append(v & ((1 << D) - 1))
            if v & LAST:
                self._check(self._cur)
                self.frames.append(self._cur)
                self._cur = []
        self.crc_errors += int(d.crc_error.value)
        self.retx += int(d.retx.value)
        assert not int(d.error.value), "the port reports its link dead"
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
            assert beats[-1] >> 128 == 0

    async def run(self, cycles):
        for _ in range(cycles):
            await self.step()

    async def until(self, cond, limit, what):
        for _ in range(limit):
            if cond():
                return
            await self.step()
        raise AssertionError(f"{what}: not within {limit} cycles")

    def data_frames(self, start=0):
        """(seq, beats) of the data frames sent since ``frames[start]``."""
        return [(field(f[-1], "seq"), f) for f in self.frames[start:] if len(f) > 1]

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
    for i in range(16):
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
