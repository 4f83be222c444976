#!/usr/bin/env python3
"""Verilator's runtime objects compiled once, not once a build (verilated.mk's OBJCACHE hook).

Every Verilated model links its own copy of Verilator's runtime (verilated.cpp,
verilated_vpi.cpp, verilated_threads.cpp, verilated_dpi.cpp): 10-15 s of compiling a build,
repeated by each of make test's two dozen builds with the same flags. verilated.mk runs every
compile as ``$(OBJCACHE) $(CXX) ...``, the hook made for ccache, which the package index does
not carry; ``sim.toolchain.verilator_env`` points it here (stdlib only: make runs it with any
python3).

A compile of a source under ``$VERILATOR_ROOT/include`` is looked up in ``sim_build/objcache``
by a hash of the compiler (its path, size and time), the runtime's sources (the include
folder's files: a reinstalled wheel changes them) and the command line, with the output's name
and the -I folders outside the include folder left out: a runtime source includes only the
runtime's headers (quoted, so found beside it) and the system's, never a build's own files, so
those folders (the build's, a card's harness) cannot change the object. A hit copies the cached
object and its dependency file; a miss compiles and stores both (renamed into place: builds in
parallel never see half a file). Every other compile (the model's own C++) runs unchanged.
"""

import hashlib
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

# (GPTFPGA_OBJCACHE: another folder, for tests/test_objcache.py)
CACHE = Path(os.environ.get("GPTFPGA_OBJCACHE")
             or Path(__file__).resolve().parent.parent / "sim_build" / "objcache")


def _key(cmd, include):
    h = hashlib.sha256()
    cc = shutil.which(cmd[0]) or cmd[0]
    st = os.stat(cc)
    h.update(f"{os.path.realpath(cc)}|{st.st_size}|{st.st_mtime_ns}\n".encode())
    for f in sorted(include.rglob("*")):
        if f.is_file():
            fs = f.stat()
            h.update(f"{f.relative_to(include)}|{fs.st_size}|{fs.st_mtime_ns}\n".encode())
    args, skip = [], False
    for a in cmd[1:]:
        if skip:
            skip = False
            continue
        if a == "-o":
            skip = True
            continue
        if a.startswith("-I") and not Path(a[2:]).resolve().is_relative_to(include):
            continue
        args.append(a)
    h.update("\0".join(args).encode())
    return h.hexdigest()[:32]


def main(cmd):
    root = os.environ.get("VERILATOR_ROOT")
    if not root or "-c" not in cmd or "-o" not in cmd:
        os.execvp(cmd[0], cmd)
    include = (Path(root) / "include").resolve()
    out = Path(cmd[cmd.index("-o") + 1])
    srcs = [a for a in cmd[1:] if a.endswith((".cpp", ".cc")) and Path(a).exists()]
    if len(srcs) != 1 or not Path(srcs[0]).resolve().is_relative_to(include):
        os.execvp(cmd[0], cmd)
    dep = out.with_suffix(".d")
    entry = CACHE / _key(cmd, include)
    if (entry / "obj.o").exists():
        shutil.copyfile(entry / "obj.o", out)
        if (entry / "obj.d").exists():
            shutil.copyfile(entry / "obj.d", dep)
        return 0
    rc = subprocess.run(cmd).returncode
    if rc == 0:
        CACHE.mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(dir=CACHE, prefix=".tmp-"))
        shutil.copyfile(out, tmp / "obj.o")
        if dep.exists():
            shutil.copyfile(dep, tmp / "obj.d")
        try:
            tmp.rename(entry)
        except OSError:                 # another build stored it first
            shutil.rmtree(tmp, ignore_errors=True)
    return rc


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
