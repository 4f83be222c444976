// Verilator harness of an appliance: N card kernels, each with its HBM channels, joined in a
// ring by link models (sim_common.h) when the card has link ports; built as a shared library
// and driven from Python through ctypes (sim/system.py). No Python runs per clock: the host
// calls reg_write/reg_read (AXI4-Lite transactions on one card), hbm_write/hbm_read (backdoor
// memcpy) and run(mask, max_cycles), which clocks every card until the interrupts of the cards
// in the mask are all high. All cards share one clock: register transactions on one card
// clock the others too.
//
// Ring: card i's port R sends on link right[i] to card i + 1's port L; card i + 1's port L
// sends on link left[i] back to card i's port R. One card alone has its link ports idle.
//
// HBM channel model, per AXI port: reads accepted while fewer than `max_outstanding` bursts
// are open; a burst's first beat leaves `latency` cycles after its AR; beats in order, one per
// cycle at most, and no faster than the channel's bandwidth cap (a byte bucket refilled by
// `bytes_per_cycle` each cycle, shared by reads and writes); writes applied with their
// strobes once address and data are both in, answered `latency` cycles later. Accesses
// outside the channel answer SLVERR (reads return zeros, writes are dropped).
// The m_axi_insn port reads channel 0's memory through its own model.
//
// Stalls (set_stalls; off by default): every AXI port's model (each HBM channel and the
// instruction port of every card) draws from its own seeded Jitter: ARREADY, AWREADY and
// WREADY each held low with probability `ready` in a cycle; an R beat or a B response that
// could go held back a cycle with probability `valid`; each read burst's first beat and each
// write response `delay` cycles later at most (uniform, in order). Each direction of each link
// refuses a sent beat (TREADY low) and withholds a delivered one (TVALID low) with probability
// `link`. A valid once shown stays until its handshake, stalled or not.
//
// Faults (set_fault, link_outage; none by default, and with none set every port behaves
// exactly as without them: no random draw is added or moved). Per AXI port, counted from when
// the fault is set: the `at`-th read burst (AR) answers every beat with `resp` (2 SLVERR,
// 3 DECERR); the `at`-th write burst (AW) is answered with `resp`; the port stops answering
// from the `at`-th burst on for `cycles` cycles (0: until reset): no R beat once that burst's
// turn comes (ARs still taken), no ARREADY for it, no B response once its turn comes (AW and
// W still taken) or no AWREADY for it; the beat at byte `addr` is
// read with its bits XORed with a mask (a corrupted word). An R beat or B response already
// shown stays until its handshake. A link direction can go down once the `after`-th frame
// has passed (every beat sent in the next `cycles` cycles is lost, a frame cut short
// included) and then come back. port_state tells what each AXI port still has open; reset
// pulses every card's ap_rst_n and empties the memory models' queues and the links (HBM
// contents stay).

#include <sys/mman.h>

#include <cstdint>
#include <cstring>
#include <deque>
#include <memory>
#include <vector>

#include "Vcard.h"
#include "sim_common.h"
#include "verilated.h"

namespace {

using gptfpga::Jitter;
using gptfpga::Link;

using gptfpga::Port;

struct Axi {
    Port arid, araddr, arlen, arvalid, arready, rid, rdata, rresp, rlast, rvalid, rready;
    Port awid, awaddr, awlen, awvalid, awready, wdata, wstrb, wlast, wvalid, wready;
    Port bid, bresp, bvalid, bready;
    bool has_write = false;
    int beat = 0;
};

struct Memory {
    uint8_t* base = nullptr;
    uint64_t size = 0;
    explicit Memory(uint64_t bytes) : size(bytes) {
        void* p = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
        base = (p == MAP_FAILED) ? nullptr : static_cast<uint8_t*>(p);
    }
    ~Memory() { if (base) munmap(base, size); }
};

// resp: the response of its beats (an injected error, else OKAY); mute: the burst from which
// the port stops answering (a no_r or no_b fault)
struct Burst { uint64_t addr; int beats; int sent; uint64_t ready; int resp; bool mute; };
struct WBurst { uint64_t addr; int beats; int resp; bool mute; };
struct WBeat { std::vector<uint8_t> data, strb; };
struct BResp { uint64_t ready; int resp; bool mute; };

// The faults of one AXI port (the header's Faults paragraph).
enum Quiet { QUIET_NONE = 0, QUIET_R = 1, QUIET_AR = 2, QUIET_B = 3, QUIET_AW = 4 };

struct PortFaults {
    uint64_t ars = 0, aws = 0;            // AR and AW handshakes since the faults were set
    uint64_t rd_err_at = 0, wr_err_at = 0;  // 1-based burst numbers; 0: none
    int rd_resp = 2, wr_resp = 2;
    int quiet = QUIET_NONE;
    uint64_t quiet_at = 0, quiet_cycles = 0;
    bool quiet_on = false, quiet_done = false;
    uint64_t quiet_until = 0;             // UINT64_MAX: until reset
    struct Flip { uint64_t addr; std::vector<uint8_t> mask; };
    std::vector<Flip> flips;
    uint64_t errors = 0, flipped = 0;     // error responses given, beats read corrupted

