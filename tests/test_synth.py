# amaranth: UnusedElaboratable=no
"""Resource estimate bookkeeping (gen/synth.py): the card's modules, RAM primitives, instance
counts, and the figures' consistency.

Yosys runs on the whole card in `gptfpga synth` (minutes per module cold, cached after), not
here: these walk the tiny card's modules, check the sums with made-up figures, synthesize two
small parts for real (cached in build/synth/units/) and check the recorded results.
"""

import json
from pathlib import Path

import pytest
from amaranth.hdl import Module
from amaranth.lib import wiring
from amaranth.lib.memory import Memory
from amaranth.lib.wiring import In, Out

from gen.config import load_config
from gen.synth import (
    GROUPS,
    U280,
    card_parts,
    card_result,
    card_table,
    card_units,
    measure_parts,
    parse_stat,
    ram_blocks,
)

ROOT = Path(__file__).resolve().parent.parent
CACHE = ROOT / "build" / "synth" / "units"


def test_ram_blocks():
    # URAM: 72 bits x 4,096; BRAM36: 72 bits x 512; URAM from 64 KiB up
    assert ram_blocks(16384, 512) == (0, 228)          # 1 MiB weight FIFO: 228 URAMs wide
    assert ram_blocks(16384, 4096) == (0, 228)         # 8 MiB: the same URAMs, full depth
    assert ram_blocks(16384, 4097) == (0, 456)
    assert ram_blocks(256, 1024) == (8, 0)             # 32 KiB: 4 columns x 2 deep of BRAM36
    assert ram_blocks(72, 512) == (1, 0)
    assert ram_blocks(73, 513) == (4, 0)


def test_card_units_follow_the_config():
    cfg = load_config(ROOT / "configs" / "u280x4.yaml")
    for R in (1, 2, 4):
        units = card_units(cfg.replace(**{"core.reuse": R}))
        assert units["dot_lane_64"] == 16 * R and units["block_align_64_w"] == 16
        assert units["block_align_64_x"] == R
        # 16 vector lanes, a special-function unit per 2 of them
        assert units["fp32_add"] == 16 * R + 16 + 2 * 8 and "gelu" not in units and units["exp"] == 8


@pytest.fixture(scope="module")
def tiny():
    cfg = load_config(ROOT / "configs" / "tiny.yaml")
    return cfg, card_parts(cfg)


def _under(parts, prefix, cls):
    return sum(1 for p in parts if p.cls == cls and (p.path + ".").startswith(prefix + "."))


