"""Decode, check and issue: the controller's in-order front end and its scoreboard.

Stage D decodes the instruction at the head of the fetch stream and evaluates every check
that depends on the instruction alone, in the order the ISS makes them (sim/ref/iss.py), so
that the first failing check gives the same status code (hw/core/decode.py). Stage I adds the
checks that depend on the state (tiles streamed and not yet claimed), and issues the
instruction to its unit's queue once it conflicts with no instruction still in flight.

The scoreboard (hw/core/scoreboard.py) holds the address ranges (VSP words, XB words, HBM
stripe rows) that each in-flight instruction reads and writes. A new instruction waits while it
would write what an older one reads or writes, or read what an older one writes. Everything
else overlaps: weight streaming for the next MATVEC while the vector unit works, a STORE
beside a LOAD...

The first error stops issue; the core then lets what was issued finish (dropping weight
tiles that no MATVEC will take) and reports the error code and its pc. An error response to
an HBM access (AXI_ERROR) names the instruction whose access it answered (its LOAD, WLOAD,
STORE or COLL), and replaces a later instruction's error found meanwhile: the first error in
program order. The watchdog's TIMEOUT stops issue too and names the oldest instruction not
completed (the one the card waits for): the oldest in flight, else the one waiting to issue,
else the next to be fetched.
"""

from amaranth.hdl import Cat, Const, Module, Mux, Signal
from amaranth.lib import stream, wiring
from amaranth.lib.wiring import In, Out

from hw.isa import ERROR_CODES, FORMATS, OPCODE_BITS, UNITS

from .cmds import PC_BITS, CollCmd, DmaReadCmd, MatvecCmd, StoreCmd, VecCmd, fields
from .decode import KIND, Decoded, Decoder
from .fetch import FetchedInsn
from .scoreboard import ENTRIES, UNIT_CODE, Scoreboard

__all__ = ["Issue", "RunState", "TileLedger", "ENTRIES"]

E = ERROR_CODES


