"""NodePrepareResources and NodeUnprepareResources as plain Python (the gRPC side is server.py).

Prepare reads the claim from the API (the kubelet gives namespace, name and UID), takes the
allocation's results for driver gpu.nvidia.com in this node's pool, checks NVIDIA's opaque
configs, starts the claim's MPS control daemon where a config shares through MPS
(claim_mps.py), writes the claim's CDI spec, records the claim in the checkpoint and then
fills its status.devices (claim_status.py; a failure there is logged, the claim stays
prepared); it returns the CDI device IDs containerd injects. A claim already in the
checkpoint (with its spec file present) is returned as recorded: a restarted agent does not
prepare it twice. At start, before the plugin registers, every checkpointed claim's CDI spec
is rewritten where missing or different (`restore_specs`: the checkpoint records each
device's container edits), and stale entries are quarantined (checkpoint.py).
Unprepare removes the spec file, stops the claim's MPS daemon, then the checkpoint entry; a
claim it does not know is already unprepared. Both are serialized: the kubelet may call for
several pods at once.
A claim NVIDIA's DRA driver prepared on the node and gpukit did not take over
(nvidia_claims.py; its CDI spec is NVIDIA's) is neither prepared nor unprepared: both answer
why, so the kubelet keeps it as it is.

Every error names the claim (namespace/name, UID), what was expected and what was found; it
goes back to the kubelet for that claim alone, which retries and shows it in the pod's events.
"""

from __future__ import annotations

import json
import logging
import os
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from gpukit.contracts import dra_checkpoint as nvidia_checkpoint
from gpukit.contracts import dra_claim_config as opaque
from gpukit.contracts.dra import DRIVER

from .. import cdi
from ..mps_daemons import DaemonDirs, MpsControl, MpsError, read_spec
from . import claim_cdi, claim_mps, claim_status, device_metadata
from .checkpoint import Checkpoint, PreparedClaim, PreparedDevice
from .dynamic_mig import CarveError, Carver
from .slice_devices import Carve, SliceDevice

log = logging.getLogger(__name__)

ClaimReader = Callable[[str, str], Mapping[str, Any]]  # (namespace, name) -> claim as JSON
# Writes a prepared claim's status.devices entries (claim_status.py).
StatusWriter = Callable[["ClaimRef", list[dict[str, Any]]], None]


class PrepareError(RuntimeError):
    """Preparing or unpreparing one claim failed; the message is what the kubelet shows."""


class _Unrestorable(RuntimeError):
    """A claim's spec cannot be restored now for a passing reason (the API did not answer)."""


@dataclass(frozen=True)
class ClaimRef:
    namespace: str
    name: str
    uid: str

    def __str__(self) -> str:
        return f"claim {self.namespace}/{self.name} (uid {self.uid})"


@dataclass
class _Plan:
    """One claim's preparation, worked out from its allocation and configs."""

    spec_devices: dict[str, tuple[str, Any, dict[str, list[Any]]]] = field(default_factory=dict)
    by_device: dict[str, list[str]] = field(default_factory=dict)
    shares: dict[str, list[str]] = field(default_factory=dict)
    mps_devices: list[claim_mps.MpsDevice] = field(default_factory=list)
    sharing: dict[str, opaque.Sharing] = field(default_factory=dict)
    carves: dict[str, Carve] = field(default_factory=dict)  # dynamic MIG devices to create
    whole_dynamic: list[int] = field(default_factory=list)  # dynamic GPUs taken whole
    by_request: dict[str, list[str]] = field(default_factory=dict)


def _recorded(extra: Mapping[str, list[Any]]) -> dict[str, list[Any]]:
    """A device's extra container edits as the checkpoint records them (empty lists left out,
    as claim_spec leaves them out)."""
    return {k: list(v) for k, v in sorted(extra.items()) if v}


