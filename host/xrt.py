"""The card on an Alveo U280 through XRT's Python binding (pyxrt).

UNTESTED ON HARDWARE: written against pyxrt's documented API (XRT 2.14+: device, xclbin,
hw_context, kernel, bo, run); nobody has run it on a board yet. Kernel arguments, in the order
the Vitis packaging declares them: prog_addr, prog_len, card, insn_ptr, then hbm0 .. hbm<C-1>
(one buffer per HBM channel, each mapped to its own HBM bank by the v++ link config).
"""

from hw import regs

from .device import Device, DeviceTimeout
from .errors import UserError

__all__ = ["XrtDevice", "check_xrt"]

KERNEL_ARGS = regs.KERNEL_ARGS      # then hbm0 .. hbm<C-1>


def check_xrt(xclbin):
    """What the XRT backend needs before any work: an xclbin file and pyxrt. Returns pyxrt."""
    from pathlib import Path
    if not xclbin:
        raise UserError("--xclbin: required with --backend xrt (the file `make package` "
                        "builds with v++)")
    if not Path(xclbin).is_file():
        raise UserError(f"--xclbin: {str(xclbin)!r} is not a file; allowed: the gptfpga.xclbin that "
                        f"v++ links (`make package`, then make in its folder)")
    try:
        import pyxrt
    except ImportError:
        raise UserError("--backend xrt: pyxrt cannot be imported; install XRT and source "
                        "/opt/xilinx/xrt/setup.sh") from None
    return pyxrt


class XrtDevice(Device):
    def __init__(self, cfg, *, xclbin=None, index=0):
        pyxrt = check_xrt(xclbin)
        self.px = pyxrt
        self.cfg = cfg
        self.channels = cfg.hbm.channels
        self.channel_bytes = cfg.hbm.channel_mbytes << 20
        self.dev = pyxrt.device(index)
        xb = pyxrt.xclbin(str(xclbin))
        self.dev.register_xclbin(xb)
        self.ctx = pyxrt.hw_context(self.dev, xb.get_uuid())
        self.kernel = pyxrt.kernel(self.ctx, regs.KERNEL)
        base = len(KERNEL_ARGS)
        self.bos = [pyxrt.bo(self.dev, self.channel_bytes, pyxrt.bo.normal, self.kernel.group_id(base + k))
                    for k in range(self.channels)]
        self.args = {"prog_addr": 0, "prog_len": 0, "card": regs.card_register(0, 1), "insn_ptr": 0}
        self.run_ = None

    def write_hbm(self, channel, offset, data):
        import numpy as np
        data = np.ascontiguousarray(np.asarray(data, np.uint8).reshape(-1))
        self._check_span(channel, offset, len(data))
        self.bos[channel].write(data, offset)
        self.bos[channel].sync(self.px.xclBOSyncDirection.XCL_BO_SYNC_BO_TO_DEVICE, len(data), offset)

    def read_hbm(self, channel, offset, nbytes):
        import numpy as np
        self._check_span(channel, offset, nbytes)
        self.bos[channel].sync(self.px.xclBOSyncDirection.XCL_BO_SYNC_BO_FROM_DEVICE, nbytes, offset)
        return np.asarray(self.bos[channel].read(nbytes, offset), np.uint8)

    def write_reg(self, addr, value):
        # Arguments go through the run object (XRT writes them at start); 64-bit ones come
        # as two words, low first.
        for name, (a, bits, _doc) in regs.ARGS.items():
            if addr == a:
                self.args[name] = (self.args[name] & ~0xFFFFFFFF) | value
                return
            if bits == 64 and addr == a + 4:
                self.args[name] = (self.args[name] & 0xFFFFFFFF) | (value << 32)
                return
        raise ValueError(f"register {addr:#x} is not a kernel argument")

    def read_reg(self, addr):
        return int(self.kernel.read_register(addr))

    def start(self):
        run = self.px.run(self.kernel)
        for i, name in enumerate(KERNEL_ARGS):
            # insn_ptr is the pointer argument of m_axi_insn: channel 0's buffer (link.cfg puts
            # both masters on HBM[0]).
            run.set_arg(i, self.bos[0] if name == "insn_ptr" else self.args[name])
        for k, bo in enumerate(self.bos):
            run.set_arg(len(KERNEL_ARGS) + k, bo)
        run.start()
        self.run_ = run

    def wait(self, timeout_s):
        state = self.run_.wait(int(timeout_s * 1000))
        if state != self.px.ert_cmd_state.ERT_CMD_STATE_COMPLETED:
            raise DeviceTimeout(f"the kernel did not complete within {timeout_s:g} s (state {state})")
