"""The workstation allocator's records (``profiles/local.py``: the devices in a spawner's state)
after a hub that died mid-spawn: a real JupyterHub database (SQLite, in memory), users wrapped
as the hub wraps them, ``GpuSimpleLocalProcessSpawner`` on two simulated H100s (the hub of
``test_queue_governor.py``). Lab (ben and carol) is guaranteed one card, vision (vera) one."""

# ruff: noqa: F811  (the fixture of test_queue_governor, imported, is an argument here)
from __future__ import annotations

from jupyterhub import orm
from test_queue_governor import hub  # noqa: F401  (fixture)

from jupyter_gpu_gov.core.grant import DEVICES_STATE, GRANT_STATE
from jupyter_gpu_gov.profiles import grant_count

H100 = {"profile": "h100"}


async def test_a_card_admitted_to_a_spawn_the_hub_died_in_is_free_after_its_restart(hub):
    """Admission records the card (and JupyterHub the start) before the server runs; a hub
    killed then (or mid-stop) leaves a row started with no server, which JupyterHub's startup
    never polls nor stops. The card stayed held, and lab's guarantee used, until ben started
    that server again: for ever if he never did."""
    await hub.start("vera", H100)
    vera = hub.spawner("vera").orm_spawner
    vera.server = orm.Server(ip="127.0.0.1", port=8888)  # hers came up
    await hub.start("ben", H100)  # his never did: the hub died
    ben = hub.spawner("ben").orm_spawner
    [his] = ben.state[DEVICES_STATE]
    hub.db.commit()

    grant_count.forget(hub.db)  # the hub restarted: a new process, nothing kept
    carol = await hub.start("carol", H100)
    assert carol.orm_spawner.state[DEVICES_STATE] == [his]
    assert carol.get_env()["CUDA_VISIBLE_DEVICES"] == his
    # ben's row says what the hub can stand behind: not started, nothing held.
    hub.db.refresh(ben)
    assert ben.started is None
    assert DEVICES_STATE not in ben.state and GRANT_STATE not in ben.state
    # vera's running server keeps her card.
    assert vera.started is not None
    assert vera.state[DEVICES_STATE] != [his]
    assert hub.spawner("vera").orm_spawner.state[DEVICES_STATE] == vera.state[DEVICES_STATE]


async def test_a_running_servers_record_it_cannot_read_whole_does_not_fail_the_hubs_api(hub):
    """The Hub's REST API writes a running server's state from its spawner's ``get_state`` (the
    governor reads it every pass, ``admin:server_state``): a device record with an entry that
    is not a device (a hand edit, a restore) raised there, a 500 for every listing of the
    users. What can be read is kept; the rest is left out, as the count reads it."""
    await hub.start("vera", H100)
    row = hub.spawner("vera").orm_spawner
    [card] = row.state[DEVICES_STATE]
    state = dict(row.state)
    state[DEVICES_STATE] = [card, None]
    state["gpu_gov_gpus"] = [{"uuid": card, "parent_uuid": None, "mig_profile": None}, "GPU-x"]
    spawner = hub.spawner("vera")
    spawner.load_state(state)
    kept = spawner.get_state()
    assert kept[DEVICES_STATE] == [card]
    assert kept["gpu_gov_gpus"] == [{"uuid": card, "parent_uuid": None, "mig_profile": None}]
    assert spawner.get_env()["CUDA_VISIBLE_DEVICES"] == card
