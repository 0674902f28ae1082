"""The deployment files in deploy/: every Kubernetes manifest is valid for the API server
(kubernetes-validate's bundled schemas, strict: a misspelt field fails), holds the properties
the design promises (non-root, read-only, no capabilities, probes, drain, the shared secrets,
one audit chain per pod, egress only to the named services), and the configuration it mounts
loads as the pod would load it; the systemd unit keeps its hardening."""

from __future__ import annotations

import configparser
import shutil
import subprocess
import tomllib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
import yaml

from gateway.config import load_settings
from policies.loader import parse_document

DEPLOY = Path(__file__).resolve().parents[2] / "deploy"
KUBERNETES = DEPLOY / "kubernetes"
UNIT = DEPLOY / "systemd" / "airgate.service"
# The newest Kubernetes whose schemas kubernetes-validate 1.37 ships.
KUBERNETES_VERSION = "1.37"
EGRESS_PORTS = {53, 5432, 6379, 8200, 4318}  # DNS, PostgreSQL, Redis, Vault, OTLP/HTTP

Doc = dict[str, Any]


def _manifests() -> list[Path]:
    return sorted(p for p in KUBERNETES.glob("*.yaml") if p.name != "kustomization.yaml")


def _documents() -> list[Doc]:
    return [doc for path in _manifests() for doc in yaml.safe_load_all(path.read_text()) if doc]


def _kind(kind: str) -> list[Doc]:
    return [doc for doc in _documents() if doc["kind"] == kind]


def _named(kind: str, name: str) -> Doc:
    (doc,) = (d for d in _kind(kind) if d["metadata"]["name"] == name)
    return doc


def _deployments() -> list[Doc]:
    return _kind("Deployment")


def _ids(docs: list[Doc]) -> list[str]:
    return [f"{d['kind']}/{d['metadata']['name']}" for d in docs]


def _pod(deployment: Doc) -> Doc:
    pod: Doc = deployment["spec"]["template"]["spec"]
    return pod


def _containers(deployment: Doc) -> Iterator[Doc]:
    pod = _pod(deployment)
    yield from pod.get("initContainers", [])
    yield from pod["containers"]


def _gateway(deployment: Doc) -> Doc:
    containers: list[Doc] = [c for c in _pod(deployment)["containers"] if c["name"] == "airgate"]
    (container,) = containers
    return container


def _env(container: Doc) -> dict[str, Doc]:
    return {e["name"]: e for e in container.get("env", [])}


def _mounted(deployment: Doc, path: str) -> tuple[Doc, str]:
    """(volume, path inside it) of the file or directory `path` as the gateway sees it."""
    container = _gateway(deployment)
    mounts = [
        m
        for m in container["volumeMounts"]
        if path == m["mountPath"] or path.startswith(m["mountPath"].rstrip("/") + "/")
    ]
    assert mounts, f"{path} is on no volume of {deployment['metadata']['name']}"
    mount = max(mounts, key=lambda m: len(m["mountPath"]))
    (volume,) = (v for v in _pod(deployment)["volumes"] if v["name"] == mount["name"])
    return volume, path[len(mount["mountPath"]) :].lstrip("/")


def _key(volume: Doc, inner: str) -> str:
    """The ConfigMap or Secret key a volume shows at `inner`."""
    source = volume.get("configMap") or volume.get("secret") or {}
    for item in source.get("items", []):
        if item["path"] == inner:
            return str(item["key"])
    return inner


def _source(volume: Doc) -> tuple[str, Doc]:
    """(kind, data) of the ConfigMap or Secret behind a volume."""
    if "configMap" in volume:
        return "ConfigMap", _named("ConfigMap", volume["configMap"]["name"])["data"]
    assert "secret" in volume, f"volume {volume['name']} is no ConfigMap or Secret"
    return "Secret", _named("Secret", volume["secret"]["secretName"])["stringData"]


def _config_text(deployment: Doc) -> str:
    """The airgate.toml the gateway container reads (AIRGATE_CONFIG)."""
    path = _env(_gateway(deployment))["AIRGATE_CONFIG"]["value"]
    volume, inner = _mounted(deployment, path)
    _, data = _source(volume)
    return str(data[_key(volume, inner)])


def _pod_environment(deployment: Doc, pod_name: str) -> dict[str, str]:
    """The gateway container's environment as the kubelet would build it."""
    environ: dict[str, str] = {}
    for name, entry in _env(_gateway(deployment)).items():
        if "value" in entry:
            environ[name] = entry["value"]
            continue
        source = entry["valueFrom"]
        if "fieldRef" in source:
            assert source["fieldRef"]["fieldPath"] == "metadata.name"
            environ[name] = pod_name
        else:
            ref = source["secretKeyRef"]
            environ[name] = _named("Secret", ref["name"])["stringData"][ref["key"]]
    return environ


