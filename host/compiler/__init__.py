"""Compile a GPT-2 onto a card: the HBM image (weight tiles in stream order, parameters,
constants, the K/V caches) and, per generation step, the instruction stream. The schedule's
design (which vector work runs beside which MATVEC, where LOADs and STOREs go, and why) is in
docs/architecture.md, "Compiling GPT-2".

Modules, each owning one concern, in the order they build on each other:

- ``layout``: tile stream order (``GROUP``, ``tiles_in_stream_order``), the vectors' sizes
  (``Dims``), the K/V caches' layout (``KvLayout``, its one statement), the parameter vector;
- ``partition``: a card's share of heads, MLP columns and vocabulary (``Partition``);
- ``weights``: LayerNorm folding and the values of each stored matrix;
- ``schedule``: MATVEC jobs and the WLOADs' places (pure functions);
- ``placement``: the on-chip buffer plan (``Placement``), chosen from explicit candidates;
- ``image``: the HBM image and where everything is in HBM (``HbmLayout``);
- ``emit``: one step's instruction stream (``Emitter``); ``interleave``: the merge of a split
  step's two halves; ``tune``: every card's program of a step, the merge's lead chosen by the
  performance model (host.perf);
- ``compiled``: ``CompiledModel``, the parts put together, and ``check_limits``.

Pure Python and numpy over hw.isa: no Amaranth, no hw.core, no sim.
"""

from .compiled import CompiledModel, check_limits
from .layout import GROUP, tiles_in_stream_order

__all__ = ["CompiledModel", "tiles_in_stream_order", "check_limits", "GROUP"]
