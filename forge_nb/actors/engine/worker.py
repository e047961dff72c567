"""vLLM specifics of the Generator: engine arguments, sampling parameters, outputs, weight loading.

``make_engine_args`` and ``make_sampling_params`` turn the Generator's dicts into vLLM objects, with
its defaults and errors that name the bad key (the benchmark uses them too, so raw vLLM runs with the
same settings).

``completions`` turns vLLM's output into Completions that cross to the caller as numpy arrays
(:class:`~forge_nb.rl.completion.WireCompletion`); what arrives is a plain Completion. Its text is decoded there,
once per sample (``response_text``, where ``decodes_here`` allows it), not by vLLM at every engine step.

:class:`TorchstoreWeightLoader` loads a policy version inside the engine's worker process. vLLM runs
the model in a worker: on GPUs (``AsyncLLM``) a process of its own, two below the Generator actor; on
CPU inside the actor's process (:mod:`forge_nb.actors.engine.inproc`). ``worker_extension_cls`` mixes
this class into vLLM's worker, and ``engine.collective_rpc("forge_nb_load_version", ...)`` calls it
there. The tensors never travel through vLLM's RPC: only a ~2 KB pickled reference to the kernel's
torchstore controller does, and the worker fetches the weights itself. Why a reference and not
``torchstore.client()``: a worker process is not a monarch process, so its first monarch call creates
a fresh root context whose ``get_or_spawn_controller`` would spawn an *empty* controller of its own;
given the kernel's controller reference, that same context reaches the kernel's controller and storage
volumes (measured with torchmonarch 0.7 and torchstore 0.1.2). Monarch futures need an event loop and vLLM
calls the worker synchronously, so a daemon thread owns one loop for the life of the process.

vLLM is imported inside functions: the kernel imports this module (through the Generator class)
without paying vLLM's ~10 s import.
"""

from __future__ import annotations

import asyncio
import contextlib
import difflib
import json
import os
import pickle
import threading
import time
from collections.abc import Coroutine
from dataclasses import fields
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from forge_nb.actors.engine import plain, replay
from forge_nb.rl.completion import WireCompletion
from forge_nb.rl.types import Completions

if TYPE_CHECKING:
    from vllm import AsyncEngineArgs, SamplingParams
    from vllm.outputs import RequestOutput

WORKER_EXTENSION = "forge_nb.actors.engine.worker.TorchstoreWeightLoader"
plain.apply_from_env()  # in vLLM's worker process, before it loads the model


def allow_amx() -> None:
    """Ask Linux for the AMX tile registers (``arch_prctl(ARCH_REQ_XCOMP_PERM)``, through torch) on CPUs
    that have them. vLLM's CPU attention runs AMX instructions for bfloat16 without asking; unless oneDNN
    happened to ask first in that process, the first generate killed vLLM's worker with SIGILL (exit code
    -4; 3 runs in 7 of the mp-executor test on this machine's AMX Xeon). The permission costs nothing
    until AMX is used: Linux enlarges a thread's saved state on its first AMX instruction."""
    if torch.cpu._is_amx_tile_supported():
        torch.cpu._init_amx()


allow_amx()  # here: vLLM's worker process (mp executor) and the Generator's (in-process engine) import this
# module; so does the kernel (through the Generator class), where the permission stays unused
#: Managed by the Generator, so not accepted from users: results are collected whole.
_MANAGED_SAMPLING = frozenset({"output_kind"})


