#!/usr/bin/env python3
"""Megatron pretraining samples, held to Megatron-Core's own code.

Installs megatron-core 0.16.1 (--no-deps) into a venv over Debian's python3
and its numpy/torch, builds Megatron's GPTDataset and BlendedDataset with
BlendedMegatronDatasetBuilder on datasets this test generates, and asserts
that `packfeedctl pretraining-samples` gives the same document, sample,
shuffle and blend indices element for element, and the same tokens and
labels for every sample it reads. Nothing expected is written by hand.

Then serves a blend to every rank of TP2 x PP2 x CP2 x DP2 from a real
packfeedd and asserts every rank gets exactly the batch Megatron's
pretraining sampler and get_batch_on_this_cp_rank give it, also after a
restart from consumed_samples, and through the Python client.

Runs inside the venv (tests/CMakeLists.txt):
  megatron_venv.py VENV_DIR -m pytest megatron_pretraining_test.py
with PF_CTL (packfeedctl) and PF_PYTHON_DIR (the built packfeed package, if
any) in the environment. Skipped only when PyPI cannot be reached.
"""
import json
import logging
import math
import os
import pathlib
import random
import shutil
import subprocess
import sys
import tempfile
import types

import numpy
import torch

from ctl_checks import checks_for_helpers
from daemon_harness import Daemon, start_up_errors
from megatron_source import GetBatch016
from megatron_venv import (Tokenizer, import_megatron_datasets, init_single_process,
                           write_megatron_dataset)

Builder, GPTDataset, GPTDatasetConfig = import_megatron_datasets()
logging.getLogger("megatron").setLevel(logging.ERROR)
CTL = os.environ["PF_CTL"]
PYTHON_DIR = os.environ.get("PF_PYTHON_DIR", "")
EOD = 0
# The running test's checks, for the helpers below.
CHECKS = check = None
bind_checks = checks_for_helpers(globals())




WORK = pathlib.Path(tempfile.mkdtemp(prefix="pf-megatron-"))
init_single_process(WORK)
DATASETS = []
# Small datasets (tens of thousands of tokens) so the sample counts below
# take several epochs; uint16 and int32 tokens.
for i, (documents, mean, vocab, dtype) in enumerate(
        [(700, 60, 32000, numpy.uint16), (450, 150, 100000, numpy.int32),
         (260, 30, 500, numpy.uint16)]):
    prefix = WORK / f"ds{i}"
    write_megatron_dataset(prefix, documents, mean, vocab, dtype, seed=i, eod=EOD)
    DATASETS.append(str(prefix))


def job_config(name, prefixes, weights, seq, seed, split, samples, serve, extra=""):
    datasets = "\n".join(
        f'  datasets {{ prefix: "{p}" kind: DATASET_KIND_PRETRAINING'
        + (f" weight: {w}" if weights else "") + " }"
        for p, w in zip(prefixes, weights or [0] * len(prefixes)))
    return f"""socket_path: "{WORK}/unused.sock"
jobs {{
  name: "{name}"
{datasets}
  global_batch: 8
  seq_length: {seq}
  seed: {seed}
  pretraining {{
    split: "{split}"
    train_samples: {samples[0]} valid_samples: {samples[1]} test_samples: {samples[2]}
    serve_split: {serve}
    {extra}
  }}
}}
"""


def megatron(prefixes, weights, seq, seed, split, samples, keep_partial, surplus=None):
    config = GPTDatasetConfig(
        random_seed=seed, sequence_length=seq,
        blend=(prefixes, weights), split=split,
        path_to_cache=str(WORK / "megatron-cache"), tokenizer=Tokenizer(EOD),
        reset_position_ids=False, reset_attention_mask=False, eod_mask_loss=False,
        drop_last_partial_validation_sequence=not keep_partial,
        **({} if surplus is None else {"mid_level_dataset_surplus": surplus}))
    # A blend by size has no sample counts; a weighted blend keeps its 0s
    # (a split of weight 0, which Megatron then leaves out).
    sizes = [s if s > 0 or weights else None for s in samples]
    return Builder(GPTDataset, sizes, lambda: True, config).build()


def compare(name, prefixes, weights, seq, seed, split, samples, keep_partial=False,
            surplus=None):
    built = megatron(prefixes, weights, seq, seed, split, samples, keep_partial, surplus)
    for serve, theirs in zip(("SPLIT_TRAIN", "SPLIT_VALID", "SPLIT_TEST"), built):
        if theirs is None:
            continue
        out = WORK / f"{name}-{serve}"
        out.mkdir()
        config = out / "daemon.conf"
        extra = ["keep_partial_validation_sequence: true"] if keep_partial else []
        if surplus is not None:
            extra.append(f"mid_level_dataset_surplus: {surplus}")
        config.write_text(job_config(name, prefixes, weights, seq, seed, split, samples, serve,
                                     "\n    ".join(extra)))
        compare_split(f"{name} {serve}", theirs, config, name, out)


