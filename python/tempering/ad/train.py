"""Training the RL-format model on a :class:`~tempering.ad.dataset.HistoryDataset`, in a tempering
run directory (``config.json``, ``metrics.jsonl``, ``checkpoints.jsonl``; ``tempering view``
shows its ``train/…`` curves), resumable exactly: step ``s``'s batch is drawn from a generator
seeded by ``(seed, s)``, and a checkpoint holds the weights and the optimizer state.

Device: ``device`` (``"cpu"``, ``"cuda"``), else the local engine's choice
(``TEMPERING_DEVICE``, else CUDA when available).

Example::

    config = ADTrainConfig(log_dir="runs/ad/model", steps=2000, batch_size=32)
    model = train_ad(config, dataset, ADModelConfig(n_states=81, n_actions=5, context=80))
"""

from __future__ import annotations

import math
import time

import attrs
import torch

from tempering.ad.dataset import HistoryDataset, WindowTooLongError
from tempering.ad.model import ADModelConfig, ADTransformer, SpaceMismatchError, check_spaces
from tempering.local.model import resolve_placement
from tempering.training import CheckpointRecord, IfExists, RunDir

__all__ = ["ADTrainConfig", "load_model", "train_ad"]


@attrs.frozen(kw_only=True)
class ADTrainConfig:
    """How the RL-format model is trained (AdamW, linear warmup then cosine decay).

    Example::

        ADTrainConfig(log_dir="runs/ad/model", steps=500, batch_size=16, learning_rate=1e-3)
    """

    log_dir: str
    model: ADModelConfig
    steps: int = 1000
    batch_size: int = 32
    learning_rate: float = 1e-3
    weight_decay: float = 0.01
    warmup_steps: int = 50
    save_every: int = 250
    log_every: int = 1
    """Steps between lines of ``metrics.jsonl`` (each line is synced to disk, a cost per line
    comparable to a small model's step on a busy CPU; the recipe logs every 10 steps)."""
    seed: int = 0
    device: str | None = None
    if_exists: IfExists = "resume"
    data: str = ""
    """Where the training windows come from (recorded in ``config.json``; a resume must match)."""

    def __attrs_post_init__(self) -> None:
        for name in ("steps", "batch_size", "save_every", "log_every"):
            if getattr(self, name) < 1:
                raise ValueError(f"ADTrainConfig.{name} must be >= 1, got {getattr(self, name)}")


def _lr(config: ADTrainConfig, step: int) -> float:
    warm = min(config.warmup_steps, config.steps // 10)
    if step < warm:
        return config.learning_rate * (step + 1) / warm
    progress = (step - warm) / max(1, config.steps - warm)
    return config.learning_rate * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * progress)))


def _batch(
    dataset: HistoryDataset, config: ADTrainConfig, step: int, device: torch.device
) -> dict[str, torch.Tensor]:
    gen = torch.Generator().manual_seed(config.seed * 1_000_003 + step)
    index = torch.randint(len(dataset), (config.batch_size,), generator=gen).tolist()
    items = [dataset.tensors(i) for i in index]
    return {k: torch.stack([it[k] for it in items]).to(device) for k in items[0]}


def _save(run: RunDir, model: ADTransformer, opt: torch.optim.Optimizer, step: int, *, final: bool) -> None:
    path = run.path / "checkpoints" / f"step-{step:06d}.pt"
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name("." + path.name)
    torch.save({"model": model.state_dict(), "optimizer": opt.state_dict(), "step": step}, tmp)
    tmp.rename(path)
    name = "final" if final else f"step-{step:06d}"
    run.add_checkpoint(CheckpointRecord(name, step, 0, step, str(path), str(path), final))


def load_model(path: str, config: ADModelConfig, device: str | None = None) -> ADTransformer:
    """The model saved at ``path`` (a checkpoint of :func:`train_ad`), in eval mode."""
    model = ADTransformer(config)
    state = torch.load(path, map_location="cpu", weights_only=True)
    model.load_state_dict(state["model"])
    return model.to(resolve_placement(device).device).eval()


def train_ad(
    config: ADTrainConfig, dataset: HistoryDataset, *, n_states: int, n_actions: int, progress: bool = False
) -> ADTransformer:
    """Train (or resume training) the model of ``config.model`` on ``dataset``'s windows; returns
    it in eval mode. ``n_states`` / ``n_actions``: the task's spaces, checked against the heads
    (:class:`~tempering.ad.model.SpaceMismatchError`) and the windows against the context
    (:class:`~tempering.ad.dataset.WindowTooLongError`) before any step.

    Example::

        model = train_ad(config, HistoryDataset(h, window=100), n_states=1, n_actions=5)
    """
    check_spaces(config.model, n_states=n_states, n_actions=n_actions, what=dataset.histories.source)
    h = dataset.histories
    top_state, top_action = int(h.state_R.max()), int(h.action_R.max())
    if top_state >= config.model.n_states or top_action >= config.model.n_actions:
        raise SpaceMismatchError(
            f"{h.source}: state {top_state} and action {top_action} in the history (its largest), but "
            f"the model's heads have {config.model.n_states} states and {config.model.n_actions} "
            "actions; the task family does not describe this history"
        )
    if dataset.window > config.model.context:
        raise WindowTooLongError(
            f"{h.source}: windows of {dataset.window} transitions, longer than the model's context of "
            f"{config.model.context}; build the dataset with max_context={config.model.context}"
        )
    device = resolve_placement(config.device).device
    torch.manual_seed(config.seed)
    model = ADTransformer(config.model).to(device)
    opt = torch.optim.AdamW(model.parameters(), lr=config.learning_rate, weight_decay=config.weight_decay)
    run, resumed = RunDir.open(
        config.log_dir, config, config.if_exists, ignore_on_resume=frozenset({"device"})
    )
    start = 0
    last = run.last_checkpoint() if resumed else None
    if last is not None:
        try:
            state = torch.load(last.state_path, map_location=device, weights_only=True)
        except (OSError, RuntimeError) as exc:
            raise run.unreadable_checkpoint(last, exc) from exc
        model.load_state_dict(state["model"])
        opt.load_state_dict(state["optimizer"])
        start = int(state["step"])
    run.truncate_metrics(start)
    model.train()
    t0 = time.monotonic()
    for step in range(start, config.steps):
        for group in opt.param_groups:
            group["lr"] = _lr(config, step)
        losses = model.losses(_batch(dataset, config, step, device))
        opt.zero_grad(set_to_none=True)
        losses["loss"].backward()
        norm = torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        done = step + 1
        if step % config.log_every == 0 or done == config.steps:
            line: dict[str, float | int] = {"step": step, "train/lr": _lr(config, step)}
            line |= {f"train/{k}": float(v.detach()) for k, v in losses.items()}
            line |= {"train/grad_norm": float(norm), "time/elapsed": time.monotonic() - t0}
            run.append_metrics(line)
            if progress and (step % 100 == 0 or done == config.steps):
                print(
                    f"  step {step}/{config.steps} loss {line['train/loss']:.4f} "
                    f"acc {line['train/action_accuracy']:.3f}"
                )
        if done % config.save_every == 0 and done < config.steps:
            _save(run, model, opt, done, final=False)
    final = run.last_checkpoint()
    if final is None or not final.final or final.step != config.steps:
        _save(run, model, opt, config.steps, final=True)
    return model.eval()
