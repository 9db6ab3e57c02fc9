#!/usr/bin/env python3
"""Makes the length traces of the families the public traces lack.

  make_traces.py [--out DIR]

Writes, one sequence length (tokens) per line, 16 384 lines each:

  trace_code_files.txt      heavy-tailed: sizes of the C/C++ headers under
                            /usr/include and the Python sources under
                            /usr/lib/python3/dist-packages of the machine it
                            runs on (Debian 12 for the committed copy)
  trace_doc_paragraphs.txt  many tiny sequences: paragraphs (blank-line
                            separated) of the text files under /usr/share/doc
  trace_chat_longdoc.txt    bimodal: chat turns plus long documents, drawn
                            from a stated mixture (below), since no chat
                            corpus is on the machine
  trace_heavy_tail.txt      heavier-tailed than code files: mostly short
                            sequences and 0.5 % giants of 40 960-131 072
                            tokens (10-32x a 4 096-token rank), a stated
                            mixture with its own seed

  make_traces.py --made DIR   writes into DIR the traces drawn from a seed
  alone (trace_heavy_tail): those are made where a test or benchmark needs
  them (the build makes them under build/traces), never stored.

Tokens are bytes / 3.5 rounded up (about what BPE tokenizers give for
English and code; no tokenizer is installed here). Documents longer than
MAX_LENGTH (PARAGRAPH_MAX_LENGTH for paragraphs) are cut into pieces of that
length and a remainder, as the
daemon's long_documents: SPLIT does. Order: a seeded shuffle, so that every
global batch mixes the whole distribution. The committed .txt files are the
output of this script (the files under /usr/share/doc change with the
machine's packages, and each trace drawn after them with them);
traces_meta.json records their statistics, the made traces' too.
"""

import argparse
import gzip
import json
import math
import os
import random
import statistics

COUNT = 16384
MAX_LENGTH = 65536  # fits 16 ranks × 4 096 tokens at the largest CP group
PARAGRAPH_MAX_LENGTH = 8192  # the many-tiny family: a giant would be its own case
BYTES_PER_TOKEN = 3.5
SEED = 20261123

# Chat turns: lognormal, median 300 tokens, σ 1.0 (a few hundred tokens per
# turn, as public chat logs show); 8 % long documents: lognormal, median
# 12 000, σ 0.8. The parameters are ours, stated, not fitted to a dataset.
CHAT = {"median": 300, "sigma": 1.0, "min": 8}
LONG = {"share": 0.08, "median": 12000, "sigma": 0.8}


def tokens(size_bytes):
    return max(1, math.ceil(size_bytes / BYTES_PER_TOKEN))


