"""The AXI multiplexers (hw/dma/mux.py's AxiReadMux and AxiWriteMux): two lawful managers on
one subordinate port.

Each manager port is driven from free inputs under the AXI4 manager rules of
sim/formal/axi.py, assumed instead of asserted (VALID held until READY with the payload
unchanged; INCR bursts of the full width, ID 0, len + 1 <= ``max_burst``, none across a
4 KiB page; at most ``max_outstanding`` bursts of its own accepted and unanswered; W never
ahead of its AW, WLAST on the len+1-th beat; RREADY free, BREADY free but high whenever a
response is offered, rule 6 of the project's managers). The subordinate port ``s`` is held
to every AXI4 manager property (``read_manager`` / ``write_manager``, which drive its
subordinate side lawfully), with ``managers x max_outstanding`` bursts in flight at most:
the mux does not bound the total itself.

Routing, stated against the harness's own record of whose request went out on ``s`` (queues
pushed by the AR/AW handshakes it sees on the ports, apart from the RTL's order FIFO):

- an AR/AW handshake on a manager port happens exactly in a cycle with one on ``s``, with
  the same payload; every one on ``s`` is one manager's;
- a manager sees RVALID/BVALID only while the oldest unanswered request on ``s`` is its own,
  with the subordinate's payload (RLAST included) unchanged; a beat or response is taken on
  ``s`` exactly when a manager takes it, and one offered on ``s`` is offered to that manager;
- each manager sees a lawful subordinate: responses only for what it asked, held until
  taken, RLAST on the len+1-th beat of its own oldest burst;
- writes: every W beat taken on ``s`` is the beat a manager gives in the same cycle; a W
  burst on ``s`` comes from one manager only (no interleaving), and the n-th W burst on ``s``
  belongs to the manager of the n-th AW on ``s``;
- round robin: while a manager's AR/AW waits, at most ``managers - 1`` requests of others
  are accepted on ``s`` (counted in handshakes: the subordinate may stall for ever); reads
  also in cycles: at most ``managers - 1`` cycles with ARREADY high and room in the order
  FIFO go by without it. Writes have no such cycle bound: the winner keeps AW and W until
  its last W beat, which its manager may delay at will.
"""

from functools import partial

from amaranth.hdl import Assert, Assume, Cat, Const, Cover, Module, Mux, Signal
from amaranth.lib import wiring
from amaranth.lib.wiring import In

from hw.axi import Axi4ReadSignature, Axi4WriteSignature
from hw.dma.mux import AxiReadMux, AxiWriteMux

from . import ABC_PDR, Proof, check
from .axi import INCR, Queue, _page_ok, held, no_reset, past, read_env, read_manager, write_env, write_manager

__all__ = ["ReadMuxHarness", "WriteMuxHarness", "PROOFS", "quick", "deep", "run"]


def _assume_stable(m, valid, ready, payload, name):
    was = held(m, valid, ready, name)
    before = past(m, payload, f"{name}_was")
    with m.If(was):
        m.d.comb += [Assume(valid), Assume(Cat(payload) == before)]


def _assume_request(m, name, valid, ready, fields, *, beat_bytes, max_burst):
    """A lawful manager's AR or AW (the assumed twin of axi.py's ``_request``)."""
    addr, length, size, burst, ident = fields
    _assume_stable(m, valid, ready, fields, name)
    with m.If(valid):
        m.d.comb += [Assume(burst == INCR), Assume(size == (beat_bytes - 1).bit_length()),
                     Assume(ident == 0), Assume(length < max_burst),
                     Assume(_page_ok(addr, length, beat_bytes))]


def _who(m, hits, name):
    """The index of the one high bit of ``hits`` (0 when none)."""
    who = Signal(range(max(2, len(hits))), name=name)
    for i, h in enumerate(hits):
        with m.If(h):
            m.d.comb += who.eq(i)
    return who


def _one_at_most(m, hits, what):
    for i in range(len(hits)):
        for j in range(i + 1, len(hits)):
            m.d.comb += Assert(~(hits[i] & hits[j]), f"{what}: two managers at once")


def _any(hits):
    return Cat(*hits).any()


def _all(hits):
    return Cat(*hits).all()


def _answered(m, done, most):
    """Responses completed on ``s``, counted up to ``most`` (more than the FIFO's depth: its
    pointers have wrapped)."""
    n = Signal(range(most + 1), name="answered")
    with m.If(done & (n != most)):
        m.d.sync += n.eq(n + 1)
    return n


