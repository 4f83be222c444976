"""``gptfpga``: the command line. Each subcommand is a thin layer over a library call.

User mistakes (bad config, bad flag values, missing files) print one line on stderr and exit
with code 2; they never print a traceback.
"""

import argparse
import subprocess
import sys
from pathlib import Path

from gen.config import ConfigError, load_config

from .errors import UserError

ROOT = Path(__file__).resolve().parent.parent


def _cards(args, cfg, least=1):
    """--cards, or the config's count when it is not given; checked against least..16."""
    cards = cfg.cards if args.cards is None else args.cards
    if not least <= cards <= 16:
        raise UserError(f"--cards: got {cards}; allowed: {least}..16")
    return cards


def _default_out(config_path):
    return ROOT / "build" / Path(config_path).stem


def cmd_emit(args):
    from gen.emit import emit
    cfg = load_config(args.config)
    out = Path(args.out) if args.out else _default_out(args.config)
    written = emit(cfg, out, tops=args.top or None)
    for top, path in written.items():
        print(f"{top}: {path}")
    print(f"config: {out / 'config.json'}")
    print(f"report: {out / 'report.md'}")
    return 0


def cmd_lint(args):
    from gen.lint import lint
    status = 0
    for config in args.config:
        cfg = load_config(config)
        out = _default_out(config) / "lint"
        results = lint(cfg, out)
        for top, warnings in results.items():
            if warnings:
                status = 1
                print(f"{cfg.name}/{top}: {len(warnings)} warning(s)")
                for w in warnings:
                    print(f"  {w}")
            else:
                print(f"{cfg.name}/{top}: clean")
    return status


def cmd_sim(args):
    load_config(args.config)   # a bad config fails here, with one line, not inside pytest
    cmd = [sys.executable, "-m", "pytest", str(ROOT / "tests"), "-m", "rtl", "--config",
           str(Path(args.config).resolve()), *args.pytest_args]
    if args.seed is not None:
        cmd += ["--seed", str(args.seed)]
    return subprocess.call(cmd, cwd=ROOT)


def cmd_synth(args):
    import json

    from gen.synth import arith_table, card_table, synth_arith, synth_card
    out = ROOT / "build" / "synth"
    if args.config:
        if args.arith or args.unit:
            raise UserError("synth: --config estimates the card; --arith and --unit are for the "
                            "arithmetic units alone (give one or the other)")
        cfg = load_config(args.config)
        result = synth_card(cfg, out)
        print(card_table(result), end="")
        print(f"not in the sum: {result['not_included']}")
        print(f"wrote {out / f'card-{cfg.name}.json'}")
        return 0
    if not args.arith:
        raise UserError("synth: give --config CONFIG (the card, units multiplied out) or --arith "
                        "(every arithmetic unit alone)")
    names = args.unit or None
    if names:
        from gen.synth import arith_units
        for n in names:
            if n not in arith_units():
                raise UserError(f"--unit: got {n!r}; allowed: {', '.join(arith_units())}")
    results = synth_arith(out / "arith", names)
    (out / "arith.json").write_text(json.dumps(results, indent=1) + "\n")
    (out / "arith.md").write_text(arith_table(results))
    print(arith_table(results), end="")
    print(f"wrote {out / 'arith.json'} and {out / 'arith.md'}")
    return 0


