"""The card in Verilator behind the Device interface.

``build_card(cfg)`` emits the card's Verilog, generates the port bindings of the C++ harness
(sim/cpp/card_sim.cpp) for this config, and builds both into a shared library, cached by a
hash of everything that goes into it. ``RtlDevice(cfg)`` loads it with ctypes: HBM images go
in and out by memcpy, registers through AXI4-Lite transactions, and ``wait`` clocks the model
in C++ until the kernel's interrupt rises. No Python runs per clock.
"""

import ctypes
import hashlib
import json
import os
import subprocess
import time
from pathlib import Path

import numpy as np

from hw import regs

from .device import Device, DeviceError, DeviceTimeout
from .toolchain import verilator_env, verilator_root

__all__ = ["build_card", "RtlDevice"]

ROOT = Path(__file__).resolve().parent.parent
HARNESS = ROOT / "sim" / "cpp" / "card_sim.cpp"
LINT_VLT = ROOT / "gen" / "lint.vlt"
BUILD_ROOT = ROOT / "sim_build"

AXI_READ = ("arid", "araddr", "arlen", "arvalid", "arready", "rid", "rdata", "rresp", "rlast",
            "rvalid", "rready")
AXI_WRITE = ("awid", "awaddr", "awlen", "awvalid", "awready", "wdata", "wstrb", "wlast", "wvalid",
             "wready", "bid", "bresp", "bvalid", "bready")
LITE = ("awaddr", "awvalid", "awready", "wdata", "wstrb", "wvalid", "wready", "bresp", "bvalid",
        "bready", "araddr", "arvalid", "arready", "rdata", "rresp", "rvalid", "rready")


def _ports_header(ports):
    """C++ that binds the harness's Port structs to the Verilated top's members."""
    def ref(name):
        bits = ports[name]
        expr = f"s.top->{name}.data()" if bits > 64 else f"&s.top->{name}"
        return f"Port{{static_cast<void*>({expr}), {bits}}}"

    lines = ["static void bind(Sim& s) {"]
    k = 0
    while f"m_axi_hbm{k}_araddr" in ports:
        lines.append(f"    s.slaves[{k}].a.has_write = true;")
        lines.append(f"    s.slaves[{k}].a.beat = {ports[f'm_axi_hbm{k}_rdata'] // 8};")
        for sig in AXI_READ + AXI_WRITE:
            lines.append(f"    s.slaves[{k}].a.{sig} = {ref(f'm_axi_hbm{k}_{sig}')};")
        k += 1
    lines.append(f"    s.slaves[{k}].a.has_write = false;")
    lines.append(f"    s.slaves[{k}].a.beat = {ports['m_axi_insn_rdata'] // 8};")
    for sig in AXI_READ:
        lines.append(f"    s.slaves[{k}].a.{sig} = {ref(f'm_axi_insn_{sig}')};")
    for sig in LITE:
        lines.append(f"    s.{sig} = {ref(f's_axi_control_{sig}')};")
    lines.append("}")
    return "\n".join(lines) + "\n"


def build_card(cfg, *, log=None, watchdog=None):
    """Build (or reuse) the Verilated card of ``cfg``; returns (library path, built_now, seconds)."""
    from gen.emit import port_table
    from gen.tops import VitisCard
    from gen.verilog import to_verilog

    kwargs = {} if watchdog is None else {"watchdog": watchdog}
    top = VitisCard(cfg, **kwargs)
    verilog = to_verilog(top, "card")
    ports = {name: bits for name, _dir, bits in port_table(top)}
    header = _ports_header(ports)
    h = hashlib.sha256()
    for part in (verilog, header, HARNESS.read_text(), LINT_VLT.read_text()):
        h.update(part.encode())
    import verilator
    h.update(verilator.__version__.encode())
    digest = h.hexdigest()[:16]
    out = BUILD_ROOT / f"card-{cfg.name}-{digest}"
    lib = out / "libcard.so"
    if lib.exists():
        return lib, False, 0.0
    out.mkdir(parents=True, exist_ok=True)
    (out / "card.v").write_text(verilog)
    (out / "card_ports.h").write_text(header)
    env = verilator_env()
    cmd = [str(verilator_root() / "bin" / "verilator"), "--cc", "--exe", "--build",
           "-j", str(max(1, os.cpu_count() or 1)), "--top-module", "card", "--prefix", "Vcard",
           "-o", "libcard.so", "-Mdir", str(out / "obj"),
           "-CFLAGS", f"-fPIC -O1 -I{out}", "-LDFLAGS", "-shared",
           "-MAKEFLAGS", "CFG_CXXFLAGS_PCH_I=-include",
           str(LINT_VLT), str(out / "card.v"), str(HARNESS)]
    t0 = time.monotonic()
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env)
    seconds = time.monotonic() - t0
    if proc.returncode != 0:
        raise RuntimeError(f"Verilator build of the card failed:\n{proc.stdout[-3000:]}\n"
                           f"{proc.stderr[-3000:]}")
    (out / "obj" / "libcard.so").rename(lib)
    (out / "build.json").write_text(json.dumps({"config": cfg.name, "seconds": round(seconds, 1)}))
    if log:
        log(f"built {lib} in {seconds:.0f} s")
    return lib, True, seconds


