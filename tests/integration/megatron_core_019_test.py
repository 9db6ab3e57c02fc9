#!/usr/bin/env python3
"""Megatron-Core 0.19's inter-document masking and command line, held to
Megatron's own code.

megatron-core 0.19.2 installs on Python >= 3.12 only: its wheel is fetched and
its datasets package run on Debian's python3 inside the 0.16.1 venv of
megatron_venv.py, whose compiled index helper it shares (helpers.cpp is the
same file). For every rank of TP2 x PP2 x CP x DP2 the test computes what
Megatron's pretrain_gpt hands it with --dataloader-inter-document-masking:
GPTDataset[i] (0.19.2, inter_document_masking=True) for the pretraining
sampler's indices, torch's default_collate, then get_batch_on_this_tp_rank,
flatten_batch_for_packed_sequences and get_batch_on_this_cp_rank taken by
name from 0.19.2's megatron/core/utils.py and run as written
(megatron_source.GetBatch019: the CP group's size and rank supplied,
Transformer Engine's thd_get_partitioned_indices as its kernel defines
it). A real packfeedd serves the same job; every field of every rank
must be equal, for CP 1 and 2, both CP splits, and after a restart from
consumed_samples. Two ranks are read through the Python client too, shapes
and dtypes asserted. Then `packfeedctl megatron-config` reads pretrain_gpt
command lines: its blend, split and sample counts must be what 0.19.2's
get_blend_from_list, parse_and_normalize_split, update_train_iters and
get_train_valid_test_num_samples (taken by name from megatron/training)
make of them. Nothing expected is written by hand.

Runs inside the venv (tests/CMakeLists.txt):
  megatron_venv.py VENV_DIR -m pytest megatron_core_019_test.py
with PF_CTL (packfeedctl), PF_MEGATRON_019_DIR (where the 0.19.2 wheel is
unpacked) and PF_PYTHON_DIR (the built packfeed package) in the
environment. Skipped only when PyPI cannot be reached.
"""
import ast
import json
import os
import pathlib
import subprocess
import sys
import tempfile

import numpy
import torch

from ctl_checks import checks_for_helpers
from daemon_harness import Daemon
from megatron_source import GetBatch019, TransformerEngine, write_dataset
from megatron_venv import Tokenizer, init_single_process, megatron_019_from_environment

CTL = os.environ["PF_CTL"]
PYTHON_DIR = os.environ["PF_PYTHON_DIR"]
SRC, Builder, GPTDataset, GPTDatasetConfig, UTILS_SOURCE = megatron_019_from_environment()

EOD = 0
TP, PP, DP = 2, 2, 2
MBS, GBS, SEQ, SEED, STEPS = 2, 16, 64, 4321, 3
SPLIT = "90,8,2"

# The running test's checks, for the helpers below.
CHECKS = check = None
bind_checks = checks_for_helpers(globals())


GET_BATCH = GetBatch019(UTILS_SOURCE, SEQ)
# The kernel's definition, on a case worked by hand (documents of 4 and 12).


def test_transformer_engines_partition_as_its_kernel_defines_it():
    # A case worked by hand (documents of 4 and 12).
    check("TE partition: rank 0 of 2 over documents of 4 and 12",
          TransformerEngine.thd_get_partitioned_indices(torch.tensor([0, 4, 16]), 16, 2, 0)
          .tolist() == [0, 3, 4, 5, 6, 13, 14, 15])


def megatron_get_batch(items, pp, cp_size, cp_rank, per_sequence):
    """pretrain_gpt's get_batch of 0.19 on this rank (stage `pp` of PP),
    with --dataloader-inter-document-masking and the CP split
    `per_sequence` says: {key: value}."""
    return GET_BATCH(items, pp_size=PP, stage=pp, cp_size=cp_size, cp_rank=cp_rank,
                     inter_document_masking=True, per_sequence=per_sequence)


# ---- datasets, written with Megatron's own builder ----
WORK = pathlib.Path(tempfile.mkdtemp(prefix="pf-docmask-"))
init_single_process(WORK)


BLEND = ([write_dataset(str(WORK / f"web{i}"), 400, 30 + 20 * i, 11 + i, EOD) for i in range(3)],
         [2.0, 1.0, 5.0])
