"""`gptfpga emit` and `gptfpga lint` on the shipped configs."""

import json

import pytest

from gen.config import load_config
from gen.emit import emit
from gen.lint import lint
from host.cli import main

ROOT = __import__("pathlib").Path(__file__).resolve().parent.parent


# The DFX-class card takes half an hour to emit and lint on this machine: its full check is in
# `make lint` and the soak; make test lints its HBM reader and the whole tiny card.
CASES = [("tiny", None), ("u280x4", ["hbm_reader"]),
         pytest.param("u280x4", None, marks=pytest.mark.soak)]


@pytest.mark.parametrize("name,tops", CASES)
def test_emit_and_lint_clean(name, tops, tmp_path):
    cfg = load_config(ROOT / "configs" / f"{name}.yaml")
    written = emit(cfg, tmp_path, tops=tops)
    for top, path in written.items():
        text = path.read_text()
        assert f"module {top}(" in text
    resolved = json.loads((tmp_path / "config.json").read_text())
    assert resolved["hbm"]["channels"] == cfg.hbm.channels
    assert resolved["derived"]["macs_per_cycle"] == cfg.macs_per_cycle
    report = (tmp_path / "report.md").read_text()
    assert "hbm_peak_gbytes_per_s" in report
    if "hbm_reader" in written:
        assert "| axi_araddr | out | 64 |" in report
    results = lint(cfg, tmp_path / "lint", tops=tops)
    assert results and all(w == [] for w in results.values()), results


def test_emit_is_stable(tmp_path):
    """Emitting twice writes identical files (so builds keyed on them are reused)."""
    cfg = load_config(ROOT / "configs" / "tiny.yaml")
    first = {p: p.read_text() for p in emit(cfg, tmp_path / "a", tops=["hbm_reader"]).values()}
    second = {p: p.read_text() for p in emit(cfg, tmp_path / "b", tops=["hbm_reader"]).values()}
    assert list(first.values()) == list(second.values())


def test_cli_emit(tmp_path, capsys):
    rc = main(["emit", str(ROOT / "configs" / "tiny.yaml"), "-o", str(tmp_path), "--top", "hbm_reader"])
    assert rc == 0
    assert (tmp_path / "hbm_reader.v").exists()
    rc = main(["emit", str(ROOT / "configs" / "tiny.yaml"), "-o", str(tmp_path), "--top", "nope"])
    assert rc == 2 and "--top: got 'nope'" in capsys.readouterr().err


@pytest.mark.parametrize("name", ["tiny", "medium"])
def test_issue_stage_without_ring_links(name):
    """A card of one (no ring links, no collective unit: medium as shipped, tiny at cards 1)
    elaborates: its Issue stage once read the collective unit's error pc unconditionally, and
    only the whole card's build of medium showed it."""
    from amaranth.back import rtlil

    from hw.core.issue import Issue
    cfg = load_config(ROOT / "configs" / f"{name}.yaml").replace(cards=1)
    assert not cfg.ring_links
    text = rtlil.convert(Issue(cfg), name="issue")
    assert "coll_err" not in text
