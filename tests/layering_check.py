#!/usr/bin/env python3
"""Fails when the tree breaks the layering of docs/ARCHITECTURE.md, in any of
six ways:

1. includes: a source file includes a library it may not depend on, or the
   private headers of another library;
2. link dependencies: a CMakeLists.txt links a packfeed library that the
   folder it sits in may not depend on;
3. namespaces: a file in top-level folder F declares a namespace other than
   packfeed::F (or one inside it); common/ is the shared vocabulary and lives
   in packfeed itself; server/config's headers may forward-declare the
   messages they read (a packfeed::v1 block of `class X;` lines only);
4. status conversions: a gRPC status code cast to absl's (or back) anywhere
   but packfeed/proto/grpc_status.h, the one conversion; and generated
   messages where plain structs belong: the admin API's (service.pb.h) in
   server/config, and any generated header in server/storage,
   server/ingest or server/pipeline, directly or through the headers of
   server/ a file includes (the config layer resolves a job's
   configuration into a plain JobSpec, control/ingest_messages.h turns
   puts into plain requests; a pipeline source may write the wire's
   SlotMetadata), and any generated header in a header of server/config
   (its sources read the messages its headers forward-declare);
5. words: a word of the Words table used in the sense it says it is not
   (BANNED_WORDS: a CP part or a packing thread's portion called a chunk,
   a held step, a dp-cp rank or (in scheduler/) a cell of the global batch
   called a slot, a planner pass called a phase), in sources, tests,
   benchmarks, the Python package and the docs;
6. UCX: a UCP or UCT function called, or their headers included, outside
   transport/: every UCX protocol (the ring's, a forwarded step's reads)
   lives there, behind its RAII types.

A unit is a top-level folder, or one of server/'s libraries. Allowed
directions are the ALLOWED table below: server's libraries in the order
config -> storage -> ingest -> pipeline -> control, then its two programs.
Public headers are "packfeed/<folder>/x.h" (proto: "packfeed/v1/x.pb.h");
private headers are spelled from the source root ("scheduler/src/x.h",
"server/pipeline/x.h") and only their own unit, or for server's libraries
those above them, may include them. scheduler/ must also stay pure: no
threads, no I/O, no logging, no UCX/gRPC.

Usage: layering_check.py SOURCE_ROOT | --self-test
"""
import pathlib
import re
import sys
import tempfile

BASE = {"dataset", "scheduler", "transport", "proto", "common"}
ALLOWED = {
    "common": {"common"},
    "proto": {"proto"},
    "dataset": {"dataset", "common"},
    "scheduler": {"scheduler", "common"},
    "transport": {"transport", "common"},
    "client": {"client", "transport", "proto", "common"},
    "server/config": BASE | {"server/config"},
    "server/storage": BASE | {"server/storage"},
    "server/ingest": BASE | {"server/ingest", "server/config"},
    "server/pipeline": BASE | {"server/pipeline", "server/ingest", "server/storage",
                               "server/config"},
    "server/control": BASE | {"server/control", "server/pipeline", "server/ingest",
                              "server/storage", "server/config"},
    "server/daemon": BASE | {"server/daemon", "server/control", "server/pipeline",
                             "server/ingest", "server/storage", "server/config"},
    # packfeedctl reads configurations and, for `dump`, attaches as a rank.
    "server/ctl": BASE | {"server/ctl", "server/config", "client"},
}
# The CMake library of each unit (packfeed_<name> or packfeed::<name>).
LIBRARY = {"server_" + unit.split("/")[1]: unit for unit in ALLOWED if "/" in unit}
LIBRARY.update({unit: unit for unit in ALLOWED if "/" not in unit})
LIBRARY["ctl"] = "server/ctl"
LIBRARY["server"] = "server/control"  # the interface library of all of server/
# Headers that would make the scheduler impure.
SCHEDULER_FORBIDDEN = re.compile(
    r"^(thread|mutex|shared_mutex|condition_variable|future|atomic|fstream|"
    r"iostream|cstdio|stdio\.h|unistd\.h|fcntl\.h|sys/.*|spdlog/.*|ucp/.*|"
    r"grpc.*|google/protobuf/.*|cuda.*|absl/synchronization/.*)$")
