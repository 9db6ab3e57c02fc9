#!/usr/bin/env python3
"""packfeed.megatron as pretrain_gpt's data path, held to Megatron-Core
0.19.2's own code.

For every rank of a job, the drop-in (datasets_provider, then get_batch per
microbatch, as pretrain_gpt calls them with --dataloader-type external)
must return what pretrain_gpt's get_batch of Megatron-Core 0.19 returns on
that rank with Megatron's own data path: GPTDataset[i] of 0.19.2 for the
pretraining sampler's indices, torch's default_collate, then 0.19.2's
get_batch_on_this_tp_rank (TP rank 0's side: every TP rank ends with its
batch), flatten_batch_for_packed_sequences and get_batch_on_this_cp_rank,
taken by name from its megatron/core/utils.py and run as written. The
values of the ten batch keys are compared in order: None where Megatron has
None, else dtype, shape and every element.

Cases: inter-document masking under TP1 x PP3 x CP2 (a middle stage gets
cu_seqlens and max_seqlen only), resumed from consumed_train_samples, over
a step boundary; the same under PP2 x VPP2, each model chunk's iterator
from its own provider call, chunk 0 a step ahead; a BSHD job with Megatron's default dense causal mask under
PP2 x CP2 x DP2, with its valid and test splits from the same provider (the
valid split resumed from consumed_valid_samples); evaluation in 0.18's
evaluation batch (--eval-micro-batch-size, --eval-global-batch-size) under
CP2 x DP2; reset_attention_mask,
whose dense per-document mask is rebuilt from packfeed's THD row; and a
consumed count between two steps, refused with the reason.

Runs inside the venv (tests/CMakeLists.txt):
  megatron_venv.py VENV_DIR -m pytest megatron_dropin_test.py
with PF_CTL (packfeedctl), PF_MEGATRON_019_DIR (where the 0.19.2 wheel is
unpacked) and PF_PYTHON_DIR (the built packfeed package) in the
environment. Skipped only when PyPI cannot be reached.
"""
import inspect
import os
import pathlib
import sys
import tempfile
import threading
import types

import torch

from ctl_checks import checks_for_helpers
from daemon_harness import Daemon
from megatron_source import GetBatch019, write_dataset
from megatron_venv import Tokenizer, init_single_process, megatron_019_from_environment

CTL = os.environ["PF_CTL"]
SRC, Builder, GPTDataset, GPTDatasetConfig, UTILS_SOURCE = megatron_019_from_environment()
sys.path.insert(0, os.environ["PF_PYTHON_DIR"])
import packfeed  # noqa: E402
from packfeed import megatron as packfeed_megatron  # noqa: E402

EOD = 0
MBS, GBS, SEQ, SEED = 2, 16, 64, 97
SPLIT = "90,8,2"
# The running test's checks, for the helpers below.
CHECKS = check = None
bind_checks = checks_for_helpers(globals())


GET_BATCH = GetBatch019(UTILS_SOURCE, SEQ)
MEGATRON_KEYS = GetBatch019.KEYS


def megatron_get_batch(items, args, stage, cp_rank, vp_stage=None):
    """pretrain_gpt's get_batch (Megatron-Core 0.19) for the job of `args`
    on a rank of pipeline stage `stage`, CP rank `cp_rank` and model chunk
    `vp_stage` under VPP: its values in MEGATRON_KEYS' order."""
    batch = GET_BATCH(items, pp_size=args.pipeline_model_parallel_size, stage=stage,
                      cp_size=args.context_parallel_size, cp_rank=cp_rank,
                      inter_document_masking=args.dataloader_inter_document_masking,
                      vp_stage=vp_stage, vpp=args.virtual_pipeline_model_parallel_size,
                      create_attention_mask=args.create_attention_mask_in_dataloader)
    return [batch[key] for key in MEGATRON_KEYS]