def make_sampling_params(values: dict[str, Any], where: str = "sampling_params", *,
                         decode_here: bool = False) -> SamplingParams:
    """vLLM ``SamplingParams`` from a dict, as the Generator uses them: final outputs only, and the
    logprob of each sampled token always (``logprobs=0`` unless set). Unknown keys are a ValueError.

    ``decode_here``: the caller decodes the finished samples' text itself (:func:`response_text`), so vLLM
    does not detokenize, where :func:`decodes_here` allows it for these values."""
    from vllm.sampling_params import RequestOutputKind, SamplingParams

    valid = sorted(k for k in SamplingParams.__struct_fields__ if not k.startswith("_")
                   and k not in _MANAGED_SAMPLING)
    unknown = sorted(set(values) - set(valid))
    if unknown:
        hints = {k: difflib.get_close_matches(k, valid, n=1) for k in unknown}
        did_you_mean = "; ".join(f"{k!r}: did you mean {h[0]!r}?" for k, h in hints.items() if h)
        raise ValueError(
            f"{where}: unknown vLLM sampling parameter(s) {unknown}"
            + (f" ({did_you_mean})" if did_you_mean else "") + f". Valid: {', '.join(valid)}"
        )
    values = dict(values)
    if values.get("logprobs") is None:
        values["logprobs"] = 0  # the sampled token's logprob only
    if decode_here and decodes_here(values):
        values["detokenize"] = False
    try:
        return SamplingParams(**values, output_kind=RequestOutputKind.FINAL_ONLY)
    except Exception as e:  # vLLM's VLLMValidationError is not a ValueError
        raise ValueError(f"{where}: {e}") from e


def decodes_here(values: dict[str, Any]) -> bool:
    """Whether a finished sample's text can be decoded once, at the end (:func:`response_text`), instead of
    by vLLM token by token: the sampling leaves ``detokenize`` to the Generator, has no stop strings (vLLM
    matches those in the text as it grows), leaves the stop token out of the text and skips special tokens
    (vLLM's own choice of spacing between them then needs nothing more).

    Why (``bench/vs_trl.py``): vLLM detokenizes every new token of every sequence at every engine
    step, and decodes the sampled token of each logprob into a string as well, which the Generator never
    reads. On the quickstart's 16 four-token sequences that was ~12% of the engine's CPU a step."""
    return ("detokenize" not in values and not values.get("stop") and not values.get("include_stop_str_in_output")
            and values.get("skip_special_tokens", True) is True)


def response_text(tokenizer: Any, prompt_ids: list[int], token_ids: list[int], stop_terminated: bool) -> str:
    """The text vLLM's fast detokenizer gives a sample: a ``tokenizers`` decode stream primed with the prompt
    (so a token's leading space or a character split across tokens comes out as it does in context), fed
    the sampled tokens one by one, special tokens skipped, and the stop token that ended it (EOS or a
    ``stop_token_ids`` entry) left out of the text. ``tokenizer`` is a ``tokenizers.Tokenizer``."""
    from tokenizers.decoders import DecodeStream

    if stop_terminated and token_ids:
        token_ids = token_ids[:-1]
    if not token_ids:
        return ""
    whole = DecodeStream(ids=prompt_ids, skip_special_tokens=True).step(tokenizer, token_ids)
    if whole is not None:  # one call; None when the last tokens end inside a character: then token by token
        return whole
    stream = DecodeStream(ids=prompt_ids, skip_special_tokens=True)
    return "".join(chunk for token in token_ids if (chunk := stream.step(tokenizer, token)) is not None)


def fast_tokenizer(tokenizer: Any) -> Any:
    """The ``tokenizers.Tokenizer`` under vLLM's tokenizer of a model, or None when it has none (a slow or
    custom tokenizer: vLLM then keeps detokenizing)."""
    from tokenizers import Tokenizer

    inner = getattr(tokenizer, "_tokenizer", None)
    return inner if isinstance(inner, Tokenizer) else None


def make_engine_args(values: dict[str, Any], model_path: str, *, cuda: bool) -> AsyncEngineArgs:
    """vLLM ``AsyncEngineArgs`` for ``model_path`` with the Generator's defaults under ``values``."""
    from vllm import AsyncEngineArgs

    valid = {f.name for f in fields(AsyncEngineArgs)}
    unknown = sorted(set(values) - valid)
    if unknown:
        hints = [f"{k!r} -> {m[0]!r}?" for k in unknown if (m := difflib.get_close_matches(k, valid, n=1))]
        raise ValueError(
            f"engine_args: unknown vLLM engine argument(s) {unknown}"
            + (f" (did you mean {', '.join(hints)})" if hints else "")
            + "; see the fields of vllm.AsyncEngineArgs (vLLM's docs, 'Engine Arguments')"
        )
    # no periodic stats lines in notebook cells; the logprobs of the distribution sampled from (after temperature,
    # top-k/top-p), which the losses take as the behaviour policy: vLLM's default, the raw logits', made every ratio
    # of a run at temperature 0.8 start away from 1 (mismatch/kl showed it)
    defaults: dict[str, Any] = {"disable_log_stats": True, "logprobs_mode": "processed_logprobs"}
    if not cuda:
        defaults["enforce_eager"] = True
        if checkpoint_dtype(model_path) == "float32":
            defaults["dtype"] = "float32"  # see checkpoint_dtype
    merged = defaults | values | {"model": model_path, "worker_extension_cls": WORKER_EXTENSION}
    return AsyncEngineArgs(**merged)


