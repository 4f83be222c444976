"""The gptfpga instruction set: one definition for the hardware decoder, the host encoder,
the ISS and docs/isa.md.

Pure Python (no Amaranth, no numpy): the host imports it too.

Every instruction is 128 bits. Bits [3:0] hold the opcode; the fields of each format follow
from bit 4 upwards in the order listed, least significant first. Opcode 0 is illegal, so that
a program that runs into zeroed memory stops with an error instead of doing nothing.

Address spaces
--------------
- VSP: the vector scratchpad, fp32 words (``core.vsp_words`` of them, at most 2^20), word
  addresses of ADDR_BITS; MATVEC addresses it by rows of ``core.vector_lanes`` words.
- XB: the matrix unit's input buffer, fp16 words (``core.xb_words``, at most 2^20), word
  addresses of ADDR_BITS; MATVEC addresses it by rows of ``core.width`` words.
- HBM rows: a *stripe row* r is beat r of every HBM channel: ``channels x beat_bytes`` bytes,
  channel c holding bytes ``[c*beat_bytes, (c+1)*beat_bytes)`` of the stripe. Weight tiles,
  vectors and the KV cache are all placed by stripe row.
"""

from dataclasses import dataclass

__all__ = ["INSN_BITS", "ADDR_BITS", "MATVEC_ROW_BITS", "MATVEC_CB_BITS", "Field", "Format", "FORMATS",
           "OPCODES", "UNITS", "UNIT_OF", "ACC_DEPTH", "MAX_TOKENS", "QGROUP", "VOPS", "ERRORS", "encode",
           "decode", "Insn", "isa_markdown", "store_row_mode"]

INSN_BITS = 128
OPCODE_BITS = 4
ADDR_BITS = 20          # VSP and XB word addresses and element counts of LOAD, STORE and VEC
MATVEC_ROW_BITS = 16    # MATVEC's VSP and XB addresses and strides, in rows
MATVEC_CB_BITS = 10     # MATVEC's column blocks: a matrix (or a V cache) at most 1,023 x width columns wide
ACC_DEPTH = 256         # the matrix unit's accumulator slots: MATVEC group x tokens at most
MAX_TOKENS = 32         # MATVEC.tokens at most (token vectors sharing each weight tile)
QGROUP = 8              # MATVEC.i8's group at most: the row blocks whose scales the matrix unit holds


@dataclass(frozen=True)
class Field:
    name: str
    bits: int
    doc: str


@dataclass(frozen=True)
class Format:
    name: str
    opcode: int
    unit: str
    fields: tuple
    doc: str

    def offsets(self):
        """{field name: (lsb, bits)}"""
        out, pos = {}, OPCODE_BITS
        for f in self.fields:
            out[f.name] = (pos, f.bits)
            pos += f.bits
        return out


F = Field

