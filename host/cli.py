"""The ``gptfpga`` command: one console script, a subcommand per job, each a thin layer over a
library call (``run`` and ``perf`` over the Python API, host/api.py).

Conventions, the same in every subcommand: the appliance config is ``--config FILE`` (the
older positional form ``gptfpga emit FILE`` still works for emit, lint, sim and package);
tokens to generate are ``--new-tokens`` (``--max-new-tokens`` still works for run); ``-h``
shows each option's default; ``--version`` the installed version.

A mistake (a bad config, a flag's value out of range, an output path that cannot be written,
an option given twice) prints one line on stderr naming the flag or key, the value and what
is allowed, and exits with 2, before any work starts; Ctrl-C exits with 130 and one line.
Outputs are written whole or not at all (host/files.py).
"""

import argparse
import sys
from pathlib import Path

from hw.ring import MAX_CARDS

from .api import DEFAULT_CONFIG, ROOT
from .errors import CardError, UserError

DESCRIPTION = ("gptfpga: generate, simulate and drive multi-FPGA GPT-2 decoding appliances. "
               "Every subcommand takes the appliance config as --config FILE; "
               "gptfpga <subcommand> -h lists its options and their defaults.")
SYNTH_OUT = ROOT / "build" / "synth"     # synth's reports and its cache of per-unit figures
INTERRUPTED = 130            # 128 + SIGINT, as a shell reports a job ended by Ctrl-C


def _version():
    from importlib.metadata import PackageNotFoundError, version
    try:
        return version("gptfpga")
    except PackageNotFoundError:
        return "unknown (not installed: run make setup)"


# -- argument parsing ----------------------------------------------------------------------------
class _Parser(argparse.ArgumentParser):
    """argparse, with a mistake reported as one line (no usage block) and exit code 2."""

    def error(self, message):
        message = message.removeprefix("argument ")
        self.exit(2, f"gptfpga: error: {message} ({self.prog} -h lists the options)\n")


class _Formatter(argparse.ArgumentDefaultsHelpFormatter):
    """Shows "(default: X)" where there is a default worth showing (not None or False)."""

    def _get_help_string(self, action):
        h = action.help or ""
        d = action.default
        if "%(default)" in h or "default:" in h or d is None or d is False or d == argparse.SUPPRESS:
            return h
        return h + " (default: %(default)s)"


class _Once(argparse.Action):
    """Stores a value, refusing an option (or its alias) given twice: argparse would keep the
    last value without a word."""

    def __call__(self, parser, namespace, values, option_string=None):
        if values == "" and self.dest not in ("prompt", "prompt_ids"):     # those say it themselves
            parser.error(f"{option_string}: empty; allowed: {_what(self.metavar)}")
        seen = namespace.__dict__.setdefault("_given", {})
        if self.dest in seen:
            first = f"{seen[self.dest]} {_show(getattr(namespace, self.dest))}"
            parser.error(f"{option_string}: given twice ({first}, then {option_string} "
                         f"{_show(values)}); allowed: once")
        seen[self.dest] = option_string
        setattr(namespace, self.dest, values)


def _what(metavar):
    """What an option's metavar stands for, in words."""
    m = metavar or ""
    if m.startswith("FILE."):
        return f"a file name ending in {m[4:]}"
    return {"FILE": "a file name", "DIR": "a folder", "SHAPE": "a GPT-2 size or a model's path",
            "IDS": "comma-separated token ids"}.get(m, "a value")


def _show(v):
    return repr(v) if isinstance(v, str) else str(v)


def _number(kind, what):
    def parse(text):
        try:
            return kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"got {text!r}; allowed: {what}") from None
    parse.__name__ = what
    return parse


INT = _number(int, "an integer")
FLOAT = _number(float, "a number")


def _config_arg(p, *, positional=False, required=True, many=False, default=None):
    """--config FILE (repeatable with ``many``; ``default`` where not ``required``); with
    ``positional``, the older positional form too (hidden from -h)."""
    if many:
        p.add_argument("--config", action="append", metavar="FILE",
                       help="appliance config (YAML); repeatable")
    else:
        p.add_argument("--config", action=_Once, metavar="FILE", default=default,
                       help="appliance config (YAML)")
    if positional:
        p.add_argument("config_pos", nargs="*" if many else "?", metavar="CONFIG",
                       help=argparse.SUPPRESS)
    p.set_defaults(_config_required=required, _config_many=many)


