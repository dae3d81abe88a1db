"""nvidia-cuda-mps-control and nvidia-cuda-mps-server of the gpukit lab (stdlib only).

The stand-in driver package runs this file as both tools (`control ARGS` / `server`), as
NVIDIA's ships two binaries. What it keeps of NVIDIA's interfaces:

- `nvidia-cuda-mps-control -d`: the control daemon, in the background; returns 0 once it
  accepts commands. Pipe directory CUDA_MPS_PIPE_DIRECTORY (default /tmp/nvidia-mps), log
  directory CUDA_MPS_LOG_DIRECTORY (default /var/log/nvidia-mps, control.log and server.log
  there). The pipe directory also gets nvidia-cuda-mps-control.pid (the daemon's pid, as NVIDIA
  documents). A second `-d` on the same pipe directory prints "An instance of this daemon is
  already running" and exits 1. CUDA_VISIBLE_DEVICES (GPU UUIDs or NVML indices) is what it
  serves: resolved to device minors through libnvidia-ml.so.1 (ctypes) when the daemon starts;
  the server holds a context on each, and a client with none of them is refused (no device).
  Unset, or without NVML, it serves whatever GPUs its first client uses.
- `nvidia-cuda-mps-control` (no args): commands on stdin, one a line, each sent to the daemon
  of the pipe directory, its reply printed; exit 1 with "Cannot find MPS control daemon process"
  when none is there.
- Commands: get_server_list, start_server -uid U, get_client_list PID,
  get_default_active_thread_percentage, set_default_active_thread_percentage P,
  get_default_device_pinned_mem_limit DEV, set_default_device_pinned_mem_limit DEV V(M|G), quit.
- The control endpoint: the real daemon talks over named pipes in the pipe directory (`control`
  among them); the stand-in uses one Unix socket named `control` there.
- The server (`nvidia-cuda-mps-server`) is started by the daemon for the first client (or by
  start_server) and is what NVML lists as the process on the GPU: it registers itself in the
  mock NVML's clients directory as the lab workload does (gpukit/lab/nvml/workload/gpu_work.c),
  holding a POSIX lock on its file while it lives.

Lab-only request (the workload, gpu-work, as an MPS client), one line:
  `gpukit-client PID CLIENTS_DIR MINOR...`  ->  `ok SERVER_PID PCT LIMIT_BYTES...` with one
  limit per device of the client, by its ordinal (0: none set), or `err no-device`.
PID is the client's own view; the daemon takes the peer's pid from the socket (SO_PEERCRED: in
its own pid namespace, as the real daemon sees a pod's process). The server registers in
$GPUKIT_NVML_STATE_DIR/clients (default /var/lib/gpukit-lab/nvml/clients, the mock's state
directory on a node) where that exists, else in the first client's CLIENTS_DIR (its view).
"""

from __future__ import annotations

import ctypes
import fcntl
import os
import signal
import socket
import struct
import subprocess
import sys
import time
from pathlib import Path

DEFAULT_PIPE_DIR = "/tmp/nvidia-mps"
DEFAULT_LOG_DIR = "/var/log/nvidia-mps"
ENDPOINT = "control"
SERVER_MEM_BYTES = 32 << 20  # what an MPS server's own context holds, roughly
NO_DAEMON = "Cannot find MPS control daemon process"
ALREADY = "An instance of this daemon is already running"
PID_FILE = "nvidia-cuda-mps-control.pid"
DEFAULT_STATE_DIR = "/var/lib/gpukit-lab/nvml"