# The admin and control API's messages: made from plain structs in
# server/control (stats_proto.h), never known to the libraries these list.
ADMIN_PROTO = re.compile(r"^packfeed/v1/service(?:\.grpc)?\.pb\.h$")
ADMIN_PROTO_FREE = ("server/config",)
# Every generated header: these read plain structs (the configuration as
# server/config/job_spec.h resolves it; figures that stats_proto.h turns
# into messages), but for what each unit lists its sources may include
# (push.cc writes each slot's SlotMetadata, the wire's own message); no
# header may, so no includer recompiles with it.
GENERATED = re.compile(r"^packfeed/v1/\w+(?:\.grpc)?\.pb\.h$")
GENERATED_FREE = {"server/storage": (), "server/ingest": (),
                  "server/pipeline": ("packfeed/v1/service.pb.h",)}
# Its sources read the messages; its headers forward-declare them, so that
# nothing below control/ recompiles with a generated header.
GENERATED_HEADER_FREE = ("server/config",)
# UCX's own API, which only transport/ may call.
UCX_CALL = re.compile(r"\bu(?:cp|ct)_\w+\s*\(")
UCX_HEADER = re.compile(r"^u(?:cp|ct)/")
# A status code cast between gRPC and absl: only the one conversion may.
STATUS_CAST = re.compile(r"static_cast<\s*(?:absl|grpc)::StatusCode\s*>")
STATUS_CONVERSION = "proto/include/packfeed/proto/grpc_status.h"
# The Words table of docs/ARCHITECTURE.md, as (where, pattern, what to say).
# A line that says "model chunk" speaks of VPP and may mention CP beside it.
CP_CONTEXT = r"(?:zigzag|\b2\s*[·x*]\s*c(?:p)?\b|\bcp[ _]split|\bcp rank)"
BANNED_WORDS = [
    ("", re.compile(rf"(?i){CP_CONTEXT}[^.\n]{{0,60}}\bchunks?\b|\bchunks?\b[^.\n]{{0,60}}"
                    rf"{CP_CONTEXT}|zigzag\w*chunk"),
     "a chunk is a VPP model chunk; the zigzag CP split cuts parts, a rank holds its slice"),
    ("", re.compile(r"(?i)\bchunks?\b[^.\n]{0,40}\b(?:positions|packing|workers?|threads?)\b|"
                    r"\b(?:packing|workers?|threads?)\b[^.\n]{0,40}\bchunks?\b|ChunkPositions"),
     "a chunk is a VPP model chunk; packing threads write portions of a microbatch"),
    ("", re.compile(r"(?i)StepSlot|dp-cp slot|dp_cp_slot"),
     "a slot is a microbatch's place in a ring; a step is held, a dp-cp rank is a rank"),
    ("scheduler/", re.compile(r"(?i)\bphases?\b"),
     "a phase is a part of the daemon's pipeline; the planner runs passes"),
    ("scheduler/", re.compile(r"(?i)\bslots?\b"),
     "a slot is a microbatch's place in a ring; the planner fills cells of the global batch"),
]
INCLUDE = re.compile(r'^\s*#\s*include\s*[<"]([^>"]+)[>"]', re.M)
NAMESPACE = re.compile(r"^\s*namespace\s+([\w:]+)\s*\{", re.M)
MESSAGE_DECLARATIONS = re.compile(r"^\s*namespace\s+packfeed::v1\s*\{\s*(?:class\s+\w+;\s*)+\}", re.M)
LINK = re.compile(r"target_link_libraries\(\s*(\w+)([^)]*)\)", re.S)
PACKFEED_LIBRARY = re.compile(r"\bpackfeed(?:::|_)(\w+)")
SOURCES = ("*.h", "*.hpp", "*.cc", "*.cpp", "*.cu")
WORD_FILES = SOURCES + ("*.py", "*.md")


