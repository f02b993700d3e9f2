#!/usr/bin/env bash
# FuzzReaders.SourcesLinkAlone: the fuzz preset compiles only the readers' sources
# (MOECORE_FUZZ_READER_SOURCES in CMakeLists.txt) and links its targets against them alone, but no
# `make test` builds that preset (it needs clang): a reader that starts calling code outside the
# list breaks `make fuzz` and nothing else. This check reads the normal build's objects instead:
# those of the listed sources plus harness_link.cpp's (what the targets call) must define every
# moecore symbol they use. The symbols a linker would miss are printed, demangled, with the
# objects that need them. Only moecore's own symbols are checked: a listed source that starts
# calling another library (ISA-L, oneDNN, MPI) needs that library in the fuzz targets' link line
# too, which this check does not see.
# Usage: check_sources_link.sh SOURCES_FILE OBJECTS_FILE (one path per line; OBJECTS_FILE holds
# every object of the libraries the sources are in, and harness_link.cpp's).
set -euo pipefail
sources_file=$1
objects_file=$2

chosen=()
while IFS= read -r source; do
  [[ -z $source ]] && continue
  match=$(grep -F -- "/$source.o" "$objects_file" || true)
  if [[ -z $match ]]; then
    echo "check_sources_link: no object of $source in the build (renamed or moved?)" >&2
    exit 1
  fi
  chosen+=("$match")
done < "$sources_file"
harness=$(grep -F -- "harness_link.cpp.o" "$objects_file" || true)
if [[ -z $harness ]]; then
  echo "check_sources_link: no object of tests/fuzz/harness_link.cpp in $objects_file" >&2
  exit 1
fi
chosen+=("$harness")

# Mangled names have no spaces; moecore's all contain its namespace's mangling, 7moecore.
defined=$(for object in "${chosen[@]}"; do nm -P -g --defined-only "$object"; done |
          awk '$1 ~ /7moecore/ {print $1}' | sort -u)
missing=0
for object in "${chosen[@]}"; do
  undefined=$(nm -P -u "$object" | awk '$2 == "U" && $1 ~ /7moecore/ {print $1}' | sort -u)
  absent=$(comm -23 <(echo "$undefined") <(echo "$defined") | sed '/^$/d')
  if [[ -n $absent ]]; then
    missing=1
    echo "${object##*/CMakeFiles/} needs, outside MOECORE_FUZZ_READER_SOURCES:"
    echo "$absent" | c++filt | sed 's/^/  /'
  fi
done
if ((missing)); then
  echo "check_sources_link: add the sources that define these to MOECORE_FUZZ_READER_SOURCES" \
       "(CMakeLists.txt), or \`make fuzz\` fails to link"
  exit 1
fi
echo "check_sources_link: ${#chosen[@]} objects define every moecore symbol they use"
