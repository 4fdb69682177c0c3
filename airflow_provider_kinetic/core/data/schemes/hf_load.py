"""``hf://`` data: parse the URI and, in the runner, load the dataset into a directory.

``hf://org/name?split=train&config_name=x&revision=main`` names a dataset repo on the
Hugging Face Hub (``name`` alone is accepted too, as kinetic does).  The runner loads it
with ``datasets.load_dataset`` into a throw-away cache and ``save_to_disk``-s it at the
target, so the function gets a directory that ``datasets.load_from_disk`` reads.

No Airflow here (the runner imports this in the pod), and ``datasets`` is imported only
when a dataset is loaded: it is needed in the job's environment, and only for hf://.
"""

from __future__ import annotations

import contextlib
import importlib
import inspect
import logging
import os
import re
import shutil
import tempfile
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from types import ModuleType
from urllib.parse import parse_qsl

__all__ = ["HfSource", "load_hf_to_disk", "parse_hf_uri"]

log = logging.getLogger(__name__)

SCHEME = "hf://"
#: Query keys an hf:// URI may carry (kinetic's names).
QUERY_KEYS = ("split", "config_name", "revision")
#: One segment of a hub repo id: word characters, ``.`` and ``-``, not starting with either.
_SEGMENT = re.compile(r"\w[\w.\-]*")
_MISSING_DATASETS = (
    "hf:// data needs the 'datasets' package in the job's environment (pip install datasets)"
)


@dataclass(frozen=True)
class HfSource:
    """What an ``hf://`` URI names: a dataset repo and how to load it."""

    repo: str
    split: str | None = None
    config_name: str | None = None
    revision: str | None = None


def parse_hf_uri(uri: str) -> HfSource:
    """Parse ``hf://[org/]name[?split=..&config_name=..&revision=..]``.

    Raises ``ValueError`` naming the offending part for anything else: another scheme, no
    or a malformed repo id, a ``#fragment``, an unknown, repeated or empty query key.
    """
    if not isinstance(uri, str) or not uri.startswith(SCHEME):
        raise ValueError(f"{uri!r} is not an hf:// URI (expected hf://org/name?split=train)")
    rest, hash_sign, fragment = uri[len(SCHEME) :].partition("#")
    if hash_sign:
        raise ValueError(f"hf:// URI {uri!r}: unexpected #fragment {fragment!r}")
    path, _, query = rest.partition("?")
    repo = path.strip("/")
    if not repo:
        raise ValueError(f"hf:// URI {uri!r} names no dataset repo (expected hf://org/name)")
    segments = repo.split("/")
    if len(segments) > 2 or ".." in repo or not all(_SEGMENT.fullmatch(s) for s in segments):
        raise ValueError(
            f"hf:// URI {uri!r}: bad dataset repo {repo!r} (expected 'name' or 'org/name')"
        )
    options: dict[str, str] = {}
    # "+" stays a plus: datasets' split syntax ("train+test") is no form-encoded space.
    for key, value in parse_qsl(query.replace("+", "%2B"), keep_blank_values=True):
        if key not in QUERY_KEYS:
            raise ValueError(
                f"hf:// URI {uri!r}: unknown query key {key!r}; allowed: {', '.join(QUERY_KEYS)}"
            )
        if key in options:
            raise ValueError(f"hf:// URI {uri!r}: query key {key!r} given twice")
        if not value:
            raise ValueError(f"hf:// URI {uri!r}: query key {key!r} has an empty value")
        options[key] = value
    return HfSource(repo=repo, **options)