def generator_engine_args(values: dict[str, Any], model_path: str, *, cuda: bool,
                          cpu_linear: str = "auto") -> AsyncEngineArgs:
    """The engine arguments a Generator builds its engine with: :func:`make_engine_args`, and on CPU its linear
    layers' weights (``engine.plain``, configured for this process and vLLM's worker processes, so call it where
    the engine is built) and a KV cache sized to the model's context (:func:`cpu_kv_cache_bytes`) unless
    ``values`` or ``VLLM_CPU_KVCACHE_SPACE`` say. ``bench/engine_cpu.py`` builds its engine the same way."""
    if not cuda:
        plain.configure(plain.choose(model_path, cpu_linear))
    engine_args = make_engine_args(values, model_path, cuda=cuda)
    if not cuda and engine_args.kv_cache_memory_bytes is None and not os.environ.get("VLLM_CPU_KVCACHE_SPACE"):
        engine_args.kv_cache_memory_bytes = cpu_kv_cache_bytes(model_path, engine_args.max_model_len)
    return engine_args


def checkpoint_dtype(model_path: str) -> str | None:
    """The dtype a checkpoint's config.json names (``dtype``, or ``torch_dtype`` before transformers 5), or
    None. On CPU the Generator keeps a float32 checkpoint in float32: vLLM's ``dtype="auto"`` samples one in
    bfloat16 there (its CPU platform's first choice), while the trainer computes in float32, so the tiny
    model's logprobs came out up to 5e-3 from the trainer's and an episode's policy ratio did not start at
    1 (with float32 both: 5e-7, ``tests/actors/test_generator.py``). A bfloat16 checkpoint (Qwen3's) stays
    as vLLM picks it, as does a dtype the user gives."""
    try:
        config = json.loads((Path(model_path) / "config.json").read_text())
    except (OSError, ValueError):
        return None
    dtype = config.get("dtype", config.get("torch_dtype")) if isinstance(config, dict) else None
    return dtype if isinstance(dtype, str) else None


#: The KV cache of an engine on CPU, unless ``VLLM_CPU_KVCACHE_SPACE`` or ``kv_cache_memory_bytes`` says:
#: room for CPU_KV_SEQS sequences of the engine's whole context, between these bounds (bytes).
CPU_KV_MIN, CPU_KV_MAX, CPU_KV_SEQS = 64 << 20, 1 << 30, 256


def cpu_kv_cache_bytes(model_path: str, max_model_len: int | None) -> int:
    """A KV cache for an engine on CPU that fits the model and its context: ``CPU_KV_SEQS`` sequences of
    ``max_model_len`` tokens (float32 keys and values in every layer), at least ``CPU_KV_MIN``, at most
    ``CPU_KV_MAX`` (also when the config does not say enough to count, or there is no context length).

    vLLM's own CPU default sizes it from free memory, and a flat 1 GiB would be written
    in full at start: ~0.7 s of the generator's start on two cores, and 1 GiB of its memory, for a tiny
    model whose sequences need a few MB."""
    try:
        config = json.loads((Path(model_path) / "config.json").read_text())
        heads = config["num_attention_heads"]
        head_dim = config.get("head_dim") or config["hidden_size"] // heads
        per_token = 2 * config["num_hidden_layers"] * config.get("num_key_value_heads", heads) * head_dim * 4
    except (OSError, ValueError, KeyError, TypeError, ZeroDivisionError):
        return CPU_KV_MAX
    if not max_model_len:
        return CPU_KV_MAX
    return max(CPU_KV_MIN, min(CPU_KV_MAX, per_token * max_model_len * CPU_KV_SEQS))


