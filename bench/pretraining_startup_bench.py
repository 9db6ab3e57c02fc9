"""Start-up of a Megatron pretraining blend: packfeedd's time to the first
microbatch against Megatron-Core's own index build, in one run.

Megatron builds a blend's indices on rank 0 while every other rank waits,
then caches them as .npy files. This writes a blend of --prefixes datasets
(default 3, weighted 0.5/0.3/0.2; with more, equal shares of the documents
weighted by their tokens, as data-path weights usually are) holding
--documents documents in all (their .bin files sparse: only the index is
read to build), then times, alternating --rounds times, like with like:
  * Megatron: BlendedMegatronDatasetBuilder.build() for train, valid and
    test (what pretrain_gpt builds) into an empty cache directory with its
    array writes (numpy.save) left out, as packfeedd writes none (Megatron
    has no build without a cache: given none it writes beside the
    dataset), and the first sample; and again from a cache written by an
    untimed build;
  * packfeed: packfeedd from launch until a rank's packfeed.Client holds
    its first microbatch (the client attaches once the daemon listens),
    serving every split as `megatron-config` emits them
    (serve_every_split: the valid and test jobs are built too), and the
    daemon's peak RSS; and again reading Megatron's cache.
Each side's peak RSS is what its build holds, without an interpreter: the
daemon's process has none, and Megatron's figure is its build process's
peak less that process's resident size before the build (the
interpreter, numpy and torch).

usage: pretraining_startup_bench.py BIN_DIR VENV_DIR PYTHON_PACKAGE_DIR
       [--documents 10000000] [--prefixes 3] [--train-samples 1000000]
       [--rounds 2] [--json]

At corpus scale: --prefixes 1000 --documents 100000000 --train-samples
24000000 (about one epoch of the blend's 9.9·10^10 tokens)."""
import argparse
import json
import os
import pathlib
import shutil
import sys
import tempfile
import time

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1] / "tests" / "integration"))
from megatron_venv import rerun_in_venv  # noqa: E402

if os.environ.get("PF_IN_MEGATRON_VENV") != "1":
    rerun_in_venv(sys.argv[2], __file__, [sys.argv[1], *sys.argv[3:]])

import numpy  # noqa: E402

from daemon_harness import Daemon  # noqa: E402
from megatron_venv import Tokenizer, import_megatron_datasets, init_single_process  # noqa: E402

parser = argparse.ArgumentParser()
parser.add_argument("bin_dir")
parser.add_argument("python_dir")
parser.add_argument("--documents", type=int, default=10_000_000)
parser.add_argument("--prefixes", type=int, default=3)
parser.add_argument("--train-samples", type=int, default=1_000_000)
parser.add_argument("--rounds", type=int, default=2)
parser.add_argument("--json", action="store_true")
args = parser.parse_args()
sys.path.insert(0, args.python_dir)
import packfeed  # noqa: E402

SEQ, SEED, SPLIT = 4096, 1234, "969,30,1"
SAMPLES = [args.train_samples, 10_240, 1_024]  # train, valid, test
WORK = pathlib.Path(tempfile.mkdtemp(prefix="pf-startup-"))
init_single_process(WORK)
Builder, GPTDataset, GPTDatasetConfig = import_megatron_datasets()


def write_sparse_dataset(prefix, lengths):
    """A uint16 dataset of one sequence per document in Megatron's format;
    the .bin is a sparse file of the right size (building reads none of it)."""
    lengths = numpy.asarray(lengths, dtype=numpy.int32)
    n = len(lengths)
    pointers = numpy.zeros(n, dtype=numpy.int64)
    numpy.cumsum(lengths[:-1].astype(numpy.int64) * 2, out=pointers[1:])
    with open(f"{prefix}.idx", "wb") as f:
        f.write(b"MMIDIDX\x00\x00" + numpy.uint64(1).tobytes() + numpy.uint8(8).tobytes())
        f.write(numpy.array([n, n + 1], dtype=numpy.uint64).tobytes())
        f.write(lengths.tobytes() + pointers.tobytes())
        f.write(numpy.arange(n + 1, dtype=numpy.int64).tobytes())
    with open(f"{prefix}.bin", "wb") as f:
        f.truncate(int(lengths.astype(numpy.int64).sum()) * 2)


random = numpy.random.RandomState(0)
SHARES = [0.5, 0.3, 0.2] if args.prefixes == 3 else [1 / args.prefixes] * args.prefixes
PREFIXES, TOKENS = [], []
for i, share in enumerate(SHARES):
    prefix = str(WORK / f"ds{i}")
    count = int(args.documents * share)
    lengths = numpy.clip(random.lognormal(numpy.log(300), 1.0, count), 8, 100_000)
    write_sparse_dataset(prefix, lengths)
    PREFIXES.append(prefix)
    TOKENS.append(float(lengths.astype(numpy.int64).sum()))
