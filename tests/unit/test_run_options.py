"""Engine options are `EngineConfig` fields and `specscope run` flags: `--fused-ops`, `--draft-extend-graph`,
`--cpu-threads` are checked at parse time and by `validate`, reach the engine, and are recorded in the trace's run
config; a session records through the recorder its caller hands in."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from specscope.backend import ops_setting
from specscope.backend.config_error import ConfigError
from specscope.backend.engine_config import EngineConfig
from specscope.ui import cmd_run
from specscope.ui.cli import build_parser

NEW_FIELDS = ("fused_ops", "draft_extend_graph", "cpu_threads")
SMALL_RUN = dict(model="tiny", draft="tiny-draft", device="cpu", batch_size=2, num_requests=2, max_new_tokens=8,
                 spec_steps=3, prompt_len=(16, 32), seed=0)


def _args(*argv: str) -> Any:
    return build_parser().parse_args(["run", *argv])


def _cli(*argv: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "specscope.ui.cli", *argv], capture_output=True, text=True,
                          timeout=120)


@pytest.mark.parametrize(("argv", "said"), [
    (["--fused-ops", "bogus"], "--fused-ops must be one of auto, plain, fused-torch, flashinfer, got 'bogus'"),
    (["--cpu-threads", "0"], "--cpu-threads must be at least 1, got 0"),
])
def test_a_bad_flag_is_one_line_and_exit_2(argv: list[str], said: str) -> None:
    p = _cli("run", "--device", "cpu", "--no-trace", *argv)
    assert p.returncode == 2, p.stderr
    lines = p.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("specscope: error: ") and said in lines[0], p.stderr


def test_the_flags_become_config_fields() -> None:
    cfg = cmd_run.config_from_args(_args())
    assert (cfg.fused_ops, cfg.draft_extend_graph, cfg.cpu_threads) == ("auto", True, 1)
    cfg = cmd_run.config_from_args(_args("--fused-ops", "OFF", "--no-draft-extend-graph", "--cpu-threads", "3"))
    assert (cfg.fused_ops, cfg.draft_extend_graph, cfg.cpu_threads) == ("plain", False, 3)
    assert cmd_run.config_from_args(_args("--fused-ops", "fused-torch")).fused_ops == "fused-torch"


def test_the_cli_names_the_engines_op_sets() -> None:
    # cmd_run keeps its own copy (building the parser imports no engine module): the two must agree.
    assert cmd_run.FUSED_OPS == ops_setting.FUSED_OPS
    assert cmd_run.FUSED_OPS_ALIASES == ops_setting.FUSED_OPS_ALIASES


def test_flags_that_would_do_nothing_are_warned_about() -> None:
    assert any("--no-draft-extend-graph does nothing with --no-cuda-graph" in w
               for w in cmd_run.check_flags(_args("--no-draft-extend-graph", "--no-cuda-graph")))
    assert any("--no-draft-extend-graph does nothing with --spec-steps 0" in w
               for w in cmd_run.check_flags(_args("--no-draft-extend-graph", "--spec-steps", "0")))
    assert any("--cpu-threads" in w for w in cmd_run.check_flags(_args("--cpu-threads", "4", "--device", "cuda")))
    assert cmd_run.check_flags(_args("--cpu-threads", "4", "--device", "cpu")) == []


@pytest.mark.parametrize(("fields", "said"), [
    ({"fused_ops": "fast"}, "--fused-ops must be one of auto, plain, fused-torch, flashinfer, got 'fast'"),
    ({"fused_ops": None}, "--fused-ops must be one of"),
    ({"fused_ops": "flashinfer"}, "--fused-ops flashinfer needs a CUDA device"),
    ({"fused_ops": "flashinfer", "device": "cuda", "dtype": "float32"}, "--dtype bfloat16 or float16"),
    ({"cpu_threads": 0}, "--cpu-threads must be at least 1, got 0"),
    ({"cpu_threads": 1.5}, "--cpu-threads must be at least 1"),
    ({"draft_extend_graph": "no"}, "draft_extend_graph must be true or false"),
])
def test_validate_refuses_bad_values_in_one_line(fields: dict[str, Any], said: str) -> None:
    with pytest.raises(ConfigError) as e:
        EngineConfig(**fields).validate(models=False)
    assert said in str(e.value) and "\n" not in str(e.value)


def test_the_fields_round_trip_through_the_run_record() -> None:
    cfg = EngineConfig(fused_ops=" On ", draft_extend_graph=False, cpu_threads=4).validate(models=False)
    assert cfg.fused_ops == "auto"  # an alias is stored as the op set it names
    d = cfg.to_dict()
    assert {k: d[k] for k in NEW_FIELDS} == {"fused_ops": "auto", "draft_extend_graph": False, "cpu_threads": 4}
    again = EngineConfig(**{k: d[k] for k in NEW_FIELDS}).validate(models=False)
    assert {k: getattr(again, k) for k in NEW_FIELDS} == {k: getattr(cfg, k) for k in NEW_FIELDS}
    assert {k: getattr(EngineConfig(), k) for k in NEW_FIELDS} == \
        {"fused_ops": "auto", "draft_extend_graph": True, "cpu_threads": 1}


torch = pytest.importorskip("torch")

from specscope.backend.session import run_session  # noqa: E402
from specscope.tracer.process_writer import ProcessTraceWriter  # noqa: E402
from specscope.tracer.recorder import Recorder  # noqa: E402
from specscope.tracer.schema import ForwardMode, GraphPhase  # noqa: E402
from specscope.tracer.store import TraceReader  # noqa: E402


class CountingRecorder(Recorder):
    """The tracer's recorder, counting the steps it is handed (a measurement variant's shape, injected)."""

    made: list[CountingRecorder] = []

    def __init__(self, writer: ProcessTraceWriter, device: torch.device) -> None:
        super().__init__(writer, device)
        self.device_asked, self.ended = device, 0
        CountingRecorder.made.append(self)

    def end_step(self, rec: Any, requests: Any = None) -> None:
        """Count the step, then record it as the tracer does."""
        self.ended += 1
        super().end_step(rec, requests)


def test_a_session_records_through_the_recorder_it_is_given(tmp_path: Path) -> None:
    CountingRecorder.made.clear()
    path = str(tmp_path / "counted.db")
    run_session(EngineConfig(**SMALL_RUN), path, command="pytest recorder", check=False, recorder=CountingRecorder)
    assert len(CountingRecorder.made) == 1
    made = CountingRecorder.made[0]
    with TraceReader(path) as r:
        steps = list(r.steps())
    assert made.device_asked == torch.device("cpu") and made.ended == len(steps) > 0
    # The default draft-extend graph: draft extend is captured and replayed.
    assert any(s.mode == ForwardMode.DRAFT_EXTEND and s.graph == GraphPhase.REPLAY for s in steps)


def test_the_trace_records_the_options_and_the_engine_follows_them(tmp_path: Path) -> None:
    path = str(tmp_path / "options.db")
    threads = torch.get_num_threads()
    try:
        run_session(EngineConfig(**SMALL_RUN, fused_ops="fused-torch", draft_extend_graph=False, cpu_threads=2),
                    path, command="pytest options", check=False)
        assert torch.get_num_threads() == 2
    finally:
        torch.set_num_threads(threads)
    with TraceReader(path) as r:
        config = r.run.config
        steps = list(r.steps())
    assert {k: config[k] for k in NEW_FIELDS} == {"fused_ops": "fused-torch", "draft_extend_graph": False,
                                                  "cpu_threads": 2}
    extends = [s for s in steps if s.mode == ForwardMode.DRAFT_EXTEND]
    assert extends and all(s.graph == GraphPhase.EAGER for s in extends)  # --no-draft-extend-graph: never captured
    assert any(s.mode == ForwardMode.DRAFT_DECODE and s.graph == GraphPhase.REPLAY for s in steps)
