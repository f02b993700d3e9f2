// Untrusted bytes in messages (issue 13): every error stays one line whatever a reader echoes.
#include <gtest/gtest.h>

#include <string>

#include "core/check.h"
#include "core/escape.h"

namespace moecore {
namespace {

TEST(EscapeForMessage, ControlCharactersBecomeVisibleEscapes) {
  EXPECT_EQ(escape_for_message("fals\n"), "fals\\n");
  EXPECT_EQ(escape_for_message("a\rb\tc"), "a\\rb\\tc");
  EXPECT_EQ(escape_for_message(std::string("x\0y", 3)), "x\\x00y");
  EXPECT_EQ(escape_for_message("\x1b[31mred"), "\\x1B[31mred");
  EXPECT_EQ(escape_for_message("\x7f"), "\\x7F");
}

TEST(EscapeForMessage, PrintableTextAndValidUtf8PassUnchanged) {
  EXPECT_EQ(escape_for_message("model.layers.0.mlp [a, b] 'x' \\ ok"),
            "model.layers.0.mlp [a, b] 'x' \\ ok");
  EXPECT_EQ(escape_for_message("Ġhello Äpfel 日本"), "Ġhello Äpfel 日本");
}

TEST(EscapeForMessage, InvalidUtf8AndLineSeparatorsAreEscapedPerByte) {
  EXPECT_EQ(escape_for_message("a\xff"
                               "b"),
            "a\\xFFb");
  EXPECT_EQ(escape_for_message("\xc3"), "\\xC3");                    // truncated sequence
  EXPECT_EQ(escape_for_message("\xc0\xaf"), "\\xC0\\xAF");           // overlong
  EXPECT_EQ(escape_for_message("\xc2\x85"), "\\xC2\\x85");           // U+0085 NEL (C1)
  EXPECT_EQ(escape_for_message("\xe2\x80\xa8"), "\\xE2\\x80\\xA8");  // U+2028
}

TEST(EscapeForMessage, EscapingTwiceChangesNothing) {
  const std::string once = escape_for_message("a\nb\x01\xff");
  EXPECT_EQ(escape_for_message(once), once);
}

TEST(EscapeForMessage, EveryErrorIsEscapedOnConstruction) {
  try {
    fail("[config] {}: unknown key {}", "c.toml", "ke\ny\r");
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_STREQ(e.what(), "[config] c.toml: unknown key ke\\ny\\r");
  }
}

}  // namespace
}  // namespace moecore
