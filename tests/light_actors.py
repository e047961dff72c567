"""Light actors for the controller's fast tests: a categorical policy instead of vLLM and a language model.

They are real ``ForgeActor``s on real monarch meshes, spawned by ``forge_nb.spawn(cfg, actors=...)``
with the keyword arguments the real Generator and RLTrainer get, and they move real weights through
torchstore under the run's namespace. The policy is a table of logits, one row per response
position, over the toy task's alphabet: generating is sampling one character per position, training
is one REINFORCE step on that table. Everything the controller does (loops, backpressure,
pause/step/stop, hot changes, weight sync, a killed process, shutdown) runs as with the real actors,
in seconds instead of minutes.
"""

from __future__ import annotations

import asyncio
import glob
import os
import sys
import time
from typing import Any

import torch

from forge_nb import weights
from forge_nb.rl import Completion, ForwardBackwardResult
from forge_nb.rl.types import Completions
from forge_nb.service import ForgeActor, endpoint

ALPHABET = "abcdefgh"


def _ids(text: str) -> torch.Tensor:
    return torch.tensor([ALPHABET.index(c) + 1 if c in ALPHABET else 0 for c in text], dtype=torch.long)


class LightGenerator(ForgeActor):
    """Samples ``n`` responses of ``max_tokens`` characters from its logits table."""

    needs_store = True

    def __init__(self, *, model: str = "", engine_args: dict[str, Any] | None = None,
                 sampling_params: dict[str, Any] | None = None, weights_namespace: str = "policy",
                 generate_delay_s: float = 0.0):
        self.sampling = {"n": 4, "max_tokens": 4, "temperature": 1.0, **(sampling_params or {})}
        self.namespace, self.delay_s = weights_namespace, generate_delay_s
        self.update_delay_s = float((engine_args or {}).get("update_delay_s", 0.0))  # a test's knob
        self.update_spans: list[tuple[float, float]] = []  # (start, end) of each update, in time.time()
        self.logits = torch.zeros(int(self.sampling["max_tokens"]), len(ALPHABET))
        print(f"LightGenerator: ready in process {os.getpid()}", file=sys.stderr)  # as an engine's log would
        self.version = 0

    @endpoint
    async def generate(self, prompt: str, **overrides: Any) -> Completions:
        params = {**self.sampling, **overrides}
        n, length = int(params["n"]), int(params["max_tokens"])
        temperature = max(float(params["temperature"]), 1e-3)
        if self.delay_s:
            await asyncio.sleep(self.delay_s)
        dist = torch.distributions.Categorical(logits=self.logits[:length] / temperature)
        out = []
        for _ in range(n):
            tokens = dist.sample()
            text = "".join(ALPHABET[i] for i in tokens.tolist())
            out.append(Completion(text=text, token_ids=tokens + 1, logprobs=dist.log_prob(tokens), prompt=prompt,
                                  prompt_ids=_ids(prompt), stop_reason="length", generator_version=self.version))
        return Completions(out)

    @endpoint
    async def update_weights(self, version: int) -> int:  # no manifest=, as the documents' generators
        return await self._load(version)

    async def _load(self, version: int, manifest: dict[str, Any] | None = None) -> int:
        start = time.time()
        if self.update_delay_s:
            await asyncio.sleep(self.update_delay_s)
        with await weights.open_version(version, namespace=self.namespace, manifest=manifest) as state_dict:
            self.logits.copy_(state_dict["logits"])
        self.version = version
        self.update_spans.append((start, time.time()))
        return version

    @endpoint
    async def get_update_spans(self) -> list[tuple[float, float]]:
        return self.update_spans

    @endpoint
    async def get_version(self) -> int:
        return self.version


class HandedLightGenerator(LightGenerator):
    """A LightGenerator whose ``update_weights`` takes the push's manifest, as forge_nb's Generator does."""

    def __init__(self, **kwargs: Any):
        super().__init__(**kwargs)
        self.handed: list[int] = []  # versions opened from a handed manifest, without asking torchstore

    @endpoint
    async def update_weights(self, version: int, manifest: dict[str, Any] | None = None) -> int:
        if weights.handed_version(version, self.namespace, manifest) is not None:
            self.handed.append(version)
        return await self._load(version, manifest)

    @endpoint
    async def get_handed(self) -> list[int]:
        return self.handed


