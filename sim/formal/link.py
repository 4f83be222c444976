"""The link layer (hw/collective/link.py): two ``LinkPort``s joined by a lossy channel.

Port A's ``tx`` feeds port B's ``rx`` and B's ``tx`` feeds A's ``rx``, each through a channel
that, in any cycle, may stall the beat, drop it (taken from the sender, never seen by the
receiver) or flip any of its data bits. A flipped frame must be one the receiver's CRC check
rejects: the harness assumes the port's ``crc_error`` in the cycle after the receiver takes
the last beat of a frame that had a beat flipped (see docs/verification.md for why that is
the channel's contract with the CRC, a separate fact). Drops are not so constrained: a
dropped trailer merges two frames, a dropped payload beat shortens one, and whatever the
receiver then makes of them is the RTL's own business (length, kind and CRC checks as
built).

Each port's user sends frames of 1..F beats whose data say which frame and which beat they
are (and whether the user marked the beat last), any beat in any cycle; the other port's
user takes beats in any cycle. Properties:

- every beat handed to a user is the next one its peer's user sent, with its frame's tag and
  its ``last`` (so nothing is lost in the middle of the stream, duplicated, reordered or
  altered), and no beat is delivered before it was sent;
- credits: a receiver holds at most ``rx_frames`` frames not yet handed on, the sender's limit
  never exceeds the receiver's room, the sender never has more than ``window`` frames
  unacknowledged nor sends past its limit;
- ``link_error`` never falls once raised;
- (``LinkPortHarness``, one port) on a wire that dies, once the port has a frame sent and
  unacknowledged, ``link_error`` rises within ``dead_bound`` cycles.

Internal state (sequence counters) is read from the ports' own elaborated fragments
(``_internals``): the RTL stays as it is.
"""

from amaranth.hdl import Assert, Assume, Cat, Const, Cover, Fragment, Module, Mux, Signal
from amaranth.lib import crc, data, wiring
from amaranth.lib.wiring import In

from hw.collective.link import KIND_ACK, KIND_DATA, KIND_NAK, SEQ_BITS, Beat, LinkPort, Trailer

from .axi import no_reset, past

__all__ = ["LinkHarness", "LinkPortHarness", "dead_bound"]

_TX_STATE = ("base", "next_seq", "send_seq", "limit", "tries", "timer")
_RX_STATE = ("expected", "delivered")


def _fragment(component):
    """Elaborate ``component`` now and make it return that same fragment when elaborated
    again (so that its signals can be named and its parts replaced)."""
    frag = Fragment.get(component, None)

    def again(platform):
        frag.origins = None          # Fragment.get adds the component again
        return frag
    component.elaborate = again
    return frag


def _internals(frag, names):
    """The signals named ``names`` that ``frag``'s own statements drive (each one, once)."""
    found = {}
    for stmts in frag.statements.values():
        for stmt in stmts:
            for sig in stmt._lhs_signals():
                if sig.name in names:
                    if found.get(sig.name, sig) is not sig:
                        raise LookupError(f"two signals named {sig.name!r}")
                    found[sig.name] = sig
    missing = set(names) - set(found)
    if missing:
        raise LookupError(f"no signal {sorted(missing)}")
    return found


def _abstract_crc(frag, roles, poison, junk):
    """Replace the CRC units named in ``roles`` among ``frag``'s parts: a sender's unit
    ("tx") gives 0; a receiver's ("rx") gives 0 for a frame none of whose beats came with
    ``poison``, else ``junk`` (which the channel's contract makes differ from the frame's
    CRC field)."""
    for i, (sub, name, loc) in enumerate(frag.subfragments):
        if name not in roles:
            continue
        unit = sub.origins[0]
        if not isinstance(unit, crc.Processor):
            raise TypeError(f"{name} is not a CRC unit")
        m = Module()
        if roles[name] == "tx":
            m.d.comb += unit.crc.eq(0)
        else:
            bad = Signal(name=f"{name}_poisoned")
            with m.If(unit.valid):
                m.d.sync += bad.eq(Mux(unit.start, 0, bad) | poison)
            with m.Elif(unit.start):
                m.d.sync += bad.eq(0)
            m.d.comb += unit.crc.eq(Mux(bad, junk, 0))
        m.d.comb += unit.match_detected.eq(0)
        frag.subfragments[i] = (Fragment.get(m, None), name, loc)
    if set(roles) - {name for _, name, _ in frag.subfragments}:
        raise LookupError(f"CRC units {sorted(roles)} not all found")


