"""A collective node: the ring engine's two channels and the two link ports of one card.

Port R joins the card to its right-hand neighbour (card i + 1), port L to its left-hand one.
The right-hand ring's data leave through R and arrive through L; the left-hand ring's the
other way; acknowledgements ride the opposite directions. This is the part of the card that
the N-card fabric simulation instantiates N times (with the node's memory modelled in C++);
on the card kernel it sits beside the core.
"""

from amaranth.hdl import Module
from amaranth.lib import stream, wiring
from amaranth.lib.wiring import In, Out

from hw.ring import MAX_CARDS, NodeParams, node_params

from .engine import MemReadPort, MemWrite, RingChannel, SegEntry
from .link import Beat, LinkPort

__all__ = ["CollNode", "NodeParams", "node_params", "node_kwargs"]


def node_kwargs(cfg):
    """CollNode's constructor arguments for a config."""
    p = node_params(cfg)
    return dict(data_bits=p.data_bits, frame_beats=p.frame_beats, window=p.rx_frames,
                rx_frames=p.rx_frames, timeout=p.timeout, retries=p.retries)


class CollNode(wiring.Component):
    """Members
    -------
    r_tx, l_tx : Out(stream(Beat)); r_rx, l_rx : In(stream(Beat))  the two link ports
    start : In(1) pulse; busy : Out(1); check : In(8) carried in every frame's tag (engine.py)
    op, fp16, cards, card, bidir, chunk_log2, group, src, dst : In  configuration
    max_chunks_r, max_chunks_l : In  chunks of the longest segment, per ring direction
    seg_we, seg_left, seg_addr, seg_data : In  segment tables (one per direction)
    mem_<ch>_rd_src, mem_<ch>_rd_op : Out(MemReadPort); mem_<ch>_wr : Out(stream(MemWrite))
        the channels' memory ports (ch r/l; engine.py)
    link_error : Out(2) sticky, per port; order_error : Out(1)
    retx, crc_error : Out(2)  frames sent again / received with a bad CRC this cycle (both ports)
    tx_beat_r, tx_beat_l, rx_beat_r, rx_beat_l : Out(1) pulses (wire beats)
    pay_tx, pay_rx : Out(2)  payload beats the channels gave to / took from the link layer this
        cycle (each once: retransmissions, trailers and control frames are not counted)
    """

    def __init__(self, *, data_bits, frame_beats, window, rx_frames, timeout, retries):
        self.D = data_bits
        kw = dict(data_bits=data_bits, frame_beats=frame_beats, window=window,
                  rx_frames=rx_frames, timeout=timeout, retries=retries)
        self.port_r = LinkPort(**kw)
        self.port_l = LinkPort(**kw)
        self.ch_r = RingChannel(data_bits=data_bits)
        self.ch_l = RingChannel(data_bits=data_bits)
        members = {
            "r_tx": Out(stream.Signature(Beat(data_bits))), "r_rx": In(stream.Signature(Beat(data_bits))),
            "l_tx": Out(stream.Signature(Beat(data_bits))), "l_rx": In(stream.Signature(Beat(data_bits))),
            "start": In(1), "busy": Out(1), "check": In(8),
            "op": In(2), "fp16": In(1), "cards": In(range(MAX_CARDS + 1)), "card": In(range(MAX_CARDS)),
            "bidir": In(1), "chunk_log2": In(4), "group": In(8), "src": In(32), "dst": In(32),
            "max_chunks_r": In(24), "max_chunks_l": In(24),
            "seg_we": In(1), "seg_left": In(1), "seg_addr": In(range(MAX_CARDS)), "seg_data": In(SegEntry),
            "link_error": Out(2), "order_error": Out(1),
            "retx": Out(2), "crc_error": Out(2),
            "tx_beat_r": Out(1), "tx_beat_l": Out(1), "rx_beat_r": Out(1), "rx_beat_l": Out(1),
            "pay_tx": Out(2), "pay_rx": Out(2),
        }
        for ch in ("r", "l"):
            members[f"mem_{ch}_rd_src"] = Out(MemReadPort(data_bits))
            members[f"mem_{ch}_rd_op"] = Out(MemReadPort(data_bits))
            members[f"mem_{ch}_wr"] = Out(stream.Signature(MemWrite(data_bits)))
        super().__init__(members)

    def elaborate(self, platform):
        m = Module()
        m.submodules.port_r = pr = self.port_r
        m.submodules.port_l = pl = self.port_l
        m.submodules.ch_r = cr = self.ch_r
        m.submodules.ch_l = cl = self.ch_l
        wiring.connect(m, pr.tx, wiring.flipped(self.r_tx))
        wiring.connect(m, wiring.flipped(self.r_rx), pr.rx)
        wiring.connect(m, pl.tx, wiring.flipped(self.l_tx))
        wiring.connect(m, wiring.flipped(self.l_rx), pl.rx)
        # right-hand ring: out through R, in through L; left-hand ring the other way
        wiring.connect(m, cr.send, pr.send)
        wiring.connect(m, pl.recv, cr.recv)
        wiring.connect(m, cl.send, pl.send)
        wiring.connect(m, pr.recv, cl.recv)
        for ch, c in (("r", cr), ("l", cl)):
            for port in ("rd_src", "rd_op", "wr"):
                wiring.connect(m, getattr(c, port), wiring.flipped(getattr(self, f"mem_{ch}_{port}")))
            for name in ("op", "fp16", "cards", "card", "chunk_log2", "group", "src", "dst", "check"):
                m.d.comb += c.config[name].eq(getattr(self, name))
            m.d.comb += [c.seg_addr.eq(self.seg_addr), c.seg_data.eq(self.seg_data)]
        m.d.comb += [cr.config.left.eq(0), cl.config.left.eq(1),
                     cr.config.max_chunks.eq(self.max_chunks_r), cl.config.max_chunks.eq(self.max_chunks_l),
                     cr.seg_we.eq(self.seg_we & ~self.seg_left), cl.seg_we.eq(self.seg_we & self.seg_left),
                     cr.start.eq(self.start), cl.start.eq(self.start & self.bidir)]
        m.d.comb += [self.busy.eq(~cr.done | ~cl.done),
                     self.order_error.eq(cr.order_error | cl.order_error),
                     self.retx.eq(pr.retx + pl.retx),
                     self.crc_error.eq(pr.crc_error + pl.crc_error),
                     self.tx_beat_r.eq(pr.tx_beat), self.tx_beat_l.eq(pl.tx_beat),
                     self.rx_beat_r.eq(pr.rx_beat), self.rx_beat_l.eq(pl.rx_beat)]
        m.d.comb += self.link_error.eq(pr.error | (pl.error << 1))
        m.d.comb += [self.pay_tx.eq((cr.send.valid & cr.send.ready) + (cl.send.valid & cl.send.ready)),
                     self.pay_rx.eq((cr.recv.valid & cr.recv.ready) + (cl.recv.valid & cl.recv.ready))]
        return m
