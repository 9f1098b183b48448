"""What the launcher's processes tell each other: every format that crosses a process boundary, in one place.

- the rank wrapper to the leader, in mpirun's stderr: its start and failure markers (a marker and one line of
  JSON), and its program's stdout lines, behind STDOUT_MARK (proc/lines.py);
- the leader to each rank, in the environment: the program's argv (RANK_ARGV), whether lines are tagged
  (TAG_OUTPUT), where output goes (OUTPUT_CHANNEL) and where the rank's host serves its environment (SERVED);
- the leader to each worker, over the link (`python -m smhvd.link` over ssh): JSON lines, `ready` first.
"""

from __future__ import annotations

import json

# The rank wrapper's markers, each the start of one line of mpirun's stderr followed by JSON.
FAILURE_MARKER = "@@smhvd-rank-failure@@ "
START_MARKER = "@@smhvd-rank-start@@ "
# First byte of a line a rank's program wrote to its stdout, on the rank wrapper's stderr (proc/lines.py).
STDOUT_MARK = b"\x1d"

# The program's argv under mpirun (JSON, from roles/leader.mpirun_rank_command), never on its command line.
RANK_ARGV = "SMHVD_RANK_ARGV"
# "0": the program's lines are passed on whole but untagged (launcher_tag_output).
TAG_OUTPUT = "SMHVD_TAG_OUTPUT"
# "stderr": the launcher's supervisor demultiplexes the wrapper's stderr (proc/lines.py).
OUTPUT_CHANNEL = "SMHVD_RANK_OUTPUT"
# Where each host's `train` serves its ranks' environment: the leader's own directory (roles/hostenv.py).
SERVED = "SMHVD_HOSTENV"

# The link.
READY = b"ready\n"
HEARTBEAT_INTERVAL = 2.0  # the leader sends {"event": "alive"} this often while the job runs
SILENCE_LIMIT = 10.0  # a worker whose job started declares the leader lost after this long without a word


def encode(event: dict[str, object]) -> bytes:
    return json.dumps(event, separators=(",", ":")).encode() + b"\n"


def decode(line: bytes) -> dict[str, object] | None:
    try:
        event = json.loads(line)
    except ValueError:
        return None
    return event if isinstance(event, dict) and isinstance(event.get("event"), str) else None
