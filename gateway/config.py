"""Settings: `airgate.toml` plus `AIRGATE_*` overrides, validated once at start.

Unknown keys and bad values stop start-up with a message naming the key and where it came from.
Settings are frozen and built inside the CLI / `create_app`, never at import time.
"""

from __future__ import annotations

import os
import tomllib
from collections.abc import Mapping
from pathlib import Path
from typing import Annotated, Any, Literal

import msgspec
import platformdirs
from msgspec import Meta, Struct

from . import env

__all__ = [
    "BundleSettings",
    "ConfigError",
    "ConsoleSettings",
    "CostSettings",
    "DeploymentCost",
    "EgressSettings",
    "EngineSettings",
    "KmsSettings",
    "ModelSettings",
    "RoutingSettings",
    "ServerSettings",
    "Settings",
    "TelemetrySettings",
    "VllmSettings",
    "load_settings",
]

Port = Annotated[int, Meta(ge=0, le=65535)]
Positive = Annotated[int, Meta(ge=1)]


class ConfigError(Exception):
    """The configuration is invalid; the message names the key and its source."""


class _Section(Struct, forbid_unknown_fields=True, frozen=True, kw_only=True):
    pass


class ServerSettings(_Section, frozen=True, forbid_unknown_fields=True, kw_only=True):
    host: str = "127.0.0.1"
    port: Port = 8000
    max_request_bytes: Annotated[int, Meta(ge=1024, le=256 * 1024 * 1024)] = 4 * 1024 * 1024
    log_level: Literal["debug", "info", "warning", "error"] = "info"
    # SIGTERM/SIGINT: requests and streams in flight get this long to finish while new ones
    # are answered 503; those still running then are cut (gateway/http/drain.py)
    drain_timeout_s: Annotated[float, Meta(ge=0, le=3600)] = 30.0
    # ...and the listener stays open, answering 503, at least this long (within the drain
    # timeout), however soon the last request ends: until the load balancer has seen /ready
    # fail (HAProxy: its check interval x fall count) and sends nothing more
    drain_min_s: Annotated[float, Meta(ge=0, le=3600)] = 3.0
    # the request line and headers: bigger -> 431, more headers -> 431, not complete within
    # the timeout (counted from the connection or the request's first byte) -> 408 and closed
    max_header_bytes: Annotated[int, Meta(ge=1024, le=1024 * 1024)] = 32 * 1024
    max_headers: Annotated[int, Meta(ge=8, le=1000)] = 100
    header_timeout_s: Annotated[float, Meta(gt=0, le=300)] = 10.0
    # stderr: "json" (one object per line, for journals and pipes), "text" (short lines for a
    # person), "auto": text when stderr is a terminal, else JSON
    log_format: Literal["auto", "json", "text"] = "auto"


class EngineSettings(_Section, frozen=True, forbid_unknown_fields=True, kw_only=True):
    """Defaults for every llama.cpp model (a model entry may override each)."""

    slots: Annotated[int, Meta(ge=1, le=256)] = 4
    context_length: Annotated[int, Meta(ge=64, le=1_048_576)] = 4096
    batch_size: Annotated[int, Meta(ge=16, le=8192)] = 512
    max_waiting: Annotated[int, Meta(ge=0, le=100_000)] = 64
    n_threads: Annotated[int, Meta(ge=1, le=1024)] | None = None
    batch_invariant: bool = False  # see README: only matters above 7 slots


_DEPLOYMENT = r"^[A-Za-z0-9][A-Za-z0-9._:@/-]*$"