def compare_split(label, theirs, config, job, out):
    """packfeedctl pretraining-samples of `job` against Megatron's dataset
    `theirs`: the sample count, every index array, and the tokens and labels
    of up to 300 samples."""
    count = min(len(theirs), 300)
    printed = CHECKS.run("pretraining-samples", "--config", str(config), "--job", job,
                      "--indices-dir", str(out), "--tokens", str(out / "tokens.npy"),
                      "--count", str(count)).stdout
    check(f"{label}: sample count", f": {len(theirs)} samples" in printed,
          f"Megatron {len(theirs)}; packfeedctl: {printed}")
    is_blend = hasattr(theirs, "dataset_index")
    check(f"{label}: blend or not", (out / "blend-dataset_index.npy").exists() == is_blend)
    gpts = theirs.datasets if is_blend else [theirs]
    if is_blend:
        for array in ("dataset_index", "dataset_sample_index"):
            ours = numpy.load(out / f"blend-{array}.npy")
            check(f"{label}: blend {array}",
                  numpy.array_equal(ours, numpy.asarray(getattr(theirs, array))))
    for d, gpt in enumerate(gpts):
        for array in ("document_index", "sample_index", "shuffle_index"):
            ours = numpy.load(out / f"{d}-{array}.npy")
            mine = numpy.asarray(getattr(gpt, array))
            check(f"{label}: dataset {d} {array}",
                  ours.shape == mine.shape and numpy.array_equal(ours, mine),
                  f"shapes {ours.shape} {mine.shape}")
    tokens = numpy.load(out / "tokens.npy")
    equal = 0
    for i in range(count):
        sample = theirs[i]
        text = numpy.where(tokens[i] == -1, 0, tokens[i])
        if (numpy.array_equal(sample["tokens"].numpy(), text[:-1])
                and numpy.array_equal(sample["labels"].numpy(), text[1:])):
            equal += 1
    check(f"{label}: tokens and labels of {count} samples", equal == count,
          f"{count - equal} differ")


def compare_blend_per_split(name, blends, seq, seed, samples):
    """Megatron's blend_per_split (--train-data-path, --valid-data-path,
    --test-data-path) against one job with valid_datasets/test_datasets and
    serve_every_split: NAME, NAME.valid and NAME.test."""
    config = GPTDatasetConfig(
        random_seed=seed, sequence_length=seq, blend_per_split=blends, split=None,
        path_to_cache=str(WORK / "megatron-cache"), tokenizer=Tokenizer(EOD),
        reset_position_ids=False, reset_attention_mask=False, eod_mask_loss=False)
    built = Builder(GPTDataset, list(samples), lambda: True, config).build()

    def datasets(field, blend):
        prefixes, weights = blend
        return "\n".join(f'  {field} {{ prefix: "{p}" kind: DATASET_KIND_PRETRAINING'
                         + (f" weight: {w}" if weights else "") + " }"
                         for p, w in zip(prefixes, weights or [0] * len(prefixes)))
    out = WORK / name
    out.mkdir()
    text = f"""socket_path: "{WORK}/unused.sock"
jobs {{
  name: "{name}"
{datasets("datasets", blends[0])}
  global_batch: 8
  seq_length: {seq}
  seed: {seed}
  pretraining {{
    train_samples: {samples[0]} valid_samples: {samples[1]} test_samples: {samples[2]}
    serve_every_split: true
{datasets("valid_datasets", blends[1])}
{datasets("test_datasets", blends[2])}
  }}
}}
"""
    (out / "daemon.conf").write_text(text)
    for job, theirs in zip((name, f"{name}.valid", f"{name}.test"), built):
        (out / job).mkdir()
        compare_split(f"{name}: job {job}", theirs, out / "daemon.conf", job, out / job)


