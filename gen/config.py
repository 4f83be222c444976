"""Appliance configuration: one frozen, validated object loaded from YAML.

Every part of gptfpga (the RTL generator, the simulators, the host runtime) reads its
parameters from an :class:`ApplianceConfig`. The YAML schema is defined here once, by the
dataclasses below: each field carries its allowed range or choices and a one-line doc, and
:func:`load_config` checks every key against them. A bad config raises :class:`ConfigError`
whose message is one line naming the key path, the value given and what is allowed.

Derived figures (MACs per cycle, HBM bytes per cycle, peak bandwidths) are properties, so
they can never disagree with the values they are derived from.
"""

from __future__ import annotations

import dataclasses
import difflib
import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from hw.isa import ADDR_BITS, MATVEC_CB_BITS, MATVEC_ROW_BITS, MAX_TOKENS
from hw.ring import MIN_LINK_BITS, MIN_RING_LINK_BITS

# The device a card is built for (an Alveo U280): what one card's matrix unit and weight FIFO
# may take of it. gptfpga synth counts the whole card against the same device (gen/synth.py).
DEVICE = "an Alveo U280"
DEVICE_DSPS = 9_024                     # DSP48E2 slices
DEVICE_URAM_BITS = 960 * 4096 * 72      # 960 URAM288 blocks

__all__ = [
    "ConfigError",
    "CoreConfig",
    "LimitsConfig",
    "HbmConfig",
    "LinkConfig",
    "ApplianceConfig",
    "load_config",
    "config_from_dict",
]


class ConfigError(ValueError):
    """A config that cannot be used. ``str(err)`` is one line for the user."""


def _spec(kind, doc, *, lo=None, hi=None, choices=None, pow2=False, default=dataclasses.MISSING):
    meta = {"kind": kind, "doc": doc, "lo": lo, "hi": hi, "choices": choices, "pow2": pow2}
    if default is dataclasses.MISSING:
        return field(metadata=meta)
    return field(default=default, metadata=meta)


def _allowed(meta) -> str:
    kind = meta["kind"]
    if meta["choices"] is not None:
        return "one of " + ", ".join(repr(c) for c in meta["choices"])
    if kind in (int, float):
        name = "integer" if kind is int else "number"
        if meta["pow2"]:
            name = "power of two"
        lo, hi = meta["lo"], meta["hi"]
        if lo is not None and hi is not None:
            return f"{name} in [{lo}, {hi}]"
        if lo is not None:
            return f"{name} >= {lo}"
        return name
    if kind is str:
        return "a non-empty string of letters, digits, '-' and '_'"
    return kind.__name__


@dataclass(frozen=True)
class LimitsConfig:
    """Largest model the build supports (sizes on-chip buffers and instruction fields)."""

    d_model: int = _spec(int, "largest model width", lo=16, hi=8192)
    heads: int = _spec(int, "largest number of attention heads", lo=1, hi=128)
    layers: int = _spec(int, "largest number of decoder layers", lo=1, hi=256)
    vocab: int = _spec(int, "largest vocabulary", lo=2, hi=1 << 20)
    seq_len: int = _spec(int, "longest context (prompt + generated tokens)", lo=1, hi=1 << 16)
    # Batched decode (gptfpga run with several prompts): one step takes a token of every
    # stream, each stream with its own K/V caches; a MATVEC takes at most MAX_TOKENS tokens.
    streams: int = _spec(int, "most prompts decoded together, one token each a step (batched decode)",
                         lo=1, hi=MAX_TOKENS, default=1)