# Every sequence a multiple of 4 tokens: with seq 64 every document piece
# divides by 2 x CP = 4, which a per-document split needs.
DIVISIBLE = ([write_dataset(str(WORK / "even"), 600, 40, 7, EOD, multiple=4)], None)


def megatron_train(blend):
    config = GPTDatasetConfig(
        random_seed=SEED, sequence_length=SEQ, blend=blend, split=SPLIT,
        path_to_cache=str(WORK / "megatron-cache"), tokenizer=Tokenizer(EOD),
        reset_position_ids=False, reset_attention_mask=False, eod_mask_loss=True,
        inter_document_masking=True)
    return Builder(GPTDataset, [GBS * 20, GBS, GBS], lambda: True, config).build()[0]


def job_text(blend, cp, consumed, split_name, name="gpt"):
    prefixes, weights = blend
    datasets = "\n".join(
        f'  datasets {{ prefix: "{p}" weight: {w} kind: DATASET_KIND_PRETRAINING }}'
        for p, w in zip(prefixes, weights or [0] * len(prefixes)))
    return f"""jobs {{
  name: "{name}"
{datasets}
  topology {{ tp: {TP} pp: {PP} cp: {cp} dp: {DP} }}
  global_batch: {GBS}
  seq_length: {SEQ}
  seed: {SEED}
  eod_id: {EOD}
  pretraining {{ split: "{SPLIT}" train_samples: {GBS * 20} valid_samples: {GBS}
                 test_samples: {GBS} micro_batch_size: {MBS} consumed_samples: {consumed}
                 eod_mask_loss: true inter_document_masking: true cp_split: {split_name} }}
}}
"""


