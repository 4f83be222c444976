"""AXI4, AXI4-Lite and AXI4-Stream signatures, named as Vitis RTL kernels expect.

Members are the AXI signal names without the interface prefix (``araddr``, ``rvalid``...),
so a component port ``m_axi_hbm0`` flattened with ``_`` gives ``m_axi_hbm0_araddr``: the names
Vivado's ``package_xo`` infers interfaces from.
"""

from amaranth.hdl import unsigned
from amaranth.lib import enum, wiring
from amaranth.lib.wiring import In, Out

__all__ = ["Burst", "Resp", "Axi4ReadSignature", "Axi4WriteSignature", "Axi4Signature",
           "AxiLiteSignature", "AxiStreamSignature"]


class Burst(enum.Enum, shape=2):
    FIXED = 0
    INCR = 1
    WRAP = 2


class Resp(enum.Enum, shape=2):
    OKAY = 0
    EXOKAY = 1
    SLVERR = 2
    DECERR = 3


def _check_widths(addr_bits, data_bits, id_bits):
    if addr_bits not in range(12, 65):
        raise ValueError(f"addr_bits must be in [12, 64], not {addr_bits!r}")
    if data_bits not in (32, 64, 128, 256, 512, 1024):
        raise ValueError(f"data_bits must be a power of two in [32, 1024], not {data_bits!r}")
    if id_bits not in range(1, 17):
        raise ValueError(f"id_bits must be in [1, 16], not {id_bits!r}")


class Axi4ReadSignature(wiring.Signature):
    """AR and R channels of an AXI4 manager (master)."""

    def __init__(self, *, addr_bits=64, data_bits=512, id_bits=1):
        _check_widths(addr_bits, data_bits, id_bits)
        self.addr_bits, self.data_bits, self.id_bits = addr_bits, data_bits, id_bits
        super().__init__({
            "arid": Out(id_bits), "araddr": Out(addr_bits), "arlen": Out(8), "arsize": Out(3),
            "arburst": Out(2), "arvalid": Out(1), "arready": In(1),
            "rid": In(id_bits), "rdata": In(data_bits), "rresp": In(2), "rlast": In(1),
            "rvalid": In(1), "rready": Out(1),
        })

    def __eq__(self, other):
        return (type(other) is type(self) and
                (self.addr_bits, self.data_bits, self.id_bits) ==
                (other.addr_bits, other.data_bits, other.id_bits))

    def __repr__(self):
        return f"Axi4ReadSignature(addr_bits={self.addr_bits}, data_bits={self.data_bits})"


class Axi4WriteSignature(wiring.Signature):
    """AW, W and B channels of an AXI4 manager (master)."""

    def __init__(self, *, addr_bits=64, data_bits=512, id_bits=1):
        _check_widths(addr_bits, data_bits, id_bits)
        self.addr_bits, self.data_bits, self.id_bits = addr_bits, data_bits, id_bits
        super().__init__({
            "awid": Out(id_bits), "awaddr": Out(addr_bits), "awlen": Out(8), "awsize": Out(3),
            "awburst": Out(2), "awvalid": Out(1), "awready": In(1),
            "wdata": Out(data_bits), "wstrb": Out(data_bits // 8), "wlast": Out(1),
            "wvalid": Out(1), "wready": In(1),
            "bid": In(id_bits), "bresp": In(2), "bvalid": In(1), "bready": Out(1),
        })

    def __eq__(self, other):
        return (type(other) is type(self) and
                (self.addr_bits, self.data_bits, self.id_bits) ==
                (other.addr_bits, other.data_bits, other.id_bits))

    def __repr__(self):
        return f"Axi4WriteSignature(addr_bits={self.addr_bits}, data_bits={self.data_bits})"


class Axi4Signature(wiring.Signature):
    """A full AXI4 manager: the read and write channels side by side, flat."""

    def __init__(self, *, addr_bits=64, data_bits=512, id_bits=1):
        self.addr_bits, self.data_bits, self.id_bits = addr_bits, data_bits, id_bits
        kw = dict(addr_bits=addr_bits, data_bits=data_bits, id_bits=id_bits)
        members = dict(Axi4ReadSignature(**kw).members.items())
        members.update(Axi4WriteSignature(**kw).members.items())
        super().__init__(members)

    def __eq__(self, other):
        return (type(other) is type(self) and
                (self.addr_bits, self.data_bits, self.id_bits) ==
                (other.addr_bits, other.data_bits, other.id_bits))

    def __repr__(self):
        return f"Axi4Signature(addr_bits={self.addr_bits}, data_bits={self.data_bits})"


class AxiLiteSignature(wiring.Signature):
    """AXI4-Lite subordinate (slave) port, as ``s_axi_control``."""

    def __init__(self, *, addr_bits=12, data_bits=32):
        if data_bits not in (32, 64):
            raise ValueError(f"data_bits must be 32 or 64, not {data_bits!r}")
        self.addr_bits, self.data_bits = addr_bits, data_bits
        super().__init__({
            "awaddr": In(addr_bits), "awvalid": In(1), "awready": Out(1),
            "wdata": In(data_bits), "wstrb": In(data_bits // 8), "wvalid": In(1), "wready": Out(1),
            "bresp": Out(2), "bvalid": Out(1), "bready": In(1),
            "araddr": In(addr_bits), "arvalid": In(1), "arready": Out(1),
            "rdata": Out(data_bits), "rresp": Out(2), "rvalid": Out(1), "rready": In(1),
        })

    def __eq__(self, other):
        return (type(other) is type(self) and
                (self.addr_bits, self.data_bits) == (other.addr_bits, other.data_bits))

    def __repr__(self):
        return f"AxiLiteSignature(addr_bits={self.addr_bits}, data_bits={self.data_bits})"


class AxiStreamSignature(wiring.Signature):
    """AXI4-Stream source (transmitter): tdata, tkeep, tlast, tvalid, tready."""

    def __init__(self, *, data_bits=512):
        if data_bits % 8 or data_bits <= 0:
            raise ValueError(f"data_bits must be a positive multiple of 8, not {data_bits!r}")
        self.data_bits = data_bits
        super().__init__({
            "tdata": Out(unsigned(data_bits)), "tkeep": Out(data_bits // 8), "tlast": Out(1),
            "tvalid": Out(1), "tready": In(1),
        })

    def __eq__(self, other):
        return type(other) is type(self) and self.data_bits == other.data_bits

    def __repr__(self):
        return f"AxiStreamSignature(data_bits={self.data_bits})"