def _resolve_config(args):
    """Merge the positional config into --config; one line if neither or both are given."""
    pos = getattr(args, "config_pos", None)
    if getattr(args, "_config_many", False):
        configs = list(args.config or []) + list(pos or [])
        if not configs:
            raise UserError(f"--config: missing; allowed: one or more config files (gptfpga "
                            f"{args.command} --config configs/tiny.yaml)")
        args.config = configs
        return
    given = "config" in getattr(args, "_given", {})
    if pos is not None and given:
        raise UserError(f"--config: given twice ({args.config!r} and the positional {pos!r}); "
                        f"allowed: once")
    if pos is not None:
        args.config = pos
    if args.config is None and getattr(args, "_config_required", False):
        raise UserError(f"--config: missing; allowed: a config file (gptfpga {args.command} "
                        f"--config configs/tiny.yaml)")
    if not given and pos is None and args.config == str(DEFAULT_CONFIG.relative_to(ROOT)):
        args.config = str(DEFAULT_CONFIG)    # the default: the checkout's, from any directory


def build_parser():
    p = _Parser(prog="gptfpga", description=DESCRIPTION, formatter_class=_Formatter)
    p.add_argument("--version", action="version", version=f"gptfpga {_version()}")
    sub = p.add_subparsers(dest="command", required=True, metavar="SUBCOMMAND",
                           parser_class=_Parser)

    def cmd(name, help, func):
        s = sub.add_parser(name, help=help, description=help, formatter_class=_Formatter)
        s.set_defaults(func=func)
        return s

    e = cmd("emit", "write the Verilog of each top, the resolved config and a report", cmd_emit)
    _config_arg(e, positional=True)
    e.add_argument("-o", "--out", action=_Once, metavar="DIR",
                   help="output folder, created if missing (default: build/<config name>)")
    e.add_argument("--top", action="append", help="emit only this top (repeatable; default: every top)")

    lt = cmd("lint", "Verilator -Wall lint of the emitted RTL", cmd_lint)
    _config_arg(lt, positional=True, many=True)

    s = cmd("sim", "run the cocotb regressions (tests marked rtl) for a config in Verilator", cmd_sim)
    _config_arg(s, positional=True)
    s.add_argument("--seed", type=INT, action=_Once,
                   help="seed for the randomized tests (default: GPTFPGA_SEED or the suite's own)")
    s.add_argument("pytest_args", nargs="*", help="extra pytest arguments (after --)")

    b = cmd("bench", "the README's figures: the card's counters in Verilator, the performance model",
            cmd_bench)
    b.add_argument("what", choices=["core", "collective", "run", "calibrate", "perf"],
                   help="core: one card's counters; collective: busbw against size on the ring; "
                        "run: the demo model generating on the card; calibrate: the performance "
                        "model against the RTL (writes docs/perf-calibration.json); perf: the "
                        "projected side-by-side with DFX")
    b.add_argument("--config", action=_Once, metavar="FILE",
                   help="appliance config (YAML); required, except for calibrate (which runs its own)")
    b.add_argument("--positions", type=INT, action=_Once,
                   help="core: KV-cache positions for the layer figure (default: 32)")
    b.add_argument("--json", action="store_true", help="print one JSON object instead of the table")
    b.add_argument("--plot", action=_Once, metavar="FILE.png",
                   help="collective, perf: where to write the PNG (default: under docs/)")

    co = cmd("collective", "one ring collective on the simulated N-card fabric, checked against numpy",
             cmd_collective)
    _config_arg(co)
    co.add_argument("--op", required=True, action=_Once,
                    choices=["allreduce", "allgather", "reducescatter"],
                    help="the collective: allreduce (every card ends with the sum), allgather "
                         "(every card ends with every card's vector), reducescatter (each card "
                         "ends with its share of the sum)")
    co.add_argument("--elements", type=INT, required=True, action=_Once,
                    help="length of each card's input vector")
    co.add_argument("--cards", type=INT, action=_Once,
                    help=f"cards in the ring, 2..{MAX_CARDS} (default: the config's)")
    co.add_argument("--dtype", choices=["fp32", "fp16"], default="fp32", action=_Once,
                    help="element type")
    co.add_argument("--bidirectional", action="store_true", help="both ring directions, half the data each")
    co.add_argument("--ber", type=FLOAT, default=0.0, action=_Once,
                    help="bit error rate injected on every link")
    co.add_argument("--drop", type=FLOAT, default=0.0, action=_Once,
                    help="frame drop rate (1.0: a dead link)")
    co.add_argument("--seed", type=INT, default=0, action=_Once,
                    help="seed of the random inputs and of the links' errors")
    co.add_argument("--json", action="store_true", help="print one JSON object of the figures")
    co.add_argument("--save", action=_Once, metavar="FILE.npz",
                    help="write the inputs and each card's output (the user's elements, in the "
                         "user's layout) to this .npz")
    co.add_argument("--through-card", action="store_true",
                    help="run it through the card kernels (a COLL on HBM on each Verilated card) "
                         "instead of the bare collective nodes")

    r = cmd("run", "generate text with a GPT-2 on the simulated (or real) appliance", cmd_run)
    _config_arg(r, required=False, default=str(DEFAULT_CONFIG.relative_to(ROOT)))
    r.add_argument("--model", action=_Once, metavar="DIR",
                   help="Hugging Face GPT-2 directory (default: the demo model in host/demo, "
                        "vocabulary of 512)")
    src = r.add_mutually_exclusive_group()
    src.add_argument("--prompt", action="append",
                     help="prompt text (default: 'The lighthouse'); given more than once, the "
                          "prompts are decoded together (batched decode, up to the build's "
                          "core.limits.streams)")
    src.add_argument("--prompt-ids", action=_Once, metavar="IDS",
                     help="prompt as comma-separated token ids below the model's vocabulary "
                          "(0..511 for the demo model, e.g. 290,303,482); several prompts "
                          "separated by ';' are decoded together (e.g. '290,303;482')")
    r.add_argument("--new-tokens", type=INT, default=32, action=_Once, metavar="N",
                   help="tokens to generate (fewer if the model's end-of-text token comes)")
    r.add_argument("--max-new-tokens", type=INT, dest="new_tokens", action=_Once, help=argparse.SUPPRESS)
    r.add_argument("--backend", choices=["iss", "rtl", "xrt"], default="iss", action=_Once,
                   help="iss: the instruction-set simulator (fast, bit-identical, counts no cycles); "
                        "rtl: the Verilated cards (cycle counters; builds them the first time); "
                        "xrt: a U280 board (untested)")
    r.add_argument("--cards", type=INT, action=_Once,
                   help=f"cards to run on, 1..{MAX_CARDS} (default: the config's)")
    mode = r.add_mutually_exclusive_group()
    mode.add_argument("--greedy", action="store_true", help="the most likely token (the default)")
    mode.add_argument("--temperature", type=FLOAT, action=_Once,
                      help="sample from softmax(logits / T), T above 0 (default: greedy)")
    r.add_argument("--top-k", type=INT, action=_Once,
                   help="with --temperature: sample among the K most likely tokens (default: all)")
    r.add_argument("--seed", type=INT, default=0, action=_Once, help="seed for sampling, 0 or more")
    r.add_argument("--timeout", type=FLOAT, default=600.0, action=_Once,
                   help="seconds one step may take on the device, above 0")
    r.add_argument("--xclbin", action=_Once, metavar="FILE",
                   help="with --backend xrt only (and required there): the xclbin to load")
    r.add_argument("--json", action="store_true", help="one JSON object instead of streamed text")
    r.add_argument("--dump-logits", action=_Once, metavar="FILE.npy",
                   help="write the logits of every generated position to this .npy ([stream, "
                        "position, vocabulary] with several prompts, NaN past a stream's end)")

    pf = cmd("perf", "projected cycles and ms per token of a GPT-2 size on N cards (the calibrated "
                     "performance model)", cmd_perf)
    _config_arg(pf)
    pf.add_argument("--model-shape", required=True, action=_Once, metavar="SHAPE",
                    help="gpt2, gpt2-medium, gpt2-large, gpt2-xl, or a GPT-2 directory / config.json")
    pf.add_argument("--cards", type=INT, action=_Once, help=f"cards, 1..{MAX_CARDS} (default: the config's)")
    pf.add_argument("--clock-mhz", type=INT, action=_Once, help="clock, 50..1000 (default: the config's)")
    pf.add_argument("--prompt-tokens", type=INT, default=32, action=_Once, metavar="N",
                    help="prompt length to project (prefill)")
    pf.add_argument("--new-tokens", type=INT, default=32, action=_Once, metavar="N",
                    help="tokens generated to project (decode)")
    pf.add_argument("--batch", type=INT, default=1, action=_Once, metavar="B",
                    help="streams decoded together, 1..core.limits.streams (B prompts of "
                         "--prompt-tokens each; decode figures per step, tokens/s of all streams)")
    pf.add_argument("--json", action="store_true", help="print one JSON object")
    pf.add_argument("--trace", action=_Once, metavar="FILE.json",
                    help="write the modelled timeline of the first decode step (every card's "
                         "instructions: issue and done cycles, fields) as JSON")

    pk = cmd("package", "the card as a Vitis RTL kernel: Verilog, kernel.xml, package_kernel.tcl, "
                        "v++ link config, Makefile", cmd_package)
    _config_arg(pk, positional=True)
    pk.add_argument("-o", "--out", action=_Once, metavar="DIR",
                    help="output folder, created if missing (default: build/<config name>/vitis)")

    sy = cmd("synth", "resource estimates with Yosys synth_xilinx -family xcup", cmd_synth)
    _config_arg(sy, required=False)
    sy.add_argument("--arith", action="store_true", help="every arithmetic unit, one instance each")
    sy.add_argument("--unit", action="append",
                    help="with --arith: only this unit (repeatable); printed, arith.json left as it is")
    return p


