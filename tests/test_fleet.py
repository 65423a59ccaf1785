"""Fleet capture with Ansible (runners/ansible/capture.yml) against real hosts: network namespaces on
this machine, each with its own sshd on a veth address, plus one unreachable host. The namespace hosts
share this machine's kernel and filesystem, so captures are throttled to one at a time and the
checkout is not redeployed (ticklab_deploy=false); the transport (ssh, fetch) is real."""

import json
import os
import shutil
import subprocess
from pathlib import Path

import pytest

from conftest import REPO, shortened_nohz_experiment
from ticklab.bundle import load_bundle

NEEDED = ("ansible-playbook", "sshd", "ssh-keygen", "ip")
missing = [tool for tool in NEEDED if shutil.which(tool) is None and not Path(f"/usr/sbin/{tool}").exists()]
pytestmark = [
    pytest.mark.skipif(
        bool(missing) or os.geteuid() != 0,
        reason=f"needs root and {', '.join(NEEDED)} (missing: {', '.join(missing) or 'none'})",
    ),
    pytest.mark.slow,
    pytest.mark.xdist_group("machine"),
]


def _run(*argv, check=True):
    return subprocess.run([str(a) for a in argv], capture_output=True, text=True, check=check)


@pytest.fixture
def namespace_hosts(tmp_path):
    key, hostkey = tmp_path / "id", tmp_path / "hostkey"
    _run("ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", key)
    _run("ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", hostkey)
    shutil.copy(f"{key}.pub", tmp_path / "authorized_keys")
    Path("/run/sshd").mkdir(exist_ok=True)
    hosts, made = {}, []
    try:
        for index in (1, 2):
            ns, outside, inside = f"tlfleet{index}", f"tlfv{index}", f"tlfp{index}"
            _run("ip", "netns", "add", ns)
            made.append(ns)
            _run("ip", "link", "add", outside, "type", "veth", "peer", "name", inside)
            _run("ip", "link", "set", inside, "netns", ns)
            _run("ip", "addr", "add", f"10.231.{index}.1/24", "dev", outside)
            _run("ip", "link", "set", outside, "up")
            for command in (
                ["ip", "addr", "add", f"10.231.{index}.2/24", "dev", inside],
                ["ip", "link", "set", inside, "up"],
                ["ip", "link", "set", "lo", "up"],
            ):
                _run("ip", "netns", "exec", ns, *command)
            _run(
                "ip",
                "netns",
                "exec",
                ns,
                shutil.which("sshd") or "/usr/sbin/sshd",
                "-f",
                "/dev/null",
                "-o",
                f"ListenAddress=10.231.{index}.2",
                "-o",
                f"HostKey={hostkey}",
                "-o",
                f"PidFile={tmp_path}/sshd{index}.pid",
                "-o",
                f"AuthorizedKeysFile={tmp_path}/authorized_keys",
                "-o",
                "PermitRootLogin=prohibit-password",
                "-o",
                "StrictModes=no",
                "-o",
                "UsePAM=no",
            )
            hosts[f"ns{index}"] = f"10.231.{index}.2"
        yield hosts, key
    finally:
        for ns in made:  # the listening sshd and any session it forked: nothing may outlive the test
            pids = _run("ip", "netns", "pids", ns, check=False).stdout.split()
            if pids:
                _run("kill", *pids, check=False)
        for index in (1, 2):
            _run("ip", "link", "del", f"tlfv{index}", check=False)
        for ns in made:
            _run("ip", "netns", "del", ns, check=False)


