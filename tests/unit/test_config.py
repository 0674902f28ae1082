"""gateway/config.py: file, environment and flag settings, validated once with named keys."""

from __future__ import annotations

from pathlib import Path

import pytest

from gateway.config import ConfigError, Settings, load_settings

NO_ENV: dict[str, str] = {}


def _write(tmp_path: Path, text: str, name: str = "airgate.toml") -> Path:
    path = tmp_path / name
    path.write_text(text, encoding="utf-8")
    return path


def test_defaults_without_file_or_environment() -> None:
    settings = load_settings(None, environ=NO_ENV)
    assert settings.server.host == "127.0.0.1"
    assert settings.server.port == 8000
    assert settings.engine.slots == 4
    assert settings.models == []
    assert settings.data_dir  # filled with the platform's user data directory


def test_file_values(tmp_path: Path) -> None:
    path = _write(
        tmp_path,
        """
data_dir = "/srv/airgate"

[server]
host = "0.0.0.0"
port = 8443
log_level = "debug"

[engine]
slots = 2
context_length = 2048

[[models]]
id = "gemma"
path = "/models/gemma.gguf"
aliases = ["default"]
slots = 1

[[models]]
id = "echo"
engine = "echo"
""",
    )
    settings = load_settings(path, environ=NO_ENV)
    assert settings.data_dir == "/srv/airgate"
    assert (settings.server.host, settings.server.port) == ("0.0.0.0", 8443)
    assert settings.server.log_level == "debug"
    assert (settings.engine.slots, settings.engine.context_length) == (2, 2048)
    assert [m.id for m in settings.models] == ["gemma", "echo"]
    assert settings.models[0].path == "/models/gemma.gguf"
    assert settings.models[0].aliases == ["default"]
    assert settings.models[0].slots == 1
    assert settings.models[1].engine == "echo"


def test_config_file_named_by_the_environment(tmp_path: Path) -> None:
    path = _write(tmp_path, "[server]\nport = 8123\n")
    settings = load_settings(None, environ={"AIRGATE_CONFIG": str(path)})
    assert settings.server.port == 8123


def test_environment_values_are_parsed_as_toml_scalars() -> None:
    settings = load_settings(
        None,
        environ={
            "AIRGATE_SERVER__PORT": "9001",
            "AIRGATE_ENGINE__SLOTS": "8",
            "AIRGATE_SERVER__HOST": "0.0.0.0",  # not TOML: taken as text
            "AIRGATE_SERVER__LOG_LEVEL": '"warning"',
        },
    )
    assert settings.server.port == 9001
    assert isinstance(settings.server.port, int)
    assert settings.engine.slots == 8
    assert isinstance(settings.engine.slots, int)
    assert settings.server.host == "0.0.0.0"
    assert settings.server.log_level == "warning"


def test_unrelated_environment_variables_are_ignored() -> None:
    settings = load_settings(None, environ={"PATH": "/bin", "AIRGATEWAY": "x", "HOME": "/root"})
    assert settings.server.port == 8000


def test_the_client_commands_variables_are_not_configuration() -> None:
    """`airgate run` / `ls` / `ps` read these; a server started in the same shell ignores them."""
    environ = {"AIRGATE_API_KEY": "ag_x", "AIRGATE_HOST": "http://127.0.0.1:9000"}
    assert load_settings(None, environ=environ).server.host == "127.0.0.1"


def test_data_dir_from_the_environment(tmp_path: Path) -> None:
    path = _write(tmp_path, 'data_dir = "/from/file"\n')
    settings = load_settings(path, environ={"AIRGATE_DATA_DIR": "/from/env"})
    assert settings.data_dir == "/from/env"


