"""deepseek: DeepSeek V3.1 and V4.1 share one test tokenizer.

Special: the sentence markers, and V4's ``｜DSML｜`` marker, which the V4.1 renderer requires as
one token (held as special, the reference emits it as that token in tool-call blocks and the tool
declaration, where encoding the text with special tokens as text would give its bytes). Added,
not special (one id each, matched in text): the role markers, ``<think>``/``</think>`` and the V3
tool markers. ``<｜System｜>`` is V4.1's, the tool markers V3.1's; each format ignores the other's.
"""

from reference_oracle import TokenizerSpec

NAMES = (
    "deepseekv3",
    "deepseekv3_disable_thinking",
    "deepseekv3_thinking",
    "deepseekv4_1",
    "deepseekv4_1_low_reasoning",
    "deepseekv4_1_max_reasoning",
    "deepseekv4_1_disable_thinking",
    "deepseekv4_1_preserve_thinking",
)
SPEC = TokenizerSpec(
    special=("<｜begin▁of▁sentence｜>", "<｜end▁of▁sentence｜>", "｜DSML｜"),
    added=(
        "<｜User｜>",
        "<｜Assistant｜>",
        "<｜System｜>",
        "<think>",
        "</think>",
        "<｜tool▁calls▁begin｜>",
        "<｜tool▁calls▁end｜>",
        "<｜tool▁call▁begin｜>",
        "<｜tool▁call▁end｜>",
        "<｜tool▁sep｜>",
        "<｜tool▁output▁begin｜>",
        "<｜tool▁output▁end｜>",
    ),
    bos="<｜begin▁of▁sentence｜>",
    eos="<｜end▁of▁sentence｜>",
    pad="<｜end▁of▁sentence｜>",
    name_or_path="deepseek-test-tokenizer",
)
