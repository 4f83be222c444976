"""The tops a config is emitted as: each a name and a builder of its Amaranth component.

Every top here is a block the card kernel uses, emitted alone too so that it can be tested
and synthesized on its own.
"""

from hw.dma.reader import AxiBurstReader

__all__ = ["TOPS", "build_top", "reader_params"]


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
    "hbm_reader": lambda cfg: AxiBurstReader(**reader_params(cfg)),
}


def build_top(name, cfg):
    return TOPS[name](cfg)
