"""Model pairs and their GGUF files, offline first.

- `gguf_header`: a pure GGUF header parser (no imports from the rest of localspec but `errors`); `archs`: what
  llama.cpp does with an architecture on a rejected draft; `files`: verified files on disk;
- `hub`: the one hub-file type (`HubFile`), the local Hugging Face cache, downloads, remote reads;
- `registry`: models.yaml pairs (line-numbered errors), `PairSpec`, `ModelSource`;
- `bundle`: the embedded offline bundle (data-only chunk wheels) assembled once, sha256-checked;
- `resolve`: a pair or explicit paths -> files on disk (path, HF cache, bundle, else `pull`);
- `manage`: pull, rm, file status, draft suggestions;  `check`: pair compatibility from headers (verdicts kept);
- `catalog`: every model servable offline; `sizing`: the context whose KV caches fit the memory.

Import order follows that list: each module imports only the ones above it.
"""

from __future__ import annotations

from .bundle import (
    BUNDLE_EXTRA,
    assemble_bundle,
    find_bundle_chunks,
    has_verified_stamp,
)
from .files import human_size
from .hub import (
    HubFile,
    download_hf_file,
    hf_cache_dir,
    hf_cached_file,
    note_to_stderr,
    parse_hub_ref,
    remove_hf_cached_file,
)
from .manage import (
    FileStatus,
    file_status,
    pair_status,
    pull_pair,
    pull_ref,
    remove_pair,
    suggest_drafts,
)
from .registry import (
    DEFAULT_PAIR,
    PACKAGE_REGISTRY_FILE,
    ModelSource,
    PairSpec,
    get_pair,
    load_registry,
)
from .resolve import (
    Location,
    ResolvedPair,
    bundle_paths_if_installed,
    locate,
    materialize,
    resolve_pair,
)

__all__ = [
    "BUNDLE_EXTRA", "DEFAULT_PAIR", "PACKAGE_REGISTRY_FILE", "FileStatus", "HubFile", "Location", "ModelSource",
    "PairSpec", "ResolvedPair", "assemble_bundle", "bundle_paths_if_installed", "download_hf_file",
    "file_status", "find_bundle_chunks", "get_pair", "has_verified_stamp", "hf_cache_dir", "hf_cached_file",
    "human_size", "load_registry", "locate", "materialize", "note_to_stderr", "pair_status", "parse_hub_ref",
    "pull_pair", "pull_ref", "remove_hf_cached_file", "remove_pair", "resolve_pair", "suggest_drafts",
]
