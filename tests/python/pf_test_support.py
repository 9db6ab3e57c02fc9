"""What the Python tests share: where the binaries and the fixtures
are, and the daemon harness of the integration tests.

Environment (set by tests/CMakeLists.txt): PF_BIN_DIR (packfeedd,
packfeedctl), PF_SOURCE_ROOT; PYTHONPATH holds the built packfeed package and
tests/integration."""
import os
import pathlib
import sys
import unittest

from ctl_checks import fixtures_dir
from daemon_harness import Daemon  # noqa: F401  (re-exported for the tests)

BIN_DIR = pathlib.Path(os.environ["PF_BIN_DIR"])
SOURCE_ROOT = pathlib.Path(os.environ["PF_SOURCE_ROOT"])
SKIP_EXIT_CODE = 77  # ctest's SKIP_RETURN_CODE for these tests


def golden_fixtures():
    """The golden fixture folder (tests/fixtures/golden)."""
    return fixtures_dir(SOURCE_ROOT) / "golden"


def main():
    """For a test file run on its own, where pytest is absent (the GPU
    machine's bundle, tests/gpu/run_gpu_checks.sh); ctest runs it under
    pytest (tests/conftest.py). unittest's main: exits 1 on any failure,
    SKIP_EXIT_CODE when every test was skipped, else 0."""
    result = unittest.main(verbosity=2, exit=False).result
    if not result.wasSuccessful():
        sys.exit(1)
    if result.testsRun > 0 and len(result.skipped) == result.testsRun:
        sys.exit(SKIP_EXIT_CODE)
    sys.exit(0)
