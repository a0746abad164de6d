// Variable-length string attributes, read in a forked child process (io/internal/hdf5_check.h:
// read_vlen_strings): the first read of a file walks it once in a child and keeps every such
// attribute's strings; a read the walk could not serve runs alone in a child.
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <map>
#include <mutex>

#include "tandem/io/internal/hdf5_check.h"

// Set by a sanitizer runtime when there is one (weak: null otherwise).
extern "C" void __sanitizer_set_death_callback(void (*callback)(void)) __attribute__((weak));

namespace tandem::h5::detail {

namespace {

/// Seconds one child may take: TANDEM_HDF5_READ_TIMEOUT, default 10 (the fuzzers use 1: a
/// damaged file that makes libhdf5 loop would otherwise cost each of them 10 s).
int child_seconds() {
  static const int seconds = [] {
    const char* value = std::getenv("TANDEM_HDF5_READ_TIMEOUT");
    const int parsed = value ? std::atoi(value) : 0;
    return parsed > 0 ? parsed : 10;
  }();
  return seconds;
}
constexpr size_t kMaxReply = size_t{64} << 20;  // strings of one file
constexpr size_t kMaxObjects = 1'000'000;       // objects one walk visits
constexpr size_t kFilesKept = 16;

bool write_fully(int fd, const char* data, size_t bytes) {
  while (bytes > 0) {
    const ssize_t n = ::write(fd, data, bytes);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return false;
    data += n;
    bytes -= static_cast<size_t>(n);
  }
  return true;
}

template <typename T>
void put(std::string& out, T value) {
  out.append(reinterpret_cast<const char*>(&value), sizeof(value));
}

/// Appends {count: u64, then per string its length: u64 and bytes} for `texts`.
void put_strings(std::string& out, const std::vector<char*>& texts) {
  put<uint64_t>(out, texts.size());
  for (const char* t : texts) {
    const uint64_t length = t ? std::strlen(t) : 0;
    put(out, length);
    if (length > 0) out.append(t, length);
  }
}

/// Reads strings put_strings wrote at `at`; false when the bytes run short.
bool take_strings(const std::string& in, size_t& at, std::vector<std::string>& out) {
  uint64_t count = 0;
  if (at + sizeof(count) > in.size()) return false;
  std::memcpy(&count, in.data() + at, sizeof(count));
  at += sizeof(count);
  if (count > in.size()) return false;
  out.clear();
  for (uint64_t i = 0; i < count; ++i) {
    uint64_t length = 0;
    if (at + sizeof(length) > in.size()) return false;
    std::memcpy(&length, in.data() + at, sizeof(length));
    at += sizeof(length);
    if (length > in.size() - at) return false;
    out.emplace_back(in.data() + at, length);
    at += length;
  }
  return true;
}

/// Reads the strings of attribute `attr` as `memtype` into `out` (the child's side).
bool read_into(hid_t attr, hid_t memtype, size_t count, std::string& out) {
  std::vector<char*> texts(count, nullptr);
  if (H5Aread(attr, memtype, texts.data()) < 0) return false;
  put_strings(out, texts);
  return true;
}

/// Runs `body` in a forked child that sends back what it returns (a letter and data; "E" and a
/// message for an error); here, the reply, or an error naming `where` when the child reported
/// one, failed, crashed or did not end within child_seconds().
std::string in_child(const std::function<std::string()>& body, const std::string& where) {
  int fds[2];
  TANDEM_CHECK(::pipe2(fds, O_CLOEXEC) == 0, where, ": pipe: ", std::strerror(errno));
  const pid_t pid = ::fork();
  if (pid < 0) {
    const int error = errno;
    ::close(fds[0]);
    ::close(fds[1]);
    TANDEM_THROW(where, ": fork: ", std::strerror(error));
  }
  if (pid == 0) {
    // The child: libhdf5 only, then _exit (no destructors, no atexit handlers). Its stderr goes
    // nowhere: a sanitizer's report of a libhdf5 failure is this read's error, said below.
    ::close(fds[0]);
    const int null = ::open("/dev/null", O_WRONLY);
    if (null >= 0) ::dup2(null, 2);
    // A death callback inherited from a sanitized parent (a fuzzer's, which would save the
    // input as a crash of its own) is dropped: a failure here is this read's error, said there.
    if (__sanitizer_set_death_callback != nullptr) __sanitizer_set_death_callback(nullptr);
    const std::string reply = body();
    ::_exit(write_fully(fds[1], reply.data(), reply.size()) ? 0 : 1);
  }
  ::close(fds[1]);
  using Clock = std::chrono::steady_clock;
  const int seconds = child_seconds();
  const auto deadline = Clock::now() + std::chrono::seconds(seconds);
  std::string reply;
  bool timed_out = false;
  for (;;) {
    const auto left =
        std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now()).count();
    if (left <= 0) {
      timed_out = true;
      break;
    }
    pollfd p{fds[0], POLLIN, 0};
    const int ready = ::poll(&p, 1, static_cast<int>(std::min<int64_t>(left, 1000)));
    if (ready <= 0) continue;
    char chunk[65536];
    const ssize_t n = ::read(fds[0], chunk, sizeof(chunk));
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) break;  // the child closed its end (it exited)
    reply.append(chunk, static_cast<size_t>(n));
  }
  ::close(fds[0]);
  if (timed_out) ::kill(pid, SIGKILL);
  int status = 0;
  while (::waitpid(pid, &status, 0) < 0 && errno == EINTR) {
  }
  TANDEM_CHECK(!timed_out, where, ": reading its variable-length strings did not end within ",
               seconds,
               " s: libhdf5 loops on this file (it is damaged), or another thread of this "
               "process was inside libhdf5 when the read began (read the file again)");
  TANDEM_CHECK(!WIFSIGNALED(status), where,
               ": reading its variable-length strings crashed libhdf5 (signal ",
               WIFSIGNALED(status) ? WTERMSIG(status) : 0, "); the file is damaged");
  TANDEM_CHECK(WIFEXITED(status) && !reply.empty(), where,
               ": reading its variable-length strings failed in libhdf5 (exit status ",
               WIFEXITED(status) ? WEXITSTATUS(status) : -1, "); the file is damaged");
  TANDEM_CHECK(reply[0] != 'E', where, ": reading its variable-length strings: ", reply.substr(1));
  return reply;
}

