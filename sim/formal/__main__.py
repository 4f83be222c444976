"""``python -m sim.formal [--quick | --deep] [--depth N] [--engine E] [NAME ...]``: run the
formal proofs, one line each. ``--depth`` and ``--engine`` change the named proofs' depth and
SymbiYosys engine for this run only (to measure how a proof's time grows with its depth)."""

import argparse
import dataclasses
import sys

from . import WORK, check
from .proofs import PROOFS


def main(argv=None):
    ap = argparse.ArgumentParser(prog="python -m sim.formal", description=__doc__)
    which = ap.add_mutually_exclusive_group()
    which.add_argument("--quick", action="store_true", help="only the proofs of make test")
    which.add_argument("--deep", action="store_true", help="only the proofs of make soak")
    ap.add_argument("--depth", type=int, help="run the named proofs at this depth instead")
    ap.add_argument("--engine", help="run the named proofs with this engine instead "
                    "(e.g. 'smtbmc yices', 'abc bmc3', 'abc scorr; dc2; bmc3')")
    ap.add_argument("--timeout", type=float, default=1800, help="seconds per proof (1800)")
    ap.add_argument("names", nargs="*", help="proofs to run (default: all)")
    args = ap.parse_args(argv)
    if (args.depth or args.engine) and not args.names:
        ap.error("--depth and --engine need the names of the proofs they change")
    proofs = [p for p in PROOFS if (not args.quick or not p.deep) and (not args.deep or p.deep)
              and (not args.names or p.name in args.names)]
    unknown = set(args.names) - {p.name for p in PROOFS}
    if unknown:
        ap.error(f"no proof named {', '.join(sorted(unknown))}")
    change = {k: v for k, v in (("depth", args.depth), ("engine", args.engine)) if v}
    failed = 0
    for proof in proofs:
        proof = dataclasses.replace(proof, **change)
        workdir = None
        if change:      # beside the proof's own files, not over them
            tail = "_".join(str(v).replace(" ", "").replace(";", "-") for v in change.values())
            workdir = WORK / f"{proof.name}@{tail}"
        result = check(proof, workdir=workdir, timeout=args.timeout)
        print(result, flush=True)
        failed += not result.passed
    print(f"{len(proofs) - failed} passed, {failed} failed")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
