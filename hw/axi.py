"""AXI4 and AXI4-Lite signatures, named as Vitis RTL kernels expect.

Members are the AXI signal names without the interface prefix (``araddr``, ``rvalid``...),
so a component port ``m_axi_hbm0`` flattened with ``_`` gives ``m_axi_hbm0_araddr``: the names
Vivado's ``package_xo`` infers interfaces from.
"""

from amaranth.lib import enum, wiring
from amaranth.lib.wiring import In, Out

__all__ = ["Burst", "Axi4ReadSignature", "Axi4WriteSignature", "Axi4Signature",
           "AxiLiteSignature"]


class Burst(enum.Enum, shape=2):
    FIXED = 0
    INCR = 1
    WRAP = 2


def _check_widths(addr_bits, data_bits, id_bits):
    if addr_bits not in range(12, 65):
        raise ValueError(f"addr_bits must be in [12, 64], not {addr_bits!r}")
    if data_bits not in (32, 64, 128, 256, 512, 1024):
        raise ValueError(f"data_bits must be a power of two in [32, 1024], not {data_bits!r}")
    if id_bits not in range(1, 17):
        raise ValueError(f"id_bits must be in [1, 16], not {id_bits!r}")


class _AxiSignature(wiring.Signature):
    """An AXI signature defined by its widths: two are equal when their type and widths are
    (as Amaranth's own Signature subclasses compare their parameters, not their identity)."""

    def __init__(self, members, **widths):
        self._widths = widths
        for name, value in widths.items():
            setattr(self, name, value)
        super().__init__(members)

    def __eq__(self, other):
        return type(other) is type(self) and self._widths == other._widths

    def __repr__(self):
        args = ", ".join(f"{name}={value}" for name, value in self._widths.items())
        return f"{type(self).__name__}({args})"


class Axi4ReadSignature(_AxiSignature):
    """AR and R channels of an AXI4 manager (master)."""

    def __init__(self, *, addr_bits=64, data_bits=512, id_bits=1):
        _check_widths(addr_bits, data_bits, id_bits)
        super().__init__({
            "arid": Out(id_bits), "araddr": Out(addr_bits), "arlen": Out(8), "arsize": Out(3),
            "arburst": Out(2), "arvalid": Out(1), "arready": In(1),
            "rid": In(id_bits), "rdata": In(data_bits), "rresp": In(2), "rlast": In(1),
            "rvalid": In(1), "rready": Out(1),
        }, addr_bits=addr_bits, data_bits=data_bits, id_bits=id_bits)


class Axi4WriteSignature(_AxiSignature):
    """AW, W and B channels of an AXI4 manager (master)."""

    def __init__(self, *, addr_bits=64, data_bits=512, id_bits=1):
        _check_widths(addr_bits, data_bits, id_bits)
        super().__init__({
            "awid": Out(id_bits), "awaddr": Out(addr_bits), "awlen": Out(8), "awsize": Out(3),
            "awburst": Out(2), "awvalid": Out(1), "awready": In(1),
            "wdata": Out(data_bits), "wstrb": Out(data_bits // 8), "wlast": Out(1),
            "wvalid": Out(1), "wready": In(1),
            "bid": In(id_bits), "bresp": In(2), "bvalid": In(1), "bready": Out(1),
        }, addr_bits=addr_bits, data_bits=data_bits, id_bits=id_bits)


class Axi4Signature(_AxiSignature):
    """A full AXI4 manager: the read and write channels side by side, flat."""

    def __init__(self, *, addr_bits=64, data_bits=512, id_bits=1):
        kw = dict(addr_bits=addr_bits, data_bits=data_bits, id_bits=id_bits)
        members = dict(Axi4ReadSignature(**kw).members.items())
        members.update(Axi4WriteSignature(**kw).members.items())
        super().__init__(members, **kw)


class AxiLiteSignature(_AxiSignature):
    """AXI4-Lite subordinate (slave) port, as ``s_axi_control``."""

    def __init__(self, *, addr_bits=12, data_bits=32):
        if data_bits not in (32, 64):
            raise ValueError(f"data_bits must be 32 or 64, not {data_bits!r}")
        super().__init__({
            "awaddr": In(addr_bits), "awvalid": In(1), "awready": Out(1),
            "wdata": In(data_bits), "wstrb": In(data_bits // 8), "wvalid": In(1), "wready": Out(1),
            "bresp": Out(2), "bvalid": Out(1), "bready": In(1),
            "araddr": In(addr_bits), "arvalid": In(1), "arready": Out(1),
            "rdata": Out(data_bits), "rresp": Out(2), "rvalid": Out(1), "rready": In(1),
        }, addr_bits=addr_bits, data_bits=data_bits)
