# amaranth: UnusedElaboratable=no
"""The card in Verilator behind the Device interface, alone or N of them in a ring.

``build_card(cfg)`` emits the card's Verilog, generates the port bindings of the C++ harness
(sim/cpp/card_sim.cpp) for this config, and builds both into a shared library, cached by a
hash of everything that goes into it. ``RtlAppliance(cfg, cards)`` loads it with ctypes and
makes ``cards`` cards joined by link models (the config's link latency and line rate); its
``devices`` are ``RtlDevice`` views of one card each. HBM images go in and out by memcpy,
registers through AXI4-Lite transactions, and ``wait`` / ``run`` clock the models in C++ until
the kernels' interrupts rise. No Python runs per clock. ``RtlDevice(cfg)`` alone is a
one-card appliance.

``stalls=Stalls(...)`` turns on the models' seeded random flow control (off by default): ready
stalls on AR, AW and W, held-back R beats and B responses and extra response latency on every
AXI port of every card, and stalls of every link (sim/cpp/card_sim.cpp). A correct card gives
bit-identical results with and without them, only later.
"""

import ctypes
import hashlib
import json
import os
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from host.device import Device, DeviceError, DeviceTimeout
from hw import regs

from .toolchain import verilator_env, verilator_root

__all__ = ["build_card", "RtlDevice", "RtlAppliance", "Stalls"]

ROOT = Path(__file__).resolve().parent.parent
HARNESS = ROOT / "sim" / "cpp" / "card_sim.cpp"
COMMON = ROOT / "sim" / "cpp" / "sim_common.h"
LINT_VLT = ROOT / "gen" / "lint.vlt"
BUILD_ROOT = ROOT / "sim_build"

AXI_READ = ("arid", "araddr", "arlen", "arvalid", "arready", "rid", "rdata", "rresp", "rlast",
            "rvalid", "rready")
AXI_WRITE = ("awid", "awaddr", "awlen", "awvalid", "awready", "wdata", "wstrb", "wlast", "wvalid",
             "wready", "bid", "bresp", "bvalid", "bready")
LITE = ("awaddr", "awvalid", "awready", "wdata", "wstrb", "wvalid", "wready", "bresp", "bvalid",
        "bready", "araddr", "arvalid", "arready", "rdata", "rresp", "rvalid", "rready")


@dataclass(frozen=True)
class Stalls:
    """Random flow control of the Verilated cards' HBM and link models, from ``seed``.

    Attributes
    ----------
    ready : float
        Chance that ARREADY, AWREADY or WREADY of a port is held low in a cycle.
    valid : float
        Chance that an R beat or a B response that could go is held back a cycle.
    delay : int
        Each read burst's first beat and each write response come up to ``delay`` cycles
        later than the model's latency (uniform, in order).
    link : float
        Chance that a link refuses a sent beat (TREADY low) or withholds a delivered one
        (TVALID low) in a cycle, each direction of each link.
    seed : int
    """

    ready: float = 0.3
    valid: float = 0.3
    delay: int = 32
    link: float = 0.3
    seed: int = 1

    def __post_init__(self):
        for name in ("ready", "valid", "link"):
            v = getattr(self, name)
            if not 0 <= v < 1:
                raise ValueError(f"{name}: got {v!r}; allowed: a probability in [0, 1)")
        if not isinstance(self.delay, int) or self.delay < 0:
            raise ValueError(f"delay: got {self.delay!r}; allowed: cycles >= 0")


def _ports_header(ports):
    """C++ that binds the harness's Port structs to the Verilated top's members."""
    def ref(name):
        bits = ports[name]
        expr = f"s.top->{name}.data()" if bits > 64 else f"&s.top->{name}"
        return f"Port{{static_cast<void*>({expr}), {bits}}}"

    lines = ["static void bind(Card& s) {"]
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
    if "axis_r_tx_tdata" in ports:
        lines.append("    s.has_link = true;")
        lines.append(f"    s.link_beat = {ports['axis_r_tx_tdata'] // 8};")
        for side in "rl":
            for d in ("tx", "rx"):
                for sig in ("data", "last", "valid", "ready"):
                    lines.append(f"    s.{side}.{d}_{sig} = {ref(f'axis_{side}_{d}_t{sig}')};")
    lines.append("}")
    return "\n".join(lines) + "\n"


def _source_key(cfg, watchdog):
    """A hash of everything the card's Verilog and harness are made from: the config, the
    watchdog, every source file of hw/ and gen/, the harness and the tool versions."""
    import amaranth
    import verilator
    h = hashlib.sha256()
    h.update(f"{cfg.to_json()}|{watchdog}|{amaranth.__version__}|{verilator.__version__}".encode())
    files = sorted([*(ROOT / "hw").rglob("*.py"), *(ROOT / "gen").rglob("*.py"), HARNESS, COMMON,
                    LINT_VLT, Path(__file__)])
    for f in files:
        h.update(str(f.relative_to(ROOT)).encode())
        h.update(f.read_bytes())
    return h.hexdigest()[:24]


