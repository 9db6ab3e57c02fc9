"""packfeed.megatron's own logic, without a daemon (a stand-in client):
the provider's model-chunk iterators under Megatron's interleaved
schedule, its refusals, and what it reads of pretrain_gpt's arguments.
What get_batch returns is held to Megatron's own code by
tests/integration/megatron_dropin_test.py and megatron_pretraining_test.py."""
import types
import unittest
from unittest import mock

import torch

from packfeed import errors
from packfeed import megatron as packfeed_megatron
from pf_test_support import main

MBS, SEQ = 1, 8


class StandInClient:
    """A client of `chunks` model chunks whose step s holds `per_step`
    microbatches; chunk k's microbatch m of step s has tokens filled with
    1000·s + 10·m + k. Records the start_sample it was attached at."""
    attached = []

    def __init__(self, job, *, socket_path=None, start_sample=None, chunks=1, per_step=3,
                 **_):
        if job.endswith(".test"):
            raise errors.NotFoundError(f"no job '{job}'")
        self.num_chunks, self.per_step, self.step = chunks, per_step, 0
        StandInClient.attached.append((job, start_sample))

    def next_step(self):
        step, self.step = self.step, self.step + 1
        iterators = [iter([self._batch(step, m, k) for m in range(self.per_step)])
                     for k in range(self.num_chunks)]
        return (iterators if self.num_chunks > 1 else iterators[0]), self.per_step, 0, 0

    @staticmethod
    def _batch(step, microbatch, chunk):
        value = 1000 * step + 10 * microbatch + chunk
        return {"tokens": torch.full((MBS, SEQ), value), "labels": None, "loss_mask": None,
                "position_ids": torch.zeros(MBS, SEQ, dtype=torch.int64), "cu_seqlens": None,
                "max_seqlen": torch.tensor(SEQ, dtype=torch.int32)}

    def close(self):
        pass


def args(**overrides):
    values = dict(micro_batch_size=MBS, seq_length=SEQ, context_parallel_size=1,
                  create_attention_mask_in_dataloader=False, reset_attention_mask=False,
                  dataloader_inter_document_masking=False, consumed_train_samples=48,
                  consumed_valid_samples=16)
    values.update(overrides)
    return types.SimpleNamespace(**values)


def provider_with(chunks, **megatron_args):
    client = lambda job, **kw: StandInClient(job, chunks=chunks, **kw)  # noqa: E731
    patch = mock.patch("packfeed.client.Client", client)
    patch.start()
    return packfeed_megatron.datasets_provider("gpt", args=args(**megatron_args)), patch


class ProviderTest(unittest.TestCase):
    def tearDown(self):
        packfeed_megatron.close()
        StandInClient.attached.clear()

    def test_each_split_starts_at_megatrons_consumed_count(self):
        provider, patch = provider_with(1)
        try:
            train, valid, test = provider([0, 0, 0])
        finally:
            patch.stop()
        self.assertEqual(StandInClient.attached, [("gpt", 48), ("gpt.valid", 16)])
        self.assertIsNone(test)  # a split the daemon does not serve
        self.assertIsNotNone(valid)
        first = [int(packfeed_megatron.get_batch(train)[-1][0, 0]) for _ in range(4)]
        self.assertEqual(first, [0, 10, 20, 1000])  # on into the next step

    def test_every_model_chunk_reads_the_same_steps_at_its_own_pace(self):
        provider, patch = provider_with(2)
        try:
            chunk0, chunk1 = provider([0, 0, 0], vp_stage=0)[0], provider([0, 0, 0],
                                                                           vp_stage=1)[0]
        finally:
            patch.stop()
        self.assertEqual(len(StandInClient.attached), 2, "one client per split, shared")
        # Chunk 0 runs two steps ahead of chunk 1, as the interleaved
        # schedule's warm-up does.
        ahead = [int(next(chunk0)["tokens"][0, 0]) for _ in range(6)]
        behind = [int(next(chunk1)["tokens"][0, 0]) for _ in range(6)]
        self.assertEqual(ahead, [0, 10, 20, 1000, 1010, 1020])
        self.assertEqual(behind, [1, 11, 21, 1001, 1011, 1021])
        steps = packfeed_megatron._SPLITS[("", "gpt", -1)]
        self.assertLessEqual(len(steps._chunks), 1, "steps both chunks passed are dropped")

    def test_a_vp_stage_the_job_does_not_have_is_refused(self):
        for chunks, vp_stage in ((2, None), (1, 0), (2, 2)):
            provider, patch = provider_with(chunks)
            try:
                with self.assertRaisesRegex(ValueError, "model chunks per stage"):
                    provider([0, 0, 0], vp_stage=vp_stage)
            finally:
                patch.stop()
                packfeed_megatron.close()

    def test_no_job_is_refused_naming_the_setting(self):
        with mock.patch.dict("os.environ", {"PACKFEED_JOB": ""}):
            provider = packfeed_megatron.datasets_provider(args=args())
            with self.assertRaisesRegex(ValueError, "PACKFEED_JOB"):
                provider([0, 0, 0])


