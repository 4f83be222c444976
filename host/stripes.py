"""HBM stripe rows: how a card's bytes are spread over its channels (hw/isa.py).

Stripe row r is beat r of every HBM channel: ``channels x beat_bytes`` bytes, channel c
holding bytes ``[c * beat_bytes, (c + 1) * beat_bytes)`` of the stripe. The one statement of
that interleave, used by the HBM image (host/compiler), the ISS (sim/ref/iss.py) and every
tool that reads or writes a card's HBM through the Device interface. Pure numpy.
"""

import numpy as np

__all__ = ["interleave", "deinterleave", "locate", "write_stripes", "read_stripes"]


def interleave(data, channels, beat_bytes):
    """Bytes ``data`` as whole stripe rows, zero-padded: array [channels, rows * beat_bytes],
    row c the bytes channel c holds (from the first row's beat on)."""
    data = np.frombuffer(np.ascontiguousarray(data).tobytes(), np.uint8)
    S = channels * beat_bytes
    rows = -(-len(data) // S)
    buf = np.zeros(rows * S, np.uint8)
    buf[:len(data)] = data
    return buf.reshape(rows, channels, beat_bytes).transpose(1, 0, 2).reshape(channels, -1)


def deinterleave(per_channel, beat_bytes):
    """The inverse of ``interleave``: a list of the channels' bytes (each rows * beat_bytes
    long) -> the stripe rows' bytes in order."""
    rows = len(per_channel[0]) // beat_bytes
    out = np.empty((rows, len(per_channel), beat_bytes), np.uint8)
    for c, b in enumerate(per_channel):
        out[:, c, :] = np.asarray(b, np.uint8).reshape(rows, beat_bytes)
    return out.reshape(-1)


def locate(rows, offs, beat_bytes):
    """(channel, byte address in the channel) of stripe row ``rows``, stripe byte ``offs``
    (scalars or arrays)."""
    return offs // beat_bytes, rows * beat_bytes + offs % beat_bytes


def write_stripes(dev, cfg, row, data):
    """Write bytes ``data`` to a Device's stripe rows from ``row`` (the last row zero-padded)."""
    B = cfg.hbm_beat_bytes
    for c, part in enumerate(interleave(data, cfg.hbm.channels, B)):
        dev.write_hbm(c, row * B, part)


def read_stripes(dev, cfg, row, nrows):
    """Bytes of a Device's stripe rows [row, row + nrows)."""
    B = cfg.hbm_beat_bytes
    return deinterleave([dev.read_hbm(c, row * B, nrows * B) for c in range(cfg.hbm.channels)], B)