FORMATS = (
    Format("HALT", 1, "ctrl", (), "Wait until every unit is idle, then stop: ap_done, status OK."),
    Format("FENCE", 2, "ctrl", (), "Wait until every issued instruction has completed."),
    Format("LOAD", 3, "dma_rd", (
        F("vsp", ADDR_BITS, "first VSP word written"),
        F("n", ADDR_BITS, "elements to load (>= 1)"),
        F("row", 24, "first stripe row read"),
        F("f32", 1, "the elements are fp32 words (4 bytes) taken as they are, not fp16"),
    ), "VSP[vsp + i] = fp32(fp16 element i of the stripe rows from `row`), i < n. Element i "
       "is at byte 2i (4i with f32) of the run of stripes starting at `row`."),
    Format("STORE", 4, "dma_wr", (
        F("vsp", ADDR_BITS, "first VSP word read"),
        F("n", 16, "elements to store (>= 1)"),
        F("row", 24, "first stripe row written"),
        F("off", 12, "byte offset of the first group in its stripe row"),
        F("lepg", 4, "log2 of the elements per group (contiguous fp16)"),
        F("lgpr", 4, "log2 of the groups per stripe row"),
        F("gstride", 12, "bytes from one group to the next in a row"),
        F("rstride", 16, "stripe rows from one row of groups to the next"),
        F("f32", 1, "store the fp32 words as they are (4 bytes each) instead of rounding to fp16"),
    ), "Element i = VSP[vsp + i] rounded to fp16 (or as fp32 with f32; z = 2 or 4 bytes), written "
       "at group g = i / epg, place e = i % epg (epg = 2^lepg, gpr = 2^lgpr): stripe row "
       "`row + (g / gpr) * rstride`, byte `off + (g % gpr) * gstride + z e`. off and gstride are "
       "multiples of z; the groups of a row fit in the stripe and do not overlap. A linear "
       "vector is one group per row; a K-cache row is W-element groups one tile apart; a V^T "
       "column is one-element groups one lane apart."),
    Format("WLOAD", 5, "dma_rd", (
        F("row", 24, "first stripe row (tile) read"),
        F("tiles", 24, "tiles to stream (>= 1)"),
    ), "Stream stripe rows [row, row + tiles) into the weight FIFO, one tile (lanes x width fp16) "
       "per row, for the MATVECs that follow to consume in order. The tiles streamed and not yet "
       "claimed by an issued MATVEC must fit in the FIFO (core.weight_fifo_tiles), so that every "
       "WLOAD completes without waiting for a later instruction."),
    Format("MATVEC", 6, "mpu", (
        F("xb", MATVEC_ROW_BITS, "XB row (width words) of token 0's input vector"),
        F("dst", MATVEC_ROW_BITS, "VSP row (vector_lanes words) of token 0's output"),
        F("bias", MATVEC_ROW_BITS, "VSP row of the bias (when bias_en)"),
        F("rb", 16, "row blocks (lanes rows each, >= 1)"),
        F("cb", MATVEC_CB_BITS, "column blocks (width columns each, >= 1)"),
        F("group", 8, "row blocks per group in the tile order (>= 1)"),
        F("tokens", MAX_TOKENS.bit_length(), f"token vectors sharing each tile, 1..{MAX_TOKENS} (prefill)"),
        F("xstride", MATVEC_ROW_BITS, "XB rows from one token's input to the next"),
        F("dstride", MATVEC_ROW_BITS, "VSP rows from one token's output to the next"),
        F("bias_en", 1, "start each sum from the bias instead of the first partial sum"),
        F("tt", 1, "the tiles are stored transposed: element (r, c) of a tile at c*lanes + r "
                   "(the V cache's layout, where a new position's column is contiguous)"),
        F("i8", 1, "the tiles are integer weights with a scale per row (core.weight_dtype "
                   "int8 or int16 builds; not with tt)"),
        F("btok", 1, "with bias_en: each token has its own bias, token t's at bias + t*dstride "
                     "(a decode batch's streams, each starting from its own residual)"),
    ), "Addresses and strides are in rows: xb and xstride of width XB words, dst, bias and "
       "dstride of vector_lanes VSP words (below, x = width * xb, d = vector_lanes * dst, "
       "and so on, in words). For each token t and row r < rb*lanes: VSP[d + t*ds + r] = "
       "bias[r] + sum over "
       "column blocks c of dot(W[r, cW:(c+1)W], XB[x + t*xs + cW : ...]) (the block "
       "floating-point dot product of docs/numerics.md, fp32), consuming "
       "rb*cb tiles from the weight FIFO in the order: groups of `group` row blocks; within a "
       "group, column block by column block; within that, row block by row block. group x "
       f"tokens <= {ACC_DEPTH} (the accumulator depth). With btok the bias is "
       "bias[t*ds + r], token t's own (it may be dst itself: in place, token by token). "
       "With i8 a tile (a stripe row) holds Q rows of width integer weights, row r at "
       "elements [r*width, (r+1)*width): Q = 2*lanes int8 (an int8 build) or lanes int16, "
       "little-endian (an int16 build), so a row block is Q rows (r < rb*Q), and each "
       "group's tiles are preceded in the "
       "stream by one stripe row of its rows' scales, one byte E a row (the scale is "
       "2^(E - 127)): rb*cb + ceil(rb/group) tiles, group*Q <= the stripe's bytes and "
       f"group <= {QGROUP} (the matrix unit's scale register); "
       "each column block's dot is the exact integer sum of the weights times the "
       "block-aligned activations, scaled, rounded once to fp32 (docs/numerics.md)."),
    Format("VEC", 7, "vpu", (
        F("vop", 5, "vector operation (VOPS)"),
        F("dst", ADDR_BITS, "destination word (VSP, or XB for CVT16)"),
        F("src1", ADDR_BITS, "first source VSP word"),
        F("src2", ADDR_BITS, "second source VSP word"),
        F("n", ADDR_BITS, "elements (>= 1)"),
        F("k", 16, "MASK: last unmasked index"),
        F("bcast", 1, "src2 is one word broadcast to every element"),
        F("x16", 1, "also write fp16(dst[i]) to XB[xdst + i] (elementwise operations but CVT16)"),
        F("xdst", ADDR_BITS, "with x16: first XB word written"),
    ), "dst[i] = op(src1[i], src2[i or 0]), i < n; reductions write one word. With x16 an "
       "elementwise result also goes to XB as fp16, rounded as CVT16 rounds (the next MATVEC's "
       "input without a CVT16 pass over it)."),
    Format("COLL", 8, "coll", (
        F("cop", 2, "0 all-gather, 1 reduce-scatter, 2 all-reduce"),
        F("src", 24, "this card's input: first VSP word, or first stripe row with hbm"),
        F("dst", 24, "the result: first VSP word, or first stripe row with hbm"),
        F("n", 24, "fp32 words of each card's input (>= 1)"),
        F("hbm", 1, "input and result are in HBM (stripe rows) instead of the VSP"),
        F("x16", 1, "an all-reduce in the VSP also writes its result as fp16 to XB[xdst:]"),
        F("xdst", ADDR_BITS, "with x16: first XB word written"),
    ), "A ring collective over every card of the appliance, all of which execute the same COLL "
       "(the same cop and n; where its data live, hbm, is each card's own) as their k-th "
       "COLL. Words are grouped in beats of B = "
       "link.data_bits / 32 (the input zero-padded to nb = ceil(n / B) beats) and the "
       "reductions are fp32 in the order of docs/collectives.md (sim/ref/collective.py), over "
       "the config's ring (one direction, or both for a bidirectional ring). All-gather: "
       "out[j*nb*B + i] = card j's in[i]. All-reduce: out[i] = the reduced word i, i < nb*B. "
       "Reduce-scatter: the words of this card's segments only, at their offsets in out. "
       "Without hbm, in = VSP[src:] and out = VSP[dst:] (src + n and dst + the result's size "
       "within the VSP). With hbm, in and out are fp32 words in HBM: word i at byte 4i of the "
       "run of stripe rows from src (dst), as LOAD.f32 and STORE.f32 place them, so messages "
       "larger than the VSP go card to card from HBM to HBM; later instructions that touch "
       "those rows wait for the COLL (the scoreboard holds its HBM row ranges). The card "
       "kernel runs it on its collective unit (hw/core/coll.py) beside the other units (the "
       "scoreboard orders it like a MATVEC: it reads its input range and writes its result "
       "range) when the `card` register names a ring of 2 to 16 cards with this card's id "
       "below their number; otherwise it is ILLEGAL_OPCODE, as on a lone card. Peers that do "
       "not reach a matching COLL end with RING_ERROR (on the card: a frame the schedule did "
       "not expect, a dead link, or half the watchdog without a beat on the links); after a "
       "RING_ERROR the card refuses further COLLs until it is reset. With x16 (all-reduce in "
       "the VSP only; each card's own choice, like hbm) every result word also goes to XB as "
       "fp16, XB[xdst + i] = fp16(out[i]) for i < nb*B, rounded as CVT16 rounds: the next "
       "MATVEC's input without a CVT16 pass over it."),
)