def unit_of(rel):
    """The unit a repository path belongs to, or None outside the layered tree."""
    parts = rel.split("/")
    if len(parts) >= 2 and "/".join(parts[:2]) in ALLOWED:
        return "/".join(parts[:2])
    return parts[0] if parts[0] in ALLOWED else None


def target_of(header):
    """(unit, private) for a project header; (None, False) for external ones."""
    parts = header.split("/")
    if len(parts) >= 3 and parts[0] == "packfeed":
        return ("proto" if parts[1] == "v1" else parts[1]), False
    unit = unit_of(header)
    return (unit, True) if unit and len(parts) >= 2 else (None, False)


def check_sources(root, errors):
    for path in sorted(p for pattern in SOURCES for p in root.rglob(pattern)):
        rel = path.relative_to(root).as_posix()
        unit = unit_of(rel)
        if unit is None:
            continue
        text = path.read_text(errors="replace")
        for header in INCLUDE.findall(text):
            target, private = target_of(header)
            if target is None:
                pass
            elif target not in ALLOWED[unit]:
                errors.append(f"{rel}: includes {header} ({unit} may not depend on {target})")
            elif private and target.split("/")[0] != unit.split("/")[0]:
                errors.append(f"{rel}: includes {header}, private to {target}/")
            is_header = rel.endswith((".h", ".hpp"))
            if (ADMIN_PROTO.match(header) and unit in ADMIN_PROTO_FREE) or (
                    GENERATED.match(header) and
                    ((unit in GENERATED_FREE and (is_header or header not in GENERATED_FREE[unit]))
                     or (unit in GENERATED_HEADER_FREE and is_header))):
                errors.append(f"{rel}: includes {header}; {unit} reads and reports plain "
                              "structs (server/config/job_spec.h, server/control/stats_proto.h)")
            if unit == "scheduler" and SCHEDULER_FORBIDDEN.match(header):
                errors.append(f"{rel}: includes <{header}>; scheduler/ "
                              "must stay pure (no I/O, threads or logging)")
        if unit != "transport" and (UCX_CALL.search(text) or
                                    any(UCX_HEADER.match(h) for h in INCLUDE.findall(text))):
            errors.append(f"{rel}: calls UCX outside transport/; a UCX protocol lives there")
        if rel != STATUS_CONVERSION and STATUS_CAST.search(text):
            errors.append(f"{rel}: converts a gRPC status by hand; use {STATUS_CONVERSION}")
        folder = unit.split("/")[0]
        expected = "packfeed" if folder == "common" else f"packfeed::{folder}"
        declared = MESSAGE_DECLARATIONS.sub("", text) if unit == "server/config" else text
        for namespace in NAMESPACE.findall(declared):
            if namespace.startswith("packfeed") and not (
                    namespace == expected or namespace.startswith(expected + "::")):
                errors.append(f"{rel}: declares namespace {namespace} "
                              f"(files in {folder}/ live in {expected})")


def check_generated_reach(root, errors):
    """A file of a GENERATED_FREE unit that reaches a generated header through
    server/ headers (a direct include is check_sources' to report)."""
    def includes(rel):
        path = root / rel
        return INCLUDE.findall(path.read_text(errors="replace")) if path.is_file() else []

    for path in sorted(p for pattern in SOURCES for p in (root / "server").rglob(pattern)
                       if unit_of(p.relative_to(root).as_posix()) in GENERATED_FREE):
        rel = path.relative_to(root).as_posix()
        seen, todo = set(), [h for h in includes(rel) if h.startswith("server/")]
        while todo:
            header = todo.pop()
            if header in seen:
                continue
            seen.add(header)
            reached = includes(header)
            proto = next((h for h in reached if GENERATED.match(h)), None)
            if proto:
                errors.append(f"{rel}: reaches {proto} through {header}; "
                              f"{unit_of(rel)} reads and reports plain structs")
                break
            todo += [h for h in reached if h.startswith("server/")]