def checkpoint_names(model_path: str) -> set[str] | None:
    """Tensor names in the model's safetensors files (None when it has none): what a push must hold."""
    from safetensors import safe_open

    files = sorted(Path(model_path).glob("*.safetensors"))
    names: set[str] = set()
    for file in files:
        with safe_open(str(file), "pt") as f:
            names.update(f.keys())
    return names or None


def completions(prompt: str | None, request: RequestOutput, version: int, tokenizer: Any = None) -> Completions:
    """One Completion per sample of a finished vLLM request, generated by weights ``version`` (``prompt``:
    its text; None when it was given as token ids). ``tokenizer``: decode each sample's text here
    (:func:`response_text`; vLLM did not detokenize) with this ``tokenizers.Tokenizer``."""
    out = Completions()
    prompt_ids = list(request.prompt_token_ids or [])
    prompt_logprobs = None
    if request.prompt_logprobs is not None:  # asked for (prompt_logprobs=k): each prompt token's, and the top k
        steps = list(request.prompt_logprobs)
        prompt_logprobs = {
            "logprobs": [None if step is None else step[token].logprob
                         for token, step in zip(prompt_ids, steps, strict=True)],
            "top": [[] if step is None else sorted(((t, p.logprob) for t, p in step.items()), key=lambda x: -x[1])
                    for step in steps]}
    for sample in request.outputs:
        token_ids = list(sample.token_ids)
        text = sample.text if tokenizer is None else response_text(
            tokenizer, prompt_ids, token_ids, stop_terminated=sample.finish_reason == "stop")
        logprobs = None
        metadata = {"request_id": request.request_id, "stop": sample.stop_reason,
                    "num_cached_tokens": request.num_cached_tokens}
        if sample.logprobs is not None:  # one {token: Logprob} per step; the sampled token is there
            logprobs = [step[token].logprob for token, step in zip(token_ids, sample.logprobs, strict=True)]
            if any(len(step) > 1 for step in sample.logprobs):  # alternatives were asked for (logprobs=k)
                metadata["top_logprobs"] = [sorted(((t, p.logprob) for t, p in step.items()), key=lambda x: -x[1])
                                            for step in sample.logprobs]
        if prompt_logprobs is not None:
            metadata["prompt_logprobs"] = prompt_logprobs
        out.append(WireCompletion(
            prompt=prompt, text=text, prompt_ids=prompt_ids,
            token_ids=token_ids, logprobs=logprobs, stop_reason=sample.finish_reason,
            generator_version=version, metadata=metadata,
        ))
    return out


_loop: asyncio.AbstractEventLoop | None = None
_loop_lock = threading.Lock()
#: The controller reference the torchstore client in this process was built from.
_client_ref: bytes | None = None


def _run(coro: Coroutine[Any, Any, Any], timeout: float) -> Any:
    """Run ``coro`` on this process's private event loop thread and wait for its result."""
    global _loop
    with _loop_lock:
        if _loop is None:
            _loop = asyncio.new_event_loop()
            threading.Thread(target=_loop.run_forever, name="forge_nb.torchstore", daemon=True).start()
    return asyncio.run_coroutine_threadsafe(coro, _loop).result(timeout)


def _open(controller_ref: bytes, version: int, namespace: str, manifest: dict[str, Any] | None,
          timeout: float) -> Any:
    """``weights.open_version`` in this process: straight from a manifest of this host's shared memory,
    otherwise through torchstore on the private event loop."""
    from forge_nb import weights

    handed = weights.handed_version(version, namespace, manifest)
    return handed if handed is not None else _run(_fetch(controller_ref, version, namespace), timeout)


async def _fetch(controller_ref: bytes, version: int, namespace: str) -> Any:
    global _client_ref
    import torchstore.api
    from torchstore.client import LocalClient

    import forge_nb.weights.torchstore  # noqa: F401  binds the async Controller class the reference names
    from forge_nb import weights

    if controller_ref != _client_ref:
        controller = pickle.loads(controller_ref)
        strategy = await controller.get_controller_strategy.call_one()
        # torchstore caches one client per store name and has no public way to build it from a
        # controller reference; seeding its cache lets forge_nb.weights work unchanged here.
        torchstore.api._local_clent_map[torchstore.api.DEFAULT_TORCHSTORE_NAME] = LocalClient(
            controller=controller, strategy=strategy
        )
        _client_ref = controller_ref
    return await weights.open_version(version, namespace=namespace)


