"""Vitis packaging: kernel.xml, the link config and the runtime agree with the emitted RTL."""

import re
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

from gen.config import load_config
from gen.package import KERNEL, kernel_args, package, verilog_ports
from hw import regs

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="module")
def packaged(tmp_path_factory):
    cfg = load_config(ROOT / "configs" / "tiny.yaml")
    out = tmp_path_factory.mktemp("vitis")
    return cfg, package(cfg, out)


def test_kernel_xml_ports_exist_in_verilog(packaged):
    cfg, files = packaged
    ports = verilog_ports(files[f"{KERNEL}.v"].read_text(), KERNEL)
    assert ports["ap_clk"] == ("in", 1) and ports["ap_rst_n"] == ("in", 1)
    assert ports["interrupt"] == ("out", 1)
    root = ET.parse(files["kernel.xml"]).getroot()
    kern = root.find("kernel")
    assert kern.get("name") == KERNEL == regs.KERNEL
    xml_ports = {p.get("name"): p for p in kern.find("ports")}
    masters = [n for n in xml_ports if n.startswith("m_axi_")]
    streams = {n: p for n, p in xml_ports.items() if p.get("portType") == "stream"}
    assert sorted(streams) == sorted(f"axis_{s}_{d}" for s in "rl" for d in ("tx", "rx"))   # 2 cards
    for name, p in streams.items():
        out = name.endswith("tx")
        assert p.get("mode") == ("write_only" if out else "read_only")
        width = int(p.get("dataWidth"))
        assert width == cfg.link.data_bits
        assert ports[f"{name}_tdata"] == ("out" if out else "in", width)
        assert ports[f"{name}_tvalid"] == ("out" if out else "in", 1)
        assert ports[f"{name}_tlast"] == ("out" if out else "in", 1)
        assert ports[f"{name}_tready"] == ("in" if out else "out", 1)
    assert sorted(masters) == sorted(["m_axi_insn"] + [f"m_axi_hbm{k}" for k in range(cfg.hbm.channels)])
    for name, p in xml_ports.items():
        if name in streams:
            continue
        width = int(p.get("dataWidth"))
        if p.get("mode") == "slave":
            assert ports[f"{name}_wdata"] == ("in", width) and ports[f"{name}_rdata"] == ("out", width)
            assert ports[f"{name}_awaddr"][1] == regs.ADDR_BITS
            assert int(p.get("range"), 16) == 1 << regs.ADDR_BITS
        else:
            assert ports[f"{name}_rdata"] == ("in", width), name
            assert ports[f"{name}_arvalid"] == ("out", 1) and ports[f"{name}_rready"] == ("out", 1)
            assert ports[f"{name}_araddr"] == ("out", 64)
            if name.startswith("m_axi_hbm"):
                assert width == cfg.hbm.data_bits
                assert ports[f"{name}_wdata"] == ("out", width)
                assert ports[f"{name}_wstrb"] == ("out", width // 8)
    # Every port of the Verilog belongs to a declared interface or the clock/reset/interrupt.
    bundles = tuple(xml_ports)
    stray = [n for n in ports if not n.startswith(bundles) and n not in ("ap_clk", "ap_rst_n", "interrupt")]
    assert stray == []


def test_kernel_xml_args_match_register_map(packaged):
    cfg, files = packaged
    kern = ET.parse(files["kernel.xml"]).getroot().find("kernel")
    args = [(a.get("name"), int(a.get("id")), a.get("port"), int(a.get("offset"), 16))
            for a in kern.find("args")]
    links = [f"link_{s}_{d}" for s in "rl" for d in ("tx", "rx")]
    assert [a[0] for a in args] == (list(regs.KERNEL_ARGS) + [f"hbm{k}" for k in range(cfg.hbm.channels)]
                                    + links)
    assert [a[1] for a in args] == list(range(len(args)))
    for name, _i, port, off in args:
        if name.startswith("hbm"):
            k = int(name[3:])
            assert off == regs.hbm_ptr(k) and port == f"m_axi_hbm{k}"
        elif name.startswith("link_"):
            assert port == "axis_" + name[5:]
        else:
            assert off == regs.ARGS[name][0]
    assert len(kernel_args(cfg)) == len(args)


def test_link_cfg_maps_each_channel_to_its_bank(packaged):
    cfg, files = packaged
    text = files["link.cfg"].read_text()
    sp = dict(re.findall(r"^sp=card\.(\w+):(HBM\[\d+\])$", text, re.M))
    assert sp == {"m_axi_insn": "HBM[0]", **{f"m_axi_hbm{k}": f"HBM[{k}]" for k in range(cfg.hbm.channels)}}
    assert f"nk={KERNEL}:1:card" in text
    assert f"freqHz={int(cfg.clock_mhz * 1e6)}:card.ap_clk" in text
    tcl = files["package_kernel.tcl"].read_text()
    for k in range(cfg.hbm.channels):
        assert f"m_axi_hbm{k}" in tcl
    assert f"-kernel_name {KERNEL}" in tcl and "sdx_kernel_type rtl" in tcl
