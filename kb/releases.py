"""Releases: what each indexed compiler release holds, how two differ, and dropping one.

A release is a name shared by the indexes built from one source tree (`kb index compiler
--release NAME`, `kb index ir --name NAME`): one manifest per corpus plus its rows in the symbol store.
"""

from __future__ import annotations

import json
import re
import shlex
from dataclasses import dataclass, field
from typing import Any

from harness.errors import UserFacingError
from kb.home import KBHome
from kb.index import Manifest, drop_builds, drop_index, leftover_builds, list_manifests
from kb.symbols import SymbolStore

__all__ = ["IR_CORPUS", "RESERVED_CORPORA", "ReleaseDiff", "ReleaseInfo", "check_corpus", "check_name",
           "check_published", "interrupted", "reindex_command",
           "check_release_name", "diff_releases", "drop_release", "list_releases", "name_from"]

IR_CORPUS = "ir"  # the corpus of IR dumps (`kb index ir`); every other corpus is built from source


def _ir_dumps(home: KBHome) -> set[str]:
    return {m.release for m in list_manifests(home) if m.corpus == IR_CORPUS}


# Release, dump and corpus names become file and collection names (`<corpus>__<release>`): other
# characters would be replaced there, and two names could land on one index.
_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*")


# A name becomes part of a chroma collection's name (no "..") and of file names (255 bytes at most).
MAX_NAME_LENGTH = 100


def name_from(text: str) -> str:
    """A valid name made from `text` (a file stem): other characters become '-'."""
    name = re.sub(r"\.{2,}", ".", re.sub(r"_{2,}", "_", re.sub(r"[^A-Za-z0-9._-]+", "-", text)))
    return name[:MAX_NAME_LENGTH].strip("-._") or "dump"


def check_name(name: str, option: str) -> None:
    """Refuse a name that is not letters, digits, '.', '_' and '-' (no '__' or '..'), from a letter or
    digit, or that is longer than MAX_NAME_LENGTH."""
    if not _NAME.fullmatch(name) or "__" in name or ".." in name:
        raise UserFacingError(f"{option} {name!r} may hold only letters, digits, '.', '_' and '-' (not '__' or "
                              "'..'), starting with a letter or digit", f"e.g. {option} {name_from(name)}")
    if len(name) > MAX_NAME_LENGTH:
        raise UserFacingError(f"{option} is {len(name)} characters long; at most {MAX_NAME_LENGTH} are allowed",
                              f"e.g. {option} {name_from(name)}")


# Corpora other commands build: source indexed into them would answer their queries.
RESERVED_CORPORA = {IR_CORPUS: "kb index ir", "patterns": "kb index patterns"}


def check_corpus(home: KBHome, corpus: str, release: str) -> None:
    """Refuse source into a corpus another command builds, or a second corpus of one release.

    A release's symbols live under its name alone: a second corpus of it (`--corpus mine`) would
    replace the first one's symbols and links while its vectors stayed.
    """
    if corpus in RESERVED_CORPORA:
        raise UserFacingError(f"--corpus {corpus} is built by `{RESERVED_CORPORA[corpus]}`, not from source",
                              "leave --corpus out (compiler), or name another")
    other = sorted(m.corpus for m in list_manifests(home) if m.release == release and m.corpus != corpus)
    if other:
        raise UserFacingError(f"release {release!r} is already indexed as corpus {other[0]}; a second corpus "
                              "would replace its symbols",
                              f"give this source its own --release, or `kb releases drop {release}` first")


def check_release_name(home: KBHome, name: str, *, ir_dump: bool) -> None:
    """Refuse a malformed name, an IR dump under a source release's name, or source under a dump's name.

    Both keep their symbols under that name in the one symbol store: indexing one would silently
    replace the other's symbols, and `kb releases drop` would then drop both.
    """
    check_name(name, "--name" if ir_dump else "--release")
    others = {m.release for m in list_manifests(home) if (m.corpus == IR_CORPUS) != ir_dump}
    if name not in others:
        return
    if ir_dump:
        raise UserFacingError(f"{name!r} is the name of an indexed source release",
                              "give the dump its own name with `kb index ir PATH --name OTHER`")
    raise UserFacingError(f"{name!r} is the name of an indexed IR dump",
                          f"choose another --release, or drop the dump first with `kb releases drop {name}`")