def cmd_bench(args):
    import json

    from sim import bench
    if args.what not in ("core",) and args.positions is not None:
        raise UserError(f"--positions: only for bench core, not bench {args.what}")
    if args.what not in ("collective", "perf") and args.plot:
        raise UserError(f"--plot: only for bench collective and bench perf, not bench {args.what}")
    if args.what == "calibrate":
        if args.config:
            raise UserError("--config: bench calibrate runs its own fixed cases (tiny and medium); "
                            "give no --config")
        cfg = None
    elif not args.config:
        raise UserError(f"--config: bench {args.what} needs a config")
    else:
        cfg = load_config(args.config)
    log = (lambda msg: print(msg, file=sys.stderr)) if args.json else print
    out = ROOT / "build" / "bench"
    out.mkdir(parents=True, exist_ok=True)
    if args.what == "core":
        result = bench.bench_core(cfg, positions=args.positions or 32, log=log)
        table = core_table([result])
    elif args.what == "run":
        result = bench.bench_run(cfg, log=log)
        table = bench.run_table(result)
    elif args.what == "calibrate":
        result = bench.calibrate_perf(log=log)
        bench.CALIBRATION.write_text(json.dumps(result, indent=1) + "\n")
        table = (f"performance model vs RTL: largest error {result['calibration_error']:.1%} over "
                 f"{len(result['steps'])} steps; collectives {result['collective_error']:.1%}\n"
                 f"wrote {bench.CALIBRATION}")
    elif args.what == "perf":
        result = bench.bench_perf(cfg, log=log)
        table = bench.perf_table(result) + "\n\n" + bench.what_if_table(result)
        png = Path(args.plot) if args.plot else ROOT / "docs" / f"decode-roofline-{cfg.name}.png"
        bench.plot_roofline(result, png)
        log(f"wrote {png}")
    else:
        result = bench.bench_collective(cfg, log=log)
        if cfg.ring_links:
            result["card"] = bench.bench_card_collective(cfg, log=log)
        table = bench.collective_table(result)
        png = Path(args.plot) if args.plot else ROOT / "docs" / f"collective-busbw-{cfg.name}.png"
        bench.plot_collective(result, png)
        log(f"wrote {png}")
    path = out / (f"{args.what}-{cfg.name}.json" if cfg else f"{args.what}.json")
    path.write_text(json.dumps(result, indent=1) + "\n")
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

    import numpy as np

    from sim.fabric import LinkDead, run_collective
    cfg = load_config(args.config)
    if args.elements < 1:
        raise UserError(f"--elements: got {args.elements}; allowed: at least 1")
    cards = _cards(args, cfg, least=2)
    for name in ("ber", "drop"):
        v = getattr(args, name)
        if not 0.0 <= v <= 1.0:
            raise UserError(f"--{name}: got {v}; allowed: a probability in [0, 1]")
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
        width = max(len(o) for o in outputs)
        out = np.full((cards, width), np.nan, np.float32)
        for i, o in enumerate(outputs):
            vals = o.astype(np.uint32)
            if args.dtype == "fp16" and args.op == "allgather":
                out[i, :len(o)] = vals.astype(np.uint16).view(np.float16)
            else:
                out[i, :len(o)] = vals.view(np.float32)
        ins = inputs.astype(np.uint16).view(np.float16) if args.dtype == "fp16" else inputs.view(np.float32)
        np.savez(args.save, inputs=ins, outputs=out,
                 output_lengths=np.array([len(o) for o in outputs]))
    if args.json:
        print(json.dumps(fig))
    else:
        for k, v in fig.items():
            print(f"{k}: {v}")
    if not fig["ok"]:
        print("gptfpga: error: collective result differs from the numpy reference", file=sys.stderr)
        return 1
    return 0


