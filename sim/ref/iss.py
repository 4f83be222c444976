"""Instruction-set simulator of one card: the same programs, the same per-channel HBM images,
the same arithmetic (sim/ref/arith.py) as the RTL, executed in program order.

The RTL overlaps instructions through its scoreboard, but only where no result can change,
so executing them one after another gives bit for bit the same HBM contents, scratchpad
contents and status. The ISS has no clock: its cycle counters stay 0; its byte counters
count the same bytes as the RTL's.
"""

import numpy as np

from host.device import Device, DeviceError
from host.stripes import deinterleave, locate
from hw import regs
from hw.isa import ACC_DEPTH, ERROR_CODES, MAX_TOKENS, QGROUP, VOP_BY_CODE, VOPS, Insn, decode

from . import arith as A

__all__ = ["Iss", "IssDevice", "IssError"]

NEG_ZERO = np.uint32(0x80000000)
NEG_INF = np.uint32(0xFF800000)


class IssError(Exception):
    def __init__(self, name):
        super().__init__(name)
        self.code = ERROR_CODES[name]


def _overlap(a0, an, b0, bn):
    return a0 < b0 + bn and b0 < a0 + an


class Iss:
    """Executes programs on a card's state (HBM images, VSP, XB, weight FIFO)."""

    def __init__(self, cfg):
        self.cfg = cfg
        c = cfg.core
        self.C, self.B = cfg.hbm.channels, cfg.hbm_beat_bytes
        self.S = cfg.stripe_bytes
        self.L, self.W, self.P = c.lanes, c.width, c.vector_lanes
        self.rows = cfg.channel_rows
        self.hbm = [np.zeros(cfg.hbm.channel_mbytes << 20, np.uint8) for _ in range(self.C)]
        self.vsp = np.zeros(c.vsp_words, np.uint32)
        self.xb = np.zeros(c.xb_words, np.uint16)
        self.fifo = []          # tiles streamed and not yet consumed: [L, W] uint16 each
        self.red_max = cfg.reduce_max
        self.fifo_depth = c.weight_fifo_tiles
        self.counters = {name: 0 for name in regs.COUNTERS}

    # -- HBM stripes ------------------------------------------------------------------------
    def read_stripes(self, row, nrows):
        """Bytes of stripe rows [row, row + nrows) as one array (channel-interleaved)."""
        return deinterleave([h[row * self.B:(row + nrows) * self.B] for h in self.hbm], self.B)

    def write_stripe_bytes(self, rows, offs, data):
        """Write byte ``data[i]`` at stripe row ``rows[i]``, stripe byte ``offs[i]``."""
        ch, addr = locate(rows, offs, self.B)
        for c in range(self.C):
            sel = ch == c
            self.hbm[c][addr[sel]] = data[sel]

    # -- execution ------------------------------------------------------------------------
    def run(self, prog_addr, prog_len):
        """Run from ``prog_addr`` (channel 0 byte address); returns the status word.

        A card on its own has no ring: COLL is an illegal opcode, as on the card kernel."""
        gen = self.run_steps(prog_addr, prog_len)
        try:
            _insn = next(gen)
            while True:
                _insn = gen.throw(IssError("ILLEGAL_OPCODE"))
        except StopIteration as stop:
            return stop.value

    def run_steps(self, prog_addr, prog_len):
        """Generator form of ``run``: yields each COLL instruction for the ring to execute (or
        to throw an IssError into); returns the status word."""
        for k in self.counters:
            self.counters[k] = 0
        self.fifo = []
        pc = 0
        try:
            if prog_addr % 16:
                raise IssError("ALIGN")
            while True:
                if pc >= prog_len:
                    raise IssError("PROGRAM_OVERRUN")
                a = prog_addr + 16 * pc
                if a + 16 > len(self.hbm[0]):
                    raise IssError("AXI_ERROR")
                word = int.from_bytes(self.hbm[0][a:a + 16].tobytes(), "little")
                insn = decode(word)
                if insn.op == "HALT":
                    if self.fifo:
                        self.fifo = []
                        raise IssError("WEIGHT_LEFTOVER")
                    self.counters["insns"] += 1
                    return pc << 8
                if insn.op == "COLL":
                    yield insn
                else:
                    self.step(insn)
                self.counters["insns"] += 1
                pc += 1
        except IssError as e:
            self.fifo = []
            return (pc << 8) | e.code

    def step(self, i):
        op = i.op
        if op == "ILLEGAL" or op == "COLL":
            raise IssError("ILLEGAL_OPCODE")
        if op == "FENCE":
            return
        getattr(self, f"_{op.lower()}")(i)

    def _vsp_range(self, a, n):
        if a + n > len(self.vsp):
            raise IssError("VSP_RANGE")

    def _load(self, i):
        P, S = self.P, self.S
        if i.n == 0:
            raise IssError("BAD_FIELD")
        if i.vsp % P:
            raise IssError("ALIGN")
        self._vsp_range(i.vsp, i.n)
        z = 4 if i.f32 else 2
        nrows = -(-z * i.n // S)
        if i.row + nrows > self.rows:
            raise IssError("HBM_RANGE")
        raw = self.read_stripes(i.row, nrows)[:z * i.n]
        self.vsp[i.vsp:i.vsp + i.n] = raw.view(np.uint32) if i.f32 else A.fp16_to_fp32(raw.view(np.uint16))
        self.counters["hbm_rd_bytes"] += nrows * S

    def _store(self, i):
        P, S = self.P, self.S
        n, epg, gpr = i.n, 1 << i.lepg, 1 << i.lgpr
        z = 4 if i.f32 else 2
        if (n == 0 or i.off % z or i.gstride % z
                or i.off + (gpr - 1) * i.gstride + z * epg > S
                or (gpr > 1 and i.gstride < z * epg)):
            raise IssError("BAD_FIELD")
        ngroups = -(-n // epg)
        nrows = -(-ngroups // gpr)
        if nrows > 1 and i.rstride == 0:
            raise IssError("BAD_FIELD")
        if i.vsp % P:
            raise IssError("ALIGN")
        self._vsp_range(i.vsp, n)
        if i.row + (nrows - 1) * i.rstride >= self.rows:
            raise IssError("HBM_RANGE")
        idx = np.arange(n)
        g, e = idx // epg, idx % epg
        rows = i.row + (g // gpr) * i.rstride
        offs = i.off + (g % gpr) * i.gstride + z * e
        words = self.vsp[i.vsp:i.vsp + n]
        h = (words if i.f32 else A.fp32_to_fp16(words)).view(np.uint8).reshape(n, z)
        self.write_stripe_bytes(np.repeat(rows, z), (offs[:, None] + np.arange(z)).reshape(-1),
                                h.reshape(-1))
        self.counters["hbm_wr_bytes"] += z * n

    def _wload(self, i):
        if i.tiles == 0:
            raise IssError("BAD_FIELD")
        if i.row + i.tiles > self.rows:
            raise IssError("HBM_RANGE")
        if len(self.fifo) + i.tiles > self.fifo_depth:
            raise IssError("WEIGHT_OVERFLOW")
        data = self.read_stripes(i.row, i.tiles).view(np.uint16).reshape(i.tiles, self.L, self.W)
        self.fifo.extend(data)
        self.counters["hbm_rd_bytes"] += i.tiles * self.S

    def _matvec(self, i):
        W, P = self.W, self.P
        # the addresses in words (the fields are rows of width XB words, vector_lanes VSP words)
        i = Insn(i.op, {**i.fields, "xb": i.xb * W, "xstride": i.xstride * W, "dst": i.dst * P,
                        "bias": i.bias * P, "dstride": i.dstride * P})
        # i8: integer weight tiles of the build's core.weight_dtype (int8: 2L rows, int16: L)
        i8 = bool(i.i8)
        qt = np.dtype(self.cfg.core.weight_dtype) if self.cfg.core.int_weights else None
        L = self.cfg.core.tile_rows if i8 else self.L      # rows of a tile
        rb, cb, grp, T = i.rb, i.cb, i.group, i.tokens
        if (rb == 0 or cb == 0 or grp == 0 or not 1 <= T <= MAX_TOKENS or grp * T > ACC_DEPTH
                or (T > 1 and i.dstride < rb * L)
                or (i8 and (qt is None or i.tt or grp * L > self.S or grp > QGROUP))):
            raise IssError("BAD_FIELD")
        btok = bool(i.bias_en and i.btok)         # a bias per token, at the output's stride
        bspan = (T - 1) * i.dstride + rb * L if btok else rb * L
        if i.bias_en and not ((T == 1 or btok) and i.bias == i.dst):
            if _overlap(i.bias, bspan, i.dst, (T - 1) * i.dstride + rb * L):
                raise IssError("OVERLAP")
        self._vsp_range(i.dst + (T - 1) * i.dstride, rb * L)
        if i.bias_en:
            self._vsp_range(i.bias, bspan)
        if i.xb + (T - 1) * i.xstride + cb * W > len(self.xb):
            raise IssError("XB_RANGE")
        need = rb * cb + (-(-rb // grp) if i8 else 0)
        if need > len(self.fifo):
            raise IssError("WEIGHT_UNDERFLOW")
        tiles = self.fifo[:need]
        del self.fifo[:need]
        if i.tt:            # stored column-major: element (r, c) at c * L + r
            tiles = [t.reshape(W, L).T for t in tiles]
        if i8:
            # each group: a stripe row of its rows' scale exponents, then its tiles (L rows
            # of W integer weights, row-major; int16 little-endian)
            e = np.empty((rb, L), np.uint8)
            rest = []
            for g0 in range(0, rb, grp):
                gs = min(grp, rb - g0)
                e[g0:g0 + gs] = tiles[0].view(np.uint8).reshape(-1)[:gs * L].reshape(gs, L)
                rest += tiles[1:1 + gs * cb]
                tiles = tiles[1 + gs * cb:]
            tiles = [t.view(qt.newbyteorder("<")).reshape(L, W) for t in rest]
        # Tile k of the stream is (row block r, column block c) in group-major order.
        w = np.empty((rb, cb, L, W), qt if i8 else np.uint16)
        k = 0
        for g0 in range(0, rb, grp):
            gs = min(grp, rb - g0)
            for c in range(cb):
                for r in range(g0, g0 + gs):
                    w[r, c] = tiles[k]
                    k += 1
        x = np.stack([self.xb[i.xb + t * i.xstride:i.xb + t * i.xstride + cb * W].reshape(cb, W)
                      for t in range(T)])                                   # [T, cb, W]
        acc = None
        for c in range(cb):
            if i8:
                part = A.int_dot(w[None, :, c, :, :], x[:, None, c, None, :], e[None])  # [T, rb, L]
            else:
                part = A.bfp_dot(w[None, :, c, :, :], x[:, None, c, None, :])        # [T, rb, L]
            if c == 0:
                if btok:
                    bias = np.stack([self.vsp[i.bias + t * i.dstride:i.bias + t * i.dstride + rb * L]
                                     for t in range(T)]).reshape(T, rb, L)
                    acc = A.fp32_add(bias, part)
                elif i.bias_en:
                    bias = self.vsp[i.bias:i.bias + rb * L].reshape(rb, L)
                    acc = A.fp32_add(bias[None], part)
                else:
                    acc = part
            else:
                acc = A.fp32_add(acc, part)
        for t in range(T):
            d = i.dst + t * i.dstride
            self.vsp[d:d + rb * L] = acc[t].reshape(-1)

    def _vec(self, i):
        P = self.P
        name = VOP_BY_CODE.get(i.vop)
        if name is None:
            raise IssError("ILLEGAL_OPCODE")
        n = i.n
        binary = VOPS[name][1] == 2
        reduce = name in ("REDSUM", "REDMAX")
        cvt = name == "CVT16"
        if n == 0 or (reduce and n > self.red_max) or (i.x16 and (reduce or cvt)):
            raise IssError("BAD_FIELD")
        if (i.src1 % P or (binary and not i.bcast and i.src2 % P) or (not reduce and i.dst % P)
                or (i.x16 and i.xdst % P)):
            raise IssError("ALIGN")
        if not reduce and not cvt:
            if _overlap(i.dst, n, i.src1, n) and i.dst != i.src1:
                raise IssError("OVERLAP")
            if binary:
                if i.bcast and _overlap(i.dst, n, i.src2, 1):
                    raise IssError("OVERLAP")
                if not i.bcast and _overlap(i.dst, n, i.src2, n) and i.dst != i.src2:
                    raise IssError("OVERLAP")
        self._vsp_range(i.src1, n)
        if binary:
            self._vsp_range(i.src2, 1 if i.bcast else n)
        if cvt:
            if i.dst + n > len(self.xb):
                raise IssError("XB_RANGE")
        else:
            self._vsp_range(i.dst, 1 if reduce else n)
        if i.x16 and i.xdst + n > len(self.xb):
            raise IssError("XB_RANGE")

        a = self.vsp[i.src1:i.src1 + n]
        b = None
        if binary:
            b = np.full(n, self.vsp[i.src2], np.uint32) if i.bcast else self.vsp[i.src2:i.src2 + n]
        if cvt:
            self.xb[i.dst:i.dst + n] = A.fp32_to_fp16(a)
            return
        if reduce:
            self.vsp[i.dst] = self.reduce(a, name)
            return
        out = {
            "ADD": lambda: A.fp32_add(a, b),
            "SUB": lambda: A.fp32_add(a, b ^ NEG_ZERO),
            "MUL": lambda: A.fp32_mul(a, b),
            "MAX": lambda: A.fp32_max(a, b),
            "MOV": lambda: a.copy(),
            "EXP": lambda: A.exp(a),
            "RECIP": lambda: A.recip(a),
            "RSQRT": lambda: A.rsqrt(a),
            "GELU": lambda: A.gelu(a),
            "MASK": lambda: np.where(np.arange(n) <= i.k, a, NEG_INF).astype(np.uint32),
        }[name]()
        self.vsp[i.dst:i.dst + n] = out
        if i.x16:
            self.xb[i.xdst:i.xdst + n] = A.fp32_to_fp16(out)

    def reduce(self, a, name):
        """Row halving over rows of P lanes (the odd middle row meets the identity), then a
        pairwise tree across the P lanes."""
        P = self.P
        op, ident = (A.fp32_add, NEG_ZERO) if name == "REDSUM" else (A.fp32_max, NEG_INF)
        rows = -(-len(a) // P)
        x = np.full(rows * P, ident, np.uint32)
        x[:len(a)] = a
        x = x.reshape(rows, P)
        while True:
            h = -(-rows // 2)
            x = op(x[:h], np.concatenate([x[h:rows], np.full((2 * h - rows, P), ident, np.uint32)]))
            rows = h
            if rows == 1:
                break
        v = x[0]
        while len(v) > 1:
            v = op(v[:len(v) // 2], v[len(v) // 2:])
        return v[0]


class IssDevice(Device):
    """The ISS behind the Device interface: start() runs the program to completion."""

    def __init__(self, cfg):
        self.cfg = cfg
        self.iss = Iss(cfg)
        self.channels = cfg.hbm.channels
        self.channel_bytes = cfg.hbm.channel_mbytes << 20
        self._regs = {}
        self._done = False

    def write_hbm(self, channel, offset, data):
        data = np.asarray(data, np.uint8).reshape(-1)
        self._check_span(channel, offset, len(data))
        self.iss.hbm[channel][offset:offset + len(data)] = data

    def read_hbm(self, channel, offset, nbytes):
        self._check_span(channel, offset, nbytes)
        return self.iss.hbm[channel][offset:offset + nbytes].copy()

    def write_reg(self, addr, value):
        self._regs[addr] = value & 0xFFFFFFFF

    def read_reg(self, addr):
        if addr == regs.CTRL:
            return (0x2 | 0x4) if self._done else 0x4
        for name, (base, _doc) in regs.COUNTERS.items():
            if addr in (base, base + 4):
                v = self.iss.counters.get(name, 0) if name != "status" else self._status
                return (v >> (32 * (addr - base) // 4)) & 0xFFFFFFFF
        return self._regs.get(addr, 0)

    _status = 0

    def start(self):
        prog_addr = self.read_reg64(regs.ARGS["prog_addr"][0])
        prog_len = self.read_reg(regs.ARGS["prog_len"][0])
        self._status = self.iss.run(prog_addr, prog_len)
        self._done = True

    def wait(self, timeout_s):
        if not self._done:
            raise DeviceError("wait() before start()")
        return self._status