FORMAT_BY_NAME = {f.name: f for f in FORMATS}
OPCODES = {f.name: f.opcode for f in FORMATS}
FORMAT_BY_OPCODE = {f.opcode: f for f in FORMATS}
UNIT_OF = {f.name: f.unit for f in FORMATS}
# The units that execute instructions (all but the controller), in the order of their codes.
UNITS = tuple(dict.fromkeys(f.unit for f in FORMATS if f.unit != "ctrl"))

# Vector operations: name -> (code, arity, doc)
VOPS = {
    "ADD": (0, 2, "src1 + src2"),
    "SUB": (1, 2, "src1 - src2 (src1 + (src2 with its sign flipped))"),
    "MUL": (2, 2, "src1 * src2"),
    "MAX": (3, 2, "max(src1, src2)"),
    "MOV": (4, 1, "src1 (copy)"),
    "EXP": (5, 1, "exp(src1)"),
    "RECIP": (6, 1, "1 / src1"),
    "RSQRT": (7, 1, "1 / sqrt(src1)"),
    "GELU": (8, 1, "gelu(src1), tanh form"),
    "MASK": (9, 1, "src1[i] if i <= k else -inf"),
    "CVT16": (10, 1, "fp16(src1[i]) written to XB[dst + i]"),
    "REDSUM": (11, 1, "sum of src1[0:n] (see below): one word at dst"),
    "REDMAX": (12, 1, "max of src1[0:n] (see below): one word at dst"),
}
VOP_BY_CODE = {code: name for name, (code, _, _) in VOPS.items()}
BINARY_VOPS = tuple(code for code, arity, _ in VOPS.values() if arity == 2)
REDUCE_VOPS = (VOPS["REDSUM"][0], VOPS["REDMAX"][0])

