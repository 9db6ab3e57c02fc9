"""Side fields, SFT loss masks and MTP stages end to end (docs/CONTRACT.md): a
real packfeedd serving datasets made by `packfeedctl make-dataset
--side-field`, every rank dumped by a real client, each compared with
thd_reference.py's independent reading of the files, the plan and the
contract:
  - TP2×PP2×CP2×DP2 (dynamic CP) with [layers, top_k] router-replay
    indices cut to uneven stages (3 + 4 layers, layer 0 dense) and
    label-aligned log-probs on the last stage;
  - an SFT job whose prompt mask replaces loss_mask;
  - PP3 with the MTP layer on the middle stage;
  - an interleaved PP2×VPP2 job, each model chunk's view (the C++ client's
    Microbatch::Chunk, through packfeedctl dump) compared per chunk.
The MTP, VPP and split-document jobs' rings are memfds the daemon maps, so
their side rows are read straight into the slots; the router-replay and SFT
jobs' rings are in UCX's shared memory, so their rows are held and copied:
both paths meet the same reference.
Then bad input: each is one clear start-up error.

ctest runs it under pytest, with the build's paths (tests/conftest.py)."""
import pathlib
import tempfile

from daemon_harness import Daemon, start_up_errors
from thd_reference import (Dataset, coords, moe_entries, rank_fields, rank_positions, read_count,
                           run_key, side_field, stage_layers, token_run, values)

EOD = 32000
SEQ_LENGTH = 400
EXPERTS = """side_fields { name: "routed_experts" dtype: "int16" inner_shape: [6, 2]
                pad_value: -1 layer_axis: true }"""
LOGPROBS = """side_fields { name: "logprobs" dtype: "float32" align: ALIGN_LABELS }"""
PROMPT_MASK = """side_fields { name: "prompt" dtype: "uint8" align: ALIGN_LABELS
                  role: ROLE_LOSS_MASK }"""


def job_text(name, prefix, topology, scheduler, extra, max_tokens=512, seq_length=SEQ_LENGTH,
             vpp=1, long_documents="LONG_DOCUMENTS_SPLIT"):
    tp, pp, cp, dp = topology
    return f"""
jobs {{
  name: "{name}"
  datasets {{ prefix: "{prefix}" }}
  topology {{ tp: {tp} pp: {pp} cp: {cp} dp: {dp} vpp: {vpp} vpp_group_size: {pp if vpp > 1 else 0} }}
  global_batch: 32
  seq_length: {seq_length}
  eod_id: {EOD}
  append_eod: true
  seed: 11
  long_documents: {long_documents}
  scheduler {{ kind: "{scheduler}" max_tokens_per_rank: {max_tokens} }}
  {extra}
}}
"""


def read_tokens(dataset, seq_length=SEQ_LENGTH, split=True):
    """Tokens a planned sequence reads from its first token on."""
    def count(s):
        return read_count(len(dataset.document(int(s["document"]))), seq_length, split,
                          int(s.get("first_token", 0)))
    return count


def expected_rank(plan, rank, topology, dynamic, data, stage_of, sides, chunks=1,
                  seq_length=SEQ_LENGTH, split=True):
    """Every microbatch of one step for global rank `rank` (under VPP, a
    list of each chunk's fields: stage_of and sides then take the chunk)."""
    tp, pp, cp, dp = topology
    dataset, stored = data
    r_tp, r_cp, r_dp, r_pp = coords(rank, tp, cp, dp)
    n = cp * dp
    runs = {}
    for microbatch in plan["microbatches"]:
        for group in microbatch["groups"]:
            for s in group["sequences"]:
                runs[run_key(s)] = token_run(dataset.document(int(s["document"])), "varlen",
                                             seq_length, EOD, True, split, run_key(s)[2])
    members = lambda first, c: [r_tp + tp * (r + n * r_pp) for r in range(first, first + c)]
    out = []
    for m in plan["microbatches"]:
        per_chunk = []
        for chunk in range(chunks):
            fields = rank_fields(m, r_cp + cp * r_dp, runs, "varlen", EOD, stage_of(r_pp, chunk),
                                 dynamic, members)
            positions = rank_positions(m, r_cp + cp * r_dp)
            for side in sides:
                side(fields, positions, r_pp, chunk, stored)
            per_chunk.append(fields)
        out.append({"chunks": per_chunk} if chunks > 1 else per_chunk[0])
    return out


