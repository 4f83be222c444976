"""Random valid programs for the RTL-against-ISS proof, and the HBM images they run on.

Every program draws from every instruction type with random fields inside the ISA's rules
(alignment, no partial overlaps, group x tokens <= 64, no LOAD while tiles are pending, ...),
and ends by storing the whole VSP as raw fp32 to HBM, so that comparing the HBM images of
the ISS and the RTL after the run compares every value the program produced.
"""

import numpy as np

from hw.isa import ACC_DEPTH, MAX_TOKENS, QGROUP, encode

__all__ = ["Layout", "ProgramGen", "random_hbm", "write_image", "snapshot", "compare_runs",
           "covered", "fresh_pair", "random_programs"]


class Layout:
    """Where things live in HBM (stripe rows) for the random programs."""

    def __init__(self, cfg):
        self.cfg = cfg
        self.S = cfg.stripe_bytes
        self.data_rows = (0, 64)          # random fp16 vectors for LOAD
        self.tile_rows = (64, 320)        # random weight tiles for WLOAD
        # int8 and int16 builds: integer tiles (random, uniform, with zeros and the extremes)
        # and rows of scale exponents near 2^0 (with a few extremes) for MATVEC.i8
        self.int_weights = cfg.core.int_weights
        self.qtype = (np.dtype(cfg.core.weight_dtype).newbyteorder("<") if self.int_weights
                      else None)
        self.i8_rows = (192, 320)
        self.scale_rows = (320, 352)
        self.out_rows = (512, 768)        # STORE targets
        vsp_bytes = cfg.core.vsp_words * 4
        self.dump_row = 1024              # the final raw VSP dump
        self.dump_rows = -(-vsp_bytes // self.S)
        self.prog_addr = (self.dump_row + self.dump_rows + 16) * cfg.hbm_beat_bytes


def _ceil(a, b):
    return -(-a // b)


def random_hbm(cfg, rng, layout):
    """Random fp16 contents for the data and tile rows (mostly moderate values, some specials);
    with integer weights, integer tiles and scale rows in theirs (``Layout``)."""
    rows = layout.scale_rows[1] if layout.int_weights else layout.tile_rows[1]
    n = rows * layout.S // 2
    vals = (rng.standard_normal(n) * np.exp(rng.uniform(-3, 2, n))).astype(np.float16)
    bits = vals.view(np.uint16).copy()
    special = rng.random(n) < 0.002
    bits[special] = rng.choice(np.array([0x0000, 0x8000, 0x7C00, 0xFC00, 0x7E00, 0x0001, 0x03FF,
                                         0x7BFF], np.uint16), special.sum())
    if layout.int_weights:
        b = bits.view(np.uint8)
        S = layout.S
        lo, hi = (r * S for r in layout.i8_rows)
        qt = layout.qtype
        info = np.iinfo(qt)
        k = (hi - lo) // qt.itemsize
        q = rng.integers(info.min, info.max + 1, k).astype(qt)
        q[rng.random(k) < 0.05] = 0
        q[rng.random(k) < 0.01] = info.min
        q[rng.random(k) < 0.01] = info.max
        b[lo:hi] = q.view(np.uint8)
        lo, hi = (r * S for r in layout.scale_rows)
        e = rng.integers(110, 141, hi - lo).astype(np.uint8)
        ext = rng.random(hi - lo) < 0.01
        e[ext] = rng.choice(np.array([0, 1, 254, 255], np.uint8), ext.sum())
        b[lo:hi] = e
    return bits


def write_image(cfg, lay, img, devs):
    """The random programs' HBM image ``img`` into every device, their output rows cleared."""
    from host.stripes import write_stripes
    for d in devs:
        write_stripes(d, cfg, 0, img)
        write_stripes(d, cfg, lay.out_rows[0], np.zeros((lay.out_rows[1] - lay.out_rows[0]) * lay.S,
                                                        np.uint8))
        write_stripes(d, cfg, lay.dump_row, np.zeros(lay.dump_rows * lay.S, np.uint8))


def snapshot(dev, cfg, lay):
    """What a random program leaves: its STOREs' rows and the VSP dump."""
    from host.stripes import read_stripes
    return np.concatenate([read_stripes(dev, cfg, lay.out_rows[0], lay.out_rows[1] - lay.out_rows[0]),
                           read_stripes(dev, cfg, lay.dump_row, lay.dump_rows)])


def compare_runs(cfg, lay, iss, rtl, prog, prog_addr=None):
    """Run ``prog`` on the ISS and on the card: the same status, counters and HBM outputs
    (AssertionError naming the first difference); returns the card's figures."""
    res = []
    for d in (iss, rtl):
        c = d.run(prog, lay.prog_addr if prog_addr is None else prog_addr, timeout_s=120)
        res.append((c, snapshot(d, cfg, lay)))
    (ci, si), (cr, sr) = res
    assert ci["status"] == cr["status"], f"status: iss {ci['status']:#x}, rtl {cr['status']:#x}"
    for k in ("hbm_rd_bytes", "hbm_wr_bytes", "insns"):
        assert ci[k] == cr[k], f"counter {k}: iss {ci[k]}, rtl {cr[k]}"
    diff = np.nonzero(si != sr)[0]
    assert len(diff) == 0, f"{len(diff)} HBM bytes differ, first at {diff[:8]}"
    return cr


def covered(prog, cfg=None):
    """What a program exercises: each opcode, VEC.<vop>, MATVEC.btok (a bias per token over
    several tokens), MATVEC.i8 (int8 tiles), MATVEC.i8.btok and MATVEC.i8.tokens (over
    several tokens); with ``cfg``, STORE.rows (a STORE the store engine takes a VSP row a
    cycle, hw.isa.store_row_mode), STORE.rows.f32 and STORE.rows.partial (its last row
    part of a VSP row)."""
    from hw.isa import decode, store_row_mode
    out = set()
    for w in prog:
        d = decode(w)
        out.add(d.op + (f".{d.vop}" if d.op == "VEC" else ""))
        if d.op == "STORE" and cfg is not None:
            P = cfg.core.vector_lanes
            if store_row_mode(d.f32, d.lepg, d.off, d.gstride, P, cfg.hbm_beat_bytes):
                out |= ({"STORE.rows"} | ({"STORE.rows.f32"} if d.f32 else set())
                        | ({"STORE.rows.partial"} if d.n % P else set()))
        if d.op != "MATVEC":
            continue
        multi, btok = d.tokens > 1, d.btok and d.bias_en and d.tokens > 1
        if btok:
            out.add("MATVEC.btok")
        if d.i8:
            out |= {"MATVEC.i8"} | ({"MATVEC.i8.btok"} if btok else set()) | (
                {"MATVEC.i8.tokens"} if multi else set())
    return out


def fresh_pair(cfg, rtl, seed):
    """A new ISS beside the card ``rtl``, both given the random image of ``seed``: (the
    Layout, the seeded generator that drew the image, the ISS)."""
    from sim.ref.iss import IssDevice
    lay = Layout(cfg)
    rng = np.random.default_rng(seed)
    iss = IssDevice(cfg)
    write_image(cfg, lay, random_hbm(cfg, rng, lay), (iss, rtl))
    return lay, rng, iss


def random_programs(cfg, rtl, seed, n):
    """``n`` random valid programs on a new ISS and on the card ``rtl`` (from a new random
    image), each compared (``compare_runs``; AssertionError naming the program and the seed),
    each ending with status OK; returns what they covered (``covered``)."""
    lay, rng, iss = fresh_pair(cfg, rtl, seed)
    gen = ProgramGen(cfg, rng, lay)
    ops = set()
    for k in range(n):
        prog = gen.program(int(rng.integers(5, 40)))
        ops |= covered(prog, cfg)
        try:
            c = compare_runs(cfg, lay, iss, rtl, prog)
        except AssertionError as e:
            raise AssertionError(f"program {k} (seed {seed}): {e}") from None
        assert c["status"] & 0xFF == 0, f"program {k} (seed {seed}): status {c['status']:#x}"
    return ops


class ProgramGen:
    """Random valid programs for one config."""

    def __init__(self, cfg, rng, layout):
        c = cfg.core
        self.cfg, self.rng, self.lay = cfg, rng, layout
        self.P, self.L, self.W = c.vector_lanes, c.lanes, c.width
        self.VW, self.XW = c.vsp_words, c.xb_words
        self.S = cfg.stripe_bytes
        self.red_max = cfg.reduce_max
        self.vlimit = min(self.VW, 4096)   # keep programs in the first part of the VSP

    def _aligned(self, n, align, limit):
        top = (limit - n) // align
        return int(self.rng.integers(0, top + 1)) * align

    def _disjoint(self, n, align, taken, limit):
        for _ in range(100):
            a = self._aligned(n, align, limit)
            if all(a + n <= b or b + bn <= a for b, bn in taken):
                return a
        return None

    def load(self):
        r = self.rng
        n = int(r.integers(1, 300))
        f32 = int(r.random() < 0.25)
        nrows = -(-(4 if f32 else 2) * n // self.S)
        row = int(r.integers(self.lay.data_rows[0], self.lay.data_rows[1] - nrows + 1))
        return [encode("LOAD", vsp=self._aligned(n, self.P, self.vlimit), n=n, row=row, f32=f32)]

    def vec(self):
        r = self.rng
        from hw.isa import VOPS
        name = str(r.choice(list(VOPS)))
        _, arity, _ = VOPS[name]
        red = name in ("REDSUM", "REDMAX")
        n = int(r.integers(1, (self.red_max if red else 200) + 1))
        src1 = self._aligned(n, self.P, self.vlimit)
        f = {"vop": name, "src1": src1, "n": n}
        if name == "MASK":
            f["k"] = int(r.integers(0, n + 4))
        if red:
            f["dst"] = int(r.integers(0, self.vlimit))
            return [encode("VEC", **f)]
        if name == "CVT16":
            f["dst"] = self._aligned(n, self.P, self.XW)
            return [encode("VEC", **f)]
        taken = [(src1, n)]
        if arity == 2:
            if r.random() < 0.3:
                f["bcast"] = 1
                f["src2"] = int(r.integers(0, self.vlimit))
                taken.append((f["src2"], 1))
            else:
                f["src2"] = src1 if r.random() < 0.2 else self._aligned(n, self.P, self.vlimit)
        if r.random() < 0.25 and not (f.get("bcast") and src1 <= f["src2"] < src1 + n):
            dst = src1
            if arity == 2 and not f.get("bcast") and f["src2"] != dst and \
                    not (f["src2"] + n <= dst or dst + n <= f["src2"]):
                f["src2"] = dst
        else:
            if arity == 2 and not f.get("bcast"):
                taken.append((f["src2"], n))
            dst = self._disjoint(n, self.P, taken, self.vlimit)
            if dst is None:
                return []
        f["dst"] = dst
        if r.random() < 0.3:          # the result to XB as fp16 too
            f["x16"], f["xdst"] = 1, self._aligned(n, self.P, self.XW)
        return [encode("VEC", **f)]

    def matvec(self):
        r = self.rng
        L, W, P = self.L, self.W, self.P
        i8 = self.lay.int_weights and r.random() < 0.5   # integer tiles: tile_rows a row block
        if i8:
            L = self.cfg.core.tile_rows
        rb, cb = int(r.integers(1, 7)), int(r.integers(1, 5))
        T = int(r.choice([1, 1, 1, 2, 3, 8, 13, MAX_TOKENS]))
        group = int(r.integers(1, min(8, ACC_DEPTH // T, min(self.S // L, QGROUP) if i8 else 8) + 1))
        xstride = W * int(r.integers(cb, cb + 3)) if T > 1 else 0
        xspan = (T - 1) * xstride + cb * W
        xb = self._aligned(xspan, W, self.XW)
        dstride = P * int(r.integers(-(-rb * L // P), -(-rb * L // P) + 3)) if T > 1 else 0
        dspan = (T - 1) * dstride + rb * L
        dst = self._aligned(dspan, P, self.vlimit)
        f = {"xb": xb, "dst": dst, "rb": rb, "cb": cb, "group": group, "tokens": T,
             "xstride": xstride, "dstride": dstride, "tt": int(not i8 and r.random() < 0.3),
             "i8": int(i8)}
        if r.random() < 0.5:
            btok = T > 1 and r.random() < 0.4      # a bias per token, at the output's stride
            if (T == 1 or btok) and r.random() < 0.3:
                f["bias"] = dst
            else:
                b = self._disjoint(dspan if btok else rb * L, P, [(dst, dspan)], self.vlimit)
                if b is None:
                    return []
                f["bias"] = b
            f["bias_en"], f["btok"] = 1, int(btok)
        tiles = rb * cb
        out = []
        if i8:
            # each group: its row of scales, then its tiles (integer rows, or now and then
            # any bytes of the fp16 rows)
            for g0 in range(0, rb, group):
                n = min(group, rb - g0) * cb
                row = int(r.integers(*self.lay.scale_rows))
                out.append(encode("WLOAD", row=row, tiles=1))
                lo, hi = self.lay.i8_rows if r.random() < 0.8 else self.lay.tile_rows
                row = int(r.integers(lo, hi - n + 1))
                out.append(encode("WLOAD", row=row, tiles=n))
            tiles = 0
        # Stream the tiles in one or two WLOADs; vector work may sit between them and the MATVEC.
        first = int(r.integers(1, tiles + 1)) if tiles > 1 and r.random() < 0.3 else tiles
        for count in (first, tiles - first):
            if count:
                row = int(r.integers(self.lay.tile_rows[0], self.lay.tile_rows[1] - count + 1))
                out.append(encode("WLOAD", row=row, tiles=count))
        if r.random() < 0.5:
            out += self.vec()
        for k, unit in (("xb", W), ("xstride", W), ("dst", P), ("dstride", P), ("bias", P)):
            f[k] = f.get(k, 0) // unit                # (MATVEC's addresses are rows)
        out.append(encode("MATVEC", **f))
        return out

    def store(self):
        r = self.rng
        f32 = int(r.random() < 0.3)
        z = 4 if f32 else 2
        kind = r.random()
        S = self.S
        if kind < 0.3:      # linear
            lepg, lgpr, off, gstride = (S // z).bit_length() - 1, 0, 0, 0
        elif kind < 0.5:    # K-cache style: width-element groups, one lane of a tile
            lepg, lgpr = (self.W).bit_length() - 1, 0
            off, gstride = int(r.integers(0, S // (z * self.W))) * z * self.W, 0
        elif kind < 0.65:   # V-cache style: lanes-element groups (a tile's column), a row apart
            lepg, lgpr = (self.L).bit_length() - 1, 0
            off, gstride = int(r.integers(0, S // (z * self.L))) * z * self.L, 0
        else:               # V^T style or random: small groups spread over the stripe
            lepg = int(r.integers(0, 3))
            epg = 1 << lepg
            lgpr = int(r.integers(0, 4))
            gpr = 1 << lgpr
            gstride = z * epg * int(r.integers(1, 4))
            span = (gpr - 1) * gstride + z * epg
            if span > S:
                lgpr, gpr, span = 0, 1, z * epg
            off = int(r.integers(0, (S - span) // z + 1)) * z
        epg, gpr = 1 << lepg, 1 << lgpr
        span_rows = self.lay.out_rows[1] - self.lay.out_rows[0]
        n = int(r.integers(1, 200))
        nrows = _ceil(_ceil(n, epg), gpr)
        while nrows > span_rows:
            n //= 2
            nrows = _ceil(_ceil(n, epg), gpr)
        rstride = int(r.integers(1, 4))
        rstride = max(1, min(rstride, (span_rows - 1) // max(1, nrows - 1)))
        last = (nrows - 1) * rstride
        row = int(r.integers(self.lay.out_rows[0], self.lay.out_rows[1] - last))
        return [encode("STORE", vsp=self._aligned(n, self.P, self.vlimit), n=n, row=row, off=off,
                       lepg=lepg, lgpr=lgpr, gstride=gstride, rstride=rstride, f32=f32)]

    def program(self, length):
        """About ``length`` instructions of every kind, then a raw dump of the VSP and HALT."""
        r = self.rng
        # Prologue: full-precision fp32 values (loaded fp16 data add up exactly in fp32, which
        # would let a wrong summation order go unseen).
        n = 512
        a, b, c = (self._aligned(n, self.P, self.vlimit) for _ in range(3))
        out = [encode("LOAD", vsp=a, n=n, row=self.lay.data_rows[0])]
        if b != a and abs(b - a) >= n:
            out.append(encode("VEC", vop="EXP", dst=b, src1=a, n=n))
            if abs(c - a) >= n and abs(c - b) >= n:
                out.append(encode("VEC", vop="MUL", dst=c, src1=a, src2=b, n=n))
        while len(out) < length:
            k = r.random()
            if k < 0.15:
                out += self.load()
            elif k < 0.5:
                out += self.vec()
            elif k < 0.75:
                out += self.matvec()
            elif k < 0.95:
                out += self.store()
            else:
                out.append(encode("FENCE"))
        out += self.dump()
        out.append(encode("HALT"))
        return out

    def dump(self, words=None):
        """STOREs of the VSP's first ``words`` (the programs' part) as raw fp32, linear from the
        dump row."""
        words = self.vlimit if words is None else words
        per_row = self.S // 4
        lepg = per_row.bit_length() - 1
        out = []
        chunk = 4096
        for a in range(0, words, chunk):
            n = min(chunk, words - a)
            out.append(encode("STORE", vsp=a, n=n, row=self.lay.dump_row + a // per_row, off=0,
                              lepg=lepg, lgpr=0, gstride=0, rstride=1, f32=1))
        return out