    void start_quiet(uint64_t now) {
        quiet_on = true;
        quiet_until = quiet_cycles ? now + quiet_cycles : UINT64_MAX;
    }
    // Is the port silent in `kind` this cycle?
    bool silent(int kind, uint64_t now) {
        if (!quiet_on || quiet != kind) return false;
        if (now >= quiet_until) { quiet_on = false; quiet_done = true; return false; }
        return true;
    }
};

struct Slave {
    Axi a;
    Memory* mem;
    int latency, max_out;
    double bytes_per_cycle, credit = 0;
    std::deque<Burst> rq;
    std::deque<WBurst> awq;
    std::deque<WBeat> wq;
    std::deque<BResp> bq;
    int writes_open = 0;
    uint64_t rd_beats = 0, wr_beats = 0;
    Jitter ready_j, valid_j;        // stalls of the readies; of R and B (and their delays)
    bool r_on = false, b_on = false;           // RVALID / BVALID driven this cycle
    bool r_held = false, b_held = false;       // ... and not taken: they stay up
    PortFaults f;

    // Drive this cycle's outputs from the state (before the edge).
    void drive(uint64_t now, std::vector<uint8_t>& buf) {
        a.arready.set(rq.size() < static_cast<size_t>(max_out) && !ready_j.hold() && !f.silent(QUIET_AR, now));
        bool rv = false;
        if (!rq.empty() && rq.front().mute && !f.quiet_on && !f.quiet_done) f.start_quiet(now);
        if (!rq.empty() && (r_held || (rq.front().ready <= now && credit >= a.beat && !f.silent(QUIET_R, now)
                                       && !valid_j.hold()))) {
            Burst& b = rq.front();
            uint64_t addr = b.addr + static_cast<uint64_t>(b.sent) * a.beat;
            bool ok = addr + a.beat <= mem->size;
            if (ok) std::memcpy(buf.data(), mem->base + addr, a.beat);
            else std::memset(buf.data(), 0, a.beat);
            for (auto& fl : f.flips)
                if (fl.addr == addr) {
                    for (int i = 0; i < a.beat; i++) buf[i] ^= fl.mask[i];
                    if (!r_held) f.flipped++;
                }
            a.rdata.set_bytes(buf.data(), a.beat);
            a.rresp.set(ok ? b.resp : 2);
            a.rlast.set(b.sent == b.beats - 1);
            a.rid.set(0);
            rv = true;
        }
        a.rvalid.set(rv);
        r_on = rv;
        if (a.has_write) {
            a.awready.set(writes_open < max_out && !ready_j.hold() && !f.silent(QUIET_AW, now));
            a.wready.set(wq.size() < 64 && !ready_j.hold());
            if (!bq.empty() && bq.front().mute && !f.quiet_on && !f.quiet_done) f.start_quiet(now);
            bool bv = !bq.empty() && (b_held || (bq.front().ready <= now && !f.silent(QUIET_B, now)
                                                 && !valid_j.hold()));
            a.bvalid.set(bv);
            b_on = bv;
            a.bresp.set(bv ? bq.front().resp : 0);
            a.bid.set(0);
        }
    }

    // Reset: every open transaction forgotten, as the card's reset forgets its side of them.
    void reset() {
        rq.clear(); awq.clear(); wq.clear(); bq.clear();
        writes_open = 0;
        credit = 0;
        r_on = b_on = r_held = b_held = false;
        f = PortFaults();
    }