def differences(got, want):
    """Where packfeed's get_batch values differ from Megatron's."""
    out = []
    for key, a, b in zip(MEGATRON_KEYS, got, want):
        if a is None or b is None:
            if a is not b:
                out.append(f"{key}: {'None' if a is None else 'a tensor'} against "
                           f"{'None' if b is None else 'a tensor'}")
        elif a.dtype != b.dtype or a.shape != b.shape or not torch.equal(a, b):
            out.append(f"{key}: {a.dtype} {tuple(a.shape)} against {b.dtype} {tuple(b.shape)}"
                       f"{'' if a.shape != b.shape else ', other values'}")
    return out


# ---- datasets, written with Megatron's own builder ----
WORK = pathlib.Path(tempfile.mkdtemp(prefix="pf-dropin-"))
init_single_process(WORK)
BLEND = ([write_dataset(str(WORK / f"web{i}"), 400, 30 + 20 * i, 31 + i, EOD) for i in range(2)],
         [1.0, 3.0])


def megatron_args(tp, pp, cp, dp, consumed_train=0, consumed_valid=0, inter_document=False,
                  reset_attention_mask=False, create_attention_mask=True, vpp=None,
                  eval_micro=MBS, eval_global=GBS):
    """pretrain_gpt's arguments as far as the data path reads them (0.19's
    argument check turns the attention mask off with inter-document masking)."""
    return types.SimpleNamespace(
        tensor_model_parallel_size=tp, pipeline_model_parallel_size=pp,
        virtual_pipeline_model_parallel_size=vpp,
        context_parallel_size=cp, data_parallel_size=dp, micro_batch_size=MBS,
        eval_micro_batch_size=eval_micro, eval_global_batch_size=eval_global,
        global_batch_size=GBS, seq_length=SEQ, consumed_train_samples=consumed_train,
        consumed_valid_samples=consumed_valid, dataloader_inter_document_masking=inter_document,
        reset_attention_mask=reset_attention_mask, reset_position_ids=reset_attention_mask,
        eod_mask_loss=True, create_attention_mask_in_dataloader=create_attention_mask
        and not inter_document)


def megatron_splits(args):
    """Megatron's own train, valid and test datasets for `args`."""
    config = GPTDatasetConfig(
        random_seed=SEED, sequence_length=SEQ, blend=BLEND, split=SPLIT,
        path_to_cache=str(WORK / "megatron-cache"), tokenizer=Tokenizer(EOD),
        reset_position_ids=args.reset_position_ids,
        reset_attention_mask=args.reset_attention_mask, eod_mask_loss=args.eod_mask_loss,
        create_attention_mask=args.create_attention_mask_in_dataloader,
        inter_document_masking=args.dataloader_inter_document_masking)
    return Builder(GPTDataset, [GBS * 20, GBS * 4, GBS * 2], lambda: True, config).build()


def job_text(args):
    prefixes, weights = BLEND
    datasets = "\n".join(
        f'  datasets {{ prefix: "{p}" weight: {w} kind: DATASET_KIND_PRETRAINING }}'
        for p, w in zip(prefixes, weights))
    flags = {"inter_document_masking": args.dataloader_inter_document_masking,
             "reset_attention_mask": args.reset_attention_mask,
             "reset_position_ids": args.reset_position_ids, "eod_mask_loss": args.eod_mask_loss}
    return f"""jobs {{
  name: "gpt"
{datasets}
  topology {{ tp: {args.tensor_model_parallel_size} pp: {args.pipeline_model_parallel_size}
             cp: {args.context_parallel_size} dp: {args.data_parallel_size}
             vpp: {args.virtual_pipeline_model_parallel_size or 1} }}
  global_batch: {GBS}
  seq_length: {SEQ}
  seed: {SEED}
  eod_id: {EOD}
  pretraining {{ split: "{SPLIT}" train_samples: {GBS * 20} valid_samples: {GBS * 4}
                 test_samples: {GBS * 2} micro_batch_size: {MBS} serve_every_split: true
                 eval_micro_batch_size: {args.eval_micro_batch_size}
                 eval_global_batch: {args.eval_global_batch_size}
                 {" ".join(f"{k}: {str(v).lower()}" for k, v in flags.items())} }}
}}
"""


