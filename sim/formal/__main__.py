"""``python -m sim.formal [--quick | --deep] [NAME ...]``: run the formal proofs, one line each."""

import argparse
import sys

from . import check
from .proofs import PROOFS


def main(argv=None):
    ap = argparse.ArgumentParser(prog="python -m sim.formal", description=__doc__)
    which = ap.add_mutually_exclusive_group()
    which.add_argument("--quick", action="store_true", help="only the proofs of make test")
    which.add_argument("--deep", action="store_true", help="only the proofs of make soak")
    ap.add_argument("names", nargs="*", help="proofs to run (default: all)")
    args = ap.parse_args(argv)
    proofs = [p for p in PROOFS if (not args.quick or not p.deep) and (not args.deep or p.deep)
              and (not args.names or p.name in args.names)]
    unknown = set(args.names) - {p.name for p in PROOFS}
    if unknown:
        ap.error(f"no proof named {', '.join(sorted(unknown))}")
    failed = 0
    for proof in proofs:
        result = check(proof)
        print(result, flush=True)
        failed += not result.passed
    print(f"{len(proofs) - failed} passed, {failed} failed")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
