"""The registries are the source of truth for plugin names; the config's declared choices agree with them."""

from __future__ import annotations

from infera.config import engine as engine_config
from infera.config import server as server_config
from infera.router.connectors import CONNECTORS
from infera.router.policies import POLICIES, selectable
from infera.server.__main__ import FLEETS, KV_EVENT_SOURCES, REQUEST_TRANSPORTS, registry_choices


def test_the_config_lists_what_the_registries_hold() -> None:
    assert set(server_config.ROUTER_POLICIES) == set(selectable())
    assert set(server_config.DISCOVERY_BACKENDS) == set(FLEETS)
    assert set(server_config.REQUEST_TRANSPORTS) == set(REQUEST_TRANSPORTS)
    assert set(server_config.KV_EVENT_TRANSPORTS) == {*KV_EVENT_SOURCES, "none"}
    assert set(engine_config.CONNECTORS) == set(CONNECTORS)


def test_the_server_offers_the_registries_names() -> None:
    choices = registry_choices()
    assert set(choices["router_policy"]) <= set(POLICIES)
    assert "least-load" not in choices["router_policy"]  # the decode leg's, not a --router-policy
    assert set(choices["discovery_backend"]) == set(FLEETS)


def test_a_registered_policy_is_selectable_without_a_second_list() -> None:
    from infera.config import load
    from infera.config.server import ServerSettings

    choices = {**registry_choices(), "router_policy": (*selectable(), "new-policy")}
    settings = load(ServerSettings, ["--router-policy", "new-policy", "--router-tokenizer-path", "tok"], {},
                    choices=choices)
    assert settings.router_policy == "new-policy"
