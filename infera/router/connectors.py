"""Connectors by name (a worker record's ``connector``): adding one is one module and one line here."""

from __future__ import annotations

from infera.router.connector import Connector
from infera.router.pull import PullConnector
from infera.router.push import PushConnector

CONNECTORS: dict[str, Connector] = {
    "push": PushConnector(),
    "pull": PullConnector(),
}