# -- helpers -------------------------------------------------------------------------------------
def _load(path):
    from gen.config import load_config
    return load_config(path)


def _default_out(config_path):
    return ROOT / "build" / Path(config_path).stem


def _cards(args, cfg, least=1):
    """--cards, or the config's count when it is not given; checked against least..MAX_CARDS."""
    cards = cfg.cards if args.cards is None else args.cards
    if not least <= cards <= MAX_CARDS:
        raise UserError(f"--cards: got {cards}; allowed: {least}..{MAX_CARDS}")
    return cards


def _progress(what, total=None, *, grace=3.0):
    """Progress on stderr; a job done within ``grace`` seconds prints no progress lines to a
    log (a terminal shows the bar at once, and erases it)."""
    from .progress import Progress
    return Progress(what, total, grace=grace)


def _fmt(v, unit=""):
    """A figure for a line of text: n/a for None, whole numbers from 1000 up."""
    if v is None:
        return "n/a"
    if isinstance(v, float):
        return f"{v:.0f}{unit}" if abs(v) >= 1000 else f"{v:g}{unit}"
    return f"{v}{unit}"


# -- subcommands ---------------------------------------------------------------------------------
def cmd_emit(args):
    from gen.emit import emit, output_names
    from gen.tops import TOPS

    from .files import check_out_dir
    cfg = _load(args.config)
    tops = list(dict.fromkeys(args.top)) if args.top else None
    for t in tops or ():
        if t not in TOPS:
            raise UserError(f"--top: got {t!r}; allowed: {', '.join(TOPS)}")
    out = check_out_dir(args.out if args.out is not None else _default_out(args.config), "--out",
                        output_names(tops))
    with _progress(f"emit {cfg.name}", len(tops or TOPS)) as p:
        written = emit(cfg, out, tops=tops, progress=p)
    for top, path in written.items():
        print(f"{top}: {path}")
    print(f"config: {out / 'config.json'}")
    print(f"report: {out / 'report.md'}")
    return 0


