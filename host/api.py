"""The Python API of gptfpga: a GPT-2 on an appliance of N cards, and the performance model.

``import gptfpga`` gives :class:`Appliance` (load a config and a checkpoint, choose the
backend and the card count, generate or stream tokens, decode several prompts together,
read the statistics), :func:`perf`
(the performance model's projection of any GPT-2 size on N cards) and :class:`UserError`,
the one exception for a mistake in what was asked (its ``str()`` is one line naming the
argument, by its command-line flag, the value and what is allowed). The ``gptfpga`` command
is a layer over these calls.

Example (run from the repository's root; the ISS backend needs no Verilator build)::

    import gptfpga

    app = gptfpga.Appliance(config="configs/tiny.yaml", backend="iss", cards=2)
    result = app.generate(prompt="The machine wrote", new_tokens=16)
    print(result.text)
    print(result.stats["decode_cycles_per_token"])             # None: the ISS counts no cycles
    print(result.stats["modelled_decode_cycles_per_token"])    # the performance model's figure

    for token in app.stream(prompt_ids=[290, 303, 482], new_tokens=8, temperature=0.8, top_k=40, seed=1):
        print(token.text, end="", flush=True)
    print()

    batch = app.generate_batch(["The machine wrote", "Once upon a time"], new_tokens=8)
    print([r.text for r in batch.streams])                     # each as generate() gives it alone

    fig = gptfpga.perf(config="configs/u280x4.yaml", model_shape="gpt2-xl", cards=4,
                       prompt_tokens=32, new_tokens=32)
    print(fig["decode_ms_per_token"], "ms per token, projected")
"""

import functools
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from gen.config import ApplianceConfig, ConfigError, load_config
from hw.ring import MAX_CARDS

from .errors import CardError, UserError
from .progress import Progress, quiet

__all__ = ["Appliance", "Result", "BatchResult", "Stream", "Token", "perf", "UserError", "CardError",
           "DEFAULT_CONFIG"]

ROOT = Path(__file__).resolve().parent.parent
DEFAULT_CONFIG = ROOT / "configs" / "tiny.yaml"
MODELLED = "projected by the performance model (host/perf.py), not measured"


def _user_errors(fn):
    """A bad config (gen.config.ConfigError) leaves the API as a UserError, like every other
    mistake, so that callers catch one type."""
    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        try:
            return fn(*args, **kwargs)
        except ConfigError as e:
            raise UserError(str(e)) from None
    return wrapper


def _config(config, flag="--config"):
    if isinstance(config, ApplianceConfig):
        return config
    if config is None:
        return load_config(DEFAULT_CONFIG)
    if not isinstance(config, str | Path):
        raise UserError(f"{flag}: got {type(config).__name__}; allowed: a YAML file's path or an "
                        f"ApplianceConfig")
    return load_config(config)


def _progress(progress, what):
    """(progress object, whether this call owns it and must close it)."""
    if progress is None or progress is False:
        return quiet(), False
    if progress is True:
        return Progress(what), True
    return progress, False


@dataclass(frozen=True)
class Token:
    """One generated token: its id, and the text it adds to what was printed so far (empty
    while a multi-byte character is not complete yet; the last token flushes the rest)."""
    id: int
    text: str


@dataclass
class Result:
    """What a generation produced.

    Attributes
    ----------
    prompt_ids : list of int
        The prompt as token ids.
    tokens : list of int
        The generated ids (at most ``new_tokens``; fewer when the model's end-of-text id came).
    text : str
        The generated tokens as text (without the prompt); ``[id]`` per token when the model
        directory has no tokenizer.
    stats : dict
        The run's figures. Measured: ``prefill_cycles``, ``prefill_cycles_per_token``,
        ``decode_cycles_per_token``, their milliseconds at the config's clock and
        ``hbm_utilization_decode``, from the cards' cycle counters (None on the ISS, which
        counts no cycles); ``hbm_bytes_per_token`` and ``link_bytes_per_token`` (counted on
        every backend); ``wall_seconds_*`` (this machine). Modelled, for the same shape,
        cards and lengths: the ``modelled_*`` keys, from the performance model (never
        measured), with ``modelled_source`` saying so.
    logits : numpy.ndarray or None
        [tokens, vocabulary] float32 logits of every generated position, with
        ``keep_logits=True``.
    """
    prompt_ids: list
    tokens: list
    text: str
    stats: dict
    logits: np.ndarray | None = field(default=None, repr=False)

    def to_dict(self):
        """A JSON-ready dict: prompt_ids, tokens, text and the statistics (no logits), and
        ``streams``: this one stream's prompt_ids, tokens and text (as a batch gives them)."""
        own = {"prompt_ids": list(self.prompt_ids), "tokens": list(self.tokens), "text": self.text}
        return {**own, **self.stats, "streams": [own]}