# Status codes (the status register; 0 = OK). The first error stops the core cleanly.
ERRORS = {
    0: ("OK", "finished at HALT"),
    1: ("ILLEGAL_OPCODE", "an opcode or vector operation that does not exist"),
    2: ("BAD_FIELD", f"a length of zero, a token count outside 1..{MAX_TOKENS}, a group of zero, x16 on a "
                     "reduction or CVT16"),
    3: ("VSP_RANGE", "a VSP access beyond core.vsp_words"),
    4: ("XB_RANGE", "an XB access beyond core.xb_words"),
    5: ("HBM_RANGE", "an HBM access beyond the channel's capacity"),
    6: ("PROGRAM_OVERRUN", "the program ended without HALT"),
    7: ("WEIGHT_UNDERFLOW", "a MATVEC needs more tiles than the WLOADs before it stream"),
    8: ("WEIGHT_LEFTOVER", "HALT with streamed tiles that no MATVEC consumed"),
    9: ("AXI_ERROR", "an HBM access answered with an error response"),
    10: ("TIMEOUT", "no unit made progress for the watchdog's limit"),
    11: ("WEIGHT_OVERFLOW", "a WLOAD would leave more streamed, unclaimed tiles than the "
                            "weight FIFO holds (core.weight_fifo_tiles)"),
    12: ("ALIGN", "a vector operand (VSP or XB) not aligned to core.vector_lanes (MATVEC's "
                  "addresses are rows: always aligned)"),
    13: ("OVERLAP", "source and destination ranges of one instruction overlap (other than "
                    "exactly in place)"),
    14: ("RING_ERROR", "a collective whose peers did not all reach a matching COLL, or a ring "
                       "link that gave up"),
}
ERROR_CODES = {name: code for code, (name, _) in ERRORS.items()}


@dataclass(frozen=True)
class Insn:
    op: str
    fields: dict

    def __getattr__(self, name):
        try:
            return self.fields[name]
        except KeyError:
            raise AttributeError(name) from None


