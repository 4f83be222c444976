"""``python -m sim.formal [--quick | --deep] [--depth N] [--engine E] [--mode M] [NAME ...]``:
run the formal proofs, one line each. ``--depth``, ``--engine`` and ``--mode`` change the
named proofs' depth, SymbiYosys engine and mode for this run only (to measure how a proof's
time grows with its depth, or to try another method: ``--engine 'abc pdr -T 600'`` runs
ABC's unbounded pdr, in prove mode unless ``--mode`` says otherwise, giving up after 600 s)."""

import argparse
import dataclasses
import sys

from . import WORK, _abc_checker, check
from .proofs import PROOFS


def main(argv=None):
    ap = argparse.ArgumentParser(prog="python -m sim.formal", description=__doc__)
    which = ap.add_mutually_exclusive_group()
    which.add_argument("--quick", action="store_true", help="only the proofs of make test")
    which.add_argument("--deep", action="store_true", help="only the proofs of make soak")
    ap.add_argument("--depth", type=int, help="run the named proofs at this depth instead")
    ap.add_argument("--engine", help="run the named proofs with this engine instead "
                    "(e.g. 'smtbmc yices', 'abc bmc3', 'abc scorr; dc2; bmc3')")
    ap.add_argument("--mode", choices=("bmc", "prove", "cover"),
                    help="run the named proofs in this mode instead")
    ap.add_argument("--timeout", type=float, default=1800, help="seconds per proof (1800)")
    ap.add_argument("names", nargs="*", help="proofs to run (default: all)")
    args = ap.parse_args(argv)
    if args.engine and not args.mode and _abc_checker(args.engine) == "pdr":
        args.mode = "prove"
    if (args.depth or args.engine or args.mode) and not args.names:
        ap.error("--depth, --engine and --mode need the names of the proofs they change")
    proofs = [p for p in PROOFS if (not args.quick or not p.deep) and (not args.deep or p.deep)
              and (not args.names or p.name in args.names)]
    unknown = set(args.names) - {p.name for p in PROOFS}
    if unknown:
        ap.error(f"no proof named {', '.join(sorted(unknown))}")
    change = {k: v for k, v in (("depth", args.depth), ("engine", args.engine),
                                ("mode", args.mode)) if v}
    failed = 0
    for proof in proofs:
        proof = dataclasses.replace(proof, **change)
        workdir = None
        if change:      # beside the proof's own files, not over them
            tail = "_".join(str(v).replace(" ", "").replace(";", "-")
                            for k, v in change.items() if k != "mode" or "engine" not in change)
            workdir = WORK / f"{proof.name}@{tail}"
        result = check(proof, workdir=workdir, timeout=args.timeout)
        print(result, flush=True)
        failed += not result.passed
    print(f"{len(proofs) - failed} passed, {failed} failed")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
