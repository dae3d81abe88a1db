"""The metrics area's scraper: busybox wget's status read right, the token read inside the pod
(never in the suite's command line), the pod running as the scraper account."""

from __future__ import annotations

import subprocess
import threading
from http.server import BaseHTTPRequestHandler, HTTPServer
from pathlib import Path

import pytest

from gpukit.conformance import scraper


class _Agent(BaseHTTPRequestHandler):
    def do_GET(self) -> None:
        if self.path != "/metrics":
            self.send_response(404)
        elif self.headers.get("Authorization") == "Bearer s3cret":
            self.send_response(200)
            self.end_headers()
            self.wfile.write(b"DCGM_FI_DEV_FB_USED 1\n")
            return
        else:
            self.send_response(401)
        self.end_headers()

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture()
def agent() -> object:
    server = HTTPServer(("127.0.0.1", 0), _Agent)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_port}"
    server.shutdown()


def _run(argv: list[str], token_file: Path) -> tuple[int, str]:
    """The scraper's command as the pod's shell runs it, the token file moved to tmp."""
    script = argv[2].replace(scraper.TOKEN_FILE, str(token_file))
    r = subprocess.run(["sh", "-c", script], capture_output=True, text=True, timeout=10)
    return scraper.status_of(r.stderr), r.stdout


def test_busybox_wget_reports_each_status_and_the_body(agent: str, tmp_path: Path) -> None:
    token = tmp_path / "token"
    token.write_text("s3cret")
    assert _run(scraper.command(f"{agent}/metrics", True), token) == (
        200, "DCGM_FI_DEV_FB_USED 1\n")
    assert _run(scraper.command(f"{agent}/metrics", False), token)[0] == 401
    assert _run(scraper.command(f"{agent}/debug", True), token)[0] == 404
    token.write_text("wrong")
    assert _run(scraper.command(f"{agent}/metrics", True), token)[0] == 401


def test_the_token_is_read_in_the_pod_and_nothing_answering_is_status_0() -> None:
    argv = scraper.command("http://10.0.0.1:9402/metrics", True)
    assert f"$(cat {scraper.TOKEN_FILE})" in argv[2]
    assert "Bearer" not in scraper.command("http://10.0.0.1:9402/metrics", False)[2]
    assert scraper.status_of("wget: can't connect to remote host: Connection refused") == 0
    assert scraper.status_of("wget: server returned error: HTTP/1.1 403 Forbidden") == 403


def test_the_scraper_pod_runs_as_the_scraper_account_with_its_token() -> None:
    pod = scraper.pod("s", run_id="r", node="n1", image="busybox:1.36", host_network=True)
    spec = pod["spec"]
    assert spec["serviceAccountName"] == scraper.SCRAPER_SA
    assert spec["automountServiceAccountToken"] is True
    assert spec["hostNetwork"] is True
    assert "resources" not in spec["containers"][0]  # no device of the node