def build_card(cfg, *, log=None, watchdog=None):
    """Build (or reuse) the Verilated card of ``cfg``; returns (library path, built_now, seconds).

    Elaborating a card takes tens of seconds, so a build is also indexed by a hash of its
    sources (``_source_key``): an unchanged tree reuses the library without elaborating."""
    index = BUILD_ROOT / "card-index" / _source_key(cfg, watchdog)
    if index.exists():
        lib = Path(index.read_text())
        if lib.exists():
            return lib, False, 0.0
    lib, built, seconds = _build_card(cfg, log=log, watchdog=watchdog)
    index.parent.mkdir(parents=True, exist_ok=True)
    index.write_text(str(lib))
    return lib, built, seconds


def _build_card(cfg, *, log=None, watchdog=None):
    from gen.emit import port_table
    from gen.tops import VitisCard, top_key
    from gen.verilog import to_verilog

    kwargs = {} if watchdog is None else {"watchdog": watchdog}
    top = VitisCard(cfg, **kwargs)
    verilog = to_verilog(top, "card", cache_key=top_key("card", cfg, **kwargs))
    ports = {name: bits for name, _dir, bits in port_table(top)}
    header = _ports_header(ports)
    h = hashlib.sha256()
    for part in (verilog, header, HARNESS.read_text(), COMMON.read_text(), LINT_VLT.read_text()):
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
           "-CFLAGS", f"-fPIC -O1 -I{out} -I{COMMON.parent}", "-LDFLAGS", "-shared",
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


class RtlAppliance:
    """``cards`` Verilated cards of ``cfg`` on one clock, joined in a ring (module docstring).

    ``devices[i]`` drives card i; ``run`` runs one program per card together, as
    sim.ref.ring.IssRing does on the ISS.
    """

    def __init__(self, cfg, cards=1, *, lib=None, latency=None, bytes_per_cycle=None, watchdog=None,
                 seed=0, stalls=None):
        self.cfg, self.cards = cfg, cards
        if cards > 1 and not cfg.ring_links:
            raise ValueError(f"config {cfg.name!r} has cards: 1, so its card kernel has no ring links")
        if lib is None:
            lib, _, _ = build_card(cfg, watchdog=watchdog)
        self._lib = L = ctypes.CDLL(str(lib))
        L.sim_new.restype = ctypes.c_void_p
        L.sim_new.argtypes = [ctypes.c_int, ctypes.c_int, ctypes.c_uint64, ctypes.c_int, ctypes.c_double,
                              ctypes.c_int, ctypes.c_int, ctypes.c_double, ctypes.c_uint64]
        L.sim_free.argtypes = [ctypes.c_void_p]
        for f in (L.hbm_write, L.hbm_read):
            f.argtypes = [ctypes.c_void_p, ctypes.c_int, ctypes.c_int, ctypes.c_uint64, ctypes.c_void_p,
                          ctypes.c_uint64]
        L.reg_write.argtypes = [ctypes.c_void_p, ctypes.c_int, ctypes.c_uint32, ctypes.c_uint32]
        L.reg_read.argtypes = [ctypes.c_void_p, ctypes.c_int, ctypes.c_uint32]
        L.reg_read.restype = ctypes.c_int64
        L.run.argtypes = [ctypes.c_void_p, ctypes.c_uint64, ctypes.c_uint64]
        L.run.restype = ctypes.c_int64
        L.cycles.argtypes = [ctypes.c_void_p]
        L.cycles.restype = ctypes.c_uint64
        L.set_link.argtypes = [ctypes.c_void_p, ctypes.c_int, ctypes.c_int, ctypes.c_double, ctypes.c_double]
        L.link_stats.argtypes = [ctypes.c_void_p, ctypes.c_void_p]
        L.set_stalls.argtypes = [ctypes.c_void_p, ctypes.c_double, ctypes.c_double, ctypes.c_int,
                                 ctypes.c_double, ctypes.c_uint64]
        lat = cfg.hbm.latency_cycles if latency is None else latency
        bpc = cfg.hbm_channel_bytes_per_cycle if bytes_per_cycle is None else bytes_per_cycle
        self._sim = L.sim_new(cards, cfg.hbm.channels, cfg.hbm.channel_mbytes << 20, lat, bpc,
                              cfg.hbm.max_outstanding, cfg.link.latency_cycles, cfg.link_bytes_per_cycle,
                              seed)
        if not self._sim:
            raise RuntimeError("could not create the simulated cards (HBM images not allocated)")
        self.stalls = None
        if stalls is not None:
            self.set_stalls(stalls)
        self.devices = [RtlDevice(cfg, appliance=self, index=i) for i in range(cards)]

    def close(self):
        if getattr(self, "_sim", None):
            self._lib.sim_free(self._sim)
            self._sim = None

    def __del__(self):
        self.close()

    def set_stalls(self, stalls):
        """Random stalls (:class:`Stalls`) on every card's AXI ports and every link from now on;
        None turns them off."""
        st = Stalls(0.0, 0.0, 0, 0.0, 0) if stalls is None else stalls
        self._lib.set_stalls(self._sim, st.ready, st.valid, st.delay, st.link, st.seed)
        self.stalls = stalls

    def set_link(self, i, direction, *, ber=0.0, drop=0.0):
        """Faults on link right[i] (direction +1: card i -> i + 1) or left[i] (-1: i + 1 -> i)."""
        if self._lib.set_link(self._sim, i, 0 if direction > 0 else 1, ber, drop) != 0:
            raise ValueError(f"link {i} out of range 0..{self.cards - 1}")

    def link_stats(self):
        out = np.zeros(4, np.uint64)
        self._lib.link_stats(self._sim, out.ctypes.data)
        return dict(zip(("bad_crc_frames", "frames", "dropped", "flipped"), map(int, out), strict=True))

    def _clock_until(self, mask, timeout_s, what, chunk=200_000):
        t0 = time.monotonic()
        while self._lib.run(self._sim, mask, chunk) < 0:
            if time.monotonic() - t0 > timeout_s:
                raise DeviceTimeout(f"{what} did not finish within {timeout_s:g} s "
                                    f"({self._lib.cycles(self._sim)} cycles simulated)")

    def run(self, programs, prog_addr, *, timeout_s=600.0):
        """Load ``programs[i]`` into card i at ``prog_addr`` (one address or one per card), start
        every card and wait for all; returns the status words."""
        addrs = prog_addr if isinstance(prog_addr, (list, tuple)) else [prog_addr] * self.cards
        for i, (dev, words, addr) in enumerate(zip(self.devices, programs, addrs, strict=True)):
            dev.load_program(words, addr)
            dev.write_reg(regs.ARGS["card"][0], regs.card_register(
                i, self.cards, bidirectional=self.cfg.topology == "bidirectional_ring"))
        for dev in self.devices:
            dev.start()
        self._clock_until((1 << self.cards) - 1, timeout_s, f"the ring of {self.cards} cards")
        return [dev.finish() for dev in self.devices]


