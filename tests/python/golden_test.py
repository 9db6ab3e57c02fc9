"""Golden through Python: packfeed.Client, one per global rank, on
tests/fixtures/golden/E1 and E4 yields torch tensors equal to what
Megatron-LM handed each rank, with Megatron's dtypes and shapes."""
import json
import unittest

import torch

import packfeed
from daemon_golden_test import job_config
from pf_test_support import BIN_DIR, Daemon, golden_fixtures, main

PER_TOKEN = ("tokens", "labels", "loss_mask", "position_ids", "padding_mask")
DTYPES = {"tokens": torch.int64, "labels": torch.int64, "loss_mask": torch.float32,
          "position_ids": torch.int64, "padding_mask": torch.bool, "cu_seqlens": torch.int32,
          "cu_seqlens_padded": torch.int32, "max_seqlen": torch.int32,
          "local_cp_size": torch.int32}


class GoldenThroughPythonTest(unittest.TestCase):
    def check_case(self, case):
        fixtures = golden_fixtures()
        golden = json.loads((fixtures / f"{case}.json").read_text())
        config = golden["config"]
        with Daemon(BIN_DIR, job_config(case, fixtures / case, config), name=case) as daemon:
            clients = {r: packfeed.Client(case, rank=r, socket_path=daemon.socket)
                       for r in range(config["world_size"])}
            for expected in golden["ranks"]:
                rank = expected["rank"]
                iterator, count, seqlen_sum, seqlen_squared_sum = clients[rank].next_step()
                self.assertEqual(count, expected["M"])
                self.assertEqual(len(iterator), expected["M"])
                self.assertEqual(seqlen_sum, golden["flops"]["seqlen_sum"])
                self.assertEqual(seqlen_squared_sum, golden["flops"]["seqlen_squared_sum"])
                for m, (batch, want) in enumerate(zip(iterator, expected["microbatches"])):
                    with self.subTest(case=case, rank=rank, microbatch=m):
                        self.check_batch(batch, want)
            for client in clients.values():
                client.close()

    def check_batch(self, batch, want):
        self.assertEqual(set(packfeed.MEGATRON_KEYS) - set(batch), set())
        self.assertIsNone(batch["attention_mask"])
        for name, dtype in DTYPES.items():
            tensor = batch[name]
            if want[name] is None:
                self.assertIsNone(tensor, name)
                continue
            self.assertEqual(tensor.dtype, dtype, name)
            if name in PER_TOKEN:
                self.assertEqual(tuple(tensor.shape), (1, len(want[name])), name)
                self.assertEqual(tensor[0].tolist(), want[name], name)
            elif name in ("max_seqlen", "local_cp_size"):
                self.assertEqual(tensor.dim(), 0, name)
                self.assertEqual(int(tensor), int(want[name]), name)
            else:
                self.assertEqual(tensor.tolist(), want[name], name)
        params = batch["packed_seq_params"]
        self.assertEqual(params["qkv_format"], "thd")
        self.assertEqual(params["max_seqlen_q"], int(want["max_seqlen"]))
        self.assertTrue(torch.equal(params["cu_seqlens_kv_padded"], batch["cu_seqlens_padded"]))

    def test_e1_dp_balanced_tp2_sequence_parallel_cp2_dp2(self):
        self.check_case("E1")

    def test_e4_sft(self):
        self.check_case("E4")


if __name__ == "__main__":
    main()
