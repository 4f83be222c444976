// N collective nodes (hw/collective/node.py) in a ring, joined by link models, as a shared
// library driven from Python through ctypes (sim/fabric.py). No Python runs per clock.
//
// One link model (sim_common.h) per direction of each neighbour pair. Each node's memory is a
// byte array served by its engine's read ports (data after a configurable latency) and write
// ports.

#include <array>
#include <cstdint>
#include <cstring>
#include <deque>
#include <memory>
#include <random>
#include <vector>

#include "Vnode.h"
#include "sim_common.h"
#include "verilated.h"

namespace {

using gptfpga::Link;
using gptfpga::Port;

// A memory read port (hw/stream.py ReadPort): addresses on req (with backpressure), beats on
// resp in request order (always taken). A write port: a stream of (addr, data) payloads.
struct MemRd { Port req_valid, req_ready, req_addr, resp_valid, resp_data; };
struct MemWr { Port valid, ready, addr, data; };      // addr, data: fields of the payload

struct NodePorts {
    Port r_tx_valid, r_tx_ready, r_tx_payload, r_rx_valid, r_rx_ready, r_rx_payload;
    Port l_tx_valid, l_tx_ready, l_tx_payload, l_rx_valid, l_rx_ready, l_rx_payload;
    Port start, busy, op, fp16, cards, card, bidir, chunk_log2, group, src, dst;
    Port max_chunks_r, max_chunks_l, seg_we, seg_left, seg_addr, seg_data;
    Port link_error, order_error, retx, crc_error, tx_beat_r, tx_beat_l, rx_beat_r, rx_beat_l;
    MemRd rd[4];    // r.rd_src, r.rd_op, l.rd_src, l.rd_op
    MemWr wr[2];    // r.wr, l.wr
};

#include "node_ports.h"   // generated: bind(Vnode*, NodePorts&) and DATA_BITS

struct Stats { uint64_t retx = 0, crc = 0, tx_r = 0, tx_l = 0, rx_r = 0, rx_l = 0; };

struct Fabric {
    std::unique_ptr<VerilatedContext> ctx;
    std::vector<std::unique_ptr<Vnode>> nodes;
    std::vector<NodePorts> ports;
    std::vector<std::vector<uint8_t>> mem;
    std::vector<Link> right, left;   // right[i]: i.R -> (i+1).L ; left[i]: (i+1).L -> i.R
    std::vector<Stats> stats;
    struct Reply { uint64_t due; std::vector<uint8_t> data; };
    std::vector<std::array<std::deque<Reply>, 4>> replies;     // per read port, in order
    int mem_latency = 1, mem_jitter = 0;                        // reply after latency + [0, jitter]
    double mem_stall = 0;                                       // chance a port is not ready
    std::mt19937_64 rng, mem_rng;
    uint64_t cycle = 0;
    int beat_bytes = DATA_BITS / 8;

    bool stall() {
        return mem_stall > 0 && std::uniform_real_distribution<double>(0, 1)(mem_rng) < mem_stall;
    }