class VllmSettings(_Section, frozen=True, forbid_unknown_fields=True, kw_only=True):
    """Engine arguments of a vLLM deployment (`[models.vllm]`); vLLM's own defaults otherwise.

    A model larger than one GPU runs on `tensor_parallel_size * pipeline_parallel_size` GPUs
    (at most 64), one vLLM worker each.  `distributed_executor_backend`: "mp" starts the
    workers as processes on this node (it cannot span nodes); "ray" lets Ray place them on any
    node of its cluster, which a bundle cannot serve (its weights are decrypted into this
    node's memory: refused at start); None lets vLLM choose ("mp" for several workers on one
    node).
    """

    dtype: Literal["auto", "float32", "bfloat16", "float16"] = "auto"
    max_model_len: Annotated[int, Meta(ge=16, le=1_048_576)] | None = None
    gpu_memory_utilization: Annotated[float, Meta(gt=0, le=1)] = 0.9
    tensor_parallel_size: Annotated[int, Meta(ge=1, le=64)] = 1
    pipeline_parallel_size: Annotated[int, Meta(ge=1, le=64)] = 1
    distributed_executor_backend: Literal["mp", "ray"] | None = None
    enforce_eager: bool = False
    kv_cache_space_gib: Annotated[float, Meta(gt=0)] | None = None  # CPU builds: KV-cache size
    max_num_seqs: Annotated[int, Meta(ge=1, le=4096)] = 16  # sequences that run at once
    enable_prefix_caching: bool = True
    seed: int = 0

    def __post_init__(self) -> None:
        workers = self.tensor_parallel_size * self.pipeline_parallel_size
        if workers > 64:
            raise ValueError(
                f"tensor_parallel_size * pipeline_parallel_size is {workers}; at most 64 "
                "workers (GPUs) per deployment"
            )


class ModelSettings(_Section, frozen=True, forbid_unknown_fields=True, kw_only=True):
    """One deployment: an engine serving the model `id` (and its aliases).

    Several entries may share an `id`: the router then sends each request to one of them by
    class, health and load (e.g. the same model as safetensors on vLLM and as GGUF on
    llama.cpp).  `name` tells the deployments apart (default: the id, or `<id>@<engine>`).
    """

    id: Annotated[
        str, Meta(min_length=1, max_length=128, pattern=r"^[A-Za-z0-9][A-Za-z0-9._:/-]*$")
    ]
    name: Annotated[str, Meta(min_length=1, max_length=128, pattern=_DEPLOYMENT)] | None = None
    engine: Literal["llama.cpp", "vllm", "echo"] = "llama.cpp"
    # generate (chat, completions) or embed (/v1/embeddings); None: the bundle's hint, else
    # generate
    task: Literal["generate", "embed"] | None = None
    # gpu: preferred; edge: takes the overflow (default: vllm -> gpu, others -> edge)
    engine_class: Literal["gpu", "edge"] | None = msgspec.field(default=None, name="class")
    weight: Annotated[float, Meta(gt=0, le=1000)] = 1.0  # relative speed per sequence slot
    # requests that may wait inside the engine beyond its capacity (default: its own bound);
    # beyond that they wait at the gateway ([routing])
    max_queue: Annotated[int, Meta(ge=0, le=100_000)] | None = None
    bundle: str | None = None  # signed, encrypted bundle (directory or .tar): the normal case
    path: str | None = None  # plain model file/dir: only with `serve --insecure-plaintext-model`
    aliases: list[str] = []
    chat_template: str | None = None  # default: the bundle's (llama.cpp: else "gemma")
    slots: Annotated[int, Meta(ge=1, le=256)] | None = None
    context_length: Annotated[int, Meta(ge=64, le=1_048_576)] | None = None
    batch_size: Annotated[int, Meta(ge=16, le=8192)] | None = None
    max_waiting: Annotated[int, Meta(ge=0, le=100_000)] | None = None
    n_threads: Annotated[int, Meta(ge=1, le=1024)] | None = None
    batch_invariant: bool | None = None
    vllm: VllmSettings | None = None  # engine = "vllm" only

    @property
    def deployment(self) -> str:
        return self.name or self.id

    @property
    def resolved_class(self) -> Literal["gpu", "edge"]:
        if self.engine_class is not None:
            return self.engine_class
        return "gpu" if self.engine == "vllm" else "edge"


