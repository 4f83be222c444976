"""sim/objcache.py, the hook that compiles Verilator's runtime objects once for every build:
a runtime source's second compile with the same flags is a copy of the first's object, other
flags or another source compile again, and the model's own C++ always compiles. A stand-in
compiler records each call and writes its arguments as the object."""

import os
import subprocess
import sys
from pathlib import Path

HOOK = Path(__file__).resolve().parent.parent / "sim" / "objcache.py"

FAKE_CC = """import sys, pathlib
args = sys.argv[1:]
log = pathlib.Path(__file__).with_name("calls.log")
log.write_text(log.read_text() + " ".join(args) + "\\n" if log.exists() else " ".join(args) + "\\n")
out = pathlib.Path(args[args.index("-o") + 1])
out.write_text(" ".join(a for a in args if not a.startswith("-I")))
if "-MMD" in args:
    out.with_suffix(".d").write_text(out.name + ": deps\\n")
sys.exit(3 if "-DFAIL" in args else 0)
"""


def _setup(tmp_path):
    root = tmp_path / "vroot"
    (root / "include").mkdir(parents=True)
    (root / "include" / "verilated.cpp").write_text("// runtime\n")
    (root / "include" / "verilated.h").write_text("// header\n")
    cc = tmp_path / "cc" / "fakecc"
    cc.parent.mkdir()
    cc.write_text(f"#!{sys.executable}\n" + FAKE_CC)
    cc.chmod(0o755)
    env = dict(os.environ, VERILATOR_ROOT=str(root), GPTFPGA_OBJCACHE=str(tmp_path / "cache"))
    return root, cc, env


def _compile(cc, env, build, src, *flags):
    build.mkdir(parents=True, exist_ok=True)
    return subprocess.run([sys.executable, str(HOOK), str(cc), "-O0", *flags, f"-I{build}", "-MMD",
                           "-c", "-o", "verilated.o", str(src)], cwd=build, env=env).returncode


def _calls(cc):
    log = cc.with_name("calls.log")
    return len(log.read_text().splitlines()) if log.exists() else 0


def test_runtime_object_compiled_once_per_flags(tmp_path):
    root, cc, env = _setup(tmp_path)
    src = root / "include" / "verilated.cpp"
    assert _compile(cc, env, tmp_path / "b1", src, "-DVM_TRACE=0") == 0
    assert _calls(cc) == 1
    # another build, another -I of its own: the same object, copied, the compiler not run
    assert _compile(cc, env, tmp_path / "b2", src, "-DVM_TRACE=0") == 0
    assert _calls(cc) == 1
    for f in ("verilated.o", "verilated.d"):
        assert (tmp_path / "b2" / f).read_bytes() == (tmp_path / "b1" / f).read_bytes()
    # other flags: compiled again
    assert _compile(cc, env, tmp_path / "b3", src, "-DVM_TRACE=1") == 0
    assert _calls(cc) == 2 and "VM_TRACE=1" in (tmp_path / "b3" / "verilated.o").read_text()
    # the runtime's sources changed (a reinstalled wheel): compiled again
    (root / "include" / "verilated.h").write_text("// header, another version\n")
    assert _compile(cc, env, tmp_path / "b4", src, "-DVM_TRACE=0") == 0
    assert _calls(cc) == 3


def test_model_sources_and_failures_are_not_cached(tmp_path):
    root, cc, env = _setup(tmp_path)
    model = tmp_path / "Vtop.cpp"
    model.write_text("// a model\n")
    for b in ("m1", "m2"):
        assert _compile(cc, env, tmp_path / b, model) == 0
    assert _calls(cc) == 2                               # the model's own C++: every time
    src = root / "include" / "verilated.cpp"
    for b in ("f1", "f2"):
        assert _compile(cc, env, tmp_path / b, src, "-DFAIL") == 3
    assert _calls(cc) == 4                               # a failed compile stores nothing
    assert not list((tmp_path / "cache").glob("*/obj.o"))