def check_links(root, errors):
    for cmake in sorted(root.rglob("CMakeLists.txt")):
        rel = cmake.relative_to(root).as_posix()
        unit = unit_of(rel)
        if unit is None:
            continue
        text = re.sub(r"#.*", "", cmake.read_text())
        for target, libraries in LINK.findall(text):
            # server/CMakeLists.txt builds packfeedctl's and the daemon's
            # targets: each is held to its own unit's allowances.
            where = LIBRARY.get(target.removeprefix("packfeed_"), unit)
            if target == "packfeedd":
                where = "server/daemon"
            for library in PACKFEED_LIBRARY.findall(libraries):
                dependency = LIBRARY.get(library)
                if dependency and dependency not in ALLOWED[where]:
                    errors.append(f"{rel}: {target} links packfeed {library} "
                                  f"({where} may not depend on {dependency})")


def check_words(root, errors):
    folders = sorted({unit.split("/")[0] for unit in ALLOWED} | {"tests", "bench"})
    roots = [root / folder for folder in folders if (root / folder).is_dir()]
    files = [p for folder in roots for pattern in WORD_FILES for p in folder.rglob(pattern)]
    files += [p for p in [root / "README.md", *sorted((root / "docs").glob("*.md"))] if p.exists()]
    for path in sorted(set(files)):
        rel = path.relative_to(root).as_posix()
        if rel == "tests/layering_check.py":  # names the words it bans
            continue
        for number, line in enumerate(path.read_text(errors="replace").splitlines(), 1):
            if "model chunk" in line.lower():
                continue
            for where, pattern, meaning in BANNED_WORDS:
                if rel.startswith(where) and pattern.search(line):
                    errors.append(f"{rel}:{number}: words: {meaning} "
                                  f"(docs/ARCHITECTURE.md): {line.strip()[:80]}")


def check(root):
    root = pathlib.Path(root)
    errors = []
    check_sources(root, errors)
    check_generated_reach(root, errors)
    check_links(root, errors)
    check_words(root, errors)
    return errors