class BundleSettings(_Section, frozen=True, forbid_unknown_fields=True, kw_only=True):
    """Which bundles this gateway accepts."""

    # `ed25519:<base64>` keys, or files holding one per line; the data dir's own signing key
    # (which seals the embedded default) is always trusted
    trusted_keys: list[str] = []
    # key providers a bundle's data key may be unwrapped with (default: every configured one)
    allowed_providers: list[Literal["local", "pkcs11", "vault-transit", "aws-kms"]] | None = None


class LocalKmsSettings(_Section, frozen=True, forbid_unknown_fields=True, kw_only=True):
    key_file: str = ""  # default: <data_dir>/keys/kms-local.json


class Pkcs11Settings(_Section, frozen=True, forbid_unknown_fields=True, kw_only=True):
    module: str  # the HSM vendor's PKCS#11 library
    token_label: str
    pin_env: str = "AIRGATE_PKCS11_PIN"  # the PIN is read from this variable, never the file


class VaultTransitSettings(_Section, frozen=True, forbid_unknown_fields=True, kw_only=True):
    address: str
    mount: str = "transit"
    namespace: str | None = None
    ca_cert: str | None = None
    token_env: str = "VAULT_TOKEN"  # the token is read from this variable, never the file
    timeout_s: Annotated[float, Meta(gt=0)] = 10.0


class AwsKmsSettings(_Section, frozen=True, forbid_unknown_fields=True, kw_only=True):
    region: str
    endpoint_url: str | None = None  # a VPC endpoint in an air-gapped network
    profile: str | None = None  # credentials: boto3's usual chain (env, profile, role)


class KmsSettings(_Section, frozen=True, forbid_unknown_fields=True, kw_only=True):
    local: LocalKmsSettings = LocalKmsSettings()
    pkcs11: Pkcs11Settings | None = None
    vault_transit: VaultTransitSettings | None = None
    aws_kms: AwsKmsSettings | None = None


class JwtSettings(_Section, frozen=True, forbid_unknown_fields=True, kw_only=True):
    jwks_file: str  # a local JWKS file; never fetched from a URL
    issuer: str
    audience: str
    algorithms: list[Literal["RS256", "RS384", "RS512", "ES256", "ES384", "PS256", "EdDSA"]] = (
        msgspec.field(default_factory=lambda: ["RS256", "ES256", "EdDSA"])
    )
    leeway_s: Annotated[float, Meta(ge=0, le=300)] = 30.0
    team_claim: str = "team"
    roles_claim: str = "roles"
    role_map: dict[str, Literal["app", "auditor", "admin", "global_auditor"]] = {}  # claim -> role


class MtlsSettings(_Section, frozen=True, forbid_unknown_fields=True, kw_only=True):
    ca_file: str  # client certificates must chain to this CA
    cert_file: str  # the server's certificate and key
    key_file: str
    # certificate subject CN (or "sha256:<fingerprint>") -> {team = "...", roles = ["app"]}
    subjects: dict[str, dict[str, str | list[str]]] = {}


