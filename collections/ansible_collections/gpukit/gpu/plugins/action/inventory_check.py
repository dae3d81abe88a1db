"""gpukit.gpu.inventory_check: every GPU node's declaration validated on the controller before
any host is touched (a thin adapter over gpukit.inventory.check, the code behind
`gpukit inventory check`), once per play: its `declarations` (host -> the host's validated
declaration and what it implies, gpukit.provision.declaration) become each host's
gpukit_declaration, which the roles read. Runs in the controller's Ansible process and opens
no connection. Also checks each GPU node's agent image (gpukit_device_plugin_image) against this
collection's version; gpukit_device_plugin_image_pinned: true makes a mismatch a warning."""

from __future__ import annotations

from pathlib import Path

from ansible.errors import AnsibleError
from ansible.module_utils.parsing.convert_bool import boolean
from ansible.plugins.action import ActionBase

GPU_GROUP = "gpu_nodes"
# This collection's root (its version: gpukit.provision.image_version.collection_version).
COLLECTION_ROOT = Path(__file__).resolve().parents[2]


class ActionModule(ActionBase):
    TRANSFERS_FILES = False
    _requires_connection = False  # nothing of a node is read: no connection is even made
    _supports_check_mode = True

    def run(self, tmp=None, task_vars=None):
        result = super().run(tmp, task_vars)
        _, args = self.validate_argument_spec(
            argument_spec={"sources": {"type": "list", "elements": "path"}},
        )
        try:
            from gpukit import inventory
            from gpukit.provision import declaration
        except ImportError as e:
            raise AnsibleError(
                f"gpukit is not importable on the controller ({e}): install gpukit's Python"
                " package where ansible-playbook runs (see the gpukit.gpu collection's README)"
            ) from e
        sources = args.get("sources") or list(task_vars.get("ansible_inventory_sources") or [])
        checked = inventory.check(sources, host_vars=self._extra_declarations(task_vars))
        problems = [str(p) for p in checked.problems]
        image_problems, warnings = self._image_versions(task_vars)
        problems += image_problems
        if warnings:
            result["warnings"] = warnings
        source = checked.inventory.source if checked.inventory else ",".join(sources)
        result.update(changed=False, problems=problems,
                      nodes={n: dict(r) for n, r in checked.resources.items()},
                      declarations=declaration.facts(checked))
        if problems:
            # One line per problem, host, variable and value first: the play's output says it all.
            result.update(failed=True, msg=f"{source}: {len(problems)} problem(s) in the GPU "
                          "nodes' declarations (nothing was touched):\n  " + "\n  ".join(problems))
        else:
            result["msg"] = (f"{source}: {len(checked.resources)} GPU node(s), every declaration "
                             "valid")
        return result

    def _image_versions(self, task_vars):
        """The agent image each GPU node would run against this collection's version
        (gpukit.provision.image_version): (problems, warnings), one line per distinct image."""
        from gpukit.provision import image_version as iv

        version = iv.collection_version(COLLECTION_ROOT)
        hostvars = task_vars["hostvars"]
        seen = {}
        for host in task_vars.get("groups", {}).get(GPU_GROUP, []):
            hv = hostvars[host]
            image = str(hv.get(iv.IMAGE_VARIABLE) or "")
            pinned = boolean(hv.get(iv.PINNED_VARIABLE, False), strict=False)
            seen.setdefault((image, pinned), iv.check(image, version, pinned))
        problems = [v.problem for v in seen.values() if v.problem]
        return problems, [v.warning for v in seen.values() if v.warning]

    def _extra_declarations(self, task_vars):
        """Declaration variables given with -e, as each GPU node resolves them: they win over
        the inventory's files, as in the plays that follow. The inventory's own values are
        read (and templated) by gpukit.inventory itself."""
        from ansible.utils.vars import load_extra_vars

        from gpukit import inventory

        given = [n for n in load_extra_vars(self._loader) if n in inventory.DECLARED_VARIABLES]
        if not given:
            return {}
        hostvars = task_vars["hostvars"]
        out = {}
        for host in task_vars.get("groups", {}).get(GPU_GROUP, []):
            out[host] = {n: inventory.plain(hostvars[host][n]) for n in given}
        return out