# -- Kubernetes: schema ------------------------------------------------------------------------


def test_kustomization_lists_every_manifest() -> None:
    kustomization = yaml.safe_load((KUBERNETES / "kustomization.yaml").read_text())
    assert sorted(kustomization["resources"]) == [p.name for p in _manifests()]
    assert {d["metadata"].get("namespace") for d in _documents()} == {None}  # set by kustomize


@pytest.mark.parametrize("doc", _documents(), ids=_ids(_documents()))
def test_manifest_is_valid_kubernetes(doc: Doc) -> None:
    kubernetes_validate.validate(doc, KUBERNETES_VERSION, strict=True)


def test_one_concern_per_file() -> None:
    kinds = {p.name: {d["kind"] for d in yaml.safe_load_all(p.read_text())} for p in _manifests()}
    assert all(len(k) == 1 for k in kinds.values()), kinds
    assert {k for ks in kinds.values() for k in ks} >= {
        "Namespace",
        "Deployment",
        "Service",
        "PodDisruptionBudget",
        "ConfigMap",
        "Secret",
        "NetworkPolicy",
    }


# -- Kubernetes: the pods ----------------------------------------------------------------------


def test_one_deployment_per_engine_class() -> None:
    assert sorted(d["metadata"]["name"] for d in _deployments()) == ["airgate-edge", "airgate-gpu"]


@pytest.mark.parametrize("deployment", _deployments(), ids=_ids(_deployments()))
def test_pods_run_unprivileged(deployment: Doc) -> None:
    pod = _pod(deployment)
    assert pod["automountServiceAccountToken"] is False
    # a Service named airgate would otherwise inject AIRGATE_SERVICE_HOST..., which the
    # configuration refuses as unknown AIRGATE_* variables
    assert pod["enableServiceLinks"] is False
    context = pod["securityContext"]
    assert context["runAsNonRoot"] is True
    assert (context["runAsUser"], context["runAsGroup"]) == (10001, 10001)
    assert context["seccompProfile"] == {"type": "RuntimeDefault"}
    for container in _containers(deployment):
        own = container["securityContext"]
        assert own["runAsNonRoot"] is True
        assert own["readOnlyRootFilesystem"] is True
        assert own["allowPrivilegeEscalation"] is False
        assert own["capabilities"] == {"drop": ["ALL"]}
        assert "privileged" not in own
        assert container["image"] == "airgate:VERSION"
        assert container["imagePullPolicy"] == "IfNotPresent"


@pytest.mark.parametrize("deployment", _deployments(), ids=_ids(_deployments()))
def test_probes(deployment: Doc) -> None:
    gateway = _gateway(deployment)
    port = gateway["ports"][0]["name"]
    assert gateway["livenessProbe"]["httpGet"] == {"path": "/health", "port": port}
    assert gateway["readinessProbe"]["httpGet"] == {"path": "/ready", "port": port}
    startup = gateway["startupProbe"]
    # model loading: minutes before liveness may restart the pod
    assert startup["periodSeconds"] * startup["failureThreshold"] >= 300


@pytest.mark.parametrize("deployment", _deployments(), ids=_ids(_deployments()))
def test_grace_period_covers_the_drain(deployment: Doc) -> None:
    drain = tomllib.loads(_config_text(deployment))["server"]["drain_timeout_s"]
    assert _pod(deployment)["terminationGracePeriodSeconds"] > drain
    assert "lifecycle" not in _gateway(deployment)  # airgate drains on SIGTERM by itself


@pytest.mark.parametrize("deployment", _deployments(), ids=_ids(_deployments()))
def test_writable_places_are_volumes(deployment: Doc) -> None:
    env = _env(_gateway(deployment))
    for path in (env["AIRGATE_DATA_DIR"]["value"], env["HOME"]["value"], "/tmp"):
        volume, inner = _mounted(deployment, path)
        assert "emptyDir" in volume and inner == "", path


@pytest.mark.parametrize("deployment", _deployments(), ids=_ids(_deployments()))
def test_each_pod_writes_its_own_audit_chain(deployment: Doc) -> None:
    chain = _env(_gateway(deployment))["AIRGATE_AUDIT__CHAIN"]
    assert chain["valueFrom"] == {"fieldRef": {"fieldPath": "metadata.name"}}


