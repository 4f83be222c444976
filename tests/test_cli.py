"""The front door: the ``gptfpga`` command's conventions, help, errors and outputs.

Every mistake is one line on stderr naming the flag, the value and what is allowed, exit code
2, before any work; Ctrl-C is exit code 130 and one line; outputs are whole or absent. The
tests run the command in-process (host.cli.main) or as a subprocess, on the ISS and the tiny
config; none builds a Verilator model.
"""

import json
import os
import re
import shlex
import signal
import subprocess
import sys
import tomllib
from pathlib import Path

import numpy as np
import pytest

from host import cli
from host.cli import build_parser, main

ROOT = Path(__file__).resolve().parent.parent
TINY = ROOT / "configs" / "tiny.yaml"


def run_main(capsys, *argv):
    """main() in-process: (exit code, stdout, stderr)."""
    try:
        rc = main([str(a) for a in argv])
    except SystemExit as e:             # argparse's own exits (-h, --version, usage errors)
        rc = e.code
    out, err = capsys.readouterr()
    return rc, out, err


def one_line_error(capsys, *argv, needle=None):
    rc, out, err = run_main(capsys, *argv)
    lines = err.strip().splitlines()
    assert rc == 2, (rc, err)
    assert len(lines) == 1 and lines[0].startswith("gptfpga: error: "), err
    assert "Traceback" not in err
    if needle:
        assert needle in lines[0], (needle, lines[0])
    return lines[0]


# -- help, version, conventions ---------------------------------------------------------------
def _subparsers(parser):
    import argparse
    act = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    return act.choices


def test_every_option_has_help_and_run_shows_its_defaults(capsys):
    """No option without help text; run -h shows the defaults a new user needs."""
    for name, sub in _subparsers(build_parser()).items():
        for a in sub._actions:
            if a.option_strings and a.help != "==SUPPRESS==":
                assert a.help, f"gptfpga {name} {a.option_strings[0]} has no help text"
    rc, out, _ = run_main(capsys, "run", "-h")
    text = " ".join(out.split())
    assert rc == 0
    for default in ("--config FILE appliance config (YAML) (default: configs/tiny.yaml)",
                    "(default: 'The lighthouse')", "(default: 32)", "(default: iss)",
                    "(default: 600.0)", "(default: the config's)", "(default: 0)",
                    "(default: the demo model"):
        assert default in text, default
    rc, out, _ = run_main(capsys, "perf", "-h")
    text = " ".join(out.split())
    assert "--prompt-tokens N prompt length to project (prefill) (default: 32)" in text
    assert "--new-tokens N tokens generated to project (decode) (default: 32)" in text


def test_top_level_help_is_plain_text(capsys):
    rc, out, _ = run_main(capsys, "-h")
    assert rc == 0 and "``" not in out and "--config FILE" in out
    for name in ("emit", "lint", "sim", "bench", "collective", "run", "perf", "package", "synth"):
        assert re.search(rf"^\s+{name}\s", out, re.M), name


def test_version_is_the_installed_package_version(capsys):
    want = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["version"]
    rc, out, _ = run_main(capsys, "--version")
    assert rc == 0 and out.strip() == f"gptfpga {want}"
    import gptfpga
    assert gptfpga.__version__ == want


def _parse(argv):
    args = build_parser().parse_args(argv)
    cli._resolve_config(args)
    return args


@pytest.mark.parametrize("cmd", ["emit", "sim", "package", "lint"])
def test_config_flag_and_positional_alias(cmd):
    """--config everywhere; the older positional form still works where it existed."""
    for argv in ([cmd, "--config", str(TINY)], [cmd, str(TINY)]):
        args = _parse(argv)
        assert args.config == ([str(TINY)] if cmd == "lint" else str(TINY))
    if cmd != "lint":
        with pytest.raises(cli.UserError, match="--config: given twice"):
            _parse([cmd, str(TINY), "--config", str(TINY)])
    else:
        assert _parse(["lint", "--config", "a.yaml", "b.yaml", "--config", "c.yaml"]).config == \
            ["a.yaml", "c.yaml", "b.yaml"]


