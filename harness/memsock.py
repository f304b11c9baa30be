"""A client connection in memory, for driving a server protocol (uvicorn's, the lean path's) in process."""

from __future__ import annotations

import asyncio
from typing import Any


class MemTransport(asyncio.Transport):
    """The transport a protocol writes its answers to: each write is handed to :meth:`sent` (a subclass says
    what to do with it); reading is never paused and nothing is buffered."""

    def __init__(self) -> None:
        super().__init__()
        self.closing = False

    def sent(self, data: bytes) -> None:
        """One write's bytes."""

    def get_extra_info(self, name: str, default: Any = None) -> Any:
        return {"sockname": ("127.0.0.1", 8000), "peername": ("127.0.0.1", 40000)}.get(name, default)

    def write(self, data: bytes | bytearray | memoryview) -> None:
        self.sent(bytes(data))

    def writelines(self, lines: Any) -> None:
        self.write(b"".join(lines))

    def is_closing(self) -> bool:
        return self.closing

    def close(self) -> None:
        self.closing = True

    def pause_reading(self) -> None:
        pass

    def resume_reading(self) -> None:
        pass

    def set_write_buffer_limits(self, high: int | None = None, low: int | None = None) -> None:
        pass

    def get_write_buffer_size(self) -> int:
        return 0
