# amaranth: UnusedElaboratable=no
"""The tops a config is emitted as: each a name and a builder of its Amaranth component.

Every top here is a block the card kernel uses, emitted alone too so that it can be tested
and synthesized on its own.
"""

import json

from amaranth.hdl import ClockDomain, ClockSignal, Module, ResetSignal
from amaranth.lib import wiring
from amaranth.lib.wiring import In, Out

from hw.axi import Axi4ReadSignature, Axi4Signature, Axi4WriteSignature
from hw.collective.node import CollNode, node_kwargs
from hw.core.card import Card, hbm_reader_params
from hw.dma.mux import AxiReadMux, AxiWriteMux
from hw.dma.reader import AxiBurstReader

__all__ = ["TOPS", "build_top", "reader_params", "hbm_beats_params", "AxiMux", "VitisCard"]


LINKS = ("r_tx", "r_rx", "l_tx", "l_rx")


class VitisCard(wiring.Component):
    """The card kernel as Vitis packages it: ``ap_clk`` and active-low ``ap_rst_n`` around
    :class:`hw.core.card.Card`, the ring links as AXI4-Stream ports ``axis_<link>_t{data,last,
    valid,ready}`` (Vivado infers them as axis interfaces), every other port passed through with
    its name."""

    def __init__(self, cfg, **kwargs):
        self.card = Card(cfg, **kwargs)
        members = {n: mb for n, mb in self.card.signature.members.items() if n not in LINKS}
        if self.card.ring:
            for link in LINKS:
                out = link.endswith("tx")
                data, ctl = (Out, In) if out else (In, Out)
                members.update({f"axis_{link}_tdata": data(cfg.link.data_bits),
                                f"axis_{link}_tlast": data(1), f"axis_{link}_tvalid": data(1),
                                f"axis_{link}_tready": ctl(1)})
        members["ap_clk"] = In(1)
        members["ap_rst_n"] = In(1)
        super().__init__(members)

    def elaborate(self, platform):
        m = Module()
        m.domains.sync = ClockDomain("sync")
        m.d.comb += [ClockSignal("sync").eq(self.ap_clk), ResetSignal("sync").eq(~self.ap_rst_n)]
        m.submodules.card = self.card
        for name, member in self.card.signature.members.items():
            if name in LINKS:
                s = getattr(self.card, name)
                ax = {f: getattr(self, f"axis_{name}_t{f}") for f in ("data", "last", "valid", "ready")}
                if name.endswith("tx"):
                    m.d.comb += [ax["data"].eq(s.payload.data), ax["last"].eq(s.payload.last),
                                 ax["valid"].eq(s.valid), s.ready.eq(ax["ready"])]
                else:
                    m.d.comb += [s.payload.data.eq(ax["data"]), s.payload.last.eq(ax["last"]),
                                 s.valid.eq(ax["valid"]), ax["ready"].eq(s.ready)]
            elif member.is_port:
                if member.flow == In:
                    m.d.comb += getattr(self.card, name).eq(getattr(self, name))
                else:
                    m.d.comb += getattr(self, name).eq(getattr(self.card, name))
            else:
                wiring.connect(m, wiring.flipped(getattr(self, name)), getattr(self.card, name))
        return m


class AxiMux(wiring.Component):
    """One HBM channel port shared by ``managers`` AXI4 managers: :class:`hw.dma.mux.AxiReadMux`
    and :class:`hw.dma.mux.AxiWriteMux` side by side, as the card joins its DMA and the collective
    unit's HBM beats on each ``m_axi_hbm<k>``.

    Attributes
    ----------
    depth : int
        Bursts in flight on each side at most (the multiplexers' order FIFOs).

    Members
    -------
    m<i> : ``In(Axi4Signature)``, i < managers
        The managers' ports (read and write channels, flat).
    s : ``Out(Axi4Signature)``
        The subordinate's.
    """

    def __init__(self, *, addr_bits, data_bits, managers=2):
        self._kw = dict(addr_bits=addr_bits, data_bits=data_bits)
        self._managers = managers
        self.rd = AxiReadMux(Axi4ReadSignature(**self._kw), managers=managers)
        self.wr = AxiWriteMux(Axi4WriteSignature(**self._kw), managers=managers)
        self.depth = self.rd.depth           # bursts in flight on each side, at most
        sig = Axi4Signature(**self._kw)
        members = {f"m{i}": In(sig) for i in range(managers)}
        members["s"] = Out(sig)
        super().__init__(members)

    def elaborate(self, platform):
        m = Module()
        m.submodules.rd, m.submodules.wr = self.rd, self.wr
        for mux in (self.rd, self.wr):
            sig = mux.sig
            for port in [*(f"m{i}" for i in range(self._managers)), "s"]:
                outer, inner = getattr(self, port), getattr(mux, port)
                for name, member in sig.members.items():
                    a, b = getattr(outer, name), getattr(inner, name)
                    # into the mux: the managers' outputs and the subordinate's inputs
                    into = (member.flow == Out) == (port != "s")
                    m.d.comb += (b.eq(a) if into else a.eq(b))
        return m


def hbm_beats_params(cfg):
    """:class:`hw.dma.beats.HbmBeats` parameters of ``cfg``: the collective unit's HBM path (COLL
    with hbm), whose runs are ``min(32, 8 per_row)`` beats (hw.core.coll.CollUnit.run). Not a top
    of its own: alone, its unused AXI inputs (RID, RLAST, BID) fail the -Wall lint; its cocotb
    test (tests/test_axi_units.py) converts it directly."""
    C, hb, D = cfg.hbm.channels, cfg.hbm.data_bits, cfg.link.data_bits
    per_row = C // max(1, D // hb)
    return dict(channels=C, hbm_bits=hb, data_bits=D, run=min(32, per_row * 8),
                max_outstanding=cfg.hbm.max_outstanding)


def reader_params(cfg):
    """AxiBurstReader parameters for one HBM channel of ``cfg``: the card's readers'."""
    return hbm_reader_params(cfg)


TOPS = {
    "card": lambda cfg: VitisCard(cfg),
    "hbm_reader": lambda cfg: AxiBurstReader(**reader_params(cfg)),
    "coll_node": lambda cfg: CollNode(**node_kwargs(cfg)),
    "axi_mux": lambda cfg: AxiMux(addr_bits=64, data_bits=cfg.hbm.data_bits),
}


def build_top(name, cfg):
    return TOPS[name](cfg)


def top_key(name, cfg, **kwargs):
    """What :func:`gen.verilog.to_verilog` caches the RTLIL of top ``name`` of ``cfg`` under
    (``kwargs``: the top's constructor arguments beyond the config, e.g. the card's watchdog)."""
    return json.dumps([name, cfg.to_json(), sorted(kwargs.items())])
