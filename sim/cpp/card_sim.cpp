// Verilator harness of one card kernel with its HBM channels, built as a shared library and
// driven from Python through ctypes (sim/system.py). No Python runs per clock: the host calls
// reg_write/reg_read (AXI4-Lite transactions), hbm_write/hbm_read (backdoor memcpy) and
// run(max_cycles), which clocks the model until the kernel's interrupt rises.
//
// HBM channel model, per AXI port: reads accepted while fewer than `max_outstanding` bursts
// are open; a burst's first beat leaves `latency` cycles after its AR; beats in order, one per
// cycle at most, and no faster than the channel's bandwidth cap (a byte bucket refilled by
// `bytes_per_cycle` each cycle, shared by reads and writes); writes applied with their
// strobes once address and data are both in, answered `latency` cycles later. Accesses
// outside the channel answer SLVERR (reads return zeros, writes are dropped).
// The m_axi_insn port reads channel 0's memory through its own model.

#include <sys/mman.h>

#include <cstdint>
#include <cstring>
#include <deque>
#include <memory>
#include <vector>

#include "Vcard.h"
#include "verilated.h"

namespace {

struct Port {
    void* p = nullptr;
    int bits = 0;
    uint64_t get() const {
        if (bits <= 8) return *static_cast<uint8_t*>(p);
        if (bits <= 16) return *static_cast<uint16_t*>(p);
        if (bits <= 32) return *static_cast<uint32_t*>(p);
        return *static_cast<uint64_t*>(p);
    }
    void set(uint64_t v) const {
        if (bits <= 8) *static_cast<uint8_t*>(p) = static_cast<uint8_t>(v);
        else if (bits <= 16) *static_cast<uint16_t*>(p) = static_cast<uint16_t>(v);
        else if (bits <= 32) *static_cast<uint32_t*>(p) = static_cast<uint32_t>(v);
        else *static_cast<uint64_t*>(p) = v;
    }
    // Wide values as little-endian bytes (Verilator keeps them as 32-bit words, low first).
    void get_bytes(uint8_t* out, int n) const {
        if (bits <= 64) { uint64_t v = get(); std::memcpy(out, &v, n); }
        else std::memcpy(out, p, n);
    }
    void set_bytes(const uint8_t* in, int n) const {
        if (bits <= 64) { uint64_t v = 0; std::memcpy(&v, in, n); set(v); }
        else std::memcpy(p, in, n);
    }
};

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

    // Drive this cycle's outputs from the state (before the edge).
    void drive(uint64_t now, std::vector<uint8_t>& buf) {
        a.arready.set(rq.size() < static_cast<size_t>(max_out));
        bool rv = false;
        if (!rq.empty() && rq.front().ready <= now && credit >= a.beat) {
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
        if (a.has_write) {
            a.awready.set(writes_open < max_out);
            a.wready.set(wq.size() < 64);
            bool bv = !bq.empty() && bq.front().ready <= now;
            a.bvalid.set(bv);
            a.bresp.set(bv ? bq.front().resp : 0);
            a.bid.set(0);
        }
    }

    // After the edge: apply the handshakes that were sampled before it.
    void update(uint64_t now, bool ar, bool r, bool aw, bool w, bool b, uint64_t ar_addr, int ar_len,
                uint64_t aw_addr, int aw_len, const std::vector<uint8_t>& wdata,
                const std::vector<uint8_t>& wstrb) {
        credit = std::min(credit + bytes_per_cycle, 2.0 * a.beat + bytes_per_cycle);
        if (r) {
            Burst& bb = rq.front();
            credit -= a.beat;
            rd_beats++;
            if (++bb.sent == bb.beats) rq.pop_front();
        }
        if (ar) rq.push_back({ar_addr, ar_len + 1, 0, now + static_cast<uint64_t>(latency)});
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
                bq.push_back({now + static_cast<uint64_t>(latency), ok ? 0 : 2});
            }
        }
    }
};

struct Sim {
    std::unique_ptr<VerilatedContext> ctx;
    std::unique_ptr<Vcard> top;
    std::vector<std::unique_ptr<Memory>> mems;
    std::vector<Slave> slaves;
    Port awaddr, awvalid, awready, wdata, wstrb, wvalid, wready, bresp, bvalid, bready;
    Port araddr, arvalid, arready, rdata, rresp, rvalid, rready;
    uint64_t cycle = 0;
    std::vector<uint8_t> buf, wbuf, sbuf;

