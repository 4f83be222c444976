"""Every card's program of a step, the split step's merge chosen by the performance model.

A step cut in two halves (``emit.split_at``) is merged by a greedy estimate of the card's
timing (``interleave``) whose ``lead`` biases it towards the vector unit's work. No one lead
is best: on prefill steps of GPT-2 medium, large and XL on 2 and 4 u280x4 cards leads 1, 2 and
3 each win somewhere, by up to 9% over none (docs/performance.md, "The interleave's lead"),
and each loses somewhere to another or to none, the way a greedy
list schedule's result moves with small changes of its estimate. So the step is merged with
each lead of ``LEADS``, every card's program run through the performance model
(``host.perf.simulate``: the cards together, their collectives in step), and the fastest
kept: the step it is chosen on never runs slower, by the model, than with the merge's plain
estimate (lead 0), and every lead computes the same values (the merge only orders).

The merge also chooses the second half's lag (``LAGS``: the parts it runs behind the first,
``emit.split_program``): with it every multi-card prefill figure of ``gptfpga bench perf``
(GPT-2 medium, large and XL on 2 and 4 u280x4 cards) fell by up to 3.5% (none rose),
GPT-2 1.5B's on 4 cards by 2.8% (one part behind at lead 1: docs/performance.md, "What the
batch floor needs"). The (lead, lag) found for a step size is kept (``CompiledModel.merges``,
on the first card's) and used for later steps of that size at other positions (the programs
differ there only in the attention's length); decode batches are merged with lead 0 and lag
emit.SPLIT_LAG (no lead helped them, and one part behind costs a batch of 8 streams 9%: the
same sections).
"""

from .emit import split_at

__all__ = ["LAGS", "LEADS", "step_programs", "tuned", "untuned"]

LEADS = (0, 1, 2, 3)
LAGS = (2, 1)          # (emit.SPLIT_LAG first: the default wins ties)


def step_programs(cms, tokens, pos0, stream=0, measure=None):
    """Every card's program (``CompiledModel.step``) for ``tokens`` of stream ``stream`` at
    positions pos0, ...: ``cms`` one CompiledModel per card, in card order. ``measure``
    (programs -> cycles) times a candidate: default the performance model as it stands
    (``host.perf.simulate``)."""
    return tuned(cms, tokens, pos0, stream, measure)[0]


def untuned(cms, T):
    """Whether a step of T tokens on ``cms`` would be tuned now (split, its merge not known):
    LEADS x LAGS merges and model runs, seconds for the tiny config, minutes for GPT-2 1.5B."""
    return len(cms) > 1 and split_at(cms[0], T) is not None and T not in cms[0].merges


def tuned(cms, tokens, pos0, stream=0, measure=None):
    """``step_programs``' programs and their cycles by ``measure`` where the merge was chosen
    by this call (else None: not split, or the merge known)."""
    T = len(tokens)
    first = cms[0]
    if len(cms) == 1 or split_at(first, T) is None:
        return [cm.step(tokens, pos0, stream) for cm in cms], None
    if T in first.merges:
        lead, lag = first.merges[T]
        return [cm.step(tokens, pos0, stream, lead=lead, lag=lag) for cm in cms], None
    if measure is None:
        from ..perf import simulate  # (the model runs the programs it is given)

        def measure(progs):
            return simulate(first.cfg, progs)["cycles"]
    best = None
    for lag in LAGS:
        for lead in LEADS:
            progs = [cm.step(tokens, pos0, stream, lead=lead, lag=lag) for cm in cms]
            cycles = measure(progs)
            if best is None or cycles < best[0]:
                best = (cycles, (lead, lag), progs)
    first.merges[T] = best[1]
    return best[2], best[0]
