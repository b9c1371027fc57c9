from __future__ import annotations

import threading
from pathlib import Path

import pytest

from app.engine import model_store
from app.engine.model_store import bundled_gguf, ensure_converted, resolve_model


def fake_gguf(tmp_path: Path) -> Path:
    gguf = tmp_path / "tiny.gguf"
    gguf.write_bytes(b"GGUF" + bytes(range(256)) * 64)
    return gguf


def test_bundled_gguf_is_found_without_importing_the_package() -> None:
    path = bundled_gguf()
    assert path.is_file() and path.name == model_store.BUNDLED_GGUF


def test_concurrent_conversions_convert_once(tmp_path: Path) -> None:
    gguf = fake_gguf(tmp_path)
    cache = tmp_path / "cache"
    calls: list[Path] = []
    inside = threading.Event()
    release = threading.Event()

    def slow_convert(source: Path, out: Path) -> None:
        calls.append(out)
        inside.set()
        assert release.wait(30)  # hold the lock while the second caller arrives
        (out / "config.json").write_text("{}")

    results: list[Path] = []
    first = threading.Thread(target=lambda: results.append(ensure_converted(gguf, cache, convert=slow_convert)))
    first.start()
    assert inside.wait(30)
    second = threading.Thread(target=lambda: results.append(ensure_converted(gguf, cache, convert=slow_convert)))
    second.start()
    release.set()
    first.join(30)
    second.join(30)
    assert len(calls) == 1
    assert len(results) == 2 and results[0] == results[1]
    assert (results[0] / "config.json").is_file()
    assert [p.name for p in cache.iterdir() if p.is_dir()] == [results[0].name]  # no temp dir left behind


def test_a_failed_conversion_leaves_nothing_and_the_next_start_retries(tmp_path: Path) -> None:
    gguf = fake_gguf(tmp_path)
    cache = tmp_path / "cache"

    def broken(source: Path, out: Path) -> None:
        (out / "partial").write_text("x")
        raise OSError("disk full")

    with pytest.raises(OSError):
        ensure_converted(gguf, cache, convert=broken)
    assert not [p for p in cache.iterdir() if p.is_dir()]
    done = ensure_converted(gguf, cache, convert=lambda s, out: (out / "config.json").write_text("{}"))
    assert (done / "config.json").is_file() and not (done / "partial").exists()


def test_losing_a_rename_race_uses_the_winner(tmp_path: Path) -> None:
    """A converter that ignored the lock got there first: its directory appears while ours is being written."""
    gguf = fake_gguf(tmp_path)
    cache = tmp_path / "cache"
    final = cache / model_store.converted_dir_name(gguf)

    def racing(source: Path, out: Path) -> None:
        final.mkdir(parents=True)
        (final / "config.json").write_text('{"winner": true}')
        (out / "config.json").write_text("{}")

    assert ensure_converted(gguf, cache, convert=racing) == final
    assert "winner" in (final / "config.json").read_text()


def test_second_resolve_is_cached(tmp_path: Path) -> None:
    gguf = fake_gguf(tmp_path)
    calls: list[Path] = []

    def convert(source: Path, out: Path) -> None:
        calls.append(out)
        (out / "config.json").write_text("{}")

    first = resolve_model(str(gguf), tmp_path / "cache", convert=convert)
    second = resolve_model(str(gguf), tmp_path / "cache", convert=convert)
    assert first == second and len(calls) == 1 and first.model_id == "tiny"


def test_local_model_dir_is_used_as_is(tmp_path: Path) -> None:
    model_dir = tmp_path / "my-model"
    model_dir.mkdir()
    (model_dir / "config.json").write_text("{}")
    resolved = resolve_model(str(model_dir), tmp_path / "cache")
    assert resolved.path == model_dir and resolved.model_id == "my-model"
    assert not (tmp_path / "cache").exists()


def test_anything_else_is_refused_without_download(tmp_path: Path) -> None:
    with pytest.raises(RuntimeError, match="never downloads"):
        resolve_model("HuggingFaceTB/SmolLM2-135M-Instruct", tmp_path / "cache")
