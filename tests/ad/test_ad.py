"""Algorithm distillation (``tempering.ad``): learning histories in the trajectory log format and
their checks, the dataset in both formats, the RL-format model's training (run directory, exact
resume, spaces checked first), and the in-context evaluation; the recipe end to end at a tiny
budget is in tests/recipes/test_algorithm_distillation.py. The measured figures are in
docs/recipes/algorithm-distillation.md, not asserted here."""

from __future__ import annotations

import json
import pickle
import re
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch

from tempering.ad import (
    ADModelConfig,
    ADTrainConfig,
    BanditFamily,
    DarkRoomFamily,
    GuessNumberFamily,
    HistoryDataset,
    HistoryError,
    SpaceMismatchError,
    WindowTooLongError,
    cumulative_regret,
    evaluate_in_context,
    random_curve,
    read_histories,
    source_curve,
    train_ad,
    write_chat_jsonl,
    write_histories,
)
from tempering.ad.language import check_transcripts_fit
from tempering.backend import load_tokenizer
from tempering.renderers import get_renderer
from tempering.rl.trajectory_files import read_trajectories
from tempering.training import RunDir
from tempering_protocols import InContextTaskFamily, SupervisedExample

FAMILIES = [BanditFamily(), DarkRoomFamily(size=5, horizon=6), GuessNumberFamily()]


@pytest.mark.parametrize("family", FAMILIES, ids=lambda f: f.name)
def test_families_follow_the_protocol_and_pickle(family: InContextTaskFamily) -> None:
    assert isinstance(family, InContextTaskFamily)
    assert pickle.loads(pickle.dumps(family)) == family
    names = {family.describe_action(a) for a in range(family.n_actions)}
    assert len(names) == family.n_actions  # the language format tells actions apart


def test_a_familys_horizon_is_its_config_field() -> None:
    room = DarkRoomFamily(size=5, horizon=6)
    assert (room.name, room.n_states, room.n_actions) == ("darkroom", 25, 5)
    assert (room.horizon, room.task(0, False).horizon) == (6, 6)
    guess = GuessNumberFamily(high=8, horizon=3)
    assert (guess.name, guess.n_states, guess.n_actions) == ("guess-number", 4, 8)
    assert (guess.horizon, guess.task(0, False).horizon) == (3, 3)
    with pytest.raises(ValueError, match="horizon >= 1"):
        DarkRoomFamily(horizon=0)


def test_histories_round_trip_in_task_episode_step_order(tmp_path: Path) -> None:
    family = DarkRoomFamily(size=5, horizon=6)
    rl_dir = write_histories(family, tmp_path / "h", n_tasks=3, n_episodes=4, seed=1)
    table = read_trajectories(tmp_path / "h")  # the plain trajectory log reader reads it too
    assert table.num_rows == 3 * 4 * 6
    keys = list(zip(*(table.column(c).to_pylist() for c in ("group", "step", "turn")), strict=True))
    assert keys == sorted(keys)
    h = read_histories(rl_dir)
    assert h.n_tasks == 3
    assert h.horizon == 6
    assert h.returns_NE().shape == (3, 4)
    assert np.allclose(h.returns_NE().sum(), table.column("reward").to_numpy().sum())


def _rewrite(path: Path, edit: str) -> None:
    rows = pq.read_table(path).to_pylist()
    if edit == "gap":
        del rows[3]
    elif edit == "duplicate":
        rows.insert(3, dict(rows[3]))
    pq.write_table(pa.Table.from_pylist(rows, schema=pq.read_schema(path)), path)


@pytest.mark.parametrize(
    ("edit", "message"), [("gap", "row 3: gap"), ("duplicate", "row 4: duplicated step")]
)
def test_gaps_and_duplicates_name_file_and_row(tmp_path: Path, edit: str, message: str) -> None:
    rl_dir = write_histories(BanditFamily(), tmp_path / "h", n_tasks=2, n_episodes=10, seed=0)
    part = rl_dir / "step-000001.parquet"
    _rewrite(part, edit)
    with pytest.raises(HistoryError, match=f"{part}: {message} in task 1"):
        read_histories(tmp_path / "h")


