"""The collective unit: COLL instructions executed by the card's ring node (hw/collective).

    COLL -> CollSequencer -> CollGeometry -> node's segment tables
                          -> (all-gather: VspCopy / HbmCopy, the own block into place)
                          -> node run:  node read ports  -> VspBeatReader | HbmBeatReader (Prefetcher x 4)
                                        node write ports -> StreamArbiter -> VspBeatWriter | HBM

The node moves link beats of B = link.data_bits / 32 words; the scratchpad moves rows of P
(vector_lanes) words, so each beat is R = B / P rows. The unit computes what the driver of
the bare node (sim/fabric.py) writes by hand, from the instruction and the ``card``
register (hw/ring.py's geometry): nb = ceil(n / B) beats, the ring parts (all of it one way,
or ceil(nb / 2) beats right and the rest left when the ``card`` register says the ring runs
both ways) and each part's N segments, start_j = floor(j pb / N), found with one 22-step
division per part and a running remainder. Then:

- all-gather runs in place: the unit first copies the card's own input (zero-padded to nb
  beats) to its block at dst + card * nb * B, and the node sends every block from there;
- reduce-scatter and all-reduce read the input at src (words past n read as +0, the
  padding of the ISA) and write the result at dst.

The node's three memory ports per ring direction share one VSP read port and one VSP write
port of this unit, arbitrated round-robin per beat; each beat is R row accesses and the
reader and writer take a beat every R cycles (the next beat's rows follow the last row of
the one before without a gap), so with both ring directions running each moves a beat every
2R cycles: on u280x4 (R = 1) half the link's 62.5 B/cycle once a message outgrows the link
latency (measured, and modelled by host/perf.py: docs/performance.md, "The collective unit's
own time" and "The collective unit without its idle cycle").

With the COLL's ``hbm`` bit, src and dst are HBM stripe rows and the node's ports go to HBM
instead (hw/dma/beats.py, shared with the DMA on every channel by hw/dma/mux.py): each read
port through a prefetcher that streams ahead of the engine's requests in runs (bursts per
channel), restarting where a request breaks the sequence and dropping what the old stream
fetched beyond its last request; writes gathered into bursts by HbmBeats. All-gather's own
block is copied HBM to HBM first, its writes answered before the node starts. The COLL is
done when every write is answered and the prefetchers are empty (docs/collectives.md).

Errors (RING_ERROR, with the pc of the COLL): a link whose retries ran out, a frame the
schedule did not expect (a peer that disagrees on the COLL: frames carry n's low bits and
the cop in their tags), or ``timeout`` cycles without a
beat on either link (a peer that never reaches its COLL). After one the ring's link state is
unknown: the unit refuses further COLLs (RING_ERROR at once) until the kernel is reset.
"""

from amaranth.hdl import Cat, Const, Module, Mux, Signal
from amaranth.lib import data, stream, wiring
from amaranth.lib.fifo import SyncFIFO, SyncFIFOBuffered
from amaranth.lib.wiring import In, Out

from hw import stream as hw_stream
from hw.arbiter import StreamArbiter
from hw.arith.pipe import delay
from hw.arith.units import Fp32ToFp16
from hw.collective.engine import MemReadPort, MemWrite, SegEntry
from hw.collective.link import Beat
from hw.collective.node import CollNode, node_kwargs
from hw.dma.beats import BeatWrite, ReadRun, page_beats
from hw.isa import ADDR_BITS
from hw.ring import DIV_BITS, MAX_CARDS, MIN_RING_LINK_BITS, OP_AG, node_params

from .cmds import CollCmd
from .vpu_writeback import XbWrite
from .vsp import ReadPort, WritePort

__all__ = ["CollUnit", "CollSequencer", "CollGeometry", "VspBeatReader", "VspBeatWriter",
           "XbCopy", "VspCopy", "HbmCopy", "Prefetcher", "HbmBeatReader", "ring_ok"]

AG_LIMIT = 1 << 29      # all-gather's sends read their own padded block: no word past the input
COPY_AHEAD = 64         # HBM own-block copy: reads at most this many beats ahead of the writes


def ring_ok(card_reg):
    """The ``card`` register describes a ring this unit can run: 2..MAX_CARDS cards, id < cards."""
    card, cards = card_reg[0:8], card_reg[8:16]
    return (cards >= 2) & (cards <= MAX_CARDS) & (card < cards)


def _log2(v):
    assert v & (v - 1) == 0, v
    return v.bit_length() - 1


def _lane_mask(word0, limit, lanes):
    """One bit per word of a row or beat starting at word ``word0``: the word is below ``limit``."""
    return Cat(*[(word0 + lane) < limit for lane in range(lanes)])


def _masked(words, mask):
    """``words`` with the 32-bit words whose ``mask`` bit is low read as +0."""
    return Cat(*[Mux(mask[lane], words[32 * lane:32 * lane + 32], 0) for lane in range(len(mask))])


def _share(m, sel, port, a, b):
    """Stream ``port`` (a producer's side) driven by ``a`` when ``sel``, else by ``b``; both
    see its ``ready`` (each transfers only while it is the one driving)."""
    with m.If(sel):
        m.d.comb += [port.valid.eq(a.valid), port.payload.eq(a.payload)]
    with m.Else():
        m.d.comb += [port.valid.eq(b.valid), port.payload.eq(b.payload)]
    m.d.comb += [a.ready.eq(port.ready), b.ready.eq(port.ready)]


def _share_reads(m, sel, port, a, b):
    """Read port ``port`` (a requester's side: hw/stream.py ReadPort) used by requester ``a``
    when ``sel``, else by ``b``: requests from the one selected, replies to it."""
    _share(m, sel, port.req, a.req, b.req)
    m.d.comb += [a.resp.payload.eq(port.resp.payload), b.resp.payload.eq(port.resp.payload)]
    with m.If(sel):
        m.d.comb += a.resp.valid.eq(port.resp.valid)
    with m.Else():
        m.d.comb += b.resp.valid.eq(port.resp.valid)


def _serve(m, sel, port, a, b):
    """Read port ``port`` (a requester's) served by memory ``b`` when ``sel``, else by ``a``:
    both see its requests (each takes them only while it serves); the replies and ``ready``
    come from the one selected."""
    for mem in (a, b):
        m.d.comb += [mem.req.valid.eq(port.req.valid), mem.req.payload.eq(port.req.payload)]
    m.d.comb += [port.req.ready.eq(Mux(sel, b.req.ready, a.req.ready)),
                 port.resp.valid.eq(Mux(sel, b.resp.valid, a.resp.valid)),
                 port.resp.payload.eq(Mux(sel, b.resp.payload, a.resp.payload))]


