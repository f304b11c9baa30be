"""Telemetry: one record per request (ids, the routing decision, timings), OpenTelemetry spans and the
structured request log line.

Below every layer that reports into it (server, router, picker, engine wrappers, transports): it imports
no other infera package. A request's :class:`~infera.telemetry.record.RequestRecord` travels in a context
variable set by whoever begins the request (the server's middleware, the picker's service); code deeper
down reads it with :func:`~infera.telemetry.record.current` and does nothing when there is none, so a
process with tracing and request logs off pays one context-variable read per hook.
"""