def test_config_flag_everywhere():
    for argv in (["run", "--config", "x.yaml"], ["perf", "--config", "x.yaml", "--model-shape", "gpt2"],
                 ["collective", "--config", "x.yaml", "--op", "allreduce", "--elements", "4"],
                 ["bench", "core", "--config", "x.yaml"], ["synth", "--config", "x.yaml"]):
        assert _parse(argv).config == "x.yaml"


def test_new_tokens_and_its_alias(capsys):
    assert _parse(["run", "--new-tokens", "5"]).new_tokens == 5
    assert _parse(["run", "--max-new-tokens", "5"]).new_tokens == 5
    assert _parse(["perf", "--config", "x", "--model-shape", "gpt2", "--new-tokens", "7"]).new_tokens == 7
    line = one_line_error(capsys, "run", "--new-tokens", "3", "--max-new-tokens", "4")
    assert "--max-new-tokens: given twice (--new-tokens 3, then --max-new-tokens 4)" in line
    # the message names the spelling the user typed
    one_line_error(capsys, "run", "--max-new-tokens", "0", needle="--max-new-tokens: got 0")
    one_line_error(capsys, "run", "--seed", "1", "--seed", "2", needle="--seed: given twice")


def test_emit_positional_still_writes(tmp_path, capsys):
    """`gptfpga emit configs/tiny.yaml -o DIR`, as the Makefile and other tooling called it."""
    out = tmp_path / "out"
    rc, stdout, err = run_main(capsys, "emit", TINY, "-o", out, "--top", "hbm_reader")
    assert rc == 0, err
    assert sorted(p.name for p in out.iterdir()) == ["config.json", "hbm_reader.v", "report.md"]
    assert json.loads((out / "config.json").read_text())["name"] == "tiny"


def test_makefile_uses_the_convention():
    """Every gptfpga line of the Makefile parses with --config (no positional config) and
    --new-tokens (not the alias)."""
    text = (ROOT / "Makefile").read_text()
    lines = [ln.split("$(GPTFPGA)", 1)[1] for ln in text.splitlines() if "$(GPTFPGA)" in ln
             and not ln.lstrip().startswith("#")]
    assert len(lines) >= 10
    subst = {"$(CONFIG)": str(TINY), "$(NAME)": "tiny",
             "$(addprefix --config ,$(wildcard configs/*.yaml))":
                 " ".join(f"--config {p}" for p in sorted((ROOT / "configs").glob("*.yaml")))}
    for ln in lines:
        for k, v in subst.items():
            ln = ln.replace(k, v)
        assert "$(" not in ln, ln
        argv = shlex.split(ln)
        assert "--max-new-tokens" not in argv, ln
        args = build_parser().parse_args(argv)
        assert getattr(args, "config_pos", None) in (None, []), f"positional config in: {ln}"
        cli._resolve_config(args)
        assert args.command != "run" or "--new-tokens" in argv


# -- run: the request ----------------------------------------------------------------------------
def test_readme_style_prompt_ids_and_the_example_in_the_message(capsys):
    """GPT-2's ids (464,2068) are beyond the demo model's vocabulary of 512: one line, and the
    example the line gives is valid for the model."""
    line = one_line_error(capsys, "run", "--prompt-ids", "464,2068", "--cards", "1",
                          needle="--prompt-ids: 2068 is outside the vocabulary (the model has 512 tokens)")
    example = re.search(r"e\.g\. ([\d,]+)$", line).group(1)
    for bad in ("1,x", "", " ", "1,,2"):
        line = one_line_error(capsys, "run", "--prompt-ids", bad, needle="--prompt-ids")
        assert line.endswith(f"e.g. {example}")
    rc, out, err = run_main(capsys, "run", "--prompt-ids", example, "--new-tokens", "2", "--cards", "1",
                            "--json")
    assert rc == 0, err
    assert json.loads(out)["prompt_ids"] == [int(i) for i in example.split(",")]