class RunState(wiring.Component):
    """Run, stop and the status: running from ``start`` until the first error or HALT, then
    stopping until everything issued has finished.

    Parameters
    ----------
    ring : bool
        The card has a collective unit (and its errors).

    Members
    -------
    start : ``In(1)``; misaligned : ``In(1)``
        A run starts; its program address is not 16-byte aligned (an ALIGN error at pc 0).
    axi_err : ``In(1)``; axi_err_pc : ``In(PC_BITS)``
        A data access's error response (sticky for the run) and the pc of its instruction.
    coll_err : ``In(1)``; coll_err_pc : ``In(PC_BITS)``
        The collective unit's error and the pc of its COLL (with ``ring`` only).
    timeout : ``In(1)``; stuck_pc : ``In(PC_BITS)``
        The watchdog fired (no progress for its limit); the pc of the oldest instruction not
        completed.
    valid : ``In(1)``; err : ``In(4)``; pc : ``In(PC_BITS)``
        An instruction is in stage I; its error code (0: none) and pc.
    halt : ``In(1)``
        It is a HALT and nothing is in flight: the run ends (status OK, its pc).
    overrun : ``In(1)``; next_pc : ``In(PC_BITS)``
        Stage I is empty and every instruction of the program was delivered: PROGRAM_OVERRUN
        at the pc after the last.
    quiet : ``In(1)``
        Every unit idle and nothing in flight: a stop can complete.

    The first of a data access's error, the collective unit's, the watchdog's, the
    instruction's and the HALT stops a run; while stopping, a data access's error replaces an
    OK status or the error of a later instruction, the collective unit's error an OK status,
    until the watchdog has fired (the host has seen that status); the watchdog's TIMEOUT
    replaces the code (the pc stays).
    running, stopping : ``Out(1)``
        (registered) issue may go on; issue has stopped and the run is finishing.
    status : ``Out(32)``
        Error code in bits [3:0], the pc in [31:8] (registered).
    halted : ``Out(1)``
        Pulse as the HALT retires.
    finish : ``Out(1)``
        Pulse as the run ends.
    """

    def __init__(self, *, ring):
        self._ring = ring
        super().__init__({
            "start": In(1), "misaligned": In(1), "axi_err": In(1), "axi_err_pc": In(PC_BITS),
            **({"coll_err": In(1), "coll_err_pc": In(PC_BITS)} if ring else {}),
            "timeout": In(1), "stuck_pc": In(PC_BITS),
            "valid": In(1), "err": In(4), "pc": In(PC_BITS), "halt": In(1),
            "overrun": In(1), "next_pc": In(PC_BITS), "quiet": In(1),
            "running": Out(1), "stopping": Out(1), "status": Out(32),
            "halted": Out(1), "finish": Out(1),
        })

    def elaborate(self, platform):
        m = Module()
        status = self.status
        coll_err = self.coll_err if self._ring else Const(0, 1)
        coll_err_pc = self.coll_err_pc if self._ring else Const(0, PC_BITS)   # (never read)

        def stop_with(code, pc):
            code = Const(code, 4) if isinstance(code, int) else code
            return [status.eq(Cat(code, Const(0, 4), pc)), self.running.eq(0),
                    self.stopping.eq(1)]

        fired = Signal()            # the watchdog fired in this run: the host has its status
        code, at = status[0:8], status[8:8 + PC_BITS]
        with m.If(self.start):
            m.d.sync += [self.running.eq(1), self.stopping.eq(0), status.eq(0), fired.eq(0)]
            with m.If(self.misaligned):
                m.d.sync += stop_with(E["ALIGN"], 0)
        with m.Elif(self.running):
            with m.If(self.axi_err):
                m.d.sync += stop_with(E["AXI_ERROR"], self.axi_err_pc)
            with m.Elif(coll_err):
                m.d.sync += stop_with(E["RING_ERROR"], coll_err_pc)
            with m.Elif(self.timeout):
                m.d.sync += [*stop_with(E["TIMEOUT"], self.stuck_pc), fired.eq(1)]
            with m.Elif(self.valid & (self.err != 0)):
                m.d.sync += stop_with(self.err, self.pc)
            with m.Elif(self.halt):
                m.d.sync += stop_with(0, self.pc)
                m.d.comb += self.halted.eq(1)
            with m.Elif(self.overrun):
                m.d.sync += stop_with(E["PROGRAM_OVERRUN"], self.next_pc)
        with m.Elif(self.stopping):
            with m.If(self.timeout):
                m.d.sync += [code.eq(E["TIMEOUT"]), fired.eq(1)]
            with m.Elif(~fired & self.axi_err & ((code == 0) | (self.axi_err_pc < at))):
                m.d.sync += status.eq(Cat(Const(E["AXI_ERROR"], 8), self.axi_err_pc))
            with m.Elif(~fired & coll_err & (code == 0)):
                m.d.sync += status.eq(Cat(Const(E["RING_ERROR"], 8), coll_err_pc))
            with m.If(self.quiet):
                m.d.sync += self.stopping.eq(0)
                m.d.comb += self.finish.eq(1)
        return m


