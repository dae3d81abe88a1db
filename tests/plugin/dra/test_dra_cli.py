"""The DRA plugin's command line refuses what it cannot run with, naming it, before starting."""

from __future__ import annotations

import pytest

from gpukit.plugin.dra import cli


@pytest.mark.parametrize(("argv", "message"), [
    ([], "the node's name is needed (--node-name or NODE_NAME)"),
    (["--node-name", "n", "--rescan-interval", "0"],
     "--rescan-interval: 0.0 is not a positive number of seconds"),
    (["--node-name", "n", "--health-recovery-seconds", "-1"],
     "--health-recovery-seconds: -1.0 is not a positive number of seconds"),
    (["--node-name", "n", "--metrics-address", "9402"],
     "--metrics-address: '9402' is not host:port (use host:port, or '' to disable)"),
    (["--node-name", "n", "--shares", "1"], "--shares: 1 is not 0 or an integer from 2 to 64"),
    (["--node-name", "n", "--metrics-auth", "tls"],
     "--metrics-auth (GPUKIT_METRICS_AUTH): 'tls' is not one of kubernetes, none"),
])
def test_bad_arguments_are_refused_by_name(argv: list[str], message: str,
                                           monkeypatch: pytest.MonkeyPatch,
                                           capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.delenv("NODE_NAME", raising=False)
    assert cli.main(argv) == 1
    assert message in capsys.readouterr().err


def test_metrics_auth_defaults_to_kubernetes_and_reads_the_environment(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("GPUKIT_METRICS_AUTH", raising=False)
    assert cli.build_parser().parse_args([]).metrics_auth == "kubernetes"
    monkeypatch.setenv("GPUKIT_METRICS_AUTH", "none")
    assert cli.build_parser().parse_args([]).metrics_auth == "none"
