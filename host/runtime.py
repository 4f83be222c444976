"""The generation loop: prefill, decode, greedy or sampled, on a card behind the Device
interface (the numpy ISS, the Verilated card, or a U280 through XRT).

Prefill runs the prompt in steps of as many tokens as the card's buffers hold (the compiled
model's T); decode runs one token per step with the KV cache in HBM. Every step is one
program: load it, start, wait with a timeout, read the counters and the last position's
logits.
"""

import math
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from hw.ring import MAX_CARDS

from .errors import CardError, UserError
from .model import FP16_MAX
from .progress import quiet

__all__ = ["Sampling", "GenStats", "Generation", "generate", "check_request", "check_backend",
           "check_timeout", "make_device", "make_cards", "Cards", "DEMO_MODEL", "BACKENDS"]

DEMO_MODEL = Path(__file__).resolve().parent / "demo"
BACKENDS = ("iss", "rtl", "xrt")
MAX_TIMEOUT_S = 7 * 24 * 3600         # a step of GPT-2 1.5B on the Verilated card takes minutes


@dataclass(frozen=True)
class Sampling:
    """Greedy when temperature is 0; else softmax(logits / T) over the top_k (0: all)."""
    temperature: float = 0.0
    top_k: int = 0
    seed: int = 0

    def check(self, vocab):
        """One-line errors for values the sampler cannot use (named by their CLI flags)."""
        t, k, seed = self.temperature, self.top_k, self.seed
        if isinstance(t, bool) or not isinstance(t, int | float) or not math.isfinite(t) or t < 0:
            raise UserError(f"--temperature: got {t!r}; allowed: 0 (greedy) or a finite number above 0")
        if isinstance(k, bool) or not isinstance(k, int) or not 0 <= k <= vocab:
            raise UserError(f"--top-k: got {k!r}; allowed: 0 (all) .. {vocab} (the vocabulary)")
        if k and not t:
            raise UserError(f"--top-k: got {k} with greedy decoding; allowed: with --temperature "
                            f"above 0 (greedy decoding takes the most likely token)")
        if isinstance(seed, bool) or not isinstance(seed, int) or not 0 <= seed < 1 << 64:
            raise UserError(f"--seed: got {seed!r}; allowed: an integer in 0..2**64-1")


@dataclass
class GenStats:
    prompt_tokens: int = 0
    prefill_steps: list = field(default_factory=list)      # counters of each prefill step
    decode_steps: list = field(default_factory=list)       # counters of each decode step
    wall_prefill: float = 0.0
    wall_decode: float = 0.0
    cards: int = 1                                          # counters are summed over the cards
    cycles_measured: bool = True                            # False on the ISS: it counts no cycles

    def summary(self, cfg):
        """The figures of a run. Cycle figures (and the milliseconds and HBM utilization derived
        from them) come from the cards' cycle counters; they are None where nothing counted
        them (the ISS counts bytes, not cycles) or nothing ran (no decode step after a
        one-token generation)."""
        peak = cfg.hbm_bytes_per_cycle * self.cards         # every card's HBM
        pre = sum(c["cycles"] for c in self.prefill_steps)
        dec = [c["cycles"] for c in self.decode_steps]
        ntok = sum(c.get("step_tokens", 1) for c in self.decode_steps)     # (a batch: several a step)
        dec_bytes = [c["hbm_rd_bytes"] + c["hbm_wr_bytes"] for c in self.decode_steps]
        link = [c["link_tx_bytes"] for c in self.decode_steps]
        n = ntok
        clock = cfg.clock_mhz * 1e3                          # cycles per ms
        cyc = sum(dec) / n if n else None                    # per token (a batch: of all streams)
        measured = self.cycles_measured
        pre_tok = pre / self.prompt_tokens if self.prompt_tokens else None
        return {
            "cards": self.cards,
            "prompt_tokens": self.prompt_tokens,
            "prefill_cycles": int(pre) if measured else None,
            "prefill_cycles_per_token": round(pre_tok, 1) if measured and pre_tok is not None else None,
            "decode_tokens": n,
            "decode_steps": len(dec),
            "decode_cycles_per_token": round(cyc, 1) if measured and n else None,
            "decode_cycles_per_step": round(sum(dec) / len(dec), 1) if measured and dec else None,
            "hbm_bytes_per_token": round(sum(dec_bytes) / n, 1) if n else None,
            "link_bytes_per_token": round(sum(link) / n, 1) if n else None,
            "clock_mhz": cfg.clock_mhz,
            "decode_ms_per_token_at_clock": round(cyc / clock, 4) if measured and n else None,
            "prefill_ms_per_token_at_clock": (round(pre_tok / clock, 4) if measured and pre_tok
                                              else None),
            "hbm_utilization_decode": (round(sum(dec_bytes) / (sum(dec) * peak), 4)
                                       if measured and sum(dec) else None),
            "wall_seconds_prefill": round(self.wall_prefill, 3),
            "wall_seconds_per_decode_token": round(self.wall_decode / n, 3) if n else None,
        }


