"""`lethe serve | migrate | tenant ... | keys ... | openapi | eval`."""

from __future__ import annotations

import asyncio
import signal
import subprocess
import sys
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, TypeVar

import typer

from app.settings import Settings, settings_from_env

if TYPE_CHECKING:
    from app.db.database import Database
    from app.keys.admin import KeyAdmin
    from app.tenants.service import TenantService

T = TypeVar("T")

cli = typer.Typer(help="Lethe: stateful LLM agent serving that can truly forget.", no_args_is_help=True)
tenant_cli = typer.Typer(help="Tenants, API keys and webhook secrets.", no_args_is_help=True)
cli.add_typer(tenant_cli, name="tenant")
keys_cli = typer.Typer(help="The key store of content at rest (docs/erasure-at-rest.md).", no_args_is_help=True)
cli.add_typer(keys_cli, name="keys")


@cli.command()
def serve() -> None:
    """Apply migrations, then serve the API on LETHE_HOST:LETHE_PORT."""
    import uvicorn

    from app.main import create_app

    settings = settings_from_env()
    if settings.http_workers > 1:
        from app.keys.identity import KeyStoreMismatch
        from app.serving import serve_with_workers

        try:
            serve_with_workers(settings)
        except KeyStoreMismatch as exc:  # checked once, before any worker starts: one message, no traceback
            _fail(exc)
        return
    # uvicorn handles SIGTERM (graceful shutdown, bounded by LETHE_SHUTDOWN_GRACE_S), then raises it again once it
    # is done; with the default disposition that kills the interpreter before its exit handlers run, and the
    # embedded PostgreSQL this process holds would outlive it. Exiting normally lets them run.
    signal.signal(signal.SIGTERM, _exit_on_signal)
    uvicorn.run(
        create_app(settings), host=settings.host, port=settings.port, log_config=None, proxy_headers=False,
        timeout_graceful_shutdown=settings.shutdown_grace_s,
        # uvicorn closes idle connections after 5 s by default, exactly when httpx (and others) let pooled ones
        # expire: a client sending on a connection the server is closing at that moment gets a reset, a transport
        # error it cannot safely retry (seen under load in bench.memory_bench). The server must hold them longer.
        timeout_keep_alive=settings.keep_alive_s,
    )


@cli.command("engine-process", hidden=True)
def engine_process() -> None:
    """The engine process behind `lethe serve`'s HTTP workers (started by it; app/serving.py)."""
    from app.serving import run_engine_process

    settings = settings_from_env()
    signal.signal(signal.SIGTERM, _exit_on_signal)  # as in `serve`: exit normally, so exit handlers run
    run_engine_process(settings)


@cli.command("http-worker", hidden=True)
def http_worker() -> None:
    """One of `lethe serve`'s HTTP workers (started by it; app/serving.py)."""
    from app.serving import run_http_worker

    settings = settings_from_env()
    signal.signal(signal.SIGTERM, _exit_on_signal)
    run_http_worker(settings)


def _exit_on_signal(signum: int, _frame: object) -> None:
    raise SystemExit(128 + signum)


@cli.command()
def migrate() -> None:
    """Apply database migrations up to the newest (also done at `lethe serve` start)."""
    from app.db.database import resolve_database_url
    from app.db.migrate import upgrade_to_head_async

    settings = settings_from_env()

    async def run() -> None:
        await upgrade_to_head_async(await resolve_database_url(settings))

    asyncio.run(run())
    typer.echo("database is at the newest migration")


def _with_database(settings: Settings, action: Callable[[Database], Awaitable[T]]) -> T:
    from app.db.database import Database, resolve_database_url
    from app.db.migrate import upgrade_to_head_async

    async def run() -> T:
        url = await resolve_database_url(settings)
        await upgrade_to_head_async(url)
        db = Database(url, pool_size=1)
        try:
            return await action(db)
        finally:
            await db.close()

    return asyncio.run(run())


def _with_tenants(settings: Settings, action: Callable[[TenantService], Awaitable[T]]) -> T:
    from app.tenants.service import TenantService

    return _with_database(settings, lambda db: action(TenantService(db)))


