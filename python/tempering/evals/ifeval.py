"""IFEval's verifiable instructions: one checker per instruction id, and their checks of a reply.

IFEval (``google/IFEval``) asks for replies under instructions a program can check ("answer in
fewer than 50 words", "end with 'Is there anything else?'"). Each row lists its instruction ids
and one kwargs object per id. :func:`validate` checks a row's ids and kwargs when the data is
read (an unknown id, a missing kwarg or an unknown relation is a row error, never a free pass),
and :func:`check_all` checks a reply against every instruction **positionally**, so a prompt
that repeats an id (``number_words`` twice) is scored on both.

Deliberate choices (each pinned by a test):

- relations are ``less than`` (``<``), ``at least`` (``>=``) and also ``at most`` / ``exactly``;
  any other relation is refused when the row is read (the reference's IFEval scored every
  ``less than`` constraint as met, tinker-cookbook #891);
- repeated instruction ids are all scored (#893); ``combination:repeat_prompt`` is checked (#897);
  ``change_case:english_capital`` needs the whole reply in capitals, not title case (#898);
- an empty (whitespace-only) reply follows no instruction, even one it cannot break
  ("no commas"): the original IFEval scores such a reply as following it;
- loose accuracy (:func:`check_all_loose`) is IFEval's: an instruction is followed loosely when
  one of eight variants of the reply follows it (without its first line, its last line, both,
  and each of these with ``*`` removed);
- ``language:response_language`` and the English check of the ``change_case`` instructions use
  :func:`language_candidates`, a small detector (the Unicode script of the letters; for Latin
  script, the most frequent function words of each language), not ``langdetect``.

Example::

    ids = ["length_constraints:number_words", "punctuation:no_comma"]
    kwargs = validate(ids, [{"relation": "less than", "num_words": 5}, {}])
    check_all(ids, kwargs, "Short and sweet.")      # [True, True]
"""

from __future__ import annotations

import json
import re
import unicodedata
from collections.abc import Callable, Mapping, Sequence

from tempering.data import RowError

__all__ = [
    "INSTRUCTIONS",
    "RELATIONS",
    "check_all",
    "check_all_loose",
    "follows",
    "language_candidates",
    "loose_variants",
    "validate",
]

Kwargs = Mapping[str, object]

RELATIONS: dict[str, Callable[[int, int], bool]] = {
    "less than": lambda count, target: count < target,
    "at least": lambda count, target: count >= target,
    "at most": lambda count, target: count <= target,
    "exactly": lambda count, target: count == target,
}
"""The comparisons a count constraint may name (IFEval itself uses ``less than`` and ``at least``)."""


def _int(kw: Kwargs, key: str) -> int:
    value = kw[key]
    assert isinstance(value, int)
    return value


def _str(kw: Kwargs, key: str) -> str:
    value = kw[key]
    assert isinstance(value, str)
    return value


def _strs(kw: Kwargs, key: str) -> list[str]:
    value = kw[key]
    assert isinstance(value, list)
    return [str(v) for v in value]  # pyright: ignore[reportUnknownVariableType, reportUnknownArgumentType]


def _relation(count: int, kw: Kwargs, relation_key: str, target_key: str) -> bool:
    return RELATIONS[_str(kw, relation_key)](count, _int(kw, target_key))


def _words(text: str) -> list[str]:
    return re.findall(r"\w+", text)


def _sentences(text: str) -> list[str]:
    return [s for s in re.split(r"(?<=[.!?])\s+", text.strip()) if s.strip()]


def _stars_paragraphs(text: str) -> int | None:
    parts = re.split(r"\s?\*\*\*\s?", text)
    for i, part in enumerate(parts):
        if not part.strip() and i not in (0, len(parts) - 1):
            return None
    return sum(1 for p in parts if p.strip())


def _first_word(paragraph: str) -> str:
    word = paragraph.split()[0] if paragraph.split() else ""
    return word.strip("'\"").rstrip(".,?!:;'\"").lower()


def _nth_paragraph(text: str, kw: Kwargs) -> bool:
    paragraphs = [p for p in re.split(r"\n\s*\n", text) if p.strip()]
    nth = _int(kw, "nth_paragraph")
    if len(paragraphs) != _int(kw, "num_paragraphs") or not 1 <= nth <= len(paragraphs):
        return False
    return _first_word(paragraphs[nth - 1]) == _str(kw, "first_word").strip().lower()


