"""DMA between the HBM channels and the core.

Read side (LOAD, WLOAD): one AXI burst read engine per channel, all given the same stripe
rows; their beats are joined into stripes (one beat of every channel). A WLOAD's stripes are
weight tiles for the weight FIFO; a LOAD's stripes are fp16 vectors, converted to fp32 and
written to the VSP ``P`` words per cycle.

Write side (STORE): VSP rows are read, split into elements, rounded to fp16 and placed by the
instruction's pattern; consecutive elements that land in one channel beat are merged into one
strobed single-beat AXI write. Every write's response is awaited before the STORE completes.
"""

from amaranth.hdl import Cat, Const, Module, Mux, Signal
from amaranth.lib import data, stream, wiring
from amaranth.lib.fifo import SyncFIFO, SyncFIFOBuffered
from amaranth.lib.wiring import In, Out

from hw.arith.units import Fp32ToFp16, fp16_to_fp32_comb
from hw.axi import Axi4WriteSignature, Burst
from hw.dma.reader import AxiBurstReader

from .cmds import DmaReadCmd, StoreCmd
from .vsp import ReadPort, WritePort

__all__ = ["DmaRead", "DmaWrite", "STORE_QUEUE"]

STORE_QUEUE = 2          # STOREs issued ahead of the store engine (hw/core/card.py)