class AuthSettings(_Section, frozen=True, forbid_unknown_fields=True, kw_only=True):
    # the API key pepper shared by replicas: a mounted secret file (32 bytes, raw or hex or
    # base64; `${CREDENTIALS_DIRECTORY}/name` for a systemd credential) that must exist, or
    # $AIRGATE_PEPPER instead; neither: <data_dir>/keys/api-key-pepper, created (0600)
    pepper_file: str = ""
    # an admin key made offline (`airgate keys new-secret`) and mounted as a secret: the first
    # start registers it (its hash only) instead of minting one; read only while no admin exists
    initial_admin_key_file: str = ""
    public_metrics: bool = False  # /metrics without a key (for scrapers on a trusted network)
    jwt: JwtSettings | None = None
    mtls: MtlsSettings | None = None
    # requests that fail authentication, per client address: a token bucket of `failure_burst`
    # refilled at `failure_rate_per_s`; once empty, 429 before any credential is looked up
    # (0: no limit, e.g. behind a proxy that every caller shares)
    failure_burst: Annotated[int, Meta(ge=0, le=1_000_000)] = 60
    failure_rate_per_s: Annotated[float, Meta(gt=0, le=10_000)] = 1.0
    # auth failures are audited as one event per (address, reason) per window, with a count
    # (the first of a window at once); 0: one event per failure
    failure_audit_window_s: Annotated[float, Meta(ge=0, le=3600)] = 10.0
    # a keyless request over loopback TCP from the OS user the server runs as is that user's
    # app (team "local", role app; see README); needs a loopback [server] host and no mTLS
    local_trust: bool = False


class PolicySettings(_Section, frozen=True, forbid_unknown_fields=True, kw_only=True):
    path: str = ""  # a directory of *.toml policy documents, or one file; default: shipped


class LimitSettings(_Section, frozen=True, forbid_unknown_fields=True, kw_only=True):
    redis_url: str = ""  # empty: limits are kept in this process
    fail_mode: Literal["open", "closed"] = "open"  # Redis unreachable: local limits, or 503

    def __post_init__(self) -> None:
        if self.redis_url:
            from .access.limits.resp import parse_redis_url  # what the limiter will connect with

            parse_redis_url(self.redis_url)  # raises ValueError naming what it does not take


class AuditSignerSettings(_Section, frozen=True, forbid_unknown_fields=True, kw_only=True):
    """The key that signs audit checkpoints.  `local`: an Ed25519 key file (laptops; default
    <data_dir>/keys/audit-signing.key); the others sign inside the provider configured in
    [kms] and never reveal the key."""

    provider: Literal["local", "pkcs11", "vault-transit", "aws-kms"] = "local"
    key_ref: str = ""  # local: the key file; pkcs11: the key label; Transit: the key name;
    # AWS KMS: the key id, ARN or alias


class AuditSettings(_Section, frozen=True, forbid_unknown_fields=True, kw_only=True):
    database_url: str = ""  # default: SQLite in the data dir; postgresql://... for production
    strict: bool = True  # an answered request is always audited; no database -> 503
    checkpoint_every: Annotated[int, Meta(ge=1)] = 1000
    # this writer's chain of the shared log: each replica on one database needs its own (its
    # pod or host name); two running processes with the same chain are refused.  Empty: the
    # deployment's one chain (a single gateway)
    chain: Annotated[str, Meta(max_length=64, pattern=r"^([A-Za-z0-9][A-Za-z0-9._-]*)?$")] = ""
    signer: AuditSignerSettings = AuditSignerSettings()
    # public keys verification trusts (`ed25519:...`, `ecdsa-p256:...`, or files of them);
    # never the data directory's own key file
    trusted_keys: list[str] = []
    # enrolled laptops (HQ): their enrolment requests (`airgate device enroll`), as files or
    # the JSON text inline; each device's key is trusted for that device's own chain only
    devices: list[str] = []
    # witnesses that receive every published checkpoint, outside the database: an append-only
    # directory on another mount (WORM in production), and a syslog address
    # ("udp://host:port", "tcp://host:port" or a unix socket path)
    witness_dir: str = ""
    witness_syslog: str = ""
    witness_interval_s: Annotated[float, Meta(gt=0, le=60)] = 1.0
    migrate: bool = False  # PostgreSQL: migrate an old schema at start (SQLite always does)
    # SQLite: "full" fsyncs every commit (survives power loss, ~2-5 ms a commit on ordinary
    # disks); "normal" is durable against any crash of airgate and reaches the disk at the
    # next WAL checkpoint.  PostgreSQL follows its own synchronous_commit.
    sqlite_synchronous: Literal["full", "normal"] = "full"


