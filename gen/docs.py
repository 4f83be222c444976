"""Docs generated from the code: ``python -m gen.docs`` rewrites them, tests check they are fresh."""

import sys
from pathlib import Path

from .config import schema_rows

ROOT = Path(__file__).resolve().parent.parent


def configs_md():
    lines = ["# Config reference", "",
             "Generated from `gen/config.py` (`python -m gen.docs`); every key is required.", "",
             "| key | allowed | meaning |", "|---|---|---|"]
    lines += [f"| `{k}` | {a} | {d} |" for k, a, d in schema_rows()]
    return "\n".join(lines) + "\n"


def isa_md():
    from hw.isa import isa_markdown
    return isa_markdown()


GENERATED = {"docs/configs.md": configs_md, "docs/isa.md": isa_md}


def stale():
    """Paths of generated docs whose content differs from what the code generates now."""
    return [p for p, fn in GENERATED.items()
            if not (ROOT / p).exists() or (ROOT / p).read_text() != fn()]


def main():
    for p, fn in GENERATED.items():
        (ROOT / p).write_text(fn())
        print(f"wrote {p}")


if __name__ == "__main__":
    sys.exit(main())