class DmaRead(wiring.Component):
    """LOAD and WLOAD over all channels.

    Members
    -------
    cmd : In(stream(DmaReadCmd)); done : Out(1) pulse per finished instruction (in order)
    readers : the per-channel AxiBurstReader components (their ``axi`` ports are wired by the
        card top), exposed as ``self.readers``
    tiles : Out(stream(stripe bits))  into the weight FIFO
    w : Out(WritePort)  LOAD results into the VSP
    ptr_<k> : In(64)  channel buffer bases
    busy, err : Out(1); bytes_read : Out(1) pulse per stripe
    """

    def __init__(self, *, channels, data_bits, beat_addr_bits, max_burst, max_outstanding,
                 vector_lanes, vsp_rows):
        self.C, self.DB = channels, data_bits
        self.S = channels * data_bits // 8
        self.P = vector_lanes
        self.vsp_row_bits = (vsp_rows - 1).bit_length()
        self.readers = [AxiBurstReader(data_bits=data_bits, beat_addr_bits=beat_addr_bits,
                                       len_bits=24, max_burst=max_burst,
                                       max_outstanding=max_outstanding)
                        for _ in range(channels)]
        members = {
            "cmd": In(stream.Signature(DmaReadCmd)),
            "done": Out(1),
            "tiles": Out(stream.Signature(self.S * 8)),
            "w": Out(WritePort(self.vsp_row_bits, vector_lanes)),
            "busy": Out(1),
            "err": Out(1),
            "stripe": Out(1),
        }
        for k in range(channels):
            members[f"ptr_{k}"] = In(64)
        super().__init__(members)

    def elaborate(self, platform):
        m = Module()
        C, P = self.C, self.P
        pshift = (P - 1).bit_length()
        elems = self.S // 2                      # fp16 elements per stripe
        for k, r in enumerate(self.readers):
            m.submodules[f"rd{k}"] = r
            m.d.comb += r.base.eq(getattr(self, f"ptr_{k}"))

        # -- command side: up to 4 commands queued (issue goes on while a reader is still
        # busy with the last run's bursts); every reader is given the same run of beats ----
        kinds = SyncFIFOBuffered(width=1 + 16 + 16 + 1, depth=4)   # wload, vsp, n, f32
        m.submodules.kinds = kinds
        runs = SyncFIFO(width=48, depth=4)                          # row, count
        m.submodules.runs = runs
        cmd = self.cmd.payload
        accept = self.cmd.valid & kinds.w_rdy & runs.w_rdy
        m.d.comb += [self.cmd.ready.eq(kinds.w_rdy & runs.w_rdy), kinds.w_en.eq(accept),
                     kinds.w_data.eq(Cat(cmd.wload, cmd.vsp, cmd.n, cmd.f32)),
                     runs.w_en.eq(accept), runs.w_data.eq(Cat(cmd.row, cmd.count))]
        sent = Signal(C)
        all_sent = Signal()
        m.d.comb += all_sent.eq(Cat(*[sent[k] | r.cmd.ready for k, r in enumerate(self.readers)]).all())
        for k, r in enumerate(self.readers):
            m.d.comb += [r.cmd.valid.eq(runs.r_rdy & ~sent[k]),
                         r.cmd.payload.addr.eq(runs.r_data[0:24]),
                         r.cmd.payload.beats.eq(runs.r_data[24:48])]
        with m.If(runs.r_rdy & all_sent):
            m.d.comb += runs.r_en.eq(1)
            m.d.sync += sent.eq(0)
        with m.Else():
            for k, r in enumerate(self.readers):
                with m.If(r.cmd.valid & r.cmd.ready):
                    m.d.sync += sent[k].eq(1)

        # -- join the channels' beats into stripes ----------------------------------------
        joined_valid = Cat(*[r.data.valid for r in self.readers]).all()
        stripe = Cat(*[r.data.payload.data for r in self.readers])
        last = self.readers[0].data.payload.last
        # All channels were given the same bursts: their `last` flags must agree.
        lasts = Cat(*[r.data.payload.last for r in self.readers])
        berr = Cat(*[r.data.payload.err for r in self.readers]).any() | (lasts.any() & ~lasts.all())
        take = Signal()
        for r in self.readers:
            m.d.comb += r.data.ready.eq(take)
        with m.If(take & berr):
            m.d.sync += self.err.eq(1)
        m.d.comb += self.stripe.eq(take)

        head_wload = kinds.r_data[0]
        head_vsp = kinds.r_data[1:17]
        head_n = kinds.r_data[17:33]
        head_f32 = kinds.r_data[33]

        # WLOAD: stripes straight into the weight FIFO.
        m.d.comb += [self.tiles.payload.eq(stripe)]
        # LOAD: hold a stripe, write it out P elements per cycle.
        held = Signal(self.S * 8, reset_less=True)
        held_valid = Signal()
        held_last = Signal()
        pos = Signal(range(elems // P + 1))      # write beat within the stripe
        beats_per_stripe = Mux(head_f32, elems // (2 * P), elems // P)
        stripe_elems = Mux(head_f32, elems // 2, elems)
        done_elems = Signal(17)                  # elements of this LOAD consumed so far
        with m.If(kinds.r_rdy & head_wload):
            m.d.comb += [self.tiles.valid.eq(joined_valid), take.eq(joined_valid & self.tiles.ready)]
            with m.If(take & last):
                m.d.comb += [kinds.r_en.eq(1), self.done.eq(1)]
        with m.Elif(kinds.r_rdy):
            with m.If(~held_valid):
                m.d.comb += take.eq(joined_valid)
                with m.If(take):
                    m.d.sync += [held.eq(stripe), held_valid.eq(1), held_last.eq(last), pos.eq(0)]
        # Converter: elements [base, base + P) of the held stripe.
        e0 = done_elems + (pos << pshift)
        words = []
        for j in range(P):
            h = Signal(16, name=f"ld_h{j}")
            sel = held[0:16]
            for q in range(elems // P):
                sel = Mux(pos == q, held[16 * (q * P + j):16 * (q * P + j + 1)], sel)
            raw = held[0:32]
            for q in range(elems // (2 * P)):
                raw = Mux(pos == q, held[32 * (q * P + j):32 * (q * P + j + 1)], raw)
            m.d.comb += h.eq(sel)
            words.append(Mux(head_f32, raw, fp16_to_fp32_comb(m, h, f"ld{j}")))
        mask = Signal(P)
        for j in range(P):
            m.d.comb += mask[j].eq(e0 + j < head_n)
        in_range = e0 < head_n
        m.d.comb += [self.w.req.valid.eq(held_valid & in_range & ~head_wload & kinds.r_rdy),
                     self.w.req.payload.row.eq((head_vsp >> pshift) + (e0 >> pshift)),
                     self.w.req.payload.mask.eq(mask),
                     self.w.req.payload.data.eq(Cat(*words))]
        beat_done = held_valid & (~in_range | (self.w.req.valid & self.w.req.ready))
        with m.If(beat_done):
            with m.If((pos == beats_per_stripe - 1) | ~in_range):
                m.d.sync += [held_valid.eq(0), done_elems.eq(done_elems + stripe_elems)]
                with m.If(held_last):
                    m.d.sync += done_elems.eq(0)
                    m.d.comb += [kinds.r_en.eq(1), self.done.eq(1)]
            with m.Else():
                m.d.sync += pos.eq(pos + 1)
        m.d.comb += self.busy.eq((kinds.level != 0) | runs.r_rdy | self.cmd.valid |
                                 Cat(*[r.busy for r in self.readers]).any())
        return m


class DmaWrite(wiring.Component):
    """STORE: VSP -> fp16 -> strobed single-beat AXI writes on the channels.

    Members
    -------
    cmd : In(stream(StoreCmd)); done : Out(1) pulse per finished STORE
    r : Out(ReadPort)  VSP reads
    axi_<k> : Out(Axi4WriteSignature)  the write channels of HBM channel k
    ptr_<k> : In(64)
    busy, err : Out(1); beat : Out(1) pulse per beat written
    """

    def __init__(self, *, channels, data_bits, vector_lanes, vsp_rows, max_outstanding):
        self.C, self.B = channels, data_bits // 8
        self.S = channels * self.B
        self.P = vector_lanes
        self.vsp_row_bits = (vsp_rows - 1).bit_length()
        self.max_out = max_outstanding
        members = {
            "cmd": In(stream.Signature(StoreCmd)),
            "done": Out(1),
            "r": Out(ReadPort(self.vsp_row_bits, vector_lanes)),
            "busy": Out(1),
            "err": Out(1),
            "beat": Out(1),
            "elem": Out(1),
            "elem_f32": Out(1),
        }
        for k in range(channels):
            members[f"axi_{k}"] = Out(Axi4WriteSignature(addr_bits=64, data_bits=data_bits))
            members[f"ptr_{k}"] = In(64)
        super().__init__(members)

    def elaborate(self, platform):
        m = Module()
        C, B, P = self.C, self.B, self.P
        pshift = (P - 1).bit_length()
        bshift = (B - 1).bit_length()
        cmd = Signal(StoreCmd)
        active = Signal()

        # -- read VSP rows into a FIFO ----------------------------------------------------
        rows_total = (cmd.n + (P - 1)) >> pshift
        rreq = Signal(16)
        rfifo = SyncFIFOBuffered(width=32 * P, depth=8)
        m.submodules.rfifo = rfifo
        inflight = Signal()
        m.d.comb += [self.r.req.valid.eq(active & (rreq < rows_total) & ((rfifo.level + inflight) < 6)),
                     self.r.req.payload.eq((cmd.vsp >> pshift) + rreq)]
        with m.If(self.r.req.valid & self.r.req.ready):
            m.d.sync += rreq.eq(rreq + 1)
        m.d.sync += inflight.eq(self.r.req.valid & self.r.req.ready)
        m.d.comb += [rfifo.w_en.eq(self.r.resp.valid), rfifo.w_data.eq(self.r.resp.payload)]

        # -- elements one per cycle, through one fp32 -> fp16 unit ------------------------
        conv = Fp32ToFp16()
        m.submodules.conv = conv
        lane = Signal(range(P + 1))
        i = Signal(17)                     # element index
        e = Signal(16)                     # place in the group
        k = Signal(16)                     # group in the row
        row = Signal(24)
        byte = Signal(16)                  # byte in the stripe
        zl = Mux(cmd.f32, 2, 1)            # log2 of the element size in bytes
        epg_m1 = (Const(1, 17) << cmd.lepg) - 1
        gpr_m1 = (Const(1, 17) << cmd.lgpr) - 1

        beats = SyncFIFOBuffered(width=8 + 24 + 9 * B, depth=8)
        m.submodules.beats = beats
        in_conv = Signal(range(4))
        launch = Signal()
        m.d.comb += launch.eq(active & (i < cmd.n) & rfifo.r_rdy & ((beats.level + in_conv) < 5))
        word = rfifo.r_data[0:32]
        for j in range(1, P):
            word = Mux(lane == j, rfifo.r_data[32 * j:32 * (j + 1)], word)
        m.d.comb += [conv.a.eq(word), self.elem.eq(launch), self.elem_f32.eq(cmd.f32)]
        with m.If(launch):
            m.d.sync += i.eq(i + 1)
            with m.If(lane == P - 1):
                m.d.sync += lane.eq(0)
                m.d.comb += rfifo.r_en.eq(1)
            with m.Else():
                m.d.sync += lane.eq(lane + 1)
            with m.If(e == epg_m1):
                m.d.sync += e.eq(0)
                with m.If(k == gpr_m1):
                    m.d.sync += [k.eq(0), row.eq(row + cmd.rstride), byte.eq(cmd.off)]
                with m.Else():
                    m.d.sync += [k.eq(k + 1), byte.eq(byte - (e << zl) + cmd.gstride)]
            with m.Else():
                m.d.sync += [e.eq(e + 1), byte.eq(byte + (1 << zl))]
        # The last lane of a partial final row: drop the rest of the row.
        with m.If(active & (i == cmd.n) & rfifo.r_rdy & (lane != 0)):
            m.d.comb += rfifo.r_en.eq(1)
            m.d.sync += lane.eq(0)

        # Metadata alongside the converter (latency 2).
        meta = data.StructLayout({"v": 1, "last": 1, "row": 24, "byte": 16, "word": 32})
        m0 = Signal(meta)
        m.d.comb += [m0.v.eq(launch), m0.last.eq(i == cmd.n - 1), m0.row.eq(row), m0.byte.eq(byte),
                     m0.word.eq(word)]
        m1 = Signal(meta)
        m2 = Signal(meta)
        m.d.sync += [m1.eq(m0), m2.eq(m1)]
        m.d.sync += in_conv.eq(in_conv + launch - m2.v)

        # -- coalesce into beats ------------------------------------------------------------
        cur_v = Signal()
        cur_ch = Signal(8)
        cur_row = Signal(24)
        cur_data = Signal(8 * B)
        cur_strb = Signal(B)
        ch = m2.byte >> bshift
        boff = m2.byte[0:bshift]
        same = cur_v & (cur_ch == ch) & (cur_row == m2.row)
        emit = Signal()
        emit_ch = Signal(8)
        emit_row = Signal(24)
        emit_data = Signal(8 * B)
        emit_strb = Signal(B)
        new_data = Signal(8 * B)
        new_strb = Signal(B)
        m.d.comb += [new_data.eq(Mux(cmd.f32, Cat(*([m2.word] * (B // 4))), Cat(*([conv.o] * (B // 2))))),
                     new_strb.eq(Mux(cmd.f32, Const(0xF, B), Const(3, B)) << boff)]
        with m.If(m2.v):
            with m.If(same):
                merged_d = Signal(8 * B)
                for b in range(B):
                    m.d.comb += merged_d[8 * b:8 * (b + 1)].eq(
                        Mux(new_strb[b], new_data[8 * b:8 * (b + 1)], cur_data[8 * b:8 * (b + 1)]))
                with m.If(m2.last):
                    m.d.comb += [emit.eq(1), emit_ch.eq(cur_ch), emit_row.eq(cur_row),
                                 emit_data.eq(merged_d), emit_strb.eq(cur_strb | new_strb)]
                    m.d.sync += cur_v.eq(0)
                with m.Else():
                    m.d.sync += [cur_data.eq(merged_d), cur_strb.eq(cur_strb | new_strb)]
            with m.Else():
                with m.If(cur_v):
                    m.d.comb += [emit.eq(1), emit_ch.eq(cur_ch), emit_row.eq(cur_row),
                                 emit_data.eq(cur_data), emit_strb.eq(cur_strb)]
                m.d.sync += [cur_v.eq(1), cur_ch.eq(ch), cur_row.eq(m2.row), cur_data.eq(new_data),
                             cur_strb.eq(new_strb)]
        # A last element that started a new beat is emitted the cycle after.
        flush = Signal()
        m.d.sync += flush.eq(m2.v & m2.last & ~same)
        with m.If(flush & cur_v):
            m.d.comb += [emit.eq(1), emit_ch.eq(cur_ch), emit_row.eq(cur_row),
                         emit_data.eq(cur_data), emit_strb.eq(cur_strb)]
            m.d.sync += cur_v.eq(0)
        m.d.comb += [beats.w_en.eq(emit),
                     beats.w_data.eq(Cat(emit_ch, emit_row, emit_data, emit_strb))]

        # -- per-channel AXI writes: AW and W together, responses counted --------------------
        head_ch = beats.r_data[0:8]
        head_row = beats.r_data[8:32]
        head_data = beats.r_data[32:32 + 8 * B]
        head_strb = beats.r_data[32 + 8 * B:32 + 9 * B]
        outstanding = Signal(range(C * (self.max_out + 1) + 1))
        aw_sent = Signal()
        w_sent = Signal()
        sent_now = Signal()
        resp_now = Signal(range(C + 1))
        resps = []
        for c in range(C):
            axi = getattr(self, f"axi_{c}")
            mine = beats.r_rdy & (head_ch == c)
            ptr = getattr(self, f"ptr_{c}")
            m.d.comb += [
                axi.awid.eq(0), axi.awlen.eq(0), axi.awsize.eq(bshift), axi.awburst.eq(Burst.INCR),
                axi.awaddr.eq(ptr + (head_row << bshift)),
                axi.awvalid.eq(mine & ~aw_sent & (outstanding < self.max_out * C)),
                axi.wdata.eq(head_data), axi.wstrb.eq(head_strb), axi.wlast.eq(1),
                axi.wvalid.eq(mine & ~w_sent & (outstanding < self.max_out * C)),
                axi.bready.eq(1),
            ]
            with m.If(axi.bvalid & ((axi.bresp != 0) | (axi.bid != 0))):
                m.d.sync += self.err.eq(1)
            resps.append(axi.bvalid)
        aw_ok = Signal()
        w_ok = Signal()
        for c in range(C):
            axi = getattr(self, f"axi_{c}")
            with m.If(head_ch == c):
                m.d.comb += [aw_ok.eq(aw_sent | (axi.awvalid & axi.awready)),
                             w_ok.eq(w_sent | (axi.wvalid & axi.wready))]
        with m.If(beats.r_rdy & aw_ok & w_ok):
            m.d.comb += [beats.r_en.eq(1), sent_now.eq(1)]
            m.d.sync += [aw_sent.eq(0), w_sent.eq(0)]
        with m.Elif(beats.r_rdy):
            m.d.sync += [aw_sent.eq(aw_ok), w_sent.eq(w_ok)]
        m.d.comb += resp_now.eq(sum(resps))
        m.d.sync += outstanding.eq(outstanding + sent_now - resp_now)
        m.d.comb += self.beat.eq(sent_now)

        # -- command and completion ------------------------------------------------------------
        m.d.comb += self.cmd.ready.eq(~active)
        with m.If(self.cmd.valid & self.cmd.ready):
            p = self.cmd.payload
            m.d.sync += [cmd.eq(p), active.eq(1), rreq.eq(0), i.eq(0), lane.eq(0), e.eq(0),
                         k.eq(0), row.eq(p.row), byte.eq(p.off)]
        finished = (active & (i == cmd.n) & (rfifo.level == 0) & (in_conv == 0) & ~m1.v & ~m2.v & ~cur_v
                    & ~flush & (beats.level == 0) & (outstanding == 0) & (resp_now == 0) & ~inflight
                    & (rreq == rows_total))
        with m.If(finished):
            m.d.sync += active.eq(0)
            m.d.comb += self.done.eq(1)
        m.d.comb += self.busy.eq(active)
        return m
