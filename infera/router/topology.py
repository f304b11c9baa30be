"""The AutoRouter's topology choice: a prefill+decode pair when the fleet has one, else a mixed worker.

Nobody picks PD per request. For a model, the workers split into pools by role; prefill
and decode workers pair only within one connector (a push prefill worker cannot feed a
pull decode worker). With at least one healthy prefill and one healthy decode worker of a
connector the request is disaggregated; otherwise it goes to a mixed worker; with
neither, the router answers 503 with :meth:`Topology.explain`. Healthy means not cooling
down after a failure; when nothing is healthy, cooling workers count (trying one beats
refusing), as for mixed routing.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterable

from infera.protocols.worker import WorkerRecord

SGLANG_ENGINES = ("sglang",)


def connector_of(worker: WorkerRecord) -> str:
    """A PD worker's connector: its record's, else its engine's native one (SGLang push, others pull)."""
    if worker.connector:
        return worker.connector
    return "push" if worker.engine in SGLANG_ENGINES else "pull"


@dataclasses.dataclass(frozen=True, slots=True)
class Topology:
    kind: str  # "pd" | "mixed" | "none"
    connector: str | None = None  # for "pd"
    counts: tuple[int, int, int] = (0, 0, 0)  # mixed, prefill, decode workers of the model

    def explain(self, model: str) -> str:
        mixed, prefill, decode = self.counts
        return (f"no worker can serve model {model!r}: it needs a mixed worker or a prefill+decode pair with "
                f"the same connector, and the fleet has {mixed} mixed, {prefill} prefill and {decode} decode "
                "worker(s) for it")


def choose(workers: Iterable[WorkerRecord], model: str, healthy: Callable[[str], bool]) -> Topology:
    """The topology for one request of ``model`` over the fleet ``workers``."""
    mine = [w for w in workers if w.model == model]
    counts = (sum(w.role == "mixed" for w in mine), sum(w.role == "prefill" for w in mine),
              sum(w.role == "decode" for w in mine))
    for pool in ([w for w in mine if healthy(w.instance_id)], mine):
        prefill = {connector_of(w) for w in pool if w.role == "prefill"}
        decode = {connector_of(w) for w in pool if w.role == "decode"}
        paired = sorted(prefill & decode)
        if paired:
            return Topology("pd", paired[0], counts)
        if any(w.role == "mixed" for w in pool):
            return Topology("mixed", None, counts)
    return Topology("none", None, counts)
