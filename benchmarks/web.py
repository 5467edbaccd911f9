"""Dashboard benchmark: time to the first rendered timeline and to a step page, in headless chromium, on a 100k-step
trace written through TraceWriter (benchmarks/trace_store.py's Workload: bs=64, ~4k-token contexts).

Measured from the browser's side: `page.goto` until the page's figures are drawn (their `.main-svg` exists and
Dash has no callback in flight), in a fresh browser context each time (so every load fetches the scripts again);
the first load of a run is reported apart (cold caches in the server and the OS). The server loads the step
summaries in the background: a first timeline opened the moment the server starts is timed until it is drawn
(from the summaries loaded so far) and until it has redrawn itself complete; the timed loads after it start once
the summaries are in. A step page is measured both as a fresh load of `/step/N` and as the in-page move to the
next step (the → key), which is what stepping costs; that move and a range change are timed inside the page, from
the key event's timestamp to the frame after the new state is drawn (Playwright's own waits add a protocol round
trip each, reported beside). `--ab full,partial` (the default) also times fresh timeline
loads of the same trace served with each plotly.js bundle (the plotly package's full one, the fallback, and our
partial one), alternating in the same run, so a busy machine weighs on each alike.

    python benchmarks/web.py --steps 100000 --out benchmarks/results/web.json --md benchmarks/results/web.md
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shlex
import sqlite3
import statistics
import sys
import tempfile
import time
from importlib.metadata import version

from trace_store import Workload, run_info  # noqa: E402

TARGETS = {"timeline_s": 2.0, "page_s": 2.0, "step_s": 0.15, "range_s": 0.3}  # DESIGN §7
CHROMIUM = "/usr/bin/chromium"
DONE_JS = "() => !document.querySelector('[data-dash-is-loading=\"true\"]')"
# For the breakdown load (not timed with the others): long tasks, and when plotly.js, the page and its figures
# appeared (polled once a frame; a frame does not run while a long task holds the main thread).
MARKS_JS = r"""
window.__lt = []; window.__m = {};
new PerformanceObserver(l => { for (const e of l.getEntries()) window.__lt.push([e.startTime, e.duration]); })
  .observe({type: 'longtask', buffered: true});
