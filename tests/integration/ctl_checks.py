"""Shared helpers for the integration tests."""
import pathlib
import subprocess
import sys


def fixtures_dir(source_root):
    """The repository's test fixtures (tests/fixtures/README.md)."""
    return pathlib.Path(source_root).resolve() / "tests" / "fixtures"


def lognormal_traces(source_root, out_dir):
    """Megatron's three lognormal length traces, written under out_dir by
    bench/traces/megatron_lognormal.py: name -> path."""
    sys.path.insert(0, str(pathlib.Path(source_root).resolve() / "bench" / "traces"))
    import megatron_lognormal
    return megatron_lognormal.write_traces(out_dir)


def made_traces(source_root, out_dir):
    """The traces bench/traces/make_traces.py draws from a seed alone
    (trace_heavy_tail), written under out_dir: name -> path."""
    sys.path.insert(0, str(pathlib.Path(source_root).resolve() / "bench" / "traces"))
    import make_traces
    return make_traces.write_made(out_dir)


class Checks:
    """Named checks that all run: `finish` raises one AssertionError naming
    every one that failed (tests/conftest.py's `checks` fixture calls it
    when the test ends)."""

    def __init__(self, ctl):
        self.ctl = ctl
        self.passed = 0
        self.failures = []

    def run(self, *args, ok=True):
        """packfeedctl with `args`; with ok, its failure fails the test."""
        result = subprocess.run([self.ctl, *args], capture_output=True, text=True)
        if ok and result.returncode != 0:
            raise AssertionError(f"{args} failed: {result.stderr}")
        return result

    def check(self, name, condition, detail=""):
        if condition:
            self.passed += 1
        else:
            self.failures.append(f"{name}: {detail}")

    def finish(self):
        print(f"{self.passed} checks passed, {len(self.failures)} failed")
        if self.failures:
            raise AssertionError("\n".join(["failed checks:", *self.failures]))


def checks_for_helpers(namespace):
    """An autouse pytest fixture that points CHECKS and check in
    `namespace` (a test module's globals()) at the running test's `checks`,
    for module helpers that record checks. Keep it as a module attribute:
    `bind_checks = checks_for_helpers(globals())`."""
    import pytest

    @pytest.fixture(autouse=True, name="bind_checks")
    def bind(checks):
        namespace["CHECKS"], namespace["check"] = checks, checks.check

    return bind
