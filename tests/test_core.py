"""The card kernel against the ISS: random valid programs and every error stop, bit for bit;
random programs again on a card whose HBM model stalls at random (the same results, later)."""

import numpy as np
import pytest

from hw.isa import ACC_DEPTH, ERROR_CODES, MAX_TOKENS, encode
from sim.progs import ProgramGen, compare_runs, fresh_pair, random_programs, snapshot

N_PROGRAMS = 200


@pytest.fixture(scope="module")
def rtl_card(cfg_path):
    from gen.config import load_config
    from sim.system import RtlDevice
    cfg = load_config(cfg_path)
    return cfg, RtlDevice(cfg)


def _pair(rtl_card, seed):
    cfg, rtl = rtl_card
    lay, rng, iss = fresh_pair(cfg, rtl, seed)
    return cfg, lay, rng, iss, rtl


@pytest.mark.rtl
def test_random_programs(rtl_card, seed):
    """Hundreds of random valid programs (every instruction type, random fields and HBM data):
    RTL and ISS end with the same status, counters and HBM images. The VSP is compared too:
    every program ends by storing it as raw fp32. (An int8 build's: tests/test_int8.py.)"""
    ops = random_programs(*rtl_card, seed, N_PROGRAMS)
    from hw.isa import OPCODES, VOPS
    expected = ({o for o in OPCODES if o not in ("VEC", "COLL")} | {f"VEC.{c}" for c, _, _ in VOPS.values()}
                | {"MATVEC.btok", "STORE.rows", "STORE.rows.f32", "STORE.rows.partial"})
    if rtl_card[0].core.weight_dtype == "int8":
        expected |= {"MATVEC.i8", "MATVEC.i8.btok", "MATVEC.i8.tokens"}
    assert expected <= ops, f"not covered: {expected - ops}"


def _stalled_run(cfg, stalls, seed, n, label):
    """``n`` random programs on the ISS, a new card and a new card with ``stalls``: all three
    end alike (status, counters, HBM images with the VSP dump); returns the cycles (unstalled,
    stalled) summed over the programs. All three start afresh: a program may read what an
    earlier one left in the VSP or XB, so the three must share their history."""
    from sim.system import RtlDevice
    stalled = RtlDevice(cfg, stalls=stalls)
    cfg, lay, rng, iss, rtl = _pair((cfg, RtlDevice(cfg)), seed)
    _pair((cfg, stalled), seed)                  # the same image into the stalled card
    gen = ProgramGen(cfg, rng, lay)
    cycles = [0, 0]
    for k in range(n):
        prog = gen.program(int(rng.integers(5, 40)))
        try:
            c = compare_runs(cfg, lay, iss, rtl, prog)
            s = stalled.run(prog, lay.prog_addr, timeout_s=120)
            assert s["status"] == c["status"], f"status: stalled {s['status']:#x}, unstalled {c['status']:#x}"
            for key in ("hbm_rd_bytes", "hbm_wr_bytes", "insns"):
                assert s[key] == c[key], f"counter {key}: stalled {s[key]}, unstalled {c[key]}"
            diff = np.nonzero(snapshot(stalled, cfg, lay) != snapshot(rtl, cfg, lay))[0]
            assert len(diff) == 0, f"stalled: {len(diff)} HBM bytes differ, first at {diff[:8]}"
        except AssertionError as e:
            raise AssertionError(f"program {k} (seed {seed}, {label}): {e}") from None
        cycles[0] += c["cycles"]
        cycles[1] += s["cycles"]
    print(f"{n} random programs, {label}: {cycles[0]} cycles unstalled, {cycles[1]} stalled "
          f"({cycles[1] / cycles[0]:.3f}x)")
    return cycles


@pytest.mark.rtl
def test_random_programs_stalled(rtl_card, seed):
    """Random programs on a card whose HBM model stalls at random (sim.system.Stalls: every
    port's AR/AW/W ready, R and B held back, up to 32 cycles of extra latency): the same status,
    counters and HBM images as the ISS and the unstalled card, in more cycles."""
    from sim.system import Stalls
    unstalled, slow = _stalled_run(rtl_card[0], Stalls(seed=seed), seed + 1, 30, "default stalls")
    assert slow > unstalled


@pytest.mark.soak
def test_random_programs_stalled_soak(rtl_card, seed):
    """Hundreds of programs each under light, default and heavy stalls."""
    from sim.system import Stalls
    for k, st in enumerate((Stalls(ready=0.1, valid=0.1, delay=8, seed=seed),
                            Stalls(seed=seed + 1),
                            Stalls(ready=0.7, valid=0.7, delay=200, seed=seed + 2))):
        _stalled_run(rtl_card[0], st, seed + 10 + k, N_PROGRAMS, f"stalls {st}")


