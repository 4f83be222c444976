"""The card kernel: one FPGA's GPT decoding core behind the Vitis RTL-kernel interface.

    s_axi_control  -> Control (ap_ctrl_hs, arguments, counters)
    m_axi_insn     <- Fetch -> Issue (decode, checks, scoreboard)
    m_axi_hbm<k>   <- DmaRead (LOAD, WLOAD) / DmaWrite (STORE)
    weight FIFO    DmaRead -> Mpu
    VSP            Vpu, Mpu, DmaRead, DmaWrite through the segment arbiters
    XB             Vpu (CVT16) -> Mpu
    r_tx/r_rx, l_tx/l_rx  <- CollUnit (COLL on the ring node; only when the config has cards > 1)
"""

from types import SimpleNamespace

from amaranth.hdl import Cat, Const, Module, Mux, Signal
from amaranth.lib import stream, wiring
from amaranth.lib.fifo import SyncFIFO
from amaranth.lib.memory import Memory
from amaranth.lib.wiring import In, Out

from hw import regs
from hw.axi import Axi4ReadSignature, Axi4Signature, Axi4WriteSignature, AxiLiteSignature
from hw.collective.link import Beat
from hw.dma.beats import HbmBeats
from hw.dma.mux import AxiReadMux, AxiWriteMux
from hw.isa import ERROR_CODES

from .cmds import PC_BITS, StoreCmd
from .coll import CollUnit
from .ctrl import Control
from .dma import RUN_BITS, STORE_QUEUE, DmaRead, DmaWrite
from .fetch import Fetch
from .issue import Issue
from .mpu import Mpu
from .vpu import Vpu
from .vsp import Vsp
from .wfifo import WeightFifo

__all__ = ["Card", "hbm_reader_params"]

WATCHDOG = 1 << 20


def _wire(m, outer, inner, sig):
    """Connect a manager-side AXI port ``outer`` to ``inner`` for the members of ``sig``."""
    for name, member in sig.members.items():
        if member.flow == Out:
            m.d.comb += getattr(outer, name).eq(getattr(inner, name))
        else:
            m.d.comb += getattr(inner, name).eq(getattr(outer, name))


def hbm_reader_params(cfg):
    """The parameters of the card's HBM channel readers (``hw.dma.reader.AxiBurstReader``):
    ``gen/tops.py`` emits the same reader alone."""
    beat_shift = (cfg.hbm_beat_bytes - 1).bit_length()
    return dict(data_bits=cfg.hbm.data_bits, beat_addr_bits=cfg.hbm_addr_bits - beat_shift,
                len_bits=RUN_BITS, max_burst=cfg.hbm.max_burst_beats,
                max_outstanding=cfg.hbm.max_outstanding)