class TileLedger(wiring.Component):
    """The weight stream's account: tiles streamed by issued WLOADs and not yet claimed by
    issued MATVECs, and the ISA's rules on it (docs/isa.md), checked identically by the ISS.

    Parameters
    ----------
    fifo_depth : int
        The weight FIFO's tiles.

    Members
    -------
    kind : ``In(OPCODE_BITS)``; add : ``In(...)``; need : ``In(...)``
        The instruction in stage I (``Decoded``): its kind, the tiles a WLOAD streams, the
        tiles a MATVEC claims.
    err : ``Out(4)``
        WEIGHT_OVERFLOW (a WLOAD beyond the FIFO), WEIGHT_UNDERFLOW (a MATVEC claiming tiles
        not streamed yet), WEIGHT_LEFTOVER (a HALT with tiles unclaimed), else 0
        (combinational).
    issue : ``In(1)``
        The instruction issues (the account moves from the next cycle on).
    clear : ``In(1)``
        A run starts: the account is empty.
    """

    def __init__(self, *, fifo_depth):
        self._depth = fifo_depth
        super().__init__({
            "kind": In(OPCODE_BITS), "add": In(Decoded["add"].width),
            "need": In(Decoded["need"].width), "err": Out(4), "issue": In(1), "clear": In(1),
        })

    def elaborate(self, platform):
        m = Module()
        avail = Signal(32)           # tiles streamed by WLOADs and not claimed by MATVECs
        kind = self.kind
        m.d.comb += self.err.eq(
            Mux((kind == KIND["WLOAD"]) & (avail + self.add > self._depth), E["WEIGHT_OVERFLOW"],
            Mux((kind == KIND["MATVEC"]) & (self.need > avail), E["WEIGHT_UNDERFLOW"],
            Mux((kind == KIND["HALT"]) & (avail != 0), E["WEIGHT_LEFTOVER"], 0))))
        with m.If(self.issue & (kind == KIND["WLOAD"])):
            m.d.sync += avail.eq(avail + self.add)
        with m.If(self.issue & (kind == KIND["MATVEC"])):
            m.d.sync += avail.eq(avail - self.need)
        with m.If(self.clear):
            m.d.sync += avail.eq(0)
        return m


