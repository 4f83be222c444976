"""Unit tests of the compiler's modules (host/compiler/), each against its own contract; the
programs and images as a whole are held by tools/program_hashes.py and the ISS/RTL tests."""

import ast
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from gen.config import load_config
from host.compiler import GROUP, CompiledModel, tiles_in_stream_order
from host.compiler.layout import Dims, KvLayout, ParamLayout, param_align, round_up
from host.compiler.partition import Partition, share
from host.compiler.placement import Allocator, Candidate, NoRoom, Placement, candidates, choose, place
from host.compiler.schedule import Job, chunk_blocks, matrix_chunks, mlp_proj_split, place_wloads
from host.compiler.weights import attn_proj, c_attn, c_fc, fold_layer_norm, lm_head
from host.errors import UserError
from host.model import SHAPES, Gpt2, Gpt2Shape, random_gpt2
from hw.isa import ACC_DEPTH, MAX_TOKENS, decode, encode

ROOT = Path(__file__).resolve().parent.parent
TINY = load_config(ROOT / "configs" / "tiny.yaml")


# -- layering ------------------------------------------------------------------------------------
def test_compiler_imports_no_rtl_and_no_simulator():
    """host/compiler imports neither amaranth, nor hw.core, nor sim: not at the top, not inside a
    function, and importing it loads none of them."""
    banned = ("amaranth", "hw.core", "sim")
    for path in sorted((ROOT / "host" / "compiler").glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            names = ([a.name for a in node.names] if isinstance(node, ast.Import)
                     else [node.module or ""] if isinstance(node, ast.ImportFrom) and node.level == 0
                     else [])
            for name in names:
                assert not name.startswith(banned), f"{path.name} imports {name}"
    code = ("import sys, host.compiler; "
            "print(sorted(m for m in sys.modules if m.split('.')[0] in ('amaranth', 'sim') "
            "or m.startswith('hw.core')))")
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


# -- layout --------------------------------------------------------------------------------------
def test_tiles_in_stream_order_pads_and_orders_by_group():
    mat = np.arange(5 * 3, dtype=np.float16).reshape(5, 3)         # 5 x 3: 3 x 2 tiles of 2 x 2
    tiles, rb, cb = tiles_in_stream_order(mat, 2, 2, group=2)
    assert (rb, cb) == (3, 2) and tiles.shape == (6, 2, 2)
    pad = np.zeros((6, 4), np.float16)
    pad[:5, :3] = mat
    order = [(0, 0), (1, 0), (0, 1), (1, 1), (2, 0), (2, 1)]    # group of 2 row blocks, then the rest
    for k, (r, c) in enumerate(order):
        assert np.array_equal(tiles[k], pad[2 * r:2 * r + 2, 2 * c:2 * c + 2])


def test_dims_rows_of_c_attn_are_k_v_q():
    d = Dims.of(Gpt2Shape(n_layer=1, n_head=6, d_model=120, vocab=50, n_positions=40), 4, 16, H=2, F=96, V=13)
    assert (d.hdp, d.hvp, d.dq, d.dv) == (32, 36, 64, 72)
    assert (d.k_off, d.v_off, d.q_off) == (0, 64, 136)
    assert d.qS == 208 and d.aS == 80 and d.fS == 96 and d.vS == 16 and d.dS == 128
    assert d.nS == 64                               # 40 positions in whole groups of 8 row blocks


def _store(rows, S, fields, vec):
    """Write fp16 ``vec`` as a STORE with ``fields`` does (hw/isa.py STORE), f32 = 0."""
    epg, gpr = 1 << fields["lepg"], 1 << fields["lgpr"]
    for i, x in enumerate(vec):
        g, e = divmod(i, epg)
        row = fields["row"] + (g // gpr) * fields["rstride"]
        byte = fields["off"] + (g % gpr) * fields["gstride"] + 2 * e
        rows.setdefault(row, np.zeros(S, np.uint8)).view(np.float16)[byte // 2] = x


def _read(rows, S, runs, L, W):
    """Tiles [n, L, W] (as stored) of the runs (first row, tiles) a MATVEC's WLOADs stream."""
    return np.stack([rows.get(r, np.zeros(S, np.uint8)).view(np.float16).reshape(L, W)
                     for row, n in runs for r in range(row, row + n)])


@pytest.mark.parametrize("H,hdp,L,W,positions", [(3, 16, 4, 16, 37), (2, 32, 4, 8, 70), (1, 16, 8, 8, 9)])
def test_kv_layout_stores_are_what_the_matvecs_read(H, hdp, L, W, positions):
    """A position's K (V) of every head, written with one STORE at ``k_store`` (``v_store``),
    reads back through a head's runs as that head's K ([position, hdp]; V^T [hvp, position],
    tiles transposed) in MATVEC stream order: the STOREs and the MATVECs agree on one layout."""
    rng = np.random.default_rng(0)
    dims = Dims(H=H, F=0, V=0, hdp=hdp, hvp=hdp + L, dS=0, nS=0, dq=H * hdp, dv=H * (hdp + L), qS=0, aS=0,
                fS=0, vS=0)
    kv = KvLayout.of(dims, L, W, n_positions=80)
    S, kbase, vbase = L * W * 2, 1000, 5000
    K = rng.standard_normal((positions, H, hdp)).astype(np.float16)
    V = rng.standard_normal((positions, H, dims.hvp)).astype(np.float16)
    rows = {}
    for p in range(positions):
        _store(rows, S, kv.k_store(kbase, p), K[p].reshape(-1))
        _store(rows, S, kv.v_store(vbase, p, 1), V[p, 1:].reshape(-1))      # from head 1 on
        _store(rows, S, kv.v_store(vbase, p, 0), V[p, :1].reshape(-1))      # head 0 alone
    assert all(kbase <= r < kbase + kv.k_rows or vbase <= r < vbase + kv.v_rows for r in rows)
    rbk, cbv = kv.k_row_blocks(positions), kv.v_col_blocks(positions)
    assert rbk % GROUP == 0 and rbk * L >= positions and cbv == -(-positions // W)
    for h in range(H):
        kmat = np.zeros((rbk * L, hdp), np.float16)
        kmat[:positions] = K[:, h]
        want, _, _ = tiles_in_stream_order(kmat, L, W, GROUP)
        assert np.array_equal(_read(rows, S, kv.k_runs(kbase, h, positions), L, W), want)
        vt = np.zeros((dims.hvp, cbv * W), np.float16)
        vt[:, :positions] = V[:, h].T
        for group in (kv.rbv, 1, 2):
            want, _, _ = tiles_in_stream_order(vt, L, W, group)
            got = _read(rows, S, kv.v_runs(vbase, h, positions, group), W, L).transpose(0, 2, 1)
            assert np.array_equal(got, want)
    assert kv.k_tile(H - 1, GROUP + 1, kv.cbk - 1) == kv.k_group_rows + (H - 1) * GROUP * kv.cbk \
        + (kv.cbk - 1) * GROUP + 1
    assert kv.v_tile(H - 1, 0, 1) == H * kv.rbv + (H - 1) * kv.rbv


def test_param_layout_aligns_parts_and_packs():
    lay = ParamLayout.of((10, 6, 5, 6), P=4, first_align=param_align(4, 128))     # 32 words a row
    assert lay.offsets == (0, 32, 40, 48) and lay.length == 56
    v = lay.pack([np.full(10, 1.0), np.full(6, 2.0), np.full(5, 3.0), np.full(6, 4.0)])
    assert v.dtype == np.float32 and v[9] == 1 and v[10] == 0 and v[32] == 2 and v[44] == 3 and v[53] == 4


# -- partition -----------------------------------------------------------------------------------
def test_partition_balances_heads_and_covers_the_vocabulary():
    sh = SHAPES["gpt2-xl"]
    parts = [Partition.of(sh, card=i, cards=4, lanes=16) for i in range(4)]
    assert [p.mine.H for p in parts] == [6, 6, 6, 7] and [p.h0 for p in parts] == [0, 6, 12, 18]
    assert sum(p.mine.F for p in parts) == sh.d_ff and parts[3].f0 + parts[3].mine.F == sh.d_ff
    assert all(p.largest.H == 7 and p.largest.F == -(-sh.d_ff // 4) for p in parts)
    vl = parts[0].largest.V
    assert vl % 16 == 0 and vl >= sh.vocab / 4
    assert [p.v0 for p in parts] == [0, vl, 2 * vl, 3 * vl]
    assert sum(p.mine.V for p in parts) == sh.vocab and all(p.mine.V <= vl for p in parts)
    assert share(10, 3, 0) == (0, 3) and share(10, 3, 2) == (6, 4)


def test_partition_refuses_more_cards_than_heads_or_vocabulary():
    sh = Gpt2Shape(n_layer=1, n_head=4, d_model=64, vocab=9, n_positions=16)
    with pytest.raises(UserError, match="--cards: 5 cards for a model of 4 heads"):
        Partition.of(sh, card=0, cards=5, lanes=4)
    with pytest.raises(UserError, match="more than the vocabulary of 9"):
        Partition.of(sh, card=3, cards=4, lanes=4)          # slices of 4: card 3 would start at 12


# -- weights -------------------------------------------------------------------------------------
def _layer_norm(x, g, b, eps):
    mu = x.mean()
    return (x - mu) / np.sqrt(((x - mu) ** 2).mean() + eps) * g + b


def test_fold_layer_norm_is_layer_norm_then_linear():
    rng = np.random.default_rng(1)
    d, n = 24, 7
    wt, bias, g, b = (rng.standard_normal(s) for s in ((n, d), n, d, d))
    x = 3 + 2 * rng.standard_normal(d)
    wf, bf = fold_layer_norm(wt, bias, g, b)
    assert wf.dtype == bf.dtype == np.float32
    r = 1 / np.sqrt(x.var() + 1e-5)
    np.testing.assert_allclose(r * (wf.astype(np.float64) @ x) + bf, wt @ _layer_norm(x, g, b, 1e-5) + bias,
                               rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(wf.sum(axis=1), 0, atol=1e-5)        # centred rows


def test_builders_hold_this_cards_heads_and_columns():
    """c_attn's rows (K, V with its row of ones, q scaled), attn.c_proj's input columns,
    c_fc's rows and the LM head's slice are this card's share of the model's."""
    sh = Gpt2Shape(n_layer=1, n_head=4, d_model=48, vocab=30, n_positions=16)     # head_dim 12
    w = random_gpt2(sh, np.random.default_rng(2)).weights
    part = Partition.of(sh, card=1, cards=2, lanes=4)
    dims = Dims.of(sh, 4, 16, H=part.mine.H, F=part.mine.F, V=part.mine.V)
    x = np.random.default_rng(3).standard_normal(sh.d_model)
    r = 1 / np.sqrt(x.var() + sh.eps)
    wqkv, bqkv = c_attn(w, 0, sh, part, dims)
    y = r * (wqkv.astype(np.float64) @ x) + bqkv
    ref = _layer_norm(x, w["h.0.ln_1.weight"], w["h.0.ln_1.bias"], sh.eps) @ w["h.0.attn.c_attn.weight"] \
        + w["h.0.attn.c_attn.bias"]
    hd, d = sh.head_dim, sh.d_model
    for h in range(part.mine.H):
        g = part.h0 + h
        q, k, v = (ref[kind * d + g * hd:kind * d + (g + 1) * hd] for kind in range(3))
        np.testing.assert_allclose(y[dims.k_off + h * dims.hdp:][:hd], k, rtol=1e-4, atol=1e-4)
        np.testing.assert_allclose(y[dims.v_off + h * dims.hvp:][:hd], v, rtol=1e-4, atol=1e-4)
        np.testing.assert_allclose(y[dims.q_off + h * dims.hdp:][:hd], q / np.sqrt(hd), rtol=1e-4, atol=1e-4)
        assert y[dims.v_off + h * dims.hvp + dims.hdp] == 1.0                  # the row of ones
    proj = attn_proj(w, 0, sh, part, dims)
    assert proj.shape == (d, dims.dq)
    assert np.array_equal(proj[:, dims.hdp:dims.hdp + hd], w["h.0.attn.c_proj.weight"].T[:, 3 * hd:4 * hd])
    assert not proj[:, hd:dims.hdp].any()
    wf, bf = c_fc(w, 0, part)
    assert wf.shape == (part.mine.F, d) and bf.shape == (part.mine.F,)
    wh, bh = lm_head(w, part, dims)
    assert wh.shape == (part.mine.V, d) and bh.shape == (dims.vS,) and not bh[part.mine.V:].any()


# -- schedule ------------------------------------------------------------------------------------
def test_matrix_chunks_are_whole_groups_within_half_the_fifo():
    assert chunk_blocks(4, 512) == 64 and chunk_blocks(40, 512) == 8 and chunk_blocks(40, 512, 2) == 6
    assert matrix_chunks(20, 4, group=8, fifo_tiles=128, L=4, W=16) == [(0, 16), (16, 4)]
    assert matrix_chunks(20, 4, group=8, fifo_tiles=64, L=4, W=16) == [(0, 8), (8, 8), (16, 4)]
    assert matrix_chunks(20, 2, group=8, fifo_tiles=64, L=4, W=16, short_tail=True) == [(0, 16), (16, 4)]
    assert matrix_chunks(30, 2, group=8, fifo_tiles=128, L=4, W=16, short_tail=True) == [(0, 24), (24, 6)]
    assert matrix_chunks(30, 2, group=8, fifo_tiles=128, L=4, W=16) == [(0, 30)]
    with pytest.raises(UserError, match="one group of 8 row blocks of a 80 x 640 matrix is 320 tiles"):
        matrix_chunks(20, 40, group=8, fifo_tiles=256, L=4, W=16)


def test_mlp_proj_split_is_c_fc_s_last_chunk():
    # c_fc [F, d] of d = 128 (8 column blocks of 16): 32 row blocks a job at 512 tiles
    assert mlp_proj_split(512, 128, 4, 16, 512) == 384          # 128 row blocks: 4 jobs, the last alone
    assert mlp_proj_split(128, 128, 4, 16, 512) == 128          # one job: no split
    assert mlp_proj_split(136, 128, 4, 16, 512) == 128          # 34 row blocks: jobs of 32 and 2
    assert mlp_proj_split(132, 128, 4, 12, 512) == 132          # 128 is not a whole column block


def _job(k, tiles, earliest=0, row=None):
    return Job(((100 * k if row is None else row, tiles),), tiles, dict(xb=k, rb=1, cb=tiles), earliest)


def _check_wloads(items, words, fifo):
    """The ISA's rules: every job's WLOADs before its MATVEC, jobs streamed in MATVEC order, at
    positions no earlier than ``earliest``, unclaimed tiles never beyond the FIFO; the other
    instructions unchanged and in order."""
    jobs = [x for x in items if isinstance(x, Job)]
    plain = [x for x in items if not isinstance(x, Job)]
    ins = [decode(w) for w in words]
    assert [w for w, i in zip(words, ins, strict=True) if i.op not in ("WLOAD", "MATVEC")] == plain
    streamed, issued, avail, before = 0, 0, 0, 0          # before: items passed so far
    for i in ins:
        if i.op == "WLOAD":
            job = jobs[streamed]
            assert (i.row, i.tiles) == job.runs[0] and before >= job.earliest
            avail += i.tiles
            assert avail <= fifo
            streamed += 1
        elif i.op == "MATVEC":
            assert issued < streamed and i.xb == jobs[issued].fields["xb"]
            avail -= jobs[issued].tiles
            issued, before = issued + 1, before + 1
        else:
            before += 1
    assert streamed == issued == len(jobs) and avail == 0


def test_place_wloads_streams_ahead_within_the_fifo():
    nop = [encode("HALT")] * 3
    items = [nop[0], _job(0, 30), _job(1, 30), nop[1], _job(2, 30, earliest=4), nop[2], _job(3, 60)]
    words = place_wloads(items, 64)
    _check_wloads(items, words, 64)
    ops = [(i.op, i.fields.get("row")) for i in map(decode, words)]
    # J0 and J1 fill the FIFO ahead of everything; J2 waits for its earliest, then streams at
    # once (the FIFO is empty); J3 waits until J2's MATVEC claims J2's tiles.
    assert ops == [("WLOAD", 0), ("WLOAD", 100), ("HALT", None), ("MATVEC", None), ("MATVEC", None),
                   ("HALT", None), ("WLOAD", 200), ("MATVEC", None), ("WLOAD", 300), ("HALT", None),
                   ("MATVEC", None)]


def test_place_wloads_random_programs_keep_the_isa_rules():
    rng = np.random.default_rng(4)
    for _ in range(200):
        fifo = int(rng.integers(8, 64))
        items, k = [], 0
        for _ in range(int(rng.integers(1, 30))):
            if rng.random() < 0.5:
                tiles, earliest = int(rng.integers(1, fifo // 2 + 1)), int(rng.integers(0, len(items) + 1))
                items.append(_job(k, tiles, earliest))
                k += 1
            else:
                items.append(encode("HALT"))
        _check_wloads(items, place_wloads(items, fifo), fifo)


# -- placement -----------------------------------------------------------------------------------
def test_allocator_first_fit_apart_split_and_short():
    a = Allocator(64, 4, "VSP", "vsp_words", segment=16)
    x = a(8)
    assert x == 0
    assert a(8, avoid=[x]) == 16                     # not in x's segment
    assert a(4) == 8                                 # first fit
    assert a(12, split=4) == 28                      # word 4 starts the segment at 32
    assert a(40) is None and a.short
    b = Allocator(32, 4, "XB", "xb_words")
    assert b(40, optional=True) is None and not b.short
    assert b(16) == 0 and b.free == 16
    c = b.copy()
    c(16)
    assert b.free == 16 and c.free == 0
    assert b.shortage == "model: needs more than the 32 XB words this build has (core.xb_words)"


def test_allocator_strict_does_not_fall_back():
    a = Allocator(32, 4, "VSP", "vsp_words", segment=16)
    x = a(16)
    assert a(8, avoid=[x], strict=True) == 16
    assert a(8, avoid=[x], strict=True) == 24
    assert a(4, avoid=[x], strict=True) is None and a.short


def test_candidates_order():
    c = candidates()
    assert c[0] == Candidate(2, MAX_TOKENS, True) and c[MAX_TOKENS] == Candidate(1, MAX_TOKENS, True)
    assert c[-1] == Candidate(1, 1, False) and len(c) == 2 * 2 * MAX_TOKENS
    assert candidates(max_tokens=3, param_areas=1) == [Candidate(1, 3, True), Candidate(1, 3, False)]


def test_placement_is_chosen_for_the_largest_share():
    cfg = load_config(ROOT / "configs" / "u280x4.yaml").replace(cards=4)
    sh = SHAPES["gpt2-xl"]
    plans = []
    for card in range(4):
        part = Partition.of(sh, card=card, cards=4, lanes=cfg.core.lanes)
        dims = [Dims.of(sh, cfg.core.lanes, cfg.core.width, H=s.H, F=s.F, V=s.V)
                for s in (part.largest, part.mine)]
        plans.append(choose(cfg, sh, *dims, cards=4, all_logits=False))
    assert len({(p.T, p.param_areas, p.v_g is not None) for p in plans}) == 1
    assert all(isinstance(p, Placement) and p.v_g is not None for p in plans)


def test_placement_no_room_names_the_space():
    sh = Gpt2Shape(n_layer=1, n_head=8, d_model=128, vocab=1000, n_positions=128)
    cfg = TINY.replace(**{"core.xb_words": 1024})
    dims = Dims.of(sh, 4, 16, H=8, F=512, V=1000)
    assert isinstance(place(cfg, sh, dims, Candidate(2, 1, True), cards=1, all_logits=False), NoRoom)
    with pytest.raises(UserError, match=r"more than the 1024 XB words this build has \(core.xb_words\)"):
        choose(cfg, sh, dims, dims, cards=1, all_logits=False)
    small = TINY.replace(**{"core.vsp_words": 2048})
    with pytest.raises(UserError, match=r"more than the 2048 VSP words this build has \(core.vsp_words\)"):
        choose(small, sh, dims, dims, cards=1, all_logits=False)


# -- the whole ---------------------------------------------------------------------------------
def test_compiled_model_uses_the_isa_limits():
    """Steps of at most MAX_TOKENS tokens; every MATVEC's group x tokens within ACC_DEPTH."""
    sh = Gpt2Shape(n_layer=1, n_head=4, d_model=64, vocab=100, n_positions=64)
    assert CompiledModel(TINY, Gpt2(sh, None)).T < MAX_TOKENS      # (tiny's buffers bound it)
    big = TINY.replace(**{"core.vsp_words": 65536, "core.xb_words": 32768})
    cm = CompiledModel(big, Gpt2(sh, None))
    assert cm.T == MAX_TOKENS
    for tokens, pos in ((cm.T, 0), (1, 40)):
        mv = [i for i in map(decode, cm.step([1] * tokens, pos)) if i.op == "MATVEC"]
        assert mv and all(i.group * i.tokens <= ACC_DEPTH for i in mv)


@pytest.mark.parametrize("kw", [{"max_tokens": 0}, {"max_tokens": MAX_TOKENS + 1}, {"param_areas": 4},
                                {"param_areas": 0}])
def test_out_of_range_step_options_are_refused(kw):
    """More tokens per step than MATVEC.tokens holds (or a parameter-area count other than 1,
    2 or 3) is refused, not compiled into programs the card rejects."""
    from host.model import load_checkpoint
    from host.runtime import DEMO_MODEL
    tiny = load_config(Path(__file__).resolve().parent.parent / "configs" / "tiny.yaml")
    with pytest.raises(ValueError, match=next(iter(kw))):
        CompiledModel(tiny, load_checkpoint(DEMO_MODEL), **kw)


# -- the build's limits, checked once at compile ---------------------------------------------
def test_hbm_rows_beyond_the_isa_row_fields_are_refused():
    """A 4 GiB channel has 2^27 rows, the instructions' row fields address 2^24: a model that
    needs more is refused at compile (it used to compile, then fail encoding a STORE)."""
    from host.compiler.image import ROW_BITS
    assert ROW_BITS == 24
    big = TINY.replace(cards=1, **{"hbm.channel_mbytes": 4096, "core.vsp_words": 65536,
                                   "core.xb_words": 65536, "core.weight_fifo_tiles": 2048,
                                   "core.limits.d_model": 1600, "core.limits.heads": 25,
                                   "core.limits.layers": 48, "core.limits.vocab": 50257,
                                   "core.limits.seq_len": 1024})
    assert big.channel_rows == 1 << 27
    with pytest.raises(UserError, match=r"24-bit row fields \(hw/isa.py\) address 16777216") as e:
        CompiledModel(big, Gpt2(SHAPES["gpt2-xl"], None))
    assert "\n" not in str(e.value)


def test_a_program_that_does_not_fit_after_the_model_is_refused():
    """The program goes after the model in channel 0: a model that leaves too little room
    for the longest step's program is refused at compile, not at the device."""
    small = TINY.replace(**{"hbm.channel_mbytes": 1, "core.limits.layers": 8, "core.limits.seq_len": 512})
    cm = CompiledModel(small, Gpt2(Gpt2Shape(7, 4, 128, 1024, 144), None))
    end = cm.prog_addr + 16 * len(cm.step([0] * cm.T, 144 - cm.T))
    assert end <= small.hbm.channel_mbytes << 20
    with pytest.raises(UserError, match=r"a step's program of \d+ instructions \(\d+ bytes\) does not "
                                        r"fit in the \d+ bytes of HBM channel 0"):
        CompiledModel(small, Gpt2(Gpt2Shape(7, 4, 128, 1024, 176), None))


def test_k_v_matvecs_beyond_the_weight_fifo_are_refused_at_compile():
    """A K/V MATVEC grows with the position: the one at the context's end is checked when the
    model is compiled, not at the step that reaches it (tiny: 512 tiles; a head of 64: K 4
    tiles, V 17 tiles per 16 positions)."""
    cfg = TINY.replace(**{"core.limits.seq_len": 1024})
    with pytest.raises(UserError, match=r"a K/V MATVEC over the model's 1024 positions streams 1088 "
                                        r"tiles; the weight FIFO holds 512 .*at most 480 positions"):
        CompiledModel(cfg, Gpt2(Gpt2Shape(1, 1, 64, 512, 1024), None))
    with pytest.raises(UserError, match="at most 480 positions"):
        CompiledModel(cfg, Gpt2(Gpt2Shape(1, 1, 64, 512, 481), None))
    cm = CompiledModel(cfg, Gpt2(Gpt2Shape(1, 1, 64, 512, 480), None))
    assert cm.step([1], 479)                 # the last position's step emits


# -- steps of several tokens on several cards ------------------------------------------------------
@pytest.fixture(scope="module")
def xl4():
    """GPT-2 1.5B's shapes on 4 u280x4 cards, for batches of 8 (shapes-only compiles)."""
    cfg = load_config(ROOT / "configs" / "u280x4.yaml")
    return cfg, [CompiledModel(cfg, Gpt2(SHAPES["gpt2-xl"], None), card=i, cards=4, streams=8)
                 for i in range(4)]


def _ops(words):
    return [decode(w) for w in words]


def test_split_at_cuts_at_a_multiple_of_reuse(xl4):
    """A step is cut in two halves of at least 2 tokens, the first a multiple of core.reuse (4),
    only on several cards and unless asked not to."""
    from host.compiler.emit import split_at
    cfg, cms = xl4
    assert cfg.core.reuse == 4
    assert [split_at(cms[0], T) for T in range(1, 9)] == [None, None, None, None, None, 4, 4, 4]
    two = CompiledModel(cfg.replace(**{"core.reuse": 2}), Gpt2(SHAPES["gpt2-xl"], None), cards=4)
    assert [split_at(two, T) for T in range(1, 9)] == [None, None, None, 2, None, 4, 4, 4]
    one = CompiledModel(cfg, Gpt2(SHAPES["gpt2-xl"], None), cards=4, split=False)
    assert all(split_at(one, T) is None for T in range(1, 9))


def test_split_steps_have_the_same_colls_on_every_card(xl4):
    """Every card of a cut step has the same COLLs in the same order (each card's interleave
    chose its own order around them): per layer and half two all-gathers of the partial sums
    and two one-beat all-gathers of the LayerNorms' r (and the LM head's in a batch); in
    prefill all-reduces."""
    cfg, cms = xl4
    for step, expect in ((lambda cm: cm.step_batch([(0, 64, s) for s in range(8)]), 48 * 8 + 2),
                         (lambda cm: cm.step([0] * 8, 56), 48 * 8)):
        colls = [[(i.fields["cop"], i.fields["n"]) for i in _ops(step(cm)) if i.op == "COLL"] for cm in cms]
        assert all(c == colls[0] for c in colls) and len(colls[0]) == expect
        # 4 tokens' partial sums; a VSP row (one link beat or less) a card for the r's
        assert {n for _, n in colls[0]} == {4 * cms[0].dS, cfg.core.vector_lanes}


def test_batch_sums_read_two_segments_and_the_halves_blocks_do_not_meet(xl4):
    """A decode batch's all-gathers place card 0's block alone in a VSP segment, each half's
    in its own area: every addition of the sums in card order reads its two operands from two
    segments (one port each: full rate), and the halves' gathered blocks (both in flight at
    once) do not overlap, for batches cut in halves and not."""
    from host.perf import VOP_BY_CODE
    cfg, cms = xl4
    seg = cfg.core.vsp_words // cfg.core.vsp_segments
    beat = cfg.link.data_bits // 32
    for B in (3, 6, 8):
        blocks = []
        for i in _ops(cms[1].step_batch([(0, 64, s) for s in range(B)])):
            f = i.fields
            if i.op == "COLL" and f["cop"] == 0 and f["n"] % cms[1].dS == 0:
                blocks.append((f["dst"], f["dst"] + len(cms) * round_up(f["n"], beat)))
            if i.op == "VEC" and VOP_BY_CODE[f["vop"]] == "ADD" and f["n"] >= cms[1].dS:
                a, b, n = f["src1"], f["src2"], f["n"]
                assert {a // seg, (a + n - 1) // seg}.isdisjoint({b // seg, (b + n - 1) // seg}), (B, f)
        areas = sorted(set(blocks))
        assert len(areas) == (2 if B > 4 else 1)
        assert all(hi <= lo for (_, hi), (lo, _) in zip(areas, areas[1:], strict=False)), areas


def test_split_program_interleaves_the_halves_in_their_orders(xl4):
    """The cut step's program is the two halves' instructions (each Job as its MATVEC), each
    half's in its own order, and the WLOADs."""
    from host.compiler.emit import Emitter, split_at, split_program
    _, cms = xl4
    cm = cms[3]
    batch = [(0, 64 + s, s) for s in range(8)]
    a = split_at(cm, 8)
    halves = []
    for t0, n in ((0, a), (a, 8 - a)):
        e = Emitter(cm, [0] * n, 0, batch=[(p, s) for _, p, s in batch[t0:t0 + n]], half=(t0, t0 == 0, 8))
        e.items()
        halves.append([encode("MATVEC", **x.fields) if isinstance(x, Job) else x for x in e.out])
    prog = split_program(cm, [0] * 8, 0, batch=[(p, s) for _, p, s in batch])
    merged = [w for w, i in zip(prog, _ops(prog), strict=True) if i.op not in ("WLOAD", "HALT")]
    assert len(merged) == sum(map(len, halves))

    def subsequence(xs):
        it = iter(merged)
        return all(any(x == y for y in it) for x in xs)

    assert all(subsequence(h) for h in halves)


def test_the_merge_only_reorders_each_half(xl4):
    """Every lead and lag of the merge (interleave) keeps each half's instructions in their
    order and the cards' COLLs alike (a lag orders them differently, the same on every card;
    a lead does not reorder them); they do give different orders (the knobs the tuner
    turns)."""
    from host.compiler.tune import LAGS, LEADS
    _, cms = xl4
    cms = [cms[0], cms[3]]          # (6 heads and 7)
    progs = {(lead, lag): [cm.step([0] * 8, 56, lead=lead, lag=lag) for cm in cms]
             for lag in LAGS for lead in LEADS}
    def colls(p):
        return [w for w in p if decode(w).op == "COLL"]

    for (lead, lag), ps in progs.items():
        base = progs[0, LAGS[0]]
        for p, b in zip(ps, base, strict=True):
            assert sorted(w for w in p if decode(w).op != "WLOAD") == \
                sorted(w for w in b if decode(w).op != "WLOAD"), (lead, lag)
        for c, p in enumerate(ps):
            assert sorted(colls(p)) == sorted(colls(base[c])), (lead, lag)
            assert colls(p) == colls(progs[0, lag][c]), (lead, lag)
        kinds = [[(decode(w).cop, decode(w).n) for w in colls(p)] for p in ps]
        assert kinds[0] == kinds[1], (lead, lag)
    assert len({tuple(ps[1]) for ps in progs.values()}) > len(LEADS)


def test_step_programs_keeps_the_fastest_merge():
    """The tuner merges a split step with every lead and lag, keeps the merge ``measure``
    finds fastest (ties: the first tried, the default lag's and the smaller lead),
    remembers it for the step size and measures nothing more for it; steps that are not
    split (one card, one token) are never measured."""
    from host.compiler.tune import LAGS, LEADS, step_programs, tuned, untuned
    model = Gpt2(SHAPES["gpt2"], None)
    cfg = load_config(ROOT / "configs" / "u280x4.yaml")
    cms = [CompiledModel(cfg, model, card=i, cards=2) for i in range(2)]
    merges = [(lead, lag) for lag in LAGS for lead in LEADS]
    cost = dict(zip(merges, [50, 40, 45, 40, 60, 30, 55, 30], strict=True))
    which = {tuple(tuple(p) for p in [cm.step([0] * 8, 16, lead=k, lag=g) for cm in cms]): (k, g)
             for k, g in merges}
    assert len(which) == len(merges) == 8
    seen = []

    def measure(progs):
        merge = which[tuple(tuple(p) for p in progs)]
        seen.append(merge)
        return cost[merge]

    assert untuned(cms, 8) and not untuned(cms, 1)
    progs, cycles = tuned(cms, [0] * 8, 16, measure=measure)
    assert seen == merges and cycles == 30 and cms[0].merges == {8: (1, 1)} and not untuned(cms, 8)
    assert progs == [cm.step([0] * 8, 16, lead=1, lag=1) for cm in cms]
    again, cycles = tuned(cms, [0] * 8, 40, measure=measure)
    assert cycles is None and seen == merges
    assert again == [cm.step([0] * 8, 40, lead=1, lag=1) for cm in cms]
    assert step_programs(cms, [0], 40, measure=measure) == [cm.step([0], 40) for cm in cms]
    one = CompiledModel(cfg, model)
    assert step_programs([one], [0] * 8, 40, measure=measure) == [one.step([0] * 8, 40)]
    assert seen == merges


def test_layer_norm_statistics_are_shared_out(xl4):
    """With 8 tokens on 4 cards each card computes 2 tokens' LayerNorm statistics (two REDSUMs
    each) and gathers the others' r: 4 a LayerNorm, 2 per layer, and the LM head's."""
    _, cms = xl4
    for prog in (cms[0].step_batch([(0, 64, s) for s in range(8)]), cms[1].step([0] * 8, 56)):
        assert sum(1 for i in _ops(prog) if i.op == "VEC" and i.fields["vop"] == 11) in (48 * 2 * 4 + 4,
                                                                                          48 * 2 * 4 + 2)
    # one token: its own, on every card
    assert sum(1 for i in _ops(cms[0].step([0], 64)) if i.op == "VEC" and i.fields["vop"] == 11) == 48 * 4 + 2


def test_v_stores_follow_the_k_stores(xl4):
    """In a step of several tokens a layer's K STOREs (W-element groups) all go out before its
    V STOREs (L-element groups), which the scores' vector work spreads."""
    cfg, _ = xl4
    cm = CompiledModel(cfg, Gpt2(SHAPES["gpt2-xl"], None), card=0, cards=4, split=False)
    kinds = ["K" if i.fields["lepg"] == 6 else "V" for i in _ops(cm.step([0] * 8, 56))
             if i.op == "STORE" and not i.fields["f32"]]
    assert kinds == (["K"] * 8 + ["V"] * 8) * 48


def test_projections_fold_bias_and_residual_on_several_cards(xl4):
    """On several cards a projection's partial sums carry the bias (card 1) and the residual
    (card 0) and the collective writes x, in prefill too (an all-reduce); mlp.c_proj's second
    part adds onto the first's sums in place (no buffer of its own, no addition)."""
    cfg, _ = xl4
    for card in (0, 1):
        cm = CompiledModel(cfg, Gpt2(SHAPES["gpt2-xl"], None), card=card, cards=4, split=False)
        ops = _ops(cm.step([0] * 8, 56))
        assert {i.fields["dst"] for i in ops if i.op == "COLL" and i.fields["cop"] == 2} == {cm.plan.v_x}
        assert not any(i.op == "VEC" and cm.plan.v_yb in (i.fields["src1"], i.fields["src2"]) for i in ops)
        onto = [i for i in ops if i.op == "MATVEC" and i.fields["bias_en"]
                and i.fields["bias"] == i.fields["dst"]]
        assert len(onto) >= 48 and all(i.fields["btok"] for i in onto)


def test_gelu_runs_once_a_region_over_every_token(xl4):
    """Several tokens: c_fc's output in two token-major regions (mlp.c_proj's two parts'
    columns), in VSP and XB alike; one GELU a region a layer, over every token's rows, and
    each part of mlp.c_proj reads its region with the region's width as its stride. One
    token's GELUs are its chunks'."""
    from hw.isa import VOPS
    gelu = VOPS["GELU"][0]
    cfg, _ = xl4
    cm = CompiledModel(cfg, Gpt2(SHAPES["gpt2-xl"], None), card=1, cards=4, split=False)
    T, fS, P, W = 8, cm.dims.fS, cfg.core.vector_lanes, cfg.core.width
    fa = mlp_proj_split(fS, SHAPES["gpt2-xl"].d_model, cfg.core.tile_rows, W, cfg.core.weight_fifo_tiles,
                        cfg.core.int_weights)
    assert 0 < fa < fS
    b = cm.plan
    ops = _ops(cm.step([0] * T, 56))
    gelus = [i.fields for i in ops if i.op == "VEC" and i.fields["vop"] == gelu]
    assert [(g["src1"], g["n"], g["xdst"]) for g in gelus] == \
        [(b.v_h, T * fa, b.x_h), (b.v_h + T * fa, T * (fS - fa), b.x_h + T * fa)] * 48
    # mlp.c_proj's parts: the MATVECs reading x_h's regions, with their widths as strides
    reads = {(i.fields["xb"] * W, i.fields["xstride"] * W) for i in ops if i.op == "MATVEC"
             and b.x_h <= i.fields["xb"] * W < b.x_h + T * fS}
    assert reads == {(b.x_h, fa), (b.x_h + T * fa, fS - fa)}
    # c_fc's MATVECs write the regions token-major
    writes = {(i.fields["dst"] * P, i.fields["dstride"] * P) for i in ops if i.op == "MATVEC"
              and b.v_h <= i.fields["dst"] * P < b.v_h + T * fS}
    assert {s for _, s in writes} == {fa, fS - fa}
    one = [i.fields for i in _ops(cm.step([0], 64)) if i.op == "VEC" and i.fields["vop"] == gelu]
    assert sum(g["n"] for g in one) == 48 * fS and {g["src1"] for g in one} == {b.v_h, b.v_h + fa}

