# tiktoken's encode_ordinary in C for the ASCII stretches of text (csrc/bpe.c); see infera/kv/bpe.py for when.
from collections.abc import Callable

class Bpe:
    fallbacks: int
    def __init__(self, ranks: dict[bytes, int], digits: int, fallback: Callable[[str], list[int]]) -> None: ...
    def encode(self, text: str) -> list[int]: ...