class CollSequencer(wiring.Component):
    """The COLL's sequence: geometry, the own block's copy, the node's run, the drain.

    Parameters
    ----------
    beat_words : int
        B, words of a link beat (a power of two).
    timeout : int
        Cycles of the run without progress before the COLL fails.

    Members
    -------
    cmd : In(stream(CollCmd))  taken in IDLE
    insn : Out(CollCmd); nb : Out(DIV_BITS + 1)  the COLL and its beats (registered on cmd)
    geometry_start : Out(1); geometry_done : In(1)
    vsp_copy_start, hbm_copy_start : Out(1); vsp_copy_done, hbm_copy_done : In(1)
        all-gather's copy of the own block (VSP, or HBM with hbm)
    hw_idle : In(1)  every HBM write answered
    start : Out(1)  pulse: the node and the prefetchers start
    running : Out(1)  the node runs; draining : Out(1)  the prefetchers drop what is left
    node_busy, moving : In(1)  the node, the VSP adapters still at work
    failed : In(1)  a link error or an order error of the node
    progress : In(1)  something moved this cycle (no-progress timeout)
    pf_idle : In(1)  the prefetchers and their runs are empty
    done : Out(1)  pulse per COLL; err : Out(1)  pulse with ``done``: RING_ERROR
    busy : Out(1)  a COLL is taken and not done

    Timing: IDLE takes the command (1 cycle), the geometry starts the cycle after; each
    transition is registered (the next state follows the cycle a ``*_done`` is seen). RUN
    fails after ``timeout`` cycles without progress; after a failure every COLL fails at once.
    """

    def __init__(self, *, beat_words, timeout):
        self._lb = _log2(beat_words)
        self._timeout = timeout
        super().__init__({
            "cmd": In(stream.Signature(CollCmd)), "insn": Out(CollCmd), "nb": Out(DIV_BITS + 1),
            "geometry_start": Out(1), "geometry_done": In(1),
            "vsp_copy_start": Out(1), "vsp_copy_done": In(1),
            "hbm_copy_start": Out(1), "hbm_copy_done": In(1), "hw_idle": In(1),
            "start": Out(1), "running": Out(1), "draining": Out(1),
            "node_busy": In(1), "moving": In(1), "failed": In(1), "progress": In(1),
            "pf_idle": In(1), "done": Out(1), "err": Out(1), "busy": Out(1),
        })

    def elaborate(self, platform):
        m = Module()
        insn = self.insn
        dead = Signal()
        idle = Signal(range(self._timeout + 1))
        is_ag = insn.cop == OP_AG
        with m.FSM():
            with m.State("IDLE"):
                m.d.comb += self.cmd.ready.eq(1)
                with m.If(self.cmd.valid):
                    p = self.cmd.payload
                    m.d.sync += [insn.eq(p), self.nb.eq((p.n + ((1 << self._lb) - 1)) >> self._lb)]
                    with m.If(dead):
                        m.next = "FAIL"
                    with m.Else():
                        m.d.comb += self.geometry_start.eq(1)
                        m.next = "GEOMETRY"
            with m.State("GEOMETRY"):
                with m.If(self.geometry_done):
                    with m.If(is_ag & insn.hbm):
                        m.d.comb += self.hbm_copy_start.eq(1)
                        m.next = "HBM_COPY"
                    with m.Elif(is_ag):
                        m.d.comb += self.vsp_copy_start.eq(1)
                        m.next = "VSP_COPY"
                    with m.Else():
                        m.next = "START"
            with m.State("VSP_COPY"):
                with m.If(self.vsp_copy_done):
                    m.next = "START"
            with m.State("HBM_COPY"):
                with m.If(self.hbm_copy_done):
                    m.next = "SETTLE"
            with m.State("SETTLE"):
                # every write of the copy answered before the node reads the block
                with m.If(self.hw_idle):
                    m.next = "START"
            with m.State("START"):
                m.d.comb += self.start.eq(1)
                m.d.sync += idle.eq(0)
                m.next = "RUN"
            with m.State("RUN"):
                m.d.comb += self.running.eq(1)
                m.d.sync += idle.eq(Mux(self.progress, 0, idle + 1))
                with m.If(self.failed | (idle == self._timeout)):
                    m.next = "FAIL"
                with m.Elif(~self.node_busy & ~self.moving):
                    m.next = "DRAIN"
            with m.State("DRAIN"):
                # prefetched beats nobody asked for are dropped; every write answered
                m.d.comb += self.draining.eq(1)
                with m.If(self.pf_idle & self.hw_idle):
                    m.d.comb += self.done.eq(1)
                    m.next = "IDLE"
            with m.State("FAIL"):
                m.d.comb += [self.done.eq(1), self.err.eq(1)]
                m.d.sync += dead.eq(1)
                m.next = "IDLE"
        m.d.comb += self.busy.eq(~self.cmd.ready)
        return m


class CollGeometry(wiring.Component):
    """The segment tables of a COLL, computed in hardware and written into the node:
    hw/ring.py's ``segment_table`` and the longest segment's chunks per ring direction.

    Per part, pb = qp N + rp by a restoring division (one quotient bit a cycle), then entry j
    a cycle: start_j = j qp + floor(j rp / N) by a running remainder (no multiplier).

    Parameters
    ----------
    frame_beats : int
        F, beats of a chunk (a power of two).

    Members
    -------
    start : In(1)  pulse: compute for ``ag``, ``nb``, ``cards``, ``bidir`` (held until done)
    ag : In(1)  all-gather (segment j: card j's block of the part)
    nb : In(DIV_BITS + 1); cards : In(range(MAX_CARDS + 1)); bidir : In(1)
    seg_we, seg_left, seg_addr, seg_data : Out  the node's table writes (one entry a cycle)
    max_chunks_r, max_chunks_l : Out(24)  registered: each direction's longest segment's chunks
    done : Out(1)  pulse in the cycle of the last table write

    Timing: the cycle after ``start``, per ring direction: 1 cycle to load the divider,
    DIV_BITS cycles of division, N cycles of table writes.
    """

    def __init__(self, *, frame_beats):
        self._lf = _log2(frame_beats)
        super().__init__({
            "start": In(1), "ag": In(1), "nb": In(DIV_BITS + 1), "cards": In(range(MAX_CARDS + 1)),
            "bidir": In(1),
            "seg_we": Out(1), "seg_left": Out(1), "seg_addr": Out(range(MAX_CARDS)),
            "seg_data": Out(SegEntry), "max_chunks_r": Out(24), "max_chunks_l": Out(24),
            "done": Out(1),
        })

    def elaborate(self, platform):
        m = Module()
        N, nb, ag = self.cards, self.nb, self.ag
        part = Signal()                                   # 0: right-hand ring, 1: left-hand
        pb0 = Signal(DIV_BITS + 1)
        m.d.comb += pb0.eq(Mux(self.bidir, (nb + 1) >> 1, nb))
        pb = Mux(part, nb - pb0, pb0)
        p0 = Mux(part, pb0, 0)
        # division pb = qp N + rp (restoring, one bit a cycle), then the table's running sums
        dvd, qp, rp = Signal(DIV_BITS), Signal(DIV_BITS), Signal(range(2 * MAX_CARDS))
        step = Signal(range(DIV_BITS + 1))
        j = Signal(range(MAX_CARDS + 1))
        s0, racc, jnb = Signal(DIV_BITS + 1), Signal(range(2 * MAX_CARDS)), Signal(24)
        rem2 = Cat(dvd[DIV_BITS - 1], rp)                 # (rp << 1) | next dividend bit
        carry = (racc + rp) >= N
        seg_beats = Mux(ag, pb, qp + carry)
        seg_at = Mux(ag, jnb + p0, s0 + p0)
        longest = Mux(ag, pb, qp + (rp != 0))
        chunks = (longest + ((1 << self._lf) - 1)) >> self._lf
        with m.FSM():
            with m.State("IDLE"):
                with m.If(self.start):
                    m.d.sync += part.eq(0)
                    m.next = "DIV0"
            with m.State("DIV0"):
                m.d.sync += [dvd.eq(pb), qp.eq(0), rp.eq(0), step.eq(0)]
                m.next = "DIV"
            with m.State("DIV"):
                ge = rem2 >= N
                m.d.sync += [rp.eq(Mux(ge, rem2 - N, rem2)), qp.eq(Cat(ge, qp)), dvd.eq(dvd << 1),
                             step.eq(step + 1)]
                with m.If(step == DIV_BITS - 1):
                    m.d.sync += [j.eq(0), s0.eq(0), racc.eq(0), jnb.eq(0)]
                    m.next = "TABLE"
            with m.State("TABLE"):
                m.d.comb += [self.seg_we.eq(1), self.seg_left.eq(part), self.seg_addr.eq(j),
                             self.seg_data.src.eq(seg_at), self.seg_data.dst.eq(seg_at),
                             self.seg_data.beats.eq(seg_beats)]
                m.d.sync += [j.eq(j + 1), s0.eq(s0 + seg_beats), jnb.eq(jnb + nb),
                             racc.eq(Mux(carry, racc + rp - N, racc + rp))]
                with m.If(j == N - 1):
                    with m.If(part):
                        m.d.sync += self.max_chunks_l.eq(chunks)
                    with m.Else():
                        m.d.sync += [self.max_chunks_r.eq(chunks), self.max_chunks_l.eq(0)]
                    with m.If(~part & self.bidir):
                        m.d.sync += part.eq(1)
                        m.next = "DIV0"
                    with m.Else():
                        m.d.comb += self.done.eq(1)
                        m.next = "IDLE"
        return m