def _with_keys(settings: Settings, action: Callable[[KeyAdmin], Awaitable[T]]) -> T:
    """`action` on the key store the settings name, once it is known to be the one the database was sealed with."""
    from app.container import build_key_admin
    from app.keys.identity import check_key_store

    async def run(db: Database) -> T:
        admin = build_key_admin(settings, db)
        await check_key_store(db, admin.provider, settings)
        return await action(admin)

    return _with_database(settings, run)


def _fail(exc: Exception) -> None:
    typer.echo(f"error: {exc}", err=True)
    raise typer.Exit(code=1)


@tenant_cli.command("create")
def tenant_create(name: Annotated[str, typer.Argument(help="Unique tenant name.")]) -> None:
    """Create a tenant and print its API key. The key is shown once and stored only as a hash."""
    from app.errors import LetheError

    try:
        tenant_id, key = _with_tenants(settings_from_env(), lambda svc: svc.create_tenant(name))
    except LetheError as exc:
        _fail(exc)
        return
    typer.echo(f"tenant {name} ({tenant_id})", err=True)
    typer.echo(key)


@tenant_cli.command("key")
def tenant_key(name: Annotated[str, typer.Argument(help="Existing tenant name.")]) -> None:
    """Issue an additional API key for a tenant and print it once."""
    from app.errors import LetheError

    try:
        typer.echo(_with_tenants(settings_from_env(), lambda svc: svc.add_api_key(name)))
    except LetheError as exc:
        _fail(exc)


@tenant_cli.command("webhook-secret")
def tenant_webhook_secret(
    name: Annotated[str, typer.Argument(help="Existing tenant name.")],
    secret: Annotated[str | None, typer.Option(help="Use this whsec_<base64> secret instead of a new one.")] = None,
) -> None:
    """Set or rotate the tenant's detector-webhook secret and print it once."""
    from app.errors import LetheError

    try:
        typer.echo(_with_tenants(settings_from_env(), lambda svc: svc.rotate_webhook_secret(name, secret)))
    except (LetheError, ValueError) as exc:
        _fail(exc)


TenantOption = Annotated[str | None, typer.Option("--tenant", help="Only this tenant (by name).")]
JsonOption = Annotated[bool, typer.Option("--json", help="One JSON document instead of lines.")]


def _keys(action: Callable[[KeyAdmin], Awaitable[T]]) -> T:
    from app.keys.admin import UnknownTenant
    from app.keys.errors import Unavailable
    from app.keys.identity import KeyStoreMismatch

    try:
        return _with_keys(settings_from_env(), action)
    except (KeyStoreMismatch, Unavailable, UnknownTenant) as exc:
        _fail(exc)
        raise  # unreachable: _fail exits


@keys_cli.command("status")
def keys_status(tenant: TenantOption = None, as_json: JsonOption = False) -> None:
    """Per tenant: leaves, shards in the key store, pending shreds and the oldest one's age against the horizon."""
    from app.keys.admin import status_json, status_text

    lines = _keys(lambda admin: admin.status(tenant))
    typer.echo(status_json(lines) if as_json else status_text(lines))


@keys_cli.command("rotate")
def keys_rotate(as_json: JsonOption = False) -> None:
    """Run every pending shred now and sweep every shard of what killed writes left. Idempotent.
    Exits 1 when some shred is still pending (the key provider refused it)."""
    from app.keys.admin import rotation_json, rotation_text

    done = _keys(lambda admin: admin.rotate())
    typer.echo(rotation_json(done) if as_json else rotation_text(done))
    if done.pending:
        raise typer.Exit(code=1)


@keys_cli.command("verify")
def keys_verify(tenant: TenantOption = None, as_json: JsonOption = False) -> None:
    """Open every ciphertext a live row holds. Exits 1 when one is tampered or its key is missing from the store."""
    from app.keys.admin import verify_json, verify_text

    found = _keys(lambda admin: admin.verify(tenant))
    typer.echo(verify_json(found) if as_json else verify_text(found))
    if not found.healthy:
        raise typer.Exit(code=1)