def load_hf_to_disk(uri: str, target: str, trust_remote_code: bool = False) -> str:
    """Load the dataset ``uri`` names and ``save_to_disk`` it at ``target``; returns target.

    A ``split`` gives a ``Dataset``, no split a ``DatasetDict`` of all splits.  Everything
    downloaded goes to a fresh temporary directory, removed whatever happens.  The load
    runs with that (empty) directory as the working directory, so a local directory
    that happens to be named like the repo cannot be loaded in its place.
    """
    source = parse_hf_uri(uri)
    datasets = _import_datasets()
    target = os.path.abspath(target)  # before the chdir below
    kwargs: dict[str, object] = {
        "name": source.config_name,
        "split": source.split,
        "revision": source.revision,
    }
    if "trust_remote_code" in inspect.signature(datasets.load_dataset).parameters:
        kwargs["trust_remote_code"] = trust_remote_code  # datasets < 4: scripts may run
        if trust_remote_code:
            log.warning("trust_remote_code=True: code from dataset repo %r may run", source.repo)
    elif trust_remote_code:  # datasets >= 4 runs no dataset scripts at all
        log.warning(
            "hf_trust_remote_code=True has no effect: datasets %s does not run dataset "
            "scripts; %s loads only if it is data files (parquet, csv, ...)",
            getattr(datasets, "__version__", "?"),
            source.repo,
        )
    log.info("Loading Hugging Face dataset %s into %s", uri, target)
    with _PROCESS_STATE:  # the runner downloads Data inputs in threads
        return _load_in_scratch(datasets, source, target, kwargs)


#: A load changes process-wide state (the working directory, the hub cache's
#: environment), so loads in different threads of one process take turns: two at once
#: removed each other's hub cache mid-download.
_PROCESS_STATE = threading.Lock()


def _load_in_scratch(
    datasets: ModuleType, source: HfSource, target: str, kwargs: dict[str, object]
) -> str:
    """The load itself, in a fresh scratch dir that is also the working directory."""
    scratch = tempfile.mkdtemp(prefix="kinetic-hf-")
    cwd = os.getcwd()
    try:
        workdir, cache_dir = os.path.join(scratch, "cwd"), os.path.join(scratch, "cache")
        os.mkdir(workdir)
        os.chdir(workdir)
        with _hub_cache_under(os.path.join(scratch, "hub")):
            repo = _canonical_repo_id(datasets, source)
            ds = datasets.load_dataset(repo, cache_dir=cache_dir, **kwargs)
            ds.save_to_disk(target)
            del ds  # close its memory-mapped cache files before they are removed
    finally:
        os.chdir(cwd)
        shutil.rmtree(scratch, ignore_errors=True)
    return target


def _import_datasets() -> ModuleType:
    try:
        return importlib.import_module("datasets")
    except ImportError as e:
        raise ImportError(_MISSING_DATASETS) from e


def _canonical_repo_id(datasets: ModuleType, source: HfSource) -> str:
    """``org/name`` for a legacy one-segment name (``imdb``), which the hub redirects.

    Recent ``huggingface_hub`` clients reject ``hf://datasets/imdb@...`` paths, which
    ``datasets`` builds from the name it is given (huggingface/datasets#8612), so the
    name is resolved first.  A name the hub does not know is left to ``load_dataset``
    to report.
    """
    if "/" in source.repo:
        return source.repo
    from huggingface_hub import HfApi
    from huggingface_hub.utils import HfHubHTTPError

    api = HfApi(endpoint=datasets.config.HF_ENDPOINT)
    try:
        repo_id = api.dataset_info(source.repo, revision=source.revision).id
    except HfHubHTTPError:
        return source.repo
    if repo_id != source.repo:
        log.info("Hugging Face dataset %r is now %r", source.repo, repo_id)
    return repo_id


@contextlib.contextmanager
def _hub_cache_under(path: str) -> Iterator[None]:
    """Point huggingface_hub's download cache at ``path`` for the duration.

    ``datasets`` >= 4 fetches hub files with ``hf_hub_download`` into the hub cache
    (~/.cache/huggingface/hub), ignoring ``cache_dir``; that cache is read from the
    environment at import, so it is redirected on the already-imported module (for the
    whole process: the runner loads data before the user's function starts).
    """
    try:
        constants = importlib.import_module("huggingface_hub.constants")
    except ImportError:
        yield
        return
    names = [n for n in ("HF_HUB_CACHE", "HF_XET_CACHE") if hasattr(constants, n)]
    saved = {n: getattr(constants, n) for n in names}
    for name in names:
        setattr(constants, name, os.path.join(path, name.lower()))
    try:
        yield
    finally:
        for name, value in saved.items():
            setattr(constants, name, value)