class Issue(wiring.Component):
    """The in-order issue stage of a card of ``cfg`` (an ApplianceConfig).

    Members
    -------
    insn : In(stream(FetchedInsn)); exhausted : In(1); start : In(1); misaligned : In(1)
    q_<unit> : Out(stream(cmd)) per unit; done_<unit> : In(1) per unit (coll only with a ring)
    card_reg : In(32) the ``card`` register; coll_err : In(1) with coll_err_pc : In(24)
    quiet : In(1)  (every unit idle, no tile left in flight: the stop can complete)
    axi_err : In(1); axi_err_pc : In(24)  (a data access got an error response; its instruction)
    timeout : In(1)  (the watchdog fired: stop, TIMEOUT at the oldest instruction not completed)
    finish : Out(1) pulse; status : Out(32); stopping : Out(1); running : Out(1)
    stall : Out(1); issued : Out(1); retired : Out(1)
    """

    def __init__(self, cfg):
        c = cfg.core
        self.S = cfg.stripe_bytes
        self.fifo_depth = c.weight_fifo_tiles
        self.ring = cfg.ring_links                # a collective unit is part of the card
        self.decoder_params = dict(
            vector_lanes=c.vector_lanes, lanes=c.lanes, width=c.width, stripe_bytes=self.S,
            vsp_words=c.vsp_words, xb_words=c.xb_words, channel_rows=cfg.channel_rows,
            reduce_max=cfg.reduce_max, ring=self.ring, link_words=cfg.link.data_bits // 32,
            qrows=c.tile_rows // c.lanes if c.int_weights else 0)
        self.int_weights = c.int_weights
        self.units = tuple(u for u in UNITS if u != "coll" or self.ring)
        ring = {"q_coll": Out(stream.Signature(CollCmd)), "done_coll": In(1), "coll_err": In(1),
                "coll_err_pc": In(PC_BITS)} if self.ring else {}
        super().__init__({
            **ring, "card_reg": In(32),
            "insn": In(stream.Signature(FetchedInsn)),
            "exhausted": In(1), "start": In(1), "misaligned": In(1),
            "q_dma_rd": Out(stream.Signature(DmaReadCmd)),
            "q_dma_wr": Out(stream.Signature(StoreCmd)),
            "q_mpu": Out(stream.Signature(MatvecCmd)),
            "q_vpu": Out(stream.Signature(VecCmd)),
            "done_dma_rd": In(1), "done_dma_wr": In(1), "done_mpu": In(1), "done_vpu": In(1),
            "quiet": In(1), "axi_err": In(1), "axi_err_pc": In(PC_BITS), "timeout": In(1),
            "finish": Out(1), "status": Out(32), "stopping": Out(1), "running": Out(1),
            "stall": Out(1), "issued": Out(1), "retired": Out(1),
        })

    def elaborate(self, platform):
        m = Module()
        m.submodules.decoder = dec = Decoder(**self.decoder_params)
        m.submodules.board = board = Scoreboard(units=self.units)
        m.submodules.run = run = RunState(ring=self.ring)
        m.submodules.tiles = tiles = TileLedger(fifo_depth=self.fifo_depth)

        # Stage D: decode into the stage register dq.
        dv = Signal()
        dq = Signal(Decoded)
        consume = Signal()           # stage I takes the instruction in dq
        m.d.comb += [dec.word.eq(self.insn.payload.word), dec.pc.eq(self.insn.payload.pc),
                     dec.fetch_err.eq(self.insn.payload.err), self.insn.ready.eq(~dv | consume)]
        if self.ring:
            m.d.comb += dec.card_reg.eq(self.card_reg)
        with m.If(self.insn.valid & self.insn.ready):
            m.d.sync += [dq.eq(dec.d), dv.eq(1)]
        with m.Elif(consume):
            m.d.sync += dv.eq(0)
        # An i8 MATVEC also claims a scale row per group: ceil(rb / group) more tiles, found by
        # a divider here (a bit a cycle) before the instruction may issue or fail.
        need, need_ok = (self._scale_rows(m, dec, dq) if self.int_weights
                         else (dq.need, Const(1, 1)))
        ready = dv & need_ok                   # dq's instruction, its checks all known

        # Stage I: the state's checks (the weight stream's tiles), the scoreboard.
        kind = dq.kind
        err = Signal(4)
        m.d.comb += [tiles.kind.eq(kind), tiles.add.eq(dq.add), tiles.need.eq(need),
                     tiles.clear.eq(self.start),
                     err.eq(Mux(dq.err != 0, dq.err, tiles.err))]
        unit = Signal(range(len(UNITS)))
        with m.Switch(kind):
            for u in UNITS:
                with m.Case(*(f.opcode for f in FORMATS if f.unit == u)):
                    m.d.comb += unit.eq(UNIT_CODE[u])
        m.d.comb += [board.ranges.rd1.eq(dq.rd1), board.ranges.rd2.eq(dq.rd2),
                     board.ranges.wr.eq(dq.wr), board.ranges.wr2.eq(dq.wr2), board.unit.eq(unit),
                     board.done.eq(Cat(*[getattr(self, f"done_{u}") for u in self.units])),
                     board.pc.eq(dq.pc)]

        # Dispatch (valid never depends on ready: `want` is everything but the queue's ready).
        dispatchable = kind.matches(*(f.opcode for f in FORMATS if f.unit != "ctrl"))
        ok = run.running & ready & (err == 0)
        want = Signal()
        go = Signal()
        q_ready = self._dispatch(m, dq, unit, want)
        m.d.comb += [want.eq(ok & dispatchable & ~board.conflict & board.room),
                     go.eq(want & q_ready), board.alloc.eq(go), tiles.issue.eq(go)]
        m.d.comb += [consume.eq(go | (ok & (kind == KIND["FENCE"]) & board.empty)),
                     self.issued.eq(go), self.stall.eq(ok & ~consume),
                     self.retired.eq(consume | run.halted)]

        # Run and stop.
        m.d.comb += [
            run.start.eq(self.start), run.misaligned.eq(self.misaligned),
            run.axi_err.eq(self.axi_err), run.axi_err_pc.eq(self.axi_err_pc),
            run.timeout.eq(self.timeout),
            # the oldest instruction not completed: in flight, else waiting here, else the next
            run.stuck_pc.eq(Mux(~board.empty, board.oldest, Mux(dv, dq.pc, self.insn.payload.pc))),
            run.valid.eq(ready), run.err.eq(err), run.pc.eq(dq.pc),
            run.halt.eq(dv & (kind == KIND["HALT"]) & board.empty),
            run.overrun.eq(~dv & ~self.insn.valid & self.exhausted),
            run.next_pc.eq(self.insn.payload.pc), run.quiet.eq(board.empty & self.quiet),
            self.status.eq(run.status), self.stopping.eq(run.stopping),
            self.running.eq(run.running | run.stopping), self.finish.eq(run.finish),
        ]
        if self.ring:
            m.d.comb += [run.coll_err.eq(self.coll_err), run.coll_err_pc.eq(self.coll_err_pc)]
        with m.If(self.start):
            # A new run: nothing of the last one (e.g. its HALT) may stay in stage D.
            m.d.sync += dv.eq(0)
        return m

    def _scale_rows(self, m, dec, dq):
        """The tiles dq's instruction claims, with an i8 MATVEC's scale rows: rb x cb +
        ceil(rb / group), the quotient by restoring division from the top bit of rb, one bit
        a cycle from the cycle dq is loaded (16 cycles; ``ok`` low meanwhile). Returns
        (need, ok)."""
        f_new = fields(self.insn.payload.word, "MATVEC")
        f = fields(dq.word, "MATVEC")
        nb = len(f.rb)
        dvd = Signal(nb)                 # the dividend's bits not yet taken, top first
        rem = Signal(len(f.group) + 1)
        quo = Signal(nb)
        cnt = Signal(range(nb + 1))
        ok = Signal(init=1)
        with m.If(self.insn.valid & self.insn.ready):
            i8 = (dec.d.kind == KIND["MATVEC"]) & f_new.i8
            m.d.sync += [dvd.eq(f_new.rb), rem.eq(0), quo.eq(0), cnt.eq(Mux(i8, nb, 0)),
                         ok.eq(~i8)]
        with m.Elif(cnt != 0):
            r2 = Cat(dvd[nb - 1], rem[0:len(f.group)])
            ge = r2 >= f.group
            m.d.sync += [rem.eq(Mux(ge, r2 - f.group, r2)), quo.eq(Cat(ge, quo[0:nb - 1])),
                         dvd.eq(dvd << 1), cnt.eq(cnt - 1)]
            with m.If(cnt == 1):
                m.d.sync += ok.eq(1)
        extra = Mux((dq.kind == KIND["MATVEC"]) & f.i8, quo + (rem != 0), 0)
        return dq.need + extra, ok

    def _dispatch(self, m, dq, unit, want):
        """The unit commands: the instruction's fields as they are (hw/core/cmds.py), but the
        read DMA's, which serves LOAD and WLOAD and carries the stripe rows to read; ``want``
        to the queue of ``unit``. Returns that queue's ready."""
        q_ready = Signal()
        for u in self.units:
            q = getattr(self, f"q_{u}")
            with m.If(unit == UNIT_CODE[u]):
                m.d.comb += q_ready.eq(q.ready)
            m.d.comb += q.valid.eq(want & (unit == UNIT_CODE[u]))
        w, wload = dq.word, dq.kind == KIND["WLOAD"]
        load, wl = fields(w, "LOAD"), fields(w, "WLOAD")
        sl = (self.S - 1).bit_length()
        rd = self.q_dma_rd.payload
        m.d.comb += [
            rd.wload.eq(wload),
            rd.row.eq(Mux(wload, wl.row, load.row)),
            rd.count.eq(Mux(wload, wl.tiles,
                            ((load.n << Mux(load.f32, 2, 1)) + (self.S - 1)) >> sl)),
            rd.f32.eq(load.f32), rd.vsp.eq(load.vsp), rd.n.eq(load.n), rd.pc.eq(dq.pc),
            self.q_dma_wr.payload.eq(Cat(fields(w, "STORE"), dq.pc)),
            self.q_mpu.payload.eq(fields(w, "MATVEC")),
            self.q_vpu.payload.eq(fields(w, "VEC")),
        ]
        if self.ring:
            m.d.comb += self.q_coll.payload.eq(Cat(fields(w, "COLL"), dq.pc))
        return q_ready
