"""A run folder that can be trusted: checksummed files, one writer at a time, nothing that runs code when read.

Layout of one seed's folder (``RUN_DIR/seed-<s>/``)::

    checkpoint-000007.safetensors   tensors of the state after round 7 (shared, optimizer, private, RNG)
    checkpoint-000007.json          everything else, plain JSON, referring to those tensors by name
    result.json                     the seed's result, once it has finished
    per_user_test.csv               every test user's metrics at the selected round (for paired tests)
    manifest.json                   every file above with its sha256: the commit point

``manifest.json`` is always written last (atomically), so it names only files that are complete. A checkpoint gets
a new name each round and the old one is deleted only after the manifest points at the new one; a file with a
fixed name (``result.json``) is first dropped from the manifest, then rewritten, then listed again. A process
killed at any moment therefore leaves a folder whose manifest matches its files, and a file that does not match
its checksum was changed by someone else: it is refused, naming the file.

The run folder as a whole is locked (``RUN_DIR/.fedvlr.lock``) while a run writes it.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import re
from pathlib import Path

from ...atomic_write import atomic_write, atomic_write_bytes, is_temp_file, make_dirs, output_error
from ...errors import RunFolderError
from ...jsonio import json_default
from ..state.plain import join_tensors, split_tensors
from ..state.streamed_safetensors import StreamedTensor, load_streamed, save_streamed

MANIFEST = "manifest.json"
MANIFEST_FORMAT = 1
LOCK_FILE = ".fedvlr.lock"
#: the pickled checkpoint of older versions: never read, since unpickling a file can run any code
LEGACY_CHECKPOINT = "checkpoint.pt"
_CHECKPOINT_FILE = re.compile(r"checkpoint-\d+\.(json|safetensors)")
_UNTRUSTED = "the folder was changed after the run wrote it; start a new run in another folder"


def sha256_bytes(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def sha256_file(path) -> str:
    """The sha256 of a file, read in blocks (a checkpoint of a large population's private states is gigabytes)."""
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


@contextlib.contextmanager
def locked(folder):
    """Hold ``folder``'s lock for the block; another holder (any process) makes this a RunFolderError at once."""
    from filelock import FileLock, Timeout

    folder = make_dirs(folder)
    lock = FileLock(str(folder / LOCK_FILE), timeout=0, is_singleton=False)
    try:
        lock.acquire()
    except Timeout:
        raise RunFolderError(
            str(folder), "another run is writing this folder", "wait for it to finish, or choose another folder"
        ) from None
    except OSError as exc:
        raise output_error(folder / LOCK_FILE, exc) from exc
    try:
        yield folder
    finally:
        lock.release()


def refuse_started_runs(root, run_dirs, resume: bool, held: str = "runs") -> None:
    """An experiment that keeps its runs (or ``held``) in ``run_dirs`` under ``root`` refuses, unless ``resume``, to
    start where one of them already holds a checkpoint (it would train over it)."""
    if not resume and any(SeedFolder(d).has_checkpoint() for d in run_dirs if d is not None):
        raise RunFolderError(
            str(root), f"already holds {held}", f"continue with --resume {root}, or choose another folder"
        )


def seed_folders(run_dir) -> dict[int, Path]:
    """The seeds that ``run_dir`` holds a checkpoint for (new or legacy format), by seed."""
    out = {}
    for sub in Path(run_dir).glob("seed-*"):
        seed = sub.name[len("seed-") :]
        if seed.lstrip("-").isdigit() and SeedFolder(sub).has_checkpoint():
            out[int(seed)] = sub
    return out


class SeedFolder:
    """The files of one seed's run, read only after their checksums are checked."""

    def __init__(self, path):
        self.path = Path(path)
        self.manifest_path = self.path / MANIFEST

    # ------------------------------------------------------------------ reading
    def has_checkpoint(self) -> bool:
        return self.manifest_path.exists() or (self.path / LEGACY_CHECKPOINT).exists()

    def manifest(self) -> dict:
        """The manifest, checked for shape (a legacy pickled checkpoint is refused here, unread)."""
        if not self.manifest_path.exists():
            legacy = self.path / LEGACY_CHECKPOINT
            if legacy.exists():
                raise RunFolderError(
                    str(legacy),
                    "a pickled checkpoint of an older fedvlr-plus; it is not read, "
                    "since unpickling a file can run any code",
                    "start a new run in another folder",
                )
            return {"format": MANIFEST_FORMAT, "checkpoint": None, "files": {}}
        try:
            m = json.loads(self.manifest_path.read_bytes())
            ok = (
                m.get("format") == MANIFEST_FORMAT
                and isinstance(m.get("files"), dict)
                and all(isinstance(v, str) for v in m["files"].values())
                and (m.get("checkpoint") is None or f"{m['checkpoint']}.json" in m["files"])
            )
        except (ValueError, AttributeError, TypeError) as exc:
            raise RunFolderError(str(self.manifest_path), f"not a valid manifest ({exc})", _UNTRUSTED) from None
        if not ok:
            raise RunFolderError(
                str(self.manifest_path),
                "not a valid manifest (wrong format, or it names a checkpoint it does not list)",
                _UNTRUSTED,
            )
        return m

    def verify(self) -> dict:
        """Check every file the manifest lists against its sha256; return the manifest."""
        m = self.manifest()
        for name in m["files"]:
            self._verified_path(name, m)
        return m

    def _verified_bytes(self, name: str, manifest: dict) -> bytes:
        """The contents of the listed file ``name``, checked against its sha256 (read once: for small files)."""

        def read(path: Path):
            data = path.read_bytes()
            return data, sha256_bytes(data)

        return self._verified(name, manifest, read)

    def _verified_path(self, name: str, manifest: dict) -> Path:
        """The listed file ``name``, its sha256 checked by reading it in blocks (for tensor files, which are then
        loaded from the path without a second copy in memory)."""
        return self._verified(name, manifest, lambda path: (path, sha256_file(path)))

    def _verified(self, name: str, manifest: dict, read):
        """``read(path) -> (value, sha256)`` of the listed file ``name``; the value once the digest matches."""
        path = self._listed_path(name)
        try:
            value, digest = read(path)
        except FileNotFoundError:
            raise RunFolderError(str(path), f"listed in {MANIFEST} but missing", _UNTRUSTED) from None
        self._check_digest(path, digest, manifest["files"][name])
        return value

    def _listed_path(self, name: str) -> Path:
        if "/" in name or name.startswith("."):
            raise RunFolderError(str(self.manifest_path), f"lists a file outside the folder ({name!r})", _UNTRUSTED)
        return self.path / name

    @staticmethod
    def _check_digest(path: Path, digest: str, listed: str) -> None:
        if digest != listed:
            raise RunFolderError(
                str(path),
                f"does not match its sha256 in {MANIFEST} (changed or truncated after it was written)",
                _UNTRUSTED,
            )

    def read_json(self, name: str):
        """The JSON file ``name`` if the manifest lists it (checked), else None."""
        m = self.manifest()
        if name not in m["files"]:
            return None
        try:
            return json.loads(self._verified_bytes(name, m))
        except ValueError as exc:
            raise RunFolderError(str(self.path / name), f"not valid JSON ({exc})", _UNTRUSTED) from None

    def read_state(self, stem: str, on_disk_from: int | None = None):
        """The state written by :meth:`write_state` under ``stem`` (checked), or None if the manifest lacks it.
        ``on_disk_from``: tensors of at least that many bytes are left in the file as
        :class:`~.streamed_safetensors.StoredTensor` (read a block of rows at a time by the caller)."""
        from safetensors.torch import load_file

        m = self.manifest()
        if f"{stem}.json" not in m["files"]:
            return None
        doc = self.read_json(f"{stem}.json")
        tensor_file = self.path / f"{stem}.safetensors"
        load = load_file if on_disk_from is None else (lambda path: load_streamed(path, on_disk_from))
        try:
            tensors = load(self._verified_path(tensor_file.name, m)) if tensor_file.name in m["files"] else {}
        except RunFolderError:
            raise
        except Exception as exc:  # safetensors' own parse error: not a tensor file at all
            raise RunFolderError(str(tensor_file), f"not a safetensors file ({exc})", _UNTRUSTED) from None
        try:
            return join_tensors(doc["state"], tensors)
        except (KeyError, TypeError, ValueError) as exc:
            raise RunFolderError(
                str(self.path / f"{stem}.json"), f"does not fit its tensors ({exc!r})", _UNTRUSTED
            ) from None

    def read_checkpoint(self, on_disk_from: int | None = None) -> dict | None:
        """The latest checkpoint's state (checked), or None when the folder has none (``on_disk_from``: as
        :meth:`read_state`)."""
        m = self.manifest()
        return self.read_state(m["checkpoint"], on_disk_from) if m["checkpoint"] else None

    # ------------------------------------------------------------------ writing
    def write_state(self, stem: str, state, *, checkpoint: bool = False) -> None:
        """Write ``state`` as ``stem.json`` + ``stem.safetensors`` and list them (``checkpoint``: as the latest
        checkpoint, whose predecessor is deleted once the manifest no longer names it)."""
        skeleton, tensors = split_tensors(state)
        tensor_name, json_name = f"{stem}.safetensors", f"{stem}.json"
        doc = json.dumps({"state": skeleton}, indent=1).encode()
        old = self.manifest()
        if json_name in old["files"]:  # rewriting a listed name: unlist it first
            old = self._write_manifest(
                old, drop=(tensor_name, json_name), checkpoint=None if old["checkpoint"] == stem else old["checkpoint"]
            )
        written = {}
        atomic_write(self.path / tensor_name, lambda tmp: written.update(sha256=_save_tensors(tensors, tmp)))
        atomic_write_bytes(self.path / json_name, doc)
        files = {
            tensor_name: written.get("sha256") or sha256_file(self.path / tensor_name),
            json_name: sha256_bytes(doc),
        }
        stale = [n for n in old["files"] if checkpoint and _CHECKPOINT_FILE.fullmatch(n) and n not in files]
        self._write_manifest(old, add=files, drop=stale, checkpoint=stem if checkpoint else old["checkpoint"])
        for name in stale:
            (self.path / name).unlink(missing_ok=True)

    def write_json(self, name: str, obj) -> None:
        """Write the JSON file ``name`` (a result a person reads) and list it."""
        self.write_file(name, json.dumps(obj, indent=2, default=json_default).encode())

    def write_file(self, name: str, data: bytes) -> None:
        """Write the file ``name`` (a result a person reads: JSON, CSV) and list it."""
        m = self.manifest()
        if name in m["files"]:
            m = self._write_manifest(m, drop=[name])
        atomic_write_bytes(self.path / name, data)
        self._write_manifest(m, add={name: sha256_bytes(data)})

    def _write_manifest(self, old: dict, *, add: dict | None = None, drop=(), checkpoint=...) -> dict:
        """``old`` with the files ``add`` (name: sha256) listed and ``drop`` unlisted, written as the manifest."""
        files = {n: h for n, h in old["files"].items() if n not in drop}
        files.update(add or {})
        m = {
            "format": MANIFEST_FORMAT,
            "checkpoint": old["checkpoint"] if checkpoint is ... else checkpoint,
            "files": dict(sorted(files.items())),
        }
        atomic_write_bytes(self.manifest_path, json.dumps(m, indent=2).encode())
        return m

    def tidy(self) -> None:
        """Remove what a killed writer left behind: temporary files and checkpoints the manifest does not list."""
        listed = self.manifest()["files"]
        for p in self.path.iterdir() if self.path.is_dir() else ():
            if p.is_file() and (is_temp_file(p) or (_CHECKPOINT_FILE.fullmatch(p.name) and p.name not in listed)):
                p.unlink(missing_ok=True)


def _save_tensors(tensors: dict, path: Path) -> str | None:
    """``tensors`` as a safetensors file at ``path``; the file's sha256 where it was taken while writing, else
    None. ``save_file`` writes from the tensors' own memory (safetensors 0.8 passes pointers); ``save`` builds the
    whole file in memory, twice over, which at a large population's private states doubled the process's peak at
    every checkpoint."""
    from safetensors.torch import save_file

    digest = None
    if any(isinstance(t, StreamedTensor) for t in tensors.values()):
        digest = save_streamed(tensors, path)  # some are not in memory (private states in files): in blocks
    else:
        try:
            save_file(tensors, str(path))
        except RuntimeError:  # safetensors refuses tensors whose memory overlaps (one referenced twice): copy
            save_file({k: v.clone() for k, v in tensors.items()}, str(path))
    os.chmod(path, 0o666 & ~process_umask())  # as every other file we write (safetensors makes it 0600)
    return digest


def process_umask() -> int:
    """The process's umask, read where Linux shows it (``os.umask`` can only read it by setting it, and between
    the two calls another thread would create its files with the wrong mode)."""
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("Umask:"):
                    return int(line.split()[1], 8)
    except (OSError, ValueError, IndexError):
        pass
    umask = os.umask(0o022)
    os.umask(umask)
    return umask