WEIGHTS = SHARES if args.prefixes == 3 else [t / sum(TOKENS) for t in TOKENS]


def peak_rss_mib(pid="self"):
    status = pathlib.Path(f"/proc/{pid}/status").read_text()
    return int(next(line.split()[1] for line in status.splitlines()
                    if line.startswith("VmHWM"))) / 1024


def resident_mib():
    status = pathlib.Path("/proc/self/status").read_text()
    return int(next(line.split()[1] for line in status.splitlines()
                    if line.startswith("VmRSS"))) / 1024


def megatron_build(cache, write=True):
    """(seconds, the peak RSS in MiB the build added to this process: the
    peak is reset first and the resident size before the build, the
    interpreter with numpy and torch, taken off). `cache`: the directory
    read, or built into; `write`: False leaves its arrays unwritten (only
    the descriptions, a few hundred bytes each, still are)."""
    pathlib.Path("/proc/self/clear_refs").write_text("5")
    before = resident_mib()
    config = GPTDatasetConfig(
        random_seed=SEED, sequence_length=SEQ, blend=(PREFIXES, WEIGHTS), split=SPLIT,
        path_to_cache=str(cache), tokenizer=Tokenizer(0),
        reset_position_ids=False, reset_attention_mask=False, eod_mask_loss=False)
    save = numpy.save
    if not write:
        numpy.save = lambda *args, **kwargs: None
    try:
        start = time.monotonic()
        train = Builder(GPTDataset, SAMPLES, lambda: True, config).build()[0]
        train[0]
        elapsed = time.monotonic() - start
    finally:
        numpy.save = save
    return elapsed, peak_rss_mib() - before


def packfeed_first_microbatch(cache=None):
    datasets = "\n".join(f'  datasets {{ prefix: "{p}" weight: {w} kind: DATASET_KIND_PRETRAINING }}'
                         for p, w in zip(PREFIXES, WEIGHTS))
    config = f"""jobs {{
  name: "gpt"
{datasets}
  global_batch: 8
  seq_length: {SEQ}
  seed: {SEED}
  pretraining {{ split: "{SPLIT}" train_samples: {SAMPLES[0]} valid_samples: {SAMPLES[1]}
                 test_samples: {SAMPLES[2]} serve_every_split: true
                 {f'cache_dir: "{cache}"' if cache else ""} }}
}}
"""
    workdir = pathlib.Path(tempfile.mkdtemp(dir=WORK))
    daemon = Daemon(args.bin_dir, config, workdir=workdir)
    start = time.monotonic()
    daemon.start(wait=False)
    try:
        while not os.path.exists(daemon.socket):  # it listens once its jobs are built
            if daemon.process.poll() is not None:
                raise RuntimeError(daemon.log.read_text())
            time.sleep(0.005)
        client = packfeed.Client("gpt", socket_path=daemon.socket, rank=0, attach_timeout=120)
        iterator, _, _, _ = client.next_step()
        next(iter(iterator))
        elapsed = time.monotonic() - start
        client.close()
        peak = peak_rss_mib(daemon.process.pid)
    finally:
        daemon.stop()
    return elapsed, peak


rows = []
for r in range(args.rounds):
    cache = WORK / f"cache{r}"
    cold, megatron_rss = megatron_build(WORK / f"empty{r}", write=False)
    megatron_build(cache)  # writes the cache, untimed
    warm, _ = megatron_build(cache)
    ours, rss = packfeed_first_microbatch()
    from_cache, _ = packfeed_first_microbatch(cache)
    shutil.rmtree(cache)
    rows.append({"megatron_build_s": cold, "megatron_cached_s": warm,
                 "megatron_peak_rss_mib": megatron_rss,
                 "packfeed_first_microbatch_s": ours, "packfeed_from_cache_s": from_cache,
                 "packfeed_peak_rss_mib": rss, "ratio": ours / cold})

if args.json:
    print(json.dumps({"documents": args.documents, "prefixes": args.prefixes, "rounds": rows}))
else:
    print(f"blend of {args.prefixes} datasets, {args.documents} documents, seq {SEQ}, "
          f"samples {SAMPLES} (train, valid, test)")
    print("round  megatron build  megatron cached  megatron peak RSS  packfeed first mb  ratio  "
          "daemon peak RSS  packfeed from megatron's cache")
    for r, row in enumerate(rows):
        print(f"{r:5d}  {row['megatron_build_s']:12.2f} s  {row['megatron_cached_s']:13.2f} s"
              f"  {row['megatron_peak_rss_mib']:13.0f} MiB"
              f"  {row['packfeed_first_microbatch_s']:15.2f} s  {row['ratio']:5.2f}"
              f"  {row['packfeed_peak_rss_mib']:11.0f} MiB  {row['packfeed_from_cache_s']:27.2f} s")
shutil.rmtree(WORK)