@dataclass
class BatchResult:
    """What a batched generation (several prompts decoded together) produced.

    Attributes
    ----------
    streams : list of Result
        One per prompt, in the prompts' order: its prompt_ids, tokens, text and logits (with
        ``keep_logits``), each bit-identical to generating that prompt alone; its ``stats``
        are the batch's.
    stats : dict
        The batch's figures, as :class:`Result`'s: ``decode_tokens`` counts every stream's
        tokens, ``decode_steps`` the batched steps, ``decode_cycles_per_token`` is per token
        of all streams together and ``decode_cycles_per_step`` per step.
    """
    streams: list
    stats: dict

    def to_dict(self):
        """A JSON-ready dict: the statistics and ``streams``, one object per stream with its
        prompt_ids, tokens and text."""
        return {**self.stats, "streams": [{"prompt_ids": list(r.prompt_ids), "tokens": list(r.tokens),
                                           "text": r.text} for r in self.streams]}


class Stream:
    """Iterating yields :class:`Token` as each is chosen; afterwards ``result`` holds the
    :class:`Result` (None until the iteration has finished)."""

    def __init__(self, app, gen, prompt_ids, progress=None):
        self._app, self._gen, self._prompt_ids = app, gen, prompt_ids
        self._progress = progress            # closed at the end when the stream owns it
        self.result = None

    @property
    def steps(self):
        """Steps the cards run at most: the prefill steps and one per new token."""
        return self._gen.steps()

    def __iter__(self):
        tok, gen = self._app.tokenizer, self._gen
        printed = ""
        try:
            for t in gen:
                last = len(gen.tokens) >= gen.max_new_tokens or t in gen.eos
                text = tok.decode(gen.tokens)
                if text.endswith("\ufffd") and not last:      # a multi-byte character not finished
                    yield Token(t, "")
                    continue
                delta, printed = text[len(printed):], text
                yield Token(t, delta)
        finally:
            if self._progress is not None:
                self._progress.close()
        self.result = self._app._result(gen, self._prompt_ids)


