"""Policies changed at run time (``hub/policy_admin.py``): a candidate is refused with the
service's start-up error, and an apply is on the audit trail before it governs; when the
audit cannot be written, nothing changes."""

from __future__ import annotations

import pytest
from fake_hub_api import FakeHub
from test_governor import governor

from jupyter_gpu_gov.hub import policy_admin as admin
from jupyter_gpu_gov.hub.app import GpuGovernor
from jupyter_gpu_gov.hub.options import Options
from jupyter_gpu_gov.hub.store import StoreUnavailable

CANDIDATE = {
    "policies": [{"name": "vision", "match": {"teams": ["vision"]}, "cull_after": "45m"}],
    "policy_defaults": {"warn_after": "20m"},
}


@pytest.mark.parametrize(
    ("data", "words"),
    [
        ("{not json", "the candidate is not JSON"),
        ("[]", "the candidate must be a JSON object"),
        ({"policy": []}, "unknown keys 'policy'"),
        ({"policies": {"a": 1}}, "'policies' must be a list"),
        ({"policies": [{"name": "x", "cull_after": "soon"}]}, "bad policy configuration: "),
    ],
)
async def test_a_bad_candidate_is_refused_naming_what_is_wrong(tmp_path, data, words):
    async with FakeHub() as hub:
        gov = governor(hub, tmp_path)
    with pytest.raises(admin.CandidateError, match=words):
        admin.validate(admin.candidate_of(data), gov.options)


def test_the_error_is_the_services_own_at_start_up(tmp_path):
    bad = {"policies": [{"name": "x", "cull_after": "soon"}], "policy_defaults": {}}
    config = tmp_path / "config.py"
    config.write_text(f"c.GpuGovernor.policies = {bad['policies']!r}\n")
    app = GpuGovernor()
    with pytest.raises(SystemExit) as start_up:
        app.initialize([f"--config={config}"])
    with pytest.raises(admin.CandidateError) as refused:
        admin.validate(bad, Options())
    assert str(start_up.value).endswith(str(refused.value))


async def test_apply_is_audited_before_it_governs_and_not_at_all_without_the_audit(tmp_path):
    async with FakeHub() as hub:
        gov = governor(hub, tmp_path)
        before = list(gov.policies)
        real_audit = gov.store.audit

        def down(rows):
            raise StoreUnavailable(gov.store.url, OSError("disk full"))

        gov.store.audit = down
        with pytest.raises(StoreUnavailable):
            admin.apply(gov, CANDIDATE, "user:ada", "tighter for vision", dry_run=False)
        assert gov.policies == before  # nothing changed

        seen = []

        def audit(rows):
            seen.append([p.name for p in gov.policies])  # what governs as it is written
            real_audit(rows)

        gov.store.audit = audit
        done = admin.apply(gov, CANDIDATE, "user:ada", "tighter for vision", dry_run=False)
    assert seen == [[p.name for p in before]]
    assert [p.name for p in gov.policies] == ["vision", "default"]
    assert done["persists"] is False and "c.GpuGovernor.policies = [" in done["config"]
    (row,) = [a for a in gov.store.audit_rows() if a.action == "policy-apply"]
    assert (row.actor, row.reason) == ("user:ada", "tighter for vision")
    assert any('"cull_after": "45m"' in line for line in row.details["diff"])
