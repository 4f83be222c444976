"""A GPT-2 decoder layer compiled onto one card: ISS against float64, RTL against the ISS.

One random-weight layer (d_model 128, 8 heads, vocabulary 256) on configs/tiny.yaml: a prefill
of four tokens, then decode steps attending over the KV cache up to six positions.
"""

import numpy as np
import pytest

from host.compiler import CompiledModel
from host.model import Gpt2Shape, random_gpt2
from host.stripes import read_stripes
from sim.ref import gpt2 as G
from sim.ref.iss import IssDevice

TOKENS = [5, 17, 200, 3, 99, 42]
# Tolerance against float64 (with the same fp16-rounded weights): relative to the largest
# magnitude of each compared tensor. fp16 activations into the matrix unit bound it.
REL_TOL = 2e-3


def _run(cfg, cm, dev):
    cm.load(dev)
    out = []
    for toks, pos in ((TOKENS[:4], 0), (TOKENS[4:5], 4), (TOKENS[5:], 5)):
        c = dev.run(cm.step(toks, pos), cm.prog_addr, timeout_s=300)
        assert c["status"] & 0xFF == 0, f"status {c['status']:#x}"
        out.append((cm.read_hidden(dev, len(toks)), cm.read_logits(dev, len(toks))))
    kv_lo, kv_hi = cm.kv_rows
    out.append(read_stripes(dev, cfg, kv_lo, kv_hi - kv_lo))
    return out


@pytest.fixture(scope="module")
def layer(cfg_path):
    from gen.config import load_config
    cfg = load_config(cfg_path)
    shape = Gpt2Shape(n_layer=1, n_head=8, d_model=128, vocab=256, n_positions=128)
    model = random_gpt2(shape, np.random.default_rng(2026))
    cm = CompiledModel(cfg, model, dump_hidden=True, all_logits=True, max_tokens=4)
    return cfg, model, cm, _run(cfg, cm, IssDevice(cfg))


def test_iss_layer_against_float64(layer):
    cfg, model, cm, ((h4, l4), (h1a, l1a), (h1, l1), _kv) = layer
    w16 = {k: (v.astype(np.float16).astype(np.float64) if v.ndim == 2 else v)
           for k, v in model.weights.items()}
    ref_h = G.hidden(w16, TOKENS, model.shape.n_head, model.shape.n_layer)
    ref_l = G.forward(w16, TOKENS, model.shape.n_head, model.shape.n_layer)
    for name, got, ref in (("layer, prefill", h4[1], ref_h[1][:4]), ("layer, decode", h1a[1], ref_h[1][4:5]),
                           ("layer, decode 2", h1[1], ref_h[1][5:]),
                           ("logits, prefill", l4, ref_l[:4]), ("logits, decode", l1, ref_l[5:])):
        err = np.abs(got - ref).max() / np.abs(ref).max()
        assert err < REL_TOL, f"{name}: relative error {err:.3g}"
    # The embedding sum is exact.
    assert np.array_equal(h4[0], (w16["wte.weight"][TOKENS[:4]] + w16["wpe.weight"][:4]).astype(np.float32))


@pytest.mark.rtl
def test_rtl_layer_bit_exact(layer):
    from sim.system import RtlDevice
    cfg, model, cm, iss_out = layer
    rtl_out = _run(cfg, cm, RtlDevice(cfg))
    for (hi, li), (hr, lr) in zip(iss_out[:3], rtl_out[:3], strict=True):
        assert np.array_equal(hi.view(np.uint32), hr.view(np.uint32)), "hidden states differ"
        assert np.array_equal(li.view(np.uint32), lr.view(np.uint32)), "logits differ"
    assert np.array_equal(iss_out[3], rtl_out[3]), "KV caches differ"


def test_iss_full_tiny_model_against_float64():
    """The largest model configs/tiny.yaml supports (4 layers, 8 heads, d_model 128, vocabulary
    1024, 128 positions): prefill in steps of three tokens, then decode; the LM head runs in
    chunks. Logits of the last position against float64."""
    from gen.config import load_config
    cfg = load_config(__import__("pathlib").Path(__file__).parent.parent / "configs" / "tiny.yaml")
    shape = Gpt2Shape(n_layer=4, n_head=8, d_model=128, vocab=1024, n_positions=128)
    model = random_gpt2(shape, np.random.default_rng(7))
    cm = CompiledModel(cfg, model, max_tokens=3)
    dev = IssDevice(cfg)
    cm.load(dev)
    toks = [int(t) for t in np.random.default_rng(8).integers(0, 1024, 11)]
    for p in range(0, 11, 3):
        c = dev.run(cm.step(toks[p:min(p + 3, 11)], p), cm.prog_addr)
        assert c["status"] & 0xFF == 0
    w16 = {k: (v.astype(np.float16).astype(np.float64) if v.ndim == 2 else v)
           for k, v in model.weights.items()}
    ref = G.forward(w16, toks, 8, 4)[-1]
    got = cm.read_logits(dev, 1)[-1]
    assert np.abs(got - ref).max() / np.abs(ref).max() < REL_TOL


@pytest.mark.soak
def test_rtl_gpt2_small_layer_on_medium():
    """A decoder layer at GPT-2 small's dimensions (d_model 768, 12 heads) on configs/medium.yaml:
    a decode step over 9 cached positions, RTL against ISS bit for bit, ISS against float64."""
    from gen.config import load_config
    from sim.system import RtlDevice
    cfg = load_config(__import__("pathlib").Path(__file__).parent.parent / "configs" / "medium.yaml")
    shape = Gpt2Shape(n_layer=1, n_head=12, d_model=768, vocab=512, n_positions=64)
    model = random_gpt2(shape, np.random.default_rng(11))
    cm = CompiledModel(cfg, model, dump_hidden=True)
    toks = [int(t) for t in np.random.default_rng(12).integers(0, 512, 10)]
    outs = []
    for dev in (IssDevice(cfg), RtlDevice(cfg)):
        cm.load(dev)
        for p in range(0, 9, cm.T):
            dev.run(cm.step(toks[p:min(p + cm.T, 9)], p), cm.prog_addr, timeout_s=3600)
        c = dev.run(cm.step(toks[9:10], 9), cm.prog_addr, timeout_s=3600)
        assert c["status"] & 0xFF == 0
        outs.append((cm.read_hidden(dev, 1), cm.read_logits(dev, 1)))
    (hi, li), (hr, lr) = outs
    assert np.array_equal(hi.view(np.uint32), hr.view(np.uint32))
    assert np.array_equal(li.view(np.uint32), lr.view(np.uint32))
    w16 = {k: (v.astype(np.float16).astype(np.float64) if v.ndim == 2 else v)
           for k, v in model.weights.items()}
    ref = G.hidden(w16, toks, 12, 1)[1][9]
    assert np.abs(hi[1][0] - ref).max() / np.abs(ref).max() < REL_TOL