    void step() {
        size_t n = nodes.size();
        // Inputs: link heads, bandwidth-limited readiness, memory read data.
        for (size_t i = 0; i < n; i++) {
            NodePorts& p = ports[i];
            Link& in_l = right[(i + n - 1) % n];   // from i-1's R into my L
            Link& in_r = left[i];                  // from i+1's L into my R
            bool lv = in_l.head(cycle);
            p.l_rx_valid.set(lv);
            if (lv) in_l.head_payload(p.l_rx_payload, beat_bytes);
            bool rv = in_r.head(cycle);
            p.r_rx_valid.set(rv);
            if (rv) in_r.head_payload(p.r_rx_payload, beat_bytes);
            p.r_tx_ready.set(right[i].ready(beat_bytes));
            p.l_tx_ready.set(left[(i + n - 1) % n].ready(beat_bytes));
            for (int k = 0; k < 4; k++) {
                auto& q = replies[i][k];
                bool v = !q.empty() && q.front().due <= cycle;
                p.rd[k].resp_valid.set(v);
                if (v) p.rd[k].resp_data.set_bytes(q.front().data.data(), beat_bytes);
                p.rd[k].req_ready.set(!stall());
            }
            for (int k = 0; k < 2; k++) p.wr[k].ready.set(!stall());
        }
        for (auto& t : nodes) t->eval();
        // Handshakes and memory requests of this cycle.
        std::vector<uint8_t> tmp(beat_bytes + 8);
        for (size_t i = 0; i < n; i++) {
            NodePorts& p = ports[i];
            if (p.l_rx_valid.get() && p.l_rx_ready.get()) right[(i + n - 1) % n].q.pop_front();
            if (p.r_rx_valid.get() && p.r_rx_ready.get()) left[i].q.pop_front();
            if (p.r_tx_valid.get() && p.r_tx_ready.get()) {
                p.r_tx_payload.get_bytes(tmp.data(), beat_bytes + 1);
                right[i].inject(tmp.data(), tmp[beat_bytes] & 1, beat_bytes, cycle, rng);
            }
            if (p.l_tx_valid.get() && p.l_tx_ready.get()) {
                p.l_tx_payload.get_bytes(tmp.data(), beat_bytes + 1);
                left[(i + n - 1) % n].inject(tmp.data(), tmp[beat_bytes] & 1, beat_bytes, cycle, rng);
            }
            for (int k = 0; k < 4; k++) {
                auto& q = replies[i][k];
                if (p.rd[k].resp_valid.get()) q.pop_front();           // the engine always takes a reply
                if (p.rd[k].req_valid.get() && p.rd[k].req_ready.get()) {
                    uint64_t a = p.rd[k].req_addr.get() * static_cast<uint64_t>(beat_bytes);
                    Reply r{cycle + mem_latency, std::vector<uint8_t>(beat_bytes, 0)};
                    if (mem_jitter) r.due += std::uniform_int_distribution<int>(0, mem_jitter)(mem_rng);
                    if (!q.empty()) r.due = std::max(r.due, q.back().due);
                    if (a + beat_bytes <= mem[i].size()) std::memcpy(r.data.data(), &mem[i][a], beat_bytes);
                    q.push_back(std::move(r));
                }
            }
            for (int k = 0; k < 2; k++) {
                if (p.wr[k].valid.get() && p.wr[k].ready.get()) {
                    uint64_t a = p.wr[k].addr.get() * static_cast<uint64_t>(beat_bytes);
                    if (a + beat_bytes <= mem[i].size()) p.wr[k].data.get_bytes(&mem[i][a], beat_bytes);
                }
            }
            Stats& s = stats[i];
            s.retx += p.retx.get(); s.crc += p.crc_error.get();
            s.tx_r += p.tx_beat_r.get(); s.tx_l += p.tx_beat_l.get();
            s.rx_r += p.rx_beat_r.get(); s.rx_l += p.rx_beat_l.get();
        }
        for (auto& t : nodes) { t->clk = 1; t->eval(); }
        for (auto& t : nodes) { t->clk = 0; t->eval(); }
        for (auto& L : right) L.refill(beat_bytes);
        for (auto& L : left) L.refill(beat_bytes);
        cycle++;
    }
};

}  // namespace

