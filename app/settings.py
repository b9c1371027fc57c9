"""Runtime configuration: every knob is a `LETHE_*` environment variable (or a `.env` file entry)."""

from __future__ import annotations

import base64
import binascii
import sys
from enum import StrEnum
from pathlib import Path
from typing import Literal

from pydantic import Field, SecretStr, field_validator
from pydantic_settings import BaseSettings, SettingsConfigDict


class EngineKind(StrEnum):
    HF = "hf"
    VLLM = "vllm"
    VLLM_REMOTE = "vllm-remote"


class Settings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="LETHE_", env_file=".env", extra="ignore")

    database_url: SecretStr | None = Field(
        default=None,
        description="External PostgreSQL with pgvector (postgresql://...). Unset: embedded pgserver in data_dir.",
    )
    database_replica_urls: SecretStr | None = Field(
        default=None,
        description="Comma-separated postgresql:// URLs of streaming replicas of the database; memory, session and "
        "listing reads may be served there (writes, forgets, turns and leases stay on the primary).",
    )
    replica_wait_ms: int = Field(
        default=200, ge=0, le=60_000,
        description="How long a read carrying a Lethe-Consistency token waits for a replica to replay past it before "
        "it reads the primary instead.",
    )
    replica_probe_s: float = Field(
        default=5.0, gt=0, le=3600, description="How often each process measures the replicas' lag (metrics)."
    )
    forget_remote_apply: bool = Field(
        default=False,
        description="Strict forgets: a forget commits with synchronous_commit = remote_apply, so it returns only once "
        "the synchronous standbys (synchronous_standby_names) have applied it; forgets block while they are down.",
    )
    data_dir: Path = Field(default=Path(".lethe"), description="Embedded database, converted model, job scratch.")
    host: str = "127.0.0.1"
    port: int = Field(default=8000, ge=1, le=65535)
    engine: EngineKind = EngineKind.HF
    model: str | None = Field(default=None, description="A local HF model directory; unset: SmolLM2-135M-Instruct.")
    model_cache_dir: Path | None = Field(
        default=None, description="Where converted model weights live; unset: <data_dir>/models."
    )
    kv_memory_bytes: int = Field(
        default=2 * 1024**3, ge=16 * 1024**2, description="KV-cache budget of the hf engine; LRU eviction past it."
    )
    session_lock_timeout_s: float = Field(
        default=30.0, gt=0, le=600, description="How long a turn waits for its session before 409 session_busy."
    )
    session_lease_s: float = Field(
        default=15.0, ge=1, le=600,
        description="A turn's or forget's lease on its session, renewed while it works; a dead process's expires.",
    )
    forget_wait_s: float = Field(
        default=60.0, gt=0, le=600, description="How long POST /v1/forget with wait: true waits before answering 202."
    )
    forget_lease_s: float = Field(
        default=30.0, ge=1, le=3600, description="A worker's lease on a forget job; a dead worker's job is retried."
    )
    forget_poll_s: float = Field(
        default=1.0, gt=0, le=60,
        description="How often a forget worker looks for jobs when no job event woke it (the fallback while the "
        "LISTEN connection is down).",
    )
    memory_expiry_sweep_s: float = Field(
        default=30.0, gt=0, le=3600,
        description="How often the expiry sweep forgets memory records whose time to live ran out (a read that meets "
        "one forgets it at once).",
    )
    hf_threads: int | None = Field(
        default=None, ge=1, le=1024,
        description="Threads of the hf engine's forward passes; unset: every core the process may run on. Fewer on a "
        "machine shared with other busy processes (docs/performance.md, Engines: CPU contention).",
    )
    replay_verify: bool = Field(
        default=True,
        description="A forget's replay verifies each transition's recorded reply in one forward pass instead of "
        "decoding it again (certified token for token, docs/engines.md: hf; greedy replies on vllm, and on vllm-remote "
        "where Lethe is installed beside the fleet's vLLM); off: every replayed reply is decoded.",
    )
    forget_lock_timeout_s: float = Field(
        default=120.0, gt=0, le=3600, description="How long a forget waits for a turn in flight before requeueing."
    )
    vllm_url: str | None = Field(default=None, description="Base URL of a `vllm serve` fleet (engine vllm-remote).")
    vllm_max_num_seqs: int = Field(
        default=16, ge=1, le=1024,
        description="Sequences the in-process vLLM engine batches at once; 1 runs one at a time (exact replay).",
    )
    vllm_dtype: Literal["float32", "bfloat16", "float16", "auto"] = Field(
        default="float32", description="The in-process vLLM engine's dtype (float32 keeps batching noise ~1e-5)."
    )
    vllm_kv_cache_bytes: int = Field(
        default=1 << 30, ge=16 * 1024**2, description="KV-cache memory of the in-process vLLM engine (its blocks)."
    )
    vllm_block_size: int | None = Field(
        default=None, ge=16, le=1024,
        description="Tokens per KV block of the in-process vLLM engine (unset: vLLM's, 128 on CPU; CPU takes "
        "multiples of 32): the granularity of prefix reuse, which every request pays once.",
    )
    vllm_live_step_tokens: int = Field(
        default=256, ge=0, le=1 << 20,
        description="Tokens a step of the in-process vLLM engine may schedule while only live turns are in it (0: "
        "vLLM's own budget): live prefills are chunked so a forget's request waits at most one short step.",
    )
    vllm_remote_exactness: Literal["batched", "unbatched", "batch-invariant"] = Field(
        default="batched",
        description="What the vllm-remote fleet guarantees: unbatched (--max-num-seqs 1), batch-invariant "
        "(VLLM_BATCH_INVARIANT=1 on supported GPUs) or batched (anything else).",
    )
    vllm_remote_priority: Literal["auto", "on", "off"] = Field(
        default="auto",
        description="Request priorities to the vllm-remote fleet (a forget's replay first; it schedules by them when "
        "served with --scheduling-policy priority): auto (sent when the fleet accepts them, probed at start), on "
        "(sent; a fleet that refuses them fails the start), off (never sent).",
    )
    key_provider: Literal["local", "openbao", "vault"] = Field(
        default="local",
        description="Where the key material that derives content keys lives (docs/erasure-at-rest.md): local (a key "
        "store under <data_dir>/keys, for the processes of one machine) or openbao / vault (a KV version 2 engine on "
        "a server that every host shares).",
    )
    key_dir: Path | None = Field(
        default=None,
        description="The local key store (key_provider local); unset: <data_dir>/keys. Every process of a machine "
        "serving one database must use the same one; put it on a volume whose encryption key you can destroy.",
    )
    retention_sweep_s: float = Field(
        default=3600.0, ge=1.0, le=7 * 86400,
        description="How often each tenant's retention sweep runs (docs/subjects.md, Retention); setting a policy "
        "runs one at once.",
    )
    erasure_horizon_s: int = Field(
        default=300, ge=1, le=7 * 86400,
        description="The most time from a forget's success to the destruction, in the key provider, of every key "
        "able to decrypt what it erased (then no backup, WAL archive or replica can give it back).",
    )
    openbao_address: str | None = Field(
        default=None, description="The OpenBao or Vault server (https://...:8200) of key_provider openbao / vault."
    )
    openbao_token: SecretStr | None = Field(
        default=None,
        description="A token allowed to read, write and destroy versions of the secrets under openbao_prefix.",
    )
    openbao_ca_cert: Path | None = Field(
        default=None, description="A CA bundle the OpenBao server's TLS certificate is checked against (unset: the "
        "system's).",
    )
    openbao_kv_mount: str = Field(default="secret", description="Where the KV version 2 engine is mounted.")
    openbao_prefix: str = Field(default="lethe", description="The path under it of Lethe's key covers.")
    bootstrap_api_key: SecretStr | None = None
    bootstrap_webhook_secret: SecretStr | None = None
    log_level: str = "INFO"
    log_json: bool = True
    max_body_bytes: int = Field(default=1_048_576, ge=1024, description="Request bodies above this answer 413.")
    thread_max_checkpoint_bytes: int = Field(
        default=524_288, ge=1024,
        description="A LangGraph checkpoint's serialized bytes (with its new channel values), or one task's writes, "
        "above this answer 413 (app/threads/).",
    )
    db_pool_size: int = Field(default=10, ge=1)
    http_workers: int = Field(
        default=1, ge=1, le=64,
        description="HTTP worker processes, each serving every route, over one engine process (app/serving.py); "
        "1: a single process.",
    )
    auth_cache_s: float = Field(
        default=5.0, ge=0, le=300,
        description="How long a process remembers a verified API key: a revoked key stops working within this.",
    )
    keep_alive_s: int = Field(
        default=75, ge=1, le=3600,
        description="How long an idle HTTP connection stays open; longer than clients' own pool expiry (httpx: 5 s).",
    )
    shutdown_grace_s: int = Field(
        default=10, ge=1, le=600,
        description="On SIGTERM/SIGINT: how long requests in flight may finish before they are cancelled.",
    )

    @field_validator("bootstrap_webhook_secret")
    @classmethod
    def _check_webhook_secret(cls, value: SecretStr | None) -> SecretStr | None:
        if value is not None:
            decode_webhook_secret(value.get_secret_value())
        return value

    @field_validator("log_level")
    @classmethod
    def _upper_level(cls, value: str) -> str:
        return value.upper()

    @property
    def resolved_model_cache_dir(self) -> Path:
        return self.model_cache_dir or self.data_dir / "models"


def decode_webhook_secret(secret: str) -> bytes:
    """Standard Webhooks secrets are `whsec_<base64>`; anything else is a configuration error."""
    if not secret.startswith("whsec_"):
        raise ValueError("webhook secret must have the Standard Webhooks form whsec_<base64>")
    try:
        raw = base64.b64decode(secret.removeprefix("whsec_"), validate=True)
    except binascii.Error as exc:
        raise ValueError("webhook secret is not valid base64 after whsec_") from exc
    if len(raw) < 16:
        raise ValueError("webhook secret must hold at least 16 bytes")
    return raw


def settings_from_env() -> Settings:
    """The settings from LETHE_* variables, logging configured (what every `lethe` process starts with); a bad value
    exits with status 2 and says which."""
    from pydantic import ValidationError

    from app.observability.logging import configure_logging

    try:
        settings = Settings()
    except ValidationError as exc:
        problems = "; ".join(f"LETHE_{'_'.join(map(str, e['loc'])).upper()}: {e['msg']}" for e in exc.errors())
        print(f"invalid configuration: {problems}", file=sys.stderr)
        raise SystemExit(2) from None
    configure_logging(settings.log_level, json_lines=settings.log_json)
    return settings