def cmd_lint(args):
    from gen.lint import lint
    from gen.tops import TOPS
    cfgs = [(c, _load(c)) for c in args.config]        # every config checked before any lint
    status = 0
    with _progress("lint", len(cfgs) * len(TOPS)) as p:
        for (config, cfg), name in ((c, t) for c in cfgs for t in TOPS):
            # one top at a time, so that each result shows as soon as it is known
            out = _default_out(config) / "lint"
            for top, warnings in lint(cfg, out, tops=[name], progress=p).items():
                if warnings:
                    status = 1
                    p.log("\n".join([f"{cfg.name}/{top}: {len(warnings)} warning(s)",
                                      *(f"  {w}" for w in warnings)]), file=sys.stdout)
                else:
                    p.log(f"{cfg.name}/{top}: clean", file=sys.stdout)
    return status


def cmd_sim(args):
    import subprocess
    _load(args.config)   # a bad config fails here, with one line, not inside pytest
    cmd = [sys.executable, "-m", "pytest", str(ROOT / "tests"), "-m", "rtl", "--config",
           str(Path(args.config).resolve()), *args.pytest_args]
    if args.seed is not None:
        cmd += ["--seed", str(args.seed)]
    return subprocess.call(cmd, cwd=ROOT)


def cmd_synth(args):
    import json

    from gen.synth import arith_table, arith_units, card_table, card_units, synth_arith, synth_card

    from .files import atomic_write
    out = SYNTH_OUT
    if args.config:
        if args.arith or args.unit:
            raise UserError("synth: --config estimates the card; --arith and --unit are for the "
                            "arithmetic units alone (give one or the other)")
        cfg = _load(args.config)
        with _progress(f"synth {cfg.name}", len(card_units(cfg)) + 1) as p:
            result = synth_card(cfg, out, log=lambda m: p.log(m, file=sys.stdout), progress=p)
        print(card_table(result), end="")
        print(f"not in the sum: {result['not_included']}")
        print(f"wrote {out / f'card-{cfg.name}.json'}")
        return 0
    if not args.arith:
        raise UserError("synth: give --config CONFIG (the card, units multiplied out) or --arith "
                        "(every arithmetic unit alone)")
    names = list(dict.fromkeys(args.unit)) if args.unit else None
    for n in names or ():
        if n not in arith_units():
            raise UserError(f"--unit: got {n!r}; allowed: {', '.join(arith_units())}")
    with _progress("synth --arith", len(names or arith_units())) as p:
        results = synth_arith(out / "arith", names, log=lambda m: p.log(m, file=sys.stdout), progress=p)
    print(arith_table(results), end="")
    if names:       # a few units: printed; arith.json stays the whole table of a full run
        return 0
    atomic_write(out / "arith.json", json.dumps(results, indent=1) + "\n")
    atomic_write(out / "arith.md", arith_table(results))
    print(f"wrote {out / 'arith.json'} and {out / 'arith.md'}")
    return 0


