"""Amaranth component -> Verilog, with flat, Vitis-style port names."""

from amaranth._toolchain.yosys import find_yosys
from amaranth.back import rtlil, verilog
from amaranth.hdl import Signal, Value, ValueCastable
from amaranth.hdl._ir import PortDirection
from amaranth.lib import wiring

__all__ = ["PortDirection", "flat_ports", "to_verilog"]


def flat_ports(component, sep="_"):
    """Ports of a component as ``{name: (signal, direction)}``, nested names joined by ``sep``.

    ``m_axi_hbm0`` with member ``araddr`` becomes ``m_axi_hbm0_araddr`` (Amaranth's default
    joins with ``__``, which Vivado does not recognise as an AXI interface).
    """
    ports = {}
    for path, member, value in component.signature.flatten(component):
        if isinstance(value, ValueCastable):
            value = value.as_value()
        if not isinstance(value, Value):
            continue   # a constant member (e.g. an always-ready stream's ready): not a port
        if member.flow == wiring.In:
            direction = PortDirection.Input
        else:
            direction = PortDirection.Output
        name = sep.join(str(p) for p in path)
        if name in ports:
            raise ValueError(f"port name {name!r} is produced twice when flattening with {sep!r}")
        if isinstance(value, Signal) and value.name != name:
            # Name the signal after its port, so that Yosys does not keep the old name as a
            # second, unused wire beside the port.
            value.name = name
        ports[name] = (value, direction)
    return ports


def to_verilog(component, name, *, extra_ports=None, purge=False):
    """Verilog text of ``component`` as module ``name``.

    ``extra_ports`` adds ``{name: (signal, direction)}`` entries (e.g. a Vitis top's
    ``ap_clk``); the ``sync`` domain's clock and reset become ``clk`` and ``rst`` otherwise.

    ``purge=True`` also removes the wires Amaranth keeps only as debug names (every named
    signal and struct field gets one, most unused by the logic): the netlist is the same, and
    Verilator's unused-signal lint then speaks only of real dead logic. Used by ``lint``.
    """
    ports = flat_ports(component)
    if extra_ports:
        ports.update(extra_ports)
    if not purge:
        return verilog.convert(component, name=name, ports=ports, emit_src=False)
    text = rtlil.convert(component, name=name, ports=ports, emit_src=False)
    yosys = find_yosys(lambda ver: ver >= (0, 40))
    # Full `proc` (not Amaranth's `proc -nomux -norom`): opt_clean skips modules that still
    # hold processes.
    script = [f"read_rtlil <<rtlil\n{text}\nrtlil", "proc", "memory_collect",
              "opt_clean -purge", "write_verilog -norename"]
    return yosys.run(["-q", "-"], "\n".join(script), ignore_warnings=True)
