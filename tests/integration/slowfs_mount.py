"""tests/slowfs mounted for a test: a directory served read-only with a set
latency per request and a bandwidth cap, counting every byte read per file;
`.bin` files bypass the page cache (direct I/O), so every read is seen."""
import json
import subprocess

from daemon_harness import wait_until


class SlowMount:
    """slowfs serving `source` at `mount` until close()."""

    def __init__(self, slowfs, source, mount, latency_ms=0, bandwidth_mib=0):
        self.mount = mount
        mount.mkdir(exist_ok=True)
        self.process = subprocess.Popen(
            [slowfs, str(source), str(mount), "-f", f"--latency-ms={latency_ms}",
             f"--bandwidth-mib={bandwidth_mib}", "--direct-io-suffix=.bin"],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        self.control = mount / ".slowfs"
        wait_until(self.control.exists, "slowfs mounted")

    def bytes_read(self, name):
        files = json.loads(self.control.read_text())["files"]
        return files.get(f"/{name}", {}).get("bytes", 0)

    def tell(self, line):
        """One control line: latency_ms=N, hang=0|1, fail=/PATH, reset, ..."""
        self.control.write_text(line + "\n")

    def close(self):
        subprocess.run(["fusermount3", "-u", str(self.mount)], capture_output=True)
        self.process.wait(timeout=30)
