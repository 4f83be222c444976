"""GPT-2 models on the host: shapes, weights with Hugging Face's names, checkpoint loading.

A checkpoint is a Hugging Face GPT-2 directory: config.json and model.safetensors (safetensors
only: a model file must never run code). Names may carry the ``transformer.`` prefix; the LM
head is tied to the token embedding (``lm_head.weight``, if present, must equal it).
"""

import json
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from .errors import UserError

__all__ = ["Gpt2Shape", "Gpt2", "load_checkpoint", "random_gpt2", "SHAPES"]


@dataclass(frozen=True)
class Gpt2Shape:
    n_layer: int
    n_head: int
    d_model: int
    vocab: int
    n_positions: int
    eps: float = 1e-5

    @property
    def head_dim(self):
        return self.d_model // self.n_head

    @property
    def d_ff(self):
        return 4 * self.d_model

    def param_shapes(self):
        d, F = self.d_model, self.d_ff
        shapes = {"wte.weight": (self.vocab, d), "wpe.weight": (self.n_positions, d),
                  "ln_f.weight": (d,), "ln_f.bias": (d,)}
        for i in range(self.n_layer):
            p = f"h.{i}."
            shapes.update({
                p + "ln_1.weight": (d,), p + "ln_1.bias": (d,),
                p + "attn.c_attn.weight": (d, 3 * d), p + "attn.c_attn.bias": (3 * d,),
                p + "attn.c_proj.weight": (d, d), p + "attn.c_proj.bias": (d,),
                p + "ln_2.weight": (d,), p + "ln_2.bias": (d,),
                p + "mlp.c_fc.weight": (d, F), p + "mlp.c_fc.bias": (F,),
                p + "mlp.c_proj.weight": (F, d), p + "mlp.c_proj.bias": (d,),
            })
        return shapes

    @property
    def n_params(self):
        return sum(int(np.prod(s)) for s in self.param_shapes().values())


# GPT-2 sizes by their Hugging Face names.
SHAPES = {
    "gpt2": Gpt2Shape(12, 12, 768, 50257, 1024),
    "gpt2-medium": Gpt2Shape(24, 16, 1024, 50257, 1024),
    "gpt2-large": Gpt2Shape(36, 20, 1280, 50257, 1024),
    "gpt2-xl": Gpt2Shape(48, 25, 1600, 50257, 1024),
}


@dataclass
class Gpt2:
    shape: Gpt2Shape
    weights: dict      # HF names without the "transformer." prefix -> float32 arrays

    def check(self):
        want = self.shape.param_shapes()
        for name, shape in want.items():
            if name not in self.weights:
                raise UserError(f"model: tensor {name!r} missing")
            got = tuple(self.weights[name].shape)
            if got != shape:
                raise UserError(f"model: tensor {name!r} has shape {got}; the config says {shape}")


def random_gpt2(shape, rng, scale=0.02):
    """A GPT-2 with random weights (GPT-2's initialisation scale), LN weights near 1."""
    w = {}
    for name, s in shape.param_shapes().items():
        if name.endswith(("ln_1.weight", "ln_2.weight", "ln_f.weight")):
            w[name] = (1 + 0.1 * rng.standard_normal(s)).astype(np.float32)
        elif name.endswith("bias"):
            w[name] = (0.02 * rng.standard_normal(s)).astype(np.float32)
        else:
            w[name] = (scale * rng.standard_normal(s)).astype(np.float32)
    return Gpt2(shape, w)


def load_shape(cfg_file, flag="--model"):
    """Gpt2Shape of a Hugging Face GPT-2 config.json (checked)."""
    cfg_file = Path(cfg_file)
    try:
        c = json.loads(cfg_file.read_text())
    except OSError as e:
        raise UserError(f"{flag}: {cfg_file} cannot be read ({e.strerror})") from None
    except json.JSONDecodeError as e:
        raise UserError(f"{flag}: {cfg_file} is not valid JSON ({e.msg} at line {e.lineno})") from None
    try:
        shape = Gpt2Shape(int(c["n_layer"]), int(c["n_head"]), int(c["n_embd"]), int(c["vocab_size"]),
                          int(c["n_positions"]), float(c.get("layer_norm_epsilon", 1e-5)))
    except (KeyError, TypeError, ValueError, AttributeError) as e:
        raise UserError(f"{flag}: {cfg_file} lacks a GPT-2 field ({e})") from None
    for name, v in (("n_layer", shape.n_layer), ("n_head", shape.n_head), ("n_embd", shape.d_model),
                    ("vocab_size", shape.vocab), ("n_positions", shape.n_positions)):
        if v < 1:
            raise UserError(f"{flag}: {cfg_file}: {name} is {v}; allowed: 1 or more")
    if shape.d_model % shape.n_head:
        raise UserError(f"{flag}: n_embd {shape.d_model} is not a multiple of n_head {shape.n_head}")
    return shape


def load_checkpoint(path):
    """A Hugging Face GPT-2 directory -> Gpt2 (shapes checked; safetensors only)."""
    path = Path(path)
    if not path.is_dir():
        raise UserError(f"--model: {path} is not a directory (expected config.json and "
                        f"model.safetensors)")
    cfg_file = path / "config.json"
    if not cfg_file.exists():
        raise UserError(f"--model: {cfg_file} not found")
    st_file = path / "model.safetensors"
    if not st_file.exists():
        if any(path.glob("*.bin")) or any(path.glob("*.pt")) or any(path.glob("*.pth")):
            raise UserError(f"--model: {path} has only pickle checkpoints (.bin/.pt); gptfpga loads "
                            f"safetensors only (a model file must never run code)")
        raise UserError(f"--model: {st_file} not found")
    shape = load_shape(cfg_file)
    from safetensors.numpy import load_file
    try:
        raw = load_file(str(st_file))
    except Exception as e:   # the library raises its own error types for corrupt files
        raise UserError(f"--model: {st_file} cannot be read as safetensors ({e})") from None
    weights = {}
    for name, arr in raw.items():
        key = name[len("transformer."):] if name.startswith("transformer.") else name
        if key.endswith((".attn.bias", ".attn.masked_bias")):
            continue      # causal-mask buffers some exports carry
        weights[key] = np.asarray(arr, np.float32)
    head = weights.pop("lm_head.weight", None)
    model = Gpt2(shape, weights)
    model.check()
    if head is not None and not np.array_equal(head, weights["wte.weight"]):
        raise UserError("--model: lm_head.weight differs from wte.weight; gptfpga needs the tied "
                        "LM head of GPT-2")
    return model
