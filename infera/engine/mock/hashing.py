"""vLLM's prefix-caching block hash, so the mock's KV events carry the same ids as real vLLM.

vLLM (default ``--prefix-caching-hash-algo sha256``) chains 32-byte digests:
``digest = sha256(pickle.dumps((parent_digest, tuple(block_tokens), extra_keys)))``, the first
parent being ``sha256(pickle.dumps("vllm-none-hash"))``. Events carry the last 8 bytes of a digest
as an unsigned 64-bit int. Identical for any engine with the same tokenizer and block size.
"""

from __future__ import annotations

import hashlib
import pickle
from collections.abc import Sequence

NONE_HASH: bytes = hashlib.sha256(pickle.dumps("vllm-none-hash", protocol=pickle.HIGHEST_PROTOCOL)).digest()


def event_hash(digest: bytes) -> int:
    """The id a KV event carries for a block: the digest's last 8 bytes, big-endian, unsigned."""
    return int.from_bytes(digest[-8:], "big")


def extend_digests(digests: list[bytes], tokens: Sequence[int], block_size: int) -> None:
    """Append the digests of the full blocks of ``tokens`` that ``digests`` does not cover yet."""
    full = len(tokens) // block_size
    parent = digests[-1] if digests else NONE_HASH
    sha256, dumps, proto = hashlib.sha256, pickle.dumps, pickle.HIGHEST_PROTOCOL  # hot loop: locals
    for i in range(len(digests), full):
        parent = sha256(dumps((parent, tuple(tokens[i * block_size:(i + 1) * block_size]), None), proto)).digest()
        digests.append(parent)