class VspBeatReader(wiring.Component):
    """The node's four read ports served from the VSP: a beat is R row reads.

    Requests are taken round-robin, one at a time; each beat's rows are read one per grant of
    the VSP port, words at or past the port's limit read as +0 (rows wholly past it read
    ``pad_row``, a row that exists); the rows are joined (row 0 in the low bits) and the beat
    goes back to its port, in request order.

    Parameters
    ----------
    data_bits : int
        The node's beat (B = data_bits / 32 words).
    lanes, row_bits : int
        The VSP port's row (P words) and address width.

    Members
    -------
    ports : In(MemReadPort).array(4)  the node's read ports (beat addresses relative to base)
    base : In(24).array(4)  the row of each port's beat 0
    limit : In(30).array(4)  each port's words at or past it read as +0
    pad_row : In(24)
    rd : Out(vsp.ReadPort)
    en : In(1)  the node runs on the VSP: requests are taken, rows read, beats delivered
    busy : Out(1)  a beat is being read or awaits its rows

    Timing: a request is taken in the cycle it is granted (when fewer than 2 wait and fewer
    than 4 beats are in flight: registered state, never the VSP's grant); its rows are asked
    for from the cycle after the last row of the beat before (or after it was taken), one per
    cycle the VSP grants, so a beat takes R cycles; the beat goes back in the cycle its last
    row comes in.
    """

    def __init__(self, *, data_bits, lanes, row_bits):
        self.D, self.P = data_bits, lanes
        self.B = data_bits // 32
        self.R = self.B // lanes
        super().__init__({
            "ports": In(MemReadPort(data_bits)).array(4),
            "base": In(24).array(4), "limit": In(30).array(4), "pad_row": In(24),
            "rd": Out(ReadPort(row_bits, lanes)), "en": In(1), "busy": Out(1),
        })

    def elaborate(self, platform):
        m = Module()
        P, R, D = self.P, self.R, self.D
        lr = _log2(R)
        m.submodules.arb = arb = StreamArbiter(32, count=4)
        for q, port in enumerate(self.ports):
            wiring.connect(m, wiring.flipped(port.req), arb.i[q])
        # Requests wait in `reqs` for the beat before to have its rows asked for: a request is
        # taken on registered state only (the FIFOs' levels), never on the VSP's grant, and the
        # next beat's rows are asked for in the cycle after the last row of the one before.
        reqs = SyncFIFO(width=DIV_BITS + 1 + 2, depth=2)
        route = SyncFIFO(width=2, depth=4)                # the port of each beat being read
        m.submodules.reqs, m.submodules.route = reqs, route
        m.d.comb += arb.o.ready.eq(self.en & reqs.w_rdy & route.w_rdy)
        take = arb.o.valid & arb.o.ready
        m.d.comb += [reqs.w_en.eq(take), reqs.w_data.eq(Cat(arb.o.payload[0:DIV_BITS + 1], arb.grant)),
                     route.w_en.eq(take), route.w_data.eq(arb.grant)]
        busy, r_j = Signal(), Signal(range(max(R, 2)))   # (never a zero-width wire)
        r_end = (r_j == R - 1) if R > 1 else Const(1)
        r_row, r_word, r_lim = Signal(len(self.rd.req.payload) + 1), Signal(30), Signal(30)
        r_mask = Signal(P)
        word_now = r_word + (r_j << _log2(P)) if R > 1 else r_word
        past = word_now >= r_lim
        m.d.comb += [self.rd.req.valid.eq(busy),
                     self.rd.req.payload.eq(Mux(past, self.pad_row, r_row + r_j if R > 1 else r_row))]
        asked = self.en & busy & self.rd.req.ready
        with m.If(asked):
            m.d.sync += r_mask.eq(_lane_mask(word_now, r_lim, P))
            with m.If(r_end):
                m.d.sync += busy.eq(0)
            with m.Else():
                m.d.sync += r_j.eq(r_j + 1)
        load = self.en & reqs.r_rdy & (~busy | (asked & r_end))
        beat_addr, q_of = reqs.r_data[0:DIV_BITS + 1], reqs.r_data[DIV_BITS + 1:]
        m.d.comb += reqs.r_en.eq(load)
        with m.If(load):                                  # (after the block above: it wins)
            m.d.sync += [busy.eq(1), r_j.eq(0), r_word.eq(beat_addr << _log2(self.B))]
            with m.Switch(q_of):
                for q in range(4):
                    with m.Case(q):
                        m.d.sync += [r_row.eq(self.base[q] + (beat_addr << lr)), r_lim.eq(self.limit[q])]
        # collector: R rows make a beat, row 0 in the low bits
        row_in = _masked(self.rd.resp.payload, r_mask)
        if R > 1:
            acc, a_j = Signal(D), Signal(range(R))
            a_end, beat = a_j == R - 1, Cat(acc[32 * P:], row_in)
            with m.If(self.en & self.rd.resp.valid):
                m.d.sync += [acc.eq(beat), a_j.eq(Mux(a_end, 0, a_j + 1))]
        else:                                             # a row is a beat
            a_end, beat = Const(1), row_in
        deliver = self.en & self.rd.resp.valid & a_end
        m.d.comb += route.r_en.eq(deliver)
        for q, port in enumerate(self.ports):
            m.d.comb += [port.resp.valid.eq(deliver & (route.r_data == q)), port.resp.payload.eq(beat)]
        m.d.comb += self.busy.eq(busy | route.r_rdy)
        return m


