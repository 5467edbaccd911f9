"""`specscope sglang-audit` on every SGLang release wheel 0.5.12 ... 0.5.23, through the real CLI.

The wheels come from `.ci/sglang-wheels.sh` (into `.sglang-wheels/`, or $SPECSCOPE_SGLANG_WHEELS). Where they are
expected (CI is set, or the wheel folder exists) a missing one fails the test; elsewhere its tests are skipped.
0.5.13 and 0.5.23 are checked against counts measured by reading their source; every release is checked for a
self-consistent audit, so a new release that changes the answer is seen here.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest
from specscope.ui.cli import main as cli_main

REPO = Path(__file__).resolve().parents[2]
# Keep in step with VERSIONS in .ci/sglang-wheels.sh (test_release_list_matches_the_download_script).
RELEASES = ("0.5.12", "0.5.13", "0.5.14", "0.5.15", "0.5.16", "0.5.17", "0.5.18", "0.5.19", "0.5.20", "0.5.21",
            "0.5.22", "0.5.23")
WHEELS = Path(os.environ.get("SPECSCOPE_SGLANG_WHEELS") or REPO / ".sglang-wheels")
EXPECT_WHEELS = bool(os.environ.get("CI")) or WHEELS.is_dir()

# (classes, define, inherit non-raising, raise) measured on the wheels' source.
COUNTS = {"0.5.13": (35, 5, 0, 30), "0.5.23": (53, 13, 15, 25)}
HOPPER = ["--prefill-attention-backend", "fa3", "--decode-attention-backend", "trtllm_mha"]
# The first release whose HybridAttnBackend forwards the hook to its TARGET_VERIFY child.
FORWARDING_FROM = (0, 5, 17)


def _key(version: str) -> tuple[int, ...]:
    return tuple(int(x) for x in version.split("."))


def wheel(version: str) -> Path:
    """The release's wheel, or fail (wheels expected) / skip (a checkout without them)."""
    hits = sorted(WHEELS.glob(f"sglang-{version}-*.whl")) if WHEELS.is_dir() else []
    if hits:
        return hits[0]
    msg = f"no wheel of sglang {version} in {WHEELS}: run .ci/sglang-wheels.sh"
    if EXPECT_WHEELS:
        pytest.fail(msg)
    pytest.skip(msg)


def audit(capsys: pytest.CaptureFixture[str], version: str, *args: str) -> tuple[int, dict]:
    """Run `specscope sglang-audit --sglang WHEEL --json ARGS` in-process; (exit status, JSON)."""
    rc = cli_main(["sglang-audit", "--sglang", str(wheel(version)), "--json", *args])
    out, err = capsys.readouterr()
    assert err == "", err
    return rc, json.loads(out)


def test_release_list_matches_the_download_script() -> None:
    script = (REPO / ".ci" / "sglang-wheels.sh").read_text(encoding="utf-8")
    m = re.search(r"^VERSIONS=\(([^)]*)\)", script, re.M)
    assert m, "VERSIONS=(...) not found in .ci/sglang-wheels.sh"
    assert tuple(m.group(1).split()) == RELEASES


@pytest.mark.parametrize("version", RELEASES)
def test_every_release_is_audited_consistently(capsys: pytest.CaptureFixture[str], version: str) -> None:
    rc, d = audit(capsys, version)
    assert rc == 0  # no configuration asked: a report only
    assert d["sglang"]["version"] == version
    c = d["counts"]
    assert c["define"] + c["inherit"] + c["raise"] == c["classes"] == len(d["classes"]) > 0
    assert c["forward"] == sum(row["forwards"] for row in d["classes"])
    for row in d["classes"]:
        assert row["status"] in ("define", "inherit", "raise"), row
        # A class that inherits got it from another class; a class that defines it is its owner.
        assert (row["from"] == row["class"]) == (row["status"] == "define") or row["kind"] == "raises", row
    # The base's default raises in every release: there is no non-raising default to fall back on.
    assert d["base"]["what"] == "raise NotImplementedError"
    assert {"trtllm_mha", "fa3", "flashinfer", "triton"} <= {r["name"] for r in d["registry"]}
    assert d["call_sites"], "no worker calls the fix-up hook"
    assert d["plan_stream_variable"]["declared"] == "EnvBool(False)"
    assert d["unparsed"] == []


