"""Models: a tiny Qwen3 with a character-level tokenizer built locally, and model-id resolution.

No machine here can download from a model hub, so tests and the CPU quickstart build their model:
the Qwen3 architecture (so vLLM, transformers and torchtitan all load it), 2 layers, hidden 128,
2 attention heads of dimension 64 (vLLM's CPU attention rejects head_dim 16), randomly initialised,
and a tokenizer with one token per character of the task's alphabet plus ``<pad>``, ``<eos>``.
Real runs name a hub id (``Qwen/Qwen3-1.7B``) or a local folder; :func:`resolve_model` turns either
into something loadable or an error that names the model and says what to do.

A tiny model is built once per machine: the build is deterministic (seeded), so its files are kept in
``$FORGE_NB_CACHE_DIR`` (default ``~/.cache/forge_nb``) under ``tiny-models/<key of the config and the
library versions>`` and copied into each run directory from there. A build costs ~2.5 s of CPU and the
kernel's import of transformers, on the path of every spawn (spawn to first step); a copy, a few
milliseconds. ``FORGE_NB_CACHE_DIR=""`` turns the cache off; a cache folder that cannot be written is
skipped (the model is built in place). Considered: hard links into the cache (a run could then write
through them into every later run's model) and ``huggingface_hub``'s cache (made for downloads by repo
id and revision, not for locally built folders).
"""

from __future__ import annotations

import functools
import hashlib
import json
import logging
import os
import shutil
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from forge_nb.system.dist_cache import cache_root

logger = logging.getLogger(__name__)

PAD, EOS = "<pad>", "<eos>"
TINY_PAD_ID = 0  #: the tiny tokenizer's id of PAD (EOS is 1, then the alphabet)


@dataclass(kw_only=True, slots=True)
class TinyModelConfig:
    """Shape of the locally built model. The defaults train in minutes on two CPU cores."""

    alphabet: str = "abcdefgh"
    """Characters the tokenizer knows (one token each); unknown characters map to <pad>."""
    hidden_size: int = 128
    num_layers: int = 2
    num_heads: int = 2
    head_dim: int = 64
    intermediate_size: int = 256
    max_position_embeddings: int = 256
    seed: int = 0

    def __post_init__(self) -> None:
        if not self.alphabet or len(set(self.alphabet)) != len(self.alphabet):
            raise ValueError(f"alphabet={self.alphabet!r}: needs at least one character, each once")
        if self.head_dim < 32:
            raise ValueError(f"head_dim={self.head_dim}: vLLM's CPU attention needs head_dim >= 32 (use 64)")
        for name in ("hidden_size", "num_layers", "num_heads", "intermediate_size"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name}={getattr(self, name)}: must be >= 1")


CHAT_TEMPLATE = "{% for message in messages %}{{ message['content'] }}{% endfor %}"
"""The tiny tokenizer's chat template: the messages' contents, one after the other."""


#: Held around the kernel's use of transformers: its lazy module is not safe to import from two threads at
#: once (two spawns side by side each build their model in a thread; the second import failed with "cannot
#: import name 'PreTrainedTokenizerFast'").
TRANSFORMERS_LOCK = threading.Lock()


@functools.cache
def load_tokenizer(path: str) -> Any:
    """The tokenizer of a model folder or hub id, loaded once per process (under ``TRANSFORMERS_LOCK``)."""
    from transformers import AutoTokenizer

    with TRANSFORMERS_LOCK:
        return AutoTokenizer.from_pretrained(path)


STAMP = "forge_nb_tiny.json"  #: in a tiny model's folder, written last: the config it was built from
_BUILD = 1  #: bump when _build_tiny_model writes something else for the same config (a new cache key)


def build_tiny_model(path: str | os.PathLike[str], config: TinyModelConfig | None = None) -> Path:
    """Write a randomly initialised (seeded) tiny Qwen3 and its tokenizer to ``path`` (reused if present),
    copied from this machine's cache of built models when it has one (see the module docstring); safe to
    call from several threads and processes at once."""
    path, config = Path(path), config or TinyModelConfig()
    wanted = _wanted(config)
    if _built(path, wanted):
        return path
    cached = _cache_folder(wanted)
    if cached is not None and not _built(cached, wanted):
        try:
            _build_into_cache(cached, config)
        except OSError as e:  # a read-only or full cache: build in place, as without one
            logger.info("tiny model cache %s not written (%s: %s); building in %s", cached, type(e).__name__, e, path)
            cached = None
    if cached is None:
        with TRANSFORMERS_LOCK:
            return _build_tiny_model(path, config)
    path.mkdir(parents=True, exist_ok=True)
    for item in sorted(cached.iterdir(), key=lambda p: p.name == STAMP):  # the stamp last: a cut copy is no model
        shutil.copy2(item, path / item.name)
    return path


def _wanted(config: TinyModelConfig) -> str:
    return json.dumps({f: getattr(config, f) for f in config.__slots__}, sort_keys=True)