(function poll() {
  const m = window.__m, now = performance.now();
  if (!m.plotly && window.Plotly && window.Plotly.newPlot) m.plotly = now;
  if (!m.page && document.querySelector('#page > *')) m.page = now;
  if (!m.svg && document.querySelectorAll('#page .main-svg').length >= 3) m.svg = now;
  if (!m.svg) requestAnimationFrame(poll);
})();
"""
BREAKDOWN_JS = """() => {
  const res = performance.getEntriesByType('resource'), nav = performance.getEntriesByType('navigation')[0];
  const last = (f) => Math.max(0, ...res.filter(f).map(e => e.responseEnd));
  const layout = res.find(e => e.name.includes('_dash-layout'));
  return {html_ms: nav.responseEnd, scripts_ms: last(e => e.name.includes('.js')),
          dom_content_loaded_ms: nav.domContentLoadedEventEnd, layout_request_ms: layout ? layout.startTime : null,
          layout_response_ms: layout ? layout.responseEnd : null, page_rendered_ms: window.__m.page,
          plotly_ready_ms: window.__m.plotly, drawn_ms: window.__m.svg, long_tasks: window.__lt,
          script_transfer_bytes: res.filter(e => e.name.includes('.js')).reduce((a, e) => a + e.transferSize, 0)};
}"""


def write_trace(path: str, steps: int, seed: int) -> float:
    """Write `steps` synthetic steps; returns the seconds it took."""
    from specscope.tracer.store import TraceWriter

    t = time.perf_counter()
    gen = Workload(seed=seed).steps()
    w = TraceWriter(path, run_info(argparse.Namespace()))
    for _ in range(steps):
        w.write_step(next(gen))
    w.close()
    return time.perf_counter() - t


# In-page timing of an interaction, on the page's own clock: from the real key event's timestamp to the animation
# frame after the page shows the new state (its text, every named figure drawn by plotly.js, no Dash callback in
# flight). Playwright's own waits poll the page over its protocol, one round trip each, and add ~50-90 ms of their
# own on this machine; both numbers are reported, the in-page one is the target's.
ARM_JS = """() => {
  if (!window.__armed) {
    window.__armed = true;
    document.addEventListener('keydown', e => { window.__key_ts = e.timeStamp; }, true);
  }
  window.__key_ts = null;
  for (const gd of document.querySelectorAll('.js-plotly-plot')) {
    gd.__old = true; gd.__drawn = false;
    if (!gd.__hooked) { gd.__hooked = true; gd.on('plotly_afterplot', () => { gd.__drawn = true; }); }
  }
}"""
SHOWN_JS = """([sel, want, ids]) => new Promise(res => {
  const drawn = id => {
    const gd = document.querySelector('#' + id + ' .js-plotly-plot');
    // A figure replaced in place fires plotly_afterplot on its old element; a remounted one is drawn once its
    // traces are in the new element.
    return gd && (gd.__old ? gd.__drawn : !!gd.querySelector('g.trace, g.hm image'));
  };
  const poll = () => {
    const el = document.querySelector(sel);
    if (window.__key_ts !== null && el && el.innerText.includes(want) && ids.every(drawn)
        && !document.querySelector('[data-dash-is-loading="true"]')) {
      requestAnimationFrame(() => res(performance.now() - window.__key_ts));
    } else {
      requestAnimationFrame(poll);
    }
  };
  poll();
})"""


def _timed_key(page: object, key: str, focus: str | None, sel: str, want: str, ids: list[str]) -> tuple[float, float]:
    """(in-page seconds, Playwright round-trip seconds) of pressing `key` (in the field `focus`, or on the page)
    until `want` shows in `sel` and the figures `ids` are drawn."""
    page.evaluate(ARM_JS)  # type: ignore[attr-defined]
    t = time.perf_counter()
    if focus is None:
        page.keyboard.press(key)  # type: ignore[attr-defined]
    else:
        page.press(focus, key)  # type: ignore[attr-defined]
    in_page_ms = page.evaluate(SHOWN_JS, [sel, want, ids])  # type: ignore[attr-defined]
    outside = time.perf_counter() - t
    return in_page_ms / 1000, outside


def _wait_graphs(page: object, ids: list[str]) -> None:
    for g in ids:
        page.wait_for_selector(f"#{g} .main-svg", state="attached", timeout=60_000)  # type: ignore[attr-defined]
    page.wait_for_function(DONE_JS, timeout=60_000)  # type: ignore[attr-defined]


def _load(browser: object, url: str, ids: list[str]) -> tuple[float, object, object]:
    ctx = browser.new_context(viewport={"width": 1400, "height": 1000})  # type: ignore[attr-defined]
    page = ctx.new_page()
    t = time.perf_counter()
    page.goto(url)
    _wait_graphs(page, ids)
    return time.perf_counter() - t, ctx, page


def _breakdown(browser: object, url: str) -> dict:
    """Where one more fresh timeline load spends its time (ms from navigation start, from the browser's own
    timings): scripts, layout request, plotly.js ready, figures drawn, and the main thread's long tasks."""
    ctx = browser.new_context(viewport={"width": 1400, "height": 1000})  # type: ignore[attr-defined]
    page = ctx.new_page()
    page.add_init_script(MARKS_JS)
    t = time.perf_counter()
    page.goto(url + "/")
    _wait_graphs(page, ["tl-overview", "tl-gantt", "tl-overlap"])
    wall = time.perf_counter() - t
    b = page.evaluate(BREAKDOWN_JS)
    ctx.close()
    tasks = [(round(s), round(d)) for s, d in b.pop("long_tasks")]
    out = {k: (round(v) if isinstance(v, float) else v) for k, v in b.items()}
    ready = out.get("plotly_ready_ms") or 0
    # The long task that ends where plotly.js became ready is its execution; the ones after it draw the figures.
    before = [t for t in tasks if t[0] + t[1] <= ready + 20]
    out.update(wall_s=round(wall, 3), long_tasks=tasks, main_thread_long_task_ms=sum(d for _, d in tasks),
               plotly_exec_ms=max((d for _, d in before[-1:]), default=None),
               draw_ms=(out["drawn_ms"] - ready) if out.get("drawn_ms") and ready else None)
    return out


