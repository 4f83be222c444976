"""The commands the issue stage hands to each unit, derived from the ISA (hw/isa.py).

A unit command is the instruction's own fields: ``format_layout(op)`` is a
``data.StructLayout`` of the format's fields in the format's order, so that its bits are
exactly the instruction word's bits above the opcode (a StructLayout puts its first field in
the least significant bits, as the ISA does). A width changed in hw/isa.py changes the
command with it; nothing is retyped here. ``fields(word, op)`` views an instruction word as
that layout.

The read DMA's command serves two instructions (LOAD and WLOAD) and carries a count the
issue stage computes (stripe rows to read), so it is the one layout built here by hand, from
the two formats' widths. The commands of the units that access HBM (read DMA, STORE, COLL)
carry the instruction's pc: an error response is reported at the instruction it answered.
"""

from amaranth.lib import data

from hw.isa import FORMAT_BY_NAME, OPCODE_BITS

__all__ = ["PC_BITS", "format_layout", "fields", "MatvecCmd", "VecCmd", "StoreCmd", "CollCmd",
           "DmaReadCmd"]

PC_BITS = 24            # instruction index: the status register's bits [31:8] (hw/regs.py)


def format_layout(op, **extra):
    """``data.StructLayout`` of instruction ``op``'s fields, then the ``extra`` name -> shape."""
    fmt = FORMAT_BY_NAME[op]
    members = {f.name: f.bits for f in fmt.fields}
    clash = set(members) & set(extra)
    if clash:
        raise ValueError(f"{op}: extra fields {sorted(clash)} clash with the format's fields")
    return data.StructLayout({**members, **extra})


def fields(word, op):
    """View of the 128-bit instruction ``word`` as ``format_layout(op)``."""
    layout = format_layout(op)
    return layout(word[OPCODE_BITS:OPCODE_BITS + layout.size])


def _bits(op, name):
    return FORMAT_BY_NAME[op].offsets()[name][1]


MatvecCmd = format_layout("MATVEC")
VecCmd = format_layout("VEC")
StoreCmd = format_layout("STORE", pc=PC_BITS)          # the pc names the STORE in an AXI_ERROR
CollCmd = format_layout("COLL", pc=PC_BITS)            # ... the COLL in a RING_ERROR or AXI_ERROR

assert _bits("LOAD", "row") == _bits("WLOAD", "row")
DmaReadCmd = data.StructLayout({
    "wload": 1,                                         # WLOAD (else LOAD)
    "row": _bits("LOAD", "row"),                        # first stripe row
    "count": _bits("WLOAD", "tiles"),                   # stripe rows to read (LOAD: ceil(bytes / S))
    "vsp": _bits("LOAD", "vsp"), "n": _bits("LOAD", "n"), "f32": _bits("LOAD", "f32"),
    "pc": PC_BITS,                                      # the instruction (an AXI_ERROR's pc)
})