class TelemetrySettings(_Section, frozen=True, forbid_unknown_fields=True, kw_only=True):
    """OpenTelemetry traces (off by default).  Spans carry GenAI metadata only: an allow-list
    applied at export drops every other attribute, every event and every status message."""

    # OTLP/HTTP (protobuf) traces endpoint of a collector, e.g. http://127.0.0.1:4318/v1/traces;
    # empty: no tracing
    otlp_endpoint: str = ""
    service_name: Annotated[str, Meta(min_length=1, max_length=128)] = "airgate"
    sample_ratio: Annotated[float, Meta(ge=0.0, le=1.0)] = 1.0
    timeout_s: Annotated[float, Meta(gt=0, le=60)] = 5.0
    # CA bundle for an https:// collector (default: the system's)
    ca_file: str | None = None


class EgressSettings(_Section, frozen=True, forbid_unknown_fields=True, kw_only=True):
    """The runtime egress guard (README, "Egress guard"): connections from `serve` and its
    children (vLLM's engine core) go only to loopback, the endpoints configured above (Redis,
    PostgreSQL, KMS, OTLP collector, syslog witness) and `allow`; anything else is refused
    before it connects, counted and audited (`egress.denied`)."""

    enabled: bool = True
    # more destinations: "host:port", "host" (every port), "10.0.0.0/8:443", "[2001:db8::1]:443"
    allow: list[str] = []

    def __post_init__(self) -> None:
        from .egress.allow_list import parse_entry

        for entry in self.allow:
            parse_entry(entry)  # raises ValueError naming the entry


class RoutingSettings(_Section, frozen=True, forbid_unknown_fields=True, kw_only=True):
    """How requests wait when every deployment of a model is full, and when a deployment is
    taken out of rotation."""

    queue_size: Annotated[int, Meta(ge=0, le=1_000_000)] = 256  # per model; 0: never wait
    queue_timeout_s: Annotated[float, Meta(gt=0, le=3600)] = 30.0
    team_share: Annotated[float, Meta(gt=0, le=1)] = 0.5  # most of the queue one team may hold
    breaker_failures: Annotated[int, Meta(ge=1, le=1000)] = 5  # consecutive, to open
    breaker_open_s: Annotated[float, Meta(ge=0, le=3600)] = 30.0  # before one probe
    retry: bool = True  # a failure before the first token is retried once elsewhere


class ConsoleSettings(_Section, frozen=True, forbid_unknown_fields=True, kw_only=True):
    """The compliance console's sign-in sessions (kept in the serving process: one replica's
    session is unknown to the others, so a load balancer must keep a browser on one replica)."""

    idle_timeout_s: Annotated[float, Meta(gt=0, le=86_400)] = 900.0  # no request for this long
    absolute_timeout_s: Annotated[float, Meta(gt=0, le=7 * 86_400)] = 8 * 3600.0  # since sign-in


# money: non-negative, finite (TOML allows inf and nan; the bounds refuse both)
Money = Annotated[float, Meta(ge=0, le=1e12)]
Price = Annotated[float, Meta(gt=0, le=1e12)]  # per 1M tokens: divided by, so never 0


class DeploymentCost(_Section, frozen=True, forbid_unknown_fields=True, kw_only=True):
    """What one deployment (`deployment = "<name>"`), or every deployment of an engine class
    (`class = "gpu" | "edge"`), costs to run: hardware by the hour or by the month (one of the
    two), operations (power, support, staff) by the month, and the API price per 1M tokens it
    is compared against (default: `[cost] api_price_per_million`).  A month is 730 hours."""

    deployment: Annotated[str, Meta(max_length=128, pattern=_DEPLOYMENT)] | None = None
    engine_class: Literal["gpu", "edge"] | None = msgspec.field(default=None, name="class")
    hardware_per_hour: Money | None = None
    hardware_per_month: Money | None = None
    operations_per_month: Money = 0.0
    api_price_per_million: Price | None = None

    def __post_init__(self) -> None:
        if (self.deployment is None) == (self.engine_class is None):
            raise ValueError("a [[cost.deployments]] entry names one `deployment` or one `class`")
        if (self.hardware_per_hour is None) == (self.hardware_per_month is None):
            raise ValueError(
                "a [[cost.deployments]] entry gives one of `hardware_per_hour` or "
                "`hardware_per_month`"
            )


