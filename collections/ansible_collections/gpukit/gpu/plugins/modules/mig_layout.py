#!/usr/bin/python
# ruff: noqa: E402  (Ansible's layout: documentation strings before imports)
"""gpukit.gpu.mig_layout: a node's MIG layout through gpukit's MIG manager
(a thin adapter over gpukit.provision.mig and `python -m gpukit.plugin.mig`)."""

from __future__ import annotations

DOCUMENTATION = r"""
---
module: mig_layout
short_description: Apply a named MIG layout to a node's GPUs
description:
  - Writes the named MIG layouts as the MIG manager's mig-parted (C(version v1)) file and
    runs C(python -m gpukit.plugin.mig apply) - or C(plan) in check mode - for the selected
    layout, with C(--json).
  - The MIG manager validates the whole layout against the node's GPUs first, refuses while
    GPU processes run (unless C(force)), pauses the device plugin and resets GPUs whose MIG
    mode changes.
version_added: "0.1.0"
author: gpukit
options:
  configs:
    description: The named layouts (the inventory's C(gpukit_mig_configs)).
    type: dict
    required: true
  selected:
    description: The layout this node gets.
    type: str
    required: true
  config_file:
    description: Where the MIG manager's config is written.
    type: path
    default: /etc/gpukit/mig-parted.yaml
  force:
    description: Apply even while GPU processes run on GPUs that must change.
    type: bool
    default: false
  extra_args:
    description: More MIG manager arguments (e.g. C(--state-file), C(--pause-file)).
    type: list
    elements: str
    default: []
  timeout:
    description:
      - Seconds the apply may take (the MIG manager's C(--timeout)); after that it is stopped,
        C(nvidia.com/mig.config.state) is C(failed), the device plugin's pause is lifted and the
        task fails.
    type: int
    default: 600
notes:
  - Supports check mode (the plan) and diff mode (layout before and after, per GPU).
"""

EXAMPLES = r"""
- name: Apply the node's MIG layout
  gpukit.gpu.mig_layout:
    configs: "{{ gpukit_mig_configs }}"
    selected: "{{ gpukit_mig_config }}"
"""

RETURN = r"""
summary:
  description: Changed GPUs, before -> after.
  returned: always
  type: list
  elements: str
result:
  description: The MIG manager's JSON output.
  returned: always
  type: dict
"""

from ansible_collections.gpukit.gpu.plugins.module_utils import gpukit_common as gk


def main():
    module = gk.ansible_module({
        "configs": {"type": "dict", "required": True},
        "selected": {"type": "str", "required": True},
        "config_file": {"type": "path", "default": "/etc/gpukit/mig-parted.yaml"},
        "force": {"type": "bool", "default": False},
        "extra_args": {"type": "list", "elements": "str", "default": []},
        "timeout": {"type": "int", "default": 600},
    })
    from gpukit.contracts.mig_parted import MigConfigError
    from gpukit.provision import mig

    p = module.params
    try:
        text = mig.parted_config(p["configs"])
    except MigConfigError as e:
        module.fail_json(msg=f"gpukit_mig_configs: {'; '.join(e.problems)}")
    current = gk.read_text(p["config_file"])
    file_changed = current != text
    config_file = p["config_file"]
    if file_changed and module.check_mode:
        # Plan against the declared layouts, not the stale file on the node.
        import tempfile

        fd, config_file = tempfile.mkstemp(prefix="gpukit-mig-", suffix=".yaml")
        with open(fd, "w", encoding="utf-8") as f:
            f.write(text)
    elif file_changed:
        gk.write_text(module, config_file, text)
    command = "plan" if module.check_mode else "apply"
    try:
        run = mig.run(command, config_file, p["selected"], force=p["force"],
                      extra=p["extra_args"], apply_timeout=p["timeout"])
    except mig.MigRunError as e:
        if module.check_mode and mig.driver_not_activated(e):
            # A plan only: the node has an installed driver to activate, so it rolls anyway;
            # the layout is applied after the driver role made NVML readable again.
            module.warn(f"{e}: {mig.PENDING_ACTIVATION}")
            module.exit_json(changed=True, summary=[mig.PENDING_ACTIVATION], result=e.result,
                             config_file_changed=file_changed)
        module.fail_json(msg=str(e), result=e.result)
    finally:
        if config_file != p["config_file"]:
            import os

            os.unlink(config_file)
    result = {
        "changed": run.changed or file_changed,
        "summary": run.summary,
        "result": run.result,
        "config_file_changed": file_changed,
    }
    if module._diff and (run.changed or file_changed):
        result["diff"] = [
            {
                "before_header": f"MIG layout ({p['selected']})",
                "after_header": f"MIG layout ({p['selected']})",
                "before": run.diff_before,
                "after": run.diff_after,
            }
        ]
        if file_changed:
            result["diff"].append(
                {
                    "before_header": p["config_file"],
                    "after_header": p["config_file"],
                    "before": current or "",
                    "after": text,
                }
            )
    module.exit_json(**result)


if __name__ == "__main__":
    main()