    // After the edge: apply the handshakes that were sampled before it.
    void update(uint64_t now, bool ar, bool r, bool aw, bool w, bool b, uint64_t ar_addr, int ar_len,
                uint64_t aw_addr, int aw_len, const std::vector<uint8_t>& wdata,
                const std::vector<uint8_t>& wstrb) {
        credit = std::min(credit + bytes_per_cycle, 2.0 * a.beat + bytes_per_cycle);
        r_held = r_on && !r;
        b_held = b_on && !b;
        if (r) {
            Burst& bb = rq.front();
            credit -= a.beat;
            rd_beats++;
            if (++bb.sent == bb.beats) rq.pop_front();
        }
        if (ar) {
            int resp = 0;
            f.ars++;
            if (f.rd_err_at && f.ars == f.rd_err_at) resp = f.rd_resp, f.errors++;
            bool mute = f.quiet == QUIET_R && f.ars == f.quiet_at;
            if (f.quiet == QUIET_AR && !f.quiet_on && !f.quiet_done && f.ars + 1 == f.quiet_at) f.start_quiet(now + 1);
            rq.push_back({ar_addr, ar_len + 1, 0, now + static_cast<uint64_t>(latency + valid_j.extra()), resp, mute});
        }
        if (a.has_write) {
            if (b) bq.pop_front(), writes_open--;
            if (aw) {
                int resp = 0;
                f.aws++;
                if (f.wr_err_at && f.aws == f.wr_err_at) resp = f.wr_resp, f.errors++;
                bool mute = f.quiet == QUIET_B && f.aws == f.quiet_at;
                if (f.quiet == QUIET_AW && !f.quiet_on && !f.quiet_done && f.aws + 1 == f.quiet_at) f.start_quiet(now + 1);
                awq.push_back({aw_addr, aw_len + 1, resp, mute});
                writes_open++;
            }
            if (w) wq.push_back({wdata, wstrb});
            while (!awq.empty() && wq.size() >= static_cast<size_t>(awq.front().beats)) {
                WBurst wb = awq.front();
                awq.pop_front();
                bool ok = wb.addr + static_cast<uint64_t>(wb.beats) * a.beat <= mem->size;
                for (int i = 0; i < wb.beats; i++) {
                    WBeat& beat = wq.front();
                    if (ok) {
                        uint8_t* dst = mem->base + wb.addr + static_cast<uint64_t>(i) * a.beat;
                        for (int k = 0; k < a.beat; k++)
                            if (beat.strb[k >> 3] >> (k & 7) & 1) dst[k] = beat.data[k];
                    }
                    wq.pop_front();
                    wr_beats++;
                    credit -= a.beat;
                }
                bq.push_back({now + static_cast<uint64_t>(latency + valid_j.extra()), ok ? wb.resp : 2, wb.mute});
            }
        }
    }
};

// One link port's AXI4-Stream signals (axis_<r|l>_<tx|rx>_t*).
struct LinkPorts { Port tx_data, tx_last, tx_valid, tx_ready, rx_data, rx_last, rx_valid, rx_ready; };

struct Card {
    std::unique_ptr<Vcard> top;
    std::vector<std::unique_ptr<Memory>> mems;
    std::vector<Slave> slaves;
    Port awaddr, awvalid, awready, wdata, wstrb, wvalid, wready, bresp, bvalid, bready;
    Port araddr, arvalid, arready, rdata, rresp, rvalid, rready;
    bool has_link = false;
    LinkPorts r, l;
    int link_beat = 0;
    // handshakes sampled before the edge
    struct H { bool ar, r, aw, w, b; uint64_t ar_addr, aw_addr; int ar_len, aw_len; };
    std::vector<H> hs;
    std::vector<std::vector<uint8_t>> wd, ws;
    bool r_tx = false, l_tx = false, r_rx = false, l_rx = false, r_last = false, l_last = false;
    bool r_rx_on = false, l_rx_on = false;        // TVALID driven into port R / L this cycle
    bool r_rx_held = false, l_rx_held = false;    // ... and not taken: it stays up
    std::vector<uint8_t> r_beat, l_beat;
    bool irq = false;               // the interrupt as last seen
    uint64_t open_at_irq = 0;       // transactions open in its ports' models when it last rose

