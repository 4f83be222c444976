"""GPT-2 models on the host: shapes, weights with Hugging Face's names, checkpoint loading.

A checkpoint is a Hugging Face GPT-2 directory (``load_checkpoint``), read and checked:

- ``config.json``: ``model_type`` ``gpt2``; ``activation_function`` ``gelu_new`` (GPT-2's
  tanh GELU, the one the vector unit computes; absent means gelu_new, Hugging Face's default);
  ``n_inner`` null (or absent) or 4 x ``n_embd``; ``n_layer``, ``n_head``, ``n_embd``,
  ``vocab_size``, ``n_positions`` positive integers, ``n_embd`` a multiple of ``n_head``;
  ``layer_norm_epsilon`` a positive number (absent: 1e-5); ``scale_attn_weights`` true and
  ``scale_attn_by_inverse_layer_idx`` false where given (the attention the card computes);
  ``eos_token_id`` null, an id or a list of ids in the vocabulary. A field of the wrong type
  or value is named with its value.
- the weights: ``model.safetensors``, or shards listed by ``model.safetensors.index.json``
  (safetensors only: a pickle checkpoint must never run code). Tensors in float32, float16
  or bfloat16 (bfloat16 widens to float32 exactly). Names with or without the
  ``transformer.`` prefix. Exactly the tensors of a GPT-2 of the config's shape: each one
  present with its shape, nothing else (a layer beyond ``n_layer`` is an error, not ignored);
  the causal-mask buffers some exports carry (``h.<i>.attn.bias``, ``.attn.masked_bias``)
  are skipped. The LM head tied to the token embedding (``lm_head.weight`` absent, or equal
  to ``wte.weight``). Every value finite; the matrices and embeddings within float16's range
  (the card holds them as float16).
"""

import json
import math
import struct
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from .errors import UserError

__all__ = ["Gpt2Shape", "Gpt2", "load_checkpoint", "load_shape", "random_gpt2", "SHAPES"]

FP16_MAX = float(np.finfo(np.float16).max)           # 65504
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

    def _top_shapes(self):
        d = self.d_model
        return {"wte.weight": (self.vocab, d), "wpe.weight": (self.n_positions, d),
                "ln_f.weight": (d,), "ln_f.bias": (d,)}

    def _layer_shapes(self):
        """A layer's tensors (names after ``h.<i>.``) and their shapes."""
        d, F = self.d_model, self.d_ff
        return {"ln_1.weight": (d,), "ln_1.bias": (d,),
                "attn.c_attn.weight": (d, 3 * d), "attn.c_attn.bias": (3 * d,),
                "attn.c_proj.weight": (d, d), "attn.c_proj.bias": (d,),
                "ln_2.weight": (d,), "ln_2.bias": (d,),
                "mlp.c_fc.weight": (d, F), "mlp.c_fc.bias": (F,),
                "mlp.c_proj.weight": (F, d), "mlp.c_proj.bias": (d,)}

    def params(self):
        """(name, shape) of every tensor, in order, one at a time (a checkpoint's check stops
        at its first missing tensor without listing a config's every layer)."""
        yield from self._top_shapes().items()
        per_layer = self._layer_shapes()
        for i in range(self.n_layer):
            for name, shape in per_layer.items():
                yield f"h.{i}.{name}", shape

    def param_shape(self, name):
        """The shape of tensor ``name``, or None if it is not one of this shape's."""
        import re
        m = re.fullmatch(r"h\.(0|[1-9][0-9]*)\.(.+)", name)
        if m:
            return self._layer_shapes().get(m.group(2)) if int(m.group(1)) < self.n_layer else None
        return self._top_shapes().get(name)

    def param_shapes(self):
        return dict(self.params())

    @property
    def n_params(self):
        per_layer = sum(int(np.prod(s)) for s in self._layer_shapes().values())
        return sum(int(np.prod(s)) for s in self._top_shapes().values()) + self.n_layer * per_layer