class SettingsTest(unittest.TestCase):
    def test_inter_document_masking_makes_no_dense_mask(self):
        settings = packfeed_megatron.settings_from_args(args(
            dataloader_inter_document_masking=True, create_attention_mask_in_dataloader=True,
            reset_attention_mask=True))
        self.assertFalse(settings.create_attention_mask)
        self.assertFalse(settings.reset_attention_mask)

    def test_megatrons_default_makes_the_causal_mask(self):
        settings = packfeed_megatron.settings_from_args(args(
            create_attention_mask_in_dataloader=True))
        batch = packfeed_megatron.megatron_batch(StandInClient._batch(0, 0, 0), settings)
        mask = batch["attention_mask"]
        self.assertEqual((mask.dtype, tuple(mask.shape)), (torch.bool, (MBS, 1, SEQ, SEQ)))
        self.assertTrue(torch.equal(mask[0, 0], torch.ones(SEQ, SEQ).triu(1).bool()))
        self.assertIsNone(batch["max_seqlen"], "a BSHD batch has no max_seqlen")

    def test_get_batch_016_returns_the_six_values_its_forward_step_unpacks(self):
        # Megatron-LM 0.16's forward_step: tokens, labels, loss_mask,
        # attention_mask, position_ids, packed_seq_params = get_batch(...).
        settings = packfeed_megatron.settings_from_args(args())
        batch = packfeed_megatron.megatron_batch(StandInClient._batch(0, 0, 0), settings)
        values = packfeed_megatron.get_batch_016(iter([batch]))
        self.assertEqual(len(values), 6)
        self.assertIs(values[0], batch["tokens"])
        self.assertIsNone(values[5])


class HybridStepsTest(unittest.TestCase):
    """The daemon's hybrid-CP microbatches as Megatron's wrapper output."""

    class Client:
        """One step of two groups on dp-cp ranks 0-3, seen by rank 2: group
        0 a CP-2 group (ranks 2, 3) of gids 4 and 1, padded to 8 and 4;
        group 1 alone (CP 1) with gid 0 of 3 tokens padded to 4. With
        `again`, a third microbatch with microbatch 0's CP groups, gid 5 of
        2 tokens padded to 4, runs in group 0 after it."""

        def __init__(self, again=False):
            self.again = again

        def next_step(self):
            def microbatch(c, gids, real, padded, group):
                tokens = torch.arange(padded[-1] // c).view(1, -1) + 100 * gids[0]
                return {"tokens": tokens, "labels": tokens + 1, "loss_mask": torch.ones_like(
                    tokens, dtype=torch.float32), "position_ids": tokens, "padding_mask": None,
                        "local_cp_size": c, "sample_ids": torch.tensor(gids),
                        "hybrid_group": torch.tensor(group, dtype=torch.int32),
                        "cu_seqlens": torch.tensor(real, dtype=torch.int32),
                        "cu_seqlens_padded": torch.tensor(padded, dtype=torch.int32)}
            batches = [microbatch(2, [4, 1], [0, 7, 10], [0, 8, 12], 0),
                       microbatch(1, [0], [0, 3], [0, 4], 1)]
            if self.again:
                batches.append(microbatch(2, [5], [0, 2], [0, 4], 0))
            return iter(batches), len(batches), 0, 0

    def test_each_group_lists_the_rank_and_its_partners_and_cuts_each_sub_sample(self):
        steps = packfeed_megatron.HybridSteps(self.Client(), dp_cp_rank=2, dp_cp_size=4)
        samples, groups = next(steps)
        self.assertEqual(groups, [[[], [], [4, 1], [4, 1]], [[], [], [0], []]])
        self.assertEqual(sorted(samples), [0, 1, 4])
        # gid 4: this rank's half of 8 padded tokens, the row's first 4.
        self.assertEqual(samples[4]["tokens"].tolist(), [[400, 401, 402, 403]])
        self.assertEqual(samples[1]["tokens"].tolist(), [[404, 405]])
        self.assertEqual(samples[4]["cu_seqlens"].tolist(), [[0, 7]])
        self.assertEqual(samples[4]["cu_seqlens_padded"].tolist(), [[0, 8]])
        self.assertEqual(samples[1]["max_seqlen"].tolist(), [4])
        self.assertEqual(int(samples[0]["local_cp_size"]), 1)
        values = dict(zip(packfeed_megatron.BATCH_KEYS, packfeed_megatron.get_batch(
            iter([samples[0]]))))
        self.assertIsNone(values["hybrid_cp_group"])
        self.assertEqual(values["tokens"].tolist(), [[0, 1, 2, 3]])

    def test_a_tp_peer_takes_the_sub_samples_in_the_schedules_order(self):
        steps = packfeed_megatron.HybridSteps(self.Client(), dp_cp_rank=2, dp_cp_size=4)
        order = [int(steps.next_sub_sample()["tokens"][0, 0]) for _ in range(3)]
        self.assertEqual(order, [400, 404, 0])

    def test_microbatches_with_the_same_cp_groups_run_as_one_group(self):
        steps = packfeed_megatron.HybridSteps(self.Client(again=True), dp_cp_rank=2,
                                              dp_cp_size=4)
        samples, groups = next(steps)
        self.assertEqual(groups, [[[], [], [4, 1, 5], [4, 1, 5]], [[], [], [0], []]])
        self.assertEqual(samples[5]["tokens"].tolist(), [[500, 501]])
        steps = packfeed_megatron.HybridSteps(self.Client(again=True), dp_cp_rank=2,
                                              dp_cp_size=4)
        order = [int(steps.next_sub_sample()["tokens"][0, 0]) for _ in range(4)]
        self.assertEqual(order, [400, 404, 500, 0])


if __name__ == "__main__":
    main()
