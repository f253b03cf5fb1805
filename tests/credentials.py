"""Credentials that change while a launcher runs, for tests: an exec credential plugin.

`ExecPlugin` writes a small shell script that a kubeconfig's `exec` user runs, as EKS's
`aws eks get-token` or GKE's `gke-gcloud-auth-plugin` are run: it prints an ExecCredential
(`client.authentication.k8s.io/v1beta1`) whose token and `expirationTimestamp` the test sets
with `hand_out`, and it appends a line to a file each time it runs, so a test can count how
often the client (or the launcher) asked for a credential. `hang(True)` makes every later
run hang (as a cloud CLI waiting on a network that does not answer) until `hang(False)`;
`hanging_pids` names the runs that were hanging. The token is one the simulator
accepts (`Simulator.issue_admin_token`), so nothing of the client is mocked.
"""

from __future__ import annotations

import json
import os
import stat
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any

from nodepool_k8s.dev.simulator import Simulator

API_VERSION = "client.authentication.k8s.io/v1beta1"


class ExecPlugin:
    """`delay`: seconds the plugin takes (real ones call a cloud API, ~1 s)."""

    def __init__(self, directory: Path, delay: float = 0.0) -> None:
        directory.mkdir(parents=True, exist_ok=True)
        self.directory = directory
        self.credential = directory / "credential.json"
        self.log = directory / "runs"
        self.script = directory / "get-token"
        self.hang_flag = directory / "hang"
        self.pids = directory / "hanging-pids"
        self.script.write_text("#!/bin/sh\n"
                               f"echo run >> '{self.log}'\n"
                               + (f"sleep {delay}\n" if delay else "")
                               + f"if [ -e '{self.hang_flag}' ]; then\n"
                               f"  echo $$ >> '{self.pids}'\n"
                               f"  while [ -e '{self.hang_flag}' ]; do sleep 0.1; done\n"
                               "fi\n"
                               f"exec cat '{self.credential}'\n")
        self.script.chmod(self.script.stat().st_mode | stat.S_IXUSR)

    def hand_out(self, token: str, expires_in: float) -> None:
        """From now on the plugin prints `token`, expiring `expires_in` seconds from now."""
        expires = datetime.now(timezone.utc) + timedelta(seconds=expires_in)
        document = {"apiVersion": API_VERSION, "kind": "ExecCredential",
                    "status": {"token": token,
                               "expirationTimestamp": expires.strftime("%Y-%m-%dT%H:%M:%SZ")}}
        tmp = self.credential.with_suffix(".tmp")
        tmp.write_text(json.dumps(document))
        os.replace(tmp, self.credential)  # the plugin never reads half a file

    def hang(self, on: bool) -> None:
        """From now on every run hangs (`on`), or hanging runs go on and finish."""
        if on:
            self.hang_flag.touch()
        else:
            self.hang_flag.unlink(missing_ok=True)

    @property
    def hanging_pids(self) -> list[int]:
        """The process ids of the runs that hung."""
        try:
            return [int(line) for line in self.pids.read_text().split()]
        except FileNotFoundError:
            return []

    @property
    def runs(self) -> int:
        """How often the plugin has run so far."""
        try:
            return len(self.log.read_text().splitlines())
        except FileNotFoundError:
            return 0

    def user(self) -> dict[str, Any]:
        """The kubeconfig user entry that runs this plugin."""
        return {"exec": {"apiVersion": API_VERSION, "command": str(self.script),
                         "interactiveMode": "Never"}}

    def write_kubeconfig(self, sim: Simulator, path: Path, context: str = "sim") -> str:
        return sim.write_kubeconfig(path, context=context, user=self.user())
