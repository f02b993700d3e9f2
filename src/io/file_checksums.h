// Checksums of a directory's files, for directories written once and trusted later (checkpoints):
// a manifest names every other regular file with its size and CRC-32C (io/crc32c.h), so that a
// file changed after it was written (a failing disk, a bit flipped in a copy, an edit) is found
// before anything reads a value from it. Parsers catch damage to a file's structure; only a
// checksum catches a changed value inside a tensor. Files are read with pread, not mapped: a read
// error of a failing disk is then an error naming the file, not a SIGBUS.
//   {"algorithm": "crc32c", "files": {"config.json": {"bytes": 1234, "crc32c": "e3069283"}, ...}}
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

namespace moecore::io {

// The manifest entries of the named files of dir: {"name": {"bytes": N, "crc32c": "hex"}, ...},
// each file read back whole. `tag` ("[checkpoint]") prefixes errors.
nlohmann::json checksum_entries(const std::string& dir, const std::vector<std::string>& names,
                                const char* tag);

// Writes <dir>/<manifest> (write_text_atomic) over every regular file of dir but the manifest.
// `known` holds entries computed earlier (checksum_entries of the processes that wrote those
// files, in parallel); a file listed there of the same size is not read again.
void write_checksums(const std::string& dir, const std::string& manifest, const char* tag,
                     const nlohmann::json& known = nlohmann::json::object());

// Checks every file <dir>/<manifest> lists: present, of its size, with its CRC-32C; the first that
// is not is a one-line error naming the file, as is a manifest that does not parse. Returns false
// (nothing checked) when dir has no manifest: a directory written before manifests existed.
// Files the manifest does not list are not looked at. Processes that share the reading pass their
// share (`share_index` of `share_count`): each reads the files at its positions of the manifest's
// (sorted) list, i % share_count == share_index, and checks the presence and size of every one.
bool verify_checksums(const std::string& dir, const std::string& manifest, const char* tag,
                      int64_t share_index = 0, int64_t share_count = 1);

}  // namespace moecore::io
