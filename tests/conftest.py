"""What the Python tests share under pytest (tests/pytest.ini):

- the build's paths as options, which tests/CMakeLists.txt passes to each
  file (--bin-dir, --source-root, --ctl, --slowfs), as fixtures;
- `checks`: named checks that all run and are all reported, failing the
  test at its end if any failed (a scenario reports every broken
  expectation, not only the first);
- exit code 77, ctest's SKIP_RETURN_CODE, when every test of a run was
  skipped (a missing device, tool or network), so that ctest reports the
  test skipped rather than passed."""
import pathlib
import sys

import pytest

# The integration helpers (daemon_harness, ctl_checks, ...) for every test.
sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent / "integration"))

from ctl_checks import Checks  # noqa: E402

SKIP_EXIT_CODE = 77


def pytest_addoption(parser):
    group = parser.getgroup("packfeed", "the build under test")
    group.addoption("--bin-dir", help="the folder of packfeedd and packfeedctl")
    group.addoption("--source-root", help="the repository")
    group.addoption("--ctl", help="packfeedctl")
    group.addoption("--slowfs", help="the slowfs FUSE filesystem (tests/slowfs)")


def _required(request, name):
    value = request.config.getoption(name)
    if value is None:
        raise pytest.UsageError(f"this test needs --{name.replace('_', '-')}")
    return value


@pytest.fixture(scope="session")
def bin_dir(request):
    return pathlib.Path(_required(request, "bin_dir"))


@pytest.fixture(scope="session")
def source_root(request):
    return pathlib.Path(_required(request, "source_root")).resolve()


@pytest.fixture(scope="session")
def ctl(request):
    return _required(request, "ctl")


@pytest.fixture(scope="session")
def slowfs(request):
    return _required(request, "slowfs")


@pytest.fixture
def checks(request):
    """Soft checks; packfeedctl (when --ctl is given) for checks.run."""
    return Checks(request.config.getoption("ctl"))


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_call(item):
    """A test with failed checks fails, naming each, once its body ran."""
    outcome = yield
    soft = item.funcargs.get("checks")
    if soft is not None and outcome.excinfo is None:
        soft.finish()


def pytest_sessionfinish(session, exitstatus):
    reporter = session.config.pluginmanager.get_plugin("terminalreporter")
    # A module skipped as a whole (pytest.skip(allow_module_level=True))
    # collects no test, which pytest ends with NO_TESTS_COLLECTED (5): that
    # is a skip too. A failure or an error is never turned into one.
    skippable = (pytest.ExitCode.OK, pytest.ExitCode.NO_TESTS_COLLECTED)
    if exitstatus not in skippable or reporter is None:
        return
    stats = reporter.stats
    if stats.get("skipped") and not any(stats.get(k) for k in ("passed", "failed", "error")):
        session.exitstatus = SKIP_EXIT_CODE