class VspBeatWriter(wiring.Component):
    """Beats written to the VSP: each beat is R row writes (row 0 from the beat's low words);
    with ``x16`` each row also goes to ``XbCopy`` (an all-reduce's fp16 copy for XB).

    Parameters
    ----------
    data_bits, lanes, row_bits : int
        As for ``VspBeatReader``.

    Members
    -------
    beats : In(stream(MemWrite))  beat address (relative to ``base``) and beat
    base : In(24)  the row of beat 0
    wr : Out(vsp.WritePort)
    en : In(1)  the node runs on the VSP: beats are taken and written
    busy : Out(1)  a beat's rows are being written
    x16 : In(1); xbase : In(ADDR_BITS)  the COLL's x16 and its first XB word (a row's P words
        go to xbase + P x its row within the result)
    x_room : In(1)  the copy takes a row (a row is written only with room for its copy)
    x_push : Out(1); x_word : Out(ADDR_BITS); x_data : Out(32 * lanes)  the row to copy

    Timing: a beat is taken when none is being written or in the cycle the last row of the one
    before is granted (``beats.ready`` follows the VSP's write grant in that cycle); its rows
    are asked for from the next cycle, one per cycle the VSP grants (and, with ``x16``, the
    copy has room), so a beat takes R cycles. The row asked for is a register, not a sum.
    """

    def __init__(self, *, data_bits, lanes, row_bits):
        self.D, self.P = data_bits, lanes
        self.R = data_bits // 32 // lanes
        super().__init__({
            "beats": In(stream.Signature(MemWrite(data_bits))), "base": In(24),
            "wr": Out(WritePort(row_bits, lanes)), "en": In(1), "busy": Out(1),
            "x16": In(1), "xbase": In(ADDR_BITS), "x_room": In(1),
            "x_push": Out(1), "x_word": Out(ADDR_BITS), "x_data": Out(32 * lanes),
        })

    def elaborate(self, platform):
        m = Module()
        P, R = self.P, self.R
        busy, w_j = Signal(), Signal(range(max(R, 2)))
        w_end = (w_j == R - 1) if R > 1 else Const(1)
        w_row, w_buf = Signal(len(self.wr.req.payload.row)), Signal(self.D)   # the row asked for
        x_word = Signal(ADDR_BITS)             # the XB word of the row being written
        go = busy & (~self.x16 | self.x_room)
        m.d.comb += [self.wr.req.valid.eq(go), self.wr.req.payload.row.eq(w_row),
                     self.wr.req.payload.data.eq(w_buf[0:32 * P]),
                     self.x_word.eq(x_word), self.x_data.eq(w_buf[0:32 * P])]
        with m.If(busy):
            m.d.comb += self.wr.req.payload.mask.eq(Const((1 << P) - 1, P))    # whole rows
        wrote = self.en & go & self.wr.req.ready
        with m.If(wrote):
            m.d.comb += self.x_push.eq(self.x16)
            m.d.sync += [w_row.eq(w_row + 1), x_word.eq(x_word + P)]
            if R > 1:
                m.d.sync += w_buf.eq(w_buf >> (32 * P))
            with m.If(w_end):
                m.d.sync += busy.eq(0)
            with m.Else():
                m.d.sync += w_j.eq(w_j + 1)
        # the next beat is taken in the cycle the last row of the one before is written
        m.d.comb += self.beats.ready.eq(self.en & (~busy | (wrote & w_end)))
        with m.If(self.beats.valid & self.beats.ready):  # (after the block above: it wins)
            rel = self.beats.payload.addr[0:DIV_BITS + 1] << _log2(R)    # the beat's first row
            m.d.sync += [busy.eq(1), w_j.eq(0), w_buf.eq(self.beats.payload.data),
                         w_row.eq(self.base + rel), x_word.eq(self.xbase + (rel << _log2(P)))]
        m.d.comb += self.busy.eq(busy)
        return m