def self_test():
    planted = {
        "scheduler/src/a.cc": '#include "packfeed/server/x.h"\n#include <thread>\n'
                              "namespace packfeed::scheduler {\n}\n",
        "transport/src/b.cc": '#include "packfeed/scheduler/plan.h"\n',
        "client/src/c.cc": '#include "packfeed/v1/control.pb.h"\n'
                           '#include "client/src/watch_stream.h"\n'
                           "namespace packfeed::client {\n}\n",
        "server/ctl/dump.cc": '#include "packfeed/client/client.h"\n'
                              '#include "server/config/job_config.h"\n',
        "server/pipeline/p.h": '#include "packfeed/v1/service.pb.h"\n',
        "server/pipeline/p.cc": '#include "packfeed/v1/service.pb.h"\n',
        "server/pipeline/q.h": '#include "server/ingest/i.h"\n',
        "server/ingest/i.h": '#include "server/ingest/j.h"\n',
        "server/ingest/j.h": '#include "packfeed/v1/service.pb.h"\n',
        "server/pipeline/r.cc": '#include "packfeed/v1/config.pb.h"\n',
        "server/pipeline/t.cc": '#include "server/config/c.h"\n',
        "server/config/c.h": '#include "packfeed/v1/config.pb.h"\n',
        "server/config/a.cc": '#include "packfeed/v1/service.grpc.pb.h"\n',
        "server/config/m.h": "namespace packfeed::v1 {\nclass JobConfig;\n}\n"
                             "namespace packfeed::server {\n}\n",
        "server/config/n.h": "namespace packfeed::v1 {\nclass JobConfig { int x; };\n}\n",
        "server/ingest/u.cc": "ucs_status_ptr_t get = ucp_get_nbx(ep, local, n, at, key, &p);\n",
        "client/src/u.h": "#include <ucp/api/ucp.h>\n",
        "server/control/d.cc": '#include "packfeed/client/client.h"\n'
                               '#include "scheduler/src/row_packer.h"\n'
                               '#include "server/pipeline/job.h"\n',
        "server/storage/s.cc": '#include "server/pipeline/job.h"\n'
                               '#include "packfeed/v1/service.pb.h"\n'
                               "namespace packfeed::server {\n}\n",
        "server/ingest/CMakeLists.txt": "target_link_libraries(packfeed_server_ingest PUBLIC\n"
                                        "  packfeed_server_config packfeed_server_pipeline)\n",
        "dataset/src/e.cc": '#include "packfeed/transport/wire.h"\n'
                            "namespace packfeed {\n}\n",
        "dataset/CMakeLists.txt": "target_link_libraries(packfeed_dataset PUBLIC\n"
                                  "  packfeed::common packfeed::transport)\n",
        "scheduler/CMakeLists.txt": "target_link_libraries(packfeed_scheduler PUBLIC packfeed::common)\n",
        "server/ctl/f.cc": "auto code = static_cast<absl::StatusCode>(status.error_code());\n",
        "scheduler/src/g.cc": "// the packer's second phase\n"
                              "// each slot holds micro_batch_size samples\n",
        "server/pipeline/h.cc": "// CP rank k takes chunk k and its mirror\n"
                                "// the zigzag split of a model chunk is fine here\n"
                                "struct JobRunner::StepSlot;\n"
                                "// the packing threads write chunks of 16 384 positions\n",
        "docs/W.md": "each sequence in 2·CP chunks\n",
        STATUS_CONVERSION: "namespace packfeed::proto {\n"
                           "auto a = static_cast<absl::StatusCode>(s.error_code());\n}\n",
    }
    expected = [
        "scheduler/src/a.cc: includes packfeed/server/x.h",
        "scheduler/src/a.cc: includes <thread>",
        "transport/src/b.cc: includes packfeed/scheduler/plan.h",
        "server/control/d.cc: includes packfeed/client/client.h",
        "server/control/d.cc: includes scheduler/src/row_packer.h",
        "server/storage/s.cc: includes server/pipeline/job.h",
        "server/storage/s.cc: includes packfeed/v1/service.pb.h; server/storage reads",
        "server/pipeline/p.h: includes packfeed/v1/service.pb.h; server/pipeline reads",
        "server/pipeline/q.h: reaches packfeed/v1/service.pb.h through server/ingest/j.h",
        "server/ingest/j.h: includes packfeed/v1/service.pb.h; server/ingest reads",
        "server/ingest/i.h: reaches packfeed/v1/service.pb.h through server/ingest/j.h",
        "server/pipeline/r.cc: includes packfeed/v1/config.pb.h; server/pipeline reads",
        "server/pipeline/t.cc: reaches packfeed/v1/config.pb.h through server/config/c.h",
        "server/config/a.cc: includes packfeed/v1/service.grpc.pb.h; server/config reads",
        "server/config/c.h: includes packfeed/v1/config.pb.h; server/config reads",
        "server/ingest/CMakeLists.txt: packfeed_server_ingest links packfeed server_pipeline",
        "dataset/src/e.cc: includes packfeed/transport/wire.h",
        "dataset/src/e.cc: declares namespace packfeed ",
        "server/config/n.h: declares namespace packfeed::v1",
        "dataset/CMakeLists.txt: packfeed_dataset links packfeed transport",
        "server/ctl/f.cc: converts a gRPC status by hand",
        "server/ingest/u.cc: calls UCX outside transport/",
        "client/src/u.h: calls UCX outside transport/",
        "scheduler/src/g.cc:1: words: a phase",
        "scheduler/src/g.cc:2: words: a slot",
        "server/pipeline/h.cc:1: words: a chunk",
        "server/pipeline/h.cc:3: words: a slot",
        "server/pipeline/h.cc:4: words: a chunk",
        "docs/W.md:1: words: a chunk",
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
          "(includes, private headers, server's libraries, links, namespaces, status "
          "conversions, words, UCX outside transport/), "
          "0 false alarms")
    return 0


def main():
    if sys.argv[1:] == ["--self-test"]:
        return self_test()
    errors = check(sys.argv[1])
    for error in errors:
        print(error)
    if errors:
        print(f"{len(errors)} violation(s) of the layering in docs/ARCHITECTURE.md")
        return 1
    print("layering: includes, link dependencies, namespaces, words and UCX calls follow "
          "docs/ARCHITECTURE.md")
    return 0


if __name__ == "__main__":
    sys.exit(main())