    // Transactions open in every port's model: read bursts accepted and unfinished, writes
    // accepted and unanswered, W beats ahead of their AW, responses shown and not taken.
    uint64_t open_count() const {
        uint64_t n = 0;
        for (auto& sl : slaves) {
            size_t w_in_bursts = 0;
            for (auto& wb : sl.awq) w_in_bursts += wb.beats;
            n += sl.rq.size() + static_cast<uint64_t>(sl.writes_open) + sl.r_held + sl.b_held
                 + (sl.wq.size() > w_in_bursts ? sl.wq.size() - w_in_bursts : 0);
        }
        return n;
    }

    void sample() {
        hs.resize(slaves.size());
        wd.resize(slaves.size());
        ws.resize(slaves.size());
        for (size_t i = 0; i < slaves.size(); i++) {
            Axi& a = slaves[i].a;
            H& h = hs[i];
            h.ar = a.arvalid.get() && a.arready.get();
            h.r = a.rvalid.get() && a.rready.get();
            h.ar_addr = a.araddr.get();
            h.ar_len = static_cast<int>(a.arlen.get());
            h.aw = h.w = h.b = false;
            if (a.has_write) {
                h.aw = a.awvalid.get() && a.awready.get();
                h.w = a.wvalid.get() && a.wready.get();
                h.b = a.bvalid.get() && a.bready.get();
                h.aw_addr = a.awaddr.get();
                h.aw_len = static_cast<int>(a.awlen.get());
                if (h.w) {
                    wd[i].resize(a.beat);
                    ws[i].resize((a.beat + 7) / 8);
                    a.wdata.get_bytes(wd[i].data(), a.beat);
                    a.wstrb.get_bytes(ws[i].data(), (a.beat + 7) / 8);
                }
            }
        }
        if (has_link) {
            r_tx = r.tx_valid.get() && r.tx_ready.get();
            l_tx = l.tx_valid.get() && l.tx_ready.get();
            r_rx = r.rx_valid.get() && r.rx_ready.get();
            l_rx = l.rx_valid.get() && l.rx_ready.get();
            r_beat.resize(link_beat);
            l_beat.resize(link_beat);
            if (r_tx) { r.tx_data.get_bytes(r_beat.data(), link_beat); r_last = r.tx_last.get(); }
            if (l_tx) { l.tx_data.get_bytes(l_beat.data(), link_beat); l_last = l.tx_last.get(); }
        }
    }

    void update(uint64_t cycle) {
        for (size_t i = 0; i < slaves.size(); i++) {
            H& h = hs[i];
            slaves[i].update(cycle, h.ar, h.r, h.aw, h.w, h.b, h.ar_addr, h.ar_len, h.aw_addr,
                             h.aw_len, wd[i], ws[i]);
        }
    }
};

// A link direction that goes down once `after` frames have passed since it was set, for
// `cycles` cycles: every beat sent meanwhile is lost (the sender's accounting and the CRC
// self-check see it as sent), then the link carries beats again.
struct Outage {
    bool armed = false, on = false, at_start = true;
    uint64_t after = 0, cycles = 0, frames = 0, until = 0, lost = 0;

    // The beat the sender hands over at `cycle` (`last`: it ends a frame): is it lost?
    bool lose(uint64_t cycle, bool last) {
        bool starts = at_start;
        at_start = last;
        if (!armed) return false;
        if (!on && starts) {
            if (frames == after) { on = true; until = cycle + cycles; }
            frames++;
        }
        if (on && cycle >= until) { on = false; armed = false; }
        if (on) lost++;
        return on;
    }
};

struct Sim {
    std::unique_ptr<VerilatedContext> ctx;
    std::vector<std::unique_ptr<Card>> cards;
    std::vector<Link> right, left;     // right[i]: i.R -> (i+1).L ; left[i]: (i+1).L -> i.R
    std::vector<Jitter> right_j, left_j;    // the links' stalls
    std::vector<Outage> right_o, left_o;    // the links' outages
    std::mt19937_64 rng;
    uint64_t cycle = 0;
    std::vector<uint8_t> buf;

    bool ring() const { return cards.size() > 1 && cards[0]->has_link; }

