#!/usr/bin/env python3
"""Megatron-Core 0.19.2's own hybrid-CP training loop on packfeed's plans,
against the same loop on Megatron's own HybridCPDataLoaderWrapper.

Eight processes over gloo run Megatron's forward_backward_no_pipelining with
config.hybrid_context_parallel, which is its
hybrid_context_parallel_forward_backward (groups, a barrier over DP x CP
after each, every sub-sample its own forward and backward at its
local_cp_size), for 20 global batches of a heavy-tailed blend:

- packfeed: pretrain_gpt's data path with packfeed.megatron as the drop-in
  (train_valid_test_datasets_provider, get_batch) under
  --dataloader-type single and --hybrid-context-parallel: the provider
  routes megatron.training.training's data loader builder and
  HybridCPDataLoaderWrapper to packfeedd's plans, which Megatron's own
  build_train_valid_test_data_iterators then wraps as in pretrain();
- Megatron: its GPTDataset (inter-document masking), its
  HybridCPMegatronPretrainingSampler and its HybridCPDataLoaderWrapper
  (all-gather, BalancedCPScheduler, all-to-all).

Once with DP x CP = 8 (TP 1), once with TP 2 x DP x CP 4. The model is an
embedding and a linear layer per token with a per-token cross-entropy, so
a token's loss does not depend on which ranks hold it. Checked per global
batch:
- every sub-sample runs exactly once: its gid on exactly local_cp_size
  ranks, an aligned block of the DP x CP ranks, each with the same
  local_cp_size, and the gids are Megatron's (0 .. n-1, n as many as
  Megatron's wrapper makes);
- the token count (Megatron's total_num_tokens, summed over DP x CP) equals
  Megatron's own;
- the summed loss equals Megatron's within a relative 1e-4: each side sums
  float32 per-token losses within a sub-sample part (at most 1 024 terms;
  the recursive-summation bound is 1 023 x 2^-24 ~ 6.1e-5 of the sum of
  magnitudes, and every loss is positive), then in float64.

The CUDA-placement patches (there is no GPU): torch.cuda.current_device()
answers "cpu", Tensor.cuda() is the tensor itself, and torch.tensor, zeros,
empty, ones and arange given device="cuda" make it on the CPU. No other
Megatron function is replaced.

Megatron's own path needs two stand-ins of its own (findings on 0.19.2,
docs/PRETRAINING.md): its wrapper slices every key of a sample, and
BlendedDataset's 0-d dataset_id cannot be sliced, so the reference drops
that key; and pretrain_gpt's get_batch cannot take the wrapper's 1-D
sub-samples (get_batch_on_this_tp_rank reads tokens.shape[1]), so the
reference get_batch is this test's: TP rank 0's sub-sample broadcast to
its TP peers, then Megatron's per-sequence zigzag split over the hybrid
group (padded to 2 x local_cp_size with loss_mask 0, which Megatron's own
split would refuse).

Runs inside a Python 3.12 venv with torch and megatron-core 0.19.2 from
the package index and packfeed built from source
(tests/integration/megatron_venv.py --full); skipped only when the index
cannot be reached or no Python 3.12 is installed.
"""
import json
import os
import pathlib
import signal
import subprocess
import sys
import tempfile
import time

import pytest

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
from daemon_harness import Daemon  # noqa: E402

EOD = 0
VOCAB = 512
SEQ = 512
MBS = 1


def max_per_rank(tp):
    """Megatron's --max-seqlen-per-dp-cp-rank: a whole sample fits on all
    DP x CP ranks (8 at TP 1), so sub-samples run at CP 1 to 8."""
    return SEQ // (WORLD // tp)


GBS = 16
STEPS = 20
SEED = 1234
WORLD = 8
SPLIT = "98,1,1"
TOLERANCE = 1e-4
TIMEOUT_S = 420


# ---- the datasets: a heavy-tailed blend, written by Megatron's builder ----

