#!/usr/bin/env python3
"""Fails when the tree breaks DESIGN.md §2's layering, in any of three ways:

1. includes: a source file includes a folder it may not depend on, or another
   folder's internal/ headers;
2. link dependencies: a folder's CMake library links a packfeed library it may
   not depend on (target_link_libraries in <folder>/CMakeLists.txt);
3. namespaces: a file in folder F declares a namespace other than
   packfeed::F (or one inside it); common/ is the shared vocabulary and lives
   in packfeed itself.

Allowed directions: server -> dataset, scheduler, transport, proto, common
(and client, for packfeedctl only); client -> transport, proto, common;
transport -> common; dataset -> common; scheduler -> common (+ Abseil);
common -> Abseil only. Nothing depends on server. scheduler/ must also stay
pure: no threads, no I/O, no logging, no UCX/gRPC.

Usage: layering_check.py SOURCE_ROOT | --self-test
"""
import pathlib
import re
import sys
import tempfile

ALLOWED = {
    "common": {"common"},
    "proto": {"proto"},
    "dataset": {"dataset", "common"},
    "scheduler": {"scheduler", "common"},
    "transport": {"transport", "common"},
    "client": {"client", "transport", "proto", "common"},
    "server": {"server", "dataset", "scheduler", "transport", "proto", "common"},
}
# packfeedctl's `dump` attaches as a rank, so server/ctl may use the client.
EXTRA = {"server/ctl": {"client"}}
# Headers that would make the scheduler impure.
SCHEDULER_FORBIDDEN = re.compile(
    r"^(thread|mutex|shared_mutex|condition_variable|future|atomic|fstream|"
    r"iostream|cstdio|stdio\.h|unistd\.h|fcntl\.h|sys/.*|spdlog/.*|ucp/.*|"
    r"grpc.*|google/protobuf/.*|cuda.*|absl/synchronization/.*)$")
INCLUDE = re.compile(r'^\s*#\s*include\s*[<"]([^>"]+)[>"]', re.M)
NAMESPACE = re.compile(r"^\s*namespace\s+([\w:]+)\s*\{", re.M)
LINK = re.compile(r"target_link_libraries\(\s*(\w+)([^)]*)\)", re.S)
PACKFEED_LIBRARY = re.compile(r"\bpackfeed(?:::|_)(\w+)")
SOURCES = ("*.h", "*.hpp", "*.cc", "*.cpp", "*.cu")


def target_of(header):
    """The project folder a header belongs to, or None for external ones."""
    parts = header.split("/")
    if len(parts) >= 2 and parts[0] == "packfeed":
        return "proto" if parts[1] == "v1" else parts[1]
    if len(parts) >= 3 and parts[0] in ALLOWED and parts[1] in ("internal", "ctl"):
        return parts[0]
    return None


def allowed_for(folder, rel):
    extra = set().union(*(v for k, v in EXTRA.items() if rel.startswith(k + "/")))
    return ALLOWED[folder] | extra


def check_sources(root, errors):
    for folder in ALLOWED:
        for pattern in SOURCES:
            for path in sorted((root / folder).rglob(pattern)):
                rel = path.relative_to(root).as_posix()
                text = path.read_text(errors="replace")
                for header in INCLUDE.findall(text):
                    target = target_of(header)
                    if target and target not in allowed_for(folder, rel):
                        errors.append(f"{rel}: includes {header} "
                                      f"({folder} may not depend on {target})")
                    elif target and target != folder and "/internal/" in header:
                        errors.append(f"{rel}: includes {header}, "
                                      f"internal to {target}/")
                    if folder == "scheduler" and SCHEDULER_FORBIDDEN.match(header):
                        errors.append(f"{rel}: includes <{header}>; scheduler/ "
                                      "must stay pure (no I/O, threads or logging)")
                expected = "packfeed" if folder == "common" else f"packfeed::{folder}"
                for namespace in NAMESPACE.findall(text):
                    if namespace.startswith("packfeed") and not (
                            namespace == expected or namespace.startswith(expected + "::")):
                        errors.append(f"{rel}: declares namespace {namespace} "
                                      f"(files in {folder}/ live in {expected})")


def check_links(root, errors):
    for folder in ALLOWED:
        for cmake in sorted((root / folder).rglob("CMakeLists.txt")):
            rel = cmake.relative_to(root).as_posix()
            text = re.sub(r"#.*", "", cmake.read_text())
            for target, libraries in LINK.findall(text):
                # packfeed_ctl is server/ctl's library, with its allowances.
                where = "server/ctl/" if target == "packfeed_ctl" else rel
                for library in PACKFEED_LIBRARY.findall(libraries):
                    if library == "ctl":  # server/ctl's own library
                        library = "server"
                    if library in ALLOWED and library not in allowed_for(folder, where):
                        errors.append(f"{rel}: {target} links packfeed::{library} "
                                      f"({folder} may not depend on {library})")


def check(root):
    root = pathlib.Path(root)
    errors = []
    check_sources(root, errors)
    check_links(root, errors)
    return errors


def self_test():
    planted = {
        "scheduler/src/a.cc": '#include "packfeed/server/x.h"\n#include <thread>\n'
                              "namespace packfeed::scheduler {\n}\n",
        "transport/src/b.cc": '#include "packfeed/scheduler/plan.h"\n',
        "client/src/c.cc": '#include "packfeed/v1/control.pb.h"\n'
                           "namespace packfeed::client {\n}\n",
        "server/ctl/dump.cc": '#include "packfeed/client/client.h"\n',
        "server/src/d.cc": '#include "packfeed/client/client.h"\n'
                           '#include "scheduler/internal/row_packer.h"\n',
        "dataset/src/e.cc": '#include "packfeed/transport/wire.h"\n'
                            "namespace packfeed {\n}\n",
        "dataset/CMakeLists.txt": "target_link_libraries(packfeed_dataset PUBLIC\n"
                                  "  packfeed::common packfeed::transport)\n",
        "scheduler/CMakeLists.txt": "target_link_libraries(packfeed_scheduler PUBLIC packfeed::common)\n",
    }
    expected = [
        "scheduler/src/a.cc: includes packfeed/server/x.h",
        "scheduler/src/a.cc: includes <thread>",
        "transport/src/b.cc: includes packfeed/scheduler/plan.h",
        "server/src/d.cc: includes packfeed/client/client.h",
        "server/src/d.cc: includes scheduler/internal/row_packer.h",
        "dataset/src/e.cc: includes packfeed/transport/wire.h",
        "dataset/src/e.cc: declares namespace packfeed ",
        "dataset/CMakeLists.txt: packfeed_dataset links packfeed::transport",
    ]
    with tempfile.TemporaryDirectory() as tmp:
        root = pathlib.Path(tmp)
        for name, body in planted.items():
            path = root / name
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(body)
        errors = check(root)
    for want in expected:
        if not any(e.startswith(want) for e in errors):
            print(f"self-test: violation not caught: {want}")
            return 1
    if len(errors) != len(expected):
        print("self-test: unexpected errors:", *errors, sep="\n  ")
        return 1
    print(f"layering self-test: all {len(expected)} planted violations caught "
          "(includes, internal headers, links, namespaces), 0 false alarms")
    return 0


def main():
    if sys.argv[1:] == ["--self-test"]:
        return self_test()
    errors = check(sys.argv[1])
    for error in errors:
        print(error)
    if errors:
        print(f"{len(errors)} violation(s) of DESIGN.md §2's layering")
        return 1
    print("layering: includes, link dependencies and namespaces follow DESIGN.md §2")
    return 0


if __name__ == "__main__":
    sys.exit(main())
