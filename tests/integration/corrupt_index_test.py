"""A real packfeedd started on each index of the corrupted-index corpus
(tests/fixtures/corrupt_index: every field of the header, the sizes, the
pointers and the document index broken, the file cut or grown, the .bin
cut): each start-up must end with a non-zero exit, never by a signal and
never hang, and with exactly one error line naming the file (the .bin when
the index points past its end) and the check that failed. The intact index, served the same way, must start and serve
(so the configuration itself is not what fails).

ctest runs it under pytest, with the build's paths (tests/conftest.py)."""
import json
import pathlib
import shutil
import signal
import subprocess
import tempfile

from daemon_harness import Daemon, start_up_errors


def config_text(socket, prefix):
    return f"""socket_path: "{socket}"
jobs {{
  name: "job"
  datasets {{ prefix: "{prefix}" }}
  topology {{ tp: 1 cp: 1 dp: 2 }}
  global_batch: 4
  seq_length: 256
  eod_id: 200000
  scheduler {{ kind: "balanced" max_tokens_per_rank: 512 }}
}}
"""


def test_each_corrupt_index_is_refused_with_one_line(bin_dir, source_root, checks):
    root = source_root
    corpus = root / "tests" / "fixtures" / "corrupt_index"
    golden_bin = root / "tests" / "fixtures" / "golden" / "E1.bin"
    cases = json.loads((corpus / "corpus.json").read_text())
    work = pathlib.Path(tempfile.mkdtemp(prefix="pf-corrupt-index-"))

    intact = work / "intact"
    shutil.copy(corpus.parent / "golden" / "E1.idx", f"{intact}.idx")
    shutil.copy(golden_bin, f"{intact}.bin")
    with Daemon(bin_dir, config_text(work / "intact.sock", intact).split("\n", 1)[1],
                name="intact", workdir=work) as daemon:
        served = daemon.dump_ranks("job", range(2), steps=1)
        checks.check("the intact index is served", len(served) == 2, served)

    for name, case in sorted(cases.items()):
        prefix = work / name
        shutil.copy(corpus / f"{name}.idx", f"{prefix}.idx")
        data = golden_bin.read_bytes()
        pathlib.Path(f"{prefix}.bin").write_bytes(data[:case.get("bin_bytes", len(data))])
        config = work / f"{name}.textproto"
        config.write_text(config_text(work / f"{name}.sock", prefix))
        try:
            code, errors = start_up_errors(bin_dir, config)
        except subprocess.TimeoutExpired:
            checks.check(f"{name}: start-up ends", False, "hung for 30 s")
            continue
        checks.check(f"{name}: refused with an exit code, not a signal",
                     code > 0, f"exit {code}" + (f" ({signal.Signals(-code).name})"
                                                  if code < 0 else ""))
        # The index, or the .bin where the index points past its end.
        checks.check(f"{name}: one error line naming {name}.idx/.bin and '{case['error']}'",
                     len(errors) == 1 and f"/{name}." in errors[0]
                     and case["error"] in errors[0], errors)
    print(f"{len(cases)} corrupted indexes: each refused at start-up with one line")