def test_interleaved_tasks_name_file_and_row(tmp_path: Path) -> None:
    rl_dir = write_histories(BanditFamily(), tmp_path / "h", n_tasks=3, n_episodes=5, seed=0)
    # task 0's part written again after task 1's: task 0's rows would share a window with task 1's
    (rl_dir / "step-000002.parquet").write_bytes((rl_dir / "step-000000.parquet").read_bytes())
    with pytest.raises(
        HistoryError, match=r"step-000002\.parquet: row 0: task 0 again after rows of another"
    ):
        read_histories(tmp_path / "h")


def test_dataset_serves_both_formats_from_the_same_files(tmp_path: Path) -> None:
    family = DarkRoomFamily(size=5, horizon=6)
    h = read_histories(write_histories(family, tmp_path / "h", n_tasks=2, n_episodes=5, seed=0))
    rl = HistoryDataset(h, window=12, stride=6)
    assert len(rl) == 2 * 4  # windows start at episodes 0..3 of each task
    item = rl.tensors(5)
    assert [item[k].shape for k in ("states", "actions", "rewards", "logprobs")] == [torch.Size([12])] * 4
    assert item["states"][0] == family.task(0, False).start  # a window starts at an episode start
    assert (item["logprobs"] <= 0).all()
    renderer = get_renderer("chatml", load_tokenizer("tempering/tiny"))
    lang = HistoryDataset(h, window=12, stride=6, fmt="language", family=family, renderer=renderer)
    messages = lang.messages(5)
    actions = [m["content"] for m in messages if m["role"] == "assistant"]
    assert actions == [family.describe_action(int(a)) for a in item["actions"]]
    assert sum("Episode starts." in str(m["content"]) for m in messages) == 2
    example = lang[5]
    assert isinstance(example, SupervisedExample)
    assert example.weights.sum() > 0
    rows = (
        (tmp_path / "chat.jsonl", write_chat_jsonl(lang, tmp_path / "chat.jsonl"))[1].read_text().splitlines()
    )
    assert len(rows) == len(lang)
    assert json.loads(rows[5])["messages"] == messages
    final = HistoryDataset(h, window=12, stride=6, episodes="final", final_episodes=2)
    assert len(final) == 2
    assert int(final.starts_W[0]) == 3 * 6


def test_window_longer_than_context(tmp_path: Path) -> None:
    h = read_histories(write_histories(BanditFamily(), tmp_path / "h", n_tasks=1, n_episodes=30, seed=0))
    with pytest.raises(
        WindowTooLongError, match="window of 20 transitions is longer than the model's context of 10"
    ):
        HistoryDataset(h, window=20, max_context=10)
    assert HistoryDataset(h, window=20, max_context=10, truncate=True).window == 10
    with pytest.raises(WindowTooLongError, match="fewer than a window of 40"):
        HistoryDataset(h, window=40)
    config = ADTrainConfig(
        log_dir=str(tmp_path / "m"), model=ADModelConfig(n_states=1, n_actions=5, context=10), steps=2
    )
    with pytest.raises(WindowTooLongError, match="longer than the model's context of 10"):
        train_ad(config, HistoryDataset(h, window=20), n_states=1, n_actions=5)
    assert not (tmp_path / "m").exists()


