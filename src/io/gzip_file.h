// Reading a whole file that may be gzip-compressed (oe-eval's requests.jsonl.gz): ISA-L's igzip
// inflates it, every member of a multi-member stream in turn (as Python's gzip module reads them),
// with each member's CRC-32 and length checked.
#pragma once

#include <string>

namespace moecore::io {

// The file's bytes, inflated when they start with the gzip magic (1f 8b), else as they are. A
// file that cannot be read, a corrupt or truncated stream, a bad checksum: a one-line
// moecore::Error prefixed with `tag` and naming `path`.
std::string read_maybe_gzip_file(const std::string& path, const char* tag);

}  // namespace moecore::io
