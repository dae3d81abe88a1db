"""The `gpukit` command line: one command over gpukit's library.

    gpukit plugin ...            the device plugin (gpukit-device-plugin's flags)
    gpukit dra ...               the DRA kubelet plugin (python -m gpukit.plugin.dra)
    gpukit mig plan|apply|...    the MIG manager (python -m gpukit.plugin.mig)
    gpukit inventory check INV   every GPU node's declaration, checked on the controller
    gpukit manifests -i INV      the node agent's objects (device plugin, DRA), as site.yml applies
    gpukit report JUNIT -o HTML  the conformance suite's per-node report from its JUnit XML
    gpukit evidence JUNIT -o DIR CNCF AI Conformance evidence: junit.xml, e2e.log, PRODUCT.yaml
    gpukit summary ...           per node: what site.yml changed, what the suite found
    gpukit lab ...               the hardware-free lab
"""

from __future__ import annotations

import importlib.util
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, NoReturn

import typer

from gpukit import __version__

if TYPE_CHECKING:
    from gpukit.conformance.report import Result
    from gpukit.inventory.model import NodeDecl

app = typer.Typer(help="gpukit: GPU nodes for Kubernetes, declared once, proven live.")
lab_app = typer.Typer(help="The hardware-free lab: a real cluster with simulated GPU nodes.")
inventory_app = typer.Typer(help="Inventories: check declarations before any host is touched.")
app.add_typer(lab_app, name="lab")
app.add_typer(inventory_app, name="inventory")


def _print_version(value: bool) -> None:
    if value:
        print(f"gpukit {__version__}")
        raise typer.Exit()


@app.callback()
def _main(version: bool = typer.Option(False, "--version", callback=_print_version,
                                       is_eager=True, help="print gpukit's version and exit")
          ) -> None:
    """gpukit: GPU nodes for Kubernetes, declared once, proven live."""


def _fail(err: Exception | str) -> NoReturn:
    typer.secho(f"error: {err}", fg=typer.colors.RED, err=True)
    raise typer.Exit(2)


# gpukit's wheel leaves the lab out: it runs from a checkout of gpukit's repository.
LAB_MISSING = ("gpukit's lab is not installed: it runs from a checkout of gpukit's repository "
               "(pip install -e '.[dev]' there); the gpukit package holds the node agent, the "
               "provisioning library and the conformance suite")


@lab_app.callback()
def _lab_present() -> None:
    """The hardware-free lab: a real cluster with simulated GPU nodes."""
    if importlib.util.find_spec("gpukit.lab") is None:
        _fail(LAB_MISSING)


# Commands that hand their arguments to an existing entry point as they are (its own --help,
# --version and exit codes).
_PASS_THROUGH = {"allow_extra_args": True, "ignore_unknown_options": True,
                 "help_option_names": []}  # fmt: skip


def _run_agent(load: Callable[[], Callable[..., int]], args: list[str], prog: str) -> None:
    """Start an agent whose entry point `load()` imports: the signal handlers before its heavy
    imports, as `python -m <module>` does (a SIGTERM while importing ends it with 0)."""
    from gpukit.plugin.signals import INBOX, StopRequested

    INBOX.install()
    try:
        entry = load()
    except StopRequested:
        raise typer.Exit(0) from None
    raise typer.Exit(entry(args, prog=prog))


def _device_plugin_main() -> Callable[..., int]:
    from gpukit.plugin.cli import main

    return main


def _dra_plugin_main() -> Callable[..., int]:
    from gpukit.plugin.dra.cli import main

    return main


@app.command("plugin", context_settings=_PASS_THROUGH, add_help_option=False)
def plugin(ctx: typer.Context) -> None:
    """Run the device plugin: gpukit-device-plugin's flags (`gpukit plugin --help`)."""
    _run_agent(_device_plugin_main, ctx.args, "gpukit plugin")


@app.command("dra", context_settings=_PASS_THROUGH, add_help_option=False)
def dra(ctx: typer.Context) -> None:
    """Run the DRA kubelet plugin for gpu.nvidia.com (`gpukit dra --help`)."""
    _run_agent(_dra_plugin_main, ctx.args, "gpukit dra")


@app.command("mig", context_settings=_PASS_THROUGH, add_help_option=False)
def mig(ctx: typer.Context) -> None:
    """The MIG manager: plan, apply, assert, export (`gpukit mig --help`)."""
    from gpukit.plugin.mig.cli import main as mig_main

    raise typer.Exit(mig_main(ctx.args, prog="gpukit mig"))


@app.command("summary", context_settings=_PASS_THROUGH, add_help_option=False)
def summary(ctx: typer.Context) -> None:
    """Per node: what site.yml changed and what the suite found (`gpukit summary --help`)."""
    from gpukit.summary import main as summary_main

    raise typer.Exit(summary_main(ctx.args, prog="gpukit summary"))


