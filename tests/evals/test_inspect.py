"""A real inspect-ai task (a memory dataset, ``generate()``, the ``includes()`` scorer) run with
``inspect_ai.eval`` against the local engine's tiny model through the ``tempering`` provider.

The tiny model writes noise, so one sample's target is made from what the model will write
(sampled directly with the seed the provider derives for that prompt): it must be scored
correct, and the others (targets the model cannot write) incorrect. The log must hold the
model's real replies.
"""

from __future__ import annotations

import gc
import warnings
from collections.abc import Iterator
from pathlib import Path

import pytest
import tinker

pytest.importorskip("inspect_ai")

from inspect_ai import Task
from inspect_ai import eval as inspect_eval
from inspect_ai.dataset import MemoryDataset, Sample
from inspect_ai.model import get_model
from inspect_ai.scorer import includes
from inspect_ai.solver import generate

from tempering.backend import load_tokenizer
from tempering.evals.inspect_model import TemperingModelAPI, request_seed
from tempering.local import ServiceClient
from tempering.renderers import get_renderer

pytestmark = [
    pytest.mark.timeout(300),
    # inspect 0.3's retry config uses a tenacity argument tenacity deprecates
    pytest.mark.filterwarnings("ignore:The 'initial' parameter is deprecated:DeprecationWarning"),
    pytest.mark.filterwarnings("ignore:Unclosed <MemoryObject:ResourceWarning"),
]


@pytest.fixture(scope="module", autouse=True)
def _collect_inspect_garbage() -> Iterator[None]:
    """inspect leaves anyio memory streams unclosed; collect them here, where their
    ``ResourceWarning`` is ignored, so it cannot fire in another test or at the session's end."""
    yield
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ResourceWarning)
        gc.collect()


def test_an_inspect_task_runs_on_the_local_engine(
    service: ServiceClient, local_root: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("TINKER_API_KEY", raising=False)
    for key, value in (
        ("TEMPERING_HOME", str(local_root)),
        ("TEMPERING_DEVICE", "cpu"),
        ("TEMPERING_NUM_THREADS", "1"),
    ):
        monkeypatch.setenv(key, value)
    renderer = get_renderer("chatml", load_tokenizer("tempering/tiny"))
    sampler = service.create_sampling_client(base_model="tempering/tiny").result()
    prompt = renderer.build_generation_prompt([{"role": "user", "content": "Say something."}])
    params = tinker.SamplingParams(
        max_tokens=10,
        temperature=1.0,
        top_p=1.0,
        stop=renderer.get_stop_sequences(),
        seed=request_seed(7, prompt.to_ints(), 0),
    )
    (sequence,) = sampler.sample(prompt, 1, params).result().sequences
    expected = renderer.parse_response(sequence.tokens)[0]["content"]
    assert expected.strip()

    task = Task(
        dataset=MemoryDataset(
            [
                Sample(input="Say something.", target=expected.strip(), id="echo"),
                Sample(input="What is 2+2?", target="this-is-not-a-reply-of-the-tiny-model", id="other"),
            ]
        ),
        solver=generate(),
        scorer=includes(),
    )
    model = get_model("tempering/tempering/tiny", seed=7, memoize=False)
    assert isinstance(model.api, TemperingModelAPI)
    (log,) = inspect_eval(
        task, model=model, log_dir=str(tmp_path / "logs"), display="none", max_tokens=10, temperature=1.0
    )
    assert log.status == "success", log.error
    assert log.samples is not None
    by_id = {s.id: s for s in log.samples}
    assert by_id["echo"].output.completion == expected
    assert by_id["echo"].scores is not None
    assert by_id["echo"].scores["includes"].value == "C"
    other = by_id["other"]
    assert other.output.completion.strip(), "the model's real reply"
    assert other.scores is not None
    assert other.scores["includes"].value == "I"
    assert other.output.usage is not None
    assert other.output.usage.output_tokens > 0
    assert any((tmp_path / "logs").iterdir()), "inspect wrote its log where it was told"


def test_the_provider_refuses_unknown_model_args() -> None:
    with pytest.raises(ValueError, match=r"unknown model args \['colour'\]"):
        get_model("tempering/tempering/tiny", colour="red", memoize=False)


def test_the_package_declares_the_provider_entry_point() -> None:
    import importlib
    import tomllib

    pyproject = tomllib.loads((Path(__file__).parents[2] / "pyproject.toml").read_text())
    target = pyproject["project"]["entry-points"]["inspect_ai"]["tempering"]
    assert importlib.import_module(target).provider is not None
    assert any(d.startswith("inspect-ai") for d in pyproject["project"]["optional-dependencies"]["eval"])