def test_indices_equal_megatrons_builder():
    # One dataset, no weights (Megatron builds the GPTDataset alone), 3 epochs.
    compare("single", DATASETS[:1], None, 64, 1234, "969,30,1", (6000, 200, 50))
    # Two and three datasets with weights, two seeds, two sequence lengths,
    # several epochs of the small dataset.
    compare("two", DATASETS[:2], [0.3, 0.7], 128, 1234, "90,8,2", (3000, 300, 100))
    compare("three", DATASETS, [2.0, 1.0, 5.0], 96, 99, "80,15,5", (8000, 400, 120))
    # Three datasets without weights: a blend by size, one epoch each.
    compare("bysize", DATASETS, None, 64, 7, "70,20,10", (0, 0, 0))
    # A partial last validation sample kept and padded.
    compare("partial", DATASETS[1:2], None, 200, 5, "50,50", (0, 0, 0), keep_partial=True)
    # blend_per_split: a weighted train blend, a valid split of one weighted
    # dataset (Megatron builds it alone), a test blend by size.
    compare_blend_per_split("perSplit", [(DATASETS[:2], [1.0, 3.0]), (DATASETS[2:], [5.0]),
                                         (DATASETS, None)], 64, 77, (2000, 300, 100))


def adversarial_weights(count, seed, wide):
    """Blend weights as recipes make them, where a fast path's shortcuts
    would show: values ordinary arithmetic leaves a few ulps apart (0.1 + 0.2
    beside 0.3, 0.7 beside 0.7000000000000001), exact repeats, lognormal
    spreads, and with `wide` weights 10^12 and 10^-12 of the others."""
    rng = random.Random(seed)
    bases = [0.1 + 0.2, 0.3, 0.7, 0.7000000000000001, 1.0 / 3.0]
    if wide:
        bases += [1e12, 1e-12, 1.0]
    weights = []
    for _ in range(count):
        w = rng.choice(bases)
        kind = rng.randrange(4)
        if kind == 0:  # a few ulps either way
            for _ in range(rng.randrange(4)):
                w = math.nextafter(w, 0.0 if rng.randrange(2) else math.inf)
        elif kind == 1:
            w *= math.exp(rng.uniform(-2.0, 2.0))
        weights.append(w)  # kinds 2 and 3: the base itself, repeated
    return weights


def test_blend_order_at_corpus_scale():
    """Blends of over a thousand datasets, as corpus-scale pretraining has
    them, against Megatron's own builder and BlendedDataset, sample for
    sample. The datasets are links to one small dataset (a blend may name a
    file twice; only the weights matter to the order)."""
    base = WORK / "corpus-base"
    write_megatron_dataset(base, 400, 100, 1000, numpy.uint16, seed=11, eod=EOD)
    prefixes = []
    for i in range(1024):
        prefix = WORK / f"corpus-{i}"
        for suffix in (".bin", ".idx"):
            os.symlink(f"{base}{suffix}", f"{prefix}{suffix}")
        prefixes.append(str(prefix))
    compare("corpusRecipe", prefixes, adversarial_weights(1024, 65, wide=False), 256, 1234,
            "100,0,0", (60150, 0, 0))
    # A thousand tiny shares, each rounded up, draw more than Megatron's
    # default surplus (0.005) builds: its own builder refuses that blend.
    compare("corpusWide", prefixes[:1000], adversarial_weights(1000, 66, wide=True), 256, 4321,
            "100,0,0", (60150, 0, 0), surplus=0.05)


# Megatron's cache (--data-cache-path): the "three" case's indices are read
# from the files Megatron wrote, and only when they hold up.
def pretraining_with_cache(name, cache):
    out = WORK / name
    out.mkdir()
    config = out / "daemon.conf"
    config.write_text(job_config("three", DATASETS, [2.0, 1.0, 5.0], 96, 99, "80,15,5",
                                 (8000, 400, 120), "SPLIT_TRAIN", f'cache_dir: "{cache}"'))
    return out, CHECKS.run("pretraining-samples", "--config", str(config), "--indices-dir", str(out),
                        "--tokens", str(out / "tokens.npy"), "--count", "10", ok=False)


def describes_three_ds0(path):
    description = json.loads(path.read_text())
    return (description["dataset_path"] == DATASETS[0] and description["sequence_length"] == 96
            and description["random_seed"] == 99)


