"""IFEval's instruction checkers as a table: every instruction id has replies that must pass and
replies that must fail (adversarial ones included: empty, half met, the wrong relation), plus one
test per grading bug of the reference's IFEval (tinker-cookbook #891, #893, #897, #898)."""

from __future__ import annotations

import pytest

from tempering.data import RowError
from tempering.evals import ifeval

LIMERICK = "Write a limerick about a frog."

# (instruction id, kwargs, reply, followed?)
TABLE: list[tuple[str, dict[str, object], str, bool]] = [
    ("keywords:existence", {"keywords": ["river", "stone"]}, "A Stone sat by the river.", True),
    ("keywords:existence", {"keywords": ["river", "stone"]}, "A stone sat by the lake.", False),
    ("keywords:frequency", {"keyword": "cat", "frequency": 2, "relation": "at least"}, "cat and CAT", True),
    ("keywords:frequency", {"keyword": "cat", "frequency": 2, "relation": "at least"}, "one cat only", False),
    ("keywords:frequency", {"keyword": "cat", "frequency": 2, "relation": "less than"}, "one cat only", True),
    ("keywords:frequency", {"keyword": "cat", "frequency": 2, "relation": "less than"}, "cat, cat", False),
    ("keywords:forbidden_words", {"forbidden_words": ["bad", "evil"]}, "A good day.", True),
    ("keywords:forbidden_words", {"forbidden_words": ["bad", "evil"]}, "Not BAD at all.", False),
    ("keywords:forbidden_words", {"forbidden_words": ["bad"]}, "A badge is fine.", True),
    (
        "keywords:letter_frequency",
        {"letter": "z", "let_frequency": 3, "let_relation": "at least"},
        "Zoo zeal zap",
        True,
    ),
    (
        "keywords:letter_frequency",
        {"letter": "z", "let_frequency": 3, "let_relation": "at least"},
        "zoo zeal",
        False,
    ),
    (
        "keywords:letter_frequency",
        {"letter": "z", "let_frequency": 3, "let_relation": "less than"},
        "zoo zeal zap",
        False,
    ),
    ("language:response_language", {"language": "de"}, "Das ist nicht gut, und ich bin müde.", True),
    ("language:response_language", {"language": "de"}, "This is not good, and I am tired.", False),
    ("language:response_language", {"language": "ru"}, "Это очень хорошая идея.", True),
    ("language:response_language", {"language": "ko"}, "Это очень хорошая идея.", False),
    ("language:response_language", {"language": "fa"}, "این یک کتاب خوب است که من چند روز پیش خریدم", True),
    ("language:response_language", {"language": "ar"}, "این یک کتاب خوب است که من چند روز پیش خریدم", False),
    ("length_constraints:number_sentences", {"num_sentences": 3, "relation": "less than"}, "One. Two!", True),
    (
        "length_constraints:number_sentences",
        {"num_sentences": 3, "relation": "less than"},
        "One. Two! Three?",
        False,
    ),
    ("length_constraints:number_sentences", {"num_sentences": 2, "relation": "at least"}, "One. Two.", True),
    ("length_constraints:number_paragraphs", {"num_paragraphs": 2}, "First part.\n***\nSecond part.", True),
    (
        "length_constraints:number_paragraphs",
        {"num_paragraphs": 2},
        "First.\n***\nSecond.\n***\nThird.",
        False,
    ),
    ("length_constraints:number_paragraphs", {"num_paragraphs": 2}, "First.\n***\n***\nSecond.", False),
    (
        "length_constraints:number_words",
        {"num_words": 5, "relation": "at least"},
        "one two three four five",
        True,
    ),
    (
        "length_constraints:number_words",
        {"num_words": 5, "relation": "at least"},
        "one two three four",
        False,
    ),
    (
        "length_constraints:nth_paragraph_first_word",
        {"num_paragraphs": 2, "nth_paragraph": 2, "first_word": "then"},
        "First we wait.\n\nThen, we go.",
        True,
    ),
    (
        "length_constraints:nth_paragraph_first_word",
        {"num_paragraphs": 2, "nth_paragraph": 2, "first_word": "then"},
        "First we wait.\n\nNow we go.",
        False,
    ),
    (
        "length_constraints:nth_paragraph_first_word",
        {"num_paragraphs": 2, "nth_paragraph": 2, "first_word": "then"},
        "First.\n\nThen.\n\nThen again.",
        False,
    ),
    ("detectable_content:number_placeholders", {"num_placeholders": 2}, "Dear [name], at [address].", True),
    ("detectable_content:number_placeholders", {"num_placeholders": 2}, "Dear [name], at home.", False),
    ("detectable_content:postscript", {"postscript_marker": "P.S."}, "Hello.\n\nP.S. See you.", True),
    ("detectable_content:postscript", {"postscript_marker": "P.S."}, "Hello. See you.", False),
    ("detectable_content:postscript", {"postscript_marker": "P.P.S"}, "Hi.\nP.P.S. more", True),
    ("detectable_format:number_bullet_lists", {"num_bullets": 2}, "List:\n* one\n* two", True),
    ("detectable_format:number_bullet_lists", {"num_bullets": 2}, "List:\n* one\n- two\n* three", False),
    ("detectable_format:constrained_response", {}, "Let me think. My answer is no.", True),
    ("detectable_format:constrained_response", {}, "My answer is nope", False),
    ("detectable_format:number_highlighted_sections", {"num_highlights": 2}, "*one* and **two**", True),
    ("detectable_format:number_highlighted_sections", {"num_highlights": 2}, "*one* and ** **", False),
    (
        "detectable_format:multiple_sections",
        {"section_spliter": "Section", "num_sections": 2},
        "Section 1\nintro\nSection 2\nbody",
        True,
    ),
    (
        "detectable_format:multiple_sections",
        {"section_spliter": "Section", "num_sections": 2},
        "Section 1\nintro and body",
        False,
    ),
    ("detectable_format:json_format", {}, '```json\n{"a": 1}\n```', True),
    ("detectable_format:json_format", {}, 'Here it is: {"a": 1}', False),
    ("detectable_format:title", {}, "<<My Poem>>\nRoses.", True),
    ("detectable_format:title", {}, "<< >>\nRoses.", False),
    ("combination:two_responses", {}, "Answer one.\n******\nAnswer two.", True),
    ("combination:two_responses", {}, "Same.\n******\nSame.", False),
    ("combination:two_responses", {}, "Only one answer.", False),
    ("combination:repeat_prompt", {"prompt_to_repeat": LIMERICK}, LIMERICK + "\nThere once was a frog", True),
    ("combination:repeat_prompt", {"prompt_to_repeat": LIMERICK}, "There once was a frog", False),
    ("startend:end_checker", {"end_phrase": "Any other questions?"}, "Done. Any other questions?", True),
    ("startend:end_checker", {"end_phrase": "Any other questions?"}, "Any other questions? Done.", False),
    ("startend:quotation", {}, '"All quoted."', True),
    ("startend:quotation", {}, '"Half quoted.', False),
    (
        "change_case:capital_word_frequency",
        {"capital_frequency": 2, "capital_relation": "less than"},
        "only ONE shout",
        True,
    ),
    (
        "change_case:capital_word_frequency",
        {"capital_frequency": 2, "capital_relation": "less than"},
        "TWO LOUD shouts",
        False,
    ),
    ("change_case:english_capital", {}, "THE CAT IS ON THE MAT.", True),
    ("change_case:english_capital", {}, "The Cat Is On The Mat.", False),
    ("change_case:english_lowercase", {}, "the cat is on the mat.", True),
    ("change_case:english_lowercase", {}, "the cat is on the Mat.", False),
    ("punctuation:no_comma", {}, "No commas here.", True),
    ("punctuation:no_comma", {}, "One, comma.", False),
]


