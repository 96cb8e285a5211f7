"""Names from outside on the spawn form, as a real browser lays them out (Debian's chromium
through playwright, on a real hub): a team whose name holds a right-to-left override (U+202E)
and an admin's tier name holding one. Unisolated, the override turned the rest of the line
after the name right to left: the team's line ("…: not now. Team … may not borrow any …") and
the tier's summary read backwards. Each name is its own isolate (``<bdi>``, U+2068 ... U+2069
inside a sentence): the words after it are laid out left to right, as written.

Skipped, saying why, when chromium or playwright is missing; never green without a browser.
"""

from __future__ import annotations

import contextlib
import json

import pytest
from browser import browser as chromium
from browser import explain_failure, log_in, needs_browser
from hub_harness import REPO, HubHarness

with contextlib.suppress(ImportError):  # without playwright, needs_browser skips
    from playwright.sync_api import expect

DEVICES = json.loads((REPO / "hub_config" / "demo_gpus.json").read_text())
SLOW = 60_000  # ms
RLO = "\u202e"
TEAM = f"vis{RLO}ion"  # a Hub group's name, which its admin (or a synced directory) chose
TIER = f"H{RLO}100 80 GB"  # an admin's display name

pytestmark = [pytest.mark.timeout(300), *needs_browser]

PROFILES = f"""
from jupyter_gpu_gov.profiles.hubconfig import add_gpu_profiles

c.LocalGpus.backend = "simulated"
c.LocalGpus.simulated_devices = {DEVICES!r}
c.LocalGpus.sim_state_path = HARNESS_ENV["JUPYTER_GPU_GOV_SIM_STATE"]
c.GpuProfiles.tiers = [
    {{"name": "h100", "display_name": {TIER!r}, "gpu": "H100-80GB"}},
    {{"name": "h100-1g", "display_name": "Small slice", "gpu": "H100-80GB", "mig": "1g.10gb"}},
]
c.GpuProfiles.quotas = {{
    {TEAM!r}: {{"guaranteed": {{"h100-1g": 1}}, "tiers": ["h100", "h100-1g"],
               "borrowing_limit": {{"h100": 0}}}},
    "nlp": {{"guaranteed": {{"h100-1g": 1}}}},
}}
c.GpuProfiles.team_map = {{"mia": [{TEAM!r}, "nlp"]}}
add_gpu_profiles(c, spawner="simple")
"""

# The left edge of each character of ``word`` (spaces left out) where it first occurs in a
# text node under the element: the order the reader sees them in.
LEFT_EDGES = """(element, word) => {
  const walker = document.createTreeWalker(element, NodeFilter.SHOW_TEXT);
  for (let node = walker.nextNode(); node; node = walker.nextNode()) {
    const at = node.data.indexOf(word);
    if (at < 0) continue;
    const edges = [];
    for (let i = 0; i < word.length; i++) {
      if (word[i] === " ") continue;
      const range = document.createRange();
      range.setStart(node, at + i);
      range.setEnd(node, at + i + 1);
      edges.push(range.getBoundingClientRect().left);
    }
    return edges;
  }
  return null;
}"""


@pytest.fixture(scope="module")
def hub(tmp_path_factory):
    workdir = tmp_path_factory.mktemp("bidi-names")
    su = f"c.GpuGovApp.simulated_devices = {DEVICES!r}\n"
    with HubHarness(extra_config=PROFILES, singleuser_config=su, workdir=workdir) as hub:
        yield hub


def left_to_right(locator, word: str) -> list[float]:
    edges = locator.evaluate(LEFT_EDGES, word)
    assert edges, f"{word!r} is not in {locator.inner_text()!r}"
    return edges


def test_the_words_after_a_bidi_override_name_read_left_to_right(hub, tmp_path):
    with chromium() as browser:
        page = browser.new_page()
        page.set_default_timeout(SLOW)
        with explain_failure(page, tmp_path):
            log_in(page, hub.url, "mia", "any", "/hub/spawn")
            form = page.locator(".gpu-gov-form")
            expect(form).to_be_visible()
            expect(form.locator("#gpu-gov-team")).to_have_value(TEAM)
            h100 = form.locator('label[data-tier="h100"]')
            line = h100.locator("li").filter(has_text="may not borrow any").first
            expect(line).to_be_visible()
            # The team's line: its name, then the governor's words about it, as written.
            for words in ("not now.", "has no guarantee on", "Pick another tier."):
                edges = left_to_right(line, words)
                assert edges == sorted(edges) and edges[0] < edges[-1], (words, edges)
            # The words after the team's name lie right of those before it.
            before, after = left_to_right(line, "Team "), left_to_right(line, "has no")
            assert before[-1] < after[0], (before, after)
            # The tier's own name (an admin's) reorders nothing after it: its summary.
            summary = h100.locator(".gpu-gov-summary")
            edges = left_to_right(summary, summary.inner_text().strip()[:12])
            assert edges == sorted(edges) and edges[0] < edges[-1], edges
            name = h100.locator("strong").first
            assert name.bounding_box()["x"] < summary.bounding_box()["x"]
