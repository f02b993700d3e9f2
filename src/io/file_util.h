// File plumbing shared by every reader and writer of moecore: read-only memory maps, and atomic
// writes (temporary file, fsync, rename, fsync of the directory) so that a crash or a full disk
// never leaves a half-written file where a good one was.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <string>

namespace moecore::io {

// The system's text for an errno value (std::generic_category: thread-safe, unlike strerror).
std::string errno_text(int err);

// Read-only memory map of a whole file. Move-only; unmaps on destruction. `tag` ("[npy]") prefixes
// the error thrown when the file cannot be opened or mapped. A file that another program truncates
// while it is mapped makes the next read past its new end raise SIGBUS: while any file is mapped,
// a handler names it in one line on stderr and ends the process with status 1 (the job's other
// ranks are then ended by mpirun) instead of a bare "Bus error".
class MappedFile {
 public:
  static MappedFile open(const std::string& path, const char* tag);

  MappedFile() = default;
  MappedFile(MappedFile&& other) noexcept;
  MappedFile& operator=(MappedFile&& other) noexcept;
  MappedFile(const MappedFile&) = delete;
  MappedFile& operator=(const MappedFile&) = delete;
  ~MappedFile();

  const std::byte* data() const { return static_cast<const std::byte*>(addr_); }
  size_t size() const { return size_; }

 private:
  void unmap() noexcept;

  void* addr_ = nullptr;  // nullptr for an empty file: mmap cannot map zero bytes.
  size_t size_ = 0;
  std::unique_ptr<char[]> path_;  // for the SIGBUS handler, at a fixed address while mapped
};

// Writes the concatenated chunks to `path` so that readers see either the old file or the complete
// new one: write `path.tmp.<pid>`, fsync, rename over `path`, fsync the directory. On failure the
// temporary is removed, `path` is untouched, and a one-line moecore::Error names path and strerror.
void write_file_atomic(const std::string& path, std::span<const std::span<const std::byte>> chunks,
                       const char* tag);

// The same for a file produced in `count` chunks: chunk(i) is called once for each i in order and
// its bytes need stay valid only until the next call, so a writer can stage one chunk at a time in
// a reused buffer instead of holding the whole file. An exception from chunk removes the
// temporary and propagates.
void write_file_atomic(const std::string& path, size_t count,
                       const std::function<std::span<const std::byte>(size_t)>& chunk,
                       const char* tag);

// Removes from `dir` the temporaries that write_file_atomic leaves when its process dies before
// the rename ("<name>.tmp.<pid>", regular files), for the names `ours` accepts (a caller names
// only files it writes: never anything else). For the owner of `dir` (a run's lock), in which no
// other writer is live.
void remove_atomic_write_leftovers(const std::string& dir,
                                   const std::function<bool(const std::string&)>& ours);

// write_file_atomic of one string (config.toml, config.json, profile.json, ...).
void write_text_atomic(const std::string& path, const std::string& text, const char* tag);

// The whole file as a string; a missing or unreadable file is a one-line error naming it.
std::string read_text(const std::string& path, const char* tag);

// Test hook: after `bytes` more bytes, write_file_atomic's writes fail with ENOSPC (disk full),
// which root cannot otherwise provoke with permissions. A negative value disables the fault.
void set_write_failure_for_testing(int64_t bytes);

}  // namespace moecore::io
