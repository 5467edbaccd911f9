"""SGLang's source, read without importing it: an installed package, an unpacked wheel, or a `.whl` file.

`open_source` finds the `sglang` package in what it is given (a package folder, a folder holding one such as
site-packages or an unpacked wheel, a wheel file read as a zip, a release version looked up in a wheel cache, or
the sglang installed in this interpreter) and returns a `SourceTree`: module names, their text read on demand and
their `ast` parsed on demand. Standard library only: the audit runs where torch and SGLang's own dependencies are
absent, and never executes a line of SGLang.
"""

from __future__ import annotations

import ast
import importlib.util
import os
import re
import zipfile
from collections.abc import Iterable, Iterator
from pathlib import Path

from ..tracer import user_env

PKG = "sglang"
# Where `--version X` looks for `sglang-X-*.whl` (after $SPECSCOPE_SGLANG_WHEELS): the folder
# .ci/sglang-wheels.sh fills, in the working directory and at the root of a source checkout.
WHEELS_ENV = user_env.SGLANG_WHEELS
WHEELS_DIR = ".sglang-wheels"


class AuditInputError(Exception):
    """The SGLang source the audit was pointed at cannot be read; the message is one line."""


class SourceTree:
    """The `.py` files of one `sglang` package: names up front, text and syntax trees on demand."""

    def __init__(self, origin: str, kind: str, files: dict[str, str], reader: _Reader,
                 version: str | None) -> None:
        self.origin = origin  # what was read, as a path to show
        self.kind = kind  # "wheel" or "dir"
        self.version = version
        self._files = files  # module name -> path inside the package root ("sglang/srt/....py")
        self._reader = reader
        self._texts: dict[str, str | None] = {}
        self._trees: dict[str, ast.Module | None] = {}
        self._packages = {m for m, p in files.items() if p.endswith("/__init__.py")}
        self._prefixes = {m.rsplit(".", i)[0] for m in files for i in range(1, m.count(".") + 1)}
        self.syntax_errors: list[str] = []

    def modules(self) -> Iterable[str]:
        """Every module name, sorted."""
        return sorted(self._files)

    def has(self, module: str) -> bool:
        """Whether `module` is a file of the package."""
        return module in self._files

    def is_package(self, module: str) -> bool:
        """Whether `module` names a package (an `__init__.py`, or a folder of modules: a namespace package)."""
        return module in self._packages or module in self._prefixes

    def path(self, module: str) -> str:
        """The module's path relative to the package root, e.g. `sglang/srt/layers/attention/x.py`."""
        return self._files[module]

    def text(self, module: str) -> str | None:
        """The module's source text (None when it is not in the package or cannot be read)."""
        if module not in self._texts:
            rel = self._files.get(module)
            self._texts[module] = None if rel is None else self._reader.read(rel)
        return self._texts[module]

    def tree(self, module: str) -> ast.Module | None:
        """The module's syntax tree (None when absent or when it does not parse)."""
        if module not in self._trees:
            text = self.text(module)
            tree = None
            if text is not None:
                try:
                    tree = ast.parse(text, filename=self._files[module])
                except (SyntaxError, ValueError) as e:
                    # A file of a newer Python's syntax: reported, the rest of the audit goes on.
                    self.syntax_errors.append(f"{self._files[module]}: {type(e).__name__}: {e}")
            self._trees[module] = tree
        return self._trees[module]

    def texts(self, under: str = PKG) -> Iterator[tuple[str, str]]:
        """(module, text) for every module named `under` or below it."""
        for m in self.modules():
            if m == under or m.startswith(under + "."):
                t = self.text(m)
                if t is not None:
                    yield m, t


class _Reader:
    """Reads one file of the tree by its path relative to the package root."""

    def read(self, rel: str) -> str | None:
        """The file's text, decoded as UTF-8 (undecodable bytes replaced)."""
        raise NotImplementedError


class _DirReader(_Reader):
    def __init__(self, root: Path) -> None:
        self.root = root

    def read(self, rel: str) -> str | None:
        """The file's text, decoded as UTF-8 (undecodable bytes replaced)."""
        try:
            return (self.root / rel).read_bytes().decode("utf-8", errors="replace")
        except OSError:
            return None


class _ZipReader(_Reader):
    def __init__(self, zf: zipfile.ZipFile) -> None:
        self.zf = zf

    def read(self, rel: str) -> str | None:
        """The member's text, decoded as UTF-8 (undecodable bytes replaced)."""
        try:
            return self.zf.read(rel).decode("utf-8", errors="replace")
        except (KeyError, OSError, zipfile.BadZipFile, EOFError):
            return None


def _module_name(rel: str) -> str:
    parts = rel[: -len(".py")].split("/")
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


_IDENT = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


def _py_files(names: Iterable[str]) -> dict[str, str]:
    files: dict[str, str] = {}
    for rel in names:
        if not rel.endswith(".py") or not rel.startswith(PKG + "/") or "/__pycache__/" in rel:
            continue
        # A file whose name is not an identifier cannot be imported (e.g. `foo-bar.py`); it defines nothing.
        if all(_IDENT.match(p) for p in rel[: -len(".py")].split("/")):
            files[_module_name(rel)] = rel
    return files


_VERSION_RE = re.compile(r"""^(?:__version__|version)\s*(?::\s*str\s*)?=\s*['"]([^'"]+)['"]""", re.M)
_METADATA_RE = re.compile(r"^Version:\s*(\S+)", re.M)