@pytest.mark.parametrize("args, needle", [
    (["--prompt-ids", ""], "--prompt-ids: empty"),
    (["--temperature", "nan"], "--temperature: got nan"),
    (["--temperature", "inf"], "--temperature: got inf"),
    (["--temperature", "-0.5"], "--temperature: got -0.5"),
    (["--temperature", "x"], "--temperature: got 'x'; allowed: a number"),
    (["--seed", "-1"], "--seed: got -1"),
    (["--timeout", "0"], "--timeout: got 0.0; allowed: seconds above 0"),
    (["--timeout", "-5"], "--timeout: got -5.0"),
    (["--timeout", "nan"], "--timeout: got nan"),
    (["--timeout", "inf"], "--timeout: got inf"),
    (["--xclbin", "k.xclbin"], "--xclbin: given with --backend iss; allowed: only with --backend xrt"),
    (["--backend", "rtl", "--xclbin", "k.xclbin"], "--xclbin: given with --backend rtl"),
    (["--backend", "xrt", "--xclbin", "/nonexistent.xclbin"],
     "--xclbin: '/nonexistent.xclbin' is not a file"),
    (["--top-k", "5"], "--top-k: got 5 with greedy decoding"),
    (["--temperature", "0", "--top-k", "5"], "--top-k: got 5 with greedy decoding"),
    (["--temperature", "1", "--top-k", "513"], "--top-k: got 513"),
    (["--cards", "17"], "--cards: got 17; allowed: 1..16"),
    (["--new-tokens", "200"], "--new-tokens: 200 after a 3-token prompt"),
    (["--backend", "gpu"], "--backend: invalid choice: 'gpu'"),
])
def test_run_bad_values_are_one_line_before_work(args, needle, capsys, monkeypatch):
    """Checked before the model is compiled: the compile is made to fail loudly if reached."""
    import host.runtime
    monkeypatch.setattr(host.runtime, "compile_model", _reached)
    one_line_error(capsys, "run", *args, needle=needle)


def _reached(*a, **k):
    raise AssertionError("the check came after the work started")


@pytest.mark.parametrize("args, needle", [
    (["--cards", "5"], "--cards: 5 cards for a model of 4 heads; allowed: 1 to 4"),
    (["--model", "HUGE"], "--model: layers 10000000 exceeds the build's core.limits.layers = 4"),
])
def test_run_model_against_the_build_before_loading(args, needle, capsys, monkeypatch, tmp_path):
    """The model's shape against core.limits and its heads against --cards, before the
    checkpoint is loaded (config.json's n_layer 10000000 used to end in a MemoryError)."""
    import shutil

    import host.model
    import host.runtime
    huge = tmp_path / "huge"
    shutil.copytree(ROOT / "host" / "demo", huge)
    conf = json.loads((huge / "config.json").read_text())
    (huge / "config.json").write_text(json.dumps(dict(conf, n_layer=10_000_000)))
    monkeypatch.setattr(host.runtime, "compile_model", _reached)
    monkeypatch.setattr(host.model, "load_checkpoint", _reached)
    one_line_error(capsys, "run", *[huge if a == "HUGE" else a for a in args], needle=needle)


