# The C part of the prefix index (csrc/index.c); see infera/kv/native.py for when it runs.
from collections.abc import Sequence

from typing_extensions import Buffer

def chain_hashes(
    tokens: Sequence[int], first: int, n_blocks: int, block_size: int, parent: int,
) -> list[int] | None: ...
def chain_hashes_packed(packed: Buffer, n_blocks: int, block_size: int, parent: int) -> list[int] | None: ...
def store_blocks(
    blocks: dict[int, int], media: dict[int, list[str | None]], extra: dict[int, int], lower: dict[int, str],
    predicted: dict[int, float], holders: dict[int, int], shared: dict[int, int], watched: set[int],
    guess_masks: dict[int, int], bit: int, engine_hashes: Sequence[int], router_hashes: Sequence[int], start: int,
) -> tuple[int, bool]: ...
def remove_blocks(
    blocks: dict[int, int], media: dict[int, list[str | None]], extra: dict[int, int], lower: dict[int, str],
    predicted: dict[int, float], holders: dict[int, int], shared: dict[int, int], watched: set[int],
    guess_masks: dict[int, int], bit: int, engine_hashes: Sequence[int], start: int,
) -> tuple[int, int, bool]: ...
def walk(
    hashes: Sequence[int], shared: dict[int, int], holders: dict[int, int], names: list[str],
    resume: tuple[int, int, int, dict[str, int]] | None, capture: int, guessed: dict[int, int] | None, allowed: int,
) -> tuple[dict[str, int], tuple[int, int, int, dict[str, int]] | None]: ...
def walk_rows(
    rows: bytearray, n: int, width: int, names: list[str], finish: bool, hashes: Sequence[int] | None = None,
    guessed: dict[int, int] | None = None, allowed: int = 0,
) -> tuple[int, dict[str, int]] | None: ...
def fill_rows(
    hashes: Sequence[int], start: int, stop: int, shared: dict[int, int], holders: dict[int, int], width: int,
) -> bytearray | None: ...
def scan_column(rows: bytearray, width: int, slot: int, start: int, n: int) -> int: ...
def capture_rows(hashes: Sequence[int], shared: dict[int, int], width: int, min_rows: int) -> bytearray | None: ...