    void clock() {
        size_t n = cards.size();
        for (auto& c : cards) {
            for (auto& s : c->slaves) s.drive(cycle, buf);
            if (c->has_link && !ring()) {           // alone: the link ports see nothing
                c->r.tx_ready.set(0); c->l.tx_ready.set(0);
                c->r.rx_valid.set(0); c->l.rx_valid.set(0);
            }
        }
        if (ring()) {
            for (size_t i = 0; i < n; i++) {
                Card& c = *cards[i];
                Link& in_l = right[(i + n - 1) % n];   // from i-1's R into my L
                Link& in_r = left[i];                  // from i+1's L into my R
                Jitter& jl = right_j[(i + n - 1) % n];
                Jitter& jr = left_j[i];
                bool lv = in_l.head(cycle) && (c.l_rx_held || !jl.hold());
                bool rv = in_r.head(cycle) && (c.r_rx_held || !jr.hold());
                c.l_rx_on = lv;
                c.r_rx_on = rv;
                c.l.rx_valid.set(lv);
                if (lv) { c.l.rx_data.set_bytes(in_l.q.front().data.data(), c.link_beat); c.l.rx_last.set(in_l.q.front().last); }
                c.r.rx_valid.set(rv);
                if (rv) { c.r.rx_data.set_bytes(in_r.q.front().data.data(), c.link_beat); c.r.rx_last.set(in_r.q.front().last); }
                c.r.tx_ready.set(right[i].ready(c.link_beat) && !right_j[i].hold());
                c.l.tx_ready.set(left[(i + n - 1) % n].ready(c.link_beat) && !left_j[(i + n - 1) % n].hold());
            }
        }
        for (auto& c : cards) c->top->eval();
        for (auto& c : cards) c->sample();
        for (auto& c : cards) { c->top->ap_clk = 1; c->top->eval(); }
        for (auto& c : cards) { c->top->ap_clk = 0; c->top->eval(); }
        for (auto& c : cards) {
            c->update(cycle);
            bool irq = c->top->__SYM__interrupt;
            if (irq && !c->irq) c->open_at_irq = c->open_count();
            c->irq = irq;
        }
        if (ring()) {
            for (size_t i = 0; i < n; i++) {
                Card& c = *cards[i];
                int bb = c.link_beat;
                c.l_rx_held = c.l_rx_on && !c.l_rx;
                c.r_rx_held = c.r_rx_on && !c.r_rx;
                if (c.l_rx) right[(i + n - 1) % n].q.pop_front();
                if (c.r_rx) left[i].q.pop_front();
                if (c.r_tx) send(right[i], right_o[i], c.r_beat, c.r_last, bb);
                if (c.l_tx) send(left[(i + n - 1) % n], left_o[(i + n - 1) % n], c.l_beat, c.l_last, bb);
            }
            for (auto& L : right) L.refill(cards[0]->link_beat);
            for (auto& L : left) L.refill(cards[0]->link_beat);
        }
        cycle++;
    }

    // A beat into link L, unless an outage loses it after the link's own accounting.
    void send(Link& L, Outage& o, std::vector<uint8_t>& beat, bool last, int bb) {
        bool lost = o.lose(cycle, last);
        size_t before = L.q.size();
        L.inject(beat.data(), last, bb, cycle, rng);
        if (lost && L.q.size() > before) L.q.pop_back();
    }
};

#include "card_ports.h"   // generated: bind(Card&) fills the ports of this config's top

}  // namespace

