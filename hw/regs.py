"""The card kernel's s_axi_control register map (Vitis ap_ctrl_hs layout). Pure Python: the
hardware, the host runtime, the simulators and the Vitis packaging all read it from here.

64-bit registers are two 32-bit words, low word first.
"""

__all__ = ["CTRL", "GIE", "IER", "ISR", "ARGS", "COUNTERS", "REG", "ADDR_BITS", "HBM_PTR",
           "hbm_ptr", "card_register", "KERNEL", "KERNEL_ARGS"]

ADDR_BITS = 10

CTRL = 0x00      # bit 0 ap_start (W1, self-clearing), 1 ap_done (clear on read), 2 ap_idle, 3 ap_ready
GIE = 0x04
IER = 0x08
ISR = 0x0C

# Arguments written by the host (read/write).
ARGS = {
    "prog_addr": (0x10, 64, "byte offset of the program in the buffer behind m_axi_insn"),
    "prog_len": (0x18, 32, "program length in instructions"),
    "card": (0x1C, 32, "bits [7:0] this card's id, [15:8] cards in the ring, [16] the ring runs "
                       "both ways (topology bidirectional_ring)"),
    "insn_ptr": (0x20, 64, "device address of the buffer behind m_axi_insn (HBM channel 0's)"),
}

# The Vitis kernel's name and its arguments in XRT's order (kernel.xml and the XRT device):
# these, then one pointer per HBM channel, hbm0 .. hbm<C-1>. insn_ptr is m_axi_insn's pointer.
KERNEL = "gptfpga_card"
KERNEL_ARGS = ("prog_addr", "prog_len", "card", "insn_ptr")

# Device address of the buffer behind m_axi_hbm<k>: 64-bit, at HBM_PTR + 8k (k < 32).
HBM_PTR = 0x100


def hbm_ptr(k):
    return HBM_PTR + 8 * k


def card_register(card, cards, *, bidirectional=False):
    """The ``card`` argument of card ``card`` in a ring of ``cards`` (0 for a card alone)."""
    return 0 if cards == 1 else card | cards << 8 | int(bidirectional) << 16

# Read-only status and performance counters (64-bit, cleared by ap_start).
COUNTERS = {
    "status": (0x28, "bits [7:0] status code (hw.isa.ERRORS), bits [31:8] pc of the instruction"),
    "cycles": (0x30, "cycles from ap_start to ap_done"),
    "mpu_busy": (0x38, "cycles the matrix unit had a tile in its pipeline"),
    "vpu_busy": (0x40, "cycles the vector unit was executing an instruction"),
    "dma_rd_busy": (0x48, "cycles a LOAD or WLOAD was streaming"),
    "dma_wr_busy": (0x50, "cycles a STORE was in progress"),
    "hbm_rd_bytes": (0x58, "bytes read from HBM by LOAD and WLOAD"),
    "hbm_wr_bytes": (0x60, "bytes written to HBM by STORE"),
    "issue_stall": (0x68, "cycles a decoded instruction waited for a hazard or a full queue"),
    "mpu_starve": (0x70, "cycles a MATVEC waited for weight tiles"),
    "link_tx_bytes": (0x78, "bytes sent on the ring links"),
    "link_rx_bytes": (0x80, "bytes received on the ring links"),
    "insns": (0x88, "instructions issued"),
    "link_retx": (0x90, "link frames sent again (go-back-N after a CRC error, a gap or a timeout)"),
    "link_crc_errors": (0x98, "link frames received with a bad CRC (dropped and repaired)"),
}

REG = {name: addr for name, (addr, *_rest) in {**ARGS, **COUNTERS}.items()}