class Card(wiring.Component):
    """One card's kernel, parameterized by an ApplianceConfig.

    Members
    -------
    s_axi_control : Out(AxiLiteSignature(...)) (a subordinate port: the signature is its view)
    m_axi_insn : Out(Axi4ReadSignature(data_bits=128))
    m_axi_hbm<k> : Out(Axi4Signature(data_bits=hbm.data_bits)), k < hbm.channels
    interrupt : Out(1)
    r_tx, l_tx : Out(stream(Beat)); r_rx, l_rx : In(stream(Beat))  the ring links (cards > 1):
        R to card i + 1, L to card i - 1 (hw/collective/node.py)
    """

    def __init__(self, cfg, *, watchdog=WATCHDOG):
        self.cfg = cfg
        self.watchdog = watchdog
        c = cfg.core
        self.C = cfg.hbm.channels
        self.DB = cfg.hbm.data_bits
        members = {
            "s_axi_control": Out(AxiLiteSignature(addr_bits=regs.ADDR_BITS, data_bits=32)),
            "m_axi_insn": Out(Axi4ReadSignature(addr_bits=64, data_bits=128)),
            "interrupt": Out(1),
        }
        for k in range(self.C):
            members[f"m_axi_hbm{k}"] = Out(Axi4Signature(addr_bits=64, data_bits=self.DB))
        self.vsp_rows = c.vsp_words // c.vector_lanes
        self.ring = cfg.ring_links
        if self.ring:
            beat = stream.Signature(Beat(cfg.link.data_bits))
            members.update({"r_tx": Out(beat), "r_rx": In(beat), "l_tx": Out(beat),
                            "l_rx": In(beat)})
        super().__init__(members)

    def elaborate(self, platform):
        m = Module()
        cfg, c = self.cfg, self.cfg.core
        C, P, rows = self.C, c.vector_lanes, self.vsp_rows
        u = SimpleNamespace()           # the blocks, for the wiring below
        m.submodules.ctrl = u.ctrl = Control(C)
        m.submodules.fetch = u.fetch = Fetch()
        m.submodules.issue = u.issue = Issue(cfg)
        m.submodules.dma_rd = u.dma_rd = DmaRead(channels=C, vector_lanes=P, vsp_rows=rows,
                                                 **hbm_reader_params(cfg))
        # STOREs through a queue: issue goes on while the store engine finishes the last one
        # (its writes' responses), as LOADs and WLOADs do behind the read DMA's queue.
        m.submodules.store_q = u.store_q = SyncFIFO(width=StoreCmd.size, depth=STORE_QUEUE)
        m.submodules.dma_wr = u.dma_wr = DmaWrite(
            channels=C, data_bits=self.DB, vector_lanes=P, vsp_rows=rows,
            max_outstanding=cfg.hbm.max_outstanding)
        m.submodules.wfifo = u.wfifo = WeightFifo(channels=C, data_bits=self.DB,
                                                  depth=c.weight_fifo_tiles)
        m.submodules.mpu = u.mpu = Mpu(lanes=c.lanes, width=c.width, vector_lanes=P,
                                       vsp_rows=rows, xb_words=c.xb_words, channels=C,
                                       reuse=c.reuse, weights=c.weight_dtype,
                                       cache_phases=c.cache_phases)
        m.submodules.vpu = u.vpu = Vpu(lanes=P, vsp_rows=rows, xb_words=c.xb_words,
                                       width=c.width, red_max=cfg.reduce_max,
                                       special_share=c.special_share)
        ring = ["coll"] if self.ring else []
        m.submodules.vsp = u.vsp = Vsp(words=c.vsp_words, lanes=P, segments=c.vsp_segments,
                                       readers=["vpu_a", "vpu_b", "mpu", "store"] + ring,
                                       writers=["vpu", "mpu", "load"] + ring)
        m.submodules.xb = u.xb = Memory(shape=16 * c.width, depth=c.xb_words // c.width, init=[])
        m.submodules.watchdog = u.wd = Watchdog(cycles=self.watchdog)
        u.coll = self._collective(m, u) if self.ring else None

        # Host interface: control registers, the program's fetch; HBM.
        wiring.connect(m, wiring.flipped(self.s_axi_control), u.ctrl.axi)
        m.d.comb += self.interrupt.eq(u.ctrl.interrupt)
        _wire(m, self.m_axi_insn, u.fetch.axi, Axi4ReadSignature(addr_bits=64, data_bits=128))
        m.d.comb += [u.fetch.start.eq(u.ctrl.start),
                     u.fetch.stop.eq(~u.issue.running | u.issue.stopping),
                     u.fetch.prog_addr.eq(u.ctrl.prog_addr), u.fetch.insn_ptr.eq(u.ctrl.insn_ptr),
                     u.fetch.prog_len.eq(u.ctrl.prog_len)]
        hbm_err = self._hbm_channels(m, u)
        self._issue_queues(m, u)
        self._axi_errors(m, u, hbm_err)
        self._data_paths(m, u)
        self._status(m, u)
        return m

    def _collective(self, m, u):
        """The collective unit: COLLs from issue, a VSP port each way, the ring links."""
        m.submodules.coll = coll = CollUnit(self.cfg, timeout=self.watchdog // 2)
        wiring.connect(m, u.issue.q_coll, coll.cmd)
        m.d.comb += [u.issue.done_coll.eq(coll.done), u.issue.coll_err.eq(coll.err),
                     u.issue.coll_err_pc.eq(coll.err_pc), coll.card_reg.eq(u.ctrl.card)]
        wiring.connect(m, coll.rd, u.vsp.r_coll)
        wiring.connect(m, coll.wr, u.vsp.w_coll)
        wiring.connect(m, coll.r_tx, wiring.flipped(self.r_tx))
        wiring.connect(m, wiring.flipped(self.r_rx), coll.r_rx)
        wiring.connect(m, coll.l_tx, wiring.flipped(self.l_tx))
        wiring.connect(m, wiring.flipped(self.l_rx), coll.l_rx)
        return coll

    @staticmethod
    def _axi_errors(m, u, hbm_err):
        """Error responses to HBM accesses (read DMA, store engine, the collective unit's HBM
        beats), each sticky for the run with the pc of its instruction, cleared at ap_start;
        the issue stage gets the first in program order (the least pc)."""
        issue, start = u.issue, u.ctrl.start
        m.d.comb += [u.dma_rd.clear.eq(start), u.dma_wr.clear.eq(start)]
        (best, best_pc), *rest = ((u.dma_rd.err, u.dma_rd.err_pc), (u.dma_wr.err, u.dma_wr.err_pc),
                                  *([hbm_err] if hbm_err else []))
        for err, pc in rest:
            take = err & (~best | (pc < best_pc))
            best, best_pc = best | err, Mux(take, pc, best_pc)
        m.d.comb += [issue.axi_err.eq(best), issue.axi_err_pc.eq(best_pc)]

    @staticmethod
    def _issue_queues(m, u):
        """Instructions from fetch into issue, and from issue to the units and back (done)."""
        issue, store_q, dma_wr = u.issue, u.store_q, u.dma_wr
        wiring.connect(m, u.fetch.out, issue.insn)
        m.d.comb += [issue.exhausted.eq(u.fetch.exhausted), issue.start.eq(u.ctrl.start),
                     issue.misaligned.eq(u.ctrl.prog_addr[0:4] != 0),
                     issue.card_reg.eq(u.ctrl.card)]
        wiring.connect(m, issue.q_dma_rd, u.dma_rd.cmd)
        m.d.comb += [store_q.w_en.eq(issue.q_dma_wr.valid), store_q.w_data.eq(issue.q_dma_wr.payload),
                     issue.q_dma_wr.ready.eq(store_q.w_rdy),
                     dma_wr.cmd.valid.eq(store_q.r_rdy), dma_wr.cmd.payload.eq(store_q.r_data),
                     store_q.r_en.eq(dma_wr.cmd.ready)]
        wiring.connect(m, issue.q_mpu, u.mpu.cmd)
        wiring.connect(m, issue.q_vpu, u.vpu.cmd)
        m.d.comb += [issue.done_dma_rd.eq(u.dma_rd.done), issue.done_dma_wr.eq(dma_wr.done),
                     issue.done_mpu.eq(u.mpu.done), issue.done_vpu.eq(u.vpu.done)]

    @staticmethod
    def _data_paths(m, u):
        """Weight tiles (read DMA -> weight FIFO -> MPU), the VSP's ports, XB (VPU -> MPU)."""
        vpu, mpu, vsp = u.vpu, u.mpu, u.vsp
        wiring.connect(m, u.dma_rd.tiles, u.wfifo.w)
        wiring.connect(m, u.wfifo.r, mpu.wf)
        m.d.comb += mpu.discard.eq(u.issue.stopping)
        for port, vsp_port in ((vpu.r_a, vsp.r_vpu_a), (vpu.r_b, vsp.r_vpu_b), (vpu.w, vsp.w_vpu),
                               (mpu.r_bias, vsp.r_mpu), (mpu.w_out, vsp.w_mpu),
                               (u.dma_rd.w, vsp.w_load), (u.dma_wr.r, vsp.r_store)):
            wiring.connect(m, port, vsp_port)
        xw = u.xb.write_port(granularity=16)
        if u.coll is not None:        # COLL.x16's copy, in cycles the vector unit leaves free
            cx = u.coll.xb
            m.d.comb += [u.coll.xb_ready.eq(~vpu.xb.en),
                         xw.addr.eq(Mux(vpu.xb.en, vpu.xb.row, cx.row)),
                         xw.data.eq(Mux(vpu.xb.en, vpu.xb.data, cx.data)),
                         xw.en.eq(Mux(vpu.xb.en, vpu.xb.mask, Mux(cx.en, cx.mask, 0)))]
        else:
            m.d.comb += [xw.addr.eq(vpu.xb.row), xw.data.eq(vpu.xb.data),
                         xw.en.eq(Mux(vpu.xb.en, vpu.xb.mask, 0))]
        xrow = 16 * mpu.W
        for j in range(mpu.R):         # one read port per token of a matrix-unit step
            xr = u.xb.read_port(transparent_for=())
            m.d.comb += [xr.addr.eq(mpu.xb.addr[j]), xr.en.eq(1),
                         mpu.xb.data[xrow * j:xrow * (j + 1)].eq(xr.data)]

    def _status(self, m, u):
        """The stop (every unit quiet), the watchdog (no unit's progress), the counters."""
        issue, dma_rd, dma_wr, mpu, vpu, wfifo = u.issue, u.dma_rd, u.dma_wr, u.mpu, u.vpu, u.wfifo
        zero = Const(0, 1)
        busy = (dma_rd.busy | dma_wr.busy | u.store_q.r_rdy | mpu.busy | vpu.busy
                | (wfifo.level != 0) | u.fetch.busy | (u.coll.busy if u.coll else zero)
                | (~u.hb.idle if u.coll else zero))
        progress = (issue.issued | dma_rd.done | dma_wr.done | mpu.done | vpu.done | dma_rd.stripe
                    | dma_wr.beat | wfifo.pops
                    | (u.vsp.w_vpu.req.valid & u.vsp.w_vpu.req.ready)
                    | (u.vsp.w_mpu.req.valid & u.vsp.w_mpu.req.ready)
                    | (u.coll.progress if u.coll else zero))
        m.d.comb += [issue.quiet.eq(~busy), u.wd.progress.eq(progress),
                     u.wd.start.eq(u.ctrl.start), u.wd.running.eq(issue.running),
                     u.wd.finish.eq(issue.finish), u.wd.status_in.eq(issue.status),
                     issue.timeout.eq(u.wd.fired),
                     u.ctrl.done.eq(u.wd.done), u.ctrl.status.eq(u.wd.status),
                     # a start only once the last run has stopped (after a TIMEOUT the
                     # kernel drains what it had open first)
                     u.ctrl.busy.eq(issue.running)]
        live = u.wd.live
        self._counters(m, u.ctrl, {
            "cycles": live, "mpu_busy": live & mpu.busy, "vpu_busy": live & vpu.busy,
            "dma_rd_busy": live & dma_rd.busy, "dma_wr_busy": live & dma_wr.busy,
            "hbm_rd_bytes": (dma_rd.stripe, self.cfg.stripe_bytes),
            "hbm_wr_bytes": (dma_wr.elem != 0, dma_wr.elem << Mux(dma_wr.elem_f32, 2, 1)),
            "issue_stall": live & issue.stall, "mpu_starve": live & mpu.starve,
            **self._link_counts(u.coll), "insns": issue.retired,
        })

    def _hbm_channels(self, m, u):
        """Each m_axi_hbm<k>: the read and the store DMA's channel k, shared with the collective
        unit's HBM beats (COLL with hbm) through AXI multiplexers when there is one. Returns
        the beats' error flag and the pc of the COLL it answered (None without)."""
        C, ctrl, dma_rd, dma_wr, coll = self.C, u.ctrl, u.dma_rd, u.dma_wr, u.coll
        rsig = Axi4ReadSignature(addr_bits=64, data_bits=self.DB)
        wsig = Axi4WriteSignature(addr_bits=64, data_bits=self.DB)
        hbm_err = None
        u.hb = None
        if coll is not None:
            m.submodules.coll_hbm = u.hb = hb = HbmBeats(
                channels=C, hbm_bits=self.DB, data_bits=coll.D, run=coll.run,
                max_outstanding=self.cfg.hbm.max_outstanding)
            wiring.connect(m, coll.hrd, hb.rd)
            wiring.connect(m, coll.hwr, hb.wr)
            m.d.comb += [coll.hw_idle.eq(hb.w_idle), hb.clear.eq(ctrl.start)]
            # COLLs run one at a time and end with their HBM accesses answered: an error
            # answers the COLL in the unit (its pc kept from before the flag rises)
            hbm_err_pc = Signal(PC_BITS)
            with m.If(~hb.err):
                m.d.sync += hbm_err_pc.eq(coll.err_pc)
            hbm_err = (hb.err, hbm_err_pc)
        for k in range(C):
            port, ptr = getattr(self, f"m_axi_hbm{k}"), getattr(ctrl, f"hbm_ptr_{k}")
            rd, wr = dma_rd.axi[k], dma_wr.axi[k]
            if coll is not None:
                rmux, wmux = AxiReadMux(rsig), AxiWriteMux(wsig)
                m.submodules[f"rmux{k}"], m.submodules[f"wmux{k}"] = rmux, wmux
                wiring.connect(m, rd, rmux.m0)
                wiring.connect(m, getattr(hb, f"axi_r_{k}"), rmux.m1)
                wiring.connect(m, wr, wmux.m0)
                wiring.connect(m, getattr(hb, f"axi_w_{k}"), wmux.m1)
                rd, wr = rmux.s, wmux.s
                m.d.comb += getattr(hb, f"ptr_{k}").eq(ptr)
            _wire(m, port, rd, rsig)
            _wire(m, port, wr, wsig)
            m.d.comb += [dma_rd.ptr[k].eq(ptr), dma_wr.ptr[k].eq(ptr)]
        return hbm_err

    def _link_counts(self, coll):
        """The link counters' (event, amount): the collective unit's, or none."""
        if coll is None:
            return {name: Const(0, 1) for name in
                    ("link_tx_bytes", "link_rx_bytes", "link_retx", "link_crc_errors")}
        beat_bytes = self.cfg.link.data_bits // 8
        return {"link_tx_bytes": (coll.tx_beats != 0, coll.tx_beats * beat_bytes),
                "link_rx_bytes": (coll.rx_beats != 0, coll.rx_beats * beat_bytes),
                "link_retx": (coll.retx != 0, coll.retx),
                "link_crc_errors": (coll.crc_error != 0, coll.crc_error)}

    @staticmethod
    def _counters(m, ctrl, events):
        """The 64-bit counters of ``events`` {name: condition, or (condition, amount)} into
        the control block's registers of those names, cleared at ap_start."""
        for name, ev in events.items():
            cond, amount = ev if isinstance(ev, tuple) else (ev, 1)
            reg = Signal(64, name=f"cnt_{name}")
            with m.If(ctrl.start):
                m.d.sync += reg.eq(0)
            with m.Elif(cond):
                m.d.sync += reg.eq(reg + amount)
            m.d.comb += getattr(ctrl, name).eq(reg)


class Watchdog(wiring.Component):
    """TIMEOUT for a run that makes no progress: ``cycles`` cycles of a running kernel without
    any unit's progress end it with the TIMEOUT status (ap_done at once; the issue stage stops
    and the kernel takes no new start until what it had open has completed, or a reset).

    Parameters
    ----------
    cycles : int

    Members
    -------
    start : ``In(1)``; running : ``In(1)``
        A run starts; it runs (issue is running or stopping).
    progress : ``In(1)``
        Some unit made progress this cycle.
    finish : ``In(1)``; status_in : ``In(32)``
        The issue stage's end of the run, and its status.
    done : ``Out(1)``
        The run ends (ap_done): finished, or timed out (one pulse, not again at a late finish).
    fired : ``Out(1)``
        Pulse as it times out (the issue stage stops, TIMEOUT with the pc it names).
    status : ``Out(32)``
        The issue stage's, with the TIMEOUT code once timed out.
    live : ``Out(1)``
        Running and not timed out (the counters count then).

    Timing: the idle count and the timed-out flag are registers; ``done`` and ``status`` are
    combinational on them (TIMEOUT in the cycle the count reaches ``cycles``).
    """

    start: In(1)
    running: In(1)
    progress: In(1)
    finish: In(1)
    status_in: In(32)
    done: Out(1)
    fired: Out(1)
    status: Out(32)
    live: Out(1)

    def __init__(self, *, cycles):
        self._cycles = cycles
        super().__init__()

    def elaborate(self, platform):
        m = Module()
        idle_count = Signal(range(self._cycles + 1))
        timeout = Signal()
        timed_out = Signal()
        with m.If(self.start | self.progress | ~self.running):
            m.d.sync += idle_count.eq(0)
        with m.Elif(idle_count != self._cycles):
            m.d.sync += idle_count.eq(idle_count + 1)
        m.d.comb += timeout.eq(self.running & (idle_count == self._cycles))
        with m.If(self.start):
            m.d.sync += timed_out.eq(0)
        with m.If(timeout):
            m.d.sync += timed_out.eq(1)
        m.d.comb += [
            self.done.eq((self.finish | timeout) & ~timed_out),
            self.fired.eq(timeout & ~timed_out),
            self.status.eq(Mux(timed_out, Cat(Const(ERROR_CODES["TIMEOUT"], 8),
                                              self.status_in[8:32]), self.status_in)),
            self.live.eq(self.running & ~timed_out),
        ]
        return m
