"""Checkpoint loading (host/model.py): what is accepted, and everything that must not be.

Each case is a copy of the demo model's directory with one thing changed. The legitimate forms
(``transformer.`` prefix, a tied ``lm_head.weight``, float16 and bfloat16 tensors, shards with
an index) must load to exactly the demo model's weights; every other change is one line
naming the field or tensor, its value and what is allowed (and never a numpy warning).
"""

import json
import shutil
import warnings

import numpy as np
import pytest
from safetensors.numpy import load_file, save_file

from host.errors import UserError
from host.model import load_checkpoint, load_shape
from host.runtime import DEMO_MODEL


@pytest.fixture(scope="module")
def demo():
    return load_checkpoint(DEMO_MODEL)


@pytest.fixture(scope="module")
def raw():
    return load_file(str(DEMO_MODEL / "model.safetensors"))


def _dir(tmp_path, tensors=None, config=None, *, drop_weights=False):
    """A model directory: the demo's config (changed by ``config``), tokenizer, and tensors."""
    d = tmp_path / "model"
    d.mkdir()
    conf = json.loads((DEMO_MODEL / "config.json").read_text())
    if config:
        for k, v in config.items():
            if v is _DEL:
                conf.pop(k, None)
            else:
                conf[k] = v
    (d / "config.json").write_text(json.dumps(conf))
    for f in ("vocab.json", "merges.txt"):
        shutil.copy(DEMO_MODEL / f, d / f)
    if tensors is not None and not drop_weights:
        save_file(tensors, str(d / "model.safetensors"))
    return d


_DEL = object()


def _load_error(d):
    with warnings.catch_warnings():
        warnings.simplefilter("error")          # a numpy RuntimeWarning would fail here
        with pytest.raises(UserError) as e:
            load_checkpoint(d)
    msg = str(e.value)
    assert "\n" not in msg and msg.startswith("--model: "), msg
    return msg


def _same(model, demo):
    assert model.shape == demo.shape
    assert model.weights.keys() == demo.weights.keys()
    for k, v in demo.weights.items():
        assert np.array_equal(model.weights[k], v), k


# -- accepted ----------------------------------------------------------------------------------
def test_prefix_tied_head_and_mask_buffers(tmp_path, raw, demo):
    n = demo.shape.n_positions
    t = {("transformer." + k): v for k, v in raw.items()}
    t["lm_head.weight"] = raw["wte.weight"].copy()
    t["transformer.h.0.attn.bias"] = np.tril(np.ones((1, 1, n, n), np.float32))
    _same(load_checkpoint(_dir(tmp_path, t)), demo)


def test_float32_float16_and_bfloat16(tmp_path, raw, demo):
    """The demo's weights are float16 values: float32, float16 and bfloat16 (where the values
    fit bfloat16's 8-bit significand) load to the same float32 arrays."""
    for dt in ("f32", "f16"):
        t = {k: v.astype(np.float32 if dt == "f32" else np.float16) for k, v in raw.items()}
        d = tmp_path / dt
        d.mkdir()
        _same(load_checkpoint(_dir(d, t)), demo)
    # bfloat16: written by hand (numpy has none); values rounded to bfloat16 first
    bf = {k: (v.astype(np.float32).view(np.uint32) & 0xFFFF0000).view(np.float32) for k, v in raw.items()}
    d = tmp_path / "bf16"
    d.mkdir()
    md = _dir(d, {"wte.weight": bf["wte.weight"]})
    _write_bf16(md / "model.safetensors", bf)
    m = load_checkpoint(md)
    for k, v in bf.items():
        assert np.array_equal(m.weights[k], v), k


def _write_bf16(path, tensors):
    import struct
    header, blobs, off = {}, [], 0
    for k, v in tensors.items():
        b = (v.astype(np.float32).view(np.uint32) >> 16).astype("<u2").tobytes()
        header[k] = {"dtype": "BF16", "shape": list(v.shape), "data_offsets": [off, off + len(b)]}
        blobs.append(b)
        off += len(b)
    h = json.dumps(header).encode()
    h += b" " * (-len(h) % 8)
    path.write_bytes(struct.pack("<Q", len(h)) + h + b"".join(blobs))


