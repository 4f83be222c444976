"""AXI4 manager properties and the subordinates that answer them, for the harnesses.

``read_manager`` and ``write_manager`` watch one AXI4 manager port (hw/axi.py's signatures),
drive its subordinate side as a lawful in-order subordinate with one ID would (READY, the
response's VALID and payload from free inputs, held stable until taken, RLAST on the burst's
last beat, a response only for what was asked), and assert the manager's side of the
protocol:

- VALID held until READY, with the payload stable (AR, AW, W);
- INCR bursts of the port's full width and ID 0, at most ``max_burst`` beats;
- no burst crosses a 4 KiB boundary, whatever the address (its base need not be page
  aligned);
- at most ``max_outstanding`` bursts accepted and not yet answered (RLAST, B);
- WLAST on the len+1-th beat of each burst, W never ahead of its burst's AW by more than the
  burst that AW presents;
- every write response taken in the cycle it is offered (BREADY).

Each returns the bookkeeping (outstanding bursts) for unit-level properties.
"""

from types import SimpleNamespace

from amaranth.hdl import Assert, Assume, Cat, Const, Mux, ResetSignal, Signal, Value
from amaranth.lib.wiring import In

__all__ = ["no_reset", "past", "held", "read_manager", "write_manager", "read_env", "write_env",
           "env_of", "Queue"]

PAGE = 4096
INCR = 1


def no_reset(m):
    """The proofs start from the reset state and never reset again."""
    m.d.comb += Assume(~ResetSignal())


def past(m, value, name):
    """``value`` one cycle ago (its reset value in the first cycle)."""
    value = Cat(value) if isinstance(value, (list, tuple)) else Value.cast(value)
    reg = Signal(len(value), name=name)
    m.d.sync += reg.eq(value)
    return reg


def held(m, valid, ready, name):
    """1 in the cycle after one with ``valid`` high and ``ready`` low."""
    reg = Signal(name=f"{name}_held")
    m.d.sync += reg.eq(valid & ~ready)
    return reg


def stable_until_ready(m, valid, ready, payload, name):
    """Assert AXI's rule for a source: VALID stays high until READY, its payload unchanged."""
    was = held(m, valid, ready, name)
    before = past(m, payload, f"{name}_was")
    m.d.comb += [Assert(~was | valid, f"{name}: VALID dropped before READY"),
                 Assert(~was | (Cat(payload) == before), f"{name}: payload changed before READY")]


