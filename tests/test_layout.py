"""The layout stays readable: one concept per folder. A package folder with more than MAX_MODULES modules and no
sub-folders, or a file-name prefix shared by more than MAX_PREFIXED files of one folder (``mor_*.py``, a package
in disguise), fails here with the folder's name, so the tree does not drift back to flat folders."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("fedvlr_plus", "adapters", "datasets")
MAX_MODULES = 25
MAX_PREFIXED = 3


def _package_folders() -> list[Path]:
    return sorted(init.parent for top in PACKAGES for init in (ROOT / top).rglob("__init__.py"))


def _modules(folder: Path) -> list[str]:
    return sorted(p.stem for p in folder.glob("*.py") if p.stem not in ("__init__", "__main__"))


def crowded(folder: Path) -> str | None:
    """Why ``folder`` holds too many modules for one concept, or None."""
    has_subpackages = any((sub / "__init__.py").exists() for sub in folder.iterdir() if sub.is_dir())
    n = len(_modules(folder))
    return None if n <= MAX_MODULES or has_subpackages else f"{n} modules and no sub-folders"


def repeated_prefixes(folder: Path) -> list[str]:
    """File-name prefixes (the part before the first '_') shared by more than MAX_PREFIXED modules."""
    counts = Counter(name.split("_", 1)[0] for name in _modules(folder) if "_" in name.strip("_"))
    return sorted(f"{prefix}_* ({n} files)" for prefix, n in counts.items() if n > MAX_PREFIXED)


@pytest.mark.parametrize("folder", _package_folders(), ids=lambda p: str(p.relative_to(ROOT)))
def test_a_folder_holds_one_concept(folder):
    assert crowded(folder) is None, f"{folder.relative_to(ROOT)}: {crowded(folder)}; split it into sub-packages"
    assert not repeated_prefixes(folder), (
        f"{folder.relative_to(ROOT)}: {', '.join(repeated_prefixes(folder))}; "
        f"a shared prefix is a package: give it a folder"
    )


def test_the_checks_can_fail(tmp_path):
    for i in range(MAX_MODULES + 1):
        (tmp_path / f"m{i}.py").write_text("")
    for name in ("mor_a", "mor_b", "mor_c", "mor_d"):
        (tmp_path / f"{name}.py").write_text("")
    assert crowded(tmp_path) and repeated_prefixes(tmp_path) == ["mor_* (4 files)"]
    (tmp_path / "sub").mkdir()
    (tmp_path / "sub" / "__init__.py").write_text("")
    assert crowded(tmp_path) is None
