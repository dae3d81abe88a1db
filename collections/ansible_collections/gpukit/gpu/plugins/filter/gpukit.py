"""gpukit.gpu filters: thin adapters over gpukit.provision, run on the controller."""

from __future__ import annotations

from ansible.errors import AnsibleFilterError

try:
    from gpukit.provision import agent, driver, nodes, sharing, sharing_rollout, upgrade

    HAS_GPUKIT = True
except ImportError as e:  # pragma: no cover - reported when a filter is used
    HAS_GPUKIT = False
    IMPORT_ERROR = e


def _need():
    if not HAS_GPUKIT:
        raise AnsibleFilterError(
            f"gpukit is not importable on the controller ({IMPORT_ERROR}): run ansible-playbook"
            " from gpukit's environment (.venv)"
        )


def _spec(family, branch, kernel_modules="open", channel="cuda", persistenced=True, version=None):
    _need()
    try:
        return driver.DriverSpec(
            branch=str(branch),
            kernel_modules=kernel_modules,
            family=family,
            channel=channel,
            persistenced=persistenced,
            version=version or None,
        )
    except driver.DriverSpecError as e:
        raise AnsibleFilterError(str(e)) from e


def apt_pin(branch, **kw):
    """`'550' | gpukit.gpu.apt_pin(channel='lab')`: the branch pin's content."""
    return driver.apt_pin(_spec("debian", branch, **kw))


def dnf_versionlock(branch, **kw):
    """`'550' | gpukit.gpu.dnf_versionlock(kernel_modules='open')`: versionlock.list."""
    return driver.dnf_versionlock(_spec("redhat", branch, **kw))


def dnf_module_stream(branch, **kw):
    """`'550' | gpukit.gpu.dnf_module_stream(kernel_modules='open')`: nvidia-driver:550-open."""
    return driver.dnf_module_stream(_spec("redhat", branch, **kw))


def dnf_stream_switch(module_list, branch, **kw):
    """True when `dnf module list --enabled nvidia-driver` shows another stream enabled."""
    return driver.dnf_stream_switch(_spec("redhat", branch, **kw), module_list or "")


def driver_packages(branch, family="debian", **kw):
    return _spec(family, branch, **kw).packages()


def reboot_decision(target_version, loaded_version, nvml_error=None, nouveau_loaded=False):
    """{required, reason}: is a reboot due for the installed driver to run?"""
    _need()
    d = driver.reboot_decision(
        target_version or None, loaded_version or None, nvml_error or None, bool(nouveau_loaded)
    )
    return {"required": d.required, "reason": d.reason}


def node_labels(extra, device_plugin_config=None, mig_config=None, deploy_device_plugin=True):
    """Every label the inventory declares for a node."""
    _need()
    try:
        return nodes.declared_labels(
            extra, device_plugin_config or None, mig_config or None, deploy_device_plugin
        )
    except nodes.NodeSpecError as e:
        raise AnsibleFilterError(str(e)) from e


def node_patch(node, labels, taints=None):
    """{patch, changes, needed}: make `node` (a k8s_info resource) carry `labels`/`taints`."""
    _need()
    try:
        parsed = nodes.parse_taints(taints, "gpukit_node_taints")
    except nodes.NodeSpecError as e:
        raise AnsibleFilterError(str(e)) from e
    p = nodes.plan(node, labels, parsed)
    return {"patch": p.patch, "changes": list(p.changes), "needed": p.changed}


def sharing_check(plugin_configs, plugin_config=None, mig_configs=None, mig_config=None):
    """{ok, problems, warnings, time_slicing_replicas} of a node's sharing declarations."""
    _need()
    c = sharing.check(
        plugin_configs or {}, plugin_config or None, mig_configs or {}, mig_config or None
    )
    return {
        "ok": c.ok,
        "problems": c.problems,
        "warnings": c.warnings,
        "time_slicing_replicas": c.time_slicing_replicas,
    }


def merge_plugin_configs(hosts, hostvars, fact):
    """Every host's named device plugin configs (the per-host `fact`) as one mapping."""
    _need()
    per_host = {h: inventory_plain(hostvars[h][fact]) for h in hosts if fact in hostvars[h]}
    try:
        return agent.merge_configs(per_host)
    except agent.AgentSpecError as e:
        raise AnsibleFilterError(str(e)) from e


def inventory_plain(value):
    from gpukit.inventory import plain

    return plain(value)


def upgrade_plan(states, max_failed=None):
    """The rollout's batches from the planning play's per-node findings."""
    _need()
    try:
        return upgrade.plan([upgrade.node_state(s) for s in states], max_failed).as_dict()
    except upgrade.UpgradeSpecError as e:
        raise AnsibleFilterError(str(e)) from e


def upgrade_driver_changes(summary, target_version=None, running_version=None):
    _need()
    return upgrade.driver_changes(summary or [], target_version or None, running_version or None)


def upgrade_label_changes(changes, watched):
    _need()
    return upgrade.label_changes(changes or [], watched)


def upgrade_pods_to_wait_for(pods, resource_prefixes=("nvidia.com/",), owner_kinds=("Job",)):
    """Names of the node's GPU pods a rollout waits for before it drains."""
    _need()
    return upgrade.pods_to_wait_for(pods or [], resource_prefixes, owner_kinds)


def upgrade_pods_left(pods):
    """Pods a drain should have removed that are still on the node."""
    _need()
    return upgrade.pods_left(pods or [])


def upgrade_node_serves(node, expected, driver=None):
    _need()
    return upgrade.node_serves(node or {}, expected or {}, driver or None)


def device_plugin_node_serves(node, expected, selector):
    _need()
    return agent.node_serves_declared(node or {}, expected or {}, selector or {})


