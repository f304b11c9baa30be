"""Where a tokenizer comes from: a local folder, or a model id found in the Hugging Face cache.

``--router-tokenizer-path Qwen/Qwen3-0.6B`` resolves the way transformers and
huggingface_hub resolve a model id offline, and never reaches the network:

1. A folder at that path wins (``./Qwen/Qwen3-0.6B`` if it exists).
2. Otherwise the id is looked up in the hub cache: ``$HF_HUB_CACHE``, else ``$HF_HOME/hub``,
   else ``$XDG_CACHE_HOME/huggingface/hub``, else ``~/.cache/huggingface/hub``. There a model
   lives in ``models--<org>--<name>/``: ``refs/<revision>`` holds the commit hash of a named
   revision (``main`` by default) and ``snapshots/<commit>/`` the files of that commit (a
   revision given as a commit hash names its snapshot directly).

When nothing is found, the error names every place it looked and how to fill the cache.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from pathlib import Path

REQUIRED = ("tokenizer.json", "tokenizer_config.json")
_COMMIT = re.compile(r"[0-9a-f]{40}")
_REPO_ID = re.compile(r"[A-Za-z0-9][\w.-]*(/[\w.-]+)?")


class TokenizerNotFoundError(ValueError):
    """Neither a local folder nor a cached model id: the message lists where it looked."""


def hub_cache(environ: Mapping[str, str]) -> Path:
    """The Hugging Face hub cache directory, by huggingface_hub's own precedence."""
    if environ.get("HF_HUB_CACHE"):
        return Path(environ["HF_HUB_CACHE"]).expanduser()
    if environ.get("HF_HOME"):
        return Path(environ["HF_HOME"]).expanduser() / "hub"
    base = Path(environ["XDG_CACHE_HOME"]).expanduser() if environ.get("XDG_CACHE_HOME") else Path.home() / ".cache"
    return base / "huggingface" / "hub"


def resolve_tokenizer_dir(name: str, revision: str = "main", environ: Mapping[str, str] | None = None) -> Path:
    """The folder holding ``name``'s tokenizer files: ``name`` itself, or its cached snapshot.

    ``revision`` is a ref name (``main``, a branch or tag) or a 40-hex commit hash. Raises
    :class:`TokenizerNotFoundError` when neither exists, naming each place looked at.
    """
    env = os.environ if environ is None else environ
    local = Path(name).expanduser()
    if local.is_dir():
        return local
    looked = [f"no folder {local.absolute()}"]
    if _REPO_ID.fullmatch(name) and not name.startswith((".", "~")):
        cache = hub_cache(env)
        snapshot, missing = _cached_snapshot(cache / f"models--{name.replace('/', '--')}", revision)
        if snapshot is not None and not missing:
            return snapshot
        looked.append(missing or f"nothing for {name} in the Hugging Face cache {cache}")
    else:
        looked.append(f"{name!r} is not a model id (org/name), so the Hugging Face cache was not searched")
    raise TokenizerNotFoundError(
        f"tokenizer {name!r} (revision {revision}) not found: " + "; ".join(looked) + ". Pass a folder holding "
        f"{' and '.join(REQUIRED)}, or fill the cache on a machine with network: `huggingface-cli download "
        f"{name} {' '.join(REQUIRED)} --revision {revision}` (HF_HUB_CACHE or HF_HOME pointing at the cache "
        "this process reads), then copy the cache here")


def _cached_snapshot(repo: Path, revision: str) -> tuple[Path | None, str]:
    """(the snapshot folder, "") or (None or the folder, why it does not serve)."""
    if not repo.is_dir():
        return None, f"no {repo}"
    ref = repo / "refs" / revision
    if ref.is_file():
        commit = ref.read_text(encoding="utf-8").strip()
    elif _COMMIT.fullmatch(revision):
        commit = revision
    else:
        return None, f"no {ref} (the revision {revision!r} was never downloaded)"
    snapshot = repo / "snapshots" / commit
    if not snapshot.is_dir():
        return None, f"no snapshot {snapshot}"
    absent = [f for f in REQUIRED if not (snapshot / f).is_file()]
    if absent:
        return snapshot, f"snapshot {snapshot} lacks {', '.join(absent)}"
    return snapshot, ""