    void clock() {
        for (auto& s : slaves) s.drive(cycle, buf);
        top->eval();
        // Sample the handshakes the coming edge will make.
        struct H { bool ar, r, aw, w, b; uint64_t ar_addr, aw_addr; int ar_len, aw_len; };
        std::vector<H> hs(slaves.size());
        std::vector<std::vector<uint8_t>> wd(slaves.size()), ws(slaves.size());
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
        top->ap_clk = 1;
        top->eval();
        top->ap_clk = 0;
        top->eval();
        for (size_t i = 0; i < slaves.size(); i++) {
            H& h = hs[i];
            slaves[i].update(cycle, h.ar, h.r, h.aw, h.w, h.b, h.ar_addr, h.ar_len, h.aw_addr,
                             h.aw_len, wd[i], ws[i]);
        }
        cycle++;
    }
};

#include "card_ports.h"   // generated: bind(Sim&) fills the ports of this config's top

}  // namespace

extern "C" {

void* sim_new(int channels, uint64_t channel_bytes, int latency, double bytes_per_cycle,
              int max_outstanding) {
    auto* s = new Sim();
    s->ctx = std::make_unique<VerilatedContext>();
    s->top = std::make_unique<Vcard>(s->ctx.get());
    for (int c = 0; c < channels; c++) {
        s->mems.push_back(std::make_unique<Memory>(channel_bytes));
        if (!s->mems.back()->base) { delete s; return nullptr; }
    }
    s->slaves.resize(channels + 1);
    for (int c = 0; c <= channels; c++) {
        Slave& sl = s->slaves[c];
        sl.mem = s->mems[c == channels ? 0 : c].get();
        sl.latency = latency;
        sl.max_out = max_outstanding;
        sl.bytes_per_cycle = bytes_per_cycle;
    }
    bind(*s);
    s->buf.resize(256);
    s->top->ap_rst_n = 0;
    s->top->ap_clk = 0;
    for (int i = 0; i < 8; i++) s->clock();
    s->top->ap_rst_n = 1;
    s->clock();
    return s;
}

void sim_free(void* p) { delete static_cast<Sim*>(p); }

int hbm_write(void* p, int ch, uint64_t off, const uint8_t* data, uint64_t n) {
    auto* s = static_cast<Sim*>(p);
    Memory* m = s->mems.at(ch).get();
    if (off + n > m->size) return -1;
    std::memcpy(m->base + off, data, n);
    return 0;
}

int hbm_read(void* p, int ch, uint64_t off, uint8_t* data, uint64_t n) {
    auto* s = static_cast<Sim*>(p);
    Memory* m = s->mems.at(ch).get();
    if (off + n > m->size) return -1;
    std::memcpy(data, m->base + off, n);
    return 0;
}

// AXI4-Lite transactions; each returns -1 if the slave does not answer within 1000 cycles.
int reg_write(void* p, uint32_t addr, uint32_t value) {
    auto* s = static_cast<Sim*>(p);
    s->awaddr.set(addr); s->wdata.set(value); s->wstrb.set(0xF);
    s->awvalid.set(1); s->wvalid.set(1); s->bready.set(1);
    bool aw = false, w = false;
    for (int i = 0; i < 1000; i++) {
        s->top->eval();
        bool aw_now = s->awvalid.get() && s->awready.get();
        bool w_now = s->wvalid.get() && s->wready.get();
        bool b_now = s->bvalid.get() && s->bready.get();
        s->clock();
        if (aw_now) { aw = true; s->awvalid.set(0); }
        if (w_now) { w = true; s->wvalid.set(0); }
        if (b_now && aw && w) { s->bready.set(0); return 0; }
    }
    return -1;
}

int64_t reg_read(void* p, uint32_t addr) {
    auto* s = static_cast<Sim*>(p);
    s->araddr.set(addr); s->arvalid.set(1); s->rready.set(1);
    bool ar = false;
    for (int i = 0; i < 1000; i++) {
        s->top->eval();
        bool ar_now = s->arvalid.get() && s->arready.get();
        bool r_now = s->rvalid.get() && s->rready.get();
        uint64_t v = s->rdata.get();
        s->clock();
        if (ar_now) { ar = true; s->arvalid.set(0); }
        if (r_now && ar) { s->rready.set(0); return static_cast<int64_t>(v & 0xFFFFFFFFu); }
    }
    return -1;
}

// Clock until the interrupt line is high; returns the cycles run, or -1 after max_cycles.
int64_t run(void* p, uint64_t max_cycles) {
    auto* s = static_cast<Sim*>(p);
    for (uint64_t i = 0; i < max_cycles; i++) {
        s->top->eval();
        if (s->top->__SYM__interrupt) return static_cast<int64_t>(i);  // the Vitis `interrupt` port
        s->clock();
    }
    return -1;
}

uint64_t cycles(void* p) { return static_cast<Sim*>(p)->cycle; }

}  // extern "C"
