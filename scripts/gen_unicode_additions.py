#!/usr/bin/env python3
"""Writes src/data/unicode_additions.h (to stdout): the code points each Unicode general category gained from
Unicode 14.0 (PCRE2 10.42's tables, Debian 12's libpcre2) to Unicode 16.0 (the Oniguruma inside
Hugging Face tokenizers 0.22.1), as PCRE2 class bodies that the Split-regex translation adds next
to \\p{..} (src/data/tokenizer_byte_level.cpp).

It also writes the code points that Oniguruma's POSIX brackets [:alpha:], [:upper:] and [:lower:]
match beyond their general categories, and the code points that tokenizers' NFC normalizer treats as inert while utf8proc
(Debian 12's 2.8.0, Unicode 15.0) does not: combining marks and composition parts assigned after
the Unicode 9.0 tables of the Rust crate unicode-normalization-alignments 0.1.12 that tokenizers
normalizes with. Those tables are not at hand in any other form, so tokenizers' own NFC is asked
(a mark it does not reorder, a canonical pair it does not compose); src/data/tokenizer.cpp
normalizes the text between such code points and keeps them as they are.

Sources: Python 3.11's unicodedata (Unicode 14.0.0, the same version as PCRE2 10.42), the pinned
unicodedata2 16.0.0 and tokenizers 0.22.1 (tests/reference/requirements.txt). Run with the test
virtualenv:
  /opt/moecore/venv/bin/python scripts/gen_unicode_additions.py > src/data/unicode_additions.h
(clang-format, which scripts/setup.sh installs, lays the header out.)
"""

from __future__ import annotations

import subprocess
import sys
import unicodedata
from pathlib import Path

import unicodedata2
from tokenizers import Regex, normalizers, pre_tokenizers

OLD, NEW = "14.0.0", "16.0.0"


def ranges(code_points: list[int]) -> list[tuple[int, int]]:
    out: list[tuple[int, int]] = []
    for cp in code_points:
        if out and out[-1][1] == cp - 1:
            out[-1] = (out[-1][0], cp)
        else:
            out.append((cp, cp))
    return out


def class_body(code_points: list[int]) -> str:
    """The ranges as C++ raw-string pieces of at most ~80 characters each (adjacent literals
    concatenate), so that no line runs past the project's column limit."""
    items = [f"\\x{{{a:X}}}" if a == b else f"\\x{{{a:X}}}-\\x{{{b:X}}}" for a, b in ranges(code_points)]
    pieces, piece = [], ""
    for item in items:
        if piece and len(piece) + len(item) > 80:
            pieces.append(piece)
            piece = ""
        piece += item
    pieces.append(piece)
    return " ".join(f'R"({p})"' for p in pieces)


def nfc_inert_code_points() -> list[int]:
    """Code points tokenizers' NFC leaves alone (a starter composing with nothing) that carry a
    combining class or a composition in Unicode 16.0."""
    nfc = normalizers.NFC().normalize_str

    def reorders(mark: int) -> bool:  # tokenizers knows its combining class
        m = chr(mark)
        return nfc("\u0301" + m) != "\u0301" + m or nfc(m + "\u0334") != m + "\u0334"

    inert = {c for c in range(0x110000) if unicodedata2.combining(chr(c)) and not reorders(c)}
    pairs = []
    for c in range(0x110000):
        decomposition = unicodedata2.decomposition(chr(c))
        if not decomposition or decomposition.startswith("<") or " " not in decomposition:
            continue
        a, b = (int(x, 16) for x in decomposition.split())
        if unicodedata2.normalize("NFC", chr(a) + chr(b)) == chr(c):  # a primary composite
            pairs.append((a, b, c))
    composing = {p for a, b, c in pairs if nfc(chr(a) + chr(b)) == chr(c) for p in (a, b)}
    inert |= {p for a, b, c in pairs if nfc(chr(a) + chr(b)) != chr(c) for p in (a, b)} - composing
    return sorted(inert)


def onig_members(pattern: str) -> set[int]:
    """The code points that tokenizers' Oniguruma matches with `pattern` (one code point wide)."""
    split = pre_tokenizers.Split(Regex(pattern), "removed")
    points = [c for c in range(0x110000) if not 0xD800 <= c < 0xE000]
    members: set[int] = set()
    for start in range(0, len(points), 4096):
        chunk = points[start : start + 4096]
        kept = {i for _, (a, b) in split.pre_tokenize_str("".join(map(chr, chunk))) for i in range(a, b)}
        members.update(cp for i, cp in enumerate(chunk) if i not in kept)
    return members


