"""The owner's choices at spawn that reach the governor through the grant: the task type
(``gpu-gov/task-type``, among those the tier allows) and the expected duration
(``gpu-gov/expected-duration``, bounded). Pure: the tier loader, the form's checks and the
hub configuration; the real-hub path is in test_profiles_hub.py."""

from __future__ import annotations

from datetime import timedelta

import pytest
from traitlets import TraitError

from jupyter_gpu_gov.core.grant import MAX_CHOICE_CHARS, MAX_CHOICES, oversized, user_may_choose
from jupyter_gpu_gov.profiles import form
from jupyter_gpu_gov.profiles.config import GpuProfiles
from jupyter_gpu_gov.profiles.tiers import TierError, load_tiers

H100 = {"name": "h100", "display_name": "H100 80 GB", "gpu": "H100-80GB"}


def tier(**extra):
    return load_tiers([{**H100, **extra}])["h100"]


def test_a_tier_is_interactive_unless_the_admin_says_otherwise():
    assert tier().task_types == ("interactive",)
    assert tier(task_types=["batch", "interactive"]).task_types == ("batch", "interactive")


@pytest.mark.parametrize(
    "value", [[], "batch", ["training"], ["batch", "batch"], [1], None, {"batch": 1}]
)
def test_a_bad_task_type_list_names_the_tier_and_the_key(value):
    with pytest.raises(TierError) as error:
        tier(task_types=value)
    message = str(error.value)
    assert "tier 0 ('h100')" in message and "'task_types'" in message, message
    assert "interactive, batch, inference" in message, message


def test_the_owner_narrows_the_task_type_among_those_the_tier_allows():
    shared = tier(task_types=["interactive", "batch"])
    form.check_task_type(None, shared)  # not given: the tier's default
    form.check_task_type("batch", shared)
    for bad in ("inference", "training", 3, ["batch"]):
        with pytest.raises(form.FormError) as error:
            form.check_task_type(bad, shared)
        assert "H100 80 GB server may be for: interactive, batch" in str(error.value)


@pytest.mark.parametrize(
    ("value", "expected"),
    [(None, None), ("", None), ("90m", timedelta(minutes=90)), ("6h", timedelta(hours=6)),
     (3600, timedelta(hours=1)), ("1h30m", timedelta(minutes=90))],
)  # fmt: skip
def test_an_expected_duration_is_read(value, expected):
    assert form.check_expected_duration(value, tier(), timedelta(days=7)) == expected


@pytest.mark.parametrize(
    ("value", "words"),
    [
        ("30s", "give 1m to 7d (the hub's limit)"),
        ("8d", "give 1m to 7d (the hub's limit)"),
        ("soon", "is not a duration: use e.g. 90m, 6h, 2d"),
        ("-5m", "is not a duration"),
        ("1e400", "is not a duration"),
        (True, "is not a duration"),
        ([1], "is not a duration"),
    ],
)
def test_an_expected_duration_out_of_bounds_says_which_bound(value, words):
    with pytest.raises(form.FormError, match="Expected duration") as error:
        form.check_expected_duration(value, tier(), timedelta(days=7))
    assert words in str(error.value)


def test_the_tiers_maximum_age_bounds_the_expected_duration():
    short = tier(max_age="8h")
    assert form.check_expected_duration("8h", short, timedelta(days=7)) == timedelta(hours=8)
    with pytest.raises(form.FormError, match=r"give 1m to 8h \(H100 80 GB's maximum age\)"):
        form.check_expected_duration("9h", short, timedelta(days=7))


def test_the_form_reads_both_choices_and_refuses_an_unreadable_duration():
    posted = {"profile": ["h100"], "task_type": ["batch"], "expected_duration": [" 6h "]}
    assert form.parse(posted) == {
        "profile": "h100",
        "task_type": "batch",
        "expected_duration": "6h",
    }
    with pytest.raises(form.FormError, match="'tomorrow' is not a duration"):
        form.parse({"profile": ["h100"], "expected_duration": ["tomorrow"]})


def test_both_are_user_choices_and_the_labels_are_not():
    assert user_may_choose("task_type") and user_may_choose("expected_duration")
    assert not user_may_choose("gpu-gov/task-type")
    assert not user_may_choose("gpu-gov/expected-duration")


def test_the_hubs_bound_on_expected_durations_is_checked_at_startup():
    profiles = GpuProfiles(max_expected_duration="2d")
    assert profiles.expected_duration_bound == timedelta(days=2)
    for bad, words in (("30s", "at least 1 minute"), ("later", "is not a duration")):
        with pytest.raises(TraitError, match=words):
            GpuProfiles(max_expected_duration=bad)


def test_the_bounds_on_kept_choices_hold_at_their_edge():
    # api.md: at most 64 choices of at most 1,024 characters each (key or value); one past
    # either is refused with the bound named, and what is kept stops at the bound.
    assert (MAX_CHOICES, MAX_CHOICE_CHARS) == (64, 1024)
    sixty_four = {f"profile-option-{i}": "x" for i in range(64)}
    assert oversized(sixty_four) == (sixty_four, None)
    kept, why = oversized({**sixty_four, "profile-option-64": "x"})
    assert kept == sixty_four
    assert why == "65 choices were sent: a spawn may make at most 64."
    edge = {"k" * 1024: "v" * 1024, "n": ["y" * 1020]}  # a list's size is its repr's, 1,024
    assert oversized(edge) == (edge, None)
    for past, size in (({"k" * 1025: "v"}, 1025), ({"k": "v" * 1025}, 1025)):
        kept, why = oversized(past)
        assert kept == {}
        assert why.endswith(f"is {size:,} characters long: a choice may be at most 1,024.")
    kept, why = oversized({"n": ["y" * 1021]})
    assert kept == {} and "1,025 characters long" in why
