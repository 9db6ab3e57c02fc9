"""One trainer rank as its own process, for the reliability tests: takes
`--steps` steps from packfeedd and appends, per microbatch, one JSON line
{step, mb, sha, state} to `--out`, where sha is SHA-256 over every tensor's
name and bytes and state is the client's state_dict after taking it. The
line is the commit: a rank started again on the same --out resumes from its
last whole line (a torn last line, from a kill mid-write, is cut off), as a
trainer resumes from its last checkpoint.

  rank_worker.py --socket S --job J --rank R --steps N --out FILE
                 [--die-after K]       SIGKILL itself after its K-th line
                 [--pause-after K --pause S]  sleep S seconds after line K
                 [--delay S]           sleep S seconds per microbatch (the trainer's compute)
                 [--checkpoint-at STEP --checkpoint FILE]  save the state at that step boundary
                 [--resume-from FILE]  start from a saved state (a restart from a checkpoint)
                 [--elastic-from FILE] start from a state saved under another topology
"""
import argparse
import hashlib
import json
import os
import signal
import time

import torch

import packfeed


def batch_sha(batch):
    digest = hashlib.sha256()
    for name in sorted(batch):
        value = batch[name]
        if isinstance(value, torch.Tensor):
            digest.update(name.encode())
            digest.update(value.numpy().tobytes())
    return digest.hexdigest()


def last_state(out_path):
    """The state of the last whole line of `out_path` (cutting a torn one
    off), and how many lines there are."""
    if not os.path.exists(out_path):
        return None, 0
    with open(out_path, "rb") as f:
        data = f.read()
    whole = data[:data.rfind(b"\n") + 1]
    if len(whole) != len(data):
        with open(out_path, "r+b") as f:
            f.truncate(len(whole))
    lines = whole.splitlines()
    return (json.loads(lines[-1])["state"] if lines else None), len(lines)


def attach(args, **kwargs):
    """Attaches, waiting while the daemon restarts or still holds this
    rank's previous (killed) process as attached."""
    deadline = time.monotonic() + 60
    while True:
        try:
            return packfeed.Client(args.job, rank=args.rank, socket_path=args.socket,
                                   copy=True, reconnect_timeout=60, **kwargs)
        except (packfeed.errors.AlreadyExistsError, packfeed.errors.UnavailableError):
            if time.monotonic() > deadline:
                raise
            time.sleep(0.2)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--socket", required=True)
    parser.add_argument("--job", required=True)
    parser.add_argument("--rank", type=int, required=True)
    parser.add_argument("--steps", type=int, required=True)
    parser.add_argument("--out", required=True)
    parser.add_argument("--die-after", type=int, default=-1)
    parser.add_argument("--pause-after", type=int, default=-1)
    parser.add_argument("--pause", type=float, default=0)
    parser.add_argument("--delay", type=float, default=0)
    parser.add_argument("--checkpoint-at", type=int, default=-1)
    parser.add_argument("--checkpoint")
    parser.add_argument("--resume-from")
    parser.add_argument("--elastic-from")
    args = parser.parse_args()

    state, lines = last_state(args.out)
    if state is None and args.resume_from:
        with open(args.resume_from) as f:
            state = json.load(f)
        state["rank"] = args.rank
    if state is not None:
        client = attach(args, state=state)
    elif args.elastic_from:
        with open(args.elastic_from) as f:
            saved = json.load(f)
        client = attach(args, fingerprint=saved["fingerprint"], start_step=saved["next_step"],
                        elastic=True)
    else:
        client = attach(args)
    with open(args.out, "a") as out:
        while client.state_dict()["next_step"] < args.steps:
            if client.state_dict()["next_step"] == args.checkpoint_at and args.checkpoint:
                with open(args.checkpoint + ".tmp", "w") as f:
                    json.dump(client.state_dict(), f)
                os.rename(args.checkpoint + ".tmp", args.checkpoint)
            iterator = client.next_step(timeout=60)[0]
            step = client.last_step["step"]
            for batch in iterator:
                mb = client.state_dict()["next_microbatch"] - 1
                if mb < 0:  # the step's last microbatch: the state moved on
                    mb = client.last_step["num_microbatches"] - 1
                record = {"step": step, "mb": mb, "sha": batch_sha(batch),
                          "state": client.state_dict()}
                out.write(json.dumps(record) + "\n")
                out.flush()
                lines += 1
                if lines == args.die_after:
                    os.kill(os.getpid(), signal.SIGKILL)
                if lines == args.pause_after:
                    time.sleep(args.pause)
                time.sleep(args.delay)
    client.close()


if __name__ == "__main__":
    main()
