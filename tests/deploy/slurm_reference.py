"""Checks what the ranks of slurm_test's runs received: a packfeedd started
here on the same jobs (every rank local) gives the plan, and each rank's
fields of every step, read back from RUN_DIR/rank-R.json, must equal the
reference thd_reference.py builds from that plan and the dataset files.

usage: slurm_reference.py BIN_DIR JOBS.textproto DATA_PREFIX RUN_DIR..."""
import json
import pathlib
import re
import sys

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent.parent / "integration"))
from ctl_checks import Checks  # noqa: E402
from daemon_harness import Daemon  # noqa: E402
from serving_reference import compare, expected_dumps  # noqa: E402
from thd_reference import Dataset  # noqa: E402


def main():
    bin_dir, jobs, data, runs = sys.argv[1], pathlib.Path(sys.argv[2]), sys.argv[3], sys.argv[4:]
    text = jobs.read_text()
    topology = tuple(int(re.search(rf"\b{axis}: (\d+)", text).group(1)) if
                     re.search(rf"\b{axis}: (\d+)", text) else 1 for axis in ("tp", "pp", "cp", "dp"))
    world = topology[0] * topology[1] * topology[2] * topology[3]
    checks = Checks(None)
    with Daemon(bin_dir, text, name="slurm-reference") as daemon:
        expected = expected_dumps(daemon, "job", Dataset(data), topology, True, 2)
    for run in runs:
        dumps = {}
        for rank in range(world):
            path = pathlib.Path(run, f"rank-{rank}.json")
            checks.check(f"{run}: rank {rank} wrote its fields", path.is_file(), str(path))
            if path.is_file():
                dumps[rank] = json.loads(path.read_text())
        compare(checks, pathlib.Path(run).name, dumps, expected)
    print(f"slurm: {len(runs)} runs x {world} ranks x 2 steps equal the reference")
    checks.finish()


if __name__ == "__main__":
    main()
