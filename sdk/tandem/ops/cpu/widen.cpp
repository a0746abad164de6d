// The calling thread's pool of float32 buffers (widen.h).
#include "tandem/ops/cpu/widen.h"

#include <algorithm>
#include <utility>
#include <vector>

namespace tandem::ops::cpu {

namespace {

/// Free buffers kept per thread, at most; past that the smallest goes back to the allocator.
constexpr size_t kPoolSize = 8;

struct Block {
  int64_t capacity;
  std::unique_ptr<float[]> storage;
};

std::vector<Block>& pool() {
  thread_local std::vector<Block> blocks;
  return blocks;
}

}  // namespace

FloatBuffer::FloatBuffer(int64_t n) : size_(n) {
  if (n <= 0) {
    size_ = 0;
    return;
  }
  std::vector<Block>& blocks = pool();
  // The smallest free block that fits.
  auto best = blocks.end();
  for (auto it = blocks.begin(); it != blocks.end(); ++it)
    if (it->capacity >= n && (best == blocks.end() || it->capacity < best->capacity)) best = it;
  if (best != blocks.end()) {
    capacity_ = best->capacity;
    storage_ = std::move(best->storage);
    blocks.erase(best);
  } else {
    capacity_ = n;
    storage_ = std::make_unique_for_overwrite<float[]>(static_cast<size_t>(n));
  }
}

FloatBuffer::FloatBuffer(FloatBuffer&& other) noexcept
    : storage_(std::move(other.storage_)), capacity_(other.capacity_), size_(other.size_) {
  other.capacity_ = 0;
  other.size_ = 0;
}

FloatBuffer::~FloatBuffer() {
  if (!storage_) return;
  std::vector<Block>& blocks = pool();
  blocks.push_back({capacity_, std::move(storage_)});
  if (blocks.size() > kPoolSize)
    blocks.erase(std::min_element(blocks.begin(), blocks.end(), [](const Block& a, const Block& b) {
      return a.capacity < b.capacity;
    }));
}

}  // namespace tandem::ops::cpu