def cmd_bench(args):
    import json

    from sim import bench

    from .files import atomic_write, check_out_dir, check_out_file
    from .perf import CALIBRATION
    if args.what not in ("core",) and args.positions is not None:
        raise UserError(f"--positions: only for bench core, not bench {args.what}")
    if args.positions is not None and args.positions < 1:
        raise UserError(f"--positions: got {args.positions}; allowed: 1 or more")
    if args.what not in ("collective", "perf") and args.plot:
        raise UserError(f"--plot: only for bench collective and bench perf, not bench {args.what}")
    if args.plot:
        check_out_file(args.plot, "--plot", ".png")
    if args.what == "calibrate":
        if args.config:
            raise UserError("--config: bench calibrate runs its own fixed cases (tiny and medium); "
                            "give no --config")
        cfg = None
    elif not args.config:
        raise UserError(f"--config: bench {args.what} needs a config")
    else:
        cfg = _load(args.config)
    out = check_out_dir(ROOT / "docs" / "bench", "bench")     # the figures of record (gen.docs)
    what = f"bench {args.what}" + (f" {cfg.name}" if cfg else "")
    with _progress(what) as p:
        def log(msg):
            p.log(msg, file=sys.stderr if args.json else sys.stdout)
        if args.what == "core":
            result = bench.bench_core(cfg, positions=args.positions or 32, log=log, progress=p)
            table = core_table([result])
        elif args.what == "run":
            result = bench.bench_run(cfg, log=log, progress=p)
            table = bench.run_table(result)
        elif args.what == "calibrate":
            result = bench.calibrate_perf(log=log, progress=p)
            atomic_write(CALIBRATION, json.dumps(result, indent=1) + "\n")
            table = (f"performance model vs RTL: largest error {result['calibration_error']:.1%} over "
                     f"{len(result['steps'])} steps; collectives {result['collective_error']:.1%}\n"
                     f"wrote {CALIBRATION.relative_to(ROOT)}")
        elif args.what == "perf":
            result = bench.bench_perf(cfg, log=log, progress=p)
            table = bench.perf_table(result) + "\n\n" + bench.what_if_table(result)
            png = Path(args.plot) if args.plot else ROOT / "docs" / f"decode-roofline-{cfg.name}.png"
            bench.plot_roofline(result, png)
            log(f"wrote {png}")
        else:
            result = bench.bench_collective(cfg, log=log, progress=p)
            if cfg.ring_links:
                result["card"] = bench.bench_card_collective(cfg, log=log, progress=p)
            table = bench.collective_table(result)
            png = Path(args.plot) if args.plot else ROOT / "docs" / f"collective-busbw-{cfg.name}.png"
            bench.plot_collective(result, png)
            log(f"wrote {png}")
    path = out / (f"{args.what}-{cfg.name}.json" if cfg else f"{args.what}.json")
    atomic_write(path, json.dumps(result, indent=1) + "\n")
    if args.json:
        print(json.dumps(result))
    else:
        print(table)
        print(f"wrote {path}")
    return 0


def core_table(results):
    rows = [("config", "name"), ("HBM utilization, GPT-2-small matvecs", "hbm_utilization_matvec"),
            ("decode cycles per layer", "decode_cycles_per_layer"),
            ("HBM utilization, decoder layer", "hbm_utilization_layer"),
            ("simulated cycles per second", "sim_cycles_per_second"),
            ("Verilator build seconds", "verilator_build_seconds")]
    lines = ["| figure | " + " | ".join(r["config"] for r in results) + " |",
             "|---|" + "---|" * len(results)]
    for label, key in rows[1:]:
        lines.append(f"| {label} | " + " | ".join(str(r[key]) for r in results) + " |")
    for key in ("matrix_busy", "vector_busy", "dma_stall", "control_stall"):
        lines.append(f"| layer: {key.replace('_', ' ')} cycles | "
                     + " | ".join(str(r["layer"][key]) for r in results) + " |")
    return "\n".join(lines)


