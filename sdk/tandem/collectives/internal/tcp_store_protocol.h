// The wire format of TcpStore (internal): every message is {magic: u32, op: u8, nonce: u64,
// rank: i32, a: u32 length + bytes, b: u32 length + bytes} (HELLO: a = token, b = cluster; SET:
// a = key, b = value; GET: a = key); every reply is {status: u8, length: u32, payload}. Numbers
// are in the machine's byte order (the workers of a job share one architecture).
#pragma once

#include <cstdint>
#include <cstring>
#include <string>

#include "tandem/collectives/internal/tcp_store.h"

namespace tandem::collectives::store_wire {

constexpr uint32_t kMagic = 0x53444e54;  // "TNDS"
constexpr uint8_t kHello = 1, kSet = 2, kGet = 3, kDeparted = 4;
constexpr uint8_t kOk = 0, kMissing = 1, kRefused = 2;
constexpr size_t kHeaderBytes = 4 + 1 + 8 + 4;  // magic, op, nonce, rank
constexpr size_t kMaxTokenBytes = 1024;

template <typename T>
void put(std::string& out, T value) {
  out.append(reinterpret_cast<const char*>(&value), sizeof(value));
}

template <typename T>
T take(const std::string& in, size_t at) {
  T value;
  std::memcpy(&value, in.data() + at, sizeof(value));
  return value;
}

inline std::string encode(uint8_t op, uint64_t nonce, int32_t rank, const std::string& a,
                          const std::string& b) {
  std::string out;
  out.reserve(kHeaderBytes + 8 + a.size() + b.size());
  put(out, kMagic);
  put(out, op);
  put(out, nonce);
  put(out, rank);
  put(out, static_cast<uint32_t>(a.size()));
  out += a;
  put(out, static_cast<uint32_t>(b.size()));
  out += b;
  return out;
}

inline std::string encode_reply(uint8_t status, const std::string& payload) {
  std::string out;
  put(out, status);
  put(out, static_cast<uint32_t>(payload.size()));
  out += payload;
  return out;
}

/// The longest a part of a message of `op` may be (part 0: a, part 1: b).
inline size_t part_limit(uint8_t op, int part) {
  switch (op) {
    case kHello:
      return part == 0 ? kMaxTokenBytes : TcpStore::kMaxValueBytes;
    case kSet:
      return part == 0 ? TcpStore::kMaxKeyBytes : TcpStore::kMaxValueBytes;
    case kGet:
      return part == 0 ? TcpStore::kMaxKeyBytes : 0;
    default:
      return 0;
  }
}

}  // namespace tandem::collectives::store_wire
