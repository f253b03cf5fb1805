"""Runs one kubeconfig exec credential plugin with a time limit (a script, standard library
only: `python -I exec_limit.py SECONDS -- COMMAND [ARGS...]`).

Owns: the limit on how long the official client waits for a credential plugin. The client
runs a plugin and reads its output with no time limit of its own, at the start, on every
credentials reload and, for a token near its expiry, before requests; a plugin that hangs
(a cloud CLI waiting on a network that does not answer, a prompt) would hold those for
ever. `client.load_configuration` puts this script in front of every `exec` user: it starts
the plugin in a session of its own with the environment, working directory and standard
input it was given, relays the plugin's output once the plugin has finished, and when the
limit passes kills the plugin's whole process group (what it started too) and fails.

How it fails: past the limit, exit status 124 and one line on stderr naming the plugin and
the limit (the client logs it, and the load yields no credential); a plugin that cannot be
started, 127; otherwise the plugin's own exit status (128 + N when it died of signal N).
The plugin's output is passed on only after it finished, so a process the plugin left
behind holding a pipe open cannot keep the client waiting either.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from typing import Sequence

TIMED_OUT = 124
NOT_STARTED = 127
# After SIGTERM, how long the plugin's processes get before SIGKILL.
TERM_GRACE = 1.0


def _kill_group(proc: subprocess.Popen[bytes]) -> None:
    for sig, wait in ((signal.SIGTERM, TERM_GRACE), (signal.SIGKILL, None)):
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            return
        try:
            proc.wait(wait)
            if sig == signal.SIGTERM:
                # The leader is gone; others of its group may not be.
                os.killpg(proc.pid, signal.SIGKILL)
            return
        except subprocess.TimeoutExpired:
            continue
        except ProcessLookupError:
            return


def main(argv: Sequence[str]) -> int:
    if len(argv) < 3 or argv[1] != "--":
        print("usage: exec_limit.py SECONDS -- COMMAND [ARGS...]", file=sys.stderr)
        return 2
    seconds, command = float(argv[0]), list(argv[2:])
    try:
        proc = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                start_new_session=True)
    except OSError as exc:
        print(f"exec plugin {command[0]} could not be started: {exc}", file=sys.stderr)
        return NOT_STARTED
    try:
        out, err = proc.communicate(timeout=seconds)
    except subprocess.TimeoutExpired:
        _kill_group(proc)
        print(f"exec plugin {command[0]} did not finish within {seconds:g}s"
              " (credentials-exec-timeout): killed", file=sys.stderr)
        return TIMED_OUT
    sys.stdout.buffer.write(out)
    sys.stderr.buffer.write(err)
    code = proc.returncode
    return 128 - code if code < 0 else code


if __name__ == "__main__":
    sys.stdout.flush()
    status = main(sys.argv[1:])
    sys.stdout.flush()
    sys.stderr.flush()
    # Not sys.exit: that would join nothing here, but os._exit also skips waiting for the
    # pipes' reader threads of a killed plugin's leftovers.
    os._exit(status)