def test_every_module_of_the_card_is_one_part(tiny):
    cfg, parts = tiny
    c = cfg.core
    paths = [p.path for p in parts]
    assert len(paths) == len(set(paths)) and paths[0] == "card"
    # each part's parent is a part split into its own logic and black boxes
    kinds = {p.path: p.kind for p in parts}
    assert all(kinds[p.rpartition(".")[0]] == "own" for p in paths[1:])
    top = {p.path.split(".")[1] for p in parts[1:]}
    for unit in ("ctrl", "fetch", "issue", "dma_rd", "store_q", "dma_wr", "wfifo", "mpu", "vpu", "vsp",
                 "xb", "watchdog", "coll", "coll_hbm", "rmux0", "wmux0"):
        assert unit in top, unit
    # the arithmetic the card holds is what card_units says (matrix unit: L x R lanes, L + R
    # alignments, L x R accumulators; vector unit: P lanes, P / special_share special units)
    units = card_units(cfg)
    L, W, P, R = c.lanes, c.width, c.vector_lanes, c.reuse
    Q = P // c.special_share
    assert _under(parts, "card.mpu", "DotLane") == units[f"dot_lane_{W}"] == L * R
    assert _under(parts, "card.mpu", "BlockAlign") == L + R
    assert _under(parts, "card.mpu", "Fp32Add") == L * R
    assert _under(parts, "card.vpu", "Fp32Add") == units["fp32_add"] - L * R == P + 2 * Q
    for cls, name in (("Exp", "exp"), ("Recip", "recip"), ("Rsqrt", "rsqrt")):
        assert _under(parts, "card.vpu", cls) == units[name] == Q
    assert _under(parts, "card.vpu", "Fp32Mul") == units["fp32_mul"] == P + 5 * Q
    assert _under(parts, "card.vpu", "Gelu") == 0          # GELU runs through the lane's units
    assert _under(parts, "card.dma_rd", "AxiBurstReader") == cfg.hbm.channels
    assert _under(parts, "card", "AxiReadMux") == cfg.hbm.channels
    mems = {p.path: p.shape for p in parts if p.kind == "memory"}
    assert mems["card.xb"] == (16 * W, c.xb_words // W)
    # the weight FIFO is a tile (a stripe of every HBM channel) wide
    assert sum(w for p, (w, d) in mems.items() if p.startswith("card.wfifo.")) == cfg.stripe_bytes * 8
    assert sum(1 for p in mems if p.startswith("card.vsp.")) == c.vsp_segments


def test_special_units_shared_are_counted():
    """tiny-int8 shares each special-function unit between two vector lanes: the card holds
    P / 2 of each and card_units (the per-MAC tables' counts) says so."""
    cfg = load_config(ROOT / "configs" / "tiny-int8.yaml")
    assert cfg.core.special_share == 2
    parts, units = card_parts(cfg), card_units(cfg)
    P = cfg.core.vector_lanes
    for cls, name in (("Exp", "exp"), ("Recip", "recip"), ("Rsqrt", "rsqrt")):
        assert _under(parts, "card.vpu", cls) == units[name] == P // 2
    assert _under(parts, "card.vpu", "Fp32Mul") == units["fp32_mul"] == P + 5 * P // 2
    assert _under(parts, "card.vpu", "Fp32Max") == units["fp32_max"] == P


def test_sums_and_fractions(tiny):
    cfg, parts = tiny
    # made-up figures: one LUT per part, a DSP per dot product, the RAMs of a BRAM per memory
    figs = [{"key": f"k{i}", "from_shape": False,
             "counts": {**{g: 0 for g in GROUPS}, "LUT": 1, "LUTMEM": 1, "DSP": int(p.cls == "DotLane"),
                        "BRAM36": 1 if p.kind == "memory" else 0}} for i, p in enumerate(parts)]
    r = card_result(cfg, parts, figs)
    t = r["total"]
    assert t["LUT"] == len(parts) == r["instances"]                 # each part once
    assert r["lut_fraction"] == round(2 * len(parts) / 1_303_680, 4)
    assert t["DSP"] == card_units(cfg)[f"dot_lane_{cfg.core.width}"]
    assert r["lut_fraction"] == round((t["LUT"] + t["LUTMEM"]) / 1_303_680, 4)
    assert r["dsp_fraction"] == round(t["DSP"] / 9_024, 4)
    rows = {g: r["card_logic"][g] + sum(m["total"][g] for m in r["modules"]) for g in GROUPS}
    assert rows == {g: t[g] for g in GROUPS}
    mpu = next(m for m in r["modules"] if m["name"] == "mpu")
    assert sum(k["total"]["LUT"] for k in mpu["children"]) + mpu["own"]["LUT"] == mpu["total"]["LUT"]
    table = card_table(r)
    assert "lut_fraction" in table and "`mpu`" in table and "`rmux*`" in table


def test_a_part_with_black_boxes_synthesizes(tiny):
    _, parts = tiny
    part = next(p for p in parts if p.path == "card.vpu.lanes.spec0")   # its units as black boxes
    assert part.kind == "own" and {"bb_exp", "bb_recip", "bb_rsqrt"} <= set(part.stubs)
    [fig] = measure_parts([part], CACHE, log=lambda m: None)
    assert fig["counts"]["LUT"] > 0 and fig["counts"]["FF"] > 0 and not fig["from_shape"]


class _ThreeWriters(wiring.Component):
    """A 32 x 1024 memory with three write ports: no RAM primitive has them."""

    def __init__(self):
        super().__init__({"a": In(10), "d": In(32), "we": In(3), "q": Out(32)})

    def elaborate(self, platform):
        m = Module()
        m.submodules.mem = self.mem = Memory(shape=32, depth=1024, init=[])
        for k in range(3):
            w = self.mem.write_port()
            m.d.comb += [w.addr.eq(self.a + k), w.data.eq(self.d), w.en.eq(self.we[k])]
        r = self.mem.read_port()
        m.d.comb += [r.addr.eq(self.a), self.q.eq(r.data)]
        return m


def test_a_memory_yosys_cannot_map_is_counted_from_its_shape():
    from gen.synth import Part, _ports, _Wrap
    top = _ThreeWriters()
    m = top.elaborate(None)
    mem = top.mem
    part = Part("t.mem", "memory", "Memory", _Wrap(mem, _ports(mem)), memory=mem)
    assert m is not None and part.shape == (32, 1024)
    [fig] = measure_parts([part], CACHE, log=lambda m: None)
    assert fig["from_shape"]
    assert (fig["counts"]["BRAM36"], fig["counts"]["FF"]) == (ram_blocks(32, 1024)[0], 0)


def _results():
    names = ("tiny", "u280x4", "u280x4-int8")
    found = [ROOT / "docs" / "bench" / f"synth-card-{n}.json" for n in names]
    found += sorted((ROOT / "build" / "synth").glob("card-*.json"))
    return [p for p in found if p.exists()]


@pytest.mark.parametrize("path", _results(), ids=lambda p: p.relative_to(ROOT).as_posix())
def test_recorded_results_are_consistent(path):
    r = json.loads(path.read_text())
    if "lut_fraction" not in r:
        pytest.skip("a result from before every module was counted")
    t = r["total"]
    assert r["lut_fraction"] == round((t["LUT"] + t["LUTMEM"]) / U280["LUT"], 4)   # all LUT sites
    assert r["logic_lut_fraction"] == round(t["LUT"] / U280["LUT"], 4)
    assert r["dsp_fraction"] == round(t["DSP"] / U280["DSP"], 4)
    assert (U280["LUT"], U280["DSP"]) == (1_303_680, 9_024)
    for g in GROUPS:
        assert t[g] == pytest.approx(r["card_logic"][g] + sum(m["total"][g] for m in r["modules"]))
        assert t[g] == pytest.approx(sum(p["each"][g] * p["count"] for p in r["parts"]))
    assert sum(p["count"] for p in r["parts"]) == r["instances"]


def test_parse_stat_groups_cells():
    text = """
     Number of cells:               9
       DSP48E2                      2
       FDRE                         3
       LUT6                         1
       LUT2                         1
       URAM288                      1
       RAMB36E2                     1
       RAM64M                       2
       RAM32M16                     1
       bb_lane0                     1
    """
    got = parse_stat(text)
    assert (got["DSP"], got["FF"], got["LUT"], got["URAM"], got["BRAM36"]) == (2, 3, 2, 1, 1)
    assert (got["LUTRAM"], got["LUTRAM_LUTS"]) == (3, 2 * 4 + 8)     # RAM64M: 4 LUTs, RAM32M16: 8