/// The walk in the child: every object reached by hard links from the root, every attribute
/// of each that holds variable-length strings, as {key length: u32, key (object id, '\0',
/// attribute name), strings}.
struct Walk {
  std::string out;
  size_t objects = 0;
  std::string current;  // the object id being visited
  bool overflow = false;
};

herr_t visit_attribute(hid_t object, const char* name, const H5A_info_t*, void* data) {
  Walk& walk = *static_cast<Walk*>(data);
  const hid_t attr = H5Aopen(object, name, H5P_DEFAULT);
  if (attr < 0) return -1;
  const hid_t type = H5Aget_type(attr);
  const hid_t space = H5Aget_space(attr);
  herr_t status = 0;
  if (type >= 0 && space >= 0 && H5Tget_class(type) == H5T_STRING && H5Tis_variable_str(type) > 0) {
    const hssize_t n = H5Sget_simple_extent_npoints(space);
    if (n > 0) {
      const hid_t memtype = H5Tcopy(H5T_C_S1);
      H5Tset_size(memtype, H5T_VARIABLE);
      H5Tset_cset(memtype, H5Tget_cset(type));
      const std::string key = walk.current + '\0' + name;
      std::string entry;
      put(entry, static_cast<uint32_t>(key.size()));
      entry += key;
      if (read_into(attr, memtype, static_cast<size_t>(n), entry)) {
        walk.out += entry;
      } else {
        status = -1;
      }
      H5Tclose(memtype);
    }
  }
  if (space >= 0) H5Sclose(space);
  if (type >= 0) H5Tclose(type);
  H5Aclose(attr);
  if (walk.out.size() > kMaxReply) {
    walk.overflow = true;
    return 1;
  }
  return status;
}

