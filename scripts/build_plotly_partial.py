"""Build the dashboard's partial plotly.js bundle (only the trace types it draws) from the installed plotly
package's full bundle, with Debian's terser. Stdlib only; the output is committed under ui/web/static/, so only
whoever rebuilds it needs terser (`apt-get install -y terser`).

    python scripts/build_plotly_partial.py            # writes ui/web/static/plotly-<version>-<traces>.min.js

plotly.min.js is an esbuild bundle whose modules are lazy wrappers (`var X=ye((exports,module)=>{...})`, and
`gu(...)` for ES modules): a module's body runs only when X() is called. Its entry ends with lib/index.js's list,
`Registry.register([m1e(),n_e(),...])`, one call per trace type (scatter is registered by plotly's core). So:
1. that one list is rewritten to keep the traces we draw, each entry identified by what it evaluates to (the
   module it exports has `moduleType:"trace",name:"..."`), failing loudly when the shape is not found;
2. every wrapper call that initialises a variable is marked `/*@__PURE__*/`, and terser (compress `unused`,
   several passes) drops the modules nothing reaches any more;
3. the result is checked: exactly the wanted trace types remain, and plotly.js's own header comes first.
The same input gives the same output (terser is deterministic; nothing of the moment is written).
"""

from __future__ import annotations

import argparse
import bisect
import gzip
import hashlib
import importlib.util
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
IDENT = r"[\w$]+"
# esbuild's helpers, found by their bodies (their minified names change from release to release).
CJS_RE = re.compile(r"var (" + IDENT + r")=\((\w+),(\w+)\)=>\(\)=>\{try\{return \3\|\|\2\(\(\3=\{exports:\{\}\}\)"
                    r"\.exports,\3\),\3\.exports\}")
ESM_RE = re.compile(r"var (" + IDENT + r")=\((\w+),(\w+),(\w+)\)=>\(\)=>\{if\(\4\)throw \4\[0\];try\{return \2&&")
HEADER_RE = re.compile(r"\A/\*\*\n\* plotly\.js v(\S+)\n(?:\*.*\n)*?\*/\n")
TRACE_RE = re.compile(r'moduleType:"(\w+)",name:"(\w+)"')
# Traces plotly's core registers itself (src/core.js): kept whatever the list says.
CORE_TRACES = ("scatter",)
TERSER_COMPRESS = "unused=true,passes=2"  # a third pass removed 0.02% more (measured)


class BuildError(Exception):
    """The full bundle does not have the shape this script knows: nothing is written."""


def _scripts_module() -> object:
    """ui/web/scripts.py, loaded by path (stdlib only): the trace list and the bundle's name live there."""
    spec = importlib.util.spec_from_file_location("_specscope_web_scripts", os.path.join(ROOT, "ui", "web",
                                                                                         "scripts.py"))
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod  # dataclasses look their module up there
    spec.loader.exec_module(mod)
    return mod


def installed_bundle() -> str:
    """The path of the installed plotly package's full plotly.min.js."""
    spec = importlib.util.find_spec("plotly")
    if spec is None or not spec.submodule_search_locations:
        raise BuildError("the plotly package is not installed (pip install plotly)")
    return os.path.join(list(spec.submodule_search_locations)[0], "package_data", "plotly.min.js")


def helper_names(src: str) -> tuple[str, str | None]:
    """esbuild's CommonJS wrapper (`__commonJS`) and ES-module wrapper (`__esm`, if any) as minified here."""
    cjs = CJS_RE.findall(src)
    if len(cjs) != 1:
        raise BuildError(f"expected one esbuild CommonJS wrapper definition, found {len(cjs)}")
    esm = ESM_RE.findall(src)
    if len(esm) > 1:
        raise BuildError(f"expected at most one esbuild ES-module wrapper definition, found {len(esm)}")
    return cjs[0][0], esm[0][0] if esm else None


