"""I/O amplification of Megatron pretraining on one node: packfeedd against
Megatron's own replicated reads, in one run.

Without packfeed every rank of TP x CP reads its DP rank's samples whole
(Megatron's GPTDataset.__getitem__, then get_batch_on_this_cp_rank throws
(CP-1)/CP of each away). This writes a blend of three datasets with
Megatron's IndexedDatasetBuilder, serves STEPS steps of TP2 x CP2 x DP2 from
a real packfeedd (every rank dumped) and reads the daemon's figures; then,
for each of the same 8 ranks, reads that rank's samples with Megatron's
GPTDataset (file reads, not mmap, so every byte is a read syscall counted
by /proc/self/io rchar). Both against the unique bytes the steps need.

usage: pretraining_io_bench.py BIN_DIR VENV_DIR [--steps 10] [--json]"""
import argparse
import json
import os
import pathlib
import shutil
import sys
import tempfile

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1] / "tests" / "integration"))
from megatron_venv import rerun_in_venv  # noqa: E402

if os.environ.get("PF_IN_MEGATRON_VENV") != "1":
    rerun_in_venv(sys.argv[2], __file__, [sys.argv[1], *sys.argv[3:]])

import numpy  # noqa: E402

from daemon_harness import Daemon  # noqa: E402
from megatron_venv import (Tokenizer, import_megatron_datasets,  # noqa: E402
                           init_single_process, write_megatron_dataset)

parser = argparse.ArgumentParser()
parser.add_argument("bin_dir")
parser.add_argument("--steps", type=int, default=10)
parser.add_argument("--json", action="store_true")
args = parser.parse_args()

TP, CP, DP, MBS, GBS, SEQ, SEED, EOD = 2, 2, 2, 2, 16, 1024, 7, 0
WEIGHTS = [0.5, 0.3, 0.2]
WORK = pathlib.Path(tempfile.mkdtemp(prefix="pf-io-"))
init_single_process(WORK)
Builder, GPTDataset, GPTDatasetConfig = import_megatron_datasets()
PREFIXES = []
for i in range(3):
    prefix = str(WORK / f"ds{i}")
    write_megatron_dataset(prefix, 4000, 400, 32000, numpy.uint16, seed=i, eod=EOD)
    PREFIXES.append(prefix)
TRAIN = GBS * args.steps

# packfeed: one daemon for the node's 8 ranks.
datasets = "\n".join(f'  datasets {{ prefix: "{p}" weight: {w} kind: DATASET_KIND_PRETRAINING }}'
                     for p, w in zip(PREFIXES, WEIGHTS))
config = f"""jobs {{
  name: "gpt"
{datasets}
  topology {{ tp: {TP} cp: {CP} dp: {DP} }}
  global_batch: {GBS}
  seq_length: {SEQ}
  seed: {SEED}
  pretraining {{ train_samples: {TRAIN} valid_samples: {GBS} test_samples: {GBS}
                 micro_batch_size: {MBS} }}
}}
"""
with Daemon(args.bin_dir, config, workdir=WORK) as daemon:
    daemon.dump_ranks("gpt", range(TP * CP * DP), args.steps)
    job = next(j for j in daemon.ctl_json("stats")["jobs"] if j["name"] == "gpt")
packfeed_read = int(job["bytes_read"])
unique = int(job["unique_bytes_needed"])

# Megatron: every rank reads its DP rank's samples itself.
config = GPTDatasetConfig(
    random_seed=SEED, sequence_length=SEQ, blend=(PREFIXES, WEIGHTS), split="969,30,1",
    path_to_cache=str(WORK / "cache"), tokenizer=Tokenizer(EOD), reset_position_ids=False,
    reset_attention_mask=False, eod_mask_loss=False, mmap_bin_files=False)
train = Builder(GPTDataset, [TRAIN, GBS, GBS], lambda: True, config).build()[0]


def rchar():
    return int(next(line.split()[1] for line in open("/proc/self/io")
                    if line.startswith("rchar")))


replicated = 0
for rank in range(TP * CP * DP):
    dp = rank // (TP * CP)
    before = rchar()
    for step in range(args.steps):
        for m in range(GBS // (MBS * DP)):
            first = step * GBS + (m * DP + dp) * MBS
            for b in range(MBS):
                train[first + b]
    replicated += rchar() - before

result = {"steps": args.steps, "ranks": TP * CP * DP, "unique_bytes_needed": unique,
          "packfeed_bytes_read": packfeed_read, "packfeed_amplification": packfeed_read / unique,
          "replicated_bytes_read": replicated, "replicated_amplification": replicated / unique}
if args.json:
    print(json.dumps(result))
else:
    print(f"TP{TP} x CP{CP} x DP{DP}, {args.steps} steps of {GBS} samples of {SEQ + 1} tokens: "
          f"{unique} B needed")
    print(f"  packfeedd (one read per node): {packfeed_read} B read, amplification "
          f"{packfeed_read / unique:.3f}")
    print(f"  Megatron, every rank reading:  {replicated} B read, amplification "
          f"{replicated / unique:.3f}")
shutil.rmtree(WORK)