#if H5_VERSION_GE(1, 12, 0)
herr_t visit_object(hid_t root, const char* name, const H5O_info2_t* info, void* data) {
  Walk& walk = *static_cast<Walk*>(data);
  char* text = nullptr;
  if (H5Otoken_to_str(root, &info->token, &text) < 0) return -1;
  walk.current = text ? text : "";
  H5free_memory(text);
#else
herr_t visit_object(hid_t root, const char* name, const H5O_info_t* info, void* data) {
  Walk& walk = *static_cast<Walk*>(data);
  walk.current = std::to_string(info->addr);
#endif
  if (++walk.objects > kMaxObjects) {
    walk.overflow = true;
    return 1;
  }
  hsize_t index = 0;
  const herr_t status = H5Aiterate_by_name(root, name, H5_INDEX_NAME, H5_ITER_INC, &index,
                                           visit_attribute, &walk, H5P_DEFAULT);
  return status < 0 ? -1 : (walk.overflow ? 1 : 0);
}

struct Scanned {
  bool complete = false;  // every variable-length attribute of the file is in `strings`
  std::map<std::string, std::vector<std::string>> strings;
};

std::mutex& cache_mutex() {
  static std::mutex mutex;
  return mutex;
}

std::map<std::string, Scanned>& cache() {
  static std::map<std::string, Scanned> files;
  return files;
}

std::string version_of(const std::string& path) {
  struct stat info {};
  if (::stat(path.c_str(), &info) != 0) return "";
  return ::tandem::detail::str_cat(path, "|", info.st_dev, ":", info.st_ino, "|", info.st_size, "|",
                                   info.st_mtim.tv_sec, ".", info.st_mtim.tv_nsec);
}

}  // namespace

std::vector<std::string> read_vlen_strings(hid_t attr, hid_t memtype, size_t count,
                                           const std::string& file, const std::string& object,
                                           const std::string& name, const std::string& where) {
  const std::string version = version_of(file);
  const std::string key = object + '\0' + name;
  std::lock_guard<std::mutex> lock(cache_mutex());
  auto found = cache().find(version);
  if (found == cache().end() && !version.empty()) {
    // The first read of this file: one child reads every such attribute of it.
    const hid_t file_id = H5Iget_file_id(attr);
    std::string reply;
    try {
      reply = in_child(
          [&] {
            Walk walk;
#if H5_VERSION_GE(1, 12, 0)
            const herr_t status =
                H5Ovisit3(file_id, H5_INDEX_NAME, H5_ITER_INC, visit_object, &walk, H5O_INFO_BASIC);
#else
            const herr_t status =
                H5Ovisit2(file_id, H5_INDEX_NAME, H5_ITER_INC, visit_object, &walk, H5O_INFO_BASIC);
#endif
            std::string out(1, status < 0 ? 'E' : walk.overflow ? 'P' : 'C');
            out += status < 0 ? hdf5_message() : walk.out;
            return out;
          },
          where);
    } catch (...) {
      if (file_id >= 0) H5Fclose(file_id);
      throw;
    }
    if (file_id >= 0) H5Fclose(file_id);
    Scanned scanned;
    scanned.complete = !reply.empty() && reply[0] == 'C';
    size_t at = 1;
    while (at + sizeof(uint32_t) <= reply.size()) {
      uint32_t length = 0;
      std::memcpy(&length, reply.data() + at, sizeof(length));
      at += sizeof(length);
      if (length > reply.size() - at) break;
      const std::string entry_key = reply.substr(at, length);
      at += length;
      std::vector<std::string> strings;
      if (!take_strings(reply, at, strings)) break;
      scanned.strings.emplace(entry_key, std::move(strings));
    }
    if (cache().size() >= kFilesKept) cache().erase(cache().begin());
    found = cache().emplace(version, std::move(scanned)).first;
  }
  if (found != cache().end()) {
    auto entry = found->second.strings.find(key);
    if (entry != found->second.strings.end()) {
      TANDEM_CHECK(entry->second.size() == count, where, ": ", entry->second.size(),
                   " strings where its dataspace declares ", count);
      return entry->second;
    }
  }
  // Not in the walk (a file too large to walk whole, or an object the walk did not reach): this
  // attribute alone, in a child of its own.
  const std::string reply = in_child(
      [&] {
        std::string out(1, 'O');
        if (read_into(attr, memtype, count, out)) return out;
        out.assign(1, 'E');
        out += hdf5_message();
        return out;
      },
      where);
  std::vector<std::string> strings;
  size_t at = 1;
  TANDEM_CHECK(take_strings(reply, at, strings) && strings.size() == count, where,
               ": its strings came back cut short");
  return strings;
}

void forget_vlen_strings(const std::string& file) {
  const std::string prefix = file + "|";
  std::lock_guard<std::mutex> lock(cache_mutex());
  for (auto entry = cache().lower_bound(prefix);
       entry != cache().end() && entry->first.compare(0, prefix.size(), prefix) == 0;) {
    entry = cache().erase(entry);
  }
}

}  // namespace tandem::h5::detail
