"""Models and tokenizers named by a Hugging Face Hub id ("org/name"), fetched into the standard cache.

    path = hub_or_local("meta-llama/Llama-3.1-8B", "model.init_from", MODEL_FILES)   # downloads
    path = hub_or_local(spec, field, MODEL_FILES, download=False)                    # cache only, or None

A local path wins whenever it exists; only a spec that is not a path on this machine and looks
like "org/name" goes to the Hub. huggingface_hub does the rest as every HF tool does: the cache
(HF_HUB_CACHE / HF_HOME), the token (HF_TOKEN or a stored login), HF_HUB_OFFLINE, HF_ENDPOINT.
Only the files longctx reads are downloaded (`MODEL_FILES`, `TOKENIZER_FILES`). Every way a
fetch can fail is one UserError naming the field, the id and what to do.
"""
from __future__ import annotations

import functools
import os
import re
from pathlib import Path
from typing import Optional, Sequence

from longctx.base.errors import UserError

HUB_ID = re.compile(r"^[A-Za-z0-9][\w.\-]*/[\w.\-]+$")

TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "tokenizer.model",
                   "vocab.json", "merges.txt", "chat_template.jinja", "chat_template.json")
MODEL_FILES = ("config.json", "generation_config.json", "*.safetensors", "model.safetensors.index.json",
               *TOKENIZER_FILES)
CONFIG_FILES = ("config.json",)


def is_hub_id(spec: str) -> bool:
    """Not a path on this machine, and shaped like a Hub repository id."""
    return not os.path.exists(os.path.expanduser(spec)) and bool(HUB_ID.match(spec))


def hub_or_local(spec: str, field: str, files: Sequence[str], *, revision: Optional[str] = None,
                 download: bool = True, revision_field: str = "model.revision") -> Optional[Path]:
    """`spec` itself when it exists here; else, for a Hub id, its snapshot directory (download=False:
    only when the cache holds it, never the network); else None."""
    if os.path.exists(os.path.expanduser(spec)):
        return Path(os.path.expanduser(spec))
    if not HUB_ID.match(spec):
        return None
    if not download:
        return cached(spec, files, revision)
    return fetch(spec, field, tuple(files), revision, revision_field)


def cached(repo_id: str, files: Sequence[str], revision: Optional[str] = None) -> Optional[Path]:
    """The cached snapshot of `repo_id` holding `files`' first pattern (config.json, ...), or None; no network."""
    from huggingface_hub import snapshot_download  # lazy: the CLI's start-up stays light
    from huggingface_hub.errors import LocalEntryNotFoundError

    try:
        path = Path(snapshot_download(repo_id, revision=revision, allow_patterns=list(files), local_files_only=True))
    except (LocalEntryNotFoundError, ValueError):
        return None
    return path if (path / files[0]).exists() or "*" in files[0] else None


@functools.lru_cache(maxsize=None)  # one Hub round trip per id, revision and file set in a process
def fetch(repo_id: str, field: str, files: tuple, revision: Optional[str] = None,
          revision_field: str = "model.revision") -> Path:
    """Download (or find in the cache) `files` of `repo_id`; a UserError for each way that fails."""
    from huggingface_hub import constants, snapshot_download
    from huggingface_hub.errors import (
        GatedRepoError,
        HfHubHTTPError,
        LocalEntryNotFoundError,
        RepositoryNotFoundError,
        RevisionNotFoundError,
    )

    where = f"{field}: {repo_id}"
    cache = constants.HF_HUB_CACHE
    try:
        path = Path(snapshot_download(repo_id, revision=revision, allow_patterns=list(files)))
    except GatedRepoError:
        raise UserError(f"{where} is gated on the Hugging Face Hub; accept its terms at "
                        f"{constants.ENDPOINT}/{repo_id} and set HF_TOKEN (or run `hf auth login`)") from None
    except RevisionNotFoundError:
        raise UserError(f"{revision_field}: {repo_id} has no revision {revision!r}; use one of its branches, tags "
                        "or commit hashes") from None
    except RepositoryNotFoundError:
        raise UserError(f"{where} is not a local directory and the Hugging Face Hub has no model by that id; check "
                        "the id (org/name) or the path, or set HF_TOKEN if the model is private") from None
    except LocalEntryNotFoundError as e:  # not in the cache, and the Hub not asked (offline) or not reached
        raise UserError(f"{where} {_why_not_cached(e, repo_id, cache)}, or pass a local directory") from None
    except HfHubHTTPError as e:
        raise UserError(f"{where}: the Hugging Face Hub answered {_first_line(e)}; try again, or pass a local "
                        "directory") from None
    except OSError as e:  # the cache itself: not writable, disk full
        raise UserError(f"{where}: cannot write the Hugging Face cache {cache} ({e.strerror or e}); set HF_HOME or "
                        "HF_HUB_CACHE to a writable directory") from None
    if "*" not in files[0] and not (path / files[0]).is_file():
        raise UserError(f"{where} has no {files[0]} on the Hub (revision {revision or 'main'}); name a "
                        "repository that has one, or pass a local directory")
    return path


def _why_not_cached(e: Exception, repo_id: str, cache: str) -> str:
    """Why snapshot_download found no usable snapshot, and what to do (the caller adds the local directory)."""
    from huggingface_hub import constants
    from huggingface_hub.errors import HfHubHTTPError

    if "incomplete" in str(e):  # IncompleteSnapshotError (newer huggingface_hub): files of a snapshot missing
        return f"has an incomplete snapshot in the Hugging Face cache ({cache}); download it again with network"
    if constants.HF_HUB_OFFLINE:
        return (f"is not in the Hugging Face cache ({cache}) and HF_HUB_OFFLINE is set; download it once with "
                f"HF_HUB_OFFLINE unset (e.g. `hf download {repo_id}`)")
    cause = e.__cause__
    if isinstance(cause, HfHubHTTPError):  # the Hub answered, with an error (5xx, 401)
        return (f"is not in the Hugging Face cache ({cache}) and {constants.ENDPOINT} answered "
                f"{_first_line(cause)}; try again, or check HF_TOKEN")
    what = type(cause).__name__ if cause is not None else "no connection"
    return (f"is not in the Hugging Face cache ({cache}) and the Hub at {constants.ENDPOINT} cannot be reached "
            f"({what}); check the network or HF_ENDPOINT, or download it into this cache where there is a network")


def _first_line(e: BaseException) -> str:
    text = str(e).strip().splitlines()
    return f"{type(e).__name__}: {text[0]}" if text else type(e).__name__
