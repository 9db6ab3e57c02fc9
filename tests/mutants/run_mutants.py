#!/usr/bin/env python3
"""Mutants: small wrong changes to packfeed's side that a comparison test
must catch. Each is applied to the source, the binaries rebuilt in BUILD,
the test run, and the source restored; prints how many of the test's checks
each mutant fails. The figures in docs/PRETRAINING.md come from here.

Usage: run_mutants.py SOURCE_DIR BUILD_DIR [MUTANT_NAME ...]
Leaves BUILD rebuilt from the restored source.
"""
import pathlib
import re
import subprocess
import sys

# name: (test, file, text, replacement)
MUTANTS = {
    "no position restart per document": (
        "megatron_core_019_test", "server/pipeline/pack.cc",
        "      if (!source.document_bounds.empty()) {",
        "      if (false) {"),
    "extra token kept in the last piece": (
        "megatron_core_019_test", "server/pipeline/document_mask.cc",
        "  if (extra_token && !lengths.empty()) {",
        "  if (false) {"),
    "per-sequence split cut per document": (
        "megatron_core_019_test", "server/pipeline/document_mask.cc",
        "  if (split == CpSplit::kPerSequence || cp_size == 1) {",
        "  if (cp_size == 1) {"),
    "per-document chunks swapped": (
        "megatron_core_019_test", "server/pipeline/document_mask.cc",
        "scheduler::ZigzagSlice(length, cp_size, cp_rank);",
        "scheduler::ZigzagSlice(length, cp_size, cp_size - 1 - cp_rank);"),
    "another seed": (
        "megatron_pretraining_test", "server/config/job_config.cc",
        "options.random_seed = static_cast<uint32_t>(job.seed());",
        "options.random_seed = static_cast<uint32_t>(job.seed() + 1);"),
    "consumed_samples off by one microbatch": (
        "megatron_pretraining_test", "server/pipeline/plan.cc",
        "const int64_t first = config.pretraining().consumed_samples() + out.step",
        "const int64_t first = config.pretraining().consumed_samples() + mbs + out.step"),
    "eod_mask_loss ignored": (
        "megatron_pretraining_test", "server/pipeline/pack.cc",
        "(rules.eod_mask_loss && token == rules.eod_id)",
        "(false && token == rules.eod_id)"),
    "reset_position_ids ignored": (
        "megatron_pretraining_test", "server/pipeline/pack.cc",
        "rules.reset_position_ids ? j - document_start : j;", "j;"),
    "valid split resumed from consumed_samples": (
        "megatron_pretraining_test", "server/config/daemon_config.cc",
        "              p.consumed_valid_samples()},", "              p.consumed_samples()},"),
    "blend_per_split keeps a lone dataset's weight": (
        "megatron_pretraining_test", "server/config/daemon_config.cc",
        "      if (derived.datasets_size() == 1) derived.mutable_datasets(0)->set_weight(0);",
        ""),
}
TARGETS = ["packfeedd", "packfeedctl"]


def build(build_dir):
    subprocess.run(["ninja", "-C", build_dir, *TARGETS], check=True, capture_output=True)


def main():
    source, build_dir, chosen = pathlib.Path(sys.argv[1]), sys.argv[2], sys.argv[3:]
    for name, (test, file, text, replacement) in MUTANTS.items():
        if chosen and name not in chosen:
            continue
        path = source / file
        original = path.read_text()
        if original.count(text) < 1:
            sys.exit(f"mutant '{name}': {file} no longer holds {text!r}")
        try:
            path.write_text(original.replace(text, replacement, 1))
            build(build_dir)
            run = subprocess.run(["ctest", "--test-dir", build_dir, "-R", f"^{test}$", "-V"],
                                 capture_output=True, text=True)
            summary = re.findall(r"(\d+) passed, (\d+) failed", run.stdout)
            errors = [line for line in run.stdout.splitlines() if "Error" in line]
            how = (f"{summary[-1][1]} checks failed" if summary
                   else f"stopped: {errors[-1].strip() if errors else run.stdout[-200:]}")
            print(f"{name}: {test} {'FAILS' if run.returncode else 'PASSES'}, {how}", flush=True)
        finally:
            path.write_text(original)
    build(build_dir)


if __name__ == "__main__":
    main()