def check_timeout(timeout_s, flag="--timeout"):
    """A step's wall-clock timeout: a finite number of seconds above 0 (the host never waits
    forever)."""
    t = timeout_s
    if isinstance(t, bool) or not isinstance(t, int | float) or not math.isfinite(t) \
            or not 0 < t <= MAX_TIMEOUT_S:
        raise UserError(f"{flag}: got {t!r}; allowed: seconds above 0, at most {MAX_TIMEOUT_S} "
                        f"(a week)")
    return float(t)


def check_backend(cfg, backend, cards, *, xclbin=None):
    """One-line errors, before any work, for a backend, card count and xclbin that cannot go
    together: --xclbin only with xrt (and there required, an existing file, pyxrt importable,
    one card); several Verilated cards only where the config's card kernel has ring links."""
    if backend not in BACKENDS:
        raise UserError(f"--backend: got {backend!r}; allowed: {', '.join(BACKENDS)}")
    if isinstance(cards, bool) or not isinstance(cards, int) or not 1 <= cards <= MAX_CARDS:
        raise UserError(f"--cards: got {cards!r}; allowed: 1..{MAX_CARDS}")
    if backend != "xrt" and xclbin is not None:
        raise UserError(f"--xclbin: given with --backend {backend}; allowed: only with --backend xrt "
                        f"(the {backend} backend loads no xclbin)")
    if backend == "xrt":
        from .xrt import check_xrt
        check_xrt(xclbin)
        if cards != 1:
            raise UserError(f"--cards: {cards} cards on --backend xrt: not yet (the XRT path drives "
                            f"one card); allowed: 1, or several cards on --backend iss and rtl")
    if backend == "rtl" and cards > 1 and not cfg.ring_links:
        raise UserError(f"--cards: {cards} cards on --backend rtl with config {cfg.name!r}: its card "
                        f"kernel has no ring links (cards: 1 in the config); allowed: 1, or a "
                        f"config with cards >= 2")


def make_device(cfg, backend, *, xclbin=None, lib=None):
    if backend == "iss":
        from sim.ref.iss import IssDevice
        return IssDevice(cfg)
    if backend == "rtl":
        from sim.system import RtlDevice
        return RtlDevice(cfg, lib=lib)
    if backend == "xrt":
        from .xrt import XrtDevice
        return XrtDevice(cfg, xclbin=xclbin)
    raise UserError(f"--backend: got {backend!r}; allowed: {', '.join(BACKENDS)}")