def test_precedence_flags_over_environment_over_file(tmp_path: Path) -> None:
    path = _write(tmp_path, '[server]\nport = 1111\nhost = "file-host"\n[engine]\nslots = 3\n')
    environ = {"AIRGATE_SERVER__PORT": "2222", "AIRGATE_ENGINE__SLOTS": "5"}

    file_only = load_settings(path, environ=NO_ENV)
    assert (file_only.server.port, file_only.engine.slots) == (1111, 3)

    with_env = load_settings(path, environ=environ)
    assert (with_env.server.port, with_env.engine.slots) == (2222, 5)
    assert with_env.server.host == "file-host"  # untouched keys keep the file's value

    with_flags = load_settings(path, environ=environ, overrides={"server.port": 3333})
    assert (with_flags.server.port, with_flags.engine.slots) == (3333, 5)


def test_a_flag_left_unset_does_not_override() -> None:
    settings = load_settings(
        None, environ={"AIRGATE_SERVER__PORT": "2222"}, overrides={"server.port": None}
    )
    assert settings.server.port == 2222


def test_settings_are_frozen() -> None:
    settings = load_settings(None, environ=NO_ENV)
    assert isinstance(settings, Settings)
    with pytest.raises(AttributeError):
        settings.server.port = 1  # type: ignore[misc,unused-ignore]


@pytest.mark.parametrize(
    ("text", "key"),
    [
        ("[server]\nprot = 8000\n", "server.prot"),
        ("[engine]\nslot = 8\n", "engine.slot"),
        ("sever = 1\n", "sever"),
        ('[[models]]\nid = "e"\nengine = "echo"\nalias = ["x"]\n', "models[0].alias"),
    ],
)
def test_unknown_key_in_file_is_named(tmp_path: Path, text: str, key: str) -> None:
    path = _write(tmp_path, text)
    with pytest.raises(ConfigError) as info:
        load_settings(path, environ=NO_ENV)
    message = str(info.value)
    assert key in message
    assert "unknown key" in message
    assert str(path) in message  # where it came from


@pytest.mark.parametrize(
    ("text", "key"),
    [
        ("[server]\nport = 70000\n", "server.port"),
        ("[server]\nport = -1\n", "server.port"),
        ('[server]\nport = "8000"\n', "server.port"),
        ('[server]\nlog_level = "verbose"\n', "server.log_level"),
        ("[engine]\nslots = 0\n", "engine.slots"),
        ("[engine]\ncontext_length = 10\n", "engine.context_length"),
        ("server = 5\n", "server"),
        ('[[models]]\nid = "bad id"\nengine = "echo"\n', "models[0].id"),
        ('[[models]]\nid = "m"\nengine = "tgi"\n', "models[0].engine"),
    ],
)
def test_bad_value_names_the_key(tmp_path: Path, text: str, key: str) -> None:
    path = _write(tmp_path, text)
    with pytest.raises(ConfigError) as info:
        load_settings(path, environ=NO_ENV)
    assert f"{key}:" in str(info.value)


def test_bad_environment_value_names_the_key() -> None:
    with pytest.raises(ConfigError, match=r"server\.port") as info:
        load_settings(None, environ={"AIRGATE_SERVER__PORT": "eighty"})
    assert "environment" in str(info.value)


def test_unknown_key_through_the_environment_is_named() -> None:
    with pytest.raises(ConfigError, match=r"server\.prot"):
        load_settings(None, environ={"AIRGATE_SERVER__PROT": "1"})


@pytest.mark.parametrize(
    "name",
    ["AIRGATE_PORT", "AIRGATE_MODELS__ID", "AIRGATE_SERVER__TLS__CERT", "AIRGATE_DATADIR"],
)
def test_unknown_environment_variable_is_named(name: str) -> None:
    with pytest.raises(ConfigError) as info:
        load_settings(None, environ={name: "1"})
    assert name in str(info.value)


def test_invalid_toml(tmp_path: Path) -> None:
    path = _write(tmp_path, "[server\nport = 1\n")
    with pytest.raises(ConfigError, match="not valid TOML") as info:
        load_settings(path, environ=NO_ENV)
    assert str(path) in str(info.value)


