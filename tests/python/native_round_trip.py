"""One step of rollouts through a real daemon from a Python without torch:
packfeed.Producer puts and seals it, and one rank attached through
packfeed._native reads every microbatch over DLPack into NumPy. Every
sequence put arrives whole, once, with its labels and log-probs. python_versions_test.sh
runs it with each CPython the package was built for from source."""
import random
import sys

import numpy as np

import packfeed
from packfeed import _native
from pf_test_support import BIN_DIR, Daemon

CONFIG = """
ingest_streams {
  name: "rollouts"
  auth_token: "driver-secret"
  fields { name: "logprobs" dtype: "float32" }
}
jobs {
  name: "ref"
  ingest_stream: "rollouts"
  topology { dp: 1 }
  global_batch: 12
  seq_length: 512
  side_fields { name: "logprobs" dtype: "float32" }
  scheduler { kind: "balanced" max_tokens_per_rank: 1024 }
}
"""


class Capsule:
    """What np.from_dlpack takes: an object that hands out a DLPack capsule."""

    def __init__(self, capsule):
        self.capsule = capsule

    def __dlpack__(self, **_):
        return self.capsule

    def __dlpack_device__(self):
        return (1, 0)  # kDLCPU


def main():
    rng = random.Random(7)
    samples = []
    for i in range(12):
        t = rng.randint(10, 400)
        samples.append({"group": i // 3, "tokens": np.array([rng.randrange(1, 50000) for _ in range(t)],
                                                            dtype=np.int64),
                        "logprobs": np.array([-rng.random() for _ in range(t)], dtype=np.float32)})
    with Daemon(BIN_DIR, CONFIG, name="round-trip") as daemon:
        producer = packfeed.Producer("rollouts", socket_path=daemon.socket,
                                     auth_token="driver-secret")
        producer.put(0, samples)
        producer.seal(0)
        rank = _native.attach(daemon.socket, "ref", 0, "", "", 0, 0, None, False, 4, 0, "host", 0,
                              "", 30.0, 0.0)
        step = rank.next_step(30.0)
        got = []
        for _ in range(step["num_microbatches"]):
            fields = {name: np.from_dlpack(Capsule(capsule)).reshape(-1)  # tokens are [1, T]
                      for name, _, capsule in rank.next(30.0)["fields"]}
            cu, cu_padded = fields["cu_seqlens"], fields["cu_seqlens_padded"]
            for s in range(len(cu) - 1):
                begin, length = int(cu_padded[s]), int(cu[s + 1] - cu[s])
                got.append(tuple(fields[name][begin:begin + length].tolist()
                                 for name in ("tokens", "labels", "logprobs")))
            del fields  # the slot goes back to the daemon once no array views it
        rank.detach()
    # A sample of T tokens is T - 1 positions: tokens without the last, labels
    # without the first, side fields aligned to tokens (docs/CONTRACT.md).
    want = [(s["tokens"][:-1].tolist(), s["tokens"][1:].tolist(), s["logprobs"][:-1].tolist())
            for s in samples]
    if sorted(got) != sorted(want):
        sys.exit(f"the rank's {len(got)} sequences differ from the {len(want)} put")
    print(f"Python {sys.version.split()[0]}: {len(got)} sequences in "
          f"{step['num_microbatches']} microbatches, equal to what was put")


if __name__ == "__main__":
    main()
