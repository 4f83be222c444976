"""The one interface through which the host drives a card: the numpy ISS, the Verilator card
and an Alveo U280 through XRT all implement it.

A card is a set of HBM channels (byte-addressed buffers) and the s_axi_control registers
(hw/regs.py). The host writes the program and data into the channels, writes the argument
registers, starts the kernel and waits for ap_done with a timeout.
"""

import numpy as np

from hw import regs
from hw.isa import ERRORS, program_bytes

__all__ = ["Device", "DeviceTimeout", "DeviceError", "status_name"]


class DeviceTimeout(RuntimeError):
    """The card did not finish within the timeout."""


class DeviceError(RuntimeError):
    """The card stopped with an error status."""


def status_name(status):
    code = status & 0xFF
    return ERRORS.get(code, (f"UNKNOWN_{code}", ""))[0]


class Device:
    """Abstract card. Subclasses implement the six primitives; helpers build on them."""

    channels: int
    channel_bytes: int

    # -- primitives -----------------------------------------------------------------------
    def write_hbm(self, channel, offset, data):
        raise NotImplementedError

    def read_hbm(self, channel, offset, nbytes):
        raise NotImplementedError

    def write_reg(self, addr, value):
        raise NotImplementedError

    def read_reg(self, addr):
        raise NotImplementedError

    def start(self):
        raise NotImplementedError

    def wait(self, timeout_s):
        """Block until ap_done or raise DeviceTimeout after ``timeout_s`` seconds."""
        raise NotImplementedError

    # -- helpers ----------------------------------------------------------------------------
    def _check_span(self, channel, offset, nbytes):
        if not 0 <= channel < self.channels:
            raise ValueError(f"channel {channel} out of range 0..{self.channels - 1}")
        if offset < 0 or offset + nbytes > self.channel_bytes:
            raise ValueError(f"HBM access [{offset}, {offset + nbytes}) outside the channel's "
                             f"{self.channel_bytes} bytes")

    def write_reg64(self, addr, value):
        self.write_reg(addr, value & 0xFFFFFFFF)
        self.write_reg(addr + 4, (value >> 32) & 0xFFFFFFFF)

    def read_reg64(self, addr):
        return self.read_reg(addr) | (self.read_reg(addr + 4) << 32)

    def counters(self):
        """Status and performance counters as a dict."""
        out = {name: self.read_reg64(addr) for name, (addr, _doc) in regs.COUNTERS.items()}
        out["status"] &= 0xFFFFFFFF
        return out

    def load_program(self, words, prog_addr):
        data = program_bytes(words)
        self.write_hbm(0, prog_addr, np.frombuffer(data, np.uint8))
        self.write_reg64(regs.ARGS["prog_addr"][0], prog_addr)
        self.write_reg(regs.ARGS["prog_len"][0], len(words))

    def run(self, words, prog_addr, *, timeout_s=60.0):
        """Load and run a program; returns the counters (status included)."""
        self.load_program(words, prog_addr)
        self.start()
        self.wait(timeout_s)
        return self.counters()