def _round_robin(m, p_valid, mine, s_hs, managers, name):
    """While this manager's request waits (``p_valid`` until ``mine``), at most
    ``managers - 1`` of the chances ``s_hs`` (others' handshakes on ``s``, or cycles in which
    ``s`` could take it) pass it by."""
    skipped = Signal(range(managers + 2), name=f"{name}_skipped")
    with m.If(~p_valid | mine):
        m.d.sync += skipped.eq(0)
    with m.Elif(s_hs):
        m.d.sync += skipped.eq(skipped + 1)
    m.d.comb += Assert(skipped <= managers - 1, f"{name}: passed over more than once a round")


class _MuxHarness(wiring.Component):
    def __init__(self, sig, env, *, managers, depth, max_burst, max_outstanding, data_bits):
        self._M, self._depth, self._mb, self._mo = managers, depth, max_burst, max_outstanding
        self._sig, self._bb = sig, data_bits // 8
        members = {f"m{i}": In(sig) for i in range(managers)}
        members.update(env)
        super().__init__(members)

    def _dut(self, m):
        """The mux under test in ``m``, each manager port driven by the harness's own: (the
        mux, its managers' ports)."""
        m.submodules.dut = dut = self._mux(self._sig, managers=self._M, depth=self._depth)
        no_reset(m)
        mgr = [getattr(self, f"m{i}") for i in range(self._M)]
        for i, p in enumerate(mgr):
            wiring.connect(m, wiring.flipped(p), getattr(dut, f"m{i}"))
        return dut, mgr


class ReadMuxHarness(_MuxHarness):
    """``AxiReadMux`` of ``managers`` managers and an order FIFO of ``depth``, each manager
    lawful with at most ``max_outstanding`` bursts of at most ``max_burst`` beats."""

    def __init__(self, *, managers=2, depth=4, max_burst=2, max_outstanding=3, addr_bits=12,
                 data_bits=32, mux=AxiReadMux):
        sig = Axi4ReadSignature(addr_bits=addr_bits, data_bits=data_bits, id_bits=1)
        self._mux = mux
        super().__init__(sig, read_env(data_bits), managers=managers, depth=depth,
                         max_burst=max_burst, max_outstanding=max_outstanding,
                         data_bits=data_bits)

    def elaborate(self, platform):
        m = Module()
        M, K, bb = self._M, self._mo, self._bb
        dut, mgr = self._dut(m)
        s = dut.s
        bus = read_manager(m, s, self, beat_bytes=bb, max_burst=self._mb,
                           max_outstanding=M * K, name="s_ar")
        fields = ("araddr", "arlen", "arsize", "arburst", "arid")
        s_ar, s_r = bus.ar, s.rvalid & s.rready
        ar = [p.arvalid & p.arready for p in mgr]
        r = [p.rvalid & p.rready for p in mgr]
        who = _who(m, ar, "ar_who")
        # whose request each burst in flight on s is, oldest first
        order = Queue(m, depth=M * K + 1, width=len(who), push=s_ar, data=who, pop=bus.last,
                      name="ar_order")
        _one_at_most(m, ar, "AR")
        _one_at_most(m, r, "R")
        m.d.comb += [Assert(s_ar == _any(ar), "AR: a handshake on s without a manager's"),
                     Assert(s_r == _any(r), "R: a beat taken on s and by no manager")]
        offered, outs = Const(0, 1), []
        for i, p in enumerate(mgr):
            n = f"m{i}"
            _assume_request(m, f"{n}_ar", p.arvalid, p.arready, [getattr(p, f) for f in fields],
                            beat_bytes=bb, max_burst=self._mb)
            last = r[i] & p.rlast
            out = Signal(range(K + 2), name=f"{n}_outstanding")
            m.d.sync += out.eq(out + ar[i] - last)
            outs.append(out)
            m.d.comb += Assume(~p.arvalid | (out < K))
            lens = Queue(m, depth=K + 1, width=8, push=ar[i], data=p.arlen, pop=last,
                         name=f"{n}_lens")
            beat = Signal(8, name=f"{n}_beat")
            with m.If(last):
                m.d.sync += beat.eq(0)
            with m.Elif(r[i]):
                m.d.sync += beat.eq(beat + 1)
            r_was = held(m, p.rvalid, p.rready, f"{n}_r")
            payload = [p.rdata, p.rresp, p.rlast, p.rid]
            before = past(m, payload, f"{n}_r_was")
            mine = (order.level != 0) & (order.head == i)
            offered = offered | (mine & p.rvalid)
            m.d.comb += [
                Assert(~ar[i] | (Cat(getattr(p, f) for f in fields) ==
                                 Cat(getattr(s, f) for f in fields)), f"{n}: AR not as on s"),
                Assert(~p.rvalid | (s.rvalid & mine), f"{n}: R of another's burst"),
                Assert(~p.rvalid | (Cat(payload) == Cat(s.rdata, s.rresp, s.rlast, s.rid)),
                       f"{n}: R payload not the subordinate's"),
                Assert(~p.rvalid | (out != 0), f"{n}: R not asked for"),
                Assert(~p.rvalid | (p.rlast == (beat == lens.head)),
                       f"{n}: RLAST not on its burst's len+1-th beat"),
                Assert(~r_was | p.rvalid, f"{n}: RVALID dropped before RREADY"),
                Assert(~r_was | (Cat(payload) == before), f"{n}: R payload changed"),
            ]
            _round_robin(m, p.arvalid, ar[i], s_ar, M, f"{n}_ar")
            # and in cycles: with ARREADY high and room in the order FIFO, at most
            # managers - 1 such cycles go to others while it waits
            _round_robin(m, p.arvalid, ar[i], s.arready & (order.level < self._depth), M,
                         f"{n}_ar_cycles")
        m.d.comb += Assert(~s.rvalid | offered, "R: offered on s, not to its manager")
        # More bursts answered than the order FIFO holds (its pointers wrapped); both
        # managers' bursts in flight; manager 1 served right behind manager 0's RLAST; the
        # order FIFO full with a request waiting; a full burst at a page offset.
        last0 = past(m, r[0] & mgr[0].rlast, "m0_rlast_was")
        m.d.comb += [
            Cover(_answered(m, bus.last, self._depth + 1) == self._depth + 1),
            Cover(_all(o != 0 for o in outs)),
            Cover(r[1] & last0),
            Cover((order.level == self._depth) & _any([p.arvalid for p in mgr])),
            Cover(s_ar & (s.arlen == self._mb - 1) & (s.araddr[:12] != 0)),
        ]
        return m