class Appliance:
    """A GPT-2 on an appliance of ``cards`` cards of a config, on one backend.

    Everything given is checked when the object is made (the config, the backend, the card
    count, the xclbin, the timeout, the model's config.json and tokenizer, its shape against
    the build's core.limits and its heads against the card count, a given Gpt2's weights);
    a directory's weights are loaded and checked, compiled for the cards and put on the
    devices by :meth:`prepare`, which the first :meth:`generate` or :meth:`stream` calls
    after checking its own arguments.

    Parameters
    ----------
    config : str, pathlib.Path, ApplianceConfig or None
        The appliance config (YAML); None: ``configs/tiny.yaml``.
    model : str, pathlib.Path, host.model.Gpt2 or None
        A Hugging Face GPT-2 directory (config.json, model.safetensors or its shards, and a
        tokenizer for text prompts), a loaded :class:`host.model.Gpt2` with weights (prompts
        as ids; checked with ``Gpt2.check``), or None for the demo model in host/demo
        (vocabulary of 512 tokens).
    backend : {"iss", "rtl", "xrt"}
        The instruction-set simulator (bit-identical to the card, fast, counts no cycles),
        the Verilated card (cycle counters), or a U280 through XRT (one card; untested on
        a board).
    cards : int or None
        Cards the model is split over (1..16); None: the config's ``cards``.
    xclbin : str or pathlib.Path, optional
        The xclbin to load; with ``backend="xrt"`` only, and required there.
    timeout : float
        Wall-clock seconds one step (a program on the cards) may take; then CardError.
    progress : bool or host.progress.Progress
        Report compilation, builds and steps on stderr (True), through the given object, or
        not at all (False, the default).

    Raises
    ------
    UserError
        For anything that cannot be used; ``str()`` is one line naming the argument by its
        command-line flag (``--cards``), the value and what is allowed.
    CardError
        From ``generate`` and ``stream``: a card stopped with an error status, or a step did
        not finish within ``timeout``.
    """

    @_user_errors
    def __init__(self, config=None, model=None, *, backend="iss", cards=None, xclbin=None,
                 timeout=600.0, progress=False):
        from .compiler import check_limits
        from .compiler.partition import Partition
        from .model import Gpt2, load_shape
        from .runtime import DEMO_MODEL, check_backend, check_timeout
        from .tokenizer import _Ids, load_tokenizer
        self.config = _config(config)
        self.cards = self.config.cards if cards is None else cards
        self.backend = backend
        check_backend(self.config, backend, self.cards, xclbin=xclbin)
        self.xclbin = xclbin
        self.timeout = check_timeout(timeout)
        self._progress_arg = progress          # True: a Progress on stderr per job, closed after it
        self.progress = progress if isinstance(progress, Progress) else quiet()
        self._progress_now = None
        if isinstance(model, Gpt2):
            if model.weights is None:
                raise UserError("--model: a shapes-only host.model.Gpt2 (weights None); allowed: a "
                                "Gpt2 with weights (gptfpga.perf projects a shape without them)")
            self._model, self.model_dir = model, None
            self.shape = model.shape
            self.tokenizer = _Ids()
        else:
            if model is not None and not isinstance(model, str | Path):
                raise UserError(f"--model: got {type(model).__name__}; allowed: a GPT-2 directory, "
                                f"a host.model.Gpt2 or None (the demo model)")
            self.model_dir = Path(model) if model is not None else DEMO_MODEL
            if not self.model_dir.is_dir():
                raise UserError(f"--model: {self.model_dir} is not a directory (expected config.json "
                                f"and model.safetensors)")
            self._model = None
            self.shape = load_shape(self.model_dir / "config.json")
            self.tokenizer = load_tokenizer(self.model_dir)
        # the model against the build and the cards, before any tensor is loaded or checked
        check_limits(self.config, self.shape, "--model")
        Partition.of(self.shape, card=self.cards - 1, cards=self.cards, lanes=self.config.core.lanes)
        if self._model is not None:
            self._model.check("--model")
        self._cards = None

    # -- the model on the cards --------------------------------------------------------------
    @property
    def model(self):
        """The checked :class:`host.model.Gpt2` (loaded on first use)."""
        if self._model is None:
            from .model import load_checkpoint
            (self._progress_now or self.progress).note(f"loading {self.model_dir}")
            self._model = load_checkpoint(self.model_dir)
        return self._model

    @_user_errors
    def prepare(self, streams=1):
        """Load and check the weights, compile them for the cards (for batches of up to
        ``streams`` prompts: :meth:`generate_batch`), build the devices (the Verilated card is
        built once and cached) and return self. Called by the first generation; call it
        yourself to pay that cost up front. A later batch of more streams compiles again."""
        if self._cards is not None and self._cards.cms[0].streams < streams:
            self._cards = None
        if self._cards is None:
            from .runtime import make_cards
            p, own = _progress(self._progress_arg, f"gptfpga {self.backend}: preparing")
            p = p if own else self.progress
            try:
                self._progress_now = p
                model = self.model
                self._cards = make_cards(self.config, model, self.backend, self.cards,
                                         xclbin=self.xclbin, progress=p, streams=streams)
            finally:
                self._progress_now = None
                if own:
                    p.close()
        return self

    # -- generation ----------------------------------------------------------------------------
    @property
    def quant_error(self):
        """With int8 or int16 weights (``core.weight_dtype``), the quantization's relative error per
        weight row, |w - q scale| / |w|, over every card's matrices: (largest, mean); None with
        fp16 weights. Compiles the model if it is not yet."""
        from .compiler.image import quant_summary
        self.prepare()
        err = quant_summary([q for cm in self._cards.cms for q in cm.img.quant])
        return None if err is None else (round(err[0], 6), round(err[1], 6))

    def encode(self, prompt):
        """Token ids of a text prompt (UserError without a tokenizer)."""
        if not isinstance(prompt, str):
            raise UserError(f"--prompt: got {type(prompt).__name__}; allowed: text")
        return self.tokenizer.encode(prompt)

    def decode(self, ids):
        """Text of token ids (``[id]`` per token without a tokenizer)."""
        return self.tokenizer.decode(ids)

    def _request(self, prompt, prompt_ids, new_tokens, temperature, top_k, seed):
        """Checks a request without touching the cards: (ids, sampling, prompt flag)."""
        from .runtime import Sampling, check_request
        if (prompt is None) == (prompt_ids is None):
            raise UserError("--prompt: give the prompt as text (prompt) or as token ids "
                            "(prompt_ids), one of the two")
        if prompt_ids is not None:
            try:
                if isinstance(prompt_ids, str | bytes):
                    raise TypeError
                ids, flag = list(prompt_ids), "--prompt-ids"
            except TypeError:
                raise UserError(f"--prompt-ids: got {type(prompt_ids).__name__}; allowed: a sequence "
                                f"of token ids (a list of int)") from None
        else:
            ids, flag = self.encode(prompt), "--prompt"
        check_request(self.shape, ids, new_tokens, prompt_flag=flag)
        sampling = Sampling(temperature=temperature, top_k=0 if top_k is None else top_k, seed=seed)
        sampling.check(self.shape.vocab)
        return [int(i) for i in ids], Sampling(float(temperature), sampling.top_k, seed), flag

    @_user_errors
    def stream(self, prompt=None, *, prompt_ids=None, new_tokens=32, temperature=0.0, top_k=None,
               seed=0, keep_logits=False):
        """Generate token by token: a :class:`Stream` that yields :class:`Token` (id and new
        text) as each is chosen, and holds the :class:`Result` once iterated to the end.

        Parameters are those of :meth:`generate`. The request is checked here, before any
        work; the cards run while the stream is iterated.
        """
        from .runtime import Generation
        ids, sampling, flag = self._request(prompt, prompt_ids, new_tokens, temperature, top_k, seed)
        self.prepare()
        p, own = _progress(self._progress_arg, f"gptfpga {self.backend}")
        p = p if own else self.progress
        gen = Generation(self.config, self._cards, ids, new_tokens, sampling=sampling,
                         eos=self.model.eos_ids, timeout_s=self.timeout, keep_logits=keep_logits,
                         progress=p, prompt_flag=flag)
        if own:
            p.total = gen.steps()
        return Stream(self, gen, ids, p if own else None)

    @_user_errors
    def generate(self, prompt=None, *, prompt_ids=None, new_tokens=32, temperature=0.0, top_k=None,
                 seed=0, keep_logits=False):
        """Generate up to ``new_tokens`` tokens after a prompt; returns a :class:`Result`.

        Parameters
        ----------
        prompt : str, optional
            The prompt as text (needs the model's tokenizer).
        prompt_ids : sequence of int, optional
            The prompt as token ids, each below the vocabulary (0..511 for the demo model).
            Give ``prompt`` or ``prompt_ids``, not both.
        new_tokens : int
            Tokens to generate (at least 1; the prompt and these must fit the model's context).
            Generation stops early at the model's end-of-text id.
        temperature : float
            0: greedy (the most likely token); above 0: sample from softmax(logits / T).
        top_k : int or None
            With a temperature above 0: sample among the k most likely tokens; None: all.
        seed : int
            Seed of the sampler (0..2**64-1); the same seed gives the same tokens.
        keep_logits : bool
            Keep the logits of every generated position in ``Result.logits``.
        """
        s = self.stream(prompt, prompt_ids=prompt_ids, new_tokens=new_tokens, temperature=temperature,
                        top_k=top_k, seed=seed, keep_logits=keep_logits)
        for _ in s:
            pass
        return s.result

    @_user_errors
    def generate_batch(self, prompts=None, *, prompt_ids=None, new_tokens=32, temperature=0.0,
                       top_k=None, seed=0, keep_logits=False, on_token=None):
        """Several prompts decoded together (batched decode): each prompt's prefill alone,
        then one step a token for every stream still going, the weights streamed once for
        all. Returns a :class:`BatchResult`; each stream's tokens and logits are bit-identical
        to :meth:`generate` of its prompt alone (with the same sampling arguments).

        ``prompts``: texts, or ``prompt_ids``: sequences of token ids (one of the two), at
        most the build's ``core.limits.streams`` of them. The other parameters are
        :meth:`generate`'s, for every stream. ``on_token(stream, token id)`` is called as each
        token is chosen."""
        from .runtime import BatchGeneration
        given = prompts if prompt_ids is None else prompt_ids
        flag = "--prompt" if prompt_ids is None else "--prompt-ids"
        if (prompts is None) == (prompt_ids is None):
            raise UserError("--prompt: give the prompts as texts (prompts) or as token id sequences "
                            "(prompt_ids), one of the two")
        if isinstance(given, str | bytes) or not hasattr(given, "__len__") or len(given) == 0:
            raise UserError(f"{flag}: got {type(given).__name__}; allowed: a non-empty list of "
                            f"prompts (texts, or sequences of token ids)")
        most = self.config.core.limits.streams
        if len(given) > most:
            raise UserError(f"{flag}: {len(given)} prompts; allowed: at most {most} decoded together "
                            f"on this build (core.limits.streams)")
        reqs = [self._request(*((None, g) if prompt_ids is not None else (g, None)), new_tokens,
                              temperature, top_k, seed) for g in given]
        ids = [r[0] for r in reqs]
        sampling = reqs[0][1]
        self.prepare(streams=len(ids))
        p, own = _progress(self._progress_arg, f"gptfpga {self.backend}")
        p = p if own else self.progress
        gen = BatchGeneration(self.config, self._cards, ids, new_tokens, sampling=sampling,
                              eos=self.model.eos_ids, timeout_s=self.timeout, keep_logits=keep_logits,
                              progress=p, prompt_flag=flag)
        if own:
            p.total = gen.steps()
        try:
            for stream, tok in gen:
                if on_token is not None:
                    on_token(stream, tok)
        finally:
            if own:
                p.close()
        stats = self._stats(gen, "")
        results = [Result(prompt_ids=list(i), tokens=list(t), text=self.decode(t), stats=stats,
                          logits=lg) for i, t, lg in zip(ids, gen.tokens, gen.logits, strict=True)]
        return BatchResult(streams=results, stats=stats)

    def _stats(self, gen, modelled_note):
        """A generation's figures (gen.stats.summary), with the backend, config and where the
        cycle figures come from (``modelled_note`` after the ISS's)."""
        stats = {"backend": self.backend, "config": self.config.name, **gen.stats.summary(self.config)}
        stats["cycle_figures"] = ("measured by the cards' cycle counters" if gen.stats.cycles_measured
                                  else "not measured: the ISS counts bytes, not cycles" + modelled_note)
        return stats

    def _result(self, gen, prompt_ids):
        stats = self._stats(gen, " (see modelled_*)")
        stats.update(_modelled(self.config, self.shape, self.cards, len(prompt_ids), len(gen.tokens)))
        return Result(prompt_ids=list(prompt_ids), tokens=list(gen.tokens),
                      text=self.decode(gen.tokens), stats=stats, logits=gen.logits)


