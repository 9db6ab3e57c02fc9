#!/usr/bin/env python3
"""Megatron pretraining samples, held to Megatron-Core's own code.

Installs megatron-core 0.16.1 (--no-deps) into a venv over Debian's python3
and its numpy/torch, builds Megatron's GPTDataset and BlendedDataset with
BlendedMegatronDatasetBuilder on datasets this test generates, and asserts
that `packfeedctl pretraining-samples` gives the same document, sample,
shuffle and blend indices element for element, and the same tokens and
labels for every sample it reads. Nothing expected is written by hand.

Usage: megatron_pretraining_test.py PACKFEEDCTL VENV_DIR
Exit 77 (skipped) only when PyPI cannot be reached.
"""
import json
import os
import pathlib
import subprocess
import sys
import tempfile

MEGATRON_CORE = "megatron-core==0.16.1"
SYSTEM_PYTHON = "/usr/bin/python3"  # Debian's, with numpy and torch 1.13


def ensure_venv(venv):
    python = venv / "bin" / "python"
    probe = [str(python), "-c", "import megatron.core, numpy, torch"]
    if python.exists() and subprocess.run(probe, capture_output=True).returncode == 0:
        return python
    subprocess.run([SYSTEM_PYTHON, "-m", "venv", "--system-site-packages", str(venv)],
                   check=True)
    pip = subprocess.run([str(python), "-m", "pip", "install", "-q", "--no-deps",
                          MEGATRON_CORE], capture_output=True, text=True)
    if pip.returncode != 0:
        unreachable = ("NewConnectionError", "Could not find a version", "Temporary failure",
                       "Network is unreachable", "ConnectTimeout")
        if any(s in pip.stderr for s in unreachable):
            print(f"SKIPPED: PyPI cannot be reached to install {MEGATRON_CORE}:\n{pip.stderr}")
            sys.exit(77)
        sys.exit(f"pip install {MEGATRON_CORE} failed:\n{pip.stderr}")
    return python


if os.environ.get("PF_IN_MEGATRON_VENV") != "1":
    ctl, venv = sys.argv[1], pathlib.Path(sys.argv[2])
    python = ensure_venv(venv)
    env = dict(os.environ, PF_IN_MEGATRON_VENV="1")
    sys.exit(subprocess.run([str(python), __file__, ctl], env=env).returncode)

# ---- inside the venv ----
import importlib.util  # noqa: E402
import logging  # noqa: E402
import types  # noqa: E402

import numpy  # noqa: E402


def import_megatron_datasets():
    """megatron.core.datasets without the package's __init__ (it pulls
    distributed code that needs a newer torch) or its tokenizers."""
    root = list(importlib.util.find_spec("megatron").submodule_search_locations)[0]
    for name, path in [("megatron", root), ("megatron.core", os.path.join(root, "core"))]:
        module = types.ModuleType(name)
        module.__path__ = [path]
        sys.modules[name] = module
    utils = types.ModuleType("megatron.core.utils")
    utils.log_single_rank = lambda logger, level, msg, *a, **k: logger.log(level, msg)
    sys.modules["megatron.core.utils"] = utils
    tokenizers = types.ModuleType("megatron.core.tokenizers")
    tokenizers.MegatronTokenizerBase = object
    sys.modules["megatron.core.tokenizers"] = tokenizers
    from megatron.core.datasets.blended_megatron_dataset_builder import \
        BlendedMegatronDatasetBuilder
    from megatron.core.datasets.gpt_dataset import GPTDataset, GPTDatasetConfig
    return BlendedMegatronDatasetBuilder, GPTDataset, GPTDatasetConfig


Builder, GPTDataset, GPTDatasetConfig = import_megatron_datasets()
logging.getLogger("megatron").setLevel(logging.ERROR)
CTL = sys.argv[1]
EOD = 0


class Tokenizer:
    """What the datasets ask of a tokenizer: no vocabulary size (the .idx
    names the dtype), the EOD id, no pad (Megatron then pads with -1)."""
    vocab_size = None
    eod = EOD
    unique_identifiers = {"class": "TestTokenizer"}


passed, failures = 0, []


def check(name, condition, detail=""):
    global passed
    if condition:
        passed += 1
    else:
        failures.append(f"{name}: {detail}")


def run_ctl(*args, ok=True):
    result = subprocess.run([CTL, *args], capture_output=True, text=True)
    if ok and result.returncode != 0:
        raise AssertionError(f"packfeedctl {args}: {result.stderr}")
    return result


WORK = pathlib.Path(tempfile.mkdtemp(prefix="pf-megatron-"))
# Megatron's builders ask for the rank when they cache: one process, rank 0.
import torch.distributed  # noqa: E402
torch.distributed.init_process_group("gloo", init_method=f"file://{WORK}/pg", rank=0,
                                     world_size=1)
DATASETS = []
# Small datasets (tens of thousands of tokens) so the sample counts below
# take several epochs; uint16 and int32 tokens.
for i, (count, shortest, longest, mean, vocab) in enumerate(
        [(700, 5, 300, 60, 32000), (450, 20, 500, 150, 100000), (260, 1, 100, 30, 500)]):
    prefix = WORK / f"ds{i}"
    run_ctl("make-dataset", "--out", str(prefix), "--count", str(count), "--min", str(shortest),
            "--max", str(longest), "--mean", str(mean), "--vocab", str(vocab), "--seed", str(i))
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


def megatron(prefixes, weights, seq, seed, split, samples, keep_partial):
    config = GPTDatasetConfig(
        random_seed=seed, sequence_length=seq,
        blend=(prefixes, weights), split=split,
        path_to_cache=str(WORK / "megatron-cache"), tokenizer=Tokenizer(),
        reset_position_ids=False, reset_attention_mask=False, eod_mask_loss=False,
        drop_last_partial_validation_sequence=not keep_partial)
    sizes = [s if s > 0 else None for s in samples]
    return Builder(GPTDataset, sizes, lambda: True, config).build()


def compare(name, prefixes, weights, seq, seed, split, samples, keep_partial=False):
    built = megatron(prefixes, weights, seq, seed, split, samples, keep_partial)
    for serve, theirs in zip(("SPLIT_TRAIN", "SPLIT_VALID", "SPLIT_TEST"), built):
        if theirs is None:
            continue
        label = f"{name} {serve}"
        out = WORK / f"{name}-{serve}"
        out.mkdir()
        config = out / "daemon.conf"
        config.write_text(job_config(name, prefixes, weights, seq, seed, split, samples, serve,
                                     "keep_partial_validation_sequence: true" if keep_partial
                                     else ""))
        count = min(len(theirs), 300)
        printed = run_ctl("pretraining-samples", "--config", str(config), "--indices-dir",
                          str(out), "--tokens", str(out / "tokens.npy"), "--count",
                          str(count)).stdout
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
    result = run_ctl("pretraining-samples", "--config", str(bad), "--tokens",
                     str(WORK / "bad.npy"), "--count", "1", ok=False)
    check(f"refuses {what}", result.returncode != 0 and needle in result.stderr, result.stderr)
    check(f"writes nothing for {what}", not (WORK / "bad.npy").exists())

for failure in failures:
    print("FAILED", failure)
print(f"{passed} passed, {len(failures)} failed")
sys.exit(1 if failures else 0)
