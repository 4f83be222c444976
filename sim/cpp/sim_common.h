// Pieces shared by the Verilator harnesses (card_sim.cpp, fabric_sim.cpp): ports of a
// Verilated top bound by pointer, and the model of one direction of a ring link.
//
// Link model: a beat is accepted from the sender while a byte bucket refilled at the line
// rate (bytes_per_cycle) holds a beat's worth; it reaches the receiver `latency` cycles later,
// in order. Faults: each frame is dropped whole with probability `drop` (1.0 is a dead link),
// and every bit of a beat flips with probability `ber`. The network buffers whatever is in
// flight (the link layer's credits bound it). Every frame's CRC field is recomputed here as
// sent (independently of the RTL): `bad_frames` counts disagreements (a sender bug).
//
// Jitter: seeded random flow control for the memory and link models (off unless set): a
// ready held low, or a valid that could rise held back, with probability `stall` in each cycle;
// a response's extra latency uniform in [0, `delay`] cycles. A model keeps a valid it has
// shown until its handshake (AXI's rule), whatever the draw.

#pragma once

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <deque>
#include <random>
#include <vector>

namespace gptfpga {

struct Port {
    void* p = nullptr;
    int bits = 0;
    uint64_t get() const {
        if (bits <= 8) return *static_cast<uint8_t*>(p);
        if (bits <= 16) return *static_cast<uint16_t*>(p);
        if (bits <= 32) return *static_cast<uint32_t*>(p);
        if (bits <= 64) return *static_cast<uint64_t*>(p);
        return static_cast<uint32_t*>(p)[0] | (static_cast<uint64_t>(static_cast<uint32_t*>(p)[1]) << 32);
    }
    void set(uint64_t v) const {
        if (bits <= 8) *static_cast<uint8_t*>(p) = static_cast<uint8_t>(v);
        else if (bits <= 16) *static_cast<uint16_t*>(p) = static_cast<uint16_t>(v);
        else if (bits <= 32) *static_cast<uint32_t*>(p) = static_cast<uint32_t>(v);
        else if (bits <= 64) *static_cast<uint64_t*>(p) = v;
        else {
            auto* w = static_cast<uint32_t*>(p);
            int words = (bits + 31) / 32;
            for (int i = 0; i < words; i++) w[i] = 0;
            w[0] = static_cast<uint32_t>(v);
            w[1] = static_cast<uint32_t>(v >> 32);
        }
    }
    // Wide values as little-endian bytes (Verilator keeps them as 32-bit words, low first).
    void get_bytes(uint8_t* out, int n) const {
        if (bits <= 64) { uint64_t v = get(); std::memcpy(out, &v, n); }
        else std::memcpy(out, p, n);
    }
    void set_bytes(const uint8_t* in, int n) const {
        if (bits <= 64) { uint64_t v = 0; std::memcpy(&v, in, n); set(v); }
        else {
            int words = (bits + 31) / 32;
            std::memset(p, 0, words * 4);
            std::memcpy(p, in, n);
        }
    }
};

inline uint32_t crc32(const uint8_t* d, size_t n) {
    static uint32_t table[256];
    static bool init = false;
    if (!init) {
        for (uint32_t i = 0; i < 256; i++) {
            uint32_t c = i;
            for (int k = 0; k < 8; k++) c = (c & 1) ? 0xEDB88320u ^ (c >> 1) : c >> 1;
            table[i] = c;
        }
        init = true;
    }
    uint32_t c = 0xFFFFFFFFu;
    for (size_t i = 0; i < n; i++) c = table[(c ^ d[i]) & 0xFF] ^ (c >> 8);
    return c ^ 0xFFFFFFFFu;
}

class Jitter {
public:
    double stall = 0;
    int delay = 0;
    void seed(uint64_t s) { rng_.seed(s); }
    bool on() const { return stall > 0 || delay > 0; }
    // This cycle's ready (or a new valid) held low?
    bool hold() { return stall > 0 && std::uniform_real_distribution<double>(0, 1)(rng_) < stall; }
    // A response's extra latency, cycles.
    int extra() { return delay > 0 ? std::uniform_int_distribution<int>(0, delay)(rng_) : 0; }

private:
    std::mt19937_64 rng_;
};

struct WireBeat { std::vector<uint8_t> data; bool last; uint64_t due; };

struct Link {
    std::deque<WireBeat> q;
    std::vector<uint8_t> frame;    // the frame being sent, for the CRC self-check
    uint64_t bad_frames = 0;       // frames whose CRC field is wrong as sent (a sender bug)
    std::vector<std::vector<uint8_t>> bad_log;
    double bucket = 0, bytes_per_cycle = 0;
    int latency = 0;
    double ber = 0, drop = 0;
    bool dropping = false, at_frame_start = true;
    uint64_t frames = 0, dropped = 0, flipped = 0;

    bool ready(int beat_bytes) const { return bucket >= beat_bytes; }
    bool head(uint64_t cycle) const { return !q.empty() && q.front().due <= cycle; }
    void refill(int beat_bytes) { bucket = std::min(bucket + bytes_per_cycle, 4.0 * beat_bytes); }

    // The sender's beat, taken at `cycle` (its trailer is the low 16 bytes of the last beat).
    void inject(const uint8_t* data, bool last, int beat_bytes, uint64_t cycle, std::mt19937_64& rng) {
        bucket -= beat_bytes;
        WireBeat b{std::vector<uint8_t>(data, data + beat_bytes), last, cycle + latency};
        frame.insert(frame.end(), data, data + beat_bytes);
        if (last) {
            size_t t = frame.size() - beat_bytes;     // the trailer beat
            uint32_t field;
            std::memcpy(&field, &frame[t + 12], 4);
            std::memset(&frame[t + 12], 0, 4);
            if (crc32(frame.data(), frame.size()) != field) {
                bad_frames++;
                if (bad_log.size() < 8) {
                    std::vector<uint8_t> rec(frame.begin() + t, frame.begin() + t + 16);
                    rec.push_back(static_cast<uint8_t>(frame.size() / beat_bytes));
                    std::memcpy(&rec[12], &field, 4);
                    bad_log.push_back(rec);
                }
            }
            frame.clear();
        }
        if (at_frame_start) {
            frames++;
            dropping = drop > 0 && std::uniform_real_distribution<double>(0, 1)(rng) < drop;
            if (dropping) dropped++;
        }
        at_frame_start = last;
        if (dropping) return;
        if (ber > 0) {
            int bits = beat_bytes * 8;
            std::binomial_distribution<int> flips(bits, ber);
            int k = flips(rng);
            for (int i = 0; i < k; i++) {
                int bit = std::uniform_int_distribution<int>(0, bits - 1)(rng);
                b.data[bit / 8] ^= static_cast<uint8_t>(1u << (bit % 8));
                flipped++;
            }
        }
        q.push_back(std::move(b));
    }

    // The head beat as the receiver's payload port wants it: data, then `last` in the next byte.
    void head_payload(const Port& payload, int beat_bytes) const {
        std::vector<uint8_t> buf(q.front().data);
        buf.resize(beat_bytes + 1);
        buf[beat_bytes] = q.front().last;
        payload.set_bytes(buf.data(), beat_bytes + 1);
    }
};

}  // namespace gptfpga
