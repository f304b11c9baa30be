"""A child process: argv, env, a log file, readiness with a bound, stop by PID (SIGTERM, then SIGKILL)."""

from __future__ import annotations

import contextlib
import os
import random
import signal
import socket
import subprocess
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Self

from harness.wait import Abort, wait_until

REPO = Path(__file__).resolve().parents[1]
CLK_TCK = os.sysconf("SC_CLK_TCK")

# One thread per tokenizer, no model hub, unbuffered logs; INFERA_* settings come from argv only.
QUIET = {"TOKENIZERS_PARALLELISM": "false", "RAYON_NUM_THREADS": "1", "OMP_NUM_THREADS": "1",
         "HF_HUB_OFFLINE": "1", "PYTHONUNBUFFERED": "1"}


def ephemeral_range() -> tuple[int, int]:
    """The kernel's range for the local ports of outgoing connections (``ip_local_port_range``)."""
    with contextlib.suppress(OSError, ValueError):
        low, high = Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()
        return int(low), int(high)
    return 32768, 60999


_PICK = random.SystemRandom()


def free_port() -> int:
    """A loopback port free right now, outside the kernel's ephemeral range. A port the OS picks for a bind to port
    0 comes from that range, from which every outgoing connection's local port comes too: between this call and
    the child's bind, a client's connect (to NATS, etcd, an engine) could take it, and the child fails to start with
    "address already in use" (seen in the e2e tier's NATS tests)."""
    low, high = ephemeral_range()
    # below the range where it leaves room, else above it
    spans = [span for span in ((max(1024, low - 22000), low - 1), (high + 1, 65535)) if span[0] < span[1]]
    for _ in range(200 if spans else 0):
        start, end = _PICK.choice(spans)
        port = _PICK.randint(start, end)
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
            return port
    raise RuntimeError(f"no free loopback port outside the ephemeral range {low}-{high}")


def child_env(extra: Mapping[str, str] | None = None) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("INFERA_")}
    return {**env, **QUIET, **(extra or {})}


class Process:
    """One child process; :meth:`start` (again after it exits, e.g. a restart) appends to its log."""

    def __init__(self, argv: Sequence[str], log_path: Path, *, url: str = "", name: str = "",
                 env: Mapping[str, str] | None = None) -> None:
        self.argv = list(argv)
        self.log_path = log_path
        self.url = url
        self.name = name or Path(self.argv[0]).name
        self.env = child_env(env)
        self.popen: subprocess.Popen[bytes] | None = None

    def start(self) -> Self:
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        with self.log_path.open("ab") as log:
            self.popen = subprocess.Popen(self.argv, cwd=REPO, env=self.env, stdout=log, stderr=subprocess.STDOUT,
                                          stdin=subprocess.DEVNULL, start_new_session=True)
        return self

    @property
    def pid(self) -> int:
        assert self.popen is not None, f"{self.name} was never started"
        return self.popen.pid

    def alive(self) -> bool:
        return self.popen is not None and self.popen.poll() is None

    def output(self, chars: int = 4000) -> str:
        with contextlib.suppress(OSError):
            return self.log_path.read_text(errors="replace")[-chars:]
        return ""

    def tail(self, lines: int = 30) -> str:
        return "\n".join(self.output(1 << 20).splitlines()[-lines:])

    def wait_until(self, ready: Callable[[], object], timeout: float = 60.0, what: str = "ready") -> float:
        """Wait for ``ready()``; fail at once (with the log) if the process exits first."""

        def ready_or_exit() -> object:
            if not self.alive():
                code = self.popen.returncode if self.popen else None
                raise Abort(f"{self.name} {self.url} exited ({code}) before {what}:\n{self.output()}")
            return ready()

        return wait_until(ready_or_exit, timeout, f"{self.name} {self.url} {what}".strip(), detail=self.output)

    def ready_or_stopped(self, ready: Callable[[], object], timeout: float = 60.0, what: str = "ready") -> Self:
        """:meth:`wait_until` for a process just started: if the wait fails or is interrupted (a test's
        pytest-timeout, Ctrl-C), the process is stopped first, since its caller never got a handle to stop it."""
        try:
            self.wait_until(ready, timeout, what)
        except BaseException:
            self.stop(grace=5.0)
            raise
        return self

    def cpu(self) -> float:
        """utime + stime of the process (all its threads, live and exited), from /proc/<pid>/stat."""
        raw = Path(f"/proc/{self.pid}/stat").read_text()
        fields = raw[raw.rindex(")") + 2 :].split()  # after "pid (comm) "; fields[0] is the state
        return (int(fields[11]) + int(fields[12])) / CLK_TCK

    def kill(self) -> None:
        if self.popen is not None and self.popen.poll() is None:
            self.popen.send_signal(signal.SIGKILL)
            self.popen.wait(10)

    def stop(self, grace: float = 10.0) -> None:
        """SIGTERM this PID; SIGKILL it if it is still running after ``grace`` seconds."""
        if self.popen is None or self.popen.poll() is not None:
            return
        self.popen.terminate()
        try:
            self.popen.wait(grace)
        except subprocess.TimeoutExpired:
            self.kill()


def spawn(argv: Sequence[str], url: str, log_path: Path, env: Mapping[str, str] | None = None) -> Process:
    """Start ``argv`` now, its output in ``log_path``."""
    return Process(argv, log_path, url=url, env=env).start()
