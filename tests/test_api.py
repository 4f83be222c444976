"""The Python API (host/api.py, importable as ``gptfpga``): the documented example runs as
written, generation and streaming agree with the generation loop, mistakes raise UserError
with one line, and the CLI goes through the same calls.
"""

import re
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest

import gptfpga
from gptfpga import Appliance, UserError
from host.model import Gpt2, Gpt2Shape, random_gpt2

ROOT = Path(__file__).resolve().parent.parent
TINY = ROOT / "configs" / "tiny.yaml"


def docstring_example():
    """The example of host/api.py's docstring: the indented block after its "::"."""
    import host.api
    doc = host.api.__doc__
    body = doc[doc.index("::\n") + 3:]
    end = re.search(r"\n\S", body)               # the indented block ends at unindented text
    return textwrap.dedent(body[:end.start() if end else len(body)]).strip("\n") + "\n"


def readme_example(readme=None):
    """The first ```python block under the "## Python API" heading of README.md, or None."""
    readme = (ROOT / "README.md").read_text() if readme is None else readme
    m = re.search(r"^## Python API\s*$(.*?)(?=^## |\Z)", readme, re.M | re.S)
    block = m and re.search(r"^```python\n(.*?)^```", m.group(1), re.M | re.S)
    return block.group(1) if block else None


def api_example():
    """The README's example: README.md's "## Python API" ```python block; while README.md has
    none, host/api.py's docstring example (the text the README quotes). (source, code)."""
    code = readme_example()
    return ("README.md", code) if code is not None else ("host/api.py", docstring_example())


def test_the_documented_example_runs():
    source, code = api_example()
    assert "gptfpga.Appliance(" in code and "gptfpga.perf(" in code, source
    r = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True,
                       timeout=600)
    assert r.returncode == 0, f"the example of {source} fails:\n{r.stderr}"
    lines = r.stdout.splitlines()
    assert lines[1] == "None"                        # the ISS's cycles: not measured
    assert float(lines[2]) > 1000                    # the modelled ones
    assert lines[-1].endswith("ms per token, projected")
    if source == "README.md":                        # the README quotes the docstring exactly
        assert code.strip() == docstring_example().strip(), "README.md and host/api.py differ"


def test_readme_example_is_taken_from_its_section():
    """Once README.md has the section's ```python block, the test runs that block (the first
    one under the heading, not one elsewhere), and requires it to equal the docstring's."""
    code = docstring_example()
    text = ("# x\n\n```python\nprint('elsewhere')\n```\n\n## Python API\n\nWords.\n\n```python\n"
            + code + "```\n\n```python\nprint('second')\n```\n\n## Next\n\n```python\nno\n```\n")
    assert readme_example(text) == code
    assert readme_example("## Python API\n\nPYTHON-API-PLACEHOLDER\n\n## Next\n```python\nx\n```\n") is None


@pytest.fixture(scope="module")
def app():
    return Appliance(config=TINY, backend="iss", cards=2)


def test_generate_matches_the_generation_loop(app):
    from host.model import load_checkpoint
    from host.runtime import DEMO_MODEL, generate, make_cards
    r = app.generate(prompt="The machine wrote", new_tokens=6, keep_logits=True)
    model = load_checkpoint(DEMO_MODEL)
    ids = app.encode("The machine wrote")
    toks, logits, _ = generate(app.config, make_cards(app.config, model, "iss", 2), None, ids, 6,
                               keep_logits=True)
    assert r.prompt_ids == ids and r.tokens == toks
    assert np.array_equal(r.logits, logits)
    assert r.text == app.decode(toks)
    s = r.stats
    assert s["backend"] == "iss" and s["cards"] == 2 and s["decode_tokens"] == 5
    assert s["decode_cycles_per_token"] is None and s["modelled_decode_cycles_per_token"] > 0
    assert r.to_dict()["tokens"] == toks and "logits" not in r.to_dict()


def test_stream_yields_the_same_tokens_and_text(app):
    kw = dict(prompt_ids=[290, 303, 482], new_tokens=8, temperature=0.8, top_k=40, seed=3)
    s = app.stream(**kw)
    assert s.result is None
    toks = list(s)
    assert [t.id for t in toks] == s.result.tokens
    assert "".join(t.text for t in toks) == s.result.text
    again = app.generate(**kw)
    assert again.tokens == s.result.tokens                 # seeded
    other = app.generate(**{**kw, "seed": 4})
    assert other.tokens != again.tokens