def write_blend(work):
    import numpy
    from megatron.core.datasets.indexed_dataset import IndexedDatasetBuilder
    prefixes = []
    for d, (documents, mean, long_every) in enumerate([(3000, 24, 9), (1500, 40, 5)]):
        random = numpy.random.RandomState(SEED + d)
        prefix = str(work / f"corpus{d}")
        builder = IndexedDatasetBuilder(f"{prefix}.bin", dtype=numpy.int32)
        for n in range(documents):
            length = int(numpy.clip(random.lognormal(numpy.log(mean), 0.9), 2, 4 * SEQ))
            if n % long_every == 0:
                length = int(random.randint(SEQ // 2, 3 * SEQ))  # the heavy tail
            tokens = random.randint(1, VOCAB, size=length)
            tokens[-1] = EOD
            builder.add_document(tokens, [length])
        builder.finalize(f"{prefix}.idx")
        prefixes.append(prefix)
    return prefixes, [1.0, 2.0]


def job_text(blend, tp, dp):
    datasets = "\n".join(
        f'  datasets {{ prefix: "{p}" weight: {w} kind: DATASET_KIND_PRETRAINING }}'
        for p, w in zip(*blend))
    return f"""jobs {{
  name: "gpt"
{datasets}
  topology {{ tp: {tp} cp: 1 dp: {dp} }}
  global_batch: {GBS}
  seq_length: {SEQ}
  seed: {SEED}
  eod_id: {EOD}
  scheduler {{ kind: "dynamic_cp" max_tokens_per_rank: {max_per_rank(tp)} }}
  pretraining {{ split: "{SPLIT}" train_samples: {GBS * STEPS} valid_samples: {GBS}
                 test_samples: {GBS} micro_batch_size: {MBS} inter_document_masking: true
                 hybrid_context_parallel: true }}
}}
"""


# ---- one rank ----

def patch_cuda_placement():
    """The CUDA-placement patches the module docstring lists (once per
    process: the ranks inherit them from the launcher)."""
    import torch
    if getattr(torch, "_pf_on_cpu", False):
        return
    torch._pf_on_cpu = True

    def on_cpu(factory):
        def make(*args, **kwargs):
            if str(kwargs.get("device", "")).startswith("cuda"):
                kwargs["device"] = "cpu"
            return factory(*args, **kwargs)
        return make

    torch.cuda.current_device = lambda: "cpu"
    torch.Tensor.cuda = lambda self, *args, **kwargs: self
    for name in ("tensor", "zeros", "empty", "ones", "arange"):
        setattr(torch, name, on_cpu(getattr(torch, name)))


def megatron_args(tp, dp):
    """pretrain_gpt's arguments as the data path reads them."""
    import types
    return types.SimpleNamespace(
        tensor_model_parallel_size=tp, pipeline_model_parallel_size=1,
        virtual_pipeline_model_parallel_size=None, context_parallel_size=1,
        data_parallel_size=dp, micro_batch_size=MBS, global_batch_size=GBS, seq_length=SEQ,
        consumed_train_samples=0, consumed_valid_samples=0,
        dataloader_inter_document_masking=True, reset_attention_mask=False,
        reset_position_ids=False, eod_mask_loss=False, create_attention_mask_in_dataloader=False,
        hybrid_context_parallel=True, dataloader_type="single", calculate_per_token_loss=True,
        iteration=0, train_samples=GBS * STEPS, skip_train=False, train_iters=STEPS,
        eval_iters=1, eval_interval=STEPS, full_validation=False, multiple_validation_sets=False,
        perform_rl_step=False, phase_transition_iterations=None, start_eval_at_iter=None,
        num_workers=0, exit_signal_handler=False, decrease_batch_size_if_needed=False,
        rank=int(os.environ["RANK"]))


class TokenModel:
    """An embedding and a linear layer per token (float32, the same
    weights on every rank and in both runs)."""

    def __new__(cls, config):
        import torch

        class Model(torch.nn.Module):
            def __init__(self):
                super().__init__()
                generator = torch.Generator().manual_seed(SEED)
                self.embedding = torch.nn.Parameter(torch.randn(VOCAB, 16, generator=generator))
                self.output = torch.nn.Parameter(torch.randn(16, VOCAB, generator=generator) / 4)
                self.config = config
                self.model_type = None

            def set_input_tensor(self, tensor):
                del tensor

            def forward(self, tokens, labels):
                logits = self.embedding[tokens.reshape(-1)] @ self.output
                return torch.nn.functional.cross_entropy(logits, labels.reshape(-1),
                                                         reduction="none")

        return Model()


def reference_get_batch(data_iterator, tp_group):
    """Megatron's side: TP rank 0's sub-sample (1-D, from its wrapper) sent
    to its TP peers, then cut to this rank's zigzag part of its hybrid
    group, padded to a multiple of 2 x local_cp_size."""
    import torch
    import torch.distributed as dist
    from megatron.core import parallel_state
    if data_iterator is not None:
        sample = next(data_iterator)
        header = torch.tensor([sample["tokens"].numel(), int(sample["local_cp_size"])])
    else:
        header = torch.zeros(2, dtype=torch.int64)
    src = parallel_state.get_tensor_model_parallel_src_rank()
    if tp_group.size() > 1:
        dist.broadcast(header, src, group=tp_group)
    length, c = int(header[0]), int(header[1])
    fields = {}
    for key, dtype in (("tokens", torch.int64), ("labels", torch.int64),
                       ("loss_mask", torch.float32)):
        value = sample[key].to(dtype) if data_iterator is not None else torch.empty(
            length, dtype=dtype)
        if tp_group.size() > 1:
            dist.broadcast(value, src, group=tp_group)
        fields[key] = value
    padded = -(-length // (2 * c)) * 2 * c
    part = padded // (2 * c)
    rank = 0
    if c > 1:
        rank = parallel_state.get_hybrid_data_context_parallel_groups(group_size=c).rank()
    out = {}
    for key, value in fields.items():
        value = torch.nn.functional.pad(value, (0, padded - length))
        out[key] = torch.cat([value[rank * part:(rank + 1) * part],
                              value[(2 * c - 1 - rank) * part:(2 * c - rank) * part]])
    return out, c


def run_rank(spec):
    """One rank of one run; writes its per-step figures to spec["out"]."""
    patch_cuda_placement()
    import torch
    import torch.distributed as dist
    from megatron.core import parallel_state
    from megatron.core.model_parallel_config import ModelParallelConfig
    from megatron.core.pipeline_parallel import schedules
    rank, tp, dp = int(os.environ["RANK"]), spec["tp"], spec["dp"]
    dist.init_process_group("gloo", init_method=f"file://{spec['work']}/pg-{spec['mode']}-{tp}",
                            rank=rank, world_size=WORLD)
    parallel_state.initialize_model_parallel(tensor_model_parallel_size=tp,
                                             hybrid_context_parallel=True)
    config = ModelParallelConfig(tensor_model_parallel_size=tp, hybrid_context_parallel=True,
                                 max_seqlen_per_dp_cp_rank=max_per_rank(tp))
    config.calculate_per_token_loss = True  # TransformerConfig's, which the schedule reads
    model = TokenModel(config)
    args = megatron_args(tp, dp)
    ran = []  # per step: [gid, local_cp_size, tokens] of each sub-sample part run here

    if spec["mode"] == "packfeed":
        from megatron.training import training
        from packfeed import megatron as packfeed_megatron
        provider = packfeed_megatron.datasets_provider(
            "gpt", socket_path=spec["socket"], args=args, rank=rank, copy=True)
        provider.is_distributed = True
        # pretrain()'s own iterator building, with --dataloader-type single.
        training.get_args = lambda: args
        train, _, _ = training.build_train_valid_test_data_iterators(provider)
        iterator = training.HybridCPDataLoaderWrapper(train, config)
        get_batch = packfeed_megatron.get_batch

        def batch_of(data_iterator):
            values = dict(zip(packfeed_megatron.BATCH_KEYS, get_batch(data_iterator)))
            c = int(values["local_cp_size"])
            group = values["hybrid_cp_group"]
            if (c > 1) != (group is not None) or (group is not None and group.size() != c):
                raise AssertionError(f"hybrid_cp_group of size "
                                     f"{None if group is None else group.size()} for CP {c}")
            return values, c
    else:
        iterator = reference_iterator(spec, args, config, rank, tp)
        tp_group = parallel_state.get_tensor_model_parallel_group()

        def batch_of(data_iterator):
            return reference_get_batch(data_iterator, tp_group)

    def forward_step(data_iterator, model_):
        values, c = batch_of(data_iterator)
        losses = model_(values["tokens"], values["labels"])
        mask = values["loss_mask"].reshape(-1).float()
        tokens = int(mask.sum())
        ran[-1].append([c, tokens])

        def loss_func(output):
            total = (output * mask).sum()
            count = mask.sum().to(torch.int)
            ran[-1][-1].append(float(total))
            return total, count, {"lm loss": (total, count)}

        return losses, loss_func

    forward_backward = schedules.get_forward_backward_func()
    steps = []
    for _ in range(STEPS):
        ran.append([])
        gids = []
        if parallel_state.get_tensor_model_parallel_rank() == 0:
            # What the schedule will take from the wrapper, peeked for the
            # check: this rank's gids, group by group.
            samples, groups = next(iterator)
            hdp = parallel_state.get_data_parallel_rank(with_context_parallel=True)
            gids = [gid for group in groups for gid in group[hdp]]
            step_iterator = iter([(samples, groups)])
        else:
            step_iterator = None
        forward_backward(forward_step_func=forward_step, data_iterator=step_iterator,
                         model=model, num_microbatches=1, seq_length=SEQ, micro_batch_size=MBS,
                         forward_only=False)
        steps.append({"gids": gids, "runs": ran[-1]})
    with open(spec["out"], "w") as out:
        json.dump({"rank": rank, "steps": steps}, out)
    dist.barrier()
    dist.destroy_process_group()


def reference_iterator(spec, args, config, rank, tp):
    """Megatron's own path: GPTDataset of the blend, its hybrid-CP sampler
    and its wrapper (on TP rank 0; the others get None, as pretrain()
    builds them)."""
    import torch
    from megatron.core import parallel_state
    from megatron.core.datasets.blended_megatron_dataset_builder import \
        BlendedMegatronDatasetBuilder
    from megatron.core.datasets.data_schedule import HybridCPDataLoaderWrapper
    from megatron.core.datasets.gpt_dataset import GPTDataset, GPTDatasetConfig
    from megatron.training.datasets.data_samplers import HybridCPMegatronPretrainingSampler

    class Tokenizer:
        vocab_size = None
        unique_identifiers = {"class": "TestTokenizer"}
        eod = EOD

    dataset_config = GPTDatasetConfig(
        random_seed=SEED, sequence_length=SEQ, blend=tuple(spec["blend"]), split=SPLIT,
        path_to_cache=os.path.join(spec["work"], "megatron-cache"), tokenizer=Tokenizer(),
        reset_position_ids=False, reset_attention_mask=False, eod_mask_loss=False,
        create_attention_mask=False, inter_document_masking=True)
    # Every rank builds (the builder meets at barriers), as pretrain() does.
    train = BlendedMegatronDatasetBuilder(GPTDataset, [GBS * STEPS, GBS, GBS], lambda: True,
                                          dataset_config).build()[0]
    if parallel_state.get_tensor_model_parallel_rank() != 0:
        return HybridCPDataLoaderWrapper(None, config)

    class WithoutDatasetId(torch.utils.data.Dataset):
        def __len__(self):
            return len(train)

        def __getitem__(self, i):
            item = dict(train[i])
            item.pop("dataset_id", None)
            return item

    sampler = HybridCPMegatronPretrainingSampler(
        total_samples=len(train), consumed_samples=0, micro_batch_size=MBS,
        global_batch_size=GBS, data_parallel_rank=parallel_state.get_data_parallel_rank(),
        data_parallel_size=parallel_state.get_data_parallel_world_size())
    loader = torch.utils.data.DataLoader(WithoutDatasetId(), batch_sampler=sampler,
                                         collate_fn=lambda x: x)
    return HybridCPDataLoaderWrapper(iter(loader), config)


# ---- the test ----

def run(mode, tp, work, blend, socket=None):
    """Runs WORLD ranks of `mode`; their per-step figures by rank."""
    dp = WORLD // tp
    specs = [{"mode": mode, "tp": tp, "dp": dp, "work": str(work), "blend": blend,
              "socket": socket, "out": str(work / f"{mode}-tp{tp}-{rank}.json"),
              "log": str(work / f"{mode}-tp{tp}-{rank}.log")} for rank in range(WORLD)]
    codes = work / f"{mode}-tp{tp}-exit-codes.json"
    started = time.monotonic()
    # One intra-op thread per rank, as torchrun sets: eight ranks' thread
    # pools on two cores spun against each other (186 s against 74 s for
    # the TP 1 case).
    env = dict(os.environ, WORLD_SIZE=str(WORLD), PF_SPECS=json.dumps(specs),
               PF_EXIT_CODES=str(codes), OMP_NUM_THREADS="1")
    # A process group of their own, so a timeout kills every rank, but not a
    # session: a new session is a new scheduler autogroup, and with the
    # suite's niced build beside it, the packfeed TP 1 run took 82 s in an
    # autogroup of its own and 20 s in the daemon's.
    launcher = subprocess.Popen([sys.executable, __file__], env=env, process_group=0,
                                stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        launcher_log = launcher.communicate(timeout=TIMEOUT_S)[0]
    except subprocess.TimeoutExpired:
        os.killpg(launcher.pid, signal.SIGKILL)
        launcher.wait()
        pytest.fail(f"{mode} TP {tp}: ranks still running after {TIMEOUT_S} s (deadlock?)")
    assert launcher.returncode == 0 and codes.exists(), \
        f"{mode} TP {tp}: the launcher failed:\n{launcher_log[-2500:]}"
    outcome = json.loads(codes.read_text())
    logs = [pathlib.Path(spec["log"]).read_text(errors="replace") for spec in specs]
    failed = [r for r, code in enumerate(outcome["codes"]) if code and r not in outcome["killed"]]
    # The rank that failed first (any other lost its peer).
    first = next((r for r in failed if "closed by peer" not in logs[r]), failed[0] if failed else 0)
    assert not failed, f"{mode} TP {tp}: ranks {failed} failed; rank {first}:\n{logs[first][-2500:]}"
    print(f"{mode}, TP {tp}: {STEPS} global batches in {time.monotonic() - started:.0f} s")
    return [json.loads(pathlib.Path(spec["out"]).read_text()) for spec in specs]


def launch_ranks(specs, exit_codes):
    """Imports torch and Megatron once, then forks one process per rank,
    each writing its output to its spec's log: importing them takes about
    11 CPU-s, which eight fresh interpreters per run paid eight times.
    Once a rank fails the others are killed, as they would wait on it in
    their collectives until gloo's 30-minute timeout. Writes the exit codes
    in rank order, and the ranks it killed, to exit_codes as JSON."""
    import traceback
    patch_cuda_placement()
    import megatron.core.pipeline_parallel.schedules  # noqa: F401
    import megatron.training.training  # noqa: F401
    sys.stdout.flush()  # nothing buffered may reach the ranks' logs
    sys.stderr.flush()
    ranks = {}
    for rank, spec in enumerate(specs):
        # Opened here, so a rank killed before it ran still has a log.
        log = os.open(spec["log"], os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        pid = os.fork()
        if pid == 0:
            code = 1
            try:
                os.dup2(log, 1)
                os.dup2(log, 2)
                os.environ["RANK"] = str(rank)
                run_rank(spec)
                code = 0
            except BaseException:
                traceback.print_exc()
            finally:
                sys.stdout.flush()
                sys.stderr.flush()
                os._exit(code)
        os.close(log)
        ranks[pid] = rank
    codes, killed = [None] * len(specs), []
    while ranks:
        pid, status = os.wait()
        rank = ranks.pop(pid)
        codes[rank] = os.waitstatus_to_exitcode(status)
        if codes[rank] and rank not in killed:
            for other_pid, other in ranks.items():
                if other not in killed:
                    os.kill(other_pid, signal.SIGKILL)
                    killed.append(other)
    pathlib.Path(exit_codes).write_text(json.dumps({"codes": codes, "killed": killed}))


def step_totals(ranks, step):
    """(tokens, loss) of a step over every rank that computes the loss
    (TP rank 0 of each DP x CP rank: its TP peers compute the same)."""
    tokens = loss = 0
    for data in ranks:
        for run_ in data["steps"][step]["runs"]:
            tokens += run_[1]
            loss += run_[2]
    return tokens, loss


@pytest.mark.parametrize("tp", [1, 2])
def test_hybrid_cp_runs_megatron_loop_on_packfeed_plans(tp, checks):
    work = pathlib.Path(tempfile.mkdtemp(prefix=f"pf-hybrid-{tp}-"))
    blend = write_blend(work)
    dp = WORLD // tp
    reference = run("megatron", tp, work, blend)
    with Daemon(BIN_DIR, job_text(blend, tp, dp), workdir=work) as daemon:
        ours = run("packfeed", tp, work, blend, socket=daemon.socket)
    hdp_of = {rank: rank // tp for rank in range(WORLD)}
    loss_ranks_ours = [d for d in ours if d["rank"] % tp == 0]
    loss_ranks_ref = [d for d in reference if d["rank"] % tp == 0]
    for step in range(STEPS):
        # Every sub-sample exactly once, on an aligned block of local_cp_size ranks.
        holders = {}
        for data in ours:
            if data["rank"] % tp:
                continue
            runs = data["steps"][step]["runs"]
            gids = data["steps"][step]["gids"]
            checks.check(len(runs) == len(gids),
                         f"step {step} rank {data['rank']}: {len(runs)} forwards for "
                         f"{len(gids)} sub-samples")
            for gid, run_ in zip(gids, runs):
                holders.setdefault(gid, []).append((hdp_of[data["rank"]], run_[0]))
        ref_count = sum(len(d["steps"][step]["gids"]) for d in loss_ranks_ref)
        ref_gids = {g for d in loss_ranks_ref for g in d["steps"][step]["gids"]}
        checks.check(sorted(holders) == list(range(len(ref_gids))),
                     f"step {step}: packfeed ran gids {sorted(holders)[:5]}.. "
                     f"({len(holders)}), Megatron {len(ref_gids)} sub-samples "
                     f"({ref_count} parts)")
        for gid, held in holders.items():
            sizes = {c for _, c in held}
            ranks = sorted(r for r, _ in held)
            c = held[0][1]
            checks.check(len(sizes) == 1 and len(ranks) == c and ranks[0] % c == 0
                         and ranks == list(range(ranks[0], ranks[0] + c)),
                         f"step {step} gid {gid}: on DP x CP ranks {ranks} with local_cp_size "
                         f"{sorted(sizes)}")
        # A TP peer runs its TP rank 0's sub-samples, in the same order.
        for data in ours:
            if data["rank"] % tp:
                first = ours[data["rank"] - data["rank"] % tp]["steps"][step]["runs"]
                checks.check(data["steps"][step]["runs"] == first,
                             f"step {step} rank {data['rank']}: ran other sub-samples than "
                             f"its TP rank 0")
        tokens, loss = step_totals(loss_ranks_ours, step)
        ref_tokens, ref_loss = step_totals(loss_ranks_ref, step)
        checks.check(tokens == ref_tokens,
                     f"step {step}: {tokens} tokens, Megatron's wrapper {ref_tokens}")
        checks.check(abs(loss - ref_loss) <= TOLERANCE * abs(ref_loss),
                     f"step {step}: loss {loss!r}, Megatron's wrapper {ref_loss!r}")


BIN_DIR = None


@pytest.fixture(autouse=True)
def _bin_dir(bin_dir):
    global BIN_DIR
    BIN_DIR = bin_dir


if __name__ == "__main__" and "PF_SPECS" in os.environ:
    launch_ranks(json.loads(os.environ["PF_SPECS"]), os.environ["PF_EXIT_CODES"])