def test_darkroom_transcripts_of_two_episodes_fit_the_tiny_models_context(tmp_path: Path) -> None:
    """Dark Room's cells are ``(row,col)`` in text: a window of 2 episodes (40 transitions, the
    recipe's default with ``--format language``) fits the tiny model's 2048 tokens; 4 episodes
    (the RL format's 80) do not, and the error says how many transitions fit."""
    family = DarkRoomFamily()
    h = read_histories(write_histories(family, tmp_path / "h", n_tasks=2, n_episodes=4, seed=0))
    renderer = get_renderer("chatml", load_tokenizer("tempering/tiny"))
    assert [family.describe_state(s) for s in (0, 40, 80)] == ["(0,0)", "(4,4)", "(8,8)"]
    two = HistoryDataset(h, window=40, stride=20, fmt="language", family=family)
    messages = two.messages(1)
    assert messages[1]["content"] == "Episode starts. (4,4)"
    assert all(re.fullmatch(r"Reward [01]\. \(\d,\d\)", str(m["content"])) for m in messages[3:41:2])
    assert 1500 < check_transcripts_fit(two, renderer, 2048) <= 2048
    four = HistoryDataset(h, window=80, stride=20, fmt="language", family=family)
    with pytest.raises(
        WindowTooLongError, match=r"a window of 80 transitions is 3\d{3} tokens .*\(about 4\d transitions fit"
    ):
        check_transcripts_fit(four, renderer, 2048)


def test_spaces_that_do_not_match_the_heads_fail_before_training(tmp_path: Path) -> None:
    family = BanditFamily(n_arms=5, source="ucb")  # UCB pulls every arm first
    h = read_histories(write_histories(family, tmp_path / "h", n_tasks=1, n_episodes=10, seed=0))
    config = ADTrainConfig(
        log_dir=str(tmp_path / "m"), model=ADModelConfig(n_states=1, n_actions=3, context=10), steps=2
    )
    with pytest.raises(
        SpaceMismatchError, match="5 actions, but the model's heads have 1 states and 3 actions"
    ):
        train_ad(config, HistoryDataset(h, window=10), n_states=1, n_actions=5)
    # a family that claims 3 arms over a history that pulled arm 4: caught from the data
    with pytest.raises(SpaceMismatchError, match="action 4 in the history"):
        train_ad(config, HistoryDataset(h, window=10), n_states=1, n_actions=3)
    assert not (tmp_path / "m").exists()


def _train(tmp_path: Path, h_dir: Path, steps: int) -> torch.nn.Module:
    h = read_histories(h_dir)
    config = ADTrainConfig(
        log_dir=str(tmp_path / "m"), model=ADModelConfig(n_states=1, n_actions=5, context=16, d_model=16),
        steps=steps, batch_size=4, save_every=3, device="cpu",
    )  # fmt: skip
    return train_ad(config, HistoryDataset(h, window=16, stride=4), n_states=1, n_actions=5)


def test_training_writes_a_run_directory_and_resumes_exactly(tmp_path: Path) -> None:
    h_dir = write_histories(BanditFamily(), tmp_path / "h", n_tasks=4, n_episodes=24, seed=0)
    straight = _train(tmp_path / "a", h_dir, 7)
    run = RunDir(tmp_path / "a" / "m")
    lines = run.read_metrics()
    assert [m["step"] for m in lines] == list(range(7))
    assert {"train/loss", "train/action_accuracy", "train/lr"} <= set(lines[0])
    assert [c.step for c in run.checkpoints()] == [3, 6, 7]
    assert run.checkpoints()[-1].final

    # killed after step 4: the index holds step 3's checkpoint, the metrics one line more
    _train(tmp_path / "b", h_dir, 7)
    b = RunDir(tmp_path / "b" / "m")
    b.replace_checkpoints(b.checkpoints()[:1])
    b.truncate_metrics(5)
    resumed = _train(tmp_path / "b", h_dir, 7)
    assert [m["train/loss"] for m in b.read_metrics()] == [m["train/loss"] for m in lines]
    for p, q in zip(straight.parameters(), resumed.parameters(), strict=True):
        assert torch.equal(p, q)


