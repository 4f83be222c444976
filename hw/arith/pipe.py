"""A small builder for fixed-latency dataflow pipelines made of the arithmetic units.

Each value in the pipeline is a :class:`Node`: an Amaranth value and the stage (cycle) at
which it is valid. Combining nodes from different stages inserts delay registers
automatically, so a special function is written as the sequence of operations it computes,
and its latency is whatever that sequence costs. A builder without a module (``m=None``)
only counts stages, which is how a component learns its latency before it is elaborated.

:func:`delay` is the plain form for the units' own sequencing: a value (a valid bit, a step's
metadata) carried down a pipeline beside the arithmetic, one register per stage.
:func:`ram_delay` carries wide values many cycles in block RAM instead (no LUTs).
"""

from amaranth.hdl import Array, Cat, Const, Signal
from amaranth.lib.memory import Memory

from .units import Fp32Add, Fp32Max, Fp32Mul

__all__ = ["Node", "Pipeline", "delay", "ram_delay"]


def delay(m, value, cycles, *, name, shape=None, reset_less=False):
    """``value`` through ``cycles`` registers (in module ``m``) of its shape, or of ``shape``
    (the value truncated or extended into the first): the list of their outputs, one cycle
    of latency first. Registers are reset unless ``reset_less``."""
    stages = []
    for i in range(cycles):
        kw = {} if shape is None else {"shape": shape}
        r = Signal.like(value, name=f"{name}{i}", reset_less=reset_less, **kw)
        m.d.sync += r.eq(value)
        stages.append(r)
        value = r
    return stages


def ram_delay(m, items, *, name):
    """Each ``(value, cycles)`` of ``items`` delayed ``cycles`` (at least 3) in block RAM: the
    values of one delay share a memory (``ram_style`` "block", no initial contents) written
    every cycle at a free-running pointer and read ``cycles`` - 2 writes behind it, the RAM's
    read and its output register making the other two cycles. A delay line of a LUT a bit (an
    SRL) becomes a slice of a RAM36's 72-bit port, whatever its depth. Returns the delayed
    values, in the order of ``items`` (unsigned, the values' widths)."""
    if not items:
        return []
    longest = max(n for _, n in items)
    if min(n for _, n in items) < 3:
        raise ValueError("ram_delay needs delays of at least 3 cycles")
    depth = 1 << (longest - 2).bit_length()         # more than cycles - 2 entries in flight
    wp = Signal(range(depth), name=f"{name}_wp", reset_less=True)
    m.d.sync += wp.eq(wp + 1)
    outs = [None] * len(items)
    for n in sorted({n for _, n in items}):
        ks = [k for k, (_, c) in enumerate(items) if c == n]
        data = Cat(*[items[k][0] for k in ks])
        m.submodules[f"{name}{n}"] = mem = Memory(shape=len(data), depth=depth, init=[],
                                                  attrs={"ram_style": "block"})
        wr, rd = mem.write_port(), mem.read_port(transparent_for=())
        ra = Signal(range(depth), name=f"{name}{n}_ra", reset_less=True)
        q = Signal(len(data), name=f"{name}{n}_q", reset_less=True)
        m.d.sync += [ra.eq(wp + 1 - (n - 2)),           # wp - (n - 2) in the read's cycle
                     q.eq(rd.data)]                     # the output register
        m.d.comb += [wr.addr.eq(wp), wr.data.eq(data), wr.en.eq(1), rd.addr.eq(ra)]
        at = 0
        for k in ks:
            w = len(items[k][0])
            outs[k] = q[at:at + w]
            at += w
    return outs


class Node:
    __slots__ = ("value", "stage", "_chain")

    def __init__(self, value, stage):
        self.value = value
        self.stage = stage          # None: a constant, valid at every stage
        self._chain = [value]


class Pipeline:
    """Build a pipeline into module ``m`` (or just count stages when ``m`` is None)."""

    def __init__(self, m=None, *, name="p"):
        self.m = m
        self.name = name
        self._n = 0

    def _fresh(self, kind):
        self._n += 1
        return f"{self.name}_{kind}{self._n}"

    def input(self, value):
        return Node(value, 0)

    def const(self, bits, width=32):
        return Node(Const(int(bits), width) if self.m is not None else None, None)

    def at(self, node, stage):
        """``node``'s value delayed to ``stage`` (registers inserted and shared)."""
        if node.stage is None or self.m is None:
            return node.value
        if stage < node.stage:
            raise ValueError(f"value of stage {node.stage} wanted at earlier stage {stage}")
        while len(node._chain) <= stage - node.stage:
            prev = node._chain[-1]
            r = Signal(prev.shape(), name=self._fresh("d"), reset_less=True)
            self.m.d.sync += r.eq(prev)
            node._chain.append(r)
        return node._chain[stage - node.stage]

    @staticmethod
    def _stage(nodes):
        stages = [n.stage for n in nodes if n.stage is not None]
        return max(stages) if stages else 0

    def unit(self, cls, *nodes, **kwargs):
        """Instantiate unit ``cls`` on aligned inputs ``a`` (, ``b``); its output node."""
        st = self._stage(nodes)
        if self.m is None:
            return Node(None, st + cls.LATENCY)
        u = cls(**kwargs)
        self.m.submodules[self._fresh(cls.__name__.lower())] = u
        for port, node in zip(("a", "b"), nodes, strict=False):
            self.m.d.comb += getattr(u, port).eq(self.at(node, st))
        return Node(u.o, st + cls.LATENCY)

    def comb(self, fn, *nodes, reg=True):
        """``fn`` of the aligned values; registered (one more stage) unless ``reg=False``."""
        st = self._stage(nodes)
        if self.m is None:
            return Node(None, st + int(reg))
        v = fn(*(self.at(n, st) for n in nodes))
        if not reg:
            return Node(v, st)
        r = Signal(v.shape(), name=self._fresh("r"), reset_less=True)
        self.m.d.sync += r.eq(v)
        return Node(r, st + 1)

    def rom(self, table, index_fn, node, width=32):
        """Registered lookup ``table[index_fn(value)]`` (a LUT ROM of constants)."""
        return self.comb(lambda v: Array(Const(int(t), width) for t in table)[index_fn(v)], node)

    # Shorthands for the fp32 units.
    def add(self, a, b):
        return self.unit(Fp32Add, a, b)

    def mul(self, a, b):
        return self.unit(Fp32Mul, a, b)

    def max(self, a, b):
        return self.unit(Fp32Max, a, b)

    def min(self, a, b):
        return self.unit(_Fp32Min, a, b)

    def neg(self, a):
        """Flip the sign bit (free: no stage)."""
        return self.comb(lambda v: v ^ 0x80000000, a, reg=False)


class _Fp32Min(Fp32Max):
    def __init__(self):
        super().__init__(minimum=True)