class Cards:
    """A model compiled for N cards (one CompiledModel per card) on their devices: one card
    alone, or a ring (``ring``: the ISS's IssRing or the Verilated RtlAppliance) whose COLLs
    join them. ``cycles_measured``: whether the devices count cycles (the ISS does not)."""

    def __init__(self, cms, devices, ring=None, *, cycles_measured=True):
        self.cms, self.devices, self.ring = list(cms), list(devices), ring
        self.T = self.cms[0].T
        self.cycles_measured = cycles_measured

    def load(self):
        for cm, dev in zip(self.cms, self.devices, strict=True):
            cm.load(dev)

    def step(self, tokens, pos0, timeout_s, stream=0):
        """One step of stream ``stream`` on every card; returns the counters summed over the
        cards (cycles: the slowest card's)."""
        from .compiler.tune import step_programs
        return self.run(step_programs(self.cms, tokens, pos0, stream), pos0, timeout_s)

    def prefill(self, ids, timeout_s, stats, progress, what, stream=0):
        """A prompt's prefill in steps of T tokens (stream ``stream``), each step's counters
        appended to ``stats.prefill_steps``, ``progress`` told each step (``what``)."""
        from .compiler.tune import untuned
        for p in range(0, len(ids), self.T):
            chunk = ids[p:p + self.T]
            progress.note(f"{what}, positions {p}..{p + len(chunk) - 1} of {len(ids)}")
            if untuned(self.cms, len(chunk)):
                progress.note(f"{what}: ordering a step of {len(chunk)} tokens by the "
                              f"performance model (once a step size)")
            stats.prefill_steps.append(self.step(chunk, p, timeout_s, stream=stream))
            progress.advance()

    def step_batch(self, batch, timeout_s):
        """One decode step of several streams, ``batch`` = [(token, position, stream)]
        (CompiledModel.step_batch); the counters as ``step``'s."""
        return self.run([cm.step_batch(batch) for cm in self.cms], max(p for _, p, _ in batch),
                        timeout_s)

    def run(self, progs, pos0, timeout_s):
        """Run one program per card (``progs``, in card order) together, the step at ``pos0``
        (for the messages); the counters as ``step``'s, a CardError if a card stops with an
        error or does not finish within ``timeout_s``."""
        from .device import DeviceError, DeviceTimeout, status_name
        try:
            if self.ring is None:
                counters = [self.devices[0].run(progs[0], self.cms[0].prog_addr, timeout_s=timeout_s)]
            else:
                self.ring.run(progs, [cm.prog_addr for cm in self.cms], timeout_s=timeout_s)
                counters = [dev.counters() for dev in self.devices]
        except DeviceTimeout as e:
            late = getattr(e, "cards", None) or range(len(self.devices))
            who = (f"card {late[0]}" if len(late) == 1
                   else "cards " + ", ".join(str(k) for k in late))
            raise CardError(f"device: {who}: the step at position {pos0} did not finish within "
                            f"{timeout_s:g} s (--timeout)") from None
        except DeviceError as e:
            raise CardError(f"device: {e}") from None
        for k, c in enumerate(counters):
            if c["status"] & 0xFF:
                raise CardError(f"device: card {k}: the step at position {pos0} stopped with status "
                                f"{status_name(c['status'])} (pc {c['status'] >> 8})")
        total = {k: sum(c[k] for c in counters) for k in counters[0]}
        total["cycles"] = max(c["cycles"] for c in counters)
        return total

    def logits(self):
        """The last position's logits over the whole vocabulary (each card holds a slice)."""
        return np.concatenate([cm.read_logits(dev, 1)[-1] for cm, dev in zip(self.cms, self.devices,
                                                                            strict=True)])

    def batch_logits(self, B):
        """A batched step's logits, [B, the whole vocabulary]."""
        return np.concatenate([cm.read_batch_logits(dev, B) for cm, dev in zip(self.cms, self.devices,
                                                                               strict=True)], axis=1)


