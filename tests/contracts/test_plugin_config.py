"""Config parsing: NVIDIA v1 files load unchanged; every bad input names its field and value."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from gpukit.contracts.plugin_config import (
    DEFAULT_IGNORED_XIDS,
    ConfigError,
    load_document,
    parse_config,
    parse_document,
)
from gpukit.plugin.config_source import ConfigSource, Override, env_overrides

NVIDIA_EXAMPLE = """
version: v1
flags:
  migStrategy: "mixed"
  failOnInitError: true
  nvidiaDriverRoot: "/"
  plugin:
    passDeviceSpecs: false
    deviceListStrategy: envvar
    deviceIDStrategy: uuid
  gfd:
    oneshot: false
    noTimestamp: false
    outputFile: /etc/kubernetes/node-feature-discovery/features.d/gfd
    sleepInterval: 60s
sharing:
  timeSlicing:
    renameByDefault: false
    failRequestsGreaterThanOne: false
    resources:
    - name: nvidia.com/gpu
      replicas: 10
"""


def problems(doc: dict[str, object]) -> list[str]:
    with pytest.raises(ConfigError) as err:
        parse_config(doc)
    return err.value.problems


def test_defaults() -> None:
    c = parse_config({})
    assert c.flags.mig_strategy == "none"
    assert c.flags.fail_on_init_error is True
    assert c.flags.plugin.device_list_strategy == ("envvar",)
    assert c.flags.plugin.device_id_strategy == "uuid"
    assert c.time_slicing.resources == ()
    assert c.gpukit.health.ignored_xids == DEFAULT_IGNORED_XIDS == (13, 31, 43, 45, 68, 109)
    assert c.sharing_strategy == "none"
    assert c.device_root == "/"


def test_nvidia_example_loads_unchanged() -> None:
    c = parse_config(parse_document(NVIDIA_EXAMPLE))
    assert c.flags.mig_strategy == "mixed"
    (res,) = c.time_slicing.resources
    assert (res.name, res.replicas, res.rename, res.devices.all) == ("nvidia.com/gpu", 10, "", True)
    assert c.sharing_strategy == "time-slicing"
    assert any("flags.gfd" in w for w in c.warnings)


def test_rename_by_default_and_short_names() -> None:
    c = parse_config({"sharing": {"timeSlicing": {"renameByDefault": True, "resources": [
        {"name": "gpu", "replicas": 4},
        {"name": "mig-1g.5gb", "replicas": 2, "rename": "small"},
    ]}}})
    a, b = c.time_slicing.resources
    assert a.shared_name == "nvidia.com/gpu.shared"
    assert b.shared_name == "nvidia.com/small"


def test_device_list_strategy_string_or_list() -> None:
    c = parse_config({"flags": {"plugin": {"deviceListStrategy": ["envvar", "cdi-cri"]}}})
    assert c.flags.plugin.device_list_strategy == ("envvar", "cdi-cri")
    c = parse_config({"flags": {"plugin": {"deviceListStrategy": "volume-mounts"}}})
    assert c.flags.plugin.device_list_strategy == ("volume-mounts",)


def test_replicas_below_two() -> None:
    assert problems({"sharing": {"timeSlicing": {"resources": [
        {"name": "nvidia.com/gpu", "replicas": 1}]}}}) == [
        "sharing.timeSlicing.resources[0].replicas: 1 is not >= 2"]


@pytest.mark.parametrize(("doc", "expected"), [
    ({"flags": {"migStrategy": "bogus"}},
     "flags.migStrategy: 'bogus' is not one of none, single, mixed"),
    ({"flags": {"plugin": {"deviceListStrategy": ["envvar", "magic"]}}},
     "flags.plugin.deviceListStrategy[1]: 'magic' is not one of envvar, volume-mounts, "
     "cdi-annotations, cdi-cri"),
    ({"flags": {"plugin": {"deviceIDStrategy": "serial"}}},
     "flags.plugin.deviceIDStrategy: 'serial' is not one of uuid, index"),
    ({"flags": {"failOnInitError": "maybe"}},
     "flags.failOnInitError: 'maybe' is not a boolean (true or false)"),
    ({"version": "v2"}, "version: 'v2' is not supported (only 'v1')"),
    ({"sharing": {"timeSlicing": {"resources": []}}},
     "sharing.timeSlicing.resources: no resources specified (need a non-empty list)"),
    ({"sharing": {"timeSlicing": {"resources": [{"replicas": 2}]}}},
     "sharing.timeSlicing.resources[0].name: no resource name specified"),
    ({"sharing": {"timeSlicing": {"resources": [{"name": "gpu"}]}}},
     "sharing.timeSlicing.resources[0].replicas: no replicas specified"),
    ({"sharing": {"timeSlicing": {"resources": [{"name": "gpu", "replicas": "4"}]}}},
     "sharing.timeSlicing.resources[0].replicas: '4' is not an integer"),
    ({"sharing": {"timeSlicing": {"resources": [{"name": "fpga", "replicas": 2}]}}},
     "sharing.timeSlicing.resources[0].name: 'nvidia.com/fpga' is not served by this plugin "
     "(nvidia.com/gpu or nvidia.com/mig-<profile>)"),
    ({"sharing": {"timeSlicing": {"resources": [
        {"name": "gpu", "replicas": 2, "devices": "some"}]}}},
     "sharing.timeSlicing.resources[0].devices: 'some' is not valid: the only string allowed "
     "is 'all'"),
    ({"sharing": {"timeSlicing": {"resources": [
        {"name": "gpu", "replicas": 2, "devices": ["0", "GPU-nope"]}]}}},
     "sharing.timeSlicing.resources[0].devices[1]: 'GPU-nope' is not a GPU index, MIG index "
     "(i:j) or UUID"),
    ({"sharing": {"timeSlicing": {"resources": [
        {"name": "gpu", "replicas": 2, "rename": "Bad_Name"}]}}},
     "sharing.timeSlicing.resources[0].rename: 'nvidia.com/Bad_Name' is not a valid resource "
     "name (lower-case letters, digits, '-' and '.', starting and ending with a letter or "
     "digit)"),
    ({"sharing": {"mps": {"resources": [{"name": "mig-1g.10gb", "replicas": 2}]}}},
     "sharing.mps.resources[0].name: 'nvidia.com/mig-1g.10gb': MIG devices cannot be shared "
     "with MPS (NVIDIA's plugin refuses it too; share them with timeSlicing)"),
    ({"sharing": {"mps": {"resources": [{"name": "gpu", "replicas": 49}]}}},
     "sharing.mps.resources[0].replicas: 49 is more than 48, the clients an MPS server serves "
     "per GPU"),
    ({"sharing": {"mps": {"resources": [{"name": "gpu", "replicas": 1}]}}},
     "sharing.mps.resources[0].replicas: 1 is not >= 2"),
    ({"sharing": {"mps": {"renameByDefalt": True}}},
     "sharing.mps.renameByDefalt: unknown field (did you mean 'renameByDefault'? known: "
     "failRequestsGreaterThanOne, renameByDefault, resources, strategy)"),
    ({"flags": {"mpsRoot": "run/mps"}}, "flags.mpsRoot: 'run/mps' is not an absolute path"),
    ({"gpukit": {"metricsAdress": "x"}},
     "gpukit.metricsAdress: unknown field (did you mean 'metricsAddress'? known: cdiSpecDir, deviceRoot, deviceRootInPlugin, "
     "health, kubeletDir, metricsAddress, replicaPolicy, rescanIntervalSeconds)"),
    ({"gpukit": {"metricsAddress": "nowhere"}},
     "gpukit.metricsAddress: 'nowhere' is not host:port (use host:port, or '' to disable)"),
    ({"gpukit": {"health": {"ignoredXids": [13, "x"]}}},
     "gpukit.health.ignoredXids[1]: 'x' is not an XID number"),
    ({"gpukit": {"replicaPolicy": "random"}},
     "gpukit.replicaPolicy: 'random' is not one of distributed, packed"),
])
def test_bad_values_name_field_and_value(doc: dict[str, object], expected: str) -> None:
    assert expected in problems(doc)


def test_time_slicing_plus_mps_rejected() -> None:
    found = problems({"sharing": {
        "timeSlicing": {"resources": [{"name": "gpu", "replicas": 2}]},
        "mps": {"resources": [{"name": "gpu", "replicas": 2}]},
    }})
    assert found == ["sharing: both timeSlicing and mps share devices; a GPU is shared one way "
                     "(NVIDIA's plugin would use mps and silently drop timeSlicing)"]


def test_nvidia_mps_example_config_unchanged() -> None:
    """NVIDIA's documented MPS example loads as it is: MPS sharing, one request per container
    by default (NVIDIA's historical behaviour), the default MPS root."""
    cfg = parse_config(yaml.safe_load(NVIDIA_MPS_EXAMPLE))
    assert cfg.sharing_strategy == "mps"
    assert cfg.sharing_path == "sharing.mps"
    assert cfg.sharing.fail_requests_greater_than_one is True
    assert [(r.name, r.replicas) for r in cfg.sharing.resources] == [("nvidia.com/gpu", 10)]
    assert cfg.flags.mps_root == "/run/nvidia/mps"
    assert cfg.time_slicing.resources == ()
    relaxed = parse_config({"sharing": {"mps": {"failRequestsGreaterThanOne": False,
                                                "resources": [{"name": "gpu", "replicas": 4}]}}})
    assert relaxed.sharing.fail_requests_greater_than_one is False
    assert parse_config({"sharing": {"timeSlicing": {"resources": [
        {"name": "gpu", "replicas": 4}]}}}).sharing.fail_requests_greater_than_one is False


# NVIDIA k8s-device-plugin README, "With CUDA MPS".
NVIDIA_MPS_EXAMPLE = """\
version: v1
sharing:
  mps:
    resources:
    - name: nvidia.com/gpu
      replicas: 10
"""


def test_all_problems_reported_at_once() -> None:
    found = problems({"flags": {"migStrategy": "x", "plugin": {"deviceIDStrategy": "y"}}})
    assert len(found) == 2


def test_per_gpu_replicas_extension() -> None:
    c = parse_config({"sharing": {"timeSlicing": {"resources": [
        {"name": "gpu", "replicas": 4, "devices": [0]},
        {"name": "gpu", "replicas": 2, "devices": [1, 2]},
    ]}}})
    assert [(r.replicas, r.devices.refs) for r in c.time_slicing.resources] == [
        (4, ("0",)), (2, ("1", "2"))]


def test_per_gpu_replicas_overlap_and_all_rejected() -> None:
    found = problems({"sharing": {"timeSlicing": {"resources": [
        {"name": "gpu", "replicas": 4, "devices": [0, 1]},
        {"name": "gpu", "replicas": 2, "devices": [1]},
        {"name": "gpu", "replicas": 3},
    ]}}})
    assert ("sharing.timeSlicing.resources[1].devices: device '1' is already shared by "
            "sharing.timeSlicing.resources[0]") in found
    assert any(p.startswith("sharing.timeSlicing.resources[2].devices: nvidia.com/gpu is listed "
                            "more than once") for p in found)


def test_malformed_yaml(tmp_path: Path) -> None:
    f = tmp_path / "c.yaml"
    f.write_text("version: v1\nflags: [unclosed\n")
    with pytest.raises(ConfigError) as err:
        load_document(f)
    assert str(f) in str(err.value) and "malformed YAML" in str(err.value)


@pytest.mark.parametrize("text", ["", "\n# only a comment\n", "null\n", "{}\n", "---\n"])
def test_an_empty_config_file_is_refused_not_taken_as_defaults(tmp_path: Path, text: str
                                                               ) -> None:
    f = tmp_path / "ts"
    f.write_text(text)
    with pytest.raises(ConfigError) as err:
        load_document(f)
    assert str(f) in str(err.value) and "<root>: the config is empty" in str(err.value)


def test_root_not_a_mapping() -> None:
    with pytest.raises(ConfigError, match="expected a mapping"):
        parse_document("- a\n- b\n")


def test_env_and_flags_override_file(tmp_path: Path) -> None:
    f = tmp_path / "c.yaml"
    f.write_text("flags:\n  migStrategy: single\n  plugin:\n    deviceIDStrategy: uuid\n")
    env = env_overrides({"MIG_STRATEGY": "mixed", "DEVICE_ID_STRATEGY": "index",
                         "PASS_DEVICE_SPECS": "true", "GPUKIT_IGNORED_XIDS": "13,48"})
    flags = [Override("flags.migStrategy", "none", "flag --mig-strategy")]
    c = ConfigSource(config_file=f, overrides=env + flags).load().config
    assert c.flags.mig_strategy == "none"  # flag beats env beats file
    assert c.flags.plugin.device_id_strategy == "index"
    assert c.flags.plugin.pass_device_specs is True
    assert c.gpukit.health.ignored_xids == (13, 48)


def test_override_error_names_its_origin() -> None:
    src = ConfigSource(overrides=env_overrides({"MIG_STRATEGY": "weird"}))
    with pytest.raises(ConfigError) as err:
        src.load()
    assert err.value.problems == [
        "flags.migStrategy: 'weird' is not one of none, single, mixed (from env MIG_STRATEGY)"]


def test_named_config_selected_by_node_label(tmp_path: Path) -> None:
    (tmp_path / "default.yaml").write_text("flags:\n  migStrategy: none\n")
    (tmp_path / "a100-mixed").write_text("flags:\n  migStrategy: mixed\n")
    labels: dict[str, str] = {}
    src = ConfigSource(config_dir=tmp_path, default_config="default", node_name="n1",
                       label_reader=lambda node: labels)
    assert src.load().config.flags.mig_strategy == "none"
    before = src.fingerprint()
    labels["nvidia.com/device-plugin.config"] = "a100-mixed"
    loaded = src.load()
    assert (loaded.name, loaded.config.flags.mig_strategy) == ("a100-mixed", "mixed")
    assert src.fingerprint() != before
    labels["nvidia.com/device-plugin.config"] = "missing"
    with pytest.raises(ConfigError, match=r"names no config.*available: a100-mixed, default\.yaml"):
        src.load()


def test_single_named_config_is_used_without_label(tmp_path: Path) -> None:
    (tmp_path / "only").write_text("flags:\n  migStrategy: single\n")
    assert ConfigSource(config_dir=tmp_path).load().config.flags.mig_strategy == "single"


def test_recovery_never_from_env() -> None:
    c = ConfigSource(overrides=env_overrides({"GPUKIT_RECOVERY_SECONDS": "never"})).load().config
    assert c.gpukit.health.recovery_seconds is None


@pytest.mark.parametrize(("doc", "expected"), [
    ({"version": "v1", "sharing": {"timeSlicng": {"resources": [
        {"name": "nvidia.com/gpu", "replicas": 4}]}}},
     "sharing.timeSlicng: unknown field (did you mean 'timeSlicing'?"),
    ({"version": "v1", "sharing": {"spaceSlicing": {}}}, "sharing.spaceSlicing: unknown field"),
    ({"version": "v1", "flags": {"migStrategyy": "mixed"}},
     "flags.migStrategyy: unknown field (did you mean 'migStrategy'?"),
    ({"version": "v1", "flag": {}}, "flag: unknown field (did you mean 'flags'?"),
])
def test_unknown_keys_are_errors_naming_the_closest_known_one(
        doc: dict[str, object], expected: str) -> None:
    """A typo must not silently turn sharing off (issue 15): before, these were warnings."""
    assert any(p.startswith(expected) for p in problems(doc)), problems(doc)


def test_keys_nvidia_knows_but_gpukit_ignores_stay_warnings() -> None:
    config = parse_config({"version": "v1", "resources": {}, "health": {"disabled": True},
                           "flags": {"gfd": {"oneshot": True}, "mofedEnabled": True}})
    assert sorted(config.warnings) == [
        "flags.gfd: accepted but not used by gpukit",
        "flags.mofedEnabled: accepted but not used by gpukit",
        "health: accepted but not used by gpukit",
        "resources: accepted but not used by gpukit",
    ]
