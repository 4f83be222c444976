"""The AXI multiplexers and the collective unit's HBM beats, each alone in Verilator against
cocotbext-axi managers and RAMs with idle and backpressure on every channel (sim/tb/tb_axi_mux.py,
sim/tb/tb_hbm_beats.py: a Python model of the memory and the stripe layout, bit-exact)."""

import json

import pytest

from gen.tops import AxiMux, hbm_beats_params
from host.files import write_if_changed
from hw.dma.beats import page_beats
from sim.cocotb_run import ROOT, run_cocotb


def _emit(cfg, top):
    from gen.emit import emit
    return emit(cfg, ROOT / "build" / "test-emit" / cfg.name / "units", tops=[top])[top]


def _mux_params(cfg, managers=2):
    mux = AxiMux(addr_bits=64, data_bits=cfg.hbm.data_bits, managers=managers)
    from gen.verilog import _count_as_elaborated
    _count_as_elaborated(mux)
    return {"managers": managers, "beat_bytes": cfg.hbm.data_bits // 8, "depth": mux.depth}


def _beats_verilog(cfg):
    """HbmBeats of ``cfg`` as Verilog (not an emitted top: see gen.tops.hbm_beats_params)."""
    from gen.verilog import to_verilog
    from hw.dma.beats import HbmBeats
    p = hbm_beats_params(cfg)
    text = to_verilog(HbmBeats(**p), "hbm_beats")      # a second: no RTLIL cache entry
    path = ROOT / "build" / "test-emit" / cfg.name / "units" / "hbm_beats.v"
    path.parent.mkdir(parents=True, exist_ok=True)
    write_if_changed(path, text)      # unchanged: the build is reused
    return path


def _beats_params(cfg):
    p = hbm_beats_params(cfg)
    return dict(p, page_beats=page_beats(p["channels"], p["hbm_bits"], p["data_bits"]))


def test_hbm_beats_params_are_the_cards(cfg):
    """The top's parameters are those the card's collective unit builds HbmBeats with."""
    from gen.verilog import _count_as_elaborated
    from hw.core.coll import CollUnit
    unit = CollUnit(cfg, timeout=1)
    _count_as_elaborated(unit)
    p = hbm_beats_params(cfg)
    assert (p["channels"], p["hbm_bits"], p["data_bits"], p["run"], p["max_outstanding"]) == \
        (cfg.hbm.channels, cfg.hbm.data_bits, unit.D, unit.run, cfg.hbm.max_outstanding)


@pytest.mark.rtl
def test_axi_mux_cocotb(cfg, seed):
    run_cocotb([_emit(cfg, "axi_mux")], "axi_mux", "sim.tb.tb_axi_mux",
               extra_env={"GPTFPGA_PARAMS": json.dumps(_mux_params(cfg)), "GPTFPGA_SEED": str(seed)})


@pytest.mark.rtl
def test_hbm_beats_cocotb(cfg, seed):
    run_cocotb([_beats_verilog(cfg)], "hbm_beats", "sim.tb.tb_hbm_beats",
               extra_env={"GPTFPGA_PARAMS": json.dumps(_beats_params(cfg)), "GPTFPGA_SEED": str(seed)})


@pytest.mark.soak
@pytest.mark.parametrize("managers", [2, 3])
def test_axi_mux_soak(cfg, seed, managers, tmp_path):
    """Long random traffic, several seeds; three managers too (the card has two)."""
    from gen.verilog import to_verilog
    top = f"axi_mux{managers}"
    v = ROOT / "build" / "test-emit" / cfg.name / "units" / f"{top}.v"
    v.parent.mkdir(parents=True, exist_ok=True)
    text = to_verilog(AxiMux(addr_bits=64, data_bits=cfg.hbm.data_bits, managers=managers), top)
    write_if_changed(v, text)
    for s in range(seed, seed + 4):
        run_cocotb([v], top, "sim.tb.tb_axi_mux", test_dir=tmp_path / str(s),
                   extra_env={"GPTFPGA_PARAMS": json.dumps(_mux_params(cfg, managers)),
                              "GPTFPGA_SEED": str(s), "GPTFPGA_N": "200"})


@pytest.mark.soak
def test_hbm_beats_soak(cfg, seed, tmp_path):
    for s in range(seed, seed + 4):
        run_cocotb([_beats_verilog(cfg)], "hbm_beats", "sim.tb.tb_hbm_beats",
                   test_dir=tmp_path / str(s),
                   extra_env={"GPTFPGA_PARAMS": json.dumps(_beats_params(cfg)), "GPTFPGA_SEED": str(s),
                              "GPTFPGA_N": "400"})


def test_write_mux_w_waits_for_its_aw():
    """The order FIFO full (no B taken back yet): the next manager's AW stays off the port,
    and its W must too. The mux used to let W go before its AW was presented (found by the
    proof write_mux: the W-behind-AW rule of the AXI4 manager properties)."""
    from amaranth.sim import Simulator

    from hw.axi import Axi4WriteSignature
    from hw.dma.mux import AxiWriteMux
    dut = AxiWriteMux(Axi4WriteSignature(addr_bits=12, data_bits=32), managers=2, depth=2)
    sim = Simulator(dut)
    sim.add_clock(5e-9)
    seen = {"aw": 0, "w": 0, "w_alone": 0}

    async def bench(ctx):
        s = dut.s
        for p in (dut.m0, dut.m1):      # single-beat writes, AW and W together, for ever
            for name, value in (("awvalid", 1), ("awsize", 2), ("awburst", 1), ("wvalid", 1),
                                ("wlast", 1), ("wstrb", 0xF), ("bready", 1)):
                ctx.set(getattr(p, name), value)
        ctx.set(s.awready, 1)
        ctx.set(s.wready, 1)            # and no B: the FIFO fills after two writes
        for _ in range(12):
            _, _, awv, aw, wv, w = await ctx.tick().sample(
                s.awvalid, s.awvalid & s.awready, s.wvalid, s.wvalid & s.wready)
            seen["aw"] += aw
            seen["w"] += w
            seen["w_alone"] += wv & ~awv & 1

    sim.add_testbench(bench)
    sim.run()
    assert seen == {"aw": 2, "w": 2, "w_alone": 0}, seen
