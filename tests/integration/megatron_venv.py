"""Megatron-Core's own dataset code, for side-by-side checks: megatron-core
0.16.1 installed with --no-deps into a venv over Debian's python3 (its numpy
and torch 1.13), and its megatron.core.datasets imported without the
package's __init__ (which pulls distributed code that needs a newer torch)."""
import importlib.util
import logging
import os
import pathlib
import shutil
import subprocess
import sys
import types

MEGATRON_CORE_VERSION = "0.16.1"
MEGATRON_CORE = f"megatron-core=={MEGATRON_CORE_VERSION}"
MEGATRON_CORE_019_VERSION = "0.19.2"  # fetched as a wheel: it installs on Python >= 3.12 only
SYSTEM_PYTHON = "/usr/bin/python3"  # Debian's, with numpy and torch 1.13
SKIPPED = 77
# What pip says when PyPI cannot be reached at all. Not "Could not find a
# version": pip says that too for a version this Python cannot install, which
# is a failure, not a reason to skip.
UNREACHABLE = ("NewConnectionError", "Temporary failure in name resolution",
               "Network is unreachable", "ConnectTimeout", "No route to host",
               "dns error", "tcp connect error")  # the last two: uv's


def installed_version(python):
    """megatron-core's version in the venv of `python`, or None when it is
    not installed there or numpy or torch do not import. (Not megatron.core
    itself: its __init__ needs a newer torch; import_megatron_datasets
    goes around it.)"""
    probe = subprocess.run(
        [str(python), "-c", "import importlib.metadata as m, importlib.util, numpy, torch; "
         "assert importlib.util.find_spec('megatron'); print(m.version('megatron-core'))"],
        capture_output=True, text=True)
    return probe.stdout.strip() if probe.returncode == 0 else None


def _skip(reason):
    """Skips the test that needs what could not be had: a pytest skip inside
    a test run, exit code 77 (ctest's skip) from the launcher below."""
    if "pytest" in sys.modules:
        import pytest
        pytest.skip(reason, allow_module_level=True)
    print(f"SKIPPED: {reason}")
    sys.exit(SKIPPED)


def _install(command, what):
    """Runs an installer's `command`; skips only when PyPI cannot be
    reached, and fails on any other error."""
    run = subprocess.run([str(c) for c in command], capture_output=True, text=True)
    if run.returncode != 0:
        if any(s in run.stderr for s in UNREACHABLE):
            _skip(f"PyPI cannot be reached to fetch {what}:\n{run.stderr}")
        raise RuntimeError(f"{' '.join(map(str, command))} failed:\n{run.stderr}")


def _pip(python, args, what):
    _install([python, "-m", "pip", *args], what)


def ensure_venv(venv):
    """The venv's python with megatron-core MEGATRON_CORE_VERSION, installing
    it first when the venv lacks it or holds another version. Skips only
    when PyPI cannot be reached, naming why; any other pip failure fails."""
    venv = pathlib.Path(venv)
    python = venv / "bin" / "python"
    if python.exists() and installed_version(python) == MEGATRON_CORE_VERSION:
        return python
    subprocess.run([SYSTEM_PYTHON, "-m", "venv", "--system-site-packages", str(venv)],
                   check=True)
    _pip(python, ["install", "-q", "--no-deps", MEGATRON_CORE], MEGATRON_CORE)
    found = installed_version(python)
    if found != MEGATRON_CORE_VERSION:
        raise RuntimeError(f"{venv}: megatron-core {found} after installing {MEGATRON_CORE}")
    return python


def rerun_in_venv(venv, script, args):
    """Runs `script` with the venv's python (PF_IN_MEGATRON_VENV=1) and
    exits with its code (the benches that set Megatron beside packfeed)."""
    python = ensure_venv(venv)
    env = dict(os.environ, PF_IN_MEGATRON_VENV="1")
    sys.exit(subprocess.run([str(python), script, *args], env=env).returncode)


def _import_datasets_from(root, **stand_ins):
    """(BlendedMegatronDatasetBuilder, GPTDataset, GPTDatasetConfig) of the
    megatron package at `root`, imported around its __init__ (which pulls
    distributed code that needs a newer torch), with stand-ins for the
    modules the datasets import only for logging and tokenizer typing, and
    `stand_ins` ({module: {attribute: value}}) for more."""
    for name, path in [("megatron", root), ("megatron.core", os.path.join(root, "core"))]:
        module = types.ModuleType(name)
        module.__path__ = [path]
        sys.modules[name] = module
    stand_ins = {
        "megatron.core.utils": {"log_single_rank": lambda logger, level, msg, *a, **k:
                                logger.log(level, msg)},
        "megatron.core.tokenizers": {"MegatronTokenizerBase": object},
        **stand_ins,
    }
    for name, attributes in stand_ins.items():
        module = types.ModuleType(name)
        for attribute, value in attributes.items():
            setattr(module, attribute, value)
        sys.modules[name] = module
    from megatron.core.datasets.blended_megatron_dataset_builder import \
        BlendedMegatronDatasetBuilder
    from megatron.core.datasets.gpt_dataset import GPTDataset, GPTDatasetConfig
    return BlendedMegatronDatasetBuilder, GPTDataset, GPTDatasetConfig


