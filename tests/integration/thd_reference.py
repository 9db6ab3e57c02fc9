"""An independent reference for docs/CONTRACT.md, written from the contract and
not from packfeed's code: reads a Megatron indexed dataset with Python's
struct/array modules and, given a plan from `packfeedctl plan-step --json`,
builds the fields a global rank must receive."""
import array
import pathlib
import struct

TYPECODES = {1: "B", 2: "b", 3: "h", 4: "i", 5: "q", 6: "d", 7: "f", 8: "H"}


class Dataset:
    def __init__(self, prefix):
        idx = pathlib.Path(f"{prefix}.idx").read_bytes()
        assert idx[:9] == b"MMIDIDX\x00\x00"
        version, code, count, doc_count = struct.unpack_from("<QBQQ", idx, 9)
        assert version == 1
        offset = 34
        self.lengths = array.array("i", idx[offset:offset + 4 * count])
        offset += 4 * count
        self.pointers = array.array("q", idx[offset:offset + 8 * count])
        offset += 8 * count
        self.documents = array.array("q", idx[offset:offset + 8 * doc_count])
        self.typecode = TYPECODES[code]
        self.itemsize = array.array(self.typecode).itemsize
        self.bin = pathlib.Path(f"{prefix}.bin").read_bytes()

    def document(self, d):
        tokens = []
        for s in range(self.documents[d], self.documents[d + 1]):
            start = self.pointers[s]
            values = array.array(self.typecode, self.bin[start:start + self.lengths[s] * self.itemsize])
            tokens.extend(int(v) for v in values)
        return tokens


def token_run(stored, kind, seq_length, eod, append_eod, split=False, first_token=0):
    """The run t of a sample: the document (EOD appended when asked),
    truncated to seq_length with the EOD forced last, or under split the
    piece starting at first_token: seq_length inputs and the next token."""
    run = stored + ([eod] if append_eod else [])
    limit = seq_length + 1 if kind == "varlen" else seq_length
    if split and kind == "varlen":
        return run[first_token:first_token + limit]
    if len(run) > limit:
        run = stored[:seq_length - 1] + [eod]
    return run


def run_key(s):
    """How a planned sequence (plan-step JSON) names its sample's run."""
    return int(s.get("dataset", 0)), int(s["document"]), int(s.get("first_token", 0))


def read_count(stored_tokens, seq_length, split, first_token=0):
    """Stored tokens a varlen sample reads from its first token on."""
    if split:
        return min(first_token + seq_length + 1, stored_tokens) - first_token
    return stored_tokens if stored_tokens <= seq_length else seq_length - 1


def sequence_positions(run, real, padded, kind, pad):
    """Per-position (token, label, loss_mask, position, is_pad) of one sequence."""
    out = []
    for j in range(padded):
        is_pad = j >= real
        if kind == "varlen":
            out.append((0, 0, 0.0, 0, True) if is_pad else (run[j], run[j + 1], 1.0, j, False))
        else:
            token = run[j] if j < len(run) else pad
            label = run[j + 1] if j + 1 < len(run) else pad
            out.append((token, label, 0.0 if label in (pad, -100) else 1.0, j, is_pad))
    return out


def rank_fields(plan_microbatch, dp_cp_rank, runs, kind, pad, stage, dynamic, global_ranks_of_group):
    """The fields of one rank for one microbatch (a dict named as DESIGN §3)."""
    group = next(g for g in plan_microbatch["groups"]
                 if int(g["first_rank"]) <= dp_cp_rank < int(g["first_rank"]) + int(g["size"]))
    c = int(group["size"])
    k = dp_cp_rank - int(group["first_rank"])
    positions, cu, cu_padded, max_len = [], [0], [0], 0
    for s in group["sequences"]:
        real, padded = int(s["length"]), int(s["padded_length"])
        full = sequence_positions(runs[run_key(s)], real, padded, kind, pad)
        if c == 1:
            positions += full
        else:
            part = padded // (2 * c)
            positions += full[k * part:(k + 1) * part]
            positions += full[(2 * c - 1 - k) * part:(2 * c - k) * part]
        cu.append(cu[-1] + real)
        cu_padded.append(cu_padded[-1] + padded)
        max_len = max(max_len, padded)
    fields = {"padding_mask": [p[4] for p in positions], "cu_seqlens": cu,
              "cu_seqlens_padded": cu_padded, "max_seqlen": max_len}
    if stage["inputs"]:
        fields["tokens"] = [p[0] for p in positions]
        fields["position_ids"] = [p[3] for p in positions]
    if stage["targets"]:
        fields["labels"] = [p[1] for p in positions]
        fields["loss_mask"] = [p[2] for p in positions]
    if dynamic:
        fields["local_cp_size"] = c
        fields["cp_group_ranks"] = global_ranks_of_group(int(group["first_rank"]), c)
    return fields