def _built(path: Path, wanted: str) -> bool:
    stamp = path / STAMP
    return stamp.exists() and stamp.read_text() == wanted


def _cache_folder(wanted: str) -> Path | None:
    """This machine's folder for the model of ``wanted`` (None with the cache turned off). The key holds the
    libraries that write the files, so an upgrade builds again."""
    root = cache_root()
    if root is None:
        return None
    from importlib.metadata import version

    libraries = [version(name) for name in ("torch", "transformers", "tokenizers", "safetensors")]
    key = hashlib.sha256(json.dumps([wanted, libraries, _BUILD]).encode()).hexdigest()[:20]
    return root / "tiny-models" / key


def _build_into_cache(cached: Path, config: TinyModelConfig) -> None:
    """Build into a folder of this process's, then rename it into place (the first of several builders wins)."""
    cached.parent.mkdir(parents=True, exist_ok=True)
    scratch = cached.parent / f"{cached.name}.{os.getpid()}-{threading.get_ident()}.tmp"
    try:
        with TRANSFORMERS_LOCK:
            _build_tiny_model(scratch, config)
        try:
            scratch.rename(cached)
        except OSError:  # another builder renamed theirs first (or left a damaged one: build again)
            if not _built(cached, _wanted(config)):
                shutil.rmtree(cached, ignore_errors=True)
                scratch.rename(cached)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


def _build_tiny_model(path: Path, config: TinyModelConfig) -> Path:
    import torch
    from transformers import PreTrainedTokenizerFast, Qwen3Config, Qwen3ForCausalLM

    stamp, wanted = path / STAMP, _wanted(config)
    if _built(path, wanted):
        return path
    path.mkdir(parents=True, exist_ok=True)

    tokenizer = PreTrainedTokenizerFast(tokenizer_object=_char_tokenizer(config.alphabet))
    tokenizer.pad_token, tokenizer.eos_token = PAD, EOS
    # Chat-shaped data (the documents' DatasetActor applies the model's chat template) gets the messages'
    # text as it is: the tiny model has no roles to mark, and only `alphabet` to spell them with.
    tokenizer.chat_template = CHAT_TEMPLATE
    tokenizer.save_pretrained(path)

    torch.manual_seed(config.seed)
    model = Qwen3ForCausalLM(Qwen3Config(
        vocab_size=len(config.alphabet) + 2,
        hidden_size=config.hidden_size,
        intermediate_size=config.intermediate_size,
        num_hidden_layers=config.num_layers,
        num_attention_heads=config.num_heads,
        num_key_value_heads=config.num_heads,
        head_dim=config.head_dim,
        max_position_embeddings=config.max_position_embeddings,
        tie_word_embeddings=False,
        pad_token_id=tokenizer.pad_token_id,
        eos_token_id=tokenizer.eos_token_id,
        bos_token_id=None,
        torch_dtype="float32",
    ))
    model.generation_config.pad_token_id = tokenizer.pad_token_id
    model.generation_config.eos_token_id = tokenizer.eos_token_id
    from transformers.utils import logging as hf_logging

    shown = hf_logging.is_progress_bar_enabled()
    hf_logging.disable_progress_bar()  # "Writing model shards" for a one-shard model: a bar in the spawn cell
    try:
        model.save_pretrained(path)
    finally:
        if shown:
            hf_logging.enable_progress_bar()
    stamp.write_text(wanted)
    return path


def _char_tokenizer(alphabet: str):  # -> tokenizers.Tokenizer
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers

    vocab = {PAD: TINY_PAD_ID, EOS: TINY_PAD_ID + 1} | {ch: i + 2 for i, ch in enumerate(alphabet)}
    tok = Tokenizer(models.WordLevel(vocab=vocab, unk_token=PAD))
    tok.pre_tokenizer = pre_tokenizers.Split(pattern="", behavior="isolated")
    tok.decoder = decoders.Fuse()
    tok.add_special_tokens([PAD, EOS])
    return tok


def resolve_model(name_or_path: str) -> str:
    """A local folder, or a hub id already in the local cache; otherwise a clear FileNotFoundError."""
    path = Path(name_or_path).expanduser()
    if path.exists():
        if not (path / "config.json").exists():
            raise FileNotFoundError(
                f"model folder {str(path)!r} has no config.json; is it a Hugging Face model folder?")
        return str(path)
    looks_like_path = name_or_path.startswith(("/", ".", "~")) or name_or_path.count("/") != 1
    if looks_like_path:
        raise FileNotFoundError(f"model {name_or_path!r} not found: no such folder")
    try:
        from huggingface_hub import snapshot_download

        offline = os.environ.get("HF_HUB_OFFLINE", "0") not in ("0", "", "false")
        return snapshot_download(name_or_path, local_files_only=offline)
    except Exception as e:
        raise FileNotFoundError(
            f"model {name_or_path!r} not found locally and could not be downloaded ({type(e).__name__}). "
            "Pass a local folder, or download it first on a machine with hub access "
            "(huggingface-cli download <id>) and point HF_HOME at the cache."
        ) from e