def test_a_prompt_that_fills_the_context_then_one_token(tmp_path, capsys):
    """128 prompt ids (the demo's whole context) and --new-tokens 1: the token, the logits
    file, and the modelled figures of a step at the last position (not an exit 2 naming a
    position 128 that does not exist)."""
    ids = ",".join(str(7 * k % 512) for k in range(128))
    path = tmp_path / "l.npy"
    rc, out, err = run_main(capsys, "run", "--cards", "1", "--prompt-ids", ids, "--new-tokens", "1",
                            "--json", "--dump-logits", path)
    assert rc == 0, err
    r = json.loads(out)
    assert len(r["tokens"]) == 1 and r["modelled_decode_cycles_per_token"] > 0
    assert np.load(path).shape == (1, 512)
    rc, out, err = run_main(capsys, "perf", "--config", TINY, "--model-shape", "host/demo",
                            "--prompt-tokens", "128", "--new-tokens", "1", "--json")
    assert rc == 0, err
    assert json.loads(out)["decode_cycles_per_token"] > 0


def test_greedy_sampling_options_are_those_of_the_api(capsys):
    """One check (Sampling.check) for the CLI and the API: --top-k 0 (all) with greedy decoding
    is accepted by both, and a temperature so small that logits / T overflows picks the
    greedy tokens (it used to fail with "Probabilities contain NaN")."""
    from host.api import Appliance
    base = ["run", "--cards", "1", "--new-tokens", "3", "--json"]
    rc, out, err = run_main(capsys, *base)
    assert rc == 0, err
    greedy = json.loads(out)["tokens"]
    for extra in (["--top-k", "0"], ["--temperature", "1e-320"], ["--temperature", "1e-320", "--top-k", "4"]):
        rc, out, err = run_main(capsys, *base, *extra)
        assert rc == 0 and "Traceback" not in err, err
        assert json.loads(out)["tokens"] == greedy, extra
    app = Appliance(config=TINY, cards=1)
    assert app.generate(prompt="The lighthouse", new_tokens=3, top_k=0).tokens == greedy


@pytest.mark.parametrize("argv, needle", [
    (["emit", "--config", TINY, "-o", ""], "-o: empty; allowed: a folder"),
    (["run", "--dump-logits", ""], "--dump-logits: empty; allowed: a file name ending in .npy"),
    (["run", "--config", ""], "--config: empty"),
    (["run", "--model", ""], "--model: empty"),
    (["perf", "--config", TINY, "--model-shape", ""], "--model-shape: empty"),
    (["collective", "--config", TINY, "--op", "allgather", "--elements", "4", "--save", ""], "--save: empty"),
])
def test_an_empty_value_is_not_taken_as_absent(argv, needle, capsys):
    """`-o ''` used to fall back to the default folder, `--dump-logits ''` to no dump."""
    one_line_error(capsys, *argv, needle=needle)


def test_iss_json_has_no_cycles_pretending_to_be_measured(capsys):
    """The ISS counts no cycles: the cycle figures are null, and the performance model's
    figures are there under modelled_* keys, labelled as such."""
    rc, out, err = run_main(capsys, "run", "--backend", "iss", "--cards", "2", "--new-tokens", "3", "--json")
    assert rc == 0, err
    r = json.loads(out)
    for k in ("prefill_cycles", "prefill_cycles_per_token", "decode_cycles_per_token",
              "decode_ms_per_token_at_clock", "prefill_ms_per_token_at_clock", "hbm_utilization_decode"):
        assert r[k] is None, k
    assert r["hbm_bytes_per_token"] > 0 and r["link_bytes_per_token"] > 0      # counted by the ISS
    assert r["modelled_decode_cycles_per_token"] > 1000 and r["modelled_prefill_cycles_per_token"] > 1000
    assert "not measured" in r["modelled_source"] and "not measured" in r["cycle_figures"]
    from gen.config import load_config
    from host.model import load_checkpoint
    from host.perf import predict
    from host.runtime import DEMO_MODEL
    cfg = load_config(TINY)
    want = predict(cfg, load_checkpoint(DEMO_MODEL).shape, cards=2, prompt=len(r["prompt_ids"]),
                   new_tokens=3)
    assert r["modelled_decode_cycles_per_token"] == want["decode_cycles_per_token"]
    rc, out, _ = run_main(capsys, "run", "--cards", "1", "--new-tokens", "3")
    assert rc == 0 and "cycles: not measured" in out and "modelled by the performance model" in out
    assert " 0.0 cycles" not in out