def import_megatron_datasets():
    """(BlendedMegatronDatasetBuilder, GPTDataset, GPTDatasetConfig) of the
    installed megatron-core."""
    return _import_datasets_from(
        list(importlib.util.find_spec("megatron").submodule_search_locations)[0])




def fetch_megatron_019(directory):
    """megatron-core 0.19.2's wheel unpacked under `directory`/src, with the
    compiled index helper of the 0.16.1 install running this script (0.19.2
    installs on Python >= 3.12 only; its helpers.cpp is identical, and its
    datasets package runs on this Python). Returns the source root."""
    import zipfile
    directory = pathlib.Path(directory)
    src = directory / "src"
    datasets = src / "megatron" / "core" / "datasets"
    if not (datasets / "gpt_dataset.py").exists():
        wheels = directory / "wheel"
        _pip(sys.executable, ["download", "-q", "--no-deps", "--python-version", "3.12",
                                      "--only-binary", ":all:", "-d", str(wheels),
                                      f"megatron-core=={MEGATRON_CORE_019_VERSION}"],
                     f"megatron-core {MEGATRON_CORE_019_VERSION}")
        wheel = next(wheels.glob("megatron_core-*.whl"))
        shutil.rmtree(src, ignore_errors=True)
        with zipfile.ZipFile(wheel) as archive:
            archive.extractall(src)
    found = [d.name for d in src.glob("megatron_core-*.dist-info")]
    if found != [f"megatron_core-{MEGATRON_CORE_019_VERSION}.dist-info"]:
        raise RuntimeError(f"{src}: {found}, not megatron-core {MEGATRON_CORE_019_VERSION}")
    installed = pathlib.Path(importlib.util.find_spec("megatron").submodule_search_locations[0])
    helper = next((installed / "core" / "datasets").glob("helpers_cpp.cpython-*.so"))
    if not (datasets / helper.name).exists():
        shutil.copy(helper, datasets / helper.name)
    return src


def import_megatron_019(src):
    """megatron-core 0.19.2's datasets (BlendedMegatronDatasetBuilder,
    GPTDataset, GPTDatasetConfig) from `src`, with a stand-in for the guarded
    numpy.load it also imports; and the source of its megatron/core/utils.py,
    whose batch functions a test takes by name."""
    import numpy
    root = os.path.join(str(src), "megatron")
    classes = _import_datasets_from(
        root, **{"megatron.core.safe_globals": {"safe_numpy_load": numpy.load}})
    return (*classes, pathlib.Path(root, "core", "utils.py").read_text())


def megatron_019_from_environment():
    """(source root, BlendedMegatronDatasetBuilder, GPTDataset,
    GPTDatasetConfig, utils.py's source) of 0.19.2, fetched into
    PF_MEGATRON_019_DIR (tests/CMakeLists.txt), its loggers quiet but for
    errors."""
    src = fetch_megatron_019(os.environ["PF_MEGATRON_019_DIR"])
    loaded = import_megatron_019(src)
    logging.getLogger("megatron").setLevel(logging.ERROR)
    return (src, *loaded)


def init_single_process(workdir):
    """Megatron's builders ask for the rank when they cache: one process,
    rank 0 of a gloo group."""
    import torch.distributed
    torch.distributed.init_process_group("gloo", init_method=f"file://{workdir}/pg", rank=0,
                                         world_size=1)


class Tokenizer:
    """What the datasets ask of a tokenizer: no vocabulary size (the .idx
    names the dtype), the EOD id, no pad (Megatron then pads with -1)."""
    vocab_size = None
    unique_identifiers = {"class": "TestTokenizer"}

    def __init__(self, eod):
        self.eod = eod


