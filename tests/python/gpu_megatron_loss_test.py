"""GPU: the proof a Megatron team asks for first. A tiny Megatron-Core
0.19.2 GPTModel is trained for 20 iterations twice, in deterministic mode,
from the same initial weights: once on Megatron's own data path
(GPTDataset[i] for the pretraining sampler's indices, torch's
default_collate, then 0.19.2's get_batch_on_this_tp_rank,
flatten_batch_for_packed_sequences and get_batch_on_this_cp_rank, as
pretrain_gpt's get_batch runs them), once on packfeed's drop-in
(packfeed.megatron's provider and get_batch against a packfeedd). The loss
of every iteration must be bitwise equal; so must every batch, which says
where a difference came from. Then the same with inter-document masking
(THD rows with cu_seqlens).

Megatron-Core's local attention refuses packed sequences, and Transformer
Engine is not on the GPU machine, so the inter-document run gives both
paths the same stand-in core attention (causal within each document of
cu_seqlens, in plain torch); everything else is Megatron's.

Not pretrain() itself: megatron.training imports transformers, wandb and
accelerate, which the machine lacks and cannot fetch. The loop here is
pretrain_gpt's forward_step and loss_func for TP = PP = CP = DP = 1, with a
plain torch optimizer.

Environment: PF_BIN_DIR, PF_SOURCE_ROOT (pf_test_support); megatron-core
0.19.2 installed (run_gpu_checks.sh installs it from the Python bundle's
wheels) or unpacked at PF_MEGATRON_019_DIR. Skips (77) without a CUDA
device; fails when megatron-core cannot be imported.

PF_MEGATRON_LOSS_DEVICE=cpu rehearses the whole test on the CPU, for a
machine with torch >= 2.6 but no GPU (tests/gpu/rehearse_megatron_loss_on_cpu.sh):
gloo, Megatron's CUDA RNG tracker replaced by a no-op (dropout is 0) and
torch.cuda.current_device() answering "cpu". It proves the code paths and
the batches; only the CUDA run is the proof of the losses."""
import contextlib
import math
import os
import pathlib
import sys
import tempfile
import unittest

# cuBLAS is deterministic only with a fixed workspace, set before CUDA starts.
os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")

import torch  # noqa: E402
from torch.utils.data import default_collate  # noqa: E402

from daemon_harness import Daemon  # noqa: E402
from pf_test_support import BIN_DIR, main  # noqa: E402

DEVICE = os.environ.get("PF_MEGATRON_LOSS_DEVICE", "cuda")
ITERATIONS = 20
EOD = 0
MBS, GBS, SEQ, SEED = 2, 8, 128, 1234
SPLIT = "90,8,2"
VOCAB = 50048  # megatron_source.write_dataset draws ids below 50 000
# pretrain_gpt's BATCH_KEYS (0.19), the order its get_batch returns them in.
KEYS = ("attention_mask", "cu_seqlens", "cu_seqlens_padded", "hybrid_cp_group", "labels",
        "local_cp_size", "loss_mask", "max_seqlen", "position_ids", "tokens")


class DocumentCausalAttention(torch.nn.Module):
    """The stand-in core attention of a THD row (both paths use it): causal
    attention within each document of packed_seq_params.cu_seqlens_q;
    query, key and value are [tokens, heads, head size]."""

    def __init__(self, config, layer_number, attn_mask_type, attention_type, **_):
        super().__init__()
        self.scale = config.softmax_scale or 1.0 / math.sqrt(config.kv_channels)

    def forward(self, query, key, value, attention_mask, attn_mask_type=None,
                attention_bias=None, packed_seq_params=None):
        bounds = packed_seq_params.cu_seqlens_q.tolist()
        out = torch.zeros_like(query)
        for begin, end in zip(bounds, bounds[1:]):
            if end == begin:
                continue
            q, k, v = (x[begin:end].transpose(0, 1).float() for x in (query, key, value))
            scores = torch.matmul(q, k.transpose(1, 2)) * self.scale
            future = torch.ones(end - begin, end - begin, dtype=torch.bool,
                                device=q.device).triu(1)
            scores = scores.masked_fill(future, float("-inf"))
            out[begin:end] = torch.matmul(scores.softmax(-1), v).transpose(0, 1).to(query.dtype)
        return out


@unittest.skipIf(DEVICE == "cuda" and not torch.cuda.is_available(),
                 "no CUDA device on this machine")
class MegatronLossTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        if os.environ.get("PF_MEGATRON_019_DIR"):
            sys.path.insert(0, os.environ["PF_MEGATRON_019_DIR"])
        from megatron.core import parallel_state, tensor_parallel
        cls.parallel_state, cls.tensor_parallel = parallel_state, tensor_parallel
        cls.work = pathlib.Path(tempfile.mkdtemp(prefix="pf-megatron-loss-"))
        if DEVICE == "cuda":
            torch.cuda.set_device(0)
        else:
            torch.cuda.current_device = lambda: DEVICE
        torch.distributed.init_process_group(
            "nccl" if DEVICE == "cuda" else "gloo", init_method=f"file://{cls.work}/pg", rank=0, world_size=1)
        parallel_state.initialize_model_parallel(1, 1)
        # Warn, not fail, on an op without a deterministic kernel: the losses'
        # bitwise equality is the check.
        torch.use_deterministic_algorithms(True, warn_only=True)
        from megatron_source import write_dataset
        cls.prefix = str(cls.work / "web")
        write_dataset(cls.prefix, 600, 60, 31, EOD)

    @classmethod
    def tearDownClass(cls):
        cls.parallel_state.destroy_model_parallel()
        torch.distributed.destroy_process_group()

    # ---- the model and the loop: the same for both data paths ----
    def model(self, inter_document):
        from megatron.core.models.gpt import GPTModel
        from megatron.core.models.gpt.gpt_layer_specs import get_gpt_layer_local_spec
        from megatron.core.transformer.transformer_config import TransformerConfig
        torch.manual_seed(SEED)
        if DEVICE == "cuda":
            self.tensor_parallel.model_parallel_cuda_manual_seed(SEED)
        else:
            self.tensor_parallel.get_cuda_rng_tracker().fork = contextlib.nullcontext
        config = TransformerConfig(
            num_layers=2, hidden_size=64, num_attention_heads=4, ffn_hidden_size=256,
            use_cpu_initialization=True, deterministic_mode=True, hidden_dropout=0.0,
            attention_dropout=0.0, params_dtype=torch.float32, pipeline_dtype=torch.float32)
        spec = get_gpt_layer_local_spec()
        if inter_document:
            spec.submodules.self_attention.submodules.core_attention = DocumentCausalAttention
        return GPTModel(config=config, transformer_layer_spec=spec, vocab_size=VOCAB,
                        max_sequence_length=SEQ).to(DEVICE)

    def train(self, batches, inter_document):
        """The loss of each iteration, as Megatron reports it (Σ loss ×
        mask / Σ mask over the global batch), for `batches`: per iteration
        its microbatches, each the values of KEYS."""
        from megatron.core.packed_seq_params import PackedSeqParams
        model = self.model(inter_document)
        optimizer = torch.optim.Adam(model.parameters(), lr=1e-3, foreach=False)
        losses = []
        for microbatches in batches:
            optimizer.zero_grad(set_to_none=True)
            tokens = sum(mb[KEYS.index("loss_mask")].sum() for mb in microbatches)
            total = torch.zeros((), device=DEVICE)
            for values in microbatches:
                batch = dict(zip(KEYS, values))
                packed = None
                if inter_document:
                    cu_seqlens = batch["cu_seqlens"].view(-1)
                    longest = int(batch["max_seqlen"].view(-1)[0])
                    packed = PackedSeqParams(qkv_format="thd", cu_seqlens_q=cu_seqlens,
                                             cu_seqlens_kv=cu_seqlens, max_seqlen_q=longest,
                                             max_seqlen_kv=longest)
                per_token = model(batch["tokens"], batch["position_ids"],
                                  batch["attention_mask"], labels=batch["labels"],
                                  packed_seq_params=packed)
                loss = (per_token.float().view(-1) * batch["loss_mask"].float().view(-1)).sum()
                (loss / tokens).backward()
                total += loss.detach()
            optimizer.step()
            losses.append((total / tokens).item())
        return losses

    # ---- the two data paths ----
    def megatron_batches(self, args):
        from megatron.core import utils
        from megatron.core.datasets.blended_megatron_dataset_builder import (
            BlendedMegatronDatasetBuilder)
        from megatron.core.datasets.gpt_dataset import GPTDataset, GPTDatasetConfig
        from megatron_venv import Tokenizer
        config = GPTDatasetConfig(
            random_seed=SEED, sequence_length=SEQ, blend=([self.prefix], None), split=SPLIT,
            path_to_cache=str(self.work / f"cache-{args['inter_document']}"),
            tokenizer=Tokenizer(EOD), reset_position_ids=False, reset_attention_mask=False,
            eod_mask_loss=True, create_attention_mask=not args["inter_document"],
            inter_document_masking=args["inter_document"])
        train = BlendedMegatronDatasetBuilder(
            GPTDataset, [GBS * ITERATIONS, GBS, GBS], lambda: True, config).build()[0]
        out = []
        for iteration in range(ITERATIONS):
            microbatches = []
            for first in range(iteration * GBS, (iteration + 1) * GBS, MBS):
                batch = default_collate([train[i] for i in range(first, first + MBS)])
                # pretrain_gpt's get_batch: TP rank 0 moves the batch to the GPU.
                batch = {key: None if batch.get(key) is None else batch[key].to(DEVICE)
                         for key in KEYS}
                batch = utils.get_batch_on_this_tp_rank(
                    batch, has_cu_seqlens=args["inter_document"], is_hybrid_cp=False,
                    create_attention_mask_in_dataloader=not args["inter_document"],
                    broadcast_src_rank=0, broadcast_group=None, cp_size=1, tp_rank=0,
                    micro_batch_size=MBS, seq_length=SEQ, mtp_on_this_rank=False,
                    pipeline_model_parallel_size=1, is_pipeline_first_stage=True,
                    is_pipeline_last_stage=True)
                batch = utils.flatten_batch_for_packed_sequences(batch)
                batch = utils.get_batch_on_this_cp_rank(
                    batch, is_hybrid_cp=False,
                    cp_group=self.parallel_state.get_context_parallel_group(),
                    hybrid_cp_group_func=None,
                    use_per_sequence_balancing=args["inter_document"])
                microbatches.append([batch[key] for key in KEYS])
            out.append(microbatches)
        return out

    def packfeed_batches(self, args):
        import types
        from packfeed import megatron as packfeed_megatron
        inter = str(args["inter_document"]).lower()
        job = f"""jobs {{
  name: "gpt"
  datasets {{ prefix: "{self.prefix}" kind: DATASET_KIND_PRETRAINING }}
  topology {{ tp: 1 pp: 1 cp: 1 dp: 1 }}
  global_batch: {GBS}
  seq_length: {SEQ}
  seed: {SEED}
  eod_id: {EOD}
  pretraining {{ split: "{SPLIT}" train_samples: {GBS * ITERATIONS} valid_samples: {GBS}
                 test_samples: {GBS} micro_batch_size: {MBS} eod_mask_loss: true
                 inter_document_masking: {inter} }}
}}
"""
        megatron_args = types.SimpleNamespace(
            tensor_model_parallel_size=1, pipeline_model_parallel_size=1,
            virtual_pipeline_model_parallel_size=None, context_parallel_size=1,
            data_parallel_size=1, micro_batch_size=MBS, global_batch_size=GBS,
            seq_length=SEQ, consumed_train_samples=0, consumed_valid_samples=0,
            dataloader_inter_document_masking=args["inter_document"],
            reset_attention_mask=False, reset_position_ids=False, eod_mask_loss=True,
            create_attention_mask_in_dataloader=not args["inter_document"])
        name = f"inter{int(args['inter_document'])}"
        with Daemon(BIN_DIR, job, name=name, workdir=self.work) as daemon:
            provider = packfeed_megatron.datasets_provider(
                "gpt", socket_path=daemon.socket, args=megatron_args, rank=0, device=DEVICE,
                copy=True)
            train, _, _ = provider(None)
            out = [[packfeed_megatron.get_batch(train) for _ in range(GBS // MBS)]
                   for _ in range(ITERATIONS)]
            packfeed_megatron.close()
        return out

    def first_difference(self, megatron, packfeed):
        for iteration, (a, b) in enumerate(zip(megatron, packfeed)):
            for m, (x, y) in enumerate(zip(a, b)):
                for key, u, v in zip(KEYS, x, y):
                    if (u is None) != (v is None) or (u is not None and (
                            u.dtype != v.dtype or u.shape != v.shape
                            or not torch.equal(u.cpu(), v.cpu()))):
                        return f"iteration {iteration} microbatch {m} {key}"
        return None

    def check(self, inter_document):
        args = {"inter_document": inter_document}
        megatron, packfeed = self.megatron_batches(args), self.packfeed_batches(args)
        self.assertIsNone(self.first_difference(megatron, packfeed),
                          "packfeed's batch differs from Megatron's")
        want, got = self.train(megatron, inter_document), self.train(packfeed, inter_document)
        kind = "inter-document masking" if inter_document else "dense causal mask"
        for iteration, (a, b) in enumerate(zip(want, got)):
            print(f"{kind} iteration {iteration}: Megatron {a.hex()} packfeed {b.hex()}")
        self.assertEqual([a.hex() for a in want], [b.hex() for b in got])
        self.assertLess(got[-1], got[0], "the loss should fall over 20 iterations")

    def test_losses_are_bitwise_equal_with_the_dense_causal_mask(self):
        self.check(inter_document=False)

    def test_losses_are_bitwise_equal_with_inter_document_masking(self):
        self.check(inter_document=True)


if __name__ == "__main__":
    main()