class WriteMuxHarness(_MuxHarness):
    """``AxiWriteMux`` of ``managers`` managers and an order FIFO of ``depth``, each manager
    lawful with at most ``max_outstanding`` bursts of at most ``max_burst`` beats."""

    def __init__(self, *, managers=2, depth=4, max_burst=2, max_outstanding=3, addr_bits=12,
                 data_bits=32, mux=AxiWriteMux):
        sig = Axi4WriteSignature(addr_bits=addr_bits, data_bits=data_bits, id_bits=1)
        self._mux = mux
        super().__init__(sig, write_env(), managers=managers, depth=depth,
                         max_burst=max_burst, max_outstanding=max_outstanding,
                         data_bits=data_bits)

    def _manager(self, m, p, n, aw, w, b):
        """Assume manager ``p`` lawful; returns its (outstanding, owed) counters."""
        K, mb = self._mo, self._mb
        fields = [p.awaddr, p.awlen, p.awsize, p.awburst, p.awid]
        _assume_request(m, f"{n}_aw", p.awvalid, p.awready, fields, beat_bytes=self._bb,
                        max_burst=mb)
        _assume_stable(m, p.wvalid, p.wready, [p.wdata, p.wstrb, p.wlast], f"{n}_w")
        w_end = w & p.wlast
        ahead = Signal(range(-1, K + 2), name=f"{n}_ahead")
        lens = Queue(m, depth=K + 1, width=max(1, (mb - 1).bit_length()),
                     push=aw & (ahead >= 0) & ~((ahead == 0) & w_end), data=p.awlen,
                     pop=w_end & (ahead > 0), name=f"{n}_lens")
        wlen = Mux(ahead > 0, lens.head, p.awlen)
        wn = Signal(range(mb + 1), name=f"{n}_wn")
        with m.If(w_end):
            m.d.sync += wn.eq(0)
        with m.Elif(w):
            m.d.sync += wn.eq(wn + 1)
        m.d.sync += ahead.eq(ahead + aw - w_end)
        with m.If(p.wvalid):
            m.d.comb += [Assume(ahead >= 0), Assume((ahead > 0) | p.awvalid),
                         Assume(p.wlast == (wn == wlen))]
        owed = Signal(range(K + 2), name=f"{n}_owed")
        done = (w_end & ((ahead > 0) | aw)) | (aw & (ahead < 0))
        m.d.sync += owed.eq(owed + done - b)
        out = Signal(range(K + 2), name=f"{n}_outstanding")
        m.d.sync += out.eq(out + aw - b)
        m.d.comb += [Assume(~p.awvalid | (out < K)), Assume(~p.bvalid | p.bready)]
        return out, owed

    def elaborate(self, platform):
        m = Module()
        M, K, bb = self._M, self._mo, self._bb
        dut, mgr = self._dut(m)
        s = dut.s
        write_manager(m, s, self, beat_bytes=bb, max_burst=self._mb, max_outstanding=M * K,
                      name="s_aw")
        aw_fields = ("awaddr", "awlen", "awsize", "awburst", "awid")
        w_fields = ("wdata", "wstrb", "wlast")
        s_aw, s_w, s_b = (s.awvalid & s.awready, s.wvalid & s.wready, s.bvalid & s.bready)
        aw = [p.awvalid & p.awready for p in mgr]
        w = [p.wvalid & p.wready for p in mgr]
        b = [p.bvalid & p.bready for p in mgr]
        who_aw, who_w = _who(m, aw, "aw_who"), _who(m, w, "w_who")
        # whose request each write on s is, oldest first (B order)
        order = Queue(m, depth=M * K + 1, width=len(who_aw), push=s_aw, data=who_aw, pop=s_b,
                      name="aw_order")
        for hits, what in ((aw, "AW"), (w, "W"), (b, "B")):
            _one_at_most(m, hits, what)
        m.d.comb += [Assert(s_aw == _any(aw), "AW: a handshake on s without a manager's"),
                     Assert(s_w == _any(w), "W: a beat on s without a manager's"),
                     Assert(s_b == _any(b), "B: taken on s and by no manager")]
        # W bursts on s: one manager's each, the n-th one of the n-th AW's manager
        in_burst, owner = Signal(), Signal(len(who_w))
        with m.If(s_w):
            m.d.sync += [in_burst.eq(~s.wlast), owner.eq(who_w)]
        m.d.comb += Assert(~(s_w & in_burst) | (who_w == owner), "W: bursts interleaved")
        pair = Signal()
        aws = Queue(m, depth=M * K + 1, width=len(who_aw), push=s_aw, data=who_aw, pop=pair,
                    name="aw_owners")
        ws = Queue(m, depth=3, width=len(who_w), push=s_w & ~in_burst, data=who_w, pop=pair,
                   name="w_owners")
        m.d.comb += [pair.eq((aws.level != 0) & (ws.level != 0)),
                     Assert(~pair | (aws.head == ws.head), "W: a burst not of its AW's manager")]
        offered, outs = Const(0, 1), []
        for i, p in enumerate(mgr):
            n = f"m{i}"
            out, owed = self._manager(m, p, n, aw[i], w[i], b[i])
            outs.append(out)
            b_was = held(m, p.bvalid, p.bready, f"{n}_b")
            bresp_was = past(m, p.bresp, f"{n}_bresp_was")
            mine = (order.level != 0) & (order.head == i)
            offered = offered | (mine & p.bvalid)
            m.d.comb += [
                Assert(~aw[i] | (Cat(getattr(p, f) for f in aw_fields) ==
                                 Cat(getattr(s, f) for f in aw_fields)), f"{n}: AW not as on s"),
                Assert(~w[i] | (Cat(getattr(p, f) for f in w_fields) ==
                                Cat(getattr(s, f) for f in w_fields)), f"{n}: W not as on s"),
                Assert(~p.bvalid | (s.bvalid & mine), f"{n}: B of another's write"),
                Assert(~p.bvalid | (Cat(p.bresp, p.bid) == Cat(s.bresp, s.bid)),
                       f"{n}: B payload not the subordinate's"),
                Assert(~p.bvalid | (owed != 0), f"{n}: B not owed"),
                Assert(~b_was | (p.bvalid & (p.bresp == bresp_was)), f"{n}: B not held"),
            ]
            _round_robin(m, p.awvalid, aw[i], s_aw, M, f"{n}_aw")
        m.d.comb += Assert(~s.bvalid | offered, "B: offered on s, not to its manager")
        # More writes answered than the order FIFO holds; both managers' writes in flight;
        # a B to manager 1 right behind one to manager 0; manager 1's W right behind manager
        # 0's last; the order FIFO full with an AW waiting; a full burst at a page offset.
        b0 = past(m, b[0], "m0_b_was")
        wlast0 = past(m, w[0] & mgr[0].wlast, "m0_wlast_was")
        m.d.comb += [
            Cover(_answered(m, s_b, self._depth + 1) == self._depth + 1),
            Cover(_all(o != 0 for o in outs)),
            Cover(b[1] & b0),
            Cover(w[1] & wlast0),
            Cover((order.level == self._depth) & _any([p.awvalid for p in mgr])),
            Cover(s_aw & (s.awlen == self._mb - 1) & (s.awaddr[:12] != 0)),
        ]
        return m


