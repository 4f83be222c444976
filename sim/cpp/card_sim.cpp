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

struct Burst { uint64_t addr; int beats; int sent; uint64_t ready; };
struct WBurst { uint64_t addr; int beats; };
struct WBeat { std::vector<uint8_t> data, strb; };
struct BResp { uint64_t ready; int resp; };

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

    // Drive this cycle's outputs from the state (before the edge).
    void drive(uint64_t now, std::vector<uint8_t>& buf) {
        a.arready.set(rq.size() < static_cast<size_t>(max_out) && !ready_j.hold());
        bool rv = false;
        if (!rq.empty() && (r_held || (rq.front().ready <= now && credit >= a.beat && !valid_j.hold()))) {
            Burst& b = rq.front();
            uint64_t addr = b.addr + static_cast<uint64_t>(b.sent) * a.beat;
            bool ok = addr + a.beat <= mem->size;
            if (ok) std::memcpy(buf.data(), mem->base + addr, a.beat);
            else std::memset(buf.data(), 0, a.beat);
            a.rdata.set_bytes(buf.data(), a.beat);
            a.rresp.set(ok ? 0 : 2);
            a.rlast.set(b.sent == b.beats - 1);
            a.rid.set(0);
            rv = true;
        }
        a.rvalid.set(rv);
        r_on = rv;
        if (a.has_write) {
            a.awready.set(writes_open < max_out && !ready_j.hold());
            a.wready.set(wq.size() < 64 && !ready_j.hold());
            bool bv = !bq.empty() && (b_held || (bq.front().ready <= now && !valid_j.hold()));
            a.bvalid.set(bv);
            b_on = bv;
            a.bresp.set(bv ? bq.front().resp : 0);
            a.bid.set(0);
        }
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
        if (ar) rq.push_back({ar_addr, ar_len + 1, 0, now + static_cast<uint64_t>(latency + valid_j.extra())});
        if (a.has_write) {
            if (b) bq.pop_front(), writes_open--;
            if (aw) { awq.push_back({aw_addr, aw_len + 1}); writes_open++; }
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
                bq.push_back({now + static_cast<uint64_t>(latency + valid_j.extra()), ok ? 0 : 2});
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

struct Sim {
    std::unique_ptr<VerilatedContext> ctx;
    std::vector<std::unique_ptr<Card>> cards;
    std::vector<Link> right, left;     // right[i]: i.R -> (i+1).L ; left[i]: (i+1).L -> i.R
    std::vector<Jitter> right_j, left_j;    // the links' stalls
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
        for (auto& c : cards) c->update(cycle);
        if (ring()) {
            for (size_t i = 0; i < n; i++) {
                Card& c = *cards[i];
                int bb = c.link_beat;
                c.l_rx_held = c.l_rx_on && !c.l_rx;
                c.r_rx_held = c.r_rx_on && !c.r_rx;
                if (c.l_rx) right[(i + n - 1) % n].q.pop_front();
                if (c.r_rx) left[i].q.pop_front();
                if (c.r_tx) right[i].inject(c.r_beat.data(), c.r_last, bb, cycle, rng);
                if (c.l_tx) left[(i + n - 1) % n].inject(c.l_beat.data(), c.l_last, bb, cycle, rng);
            }
            for (auto& L : right) L.refill(cards[0]->link_beat);
            for (auto& L : left) L.refill(cards[0]->link_beat);
        }
        cycle++;
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

}  // extern "C"