@pytest.mark.parametrize(("ident", "kwargs", "reply", "expected"), TABLE)
def test_checker_table(ident: str, kwargs: dict[str, object], reply: str, expected: bool) -> None:
    (kw,) = ifeval.validate([ident], [kwargs])
    assert ifeval.follows(ident, reply, kw) is expected


def test_every_instruction_id_has_a_passing_and_a_failing_case() -> None:
    for ident in ifeval.INSTRUCTIONS:
        outcomes = {expected for i, _, _, expected in TABLE if i == ident}
        assert outcomes == {True, False}, ident


def test_an_empty_reply_follows_nothing_not_even_what_it_cannot_break() -> None:
    for ident in ("punctuation:no_comma", "keywords:forbidden_words", "change_case:capital_word_frequency"):
        kwargs = {
            "punctuation:no_comma": {},
            "keywords:forbidden_words": {"forbidden_words": ["x"]},
            "change_case:capital_word_frequency": {"capital_frequency": 3, "capital_relation": "less than"},
        }[ident]
        (kw,) = ifeval.validate([ident], [kwargs])
        assert not ifeval.follows(ident, "", kw)
        assert not ifeval.follows(ident, "  \n ", kw)


def test_less_than_is_strict_and_checked_at_every_call_site() -> None:
    """tinker-cookbook #891: 'less than' fell back to True, so every such constraint passed."""
    many = " ".join(["word"] * 30) + ". " * 5 + "ALL CAPS HERE NOW"
    cases = [
        ("length_constraints:number_words", {"relation": "less than", "num_words": 10}),
        ("length_constraints:number_sentences", {"relation": "less than", "num_sentences": 2}),
        ("keywords:frequency", {"keyword": "word", "frequency": 5, "relation": "less than"}),
        ("keywords:letter_frequency", {"letter": "w", "let_frequency": 5, "let_relation": "less than"}),
        ("change_case:capital_word_frequency", {"capital_frequency": 2, "capital_relation": "less than"}),
    ]
    for ident, kwargs in cases:
        (kw,) = ifeval.validate([ident], [kwargs])
        assert not ifeval.follows(ident, many, kw), ident
    (kw,) = ifeval.validate(["length_constraints:number_words"], [{"relation": "less than", "num_words": 3}])
    assert ifeval.follows("length_constraints:number_words", "one two", kw)
    assert not ifeval.follows("length_constraints:number_words", "one two three", kw)  # the boundary


