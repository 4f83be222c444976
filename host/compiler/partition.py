"""A card's share of a model split over N cards (intra-layer, as DFX does).

Owns
----
``Partition``: which heads (their rows of c_attn, their K and V caches, their input columns of
attn.c_proj), which MLP columns (of c_fc, and the matching input columns of mlp.c_proj) and
which slice of the vocabulary (the LM head's rows) card i of N takes, and the largest share of
any card, which the tokens per step are chosen for. LayerNorms, embeddings and the residual
stream are replicated on every card.
"""

from dataclasses import dataclass

from ..errors import UserError
from .layout import round_up

__all__ = ["share", "Share", "Partition"]


def share(n, cards, card):
    """(first, count) of card ``card``'s balanced share of ``n`` items over ``cards``: the
    first cards take one fewer where ``cards`` does not divide ``n``."""
    lo, hi = card * n // cards, (card + 1) * n // cards
    return lo, hi - lo


@dataclass(frozen=True)
class Share:
    """How many heads (H), MLP columns (F) and vocabulary entries (V) a card holds."""

    H: int
    F: int
    V: int


@dataclass(frozen=True)
class Partition:
    """Card ``card`` of ``cards``: its share of a model and the largest share of any card.

    Heads [h0, h0 + H) and MLP columns [f0, f0 + F) are balanced shares (GPT-2 1.5B's 25 heads
    on 4 cards: 6, 6, 6, 7). The vocabulary is cut in slices of ``largest.V`` entries (the
    ceiling of vocab / cards, rounded up to whole row blocks of L): card i takes
    [i largest.V, i largest.V + V), the last card what is left.

    Attributes
    ----------
    card, cards : int
    h0, f0, v0 : int
        The first head, MLP column and vocabulary entry of this card's share.
    mine : Share
        This card's share.
    largest : Share
        The largest share of any card: every card chooses its tokens per step for it, so that
        the cards of an appliance step alike.
    """

    card: int
    cards: int
    h0: int
    f0: int
    v0: int
    mine: Share
    largest: Share

    @classmethod
    def of(cls, shape, *, card, cards, lanes):
        """The partition of a model of shape ``shape`` for card ``card`` of ``cards`` (L =
        ``lanes``). Raises UserError where the model cannot be split so (fewer heads or
        vocabulary than cards)."""
        if not 1 <= cards <= shape.n_head:
            raise UserError(f"--cards: {cards} cards for a model of {shape.n_head} heads; allowed: "
                            f"1 to {shape.n_head} (every card takes at least one head)")
        h0, H = share(shape.n_head, cards, card)
        f0, F = share(shape.d_ff, cards, card)
        vl = round_up(-(-shape.vocab // cards), lanes)
        v0 = card * vl
        V = min(vl, shape.vocab - v0)
        if V < 1:
            raise UserError(f"--cards: {cards} cards are more than the vocabulary of {shape.vocab} "
                            f"can be split over")
        return cls(card=card, cards=cards, h0=h0, f0=f0, v0=v0, mine=Share(H, F, V),
                   largest=Share(-(-shape.n_head // cards), -(-shape.d_ff // cards), vl))
