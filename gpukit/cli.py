"""The `gpukit` command line."""

from __future__ import annotations

import typer

from gpukit import __version__
from gpukit.lab.config import LabConfigError, load_spec
from gpukit.lab.controlplane import LabError

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


def _fail(err: Exception) -> None:
    typer.secho(f"error: {err}", fg=typer.colors.RED, err=True)
    raise typer.Exit(2)


@inventory_app.command("check")
def inventory_check(
    inventory: str = typer.Argument(..., help="inventory directory or hosts file"),
) -> None:
    """Validate every GPU node's declaration and what it implies (resources, labels) on the
    controller, connecting to nothing; list every problem at once (exit 2)."""
    from gpukit import inventory as inv

    try:
        gpus = inv.load(inventory)
    except inv.InventoryError as e:
        _fail(e)
    problems: list[inv.Problem] = []
    lines: list[str] = []
    for decl in gpus.nodes:
        try:
            resources = inv.expected_resources(decl)
            inv.expected_labels(decl)
        except inv.InventoryError as e:
            problems += e.problems
            continue
        served = ", ".join(f"{r}={n}" for r, n in sorted(resources.items()) if n) or "no GPUs"
        lines.append(f"{decl.node_name:24} {served}")
    if problems:
        _fail(inv.InventoryError(problems, gpus.source))
    print(f"{gpus.source}: {len(gpus.nodes)} GPU node(s), every declaration valid")
    for line in lines:
        print(f"  {line}")


@lab_app.command("up")
def lab_up(timeout: float = typer.Option(180, help="seconds to wait for all nodes Ready")) -> None:
    """Bring the lab up (or repair it); print the kubeconfig path."""
    from gpukit.lab import cluster

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

    try:
        cluster.down(load_spec(), purge=purge)
    except (LabError, LabConfigError) as e:
        _fail(e)


@lab_app.command("smoke")
def lab_smoke() -> None:
    """Run a GPU smoke check on every lab node."""
    from gpukit.lab import smoke

    try:
        smoke.run(load_spec())
    except (LabError, LabConfigError) as e:
        _fail(e)


def main() -> None:
    app()


if __name__ == "__main__":
    main()
