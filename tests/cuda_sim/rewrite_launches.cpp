// cudasim's source rewrite: a kernel file (*.cu) as host C++ for the emulation (cuda_runtime.h
// says what cudasim is). The two constructs of CUDA C++ that are not C++ become calls:
//     name<targs><<<grid, block, shared, stream>>>(arguments)
//         -> ::cudasim::Launch("name<targs>", grid, block, shared, stream)(name<targs>)(arguments)
//     extern __shared__ T name[];
//         -> T* const name = ::cudasim::dynamic_shared<T>();
//     __shared__ T a[n], b;   (a declaration that begins its line)
//         -> the same, then ::cudasim::declare_shared(&a, sizeof(a), "a"); and so for b: the
//            block's first thread to get there fills it with the device's garbage, and its
//            bytes count against the block's shared memory limit
// Everything else is copied as it is, with a #line directive so that the compiler's messages and
// the emulator's name the .cu file and its lines.
//
// Usage: cudasim_rewrite_launches IN.cu OUT.cpp (exit 1, one line on stderr, on anything it cannot
// rewrite: a launch without its kernel's name or its closing >>>).
#include <cctype>
#include <cstdio>
#include <fstream>
#include <iostream>
#include <sstream>
#include <string>
#include <vector>

namespace {

bool is_name_char(char c) {
  return std::isalnum(static_cast<unsigned char>(c)) != 0 || c == '_' || c == ':';
}

[[noreturn]] void fail(const std::string& file, const std::string& why) {
  std::cerr << "cudasim_rewrite_launches: " << file << ": " << why << "\n";
  std::exit(1);
}

// The start of the kernel's name (with its template arguments) that ends just before `end`.
size_t name_start(const std::string& s, size_t end, const std::string& file) {
  size_t i = end;
  while (i > 0 && std::isspace(static_cast<unsigned char>(s[i - 1])) != 0) --i;
  if (i > 0 && s[i - 1] == '>') {  // template arguments: back to the matching '<'
    int depth = 0;
    do {
      --i;
      if (s[i] == '>') ++depth;
      if (s[i] == '<') --depth;
    } while (i > 0 && depth > 0);
    if (depth != 0) fail(file, "unbalanced template arguments before <<<");
  }
  const size_t name_end = i;
  while (i > 0 && is_name_char(s[i - 1])) --i;
  if (i == name_end) fail(file, "a <<< launch without a kernel name");
  return i;
}

std::string trim(const std::string& s) {
  const size_t b = s.find_first_not_of(" \t\n");
  const size_t e = s.find_last_not_of(" \t\n");
  return b == std::string::npos ? std::string() : s.substr(b, e - b + 1);
}

// Newlines kept, so that the lines after a rewritten launch keep their numbers.
std::string newlines_of(const std::string& s) {
  std::string out;
  for (const char c : s)
    if (c == '\n') out += '\n';
  return out;
}

std::string one_line(const std::string& s) {
  std::string out;
  for (const char c : s) out += c == '\n' ? ' ' : c;
  return out;
}

std::string rewrite_launches(const std::string& s, const std::string& file) {
  std::string out;
  size_t copied = 0;
  for (size_t open = s.find("<<<"); open != std::string::npos; open = s.find("<<<", open + 3)) {
    const size_t close = s.find(">>>", open);
    if (close == std::string::npos) fail(file, "a <<< launch without its >>>");
    size_t paren = close + 3;
    while (paren < s.size() && std::isspace(static_cast<unsigned char>(s[paren])) != 0) ++paren;
    if (paren >= s.size() || s[paren] != '(') fail(file, "a launch's >>> not followed by (");
    const size_t start = name_start(s, open, file);
    const std::string name = trim(s.substr(start, open - start));
    const std::string config = s.substr(open + 3, close - open - 3);
    out += s.substr(copied, start - copied);
    out += "::cudasim::Launch(\"" + one_line(name) + "\", " + one_line(config) + ")(" +
           one_line(name) + ")(";
    out += newlines_of(s.substr(start, paren + 1 - start));
    copied = paren + 1;
    open = paren;
  }
  out += s.substr(copied);
  return out;
}

std::string rewrite_dynamic_shared(const std::string& s, const std::string& file) {
  const std::string marker = "extern __shared__ ";
  std::string out;
  size_t copied = 0;
  for (size_t at = s.find(marker); at != std::string::npos; at = s.find(marker, at + 1)) {
    const size_t semicolon = s.find(';', at);
    const std::string declaration = s.substr(at + marker.size(), semicolon - at - marker.size());
    const size_t bracket = declaration.find("[]");
    if (semicolon == std::string::npos || bracket == std::string::npos)
      fail(file, "an extern __shared__ declaration that is not `T name[];`");
    const std::string head = trim(declaration.substr(0, bracket));
    const size_t space = head.find_last_of(" \t");
    if (space == std::string::npos) fail(file, "an extern __shared__ declaration without a type");
    const std::string type = trim(head.substr(0, space)), name = trim(head.substr(space + 1));
    out += s.substr(copied, at - copied);
    out += type + "* const " + name + " = ::cudasim::dynamic_shared<" + type + ">();";
    copied = semicolon + 1;
  }
  out += s.substr(copied);
  return out;
}

// The names a declaration's text after `__shared__` declares: the last identifier before the
// first declarator's brackets (its type comes first), then the first identifier of each other
// declarator, the declarators split at commas outside brackets and parentheses.
std::vector<std::string> declared_names(const std::string& declaration) {
  std::vector<std::string> parts(1);
  int depth = 0;
  for (const char c : declaration) {
    if (c == '(' || c == '[') ++depth;
    if (c == ')' || c == ']') --depth;
    if (c == ',' && depth == 0) {
      parts.emplace_back();
    } else {
      parts.back() += c;
    }
  }
  std::vector<std::string> names;
  for (size_t i = 0; i < parts.size(); ++i) {
    const std::string head = parts[i].substr(0, parts[i].find('['));
    std::vector<std::string> identifiers;
    std::string current;
    for (const char c : head + " ") {
      if (std::isalnum(static_cast<unsigned char>(c)) != 0 || c == '_') {
        current += c;
      } else if (!current.empty()) {
        identifiers.push_back(current);
        current.clear();
      }
    }
    if (!identifiers.empty()) names.push_back(i == 0 ? identifiers.back() : identifiers.front());
  }
  return names;
}

std::string declare_static_shared(const std::string& s, const std::string& file) {
  const std::string marker = "__shared__ ";
  std::string out;
  size_t copied = 0;
  for (size_t at = s.find(marker); at != std::string::npos; at = s.find(marker, at + 1)) {
    const size_t line_start = s.rfind('\n', at) + 1;             // 0 when npos
    if (s.find_first_not_of(" \t", line_start) != at) continue;  // not a declaration's start
    const size_t semicolon = s.find(';', at);
    if (semicolon == std::string::npos) fail(file, "a __shared__ declaration without its ;");
    const std::vector<std::string> names =
        declared_names(s.substr(at + marker.size(), semicolon - at - marker.size()));
    if (names.empty()) fail(file, "a __shared__ declaration without a name");
    out += s.substr(copied, semicolon + 1 - copied);
    for (const std::string& name : names)
      out += " ::cudasim::declare_shared(&" + name + ", sizeof(" + name + "), \"" + name + "\");";
    copied = semicolon + 1;
  }
  out += s.substr(copied);
  return out;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 3) {
    std::cerr << "usage: cudasim_rewrite_launches IN.cu OUT.cpp\n";
    return 2;
  }
  const std::string in = argv[1], out_path = argv[2];
  std::ifstream input(in, std::ios::binary);
  if (!input) fail(in, "cannot read it");
  std::ostringstream text;
  text << input.rdbuf();
  const std::string rewritten =
      rewrite_launches(declare_static_shared(rewrite_dynamic_shared(text.str(), in), in), in);
  std::ofstream output(out_path, std::ios::binary | std::ios::trunc);
  // nvcc includes cuda_runtime.h before a .cu file's first line; so does this.
  output << "#include <cuda_runtime.h>\n#line 1 \"" << in << "\"\n" << rewritten;
  if (!output.flush()) fail(out_path, "cannot write it");
  return 0;
}
