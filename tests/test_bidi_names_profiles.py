"""Names from outside on the profile layer's pages and in its refusals: a team's name (a Hub
group's), an admin's tier name and a user's or server's name may hold a bidi control (U+202E).
The spawn form, the queue pages (the hub's page, the notice on JupyterHub's home and spawn-
pending pages) and the refusal messages (plain text on the spawn-pending page) isolate each:
``<bdi>`` in markup, U+2068 ... U+2069 in plain text. ``tests/test_bidi_names_browser.py``
shows what a browser makes of it."""

from __future__ import annotations

import re
from datetime import UTC, datetime, timedelta
from types import SimpleNamespace

from jinja2 import Environment, PackageLoader

from jupyter_gpu_gov.core.queue import QueuedRequest, Waiting
from jupyter_gpu_gov.profiles import form, queue_pages
from jupyter_gpu_gov.profiles.queue import offer_words
from jupyter_gpu_gov.profiles.quota import Grant, Request, admit, load_quotas, tier_use
from jupyter_gpu_gov.profiles.tiers import load_tiers

RLO = "\u202e"
TEAM, OTHER = f"vis{RLO}ion", f"{RLO}evil"
TIERS = load_tiers(
    [
        {"name": "h100", "gpu": "H100-80GB", "display_name": f"H{RLO}100"},
        {"name": "h100-1g", "gpu": "H100-80GB", "mig": "1g.10gb", "display_name": f"S{RLO}mall"},
    ]
)
QUOTAS = load_quotas(
    {
        TEAM: {"guaranteed": {"h100-1g": 1}, "borrowing_limit": {"h100": 0}, "tiers": "*"},
        OTHER: {"guaranteed": {"h100": 1}, "user_cap": 1},
    },
    TIERS,
)
CAPACITY = {"h100": 1, "h100-1g": 2}
T0 = datetime(2026, 3, 2, 9, 0, tzinfo=UTC)


def unisolated(text: str) -> str:
    """What a reader sees less what is isolated (each ``<bdi>``, each U+2068 ... U+2069) and
    the attributes not shown (a form's values, ``data-*``)."""
    text = re.sub(r' (?:value|data-[a-z-]+|href|action)="[^"]*"', "", text)
    text = re.sub(r" (?:value|data-[a-z-]+|href|action)='[^']*'", "", text)
    for alone in (r"<bdi>.*?</bdi>", "\u2068[^\u2069]*\u2069"):
        text = re.sub(alone, "", text, flags=re.S)
    return text


def test_a_refusal_names_each_team_and_tier_as_its_own_isolate():
    """The refusals the spawn-pending page shows as plain text (and the form's lines)."""
    borrow = admit(Request("mia/", "mia", TEAM, "h100"), [], CAPACITY, QUOTAS, TIERS)
    assert not borrow.allowed
    assert f"Team \u2068{TEAM}\u2069 has no guarantee on \u2068H{RLO}100\u2069" in borrow.reason
    held = Grant("mia/a", "mia", OTHER, "h100", 1, 1.0, False, 0, T0)
    cap = admit(Request("mia/b", "mia", OTHER, "h100"), [held], CAPACITY, QUOTAS, TIERS)
    unknown = admit(Request("mia/", "mia", f"x{RLO}", "h100"), [], CAPACITY, QUOTAS, TIERS)
    for refusal in (borrow, cap, unknown):
        assert not refusal.allowed and RLO not in unisolated(refusal.reason), refusal.reason
    request = QueuedRequest("mia", "", TEAM, "h100", {}, T0, T0 + timedelta(hours=1))
    words = offer_words(Waiting(request, 1, False, "", sooner=(f"S{RLO}mall",)), TIERS)
    assert RLO not in unisolated(words), words


def test_the_spawn_form_isolates_the_teams_and_tiers_names():
    lines = {team: tier_use("mia", team, [], CAPACITY, QUOTAS, TIERS) for team in (TEAM, OTHER)}
    for teams in ([TEAM, OTHER], [TEAM]):
        page = form.render(
            tiers=TIERS,
            teams=teams,
            lines=lines,
            projects=[],
            previous={},
            allow_no_gpu=True,
            require_project=False,
            no_gpu="none",
            estimate_url="",
            waiting=f"H{RLO}100",
        )
        assert f"<bdi>H{RLO}100</bdi>" in page and "may not borrow any" in page
        script = page.index("<script>")
        assert RLO not in unisolated(page[:script]), unisolated(page[:script])


def test_the_queue_pages_isolate_each_name():
    # JupyterHub's home and spawn-pending pages: the notice of a server waiting in line.
    env = Environment(loader=PackageLoader("jupyter_gpu_gov.profiles", "templates/hub"))
    macro = env.get_template("gpu_gov_queue.html").make_module({"base_url": "/hub/", "xsrf": "x"})
    place = {
        "name": f"gp{RLO}u",
        "tier": f"H{RLO}100",
        "position": "1st",
        "estimate": "about 5m",
        "starts": "",
        "sooner": f"S{RLO}mall",
        "cancel": "gpu-gov/queue/cancel/mia/x",
    }
    notice = str(macro.waiting({"mia/x": place}))
    assert "Sooner:" in notice and RLO not in unisolated(notice), notice
    # The hub's queue page, as an admin sees it: who, their team, the server, the tier.
    request = QueuedRequest(f"mi{RLO}a", f"gp{RLO}u", TEAM, "h100", {}, T0, T0)
    handler = SimpleNamespace(config=None, hub=SimpleNamespace(base_url="/hub/"), xsrf_token=b"x")
    waiting = Waiting(request, 1, False, "", estimate="about 5m", sooner=(f"S{RLO}mall",))
    row = queue_pages._row(handler, waiting, T0, admin=True)
    assert f"<td><bdi>{TEAM}</bdi></td>" in row and RLO not in unisolated(row), row


def test_the_kubernetes_apis_words_in_a_failed_start_are_an_isolate():
    """The API's refusal may quote a name (an annotation's value holds the user's as it is):
    the spawn-pending page shows the message as plain text."""
    from kubernetes_asyncio.client.rest import ApiException

    from jupyter_gpu_gov.profiles.kubespawner import kubernetes_failure

    error = ApiException(status=422, reason="Unprocessable Entity")
    error.body = '{"message": "Pod is invalid: annotations: Invalid value: \\"mi\\u202ea\\""}'
    said = kubernetes_failure(error)
    assert "\u202e" in said and RLO not in unisolated(said), said
    assert said.endswith(") when asked for its pod")