@pytest.mark.parametrize("version", sorted(COUNTS))
def test_counts_measured_on_the_source(capsys: pytest.CaptureFixture[str], version: str) -> None:
    _, d = audit(capsys, version)
    c = d["counts"]
    assert (c["classes"], c["define"], c["inherit"], c["raise"]) == COUNTS[version]
    by_name = {r["class"]: r for r in d["classes"]}
    assert by_name["TRTLLMHAAttnBackend"]["status"] == "define"
    assert by_name["FlashAttentionBackend"]["status"] == "raise"
    if version == "0.5.23":
        assert by_name["HybridAttnBackend"]["forwards"] and by_name["HybridLinearAttnBackend"]["forwards"]
        assert by_name["ShortConvHybridAttnBackend"]["status"] == "inherit"
        assert c["forward"] == 6
        names = {r["name"]: r for r in d["registry"]}
        raising = {n for n, r in names.items() if r["classes"] and all(x["status"] == "raise" for x in r["classes"])}
        assert {"flashinfer", "fa3", "flashmla", "torch_native", "flex_attention", "wave", "intel_amx"} <= raising
        assert not {"trtllm_mha", "trtllm_mla", "cutedsl_mla", "triton", "aiter", "dsa", "ascend"} & raising


@pytest.mark.parametrize("version", RELEASES)
def test_hopper_recipe_with_the_plan_stream(capsys: pytest.CaptureFixture[str], version: str) -> None:
    rc, d = audit(capsys, version, "--plan-stream", "--speculative-algorithm", "EAGLE", *HOPPER)
    v = d["verdict"]
    assert rc == v["exit"] == 1, v["headline"]  # the fa3 prefill backend has no hook in any release
    assert v["target"].startswith("HybridAttnBackend")
    raising = [" → ".join(p["steps"]) for p in v["paths"] if p["raises"]]
    if _key(version) >= FORWARDING_FROM:  # forwarded to the prefill child (the default mode), fa3
        assert any("FlashAttentionBackend" in p and "--speculative-attention-mode prefill" in p for p in raising)
    else:  # the wrapper itself resolves to the raising base
        assert raising == [p for p in raising if p.startswith("HybridAttnBackend: AttentionBackend's")], raising

    rc, d = audit(capsys, version, "--plan-stream", "--speculative-algorithm", "EAGLE", *HOPPER,
                  "--speculative-attention-mode", "decode")
    v = d["verdict"]
    if _key(version) >= FORWARDING_FROM:  # forwarded to the decode child, TRTLLM MHA's no-op
        assert rc == 0, v["headline"]
        assert all("TRTLLMHAAttnBackend" in p["steps"][-1] and p["raises"] is False for p in v["paths"])
    else:  # HybridAttnBackend has no hook of its own: the base raises whatever the mode
        assert rc == 1, v["headline"]

    rc, d = audit(capsys, version, "--no-plan-stream", "--speculative-algorithm", "EAGLE", *HOPPER)
    assert rc == 0 and d["verdict"]["raises_with_plan_stream"] is True


@pytest.mark.parametrize("version", ["0.5.12", "0.5.13", "0.5.23"])
def test_trtllm_mha_alone(capsys: pytest.CaptureFixture[str], version: str) -> None:
    rc, d = audit(capsys, version, "--plan-stream", "--attention-backend", "trtllm_mha")
    # 0.5.12's TRTLLMHAAttnBackend predates its no-op hook.
    assert rc == (1 if version == "0.5.12" else 0), d["verdict"]["headline"]


def test_workers_that_never_call_the_hook_are_safe(capsys: pytest.CaptureFixture[str]) -> None:
    rc, d = audit(capsys, "0.5.23", "--plan-stream", "--attention-backend", "fa3", "--speculative-algorithm", "NGRAM")
    assert rc == 0 and "no worker" in d["verdict"]["headline"]
    rc, _ = audit(capsys, "0.5.23", "--plan-stream", "--attention-backend", "fa3", "--speculative-algorithm", "NEXTN")
    assert rc == 1  # an alias of EAGLE
    rc, _ = audit(capsys, "0.5.12", "--plan-stream", "--attention-backend", "fa3", "--disable-overlap-schedule")
    assert rc == 0  # 0.5.12 without overlap scheduling runs the v1 worker, which has no plan stream


def test_a_launch_command_after_dashes(capsys: pytest.CaptureFixture[str]) -> None:
    cmd = ["SGLANG_ENABLE_OVERLAP_PLAN_STREAM=1", "python", "-m", "sglang.launch_server", "--model-path", "m",
           "--speculative-algorithm", "EAGLE", "--page-size", "16", *HOPPER, "--port", "30000"]
    rc, d = audit(capsys, "0.5.23", "--", *cmd)
    assert rc == 1 and d["verdict"]["plan_stream"] is True
    rc, _ = audit(capsys, "0.5.23", "--", *cmd[:-2], "--speculative-attention-mode=decode")
    assert rc == 0


def _doc_launch_commands() -> list[list[str]]:
    text = (REPO / "docs" / "sglang.md").read_text(encoding="utf-8")
    out = []
    for block in re.findall(r"```bash\n(.*?)```", text, re.S):
        joined = block.replace("\\\n", " ")
        for line in joined.splitlines():
            tokens = shlex.split(line, comments=True)
            cmd = [t for t in tokens if not re.match(r"^[A-Z_][A-Z0-9_]*=", t)]
            if cmd[:3] == ["python", "-m", "sglang.launch_server"]:  # a server's launch, not an audit of one
                out.append(tokens)
    return out


