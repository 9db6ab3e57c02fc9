"""Golden: packfeedd serving tests/fixtures/golden/E1 and E4 (Megatron's
dp_balanced, sequential sampler, Megatron padding) hands every global rank
exactly what Megatron-LM handed it, field by field, microbatch by microbatch.

ctest runs it under pytest, with the build's paths (tests/conftest.py)."""
import json

from ctl_checks import fixtures_dir
from daemon_harness import Daemon

FIELDS = ["tokens", "labels", "loss_mask", "position_ids", "padding_mask", "cu_seqlens",
          "cu_seqlens_padded", "max_seqlen", "local_cp_size"]


def job_config(case, prefix, config):
    kind = "DATASET_KIND_SFT" if config["dataset_kind"] == "sft" else "DATASET_KIND_VARLEN"
    return f"""
jobs {{
  name: "{case}"
  datasets {{ prefix: "{prefix}" kind: {kind} }}
  topology {{ tp: {config['TP']} pp: {config['PP']} cp: {config['CP']} dp: {config['DP']}
             sequence_parallel: {str(config['sequence_parallel']).lower()} }}
  global_batch: {config['global_batch_size']}
  seq_length: {config['seq_length']}
  eod_id: {config['eod_id']}
  pad_id: {config['pad_id']}
  sampler: SAMPLER_MODE_SEQUENTIAL
  scheduler {{ kind: "megatron_dp_balanced" max_tokens_per_rank: {config['max_seqlen_per_dp_cp_rank']} }}
}}
"""


def check_case(checks, bin_dir, fixtures, case):
    golden = json.loads((fixtures / f"{case}.json").read_text())
    config = golden["config"]
    with Daemon(bin_dir, job_config(case, fixtures / case, config), name=case) as daemon:
        dumps = daemon.dump_ranks(case, range(config["world_size"]), steps=1)
        reply = daemon.ctl_json("stats", "--job", case)
        stats, storage = reply["jobs"][0], reply["storage"]
        code = daemon.stop()
    checks.check(f"{case} daemon exits 0 on SIGTERM", code == 0, f"exit {code}")
    for expected in golden["ranks"]:
        rank = expected["rank"]
        step = dumps[rank]["steps"][0]
        checks.check(f"{case} rank {rank} M", step["num_microbatches"] == expected["M"],
                     f"{step['num_microbatches']} != {expected['M']}")
        checks.check(f"{case} rank {rank} flops",
                     step["flops"]["padded_sum"] == golden["flops"]["seqlen_sum"] and
                     step["flops"]["padded_squared_sum"] == golden["flops"]["seqlen_squared_sum"],
                     step["flops"])
        for m, want in enumerate(expected["microbatches"]):
            got = step["microbatches"][m]
            for field in FIELDS:
                checks.check(f"{case} rank {rank} microbatch {m} {field}",
                             got.get(field) == want[field],
                             f"got {str(got.get(field))[:120]} want {str(want[field])[:120]}")
    # The fixtures are smaller than the steps read ahead: later epochs of a
    # sample are served from what is held, so the node reads less than the
    # ranks need (< 1), and never a byte twice.
    checks.check(f"{case} I/O amplification <= 1.00",
                 0 < stats["io_amplification"] <= 1.0, stats["io_amplification"])
    checks.check(f"{case} no re-read", int(storage.get("reread_events", 0)) == 0, storage)
    print(f"{case}: {config['world_size']} ranks × {golden['ranks'][0]['M']} microbatches compared")


def test_golden_cases_served_byte_for_byte(bin_dir, source_root, checks):
    fixtures = fixtures_dir(source_root) / "golden"
    for case in ("E1", "E4"):
        check_case(checks, bin_dir, fixtures, case)