@dataclass
class Preparer:
    node: str  # the pool's name
    read_claim: ClaimReader
    devices: Callable[[], Mapping[str, SliceDevice]]  # what this node publishes now, by name
    common_edits: Callable[[], Mapping[str, Any]]  # the node's spec-wide CDI edits
    checkpoint: Checkpoint
    cdi_dir: str
    device_root: str  # host paths of device nodes
    mps: MpsControl | None = None  # None: claims asking for MPS are refused
    mps_root: str = ""
    # NVIDIA's DRA driver's claims not taken over at start: UID -> why (nvidia_claims.py),
    # and why its checkpoint as a whole was not ('' when it was, or there was none).
    not_taken: dict[str, str] = field(default_factory=dict)
    nvidia_problem: str = ""
    report_status: StatusWriter | None = None  # None: status.devices not written
    carver: Carver | None = None  # dynamic MIG (dynamic_mig.py); None: none on this node
    # Where the claims' device metadata files go (KEP-5304); '' writes none.
    metadata_dir: str = ""

    def __post_init__(self) -> None:
        self._lock = threading.Lock()

    def _nvidias(self, ref: ClaimRef) -> str:
        """Why this claim, not in gpukit's checkpoint, is NVIDIA's driver's to prepare and
        unprepare ('' when it is not): refused at start, or its CDI spec is NVIDIA's."""
        why = self.not_taken.get(ref.uid, "")
        spec = Path(self.cdi_dir) / nvidia_checkpoint.spec_file(ref.uid)
        if not why and spec.exists():
            why = (f"{ref}: {self.nvidia_problem or 'not in NVIDIA checkpoint as prepared'} "
                   f"(its CDI spec {spec} is there)")
        if why:
            return f"{why}; prepared by NVIDIA's DRA driver, not taken over by gpukit: " \
                   "left to NVIDIA's plugin"
        return ""

    # -- prepare ---------------------------------------------------------------------------

    def prepare(self, ref: ClaimRef) -> PreparedClaim:
        with self._lock:
            known = self.checkpoint.get(ref.uid)
            if known is not None and (Path(self.cdi_dir) / known.spec_file).is_file():
                log.info("%s: already prepared (%s)", ref, ", ".join(
                    d.device for d in known.devices))
                return known
            if known is None and (nvidias := self._nvidias(ref)):
                raise PrepareError(nvidias)
            started = time.monotonic()
            claim = self.read_claim(ref.namespace, ref.name)
            prepared, plan = self._prepare(ref, claim)
            self.checkpoint.put(prepared)
            log.info("%s: prepared %s in %.1f ms", ref, ", ".join(
                d.device for d in prepared.devices), (time.monotonic() - started) * 1000)
            published = dict(self.devices())
            for name in plan.carves:  # a carved device's facts are its MIG device's
                published[name] = replace(published[name], unit=plan.spec_devices[name][1])
        if self.report_status is not None:  # outside the lock: an API call
            entries = claim_status.entries(prepared, published, plan.sharing)
            try:
                self.report_status(ref, entries)
            except Exception as exc:  # the claim is prepared all the same; status only tells
                log.warning("%s: cannot write status.devices: %s", ref, exc)
        return prepared

    def _results(self, ref: ClaimRef, claim: Mapping[str, Any]) -> list[Mapping[str, Any]]:
        uid = (claim.get("metadata") or {}).get("uid")
        if uid != ref.uid:
            raise PrepareError(f"{ref}: the API has UID {uid!r} for this name: the claim the "
                               "kubelet prepares for was deleted and replaced")
        allocation = (claim.get("status") or {}).get("allocation")
        if not allocation:
            raise PrepareError(f"{ref}: expected an allocation in its status, found none")
        results = (allocation.get("devices") or {}).get("results") or []
        ours = [r for r in results if r.get("driver") == DRIVER and r.get("pool") == self.node]
        if not ours:
            found = sorted(f"{r.get('driver')}/{r.get('pool')}/{r.get('device')}"
                           for r in results)  # fmt: skip
            raise PrepareError(f"{ref}: expected devices of driver {DRIVER} in pool "
                               f"{self.node}, the allocation has {found or 'none'}")
        return ours

    def _plan(self, ref: ClaimRef, claim: Mapping[str, Any]) -> _Plan:
        """What preparing the claim needs, from its allocation and configs; nothing done."""
        results = self._results(ref, claim)
        allocation = claim["status"]["allocation"]
        try:
            configs = opaque.configs_by_request(
                (allocation.get("devices") or {}).get("config") or [],
                {str(r.get("request", "")) for r in results})
        except opaque.ConfigError as exc:
            raise PrepareError(f"{ref}: {exc}") from exc
        published = self.devices()
        plan = _Plan()
        for r in results:
            name, request = str(r.get("device")), str(r.get("request", ""))
            device = published.get(name)
            if device is None:
                raise PrepareError(
                    f"{ref}: device {name} (request {request}) is not among node "
                    f"{self.node}'s devices now: {', '.join(sorted(published)) or 'none'}")
            cfg = configs.get(request)
            env: list[str] = []
            extra: dict[str, list[Any]] = {}
            if cfg is not None:
                try:
                    opaque.check_kind(f"request {request}, device {name}", cfg,
                                      device.unit.mig is not None)
                except opaque.ConfigError as exc:
                    raise PrepareError(f"{ref}: {exc}") from exc
                env = opaque.sharing_env(cfg.sharing)
                if cfg.sharing is not None and cfg.sharing.strategy == opaque.MPS:
                    plan.mps_devices.append(claim_mps.MpsDevice(
                        device.unit.uuid, device.unit.mig is None, request, cfg.sharing))
                    extra = claim_mps.container_edits(self.mps_root, ref.uid)
                if cfg.sharing is not None:
                    plan.sharing.setdefault(name, cfg.sharing)
            extra["env"] = [*env, *extra.get("env", [])]
            if device.carve is not None:
                plan.carves[name] = device.carve
            elif device.body.get("consumesCounters"):  # a dynamic MIG GPU, taken whole
                plan.whole_dynamic.append(device.unit.gpu.index)
            plan.spec_devices.setdefault(name, (name, device.unit, extra))
            plan.by_device.setdefault(name, []).append(request)
            plan.by_request.setdefault(request, []).append(name)
            if r.get("shareID"):  # a shared device: this claim's share of it
                plan.shares.setdefault(name, []).append(str(r["shareID"]))
        return plan

    def _prepare(self, ref: ClaimRef, claim: Mapping[str, Any]) -> tuple[PreparedClaim, _Plan]:
        plan = self._plan(ref, claim)
        uid = ref.uid
        instances = self._carve(ref, plan)  # before anything else: undone when a step fails
        try:
            if plan.mps_devices:
                self._start_mps(ref, plan.mps_devices)
            file_name = claim_cdi.spec_file(uid)
            try:
                self._write_metadata(ref, claim, plan)
                cdi.write_spec(self._spec(uid, list(plan.spec_devices.values())), self.cdi_dir,
                               file_name)
            except OSError:
                if self.metadata_dir:  # nothing half-applied: the claim is not prepared
                    device_metadata.remove(self.metadata_dir, ref.namespace, ref.name)
                if plan.mps_devices:
                    self._stop_mps(ref)
                raise
        except Exception:
            self._uncarve(ref, instances.values())
            raise
        devices = tuple(
            PreparedDevice(tuple(dict.fromkeys(requests)), self.node, name,
                           (claim_cdi.device_id(uid, name),), tuple(plan.shares.get(name, ())),
                           _recorded(plan.spec_devices[name][2]), instances.get(name))
            for name, requests in plan.by_device.items())
        return PreparedClaim(uid, ref.namespace, ref.name, devices, file_name), plan

    def _carve(self, ref: ClaimRef, plan: _Plan) -> dict[str, dict[str, Any]]:
        """The claim's dynamic MIG devices created (their GPU and compute instances), each
        device's spec entry then the MIG device's own; device name -> what was created. A
        failure destroys what this claim created so far: nothing half-applied."""
        if not plan.carves and not plan.whole_dynamic:
            return {}
        if self.carver is None:
            raise PrepareError(f"{ref}: asks for dynamic MIG devices "
                               f"{', '.join(plan.carves)}, which this plugin does not carve")
        created: dict[str, dict[str, Any]] = {}
        try:
            for index in plan.whole_dynamic:
                self.carver.release(index)
            for name, carve in plan.carves.items():
                done = self.carver.create(carve)
                created[name] = done.as_json(carve)
                unit = self.carver.unit(carve.gpu_index, done.gi, done.ci)
                if unit is None:
                    raise CarveError(f"device {name}: the MIG device created is not listed")
                _, _, extra = plan.spec_devices[name]
                plan.spec_devices[name] = (name, unit, extra)
                log.info("%s: device %s carved: GPU %d GPU instance %d compute instance %d "
                         "(%s)", ref, name, carve.gpu_index, done.gi, done.ci, done.uuid)
        except Exception as exc:  # CarveError, NVML trouble: nothing of the claim stays
            self._uncarve(ref, created.values())
            raise PrepareError(f"{ref}: {exc}") from exc
        return created

    def _uncarve(self, ref: ClaimRef, instances: Any) -> None:
        """Destroy these instances (a prepare that failed part-way, or an unprepare); raises
        PrepareError naming what stays (the kubelet retries; the next start reconciles)."""
        problems = []
        for inst in instances:
            assert self.carver is not None
            try:
                self.carver.destroy(int(inst["gpu"]), int(inst["gi"]), int(inst["ci"]))
                log.info("%s: GPU %s GPU instance %s destroyed", ref, inst["gpu"], inst["gi"])
            except CarveError as exc:
                problems.append(str(exc))
        if problems:
            raise PrepareError(f"{ref}: {'; '.join(problems)}")

    def _write_metadata(self, ref: ClaimRef, doc: Mapping[str, Any], plan: _Plan) -> None:
        """Each request's metadata file, and its mount on the request's first device."""
        if not self.metadata_dir:
            return
        annotations = (doc.get("metadata") or {}).get("annotations") or {}
        claim = {"metadata": {"namespace": ref.namespace, "name": ref.name, "uid": ref.uid,
                              "annotations": annotations}}  # fmt: skip
        published = self.devices()
        for request, names in plan.by_request.items():
            device_metadata.write(self.metadata_dir, claim, request, [
                (self.node, n, self._attributes(n, published, plan)) for n in names])
            edits = plan.spec_devices[names[0]][2]
            edits["mounts"] = [*edits.get("mounts", []),
                               device_metadata.mount(self.metadata_dir, claim, request)]

    @staticmethod
    def _attributes(name: str, published: Mapping[str, SliceDevice],
                    plan: _Plan) -> dict[str, Any]:  # fmt: skip
        """A device's published attributes; a carved MIG device's with the uuid it got (the
        slice cannot know it before prepare)."""
        attrs = dict(published[name].body.get("attributes") or {})
        if name in plan.carves:
            attrs["uuid"] = {"string": plan.spec_devices[name][1].uuid}
        return attrs

    def _spec(self, uid: str, devices: list[tuple[str, Any, Mapping[str, Any]]]
              ) -> dict[str, Any]:
        return claim_cdi.claim_spec(uid, devices, self.device_root, self.common_edits())

    def _start_mps(self, ref: ClaimRef, devices: list[claim_mps.MpsDevice]) -> None:
        if self.mps is None:
            raise PrepareError(f"{ref}: asks for MPS sharing, which this node's DRA plugin "
                               "does not serve (--mps-daemons none; the inventory's "
                               "gpukit_dra_mps enables it)")
        try:
            spec = claim_mps.daemon_spec(ref.uid, devices)
            self.mps.start(self.mps_root, spec)
        except (opaque.ConfigError, MpsError) as exc:
            raise PrepareError(f"{ref}: {exc}") from exc

    def _stop_mps(self, ref: ClaimRef) -> None:
        if self.mps is None or not os.path.isdir(
                DaemonDirs(self.mps_root, claim_mps.claim_key(ref.uid)).base):
            return
        try:
            self.mps.stop(self.mps_root, claim_mps.claim_key(ref.uid))
        except MpsError as exc:
            raise PrepareError(f"{ref}: {exc}") from exc

    def forget_gone(self, exists: Callable[[ClaimRef], bool | None]) -> list[ClaimRef]:
        """Unprepare and quarantine the checkpoint's claims that no longer exist (`exists`
        False: gone from the API, or a new claim under the same name; None: unknown, kept). A
        claim deleted while the plugin was down never gets its NodeUnprepareResources, and its
        entry would hold the node's GPUs for good (a switch back to the device plugin refused
        on it). An unprepare that fails quarantines the entry all the same, saying so."""
        gone = []
        for uid, claim in sorted(self.checkpoint.all().items()):
            ref = ClaimRef(claim.namespace, claim.name, uid)
            if exists(ref) is False:
                why = "the claim is gone from the API (deleted, or replaced under its name)"
                try:
                    self.unprepare(ref, quarantine=f"{why}; unprepared")
                except Exception as exc:
                    self.checkpoint.quarantine(uid, f"{why}; unpreparing it failed: {exc}")
                gone.append(ref)
        return gone

    # -- after a restart -------------------------------------------------------------------

    def restore_specs(self) -> dict[str, str]:
        """Every prepared claim's CDI spec as the checkpoint says, rewritten where missing or
        different (a reboot empties /var/run/cdi, and the kubelet does not prepare a claim it
        prepared before: the pod's containers would not start, kubernetes#141433). Run before
        the plugin registers. An entry that cannot be read or whose spec cannot be written is
        quarantined; one whose device is not published now is kept. UID -> what was done."""
        done: dict[str, str] = {}
        with self._lock:
            for uid, why in self.checkpoint.unreadable().items():
                self.checkpoint.quarantine(uid, why)
                done[uid] = f"quarantined: {why}"
            published = self.devices()
            for uid, claim in sorted(self.checkpoint.all().items()):
                try:
                    done[uid] = self._restore(claim, published)
                except _Unrestorable as exc:
                    done[uid] = f"not restored: {exc}"
                    log.error("%s: CDI spec not restored, entry kept: %s", claim, exc)
                except Exception as exc:
                    why = f"its CDI spec cannot be restored: {exc}"
                    self.checkpoint.quarantine(uid, why)
                    done[uid] = f"quarantined: {why}"
        return done

    def _restore(self, claim: PreparedClaim, published: Mapping[str, SliceDevice]) -> str:
        ref = ClaimRef(claim.namespace, claim.name, claim.uid)
        missing = [d.device for d in claim.devices if d.device not in published]
        # A device missing now is no verdict on the claim: a discovery that missed a MIG
        # device or a GPU would otherwise move a running claim aside and free its GPU for
        # the MIG manager. The entry stays until the API says the claim is gone (forget_gone).
        if missing:
            raise _Unrestorable(f"device(s) {', '.join(missing)} not among node {self.node}'s "
                                f"devices now: {', '.join(sorted(published)) or 'none'}")
        path = Path(self.cdi_dir) / claim.spec_file
        if any(d.edits is None for d in claim.devices):  # an earlier gpukit's, or NVIDIA's
            if path.is_file():
                return "present (recorded by an earlier gpukit: kept as it is)"
            foreign = [d.device for d in claim.devices
                       if d.cdi_device_ids != (claim_cdi.device_id(claim.uid, d.device),)]
            if foreign:  # the kubelet holds IDs gpukit's spec would not define
                raise _Unrestorable(f"CDI device IDs of {', '.join(foreign)} are not the ones "
                                    "gpukit writes")
            try:
                doc = self.read_claim(ref.namespace, ref.name)
            except Exception as exc:  # the API cannot say now: the entry stays
                raise _Unrestorable(f"reading the claim from the API: {exc}") from exc
            plan = self._plan(ref, doc)  # PrepareError: replaced, no allocation, no device
            self._write_metadata(ref, doc, plan)  # as prepare would have
            claim = PreparedClaim(claim.uid, claim.namespace, claim.name, tuple(
                replace(d, edits=_recorded(plan.spec_devices[d.device][2]))
                if d.device in plan.spec_devices else d for d in claim.devices),
                claim.spec_file)
            if any(d.edits is None for d in claim.devices):
                raise PrepareError("its allocation no longer lists device(s) "
                                   + ", ".join(d.device for d in claim.devices
                                               if d.edits is None))
            self.checkpoint.put(claim)
        elif self.metadata_dir and any(device_metadata.missing(self.metadata_dir, d.edits or {})
                                       for d in claim.devices):
            self._restore_metadata(ref, claim, published)
        want = self._spec(claim.uid, [(d.device, self._unit(d, published), d.edits or {})
                                      for d in claim.devices])
        try:
            if json.loads(path.read_text()) == want:
                return "present"
            state = "rewritten (it differed)"
        except FileNotFoundError:
            state = "rewritten (it was missing)"
        except ValueError:
            state = "rewritten (it was not JSON)"
        cdi.write_spec(want, self.cdi_dir, claim.spec_file)
        log.info("%s: CDI spec %s %s", ref, path, state)
        return state

    def _unit(self, d: PreparedDevice, published: Mapping[str, SliceDevice]) -> Any:
        """A prepared device's unit: a dynamic MIG device's the instance it got, else the
        published device's."""
        if d.instance is None:
            return published[d.device].unit
        inst = d.instance
        unit = None if self.carver is None else self.carver.unit(
            int(inst["gpu"]), int(inst["gi"]), int(inst["ci"]))
        if unit is None:
            raise _Unrestorable(f"device {d.device}: its MIG device (GPU {inst['gpu']} GPU "
                                f"instance {inst['gi']}) is not listed now")
        return unit

    def reconcile_instances(self, dynamic: Mapping[int, str]) -> dict[str, list[str]]:
        """After a crash or reboot: on every dynamic MIG GPU (`dynamic`: index -> UUID), a GPU
        instance no checkpointed claim recorded is destroyed (gpukit alone carves there; a
        prepare that died before its checkpoint entry left it), and one a checkpointed claim
        holds is kept. Before the plugin registers. {"destroyed": [...], "kept": [...]}."""
        out: dict[str, list[str]] = {"destroyed": [], "kept": [], "failed": []}
        if self.carver is None or not dynamic:
            return out
        with self._lock:
            held = {(int(d.instance["gpu"]), int(d.instance["gi"])): str(c)
                    for c in self.checkpoint.all().values() for d in c.devices
                    if d.instance is not None}
            for index, uuid in sorted(dynamic.items()):
                for gi, cis in sorted(self.carver.instances(index).items()):
                    what = f"GPU {index} ({uuid}) GPU instance {gi}"
                    if (index, gi) in held:
                        out["kept"].append(f"{what}: {held[(index, gi)]}")
                        continue
                    try:
                        self.carver.destroy(index, gi, cis[0] if cis else -1)
                        out["destroyed"].append(what)
                        log.warning("%s: no prepared claim holds it: destroyed", what)
                    except CarveError as exc:
                        out["failed"].append(f"{what}: {exc}")
                        log.error("%s: no prepared claim holds it, destroying failed: %s",
                                  what, exc)
        return out

    def _restore_metadata(self, ref: ClaimRef, claim: PreparedClaim,
                          published: Mapping[str, SliceDevice]) -> None:  # fmt: skip
        """A metadata file the claim's spec binds is gone: written again from the claim (the
        recorded mounts name the same paths), else the container could not start."""
        try:
            doc = self.read_claim(ref.namespace, ref.name)
        except Exception as exc:  # the API cannot say now: the entry stays
            raise _Unrestorable(f"reading the claim from the API for its device metadata: "
                                f"{exc}") from exc
        plan = self._plan(ref, doc)
        for d in claim.devices:  # a carved device: the MIG device it got, as recorded
            if d.instance is not None and d.device in plan.spec_devices:
                name, _, extra = plan.spec_devices[d.device]
                plan.spec_devices[d.device] = (name, self._unit(d, published), extra)
        self._write_metadata(ref, doc, plan)
        log.info("%s: device metadata written again", ref)

    def restore_mps(self) -> dict[str, str]:
        """After a restart: the daemons of the claims the checkpoint holds running again,
        any other claim's stopped; key -> problem."""
        if self.mps is None:
            return {}
        with self._lock:
            specs = {}
            for uid in self.checkpoint.all():
                key = claim_mps.claim_key(uid)
                spec = read_spec(self.mps_root, key)
                if spec is not None:
                    specs[key] = spec
            return dict(self.mps.reconcile(self.mps_root, specs, claim_mps.KEY_PREFIX))

    # -- unprepare -------------------------------------------------------------------------

    def unprepare(self, ref: ClaimRef, quarantine: str = "") -> bool:
        """True when the claim was prepared here (and now is not). `quarantine`: its entry
        moved aside with this reason rather than removed (a stale entry, forget_gone)."""
        with self._lock:
            known = self.checkpoint.get(ref.uid)
            if known is None and (nvidias := self._nvidias(ref)):
                raise PrepareError(nvidias)
            file_name = known.spec_file if known else claim_cdi.spec_file(ref.uid)
            try:
                os.unlink(Path(self.cdi_dir) / file_name)
            except FileNotFoundError:
                pass
            except OSError as exc:
                raise PrepareError(f"{ref}: cannot remove its CDI spec {file_name}: "
                                   f"{exc}") from exc
            if self.metadata_dir:
                device_metadata.remove(self.metadata_dir, ref.namespace, ref.name)
            self._stop_mps(ref)
            if known is not None:  # the claim's dynamic MIG devices destroyed before its entry
                self._uncarve(ref, [d.instance for d in known.devices if d.instance])
            removed = (self.checkpoint.quarantine(ref.uid, quarantine) if quarantine
                       else self.checkpoint.remove(ref.uid))
            log.info("%s: %s", ref, "unprepared" if removed else "was not prepared here")
            return removed

    def prepared_devices(self) -> set[str]:
        """Device names some prepared claim holds (a MIG change must wait for them)."""
        return {d.device for c in self.checkpoint.all().values() for d in c.devices}