def _mismatch(pushed: set[str], expected: set[str]) -> str | None:
    """Why ``pushed`` names cannot replace a checkpoint with ``expected`` names (None: they can)."""
    # A tied lm_head is in a transformers state_dict() but not in the checkpoint; vLLM skips it.
    unknown = sorted(pushed - expected - {"lm_head.weight"})
    missing = sorted(expected - pushed)
    if not unknown and not missing:
        return None
    return (f"the pushed state dict does not match the model: {len(unknown)} unknown name(s) "
            f"{unknown[:3]}, {len(missing)} missing {missing[:3]}. Push every parameter under its Hugging "
            f"Face name (e.g. {min(expected)!r}); a torchtitan trainer converts with its model's "
            "StateDictAdapter.to_hf()")


class TorchstoreWeightLoader:
    """Mixed into vLLM's worker class (``worker_extension_cls``); ``self`` is the vLLM worker."""

    model_runner: Any  # provided by the vLLM worker this class is mixed into
    vllm_config: Any

    def forge_nb_write_adapter(self, controller_ref: bytes, version: int, timeout: float, namespace: str,
                               manifest: dict[str, Any] | None, folder: str, config: dict[str, Any]) -> dict[str, Any]:
        """Fetch ``version`` of a LoRA trainer's adapters (peft's names) as :meth:`forge_nb_load_version` fetches
        weights, and write them into ``folder`` in peft's format (``config``: its adapter_config.json), where
        the engine's ``add_lora`` reads them. Returns sizes and timings, or ``{"refused": why}``."""
        from forge_nb.actors.training import lora

        start = time.perf_counter()
        try:
            with _open(controller_ref, version, namespace, manifest, timeout) as state_dict:
                if not state_dict or not all(".lora_A." in k or ".lora_B." in k for k in state_dict):
                    return {"refused": f"version {version} holds no LoRA adapters (it names {sorted(state_dict)[:3]}"
                                       "...): the trainer of a LoRA generator pushes its adapters alone"}
                lora.write_adapter(folder, state_dict, config)
                size = sum(t.numel() * t.element_size() for t in state_dict.values())
                return {"tensors": len(state_dict), "bytes": size, "fetch_s": 0.0,
                        "load_s": time.perf_counter() - start}
        except Exception as e:
            return {"refused": f"fetching it from torchstore failed ({type(e).__name__}: {e})"}

    def forge_nb_load_version(self, controller_ref: bytes, version: int, timeout: float,
                              namespace: str = "policy", manifest: dict[str, Any] | None = None) -> dict[str, Any]:
        """Fetch ``version`` of weights ``namespace`` (HF names) from torchstore and reload it into the model in place
        (given its shared-memory ``manifest``, without asking torchstore where it is).

        Returns sizes and timings, or ``{"refused": why}`` when fetching failed or the names do not
        match the model's checkpoint (both before anything is loaded: the old weights stay whole).
        """
        start = time.perf_counter()
        with contextlib.ExitStack() as held:  # shared memory: the version stays locked until the reload is done
            try:
                state_dict = held.enter_context(_open(controller_ref, version, namespace, manifest, timeout))
            except Exception as e:
                return {"refused": f"fetching it from torchstore failed ({type(e).__name__}: {e})"}
            fetched = time.perf_counter()
            if not hasattr(self, "_forge_nb_expected"):  # the checkpoint the engine was built from
                self._forge_nb_expected = checkpoint_names(self.vllm_config.model_config.model)
            expected = self._forge_nb_expected
            if expected is not None and (why := _mismatch(set(state_dict), expected)):
                return {"refused": why}
            if plain.active():  # plain CPU weights: copied into the parameters in place
                self._forge_nb_replay = replay.load(self.model_runner.get_model(), state_dict,
                                                          getattr(self, "_forge_nb_replay", None))
            else:  # vLLM's CPU kernels repack weights after loading (parameters become empty): it redoes that
                self.model_runner.reload_weights(weights_iterator=iter(state_dict.items()))
            return {
                "tensors": len(state_dict),
                "bytes": sum(t.numel() * t.element_size() for t in state_dict.values()),
                "fetch_s": fetched - start,
                "load_s": time.perf_counter() - fetched,
            }