def test_missing_file(tmp_path: Path) -> None:
    path = tmp_path / "nope.toml"
    with pytest.raises(ConfigError, match="does not exist") as info:
        load_settings(path, environ=NO_ENV)
    assert str(path) in str(info.value)


@pytest.mark.parametrize(
    "models",
    [
        '[[models]]\nid = "a"\nengine = "echo"\n[[models]]\nid = "b"\nengine = "echo"\n'
        'aliases = ["a"]\n',
        '[[models]]\nid = "a"\nengine = "echo"\naliases = ["x"]\n'
        '[[models]]\nid = "b"\nengine = "echo"\naliases = ["x"]\n',
        '[[models]]\nid = "a"\nengine = "echo"\naliases = ["a"]\n',
    ],
    ids=["alias-id", "alias-alias", "own-alias"],
)
def test_duplicate_model_id_or_alias(tmp_path: Path, models: str) -> None:
    path = _write(tmp_path, models)
    with pytest.raises(ConfigError, match=r"declared twice|declared for two models"):
        load_settings(path, environ=NO_ENV)


def test_one_model_several_deployments_need_names(tmp_path: Path) -> None:
    twice = '[[models]]\nid = "a"\nengine = "echo"\n[[models]]\nid = "a"\nengine = "echo"\n'
    with pytest.raises(ConfigError, match="give each a `name`"):
        load_settings(_write(tmp_path, twice), environ=NO_ENV)
    named = (
        '[[models]]\nid = "a"\nname = "a-gpu"\nengine = "echo"\nclass = "gpu"\n'
        '[[models]]\nid = "a"\nname = "a-edge"\nengine = "echo"\nweight = 0.5\nmax_queue = 3\n'
    )
    settings = load_settings(_write(tmp_path, named), environ=NO_ENV)
    gpu, edge = settings.models
    assert (gpu.deployment, gpu.resolved_class) == ("a-gpu", "gpu")
    assert (edge.deployment, edge.resolved_class, edge.weight, edge.max_queue) == (
        "a-edge",
        "edge",
        0.5,
        3,
    )
    same_name = named.replace('"a-edge"', '"a-gpu"')
    with pytest.raises(ConfigError, match="deployment name 'a-gpu' is declared twice"):
        load_settings(_write(tmp_path, same_name), environ=NO_ENV)


def test_vllm_section_only_for_vllm(tmp_path: Path) -> None:
    text = '[[models]]\nid = "a"\nengine = "echo"\n[models.vllm]\nmax_num_seqs = 4\n'
    with pytest.raises(ConfigError, match="needs engine"):
        load_settings(_write(tmp_path, text), environ=NO_ENV)
    text = '[[models]]\nid = "a"\nengine = "vllm"\nbundle = "/b"\n[models.vllm]\nmax_num_seqs = 4\n'
    (model,) = load_settings(_write(tmp_path, text), environ=NO_ENV).models
    assert model.vllm is not None and model.vllm.max_num_seqs == 4
    assert model.resolved_class == "gpu"


@pytest.mark.parametrize(
    "model",
    [
        '[[models]]\nid = "gemma"\n',
        '[[models]]\nid = "gemma"\nbundle = "/b"\npath = "/m.gguf"\n',
    ],
    ids=["neither", "both"],
)
def test_llamacpp_model_needs_exactly_a_bundle_or_a_path(tmp_path: Path, model: str) -> None:
    path = _write(tmp_path, model)
    with pytest.raises(ConfigError, match="exactly one of `bundle`") as info:
        load_settings(path, environ=NO_ENV)
    assert "gemma" in str(info.value)
    assert "--insecure-plaintext-model" in str(info.value)