def differing(got, want):
    """The names of the fields that differ (per chunk under VPP)."""
    if "chunks" in got or "chunks" in want:
        return [f"chunk {k}: {name}" for k, (g, w) in
                enumerate(zip(got.get("chunks", []), want.get("chunks", [])))
                for name in differing(g, w)]
    return sorted(k for k in set(got) | set(want) if got.get(k) != want.get(k))


def compare(checks, label, daemon, job, ranks, topology, dynamic, data, stage_of, sides, steps=2,
            chunks=1, seq_length=SEQ_LENGTH, split=True, sharing="fd"):
    """sharing: how the ranks hand their rings to the daemon; "fd" (a memfd
    it maps): side rows read straight into the slots; "ucx": held rows."""
    dumps = daemon.dump_ranks(job, ranks, steps, "--ring-sharing", sharing)
    for step in range(steps):
        plan = daemon.ctl_json("plan-step", "--job", job, str(step))
        for rank in ranks:
            got = dumps[rank]["steps"][step]["microbatches"]
            want = expected_rank(plan, rank, topology, dynamic, data, stage_of, sides, chunks,
                                 seq_length, split)
            for m, fields in enumerate(got):
                ok = m < len(want) and fields == want[m]
                detail = "" if ok else ", ".join(differing(fields, want[m]))
                checks.check(f"{label} rank {rank} step {step} microbatch {m}", ok,
                             f"fields differ: {detail}")
            checks.check(f"{label} rank {rank} step {step}: M", len(got) == len(want))
    return dumps


def experts_side(layers_of_stage, dense, read):
    def add(fields, positions, pp_rank, chunk, stored):
        picked = moe_entries(layers_of_stage[(pp_rank, chunk)], dense)
        if picked:
            fields["routed_experts"] = side_field(positions, stored["routed_experts"], read, 12,
                                                  False, -1, layers=6, picked=picked)
    return add


def logprobs_side(last_stages, read):
    def add(fields, positions, pp_rank, chunk, stored):
        if pp_rank in last_stages:
            fields["logprobs"] = side_field(positions, stored["logprobs"], read, 1, True, 0.0)
    return add


def prompt_mask_side(read):
    def add(fields, positions, pp_rank, chunk, stored):
        mask = side_field(positions, stored["prompt"], read, 1, True, 0)
        fields["loss_mask"] = [0.0 if not keep else lm for lm, keep in zip(fields["loss_mask"], mask)]
    return add


def bad_input(checks, bin_dir, work, prefix, other):
    base = lambda extra, **kw: job_text("bad", prefix, (1, 2, 1, 2), "balanced", extra, **kw)
    model = "model { num_layers: 7 num_layers_in_first_pipeline_stage: 3 " \
            "num_layers_in_last_pipeline_stage: 4 dense_layers: [0] }"
    cases = {
        "side field of the wrong length": (
            base(EXPERTS + model).replace(
                f'prefix: "{prefix}" }}',
                f'prefix: "{prefix}" side_field_prefixes {{ key: "routed_experts" '
                f'value: "{other}_routed_experts" }} }}'),
            "routed_experts sequence 0 holds"),
        "wrong dtype": (base(EXPERTS.replace('"int16"', '"int32"') + model),
                        "side field routed_experts is int32 but the file holds int16"),
        "inner shape disagrees with the file": (
            base(EXPERTS.replace("[6, 2]", "[6, 3]") + model), "tokens × 18 per token"),
        "layer axis disagrees with the model": (
            base(EXPERTS + model.replace("dense_layers: [0]", "dense_layers: [0, 1]")),
            "the layer axis holds 6 layers; the model has 5 with experts"),
        "layer counts that do not add up": (
            base(EXPERTS + model.replace("last_pipeline_stage: 4", "last_pipeline_stage: 3")),
            "jobs[0].model.num_layers: 7 layers, but the first and last stages hold 6"),
        "a loss mask that is not uint8": (
            base(PROMPT_MASK.replace('"uint8"', '"int16"')), "a loss mask is a uint8 field"),
        "a sample no plan can hold": (base("", max_tokens=100), "can never be served"),
    }
    for name, (text, expected) in cases.items():
        config = pathlib.Path(work, "bad.textproto")
        config.write_text(f'socket_path: "{work}/bad.sock"\n' + text)
        code, errors = start_up_errors(bin_dir, config)
        checks.check(f"start-up error ({name}): non-zero exit", code != 0, code)
        checks.check(f"start-up error ({name}): one error line naming {expected!r}",
                     len(errors) == 1 and expected in errors[0], errors)