def test_in_context_evaluation_and_baselines() -> None:
    family = BanditFamily()
    seeds = range(8)
    thompson = source_curve(family, seeds, 60)
    rand = random_curve(family, seeds, 60)
    assert thompson.shape == rand.shape == (8, 60)
    assert cumulative_regret(family, seeds, thompson).mean() < cumulative_regret(family, seeds, rand).mean()
    from tempering.ad import ADTransformer

    torch.manual_seed(0)
    model = ADTransformer(ADModelConfig(n_states=1, n_actions=5, context=16, d_model=16))
    returns = evaluate_in_context(model, family, seeds, 30)  # 30 pulls: the context slides
    assert returns.shape == (8, 30)
    assert ((returns >= 0) & (returns <= 1)).all()
    with pytest.raises(SpaceMismatchError, match="darkroom: 81 states"):
        evaluate_in_context(model, DarkRoomFamily(), seeds, 2)


@pytest.mark.parametrize("feed", [False, True])
def test_logprobs_reach_the_model_only_when_fed(feed: bool) -> None:
    from tempering.ad import ADTransformer

    torch.manual_seed(0)
    model = ADTransformer(ADModelConfig(n_states=3, n_actions=4, context=8, d_model=16, feed_logprobs=feed))
    s, a, r = torch.randint(3, (2, 8)), torch.randint(4, (2, 8)), torch.rand(2, 8)
    with torch.no_grad():
        one = model(s, a, r, torch.zeros(2, 8)).action_logits_BTA
        two = model(s, a, r, -torch.ones(2, 8)).action_logits_BTA
    assert torch.equal(one[:, 0], two[:, 0])  # the first state token sees no logprob
    assert torch.equal(one, two) != feed


@pytest.mark.parametrize(
    ("tokens", "previous_state"), [("transition", False), ("transition", True), ("sar", False)]
)
def test_the_model_is_causal_and_never_sees_the_action_it_predicts(tokens: str, previous_state: bool) -> None:
    from tempering.ad import ADTransformer

    torch.manual_seed(0)
    config = ADModelConfig(
        n_states=3,
        n_actions=4,
        context=8,
        d_model=16,
        tokens=tokens,
        previous_state=previous_state,  # type: ignore[arg-type]
    )
    model = ADTransformer(config).eval()
    s, a, r, lp = torch.randint(3, (2, 8)), torch.randint(4, (2, 8)), torch.rand(2, 8), torch.zeros(2, 8)
    a2, r2 = a.clone(), r.clone()
    a2[:, 4], r2[:, 4] = (a[:, 4] + 1) % 4, r[:, 4] + 1.0  # transition 4's action and reward
    with torch.no_grad():
        one, two = model(s, a, r, lp), model(s, a2, r2, lp)
    assert torch.equal(one.action_logits_BTA[:, :5], two.action_logits_BTA[:, :5])  # a_4 unseen at 4
    assert not torch.allclose(one.action_logits_BTA[:, 5:], two.action_logits_BTA[:, 5:])
    assert one.reward_BT.shape == one.logprob_BT.shape == (2, 8)
    assert one.state_logits_BTS.shape == (2, 8, 3)


class _Recorder(torch.nn.Module):
    """Wraps a model and records the context length of every call."""

    def __init__(self, model: torch.nn.Module) -> None:
        super().__init__()
        self.model, self.lengths = model, list[int]()
        self.config = model.config

    def forward(self, *args: torch.Tensor) -> object:
        self.lengths.append(args[0].shape[1])
        return self.model(*args)


def test_the_evaluation_context_starts_at_an_episode_start_like_training_windows() -> None:
    from tempering.ad import ADTransformer

    family = DarkRoomFamily(size=5, horizon=6)
    model = ADTransformer(ADModelConfig(n_states=25, n_actions=5, context=12, d_model=16))
    recorder = _Recorder(model)
    evaluate_in_context(recorder, family, [0, 1], 4)  # type: ignore[arg-type]
    # steps 0..11 grow the context from episode 0's start; then it starts at episode 1's, 2's
    expected = list(range(1, 13)) + [7 + k for k in range(6)] + [7 + k for k in range(6)]
    assert recorder.lengths == expected


