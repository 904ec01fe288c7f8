"""scripts/mutdrive.py: the choices that decide a mutant's verdict (which tests it runs, how an exit reads)."""

from __future__ import annotations

import json
import os
import signal

from scripts import mutdrive

DURATION = {
    "tests/test_golden.py::test_case[a]": 0.02,
    "tests/test_golden.py::test_case[b]": 0.01,
    "tests/test_x.py::test_p[0]": 0.5,
    "tests/test_x.py::test_p[1]": 0.4,
    "tests/test_x.py::test_p[2]": 0.3,
    "tests/test_x.py::test_slow": 9.0,
}


def test_every_test_cheapest_first_when_not_narrowed() -> None:
    assert mutdrive.select_tests(DURATION, DURATION, None, None) == sorted(DURATION, key=DURATION.__getitem__)


def test_narrowing_keeps_each_golden_case_and_the_cheapest_parameters_and_drops_slow_tests() -> None:
    assert mutdrive.select_tests(DURATION, DURATION, 2, 3.0) == [
        "tests/test_golden.py::test_case[b]",
        "tests/test_golden.py::test_case[a]",
        "tests/test_x.py::test_p[2]",
        "tests/test_x.py::test_p[1]",
    ]
    assert "tests/test_x.py::test_slow" in mutdrive.select_tests(DURATION, DURATION, 2, 9.0)


def test_a_test_without_a_duration_counts_one_second() -> None:
    assert mutdrive.select_tests(["t::unknown", "t::fast"], {"t::fast": 0.1}, None, 0.5) == ["t::fast"]


def test_names_map_to_mutmut_stats_keys_and_meta_files() -> None:
    assert mutdrive.function_of("policies.rules.x_f__mutmut_12") == "policies.rules.x_f"
    method = "policies.inventory.xǁInventoryǁmemo"
    assert mutdrive.function_of(f"{method}__mutmut_3") == method
    assert str(mutdrive.meta_file("policies.rules.x_f__mutmut_12")) == "policies/rules.py.meta"


def test_exit_statuses_read_as_mutmut_codes() -> None:
    for code in (0, 1, 3):
        pid = os.fork()
        if pid == 0:
            os._exit(code)
        assert mutdrive.exit_code(os.waitpid(pid, 0)[1]) == code
    for sig, code in ((signal.SIGKILL, mutdrive.WALL_TIMEOUT), (signal.SIGXCPU, mutdrive.CPU_TIMEOUT)):
        pid = os.fork()
        if pid == 0:
            os.kill(os.getpid(), sig)
            os._exit(99)
        assert mutdrive.exit_code(os.waitpid(pid, 0)[1]) == code


def test_the_log_resumes_a_run_and_a_torn_last_line_is_left_out(tmp_path, monkeypatch) -> None:
    log = tmp_path / "log.jsonl"
    log.write_text('{"name": "policies.a.x_f__mutmut_1", "code": 1, "secs": 0.1}\n{"name": "policies.a.x_f__mu')
    assert mutdrive.read_log(log) == {"policies.a.x_f__mutmut_1": 1}
    monkeypatch.chdir(tmp_path)
    (tmp_path / "policies").mkdir()
    meta = tmp_path / "policies" / "a.py.meta"
    meta.write_text(
        json.dumps(
            {"exit_code_by_key": {"policies.a.x_f__mutmut_1": None, "policies.a.x_f__mutmut_2": None}, "other": 7}
        )
    )
    mutdrive.write_meta(mutdrive.read_log(log))
    data = json.loads(meta.read_text())
    assert data == {"exit_code_by_key": {"policies.a.x_f__mutmut_1": 1, "policies.a.x_f__mutmut_2": None}, "other": 7}


# Test files `make mutmut` does not run against each mutant, and why. A new test file must go either into
# pyproject's selection or here: session 11's unit tests for survivors were left out of the selection, so
# `mutmut` went on reporting as survivors the mutants they kill.
NOT_PER_MUTANT = {
    "test_audit_cli.py": "the audit CLI (webhook/)",
    "test_audit_log.py": "the audit log writer (webhook/)",
    "test_boundary.py": "an import-graph check in a subprocess",
    "test_certs.py": "certs/",
    "test_certs_cli.py": "certs/ CLI",
    "test_check_cli.py": "a CLI in subprocesses",
    "test_deploy.py": "deploy/ manifests, through subprocesses",
    "test_engine_cache.py": "hypothesis over every function: minutes per mutant",
    "test_estimate_cli.py": "a CLI",
    "test_examples.py": "examples/ through the CLIs",
    "test_execcred.py": "the kubeconfig exec plugin (cluster/)",
    "test_fuzz.py": "hypothesis fuzzing of the parsers: minutes per mutant",
    "test_helm.py": "the helm binary",
    "test_kubeclient.py": "cluster/",
    "test_layered.py": "cluster/",
    "test_ledger_tracker.py": "cluster/",
    "test_limits.py": "the CLI in subprocesses, which never see a mutant; memory bounds that tracing breaks",
    "test_metrics.py": "webhook/",
    "test_mutdrive.py": "this driver",
    "test_native_cel.py": "the CEL evaluator binary",
    "test_node_decode.py": "cluster/",
    "test_node_watch.py": "cluster/",
    "test_nodefile.py": "cluster/",
    "test_noderecord.py": "cluster/",
    "test_placement_cli.py": "a CLI",
    "test_pod_waiting.py": "cluster/",
    "test_pod_watch.py": "cluster/",
    "test_podtable.py": "cluster/",
    "test_properties.py": "hypothesis over every function: minutes per mutant",
    "test_reservations.py": "hypothesis with cluster/ pod views",
    "test_server.py": "the HTTPS server (webhook/)",
    "test_server_limits.py": "the HTTPS server (webhook/)",
    "test_suite_cli.py": "a CLI",
    "test_transport.py": "webhook/ transport and TLS",
    "test_version.py": "the server's version in a subprocess",
}


def test_every_test_file_is_run_per_mutant_or_left_out_with_a_reason() -> None:
    import tomllib
    from pathlib import Path

    root = Path(__file__).resolve().parent.parent
    selection = tomllib.loads((root / "pyproject.toml").read_text())["tool"]["mutmut"][
        "pytest_add_cli_args_test_selection"
    ]
    selected = {Path(p).name for p in selection}
    files = {p.name for p in (root / "tests").glob("test_*.py")}
    assert selected <= files, sorted(selected - files)  # no stale entry
    assert not selected & NOT_PER_MUTANT.keys(), sorted(selected & NOT_PER_MUTANT.keys())
    assert files - selected == NOT_PER_MUTANT.keys(), sorted((files - selected) ^ NOT_PER_MUTANT.keys())
