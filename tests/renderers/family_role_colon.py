"""role_colon: plain text, no special tokens but a BOS (the reference renders one).

No thinking (the corpus leaves it out); tool calls are in the corpus: their text is rendered and
the calls are not, in the reference as here."""

from reference_oracle import CorpusOptions, TokenizerSpec

NAMES = ("role_colon",)
SPEC = TokenizerSpec(
    special=("<|begin_of_text|>", "<|end_of_text|>"), bos="<|begin_of_text|>", eos="<|end_of_text|>"
)
OPTIONS = CorpusOptions(thinking=False)