# GPT-2 sizes by their Hugging Face names.
SHAPES = {
    "gpt2": Gpt2Shape(12, 12, 768, 50257, 1024),
    "gpt2-medium": Gpt2Shape(24, 16, 1024, 50257, 1024),
    "gpt2-large": Gpt2Shape(36, 20, 1280, 50257, 1024),
    "gpt2-xl": Gpt2Shape(48, 25, 1600, 50257, 1024),
}


@dataclass
class Gpt2:
    """A GPT-2: its shape and weights (Hugging Face names without the ``transformer.`` prefix
    -> float32 arrays; None for a shapes-only model), and its end-of-text token ids."""
    shape: Gpt2Shape
    weights: dict | None
    eos_ids: tuple = ()

    def check(self, flag="model"):
        """Every tensor of the shape present with its shape, nothing else, every value finite
        and the matrices within float16's range. Raises UserError naming the tensor."""
        for name in self.weights:
            if self.shape.param_shape(name) is None:
                raise UserError(f"{flag}: tensor {name!r} {_stray_reason(name, self.shape)}")
        for name, shape in self.shape.params():
            if name not in self.weights:
                raise UserError(f"{flag}: tensor {name!r} missing")
            w = self.weights[name]
            got = tuple(w.shape)
            if got != shape:
                raise UserError(f"{flag}: tensor {name!r} has shape {got}; the config says {shape}")
            finite = np.isfinite(w)
            if not finite.all():
                i = np.unravel_index(int(np.argmin(finite)), w.shape)
                raise UserError(f"{flag}: tensor {name!r} holds {w[i]} at {tuple(int(k) for k in i)}; "
                                f"allowed: finite values")
            if w.ndim == 2 and w.size:
                big = float(np.abs(w).max())
                if big > FP16_MAX:
                    i = np.unravel_index(int(np.argmax(np.abs(w))), w.shape)
                    raise UserError(f"{flag}: tensor {name!r} holds {w[i]:g} at "
                                    f"{tuple(int(k) for k in i)}, beyond float16's range; allowed: "
                                    f"|value| <= {FP16_MAX:g} (the card holds the matrices and "
                                    f"embeddings as float16)")


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


def _stray_reason(name, shape):
    import re
    m = re.match(r"h\.(\d+)\.", name)
    if m and int(m.group(1)) >= shape.n_layer:
        return (f"belongs to layer {m.group(1)}, beyond config.json's n_layer {shape.n_layer}; allowed: "
                f"a checkpoint of exactly n_layer layers (layers 0..{shape.n_layer - 1})")
    return "is not a parameter of GPT-2; allowed: exactly GPT2LMHeadModel's tensors"


_POSITIVE_INTS = ("n_layer", "n_head", "n_embd", "vocab_size", "n_positions")


def _type(v):
    return {bool: "a boolean", int: "an integer", float: "a number", str: "a string", list: "a list",
            dict: "an object", type(None): "null"}.get(type(v), type(v).__name__)


def _finite_float(x):
    """Whether a JSON number is a finite float (an integer too large for one is not)."""
    try:
        return math.isfinite(float(x))
    except OverflowError:
        return False