# -- output paths ----------------------------------------------------------------------------------
def test_emit_and_package_output_paths(tmp_path, capsys):
    f = tmp_path / "file"
    f.write_text("x")
    for cmd in ("emit", "package"):
        one_line_error(capsys, cmd, "--config", TINY, "-o", f, needle=f"--out: '{f}' is a file")
        one_line_error(capsys, cmd, "--config", TINY, "-o", f / "sub", needle="--out")
        one_line_error(capsys, cmd, "--config", TINY, "-o", "/proc/gptfpga-out",
                       needle="cannot create the folder")
    d = tmp_path / "tree"
    (d / "report.md").mkdir(parents=True)
    one_line_error(capsys, "emit", "--config", TINY, "-o", d, "--top", "hbm_reader",
                   needle="report.md there is a folder")
    (d / "kernel.xml").mkdir()
    one_line_error(capsys, "package", "--config", TINY, "-o", d, needle="kernel.xml there is a folder")
    if os.geteuid() != 0:                     # root writes anywhere
        ro = tmp_path / "ro"
        ro.mkdir()
        ro.chmod(0o500)
        one_line_error(capsys, "emit", "--config", TINY, "-o", ro, needle="not writable")


def test_dump_logits_paths_checked_before_generating(tmp_path, capsys, monkeypatch):
    import host.runtime
    monkeypatch.setattr(host.runtime, "compile_model", _reached)
    base = ["run", "--cards", "1", "--new-tokens", "2", "--dump-logits"]
    one_line_error(capsys, *base, tmp_path / "missing" / "l.npy", needle="does not exist")
    one_line_error(capsys, *base, tmp_path, needle="is a folder")
    one_line_error(capsys, *base, tmp_path / "logits", needle="allowed: a file name ending in .npy")
    assert list(tmp_path.iterdir()) == []          # and nothing written anywhere (no logits.npy)


