#include "io/file_util.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <memory>
#include <mutex>
#include <sstream>
#include <string_view>
#include <system_error>
#include <utility>

#include "core/check.h"

namespace moecore::io {

// write_file_atomic's temporary: "<path>" + kTempInfix + "<pid>".
constexpr std::string_view kTempInfix = ".tmp.";

std::string errno_text(int err) {
  return std::generic_category().message(err);
}

namespace {

std::atomic<int64_t> g_write_failure_after{-1};

// Writes all of [data, data + n) to fd, retrying short writes and EINTR. Returns 0 or an errno.
int write_all(int fd, const std::byte* data, size_t n) {
  while (n > 0) {
    size_t chunk = n;
    const int64_t budget = g_write_failure_after.load();
    if (budget >= 0) {
      if (budget == 0) return ENOSPC;
      chunk = std::min(chunk, static_cast<size_t>(budget));
    }
    const ssize_t written = ::write(fd, data, chunk);
    if (written < 0) {
      if (errno == EINTR) continue;
      return errno;
    }
    if (written == 0) return EIO;  // Should not happen for regular files; avoid spinning.
    if (budget >= 0) g_write_failure_after.store(budget - written);
    data += written;
    n -= static_cast<size_t>(written);
  }
  return 0;
}

// ---- The files MappedFile has mapped, for the SIGBUS handler
//
// Slots claimed and freed under a mutex; the handler only reads them (atomics: a slot is
// published by its `begin`, written last). The path is a copy on the heap that lives as long as
// the mapping.
struct MappedRange {
  std::atomic<uintptr_t> begin{0};  // 0: a free slot
  std::atomic<size_t> size{0};
  std::atomic<const char*> path{nullptr};
};
constexpr size_t kMappedRangeSlots = 8192;
MappedRange g_mapped_ranges[kMappedRangeSlots];
std::mutex g_mapped_ranges_mutex;
struct sigaction g_previous_bus_action {};

void write_to_stderr(const char* text) {
  size_t left = std::strlen(text);
  while (left > 0) {
    const ssize_t written = ::write(STDERR_FILENO, text, left);
    if (written < 0 && errno == EINTR) continue;
    if (written <= 0) return;
    text += written;
    left -= static_cast<size_t>(written);
  }
}

// Async-signal-safe: reads the slots and writes with write(2).
void on_bus_error(int /*signal*/, siginfo_t* info, void* /*context*/) {
  const auto address = reinterpret_cast<uintptr_t>(info->si_addr);
  for (const MappedRange& range : g_mapped_ranges) {
    const uintptr_t begin = range.begin.load(std::memory_order_acquire);
    if (begin == 0 || address < begin || address - begin >= range.size.load()) continue;
    write_to_stderr("moecore: error: ");
    write_to_stderr(range.path.load());
    write_to_stderr(
        ": the file shrank while this process was reading it (truncated or rewritten in place "
        "by another program)\n");
    ::_exit(1);
  }
  // Not a mapped file's page: the previous action (a sanitizer's report, or the default crash)
  // takes the fault, raised again when this handler returns to the faulting instruction.
  ::sigaction(SIGBUS, &g_previous_bus_action, nullptr);
}

void install_bus_error_handler() {
  struct sigaction action {};
  action.sa_sigaction = on_bus_error;
  action.sa_flags = SA_SIGINFO;
  sigemptyset(&action.sa_mask);
  ::sigaction(SIGBUS, &action, &g_previous_bus_action);
}

void name_mapped_range(const void* addr, size_t size, const char* path) {
  static std::once_flag installed;
  std::call_once(installed, install_bus_error_handler);
  const std::lock_guard<std::mutex> lock(g_mapped_ranges_mutex);
  for (MappedRange& range : g_mapped_ranges) {
    if (range.begin.load() != 0) continue;
    range.size.store(size);
    range.path.store(path);
    range.begin.store(reinterpret_cast<uintptr_t>(addr), std::memory_order_release);
    return;
  }
}

void forget_mapped_range(const void* addr) {
  const std::lock_guard<std::mutex> lock(g_mapped_ranges_mutex);
  for (MappedRange& range : g_mapped_ranges)
    if (range.begin.load() == reinterpret_cast<uintptr_t>(addr)) {
      range.begin.store(0, std::memory_order_release);
      return;
    }
}

std::string parent_directory(const std::string& path) {
  const size_t slash = path.find_last_of('/');
  if (slash == std::string::npos) return ".";
  if (slash == 0) return "/";
  return path.substr(0, slash);
}

}  // namespace

// ---- MappedFile
// ----------------------------------------------------------------------------------

MappedFile MappedFile::open(const std::string& path, const char* tag) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  MOE_CHECK(fd >= 0, "{} {}: cannot open: {}", tag, path, errno_text(errno));
  struct stat st {};
  if (::fstat(fd, &st) != 0) {
    const int err = errno;
    ::close(fd);
    fail("{} {}: cannot stat: {}", tag, path, errno_text(err));
  }
  if (!S_ISREG(st.st_mode)) {
    ::close(fd);
    fail("{} {}: not a regular file", tag, path);
  }
  MappedFile file;
  file.size_ = static_cast<size_t>(st.st_size);
  if (file.size_ > 0) {
    void* addr = ::mmap(nullptr, file.size_, PROT_READ, MAP_PRIVATE, fd, 0);
    if (addr == MAP_FAILED) {
      const int err = errno;
      ::close(fd);
      fail("{} {}: cannot mmap {} bytes: {}", tag, path, file.size_, errno_text(err));
    }
    file.addr_ = addr;
    file.path_ = std::make_unique<char[]>(path.size() + 1);
    std::memcpy(file.path_.get(), path.c_str(), path.size() + 1);
    name_mapped_range(addr, file.size_, file.path_.get());
  }
  ::close(fd);  // The mapping keeps the file alive.
  return file;
}

