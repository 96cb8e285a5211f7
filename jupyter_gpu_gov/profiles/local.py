"""Workstation glue: one machine, several GPUs (or MIG slices), local-process servers.

``GpuLocalProcessSpawner`` and ``GpuSimpleLocalProcessSpawner`` add the profile layer (tiers,
quotas, the spawn form) and hand each admitted server free leaf devices from the GPU backend
through ``CUDA_VISIBLE_DEVICES`` (by UUID, so it does not depend on enumeration order). A server
without a GPU gets an empty ``CUDA_VISIBLE_DEVICES``: it sees none.

The devices a server holds live in its spawner state, which JupyterHub keeps in its database:
they survive hub restarts (with ``c.JupyterHub.cleanup_servers = False``) and are freed when the
server stops. Which devices are free is decided from the started servers in that database,
in the same step as admission.

The devices are read (NVML) in a worker thread, never in the Hub's event loop: a GPU driver in a
bad state can block every call for minutes, and the Hub would serve nothing meanwhile. A read
is awaited for ``READ_WAIT_S`` at most; while none comes back the GPU state is unknown, and
admission hands out no GPU, naming why.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
import time
from collections.abc import Collection, Mapping, Sequence

from jupyterhub.spawner import LocalProcessSpawner, SimpleLocalProcessSpawner
from traitlets import List, Unicode, default
from traitlets.config import SingletonConfigurable

from ..core import health
from ..core.grant import DEVICES_STATE, GPUS_STATE
from ..core.grant import devices as recorded_devices
from ..core.models import Device, bounded
from ..core.queue import FRESH_FOR_S
from ..core.text import escaped, in_sentence
from ..gpu.backends import CHOICES, make_backend
from .grant_count import kept_count
from .quota import Grant
from .spawner import GpuProfilesMixin, GpuRefused
from .tiers import Tier, gpu_product

# As long as a single-user server waits for a fresh sample (server/app.py FRESH_SAMPLE_WAIT_S).
READ_WAIT_S = 10.0


class _Unreadable(Exception):
    """The backend says the cards cannot be read now (NVML's words)."""


class LocalGpus(SingletonConfigurable):
    """The hub's view of this machine's GPUs: one backend per hub process."""

    backend = Unicode(
        "auto",
        help=f"""GPU backend for the allocator: one of {", ".join(CHOICES)} ("auto": NVML when a
        driver is present, else none; "simulated": the simulated devices below).""",
    ).tag(config=True)

    simulated_devices = List(
        help="""Simulated devices (as ``GpuGovApp.simulated_devices``), for demos and tests;
        give servers the same list so that both sides agree on the UUIDs.""",
    ).tag(config=True)

    sim_state_path = Unicode(
        "", help="State file of the simulated devices (default: $JUPYTER_GPU_GOV_SIM_STATE)."
    ).tag(config=True)

    @default("simulated_devices")
    def _default_devices(self):
        from ..gpu.simulated import DEFAULT_DEVICES

        return DEFAULT_DEVICES

    _backend = None
    _reading: asyncio.Future | None = None  # the read in flight: one at a time
    _reading_since = 0.0
    # Of the last read: the devices a new server may get (None: unknown), and why unknown.
    _devices: list[Device] | None = None
    _why = _NOT_READ = "have not been read yet"
    _read_at = 0.0  # time.monotonic() the last read that came back began
    # Of the last read, those a process runs on: a run left behind by a stopped server
    # (``nohup``, which the Hub's stop does not end) or work outside the Hub.
    in_use: frozenset[str] = frozenset()

    async def read(self) -> None:
        """Read the devices now, waiting ``READ_WAIT_S`` at most from when the read began. A
        read still running is joined, never started again: a hung driver holds one thread, not
        one per request, and once it has hung that long callers are answered at once."""
        if self._reading is None or self._reading.done():
            self._reading_since = time.monotonic()
            self._reading = self._in_a_thread()
            # Kept when it comes back late: a recovered driver is read again by itself.
            self._reading.add_done_callback(self._done)
        left = self._reading_since + READ_WAIT_S - time.monotonic()
        try:
            await asyncio.wait_for(asyncio.shield(self._reading), max(0.0, left))
        except asyncio.TimeoutError:
            waited = time.monotonic() - self._reading_since
            if self._devices is not None or self._why == self._NOT_READ:
                self.log.warning("gpu-gov: the GPUs of this machine do not answer (NVML)")
            self._devices, self._why = None, f"have not answered for {waited:.0f} s"
        except Exception:  # ``_done`` (called before this wait ends) says why
            pass

    def _in_a_thread(self) -> asyncio.Future:
        """``_read`` in a daemon thread: Python joins an executor's threads at exit, so a read
        stuck in the driver kept the Hub from stopping (or restarting) until it came back."""
        loop = asyncio.get_running_loop()
        reading = loop.create_future()

        def settle(result, error) -> None:
            if reading.done():
                return
            if error is None:
                reading.set_result(result)
            else:
                reading.set_exception(error)

        def work() -> None:
            try:
                result, error = self._read(), None
            except Exception as failure:
                result, error = None, failure
            with contextlib.suppress(RuntimeError):  # the loop closed meanwhile
                loop.call_soon_threadsafe(settle, result, error)

        threading.Thread(target=work, name="gpu-gov-local-gpus", daemon=True).start()
        return reading

    def _read(self) -> tuple[list[Device], frozenset[str]]:
        """The devices a new server may get: a GPU with a fault (docs/health.md), or one whose
        health cannot be read, is never handed out. In the worker thread."""
        if self._backend is None:
            self._backend = make_backend(
                self.backend,
                simulated_devices=self.simulated_devices,
                sim_state_path=self.sim_state_path or None,
            )
        snapshot = bounded(self._backend.sample())  # a card's garbage memory fits no tier
        if snapshot.backend == "unavailable":  # NVML failed: unknown, not a machine without cards
            raise _Unreadable(snapshot.error or "NVML failed")
        checked = snapshot.health
        devices = [
            d for d in snapshot.devices if checked.get(d.uuid, health.HEALTHY).status == health.OK
        ]
        busy = frozenset(u for u, sample in snapshot.samples.items() if sample.processes)
        return devices, busy

    def _done(self, reading: asyncio.Future) -> None:
        if reading.cancelled():
            return
        error = reading.exception()
        if error is not None:
            why = (
                str(error) if isinstance(error, _Unreadable) else f"{type(error).__name__}: {error}"
            )
            why = why.splitlines()[0][:300]
            self.log.warning("gpu-gov: cannot read the GPUs of this machine: %s", escaped(why))
            self._devices, self._why = None, f"could not be read ({why})"
            return
        if self._devices is None and self._why != self._NOT_READ:
            self.log.info("gpu-gov: the GPUs of this machine answer again")
        self._devices, self.in_use = reading.result()
        self._read_at = self._reading_since

    def _age(self) -> float:
        return time.monotonic() - self._read_at

    def devices(self) -> list[Device] | None:
        """The devices a new server may get, from the last read; None while unknown (or
        stale: read over ``FRESH_FOR_S`` ago; stale is never free)."""
        return None if self._age() > FRESH_FOR_S else self._devices

    def unknown(self) -> str | None:
        """Why no GPU may be handed out whatever the count (the last read did not come back
        within ``READ_WAIT_S``, or failed, or is stale), or None."""
        why = self._why
        if self._devices is not None:
            if self._age() <= FRESH_FOR_S:
                return None
            why = f"were last read {self._age():.0f} s ago"
        return (
            f"GPU state unknown: the GPUs of this machine {why}, so none is handed out "
            "until they answer. Try again in a few minutes."
        )


def _fits(tier: Tier, device: Device) -> bool:
    return tier.fits_device(device.name, device.mig_profile, device.memory_total_mb)


def _free_for(tier: Tier, device: Device, holders: Sequence[str]) -> int:
    """Servers of ``tier`` this device can still take: a slot per free share."""
    if not _fits(tier, device):
        return 0
    if tier.kind == "shared":
        if any(h != tier.name for h in holders):
            return 0
        return max(0, tier.replicas - len(holders))
    return 0 if holders else 1


def capacity(
    tiers: Mapping[str, Tier],
    devices: Sequence[Device],
    held: Mapping[str, Sequence[str]],
    usage: Sequence[Grant],
) -> dict[str, int]:
    """Devices per tier: those its servers hold plus those free for it now (tiers that share
    hardware, such as one card and two cards of the same model, each see what is left)."""
    result = {}
    for name, tier in tiers.items():
        free = sum(_free_for(tier, d, held.get(d.uuid, ())) for d in devices)
        if tier.kind != "shared":
            free -= free % tier.count  # whole servers only
        result[name] = sum(g.devices for g in usage if g.tier == name) + free
    return result


def cards(tiers: Mapping[str, Tier], devices: Sequence[Device]) -> dict[str, int]:
    """Devices per tier the machine has, held by any tier or free (a time-shared card counts
    its slots): the spawn form's "N of M free", where M is not what a pair leaves a single card."""
    return {
        name: sum(1 for d in devices if _fits(tier, d)) * (tier.replicas or 1)
        for name, tier in tiers.items()
    }


def pick(
    tier: Tier,
    devices: Sequence[Device],
    held: Mapping[str, Sequence[str]],
    in_use: Collection[str] = (),
) -> list[str]:
    """UUIDs for a new server of ``tier``: the least shared fitting devices, those no process
    runs on first (a run left behind would share the card with the new server unawares), then
    lowest index first; empty when there are not enough."""
    slots = [
        (len(held.get(d.uuid, ())), d.uuid in in_use, d.index, d.uuid)
        for d in devices
        if _free_for(tier, d, held.get(d.uuid, ()))
    ]
    chosen = [uuid for *_, uuid in sorted(slots)[: tier.count]]
    return chosen if len(chosen) == tier.count else []


class LocalGpuMixin(GpuProfilesMixin):
    """The profile layer plus device pinning, for local-process spawners (mix in first)."""

    gpu_devices: tuple[str, ...] = ()  # UUIDs this server holds
    gpu_device_info: tuple[dict, ...] = ()  # the same, with their physical GPU and MIG profile

    @property
    def local_gpus(self) -> LocalGpus:
        return LocalGpus.instance(config=self.config)

    def _held(self) -> dict[str, list[str]]:
        """Device UUID → tiers of the other started servers holding it, as admission recorded
        them in the state (``user_options`` are the user's words until admission): from the
        hub's kept count, which ``gpu_held`` brought up to date in this step (nothing awaited
        since), not every started server's state decoded again."""
        own = self.orm_spawner.id if self.orm_spawner is not None else None
        return kept_count(self.user.db).devices_of(own)

    async def gpu_refresh(self) -> None:
        await self.local_gpus.read()

    def gpu_unknown(self) -> str | None:
        return self.local_gpus.unknown()

    def gpu_capacity(self, usage: list[Grant]) -> dict[str, int | None]:
        devices = self.local_gpus.devices() or []  # unknown is never free
        return capacity(self.gpu_profiles.tier_map, devices, self._held(), usage)

    def gpu_cards_held(self, usage, servers=None) -> dict[str, str] | None:
        # Which card a capability class's (borrowed) server holds: its devices' model.
        if servers is None:
            classes = [t.name for t in self.gpu_profiles.tier_map.values() if t.card is None]
            servers = {g.server for name in classes for g in usage.borrowed(name)}
        devices = self.local_gpus.devices() if servers else None
        if devices is None:
            return None
        names = {d.uuid: d.name for d in devices}
        found = {}
        for server, uuids in kept_count(self.user.db).devices_of_servers(servers).items():
            products = {gpu_product(names[u]) if u in names else None for u in uuids}
            if len(products) == 1 and None not in products:  # one model, every device read
                found[server] = products.pop()
        return found

    def gpu_cards(self) -> dict[str, int | None]:
        devices = self.local_gpus.devices()
        return {} if devices is None else cards(self.gpu_profiles.tier_map, devices)

    def gpu_assign(self, tier: Tier) -> None:
        devices = self.local_gpus.devices()
        if devices is None:  # admission refused already (nothing awaited in between)
            raise GpuRefused(self.local_gpus.unknown())
        chosen = pick(tier, devices, self._held(), self.local_gpus.in_use)
        if not chosen:  # admission counted them free: only a vanished device gets here
            raise GpuRefused(
                f"No {in_sentence(tier.display_name)} device of this machine is free right now."
            )
        self.gpu_devices = tuple(chosen)
        by_uuid = {d.uuid: d for d in devices}
        self.gpu_device_info = tuple(
            {
                "uuid": u,
                "parent_uuid": by_uuid[u].parent_uuid,
                "mig_profile": by_uuid[u].mig_profile,
            }
            for u in chosen
        )

    def get_state(self):
        state = super().get_state()
        if self.gpu_devices:
            state[DEVICES_STATE] = list(self.gpu_devices)
            state[GPUS_STATE] = [dict(d) for d in self.gpu_device_info]
        return state

    def load_state(self, state):
        super().load_state(state)
        # Through the record's one reader (``core.grant``), which leaves out what is not a
        # device: the Hub's REST API writes a running server's state from ``get_state``, and
        # an entry it could not copy (a hand edit, a restore) failed every listing of users.
        held = recorded_devices(state)
        self.gpu_devices = tuple(d.uuid for d in held)
        self.gpu_device_info = tuple(
            {"uuid": d.uuid, "parent_uuid": d.parent_uuid, "mig_profile": d.mig_profile}
            for d in held
        )

    def clear_state(self):
        super().clear_state()
        self.gpu_devices = ()
        self.gpu_device_info = ()

    def get_env(self):
        env = super().get_env()
        # Only the pinned devices, by UUID, which CUDA takes in the order given whatever its
        # CUDA_DEVICE_ORDER; none (empty) for a server without a GPU.
        env["CUDA_VISIBLE_DEVICES"] = ",".join(self.gpu_devices)
        # And a GPU named by index in the server (an admin's or a user's CUDA_VISIBLE_DEVICES=1
        # in its place) counts as NVML, nvidia-smi and the server's sampler count: in PCI bus
        # order, not fastest first (on a machine with mixed cards, another card).
        env.setdefault("CUDA_DEVICE_ORDER", "PCI_BUS_ID")
        return env


class GpuLocalProcessSpawner(LocalGpuMixin, LocalProcessSpawner):
    """LocalProcessSpawner with GPU tiers, team quotas and device pinning."""


class GpuSimpleLocalProcessSpawner(LocalGpuMixin, SimpleLocalProcessSpawner):
    """SimpleLocalProcessSpawner (demos, tests) with GPU tiers, quotas and device pinning."""
