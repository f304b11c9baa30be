"""POST /v1/cache/prewarm end to end: a frontend, a mock engine serving a kvd socket, the admin token."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from harness import get_json, wait_until
from tests.server.conftest import MOCK_ARGS, MODEL, Fleet, make_fleet
from tests.server.test_routing import ask, system_prompt

pytestmark = pytest.mark.slow  # spawns a fleet of real processes

TOKEN = "s3cret-admin-token"
AUTH = {"authorization": f"Bearer {TOKEN}"}


@pytest.fixture(scope="module")
def kvd_fleet(tmp_path_factory: pytest.TempPathFactory, qwen_tokenizer_dir: Path) -> Iterator[Fleet]:
    tmp = tmp_path_factory.mktemp("prewarm")
    sock = str(tmp / "kvd.sock")
    f = make_fleet(tmp, qwen_tokenizer_dir, n=1, mock_args=(*MOCK_ARGS, "--kvd-socket-path", sock),
                   frontend_args=("--kvd-socket-path", sock, "--admin-token", TOKEN))
    yield f
    f.stop()


def wait_promoted(worker_url: str, blocks: int, timeout: float = 10.0) -> dict[str, int]:
    def view() -> dict[str, int]:
        return dict(get_json(worker_url + "/infera/host_tier"))

    wait_until(lambda: view()["blocks_promoted"] + view()["blocks_already_warm"] >= blocks, timeout,
               f"{blocks} blocks promoted or already warm")
    return view()


def test_a_prewarm_turns_the_first_request_into_a_cache_hit(kvd_fleet: Fleet) -> None:
    url = kvd_fleet.frontend.url
    warmed = [{"role": "system", "content": system_prompt(500)}, {"role": "user", "content": "hello"}]
    cold = [{"role": "system", "content": system_prompt(501)}, {"role": "user", "content": "hello"}]
    resp = httpx.post(url + "/v1/cache/prewarm", json={"model": MODEL, "messages": warmed, "priority": 1},
                      headers=AUTH)
    assert resp.status_code == 202, resp.text
    body = resp.json()
    worker = kvd_fleet.workers[0]
    assert body["worker"] == resp.headers["x-infera-worker"] == get_json(worker.url + "/infera/worker")["instance_id"]
    assert body["blocks"] == body["prompt_tokens"] // 16 > 10
    view = wait_promoted(worker.url, body["blocks"])
    assert view["blocks_promoted"] == body["blocks"] and view["hints_applied"] == 1

    _, hit = ask(kvd_fleet.base_url, warmed)
    assert hit >= (body["blocks"] - 1) * 16  # the engine recomputes the prompt's last token's block at most
    _, miss = ask(kvd_fleet.base_url, cold)
    assert miss == 0  # the same request without a prewarm

    # the router saw the promotion's events: host-memory and device copies of every block
    view_by_medium = httpx.get(url + f"/v1/admin/cache-view/{body['worker']}", headers=AUTH).json()
    assert view_by_medium["blocks_by_medium"]["CPU"] == body["blocks"]


def test_prewarm_validates_its_body(kvd_fleet: Fleet) -> None:
    url = kvd_fleet.frontend.url + "/v1/cache/prewarm"
    assert httpx.post(url, content=b"{not json", headers=AUTH).status_code == 400
    neither = httpx.post(url, json={"model": MODEL}, headers=AUTH)
    assert neither.status_code == 400 and neither.json()["error"]["param"] == "messages"
    both = httpx.post(url, json={"model": MODEL, "prompt": "x", "messages": [{"role": "user", "content": "x"}]},
                      headers=AUTH)
    assert both.status_code == 400
    assert httpx.post(url, json={"model": "nope", "prompt": "x"}, headers=AUTH).status_code == 404
    unknown_worker = httpx.post(url, json={"model": MODEL, "prompt": "x", "worker": "nope"}, headers=AUTH)
    assert unknown_worker.status_code == 404 and unknown_worker.json()["error"]["param"] == "worker"
    short = httpx.post(url, json={"model": MODEL, "prompt": "hi"}, headers=AUTH)  # less than one block
    assert short.status_code == 202 and short.json()["blocks"] == 0


def test_admin_paths_need_the_token_when_one_is_set(kvd_fleet: Fleet) -> None:
    url = kvd_fleet.frontend.url
    wid = kvd_fleet.workers[0].url
    worker_id = get_json(wid + "/infera/worker")["instance_id"]
    body = {"model": MODEL, "prompt": "x " * 40}
    for path, method, payload in (("/v1/cache/prewarm", "POST", body),
                                  (f"/v1/admin/cache-view/{worker_id}", "GET", None),
                                  ("/v1/admin/profile/start", "POST", {})):
        bare = httpx.request(method, url + path, json=payload)
        assert bare.status_code == 401, path
        assert bare.json()["error"]["type"] == "authentication_error"
        assert bare.headers["www-authenticate"] == "Bearer"
        wrong = httpx.request(method, url + path, json=payload, headers={"authorization": "Bearer nope"})
        assert wrong.status_code == 401, path
        assert httpx.request(method, url + path, json=payload, headers=AUTH).status_code != 401, path
    # everything else stays open
    assert httpx.get(url + "/health").status_code == 200
    assert httpx.get(url + "/v1/models").status_code == 200
