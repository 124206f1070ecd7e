"""The shipped Prometheus alert rules: valid (``promtool check rules``), and each alert fires on the series
made for it and stays quiet on its near miss (``promtool test rules`` with alerts_test.yml).

promtool comes from Debian's ``prometheus`` package, which ``make setup`` installs; without it these tests
are skipped, never installed from here.
"""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

RULES_DIR = Path(__file__).resolve().parents[2] / "deploy" / "compose" / "prometheus"
RULES = RULES_DIR / "alerts.yml"
RULE_TESTS = RULES_DIR / "alerts_test.yml"
#: DESIGN.md section 10: the alerts we ship.
ALERTS = {"HighErrorRate", "WorkerDown", "BreakerOpen", "HighQueueDelay", "ModelLoadFailures"}


def promtool() -> str:
    path = shutil.which("promtool")
    if path is None:
        pytest.skip("promtool not installed: make setup installs it")
    return path


def run_promtool(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [promtool(), *args], cwd=RULES_DIR, capture_output=True, text=True, timeout=60, check=False
    )


def test_every_designed_alert_is_shipped_and_tested() -> None:
    rules = yaml.safe_load(RULES.read_text())
    shipped = {rule["alert"] for group in rules["groups"] for rule in group["rules"] if "alert" in rule}
    assert shipped == ALERTS
    tests = yaml.safe_load(RULE_TESTS.read_text())
    fired = {
        case["alertname"]
        for test in tests["tests"]
        for case in test.get("alert_rule_test", [])
        if case["exp_alerts"]
    }
    assert fired == ALERTS


def test_rules_pass_promtool_check() -> None:
    result = run_promtool("check", "rules", RULES.name)
    assert result.returncode == 0, result.stdout + result.stderr
    assert f"SUCCESS: {len(ALERTS)} rules found" in result.stdout


def test_each_alert_fires_in_promtool_unit_tests() -> None:
    result = run_promtool("test", "rules", RULE_TESTS.name)
    assert result.returncode == 0, result.stdout + result.stderr
