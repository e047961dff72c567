"""The data that flows through an RL loop: Completion -> Episode -> Group -> TrainBatch / SeedBatch.

A `Completion` is what the generator returns for one prompt. An `Episode` wraps it with everything the
rollout loop learns later (reward, reference logprobs, advantage) and knows how to turn itself into
tensors. `collate` stacks episodes into a `TrainBatch` for the trainer; `collate_seed` produces the
`(inputs, targets)` dict lists that torchforge's `apps/grpo/main.py` passes to its trainer, so code
written against the seed keeps working. `TextTrainBatch` and `ForwardBackwardResult` are the skill
card's trainer input and output.

forge_nb's own loops give episodes fixed lengths (`request_len`, `response_len`) rather than padding to
the longest member of a batch: the trainer then sees one shape per run, which keeps compiled graphs and
memory stable. Episodes built the documents' way (`Episode(prompt_ids=, response_ids=, reward=)`) have
no fixed lengths, and `collate` pads those to the longest of the batch.

`Completion` and `Completions` live in `forge_nb.rl.completion` (the generator's output, which knows
nothing of the loop) and are re-exported here; `Episode` stays with the `collate` that defines its
tensor layout.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable
from dataclasses import InitVar, dataclass, field, fields
from typing import Any, NamedTuple

import torch

from forge_nb.rl.completion import Completion, Completions

__all__ = [
    "Completion",
    "Completions",
    "Episode",
    "ForwardBackwardResult",
    "Group",
    "SeedBatch",
    "TextTrainBatch",
    "TrainBatch",
    "collate",
    "collate_seed",
]


def _fit(tensor: torch.Tensor, length: int, pad: float, *, left: bool) -> torch.Tensor:
    """Pad or truncate a 1-D tensor to `length`; `left` pads and truncates on the left."""
    n = tensor.shape[0]
    if n >= length:
        return tensor[n - length :] if left else tensor[:length]
    padding = tensor.new_full((length - n,), pad)
    return torch.cat([padding, tensor] if left else [tensor, padding])


def _check_len(name: str, value: Any) -> None:
    if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 1):
        raise ValueError(f"Episode.{name} must be an int >= 1 or None (its own length), got {value!r}")


@dataclass
class Episode:
    """One completion plus what the loop learned about it: reward, reference logprobs, advantage.

    Two ways to build one, both keyword-only in practice:

    - forge_nb's (and torchforge's apps/grpo): `Episode(episode_id=, pad_id=, request_len=,
      response_len=, completion=...)`, fixed lengths so every batch of a run has one shape;
    - the documents' generate_episode: `Episode(prompt_ids=c.prompt_ids, response_ids=c.token_ids,
      reward=r)`, which builds the Completion; the id is generated, the pad id is 0 and the lengths are
      the tensors' own (`collate` then pads to the longest episode of the batch).
    """

    episode_id: str = field(default_factory=lambda: uuid.uuid4().hex)
    pad_id: int = 0
    request_len: int | None = None
    """Fixed request length (longer prompts keep their last `request_len` tokens); None: its own."""
    response_len: int | None = None
    """Fixed response length (longer responses keep their first `response_len` tokens); None: its own."""
    target: Any | None = None
    completion: Completion | None = None
    ref_logprobs: torch.Tensor | None = None
    """Per response token logprobs under the reference model, 1-D (a [1, T] row is accepted)."""
    reward: float | None = None
    """Total reward: the mean over reward functions."""
    advantage: float | None = None
    """None until computed; a ReplayBuffer fills a missing one when it samples (see its docstring)."""
    rewards: dict[str, float] = field(default_factory=dict)
    """Reward per reward function, keyed by a readable name."""
    quarantine: str | None = None
    """Why this episode must not be learned from (a reward function failed), or None."""
    quarantine_error: BaseException | None = field(default=None, repr=False, compare=False)
    """The exception behind ``quarantine``, where the episode function kept it (an agent's): a run paused
    for such episodes shows its traceback. In this process only: never pickled."""
    policy_mask: torch.Tensor | None = None
    """1-D bool over the completion's token ids: True where the policy generated the token. A multi-turn
    trajectory's response holds what the environment and tools said between the policy's turns too; those
    tokens are context, never trained (False). None: every token is the policy's."""
    prompt_ids: InitVar[Any] = None
    """Documents' form: the prompt token ids; builds `completion` with `response_ids`."""
    response_ids: InitVar[Any] = None
    """Documents' form: the generated token ids."""

    def __post_init__(self, prompt_ids: Any, response_ids: Any) -> None:
        _check_len("request_len", self.request_len)
        _check_len("response_len", self.response_len)
        if prompt_ids is None and response_ids is None:
            self._check_policy_mask()
            return
        if self.completion is not None:
            c = self.completion
            # dataclasses.replace() passes the properties below back in
            if prompt_ids is c.prompt_ids and response_ids is c.token_ids:
                return
            raise ValueError(
                "Episode got both completion= and prompt_ids=/response_ids=; pass one of the two"
            )
        if response_ids is None:
            raise ValueError("Episode(prompt_ids=...) also needs response_ids= (the generated token ids)")
        self.completion = Completion(text="", prompt_ids=prompt_ids, token_ids=response_ids)
        self._check_policy_mask()

    def __getstate__(self) -> dict[str, Any]:
        return {**self.__dict__, "quarantine_error": None}  # a traceback does not pickle, nor travel

    def _check_policy_mask(self) -> None:
        if self.policy_mask is None or self.completion is None:
            return
        self.policy_mask = torch.as_tensor(self.policy_mask, dtype=torch.bool)
        if self.policy_mask.shape != self.completion.token_ids.shape:
            raise ValueError(
                f"Episode.policy_mask has shape {tuple(self.policy_mask.shape)} but the response has "
                f"{tuple(self.completion.token_ids.shape)} tokens; give one flag per response token"
            )

    def _require_completion(self) -> Completion:
        if self.completion is None:
            raise ValueError(
                f"Episode {self.episode_id!r} has no completion yet; set episode.completion to the "
                "generator's Completion (or build it with prompt_ids= and response_ids=) before reading "
                "its tensors"
            )
        return self.completion

    @property
    def prompt(self) -> str | None:
        return None if self.completion is None else self.completion.prompt

    @property
    def policy_version(self) -> int | None:
        """The generator version of the completion; None when unknown."""
        return self._require_completion().generator_version

    def request_ids(self, length: int | None = None) -> torch.Tensor:
        """Prompt ids left-padded (or left-truncated) to `length` (default: `request_len`, else their
        own length), so the response starts at a fixed column."""
        ids = self._require_completion().prompt_ids
        assert ids is not None  # Completion.__post_init__ makes it a tensor
        length = length or self.request_len or ids.shape[0]
        return _fit(ids, length, self.pad_id, left=True)

    def response_ids_padded(self, length: int | None = None) -> torch.Tensor:
        """Generated ids right-padded (or truncated) to `length` (default: `response_len`, else own)."""
        ids = self._require_completion().token_ids
        return _fit(ids, length or self.response_len or ids.shape[0], self.pad_id, left=False)

    def mask(self, length: int | None = None) -> torch.Tensor:
        """True on the response tokens to train, over `length` columns: the real ones (built from the
        length rather than `!= pad_id`: when the pad id doubles as EOS, the generated EOS is a real token
        the loss must see) that the policy generated (see `policy_mask`)."""
        n_real = self._require_completion().token_ids.shape[0]
        length = length or self.response_len or n_real
        real = torch.arange(length) < min(n_real, length)
        if self.policy_mask is None:
            return real
        return real & _fit(self.policy_mask.to(torch.bool), length, False, left=False)

    @property
    def request_tensor(self) -> torch.Tensor:
        return self.request_ids()

    @property
    def response_tensor(self) -> torch.Tensor:
        return self.response_ids_padded()

    @property
    def response_mask(self) -> torch.Tensor:
        return self.mask()


# The documents read these back as attributes; the dataclass keeps them as init-only arguments (a
# second copy of the completion's tensors could go stale when `completion` is replaced).
Episode.prompt_ids = property(  # type: ignore[assignment,method-assign]
    lambda self: self._require_completion().prompt_ids, doc="The completion's prompt ids."
)
Episode.response_ids = property(  # type: ignore[assignment,method-assign]
    lambda self: self._require_completion().token_ids, doc="The completion's generated ids."
)

Group = list[Episode]
"""The G completions of one prompt, whose rewards are compared to get advantages."""


@dataclass
class TrainBatch:
    """Stacked tensors for one trainer step. Rows are episodes; response columns are aligned."""

    tokens: torch.Tensor
    """[B, request_len + response_len] long: request (left padded) then response (right padded)."""
    response: torch.Tensor
    """[B, response_len] long."""
    response_mask: torch.Tensor
    """[B, response_len] bool, True on generated tokens."""
    ref_logprobs: torch.Tensor
    """[B, response_len] float; zeros where an episode had none (see `has_ref_logprobs`)."""
    generator_logprobs: torch.Tensor
    """[B, response_len] float; zeros where the generator gave none (see `has_generator_logprobs`)."""
    advantages: torch.Tensor
    """[B, 1] float."""
    policy_versions: torch.Tensor
    """[B] long: the generator version of each episode, -1 where unknown."""
    request_len: int
    has_ref_logprobs: bool = True
    """False when any episode lacked reference logprobs: pass None to the loss and use beta=0."""
    has_generator_logprobs: bool = True
    """False when any completion lacked logprobs: pass None to the loss (on-policy ratio)."""

    def __len__(self) -> int:
        return self.tokens.shape[0]

    @property
    def response_len(self) -> int:
        return self.response.shape[1]

    def to(self, device: torch.device | str) -> TrainBatch:
        moved = {
            f.name: (v.to(device) if isinstance(v := getattr(self, f.name), torch.Tensor) else v)
            for f in fields(self)
        }
        return TrainBatch(**moved)

    def __reduce__(self) -> tuple[Any, tuple[Any, ...]]:
        """Pickled with its CPU tensors as numpy arrays, as Completions are: the controller sends one batch
        to the trainer every step, and torch's own pickling of its seven small tensors took 0.9 ms (dump
        and load) against 0.1 (the quickstart's batch of 16)."""
        values = [getattr(self, f.name) for f in fields(self)]
        as_numpy = tuple(i for i, v in enumerate(values) if _numpy_can_hold(v))
        for i in as_numpy:
            values[i] = values[i].numpy()  # shares the tensor's memory: pickling copies it once
        return _from_wire, (type(self), as_numpy, *values)


_NUMPY_DTYPES = frozenset({torch.bool, torch.uint8, torch.int8, torch.int16, torch.int32, torch.int64, torch.float16,
                           torch.float32, torch.float64})


def _numpy_can_hold(value: Any) -> bool:
    """A CPU tensor without autograd history of a dtype numpy has (not bfloat16, float8 ...)."""
    if not isinstance(value, torch.Tensor) or value.device.type != "cpu" or value.requires_grad:
        return False
    return value.dtype in _NUMPY_DTYPES


def _from_wire(cls: type, as_numpy: tuple[int, ...], *values: Any) -> Any:
    return cls(*(torch.from_numpy(v) if i in as_numpy else v for i, v in enumerate(values)))


@dataclass
class TextTrainBatch:
    """The skill card's training input: next-token targets with a mask and per-token weights.

    Shapes are [B, L]: `target_ids[:, t]` is the token position `t` of `input_ids` should predict.
    """

    input_ids: torch.Tensor
    """[B, L] long: the tokens fed to the model (prompt then response, padded)."""
    target_ids: torch.Tensor
    """[B, L] long: `input_ids` shifted left by one (the last column is padding)."""
    target_mask: torch.Tensor
    """[B, L] bool: True where the target is a generated token the loss trains on."""
    target_weights: torch.Tensor
    """[B, L] float: each target's weight, the episode's advantage on its response tokens, else 0."""

    def __post_init__(self) -> None:
        shape = self.input_ids.shape
        for name in ("target_ids", "target_mask", "target_weights"):
            if getattr(self, name).shape != shape:
                raise ValueError(
                    f"TextTrainBatch.{name} has shape {tuple(getattr(self, name).shape)} but input_ids has "
                    f"{tuple(shape)}; all four are [batch, seq_len]"
                )

    def __len__(self) -> int:
        return self.input_ids.shape[0]


@dataclass
class ForwardBackwardResult:
    """The skill card's result of one forward/backward (training) step."""

    loss: float
    """The loss of the step, a Python float."""
    metrics: dict[str, float] = field(default_factory=dict)
    """Scalars the loss and trainer report, e.g. {"kl": 0.01, "grad_norm": 1.2}."""
    rows: dict[str, list[Any]] = field(default_factory=dict)
    """Values per row of the batch, in its row order: ``"mismatch/token_ratios"``, each row's per-token ratio
    trainer / generator over its trained tokens (the explorer shows it). A list given among ``metrics`` moves here."""

    def __post_init__(self) -> None:
        for name in [k for k, v in self.metrics.items() if isinstance(v, list)]:
            self.rows[name] = self.metrics.pop(name)  # type: ignore[arg-type]

    def __getitem__(self, name: str) -> float:
        """``result["kl"]``: one of the metrics (forge_nb's trainer returned the metrics dict itself)."""
        return self.metrics[name]

    def __float__(self) -> float:
        return float(self.loss)

    def __format__(self, spec: str) -> str:
        """Formats as its loss, so the documents' ``print(f"Loss: {loss:.3f}")`` prints the loss."""
        return format(float(self.loss), spec)


class SeedBatch(NamedTuple):
    """torchforge's collate output, one entry per data-parallel rank: `inputs, targets = batch`."""

    inputs: list[dict[str, Any]]
    """inputs[rank] = {"tokens": [b, Lq + Lr] long}."""
    targets: list[dict[str, Any]]
    """targets[rank] = {"response": [b, Lr], "ref_logprobs": [b, Lr] or None when an episode had none,
    "advantages": [b, 1], "padding_mask": [b, Lr] bool}."""


def _per_token(values: torch.Tensor | None, length: int) -> torch.Tensor:
    if values is None:
        return torch.zeros(length)
    # reference models often return [1, T]; a [T] row is what we need
    return _fit(torch.as_tensor(values, dtype=torch.float32).reshape(-1), length, 0.0, left=False)


def _batch_len(episodes: list[Episode], name: str, own: Callable[[Episode], int]) -> int:
    """The shared fixed length, or the longest episode's own length when none has a fixed one."""
    fixed = {getattr(ep, name) for ep in episodes} - {None}
    if len(fixed) > 1 or (fixed and None in {getattr(ep, name) for ep in episodes}):
        shown = sorted((getattr(ep, name) or 0, ep.episode_id) for ep in episodes)
        raise ValueError(
            f"episodes disagree on {name} ({shown[:4]}...; 0 = not set); build all episodes of a run with "
            "the same max_req_tokens and max_res_tokens, or leave both unset everywhere"
        )
    return fixed.pop() if fixed else max(own(ep) for ep in episodes)


def collate(episodes: list[Episode]) -> TrainBatch:
    """Stack episodes into a TrainBatch: to their shared `request_len`/`response_len`, or, when they
    were built without fixed lengths, to the longest request and response of the batch."""
    if not episodes:
        raise ValueError("collate() got no episodes; sample at least one episode from the buffer")
    for ep in episodes:
        if ep.advantage is None:
            raise ValueError(
                f"Episode {ep.episode_id!r} has no advantage; call assign_advantages(group) on its group, "
                "or sample it from a ReplayBuffer, which fills missing advantages"
            )
    lq = _batch_len(episodes, "request_len", lambda ep: ep._require_completion().prompt_ids.shape[0])
    lr = _batch_len(episodes, "response_len", lambda ep: ep._require_completion().token_ids.shape[0])
    if lq == 0 or lr == 0:
        raise ValueError(
            f"collate() got episodes with {'no prompt ids' if lq == 0 else 'no response ids'}: every "
            "episode needs prompt_ids (the generator's Completion.prompt_ids) and response_ids"
        )
    request = torch.stack([ep.request_ids(lq) for ep in episodes])
    response = torch.stack([ep.response_ids_padded(lr) for ep in episodes])
    completions = [ep._require_completion() for ep in episodes]
    return TrainBatch(
        tokens=torch.cat([request, response], dim=1),
        response=response,
        response_mask=torch.stack([ep.mask(lr) for ep in episodes]),
        ref_logprobs=torch.stack([_per_token(ep.ref_logprobs, lr) for ep in episodes]),
        generator_logprobs=torch.stack([_per_token(c.logprobs, lr) for c in completions]),
        advantages=torch.tensor([[float(ep.advantage)] for ep in episodes]),  # type: ignore[arg-type]
        policy_versions=torch.tensor(
            [-1 if c.generator_version is None else c.generator_version for c in completions],
            dtype=torch.long,
        ),
        request_len=lq,
        has_ref_logprobs=all(ep.ref_logprobs is not None for ep in episodes),
        has_generator_logprobs=all(c.logprobs is not None for c in completions),
    )


def collate_seed(batches: list[Group]) -> SeedBatch:
    """torchforge's `collate`: one (inputs, targets) dict pair per data-parallel rank (see SeedBatch).

    Unlike the seed, ref_logprobs stays [b, Lr] when b == 1, is None (never zeros) when an episode has
    no reference logprobs, and padding_mask counts a generated pad/EOS token as real.
    """
    inputs: list[dict[str, Any]] = []
    targets: list[dict[str, Any]] = []
    for group in batches:
        batch = collate(group)
        inputs.append({"tokens": batch.tokens})
        targets.append(
            {
                "response": batch.response,
                "ref_logprobs": batch.ref_logprobs if batch.has_ref_logprobs else None,
                "advantages": batch.advantages,
                "padding_mask": batch.response_mask,
            }
        )
    return SeedBatch(inputs, targets)