def cmd_run(args):
    import json

    import numpy as np

    from .model import load_checkpoint
    from .runtime import DEMO_MODEL, Sampling, check_request, eos_id, generate, make_cards
    from .tokenizer import load_tokenizer
    cfg = load_config(args.config)
    cards = _cards(args, cfg)       # cfg stays as loaded: its card count decides the card kernel
    model_dir = Path(args.model) if args.model else DEMO_MODEL
    model = load_checkpoint(model_dir)
    tok = load_tokenizer(model_dir)
    if args.top_k and not args.temperature:
        raise UserError("--top-k: needs --temperature (greedy decoding ignores it)")
    sampling = Sampling(temperature=args.temperature or 0.0, top_k=args.top_k or 0, seed=args.seed)
    sampling.check(model.shape.vocab)
    if args.prompt_ids is not None:
        try:
            ids = [int(x) for x in args.prompt_ids.split(",") if x.strip()]
        except ValueError:
            raise UserError(f"--prompt-ids: got {args.prompt_ids!r}; allowed: comma-separated "
                            f"token ids, e.g. 464,2068,7586") from None
    else:
        ids = tok.encode(args.prompt)
    check_request(model.shape, ids, args.max_new_tokens)
    appliance = make_cards(cfg, model, args.backend, cards, xclbin=args.xclbin)
    stream = not args.json
    printed = [""]
    gen = []

    def on_token(t):
        gen.append(t)
        if stream:
            text = tok.decode(gen)
            if not text.endswith("\ufffd"):        # a multi-byte character not finished yet
                print(text[len(printed[0]):], end="", flush=True)
                printed[0] = text

    if stream:
        print(args.prompt if args.prompt_ids is None else tok.decode(ids), end="", flush=True)
    out, logits, stats = generate(cfg, appliance, None, ids, args.max_new_tokens, sampling=sampling,
                                  eos=eos_id(model_dir), timeout_s=args.timeout, on_token=on_token,
                                  keep_logits=bool(args.dump_logits))
    if args.dump_logits:
        np.save(args.dump_logits, logits)
    fig = stats.summary(cfg)
    result = {"backend": args.backend, "config": cfg.name, "cards": cards, "prompt_ids": ids,
              "tokens": out, "text": tok.decode(out), **fig}
    if args.json:
        print(json.dumps(result))
    else:
        print()
        print(f"-- {len(out)} tokens on {args.backend} ({cfg.name}, {cards} card{'s' if cards > 1 else ''})")
        if args.backend == "iss":
            print("   (the ISS counts bytes, not cycles: use --backend rtl for cycle figures)")
        else:
            print(f"   prefill: {fig['prefill_cycles']} cycles for {fig['prompt_tokens']} tokens "
                  f"({fig['prefill_cycles_per_token']} per token, {fig['prefill_ms_per_token_at_clock']} ms "
                  f"at {cfg.clock_mhz} MHz)")
            print(f"   decode: {fig['decode_cycles_per_token']} cycles per token "
                  f"({fig['decode_ms_per_token_at_clock']} ms at {cfg.clock_mhz} MHz), "
                  f"HBM utilization {fig['hbm_utilization_decode']}")
        print(f"   HBM bytes per decode token: {fig['hbm_bytes_per_token']:.0f}; simulation wall time "
              f"per decode token: {fig['wall_seconds_per_decode_token']} s")
    return 0


def cmd_perf(args):
    import json

    from .model import SHAPES, load_shape
    from .perf import DFX, StepCosts, predict, simulate, trace_table
    cfg = load_config(args.config)
    if args.model_shape in SHAPES:
        shape = SHAPES[args.model_shape]
    elif Path(args.model_shape).is_dir() or args.model_shape.endswith(".json"):
        p = Path(args.model_shape)
        shape = load_shape(p / "config.json" if p.is_dir() else p, "--model-shape")
    else:
        raise UserError(f"--model-shape: got {args.model_shape!r}; allowed: {', '.join(SHAPES)}, or a "
                        f"Hugging Face GPT-2 directory or config.json")
    cards = _cards(args, cfg)
    if args.clock_mhz is not None and not 50 <= args.clock_mhz <= 1000:
        raise UserError(f"--clock-mhz: got {args.clock_mhz}; allowed: 50..1000")
    for flag, v in (("--prompt-tokens", args.prompt_tokens), ("--new-tokens", args.new_tokens)):
        if v < 1:
            raise UserError(f"{flag}: got {v}; allowed: 1 or more")
    # as `gptfpga run`: the last generated token is not fed back, so it needs no position
    if args.prompt_tokens + args.new_tokens - 1 > shape.n_positions:
        raise UserError(f"--prompt-tokens + --new-tokens: {args.prompt_tokens + args.new_tokens} is "
                        f"beyond the model's context of {shape.n_positions} positions (+1 for the "
                        f"last token)")
    cfg = cfg.replace(cards=cards, clock_mhz=args.clock_mhz or cfg.clock_mhz)
    costs = StepCosts(cfg, shape, cards)
    r = predict(cfg, shape, cards=cards, prompt=args.prompt_tokens, new_tokens=args.new_tokens,
                costs=costs)
    if args.trace:
        # the first decode step: one token at the prompt's end
        progs = [cm.step([0], args.prompt_tokens) for cm in costs.cms]
        step = simulate(cfg, progs, trace=True)
        doc = {"config": cfg.name, "model_shape": args.model_shape, "cards": cards,
               "step": "decode", "position": args.prompt_tokens, "cycles": step["cycles"],
               "source": "the performance model's timeline, not measured",
               "rows": trace_table(progs, step)}
        try:
            Path(args.trace).write_text(json.dumps(doc) + "\n")
        except OSError as e:
            raise UserError(f"--trace: cannot write {args.trace!r}: {e.strerror}") from None
        print(f"wrote {args.trace}: {len(doc['rows'])} instructions over {cards} card(s), "
              f"{step['cycles']} cycles", file=sys.stderr if args.json else sys.stdout)
    from sim.bench import recorded_calibration
    cal = recorded_calibration() or {}
    r = {"config": cfg.name, "model_shape": args.model_shape, **r,
         "calibration_error": cal.get("calibration_error"),
         "collective_model_error": cal.get("collective_error"),
         "source": "projected by the performance model, not measured"}
    if args.json:
        print(json.dumps(r))
        return 0
    print(f"{args.model_shape} on {cards} x {cfg.name} at {cfg.clock_mhz:g} MHz, "
          f"[{args.prompt_tokens}:{args.new_tokens}] (projected by the model):")
    print(f"  decode  {r['decode_ms_per_token']} ms/token ({r['decode_cycles_per_token']:.0f} cycles), "
          f"{r['hbm_roofline_fraction']} of the HBM roofline ({r['hbm_roofline_decode_ms_per_token']} ms)")
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
    from gen.package import package
    cfg = load_config(args.config)
    out = Path(args.out) if args.out else _default_out(args.config) / "vitis"
    files = package(cfg, out)
    for path in files.values():
        print(path)
    return 0


