"""Resource estimate bookkeeping (gen/synth.py): RAM primitives and instance counts.

Yosys itself runs in `make synth`, not here (minutes per unit); these check the arithmetic
that turns its per-unit figures into a card's.
"""

from pathlib import Path

from gen.config import load_config
from gen.synth import card_memories, card_units, parse_stat, ram_blocks

ROOT = Path(__file__).resolve().parent.parent


def test_ram_blocks():
    # URAM: 72 bits x 4,096; BRAM36: 72 bits x 512; URAM from 64 KiB up
    assert ram_blocks(16384, 512) == (0, 228)          # 1 MiB weight FIFO: 228 URAMs wide
    assert ram_blocks(16384, 4096) == (0, 228)         # 8 MiB: the same URAMs, full depth
    assert ram_blocks(16384, 4097) == (0, 456)
    assert ram_blocks(256, 1024) == (8, 0)             # 32 KiB: 4 columns x 2 deep of BRAM36
    assert ram_blocks(72, 512) == (1, 0)
    assert ram_blocks(73, 513) == (4, 0)


def test_card_counts_follow_the_config():
    cfg = load_config(ROOT / "configs" / "u280x4.yaml")
    units = card_units(cfg)
    assert units["dot_lane_64"] == 16 and units["block_align_64_w"] == 16
    assert units["block_align_64_x"] == 1
    assert units["fp32_add"] == 16 + 8 and units["gelu"] == 8
    mems = card_memories(cfg)
    assert mems["weight FIFO"] == (cfg.stripe_bytes * 8, 4096, 1)
    assert mems["VSP (vector scratchpad)"] == (32 * 8, 65536 // 8 // 8, 8)
    tiny = card_units(load_config(ROOT / "configs" / "tiny.yaml"))
    assert tiny["dot_lane_16"] == 4 and tiny["block_align_16_x"] == 1


def test_parse_stat_groups_cells():
    text = """
     Number of cells:               9
       DSP48E2                      2
       FDRE                         3
       LUT6                         1
       LUT2                         1
       URAM288                      1
       RAMB36E2                     1
    """
    got = parse_stat(text)
    assert (got["DSP"], got["FF"], got["LUT"], got["URAM"], got["BRAM36"]) == (2, 3, 2, 1, 1)
