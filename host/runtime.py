"""The generation loop: prefill, decode, greedy or sampled, on a card behind the Device
interface (the numpy ISS, the Verilated card, or a U280 through XRT).

Prefill runs the prompt in steps of as many tokens as the card's buffers hold (the compiled
model's T); decode runs one token per step with the KV cache in HBM. Every step is one
program: load it, start, wait with a timeout, read the counters and the last position's
logits.
"""

import json
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from .errors import UserError

__all__ = ["Sampling", "GenStats", "generate", "check_request", "make_device", "make_cards", "Cards",
           "eos_id", "DEMO_MODEL"]

DEMO_MODEL = Path(__file__).resolve().parent / "demo"


@dataclass(frozen=True)
class Sampling:
    """Greedy when temperature is 0; else softmax(logits / T) over the top_k (0: all)."""
    temperature: float = 0.0
    top_k: int = 0
    seed: int = 0

    def check(self, vocab):
        if self.temperature < 0:
            raise UserError(f"--temperature: got {self.temperature}; allowed: 0 (greedy) or more")
        if not 0 <= self.top_k <= vocab:
            raise UserError(f"--top-k: got {self.top_k}; allowed: 0 (all) .. {vocab} (the vocabulary)")


@dataclass
class GenStats:
    prompt_tokens: int = 0
    prefill_steps: list = field(default_factory=list)      # counters of each prefill step
    decode_steps: list = field(default_factory=list)       # counters of each decode step
    wall_prefill: float = 0.0
    wall_decode: float = 0.0
    cards: int = 1                                          # counters are summed over the cards

    def summary(self, cfg):
        peak = cfg.hbm_bytes_per_cycle * self.cards         # every card's HBM
        pre = sum(c["cycles"] for c in self.prefill_steps)
        dec = [c["cycles"] for c in self.decode_steps]
        dec_bytes = [c["hbm_rd_bytes"] + c["hbm_wr_bytes"] for c in self.decode_steps]
        link = [c["link_tx_bytes"] for c in self.decode_steps]
        n = max(1, len(dec))
        cyc = sum(dec) / n
        out = {
            "cards": self.cards,
            "prompt_tokens": self.prompt_tokens,
            "prefill_cycles": int(pre),
            "prefill_cycles_per_token": round(pre / max(1, self.prompt_tokens), 1),
            "decode_tokens": len(dec),
            "decode_cycles_per_token": round(cyc, 1),
            "hbm_bytes_per_token": round(sum(dec_bytes) / n, 1),
            "link_bytes_per_token": round(sum(link) / n, 1),
            "clock_mhz": cfg.clock_mhz,
            "decode_ms_per_token_at_clock": round(cyc / (cfg.clock_mhz * 1e3), 4) if dec else None,
            "prefill_ms_per_token_at_clock": (round(pre / self.prompt_tokens / (cfg.clock_mhz * 1e3), 4)
                                              if pre else None),
            "hbm_utilization_decode": (round(sum(dec_bytes) / (sum(dec) * peak), 4) if sum(dec) else None),
            "wall_seconds_prefill": round(self.wall_prefill, 3),
            "wall_seconds_per_decode_token": round(self.wall_decode / n, 3),
        }
        return out


def make_device(cfg, backend, *, xclbin=None):
    if backend == "iss":
        from sim.ref.iss import IssDevice
        return IssDevice(cfg)
    if backend == "rtl":
        from sim.system import RtlDevice
        return RtlDevice(cfg)
    if backend == "xrt":
        from .xrt import XrtDevice
        return XrtDevice(cfg, xclbin=xclbin)
    raise UserError(f"--backend: got {backend!r}; allowed: iss, rtl, xrt")


def eos_id(model_dir):
    try:
        c = json.loads((Path(model_dir) / "config.json").read_text())
    except (OSError, json.JSONDecodeError):
        return None
    v = c.get("eos_token_id")
    return int(v) if isinstance(v, int) else None


class Cards:
    """A model compiled for N cards (one CompiledModel per card) on their devices: one card
    alone, or a ring (``ring``: the ISS's IssRing or the Verilated RtlAppliance) whose COLLs
    join them."""

    def __init__(self, cms, devices, ring=None):
        self.cms, self.devices, self.ring = list(cms), list(devices), ring
        self.T = self.cms[0].T

    def load(self):
        for cm, dev in zip(self.cms, self.devices, strict=True):
            cm.load(dev)

    def step(self, tokens, pos0, timeout_s):
        """One step on every card; returns the counters summed over the cards (cycles: the
        slowest card's)."""
        from .device import DeviceError, DeviceTimeout, status_name
        progs = [cm.step(tokens, pos0) for cm in self.cms]
        try:
            if self.ring is None:
                counters = [self.devices[0].run(progs[0], self.cms[0].prog_addr, timeout_s=timeout_s)]
            else:
                self.ring.run(progs, [cm.prog_addr for cm in self.cms], timeout_s=timeout_s)
                counters = [dev.counters() for dev in self.devices]
        except DeviceTimeout:
            raise UserError(f"device: the step at position {pos0} did not finish within "
                            f"{timeout_s:g} s (--timeout)") from None
        except DeviceError as e:
            raise UserError(f"device: {e}") from None
        for k, c in enumerate(counters):
            if c["status"] & 0xFF:
                raise UserError(f"device: card {k}: the step at position {pos0} stopped with status "
                                f"{status_name(c['status'])} (pc {c['status'] >> 8})")
        total = {k: sum(c[k] for c in counters) for k in counters[0]}
        total["cycles"] = max(c["cycles"] for c in counters)
        return total

    def logits(self):
        """The last position's logits over the whole vocabulary (each card holds a slice)."""
        return np.concatenate([cm.read_logits(dev, 1)[-1] for cm, dev in zip(self.cms, self.devices,
                                                                            strict=True)])