def test_side_fields(bin_dir, checks):
    work = tempfile.mkdtemp(prefix="pf-side-")
    prefix, other = f"{work}/data", f"{work}/other"
    for out, seed in ((prefix, 3), (other, 4)):
        checks.run("make-dataset", "--out", out, "--count", "400", "--min", "16", "--max", "512",
                   "--mean", "160", "--seed", str(seed),
                   "--side-field", "routed_experts:experts:6x2:8",
                   "--side-field", "logprobs:logprobs", "--side-field", "prompt:prompt_mask")
    dataset = Dataset(prefix)
    stored = {name: {(0, d): values(Dataset(f"{prefix}_{name}"), d)
                     for d in range(len(dataset.documents) - 1)}
              for name in ("routed_experts", "logprobs", "prompt")}
    data = (dataset, stored)
    read = read_tokens(dataset)

    # 1. Router replay under TP2×PP2×CP2×DP2, uneven stages, a dense layer.
    model = "model { num_layers: 7 num_layers_in_first_pipeline_stage: 3 " \
            "num_layers_in_last_pipeline_stage: 4 dense_layers: [0] }"
    topology = (2, 2, 2, 2)
    layers = stage_layers(7, 2, first=3, last=4)
    text = job_text("moe", prefix, topology, "dynamic_cp", EXPERTS + LOGPROBS + model)
    with Daemon(bin_dir, text, name="moe") as daemon:
        dumps = compare(checks, "moe", daemon, "moe", range(16), topology, True, data,
                        lambda p, k: {"inputs": p == 0, "targets": p == 1},
                        [experts_side(layers, [0], read), logprobs_side({1}, read)],
                        sharing="ucx")
        stats = daemon.ctl_json("stats")
    first = dumps[0]["steps"][0]["microbatches"][0]
    last = dumps[15]["steps"][0]["microbatches"][0]
    checks.check("stage 0 gets 2 layers × top-2 per token",
                 len(first["routed_experts"]) == 4 * len(first["padding_mask"]))
    checks.check("stage 1 gets 4 layers × top-2 per token and log-probs",
                 len(last["routed_experts"]) == 8 * len(last["padding_mask"]) and "logprobs" in last)
    checks.check("no log-probs on the first stage", "logprobs" not in first)
    files = {f["path"].rsplit("/", 1)[-1]: f for f in stats.get("storage", {}).get("files", [])}
    checks.check("side files are read once (I/O amplification 1.00)",
                 all(float(f["io_amplification"]) == 1.0 for f in files.values())
                 and "data_routed_experts.bin" in files, files.keys())

    # 2. SFT: the prompt mask replaces loss_mask; long documents truncated.
    topology = (1, 1, 2, 2)
    text = job_text("sft", prefix, topology, "balanced", PROMPT_MASK,
                    long_documents="LONG_DOCUMENTS_TRUNCATE")
    truncated = read_tokens(dataset, split=False)
    with Daemon(bin_dir, text, name="sft") as daemon:
        dumps = compare(checks, "sft", daemon, "sft", range(4), topology, False, data,
                        lambda p, k: {"inputs": True, "targets": True},
                        [prompt_mask_side(truncated)], split=False, sharing="ucx")
        stats = daemon.ctl_json("stats")["jobs"][0]
    checks.check("truncation is counted in stats",
                 int(stats["tokens_truncated"]) > 0 and int(stats["documents_split"]) == 0,
                 stats)
    masked = sum(v == 0 for d in dumps.values() for s in d["steps"] for m in s["microbatches"]
                 for v, pad in zip(m["loss_mask"], m["padding_mask"]) if not pad)
    checks.check("sft: prompt positions are masked", masked > 0, masked)

    # 3. MTP on the middle of three stages: it gets inputs and targets.
    topology = (1, 3, 1, 2)
    model = "model { num_layers: 6 mtp_num_layers: 1 mtp_stage: 1 dense_layers: [0] }"
    layers = stage_layers(6, 3, mtp=1, mtp_stage=1)
    text = job_text("mtp", prefix, topology, "balanced", EXPERTS + model)
    with Daemon(bin_dir, text, name="mtp") as daemon:
        dumps = compare(checks, "mtp", daemon, "mtp", range(6), topology, False, data,
                        lambda p, k: {"inputs": p in (0, 1), "targets": p in (1, 2)},
                        [experts_side(layers, [0], read)])
    middle = dumps[2]["steps"][0]["microbatches"][0]
    checks.check("mtp: the middle stage gets tokens, labels and 3 layers of experts",
                 {"tokens", "labels", "loss_mask", "position_ids"} <= set(middle)
                 and len(middle["routed_experts"]) == 6 * len(middle["padding_mask"]))

    # 4. Interleaved PP2×VPP2: chunk-major layers (layers 0 and 4 dense);
    # the first stage's chunk 0 gets the inputs, the last stage's chunk 1
    # the targets.
    topology = (1, 2, 1, 2)
    model = "model { num_layers: 8 dense_layers: [0, 4] }"
    layers = stage_layers(8, 2, vpp=2)
    text = job_text("vpp", prefix, topology, "balanced", EXPERTS + LOGPROBS + model, vpp=2)
    with Daemon(bin_dir, text, name="vpp") as daemon:
        dumps = compare(checks, "vpp", daemon, "vpp", range(4), topology, False, data,
                        lambda p, k: {"inputs": (p, k) == (0, 0), "targets": (p, k) == (1, 1)},
                        [experts_side(layers, [0, 4], read),
                         lambda fields, positions, p, k, stored: logprobs_side({1}, read)(
                             fields, positions, p, k, stored) if k == 1 else None],
                        chunks=2)
    chunks = dumps[0]["steps"][0]["microbatches"][0]["chunks"]
    checks.check("vpp: stage 0 chunk 1 holds one MoE layer (4 is dense), chunk 0 one",
                 len(chunks[1]["routed_experts"]) == 2 * len(chunks[1]["padding_mask"])
                 and len(chunks[0]["routed_experts"]) == 2 * len(chunks[0]["padding_mask"])
                 and "tokens" in chunks[0] and "tokens" not in chunks[1])

    # 5. Long documents split into pieces of at most 64 inputs, side fields
    # following their piece, under CP 2.
    topology = (1, 1, 2, 2)
    text = job_text("split", prefix, topology, "dynamic_cp", EXPERTS + LOGPROBS +
                    "model { num_layers: 7 dense_layers: [0] }", seq_length=64, max_tokens=64)
    layers = stage_layers(7, 1)
    pieces = read_tokens(dataset, seq_length=64)
    with Daemon(bin_dir, text, name="split") as daemon:
        compare(checks, "split", daemon, "split", range(4), topology, True, data,
                lambda p, k: {"inputs": True, "targets": True},
                [experts_side(layers, [0], pieces), logprobs_side({0}, pieces)], seq_length=64)
        plan = daemon.ctl_json("plan-step", "--job", "split", "0")
        stats = daemon.ctl_json("stats")["jobs"][0]
    later = [s for m in plan["microbatches"] for g in m["groups"] for s in g["sequences"]
             if int(s.get("first_token", 0)) > 0]
    checks.check("split: later pieces of documents are served", len(later) > 0, plan)
    checks.check("split: stats count the documents split",
                 int(stats.get("documents_split", 0)) > 0, stats)
    checks.check("split: side rows are read into the slots, none held",
                 int(stats.get("peak_side_rows_bytes", 0)) == 0, stats)

    bad_input(checks, bin_dir, work, prefix, other)
