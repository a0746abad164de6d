// The directory a CheckpointManager manages (internal/state_file.h), and latest_checkpoint.
#include "tandem/checkpoint/internal/state_file.h"

#include <algorithm>
#include <charconv>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "tandem/checkpoint/checkpoint_manager.h"
#include "tandem/checkpoint/inspect.h"

namespace tandem {

namespace fs = std::filesystem;

namespace detail {

/// N of "ckpt-N.h5", or std::nullopt for any other name.
std::optional<int64_t> checkpoint_number(const std::string& file_name) {
  if (!file_name.starts_with("ckpt-") || !file_name.ends_with(".h5")) return std::nullopt;
  const std::string digits = file_name.substr(5, file_name.size() - 8);
  int64_t value = 0;
  const auto [end, error] = std::from_chars(digits.data(), digits.data() + digits.size(), value);
  if (digits.empty() || error != std::errc() || end != digits.data() + digits.size() || value < 0)
    return std::nullopt;
  return value;
}

std::string checkpoint_file_name(int64_t step) { return "ckpt-" + std::to_string(step) + ".h5"; }

/// The ckpt-N.h5 files of `directory` as (N, name), ascending in N.
std::vector<std::pair<int64_t, std::string>> scan_checkpoints(const std::string& directory) {
  std::vector<std::pair<int64_t, std::string>> found;
  std::error_code ec;
  for (const fs::directory_entry& entry : fs::directory_iterator(directory, ec)) {
    const std::string name = entry.path().filename().string();
    if (const auto n = checkpoint_number(name); n && entry.is_regular_file(ec))
      found.emplace_back(*n, name);
  }
  std::sort(found.begin(), found.end());
  return found;
}

// ---- the state file: TensorFlow's CheckpointState in protobuf text format -------------------

std::string quote(const std::string& text) {
  std::string out = "\"";
  for (char c : text) {
    if (c == '"' || c == '\\') out += '\\';
    out += c;
  }
  return out + "\"";
}

/// The value of `key: "value"`; std::nullopt when the line is not of that form.
std::optional<std::string> unquote(const std::string& text) {
  if (text.size() < 2 || text.front() != '"' || text.back() != '"') return std::nullopt;
  std::string out;
  for (size_t i = 1; i + 1 < text.size(); ++i) {
    char c = text[i];
    if (c == '\\' && i + 2 < text.size()) {
      c = text[++i];
      if (c == 'n') c = '\n';
      if (c == 't') c = '\t';
    }
    out += c;
  }
  return out;
}

/// Parses `directory`/checkpoint; std::nullopt when it is missing or not in the format (other
/// fields, such as TensorFlow's timestamps, are ignored).
std::optional<StateFile> read_state_file(const std::string& directory) {
  // Only a regular file: a FIFO in its place would block the read forever.
  std::error_code ec;
  if (!fs::is_regular_file(fs::path(directory) / kStateFileName, ec)) return std::nullopt;
  std::ifstream in(fs::path(directory) / kStateFileName);
  if (!in) return std::nullopt;
  StateFile state;
  std::string line;
  while (std::getline(in, line)) {
    const size_t first = line.find_first_not_of(" \t\r");
    if (first == std::string::npos) continue;
    const size_t colon = line.find(':', first);
    if (colon == std::string::npos) return std::nullopt;
    const std::string key = line.substr(first, colon - first);
    std::string value = line.substr(colon + 1);
    value.erase(0, value.find_first_not_of(" \t"));
    value.erase(value.find_last_not_of(" \t\r") + 1);
    if (key == "model_checkpoint_path" || key == "all_model_checkpoint_paths") {
      const std::optional<std::string> text = unquote(value);
      if (!text) return std::nullopt;
      (key == "model_checkpoint_path" ? state.latest : state.all.emplace_back()) = *text;
    }
  }
  if (state.latest.empty() && state.all.empty()) return std::nullopt;
  return state;
}

std::string format_state_file(const std::vector<std::string>& kept) {
  std::string text;
  if (!kept.empty()) text += "model_checkpoint_path: " + quote(kept.back()) + "\n";
  for (const std::string& name : kept) text += "all_model_checkpoint_paths: " + quote(name) + "\n";
  return text;
}

std::string resolve(const std::string& directory, const std::string& name) {
  const fs::path p(name);
  return p.is_absolute() ? name : (fs::path(directory) / p).string();
}

/// The candidates to restore, newest first: the state file's target, then every ckpt-N.h5 by
/// descending N. `note` says when the state file was missing.
std::vector<std::string> restore_candidates(const std::string& directory, std::string* note) {
  std::vector<std::string> candidates;
  if (const std::optional<StateFile> state = read_state_file(directory)) {
    const std::string latest = state->latest.empty() ? state->all.back() : state->latest;
    candidates.push_back(resolve(directory, latest));
  } else if (note != nullptr) {
    std::error_code ec;
    *note = fs::symlink_status(fs::path(directory) / kStateFileName, ec).type() !=
                    fs::file_type::not_found
                ? "its state file 'checkpoint' cannot be parsed"
                : "it has no state file 'checkpoint'";
  }
  const auto found = scan_checkpoints(directory);
  for (auto it = found.rbegin(); it != found.rend(); ++it) {
    const std::string path = resolve(directory, it->second);
    if (std::find(candidates.begin(), candidates.end(), path) == candidates.end())
      candidates.push_back(path);
  }
  return candidates;
}

}  // namespace detail

using detail::restore_candidates;

std::optional<std::string> latest_checkpoint(const std::string& directory) {
  return latest_checkpoint(directory, nullptr);
}

std::optional<std::string> latest_checkpoint(const std::string& directory,
                                             std::vector<std::string>* skipped) {
  for (const std::string& candidate : restore_candidates(directory, nullptr)) {
    const std::string why = verify_checkpoint(candidate);
    if (why.empty()) return candidate;
    if (skipped != nullptr) skipped->push_back(candidate + ": " + why);
  }
  return std::nullopt;
}

}  // namespace tandem
