"""`python -m cluster.onprem`: the on-prem template filled for given machines, checked before it is written."""
from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from cluster import ClusterError, check, onprem

TEMPLATE = onprem.TEMPLATE.read_text(encoding="utf-8")


@pytest.fixture
def home(tmp_path, monkeypatch):
    """A HOME with a private Ray token file (the check reads the mode of the one the YAML mounts)."""
    home = tmp_path / "home"
    (home / ".ray").mkdir(parents=True)
    (home / ".ray" / "auth_token").write_text("0" * 64)
    (home / ".ray" / "auth_token").chmod(0o600)
    monkeypatch.setenv("HOME", str(home))
    return home


def test_one_machine_the_head_alone_a_plain_shared_directory_and_every_placeholder_filled(home, tmp_path):
    text = onprem.fill(TEMPLATE, "127.0.0.1", "alice", shared=str(tmp_path / "shared"))
    assert check.placeholders(text) == []
    config = check.validate(yaml.safe_load(text))
    assert config["provider"]["head_ip"] == "127.0.0.1" and config["provider"]["worker_ips"] == []
    assert config["auth"] == {"ssh_user": "alice", "ssh_private_key": str(home / ".ssh" / "id_ed25519")}
    assert config["initialization_commands"] == [f"mkdir -p {tmp_path / 'shared'}"]  # no sudo, no mount
    head = " ".join(config["head_start_ray_commands"])
    assert f"--shared {tmp_path / 'shared'}/duplex" in head and "/mnt/shared" not in text.split("\n\n", 1)[1]
    assert "--node-ip-address=127.0.0.1" in head and "--advertise 127.0.0.1" in head
    assert check.security_findings(config, text) == []


def test_machines_with_nfs_get_the_mount_and_their_worker_list(home):
    text = onprem.fill(TEMPLATE, "10.0.0.10", "bob", ["10.0.0.11", "10.0.0.12"], ssh_key="/keys/id",
                       nfs="nfs.example.org:/export/duplex")
    config = check.validate(yaml.safe_load(text))
    assert config["provider"]["worker_ips"] == ["10.0.0.11", "10.0.0.12"]
    assert config["auth"]["ssh_private_key"] == "/keys/id"
    assert "sudo mount -t nfs4 nfs.example.org:/export/duplex /mnt/shared" in config["initialization_commands"][0]
    assert "# every machine is started" in text  # the template's comments stay


@pytest.mark.parametrize("kwargs, message", [
    ({}, "say where the shared storage is"),
    ({"nfs": "nfs.example.org"}, "expected SERVER:EXPORT"),
    ({"shared": "/tmp/a b"}, "no spaces, quotes or shell characters"),
    ({"shared": "/tmp/x", "workers": ["10.0.0.2;rm -rf"]}, "--worker"),
])
def test_bad_values_are_refused_naming_the_option(kwargs, message):
    with pytest.raises(ClusterError, match=message):
        onprem.fill(TEMPLATE, "10.0.0.10", "bob", **kwargs)


def test_the_cli_writes_only_a_yaml_that_passes_the_check(home, tmp_path, capsys):
    out = tmp_path / "my-onprem.yaml"
    argv = ["--head-ip", "127.0.0.1", "--ssh-user", "alice", "--shared", str(tmp_path / "s"), "--output", str(out)]
    assert onprem.main(argv) == 0 and check.check(out) == 0
    assert capsys.readouterr().out.startswith(f"{out}: valid")
    out.unlink()
    (home / ".ray" / "auth_token").chmod(0o644)  # the YAML would copy a token other users can read
    assert onprem.main(argv) == 1
    assert "readable by other users" in capsys.readouterr().out
    assert not out.exists() and list(tmp_path.glob(".*.tmp")) == []
    with pytest.raises(SystemExit):
        onprem.main(["--head-ip", "x", "--ssh-user", "y", "--shared", "/s", "--output", str(onprem.TEMPLATE)])
    assert Path(onprem.TEMPLATE).read_text(encoding="utf-8") == TEMPLATE