def test_gpu_pods_get_a_gpu_and_memory_for_the_weights() -> None:
    deployment = _named("Deployment", "airgate-gpu")
    gateway = _gateway(deployment)
    gpus = int(gateway["resources"]["limits"]["nvidia.com/gpu"])
    for model in tomllib.loads(_config_text(deployment))["models"]:
        vllm = model.get("vllm", {})
        assert vllm.get("tensor_parallel_size", 1) * vllm.get("pipeline_parallel_size", 1) == gpus
    # decrypted safetensors go to $XDG_RUNTIME_DIR (a tmpfs mount point), vLLM's workers
    # exchange data through /dev/shm: both memory, never the node's disk
    weights = _env(gateway)["XDG_RUNTIME_DIR"]["value"]
    for path in (weights, "/dev/shm"):
        volume, inner = _mounted(deployment, path)
        assert inner == ""
        assert volume["emptyDir"]["medium"] == "Memory"
        assert volume["emptyDir"]["sizeLimit"]


def test_edge_pods_need_no_gpu_and_use_the_cores_they_get() -> None:
    deployment = _named("Deployment", "airgate-edge")
    limits = _gateway(deployment)["resources"]["limits"]
    assert "nvidia.com/gpu" not in limits
    for model in tomllib.loads(_config_text(deployment))["models"]:
        assert model["n_threads"] == int(limits["cpu"])


@pytest.mark.parametrize("deployment", _deployments(), ids=_ids(_deployments()))
def test_a_disruption_budget_covers_the_deployment(deployment: Doc) -> None:
    labels = deployment["spec"]["template"]["metadata"]["labels"]
    budgets = [
        p
        for p in _kind("PodDisruptionBudget")
        if p["spec"]["selector"]["matchLabels"].items() <= labels.items()
    ]
    assert len(budgets) == 1
    spec = budgets[0]["spec"]
    assert spec.get("maxUnavailable") == 1 or spec.get("minAvailable") == 1


def test_the_service_reaches_every_pod_on_the_gateway_port() -> None:
    (service,) = _kind("Service")
    for deployment in _deployments():
        labels = deployment["spec"]["template"]["metadata"]["labels"]
        assert service["spec"]["selector"].items() <= labels.items()
        names = {p["name"] for p in _gateway(deployment)["ports"]}
        assert {p["targetPort"] for p in service["spec"]["ports"]} <= names


# -- Kubernetes: the network -------------------------------------------------------------------


def test_network_policy_admits_the_gateway_port_and_egress_only_to_named_services() -> None:
    (policy,) = _kind("NetworkPolicy")
    spec = policy["spec"]
    assert sorted(spec["policyTypes"]) == ["Egress", "Ingress"]
    for deployment in _deployments():
        labels = deployment["spec"]["template"]["metadata"]["labels"]
        assert spec["podSelector"]["matchLabels"].items() <= labels.items()
    gateway_ports = {p["containerPort"] for d in _deployments() for p in _gateway(d)["ports"]}
    ingress = {p["port"] for rule in spec["ingress"] for p in rule["ports"]}
    assert ingress == gateway_ports
    for rule in [*spec["ingress"], *spec["egress"]]:
        peers = rule.get("from") or rule.get("to")
        assert peers, "a rule without peers admits everyone"
        assert all("ipBlock" not in peer for peer in peers)
    egress = {p["port"] for rule in spec["egress"] for p in rule["ports"]}
    assert egress == EGRESS_PORTS
    dns = {(p["protocol"], p["port"]) for rule in spec["egress"] for p in rule["ports"]}
    assert {("UDP", 53), ("TCP", 53)} <= dns


# -- Kubernetes: configuration and secrets -----------------------------------------------------


@pytest.mark.parametrize("deployment", _deployments(), ids=_ids(_deployments()))
def test_the_mounted_configuration_loads_as_the_pod_loads_it(
    deployment: Doc, tmp_path: Path
) -> None:
    pod_name = f"{deployment['metadata']['name']}-5d8f7c9b6-x2k4q"
    config = tmp_path / "airgate.toml"
    config.write_text(_config_text(deployment))
    environ = _pod_environment(deployment, pod_name)
    environ["AIRGATE_CONFIG"] = str(config)
    settings = load_settings(environ=environ)
    assert settings.server.host == "0.0.0.0"
    assert settings.audit.chain == pod_name
    assert settings.audit.database_url.startswith("postgresql://")
    assert settings.limits.redis_url.startswith("redis://")
    assert settings.audit.signer.provider == "vault-transit"
    assert settings.data_dir == environ["AIRGATE_DATA_DIR"]
    vault = settings.kms.vault_transit
    assert vault is not None and vault.token_env in environ
    engine = "vllm" if deployment["metadata"]["name"] == "airgate-gpu" else "llama.cpp"
    assert {m.engine for m in settings.models} == {engine}
    # every file the configuration names is on a volume, and its key exists
    files = [
        settings.auth.pepper_file,
        *settings.audit.trusted_keys,
        *settings.bundles.trusted_keys,
        *(m.bundle for m in settings.models if m.bundle),
    ]
    if vault.ca_cert:
        files.append(vault.ca_cert)
    for path in files:
        volume, inner = _mounted(deployment, path)
        if "persistentVolumeClaim" not in volume:
            _, data = _source(volume)
            assert _key(volume, inner) in data, path
    policies, inner = _mounted(deployment, settings.policy.path)
    assert inner == "" and "configMap" in policies


