"""The Tinker Cookbook's ``TrainOnWhat`` (its enum, or the plain strings) is accepted wherever
tempering's is, and trains the same tokens."""

from __future__ import annotations

import pytest
from tinker_cookbook.renderers import TrainOnWhat as CookbookTrainOnWhat

from tempering.backend import ModelConfig, load_tokenizer
from tempering.renderers import get_renderer
from tempering.sft import ChatData
from tempering_protocols import TrainOnWhat

MESSAGES = [
    {"role": "user", "content": "2+2?"},
    {"role": "assistant", "content": "4"},
    {"role": "user", "content": "3+3?"},
    {"role": "assistant", "content": "6"},
]


@pytest.mark.parametrize("mode", [m for m in TrainOnWhat if m != TrainOnWhat.CUSTOMIZED])
def test_cookbook_modes_weight_the_same_tokens(mode: TrainOnWhat) -> None:
    renderer = get_renderer("chatml", load_tokenizer("tempering/tiny"))
    ours = renderer.build_supervised_example(MESSAGES, mode)
    for other in (CookbookTrainOnWhat(mode.value), mode.value):
        theirs = renderer.build_supervised_example(MESSAGES, other)  # type: ignore[arg-type]
        assert list(theirs.weights) == list(ours.weights), other
        assert theirs.model_input.to_ints() == ours.model_input.to_ints()


def test_chat_data_converts_the_cookbook_enum_and_strings() -> None:
    for given in (CookbookTrainOnWhat.ALL_ASSISTANT_MESSAGES, "all_assistant_messages"):
        data = ChatData(train_on_what=given)  # type: ignore[arg-type]
        assert type(data.train_on_what) is TrainOnWhat
        assert data.train_on_what is TrainOnWhat.ALL_ASSISTANT_MESSAGES
        assert data(ModelConfig()).train_on_what is TrainOnWhat.ALL_ASSISTANT_MESSAGES
    with pytest.raises(ValueError, match="every_token"):
        ChatData(train_on_what="every_token")  # type: ignore[arg-type]