def test_progress_true_reports_and_stops(capfd):
    """progress=True: the preparation and the generation report on stderr, and each report is
    closed after its job (no ticker thread left running, nothing more written)."""
    import threading
    import time
    a = Appliance(config=TINY, cards=1, progress=True)
    r = a.generate(prompt_ids=[1, 2], new_tokens=2)
    assert len(r.tokens) == 2
    time.sleep(1.2)
    assert not [t for t in threading.enumerate() if t.name == "progress" and t.is_alive()]
    err = capfd.readouterr().err
    assert "gptfpga iss: preparing: (loading " in err and "(compiling for 1 card)" in err, err
    assert "gptfpga iss: [" in err and "(prefill, positions 0..1 of 2)" in err, err
    assert capfd.readouterr().err == ""


def test_model_object_without_tokenizer():
    from host.model import Gpt2Shape, random_gpt2
    m = random_gpt2(Gpt2Shape(2, 2, 64, 100, 32), np.random.default_rng(0))
    a = Appliance(config=TINY, model=m, cards=1)
    r = a.generate(prompt_ids=[1, 2, 3], new_tokens=2)
    assert len(r.tokens) == 2 and r.text == "".join(f"[{t}]" for t in r.tokens)
    with pytest.raises(UserError, match="--prompt: the model directory has no tokenizer"):
        a.generate(prompt="text", new_tokens=2)


@pytest.mark.parametrize("kwargs, needle", [
    (dict(config="/nonexistent.yaml"), "cannot read config"),
    (dict(config=TINY, cards=0), "--cards: got 0"),
    (dict(config=TINY, backend="gpu"), "--backend: got 'gpu'"),
    (dict(config=TINY, xclbin="k.xclbin"), "--xclbin: given with --backend iss"),
    (dict(config=TINY, timeout=0), "--timeout: got 0"),
    (dict(config=TINY, model="/nonexistent"), "--model: /nonexistent is not a directory"),
    (dict(config=TINY, model=42), "--model: got int"),
    (dict(config=42), "--config: got int"),
])
def test_appliance_mistakes_raise_user_error(kwargs, needle):
    with pytest.raises(UserError) as e:
        Appliance(**kwargs)
    assert needle in str(e.value) and "\n" not in str(e.value)


def _huge_model_dir(tmp_path):
    import json
    import shutil
    d = tmp_path / "huge"
    shutil.copytree(ROOT / "host" / "demo", d)
    conf = json.loads((d / "config.json").read_text())
    (d / "config.json").write_text(json.dumps(dict(conf, n_layer=10_000_000)))
    return d


def _nan_model(_):
    m = random_gpt2(Gpt2Shape(2, 2, 64, 100, 32), np.random.default_rng(0))
    m.weights["h.1.mlp.c_fc.weight"][3, 4] = np.nan
    return m


@pytest.mark.parametrize("kwargs, needle", [
    (dict(cards=5), "--cards: 5 cards for a model of 4 heads; allowed: 1 to 4"),
    (dict(model=_huge_model_dir), "--model: layers 10000000 exceeds the build's core.limits.layers = 4"),
    (dict(model=lambda _: Gpt2(Gpt2Shape(2, 2, 64, 100, 32), None)), "--model: a shapes-only"),
    (dict(model=_nan_model), "--model: tensor 'h.1.mlp.c_fc.weight' holds nan at (3, 4)"),
    (dict(model=lambda _: random_gpt2(Gpt2Shape(8, 2, 64, 100, 32), np.random.default_rng(0))),
     "--model: layers 8 exceeds the build's core.limits.layers = 4"),
])
def test_the_model_is_checked_when_the_appliance_is_made(kwargs, needle, tmp_path, monkeypatch):
    """Against the build's limits and the card count before any tensor is loaded (a config.json
    of 10 million layers used to end in a MemoryError); a given Gpt2 is checked too."""
    import host.model
    import host.runtime
    monkeypatch.setattr(host.model, "load_checkpoint", lambda *a, **k: pytest.fail("tensors loaded"))
    monkeypatch.setattr(host.runtime, "compile_model", lambda *a, **k: pytest.fail("work started"))
    kwargs = {k: v(tmp_path) if callable(v) else v for k, v in kwargs.items()}
    with pytest.raises(UserError) as e:
        Appliance(config=TINY, **kwargs)
    assert needle in str(e.value) and "\n" not in str(e.value), str(e.value)