def bench(args: argparse.Namespace) -> dict:
    """Run the benchmark; returns the results dict."""
    from playwright.sync_api import sync_playwright
    from specscope.ui.web import dashboard
    from specscope.ui.web.app import create_app
    from specscope.ui.web.server import serve_in_thread

    workdir = tempfile.mkdtemp(prefix="specscope-web-bench-")
    path = args.trace or os.path.join(workdir, "bench.db")
    write_s = None
    if not args.trace:
        write_s = write_trace(path, args.steps, args.seed)
    load0 = os.getloadavg()[0]
    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox"])
        warm = browser.new_context()  # chromium's own start-up is not the dashboard's
        warm.new_page().goto("about:blank")
        warm.close()
        t = time.perf_counter()
        app = create_app(path)
        startup_s = time.perf_counter() - t
        src = dashboard.of(app).sources["a"]  # type: ignore[arg-type]
        n = src.num_steps()
        srv, url = serve_in_thread(app)
        try:
            return _measure(args, browser, app, src, srv, url, n, t, startup_s, load0, write_s)
        finally:
            srv.shutdown()
            src.close()
            browser.close()
            if not args.trace and not args.keep:
                for suffix in ("", "-wal", "-shm"):
                    if os.path.exists(path + suffix):
                        os.remove(path + suffix)
                os.rmdir(workdir)