def _version_from(read: _Reader, files: dict[str, str], metadata: str | None) -> str | None:
    # The package's own version file first (it is what the code is), then the distribution's metadata.
    for mod in (f"{PKG}._version", f"{PKG}.version"):
        if mod in files:
            m = _VERSION_RE.search(read.read(files[mod]) or "")
            if m:
                return m.group(1)
    if metadata:
        m = _METADATA_RE.search(metadata)
        if m:
            return m.group(1)
    return None


def _open_wheel(path: Path) -> SourceTree:
    try:
        zf = zipfile.ZipFile(path)
        names = zf.namelist()
    except (zipfile.BadZipFile, OSError, EOFError) as e:
        raise AuditInputError(f"{path}: not a readable wheel ({e})") from None
    files = _py_files(names)
    if not files:
        raise AuditInputError(f"{path}: the archive holds no `{PKG}` package (is it an SGLang wheel?)")
    reader = _ZipReader(zf)
    meta_name = next((n for n in names if re.match(rf"{PKG}-[^/]*\.dist-info/METADATA$", n)), None)
    metadata = reader.read(meta_name) if meta_name else None
    return SourceTree(str(path), "wheel", files, reader, _version_from(reader, files, metadata))


def _open_dir(root: Path, shown: str) -> SourceTree:
    pkg = root / PKG
    names: list[str] = []
    for dirpath, dirnames, filenames in os.walk(pkg):
        dirnames[:] = sorted(d for d in dirnames if d != "__pycache__")
        rel_dir = Path(dirpath).relative_to(root).as_posix()
        names.extend(f"{rel_dir}/{f}" for f in filenames if f.endswith(".py"))
    files = _py_files(names)
    if not files:
        raise AuditInputError(f"{shown}: no Python files under {pkg}")
    reader = _DirReader(root)
    metadata = None
    for info in sorted(root.glob(f"{PKG}-*.dist-info/METADATA")):
        metadata = _DirReader(info.parent).read("METADATA")
        break
    return SourceTree(shown, "dir", files, reader, _version_from(reader, files, metadata))


def _looks_like_sglang(pkg: Path) -> bool:
    return pkg.is_dir() and ((pkg / "__init__.py").is_file() or (pkg / "srt").is_dir())


def open_path(path: str) -> SourceTree:
    """The sglang package in `path`: a `.whl` file, a folder holding `sglang/`, or the `sglang/` folder itself."""
    p = Path(path).expanduser()
    if not p.exists():
        raise AuditInputError(f"{path}: no such file or directory")
    if p.is_file():
        if zipfile.is_zipfile(p):
            return _open_wheel(p)
        raise AuditInputError(f"{path}: not a wheel (.whl) and not a directory")
    if _looks_like_sglang(p / PKG):
        return _open_dir(p, path)
    if p.name == PKG and _looks_like_sglang(p):
        return _open_dir(p.parent, path)
    raise AuditInputError(f"{path}: not an SGLang package, a folder holding one (site-packages, an unpacked "
                          "wheel) or a wheel file")


def wheel_dirs() -> list[Path]:
    """Where `--version` looks for release wheels, in order."""
    dirs = [Path(d) for d in user_env.path_list(WHEELS_ENV)]
    dirs.append(Path.cwd() / WHEELS_DIR)
    # A source checkout: integrations/ sits at the repository root, next to the wheel cache.
    dirs.append(Path(__file__).resolve().parent.parent / WHEELS_DIR)
    seen: list[Path] = []
    for d in dirs:
        if d not in seen:
            seen.append(d)
    return seen


def find_wheel(version: str) -> Path | None:
    """The cached wheel of sglang `version`, if one of `wheel_dirs()` holds it."""
    for d in wheel_dirs():
        hits = sorted(d.glob(f"{PKG}-{version}-*.whl")) if d.is_dir() else []
        if hits:
            return hits[0]
    return None


def installed_root() -> Path | None:
    """The folder holding the `sglang` package this interpreter would import (without importing it)."""
    try:
        spec = importlib.util.find_spec(PKG)
    except (ImportError, ValueError):
        return None
    if spec is None:
        return None
    locations = list(spec.submodule_search_locations or [])
    if not locations and spec.origin:
        locations = [str(Path(spec.origin).parent)]
    for loc in locations:
        if _looks_like_sglang(Path(loc)):
            return Path(loc).parent
    return None


def open_source(path: str | None = None, version: str | None = None) -> SourceTree:
    """The SGLang source to audit: `path` if given, else release `version` (a cached wheel, or the installed
    sglang when it is that version), else the installed sglang."""
    if path:
        return open_path(path)
    root = installed_root()
    if version:
        wheel = find_wheel(version)
        if wheel is not None:
            return _open_wheel(wheel)
        if root is not None:
            tree = _open_dir(root, str(root / PKG))
            if tree.version == version:
                return tree
        where = ", ".join(str(d) for d in wheel_dirs())
        raise AuditInputError(f"no wheel of sglang {version} in {where} (fetch it with .ci/sglang-wheels.sh or "
                              f"`pip download --no-deps sglang=={version} -d {WHEELS_DIR}`), and the installed "
                              f"sglang is not {version}")
    if root is None:
        raise AuditInputError("sglang is not installed in this environment: pass --sglang DIR|WHEEL or --version X")
    return _open_dir(root, str(root / PKG))