def test_bundle_and_kms_sections(tmp_path: Path) -> None:
    path = _write(
        tmp_path,
        """
[bundles]
trusted_keys = ["ed25519:AAAA", "/etc/airgate/release.pub"]
allowed_providers = ["pkcs11", "vault-transit"]

[kms.local]
key_file = "/etc/airgate/kms.json"

[kms.pkcs11]
module = "/usr/lib/softhsm/libsofthsm2.so"
token_label = "airgate"

[kms.vault_transit]
address = "https://vault.internal:8200"
namespace = "bank"

[kms.aws_kms]
region = "eu-west-1"
endpoint_url = "https://vpce-1.kms.eu-west-1.vpce.amazonaws.com"

[[models]]
id = "gemma"
bundle = "/srv/bundles/gemma.tar"
""",
    )
    settings = load_settings(path, environ=NO_ENV)
    assert settings.bundles.allowed_providers == ["pkcs11", "vault-transit"]
    assert settings.kms.local.key_file == "/etc/airgate/kms.json"
    assert settings.kms.pkcs11 is not None and settings.kms.pkcs11.pin_env == "AIRGATE_PKCS11_PIN"
    assert settings.kms.vault_transit is not None
    assert settings.kms.vault_transit.token_env == "VAULT_TOKEN"
    assert settings.kms.aws_kms is not None and settings.kms.aws_kms.region == "eu-west-1"
    assert settings.models[0].bundle == "/srv/bundles/gemma.tar"


@pytest.mark.parametrize(
    ("text", "key"),
    [
        ('[kms.pkcs11]\nmodule = "m"\ntoken_label = "t"\npin = "1234"\n', "kms.pkcs11.pin"),
        ('[kms.pkcs11]\nmodule = "m"\n', "kms.pkcs11"),
        ('[kms.vault_transit]\naddress = "a"\ntoken = "s.secret"\n', "kms.vault_transit.token"),
        ('[bundles]\nallowed_providers = ["gcp"]\n', "bundles.allowed_providers"),
        ("[kms.azure]\nx = 1\n", "kms.azure"),
    ],
    ids=["pin-in-file", "missing-token-label", "token-in-file", "unknown-provider", "unknown-kms"],
)
def test_bad_kms_settings_name_the_key(tmp_path: Path, text: str, key: str) -> None:
    # secrets are refused in the file: only the name of the variable holding them is accepted
    with pytest.raises(ConfigError) as info:
        load_settings(_write(tmp_path, text), environ=NO_ENV)
    assert key in str(info.value)
    assert "1234" not in str(info.value) and "s.secret" not in str(info.value)


def test_echo_model_needs_no_path(tmp_path: Path) -> None:
    path = _write(tmp_path, '[[models]]\nid = "echo"\nengine = "echo"\n')
    assert load_settings(path, environ=NO_ENV).models[0].path is None


def test_flag_into_a_section_that_is_not_a_table_is_a_config_error(tmp_path: Path) -> None:
    path = _write(tmp_path, "server = 5\n")
    with pytest.raises(ConfigError, match="server"):
        load_settings(path, environ=NO_ENV, overrides={"server.port": 9000})


@pytest.mark.parametrize(
    ("url", "message"),
    [
        ("redis://127.0.0.1:6379/0?health_check_interval=5", "unsupported Redis URL options"),
        ("memcached://127.0.0.1:11211", "starts with redis://"),
    ],
)
def test_a_redis_url_the_limiter_cannot_use_is_refused_at_load(url: str, message: str) -> None:
    with pytest.raises(ConfigError, match=message) as refused:
        load_settings(None, environ={"AIRGATE_LIMITS__REDIS_URL": url})
    assert "limits" in str(refused.value)


def test_a_redis_url_with_a_password_loads_and_the_error_never_shows_it() -> None:
    settings = load_settings(
        None, environ={"AIRGATE_LIMITS__REDIS_URL": "rediss://svc:s3cret@redis.corp:6390/2"}
    )
    assert settings.limits.redis_url.startswith("rediss://")
    with pytest.raises(ConfigError) as refused:
        load_settings(
            None, environ={"AIRGATE_LIMITS__REDIS_URL": "redis://svc:s3cret@redis.corp/x"}
        )
    assert "s3cret" not in str(refused.value)