def dead_bound(*, frame_beats, timeout, retries, slack=8):
    """Cycles from port A's first frame sent and unacknowledged on a dead channel to its
    ``link_error``: ``retries + 1`` timeouts of ``timeout + 1`` cycles each, and after each of
    the first ``retries`` the go-back: the frame being read finished (up to F + 1 beats), the
    rewind (1 cycle), the resent frame's start (1) and its F + 1 beats read, during which the
    timer stands at zero; ``slack`` for the output FIFO's room and a control frame taking
    the wire."""
    return (retries + 1) * (timeout + 1) + retries * (2 * (frame_beats + 1) + 2) + slack


def _diff(a, b):
    """a - b modulo 2^SEQ_BITS."""
    return (a - b)[0:SEQ_BITS]


class LinkHarness(wiring.Component):
    """Two ``LinkPort`` s (``data_bits`` wide, frames of ``frame_beats``, ``window`` frames in
    flight, ``rx_frames`` receive frames, ``timeout``, ``retries``) on a lossy channel; data
    both ways with ``duplex``, else from A to B only (B sends acknowledgements). ``far``:
    also the covers beyond 22 cycles (a third frame delivered, one delivered after a
    corrupted frame, link_error), which the cover proof does not reach."""

    def __init__(self, *, data_bits=128, frame_beats=2, window=2, rx_frames=2, timeout=8,
                 retries=1, duplex=True, real_crc=False, flip_bits=1, far=True):
        self.far = far
        self.D, self.F, self.W, self.R = data_bits, frame_beats, window, rx_frames
        self.timeout, self.retries, self.duplex = timeout, retries, duplex
        self.real_crc, self.flip_bits = real_crc, flip_bits
        members = {"a_junk": In(32), "b_junk": In(32)}
        for d in ("ab", "ba"):
            members.update({f"{d}_stall": In(1), f"{d}_drop": In(1), f"{d}_flip": In(flip_bits)})
        for p in ("a", "b"):
            members.update({f"{p}_valid": In(1), f"{p}_last": In(1), f"{p}_ready": In(1)})
        super().__init__(members)

    def elaborate(self, platform):
        m = Module()
        no_reset(m)
        kw = dict(data_bits=self.D, frame_beats=self.F, window=self.W, rx_frames=self.R,
                  timeout=self.timeout, retries=self.retries)
        m.submodules.a = a = LinkPort(**kw)
        m.submodules.b = b = LinkPort(**kw)
        ports = {"a": a, "b": b}
        poison = {p: Signal(name=f"{p}_poison") for p in ports}
        tx, rx = {}, {}
        for p, port in ports.items():
            ftx, frx = _fragment(port.ltx), _fragment(port.lrx)
            tx[p], rx[p] = _internals(ftx, _TX_STATE), _internals(frx, _RX_STATE)
            if not self.real_crc:
                junk = getattr(self, f"{p}_junk")
                _abstract_crc(ftx, {"crc0": "tx", "crc1": "tx"}, poison[p], junk)
                _abstract_crc(frx, {"crc0": "rx", "crc1": "rx"}, poison[p], junk)
                _abstract_crc(_fragment(port), {"ccrc": "tx", "rcrc": "rx"}, poison[p], junk)

        dead = Const(0, 1)
        self._channel(m, a, b, "ab", dead, poison["b"])
        self._channel(m, b, a, "ba", dead, poison["a"])

        for src, dst, p, q in ((a, b, "a", "b"), (b, a, "b", "a")):
            if p == "b" and not self.duplex:
                m.d.comb += [src.send.valid.eq(0), dst.recv.ready.eq(1)]
                continue
            sent = self._source(m, src, p)
            self._sink(m, dst, q, sent, src)
            self._credits(m, tx[p], rx[q], p, q)

        for p, port in ports.items():
            m.d.comb += Assert(~past(m, port.error, f"{p}_error_was") | port.error,
                               f"{p}: link_error fell")
        if self.far:
            m.d.comb += Cover(a.error)
        return m

    def _channel(self, m, src, dst, d, dead, poison):
        """src.tx -> dst.rx: stall, drop or flip data bits in any cycle (dead: drop all).

        ``poison``: the beat the receiver takes now makes its frame other than a frame the
        sender sent (a flipped bit; or a beat dropped since the receiver's last beat of this
        frame; or a frame begun in the middle of a sender's frame). Such a frame fails the
        receiver's CRC check (assumed: the CRC's contract)."""
        stall, drop, flip = (getattr(self, f"{d}_{n}") for n in ("stall", "drop", "flip"))
        passes = ~stall & ~drop & ~dead
        last = src.tx.payload.last
        m.d.comb += [dst.rx.valid.eq(src.tx.valid & passes),
                     dst.rx.payload.data.eq(src.tx.payload.data ^ flip),
                     dst.rx.payload.last.eq(last),
                     src.tx.ready.eq(dead | (~stall & (drop | dst.rx.ready)))]
        took = dst.rx.valid & dst.rx.ready          # handed to the receiver
        taken = src.tx.valid & src.tx.ready         # left the sender
        lost = taken & ~passes
        src_first = Signal(init=1, name=f"{d}_src_first")   # the sender's next beat starts a frame
        rx_first = Signal(init=1, name=f"{d}_rx_first")     # the receiver's next beat starts one
        gap = Signal(name=f"{d}_gap")                       # a beat lost since the last taken
        dirty = Signal(name=f"{d}_dirty")                   # the receiver's frame so far is
        with m.If(taken):                                   # not a sender's frame's beginning
            m.d.sync += src_first.eq(last)
        with m.If(took):
            m.d.sync += [rx_first.eq(last), gap.eq(0)]
        with m.Elif(lost):
            m.d.sync += gap.eq(1)
        m.d.comb += poison.eq(took & ((flip != 0) | Mux(rx_first, ~src_first, gap)))
        now = Mux(rx_first, 0, dirty) | poison
        with m.If(took):
            m.d.sync += dirty.eq(now & ~last)
        ended_bad = past(m, took & last & now, f"{d}_ended_bad")
        m.d.comb += Assume(~ended_bad | dst.crc_error)
        self._seen(m, lost, f"{d}_seen_drop")
        self._seen(m, ended_bad, f"{d}_seen_corrupt")

    def _seen(self, m, cond, name):
        reg = Signal(name=name)
        m.d.sync += reg.eq(reg | cond)
        setattr(self, "_" + name, reg)
        return reg

    def _source(self, m, port, p):
        """Port ``p``'s user: beat ``bi`` of frame ``fi`` carries data (fi, bi, last) and tag fi."""
        F = self.F
        valid, last_in = getattr(self, f"{p}_valid"), getattr(self, f"{p}_last")
        fi = Signal(8, name=f"{p}_fi")
        bi = Signal(range(F), name=f"{p}_bi")
        sent = Signal(8, name=f"{p}_sent")       # beats sent
        last = last_in | (bi == F - 1)
        s = port.send
        m.d.comb += [s.valid.eq(valid), s.payload.data.eq(Cat(fi, bi, last)),
                     s.payload.last.eq(last), s.payload.tag.eq(fi)]
        with m.If(s.valid & s.ready):
            m.d.sync += sent.eq(sent + 1)
            with m.If(last):
                m.d.sync += [fi.eq(fi + 1), bi.eq(0)]
            with m.Else():
                m.d.sync += bi.eq(bi + 1)
        return sent

    def _sink(self, m, port, q, sent, src):
        """Port ``q``'s user: takes beats in any cycle; each must be the next one sent."""
        F = self.F
        r = port.recv
        m.d.comb += r.ready.eq(getattr(self, f"{q}_ready"))
        fi = Signal(8, name=f"{q}_exp_fi")
        bi = Signal(range(F), name=f"{q}_exp_bi")
        got = Signal(8, name=f"{q}_got")
        take = r.valid & r.ready
        with m.If(take):
            m.d.comb += [
                Assert(got != sent, f"{q}: a beat delivered before it was sent"),
                Assert(r.payload.data == Cat(fi, bi, r.payload.last),
                       f"{q}: not the next beat sent (lost, repeated, reordered or altered)"),
                Assert(r.payload.tag == fi, f"{q}: wrong tag"),
            ]
            m.d.sync += got.eq(got + 1)
            with m.If(r.payload.last):
                m.d.sync += [fi.eq(fi + 1), bi.eq(0)]
            with m.Else():
                m.d.sync += bi.eq(bi + 1)
        d = "ab" if q == "b" else "ba"
        done = take & r.payload.last
        retx = self._seen(m, src.retx, f"{q}_seen_retx")
        m.d.comb += [
            Cover(done & retx & (fi == 1)),
            Cover(done & getattr(self, f"_{d}_seen_drop") & (fi == 1)),
        ]
        if self.far:
            m.d.comb += [Cover(done & (fi == 2)),
                         Cover(done & getattr(self, f"_{d}_seen_corrupt") & (fi == 1))]

    def _credits(self, m, t, r, p, q):
        """Sender ``p``'s credit against receiver ``q``'s buffer."""
        W, R = self.W, self.R
        m.d.comb += [
            Assert(_diff(r["expected"], r["delivered"]) <= R,
                   f"{q}: more than rx_frames frames held"),
            Assert(_diff(t["limit"], r["delivered"]) <= R,
                   f"{p}: credit beyond the receiver's room"),
            Assert(~_diff(t["limit"], t["send_seq"])[SEQ_BITS - 1], f"{p}: sent past the credit"),
            Assert(_diff(t["next_seq"], t["base"]) <= W, f"{p}: more than window frames kept"),
            Assert(_diff(t["next_seq"], t["send_seq"]) <= W, f"{p}: sending a frame not committed"),
        ]