def parse_config(c, where, flag="--model"):
    """Gpt2Shape and end-of-text ids of a Hugging Face GPT-2 config (a dict), checked. Every
    error is a UserError naming ``flag``, ``where``, the field and its value."""
    def fail(msg):
        raise UserError(f"{flag}: {where}: {msg}")

    if not isinstance(c, dict):
        fail(f"got {_type(c)}; allowed: a JSON object of GPT-2 fields")
    if "model_type" not in c:
        fail("lacks the GPT-2 field model_type; allowed: \"gpt2\"")
    if c["model_type"] != "gpt2":
        fail(f"model_type is {c['model_type']!r}; allowed: 'gpt2' (gptfpga runs GPT-2 only)")
    act = c.get("activation_function", "gelu_new")
    if act != "gelu_new":
        fail(f"activation_function is {act!r}; allowed: 'gelu_new' (GPT-2's tanh GELU, the one the "
             f"vector unit computes)")
    v = {}
    for name in _POSITIVE_INTS:
        if name not in c:
            fail(f"lacks the GPT-2 field {name}; allowed: a positive integer")
        x = c[name]
        if isinstance(x, bool) or not isinstance(x, int):
            fail(f"{name} is {x!r} ({_type(x)}); allowed: a positive integer")
        if x < 1:
            fail(f"{name} is {x}; allowed: a positive integer")
        v[name] = x
    eps = c.get("layer_norm_epsilon", 1e-5)
    if isinstance(eps, bool) or not isinstance(eps, int | float) or not _finite_float(eps) or eps <= 0:
        fail(f"layer_norm_epsilon is {eps!r} ({_type(eps)}); allowed: a positive number")
    if v["n_embd"] % v["n_head"]:
        fail(f"n_embd {v['n_embd']} is not a multiple of n_head {v['n_head']}")
    inner = c.get("n_inner")
    if inner is not None and (isinstance(inner, bool) or inner != 4 * v["n_embd"]):
        fail(f"n_inner is {inner!r}; allowed: null or {4 * v['n_embd']} (4 x n_embd: the MLP width the "
             f"compiler lays out)")
    for name, want in (("scale_attn_weights", True), ("scale_attn_by_inverse_layer_idx", False)):
        if name in c and c[name] is not want:
            fail(f"{name} is {c[name]!r}; allowed: {str(want).lower()} (GPT-2's attention, the one the "
                 f"card computes)")
    eos = c.get("eos_token_id")
    ids = [] if eos is None else eos if isinstance(eos, list) else [eos]
    for e in ids:
        if isinstance(e, bool) or not isinstance(e, int) or not 0 <= e < v["vocab_size"]:
            fail(f"eos_token_id is {eos!r}; allowed: null, or token ids (one or a list) in "
                 f"0..{v['vocab_size'] - 1}")
    shape = Gpt2Shape(v["n_layer"], v["n_head"], v["n_embd"], v["vocab_size"], v["n_positions"],
                      float(eps))
    return shape, tuple(ids)


def _read_json(path, flag):
    try:
        return json.loads(Path(path).read_text())
    except OSError as e:
        raise UserError(f"{flag}: {path} cannot be read ({e.strerror})") from None
    except UnicodeDecodeError:
        raise UserError(f"{flag}: {path} is not a text file; allowed: JSON") from None
    except json.JSONDecodeError as e:
        raise UserError(f"{flag}: {path} is not valid JSON ({e.msg} at line {e.lineno})") from None


def load_shape(cfg_file, flag="--model"):
    """Gpt2Shape of a Hugging Face GPT-2 config.json (checked: see the module docstring)."""
    cfg_file = Path(cfg_file)
    return parse_config(_read_json(cfg_file, flag), cfg_file, flag)[0]


def _weight_files(path, flag):
    """[safetensors files], and {tensor: file name} when the checkpoint is sharded."""
    single, index = path / "model.safetensors", path / "model.safetensors.index.json"
    if single.exists() and index.exists():
        raise UserError(f"{flag}: {path} has both model.safetensors and model.safetensors.index.json; "
                        f"allowed: one of them (which is the checkpoint?)")
    if single.exists():
        return [single], None
    if not index.exists():
        if any(path.glob("*.bin")) or any(path.glob("*.pt")) or any(path.glob("*.pth")):
            raise UserError(f"{flag}: {path} has only pickle checkpoints (.bin/.pt); gptfpga loads "
                            f"safetensors only (a model file must never run code)")
        raise UserError(f"{flag}: {single} not found (nor model.safetensors.index.json for shards)")
    doc = _read_json(index, flag)
    wmap = doc.get("weight_map") if isinstance(doc, dict) else None
    if not isinstance(wmap, dict) or not wmap:
        raise UserError(f"{flag}: {index}: lacks a weight_map; allowed: an object of tensor name -> "
                        f"shard file")
    for name, shard in wmap.items():
        if not isinstance(shard, str) or Path(shard).name != shard or not shard.endswith(".safetensors"):
            raise UserError(f"{flag}: {index}: weight_map[{name!r}] is {shard!r}; allowed: the name "
                            f"of a .safetensors file in {path}")
        if not (path / shard).is_file():
            raise UserError(f"{flag}: {index}: shard {shard!r} (of tensor {name!r}) not found in {path}")
    return [path / f for f in sorted(set(wmap.values()))], wmap