class XbCopy(wiring.Component):
    """An all-reduce's fp16 copy into XB (COLL.x16): each row the unit writes to the VSP goes
    through ``lanes`` fp32 -> fp16 converters into a FIFO, and from there into XB in a cycle
    the vector unit does not write XB (``xb_ready``; the vector unit's XB writes cannot wait).

    Parameters
    ----------
    lanes, width, xb_row_bits : int
        Words of a VSP row (P), of an XB row (W, a multiple of P), XB's row address bits.

    Members
    -------
    push : In(1); word : In(ADDR_BITS); data : In(32 * lanes)  a row of P fp32 words for XB
        words [word, word + P) (word a multiple of P)
    room : Out(1)  a row may be pushed (the FIFO holds every row in the converters)
    xb : Out(XbWrite); xb_ready : In(1)  the XB write, taken when ``xb_ready``
    busy : Out(1)  rows in the converters or the FIFO

    Timing: the converters' 2 cycles, then the FIFO (8 rows); a row a cycle while XB is free.
    """

    DEPTH = 8

    def __init__(self, *, lanes, width, xb_row_bits):
        if width % lanes:
            raise ValueError(f"core.width: got {width}; COLL.x16 needs a multiple of "
                             f"core.vector_lanes = {lanes}")
        self.P, self.W = lanes, width
        super().__init__({
            "push": In(1), "word": In(ADDR_BITS), "data": In(32 * lanes), "room": Out(1),
            "xb": Out(XbWrite(xb_row_bits, width)), "xb_ready": In(1), "busy": Out(1),
        })

    def elaborate(self, platform):
        m = Module()
        P, W = self.P, self.W
        halves = []
        for j in range(P):
            m.submodules[f"cvt{j}"] = u = Fp32ToFp16()
            m.d.comb += u.a.eq(self.data[32 * j:32 * (j + 1)])
            halves.append(u.o)
        lat = Fp32ToFp16.LATENCY
        v = delay(m, self.push, lat, name="x_v")
        word = delay(m, self.word, lat, name="x_word", reset_less=True)[-1]
        m.submodules.fifo = fifo = SyncFIFOBuffered(width=ADDR_BITS + 16 * P, depth=self.DEPTH)
        in_conv = Signal(range(lat + 1))
        m.d.sync += in_conv.eq(in_conv + self.push - v[-1])
        m.d.comb += [fifo.w_en.eq(v[-1]), fifo.w_data.eq(Cat(word, *halves)),
                     self.room.eq(fifo.level + in_conv < self.DEPTH - lat - 1)]
        head_word, head_data = fifo.r_data[0:ADDR_BITS], fifo.r_data[ADDR_BITS:]
        wl, pl = _log2(W), _log2(P)
        m.d.comb += [self.xb.en.eq(fifo.r_rdy & self.xb_ready), fifo.r_en.eq(self.xb_ready),
                     self.xb.row.eq(head_word >> wl),
                     self.xb.mask.eq(Const((1 << P) - 1, W) << (head_word[pl:wl] << pl) if wl > pl
                                     else Const((1 << P) - 1, W)),
                     self.xb.data.eq(Cat(*([head_data] * (W // P)))),
                     # (level, not r_rdy: a row is in the buffered FIFO a cycle before its
                     # output shows it, and the COLL must not be done in between)
                     self.busy.eq((fifo.level != 0) | (in_conv != 0))]
        return m


class VspCopy(wiring.Component):
    """All-gather's own block from the input to its place in the result, in the VSP: ``rows``
    rows, one at a time, words at or past ``n`` written as +0.

    Parameters
    ----------
    lanes, row_bits : int
        The VSP port's row (P words) and address width.
    count_bits : int
        Width of ``rows``.

    Members
    -------
    start : In(1)  pulse: copy ``rows`` rows from ``src`` to ``to`` (``to`` sampled now)
    rows : In(count_bits); src : In(24); to : In(24); n : In(24)
    rd : Out(vsp.ReadPort); wr : Out(vsp.WritePort)
    done : Out(1)  pulse, the cycle after the last row's write is granted

    Timing: 3 cycles a row at least (read granted, data registered, write granted).
    """

    def __init__(self, *, lanes, row_bits, count_bits):
        self.P = lanes
        self._count_bits = count_bits
        super().__init__({
            "start": In(1), "rows": In(count_bits), "src": In(24), "to": In(24), "n": In(24),
            "rd": Out(ReadPort(row_bits, lanes)), "wr": Out(WritePort(row_bits, lanes)),
            "done": Out(1),
        })

    def elaborate(self, platform):
        m = Module()
        P, lp = self.P, _log2(self.P)
        k = Signal(self._count_bits)
        to = Signal(24)
        row = Signal(32 * P)
        m.d.comb += self.wr.req.payload.data.eq(row)
        with m.FSM():
            with m.State("IDLE"):
                with m.If(self.start):
                    m.d.sync += [k.eq(0), to.eq(self.to)]
                    m.next = "READ"
            with m.State("READ"):
                with m.If(k == self.rows):
                    m.d.comb += self.done.eq(1)
                    m.next = "IDLE"
                with m.Else():
                    # rows wholly past the input read a row that exists (src's first)
                    m.d.comb += [self.rd.req.valid.eq(1),
                                 self.rd.req.payload.eq(Mux((k << lp) >= self.n, self.src, self.src + k))]
                    with m.If(self.rd.req.ready):
                        m.next = "DATA"
            with m.State("DATA"):
                m.d.sync += row.eq(_masked(self.rd.resp.payload, _lane_mask(k << lp, self.n, P)))
                m.next = "WRITE"
            with m.State("WRITE"):
                m.d.comb += [self.wr.req.valid.eq(1), self.wr.req.payload.row.eq(to + k),
                             self.wr.req.payload.mask.eq(Const((1 << P) - 1, P))]
                with m.If(self.wr.req.ready):
                    m.d.sync += k.eq(k + 1)
                    m.next = "READ"
        return m


class HbmCopy(wiring.Component):
    """All-gather's own block from the input to its place in the result, HBM to HBM: ``nb``
    beats read in runs (within a page, at most ``run`` beats, at most COPY_AHEAD beats ahead
    of the writes, so that replies are never held back), written one a cycle, words at or past
    ``n`` as +0.

    Parameters
    ----------
    data_bits : int
        The link beat.
    run, page_beats : int
        Longest run; beats of a 4 KiB page of a channel's buffer (hw/dma/beats.py).

    Members
    -------
    start : In(1)  pulse: copy ``nb`` beats from beat ``src`` to beat ``to`` (``to`` sampled now)
    nb : In(DIV_BITS + 1); src : In(32); to : In(32); n : In(24)
    own : Out(32)  ``to`` as sampled at the last start (registered)
    rd : Out(ReadPort(ReadRun, data_bits)); wr : Out(stream(BeatWrite))
    busy : Out(1)  from ``start`` to the last write (registered)
    done : Out(1)  pulse in the cycle after the last write

    Timing: reads and writes overlap; a beat is written the cycle after it arrives at the
    earliest (it passes a FIFO of COPY_AHEAD beats).
    """

    def __init__(self, *, data_bits, run, page_beats):
        self.D, self.run, self.page_beats = data_bits, run, page_beats
        super().__init__({
            "start": In(1), "nb": In(DIV_BITS + 1), "src": In(32), "to": In(32), "n": In(24),
            "own": Out(32), "rd": Out(hw_stream.ReadPort(ReadRun, data_bits)),
            "wr": Out(stream.Signature(BeatWrite(data_bits))), "busy": Out(1), "done": Out(1),
        })

    def elaborate(self, platform):
        m = Module()
        B, nb, lpage = self.D // 32, self.nb, _log2(self.page_beats)
        k, kr = Signal(DIV_BITS + 1), Signal(DIV_BITS + 1)      # beats written, asked for
        cq = SyncFIFO(width=self.D, depth=COPY_AHEAD)
        m.submodules.cq = cq
        src_at = self.src + kr
        c_end = ((src_at >> lpage) + 1) << lpage
        c_lim = Mux(c_end - src_at < nb - kr, c_end - src_at, nb - kr)
        c_len = Mux(c_lim < self.run, c_lim, self.run)
        with m.If(self.busy):
            m.d.comb += [self.rd.req.valid.eq((kr < nb) & (kr - k + c_len <= COPY_AHEAD)),
                         self.rd.req.payload.beat.eq(src_at), self.rd.req.payload.len.eq(c_len),
                         cq.w_en.eq(self.rd.resp.valid), cq.w_data.eq(self.rd.resp.payload),
                         self.wr.valid.eq(cq.r_rdy), self.wr.payload.beat.eq(self.own + k),
                         self.wr.payload.data.eq(_masked(cq.r_data, _lane_mask(k << _log2(B), self.n, B))),
                         cq.r_en.eq(self.wr.ready)]
            with m.If(self.rd.req.valid & self.rd.req.ready):
                m.d.sync += kr.eq(kr + c_len)
            with m.If(self.wr.valid & self.wr.ready):
                m.d.sync += k.eq(k + 1)
            with m.If(k == nb):
                m.d.comb += self.done.eq(1)
                m.d.sync += self.busy.eq(0)
        with m.If(self.start):
            m.d.sync += [k.eq(0), kr.eq(0), self.own.eq(self.to), self.busy.eq(1)]
        return m


class Prefetcher(wiring.Component):
    """One node read port served from HBM, streaming ahead of its requests.

    A request for the beat after the port's previous one is a hit (its data are or will be
    in the FIFO); any other beat starts a new stream there, once every earlier request has
    been fetched, and the beats fetched past the old stream's last request are dropped as
    they come out (each waiting request records how many to drop before it). Runs of up to
    ``run`` beats (never across a page, never past ``end``) are asked for while fewer than
    ``ahead`` beats are fetched beyond the port's requests and the FIFO has room for them.

    Parameters
    ----------
    data_bits : int
        The link beat (B = data_bits / 32 words).
    run, depth, ahead, page_beats : int
        Longest run; the beat FIFO's depth; beats fetched ahead at most; beats of a page.

    Members
    -------
    port : In(MemReadPort)  the node's read port (beat addresses relative to ``base``)
    hbm : Out(ReadPort(ReadRun, data_bits))  runs to fetch; their beats, always taken
    en : In(1)  the node runs on HBM: requests accepted, runs asked for
    restart : In(1)  pulse: no stream (the node starts)
    drain : In(1)  drop the beats nobody asked for
    base, end : In(32)  absolute beats: the port's beat 0, and past the last to fetch
    limit : In(30)  the port's words at or past it read as +0
    idle : Out(1)  no beat fetched (or asked for) and not yet popped

    Timing: a hit is answered the cycle after its beat is in the FIFO (``SyncFIFOBuffered``),
    a beat a cycle; requests wait in a 32-deep FIFO.
    """

    def __init__(self, *, data_bits, run, depth, ahead, page_beats):
        self.D, self.B = data_bits, data_bits // 32
        self.run, self.depth, self.ahead, self.page_beats = run, depth, ahead, page_beats
        super().__init__({
            "port": In(MemReadPort(data_bits)), "hbm": Out(hw_stream.ReadPort(ReadRun, data_bits)),
            "en": In(1), "restart": In(1), "drain": In(1),
            "base": In(32), "end": In(32), "limit": In(30), "idle": Out(1),
        })

    def elaborate(self, platform):
        m = Module()
        B, RUN, PQ = self.B, self.run, self.depth
        lpage = _log2(self.page_beats)
        pq = SyncFIFOBuffered(width=self.D, depth=PQ)
        DW = PQ.bit_length()
        # requests awaiting data: the beat's word mask, and the beats to drop before it
        Pending = data.StructLayout({"mask": B, "drop": DW})
        pend = SyncFIFO(width=Pending.size, depth=32)
        m.submodules.pq, m.submodules.pend = pq, pend
        nxt, top = Signal(32), Signal(32)                 # the beat after the last request; fetched up to
        live = Signal()
        inq = Signal(range(PQ + 1))                       # fetched (or asked) and not popped
        dcount = Signal(DW)                               # dropped for the head request
        end = self.end
        beat_addr = self.port.req.payload[0:DIV_BITS + 1]
        b = self.base + beat_addr
        hit = live & (b == nxt)
        accept = self.en & self.port.req.valid & pend.w_rdy & (hit | (top >= nxt))
        request = Signal(Pending)
        # a new stream drops the beats fetched past the old one's last request (top >= nxt)
        m.d.comb += [self.port.req.ready.eq(accept),
                     request.mask.eq(_lane_mask(beat_addr << _log2(B), self.limit, B)),
                     request.drop.eq(Mux(hit, 0, top - nxt)[0:DW]),
                     pend.w_en.eq(accept), pend.w_data.eq(request)]
        with m.If(self.restart):
            m.d.sync += [live.eq(0), nxt.eq(0), top.eq(0)]
        with m.Elif(accept):
            m.d.sync += nxt.eq(b + 1)
            with m.If(~hit):
                m.d.sync += [top.eq(b), live.eq(1)]
        # the next run: up to RUN beats, within the page and the port's end
        ln = Signal(9)
        page_end = ((top >> lpage) + 1) << lpage
        room_end = Mux(page_end < end, page_end, end)
        m.d.comb += ln.eq(Mux(room_end - top < RUN, room_end - top, RUN))
        # (not while a new stream is being accepted: its `top` is being moved)
        m.d.comb += [self.hbm.req.valid.eq(self.en & live & (top < end) & (top < nxt + self.ahead)
                                           & (inq + RUN <= PQ) & ~(accept & ~hit)),
                     self.hbm.req.payload.beat.eq(top), self.hbm.req.payload.len.eq(ln),
                     pq.w_en.eq(self.hbm.resp.valid), pq.w_data.eq(self.hbm.resp.payload)]
        # out of the FIFO, in order: for the oldest request, the beats to drop before it,
        # then its beat; at the end, whatever was fetched and never asked for
        head = Pending(pend.r_data)
        dropping = pend.r_rdy & (dcount != head.drop)
        drop = dropping & pq.r_rdy
        serve = pend.r_rdy & ~dropping & pq.r_rdy
        pop = drop | serve | (self.drain & pq.r_rdy)
        m.d.comb += [pq.r_en.eq(pop), pend.r_en.eq(serve),
                     self.port.resp.valid.eq(serve), self.port.resp.payload.eq(_masked(pq.r_data, head.mask))]
        with m.If(drop):
            m.d.sync += dcount.eq(dcount + 1)
        with m.Elif(serve):
            m.d.sync += dcount.eq(0)
        issued = self.hbm.req.valid & self.hbm.req.ready
        with m.If(issued):
            m.d.sync += top.eq(top + ln)
        m.d.sync += inq.eq(inq + Mux(issued, ln, 0) - pop)
        m.d.comb += self.idle.eq(inq == 0)
        return m


class HbmBeatReader(wiring.Component):
    """The node's four read ports served from HBM: a ``Prefetcher`` each, their runs on one
    HbmBeats run port, round-robin per run, and each run's beats back to its prefetcher.

    Parameters
    ----------
    data_bits, run, depth, ahead, page_beats : int
        As for ``Prefetcher``.

    Members
    -------
    ports : In(MemReadPort).array(4)  the node's read ports (beat addresses relative to base)
    base, end : In(32).array(4); limit : In(30).array(4)  each port's (``Prefetcher``)
    en, restart, drain : In(1)  to every prefetcher (``Prefetcher``)
    hrd : Out(ReadPort(ReadRun, data_bits))  to HbmBeats
    idle : Out(1)  no run in flight, no beat fetched and not yet popped

    Timing: a run goes the cycle it is granted (while fewer than 16 are in flight); each beat
    goes into its prefetcher's FIFO the cycle it arrives.
    """

    def __init__(self, *, data_bits, run, depth, ahead, page_beats):
        self._pf = dict(data_bits=data_bits, run=run, depth=depth, ahead=ahead, page_beats=page_beats)
        super().__init__({
            "ports": In(MemReadPort(data_bits)).array(4),
            "base": In(32).array(4), "end": In(32).array(4), "limit": In(30).array(4),
            "en": In(1), "restart": In(1), "drain": In(1),
            "hrd": Out(hw_stream.ReadPort(ReadRun, data_bits)), "idle": Out(1),
        })

    def elaborate(self, platform):
        m = Module()
        m.submodules.arb = arb = StreamArbiter(ReadRun, count=4)
        pfs = [Prefetcher(**self._pf) for _ in range(4)]
        for q, pf in enumerate(pfs):
            m.submodules[f"pf{q}"] = pf
            wiring.connect(m, wiring.flipped(self.ports[q]), pf.port)
            wiring.connect(m, pf.hbm.req, arb.i[q])
            m.d.comb += [pf.base.eq(self.base[q]), pf.end.eq(self.end[q]), pf.limit.eq(self.limit[q]),
                         pf.en.eq(self.en), pf.restart.eq(self.restart), pf.drain.eq(self.drain)]
        Route = data.StructLayout({"port": 2, "len": 9})  # of each run in flight
        route = SyncFIFO(width=Route.size, depth=16)
        m.submodules.route = route
        req = self.hrd.req
        m.d.comb += [req.valid.eq(arb.o.valid & route.w_rdy), req.payload.eq(arb.o.payload),
                     arb.o.ready.eq(req.ready & route.w_rdy)]
        run = Signal(Route)
        m.d.comb += [run.port.eq(arb.grant), run.len.eq(arb.o.payload.len),
                     route.w_en.eq(arb.o.valid & arb.o.ready), route.w_data.eq(run)]
        j = Signal(9)                                     # beat of the head run
        head = Route(route.r_data)
        for q, pf in enumerate(pfs):
            m.d.comb += [pf.hbm.resp.valid.eq(self.hrd.resp.valid & (head.port == q)),
                         pf.hbm.resp.payload.eq(self.hrd.resp.payload)]
        with m.If(self.hrd.resp.valid):
            with m.If(j == head.len - 1):
                m.d.comb += route.r_en.eq(1)
                m.d.sync += j.eq(0)
            with m.Else():
                m.d.sync += j.eq(j + 1)
        m.d.comb += self.idle.eq(~route.r_rdy & Cat(*[pf.idle for pf in pfs]).all())
        return m


class CollUnit(wiring.Component):
    """The collective unit: a COLL from the issue stage, run on the card's ring node (see the
    module's docstring).

    Parameters
    ----------
    cfg : ApplianceConfig
        A ring card's config: the node's sizes (hw/ring.py ``node_params``), the VSP's rows,
        HBM's stripes. Raises ``ValueError`` for a link beat that is not whole VSP rows or
        whole HBM channel beats (gen/config.py rejects such configs first).
    timeout : int
        Cycles of the node's run without progress before RING_ERROR.

    Members
    -------
    cmd : In(stream(CollCmd)); done : Out(1) pulse per COLL (with ``err`` on a RING_ERROR)
    err : Out(1) pulse; err_pc : Out(24); busy : Out(1); progress : Out(1) pulse
    card_reg : In(32)  the ``card`` register (id, cards, bidirectional)
    r_tx, r_rx, l_tx, l_rx : the link ports (stream of Beat)
    rd : Out(ReadPort); wr : Out(WritePort)  one VSP port each way
    xb : Out(XbWrite); xb_ready : In(1)  COLL.x16's fp16 copy into XB, in cycles the vector
        unit leaves XB's write port free (``XbCopy``)
    hrd : Out(hw.stream.ReadPort(ReadRun, D)); hwr : Out(stream(BeatWrite)); hw_idle : In(1)
        COLL with hbm: runs of beats read from HBM, beats written (hw/dma/beats.py)
    tx_beats, rx_beats : Out(2)  payload beats sent / received this cycle
    retx, crc_error : Out(2)  frames sent again / received with a bad CRC this cycle

    Timing: the command is taken in one cycle; then per ring direction 1 + DIV_BITS + N
    cycles of geometry (``CollGeometry``), an all-gather's copy of its own block, the node's
    run and the drain. ``done`` pulses in the cycle the last write is answered and the
    prefetchers are empty, or the cycle after a failure is seen.
    """

    def __init__(self, cfg, *, timeout):
        c = cfg.core
        self.P = c.vector_lanes
        self.params = node_params(cfg)
        self.D = self.params.data_bits
        self.B = self.D // 32
        if self.D < MIN_RING_LINK_BITS:
            raise ValueError(f"link.data_bits: got {self.D}; the collective unit needs at least "
                             f"{MIN_RING_LINK_BITS} (its divider's DIV_BITS)")
        if self.B % self.P:
            raise ValueError(f"core.vector_lanes: got {self.P}; the collective unit needs a divisor "
                             f"of link.data_bits / 32 = {self.B}")
        self.R = self.B // self.P
        hb, C = cfg.hbm.data_bits, cfg.hbm.channels
        if self.D % hb or C % (self.D // hb) or (C // (self.D // hb)) & (C // (self.D // hb) - 1):
            raise ValueError(f"link.data_bits: got {self.D}; COLL on HBM needs a link beat of whole "
                             f"hbm.data_bits = {hb} channel beats, a power of two of them per "
                             f"stripe row of hbm.channels = {C}")
        self.per_row = C // (self.D // hb)               # link beats per stripe row
        # COLL on HBM: each node read port streams ahead through its own prefetch FIFO, in
        # runs of `run` beats (bursts of run / per_row beats per channel); `ahead` beats in
        # flight cover the HBM latency at a beat a cycle
        self.run = min(32, self.per_row * 8)
        self.pq = 1 << (cfg.hbm.latency_cycles + 2 * self.run + 16).bit_length()
        self.ahead = self.pq - self.run
        self.page_beats = page_beats(C, hb, self.D)
        self.row_bits = (c.vsp_words // self.P - 1).bit_length()
        self.W, self.xb_row_bits = c.width, max(1, (c.xb_words // c.width - 1).bit_length())
        self.timeout = timeout
        self.node = CollNode(**node_kwargs(cfg))
        beat = stream.Signature(Beat(self.D))
        super().__init__({
            "cmd": In(stream.Signature(CollCmd)),
            "done": Out(1), "err": Out(1), "err_pc": Out(24), "busy": Out(1), "progress": Out(1),
            "card_reg": In(32),
            "r_tx": Out(beat), "r_rx": In(beat), "l_tx": Out(beat), "l_rx": In(beat),
            "rd": Out(ReadPort(self.row_bits, self.P)), "wr": Out(WritePort(self.row_bits, self.P)),
            "tx_beats": Out(2), "rx_beats": Out(2), "retx": Out(2), "crc_error": Out(2),
            "hrd": Out(hw_stream.ReadPort(ReadRun, self.D)),
            "hwr": Out(stream.Signature(BeatWrite(self.D))), "hw_idle": In(1),
            "xb": Out(XbWrite(self.xb_row_bits, self.W)), "xb_ready": In(1),
        })

    def elaborate(self, platform):
        m = Module()
        D, P, R = self.D, self.P, self.R
        lr = _log2(R)
        m.submodules.node = node = self.node
        m.submodules.seq = seq = CollSequencer(beat_words=self.B, timeout=self.timeout)
        m.submodules.geometry = geo = CollGeometry(frame_beats=self.params.frame_beats)
        vsp = dict(lanes=P, row_bits=self.row_bits)
        m.submodules.reads = reads = VspBeatReader(data_bits=D, **vsp)
        m.submodules.writes = writes = VspBeatWriter(data_bits=D, **vsp)
        m.submodules.xb_copy = xcopy = XbCopy(lanes=P, width=self.W, xb_row_bits=self.xb_row_bits)
        m.submodules.vsp_copy = vcopy = VspCopy(count_bits=DIV_BITS + lr + 1, **vsp)
        m.submodules.hbm_copy = hcopy = HbmCopy(data_bits=D, run=self.run, page_beats=self.page_beats)
        m.submodules.hbm_reads = hreads = HbmBeatReader(data_bits=D, run=self.run, depth=self.pq,
                                                        ahead=self.ahead, page_beats=self.page_beats)
        m.submodules.warb = warb = StreamArbiter(MemWrite(D), count=2)

        # -- the links and their counters -----------------------------------------------------
        wiring.connect(m, node.r_tx, wiring.flipped(self.r_tx))
        wiring.connect(m, wiring.flipped(self.r_rx), node.r_rx)
        wiring.connect(m, node.l_tx, wiring.flipped(self.l_tx))
        wiring.connect(m, wiring.flipped(self.l_rx), node.l_rx)
        m.d.comb += [self.tx_beats.eq(node.pay_tx), self.rx_beats.eq(node.pay_rx),
                     self.retx.eq(node.retx), self.crc_error.eq(node.crc_error)]

        # -- the COLL, its geometry and the node's configuration -------------------------------
        wiring.connect(m, wiring.flipped(self.cmd), seq.cmd)
        insn, nb = seq.insn, seq.nb
        N, me, bidir = self.card_reg[8:16], self.card_reg[0:8], self.card_reg[16]
        is_ag = insn.cop == OP_AG
        m.d.comb += [geo.start.eq(seq.geometry_start), geo.ag.eq(is_ag), geo.nb.eq(nb), geo.cards.eq(N),
                     geo.bidir.eq(bidir)]
        m.d.comb += [node.op.eq(insn.cop), node.fp16.eq(0), node.cards.eq(N), node.card.eq(me),
                     node.bidir.eq(bidir), node.chunk_log2.eq(_log2(self.params.frame_beats)),
                     node.group.eq(self.params.group), node.src.eq(0), node.dst.eq(0),
                     node.max_chunks_r.eq(geo.max_chunks_r), node.max_chunks_l.eq(geo.max_chunks_l),
                     node.seg_we.eq(geo.seg_we), node.seg_left.eq(geo.seg_left),
                     node.seg_addr.eq(geo.seg_addr), node.seg_data.eq(geo.seg_data),
                     # every frame carries n's low bits and cop: peers that disagree on the COLL
                     # (any two n with the same beat count differ in their low 6 bits) see a
                     # tag the schedule does not expect
                     node.check.eq(Cat(insn.n[0:6], insn.cop)),
                     node.start.eq(seq.start)]

        # -- where the message lives: VSP rows, or link beats in HBM (hw/dma/beats.py) -----------
        src_row, dst_row = insn.src >> _log2(P), insn.dst >> _log2(P)
        src_b, dst_b = insn.src << _log2(self.per_row), insn.dst << _log2(self.per_row)
        m.d.comb += [vcopy.start.eq(seq.vsp_copy_start), vcopy.rows.eq(nb << lr), vcopy.src.eq(src_row),
                     vcopy.to.eq(dst_row + me * (nb << lr)), vcopy.n.eq(insn.n),
                     seq.vsp_copy_done.eq(vcopy.done),
                     hcopy.start.eq(seq.hbm_copy_start), hcopy.nb.eq(nb), hcopy.src.eq(src_b),
                     hcopy.to.eq(dst_b + me * nb), hcopy.n.eq(insn.n), seq.hbm_copy_done.eq(hcopy.done)]

        # -- the node's read ports: VSP rows, or HBM through a prefetcher each -----------------
        running, hbm = seq.running, insn.hbm
        m.d.comb += [reads.en.eq(running & ~hbm), reads.pad_row.eq(src_row),
                     hreads.en.eq(running & hbm), hreads.restart.eq(seq.start),
                     hreads.drain.eq(seq.draining)]
        rports = [node.mem_r_rd_src, node.mem_r_rd_op, node.mem_l_rd_src, node.mem_l_rd_op]
        for q, port in enumerate(rports):
            sends = q % 2 == 0            # rd_src; for all-gather the own block, read in place
            limit = Mux(is_ag, AG_LIMIT, insn.n) if sends else insn.n
            m.d.comb += [reads.base[q].eq(Mux(is_ag, dst_row, src_row) if sends else src_row),
                         reads.limit[q].eq(limit), hreads.limit[q].eq(limit),
                         hreads.base[q].eq(Mux(is_ag, dst_b, src_b) if sends else src_b),
                         hreads.end[q].eq(Mux(is_ag, hcopy.own + nb, src_b + nb) if sends else src_b + nb)]
            _serve(m, hbm, port, reads.ports[q], hreads.ports[q])

        # -- the node's write ports: round-robin per beat, to VSP rows or HBM ------------------
        wiring.connect(m, node.mem_r_wr, warb.i[0])
        wiring.connect(m, node.mem_l_wr, warb.i[1])
        to_hbm = stream.Signature(BeatWrite(D)).create(path=("to_hbm",))
        m.d.comb += [writes.x16.eq(insn.x16), writes.xbase.eq(insn.xdst), writes.x_room.eq(xcopy.room),
                     xcopy.push.eq(writes.x_push), xcopy.word.eq(writes.x_word),
                     xcopy.data.eq(writes.x_data), xcopy.xb_ready.eq(self.xb_ready)]
        wiring.connect(m, xcopy.xb, wiring.flipped(self.xb))
        m.d.comb += [writes.en.eq(running & ~hbm), writes.base.eq(dst_row),
                     writes.beats.valid.eq(warb.o.valid), writes.beats.payload.eq(warb.o.payload),
                     to_hbm.valid.eq(running & hbm & warb.o.valid),
                     to_hbm.payload.beat.eq(dst_b + warb.o.payload.addr[0:DIV_BITS + 1]),
                     to_hbm.payload.data.eq(warb.o.payload.data),
                     warb.o.ready.eq(Mux(hbm, to_hbm.valid & to_hbm.ready, writes.beats.ready))]

        # -- the unit's ports: the node's run, or before it the own block's copy ---------------
        _share_reads(m, running, self.rd, reads.rd, vcopy.rd)
        _share(m, running, self.wr.req, writes.wr.req, vcopy.wr.req)
        _share_reads(m, hcopy.busy, self.hrd, hcopy.rd, hreads.hrd)
        _share(m, hcopy.busy, self.hwr, hcopy.wr, to_hbm)

        # -- progress, completion, errors -------------------------------------------------------
        wire = node.tx_beat_r | node.tx_beat_l | node.rx_beat_r | node.rx_beat_l
        grant = ((self.rd.req.valid & self.rd.req.ready) | (self.wr.req.valid & self.wr.req.ready)
                 | (self.hrd.req.valid & self.hrd.req.ready) | (self.hwr.valid & self.hwr.ready)
                 | self.hrd.resp.valid)
        m.d.comb += [self.progress.eq(wire | grant | self.done),
                     seq.progress.eq(self.progress), seq.hw_idle.eq(self.hw_idle),
                     seq.geometry_done.eq(geo.done), seq.node_busy.eq(node.busy),
                     seq.moving.eq(reads.busy | writes.busy | xcopy.busy),
                     seq.failed.eq(node.link_error.any() | node.order_error),
                     seq.pf_idle.eq(hreads.idle),
                     self.done.eq(seq.done), self.err.eq(seq.err), self.err_pc.eq(insn.pc),
                     self.busy.eq(seq.busy)]
        return m