def served_minors(visible: str) -> list[str] | None:
    """The device minors CUDA_VISIBLE_DEVICES names (GPU UUIDs or indices), from NVML; None:
    all (unset, or no NVML to ask)."""
    wanted = [v.strip() for v in visible.split(",") if v.strip()]
    if not wanted:
        return None
    try:
        nvml = ctypes.CDLL("libnvidia-ml.so.1")
    except OSError:
        return None
    if nvml.nvmlInit_v2() != 0:
        return None
    try:
        count = ctypes.c_uint()
        if nvml.nvmlDeviceGetCount_v2(ctypes.byref(count)) != 0:
            return None
        by_key: dict[str, str] = {}
        for i in range(count.value):
            h, minor = ctypes.c_void_p(), ctypes.c_uint()
            uuid = ctypes.create_string_buffer(96)
            if (nvml.nvmlDeviceGetHandleByIndex_v2(i, ctypes.byref(h)) == 0
                    and nvml.nvmlDeviceGetUUID(h, uuid, 96) == 0
                    and nvml.nvmlDeviceGetMinorNumber(h, ctypes.byref(minor)) == 0):
                by_key[str(i)] = by_key[uuid.value.decode()] = str(minor.value)
        return [by_key[w] for w in wanted if w in by_key]
    finally:
        nvml.nvmlShutdown()


def pipe_dir() -> Path:
    return Path(os.environ.get("CUDA_MPS_PIPE_DIRECTORY") or DEFAULT_PIPE_DIR)


def log_dir() -> Path:
    return Path(os.environ.get("CUDA_MPS_LOG_DIRECTORY") or DEFAULT_LOG_DIR)


def stamp(role: str) -> str:
    now = time.time()
    ms = int(now * 1000) % 1000
    when = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(now))
    return f"[{when}.{ms:03d} {role} {os.getpid()}]"


def parse_limit(text: str) -> int | None:
    """`V` with M or G (as NVIDIA's plugin writes `<n>M`), in bytes."""
    units = {"M": 1 << 20, "G": 1 << 30}
    if len(text) < 2 or text[-1].upper() not in units or not text[:-1].isdigit():
        return None
    return int(text[:-1]) * units[text[-1].upper()]


def fmt_limit(value: int) -> str:
    # The real tool's exact spelling of a read-back limit is not in NVIDIA's documentation;
    # the stand-in answers in MiB as NVIDIA's plugin sets it ("1024M").
    return f"{value >> 20}M"


