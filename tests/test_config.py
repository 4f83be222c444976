"""Config loading, derived figures, and one test per class of config error (one line, exit 2)."""

import subprocess
import sys

import pytest
import yaml

from gen.config import ConfigError, load_config
from host.cli import main

ROOT = __import__("pathlib").Path(__file__).resolve().parent.parent
TINY = ROOT / "configs" / "tiny.yaml"
U280 = ROOT / "configs" / "u280x4.yaml"


def test_shipped_configs_load():
    tiny, u280 = load_config(TINY), load_config(U280)
    assert (tiny.cards, tiny.macs_per_cycle, tiny.core.reuse) == (2, 128, 2)
    lim = tiny.core.limits
    assert (lim.d_model, lim.heads, lim.layers, lim.vocab, lim.seq_len) >= (128, 8, 4, 1024, 128)
    # DFX class: 16 x 64 MACs a tile meeting 4 tokens, 32 x 512-bit channels = 2048 B/cycle =
    # 409.6 GB/s at 200 MHz.
    assert (u280.macs_per_cycle, u280.weight_bytes_per_cycle) == (4096, 2048)
    assert (u280.core.weight_dtype, u280.core.reuse, u280.core.cache_phases) == ("int16", 4, 4)
    assert u280.hbm_port_bytes_per_cycle == 2048
    assert u280.hbm_peak_gbytes_per_s == pytest.approx(409.6)
    # 100 Gb/s at 200 MHz is 62.5 B/cycle, under the 64 B/cycle of a 512-bit port.
    assert u280.link_bytes_per_cycle == pytest.approx(62.5)
    with pytest.raises(AttributeError):
        u280.cards = 8   # frozen


def test_hbm_cap_limits_channel_rate_at_300mhz():
    u280 = load_config(U280).replace(clock_mhz=300)
    # 14.375 GB/s at 300 MHz is 47.9 B/cycle, less than the 64-byte port.
    assert u280.hbm_channel_bytes_per_cycle == pytest.approx(14.375e9 / 300e6)


def test_replace_revalidates():
    with pytest.raises(ConfigError, match=r"hbm.channels: got 0"):
        load_config(TINY).replace(**{"hbm.channels": 0})


def _write(tmp_path, mutate):
    data = yaml.safe_load(TINY.read_text())
    mutate(data)
    path = tmp_path / "c.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


def _run_emit(path, capsys):
    rc = main(["emit", str(path), "-o", str(path.parent / "out")])
    err = capsys.readouterr().err
    return rc, err


