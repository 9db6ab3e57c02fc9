"""What the Python tests share: where the binaries and the shared fixtures
are, and the daemon harness of the integration tests.

Environment (set by tests/CMakeLists.txt): PF_BIN_DIR (packfeedd,
packfeedctl), PF_SOURCE_ROOT; PYTHONPATH holds the built packfeed package and
tests/integration."""
import os
import pathlib
import sys
import unittest

from ctl_checks import shared_dir
from daemon_harness import Daemon  # noqa: F401  (re-exported for the tests)

BIN_DIR = pathlib.Path(os.environ["PF_BIN_DIR"])
SOURCE_ROOT = pathlib.Path(os.environ["PF_SOURCE_ROOT"])
SKIP_EXIT_CODE = 77  # ctest's SKIP_RETURN_CODE for these tests


def golden_fixtures():
    """The golden fixture folder, or exit as skipped (with the reason) when
    the shared data is absent, as on a user's machine."""
    fixtures = shared_dir(SOURCE_ROOT) / "fixtures" / "golden"
    if not fixtures.is_dir():
        print(f"SKIP: {fixtures} not found (set PACKFEED_SHARED_DIR)")
        sys.exit(SKIP_EXIT_CODE)
    return fixtures


def main():
    """unittest's main, exiting non-zero on any failure."""
    unittest.main(verbosity=2)