def test_grid_states_are_a_row_embedding_plus_a_column_embedding() -> None:
    from tempering.ad import ADTransformer

    torch.manual_seed(0)
    grid = ADTransformer(ADModelConfig(n_states=12, n_actions=5, context=8, d_model=16, grid_width=4))
    cells = ADTransformer(ADModelConfig(n_states=12, n_actions=5, context=8, d_model=16))
    with torch.no_grad():
        # (row 0, col 1) + (row 2, col 3) = (row 0, col 3) + (row 2, col 1): cells 1 + 11 = 3 + 9
        for model, additive in ((grid, True), (cells, False)):
            e = model.state_emb(torch.tensor([1, 11, 3, 9]))
            assert torch.allclose(e[0] + e[1], e[2] + e[3], atol=1e-5) == additive
    n_grid, n_cells = (sum(p.numel() for p in m.state_emb.parameters()) for m in (grid, cells))
    assert (n_grid, n_cells) == ((3 + 4) * 16, 12 * 16)


class _SplitRecorder:
    """A Dark Room family that records the split of every task it makes."""

    def __init__(self, family: DarkRoomFamily) -> None:
        self.family, self.splits = family, list[bool]()
        self.name, self.n_states, self.n_actions = family.name, family.n_states, family.n_actions
        self.horizon = family.horizon

    def task(self, seed: int, held_out: bool, /) -> object:
        self.splits.append(held_out)
        return self.family.task(seed, held_out)


def test_evaluation_plays_the_training_split_when_asked() -> None:
    from tempering.ad import ADTransformer

    family = _SplitRecorder(DarkRoomFamily(size=5, horizon=6))
    model = ADTransformer(ADModelConfig(n_states=25, n_actions=5, context=12, d_model=16))
    evaluate_in_context(model, family, [0, 1], 1)  # type: ignore[arg-type]
    evaluate_in_context(model, family, [0, 1], 1, held_out=False)  # type: ignore[arg-type]
    assert family.splits == [True, True, False, False]


def test_model_config_names_bad_options() -> None:
    with pytest.raises(ValueError, match="grid_width must be 0 or a divisor of n_states 81, got 4"):
        ADModelConfig(n_states=81, n_actions=5, context=8, grid_width=4)
    with pytest.raises(ValueError, match="previous_state needs tokens='transition'"):
        ADModelConfig(n_states=3, n_actions=4, context=8, tokens="sar", previous_state=True)
    with pytest.raises(ValueError, match="tokens must be 'transition' or 'sar', got 'sars'"):
        ADModelConfig(n_states=3, n_actions=4, context=8, tokens="sars")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="label_smoothing and dropout must be in"):
        ADModelConfig(n_states=3, n_actions=4, context=8, label_smoothing=1.0)


def test_the_bandit_oracle_pulls_the_best_arm_and_has_no_regret(tmp_path: Path) -> None:
    oracle = BanditFamily(source="oracle")
    histories = read_histories(write_histories(oracle, tmp_path / "h", n_tasks=3, n_episodes=20, seed=0))
    for n in range(3):
        rows = slice(int(histories.starts_N1[n]), int(histories.starts_N1[n + 1]))
        best = int(oracle.task(n, False).probs_K.argmax())  # task seeds 0, 1, 2 (seed 0)
        assert (histories.action_R[rows] == best).all()
        assert (histories.logprob_R[rows] == 0).all()
    assert (cumulative_regret(oracle, range(6), source_curve(oracle, range(6), 20)) == 0).all()
    with pytest.raises(TypeError, match=r"source='oracle'\): needs a BanditTask, got DarkRoomTask"):
        oracle.learner(DarkRoomFamily().task(0, False), 0)