extern "C" {

void* sim_new(int ncards, int channels, uint64_t channel_bytes, int latency, double bytes_per_cycle,
              int max_outstanding, int link_latency, double link_bytes_per_cycle, uint64_t seed) {
    auto* s = new Sim();
    s->ctx = std::make_unique<VerilatedContext>();
    s->rng.seed(seed);
    for (int i = 0; i < ncards; i++) {
        s->cards.push_back(std::make_unique<Card>());
        Card& c = *s->cards.back();
        c.top = std::make_unique<Vcard>(s->ctx.get());
        for (int k = 0; k < channels; k++) {
            c.mems.push_back(std::make_unique<Memory>(channel_bytes));
            if (!c.mems.back()->base) { delete s; return nullptr; }
        }
        c.slaves.resize(channels + 1);
        for (int k = 0; k <= channels; k++) {
            Slave& sl = c.slaves[k];
            sl.mem = c.mems[k == channels ? 0 : k].get();
            sl.latency = latency;
            sl.max_out = max_outstanding;
            sl.bytes_per_cycle = bytes_per_cycle;
        }
        bind(c);
    }
    s->right.resize(ncards);
    s->left.resize(ncards);
    s->right_j.resize(ncards);
    s->left_j.resize(ncards);
    s->right_o.resize(ncards);
    s->left_o.resize(ncards);
    for (auto* links : {&s->right, &s->left})
        for (auto& L : *links) { L.latency = link_latency; L.bytes_per_cycle = link_bytes_per_cycle; }
    s->buf.resize(256);
    for (auto& c : s->cards) { c->top->ap_rst_n = 0; c->top->ap_clk = 0; }
    for (int i = 0; i < 8; i++) s->clock();
    for (auto& c : s->cards) c->top->ap_rst_n = 1;
    s->clock();
    return s;
}

void sim_free(void* p) { delete static_cast<Sim*>(p); }

static Memory* channel(void* p, int card, int ch) {
    auto* s = static_cast<Sim*>(p);
    return s->cards.at(card)->mems.at(ch).get();
}

int hbm_write(void* p, int card, int ch, uint64_t off, const uint8_t* data, uint64_t n) {
    Memory* m = channel(p, card, ch);
    if (off + n > m->size) return -1;
    std::memcpy(m->base + off, data, n);
    return 0;
}

int hbm_read(void* p, int card, int ch, uint64_t off, uint8_t* data, uint64_t n) {
    Memory* m = channel(p, card, ch);
    if (off + n > m->size) return -1;
    std::memcpy(data, m->base + off, n);
    return 0;
}

// AXI4-Lite transactions on one card; each returns -1 if it does not answer within 1000 cycles.
int reg_write(void* p, int card, uint32_t addr, uint32_t value) {
    auto* s = static_cast<Sim*>(p);
    Card& c = *s->cards.at(card);
    c.awaddr.set(addr); c.wdata.set(value); c.wstrb.set(0xF);
    c.awvalid.set(1); c.wvalid.set(1); c.bready.set(1);
    bool aw = false, w = false;
    for (int i = 0; i < 1000; i++) {
        c.top->eval();
        bool aw_now = c.awvalid.get() && c.awready.get();
        bool w_now = c.wvalid.get() && c.wready.get();
        bool b_now = c.bvalid.get() && c.bready.get();
        s->clock();
        if (aw_now) { aw = true; c.awvalid.set(0); }
        if (w_now) { w = true; c.wvalid.set(0); }
        if (b_now && aw && w) { c.bready.set(0); return 0; }
    }
    return -1;
}

int64_t reg_read(void* p, int card, uint32_t addr) {
    auto* s = static_cast<Sim*>(p);
    Card& c = *s->cards.at(card);
    c.araddr.set(addr); c.arvalid.set(1); c.rready.set(1);
    bool ar = false;
    for (int i = 0; i < 1000; i++) {
        c.top->eval();
        bool ar_now = c.arvalid.get() && c.arready.get();
        bool r_now = c.rvalid.get() && c.rready.get();
        uint64_t v = c.rdata.get();
        s->clock();
        if (ar_now) { ar = true; c.arvalid.set(0); }
        if (r_now && ar) { c.rready.set(0); return static_cast<int64_t>(v & 0xFFFFFFFFu); }
    }
    return -1;
}

// Clock until the interrupt of every card in `mask` is high; returns the cycles run, or -1
// after max_cycles.
int64_t run(void* p, uint64_t mask, uint64_t max_cycles) {
    auto* s = static_cast<Sim*>(p);
    for (uint64_t i = 0; i < max_cycles; i++) {
        bool all = true;
        for (size_t k = 0; k < s->cards.size(); k++) {
            if (!(mask >> k & 1)) continue;
            s->cards[k]->top->eval();
            all = all && s->cards[k]->top->__SYM__interrupt;   // the Vitis `interrupt` port
        }
        if (all) return static_cast<int64_t>(i);
        s->clock();
    }
    return -1;
}

uint64_t cycles(void* p) { return static_cast<Sim*>(p)->cycle; }

// Clock every card `n` cycles, whatever their interrupts.
void clock_n(void* p, uint64_t n) {
    auto* s = static_cast<Sim*>(p);
    for (uint64_t i = 0; i < n; i++) s->clock();
}

// Random stalls (the header's Stalls paragraph) on every AXI port of every card and on every
// link, from `seed`; all zero turns them off. Each port and link direction draws from its own
// generator, seeded from `seed` and its place.
void set_stalls(void* p, double ready, double valid, int delay, double link, uint64_t seed) {
    auto* s = static_cast<Sim*>(p);
    std::seed_seq base{seed};
    std::vector<uint32_t> seeds;
    size_t n = 0;
    for (auto& c : s->cards) n += 2 * c->slaves.size();
    n += s->right_j.size() + s->left_j.size();
    seeds.resize(2 * n);
    base.generate(seeds.begin(), seeds.end());
    size_t k = 0;
    auto next = [&]() { uint64_t v = (static_cast<uint64_t>(seeds[k]) << 32) | seeds[k + 1]; k += 2; return v; };
    for (auto& c : s->cards)
        for (auto& sl : c->slaves) {
            sl.ready_j.stall = ready;
            sl.ready_j.seed(next());
            sl.valid_j.stall = valid;
            sl.valid_j.delay = delay < 0 ? 0 : delay;
            sl.valid_j.seed(next());
        }
    for (auto* js : {&s->right_j, &s->left_j})
        for (auto& j : *js) { j.stall = link; j.seed(next()); }
}

// Fault injection on link right[i] (dir 0) or left[i] (dir 1).
int set_link(void* p, int i, int dir, double ber, double drop) {
    auto* s = static_cast<Sim*>(p);
    if (i < 0 || static_cast<size_t>(i) >= s->right.size()) return -1;
    Link& L = dir ? s->left[i] : s->right[i];
    L.ber = ber;
    L.drop = drop;
    return 0;
}

// Frames sent with a wrong CRC field on any link (a sender bug), and frames dropped/bits flipped.
void link_stats(void* p, uint64_t* out) {
    auto* s = static_cast<Sim*>(p);
    out[0] = out[1] = out[2] = out[3] = 0;
    for (auto* links : {&s->right, &s->left})
        for (auto& L : *links) { out[0] += L.bad_frames; out[1] += L.frames; out[2] += L.dropped; out[3] += L.flipped; }
}

// A fault on port `port` of card `card` (port == channels: the instruction port), counted
// from now (the header's Faults paragraph): kind 0 the `at`-th read burst answered with
// `resp`; 1 the `at`-th write burst answered with `resp`; 2 no R, 3 no ARREADY, 4 no B,
// 5 no AWREADY from the `at`-th burst on for `cycles` cycles (0: until reset); 6 the beat at
// byte `addr` read with `mask` (the port's beat bytes) XORed in. Returns -1 for a bad argument.
int set_fault(void* p, int card, int port, int kind, uint64_t at, uint64_t cycles, int resp,
              uint64_t addr, const uint8_t* mask) {
    auto* s = static_cast<Sim*>(p);
    if (card < 0 || static_cast<size_t>(card) >= s->cards.size()) return -1;
    Card& c = *s->cards[card];
    if (port < 0 || static_cast<size_t>(port) >= c.slaves.size()) return -1;
    Slave& sl = c.slaves[port];
    PortFaults& f = sl.f;
    if ((kind == 1 || kind == 4 || kind == 5) && !sl.a.has_write) return -1;
    switch (kind) {
    case 0: f.rd_err_at = f.ars + at; f.rd_resp = resp; break;
    case 1: f.wr_err_at = f.aws + at; f.wr_resp = resp; break;
    case 2: case 3: case 4: case 5: {
        static const int quiet[] = {QUIET_R, QUIET_AR, QUIET_B, QUIET_AW};
        f.quiet = quiet[kind - 2];
        f.quiet_cycles = cycles;
        f.quiet_on = f.quiet_done = false;
        uint64_t seen = (kind == 2 || kind == 3) ? f.ars : f.aws;
        f.quiet_at = seen + at;
        if ((kind == 3 || kind == 5) && at <= 1) f.start_quiet(s->cycle);
        break;
    }
    case 6: {
        if (addr % sl.a.beat) return -1;
        f.flips.push_back({addr, std::vector<uint8_t>(mask, mask + sl.a.beat)});
        break;
    }
    default: return -1;
    }
    return 0;
}

// Every fault of every port and link off (counts kept).
void clear_faults(void* p) {
    auto* s = static_cast<Sim*>(p);
    for (auto& c : s->cards)
        for (auto& sl : c->slaves) {
            uint64_t e = sl.f.errors, fl = sl.f.flipped;
            sl.f = PortFaults();
            sl.f.errors = e;
            sl.f.flipped = fl;
        }
    for (auto* os : {&s->right_o, &s->left_o})
        for (auto& o : *os) { uint64_t lost = o.lost; o = Outage(); o.lost = lost; }
}

// What port `port` of card `card` has open: out[0] read bursts accepted and not finished,
// out[1] write bursts accepted (AW) and not answered, out[2] W beats held without their
// burst's AW, out[3] an R beat or B response shown and not taken, out[4] error responses
// given, out[5] beats read corrupted, out[6] 1 while a silence is on.
int port_state(void* p, int card, int port, uint64_t* out) {
    auto* s = static_cast<Sim*>(p);
    if (card < 0 || static_cast<size_t>(card) >= s->cards.size()) return -1;
    Card& c = *s->cards[card];
    if (port < 0 || static_cast<size_t>(port) >= c.slaves.size()) return -1;
    Slave& sl = c.slaves[port];
    size_t w_in_bursts = 0;
    for (auto& wb : sl.awq) w_in_bursts += wb.beats;
    out[0] = sl.rq.size();
    out[1] = static_cast<uint64_t>(sl.writes_open);
    out[2] = sl.wq.size() > w_in_bursts ? sl.wq.size() - w_in_bursts : 0;
    out[3] = (sl.r_held || sl.b_held) ? 1 : 0;
    out[4] = sl.f.errors;
    out[5] = sl.f.flipped;
    out[6] = sl.f.quiet_on ? 1 : 0;
    return 0;
}

// Transactions open in card `card`'s port models in the cycle its interrupt last rose (its
// ap_done): 0 after a clean stop. -1 for a bad card.
int64_t open_at_done(void* p, int card) {
    auto* s = static_cast<Sim*>(p);
    if (card < 0 || static_cast<size_t>(card) >= s->cards.size()) return -1;
    return static_cast<int64_t>(s->cards[card]->open_at_irq);
}

// Link right[i] (dir 0) or left[i] (dir 1) goes down once `after` more frames have started on
// it, for `cycles` cycles. Returns -1 for a bad link.
int link_outage(void* p, int i, int dir, uint64_t after, uint64_t cycles) {
    auto* s = static_cast<Sim*>(p);
    if (i < 0 || static_cast<size_t>(i) >= s->right.size()) return -1;
    Outage& o = dir ? s->left_o[i] : s->right_o[i];
    bool at_start = o.at_start;
    uint64_t lost = o.lost;
    o = Outage();
    o.at_start = at_start;
    o.lost = lost;
    o.armed = true;
    o.after = after;
    o.cycles = cycles;
    return 0;
}

// Beats lost to outages, over every link.
uint64_t outage_lost(void* p) {
    auto* s = static_cast<Sim*>(p);
    uint64_t n = 0;
    for (auto* os : {&s->right_o, &s->left_o})
        for (auto& o : *os) n += o.lost;
    return n;
}

// Reset every card (ap_rst_n low for 8 cycles), every memory model's open transactions and
// faults, and every link's contents; HBM contents and the stall generators stay.
void sim_reset(void* p) {
    auto* s = static_cast<Sim*>(p);
    for (auto& c : s->cards) {
        c->top->ap_rst_n = 0;
        for (auto& sl : c->slaves) sl.reset();
        c->r_rx_held = c->l_rx_held = false;
    }
    for (auto* links : {&s->right, &s->left})
        for (auto& L : *links) {
            L.q.clear();
            L.frame.clear();
            L.bucket = 0;
            L.dropping = false;
            L.at_frame_start = true;
        }
    for (auto* os : {&s->right_o, &s->left_o})
        for (auto& o : *os) { uint64_t lost = o.lost; o = Outage(); o.lost = lost; }
    for (int i = 0; i < 8; i++) {
        for (auto& c : s->cards)
            for (auto& sl : c->slaves) sl.reset();    // nothing the card drives during reset counts
        s->clock();
    }
    for (auto& c : s->cards) c->top->ap_rst_n = 1;
    s->clock();
}

}  // extern "C"