extern "C" {

void* fab_new(int n, uint64_t mem_bytes, int latency, double bytes_per_cycle, double ber,
              double drop, uint64_t seed) {
    auto* f = new Fabric();
    f->ctx = std::make_unique<VerilatedContext>();
    f->rng.seed(seed);
    f->mem_rng.seed(seed ^ 0x9E3779B97F4A7C15ull);
    f->ports.resize(n);
    f->stats.resize(n);
    f->replies.resize(n);
    for (int i = 0; i < n; i++) {
        f->nodes.push_back(std::make_unique<Vnode>(f->ctx.get()));
        bind(f->nodes.back().get(), f->ports[i]);
        f->mem.emplace_back(mem_bytes, 0);
    }
    f->right.resize(n);
    f->left.resize(n);
    for (auto* links : {&f->right, &f->left})
        for (auto& L : *links) { L.latency = latency; L.bytes_per_cycle = bytes_per_cycle; L.ber = ber; L.drop = drop; }
    for (auto& t : f->nodes) { t->rst = 1; t->clk = 0; t->eval(); }
    for (int k = 0; k < 4; k++) f->step();
    for (auto& t : f->nodes) t->rst = 0;
    f->step();
    return f;
}

void fab_free(void* p) { delete static_cast<Fabric*>(p); }

// The node memory's timing: replies after latency + [0, jitter] cycles, in order; each port
// refuses a request (ready low) with probability stall.
void fab_set_mem(void* p, int latency, int jitter, double stall) {
    auto* f = static_cast<Fabric*>(p);
    f->mem_latency = latency < 1 ? 1 : latency;
    f->mem_jitter = jitter < 0 ? 0 : jitter;
    f->mem_stall = stall;
}

void fab_set_link(void* p, int i, int dir, double ber, double drop) {
    auto* f = static_cast<Fabric*>(p);
    Link& L = dir ? f->left.at(i) : f->right.at(i);
    L.ber = ber;
    L.drop = drop;
}

int fab_mem(void* p, int i, uint64_t off, uint8_t* data, uint64_t n, int write) {
    auto* f = static_cast<Fabric*>(p);
    auto& m = f->mem.at(i);
    if (off + n > m.size()) return -1;
    if (write) std::memcpy(&m[off], data, n); else std::memcpy(data, &m[off], n);
    return 0;
}

void fab_config(void* p, int i, int op, int fp16, int cards, int card, int bidir, int chunk_log2,
                int group, uint32_t src, uint32_t dst, uint32_t max_r, uint32_t max_l) {
    NodePorts& q = static_cast<Fabric*>(p)->ports.at(i);
    q.op.set(op); q.fp16.set(fp16); q.cards.set(cards); q.card.set(card); q.bidir.set(bidir);
    q.chunk_log2.set(chunk_log2); q.group.set(group); q.src.set(src); q.dst.set(dst);
    q.max_chunks_r.set(max_r); q.max_chunks_l.set(max_l);
}

// Write one segment-table entry on every node at once (one clock).
void fab_seg(void* p, const int* left, const int* j, const uint32_t* src, const uint32_t* dst,
             const uint32_t* beats) {
    auto* f = static_cast<Fabric*>(p);
    for (size_t i = 0; i < f->nodes.size(); i++) {
        NodePorts& q = f->ports[i];
        uint8_t entry[12];
        std::memcpy(entry, &src[i], 4);
        std::memcpy(entry + 4, &dst[i], 4);
        std::memcpy(entry + 8, &beats[i], 4);
        q.seg_we.set(1); q.seg_left.set(left[i]); q.seg_addr.set(j[i]);
        q.seg_data.set_bytes(entry, 12);
    }
    f->step();
    for (auto& q : f->ports) q.seg_we.set(0);
}

void fab_start(void* p) {
    auto* f = static_cast<Fabric*>(p);
    for (auto& q : f->ports) q.start.set(1);
    f->step();
    for (auto& q : f->ports) q.start.set(0);
}

// Clock until no node is busy: cycles run, -1 after max_cycles, -2 once a link is dead.
int64_t fab_run(void* p, uint64_t max_cycles) {
    auto* f = static_cast<Fabric*>(p);
    for (uint64_t c = 0; c < max_cycles; c++) {
        bool busy = false, dead = false;
        for (auto& q : f->ports) {
            busy |= q.busy.get() != 0;
            dead |= q.link_error.get() != 0;
        }
        if (dead) return -2;
        if (!busy) return static_cast<int64_t>(c);
        f->step();
    }
    return -1;
}

// retx, crc errors, beats tx right/left, rx right/left, link error bits, order error
void fab_stats(void* p, int i, uint64_t* out) {
    auto* f = static_cast<Fabric*>(p);
    Stats& s = f->stats.at(i);
    NodePorts& q = f->ports.at(i);
    out[0] = s.retx; out[1] = s.crc; out[2] = s.tx_r; out[3] = s.tx_l; out[4] = s.rx_r;
    out[5] = s.rx_l; out[6] = q.link_error.get(); out[7] = q.order_error.get();
}

uint64_t fab_cycles(void* p) { return static_cast<Fabric*>(p)->cycle; }

// Frames sent with a wrong CRC field, on right[i] (dir 0) or left[i] (dir 1): a sender bug.
int fab_bad_log(void* p, int i, int k, uint8_t* out) {
    auto& log = static_cast<Fabric*>(p)->right.at(i).bad_log;
    if (k >= static_cast<int>(log.size())) return -1;
    std::memcpy(out, log[k].data(), log[k].size());
    return static_cast<int>(log[k].size());
}

uint64_t fab_bad_frames(void* p, int i, int dir) {
    auto* f = static_cast<Fabric*>(p);
    return (dir ? f->left.at(i) : f->right.at(i)).bad_frames;
}

}  // extern "C"