@pytest.mark.parametrize("kwargs, needle", [
    (dict(), "--prompt: give the prompt"),
    (dict(prompt="a", prompt_ids=[1]), "--prompt: give the prompt"),
    (dict(prompt_ids=[600]), "--prompt-ids: 600 is outside the vocabulary"),
    (dict(prompt_ids=[]), "--prompt-ids: empty"),
    (dict(prompt=""), "--prompt: empty"),
    (dict(prompt="a", new_tokens=0), "--new-tokens: got 0"),
    (dict(prompt="a", temperature=float("nan")), "--temperature: got nan"),
    (dict(prompt="a", seed=-1), "--seed: got -1"),
    (dict(prompt="a", top_k=3), "--top-k: got 3 with greedy decoding"),
    (dict(prompt_ids=5), "--prompt-ids: got int; allowed: a sequence of token ids"),
    (dict(prompt_ids="1,2"), "--prompt-ids: got str; allowed: a sequence of token ids"),
])
def test_request_mistakes_raise_before_work(kwargs, needle, monkeypatch):
    a = Appliance(config=TINY, cards=1)
    import host.runtime
    monkeypatch.setattr(host.runtime, "compile_model", lambda *x, **k: pytest.fail("work started"))
    with pytest.raises(UserError, match=re.escape(needle)):
        a.generate(**kwargs)


def test_perf_call():
    from gen.config import load_config
    from host.model import SHAPES
    from host.perf import predict
    r = gptfpga.perf(config=TINY, model_shape=str(ROOT / "host" / "demo"), cards=2, prompt_tokens=8,
                     new_tokens=4, trace=True)
    assert r["source"].startswith("projected") and r["cards"] == 2
    assert r["trace"]["rows"] and r["trace"]["cycles"] > 0
    cfg = load_config(TINY)
    from host.model import load_shape
    want = predict(cfg, load_shape(ROOT / "host" / "demo" / "config.json"), cards=2, prompt=8, new_tokens=4)
    assert r["decode_cycles_per_token"] == want["decode_cycles_per_token"]
    for kwargs, needle in [(dict(model_shape="gpt3"), "--model-shape: got 'gpt3'"),
                           (dict(model_shape="gpt2", cards=17), "--cards: got 17"),
                           (dict(model_shape="gpt2", clock_mhz=10), "--clock-mhz: got 10"),
                           (dict(model_shape="gpt2", new_tokens=0), "--new-tokens: got 0"),
                           (dict(model_shape="gpt2", prompt_tokens=1000, new_tokens=100),
                            "beyond the model's context of 1024"),
                           (dict(config="/nope.yaml"), "cannot read config")]:
        with pytest.raises(UserError, match=re.escape(needle)):
            gptfpga.perf(**{"config": TINY, **kwargs})
    assert SHAPES["gpt2"].vocab == 50257


def test_perf_of_a_prompt_that_fills_the_context_and_one_new_token():
    """The demo's 128 positions all prompt, one new token: its decode figures (and the trace)
    are those of a step at the last position, 127 (there is no position 128)."""
    r = gptfpga.perf(config=TINY, model_shape=str(ROOT / "host" / "demo"), cards=1, prompt_tokens=128,
                     new_tokens=1, trace=True)
    assert r["decode_cycles_per_token"] > 0 and r["decode_steps"] == 0
    assert r["trace"]["position"] == 127 and r["trace"]["cycles"] == r["decode_cycles_per_token"]


def test_the_cli_goes_through_the_api(monkeypatch, capsys):
    import host.api
    from host.cli import main
    calls = []
    stream, perf = host.api.Appliance.stream, host.api.perf

    def spy_stream(self, *a, **k):
        calls.append("stream")
        return stream(self, *a, **k)

    def spy_perf(*a, **k):
        calls.append("perf")
        return perf(*a, **k)
    monkeypatch.setattr(host.api.Appliance, "stream", spy_stream)
    monkeypatch.setattr(host.api, "perf", spy_perf)
    assert main(["run", "--cards", "1", "--new-tokens", "2", "--json"]) == 0
    assert main(["perf", "--config", str(TINY), "--model-shape", "host/demo", "--json"]) == 0
    capsys.readouterr()
    assert calls == ["stream", "perf"]