@keys_cli.command("seal")
def keys_seal(
    batch: Annotated[int, typer.Option(min=1, max=10_000, help="Rows per transaction.")] = 200,
    vacuum: Annotated[str, typer.Option(help="Afterwards: plain (VACUUM, online), full (VACUUM FULL: rewrites "
                                              "the tables under an exclusive lock) or none.")] = "plain",
    as_json: JsonOption = False,
) -> None:
    """Seal the plaintext rows written before sealing (an upgrade's online migration), then VACUUM. Resumable.
    Exits 1 when rows stayed locked by writers through every pass (run it again)."""
    from app.keys.admin import sealing_json, sealing_text

    if vacuum not in ("plain", "full", "none"):
        typer.echo(f"--vacuum must be plain, full or none, not {vacuum!r}", err=True)
        raise typer.Exit(code=2)
    done = _keys(lambda admin: admin.seal(batch=batch, vacuum="full" if vacuum == "full" else
                                          "none" if vacuum == "none" else "plain"))
    typer.echo(sealing_json(done) if as_json else sealing_text(done))
    if any(done.left.values()):
        raise typer.Exit(code=1)


@cli.command()
def openapi(
    output: Annotated[Path, typer.Option(help="Where to write the spec.")] = Path("openapi.yaml"),
    check: Annotated[bool, typer.Option(help="Exit 1 if the file differs from the app's spec.")] = False,
) -> None:
    """Write (or check) openapi.yaml from the app's routes."""
    from app.openapi_spec import render_openapi_yaml

    rendered = render_openapi_yaml()
    if check:
        if not output.exists() or output.read_text() != rendered:
            typer.echo(f"{output} is out of date: run `lethe openapi`", err=True)
            raise typer.Exit(code=1)
        typer.echo(f"{output} is current")
        return
    output.write_text(rendered)
    typer.echo(f"wrote {output}")


@cli.command("eval")
def eval_(
    smoke: Annotated[bool, typer.Option("--smoke", help="The CI form: about two minutes on a 2-core CPU.")] = False,
    quick: Annotated[bool, typer.Option("--quick", help="About ten minutes on a 2-core CPU (the default).")] = False,
    full: Annotated[bool, typer.Option("--full", help="The paper-sized run, for a GPU deployment.")] = False,
    url: Annotated[str | None, typer.Option(help="A running Lethe (any engine); default: start one.")] = None,
    api_key: Annotated[str | None, typer.Option(help="An API key of that Lethe (with --url).")] = None,
    engine: Annotated[str, typer.Option(help="LETHE_ENGINE of the Lethe it starts (without --url).")] = "hf",
    out: Annotated[Path | None, typer.Option(help="Results directory (default bench/results/eval).")] = None,
    seed: Annotated[int | None, typer.Option(help="Seed of the episodes and sessions.")] = None,
) -> None:
    """Run the paper's forgetting audits and benchmarks against Lethe over HTTP; write a markdown report."""
    # The harness is not part of the installed package: it lives in the checkout beside app/ (bench/eval). It runs
    # there as a program of its own, so this package never imports it (nor puts the checkout on its own path).
    checkout = Path(__file__).resolve().parents[1]
    if not (checkout / "bench" / "eval").is_dir():
        typer.echo("lethe eval needs the source checkout (bench/eval beside app/) and `pip install -e '.[eval]'`",
                   err=True)
        raise typer.Exit(code=2)
    if sum((smoke, quick, full)) > 1:
        typer.echo("choose one of --smoke, --quick, --full", err=True)
        raise typer.Exit(code=2)
    args = ["--profile", "smoke" if smoke else "full" if full else "quick", "--engine", engine]
    for option, value in (("--url", url), ("--api-key", api_key), ("--out", out and out.resolve()), ("--seed", seed)):
        if value is not None:
            args += [option, str(value)]
    harness = subprocess.run([sys.executable, "-m", "bench.eval", *args], cwd=checkout, check=False)
    raise typer.Exit(code=harness.returncode)


def main() -> None:
    try:
        cli()
    except KeyboardInterrupt:  # pragma: no cover
        sys.exit(130)