def compile_model(cfg, model, cards, *, flag="--model", streams=1):
    """One CompiledModel per card (for decode batches of up to ``streams`` streams). A matrix
    that leaves float16's range only once the LayerNorm gains are folded into it is a
    one-line error, not a numpy warning."""
    from .compiler import CompiledModel
    try:
        with np.errstate(over="raise"):
            return [CompiledModel(cfg, model, card=i, cards=cards, streams=streams) for i in range(cards)]
    except FloatingPointError:
        raise UserError(f"{flag}: a weight matrix leaves float16's range (|value| > {FP16_MAX:g}) once the "
                        f"LayerNorm gains before it are folded into it; allowed: weights whose "
                        f"products with those gains stay within float16 (the card holds float16)") \
            from None


def make_cards(cfg, model, backend, cards, *, xclbin=None, progress=None, streams=1):
    """Compile ``model`` for ``cards`` cards (and decode batches of up to ``streams``
    streams) and put it on the backend's devices."""
    check_backend(cfg, backend, cards, xclbin=xclbin)
    progress = progress or quiet()
    progress.note(f"compiling for {cards} card{'s' if cards > 1 else ''}")
    cms = compile_model(cfg, model, cards, streams=streams)
    measured = backend != "iss"
    lib = None
    if backend == "rtl":
        from sim.system import build_card
        progress.note("building the Verilated card (cached after the first build)")
        lib, _, _ = build_card(cfg)
    progress.note(f"starting the {backend} device{'s' if cards > 1 else ''}")
    if cards == 1:
        return Cards(cms, [make_device(cfg, backend, xclbin=xclbin, lib=lib)], cycles_measured=measured)
    if backend == "rtl":
        from sim.system import RtlAppliance
        ring = RtlAppliance(cfg, cards, lib=lib)
        return Cards(cms, ring.devices, ring, cycles_measured=measured)
    from sim.ref.ring import IssRing
    ring = IssRing(cfg, cards)
    return Cards(cms, ring.devices, ring, cycles_measured=measured)


def pick(logits, sampling, rng):
    """The next token: greedy with temperature 0, else drawn from softmax(logits / T) over the
    top_k (in float64, the largest subtracted). A temperature so small that logits / T
    overflows is the greedy limit of that softmax: the most likely token."""
    if sampling.temperature == 0:
        return int(np.argmax(logits))
    x = np.asarray(logits, np.float64)
    with np.errstate(over="ignore"):
        z = x / sampling.temperature
        if np.isfinite(x).all() and not np.isfinite(z).all():
            return int(np.argmax(x))
        if sampling.top_k:
            cut = np.partition(z, -sampling.top_k)[-sampling.top_k]
            z = np.where(z >= cut, z, -np.inf)
        p = np.exp(z - z.max())
    p /= p.sum()
    return int(rng.choice(len(p), p=p))


def _eos_set(eos):
    if eos is None:
        return frozenset()
    if isinstance(eos, int | np.integer):
        return frozenset([int(eos)])
    return frozenset(int(e) for e in eos)