def _page_ok(addr, length, beat_bytes):
    """The burst of ``length + 1`` full-width beats from ``addr`` stays in one 4 KiB page."""
    shift = (beat_bytes - 1).bit_length()
    first = addr[shift:12]                       # its first beat within the page
    return (first + length) < (PAGE // beat_bytes)


def _request(m, name, valid, ready, fields, *, beat_bytes, max_burst):
    """AR or AW: stable until READY, INCR, full width, ID 0, length and page limits."""
    addr, length, size, burst, ident = fields
    stable_until_ready(m, valid, ready, [addr, length, size, burst, ident], name)
    shift = (beat_bytes - 1).bit_length()
    with m.If(valid):
        m.d.comb += [
            Assert(burst == INCR, f"{name}: burst type is not INCR"),
            Assert(size == shift, f"{name}: size is not the port's width"),
            Assert(ident == 0, f"{name}: ID is not 0"),
            Assert(length < max_burst, f"{name}: len + 1 > max_burst"),
            Assert(_page_ok(addr, length, beat_bytes), f"{name}: burst crosses a 4 KiB page"),
        ]


class Queue:
    """Registers holding up to ``depth`` values in order: ``push`` (``data``) and ``pop``
    (the head) in any cycle; ``head`` and ``level``."""

    def __init__(self, m, *, depth, width, push, data, pop, name):
        regs = [Signal(width, name=f"{name}{i}") for i in range(depth)]
        self.level = Signal(range(depth + 2), name=f"{name}_level")
        self.head = regs[0]
        at = self.level - pop
        for i, r in enumerate(regs):
            nxt = regs[i + 1] if i + 1 < depth else Const(0, width)
            shifted = Mux(pop, nxt, r)
            m.d.sync += r.eq(Mux(push & (at == i), data, shifted))
        m.d.sync += self.level.eq(self.level + push - pop)


def read_manager(m, port, env, *, beat_bytes, max_burst, max_outstanding, name="ar"):
    """Watch AXI4 read manager ``port`` (AR and R); drive its subordinate from ``env``'s
    free inputs ``arready``, ``rgo`` (offer a beat when one is owed), ``rresp``, ``rdata``.
    Returns ``outstanding`` (bursts accepted whose RLAST has not been taken)."""
    ar = port.arvalid & port.arready
    _request(m, name, port.arvalid, port.arready,
             [port.araddr, port.arlen, port.arsize, port.arburst, port.arid],
             beat_bytes=beat_bytes, max_burst=max_burst)
    outstanding = Signal(8, name=f"{name}_outstanding")
    beat = Signal(8, name=f"{name}_beat")
    r = port.rvalid & port.rready
    last = r & port.rlast
    lens = Queue(m, depth=max_outstanding + 1, width=8, push=ar, data=port.arlen, pop=last,
                 name=f"{name}_lens")
    # The subordinate: a beat for the oldest burst, held until taken.
    r_held = held(m, port.rvalid, port.rready, f"{name}_r")
    resp_was = past(m, port.rresp, f"{name}_rresp_was")
    data_was = past(m, port.rdata, f"{name}_rdata_was")
    m.d.comb += [
        port.arready.eq(env.arready),
        port.rvalid.eq(r_held | (env.rgo & (outstanding != 0))),
        port.rlast.eq(beat == lens.head),
        port.rid.eq(0),
        port.rresp.eq(Mux(r_held, resp_was, env.rresp)),
        port.rdata.eq(Mux(r_held, data_was, env.rdata)),
    ]
    with m.If(last):
        m.d.sync += beat.eq(0)
    with m.Elif(r):
        m.d.sync += beat.eq(beat + 1)
    m.d.sync += outstanding.eq(outstanding + ar - last)
    m.d.comb += Assert(outstanding <= max_outstanding, f"{name}: more than max_outstanding bursts")
    return SimpleNamespace(outstanding=outstanding, ar=ar, last=last)


def write_manager(m, port, env, *, beat_bytes, max_burst, max_outstanding, name="aw"):
    """Watch AXI4 write manager ``port`` (AW, W, B); drive its subordinate from ``env``'s
    free inputs ``awready``, ``wready``, ``bgo`` (offer a response when one is owed),
    ``bresp``. Returns ``outstanding`` (AWs accepted whose B has not been taken) and
    ``owed`` (bursts whose AW and last W went, B not yet taken)."""
    aw = port.awvalid & port.awready
    w = port.wvalid & port.wready
    w_end = w & port.wlast
    b = port.bvalid & port.bready
    _request(m, name, port.awvalid, port.awready,
             [port.awaddr, port.awlen, port.awsize, port.awburst, port.awid],
             beat_bytes=beat_bytes, max_burst=max_burst)
    stable_until_ready(m, port.wvalid, port.wready, [port.wdata, port.wstrb, port.wlast],
                       f"{name}_w")
    # ahead = AWs accepted - W bursts finished, in [-1, max_outstanding]: the W channel's
    # burst is the oldest AW's whose W is unfinished, or the AW presented when none is.
    ahead = Signal(range(-1, max_outstanding + 2), name=f"{name}_ahead")
    lens = Queue(m, depth=max_outstanding + 1, width=8,
                 push=aw & (ahead >= 0) & ~((ahead == 0) & w_end), data=port.awlen,
                 pop=w_end & (ahead > 0), name=f"{name}_lens")
    wlen = Mux(ahead > 0, lens.head, port.awlen)
    wn = Signal(9, name=f"{name}_wn")
    with m.If(w_end):
        m.d.sync += wn.eq(0)
    with m.Elif(w):
        m.d.sync += wn.eq(wn + 1)
    m.d.sync += ahead.eq(ahead + aw - w_end)
    with m.If(port.wvalid):
        m.d.comb += [
            Assert(ahead >= 0, f"{name}: W of a second burst before the first's AW"),
            Assert((ahead > 0) | port.awvalid, f"{name}: W without its AW presented"),
            Assert(port.wlast == (wn == wlen), f"{name}: WLAST not on the len+1-th beat"),
        ]
    # B: owed for every burst whose AW and last W have both gone.
    owed = Signal(8, name=f"{name}_owed")
    done = (w_end & ((ahead > 0) | aw)) | (aw & (ahead < 0))
    m.d.sync += owed.eq(owed + done - b)
    outstanding = Signal(8, name=f"{name}_outstanding")
    m.d.sync += outstanding.eq(outstanding + aw - b)
    b_held = held(m, port.bvalid, port.bready, f"{name}_b")
    bresp_was = past(m, port.bresp, f"{name}_bresp_was")
    m.d.comb += [
        port.awready.eq(env.awready), port.wready.eq(env.wready),
        port.bvalid.eq(b_held | (env.bgo & (owed != 0))), port.bid.eq(0),
        port.bresp.eq(Mux(b_held, bresp_was, env.bresp)),
        Assert(outstanding <= max_outstanding, f"{name}: more than max_outstanding writes"),
        Assert(~port.bvalid | port.bready, f"{name}: a write response not taken"),
    ]
    return SimpleNamespace(outstanding=outstanding, owed=owed, ahead=ahead)


def read_env(data_bits):
    """The free inputs ``read_manager`` answers from."""
    return {"arready": In(1), "rgo": In(1), "rresp": In(2), "rdata": In(data_bits)}


def write_env():
    """The free inputs ``write_manager`` answers from."""
    return {"awready": In(1), "wready": In(1), "bgo": In(1), "bresp": In(2)}


def env_of(component, prefix, members):
    """A namespace of ``component``'s members ``prefix + name`` for ``name`` in ``members``."""
    return SimpleNamespace(**{n: getattr(component, prefix + n) for n in members})