def build_parser():
    p = argparse.ArgumentParser(prog="gptfpga", description=__doc__.splitlines()[0])
    sub = p.add_subparsers(dest="command", required=True)

    e = sub.add_parser("emit", help="write the Verilog of each top, the resolved config and a report")
    e.add_argument("config", help="appliance config (YAML)")
    e.add_argument("-o", "--out", help="output folder (default build/<config name>)")
    e.add_argument("--top", action="append", help="emit only this top (repeatable)")
    e.set_defaults(func=cmd_emit)

    lt = sub.add_parser("lint", help="Verilator -Wall lint of the emitted RTL")
    lt.add_argument("config", nargs="+", help="appliance config(s) (YAML)")
    lt.set_defaults(func=cmd_lint)

    s = sub.add_parser("sim", help="run the cocotb regressions for a config in Verilator")
    s.add_argument("config", help="appliance config (YAML)")
    s.add_argument("--seed", type=int, help="seed for the randomized tests")
    s.add_argument("pytest_args", nargs="*", help="extra pytest arguments (after --)")
    s.set_defaults(func=cmd_sim)
    b = sub.add_parser("bench", help="performance of the card in Verilator (cycles from its counters)")
    b.add_argument("what", choices=["core", "collective", "run", "calibrate", "perf"],
                   help="core: one card's counters; collective: busbw against size on the ring; "
                        "run: the demo model generating on the card; calibrate: the performance "
                        "model against the RTL (writes docs/perf-calibration.json); perf: the "
                        "projected side-by-side with DFX")
    b.add_argument("--config", help="appliance config (YAML); not for calibrate")
    b.add_argument("--positions", type=int, help="core: KV-cache positions for the layer figure (32)")
    b.add_argument("--json", action="store_true", help="print one JSON object")
    b.add_argument("--plot", help="collective, perf: where to write the PNG (default under docs/)")
    b.set_defaults(func=cmd_bench)

    co = sub.add_parser("collective", help="one ring collective on the simulated N-card fabric")
    co.add_argument("--config", required=True, help="appliance config (YAML)")
    co.add_argument("--op", required=True, choices=["allreduce", "allgather", "reducescatter"])
    co.add_argument("--elements", type=int, required=True, help="length of each card's input vector")
    co.add_argument("--cards", type=int, help="cards in the ring (default: the config's)")
    co.add_argument("--dtype", choices=["fp32", "fp16"], default="fp32")
    co.add_argument("--bidirectional", action="store_true", help="both ring directions, half the data each")
    co.add_argument("--ber", type=float, default=0.0, help="bit error rate injected on every link")
    co.add_argument("--drop", type=float, default=0.0, help="frame drop rate (1.0: a dead link)")
    co.add_argument("--seed", type=int, default=0)
    co.add_argument("--json", action="store_true")
    co.add_argument("--save", help="write inputs and outputs to this .npz")
    co.add_argument("--through-card", action="store_true",
                    help="run it through the card kernels (a COLL on HBM on each Verilated card) "
                         "instead of the bare collective nodes")
    co.set_defaults(func=cmd_collective)

    r = sub.add_parser("run", help="generate text with a GPT-2 on the simulated (or real) appliance")
    r.add_argument("--config", default=str(ROOT / "configs" / "tiny.yaml"), help="appliance config (YAML)")
    r.add_argument("--model", help="Hugging Face GPT-2 directory (default: the demo model in host/demo)")
    src = r.add_mutually_exclusive_group()
    src.add_argument("--prompt", default="The lighthouse", help="prompt text")
    src.add_argument("--prompt-ids", help="prompt as comma-separated token ids")
    r.add_argument("--max-new-tokens", type=int, default=32)
    r.add_argument("--backend", choices=["iss", "rtl", "xrt"], default="rtl")
    r.add_argument("--cards", type=int, help="cards to run on (default: the config's)")
    mode = r.add_mutually_exclusive_group()
    mode.add_argument("--greedy", action="store_true", help="the most likely token (the default)")
    mode.add_argument("--temperature", type=float, help="sample from softmax(logits / T)")
    r.add_argument("--top-k", type=int, help="sample among the K most likely tokens")
    r.add_argument("--seed", type=int, default=0, help="seed for sampling")
    r.add_argument("--timeout", type=float, default=600.0, help="seconds a step may take on the device")
    r.add_argument("--xclbin", help="with --backend xrt: the xclbin to load")
    r.add_argument("--json", action="store_true", help="one JSON object instead of streamed text")
    r.add_argument("--dump-logits", help="write the logits of every generated position (.npy)")
    r.set_defaults(func=cmd_run)

    pf = sub.add_parser("perf", help="projected cycles and ms per token of a GPT-2 size on N cards "
                                     "(the calibrated performance model)")
    pf.add_argument("--config", required=True, help="appliance config (YAML)")
    pf.add_argument("--model-shape", required=True,
                    help="gpt2, gpt2-medium, gpt2-large, gpt2-xl, or a GPT-2 directory / config.json")
    pf.add_argument("--cards", type=int, help="cards (default: the config's)")
    pf.add_argument("--clock-mhz", type=int, help="clock (default: the config's)")
    pf.add_argument("--prompt-tokens", type=int, default=32)
    pf.add_argument("--new-tokens", type=int, default=32)
    pf.add_argument("--json", action="store_true", help="one JSON object")
    pf.add_argument("--trace", help="write the modelled timeline of the first decode step (every "
                                    "card's instructions: issue and done cycles, fields) as JSON")
    pf.set_defaults(func=cmd_perf)

    pk = sub.add_parser("package", help="the card as a Vitis RTL kernel: Verilog, kernel.xml, "
                                        "package_kernel.tcl, v++ link config, Makefile")
    pk.add_argument("config", help="appliance config (YAML)")
    pk.add_argument("-o", "--out", help="output folder (default build/<config name>/vitis)")
    pk.set_defaults(func=cmd_package)

    sy = sub.add_parser("synth", help="resource estimates with Yosys synth_xilinx -family xcup")
    sy.add_argument("--config", help="the card of this config: units multiplied out, RAMs counted")
    sy.add_argument("--arith", action="store_true", help="every arithmetic unit, one instance each")
    sy.add_argument("--unit", action="append", help="only this unit (repeatable)")
    sy.set_defaults(func=cmd_synth)
    return p


def main(argv=None):
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.command == "emit" and args.top:
        from gen.tops import TOPS
        for t in args.top:
            if t not in TOPS:
                return _fail(f"--top: got {t!r}; allowed: {', '.join(TOPS)}")
    try:
        return args.func(args)
    except (ConfigError, UserError) as e:
        return _fail(str(e))
    except KeyboardInterrupt:
        return _fail("interrupted")
    except BrokenPipeError:
        # The reader of stdout went away (gptfpga ... | head): stop quietly, as a filter does
        # (stdout to /dev/null, so that Python's own flush at exit does not raise again).
        import os
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0


def _fail(msg):
    print(f"gptfpga: error: {msg}", file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main())