def _postscript(text: str, kw: Kwargs) -> bool:
    marker = _str(kw, "postscript_marker").strip().lower()
    if marker == "p.p.s":
        pattern = r"\s*p\.\s?p\.\s?s.*$"
    elif marker == "p.s.":
        pattern = r"\s*p\.\s?s\..*$"
    else:
        pattern = r"\s*" + re.escape(marker) + r".*$"
    return bool(re.findall(pattern, text.lower(), flags=re.MULTILINE))


def _bullets(text: str) -> int:
    stars = re.findall(r"^\s*\*[^\*].*$", text, flags=re.MULTILINE)
    dashes = re.findall(r"^\s*-.*$", text, flags=re.MULTILINE)
    return len(stars) + len(dashes)


def _highlights(text: str) -> int:
    single = [h for h in re.findall(r"\*[^\n\*]*\*", text) if h.strip("*").strip()]
    double = [
        h for h in re.findall(r"\*\*[^\n\*]*\*\*", text) if h.removeprefix("**").removesuffix("**").strip()
    ]
    return len(single) + len(double)


def _sections(text: str, kw: Kwargs) -> bool:
    splitter = re.escape(_str(kw, "section_spliter").strip())
    sections = re.split(r"\s?" + splitter + r"\s?\d+\s?", text)
    return len(sections) - 1 >= _int(kw, "num_sections")


def _json(text: str) -> bool:
    body = text.strip()
    body = re.sub(r"^```(?:json|JSON|Json)?\s*", "", body)
    body = re.sub(r"\s*```$", "", body).strip()
    try:
        json.loads(body)
    except ValueError:
        return False
    return True


def _title(text: str) -> bool:
    return any(t[2:-2].strip() for t in re.findall(r"<<[^\n]+>>", text))


def _two_responses(text: str) -> bool:
    parts = text.split("******")
    kept: list[str] = []
    for i, part in enumerate(parts):
        if not part.strip():
            if i not in (0, len(parts) - 1):
                return False
        else:
            kept.append(part.strip())
    return len(kept) == 2 and kept[0] != kept[1]


def _capital_words(text: str, kw: Kwargs) -> bool:
    count = sum(1 for w in _words(text) if w.isupper())
    return _relation(count, kw, "capital_relation", "capital_frequency")


_SCRIPTS: dict[str, frozenset[str]] = {
    "CYRILLIC": frozenset({"ru", "uk", "bg", "sr", "mk", "be", "kk"}),
    "DEVANAGARI": frozenset({"hi", "mr", "ne", "sa"}),
    "BENGALI": frozenset({"bn", "as"}),
    "GURMUKHI": frozenset({"pa"}),
    "GUJARATI": frozenset({"gu"}),
    "TAMIL": frozenset({"ta"}),
    "TELUGU": frozenset({"te"}),
    "KANNADA": frozenset({"kn"}),
    "MALAYALAM": frozenset({"ml"}),
    "THAI": frozenset({"th"}),
    "HANGUL": frozenset({"ko"}),
    "HIRAGANA": frozenset({"ja"}),
    "KATAKANA": frozenset({"ja"}),
    "CJK": frozenset({"zh", "ja"}),
    "HEBREW": frozenset({"he"}),
    "GREEK": frozenset({"el"}),
    "ARABIC": frozenset({"ar", "fa", "ur"}),
}
_PERSIAN = set("پچژگ")
_URDU = set("ٹڈڑںے")
_FUNCTION_WORDS: dict[str, frozenset[str]] = {
    lang: frozenset(words.split())
    for lang, words in {
        "en": "the and is of to in that it you for with are this was be have not they",
        "de": "der die und das ist nicht ein eine zu den mit sich ich es auf von dem auch wir",
        "fr": "le la les et est un une des du que pas pour dans je vous il elle sur avec au",
        "es": "el la los las y es un una que por para con no se del lo como pero muy",
        "it": "il la di e che è un una per non sono del della con gli le anche ma",
        "pt": "o a os as e é um uma que não para com do da em se mas muito são",
        "fi": "ja on ei se että oli kun mutta hän ovat tai myös joka minä sinä ole",
        "sw": "na ya wa kwa ni za la katika hii kuwa yake huo sana watu wake hiyo",
        "vi": "và của là có không được những một các cho người này với trong đã",
    }.items()
}


def _script(char: str) -> str | None:
    name = unicodedata.name(char, "")
    for script in _SCRIPTS:
        if name.startswith(script):
            return script
    return "LATIN" if name.startswith("LATIN") else None