def write_megatron_dataset(prefix, documents, mean, vocab, dtype, seed, eod):
    """A dataset as Megatron's preprocess_data writes it, with Megatron's own
    IndexedDatasetBuilder: lognormal document lengths around `mean`, each
    document's tokens ending with the EOD; every fifth document stored as
    two sequences (a sentence split). Call after import_megatron_datasets."""
    import numpy
    from megatron.core.datasets.indexed_dataset import IndexedDatasetBuilder
    random = numpy.random.RandomState(seed)
    builder = IndexedDatasetBuilder(f"{prefix}.bin", dtype=dtype)
    for d in range(documents):
        length = int(numpy.clip(random.lognormal(numpy.log(mean), 0.8), 2, 20 * mean))
        tokens = random.randint(1, vocab, size=length)
        tokens[-1] = eod
        lengths = [length] if d % 5 or length < 4 else [length // 2, length - length // 2]
        builder.add_document(tokens, lengths)
    builder.finalize(f"{prefix}.idx")


# What a venv made by ensure_full_venv holds besides packfeed (and uv).
FULL_PACKAGES = ["torch", f"megatron-core=={MEGATRON_CORE_019_VERSION}", "numpy", "pytest",
                 "scikit-build-core>=0.8", "pybind11>=2.10", "cmake>=3.25", "ninja"]
# The folders the Python package is built from (pyproject.toml, PF_PYTHON_ONLY).
PACKAGE_SOURCES = ("CMakeLists.txt", "pyproject.toml", "cmake", "common", "proto", "transport",
                   "client")


def python_312():
    """A CPython 3.12 or later to make a full venv with (Megatron-Core 0.19
    needs it; Debian 12 has 3.11): python3.12 or python3.13 on PATH, else
    pyenv's. Skips when there is none."""
    candidates = [shutil.which(f"python3.{minor}") for minor in (12, 13)]
    pyenv = pathlib.Path(os.environ.get("PYENV_ROOT", pathlib.Path.home() / ".pyenv"))
    candidates += sorted(str(p) for p in pyenv.glob("versions/3.1[23]*/bin/python3"))
    for candidate in candidates:
        if candidate and subprocess.run([candidate, "-c", "import venv, ensurepip"],
                                        capture_output=True).returncode == 0:
            return candidate
    _skip("no CPython 3.12 or later to run Megatron-Core 0.19's training loop with")


def _package_stamp(source_root):
    """The newest modification time under the package's sources."""
    newest = 0.0
    for name in PACKAGE_SOURCES:
        path = pathlib.Path(source_root, name)
        for f in [path] if path.is_file() else path.rglob("*"):
            newest = max(newest, f.stat().st_mtime)
    return str(newest)


def ensure_full_venv(venv, source_root):
    """A Python 3.12 venv with PyPI's torch, megatron-core 0.19.2 whole (its
    training loop, not only its datasets) and packfeed built from
    `source_root` (rebuilt when its sources changed). Skips only when PyPI
    cannot be reached or there is no Python 3.12."""
    venv = pathlib.Path(venv)
    python = venv / "bin" / "python"
    ready = venv / "packages-ready"
    if not ready.exists():
        subprocess.run([python_312(), "-m", "venv", "--clear", str(venv)], check=True)
        # uv, not pip, for torch and its CUDA wheels (5 GB unpacked): pip
        # took 160 s of one core to fetch, unpack and byte-compile them, uv
        # 29 s, for the same packages. Its cache sits in the venv, whose
        # files it hard-links, and goes with it.
        _pip(python, ["install", "-q", "uv"], "uv")
        _install([venv / "bin" / "uv", "pip", "install", "-q", "--python", python,
                  "--cache-dir", venv / "uv-cache", *FULL_PACKAGES], "torch and megatron-core")
        ready.write_text("\n".join(FULL_PACKAGES))
    stamp = venv / "packfeed-stamp"
    wanted = _package_stamp(source_root)
    if not stamp.exists() or stamp.read_text() != wanted:
        _pip(python, ["install", "-q", "--no-build-isolation", "--no-deps", "--force-reinstall",
                      str(source_root)], "nothing (packfeed is built from source)")
        stamp.write_text(wanted)
    return python


def main():
    """megatron_venv.py VENV_DIR ARGS...: makes the venv (installing
    megatron-core MEGATRON_CORE_VERSION; exit 77 when PyPI cannot be
    reached) and runs its python with ARGS, as ctest runs the Megatron tests:
    `megatron_venv.py VENV -m pytest megatron_pretraining_test.py ...`.
    megatron_venv.py --full SOURCE_ROOT VENV_DIR ARGS...: the same with
    ensure_full_venv (Python 3.12, torch, Megatron-Core 0.19.2, packfeed)."""
    if len(sys.argv) >= 5 and sys.argv[1] == "--full":
        python = str(ensure_full_venv(sys.argv[3], sys.argv[2]))
        os.execv(python, [python, *sys.argv[4:]])
    if len(sys.argv) < 3:
        sys.exit(main.__doc__)
    python = str(ensure_venv(sys.argv[1]))
    os.execv(python, [python, *sys.argv[2:]])


if __name__ == "__main__":
    main()