class LinkPortHarness(wiring.Component):
    """One ``LinkPort`` whose wire dies: before the cycle the solver chooses (``die``), any
    beats come in (a superset of what a peer sends: any acknowledgements, credits, data) and
    any go out, with any stalls; from then on every beat it sends is lost and none comes in.

    Properties: once it has a frame sent and not acknowledged on the dead wire, ``error``
    rises within ``dead_bound`` cycles, and it never falls; with ``wire``, every frame it
    sends is one its user gave, whole (``_wire``)."""

    def __init__(self, *, data_bits=128, frame_beats=2, window=2, rx_frames=2, timeout=4,
                 retries=1, wire=True):
        self.wire = wire
        self.kw = dict(data_bits=data_bits, frame_beats=frame_beats, window=window,
                       rx_frames=rx_frames, timeout=timeout, retries=retries)
        super().__init__({"die": In(1), "rx_valid": In(1), "rx_beat": In(Beat(data_bits)),
                          "tx_ready": In(1), "valid": In(1), "last": In(1), "ready": In(1)})

    def elaborate(self, platform):
        m = Module()
        no_reset(m)
        kw = self.kw
        m.submodules.a = a = LinkPort(**kw)
        ftx, frx = _fragment(a.ltx), _fragment(a.lrx)
        t = _internals(ftx, _TX_STATE + ("high_water",))
        none, junk = Const(0, 1), Const(1, 32)     # the abstract CRC: every frame passes
        _abstract_crc(ftx, {"crc0": "tx", "crc1": "tx"}, none, junk)
        _abstract_crc(frx, {"crc0": "rx", "crc1": "rx"}, none, junk)
        _abstract_crc(_fragment(a), {"ccrc": "tx", "rcrc": "rx"}, none, junk)
        dead = Signal()
        m.d.sync += dead.eq(dead | self.die)
        m.d.comb += [a.rx.valid.eq(self.rx_valid & ~dead), a.rx.payload.eq(self.rx_beat),
                     a.tx.ready.eq(self.tx_ready | dead),
                     a.recv.ready.eq(self.ready)]
        self._source(m, a, kw["frame_beats"])
        if self.wire:
            self._wire(m, a)
        # what any peer's control frames can say: acknowledge only frames sent (up to the
        # highest sent); credit never taken back, at most rx_frames past the acknowledgement
        ltx = a.ltx
        for valid, seq in ((ltx.ack_valid, ltx.ack_seq), (ltx.nak_valid, ltx.nak_seq)):
            m.d.comb += Assume(~valid | (_diff(seq, t["base"]) <= _diff(t["high_water"], t["base"])))
        m.d.comb += Assume(~ltx.ack_valid | (~_diff(ltx.ack_credit, t["limit"])[SEQ_BITS - 1] &
                                             (_diff(ltx.ack_credit, ltx.ack_seq) <= kw["rx_frames"])))
        bound = dead_bound(frame_beats=kw["frame_beats"], timeout=kw["timeout"],
                           retries=kw["retries"])
        settled = Signal(2, name="dead_age")      # a control frame taken before: 2 cycles
        with m.If(dead & (settled != 3)):
            m.d.sync += settled.eq(settled + 1)
        owed = Signal(name="dead_owed")
        ahead = _diff(t["send_seq"], t["base"])
        m.d.sync += owed.eq(owed | ((settled == 3) & (ahead != 0) & ~ahead[SEQ_BITS - 1]))
        wait = Signal(range(bound + 2), name="dead_wait")
        with m.If(owed & ~a.error & (wait <= bound)):
            m.d.sync += wait.eq(wait + 1)
        m.d.comb += [
            Assert(wait <= bound, "no link_error on a dead wire"),
            Assert(~past(m, a.error, "error_was") | a.error, "link_error fell"),
            Cover(owed & a.error),
        ]
        return m

    def _source(self, m, a, F):
        """The user's frames: beat bi of frame fi carries (fi, bi, last), tag fi."""
        fi = Signal(8, name="fi")
        bi = Signal(range(F), name="bi")
        last = self.last | (bi == F - 1)
        s = a.send
        m.d.comb += [s.valid.eq(self.valid), s.payload.data.eq(Cat(fi, bi, last)),
                     s.payload.last.eq(last), s.payload.tag.eq(fi)]
        with m.If(s.valid & s.ready):
            with m.If(last):
                m.d.sync += [fi.eq(fi + 1), bi.eq(0)]
            with m.Else():
                m.d.sync += bi.eq(bi + 1)

    def _wire(self, m, a):
        """Every data frame on the wire is one the user gave, whole: its payload beats are
        beats 0, 1, ... of one frame fi, the last of them the one the user marked last, and
        its trailer says DATA, seq fi, its length and tag fi; a one-beat frame is an ACK or
        a NAK."""
        F = self.kw["frame_beats"]
        beat = a.tx.payload
        go = a.tx.valid & a.tx.ready
        t = data.View(Trailer, beat.data[0:128])
        first = Signal(init=1, name="w_first")
        wfi = Signal(8, name="w_fi")
        cnt = Signal(8, name="w_cnt")
        marked = Signal(name="w_marked")          # the previous payload beat was marked last
        fib = 8 + (F - 1).bit_length()            # the payload's fields: fi, bi, last
        with m.If(go):
            m.d.sync += first.eq(beat.last)
            with m.If(beat.last & first):
                m.d.comb += Assert((t.kind == KIND_ACK) | (t.kind == KIND_NAK),
                                   "wire: a one-beat frame that is not ACK or NAK")
            with m.Elif(beat.last):
                m.d.comb += Assert((t.kind == KIND_DATA) & (t.seq == wfi) & (t.len == cnt) &
                                   (t.tag == wfi) & marked,
                                   "wire: a trailer not of the frame its payload is")
                m.d.sync += cnt.eq(0)
            with m.Else():
                fi_now = beat.data[0:8]
                m.d.comb += Assert((beat.data[8:fib] == cnt) & (beat.data[fib + 1:] == 0) &
                                   (first | ((fi_now == wfi) & ~marked)),
                                   "wire: a payload beat out of place")
                m.d.sync += [cnt.eq(cnt + 1), marked.eq(beat.data[fib])]
                with m.If(first):
                    m.d.sync += wfi.eq(fi_now)
        resent = Signal(name="w_resent")
        m.d.sync += resent.eq(resent | a.retx)
        m.d.comb += Cover(go & beat.last & ~first & resent)