def cmd_collective(args):
    import json

    from sim.fabric import LinkDead, run_collective, user_layout

    from .files import atomic_output, check_out_file
    cfg = _load(args.config)
    if args.elements < 1:
        raise UserError(f"--elements: got {args.elements}; allowed: at least 1")
    cards = _cards(args, cfg, least=2)
    for name in ("ber", "drop"):
        v = getattr(args, name)
        if not 0.0 <= v <= 1.0:
            raise UserError(f"--{name}: got {v}; allowed: a probability in [0, 1]")
    if not 0 <= args.seed < 1 << 63:
        raise UserError(f"--seed: got {args.seed}; allowed: an integer in 0..2**63-1")
    if args.save:
        check_out_file(args.save, "--save", ".npz")
    dead = 1.0 if args.drop >= 1.0 else None
    if args.through_card:
        from sim.system import run_card_collective
        if args.dtype != "fp32":
            raise UserError(f"--dtype: got {args.dtype}; allowed with --through-card: fp32 (the card's "
                            f"COLL reduces fp32 words; fp16 runs on the bare nodes)")
        if args.elements >= 1 << 24:
            raise UserError(f"--elements: got {args.elements}; allowed with --through-card: at most "
                            f"{(1 << 24) - 1} (the COLL's n field)")
        if not cfg.ring_links:
            raise UserError(f"--through-card: config {cfg.name!r} has cards: 1, so its card kernel has "
                            f"no ring links; use a config with cards >= 2")
    try:
        with _progress(f"collective {args.op}") as p:
            p.note(f"{args.elements} elements on {cards} cards"
                   + (" through the Verilated cards" if args.through_card else ""))
            if args.through_card:
                fig, inputs, outputs, _ = run_card_collective(
                    cfg, args.op, args.elements, cards=cards, bidirectional=args.bidirectional,
                    ber=args.ber, drop=0.0 if dead else args.drop, dead_link=0 if dead else None,
                    seed=args.seed)
            else:
                fig, inputs, outputs, _ = run_collective(
                    cfg, args.op, args.elements, cards=cards, dtype=args.dtype,
                    bidirectional=args.bidirectional, ber=args.ber, drop=0.0 if dead else args.drop,
                    dead_link=0 if dead else None, seed=args.seed)
    except LinkDead as e:
        fig = e.figures
        if args.json:
            print(json.dumps(fig))
        print(f"gptfpga: error: collective {args.op} on {cards} cards: {e} ("
              f"{fig['retransmissions']} retransmissions)", file=sys.stderr)
        return 1
    if args.save:
        import numpy as np
        saved = user_layout(cfg, args.op, inputs, outputs, dtype=args.dtype,
                            bidirectional=args.bidirectional)
        with atomic_output(args.save, flag="--save") as f:
            np.savez(f, **saved)
    if args.json:
        print(json.dumps(fig))
    else:
        for k, v in fig.items():
            print(f"{k}: {v}")
    if not fig["ok"]:
        print("gptfpga: error: collective result differs from the numpy reference", file=sys.stderr)
        return 1
    return 0


def _prompt_id_lists(text, app):
    """--prompt-ids: ';'-separated prompts of comma-separated ids (a list per prompt)."""
    parts = text.split(";")
    if len(parts) == 1:
        return [_prompt_ids(text, app)]
    out = []
    for k, part in enumerate(parts):
        try:
            out.append(_prompt_ids(part, app))
        except UserError as e:
            raise UserError(str(e).replace("--prompt-ids:", f"--prompt-ids (prompt {k + 1} of "
                                           f"{len(parts)}):", 1)) from None
    return out


def _prompt_ids(text, app):
    """--prompt-ids: comma-separated ids (each checked against the vocabulary later). The
    example in the message is valid for the model: its tokenizer's ids of a short text."""
    from .tokenizer import Tokenizer
    ex = app.encode("The machine wrote") if isinstance(app.tokenizer, Tokenizer) else []
    ex = [i for i in ex if i < app.shape.vocab] or list(range(min(3, app.shape.vocab)))
    allowed = (f"allowed: comma-separated token ids in 0..{app.shape.vocab - 1}, e.g. "
               f"{','.join(map(str, ex))}")
    items = [x.strip() for x in text.split(",")]
    if not text.strip():
        raise UserError(f"--prompt-ids: empty; {allowed}")
    try:
        ids = [int(x) for x in items]
    except ValueError:
        raise UserError(f"--prompt-ids: got {text!r}; {allowed}") from None
    bad = [i for i in ids if not 0 <= i < app.shape.vocab]
    if bad:
        raise UserError(f"--prompt-ids: {bad[0]} is outside the vocabulary (the model has "
                        f"{app.shape.vocab} tokens); {allowed}")
    return ids