def test_the_docs_recipes_pass_the_audit(capsys: pytest.CaptureFixture[str]) -> None:
    # docs/sglang.md records sglang 0.5.13 servers: each of its launch commands, as written, must not raise.
    cmds = _doc_launch_commands()
    assert len(cmds) >= 3, cmds
    assert any("SGLANG_ENABLE_OVERLAP_PLAN_STREAM=1" in c for c in cmds), "no plan-stream recipe in the docs"
    for cmd in cmds:
        rc, d = audit(capsys, "0.5.13", "--", *cmd)
        assert rc == 0, (" ".join(cmd), d["verdict"]["headline"])


def test_a_folder_reads_like_its_wheel(capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    # .ci/run installs 0.5.12 with `pip --target` (a site-packages-like folder); the tests of the integration use it.
    folder = Path(os.environ.get("SPECSCOPE_SGLANG_0_5_12") or REPO / ".sglang-0.5.12")
    _, from_wheel = audit(capsys, "0.5.12")
    if not (folder / "sglang").is_dir():
        pytest.skip(f"{folder}: no sglang 0.5.12 folder")
    assert cli_main(["sglang-audit", "--sglang", str(folder), "--json"]) == 0
    from_folder = json.loads(capsys.readouterr().out)
    assert from_folder["sglang"]["version"] == "0.5.12"
    assert from_folder["counts"] == from_wheel["counts"]
    assert [r["class"] for r in from_folder["classes"]] == [r["class"] for r in from_wheel["classes"]]
    # --version X finds the cached wheel.
    from specscope.integrations.sglang_audit_source import find_wheel

    monkeypatch.setenv("SPECSCOPE_SGLANG_WHEELS", str(WHEELS))
    assert find_wheel("0.5.12") == wheel("0.5.12")


def test_the_real_cli_exits_1_when_the_verify_would_raise() -> None:
    w = wheel("0.5.23")
    p = subprocess.run([sys.executable, "-m", "specscope.ui.cli", "sglang-audit", "--sglang", str(w), "-q",
                        "--plan-stream", *HOPPER], capture_output=True, text=True, timeout=300,
                       env={**os.environ, "SGLANG_ENABLE_OVERLAP_PLAN_STREAM": "0"})
    assert p.returncode == 1, p.stderr
    assert "53 subclasses: 13 define it, 15 inherit a non-raising one, 25 resolve to a raising one" in p.stdout
    assert "verdict: RAISES NotImplementedError" in p.stdout
    assert "torch" not in p.stderr


def _one_line_error(args: list[str]) -> str:
    p = subprocess.run([sys.executable, "-m", "specscope.ui.cli", "sglang-audit", *args], capture_output=True,
                       text=True, timeout=120)
    assert p.returncode == 2, (p.stdout, p.stderr)
    lines = p.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("specscope: error: "), p.stderr
    assert "Traceback" not in p.stderr and p.stdout == ""
    return lines[0]


def test_unreadable_input_is_one_line_and_exit_2(tmp_path: Path) -> None:
    assert "no such file or directory" in _one_line_error(["--sglang", str(tmp_path / "missing")])
    assert "not an SGLang package" in _one_line_error(["--sglang", str(tmp_path)])
    (tmp_path / "notes.txt").write_text("hello", encoding="utf-8")
    assert "not a wheel" in _one_line_error(["--sglang", str(tmp_path / "notes.txt")])
    pkg = tmp_path / "site" / "sglang"
    pkg.mkdir(parents=True)
    (pkg / "__init__.py").write_text("x = 1\n", encoding="utf-8")
    assert "AttentionBackend" in _one_line_error(["--sglang", str(tmp_path / "site")])
    broken = tmp_path / "sglang-0.0.0-py3-none-any.whl"
    broken.write_bytes(b"PK\x03\x04 not really a zip")
    _one_line_error(["--sglang", str(broken)])


def test_a_configuration_that_cannot_be_judged_is_exit_2(capsys: pytest.CaptureFixture[str]) -> None:
    w = str(wheel("0.5.23"))
    for args, says in ((["--attention-backend", "fa9"], "not a registered attention backend"),
                       (["--speculative-algorithm", "EAGLE"], "name the attention backend"),
                       (["--attention-backend", "fa3", "--speculative-algorithm", "MAGIC"], "not an algorithm")):
        assert cli_main(["sglang-audit", "--sglang", w, *args]) == 2
        out, err = capsys.readouterr()
        assert out == "" and len(err.splitlines()) == 1 and err.startswith("specscope: error: ") and says in err