def _modelled(cfg, shape, cards, prompt, new_tokens):
    """The performance model's figures for a run's shape, cards and lengths (modelled_*)."""
    from .perf import predict
    r = predict(cfg.replace(cards=cards), shape, cards=cards, prompt=prompt, new_tokens=new_tokens)
    keys = ("prefill_cycles_per_token", "decode_cycles_per_token", "prefill_ms_per_token",
            "decode_ms_per_token", "hbm_roofline_fraction")
    out = {f"modelled_{k}": r[k] for k in keys}
    out["modelled_source"] = MODELLED
    return out


@_user_errors
def perf(config=None, model_shape="gpt2", *, cards=None, prompt_tokens=32, new_tokens=32,
         clock_mhz=None, trace=False, batch=1):
    """The performance model's projection of a GPT-2 on ``cards`` cards of a config.

    Parameters
    ----------
    config : str, pathlib.Path, ApplianceConfig or None
        The appliance config; None: ``configs/tiny.yaml``.
    model_shape : str or host.model.Gpt2Shape
        ``gpt2``, ``gpt2-medium``, ``gpt2-large``, ``gpt2-xl``, a Hugging Face GPT-2
        directory or its config.json, or a shape.
    cards : int or None
        Cards (1..16); None: the config's.
    prompt_tokens, new_tokens : int
        The lengths to project (at least 1 each, within the model's context).
    clock_mhz : int or None
        The clock (50..1000); None: the config's.
    trace : bool
        Also return, under ``"trace"``, the modelled timeline of the first decode step (every
        card's instructions with their issue and done cycles).
    batch : int
        Streams decoded together (1..core.limits.streams): that many prompts of
        ``prompt_tokens`` each; the decode figures are then per step and
        ``decode_tokens_per_s`` counts every stream's tokens.

    Returns
    -------
    dict
        ``decode_cycles_per_token``, ``decode_ms_per_token``, ``prefill_*``, ``total_ms``,
        ``hbm_roofline_fraction`` and the inputs; ``source`` says the figures are projected,
        not measured, and ``calibration_error`` how far the model was from the Verilated
        card on its calibration runs (docs/perf-calibration.json); ``collective_model_error``
        and ``card_collective_model_error`` the same for the collective engine alone and for
        COLLs through the card's collective unit.
    """
    from .model import SHAPES, Gpt2Shape, load_shape
    from .perf import StepCosts, predict, simulate, trace_table
    cfg = _config(config)
    if isinstance(model_shape, Gpt2Shape):
        shape, name = model_shape, "custom"
    elif isinstance(model_shape, str | Path) and str(model_shape) in SHAPES:
        shape, name = SHAPES[str(model_shape)], str(model_shape)
    elif isinstance(model_shape, str | Path) and (Path(model_shape).is_dir()
                                                   or str(model_shape).endswith(".json")):
        p = Path(model_shape)
        shape, name = load_shape(p / "config.json" if p.is_dir() else p, "--model-shape"), str(p)
    else:
        raise UserError(f"--model-shape: got {str(model_shape)!r}; allowed: {', '.join(SHAPES)}, or a "
                        f"Hugging Face GPT-2 directory or config.json")
    cards = cfg.cards if cards is None else cards
    if isinstance(cards, bool) or not isinstance(cards, int) or not 1 <= cards <= MAX_CARDS:
        raise UserError(f"--cards: got {cards!r}; allowed: 1..{MAX_CARDS}")
    if clock_mhz is not None and (isinstance(clock_mhz, bool) or not isinstance(clock_mhz, int)
                                  or not 50 <= clock_mhz <= 1000):
        raise UserError(f"--clock-mhz: got {clock_mhz!r}; allowed: an integer in 50..1000")
    for flag, v in (("--prompt-tokens", prompt_tokens), ("--new-tokens", new_tokens)):
        if isinstance(v, bool) or not isinstance(v, int) or v < 1:
            raise UserError(f"{flag}: got {v!r}; allowed: 1 or more")
    # as `gptfpga run`: the last generated token is not fed back, so it needs no position
    if prompt_tokens + new_tokens - 1 > shape.n_positions:
        raise UserError(f"--prompt-tokens + --new-tokens: {prompt_tokens + new_tokens} is beyond the "
                        f"model's context of {shape.n_positions} positions (+1 for the last token)")
    most = cfg.core.limits.streams
    if isinstance(batch, bool) or not isinstance(batch, int) or not 1 <= batch <= most:
        raise UserError(f"--batch: got {batch!r}; allowed: 1..{most} (core.limits.streams of "
                        f"{cfg.name})")
    cfg = cfg.replace(cards=cards, clock_mhz=clock_mhz or cfg.clock_mhz)
    costs = StepCosts(cfg, shape, cards, streams=batch)
    r = predict(cfg, shape, cards=cards, prompt=prompt_tokens, new_tokens=new_tokens, costs=costs,
                batch=batch)
    from .perf import recorded_calibration
    cal = recorded_calibration() or {}
    out = {"config": cfg.name, "model_shape": name, **r,
           "calibration_error": cal.get("calibration_error"),
           "collective_model_error": cal.get("collective_error"),
           "card_collective_model_error": cal.get("card_collective_error"),
           "source": "projected by the performance model, not measured"}
    if trace:
        # the first decode step (at the last position when the prompt fills the context, as
        # predict prices it)
        pos = min(prompt_tokens, shape.n_positions - 1)
        progs = ([cm.step([0], pos) for cm in costs.cms] if batch == 1 else
                 [cm.step_batch([(0, pos, s) for s in range(batch)]) for cm in costs.cms])
        step = simulate(cfg, progs, trace=True)
        out["trace"] = {"config": cfg.name, "model_shape": name, "cards": cards, "step": "decode",
                        "position": pos, "cycles": step["cycles"],
                        "source": "the performance model's timeline, not measured",
                        "rows": trace_table(progs, step)}
    return out
