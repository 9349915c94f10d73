"""llama3: Llama 3.x Instruct's special tokens (all special), BOS <|begin_of_text|>, EOS <|eot_id|>.

The format has no thinking (both refuse it: the corpus leaves it out) and no tool-call syntax:
an assistant message's tool calls are not written, in the reference as here, and tool results
are ``tool`` turns; the corpus has both.
"""

from reference_oracle import CorpusOptions, TokenizerSpec

NAMES = ("llama3",)
SPEC = TokenizerSpec(
    special=(
        "<|begin_of_text|>",
        "<|end_of_text|>",
        "<|start_header_id|>",
        "<|end_header_id|>",
        "<|eot_id|>",
        "<|eom_id|>",
        "<|python_tag|>",
        "<|finetune_right_pad_id|>",
    ),
    bos="<|begin_of_text|>",
    eos="<|eot_id|>",
)
OPTIONS = CorpusOptions(thinking=False)