class RtlDevice(Device):
    """One card in Verilator (see module docstring)."""

    def __init__(self, cfg, *, lib=None, latency=None, bytes_per_cycle=None, watchdog=None):
        self.cfg = cfg
        if lib is None:
            lib, _, _ = build_card(cfg, watchdog=watchdog)
        self._lib = ctypes.CDLL(str(lib))
        L = self._lib
        L.sim_new.restype = ctypes.c_void_p
        L.sim_new.argtypes = [ctypes.c_int, ctypes.c_uint64, ctypes.c_int, ctypes.c_double, ctypes.c_int]
        L.sim_free.argtypes = [ctypes.c_void_p]
        for f in (L.hbm_write, L.hbm_read):
            f.argtypes = [ctypes.c_void_p, ctypes.c_int, ctypes.c_uint64, ctypes.c_void_p, ctypes.c_uint64]
        L.reg_write.argtypes = [ctypes.c_void_p, ctypes.c_uint32, ctypes.c_uint32]
        L.reg_read.argtypes = [ctypes.c_void_p, ctypes.c_uint32]
        L.reg_read.restype = ctypes.c_int64
        L.run.argtypes = [ctypes.c_void_p, ctypes.c_uint64]
        L.run.restype = ctypes.c_int64
        L.cycles.argtypes = [ctypes.c_void_p]
        L.cycles.restype = ctypes.c_uint64
        self.channels = cfg.hbm.channels
        self.channel_bytes = cfg.hbm.channel_mbytes << 20
        lat = cfg.hbm.latency_cycles if latency is None else latency
        bpc = cfg.hbm_channel_bytes_per_cycle if bytes_per_cycle is None else bytes_per_cycle
        self._sim = L.sim_new(self.channels, self.channel_bytes, lat, bpc, cfg.hbm.max_outstanding)
        if not self._sim:
            raise RuntimeError("could not create the simulated card (HBM images not allocated)")
        self.sim_cycles = 0

    def close(self):
        if getattr(self, "_sim", None):
            self._lib.sim_free(self._sim)
            self._sim = None

    def __del__(self):
        self.close()

    def write_hbm(self, channel, offset, data):
        data = np.ascontiguousarray(np.asarray(data, np.uint8).reshape(-1))
        self._check_span(channel, offset, len(data))
        self._lib.hbm_write(self._sim, channel, offset, data.ctypes.data, len(data))

    def read_hbm(self, channel, offset, nbytes):
        self._check_span(channel, offset, nbytes)
        out = np.empty(nbytes, np.uint8)
        self._lib.hbm_read(self._sim, channel, offset, out.ctypes.data, nbytes)
        return out

    def write_reg(self, addr, value):
        if self._lib.reg_write(self._sim, addr, value & 0xFFFFFFFF) != 0:
            raise DeviceError(f"register write to {addr:#x} got no response")

    def read_reg(self, addr):
        v = self._lib.reg_read(self._sim, addr)
        if v < 0:
            raise DeviceError(f"register read of {addr:#x} got no response")
        return int(v)

    def start(self):
        self.write_reg(regs.GIE, 1)
        self.write_reg(regs.IER, 1)
        self.write_reg(regs.CTRL, 1)

    def wait(self, timeout_s, *, chunk=200_000):
        """Clock until ap_done (interrupt); DeviceTimeout after ``timeout_s`` of wall time."""
        t0 = time.monotonic()
        while True:
            r = self._lib.run(self._sim, chunk)
            if r >= 0:
                break
            if time.monotonic() - t0 > timeout_s:
                raise DeviceTimeout(f"the card did not finish within {timeout_s:g} s "
                                    f"({self._lib.cycles(self._sim)} cycles simulated)")
        self.read_reg(regs.CTRL)          # clears ap_done
        self.write_reg(regs.ISR, 1)       # clears the interrupt (toggle on write)
        return self.read_reg(regs.COUNTERS["status"][0])