class CostSettings(_Section, frozen=True, forbid_unknown_fields=True, kw_only=True):
    """The TCO report's inputs (`airgate report tco`): a label for the currency, the API price
    per 1M tokens self-hosting is compared against, and each deployment's costs."""

    currency: Annotated[str, Meta(pattern=r"^[A-Z]{3}$")] = "USD"
    api_price_per_million: Price | None = None
    deployments: list[DeploymentCost] = []

    def __post_init__(self) -> None:
        seen: set[tuple[str, str]] = set()
        for entry in self.deployments:
            which = (
                ("deployment", entry.deployment)
                if entry.deployment is not None
                else ("class", str(entry.engine_class))
            )
            if which in seen:
                raise ValueError(f"[[cost.deployments]] {which[0]} {which[1]!r} is priced twice")
            seen.add(which)


class Settings(_Section, frozen=True, forbid_unknown_fields=True, kw_only=True):
    data_dir: str = ""  # filled by load_settings when empty
    server: ServerSettings = ServerSettings()
    engine: EngineSettings = EngineSettings()
    bundles: BundleSettings = BundleSettings()
    kms: KmsSettings = KmsSettings()
    auth: AuthSettings = AuthSettings()
    policy: PolicySettings = PolicySettings()
    limits: LimitSettings = LimitSettings()
    audit: AuditSettings = AuditSettings()
    telemetry: TelemetrySettings = TelemetrySettings()
    routing: RoutingSettings = RoutingSettings()
    console: ConsoleSettings = ConsoleSettings()
    cost: CostSettings = CostSettings()
    egress: EgressSettings = EgressSettings()
    models: list[ModelSettings] = []


def default_data_dir() -> Path:
    return Path(platformdirs.user_data_dir("airgate", appauthor=False))


_ENV_SECTIONS = (
    "server",
    "engine",
    "policy",
    "limits",
    "audit",
    "telemetry",
    "routing",
    "console",
    "egress",
)


def _env_value(text: str) -> Any:
    try:
        return tomllib.loads(f"v = {text}")["v"]
    except tomllib.TOMLDecodeError:
        return text


def _apply_env(raw: dict[str, Any], environ: Mapping[str, str]) -> None:
    for name, text in environ.items():
        if not name.startswith(env.PREFIX) or name in env.DIRECT:
            continue
        path = name[len(env.PREFIX) :].lower().split("__")
        if len(path) != 2 or path[0] not in _ENV_SECTIONS:
            raise ConfigError(
                f"unknown environment variable {name}: expected AIRGATE_<SECTION>__<KEY> with "
                f"SECTION one of {', '.join(s.upper() for s in _ENV_SECTIONS)} "
                f"(or {', '.join(sorted(env.DIRECT))})"
            )
        section = raw.setdefault(path[0], {})
        if not isinstance(section, dict):
            raise ConfigError(f"[{path[0]}] must be a table")
        section[path[1]] = _env_value(text)


