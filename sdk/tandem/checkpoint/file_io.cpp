// POSIX file steps of the checkpoint write protocol: fsync, rename, private temporary files,
// atomic text-file replacement and the save-point test hook.
#include "tandem/checkpoint/internal/file_io.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <mutex>
#include <random>

#include "tandem/core/error.h"

namespace tandem::detail {

namespace {

std::string errno_text() { return std::strerror(errno); }

std::mutex& hook_mutex() {
  static std::mutex mutex;
  return mutex;
}

SavePointHook& hook_slot() {
  static SavePointHook hook;
  return hook;
}

}  // namespace

std::string temp_path_for(const std::string& path, int attempt) {
  std::string name = path + ".tmp." + std::to_string(::getpid());
  if (attempt == 0) return name;
  static std::mutex mutex;
  static std::random_device device;
  uint64_t suffix = 0;
  {
    std::lock_guard<std::mutex> lock(mutex);
    suffix = (uint64_t{device()} << 32) ^ device();
  }
  char hex[17];
  std::snprintf(hex, sizeof hex, "%016llx", static_cast<unsigned long long>(suffix));
  return name + "." + hex;
}

std::string unused_temp_path_for(const std::string& path) {
  for (int attempt = 0; attempt < kTempAttempts; ++attempt) {
    const std::string name = temp_path_for(path, attempt);
    // lstat: a symbolic link is seen, not followed. Any failure but "exists" (a missing or
    // unwritable directory) is left for the exclusive create to report.
    struct stat info {};
    if (::lstat(name.c_str(), &info) != 0) return name;
  }
  TANDEM_THROW("cannot find a free temporary name beside ", path, ": ", kTempAttempts, " names (",
               temp_path_for(path), " and random ones) exist already");
}

TempFile create_temp_beside(const std::string& path, mode_t mode) {
  for (int attempt = 0; attempt < kTempAttempts; ++attempt) {
    TempFile file{.fd = -1, .path = temp_path_for(path, attempt)};
    // O_EXCL: a name that exists in any form (a file, a symbolic link, even a dangling one,
    // a FIFO) fails with EEXIST without being opened, so nothing is followed or blocks.
    file.fd = ::open(file.path.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, mode);
    if (file.fd >= 0) return file;
    TANDEM_CHECK(errno == EEXIST, file.path, ": cannot create a temporary file: ", errno_text());
  }
  TANDEM_THROW("cannot create a temporary file beside ", path, ": ", kTempAttempts, " names (",
               temp_path_for(path), " and random ones) exist already");
}

void write_all(int fd, const char* data, size_t size, const std::string& path) {
  size_t written = 0;
  while (written < size) {
    const ssize_t n = ::write(fd, data + written, size - written);
    if (n < 0 && errno == EINTR) continue;
    TANDEM_CHECK(n > 0, path, ": write failed: ", n < 0 ? errno_text() : "nothing written");
    written += static_cast<size_t>(n);
  }
}

bool is_temp_name(std::string_view file_name) {
  const bool ours = file_name.starts_with("ckpt-") || file_name.starts_with("checkpoint");
  return ours && file_name.find(".tmp.") != std::string_view::npos;
}

void fsync_file(const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  TANDEM_CHECK(fd >= 0, path, ": cannot open to fsync: ", errno_text());
  const int result = ::fsync(fd);
  const std::string why = result == 0 ? std::string() : errno_text();
  ::close(fd);
  TANDEM_CHECK(result == 0, path, ": fsync failed: ", why);
}

void fsync_directory(const std::string& directory) {
  const std::string dir = directory.empty() ? std::string(".") : directory;
  const int fd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  TANDEM_CHECK(fd >= 0, dir, ": cannot open the directory to fsync: ", errno_text());
  const int result = ::fsync(fd);
  const int error = result == 0 ? 0 : errno;
  ::close(fd);
  // Some file systems (and sandboxes) refuse fsync on directories; that only weakens
  // durability against power loss, never atomicity, so EINVAL is accepted.
  TANDEM_CHECK(result == 0 || error == EINVAL, dir,
               ": fsync of the directory failed: ", std::strerror(error));
}

void rename_file(const std::string& from, const std::string& to) {
  TANDEM_CHECK(std::rename(from.c_str(), to.c_str()) == 0, "cannot rename ", from, " to ", to, ": ",
               errno_text());
}

void write_file_atomically(const std::string& path, const std::string& contents) {
  // 0644 (less the umask): the temporary becomes the published file, readable as before.
  const auto [fd, temp] = create_temp_beside(path, 0644);
  try {
    write_all(fd, contents.data(), contents.size(), temp);
  } catch (...) {
    ::close(fd);
    ::unlink(temp.c_str());
    throw;
  }
  // The data must be on disk before the rename publishes it: otherwise a power loss can leave
  // the new name pointing at an empty file (delayed allocation on ext4/xfs).
  const int synced = ::fsync(fd);
  const std::string why = synced == 0 ? std::string() : errno_text();
  ::close(fd);
  if (synced != 0) {
    ::unlink(temp.c_str());
    TANDEM_THROW(temp, ": fsync failed: ", why);
  }
  try {
    rename_file(temp, path);
  } catch (...) {
    ::unlink(temp.c_str());
    throw;
  }
  // The rename itself is a change of the directory; fsync it so the new name survives a crash.
  fsync_directory(std::filesystem::path(path).parent_path().string());
}

SavePointHook set_checkpoint_save_hook(SavePointHook hook) {
  std::lock_guard<std::mutex> lock(hook_mutex());
  SavePointHook previous = std::move(hook_slot());
  hook_slot() = std::move(hook);
  return previous;
}

void checkpoint_save_point(std::string_view point) {
  SavePointHook hook;
  {
    std::lock_guard<std::mutex> lock(hook_mutex());
    hook = hook_slot();
  }
  if (hook) hook(point);
}

}  // namespace tandem::detail
