"""How matrices are cut into MATVECs, and where each MATVEC's WLOADs go.

Owns
----
- ``chunk_blocks``, ``matrix_chunks``: a matrix's MATVEC jobs, whole groups of row blocks,
  each at most half the weight FIFO, so that the next job's tiles stream while one runs;
- ``mlp_proj_split``: where mlp.c_proj is cut by columns so that its first part runs while
  the vector unit takes the GELU of c_fc's last job (the HBM image stores the two parts);
- ``Job`` and ``place_wloads``: a step's program is emitted with each MATVEC as a Job;
  ``place_wloads`` then puts every job's WLOADs as early as its data and the weight FIFO
  allow, in MATVEC order (the ISA's rule: tiles streamed and not yet claimed by an issued
  MATVEC never exceed core.weight_fifo_tiles).

Pure functions of their arguments.
"""

from dataclasses import dataclass

from hw.isa import encode

from ..errors import UserError
from .layout import GROUP

__all__ = ["chunk_blocks", "matrix_chunks", "mlp_proj_split", "Job", "place_wloads"]


def chunk_blocks(cb, fifo_tiles, group=GROUP, i8=False):
    """Row blocks per MATVEC job of a matrix of ``cb`` column blocks: whole groups of
    ``group``, at most half the weight FIFO (``fifo_tiles``) where a group fits in that (with
    ``i8``, a group streams a row of scales before its tiles)."""
    return max(1, (fifo_tiles // 2) // (group * cb + int(i8))) * group


def matrix_chunks(rb, cb, *, group, fifo_tiles, L, W, short_tail=False, i8=False):
    """(first row block, row blocks) of each MATVEC job of an rb x cb-tile matrix stored in
    stream order for ``group``: ``chunk_blocks`` each, the last what is left. With
    ``short_tail`` the last job is cut to the matrix's last group (the vector work on it,
    which no MATVEC hides, is short). Raises UserError where one group does not fit in the
    weight FIFO."""
    per_group = group * cb + int(i8)
    if per_group > fifo_tiles:
        raise UserError(f"model: one group of {group} row blocks of a {rb * L} x {cb * W} matrix is "
                        f"{per_group} tiles, more than the weight FIFO's {fifo_tiles} "
                        f"(core.weight_fifo_tiles)")
    per = chunk_blocks(cb, fifo_tiles, group, i8)
    chunks = [(r0, min(per, rb - r0)) for r0 in range(0, rb, per)]
    r0, n = chunks[-1]
    k = (n - 1) // group * group        # (the tiles are stored by whole groups)
    if short_tail and k > 0:
        chunks[-1:] = [(r0, k), (r0 + k, n - k)]
    return chunks


def mlp_proj_split(F, d, L, W, fifo_tiles, i8=False):
    """mlp.c_proj's columns [0, fa) and [fa, F): fa = the rows of all but the last of the
    MATVEC jobs c_fc ([F, d]) runs in; F (no split) where c_fc is one job or fa is not a
    whole column block."""
    rb, per = -(-F // L), chunk_blocks(-(-d // W), fifo_tiles, GROUP, i8)
    fa = (-(-rb // per) - 1) * per * L
    return fa if 0 < fa < F and fa % W == 0 else F


@dataclass(frozen=True)
class Job:
    """One MATVEC and the tiles it consumes, its WLOADs to be placed by ``place_wloads``.

    Attributes
    ----------
    runs : tuple of (int, int)
        (first stripe row, tiles): the WLOADs that stream its tiles, in order.
    tiles : int
        Tiles the MATVEC consumes (the runs' sum).
    fields : dict
        The MATVEC's fields (hw/isa.py).
    earliest : int
        Position in the program (an index into the emitted items) before which its tiles may
        not stream: their data are not in HBM yet, or the read DMA has something to do first.
    """

    runs: tuple
    tiles: int
    fields: dict
    earliest: int


def _wloads(job):
    return [encode("WLOAD", row=row, tiles=tiles) for row, tiles in job.runs]


def place_wloads(items, fifo_tiles):
    """The program's instruction words from ``items`` (instruction words and Jobs, in issue
    order), each Job's WLOADs placed as early as allowed.

    Jobs stream in MATVEC order. Before item i, the next job's WLOADs go in if i >= its
    ``earliest`` and the tiles streamed and not yet claimed by a MATVEC, with its own, fit in
    ``fifo_tiles``; a job not streamed by its MATVEC streams right before it (every earlier
    job's tiles are claimed by then). Each Job becomes its WLOADs (if placed there) and its
    MATVEC."""
    jobs = [x for x in items if isinstance(x, Job)]
    out, avail, streamed, issued = [], 0, 0, 0
    for idx, item in enumerate(items):
        while (streamed < len(jobs) and jobs[streamed].earliest <= idx
               and avail + jobs[streamed].tiles <= fifo_tiles):
            out += _wloads(jobs[streamed])
            avail += jobs[streamed].tiles
            streamed += 1
        if isinstance(item, Job):
            if streamed == issued:          # not streamed yet: everything before is claimed
                out += _wloads(item)
                avail += item.tiles
                streamed += 1
            out.append(encode("MATVEC", **item.fields))
            avail -= item.tiles
            issued += 1
        else:
            out.append(item)
    assert streamed == len(jobs) and avail == 0
    return out