def reindex_command(manifest: Manifest) -> str:
    """The command that built `manifest`'s index (what to run again to repair or refresh it)."""
    if manifest.source.get("kind") == "installed-wheel":  # the wheel's compiler parts only, not the whole tree
        return "kb index compiler --installed"
    path = shlex.quote(str(manifest.source.get("path", "DIR")))
    if manifest.corpus == IR_CORPUS:
        return f"kb index ir {path} --name {manifest.release}"
    corpus = "" if manifest.corpus == "compiler" else f" --corpus {manifest.corpus}"
    return f"kb index compiler --source {path} --release {manifest.release}{corpus}"


def interrupted(store: SymbolStore, manifest: Manifest) -> bool:
    """Whether a build died between publishing `manifest`'s chunks and writing its release's symbols."""
    return store.publishing(manifest.release) == manifest.collection


def check_published(store: SymbolStore, manifests: list[Manifest]) -> None:
    """Refuse to answer from a release whose symbols are older than its chunks (see `interrupted`)."""
    for manifest in manifests:
        if interrupted(store, manifest):
            raise UserFacingError(
                f"the last index of {manifest.corpus}@{manifest.release} stopped after publishing its chunks "
                "and before its symbols", f"run it again to finish it: {reindex_command(manifest)}")


@dataclass
class ReleaseInfo:
    name: str
    corpora: dict[str, int]  # corpus -> chunks
    files: int
    symbols: int
    passes: int
    links: int
    created: float
    source: str
    interrupted: str = ""  # the command to run again when a build stopped half-published


def list_releases(home: KBHome) -> list[ReleaseInfo]:
    manifests = list_manifests(home)
    store = SymbolStore(home.symbols_db)
    try:
        names = sorted({m.release for m in manifests} | set(store.releases()))
        out = []
        for name in names:
            ms = [m for m in manifests if m.release == name]
            counts = store.count(name)
            out.append(ReleaseInfo(
                name=name, corpora={m.corpus: m.count for m in ms}, files=counts["files"],
                symbols=counts["symbols"], passes=counts["passes"], links=counts["links"],
                created=max((m.created for m in ms), default=0.0),
                source=next((str(m.source.get("path", "")) for m in ms if m.source.get("path")), ""),
                interrupted=next((reindex_command(m) for m in ms if interrupted(store, m)), ""),
            ))
        return out
    finally:
        store.close()


@dataclass
class ReleaseDiff:
    """What changed from release `a` to release `b`.

    Passes are compared by argument (summary, description, options and factory); definitions by
    (qualified name, kind, file) and the hash of their text, so "changed" means the body changed.
    """

    a: str
    b: str
    files: dict[str, list[str]] = field(default_factory=dict)  # added / removed / changed
    passes: dict[str, list[str]] = field(default_factory=dict)
    symbols: dict[str, list[str]] = field(default_factory=dict)

    def to_json(self) -> str:
        return json.dumps({"a": self.a, "b": self.b, "files": self.files, "passes": self.passes,
                           "symbols": self.symbols}, indent=1)