def cmd_run(args):
    import json

    from .api import Appliance
    from .files import atomic_output, check_out_file
    if args.dump_logits:
        check_out_file(args.dump_logits, "--dump-logits", ".npy")
    progress = _progress(f"run on {args.backend}")
    with progress:
        app = Appliance(args.config, args.model, backend=args.backend, cards=args.cards,
                        xclbin=args.xclbin, timeout=args.timeout, progress=progress)
        id_lists = _prompt_id_lists(args.prompt_ids, app) if args.prompt_ids is not None else None
        texts = args.prompt or ["The lighthouse"]
        if len(id_lists or texts) > 1:
            return _run_batch(args, app, progress, None if id_lists else texts, id_lists)
        ids = id_lists[0] if id_lists else None
        prompt = texts[0]
        stream = app.stream(None if ids is not None else prompt, prompt_ids=ids,
                            new_tokens=args.new_tokens, temperature=args.temperature or 0.0,
                            top_k=args.top_k, seed=args.seed, keep_logits=bool(args.dump_logits))
        progress.total = stream.steps
        for i, token in enumerate(stream):
            if args.json:
                continue
            if i == 0:      # the text shows the progress from here on
                progress.close()
                print(prompt if ids is None else app.decode(ids), end="", flush=True)
            print(token.text, end="", flush=True)
    result = stream.result
    if args.dump_logits:
        import numpy as np
        with atomic_output(args.dump_logits, flag="--dump-logits") as f:
            np.save(f, result.logits)
    doc = {"backend": args.backend, "config": app.config.name, "cards": app.cards, **result.to_dict()}
    quant = app.quant_error
    if quant is not None:
        doc["weights"] = {"dtype": app.config.core.weight_dtype, "quant_max_rel_error": quant[0],
                          "quant_mean_rel_error": quant[1]}
    if args.json:
        print(json.dumps(doc))
        return 0
    s, mhz = result.stats, app.config.clock_mhz
    print()
    print(f"-- {len(result.tokens)} tokens on {args.backend} ({app.config.name}, {app.cards} "
          f"card{'s' if app.cards > 1 else ''})")
    if s["decode_cycles_per_token"] is not None or s["prefill_cycles"] is not None:
        print(f"   prefill: {s['prefill_cycles']} cycles for {s['prompt_tokens']} tokens "
              f"({_fmt(s['prefill_cycles_per_token'])} per token, "
              f"{_fmt(s['prefill_ms_per_token_at_clock'])} ms at {mhz:g} MHz)")
        print(f"   decode: {_fmt(s['decode_cycles_per_token'])} cycles per token "
              f"({_fmt(s['decode_ms_per_token_at_clock'])} ms at {mhz:g} MHz), "
              f"HBM utilization {_fmt(s['hbm_utilization_decode'])}")
    else:
        print("   cycles: not measured (the ISS counts bytes, not cycles; --backend rtl counts them)")
    print(f"   modelled by the performance model, not measured: prefill "
          f"{_fmt(s['modelled_prefill_cycles_per_token'])} cycles per token, decode "
          f"{_fmt(s['modelled_decode_cycles_per_token'])} cycles per token "
          f"({_fmt(s['modelled_decode_ms_per_token'])} ms at {mhz:g} MHz)")
    print(f"   HBM bytes per decode token: {_fmt(s['hbm_bytes_per_token'])}; simulation wall time "
          f"per decode token: {_fmt(s['wall_seconds_per_decode_token'], ' s')}")
    if quant is not None:
        print(f"   {app.config.core.weight_dtype} weights (quantized by the compiler, a power-of-two "
              f"scale per row): relative "
              f"error per row |w - q s| / |w| largest {quant[0]:.2e}, mean {quant[1]:.2e}")
    return 0



def _run_batch(args, app, progress, texts, id_lists):
    """`gptfpga run` with several prompts: decoded together; each stream's text once it is
    done (JSON: ``streams``)."""
    import json

    import numpy as np

    from .files import atomic_output
    result = app.generate_batch(texts, prompt_ids=id_lists, new_tokens=args.new_tokens,
                                temperature=args.temperature or 0.0, top_k=args.top_k, seed=args.seed,
                                keep_logits=bool(args.dump_logits))
    progress.close()
    if args.dump_logits:      # [stream, position, vocabulary]; NaN past a stream's end
        n = max(len(r.tokens) for r in result.streams)
        out = np.full((len(result.streams), n, app.shape.vocab), np.nan, np.float32)
        for k, r in enumerate(result.streams):
            out[k, :len(r.tokens)] = r.logits
        with atomic_output(args.dump_logits, flag="--dump-logits") as f:
            np.save(f, out)
    doc = {"backend": args.backend, "config": app.config.name, "cards": app.cards, **result.to_dict()}
    if args.json:
        print(json.dumps(doc))
        return 0
    for k, r in enumerate(result.streams):
        print(f"[{k + 1}] {app.decode(r.prompt_ids)}{r.text}")
    s, mhz = result.stats, app.config.clock_mhz
    n = len(result.streams)
    print(f"-- {n} streams decoded together, {s['decode_tokens'] + n} tokens on {args.backend} "
          f"({app.config.name}, {app.cards} card{'s' if app.cards > 1 else ''})")
    if s["decode_cycles_per_step"] is not None:
        print(f"   decode: {_fmt(s['decode_cycles_per_step'])} cycles per step, "
              f"{_fmt(s['decode_cycles_per_token'])} per token of all streams "
              f"({_fmt(s['decode_ms_per_token_at_clock'])} ms at {mhz:g} MHz)")
    else:
        print("   cycles: not measured (the ISS counts bytes, not cycles; --backend rtl counts them)")
    return 0