def language_candidates(text: str) -> frozenset[str]:
    """The ISO 639-1 codes ``text`` may be written in (empty: none recognised).

    The dominant Unicode script of its letters decides a non-Latin language (Persian and Urdu
    are told from Arabic by their own letters); Latin script is scored by each language's most
    frequent function words, and the best-scoring languages are returned.

    Example::

        language_candidates("Привет, как дела?")           # frozenset({'ru', 'uk', ...})
        language_candidates("The cat is on the mat.")       # frozenset({'en'})
    """
    counts: dict[str, int] = {}
    for char in text:
        if char.isalpha():
            script = _script(char)
            if script is not None:
                counts[script] = counts.get(script, 0) + 1
    if not counts:
        return frozenset()
    script = max(counts, key=lambda s: counts[s])
    if script == "ARABIC":
        letters = set(text)
        if letters & _URDU:
            return frozenset({"ur"})
        return frozenset({"fa"}) if letters & _PERSIAN else frozenset({"ar"})
    if script != "LATIN":
        return _SCRIPTS[script]
    words = [w.lower() for w in _words(text)]
    scores = {lang: sum(w in fw for w in words) for lang, fw in _FUNCTION_WORDS.items()}
    best = max(scores.values())
    return frozenset(lang for lang, s in scores.items() if s == best) if best else frozenset()


def _english(text: str) -> bool:
    return "en" in language_candidates(text)


def _response_language(text: str, kw: Kwargs) -> bool:
    return _str(kw, "language").lower() in language_candidates(text)


_Check = Callable[[str, Kwargs], bool]

INSTRUCTIONS: dict[str, tuple[tuple[str, ...], _Check]] = {
    "keywords:existence": (
        ("keywords",),
        lambda t, kw: all(re.search(re.escape(k), t, re.IGNORECASE) for k in _strs(kw, "keywords")),
    ),
    "keywords:frequency": (
        ("keyword", "frequency", "relation"),
        lambda t, kw: _relation(
            len(re.findall(re.escape(_str(kw, "keyword")), t, re.IGNORECASE)), kw, "relation", "frequency"
        ),
    ),
    "keywords:forbidden_words": (
        ("forbidden_words",),
        lambda t, kw: (
            not any(
                re.search(r"\b" + re.escape(w) + r"\b", t, re.IGNORECASE)
                for w in _strs(kw, "forbidden_words")
            )
        ),
    ),
    "keywords:letter_frequency": (
        ("letter", "let_frequency", "let_relation"),
        lambda t, kw: _relation(
            t.lower().count(_str(kw, "letter").lower()), kw, "let_relation", "let_frequency"
        ),
    ),
    "language:response_language": (("language",), _response_language),
    "length_constraints:number_sentences": (
        ("num_sentences", "relation"),
        lambda t, kw: _relation(len(_sentences(t)), kw, "relation", "num_sentences"),
    ),
    "length_constraints:number_paragraphs": (
        ("num_paragraphs",),
        lambda t, kw: _stars_paragraphs(t) == _int(kw, "num_paragraphs"),
    ),
    "length_constraints:number_words": (
        ("num_words", "relation"),
        lambda t, kw: _relation(len(_words(t)), kw, "relation", "num_words"),
    ),
    "length_constraints:nth_paragraph_first_word": (
        ("num_paragraphs", "nth_paragraph", "first_word"),
        _nth_paragraph,
    ),
    "detectable_content:number_placeholders": (
        ("num_placeholders",),
        lambda t, kw: len(re.findall(r"\[.*?\]", t)) >= _int(kw, "num_placeholders"),
    ),
    "detectable_content:postscript": (("postscript_marker",), _postscript),
    "detectable_format:number_bullet_lists": (
        ("num_bullets",),
        lambda t, kw: _bullets(t) == _int(kw, "num_bullets"),
    ),
    "detectable_format:constrained_response": (
        (),
        lambda t, kw: any(o in t for o in ("My answer is yes.", "My answer is no.", "My answer is maybe.")),
    ),
    "detectable_format:number_highlighted_sections": (
        ("num_highlights",),
        lambda t, kw: _highlights(t) >= _int(kw, "num_highlights"),
    ),
    "detectable_format:multiple_sections": (("section_spliter", "num_sections"), _sections),
    "detectable_format:json_format": ((), lambda t, kw: _json(t)),
    "detectable_format:title": ((), lambda t, kw: _title(t)),
    "combination:two_responses": ((), lambda t, kw: _two_responses(t)),
    "combination:repeat_prompt": (
        ("prompt_to_repeat",),
        lambda t, kw: t.strip().lower().startswith(_str(kw, "prompt_to_repeat").strip().lower()),
    ),
    "startend:end_checker": (
        ("end_phrase",),
        lambda t, kw: t.strip().strip('"').lower().endswith(_str(kw, "end_phrase").strip().lower()),
    ),
    "startend:quotation": ((), lambda t, kw: len(t.strip()) > 1 and t.strip()[0] == t.strip()[-1] == '"'),
    "change_case:capital_word_frequency": (("capital_frequency", "capital_relation"), _capital_words),
    "change_case:english_capital": ((), lambda t, kw: t.isupper() and _english(t.lower())),
    "change_case:english_lowercase": ((), lambda t, kw: t.islower() and _english(t)),
    "punctuation:no_comma": ((), lambda t, kw: "," not in t),
}
"""Every IFEval instruction id: the kwargs it needs, and its check of a (non-empty) reply."""