def load_settings(
    config_file: str | os.PathLike[str] | None = None,
    *,
    environ: Mapping[str, str] | None = None,
    overrides: Mapping[str, Any] | None = None,
) -> Settings:
    """Read the file (if any), apply the environment, then explicit overrides (CLI flags).

    `overrides` keys are dotted (`server.port`).  Precedence: flags > environment > file.
    """
    environ = os.environ if environ is None else environ
    config_file = config_file or environ.get(env.CONFIG)
    raw: dict[str, Any] = {}
    source = "defaults"
    if config_file:
        path = Path(config_file)
        source = str(path)
        try:
            raw = tomllib.loads(path.read_text(encoding="utf-8"))
        except FileNotFoundError:
            raise ConfigError(f"configuration file {path} does not exist") from None
        except tomllib.TOMLDecodeError as exc:
            raise ConfigError(f"{path} is not valid TOML: {exc}") from None
    _apply_env(raw, environ)
    if environ.get(env.DATA_DIR):
        raw["data_dir"] = environ[env.DATA_DIR]
    for dotted, value in (overrides or {}).items():
        if value is None:
            continue
        *parents, leaf = dotted.split(".")
        node = raw
        for part in parents:
            node = node.setdefault(part, {})
            if not isinstance(node, dict):
                raise ConfigError(f"[{part}] must be a table")
        node[leaf] = value
    try:
        settings = msgspec.convert(raw, Settings)
    except msgspec.ValidationError as exc:
        raise ConfigError(
            f"invalid configuration ({source} + environment): {_describe(exc)}"
        ) from None
    if not settings.data_dir:
        settings = msgspec.structs.replace(settings, data_dir=str(default_data_dir()))
    _check_models(settings)
    _check_local_trust(settings)
    return settings


def _describe(exc: msgspec.ValidationError) -> str:
    # "Object contains unknown field `x` - at `$.server`" -> "server.x: unknown key"
    text = str(exc)
    message, _, where = text.partition(" - at ")
    key = where.strip("`").removeprefix("$").lstrip(".")
    if message.startswith("Object contains unknown field"):
        field = message.split("`")[1]
        return f"unknown key {'.'.join(p for p in (key, field) if p)!r}"
    return f"{key or 'top level'}: {message}"


def _check_local_trust(settings: Settings) -> None:
    if not settings.auth.local_trust:
        return
    from .access.auth.local_trust import is_loopback_host  # the check the server applies

    host = settings.server.host
    if not is_loopback_host(host):
        raise ConfigError(
            "[auth] local_trust needs a loopback [server] host (127.0.0.1, ::1 or localhost), "
            f"not {host!r}: a keyless caller is trusted only because it runs on this machine "
            "as this user; bind to 127.0.0.1, or turn local_trust off and use API keys"
        )
    if settings.auth.mtls is not None:
        raise ConfigError(
            "[auth] local_trust and [auth.mtls] exclude each other: with mTLS every caller "
            "is identified by its client certificate; remove one of them"
        )


def _check_models(settings: Settings) -> None:
    owner: dict[str, str] = {}  # served name -> model id
    deployments: set[str] = set()
    ids = [m.id for m in settings.models]
    for model in settings.models:
        names = (model.id, *model.aliases)
        if len(set(names)) != len(names):
            raise ConfigError(f"model {model.id!r}: a name is declared twice in its aliases")
        for name in names:
            if owner.setdefault(name, model.id) != model.id:
                raise ConfigError(f"model id or alias {name!r} is declared for two models")
        deployment = model.name or (model.id if ids.count(model.id) == 1 else None)
        if deployment is None:
            raise ConfigError(f"model {model.id!r} has several deployments: give each a `name`")
        if deployment in deployments:
            raise ConfigError(f"deployment name {deployment!r} is declared twice")
        deployments.add(deployment)
        if model.vllm is not None and model.engine != "vllm":
            raise ConfigError(f'deployment {deployment!r}: [models.vllm] needs engine = "vllm"')
        if model.engine == "echo":
            continue
        if bool(model.bundle) == bool(model.path):
            raise ConfigError(
                f"model {model.id!r}: give exactly one of `bundle` (a sealed bundle) or `path` "
                "(a plain model, accepted only with --insecure-plaintext-model)"
            )
