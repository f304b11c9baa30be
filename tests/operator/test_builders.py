"""The pure builders: what an InferaFleet renders to, and that every rendered manifest is valid."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import pytest

from infera.config import load
from infera.config.base import ConfigError, env_names
from infera.config.engine import MockEngineSettings
from infera.config.operator import render_env
from infera.config.picker import PickerSettings
from infera.config.server import ServerSettings
from infera.config.worker import WorkerSettings
from infera.operator.builders import Owner, worker_selector
from infera.operator.render import build_children
from infera.operator.spec import FleetSpec
from tests.operator.manifests import REPO, load_all, validate

OWNER = Owner("demo", "infer", "11111111-2222-3333-4444-555555555555")
SAMPLES = sorted((REPO / "deploy" / "samples").glob("*.yaml"))

SPECS: dict[str, dict[str, Any]] = {
    "minimal": {"model": "m"},
    "mock-auto": {"model": "m", "engine": "mock", "modelPath": "/tok", "pools": {"mixed": {"replicas": 3}}},
    "gaie-gateway": {"model": "m", "engine": "vllm", "modelPath": "/models/m", "gaie": {
        "enabled": True, "gatewayName": "gw", "picker": "stock",
        "endpointPicker": {"replicas": 2, "args": ["--v", "4"]}}},
    "gaie-infera": {"model": "m", "engine": "sglang", "modelPath": "/models/m", "gaie": {"enabled": True}},
    "pd": {"model": "m", "engine": "sglang", "modelPath": "/models/m", "pools": {
        "prefill": {"replicas": 1, "resources": {"limits": {"nvidia.com/gpu": "1"}}},
        "decode": {"replicas": 2, "env": [{"name": "X", "value": "1"}], "engineArgs": ["--tp", "2"]}},
        "router": {"policy": "round-robin", "frontendReplicas": 2}},
    "gaie-pd-nats": {"model": "m", "engine": "atom", "modelPath": "/models/m",
                     "pools": {"prefill": {}, "decode": {}}, "gaie": {"enabled": True},
                     "transport": {"request": "http", "kvEvents": "none"}},
}


def by_kind(objs: list[dict[str, Any]]) -> dict[tuple[str, str], dict[str, Any]]:
    return {(o["kind"], o["metadata"]["name"]): o for o in objs}


def env_of(container: dict[str, Any]) -> dict[str, str]:
    return {e["name"]: e.get("value", "<ref>") for e in container["env"]}


@pytest.mark.parametrize("name", sorted(SPECS))
def test_every_rendered_manifest_validates(name: str) -> None:
    spec = {"model": "m", "modelPath": "/tok", **SPECS[name]}
    children = build_children(OWNER, FleetSpec.parse(spec))
    assert children
    for obj in children:
        validate(obj)
        assert obj["metadata"]["namespace"] == "infer"
        ref = obj["metadata"]["ownerReferences"][0]
        assert ref == {"apiVersion": "infera.ai/v1alpha1", "kind": "InferaFleet", "name": "demo",
                       "uid": OWNER.uid, "controller": True, "blockOwnerDeletion": True}
        assert obj["metadata"]["labels"]["infera.ai/fleet"] == "demo"
        assert "status" not in obj, "a child's status is its controller's to write"


@pytest.mark.parametrize("path", SAMPLES, ids=lambda p: p.name)
def test_samples_validate_against_the_crd_and_render_valid_children(path: Path) -> None:
    for doc in load_all(path):
        validate(doc)
        if doc["kind"] != "InferaFleet":  # a sample may bring what the fleet needs (the GAIE mock: a Gateway)
            continue
        for obj in build_children(OWNER, FleetSpec.parse(doc["spec"])):
            validate(obj)


def test_auto_mode_renders_a_standalone_frontend_and_no_gaie() -> None:
    objs = by_kind(build_children(OWNER, FleetSpec.parse(SPECS["mock-auto"])))
    assert set(objs) == {("ServiceAccount", "demo-infera"), ("Role", "demo-infera"), ("RoleBinding", "demo-infera"),
                         ("Deployment", "demo-mixed"), ("Deployment", "demo-frontend"), ("Service", "demo-frontend")}
    worker = objs[("Deployment", "demo-mixed")]
    assert worker["spec"]["replicas"] == 3
    pod = worker["spec"]["template"]
    assert [c["name"] for c in pod["spec"]["containers"]] == ["worker"], "no sidecar without GAIE"
    assert pod["metadata"]["labels"]["app.kubernetes.io/component"] == "infera-worker"
    c = pod["spec"]["containers"][0]
    assert c["command"] == ["python", "-m", "infera.engine.mock"]
    env = env_of(c)
    assert env["INFERA_INSTANCE_ID"] == "$(POD_NAME)"
    assert env["INFERA_KV_EVENTS_HOST"] == "$(POD_IP)"
    assert env.get("INFERA_DISCOVERY_BACKEND", "kubernetes") == "kubernetes"  # rendered only off the default
    front = objs[("Deployment", "demo-frontend")]["spec"]["template"]["spec"]["containers"][0]
    assert front["readinessProbe"]["httpGet"]["path"] == "/health"
    assert front["livenessProbe"]["httpGet"]["path"] == "/livez"  # an empty fleet must not restart it
    fenv = env_of(front)
    assert fenv["INFERA_K8S_LABEL_SELECTOR"] == worker_selector(OWNER)
    assert fenv.get("INFERA_ROUTER_MODE", "auto") == "auto"
    rules = objs[("Role", "demo-infera")]["rules"]
    assert rules == [{"apiGroups": [""], "resources": ["pods"], "verbs": ["get", "list", "watch", "patch"]}]


def test_gaie_renders_sidecars_pool_picker_and_route() -> None:
    objs = by_kind(build_children(OWNER, FleetSpec.parse(SPECS["gaie-gateway"])))
    assert ("Deployment", "demo-frontend") not in objs
    pod = objs[("Deployment", "demo-mixed")]["spec"]["template"]
    assert [c["name"] for c in pod["spec"]["containers"]] == ["worker", "frontend"]
    assert pod["metadata"]["labels"]["infera.ai/gateway-target"] == "true"
    assert pod["spec"]["containers"][1]["livenessProbe"]["httpGet"]["path"] == "/livez"
    side = env_of(pod["spec"]["containers"][1])
    assert side["INFERA_ROUTER_MODE"] == "direct"
    assert side["INFERA_DIRECT_DEFAULT_WORKER"] == "$(POD_NAME)"
    pool = objs[("InferencePool", "demo")]["spec"]
    assert pool["targetPorts"] == [{"number": 8000}]
    assert pool["endpointPickerRef"]["name"] == "demo-epp"
    assert pool["selector"]["matchLabels"] == {"infera.ai/fleet": "demo", "infera.ai/gateway-target": "true"}
    epp = objs[("Deployment", "demo-epp")]["spec"]
    args = epp["template"]["spec"]["containers"][0]["args"]
    assert args[:4] == ["--pool-name", "demo", "--pool-namespace", "infer"]
    assert "--ha-enable-leader-election" in args and args[-3:-1] == ["--v", "4"]
    # The stock EPP, rendered so that it starts and sees the engines: a scheduler profile, the engine's
    # metrics port and names (not the sidecar's), its health service names, and a lease for HA.
    flags = dict(zip(args[::2], args[1::2], strict=False))
    assert flags["--config-file"] == "/config/default-plugins.yaml"
    assert flags["--model-server-metrics-port"] == "30000"
    assert flags["--kv-cache-usage-percentage-metric"] == "vllm:kv_cache_usage_perc"
    config = objs[("ConfigMap", "demo-epp-config")]["data"]["default-plugins.yaml"]
    assert "schedulingProfiles" in config and "prefix-cache-scorer" in config
    container = epp["template"]["spec"]["containers"][0]
    assert container["livenessProbe"]["grpc"] == {"port": 9003, "service": "liveness"}
    assert container["readinessProbe"]["grpc"] == {"port": 9003, "service": "readiness"}
    assert epp["template"]["spec"]["volumes"][0]["configMap"]["name"] == "demo-epp-config"
    rules = objs[("Role", "demo-epp")]["rules"]
    assert {"apiGroups": ["coordination.k8s.io"], "resources": ["leases"],
            "verbs": ["get", "list", "watch", "create", "update", "patch", "delete"]} in rules
    route = objs[("HTTPRoute", "demo")]["spec"]
    assert route["parentRefs"][0]["name"] == "gw"
    assert route["rules"][0]["backendRefs"][0] == {"group": "inference.networking.k8s.io", "kind": "InferencePool",
                                                   "name": "demo"}


def test_gaie_deploys_inferas_own_picker_by_default() -> None:
    objs = by_kind(build_children(OWNER, FleetSpec.parse(SPECS["gaie-infera"])))
    assert ("ConfigMap", "demo-epp-config") not in objs and ("Role", "demo-epp") not in objs
    pool = objs[("InferencePool", "demo")]["spec"]
    assert pool["endpointPickerRef"] == {"kind": "Service", "name": "demo-epp", "port": {"number": 9002},
                                         "failureMode": "FailClose"}
    pod = objs[("Deployment", "demo-epp")]["spec"]["template"]["spec"]
    container = pod["containers"][0]
    assert container["command"] == ["python", "-m", "infera.picker"]
    assert pod["serviceAccountName"] == "demo-infera"  # the fleet's: it watches the worker pods
    assert container["readinessProbe"]["grpc"] == {"port": 9002, "service": "readiness"}
    # it serves gRPC only after loading its tokenizer and fleet view: liveness waits for the startup probe
    assert container["startupProbe"]["grpc"] == {"port": 9002, "service": "liveness"}
    assert container["startupProbe"]["periodSeconds"] * container["startupProbe"]["failureThreshold"] >= 300
    env = env_of(container)
    assert env["INFERA_TARGET_PORT"] == "8000" and "INFERA_PORT" not in env  # 9002 is the default
    assert env["INFERA_K8S_LABEL_SELECTOR"] == worker_selector(OWNER)
    assert env["INFERA_ROUTER_TOKENIZER_PATH"] == "/models/m"
    assert "INFERA_ROUTER_MODE" not in env
    settings = load(PickerSettings, [], {k: v for k, v in env.items() if "$(" not in v})
    assert settings.port == 9002 and settings.router_mode == "auto" and settings.discovery_backend == "kubernetes"
    service = objs[("Service", "demo-epp")]["spec"]
    assert service["ports"][0]["port"] == 9002


def test_prefill_pods_are_never_gateway_targets() -> None:
    objs = by_kind(build_children(OWNER, FleetSpec.parse(SPECS["gaie-pd-nats"])))
    pre = objs[("Deployment", "demo-prefill")]["spec"]["template"]["metadata"]["labels"]
    dec = objs[("Deployment", "demo-decode")]["spec"]["template"]["metadata"]["labels"]
    assert "infera.ai/gateway-target" not in pre
    assert dec["infera.ai/gateway-target"] == "true"


def test_rendered_env_is_read_back_by_the_processes_own_loader() -> None:
    """One conversion path: the env the operator writes is what ``load()`` of each process reads."""
    objs = by_kind(build_children(OWNER, FleetSpec.parse(SPECS["gaie-gateway"])))
    pod = objs[("Deployment", "demo-mixed")]["spec"]["template"]["spec"]
    kubelet = {"$(POD_NAME)": "demo-mixed-abc", "$(POD_NAMESPACE)": "infer", "$(POD_IP)": "10.1.2.3"}
    worker_env = {k: kubelet.get(v, v) for k, v in env_of(pod["containers"][0]).items()}
    side_env = {k: kubelet.get(v, v) for k, v in env_of(pod["containers"][1]).items()}
    worker = load(WorkerSettings, [], environ=worker_env)
    assert (worker.instance_id, worker.advertise_host, worker.model_path, worker.port) == \
        ("demo-mixed-abc", "10.1.2.3", "/models/m", 30000)
    server = load(ServerSettings, [], environ=side_env)
    assert (server.router_mode, server.direct_default_worker, server.k8s_namespace, server.discovery_backend) == \
        ("direct", "demo-mixed-abc", "infer", "kubernetes")
    mock = load(MockEngineSettings, [], environ={k: kubelet.get(v, v) for k, v in env_of(
        by_kind(build_children(OWNER, FleetSpec.parse(SPECS["mock-auto"])))[("Deployment", "demo-mixed")]
        ["spec"]["template"]["spec"]["containers"][0]).items()})
    assert (mock.instance_id, mock.kv_events_host, mock.served_model_name) == ("demo-mixed-abc", "10.1.2.3", "m")


def test_a_model_id_tokenizer_and_its_revision_reach_the_frontend_as_given() -> None:
    spec = FleetSpec.parse({**SPECS["mock-auto"], "tokenizerPath": "Qwen/Qwen3-0.6B", "tokenizerRevision": "v2"})
    front = by_kind(build_children(OWNER, spec))[("Deployment", "demo-frontend")]["spec"]["template"]["spec"]
    server = load(ServerSettings, [], environ=env_of(front["containers"][0]))
    assert (server.router_tokenizer_path, server.router_tokenizer_revision) == ("Qwen/Qwen3-0.6B", "v2")


def test_every_rendered_env_name_comes_from_a_schema() -> None:
    names = {n for cls in (ServerSettings, PickerSettings, WorkerSettings, MockEngineSettings)
             for f in dataclasses.fields(cls) for n in env_names(f)}
    names |= {"POD_NAME", "POD_NAMESPACE", "POD_IP", "NAMESPACE", "X"}
    for spec in SPECS.values():
        for obj in build_children(OWNER, FleetSpec.parse({"modelPath": "/tok", **spec})):
            if obj["kind"] != "Deployment":
                continue
            for c in obj["spec"]["template"]["spec"]["containers"]:
                assert {e["name"] for e in c.get("env", [])} <= names


def test_a_spec_the_process_would_refuse_is_refused_here() -> None:
    with pytest.raises(ConfigError, match="router-tokenizer-path"):
        build_children(OWNER, FleetSpec.parse({"model": "m", "engine": "mock"}))  # kv-aware needs a tokenizer
    with pytest.raises(ConfigError, match="no setting"):
        render_env(ServerSettings, {"not_a_field": 1})


def test_pool_pod_settings_reach_the_worker_pods() -> None:
    spec = FleetSpec.parse({"model": "m", "modelPath": "/models/m", "pools": {"mixed": {
        "nodeSelector": {"gpu": "yes"}, "tolerations": [{"key": "nvidia.com/gpu", "operator": "Exists"}],
        "env": [{"name": "HF_TOKEN", "valueFrom": {"secretKeyRef": {"name": "hf", "key": "token"}}}],
        "podTemplate": {"metadata": {"labels": {"team": "a"}}, "spec": {
            "volumes": [{"name": "models", "hostPath": {"path": "/data"}}],
            "containers": [{"name": "worker", "volumeMounts": [{"name": "models", "mountPath": "/models"}]}]}}}}})
    dep = next(o for o in build_children(OWNER, spec) if o["kind"] == "Deployment" and "mixed" in o["metadata"]["name"])
    validate(dep)
    pod = dep["spec"]["template"]
    assert pod["metadata"]["labels"]["team"] == "a" and pod["metadata"]["labels"]["infera.ai/fleet"] == "demo"
    assert pod["spec"]["nodeSelector"] == {"gpu": "yes"} and pod["spec"]["tolerations"][0]["key"] == "nvidia.com/gpu"
    assert pod["spec"]["volumes"] == [{"name": "models", "hostPath": {"path": "/data"}}]
    worker = pod["spec"]["containers"][0]
    assert worker["name"] == "worker" and worker["command"], "the override merged into the container, kept it whole"
    assert worker["volumeMounts"] == [{"name": "models", "mountPath": "/models"}]
    assert {"name": "HF_TOKEN", "valueFrom": {"secretKeyRef": {"name": "hf", "key": "token"}}} in worker["env"]