def test_sharded_checkpoint(tmp_path, raw, demo):
    d = _dir(tmp_path, None)
    names = sorted(raw)
    halves = {"model-00001-of-00002.safetensors": names[:len(names) // 2],
              "model-00002-of-00002.safetensors": names[len(names) // 2:]}
    wmap = {}
    for f, ns in halves.items():
        save_file({n: raw[n] for n in ns}, str(d / f))
        wmap.update({n: f for n in ns})
    (d / "model.safetensors.index.json").write_text(json.dumps({"metadata": {}, "weight_map": wmap}))
    _same(load_checkpoint(d), demo)
    # a tensor the index puts in the other shard
    bad = dict(wmap)
    bad[names[0]] = "model-00002-of-00002.safetensors"
    (d / "model.safetensors.index.json").write_text(json.dumps({"weight_map": bad}))
    assert "model.safetensors.index.json says" in _load_error(d)
    # a shard that is not there
    bad = dict(wmap)
    bad[names[0]] = "model-00003-of-00002.safetensors"
    (d / "model.safetensors.index.json").write_text(json.dumps({"weight_map": bad}))
    assert "shard 'model-00003-of-00002.safetensors'" in _load_error(d)
    # both forms at once: which is the checkpoint?
    (d / "model.safetensors.index.json").write_text(json.dumps({"weight_map": wmap}))
    save_file(raw, str(d / "model.safetensors"))
    assert "both model.safetensors and model.safetensors.index.json" in _load_error(d)


def test_config_forms_accepted(tmp_path, raw, demo):
    """n_inner null or 4 x n_embd, eos ids as a list, the fields Hugging Face defaults."""
    cases = [{"n_inner": None}, {"n_inner": 512}, {"eos_token_id": [0, 1]},
             {"activation_function": _DEL, "layer_norm_epsilon": _DEL}, {"scale_attn_weights": True}]
    for i, c in enumerate(cases):
        d = tmp_path / str(i)
        d.mkdir()
        m = load_checkpoint(_dir(d, raw, c))
        assert m.shape == demo.shape
    assert m.eos_ids == (0,)
    d = tmp_path / "eos"
    d.mkdir()
    assert load_checkpoint(_dir(d, raw, {"eos_token_id": [0, 1]})).eos_ids == (0, 1)


# -- refused -------------------------------------------------------------------------------------
@pytest.mark.parametrize("change, needles", [
    ({"model_type": "gpt_neo"}, ["model_type is 'gpt_neo'", "'gpt2'"]),
    ({"model_type": _DEL}, ["lacks the GPT-2 field model_type"]),
    ({"activation_function": "relu"}, ["activation_function is 'relu'", "'gelu_new'"]),
    ({"activation_function": "gelu"}, ["activation_function is 'gelu'"]),
    ({"n_inner": 256}, ["n_inner is 256", "null or 512"]),
    ({"n_layer": "4"}, ["n_layer is '4' (a string)", "a positive integer"]),
    ({"n_head": 4.0}, ["n_head is 4.0 (a number)"]),
    ({"vocab_size": True}, ["vocab_size is True (a boolean)"]),
    ({"n_embd": _DEL}, ["lacks the GPT-2 field n_embd"]),
    ({"n_positions": 0}, ["n_positions is 0"]),
    ({"layer_norm_epsilon": "1e-5"}, ["layer_norm_epsilon is '1e-5' (a string)"]),
    ({"layer_norm_epsilon": -1}, ["layer_norm_epsilon is -1"]),
    ({"layer_norm_epsilon": 10 ** 400}, ["layer_norm_epsilon is 1000", "(an integer); allowed: a "
                                         "positive number"]),
    ({"n_head": 3}, ["n_embd 128 is not a multiple of n_head 3"]),
    ({"scale_attn_by_inverse_layer_idx": True}, ["scale_attn_by_inverse_layer_idx is True"]),
    ({"scale_attn_weights": False}, ["scale_attn_weights is False"]),
    ({"eos_token_id": "0"}, ["eos_token_id is '0'"]),
    ({"eos_token_id": 512}, ["eos_token_id is 512", "0..511"]),
])
def test_config_fields_refused(change, needles, tmp_path, raw):
    msg = _load_error(_dir(tmp_path, raw, change))
    for n in needles:
        assert n in msg, (n, msg)


def test_fewer_layers_in_config_than_in_checkpoint(tmp_path, raw):
    """config.json says 2 layers, the checkpoint has 4: not run on 2 with the rest ignored."""
    msg = _load_error(_dir(tmp_path, raw, {"n_layer": 2}))
    assert "'h.2." in msg and "beyond config.json's n_layer 2" in msg, msg


def test_more_layers_in_config_than_anything_can_hold(tmp_path, raw):
    """config.json says 10 million layers: the first missing tensor is named, without listing
    every layer's tensors first (that was a MemoryError)."""
    msg = _load_error(_dir(tmp_path, raw, {"n_layer": 10_000_000}))
    assert "tensor 'h.4.ln_1.weight' missing" in msg, msg


def test_param_shape_names_only_the_shapes_tensors():
    from host.model import Gpt2Shape
    sh = Gpt2Shape(2, 2, 64, 100, 32)
    assert all(sh.param_shape(n) == s for n, s in sh.param_shapes().items())
    for name in ("h.2.ln_1.weight", "h.01.ln_1.weight", "h.0.attn.extra", "lm_head.weight", "h.x.ln_1.bias"):
        assert sh.param_shape(name) is None, name
    assert sh.n_params == sum(int(np.prod(s)) for s in sh.param_shapes().values())


def test_stray_and_missing_tensors(tmp_path, raw):
    t = dict(raw, **{"h.0.attn.extra": np.zeros(3, np.float32)})
    assert "tensor 'h.0.attn.extra' is not a parameter of GPT-2" in _load_error(_dir(tmp_path, t))
    (tmp_path / "b").mkdir()
    t = {k: v for k, v in raw.items() if k != "h.1.mlp.c_fc.bias"}
    assert "tensor 'h.1.mlp.c_fc.bias' missing" in _load_error(_dir(tmp_path / "b", t))
    (tmp_path / "c").mkdir()
    t = dict(raw, **{"transformer.wte.weight": raw["wte.weight"]})
    assert "'wte.weight' is in the checkpoint twice" in _load_error(_dir(tmp_path / "c", t))
    (tmp_path / "d").mkdir()
    t = dict(raw, **{"h.0.attn.c_proj.weight": raw["h.0.attn.c_proj.weight"][:, :64].copy()})
    assert "has shape (128, 64)" in _load_error(_dir(tmp_path / "d", t))


@pytest.mark.parametrize("value, needle", [(np.nan, "holds nan"), (np.inf, "holds inf"),
                                           (-np.inf, "holds -inf")])
def test_non_finite_weight(value, needle, tmp_path, raw):
    for name in ("h.3.mlp.c_fc.weight", "ln_f.bias"):
        d = tmp_path / name
        d.mkdir()
        t = {k: v.astype(np.float32) for k, v in raw.items()}
        t[name].flat[5] = value
        msg = _load_error(_dir(d, t))
        assert f"tensor '{name}' {needle}" in msg and "allowed: finite values" in msg, msg


def test_weight_beyond_float16(tmp_path, raw):
    """float32 weights beyond float16's range: one line naming the tensor and the value, not a
    numpy RuntimeWarning from the cast; a bias (float32 on the card) may be that large."""
    t = {k: v.astype(np.float32) for k, v in raw.items()}
    t["h.2.attn.c_attn.weight"][3, 7] = -1e5
    msg = _load_error(_dir(tmp_path, t))
    assert "tensor 'h.2.attn.c_attn.weight' holds -100000 at (3, 7), beyond float16's range" in msg
    (tmp_path / "b").mkdir()
    t = {k: v.astype(np.float32) for k, v in raw.items()}
    t["h.2.attn.c_attn.bias"][3] = 1e5
    load_checkpoint(_dir(tmp_path / "b", t))


def test_folded_layer_norm_beyond_float16(tmp_path, raw):
    """Each tensor within float16's range, but a LayerNorm gain times the matrix after it is
    not: the compile is one line, not a RuntimeWarning and inf weights on the card."""
    from gen.config import load_config
    from host.runtime import make_cards
    t = {k: v.astype(np.float32) for k, v in raw.items()}
    t["h.0.ln_1.weight"][:] = 60000.0
    t["h.0.attn.c_attn.weight"] *= 100.0            # each within range, the products not
    model = load_checkpoint(_dir(tmp_path, t))
    cfg = load_config(DEMO_MODEL.parent.parent / "configs" / "tiny.yaml")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        with pytest.raises(UserError, match="leaves float16's range .* once the LayerNorm gains"):
            make_cards(cfg, model, "iss", 1)


def test_lm_head_and_files(tmp_path, raw):
    t = dict(raw, **{"lm_head.weight": raw["wte.weight"] + np.float16(1)})
    assert "lm_head.weight differs from wte.weight" in _load_error(_dir(tmp_path, t))
    (tmp_path / "b").mkdir()
    d = _dir(tmp_path / "b", raw, {"tie_word_embeddings": False})
    assert "tie_word_embeddings is False" in _load_error(d)
    (tmp_path / "c").mkdir()
    t = dict(raw, **{"h.0.attn.c_attn.bias": raw["h.0.attn.c_attn.bias"].astype(np.float64)})
    assert "tensor 'h.0.attn.c_attn.bias' is F64; allowed: F32, F16 or BF16" in _load_error(
        _dir(tmp_path / "c", t))
    (tmp_path / "e").mkdir()
    d = _dir(tmp_path / "e", raw, drop_weights=True)
    (d / "pytorch_model.bin").write_bytes(b"pickle")
    assert "pickle checkpoints" in _load_error(d)
    (d / "model.safetensors").write_bytes(b"\x08\x00\x00\x00\x00\x00\x00\x00{}garbage")
    assert "cannot be read as safetensors" in _load_error(d)
    (tmp_path / "f").mkdir()
    d = _dir(tmp_path / "f", raw)
    (d / "config.json").write_text("{not json")
    assert "is not valid JSON" in _load_error(d)


def test_perf_shape_checks_the_same_fields(tmp_path):
    d = _dir(tmp_path, None, {"activation_function": "relu"})
    with pytest.raises(UserError, match="--model-shape: .*activation_function is 'relu'"):
        load_shape(d / "config.json", "--model-shape")
