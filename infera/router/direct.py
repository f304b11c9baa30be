"""Direct mode: the workers a request's headers name, checked before anything is sent.

``x-worker-instance-id`` names a mixed worker, or the decode worker of a pair;
``x-prefill-instance-id`` names the prefill worker of a pair. Either may be given alone:
the router picks the other worker of the pair, with the same connector. A name that is not
in the fleet is :class:`UnknownWorker`; a worker of another model, a role in the wrong
header or two connectors that cannot pair are :class:`BadDirectHeaders`.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping

from infera.protocols.worker import WorkerRecord
from infera.router.errors import BadDirectHeaders, UnknownWorker
from infera.router.topology import connector_of

WORKER_HEADER = "x-worker-instance-id"
PREFILL_HEADER = "x-prefill-instance-id"


@dataclasses.dataclass(frozen=True, slots=True)
class Named:
    worker: WorkerRecord | None = None  # mixed, or the decode worker of a pair
    prefill: WorkerRecord | None = None

    @property
    def mixed(self) -> bool:
        return self.worker is not None and self.worker.role == "mixed"

    @property
    def any(self) -> bool:
        return self.worker is not None or self.prefill is not None

    @property
    def connector(self) -> str | None:
        named = self.worker or self.prefill
        return connector_of(named) if named is not None else None

    def roles(self) -> frozenset[str]:
        if self.mixed:
            return frozenset({"mixed"})
        return frozenset(r for r, w in (("decode", self.worker), ("prefill", self.prefill)) if w is not None)


def named(workers: Mapping[str, WorkerRecord], model: str, worker_hint: str | None,
          prefill_hint: str | None) -> Named:
    """The workers the headers name, checked against each other and the request's model."""
    fixed = _lookup(workers, worker_hint, WORKER_HEADER, model)
    prefill = _lookup(workers, prefill_hint, PREFILL_HEADER, model)
    if prefill is not None and prefill.role != "prefill":
        raise BadDirectHeaders(f"worker {prefill.instance_id!r} named by {PREFILL_HEADER} is a {prefill.role} "
                               "worker, not a prefill worker")
    if fixed is not None and fixed.role == "prefill":
        raise BadDirectHeaders(f"worker {fixed.instance_id!r} named by {WORKER_HEADER} is a prefill worker; name it "
                               f"in {PREFILL_HEADER} ({WORKER_HEADER} names the decode worker of a pair)")
    if fixed is not None and fixed.role == "mixed" and prefill is not None:
        raise BadDirectHeaders(f"worker {fixed.instance_id!r} is a mixed worker and cannot take a prefill worker "
                               f"({PREFILL_HEADER})")
    if fixed is not None and prefill is not None and connector_of(fixed) != connector_of(prefill):
        raise BadDirectHeaders(f"prefill worker {prefill.instance_id!r} ({connector_of(prefill)}) and decode worker "
                               f"{fixed.instance_id!r} ({connector_of(fixed)}) use different connectors")
    return Named(fixed, prefill)


def _lookup(workers: Mapping[str, WorkerRecord], worker_id: str | None, header: str,
            model: str) -> WorkerRecord | None:
    if not worker_id:
        return None
    worker = workers.get(worker_id)
    if worker is None:
        raise UnknownWorker(f"worker {worker_id!r} named by {header} is not in the fleet (not registered, not ready, "
                            "or gone)")
    if worker.model != model:
        raise BadDirectHeaders(f"worker {worker_id!r} serves model {worker.model!r}, not {model!r}")
    return worker