def test_megatrons_cache_is_read_and_checked():
    MEGATRON_CACHE = WORK / "megatron-cache"
    out, read = pretraining_with_cache("cached", MEGATRON_CACHE)
    check("Megatron's cache is read for every dataset",
          read.returncode == 0 and read.stdout.count("read from Megatron's cache") == 3, read.stdout)
    TAMPERED = WORK / "tampered-cache"
    shutil.copytree(MEGATRON_CACHE, TAMPERED)


    shuffle_file = next(
        f.parent / f.name.replace("description.txt", "shuffle_index.npy")
        for f in TAMPERED.glob("*-GPTDataset-train-description.txt") if describes_three_ds0(f))
    shuffle = numpy.load(shuffle_file)
    shuffle[[0, 1]] = shuffle[[1, 0]]  # still a permutation, not what packfeed builds
    numpy.save(shuffle_file, shuffle)
    out, read = pretraining_with_cache("tampered", TAMPERED)
    check("a cached index is used as Megatron cached it",
          read.returncode == 0 and numpy.array_equal(numpy.load(out / "0-shuffle_index.npy"), shuffle),
          read.stderr)
    shuffle[1] = shuffle[0]  # no longer a permutation
    numpy.save(shuffle_file, shuffle)
    out, read = pretraining_with_cache("corrupt", TAMPERED)
    check("a cached index that does not fit is refused, naming the file",
          read.returncode != 0 and "DATA_LOSS" in read.stderr
          and shuffle_file.name.split("-")[0] in read.stderr
          and "shuffle index is not a permutation" in read.stderr and not (out / "tokens.npy").exists(), read.stderr)


# ---- served by a real packfeedd to every rank of TP2 x PP2 x CP2 x DP2 ----
GET_BATCH_016 = GetBatch016(
    pathlib.Path(sys.modules["megatron"].__path__[0], "core", "utils.py").read_text())
MEGATRON_016_KEYS = GetBatch016.KEYS

TP, PP, CP, DP = 2, 2, 2, 2
MBS, GBS, SEQ, SEED, STEPS = 2, 16, 64, 4321, 3
# (With "969,30,1" the smallest dataset's test split is empty, on which
# Megatron's epoch count never ends.)
SPLIT = "90,8,2"
WEIGHTS = [2.0, 1.0, 5.0]


def served_job(topology, pretraining, samples=(GBS * 20, GBS, GBS)):
    """The job "gpt" a daemon serves: the WEIGHTS blend of DATASETS, seq SEQ,
    global batch GBS, micro batch MBS, SPLIT, with `pretraining`'s options."""
    datasets = "\n".join(f'  datasets {{ prefix: "{p}" weight: {w} '
                         'kind: DATASET_KIND_PRETRAINING }' for p, w in zip(DATASETS, WEIGHTS))
    return f"""jobs {{
  name: "gpt"
{datasets}
  topology {{ {topology} }}
  global_batch: {GBS}
  seq_length: {SEQ}
  seed: {SEED}
  eod_id: {EOD}
  pretraining {{ split: "{SPLIT}" train_samples: {samples[0]} valid_samples: {samples[1]}
                 test_samples: {samples[2]} micro_batch_size: {MBS} {pretraining} }}
}}
"""


def megatron_train(reset_position_ids, eod_mask_loss, reset_attention_mask=False):
    config = GPTDatasetConfig(
        random_seed=SEED, sequence_length=SEQ, blend=(DATASETS, WEIGHTS), split=SPLIT,
        path_to_cache=str(WORK / "megatron-cache"), tokenizer=Tokenizer(EOD),
        reset_position_ids=reset_position_ids, reset_attention_mask=reset_attention_mask,
        eod_mask_loss=eod_mask_loss)
    return Builder(GPTDataset, [GBS * 20, GBS, GBS], lambda: True, config).build()[0]


def document_starts(mask):
    """Where each document of a sample starts, read off Megatron's [1, s, s]
    attention mask (True = masked): the rows whose first visible column is
    their own."""
    visible = ~mask[0].numpy()
    return [k for k in range(visible.shape[0]) if visible[k].argmax() == k]


