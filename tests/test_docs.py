import re
from pathlib import Path

from gen.docs import stale

ROOT = Path(__file__).resolve().parent.parent
PROSE = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]


def test_generated_docs_are_fresh():
    assert stale() == [], "generated docs are stale: run `python -m gen.docs`"


# -- README and docs hold prose and tables, not pasted command output -------------------------
# An absolute path: a slash that starts a word (not a URL's, a ratio's like "ms/token" or
# "(n-1)/n", nor a relative path's) and at least two components, or a Windows drive path.
ABS_PATH = re.compile(r"(?<![\w.:/~)\]-])/[A-Za-z_][\w.-]*/[\w.-]+|\b[A-Z]:\\\w")
# A shell transcript: a prompt and a command, the venv's tools, a tool's "wrote <path>" line,
# an interpreter prompt, a pytest or make progress line.
TRANSCRIPT = re.compile(r"^\s*(?:[$%] +(?:gptfpga|make|python|pip|\.venv|\./|pytest|cd|git)\b"
                        r"|\.venv/bin/|wrote \S+\.\w+$|>>> |\.+ +\[ *\d+%\]|make(?:\[\d+\])?: )")


def prose_problems(text):
    """(line number, what) of every absolute path or transcript line in a Markdown text."""
    out = []
    for i, line in enumerate(text.splitlines(), 1):
        for m in ABS_PATH.finditer(re.sub(r"\w+://\S+", "", line)):
            out.append((i, f"absolute path {m.group(0)!r}"))
        if TRANSCRIPT.search(line):
            out.append((i, f"pasted command output {line.strip()!r}"))
    return out


def test_prose_checker_catches_what_it_should():
    bad = ["see /work/main/build/bench/x.json", "    $ gptfpga emit bad.yaml", ".venv/bin/gptfpga bench",
           "wrote build/bench/perf-u280x4.json", "....... [ 36%]", r"C:\Users\me", ">>> import gptfpga",
           "make[1]: Entering directory"]
    good = ["4.35 ms/token on 4 cards", "busbw 2(n-1)/n", "host/compiler/emit.py", "`docs/isa.md`",
            "https://github.com/amaranth-lang/amaranth/blob/main/x.py", "> a quoted line of the story",
            "    gptfpga run --config configs/tiny.yaml --backend iss", "[64:64] means 64 in, 64 out",
            "(heads/cards)/2"]
    assert [s for s in bad if not prose_problems(s)] == []
    assert [s for s in good if prose_problems(s)] == []


def test_readme_and_docs_hold_no_machine_paths_or_transcripts():
    found = [f"{p.relative_to(ROOT)}:{i}: {what}" for p in PROSE for i, what in prose_problems(p.read_text())]
    assert found == [], "README/docs: prose and tables only, no pasted output:\n" + "\n".join(found)
