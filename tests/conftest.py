import os
import random
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
DEFAULT_CONFIG = ROOT / "configs" / "tiny.yaml"


def pytest_addoption(parser):
    parser.addoption("--config", action="append", default=None,
                     help="appliance config(s) for the RTL regressions (default configs/tiny.yaml)")
    parser.addoption("--seed", type=int, default=None,
                     help="seed for randomized tests (default: GPTFPGA_SEED or a fixed seed)")


def pytest_generate_tests(metafunc):
    if "cfg_path" in metafunc.fixturenames:
        paths = metafunc.config.getoption("config") or [str(DEFAULT_CONFIG)]
        metafunc.parametrize("cfg_path", [Path(p) for p in paths], ids=[Path(p).stem for p in paths],
                             scope="module")


@pytest.fixture
def cfg(cfg_path):
    from gen.config import load_config
    return load_config(cfg_path)


@pytest.fixture
def seed(request):
    s = request.config.getoption("seed")
    if s is None:
        s = int(os.environ.get("GPTFPGA_SEED", "20261202"))
    print(f"seed={s} (rerun with --seed {s})")
    random.seed(s)
    return s


@pytest.fixture
def emitted(cfg, tmp_path_factory):
    """Emit the HBM reader of the config; returns {top: Verilog path}."""
    from gen.emit import emit
    out = ROOT / "build" / "test-emit" / cfg.name
    return emit(cfg, out, tops=["hbm_reader"])