CASES = {
    "missing": (lambda d: d["hbm"].pop("latency_cycles"),
                ["hbm.latency_cycles: missing", "integer in [1, 4096]"]),
    "unknown_with_hint": (lambda d: d["core"].__setitem__("lane", 4),
                          ["core.lane: unknown key", "did you mean 'lanes'"]),
    "unknown_top": (lambda d: d.__setitem__("frequency", 300), ["frequency: unknown key"]),
    "wrong_type": (lambda d: d.__setitem__("cards", "two"), ["cards: got a string 'two'", "integer"]),
    "bool_is_not_int": (lambda d: d.__setitem__("cards", True), ["cards: got a boolean"]),
    "out_of_range": (lambda d: d["hbm"].__setitem__("channels", 33),
                     ["hbm.channels: got 33", "integer in [1, 32]"]),
    "bad_choice": (lambda d: d["core"].__setitem__("weight_dtype", "bf16"),
                   ["core.weight_dtype: got 'bf16'", "allowed: one of 'fp16'"]),
    # int8 weights: a token takes two of a lane's R dot products
    "int8_reuse_1": (lambda d: d["core"].update(weight_dtype="int8", reuse=1),
                     ["core.weight_dtype: got 'int8' with core.reuse 1", "core.reuse >= 2"]),
    "not_pow2": (lambda d: d["core"].__setitem__("width", 24), ["core.width: got 24", "power of two"]),
    # weight reuse: R token vectors a step, at most the MATVEC's tokens (hw.isa.MAX_TOKENS)
    "reuse_not_pow2": (lambda d: d["core"].__setitem__("reuse", 3), ["core.reuse: got 3", "power of two"]),
    "reuse_past_tokens": (lambda d: d["core"].__setitem__("reuse", 64),
                          ["core.reuse: got 64", "power of two in [1, 32]"]),
    "streams_past_tokens": (lambda d: d["core"]["limits"].__setitem__("streams", 33),
                            ["core.limits.streams: got 33", "integer in [1, 32]"]),
    # MATVEC's 10-bit column blocks: the MLP's 4 x d_model columns at this width
    "columns_past_matvec": (lambda d: (d["core"].update(lanes=32, width=2, vector_lanes=32),
                                       d["core"]["limits"].__setitem__("d_model", 1024)),
                            ["core.width: got 2 with core.limits.d_model 1024", "at least 8",
                             "4,096 columns", "1,023 of MATVEC's column blocks"]),
    "inconsistent": (lambda d: d["core"].__setitem__("lanes", 8),
                     ["core.lanes x core.width: got 8 x 16", "256 bytes/cycle", "128 bytes/cycle"]),
    "not_a_mapping": (lambda d: d.__setitem__("hbm", [1, 2]), ["hbm: got a list"]),
    # more than the device holds: name the limit and by how much
    "too_many_macs": (lambda d: d["core"].update(lanes=64, width=256, reuse=1),
                      ["core.lanes x core.width x core.reuse: got 64 x 256 x 1 = 16,384",
                       "at most 9,024", "7,360 too many"]),
    "fifo_past_uram": (lambda d: (d["core"].update(lanes=16, width=64, weight_fifo_tiles=1 << 16),
                                  d["hbm"].update(channels=32, data_bits=512)),
                       ["core.weight_fifo_tiles: got 65,536 tiles of 2,048 bytes = 128.0 MiB",
                        "at most 17,280 tiles", "48,256 too many"]),
    # beyond the ISA: 20-bit VSP and XB word addresses, MATVEC's 16-bit rows (vector_lanes words)
    "vsp_past_isa": (lambda d: d["core"].__setitem__("vsp_words", 1 << 21),
                     ["core.vsp_words: got 2097152", "power of two in [1024, 1048576]"]),
    "vsp_past_matvec_rows": (lambda d: d["core"].__setitem__("vsp_words", 1 << 20),
                             ["core.vsp_words: got 1,048,576", "core.vector_lanes = 4: at most 262,144",
                              "786,432 too many"]),
    # what the collective node and a ring card's collective unit need of the link
    "link_too_narrow": (lambda d: d["link"].__setitem__("data_bits", 64),
                        ["link.data_bits: got 64", "at least 128"]),
    "ring_link_too_narrow": (lambda d: d["link"].__setitem__("data_bits", 128),
                             ["link.data_bits: got 128", "with cards > 1: at least 256"]),
    "beat_not_whole_rows": (lambda d: (d["core"].update(lanes=16, width=4, vector_lanes=16),
                                       d["link"].__setitem__("data_bits", 256)),
                            ["core.vector_lanes: got 16", "divisor of link.data_bits / 32 = 8"]),
    "beat_not_whole_channel_beats": (lambda d: (d["hbm"].__setitem__("data_bits", 512),
                                                d["core"].update(width=32),
                                                d["link"].__setitem__("data_bits", 256)),
                                     ["link.data_bits: got 256", "multiple of hbm.data_bits (512)"]),
}


@pytest.mark.parametrize("case", CASES)
def test_config_errors_one_line_exit_2(case, tmp_path, capsys):
    mutate, expected = CASES[case]
    path = _write(tmp_path, mutate)
    rc, err = _run_emit(path, capsys)
    assert rc == 2
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    assert lines[0].startswith("gptfpga: error: ") and str(path) in lines[0]
    for frag in expected:
        assert frag in lines[0], (frag, lines[0])
    assert "Traceback" not in err