def diff_releases(home: KBHome, a: str, b: str) -> ReleaseDiff:
    store = SymbolStore(home.symbols_db)
    try:
        dumps = _ir_dumps(home)
        known = set(store.releases()) - dumps
        for name in (a, b):
            if name in dumps:
                raise UserFacingError(f"{name!r} is an IR dump, not a source release",
                                      f"compare what its passes did with `kb ir trace {name} OP`")
            check_published(store, [m for m in list_manifests(home) if m.release == name])
            if name not in known:
                raise UserFacingError(f"release {name!r} is not indexed (known: {', '.join(sorted(known)) or 'none'})",
                                      "see `kb releases list`")
        diff = ReleaseDiff(a, b)
        fa, fb = store.files(a), store.files(b)
        diff.files = _compare(fa, fb, lambda x, y: x.sha256 != y.sha256)
        diff.files["renamed"] = _moved(diff.files, lambda f: (fa[f].sha256,), lambda f: (fb[f].sha256,),
                                       lambda pair: f"{pair[0]} -> {pair[1]}")
        pa = {p.argument: p for p in store.passes(a)}
        pb = {p.argument: p for p in store.passes(b)}
        diff.passes = _compare(pa, pb, lambda x, y: (x.summary, x.description, x.options, x.constructor)
                               != (y.summary, y.description, y.options, y.constructor))
        da, db = store.definitions(a), store.definitions(b)
        changed = _compare(da, db, lambda x, y: bool(x.digest and y.digest and x.digest != y.digest))
        # A definition whose file moved, body unchanged, is one move, not an addition and a removal.
        changed["moved"] = _moved(changed, lambda k: (k[0], k[1], da[k].digest), lambda k: (k[0], k[1], db[k].digest),
                                  lambda pair: f"{pair[0][0]} ({pair[0][1]}, {pair[0][2]} -> {pair[1][2]})")
        diff.symbols = {k: v if k == "moved" else [_symbol_label(key) for key in v] for k, v in changed.items()}
        return diff
    finally:
        store.close()


def _compare(a: dict[Any, Any], b: dict[Any, Any], differs: Any) -> dict[str, list[Any]]:
    return {
        "added": sorted(k for k in b if k not in a),
        "removed": sorted(k for k in a if k not in b),
        "changed": sorted(k for k in a if k in b and differs(a[k], b[k])),
    }


def _moved(section: dict[str, list[Any]], old_identity: Any, new_identity: Any, label: Any) -> list[str]:
    """Pairs of a removed and an added entry with the same identity (content hash; for definitions,
    name, kind and body): taken out of `section`'s added and removed, returned as labels."""
    added: dict[Any, list[Any]] = {}
    for key in section["added"]:
        if new_identity(key)[-1]:  # an entry without a hash matches nothing
            added.setdefault(new_identity(key), []).append(key)
    moved, matched, kept_removed = [], set(), []
    for key in section["removed"]:
        candidates = added.get(old_identity(key)) if old_identity(key)[-1] else None
        if not candidates:
            kept_removed.append(key)
            continue
        target = candidates.pop(0)
        matched.add(target)
        moved.append(label((key, target)))
    section["added"] = [k for k in section["added"] if k not in matched]
    section["removed"] = kept_removed
    return sorted(moved)


def _symbol_label(key: Any) -> str:
    if isinstance(key, tuple):
        name, kind, file = key
        return f"{name} ({kind}, {file})"
    return str(key)


def drop_release(home: KBHome, name: str) -> list[str]:
    """Drop every index of release `name` and its symbol rows; returns the corpora dropped."""
    dropped = [m.corpus for m in list_manifests(home) if m.release == name]
    leftovers = leftover_builds(home, name)
    store = SymbolStore(home.symbols_db)
    try:
        in_store = name in store.releases()
        if not dropped and not in_store and not leftovers:
            known = sorted({m.release for m in list_manifests(home)} | set(store.releases()))
            raise UserFacingError(f"release {name!r} is not indexed (known: {', '.join(known) or 'none'})",
                                  "see `kb releases list`")
        # Symbols first: a crash between the two leaves a manifest without symbols, which readers
        # tolerate (they degrade to retrieval), never symbols pointing at a dropped collection's chunks.
        store.drop_release(name)
    finally:
        store.close()
    for corpus in dropped:
        drop_index(home, corpus, name)
    drop_builds(home, leftovers)
    if leftovers and not dropped:
        dropped = ["leftovers of a killed build"]
    for timeline in home.timeline_files(name):
        timeline.unlink(missing_ok=True)
    return dropped
