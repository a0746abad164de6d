// IteratorState: named int64 arrays with checked access.
#include "tandem/data/iterator_state.h"

#include <cstring>
#include <sstream>

#include "tandem/core/error.h"

namespace tandem::data {

IteratorState::IteratorState(Entries entries) {
  for (auto& [name, values] : entries) {
    TANDEM_CHECK(!contains(name), "IteratorState: entry '", name, "' appears twice");
    entries_.emplace_back(std::move(name), std::move(values));
  }
}

void IteratorState::set(const std::string& name, Array values) {
  for (auto& [existing, array] : entries_) {
    if (existing == name) {
      array = std::move(values);
      return;
    }
  }
  entries_.emplace_back(name, std::move(values));
}

void IteratorState::set_u64(const std::string& name, const std::vector<uint64_t>& values) {
  Array bits(values.size());
  if (!values.empty()) std::memcpy(bits.data(), values.data(), values.size() * sizeof(uint64_t));
  set(name, std::move(bits));
}

void IteratorState::merge(const IteratorState& other) {
  for (const auto& [name, values] : other.entries_) set(name, values);
}

bool IteratorState::contains(std::string_view name) const {
  for (const auto& entry : entries_)
    if (entry.first == name) return true;
  return false;
}

const IteratorState::Array& IteratorState::get(std::string_view name) const {
  for (const auto& entry : entries_)
    if (entry.first == name) return entry.second;
  TANDEM_THROW("iterator state has no entry '", name, "' (it was saved from another pipeline, ",
               "or is incomplete); entries: ", entries_.size());
}

int64_t IteratorState::get_scalar(std::string_view name) const {
  const Array& values = get(name);
  TANDEM_CHECK(values.size() == 1, "iterator state entry '", name, "' should hold one value, ",
               "it holds ", values.size());
  return values[0];
}

std::vector<uint64_t> IteratorState::get_u64(std::string_view name) const {
  const Array& values = get(name);
  std::vector<uint64_t> out(values.size());
  if (!values.empty()) std::memcpy(out.data(), values.data(), values.size() * sizeof(uint64_t));
  return out;
}

size_t IteratorState::num_values() const {
  size_t n = 0;
  for (const auto& entry : entries_) n += entry.second.size();
  return n;
}

std::string IteratorState::to_string() const {
  std::ostringstream out;
  for (const auto& [name, values] : entries_) {
    out << name << ": [";
    for (size_t i = 0; i < values.size() && i < 8; ++i) out << (i ? ", " : "") << values[i];
    if (values.size() > 8) out << ", ... (" << values.size() << " values)";
    out << "]\n";
  }
  return out.str();
}

}  // namespace tandem::data