def _measure(args: argparse.Namespace, browser: object, app: object, src: object, srv: object, url: str, n: int,
             t_start: float, startup_s: float, load0: float, write_s: float | None) -> dict:
    from specscope.ui.web import dashboard
    from specscope.ui.web.app import create_app
    from specscope.ui.web.server import serve_in_thread

    timeline, step_load, step_next, step_next_rt, payload = [], [], [], [], {}
    bundle = dashboard.of(app).plotly
    payload["plotly_js"] = {"url": bundle.url, "partial": bundle.partial, "bytes": os.path.getsize(bundle.path)}
    graphs = ["tl-overview", "tl-gantt", "tl-overlap"]
    # The very first timeline, opened while the server is still loading summaries.
    ctx = browser.new_context(viewport={"width": 1400, "height": 1000})  # type: ignore[attr-defined]
    page = ctx.new_page()
    t = time.perf_counter()
    page.goto(url + "/")
    _wait_graphs(page, graphs)
    cold_drawn = time.perf_counter() - t
    partial = page.locator("#loading-a").count() > 0
    page.wait_for_function("() => !document.querySelector('#loading-a') && document.querySelector('#timeline-page')",
                           timeout=600_000)
    _wait_graphs(page, graphs)
    cold_complete = time.perf_counter() - t
    ctx.close()
    src.wait_loaded()  # type: ignore[attr-defined]
    loaded_s = time.perf_counter() - t_start
    payload.update(cold_timeline_drawn_s=round(cold_drawn, 3), cold_timeline_partial=partial,
                   cold_timeline_complete_s=round(cold_complete, 3), summaries_loaded_s=round(loaded_s, 3))
    sizes: list[int] = []
    scripts: list[int] = []
    layout: list[int] = []
    for k in range(args.repeats + 1):
        ctx = browser.new_context(viewport={"width": 1400, "height": 1000})
        page = ctx.new_page()
        if k == 1:
            page.on("response", lambda r: sizes.append(len(r.body())) if "_dash-update-component" in r.url
                    else layout.append(len(r.body())) if "_dash-layout" in r.url
                    else scripts.append(len(r.body())) if r.url.endswith(".js") else None)
        t = time.perf_counter()
        page.goto(url + "/")
        _wait_graphs(page, ["tl-overview", "tl-gantt", "tl-overlap"])
        timeline.append(time.perf_counter() - t)
        ctx.close()
    payload["timeline_breakdown"] = _breakdown(browser, url)
    # A returning visitor: the same browser context loads the timeline again (scripts from its HTTP cache, as for
    # anyone who opened the dashboard before; Dash fingerprints its script URLs, plotly.js revalidates by ETag).
    ctx = browser.new_context(viewport={"width": 1400, "height": 1000})  # type: ignore[attr-defined]
    page = ctx.new_page()
    warm = []
    for k in range(args.repeats + 1):
        t = time.perf_counter()
        page.goto(url + "/")
        _wait_graphs(page, graphs)
        if k:
            warm.append(time.perf_counter() - t)
    ctx.close()
    payload["timeline_cached_scripts"] = {"median_s": round(statistics.median(warm), 3), "max_s": round(max(warm), 3),
                                          "n": len(warm)}
    payload["timeline_callback_bytes"] = sum(sizes)
    payload["timeline_callbacks"] = len(sizes)
    payload["timeline_layout_bytes"] = sum(layout)
    payload["script_bytes"] = sum(scripts)
    if args.baseline:
        # The same page on a small trace, in the same browser and moment: the machine's floor.
        small = create_app(args.baseline)
        ssrv, surl = serve_in_thread(small)
        base = []
        for _ in range(args.repeats + 1):
            dt, ctx, _page = _load(browser, surl + "/", ["tl-overview", "tl-gantt", "tl-overlap"])
            base.append(dt)
            ctx.close()  # type: ignore[attr-defined]
        ssrv.shutdown()
        payload["baseline_trace"] = os.path.relpath(args.baseline)
        payload["baseline_steps"] = dashboard.of(small).sources["a"].num_steps()  # type: ignore[attr-defined]
        payload["baseline_timeline_median_s"] = round(statistics.median(base[1:]), 3)
    if args.ab:
        payload["ab"] = _ab(args, browser, src.path)  # type: ignore[attr-defined]
    mid = n // 2
    for k in range(args.repeats + 1):
        i = (mid + 97 * k) % max(1, n - args.next_steps - 1)  # a small trace wraps round
        dt, ctx, page = _load(browser, f"{url}/step/{i}", ["step-heatmap"])
        step_load.append(dt)
        for j in range(args.next_steps):
            inside, outside = _timed_key(page, "ArrowRight", None, "#step-pos", f"step {i + j + 1} of {n}",
                                         ["step-heatmap"])
            step_next.append(inside)
            step_next_rt.append(outside)
        ctx.close()  # type: ignore[attr-defined]

    # Every other page's first content, each in a fresh context.
    pages_first: dict[str, list[float]] = {}
    for name, path, wait in (("acceptance", "/acceptance", ["acc-position", "acc-hist", "acc-time", "acc-bs",
                                                            "acc-request"]),
                             ("violations", "/violations", []), ("step", f"/step/{mid}", ["step-heatmap"])):
        for _ in range(args.repeats + 1):
            ctx = browser.new_context(viewport={"width": 1400, "height": 1000})  # type: ignore[attr-defined]
            page = ctx.new_page()
            t = time.perf_counter()
            page.goto(url + path)
            page.wait_for_selector("#page > div", timeout=60_000)
            _wait_graphs(page, wait)
            pages_first.setdefault(name, []).append(time.perf_counter() - t)
            ctx.close()
    # Range changes: a step range typed into the timeline's boxes and committed with Enter, until the window's
    # figures are drawn again (100-step windows across the run, then wide ones drawn per bin).
    range_change: list[float] = []
    range_wide: list[float] = []
    range_rt: list[float] = []
    ctx = browser.new_context(viewport={"width": 1400, "height": 1000})  # type: ignore[attr-defined]
    page = ctx.new_page()
    page.goto(url + "/")
    _wait_graphs(page, graphs)
    windows = [(lo, lo + 99) for lo in range(1000, n - 200, max(1, (n - 1200) // max(1, args.ranges)))][:args.ranges]
    wide = [(0, n - 1), (n // 4, n // 2), (n // 2, n // 2 + 5000)]
    for k, (lo, hi) in enumerate(windows + wide):
        page.fill("#tl-from", str(lo))
        page.fill("#tl-to", str(hi))
        inside, outside = _timed_key(page, "Enter", "#tl-to", "#tl-window-stats", f"steps {lo}–{hi}",
                                     ["tl-gantt", "tl-overlap"])
        (range_change if k < len(windows) else range_wide).append(inside)
        if k < len(windows):
            range_rt.append(outside)
    ctx.close()

    def stats(xs: list[float]) -> dict[str, float]:
        return {"median_s": round(statistics.median(xs), 3), "max_s": round(max(xs), 3), "n": len(xs)}

    res = {
        "steps": n,
        "write_s": None if write_s is None else round(write_s, 1),
        "server_startup_s": round(startup_s, 3),
        "timeline_first_load_s": round(timeline[0], 3),
        "timeline": stats(timeline[1:]),
        "step_page_first_load_s": round(step_load[0], 3),
        "step_page_load": stats(step_load[1:]),
        "step_next_key": stats(step_next),
        "step_next_key_round_trip": stats(step_next_rt),
        "first_content": {k: {**stats(v[1:]), "first_s": round(v[0], 3)} for k, v in pages_first.items()},
        "range_change": stats(range_change),
        "range_change_round_trip": stats(range_rt),
        "range_change_wide": stats(range_wide),
        **payload,
        "targets": TARGETS,
        "machine": {
            "cpu_cores": os.cpu_count(), "cpu": _cpu_model(), "platform": platform.platform(),
            "load_average_1min_at_start": round(load0, 2),
            "load_average_1min_at_end": round(os.getloadavg()[0], 2), "python": platform.python_version(),
            "sqlite": sqlite3.sqlite_version, "dash": version("dash"), "plotly": version("plotly"),
            "playwright": version("playwright"), "chromium": _chromium_version(),
        },  # fmt: skip
        "date": time.strftime("%Y-%m-%d %H:%M:%S %Z"),
        "command": "python benchmarks/web.py " + shlex.join(sys.argv[1:]),
    }
    res["pass"] = {
        "timeline_s": res["timeline"]["median_s"] <= TARGETS["timeline_s"],
        "step_s": res["step_next_key"]["median_s"] <= TARGETS["step_s"],
        "page_s": all(v["median_s"] <= TARGETS["page_s"] for v in res["first_content"].values()),
        "range_s": res["range_change"]["median_s"] <= TARGETS["range_s"],
    }
    return res


def _bundle(variant: str) -> object:
    from specscope.ui.web import scripts

    if variant not in ("full", "partial"):
        raise SystemExit(f"web.py: error: unknown --ab variant {variant!r} (full, partial)")
    b = scripts.full_bundle() if variant == "full" else scripts.choose_bundle()
    if variant == "partial" and not b.partial:
        raise SystemExit("web.py: error: no partial plotly.js bundle for the installed plotly (see the line above)")
    return b


def _ab(args: argparse.Namespace, browser: object, path: str) -> dict:
    """Same-run A/B of plotly.js variants: one server per variant on the same trace, fresh-context timeline loads
    alternating between them (the order rotated each round), so a busy machine weighs on every variant alike."""
    from specscope.ui.web import dashboard
    from specscope.ui.web.app import create_app
    from specscope.ui.web.server import serve_in_thread

    variants = args.ab.split(",")
    servers = []
    for v in variants:
        app = create_app(path, plotly=_bundle(v))
        dashboard.of(app).sources["a"].wait_loaded()  # type: ignore[attr-defined]
        servers.append(serve_in_thread(app))
    loads: dict[str, list[dict]] = {v: [] for v in variants}
    load0 = os.getloadavg()[0]
    try:
        for k in range(args.ab_repeats + 1):
            for j in range(len(variants)):
                i = (j + k) % len(variants)
                b = _breakdown(browser, servers[i][1])
                if k:  # the first round warms the servers' caches
                    loads[variants[i]].append(b)
    finally:
        for srv, _url in servers:
            srv.shutdown()  # type: ignore[attr-defined]

    def med(xs: list[dict], key: str) -> float | None:
        vals = [x[key] for x in xs if x.get(key) is not None]
        return round(statistics.median(vals), 3) if vals else None

    return {"variants": {v: {"timeline_median_s": med(xs, "wall_s"), "timeline_max_s": max(x["wall_s"] for x in xs),
                             "n": len(xs), "plotly_exec_ms": med(xs, "plotly_exec_ms"), "draw_ms": med(xs, "draw_ms"),
                             "plotly_ready_ms": med(xs, "plotly_ready_ms"),
                             "main_thread_long_task_ms": med(xs, "main_thread_long_task_ms"),
                             "script_transfer_bytes": xs[0]["script_transfer_bytes"],
                             "loads_s": [x["wall_s"] for x in xs]} for v, xs in loads.items()},
            "load_average_1min": [round(load0, 2), round(os.getloadavg()[0], 2)],
            "date": time.strftime("%Y-%m-%d %H:%M:%S %Z")}


def _ab_md(res: dict) -> str:
    ab = res.get("ab")
    if not ab:
        return ""
    rows = "\n".join(f"| {v} | {x['timeline_median_s']} s | {x['timeline_max_s']} s | {x['n']} | "
                     f"{x['plotly_ready_ms']} | {x['plotly_exec_ms']} | {x['draw_ms']} | "
                     f"{x['main_thread_long_task_ms']} |" for v, x in ab["variants"].items())
    return f"""
Same-run A/B of the plotly.js served (`--ab`; one server per variant on this trace, fresh-context timeline loads
alternating, {ab["date"]}, load {ab["load_average_1min"][0]} → {ab["load_average_1min"][1]}; medians; ms from navigation start):

| variant | first timeline | max | loads | plotly.js ready (ms) | its execution (ms) | draw (ms) | main-thread long tasks (ms) |
|---|---|---|---|---|---|---|---|
{rows}
"""  # noqa: E501


def _cpu_model() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def _chromium_version() -> str:
    import subprocess

    try:
        return subprocess.run([CHROMIUM, "--version"], capture_output=True, text=True, timeout=30).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return "unknown"


def markdown(res: dict, note: str) -> str:
    """A short report of a results dict."""
    m, t, ok = res["machine"], res["targets"], res["pass"]

    def mark(k: str) -> str:
        return "pass" if ok[k] else "**MISS**"

    tl, sl, sn = res["timeline"], res["step_page_load"], res["step_next_key"]
    return f"""# Dashboard benchmark

- Machine: {m["cpu_cores"]} CPU cores ({m["cpu"]}), {m["platform"]}; load average (1 min) at the start
  {m.get("load_average_1min_at_start", "?")}, at the end {m["load_average_1min_at_end"]}
- Python {m["python"]}, SQLite {m["sqlite"]}, Dash {m["dash"]}, Plotly {m["plotly"]}, Playwright {m["playwright"]},
  {m["chromium"]} (headless)
- Date: {res["date"]}
- Command: `{res["command"]}`
{note}
Trace: {res["steps"]:,} steps written through TraceWriter by benchmarks/trace_store.py's Workload (bs=64, ~4k-token
contexts, 64-token pages){"" if res["write_s"] is None else f", written in {res['write_s']} s"}. `create_app` (opening
the trace; the step summaries then load in a background thread) took {res["server_startup_s"]} s; the summaries
of all steps were in {res.get("summaries_loaded_s", "?")} s after the start. Served on 127.0.0.1; every load below
is a fresh browser context, timed from `page.goto` until every figure of the page is drawn and no Dash callback
is in flight. A step move and a range change are timed in the page, from the key event to the frame after the new
state is drawn (beside them, the same interaction as Playwright's waits see it).

| metric | result | target | |
|---|---|---|---|
| first rendered timeline | median {tl["median_s"]} s, max {tl["max_s"]} s ({tl["n"]} loads; the very first: {res["timeline_first_load_s"]} s) | <= {t["timeline_s"]} s | {mark("timeline_s")} |
| step page, next step (→ key), in the page | median {sn["median_s"]} s, max {sn["max_s"]} s ({sn["n"]} moves) | <= {t["step_s"]} s | {mark("step_s")} |
| step page, next step, Playwright round trip | median {res["step_next_key_round_trip"]["median_s"]} s, max {res["step_next_key_round_trip"]["max_s"]} s | | |
{_pages_md(res)}| range change (boxes + Enter), 100-step windows | median {res["range_change"]["median_s"]} s, max {res["range_change"]["max_s"]} s ({res["range_change"]["n"]} changes) | <= {t["range_s"]} s | {mark("range_s")} |
| range change, 100-step windows, Playwright round trip | median {res["range_change_round_trip"]["median_s"]} s, max {res["range_change_round_trip"]["max_s"]} s | | |
| range change, wide windows (5k–100k steps, drawn per bin) | median {res["range_change_wide"]["median_s"]} s, max {res["range_change_wide"]["max_s"]} s ({res["range_change_wide"]["n"]}) | <= {t["range_s"]} s | |
| step page, fresh load of `/step/N` | median {sl["median_s"]} s, max {sl["max_s"]} s ({sl["n"]} loads; the very first: {res["step_page_first_load_s"]} s) | (page load incl. scripts) | |
| timeline, second visit (scripts in the browser's cache) | median {res["timeline_cached_scripts"]["median_s"]} s, max {res["timeline_cached_scripts"]["max_s"]} s ({res["timeline_cached_scripts"]["n"]} loads) | | |
| timeline opened the moment the server starts | drawn in {res.get("cold_timeline_drawn_s", "?")} s{" from part of the summaries" if res.get("cold_timeline_partial") else ""}, complete in {res.get("cold_timeline_complete_s", "?")} s | | |

{_baseline(res)}A timeline load got its page in the layout ({res.get("timeline_layout_bytes", 0):,} bytes; the overview is binned
server-side: at most 1,000 bins per mode, never one point per step), made {res.get("timeline_callbacks", "?")} callback requests
({res.get("timeline_callback_bytes", 0):,} bytes), and fetched {res.get("script_bytes", 0):,} bytes of scripts ({_plotly_md(res)};
{res.get("timeline_breakdown", {}).get("script_transfer_bytes", 0):,} bytes on the wire).

{_breakdown_md(res)}{_ab_md(res)}"""  # noqa: E501


def _pages_md(res: dict) -> str:
    t = res["targets"]
    return "".join(f"| first content of `{k}` (fresh context) | median {v['median_s']} s, max {v['max_s']} s ({v['n']} "
                   f"loads; the very first: {v['first_s']} s) | <= {t['page_s']} s | "
                   f"{'pass' if v['median_s'] <= t['page_s'] else '**MISS**'} |\n"
                   for k, v in res.get("first_content", {}).items())


def _plotly_md(res: dict) -> str:
    p = res.get("plotly_js")
    if not p:
        return "plotly.js is 4.85 MB of them"
    kind = "the partial plotly.js bundle" if p["partial"] else "the full plotly.js bundle"
    return f"of them {kind} `{p['url']}`: {p['bytes']:,} bytes, served with the compile hint"


def _breakdown_md(res: dict) -> str:
    b = res.get("timeline_breakdown")
    if not b:
        return ""
    tasks = ", ".join(f"{d} @{s}" for s, d in b["long_tasks"])
    return f"""Where one more fresh timeline load (drawn in {b["wall_s"]} s from `page.goto`) spent its time, in ms from the
browser's navigation start: HTML in at {b["html_ms"]}, all scripts in at {b["scripts_ms"]}, DOMContentLoaded at
{b["dom_content_loaded_ms"]}; layout requested at {b["layout_request_ms"]} and in at {b["layout_response_ms"]}, the page rendered at
{b["page_rendered_ms"]}; plotly.js ready at {b["plotly_ready_ms"]} (its execution: a {b["plotly_exec_ms"]} ms task), the three figures
drawn at {b["drawn_ms"]} ({b["draw_ms"]} ms after plotly.js). Main-thread long tasks (ms @ start): {tasks}; {b["main_thread_long_task_ms"]} ms in all.
"""  # noqa: E501


def _baseline(res: dict) -> str:
    if "baseline_timeline_median_s" not in res:
        return ""
    return (f"Floor of this machine at that moment: the same timeline page of `{res['baseline_trace']}` "
            f"({res['baseline_steps']} steps) took a median {res['baseline_timeline_median_s']} s to draw.\n\n")


def main(argv: list[str] | None = None) -> int:
    """CLI entry point; exits 1 if a target is missed."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=100_000)
    ap.add_argument("--trace", help="use this existing trace instead of writing one")
    ap.add_argument("--keep", action="store_true", help="keep the generated trace")
    ap.add_argument("--repeats", type=int, default=5, help="timed loads after the first one")
    ap.add_argument("--next-steps", type=int, default=5, help="→ presses per step-page load")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--ranges", type=int, default=10, help="100-step range changes timed on the timeline")
    ap.add_argument("--baseline", default="samples/traces/h200-plan-stream.db",
                    help="a small trace whose timeline is timed too, as the machine's floor ('' to skip)")
    ap.add_argument("--ab", default="full,partial",
                    help="plotly.js bundles to compare in the same run (full, partial; comma-separated; '' to skip)")
    ap.add_argument("--ab-repeats", type=int, default=6, help="timed loads per A/B variant")
    ap.add_argument("--out", help="write the results JSON here")
    ap.add_argument("--md", help="write a short markdown report here")
    ap.add_argument("--note", default="", help="a line for the markdown report (e.g. machine load)")
    args = ap.parse_args(argv)
    res = bench(args)
    text = json.dumps(res, indent=2)
    print(text)
    if args.out:
        with open(args.out, "w") as f:
            f.write(text + "\n")
    if args.md:
        with open(args.md, "w") as f:
            f.write(markdown(res, f"- Note: {args.note}\n" if args.note else ""))
    return 0 if all(res["pass"].values()) else 1


if __name__ == "__main__":
    sys.exit(main())