def test_an_unknown_relation_or_instruction_is_refused_not_passed() -> None:
    with pytest.raises(RowError, match=r"unknown relation 'fewer than'; known: less than, at least"):
        ifeval.validate(["length_constraints:number_words"], [{"relation": "fewer than", "num_words": 3}])
    with pytest.raises(
        RowError, match=r"instruction 1 \('detectable_format:haiku'\): unknown instruction id"
    ):
        ifeval.validate(["punctuation:no_comma", "detectable_format:haiku"], [{}, {}])
    with pytest.raises(RowError, match=r"missing kwarg 'num_words'"):
        ifeval.validate(["length_constraints:number_words"], [{"relation": "at least", "num_words": None}])
    with pytest.raises(RowError, match="2 instruction ids but 1 kwargs"):
        ifeval.validate(["punctuation:no_comma", "punctuation:no_comma"], [{}])


def test_a_repeated_instruction_id_is_scored_each_time() -> None:
    """tinker-cookbook #893: results keyed by id dropped the first of a repeated pair."""
    ids = ["length_constraints:number_words", "length_constraints:number_words"]
    kwargs = ifeval.validate(
        ids, [{"relation": "at least", "num_words": 20}, {"relation": "at least", "num_words": 2}]
    )
    assert ifeval.check_all(ids, kwargs, "one two three") == [False, True]


def test_repeat_prompt_is_checked() -> None:
    """tinker-cookbook #897: combination:repeat_prompt fell through to True for any reply."""
    (kw,) = ifeval.validate(["combination:repeat_prompt"], [{"prompt_to_repeat": LIMERICK}])
    assert not ifeval.follows("combination:repeat_prompt", "A frog sat on a log.", kw)
    assert not ifeval.follows("combination:repeat_prompt", "Write a limerick about a", kw)  # half of it
    assert ifeval.follows("combination:repeat_prompt", "  write a LIMERICK about a frog. A frog...", kw)


def test_english_capital_needs_every_letter_in_capitals() -> None:
    """tinker-cookbook #898: first-letter-per-word accepted title case."""
    (kw,) = ifeval.validate(["change_case:english_capital"], [{}])
    assert not ifeval.follows("change_case:english_capital", "Title Case Is Not Capitals", kw)
    assert not ifeval.follows("change_case:english_capital", "DAS IST NICHT GUT UND ICH BIN MÜDE", kw)
    assert ifeval.follows("change_case:english_capital", "THIS IS ALL CAPITALS AND IT IS ENGLISH", kw)


def test_loose_accepts_a_reply_that_only_its_first_line_or_markdown_breaks() -> None:
    ids = ["startend:quotation", "punctuation:no_comma"]
    kwargs = ifeval.validate(ids, [{}, {}])
    framed = 'Sure, here it is:\n"A quoted answer."'
    assert ifeval.check_all(ids, kwargs, framed) == [False, False]  # strict: the preamble breaks both
    assert ifeval.check_all_loose(ids, kwargs, framed) == [True, True]
    ids2 = ["startend:end_checker"]
    kw2 = ifeval.validate(ids2, [{"end_phrase": "Is there anything else?"}])
    assert ifeval.check_all(ids2, kw2, "Done. **Is there anything else?**") == [False]
    assert ifeval.check_all_loose(ids2, kw2, "Done. **Is there anything else?**") == [True]
    # loose is still not free: a reply that breaks the instruction in its body fails
    assert ifeval.check_all_loose(ids, kwargs, 'Intro\n"A, B"\nOutro') == [True, False]
    assert ifeval.check_all_loose(ids, kwargs, "") == [False, False]
