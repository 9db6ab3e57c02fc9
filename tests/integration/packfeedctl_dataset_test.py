#!/usr/bin/env python3
"""packfeedctl make-dataset / dataset-info, run as a user would.

ctest runs it under pytest, with the build's paths (tests/conftest.py).
"""
import json
import pathlib
import tempfile

from ctl_checks import fixtures_dir


def test_make_dataset_and_dataset_info(checks):
    check, run = checks.check, checks.run
    with tempfile.TemporaryDirectory() as tmp:
        prefix = f"{tmp}/gen"
        run("make-dataset", "--out", prefix, "--count", "500", "--min", "16",
            "--max", "512", "--mean", "128", "--sigma", "1.0", "--vocab", "1000",
            "--dtype", "int32", "--seed", "7")
        info = json.loads(run("dataset-info", prefix, "--json").stdout)
        check("sequences", info["sequences"] == 500, info)
        check("documents", info["documents"] == 500, info)
        check("dtype_code", info["dtype_code"] == 4, info)
        check("bin size", info["bin_bytes"] == 4 * info["total_tokens"], info)
        check("idx size", info["idx_bytes"] == 34 + 12 * 500 + 8 * 501, info)
        check("length range", 16 <= info["min_length"] <= info["max_length"] <= 512, info)
        check("token_sum integer", isinstance(info["token_sum"], int), info)
        # Independent check of token_sum and lengths from the raw files.
        raw = pathlib.Path(prefix + ".bin").read_bytes()
        tokens = [int.from_bytes(raw[i:i + 4], "little", signed=True)
                  for i in range(0, len(raw), 4)]
        check("token_sum value", info["token_sum"] == sum(tokens),
              (info["token_sum"], sum(tokens)))
        check("vocabulary", all(0 <= t < 1000 for t in tokens))

        # Same seed, same bytes; other seed, other bytes.
        run("make-dataset", "--out", f"{tmp}/again", "--count", "500", "--min", "16",
            "--max", "512", "--mean", "128", "--sigma", "1.0", "--vocab", "1000",
            "--dtype", "int32", "--seed", "7")
        check("deterministic", pathlib.Path(f"{tmp}/again.bin").read_bytes() == raw)

        lengths_file = pathlib.Path(tmp) / "lengths.txt"
        lengths_file.write_text("3\n1\n4\n1\n5\n")
        run("make-dataset", "--out", f"{tmp}/replay", "--lengths", str(lengths_file))
        replay = json.loads(run("dataset-info", f"{tmp}/replay", "--json").stdout)
        check("replayed lengths", replay["total_tokens"] == 14 and
              replay["dtype"] == "uint16", replay)

        text = run("dataset-info", prefix).stdout
        check("readable summary", "sequences     500 in 500 documents" in text, text)

        bad = run("dataset-info", f"{tmp}/missing", ok=False)
        check("missing dataset fails", bad.returncode != 0 and "NOT_FOUND" in bad.stderr
              and "missing.idx" in bad.stderr, bad.stderr)
        pathlib.Path(prefix + ".idx").write_bytes(b"MMIDIDX\0\0" + b"\0" * 3)
        bad = run("dataset-info", prefix, ok=False)
        check("corrupt index fails", "DATA_LOSS" in bad.stderr and
              "truncated header" in bad.stderr, bad.stderr)
        bad = run("make-dataset", "--out", f"{tmp}/x", "--vocab", "70000",
                  "--dtype", "uint16", ok=False)
        check("vocab too large for dtype", "does not fit dtype uint16" in bad.stderr,
              bad.stderr)


def test_dataset_info_reads_megatrons_files(checks, source_root):
    check, run = checks.check, checks.run
    fixture = fixtures_dir(source_root) / "megatron"
    expected = json.loads((fixture / "megatron_written_expected.json").read_text())
    for name, want in expected["datasets"].items():
        got = json.loads(run("dataset-info", str(fixture / want["prefix"]),
                             "--json").stdout)
        check(f"fixture {name}", got["token_sum"] == want["token_sum_all"] and
              got["total_tokens"] == want["total_tokens"] and
              got["sequences"] == want["num_sequences"] and
              got["documents"] == want["num_documents"], got)