class Modules:
    """Where each module definition (`X=wrapper(`) starts; esbuild lays them out flat, one after the other."""

    def __init__(self, src: str, wrappers: tuple[str, ...]) -> None:
        self.src = src
        defs = re.finditer(r"(?<![\w$.])(" + IDENT + r")=(?:" + "|".join(map(re.escape, wrappers)) + r")\(", src)
        self.starts: dict[str, int] = {}
        for m in defs:
            if m.group(1) in self.starts:
                raise BuildError(f"module {m.group(1)} is defined twice")
            self.starts[m.group(1)] = m.start()
        self.order = sorted(self.starts.values())

    def body(self, name: str) -> str:
        """The text of module `name`'s definition, up to the next module definition."""
        if name not in self.starts:
            raise BuildError(f"module {name} has no definition")
        p = self.starts[name]
        k = bisect.bisect_right(self.order, p)
        return self.src[p:self.order[k] if k < len(self.order) else len(self.src)]

    def identify(self, name: str, depth: int = 4) -> tuple[str, str]:
        """What the register-list entry `name()` evaluates to: the (moduleType, name) of the module it exports,
        following `module.exports=Y()` and `var v=Y();...;module.exports=v` re-exports."""
        body = self.body(name)
        found = set(TRACE_RE.findall(body))
        if len(found) == 1:
            return found.pop()
        if found or depth == 0:
            raise BuildError(f"register entry {name}() is not one plotly module ({sorted(found) or 'none found'})")
        m = re.search(r"\.exports=(" + IDENT + r")\(\)\}", body)
        if m is None:
            m = re.search(r"var (" + IDENT + r")=(" + IDENT + r")\(\);.*\.exports=\1\}", body, re.S)
            target = m.group(2) if m else None
        else:
            target = m.group(1)
        if target is None:
            raise BuildError(f"register entry {name}() re-exports nothing this script can follow")
        return self.identify(target, depth - 1)


def partial_source(src: str, traces: tuple[str, ...]) -> tuple[str, str, list[str]]:
    """The full bundle with its register list cut to `traces` and its wrapper calls marked pure; returns
    (source, plotly.js version, the trace types dropped)."""
    header = HEADER_RE.match(src)
    if header is None:
        raise BuildError("the bundle does not start with plotly.js's header comment")
    cjs, esm = helper_names(src)
    wrappers = (cjs,) if esm is None else (cjs, esm)
    lists = list(re.finditer(r"(" + IDENT + r")\.register\(\[((?:" + IDENT + r"\(\),)*" + IDENT + r"\(\))\]\)", src))
    if len(lists) != 1:
        raise BuildError(f"expected one `Registry.register([a(),b(),...])` entry list, found {len(lists)}")
    entries = re.findall(r"(" + IDENT + r")\(\)", lists[0].group(2))
    modules = Modules(src, wrappers)
    kinds = {e: modules.identify(e) for e in entries}
    keep = [e for e in entries if kinds[e][0] == "trace" and kinds[e][1] in traces]
    missing = set(traces) - set(CORE_TRACES) - {kinds[e][1] for e in keep}
    if missing:
        raise BuildError(f"trace types not in the bundle's register list: {', '.join(sorted(missing))}")
    dropped = [kinds[e][1] for e in entries if e not in keep]
    reg = lists[0]
    out = src[:reg.start(2)] + ",".join(e + "()" for e in keep) + src[reg.end(2):]
    # Mark every `X=wrapper(` pure: an unused module then goes with the variable that holds it.
    pure = re.compile(r"(?<![\w$.])(" + IDENT + r")=(" + "|".join(map(re.escape, wrappers)) + r")\(")
    out, n = pure.subn(r"\1=/*@__PURE__*/\2(", out)
    calls = len(re.findall(r"(?<![\w$.])(?:" + "|".join(map(re.escape, wrappers)) + r")\(", src))
    if n != calls or n != len(modules.starts):
        raise BuildError(f"{calls} wrapper calls but {n} module definitions: an unknown shape")
    return out, header.group(1), dropped