def test_the_playbook_brings_back_verified_bundles_and_survives_a_dead_host(namespace_hosts, tmp_path):
    hosts, key = namespace_hosts
    inventory = tmp_path / "inventory.ini"
    common = (
        f"ansible_user=root ansible_ssh_private_key_file={key} ansible_python_interpreter=/usr/bin/python3 "
        "ansible_ssh_common_args='-o StrictHostKeyChecking=no -o UserKnownHostsFile=/dev/null -o ConnectTimeout=5'"
    )
    lines = [f"{name} ansible_host={address} ticklab_host_id=netns-{name} {common}" for name, address in hosts.items()]
    lines.append(f"dead ansible_host=10.231.9.2 ticklab_host_id=netns-dead {common}")  # no such host
    inventory.write_text("[fleet]\n" + "\n".join(lines) + "\n")
    fetch_to = tmp_path / "fleet"
    # the transport is what is tested here (the capture has its own tests): nohz's host experiment, shortened
    experiment = shortened_nohz_experiment(REPO / "runners/nohz/ftq.yaml", tmp_path)
    extra = {
        "ticklab_claims": ["nohz"],
        "ticklab_dir": str(REPO),
        "ticklab_deploy": False,
        "ticklab_throttle": 1,
        "ticklab_capture_args": f"--runs 1 --warmup 0 --experiment {experiment}",
        "ticklab_fetch_to": str(fetch_to),
        "ticklab_remote_out": str(tmp_path / "remote" / "{{ inventory_hostname }}"),
        "ticklab_packages": ["make"],
    }
    result = subprocess.run(
        ["ansible-playbook", "-i", str(inventory), str(REPO / "runners/ansible/capture.yml"), "-e", json.dumps(extra)],
        capture_output=True,
        text=True,
        timeout=900,
        env={**os.environ, "ANSIBLE_HOST_KEY_CHECKING": "False", "ANSIBLE_NOCOLOR": "1"},
    )
    recap = result.stdout[result.stdout.rfind("PLAY RECAP") :]
    assert result.returncode != 0 and "dead" in recap and "unreachable=1" in recap, result.stdout[-3000:]
    for name in hosts:
        assert f"{name}" in recap and "failed=0" in recap.split(name, 1)[1].splitlines()[0], recap
        [bundle] = list((fetch_to / f"netns-{name}" / "nohz").iterdir())
        loaded = load_bundle(bundle)  # every file's sha256 against the manifest
        assert loaded.manifest.status == "sealed" and len(loaded.manifest.runs) == 1
        assert json.loads((fetch_to / "doctor" / f"{name}.json").read_text())["checks"]["root"]["ok"]
    verify = result.stdout.split("TASK [Every fetched bundle verifies against its manifest]", 1)[1].split("TASK [", 1)[
        0
    ]
    assert "ok: [" in verify and "-> localhost" in verify and "fatal" not in verify, verify  # `ticklab verify` passed
    assert not (fetch_to / "netns-dead").exists()
    # the fetched directory is a data dir like traces/ (issue 29): nohz's verdicts over it and their forest plot list
    # every host that ran, each with why it has no line (a host experiment measures the tick on only)
    import pandas as pd

    from ticklab.analysis.captured import find_bundles
    from ticklab.analysis.forest import save_forest
    from ticklab.analysis.verdicts import VERDICT_COLUMNS
    from ticklab.claims import get_claim
    from ticklab.report.notebook import open_claim

    ctx = open_claim("nohz", fetch_to, REPO / "traces" / "published", tmp_path / "out")
    rows = pd.DataFrame([v.as_row() for v in get_claim("nohz").verdicts(ctx, n_boot=200)], columns=VERDICT_COLUMNS)
    (tmp_path / "out" / "verdicts").mkdir(parents=True, exist_ok=True)
    rows.to_csv(tmp_path / "out" / "verdicts" / "nohz.csv", index=False)
    fig = save_forest(rows, tmp_path / "out", fetch_to)
    under = "\n".join(t.get_text() for t in fig.texts)
    assert all(f"netns-{name}" in under for name in hosts) and "netns-dead" not in under, under
    assert {ref.host_id for ref in find_bundles(fetch_to, "nohz")} == {f"netns-{name}" for name in hosts}
    assert (tmp_path / "out" / "figures" / "nohz" / "forest.png").is_file()