def make_cards(cfg, model, backend, cards, *, xclbin=None):
    """Compile ``model`` for ``cards`` cards and put it on the backend's devices."""
    from .compiler import CompiledModel
    cms = [CompiledModel(cfg, model, card=i, cards=cards) for i in range(cards)]
    if cards == 1:
        return Cards(cms, [make_device(cfg, backend, xclbin=xclbin)])
    if backend == "rtl":
        if not cfg.ring_links:
            raise UserError(f"--cards: {cards} cards on --backend rtl with config {cfg.name!r}: its card "
                            f"kernel has no ring links (cards: 1 in the config); allowed: 1, or a "
                            f"config with cards >= 2")
        from sim.system import RtlAppliance
        ring = RtlAppliance(cfg, cards)
        return Cards(cms, ring.devices, ring)
    if backend != "iss":
        raise UserError(f"--cards: {cards} cards on --backend {backend}: not yet (the XRT path drives "
                        f"one card); several cards run on --backend iss and rtl")
    from sim.ref.ring import IssRing
    ring = IssRing(cfg, cards)
    return Cards(cms, ring.devices, ring)


def pick(logits, sampling, rng):
    if sampling.temperature == 0:
        return int(np.argmax(logits))
    z = np.asarray(logits, np.float64) / sampling.temperature
    if sampling.top_k:
        cut = np.partition(z, -sampling.top_k)[-sampling.top_k]
        z = np.where(z >= cut, z, -np.inf)
    p = np.exp(z - z.max())
    p /= p.sum()
    return int(rng.choice(len(p), p=p))


def generate(cfg, cm, dev, prompt_ids, max_new_tokens, *, sampling=Sampling(), eos=None,
             timeout_s=600.0, on_token=None, keep_logits=False):
    """Generate up to ``max_new_tokens`` after ``prompt_ids``; returns (ids, logits, stats).

    ``cm`` and ``dev``: one CompiledModel and its device, or ``cm`` a Cards (``dev`` None).
    ``on_token(id)`` is called as each token is chosen. Stops early at ``eos``.
    """
    cards = cm if isinstance(cm, Cards) else Cards([cm], [dev])
    check_request(cards.cms[0].sh, prompt_ids, max_new_tokens)
    rng = np.random.default_rng(sampling.seed)
    stats = GenStats(prompt_tokens=len(prompt_ids), cards=len(cards.cms))
    cards.load()
    t0 = time.monotonic()
    for p in range(0, len(prompt_ids), cards.T):
        stats.prefill_steps.append(cards.step(prompt_ids[p:p + cards.T], p, timeout_s))
    stats.wall_prefill = time.monotonic() - t0
    logits = cards.logits()
    out, all_logits = [], []
    pos = len(prompt_ids)
    t0 = time.monotonic()
    while True:
        if keep_logits:
            all_logits.append(np.array(logits, np.float32))
        tok = pick(logits, sampling, rng)
        out.append(tok)
        if on_token:
            on_token(tok)
        if len(out) >= max_new_tokens or (eos is not None and tok == eos):
            break
        stats.decode_steps.append(cards.step([tok], pos, timeout_s))
        logits = cards.logits()
        pos += 1
    stats.wall_decode = time.monotonic() - t0
    return out, (np.stack(all_logits) if keep_logits else None), stats


def check_request(sh, prompt_ids, max_new_tokens):
    """One-line errors for a prompt and a token budget the model cannot take."""
    if max_new_tokens < 1:
        raise UserError(f"--max-new-tokens: got {max_new_tokens}; allowed: at least 1")
    if not prompt_ids:
        raise UserError("--prompt: empty; give at least one token")
    bad = [t for t in prompt_ids if not 0 <= t < sh.vocab]
    if bad:
        raise UserError(f"--prompt-ids: {bad[0]} is outside the vocabulary (0..{sh.vocab - 1})")
    total = len(prompt_ids) + max_new_tokens - 1
    if len(prompt_ids) > sh.n_positions:
        raise UserError(f"--prompt: {len(prompt_ids)} tokens; the model's context is "
                        f"{sh.n_positions} positions")
    if total > sh.n_positions:
        raise UserError(f"--max-new-tokens: {max_new_tokens} after a {len(prompt_ids)}-token prompt "
                        f"needs {total} positions; the model's context is {sh.n_positions} "
                        f"(at most {sh.n_positions - len(prompt_ids) + 1} new tokens)")