def _suite_results(junit: Path, command: str) -> tuple[list[Result], dict[str, str]]:
    """The suite's results and run facts from its JUnit XML, or one line and exit."""
    try:
        from gpukit.conformance import report as html_report
    except ImportError as e:
        _fail(f"gpukit {command} needs the conformance suite's dependencies ({e}): "
              "pip install 'gpukit[conformance]'")  # fmt: skip
    try:
        results, meta = html_report.from_junit(junit)
    except html_report.JunitError as e:
        _fail(e)
    if not results:
        _fail(f"{junit}: no test case of the gpukit conformance suite (none has its properties)")
    return results, meta


@app.command("evidence")
def evidence(
    junit: Annotated[Path, typer.Argument(help="the conformance suite's JUnit XML (--junitxml)")],
    output: Annotated[Path, typer.Option("--output", "-o", help="the directory to write")],
    log: Annotated[Path | None, typer.Option("--log", help="the run's output, as e2e.log "
                                             "(default: one line per test from the JUnit)")] = None,
    kubernetes_version: Annotated[str, typer.Option(help="metadata.kubernetesVersion")] = "",
    platform_name: Annotated[str, typer.Option(help="metadata.platformName")] = "",
    platform_version: Annotated[str, typer.Option(help="metadata.platformVersion")] = "",
    vendor_name: Annotated[str, typer.Option(help="metadata.vendorName")] = "",
) -> None:
    """CNCF AI Conformance evidence of a suite run: junit.xml, e2e.log and a PRODUCT.yaml
    draft whose covered requirements carry the suite's results."""
    results, _meta = _suite_results(junit, "evidence")
    from gpukit.conformance import evidence as ev

    meta = {"kubernetesVersion": kubernetes_version, "platformName": platform_name,
            "platformVersion": platform_version, "vendorName": vendor_name}
    try:
        doc = ev.write(output, junit, results, meta, log)
    except OSError as e:
        _fail(f"{output}: {e}")
    claimed = [r["id"] for reqs in doc["spec"].values() for r in reqs if r["status"]]
    print(f"{output}: {ev.PRODUCT} drafts {len(claimed)} requirement(s) from "
          f"{len(results)} tests: {', '.join(claimed) or 'none'}")


@app.command("report")
def report(
    junit: Annotated[Path, typer.Argument(help="the conformance suite's JUnit XML (--junitxml)")],
    output: Annotated[Path, typer.Option("--output", "-o", help="the HTML report to write")],
) -> None:
    """Render the conformance suite's per-node HTML report from the JUnit XML of a run."""
    results, meta = _suite_results(junit, "report")
    from gpukit.conformance import report as html_report

    try:
        html_report.write(str(output), results, meta)
    except OSError as e:
        _fail(f"{output}: {e}")
    nodes = sorted({r.node for r in results})
    bad = sum(r.outcome in ("failed", "error") for r in results)
    print(f"{output}: {len(results)} tests on {len(nodes)} node(s), {bad} failed")


@app.command("manifests")
def manifests_cmd(
    inventory: Annotated[str, typer.Option("--inventory", "-i",
                                           help="inventory directory or file")],
    host: Annotated[list[str] | None, typer.Option(
        "--host", help="play only these hosts (repeatable)")] = None,
    group: Annotated[list[str] | None, typer.Option(
        "--group", help="play only these groups (repeatable)")] = None,
    limit: Annotated[str, typer.Option(
        "--limit", "-l", help="an Ansible host pattern, as ansible-playbook --limit")] = "",
    extra_vars: Annotated[list[str] | None, typer.Option(
        "--extra-vars", "-e", help="variables as ansible-playbook -e: @FILE, YAML/JSON or k=v")
    ] = None,
    dra: Annotated[bool, typer.Option(
        "--dra/--no-dra", help="the DRA plugin's objects too (device_plugin_dra)")] = True,
    kubernetes_version: Annotated[str | None, typer.Option(
        "--kubernetes-version", help="the cluster's (e.g. v1.35.4): DeviceClass gpu.nvidia.com"
        " maps nvidia.com/gpu only from 1.36; default: assumed")] = None,
) -> None:
    """Print the node agent's Kubernetes objects exactly as site.yml's device_plugin role
    applies them for the inventory (the device plugin's, then the DRA plugin's), as one YAML
    stream (`| kubectl apply -f -`, GitOps)."""
    import json

    from gpukit import inventory as inv
    from gpukit import manifests as m

    given = [*(extra_vars or [])]
    if not dra:
        given.append(json.dumps({"device_plugin_dra": False}))
    if kubernetes_version:
        given.append(json.dumps({"device_plugin_kubernetes_version": kubernetes_version}))
    hosts = [*(host or []), *(group or []), *([limit] if limit else [])]
    try:
        objects, labels = m.printed(inventory, limit=hosts, extra_vars=given)
    except (m.ManifestsError, inv.InventoryError) as e:
        _fail(e)
    except ImportError as e:
        _fail(f"reading an inventory needs ansible-core ({e}): pip install 'gpukit[conformance]'")
    print(m.labels_comment(labels) + m.to_yaml(objects), end="")