def test_bad_yaml_and_missing_file(tmp_path, capsys):
    bad = tmp_path / "bad.yaml"
    bad.write_text("name: [unclosed\n")
    rc, err = _run_emit(bad, capsys)
    assert rc == 2 and "not valid YAML" in err and len(err.strip().splitlines()) == 1
    rc, err = _run_emit(tmp_path / "nope.yaml", capsys)
    assert rc == 2 and "cannot read config" in err


def test_console_script_no_traceback(tmp_path):
    path = _write(tmp_path, lambda d: d["link"].__setitem__("data_bits", 100))
    proc = subprocess.run([sys.executable, "-m", "host.cli", "emit", str(path)],
                          capture_output=True, text=True, cwd=ROOT)
    assert proc.returncode == 2
    assert proc.stderr.strip() == (f"gptfpga: error: {path}: link.data_bits: got 100; allowed: one of "
                                   "64, 128, 256, 512")


@pytest.mark.parametrize("text, key, line, first", [
    ("core:\n  lanes: 4\n  width: 16\n  lanes: 8\n", "core.lanes", 4, 2),
    ("name: a\ncards: 2\nname: b\n", "name", 3, 1),
])
def test_duplicate_key_is_an_error(text, key, line, first, tmp_path, capsys):
    """PyYAML keeps the last of two equal keys without a word; the config loader names the key
    path and both lines instead, whatever else is wrong with the file."""
    path = tmp_path / "dup.yaml"
    path.write_text(text)
    with pytest.raises(ConfigError) as e:
        load_config(path)
    assert str(e.value) == (f"{path}: line {line}: {key}: given twice (first at line {first}); "
                            f"allowed: each key once")
    rc, err = _run_emit(path, capsys)
    assert rc == 2 and err.strip() == f"gptfpga: error: {e.value}"


def test_duplicate_key_in_a_whole_config(tmp_path):
    """The shipped config with one key repeated at the end of its section fails; as written it
    loads (anchors, lists and equal keys in different sections are not duplicates)."""
    lines = TINY.read_text().splitlines()
    i = next(k for k, s in enumerate(lines) if s.strip().startswith("channels:"))
    dup = lines[:i + 1] + [lines[i].replace(lines[i].split(":")[1], " 8")] + lines[i + 1:]
    path = tmp_path / "c.yaml"
    path.write_text("\n".join(dup) + "\n")
    with pytest.raises(ConfigError, match=rf"line {i + 2}: hbm\.channels: given twice \(first at line "
                                          rf"{i + 1}\)"):
        load_config(path)
    ok = tmp_path / "ok.yaml"
    ok.write_text("x: &a {p: 1, q: 2}\ny: *a\nz: [ {p: 1}, {p: 2} ]\n")
    from gen.config import _yaml_load
    assert _yaml_load(ok.read_text(), ok) == {"x": {"p": 1, "q": 2}, "y": {"p": 1, "q": 2},
                                              "z": [{"p": 1}, {"p": 2}]}


def test_binary_config_is_one_line(tmp_path, capsys):
    path = tmp_path / "c.yaml"
    path.write_bytes(b"\xff\xfe\x00binary")
    rc, err = _run_emit(path, capsys)
    assert rc == 2 and len(err.strip().splitlines()) == 1 and "not a text file" in err


def test_ring_checks_only_for_ring_cards():
    """A one-card kernel has no collective unit: its link need not fit the VSP or HBM (the
    node, emitted for every config, still needs 128 bits)."""
    solo = load_config(TINY).replace(cards=1, **{"link.data_bits": 128})
    assert solo.link.data_bits == 128 and not solo.ring_links
    with pytest.raises(ConfigError, match=r"link.data_bits: got 64"):
        load_config(TINY).replace(cards=1, **{"link.data_bits": 64})

