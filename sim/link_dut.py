"""One LinkPort (hw/collective/link.py) under sim/tb/tb_link_port.py's cocotb tests, at
tiny.yaml's node parameters (the link port the fabric's nodes carry).

:func:`port_sources` says which port the tests run on: the port as built, or (replaced by
sim/mutate.py in the process that tests a mutant) the mutated netlist behind its wrapper, the
mutant chosen by ``mutsel.txt`` in the simulator's directory.
"""

import json
from pathlib import Path
from xml.etree import ElementTree

from .cocotb_run import ROOT, build_cached

__all__ = ["params", "port_sources", "run_port_tests"]

CFG = ROOT / "configs" / "tiny.yaml"
BUILD = ROOT / "build" / "link_dut"
# sim/mutate.py's mutant netlist is Yosys's bit-level Verilog (false combinational loops);
# the same arguments for the port as built keep one build recipe
BUILD_ARGS = ("-Wno-fatal",)


def params():
    from gen.config import load_config
    from hw.ring import node_params
    return node_params(load_config(CFG))


def port_sources():
    """(Verilog files, top, mutant number or None) of the port the tests run on."""
    from gen.verilog import to_verilog
    from host.files import write_if_changed
    from hw.collective.link import LinkPort
    p = params()
    port = LinkPort(data_bits=p.data_bits, frame_beats=p.frame_beats, window=p.rx_frames,
                    rx_frames=p.rx_frames, timeout=p.timeout, retries=p.retries)
    text = to_verilog(port, "link_port")
    v = BUILD / "link_port.v"
    v.parent.mkdir(parents=True, exist_ok=True)
    write_if_changed(v, text)
    return [v], "link_port", None


def build(sources, top):
    return build_cached(sources, top, build_args=BUILD_ARGS)


def run_port_tests(test_dir, *, seed=1, testcase=None):
    """Build (cached) and run tb_link_port's tests on :func:`port_sources`'s port in
    ``test_dir``; fails unless every test passes. Returns the number of tests run."""
    from cocotb_tools.check_results import get_results

    sources, top, mutsel = port_sources()
    runner, build_dir, _ = build(sources, top)
    test_dir = Path(test_dir)
    test_dir.mkdir(parents=True, exist_ok=True)
    if mutsel is not None:
        (test_dir / "mutsel.txt").write_text(f"{mutsel}\n")
    p = params()
    env = {"GPTFPGA_PARAMS": json.dumps({"data_bits": p.data_bits, "frame_beats": p.frame_beats,
                                         "rx_frames": p.rx_frames, "timeout": p.timeout,
                                         "retries": p.retries}),
           "GPTFPGA_SEED": str(seed)}
    results = test_dir / "results.xml"
    results.unlink(missing_ok=True)
    try:
        runner.test(test_module="sim.tb.tb_link_port", hdl_toplevel=top,
                    hdl_toplevel_lang="verilog", build_dir=build_dir, test_dir=test_dir,
                    extra_env=env, testcase=testcase, results_xml=str(results))
    except SystemExit:          # cocotb's runner exits when a test fails: say which
        pass
    assert results.exists(), "the cocotb run of sim.tb.tb_link_port ended without results"
    n, bad = get_results(results)
    assert n > 0, "no cocotb test ran in sim.tb.tb_link_port"
    failed = [c.get("name") for c in ElementTree.parse(results).iter("testcase")
              if c.find("failure") is not None or c.find("error") is not None]
    assert bad == 0, f"{bad} of {n} cocotb tests failed on {top}: {', '.join(failed)}"
    return n
