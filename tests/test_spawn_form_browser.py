"""The GPU spawn form in a real browser (Debian's chromium through playwright), on a real hub.

A researcher in two teams logs in, sees the tiers with what each team has left, switches team
(tiers the other team cannot use become unselectable), asks the memory estimate which tier fits
a model (it picks that tier), picks the task type that tier allows and an expected duration, and
starts a server on it: the server gets the MIG slice, its grant the task type and duration.
With ``JUPYTER_GPU_GOV_SCREENSHOTS=1`` it refreshes docs/images/spawn-form.png.

Skipped, saying why, when chromium or playwright is missing; never green without a browser.
"""

from __future__ import annotations

import contextlib
import json

import pytest
from browser import browser as chromium
from browser import needs_browser, screenshot_path
from hub_harness import REPO, HubHarness

with contextlib.suppress(ImportError):  # without playwright, needs_browser skips
    from playwright.sync_api import expect

DEVICES = json.loads((REPO / "hub_config" / "demo_gpus.json").read_text())
SLOW = 60_000  # ms

pytestmark = [pytest.mark.timeout(300), *needs_browser]

PROFILES = f"""
from jupyter_gpu_gov.profiles.hubconfig import add_gpu_profiles

c.LocalGpus.backend = "simulated"
c.LocalGpus.simulated_devices = {DEVICES!r}
c.LocalGpus.sim_state_path = HARNESS_ENV["JUPYTER_GPU_GOV_SIM_STATE"]
c.GpuProfiles.tiers = [
    {{"name": "h100", "display_name": "H100 80 GB", "gpu": "H100-80GB"}},
    {{"name": "h100-3g", "display_name": "Half an H100", "gpu": "H100-80GB", "mig": "3g.40gb",
      "task_types": ["interactive", "batch"]}},
    {{"name": "h100-1g", "display_name": "Small slice", "gpu": "H100-80GB", "mig": "1g.10gb"}},
]
c.GpuProfiles.quotas = {{
    "vision": {{"guaranteed": {{"h100": 1}}}},
    "nlp": {{"guaranteed": {{"h100-3g": 1, "h100-1g": 2}}}},
}}
c.GpuProfiles.team_map = {{"mia": ["vision", "nlp"]}}
c.GpuProfiles.projects = {{"nlp": ["summaries"]}}
add_gpu_profiles(c, spawner="simple")
c.Spawner.default_url = "/tree"
"""


@pytest.fixture(scope="module")
def hub(tmp_path_factory):
    workdir = tmp_path_factory.mktemp("spawn-form")
    su = f"c.GpuGovApp.simulated_devices = {DEVICES!r}\n"
    with HubHarness(extra_config=PROFILES, singleuser_config=su, workdir=workdir) as hub:
        yield hub


def test_a_researcher_picks_a_tier_for_a_team_with_the_estimate_and_starts(hub, tmp_path):
    with chromium() as browser:
        page = browser.new_page()
        page.set_default_timeout(SLOW)
        page.goto(f"{hub.url}/hub/login?next=/hub/spawn")
        page.fill("#username_input", "mia")
        page.fill("#password_input", "any")
        page.click("#login_submit")
        form = page.locator(".gpu-gov-form")
        expect(form).to_be_visible()

        tier = {n: form.locator(f'label[data-tier="{n}"]') for n in ("h100", "h100-3g")}
        radio = {n: label.locator("input") for n, label in tier.items()}
        # Team vision first: its H100 line is shown, nlp's slices cannot be picked.
        expect(form.locator("#gpu-gov-team")).to_have_value("vision")
        expect(tier["h100"].locator('li[data-team="vision"]')).to_have_text(
            "vision: 1 of 1 guaranteed left · 2 of 2 free"
        )
        expect(radio["h100-3g"]).to_be_disabled()
        # An H100 server is interactive (its tier's only task type): no choice to make.
        expect(form.locator("#gpu-gov-task-type")).to_be_hidden()
        expect(tier["h100-3g"].locator('li[data-team="vision"]')).to_have_text(
            "vision: not offered to this team"
        )

        # Switch to nlp: the slices open up, the H100 (not nlp's) closes.
        form.locator("#gpu-gov-team").select_option("nlp")
        expect(radio["h100"]).to_be_disabled()
        expect(radio["h100-3g"]).to_be_enabled()
        expect(tier["h100-3g"].locator('li[data-team="nlp"]')).to_be_visible()
        expect(tier["h100-3g"].locator('li[data-team="vision"]')).to_be_hidden()

        # The estimate: a 13B model for inference in bf16 needs ~38 GB -> half an H100.
        form.locator("summary").click()
        page.fill("#gpu-gov-params", "13B")
        form.locator("#gpu-gov-estimate").click()
        expect(form.locator("#gpu-gov-estimate-result")).to_contain_text(
            "About 37.9 GB of GPU memory (inference, bf16): Half an H100"
        )
        expect(radio["h100-3g"]).to_be_checked()
        # Half an H100 may be interactive or batch: the owner picks, and says for how long.
        task = form.locator("#gpu-gov-task-type")
        expect(task).to_be_visible()
        expect(task.locator('option[value="inference"]')).to_be_disabled()
        task.select_option("batch")
        page.fill("#gpu-gov-expected", "6h")
        page.screenshot(path=str(screenshot_path("spawn-form.png", tmp_path)), full_page=True)

        page.fill("#gpu-gov-project", "summaries")
        page.click("button[type=submit]")
        page.wait_for_url(f"{hub.url}/user/mia/**", timeout=SLOW)

    options = hub.api("GET", "users/mia").json()["servers"][""]["user_options"]
    assert options["gpu-gov/tier"] == "h100-3g"
    assert options["gpu-gov/team"] == "nlp"
    assert options["gpu-gov/project"] == "summaries"
    assert options["gpu-gov/borrowed"] == "false"
    grant = hub.api("GET", "users/mia").json()["servers"][""]["state"]["gpu_gov_grant"]
    assert (grant["gpu-gov/task-type"], grant["gpu-gov/expected-duration"]) == ("batch", "21600")
    kernel = hub.start_kernel("mia")
    out = hub.execute("mia", kernel, "import os; print(os.environ['CUDA_VISIBLE_DEVICES'])")
    assert out.strip().startswith("MIG-"), out