def upgrade_agent_started_since(pods, since):
    _need()
    return upgrade.agent_started_since(pods or [], since)


def upgrade_failed_hosts(hostvars, hosts, fact="rolling_upgrade_result"):
    """Hosts of `hosts` whose rollout result is `failed` so far."""
    results = {}
    for h in hosts:
        try:
            results[h] = hostvars[h].get(fact, None)
        except KeyError:
            results[h] = None
    _need()
    return upgrade.failed_so_far(results)


def upgrade_report(planned, hostvars, check_mode=False):
    """Each planned node's outcome, from the rollout's per-host facts."""
    _need()
    results, failures = {}, {}
    for h in planned.get("order") or []:
        hv = hostvars[h]
        results[h] = hv.get("rolling_upgrade_result", None)
        failures[h] = hv.get("rolling_upgrade_failure", None)
    return upgrade.report(planned, results, failures, bool(check_mode)).as_dict()


def _live_configs(config_map):
    """The ConfigMap's configs from a k8s_info result's resources (None: no ConfigMap)."""
    if isinstance(config_map, list):
        config_map = config_map[0] if config_map else None
    return sharing_rollout.parse_data(inventory_plain(config_map) if config_map else None)


def sharing_node_plan(config_map, configs, declared=None, default=None, current_label=None):
    """{changes, label, plan_label}: a node's device plugin config content in a rollout."""
    _need()
    return sharing_rollout.node_plan(
        _live_configs(config_map), inventory_plain(configs or {}), declared or None,
        default or None, current_label or None,
    ).as_dict()


def sharing_publish(config_map, configs, namespace):
    """The ConfigMap to apply before a rollout (changed configs also under versioned names),
    or None when it already carries them."""
    _need()
    data = sharing_rollout.publish(_live_configs(config_map), inventory_plain(configs or {}))
    return None if data is None else sharing_rollout.config_map(data, namespace)


def sharing_finish(config_map, configs, node_objects, hostvars, hosts, default, complete,
                   namespace):
    """The finish step's decisions: {stage, relabel, final, lines, needed}; stage and final
    are ConfigMaps to apply (or None), relabel maps hosts to the config whose new content
    must be mounted on them before their label goes back to the declared name."""
    _need()
    by_node = {}
    for h in hosts:
        hv = hostvars[h]
        by_node[str(hv.get("gpukit_node_name") or h)] = (h, hv.get("gpukit_device_plugin_config"))
    uses = []
    for obj in node_objects or []:
        meta = obj.get("metadata") or {}
        name = str(meta.get("name"))
        label = (meta.get("labels") or {}).get(nodes.DEVICE_PLUGIN_CONFIG)
        host, declared = by_node.get(name, (None, None))
        uses.append(sharing_rollout.NodeUse(name, label or None, host, declared or None))
    f = sharing_rollout.finish(_live_configs(config_map), inventory_plain(configs or {}), uses,
                               default or None, bool(complete))
    out = f.as_dict()
    for key in ("stage", "final"):
        if out[key] is not None:
            out[key] = sharing_rollout.config_map(out[key], namespace)
    return out


def sharing_mounted(slurped, content):
    """A node's mounted config file (slurp's base64 content) carries `content`."""
    _need()
    import base64

    try:
        text = base64.b64decode(slurped or "").decode()
    except ValueError:
        return False
    return sharing_rollout.mounted(text, inventory_plain(content))


def expected_resources(hostvars, host):
    """What the device plugin must advertise on `host` for its declarations (resource -> n)."""
    try:
        from gpukit import inventory
    except ImportError:
        _need()
        raise
    raw = {
        k: inventory.plain(hostvars[k])
        for k in hostvars
        if k.startswith(("gpukit_", "nvidia_driver_")) or k == "ansible_host"
    }
    try:
        return inventory.expected_resources(inventory.node_from_vars(host, raw))
    except inventory.InventoryError as e:
        raise AnsibleFilterError(str(e)) from e


def declared_vars(hostvars):
    """A host's declaration variables as its play resolved them (-e included): what the
    rolling upgrade hands the conformance suite (--host-vars) to validate the node against."""
    try:
        from gpukit import inventory
    except ImportError:
        _need()
        raise
    return inventory.declared_vars(hostvars)


class FilterModule:
    def filters(self):
        return {
            "apt_pin": apt_pin,
            "dnf_versionlock": dnf_versionlock,
            "dnf_module_stream": dnf_module_stream,
            "dnf_stream_switch": dnf_stream_switch,
            "driver_packages": driver_packages,
            "reboot_decision": reboot_decision,
            "node_labels": node_labels,
            "node_patch": node_patch,
            "sharing_check": sharing_check,
            "upgrade_plan": upgrade_plan,
            "merge_plugin_configs": merge_plugin_configs,
            "upgrade_report": upgrade_report,
            "upgrade_node_serves": upgrade_node_serves,
            "device_plugin_node_serves": device_plugin_node_serves,
            "upgrade_agent_started_since": upgrade_agent_started_since,
            "upgrade_pods_left": upgrade_pods_left,
            "upgrade_failed_hosts": upgrade_failed_hosts,
            "expected_resources": expected_resources,
            "declared_vars": declared_vars,
            "upgrade_driver_changes": upgrade_driver_changes,
            "upgrade_label_changes": upgrade_label_changes,
            "upgrade_pods_to_wait_for": upgrade_pods_to_wait_for,
            "sharing_node_plan": sharing_node_plan,
            "sharing_publish": sharing_publish,
            "sharing_finish": sharing_finish,
            "sharing_mounted": sharing_mounted,
        }