class RtlDevice(Device):
    """One card in Verilator: alone (``RtlDevice(cfg, ...)``, a one-card appliance), or card
    ``index`` of an ``RtlAppliance``."""

    def __init__(self, cfg, *, lib=None, latency=None, bytes_per_cycle=None, watchdog=None,
                 appliance=None, index=0, stalls=None):
        self.cfg = cfg
        if appliance is None:
            appliance = RtlAppliance(cfg, 1, lib=lib, latency=latency, bytes_per_cycle=bytes_per_cycle,
                                     watchdog=watchdog, stalls=stalls)
            self._own = appliance              # a one-card appliance lives as long as its device
        self._app, self.index = appliance, index
        self._lib = appliance._lib
        self.channels = cfg.hbm.channels
        self.channel_bytes = cfg.hbm.channel_mbytes << 20

    @property
    def _sim(self):
        return self._app._sim

    def close(self):
        if getattr(self, "_own", None):
            self._own.close()

    def write_hbm(self, channel, offset, data):
        data = np.ascontiguousarray(np.asarray(data, np.uint8).reshape(-1))
        self._check_span(channel, offset, len(data))
        self._lib.hbm_write(self._sim, self.index, channel, offset, data.ctypes.data, len(data))

    def read_hbm(self, channel, offset, nbytes):
        self._check_span(channel, offset, nbytes)
        out = np.empty(nbytes, np.uint8)
        self._lib.hbm_read(self._sim, self.index, channel, offset, out.ctypes.data, nbytes)
        return out

    def write_reg(self, addr, value):
        if self._lib.reg_write(self._sim, self.index, addr, value & 0xFFFFFFFF) != 0:
            raise DeviceError(f"register write to {addr:#x} got no response")

    def read_reg(self, addr):
        v = self._lib.reg_read(self._sim, self.index, addr)
        if v < 0:
            raise DeviceError(f"register read of {addr:#x} got no response")
        return int(v)

    def start(self):
        self.write_reg(regs.GIE, 1)
        self.write_reg(regs.IER, 1)
        self.write_reg(regs.CTRL, 1)

    def finish(self):
        """After the interrupt: clear ap_done and the interrupt; returns the status word."""
        self.read_reg(regs.CTRL)          # clears ap_done
        self.write_reg(regs.ISR, 1)       # clears the interrupt (toggle on write)
        return self.read_reg(regs.COUNTERS["status"][0])

    def wait(self, timeout_s, *, chunk=200_000):
        """Clock until ap_done (interrupt); DeviceTimeout after ``timeout_s`` of wall time."""
        self._app._clock_until(1 << self.index, timeout_s, "the card", chunk)
        return self.finish()