def store_row_mode(f32, lepg, off, gstride, lanes, beat_bytes):
    """Whether the store engine takes a STORE a VSP row a cycle, not an element a cycle (the
    engine's timing, not the ISA's semantics: hw/core/store.py decides the same from the
    command, the performance model times STOREs by it). Its fields as integers: every group
    is whole VSP rows (2^lepg >= lanes; STORE's vsp is row-aligned), and a row's bytes
    (lanes x z) fit in a channel beat and start a multiple of their size into the stripe
    (off and gstride multiples of it)."""
    rb = lanes * (4 if f32 else 2)
    return rb <= beat_bytes and (1 << lepg) >= lanes and off % rb == 0 and gstride % rb == 0


def encode(op, **fields):
    """128-bit integer of instruction ``op`` with ``fields`` (missing fields are 0)."""
    fmt = FORMAT_BY_NAME[op]
    word = fmt.opcode
    offs = fmt.offsets()
    for name, value in fields.items():
        if name not in offs:
            raise ValueError(f"{op}: no field {name!r} (fields: {', '.join(offs)})")
        if name == "vop" and isinstance(value, str):
            value = VOPS[value][0]
        lsb, bits = offs[name]
        value = int(value)
        if not 0 <= value < (1 << bits):
            raise ValueError(f"{op}.{name}: {value} does not fit in {bits} bits")
        word |= value << lsb
    return word


def decode(word):
    """Insn of a 128-bit integer; op is 'ILLEGAL' for an unknown opcode."""
    fmt = FORMAT_BY_OPCODE.get(word & ((1 << OPCODE_BITS) - 1))
    if fmt is None:
        return Insn("ILLEGAL", {})
    fields = {n: (word >> lsb) & ((1 << bits) - 1) for n, (lsb, bits) in fmt.offsets().items()}
    return Insn(fmt.name, fields)


def program_bytes(words):
    """Little-endian bytes of a list of 128-bit instruction words."""
    return b"".join(int(w).to_bytes(16, "little") for w in words)


def isa_markdown():
    lines = ["# ISA", "",
             "Generated from `hw/isa.py` (`python -m gen.docs`); a test fails when this file is stale.",
             "", "Every instruction is 128 bits, little-endian in memory; bits [3:0] are the opcode,",
             "fields follow from bit 4 in the order listed. Opcode 0 is illegal.", ""]
    for f in FORMATS:
        lines += [f"## {f.name} (opcode {f.opcode}, unit `{f.unit}`)", "", f.doc, ""]
        if f.fields:
            lines += ["| field | bits | lsb | meaning |", "|---|---|---|---|"]
            for fld in f.fields:
                lsb = f.offsets()[fld.name][0]
                lines.append(f"| `{fld.name}` | {fld.bits} | {lsb} | {fld.doc} |")
            lines.append("")
    lines += ["## Vector operations (VEC.vop)", "", "| vop | code | operands | result |",
              "|---|---|---|---|"]
    for name, (code, arity, doc) in VOPS.items():
        lines.append(f"| `{name}` | {code} | {arity} | {doc} |")
    lines += ["", "Reductions (REDSUM, REDMAX; n at most max(limits.d_model, limits.seq_len rounded up to "
              "a multiple of core.width)): the "
              "elements are laid out in rows of `vector_lanes`, missing elements set to the "
              "identity (-0 for the sum, -inf for the max). Then, at least once and until one row "
              "is left: with h = ceil(rows / 2), row i becomes op(row i, row i + h) (the identity "
              "row where i + h >= rows). Then the lanes of the last row fold in halves, lane j "
              "becoming op(lane j, lane j + half), until one lane is left.",
              "", "## Status codes", "", "| code | name | cause |", "|---|---|---|"]
    for code, (name, doc) in ERRORS.items():
        lines.append(f"| {code} | `{name}` | {doc} |")
    return "\n".join(lines) + "\n"