@inventory_app.command("check")
def inventory_check(
    inventory: str = typer.Argument(..., help="inventory directory or hosts file"),
) -> None:
    """Validate every GPU node's declaration and what it implies (resources, labels) on the
    controller, connecting to nothing; list every problem at once (exit 2)."""
    from gpukit import inventory as inv

    try:
        result = inv.check(inventory)
    except ImportError as e:
        _fail(f"reading an inventory needs ansible-core ({e}): pip install 'gpukit[conformance]'")
    gpus = result.inventory
    if result.problems or gpus is None:
        _fail(inv.InventoryError(result.problems, gpus.source if gpus else str(inventory)))
    print(f"{gpus.source}: {len(gpus.nodes)} GPU node(s), every declaration valid")
    for decl in gpus.nodes:
        resources = result.resources.get(decl.node_name, {})
        served = ", ".join(f"{r}={n}" for r, n in sorted(resources.items()) if n) or "no GPUs"
        if decl.dra:
            kinds = Counter(d["profile"] or "gpu" for d in inv.expected_dra_devices(decl))
            served = "DRA gpu.nvidia.com: " + (", ".join(
                f"{k}={n}" for k, n in sorted(kinds.items())) or "no GPUs")
        print(f"  {decl.node_name:24} {served}{_sharing_summary(decl)}")


def _sharing_summary(decl: NodeDecl) -> str:
    """' (MPS: ...)' or ' (time-slicing: ...)' for a node whose config shares its GPUs."""
    from gpukit.conformance import expect

    if decl.dra or not decl.plugin_config.sharing.resources:
        return ""
    parts = []
    for resource, replicas in sorted(expect.shared_resources(decl).items()):
        counts = "/".join(str(n) for n in sorted(set(replicas), reverse=True))
        part = f"{resource} {counts} replicas per device"
        share = expect.mps_share(decl, resource)
        if share is not None:
            memory = decl.gpu.memory_mib
            limit = f"{memory // share.replicas} MiB pinned memory, " if memory else ""
            part += f", each {limit}{share.thread_percentage} % of the threads"
        parts.append(part)
    strategy = "MPS" if decl.plugin_config.sharing_strategy == "mps" else "time-slicing"
    return f" ({strategy}: {'; '.join(parts)})"


@lab_app.command("up")
def lab_up(timeout: float = typer.Option(180, help="seconds to wait for all nodes Ready")) -> None:
    """Bring the lab up (or repair it); print the kubeconfig path."""
    from gpukit.lab import cluster
    from gpukit.lab.config import LabConfigError, load_spec
    from gpukit.lab.controlplane import LabError

    try:
        kubeconfig = cluster.up(load_spec(), timeout=timeout)
    except (LabError, LabConfigError) as e:
        _fail(e)
    print(kubeconfig)


@lab_app.command("status")
def lab_status(as_json: bool = typer.Option(False, "--json")) -> None:
    """Show each component and node; exit 1 unless everything is up."""
    import json

    from gpukit.lab import cluster
    from gpukit.lab.config import LabConfigError, load_spec
    from gpukit.lab.controlplane import LabError

    try:
        st = cluster.status(load_spec())
    except (LabError, LabConfigError) as e:
        _fail(e)
    if as_json:
        print(json.dumps({"up": st.up, "components": st.components, "nodes": st.nodes,
                          "versions": st.versions, "node_versions": st.node_versions},
                         indent=2))  # fmt: skip
    else:
        for c, ok in st.components.items():
            print(f"{c:28} {'up' if ok else 'DOWN'}")
        if st.versions.get("kubernetes"):
            print(f"{'control plane':28} Kubernetes {st.versions['kubernetes']}")
        for n, checks in st.nodes.items():
            bad = [k for k, v in checks.items() if not v]
            v = st.node_versions.get(n, {})
            runs = ", ".join(f"{k} {v[k]}" for k in ("kubelet", "containerd", "runc") if k in v)
            state = "up" if not bad else "DOWN (" + ", ".join(bad) + ")"
            print(f"node {n:23} {state}{'  [' + runs + ']' if runs else ''}")
    raise typer.Exit(0 if st.up else 1)


@lab_app.command("down")
def lab_down(
    purge: bool = typer.Option(False, help="also delete node roots, etcd data, certs"),
) -> None:
    """Stop everything the lab started and clean up after it."""
    from gpukit.lab import cluster
    from gpukit.lab.config import LabConfigError, load_spec
    from gpukit.lab.controlplane import LabError

    try:
        cluster.down(load_spec(), purge=purge)
    except (LabError, LabConfigError) as e:
        _fail(e)


@lab_app.command("smoke")
def lab_smoke() -> None:
    """Run a GPU smoke check on every lab node."""
    from gpukit.lab import smoke
    from gpukit.lab.config import LabConfigError, load_spec
    from gpukit.lab.controlplane import LabError

    try:
        smoke.run(load_spec())
    except (LabError, LabConfigError) as e:
        _fail(e)


def main() -> None:
    app()


if __name__ == "__main__":
    main()