_INT_KEYS = frozenset(
    {"frequency", "let_frequency", "num_sentences", "num_paragraphs", "num_words", "nth_paragraph"}
    | {"num_placeholders", "num_bullets", "num_highlights", "num_sections", "capital_frequency"}
)
_RELATION_KEYS = frozenset({"relation", "let_relation", "capital_relation"})


def validate(ids: Sequence[str], kwargs: Sequence[object]) -> list[dict[str, object]]:
    """Each instruction's kwargs, checked: a known id, every kwarg it needs (``None`` values,
    as the hub's table stores unused keys, are dropped), integers where counts are expected and
    a known relation. Raises :class:`~tempering.data.RowError` naming the instruction."""
    if len(ids) != len(kwargs):
        raise RowError(f"ifeval: {len(ids)} instruction ids but {len(kwargs)} kwargs objects")
    if not ids:
        raise RowError("ifeval: the row has no instructions")
    out: list[dict[str, object]] = []
    for i, (ident, raw) in enumerate(zip(ids, kwargs, strict=True)):
        where = f"ifeval: instruction {i} ({ident!r})"
        if ident not in INSTRUCTIONS:
            raise RowError(f"{where}: unknown instruction id; known: {', '.join(sorted(INSTRUCTIONS))}")
        if raw is None:
            raw = {}
        if not isinstance(raw, Mapping):
            raise RowError(f"{where}: kwargs must be an object, got {type(raw).__name__}")
        given: Mapping[str, object] = raw  # pyright: ignore[reportUnknownVariableType]
        kw = {str(k): v for k, v in given.items() if v is not None}
        for key in INSTRUCTIONS[ident][0]:
            if key not in kw:
                raise RowError(f"{where}: missing kwarg {key!r} (has {sorted(kw)})")
            value = kw[key]
            if key in _INT_KEYS and (isinstance(value, bool) or not isinstance(value, int | float)):
                raise RowError(f"{where}: kwarg {key!r} must be a number, got {value!r}")
            if key in _INT_KEYS:
                kw[key] = int(value)  # pyright: ignore[reportArgumentType]
            if key in _RELATION_KEYS and value not in RELATIONS:
                raise RowError(f"{where}: unknown relation {value!r}; known: {', '.join(RELATIONS)}")
            if key in ("keywords", "forbidden_words") and not isinstance(value, list):
                raise RowError(f"{where}: kwarg {key!r} must be a list of words, got {value!r}")
        out.append(kw)
    return out


def follows(ident: str, reply: str, kwargs: Kwargs) -> bool:
    """Whether ``reply`` follows instruction ``ident`` with (validated) ``kwargs``; an empty
    reply follows nothing."""
    if not reply.strip():
        return False
    return INSTRUCTIONS[ident][1](reply, kwargs)


def check_all(ids: Sequence[str], kwargs: Sequence[Kwargs], reply: str) -> list[bool]:
    """One verdict per instruction, in order (a repeated id is checked each time it appears)."""
    return [follows(ident, reply, kw) for ident, kw in zip(ids, kwargs, strict=True)]


def loose_variants(reply: str) -> list[str]:
    """IFEval's loose variants of a reply: as is, without its first line, without its last, without
    both, and each of these with every ``*`` removed (markdown emphasis)."""
    lines = reply.split("\n")
    cut = ["\n".join(lines[1:]), "\n".join(lines[:-1]), "\n".join(lines[1:-1])]
    base = [reply, *cut]
    return [*base, *(v.replace("*", "") for v in base)]


def check_all_loose(ids: Sequence[str], kwargs: Sequence[Kwargs], reply: str) -> list[bool]:
    """One loose verdict per instruction: followed by some non-empty variant of the reply
    (:func:`loose_variants`); an empty reply follows nothing."""
    variants = [v for v in loose_variants(reply) if v.strip()] if reply.strip() else []
    return [any(follows(i, v, kw) for v in variants) for i, kw in zip(ids, kwargs, strict=True)]
