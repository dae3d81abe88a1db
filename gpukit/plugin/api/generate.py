"""Generate the gRPC/protobuf Python stubs for the kubelet APIs from the .proto files here.

Run as `python -m gpukit.plugin.api.generate` (the Makefile and image build do); building the
wheel runs it too (setup.py), so an installed gpukit carries its stubs and needs no grpcio-tools;
in a checkout `gpukit.plugin.api` calls it on first import when the stubs are missing, so a
fresh clone works without a build step. The stubs are build outputs (gitignored) because they
must match the installed protobuf runtime, which a committed copy would not track.
"""

from __future__ import annotations

import argparse
import re
import shutil
import sys
import tempfile
from pathlib import Path

API_DIR = Path(__file__).resolve().parent
PROTOS = ("deviceplugin_v1beta1.proto", "podresources_v1.proto", "pluginregistration_v1.proto",
          "dra_v1.proto", "dra_health_v1.proto")


def stub_names(proto: str) -> tuple[str, str]:
    stem = proto.removesuffix(".proto")
    return f"{stem}_pb2.py", f"{stem}_pb2_grpc.py"


def stubs_present(directory: Path = API_DIR) -> bool:
    return all((directory / name).is_file() for p in PROTOS for name in stub_names(p))


def _make_imports_relative(text: str) -> str:
    # protoc writes `import foo_pb2 as foo__pb2`, which only works with the output dir on
    # sys.path; inside a package the import must be relative.
    stems = "|".join(re.escape(p.removesuffix(".proto")) for p in PROTOS)
    return re.sub(rf"^import ({stems})_pb2 as ", r"from . import \1_pb2 as ", text, flags=re.M)


def generate(out_dir: Path = API_DIR) -> list[Path]:
    """Write the stubs into out_dir atomically (temp dir, then rename) and return their paths."""
    try:
        from grpc_tools import protoc
    except ImportError as exc:  # pragma: no cover - depends on the environment
        raise RuntimeError(
            "grpcio-tools is needed to generate the kubelet API stubs: pip install grpcio-tools"
        ) from exc
    import grpc_tools

    include = Path(grpc_tools.__file__).resolve().parent / "_proto"
    written: list[Path] = []
    out_dir.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=out_dir, prefix=".gen-") as tmp:
        args = [
            "grpc_tools.protoc",
            f"-I{API_DIR}",
            f"-I{include}",
            f"--python_out={tmp}",
            f"--grpc_python_out={tmp}",
            *(str(API_DIR / p) for p in PROTOS),
        ]
        rc = protoc.main(args)
        if rc != 0:
            raise RuntimeError(f"protoc failed (exit {rc}) for {', '.join(PROTOS)}")
        for proto in PROTOS:
            for name in stub_names(proto):
                src = Path(tmp) / name
                src.write_text(_make_imports_relative(src.read_text()))
                dst = out_dir / name
                shutil.move(str(src), str(dst))
                written.append(dst)
    return written


_PROTOBUF_GENCODE = re.compile(r"^# Protobuf Python Version: (\d+)\.(\d+)\.(\d+)", re.M)
_GRPC_GENCODE = re.compile(r"^GRPC_GENERATED_VERSION = '(\d+)\.(\d+)\.(\d+)'", re.M)


def runtime_requirements(directory: Path = API_DIR) -> dict[str, tuple[int, ...]]:
    """The oldest grpcio and protobuf the stubs in directory run with (their generated code
    refuses older ones at import): {"protobuf": (7, 35, 1), "grpcio": (1, 85, 1)}; a
    generator too old to record its version adds nothing."""
    needs: dict[str, tuple[int, ...]] = {}
    for proto in PROTOS:
        for name, pattern, dist in zip(stub_names(proto), (_PROTOBUF_GENCODE, _GRPC_GENCODE),
                                       ("protobuf", "grpcio"), strict=True):
            m = pattern.search((directory / name).read_text())
            if m:
                version = tuple(int(x) for x in m.groups())
                needs[dist] = max(needs.get(dist, version), version)
    return needs


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=API_DIR, help="output directory")
    args = parser.parse_args(argv)
    for path in generate(args.out):
        print(path)
    return 0


if __name__ == "__main__":
    sys.exit(main())