class Daemon:
    def __init__(self, pipe: Path, logs: Path) -> None:
        self.pipe, self.logs = pipe, logs
        self.served = os.environ.get("CUDA_VISIBLE_DEVICES", "")
        self.minors = served_minors(self.served)
        state = os.environ.get("GPUKIT_NVML_STATE_DIR") or DEFAULT_STATE_DIR
        self.clients_dir = str(Path(state) / "clients")
        self.pct = 100.0
        self.limits: dict[int, int] = {}
        self.server: subprocess.Popen[bytes] | None = None
        self.server_minors: list[str] = []
        self.clients: dict[int, list[int]] = {}  # server pid -> client pids

    def ordinal(self, device: str) -> int | None:
        """A device as the commands name it, its index as CUDA numbers the clients' devices,
        or its UUID (as NVIDIA's DRA driver sends it): the position among the served ones."""
        if device.isdigit():
            return int(device)
        served = [v.strip() for v in self.served.split(",") if v.strip()]
        return served.index(device) if device in served else None

    def log(self, line: str) -> None:
        with open(self.logs / "control.log", "a", encoding="utf-8") as f:
            f.write(f"{stamp('Control')} {line}\n")

    def start_server(self, uid: int, clients_dir: str = "", minors: list[str] | None = None) -> int:
        if self.server is not None and self.server.poll() is None:
            return self.server.pid
        if self.minors is not None:
            minors = self.minors  # its contexts: the GPUs it serves
        if Path(self.clients_dir).is_dir() or not clients_dir:
            clients_dir = self.clients_dir  # the daemon's view of the node's directory
        env = dict(os.environ, GPUKIT_LAB_MPS_CLIENTS=clients_dir,
                   GPUKIT_LAB_MPS_MINORS=" ".join(minors or []))
        self.server = subprocess.Popen([sys.executable, "-I", __file__, "server"], env=env,
                                       stdin=subprocess.DEVNULL)
        self.server_minors = list(minors or [])
        self.clients[self.server.pid] = []
        self.log(f"Starting new server {self.server.pid} for user {uid}")
        return self.server.pid

    def stop_server(self) -> None:
        if self.server is not None and self.server.poll() is None:
            self.server.terminate()
            code = self.server.wait()
            self.log(f"Server {self.server.pid} exited with status {code}")
        self.server = None

    def command(self, line: str) -> tuple[str, bool]:
        """The reply to one command, and whether the daemon is to exit."""
        self.log(f"Cmd:{line}")
        words = line.split()
        if not words:
            return "", False
        cmd, args = words[0], words[1:]
        alive = self.server is not None and self.server.poll() is None
        if cmd == "get_server_list":
            return (f"{self.server.pid}" if alive and self.server else ""), False
        if cmd == "start_server" and len(args) == 2 and args[0] == "-uid" and args[1].isdigit():
            self.start_server(int(args[1]))
            return "", False
        if cmd == "get_client_list" and len(args) == 1 and args[0].isdigit():
            pids = [p for p in self.clients.get(int(args[0]), []) if pid_alive(p)]
            return "\n".join(map(str, pids)), False
        if cmd == "get_default_active_thread_percentage" and not args:
            return f"{self.pct:.1f}", False
        if cmd == "set_default_active_thread_percentage" and len(args) == 1:
            try:
                pct = float(args[0])
            except ValueError:
                pct = -1.0
            if not 0 < pct <= 100:
                return "Invalid percentage", False  # wording of the real error unknown
            self.pct = pct
            return f"{pct:.1f}", False  # the real one echoes the value it set
        if cmd == "get_default_device_pinned_mem_limit" and len(args) == 1:
            ordinal = self.ordinal(args[0])
            if ordinal is None:
                return "Invalid device", False  # wording of the real error unknown
            value = self.limits.get(ordinal)
            return (fmt_limit(value) if value else "No limit"), False  # unset: wording unknown
        if cmd == "set_default_device_pinned_mem_limit" and len(args) == 2:
            ordinal, value = self.ordinal(args[0]), parse_limit(args[1])
            if ordinal is None:
                return "Invalid device", False  # wording of the real error unknown
            if value is None:
                return "Invalid memory limit", False  # wording of the real error unknown
            self.limits[ordinal] = value
            return "", False
        if cmd == "quit":
            return "", True
        return f"Unrecognized command {cmd}", False  # wording of the real reply unknown

    def client(self, words: list[str], peer: int) -> str:
        """gpu-work connecting: start the server if needed, answer its share and limits."""
        pid, clients_dir, minors = peer or int(words[1]), words[2], words[3:]
        self.log("Accepting connection...")
        if self.minors is not None and not set(minors) & set(self.minors):
            self.log(f"NEW CLIENT {pid} from user {os.getuid()}: none of its devices is served")
            return "err no-device"
        running = self.server is not None and self.server.poll() is None
        self.log(f"NEW CLIENT {pid} from user {os.getuid()}: "
                 + ("Server already exists" if running else "Server is not ready, starting one"))
        server = self.start_server(os.getuid(), clients_dir, minors)
        self.clients.setdefault(server, []).append(pid)
        limits = [str(self.limits.get(i, 0)) for i in range(len(minors))]
        return " ".join(["ok", str(server), f"{self.pct:.1f}", *limits])

    def serve(self, sock: socket.socket) -> None:
        while True:
            conn, _ = sock.accept()
            with conn:
                data = b""
                while not data.endswith(b"\n"):
                    chunk = conn.recv(4096)
                    if not chunk:
                        break
                    data += chunk
                line = data.decode(errors="replace").strip()
                words = line.split()
                done = False
                if len(words) >= 3 and words[0] == "gpukit-client" and words[1].isdigit():
                    reply = self.client(words, peer_pid(conn))
                else:
                    reply, done = self.command(line)
                try:
                    conn.sendall((reply + "\n" if reply else "").encode())
                except OSError:
                    pass  # the asker went away: the daemon stays
            if done:
                return


def peer_pid(conn: socket.socket) -> int:
    """The connected process's pid in this pid namespace (0: unknown)."""
    try:
        creds = conn.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
    except OSError:
        return 0
    pid: int = struct.unpack("3i", creds)[0]
    return pid


def pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def daemon_main() -> int:
    pipe, logs = pipe_dir(), log_dir()
    pipe.mkdir(parents=True, exist_ok=True)
    logs.mkdir(parents=True, exist_ok=True)
    endpoint = pipe / ENDPOINT
    lock = open(pipe / "control.lock", "w")  # noqa: SIM115 - held for the daemon's life
    try:
        fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        print(ALREADY, file=sys.stderr)
        return 1
    ready_r, ready_w = os.pipe()
    if os.fork():  # the caller returns once the daemon listens
        os.close(ready_w)
        ok = os.read(ready_r, 1) == b"1"
        return 0 if ok else 1
    os.close(ready_r)
    os.setsid()
    devnull = os.open(os.devnull, os.O_RDWR)
    for fd in (0, 1, 2):
        os.dup2(devnull, fd)
    d = Daemon(pipe, logs)
    endpoint.unlink(missing_ok=True)
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.bind(str(endpoint))
    sock.listen(16)
    (pipe / PID_FILE).write_text(f"{os.getpid()}\n")
    d.log(f"Starting control daemon using socket {endpoint}")
    d.log(f"To connect CUDA applications to this daemon, set env CUDA_MPS_PIPE_DIRECTORY={pipe}")
    d.log(f"Serving CUDA_VISIBLE_DEVICES={d.served or '(all)'}: device minors "
          + (" ".join(d.minors) if d.minors is not None else "of its clients"))

    def on_term(_sig: int, _frame: object) -> None:
        raise SystemExit(0)

    signal.signal(signal.SIGTERM, on_term)
    os.write(ready_w, b"1")
    os.close(ready_w)
    try:
        d.serve(sock)
    finally:
        d.stop_server()
        endpoint.unlink(missing_ok=True)
        (pipe / PID_FILE).unlink(missing_ok=True)
        d.log("Exit")
    os._exit(0)


def send(line: str) -> str | None:
    """One request to the daemon of the pipe directory; None: no daemon there."""
    try:
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
            s.connect(str(pipe_dir() / ENDPOINT))
            s.sendall(line.encode() + b"\n")
            out = b""
            while chunk := s.recv(4096):
                out += chunk
            return out.decode(errors="replace")
    except OSError:
        return None


def client_main() -> int:
    for line in sys.stdin:
        if not line.strip():
            continue
        reply = send(line.strip())
        if reply is None:
            print(NO_DAEMON, file=sys.stderr)
            return 1
        sys.stdout.write(reply)
        sys.stdout.flush()
    return 0


def server_main() -> int:
    """The MPS server: a context on each GPU its first client uses, registered with the mock
    NVML as the lab workload registers (a locked client file, touched every second)."""
    clients = os.environ.get("GPUKIT_LAB_MPS_CLIENTS", "")
    minors = os.environ.get("GPUKIT_LAB_MPS_MINORS", "").split()
    stop = False

    def on_term(_sig: int, _frame: object) -> None:
        nonlocal stop
        stop = True

    signal.signal(signal.SIGTERM, on_term)
    files = []
    for minor in minors if clients else []:
        path = Path(clients) / f"mps-server-{os.getpid()}-{minor}"
        f = open(path, "w")  # noqa: SIM115 - held (and locked) while the server lives
        fcntl.lockf(f, fcntl.LOCK_EX | fcntl.LOCK_NB)  # locked before it says anything
        f.write(f"gpukit-nvml-client 1 minor {minor} gi - ci - bytes {SERVER_MEM_BYTES} util 0 "
                f"pid {os.getpid()} start {time.time_ns()} name nvidia-cuda-mps-server\n")
        f.flush()
        os.chmod(path, 0o644)
        files.append(f)
    with open(log_dir() / "server.log", "a", encoding="utf-8") as log:
        log.write(f"{stamp('Server')} Server starting. Devices: {' '.join(minors) or '-'}\n")
    while not stop:
        for f in files:
            os.utime(f.fileno())
        time.sleep(0.2)
    for f in files:
        os.unlink(f.name)  # a clean exit: gone from NVML at once
    return 0


def main(argv: list[str]) -> int:
    role, args = (argv[0], argv[1:]) if argv else ("control", [])
    if role == "server":
        return server_main()
    if args == ["-d"]:
        return daemon_main()
    if not args:
        return client_main()
    print(f"nvidia-cuda-mps-control (gpukit lab stand-in): unsupported arguments {args}",
          file=sys.stderr)
    return 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
