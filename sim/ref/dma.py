"""Reference for the AXI burst read engine (hw/dma/reader.py): how commands become bursts."""

import numpy as np

__all__ = ["split_bursts", "expected_beats"]


def split_bursts(addr, beats, block):
    """Bursts ``[(beat address, length)]`` for a command of ``beats`` beats at ``addr``.

    A burst never crosses a multiple of ``block`` beats (``min(max_burst, 4 KiB / beat)``).
    """
    if beats <= 0:
        return []
    out = []
    while beats:
        n = min(beats, block - addr % block)
        out.append((addr, n))
        addr += n
        beats -= n
    return out


def expected_beats(mem, base, beat_bytes, commands):
    """The engine's output for ``commands`` over memory ``mem`` (uint8 array).

    Returns ``(data, last)``: data as a [beats, beat_bytes] uint8 array, last as a bool array.
    """
    chunks, lasts = [], []
    for addr, beats in commands:
        if beats <= 0:
            continue
        start = base + addr * beat_bytes
        chunks.append(np.asarray(mem[start:start + beats * beat_bytes]).reshape(beats, beat_bytes))
        lasts.append(np.arange(beats) == beats - 1)
    if not chunks:
        return np.zeros((0, beat_bytes), np.uint8), np.zeros(0, bool)
    return np.concatenate(chunks), np.concatenate(lasts)