def run_card_collective(cfg, op, elements, *, cards, bidirectional=False, ber=0.0, drop=0.0,
                        dead_link=None, seed=0, lib=None, timeout_s=900.0, stalls=None):
    """One collective through the card kernels: a COLL on HBM (src and dst stripe rows) on each
    of ``cards`` Verilated cards of ``cfg``, on random fp32 inputs; the same figures, inputs,
    outputs and reference as sim.fabric.run_collective; ``stalls`` (:class:`Stalls`) jitters the
    cards' HBM and link models. Raises sim.fabric.LinkDead (figures attached) when the cards end
    with RING_ERROR (a link whose retries ran out)."""
    from host.stripes import read_stripes, write_stripes
    from hw.isa import ERROR_CODES, encode

    from .fabric import OPS, LinkDead, bandwidth
    from .progs import Layout
    from .ref import collective as ref
    run_cfg = cfg.replace(topology="bidirectional_ring" if bidirectional else "ring")
    if lib is None:
        lib, _, _ = build_card(cfg)
    app = RtlAppliance(run_cfg, cards, lib=lib, seed=seed, stalls=stalls)
    N, n, S = cards, elements, cfg.stripe_bytes
    W = cfg.link.data_bits // 32
    nb = -(-n // W)
    rng = np.random.default_rng(seed)
    vals = (rng.standard_normal((N, n)) * np.exp(rng.uniform(-2, 2, (N, n)))).astype(np.float32)
    inputs = vals.view(np.uint32)
    out_words = N * nb * W if op == "allgather" else nb * W
    src = Layout(cfg).dump_row + 4096                 # clear of the program and the test areas
    dst = src + -(-4 * n // S) + 16
    for i, dev in enumerate(app.devices):
        write_stripes(dev, cfg, src, inputs[i])
    for d in (+1, -1):
        for i in range(N):
            if ber or drop:
                app.set_link(i, d, ber=ber, drop=drop)
    if dead_link is not None:
        app.set_link(dead_link, +1, drop=1.0)
    prog = [encode("COLL", cop=OPS[op], src=src, dst=dst, n=n, hbm=1), encode("HALT")]
    t0 = time.monotonic()
    status = app.run([prog] * N, Layout(cfg).prog_addr, timeout_s=timeout_s)
    wall = time.monotonic() - t0
    counters = [dev.counters() for dev in app.devices]
    size = (N if op == "allgather" else 1) * n * 4
    fig = {"op": op, "cards": N, "elements": n, "dtype": "fp32", "bidirectional": bidirectional,
           "ber": ber, "drop": drop, "seed": seed, "through": "card kernels (COLL on HBM)",
           "cycles": int(max(c["cycles"] for c in counters)), "bytes": size,
           "retransmissions": sum(int(c["link_retx"]) for c in counters),
           "crc_errors": sum(int(c["link_crc_errors"]) for c in counters),
           "sim_seconds": round(wall, 3)}
    if any(st & 0xFF for st in status):
        fig["ok"] = False
        codes = {v: k for k, v in ERROR_CODES.items()}
        fig["error"] = ("a link is dead or a peer never arrived: the cards ended with "
                        + ", ".join(f"{codes.get(st & 0xFF, st & 0xFF)} at pc {st >> 8}" for st in status))
        app.close()
        err = LinkDead(fig["error"])
        err.figures = fig
        raise err
    outputs = []
    for i, dev in enumerate(app.devices):
        raw = read_stripes(dev, cfg, dst, -(-4 * out_words // S)).view(np.uint32)[:out_words]
        if op == "reducescatter":
            raw = ref.own_segments(raw, i, N, nb, W, bidirectional)
        outputs.append(raw)
    app.close()
    expect = ref.reference(op, inputs, W, bidirectional=bidirectional)
    ok = all(np.array_equal(o, e) for o, e in zip(outputs, expect, strict=True))
    fig.update({"ok": bool(ok), **bandwidth(cfg, op, N, size, fig["cycles"], bidirectional)})
    return fig, inputs, outputs, expect