class LightTrainer(ForgeActor):
    """One REINFORCE step per ``train_step`` on the logits table; checkpoints are small torch files."""

    needs_store = True

    def __init__(self, *, model: str = "", pad_id: int = 0, weights_namespace: str = "policy", trainer: Any = None,
                 training: dict[str, Any] | None = None, checkpoint: dict[str, Any] | None = None,
                 max_tokens: int = 4, step_delay_s: float = 0.0, fail_at_step: int | None = None, **_ignored: Any):
        extra = getattr(trainer, "extra", {}) or {}  # a test's knobs ride in TrainerConfig.extra
        step_delay_s = float(extra.get("step_delay_s", step_delay_s))
        self.namespace, self.delay_s, self.fail_at_step = weights_namespace, step_delay_s, fail_at_step
        self.folder = (checkpoint or {}).get("folder")
        # the names the real trainer holds (lr, weight_decay, max_norm) and the sampling temperature it follows
        opt, sections = getattr(trainer, "optimizer", None), getattr(trainer, "training", None)
        self.hp = {"lr": float(getattr(opt, "lr", 0.5)), "weight_decay": float(getattr(opt, "weight_decay", 0)),
                   "max_norm": float(getattr(sections, "max_norm", 1.0)),
                   "temperature": float((training or {}).get("temperature", 1.0))}
        self.logits = torch.zeros(max_tokens, len(ALPHABET), requires_grad=True)
        self.step = 0
        self.unannounced = 0  # pushes that left the manifest's torchstore put to the controller

    @endpoint
    async def setup(self) -> None:
        """Load the last checkpoint, as the real trainer does when its service respawns it."""
        saved = sorted(glob.glob(os.path.join(self.folder or "", "light-*.pt")))
        if self.folder and saved:
            state = torch.load(saved[-1])
            with torch.no_grad():
                self.logits.copy_(state["logits"])
            self.step = int(state["step"])

    @endpoint
    async def train_step(self, batch: Any) -> ForwardBackwardResult:
        if self.fail_at_step is not None and self.step + 1 == self.fail_at_step:
            raise RuntimeError(f"LightTrainer: asked to fail at step {self.fail_at_step}")
        started_at = time.time()
        if self.delay_s:
            await asyncio.sleep(self.delay_s)
        length = min(self.logits.shape[0], batch.response.shape[1])
        response = (batch.response[:, :length] - 1).clamp(0, len(ALPHABET) - 1)  # pads are masked out below
        mask = batch.response_mask[:, :length].float()
        logp = torch.log_softmax(self.logits[:length], -1).gather(1, response.T.contiguous()).T
        loss = -(batch.advantages * logp * mask).sum() / mask.sum().clamp(min=1)
        loss.backward()
        with torch.no_grad():
            grad_norm = float(self.logits.grad.norm())
            self.logits -= self.hp["lr"] * self.logits.grad * min(1.0, self.hp["max_norm"] / max(grad_norm, 1e-9))
            self.logits.grad = None
        self.step += 1
        loss = float(loss.detach())
        return ForwardBackwardResult(loss=loss, metrics={"loss": loss, "grad_norm": grad_norm,
                                                                "lr": self.hp["lr"], "tokens": float(mask.sum()),
                                                                "started_at": started_at})

    @endpoint
    async def push_weights(self, version: int, announce: bool = True) -> dict[str, Any]:
        # where the version lies, as RLTrainer returns it: handed on to generators whose update_weights takes
        # it, and then (announce=False) put in torchstore by the controller, not here
        manifest = await weights.push_state_dict({"logits": self.logits.detach()}, version, namespace=self.namespace,
                                                 announce=announce)
        self.unannounced += 0 if announce else 1
        return {"manifest": manifest, "announced": announce} if manifest is not None else {}

    @endpoint
    async def set_hparams(self, **changes: Any) -> dict[str, tuple[Any, Any]]:
        unknown = set(changes) - set(self.hp)
        if unknown:
            raise ValueError(f"set_hparams got unknown name(s) {sorted(unknown)}; known: {sorted(self.hp)}")
        if changes.get("lr", 0) > 10:  # a value the config allows and this trainer refuses
            raise ValueError(f"LightTrainer: lr={changes['lr']} is more than this trainer takes (10)")
        before = dict(self.hp)
        self.hp.update({k: float(v) for k, v in changes.items()})
        return {k: (before[k], self.hp[k]) for k in changes}

    @endpoint
    async def save_checkpoint(self, step: int | None = None) -> str:
        os.makedirs(self.folder, exist_ok=True)
        path = os.path.join(self.folder, f"light-{self.step:06d}.pt")
        torch.save({"logits": self.logits.detach().clone(), "step": self.step}, path + ".tmp")
        os.replace(path + ".tmp", path)
        return path

    @endpoint
    async def unannounced_pushes(self) -> int:
        return self.unannounced

    @endpoint
    async def info(self) -> dict[str, Any]:
        return {"step": self.step, "hparams": dict(self.hp)}

    @endpoint
    async def logits_sum(self) -> float:
        return float(self.logits.detach().sum())