MappedFile::MappedFile(MappedFile&& other) noexcept
    : addr_(std::exchange(other.addr_, nullptr)),
      size_(std::exchange(other.size_, 0)),
      path_(std::move(other.path_)) {}

MappedFile& MappedFile::operator=(MappedFile&& other) noexcept {
  if (this != &other) {
    unmap();
    addr_ = std::exchange(other.addr_, nullptr);
    size_ = std::exchange(other.size_, 0);
    path_ = std::move(other.path_);
  }
  return *this;
}

MappedFile::~MappedFile() {
  unmap();
}

void MappedFile::unmap() noexcept {
  if (addr_ == nullptr) return;
  forget_mapped_range(addr_);  // before the pages go: the handler never names a stale range
  ::munmap(addr_, size_);
  addr_ = nullptr;
}

// ---- Atomic write
// --------------------------------------------------------------------------------

void set_write_failure_for_testing(int64_t bytes) {
  g_write_failure_after.store(bytes);
}

void write_file_atomic(const std::string& path, std::span<const std::span<const std::byte>> chunks,
                       const char* tag) {
  write_file_atomic(
      path, chunks.size(), [&](size_t i) { return chunks[i]; }, tag);
}

void write_file_atomic(const std::string& path, size_t count,
                       const std::function<std::span<const std::byte>(size_t)>& chunk,
                       const char* tag) {
  // The rename would replace whatever `path` names: a device such as /dev/null (written to as
  // root), a FIFO, or a symbolic link, which would become a plain file while its target stayed
  // stale. Only a regular file (or nothing) is replaced.
  struct stat existing {};
  if (::lstat(path.c_str(), &existing) == 0 && !S_ISREG(existing.st_mode)) {
    fail("{} cannot write '{}': it exists and is {}; give the path of a regular file", tag, path,
         S_ISLNK(existing.st_mode)   ? "a symbolic link (name the file it points to)"
         : S_ISDIR(existing.st_mode) ? "a directory"
                                     : "not a regular file (a device, FIFO or socket)");
  }
  // Same directory as the target, so rename() is atomic; the pid keeps concurrent ranks apart.
  const std::string tmp = fmt::format("{}{}{}", path, kTempInfix, ::getpid());
  const int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  MOE_CHECK(fd >= 0, "{} cannot write '{}': cannot create '{}': {}", tag, path, tmp,
            errno_text(errno));

  int err = 0;
  const char* step = "write";
  try {
    for (size_t i = 0; i < count && err == 0; ++i) {
      const std::span<const std::byte> bytes = chunk(i);
      err = write_all(fd, bytes.data(), bytes.size());
    }
  } catch (...) {  // The chunk's producer failed: nothing of the new file stays.
    ::close(fd);
    ::unlink(tmp.c_str());
    throw;
  }
  if (err == 0 && ::fsync(fd) != 0) {
    err = errno;
    step = "fsync";
  }
  // close() can report deferred write errors (NFS), so its result counts too.
  if (::close(fd) != 0 && err == 0) {
    err = errno;
    step = "close";
  }
  if (err == 0 && ::rename(tmp.c_str(), path.c_str()) != 0) {
    err = errno;
    step = "rename";
  }
  if (err != 0) {
    ::unlink(tmp.c_str());
    fail("{} cannot write '{}': {} failed: {}", tag, path, step, errno_text(err));
  }

  // Persist the rename itself. Some filesystems cannot fsync directories (EINVAL); that is no
  // error.
  const std::string dir = parent_directory(path);
  const int dir_fd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  MOE_CHECK(dir_fd >= 0, "{} wrote '{}' but cannot open its directory to fsync: {}", tag, path,
            errno_text(errno));
  const bool synced = ::fsync(dir_fd) == 0 || errno == EINVAL;
  const int sync_err = errno;
  ::close(dir_fd);
  MOE_CHECK(synced, "{} wrote '{}' but fsync of directory '{}' failed: {}", tag, path, dir,
            errno_text(sync_err));
}

// ---- Reader
// --------------------------------------------------------------------------------------

void remove_atomic_write_leftovers(const std::string& dir,
                                   const std::function<bool(const std::string&)>& ours) {
  namespace fs = std::filesystem;
  std::error_code ec;
  for (const auto& entry : fs::directory_iterator(dir, ec)) {
    const std::string name = entry.path().filename().string();
    const size_t tmp = name.rfind(kTempInfix);
    std::error_code type_ec;
    if (tmp == std::string::npos || tmp + kTempInfix.size() == name.size() ||
        !entry.is_regular_file(type_ec) || entry.is_symlink(type_ec))
      continue;
    const std::string pid = name.substr(tmp + kTempInfix.size());
    if (pid.find_first_not_of("0123456789") == std::string::npos && ours(name.substr(0, tmp)))
      fs::remove(entry.path(), type_ec);
  }
}

void write_text_atomic(const std::string& path, const std::string& text, const char* tag) {
  const std::span<const std::byte> bytes(reinterpret_cast<const std::byte*>(text.data()),
                                         text.size());
  const std::span<const std::byte> chunks[] = {bytes};
  write_file_atomic(path, chunks, tag);
}

std::string read_text(const std::string& path, const char* tag) {
  std::ifstream in(path, std::ios::binary);
  MOE_CHECK(in.good(), "{} cannot read '{}'", tag, path);
  std::stringstream text;
  text << in.rdbuf();
  return text.str();
}

}  // namespace moecore::io