def test_engine_classes_share_every_setting_but_their_models() -> None:
    shared = []
    for deployment in _deployments():
        raw = tomllib.loads(_config_text(deployment))
        raw.pop("models")
        shared.append(raw)
    assert all(s == shared[0] for s in shared)


def test_shipped_policies_parse() -> None:
    policies = _named("ConfigMap", "airgate-policies")["data"]
    assert policies
    for name, text in policies.items():
        assert name.endswith(".toml")
        parse_document(text, name)


def test_secret_placeholders_are_strings_to_replace() -> None:
    for secret in _kind("Secret"):
        assert "data" not in secret  # stringData only: readable placeholders
        for key, value in secret["stringData"].items():
            assert "REPLACE-ME" in value, f"{secret['metadata']['name']}/{key}"


# -- systemd -----------------------------------------------------------------------------------


def _unit() -> configparser.SectionProxy:
    parser = configparser.ConfigParser(strict=False, interpolation=None)
    parser.optionxform = str  # type: ignore[assignment, method-assign]  # keys are case-sensitive
    parser.read_string(UNIT.read_text())
    return parser["Service"]


def test_unit_runs_airgate_as_its_own_user() -> None:
    service = _unit()
    assert service["Type"] == "exec"  # airgate does not speak sd_notify
    assert (service["User"], service["Group"], service["DynamicUser"]) == (
        "airgate",
        "airgate",
        "no",
    )
    assert service["ExecStart"] == (
        "/opt/airgate/bin/airgate serve --config /etc/airgate/airgate.toml"
    )
    assert "AIRGATE_DATA_DIR=/var/lib/airgate" in service["Environment"].split()
    assert (service["StateDirectory"], service["StateDirectoryMode"]) == ("airgate", "0700")
    assert service["ConfigurationDirectory"] == "airgate"
    assert service["Restart"] == "on-failure"


def test_unit_stops_by_draining() -> None:
    service = _unit()
    drains = {tomllib.loads(_config_text(d))["server"]["drain_timeout_s"] for d in _deployments()}
    assert service["KillSignal"] == "SIGTERM"
    assert service["KillMode"] == "mixed"  # SIGTERM to airgate, not to vLLM's processes
    assert int(service["TimeoutStopSec"]) > max(drains)


@pytest.mark.parametrize(
    ("key", "value"),
    [
        ("NoNewPrivileges", "yes"),
        ("ProtectSystem", "strict"),
        ("ProtectHome", "yes"),
        ("PrivateTmp", "yes"),
        ("PrivateDevices", "yes"),
        ("ProtectKernelTunables", "yes"),
        ("ProtectKernelModules", "yes"),
        ("ProtectKernelLogs", "yes"),
        ("ProtectControlGroups", "yes"),
        ("RestrictNamespaces", "yes"),
        ("LockPersonality", "yes"),
        ("MemoryDenyWriteExecute", "no"),  # JIT-compiled kernels (see the unit's comment)
        ("SystemCallArchitectures", "native"),
        ("CapabilityBoundingSet", ""),
        ("LimitCORE", "0"),
        ("UMask", "0077"),
    ],
)
def test_unit_hardening(key: str, value: str) -> None:
    assert _unit()[key] == value


def test_unit_address_families() -> None:
    families = _unit()["RestrictAddressFamilies"].split()
    assert sorted(families) == ["AF_INET", "AF_INET6", "AF_UNIX"]


@pytest.mark.skipif(shutil.which("systemd-analyze") is None, reason="systemd is not installed")
def test_systemd_accepts_the_unit() -> None:
    result = subprocess.run(
        ["systemd-analyze", "verify", str(UNIT)], capture_output=True, text=True, check=False
    )
    complaints = [
        line
        for line in (result.stdout + result.stderr).splitlines()
        # the installation it names is not on a test machine
        if line.strip() and "/opt/airgate/bin/airgate is not executable" not in line
    ]
    assert complaints == []
