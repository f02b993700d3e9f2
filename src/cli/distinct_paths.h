// A command's output written over one of its own inputs destroys it: the atomic writer renames its
// temporary over whatever the output names (`tokenizer train --input c.txt --out c.txt`, `init
// --config c.toml --out c.toml`). And two outputs at one path keep only one of them (`mx quantize
// --codes a.npy --scales a.npy`). Both are refused before anything is read or written.
#pragma once

#include <initializer_list>
#include <string>
#include <vector>

namespace moecore::cli {

// A path a command was given, with the option that named it ("--out"); an empty path (an
// option not given) is skipped.
struct NamedPath {
  const char* option;
  std::string path;
};

// Throws a one-line moecore::Error when an output names the same file as an input (the same file
// on disk, through any link or spelling; an input directory counts with the files directly in
// it), or two outputs the same path.
void check_outputs_apart(const std::vector<NamedPath>& inputs,
                         const std::vector<NamedPath>& outputs);

}  // namespace moecore::cli
