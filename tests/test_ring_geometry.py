# amaranth: UnusedElaboratable=no
"""The ring's geometry (hw/ring.py): the pure-Python figures, and the collective unit's
hardware geometry (hw/core/coll.py CollGeometry) writing the same segment tables."""

import ast
from pathlib import Path

import pytest

from hw import ring

ROOT = Path(__file__).resolve().parent.parent


def test_beats_parts_segments():
    assert [ring.beats(n, 16) for n in (1, 16, 17, 400)] == [1, 1, 2, 25]
    assert ring.parts(5, False) == [(0, 5, +1)]
    assert ring.parts(5, True) == [(0, 3, +1), (3, 2, -1)]
    assert ring.parts(1, True) == [(0, 1, +1), (1, 0, -1)]
    assert ring.segments(7, 3) == [(0, 2), (2, 2), (4, 3)]
    assert ring.segments(1, 4) == [(0, 0), (0, 0), (0, 0), (0, 1)]
    for pb in range(40):
        for N in range(2, ring.MAX_CARDS + 1):
            segs = ring.segments(pb, N)
            assert [s for s, _ in segs] == [j * pb // N for j in range(N)]
            assert sum(b for _, b in segs) == pb and max(b for _, b in segs) - min(b for _, b in segs) <= 1
    assert ring.chunks(0, 64) == 0 and ring.chunks(64, 64) == 1 and ring.chunks(65, 64) == 2


def test_segment_table():
    # all-gather: card j's block of each part, at j nb
    assert ring.segment_table(ring.OP_AG, 5, 3, True) == {
        +1: [(0, 3), (5, 3), (10, 3)], -1: [(3, 2), (8, 2), (13, 2)]}
    # reduce-scatter and all-reduce: the part's segments, from the message's first beat
    assert ring.segment_table(ring.OP_AR, 25, 4, False) == {+1: [(0, 6), (6, 6), (12, 6), (18, 7)]}
    assert ring.segment_table(ring.OP_RS, 9, 2, True) == {+1: [(0, 2), (2, 3)], -1: [(5, 2), (7, 2)]}


def test_ops_and_limits():
    assert ring.OPS == {"allgather": 0, "reducescatter": 1, "allreduce": 2}
    assert {v: k for k, v in ring.OP_NAMES.items()} == ring.OPS
    # every message's beats, at the narrowest link, fit the unit's nb (DIV_BITS + 1 bits)
    assert ring.beats((1 << ring.N_BITS) - 1, ring.MIN_LINK_BITS // 32) < 1 << (ring.DIV_BITS + 1)


def test_node_params():
    from gen.config import load_config
    p = ring.node_params(load_config(ROOT / "configs" / "tiny.yaml"))
    assert (p.data_bits, p.frame_beats, p.group, p.rx_frames) == (512, 64, 4, 8)


def test_hardware_rejects_what_the_config_rejects():
    """hw/ raises ValueError naming the parameter and the value (gen/config.py rejects such
    configs first, so these are built from stand-in configs)."""
    from types import SimpleNamespace as NS

    from gen.config import load_config
    from hw.core.coll import CollUnit
    tiny = load_config(ROOT / "configs" / "tiny.yaml")
    link = NS(**{**vars(tiny.link), "data_bits": 64})
    with pytest.raises(ValueError, match=r"^link.data_bits: got 64"):
        ring.node_params(NS(link=link))
    for core, hbm, link_bits, match in (
            ({}, {}, 128, r"^link.data_bits: got 128; the collective unit needs at least 256"),
            (dict(vector_lanes=16), {}, 256, r"^core.vector_lanes: got 16"),
            ({}, dict(data_bits=512), 256, r"^link.data_bits: got 256; COLL on HBM")):
        cfg = NS(core=NS(**{**vars(tiny.core), **core}), hbm=NS(**{**vars(tiny.hbm), **hbm}),
                 link=NS(**{**vars(tiny.link), "data_bits": link_bits}))
        with pytest.raises(ValueError, match=match):
            CollUnit(cfg, timeout=100)


def test_pure_python():
    """The host imports hw/ring.py: it must not import Amaranth, numpy or anything of the project."""
    tree = ast.parse((ROOT / "hw" / "ring.py").read_text())
    imported = {a.name.split(".")[0] for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names}
    imported |= {n.module.split(".")[0] for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)}
    assert imported <= {"dataclasses"}, imported


@pytest.mark.parametrize("op", [ring.OP_AG, ring.OP_AR])
@pytest.mark.parametrize("N, bidir", [(2, False), (3, True), (4, True), (16, False), (5, True)])
def test_hardware_geometry_writes_the_tables(op, N, bidir):
    """CollGeometry's table writes and longest segments equal hw/ring.py's, for message sizes
    around the cards' count and the frame, and its timing is 1 + DIV_BITS + N cycles a part."""
    from amaranth.sim import Simulator

    from hw.core.coll import CollGeometry
    F = 4
    dut = CollGeometry(frame_beats=F)
    sizes = [1, 2, N - 1, N, N + 1, 2 * N + 3, 4 * F + 1, 1000]
    results = []

    async def bench(ctx):
        for nb in sizes:
            ctx.set(dut.ag, op == ring.OP_AG)
            ctx.set(dut.nb, nb)
            ctx.set(dut.cards, N)
            ctx.set(dut.bidir, bidir)
            ctx.set(dut.start, 1)
            await ctx.tick()
            ctx.set(dut.start, 0)
            table, cycles = {+1: {}, -1: {}}, 0
            while True:
                cycles += 1
                done, we, left, addr, entry = ctx.get(dut.done), ctx.get(dut.seg_we), \
                    ctx.get(dut.seg_left), ctx.get(dut.seg_addr), ctx.get(dut.seg_data)
                if we:
                    assert entry.src == entry.dst
                    table[-1 if left else +1][addr] = (entry.src, entry.beats)
                await ctx.tick()
                if done:
                    break
            maxc = (ctx.get(dut.max_chunks_r), ctx.get(dut.max_chunks_l))
            results.append((nb, table, maxc, cycles))

    sim = Simulator(dut)
    sim.add_clock(1e-8)
    sim.add_testbench(bench)
    sim.run()
    for nb, table, maxc, cycles in results:
        want = ring.segment_table(op, nb, N, bidir)
        got = {d: [t[j] for j in range(N)] for d, t in table.items() if t}
        assert got == want, (nb, got, want)
        longest = {d: max(ring.chunks(b, F) for _, b in segs) for d, segs in want.items()}
        assert maxc == (longest[+1], longest.get(-1, 0)), nb
        assert cycles == len(want) * (1 + ring.DIV_BITS + N), (nb, cycles)


def test_divider_holds_every_message_a_ring_card_accepts():
    """The largest COLL (n = 2^24 - 1 words) on the narrowest link a ring card accepts fits the
    collective unit's DIV_BITS-bit divider; a narrower link on a ring is refused by the config."""
    from gen.config import ConfigError, load_config
    from hw.ring import DIV_BITS, MIN_RING_LINK_BITS, N_BITS, beats
    assert beats((1 << N_BITS) - 1, MIN_RING_LINK_BITS // 32) < 1 << DIV_BITS
    assert beats((1 << N_BITS) - 1, MIN_RING_LINK_BITS // 64) >= 1 << DIV_BITS    # why 128 is refused
    tiny = load_config(Path(__file__).resolve().parent.parent / "configs" / "tiny.yaml")
    with pytest.raises(ConfigError, match=r"link.data_bits: got 128; allowed with cards > 1: at least 256"):
        tiny.replace(**{"link.data_bits": 128, "core.vector_lanes": 4})