def terser(source: str, compress: str = TERSER_COMPRESS, mangle: bool = False) -> str:
    """Run Debian's terser on `source` (a subprocess; it needs NODE_PATH to find its own modules)."""
    exe = shutil.which("terser")
    if exe is None:
        raise BuildError("terser is not installed (apt-get install -y terser)")
    env = dict(os.environ)
    env["NODE_PATH"] = os.pathsep.join(p for p in (env.get("NODE_PATH"), "/usr/share/nodejs") if p)
    with tempfile.TemporaryDirectory(prefix="specscope-plotly-") as d:
        inp, out = os.path.join(d, "in.js"), os.path.join(d, "out.js")
        with open(inp, "w", encoding="utf-8") as f:
            f.write(source)
        cmd = [exe, inp, "--compress", compress, "--comments", "some", "-o", out]
        if mangle:
            cmd.insert(2, "--mangle")
        proc = subprocess.run(cmd, env=env, capture_output=True, text=True)
        if proc.returncode != 0:
            raise BuildError(f"terser failed ({proc.returncode}): {proc.stderr.strip()[-500:]}")
        with open(out, encoding="utf-8") as f:
            return f.read()


def build(src: str, traces: tuple[str, ...], minify: bool = True, mangle: bool = False) -> tuple[str, str]:
    """The partial bundle's text and its plotly.js version."""
    source, ver, dropped = partial_source(src, traces)
    text = terser(source, mangle=mangle) if minify else source
    header = HEADER_RE.match(src).group(0)  # type: ignore[union-attr]
    text = HEADER_RE.sub("", text)  # terser drops the header (not a /*! comment); step 1 alone keeps it
    note = (f"/* A partial bundle for specscope's dashboard: only the trace types {', '.join(sorted(traces))} "
            f"(dropped from its register list: {', '.join(dropped)}), built from plotly.js v{ver}'s plotly.min.js "
            f"(sha256 {hashlib.sha256(src.encode()).hexdigest()[:16]}) by scripts/build_plotly_partial.py. */\n")
    text = header + note + text.lstrip("\n")
    got = {n for t, n in TRACE_RE.findall(text) if t == "trace"}
    if minify and got != set(traces):  # unminified, the dropped traces' code is still there (it never runs)
        raise BuildError(f"the built bundle registers {sorted(got)}, not {sorted(traces)}")
    return text, ver


def main(argv: list[str] | None = None) -> int:
    """CLI entry point."""
    scripts = _scripts_module()
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--source", help="the full plotly.min.js (default: the installed plotly package's)")
    ap.add_argument("--out-dir", default=scripts.STATIC, help="where the bundle is written (default: %(default)s)")  # type: ignore[attr-defined]
    ap.add_argument("--no-minify", action="store_true",
                    help="only cut the register list (step 1, no terser: the other traces' code stays, unrun)")
    ap.add_argument("--mangle", action="store_true", help="let terser rename local variables too")
    args = ap.parse_args(argv)
    traces = tuple(scripts.PARTIAL_TRACES)  # type: ignore[attr-defined]
    try:
        path = args.source or installed_bundle()
        with open(path, encoding="utf-8") as f:
            src = f.read()
        t = time.perf_counter()
        text, ver = build(src, traces, minify=not args.no_minify, mangle=args.mangle)
    except (OSError, BuildError) as e:
        print(f"build_plotly_partial: error: {e}", file=sys.stderr)
        return 2
    name = scripts.partial_name(ver)  # type: ignore[attr-defined]
    if args.no_minify:
        name = name.replace(".min.js", ".unminified.js")
    os.makedirs(args.out_dir, exist_ok=True)
    out = os.path.join(args.out_dir, name)
    data = text.encode()
    with open(out, "wb") as f:
        f.write(data)
    full = src.encode()
    print(f"plotly.js v{ver}: {len(full):,} bytes ({len(gzip.compress(full, 6, mtime=0)):,} gzipped) -> {out}: "
          f"{len(data):,} bytes ({len(gzip.compress(data, 6, mtime=0)):,} gzipped), traces {', '.join(traces)}, "
          f"in {time.perf_counter() - t:.1f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