def coords(rank, cp_size):
    return (rank % TP, (rank // TP) % cp_size, (rank // (TP * cp_size)) % DP,
            rank // (TP * cp_size * DP))


def served_equals(got, want, key):
    if want is None:
        return key not in got
    want = want.numpy()
    served = numpy.asarray(got.get(key, []), dtype=want.dtype)
    return served.size == want.size and numpy.array_equal(served.reshape(want.shape), want)


def serve_and_compare(name, blend, cp_size, per_sequence, consumed=0, python_ranks=()):
    train = megatron_train(blend)
    split_name = "CP_SPLIT_PER_SEQUENCE" if per_sequence else "CP_SPLIT_PER_DOCUMENT"
    ranks = range(TP * PP * cp_size * DP)
    microbatches = GBS // (MBS * DP)
    (WORK / name).mkdir()
    with Daemon(os.path.dirname(CTL), job_text(blend, cp_size, consumed, split_name),
                workdir=WORK / name) as daemon:
        dumps = daemon.dump_ranks("gpt", ranks, STEPS)
        python_batches = {rank: python_step(daemon.socket, rank) for rank in python_ranks}
    documents = compare_dumps(name, train, dumps, cp_size, per_sequence, consumed)
    # The test means something only if samples hold several documents.
    check(f"{name}: microbatches hold several documents each",
          documents > 2 * microbatches * len(ranks) * STEPS, documents)
    for rank, batches in python_batches.items():
        _, cp, dp, pp = coords(rank, cp_size)
        same = 0
        for m, batch in enumerate(batches):
            want = megatron_get_batch([train[consumed + (m * DP + dp) * MBS + b]
                                       for b in range(MBS)], pp, cp_size, cp, per_sequence)
            keys = ("tokens", "position_ids") if pp == 0 else ("labels", "loss_mask")
            same += all(batch[k].dtype == want[k].dtype and torch.equal(batch[k], want[k])
                        for k in keys) and \
                torch.equal(batch["cu_seqlens"], want["cu_seqlens"][0]) and \
                int(batch["max_seqlen"]) == int(want["max_seqlen"][0]) and \
                batch["packed_seq_params"]["max_seqlen_q"] == int(want["max_seqlen"][0])
        check(f"{name} python client rank {rank}: {microbatches} microbatches of "
              f"[1, {MBS * SEQ // cp_size}] equal Megatron's", same == len(batches) == microbatches,
              f"{same} of {len(batches)}")


def compare_dumps(name, train, dumps, cp_size, per_sequence, consumed=0):
    """Each rank's dump of STEPS steps ({rank: dump}) against Megatron
    0.19.2's get_batch of the same samples; the documents seen."""
    microbatches = GBS // (MBS * DP)
    documents = 0
    for rank in sorted(dumps):
        _, cp, dp, pp = coords(rank, cp_size)
        steps = dumps[rank]["steps"]
        check(f"{name} rank {rank}: steps 0..{STEPS - 1} of {microbatches} microbatches",
              [st["step"] for st in steps] == list(range(STEPS))
              and all(len(st["microbatches"]) == microbatches for st in steps),
              [(st["step"], len(st["microbatches"])) for st in steps])
        wrong = []
        for index, st in enumerate(steps):
            for m, got in enumerate(st["microbatches"]):
                first = consumed + index * GBS + (m * DP + dp) * MBS
                want = megatron_get_batch([train[first + b] for b in range(MBS)], pp, cp_size,
                                          cp, per_sequence)
                documents += len(want["cu_seqlens"][0]) - 1
                for key in ("tokens", "labels", "loss_mask", "position_ids", "cu_seqlens",
                            "max_seqlen"):
                    if not served_equals(got, want[key], key):
                        wrong.append(f"step {st['step']} mb {m} {key}")
        check(f"{name} rank {rank} (cp {cp} dp {dp} pp {pp}) equals Megatron 0.19.2's get_batch",
              not wrong, wrong[:5])
    return documents


def python_step(socket, rank):
    """Step 0 of `rank` through packfeed.Client, as the trainer's iterator."""
    sys.path.insert(0, PYTHON_DIR)
    import packfeed
    client = packfeed.Client("gpt", socket_path=socket, rank=rank, copy=True)
    iterator, _, _, _ = client.next_step()
    batches = list(iterator)
    client.close()
    return batches


def test_served_fields_equal_megatrons_get_batch():
    serve_and_compare("cp1", BLEND, 1, True, python_ranks=(0, 5))
    serve_and_compare("cp2-per-sequence", BLEND, 2, True, python_ranks=(2, 13))
    serve_and_compare("cp2-per-sequence-resumed", BLEND, 2, True, consumed=2 * GBS)
    serve_and_compare("cp2-per-document", DIVISIBLE, 2, False, python_ranks=(2,))


def test_per_document_split_refused_where_documents_do_not_divide():
    """Documents that do not divide by 2 x CP under a per-document split:
    Transformer Engine would hand out overlapping positions. A blend of
    DIVISIBLE's documents and a few of another dataset's: exactly the ranks
    of the DP groups that get such a microbatch (found from Megatron's own
    samples) end with the reason; every other rank, and another job of the
    same daemon, get Megatron's batches."""
    cp_size = 2
    mixed = ([DIVISIBLE[0][0], BLEND[0][0]], [40.0, 1.0])
    train = megatron_train(mixed)
    ranks = range(TP * PP * cp_size * DP)
    bad_dps = set()
    for first in range(0, STEPS * GBS, MBS):
        batch = megatron_get_batch([train[first + b] for b in range(MBS)], 0, 1, 0, True)
        if (numpy.diff(batch["cu_seqlens"][0].numpy()) % (2 * cp_size)).any():
            bad_dps.add((first % GBS) // MBS % DP)
    check("the blend gives some DP groups such a microbatch and not others",
          0 < len(bad_dps) < DP, bad_dps)
    (WORK / "refused").mkdir()
    text = (job_text(mixed, cp_size, 0, "CP_SPLIT_PER_DOCUMENT")
            + job_text(DIVISIBLE, cp_size, 0, "CP_SPLIT_PER_DOCUMENT", name="even"))
    with Daemon(os.path.dirname(CTL), text, workdir=WORK / "refused") as daemon:
        processes = {r: daemon.start_dump("gpt", r, STEPS) for r in ranks}
        beside = daemon.dump_ranks("even", ranks, STEPS)
        results = {r: p.communicate(timeout=120) + (p.returncode,) for r, p in processes.items()}
        alive = daemon.ctl_run("health").returncode == 0
    expected = {r for r in ranks if coords(r, cp_size)[2] in bad_dps}
    refused = {r for r, (_, err, code) in results.items()
               if code != 0 and "FAILED_PRECONDITION" in err and "divide by 2 x cp = 4" in err
               and "CP_SPLIT_PER_SEQUENCE" in err}
    check("exactly the ranks of the DP groups with such a microbatch end, with the reason",
          refused == expected, {"expected": sorted(expected), "refused": sorted(refused),
                                "stderr": {r: err[-200:] for r, (_, err, _) in results.items()}})
    served = {r: json.loads(out) for r, (out, _, code) in results.items() if code == 0}
    check("every other rank is served", set(served) == set(ranks) - expected, sorted(served))
    compare_dumps("refused job, the other ranks", train, served, cp_size, False)
    compare_dumps("the job beside it", megatron_train(DIVISIBLE), beside, cp_size, False)
    check("the daemon serves on after refusing them", alive)



def megatron_training_functions(names):
    """Functions of 0.19.2's megatron/training/training.py, run as written
    with `args` as get_args() answers."""
    source = pathlib.Path(SRC, "megatron", "training", "training.py").read_text()
    found = [node for node in ast.parse(source).body
             if isinstance(node, ast.FunctionDef) and node.name in names]
    if {node.name for node in found} != set(names):
        raise RuntimeError(f"megatron/training/training.py of 0.19.2 lacks some of {names}")
    namespace = {"print_rank_0": lambda *a, **k: None}
    exec(compile(ast.Module(body=found, type_ignores=[]), "training.py", "exec"), namespace)
    return namespace


def test_megatron_config_reads_the_command_line():
    from types import SimpleNamespace

    from megatron.core.datasets.blended_megatron_dataset_config import \
        parse_and_normalize_split
    from megatron.core.datasets.utils import get_blend_from_list
    training = megatron_training_functions(["update_train_iters",
                                            "get_train_valid_test_num_samples"])
    cases = [
        (16, ["--data-path", "0.3", "/d/a", "0.7", "/d/b", "--split", "90, 8, 2",
              "--train-iters", "50", "--eval-interval", "20", "--eval-iters", "3",
              "--global-batch-size", "16"]),
        (8, ["--data-path", "/d/a", "/d/b", "/d/c", "--train-samples", "1000",
             "--eval-interval", "40", "--eval-iters", "2", "--start-eval-at-iter", "60",
             "--global-batch-size", "8", "--split", "99/1/0"]),
        (4, ["--data-path", "/d/a", "--train-iters", "10", "--global-batch-size", "8"]),
    ]
    for world, argv in cases:
        argv = argv + ["--seq-length", "64", "--micro-batch-size", "1"]
        printed = subprocess.run([CTL, "megatron-config", "--world-size", str(world), "--eod-id",
                                  "0", "--json", "--", *argv], capture_output=True, text=True)
        if printed.returncode != 0:
            check(f"megatron-config {argv}", False, printed.stderr)
            continue
        job = json.loads(printed.stdout)
        flags = {argv[i]: argv[i + 1] for i in range(len(argv) - 1)
                 if argv[i].startswith("--") and not argv[i + 1].startswith("--")}
        args = SimpleNamespace(
            train_iters=int(flags["--train-iters"]) if "--train-iters" in flags else None,
            train_samples=int(flags["--train-samples"]) if "--train-samples" in flags else None,
            global_batch_size=int(flags["--global-batch-size"]), step_batch_size_schedule=None,
            full_validation=False, skip_train=False, eval_interval=int(flags.get(
                "--eval-interval", 1000)), eval_iters=int(flags.get("--eval-iters", 100)),
            start_eval_at_iter=int(flags["--start-eval-at-iter"])
            if "--start-eval-at-iter" in flags else None,
            phase_transition_iterations=None, iteration=0)
        training["get_args"] = lambda: args
        training["update_train_iters"](args)
        train, valid, test = training["get_train_valid_test_num_samples"]()
        ours = job["pretraining"]
        check(f"megatron-config {argv[:2]}: train, valid, test samples",
              (int(ours["trainSamples"]), int(ours.get("validSamples", 0)),
               int(ours.get("testSamples", 0))) == (train, valid, test),
              (ours, (train, valid, test)))
        start = argv.index("--data-path") + 1
        end = next(i for i in range(start, len(argv)) if argv[i].startswith("--"))
        prefixes, weights = get_blend_from_list(argv[start:end])
        check(f"megatron-config {argv[:2]}: the blend",
              [d["prefix"] for d in job["datasets"]] == prefixes
              and [d.get("weight", 0) for d in job["datasets"]] == (weights or [0] * len(prefixes)),
              (job["datasets"], prefixes, weights))
        split = flags.get("--split", "969, 30, 1")
        check(f"megatron-config {argv[:2]}: the split",
              parse_and_normalize_split(ours["split"]) == parse_and_normalize_split(split),
              (ours["split"], split))
        check(f"megatron-config {argv[:2]}: DP and the world",
              job["topology"]["dp"] * job["topology"].get("tp", 1) == world)


def test_megatron_config_reads_a_step_batch_schedule():
    """0.18's --step-batch-size-schedule: megatron-config's batch_schedule
    gives the batch 0.19.2's StepBatchsizeNumMicroBatchesCalculator gives
    after every consumed count, and the sample counts are those its
    update_train_iters and get_train_valid_test_num_samples compute (the
    evaluation batch defaulting to micro_batch_size x DP, as Megatron sets
    --global-batch-size under a schedule)."""
    from types import SimpleNamespace

    from megatron.core import num_microbatches_calculator as calculators
    training = megatron_training_functions(["update_train_iters",
                                            "get_train_valid_test_num_samples"])
    training["update_num_microbatches"] = calculators.update_num_microbatches
    training["get_current_global_batch_size"] = calculators.get_current_global_batch_size
    world, seq, mbs = 4, 100, 2
    for schedule in ("0:8 2K:16 5.5K:24", "0:16,1k:8 0.0021M:40"):
        argv = ["--data-path", "/d/a", "--seq-length", str(seq), "--micro-batch-size", str(mbs),
                "--step-batch-size-schedule", schedule, "--train-samples", "203",
                "--eval-interval", "4", "--eval-iters", "3"]
        printed = subprocess.run([CTL, "megatron-config", "--world-size", str(world), "--eod-id",
                                  "0", "--json", "--", *argv], capture_output=True, text=True)
        if printed.returncode != 0:
            check(f"megatron-config --step-batch-size-schedule '{schedule}'", False,
                  printed.stderr)
            continue
        ours = json.loads(printed.stdout)["pretraining"]
        entries = [(int(e.get("fromSample", 0)), int(e["globalBatch"]))
                   for e in ours["batchSchedule"]]
        calculators.init_num_microbatches_calculator(
            rank=0, global_batch_size=None, micro_batch_size=mbs, data_parallel_size=world,
            step_batch_size_schedule=schedule, seq_length=seq)
        try:
            differ = []
            for consumed in range(300):
                calculators.update_num_microbatches(consumed, consistency_check=False)
                if max(e for e in entries if e[0] <= consumed)[1] != \
                        calculators.get_current_global_batch_size():
                    differ.append(consumed)
            check(f"'{schedule}': the batch after every consumed count is Megatron's "
                  f"({entries})", not differ, differ[:5])
            args = SimpleNamespace(
                train_iters=None, train_samples=203, global_batch_size=mbs * world,
                eval_global_batch_size=mbs * world, step_batch_size_schedule=schedule,
                full_validation=False, skip_train=False, eval_interval=4, eval_iters=3,
                start_eval_at_iter=None, phase_transition_iterations=None, iteration=0)
            training["get_args"] = lambda: args
            training["update_train_iters"](args)
            counts = training["get_train_valid_test_num_samples"]()
        finally:
            calculators.destroy_num_microbatches_calculator()
        check(f"'{schedule}': train, valid, test samples as Megatron counts them",
              (int(ours["trainSamples"]), int(ours.get("validSamples", 0)),
               int(ours.get("testSamples", 0))) == tuple(counts), (ours, counts))