def _bf16_reader(file):
    """Reads BF16 tensors by their header offsets (numpy has no bfloat16); exact widening."""
    with open(file, "rb") as f:
        n = struct.unpack("<Q", f.read(8))[0]
        header = json.loads(f.read(n))
    base = 8 + n

    def read(name):
        info = header[name]
        lo, hi = info["data_offsets"]
        raw = np.fromfile(file, np.uint16, count=(hi - lo) // 2, offset=base + lo)
        return (raw.astype(np.uint32) << 16).view(np.float32).reshape(info["shape"])
    return read


def _read_safetensors(file, flag):
    """{name: float32 array} of one safetensors file (F32, F16 or BF16 tensors)."""
    from safetensors import safe_open
    out = {}
    try:
        with safe_open(str(file), framework="numpy") as f:
            bf16 = None
            for name in f.keys():
                dtype = f.get_slice(name).get_dtype()
                if dtype in ("F32", "F16"):
                    out[name] = np.asarray(f.get_tensor(name), np.float32)
                elif dtype == "BF16":
                    bf16 = bf16 or _bf16_reader(file)
                    out[name] = bf16(name)
                else:
                    raise UserError(f"{flag}: {file}: tensor {name!r} is {dtype}; allowed: F32, F16 "
                                    f"or BF16")
    except UserError:
        raise
    except Exception as e:   # the library raises its own error types for corrupt files
        raise UserError(f"{flag}: {file} cannot be read as safetensors ({e})") from None
    return out


def load_checkpoint(path, flag="--model"):
    """A Hugging Face GPT-2 directory -> Gpt2, checked as the module docstring says."""
    path = Path(path)
    if not path.is_dir():
        raise UserError(f"{flag}: {path} is not a directory (expected config.json and "
                        f"model.safetensors)")
    cfg_file = path / "config.json"
    if not cfg_file.exists():
        raise UserError(f"{flag}: {cfg_file} not found")
    conf = _read_json(cfg_file, flag)
    shape, eos = parse_config(conf, cfg_file, flag)
    files, wmap = _weight_files(path, flag)
    weights, origin = {}, {}
    head = None
    for file in files:
        for name, arr in _read_safetensors(file, flag).items():
            if wmap is not None and wmap.get(name) != file.name:
                raise UserError(f"{flag}: tensor {name!r} is in {file.name}, but "
                                f"model.safetensors.index.json says "
                                f"{wmap[name] if name in wmap else 'nothing of it'}")
            key = name[len("transformer."):] if name.startswith("transformer.") else name
            if key in origin:
                raise UserError(f"{flag}: tensor {key!r} is in the checkpoint twice (as {origin[key]!r} "
                                f"and {name!r})")
            origin[key] = name
            if key == "lm_head.weight":
                head = arr
                continue
            if key.endswith((".attn.bias", ".attn.masked_bias")) and _layer(key) < shape.n_layer:
                continue      # the causal-mask buffers some exports carry
            weights[key] = arr
    if wmap is not None:
        for name in wmap:
            if name not in origin.values():
                raise UserError(f"{flag}: tensor {name!r} is listed in model.safetensors.index.json "
                                f"but not in {wmap[name]}")
    model = Gpt2(shape, weights, eos)
    model.check(flag)
    if head is None:
        if conf.get("tie_word_embeddings", True) is not True:
            raise UserError(f"{flag}: {cfg_file}: tie_word_embeddings is "
                            f"{conf['tie_word_embeddings']!r} but the checkpoint has no lm_head.weight; "
                            f"allowed: a tied LM head (tie_word_embeddings true)")
    elif not np.array_equal(head, weights["wte.weight"]):
        raise UserError(f"{flag}: lm_head.weight differs from wte.weight; gptfpga needs the tied "
                        f"LM head of GPT-2")
    return model


def _layer(key):
    try:
        return int(key.split(".")[1]) if key.startswith("h.") else 1 << 30
    except ValueError:
        return 1 << 30
