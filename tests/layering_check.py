#!/usr/bin/env python3
"""Fails when a source file includes a folder DESIGN.md §2 does not allow.

Allowed directions: server -> scheduler, transport, proto, common (and client,
for packfeedctl only); client -> transport, proto, common; transport -> common;
scheduler -> common (+ Abseil); common -> Abseil only. Nothing includes server.
scheduler/ must also stay pure: no threads, no I/O, no logging, no UCX/gRPC.

Usage: layering_check.py SOURCE_ROOT | --self-test
"""
import pathlib
import re
import sys
import tempfile

ALLOWED = {
    "common": {"common"},
    "proto": {"proto"},
    "scheduler": {"scheduler", "common"},
    "transport": {"transport", "common"},
    "client": {"client", "transport", "proto", "common"},
    "server": {"server", "scheduler", "transport", "proto", "common"},
}
# packfeedctl's `dump` attaches as a rank, so server/ctl may use the client.
EXTRA = {"server/ctl": {"client"}}
# Headers that would make the scheduler impure.
SCHEDULER_FORBIDDEN = re.compile(
    r"^(thread|mutex|shared_mutex|condition_variable|future|atomic|fstream|"
    r"iostream|cstdio|stdio\.h|unistd\.h|fcntl\.h|sys/.*|spdlog/.*|ucp/.*|"
    r"grpc.*|google/protobuf/.*|cuda.*|absl/synchronization/.*)$")
INCLUDE = re.compile(r'^\s*#\s*include\s*[<"]([^>"]+)[>"]', re.M)
SOURCES = ("*.h", "*.hpp", "*.cc", "*.cpp", "*.cu")


def target_of(header):
    """The project folder a header belongs to, or None for external ones."""
    parts = header.split("/")
    if len(parts) >= 2 and parts[0] == "packfeed":
        return "proto" if parts[1] == "v1" else parts[1]
    return None


def check(root):
    root = pathlib.Path(root)
    errors = []
    for folder, allowed in ALLOWED.items():
        for pattern in SOURCES:
            for path in sorted((root / folder).rglob(pattern)):
                rel = path.relative_to(root).as_posix()
                extra = set().union(*(v for k, v in EXTRA.items()
                                      if rel.startswith(k + "/")))
                text = path.read_text(errors="replace")
                for header in INCLUDE.findall(text):
                    target = target_of(header)
                    if target and target not in allowed | extra:
                        errors.append(f"{rel}: includes {header} "
                                      f"({folder} may not depend on {target})")
                    if folder == "scheduler" and SCHEDULER_FORBIDDEN.match(header):
                        errors.append(f"{rel}: includes <{header}>; scheduler/ "
                                      "must stay pure (no I/O, threads or logging)")
    return errors


def self_test():
    with tempfile.TemporaryDirectory() as tmp:
        root = pathlib.Path(tmp)
        for folder, body in {
            "scheduler/src/a.cc": '#include "packfeed/server/x.h"\n#include <thread>\n',
            "transport/src/b.cc": '#include "packfeed/scheduler/plan.h"\n',
            "client/src/c.cc": '#include "packfeed/v1/control.pb.h"\n',
            "server/ctl/dump.cc": '#include "packfeed/client/client.h"\n',
            "server/src/d.cc": '#include "packfeed/client/client.h"\n',
        }.items():
            path = root / folder
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(body)
        errors = check(root)
        expected = [
            "scheduler/src/a.cc: includes packfeed/server/x.h",
            "scheduler/src/a.cc: includes <thread>",
            "transport/src/b.cc: includes packfeed/scheduler/plan.h",
            "server/src/d.cc: includes packfeed/client/client.h",
        ]
        for want in expected:
            if not any(e.startswith(want) for e in errors):
                print(f"self-test: violation not caught: {want}")
                return 1
        if len(errors) != len(expected):
            print("self-test: unexpected errors:", *errors, sep="\n  ")
            return 1
    print("layering self-test: all 4 planted violations caught, 0 false alarms")
    return 0


def main():
    if sys.argv[1:] == ["--self-test"]:
        return self_test()
    errors = check(sys.argv[1])
    for error in errors:
        print(error)
    if errors:
        print(f"{len(errors)} include(s) break DESIGN.md §2's directions")
        return 1
    print("layering: every include follows DESIGN.md §2")
    return 0


if __name__ == "__main__":
    sys.exit(main())