class Generation:
    """One generation, token by token: iterate to run it (each item a token id, yielded as
    soon as it is chosen); afterwards ``tokens``, ``logits`` (with ``keep_logits``) and
    ``stats`` hold the result. The request is checked when the object is made, before any
    work. ``progress`` (host.progress.Progress) is told each step."""

    def __init__(self, cfg, cards, prompt_ids, max_new_tokens, *, sampling=Sampling(), eos=None,
                 timeout_s=600.0, keep_logits=False, progress=None, prompt_flag="--prompt-ids"):
        check_request(cards.cms[0].sh, prompt_ids, max_new_tokens, prompt_flag=prompt_flag)
        sampling.check(cards.cms[0].sh.vocab)
        self.cfg, self.cards = cfg, cards
        self.prompt_ids, self.max_new_tokens = list(prompt_ids), max_new_tokens
        self.sampling, self.eos = sampling, _eos_set(eos)
        self.timeout_s = check_timeout(timeout_s)
        self.keep_logits = keep_logits
        self.progress = progress or quiet()
        self.tokens, self.logits = [], None
        self.stats = GenStats(prompt_tokens=len(prompt_ids), cards=len(cards.cms),
                              cycles_measured=cards.cycles_measured)
        self._started = False

    def __iter__(self):
        if self._started:
            raise RuntimeError("a Generation runs once")
        self._started = True
        return self._run()

    def _run(self):
        cards, stats, ids, pr = self.cards, self.stats, self.prompt_ids, self.progress
        rng = np.random.default_rng(self.sampling.seed)
        pr.note("loading the HBM images")
        cards.load()
        t0 = time.monotonic()
        cards.prefill(ids, self.timeout_s, stats, pr, "prefill")
        stats.wall_prefill = time.monotonic() - t0
        logits = cards.logits()
        all_logits = []
        pos = len(ids)
        t0 = time.monotonic()
        while True:
            if self.keep_logits:
                all_logits.append(np.array(logits, np.float32))
            tok = pick(logits, self.sampling, rng)
            self.tokens.append(tok)
            pr.advance(detail=f"decode, {len(self.tokens)} of {self.max_new_tokens} tokens")
            yield tok
            if len(self.tokens) >= self.max_new_tokens or tok in self.eos:
                break
            stats.decode_steps.append(cards.step([tok], pos, self.timeout_s))
            logits = cards.logits()
            pos += 1
        stats.wall_decode = time.monotonic() - t0
        self.logits = np.stack(all_logits) if self.keep_logits else None

    def steps(self):
        """Steps the generation takes at most: prefill steps and new tokens (for a progress
        display)."""
        return -(-len(self.prompt_ids) // self.cards.T) + self.max_new_tokens


class BatchGeneration:
    """Several prompts, decoded together (batched decode): each prompt's prefill runs alone,
    in its own stream (its own K/V caches), then every decode step takes the next token of
    each stream still going (CompiledModel.step_batch), so that the weights stream once for
    all of them. Each stream's tokens and logits are bit-identical to its prompt's own
    ``Generation`` (with the same sampling: each stream draws from its own generator seeded
    with ``sampling.seed``). Iterate to run it (each item a (stream, token id)); afterwards
    ``tokens`` and ``logits`` hold a list per stream and ``stats`` the batch's figures (its
    decode steps' ``step_tokens``: the streams each took)."""

    def __init__(self, cfg, cards, prompts, max_new_tokens, *, sampling=Sampling(), eos=None,
                 timeout_s=600.0, keep_logits=False, progress=None, prompt_flag="--prompt-ids"):
        sh = cards.cms[0].sh
        most = cards.cms[0].streams
        if not 1 <= len(prompts) <= most:
            raise UserError(f"{prompt_flag}: {len(prompts)} prompts; allowed: 1 to {most} decoded "
                            f"together (the model compiled for {most} streams; the build's "
                            f"core.limits.streams = {cards.cms[0].cfg.core.limits.streams})")
        for k, ids in enumerate(prompts):
            check_request(sh, ids, max_new_tokens,
                          prompt_flag=prompt_flag if len(prompts) == 1 else f"{prompt_flag} (prompt {k + 1})")
        sampling.check(sh.vocab)
        self.cfg, self.cards = cfg, cards
        self.prompts, self.max_new_tokens = [list(p) for p in prompts], max_new_tokens
        self.sampling, self.eos = sampling, _eos_set(eos)
        self.timeout_s = check_timeout(timeout_s)
        self.keep_logits = keep_logits
        self.progress = progress or quiet()
        B = len(prompts)
        self.tokens, self.logits = [[] for _ in range(B)], [None] * B
        self.stats = GenStats(prompt_tokens=sum(len(p) for p in prompts), cards=len(cards.cms),
                              cycles_measured=cards.cycles_measured)
        self._started = False

    def __iter__(self):
        if self._started:
            raise RuntimeError("a BatchGeneration runs once")
        self._started = True
        return self._run()

    def _run(self):
        cards, stats, pr, B = self.cards, self.stats, self.progress, len(self.prompts)
        rngs = [np.random.default_rng(self.sampling.seed) for _ in range(B)]
        kept = [[] for _ in range(B)]
        pr.note("loading the HBM images")
        cards.load()
        t0 = time.monotonic()
        logits = []
        for s, ids in enumerate(self.prompts):
            cards.prefill(ids, self.timeout_s, stats, pr, f"prefill of prompt {s + 1}", stream=s)
            logits.append(cards.logits())
        stats.wall_prefill = time.monotonic() - t0
        pos = [len(ids) for ids in self.prompts]
        live = list(range(B))
        t0 = time.monotonic()
        while True:
            going = []
            for s, lg in zip(live, logits, strict=True):
                if self.keep_logits:
                    kept[s].append(np.array(lg, np.float32))
                tok = pick(lg, self.sampling, rngs[s])
                self.tokens[s].append(tok)
                yield s, tok
                if len(self.tokens[s]) < self.max_new_tokens and tok not in self.eos:
                    going.append(s)
            pr.advance(detail=f"decode, {sum(map(len, self.tokens))} tokens of {B} streams")
            if not going:
                break
            c = cards.step_batch([(self.tokens[s][-1], pos[s], s) for s in going], self.timeout_s)
            c["step_tokens"] = len(going)
            stats.decode_steps.append(c)
            logits = list(cards.batch_logits(len(going)))
            for s in going:
                pos[s] += 1
            live = going
        stats.wall_decode = time.monotonic() - t0
        if self.keep_logits:
            self.logits = [np.stack(k) for k in kept]

    def steps(self):
        """Steps the generation takes at most (for a progress display)."""
        return sum(-(-len(p) // self.cards.T) for p in self.prompts) + self.max_new_tokens


def generate(cfg, cm, dev, prompt_ids, max_new_tokens, *, sampling=Sampling(), eos=None,
             timeout_s=600.0, on_token=None, keep_logits=False, progress=None):
    """Generate up to ``max_new_tokens`` after ``prompt_ids``; returns (ids, logits, stats).

    ``cm`` and ``dev``: one CompiledModel and its device, or ``cm`` a Cards (``dev`` None).
    ``on_token(id)`` is called as each token is chosen. Stops early at ``eos`` (an id or a
    collection of ids).
    """
    cards = cm if isinstance(cm, Cards) else Cards([cm], [dev])
    g = Generation(cfg, cards, prompt_ids, max_new_tokens, sampling=sampling, eos=eos,
                   timeout_s=timeout_s, keep_logits=keep_logits, progress=progress)
    for tok in g:
        if on_token:
            on_token(tok)
    return g.tokens, g.logits, g.stats


def check_request(sh, prompt_ids, max_new_tokens, *, prompt_flag="--prompt-ids"):
    """One-line errors for a prompt and a token budget the model cannot take. ``prompt_flag``
    names where the prompt came from (--prompt as text, --prompt-ids as ids)."""
    n = max_new_tokens
    if isinstance(n, bool) or not isinstance(n, int) or n < 1:
        raise UserError(f"--new-tokens: got {n!r}; allowed: at least 1")
    if not prompt_ids:
        raise UserError(f"{prompt_flag}: empty; allowed: at least one token")
    bad = [t for t in prompt_ids if isinstance(t, bool) or not isinstance(t, int | np.integer)
           or not 0 <= t < sh.vocab]
    if bad:
        raise UserError(f"{prompt_flag}: {bad[0]!r} is outside the vocabulary; allowed: ids in "
                        f"0..{sh.vocab - 1}")
    total = len(prompt_ids) + n - 1
    if len(prompt_ids) > sh.n_positions:
        raise UserError(f"{prompt_flag}: {len(prompt_ids)} tokens; the model's context is "
                        f"{sh.n_positions} positions")
    if total > sh.n_positions:
        raise UserError(f"--new-tokens: {n} after a {len(prompt_ids)}-token prompt "
                        f"needs {total} positions; the model's context is {sh.n_positions} "
                        f"(at most {sh.n_positions - len(prompt_ids) + 1} new tokens)")
