# amaranth: UnusedElaboratable=no
"""The tops a config is emitted as: each a name and a builder of its Amaranth component.

Every top here is a block the card kernel uses, emitted alone too so that it can be tested
and synthesized on its own.
"""

import json

from amaranth.hdl import ClockDomain, ClockSignal, Module, ResetSignal
from amaranth.lib import wiring
from amaranth.lib.wiring import In, Out

from hw.collective.node import CollNode, node_kwargs
from hw.core.card import Card, hbm_reader_params
from hw.dma.reader import AxiBurstReader

__all__ = ["TOPS", "build_top", "reader_params", "VitisCard"]


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


def reader_params(cfg):
    """AxiBurstReader parameters for one HBM channel of ``cfg``: the card's readers'."""
    return hbm_reader_params(cfg)


TOPS = {
    "card": lambda cfg: VitisCard(cfg),
    "hbm_reader": lambda cfg: AxiBurstReader(**reader_params(cfg)),
    "coll_node": lambda cfg: CollNode(**node_kwargs(cfg)),
}


def build_top(name, cfg):
    return TOPS[name](cfg)


def top_key(name, cfg, **kwargs):
    """What :func:`gen.verilog.to_verilog` caches the RTLIL of top ``name`` of ``cfg`` under
    (``kwargs``: the top's constructor arguments beyond the config, e.g. the card's watchdog)."""
    return json.dumps([name, cfg.to_json(), sorted(kwargs.items())])