def expected_batch(train, step, microbatch, dp, cp, consumed, cp_size=CP, thd=False):
    """What Megatron's pretraining sampler, collate and get_batch_on_this_cp_rank
    hand rank (dp, cp): [MBS, SEQ / CP] per field; with `thd` (document
    masks, CP 1) the same tokens as [1, MBS * SEQ] and the cu_seqlens of
    Megatron's attention mask."""
    first = consumed + step * GBS + (microbatch * DP + dp) * MBS
    items = [train[first + b] for b in range(MBS)]
    out = {}
    for key in ("tokens", "labels", "loss_mask", "position_ids"):
        batch = numpy.stack([item[key].numpy() for item in items])
        chunks = batch.reshape(MBS, 2 * cp_size, SEQ // (2 * cp_size))
        out[key] = chunks[:, [cp, 2 * cp_size - 1 - cp], :].reshape(MBS, SEQ // cp_size)
        if thd:
            out[key] = out[key].reshape(1, MBS * SEQ)
    if thd:
        starts = [b * SEQ + k for b, item in enumerate(items)
                  for k in document_starts(item["attention_mask"])]
        out["cu_seqlens"] = numpy.array(starts + [MBS * SEQ], dtype=numpy.int32)
    return out


def serve_and_compare(name, consumed, reset_position_ids, eod_mask_loss, cp_size=CP, thd=False):
    train = megatron_train(reset_position_ids, eod_mask_loss, thd)
    flags = (f"reset_position_ids: {str(reset_position_ids).lower()} "
             f"eod_mask_loss: {str(eod_mask_loss).lower()} "
             f"reset_attention_mask: {str(thd).lower()}")
    config = served_job(f"tp: {TP} pp: {PP} cp: {cp_size} dp: {DP}",
                        f"consumed_samples: {consumed} {flags}")
    ranks = range(TP * PP * cp_size * DP)
    (WORK / name).mkdir()
    with Daemon(os.path.dirname(CTL), config, workdir=WORK / name) as daemon:
        dumps = daemon.dump_ranks("gpt", ranks, STEPS)
        job = next(j for j in daemon.ctl_json("stats")["jobs"] if j["name"] == "gpt")
        if PYTHON_DIR:
            if not thd:
                python_client_step(daemon.socket, train, consumed)
            dropin_016_step(daemon.socket, train, consumed, cp_size, thd)
    microbatches = GBS // (MBS * DP)
    for rank in ranks:
        tp, cp = rank % TP, (rank // TP) % cp_size
        dp, pp = (rank // (TP * cp_size)) % DP, rank // (TP * cp_size * DP)
        fields = (["tokens", "position_ids"] if pp == 0 else []) + \
            (["labels", "loss_mask"] if pp == PP - 1 else []) + (["cu_seqlens"] if thd else [])
        wrong = []
        steps = dumps[rank]["steps"]
        check(f"{name} rank {rank}: {STEPS} steps of {microbatches} microbatches",
              len(steps) == STEPS and all(len(st["microbatches"]) == microbatches
                                          for st in steps))
        # The step a batch is checked against is the one the rank asked for
        # in turn, not the number the daemon stamped on it.
        check(f"{name} rank {rank}: steps numbered 0 to {STEPS - 1} in order",
              [st["step"] for st in steps] == list(range(len(steps))),
              [st["step"] for st in steps])
        for index, st in enumerate(steps):
            for m, got in enumerate(st["microbatches"]):
                want = expected_batch(train, index, m, dp, cp, consumed, cp_size, thd)
                for key in fields:
                    served = numpy.asarray(got.get(key, []), dtype=want[key].dtype)
                    if served.size != want[key].size or not numpy.array_equal(
                            served.reshape(want[key].shape), want[key]):
                        wrong.append(f"step {st['step']} mb {m} {key}")
                for key in {"tokens", "position_ids", "labels", "loss_mask"} - set(fields):
                    if key in got:
                        wrong.append(f"{key} sent to stage {pp}")
        if not thd and "cu_seqlens" in steps[0]["microbatches"][0]:
            wrong.append("cu_seqlens in a BSHD batch")
        check(f"{name} rank {rank} (tp {tp} cp {cp} dp {dp} pp {pp}) equals Megatron's batch",
              not wrong, wrong[:5])
    amplification = float(job.get("io_amplification", 0))
    print(f"{name}: I/O amplification {amplification:.3f} "
          f"({job.get('bytes_read')} B read for {job.get('unique_bytes_needed')} B needed)")
    check(f"{name}: each byte read once for {len(ranks)} ranks", 0 < amplification <= 1.05, job)


def python_client_step(socket, train, consumed):
    """Ranks 4 (first stage, cp 0, dp 1) and 14 (last stage, cp 1, dp 1)
    through packfeed.Client, as pretrain_gpt's data iterator: step 0's
    microbatches are Megatron's batch dicts, BSHD, no packed_seq_params."""
    sys.path.insert(0, PYTHON_DIR)
    import packfeed
    for rank, keys in ((4, ("tokens", "position_ids")), (14, ("labels", "loss_mask"))):
        client = packfeed.Client("gpt", socket_path=socket, rank=rank)
        iterator, count, _, _ = client.next_step()
        dp, cp = (rank // (TP * CP)) % DP, (rank // TP) % CP
        same = 0
        for m, batch in enumerate(iterator):
            want = expected_batch(train, 0, m, dp, cp, consumed)
            same += all(numpy.array_equal(batch[k].numpy(), want[k]) for k in keys) and \
                batch["packed_seq_params"] is None and batch["cu_seqlens"] is None
        client.close()
        check(f"python client rank {rank}: {count} microbatches of [{MBS}, {SEQ // CP}]",
              same == count == GBS // (MBS * DP), f"{same} of {count}")


def dropin_016_step(socket, train, consumed, cp_size, thd):
    """A first-stage and a last-stage rank through packfeed.megatron's
    provider and get_batch_016, as a 0.16 pretrain_gpt with
    --dataloader-type external calls them: step 0's values must be 0.16's
    get_batch's, the dense attention mask included (with `thd`, each
    sample's document mask rebuilt from the THD row)."""
    sys.path.insert(0, PYTHON_DIR)
    from packfeed import megatron as packfeed_megatron
    args = types.SimpleNamespace(consumed_train_samples=consumed, consumed_valid_samples=0)
    for rank in (TP * cp_size, TP * cp_size * DP * PP - 1):
        cp, dp, pp = (rank // TP) % cp_size, (rank // (TP * cp_size)) % DP, \
            rank // (TP * cp_size * DP)
        settings = packfeed_megatron.Settings(
            micro_batch_size=MBS, seq_length=SEQ, create_attention_mask=True,
            reset_attention_mask=thd, cp_size=cp_size, cp_rank=cp)
        provider = packfeed_megatron.datasets_provider("gpt", socket_path=socket, args=args,
                                                       settings=settings, rank=rank, copy=True)
        iterators = provider([0, 0, 0])
        wrong = [] if iterators[1:] == (None, None) else ["a valid or test split not served"]
        for m in range(GBS // (MBS * DP)):
            got = packfeed_megatron.get_batch_016(iterators[0])
            # 0.16's forward_step unpacks six: packed_seq_params last, None
            # for GPTDataset's batches (they carry no cu_seqlens).
            if len(got) != 6 or got[5] is not None:
                wrong.append(f"microbatch {m}: {len(got)} values, packed_seq_params {got[-1]}")
            first = consumed + (m * DP + dp) * MBS
            want = GET_BATCH_016([train[first + b] for b in range(MBS)], stage=pp, cp_size=cp_size,
                                 cp_rank=cp)
            for key, a, b in zip(MEGATRON_016_KEYS, got, want):
                if (a is None) != (b is None) or (a is not None and (
                        a.dtype != b.dtype or a.shape != b.shape or not torch.equal(a, b))):
                    wrong.append(f"microbatch {m} {key}")
        packfeed_megatron.close()
        check(f"drop-in rank {rank} (cp {cp} dp {dp} pp {pp}{', THD served' if thd else ''}): "
              f"get_batch_016 equals Megatron 0.16's", not wrong, wrong[:5])


def test_served_batches_equal_megatrons():
    serve_and_compare("served", 0, True, True)
    # A restart from consumed_samples continues Megatron's order.
    serve_and_compare("resumed", 2 * GBS, False, False)
    # Document-masked attention (reset_attention_mask) as THD, CP 1.
    serve_and_compare("documents", 0, True, True, cp_size=1, thd=True)


def test_every_split_served():
    """serve_every_split: the same ranks read the train, valid and test
    splits at once from one job's three names, each in Megatron's sampler
    order (train and valid resumed from their consumed counts, as
    pretrain_gpt resumes them); a step past the valid split's end is
    refused, naming its size."""
    samples = [GBS * 20, GBS * 5, GBS * 2]
    config = GPTDatasetConfig(
        random_seed=SEED, sequence_length=SEQ, blend=(DATASETS, WEIGHTS), split=SPLIT,
        path_to_cache=str(WORK / "megatron-cache"), tokenizer=Tokenizer(EOD),
        reset_position_ids=False, reset_attention_mask=False, eod_mask_loss=True)
    built = Builder(GPTDataset, samples, lambda: True, config).build()
    text = served_job(f"dp: {DP}", f"eod_mask_loss: true serve_every_split: true "
                      f"consumed_samples: {GBS} consumed_valid_samples: {2 * GBS}", samples)
    reads = {"gpt": (built[0], GBS, 2), "gpt.valid": (built[1], 2 * GBS, 3),
             "gpt.test": (built[2], 0, 2)}
    (WORK / "splits").mkdir()
    with Daemon(os.path.dirname(CTL), text, workdir=WORK / "splits") as daemon:
        processes = {(job, rank): daemon.start_dump(job, rank, steps)
                     for job, (_, _, steps) in reads.items() for rank in range(DP)}
        dumps = {}
        for key, process in processes.items():
            stdout, stderr = process.communicate(timeout=120)
            check(f"splits: {key} served", process.returncode == 0, stderr[-300:])
            dumps[key] = json.loads(stdout) if process.returncode == 0 else {"steps": []}
        past = daemon.start_dump("gpt.valid", 0, 1, "--start-step", "3")
        _, past_error = past.communicate(timeout=120)
    check("splits: a step past the valid split's end is refused, naming its size",
          past.returncode != 0 and "OUT_OF_RANGE" in past_error
          and f"the valid split holds {len(built[1])} samples" in past_error, past_error[-300:])
    for (job, rank), dump in dumps.items():
        theirs, consumed, steps = reads[job]
        wrong = []
        check(f"splits: {job} rank {rank} steps 0..{steps - 1}",
              [st["step"] for st in dump["steps"]] == list(range(steps)))
        for index, st in enumerate(dump["steps"]):
            for m, got in enumerate(st["microbatches"]):
                first = consumed + index * GBS + (m * DP + rank) * MBS
                items = [theirs[first + b] for b in range(MBS)]
                for key in ("tokens", "labels", "loss_mask"):
                    want = numpy.stack([item[key].numpy() for item in items])
                    served = numpy.asarray(got[key], dtype=want.dtype).reshape(want.shape)
                    if not numpy.array_equal(served, want):
                        wrong.append(f"step {index} mb {m} {key}")
        check(f"splits: {job} rank {rank} equals Megatron's {job.partition('.')[2] or 'train'} "
              "split", not wrong, wrong[:5])



def test_a_ramping_batch_is_megatrons():
    """--rampup-batch-size, which 0.16.1 ramps: megatron-config's
    batch_schedule gives the batch Megatron-Core's own ramp-up calculator
    gives after every consumed count, and a daemon serves each step the
    microbatches Megatron's calculator and sampler make of it, from step 0,
    from a daemon resumed mid-ramp, and through the Python client attached
    at a later step's first sample."""
    from megatron.core.num_microbatches_calculator import \
        RampupBatchsizeNumMicroBatchesCalculator
    start, increment, ramp = 4, 4, 40
    printed = subprocess.run(
        [CTL, "megatron-config", "--world-size", str(DP), "--eod-id", str(EOD), "--json",
         "--megatron-core", "0.16.1", "--", "--data-path", *DATASETS, "--seq-length", str(SEQ),
         "--micro-batch-size", str(MBS), "--global-batch-size", str(GBS), "--train-samples",
         str(GBS * 20), "--rampup-batch-size", str(start), str(increment), str(ramp)],
        capture_output=True, text=True)
    check("ramp-up: megatron-config reads --rampup-batch-size", printed.returncode == 0,
          printed.stderr)
    schedule = [(int(e.get("fromSample", 0)), int(e["globalBatch"]))
                for e in json.loads(printed.stdout or "{}").get("pretraining", {})
                .get("batchSchedule", [])]

    def calculator():
        return RampupBatchsizeNumMicroBatchesCalculator(GBS, MBS, DP, False, 0, start, increment,
                                                        ramp)
    theirs = calculator()

    def batch_after(consumed):
        return max((e for e in schedule if e[0] <= consumed), default=(0, 0))[1]
    differ = []
    for consumed in range(ramp + 10):
        theirs.update(consumed, False)
        if batch_after(consumed) != theirs.get_current_global_batch_size():
            differ.append(consumed)
    check(f"ramp-up: the batch after every consumed count is Megatron's ({schedule})",
          schedule and not differ, differ[:5])

    train = megatron_train(False, False)
    entries = " ".join(f"batch_schedule {{ from_sample: {a} global_batch: {b} }}"
                       for a, b in schedule)
    steps = 8

    def megatron_steps(consumed):
        """(first sample, microbatches) of each step, as training_log's
        loop takes them: update_num_microbatches, then the sampler's next
        num_microbatches x micro_batch_size x DP samples."""
        ramping, out = calculator(), []
        for _ in range(steps):
            ramping.update(consumed, True)
            out.append((consumed, ramping.get()))
            consumed += ramping.get() * MBS * DP
        return out
    for name, consumed in (("ramp", 0), ("ramp-resumed", 12)):
        (WORK / name).mkdir()
        text = served_job(f"dp: {DP}", f"consumed_samples: {consumed} {entries}")
        want_steps = megatron_steps(consumed)
        with Daemon(os.path.dirname(CTL), text, workdir=WORK / name) as daemon:
            dumps = daemon.dump_ranks("gpt", range(DP), steps)
            if PYTHON_DIR and consumed == 0:
                sys.path.insert(0, PYTHON_DIR)
                import packfeed
                first, count = want_steps[5]
                client = packfeed.Client("gpt", socket_path=daemon.socket, rank=1,
                                         start_sample=first)
                iterator, served_count, _, _ = client.next_step()
                same = sum(numpy.array_equal(
                    batch["tokens"].numpy(),
                    numpy.stack([train[first + (m * DP + 1) * MBS + b]["tokens"].numpy()
                                 for b in range(MBS)])) for m, batch in enumerate(iterator))
                client.close()
                check(f"ramp-up: the Python client attached at sample {first} gets that step's "
                      f"{count} microbatches", same == served_count == count,
                      (same, served_count, count))
        for rank, dump in dumps.items():
            wrong = []
            for (first, count), st in zip(want_steps, dump["steps"]):
                if len(st["microbatches"]) != count:
                    wrong.append(f"step {st['step']}: {len(st['microbatches'])} microbatches, "
                                 f"Megatron takes {count}")
                for m, got in enumerate(st["microbatches"]):
                    items = [train[first + (m * DP + rank) * MBS + b] for b in range(MBS)]
                    for key in ("tokens", "labels", "loss_mask", "position_ids"):
                        want = numpy.stack([item[key].numpy() for item in items])
                        served = numpy.asarray(got[key], dtype=want.dtype)
                        if served.size != want.size or \
                                not numpy.array_equal(served.reshape(want.shape), want):
                            wrong.append(f"step {st['step']} mb {m} {key}")
            check(f"{name} from sample {consumed}: rank {rank}'s {steps} steps of "
                  f"{[c for _, c in want_steps]} microbatches are Megatron's",
                  len(dump["steps"]) == steps and not wrong, wrong[:5])



def test_balanced_keeps_each_global_batch():
    """balance_document_attention moves samples between slots, never
    between global batches: each step's samples are Megatron's."""
    train = megatron_train(False, False, True)
    config = served_job(f"dp: {DP}", "reset_attention_mask: true balance_document_attention: true")
    (WORK / "balanced").mkdir()
    with Daemon(os.path.dirname(CTL), config, workdir=WORK / "balanced") as daemon:
        dumps = daemon.dump_ranks("gpt", range(DP), STEPS)
    moved = 0
    for step in range(STEPS):
        served = sorted(tuple(mb["tokens"][b * SEQ:(b + 1) * SEQ])
                        for rank in range(DP) for mb in dumps[rank]["steps"][step]["microbatches"]
                        for b in range(MBS))
        first = step * GBS
        megatron_order = [tuple(train[first + k]["tokens"].tolist()) for k in range(GBS)]
        check(f"balanced step {step}: the global batch's samples are Megatron's",
              served == sorted(megatron_order))
        in_place = [tuple(dumps[rank]["steps"][step]["microbatches"][m]["tokens"][b * SEQ:
                                                                               (b + 1) * SEQ])
                    for m in range(GBS // (MBS * DP)) for rank in range(DP) for b in range(MBS)]
        moved += sum(a != b for a, b in zip(in_place, megatron_order))
    check("balancing moved samples between slots", moved > 0, moved)


def test_bad_input_is_refused_with_its_reason():
    # Bad input: one clear error, nothing written.
    bad = WORK / "bad.conf"
    for what, text, needle in [
        ("weights that sum to zero", job_config("w", DATASETS[:2], [0, 1.0], 64, 1, "1", (10, 0, 0),
                                                "SPLIT_TRAIN"), "weight"),
        ("a split that does not parse", job_config("s", DATASETS[:1], None, 64, 1, "9x,1", (10, 0, 0),
                                                   "SPLIT_TRAIN"), "pretraining.split"),
        ("a dataset too small for one sample",
         job_config("t", DATASETS[:1], None, 10 ** 7, 1, "1", (0, 0, 0), "SPLIT_TRAIN"),
         "fewer than one sample"),
        ("no share for the served split", job_config("v", DATASETS[:1], None, 64, 1, "1,0", (10, 0, 0),
                                                      "SPLIT_VALID"), "serve_split"),
    ]:
        bad.write_text(text)
        result = CHECKS.run("pretraining-samples", "--config", str(bad), "--tokens",
                         str(WORK / "bad.npy"), "--count", "1", ok=False)
        check(f"refuses {what}", result.returncode != 0 and needle in result.stderr, result.stderr)
        check(f"writes nothing for {what}", not (WORK / "bad.npy").exists())

    # The daemon refuses a job whose datasets cannot make a sample, naming it.
    (WORK / "refused").mkdir()
    refused = WORK / "refused" / "daemon.conf"
    refused.write_text(job_config(
        "gpt", DATASETS[:1], None, 10 ** 6, 1, "1", (0, 0, 0), "SPLIT_TRAIN"))
    code, errors = start_up_errors(os.path.dirname(CTL), refused)
    check("packfeedd refuses a dataset too small for one sample",
          code != 0 and any("fewer than one sample" in e and "gpt" in e for e in errors), errors)
