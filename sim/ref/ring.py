"""N cards' ISSs joined in a ring: COLL instructions executed across all of them.

Each card runs its own program (sim/ref/iss.py) until its next COLL; when every card has
reached one, and they agree (same cop and n), the collective runs on their scratchpads (or,
for a COLL with hbm, on that card's HBM rows: each card's own choice) with
the arithmetic and reduction order of sim/ref/collective.py, and every card goes on. A card
that ends (HALT or an error) while others wait, or peers that disagree, end the waiting cards
with RING_ERROR. The byte counters count the link traffic the ring schedule sends.
"""

import numpy as np

from hw import regs
from hw.isa import program_bytes
from hw.ring import OP_NAMES, beats, parts, segments

from . import arith as A
from . import collective as ref
from .iss import IssDevice, IssError

__all__ = ["IssRing"]


class IssRing:
    """``cards`` ISS devices (``.devices``) for ``cfg``, run together by ``run``."""

    def __init__(self, cfg, cards=None):
        self.cfg = cfg
        self.N = cards or cfg.cards
        self.devices = [IssDevice(cfg) for _ in range(self.N)]
        self.B = cfg.link.data_bits // 32
        self.bidirectional = cfg.topology == "bidirectional_ring"

    def run(self, programs, prog_addr, *, timeout_s=None):
        """Load ``programs[i]`` into card i at ``prog_addr`` (one address, or one per card) and
        run them all; returns the status words. Counters are read from each device as after a
        run. (``timeout_s`` is for the RTL ring's interface: the ISS always ends.)"""
        gens, status, waiting = [], [None] * self.N, [None] * self.N
        addrs = prog_addr if isinstance(prog_addr, (list, tuple)) else [prog_addr] * self.N
        for dev, words, prog_addr in zip(self.devices, programs, addrs, strict=True):
            dev.write_hbm(0, prog_addr, np.frombuffer(program_bytes(words), np.uint8))
            dev.write_reg64(regs.ARGS["prog_addr"][0], prog_addr)
            dev.write_reg(regs.ARGS["prog_len"][0], len(words))
            gens.append(dev.iss.run_steps(prog_addr, len(words)))

        def resume(i, exc=None):
            try:
                waiting[i] = gens[i].throw(exc) if exc else next(gens[i])
            except StopIteration as stop:
                waiting[i], status[i] = None, stop.value

        for i in range(self.N):
            resume(i)
        while any(w is not None for w in waiting):
            live = [w for w in waiting if w is not None]
            agree = (len(live) == self.N and
                     len({(w.fields["cop"], w.fields["n"]) for w in live}) == 1)
            if not agree:
                for i in range(self.N):
                    if waiting[i] is not None:
                        resume(i, IssError("RING_ERROR"))
                continue
            errors = self._collective(waiting)
            for i in range(self.N):
                resume(i, errors[i])
        for dev, st in zip(self.devices, status, strict=True):
            dev._status, dev._done = st, True
        return status

    def _collective(self, insns):
        """Execute one COLL on every card; returns a per-card IssError or None."""
        N, B = self.N, self.B
        f0 = insns[0].fields
        op, n = OP_NAMES.get(f0["cop"]), f0["n"]
        errors = [None] * N
        if op is None:
            return [IssError("ILLEGAL_OPCODE")] * N
        if n == 0:
            return [IssError("BAD_FIELD")] * N
        nb = beats(n, B)
        out_words = N * nb * B if op == "allgather" else nb * B
        P = self.cfg.core.vector_lanes
        iss0 = self.devices[0].iss
        S = iss0.S
        rows_in, rows_out = -(-4 * n // S), -(-4 * out_words // S)
        for i, insn in enumerate(insns):
            src, dst = insn.fields["src"], insn.fields["dst"]
            x16, xdst = insn.fields["x16"], insn.fields["xdst"]
            vsp = self.devices[i].iss.vsp
            if x16 and (insn.fields["hbm"] or op != "allreduce"):
                errors[i] = IssError("BAD_FIELD")
            elif insn.fields["hbm"]:
                if src + rows_in > iss0.rows or dst + rows_out > iss0.rows:
                    errors[i] = IssError("HBM_RANGE")
                elif src != dst and src < dst + rows_out and dst < src + rows_in:
                    errors[i] = IssError("OVERLAP")
            elif src % P or dst % P or (x16 and xdst % P):
                errors[i] = IssError("ALIGN")
            elif src + n > len(vsp) or dst + out_words > len(vsp):
                errors[i] = IssError("VSP_RANGE")
            elif x16 and xdst + out_words > len(self.devices[i].iss.xb):
                errors[i] = IssError("XB_RANGE")
            elif src != dst and src < dst + out_words and dst < src + n:
                errors[i] = IssError("OVERLAP")
        if any(errors):
            return [e or IssError("RING_ERROR") for e in errors]

        def read(iss, src, hbm):
            if hbm:
                return iss.read_stripes(src, rows_in)[:4 * n].view(np.uint32)
            return iss.vsp[src:src + n]

        def write(iss, dst, hbm, w0, words):
            """out[w0 : w0 + len(words)] = words"""
            if hbm:
                off = 4 * (dst * S // 4 + w0) + np.arange(4 * len(words))
                iss.write_stripe_bytes(off // S, off % S, np.ascontiguousarray(words).view(np.uint8))
            else:
                iss.vsp[dst + w0:dst + w0 + len(words)] = words

        inputs = np.stack([read(d.iss, insn.fields["src"], insn.fields["hbm"])
                           for d, insn in zip(self.devices, insns, strict=True)])
        outs = ref.reference(op, inputs, B, bidirectional=self.bidirectional)
        halves = parts(nb, self.bidirectional)
        for i, (dev, insn) in enumerate(zip(self.devices, insns, strict=True)):
            dst, hbm = insn.fields["dst"], insn.fields["hbm"]
            if op == "reducescatter":
                k = 0
                for p0, pb, _d in halves:
                    s0, sb = segments(pb, N)[i]
                    write(dev.iss, dst, hbm, (p0 + s0) * B, outs[i][k:k + sb * B])
                    k += sb * B
            else:
                write(dev.iss, dst, hbm, 0, outs[i])
                if insn.fields["x16"]:          # (an all-reduce in the VSP: checked above)
                    xdst = insn.fields["xdst"]
                    dev.iss.xb[xdst:xdst + len(outs[i])] = A.fp32_to_fp16(outs[i])
            dev.iss.counters["link_tx_bytes"] += self._sent_beats(op, i, nb) * B * 4
            # received: the right-hand ring's part from card i - 1, the left-hand's from i + 1
            rx = sum(self._sent_beats(op, (i - d) % N, nb, only=d) for d in (+1, -1))
            dev.iss.counters["link_rx_bytes"] += rx * B * 4
        return errors

    def _sent_beats(self, op, i, nb, only=None):
        """Beats card i sends in the ring schedule (both directions together, or direction
        ``only``: +1 the right-hand ring, -1 the left-hand one)."""
        N, total = self.N, 0
        for _p0, pb, d in parts(nb, self.bidirectional):
            if only is not None and d != only:
                continue
            seg = segments(pb, N)
            if op == "allgather":
                total += (N - 1) * pb
                continue
            total += pb - seg[i][1]                          # reduce-scatter: all but its own
            if op == "allreduce":
                total += pb - seg[(i + d) % N][1]            # all-gather: all but the next's
        return total
