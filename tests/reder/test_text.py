"""reder.text: the one definition of a line and of a character of text."""
import pytest

from reder import text

NOT_TEXT = ["\r", "\n", "\x0b", "\x0c", "\x85", "\u2028", "\u2029", "\x00", "\x01", "\x1b", "\x1f", "\x7f", "\x9f"]
TEXT = ["\t", " ", "é", "\u00a0", "\u200b", "\ufeff", "\u202e", "𝔸", "中"]


@pytest.mark.parametrize("char", NOT_TEXT)
def test_terminators_and_control_characters_are_not_text(char):
    line = f"ab{char}c"
    assert text.bad_character(line) == 2
    assert text.line_problem(line).startswith(f"U+{ord(char):04X} (") and " at character 3: " in text.line_problem(line)
    assert text.replace_bad(line) == ("ab c", [char])


@pytest.mark.parametrize("char", TEXT)
def test_tab_and_other_characters_are_text(char):
    assert text.bad_character(f"ab{char}c") is None and text.line_problem(f"ab{char}c") is None


def test_the_pattern_is_exactly_category_cc_but_tab_plus_u2028_u2029():
    import unicodedata

    expected = {chr(c) for c in range(0x110000) if unicodedata.category(chr(c)) == "Cc"} - {"\t"} | {"\u2028", "\u2029"}
    assert {chr(c) for c in range(0x3000) if text.BAD.match(chr(c))} == expected
    assert {chr(c) for c in range(0x3000) if text.BAD_BUT_LF.match(chr(c))} == expected - {"\n"}


def test_a_bom_is_removed_only_at_the_start():
    assert text.strip_bom("\ufeffa\ufeff") == ("a\ufeff", True) and text.strip_bom("a") == ("a", False)
