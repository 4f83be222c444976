"""The tops a config is emitted as: each a name and a builder of its Amaranth component.

Every top here is a block the card kernel uses, emitted alone too so that it can be tested
and synthesized on its own.
"""

from amaranth.hdl import ClockDomain, ClockSignal, Module, ResetSignal
from amaranth.lib import wiring
from amaranth.lib.wiring import In

from hw.collective.node import CollNode, node_kwargs
from hw.core.card import Card
from hw.dma.reader import AxiBurstReader

__all__ = ["TOPS", "build_top", "reader_params", "VitisCard"]


class VitisCard(wiring.Component):
    """The card kernel as Vitis packages it: ``ap_clk`` and active-low ``ap_rst_n`` around
    :class:`hw.core.card.Card`, every other port passed through with its name."""

    def __init__(self, cfg, **kwargs):
        self.card = Card(cfg, **kwargs)
        members = dict(self.card.signature.members.items())
        members["ap_clk"] = In(1)
        members["ap_rst_n"] = In(1)
        super().__init__(members)

    def elaborate(self, platform):
        m = Module()
        m.domains.sync = ClockDomain("sync")
        m.d.comb += [ClockSignal("sync").eq(self.ap_clk), ResetSignal("sync").eq(~self.ap_rst_n)]
        m.submodules.card = self.card
        for name, member in self.card.signature.members.items():
            if member.is_port:
                if member.flow == In:
                    m.d.comb += getattr(self.card, name).eq(getattr(self, name))
                else:
                    m.d.comb += getattr(self, name).eq(getattr(self.card, name))
            else:
                wiring.connect(m, wiring.flipped(getattr(self, name)), getattr(self.card, name))
        return m


def reader_params(cfg):
    """AxiBurstReader parameters for one HBM channel of ``cfg``."""
    beat_shift = (cfg.hbm_beat_bytes - 1).bit_length()
    return dict(
        data_bits=cfg.hbm.data_bits,
        beat_addr_bits=cfg.hbm_addr_bits - beat_shift,
        len_bits=cfg.hbm_addr_bits - beat_shift + 1,
        max_burst=cfg.hbm.max_burst_beats,
        max_outstanding=cfg.hbm.max_outstanding,
    )


TOPS = {
    "card": lambda cfg: VitisCard(cfg),
    "hbm_reader": lambda cfg: AxiBurstReader(**reader_params(cfg)),
    "coll_node": lambda cfg: CollNode(**node_kwargs(cfg)),
}


def build_top(name, cfg):
    return TOPS[name](cfg)