def coords(rank, tp, cp, dp):
    """(tp, cp, dp, pp) of a global rank: tp + TP·(cp + CP·(dp + DP·pp))."""
    return rank % tp, rank // tp % cp, rank // (tp * cp) % dp, rank // (tp * cp * dp)


# --- side fields (docs/CONTRACT.md; config.proto SideField, ModelLayers) -------

def values(dataset, d):
    """Document d's stored values as Python numbers (floats stay floats)."""
    out = []
    for s in range(dataset.documents[d], dataset.documents[d + 1]):
        start = dataset.pointers[s]
        out.extend(array.array(dataset.typecode,
                               dataset.bin[start:start + dataset.lengths[s] * dataset.itemsize]))
    return out


def stage_layers(num_layers, pp, vpp=1, first=None, last=None, mtp=0, mtp_stage=None):
    """{(pp_rank, chunk): [layer, ...]} as Megatron-LM's
    get_transformer_layer_offset places them: first/last stage counts when
    given, the rest evenly; chunk-major under VPP; MTP layers (numbered
    after the decoder's) in the MTP stage's last chunk."""
    middle_stages = pp - (first is not None) - (last is not None)
    middle = num_layers - (first or 0) - (last or 0)
    counts = [middle // middle_stages if middle_stages else 0] * pp
    if first is not None:
        counts[0] = first
    if last is not None:
        counts[-1] = last
    layers, offset = {}, 0
    for chunk in range(vpp):
        for stage in range(pp):
            n = counts[stage] // vpp
            layers[(stage, chunk)] = list(range(offset, offset + n))
            offset += n
    if mtp:
        layers[(pp - 1 if mtp_stage is None else mtp_stage, vpp - 1)] += list(
            range(num_layers, num_layers + mtp))
    return layers


def moe_entries(layers, dense):
    """The layer-axis entries of `layers`: each non-dense layer's rank among
    all non-dense layers."""
    return [layer - sum(1 for d in dense if d < layer) for layer in layers if layer not in dense]


def rank_positions(plan_microbatch, dp_cp_rank):
    """[(sequence, j), ...]: the positions a rank holds, in its order."""
    group = next(g for g in plan_microbatch["groups"]
                 if int(g["first_rank"]) <= dp_cp_rank < int(g["first_rank"]) + int(g["size"]))
    c, k = int(group["size"]), dp_cp_rank - int(group["first_rank"])
    out = []
    for s in group["sequences"]:
        padded = int(s["padded_length"])
        if c == 1:
            out += [(s, j) for j in range(padded)]
        else:
            part = padded // (2 * c)
            out += [(s, j) for j in range(k * part, (k + 1) * part)]
            out += [(s, j) for j in range((2 * c - 1 - k) * part, (2 * c - k) * part)]
    return out


def side_field(positions, stored, read_tokens, row, labels, pad, layers=None, picked=None):
    """A side field's flat values at `positions`: stored row j (j + 1 when
    aligned with labels) of a real position whose row was read (counting
    from the sample's first token), else `pad`.
    With `layers`, a row is [layers, row / layers] and only the entries
    `picked` are kept."""
    per_layer = row // layers if layers else row
    width = per_layer * len(picked) if layers else row
    out = []
    for s, j in positions:
        i = j + 1 if labels else j
        if j >= int(s["length"]) or i >= read_tokens(s):
            out += [pad] * width
            continue
        rows = stored[(int(s.get("dataset", 0)), int(s["document"]))]
        i += int(s.get("first_token", 0))  # a piece of a split document
        values_row = rows[i * row:(i + 1) * row]
        if layers:
            for e in picked:
                out += values_row[e * per_layer:(e + 1) * per_layer]
        else:
            out += values_row
    return out