_WHY = (
    "Unbounded: ABC's pdr (IC3) proves every assertion in every reachable state, for any "
    "manager behaviour of any length, building the invariant that ties the harness's records "
    "of whose request went out to the mux's order FIFO itself (k-induction alone does not "
    "close: a withheld response keeps a state where they disagree unchanged for any k). "
    "{took} It replaces a bounded run of {depth} cycles, which rested on every state of an "
    "order FIFO of {d} being reached within 2 x {d} + 1 cycles of reset."
)


def _why(depth, d, took):
    return _WHY.format(depth=depth, d=d, took=took)


_QUICK = dict(depth=2, max_outstanding=2, max_burst=2)
_DEEP = dict(depth=4, max_outstanding=3, max_burst=2)
_THREE = "Three managers (the soak's cocotb runs have three; the card two). "

PROOFS = (
    Proof("read_mux", partial(ReadMuxHarness, **_QUICK), "prove", 1,
          _why(10, 2, "About 3 s here."), engine=ABC_PDR),
    Proof("read_mux_cover", partial(ReadMuxHarness, **_QUICK), "cover", 12,
          "Both managers' bursts in flight, manager 1's beat right behind manager 0's RLAST, "
          "the order FIFO full with an AR waiting, more bursts answered than the FIFO holds "
          "(its pointers wrapped) and a full burst at a page offset are all reached: the "
          "assumptions leave the mux its behaviours."),
    Proof("write_mux", partial(WriteMuxHarness, **_QUICK), "prove", 1,
          _why(10, 2, "About 6 s here."), engine=ABC_PDR),
    Proof("write_mux_cover", partial(WriteMuxHarness, **_QUICK), "cover", 12,
          "Both managers' writes in flight, a B to manager 1 right behind one to manager 0, "
          "manager 1's W right behind manager 0's WLAST, the order FIFO full with an AW "
          "waiting, more writes answered than the FIFO holds and a full burst at a page "
          "offset are all reached."),
    Proof("read_mux_deep", partial(ReadMuxHarness, **_DEEP), "prove", 1,
          _why(12, 4, "About a minute here."), deep=True, engine=ABC_PDR),
    Proof("write_mux_deep", partial(WriteMuxHarness, **_DEEP), "prove", 1,
          _why(12, 4, "Under a minute here."), deep=True, engine=ABC_PDR),
    Proof("read_mux3", partial(ReadMuxHarness, managers=3, **_QUICK), "prove", 1,
          _THREE + _why(8, 2, "Under half a minute here."), deep=True, engine=ABC_PDR),
    Proof("write_mux3", partial(WriteMuxHarness, managers=3, **_QUICK), "prove", 1,
          _THREE + _why(8, 2, "Under half a minute here."), deep=True, engine=ABC_PDR),
)


def quick():
    return [p for p in PROOFS if not p.deep]


def deep():
    return [p for p in PROOFS if p.deep]


def run(names=(), *, which=None):
    """Run the mux proofs (``which`` "quick", "deep" or None for all; ``names`` to pick),
    one line each as ``python -m sim.formal`` prints them; returns the failures."""
    proofs = {"quick": quick, "deep": deep}.get(which, lambda: list(PROOFS))()
    failed = 0
    for proof in proofs:
        if names and proof.name not in names:
            continue
        result = check(proof)
        print(result, flush=True)
        failed += not result.passed
    return failed


if __name__ == "__main__":
    import sys
    sys.exit(1 if run(sys.argv[1:]) else 0)