@dataclass(frozen=True)
class CoreConfig:
    """One card's compute core."""

    lanes: int = _spec(int, "matrix unit lanes: output rows computed in parallel", lo=1, hi=64)
    width: int = _spec(int, "matrix unit dot-product width: inputs per lane per cycle",
                       lo=2, hi=256, pow2=True)
    # int8 weights, a power-of-two scale per row (docs/numerics.md): a tile (one stripe row)
    # holds 2 x lanes rows of int8 instead of lanes rows of fp16; the K and V caches stay fp16.
    # int16 weights: the same scale per row, a tile of lanes rows of int16 that skip the row
    # alignment (docs/performance.md, the route to R = 4); the caches as cache_phases says.
    weight_dtype: str = _spec(str, "weight format in HBM", choices=("fp16", "int8", "int16"))
    vector_lanes: int = _spec(int, "vector unit lanes: fp32 elements per cycle (divides lanes)",
                              lo=1, hi=64, pow2=True)
    vsp_words: int = _spec(int, "vector scratchpad capacity in fp32 words", lo=1024,
                           hi=1 << ADDR_BITS, pow2=True)
    vsp_segments: int = _spec(int, "independently ported VSP segments (by address range)",
                              lo=1, hi=16, pow2=True)
    xb_words: int = _spec(int, "matrix-unit input buffer capacity in fp16 words", lo=256,
                          hi=1 << ADDR_BITS, pow2=True)
    weight_fifo_tiles: int = _spec(int, "weight FIFO depth in tiles (prefetch ahead of the MPU)",
                                   lo=16, hi=1 << 16, pow2=True)
    limits: LimitsConfig = _spec(LimitsConfig, "largest model the build supports")
    # The vector unit's special-function units (EXP, RECIP, RSQRT, GELU: most of a lane's
    # LUTs) each serve this many lanes in turn, so a row of those operations takes that many
    # cycles; the other operations keep a row a cycle (docs/performance.md).
    special_share: int = _spec(int, "vector lanes sharing one special-function unit "
                               "(EXP, RECIP, RSQRT, GELU take that many cycles a row)",
                               lo=1, hi=64, pow2=True, default=1)
    # Matrix unit v2's weight reuse (docs/performance.md): R token vectors meet each weight
    # tile in one cycle, so a MATVEC over T tokens takes ceil(T / R) cycles per tile.
    reuse: int = _spec(int, "token vectors that meet each weight tile per cycle (R)",
                       lo=1, hi=MAX_TOKENS, pow2=True, default=1)
    # int16 builds align only the fp16 tiles the card writes itself (the K and V caches), with
    # lanes / cache_phases row alignments that serve a tile's rows over cache_phases cycles
    # (hw/arith/dot.py DotArrayI16): a cache tile is held that many times as long.
    cache_phases: int = _spec(int, "int16 builds: cycles a K or V cache tile takes a step "
                              "(lanes / cache_phases row alignments)",
                              lo=1, hi=64, pow2=True, default=1)

    @property
    def weight_bytes(self) -> int:
        return {"fp16": 2, "int8": 1, "int16": 2}[self.weight_dtype]

    @property
    def int_weights(self) -> bool:
        """The weight matrices are integers with a power-of-two scale per row (int8, int16):
        MATVEC.i8's tiles, a row of scales a group."""
        return self.weight_dtype in ("int8", "int16")

    @property
    def tile_rows(self) -> int:
        """Rows of a weight matrix's tile: lanes (fp16, int16), 2 x lanes (int8); width columns."""
        return self.lanes * (2 if self.weight_dtype == "int8" else 1)


@dataclass(frozen=True)
class HbmConfig:
    """The card's HBM: pseudo-channels, their AXI ports and the simulation model's timing."""

    channels: int = _spec(int, "HBM pseudo-channels used (one AXI master each)", lo=1, hi=32)
    data_bits: int = _spec(int, "AXI data width of each channel port", choices=(256, 512))
    latency_cycles: int = _spec(int, "HBM model: read latency, AR accepted to first R beat",
                                lo=1, hi=4096)
    gbytes_per_s: float = _spec(float, "HBM model: bandwidth cap per channel in GB/s",
                                lo=0.1, hi=1000.0)
    max_outstanding: int = _spec(int, "AXI bursts in flight per channel and direction",
                                 lo=1, hi=64)
    max_burst_beats: int = _spec(int, "longest AXI burst the DMA issues", lo=1, hi=256, pow2=True)
    channel_mbytes: int = _spec(int, "capacity of one pseudo-channel in MiB", lo=1, hi=4096)


@dataclass(frozen=True)
class LinkConfig:
    """The ring links between cards (AXI4-Stream ports to a 100G network kernel)."""

    data_bits: int = _spec(int, "AXI4-Stream data width of each link port", choices=(64, 128, 256, 512))
    latency_cycles: int = _spec(int, "link model: cycles from one card's port to the next's",
                                lo=1, hi=100000)
    gbits_per_s: float = _spec(float, "line rate of each link in Gb/s", lo=1.0, hi=1000.0)
    chunk_bytes: int = _spec(int, "collective message chunk (pipelining unit)", lo=64,
                             hi=1 << 20, pow2=True)