def _err(name):
    return ERROR_CODES[name]


def error_cases(cfg):
    c = cfg.core
    VW, XW, P = c.vsp_words, c.xb_words, c.vector_lanes
    rows = cfg.channel_rows
    red_max = cfg.reduce_max
    ok = encode("LOAD", vsp=0, n=16, row=0)
    st = encode("STORE", vsp=0, n=16, row=512, off=0, lepg=4, lgpr=0, gstride=0, rstride=1, f32=1)
    return {
        "opcode_zero": ([ok, st, 0, encode("HALT")], "ILLEGAL_OPCODE", 2),
        "opcode_unknown": ([ok, 15, encode("HALT")], "ILLEGAL_OPCODE", 1),
        "coll_reserved": ([ok, encode("COLL"), encode("HALT")], "ILLEGAL_OPCODE", 1),
        "vop_unknown": ([ok, encode("VEC", vop=20, n=4), encode("HALT")], "ILLEGAL_OPCODE", 1),
        "zero_length": ([ok, encode("LOAD", vsp=0, n=0, row=0), encode("HALT")], "BAD_FIELD", 1),
        "tokens_zero": ([encode("WLOAD", row=64, tiles=1),
                         encode("MATVEC", rb=1, cb=1, group=1, tokens=0), encode("HALT")], "BAD_FIELD", 1),
        "tokens_past_max": ([encode("MATVEC", rb=1, cb=1, group=1, tokens=MAX_TOKENS + 1, dstride=64 // P),
                             encode("HALT")], "BAD_FIELD", 0),
        # int8 tiles on a card whose matrix unit computes fp16 only
        "i8_on_fp16": ([encode("WLOAD", row=64, tiles=2),
                        encode("MATVEC", rb=1, cb=1, group=1, tokens=1, i8=1), encode("HALT")],
                       "BAD_FIELD", 1),
        "accumulators": ([encode("MATVEC", rb=1, cb=1, group=ACC_DEPTH // MAX_TOKENS + 1, tokens=MAX_TOKENS,
                                 dstride=64 // P),
                          encode("HALT")], "BAD_FIELD", 0),
        "store_span": ([ok, encode("STORE", vsp=0, n=4, row=512, off=cfg.stripe_bytes - 2, lepg=1),
                        encode("HALT")], "BAD_FIELD", 1),
        "reduce_too_long": ([encode("VEC", vop="REDSUM", src1=0, n=red_max + 1), encode("HALT")],
                            "BAD_FIELD", 0),
        "vsp_range": ([ok, encode("LOAD", vsp=VW - P, n=2 * P, row=0), encode("HALT")], "VSP_RANGE", 1),
        "xb_range": ([encode("VEC", vop="CVT16", dst=XW - P, src1=0, n=2 * P), encode("HALT")],
                     "XB_RANGE", 0),
        "x16_reduce": ([encode("VEC", vop="REDSUM", src1=0, n=4, x16=1), encode("HALT")], "BAD_FIELD", 0),
        "x16_xb_range": ([ok, encode("VEC", vop="ADD", dst=64, src1=0, src2=0, n=2 * P, x16=1,
                                     xdst=XW - P), encode("HALT")], "XB_RANGE", 1),
        "hbm_range": ([ok, st, encode("WLOAD", row=rows - 1, tiles=2), encode("HALT")], "HBM_RANGE", 2),
        "overrun": ([ok, st], "PROGRAM_OVERRUN", 2),
        "underflow": ([encode("WLOAD", row=64, tiles=1), encode("MATVEC", rb=1, cb=2, group=1, tokens=1),
                       encode("HALT")], "WEIGHT_UNDERFLOW", 1),
        "leftover": ([ok, encode("WLOAD", row=64, tiles=3), st, encode("HALT")], "WEIGHT_LEFTOVER", 3),
        "stream_overflow": ([encode("WLOAD", row=64, tiles=c.weight_fifo_tiles // 2),
                             encode("WLOAD", row=64, tiles=c.weight_fifo_tiles // 2 + 1), encode("HALT")],
                            "WEIGHT_OVERFLOW", 1),
        "overlap": ([ok, encode("VEC", vop="ADD", dst=P, src1=0, src2=0, n=2 * P), encode("HALT")],
                    "OVERLAP", 1),
        # (MATVEC's addresses are rows, so only vector_lanes > 1 can misalign an operand)
        **({"align": ([encode("LOAD", vsp=1, n=4, row=0), encode("HALT")], "ALIGN", 0),
            "x16_align": ([ok, encode("VEC", vop="MOV", dst=64, src1=0, n=4, x16=1, xdst=1),
                           encode("HALT")], "ALIGN", 1)} if P > 1 else {}),
    }


@pytest.mark.rtl
@pytest.mark.parametrize("case", list(error_cases(__import__("gen.config").config.load_config(
    __import__("pathlib").Path(__file__).parent.parent / "configs" / "tiny.yaml"))))
def test_error_stops(rtl_card, case):
    """Each error stops the core cleanly with its status code at the faulting pc; the effects of
    the instructions before it are there, in RTL and ISS alike."""
    cfg, lay, rng, iss, rtl = _pair(rtl_card, 1)
    prog, name, pc = error_cases(cfg)[case]
    c = compare_runs(cfg, lay, iss, rtl, prog)
    assert c["status"] == (pc << 8 | _err(name)), f"{case}: status {c['status']:#x}"
    # The card is usable again afterwards.
    c = compare_runs(cfg, lay, iss, rtl, [encode("LOAD", vsp=0, n=8, row=0), encode("HALT")])
    assert c["status"] == 1 << 8


@pytest.mark.rtl
def test_store_row_path_takes_a_row_a_cycle(rtl_card):
    """The store engine's row path (hw.isa.store_row_mode) walks a STORE a VSP row a cycle:
    the same n elements placed one byte off a row's alignment (an element a cycle) keep the
    engine busy at least n cycles, on the row path at most n / lanes plus the fixed cost the
    element path also pays; both bit-exact against the ISS."""
    from hw.isa import store_row_mode
    cfg, lay, rng, iss, rtl = _pair(rtl_card, 3)
    P, n = cfg.core.vector_lanes, 512
    busy = {}
    for name, off in (("rows", 0), ("elements", 2)):
        store = dict(vsp=0, n=n, row=lay.out_rows[0], off=off, lepg=5, lgpr=0, gstride=0,
                     rstride=1)          # groups of 32 fp16 (64 bytes), a stripe row apart
        assert store_row_mode(0, store["lepg"], off, 0, P, cfg.hbm_beat_bytes) == (name == "rows")
        # (the VSP loaded first: the card's holds what earlier tests' programs left there)
        c = compare_runs(cfg, lay, iss, rtl, [encode("LOAD", vsp=0, n=n, row=lay.data_rows[0]),
                                              encode("STORE", **store), encode("HALT")])
        assert c["status"] == 2 << 8
        busy[name] = c["dma_wr_busy"]
    print(f"STORE of {n} fp16, store engine busy: {busy['rows']} cycles on the row path, "
          f"{busy['elements']} an element a cycle")
    fixed = busy["elements"] - n                 # the engine's cost besides the walk
    assert fixed >= 0, busy
    assert busy["rows"] <= n // P + fixed + 8, busy


@pytest.mark.rtl
def test_program_address_errors(rtl_card):
    """A misaligned program address, and a program that runs past the end of channel 0."""
    cfg, lay, rng, iss, rtl = _pair(rtl_card, 1)
    c = compare_runs(cfg, lay, iss, rtl, [encode("HALT")], prog_addr=lay.prog_addr + 8)
    assert c["status"] == _err("ALIGN")
    end = (cfg.hbm.channel_mbytes << 20) - 32
    for d in (iss, rtl):
        d.write_hbm(0, end, np.frombuffer(
            b"".join(encode("LOAD", vsp=0, n=8, row=0).to_bytes(16, "little") for _ in range(2)), np.uint8))
        from hw import regs
        d.write_reg64(regs.ARGS["prog_addr"][0], end)
        d.write_reg(regs.ARGS["prog_len"][0], 4)
        d.start()
        status = d.wait(60)
        assert status == (2 << 8 | _err("AXI_ERROR")), f"{type(d).__name__}: {status:#x}"


@pytest.mark.rtl
def test_watchdog_timeout(rtl_card):
    """HBM that delivers nothing for longer than the watchdog (2^20 cycles without progress):
    the card stops with TIMEOUT in its status register and raises ap_done, not a hang."""
    from host.device import status_name
    from sim.system import RtlDevice
    cfg, _ = rtl_card
    dev = RtlDevice(cfg, bytes_per_cycle=1e-6)          # one 32-byte beat per 32 M cycles
    c = dev.run([encode("LOAD", vsp=0, n=8, row=0), encode("HALT")], 1 << 16, timeout_s=600)
    assert status_name(c["status"]) == "TIMEOUT", f"status {c['status']:#x}"
    assert (1 << 20) <= c["cycles"] < (1 << 20) + 100_000