def split(length, most=MAX_LENGTH):
    pieces = [most] * (length // most)
    if length % most:
        pieces.append(length % most)
    return pieces


def files_under(root, suffixes):
    for directory, _, names in sorted(os.walk(root)):
        for name in sorted(names):
            path = os.path.join(directory, name)
            if name.endswith(suffixes) and os.path.isfile(path) and not os.path.islink(path):
                yield path


def code_files():
    lengths = []
    for root, suffixes in (("/usr/include", (".h", ".hpp", ".hh", ".inc")),
                           ("/usr/lib/python3/dist-packages", (".py",))):
        for path in files_under(root, suffixes):
            size = os.path.getsize(path)
            if size > 0:
                lengths.extend(split(tokens(size)))
    return lengths


def doc_paragraphs():
    lengths = []
    for path in files_under("/usr/share/doc", ("", )):
        opener = gzip.open if path.endswith(".gz") else open
        try:
            with opener(path, "rb") as f:
                text = f.read()
        except OSError:
            continue
        if b"\0" in text[:4096]:
            continue  # not text
        for paragraph in text.split(b"\n\n"):
            paragraph = paragraph.strip()
            if paragraph:
                lengths.extend(split(tokens(len(paragraph)), PARAGRAPH_MAX_LENGTH))
    return lengths


def chat_longdoc(rng):
    lengths = []
    for _ in range(COUNT):
        if rng.random() < LONG["share"]:
            length = rng.lognormvariate(math.log(LONG["median"]), LONG["sigma"])
        else:
            length = rng.lognormvariate(math.log(CHAT["median"]), CHAT["sigma"])
        lengths.append(min(MAX_LENGTH, max(CHAT["min"], round(length))))
    return lengths


# The heavy tail: shorts lognormal, median 200 tokens, σ 1.0, at most 4 096;
# 0.5 % giants log-uniform over [40 960, 131 072], so that at 4 096 tokens a
# rank a few sequences of each global batch need 10-32 ranks and most need
# a tenth of one. Stated, not fitted to a dataset.
SHORT = {"median": 200, "sigma": 1.0, "min": 8, "max": 4096}
GIANT = {"share": 0.005, "min": 40960, "max": 131072}


def heavy_tail():
    rng = random.Random(f"{SEED}-heavy_tail")
    lengths = []
    for _ in range(COUNT):
        if rng.random() < GIANT["share"]:
            lengths.append(round(math.exp(rng.uniform(math.log(GIANT["min"]),
                                                      math.log(GIANT["max"])))))
        else:
            length = rng.lognormvariate(math.log(SHORT["median"]), SHORT["sigma"])
            lengths.append(min(SHORT["max"], max(SHORT["min"], round(length))))
    return lengths


# The traces drawn from a seed of their own, nothing on the machine.
MADE = ("trace_heavy_tail",)


def write_made(out_dir):
    """Writes the MADE traces under out_dir (unless already there, equal);
    returns name -> path. Safe for tests writing the same folder at once."""
    os.makedirs(out_dir, exist_ok=True)
    paths = {}
    for name, lengths in (("trace_heavy_tail", heavy_tail()),):
        path = os.path.join(out_dir, name + ".txt")
        text = "".join(f"{n}\n" for n in lengths)
        if not os.path.exists(path) or open(path).read() != text:
            scratch = f"{path}.{os.getpid()}"
            with open(scratch, "w") as f:
                f.write(text)
            os.replace(scratch, path)
        paths[name] = path
    return paths


def sample(lengths, rng):
    if len(lengths) < COUNT:
        raise SystemExit(f"only {len(lengths)} lengths found; need {COUNT}")
    rng.shuffle(lengths)
    return lengths[:COUNT]


def summary(lengths):
    ordered = sorted(lengths)
    return {
        "count": len(lengths),
        "mean": statistics.fmean(lengths),
        "median": statistics.median(lengths),
        "p99": ordered[int(0.99 * len(ordered))],
        "min": ordered[0],
        "max": ordered[-1],
        "sum": sum(lengths),
    }


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out", default=os.path.dirname(os.path.abspath(__file__)))
    parser.add_argument("--only", action="append", help="write only this trace (repeatable)")
    parser.add_argument("--made", metavar="DIR", help="write only the made traces, into DIR")
    args = parser.parse_args()
    if args.made:
        write_made(args.made)
        return
    rng = random.Random(SEED)
    makers = {  # in the order they draw from rng
        "trace_code_files": (lambda: sample(code_files(), rng),
                             "sizes of /usr/include headers and dist-packages .py files"),
        "trace_doc_paragraphs": (lambda: sample(doc_paragraphs(), rng),
                                 "paragraphs of /usr/share/doc text files"),
        "trace_chat_longdoc": (lambda: chat_longdoc(rng),
                               f"mixture: chat {CHAT}, long documents {LONG}"),
        "trace_heavy_tail": (heavy_tail, f"mixture: short {SHORT}, giants {GIANT} (log-uniform)"),
    }
    traces = {name: (make(), source) for name, (make, source) in makers.items()
              if not args.only or name in args.only}
    meta_path = os.path.join(args.out, "traces_meta.json")
    meta = {}
    if args.only and os.path.exists(meta_path):
        with open(meta_path) as f:
            meta = json.load(f)
    for name, (lengths, source) in traces.items():
        if name not in MADE:
            with open(os.path.join(args.out, name + ".txt"), "w") as f:
                f.write("".join(f"{n}\n" for n in lengths))
        meta[name] = {"source": source, "bytes_per_token": BYTES_PER_TOKEN,
                      "seed": SEED, **summary(lengths)}
    with open(meta_path, "w") as f:
        json.dump(meta, f, indent=2)
        f.write("\n")
    for name in traces:
        entry = meta[name]
        print(f"{name}: mean {entry['mean']:.0f}, median {entry['median']}, "
              f"p99 {entry['p99']}, max {entry['max']}")


if __name__ == "__main__":
    main()