def cmd_perf(args):
    import json

    from .api import perf
    from .files import atomic_write, check_out_file
    from .perf import DFX
    if args.trace:
        check_out_file(args.trace, "--trace")
    r = perf(args.config, args.model_shape, cards=args.cards, prompt_tokens=args.prompt_tokens,
             new_tokens=args.new_tokens, clock_mhz=args.clock_mhz, trace=bool(args.trace),
             batch=args.batch)
    r["model_shape"] = args.model_shape
    if args.trace:
        doc = r.pop("trace")
        doc["model_shape"] = args.model_shape
        atomic_write(args.trace, json.dumps(doc) + "\n", flag="--trace")
        print(f"wrote {args.trace}: {len(doc['rows'])} instructions over {r['cards']} card(s), "
              f"{doc['cycles']} cycles", file=sys.stderr if args.json else sys.stdout)
    if args.json:
        print(json.dumps(r))
        return 0
    print(f"{args.model_shape} on {r['cards']} x {r['config']} at {r['clock_mhz']:g} MHz, "
          f"[{args.prompt_tokens}:{args.new_tokens}] (projected by the model):")
    if r["batch"] > 1:
        print(f"  decode  {r['batch']} streams together: {r['decode_ms_per_token']} ms a step "
              f"({r['decode_cycles_per_token']:.0f} cycles), {r['decode_tokens_per_s']} tokens/s of "
              f"all streams")
    else:
        print(f"  decode  {r['decode_ms_per_token']} ms/token ({r['decode_cycles_per_token']:.0f} "
              f"cycles), {r['hbm_roofline_fraction']} of the HBM roofline "
              f"({r['hbm_roofline_decode_ms_per_token']} ms)")
    print(f"  prefill {r['prefill_ms_per_token']} ms per input token "
          f"({r['tokens_per_step']} tokens per step); total {r['total_ms']} ms")
    if args.model_shape in DFX:
        d = DFX[args.model_shape]
        print(f"  DFX (4 x U280, 200 MHz, paper): decode {d['decode_ms_per_token']} ms/token, "
              f"prefill {d['prefill_ms_per_token']} ms per input token")
    if r["calibration_error"] is not None:
        print(f"  model vs RTL on the calibration runs: largest error {r['calibration_error']:.1%} "
              f"(gptfpga bench calibrate)")
    return 0


def cmd_package(args):
    from gen.package import FILES, package

    from .files import check_out_dir
    cfg = _load(args.config)
    out = check_out_dir(args.out if args.out is not None else _default_out(args.config) / "vitis",
                        "--out", FILES)
    with _progress(f"package {cfg.name}") as p:
        files = package(cfg, out, progress=p)
    for path in files.values():
        print(path)
    return 0


# -- entry point ---------------------------------------------------------------------------------
def main(argv=None):
    """The console script: returns the exit code (0, 1 for a failed check such as lint
    warnings or a card that stopped with an error, 2 for a mistake in what was asked, 130 for
    Ctrl-C)."""
    try:
        return _main(argv)
    except KeyboardInterrupt:
        return _interrupted()


def _main(argv):
    from gen.config import ConfigError
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        _resolve_config(args)
        return args.func(args)
    except (ConfigError, UserError) as e:
        return _fail(_as_typed(str(e), args))
    except CardError as e:
        print(f"gptfpga: card error: {e}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return _interrupted()
    except BrokenPipeError:
        # The reader of stdout went away (gptfpga ... | head): stop quietly, as a filter does
        # (stdout to /dev/null, so that Python's own flush at exit does not raise again).
        import os
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0


def _as_typed(msg, args):
    """A message names an option as the user typed it: the library says --new-tokens, the
    user may have typed its older alias --max-new-tokens."""
    for dest, typed in getattr(args, "_given", {}).items():
        canonical = "--" + dest.replace("_", "-")
        if typed != canonical and typed.startswith("--"):
            msg = msg.replace(canonical, typed)
    return msg


def _interrupted():
    try:
        sys.stdout.flush()
    except (OSError, ValueError, KeyboardInterrupt):
        pass
    try:
        lead = "\n" if sys.stderr.isatty() else ""      # off the line the terminal echoed ^C on
        print(f"{lead}gptfpga: interrupted", file=sys.stderr, flush=True)
    except (OSError, ValueError, KeyboardInterrupt):
        pass
    return INTERRUPTED


def _fail(msg):
    print(f"gptfpga: error: {msg}", file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main())