def coords(rank, args):
    """(cp, dp, pp) of a global rank, TP fastest then CP, DP, PP."""
    tp, cp, dp = (args.tensor_model_parallel_size, args.context_parallel_size,
                  args.data_parallel_size)
    return (rank // tp) % cp, (rank // (tp * cp)) % dp, rank // (tp * cp * dp)


def run_ranks(socket, args, microbatches):
    """Each rank's drop-in, as pretrain_gpt drives it: the provider once,
    then get_batch `microbatches[split]` times per split; every rank on a
    thread of its own, as the ranks run at once. ({rank: {split: [values]}},
    {rank: error})."""
    world = (args.tensor_model_parallel_size * args.pipeline_model_parallel_size
             * args.context_parallel_size * args.data_parallel_size)
    out, failures = {}, {}

    def rank_main(rank):
        try:
            provider = packfeed_megatron.datasets_provider(
                "gpt", socket_path=socket, args=args, settings=settings_of(args, rank),
                rank=rank, copy=True)
            splits = ("train", "valid", "test")
            if not args.virtual_pipeline_model_parallel_size:
                iterators = dict(zip(splits, provider([0, 0, 0])))
                out[rank] = {split: [packfeed_megatron.get_batch(iterators[split])
                                     for _ in range(count)]
                             for split, count in microbatches.items()}
                return
            # Under VPP Megatron asks once per model chunk; chunk 0 here
            # takes all its microbatches before chunk 1 takes any (the
            # interleaved schedule's warm-up, stretched over a step
            # boundary). Per microbatch: each chunk's values.
            chunks = [dict(zip(splits, provider([0, 0, 0], vp_stage=k)))
                      for k in range(args.virtual_pipeline_model_parallel_size)]
            out[rank] = {split: list(zip(*[[packfeed_megatron.get_batch(c[split], k)
                                            for _ in range(count)]
                                           for k, c in enumerate(chunks)]))
                         for split, count in microbatches.items()}
        except Exception as error:  # noqa: BLE001 - reported as the rank's failure
            failures[rank] = repr(error)

    threads = [threading.Thread(target=rank_main, args=(r,)) for r in range(world)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=120)
    return out, failures


def settings_of(args, rank):
    """What settings_from_args makes of `args`, with the CP rank Megatron's
    parallel_state would answer on `rank`."""
    base = packfeed_megatron.settings_from_args(
        types.SimpleNamespace(**{**vars(args), "context_parallel_size": 1}))
    return packfeed_megatron.Settings(**{**vars(base), "cp_size": args.context_parallel_size,
                                         "cp_rank": coords(rank, args)[0]})


def serve_and_compare(name, args, microbatches):
    """Serves the job of `args`; every rank's get_batch values for
    `microbatches` = {split: count} must be Megatron's."""
    datasets = dict(zip(("train", "valid", "test"), megatron_splits(args)))
    consumed = {"train": args.consumed_train_samples, "valid": args.consumed_valid_samples,
                "test": 0}
    (WORK / name).mkdir()
    with Daemon(os.path.dirname(CTL), job_text(args), workdir=WORK / name) as daemon:
        served, failures = run_ranks(daemon.socket, args, microbatches)
        packfeed_megatron.close()
    world = (args.tensor_model_parallel_size * args.pipeline_model_parallel_size
             * args.context_parallel_size * args.data_parallel_size)
    check(f"{name}: every rank's drop-in ran", sorted(served) == list(range(world)), failures)
    documents = 0
    for rank, splits in sorted(served.items()):
        cp, dp, pp = coords(rank, args)
        wrong = []
        for split, values in splits.items():
            # Megatron evaluates in its evaluation batch.
            mbs, gbs = ((MBS, GBS) if split == "train" else
                        (args.eval_micro_batch_size, args.eval_global_batch_size))
            per_step = gbs // (mbs * args.data_parallel_size)
            for index, got in enumerate(values):
                step, m = divmod(index, per_step)
                first = consumed[split] + step * gbs + (m * args.data_parallel_size + dp) * mbs
                items = [datasets[split][first + b] for b in range(mbs)]
                chunks = args.virtual_pipeline_model_parallel_size
                for vp_stage, values in (enumerate(got) if chunks else [(None, got)]):
                    want = megatron_get_batch(items, args, pp, cp, vp_stage)
                    where = "" if vp_stage is None else f" chunk {vp_stage}"
                    wrong += [f"{split} microbatch {index}{where}: {d}"
                              for d in differences(values, want)]
                    cu_seqlens = values[MEGATRON_KEYS.index("cu_seqlens")]
                    documents += 0 if cu_seqlens is None else cu_seqlens.numel() - 1
        check(f"{name} rank {rank} (cp {cp} dp {dp} pp {pp}): get_batch equals Megatron 0.19's",
              not wrong, wrong[:5])
    return documents


def test_inter_document_masking_under_pp3_cp2():
    # Inter-document masking, TP1 x PP3 x CP2: the middle stage gets only the
    # row's cu_seqlens and max_seqlen; resumed at consumed_train_samples, 12
    # microbatches from step 2 on cross into step 3.
    args = megatron_args(1, 3, 2, 1, consumed_train=2 * GBS, inter_document=True)
    documents = serve_and_compare("inter-document", args, {"train": 12})
    check("inter-document: microbatches hold several documents each", documents > 2 * 12 * 6,
          documents)


def test_dense_mask_and_every_split():
    # Megatron's default: BSHD with the dense causal mask (cut to each CP
    # rank's rows); the valid split resumed at consumed_valid_samples, the
    # test split from 0, from the same provider.
    serve_and_compare("dense-mask", megatron_args(1, 2, 2, 2, consumed_valid=GBS),
                      {"train": 6, "valid": 4, "test": 4})


def test_evaluation_in_the_evaluation_batch():
    # 0.18's --eval-micro-batch-size 4 and --eval-global-batch-size 32 under
    # CP2 x DP2 with the dense mask: valid (resumed after one evaluation
    # iteration) and test come in Megatron's evaluation microbatches.
    serve_and_compare("eval-batch", megatron_args(1, 1, 2, 2, consumed_valid=2 * GBS,
                                                  eval_micro=2 * MBS, eval_global=2 * GBS),
                      {"train": 4, "valid": 4, "test": 4})


def test_vpp_chunks_each_from_its_provider():
    # VPP 2 over PP2 with inter-document masking: each model chunk's iterator,
    # chunk 0 running a step ahead of chunk 1; the middle chunks (stage 0's
    # second, stage 1's first) get the row's cu_seqlens and max_seqlen only.
    serve_and_compare("vpp", megatron_args(1, 2, 1, 2, inter_document=True, vpp=2), {"train": 6})


def test_document_mask_rebuilt_from_thd():
    # reset_attention_mask: the dense per-document mask rebuilt from the THD row.
    serve_and_compare("document-mask", megatron_args(2, 1, 1, 2, reset_attention_mask=True),
                      {"train": 4})


def test_provider_as_megatron_calls_it():
    """What Megatron's training loop asks of a provider: is_distributed
    (every rank builds its own iterators), a vp_stage keyword; a consumed
    count inside a step is refused, naming why, and the daemon serves on."""
    check("the provider builds on every rank (is_distributed)",
          getattr(packfeed_megatron.train_valid_test_datasets_provider, "is_distributed", False))
    check("the provider takes vp_stage, as Megatron's VPP path asserts",
          "vp_stage" in inspect.signature(
              packfeed_megatron.train_valid_test_datasets_provider).parameters)
    args = megatron_args(1, 1, 1, 2, consumed_train=GBS + MBS)
    (WORK / "refused").mkdir()
    with Daemon(os.path.dirname(CTL), job_text(args), workdir=WORK / "refused") as daemon:
        provider = packfeed_megatron.datasets_provider("gpt", socket_path=daemon.socket,
                                                       args=args, rank=0)
        try:
            provider([0, 0, 0])
            refused = "not refused"
        except packfeed.errors.InvalidArgumentError as error:
            refused = str(error)
        alive = daemon.ctl_run("health").returncode == 0
        packfeed_megatron.close()
    check("a consumed count inside a step is refused with the reason",
          "sample 18 lies inside a step" in refused and "consumed_samples" in refused, refused)
    check("the daemon serves on after refusing it", alive)