def test_dump_logits_writes_exactly_the_file(tmp_path, capsys):
    path = tmp_path / "l.npy"
    rc, out, err = run_main(capsys, "run", "--cards", "1", "--new-tokens", "3", "--json",
                            "--dump-logits", path)
    assert rc == 0, err
    lg = np.load(path)
    assert lg.shape == (3, 512) and [int(np.argmax(x)) for x in lg] == json.loads(out)["tokens"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["l.npy"]     # no temporary left


def test_collective_and_perf_output_paths(tmp_path, capsys, monkeypatch):
    """Checked before the collective, the model or the bench runs (/proc: root may write
    anywhere else, and os.access says yes there too)."""
    import host.api
    import sim.bench
    import sim.fabric
    for mod, name in ((sim.fabric, "run_collective"), (host.api, "perf"), (sim.bench, "bench_perf")):
        monkeypatch.setattr(mod, name, _reached)
    base = ["collective", "--config", TINY, "--op", "allreduce", "--elements", "8", "--save"]
    one_line_error(capsys, *base, tmp_path / "no" / "x.npz", needle="--save: ")
    one_line_error(capsys, *base, "/proc/x.npz", needle="--save: ")
    one_line_error(capsys, *base, tmp_path / "x", needle="ending in .npz")
    one_line_error(capsys, "perf", "--config", TINY, "--model-shape", "gpt2", "--trace",
                   tmp_path / "no" / "t.json", needle="--trace: ")
    one_line_error(capsys, "bench", "perf", "--config", TINY, "--plot", tmp_path / "p",
                   needle="--plot: ")


def test_atomic_write_never_leaves_a_truncated_file(tmp_path):
    from host.errors import UserError
    from host.files import atomic_output, atomic_write
    path = tmp_path / "out.txt"
    atomic_write(path, "old\n")
    for exc in (RuntimeError("disk on fire"), KeyboardInterrupt()):
        with pytest.raises(type(exc)):
            with atomic_output(path, "w") as f:
                f.write("half of the new cont")
                raise exc
        assert path.read_text() == "old\n"
        assert sorted(p.name for p in tmp_path.iterdir()) == ["out.txt"]
    with pytest.raises(UserError, match="--x: .*cannot write there"):
        atomic_write(tmp_path / "no" / "f", "x", flag="--x")
    atomic_write(path, b"new")
    assert path.read_bytes() == b"new" and oct(path.stat().st_mode & 0o777) != "0o600"


def test_emit_is_written_through_atomic_writes(tmp_path, monkeypatch):
    """A failure while emit writes leaves no truncated file: the second file's write fails,
    the first is complete and the target of the second untouched."""
    import host.files
    from gen.config import load_config
    from gen.emit import emit
    real = host.files.os.replace
    calls = []

    def replace(src, dst):
        calls.append(dst)
        if len(calls) == 2:
            raise OSError(28, "No space left on device")
        return real(src, dst)

    monkeypatch.setattr(host.files.os, "replace", replace)
    out = tmp_path / "e"
    with pytest.raises(host.files.UserError, match="No space left on device"):
        emit(load_config(TINY), out, tops=["hbm_reader"])
    assert sorted(p.name for p in out.iterdir()) == ["hbm_reader.v"]
    assert (out / "hbm_reader.v").read_text().rstrip().endswith("endmodule")


# -- collective --save: the user's elements in the user's layout ----------------------------------
def _fake_ring(cfg, op, elements, *, cards, dtype="fp32", bidirectional=False, seed=0, **_):
    """run_collective's contract on the numpy reference (the ring is bit-identical to it, which
    tests/test_collective.py checks on the Verilated fabric): the ring's padded layout."""
    from sim.ref import collective as ref
    rng = np.random.default_rng(seed)
    if dtype == "fp32":
        inputs = rng.standard_normal((cards, elements)).astype(np.float32).view(np.uint32)
    else:
        inputs = rng.standard_normal((cards, elements)).astype(np.float16).view(np.uint16).astype(np.uint32)
    W = cfg.link.data_bits // 32
    out = ref.reference(op, inputs, W, dtype=dtype, bidirectional=bidirectional)
    fig = {"op": op, "cards": cards, "elements": elements, "ok": True}
    return fig, inputs, out, out


@pytest.mark.parametrize("op, elements, cards, dtype, bidi", [
    ("allreduce", 100_003, 2, "fp32", False),
    ("allgather", 65_537, 3, "fp32", False),
    ("allgather", 1_001, 3, "fp16", True),
    ("reducescatter", 1_003, 3, "fp32", False),
    ("reducescatter", 1_003, 4, "fp16", True),
])
def test_collective_save_layout(op, elements, cards, dtype, bidi, tmp_path, capsys, monkeypatch):
    import sim.fabric
    from gen.config import load_config
    monkeypatch.setattr(sim.fabric, "run_collective", _fake_ring)
    path = tmp_path / "c.npz"
    argv = ["collective", "--config", TINY, "--op", op, "--elements", elements, "--cards", cards,
            "--dtype", dtype, "--save", path] + (["--bidirectional"] if bidi else [])
    rc, _, err = run_main(capsys, *argv)
    assert rc == 0, err
    z = np.load(path)
    x = z["inputs"]
    assert x.shape == (cards, elements) and x.dtype == (np.float16 if dtype == "fp16" else np.float32)
    _, words, _, _ = _fake_ring(load_config(TINY), op, elements, cards=cards, dtype=dtype)
    assert np.array_equal(x.view(np.uint16 if dtype == "fp16" else np.uint32),
                          words.astype(np.uint16) if dtype == "fp16" else words)
    y = z["outputs"]
    xf = x.astype(np.float32)
    if op == "allgather":
        assert y.shape == (cards, cards * elements) and y.dtype == x.dtype
        assert all(np.array_equal(y[i], x.reshape(-1)) for i in range(cards))
        assert list(z["output_lengths"]) == [cards * elements] * cards
        return
    # sums: fp32, in some ring order: within a few ulps of float64's
    want = xf.astype(np.float64).sum(0)
    tol = 1e-5 * np.abs(xf).sum(0) + 1e-30
    if op == "allreduce":
        assert y.shape == (cards, elements) and y.dtype == np.float32
        assert np.all(np.abs(y - want) <= tol)
        assert list(z["output_lengths"]) == [elements] * cards
        return
    owner = z["owner"]
    assert owner.shape == (elements,) and set(owner) == set(range(cards))
    assert np.array_equal(np.bincount(owner, minlength=cards), z["output_lengths"])
    assert z["output_lengths"].sum() == elements
    got = y[owner, np.arange(elements)]
    assert np.all(np.abs(got - want) <= tol)
    mask = np.ones_like(y, bool)
    mask[owner, np.arange(elements)] = False
    assert np.isnan(y[mask]).all()


def test_synth_unit_leaves_the_whole_table_alone(tmp_path, capsys, monkeypatch):
    """`synth --arith --unit X` prints X's figures and leaves arith.json (the table of a full
    run) as it was; a full `--arith` writes it. Yosys replaced by canned figures."""
    import gen.synth
    fig = {"latency": 1, "LUT": 39, "FF": 13, "DSP": 0, "CARRY": 3, "SRL": 0}
    monkeypatch.setattr(gen.synth, "synth_arith",
                        lambda out, names, **k: {n: fig for n in (names or gen.synth.arith_units())})
    monkeypatch.setattr(cli, "SYNTH_OUT", tmp_path)
    rc, out, err = run_main(capsys, "synth", "--arith")
    table = tmp_path / "arith.json"
    whole = table.read_text()
    assert rc == 0 and set(json.loads(whole)) == set(gen.synth.arith_units())
    rc, out, err = run_main(capsys, "synth", "--arith", "--unit", "int8_to_fp16")
    assert rc == 0 and "int8_to_fp16" in out and table.read_text() == whole


# -- a card that fails is not a user's mistake ---------------------------------------------------
def test_card_error_is_exit_1_and_one_line(capsys, monkeypatch):
    """A card that stops with an error status during a step (here the ISS's step made to report
    one): one line naming the card, the position and the status, exit code 1, not 2."""
    from host.device import Device

    def failing(self, *a, **k):
        c = {name: 0 for name in ("cycles", "hbm_rd_bytes", "hbm_wr_bytes", "link_tx_bytes")}
        c["status"] = (7 << 8) | 10               # TIMEOUT at pc 7
        return c
    monkeypatch.setattr(Device, "run", failing)
    rc, out, err = run_main(capsys, "run", "--cards", "1", "--new-tokens", "2")
    lines = err.strip().splitlines()
    assert rc == 1, (rc, err)
    assert lines[-1].startswith("gptfpga: card error: device: card 0: "), err
    assert "TIMEOUT (pc 7)" in lines[-1] and "Traceback" not in err


# -- Ctrl-C -------------------------------------------------------------------------------------
def test_ctrl_c_in_process_is_130_and_one_line(tmp_path, capsys, monkeypatch):
    """KeyboardInterrupt while the logits are being written: exit 130, one line, and no file
    (neither the target nor a temporary)."""
    def interrupted(*a, **k):
        raise KeyboardInterrupt
    monkeypatch.setattr(np, "save", interrupted)
    path = tmp_path / "l.npy"
    rc, out, err = run_main(capsys, "run", "--cards", "1", "--new-tokens", "2", "--json",
                            "--dump-logits", path)
    # (a progress line may come first where the run outlasts the progress' grace: a loaded machine)
    assert rc == 130 and err.strip().splitlines()[-1] == "gptfpga: interrupted" and "Traceback" not in err
    assert list(tmp_path.iterdir()) == []


def test_ctrl_c_signal_is_130_and_one_line():
    """SIGINT to a running `gptfpga run`, once tokens are streaming: exit 130, one line."""
    def child():
        # Ctrl-C's default action, as a shell's foreground job has (a SIGINT ignored by what
        # runs the tests would be inherited, and Python leaves it ignored), and a lower
        # priority, so that a loaded machine cannot run all 100 tokens before the signal
        signal.signal(signal.SIGINT, signal.SIG_DFL)
        os.nice(10)

    p = subprocess.Popen([sys.executable, "-m", "host.cli", "run", "--cards", "1", "--new-tokens", "100"],
                         cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, preexec_fn=child)
    try:
        # the prompt: generation has started. Signal at once: a sleep here let a loaded machine
        # keep this process off the CPU until the child had finished all 100 tokens (exit 0)
        p.stdout.read(1)
        p.send_signal(signal.SIGINT)
        _, err = p.communicate(timeout=120)
    finally:
        p.kill()
    err = err.decode()
    assert p.returncode == 130, err
    # (a loaded machine's slow prefill may have shown its progress line first)
    *before, last = err.strip().splitlines()
    assert last == "gptfpga: interrupted" and all(x.startswith("run on ") for x in before), err


# -- progress -------------------------------------------------------------------------------------
def test_progress_plain_and_terminal():
    import io

    from host.progress import Progress
    log = io.StringIO()
    with Progress("lint x", total=3, stream=log, tty=False) as p:
        for t in ("card", "hbm_reader", "coll_node"):
            p.step(t, "elaborating")
            p.note("verilator")
    lines = log.getvalue().splitlines()
    assert lines[0].startswith("lint x: [") and "1/3 card (elaborating)" in lines[0]
    assert "3/3 coll_node (verilator)" in lines[-1] and len(lines) == 6
    assert "\r" not in log.getvalue()
    quiet_log = io.StringIO()
    with Progress("short", total=2, stream=quiet_log, tty=False, grace=60) as p:
        p.step("a")
        p.step("b")
    assert quiet_log.getvalue() == ""          # a short job leaves nothing in a log
    term = io.StringIO()
    with Progress("bench", total=4, stream=term, tty=True) as p:
        p.step("one")
        p.log("a result line")
        p.advance(2)
    s = term.getvalue()
    assert "\r" in s and "[######" in s and "a result line\n" in s and s.endswith("\r\x1b[K")


def test_run_prints_progress_to_a_log_only_when_long(tmp_path):
    """A run that takes longer than the grace period says what it is doing on stderr (plain
    lines in a log); stdout is the text alone."""
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    code = ("import host.cli as c, host.progress as p\n"
            "orig = p.Progress.__init__\n"
            "def init(self, *a, **k):\n"
            "    k['grace'] = 0.0\n"
            "    orig(self, *a, **k)\n"
            "p.Progress.__init__ = init\n"
            "raise SystemExit(c.main(['run', '--cards', '1', '--new-tokens', '2', '--json']))\n")
    r = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True,
                       env=env, timeout=300)
    assert r.returncode == 0, r.stderr
    json.loads(r.stdout)
    assert "run on iss:" in r.stderr and "compiling for 1 card" in r.stderr, r.stderr


def test_default_config_from_another_directory(tmp_path):
    """`gptfpga run` without --config uses the checkout's configs/tiny.yaml wherever it is
    started (the default was a path relative to the working directory)."""
    r = subprocess.run([sys.executable, "-m", "host.cli", "run", "--new-tokens", "1", "--json"],
                       cwd=tmp_path, capture_output=True, text=True, timeout=600,
                       env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["config"] == "tiny"