@dataclass(frozen=True)
class ApplianceConfig:
    """A whole appliance: N identical cards joined in a ring.

    Attributes
    ----------
    macs_per_cycle, weight_bytes_per_cycle, hbm_port_bytes_per_cycle,
    hbm_bytes_per_cycle, hbm_peak_gbytes_per_s, link_bytes_per_cycle,
    link_peak_gbytes_per_s:
        Derived figures; see each property.
    """

    name: str = _spec(str, "name of the build (used for output folders)")
    clock_mhz: float = _spec(float, "kernel clock in MHz", lo=10.0, hi=1000.0)
    cards: int = _spec(int, "cards in the appliance", lo=1, hi=16)
    topology: str = _spec(str, "how cards are joined", choices=("ring", "bidirectional_ring"))
    core: CoreConfig = _spec(CoreConfig, "compute core")
    hbm: HbmConfig = _spec(HbmConfig, "HBM channels")
    link: LinkConfig = _spec(LinkConfig, "ring links")

    def __post_init__(self):
        c = self.core
        macs = c.lanes * c.width * c.reuse
        if macs > DEVICE_DSPS:
            raise ConfigError(
                f"core.lanes x core.width x core.reuse: got {c.lanes} x {c.width} x {c.reuse} = "
                f"{macs:,} multipliers a cycle, one DSP each; allowed: at most {DEVICE_DSPS:,} "
                f"(the DSP slices of {DEVICE}), {macs - DEVICE_DSPS:,} too many")
        fifo_bits = c.weight_fifo_tiles * self.stripe_bytes * 8
        if fifo_bits > DEVICE_URAM_BITS:
            most = DEVICE_URAM_BITS // (self.stripe_bytes * 8)
            raise ConfigError(
                f"core.weight_fifo_tiles: got {c.weight_fifo_tiles:,} tiles of {self.stripe_bytes:,} "
                f"bytes = {fifo_bits / 8 / 2**20:.1f} MiB; allowed: at most {most:,} tiles (the "
                f"{DEVICE_URAM_BITS / 8 / 2**20:.2f} MiB of URAM of {DEVICE}), "
                f"{c.weight_fifo_tiles - most:,} too many")
        need, have = self.weight_bytes_per_cycle, self.hbm_port_bytes_per_cycle
        if need != have:
            raise ConfigError(
                f"core.lanes x core.width: got {self.core.lanes} x {self.core.width} "
                f"{self.core.weight_dtype} weights = {need} bytes/cycle; allowed: exactly what "
                f"hbm.channels x hbm.data_bits/8 = {self.hbm.channels} x {self.hbm.data_bits // 8}"
                f" = {have} bytes/cycle deliver (one weight tile is one stripe of all channels)")
        if self.core.weight_dtype == "int8" and self.core.reuse < 2:
            raise ConfigError(
                f"core.weight_dtype: got 'int8' with core.reuse {self.core.reuse}; allowed: int8 "
                f"with core.reuse >= 2 (an int8 tile's second lanes rows take the dot products "
                f"of the second token's lanes)")
        if self.core.cache_phases > 1 and self.core.weight_dtype != "int16":
            raise ConfigError(
                f"core.cache_phases: got {self.core.cache_phases} with core.weight_dtype "
                f"'{self.core.weight_dtype}'; allowed: 1 (only an int16 build aligns its cache "
                f"tiles in phases)")
        for key, of in (("cache_phases", "lanes"), ("vector_lanes", "lanes"),
                        ("special_share", "vector_lanes")):
            v, n = getattr(self.core, key), getattr(self.core, of)
            if n % v:
                raise ConfigError(f"core.{key}: got {v}; allowed: a divisor of core.{of} ({n})")
        seg = self.core.vsp_words // self.core.vsp_segments
        if seg < 4 * self.core.vector_lanes:
            raise ConfigError(
                f"core.vsp_segments: got {self.core.vsp_segments}; allowed: at most "
                f"core.vsp_words / (4 x core.vector_lanes) = "
                f"{self.core.vsp_words // (4 * self.core.vector_lanes)}")
        if self.core.xb_words < self.core.width:
            raise ConfigError(f"core.xb_words: got {self.core.xb_words}; allowed: at least "
                              f"core.width ({self.core.width})")
        # MATVEC addresses the VSP and XB by rows (hw/isa.py): 2^16 rows of each
        for key, words, row, what in (("vsp_words", c.vsp_words, c.vector_lanes, "core.vector_lanes"),
                                      ("xb_words", c.xb_words, c.width, "core.width")):
            most = row << MATVEC_ROW_BITS
            if words > most:
                raise ConfigError(
                    f"core.{key}: got {words:,}; allowed with {what} = {row}: at most {most:,} "
                    f"(MATVEC's {MATVEC_ROW_BITS}-bit row addresses of {row} words), "
                    f"{words - most:,} too many")
        # MATVEC's column blocks (hw/isa.py): the MLP's down projection (4 x d_model columns)
        # and a V cache (seq_len columns) are the widest matrices a build's programs stream
        lim, most = c.limits, (1 << MATVEC_CB_BITS) - 1
        cols = max(4 * lim.d_model, lim.seq_len)
        if -(-cols // c.width) > most:
            least = 1 << (-(-cols // most) - 1).bit_length()
            raise ConfigError(
                f"core.width: got {c.width} with core.limits.d_model {lim.d_model} and seq_len "
                f"{lim.seq_len}; allowed: at least {least} (the widest matrix, "
                f"{cols:,} columns, in at most {most:,} of MATVEC's column blocks), or smaller "
                f"limits")
        self._check_ring()

    def _check_ring(self):
        """What the ring node (every config emits one) and a ring card's collective unit need
        of the link (hw/ring.py, hw/core/coll.py), checked before the hardware is built."""
        D, hb, C = self.link.data_bits, self.hbm.data_bits, self.hbm.channels
        if D < MIN_LINK_BITS:
            raise ConfigError(f"link.data_bits: got {D}; allowed: at least {MIN_LINK_BITS} (the "
                              f"collective node's frame trailer is 128 bits of a beat)")
        if not self.ring_links:
            return
        if D < MIN_RING_LINK_BITS:
            raise ConfigError(f"link.data_bits: got {D}; allowed with cards > 1: at least "
                              f"{MIN_RING_LINK_BITS} (the collective unit's geometry holds "
                              f"ceil((2^24 - 1) / (link.data_bits / 32)) beats in 22 bits)")
        B, P = D // 32, self.core.vector_lanes
        if B % P:
            raise ConfigError(f"core.vector_lanes: got {P}; allowed with cards > 1: a divisor of "
                              f"link.data_bits / 32 = {B} (the collective unit moves a link beat "
                              f"as whole VSP rows)")
        per_row = C // (D // hb) if D % hb == 0 and C % (D // hb) == 0 else 0
        if per_row == 0 or per_row & (per_row - 1):
            raise ConfigError(f"link.data_bits: got {D}; allowed with cards > 1: a multiple of "
                              f"hbm.data_bits ({hb}) that makes a power of two of link beats per "
                              f"stripe row of hbm.channels = {C} (COLL on HBM)")

    # Derived figures -------------------------------------------------------------------
    @property
    def macs_per_cycle(self) -> int:
        """Multiply-accumulates per cycle of one card's matrix unit: a tile of lanes x width
        weights meeting ``core.reuse`` token vectors."""
        return self.core.lanes * self.core.width * self.core.reuse

    @property
    def weight_bytes_per_cycle(self) -> int:
        """Weight bytes the matrix unit consumes per cycle at full rate (a tile a cycle: lanes
        x width fp16 or int16, or 2 x lanes x width int8)."""
        return self.core.tile_rows * self.core.width * self.core.weight_bytes

    @property
    def hbm_beat_bytes(self) -> int:
        return self.hbm.data_bits // 8

    @property
    def hbm_port_bytes_per_cycle(self) -> int:
        """Bytes per cycle all channel ports can carry (one beat each per cycle)."""
        return self.hbm.channels * self.hbm_beat_bytes

    @property
    def hbm_channel_bytes_per_cycle(self) -> float:
        """One channel's deliverable bytes per cycle: the lesser of port width and HBM cap."""
        cap = self.hbm.gbytes_per_s * 1e9 / (self.clock_mhz * 1e6)
        return min(float(self.hbm_beat_bytes), cap)

    @property
    def hbm_bytes_per_cycle(self) -> float:
        """Peak HBM bytes per cycle over all channels (the roofline's denominator)."""
        return self.hbm.channels * self.hbm_channel_bytes_per_cycle

    @property
    def hbm_peak_gbytes_per_s(self) -> float:
        return self.hbm_bytes_per_cycle * self.clock_mhz * 1e6 / 1e9

    @property
    def link_bytes_per_cycle(self) -> float:
        """Peak payload bytes per cycle of one link: port width or line rate, the lesser."""
        line = self.link.gbits_per_s * 1e9 / 8 / (self.clock_mhz * 1e6)
        return min(self.link.data_bits / 8, line)

    @property
    def ring_links(self) -> bool:
        """Whether this config's card kernel has the ring links and collective unit (cards > 1).
        A ring-capable card also runs alone; a ``cards: 1`` card cannot join a ring."""
        return self.cards > 1

    @property
    def link_peak_gbytes_per_s(self) -> float:
        return self.link_bytes_per_cycle * self.clock_mhz * 1e6 / 1e9

    @property
    def hbm_addr_bits(self) -> int:
        """Byte-address bits needed inside one pseudo-channel."""
        return ceil_log2(self.hbm.channel_mbytes << 20)

    @property
    def stripe_bytes(self) -> int:
        """Bytes of one stripe row: one beat of every channel (= one weight tile)."""
        return self.hbm.channels * self.hbm_beat_bytes

    @property
    def channel_rows(self) -> int:
        """Stripe rows a pseudo-channel holds."""
        return (self.hbm.channel_mbytes << 20) // self.hbm_beat_bytes

    @property
    def reduce_max(self) -> int:
        """Longest vector a REDSUM/REDMAX takes: the model width, or the context rounded up to
        whole matrix-unit blocks (softmax runs over padded score vectors)."""
        lim, w = self.core.limits, self.core.width
        return max(lim.d_model, -(-lim.seq_len // w) * w)

    def derived(self) -> dict[str, Any]:
        return {
            "macs_per_cycle": self.macs_per_cycle,
            "weight_bytes_per_cycle": self.weight_bytes_per_cycle,
            "hbm_port_bytes_per_cycle": self.hbm_port_bytes_per_cycle,
            "hbm_bytes_per_cycle": round(self.hbm_bytes_per_cycle, 4),
            "hbm_peak_gbytes_per_s": round(self.hbm_peak_gbytes_per_s, 3),
            "link_bytes_per_cycle": round(self.link_bytes_per_cycle, 4),
            "link_peak_gbytes_per_s": round(self.link_peak_gbytes_per_s, 3),
            "peak_tflops_fp16": round(2 * self.macs_per_cycle * self.clock_mhz * 1e6 / 1e12, 4),
        }

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    def to_json(self) -> str:
        return json.dumps({**self.to_dict(), "derived": self.derived()}, indent=2, sort_keys=False)

    def replace(self, **changes) -> ApplianceConfig:
        """A copy with top-level or dotted fields changed, validated again.

        ``cfg.replace(cards=4, **{"hbm.latency_cycles": 100})``
        """
        d = self.to_dict()
        for key, value in changes.items():
            node = d
            *parents, leaf = key.split(".")
            for p in parents:
                node = node[p]
            node[leaf] = value
        return config_from_dict(d)


def ceil_log2(n: int) -> int:
    return max(0, (n - 1).bit_length())


def _type_name(value) -> str:
    if value is None:
        return "nothing"
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, int):
        return "an integer"
    if isinstance(value, float):
        return "a number"
    if isinstance(value, str):
        return "a string"
    if isinstance(value, dict):
        return "a mapping"
    if isinstance(value, list):
        return "a list"
    return type(value).__name__


def _build(cls, data, path: str):
    where = path or "config"
    if not isinstance(data, dict):
        raise ConfigError(f"{where}: got {_type_name(data)} {data!r}; allowed: a mapping of keys "
                          f"{', '.join(f.name for f in dataclasses.fields(cls))}")
    fields = {f.name: f for f in dataclasses.fields(cls)}
    for key in data:
        if key not in fields:
            close = difflib.get_close_matches(str(key), fields, n=1, cutoff=0.6)
            hint = f" (did you mean '{close[0]}'?)" if close else ""
            keypath = f"{path}.{key}" if path else str(key)
            raise ConfigError(f"{keypath}: unknown key{hint}; allowed keys here: "
                              f"{', '.join(fields)}")
    values = {}
    for name, f in fields.items():
        keypath = f"{path}.{name}" if path else name
        meta = f.metadata
        if name not in data:
            if f.default is not dataclasses.MISSING:
                values[name] = f.default
                continue
            raise ConfigError(f"{keypath}: missing; allowed: {_allowed(meta)} ({meta['doc']})")
        values[name] = _check(meta, data[name], keypath)
    return cls(**values)


def _check(meta, value, keypath):
    kind = meta["kind"]
    if dataclasses.is_dataclass(kind):
        return _build(kind, value, keypath)
    bad = f"{keypath}: got {_type_name(value)} {value!r}; allowed: {_allowed(meta)}"
    if kind is int:
        if isinstance(value, bool) or not isinstance(value, int):
            raise ConfigError(bad)
    elif kind is float:
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise ConfigError(bad)
        if not math.isfinite(value):
            raise ConfigError(bad)
        value = float(value)
    elif kind is str:
        if not isinstance(value, str) or not value:
            raise ConfigError(bad)
        if meta["choices"] is None and not all(c.isalnum() or c in "-_" for c in value):
            raise ConfigError(bad)
    if meta["choices"] is not None and value not in meta["choices"]:
        raise ConfigError(f"{keypath}: got {value!r}; allowed: {_allowed(meta)}")
    if meta["lo"] is not None and value < meta["lo"]:
        raise ConfigError(f"{keypath}: got {value!r}; allowed: {_allowed(meta)}")
    if meta["hi"] is not None and value > meta["hi"]:
        raise ConfigError(f"{keypath}: got {value!r}; allowed: {_allowed(meta)}")
    if meta["pow2"] and value & (value - 1):
        raise ConfigError(f"{keypath}: got {value!r}; allowed: {_allowed(meta)}")
    return value


def config_from_dict(data: dict) -> ApplianceConfig:
    return _build(ApplianceConfig, data, "")


def _yaml_load(text, path):
    """yaml.safe_load, refusing a key given twice in one mapping (PyYAML keeps the last value
    without a word): ConfigError naming the key path and both lines."""
    loader = yaml.SafeLoader(text)
    try:
        node = loader.get_single_node()
        if node is None:
            return None
        _unique_keys(node, (), path, set())
        return loader.construct_document(node)
    finally:
        loader.dispose()


def _unique_keys(node, keypath, path, seen_nodes):
    if id(node) in seen_nodes:            # an alias: checked where it was anchored
        return
    seen_nodes.add(id(node))
    if isinstance(node, yaml.MappingNode):
        first = {}
        for key, value in node.value:
            if isinstance(key, yaml.ScalarNode) and key.tag != "tag:yaml.org,2002:merge":
                line = key.start_mark.line + 1
                if key.value in first:
                    where = ".".join((*keypath, key.value))
                    raise ConfigError(f"{path}: line {line}: {where}: given twice (first at line "
                                      f"{first[key.value]}); allowed: each key once")
                first[key.value] = line
                _unique_keys(value, (*keypath, key.value), path, seen_nodes)
            else:
                _unique_keys(value, keypath, path, seen_nodes)
    elif isinstance(node, yaml.SequenceNode):
        for i, item in enumerate(node.value):
            _unique_keys(item, (*keypath, f"[{i}]"), path, seen_nodes)


def load_config(path: str | Path) -> ApplianceConfig:
    """Load and validate a YAML config. Raises ConfigError with a one-line message."""
    path = Path(path)
    try:
        text = path.read_text()
    except OSError as e:
        raise ConfigError(f"{path}: cannot read config ({e.strerror or e})") from None
    except UnicodeDecodeError as e:
        raise ConfigError(f"{path}: not a text file (byte {e.start} is not UTF-8); allowed: a YAML "
                          f"config") from None
    try:
        data = _yaml_load(text, path)
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        where = f" line {mark.line + 1}" if mark is not None else ""
        problem = getattr(e, "problem", None) or "syntax error"
        raise ConfigError(f"{path}:{where}: not valid YAML ({problem})") from None
    try:
        return config_from_dict(data)
    except ConfigError as e:
        raise ConfigError(f"{path}: {e}") from None


def schema_rows():
    """(key path, allowed, doc) for every config key, for docs/configs.md."""
    rows = []

    def walk(cls, prefix):
        for f in dataclasses.fields(cls):
            kp = f"{prefix}.{f.name}" if prefix else f.name
            if dataclasses.is_dataclass(f.metadata["kind"]):
                walk(f.metadata["kind"], kp)
            else:
                allowed = _allowed(f.metadata)
                if f.default is not dataclasses.MISSING:
                    allowed += f"; optional, default {f.default}"
                rows.append((kp, allowed, f.metadata["doc"]))

    walk(ApplianceConfig, "")
    return rows
