"""What a generated dataset's job should serve each rank, from the daemon's
own plan and thd_reference.py: the job text the serving tests run
(daemon_serving_test, multinode_netns_test, tests/deploy's Slurm test),
every rank's expected fields, and their comparison with what was dumped.
No pytest here: the Slurm test imports it under another Python."""
from thd_reference import coords, rank_fields, run_key, token_run

EOD = 32000
SEQ_LENGTH = 400


def job_text(name, prefix, tp=2, pp=2, cp=2, dp=2, scheduler="dynamic_cp", local_ranks=None,
             seed=7, token="", max_tokens=512, global_batch=32):
    ranks = f"local_ranks: [{', '.join(map(str, local_ranks))}]" if local_ranks else ""
    return f"""
jobs {{
  name: "{name}"
  datasets {{ prefix: "{prefix}" }}
  topology {{ tp: {tp} pp: {pp} cp: {cp} dp: {dp} }}
  global_batch: {global_batch}
  seq_length: {SEQ_LENGTH}
  eod_id: {EOD}
  append_eod: true
  seed: {seed}
  auth_token: "{token}"
  {ranks}
  scheduler {{ kind: "{scheduler}" max_tokens_per_rank: {max_tokens} }}
}}
"""


def expected_dumps(daemon, job, dataset, topology, dynamic, steps):
    """{rank: [per step: {num_microbatches, microbatches}]} from the plan and the files."""
    tp, pp, cp, dp = topology
    n = cp * dp
    out = {rank: [] for rank in range(tp * pp * cp * dp)}
    for step in range(steps):
        plan = daemon.ctl_json("plan-step", "--job", job, str(step))
        runs = {}
        for microbatch in plan["microbatches"]:
            for group in microbatch["groups"]:
                for s in group["sequences"]:
                    # Documents past SEQ_LENGTH are split (the default).
                    runs[run_key(s)] = token_run(dataset.document(int(s["document"])), "varlen",
                                                 SEQ_LENGTH, EOD, True, split=True,
                                                 first_token=run_key(s)[2])
        for rank in out:
            r_tp, r_cp, r_dp, r_pp = coords(rank, tp, cp, dp)
            stage = {"inputs": r_pp == 0, "targets": r_pp == pp - 1}
            members = lambda first, c, r_tp=r_tp, r_pp=r_pp: [
                r_tp + tp * (r + n * r_pp) for r in range(first, first + c)]
            out[rank].append({
                "num_microbatches": int(plan["num_microbatches"]),
                "microbatches": [rank_fields(m, r_cp + cp * r_dp, runs, "varlen", EOD, stage,
                                             dynamic, members)
                                 for m in plan["microbatches"]]})
    return out


def compare(checks, label, dumps, expected):
    for rank, dump in dumps.items():
        for step, got in enumerate(dump["steps"]):
            want = expected[rank][step]
            checks.check(f"{label} rank {rank} step {step} M",
                         got["num_microbatches"] == want["num_microbatches"])
            for m, fields in enumerate(got["microbatches"]):
                ok = fields == want["microbatches"][m]
                detail = "" if ok else ", ".join(
                    k for k in set(fields) | set(want["microbatches"][m])
                    if fields.get(k) != want["microbatches"][m].get(k))
                checks.check(f"{label} rank {rank} step {step} microbatch {m}", ok,
                             f"fields differ: {detail}")