# Oniguruma's POSIX brackets [:alpha:], [:upper:] and [:lower:] are the binary properties Alphabetic,
# Uppercase and Lowercase: their general categories and, beyond them, the Other_Alphabetic,
# Other_Uppercase and Other_Lowercase code points (marks, modifier letters, symbols). Those are asked
# of tokenizers, the only Unicode 16.0 copy of these properties at hand, whole: PCRE2's own
# \p{Alphabetic} would need them anyway, since code points assigned before Unicode 14.0 gained
# the properties since (U+0363..U+036F, combining Latin letters, became Alphabetic in 16.0).
BRACKET_CATEGORIES = {"alpha": ("L", "Nl"), "upper": ("Lu",), "lower": ("Ll",)}


def bracket_extras(bracket: str, categories: tuple[str, ...]) -> list[int]:
    return sorted(
        cp for cp in onig_members(f"[[:{bracket}:]]") if not unicodedata2.category(chr(cp)).startswith(categories)
    )


def main() -> None:
    assert unicodedata.unidata_version == OLD, f"Python's unicodedata is {unicodedata.unidata_version}, not {OLD}"
    assert unicodedata2.unidata_version == NEW, f"unicodedata2 is {unicodedata2.unidata_version}, not {NEW}"
    gained: dict[str, list[int]] = {}
    lost: dict[str, list[int]] = {}
    for cp in range(0x110000):
        old, new = unicodedata.category(chr(cp)), unicodedata2.category(chr(cp))
        if old != new:
            gained.setdefault(new, []).append(cp)
            lost.setdefault(old, []).append(cp)
    # Unassigned code points that got a category are additions; a code point that moved between
    # assigned categories cannot be taken out of PCRE2's old one (a class has no subtraction).
    moved = [cp for cps in lost.values() for cp in cps if unicodedata.category(chr(cp)) != "Cn"]
    header: list[str] = []
    w = header.append
    w("// Generated by scripts/gen_unicode_additions.py: do not edit. Where moecore's Unicode tables\n")
    w("// (PCRE2's, utf8proc's) differ from those Hugging Face tokenizers 0.22.1 uses.\n//\n")
    w(f"// Code points each general category gained from Unicode {OLD} (PCRE2 10.42's tables) to\n")
    w(f"// Unicode {NEW} (the Oniguruma in Hugging Face tokenizers 0.22.1), as PCRE2 class bodies.\n")
    w("// Moved between assigned categories, so still in PCRE2's old one as well: ")
    w(", ".join(f"U+{cp:04X} ({unicodedata.category(chr(cp))} -> {unicodedata2.category(chr(cp))})" for cp in moved) or "none")
    w(".\n#pragma once\n\n#include <array>\n#include <string_view>\n#include <utility>\n\nnamespace moecore::data {\n\n")
    w("struct CategoryAdditions {\n  std::string_view category;  // two letters, e.g. \"Lo\"\n")
    w("  std::string_view class_body;\n};\n\n")
    categories = sorted(c for c in gained if c != "Cn")
    w(f"inline constexpr std::array<CategoryAdditions, {len(categories)}> kUnicodeAdditions = {{{{\n")
    for c in categories:
        w(f'    {{"{c}", {class_body(gained[c])}}},\n')
    w("}};\n\n")
    w("// Code points Oniguruma's POSIX brackets [:alpha:], [:upper:], [:lower:] (Unicode 16.0's\n")
    w("// Alphabetic, Uppercase, Lowercase) match beyond their general categories (L and Nl, Lu, Ll):\n")
    w("// the Other_Alphabetic, Other_Uppercase and Other_Lowercase code points, as PCRE2 class bodies.\n")
    w("struct PosixBracketExtras {\n  std::string_view bracket;  // e.g. \"alpha\"\n")
    w("  std::string_view class_body;\n};\n\n")
    w(f"inline constexpr std::array<PosixBracketExtras, {len(BRACKET_CATEGORIES)}> kPosixBracketExtras = {{{{\n")
    for bracket, categories in BRACKET_CATEGORIES.items():
        w(f'    {{"{bracket}", {class_body(bracket_extras(bracket, categories))}}},\n')
    w("}};\n\n")
    inert = ranges(nfc_inert_code_points())
    w("// Code points tokenizers' NFC (Unicode 9.0 tables) treats as starters that compose with\n")
    w("// nothing, while utf8proc's (Unicode 15.0) reorders or composes them: inclusive ranges.\n")
    w(f"inline constexpr std::array<std::pair<char32_t, char32_t>, {len(inert)}> kNfcInertRanges = {{{{\n")
    for a, b in inert:
        w(f"    {{0x{a:X}, 0x{b:X}}},\n")
    w("}};\n\n}  // namespace moecore::data\n")
    # Laid out by clang-format (the project's .clang-format), as every other source file.
    sys.stdout.write(
        subprocess.run(
            ["clang-format", f"--assume-filename={Path(__file__).resolve().parents[1]}/src/data/unicode_additions.h"],
            input="".join(header), capture_output=True, text=True, check=True,
        ).stdout
    )


if __name__ == "__main__":
    main()
